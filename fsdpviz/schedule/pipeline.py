"""``analyze`` under pipeline parallelism: FSDP2 in every stage of a
``torch.distributed.pipelining`` schedule, each pipeline rank's step as it runs.

Each stage (a copy of the model holding its modules, an FSDP root of its own, as torchtitan
builds it) is traced once, on one microbatch: its forward, then its backward from the
gradient of its output (the last stage: from the loss). FSDP2's hook calls of that trace are
then replayed through a fresh :class:`FSDP2Runtime` per stage, action by action, in each
pipeline rank's order (:mod:`fsdpviz.schedule.pipeline_order`), with what
``PipelineStage`` does around them:

- ``F``: the stage's forward hooks; ``B``: its backward hooks, after
  ``backward_maybe_with_nosync`` turned off gradient sync, resharding after backward and the
  last backward, so each microbatch's gradients accumulate unsharded and the parameters stay
  gathered; ``I`` / ``W`` (zero-bubble schedules): the backward hooks fire in ``I`` (to the
  stage's inputs), ``W`` adds the weight gradients (the first stage, which has no input
  gradient, runs its whole backward in ``W``);
- ``UNSHARD`` / ``RESHARD``: ``FSDPModule.unshard(async_op=True)`` / ``reshard()`` of every
  FSDP module of the stage (the compute waits for the unshard);
- ``REDUCE_GRAD``: ``perform_reduce_grad``: each group's post-backward with sync on (free,
  then reduce-scatter), then the root's final callback;
- ``SEND_*`` / ``RECV_*``: a ``pp_send`` / ``pp_recv`` event of the stage's output (forward)
  or its input's gradient (backward), one microbatch's bytes.

The first step starts with ``PipelineStage``'s shape inference: each stage of the rank runs
its forward (in stage order), each stage whose inputs require grad its backward to them
(``autograd.grad``: no parameter gradient; in reverse order), then every FSDP module of each
stage is resharded.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from fsdpviz._gc import answering
from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp2 import build_groups, check_reshard_ints, prefetch_indices
from fsdpviz.plan.fsdp2_applied import fsdp2_states
from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.fsdp2_options import FSDP2Options, parse_fsdp2_options
from fsdpviz.plan.pipeline import (
    PIPELINE_KEYS,
    PipelineOptions,
    parse_pipeline_options,
    split_module,
    split_pipeline_mesh,
)
from fsdpviz.plan.tensor_parallel import resolve_plan
from fsdpviz.schedule.fsdp2 import forward_order, group_placements, group_warnings
from fsdpviz.schedule.fsdp2_emulation import FSDP2Emulation
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime
from fsdpviz.schedule.pipeline_order import parse_action, rank_actions
from fsdpviz.schedule.pipeline_profile import Call, StageShape, rank_step_profile
from fsdpviz.schedule.tp_emulation import TPEmulation
from fsdpviz.schema.events import Event
from fsdpviz.schema.pipeline import Pipeline, Stage, stage_root
from fsdpviz.schema.profile import TraceProfile
from fsdpviz.schema.report import FsdpWarning, ModuleInfo, Report
from fsdpviz.trace.checkpointing import apply_checkpointing
from fsdpviz.trace.copy import inputs_copy, map_objects, model_copy
from fsdpviz.trace.modules import module_infos, param_first_use
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.progress import progress_bar
from fsdpviz.trace.tracker import ModuleCalls, ModuleTracker, run_step

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
    prefetch: tuple[dict[int, list[int]], dict[int, list[int]]] = field(default=({}, {}))
    profile: TraceProfile | None = None  # what the probe measured (one iteration)


def analyze_pipeline(model: nn.Module, inputs: Any, **kwargs: Any) -> Report:
    """Plan FSDP2 inside a pipeline-parallel schedule; see :mod:`fsdpviz.plan.pipeline`."""
    # the stages' traces and replays make many objects and no cycles to speak of: a cyclic
    # collection over the model copy's heap would cost more than the analysis itself
    with answering():
        return _analyze(model, inputs, **kwargs)


def _analyze(model: nn.Module, inputs: Any, **kwargs: Any) -> Report:
    profile = bool(kwargs.pop("profile", True))
    if fsdp2_states(model):
        raise ConfigError(
            "pipeline parallelism is planned from the model before fully_shard (each stage "
            "is sharded on its own, as torchtitan applies fully_shard to each model part); "
            "pass the unsharded model with fully_shard=[...]"
        )
    if "fully_shard" not in kwargs:
        raise ConfigError(
            "pipeline parallelism is planned with FSDP2, as torchtitan runs it: pass "
            "fully_shard=[...] (applied to each stage, its root last)"
        )
    pp, rest = split_pipeline_mesh(kwargs)
    pipe = {k: rest.pop(k) for k in list(rest) if k in PIPELINE_KEYS}
    opts = parse_fsdp2_options(rest)
    device = "real" if opts.trace == "real" else "meta"
    copy, mapping = model_copy(model, device)
    apply_checkpointing(copy, opts.activation_checkpointing)
    ignored = set(map_objects(opts.ignored_params, mapping, "ignored_params") or [])
    args, kw = inputs_copy(inputs, device)
    popts, warnings = parse_pipeline_options(copy, _batch(args, kw), pp, pipe)
    if not opts.torch.installed:
        warnings.append(_other_torch(opts.torch.name))
    actions = rank_actions(popts)
    args, kw = _first_microbatch(args, kw, popts.microbatches)
    traces = _trace_stages(copy, popts, opts, ignored, args, kw, device, profile)
    modules = _all_modules(copy, traces)
    ranks = [
        _rank_report(r, popts, opts, traces, actions[r], warnings, modules)
        for r in range(popts.pp_size)
    ]
    return _job_report(popts, opts, traces, actions, ranks, warnings, modules)


def _batch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim()]
    return int(tensors[0].shape[0]) if tensors else None


def _first_microbatch(
    args: tuple[Any, ...], kwargs: dict[str, Any], m: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The first of ``m`` microbatches, as ``PipelineSchedule.step`` splits the inputs (each
    tensor along dim 0, other values as they are)."""

    def first(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim():
            part = x.tensor_split(m, dim=0)[0].detach()
            return part.requires_grad_(x.requires_grad) if x.is_floating_point() else part
        if isinstance(x, (list, tuple)):
            return type(x)(first(v) for v in x)
        if isinstance(x, dict):
            return {k: first(v) for k, v in x.items()}
        return x

    return first(args), first(kwargs)


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
    from fsdpviz.plan.fsdp2 import resolve_targets

    resolve_targets(copy, spec)


def _trace_stages(
    copy: nn.Module,
    popts: PipelineOptions,
    opts: FSDP2Options,
    ignored: set[nn.Parameter],
    args: tuple[Any, ...],
    kw: dict[str, Any],
    device: str,
    profile: bool,
) -> list[StageTrace]:
    _check_targets(copy, opts.targets)
    where = "the meta device" if device == "meta" else "the model's device"
    traces: list[StageTrace] = []
    shared: list[torch.Tensor] = []  # received activations one tp rank holds a share of
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
            )
            if opts.parallelize_plan is not None:
                stage_opts.tp = resolve_plan(
                    part, _stage_plan(opts.parallelize_plan, modules), opts.tp_size, opts.tp_name
                )
            groups = _name_root(build_groups(part, stage_opts, ignored), s)
            check_reshard_ints(groups, stage_opts.shard_ranks)
            last = s == popts.num_stages - 1
            trace, output, shares = _trace_stage(
                s, part, stage_opts, groups, args, kw, last, where, bar, profile, shared
            )
            if s:
                trace.input_bytes = traces[-1].output_bytes  # what the previous stage sends
            traces.append(trace)
            # the next stage receives this stage's output tensors as its positional inputs
            outs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
            args = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in outs)
            shared = [a for a, share in zip(args, shares, strict=True) if share]
            kw = {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}
    return traces


