"""Will the README's Llama-3-70B plan fit, and what makes it fit: the numbers the README quotes.

The README's FSDP 32 x TP 8 plan of Llama-3-70B (8,192 tokens per rank, fp32) as it stands,
then with every decoder layer checkpointed (``analyze(..., activation_checkpointing=[layer])``, as
``apply_activation_checkpointing`` and torchtitan's ``activation_checkpoint.mode = "full"`` do)
and bf16 compute (``MixedPrecisionPolicy``): for each,
the peak, whether it fits an H100 (``report.memory.fit_text()``), the first thing the
``out_of_memory`` warning says to try, the modelled step, and how long the analysis took.

    python benchmarks/bench_fit_70b.py [--machine h100]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from bench_analyze_70b import build  # the same Llama-3-70B shape
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import fsdpviz


def tp_plan(at: str) -> dict[str, Any]:
    """The README's plan, for the layers' modules under ``at``."""
    return {
        at + "self_attn.[qkv]_proj": ColwiseParallel(),
        at + "self_attn.o_proj": RowwiseParallel(),
        at + "mlp.[gu]*_proj": ColwiseParallel(),
        at + "mlp.down_proj": RowwiseParallel(),
    }


def show(name: str, report: fsdpviz.Report, seconds: float) -> None:
    mem = report.memory
    print(f"== {name} (analysed in {seconds:.1f} s)")
    print(mem.summary())
    for w in report.warnings:
        if w.code == "out_of_memory":
            print("first try:", w.message.split("First try: ", 1)[1])
    print(report.timeline.summary())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", default="h100")
    args = parser.parse_args()
    model, _, layer = build()
    ids = torch.zeros(1, 8192, dtype=torch.long)
    mesh = ("dp_shard", 32, "tp", 8)
    common = {"fully_shard": [layer], "mesh": mesh, "machine": args.machine, "progress": False}
    t0 = time.perf_counter()
    eager = fsdpviz.analyze(model, ids, parallelize_plan=tp_plan("model.layers.*."), **common)
    show("as in the README", eager, time.perf_counter() - t0)
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    plan = tp_plan("model.layers.*.")
    t0 = time.perf_counter()
    fixed = fsdpviz.analyze(
        model,
        ids,
        parallelize_plan=plan,
        mp_policy=bf16,
        activation_checkpointing=[layer],
        **common,
    )
    show("every layer checkpointed, bf16 compute", fixed, time.perf_counter() - t0)
    cmp = fsdpviz.compare(eager, fixed, names=("as in the README", "checkpointed, bf16"))
    print("\n".join(cmp.summary().splitlines()[:8]))


if __name__ == "__main__":
    main()
