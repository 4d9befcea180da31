"""The choices of each knob for one search, and the user's own: a :class:`Space`, built from
the model's structure, the keywords as given, the machine and the world sizes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import ConfigError
from fsdpviz.plan.job import Float8, parse_job_options
from fsdpviz.tuning.space import (
    OWNED,
    PIPELINE_KNOBS,
    PIPELINE_SCHEDULES,
    Choice,
    Space,
    batch_size,
    block_class,
    block_names,
    checkpoint_choices,
    checkpoint_label,
    divisors,
    heads,
    micro_batch_label,
    param_dtype,
    precision_label,
    standard_precision,
    standard_tp_plan,
    wrap_plans,
)

__all__ = ["SpaceBuilder", "mesh_ranks", "pipelined"]

_PP_DIMS = frozenset({"pp", "dp_shard", "tp"})  # the meshes whose pp degree tune turns


class SpaceBuilder:
    """Builds the :class:`Space` of a search (``build``); ``notes`` says what it pinned,
    ``tp_why`` why tensor parallelism cannot be tried, ``tp_standard`` whether its plan is
    the model's own."""

    pipelined = False

    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        api: str,
        machine: Machine,
        world_sizes: list[int],
        allowed: set[str],
        fixed: Mapping[str, Any],
        source: str,
    ) -> None:
        self.model = model
        self.inputs = inputs
        self.api = api
        self.machine = machine
        self.world_sizes = world_sizes
        self.allowed = allowed
        self._fixed = fixed
        self._source = source
        self.notes: list[str] = []
        self.tp_why = ""
        self.tp_standard = False

    def build(self, kwargs: dict[str, Any], pinned: set[str], tokens_per_step: int | None) -> Space:
        """The choices of every knob, and the user's (see :class:`Space`)."""
        api, model = self.api, self.model
        self.pipelined = pipelined(kwargs)
        side = 0 if api == "FSDP2" else 1
        owned = set().union(*(o[side] for o in OWNED.values()))
        base = {k: v for k, v in kwargs.items() if k not in owned}
        block = block_class(model)
        blocks = block_names(model, block)
        choices: dict[str, list[Choice]] = {}
        user: dict[str, Choice] = {}

        def given(knob: str) -> dict[str, Any]:
            return {k: kwargs[k] for k in OWNED[knob][side] if k in kwargs}

        # units
        plans = wrap_plans(model, api, block)
        wrap = [Choice("wrap", label, kw) for label, kw in plans.items()]
        user_wrap = given("wrap")
        if not user_wrap:
            key = "fully_shard" if api == "FSDP2" else "auto_wrap_policy"
            user_wrap = {key: [] if api == "FSDP2" else None}
        mine_wrap = next((c for c in wrap if _same_wrap(model, c.kwargs, user_wrap)), None)
        if mine_wrap is None:
            mine_wrap = Choice("wrap", "as given", user_wrap)
            wrap.append(mine_wrap)
        choices["wrap"], user["wrap"] = wrap, mine_wrap
        # resharding / sharding strategy, backward and forward prefetch (FSDP1)
        node = self.machine.gpus_per_node
        multi = any(ws > node and ws % node == 0 for ws in self.world_sizes)
        if api == "FSDP2":
            raf = [
                Choice("reshard_after_forward", "all but the root", {"reshard_after_forward": None})
            ]
            raf.append(Choice("reshard_after_forward", "never", {"reshard_after_forward": False}))
            if blocks:
                last = blocks[-1]
                raf.append(
                    Choice(
                        "reshard_after_forward",
                        f"all but the root and {last}",
                        {"reshard_after_forward": {last: False}},
                    )
                )
            if multi:
                raf.append(
                    Choice(
                        "reshard_after_forward",
                        f"to {node} ranks (a node)",
                        {"reshard_after_forward": node},
                    )
                )
            user["reshard_after_forward"] = self._user_choice(
                raf,
                "reshard_after_forward",
                given("reshard_after_forward"),
                {"reshard_after_forward": None},
            )
            choices["reshard_after_forward"] = raf
        else:
            from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

            strategies = [
                Choice(
                    "reshard_after_forward",
                    s,
                    {"sharding_strategy": ShardingStrategy[s], "shard_group_size": None},
                )
                for s in ("FULL_SHARD", "SHARD_GRAD_OP")
            ]
            if multi:
                strategies.append(
                    Choice(
                        "reshard_after_forward",
                        f"HYBRID_SHARD ({node} ranks a shard group)",
                        {
                            "sharding_strategy": ShardingStrategy.HYBRID_SHARD,
                            "shard_group_size": node,
                        },
                    )
                )
            user["reshard_after_forward"] = self._user_choice(
                strategies,
                "reshard_after_forward",
                given("reshard_after_forward"),
                strategies[0].kwargs,
            )
            choices["reshard_after_forward"] = strategies
            bp = [
                Choice("backward_prefetch", p.name, {"backward_prefetch": p})
                for p in (BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST)
            ]
            user["backward_prefetch"] = self._user_choice(
                bp, "backward_prefetch", given("backward_prefetch"), bp[0].kwargs
            )
            choices["backward_prefetch"] = bp
            fp = [
                Choice("forward_prefetch", str(v), {"forward_prefetch": v}) for v in (False, True)
            ]
            user["forward_prefetch"] = self._user_choice(
                fp, "forward_prefetch", given("forward_prefetch"), fp[0].kwargs
            )
            choices["forward_prefetch"] = fp
        # checkpointing
        ac = checkpoint_choices(block, len(blocks))
        user_ac = given("activation_checkpointing")
        spec = user_ac.get("activation_checkpointing")
        same = next((c for c in ac if _same_ac(c, spec)), None)
        if same is None:
            same = Choice("activation_checkpointing", checkpoint_label(spec), user_ac)
            ac.append(same)
        choices["activation_checkpointing"], user["activation_checkpointing"] = ac, same
        # precision
        dtype = param_dtype(model)
        standard = standard_precision(api)
        user_mp = given("precision")
        prec = [Choice("precision", precision_label(standard, dtype), standard)]
        mine = Choice("precision", precision_label(user_mp, dtype), user_mp)
        if dtype is not torch.float32 and not user_mp:
            prec = []  # a model in bf16 already: nothing to cast
        if mine not in prec:
            prec.append(mine)
        choices["precision"], user["precision"] = prec, mine
        # micro-batch: every size that divides the samples per step, its micro-steps without
        # gradient sync but the last (grad_accum) and each reducing (a plain loop's)
        batch = batch_size(self.inputs)
        accum = int(kwargs.get("grad_accum", 1))
        user_mb = Choice(
            "micro_batch",
            micro_batch_label(batch, accum),
            {"grad_accum": accum} if accum > 1 else {"grad_accum": 1},
            samples=batch,
        )
        mbs = [user_mb]
        pins: list[Choice] = []
        if batch:
            samples = batch * accum if tokens_per_step is None else 0
            if tokens_per_step is not None:
                samples = self._samples_per_step(tokens_per_step, batch)
            mbs = []
            for d in divisors(samples):
                if d > batch:
                    continue
                n = samples // d
                mbs.append(
                    Choice("micro_batch", micro_batch_label(d, n), {"grad_accum": n}, samples=d)
                )
                if n > 1 and not self.pipelined:
                    mbs.append(_reducing(d, n))
            if "grad_accum" not in kwargs and samples > batch and samples % batch == 0:
                # more tokens per step than the inputs, and no grad_accum: the inputs'
                # backward repeated, each reducing (FSDP syncs unless told not to)
                user_mb = _reducing(batch, samples // batch)
            if user_mb not in mbs:
                mbs.append(user_mb)
        if "micro_batch" in self._fixed:
            wanted = self._fixed["micro_batch"]
            pins = [c for c in mbs if c.samples == wanted]
            if not pins:
                sizes = ", ".join(str(c.samples) for c in mbs if not c.steps)
                raise ConfigError(
                    f"fixed micro_batch={wanted!r}: the micro-batches that make up the tokens "
                    f"per step are {sizes}"
                )
            user_mb = next((c for c in pins if c == user_mb), pins[0])
        choices["micro_batch"], user["micro_batch"] = mbs, user_mb
        # the mesh: data parallel (HSDP on multi-node jobs), and tensor parallelism with the
        # user's plan or, for a model that needs it, its own
        user_mesh = given("mesh")
        refused: set[tuple[str, str]] = set()
        if self.pipelined:  # the job's mesh and its other pp degrees (each traced)
            choices["pipeline"], user["pipeline"] = self._pipeline_choices(given("pipeline"))
            schedules = [user["pipeline"]] if "pipeline" in pinned else choices["pipeline"]
            meshes = self._pipeline_meshes(user_mesh, schedules, batch, "mesh" in pinned, refused)
            mine_mesh = meshes[0]
        elif _cp_degree(user_mesh) > 1:  # the job's context-parallel mesh, as given
            mine_mesh = self._context_parallel_mesh(user_mesh)
            meshes = [mine_mesh]
        else:
            tp = _tp_degree(user_mesh)
            plan = user_mesh.get("parallelize_plan")
            self.tp_standard = plan is None
            if plan is None:
                plan, why = standard_tp_plan(model, self._source)
                if plan is None:
                    self.tp_why = why
            meshes = []
            for ws in self.world_sizes:
                meshes.extend(self._meshes(ws, tp, plan))
            mine_mesh = self._user_mesh(user_mesh, meshes)
        choices["mesh"], user["mesh"] = meshes, mine_mesh
        # offload, compile, float8
        user_f8 = self._float8_spec(given("float8"))
        for knob, values in (
            ("cpu_offload", self._offload_choices()),
            ("compile", self._compile_choices(block)),
            ("float8", self._float8_choices(user_f8)),
        ):
            mine_value = given(knob)
            default = values[0]
            if knob == "float8":
                me = next((c for c in values if self._float8_spec(c.kwargs) == user_f8), None)
            else:
                me = next((c for c in values if _same_kwargs(c.kwargs, mine_value)), None)
            if me is None:
                label = _value_label(mine_value)
                if knob == "float8" and user_f8 is not None:
                    label = _float8_label(user_f8)
                me = Choice(knob, label, mine_value)
                values.append(me)
            if not mine_value:
                me = default
            choices[knob], user[knob] = values, me
        if self.pipelined:
            kept = sorted(set(choices) - PIPELINE_KNOBS - pinned)
            if kept:
                self.notes.append(
                    f"under pipeline parallelism {', '.join(kept)} stay as given: tune turns "
                    "the pipeline degree and schedule, checkpointing, precision and resharding "
                    "there"
                )
            pinned = pinned | set(kept)
        for knob in pinned & set(choices):
            # a micro-batch pinned by its size keeps both ways to accumulate
            choices[knob] = pins if knob == "micro_batch" and pins else [user[knob]]
        if "micro_batch" in pinned and tokens_per_step is not None:
            self.notes.append("micro_batch is pinned, so tokens_per_step is not applied")
        space = Space(
            api,
            block,
            blocks,
            choices,
            user,
            base,
            batch,
            frozenset(pinned),
            self.pipelined,
            frozenset(refused),
        )
        self._describe_pins(space)
        return space

    def _pipeline_choices(self, given: dict[str, Any]) -> tuple[list[Choice], Choice]:
        """The job's schedule and the others of :data:`PIPELINE_SCHEDULES`, each with the
        job's microbatches (another schedule with the default stages for it)."""
        from fsdpviz.plan.pipeline import DEFAULT_SCHEDULE, schedule_class

        mine_name = given.get("pipeline_schedule", DEFAULT_SCHEDULE)
        mine_label, _ = schedule_class(mine_name)
        micro = given.get("microbatches")
        mine = Choice("pipeline", f"{mine_label}" + (f", {micro} microbatches" if micro else ""),
                      dict(given))  # fmt: skip
        out = [mine]
        for name in PIPELINE_SCHEDULES:
            label, _ = schedule_class(name)
            if label == mine_label:
                continue
            kw: dict[str, Any] = {"pipeline_schedule": name, "pipeline_stages": None}
            if micro is not None:
                kw["microbatches"] = micro
            out.append(Choice("pipeline", label + (f", {micro} microbatches" if micro else ""), kw))
        return out, mine

    def _pipeline_meshes(
        self,
        given: dict[str, Any],
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
        from fsdpviz.plan.fsdp2_options import mesh_dims

        sizes, names = mesh_dims(given["mesh"], 4)
        ranks = mesh_ranks(given["mesh"])
        dims = dict(zip(names, sizes or (), strict=True))
        pp, tp = int(dims.get("pp", 1)), int(dims.get("tp", 1))
        mine = Choice(
            "mesh",
            _pp_label(ranks, pp, ranks // (pp * tp), tp),
            dict(given),
            mesh=(ranks, ranks, 1),
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
        for degree in sorted(divisors(ranks // tp)):
            if degree == pp:
                continue
            dp = ranks // (degree * tp)
            label = _pp_label(ranks, degree, dp, tp)
            if (batch * degree) % pp:
                self.notes.append(
                    f"{label} not tried: the batch of {batch} samples per pipeline on pp {pp} "
                    f"is no whole number of samples on pp {degree}"
                )
                continue
            samples = batch * degree // pp
            if degree == 1:
                kw: dict[str, Any] = (
                    {"mesh": ("dp_shard", dp, "tp", tp), "parallelize_plan": plan}
                    if tp > 1
                    else {"world_size": ranks}
                )
            else:
                mesh: tuple[Any, ...] = ("pp", degree, "dp_shard", dp)
                kw = {"mesh": (*mesh, "tp", tp) if tp > 1 else mesh}
                if tp > 1:
                    kw["parallelize_plan"] = plan
                why = [
                    (c.label, self._pipeline_refusal(samples, degree, c.kwargs)) for c in schedules
                ]
                for name, reason in why:
                    if reason:
                        refused.add((label, name))
                        self.notes.append(f"{label} with {name} not tried: {reason}")
                if all(reason for _, reason in why):
                    continue
            out.append(
                Choice("mesh", label, kw, samples=samples, mesh=(ranks, ranks, 1), traced=True,
                       pp=degree)
            )  # fmt: skip
        return out

    def _pipeline_refusal(self, samples: int, degree: int, kwargs: Mapping[str, Any]) -> str:
        """Why the pipeline of ``kwargs`` cannot run on ``degree`` pipeline ranks with a
        batch of ``samples`` and torchtitan's default split ('' where it can), as analyze
        and torch's schedule refuse it."""
        from fsdpviz.errors import FsdpvizError
        from fsdpviz.plan.pipeline import parse_pipeline_options
        from fsdpviz.schedule.pipeline_order import rank_actions

        kw = {**kwargs, "pipeline_stages": None}
        try:
            opts, _ = parse_pipeline_options(self.model, samples, degree, kw)
            rank_actions(opts)
        except FsdpvizError as e:
            return str(e).splitlines()[0]
        return ""

    def _user_choice(
        self,
        choices: list[Choice],
        knob: str,
        given: Mapping[str, Any],
        default: Mapping[str, Any],
    ) -> Choice:
        wanted = given or default
        for c in choices:
            if _same_kwargs(c.kwargs, wanted):
                return c
        mine = Choice(knob, _value_label(wanted), dict(wanted))
        choices.append(mine)
        return mine

    def _samples_per_step(self, tokens_per_step: int, batch: int) -> int:
        per_sample = self._tokens_per_sample(batch)
        if tokens_per_step % per_sample:
            raise ConfigError(
                f"tokens_per_step={tokens_per_step} is not a whole number of samples of "
                f"{per_sample} tokens; give a multiple of {per_sample}"
            )
        return tokens_per_step // per_sample

    def _tokens_per_sample(self, batch: int) -> int:
        from fsdpviz.trace.probe import batch_tokens

        tokens = batch_tokens(self.inputs)
        return max(1, tokens // max(batch, 1))

    def _meshes(self, ws: int, tp: int, plan: dict[str, Any] | None) -> list[Choice]:
        """The meshes on ``ws`` ranks: FSDP over all, HSDP with a node per shard group
        (FSDP2 on more than a node), and FSDP x TP for each tensor-parallel degree up to a
        node that divides the ranks and the heads (with the user's plan, else the model's
        own; ``tp``: the user's degree)."""
        node = self.machine.gpus_per_node
        out = [Choice("mesh", f"{ws} ranks", {"world_size": ws}, mesh=(ws, ws, 1))]
        if self.api == "FSDP2" and ws > node and ws % node == 0:
            kw: dict[str, Any] = {"mesh": ("dp_replicate", ws // node, "dp_shard", node)}
            out.append(
                Choice("mesh", f"{ws} ranks (HSDP {ws // node} x {node})", kw, mesh=(ws, node, 1))
            )
        if self.api != "FSDP2" or plan is None:
            return out
        n_heads = heads(self.model)
        degree = 2
        while degree <= max(node, tp):
            fits = ws % degree == 0 and ws > degree and (not n_heads or n_heads % degree == 0)
            if fits and (degree <= node or degree == tp):
                kw = {"mesh": ("dp_shard", ws // degree, "tp", degree), "parallelize_plan": plan}
                label = f"{ws} ranks (FSDP {ws // degree} x TP {degree})"
                out.append(Choice("mesh", label, kw, mesh=(ws, ws // degree, degree)))
            degree *= 2
        return out

    def _context_parallel_mesh(self, given: dict[str, Any]) -> Choice:
        """The user's mesh with a context-parallel dimension, kept as given: the ranks that
        share each sequence are the job's, not a knob of tune's (its inputs are the whole
        sequences, its loss the share of each rank)."""
        from fsdpviz.plan.fsdp2_options import mesh_dims

        sizes, names = mesh_dims(given["mesh"], 4)
        ranks = mesh_ranks(given["mesh"])
        if self.world_sizes != [ranks]:
            raise ConfigError(
                f"the mesh {given['mesh']!r} has {ranks} ranks, and tune keeps a "
                f"context-parallel mesh as given: leave world_size out or give {ranks}"
            )
        tp = _tp_degree(given)
        dims = " x ".join(f"{n} {v}" for n, v in zip(names, sizes or (), strict=True))
        self.notes.append(f"the mesh stays as given ({dims}): tune has no context-parallel knob")
        label = f"{ranks} ranks ({dims})"
        return Choice("mesh", label, dict(given), mesh=(ranks, ranks // tp, tp), traced=True)

    def _user_mesh(self, given: dict[str, Any], meshes: list[Choice]) -> Choice:
        ws0 = self.world_sizes[0]
        if "mesh" not in given:
            return next(c for c in meshes if c.mesh[0] == ws0)
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

    def _offload_choices(self) -> list[Choice]:
        if self.api == "FSDP2":
            from torch.distributed.fsdp import CPUOffloadPolicy

            on: dict[str, Any] = {"offload_policy": CPUOffloadPolicy()}
            off: dict[str, Any] = {}
        else:
            from torch.distributed.fsdp import CPUOffload

            on, off = {"cpu_offload": CPUOffload(offload_params=True)}, {}
        return [Choice("cpu_offload", "off", off), Choice("cpu_offload", "on", on)]

    def _compile_choices(self, block: type[nn.Module] | None) -> list[Choice]:
        out = [Choice("compile", "off", {})]
        if "compile" in self.allowed:
            value: Any = [block] if block is not None else True
            label = f"each {block.__name__}" if block is not None else "the model"
            out.append(Choice("compile", label, {"compile": value}))
        return out

    def _float8_choices(self, user: Float8 | None) -> list[Choice]:
        """Off, tensorwise, and (FSDP2) tensorwise with float8 all-gathers; the linears the
        user's recipe keeps in high precision (``filter_fqns``: a choice of numerics, such as
        torchtitan's output head) stay so in each."""
        out = [Choice("float8", "off", {})]
        if "float8" not in self.allowed:
            return out
        filters = list(user.filter_fqns) if user is not None else []
        specs = [Float8(filter_fqns=tuple(filters))]
        if self.api == "FSDP2":
            specs.append(Float8(enable_fsdp_float8_all_gather=True, filter_fqns=tuple(filters)))
        for spec in specs:
            value: Any = True
            if spec.enable_fsdp_float8_all_gather or filters:
                value = {k: v for k, v in spec.to_dict().items() if k != "recipe_name" and v}
            out.append(Choice("float8", _float8_label(spec), {"float8": value}))
        return out

    def _float8_spec(self, kwargs: Mapping[str, Any]) -> Float8 | None:
        """The float8 training ``kwargs`` ask for, as analyze reads it (None: none)."""
        return parse_job_options({"float8": kwargs.get("float8")}, self.api).float8

    def _describe_pins(self, space: Space) -> None:
        for knob in sorted(space.pinned & set(space.choices)):
            self.notes.append(f"{knob} stays {space.user[knob].label} (pinned)")


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
    from fsdpviz.plan.pipeline import wants_pipeline

    return bool(wants_pipeline(dict(kwargs)))


def _same_wrap(model: nn.Module, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two wrap plans make the same units: ``fully_shard`` lists naming the same
    modules (by class or by FQN), or policies wrapping the same module classes."""
    if _same_kwargs(a, b):
        return True
    if "fully_shard" in a and "fully_shard" in b:
        return _shard_groups(model, a["fully_shard"]) == _shard_groups(model, b["fully_shard"])
    if "auto_wrap_policy" in a and "auto_wrap_policy" in b:
        classes = [_policy_classes(p) for p in (a["auto_wrap_policy"], b["auto_wrap_policy"])]
        return classes[0] is not None and classes[0] == classes[1]
    return False


def _shard_groups(model: nn.Module, calls: Any) -> frozenset[frozenset[str]] | None:
    """The modules each ``fully_shard`` call takes, by FQN (None where a call is neither a
    class, an FQN nor a tuple of FQNs)."""
    if not isinstance(calls, (list, tuple)):
        return None
    named = list(model.named_modules())
    out: set[frozenset[str]] = set()
    for call in calls:
        if isinstance(call, type):
            picked = [n for n, m in named if n and type(m) is call]
            out.update(
                frozenset([n]) for n in picked if not any(n.startswith(o + ".") for o in picked)
            )
        elif isinstance(call, str):
            out.add(frozenset([call]))
        elif isinstance(call, tuple) and all(isinstance(x, str) for x in call):
            out.add(frozenset(call))
        else:
            return None
    return frozenset(out)


def _policy_classes(policy: Any) -> frozenset[type] | None:
    """The module classes an FSDP1 wrap policy wraps (``ModuleWrapPolicy``, or
    ``transformer_auto_wrap_policy`` with its classes); None for any other policy."""
    classes = getattr(policy, "_module_classes", None)
    if classes is None:
        keywords = getattr(policy, "keywords", None) or {}
        classes = keywords.get("transformer_layer_cls")
    return frozenset(classes) if classes else None


def _pp_label(ranks: int, pp: int, dp: int, tp: int) -> str:
    """A pipeline job's mesh in words: ``"4 ranks (PP 2 x FSDP 2)"``, ``"4 ranks (PP 4)"``,
    ``"4 ranks (FSDP 4)"`` (pp 1: no pipeline), ``"8 ranks (PP 2 x FSDP 2 x TP 2)"``."""
    parts = [f"PP {pp}"] if pp > 1 else []
    if dp > 1 or pp == 1:
        parts.append(f"FSDP {dp}")
    if tp > 1:
        parts.append(f"TP {tp}")
    return f"{ranks} ranks ({' x '.join(parts)})"


def _reducing(samples: int, steps: int) -> Choice:
    """``steps`` micro-steps of ``samples`` per optimizer step, each reducing its gradients:
    the plan is one micro-step (no ``grad_accum``), the time and memory models repeat it."""
    label = f"{micro_batch_label(samples, steps)}, each reduced"
    return Choice("micro_batch", label, {"grad_accum": 1}, samples=samples, steps=steps)


def _tp_degree(given: Mapping[str, Any]) -> int:
    if "parallelize_plan" not in given or "mesh" not in given:
        return 1
    from fsdpviz.plan.fsdp2_options import mesh_dims

    sizes, _ = mesh_dims(given["mesh"], 3)
    return int(sizes[-1]) if sizes else 1


def _cp_degree(given: Mapping[str, Any]) -> int:
    """The context-parallel degree of the user's ``mesh=`` (1: none)."""
    if given.get("mesh") is None:
        return 1
    from fsdpviz.plan.fsdp2_options import context_parallel_mesh, mesh_dims

    sizes, names = mesh_dims(given["mesh"], 4)
    return context_parallel_mesh(sizes, names)[0]


def _flat_mesh(mesh: Any) -> list[Any]:
    if mesh is None:
        return []
    from fsdpviz.plan.fsdp2_options import mesh_dims

    sizes, names = mesh_dims(mesh, 3)
    return [*names, *(sizes or ())]


def _same_kwargs(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = set(a) | set(b)
    return all(_same_value(a.get(k), b.get(k)) for k in keys)


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        if a == b:
            return True
    except Exception:
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is type(b) and hasattr(a, "__dict__") and hasattr(b, "__dict__"):
        return bool(vars(a) == vars(b))
    return False


def _same_ac(choice: Choice, spec: Any) -> bool:
    mine = choice.kwargs.get("activation_checkpointing")
    return _same_value(mine, spec)


def _float8_label(spec: Float8) -> str:
    """A float8 recipe in words: ``"tensorwise, float8 all-gather, except output"``."""
    parts = [spec.recipe_name]
    if spec.enable_fsdp_float8_all_gather:
        parts.append("float8 all-gather")
    if spec.filter_fqns:
        parts.append("except " + ", ".join(spec.filter_fqns))
    return ", ".join(parts)


def _value_label(kwargs: Mapping[str, Any]) -> str:
    """A value as given, in words (``reshard_after_forward`` per group: which keep their
    parameters after forward)."""
    if not kwargs:
        return "as given (default)"
    raf = kwargs.get("reshard_after_forward")
    if len(kwargs) == 1 and isinstance(raf, Mapping):
        return _reshard_label(raf)
    if len(kwargs) == 1 and raf is True:
        return "all, the root too"
    parts = []
    for k, v in kwargs.items():
        name = getattr(v, "name", None) or getattr(v, "__name__", None)
        parts.append(f"{k}={name or v!r}")
    return ", ".join(parts)


def _reshard_label(per_group: Mapping[str, Any]) -> str:
    """``{group: bool | int}`` in words: ``"all but norm, output"`` (those keep theirs)."""
    kept = [g or "(root)" for g, v in per_group.items() if v is False]
    ints = sorted({v for v in per_group.values() if not isinstance(v, bool)})
    if not kept and not ints:
        return "all"
    if len(kept) == len(per_group):
        return "never"
    parts = [f"all but {', '.join(kept)}" if kept else "all"]
    if ints:
        parts.append(f"to {', '.join(map(str, ints))} ranks where given")
    return "; ".join(parts)
