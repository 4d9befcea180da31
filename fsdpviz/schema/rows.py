"""The rows of the time model's result, as typed frozen records: a
:class:`~fsdpviz.schema.timeline.Timeline`'s :class:`TimedEvent` (an event placed in time),
:class:`ComputeStretch`, :class:`HookTime`, :class:`Wait` and :class:`MicroStep`; and
:class:`Row`, what every row shares (the memory model's
:class:`~fsdpviz.schema.memory.MemoryEvent` too). Each writes its JSON with
``to_dict()`` (the keys in the order the results' JSON has always had) and reads it back with
``from_dict()``; each also reads as a mapping (``row["start"]``, ``row.get("bubble", 0.0)``),
as earlier releases' plain dicts did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fsdpviz.schema.serial import OMIT_NONE, Record, key, record_from

Scalar = str | int | float | bool | None
"""A value of a row's JSON (a hook call's ``events`` are a list of event indices)."""


_OR_NONE = key(missing=None)  # older files may lack the key
_OR_ZERO = key(missing=0.0)
_INT = key(read=int)


class Row(Record):
    """Read access by key, as the plain dicts the rows were: ``row["start"]``,
    ``row.get("bubble", 0.0)``, ``"rank" in row``, ``dict(row)``; the keys are those of
    ``to_dict()``, one per field (see :mod:`fsdpviz.schema.serial`)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def keys(self) -> list[str]:
        return list(self.to_dict())


@dataclass(frozen=True, slots=True)
class TimedEvent(Row):
    """One event of the iteration placed in time (see :class:`~fsdpviz.schema.timeline.Timeline`
    for what each field means). ``stage``, ``microbatch`` and ``action`` are a pipeline's
    (None outside one), ``float8_share`` FSDP2's float8 all-gather's, ``bubble`` a pipeline
    receive's wait, ``rank`` the pipeline rank's, ``group`` the event's (``"shard"``: an
    all-reduce of float8 amaxes, no gradient's): each is written only where it is set."""

    index: int = field(metadata=_INT)
    kind: str
    unit: str
    phase: str
    stream: str
    issued: float
    compute_t: float
    start: float
    end: float
    bytes: float
    exposed: float
    hook: str | None = field(metadata=_OR_NONE)
    hook_unit: str | None = field(metadata=_OR_NONE)
    module: str | None = field(metadata=_OR_NONE)
    prefetch: bool = field(metadata=key(read=bool, missing=False))
    rate_limited_s: float = field(metadata=_OR_ZERO)
    held: str = field(metadata=key(missing=""))
    held_by: int = field(metadata=key(read=int, missing=-1))
    stage: int | None = field(default=None, metadata=OMIT_NONE)
    microbatch: int | None = field(default=None, metadata=key(beside="stage"))
    action: str | None = field(default=None, metadata=key(beside="stage"))
    float8_share: float | None = field(default=None, metadata=OMIT_NONE)
    bubble: float | None = field(default=None, metadata=OMIT_NONE)
    rank: int | None = field(default=None, metadata=OMIT_NONE)
    group: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True)
class ComputeStretch(Row):
    """A stretch of compute before hook call ``index`` (``hook`` of ``unit``; ``"end"``
    after the last one): see :class:`~fsdpviz.schema.timeline.Timeline`. ``action``,
    ``stage`` and ``microbatch``: the pipeline action it is part of, ``rank`` the pipeline
    rank's (each written only where set)."""

    hook: str
    unit: str
    index: int = field(metadata=_INT)
    start: float
    end: float
    flops: float
    phase: str
    owner: str
    next_event: int = field(metadata=_INT)
    duration: float = 0.0
    flops_per_s: float = 0.0
    peak_share: float = 0.0
    action: str | None = field(default=None, metadata=OMIT_NONE)
    stage: int | None = field(default=None, metadata=key(beside="action"))
    microbatch: int | None = field(default=None, metadata=key(beside="action"))
    rank: int | None = field(default=None, metadata=OMIT_NONE)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ComputeStretch:
        """Older files lack ``duration``: ``end - start``."""
        return record_from(cls, d, duration=d.get("duration", d["end"] - d["start"]))


@dataclass(frozen=True, slots=True)
class HookTime(Row):
    """A hook call in time: ``t`` when the CPU runs it, ``compute_t`` where the compute
    stream is then, ``events`` the indices it issued; ``rank`` the pipeline rank's."""

    hook: str
    unit: str
    t: float
    compute_t: float
    events: tuple[int, ...] = field(metadata=key(read=lambda es: tuple(int(i) for i in es)))
    rank: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True)
