"""``analyze`` for FSDP2 (``fully_shard``): plan groups, trace once, replay the steady state."""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Unpack

from torch import nn

from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.plan.fsdp2 import GroupMemo, build_groups, check_groups
from fsdpviz.plan.fsdp2_applied import fsdp2_states, plan_from_fully_sharded
from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.fsdp2_options import FSDP2Options, parse_fsdp2_options
from fsdpviz.plan.fsdp2_shards import mark_unused
from fsdpviz.plan.job import JOB_KEYS, micro_step_syncs
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.tensor_parallel import (
    check_float8_styles,
    local_shape,
    resolve_plan,
    unfrozen_warning,
)
from fsdpviz.schedule.cp_emulation import CPEmulation, compiled_names, shard_sequence
from fsdpviz.schedule.fsdp2_emulation import emulations
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime
from fsdpviz.schedule.micro_steps import run_micro_steps
from fsdpviz.schedule.tp_emulation import TPEmulation
from fsdpviz.schema.events import Event
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.names import some_names, unit_label
from fsdpviz.schema.report import IGNORED, FsdpWarning, IgnoredParam, Report
from fsdpviz.trace.checkpointing import apply_checkpointing, checkpointing_of_originals
from fsdpviz.trace.compiled_regions import compiled_checkpoints
from fsdpviz.trace.copy import (
    asked_of_originals,
    inputs_copy,
    map_objects,
    model_copy,
    original_modules,
    original_params,
)
from fsdpviz.trace.modules import (
    ParamPlacement,
    ignored_param_infos,
    module_infos,
    param_first_use,
)
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.progress import progress_bar
from fsdpviz.trace.tracker import ModuleTracker, remove_hooks, run_step


def analyze_fsdp2(
    model: nn.Module, inputs: Any, *, gpus_per_node: int | None = None, **kwargs: Unpack[PlanKwargs]
) -> Report:
    """Plan FSDP2 (``fully_shard``) for ``analyze``; ``gpus_per_node``: the nodes of the
    machine it names, which tensor parallelism's ``mm`` strategies are picked for (None:
    none named, :data:`~fsdpviz.schedule.tp_mm_strategy.GPUS_PER_NODE`)."""
    # profile=False: do not measure activations and FLOPs (report.profile is None)
    profile = bool(kwargs.pop("profile", True))
    if fsdp2_states(model):
        given = sorted(set(kwargs) - {"loss", "progress"} - JOB_KEYS)
        if given:
            raise ConfigError(
                f"the model already has fully_shard applied, so its plan is read from FSDP2's "
                f"state and {', '.join(given)} cannot be given; pass the model before "
                "fully_shard with fully_shard=[...] to try another recipe"
            )
        copy, groups, opts = plan_from_fully_sharded(model, dict(kwargs))
        device = "meta"
        unfrozen: list[str] = []
    else:
        opts = parse_fsdp2_options(dict(kwargs))
        device = "real" if opts.trace == "real" else "meta"
        unfrozen = []
        copy, mapping = model_copy(model, device)
        originals = original_modules(model, mapping)
        checkpointed = checkpointing_of_originals(opts.activation_checkpointing, originals)
        apply_checkpointing(copy, checkpointed)
        ignored = set(map_objects(opts.ignored_params, mapping, "ignored_params") or [])
        if opts.parallelize_plan is not None:
            opts, unfrozen = parallelized(copy, opts, opts.parallelize_plan)
        groups = plan_groups(copy, opts, originals, original_params(model, mapping), ignored)
    check_groups(copy, groups, opts)
    _check_context_parallel(opts, device, profile)
    emulation, tp = emulations(copy, groups, opts, gpus_per_node)
    runtime = emulation.runtime
    n_modules = sum(1 for _ in copy.modules())
    where = "the meta device" if device == "meta" else "the model's device"
    with progress_bar(n_modules, "fsdpviz trace", opts.progress) as bar:
        tracker = ModuleTracker(copy, on_call=bar.tick)
        compiled = opts.job.compiled_modules(copy)
        cp = (
            CPEmulation(
                groups,
                runtime,
                opts.parallel_dims.cp,
                tracker,
                compiled_names(copy, opts.job, compiled),
                opts.parallel_dims.tp if opts.tp is not None else 1,
            )
            if opts.parallel_dims.cp > 1
            else None
        )
        probe: CostProbe | None = None
        try:
            if profile:
                # the gradients FSDP leaves to autograd: of the parameters it does not manage
                probe = fsdp2_probe(
                    copy, groups, opts, tracker, runtime, tp, _unmanaged(copy, groups)
                )
            args, kw = inputs_copy(inputs, device)
            if cp is not None:
                args, kw = shard_sequence(args, kw, cp.size)
            runtime.micro_step(micro_step_syncs(opts.job.grad_accum)[0], *_accumulating(opts))
            with (
                cp.attached() if cp is not None else nullcontext(),
                tp.attached() if tp is not None else nullcontext(),
            ):
                run_step(copy, args, kw, opts.loss, tracker, where)
        finally:
            remove_hooks(tracker, emulation, tp, probe)
    check_unshard_in_backward(groups, probe)
    report = fsdp2_report(
        copy,
        groups,
        opts,
        runtime,
        tracker,
        emulation.reached,
        list(tracker.backward_order),
        list(emulation.view_outputs),
        probe,
    )
    if unfrozen:
        report.warnings.append(unfrozen_warning(unfrozen))
    if tp is not None:
        report.warnings.extend(tp.mixed_warnings() + tp.implicit_warnings())
        if tp.strategy_gpus_per_node is not None:
            node = tp.strategy_gpus_per_node
            report.config = report.config.replace(tp_strategy_gpus_per_node=node)
    return report