def _stage_plan(plan: Any, modules: dict[str, nn.Module]) -> dict[str, Any]:
    """``parallelize_plan`` for one stage: the patterns that match a module it holds."""
    import fnmatch

    return {
        pattern: style
        for pattern, style in dict(plan).items()
        if any(fnmatch.fnmatch(name, pattern) for name in modules)
    }


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
    shared: list[torch.Tensor],
) -> tuple[StageTrace, Any, list[bool]]:
    emulation = FSDP2Emulation(groups, opts)
    runtime = emulation.runtime
    tp = TPEmulation(part, opts.tp, groups, runtime) if opts.tp is not None else None
    prefetch = (
        prefetch_indices(opts.forward_prefetch, groups, "forward_prefetch"),
        prefetch_indices(opts.backward_prefetch, groups, "backward_prefetch"),
    )
    runtime.set_prefetch(*prefetch)
    tracker = ModuleTracker(part, on_call=bar.tick)
    probe: CostProbe | None = None

    def forward_done(_: Any) -> None:  # the loss computed (or the output made): a mark
        runtime.log.append(("forward_end", 0, None))

    try:
        if profile:
            probe = _probe(part, groups, opts, tracker, tp)
            probe.inputs_shared(shared)
            probe.attach(runtime)
            if tp is not None:
                tp.measure(probe)
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
        )
    finally:
        tracker.remove()
        emulation.remove()
        if tp is not None:
            tp.remove()
        if probe is not None:
            probe.remove()
        for p in part.parameters():
            p.grad = None
    log = list(runtime.log)
    at = next(i for i, e in enumerate(log) if e[0] == "forward_end")
    received = [t for t in args if isinstance(t, torch.Tensor)]
    sent = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
    measured = probe.profile(log, [len(runtime.events)]) if probe is not None else None
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
        prefetch=prefetch,
        profile=measured,
    )
    shares = [probe is not None and probe.holds_share(t) for t in sent]
    return trace, output, shares


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _probe(
    part: nn.Module,
    groups: list[Group],
    opts: FSDP2Options,
    tracker: ModuleTracker,
    tp: TPEmulation | None,
) -> CostProbe:
    job = opts.job
    return CostProbe(
        tracker,
        {p: g.name for g in groups for p in g.params},
        [g.name for g in groups],
        list(part.buffers()),
        tp.shares() if tp is not None else None,
        compiled=job.compiled_modules(part),
        float8=job.float8_modules(part),
        float8_weights_gathered=bool(job.float8 and job.float8.enable_fsdp_float8_all_gather),
    )


