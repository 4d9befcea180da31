"""The step-through timeline as plain, JSON-ready data (what the JS widget and the figure draw).

One or more ranks (a prediction, or several reports recorded on different ranks)
become one list of *steps*: every event of every rank, ordered by its x position
then rank. Each rank has three lanes: ``compute`` (the unit whose FSDP hooks are
running, i.e. whose forward or backward runs between those events; for modelled
times the time model's compute stretches, by the unit they belong to), ``all_gather``
(all-gathers, with frees as ticks) and ``reduce_scatter`` (reduce-scatters and
``NO_SHARD`` all-reduces).

Times: an event with a ``t`` attribute (seconds, set by recordings) is placed at
its time. A prediction is placed at the times the time model gives on
``machine`` (:func:`fsdpviz.cost.timeline`, iterations back to back) when it has
a trace profile (the FLOPs between hooks); without ``machine`` or a profile its
events are laid out by index, one unit of x per event (uniform spacing: the
order is modelled, durations are not). Steps follow each rank's event order (the
order FSDP issues them); ranks interleave by time, or by index for predictions.
A modelled all-gather can start before an earlier-issued free (it waits for the
communication stream, the free for the compute stream).

``memory`` is an optional per-event series in bytes for the first rank (from a
memory model); its peak becomes a step to jump to. Each value holds from its
event's start (for modelled times, from when the hook issued the event: the
allocator's view) until the next value.

Example::

    data = timeline_data(report, memory=[...], machine="h100")  # bytes per event
    data["n_steps"], data["peak_step"], data["x_label"]
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from fsdpviz.cost.hardware import Machine
from fsdpviz.schema.report import Event, Report
from fsdpviz.views.style import unit_colors

__all__ = [
    "HOOKS",
    "KINDS",
    "MemorySeries",
    "MemorySource",
    "event_x",
    "resolve_memory",
    "timeline_data",
]

MemorySeries = Sequence[float]
"""Bytes in use after each event of the first rank, one float per event."""
MemorySource = MemorySeries | Callable[[Report], MemorySeries] | None
"""A series, or a memory model called with the report (re-run after each re-plan)."""

KINDS = ("all_gather", "free", "reduce_scatter", "all_reduce", "h2d", "d2h")
HOOKS = ("pre_forward", "post_forward", "pre_backward", "post_backward", "final_callback")
UNTIMED_LABEL = "event index (predicted order; no durations are modelled, uniform spacing)"
TIMED_LABEL = "time (s, recorded)"
MODELLED_LABEL = "time (s, modelled on {machine} by fsdpviz.cost.timeline)"


def resolve_memory(source: MemorySource, report: Report) -> list[float] | None:
    """The memory series for ``report``: ``source`` itself, or ``source(report)``."""
    if source is None:
        return None
    series = source(report) if callable(source) else source
    return [float(v) for v in series]


def _events(report: Report, iteration: int | None) -> list[tuple[int, Event]]:
    if iteration is None:
        return [(i, e) for i, it in enumerate(report.iterations) for e in it]
    n = len(report.iterations)
    if not -n <= iteration < n:
        raise IndexError(f"iteration {iteration} is out of range: the report has {n}")
    index = iteration % n
    return [(index, e) for e in report.iterations[index]]


def event_x(events: Sequence[Event]) -> tuple[list[float], list[float], bool]:
    """Start and end x of each event and whether they are real times.

    Real times when every event has a numeric ``t`` (``Event.t``, seconds, from a
    recording); an event then lasts its ``duration`` when recorded, else until the
    next event (the last one for the median gap). Otherwise event ``i`` spans
    ``[i, i + 1)``.
    """
    times = [getattr(e, "t", None) for e in events]
    if events and all(isinstance(t, int | float) for t in times):
        ts = [float(t) for t in times]  # type: ignore[arg-type]
        gaps = [b - a for a, b in itertools.pairwise(ts) if b > a]
        last = statistics.median(gaps) if gaps else 1e-6
        ends = [*ts[1:], ts[-1] + last]
        for i, e in enumerate(events):
            duration = getattr(e, "duration", None)
            if isinstance(duration, int | float) and duration > 0:
                ends[i] = ts[i] + float(duration)
        return ts, [max(b, a) for a, b in zip(ts, ends, strict=True)], True
    return [float(i) for i in range(len(events))], [float(i + 1) for i in range(len(events))], False


def timeline_data(
    reports: Report | Sequence[Report],
    iteration: int | None = -1,
    *,
    memory: MemorySeries | None = None,
    rank_names: Sequence[str] | None = None,
    machine: Machine | str | None = None,
) -> dict[str, Any]:
    """Columnar timeline of ``reports`` (one per rank) for ``iteration`` (``None``: all).

    ``machine`` (a :class:`~fsdpviz.cost.hardware.Machine` or preset name) times
    predictions that have a trace profile; see the module docstring.

    Keys: ``units``, ``colors``, ``ranks``, ``kinds``, ``hooks``, ``timed``,
    ``x_label``, ``n_steps``; ``steps`` (columns ``rank``, ``kind``, ``unit``,
    ``phase`` 0 forward / 1 backward, ``prefetch``, ``hook``, ``hook_unit`` (-1
    for none), ``iteration``, ``index`` (position in its rank's event list),
    ``x0``, ``x1``); ``compute`` (segments: ``rank``, ``unit``, ``phase``, ``x0``,
    ``x1``, ``step0``, ``step1``); ``memory`` (``x``, ``bytes``, ``step`` per point) or
    ``None``; ``peak_step`` (step of the memory peak) or ``None``; ``iteration_starts``
    (x where each shown iteration begins, first rank).
    """
    ranks = [reports] if isinstance(reports, Report) else list(reports)
    if not ranks:
        raise ValueError("timeline_data needs at least one report")
    names = list(rank_names) if rank_names is not None else [f"rank {i}" for i in range(len(ranks))]
    if len(names) != len(ranks):
        raise ValueError(f"{len(names)} rank names for {len(ranks)} reports")
    base = ranks[0]
    units = [u.module for u in base.units]
    for other in ranks[1:]:
        units += [u.module for u in other.units if u.module not in units]
    unit_index = {u: i for i, u in enumerate(units)}
    palette = unit_colors(base)
    colors = [palette.get(u, "#999999") for u in units]
    rows: list[tuple[float, int, int, int, Event, float]] = []
    timed_all = True
    modelled_on: str | None = None
    starts: list[float] = []
    per_rank_x: list[list[tuple[float, float]]] = []
    stretches: dict[int, list[Stretch]] = {}  # rank -> modelled compute
    mem_x: list[float] = []  # first rank: where each memory value starts
    for r, report in enumerate(ranks):
        evs = _events(report, iteration)
        if machine is not None and report.source == "prediction" and report.profile is not None:
            x0s, x1s, stretches[r], issued, modelled_on = modelled_x(report, iteration, machine)
        else:
            x0s, x1s, timed = event_x([e for _, e in evs])
            timed_all = timed_all and timed
            issued = x0s
        if r == 0:
            mem_x = issued
        per_rank_x.append(list(zip(x0s, x1s, strict=True)))
        for i, ((it, e), a, b) in enumerate(zip(evs, x0s, x1s, strict=True)):
            if r == 0 and (i == 0 or evs[i - 1][0] != it):
                starts.append(a)
            rows.append((a, r, i, it, e, b))
    if modelled_on is not None:
        rows.sort(key=lambda row: (row[2], row[1]))
    else:
        rows.sort(key=lambda row: (row[0], row[1], row[2]))
    steps: dict[str, list[Any]] = {
        k: []
        for k in (
            "rank",
            "kind",
            "unit",
            "phase",
            "prefetch",
            "hook",
            "hook_unit",
            "iteration",
            "index",
            "x0",
            "x1",
        )
    }
    step_of: dict[tuple[int, int], int] = {}
    for s, (a, r, i, it, e, b) in enumerate(rows):
        if e.unit not in unit_index:
            raise ValueError(f"event {i} of rank {names[r]} names unknown unit {e.unit!r}")
        step_of[(r, i)] = s
        steps["rank"].append(r)
        steps["kind"].append(KINDS.index(e.kind))
        steps["unit"].append(unit_index[e.unit])
        steps["phase"].append(0 if e.phase == "forward" else 1)
        steps["prefetch"].append(int(e.prefetch))
        steps["hook"].append(HOOKS.index(e.hook) if e.hook is not None else -1)
        steps["hook_unit"].append(-1 if e.hook_unit is None else unit_index.get(e.hook_unit, -1))
        steps["iteration"].append(it)
        steps["index"].append(i)
        steps["x0"].append(a)
        steps["x1"].append(b)
    compute = _compute_segments(steps, step_of, len(ranks), stretches, unit_index)
    mem = None
    peak = None
    if memory is not None:
        xs = per_rank_x[0]
        if len(memory) != len(xs):
            raise ValueError(
                f"memory has {len(memory)} values but the first rank shows {len(xs)} events "
                f"(iteration={iteration!r}); give one value (bytes) per event"
            )
        mem = {
            "x": mem_x,
            "bytes": [float(v) for v in memory],
            "step": [step_of[(0, i)] for i in range(len(xs))],
        }
        if xs:
            top = max(range(len(memory)), key=lambda i: memory[i])
            peak = step_of[(0, top)]
    label = TIMED_LABEL if timed_all else UNTIMED_LABEL
    if modelled_on is not None and timed_all:
        label = MODELLED_LABEL.format(machine=modelled_on)
    return {
        "version": 1,
        "source": base.source,
        "units": units,
        "colors": colors,
        "ranks": names,
        "kinds": list(KINDS),
        "hooks": list(HOOKS),
        "timed": timed_all,
        "x_label": label,
        "n_steps": len(rows),
        "steps": steps,
        "compute": compute,
        "memory": mem,
        "peak_step": peak,
        "iteration_starts": starts,
    }


Stretch = tuple[str, int, float, float, int]
"""Modelled compute: owner unit, phase (0 forward, 1 backward), start, end, next event."""


def modelled_x(
    report: Report, iteration: int | None, machine: Machine | str
) -> tuple[list[float], list[float], list[Stretch], list[float], str]:
    """Start and end (s) of each shown event by the time model, iterations back to back,
    the compute stretches between them, when each event was issued, and the machine's name."""
    from fsdpviz.cost.time import timeline

    shown = range(len(report.iterations)) if iteration is None else [iteration]
    x0s: list[float] = []
    x1s: list[float] = []
    compute: list[Stretch] = []
    issued: list[float] = []
    offset = 0.0
    name = machine if isinstance(machine, str) else machine.name
    for it in shown:
        tl = timeline(report, machine, iteration=it)
        name = str(tl.machine.get("name", name))
        placed = sorted(tl.events, key=lambda r: int(r["index"]))
        if len(placed) != len(report.iterations[it]):
            raise ValueError(f"the time model placed {len(placed)} of the events of iteration {it}")
        compute += [
            (str(c["owner"]), 0 if c["phase"] == "forward" else 1, offset + float(c["start"]),
             offset + float(c["end"]), len(x0s) + int(c["next_event"]))
            for c in tl.compute
        ]  # fmt: skip
        x0s += [offset + float(r["start"]) for r in placed]
        x1s += [offset + float(r["end"]) for r in placed]
        issued += [offset + float(r["issued"]) for r in placed]
        offset += tl.totals["step_s"]
    return x0s, x1s, compute, issued, name


def _compute_segments(
    steps: dict[str, list[Any]],
    step_of: dict[tuple[int, int], int],
    n_ranks: int,
    stretches: dict[int, list[Stretch]],
    unit_index: dict[str, int],
) -> dict[str, list[Any]]:
    """A rank's modelled compute stretches (coloured by their owner), or else runs of its
    consecutive events issued by the same unit's hooks in one phase."""
    out: dict[str, list[Any]] = {
        k: [] for k in ("rank", "unit", "phase", "x0", "x1", "step0", "step1")
    }
    for r in range(n_ranks):
        if r in stretches:
            last = max((i for rr, i in step_of if rr == r), default=-1)
            for owner, phase, x0, x1, event in stretches[r]:
                if owner not in unit_index or last < 0:
                    continue  # the root without parameters is no unit: nothing to colour
                s = step_of[(r, min(event, last))]
                for k, v in (
                    ("rank", r), ("unit", unit_index[owner]), ("phase", phase),
                    ("x0", x0), ("x1", x1), ("step0", s), ("step1", s),
                ):  # fmt: skip
                    out[k].append(v)
            continue
        i = 0
        current: tuple[int, int] | None = None
        while (r, i) in step_of:
            s = step_of[(r, i)]
            key = (steps["hook_unit"][s], steps["phase"][s])
            if key[0] < 0:
                current = None
            elif key == current:
                out["x1"][-1] = steps["x1"][s]
                out["step1"][-1] = s
            else:
                current = key
                for k, v in (
                    ("rank", r),
                    ("unit", key[0]),
                    ("phase", key[1]),
                    ("x0", steps["x0"][s]),
                    ("x1", steps["x1"][s]),
                    ("step0", s),
                    ("step1", s),
                ):
                    out[k].append(v)
            i += 1
    return out
