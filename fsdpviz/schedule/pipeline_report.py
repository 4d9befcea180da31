"""The reports of a pipeline's plan: each pipeline rank's, and the whole job's over them.

A rank's report holds its stages' units and modules, its two steps' events (under
``grad_accum=N`` two optimizer steps of ``N`` ``step()`` calls each) as
:class:`~fsdpviz.schedule.pipeline_replay.RankRun` issues them, the profile the cost model
walks (:mod:`fsdpviz.schedule.pipeline_profile`) and the pipeline (schedule, stages,
actions); the job's report every stage's units, the model's modules, every rank's events
rank by rank, and the ranks' reports in ``pipeline.ranks``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.fsdp2_options import FSDP2Options
from fsdpviz.plan.fsdp2_shards import mark_unused
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.pipeline import PipelineOptions
from fsdpviz.schedule.fsdp2 import forward_order, group_placements, group_warnings
from fsdpviz.schedule.pipeline_profile import Call, StageShape, rank_step_profile
from fsdpviz.schedule.pipeline_replay import RankRun
from fsdpviz.schedule.pipeline_trace import StageTrace
from fsdpviz.schema.pipeline import Pipeline, Stage
from fsdpviz.schema.profile import TraceProfile
from fsdpviz.schema.report import FsdpWarning, ModuleInfo, Report
from fsdpviz.trace.modules import module_infos, param_first_use
from fsdpviz.trace.tracker import ModuleCalls


def rank_report(
    rank: int,
    popts: PipelineOptions,
    opts: FSDP2Options,
    traces: list[StageTrace],
    actions: list[str],
    warnings: list[FsdpWarning],
    modules: list[ModuleInfo],
) -> Report:
    run = RankRun(popts, traces, rank)
    # two optimizer steps of grad_accum micro-steps, one step() each: the first (its first
    # step() with the shape inference) and a steady one, as a report without pipelines
    # holds them (the steady one's micro-steps are what the cost models walk)
    accum = opts.job.grad_accum
    steps = [run.shape_inference() + run.step(actions, accum == 1)]
    steps += [run.step(actions, (k + 1) % accum == 0) for k in range(1, 2 * accum)]
    if run.gradless:
        warnings = [*warnings, _lost_gradients(popts.schedule, sorted(run.gradless))]
    mine = [traces[s] for s in run.stages]
    for t in mine:  # the parameters no microbatch gave a gradient: unused
        lost = {id(p) for g in t.groups if g.name in run.never_reduced for p in g.params}
        reached = t.reached - lost
        placements = t.opts.tp.placements(t.part) if t.opts.tp is not None else {}
        mark_unused(t.groups, t.opts, reached, placements)
    profile = _rank_profile(popts, mine, steps)
    failed = [(t.index, t.split.failed) for t in mine if t.split is not None and t.split.failed]
    if failed:
        warnings = [*warnings, _split_untraced(popts.schedule, *failed[0])]
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


def _lost_gradients(schedule: str, units: list[str]) -> FsdpWarning:
    """Zero-bubble schedules over groups resharded after forward (see
    ``RankRun.action``): torch computes no weight gradient for them in some microbatches."""
    return FsdpWarning(
        "pipeline_lost_gradients",
        f"{schedule} gives {', '.join(repr(u) for u in units)} no gradient in the microbatches "
        "whose input backward (I) starts while the unit is resharded after its forward: "
        "torch's stage_backward_input finds the stage's weights (submod.parameters()) before "
        "FSDP's pre-backward unshards them, so the weight backward (W) misses the sharded "
        "ones and those gradients are lost. Keep the parameters gathered across microbatches "
        f"({RESHARD.code(False)}, torchtitan's default under pipeline parallelism)",
        units,
        fix={RESHARD.name: False},
    )


def _split_untraced(schedule: str, stage: int, error: str) -> FsdpWarning:
    """A stage whose backward split as torch splits it could not be traced (see
    :mod:`fsdpviz.schedule.pipeline_split`): its ``I`` and ``W`` are counted as a whole
    backward."""
    return FsdpWarning(
        "pipeline_split_untraced",
        f"{schedule} splits each backward into an input backward (I) and a weight backward "
        f"(W), which fsdpviz could not trace on stage {stage} (torch's stage_backward_input, "
        f"then stage_backward_weight: {error}): its memory is counted as a whole backward's, "
        "without what I keeps until W, so this rank's peak may come out low",
        [],
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
    rank = popts.stage_ranks[mine[0].index]

    def _local(stage: int) -> bool:  # a stage on this rank, next to one of its own
        return 0 <= stage < popts.num_stages and popts.stage_ranks[stage] == rank

    shapes = {
        t.index: StageShape(
            len(t.forward), t.index == popts.num_stages - 1, t.output_bytes,
            frozenset(g.name for g in t.groups), t.loss_bytes,
            # a gradient passed to the previous stage on the same rank becomes its receive
            # buffer (set_local_bwd_input), sent nowhere
            t.input_bytes if t.inputs_need_grad and t.index > 0 and not _local(t.index - 1) else 0,
            _local(t.index + 1),
            t.split,
        )
        for t in mine
    }  # fmt: skip
    upcast = {  # the groups whose gradients FSDP2 keeps in another dtype between backwards
        g.name: _itemsize(g.schema.reduce_dtype) / _itemsize(g.schema.compute_dtype)
        for t in mine
        for g in t.groups
        if g.schema is not None
        and g.schema.reduce_dtype not in (None, g.schema.compute_dtype)
        and g.schema.compute_dtype
    }
    casts = {g.name: _cast_peak(g, upcast[g.name]) for t in mine for g in t.groups
             if g.name in upcast}  # fmt: skip
    m = popts.microbatches
    loop = popts.schedule if popts.single_stage else ""
    iterations = [
        rank_step_profile(calls, profiles, shapes, upcast, loop, m, casts)[0] for calls in steps
    ]
    inputs = 0
    for t in mine:
        assert t.profile is not None
        if t.index == 0:  # the batch: step() splits it into views of its storage
            inputs += t.profile.input_bytes
        else:
            inputs += t.input_bytes * m
        if t.index != popts.num_stages - 1 and t.outputs_need_grad:  # no buffer for none
            inputs += t.output_bytes * m
    first = mine[0].profile
    assert first is not None
    modules: dict[str, dict[str, float]] = {}
    for t in mine:
        assert t.profile is not None
        modules.update(t.profile.modules)
    # the first stage's profile with the rank's sums: what every stage's trace shares (its tp
    # degree, the kernels' tp) carries over, a field added later included
    return dataclasses.replace(
        first,
        iterations=iterations,
        modules=modules,
        input_bytes=inputs,
        buffer_bytes=sum(t.profile.buffer_bytes for t in mine if t.profile is not None),
        flop_ops=list(first.flop_ops),
        tokens=first.tokens * m,
    )


def _cast_peak(group: Group, ratio: float) -> int:
    """FSDP2's ``to_accumulated_grad_if_needed`` casts a group's gradients to the reduce
    dtype one parameter at a time, each one's compute-dtype gradient alive until its copy is
    made: the most that holds above the group's gradients all cast."""
    assert group.schema is not None
    size = _itemsize(group.schema.compute_dtype)
    most, after = 0, 0.0  # after: what the parameters cast later add
    for p in reversed([p for p in group.params if p.requires_grad]):
        most = max(most, int(p.numel() * size - after))
        after += p.numel() * size * (ratio - 1.0)
    return most


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
        nodes = [t.tp_strategy_gpus_per_node for t in traces if t.tp_strategy_gpus_per_node]
        if nodes:
            changes["tp_strategy_gpus_per_node"] = nodes[0]
    mesh = {"pp": popts.pp_size, **(base.mesh or {"dp_shard": opts.parallel_dims.dp_shard_cp})}
    return base.replace(
        world_size=math.prod(mesh.values()),
        shard_world_size=opts.parallel_dims.dp_shard_cp,
        mesh=mesh,
        pp_world_size=popts.pp_size,
        pipeline_schedule=popts.schedule,
        microbatches=popts.microbatches,
        **changes,
    )


def all_modules(copy: nn.Module, traces: list[StageTrace]) -> list[ModuleInfo]:
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


def job_report(
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
        iterations=[
            [e for r in ranks for e in r.iterations[i]] for i in range(len(ranks[0].iterations))
        ],
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


__all__ = ["all_modules", "job_report", "rank_report"]
