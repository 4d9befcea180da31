"""Reports as Chrome traces (Trace Event Format, JSON object form) that fsdpviz reads back.

One process per rank (``"rank N"``), three threads per process: ``compute``,
``all-gather stream`` and ``reduce-scatter stream``. Events are ``"X"`` slices
(microseconds): all-gathers on the all-gather stream, reduce-scatters and
``NO_SHARD`` all-reduces on the reduce-scatter stream, frees as ``"i"`` instants
on the all-gather stream; ``args`` carry ``unit``, ``kind``, ``phase``,
``prefetch``, ``hook``, ``hook_unit``, ``iteration`` and ``index`` (position in
``report.iterations[iteration]``). Memory per rank is a ``"C"`` counter
(``memory``, bytes per category after each event, from the memory model).

Times: a recording's events sit at their recorded ``t`` (ranks aligned by
``config.started_unix``) and last their recorded ``duration``; a prediction
has no times, so its events and compute come from the time model
(:func:`fsdpviz.cost.timeline` on ``machine``), iterations one after the other.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Required, TypedDict

from fsdpviz._version import __version__
from fsdpviz.cost.fit import DEFAULT_MACHINE
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.memory import memory_model
from fsdpviz.cost.time import timeline
from fsdpviz.export._sources import ranks_of
from fsdpviz.schema.events import Event
from fsdpviz.schema.memory import CATEGORIES
from fsdpviz.schema.report import Report
from fsdpviz.schema.rows import Scalar
from fsdpviz.views.timeline_placement import resolve_machine

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun

__all__ = ["LANES", "chrome_trace"]

LANES = {
    1: "compute", 2: "all-gather stream", 3: "reduce-scatter stream", 4: "copy stream",
    5: "tensor parallel", 6: "pipeline sends and receives", 7: "context parallel",
}  # fmt: skip
_LANE_OF = {
    "all_gather": 2, "free": 2, "reduce_scatter": 3, "all_reduce": 3, "h2d": 4, "d2h": 4,
    "cast": 4,
    "tp_all_gather": 5, "tp_reduce_scatter": 5, "tp_all_reduce": 5, "tp_all_to_all": 5,
    "pp_send": 6, "pp_recv": 6, "cp_all_gather": 7, "cp_all_to_all": 7,
}  # fmt: skip
# lanes drawn only where their events occur: CPU offload's host-device copies and NO_SHARD's
# casts (the pre-unshard stream's), tensor
# parallelism's collectives, pipeline parallelism's sends and receives, ring attention's
_OPTIONAL = {4: ("h2d", "d2h", "cast"), 5: ("tp_all_gather", "tp_reduce_scatter", "tp_all_reduce",
                                    "tp_all_to_all"), 6: ("pp_send", "pp_recv"),
             7: ("cp_all_gather", "cp_all_to_all")}  # fmt: skip
_US = 1e6

TraceArgs = dict[str, Scalar | list[int]]
"""A trace event's ``args``: what fsdpviz knows of it (a run of hooks names its first and
last event)."""


class TraceEvent(TypedDict, total=False):
    """One event of the Trace Event Format as fsdpviz writes it: ``"M"`` metadata, ``"X"``
    slices (``ts`` and ``dur`` in microseconds), ``"i"`` instants (scope ``s``) and ``"C"``
    counters."""

    ph: Required[str]
    name: Required[str]
    pid: Required[int]
    tid: Required[int]
    s: str
    cat: str
    ts: float
    dur: float
    args: TraceArgs


def chrome_trace(
    obj: Report | RecordedRun, *, iteration: int | None = None, machine: Machine | str = "auto"
) -> dict[str, Any]:
    """``obj`` as one JSON object: a Chrome trace that also holds the report(s) themselves.

    ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`` plus
    :meth:`Report.to_dict`'s keys (a report) or ``"ranks"`` and ``"notes"`` (a
    recorded run), so Perfetto and ``chrome://tracing`` open the file and
    :func:`fsdpviz.load` reads it back. ``iteration``: one iteration (``-1``: the
    last), or ``None`` for all; ``machine`` times a prediction (``"auto"``: the machine it
    was planned for, ``analyze(..., machine=...)``).

    Example::

        trace = chrome_trace(report)
        [e for e in trace["traceEvents"] if e["ph"] == "X"][:2]
    """
    from fsdpviz.recording import RecordedRun  # lazy: loads torch, which export does without

    reports, names = ranks_of(obj)
    pipe = obj.pipeline if isinstance(obj, Report) else None
    if pipe is not None and pipe.ranks:  # a pipeline: a process per pipeline rank
        reports = list(pipe.ranks)
        names = [f"pp rank {r.config.pp_rank}" for r in reports]
    piped = pipe is not None and bool(pipe.ranks)
    pids = [_pid(r, i, isinstance(obj, RecordedRun) or piped) for i, r in enumerate(reports)]
    starts = [float(r.config.started_unix or 0.0) for r in reports]
    events: list[TraceEvent] = []
    machine_name = None
    for report, name, pid, start in zip(reports, names, pids, starts, strict=True):
        kinds = {e.kind for it in report.iterations for e in it}
        shown = {tid for tid, ks in _OPTIONAL.items() if kinds.intersection(ks)}
        events += _metadata(pid, name, shown)
        its = report.iteration_indices(iteration)
        if _timed(report, its):
            events += _recorded(report, its, pid, (start - min(starts)) * _US)
        else:
            on = resolve_machine(machine, report)
            events += _predicted(report, its, pid, on)
            # as the user named it: the preset's name, else the machine's own
            spec = report.config.machine or DEFAULT_MACHINE if machine == "auto" else machine
            machine_name = _machine_name(spec if isinstance(spec, str | Machine) else on)
    other: dict[str, str] = {"generator": f"fsdpviz {__version__}", "source": reports[0].source}
    if machine_name is not None:
        other["machine"] = machine_name
        other["times"] = "modelled by fsdpviz.cost.timeline (a prediction has no real times)"
    head: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}
    return {**head, **obj.to_dict()}


def _pid(report: Report, i: int, run: bool) -> int:
    rank = report.config.rank
    if report.source == "recording" and isinstance(rank, int):
        return rank
    return i if run else 0


def _machine_name(machine: Machine | str) -> str:
    return machine if isinstance(machine, str) else str(machine.name)


def _metadata(pid: int, name: str, shown: set[int]) -> list[TraceEvent]:
    out: list[TraceEvent] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
        {
            "ph": "M",
            "name": "process_sort_index",
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": pid},
        },
    ]
    for tid, lane in LANES.items():
        if tid in _OPTIONAL and tid not in shown:
            continue
        out.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}}
        )
        out.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    return out


def _timed(report: Report, its: list[int]) -> bool:
    evs = [e for i in its for e in report.iterations[i]]
    return bool(evs) and all(e.t is not None for e in evs)


def _event_args(e: Event, iteration: int, index: int) -> TraceArgs:
    return {
        "unit": e.unit,
        "kind": e.kind,
        "phase": e.phase,
        "prefetch": e.prefetch,
        "hook": e.hook,
        "hook_unit": e.hook_unit,
        "iteration": iteration,
        "index": index,
    }


def _slice(
    pid: int, tid: int, name: str, cat: str, ts: float, dur: float, args: TraceArgs
) -> TraceEvent:
    return {
        "ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
        "ts": round(ts, 3), "dur": round(max(dur, 0.0), 3), "args": args,
    }  # fmt: skip


def _event(e: Event, pid: int, ts: float, dur: float, args: TraceArgs) -> TraceEvent:
    label = f"{e.kind} {e.module or e.unit or '(root)'}"
    if e.pipeline:
        label = f"{e.action} ({e.kind})"
    if e.action is not None:
        args = {**args, "stage": e.stage, "microbatch": e.microbatch, "action": e.action}
    tid = _LANE_OF[e.kind]
    cat = e.kind + (",prefetch" if e.prefetch else "")
    if e.kind == "free":
        return {"ph": "i", "s": "t", "name": label, "cat": cat, "pid": pid, "tid": tid,
                "ts": round(ts, 3), "args": args}  # fmt: skip
    return _slice(pid, tid, label, cat, ts, dur, args)


def _iteration_mark(pid: int, iteration: int, ts: float) -> TraceEvent:
    return {"ph": "i", "s": "p", "name": f"iteration {iteration}", "cat": "iteration",
            "pid": pid, "tid": 1, "ts": round(ts, 3), "args": {"iteration": iteration}}  # fmt: skip


def _memory(report: Report, iteration: int, pid: int, times: list[float]) -> list[TraceEvent]:
    """``"C"`` samples: bytes per category after each event, at the event's time."""
    try:
        records = [r.breakdown() for r in memory_model(report, iteration=iteration).events]
    except (ValueError, KeyError, IndexError):
        return []
    used = [c for c in CATEGORIES if any(r[c] for r in records)]
    samples = sorted(zip(times, records, strict=True), key=lambda s: s[0])
    return [
        {
            "ph": "C",
            "name": "memory",
            "pid": pid,
            "tid": 0,
            "ts": round(t, 3),
            "args": {c: int(r[c]) for c in used},
        }
        for t, r in samples
    ]


