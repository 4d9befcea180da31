"""Llama 3.1 405B under pipeline parallelism, as torchtitan trained it on 512 H100s.

torchtitan's Dec 2024 benchmarks (``benchmarks/llama3_h100_202412_torchtitan.md``, Table
5): Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, local batch 32 of 8,192 tokens in 8 microbatches
(torchtitan's default then: the pp degree), full activation checkpointing, torch.compile,
float8 linears with FSDP's float8 all-gather, async TP, H100 96 GB HBM2e at 500 W, 400 Gb/s
per GPU. 1F1B: 100 tokens/s per GPU at 82.5 GiB; Interleaved1F1B (two stages per rank): 128
at 72.7 GiB (the most reserved on any GPU).

Two measurements, side by side in one process:

- ``--speed`` (default): the analysis of the 1F1B job (``analyze(..., profile=False)``, the
  engine, and with the cost probe) against a bare meta forward and backward of the same
  model (one microbatch, in bfloat16 with the same activation checkpointing, as the job
  computes), alternated ``--repeats`` times, in CPU seconds of the process (the development
  machine is shared: wall-clock rounds vary by 2x there).
  Target: the engine at most 1.5x the bare pass.
- ``--published``: both schedules planned from the same job file, their modelled tokens/s
  per GPU and memory (the largest pipeline rank's peak and reserved estimate) beside the
  published ones. Target: the direction (Interleaved1F1B faster and lighter).

    python benchmarks/bench_pipeline_405b.py [--repeats 3] [--published]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from typing import Any

import torch

import fsdpviz

PUBLISHED = {"1F1B": (100.0, 82.5), "Interleaved1F1B": (128.0, 72.7)}


def job(schedule: str) -> Any:
    """torchtitan's 405B job of Table 5 as its 2024 TOML keys gave it."""
    config = {
        "model": {"name": "llama3", "flavor": "405B", "converters": ["float8"]},
        "training": {"local_batch_size": 32, "seq_len": 8192},
        "parallelism": {
            "data_parallel_shard_degree": 8,
            "tensor_parallel_degree": 8,
            "pipeline_parallel_degree": 8,
            "pipeline_parallel_schedule": schedule,
            "pipeline_parallel_microbatches": 8,
            "enable_async_tensor_parallel": True,
        },
        "activation_checkpoint": {"mode": "full"},
        "compile": {"enable": True},
        "float8": {"enable_fsdp_float8_all_gather": True},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the job's notes (async TP, loss parallel)
        return fsdpviz.from_torchtitan(config)


def bare_step(model: torch.nn.Module, tokens: torch.Tensor) -> float:
    t0 = time.process_time()
    model(tokens).float().sum().backward()
    for p in model.parameters():
        p.grad = None
    return time.process_time() - t0


def analyze_step(j: Any, profile: bool) -> tuple[float, fsdpviz.Report]:
    """Its CPU seconds (the machine may be shared) and the report."""
    t0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fsdpviz.analyze(
            j.model, j.inputs, machine="h100-hbm2e", progress=False, profile=profile, **j.config
        )
    return time.process_time() - t0, report


def speed(repeats: int) -> None:
    from fsdpviz.configs.torchtitan import TransformerBlock
    from fsdpviz.trace.checkpointing import apply_checkpointing

    j = job("1F1B")
    bare_model = copy.deepcopy(j.model)
    apply_checkpointing(bare_model, [TransformerBlock])
    with torch.no_grad():  # computing in bfloat16, as FSDP's mp_policy has the job do
        for p in bare_model.parameters():
            p.data = p.data.to(torch.bfloat16)
    microbatch = torch.zeros(32 // 8, 8192, dtype=torch.long, device="meta")
    bare_step(bare_model, microbatch)  # warm-up every path
    analyze_step(j, profile=False)
    analyze_step(j, profile=True)
    bare: list[float] = []
    engine: list[float] = []
    full: list[float] = []
    for _ in range(repeats):
        bare.append(bare_step(bare_model, microbatch))
        engine.append(analyze_step(j, profile=False)[0])
        full.append(analyze_step(j, profile=True)[0])
    b, e, f = (statistics.median(x) for x in (bare, engine, full))
    rounds = ", ".join(f"{x / y:.2f}x" for x, y in zip(engine, bare, strict=True))
    print(f"engine / bare, round by round: {rounds}")
    print("Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, 1F1B, 8 microbatches of 4 x 8192 tokens")
    print(f"bare meta forward+backward (bf16, full AC): median {b:.2f} CPU s over {repeats}")
    print(f"analyze(profile=False) (the engine):  median {e:.2f} s")
    print(f"analyze (engine + cost probe):        median {f:.2f} s")
    print(f"engine / bare: {e / b:.2f}x (target <= 1.5x); analyze / bare: {f / b:.2f}x")


def published() -> None:
    rows = []
    for schedule, (tps, gib) in PUBLISHED.items():
        elapsed, report = analyze_step(job(schedule), profile=True)
        t0 = time.process_time()
        tl = report.timeline
        timed = time.process_time() - t0
        mem = report.memory
        peak = mem.peak["bytes"] / 2**30
        reserved = mem.reserved["bytes"] / 2**30
        rows.append((schedule, tps, tl.totals["tokens_per_s"], gib, peak, reserved))
        share = tl.totals["bubble_s"] / (tl.totals["step_s"] * report.config.parallel_dims.pp)
        print(
            f"{schedule}: analysed in {elapsed:.1f} CPU s, timed in {timed:.1f} s; step "
            f"{tl.totals['step_s']:.1f} s, bubbles {share:.0%} of the GPU time, largest "
            f"peak on pipeline rank {mem.peak['pp_rank']}"
        )
    print()
    print("| schedule | published tokens/s | predicted | error | published GiB | "
          "predicted peak | reserved | error |")  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for schedule, tps, pred, gib, peak, reserved in rows:
        print(
            f"| {schedule} | {tps:.0f} | {pred:.0f} | {pred / tps - 1:+.0%} | {gib} | "
            f"{peak:.1f} | {reserved:.1f} | {reserved / gib - 1:+.0%} |"
        )
    (_, _, one, _, one_peak, one_res), (_, _, two, _, two_peak, two_res) = rows
    faster = two > one
    lighter = two_res < one_res and two_peak < one_peak
    print(
        f"\ndirection: Interleaved1F1B {'faster' if faster else 'NOT faster'} "
        f"({two / one - 1:+.0%}; published +28%) and {'lighter' if lighter else 'NOT lighter'} "
        f"({two_res - one_res:+.1f} GiB reserved, {two_peak - one_peak:+.1f} GiB peak; "
        "published -9.8 GiB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--published", action="store_true")
    args = parser.parse_args()
    if args.published:
        published()
    else:
        speed(args.repeats)


if __name__ == "__main__":
    main()
