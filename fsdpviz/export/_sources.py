"""What every format reads from a report or a recorded run: ranks, memory, the module tree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fsdpviz.schema.report import ModuleInfo, Report

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun

AUTO = "auto"
"""``memory="auto"``: the memory model's series (:func:`fsdpviz.cost.memory_series`)."""

MemoryOption = str | Sequence[float] | Callable[[Report], Sequence[float]] | None


def ranks_of(obj: Report | RecordedRun) -> tuple[list[Report], list[str]]:
    """The reports to draw, one per rank, and their names (``"rank N"``)."""
    from fsdpviz.recording import RecordedRun

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


def memory_for(report: Report, iteration: int | None, memory: MemoryOption) -> list[float] | None:
    """Bytes per rank after each shown event of ``report``, or ``None`` for no curve.

    ``memory``: ``"auto"`` (the memory model, :func:`fsdpviz.cost.memory_series`),
    ``None`` (no curve), bytes per event, or a callable ``report -> bytes per event``.
    """
    if memory is None:
        return None
    if isinstance(memory, str):
        if memory != AUTO:
            raise ValueError(
                f"memory={memory!r} is not valid; use 'auto', None, bytes per event, "
                "or a callable report -> bytes per event"
            )
        from fsdpviz.cost import memory_series

        return memory_series(report, iteration=iteration)
    series = memory(report) if callable(memory) else memory
    return [float(v) for v in series]


def memory_summary(report: Report) -> dict[str, Any] | None:
    """``report.memory.peak`` (bytes, where, dominant), or ``None`` if it cannot be modelled."""
    try:
        return dict(report.memory.peak)
    except (ValueError, KeyError, IndexError):
        return None


def with_module_tree(report: Report) -> Report:
    """``report`` itself, or for a recording (which has no module tree) one made of its units.

    Each unit becomes a module under the nearest unit that contains it by FQN, so the
    explorer still shows every unit with its size.
    """
    if report.modules:
        return report
    names = {u.module for u in report.units}
    modules = []
    for u in report.units:
        parent: str | None = None
        if u.module:
            parts = u.module.split(".")
            parent = next(
                (
                    p
                    for p in (".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1))
                    if p in names
                ),
                "" if "" in names else None,
            )
        modules.append(
            ModuleInfo(
                fqn=u.module,
                module_class=u.module_class,
                parent=parent,
                unit=u.module,
                numel=u.numel,
                bytes=u.bytes,
            )
        )
    return replace(report, modules=modules)
