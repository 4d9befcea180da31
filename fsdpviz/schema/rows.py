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
from dataclasses import dataclass
from typing import Any

Scalar = str | int | float | bool | None
"""A value of a row's JSON (a hook call's ``events`` are a list of event indices)."""


class Row:
    """Read access by key, as the plain dicts the rows were: ``row["start"]``,
    ``row.get("bubble", 0.0)``, ``"rank" in row``, ``dict(row)``; the keys are those of
    ``to_dict()``."""

    __slots__ = ()

    def to_dict(self) -> Mapping[str, Scalar | list[int]]:
        raise NotImplementedError

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

    index: int
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
    hook: str | None
    hook_unit: str | None
    module: str | None
    prefetch: bool
    rate_limited_s: float
    held: str
    held_by: int
    stage: int | None = None
    microbatch: int | None = None
    action: str | None = None
    float8_share: float | None = None
    bubble: float | None = None
    rank: int | None = None
    group: str | None = None

    def to_dict(self) -> dict[str, Scalar]:
        d: dict[str, Scalar] = {
            "index": self.index,
            "kind": self.kind,
            "unit": self.unit,
            "phase": self.phase,
            "stream": self.stream,
            "issued": self.issued,
            "compute_t": self.compute_t,
            "start": self.start,
            "end": self.end,
            "bytes": self.bytes,
            "exposed": self.exposed,
            "hook": self.hook,
            "hook_unit": self.hook_unit,
            "module": self.module,
            "prefetch": self.prefetch,
            "rate_limited_s": self.rate_limited_s,
            "held": self.held,
            "held_by": self.held_by,
        }
        if self.stage is not None:
            d.update(stage=self.stage, microbatch=self.microbatch, action=self.action)
        if self.float8_share is not None:
            d["float8_share"] = self.float8_share
        if self.bubble is not None:
            d["bubble"] = self.bubble
        if self.rank is not None:
            d["rank"] = self.rank
        if self.group is not None:
            d["group"] = self.group
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimedEvent:
        return cls(
            index=int(d["index"]),
            kind=d["kind"],
            unit=d["unit"],
            phase=d["phase"],
            stream=d["stream"],
            issued=d["issued"],
            compute_t=d["compute_t"],
            start=d["start"],
            end=d["end"],
            bytes=d["bytes"],
            exposed=d["exposed"],
            hook=d.get("hook"),
            hook_unit=d.get("hook_unit"),
            module=d.get("module"),
            prefetch=bool(d.get("prefetch", False)),
            rate_limited_s=d.get("rate_limited_s", 0.0),
            held=d.get("held", ""),
            held_by=int(d.get("held_by", -1)),
            stage=d.get("stage"),
            microbatch=d.get("microbatch"),
            action=d.get("action"),
            float8_share=d.get("float8_share"),
            bubble=d.get("bubble"),
            rank=d.get("rank"),
            group=d.get("group"),
        )


@dataclass(frozen=True, slots=True)
class ComputeStretch(Row):
    """A stretch of compute before hook call ``index`` (``hook`` of ``unit``; ``"end"``
    after the last one): see :class:`~fsdpviz.schema.timeline.Timeline`. ``action``,
    ``stage`` and ``microbatch``: the pipeline action it is part of, ``rank`` the pipeline
    rank's (each written only where set)."""

    hook: str
    unit: str
    index: int
    start: float
    end: float
    flops: float
    phase: str
    owner: str
    next_event: int
    duration: float = 0.0
    flops_per_s: float = 0.0
    peak_share: float = 0.0
    action: str | None = None
    stage: int | None = None
    microbatch: int | None = None
    rank: int | None = None

    def to_dict(self) -> dict[str, Scalar]:
        d: dict[str, Scalar] = {
            "hook": self.hook,
            "unit": self.unit,
            "index": self.index,
            "start": self.start,
            "end": self.end,
            "flops": self.flops,
            "phase": self.phase,
            "owner": self.owner,
            "next_event": self.next_event,
            "duration": self.duration,
            "flops_per_s": self.flops_per_s,
            "peak_share": self.peak_share,
        }
        if self.action is not None:
            d.update(action=self.action, stage=self.stage, microbatch=self.microbatch)
        if self.rank is not None:
            d["rank"] = self.rank
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ComputeStretch:
        return cls(
            hook=d["hook"],
            unit=d["unit"],
            index=int(d["index"]),
            start=d["start"],
            end=d["end"],
            flops=d["flops"],
            phase=d["phase"],
            owner=d["owner"],
            next_event=int(d["next_event"]),
            duration=d.get("duration", d["end"] - d["start"]),
            flops_per_s=d.get("flops_per_s", 0.0),
            peak_share=d.get("peak_share", 0.0),
            action=d.get("action"),
            stage=d.get("stage"),
            microbatch=d.get("microbatch"),
            rank=d.get("rank"),
        )