# ------------------------------------------------------------------ replay
class _RankRun:
    """One pipeline rank's stages, each with its own FSDP2 runtime, run action by action;
    each step as its hook calls (:class:`~fsdpviz.schedule.pipeline_profile.Call`)."""

    def __init__(self, opts: PipelineOptions, traces: list[StageTrace], rank: int) -> None:
        self.opts = opts
        self.traces = traces
        self.stages = opts.stages_of(rank)
        self.runtimes: dict[int, FSDP2Runtime] = {}
        for s in self.stages:
            t = traces[s]
            rt = FSDP2Runtime(
                t.groups, t.opts.shard_ranks, t.opts.replicas, t.opts.offload, t.opts.torch
            )
            rt.set_prefetch(*t.prefetch)
            self.runtimes[s] = rt
        self.unshard_pending: set[int] = set()

    def _replay(self, s: int, log: Log, first: int, part: str, mb: int | None) -> list[Call]:
        """``log`` (the stage trace's hook calls from index ``first``) replayed, call by call."""
        rt = self.runtimes[s]
        calls: list[Call] = []
        for j, (name, i, arg) in enumerate(log):
            rt.replay([(name, i, arg)])
            unit = rt.states[i].group.name if i < len(rt.states) else ""
            calls.append(Call(name, unit, arg, rt.take_events(), s, first + j, mb, part))
        return calls

    def _mark(self, s: int, mb: int | None) -> Call:
        """The end of the stage's forward (the last stage: its loss), a mark of its trace."""
        k = len(self.traces[s].forward)
        return Call("pipeline", "", "forward_end", [], s, k, mb, "F")

    def shape_inference(self) -> list[Call]:
        """``PipelineStage``'s metadata inference in the first step (see the module doc)."""
        calls: list[Call] = []
        for s in self.stages:
            self.runtimes[s].tag = {"stage": s}
            calls += self._replay(s, self.traces[s].forward, 0, "F", None)
            calls.append(self._mark(s, None))
        for s in reversed(self.stages):
            t = self.traces[s]
            if t.inputs_need_grad:  # autograd.grad to the inputs: no parameter gradient
                calls += self._replay(s, _without_grads(t.backward), len(t.forward) + 1, "B", None)
        for s in self.stages:
            self.runtimes[s].reshard_all()
            calls.append(Call("pipeline", "", "RESHARD", self.runtimes[s].take_events(), s))
        return calls

    def step(self, actions: list[str]) -> list[Call]:
        calls: list[Call] = []
        for action in actions:
            for sub in parse_action(action):  # OVERLAP_F_B (DualPipeV): its actions in order
                calls += self.action(*sub)
        return calls

    def action(self, s: int, kind: str, mb: int | None, action: str) -> list[Call]:
        trace = self.traces[s]
        rt = self.runtimes[s]
        rt.tag = {"stage": s, "microbatch": mb, "action": action}
        if kind in ("F", "B", "I", "W") and s in self.unshard_pending:
            self.unshard_pending.discard(s)  # _assert_unsharded waits for the UNSHARD
            rt.wait_all()
        back = len(trace.forward) + 1  # the first backward hook call's mark
        # where the action's compute starts: it waits for what it receives
        start = Call("pipeline", "", action, [], s, None, mb)
        if kind == "F":
            return [start, *self._replay(s, trace.forward, 0, "F", mb), self._mark(s, mb)]
        if kind in ("B", "I", "W"):
            rt.sync = rt.reshard_after_backward = rt.is_last_backward = False
            if kind == "B" or (kind == "W" and s == 0):
                return [start, *self._replay(s, trace.backward, back, "B", mb)]
            if kind == "I" and s != 0:
                return [start, *self._replay(s, _without_grads(trace.backward), back, "I", mb)]
            if kind == "W":  # the weight gradients land outside FSDP's hooks
                for state in rt.states:
                    for g in state.groups:
                        g.accumulated = g.accumulated or _has_grads(trace.backward, g.name, rt)
                return [Call("pipeline", "", action, [], s, None, mb, "W")]
            return [Call("pipeline", "", action, [], s, None, mb)]  # the first stage's I
        if kind == "REDUCE_GRAD":
            rt.reduce_grad()
            return _reduce_calls(rt.take_events(), s)
        if kind == "UNSHARD":
            rt.unshard_all()
            self.unshard_pending.add(s)
        elif kind == "RESHARD":
            rt.reshard_all()
        else:  # SEND_F, RECV_F, SEND_B, RECV_B
            forward = kind.endswith("_F")
            nbytes = trace.output_bytes if forward == kind.startswith("SEND") else trace.input_bytes
            event = Event("pp_send" if kind.startswith("SEND") else "pp_recv", "",
                          "forward" if forward else "backward", group="pp", nbytes=nbytes,
                          stage=s, microbatch=mb, action=action)  # fmt: skip
            return [Call("pipeline", "", action, [event], s, None, mb)]
        return [Call("pipeline", "", action, rt.take_events(), s, None, mb)]


