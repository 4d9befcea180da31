"""Each pipeline rank's actions of one step, in the order torch's runtime runs them.

Multi-stage schedules (``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``,
``ZBVZeroBubble``, ``DualPipeV``) run the action list torch lowers their plan to
(``_PipelineScheduleRuntime._prepare_schedule_with_comms``: ``UNSHARD`` / ``RESHARD`` of
FSDP's stages, ``REDUCE_GRAD`` after a stage's last backward, the sends and receives): the
schedule class itself computes it here, on stand-in stages (as torch's
``_schedule_visualizer`` does), so torch's own checks raise as they would at launch.

``GPipe`` and ``1F1B`` do not run a plan: their ``_step_microbatches`` loops call the stage
directly (``Schedule1F1B._get_pipeline_order`` numbers the last rank's forwards from 1; the
loop does not). :func:`single_stage_actions` writes what those loops do, sends and receives
where they fire them (1F1B fuses a forward's send with the next backward's receive).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from fsdpviz.errors import FSDPConfigError
from fsdpviz.plan.pipeline import PipelineOptions


def rank_actions(opts: PipelineOptions) -> dict[int, list[str]]:
    """Pipeline rank -> its actions of one step, as torch writes them (``0F1``, ``1B0``,
    ``0UNSHARD``, ``0REDUCE_GRAD``, ``0SEND_F1``, ...)."""
    if opts.single_stage:
        return {r: single_stage_actions(opts, r) for r in range(opts.pp_size)}
    schedule = _build(opts)
    return {r: [str(a) for a in schedule.pipeline_order_with_comms[r]] for r in range(opts.pp_size)}


def _build(opts: PipelineOptions) -> Any:
    """The schedule, made by its own class on stand-in stages of rank 0 (its plan covers
    every rank); what torch raises for these stages and microbatches, as an FSDPConfigError."""
    # lazy: pipelining is slow to import
    from torch.distributed.pipelining.stage import PipelineStage

    per_rank = opts.num_stages // opts.pp_size
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank = 0
    stage.group_size = opts.pp_size
    stage.num_stages = opts.num_stages
    stage.submod = None
    try:
        return opts.schedule_class([stage] * per_rank, opts.microbatches)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise FSDPConfigError(
            f"torch's {opts.schedule} refuses {opts.microbatches} microbatches on "
            f"{opts.num_stages} stages over {opts.pp_size} ranks: {e}"
        ) from None


def single_stage_actions(opts: PipelineOptions, rank: int) -> list[str]:
    """What ``ScheduleGPipe`` / ``Schedule1F1B._step_microbatches`` run on ``rank``."""
    s = rank  # one stage per rank, in a loop
    first, last = s == 0, s == opts.num_stages - 1
    m = opts.microbatches
    if opts.schedule == "1F1B" and m < opts.num_stages:
        raise FSDPConfigError(
            f"torch's 1F1B refuses {m} microbatches on {opts.num_stages} stages: Number of "
            f"microbatches ({m}) must be greater than or equal to the number of stages "
            f"({opts.num_stages})"
        )

    def recv_f(i: int) -> list[str]:
        return [] if first else [f"{s}RECV_F{i}"]

    def send_f(i: int) -> list[str]:
        return [] if last else [f"{s}SEND_F{i}"]

    def recv_b(i: int) -> list[str]:
        return [] if last else [f"{s}RECV_B{i}"]

    def send_b(i: int) -> list[str]:
        return [] if first else [f"{s}SEND_B{i}"]

    out: list[str] = []
    if opts.schedule == "GPipe":
        for i in range(m):
            out += [*recv_f(i), f"{s}F{i}", *send_f(i)]
        for i in range(m):
            out += [*recv_b(i), f"{s}B{i}", *send_b(i)]
        return [*out, f"{s}REDUCE_GRAD"]
    # 1F1B: warm-up forwards, then one backward and one forward, then the cool-down
    warmup = min(m, opts.num_stages - s)
    fwd = bwd = 0
    for _ in range(warmup):
        out += [*recv_f(fwd), f"{s}F{fwd}"]
        if fwd != warmup - 1:
            out += send_f(fwd)
        fwd += 1
    sends = send_f(fwd - 1)  # the last warm-up send goes with the first backward's receive
    while True:
        out += [*sends, *recv_b(bwd), f"{s}B{bwd}"]
        sends = send_b(bwd)
        bwd += 1
        if fwd == m:
            break
        out += [*sends, *recv_f(fwd), f"{s}F{fwd}"]
        sends = send_f(fwd)
        fwd += 1
    out += sends
    while bwd < m:
        out += [*recv_b(bwd), f"{s}B{bwd}", *send_b(bwd)]
        bwd += 1
    return [*out, f"{s}REDUCE_GRAD"]


def parse_action(action: str) -> list[tuple[int, str, int | None, str]]:
    """The actions ``action`` runs, as ``(stage, kind, microbatch, name)``: ``"2B1"`` ->
    ``[(2, "B", 1, "2B1")]``; ``"0REDUCE_GRAD"`` -> ``[(0, "REDUCE_GRAD", None,
    "0REDUCE_GRAD")]``; DualPipeV's ``"(0F1;3B0)OVERLAP_F_B"`` -> its two, in order."""
    from torch.distributed.pipelining.schedules import _Action  # lazy: pipelining is slow to import

    a = _Action.from_str(action)
    subs = a.sub_actions if a.sub_actions is not None else (a,)
    return [(b.stage_index, b.computation_type.value, b.microbatch_index, str(b)) for b in subs]
