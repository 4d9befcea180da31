"""A plan at any micro-batch size from traces at two: :func:`batch_capture`.

What a trace measures is affine in the samples of the batch ``b``: every tensor the step
makes has the batch as one dimension or none, so its bytes, the FLOPs and the kernels'
shapes (a matrix multiply's ``M = b x s``, attention's ``B``), the tokens, the inputs'
bytes, the modules' saved bytes and shapes, and the bytes of the collectives tensor
parallelism issues on activations are each ``p + q * b``. Two traces at ``b1`` and ``b2``
give ``p`` and ``q``. Not so a stretch's peaks (``StepProfile.peak`` and the fields copied
at it: ``peak_activations``, ``peak_forward_temp``, ``peak_grads``, ``peak_in_place``,
``scales_freed``' first part, ``param_views_freed``, by unit and by forward call): each is
the first moment of the stretch with the most bytes held, and which moment that is changes
with the batch (a backward's gradients of activations against the weights' gradients it
makes). So the traces keep every moment they weighed
(:func:`fsdpviz.trace.probe_records.recording_moments`, ``StepProfile.moments``); paired
moment by moment, each is a line in ``b``, and a peak at ``b`` is the first line with the
most there. ``peak_unbuffered`` (FSDP1 under parameter mixed precision, a unit run twice)
is weighed so on the moments less the gradients then held for another forward call of a
unit (``StretchMoments.call_grads``). Only the lines on the upper envelope over ``b >= 1``
(touching included: a tie goes to the earliest) are kept.

Kernels identical at a batch are one record there (the probe merges them, the first's
place kept): :meth:`BatchCapture.at` merges them again. The ``out_of_memory`` warning is
checked anew (:func:`~fsdpviz.cost.fit.check_fit`).

Exact or nothing: :func:`batch_capture` returns None where the two traces do not pair
(other hook calls, moments, kernels, a text or a flag that differs; a pipeline; a trace
without its moments; a compiled loss or compiled checkpointed region, whose saves torch's
min-cut partitioner chooses by the bytes of its values, ``get_node_weight`` in
``torch/_functorch/partitioners.py``: torchtitan's compiled loss of Llama 3 8B saves less
at 12 samples than a line through 3, 6 and 9 gives), and :meth:`BatchCapture.at` None
where a value is not a whole number of bytes at that batch, and at a batch of 1 from
traces of more: torch treats a dim of size 1 apart (a tensor is contiguous whatever its
stride there, so a transpose's ``contiguous()`` copies nothing; it broadcasts), so a step
at 1 may launch other kernels and save other tensors (Hugging Face's Llama and GPT-2 do).
The caller traces instead. Two traces cannot prove a value affine: what else decides by
sizes (as the partitioner does) would be missed; none is known in the trace.

Example::

    with recording_moments():
        low = fsdpviz.analyze(model, batch_of(2), fully_shard=[Block])
        high = fsdpviz.analyze(model, batch_of(3), fully_shard=[Block])
    capture = batch_capture(low, high, 2, 3)
    report = capture.at(8) if capture is not None else None   # analyze at 8, untraced
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from fsdpviz.cost.fit import FIT_CODES, check_fit
from fsdpviz.errors import ConfigError
from fsdpviz.schema.profile import StretchMoments
from fsdpviz.schema.report import Report

__all__ = ["BatchCapture", "batch_capture", "capturable"]

_PEAKS = (
    "peak", "peak_activations", "peak_forward_temp", "peak_grads", "peak_in_place",
    "scales_freed", "param_views_freed",
)  # fmt: skip
"""A step profile's fields weighed at a moment of each stretch."""

Moment = tuple[int, int, int, int, tuple[tuple[str, int], ...] | None]


class _NotExact(Exception):
    """The two traces do not pair, or a value is not whole at the batch asked."""


@dataclass(frozen=True)
class _Line:
    """A value that differs between the two traces: ``low`` at ``b1``, ``high`` at ``b2``."""

    low: int | float
    high: int | float