def _reduce_calls(events: list[Event], s: int) -> list[Call]:
    """``REDUCE_GRAD`` as FSDP runs it: each group's post-backward, the root's final callback."""
    calls: list[Call] = []
    for e in events:
        if not calls or calls[-1].unit != e.hook_unit:
            calls.append(Call("post_backward", e.hook_unit or e.unit, False, [], s, part="R"))
        calls[-1].events.append(e)
    return [*calls, Call("final_callback", stage_root(s), {}, [], s, part="R")]


def _name_root(groups: list[Group], s: int) -> list[Group]:
    """Stage ``s``'s root group (the model part's, FQN ``""``) named ``(root of stage s)``:
    every stage's root is the model's."""
    for g in groups:
        if g.is_root:
            g.name = stage_root(s)
            if g.schema is not None:
                g.schema = dataclasses.replace(g.schema, module=g.name)
    return groups


def _without_grads(log: Log) -> Log:
    """A backward's hook calls as ``autograd.grad`` to the inputs makes them: no parameter
    receives a gradient."""
    out: Log = []
    for name, i, flag in log:
        if name == "post_backward":
            flag = False
        elif name == "final_callback":
            flag = dict.fromkeys(flag, False)
        out.append((name, i, flag))
    return out


def _has_grads(log: Log, group: str, rt: FSDP2Runtime) -> bool:
    """Whether the stage's backward gives ``group``'s parameters gradients."""
    index = {st.group.name: i for i, st in enumerate(rt.states)}.get(group)
    for name, i, flag in log:
        if name == "post_backward" and i == index and flag:
            return True
        if name == "final_callback" and flag.get(index):
            return True
    return False


