"""The timeline view as plain, JSON-ready data: what the JS widget and the static figure draw.

Lanes come in groups: one group per rank of a recording, one per plan of a
comparison, one for a prediction. Each group has, top to bottom:

``CPU · hooks``
    FSDP's hook calls (``pre_forward``, ``post_backward``, ...) where the CPU runs
    them, one cell per event a call issues (a free is the hook's own work; a
    collective is issued here and runs on a stream, drawn as a flow to it).
``compute``
    the compute stream: for a prediction with a trace profile, the time model's
    stretches of compute, by the unit whose forward or backward they are, with the
    time they wait for communication (exposed) shaded, and after a step's last
    micro-step the optimizer step (and torchao's float8 scale precomputation around its
    all-reduce: ``Timeline.step_work``, the data's ``step_work``) in the optimizer's
    purple, up to the step's end; otherwise runs of events issued by the same unit's hooks.
stream lanes
    ``all-gather`` and ``reduce-scatter`` (``NO_SHARD``'s all-reduce too), and a lane
    per other kind of collective that occurs (``replicate all-reduce`` for hybrid
    sharding's all-reduce across shard groups, ``host-device copies`` for CPU offload's
    ``h2d`` and ``d2h``, ``float8 scales all-reduce`` for the all-reduce of
    ``precompute_float8_dynamic_scale_for_fsdp`` after the optimizer step;
    :data:`~fsdpviz.views.timeline_lanes.STREAM_LANES` maps an event's kind and group to
    its lane, :func:`~fsdpviz.views.timeline_lanes.stream_lane` an event).
``memory``
    bytes in use by category, stacked (:func:`fsdpviz.cost.memory_lane`), its peak
    marked: the same number, at the same event, as ``report.memory.peak``.

Time: a prediction with a trace profile is placed by the time model
(:func:`fsdpviz.cost.timeline` on ``machine``, iterations back to back): a hook
call at the time the CPU runs it (it issues its events then; the CPU runs ahead of the GPU),
a collective from its start to its end on its stream, the memory lane at the compute
stream's place when each hook ran. A recording is placed on
its recorded clock (``Event.t``: when the event was issued; ``duration``), ranks
aligned by the wall-clock time they started recording. Otherwise events are laid
out by index, one unit of x per event (the order is modelled, durations are not).

Steps are the events of every group in issue order (by the time their hook runs,
then group, then index): stepping through them never goes back in their hooks' time.
``stream_order`` lists the steps by the time they start on their own lane (a
collective on its stream, a free in its hook call), the other order a user may step
in. In either order the cursor stands where the event starts on its own lane.

Example::

    data = timeline_data(report, machine="auto")         # memory="auto": the memory model
    data["n_steps"], data["memory"][0]["peak"]["bytes"] == report.memory.peak["bytes"]

The work is done in the modules beside this one, one job each: ``timeline_lanes`` (the
kinds, hooks, stream lanes and clocks the columns index into), ``timeline_groups`` (the
groups of lanes), ``timeline_placement`` (each group's events on x), ``timeline_memory``
(the memory lane) and ``timeline_columns`` (the data, column by column).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fsdpviz.cost.hardware import Machine
from fsdpviz.schema.report import Report
from fsdpviz.views.timeline_columns import TimelineData, timeline_columns
from fsdpviz.views.timeline_groups import lane_groups
from fsdpviz.views.timeline_lanes import AUTO_ITERATION, FREE, MemoryOption

if TYPE_CHECKING:
    from fsdpviz.api.comparison import Comparison
    from fsdpviz.recording import RecordedRun

__all__ = ["cursor_x", "opening_iteration", "timeline_data"]


def opening_iteration(
    obj: Report | Sequence[Report] | RecordedRun | Comparison, iteration: int | str | None = "auto"
) -> int | None:
    """The iteration a view of ``obj`` opens on: ``iteration`` as given, or for ``"auto"``
    a recording's first iteration where its ranks diverge (each rank's event there marked),
    else the last one (-1, the steady state of a prediction)."""
    if iteration != AUTO_ITERATION:
        if iteration is not None and not isinstance(iteration, int):
            raise ValueError(
                f"iteration={iteration!r} is not valid; use an index (-1: the last), None "
                "(every iteration) or 'auto'"
            )
        return iteration
    from fsdpviz.recording import RecordedRun  # lazy: loads torch, which the views do without

    if isinstance(obj, RecordedRun):
        diverge = [m.iteration for m in obj.marks() if m.kind == "diverge"]
        if diverge:
            return min(diverge)
    return -1


def timeline_data(
    reports: Report | Sequence[Report] | RecordedRun | Comparison,
    iteration: int | None = -1,
    *,
    memory: MemoryOption = "auto",
    rank_names: Sequence[str] | None = None,
    machine: Machine | str | None = None,
) -> TimelineData:
    """Lanes of ``reports`` for ``iteration`` (``None``: every iteration, back to back).

    ``reports``: one report, one report per rank, a :class:`~fsdpviz.RecordedRun` (a
    group per rank on the recorded clock, the first event where ranks diverge marked
    on each) or a :class:`~fsdpviz.Comparison` (its two plans, units matched by their
    parameters, the first difference marked). ``machine`` (a
    :class:`~fsdpviz.cost.Machine`, a preset name, or ``"auto"``: each report's own, the
    machine it was planned for) times predictions that have a trace profile, and its
    device memory is the memory lane's capacity line; ``None`` lays events out by index.
    ``memory``: see :data:`~fsdpviz.views.timeline_lanes.MemoryOption`; for several
    groups it applies to the first, and a comparison gets the memory model of both plans
    with ``"auto"``.

    Keys: ``version`` (2), ``source``, ``units``, ``unit_numbers`` (what blocks are
    numbered: a unit's index in its report's units; a comparison's second plan takes
    the number of the unit it matches), ``colors``, ``kinds``, ``hooks``, ``timed``,
    ``clock`` (how x was found, in words: the unit of time is the axis'), ``groups``
    (``name``, ``summary``, ``exposed``: seconds of exposed communication by phase and
    ``step``, or ``None``; ``bottlenecks``: the waits of
    :meth:`~fsdpviz.schema.timeline.Timeline.bottlenecks`, most exposed first, each
    ``step``, ``unit``, ``kind``, ``phase``, ``exposed``, ``share``, ``tail``, ``cause``,
    ``reason``, or ``None`` untimed), ``lanes`` (``group``, ``kind``: ``cpu`` | ``compute`` |
    ``stream`` | ``memory``, ``name``), ``n_steps``, ``steps`` (columns: ``group``,
    ``kind``, ``unit``, ``phase`` 0 forward / 1 backward, ``prefetch``, ``hook`` (-1
    none), ``hook_unit`` (-1 none), ``iteration``, ``index`` (in its iteration),
    ``call``, ``slot`` (the event's place in its hook call), ``lane`` (a stream lane;
    a free's is its group's CPU lane), ``issue`` (x of its hook call), ``x0``, ``x1``
    (on its lane), ``bytes`` (sent by one rank, -1 unknown), ``exposed`` (seconds
    compute waited for it, -1 unknown), and where tensor parallelism's collectives
    occur ``module``: the module that issued each, into ``modules``, -1 none),
    ``stream_order``, ``calls`` (``group``,
    ``hook``, ``unit``, ``x``, ``n``: events it issued), ``compute`` (``group``,
    ``unit``, ``phase``, ``x0``, ``x1``, ``step``: the event it leads to, and as the time
    model has them ``flops``, ``flops_per_s`` achieved, ``peak_share`` of the GPU's peak;
    -1 where not modelled), ``waits``
    (``group``, ``x0``, ``x1``, ``step``: the collective waited for, ``phase``,
    ``tail``), ``memory`` (one entry per group with a memory lane: ``group``, ``lane``,
    ``categories``, ``colors``, ``x0``, ``x1``, ``bytes`` per category, ``total``,
    ``step``, ``where``, ``peak``: ``moment``, ``bytes``, ``step``, ``where``,
    ``dominant``, ``x``; ``capacity``: for a prediction's modelled lane, will it fit
    (``machine``, ``bytes``, ``overhead``, ``usable``, ``reserved``, ``peak``, ``needed``,
    ``headroom``, ``fits``, ``label``, ``text``: as ``report.memory``), else ``None``),
    ``marks`` (``step``, ``text``, ``kind``: ``"diverge"``, ``"stuck"`` or
    ``"difference"``), ``iteration_starts`` (x where
    each shown iteration begins, per group), and where a modelled group has compute after
    a step's last micro-step ``step_work`` (columns ``group``, ``name``: ``"optimizer"``,
    ``"float8_amax"`` or ``"float8_scales"``, ``x0``, ``x1``, ``bytes``, ``kernels``,
    ``text``: :class:`~fsdpviz.schema.rows.StepWork`, placed).
    """
    groups, source = lane_groups(reports, rank_names, memory)
    return timeline_columns(groups, source, iteration, machine)


def cursor_x(data: TimelineData, step: int) -> float:
    """Where the cursor of ``step`` stands: where its event starts on its own lane (a
    collective on its stream, a free in its hook's cell on the CPU lane), in either order."""
    s = data["steps"]
    return float(s["issue"][step] if s["kind"][step] == FREE else s["x0"][step])