def _recorded(report: Report, its: list[int], pid: int, offset: float) -> list[TraceEvent]:
    """A recording: events at their ``t``, lasting their ``duration`` (clipped per lane)."""
    out: list[TraceEvent] = []
    for it in its:
        evs = report.iterations[it]
        ts = [offset + float(e.t or 0.0) * _US for e in evs]
        ends = [t + float(e.duration or 0.0) * _US for t, e in zip(ts, evs, strict=True)]
        out.append(_iteration_mark(pid, it, ts[0]))
        lanes: dict[int, list[TraceEvent]] = {}
        for k, (e, t, end) in enumerate(zip(evs, ts, ends, strict=True)):
            args = _event_args(e, it, k)
            if e.duration is not None:
                args["duration_s"] = e.duration
            ev = _event(e, pid, t, end - t, args)
            out.append(ev)
            if ev["ph"] == "X":
                lanes.setdefault(ev["tid"], []).append(ev)
        out += _hook_runs(evs, ts, ends, pid, it)
        for lane in lanes.values():
            _clip(lane)
        out += _memory(report, it, pid, ts)
    return out


def _hook_runs(
    evs: list[Event], ts: list[float], ends: list[float], pid: int, it: int
) -> list[TraceEvent]:
    """Compute lane of a recording: runs of events issued by one unit's hooks in one phase."""
    runs: list[TraceEvent] = []
    keyed = [(e.hook_unit, e.phase, k) for k, e in enumerate(evs)]
    for (unit, phase), group in itertools.groupby(keyed, key=lambda x: (x[0], x[1])):
        ks = [k for _, _, k in group]
        if unit is None:
            continue
        name = f"{phase} hooks of {unit or '(root)'}"
        args: TraceArgs = {"unit": unit, "phase": phase, "iteration": it, "events": [ks[0], ks[-1]]}
        end = max(ends[k] for k in ks)
        runs.append(_slice(pid, 1, name, "hooks", ts[ks[0]], end - ts[ks[0]], args))
    _clip(runs)
    return runs


