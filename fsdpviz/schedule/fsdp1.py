"""``analyze`` for FSDP1: trace a private copy, plan units, emulate two iterations."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Unpack

from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp1 import Plan, PlannedUnit, WrapMemo, plan_fsdp1
from fsdpviz.plan.fsdp1_options import FSDP1Options, parse_fsdp1_options
from fsdpviz.plan.job import micro_step_syncs
from fsdpviz.schedule.autograd_order import (
    Graph,
    GraphRecorder,
    capture,
    simulate,
    steady_overrides,
)
from fsdpviz.schedule.fsdp1_emulation import FSDP1Emulation
from fsdpviz.schedule.fsdp1_runtime import FSDP1Runtime, Handle
from fsdpviz.schedule.micro_steps import run_micro_steps
from fsdpviz.schema.events import Event
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.profile import TraceProfile
from fsdpviz.schema.report import IGNORED, FsdpWarning, IgnoredParam, Report, Unit
from fsdpviz.trace.checkpointing import apply_checkpointing, checkpointing_of_originals
from fsdpviz.trace.compiled_regions import compiled_checkpoints
from fsdpviz.trace.copy import (
    asked_of_originals,
    inputs_copy,
    map_objects,
    model_copy,
    original_modules,
)
from fsdpviz.trace.fx import Call, call_counts, fx_call_tree, hook_sequence, module_order
from fsdpviz.trace.modules import (
    ParamPlacement,
    ignored_param_infos,
    module_infos,
    param_first_use,
)
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.progress import progress_bar
from fsdpviz.trace.tracker import ModuleCalls, ModuleTracker, remove_hooks, run_step


@dataclass
class Traced:
    """What one plan's hook calls made, however they ran (a trace, a stored trace): each
    iteration's events, the runtime that made them, the module calls (in order, per module),
    what the run warned, the modules' backward order and the measured profile."""

    iterations: list[list[Event]]
    runtime: FSDP1Runtime
    module_order: list[str]
    records: dict[str, ModuleCalls]
    warnings: list[FsdpWarning] = field(default_factory=list)
    backward_order: list[str] = field(default_factory=list)
    profile: TraceProfile | None = None


def analyze_fsdp1(model: nn.Module, inputs: Any, **kwargs: Unpack[PlanKwargs]) -> Report:
    # profile=False: do not measure activations and FLOPs (report.profile is None)
    profile = bool(kwargs.pop("profile", True))
    opts = parse_fsdp1_options(dict(kwargs)).replace(profile=profile)
    _reject_wrapped(model)
    device = "real" if opts.trace == "real" else "meta"
    copy, mapping = model_copy(model, device)
    originals = original_modules(model, mapping)
    apply_checkpointing(copy, checkpointing_of_originals(opts.activation_checkpointing, originals))
    ignored_modules = map_objects(opts.ignored_modules, mapping, "ignored_modules")
    ignored_states = map_objects(opts.ignored_states, mapping, "ignored_states")
    mp = opts.mixed_precision
    if mp is not None and mp.buffer_dtype is not None:
        for buf_owner in copy.modules():
            for name, buf in buf_owner._buffers.items():
                if buf is not None and buf.is_floating_point():
                    buf_owner._buffers[name] = buf.to(mp.buffer_dtype)
    # fx traces the intact copy; planning then replaces parameters by views.
    tree = fx_call_tree(copy) if opts.trace == "fx" else None
    plan = plan_units(copy, opts, originals, ignored_modules, ignored_states)
    if tree is not None:
        traced = _trace_fx(tree, plan, opts)
    else:
        traced = _trace_autograd(copy, plan, opts, inputs, device)
    return fsdp1_report(copy, plan, opts, traced)


def plan_units(
    copy: nn.Module,
    opts: FSDP1Options,
    originals: Any,
    ignored_modules: Any,
    ignored_states: Any,
    memo: WrapMemo | None = None,
) -> Plan:
    """The units ``opts`` asks of ``copy``, its policy asked of the user's modules
    (``originals``, :func:`~fsdpviz.trace.copy.original_modules`)."""
    policy = asked_of_originals(opts.auto_wrap_policy, originals)
    return plan_fsdp1(
        copy, replace(opts, auto_wrap_policy=policy), ignored_modules, ignored_states, memo
    )


