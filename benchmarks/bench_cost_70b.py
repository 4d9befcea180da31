"""Cost of the memory and time model on a Llama-3-70B-shaped model, side by side.

Builds ``LlamaForCausalLM`` on the meta device (80 layers, hidden 8192, vocab
128256), 512 tokens, and alternates in one process ``fsdpviz.analyze`` without
the cost model (``profile=False``) and with it (the default: the trace measures
activations and FLOPs) followed by ``report.memory`` and ``report.timeline``, so
both see the same machine load. Times are CPU seconds of this process. Prints
the median times and their ratio
(target: at most 1.20x), the same with the probe's fused-attention substitution
turned off (what measuring alone costs), then times a 12-configuration ``fsdpviz.sweep`` (2 world
sizes x 3 backward prefetch settings x 2 sharding strategies; with --fsdp2: 4
world sizes x 3 ``reshard_after_forward``) against 12 separate ``analyze`` calls,
and says how many traces the sweep ran.

``--events`` times instead the cost model on plans with many events: torchtitan's Llama 3 8B as
FSDP 8 x TP 8 with float8 tensorwise linears (``from_torchtitan``, as bench_published.py plans
its async TP rows: ~25 tensor-parallel collectives per block and micro-step, float8's amax
all-reduces among them) and as plain FSDP2 over 8 GPUs; for each, ``timeline`` and
``memory_model`` alternated in one process with cyclic garbage collection left running
inside them (their ``__wrapped__``, what they were before they paused it) and paused (as
they run): the median per call and per event, and the ratios (collection costs in
proportion to the objects the process holds: little here, where it holds two reports; in
bench_published.py's timing pass, over 80, a quarter of the time).

    python benchmarks/bench_cost_70b.py [--repeats 5] [--fsdp2] [--events]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from bench_analyze_70b import build  # the same Llama-3-70B shape
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz


def kwargs_for(layer: type, fsdp2: bool) -> dict[str, Any]:
    if fsdp2:
        return {"fully_shard": [layer], "world_size": 64, "progress": False}
    return {
        "auto_wrap_policy": ModuleWrapPolicy({layer}),
        "backward_prefetch": BackwardPrefetch.BACKWARD_PRE,
        "world_size": 64,
        "progress": False,
    }


# CPU time of this process: other jobs on a shared machine do not skew the ratios.
CLOCK = time.process_time


def plain(model: torch.nn.Module, inputs: Any, kw: dict[str, Any]) -> float:
    t0 = CLOCK()
    report = fsdpviz.analyze(model, inputs, profile=False, **kw)
    elapsed = CLOCK() - t0
    assert report.profile is None and len(report.units) == 81
    return elapsed


def with_cost(model: torch.nn.Module, inputs: Any, kw: dict[str, Any]) -> float:
    t0 = CLOCK()
    report = fsdpviz.analyze(model, inputs, **kw)
    peak = report.memory.peak["bytes"]
    step = report.timeline.totals["step_s"]
    elapsed = CLOCK() - t0
    assert peak > 0 and step > 0
    return elapsed


def math_attention(model: torch.nn.Module, inputs: Any, kw: dict[str, Any]) -> float:
    """The cost model with the fused-attention substitution off: the probe's own overhead."""
    from fsdpviz.trace import attention

    fused = attention._fused
    attention._fused = lambda *a, **k: None  # type: ignore[assignment]
    try:
        return with_cost(model, inputs, kw)
    finally:
        attention._fused = fused


