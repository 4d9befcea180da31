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
reduce-scatter buffer (on the compute stream, in its post-backward hook: ``foreach_reduce``
allocates the buffer and copies into it there, and the reduce-scatter's stream waits for it;
since pytorch#129721, so that the buffer is in the compute stream's pool): each a
memory-bound pass. A
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
:class:`~fsdpviz.cost.optimizers.OptimizerSpec`; on the host under CPU offload) and over the
parameters FSDP does not manage (``report.ignored_params``, whole, on the device). CPU offload's
``h2d`` copies (a shard to the device; its all-gather waits for it) and ``d2h`` copies (a
gradient shard back, after its reduction) run one at a time on a copy stream. With FSDP2's
float8 all-gather and torchao's ``precompute_float8_dynamic_scale_for_fsdp`` (torchtitan calls
it after ``optimizer.step()``), its ``torch._foreach_norm`` of the float8 weights' local
shards (memory-bound: each shard read once, and the kernels' launches) starts when the
optimizer's last kernel ends, the all-reduce of every float8 weight's amax when the norms end
(``held="optimizer"``), and the scales' clamp and reciprocal (a few kernels on one amax per
weight) when it does; the step ends with them, and the next step's first all-gather after
that. ``Timeline.step_work`` places this compute and the optimizer step's.

Throughput is reported as users read it: ``tokens_per_s`` per GPU (the traced batch is
one rank's), ``mfu`` (model FLOPs utilisation: three times the forward's matrix-multiply
and attention FLOPs, ``6 N + 12 l h q t`` per token for a transformer as torchtitan and
llm-foundry count it, over the step and the GPU's dense peak) and ``hfu`` (hardware FLOPs:
what ran, activation-checkpoint recomputation included).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fsdpviz._deferred_gc import deferring_collection
from fsdpviz.cost.fit import machine_of
from fsdpviz.cost.float8_precompute import after_optimizer, after_step_totals
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.hook_calls import iteration_index
from fsdpviz.cost.kernels import machine_key
from fsdpviz.cost.optimizers import optimizer_spec
from fsdpviz.cost.pipeline_time import P2PTimes, pipeline_timelines
from fsdpviz.cost.sizes import itemsize
from fsdpviz.cost.time_sim import MicroStepSim
from fsdpviz.cost.topology import tp_strategies_moved
from fsdpviz.errors import ConfigError
from fsdpviz.schema.report import Report
from fsdpviz.schema.rows import ComputeStretch, MicroStep, StepWork
from fsdpviz.schema.timeline import Timeline


@deferring_collection
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
    (:func:`fsdpviz.cost.pipeline_time.pipeline_timelines`).

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
    runs: dict[int, MicroStepSim] = {}
    for k in dict.fromkeys(micro_steps):
        runs[k] = MicroStepSim(report, m, k, limit_all_gathers, compiled=compiled, p2p=p2p)
        runs[k].run()
    sim = runs[i]
    sums: dict[str, float] = {}
    micro: list[MicroStep] = []
    t = 0.0
    # a pipeline's micro-steps each reduce: its REDUCE_GRAD turns gradient sync on in every
    # step() (PipelineStage.perform_reduce_grad)
    every = report.config.grad_accum == 1 or report.pipeline is not None
    for n, k in enumerate(micro_steps):
        own = runs[k].own_totals()
        for key, value in own.items():
            sums[key] = sums.get(key, 0.0) + value
        sync = every or n == len(micro_steps) - 1
        step_row = {"iteration": k, "start": t, "end": t + runs[k].end, "sync": sync, **own}
        micro.append(MicroStep.from_dict(step_row))
        t += runs[k].end
    opt_s = _optimizer_seconds(report, m, optimizer)
    # torchao's precomputation of float8 scales, after the optimizer step (the step's last
    # micro-step's, in its time)
    last = runs[micro_steps[-1]]
    done = last.end + opt_s
    end, precompute = after_optimizer(last.after_step, done, report, m, last.ranks, last.waits)
    after = end - done
    for key, value in after_step_totals(last.after_step).items():
        sums[key] += value
    step = t + opt_s + after
    comm, exposed = sums["comm_s"], sums["exposed_comm_s"]
    count = len(micro_steps)
    # the ranks of a tensor-parallel group share their tokens
    tokens = (
        float(report.profile.tokens if report.profile is not None else 0)
        * count
        / report.config.parallel_dims.tp
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
        for role, s in sim.ranks.spans.items()
        if role != "process_group"
    ]
    notes = list(sim.notes) + _notes(report, m, sim, compiled)
    events = [r.placed() for r in (*sim.records, *sim.after_step)]
    compute = _rates(sim.compute, m, sim.dtype)
    work: list[StepWork] = []
    if sim is last:  # the optimizer step follows this micro-step: in its time
        work = [_optimizer_work(report, optimizer, last.end, opt_s)] if opt_s > 0 else []
        work += precompute
    return Timeline(described, events, compute, totals, notes, sim.hooks, sim.waits, micro, work)


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