class Wait(Row):
    """A stretch the compute stream waits for event ``event`` (of phase ``phase``): the
    step's ``tail``, or a ``bubble`` (a pipeline receive); ``rank`` the pipeline rank's."""

    start: float
    end: float
    event: int = field(metadata=_INT)
    phase: str
    tail: bool = field(metadata=key(read=bool))
    bubble: bool = field(default=False, metadata=key(omit="empty", read=bool))
    rank: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True)
class StepWork(Row):
    """Compute after the last micro-step, once an optimizer step, on the compute stream:
    ``name`` (``"optimizer"``, the optimizer step; ``"float8_amax"``, torchao's
    ``torch._foreach_norm`` of the float8 weights' shards before their amaxes' all-reduce;
    ``"float8_scales"``, its ``torch.clamp`` and reciprocal after it), ``start`` and ``end``
    (in the time of the step's last micro-step), ``bytes`` (its memory traffic), ``kernels``
    (0 where not counted: the optimizer step's), ``text`` (what it does, in words) and
    ``rank`` the pipeline rank's (written only where set: a pipeline job's timeline holds
    every rank's)."""

    name: str = field(metadata=key(read=str))
    start: float = field(metadata=key(read=float))
    end: float = field(metadata=key(read=float))
    bytes: float = field(metadata=key(read=float))
    kernels: int = field(metadata=_INT)
    text: str = field(metadata=key(read=str))
    rank: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True)
class MicroStep(Row):
    """One micro-step of the optimizer step: ``iteration`` (its index in
    ``report.iterations``), ``start``, ``end``, ``sync`` (whether it reduces gradients) and
    its own sums, which the timeline's ``totals`` add up."""

    iteration: int = field(metadata=_INT)
    start: float
    end: float
    sync: bool = field(metadata=key(read=bool))
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    all_gather_bytes: float
    reduce_scatter_bytes: float
    tp_bytes: float = field(metadata=_OR_ZERO)
    pp_bytes: float = field(metadata=_OR_ZERO)
    bubble_s: float = field(metadata=_OR_ZERO)
    cp_bytes: float = field(metadata=_OR_ZERO)
    exposed_forward_s: float = field(metadata=_OR_ZERO)
    exposed_backward_s: float = field(metadata=_OR_ZERO)
    matmul_s: float = field(metadata=_OR_ZERO)
    attention_s: float = field(metadata=_OR_ZERO)
    memory_bound_s: float = field(metadata=_OR_ZERO)
    copy_s: float = field(metadata=_OR_ZERO)
    cpu_bound_s: float = field(metadata=_OR_ZERO)
    flops_forward: float = field(metadata=_OR_ZERO)
    flops_backward: float = field(metadata=_OR_ZERO)

    def sums(self) -> dict[str, float]:
        """This micro-step's own sums (what ``totals`` adds up: every field after
        ``sync``), in the JSON's order."""
        return {f.name: getattr(self, f.name) for f in fields(self)[4:]}


@dataclass(frozen=True, slots=True)
class Bottleneck(Row):
    """A collective the compute waited for, as :meth:`~fsdpviz.schema.timeline.Timeline.bottlenecks`
    ranks them (see it for each field; ``needed_at`` is None for the step's tail)."""

    unit: str
    kind: str
    phase: str
    exposed_s: float
    share: float
    cause: str
    reason: str
    event: int = field(metadata=_INT)
    hook: str | None = field(metadata=_OR_NONE)
    hook_unit: str | None = field(metadata=_OR_NONE)
    prefetch: bool = field(metadata=key(read=bool, missing=False))
    issued: float
    start: float
    end: float
    duration_s: float
    needed_at: float | None = field(metadata=_OR_NONE)
    tail_s: float = field(metadata=_OR_ZERO)


@dataclass(frozen=True, slots=True)
class Bubble(Row):
    """A wait of the compute for another pipeline rank, as
    :meth:`~fsdpviz.schema.timeline.Timeline.bubbles` ranks them (see it for each field)."""

    rank: int | None = field(metadata=_OR_NONE)
    stage: int = field(metadata=_INT)
    microbatch: int | None = field(metadata=_OR_NONE)
    peer: int = field(metadata=_INT)
    what: str
    waited_s: float
    event: int = field(metadata=_INT)
    action: str | None = field(metadata=_OR_NONE)
    reason: str
