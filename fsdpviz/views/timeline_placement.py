"""Where a group's events stand on x: the time model's times, the recorded clock, or
their index.

A prediction with a trace profile is placed by the time model
(:func:`fsdpviz.cost.timeline`, iterations back to back); a recording on its recorded
clock (``Event.t``, ``duration``) shifted by its group's offset; anything else one unit of
x per event.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field, replace

from fsdpviz.cost.fit import machine_of
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.time import timeline
from fsdpviz.schema.events import Event
from fsdpviz.schema.report import Report
from fsdpviz.schema.rows import Bottleneck, Bubble, StepWork
from fsdpviz.views.timeline_groups import LaneGroup
from fsdpviz.views.timeline_lanes import (
    AUTO_MACHINE,
    MODELLED_CLOCK,
    RECORDED_CLOCK,
    UNTIMED_CLOCK,
)

__all__ = ["PlacedEvents", "place_events", "resolve_machine"]


@dataclass
class PlacedEvents:
    """One group's shown events placed on x, and its modelled compute, waits and calls."""

    events: list[tuple[int, int, Event]]  # (iteration, index in it, event)
    issue: list[float]
    x0: list[float]
    x1: list[float]
    bytes: list[float]
    exposed: list[float]
    compute: list[tuple[str, int, float, float, int]]  # owner, phase, x0, x1, event
    waits: list[tuple[float, float, int, str, bool]]  # x0, x1, event, phase, tail
    starts: list[float]  # x where each shown iteration begins
    ends: list[float]  # x where each shown iteration ends
    hook_x: dict[tuple[int, int], float]  # (iteration, hook call) -> x
    # modelled: where the compute stream is at each event's and hook call's issue (the
    # memory lane's x: a free takes effect there, in the stream's order)
    stream_x: list[float]
    hook_stream_x: dict[tuple[int, int], float]
    compute_x: dict[tuple[int, int], tuple[float, float]]  # (iteration, call) -> stretch
    totals: dict[str, float] | None
    clock: str
    timed: bool
    # modelled: per compute stretch (FLOPs, achieved FLOP/s, share of the GPU's peak); the
    # waits ranked by Timeline.bottlenecks, each with its event's index in ``events``
    compute_rates: list[tuple[float, float, float]] = field(default_factory=list)
    bottlenecks: list[tuple[int, Bottleneck]] = field(default_factory=list)
    machine: Machine | None = None
    # pipeline parallelism: per compute stretch, the action it is part of ("" none) and
    # its microbatch (-1 none)
    compute_actions: list[tuple[str, int]] = field(default_factory=list)
    # modelled: the compute after a step's last micro-step (Timeline.step_work), placed
    step_work: list[StepWork] = field(default_factory=list)


def place_events(
    g: LaneGroup, iteration: int | None, machine: Machine | str | None
) -> PlacedEvents:
    report = g.report
    its = report.iteration_indices(iteration)
    events = [(i, k, e) for i in its for k, e in enumerate(report.iterations[i])]
    if machine is not None and report.source == "prediction" and report.profile is not None:
        return _modelled(report, its, events, resolve_machine(machine, report))
    times = [e.t for _, _, e in events]
    if events and all(isinstance(t, int | float) for t in times):
        return _recorded(events, g.offset)
    return _by_index(report, its, events)


def resolve_machine(machine: Machine | str, report: Report) -> Machine:
    """The machine that times ``report``: ``"auto"`` is the one it was planned for
    (:func:`fsdpviz.cost.fit.machine_of`), a name a preset."""
    if isinstance(machine, Machine):
        return machine
    if machine == AUTO_MACHINE:
        return machine_of(report)
    return make_machine(machine)


def _own_machine(report: Report, machine: Machine | str) -> bool:
    """Whether ``machine`` is the one ``report`` was planned for (``report.timeline``'s)."""
    try:
        asked = machine if isinstance(machine, Machine) else make_machine(machine)
    except ValueError:
        return False
    return asked == machine_of(report)


