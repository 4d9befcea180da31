"""Estimated duration of every event, and how much communication compute hides.

The model replays one iteration's :mod:`tape <fsdpviz.cost.hook_calls>` on two streams
of a :class:`~fsdpviz.cost.hardware.Machine`:

- the **compute** stream runs the compute measured before each hook call, in
  order (FLOPs from the trace). The compute after a unit's pre-forward or
  pre-backward hook waits until that unit's last all-gather has finished; the
  time it waits is *exposed* communication, charged to that all-gather.
- the **communication** stream runs the collectives one at a time, in issue
  order. The CPU runs ahead of the GPU, so an all-gather may start before the
  hook that issued it is reached on the compute stream, as far as FSDP lets it:
  FSDP1 with ``limit_all_gathers`` (the default) waits for the compute stream to
  pass the ``free`` two frees back (its rate limiter); FSDP2 waits for the
  copy-out of the previous all-gather (the compute stream reaching the hook that
  used it). A reduce-scatter starts once the compute before its post-backward
  hook is done. ``free`` events take no time on the compute stream.

The iteration ends when both streams are done (the final callback waits for
the last reduce-scatter); ``exposed_comm`` also counts that last wait. With an
optimizer, its step is added as a memory-bound pass over the shards (on the host under CPU
offload). CPU offload's ``h2d`` copies (a shard to the device; its all-gather waits for it)
and ``d2h`` copies (a gradient shard back, after its reduction) run one at a time on a
copy stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.hook_calls import iteration_index, tape
from fsdpviz.cost.sizes import itemsize, optimizer_states
from fsdpviz.cost.tables import dataframe
from fsdpviz.schema.report import Report, Unit

_WAITS = ("pre_forward", "pre_backward")


@dataclass
class Timeline:
    """Start and end (seconds from the start of the iteration) of every event.

    ``events``: per event ``index``, ``kind``, ``unit``, ``phase``, ``stream``,
    ``issued`` (when the hook that issued it runs on the compute stream), ``start``,
    ``end``, ``bytes`` (sent by this rank) and ``exposed`` (compute time lost waiting
    for it). ``compute``: per stretch of compute ``hook``, ``unit`` (the
    hook call it precedes), ``owner`` (whose forward or backward it is: the unit a
    pre-forward or pre-backward hook opened last and no post hook closed yet, ``""``
    outside every unit), ``phase``, ``next_event`` (the first event issued at or after
    that hook call), ``start``, ``end``, ``flops``. ``totals``: ``step_s``, ``compute_s``,
    ``comm_s``, ``exposed_comm_s``, ``overlap`` (share of communication hidden by compute),
    ``optimizer_s``, ``all_gather_bytes``, ``reduce_scatter_bytes``, and the exposed
    communication by phase of the collective waited for, ``exposed_forward_s`` and
    ``exposed_backward_s`` (their sum is ``exposed_comm_s``). ``hooks``: per hook call
    ``hook``, ``unit``, ``t`` (when it runs on the compute stream: the CPU issues its
    events then) and ``events`` (the indices it issued). ``waits``: every stretch of time
    the compute stream spends waiting for communication, ``start``, ``end``, ``event``
    (the collective waited for), ``phase`` (its phase), ``tail`` (the final wait for the
    last collective, after the last compute).

    Example::

        tl = fsdpviz.cost.timeline(report, machine("a100", network="roce-100"))
        tl.totals["exposed_comm_s"], tl.summary()
    """

    machine: dict[str, Any]
    events: list[dict[str, Any]]
    compute: list[dict[str, Any]]
    totals: dict[str, float]
    notes: list[str] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.events]

    def arrays(self) -> dict[str, list[float]]:
        """``{"start": [...], "end": [...], "exposed": [...]}`` per event."""
        return {k: [float(r[k]) for r in self.events] for k in ("start", "end", "exposed")}

    def to_pandas(self) -> Any:
        """The records as a ``pandas.DataFrame`` (needs pandas)."""
        return dataframe(self.records())

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": dict(self.machine),
            "events": self.records(),
            "compute": [dict(c) for c in self.compute],
            "totals": dict(self.totals),
            "notes": list(self.notes),
            "hooks": [dict(h) for h in self.hooks],
            "waits": [dict(w) for w in self.waits],
        }

    def summary(self) -> str:
        t = self.totals
        return (
            f"step {t['step_s'] * 1e3:.1f} ms on {self.machine['name']}: compute "
            f"{t['compute_s'] * 1e3:.1f} ms, communication {t['comm_s'] * 1e3:.1f} ms of which "
            f"{t['exposed_comm_s'] * 1e3:.1f} ms exposed ({t['overlap']:.0%} hidden)"
        )

    def __repr__(self) -> str:
        return f"Timeline({self.summary()})"


def timeline(
    report: Report,
    machine: Machine | str = "h100",
    *,
    iteration: int = -1,
    optimizer: str | int | None = "adamw",
    limit_all_gathers: bool = True,
) -> Timeline:
    """Estimate the duration of ``report.iterations[iteration]`` on ``machine``.

    ``machine``: a :class:`Machine` or a preset name (``"h100"``, ``"h200"``,
    ``"a100"``, ``"l40s"``). ``limit_all_gathers``: FSDP1's rate limiter (on by
    default in FSDP).
    """
    m = make_machine(machine) if isinstance(machine, str) else machine
    i = iteration_index(report, iteration)
    sim = _Sim(report, m, i, limit_all_gathers)
    sim.run()
    opt_s = _optimizer_seconds(report, m, optimizer)
    step = sim.end + opt_s
    comm = sum(r["end"] - r["start"] for r in sim.records if r["stream"] == "comm")
    exposed = sum(r["exposed"] for r in sim.records) + sim.tail_wait
    by_phase = {"forward": 0.0, "backward": 0.0}
    for w in sim.waits:
        by_phase[w["phase"]] += w["end"] - w["start"]
    totals = {
        "step_s": step,
        "compute_s": sim.compute_s,
        "comm_s": comm,
        "exposed_comm_s": exposed,
        "overlap": 1.0 - exposed / comm if comm > 0 else 1.0,
        "optimizer_s": opt_s,
        "all_gather_bytes": sim.bytes.get("all_gather", 0.0),
        "reduce_scatter_bytes": sim.bytes.get("reduce_scatter", 0.0)
        + sim.bytes.get("all_reduce", 0.0),
        "exposed_forward_s": by_phase["forward"],
        "exposed_backward_s": by_phase["backward"],
    }
    return Timeline(m.to_dict(), sim.records, sim.compute, totals, sim.notes, sim.hooks, sim.waits)


def _compute_dtype(units: list[Unit]) -> str:
    weight: dict[str, int] = {}
    for u in units:
        d = u.compute_dtype or u.dtype or "float32"
        weight[d] = weight.get(d, 0) + u.numel
    return max(weight, key=lambda d: weight[d]) if weight else "float32"


def _optimizer_seconds(report: Report, m: Machine, optimizer: str | int | None) -> float:
    states = optimizer_states(optimizer)
    if states == 0 and optimizer is None:
        return 0.0
    # read param + grad + states, write param + states
    touched = sum(u.sharded_numel * itemsize(u.dtype) * (3 + 2 * states) for u in report.units)
    # CPU offload: the shards, gradients and states are in host memory, stepped on the CPU
    return touched / ((m.host_gbps if report.config.cpu_offload else m.hbm_gbps) * 1e9)


class _Sim:
    def __init__(self, report: Report, m: Machine, i: int, limit: bool) -> None:
        self.m = m
        self.tape = tape(report, i)
        self.units = {u.module: u for u in report.units}
        self.dtype = _compute_dtype(report.units)
        cfg = report.config
        self.fsdp2 = cfg.api == "FSDP2"
        self.ws = cfg.ranks
        self.shard_ws = cfg.shard_ranks
        self.pg_ws = cfg.process_group_size or self.ws
        self.limit = limit and not self.fsdp2
        self.raf_int = {u: n for u in cfg.reshard_after_forward if (n := cfg.reshard_ranks(u))}
        self.t_compute = 0.0
        self.t_comm = 0.0
        self.t_copy = 0.0  # CPU offload's host-device copies
        self.h2d_done: dict[str, float] = {}
        self.gate = 0.0  # the next compute waits until then
        self.gate_by: int | None = None
        self.ag_done: dict[str, tuple[float, int]] = {}
        self.frees: list[float] = []  # FSDP1 rate limiter: compute time of unpopped frees
        self.last_wait = 0.0
        self.post_forward_mesh: set[str] = set()
        self.records: list[dict[str, Any]] = []
        self.compute: list[dict[str, Any]] = []
        self.compute_s = 0.0
        self.bytes: dict[str, float] = {}
        self.tail_wait = 0.0
        self.hooks: list[dict[str, Any]] = []
        self.waits: list[dict[str, Any]] = []
        self.end = 0.0
        self.notes: list[str] = []
        if not self.tape.measured:
            self.notes.append("no trace profile: compute time is unknown (0); only communication")

    def run(self) -> None:
        events = self.tape.events
        calls = self.tape.calls
        first_after = [len(events)] * (len(calls) + 1)  # first event issued at call k or later
        for k in reversed(range(len(calls))):
            first_after[k] = min([first_after[k + 1], *calls[k].events])
        opened: list[str] = []  # units between their pre- and post-hooks, innermost last
        for k, c in enumerate(calls):
            owner = opened[-1] if opened else ""
            where = {"owner": owner, "next_event": first_after[k]}
            self._compute(c.flops_forward + c.flops_backward, c.hook, c.unit, k, where)
            self.hooks.append(
                {"hook": c.hook, "unit": c.unit, "t": self.t_compute, "events": list(c.events)}
            )
            if c.hook in _WAITS:
                opened.append(c.unit)
            elif c.hook in ("post_forward", "post_backward") and c.unit in opened:
                del opened[len(opened) - 1 - opened[::-1].index(c.unit)]
            waits = c.hook in _WAITS
            # The hook waits for its unit right after issuing the unit's own all-gather
            # (if any), before prefetching others.
            own = [
                e for e in c.events if events[e].kind == "all_gather" and events[e].unit == c.unit
            ]
            if waits and not own:
                self._need(c.unit)
            for e in c.events:
                self._event(e)
                if waits and own and e == own[0]:
                    self._need(c.unit)
        tail = self.tape.tail
        where = {"owner": opened[-1] if opened else "", "next_event": len(events)}
        self._compute(tail.flops_forward + tail.flops_backward, "end", "", len(calls), where)
        self.end = max(self.t_compute, self.t_comm, self.t_copy)
        self.tail_wait = max(0.0, max(self.t_comm, self.t_copy) - self.t_compute)
        if self.tail_wait > 0:
            streams = [r for r in self.records if r["stream"] in ("comm", "copy")]
            last = max(streams, key=lambda r: r["end"])
            self.waits.append(
                {"start": self.t_compute, "end": self.t_compute + self.tail_wait,
                 "event": last["index"], "phase": last["phase"], "tail": True}
            )  # fmt: skip

    def _compute(self, flops: float, hook: str, unit: str, k: int, where: dict[str, Any]) -> None:
        dur = self.m.compute_seconds(flops, self.dtype)
        if dur <= 0:
            return
        start = max(self.t_compute, self.gate)
        if start > self.t_compute and self.gate_by is not None:
            waited = self.records[self.gate_by]
            waited["exposed"] += start - self.t_compute
            self.waits.append(
                {"start": self.t_compute, "end": start, "event": waited["index"],
                 "phase": waited["phase"], "tail": False}
            )  # fmt: skip
        self.t_compute = start + dur
        self.compute_s += dur
        phase = "forward" if hook.endswith("_forward") else "backward"
        self.compute.append(
            {"hook": hook, "unit": unit, "index": k, "start": start, "end": start + dur,
             "flops": flops, "phase": phase, **where}
        )  # fmt: skip
        self.gate_by = None

    def _need(self, unit: str) -> None:
        """The compute after this hook uses ``unit``: wait for its all-gather."""
        done = self.ag_done.get(unit)
        if done is not None and done[0] > self.gate:
            self.gate, self.gate_by = done
        # FSDP2's next all-gather waits for this unit's copy-out on the compute stream.
        self.last_wait = max(self.last_wait, self.t_compute, done[0] if done else 0.0)

    def _event(self, index: int) -> None:
        e = self.tape.events[index]
        u = self.units.get(e.unit)
        rec: dict[str, Any] = {
            "index": index,
            "kind": e.kind,
            "unit": e.unit,
            "phase": e.phase,
            "stream": "compute" if e.kind == "free" else "comm",
            "issued": self.t_compute,
            "start": self.t_compute,
            "end": self.t_compute,
            "bytes": 0.0,
            "exposed": 0.0,
        }
        self.records.append(rec)
        if u is None:
            return
        if e.kind == "free":
            self.frees.append(self.t_compute)
            if e.phase == "forward" and e.unit in self.raf_int:
                self.post_forward_mesh.add(e.unit)
            return
        if e.kind == "h2d":  # CPU offload: the host shard, before its all-gather
            gate = self._all_gather_gate()
            self._copy(rec, u.sharded_numel * itemsize(u.dtype), max(self.t_copy, gate))
            self.h2d_done[e.unit] = rec["end"]
            return
        if e.kind == "d2h":  # CPU offload: the gradient shard, after its reduction
            self._copy(rec, u.sharded_numel * itemsize(u.dtype), max(self.t_copy, self.t_comm))
            return
        if e.kind == "all_gather":
            ranks = self.shard_ws
            if e.unit in self.post_forward_mesh and e.phase == "backward":
                ranks = self.raf_int[e.unit]
                self.post_forward_mesh.discard(e.unit)
            size = u.padded_numel * itemsize(u.compute_dtype or u.dtype)
            gate = max(self._all_gather_gate(), self.h2d_done.pop(e.unit, 0.0))
            self._collective(rec, "all_gather", size, ranks, gate)
            self.ag_done[e.unit] = (rec["end"], len(self.records) - 1)
            return
        reduce = itemsize(u.reduce_dtype or u.compute_dtype or u.dtype)
        if e.kind == "all_reduce" and e.group == "replicate":  # hybrid: the shard, across groups
            replicas = self.ws // self.shard_ws
            self._collective(rec, "all_reduce", u.sharded_numel * reduce, replicas, self.t_compute)
        elif e.kind == "all_reduce":  # NO_SHARD: the whole gradient over FSDP's process group
            self._collective(rec, "all_reduce", u.numel * reduce, self.pg_ws, self.t_compute)
        else:
            ranks = self.shard_ws
            self._collective(rec, "reduce_scatter", u.padded_numel * reduce, ranks, self.t_compute)

    def _copy(self, rec: dict[str, Any], nbytes: float, start: float) -> None:
        """A host-device copy on the copy stream, one at a time."""
        rec["stream"] = "copy"
        rec["start"], rec["end"] = start, start + self.m.copy_seconds(nbytes)
        rec["bytes"] = float(nbytes)
        self.bytes[rec["kind"]] = self.bytes.get(rec["kind"], 0.0) + nbytes
        self.t_copy = rec["end"]

    def _all_gather_gate(self) -> float:
        if self.fsdp2:
            return self.last_wait
        if self.limit and len(self.frees) >= 2:
            return self.frees.pop(0)
        return 0.0

    def _collective(
        self, rec: dict[str, Any], kind: str, size: float, ranks: int, gate: float
    ) -> None:
        start = max(self.t_comm, gate)
        dur = self.m.collective_seconds(kind, size, ranks)
        rec["start"], rec["end"] = start, start + dur
        rec["bytes"] = (ranks - 1) / ranks * size * (2 if kind == "all_reduce" else 1)
        self.bytes[kind] = self.bytes.get(kind, 0.0) + rec["bytes"]
        self.t_comm = start + dur
