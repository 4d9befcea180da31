"""``fsdpviz.load_profile``: the recorded schedule from a ``torch.profiler`` trace.

Reads the Chrome/Kineto JSON a profiler writes (``prof.export_chrome_trace``,
``tensorboard_trace_handler``; ``.json`` or ``.json.gz``) and rebuilds one
rank's events from the ``record_function`` labels FSDP puts around its hooks:
each collective operator (``c10d::allgather_``, ``c10d::_allgather_base_``,
``c10d::_reduce_scatter_base_``, ``c10d::allreduce_``, ...) becomes an event
of the hook whose label encloses it, with its real duration.

FSDP1's labels (``FullyShardedDataParallel._pre_forward``,
``_pre_forward_prefetch``, ``_pre_backward_hook``, ``_pre_backward_prefetch``,
``_post_backward_hook``, ``_post_backward_prefetch``, ...) say which hook ran
and whether it prefetched, but not for which unit, and frees have no label.
FSDP2's labels name their unit (see :mod:`fsdpviz.recording._profile_fsdp2`).
So the report holds all-gathers and reductions only (``config.kinds``,
which :func:`fsdpviz.diff` honours), and unit names come from ``reference``
(a prediction or a recording of the same job): the trace's events are aligned
with the reference's on (kind, phase, prefetch, hook) and take the names of
the events they match; unmatched events are named ``"?"``.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fsdpviz.recording._diff import align
from fsdpviz.recording._profile_fsdp2 import KINDS as FSDP2_KINDS
from fsdpviz.recording._profile_fsdp2 import fsdp2_found, is_fsdp2_trace
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.events import Event, EventKind, Hook, Phase
from fsdpviz.schema.report import Report

_P = "FullyShardedDataParallel."
FSDP1_HOOK_LABELS: dict[str, tuple[Hook, Phase, bool]] = {
    _P + "_pre_forward": ("pre_forward", "forward", False),
    _P + "_pre_forward_prefetch": ("pre_forward", "forward", True),
    _P + "_post_forward": ("post_forward", "forward", False),
    _P + "_pre_backward_hook": ("pre_backward", "backward", False),
    _P + "_pre_backward_prefetch": ("pre_backward", "backward", True),
    _P + "_post_backward_hook": ("post_backward", "backward", False),
    _P + "_post_backward_hook_reshard_only": ("post_backward", "backward", False),
    _P + "_post_backward_prefetch": ("post_backward", "backward", True),
}
COLLECTIVE_OPS: dict[str, EventKind] = {
    "c10d::allgather_": "all_gather",
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::allreduce_": "all_reduce",
    "c10d::allreduce_coalesced_": "all_reduce",
}
FSDP1_KINDS: tuple[EventKind, ...] = ("all_gather", "reduce_scatter", "all_reduce")
_FSDP1_FORWARD = _P + "forward"


@dataclass
class _Span:
    name: str
    ts: float
    end: float
    external_ids: set[int] = field(default_factory=set)
    reduced: bool = False


@dataclass
class _Found:
    ts: float
    dur: float
    kind: EventKind
    hook: Hook
    phase: Phase
    prefetch: bool
    external_ids: set[int]
    unit: str = "?"
    hook_unit: str = "?"


def _read(path: Path) -> dict[str, Any]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{str(path)!r} is not a readable Chrome trace JSON ({e}); export one with "
            "prof.export_chrome_trace(path) or torch.profiler.tensorboard_trace_handler"
        ) from e
    return data if isinstance(data, dict) else {"traceEvents": data}


def _spans_by_thread(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    threads: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and "dur" in e and e.get("cat") != "kernel":
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for spans in threads.values():
        spans.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
    return threads


def _collectives(spans: list[dict[str, Any]]) -> tuple[list[_Found], list[float]]:
    """Outermost collective operators inside an FSDP1 hook label, on one thread, and the
    start of each outermost ``FullyShardedDataParallel.forward`` (a root forward)."""
    found: list[_Found] = []
    roots: list[float] = []
    stack: list[_Span] = []
    for e in spans:
        ts, name = float(e["ts"]), str(e["name"])
        while stack and stack[-1].end <= ts:
            stack.pop()
        if name == _FSDP1_FORWARD:
            if not any(s.name == _FSDP1_FORWARD for s in stack):
                roots.append(ts)
            stack.append(_Span(name, ts, ts + float(e["dur"])))
            continue
        ext = e.get("args", {}).get("External id")
        if ext is not None:
            for s in stack:
                if s.name in COLLECTIVE_OPS:
                    s.external_ids.add(int(ext))
        if name in COLLECTIVE_OPS and not any(s.name in COLLECTIVE_OPS for s in stack):
            hook_span = next((s for s in reversed(stack) if s.name in FSDP1_HOOK_LABELS), None)
            span = _Span(name, ts, ts + float(e["dur"]), {int(ext)} if ext is not None else set())
            stack.append(span)
            if hook_span is None:
                continue
            hook, phase, prefetch = FSDP1_HOOK_LABELS[hook_span.name]
            kind = COLLECTIVE_OPS[name]
            if kind != "all_gather":
                # one reduction per post-backward hook, as FSDP1 reduces a gradient once
                # (HYBRID_SHARD's extra all-reduce across replicas belongs to it)
                if hook_span.reduced:
                    continue
                hook_span.reduced, prefetch = True, False
            dur = float(e["dur"])
            found.append(_Found(ts, dur, kind, hook, phase, prefetch, span.external_ids))
        elif name in FSDP1_HOOK_LABELS:
            stack.append(_Span(name, ts, ts + float(e["dur"])))
    return found, roots


def _device_times(events: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """External id -> (first start, last end) of the GPU kernels launched under it."""
    times: dict[int, tuple[float, float]] = {}
    for e in events:
        ext = e.get("args", {}).get("External id")
        if e.get("cat") == "kernel" and ext is not None and "dur" in e:
            start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            lo, hi = times.get(int(ext), (start, end))
            times[int(ext)] = (min(lo, start), max(hi, end))
    return times


def _steps(events: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """``ProfilerStep#N`` spans as (N, start, end), in order."""
    steps = []
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith("ProfilerStep#"):
            ts = float(e["ts"])
            steps.append((int(name.removeprefix("ProfilerStep#")), ts, ts + float(e["dur"])))
    return sorted(steps, key=lambda s: s[1])