def _modelled(
    report: Report, its: list[int], events: list[tuple[int, int, Event]], machine: Machine | str
) -> PlacedEvents:
    p = PlacedEvents(events, [], [], [], [], [], [], [], [], [], {}, [], {}, {}, None, "", True)
    p.machine = machine if isinstance(machine, Machine) else None
    offset = 0.0
    totals = {"forward": 0.0, "backward": 0.0, "total": 0.0, "step": 0.0}
    name = machine if isinstance(machine, str) else machine.name
    # the report's own timeline where it was computed already (report.timeline, e.g. for
    # its card) and is the one asked (read, not computed: a view adds nothing to a report)
    last = len(report.iterations) - 1
    own = vars(report).get("timeline") if last in its else None
    own = own if own is not None and _own_machine(report, machine) else None
    for it in its:
        tl = own if own is not None and it == last else timeline(report, machine, iteration=it)
        name = str(tl.machine.get("name", name))
        placed = sorted(tl.events, key=lambda r: r.index)
        if len(placed) != len(report.iterations[it]):
            raise ValueError(f"the time model placed {len(placed)} of the events of iteration {it}")
        first = len(p.x0)
        p.starts.append(offset)
        p.issue += [offset + float(r.issued) for r in placed]
        p.stream_x += [offset + float(r.compute_t) for r in placed]
        p.x0 += [offset + float(r.start) for r in placed]
        p.x1 += [offset + float(r.end) for r in placed]
        p.bytes += [float(r.bytes) for r in placed]
        # what the compute waited for it: exposed communication, or (a receive) a bubble
        p.exposed += [float(r.exposed) + float(r.bubble or 0.0) for r in placed]
        for c in tl.compute:
            x0, x1 = offset + float(c.start), offset + float(c.end)
            p.compute.append(
                (c.owner, 0 if c.phase == "forward" else 1, x0, x1, first + c.next_event)
            )
            p.compute_rates.append((float(c.flops), float(c.flops_per_s), float(c.peak_share)))
            p.compute_actions.append((c.action or "", -1 if c.microbatch is None else c.microbatch))
            p.compute_x[(it, c.index)] = (x0, x1)
        for k, h in enumerate(tl.hooks):
            p.hook_x[(it, k)] = offset + float(h.t)
            p.hook_stream_x[(it, k)] = offset + float(h.compute_t)
        p.hook_x[(it, len(tl.hooks))] = offset + float(tl.totals["step_s"])
        p.hook_stream_x[(it, len(tl.hooks))] = offset + float(tl.totals["step_s"])
        p.step_work += [
            replace(w, start=offset + w.start, end=offset + w.end) for w in tl.step_work
        ]
        for w in tl.waits:
            p.waits.append(
                (offset + float(w.start), offset + float(w.end), first + w.event, w.phase, w.tail)
            )
        rows = [(first + b.event, b) for b in tl.bottleneck_records()]
        bubbles = [(first + b.event, _bubble_row(b)) for b in tl.bubble_records()]
        if bubbles:
            # one table of waits: each row's share of all the compute waited (for
            # communication and for the other pipeline ranks), not of two different totals
            waited = sum(float(b.exposed_s) for _, b in rows + bubbles)
            rows = [(k, replace(b, share=float(b.exposed_s) / waited)) for k, b in rows]
            bubbles = [(k, replace(b, share=float(b.exposed_s) / waited)) for k, b in bubbles]
        p.bottlenecks += rows + bubbles
        t = tl.totals
        totals["forward"] += t["exposed_forward_s"]
        totals["backward"] += t["exposed_backward_s"]
        totals["total"] += t["exposed_comm_s"]
        totals["step"] += t["step_s"]
        offset += t["step_s"]
        p.ends.append(offset)
    p.totals = totals
    p.clock = MODELLED_CLOCK.format(machine=name)
    return p


def _bubble_row(b: Bubble) -> Bottleneck:
    """A wait for another pipeline rank as a row of the bottleneck table (its share set
    with the other rows'): the receive waited for, all of its wait exposed."""
    phase = "forward" if b.what == "activations" else "backward"
    return Bottleneck(
        "", "pp_recv", phase, b.waited_s, 0.0, "bubble", b.reason, b.event, None, None,
        False, 0.0, 0.0, 0.0, b.waited_s, None, 0.0,
    )  # fmt: skip


def _recorded(events: list[tuple[int, int, Event]], offset: float) -> PlacedEvents:
    ts = [offset + float(e.t) for _, _, e in events]  # type: ignore[arg-type]
    gaps = [b - a for a, b in itertools.pairwise(ts) if b > a]
    last = statistics.median(gaps) if gaps else 1e-6
    ends = [*ts[1:], ts[-1] + last]
    for i, (_, _, e) in enumerate(events):
        if isinstance(e.duration, int | float) and e.duration > 0:
            ends[i] = ts[i] + float(e.duration)
    x1 = [max(b, a) for a, b in zip(ts, ends, strict=True)]
    starts, stops = [], []
    for i, (it, _, _) in enumerate(events):
        if i == 0 or events[i - 1][0] != it:
            starts.append(ts[i])
            if i:
                stops.append(x1[i - 1])
    stops.append(x1[-1])
    n = len(events)
    return PlacedEvents(
        events, ts, ts, x1, [-1.0] * n, [-1.0] * n, [], [], starts, stops, {}, ts, {}, {},
        None, RECORDED_CLOCK, True,
    )  # fmt: skip


def _by_index(report: Report, its: list[int], events: list[tuple[int, int, Event]]) -> PlacedEvents:
    n = len(events)
    xs = [float(i) for i in range(n)]
    starts, stops, at = [], [], 0
    for it in its:
        starts.append(float(at))
        at += len(report.iterations[it])
        stops.append(float(at))
    return PlacedEvents(
        events, xs, xs, [x + 1 for x in xs], [-1.0] * n, [-1.0] * n, [], [], starts, stops,
        {}, xs, {}, {}, None, UNTIMED_CLOCK, False,
    )  # fmt: skip
