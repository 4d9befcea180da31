"""Traces that differ in the micro-batch alone, for :func:`fsdpviz.tune`: two traced, the
others derived from them (:mod:`fsdpviz.replan.batch_replay`), traced where that is not
exact.

A family is a trace key but its micro-batch, and the replayed knobs' values its traces are
made with (a trace is the plan of the configuration it is made for, so each derived one is
the trace of its own). Its first two traces at 2 samples or more make its capture (one of 1
sample is always traced: a dim of size 1 is torch's own case)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdpviz.replan.batch_replay import BatchCapture, batch_capture
from fsdpviz.schema.report import Report

__all__ = ["BatchFamilies"]


@dataclass
class _Family:
    key: tuple[Any, ...]
    changes: dict[str, Any]
    bases: list[tuple[int, Report]] = field(default_factory=list)
    capture: BatchCapture | None = None
    refused: bool = False  # the bases do not pair: every batch traced
    planned: set[int] = field(default_factory=set)  # batches being traced side by side


class BatchFamilies:
    """The families of one search (see the module's docstring)."""

    def __init__(self) -> None:
        self._families: list[_Family] = []

    def _family(self, key: tuple[Any, ...], changes: dict[str, Any]) -> _Family:
        for f in self._families:
            if f.key == key and _same(f.changes, changes):
                return f
        self._families.append(_Family(key, changes))
        return self._families[-1]

    def derived(self, key: tuple[Any, ...], changes: dict[str, Any], samples: int) -> Report | None:
        """The trace at ``samples`` of the family, derived (None: not two traces of it yet,
        or not exact: trace it, and hand it to :meth:`traced`)."""
        f = self._family(key, changes)
        if f.capture is None and not f.refused and len(f.bases) >= 2:
            (b1, low), (b2, high) = f.bases[:2]
            f.capture = batch_capture(low, high, b1, b2)
            f.refused = f.capture is None
            for _, report in f.bases:  # the capture keeps what it needs of them
                _forget_moments(report)
            f.bases.clear()
        return None if f.capture is None else f.capture.at(samples)

    def traced(
        self, key: tuple[Any, ...], changes: dict[str, Any], samples: int, report: Report
    ) -> None:
        """Keep the trace ``report`` at ``samples`` for the family's capture while it
        needs one; else let go of its moments."""
        f = self._family(key, changes)
        wanted = f.capture is None and not f.refused and len(f.bases) < 2
        if wanted and samples >= 2 and all(b != samples for b, _ in f.bases):
            f.bases.append((samples, report))
            return
        _forget_moments(report)

    def wanted(self, key: tuple[Any, ...], changes: dict[str, Any], samples: int) -> bool:
        """Whether a trace at ``samples`` is wanted ahead (traced side by side): one the
        family's capture takes, or one it cannot derive; each batch it takes is noted as
        planned."""
        f = self._family(key, changes)
        if f.refused or samples < 2:
            return True
        if f.capture is not None:
            return False
        taken = {b for b, _ in f.bases} | f.planned
        if samples in taken or len(taken) < 2:
            f.planned.add(samples)
            return True
        return False


def _forget_moments(report: Report) -> None:
    """Let go of the moments a trace kept (``recording_moments``)."""
    for step in report.profile.iterations if report.profile is not None else []:
        step.moments = []


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a keyword without a plain ==
        return False