def _notes(report: Report, m: Machine, sim: MicroStepSim, compiled: bool) -> list[str]:
    """What the time model assumed that the user may want to change."""
    notes: list[str] = []
    if sim.tally.float32_matmuls:
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
    if compiled and not sim.tally.fused_measured and sim.measured:
        notes.append(
            "compile: the trace holds no fused regions (a report saved before they were "
            "measured); the compute is costed eager"
        )
    moved = tp_strategies_moved(report.config, m.gpus_per_node)
    if moved is not None:
        notes.append(moved)
    trainable = report.trainable_text()
    if trainable:
        notes.append(
            f"{trainable}: the backward computes no weight gradient for the frozen ones (the "
            "trace's kernels, hfu), the optimizer steps the trainable shards only; mfu counts "
            "the forward's FLOPs three times, as for full training"
        )
    return notes


def _rates(compute: list[ComputeStretch], m: Machine, dtype: str) -> list[ComputeStretch]:
    """Each stretch with its ``duration``, achieved ``flops_per_s`` and share of the peak."""
    peak = m.peak_flops(dtype)
    rated = []
    for c in compute:
        dur = c.end - c.start
        rate = c.flops / dur if dur > 0 else 0.0
        share = rate / peak if peak > 0 else 0.0
        rated.append(  # (dataclasses.replace, without its per-call field walk)
            ComputeStretch(
                c.hook, c.unit, c.index, c.start, c.end, c.flops, c.phase, c.owner,
                c.next_event, dur, rate, share, c.action, c.stage, c.microbatch, c.rank,
            )
        )  # fmt: skip
    return rated


def _optimizer_bytes(report: Report, optimizer: str | int | None) -> tuple[float, float]:
    """The optimizer step's memory traffic: of FSDP's trainable shards, and of the trainable
    parameters it does not manage."""
    spec = optimizer_spec(optimizer)
    # the trainable shards; fused Adam: read param + grad + states, write param + states;
    # foreach: each operation a pass of its own (OptimizerSpec.passes)
    touched = sum(u.trainable[1] * itemsize(u.dtype) * spec.passes() for u in report.units)
    # the parameters FSDP does not manage (report.ignored_params), whole on every rank: the
    # same passes over each trainable one, in its own dtype, on the device (CPU offload
    # moves only what FSDP manages)
    ignored = sum(p.bytes for p in report.ignored_params if p.requires_grad) * spec.passes()
    return float(touched), float(ignored)


def _optimizer_seconds(report: Report, m: Machine, optimizer: str | int | None) -> float:
    spec = optimizer_spec(optimizer)
    if spec.states == 0 and optimizer is None:
        return 0.0
    touched, ignored = _optimizer_bytes(report, optimizer)
    # CPU offload: the shards, gradients and states are in host memory, stepped on the CPU
    host = report.config.cpu_offload
    return touched / ((m.host_gbps if host else m.hbm_gbps) * 1e9) + ignored / (m.hbm_gbps * 1e9)


def _optimizer_work(
    report: Report, optimizer: str | int | None, start: float, seconds: float
) -> StepWork:
    """The optimizer step as :func:`_optimizer_seconds` prices it, from ``start``."""
    spec = optimizer_spec(optimizer)
    touched, ignored = _optimizer_bytes(report, optimizer)
    where = "in host memory, on the CPU" if report.config.cpu_offload else "in device memory"
    name = spec.name if spec.implementation == "foreach" else f"{spec.name}_{spec.implementation}"
    text = (
        f"optimizer step ({name}): {spec.passes()} passes over the trainable shards (reads "
        f"and writes), {where}"
    )
    return StepWork("optimizer", start, start + seconds, touched + ignored, 0, text)
