"""What a whole ``fsdpviz.tune`` search costs against one ``fsdpviz.analyze`` of the same model,
measured side by side in one process (target: at most 15 x).

The user's configuration is the model as built (float32, no checkpointing) with one
``fully_shard`` per decoder layer, on 8 H100s: Llama-3-8B with 2 x 8192 tokens per rank
(``--model 8b``), Llama-3-70B with 1 x 8192 (``--model 70b``, which fits only from 64 ranks:
``--world-size 8,64``). The arms alternate ``--repeats`` times so both see the same machine
load, each from a cold start (shape-only results on meta forgotten first); the ratio of the
medians is printed in wall-clock seconds and in CPU seconds (this process and the workers tune
forks: on a loaded machine the CPU ratio is the steadier one), with the search's traces and
configurations and its best.

    python benchmarks/bench_tune.py [--model 8b|70b] [--world-size 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

import fsdpviz
from fsdpviz.trace import meta_cache

SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                num_attention_heads=64, num_key_value_heads=8, vocab_size=128256),
}  # fmt: skip
BATCH = {"8b": 2, "70b": 1}


def build(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor], type[torch.nn.Module]]:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**SHAPES[name]))
    ids = torch.zeros(BATCH[name], 8192, dtype=torch.long)
    return model, {"input_ids": ids, "use_cache": False}, LlamaDecoderLayer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="8b")
    parser.add_argument("--world-size", default="8", help="ranks, or counts: 8,64")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(w) for w in args.world_size.split(",")]
    model, inputs, layer = build(args.model)
    user = {"fully_shard": [layer]}
    analyze_s: list[float] = []
    tune_s: list[float] = []
    analyze_cpu: list[float] = []
    tune_cpu: list[float] = []
    tuning = None
    for _ in range(args.repeats):
        meta_cache.clear()
        t0, c0 = time.perf_counter(), _cpu()
        fsdpviz.analyze(model, inputs, world_size=sizes[0], progress=False, **user)
        analyze_s.append(time.perf_counter() - t0)
        analyze_cpu.append(_cpu() - c0)
        meta_cache.clear()
        t0, c0 = time.perf_counter(), _cpu()
        tuning = fsdpviz.tune(model, inputs, world_size=sizes, progress=False, **user)
        tune_s.append(time.perf_counter() - t0)
        tune_cpu.append(_cpu() - c0)
    assert tuning is not None
    a, t = statistics.median(analyze_s), statistics.median(tune_s)
    ac, tc = statistics.median(analyze_cpu), statistics.median(tune_cpu)
    print(f"Llama-3-{args.model.upper()} on {args.world_size} x H100, {args.repeats} repeats")
    print(f"  analyze (the configuration as given): {a:.2f} s median ({_all(analyze_s)})")
    print(f"  tune (the whole search):              {t:.2f} s median ({_all(tune_s)})")
    print(f"  ratio: {t / a:.1f} x wall-clock (target: at most 15 x)")
    print(f"  CPU: analyze {ac:.2f} s, tune {tc:.2f} s (workers included): {tc / ac:.1f} x")
    print(
        f"  {len(tuning.candidates)} configurations, {tuning.traces} traced, "
        f"{len(tuning.fitting)} fit"
    )
    best = tuning.best
    if best is not None:
        print(f"  best: {best.tokens_per_s:,.0f} tokens/s per GPU, {best.verdict()}: {best.label}")


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (tune's forked workers)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _all(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