def _split_iterations(
    found: list[_Found], steps: list[tuple[int, float, float]], roots: list[float]
) -> tuple[list[list[_Found]], int]:
    """Events per iteration and the index of the first one.

    With ``ProfilerStep#N`` spans, one iteration per step (the first ``N`` is the
    index). Otherwise a root FSDP forward that starts after a backward event
    starts the next iteration, as FSDP's final backward callback ended the last.
    """
    if steps:
        per_step = [[f for f in found if lo <= f.ts < hi] for _, lo, hi in steps]
        used = [i for i, fs in enumerate(per_step) if fs]
        if not used:
            return [], 0
        return per_step[used[0] : used[-1] + 1], steps[used[0]][0]
    iterations: list[list[_Found]] = [[]]
    backward_seen = False
    in_order = sorted([(ts, 0, None) for ts in roots] + [(f.ts, 1, f) for f in found], key=_first)
    for _, _, f in in_order:
        if f is None:
            if backward_seen:
                iterations.append([])
                backward_seen = False
        else:
            iterations[-1].append(f)
            backward_seen = backward_seen or f.phase == "backward"
    return [it for it in iterations if it], 0


def _first(item: tuple[float, int, _Found | None]) -> tuple[float, int]:
    return item[0], item[1]


def _name(events: list[Event], reference: list[Event]) -> list[Event]:
    """Give ``events`` the unit names of the ``reference`` events they align with."""

    def shape(e: Event) -> Event:
        return Event(e.kind, "", e.phase, e.prefetch, e.hook, "")

    named: dict[int, Event] = {}
    rows = align([shape(e) for e in events], [shape(e) for e in reference])
    i = j = 0
    for row in rows:
        if row.status == "equal":
            named[i] = reference[j]
        i += row.recorded is not None
        j += row.predicted is not None
    return [
        replace(e, unit=named[k].unit, hook_unit=named[k].hook_unit) if k in named else e
        for k, e in enumerate(events)
    ]