def fsdp2_probe(
    copy: nn.Module,
    groups: list[Group],
    opts: FSDP2Options,
    tracker: ModuleTracker,
    runtime: FSDP2Runtime,
    tp: TPEmulation | None,
    unmanaged: list[nn.Parameter] | None = None,
) -> CostProbe:
    """The probe that measures a trace of ``opts``' groups of ``copy`` (a model's, a pipeline
    stage's) for the cost model, marking ``runtime``'s hook calls; ``unmanaged``: the
    parameters no group manages, whose gradients autograd keeps."""
    job = opts.job
    compiled = job.compiled_modules(copy)
    owners = {p: g.name for g in groups for p in g.params}
    owners.update(dict.fromkeys(unmanaged or (), IGNORED))
    probe = CostProbe(
        tracker,
        owners,
        [g.name for g in groups],
        list(copy.buffers()),
        tp.shares() if tp is not None else None,
        compiled=compiled,
        compiled_checkpoints=compiled_checkpoints(copy, compiled, job.compile),
        float8=job.float8_modules(copy),
        float8_weights_gathered=bool(job.float8 and job.float8.enable_fsdp_float8_all_gather),
        float8_recipe=job.float8.recipe_name if job.float8 else "tensorwise",
        float8_fused=bool(job.compile),
    )
    probe.attach(runtime)
    freed = {g.name: list(g.params) for g in _not_gathered_for_backward(groups)}
    probe.forbid_in_backward(freed, runtime.gathered)
    if tp is not None:
        tp.measure(probe)
    return probe


def _not_gathered_for_backward(groups: list[Group]) -> list[Group]:
    """The groups whose parameters are freed after forward and not all-gathered again in
    backward (``set_unshard_in_backward(False)``)."""
    return [g for g in groups if not g.unshard_in_backward and g.frees_after_forward]


def check_unshard_in_backward(groups: list[Group], probe: CostProbe | None) -> None:
    """Raise where a group set not to unshard in backward (``set_unshard_in_backward(False)``)
    frees its parameters after forward and its backward reads them: torch fails there (a
    view of the freed parameter: ``RuntimeError: setStorage: ... out of bounds for storage
    of size 0``). The trace's probe finds the reads; without one (``profile=False``) they
    cannot be checked."""
    freed = _not_gathered_for_backward(groups)
    if not freed:
        return
    if probe is None:
        raise ConfigError(
            f"unshard_in_backward=False for {unit_label(freed[0].name)} is checked against what "
            "its backward reads, which profile=False does not measure; leave profile on"
        )
    for g in freed:
        if g.name in probe.read_in_backward:
            raise FSDPConfigError(
                f"unshard_in_backward=False for {unit_label(g.name)}, whose backward reads its "
                f"parameters ({probe.read_in_backward[g.name]}): FSDP2 frees them after forward "
                "and does not all-gather them in backward, so torch fails there (RuntimeError: "
                "setStorage: ... out of bounds for storage of size 0). Set it False only for "
                "groups whose backward needs no parameter (an embedding's), or keep the group "
                f"unsharded after forward ({RESHARD.code(False)})"
            )


def _check_context_parallel(opts: FSDP2Options, device: str, profile: bool) -> None:
    if opts.parallel_dims.cp <= 1:
        return
    if opts.tp is not None and opts.parallel_dims.tp > 1 and not profile:
        raise ConfigError(
            "context parallelism together with tensor parallelism is planned from the trace's "
            "profile (which tensors a rank holds a 1/tp share of: the heads its ring passes "
            "on); leave profile=False out"
        )
    if device != "meta":
        raise ConfigError(
            "context parallelism is planned on the meta device: leave trace='real' out"
        )


