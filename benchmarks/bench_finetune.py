"""Fine-tuning with adapters against published runs: tokens/s and peak memory per GPU.

Each run is rebuilt as its recipe runs it (model shape on the meta device, adapters as
``peft.get_peft_model`` adds them, dtype, wrap plan, activation checkpointing, compile,
batch, GPU) and ``fsdpviz.analyze`` plans it; the time model's tokens/s and the memory
model's peak (allocated, and the allocator's reserved estimate) are printed beside what
was published. No constant of the time model was fitted on these runs.

Sources:

- torchtune, ``README.md`` (September 2024, "Memory and training speed"): Llama 3.1 70B
  LoRA on 8 A100, 27.6 GiB peak memory per GPU, 3,497 tokens/s; batch size 2 of sequences
  packed to 2,048 tokens, torch.compile. The recipe, ``recipes/configs/llama3_1/70B_lora.yaml``
  of that commit: LoRA of rank 16 on the attention's q, k and v projections, bf16 weights
  and adapters (``dtype: bf16``, no mixed precision), AdamW (fused), activation
  checkpointing of every layer, ``CEWithChunkedOutputLoss`` (the output projection in 8
  chunks, each upcast to fp32 in the loss), ``fully_shard`` on every layer then the root.
  The recipe logged ``tokens_per_second_per_gpu`` as the tokens of one rank's step over
  its time; 3,497 tokens/s on one A100 would need 1.5 PFLOP/s of a 70B model's
  4 x 70e9 FLOPs per token (forward, input gradients, recomputation), five times the GPU's
  peak, so it is read here as the 8 GPUs' sum (437 per GPU).
- fms-acceleration, ``scripts/benchmarks/refs/a100_80gb.csv`` (the reference runs of
  ``scripts/benchmarks/scenarios.yaml`` without an acceleration framework): Mistral-7B full
  and LoRA (rank 16 on q, k, v and o) on 2 A100 80 GB through ``fms-hf-tuning`` (the
  transformers Trainer), FSDP1 from ``scripts/benchmarks/accelerate.yaml``
  (TRANSFORMER_BASED_WRAP, FULL_SHARD, BACKWARD_PRE, no mixed precision: bf16 weights),
  gradient checkpointing, flash attention, 2 sequences per GPU of Alpaca, padded per batch.
  Published: ``train_tokens_per_second`` (per GPU: transformers counts one process's batches) and
  ``mem_peak_torch_mem_alloc_in_bytes``. Alpaca's sequence lengths are not published with
  the runs; the plan takes 512 tokens for the longest batch (the peak) and for the
  throughput, and prints the peak at 256 and 1,024 too.

    python benchmarks/bench_finetune.py
"""

from __future__ import annotations

import os
import warnings
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
import torch.nn.functional as F
from torch import nn

import fsdpviz
from fsdpviz.cost import machine, timeline

GIB = 2**30


class ChunkedOutput(nn.Module):
    """torchtune's chunked output: the decoder's hidden states, the output projection
    applied to each of ``chunks`` slices of the sequence (the model keeps it in the root's
    group); the loss upcasts one chunk at a time (``CEWithChunkedOutputLoss``)."""

    def __init__(self, causal_lm: nn.Module, chunks: int = 8) -> None:
        super().__init__()
        self.causal_lm = causal_lm
        self.chunks = chunks

    def forward(self, input_ids: torch.Tensor) -> list[torch.Tensor]:
        base = self.causal_lm.get_base_model()
        hidden = base.model(input_ids=input_ids).last_hidden_state
        return [base.lm_head(h) for h in hidden.chunk(self.chunks, dim=1)]