def _clip(lane: list[TraceEvent]) -> None:
    """Shorten slices that run into the next one on their lane (a viewer needs them nested)."""
    for a, b in itertools.pairwise(lane):
        if a["ts"] + a["dur"] > b["ts"]:
            a["dur"] = round(max(b["ts"] - a["ts"], 0.0), 3)


def _predicted(
    report: Report, its: list[int], pid: int, machine: Machine | str
) -> list[TraceEvent]:
    """A prediction: events and compute placed by the time model, iterations back to back."""
    out: list[TraceEvent] = []
    offset = 0.0
    for it in its:
        tl = timeline(report, machine, iteration=it)
        evs = report.iterations[it]
        out.append(_iteration_mark(pid, it, offset))
        for c in tl.compute:
            name = f"compute before {c.hook} of {c.unit or '(root)'}"
            if c.hook == "end":
                name = "compute after the last hook"
            args: TraceArgs = {"hook": c.hook, "unit": c.unit, "flops": c.flops, "iteration": it}
            out.append(
                _slice(pid, 1, name, "compute", offset + c.start * _US,
                       (c.end - c.start) * _US, args)
            )  # fmt: skip
        times = [offset] * len(evs)
        for r in tl.events:
            e = evs[r.index]
            args = _event_args(e, it, r.index)
            args.update(bytes=r.bytes, exposed_s=r.exposed)
            ts = offset + r.start * _US
            times[r.index] = ts
            out.append(_event(e, pid, ts, (r.end - r.start) * _US, args))
        step = tl.totals["step_s"] * _US
        # the optimizer step and torchao's float8 precomputation, after the last micro-step
        for w in tl.step_work:
            name = "optimizer step" if w.name == "optimizer" else w.text
            out.append(
                _slice(pid, 1, name, "compute", offset + w.start * _US, (w.end - w.start) * _US,
                       {"iteration": it, "machine": tl.machine.get("name")})
            )  # fmt: skip
        out += _memory(report, it, pid, times)
        offset += step
    return out