# ----------------------------------------------------------------- reports
def _rank_report(
    rank: int,
    popts: PipelineOptions,
    opts: FSDP2Options,
    traces: list[StageTrace],
    actions: list[str],
    warnings: list[FsdpWarning],
    modules: list[ModuleInfo],
) -> Report:
    run = _RankRun(popts, traces, rank)
    steps = [run.shape_inference() + run.step(actions), run.step(actions)]
    mine = [traces[s] for s in run.stages]
    profile = _rank_profile(popts, mine, steps)
    iterations = [[e for c in calls for e in c.events] for calls in steps]
    groups = [g for t in mine for g in t.groups]
    order: list[str] = []
    for t in mine:
        order += forward_order(t.forward, t.groups)
    config = _config(popts, mine, groups).replace(pp_rank=rank)
    return Report(
        source="prediction",
        config=config,
        units=[g.schema for g in groups if g.schema is not None and g.params],
        forward_order=order,
        iterations=iterations,
        warnings=_stage_warnings(mine) + list(warnings),
        modules=_rank_modules(modules, mine),
        module_order=[n for t in mine for n in t.tracker.order],
        module_backward_order=[n for t in reversed(mine) for n in t.tracker.backward_order],
        param_first_use={k: v for t in mine for k, v in _first_use(t).items()},
        pipeline=_pipeline(popts, traces, {rank: actions}),
        profile=profile,
    )


def _rank_profile(
    popts: PipelineOptions, mine: list[StageTrace], steps: list[list[Call]]
) -> TraceProfile | None:
    """The rank's steps as the cost model walks them, from its stages' traces (see
    :mod:`fsdpviz.schedule.pipeline_profile`); what it holds besides: the microbatches'
    inputs (the first stage: the batch; the others: a receive buffer per microbatch, and one
    for the gradient of the output, as ``PipelineStage`` allocates them), the stages'
    buffers, the tokens of a step."""
    if any(t.profile is None or not t.profile.iterations for t in mine):
        return None
    profiles = {t.index: t.profile.iterations[0] for t in mine if t.profile is not None}
    shapes = {
        t.index: StageShape(
            len(t.forward), t.index == popts.num_stages - 1, t.output_bytes,
            frozenset(g.name for g in t.groups),
        )
        for t in mine
    }  # fmt: skip
    upcast = {
        g.name: _itemsize(g.schema.reduce_dtype) / _itemsize(g.schema.compute_dtype)
        for t in mine
        for g in t.groups
        if g.schema is not None and g.schema.reduce_dtype and g.schema.compute_dtype
    }
    iterations = [rank_step_profile(calls, profiles, shapes, upcast)[0] for calls in steps]
    m = popts.microbatches
    inputs = 0
    for t in mine:
        assert t.profile is not None
        if t.index == 0:
            inputs += t.profile.input_bytes * m
        else:
            inputs += t.input_bytes * m
        if t.index != popts.num_stages - 1:
            inputs += t.output_bytes * m
    first = mine[0].profile
    assert first is not None
    modules: dict[str, dict[str, float]] = {}
    for t in mine:
        assert t.profile is not None
        modules.update(t.profile.modules)
    return TraceProfile(
        iterations=iterations,
        modules=modules,
        input_bytes=inputs,
        buffer_bytes=sum(t.profile.buffer_bytes for t in mine if t.profile is not None),
        flop_ops=list(first.flop_ops),
        tokens=first.tokens * m,
        tp_ranks=first.tp_ranks,
    )


def _itemsize(dtype: str | None) -> int:
    return getattr(torch, str(dtype)).itemsize if dtype else 4


def _config(popts: PipelineOptions, traces: list[StageTrace], groups: list[Group]) -> Any:
    """The plan's config: FSDP2's options (tensor parallelism's plan as it resolved on each
    of ``traces``' stages), the whole mesh, pp dimension first, and the pipeline's."""
    opts = traces[0].opts
    base = opts.describe(groups)
    changes: dict[str, Any] = {}
    if opts.tp is not None:  # every stage's modules' styles
        plan: dict[str, str] = {}
        for t in traces:
            plan.update(t.opts.tp.describe() if t.opts.tp is not None else {})
        changes["parallelize_plan"] = plan
    mesh = {"pp": popts.pp_size, **(base.mesh or {"dp_shard": opts.shard_ranks})}
    return base.replace(
        world_size=math.prod(mesh.values()),
        shard_world_size=opts.shard_ranks,
        mesh=mesh,
        pp_world_size=popts.pp_size,
        pipeline_schedule=popts.schedule,
        microbatches=popts.microbatches,
        **changes,
    )