def chunked_cross_entropy(chunks: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros((), device=chunks[0].device)
    for logits in chunks:
        labels = torch.zeros(logits.shape[:2], dtype=torch.long, device=logits.device)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")
        total = total + loss
    return total


def torchtune_70b_lora() -> fsdpviz.Report:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0, torch_dtype=torch.bfloat16,
    )  # fmt: skip
    with torch.device("meta"):
        base = LlamaForCausalLM(config).to(torch.bfloat16)
        lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj"])
        # torchtune builds the model and its adapters in bf16 (dtype: bf16)
        model = ChunkedOutput(get_peft_model(base, lora).to(torch.bfloat16))
    ids = torch.zeros(2, 2048, dtype=torch.long)
    return fsdpviz.analyze(
        model, ids, loss=chunked_cross_entropy, fully_shard=[LlamaDecoderLayer],
        reshard_after_forward={"": False}, activation_checkpointing=[LlamaDecoderLayer],
        compile=True, world_size=8, machine="a100", progress=False,
    )  # fmt: skip


def fms_mistral_7b(lora: bool, seq: int) -> fsdpviz.Report:
    from peft import LoraConfig, get_peft_model
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(torch_dtype=torch.bfloat16)  # Mistral-7B-v0.1's shape
    with torch.device("meta"):
        model: nn.Module = MistralForCausalLM(config).to(torch.bfloat16)
        if lora:
            adapters = LoraConfig(
                r=16, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
            )
            model = get_peft_model(model, adapters)  # the adapters in fp32, as peft adds them
    base = model.get_base_model() if lora else model
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    base.train()
    accelerate = {
        "distributed_type": "FSDP", "num_processes": 2, "mixed_precision": "no",
        "fsdp_config": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                        "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": False,
                        "fsdp_sharding_strategy": 1, "fsdp_offload_params": False},
    }  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fsdpviz.ConfigNote)
        plan = fsdpviz.from_accelerate(accelerate, model)
    ids = torch.zeros(2, seq, dtype=torch.long)
    return fsdpviz.analyze(model, {"input_ids": ids, "labels": ids}, machine="a100",
                           progress=False, **plan)  # fmt: skip


def _row(name: str, report: fsdpviz.Report, gpus: int, tokens: float, memory_gib: float,
         per_gpu: bool = True) -> dict[str, Any]:  # fmt: skip
    tl = timeline(report, machine("a100", network="nvlink3"))
    speed = tl.totals["tokens_per_s"] * (1 if per_gpu else gpus)
    mem = report.memory
    return {
        "run": name,
        "published_tokens_s": tokens,
        "predicted_tokens_s": speed,
        "published_gib": memory_gib,
        "peak_gib": mem.peak["bytes"] / GIB,
        "reserved_gib": mem.reserved["bytes"] / GIB,
        "trainable": report.trainable_text() or "all parameters train",
    }


def main() -> None:
    rows = [
        _row("torchtune Llama 3.1 70B LoRA r16 (q,k,v), 8xA100, b2 x 2048, AC, compile",
             torchtune_70b_lora(), 8, 3497, 27.6, per_gpu=False),
        _row("fms-acceleration Mistral-7B full, 2xA100, b2 x 512, GC",
             fms_mistral_7b(False, 512), 2, 2777.18, 36225939968 / GIB),
        _row("fms-acceleration Mistral-7B LoRA r16 (q,k,v,o), 2xA100, b2 x 512, GC",
             fms_mistral_7b(True, 512), 2, 2946.306, 15144870400 / GIB),
    ]  # fmt: skip
    print("| run | published tokens/s | predicted | error | published GiB | peak | reserved |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        err = r["predicted_tokens_s"] / r["published_tokens_s"] - 1
        print(f"| {r['run']} | {r['published_tokens_s']:,.0f} | {r['predicted_tokens_s']:,.0f} | "
              f"{err:+.1%} | {r['published_gib']:.1f} | {r['peak_gib']:.1f} | "
              f"{r['reserved_gib']:.1f} |")  # fmt: skip
    for r in rows:
        print(f"{r['run']}: {r['trainable']}")
    for lora in (False, True):
        for seq in (256, 1024):
            mem = fms_mistral_7b(lora, seq).memory
            peak, reserved = mem.peak["bytes"] / GIB, mem.reserved["bytes"] / GIB
            what = "LoRA" if lora else "full"
            print(f"Mistral-7B {what} b2 x {seq}: peak {peak:.1f} GiB, reserved {reserved:.1f} GiB")


if __name__ == "__main__":
    main()