def fsdp1_report(
    copy: nn.Module,
    plan: Plan,
    opts: FSDP1Options,
    traced: Traced,
    named: list[tuple[str, nn.Module]] | None = None,
) -> Report:
    """The report of ``plan``'s hook calls as ``traced`` ran them: what ``analyze`` and a
    stored trace's plan share. ``named``: ``list(copy.named_modules())`` when the caller
    keeps it."""
    runtime = traced.runtime
    where = placements(plan)
    warnings = plan.warnings + traced.warnings + runtime_warnings(plan, runtime, traced.iterations)
    return Report(
        source="prediction",
        config=opts.describe(),
        units=[u.schema or empty_unit(u) for u in plan.units],
        forward_order=[h.name for h in runtime.pre_forward_order],
        iterations=traced.iterations,
        warnings=warnings,
        modules=module_infos(
            copy, where, {u.fqn: u.fqn for u in plan.units}, traced.records, named
        ),
        module_order=traced.module_order,
        module_backward_order=traced.backward_order,
        param_first_use=param_first_use(where, traced.module_order),
        profile=traced.profile,
        ignored_params=ignored_params(copy, plan),
    )


def ignored_params(copy: nn.Module, plan: Plan) -> list[IgnoredParam]:
    """The parameters of ``ignored_modules`` / ``ignored_states``, whole on every rank."""
    ignored = {id(p) for p in plan.ignored_params}
    return ignored_param_infos(copy, {id(p) for p in copy.parameters() if id(p) not in ignored})


def _reject_wrapped(model: nn.Module) -> None:
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise ConfigError(
            "the model is already wrapped in FullyShardedDataParallel; analyse the model "
            "before wrapping it, or record the wrapped model's real run with FSDP1Recorder"
        )


# Set to False to always trace the steady state a second time (tests compare both).
STEADY_BY_SIMULATION = True
_BACKWARD_HOOKS = {"pre_backward", "post_backward", "post_backward_reshard_only", "final_callback"}


def _trace_autograd(
    copy: nn.Module, plan: Plan, opts: FSDP1Options, inputs: Any, device: str
) -> Traced:
    """Run the copy with FSDP1's hooks emulated; real autograd orders the backward hooks."""
    emulation = FSDP1Emulation(plan, opts.use_orig_params, real=device == "real")
    runtime = emulation.runtime
    # gradient accumulation: the micro-steps under no_sync() reduce nothing, and keep
    # SHARD_GRAD_OP's parameters unsharded through backward (set per iteration)
    syncs = micro_step_syncs(opts.job.grad_accum)
    n_modules = sum(1 for _ in copy.modules())
    # Forward prefetch creates a prefetched unit's views earlier in the steady
    # state, which changes the backward hook order: simulate the engine on the
    # captured graph (schedule/autograd_order.py) or, if that cannot be trusted, trace again.
    # The simulation orders the hooks only: the compute between them changes too (a
    # prefetched unit's gradient is assembled, and its post-backward runs, after the backward
    # of the unit before it, its parameters' gradients held meanwhile), so a measured
    # profile (memory and time between hooks) needs the second trace.
    forward_prefetch = any(u.config.forward_prefetch for u in plan.units)
    graphs: list[Graph] = []
    if forward_prefetch and STEADY_BY_SIMULATION and not opts.profile:
        emulation.recorder = GraphRecorder()
    where = "the meta device" if device == "meta" else "the model's device"
    with progress_bar(n_modules, "fsdpviz trace", opts.progress) as bar:
        tracker = ModuleTracker(copy, on_call=bar.tick)
        probe: CostProbe | None = None
        try:
            if opts.profile:
                probe = _probe(tracker, emulation, plan, copy, opts)
            args, kw = inputs_copy(inputs, device)
            capture_graph = (
                (lambda loss: graphs.append(capture(loss))) if emulation.recorder else None
            )
            runtime.sync = syncs[0]
            run_step(copy, args, kw, opts.loss, tracker, where, capture_graph)
            emulation.end_iteration()
            first_log = list(runtime.log)
            iterations = [runtime.take_events()]
            steady_log = first_log
            if forward_prefetch:
                recorder, emulation.recorder = emulation.recorder, None
                runtime.sync = syncs[1]
                start = len(runtime.log)
                steady = None
                if recorder is not None and graphs:
                    steady = _simulated_steady(runtime, recorder, graphs[0], first_log)
                if steady is None:
                    tracker.reset_calls()
                    args, kw = inputs_copy(inputs, device)
                    run_step(copy, args, kw, opts.loss, tracker, where)
                    emulation.end_iteration()
                    steady = runtime.take_events()
                iterations.append(steady)
                steady_log = list(runtime.log[start:])
            # the other micro-steps run the steady state's hook calls
            accum = opts.job.grad_accum
            iterations += run_micro_steps(runtime, [steady_log], accum, start=len(iterations))[0]
        finally:
            remove_hooks(tracker, emulation, probe)
    return Traced(
        iterations,
        runtime,
        list(tracker.order),
        tracker.records,
        warnings=list(tracker.warnings),
        backward_order=list(tracker.backward_order),
        profile=probe.profile(runtime.log, [len(it) for it in iterations]) if probe else None,
    )