def _all_modules(copy: nn.Module, traces: list[StageTrace]) -> list[ModuleInfo]:
    """The whole model's modules (each stage's part holds some of them): their units, and
    the calls and shapes their stage's trace saw (the root and the layers container: every
    stage's)."""
    groups = [g for t in traces for g in t.groups]
    unit_of = {f: g.name for g in groups for f in g.fqns if f}
    records: dict[str, ModuleCalls] = {}
    for t in traces:
        for name, rec in t.tracker.records.items():
            if name not in records:
                records[name] = ModuleCalls(rec.calls, rec.input_shapes, rec.output_shapes)
            else:
                records[name].calls += rec.calls
    placements = [p for p in group_placements(groups) if p.unit]  # roots: no parameters here
    return module_infos(copy, placements, unit_of, records)


def _rank_modules(modules: list[ModuleInfo], mine: list[StageTrace]) -> list[ModuleInfo]:
    """The modules of a rank's stages (and the model's root and containers above them)."""
    held = {name for t in mine for name in t.tracker.records}
    return [m for m in modules if m.fqn in held]


def _first_use(t: StageTrace) -> dict[str, str]:
    return param_first_use(group_placements(t.groups), t.tracker.order)


def _other_torch(name: str) -> FsdpWarning:
    """``torch_version=`` names another release: FSDP2 follows its rules, the pipeline the
    installed torch's (its schedules are what this process can run)."""
    return FsdpWarning(
        "pipeline_installed_torch",
        f"FSDP2 is planned as {name} runs it, the pipeline (each rank's actions, how a "
        f"stage calls FSDP2) as the installed torch {torch.__version__}'s "
        "torch.distributed.pipelining runs it: another release's schedules may differ",
        [],
    )


def _stage_warnings(traces: list[StageTrace]) -> list[FsdpWarning]:
    out: list[FsdpWarning] = []
    for t in traces:
        order = forward_order(t.forward, t.groups)
        for w in group_warnings(t.groups, order, t.view_outputs, t.opts, t.incomplete):
            if w not in out:
                out.append(w)
    return out


def _pipeline(
    popts: PipelineOptions, traces: list[StageTrace], actions: dict[int, list[str]]
) -> Pipeline[Report]:
    return Pipeline(
        schedule=popts.schedule,
        microbatches=popts.microbatches,
        pp_size=popts.pp_size,
        stages=[
            Stage(
                s, popts.stage_ranks[s], list(names), [g.name for g in traces[s].groups if g.params]
            )
            for s, names in enumerate(popts.stage_modules)
        ],
        actions=dict(actions),
    )


def _job_report(
    popts: PipelineOptions,
    opts: FSDP2Options,
    traces: list[StageTrace],
    actions: dict[int, list[str]],
    ranks: list[Report],
    warnings: list[FsdpWarning],
    modules: list[ModuleInfo],
) -> Report:
    """The whole job: every stage's units, the model's modules, each iteration's events of
    every pipeline rank (rank by rank), and each rank's own report in ``pipeline.ranks``."""
    groups = [g for t in traces for g in t.groups]
    pipeline = _pipeline(popts, traces, actions)
    pipeline.ranks = ranks
    seen: list[FsdpWarning] = []
    for r in ranks:
        seen += [w for w in r.warnings if w not in seen]
    job = Report(
        source="prediction",
        config=_config(popts, traces, groups),
        units=[u for r in _by_stage(ranks, popts) for u in r],
        forward_order=[u for t in traces for u in forward_order(t.forward, t.groups)],
        iterations=[[e for r in ranks for e in r.iterations[i]] for i in range(2)],
        warnings=seen,
        modules=modules,
        module_order=[n for t in traces for n in t.tracker.order],
        module_backward_order=[n for t in reversed(traces) for n in t.tracker.backward_order],
        param_first_use={k: v for t in traces for k, v in _first_use(t).items()},
        pipeline=pipeline,
    )
    for rank in ranks:
        assert rank.pipeline is not None
        rank.pipeline.job = job
    return job


def _by_stage(ranks: list[Report], popts: PipelineOptions) -> list[list[Any]]:
    """Each stage's units, in stage order (a rank's report holds its stages' units)."""
    stage_units: list[list[Any]] = []
    for s in range(popts.num_stages):
        rank = ranks[popts.stage_ranks[s]]
        assert rank.pipeline is not None
        names = set(rank.pipeline.stages[s].units)
        stage_units.append([u for u in rank.units if u.module in names])
    return stage_units


__all__ = ["analyze_pipeline"]
