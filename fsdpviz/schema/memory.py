"""The memory model's result: :class:`MemoryReport`, bytes per rank at every event
(:class:`MemoryEvent`).

What each category counts is documented in :mod:`fsdpviz.cost.memory`, which computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict

from fsdpviz.schema.names import some_names
from fsdpviz.schema.rows import Row, Scalar
from fsdpviz.schema.serial import by_name, each, key, record_from
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

# The caching allocator's pools, one per stream that allocates (see fsdpviz.cost.memory):
# the compute stream's, then FSDP's own streams'.
POOLS = ("compute", "all_gather", "pre_unshard", "reduce_scatter", "all_reduce")


class Moment(NamedTuple):
    """One look at the bytes in use (see :func:`fsdpviz.cost.memory.memory_lane`).

    ``kind``: ``"compute"`` (the most reached during the compute before hook call
    ``call``), ``"event"`` (at event ``event``, issued by hook call ``call``) or ``"hook"``
    (at hook call ``call``: the copy-out of an all-gather, the final callback).
    ``before``: the event it precedes or happens in (the event count after the last one);
    ``where``: in words, as ``MemoryReport.peak["where"]``.
    ``bytes``: per category, in :data:`CATEGORIES` order.
    ``pools``: the same bytes by the stream whose pool of the caching allocator holds them,
    in :data:`POOLS` order (see :mod:`fsdpviz.cost.memory`).
    """

    kind: str
    call: int
    event: int
    before: int
    where: str
    bytes: tuple[int, ...]
    pools: tuple[int, ...]


_INT = key(read=int)
_BYTES = key(read=int, missing=0)  # a category older files lack: none of it
_DICT = key(read=dict)


@dataclass(frozen=True, slots=True)
class MemoryEvent(Row):
    """The bytes per rank after one event (see :class:`~fsdpviz.schema.memory.MemoryReport`):
    the event (``index``, ``kind``, ``unit``, ``phase``, ``hook``, ``hook_unit``), the bytes
    of each memory category after it (``CATEGORIES``: one field each), their ``total`` and
    ``peak_before`` (the most reached since the previous event, compute included)."""

    index: int = field(metadata=_INT)
    kind: str
    unit: str
    phase: str
    hook: str | None = field(metadata=key(missing=None))
    hook_unit: str | None = field(metadata=key(missing=None))
    sharded_params: int = field(metadata=_BYTES)
    unsharded_params: int = field(metadata=_BYTES)
    all_gather: int = field(metadata=_BYTES)
    unsharded_grads: int = field(metadata=_BYTES)
    reduce_scatter: int = field(metadata=_BYTES)
    sharded_grads: int = field(metadata=_BYTES)
    activations: int = field(metadata=_BYTES)
    forward_temp: int = field(metadata=_BYTES)
    backward_temp: int = field(metadata=_BYTES)
    optimizer: int = field(metadata=_BYTES)
    inputs: int = field(metadata=_BYTES)
    buffers: int = field(metadata=_BYTES)
    total: int = field(metadata=_INT)
    peak_before: int = field(metadata=_INT)

    def breakdown(self) -> dict[str, int]:
        """The bytes per category, in ``CATEGORIES`` order."""
        return {k: getattr(self, k) for k in CATEGORIES}

    @classmethod
    def of(
        cls,
        index: int,
        event: tuple[str, str, str, str | None, str | None],
        bytes_by_category: Mapping[str, int],
        total: int,
        peak_before: int,
    ) -> MemoryEvent:
        """The row of event ``index`` (``event``: its kind, unit, phase, hook and hook
        unit) with ``bytes_by_category`` (every category of ``CATEGORIES``)."""
        kind, unit, phase, hook, hook_unit = event
        b = bytes_by_category
        return cls(
            index, kind, unit, phase, hook, hook_unit,
            b["sharded_params"], b["unsharded_params"], b["all_gather"], b["unsharded_grads"],
            b["reduce_scatter"], b["sharded_grads"], b["activations"], b["forward_temp"],
            b["backward_temp"], b["optimizer"], b["inputs"], b["buffers"],
            total, peak_before,
        )  # fmt: skip


class MemoryPeak(TypedDict, total=False):
    """``MemoryReport.peak``: its ``bytes``; ``event``, the index of the event it precedes or
    happens in; ``moment``, its index in ``moments``; ``where`` in words; ``breakdown``, the
    bytes per category then; ``dominant``, the largest category (None without categories).
    A pipeline's also names its ``pp_rank``; a memory lane's its ``iteration``."""

    bytes: int
    event: int
    moment: int
    where: str
    breakdown: dict[str, int]
    dominant: str | None
    pp_rank: int | None
    iteration: int


class MemoryConfig(TypedDict, total=False):
    """``MemoryReport.config``: what was modelled (the plan's ``api`` and ``world_size``, the
    ``optimizer``, the ``iteration``, its ``parameters`` and how many are ``trainable``); a
    pipeline's also names the rank it is (``pp_rank``) and every rank's peak
    (``pp_peaks``); ``ignored``, where FSDP leaves parameters whole on every rank
    (``Report.ignored_params``), their bytes by FQN."""

    api: str
    world_size: int | None
    optimizer: str | int | None
    iteration: int
    parameters: int
    trainable: int
    pp_rank: int | None
    pp_peaks: list[int]
    ignored: dict[str, int]


class Reserved(TypedDict, total=False):
    """``MemoryReport.reserved``: the caching allocator's peak reserved ``bytes`` and each
    stream's pool at its own peak (``compute``, ``all_gather``, ``reduce_scatter``, and
    ``pre_unshard`` or ``all_reduce`` where those streams allocate; see :data:`POOLS` and
    :mod:`fsdpviz.cost.memory`)."""

    bytes: int
    pools: dict[str, int]


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
    Will it fit: ``capacity`` (the machine's device memory), ``overhead`` (what the CUDA
    context and NCCL take of it), ``fits``, ``headroom`` and ``fit_text()``.

    Example::

        mem = fsdpviz.cost.memory_model(report, optimizer="adamw")
        mem.peak["bytes"] / 2**30, mem.peak["dominant"]
        mem.fits, mem.headroom / 2**30  # on the report's machine (default: H100 80GB)
        mem.arrays()["total"]          # per event, ready to plot
        mem.to_pandas()                # needs pandas
    """

    config: MemoryConfig = field(metadata=_DICT)
    events: list[MemoryEvent] = field(metadata=key(read=each(MemoryEvent.from_dict)))
    peak: MemoryPeak = field(metadata=_DICT)
    unit_peaks: dict[str, dict[str, int]] = field(metadata=key(read=by_name(dict)))
    notes: list[str] = field(default_factory=list, metadata=key(read=list))
    moments: list[Moment] = field(default_factory=list, repr=False, metadata=key(saved=False))
    """Every moment the model looked at the bytes in use (see :func:`fsdpviz.cost.memory_lane`)."""
    reserved: Reserved = field(default_factory=Reserved, metadata=_DICT)
    """The caching allocator's peak reserved memory, estimated: ``bytes`` and ``pools``
    (each stream's own peak, see :class:`Reserved`)."""
    capacity: int = field(default=0, metadata=_INT)
    """Bytes of device memory of the modelled machine (``Machine.memory_gib``)."""
    overhead: int = field(default=0, metadata=_INT)
    """Bytes of it the CUDA context and NCCL take, which tensors cannot use (see
    :func:`fsdpviz.cost.fit.runtime_overhead`)."""
    machine: str = field(default="", metadata=key(read=str))
    """The modelled machine's name (``"H100 SXM 80GB"``)."""

    @property
    def usable(self) -> int:
        """Bytes left for tensors: ``capacity`` less ``overhead``."""
        return self.capacity - self.overhead

    @property
    def needed(self) -> int:
        """What the step needs of it: the peak allocated, or the reserved estimate when
        that is larger (the allocator holds what it reserved)."""
        return max(int(self.peak.get("bytes", 0)), int(self.reserved.get("bytes", 0)))

    @property
    def headroom(self) -> int:
        """Bytes left over at the peak: ``usable - needed`` (negative: short by that much)."""
        return self.usable - self.needed

    @property
    def fits(self) -> bool:
        """Whether the peak allocated and the reserved estimate both fit in ``usable``."""
        return self.capacity > 0 and self.headroom >= 0

    def fit_text(self) -> str:
        """The answer in words: ``"fits in H100 SXM 80GB: needs 12.3 GiB of 78.5 GiB (66.2
        GiB headroom)"`` or ``"does not fit in ...: needs 182 GiB ..."``."""
        if self.capacity <= 0:
            return "fit not checked: no device memory given"
        need = size_text(self.needed)
        of = (
            f"{size_text(self.usable)} usable ({size_text(self.capacity)} less "
            f"{size_text(self.overhead)} for the CUDA context and NCCL)"
        )
        what = "reserved" if self.needed > int(self.peak.get("bytes", 0)) else "peak"
        if self.fits:
            return (
                f"fits in {self.machine}: needs {need} ({what}) of {of}, "
                f"{size_text(self.headroom)} headroom"
            )
        return (
            f"does not fit in {self.machine}: needs {need} ({what}) of {of}, "
            f"{size_text(-self.headroom)} short"
        )

    def records(self) -> list[dict[str, Scalar]]:
        """One plain dict per event (what :meth:`to_pandas` shows)."""
        return [r.to_dict() for r in self.events]

    def arrays(self) -> dict[str, list[int]]:
        """``{category: [bytes per event]}`` plus ``total`` and ``peak_before``."""
        rows = [r.breakdown() for r in self.events]
        arrays = {k: [int(b[k]) for b in rows] for k in CATEGORIES}
        arrays["total"] = [int(r.total) for r in self.events]
        arrays["peak_before"] = [int(r.peak_before) for r in self.events]
        return arrays

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
            "capacity": self.capacity,
            "overhead": self.overhead,
            "machine": self.machine,
            "fits": self.fits,
            "headroom": self.headroom,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryReport:
        """A memory report back from its :meth:`to_dict` JSON (without ``moments``, which the
        JSON does not hold; its derived keys skipped)."""
        return record_from(cls, d)

    def summary(self) -> str:
        p = self.peak
        parts = ", ".join(f"{k} {size_text(v)}" for k, v in p["breakdown"].items() if v)
        peak = size_text(p["bytes"])
        text = f"peak {peak} per rank {p['where']}; dominated by {p['dominant']} ({parts})"
        trainable = self.trainable_text()
        if trainable:
            text += f"\n{trainable}: optimizer state and gradients of those"
        ignored = self.ignored_text()
        if ignored:
            text += "\n" + ignored
        return text + "\n" + self.fit_text() if self.capacity > 0 else text

    def trainable_text(self) -> str:
        """``"57,344 trainable of 2,943,232 parameters (1.95%)"`` where some are frozen (the
        optimizer state and gradients are of those), else ``""``."""
        total = int(self.config.get("parameters", 0))
        return trainable_text(int(self.config.get("trainable", total)), total)

    def ignored_text(self) -> str:
        """The parameters FSDP does not manage, whole on every rank, and where they are
        counted; ``""`` without any."""
        ignored = self.config.get("ignored") or {}
        if not ignored:
            return ""
        names = some_names([f"{k} ({size_text(v)})" for k, v in ignored.items()], 4)
        return (
            f"not managed by FSDP, whole on every rank: {names}; in sharded_params, their "
            "gradients in unsharded_grads (to the optimizer step), their states in optimizer"
        )

    def __repr__(self) -> str:
        return f"MemoryReport({self.summary()})"


def trainable_text(trainable: int, total: int) -> str:
    """``"57,344 trainable of 2,943,232 parameters (1.95%)"``; ``""`` when all train."""
    if trainable >= total:
        return ""
    return f"{trainable:,} trainable of {total:,} parameters ({100 * trainable / total:.3g}%)"


def size_text(n: float) -> str:
    """Bytes as fsdpviz writes them everywhere (summaries, the card, warnings, the command
    line, the views, the page): three significant figures in binary units, ``"78.5 GiB"``,
    ``"182 GiB"``, ``"34 MiB"``, ``"1.5 KiB"``, ``"16 B"``, ``"-512 MiB"``; the front end's
    ``formatBytes`` writes the same."""
    value = float(n)
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or suffix == "TiB":
            if suffix == "B":
                return f"{value:.0f} B"
            text = f"{value:.3g}"
            return f"{value:.0f} {suffix}" if "e" in text else f"{text} {suffix}"
        value /= 1024
    raise AssertionError("unreachable")