class _Batches:
    """The two traced batches, and a line's value at another."""

    def __init__(self, b1: int, b2: int) -> None:
        self.b1, self.d = b1, b2 - b1

    def value(self, low: int | float, high: int | float, b: int) -> int | float:
        if low == high:
            return low
        if isinstance(low, int) or (float(low).is_integer() and float(high).is_integer()):
            # whole numbers: exact in ints (a float of one rounds as float(Fraction) does)
            num = int(low) * self.d + (int(high) - int(low)) * (b - self.b1)
            if num % self.d:
                if isinstance(low, int):
                    raise _NotExact(f"{low} at {self.b1} and {high} at {self.b1 + self.d}")
                return float(Fraction(num, self.d))
            return num // self.d if isinstance(low, int) else float(num // self.d)
        v = Fraction(low) + (Fraction(high) - Fraction(low)) * (b - self.b1) / self.d
        return float(v)

    def scaled(self, low: int, high: int) -> tuple[int, int]:
        """The line through the two values as ``(slope, intercept)`` of ``d`` times it."""
        slope = high - low
        return slope, low * self.d - slope * self.b1


def _pair(a: Any, b: Any, path: str) -> Any:
    """The template of two JSON trees: equal leaves as they are, numbers that differ as a
    :class:`_Line`; :class:`_NotExact` where the trees differ otherwise."""
    if type(a) is not type(b):
        raise _NotExact(f"{path}: {a!r} against {b!r}")
    if isinstance(a, dict):
        if list(a) != list(b):
            raise _NotExact(f"{path}: keys {list(a)} against {list(b)}")
        return {k: _pair(a[k], b[k], f"{path}.{k}") for k in a}
    if isinstance(a, list):
        if len(a) != len(b):
            raise _NotExact(f"{path}: {len(a)} entries against {len(b)}")
        return [_pair(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))]
    if a == b:
        return a
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return _Line(a, b)
    raise _NotExact(f"{path}: {a!r} against {b!r}")


def _at(template: Any, batches: _Batches, b: int) -> Any:
    if isinstance(template, _Line):
        return batches.value(template.low, template.high, b)
    if isinstance(template, dict):
        return {k: _at(v, batches, b) for k, v in template.items()}
    if isinstance(template, list):
        return [_at(v, batches, b) for v in template]
    return template


