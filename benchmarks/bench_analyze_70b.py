"""Analysis cost on a Llama-3-70B-shaped model, measured side by side in one process.

Builds ``LlamaForCausalLM`` on the meta device (80 layers, hidden 8192,
vocab 128256), 512 tokens, and alternates three arms so all see the same
machine load: a bare meta-device forward+backward, ``fsdpviz.analyze(...,
profile=False)`` (the engine: target at most 1.5x the bare pass) and
``fsdpviz.analyze`` with the memory/time probe (target: at most 1.2x the
engine). Also prints the process's peak RSS (target: under 1.5 GB). With ``--tp``: the
README's FSDP 32 x TP 8 plan (``parallelize_plan`` on every layer's projections, 8,192
tokens; target: analysed in under 10 s).

    python benchmarks/bench_analyze_70b.py [--repeats 5] [--forward-prefetch | --fsdp2 | --tp]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from torch.distributed.fsdp import BackwardPrefetch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz


def build(
    tokens: int = 512,
) -> tuple[torch.nn.Module, dict[str, torch.Tensor], type[torch.nn.Module]]:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    cfg = LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    return model, {"input_ids": ids}, LlamaDecoderLayer


def bare_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> float:
    t0 = time.perf_counter()
    out = model(**inputs)
    out.logits.sum().backward()
    for p in model.parameters():
        p.grad = None
    return time.perf_counter() - t0


def analyze_step(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    layer: type,
    forward_prefetch: bool,
    fsdp2: bool = False,
    profile: bool = True,
    tp: bool = False,
) -> float:
    t0 = time.perf_counter()
    if tp:
        from torch.distributed.tensor.parallel import ColwiseParallel as Col
        from torch.distributed.tensor.parallel import RowwiseParallel as Row

        at = "model.layers.*."
        plan = {at + "self_attn.[qkv]_proj": Col(), at + "self_attn.o_proj": Row(),
                at + "mlp.[gu]*_proj": Col(), at + "mlp.down_proj": Row()}  # fmt: skip
        report = fsdpviz.analyze(
            model, inputs, parallelize_plan=plan, fully_shard=[layer],
            mesh=("dp_shard", 32, "tp", 8), progress=False, profile=profile,
        )  # fmt: skip
    elif fsdp2:
        report = fsdpviz.analyze(
            model, inputs, fully_shard=[layer], world_size=64, progress=False, profile=profile
        )
    else:
        report = fsdpviz.analyze(
            model,
            inputs,
            auto_wrap_policy=ModuleWrapPolicy({layer}),
            backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
            forward_prefetch=forward_prefetch,
            world_size=64,
            progress=False,
            profile=profile,
        )
    elapsed = time.perf_counter() - t0
    assert len(report.units) == 81
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--forward-prefetch", action="store_true")
    parser.add_argument("--fsdp2", action="store_true", help="fully_shard every decoder layer")
    parser.add_argument("--tp", action="store_true", help="the README's FSDP 32 x TP 8 plan")
    args = parser.parse_args()
    model, inputs, layer = build(8192 if args.tp else 512)
    fp, v2, tp = args.forward_prefetch, args.fsdp2, args.tp
    bare_step(model, inputs)  # warm-up every path
    analyze_step(model, inputs, layer, fp, v2, profile=False, tp=tp)
    analyze_step(model, inputs, layer, fp, v2, tp=tp)
    bare: list[float] = []
    engine: list[float] = []
    full: list[float] = []
    for _ in range(args.repeats):
        bare.append(bare_step(model, inputs))
        engine.append(analyze_step(model, inputs, layer, fp, v2, profile=False, tp=tp))
        full.append(analyze_step(model, inputs, layer, fp, v2, tp=tp))
    b, e, f = (statistics.median(x) for x in (bare, engine, full))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    api = "FSDP2 fully_shard per layer" if v2 else f"FSDP1 ModuleWrapPolicy, forward_prefetch={fp}"
    if tp:
        api = "FSDP2 x TP: mesh dp_shard 32 x tp 8, parallelize_plan on every layer"
    tokens = inputs["input_ids"].shape[1]
    print(f"model: Llama-3-70B shape, 80 layers, {tokens} tokens; {api}")
    print(f"bare meta forward+backward:          median {b:.3f} s over {args.repeats}")
    print(f"analyze(profile=False) (the engine): median {e:.3f} s")
    print(f"analyze (engine + cost probe):       median {f:.3f} s")
    print(f"engine / bare: {e / b:.2f}x (target <= 1.5x)")
    print(f"cost probe adds: {f / e:.2f}x (target <= 1.2x); analyze / bare: {f / b:.2f}x")
    print(f"peak RSS of this process: {rss_mb:.0f} MB (target < 1536 MB)")
    if tp:
        print(f"analyze of the README's FSDP 32 x TP 8 example: {f:.2f} s (target < 10 s)")


if __name__ == "__main__":
    main()