def events(repeats: int) -> None:
    """The ``--events`` arms (see the module's docstring)."""
    from bench_published import ROWS, TT_ASYNC_TP, analyze_row, row_machine

    from fsdpviz.cost import memory_model, timeline

    tp_row = next(
        r
        for r in ROWS
        if r.source == TT_ASYNC_TP and r.model == "llama3:8B" and r.float8 == "tensorwise"
    )
    plans = [("8B FSDP 8 x TP 8, float8 tensorwise", tp_row), ("8B FSDP2 over 8", ROWS[0])]
    reports = [(name, row, analyze_row(row)) for name, row in plans]
    for name, row, report in reports:
        m = row_machine(row)
        n = len(report.iterations[-1])
        arms: dict[str, list[float]] = {}
        for _ in range(repeats):  # the arms in turn, so that both see the same machine load
            for model, fn in (("timeline", timeline), ("memory_model", memory_model)):
                for gc_on in (True, False):
                    call = fn.__wrapped__ if gc_on else fn  # type: ignore[attr-defined]
                    kw = {"optimizer": row.optimizer_name}
                    t0 = CLOCK()
                    call(report, m, **kw) if fn is timeline else call(report, machine=m, **kw)
                    arms.setdefault(f"{model} {gc_on}", []).append(CLOCK() - t0)
        print(f"{name}: {n} events per micro-step")
        for model in ("timeline", "memory_model"):
            on = statistics.median(arms[f"{model} True"])
            off = statistics.median(arms[f"{model} False"])
            print(
                f"  {model}: {off * 1e3:.1f} ms ({off / n * 1e6:.1f} us per event); with cyclic "
                f"GC running inside it {on * 1e3:.1f} ms: {on / off:.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fsdp2", action="store_true", help="fully_shard every decoder layer")
    parser.add_argument("--events", action="store_true", help="the plans with many events")
    args = parser.parse_args()
    if args.events:
        events(args.repeats)
        return
    model, inputs, layer = build()
    kw = kwargs_for(layer, args.fsdp2)
    plain(model, inputs, kw)  # warm-up both paths
    with_cost(model, inputs, kw)
    math_attention(model, inputs, kw)
    base: list[float] = []
    cost: list[float] = []
    unfused: list[float] = []
    for _ in range(args.repeats):
        base.append(plain(model, inputs, kw))
        cost.append(with_cost(model, inputs, kw))
        unfused.append(math_attention(model, inputs, kw))
    b, c, u = statistics.median(base), statistics.median(cost), statistics.median(unfused)
    report = fsdpviz.analyze(model, inputs, **kw)
    times = []
    for _ in range(args.repeats):  # the time model alone, on a fresh call each round
        t0 = CLOCK()
        fsdpviz.cost.timeline(report, "h100")
        times.append(CLOCK() - t0)
    tl_s = statistics.median(times)
    api = "FSDP2 fully_shard per layer" if args.fsdp2 else "FSDP1 ModuleWrapPolicy, BACKWARD_PRE"
    print(f"model: Llama-3-70B shape, 80 layers, 512 tokens, world size 64; {api}")
    print(f"analyze(profile=False):                     median {b:.3f} s over {args.repeats}")
    print(f"analyze + report.memory + report.timeline:  median {c:.3f} s over {args.repeats}")
    print(f"ratio with / without the cost model: {c / b:.2f}x (target <= 1.20x)")
    print(f"fsdpviz.cost.timeline(report) alone: median {tl_s * 1e3:.0f} ms (target < 500 ms)")
    print(
        f"  same with attention left to its math decomposition: median {u:.3f} s, {u / b:.2f}x "
        "(the probe's own overhead; the fused kernel the probe substitutes runs fewer operators)"
    )

    if args.fsdp2:
        grid: dict[str, Any] = {
            "world_size": [8, 16, 32, 64],
            "reshard_after_forward": [True, False, 2],
        }
    else:
        grid = {
            "world_size": [8, 64],
            "backward_prefetch": [
                BackwardPrefetch.BACKWARD_PRE,
                BackwardPrefetch.BACKWARD_POST,
                None,
            ],
            "sharding_strategy": [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP],
        }
    n = 12
    base_kw = {k: v for k, v in kw.items() if k not in grid}
    t0 = CLOCK()
    table = fsdpviz.sweep(model, inputs, **base_kw, **grid)
    sweep_s = CLOCK() - t0
    assert len(table.rows) == n
    print(
        f"sweep of {n} configurations: {sweep_s:.2f} s, {table.traces} trace(s) "
        f"({sweep_s / n:.3f} s per configuration; one analyze with the cost model: {c:.2f} s, "
        f"{n} of them: {n * c:.1f} s)"
    )
    best = min(table.rows, key=lambda r: r["exposed_comm_s"])
    print(
        f"least exposed communication: {best['config']} -> {best['exposed_comm_s'] * 1e3:.1f} ms,"
        f" peak {best['peak_gib']:.1f} GiB"
    )


if __name__ == "__main__":
    main()