def _accumulating(opts: FSDP2Options) -> tuple[bool, bool]:
    """What the micro-steps before the last set: reshard after backward, all-reduce."""
    return opts.reshard_after_backward, opts.requires_all_reduce


def parallelized(model: nn.Module, opts: FSDP2Options, plan: Any) -> tuple[FSDP2Options, list[str]]:
    """``opts`` with ``parallelize_module``'s ``plan`` read on ``model`` (its float8 styles
    checked), and the parameters it leaves trainable as ``parallelize_module`` does
    (:meth:`~fsdpviz.plan.tensor_parallel.TPPlan.unfreeze`)."""
    opts = opts.replace(tp=resolve_plan(model, plan, opts.parallel_dims.tp, opts.tp_name))
    assert opts.tp is not None
    job = opts.job
    recipe = job.float8.recipe_name if job.float8 else None
    check_float8_styles(opts.tp, model, job.float8_modules(model), recipe)
    return opts, opts.tp.unfreeze(model)


def plan_groups(
    copy: nn.Module,
    opts: FSDP2Options,
    originals: Any,
    params: Mapping[int, nn.Parameter],
    ignored: set[nn.Parameter],
    memo: GroupMemo | None = None,
) -> list[Group]:
    """The ``fully_shard`` groups ``opts`` asks of ``copy``: its callables asked of the user's
    modules (``originals``, :func:`~fsdpviz.trace.copy.original_modules`), ``params`` the
    user's parameter of each of the copy's (what ``shard_placement_fn`` is asked of)."""
    targets = asked_of_originals(opts.targets, originals)
    return build_groups(copy, replace(opts, targets=targets), ignored, memo, params)


def fsdp2_report(
    copy: nn.Module,
    groups: list[Group],
    opts: FSDP2Options,
    runtime: FSDP2Runtime,
    tracker: ModuleTracker,
    reached: set[int],
    backward_order: list[str],
    view_outputs: list[str],
    probe: CostProbe | None = None,
    named: list[tuple[str, nn.Module]] | None = None,
) -> Report:
    """The report of one traced iteration (the runtime's events so far) and its replay:
    what ``analyze`` and a stored trace's plan share once the hook calls ran. ``reached``:
    the ids of the parameters a gradient reached (the groups' unused ones are marked);
    ``named``: ``list(copy.named_modules())`` when the caller keeps it."""
    mark_unused(groups, opts, reached, opts.tp.placements(copy) if opts.tp is not None else {})
    runtime.optimizer_step()
    iterations: list[list[Event]] = [runtime.take_events()]
    # FSDP2 computes with plain unsharded parameters: its hooks add the same
    # autograd nodes every iteration, so the steady state (and every micro-step of
    # gradient accumulation, with or without gradient sync) replays the first.
    log = list(runtime.log)
    iterations += run_micro_steps(
        runtime, [log], opts.job.grad_accum, _accumulating(opts), start=1
    )[0]
    order = forward_order(runtime.log, groups)
    placements = group_placements(groups)
    return Report(
        source="prediction",
        config=opts.describe(groups),
        units=[g.schema for g in groups if g.schema is not None and g.params],
        forward_order=order,
        iterations=iterations,
        warnings=group_warnings(groups, order, view_outputs, opts, list(runtime.incomplete))
        + _mixed_param_group(copy, groups, opts)
        + tracker.warnings,
        modules=module_infos(
            copy, placements, {f: g.name for g in groups for f in g.fqns}, tracker.records, named
        ),
        module_order=list(tracker.order),
        module_backward_order=backward_order,
        param_first_use=param_first_use(placements, tracker.order),
        profile=probe.profile(runtime.log, [len(it) for it in iterations]) if probe else None,
        ignored_params=_ignored(copy, groups, opts),
    )


def _ignored(copy: nn.Module, groups: list[Group], opts: FSDP2Options) -> list[IgnoredParam]:
    """The parameters no group manages, whole on every rank of the FSDP mesh; under tensor
    parallelism each rank's share of one a style distributes (``Shard(d)``: the first rank's
    chunk of dim ``d``, the largest)."""
    infos = ignored_param_infos(copy, {id(p) for g in groups for p in g.params})
    if opts.tp is None or not infos:
        return infos
    layouts = {id(p): layout for p, layout in opts.tp.placements(copy).items()}
    params = dict(copy.named_parameters())
    out = []
    for q in infos:
        shape = local_shape(q.shape, layouts.get(id(params[q.fqn])), opts.parallel_dims.tp)
        size = q.bytes // max(math.prod(q.shape), 1)
        out.append(replace(q, shape=shape, bytes=size * math.prod(shape)))
    return out


