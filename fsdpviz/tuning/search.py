"""``fsdpviz.tune``: the fastest configuration that fits, found with fsdpviz's exact plans.

Every configuration evaluated is the plan :func:`fsdpviz.analyze` gives for its keywords:
the model is traced once per *trace key* (the knobs that change the autograd graph: units,
checkpointing, precision, micro-batch, tensor parallelism, compile, float8, FSDP1's forward
prefetch) and every choice of the other knobs (resharding, the mesh, FSDP1's sharding
strategy and backward prefetch, the micro-steps of gradient accumulation) is replayed from
that trace (:func:`fsdpviz.replan.replay`, milliseconds each), then costed by the memory
and time models.

The search itself, in stages, is :class:`~fsdpviz.tuning.stages.StagedSearch`; here are
``tune`` and ``suggest`` and the checks of their arguments.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack, cast

from torch import nn

from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.sizes import parse_bytes
from fsdpviz.errors import ConfigError, did_you_mean
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.options import DEFAULT_WORLD_SIZE, check_world_size
from fsdpviz.schema.keywords import FSDPKwargs
from fsdpviz.trace.copy import check_model
from fsdpviz.tuning.evaluation import FROM_BATCH_FAMILY, FROM_CHECKPOINT_PAIR
from fsdpviz.tuning.mesh_choices import given_dims, mesh_ranks, pipelined
from fsdpviz.tuning.result import RetuneKwargs, Tuning
from fsdpviz.tuning.retune import StoredTrace, check_retune, fingerprint
from fsdpviz.tuning.space import ALLOWABLE, KNOBS, TuneKwargs, check_fixed
from fsdpviz.tuning.stages import StagedSearch

_FSDP1_ONLY = {
    "auto_wrap_policy", "sharding_strategy", "mixed_precision", "shard_group_size",
    "use_orig_params", "cpu_offload", "limit_all_gathers", "ignored_modules", "ignored_states",
}  # fmt: skip


def tune(
    model: nn.Module | Any,
    inputs: Any = None,
    *,
    world_size: int | Sequence[int] | None = None,
    machine: Machine | str = "h100",
    api: str | None = None,
    fixed: Mapping[str, Any] | None = None,
    allow: Iterable[str] = (),
    tokens_per_step: int | None = None,
    optimizer: str | int | None = "adamw",
    memory_budget: str | int | None = None,
    knobs: Iterable[str] | None = None,
    config: Mapping[str, Any] | None = None,
    exhaustive: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
    **kwargs: Unpack[FSDPKwargs],
) -> Tuning:
    """Find the configuration with the most tokens/s per GPU that fits, and show why.

    ``model`` and ``inputs`` as :func:`fsdpviz.analyze` takes them (``inputs``: one rank's
    batch), or a torchtitan job (:func:`fsdpviz.from_torchtitan`) alone. ``kwargs`` are the
    user's own configuration (``analyze`` keywords: ``fully_shard=[...]``, ``mp_policy``,
    ``activation_checkpointing``, ...; ``config=``: a trainer's, e.g.
    :func:`fsdpviz.from_accelerate`), which is evaluated too and marked. The knobs (see
    :mod:`fsdpviz.tuning.space`) are turned from there, except:

    - ``fixed``: analyze keywords (or knob names) that stay as given
      (``fixed={"mp_policy": mp}``, ``fixed={"micro_batch": 2}``);
    - ``knobs``: only these knobs are turned (default: all of them);
    - ``allow``: ``"compile"``, ``"float8"`` (they change numerics or start-up, so only when
      asked), ``"cpu_offload"`` (otherwise tried only when nothing else fits).

    ``world_size``: the ranks, or a list of counts to compare (tokens/s per GPU and in
    total); default: the configuration's (its ``world_size`` or ``mesh``), else 8. A pipeline
    job (a ``mesh`` with a ``pp`` dimension) keeps its ranks and tries its other pp degrees on
    them (pp 1: FSDP alone), the global batch kept: its inputs are one pipeline's batch (a
    data-parallel rank's), scaled with the degree.
    ``machine``: the GPU (a preset name or :class:`fsdpviz.cost.Machine`).
    ``tokens_per_step``: tokens per rank per optimizer step (default: what the inputs and
    ``grad_accum`` give); micro-batches and gradient accumulation keep it.
    ``memory_budget``: a peak per rank to fit instead of the machine's memory.
    ``workers``: processes that trace configurations the search evaluates anyway side by side
    (forked: only where ``fork`` exists; default: the CPUs, at most 4, where a trace takes a
    second or more; 1: none). The configurations evaluated, and every number, are the same
    whatever the workers.

    Example::

        tuning = fsdpviz.tune(model, {"input_ids": ids}, world_size=8, machine="h100")
        print(tuning)                        # the best, and what each alternative changes
        best = tuning.best
        report = fsdpviz.analyze(model, best.inputs, **best.kwargs)   # == best.report
        print(best.code())                   # the fully_shard calls to paste
        tuning.show()                        # the frontier; click a point for its plan
        tuning.retune(machine="h200")        # the same search on H200s, its traces reused
    """
    if not isinstance(allow, str):
        allow = tuple(allow)  # kept for a retune: an iterator would be spent
    if knobs is not None and not isinstance(knobs, str):
        knobs = tuple(knobs)
    args: dict[str, Any] = {
        "world_size": world_size, "machine": machine, "api": api, "fixed": fixed,
        "allow": allow, "tokens_per_step": tokens_per_step, "optimizer": optimizer,
        "memory_budget": memory_budget, "knobs": knobs, "config": config,
        "exhaustive": exhaustive, "workers": workers, "progress": progress,
    }  # fmt: skip
    return _tune(model, inputs, args, kwargs.copy(), None)


class _Retuner:
    """What :meth:`Tuning.retune` runs: :func:`tune` again with the arguments of the
    search it retunes (``args``, ``kwargs``) and the changes, the traces of every search so
    far (``traces``) reused, once the model is checked to be as it was (``seen``)."""

    def __init__(
        self,
        model: Any,
        inputs: Any,
        args: dict[str, Any],
        kwargs: FSDPKwargs,
        traces: dict[tuple[Any, ...], StoredTrace],
        seen: tuple[Any, ...],
        keep: Any,
    ) -> None:
        self.model, self.inputs, self.args, self.kwargs = model, inputs, args, kwargs
        self.traces, self.seen = traces, seen
        self._keep = keep  # the configuration's entries, alive: ``seen`` holds their ids

    def __call__(self, changes: RetuneKwargs) -> Tuning:
        check_retune(changes)
        model, inputs, config = _resolved(self.model, self.inputs, self.args["config"])
        if fingerprint(model, inputs, config) != self.seen:
            raise ConfigError(
                "the model, its inputs or its configuration changed since it was tuned (its "
                "modules, parameters' names, shapes, dtypes or requires_grad, buffers, input "
                "shapes or configuration entries): its traces are stale; call fsdpviz.tune again"
            )
        return _tune(self.model, self.inputs, {**self.args, **changes}, self.kwargs, self)


def _resolved(model: Any, inputs: Any, config: Any) -> tuple[Any, Any, Any]:
    """The model, inputs and configuration of ``tune``'s arguments (a torchtitan job's)."""
    if _is_torchtitan_job(model):
        return model.model, model.inputs if inputs is None else inputs, model.config
    return model, inputs, config


def _tune(
    model: nn.Module | Any,
    inputs: Any,
    args: dict[str, Any],
    kwargs: FSDPKwargs,
    earlier: _Retuner | None,
) -> Tuning:
    """:func:`tune` with its arguments (``args``: the named ones; ``kwargs``: the
    configuration's), the traces of ``earlier`` reused."""
    started = time.perf_counter()
    given_model, given_inputs = model, inputs
    world_size, machine, api = args["world_size"], args["machine"], args["api"]
    fixed, allow, knobs, config = args["fixed"], args["allow"], args["knobs"], args["config"]
    tokens_per_step, optimizer = args["tokens_per_step"], args["optimizer"]
    memory_budget, progress = args["memory_budget"], args["progress"]
    source = "torchtitan" if _is_torchtitan_job(model) else ""
    model, inputs, config = _resolved(model, inputs, config)
    if inputs is None:
        raise ConfigError("tune needs the model's inputs: tune(model, inputs, world_size=...)")
    check_model(model, "tune")
    if config is not None:
        source = source or _source(config)
    given: TuneKwargs = {**cast(TuneKwargs, dict(config or {})), **kwargs}
    world_sizes = _world_sizes(world_size, given)
    m = make_machine(machine) if isinstance(machine, str) else machine
    chosen_api = _api(api, given, fixed or {})
    fixed_kw = check_fixed(fixed or {}, chosen_api)
    allowed = _allowed(allow)
    turned = set(KNOBS) if knobs is None else _knobs(knobs)
    budget = None if memory_budget is None else parse_bytes(memory_budget)
    search = StagedSearch(
        model,
        inputs,
        chosen_api,
        cast(TuneKwargs, {**given, **{k: v for k, v in fixed_kw.items() if k not in KNOBS}}),
        fixed_kw,
        allowed,
        turned,
        world_sizes,
        m,
        machine,
        tokens_per_step,
        optimizer,
        budget,
        progress,
        source,
        _workers(args["workers"]),
        None if earlier is None else earlier.traces,
    )
    search.run(args["exhaustive"])
    derived = Counter(search.derived_from.values())
    tuning = Tuning(
        candidates=search.candidates,
        user=search.user,
        api=chosen_api,
        machine=m.name,
        world_sizes=world_sizes,
        budget=budget,
        traces=search.trace_count,
        replays=search.replay_count,
        seconds=time.perf_counter() - started,
        notes=search.notes,
        source=source,
        needs=search.needs,
        reused=search.reused_count,
        derived=derived[FROM_BATCH_FAMILY],
        checkpoint_derived=derived[FROM_CHECKPOINT_PAIR],
    )
    seen = fingerprint(model, inputs, config) if earlier is None else earlier.seen
    tuning._retuner = _Retuner(
        given_model,
        given_inputs,
        args,
        kwargs,
        {**(earlier.traces if earlier is not None else {}), **search.made},
        seen,
        None if config is None else dict(config),
    )
    return tuning


def suggest(
    model: nn.Module,
    inputs: Any,
    *,
    memory_budget: str | int | None = None,
    world_size: int | Sequence[int] = DEFAULT_WORLD_SIZE,
    api: str = "fsdp2",
    machine: Machine | str = "h100",
    optimizer: str | int | None = "adamw",
    **options: Unpack[FSDPKwargs],
) -> Tuning:
    """:func:`tune` turning only the wrap plan and FSDP's own switches (FSDP2's resharding
    after forward; FSDP1's sharding strategy and prefetch): the rest of the job
    (``options``: ``mp_policy``, ``activation_checkpointing``, ``grad_accum``, ...) stays
    as given.

    Example::

        tuning = fsdpviz.suggest(model, {"input_ids": ids}, memory_budget="60GiB", world_size=64)
        tuning.best.kwargs        # pass them to fsdpviz.analyze
    """
    return tune(
        model,
        inputs,
        world_size=world_size,
        machine=machine,
        api=api,
        optimizer=optimizer,
        memory_budget=memory_budget,
        knobs=("wrap", RESHARD.name, "backward_prefetch", "forward_prefetch"),
        **options,
    )


# ------------------------------------------------------------------ arguments
def _is_torchtitan_job(obj: Any) -> bool:
    return type(obj).__name__ == "TorchtitanJob" and hasattr(obj, "model")


def _source(config: Mapping[str, Any]) -> str:
    text = str(getattr(config, "source", "")).lower()
    for name in ("torchtitan", "accelerate", "lightning"):
        if name in text:
            return name
    return ""


def _world_sizes(world_size: int | Sequence[int] | None, kwargs: TuneKwargs) -> list[int]:
    """The world sizes to search; the configuration's own ``world_size`` keyword goes (the
    mesh knob sets it), the default where none is given."""
    given = kwargs.pop("world_size", None)
    if world_size is None:
        world_size = given
    if world_size is None and kwargs.get("mesh") is not None:
        world_size = mesh_ranks(kwargs["mesh"]) or None
    if world_size is None:
        world_size = DEFAULT_WORLD_SIZE
    sizes = [world_size] if isinstance(world_size, int) else list(world_size)
    if not sizes:
        raise ConfigError("world_size must be a positive int or a non-empty list of them")
    for ws in sizes:
        check_world_size(ws)
    mesh = kwargs.get("mesh")
    if mesh is not None and pipelined(kwargs):
        ranks = mesh_ranks(mesh)
        if sizes != [ranks]:
            raise ConfigError(
                f"a pipeline's mesh {mesh!r} has {ranks} ranks, and tune keeps a pipeline's "
                f"ranks as given (it turns the pp degree on them): leave world_size out or "
                f"give {ranks}"
            )
    elif mesh is not None:
        user = given_dims(kwargs)
        tp = user.tp if kwargs.get("parallelize_plan") else 1
        for ws in sizes:
            if ws != user.world_size and ws % tp:
                raise ConfigError(
                    f"world_size {ws} does not divide by the mesh's tensor-parallel degree "
                    f"{tp}; give a world size that does"
                )
    return list(dict.fromkeys(sizes))


def _api(api: str | None, kwargs: Mapping[str, Any], fixed: Mapping[str, Any]) -> str:
    if api is not None:
        if api.lower() not in ("fsdp1", "fsdp2"):
            raise ConfigError(f"api must be 'fsdp1' or 'fsdp2', got {api!r}")
        return api.upper()
    given = set(kwargs) | set(fixed)
    if "fully_shard" in given:
        return "FSDP2"
    return "FSDP1" if given & _FSDP1_ONLY else "FSDP2"


def _allowed(allow: Iterable[str]) -> set[str]:
    out = set()
    for key in [allow] if isinstance(allow, str) else allow:
        if key not in ALLOWABLE:
            raise ConfigError(
                f"allow: {key!r} is not something tune tries only when allowed; give any of "
                f"{', '.join(ALLOWABLE)}"
            )
        out.add(key)
    return out


def _workers(workers: int | None) -> int:
    """The workers of ``tune(workers=...)``; negative where tune chooses them (see there)."""
    if workers is not None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError(f"workers must be a positive int, got {workers!r}")
        if workers > 1 and "fork" not in multiprocessing.get_all_start_methods():
            raise ConfigError("workers > 1 needs the fork start method, which this OS lacks")
        return workers
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return -max(1, min(os.cpu_count() or 1, 4))  # negative: tune's own choice


def _knobs(knobs: Iterable[str]) -> set[str]:
    out = set()
    for key in [knobs] if isinstance(knobs, str) else knobs:
        if key not in KNOBS:
            tip = did_you_mean(str(key), KNOBS)
            raise ConfigError(f"knobs: unknown knob {key!r} (tune turns {', '.join(KNOBS)}){tip}")
        out.add(key)
    return out


__all__ = ["suggest", "tune"]
