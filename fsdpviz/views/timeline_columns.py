"""The timeline's data built column by column from its placed groups: the lanes, the
steps in issue and stream order, the hook calls, the compute stretches, the waits, the
memory lanes, the groups' summaries and marks.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict, cast

from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.memory import MemoryLane
from fsdpviz.schema.report import Report, unit_label
from fsdpviz.views.style import UNMANAGED_COLOR, unit_colors
from fsdpviz.views.timeline_groups import LaneGroup
from fsdpviz.views.timeline_lanes import (
    ALWAYS_DRAWN,
    FREE,
    HOOKS,
    KINDS,
    LANE_ORDER,
    PP_KINDS,
    UNTIMED_CLOCK,
    stream_lane,
)
from fsdpviz.views.timeline_memory import MemoryEntry, capacity_entry, group_memory, memory_entry
from fsdpviz.views.timeline_placement import PlacedEvents, place_events

__all__ = ["timeline_columns"]

_COMPUTE_COLUMNS = (
    "group", "unit", "phase", "x0", "x1", "step", "flops", "flops_per_s", "peak_share",
)  # fmt: skip
_STEP_COLUMNS = (
    "group", "kind", "unit", "phase", "prefetch", "hook", "hook_unit", "iteration", "index",
    "call", "slot", "lane", "issue", "x0", "x1", "bytes", "exposed",
)  # fmt: skip


class Lane(TypedDict):
    """A lane of the timeline: its ``group``, ``kind`` (``cpu``, ``compute``, ``stream`` or
    ``memory``) and ``name``."""

    group: int
    kind: str
    name: str


class Mark(TypedDict):
    """A mark on the timeline: the ``step`` it points at, its ``text`` and ``kind``."""

    step: int
    text: str
    kind: str


class WaitEntry(TypedDict):
    """A row of a group's bottleneck table (see ``Timeline.bottlenecks``): the ``step``,
    ``unit`` (its number, -1 for none), ``kind``, ``phase``, ``exposed`` seconds, ``share``,
    ``tail`` seconds, ``cause`` and ``reason``."""

    step: int
    unit: int
    kind: str
    phase: str
    exposed: float
    share: float
    tail: float
    cause: str
    reason: str


class GroupInfo(TypedDict):
    """A group's ``name``, ``summary`` line, ``exposed`` totals and bottleneck table (None
    where not timed)."""

    name: str
    summary: str
    exposed: dict[str, float] | None
    bottlenecks: list[WaitEntry] | None


class TimelineData(TypedDict):
    """What :func:`~fsdpviz.views.timeline_view.timeline_data` returns (see it for each key);
    ``steps``, ``calls``, ``compute`` and ``waits`` are columns (one list per key)."""

    version: int
    source: str
    units: list[str]
    unit_numbers: list[int]
    colors: list[str]
    kinds: list[str]
    hooks: list[str]
    modules: NotRequired[list[str]]
    timed: bool
    clock: str
    groups: list[GroupInfo]
    lanes: list[Lane]
    n_steps: int
    steps: dict[str, list[Any]]
    stream_order: list[int]
    calls: dict[str, list[Any]]
    compute: dict[str, list[Any]]
    waits: dict[str, list[Any]]
    memory: list[MemoryEntry]
    marks: list[Mark]
    iteration_starts: list[list[float]]
    step_work: NotRequired[dict[str, list[Any]]]


def timeline_columns(
    groups: list[LaneGroup], source: str, iteration: int | None, machine: Machine | str | None
) -> TimelineData:
    placed = [place_events(g, iteration, machine) for g in groups]
    unit_names, numbers, colors = _unit_table(groups)
    lanes: list[Lane] = []
    lane_of: list[dict[str, int]] = []
    for gi, p in enumerate(placed):
        mine: dict[str, int] = {}
        for kind, name in (("cpu", "CPU · hooks"), ("compute", "compute")):
            mine[name] = len(lanes)
            lanes.append({"group": gi, "kind": kind, "name": name})
        present = {stream_lane(e) for _, _, e in p.events if e.kind != "free"}
        for name in dict.fromkeys([*ALWAYS_DRAWN, *LANE_ORDER]):
            if name in ALWAYS_DRAWN or name in present:
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
        lane = lane_of[gi]["CPU · hooks"] if e.kind == "free" else lane_of[gi][stream_lane(e)]
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
    memory: list[MemoryEntry] = []
    group_info = []
    marks: list[Mark] = []
    for gi, (g, p) in enumerate(zip(groups, placed, strict=True)):
        resolved = group_memory(g, iteration)
        if resolved is not None:
            entry = memory_entry(gi, g, p, resolved, step_of, len(lanes))
            entry["capacity"] = capacity_entry(g, p) if isinstance(resolved, MemoryLane) else None
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
    data: TimelineData = {
        "version": 2,
        "source": source,
        "units": unit_names,
        "unit_numbers": numbers,
        "colors": colors,
        "kinds": kind_names,
        "hooks": list(HOOKS),
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
    # the compute after a step's last micro-step (the optimizer step, torchao's float8
    # precomputation), on the compute lane: only where a group has any
    work = [(gi, w) for gi, p in enumerate(placed) for w in p.step_work]
    if work:
        data["step_work"] = {
            "group": [gi for gi, _ in work],
            "name": [w.name for _, w in work],
            "x0": [w.start for _, w in work],
            "x1": [w.end for _, w in work],
            "bytes": [w.bytes for _, w in work],
            "kernels": [w.kernels for _, w in work],
            "text": [w.text for _, w in work],
        }
    return _with_modules(data, modules) if modules else data


def _with_modules(data: TimelineData, modules: list[str]) -> TimelineData:
    """``data`` with ``modules`` right after ``hooks``, where its JSON has always had it."""
    out: dict[str, object] = {}
    for key, value in data.items():
        out[key] = value
        if key == "hooks":
            out["modules"] = modules
    return cast(TimelineData, out)


def _unit_table(groups: list[LaneGroup]) -> tuple[list[str], list[int], list[str]]:
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
    p: PlacedEvents,
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
    p: PlacedEvents,
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


def _group_info(
    g: LaneGroup, p: PlacedEvents, step_of: dict[tuple[int, int], int], gi: int
) -> GroupInfo:
    r = g.report
    api = r.config.api if r.config.states("api") else "FSDP"
    ws = r.config.world_size
    summary = f"{api} {r.source} · {len(r.units)} units · world size {ws}"
    trainable = r.trainable_text()  # a fine-tune: what the optimizer state and gradients are of
    if trainable:
        summary += f" · {trainable}"
    exposed = None
    bottlenecks: list[WaitEntry] | None = None
    if p.totals is not None:
        exposed = dict(p.totals)
        bottlenecks = [
            {
                "step": step_of[(gi, i)],
                "unit": g.units.get(b.unit, -1),
                "kind": b.kind,
                "phase": b.phase,
                "exposed": float(b.exposed_s),
                "share": float(b.share),
                "tail": float(b.tail_s),
                "cause": b.cause,
                "reason": b.reason,
            }
            for i, b in p.bottlenecks
        ]
        bottlenecks.sort(key=lambda b: (-b["exposed"], b["step"]))
    return {"name": g.name, "summary": summary, "exposed": exposed, "bottlenecks": bottlenecks}


def _marks(
    gi: int, g: LaneGroup, p: PlacedEvents, step_of: dict[tuple[int, int], int]
) -> list[Mark]:
    where = {(it, k): i for i, (it, k, _) in enumerate(p.events)}
    return [
        {"step": step_of[(gi, where[(it, k)])], "text": text, "kind": kind}
        for it, k, text, kind in g.marks
        if (it, k) in where
    ]