@dataclass(frozen=True, slots=True)
class HookTime(Row):
    """A hook call in time: ``t`` when the CPU runs it, ``compute_t`` where the compute
    stream is then, ``events`` the indices it issued; ``rank`` the pipeline rank's."""

    hook: str
    unit: str
    t: float
    compute_t: float
    events: tuple[int, ...]
    rank: int | None = None

    def to_dict(self) -> dict[str, Scalar | list[int]]:
        d: dict[str, Scalar | list[int]] = {
            "hook": self.hook,
            "unit": self.unit,
            "t": self.t,
            "compute_t": self.compute_t,
            "events": list(self.events),
        }
        if self.rank is not None:
            d["rank"] = self.rank
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HookTime:
        return cls(
            hook=d["hook"],
            unit=d["unit"],
            t=d["t"],
            compute_t=d["compute_t"],
            events=tuple(int(i) for i in d["events"]),
            rank=d.get("rank"),
        )


@dataclass(frozen=True, slots=True)
class Wait(Row):
    """A stretch the compute stream waits for event ``event`` (of phase ``phase``): the
    step's ``tail``, or a ``bubble`` (a pipeline receive); ``rank`` the pipeline rank's."""

    start: float
    end: float
    event: int
    phase: str
    tail: bool
    bubble: bool = False
    rank: int | None = None

    def to_dict(self) -> dict[str, Scalar]:
        d: dict[str, Scalar] = {
            "start": self.start,
            "end": self.end,
            "event": self.event,
            "phase": self.phase,
            "tail": self.tail,
        }
        if self.bubble:
            d["bubble"] = True
        if self.rank is not None:
            d["rank"] = self.rank
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Wait:
        return cls(
            start=d["start"],
            end=d["end"],
            event=int(d["event"]),
            phase=d["phase"],
            tail=bool(d["tail"]),
            bubble=bool(d.get("bubble", False)),
            rank=d.get("rank"),
        )


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

    name: str
    start: float
    end: float
    bytes: float
    kernels: int
    text: str
    rank: int | None = None

    def to_dict(self) -> dict[str, Scalar]:
        d: dict[str, Scalar] = {
            "name": self.name,
            "start": self.start,
            "end": self.end,
            "bytes": self.bytes,
            "kernels": self.kernels,
            "text": self.text,
        }
        if self.rank is not None:
            d["rank"] = self.rank
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepWork:
        return cls(
            str(d["name"]), float(d["start"]), float(d["end"]), float(d["bytes"]),
            int(d["kernels"]), str(d["text"]), d.get("rank"),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class MicroStep(Row):
    """One micro-step of the optimizer step: ``iteration`` (its index in
    ``report.iterations``), ``start``, ``end``, ``sync`` (whether it reduces gradients) and
    its own sums, which the timeline's ``totals`` add up."""

    iteration: int
    start: float
    end: float
    sync: bool
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    all_gather_bytes: float
    reduce_scatter_bytes: float
    tp_bytes: float
    pp_bytes: float
    bubble_s: float
    cp_bytes: float
    exposed_forward_s: float
    exposed_backward_s: float
    matmul_s: float
    attention_s: float
    memory_bound_s: float
    copy_s: float
    cpu_bound_s: float
    flops_forward: float
    flops_backward: float

    def to_dict(self) -> dict[str, Scalar]:
        return {
            "iteration": self.iteration,
            "start": self.start,
            "end": self.end,
            "sync": self.sync,
            **self.sums(),
        }

    def sums(self) -> dict[str, float]:
        """This micro-step's own sums (what ``totals`` adds up), in the JSON's order."""
        return {
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "exposed_comm_s": self.exposed_comm_s,
            "all_gather_bytes": self.all_gather_bytes,
            "reduce_scatter_bytes": self.reduce_scatter_bytes,
            "tp_bytes": self.tp_bytes,
            "pp_bytes": self.pp_bytes,
            "bubble_s": self.bubble_s,
            "cp_bytes": self.cp_bytes,
            "exposed_forward_s": self.exposed_forward_s,
            "exposed_backward_s": self.exposed_backward_s,
            "matmul_s": self.matmul_s,
            "attention_s": self.attention_s,
            "memory_bound_s": self.memory_bound_s,
            "copy_s": self.copy_s,
            "cpu_bound_s": self.cpu_bound_s,
            "flops_forward": self.flops_forward,
            "flops_backward": self.flops_backward,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MicroStep:
        return cls(
            iteration=int(d["iteration"]),
            start=d["start"],
            end=d["end"],
            sync=bool(d["sync"]),
            compute_s=d["compute_s"],
            comm_s=d["comm_s"],
            exposed_comm_s=d["exposed_comm_s"],
            all_gather_bytes=d["all_gather_bytes"],
            reduce_scatter_bytes=d["reduce_scatter_bytes"],
            tp_bytes=d.get("tp_bytes", 0.0),
            pp_bytes=d.get("pp_bytes", 0.0),
            bubble_s=d.get("bubble_s", 0.0),
            cp_bytes=d.get("cp_bytes", 0.0),
            exposed_forward_s=d.get("exposed_forward_s", 0.0),
            exposed_backward_s=d.get("exposed_backward_s", 0.0),
            matmul_s=d.get("matmul_s", 0.0),
            attention_s=d.get("attention_s", 0.0),
            memory_bound_s=d.get("memory_bound_s", 0.0),
            copy_s=d.get("copy_s", 0.0),
            cpu_bound_s=d.get("cpu_bound_s", 0.0),
            flops_forward=d.get("flops_forward", 0.0),
            flops_backward=d.get("flops_backward", 0.0),
        )


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
    event: int
    hook: str | None
    hook_unit: str | None
    prefetch: bool
    issued: float
    start: float
    end: float
    duration_s: float
    needed_at: float | None
    tail_s: float

    def to_dict(self) -> dict[str, Scalar]:
        return {
            "unit": self.unit,
            "kind": self.kind,
            "phase": self.phase,
            "exposed_s": self.exposed_s,
            "share": self.share,
            "cause": self.cause,
            "reason": self.reason,
            "event": self.event,
            "hook": self.hook,
            "hook_unit": self.hook_unit,
            "prefetch": self.prefetch,
            "issued": self.issued,
            "start": self.start,
            "end": self.end,
            "duration_s": self.duration_s,
            "needed_at": self.needed_at,
            "tail_s": self.tail_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Bottleneck:
        return cls(
            d["unit"], d["kind"], d["phase"], d["exposed_s"], d["share"], d["cause"],
            d["reason"], int(d["event"]), d.get("hook"), d.get("hook_unit"),
            bool(d.get("prefetch", False)), d["issued"], d["start"], d["end"], d["duration_s"],
            d.get("needed_at"), d.get("tail_s", 0.0),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Bubble(Row):
    """A wait of the compute for another pipeline rank, as
    :meth:`~fsdpviz.schema.timeline.Timeline.bubbles` ranks them (see it for each field)."""

    rank: int | None
    stage: int
    microbatch: int | None
    peer: int
    what: str
    waited_s: float
    event: int
    action: str | None
    reason: str

    def to_dict(self) -> dict[str, Scalar]:
        return {
            "rank": self.rank,
            "stage": self.stage,
            "microbatch": self.microbatch,
            "peer": self.peer,
            "what": self.what,
            "waited_s": self.waited_s,
            "event": self.event,
            "action": self.action,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Bubble:
        return cls(
            d.get("rank"), int(d["stage"]), d.get("microbatch"), int(d["peer"]), d["what"],
            d["waited_s"], int(d["event"]), d.get("action"), d["reason"],
        )  # fmt: skip
