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
    time they wait for communication (exposed) shaded; otherwise runs of events issued
    by the same unit's hooks.
stream lanes
    ``all-gather`` and ``reduce-scatter`` (``NO_SHARD``'s all-reduce too), and a lane
    per other kind of collective that occurs (``replicate all-reduce`` for hybrid
    sharding's all-reduce across shard groups, ``host-device copies`` for CPU offload's
    ``h2d`` and ``d2h``; :data:`STREAM_LANES` maps an event's kind and group to its lane).
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
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from fsdpviz.cost.fit import machine_of, modelled_memory
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.memory import MemoryLane, memory_lane
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.pipeline import stage_root
from fsdpviz.schema.report import Event, Report, unit_label
from fsdpviz.views.style import CATEGORY_COLORS, UNMANAGED_COLOR, unit_colors

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun
    from fsdpviz.schedule.comparison import Comparison

__all__ = [
    "AUTO_ITERATION",
    "AUTO_MACHINE",
    "FREE",
    "HOOKS",
    "KINDS",
    "PP_KINDS",
    "STREAM_LANES",
    "MemoryOption",
    "MemorySeries",
    "MemorySource",
    "auto_memory",
    "cursor_x",
    "opening_iteration",
    "resolve_machine",
    "resolve_memory",
    "timeline_data",
]

MemorySeries = Sequence[float]
"""Bytes in use after each event of the first group, one float per event."""
MemorySource = MemorySeries | Callable[[Report], MemorySeries] | None
"""A series, or a memory model called with the report (re-run after each re-plan)."""
MemoryOption = Literal["auto"] | MemoryLane | MemorySeries | Callable[[Report], Any] | None
"""``"auto"`` (:func:`fsdpviz.cost.memory_lane`, AdamW, as ``report.memory``), a
:class:`~fsdpviz.cost.MemoryLane`, bytes after each event, a callable ``report ->`` either,
or ``None`` (no memory lane)."""

KINDS = (
    "all_gather", "free", "reduce_scatter", "all_reduce", "h2d", "d2h",
    "tp_all_gather", "tp_reduce_scatter", "tp_all_reduce", "tp_all_to_all",
    "cp_all_gather", "cp_all_to_all",
)  # fmt: skip
PP_KINDS = ("pp_send", "pp_recv")
"""Pipeline parallelism's sends and receives: after :data:`KINDS` where they occur."""
FREE = KINDS.index("free")
HOOKS = ("pre_forward", "post_forward", "pre_backward", "post_backward", "final_callback")
STREAM_LANES: dict[tuple[str, str | None], str] = {
    ("all_gather", None): "all-gather",
    ("reduce_scatter", None): "reduce-scatter",
    ("all_reduce", None): "reduce-scatter",
    ("all_reduce", "replicate"): "replicate all-reduce",
    ("h2d", None): "host-device copies",
    ("d2h", None): "host-device copies",
    ("tp_all_gather", "tp"): "tensor parallel",
    ("tp_reduce_scatter", "tp"): "tensor parallel",
    ("tp_all_reduce", "tp"): "tensor parallel",
    ("tp_all_to_all", "tp"): "tensor parallel",
    ("pp_send", "pp"): "pipeline sends",
    ("pp_recv", "pp"): "pipeline receives",
    ("cp_all_gather", "cp"): "context parallel",
    ("cp_all_to_all", "cp"): "context parallel",
}
"""The stream lane of a collective, by ``(kind, group)``. ``all-gather`` and
``reduce-scatter`` are always drawn; other lanes only where their events occur."""
_ALWAYS = ("all-gather", "reduce-scatter")
UNTIMED_CLOCK = "event index: the order of the events, not their durations"
RECORDED_CLOCK = "recorded"
MODELLED_CLOCK = "modelled on {machine} by fsdpviz.cost.timeline"
AUTO_ITERATION = "auto"
"""``iteration="auto"``: a recording's first divergent iteration, else the last
(:func:`opening_iteration`)."""
AUTO_MACHINE = "auto"
"""``machine="auto"``: each report on the machine it was planned for (``analyze(...,
machine=...)``, else the H100 preset), as ``report.memory`` and ``report.timeline``."""


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
    from fsdpviz.recording import RecordedRun

    if isinstance(obj, RecordedRun):
        diverge = [m.iteration for m in obj.marks() if m.kind == "diverge"]
        if diverge:
            return min(diverge)
    return -1


def resolve_memory(source: MemorySource, report: Report) -> list[float] | None:
    """The memory series for ``report``: ``source`` itself, or ``source(report)``."""
    if source is None:
        return None
    series = source(report) if callable(source) else source
    return [float(v) for v in series]


@dataclass
class _Group:
    """One group of lanes: a report, how its units map to the data's units, its clock."""

    name: str
    report: Report
    units: dict[str, int]
    offset: float = 0.0
    memory: MemoryOption = None
    # iteration, index, text, kind ("diverge", "stuck", "difference")
    marks: list[tuple[int, int, str, str]] = field(default_factory=list)
    palette: Report | None = None  # whose units' colours (a pipeline's: the job's)


def timeline_data(
    reports: Report | Sequence[Report] | RecordedRun | Comparison,
    iteration: int | None = -1,
    *,
    memory: MemoryOption = "auto",
    rank_names: Sequence[str] | None = None,
    machine: Machine | str | None = None,
) -> dict[str, Any]:
    """Lanes of ``reports`` for ``iteration`` (``None``: every iteration, back to back).

    ``reports``: one report, one report per rank, a :class:`~fsdpviz.RecordedRun` (a
    group per rank on the recorded clock, the first event where ranks diverge marked
    on each) or a :class:`~fsdpviz.Comparison` (its two plans, units matched by their
    parameters, the first difference marked). ``machine`` (a
    :class:`~fsdpviz.cost.Machine`, a preset name, or ``"auto"``: each report's own, the
    machine it was planned for) times predictions that have a trace profile, and its
    device memory is the memory lane's capacity line; ``None`` lays events out by index.
    ``memory``: see :data:`MemoryOption`; for several groups it applies to the
    first, and a comparison gets the memory model of both plans with ``"auto"``.

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
    each shown iteration begins, per group).
    """
    groups, source = _groups(reports, rank_names, memory)
    return _build(groups, source, iteration, machine)


def _groups(
    obj: Report | Sequence[Report] | RecordedRun | Comparison,
    rank_names: Sequence[str] | None,
    memory: MemoryOption,
) -> tuple[list[_Group], str]:
    from fsdpviz.recording import RecordedRun
    from fsdpviz.schedule.comparison import Comparison

    if isinstance(obj, Comparison):
        return _comparison_groups(obj, memory), "comparison"
    if isinstance(obj, RecordedRun):
        return _run_groups(obj, rank_names, memory), "recording"
    ranks = [obj] if isinstance(obj, Report) else list(obj)
    if not ranks:
        raise ValueError("timeline_data needs at least one report")
    job = ranks[0]
    if len(ranks) == 1 and isinstance(job, Report) and job.pipeline and job.pipeline.ranks:
        return _pipeline_groups(job, rank_names, memory), job.source
    for r in ranks:
        if not isinstance(r, Report):
            raise TypeError(
                f"timeline_data takes reports, a RecordedRun or a Comparison, not "
                f"{type(r).__name__}"
            )
    names = list(rank_names) if rank_names is not None else _rank_names(ranks)
    if len(names) != len(ranks):
        raise ValueError(f"{len(names)} rank names for {len(ranks)} reports")
    units: dict[str, int] = {}
    for r in ranks:
        for u in r.units:
            units.setdefault(u.module, len(units))
    groups = [
        _Group(name, r, units, memory=memory if g == 0 else None)
        for g, (name, r) in enumerate(zip(names, ranks, strict=True))
    ]
    return groups, ranks[0].source


def _pipeline_groups(
    job: Report, rank_names: Sequence[str] | None, memory: MemoryOption
) -> list[_Group]:
    """A pipeline's report: a group of lanes per pipeline rank, each with its memory lane
    (each rank holds its own stages); the sends and receives name the stage's root."""
    assert job.pipeline is not None
    ranks = job.pipeline.ranks
    names = list(rank_names) if rank_names is not None else [
        f"pp rank {r.config.pp_rank} · stage"
        + ("s " if len(job.pipeline.stages_of(int(r.config.pp_rank or 0))) > 1 else " ")
        + ", ".join(str(st.index) for st in job.pipeline.stages_of(int(r.config.pp_rank or 0)))
        for r in ranks
    ]  # fmt: skip
    if len(names) != len(ranks):
        raise ValueError(f"{len(names)} rank names for {len(ranks)} pipeline ranks")
    units = {u.module: k for k, u in enumerate(job.units)}
    for st in job.pipeline.stages:  # the stages' roots (their hooks, where they compute)
        units.setdefault(stage_root(st.index), len(units))
    units.setdefault("", len(units))  # what sends and receives
    return [
        _Group(name, r, units, memory=memory, palette=job)
        for name, r in zip(names, ranks, strict=True)
    ]


def _rank_names(ranks: list[Report]) -> list[str]:
    if len(ranks) == 1 and ranks[0].source == "prediction":
        return ["prediction"]
    return [
        f"rank {r.config.rank if r.config.rank is not None else i}" for i, r in enumerate(ranks)
    ]


def _run_groups(
    run: RecordedRun, rank_names: Sequence[str] | None, memory: MemoryOption
) -> list[_Group]:
    if not run.ranks:
        raise ValueError("the recorded run has no ranks: nothing to draw")
    names = list(rank_names) if rank_names is not None else _rank_names(run.ranks)
    starts = [r.config.started_unix for r in run.ranks]
    known = [float(s) for s in starts if isinstance(s, int | float)]
    origin = min(known) if len(known) == len(starts) else None
    units: dict[str, int] = {}
    for r in run.ranks:
        for u in r.units:
            units.setdefault(u.module, len(units))
    run_marks = run.marks()
    groups = []
    for g, r in enumerate(run.ranks):
        offset = float(starts[g]) - origin if origin is not None else 0.0  # type: ignore[arg-type]
        rank = r.config.rank if r.config.rank is not None else g
        marks: list[tuple[int, int, str, str]] = [
            (m.iteration, m.index, m.text, m.kind) for m in run_marks if m.rank == rank
        ]
        groups.append(_Group(names[g], r, units, offset, memory if g == 0 else None, marks))
    return groups


def _comparison_groups(cmp: Comparison, memory: MemoryOption) -> list[_Group]:
    if cmp.reports is None:
        raise ValueError("this comparison was read back without its plans; compare() again")
    a, b = cmp.reports
    units: dict[str, int] = {}
    for u in a.units:
        units.setdefault(u.module, len(units))
    units_b: dict[str, int] = {}
    b_index = {u.module: i for i, u in enumerate(b.units)}
    for u in b.units:
        units_b[u.module] = len(units) + b_index[u.module]
    first = _first_difference(cmp, a, b)
    text = f"first difference between {cmp.name_a} and {cmp.name_b}"
    marks_a = [] if first is None else [(len(a.iterations) - 1, first, text, "difference")]
    marks_b = [] if first is None else [(len(b.iterations) - 1, first, text, "difference")]
    mem_b = memory if memory == "auto" else None
    return [
        _Group(cmp.name_a, a, units, memory=memory, marks=marks_a),
        _Group(cmp.name_b, b, units_b, memory=mem_b, marks=marks_b),
    ]


def _first_difference(cmp: Comparison, a: Report, b: Report) -> int | None:
    """Index of the first steady-state event where the plans differ (units matched)."""
    to_a = {p.b: p.a for p in cmp.pairs if p.a is not None and p.b is not None}
    ea = a.iterations[-1] if a.iterations else []
    eb = b.iterations[-1] if b.iterations else []
    for i, (x, y) in enumerate(zip(ea, eb, strict=False)):
        same = (
            x.kind == y.kind
            and x.phase == y.phase
            and x.prefetch == y.prefetch
            and to_a.get(y.unit, "\0") == x.unit
        )
        if not same:
            return i
    return None if len(ea) == len(eb) else min(len(ea), len(eb))


# ---------------------------------------------------------------------------- placing


@dataclass
class _Placed:
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
    bottlenecks: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    machine: Machine | None = None
    # pipeline parallelism: per compute stretch, the action it is part of ("" none) and
    # its microbatch (-1 none)
    compute_actions: list[tuple[str, int]] = field(default_factory=list)


def _place(g: _Group, iteration: int | None, machine: Machine | str | None) -> _Placed:
    report = g.report
    its = report.iteration_indices(iteration)
    events = [(i, k, e) for i in its for k, e in enumerate(report.iterations[i])]
    if machine is not None and report.source == "prediction" and report.profile is not None:
        return _modelled(report, its, events, resolve_machine(machine, report))
    times = [e.t for _, _, e in events]
    if events and all(isinstance(t, int | float) for t in times):
        return _recorded(events, g.offset)
    return _by_index(report, its, events)


def _own_machine(report: Report, machine: Machine | str) -> bool:
    """Whether ``machine`` is the one ``report`` was planned for (``report.timeline``'s)."""
    from fsdpviz.cost.fit import machine_of
    from fsdpviz.cost.hardware import machine as preset

    try:
        asked = machine if isinstance(machine, Machine) else preset(machine)
    except ValueError:
        return False
    return asked == machine_of(report)


def _modelled(
    report: Report, its: list[int], events: list[tuple[int, int, Event]], machine: Machine | str
) -> _Placed:
    from fsdpviz.cost.time import timeline

    p = _Placed(events, [], [], [], [], [], [], [], [], [], {}, [], {}, {}, None, "", True)
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
        placed = sorted(tl.events, key=lambda r: int(r["index"]))
        if len(placed) != len(report.iterations[it]):
            raise ValueError(f"the time model placed {len(placed)} of the events of iteration {it}")
        first = len(p.x0)
        p.starts.append(offset)
        p.issue += [offset + float(r["issued"]) for r in placed]
        p.stream_x += [offset + float(r["compute_t"]) for r in placed]
        p.x0 += [offset + float(r["start"]) for r in placed]
        p.x1 += [offset + float(r["end"]) for r in placed]
        p.bytes += [float(r["bytes"]) for r in placed]
        # what the compute waited for it: exposed communication, or (a receive) a bubble
        p.exposed += [float(r["exposed"]) + float(r.get("bubble", 0.0)) for r in placed]
        for c in tl.compute:
            x0, x1 = offset + float(c["start"]), offset + float(c["end"])
            p.compute.append(
                (str(c["owner"]), 0 if c["phase"] == "forward" else 1, x0, x1,
                 first + int(c["next_event"]))
            )  # fmt: skip
            p.compute_rates.append(
                (float(c.get("flops", 0.0)), float(c.get("flops_per_s", 0.0)),
                 float(c.get("peak_share", 0.0)))
            )  # fmt: skip
            p.compute_actions.append((str(c.get("action", "")), int(c.get("microbatch", -1))))
            p.compute_x[(it, int(c["index"]))] = (x0, x1)
        for k, h in enumerate(tl.hooks):
            p.hook_x[(it, k)] = offset + float(h["t"])
            p.hook_stream_x[(it, k)] = offset + float(h["compute_t"])
        p.hook_x[(it, len(tl.hooks))] = offset + float(tl.totals["step_s"])
        p.hook_stream_x[(it, len(tl.hooks))] = offset + float(tl.totals["step_s"])
        for w in tl.waits:
            p.waits.append(
                (offset + float(w["start"]), offset + float(w["end"]), first + int(w["event"]),
                 str(w["phase"]), bool(w["tail"]))
            )  # fmt: skip
        rows = [(first + int(b["event"]), b) for b in tl.bottlenecks()]
        bubbles = [(first + int(b["event"]), _bubble_row(b)) for b in tl.bubbles()]
        if bubbles:
            # one table of waits: each row's share of all the compute waited (for
            # communication and for the other pipeline ranks), not of two different totals
            waited = sum(float(b["exposed_s"]) for _, b in rows + bubbles)
            rows = [(k, {**b, "share": float(b["exposed_s"]) / waited}) for k, b in rows]
            bubbles = [(k, {**b, "share": float(b["exposed_s"]) / waited}) for k, b in bubbles]
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


def _bubble_row(b: dict[str, Any]) -> dict[str, Any]:
    """A wait for another pipeline rank as a row of the bottleneck table (its share set
    with the other rows')."""
    return {
        "unit": "", "kind": "pp_recv", "phase": "forward" if b["what"] == "activations"
        else "backward", "exposed_s": b["waited_s"], "share": 0.0, "tail_s": 0.0,
        "cause": "bubble", "reason": b["reason"],
    }  # fmt: skip


def _recorded(events: list[tuple[int, int, Event]], offset: float) -> _Placed:
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
    return _Placed(
        events, ts, ts, x1, [-1.0] * n, [-1.0] * n, [], [], starts, stops, {}, ts, {}, {},
        None, RECORDED_CLOCK, True,
    )  # fmt: skip


def _by_index(report: Report, its: list[int], events: list[tuple[int, int, Event]]) -> _Placed:
    n = len(events)
    xs = [float(i) for i in range(n)]
    starts, stops, at = [], [], 0
    for it in its:
        starts.append(float(at))
        at += len(report.iterations[it])
        stops.append(float(at))
    return _Placed(
        events, xs, xs, [x + 1 for x in xs], [-1.0] * n, [-1.0] * n, [], [], starts, stops,
        {}, xs, {}, {}, None, UNTIMED_CLOCK, False,
    )  # fmt: skip


# ---------------------------------------------------------------------------- building


_COMPUTE_COLUMNS = (
    "group", "unit", "phase", "x0", "x1", "step", "flops", "flops_per_s", "peak_share",
)  # fmt: skip
_STEP_COLUMNS = (
    "group", "kind", "unit", "phase", "prefetch", "hook", "hook_unit", "iteration", "index",
    "call", "slot", "lane", "issue", "x0", "x1", "bytes", "exposed",
)  # fmt: skip


def _build(
    groups: list[_Group], source: str, iteration: int | None, machine: Machine | str | None
) -> dict[str, Any]:
    placed = [_place(g, iteration, machine) for g in groups]
    unit_names, numbers, colors = _unit_table(groups)
    lanes: list[dict[str, Any]] = []
    lane_of: list[dict[str, int]] = []
    for gi, p in enumerate(placed):
        mine: dict[str, int] = {}
        for kind, name in (("cpu", "CPU · hooks"), ("compute", "compute")):
            mine[name] = len(lanes)
            lanes.append({"group": gi, "kind": kind, "name": name})
        present = {STREAM_LANES.get((e.kind, e.group)) for _, _, e in p.events}
        for name in dict.fromkeys([*_ALWAYS, *STREAM_LANES.values()]):
            if name in _ALWAYS or name in present:
                mine[name] = len(lanes)
                lanes.append({"group": gi, "kind": "stream", "name": name})
        lane_of.append(mine)
    # steps in issue order: by the time their hook runs, then group, then index
    rows = sorted(
        ((p.issue[i], gi, i) for gi, p in enumerate(placed) for i in range(len(p.events))),
        key=lambda r: (r[0], r[1], r[2]),
    )
    step_of = {(gi, i): s for s, (_, gi, i) in enumerate(rows)}
    piped = any(e.pipeline for p in placed for _, _, e in p.events)
    kind_names = [*KINDS, *PP_KINDS] if piped else list(KINDS)
    table: list[tuple[Any, ...]] = []  # a row per step, in _STEP_COLUMNS order
    calls: dict[str, list[Any]] = {k: [] for k in ("group", "hook", "unit", "x", "n")}
    call_of: dict[tuple[int, int], tuple[int, int]] = {}
    for gi, p in enumerate(placed):
        _calls(gi, p, groups[gi].units, calls, call_of)
    for _, gi, i in rows:
        g, p = groups[gi], placed[gi]
        it, index, e = p.events[i]
        if e.unit not in g.units:
            raise ValueError(f"event {index} of {g.name} names unknown unit {unit_label(e.unit)}")
        call, slot = call_of[(gi, i)]
        lane = lane_of[gi]["CPU · hooks"] if e.kind == "free" else lane_of[gi][_stream(e)]
        row = (
            gi, kind_names.index(e.kind), g.units[e.unit], 0 if e.phase == "forward" else 1,
            int(e.prefetch), HOOKS.index(e.hook) if e.hook in HOOKS else -1,
            g.units.get(e.hook_unit, -1) if e.hook_unit is not None else -1, it, index,
            call, slot, lane, p.issue[i], p.x0[i], p.x1[i], p.bytes[i], p.exposed[i],
        )  # fmt: skip
        table.append(row)
    columns = zip(*table, strict=True) if table else ([] for _ in _STEP_COLUMNS)
    steps: dict[str, list[Any]] = {k: list(c) for k, c in zip(_STEP_COLUMNS, columns, strict=True)}
    n = len(rows)
    # by where each starts on its own lane: a collective on its stream, a free (the hook's
    # own work) in its hook call on the CPU lane; the cursor's x in either order
    kinds, issues, starts, owners = steps["kind"], steps["issue"], steps["x0"], steps["group"]
    own = [issues[s] if kinds[s] == FREE else starts[s] for s in range(n)]
    stream_order = sorted(range(n), key=lambda s: (own[s], owners[s], s))
    compute: dict[str, list[Any]] = {k: [] for k in _COMPUTE_COLUMNS}
    if any(a for p in placed for a, _ in p.compute_actions):  # a pipeline: each stretch's action
        compute.update(label=[], microbatch=[])
    waits: dict[str, list[Any]] = {k: [] for k in ("group", "x0", "x1", "step", "phase", "tail")}
    for gi, p in enumerate(placed):
        _compute(gi, p, groups[gi].units, step_of, compute)
        for x0, x1, event, phase, tail in p.waits:
            for k, v in zip(
                ("group", "x0", "x1", "step", "phase", "tail"),
                (gi, x0, x1, step_of[(gi, event)], 0 if phase == "forward" else 1, int(tail)),
                strict=True,
            ):
                waits[k].append(v)
    memory: list[dict[str, Any]] = []
    group_info = []
    marks: list[dict[str, Any]] = []
    for gi, (g, p) in enumerate(zip(groups, placed, strict=True)):
        resolved = _memory_lane(g, iteration)
        if resolved is not None:
            entry = _memory_entry(gi, g, p, resolved, step_of, len(lanes))
            entry["capacity"] = _capacity(g, p) if isinstance(resolved, MemoryLane) else None
            lanes.append({"group": gi, "kind": "memory", "name": "memory"})
            memory.append(entry)
        group_info.append(_group_info(g, p, step_of, gi))
        marks += _marks(gi, g, p, step_of)
    timed = all(p.timed for p in placed)
    clocks = list(dict.fromkeys(p.clock for p in placed))
    # tensor parallelism's collectives name the module that issued them: a column of indices
    # into ``modules`` (-1: none), only where such events occur
    named = [placed[gi].events[i][2].module for _, gi, i in rows]
    modules = list(dict.fromkeys(m for m in named if m is not None))
    if modules:
        at = {m: k for k, m in enumerate(modules)}
        steps["module"] = [-1 if m is None else at[m] for m in named]
    # pipeline parallelism: the stage and microbatch of each event (-1: none)
    staged = [placed[gi].events[i][2] for _, gi, i in rows]
    if any(e.stage is not None for e in staged):
        steps["stage"] = [-1 if e.stage is None else e.stage for e in staged]
        steps["microbatch"] = [-1 if e.microbatch is None else e.microbatch for e in staged]
    return {
        "version": 2,
        "source": source,
        "units": unit_names,
        "unit_numbers": numbers,
        "colors": colors,
        "kinds": kind_names,
        "hooks": list(HOOKS),
        **({"modules": modules} if modules else {}),
        "timed": timed,
        "clock": "; ".join(clocks) if timed else UNTIMED_CLOCK,
        "groups": group_info,
        "lanes": lanes,
        "n_steps": n,
        "steps": steps,
        "stream_order": stream_order,
        "calls": calls,
        "compute": compute,
        "waits": waits,
        "memory": memory,
        "marks": marks,
        "iteration_starts": [p.starts for p in placed],
    }


def cursor_x(data: dict[str, Any], step: int) -> float:
    """Where the cursor of ``step`` stands: where its event starts on its own lane (a
    collective on its stream, a free in its hook's cell on the CPU lane), in either order."""
    s = data["steps"]
    return float(s["issue"][step] if s["kind"][step] == FREE else s["x0"][step])


def _stream(e: Event) -> str:
    lane = STREAM_LANES.get((e.kind, e.group))
    if lane is None:
        raise ValueError(
            f"no lane for {e.describe()}; add ({e.kind!r}, {e.group!r}) to STREAM_LANES"
        )
    return lane


def _unit_table(groups: list[_Group]) -> tuple[list[str], list[int], list[str]]:
    """Names, numbers and colours of every unit of every group (by data index)."""
    size = max(max(g.units.values(), default=-1) for g in groups) + 1
    names = [""] * size
    numbers = [0] * size
    colors = [UNMANAGED_COLOR] * size
    base = groups[0]
    looks = base.palette or base.report
    palette = unit_colors(looks)
    number = {u.module: i for i, u in enumerate(looks.units)}
    for fqn, i in base.units.items():
        names[i] = fqn
        numbers[i] = number.get(fqn, i)
        colors[i] = palette.get(fqn, UNMANAGED_COLOR)
    for g in groups[1:]:
        if g.units is base.units:
            continue
        # a comparison's other plan: a unit matched by parameters takes its twin's look
        own = {u.module: i for i, u in enumerate(g.report.units)}
        twin = _twins(base.report, g.report)
        other = unit_colors(g.report)
        for fqn, i in g.units.items():
            names[i] = fqn
            match = twin.get(fqn)
            if match is not None:
                numbers[i], colors[i] = number[match], palette[match]
            else:
                numbers[i], colors[i] = own[fqn], other.get(fqn, UNMANAGED_COLOR)
    return names, numbers, colors


def _twins(a: Report, b: Report) -> dict[str, str]:
    """Unit of ``b`` -> the unit of ``a`` holding the same parameters."""
    by_params = {frozenset(u.params): u.module for u in a.units if u.params}
    return {
        u.module: by_params[frozenset(u.params)]
        for u in b.units
        if u.params and frozenset(u.params) in by_params
    }


def _calls(
    gi: int,
    p: _Placed,
    units: dict[str, int],
    calls: dict[str, list[Any]],
    call_of: dict[tuple[int, int], tuple[int, int]],
) -> None:
    """Hook calls of one group: runs of consecutive events issued by one hook of one unit
    (modelled: at one time; a recording's events of one call are issued one by one)."""
    current: tuple[Any, ...] | None = None
    timed = p.totals is not None
    groups, hooks, owners, xs, counts = (calls[k] for k in ("group", "hook", "unit", "x", "n"))
    for i, (it, _, e) in enumerate(p.events):
        key = (it, e.hook, e.hook_unit, p.issue[i] if timed else None)
        if e.hook is None or key != current:
            groups.append(gi)
            hooks.append(HOOKS.index(e.hook) if e.hook in HOOKS else -1)
            owners.append(units.get(e.hook_unit, -1) if e.hook_unit is not None else -1)
            xs.append(p.issue[i])
            counts.append(0)
        current = key
        c = len(counts) - 1
        call_of[(gi, i)] = (c, counts[c])
        counts[c] += 1


def _compute(
    gi: int,
    p: _Placed,
    units: dict[str, int],
    step_of: dict[tuple[int, int], int],
    out: dict[str, list[Any]],
) -> None:
    """Modelled compute stretches, else runs of events issued by one unit's hooks."""

    def add(
        unit: int, phase: int, x0: float, x1: float, event: int,
        rates: tuple[float, float, float] = (-1.0, -1.0, -1.0),
    ) -> None:  # fmt: skip
        row = (gi, unit, phase, x0, x1, step_of[(gi, event)], *rates)
        for column, v in zip(columns, row, strict=True):
            column.append(v)

    columns = [out[k] for k in _COMPUTE_COLUMNS]

    last = len(p.events) - 1
    if p.totals is not None:
        actions = p.compute_actions or [("", -1)] * len(p.compute)
        for (owner, phase, x0, x1, event), rates, (action, mb) in zip(
            p.compute, p.compute_rates, actions, strict=True
        ):
            if owner in units and last >= 0:  # the root without parameters is no unit
                add(units[owner], phase, x0, x1, min(event, last), rates)
                if "label" in out:  # a pipeline: the action and microbatch of each stretch
                    out["label"].append(action)
                    out["microbatch"].append(mb)
        return
    current: tuple[int, int] | None = None
    for i, (_, _, e) in enumerate(p.events):
        unit = units.get(e.hook_unit, -1) if e.hook_unit is not None else -1
        key = (unit, 0 if e.phase == "forward" else 1)
        if unit < 0:
            current = None
        elif key == current:
            out["x1"][-1] = p.x1[i]
        else:
            current = key
            add(unit, key[1], p.x0[i], p.x1[i], i)


def _memory_lane(g: _Group, iteration: int | None) -> MemoryLane | list[float] | None:
    source = g.memory
    if callable(source) and not isinstance(source, MemoryLane):
        source = source(g.report)
    if source is None:
        return None
    if isinstance(source, str):
        if source != "auto":
            raise ValueError(
                f"memory={source!r} is not valid; use 'auto', None, a MemoryLane, "
                "bytes per event, or a callable report -> either"
            )
        return auto_memory(g.report, iteration)
    if isinstance(source, MemoryLane):
        return source
    return [float(v) for v in source]


def auto_memory(report: Report, iteration: int | None = -1) -> MemoryLane | None:
    """What ``memory="auto"`` draws: the memory model's lane of the shown iterations (AdamW),
    made from ``report.memory`` when the last one shown is the steady state; ``None`` for a
    report with no iteration or no unit."""
    if not report.iterations or not report.units:
        return None
    shown = report.iteration_indices(iteration)
    defaults = shown[-1] == len(report.iterations) - 1
    return memory_lane(report, iteration=iteration, memory=report.memory if defaults else None)


def _memory_entry(
    gi: int,
    g: _Group,
    p: _Placed,
    lane: MemoryLane | list[float],
    step_of: dict[tuple[int, int], int],
    lane_index: int,
) -> dict[str, Any]:
    n = len(p.events)
    if isinstance(lane, list):  # bytes after each event: one category
        if len(lane) != n:
            raise ValueError(
                f"memory has {len(lane)} values but {g.name} shows {n} events; give one "
                "value (bytes) per event"
            )
        ends = [p.issue[i + 1] if i + 1 < n else max(p.x1[i], p.issue[i]) for i in range(n)]
        top = max(range(n), key=lambda i: lane[i]) if n else 0
        steps = [step_of[(gi, i)] for i in range(n)]
        return {
            "group": gi,
            "lane": lane_index,
            "categories": ["memory"],
            "colors": [CATEGORY_COLORS["memory"]],
            "x0": list(p.issue),
            "x1": ends,
            "bytes": {"memory": list(lane)},
            "total": list(lane),
            "step": steps,
            "where": [f"after {e.describe()}" for _, _, e in p.events],
            "peak": {
                "moment": top,
                "bytes": lane[top] if n else 0.0,
                "step": steps[top] if n else 0,
                "where": f"after {p.events[top][2].describe()}" if n else "",
                "dominant": "",
                "x": (p.issue[top] + ends[top]) / 2 if n else 0.0,
            },
            "notes": ["memory given by the caller, one value per event"],
        }
    first_event: dict[int, int] = {}
    for i, (it, _, _) in enumerate(p.events):
        first_event.setdefault(it, i)
    x0, x1 = _moment_x(lane, p, first_event)
    # per shown iteration: its first event's index here, and its last event's in it
    last = {it: max(len(g.report.iterations[it]) - 1, 0) for it in dict.fromkeys(lane.iteration)}
    steps = [
        step_of[(gi, first_event.get(it, 0) + min(before, last[it]))]
        for it, before in zip(lane.iteration, lane.before, strict=True)
    ]
    cats = [c for c in lane.categories if any(lane.bytes[c])]
    k = int(lane.peak.get("moment", 0))
    peak = lane.peak
    return {
        "group": gi,
        "lane": lane_index,
        "categories": cats,
        "colors": [CATEGORY_COLORS[c] for c in cats],
        "x0": x0,
        "x1": x1,
        "bytes": {c: list(lane.bytes[c]) for c in cats},
        "total": list(lane.total),
        "step": steps,
        "where": list(lane.where),
        "peak": {
            "moment": k,
            "bytes": int(peak["bytes"]),
            "step": steps[k] if steps else 0,
            "where": str(peak.get("where", "")),
            "dominant": str(peak.get("dominant", "")),
            "x": (x0[k] + x1[k]) / 2 if x0 else 0.0,
        },
        "notes": list(lane.notes),
    }


def _moment_x(
    lane: MemoryLane, p: _Placed, first_event: dict[int, int]
) -> tuple[list[float], list[float]]:
    """Where each moment holds: modelled, a stretch of compute (its most) or the time of its
    hook or event; otherwise the slot of the event it precedes, shared with the others."""
    m = len(lane.total)
    x0 = [0.0] * m
    x1 = [0.0] * m
    if p.totals is not None:
        end_of = dict(zip(_shown_its(p), p.ends, strict=True))
        for j in range(m):
            it, kind, call = lane.iteration[j], lane.kind[j], lane.call[j]
            base = first_event.get(it, 0)
            if kind == "compute" and (it, call) in p.compute_x:
                x0[j], x1[j] = p.compute_x[(it, call)]
                continue
            if kind == "event":
                x0[j] = p.stream_x[base + lane.event[j]]
            else:
                x0[j] = p.hook_stream_x.get((it, call), end_of[it])
            x1[j] = x0[j]
        for j in range(m):  # a moment holds until the next one begins
            if lane.kind[j] != "compute" or x1[j] <= x0[j]:
                nxt = x0[j + 1] if j + 1 < m else end_of[lane.iteration[j]]
                x1[j] = max(x0[j], nxt)
        return x0, x1
    # by index or recorded: the moments before event i share [its x, the next event's x)
    n = len(p.events)
    slots: dict[int, list[int]] = {}
    for j, (it, before) in enumerate(zip(lane.iteration, lane.before, strict=True)):
        slots.setdefault(min(first_event.get(it, 0) + before, n - 1), []).append(j)
    for i, js in slots.items():
        a = p.issue[i]
        b = p.issue[i + 1] if i + 1 < n and p.events[i + 1][0] == p.events[i][0] else p.x1[i]
        b = max(b, a)
        k = len(js)
        for q, j in enumerate(js):
            x0[j] = a + (b - a) * q / k
            x1[j] = a + (b - a) * (q + 1) / k
    return x0, x1


def _shown_its(p: _Placed) -> list[int]:
    return list(dict.fromkeys(it for it, _, _ in p.events))


def _group_info(
    g: _Group, p: _Placed, step_of: dict[tuple[int, int], int], gi: int
) -> dict[str, Any]:
    r = g.report
    api = r.config.api if r.config.states("api") else "FSDP"
    ws = r.config.world_size
    summary = f"{api} {r.source} · {len(r.units)} units · world size {ws}"
    trainable = r.trainable_text()  # a fine-tune: what the optimizer state and gradients are of
    if trainable:
        summary += f" · {trainable}"
    exposed = None
    bottlenecks: list[dict[str, Any]] | None = None
    if p.totals is not None:
        exposed = dict(p.totals)
        bottlenecks = [
            {
                "step": step_of[(gi, i)],
                "unit": g.units.get(b["unit"], -1),
                "kind": str(b["kind"]),
                "phase": str(b["phase"]),
                "exposed": float(b["exposed_s"]),
                "share": float(b["share"]),
                "tail": float(b["tail_s"]),
                "cause": str(b["cause"]),
                "reason": str(b["reason"]),
            }
            for i, b in p.bottlenecks
        ]
        bottlenecks.sort(key=lambda b: (-b["exposed"], b["step"]))
    return {"name": g.name, "summary": summary, "exposed": exposed, "bottlenecks": bottlenecks}


def resolve_machine(machine: Machine | str, report: Report) -> Machine:
    """The machine that times ``report``: ``"auto"`` is the one it was planned for
    (:func:`fsdpviz.cost.fit.machine_of`), a name a preset."""
    if isinstance(machine, Machine):
        return machine
    if machine == AUTO_MACHINE:
        return machine_of(report)
    return make_machine(machine)


def _capacity(g: _Group, p: _Placed) -> dict[str, Any] | None:
    """Will it fit, for the memory lane of a prediction: ``report.memory``'s capacity,
    reserved estimate and headroom, on the machine that times the view (the report's own
    unless ``machine=`` names another). ``None`` for a recording, or where the memory model
    fails."""
    mem = modelled_memory(g.report)
    if mem is None:
        return None
    m = p.machine
    if m is not None and m.name != mem.machine:
        mem = replace(mem, capacity=int(m.memory_gib * 2**30), machine=m.name)
    if mem.capacity <= 0:
        return None
    return {
        "machine": mem.machine,
        "bytes": mem.capacity,
        "overhead": mem.overhead,
        "usable": mem.usable,
        "reserved": int(mem.reserved.get("bytes", 0)),
        "peak": int(mem.peak.get("bytes", 0)),
        "needed": mem.needed,
        "headroom": mem.headroom,
        "fits": mem.fits,
        "label": f"{mem.machine}: {size_text(mem.usable)} usable",
        "text": mem.fit_text(),
    }


def _marks(
    gi: int, g: _Group, p: _Placed, step_of: dict[tuple[int, int], int]
) -> list[dict[str, Any]]:
    where = {(it, k): i for i, (it, k, _) in enumerate(p.events)}
    return [
        {"step": step_of[(gi, where[(it, k)])], "text": text, "kind": kind}
        for it, k, text, kind in g.marks
        if (it, k) in where
    ]