def _envelope(lines: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Of ``(index, slope, intercept)`` lines, those on the upper envelope somewhere at
    ``b >= 1`` (those that only touch it included), in index order: every line the first
    with the most at some ``b >= 1`` is among them."""
    best: dict[int, tuple[int, int, int]] = {}
    for line in lines:  # of one slope only the highest (the first of equals) can win
        _, s, c = line
        have = best.get(s)
        if have is None or c > have[2]:
            best[s] = line
    hull: list[tuple[int, int, int]] = []
    for line in sorted(best.values(), key=lambda x: x[1]):
        while len(hull) >= 2 and _below(hull[-2], hull[-1], line):
            hull.pop()
        hull.append(line)
    # a line of the hull leads up to where the next crosses it: drop those that end before 1
    while len(hull) >= 2:
        (_, s1, c1), (_, s2, c2) = hull[0], hull[1]
        if c1 - c2 >= s2 - s1:  # they cross at x = (c1 - c2) / (s2 - s1) >= 1
            break
        hull.pop(0)
    return sorted(hull)


def _below(a: tuple[int, int, int], m: tuple[int, int, int], line: tuple[int, int, int]) -> bool:
    """Whether ``m`` (its slope between the others') lies under ``a`` or ``line``
    everywhere: under ``a`` where ``a`` and ``line`` cross."""
    _, sa, ca = a
    _, sm, cm = m
    _, sl, cl = line
    return (sm - sa) * (ca - cl) + (cm - ca) * (sl - sa) < 0


@dataclass
class _Peaks:
    """One stretch's moments as lines: the envelopes its peaks are weighed on."""

    moments: dict[int, tuple[Moment, Moment]]  # the moments some envelope keeps
    held: list[tuple[int, int, int]]  # envelope of activations + temp
    now: list[tuple[int, int, int]]  # ... + new gradients
    views: dict[str, tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]]
    # envelope of activations + temp less the gradients held for another forward call
    # (peak_unbuffered), and those gradients at each moment it keeps, at both batches
    unbuffered: list[tuple[int, int, int]]
    call_grads: dict[int, tuple[int, int]]

    @classmethod
    def of(cls, low: StretchMoments, high: StretchMoments, batches: _Batches) -> _Peaks:
        if len(low.moments) != len(high.moments) or low.param_views_at != high.param_views_at:
            raise _NotExact(
                f"a stretch weighs {len(low.moments)} moments at one batch, "
                f"{len(high.moments)} at the other"
            )
        held, now = [], []
        for i, (m1, m2) in enumerate(zip(low.moments, high.moments, strict=True)):
            h1, h2 = sum(m1[:3]), sum(m2[:3])
            held.append((i, *batches.scaled(h1, h2)))
            now.append((i, *batches.scaled(h1 + m1[3], h2 + m2[3])))
        views = {
            u: (_envelope(now[:k]), _envelope(held[:k])) for u, k in low.param_views_at.items()
        }
        grads = list(zip(low.call_grads, high.call_grads, strict=False))
        if len(grads) != len(low.moments) or len(high.call_grads) != len(high.moments):
            raise _NotExact("a stretch without the gradients held for another call")
        unbuffered = [
            (i, *batches.scaled(sum(m1[:3]) - g1, sum(m2[:3]) - g2))
            for i, ((m1, m2), (g1, g2)) in enumerate(
                zip(zip(low.moments, high.moments, strict=True), grads, strict=True)
            )
        ]
        out = cls({}, _envelope(held), _envelope(now), views, _envelope(unbuffered), {})
        out.call_grads = {i: grads[i] for i, _, _ in out.unbuffered}
        kept = {i for env in (out.held, out.now, out.unbuffered) for i, _, _ in env}
        kept |= {i for pair in views.values() for env in pair for i, _, _ in env}
        for i in kept:
            m1, m2 = low.moments[i], high.moments[i]
            if (m1[4] is None) != (m2[4] is None) or [u for u, _ in m1[4] or ()] != [
                u for u, _ in m2[4] or ()
            ]:
                raise _NotExact("a moment's freed scales differ")
            out.moments[i] = (m1, m2)
        return out

    def at(self, b: int, batches: _Batches, scales: dict[str, Any]) -> dict[str, Any]:
        """The stretch's peak fields at ``b`` (``scales``: its ``scales_freed`` template)."""
        win = self._part(_first_most(self.now, b), b, batches)
        held = self._part(_first_most(self.held, b), b, batches)
        freed = dict(win[4])
        i = _first_most(self.unbuffered, b)
        free = self._part(i, b, batches)
        calls = batches.value(*self.call_grads[i], b)
        views = {}
        for unit, (now_env, held_env) in self.views.items():
            v = self._part(_first_most(now_env, b), b, batches)
            h = self._part(_first_most(held_env, b), b, batches)
            views[unit] = [sum(v[:4]), v[0], v[1], v[3], sum(h[:3]), h[0], h[1]]
        return {
            "peak": sum(win[:4]),
            "peak_activations": win[0],
            "peak_forward_temp": win[1],
            "peak_grads": win[3],
            "peak_in_place": [sum(held[:3]), held[0], held[1]],
            "scales_freed": {
                u: [freed.get(u, 0), batches.value(*_ends(v[1]), b)] for u, v in scales.items()
            },
            "param_views_freed": views,
            "peak_unbuffered": [sum(free[:3]) - calls, free[0], free[1]],
        }

    def _part(self, i: int, b: int, batches: _Batches) -> tuple[Any, ...]:
        m1, m2 = self.moments[i]
        freed = [
            (u, batches.value(x, y, b))
            for (u, x), (_, y) in zip(m1[4] or (), m2[4] or (), strict=True)
        ]
        return (*(batches.value(x, y, b) for x, y in zip(m1[:4], m2[:4], strict=True)), freed)


def _ends(v: Any) -> tuple[Any, Any]:
    return (v.low, v.high) if isinstance(v, _Line) else (v, v)


def _first_most(envelope: list[tuple[int, int, int]], b: int) -> int:
    """The index of the first line (by index) with the most at ``b``."""
    best_i, best_v = -1, 0
    for i, s, c in envelope:
        v = s * b + c
        if best_i < 0 or v > best_v:
            best_i, best_v = i, v
    return best_i


def _kernels_at(calls: Any, records: Any, batches: _Batches, b: int) -> list[list[Any]]:
    """A stretch's kernel records at ``b``: its kernels (``calls``, each as the probe counted
    it, or where the trace kept none its ``records``) with those identical there merged
    into the first (counts and bytes summed), as the probe merges them, then its fused
    records."""
    merged: dict[tuple[Any, ...], list[Any]] = {}
    at = _at(records, batches, b)
    fused = [rec for rec in at if rec[0] == "fused"]
    for rec in at if calls is None else _at(calls, batches, b):
        if rec[0] == "fused":
            continue
        key = tuple(rec[:-2])
        have = merged.get(key)
        if have is None:
            merged[key] = rec
        else:
            have[-2] += rec[-2]
            have[-1] += rec[-1]
    return [[*rec[:-2], int(rec[-2]), int(rec[-1])] for rec in merged.values()] + fused


def _kernel_template(
    low: list[list[Any]],
    high: list[list[Any]],
    m1: StretchMoments | None,
    m2: StretchMoments | None,
) -> tuple[Any, Any]:
    """What :func:`_kernels_at` takes of a stretch's kernels: each call's where the traces
    kept them (and the fused records), else the records. The kernels pair call by call,
    each launched as many times at both batches."""
    calls = None
    if m1 is not None and m2 is not None:
        low = [r for r in low if r[0] == "fused"]
        high = [r for r in high if r[0] == "fused"]
        one, two = ([[*key, n, nb] for key, n, nb in m.kernels] for m in (m1, m2))
        calls = _pair(one, two, "calls")
    else:
        one, two = low, high
    if any(r1[-2] != r2[-2] for r1, r2 in zip(one, two, strict=True) if r1[0] != "fused"):
        raise _NotExact("a kernel is launched another number of times")
    return calls, _pair(low, high, "kernels")


class BatchCapture:
    """A report at any micro-batch size from two traces (see the module's docstring):
    :meth:`at`. Made by :func:`batch_capture`."""

    def __init__(self, low: Report, high: Report, b1: int, b2: int) -> None:
        if b1 > b2:  # the lines are weighed as d = b2 - b1 times them: d > 0 keeps the order
            low, high, b1, b2 = high, low, b2, b1
        self._config = low.config
        self._traced = (b1, b2)
        self._batches = _Batches(b1, b2)
        d1, d2 = _unfitted(low), _unfitted(high)
        self._stretches: list[list[tuple[_Peaks | None, Any, Any, Any]]] = []
        self._unbuffered: list[bool] = []  # by iteration: whether peak_unbuffered is measured
        p1, p2 = d1["profile"], d2["profile"]
        assert low.profile is not None and high.profile is not None
        steps = zip(low.profile.iterations, high.profile.iterations, strict=True)
        if len(p1["iterations"]) != len(p2["iterations"]):
            raise _NotExact("other iterations")
        for s1, s2, (it1, it2) in zip(p1["iterations"], p2["iterations"], steps, strict=False):
            rows = []
            if len(it1.moments) != len(it1.peak) or len(it2.moments) != len(it2.peak):
                raise _NotExact("a trace without its moments")
            if (it1.peak_unbuffered is None) != (it2.peak_unbuffered is None):
                raise _NotExact("gradients held for another forward call measured once")
            # (peak_unbuffered weighed by stretch, kept where it is not peak_in_place)
            self._unbuffered.append(it1.peak_unbuffered is not None)
            s1.pop("peak_unbuffered", None)
            s2.pop("peak_unbuffered", None)
            for k, (m1, m2) in enumerate(zip(it1.moments, it2.moments, strict=True)):
                if (m1 is not None and m1.partitioned) or (m2 is not None and m2.partitioned):
                    raise _NotExact("torch's partitioner chose what a compiled region saves")
                fixed = {f: _pair(s1[f][k], s2[f][k], f) for f in _PEAKS}
                u1, u2 = (
                    list((it.peak_unbuffered or {}).get(k, it.peak_in_place[k]))
                    for it in (it1, it2)
                )
                fixed["peak_unbuffered"] = _pair(u1, u2, "peak_unbuffered")
                peaks = None
                if m1 is not None and m2 is not None:
                    peaks = _Peaks.of(m1, m2, self._batches)
                elif any(_has_line(fixed[f]) for f in (*_PEAKS, "peak_unbuffered")):
                    raise _NotExact("a stretch whose peaks change has no moments")
                kernels = _kernel_template(s1["kernels"][k], s2["kernels"][k], m1, m2)
                rows.append((peaks, fixed, kernels, fixed["scales_freed"]))
            self._stretches.append(rows)
            for f in (*_PEAKS, "kernels"):
                s1[f] = s2[f] = None
        self._template = _pair(d1, d2, "report")
        if _has_line(self._template["config"]):
            raise _NotExact("the config differs")
        for b, d in ((b1, _unfitted(low)), (b2, _unfitted(high))):
            if self._dict_at(b) != d:  # the moments must give the trace's own peaks back
                raise _NotExact(f"the moments do not give the peaks traced at {b}")

    def at(self, samples: int) -> Report | None:
        """The report :func:`fsdpviz.analyze` makes at a micro-batch of ``samples``, or None
        where a value would not be whole there (trace it instead)."""
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise ConfigError(f"samples must be a positive int, got {samples!r}")
        if samples == 1 and min(self._traced) > 1:
            return None  # a dim of 1 is torch's special case (see the module's docstring)
        try:
            d = self._dict_at(samples)
        except _NotExact:
            return None
        report = Report.from_dict(d)
        report.config = self._config
        check_fit(report)
        return report

    def _dict_at(self, b: int) -> dict[str, Any]:
        d: dict[str, Any] = _at(self._template, self._batches, b)
        steps = zip(d["profile"]["iterations"], self._stretches, self._unbuffered, strict=True)
        for step, rows, measured in steps:
            for f in (*_PEAKS, "kernels"):
                step[f] = []
            unbuffered = {}
            for k, (peaks, fixed, kernels, scales) in enumerate(rows):
                if peaks is None:
                    values = {f: _at(fixed[f], self._batches, b) for f in fixed}
                else:
                    values = peaks.at(b, self._batches, scales)
                for f in _PEAKS:
                    step[f].append(values[f])
                if values["peak_unbuffered"] != values["peak_in_place"]:
                    unbuffered[str(k)] = values["peak_unbuffered"]
                step["kernels"].append(_kernels_at(kernels[0], kernels[1], self._batches, b))
            if measured:
                step["peak_unbuffered"] = unbuffered
        return d


def batch_capture(low: Report, high: Report, b1: int, b2: int) -> BatchCapture | None:
    """The capture of two traces of one job at micro-batches of ``b1`` and ``b2`` samples
    (made under :func:`~fsdpviz.trace.probe_records.recording_moments`), or None where they
    do not pair exactly (see the module's docstring): then trace each batch.

    Example::

        capture = batch_capture(low, high, 2, 3)
        capture.at(6).to_dict() == fsdpviz.analyze(model, batch_of(6), ...).to_dict()
    """
    if b1 == b2 or min(b1, b2) < 1:
        raise ConfigError(f"two different positive batches are needed, got {b1} and {b2}")
    if not capturable(low) or not capturable(high):
        return None
    try:
        return BatchCapture(low, high, b1, b2)
    except _NotExact:
        return None


def capturable(report: Report) -> bool:
    """Whether ``report`` can be one of a capture's two traces: made under
    :func:`~fsdpviz.trace.probe_records.recording_moments`, no pipeline's (each stage's trace
    is its own), and nothing in it that torch's partitioner chose (a compiled loss's or
    compiled checkpointed region's saves, by their bytes: not affine in the batch)."""
    if report.pipeline is not None or report.profile is None:
        return False
    kept = [m for step in report.profile.iterations for m in step.moments if m is not None]
    return bool(kept) and not any(m.partitioned for m in kept)


def _unfitted(report: Report) -> dict[str, Any]:
    """``report.to_dict()`` without the fit check's warning (made anew at each batch)."""
    d = report.to_dict()
    d["warnings"] = [w for w in d["warnings"] if w.get("code") not in FIT_CODES]
    return d


def _has_line(template: Any) -> bool:
    if isinstance(template, _Line):
        return True
    if isinstance(template, dict):
        return any(_has_line(v) for v in template.values())
    if isinstance(template, list):
        return any(_has_line(v) for v in template)
    return False
