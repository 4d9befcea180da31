"""What the time model keeps while it walks one micro-step, grouped by what it is.

:class:`~fsdpviz.cost.time_sim.MicroStepSim` holds one of each: when every stream is free
(:class:`Clocks`), what the next compute stretch waits for (:class:`Gate`), the
process groups' sizes and places (:class:`Ranks`), the collectives' results the compute
waits for (:class:`Arrivals`), FSDP1's rate limiter (:class:`RateLimiter`), FSDP2's
copy-out (:class:`CopyOut`) and post-forward mesh (:class:`PostForward`), CPU offload's
copies (:class:`Offload`), the micro-step's sums (:class:`Tally`), and each event's timing
while the walk places it (:class:`EventTiming`, a :class:`~fsdpviz.schema.rows.TimedEvent`
once placed). Times are seconds from the micro-step's start; a "record" is an index into the
simulation's event records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdpviz.cost.topology import Span
from fsdpviz.schema.events import Event
from fsdpviz.schema.rows import TimedEvent


@dataclass(slots=True)
class Clocks:
    """When each stream has finished what it was given so far (and the CPU has issued it).

    Attributes:
        cpu: when the CPU has issued the kernels (and collectives) so far.
        compute: the compute stream.
        comm: the communication stream (FSDP's collectives, one at a time).
        copy: CPU offload's host-device copy stream.
        tp: tensor parallelism's collectives.
        cp: context parallelism's ring collectives.
        pp: pipeline parallelism's sends, one at a time.
        comm_last: the record of the event last run on the communication stream (-1: none).
    """

    cpu: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    copy: float = 0.0
    tp: float = 0.0
    cp: float = 0.0
    pp: float = 0.0
    comm_last: int = -1


@dataclass(slots=True)
class Gate:
    """What the next compute stretch waits for: it starts no earlier than ``until``; the
    time that adds is exposed, charged to record ``by`` (None: nothing to wait for)."""

    until: float = 0.0
    by: int | None = None


@dataclass(slots=True)
class Ranks:
    """The process groups each collective runs over: their sizes and where the mesh puts
    them on the machine's nodes.

    Attributes:
        shard: the ranks an all-gather or reduce-scatter runs over.
        replicas: hybrid sharding's replicas (the all-reduce across them).
        tp: the tensor-parallel group.
        cp: the context-parallel group.
        process_group: FSDP's process group (``NO_SHARD``'s all-reduce).
        spans: each mesh role's :class:`~fsdpviz.cost.topology.Span` on the nodes.
    """

    shard: int
    replicas: int
    tp: int
    cp: int
    process_group: int
    spans: dict[str, Span]


@dataclass(slots=True)
class Arrivals:
    """Collectives' results the compute waits for, each as ``(end, record)``.

    Attributes:
        all_gathers: each unit's last all-gather (a unit's pre-hook waits for it).
        ring: ring attention's last collective of each kind (``all_gather`` of the keys
            and values, ``all_to_all`` of their gradients), waited for at the ring's wait.
        received: pipeline parallelism's receives by ``(F|B, stage, microbatch)``, waited
            for by the action that uses them.
    """

    all_gathers: dict[str, tuple[float, int]] = field(default_factory=dict)
    ring: dict[str, tuple[float, int]] = field(default_factory=dict)
    received: dict[tuple[str, int, int], tuple[float, int]] = field(default_factory=dict)


@dataclass(slots=True)
class RateLimiter:
    """FSDP1's ``limit_all_gathers``: an all-gather is issued only once the compute stream
    has passed the ``free`` two frees back; the CPU blocks until then.

    Attributes:
        enabled: on (FSDP1 with ``limit_all_gathers``; FSDP2 has none).
        frees: the compute stream's time at each free not yet waited for.
        free_events: their records.
        limited_by: the record of the free the limiter last waited for (-1: none).
    """

    enabled: bool
    frees: list[float] = field(default_factory=list)
    free_events: list[int] = field(default_factory=list)
    limited_by: int = -1


@dataclass(slots=True)
class CopyOut:
    """FSDP2's copy-out of the gathered parameters from the all-gather buffer, on the
    compute stream when a unit is first needed; the next all-gather waits for it.

    Attributes:
        gathered: per unit, the gathered bytes not yet copied out.
        pending_s: copy-out time the next compute stretch runs first.
        last_wait: when the last copy-out can run (the next all-gather's earliest start).
        last_wait_event: the record of the all-gather whose copy-out set ``last_wait``.
    """

    gathered: dict[str, float] = field(default_factory=dict)
    pending_s: float = 0.0
    last_wait: float = 0.0
    last_wait_event: int = -1


@dataclass(slots=True)
class PostForward:
    """FSDP2's resharding to fewer ranks after forward (``ReportConfig.post_forward_ranks``):
    a unit freed after forward keeps a shard over them, and its backward all-gather runs
    over them.

    Attributes:
        ranks: per unit resharded so, the ranks of its post-forward mesh.
        resharded: the units resharded to it now (until their backward all-gather).
    """

    ranks: dict[str, int]
    resharded: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Offload:
    """CPU offload's copies of a shard to the device (``h2d``), which its all-gather waits
    for.

    Attributes:
        h2d_done: per unit, when its copy ends.
        h2d_event: per unit, that copy's record.
    """

    h2d_done: dict[str, float] = field(default_factory=dict)
    h2d_event: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Tally:
    """What the micro-step adds up as it goes (see ``MicroStepSim.own_totals``).

    Attributes:
        compute_s: the compute stream's busy time.
        flops_forward: one rank's forward FLOPs.
        flops_backward: one rank's backward FLOPs (recomputation included).
        by_kind: the compute's time by what bounds it (``matmul``, ``attention``,
            ``memory``, ``copy``: FSDP2's copy-out, ``cpu``: the CPU's issue).
        bytes: bytes moved by each kind of collective or copy.
        float32_matmuls: a matrix multiply ran in float32.
        fused_measured: the trace recorded fused regions (compile).
    """

    compute_s: float = 0.0
    flops_forward: float = 0.0
    flops_backward: float = 0.0
    by_kind: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("matmul", "attention", "memory", "copy", "cpu"), 0.0)
    )
    bytes: dict[str, float] = field(default_factory=dict)
    float32_matmuls: bool = False
    fused_measured: bool = False


__all__ = [
    "Arrivals",
    "Clocks",
    "CopyOut",
    "Gate",
    "Offload",
    "PostForward",
    "Ranks",
    "RateLimiter",
    "Tally",
]


@dataclass(slots=True)
class EventTiming:
    """Event ``index`` (``event``) while the walk places it: what
    :class:`~fsdpviz.schema.rows.TimedEvent` holds (see it for each field), changed as
    the streams run it and as the compute waits for it; :meth:`placed` freezes it."""

    index: int
    event: Event
    stream: str
    issued: float
    compute_t: float
    start: float
    end: float
    bytes: float = 0.0
    exposed: float = 0.0
    rate_limited_s: float = 0.0
    held: str = ""
    held_by: int = -1
    float8_share: float | None = None
    bubble: float | None = None

    def placed(self) -> TimedEvent:
        e = self.event
        return TimedEvent(
            index=self.index,
            kind=e.kind,
            unit=e.unit,
            phase=e.phase,
            stream=self.stream,
            issued=self.issued,
            compute_t=self.compute_t,
            start=self.start,
            end=self.end,
            bytes=self.bytes,
            exposed=self.exposed,
            hook=e.hook,
            hook_unit=e.hook_unit,
            module=e.module,
            prefetch=e.prefetch,
            rate_limited_s=self.rate_limited_s,
            held=self.held,
            held_by=self.held_by,
            stage=e.stage,
            microbatch=e.microbatch,
            action=e.action,
            float8_share=self.float8_share,
            bubble=self.bubble,
            group=e.group,
        )