def _mixed_param_group(
    copy: nn.Module, groups: list[Group], opts: FSDP2Options
) -> list[FsdpWarning]:
    """``ignored_params`` that stay plain tensors (FSDP2 leaves them as they are; under tensor
    parallelism a style distributes some into DTensors of the tp mesh, which mix) beside
    FSDP2's trainable DTensor parameters: torch's foreach and fused optimizers refuse one
    param group of both (torch's default on a GPU is foreach). Each such update runs one
    ``torch._foreach_*`` (or ``_fused_adamw_``) over the group's tensors of a device and dtype
    (``Optimizer._group_tensors_by_device_and_dtype``), and DTensor's dispatch raises on a
    call that mixes plain tensors with DTensors (``torch/distributed/tensor/_dispatch.py``)."""
    managed = {id(p) for g in groups for p in g.params}
    if not any(p.requires_grad for g in groups for p in g.params):
        return []
    distributed = {id(p) for p in opts.tp.placements(copy)} if opts.tp is not None else set()
    plain = [
        n
        for n, p in copy.named_parameters()
        if id(p) not in managed and id(p) not in distributed and p.requires_grad
    ]
    if not plain:
        return []
    shown = some_names(plain, 3)
    return [
        FsdpWarning(
            "ignored_params_foreach_mix",
            f"ignored_params ({shown}) stay plain tensors beside FSDP2's DTensor parameters: "
            "an optimizer with one param group of both fails at its first step with torch's "
            "foreach or fused update (torch.optim's default on a GPU is foreach): "
            "RuntimeError: aten._foreach_mul_.Scalar got mixed torch.Tensor and DTensor. "
            "Give them a param group of their own (AdamW([{'params': sharded}, {'params': "
            "ignored}])), as fsdpviz's memory model steps them, or pass foreach=False",
            [],
        )
    ]


def _unmanaged(copy: nn.Module, groups: list[Group]) -> list[nn.Parameter]:
    """The parameters of ``copy`` no group manages (``ignored_params``)."""
    managed = {id(p) for g in groups for p in g.params}
    return [p for p in copy.parameters() if id(p) not in managed]


def forward_order(log: list[tuple[str, int, Any]], groups: list[Group]) -> list[str]:
    """Groups (with parameters) in the order their forward first started."""
    order: dict[str, None] = {}
    for name, i, _ in log:
        if name == "final_callback":
            break
        if name == "pre_forward" and groups[i].params:
            order.setdefault(groups[i].name, None)
    return list(order)


def group_placements(groups: list[Group]) -> list[ParamPlacement]:
    out: list[ParamPlacement] = []
    for g in groups:
        size = g.schema.itemsize if g.schema else 0
        paths = g.param_paths or g.param_fqns
        shown = dict(zip(paths, g.param_fqns, strict=True))
        shapes = {f: list(p.shape) for f, p in zip(paths, g.params, strict=True)}
        out.extend(ParamPlacement(f, g.name, s, size, shown[f]) for f, s in shapes.items())
        out.extend(
            ParamPlacement(a, g.name, shapes[prim], size, shown[prim])
            for a, prim in g.shared_paths.items()
        )
    return out


def group_warnings(
    groups: list[Group],
    forward_order: list[str],
    view_outputs: list[str],
    opts: FSDP2Options,
    incomplete: list[str],
) -> list[FsdpWarning]:
    out: list[FsdpWarning] = []
    warns = "FSDP2 warns" if opts.torch.warns_view_output else "FSDP2 of torch 2.13+ warns"
    out += FsdpWarning.naming(
        "view_output",
        f"These fully_shard modules return a view tensor ({warns}): an in-place op "
        "on it (x += y) silently drops the pre-backward hook and skips the all-gather. "
        "Use out-of-place ops or .clone() the output: ",
        view_outputs,
    )
    out += FsdpWarning.naming(
        "grouped_forward_incomplete",
        f"Some modules of these grouped fully_shard calls did not run forward before "
        f"backward, so FSDP2 of {opts.torch.name} never ran their post-forward: the "
        "parameters stay unsharded until the end of backward and their pre-backward "
        "hooks are never registered (FSDP2 warns; torch 2.13 completes such a group "
        "in the root's post-forward). Group only modules that run forward together: ",
        incomplete,
    )
    ran = set(forward_order)
    unused = [g.name for g in groups if g.params and g.name not in ran]
    out += FsdpWarning.naming(
        "unit_unused_in_forward",
        "These fully_shard groups never ran in the forward, so FSDP2 never all-gathers them: ",
        unused,
    )
    mixed = [
        g.name
        for g in groups
        if g.schema is not None and g.schema.requires_grad is None and g.params
    ]
    out += FsdpWarning.naming(
        "frozen_mixed",
        "These groups mix frozen and trainable parameters; only the trainable ones "
        "are reduce-scattered: ",
        mixed,
    )
    return out


__all__ = ["FSDP2Options", "analyze_fsdp2"]
