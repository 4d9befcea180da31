"""The same wrap plan under other settings, without tracing the model again.

A traced report records, in ``report.profile``, every FSDP hook call in the
order torch's autograd made them. Settings that do not change that order can
be predicted by feeding the recorded calls through FSDP's runtime state
machine again (what ``analyze`` already does for the steady state):

- FSDP1: ``world_size``, ``backward_prefetch``, ``sharding_strategy`` (with
  ``shard_group_size``). Backward prefetching and resharding only change which
  collectives are issued, never when autograd reaches a hook; the unit sizes are
  recomputed for the new shard world size (padding, alignment).
- FSDP2: ``world_size``, ``mesh`` (one dimension, or HSDP's replicate x shard; not
  tensor parallelism's: see below), the resharding after forward
  (:data:`~fsdpviz.plan.option_specs.RESHARD`), ``forward_prefetch`` /
  ``backward_prefetch`` maps, ``offload_policy``.
- Both: ``grad_accum`` (micro-steps per optimizer step, the first ``N - 1`` without
  gradient sync): the micro-steps run the same hook calls as the steady state, with
  ``no_sync`` deciding what they issue (not for FSDP1 with ``forward_prefetch``, whose
  steady state was traced under the first micro-step's sync).
- FSDP2 with tensor parallelism: all of the above, ``mesh`` with new data-parallel
  dimensions only (its tp dimension as traced; ``world_size`` alone does not say which
  dimension grows). The parallel styles' collectives are recorded hook calls
  (``tp_forward``/``tp_backward``, issued in every micro-step, as ``analyze`` replays
  them); the trace reads no dp size (only the runtime and the units do); FSDP shards each
  rank's tp-local tensor (``Unit.tp_placements``) over the dp shard ranks; a replicated
  parameter's partial gradient is all-reduced in its group's post-backward when the group
  reduces, as the report's last (synchronising) iteration shows. Another tp degree would
  change the tp-local activations and collectives the trace measured.

- Both: mixed precision (``mixed_precision`` / ``mp_policy``) whose ``reduce_dtype`` alone
  differs from the report's: the gradient reduction's dtype, which no hook call or
  measurement of the trace depends on (:mod:`fsdpviz.replan.precision_replay`).

Anything that changes the autograd graph needs a new trace: the wrap policy,
FSDP1's ``forward_prefetch`` (it creates a prefetched unit's views earlier),
``use_orig_params``, mixed precision's other fields (input and parameter casts), the
inputs.
``tests/test_replan_sweep.py`` checks that a replay equals a fresh ``analyze``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Unpack

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecision

from fsdpviz.cost.fit import check_fit
from fsdpviz.cost.grad_sizes import tp_local_shape
from fsdpviz.cost.sizes import float8_gathered, itemsize
from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp1 import PlannedUnit, UnitConfig, flat_param_layout
from fsdpviz.plan.fsdp1 import optimizer_fields as fsdp1_trainable
from fsdpviz.plan.fsdp1_options import FSDP1Options
from fsdpviz.plan.fsdp2 import check_reshard_ints, prefetch_indices
from fsdpviz.plan.fsdp2_group import Group, accumulated_grad_dtype, restate_resharding
from fsdpviz.plan.fsdp2_options import context_parallel_mesh, offloads, parse_mesh, read_mesh
from fsdpviz.plan.fsdp2_shards import shard_fields
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.torch_fsdp import torch_fsdp
from fsdpviz.replan.precision_replay import PRECISION_OPTION, with_reduce_dtype
from fsdpviz.schedule.fsdp1_runtime import FSDP1Runtime
from fsdpviz.schedule.fsdp2 import forward_order
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime, weight_scales
from fsdpviz.schedule.micro_steps import run_micro_steps
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.events import Event
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.mesh import ParallelDims
from fsdpviz.schema.names import unit_label
from fsdpviz.schema.profile import StepProfile, TraceProfile
from fsdpviz.schema.report import DTYPE_SIZES, Report, Unit, param_shapes

REPLAYABLE = {
    "FSDP1": {
        "world_size", "backward_prefetch", "sharding_strategy", "shard_group_size", "grad_accum",
    },
    "FSDP2": {
        "world_size", "mesh", RESHARD.name, "forward_prefetch", "backward_prefetch",
        "offload_policy", "grad_accum",
    },
}  # fmt: skip
_PLACEHOLDER = nn.Module()
# Warnings about the FSDP1 options themselves, which a replay re-derives.
OPTION_WARNINGS = {"no_shard_world_size_1", "hybrid_not_synchronized", "string_option"}


def replay(report: Report, **changes: Unpack[PlanKwargs]) -> Report:
    """``report``'s wrap plan with ``changes`` applied, predicted without a new trace.

    Example::

        base = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=8)
        other = replay(base, world_size=64, backward_prefetch=None)
    """
    if report.pipeline is not None:
        raise ConfigError(
            "a pipeline's plan is not replayed (each stage's hook calls run per microbatch "
            "in its schedule's order); call fsdpviz.analyze with the new settings"
        )
    if report.profile is None:
        raise ConfigError(
            "this report has no trace profile (a recording, trace='fx' or profile=False), so "
            "its hook calls cannot be replayed; call fsdpviz.analyze with the new settings"
        )
    api = report.config.api
    _check_tensor_parallel(report, changes)
    precision = PRECISION_OPTION[api]
    unknown = set(changes) - REPLAYABLE[api] - {precision}
    if "unshard_in_backward" in unknown:
        raise ConfigError(
            "unshard_in_backward cannot be replayed from a trace: whether a group's backward "
            "reads the parameters it would not gather is what the trace measures; call "
            "fsdpviz.analyze again"
        )
    if unknown:
        raise ConfigError(
            f"{', '.join(sorted(unknown))} cannot be replayed from a trace ({api} replays "
            f"{', '.join(sorted(REPLAYABLE[api]))}, and {precision}'s reduce_dtype); they "
            "change the autograd graph, so call fsdpviz.analyze again"
        )
    rest: dict[str, Any] = dict(changes)
    if precision in rest:
        report = with_reduce_dtype(report, rest.pop(precision))
    replayed = _replay_fsdp2(report, rest) if api == "FSDP2" else _replay_fsdp1(report, rest)
    check_fit(replayed)  # the out_of_memory warning of the new plan, not of the traced one
    return replayed


def _check_tensor_parallel(report: Report, changes: Mapping[str, Any]) -> None:
    """Refuse what a tensor-parallel plan's replay cannot make exact: a world size without
    the mesh it means (which dimension grows is not said)."""
    cfg = report.config
    if cfg.tp_world_size and "world_size" in changes and "mesh" not in changes:
        raise ConfigError(
            "a report with tensor parallelism does not say which mesh dimension a new "
            "world_size changes; replay it with the new mesh= (its tp dimension as it is, "
            f"e.g. mesh=('dp_shard', N, 'tp', {cfg.tp_world_size}))"
        )


def _shapes(report: Report) -> dict[str, list[int]]:
    """Each parameter's shape, as one rank's FSDP shards it: under tensor parallelism its
    tp-local shape (FSDP2 shards the local tensor), else the whole one."""
    out = {fqn: list(shape) for fqn, shape in param_shapes(report.modules).items()}
    tp = report.config.parallel_dims.tp
    if tp > 1:
        for u in report.units:
            for p, placement in u.tp_placements.items():
                out[p] = tp_local_shape(out[p], placement, tp)
    return out


# -------------------------------------------------------------------- FSDP1
def _replay_fsdp1(report: Report, changes: Mapping[str, Any]) -> Report:
    cfg = report.config
    if cfg.forward_prefetch and changes.get("grad_accum", cfg.grad_accum) != cfg.grad_accum:
        raise ConfigError(
            "grad_accum cannot be replayed from a plan with forward_prefetch=True: FSDP1's "
            "steady state was traced (or simulated) under the first micro-step's gradient "
            "sync; call fsdpviz.analyze with the new grad_accum"
        )
    opts = FSDP1Options.from_config(cfg, **changes)
    shapes = _shapes(report)
    units = [_resize_fsdp1(u, opts, shapes) for u in report.units]
    planned = [
        PlannedUnit(
            fqn=u.module,
            module=_PLACEHOLDER,
            config=UnitConfig(
                opts.sharding_strategy,
                _compute_precision(u),
                opts.backward_prefetch,
                opts.forward_prefetch,
                replicas=opts.replicas,
                offload_params=opts.offload_params,
            ),
            param_infos=[(_PLACEHOLDER, p, p) for p in u.params],
            requires_grad=u.requires_grad is not False,
            dtype=getattr(torch, u.dtype) if u.dtype else None,
        )
        for u in units
    ]
    runtime = FSDP1Runtime(planned, opts.use_orig_params, lambda h: None)
    index = {u.module: i for i, u in enumerate(units)}
    assert report.profile is not None
    accum = _grad_accum(report, changes)
    iterations, steps = _run(runtime, report.profile, index, _fsdp1_entry, accum)
    config = opts.restate(cfg).replace(replayed=True, grad_accum=accum)
    if accum == 1:
        config = config.unstate("grad_accum")
    replayed = _report(
        report, config, units, [h.name for h in runtime.pre_forward_order], iterations, steps
    )
    # What FSDP warns about the options is the replayed options' own.
    kept = [
        w
        for w in report.warnings
        if w.code not in OPTION_WARNINGS
        or (
            w.code == "string_option"
            and not {"sharding_strategy", "backward_prefetch"} & set(changes)
        )
    ]
    return replace(replayed, warnings=[*opts.warnings, *kept])


def _compute_precision(u: Unit) -> MixedPrecision | None:
    """The part of a unit's ``MixedPrecision`` its runtime reads: the parameter dtype it
    computes in, where that is not the parameters' own (a host shard is then copied to the
    device on every unshard under CPU offload, the low-precision shard being made from it)."""
    if not u.compute_dtype or u.compute_dtype == u.dtype:
        return None
    return MixedPrecision(param_dtype=getattr(torch, u.compute_dtype))


def _resize_fsdp1(u: Unit, opts: FSDP1Options, shapes: dict[str, list[int]]) -> Unit:
    if not u.params:
        return replace(u, sharding_strategy=opts.sharding_strategy.name)
    layout = flat_param_layout(
        [math.prod(shapes[p]) for p in u.params],
        itemsize(u.compute_dtype or u.dtype),
        use_orig_params=opts.use_orig_params,
        shard_world_size=opts.shard_world_size,
        pad_to=opts.process_group_size,
    )
    frozen = set(u.frozen_params)
    trains = [u.requires_grad is not False and p not in frozen for p in u.params]
    trainable = fsdp1_trainable(u.params, trains, layout, opts.use_orig_params)
    return replace(
        u,
        flat_numel=layout.flat_numel,
        padded_numel=layout.padded_numel,
        sharded_numel=layout.sharded_numel,
        sharding_strategy=opts.sharding_strategy.name,
        **trainable,
    )


def _fsdp1_entry(name: str, index: int, arg: Any) -> tuple[str, int, Any]:
    return (name, index, bool(arg))


# -------------------------------------------------------------------- FSDP2
def _replay_fsdp2(report: Report, changes: Mapping[str, Any]) -> Report:
    cfg = report.config
    if cfg.mesh is not None and "world_size" in changes and "mesh" not in changes:
        raise ConfigError(
            "a report on a 2-D mesh does not say which dimension a new world_size changes; "
            "replay it with the new mesh= (or mesh=None and world_size=N for one dimension)"
        )
    ranks, mesh = _mesh(cfg, changes)
    ws, shard = ranks.world_size, ranks.dp_shard_cp
    offload = cfg.cpu_offload
    if "offload_policy" in changes:
        offload = offloads(changes["offload_policy"])
    rules = torch_fsdp(cfg.torch_version)
    with_params = {u.module: u for u in report.units}
    partial, scattered, reducing = _tp_partial_grads(report)
    groups: list[Group] = []
    for name in cfg.fully_shard:
        fqns = tuple(name.split(", ")) if name else ("",)
        unit = with_params.get(name)
        group = Group(
            name=name,
            modules=tuple(_PLACEHOLDER for _ in fqns),
            fqns=fqns,
            params=[nn.Parameter(torch.empty(0, device="meta"))] if name in with_params else [],
            # the dims the report's shard_placement_fn chose
            shard_dims=[unit.shard_dims.get(p, 0) for p in unit.params] if unit else [],
            tp_partial_grads=partial.get(name, []),
            tp_scattered_grads={f for f, *_ in partial.get(name, [])} & scattered,
            tp_accumulated_dtype=accumulated_grad_dtype(unit.compute_dtype, unit.reduce_dtype)
            if unit
            else None,
        )
        group.unshard_in_backward = cfg.unshard_in_backward.get(name, True)  # as traced
        # the resharding asked for, else the group's as the report applied it
        group.reshard_as(cfg.resharding(name), rules)
        traced = group.frees_after_forward
        group.reshard_as(
            changes[RESHARD.name] if RESHARD.name in changes else cfg.resharding(name), rules
        )
        if not group.unshard_in_backward and group.frees_after_forward and not traced:
            raise ConfigError(
                f"{RESHARD.name} frees {unit_label(name)} after forward, which is not gathered "
                "in backward (unshard_in_backward=False): whether its backward reads its "
                "parameters is what a trace measures; call fsdpviz.analyze again"
            )
        groups.append(group)
    check_reshard_ints(
        groups, shard, [u.module for u in report.units if u.tp_placements], float8_gathered(report)
    )
    # HSDP's replicas: the ranks over neither the shard nor the tp dimension; a 2-D data
    # parallel mesh all-reduces across them, one replica included
    replayed = cfg.replace(world_size=ws, shard_world_size=shard, mesh=mesh).parallel_dims
    f8 = report.config.float8 or {}
    gathered = {w for ws in float8_gathered(report).values() for w in ws}
    precomputed = bool(f8.get("precompute_float8_dynamic_scale_for_fsdp"))
    scales = weight_scales(report.units, gathered, precomputed, replayed.tp > 1)
    runtime = FSDP2Runtime(groups, replayed, offload, rules, scales)
    fwd = changes.get("forward_prefetch", cfg.explicit_forward_prefetch or {})
    bwd = changes.get("backward_prefetch", cfg.explicit_backward_prefetch or {})
    runtime.set_prefetch(
        prefetch_indices(fwd, groups, "forward_prefetch"),
        prefetch_indices(bwd, groups, "backward_prefetch"),
    )
    index = {g.name: i for i, g in enumerate(groups)}
    assert report.profile is not None
    accum = _grad_accum(report, changes)
    flags = (cfg.reshard_after_backward, cfg.requires_all_reduce) if accum > 1 else (True, True)
    iterations, steps = _run(runtime, report.profile, index, _fsdp2_entry, accum, flags)
    if cfg.tp_world_size:
        _check_tp_reductions(iterations, reducing)
    shapes = _shapes(report)
    units = []
    for u in report.units:
        # each parameter on the dim the report's shard_placement_fn chose (0 by default)
        dims = [u.shard_dims.get(p, 0) for p in u.params]
        sizes = shard_fields(
            u.module, u.params, [shapes[p] for p in u.params], dims, shard,
            trains=[p not in u.frozen_params for p in u.params]
            if u.gradless_params or u.param_dtypes
            else None,
            unused=u.unused_params,
            dtypes=[u.param_dtype(p) for p in u.params] if u.param_dtypes else None,
            stated=bool(u.shard_dims or cfg.tp_world_size),  # tp: every shard's shape stated
        )  # fmt: skip
        g = groups[index[u.module]]
        units.append(replace(u, sharding_strategy=g.sharding_strategy, **sizes))
    config = (
        restate_resharding(cfg, groups)
        .replace(
            world_size=ws,
            explicit_forward_prefetch={k: tuple(v) for k, v in fwd.items()},
            explicit_backward_prefetch={k: tuple(v) for k, v in bwd.items()},
            replayed=True,
            grad_accum=accum,
        )
        .unstate(
            *(("grad_accum", "reshard_after_backward", "requires_all_reduce") if accum == 1 else ())
        )
    )
    if mesh is not None:
        config = config.replace(shard_world_size=shard, mesh=mesh)
    elif "mesh" in changes:
        config = config.unstate("shard_world_size", "mesh")
    if offload:
        config = config.replace(cpu_offload=True)
    elif "offload_policy" in changes:
        config = config.unstate("cpu_offload")
    order = forward_order(runtime.log, groups)
    return _report(report, config, units, order, iterations, steps)


def _tp_partial_grads(
    report: Report,
) -> tuple[dict[str, list[tuple[str, int, str | None]]], set[str], set[str]]:
    """Each group's tp parameters whose partial gradients its post-backward reduces
    (``Group.tp_partial_grads``), read from the report's last iteration, which syncs
    gradients: a group that reduce-scatters there all-reduces all of them first, in order.
    Also those of them sharded on the tp dimension, which it reduce-scatters
    (``Group.tp_scattered_grads``), and the groups that reduce: of another group the report
    cannot tell."""
    if not report.config.tp_world_size or not report.iterations:
        return {}, set(), set()
    last = report.iterations[-1]
    reducing = {e.unit for e in last if e.kind == "reduce_scatter"}
    shapes = _shapes(report)
    compute = {u.module: u.compute_dtype for u in report.units}
    partial: dict[str, dict[tuple[str, int, str | None], None]] = {}
    scattered: set[str] = set()
    for e in last:
        # issued inside an FSDP hook: a partial gradient's all-reduce (the parallel
        # styles' collectives are issued by no hook); a second post-backward repeats them
        if (
            e.kind in ("tp_all_reduce", "tp_reduce_scatter")
            and e.hook is not None
            and e.module
            and e.nbytes
        ):
            # its bytes and dtype in the compute dtype (after micro-steps without sync the
            # event's are the reduce dtype's): the replicated parameter's whole shape
            dtype = compute.get(e.unit)
            nbytes, named = e.nbytes, e.dtype
            if dtype is not None and e.kind == "tp_reduce_scatter" and e.dtype is not None:
                # a tp-sharded parameter (its shape here a rank's): the event's elements
                nbytes = e.nbytes // DTYPE_SIZES[e.dtype] * getattr(torch, dtype).itemsize
                named = dtype
            elif dtype is not None and e.module in shapes:
                nbytes = math.prod(shapes[e.module]) * getattr(torch, dtype).itemsize
                named = dtype
            partial.setdefault(e.unit, {})[(e.module, nbytes, named)] = None
            if e.kind == "tp_reduce_scatter":
                scattered.add(e.module)
    return {u: list(p) for u, p in partial.items()}, scattered, reducing


def _check_tp_reductions(iterations: list[list[Event]], reducing: set[str]) -> None:
    """Raise where the replay reduce-scatters a group the traced plan never did: whether its
    post-backward all-reduces tp partial gradients first is not in the report."""
    new = sorted({e.unit for it in iterations for e in it if e.kind == "reduce_scatter"} - reducing)
    if new:
        raise ConfigError(
            f"these groups reduce their gradients only in the replay, and the tensor-parallel "
            f"report does not say which of their parameters have partial gradients: "
            f"{', '.join(repr(u) for u in new)}; call fsdpviz.analyze with the new settings"
        )


def _mesh(
    cfg: ReportConfig, changes: Mapping[str, Any]
) -> tuple[ParallelDims, dict[str, int] | None]:
    """The ranks by dimension of a replay and the mesh it states (None: one data-parallel
    dimension): ``mesh=`` as ``analyze`` takes it (``None`` for ``world_size`` ranks), else
    ``world_size``, else the report's. A tensor-parallel plan's data-parallel dimensions may
    change, its tp dimension may not (the trace measured each rank's tp-local activations
    and collectives); they change nothing the trace recorded: FSDP's shards of the tp-local
    tensors (recomputed), its collectives' ranks, HSDP's replicas. Its cp dimension may not
    change either (:func:`_kept_context_parallel`)."""
    tp = cfg.parallel_dims.tp if cfg.tp_world_size else 0
    if "mesh" not in changes and cfg.mesh is not None:
        return cfg.parallel_dims, dict(cfg.mesh)
    given = changes.get("mesh")
    sizes = _kept_context_parallel(cfg, given)
    if tp and (sizes is None or not 2 <= len(sizes) <= 3):
        tp_name = list(cfg.mesh or ())[-1]
        raise ConfigError(
            f"mesh={given!r} cannot be replayed on a plan with tensor parallelism: give its "
            f"data-parallel dimensions and its {tp_name} dimension of {tp} last, e.g. "
            f"('dp_shard', N, {tp_name!r}, {tp}), or call fsdpviz.analyze"
        )
    if not tp and sizes is not None and len(sizes) > 2:
        raise ConfigError(
            f"mesh={given!r} has {len(sizes)} data-parallel dimensions; a plan without tensor "
            "parallelism has one or two (shard, or replicate x shard)"
        )
    kwargs = {"mesh": given} if given is not None else {"world_size": cfg.ranks}
    if "world_size" in changes:
        kwargs["world_size"] = changes["world_size"]
    read = read_mesh(kwargs, True if tp else None)
    dims = read.parallel_dims
    if tp and dims.tp != tp:
        raise ConfigError(
            f"mesh={given!r} changes the tensor-parallel dimension ({list(cfg.mesh or ())[-1]} "
            f"{tp}), which a replay keeps (the trace measured each rank's tp-local "
            "activations and collectives); call fsdpviz.analyze with the new mesh"
        )
    if tp and not cfg.requires_all_reduce and not dims.hsdp and changes.get("grad_accum") != 1:
        raise ConfigError(
            "requires_all_reduce=False skips HSDP's all-reduce across the replicas of a 2-D "
            "mesh; this mesh has none (give dp_replicate and dp_shard)"
        )
    return dims, read.stated(bool(tp))


def _kept_context_parallel(cfg: ReportConfig, given: Any) -> tuple[int, ...] | None:
    """The sizes of ``mesh=`` of a replay without its cp dimension, whose size must be the
    report's: the trace ran each rank's share of every sequence and its ring attention."""
    sizes, names = parse_mesh(given, 4)
    cp, rest, _ = context_parallel_mesh(sizes, names)
    if cp != cfg.parallel_dims.cp:
        raise ConfigError(
            f"mesh={given!r} has context parallelism over {cp} rank(s) where the report has "
            f"{cfg.parallel_dims.cp}, which a replay keeps (the trace ran each rank's share of "
            "every sequence and its ring attention): keep the cp dimension as it is, or call "
            "fsdpviz.analyze with the new mesh"
        )
    return rest


def _fsdp2_entry(name: str, index: int, arg: Any) -> tuple[str, int, Any]:
    if name == "post_forward":
        return (name, index, tuple(arg))
    if name == "final_callback":
        return (name, index, {int(k): bool(v) for k, v in arg.items()})
    return (name, index, arg)


# ------------------------------------------------------------------- shared
def _grad_accum(report: Report, changes: Mapping[str, Any]) -> int:
    accum = changes.get("grad_accum", report.config.grad_accum)
    if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
        raise ConfigError(
            f"grad_accum must be a positive int (micro-steps per optimizer step), got {accum!r}"
        )
    return accum


def _run(
    runtime: FSDP1Runtime | FSDP2Runtime,
    profile: TraceProfile,
    index: dict[str, int],
    entry: Callable[[str, int, Any], tuple[str, int, Any]],
    grad_accum: int,
    accumulating: tuple[bool, bool] = (True, True),
) -> tuple[list[list[Event]], list[StepProfile]]:
    """Replay each iteration's hook calls (the first traced iteration, then the steady
    state's for every other micro-step: :func:`~fsdpviz.schedule.micro_steps.run_micro_steps`);
    return the events and the re-pointed profile of each."""
    traced = [profile.iterations[0], profile.iterations[-1]]
    logs = [[entry(name, index[unit], arg) for name, unit, arg in s.hooks] for s in traced]
    iterations, event_hooks = run_micro_steps(runtime, logs, grad_accum, accumulating)
    steps = [replace(traced[min(n, 1)], event_hook=hooks) for n, hooks in enumerate(event_hooks)]
    return iterations, steps


def _report(
    base: Report,
    config: ReportConfig,
    units: list[Unit],
    forward_order: list[str],
    iterations: list[list[Event]],
    steps: list[StepProfile],
) -> Report:
    assert base.profile is not None
    return replace(
        base,
        config=config,
        units=units,
        forward_order=forward_order,
        iterations=iterations,
        profile=replace(base.profile, iterations=steps),
        warnings=list(base.warnings),  # its own: check_fit rewrites the list in place
    )
