"""What every format reads from a report or a recorded run: ranks, memory, the module tree."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsdpviz.schema.memory import MemoryPeak
from fsdpviz.schema.report import Report

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun


def ranks_of(obj: Report | RecordedRun) -> tuple[list[Report], list[str]]:
    """The reports to draw, one per rank, and their names (``"rank N"``)."""
    from fsdpviz.recording import RecordedRun  # lazy: loads torch, which export does without

    if isinstance(obj, Report):
        rank = obj.config.rank if obj.source == "recording" else None
        return [obj], [f"rank {0 if rank is None else rank}"]
    if isinstance(obj, RecordedRun):
        if not obj.ranks:
            raise ValueError("the recorded run has no ranks: nothing to export")
        ranks = [r.config.rank for r in obj.ranks]
        names = [f"rank {i if r is None else r}" for i, r in enumerate(ranks)]
        return list(obj.ranks), names
    raise TypeError(
        f"cannot export a {type(obj).__name__}; pass a fsdpviz.Report (fsdpviz.analyze, "
        "a recorder's report()) or a fsdpviz.RecordedRun (fsdpviz.load of a recording)"
    )


def memory_summary(report: Report) -> MemoryPeak | None:
    """``report.memory.peak`` (bytes, where, dominant), or ``None`` if it cannot be modelled."""
    try:
        return report.memory.peak.copy()
    except (ValueError, KeyError, IndexError):
        return None
