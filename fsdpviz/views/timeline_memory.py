"""The timeline's memory lane: bytes in use by category at each moment, placed on the
group's x, its peak marked, and for a prediction the capacity line (will it fit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NotRequired, TypedDict

from fsdpviz.cost.fit import modelled_memory
from fsdpviz.cost.memory import MemoryLane, memory_lane
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.report import Report
from fsdpviz.views.style import CATEGORY_COLORS
from fsdpviz.views.timeline_groups import LaneGroup
from fsdpviz.views.timeline_placement import PlacedEvents


class PeakMark(TypedDict):
    """Where a memory lane marks its peak: the ``moment``, its ``bytes``, the ``step`` it
    falls in, ``where`` in words, the ``dominant`` category and its ``x``."""

    moment: int
    bytes: float
    step: int
    where: str
    dominant: str
    x: float


class CapacityEntry(TypedDict):
    """Will it fit, as a memory lane draws it (see :func:`capacity_entry`)."""

    machine: str
    bytes: int
    overhead: int
    usable: int
    reserved: int
    peak: int
    needed: int
    headroom: int
    fits: bool
    label: str
    text: str


class MemoryEntry(TypedDict):
    """A memory lane of the timeline's data: its ``group`` and ``lane``, the ``categories``
    drawn and their ``colors``, each moment's ``x0``, ``x1``, ``bytes`` per category,
    ``total``, ``step`` and ``where``, the ``peak`` marked, ``notes``, and (a prediction's)
    ``capacity``."""

    group: int
    lane: int
    categories: list[str]
    colors: list[str]
    x0: Sequence[float]
    x1: Sequence[float]
    bytes: dict[str, Sequence[float]]
    total: Sequence[float]
    step: list[int]
    where: list[str]
    peak: PeakMark
    notes: list[str]
    capacity: NotRequired[CapacityEntry | None]


__all__ = ["auto_memory", "capacity_entry", "group_memory", "memory_entry"]


def group_memory(g: LaneGroup, iteration: int | None) -> MemoryLane | list[float] | None:
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


def memory_entry(
    gi: int,
    g: LaneGroup,
    p: PlacedEvents,
    lane: MemoryLane | list[float],
    step_of: dict[tuple[int, int], int],
    lane_index: int,
) -> MemoryEntry:
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
    lane: MemoryLane, p: PlacedEvents, first_event: dict[int, int]
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


def _shown_its(p: PlacedEvents) -> list[int]:
    return list(dict.fromkeys(it for it, _, _ in p.events))


def capacity_entry(g: LaneGroup, p: PlacedEvents) -> CapacityEntry | None:
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
