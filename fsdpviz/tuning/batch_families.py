"""Traces that differ in the micro-batch alone, for :func:`fsdpviz.tune`: two traced, the
others derived from them (:mod:`fsdpviz.replan.batch_replay`), traced where that is not
exact.

A family is a trace key but its micro-batch. Its first trace at 2 samples or more leads:
the family's next one is made with the lead's values of the replayed knobs (the mesh,
resharding; FSDP1's backward prefetch), whatever the configuration that asks for it, so
that the two pair; their capture then gives the family's trace at any other micro-batch,
made with those values, which tune replays to each configuration's own as it replays any
trace of a key. A trace of 1 sample is always the configuration's own (a dim of size 1 is
torch's own case: never derived)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdpviz.replan.batch_replay import BatchCapture, batch_capture, capturable
from fsdpviz.schema.report import Report
from fsdpviz.tuning.retune import same_changes
from fsdpviz.tuning.space import TuneKwargs

__all__ = ["BatchFamilies"]


@dataclass
class _Family:
    changes: TuneKwargs | None = None  # the lead's replayed knobs (its trace keywords)
    lead: Any = None  # the lead's configuration
    bases: list[tuple[int, Report]] = field(default_factory=list)
    capture: BatchCapture | None = None
    refused: bool = False  # the bases do not pair: every batch traced as asked
    planned: set[int] = field(default_factory=set)  # batches being traced side by side
    # the capture's reports by batch (None: not exact), each until derived() hands it out
    made: dict[int, Report | None] = field(default_factory=dict)

    def open(self) -> bool:
        """Whether the family still takes traces for its capture."""
        return self.capture is None and not self.refused and len(self.bases) < 2


class BatchFamilies:
    """The families of one search (see the module's docstring), by trace key but the
    micro-batch."""

    def __init__(self) -> None:
        self._families: dict[tuple[Any, ...], _Family] = {}

    def derived(self, key: tuple[Any, ...], samples: int) -> tuple[Report, TuneKwargs] | None:
        """The family's trace at ``samples`` and the replayed knobs' keywords it is made with
        (the lead's), derived; None: not two traces of it yet, or not exact (trace it)."""
        changes = self.derivable(key, samples)
        if changes is None:
            return None
        made = self._families[key].made.pop(samples)  # (the caller's now: reports change)
        assert made is not None
        return made, changes

    def derivable(self, key: tuple[Any, ...], samples: int) -> TuneKwargs | None:
        """The replayed knobs' keywords of the family's trace at ``samples`` where
        :meth:`derived` gives it (the lead's); None where it does not. The trace is made
        once: kept for :meth:`derived`."""
        f = self._families.setdefault(key, _Family())
        if f.capture is None and not f.refused and len(f.bases) >= 2:
            (b1, low), (b2, high) = f.bases[:2]
            f.capture = batch_capture(low, high, b1, b2)
            f.refused = f.capture is None
            for _, report in f.bases:  # the capture keeps what it needs of them
                _forget_moments(report)
            f.bases.clear()
        if f.capture is None or f.changes is None:
            return None
        if samples not in f.made:
            f.made[samples] = f.capture.at(samples)
        return None if f.made[samples] is None else f.changes

    def lead(self, key: tuple[Any, ...], samples: int) -> Any:
        """The configuration whose replayed knobs a trace at ``samples`` takes, so that it
        pairs with the family's first (None: the configuration's own)."""
        f = self._families.setdefault(key, _Family())
        taken = {b for b, _ in f.bases}
        return f.lead if f.open() and samples >= 2 and samples not in taken else None

    def traced(
        self,
        key: tuple[Any, ...],
        changes: TuneKwargs,
        config: Any,
        samples: int,
        report: Report,
    ) -> None:
        """Keep the trace ``report`` at ``samples`` (of ``config``, with the replayed knobs'
        keywords ``changes``) for the family's capture while it needs one; else let go of
        its moments."""
        f = self._families.setdefault(key, _Family())
        if f.open() and samples >= 2 and not capturable(report):
            f.refused = True  # (torch's partitioner chose its saves: every batch traced)
        fresh = samples >= 2 and all(b != samples for b, _ in f.bases)
        if f.open() and fresh and (f.changes is None or same_changes(f.changes, changes)):
            if f.changes is None:
                f.changes, f.lead = changes, config
            f.bases.append((samples, report))
            return
        _forget_moments(report)

    def wanted(self, key: tuple[Any, ...], samples: int) -> bool:
        """Whether a trace at ``samples`` is wanted ahead (traced side by side, as the
        configuration's own): one of 1 sample, one the family cannot derive, or its lead
        (noted as planned); its second is made when evaluated (with the lead's values)."""
        f = self._families.setdefault(key, _Family())
        if f.refused or samples < 2:
            return True
        if f.capture is not None or f.bases or (f.planned and samples not in f.planned):
            return False
        f.planned.add(samples)
        return True


def _forget_moments(report: Report) -> None:
    """Let go of the moments a trace kept (``recording_moments``)."""
    for step in report.profile.iterations if report.profile is not None else []:
        step.moments = []
