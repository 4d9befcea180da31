"""The memory model's result: :class:`MemoryReport`, bytes per rank at every event.

What each category counts is documented in :mod:`fsdpviz.cost.memory`, which computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fsdpviz.schema.tables import dataframe

# Memory categories of the model, in the order reports show them (see fsdpviz.cost.memory).
CATEGORIES = (
    "sharded_params",
    "unsharded_params",
    "all_gather",
    "unsharded_grads",
    "reduce_scatter",
    "sharded_grads",
    "activations",
    "forward_temp",
    "backward_temp",
    "optimizer",
    "inputs",
    "buffers",
)


class Moment(NamedTuple):
    """One look at the bytes in use (see :func:`fsdpviz.cost.memory.memory_lane`).

    ``kind``: ``"compute"`` (the most reached during the compute before hook call
    ``call``), ``"event"`` (at event ``event``, issued by hook call ``call``) or ``"hook"``
    (at hook call ``call``: the copy-out of an all-gather, the final callback).
    ``before``: the event it precedes or happens in (the event count after the last one);
    ``where``: in words, as ``MemoryReport.peak["where"]``.
    ``bytes``: per category, in :data:`CATEGORIES` order.
    """

    kind: str
    call: int
    event: int
    before: int
    where: str
    bytes: tuple[int, ...]


@dataclass
class MemoryReport:
    """Memory per rank at each event of one iteration, and its peak.

    ``events``: one record per event (``index``, ``kind``, ``unit``, ``phase``,
    ``hook``, ``hook_unit``, bytes per category after the event, ``total``, and
    ``peak_before``: the most reached since the previous event, compute
    included). ``peak``: ``bytes``, ``event`` (index of the event it precedes or
    happens in), ``where``, ``breakdown`` and ``dominant`` (the largest category).
    ``unit_peaks``: ``{unit: {"forward": bytes, "backward": bytes}}``, the most
    reached while the unit's forward / backward ran (FSDPMemTracker's per-module peaks).
    ``moments``: every point the model looked at the bytes in use, the peak among them
    (``peak["moment"]``); :func:`fsdpviz.cost.memory_lane` gives them as the timeline draws them.

    Example::

        mem = fsdpviz.cost.memory_model(report, optimizer="adamw")
        mem.peak["bytes"] / 2**30, mem.peak["dominant"]
        mem.arrays()["total"]          # per event, ready to plot
        mem.to_pandas()                # needs pandas
    """

    config: dict[str, Any]
    events: list[dict[str, Any]]
    peak: dict[str, Any]
    unit_peaks: dict[str, dict[str, int]]
    notes: list[str] = field(default_factory=list)
    moments: list[Moment] = field(default_factory=list, repr=False)
    """Every moment the model looked at the bytes in use (see :func:`fsdpviz.cost.memory_lane`)."""
    reserved: dict[str, Any] = field(default_factory=dict)
    """The caching allocator's peak reserved memory, estimated: ``bytes`` and ``pools``
    (``compute``, ``all_gather``, ``reduce_scatter``: each stream's own peak)."""

    def records(self) -> list[dict[str, Any]]:
        """One plain dict per event (what :meth:`to_pandas` shows)."""
        return [dict(r) for r in self.events]

    def arrays(self) -> dict[str, list[int]]:
        """``{category: [bytes per event]}`` plus ``total`` and ``peak_before``."""
        keys = [*CATEGORIES, "total", "peak_before"]
        return {k: [int(r[k]) for r in self.events] for k in keys}

    def to_pandas(self) -> Any:
        """The records as a ``pandas.DataFrame`` (needs pandas)."""
        return dataframe(self.records())

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": dict(self.config),
            "categories": list(CATEGORIES),
            "events": self.records(),
            "peak": dict(self.peak),
            "unit_peaks": {k: dict(v) for k, v in self.unit_peaks.items()},
            "notes": list(self.notes),
            "reserved": {**self.reserved, "pools": dict(self.reserved.get("pools", {}))},
        }

    def summary(self) -> str:
        p = self.peak
        parts = ", ".join(f"{k} {gib_text(v)}" for k, v in p["breakdown"].items() if v)
        peak = gib_text(p["bytes"])
        return f"peak {peak} per rank {p['where']}; dominated by {p['dominant']} ({parts})"

    def __repr__(self) -> str:
        return f"MemoryReport({self.summary()})"


def gib_text(n: float) -> str:
    """Bytes as the memory summary writes them: ``"1.50 GiB"``, ``"23.9 MiB"``, ``"4.0 KiB"``."""
    if n >= 2**28:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
