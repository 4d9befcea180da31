"""Estimated duration of every event, and how much communication compute hides.

The model replays one iteration's :mod:`tape <fsdpviz.cost.hook_calls>` on two streams
of a :class:`~fsdpviz.cost.hardware.Machine`:

- the **compute** stream runs the compute measured before each hook call, in
  order: every kernel the trace saw at its roofline time on the machine
  (:mod:`fsdpviz.cost.kernels`). The CPU issues those kernels ahead of the GPU; a
  stretch cannot end before the CPU has issued its last kernel, so a model of many small
  kernels runs at the CPU's pace. The compute after a unit's pre-forward or
  pre-backward hook waits until that unit's last all-gather has finished; the
  time this adds to the stretch is *exposed* communication, charged to that all-gather
  (where the CPU is still issuing the stretch's kernels, the GPU would wait anyway).
- the **communication** stream runs the collectives one at a time, in issue
  order. The CPU runs ahead of the GPU, so an all-gather may start before the
  hook that issued it is reached on the compute stream, as far as FSDP lets it:
  FSDP1 with ``limit_all_gathers`` (the default) waits for the compute stream to
  pass the ``free`` two frees back (its rate limiter); FSDP2 waits for the
  copy-out of the previous all-gather (the compute stream reaching the hook that
  used it). A reduce-scatter starts once the compute before its post-backward
  hook is done. ``free`` events take no time on the compute stream. Each collective
  runs over its process group as the mesh places it on the machine's nodes
  (:mod:`fsdpviz.cost.topology`: shard, replicate, tp, FSDP1's process group, FSDP2's
  post-forward mesh), timed by the slowest link its ring crosses
  (:meth:`~fsdpviz.cost.hardware.Machine.collective_seconds`); FSDP2's float8
  all-gather moves the float8 linears' weights in one byte each.

FSDP2 copies each unit's shards into the all-gather buffer (copy-in, on the
all-gather's stream, before it) and the gathered parameters out of it (copy-out, on the
compute stream when the unit is first needed), and the gradients into the
reduce-scatter buffer (on the reduce-scatter's stream): each a memory-bound pass. A
parameter its ``shard_placement_fn`` shards on a dim other than 0 is copied once more in
each: its copy-out lands in a temporary that ``torch.cat`` puts in place, and its gradient
is rebuilt (``torch.cat`` of its chunks) before the copy-in.

The iteration ends when both streams are done (the final callback waits for
the last reduce-scatter); ``exposed_comm`` also counts that last wait. An optimizer
step runs its micro-steps one after the other (one without gradient accumulation; the
``N`` a report planned with ``grad_accum=N`` holds, each from its own events; or the
iteration repeated, ``timeline(..., grad_accum=N)``), then the optimizer: memory-bound
passes over the shards (``"adamw_fused"`` reads parameter, gradient and both states and
writes parameter and states; ``"adamw"``, torch's default foreach implementation, runs each
operation as a pass of its own, three times that traffic, see
:class:`~fsdpviz.cost.sizes.OptimizerSpec`; on the host under CPU offload). CPU offload's
``h2d`` copies (a shard to the device; its all-gather waits for it) and ``d2h`` copies (a
gradient shard back, after its reduction) run one at a time on a copy stream.

Throughput is reported as users read it: ``tokens_per_s`` per GPU (the traced batch is
one rank's), ``mfu`` (model FLOPs utilisation: three times the forward's matrix-multiply
and attention FLOPs, ``6 N + 12 l h q t`` per token for a transformer as torchtitan and
llm-foundry count it, over the step and the GPU's dense peak) and ``hfu`` (hardware FLOPs:
what ran, activation-checkpoint recomputation included).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from fsdpviz.cost.fit import machine_of
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.hook_calls import HookCall, iteration_index, tape
from fsdpviz.cost.kernels import StretchCost, machine_key, remembered_stretch_cost
from fsdpviz.cost.pipeline_time import P2PTimes, p2p_key, pipeline_timelines
from fsdpviz.cost.sizes import (
    gathered_bytes,
    itemsize,
    optimizer_spec,
    placed_bytes,
    reduced_shard_numel,
)
from fsdpviz.cost.topology import Span, post_forward_span, spans
from fsdpviz.errors import ConfigError
from fsdpviz.plan.job import Float8, float8_weights
from fsdpviz.schema.events import CP_KINDS, TP_KINDS, Event
from fsdpviz.schema.report import Report, Unit
from fsdpviz.schema.timeline import Timeline

_WAITS = ("pre_forward", "pre_backward")
_ACTION = re.compile(r"(\d+)([FBI])(\d+)")  # a stage's forward or backward of a microbatch
_CP_WAITS = ("cp_forward_wait", "cp_backward_wait")
_ACTIVATIONS = frozenset((*TP_KINDS, *CP_KINDS))
_GRADS = ("compute", -1)  # a reduction waits for the compute that produces its gradients


def timeline(
    report: Report,
    machine: Machine | str | None = None,
    *,
    iteration: int = -1,
    optimizer: str | int | None = "adamw",
    limit_all_gathers: bool = True,
    grad_accum: int | None = None,
    no_sync: bool = False,
    compile: bool | None = None,
    p2p: P2PTimes | None = None,
) -> Timeline:
    """Estimate the optimizer step of ``report.iterations[iteration]`` on ``machine``.

    ``optimizer``: as :func:`~fsdpviz.cost.memory_model` takes it (``"adamw"``: torch's
    default foreach implementation; ``"adamw_fused"``, as torchtitan runs it).

    ``machine``: a :class:`Machine` or a preset name (``"h100"``, ``"h100-hbm2e"``,
    ``"h100-pcie"``, ``"h200"``, ``"a100"``, ``"a100-40gb"``, ``"l40s"``); default: the
    machine the report was planned for (``analyze(..., machine=...)``), else ``"h100"``.
    ``limit_all_gathers``: FSDP1's rate limiter (on by default in FSDP).

    Gradient accumulation: a report planned with ``fsdpviz.analyze(..., grad_accum=N)``
    holds every micro-step as FSDP issues it (the first ``N - 1`` under ``no_sync()`` /
    ``set_requires_gradient_sync(False)``); the step is the ``N`` micro-steps of the
    optimizer step that ``iteration`` belongs to, each timed from its own events.
    ``grad_accum=N`` on a report planned without it repeats the iteration ``N`` times, each
    reducing its gradients (accumulation without ``no_sync``, as torchtitan and Composer
    run it). ``compile``: cost the compute as ``torch.compile`` runs it (default: as the
    report was planned, ``analyze(..., compile=...)``). ``p2p``: under pipeline parallelism,
    the sends of the other ranks this rank's receives wait for (see :class:`P2PTimes`);
    ``report.timeline`` of a pipeline's report gives every rank's, each waiting for the others
    (:func:`fsdpviz.cost.pipeline_time.pipeline_timeline`).

    Example::

        tl = fsdpviz.cost.timeline(report, "h100", grad_accum=4)
        tl.totals["tokens_per_s"], tl.totals["mfu"]
    """
    if no_sync:
        raise ConfigError(
            "timeline(no_sync=True) is gone: plan the accumulation with "
            "fsdpviz.analyze(..., grad_accum=N) (or fsdpviz.replan.replay(report, "
            "grad_accum=N)); its report holds every micro-step as FSDP issues it "
            "(no_sync's all-gathers, frees and missing reductions), and the time model "
            "steps through them"
        )
    pipe = report.pipeline
    if pipe is not None and p2p is None and (pipe.ranks or pipe.job is not None):
        # pipeline parallelism: every rank's step, each waiting for the others' sends
        job = pipe.job if not pipe.ranks else report

        def one(rank: Report, times: P2PTimes) -> Timeline:
            return timeline(
                rank, machine, iteration=iteration, optimizer=optimizer,
                limit_all_gathers=limit_all_gathers, grad_accum=grad_accum, compile=compile,
                p2p=times,
            )  # fmt: skip

        defaults = machine is None and iteration == -1 and optimizer == "adamw"
        defaults = defaults and compile is None and limit_all_gathers and grad_accum is None
        which = machine_key(machine) if isinstance(machine, Machine) else machine
        options = (which, iteration, optimizer, compile, limit_all_gathers, grad_accum)
        assert job.pipeline is not None
        cache: dict[Any, Any] = job.pipeline.cache
        timed = cache.get(options)
        if timed is None:  # the ranks are timed together once per set of options
            timed = cache[options] = pipeline_timelines(job, one, cache=defaults)
        whole, ranks = timed
        return whole if pipe.ranks else ranks[int(report.config.pp_rank or 0)]
    micro_steps = _micro_steps(report, iteration, grad_accum)
    if machine is None:
        m = machine_of(report)
    else:
        m = make_machine(machine) if isinstance(machine, str) else machine
    if m.float32_matmul_precision is None:
        precision = report.config.float32_matmul_precision or "highest"
        m = replace(m, float32_matmul_precision=precision)
    compiled = bool(report.config.compile) if compile is None else bool(compile)
    i = iteration_index(report, iteration)
    runs: dict[int, _Sim] = {}
    for k in dict.fromkeys(micro_steps):
        runs[k] = _Sim(report, m, k, limit_all_gathers, compiled=compiled, p2p=p2p)
        runs[k].run()
    sim = runs[i]
    sums: dict[str, float] = {}
    micro: list[dict[str, Any]] = []
    t = 0.0
    planned = report.config.grad_accum > 1
    for n, k in enumerate(micro_steps):
        own = runs[k].own_totals()
        for key, value in own.items():
            sums[key] = sums.get(key, 0.0) + value
        sync = not planned or n == len(micro_steps) - 1
        micro.append({"iteration": k, "start": t, "end": t + runs[k].end, "sync": sync, **own})
        t += runs[k].end
    opt_s = _optimizer_seconds(report, m, optimizer)
    step = t + opt_s
    comm, exposed = sums["comm_s"], sums["exposed_comm_s"]
    count = len(micro_steps)
    # the ranks of a tensor-parallel group share their tokens
    tokens = (
        float(report.profile.tokens if report.profile is not None else 0)
        * count
        / report.config.tp_ranks
    )
    model_flops = 3.0 * sums["flops_forward"]
    hardware_flops = sums["flops_forward"] + sums["flops_backward"]
    peak = m.peak_flops(sim.dtype) * step if step > 0 else 0.0
    totals = {
        "step_s": step,
        "compute_s": sums["compute_s"],
        "comm_s": comm,
        "exposed_comm_s": exposed,
        "overlap": max(0.0, 1.0 - exposed / comm) if comm > 0 else 1.0,
        "optimizer_s": opt_s,
        "all_gather_bytes": sums["all_gather_bytes"],
        "reduce_scatter_bytes": sums["reduce_scatter_bytes"],
        "tp_bytes": sums["tp_bytes"],
        "pp_bytes": sums["pp_bytes"],
        "bubble_s": sums["bubble_s"],
        "cp_bytes": sums["cp_bytes"],
        "exposed_forward_s": sums["exposed_forward_s"],
        "exposed_backward_s": sums["exposed_backward_s"],
        "matmul_s": sums["matmul_s"],
        "attention_s": sums["attention_s"],
        "memory_bound_s": sums["memory_bound_s"],
        "copy_s": sums["copy_s"],
        "cpu_bound_s": sums["cpu_bound_s"],
        "micro_batches": float(count),
        "micro_step_s": sim.end,
        "tokens": tokens,
        "tokens_per_s": tokens / step if step > 0 else 0.0,
        "model_flops": model_flops,
        "hardware_flops": hardware_flops,
        "mfu": model_flops / peak if peak > 0 and sim.measured else 0.0,
        "hfu": hardware_flops / peak if peak > 0 and sim.measured else 0.0,
    }
    described = m.to_dict()
    described["topology"] = [
        {**s.to_dict(), "role": role, "link": "network" if s.across_nodes else "intra-node"}
        for role, s in sim.spans.items()
        if role != "process_group"
    ]
    notes = list(sim.notes) + _notes(report, m, sim, compiled)
    _rates(sim.compute, m, sim.dtype)
    return Timeline(described, sim.records, sim.compute, totals, notes, sim.hooks, sim.waits, micro)


def _micro_steps(report: Report, iteration: int, grad_accum: int | None) -> list[int]:
    """The iterations the optimizer step of ``iteration`` runs, one per micro-step."""
    if grad_accum is not None and (
        not isinstance(grad_accum, int) or isinstance(grad_accum, bool) or grad_accum < 1
    ):
        raise ConfigError(f"grad_accum must be a positive int (micro-batches), got {grad_accum!r}")
    i = iteration_index(report, iteration)
    planned = report.config.grad_accum
    if planned <= 1:
        return [i] * (grad_accum or 1)
    if grad_accum not in (None, planned):
        raise ConfigError(
            f"the report was planned with grad_accum={planned} (its iterations are the "
            f"micro-steps as FSDP issues them); timeline(grad_accum={grad_accum}) cannot "
            "change that: leave grad_accum out, or plan again with "
            f"fsdpviz.analyze(..., grad_accum={grad_accum})"
        )
    first = i - i % planned
    if first + planned > len(report.iterations):
        raise ConfigError(
            f"iteration {iteration} belongs to an optimizer step of {planned} micro-steps "
            f"the report does not hold in full ({len(report.iterations)} iterations)"
        )
    return list(range(first, first + planned))


def _notes(report: Report, m: Machine, sim: _Sim, compiled: bool) -> list[str]:
    """What the time model assumed that the user may want to change."""
    notes: list[str] = []
    if sim.float32_matmuls:
        if m.tf32:
            notes.append(
                f"float32 matrix multiplies run on TF32 tensor cores "
                f"(float32_matmul_precision={m.float32_matmul_precision!r})"
            )
        else:
            notes.append(
                "float32 matrix multiplies run at the full-precision FP32 peak "
                "(float32_matmul_precision='highest', torch's default); with "
                "torch.set_float32_matmul_precision('high') they use TF32 tensor cores: "
                "analyze(..., float32_matmul_precision='high') or "
                "machine(..., float32_matmul_precision='high')"
            )
    if compiled and not sim.fused_measured and sim.measured:
        notes.append(
            "compile: the trace holds no fused regions (a report saved before they were "
            "measured); the compute is costed eager"
        )
    trainable = report.trainable_text()
    if trainable:
        notes.append(
            f"{trainable}: the backward computes no weight gradient for the frozen ones (the "
            "trace's kernels, hfu), the optimizer steps the trainable shards only; mfu counts "
            "the forward's FLOPs three times, as for full training"
        )
    return notes


def _rates(compute: list[dict[str, Any]], m: Machine, dtype: str) -> None:
    """Each stretch's ``duration``, achieved ``flops_per_s`` and its share of the peak."""
    peak = m.peak_flops(dtype)
    for c in compute:
        dur = c["end"] - c["start"]
        rate = c["flops"] / dur if dur > 0 else 0.0
        c["duration"] = dur
        c["flops_per_s"] = rate
        c["peak_share"] = rate / peak if peak > 0 else 0.0


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
    shapes = {
        f"{m.fqn}.{name}" if m.fqn else name: math.prod(shape)
        for m in report.modules
        for name, shape in m.params.items()
    }
    shares: dict[str, float] = {}
    for u in report.units:
        total = sum(shapes.get(p, 0) for p in u.params)
        fp8 = sum(shapes.get(p, 0) for p in u.params if p in weights)
        if total and fp8:
            shares[u.module] = fp8 / total
    return shares