def load_profile(path: str | Path, *, reference: Report | None = None) -> Report:
    """One rank's FSDP schedule, rebuilt from a ``torch.profiler`` Chrome trace.

    Each event has ``t`` (seconds since the trace's first event, when the
    collective was issued) and ``duration`` (the GPU kernels' time when the
    trace links the collective to kernels, else the host-side time).
    Iterations are the ``ProfilerStep#N`` spans when the trace has them
    (``config.iteration_offset`` is the first ``N``), else each root FSDP
    forward that follows a backward starts one. FSDP1 traces name no units: pass
    ``reference`` (a prediction or a recording of the same job) to name them.

    Example::

        with torch.profiler.profile() as prof:
            for _ in range(3):
                model(x).sum().backward()
        prof.export_chrome_trace("trace.json")
        predicted = fsdpviz.analyze(model_def, x, world_size=8, auto_wrap_policy=policy)
        real = fsdpviz.load_profile("trace.json", reference=predicted)
        print(fsdpviz.diff(real, predicted))      # all-gathers and reductions, in order
    """
    p = Path(path)
    data = _read(p)
    events = [e for e in data.get("traceEvents", []) if isinstance(e, dict)]
    fsdp2 = is_fsdp2_trace(events)
    found: list[_Found] = []
    roots: list[float] = []
    for spans in _spans_by_thread(events).values():
        if fsdp2:
            dicts, thread_roots = fsdp2_found(spans, set(COLLECTIVE_OPS))
            thread_found = [_Found(**d) for d in dicts]
        else:
            thread_found, thread_roots = _collectives(spans)
        found.extend(thread_found)
        roots.extend(thread_roots)
    if not found:
        raise ValueError(
            f"{str(p)!r} has no collective inside an FSDP hook label; profile the FSDP "
            "model's forward and backward with torch.profiler (CPU activity on) and export "
            "that trace"
        )
    found.sort(key=lambda f: f.ts)
    origin = min(float(e["ts"]) for e in events if e.get("ph") == "X" and "ts" in e)
    device = _device_times(events)
    iterations, offset = _split_iterations(found, _steps(events), roots)
    out: list[list[Event]] = []
    for n, it in enumerate(iterations):
        timed = []
        for f in it:
            kernels = [device[x] for x in f.external_ids if x in device]
            dur = max(e for _, e in kernels) - min(s for s, _ in kernels) if kernels else f.dur
            t = (f.ts - origin) / 1e6
            timed.append(
                Event(f.kind, f.unit, f.phase, f.prefetch, f.hook, f.hook_unit, t, dur / 1e6)
            )
        if reference is not None and reference.iterations and not fsdp2:
            ref_it = reference.iterations[min(offset + n, len(reference.iterations) - 1)]
            timed = _name(timed, [e for e in ref_it if e.kind in FSDP1_KINDS])
        out.append(timed)
    info = data.get("distributedInfo") or {}
    return Report(
        source="recording",
        config=ReportConfig.from_dict(
            {
                "api": "FSDP2" if fsdp2 else "FSDP1",
                "trace": str(p),
                "world_size": info.get("world_size"),
                "rank": info.get("rank"),
                "backend": info.get("backend"),
                "kinds": list(FSDP2_KINDS if fsdp2 else FSDP1_KINDS),
                "iteration_offset": offset,
                "unit_names": "from trace"
                if fsdp2
                else ("from reference" if reference is not None else "unknown"),
            }
        ),
        units=[],
        forward_order=[],
        iterations=out,
    )
