"""Each stage of a pipeline traced once, on one microbatch (:class:`StageTrace`).

A stage is a copy of the model holding its modules, sharded as an FSDP root of its own, as
torchtitan builds it (``fully_shard=`` and ``parallelize_plan`` narrowed to what it holds).
Its forward runs on the first microbatch (the next stage: on this one's output), then its
backward from the gradient of its output (the last stage: from the loss); FSDP2's hook
calls of both are kept for :mod:`fsdpviz.schedule.pipeline_replay`, with what the probe
measured and the bytes the stage receives and sends.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle
from torch.utils._pytree import tree_leaves

from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp2 import build_groups, check_groups, resolve_targets
from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.fsdp2_options import FSDP2Options
from fsdpviz.plan.pipeline import PipelineOptions, split_module
from fsdpviz.plan.tensor_parallel import unfrozen_warning
from fsdpviz.schedule.fsdp2 import check_unshard_in_backward, fsdp2_probe, parallelized
from fsdpviz.schedule.fsdp2_emulation import emulations
from fsdpviz.schedule.pipeline_split import SplitBackward, SplitKey, SplitTraces, split_backward
from fsdpviz.schema.names import some_names
from fsdpviz.schema.pipeline import stage_root
from fsdpviz.schema.profile import TraceProfile
from fsdpviz.schema.report import FsdpWarning
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.progress import QUIET, progress_bar
from fsdpviz.trace.tracker import ModuleTracker, remove_hooks, run_step

Log = list[tuple[str, int, Any]]


@dataclass
class StageTrace:
    """One stage traced on one microbatch: its groups, and FSDP2's hook calls of its forward
    and of its backward."""

    index: int
    part: nn.Module
    opts: FSDP2Options
    groups: list[Group]
    forward: Log
    backward: Log
    tracker: ModuleTracker
    view_outputs: list[str]
    incomplete: list[str]  # grouped calls whose forward FSDP2 never completed (warned)
    input_bytes: int  # the activations it receives (a gradient of them it sends back)
    output_bytes: int  # the activations it sends (a gradient of them it receives)
    inputs_need_grad: bool
    outputs_need_grad: bool = True  # False: a frozen stage's (no backward, no gradient back)
    loss_bytes: int = 0  # the last stage's loss
    profile: TraceProfile | None = None  # what the probe measured (one iteration)
    split: SplitTraces | None = None  # its backward as I and W (zero-bubble schedules)
    warnings: list[FsdpWarning] = field(default_factory=list)  # tensor parallelism's
    reached: set[int] = field(default_factory=set)  # ids of the parameters given a gradient
    # the GPUs per node its mm strategies were picked for, where one depends on it
    # (TPEmulation.strategy_gpus_per_node)
    tp_strategy_gpus_per_node: int | None = None


def trace_stages(
    copy: nn.Module,
    popts: PipelineOptions,
    opts: FSDP2Options,
    ignored: set[nn.Parameter],
    args: tuple[Any, ...],
    kw: dict[str, Any],
    device: str,
    profile: bool,
    split: dict[int, list[int]] | None = None,
    gpus_per_node: int | None = None,
) -> list[StageTrace]:
    """Each stage traced on the first microbatch (the next on this one's output); ``split``:
    by stage, the microbatches whose backward the schedule splits into ``I`` and ``W``
    (empty: none), which every stage but the first then measures in more traces, as the
    replay asks for them (:mod:`fsdpviz.schedule.pipeline_split`). ``gpus_per_node``: the
    nodes tensor parallelism's ``mm`` strategies are picked for (:class:`TPEmulation`)."""
    split = split or {}
    _check_targets(copy, opts.targets)
    _check_in_model(opts.unshard_in_backward, copy)
    where = "the meta device" if device == "meta" else "the model's device"
    traces: list[StageTrace] = []
    before: tuple[Sequence[str], bool] = ([], False)  # the last stage's modules, frozen
    # received activations one tp rank holds a share of, with their shares
    shared: list[tuple[torch.Tensor, Fraction]] = []
    n_modules = sum(1 for _ in copy.modules())
    with progress_bar(n_modules, "fsdpviz trace", opts.progress) as bar:
        for s, names in enumerate(popts.stage_modules):
            part = split_module(copy, names)
            modules = dict(part.named_modules())
            stage_opts = dataclasses.replace(
                opts,
                targets=_stage_targets(opts.targets, modules),
                forward_prefetch={k: v for k, v in opts.forward_prefetch.items() if k in modules},
                backward_prefetch={k: v for k, v in opts.backward_prefetch.items() if k in modules},
                unshard_in_backward=_in_stage(opts.unshard_in_backward, modules),
            )
            unfrozen: list[str] = []
            if opts.parallelize_plan is not None:
                plan = _stage_plan(opts.parallelize_plan, modules)
                stage_opts, unfrozen = parallelized(part, stage_opts, plan)
            groups = _name_root(build_groups(part, stage_opts, ignored), s)
            check_groups(part, groups, stage_opts)
            last = s == popts.num_stages - 1
            trace, output, shares = _trace_stage(
                s, part, stage_opts, groups, args, kw, last, where, bar, profile, shared,
                gpus_per_node=gpus_per_node,
            )  # fmt: skip
            if unfrozen:
                trace.warnings.append(unfrozen_warning(unfrozen))
            if s and split.get(s) and not trace.inputs_need_grad:
                lost = _lost_to_frozen_inputs(s, before, groups, popts, split[s])
                trace.warnings += [lost] if lost is not None else []
            if split and s and trace.profile is not None:
                trace.split = SplitTraces(functools.partial(
                    _split_trace, s, part, stage_opts, groups, args, kw, last, where, shared,
                    gpus_per_node=gpus_per_node,
                ))  # fmt: skip
            if s:
                trace.input_bytes = traces[-1].output_bytes  # what the previous stage sends
            traces.append(trace)
            # the next stage receives this stage's output tensors as its positional inputs
            outs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
            args = tuple(t.detach().requires_grad_(t.requires_grad) for t in outs)
            shared = [(a, sh) for a, sh in zip(args, shares, strict=True) if sh is not None]
            kw = {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}
            before = (names, not any(p.requires_grad for p in part.parameters()))
    return traces


def _lost_to_frozen_inputs(
    s: int,
    before: tuple[Sequence[str], bool],
    groups: list[Group],
    popts: PipelineOptions,
    split: list[int],
) -> FsdpWarning | None:
    """Stage ``s`` receives inputs that need no gradient (``before``: the stage before it,
    its modules and whether it is frozen: no trainable parameter, its own inputs needing
    none, so its output needs none, ``_derive_grad_metas``), and the schedule splits its
    backward of the microbatches ``split`` into ``I`` and ``W``: torch's
    ``stage_backward_input`` finds no input that needs a gradient, so it runs no autograd
    (``_autograd_grad_for_inputs`` returns Nones) and its ``get_param_groups`` no parameter
    group (no path from the inputs), and ``W`` (``stage_backward_weight`` over none)
    computes nothing: those microbatches give the stage's parameters no gradient, silently.
    None where it has no trainable parameter."""
    units = [g.name for g in groups if any(p.requires_grad for p in g.params)]
    if not units:
        return None
    mbs = sorted(set(split))
    if len(mbs) == popts.microbatches:
        which = "any microbatch: they are never trained (no reduce-scatter, no gradient)"
    else:
        full = [m for m in range(popts.microbatches) if m not in mbs]
        which = (
            f"microbatch{'es' if len(mbs) > 1 else ''} {', '.join(map(str, mbs))} (only "
            f"{', '.join(map(str, full))}, whose backward is whole, do: the reduced "
            "gradient is partial)"
        )
    shown = ", ".join(repr(u) for u in units)
    names, frozen = before
    why = (
        "has no trainable parameter and its inputs need no gradient, so its output needs none"
        if frozen
        else "sends outputs that need no gradient"
    )
    return FsdpWarning(
        "pipeline_frozen_input_lost_gradients",
        f"{popts.schedule}: pipeline stage {s - 1} ({some_names(names, 4)}) "
        f"{why}, so stage {s}'s inputs need none; "
        f"{popts.schedule} splits stage {s}'s backward into an input part (I, torch's "
        "stage_backward_input) and a weight part (W): with no input that needs a gradient, "
        "I runs no autograd and finds no parameter group, and W computes nothing, so stage "
        f"{s}'s units {shown} get no gradient from {which}. torch runs this job and loses "
        "those gradients silently. Use a schedule that does not split the backward (1F1B, "
        "Interleaved1F1B, GPipe, LoopedBFS), or make stage "
        f"{s - 1}'s output need a gradient (give it a trainable module with pipeline_stages=, "
        "its FQNs per stage, or leave one of its parameters trainable)",
        units,
    )


def _stage_targets(spec: Any, modules: dict[str, nn.Module]) -> Any:
    """``fully_shard=`` for one stage: FQNs of modules another stage holds left out (a
    grouped call keeps the members the stage has), classes and callables as they are."""
    items = [spec] if isinstance(spec, (str, type)) or callable(spec) else list(spec or [])
    out: list[Any] = []
    classes = {type(m).__name__ for m in modules.values()}
    for item in items:
        if isinstance(item, tuple):
            kept = tuple(n for n in item if n in modules)
            if kept:
                out.append(kept)
        elif isinstance(item, str) and item not in modules and item not in classes:
            continue  # another stage's module (or no module: the whole model's check said)
        elif isinstance(item, type) and not any(isinstance(m, item) for m in modules.values()):
            continue
        else:
            out.append(item)
    return out


def _check_targets(copy: nn.Module, spec: Any) -> None:
    """What ``fully_shard=`` names must be in the model (checked once, on the whole)."""
    resolve_targets(copy, spec)


def _stage_plan(plan: Any, modules: dict[str, nn.Module]) -> dict[str, ParallelStyle]:
    """``parallelize_plan`` for one stage: the patterns that match a module it holds."""
    return {
        pattern: style
        for pattern, style in dict(plan).items()
        if any(fnmatch.fnmatch(name, pattern) for name in modules)
    }


def _name_root(groups: list[Group], s: int) -> list[Group]:
    """Stage ``s``'s root group (the model part's, FQN ``""``) named ``(root of stage s)``:
    every stage's root is the model's."""
    for g in groups:
        if g.is_root:
            g.name = stage_root(s)
            if g.schema is not None:
                g.schema = dataclasses.replace(g.schema, module=g.name)
    return groups


def _holds(key: str, modules: dict[str, nn.Module]) -> bool:
    """Whether ``modules`` hold what a per-call mapping's ``key`` names: a module's FQN, or a
    grouped call's name (its modules' FQNs joined by ``", "``)."""
    return all(name in modules for name in key.split(", "))


def _in_stage(
    value: bool | dict[str, bool], modules: dict[str, nn.Module]
) -> bool | dict[str, bool]:
    """``unshard_in_backward`` for a stage: a mapping's entries for the modules it holds
    (the model's root, ``""``, each stage's root)."""
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if _holds(k, modules)}


