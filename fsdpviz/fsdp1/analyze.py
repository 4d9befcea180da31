"""``analyze`` for FSDP1: trace a private copy, plan units, emulate two iterations."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from fsdpviz.core.schema import Event, FsdpWarning, ModuleInfo, Report
from fsdpviz.fsdp1.emulate import FSDP1Emulation
from fsdpviz.fsdp1.options import FSDP1Options, parse_fsdp1_options
from fsdpviz.fsdp1.plan import Plan, plan_fsdp1
from fsdpviz.trace.copy import inputs_copy, map_objects, model_copy
from fsdpviz.trace.progress import progress_bar
from fsdpviz.trace.tracker import ModuleTracker, run_step


def analyze_fsdp1(model: nn.Module, inputs: Any, **kwargs: Any) -> Report:
    opts = parse_fsdp1_options(kwargs)
    device = "real" if opts.trace == "real" else "meta"
    copy, mapping = model_copy(model, device)
    ignored_modules = map_objects(opts.ignored_modules, mapping, "ignored_modules")
    ignored_states = map_objects(opts.ignored_states, mapping, "ignored_states")
    mp = opts.mixed_precision
    if mp is not None and mp.buffer_dtype is not None:
        for buf_owner in copy.modules():
            for name, buf in buf_owner._buffers.items():
                if buf is not None and buf.is_floating_point():
                    buf_owner._buffers[name] = buf.to(mp.buffer_dtype)
    plan = plan_fsdp1(copy, opts, ignored_modules, ignored_states)
    emulation = FSDP1Emulation(plan, opts.use_orig_params, real=device == "real")
    runtime = emulation.runtime
    n_modules = sum(1 for _ in copy.modules())
    needs_second_run = any(u.config.forward_prefetch for u in plan.units)
    passes = 2 if needs_second_run else 1
    with progress_bar(total=n_modules * passes, desc="fsdpviz trace", enabled=opts.progress) as bar:
        tracker = ModuleTracker(copy, on_call=bar.tick)
        try:
            iterations: list[list[Event]] = []
            for it in range(passes):
                tracker.reset_calls()
                args, kw = inputs_copy(inputs, device)
                run_step(
                    copy,
                    args,
                    kw,
                    opts.loss,
                    tracker,
                    "the meta device" if device == "meta" else "the model's device",
                )
                emulation.end_iteration()
                if it == 0:
                    first_log = list(runtime.log)
                iterations.append(runtime.take_events())
            if not needs_second_run:
                runtime.replay(first_log)
                iterations.append(runtime.take_events())
        finally:
            tracker.remove()
            emulation.remove()
    warnings = plan.warnings + _runtime_warnings(plan, runtime, iterations)
    return Report(
        source="prediction",
        config=opts.describe(),
        units=[u.schema or _empty_unit(u.fqn, u.module) for u in plan.units],
        forward_order=[h.name for h in runtime.pre_forward_order],
        iterations=iterations,
        warnings=warnings,
        modules=_module_infos(copy, plan, tracker),
        module_order=list(tracker.order),
    )


def _empty_unit(fqn: str, module: nn.Module) -> Any:
    from fsdpviz.core.schema import Unit

    return Unit(module=fqn, module_class=type(module).__name__, params=[])


def _runtime_warnings(plan: Plan, runtime: Any, iterations: list[list[Event]]) -> list[FsdpWarning]:
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
    if unused:
        out.append(
            FsdpWarning(
                "unit_unused_in_forward",
                "These units never ran in the forward, so FSDP never all-gathers them: "
                + ", ".join(repr(n) for n in unused),
                unused,
            )
        )
    gathered_in_bwd = {
        e.unit for e in iterations[-1] if e.kind == "all_gather" and e.phase == "backward"
    }
    reduced = {e.unit for e in iterations[-1] if e.kind in ("reduce_scatter", "all_reduce")}
    no_grad = sorted(gathered_in_bwd - reduced - {u.fqn for u in plan.units if not u.requires_grad})
    if no_grad:
        out.append(
            FsdpWarning(
                "gathered_without_gradient",
                "These units are all-gathered in backward but get no gradient reduction: "
                + ", ".join(repr(n) for n in no_grad),
                no_grad,
            )
        )
    return out


def _module_infos(copy: nn.Module, plan: Plan, tracker: ModuleTracker) -> list[ModuleInfo]:
    direct: dict[str, dict[str, list[int]]] = {}
    managed_by: dict[str, str] = {}
    itemsize = {u.fqn: (u.schema.itemsize if u.schema else 0) for u in plan.units}
    for unit in plan.units:
        shapes = {
            fqn: list(shape)
            for (_, _, fqn), shape in zip(unit.param_infos, unit.shapes, strict=True)
        }
        named = [(fqn, shapes[fqn]) for fqn in shapes]
        named += [(fqn, shapes[prim]) for _, _, fqn, prim in unit.shared_infos]
        for fqn, shape in named:
            owner, _, name = fqn.rpartition(".")
            direct.setdefault(owner, {})[name] = shape
            managed_by.setdefault(owner, unit.fqn)
    units = {u.fqn for u in plan.units}
    infos: list[ModuleInfo] = []
    for fqn, module in copy.named_modules():
        params = direct.get(fqn, {})
        numel = sum(math.prod(s) for s in params.values())
        managing = managed_by.get(fqn, fqn if fqn in units else None)
        rec = tracker.records.get(fqn)
        infos.append(
            ModuleInfo(
                fqn=fqn,
                module_class=type(module).__name__,
                parent=None if not fqn else fqn.rpartition(".")[0],
                unit=managing,
                numel=numel,
                bytes=numel * itemsize.get(managing or "", 0),
                params=params,
                calls=rec.calls if rec else 0,
                input_shapes=rec.input_shapes if rec else [],
                output_shapes=rec.output_shapes if rec else [],
            )
        )
    return infos


__all__ = ["FSDP1Options", "analyze_fsdp1"]