def _optimizer_seconds(report: Report, m: Machine, optimizer: str | int | None) -> float:
    spec = optimizer_spec(optimizer)
    if spec.states == 0 and optimizer is None:
        return 0.0
    # the trainable shards; fused Adam: read param + grad + states, write param + states;
    # foreach: each operation a pass of its own (OptimizerSpec.passes)
    touched = sum(u.trainable[1] * itemsize(u.dtype) * spec.passes() for u in report.units)
    # CPU offload: the shards, gradients and states are in host memory, stepped on the CPU
    return touched / ((m.host_gbps if report.config.cpu_offload else m.hbm_gbps) * 1e9)


class _Sim:
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
        self.t_pp = 0.0  # pipeline parallelism's sends, one at a time
        self.received: dict[tuple[str, int, int], tuple[float, int]] = {}  # receive: end, record
        self.machine_key = machine_key(m)  # what remembered stretch costs are kept by
        self.compiled = compiled
        self.float32_matmuls = False  # a matrix multiply ran in float32
        self.fused_measured = False  # the trace recorded fused regions (compile)
        if p2p is None:
            self.tape = tape(report, i)
        else:  # a pipeline rank, timed again until the ranks' sends settle: its tape once
            self.tape = p2p.tapes.get((id(report), i)) or tape(report, i)
            p2p.tapes[(id(report), i)] = self.tape
        self.measured = self.tape.measured
        self.t_cpu = 0.0  # when the CPU has issued the kernels so far
        self.pending_copy = 0.0  # FSDP2 copy-out the next compute runs first
        self.flops_forward = 0.0
        self.flops_backward = 0.0
        self.by_kind = dict.fromkeys(("matmul", "attention", "memory", "copy", "cpu"), 0.0)
        self.units = {u.module: u for u in report.units}
        self.dtype = _compute_dtype(report.units)
        cfg = report.config
        self.fsdp2 = cfg.api == "FSDP2"
        self.ws = cfg.ranks
        self.shard_ws = cfg.shard_ranks
        self.replicas = cfg.replicas
        # tensor parallelism: each rank of the tp group computes a 1/tp share of the model's
        # FLOPs; the trace recorded the kernels as one rank runs them (profile.kernels_tp:
        # reports saved before it have the whole model's kernels, a 1/tp share of each
        # costed); tp collectives block the compute stream
        self.tp = cfg.tp_ranks
        prof = report.profile
        self.kernel_share = (prof.kernels_tp if prof is not None else 1) / self.tp
        self.t_tp = 0.0
        # context parallelism: ring attention's collectives on a stream of their own; the
        # compute after a ring's wait waits for the last one of that kind (all_gather of the
        # keys and values, all_to_all of their gradients)
        self.cp = cfg.cp_ranks
        self.t_cp = 0.0
        self.cp_done: dict[str, tuple[float, int]] = {}
        self.pg_ws = cfg.process_group_size or self.ws
        # where each mesh dimension's groups sit on the machine's nodes
        self.spans = spans(cfg, m.gpus_per_node)
        self.cfg = cfg
        self.float8_share = _float8_shares(report)
        self.limit = limit and not self.fsdp2
        self.raf_int = {u: n for u in cfg.reshard_after_forward if (n := cfg.reshard_ranks(u))}
        self.t_compute = 0.0
        self.t_comm = 0.0
        self.t_copy = 0.0  # CPU offload's host-device copies
        self.h2d_done: dict[str, float] = {}
        self.h2d_event: dict[str, int] = {}
        self.gate = 0.0  # the next compute waits until then
        self.gate_by: int | None = None
        self.ag_done: dict[str, tuple[float, int]] = {}
        self.copy_out: dict[str, float] = {}  # FSDP2: gathered bytes not yet copied out
        self.frees: list[float] = []  # FSDP1 rate limiter: compute time of unpopped frees
        self.free_events: list[int] = []  # ... and their event indices
        self.limited_by = -1  # the free the rate limiter last waited for
        self.last_wait = 0.0
        self.last_wait_event = -1  # FSDP2: the all-gather whose copy-out sets last_wait
        self.comm_last = -1  # the event last run on the communication stream
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
            self._compute(c, k, where)
            self.hooks.append(
                {
                    "hook": c.hook,
                    "unit": c.unit,
                    "t": self.t_cpu,
                    "compute_t": self.t_compute,
                    "events": list(c.events),
                }
            )
            if c.hook == "pipeline" and isinstance(c.arg, str):
                self._await(c.arg)  # an action's compute starts once its input is received
            if c.hook in _CP_WAITS:
                done = self.cp_done.get(str(c.arg))
                if done is not None and done[0] > self.gate:
                    self.gate, self.gate_by = done
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
        self._compute(tail, len(calls), where)
        self.end = max(self.t_compute, self.t_comm, self.t_copy, self.t_pp, self.t_cp)
        self.tail_wait = max(0.0, max(self.t_comm, self.t_copy, self.t_cp) - self.t_compute)
        if self.tail_wait > 0:
            streams = [r for r in self.records if r["stream"] in ("comm", "copy", "cp")]
            last = max(streams, key=lambda r: r["end"])
            last["exposed"] += self.tail_wait  # the final callback waits for it
            self.waits.append(
                {"start": self.t_compute, "end": self.t_compute + self.tail_wait,
                 "event": last["index"], "phase": last["phase"], "tail": True}
            )  # fmt: skip

    def own_totals(self) -> dict[str, float]:
        """This micro-step's sums, which the step adds up."""
        recs = self.records
        by_phase = {"forward": 0.0, "backward": 0.0}
        bubble = 0.0
        for w in self.waits:
            if w.get("bubble"):
                bubble += w["end"] - w["start"]
            else:
                by_phase[w["phase"]] += w["end"] - w["start"]
        return {
            "compute_s": self.compute_s,
            "comm_s": sum(
                r["end"] - r["start"] for r in recs if r["stream"] in ("comm", "tp", "cp")
            ),
            # summed largest first, as Timeline.bottlenecks() lists them (the tail wait is
            # folded into the exposed time of the collective it waits for): their sum is this
            "exposed_comm_s": sum(
                sorted((r["exposed"] for r in recs if r["exposed"] > 0), reverse=True)
            ),
            "all_gather_bytes": self.bytes.get("all_gather", 0.0),
            "reduce_scatter_bytes": self.bytes.get("reduce_scatter", 0.0)
            + self.bytes.get("all_reduce", 0.0),
            "tp_bytes": sum(v for k, v in self.bytes.items() if k.startswith("tp_")),
            "pp_bytes": sum(v for k, v in self.bytes.items() if k.startswith("pp_")),
            # the compute's waits for a receive of pipeline parallelism: the pipeline's bubbles
            "bubble_s": bubble,
            "cp_bytes": sum(v for k, v in self.bytes.items() if k.startswith("cp_")),
            "exposed_forward_s": by_phase["forward"],
            "exposed_backward_s": by_phase["backward"],
            "matmul_s": self.by_kind["matmul"],
            "attention_s": self.by_kind["attention"],
            "memory_bound_s": self.by_kind["memory"],
            "copy_s": self.by_kind["copy"],
            "cpu_bound_s": self.by_kind["cpu"],
            "flops_forward": self.flops_forward,
            "flops_backward": self.flops_backward,
        }

    def _stretch(self, call: HookCall) -> StretchCost:
        if call.kernels:
            if not self.float32_matmuls:
                self.float32_matmuls = any(k[0] == "gemm" and k[6] == 4 for k in call.kernels)
            self.fused_measured = self.fused_measured or any(k[0] == "fused" for k in call.kernels)
            return remembered_stretch_cost(call.kernels, self.m, self.machine_key, self.compiled)
        flops = call.flops_forward + call.flops_backward  # a profile without kernel records
        dur = self.m.compute_seconds(flops, self.dtype)
        return StretchCost(dur, 0.0, 0, dur, 0.0, 0.0)

    def _compute(self, call: HookCall, k: int, where: dict[str, Any]) -> None:
        hook, unit = call.hook, call.unit
        flops = (call.flops_forward + call.flops_backward) / self.tp
        self.flops_forward += call.flops_forward / self.tp
        self.flops_backward += call.flops_backward / self.tp
        cost = self._stretch(call)
        if self.kernel_share != 1.0:
            share = self.kernel_share
            cost = StretchCost(
                cost.gpu_s * share, cost.cpu_s, cost.kernels, cost.matmul_s * share,
                cost.attention_s * share, cost.memory_s * share,
            )  # fmt: skip
        gpu = cost.gpu_s + self.pending_copy
        if gpu <= 0 and cost.cpu_s <= 0:
            return
        self.by_kind["matmul"] += cost.matmul_s
        self.by_kind["attention"] += cost.attention_s
        self.by_kind["memory"] += cost.memory_s
        self.by_kind["copy"] += self.pending_copy
        self.pending_copy = 0.0
        self.t_cpu += cost.cpu_s
        start = max(self.t_compute, self.gate)
        # the stretch's last kernel cannot end before the CPU has issued it
        end = max(start + gpu, self.t_cpu)  # (exactly no earlier than the CPU's issue)
        self.by_kind["cpu"] += end - (start + gpu)
        dur = end - start
        # the wait for communication costs what it adds to the stretch's end: where the CPU
        # is still issuing the stretch's kernels, the GPU would have waited for it anyway
        lost = end - max(self.t_compute + gpu, self.t_cpu)
        if lost > 1e-15 and self.gate_by is not None:
            waited = self.records[self.gate_by]
            bubble = waited["stream"] == "pp"  # waiting for another pipeline rank
            waited["bubble" if bubble else "exposed"] += lost
            self.waits.append(
                {"start": start - lost, "end": start, "event": waited["index"],
                 "phase": waited["phase"], "tail": False, **({"bubble": True} if bubble else {})}
            )  # fmt: skip
        self.t_compute = end
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
        if self.fsdp2 and unit in self.copy_out:
            # FSDP2's copy-out: the gathered parameters out of the all-gather buffer
            self.pending_copy += self.m.memory_seconds(2 * self.copy_out.pop(unit))
        # FSDP2's next all-gather waits for this unit's copy-out on the compute stream.
        wait = max(self.t_compute, done[0] if done else 0.0)
        if wait >= self.last_wait:
            self.last_wait_event = self.records[done[1]]["index"] if done else -1
        self.last_wait = max(self.last_wait, wait)

    def _event(self, index: int) -> None:
        e = self.tape.events[index]
        u = self.units.get(e.unit)
        rec: dict[str, Any] = {
            "index": index,
            "kind": e.kind,
            "unit": e.unit,
            "phase": e.phase,
            "stream": "compute" if e.kind == "free" else "comm",
            "issued": self.t_cpu,
            "compute_t": self.t_compute,
            "start": self.t_compute,
            "end": self.t_compute,
            "bytes": 0.0,
            "exposed": 0.0,
            # why it ran when it did (what Timeline.bottlenecks() explains): the hook that
            # issued it (and a tensor-parallel collective's module), whether it is a
            # prefetch, how long FSDP1's rate limiter held the CPU before issuing it, and
            # what its start waited for ("held": see Timeline) with that event ("held_by")
            "hook": e.hook,
            "hook_unit": e.hook_unit,
            "module": e.module,
            "prefetch": e.prefetch,
            "rate_limited_s": 0.0,
            "held": "",
            "held_by": -1,
        }
        if e.stage is not None:  # pipeline parallelism: the action that issued it
            rec.update(stage=e.stage, microbatch=e.microbatch, action=e.action)
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
        if u is None:
            return
        if e.kind == "free":
            self.frees.append(self.t_compute)
            self.free_events.append(index)
            if e.phase == "forward" and e.unit in self.raf_int:
                self.post_forward_mesh.add(e.unit)
            return
        if e.kind == "h2d":  # CPU offload: the host shard, before its all-gather
            gate = self._all_gather_gate()
            rec["rate_limited_s"] = self.t_cpu - rec["issued"]
            rec["issued"] = self.t_cpu  # after the rate limiter's wait, if any
            self._copy(rec, u.sharded_bytes, max(self.t_copy, gate))
            self.h2d_done[e.unit] = rec["end"]
            self.h2d_event[e.unit] = index
            return
        if e.kind == "d2h":  # CPU offload: the gradient shard, after its reduction
            self._copy(rec, u.sharded_numel * itemsize(u.dtype), max(self.t_copy, self.t_comm))
            return
        if e.kind == "all_gather":
            ranks, span = self.shard_ws, self.spans["shard"]
            if e.unit in self.post_forward_mesh and e.phase == "backward":
                ranks = self.raf_int[e.unit]
                span = post_forward_span(self.cfg, ranks, self.m.gpus_per_node)
                self.post_forward_mesh.discard(e.unit)
            share = self.float8_share.get(e.unit, 0.0)  # FSDP2's float8 all-gather
            size = gathered_bytes(u) * (1 - share) + u.padded_numel * share
            if share > 0:
                rec["float8_share"] = share
            limiter = self._all_gather_gate()
            h2d = self.h2d_done.pop(e.unit, 0.0)
            gate = max(limiter, h2d)
            rec["rate_limited_s"] = self.t_cpu - rec["issued"]
            rec["issued"] = self.t_cpu  # after the rate limiter's wait, if any
            held = ("rate_limiter", self.limited_by) if rec["rate_limited_s"] > 0 else ("", -1)
            if h2d > limiter:
                held = ("h2d", self.h2d_event.pop(e.unit, -1))
            elif self.fsdp2:
                held = ("copy_out", self.last_wait_event)
            # FSDP2's copy-in: this rank's shards (cast to the compute dtype) into the buffer
            extra = self.m.memory_seconds(2 * size / ranks) if self.fsdp2 else 0.0
            self._collective(rec, "all_gather", size, ranks, gate, extra, span, held)
            if self.fsdp2:  # and again, torch.cat of the parameters sharded on dim != 0
                self.copy_out[e.unit] = float(size) + sum(placed_bytes(u).values())
            self.ag_done[e.unit] = (rec["end"], len(self.records) - 1)
            return
        reduce = itemsize(u.reduce_dtype or u.compute_dtype or u.dtype)
        if e.kind == "all_reduce" and e.group == "replicate":  # hybrid: the shard, across groups
            size = reduced_shard_numel(u, self.fsdp2) * reduce
            across = self.spans.get("replicate")
            self._collective(
                rec, "all_reduce", size, self.replicas, self.t_compute, 0.0, across, _GRADS
            )
        elif e.kind == "all_reduce":  # NO_SHARD: the padded flat gradient over FSDP's group
            size = (u.flat_numel or u.numel) * reduce
            group = self.spans.get("process_group")
            self._collective(
                rec, "all_reduce", size, self.pg_ws, self.t_compute, 0.0, group, _GRADS
            )
        else:
            ranks = self.shard_ws
            shards = u.padded_numel // max(u.sharded_numel, 1)
            size = reduced_shard_numel(u, self.fsdp2) * shards * reduce
            # FSDP2's copy-in: the gradients (cast to the reduce dtype) into the buffer, after
            # the gradients sharded on dim != 0 are each rebuilt (torch.cat of their chunks)
            rebuilt = sum(b for f, b in placed_bytes(u).items() if f not in u.frozen_params)
            extra = self.m.memory_seconds(2 * (size + rebuilt)) if self.fsdp2 else 0.0
            shard = self.spans["shard"]
            self._collective(
                rec, "reduce_scatter", size, ranks, self.t_compute, extra, shard, _GRADS
            )

    def _tensor_parallel(self, rec: dict[str, Any], kind: str, size: float) -> None:
        """A tensor-parallel collective of an activation (or a partial gradient) over the tp
        ranks, inside a node: the compute after it needs its result, so it waits for it."""
        rec["stream"] = "tp"
        start = max(self.t_compute, self.t_tp, rec["issued"])
        ranks = self.tp
        span = self.spans.get("tp")
        dur = self.m.collective_seconds(kind, size, ranks, span) if ranks > 1 else 0.0
        rec["start"], rec["end"] = start, start + dur
        rec["bytes"] = (ranks - 1) / ranks * size * (2 if kind == "all_reduce" else 1)
        self.bytes[rec["kind"]] = self.bytes.get(rec["kind"], 0.0) + rec["bytes"]
        self.t_tp = rec["end"]
        if rec["end"] > self.gate:
            self.gate, self.gate_by = rec["end"], len(self.records) - 1

    def _pipeline(self, rec: dict[str, Any], e: Event) -> None:
        """A send to (or receive from) the neighbouring stage's rank, on the link the pp mesh
        dimension puts them on: a send starts once its compute is done and the peer posted
        the receive, one at a time; the compute after a receive waits for the peer's send
        (that wait is the pipeline's bubble)."""
        rec["stream"] = "pp"
        rec["bubble"] = 0.0
        key = p2p_key(e)
        size = float(e.nbytes or 0)
        rec["bytes"] = size
        self.bytes[e.kind] = self.bytes.get(e.kind, 0.0) + size
        if e.kind == "pp_send":
            span = self.spans.get("pp")
            dur = self.m.p2p_seconds(size, bool(span and span.across_nodes))
            start = max(self.t_compute, self.t_pp, self.p2p.posted.get(key, 0.0))
            rec["start"], rec["end"] = start, start + dur
            self.t_pp = rec["end"]
            self.p2p.send(key, start, start + dur)
            return
        self.p2p.post(key, rec["issued"])
        start, end = self.p2p.sent.get(key, (self.t_compute, self.t_compute))
        rec["start"], rec["end"] = max(start, rec["issued"]), max(end, rec["issued"])
        self.received[key] = (rec["end"], len(self.records) - 1)

    def _await(self, action: str) -> None:
        """A stage's forward (backward) of a microbatch: its compute waits for the activations
        (gradients) the stage received for it, as ``_step_microbatches`` waits on the receive."""
        match = _ACTION.fullmatch(action)
        if match is None:
            return
        stage, kind, mb = int(match[1]), match[2], int(match[3])
        key = ("F", stage - 1, mb) if kind == "F" else ("B", stage + 1, mb)
        got = self.received.pop(key, None)
        if got is not None and got[0] > self.gate:
            self.gate, self.gate_by = got

    def _context_parallel(self, rec: dict[str, Any], kind: str, size: float) -> None:
        """A collective of ring attention over the cp group, on its own stream from when the
        CPU issued it; the compute waits for it at the ring's wait (``_CP_WAITS``). The
        all-gather moves ``(cp - 1) / cp`` of the gathered ``size``; the all-to-all passes the
        whole buffer to the next rank."""
        rec["stream"] = "cp"
        start = max(self.t_compute, self.t_cp, rec["issued"])
        span = self.spans.get("cp")
        ranks = self.cp
        if kind == "all_gather":
            dur = self.m.collective_seconds("all_gather", size, ranks, span)
            moved = (ranks - 1) / ranks * size
        else:
            dur = self.m.send_seconds(size, span)
            moved = size
        rec["start"], rec["end"] = start, start + dur
        rec["bytes"] = moved if ranks > 1 else 0.0
        self.bytes[rec["kind"]] = self.bytes.get(rec["kind"], 0.0) + rec["bytes"]
        self.t_cp = rec["end"]
        self.cp_done[kind] = (rec["end"], len(self.records) - 1)

    def _copy(self, rec: dict[str, Any], nbytes: float, start: float) -> None:
        """A host-device copy on the copy stream, one at a time."""
        rec["stream"] = "copy"
        start = max(start, rec["issued"])  # not before the CPU issued it
        rec["start"], rec["end"] = start, start + self.m.copy_seconds(nbytes)
        rec["bytes"] = float(nbytes)
        self.bytes[rec["kind"]] = self.bytes.get(rec["kind"], 0.0) + nbytes
        self.t_copy = rec["end"]

    def _all_gather_gate(self) -> float:
        if self.fsdp2:
            return self.last_wait
        if self.limit and len(self.frees) >= 2:
            freed = self.frees.pop(0)
            self.limited_by = self.free_events.pop(0)
            self.t_cpu = max(self.t_cpu, freed)  # the CPU blocks until that free is done
            return freed
        return 0.0

    def _collective(
        self,
        rec: dict[str, Any],
        kind: str,
        size: float,
        ranks: int,
        gate: float,
        extra: float = 0.0,
        span: Span | None = None,
        held: tuple[str, int] = ("", -1),
    ) -> None:
        start = max(self.t_comm, gate, rec["issued"])  # not before the CPU issued it
        if start > rec["issued"]:
            stream = start == self.t_comm and self.comm_last >= 0
            rec["held"], rec["held_by"] = ("stream", self.comm_last) if stream else held
        elif held[0] == "rate_limiter":  # issued (and started) when the limiter let it
            rec["held"], rec["held_by"] = held
        dur = self.m.collective_seconds(kind, size, ranks, span) + (extra if ranks > 1 else 0.0)
        rec["start"], rec["end"] = start, start + dur
        rec["bytes"] = (ranks - 1) / ranks * size * (2 if kind == "all_reduce" else 1)
        self.bytes[kind] = self.bytes.get(kind, 0.0) + rec["bytes"]
        self.t_comm = start + dur
        self.comm_last = rec["index"]