def _check_in_model(value: bool | dict[str, bool], copy: nn.Module) -> None:
    """Raise where ``unshard_in_backward``'s mapping names no module of the model (each
    stage checks the names it holds)."""
    if not isinstance(value, dict):
        return
    modules = dict(copy.named_modules())
    unknown = [k for k in value if not _holds(k, modules)]
    if unknown:
        raise ConfigError(
            f"unshard_in_backward: {unknown[0]!r} is not a module of the model; key the "
            "mapping by the FQNs of the modules fully_shard is applied to"
        )


def _trace_stage(
    s: int,
    part: nn.Module,
    opts: FSDP2Options,
    groups: list[Group],
    args: tuple[Any, ...],
    kw: dict[str, Any],
    last: bool,
    where: str,
    bar: Any,
    profile: bool,
    shared: list[tuple[torch.Tensor, Fraction]],
    split: tuple[SplitKey, SplitBackward] | None = None,
    gpus_per_node: int | None = None,
) -> tuple[StageTrace, Any, list[Fraction | None]]:
    emulation, tp = emulations(part, groups, opts, gpus_per_node)
    runtime = emulation.runtime
    tracker = ModuleTracker(part, on_call=bar.tick)
    probe: CostProbe | None = None

    loss_bytes = 0

    def forward_done(loss: Any) -> None:  # the loss computed (or the output made): a mark
        nonlocal loss_bytes
        if last:
            loss_bytes = _bytes([loss])
        runtime.log.append(("forward_end", 0, None))

    try:
        if profile:
            probe = fsdp2_probe(part, groups, opts, tracker, runtime, tp)
            probe.inputs_shared(shared)
        backward = None
        if split is not None and probe is not None:
            params = {g.name: list(g.params) for g in groups}
            backward = split_backward(probe, part, (args, kw), params, *split)
        with tp.attached() if tp is not None else nullcontext():
            output = run_step(
                part,
                args,
                kw,
                opts.loss,
                tracker,
                where,
                forward_done,
                stage_output=not last,
                keep_output=True,
                backward=backward,
            )
    finally:
        remove_hooks(tracker, emulation, tp, probe)
        for p in part.parameters():
            p.grad = None
    check_unshard_in_backward(groups, probe)  # torch fails where a backward reads them
    log = list(runtime.log)
    at = next(i for i, e in enumerate(log) if e[0] == "forward_end")
    received = [t for t in args if isinstance(t, torch.Tensor)]
    sent = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
    ran = any(e[0] == "final_callback" for e in log)  # a frozen stage's backward runs none
    measured = probe.profile(log, [len(runtime.events)], ran) if probe is not None else None
    # what one rank holds of them: a 1/tp share of what sequence parallelism keeps sharded
    size = probe.local_bytes if probe is not None else _bytes
    trace = StageTrace(
        index=s,
        part=part,
        opts=opts,
        groups=groups,
        forward=log[:at],
        backward=log[at + 1 :],
        tracker=tracker,
        view_outputs=list(emulation.view_outputs),
        incomplete=list(runtime.incomplete),
        input_bytes=_bytes(received),
        output_bytes=size(sent),
        inputs_need_grad=any(t.requires_grad for t in received),
        outputs_need_grad=any(t.requires_grad for t in sent),
        loss_bytes=loss_bytes,
        profile=measured,
        warnings=tp.mixed_warnings() + tp.implicit_warnings() if tp is not None else [],
        reached=set(emulation.reached),
        tp_strategy_gpus_per_node=tp.strategy_gpus_per_node if tp is not None else None,
    )
    shares = [probe.share_of(t) if probe is not None else None for t in sent]
    return trace, output, shares


def _split_trace(
    s: int,
    part: nn.Module,
    opts: FSDP2Options,
    groups: list[Group],
    args: tuple[Any, ...],
    kw: dict[str, Any],
    last: bool,
    where: str,
    shared: list[tuple[torch.Tensor, Fraction]],
    key: SplitKey,
    *,
    gpus_per_node: int | None = None,
) -> SplitBackward:
    """The stage traced again, its backward as ``I`` then ``W`` (``key``: which weights
    they find, which gradients are there): the ``I`` trace's profile and what the two hold
    (:func:`~fsdpviz.schedule.pipeline_split.split_backward`)."""
    for t in tree_leaves((args, kw)):
        if isinstance(t, torch.Tensor):
            t.grad = None  # each microbatch's receive buffer: no gradient before its I
    split = SplitBackward()
    trace, _, _ = _trace_stage(s, part, opts, groups, args, kw, last, where, QUIET, True,
                               shared, (key, split), gpus_per_node)  # fmt: skip
    assert trace.profile is not None
    split.profile = trace.profile.iterations[0]
    return split


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


__all__ = ["Log", "StageTrace", "trace_stages"]
