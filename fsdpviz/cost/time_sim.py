"""One micro-step of the time model: its hook calls and events walked on the streams.

:class:`MicroStepSim` replays one iteration's tape (:mod:`fsdpviz.cost.hook_calls`) as
:mod:`fsdpviz.cost.time` describes: the compute stream, the communication stream one
collective at a time, the copy stream, and tensor, context and pipeline parallelism's
streams, each event timed and recorded with what held it. Its state is grouped by what it
is in :mod:`fsdpviz.cost.time_state`. :func:`~fsdpviz.cost.time.timeline` runs one per
micro-step and adds them up; the float8 precomputation's all-reduces it sets aside are
placed after the optimizer step by :mod:`fsdpviz.cost.float8_precompute`.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from fsdpviz.cost.float8_precompute import is_precompute_all_reduce
from fsdpviz.cost.hardware import Machine, ring_bytes
from fsdpviz.cost.hook_calls import HookCall, tape
from fsdpviz.cost.kernels import StretchCost, machine_key, remembered_stretch_cost
from fsdpviz.cost.pipeline_time import P2PTimes, p2p_key
from fsdpviz.cost.sizes import gathered_bytes, itemsize, placed_bytes, reduced_shard_numel
from fsdpviz.cost.time_state import (
    Arrivals,
    Clocks,
    CopyOut,
    EventTiming,
    Gate,
    Offload,
    PostForward,
    Ranks,
    RateLimiter,
    Tally,
)
from fsdpviz.cost.topology import Span, post_forward_span, spans
from fsdpviz.plan.job import Float8, float8_weights
from fsdpviz.schema.events import CP_KINDS, TP_KINDS, Event
from fsdpviz.schema.report import Report, Unit, param_shapes
from fsdpviz.schema.rows import ComputeStretch, HookTime, Wait

_WAITS = ("pre_forward", "pre_backward")
_ACTION = re.compile(r"(\d+)([FBI])(\d+)")  # a stage's forward or backward of a microbatch
_CP_WAITS = ("cp_forward_wait", "cp_backward_wait")
_ACTIVATIONS = frozenset((*TP_KINDS, *CP_KINDS))
_GRADS = ("compute", -1)  # a reduction waits for the compute that produces its gradients


def _compute_dtype(units: list[Unit]) -> str:
    weight: dict[str, int] = {}
    for u in units:
        d = u.compute_dtype or u.dtype or "float32"
        if u.dtype_numels and u.compute_dtype is None:  # several dtypes, each computes in its own
            for name, (n, _) in u.dtype_numels.items():
                weight[name] = weight.get(name, 0) + n
            continue
        weight[d] = weight.get(d, 0) + u.numel
    return max(weight, key=lambda d: weight[d]) if weight else "float32"


def _float8_shares(report: Report) -> dict[str, float]:
    """FSDP2's float8 all-gather: per unit, the share of its elements in the weights of
    float8 linears, which it all-gathers in float8."""
    spec = report.config.float8
    if not spec or not spec.get("enable_fsdp_float8_all_gather") or report.config.api != "FSDP2":
        return {}
    weights = float8_weights(report.modules, Float8.from_dict(spec))
    shapes = {fqn: math.prod(shape) for fqn, shape in param_shapes(report.modules).items()}
    shares: dict[str, float] = {}
    for u in report.units:
        total = sum(shapes.get(p, 0) for p in u.params)
        fp8 = sum(shapes.get(p, 0) for p in u.params if p in weights)
        if total and fp8:
            shares[u.module] = fp8 / total
    return shares


class MicroStepSim:
    """One micro-step (iteration ``i`` of ``report``) timed on ``m``'s streams.

    What it reads: the machine ``m``, the ``tape`` of hook calls and events, the
    ``units``, the config ``cfg``; what it keeps while it walks them (see
    :mod:`fsdpviz.cost.time_state`): ``clocks``, ``gate``, ``ranks``, ``arrivals``,
    ``limiter``, ``copy_out``, ``post_forward``, ``offload``, ``tally``; what it gives
    after :meth:`run`: each event's ``records``, the compute stretches (``compute``), the
    ``hooks``, the compute's ``waits``, ``end`` (when the last stream is done),
    ``tail_wait`` (the final callback's wait) and ``notes``.
    """

    def __init__(
        self,
        report: Report,
        m: Machine,
        i: int,
        limit: bool,
        compiled: bool = False,
        p2p: P2PTimes | None = None,
    ) -> None:
        self.m = m
        self.p2p = p2p if p2p is not None else P2PTimes()
        self.machine_key = machine_key(m)  # what remembered stretch costs are kept by
        self.compiled = compiled
        if p2p is None:
            self.tape = tape(report, i)
        else:  # a pipeline rank, timed again until the ranks' sends settle: its tape once
            self.tape = p2p.tapes.get((id(report), i)) or tape(report, i)
            p2p.tapes[(id(report), i)] = self.tape
        self.measured = self.tape.measured
        self.units = {u.module: u for u in report.units}
        self.dtype = _compute_dtype(report.units)
        cfg = report.config
        self.cfg = cfg
        self.fsdp2 = cfg.api == "FSDP2"
        self.float8_share = _float8_shares(report)
        # tensor parallelism: each rank of the tp group computes a 1/tp share of the model's
        # FLOPs; the trace recorded the kernels as one rank runs them (profile.kernels_tp:
        # reports saved before it have the whole model's kernels, a 1/tp share of each
        # costed); tp collectives block the compute stream. Context parallelism: ring
        # attention's collectives on a stream of their own; the compute after a ring's wait
        # waits for the last one of that kind (Arrivals.ring)
        dims = cfg.parallel_dims
        self.ranks = Ranks(
            shard=dims.dp_shard_cp,
            replicas=dims.dp_replicate,
            tp=dims.tp,
            cp=dims.cp,
            process_group=cfg.process_group_size or cfg.ranks,
            # where each mesh dimension's groups sit on the machine's nodes
            spans=spans(cfg, m.gpus_per_node),
        )
        prof = report.profile
        self.kernel_share = (prof.kernels_tp if prof is not None else 1) / self.ranks.tp
        self.clocks = Clocks()
        self.gate = Gate()
        self.arrivals = Arrivals()
        self.limiter = RateLimiter(enabled=limit and not self.fsdp2)
        self.copy_out = CopyOut()
        self.post_forward = PostForward(cfg.post_forward_ranks)
        self.offload = Offload()
        self.tally = Tally()
        # every stretch is costed: whether any ran a float32 matmul, or a fused region
        self.tally.float32_matmuls, self.tally.fused_measured = self.tape.kernel_kinds
        self.records: list[EventTiming] = []
        self.compute: list[ComputeStretch] = []
        self.hooks: list[HookTime] = []
        self.waits: list[Wait] = []
        self.end = 0.0
        self.tail_wait = 0.0
        # torchao's precompute_float8_dynamic_scale_for_fsdp: its all-reduce of the stacked
        # amaxes (and, under tensor parallelism, DTensor's over tp after it), which runs after
        # the optimizer step (placed by float8_precompute.after_optimizer)
        self.after_step: list[EventTiming] = []
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
            self._compute(c, k, owner, first_after[k])
            self.hooks.append(
                HookTime(c.hook, c.unit, self.clocks.cpu, self.clocks.compute, tuple(c.events))
            )
            if c.hook == "pipeline" and isinstance(c.arg, str):
                self._await(c.arg)  # an action's compute starts once its input is received
            if c.hook in _CP_WAITS:
                done = self.arrivals.ring.get(str(c.arg))
                if done is not None and done[0] > self.gate.until:
                    self.gate.until, self.gate.by = done
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
        self._compute(tail, len(calls), opened[-1] if opened else "", len(events))
        self.end = max(
            self.clocks.compute, self.clocks.comm, self.clocks.copy, self.clocks.pp, self.clocks.cp
        )
        self.tail_wait = max(
            0.0, max(self.clocks.comm, self.clocks.copy, self.clocks.cp) - self.clocks.compute
        )
        if self.tail_wait > 0:
            streams = [r for r in self.records if r.stream in ("comm", "copy", "cp")]
            last = max(streams, key=lambda r: r.end)
            last.exposed += self.tail_wait  # the final callback waits for it
            end = self.clocks.compute + self.tail_wait
            self.waits.append(Wait(self.clocks.compute, end, last.index, last.event.phase, True))

    def own_totals(self) -> dict[str, float]:
        """This micro-step's sums, which the step adds up."""
        recs = self.records
        by_phase = {"forward": 0.0, "backward": 0.0}
        bubble = 0.0
        for w in self.waits:
            if w.bubble:
                bubble += w.end - w.start
            else:
                by_phase[w.phase] += w.end - w.start
        return {
            "compute_s": self.tally.compute_s,
            "comm_s": sum(r.end - r.start for r in recs if r.stream in ("comm", "tp", "cp")),
            # summed largest first, as Timeline.bottlenecks() lists them (the tail wait is
            # folded into the exposed time of the collective it waits for): their sum is this
            "exposed_comm_s": sum(sorted((r.exposed for r in recs if r.exposed > 0), reverse=True)),
            "all_gather_bytes": self.tally.bytes.get("all_gather", 0.0),
            "reduce_scatter_bytes": self.tally.bytes.get("reduce_scatter", 0.0)
            + self.tally.bytes.get("all_reduce", 0.0),
            "tp_bytes": sum(v for k, v in self.tally.bytes.items() if k.startswith("tp_")),
            "pp_bytes": sum(v for k, v in self.tally.bytes.items() if k.startswith("pp_")),
            # the compute's waits for a receive of pipeline parallelism: the pipeline's bubbles
            "bubble_s": bubble,
            "cp_bytes": sum(v for k, v in self.tally.bytes.items() if k.startswith("cp_")),
            "exposed_forward_s": by_phase["forward"],
            "exposed_backward_s": by_phase["backward"],
            "matmul_s": self.tally.by_kind["matmul"],
            "attention_s": self.tally.by_kind["attention"],
            "memory_bound_s": self.tally.by_kind["memory"],
            "copy_s": self.tally.by_kind["copy"],
            "cpu_bound_s": self.tally.by_kind["cpu"],
            "flops_forward": self.tally.flops_forward,
            "flops_backward": self.tally.flops_backward,
        }

    def _stretch(self, call: HookCall) -> StretchCost:
        if call.kernels:
            return remembered_stretch_cost(call.kernels, self.m, self.machine_key, self.compiled)
        flops = call.flops_forward + call.flops_backward  # a profile without kernel records
        dur = self.m.compute_seconds(flops, self.dtype)
        return StretchCost(dur, 0.0, 0, dur, 0.0, 0.0)

    def _compute(self, call: HookCall, k: int, owner: str, next_event: int) -> None:
        hook, unit = call.hook, call.unit
        flops = (call.flops_forward + call.flops_backward) / self.ranks.tp
        self.tally.flops_forward += call.flops_forward / self.ranks.tp
        self.tally.flops_backward += call.flops_backward / self.ranks.tp
        cost = self._stretch(call)
        if self.kernel_share != 1.0:
            share = self.kernel_share
            cost = StretchCost(
                cost.gpu_s * share, cost.cpu_s, cost.kernels, cost.matmul_s * share,
                cost.attention_s * share, cost.memory_s * share,
            )  # fmt: skip
        gpu = cost.gpu_s + self.copy_out.pending_s
        if gpu <= 0 and cost.cpu_s <= 0:
            return
        self.tally.by_kind["matmul"] += cost.matmul_s
        self.tally.by_kind["attention"] += cost.attention_s
        self.tally.by_kind["memory"] += cost.memory_s
        self.tally.by_kind["copy"] += self.copy_out.pending_s
        self.copy_out.pending_s = 0.0
        self.clocks.cpu += cost.cpu_s
        start = max(self.clocks.compute, self.gate.until)
        # the stretch's last kernel cannot end before the CPU has issued it
        end = max(start + gpu, self.clocks.cpu)  # (exactly no earlier than the CPU's issue)
        self.tally.by_kind["cpu"] += end - (start + gpu)
        dur = end - start
        # the wait for communication costs what it adds to the stretch's end: where the CPU
        # is still issuing the stretch's kernels, the GPU would have waited for it anyway
        lost = end - max(self.clocks.compute + gpu, self.clocks.cpu)
        if lost > 1e-15 and self.gate.by is not None:
            waited = self.records[self.gate.by]
            bubble = waited.stream == "pp"  # waiting for another pipeline rank
            if bubble:
                waited.bubble = (waited.bubble or 0.0) + lost
            else:
                waited.exposed += lost
            self.waits.append(
                Wait(start - lost, start, waited.index, waited.event.phase, False, bubble)
            )
        self.clocks.compute = end
        self.tally.compute_s += dur
        phase = "forward" if hook.endswith("_forward") else "backward"
        self.compute.append(
            ComputeStretch(hook, unit, k, start, start + dur, flops, phase, owner, next_event)
        )
        self.gate.by = None

    def _need(self, unit: str) -> None:
        """The compute after this hook uses ``unit``: wait for its all-gather."""
        done = self.arrivals.all_gathers.get(unit)
        if done is not None and done[0] > self.gate.until:
            self.gate.until, self.gate.by = done
        if self.fsdp2 and unit in self.copy_out.gathered:
            # FSDP2's copy-out: the gathered parameters out of the all-gather buffer
            self.copy_out.pending_s += self.m.memory_seconds(2 * self.copy_out.gathered.pop(unit))
        # FSDP2's next all-gather waits for this unit's copy-out on the compute stream.
        wait = max(self.clocks.compute, done[0] if done else 0.0)
        if wait >= self.copy_out.last_wait:
            self.copy_out.last_wait_event = self.records[done[1]].index if done else -1
        self.copy_out.last_wait = max(self.copy_out.last_wait, wait)

    def _event(self, index: int) -> None:
        e = self.tape.events[index]
        u = self.units.get(e.unit)
        # why it ran when it did (what Timeline.bottlenecks() explains): the hook that issued
        # it (and a tensor-parallel collective's module), whether it is a prefetch (all of
        # them the event's own), how long FSDP1's rate limiter held the CPU before issuing it,
        # and what its start waited for ("held": see Timeline) with that event ("held_by")
        stream = "compute" if e.kind == "free" else "comm"
        now = self.clocks.compute
        rec = EventTiming(index, e, stream, self.clocks.cpu, now, now, now)
        if is_precompute_all_reduce(self.tape.events, index):
            rec.stream = "tp" if e.kind in TP_KINDS else "comm"
            self.after_step.append(rec)  # placed after the optimizer step (float8_precompute)
            return
        self.records.append(rec)
        if e.kind in _ACTIVATIONS:  # tensor or context parallelism's
            if e.kind in TP_KINDS:
                self._tensor_parallel(rec, e.kind.removeprefix("tp_"), float(e.nbytes or 0))
            else:
                self._context_parallel(rec, e.kind.removeprefix("cp_"), float(e.nbytes or 0))
            return
        if e.pipeline:
            self._pipeline(rec, e)
            return
        if e.group == "shard":  # a float8 weight's amax: latency-bound
            gate = self._all_gather_gate() if e.module is not None else self.clocks.compute
            size, span = float(e.nbytes or 0), self.ranks.spans["shard"]
            self._collective(rec, "all_reduce", size, self.ranks.shard, gate, 0.0, span)
            return
        if u is None:
            return
        if e.kind == "free" and u.sharding_strategy == "NO_SHARD":
            return  # its low-precision copy (post_reshard): no free event enters the limiter
        if e.kind == "free":
            self.limiter.frees.append(self.clocks.compute)
            self.limiter.free_events.append(index)
            if e.phase == "forward" and e.unit in self.post_forward.ranks:
                self.post_forward.resharded.add(e.unit)
            return
        if e.kind == "h2d":  # CPU offload: the host shard, before its all-gather
            gate = self._all_gather_gate()
            rec.rate_limited_s = self.clocks.cpu - rec.issued
            rec.issued = self.clocks.cpu  # after the rate limiter's wait, if any
            self._copy(rec, u.sharded_bytes, max(self.clocks.copy, gate))
            self.offload.h2d_done[e.unit] = rec.end
            self.offload.h2d_event[e.unit] = index
            return
        if e.kind == "cast":  # NO_SHARD's low-precision copy, on the pre-unshard stream
            nbytes = float(u.numel * (itemsize(u.dtype) + itemsize(u.compute_dtype or u.dtype)))
            self._copy(rec, nbytes, self.clocks.copy, self.m.memory_seconds(nbytes))
            return
        if e.kind == "d2h":  # CPU offload: the gradient shard, after its reduction
            self._copy(
                rec, u.sharded_numel * itemsize(u.dtype), max(self.clocks.copy, self.clocks.comm)
            )
            return
        if e.kind == "all_gather":
            ranks, span = self.ranks.shard, self.ranks.spans["shard"]
            if e.unit in self.post_forward.resharded and e.phase == "backward":
                ranks = self.post_forward.ranks[e.unit]
                span = post_forward_span(self.cfg, ranks, self.m.gpus_per_node)
                self.post_forward.resharded.discard(e.unit)
            share = self.float8_share.get(e.unit, 0.0)  # FSDP2's float8 all-gather
            size = gathered_bytes(u) * (1 - share) + u.padded_numel * share
            if share > 0:
                rec.float8_share = share
            limiter = self._all_gather_gate()
            h2d = self.offload.h2d_done.pop(e.unit, 0.0)
            gate = max(limiter, h2d)
            rec.rate_limited_s = self.clocks.cpu - rec.issued
            rec.issued = self.clocks.cpu  # after the rate limiter's wait, if any
            held = ("rate_limiter", self.limiter.limited_by) if rec.rate_limited_s > 0 else ("", -1)
            if h2d > limiter:
                held = ("h2d", self.offload.h2d_event.pop(e.unit, -1))
            elif self.fsdp2:
                held = ("copy_out", self.copy_out.last_wait_event)
            # FSDP2's copy-in: this rank's shards (cast to the compute dtype) into the buffer
            extra = self.m.memory_seconds(2 * size / ranks) if self.fsdp2 else 0.0
            self._collective(rec, "all_gather", size, ranks, gate, extra, span, held)
            if self.fsdp2:  # and again, torch.cat of the parameters sharded on dim != 0
                self.copy_out.gathered[e.unit] = float(size) + sum(placed_bytes(u).values())
            self.arrivals.all_gathers[e.unit] = (rec.end, len(self.records) - 1)
            return
        reduce = itemsize(u.reduce_dtype or u.compute_dtype or u.dtype)
        if e.kind == "all_reduce" and e.group == "replicate":  # hybrid: the shard, across groups
            size = reduced_shard_numel(u, self.fsdp2) * reduce
            across = self.ranks.spans.get("replicate")
            self._collective(
                rec,
                "all_reduce",
                size,
                self.ranks.replicas,
                self.clocks.compute,
                0.0,
                across,
                _GRADS,
            )
        elif e.kind == "all_reduce":  # NO_SHARD: the padded flat gradient over FSDP's group
            size = (u.flat_numel or u.numel) * reduce
            group = self.ranks.spans.get("process_group")
            self._collective(
                rec,
                "all_reduce",
                size,
                self.ranks.process_group,
                self.clocks.compute,
                0.0,
                group,
                _GRADS,
            )
        else:
            ranks = self.ranks.shard
            shards = u.padded_numel // max(u.sharded_numel, 1)
            size = reduced_shard_numel(u, self.fsdp2) * shards * reduce
            if self.fsdp2 and ranks > 1:
                # FSDP2's copy-in: the gradients (cast to the reduce dtype) into the buffer,
                # after the gradients sharded on dim != 0 are each rebuilt (torch.cat of their
                # chunks), on the compute stream (foreach_reduce runs it before it enters the
                # reduce-scatter stream, which waits for it)
                rebuilt = sum(b for f, b in placed_bytes(u).items() if f not in u.gradless_params)
                self._copy_on_compute(self.m.memory_seconds(2 * (size + rebuilt)))
            shard = self.ranks.spans["shard"]
            self._collective(
                rec, "reduce_scatter", size, ranks, self.clocks.compute, 0.0, shard, _GRADS
            )

    def _copy_on_compute(self, seconds: float) -> None:
        """A copy the compute stream runs at the current hook, right after the compute before
        it: counted in that stretch, as a copy-out is in the stretch after its hook."""
        start = self.clocks.compute
        self.clocks.compute = start + seconds
        self.tally.compute_s += seconds
        self.tally.by_kind["copy"] += seconds
        k = len(self.hooks) - 1
        last = self.compute[-1] if self.compute else None
        if last is not None and last.index == k and last.end == start:
            self.compute[-1] = replace(last, end=start + seconds)
            return
        hook = self.hooks[k]
        self.compute.append(
            ComputeStretch(hook.hook, hook.unit, k, start, start + seconds, 0.0, "backward",
                           hook.unit, len(self.records) - 1)
        )  # fmt: skip

    def _tensor_parallel(self, rec: EventTiming, kind: str, size: float) -> None:
        """A tensor-parallel collective of an activation (or a partial gradient) over the tp
        ranks, inside a node: the compute after it needs its result, so it waits for it.
        ``size`` is the whole tensor's bytes; an all-to-all (DTensor's ``Shard(a) ->
        Shard(b)``, ``shard_dim_alltoall``) moves only what a rank holds, ``size / tp``, of
        which it sends all but its own chunk: as a ring all-gather of ``size / tp``."""
        rec.stream = "tp"
        start = max(self.clocks.compute, self.clocks.tp, rec.issued)
        ranks = self.ranks.tp
        span = self.ranks.spans.get("tp")
        if kind == "all_to_all":
            kind, size = "all_gather", size / max(1, ranks)
        dur = self.m.collective_seconds(kind, size, ranks, span) if ranks > 1 else 0.0
        rec.start, rec.end = start, start + dur
        rec.bytes = ring_bytes(kind, size, ranks)
        self.tally.bytes[rec.event.kind] = self.tally.bytes.get(rec.event.kind, 0.0) + rec.bytes
        self.clocks.tp = rec.end
        if rec.end > self.gate.until:
            self.gate.until, self.gate.by = rec.end, len(self.records) - 1

    def _pipeline(self, rec: EventTiming, e: Event) -> None:
        """A send to (or receive from) the neighbouring stage's rank, on the link the pp mesh
        dimension puts them on: a send starts once its compute is done and the peer posted
        the receive, one at a time; the compute after a receive waits for the peer's send
        (that wait is the pipeline's bubble)."""
        rec.stream = "pp"
        rec.bubble = 0.0
        key = p2p_key(e)
        size = float(e.nbytes or 0)
        rec.bytes = size
        self.tally.bytes[e.kind] = self.tally.bytes.get(e.kind, 0.0) + size
        if e.kind == "pp_send":
            span = self.ranks.spans.get("pp")
            dur = self.m.p2p_seconds(size, bool(span and span.across_nodes))
            start = max(self.clocks.compute, self.clocks.pp, self.p2p.posted.get(key, 0.0))
            rec.start, rec.end = start, start + dur
            self.clocks.pp = rec.end
            self.p2p.send(key, start, start + dur)
            return
        self.p2p.post(key, rec.issued)
        start, end = self.p2p.sent.get(key, (self.clocks.compute, self.clocks.compute))
        rec.start, rec.end = max(start, rec.issued), max(end, rec.issued)
        self.arrivals.received[key] = (rec.end, len(self.records) - 1)

    def _await(self, action: str) -> None:
        """A stage's forward (backward) of a microbatch: its compute waits for the activations
        (gradients) the stage received for it, as ``_step_microbatches`` waits on the receive."""
        match = _ACTION.fullmatch(action)
        if match is None:
            return
        stage, kind, mb = int(match[1]), match[2], int(match[3])
        key = ("F", stage - 1, mb) if kind == "F" else ("B", stage + 1, mb)
        got = self.arrivals.received.pop(key, None)
        if got is not None and got[0] > self.gate.until:
            self.gate.until, self.gate.by = got

    def _context_parallel(self, rec: EventTiming, kind: str, size: float) -> None:
        """A collective of ring attention over the cp group, on its own stream from when the
        CPU issued it; the compute waits for it at the ring's wait (``_CP_WAITS``). The
        all-gather moves ``(cp - 1) / cp`` of the gathered ``size``; the all-to-all passes the
        whole buffer to the next rank."""
        rec.stream = "cp"
        start = max(self.clocks.compute, self.clocks.cp, rec.issued)
        span = self.ranks.spans.get("cp")
        ranks = self.ranks.cp
        if kind == "all_gather":
            dur = self.m.collective_seconds("all_gather", size, ranks, span)
            moved = ring_bytes("all_gather", size, ranks)
        else:
            dur = self.m.send_seconds(size, span)
            moved = size
        rec.start, rec.end = start, start + dur
        rec.bytes = moved if ranks > 1 else 0.0
        self.tally.bytes[rec.event.kind] = self.tally.bytes.get(rec.event.kind, 0.0) + rec.bytes
        self.clocks.cp = rec.end
        self.arrivals.ring[kind] = (rec.end, len(self.records) - 1)

    def _copy(
        self, rec: EventTiming, nbytes: float, start: float, seconds: float | None = None
    ) -> None:
        """A copy on the copy stream, one at a time: host-device (``nbytes`` over the link),
        or one that takes ``seconds`` (a cast within device memory)."""
        rec.stream = "copy"
        start = max(start, rec.issued)  # not before the CPU issued it
        took = self.m.copy_seconds(nbytes) if seconds is None else seconds
        rec.start, rec.end = start, start + took
        rec.bytes = float(nbytes)
        self.tally.bytes[rec.event.kind] = self.tally.bytes.get(rec.event.kind, 0.0) + nbytes
        self.clocks.copy = rec.end

    def _all_gather_gate(self) -> float:
        if self.fsdp2:
            return self.copy_out.last_wait
        if self.limiter.enabled and len(self.limiter.frees) >= 2:
            freed = self.limiter.frees.pop(0)
            self.limiter.limited_by = self.limiter.free_events.pop(0)
            self.clocks.cpu = max(self.clocks.cpu, freed)  # the CPU blocks until that free is done
            return freed
        return 0.0

    def _collective(
        self,
        rec: EventTiming,
        kind: str,
        size: float,
        ranks: int,
        gate: float,
        extra: float = 0.0,
        span: Span | None = None,
        held: tuple[str, int] = ("", -1),
    ) -> None:
        start = max(self.clocks.comm, gate, rec.issued)  # not before the CPU issued it
        if start > rec.issued:
            stream = start == self.clocks.comm and self.clocks.comm_last >= 0
            rec.held, rec.held_by = ("stream", self.clocks.comm_last) if stream else held
        elif held[0] == "rate_limiter":  # issued (and started) when the limiter let it
            rec.held, rec.held_by = held
        dur = self.m.collective_seconds(kind, size, ranks, span) + (extra if ranks > 1 else 0.0)
        rec.start, rec.end = start, start + dur
        rec.bytes = ring_bytes(kind, size, ranks)
        self.tally.bytes[kind] = self.tally.bytes.get(kind, 0.0) + rec.bytes
        self.clocks.comm = start + dur
        self.clocks.comm_last = rec.index


__all__ = ["MicroStepSim"]