def _probe(
    tracker: ModuleTracker,
    emulation: FSDP1Emulation,
    plan: Plan,
    copy: nn.Module,
    opts: FSDP1Options,
) -> CostProbe:
    """Measure activations, FLOPs and kernels for the cost model (fsdpviz.cost)."""
    owners: dict[nn.Parameter, str] = {flat: fqn for fqn, flat in emulation.flats.items()}
    # the gradients FSDP leaves to autograd: of ignored_modules' and ignored_states' parameters
    owners.update(dict.fromkeys(plan.ignored_params, IGNORED))
    compiled = opts.job.compiled_modules(copy)
    probe = CostProbe(
        tracker,
        owners,
        [u.fqn for u in plan.units],
        list(copy.buffers()),
        compiled=compiled,
        compiled_checkpoints=compiled_checkpoints(copy, compiled, opts.job.compile),
        float8=opts.job.float8_modules(copy),
        float8_recipe=opts.job.float8.recipe_name if opts.job.float8 else "tensorwise",
        float8_fused=bool(opts.job.compile),
        # see [Note: a unit run twice under parameter mixed precision] (memory_fsdp1.py)
        call_gradients=opts.mixed_precision is not None
        and opts.mixed_precision.param_dtype is not None,
    )
    probe.attach(emulation.runtime)
    return probe


def _simulated_steady(
    runtime: FSDP1Runtime, rec: GraphRecorder, graph: Graph, log: list[tuple[str, int, bool]]
) -> list[Event] | None:
    """The steady-state events from the captured graph, or None if it cannot be trusted."""
    start = next((i for i, e in enumerate(log) if e[0] in _BACKWARD_HOOKS), len(log))
    forward, backward = log[:start], log[start:]
    if not rec.supported or any(e[0] not in _BACKWARD_HOOKS for e in backward):
        return None  # hooks on leaves, or forward hooks inside backward (recompute)
    if simulate(graph, rec, {}) != backward:
        return None  # the simulation does not reproduce the engine's first iteration
    index = {u.unit.fqn: i for i, u in enumerate(runtime.states)}
    creations: list[tuple[int, int, int, bool]] = []
    calls: dict[int, int] = {}
    current = [0, 0]

    def record(h: Handle) -> None:
        creations.append((index[h.name], current[0], current[1], runtime._prefetching))

    make_views, runtime.make_views = runtime.make_views, record
    try:
        for entry in forward:
            if entry[0] == "pre_forward":
                current[:] = [entry[1], calls.get(entry[1], 0)]
                calls[entry[1]] = current[1] + 1
            runtime.replay([entry])
    finally:
        runtime.make_views = make_views
    runtime.replay(simulate(graph, rec, steady_overrides(rec, creations, len(rec.views))))
    return runtime.take_events()


