"""The choices of the parallelism knobs for one search, and the user's own: the mesh (data
parallel, HSDP on multi-node jobs, FSDP x TP, a context-parallel mesh kept as given) and,
for a pipeline job, its pp degrees and schedules. :class:`MeshChoices` is the part of
:class:`~fsdpviz.tuning.choices.SpaceBuilder` that builds them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import ConfigError, FsdpvizError
from fsdpviz.plan.fsdp2_options import context_parallel_mesh, parse_mesh
from fsdpviz.plan.pipeline import (
    DEFAULT_SCHEDULE,
    parse_pipeline_options,
    schedule_class,
    wants_pipeline,
)
from fsdpviz.schedule.pipeline_order import rank_actions
from fsdpviz.schema.mesh import ParallelDims
from fsdpviz.tuning.space import PIPELINE_SCHEDULES, Choice, TuneKwargs, divisors, heads

__all__ = ["MeshChoices", "given_dims", "mesh_ranks", "pipelined"]

_PP_DIMS = frozenset({"pp", "dp_shard", "tp"})  # the meshes whose pp degree tune turns


class MeshChoices:
    """The meshes and pipeline schedules of a search (the mesh and pipeline knobs), from
    the model, the API, the machine and the world sizes; what it could not try goes to
    ``notes``."""

    model: nn.Module
    api: str
    machine: Machine
    world_sizes: list[int]
    notes: list[str]

    def _pipeline_choices(self, given: TuneKwargs) -> tuple[list[Choice], Choice]:
        """The job's schedule and the others of :data:`PIPELINE_SCHEDULES`, each with the
        job's microbatches (another schedule with the default stages for it)."""
        mine_name = given.get("pipeline_schedule", DEFAULT_SCHEDULE)
        mine_label, _ = schedule_class(mine_name)
        micro = given.get("microbatches")
        mine = Choice("pipeline", f"{mine_label}" + (f", {micro} microbatches" if micro else ""),
                      given.copy())  # fmt: skip
        out = [mine]
        for name in PIPELINE_SCHEDULES:
            label, _ = schedule_class(name)
            if label == mine_label:
                continue
            kw: TuneKwargs = {"pipeline_schedule": name, "pipeline_stages": None}
            if micro is not None:
                kw["microbatches"] = micro
            out.append(Choice("pipeline", label + (f", {micro} microbatches" if micro else ""), kw))
        return out, mine

    def _pipeline_meshes(
        self,
        given: TuneKwargs,
        schedules: list[Choice],
        batch: int,
        pinned: bool,
        refused: set[tuple[str, str]],
    ) -> list[Choice]:
        """A pipeline job's mesh (first) and, unless ``pinned``, the other pp degrees that
        divide its ranks: the tensor-parallel degree as given, ``dp_shard`` the rest, pp 1
        plain FSDP. The batch of one pipeline (the inputs: a data-parallel rank's) scales
        with the degree, so the global batch and the tokens per rank per step stay. A degree
        is tried where its batch is whole and torchtitan's default split and the schedule
        take it; the pairs a schedule refuses go to ``refused``, each with a note."""
        _, names = parse_mesh(given["mesh"], 4)
        user = given_dims(given)
        ranks, pp, tp = user.world_size, user.pp, user.tp
        mine = Choice(
            "mesh",
            _pp_label(ParallelDims.filled(ranks, tp=tp, pp=pp)),
            given.copy(),
            parallel_dims=ParallelDims.filled(ranks),
            traced=True,
            pp=pp,
        )
        out = [mine]
        if pinned:
            return out
        if set(names) - _PP_DIMS:
            self.notes.append(
                f"the pipeline degree stays as given: tune turns it on a mesh of pp, dp_shard "
                f"and tp, and this one has {', '.join(n for n in names if n not in _PP_DIMS)}"
            )
            return out
        if not batch:
            self.notes.append(
                "the pipeline degree stays as given: the inputs hold no batch to scale with it"
            )
            return out
        plan = given.get("parallelize_plan")
        for degree in sorted(divisors(ParallelDims.filled(ranks, tp=tp).dp_cp)):
            if degree == pp:
                continue
            on_degree = ParallelDims.filled(ranks, tp=tp, pp=degree)
            label = _pp_label(on_degree)
            if (batch * degree) % pp:
                self.notes.append(
                    f"{label} not tried: the batch of {batch} samples per pipeline on pp {pp} "
                    f"is no whole number of samples on pp {degree}"
                )
                continue
            samples = batch * degree // pp
            plain = degree == 1 and tp == 1
            kw: TuneKwargs = {"world_size": ranks} if plain else {"mesh": on_degree.mesh_arg}
            if tp > 1:
                kw["parallelize_plan"] = plan
            if degree > 1:
                why = [
                    (c.label, self._pipeline_refusal(samples, degree, c.kwargs)) for c in schedules
                ]
                for name, reason in why:
                    if reason:
                        refused.add((label, name))
                        self.notes.append(f"{label} with {name} not tried: {reason}")
                if all(reason for _, reason in why):
                    continue
            every = ParallelDims.filled(ranks)  # a pipeline's mesh: its degree is pp=
            out.append(
                Choice(
                    "mesh", label, kw, samples=samples, parallel_dims=every, traced=True, pp=degree
                )
            )
        return out

    def _pipeline_refusal(self, samples: int, degree: int, kwargs: Mapping[str, Any]) -> str:
        """Why the pipeline of ``kwargs`` cannot run on ``degree`` pipeline ranks with a
        batch of ``samples`` and torchtitan's default split ('' where it can), as analyze
        and torch's schedule refuse it."""
        kw = {**kwargs, "pipeline_stages": None}
        try:
            opts, _ = parse_pipeline_options(self.model, samples, degree, kw)
            rank_actions(opts)
        except FsdpvizError as e:
            return str(e).splitlines()[0]
        return ""

    def _meshes(
        self, ws: int, tp: int, plan: ParallelStyle | Mapping[str, ParallelStyle] | None
    ) -> list[Choice]:
        """The meshes on ``ws`` ranks: FSDP over all, HSDP with a node per shard group
        (FSDP2 on more than a node), and FSDP x TP for each tensor-parallel degree up to a
        node that divides the ranks and the heads (with the user's plan, else the model's
        own; ``tp``: the user's degree), and beside each, on more than a node, HSDP x TP
        (torchtitan's ``dp_replicate x dp_shard x tp``: a node per shard group and its
        tensor-parallel ranks, where a node holds more than one shard)."""
        node = self.machine.gpus_per_node
        out = [
            Choice("mesh", f"{ws} ranks", {"world_size": ws}, parallel_dims=ParallelDims.filled(ws))
        ]
        hsdp = self.api == "FSDP2" and ws > node and ws % node == 0
        if hsdp:
            h = ParallelDims.filled(ws, dp_replicate=-1, dp_shard=node)
            kw: TuneKwargs = {"mesh": h.mesh_arg}
            label = f"{ws} ranks (HSDP {h.dp_replicate} x {h.dp_shard})"
            out.append(Choice("mesh", label, kw, parallel_dims=h))
        if self.api != "FSDP2" or plan is None:
            return out
        n_heads = heads(self.model)
        degree = 2
        while degree <= max(node, tp):
            # all ranks tensor parallel (FSDP over one rank) only where the user's mesh is so
            whole = ws > degree or degree == tp
            fits = ws % degree == 0 and whole and (not n_heads or n_heads % degree == 0)
            if fits and (degree <= node or degree == tp):
                d = ParallelDims.filled(ws, tp=degree)
                kw = {"mesh": d.mesh_arg, "parallelize_plan": plan}
                label = f"{ws} ranks (FSDP {d.dp_shard} x TP {d.tp})"
                out.append(Choice("mesh", label, kw, parallel_dims=d))
                # a node per shard group and its tensor-parallel ranks
                if hsdp and node % degree == 0 and node // degree > 1:
                    d = ParallelDims.filled(ws, dp_replicate=-1, dp_shard=node // degree, tp=degree)
                    kw = {"mesh": d.mesh_arg, "parallelize_plan": plan}
                    label = f"{ws} ranks (HSDP {d.dp_replicate} x {d.dp_shard} x TP {d.tp})"
                    out.append(Choice("mesh", label, kw, parallel_dims=d))
            degree *= 2
        return out

    def _context_parallel_mesh(self, given: TuneKwargs) -> Choice:
        """The user's mesh with a context-parallel dimension, kept as given: the ranks that
        share each sequence are the job's, not a knob of tune's (its inputs are the whole
        sequences, its loss the share of each rank)."""
        sizes, names = parse_mesh(given["mesh"], 4)
        user = given_dims(given)
        ranks = user.world_size
        if self.world_sizes != [ranks]:
            raise ConfigError(
                f"the mesh {given['mesh']!r} has {ranks} ranks, and tune keeps a "
                f"context-parallel mesh as given: leave world_size out or give {ranks}"
            )
        dims = " x ".join(f"{n} {v}" for n, v in zip(names, sizes or (), strict=True))
        self.notes.append(f"the mesh stays as given ({dims}): tune has no context-parallel knob")
        label = f"{ranks} ranks ({dims})"
        # (given_dims counts its replicas in dp_shard)
        return Choice("mesh", label, given.copy(), parallel_dims=user, traced=True)

    def _user_mesh(self, given: TuneKwargs, meshes: list[Choice]) -> Choice:
        ws0 = self.world_sizes[0]
        if "mesh" not in given:
            return next(c for c in meshes if c.parallel_dims.world_size == ws0)
        wanted = _flat_mesh(given["mesh"])
        for c in meshes:
            if _flat_mesh(c.kwargs.get("mesh")) == wanted:
                return c
        raise ConfigError(
            f"the mesh given, {given['mesh']!r}, is not one of the meshes tune plans on "
            f"{', '.join(str(w) for w in self.world_sizes)} ranks ("
            + ", ".join(c.label for c in meshes)
            + "): pass world_size= matching it"
        )


def mesh_ranks(mesh: Any) -> int:
    """The ranks of ``mesh=`` as analyze takes it, of any dimensions (a pipeline's too)."""
    if mesh is None:
        return 0
    if isinstance(mesh, dict):
        return math.prod(int(v) for v in mesh.values())
    if isinstance(mesh, (tuple, list)):
        return math.prod(int(x) for x in mesh if not isinstance(x, str))
    return int(math.prod(int(n) for n in getattr(mesh, "shape", (0,))))


def pipelined(kwargs: Mapping[str, Any]) -> bool:
    """Whether the keywords plan pipeline parallelism (a ``pp`` mesh dimension)."""
    return bool(wants_pipeline(dict(kwargs)))


def _pp_label(dims: ParallelDims) -> str:
    """A pipeline job's mesh in words: ``"4 ranks (PP 2 x FSDP 2)"``, ``"4 ranks (PP 4)"``,
    ``"4 ranks (FSDP 4)"`` (pp 1: no pipeline), ``"8 ranks (PP 2 x FSDP 2 x TP 2)"``."""
    parts = [f"PP {dims.pp}"] if dims.pp > 1 else []
    if dims.dp_shard > 1 or dims.pp == 1:
        parts.append(f"FSDP {dims.dp_shard}")
    if dims.tp > 1:
        parts.append(f"TP {dims.tp}")
    return f"{dims.world_size} ranks ({' x '.join(parts)})"


def given_dims(given: Mapping[str, Any]) -> ParallelDims:
    """The user's ``mesh=`` by dimension, as tune keeps it: a ``pp`` dimension (a pipeline
    job's degree), a context-parallel one (``cp``), the tensor-parallel one (the last, where
    a ``parallelize_plan`` is given, with a cp dimension too: ``("dp_replicate", 2,
    "dp_shard", 2, "cp", 2, "tp", 2)``), and the data-parallel ranks the others leave, all
    in ``dp_shard``; one rank where no mesh is given."""
    if given.get("mesh") is None:
        return ParallelDims()
    sizes, names = parse_mesh(given["mesh"], 4)
    assert sizes is not None
    pp = sizes[names.index("pp")] if "pp" in names else 1
    tp = sizes[-1] if "parallelize_plan" in given else 1
    cp = context_parallel_mesh(sizes, names)[0]
    return ParallelDims.filled(math.prod(sizes), cp=cp, tp=tp, pp=pp)


def _flat_mesh(mesh: Any) -> list[Any]:
    if mesh is None:
        return []
    sizes, names = parse_mesh(mesh, 3)
    return [*names, *(sizes or ())]