def _trace_fx(tree: Call, plan: Plan, opts: FSDP1Options) -> Traced:
    """Forward order from torch.fx; the backward hook order is inferred (see trace/fx.py)."""
    runtime = FSDP1Runtime(plan.units, opts.use_orig_params, lambda h: None)
    index = {u.fqn: i for i, u in enumerate(plan.units)}
    log: list[tuple[str, int, bool]] = []
    for hook, i in hook_sequence(tree, index):
        unit = plan.units[i]
        if hook == "post_backward":
            if not unit.has_params:
                continue
            hook = "post_backward" if unit.requires_grad else "post_backward_reshard_only"
        log.append((hook, i, hook in ("pre_forward", "post_forward")))
    log.append(("final_callback", 0, False))
    iterations = run_micro_steps(runtime, [log], opts.job.grad_accum)[0]
    records = {fqn: ModuleCalls(calls=n) for fqn, n in call_counts(tree).items()}
    warning = FsdpWarning(
        "approximate_backward_order",
        "trace='fx' runs no autograd: the backward hook order is inferred from the forward "
        "call order (exact for sequential models without forward prefetch). Use "
        "trace='meta' or trace='real' for the order torch's autograd engine produces.",
    )
    return Traced(iterations, runtime, module_order(tree), records, [warning])


def empty_unit(unit: PlannedUnit) -> Unit:
    """The unit of a module FSDP1 wraps although it holds no parameters of its own: FSDP
    still gives it its sharding strategy (the root's, or its policy's)."""
    return Unit(
        module=unit.fqn,
        module_class=type(unit.module).__name__,
        params=[],
        sharding_strategy=unit.config.sharding_strategy.name,
    )


def runtime_warnings(
    plan: Plan, runtime: FSDP1Runtime, iterations: list[list[Event]]
) -> list[FsdpWarning]:
    """What the schedule shows FSDP would warn about: shared parameters flattened twice,
    units never used in forward, units all-gathered in backward without a gradient."""
    out: list[FsdpWarning] = []
    seen: dict[str, str] = {}
    shared: list[str] = []
    for unit in plan.units:
        for p, info in zip(unit.params, unit.param_infos, strict=True):
            key = str(id(p))
            if key in seen:
                shared.append(f"{info[2]} (also in unit {seen[key]!r})")
            seen[key] = unit.fqn
    if shared:
        out.append(
            FsdpWarning(
                "shared_param_across_units",
                "Parameters shared across units are flattened into more than one FlatParameter, "
                "which FSDP does not support: " + ", ".join(shared),
            )
        )
    used = {h.name for h in runtime.pre_forward_order}
    unused = [u.fqn for u in plan.units if u.has_params and u.fqn not in used]
    out += FsdpWarning.naming(
        "unit_unused_in_forward",
        "These units never ran in the forward, so FSDP never all-gathers them: ",
        unused,
    )
    gathered_in_bwd = {
        e.unit for e in iterations[-1] if e.kind == "all_gather" and e.phase == "backward"
    }
    reduced = {e.unit for e in iterations[-1] if e.kind in ("reduce_scatter", "all_reduce")}
    no_grad = sorted(gathered_in_bwd - reduced - {u.fqn for u in plan.units if not u.requires_grad})
    out += FsdpWarning.naming(
        "gathered_without_gradient",
        "These units are all-gathered in backward but get no gradient reduction: ",
        no_grad,
    )
    return out


def placements(plan: Plan) -> list[ParamPlacement]:
    """Where each parameter of the plan lives (its unit, shape and bytes per element)."""
    out: list[ParamPlacement] = []
    for unit in plan.units:
        size = unit.schema.itemsize if unit.schema else 0
        shapes = {
            fqn: list(s) for (_, _, fqn), s in zip(unit.param_infos, unit.shapes, strict=True)
        }
        out.extend(ParamPlacement(f, unit.fqn, s, size, f) for f, s in shapes.items())
        out.extend(
            ParamPlacement(f, unit.fqn, shapes[prim], size, prim)
            for _, _, f, prim in unit.shared_infos
        )
    return out


__all__ = ["FSDP1Options", "analyze_fsdp1"]
