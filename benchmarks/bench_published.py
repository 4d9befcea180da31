"""The time and memory models against published training runs: calibration and validation.

Each row is a run someone published (tokens per second per GPU, and the peak memory where the
source logs it), rebuilt here as the same model shape, batch, FSDP plan, activation
checkpointing, mesh and GPU, traced by ``fsdpviz.analyze`` on the meta device, timed by
``fsdpviz.cost.timeline`` and its memory modelled by ``fsdpviz.cost.memory_model`` (the most of
every micro-step of the steady optimizer step; the caching allocator's reserved estimate where
the source logs ``torch.cuda.max_memory_reserved``, as torchtitan does, the peak allocated where
it logs ``max_memory_allocated``, as KempnerForge does). Rows marked ``calibration`` are the
ones the GPU presets' efficiencies were fitted on, one per GPU (``--fit`` prints the fit);
``validation`` rows were never used to choose any constant. No memory constant is fitted.

Sources:

- torchtitan, ``benchmarks/llama3_h100_202412_torchtitan.md`` (Llama 3.1 8B, FSDP2,
  H100 96 GB HBM2e 500 W, 400 Gb/s RDMA per GPU, Tables 1 and 3: eager, with
  torch.compile, with compile and float8; Table 2: FSDP x CP over 8 GPUs, 32k to 256k tokens;
  Table 4: Llama 3.1 70B on 256 GPUs as FSDP 32 x TP 8 with compile and float8; the peak
  reserved memory of each);
- torchtitan, ``benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md`` (the same hosts,
  June 2025: Llama 3 70B FSDP 32 x TP 8 and 8B FSDP 8 x TP 8 with compile, bf16, float8
  tensorwise and rowwise, vanilla TP);
- torchtitan, ``benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md`` (Trainy, June 2025:
  Llama 3.1 8B, FSDP2 over 4 and 8 nodes of 8 H200, 400 Gb/s per GPU, compile and float8
  with FSDP's float8 all-gather; peak reserved memory);
- AWS, "Efficient Pre-training of Llama 3-like model architectures using torchtitan on
  Amazon SageMaker" (AWS Machine Learning blog, October 2024, with Meta; its code
  aws-samples/sagemaker-distributed-training-workshop ``14_torchtitan``, ``Step 3- Train
  with torchtitan.ipynb``: the TOML, torchtitan ``ac90c36``): Llama 3 8B, FSDP2 over 4
  p5.48xlarge (32 H100 SXM 80 GB, 3200 Gb/s EFA per node), eager, compile, float8 linears,
  float8 with FSDP's float8 all-gather; tokens/s only;
- torchao, ``torchao/float8/README.md`` "Training benchmarks" (``8c81863``, March 2025,
  with ``benchmarks/float8/training/float8_training_benchmark.sh`` and its log parser at that
  commit): Llama 3 8B through torchtitan, FSDP2 over 8 H100 96 GB, compile, bf16, float8
  tensorwise with FSDP's float8 all-gather, float8 rowwise; median tokens/s, peak reserved
  memory;
- torchao, the same script (``benchmarks/float8/training/llama3.sh``) on other GPUs:
  ``torchao/float8/README.md`` at ``853f87d`` (August 2025: 8 AMD Instinct MI300X, bf16,
  float8 tensorwise with FSDP's float8 all-gather, rowwise_with_gw_hp, rowwise) and
  ``torchao/prototype/mx_formats/README.md`` at ``d8bb51f`` (August 2025: 8 B200 limited to
  750 W, bf16, float8 tensorwise with FSDP's float8 all-gather, rowwise; its mxfp8 recipes
  are not modelled): median tokens/s, peak reserved memory;
- KempnerForge (Kempner Institute), ``benchmarks/mfu_scaling/mfu_scaling.md`` and
  ``benchmarks/config_validation/config_validation.md`` (April 2026: Llama-3 7B, 13B and 70B
  shapes on nodes of 4 H200 with NVLink and InfiniBand NDR (200 Gb/s per GPU, what its profile
  of a 13B run measures: ``KEMPNER_INTER_NODE_GBPS``), FSDP2 with bf16 parameters, bf16
  compute and fp32 reduction, full activation checkpointing, fused AdamW, gradient
  accumulation with ``set_requires_gradient_sync(False)``, FSDP alone and FSDP x TP 2 or 4;
  tokens/s of all GPUs, divided here per GPU; peak allocated memory; its nodes' 4 GPUs
  linked point to point, without NVSwitch). Its runs with pipeline parallelism are left out;
- IBM's fms-fsdp, ``README.md`` (Llama 2 7B as FSDP1 HYBRID_SHARD, shard groups of a node,
  compiled, bf16 parameters and reduction, on 128 A100 80 GB with 400 Gb/s per node and 96
  H100 with 800 Gb/s per node);
- torchtitan, ``docs/performance.md`` (Llama 3 8B/70B on 64 A100 80 GB, April 2024;
  Llama 2 13B/70B on 64 A100 80 GB, April 2024, sequence length 4096);
- llm-foundry, ``scripts/train/benchmarking/README.md`` (MPT 125M-70B, FSDP1 through
  Composer, flash attention, H100 80 GB, A100 80 GB and A100 40 GB with RoCE).

Prints the table (markdown: ``--markdown``), the median and 90th percentile of |error| of
tokens/s and of peak memory for the calibration and the validation rows, and for the
validation rows of each kind of run (GPU, tensor or context parallelism, float8 recipe,
compile, accumulation, across nodes).

    python benchmarks/bench_published.py [--only calibration|validation] [--markdown] [--fit]
                                         [--measure [--gpu PRESET] [--out result.json]]

``--measure`` (on a machine with a CUDA GPU) also trains a small Llama-shaped model with
FSDP2 on that GPU (one rank, bf16 parameters, fp32 reduction, fused AdamW), times its steps
with the GPU synchronised, and prints (and with ``--out`` writes) the measured tokens/s
beside fsdpviz's prediction for the same plan on the preset of that GPU. Without a GPU it
says so and measures nothing; nothing in the test suite needs a GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.configs import torchtitan_model as titan
from fsdpviz.cost import GPUS, Machine, machine, timeline
from fsdpviz.replan import replay


@dataclass(frozen=True)
class Row:
    source: str
    model: str  # "llama3:8B", "llama2:13B", "mpt:7b"
    gpu: str  # a preset of fsdpviz.cost.machine
    network: str
    gpus: int
    batch: int  # micro-batch per GPU (sequences)
    seq: int
    ac: str  # "none", "full", "op" (per-operator SAC), "layer" (every second block)
    published: float  # tokens/s per GPU
    split: str  # "calibration" or "validation"
    grad_accum: int = 1
    sharding: str = "FULL_SHARD"
    mixed: str = "DEFAULT"  # MPT: Composer's FSDP mixed precision mode
    memory_gib: float | None = None  # published peak memory (GiB), ``memory`` says which
    compile: bool = False  # torch.compile (torchtitan: each block; fms-fsdp: the model)
    float8: str = ""  # recipe ("tensorwise", "rowwise"); "+ag": FSDP2's float8 all-gather
    # with "+ag": torchtitan's float8.precompute_float8_dynamic_scale_for_fsdp (default False),
    # set where the source's command or script sets it
    precompute: bool = False
    tp: int = 1  # tensor-parallel degree (inside a node), FSDP over the rest
    inter_node_gbps: float | None = None  # network per GPU where no preset fits (GB/s)
    cp: int = 1  # context-parallel degree: FSDP shards over dp_shard x cp
    # the node's GPUs linked point to point, not through a switch (Machine.intra_node_mesh)
    intra_node_mesh: bool = False
    # what the source's memory figure is: the caching allocator's peak reserved bytes
    # (torch.cuda.max_memory_reserved, torchtitan's "memory") or its peak allocated ones
    memory: str = "reserved"
    gpus_per_node: int = 8
    # gradient accumulation as FSDP2's set_requires_gradient_sync(False) runs it (planned
    # with analyze(grad_accum=N)); otherwise each micro-batch reduces its gradients
    no_sync: bool = False
    # the optimizer as fsdpviz.cost names it, when the source's own default is not what ran
    optimizer: str = ""

    @property
    def root_reshards(self) -> bool:
        """Whether the root's ``reshard_after_forward=True`` (torchtitan's ``not
        pp_enabled``) is kept: torch's lazy init kept the root unsharded after forward
        whatever it was given until pytorch#154704 (June 2025), in the async TP runs' torch
        (``38410cf``, 2025-06-14) and not in Trainy's (2.8.0a0+5228986, NGC 25.05)."""
        return self.source == TT_ASYNC_TP

    @property
    def optimizer_name(self) -> str:
        """torchtitan's AdamW is foreach until ``6e49885`` (February 2025: ``optimizer.fused``
        off by default before), fused after; KempnerForge steps a fused AdamW; the others
        torch's default (foreach) implementation."""
        if self.optimizer:
            return self.optimizer
        before = self.source in (TT_H100, TT_A100, TT_A100_OLD, TT_SAGEMAKER)
        fused = self.source.startswith(("torchtitan", "KempnerForge")) and not before
        return "adamw_fused" if fused else "adamw"

    @property
    def compiles_loss(self) -> bool:
        """torchtitan compiles its loss function with the blocks from April 2025
        (``torchtitan/components/loss.py``, ``build_cross_entropy_loss``: ``torch.compile`` of
        the cross-entropy when ``training.compile``), so in its June 2025 runs (async TP at
        ``820504e``, Trainy's at ``e7c0cae``) and torchao's of August 2025 (``2c8b594``,
        ``6fc499f``); its December 2024 runs (``9dec370``, ``train.py``:
        the line commented out) and the A100 ones run the loss eager."""
        return self.compile and self.source in (TT_ASYNC_TP, TT_H200, *TORCHTITAN_2025_08)

    @property
    def cudnn_attention_recomputed(self) -> bool:
        """Whether per-operator checkpointing recomputes attention in backward: torchtitan runs
        SDPA with cuDNN first on B200 (``has_cuda_capability(10, 0)``, ``3b85aa31``, May 2025)
        while its save list names the flash and efficient kernels alone until ``b39377f``
        (December 2025, "add all SDPA backends to op_sac_save_list"): torchao's B200 runs
        (``6fc499f``) recompute it, their attention not saved."""
        return self.ac == "op" and self.source == TORCHAO_B200

    @property
    def fsdp_2024(self) -> bool:
        """Whether torchtitan's ``apply_fsdp`` is the one it kept until ``83e6941`` (July 2025:
        each block, the last kept unsharded after forward, then the root holding the
        embedding, final norm and output); the runs on torchtitan of August 2025 shard the
        embedding, each block, and norm with output on their own (``from_torchtitan``'s plan)."""
        return self.source not in TORCHTITAN_2025_08

    @property
    def name(self) -> str:
        acc = f" x{self.grad_accum}" if self.grad_accum > 1 else ""
        shard = {"SHARD_GRAD_OP": ", SGO", "HYBRID_SHARD": ", HSDP"}.get(self.sharding, "")
        dp = self.gpus // (self.tp * self.cp)
        tp = f", FSDP {dp} x TP {self.tp}" if self.tp > 1 else ""
        cp = f", FSDP {dp} x CP {self.cp}" if self.cp > 1 else ""
        f8 = ""
        if self.float8:
            recipe = self.float8.removesuffix("+ag")
            f8 = (
                ", fp8"
                + ("" if recipe == "tensorwise" else f" {recipe}")
                + "+ag" * (self.float8.endswith("+ag"))
            )
        extra = ", compile" * self.compile + f8
        return (
            f"{self.model} {self.gpus}x{self.gpu} b{self.batch}{acc} s{self.seq} "
            f"AC={self.ac}{shard}{tp}{cp}{extra}"
        )

    @property
    def kinds(self) -> list[str]:
        """The kinds of run the row belongs to, for the per-kind errors."""
        out = [f"GPU {self.gpu}"]
        if self.tp > 1:
            out.append("tensor parallel")
        if self.cp > 1:
            out.append("context parallel")
        if self.float8:
            out.append(f"float8 {self.float8.removesuffix('+ag')}")
        if self.compile:
            out.append("compile")
        if self.grad_accum > 1:
            out.append("accumulation" + (" (no sync)" if self.no_sync else ""))
        if self.sharding == "HYBRID_SHARD":
            out.append("HSDP")
        if self.gpus > self.gpus_per_node:
            out.append("across nodes")
        return out


TT_H100 = "torchtitan H100 (Dec 2024)"
TT_A100 = "torchtitan A100 Llama 3 (Apr 2024)"
TT_A100_OLD = "torchtitan A100 Llama 2 (Apr 2024)"
TT_ASYNC_TP = "torchtitan async TP (Jun 2025)"
TT_H200 = "torchtitan Trainy H200 (Jun 2025)"
TT_SAGEMAKER = "AWS SageMaker torchtitan (Oct 2024)"
TORCHAO = "torchao float8 H100 (Mar 2025)"
TORCHAO_MI300X = "torchao float8 MI300X (Aug 2025)"
TORCHAO_B200 = "torchao mx B200 (Aug 2025)"
FMS = "fms-fsdp IBM (2024)"
KEMPNER = "KempnerForge H200 (Apr 2026)"
KEMPNER_CFG = "KempnerForge H200 configs (Apr 2026)"
# KempnerForge's network per GPU (GB/s). Its sources say "InfiniBand (NDR 400Gbps)" and the
# Kempner handbook a non-blocking NDR fabric for the H200 partition; neither says how many
# cards a node of 4 GPUs has. Its own profile of a 13B FSDP 6 x TP 4 run
# (benchmarks/profiling/13b_24gpu_profiling.md; each data-parallel ring one rank per node,
# four rings per node) has FSDP2's collectives at 3.77 s a step: 400 Gb/s per GPU ("ib-ndr")
# would take 1.76 s, 200 Gb/s 3.51 s (kempner_profile_collectives), as two NDR cards per
# node would give.
KEMPNER_INTER_NODE_GBPS = 25.0
_KF: dict[str, Any] = {"memory": "allocated", "gpus_per_node": 4, "no_sync": True,
                       "intra_node_mesh": True,
                       "inter_node_gbps": KEMPNER_INTER_NODE_GBPS}  # fmt: skip
FOUNDRY = "llm-foundry MPT"
# the sources whose torchtitan is of August 2025 (2c8b594, 6fc499f)
TORCHTITAN_2025_08 = (TORCHAO_MI300X, TORCHAO_B200)
CAL, VAL = "calibration", "validation"

ROWS = [
    # torchtitan, Llama 3.1 8B, H100 HBM2e 500 W (Grand Teton), 400 Gb/s RDMA per GPU
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 8, 2, 8192, "op", 5762, CAL,
        memory_gib=82.4),
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 128, 2, 8192, "op", 5605, VAL,
        memory_gib=67.0),
    # ... with torch.compile, and with float8 linears (Tables 1 and 3; float8 with torchtitan's
    # recommended enable_fsdp_float8_all_gather of the time); Table 4: 70B on 32 nodes
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 8, 2, 8192, "op", 6667, VAL,
        compile=True, memory_gib=77.0),
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 8, 2, 8192, "op", 8532, VAL,
        compile=True, float8="tensorwise+ag", memory_gib=76.8),
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 128, 2, 8192, "op", 6514, VAL,
        compile=True, memory_gib=62.0),
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 128, 2, 8192, "op", 8380, VAL,
        compile=True, float8="tensorwise+ag", memory_gib=61.8),
    Row(TT_H100, "llama3:70B", "h100-hbm2e", "nvlink4+roce-400", 256, 16, 8192, "full", 829, VAL,
        compile=True, float8="tensorwise+ag", tp=8, memory_gib=71.9),
    # Table 2: FSDP x CP over 8 GPUs, compile, float8, full AC, local batch 1
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 8, 1, 32768, "full", 3890, VAL,
        compile=True, float8="tensorwise+ag", memory_gib=83.9),
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 8, 1, 65536, "full", 2540, VAL,
        compile=True, float8="tensorwise+ag", cp=2, memory_gib=84.2),
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 8, 1, 131072, "full", 1071, VAL,
        compile=True, float8="tensorwise+ag", cp=4, memory_gib=84.0),
    Row(TT_H100, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 8, 1, 262144, "full", 548, VAL,
        compile=True, float8="tensorwise+ag", cp=8, memory_gib=84.5),
    # torchtitan async TP benchmarks, vanilla TP column (float8 tensorwise by recipe name,
    # which torchtitan runs without FSDP's float8 all-gather)
    Row(TT_ASYNC_TP, "llama3:70B", "h100-hbm2e", "nvlink4+roce-400", 256, 16, 8192, "full",
        597.3, VAL, compile=True, tp=8),
    Row(TT_ASYNC_TP, "llama3:70B", "h100-hbm2e", "nvlink4+roce-400", 256, 16, 8192, "full",
        809.8, VAL, compile=True, float8="tensorwise", tp=8),
    Row(TT_ASYNC_TP, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 64, 12, 8192, "op", 4378,
        VAL, compile=True, tp=8),
    Row(TT_ASYNC_TP, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 64, 12, 8192, "op", 5078.1,
        VAL, compile=True, float8="tensorwise", tp=8),
    # ... float8 rowwise (all communication in bf16)
    Row(TT_ASYNC_TP, "llama3:70B", "h100-hbm2e", "nvlink4+roce-400", 256, 16, 8192, "full",
        599.6, VAL, compile=True, float8="rowwise", tp=8),
    Row(TT_ASYNC_TP, "llama3:8B", "h100-hbm2e", "nvlink4+roce-400", 64, 12, 8192, "op", 3708.5,
        VAL, compile=True, float8="rowwise", tp=8),
    # Trainy on H200: FSDP2 over 4 and 8 nodes, compile, float8 with FSDP's float8 all-gather
    # and precomputed scales (its command: --float8.precompute_float8_dynamic_scale_for_fsdp)
    Row(TT_H200, "llama3:8B", "h200", "nvlink4+roce-400", 32, 2, 8192, "op", 10938, VAL,
        compile=True, float8="tensorwise+ag", precompute=True, memory_gib=47.96),
    Row(TT_H200, "llama3:8B", "h200", "nvlink4+roce-400", 64, 2, 8192, "op", 10753, VAL,
        compile=True, float8="tensorwise+ag", precompute=True, memory_gib=46.97),
    # AWS on SageMaker (torchtitan ac90c36 of 2024-09-03, torch nightly 2.5.0.dev20240906): 4
    # p5.48xlarge (8 H100 SXM 80 GB with NVSwitch, 3200 Gb/s EFA per node: 400 Gb/s per GPU,
    # as roce-400), llama3_8b.toml (local batch 1, seq 8192, per-operator SAC, bf16 params,
    # fp32 reduction, FSDP over all 32, its apply_fsdp of 2024); that commit's AdamW is foreach
    # (optimizer.fused off until Feb 2025). Eager, compile (the blocks; the loss eager), float8
    # linears (dynamic tensorwise, "output" left out, bf16 all-gathers), then FSDP's float8
    # all-gather with precomputed scales; torchtitan's wps (per rank). No memory published.
    Row(TT_SAGEMAKER, "llama3:8B", "h100", "nvlink4+roce-400", 32, 1, 8192, "op", 6475, VAL),
    Row(TT_SAGEMAKER, "llama3:8B", "h100", "nvlink4+roce-400", 32, 1, 8192, "op", 7166, VAL,
        compile=True),
    Row(TT_SAGEMAKER, "llama3:8B", "h100", "nvlink4+roce-400", 32, 1, 8192, "op", 8624, VAL,
        compile=True, float8="tensorwise"),
    Row(TT_SAGEMAKER, "llama3:8B", "h100", "nvlink4+roce-400", 32, 1, 8192, "op", 8950, VAL,
        compile=True, float8="tensorwise+ag", precompute=True),
    # torchao's float8 training benchmarks (torchao/float8/README.md, "Training benchmarks",
    # 8c81863, March 2025: torch 2.7.0a0+gitb98af95, torchao 890e0ac, torchtitan 0.0.2, from
    # 069bae2 to 54ef422). benchmarks/float8/training/float8_training_benchmark.sh at that
    # commit: torchtitan's llama3_8b.toml (local batch 1, seq 8192, per-operator SAC, bf16
    # parameters, fp32 reduction, FSDP over the node's 8) with --training.compile (the blocks;
    # the loss eager), then float8 tensorwise with FSDP's float8 all-gather, precomputed
    # scales and force_recompute_fp8_weight_in_bwd (a view's recompute under the float8
    # all-gather), or recipe_name=rowwise (bf16 all-gathers); "output" left in bf16; fused
    # AdamW. parse_torchtitan_logs.py: median tps of steps 2 to 100 (per rank) and the most
    # "memory" (max reserved, GiB). H100 of 95.0 GiB (47.79 GiB at 50.30%) priced at 989
    # TFLOPS by torchtitan's MFU (the example log of the script's first version)
    Row(TORCHAO, "llama3:8B", "h100-hbm2e", "nvlink4", 8, 1, 8192, "op", 6150, VAL,
        compile=True, memory_gib=47.65, optimizer="adamw_fused"),
    Row(TORCHAO, "llama3:8B", "h100-hbm2e", "nvlink4", 8, 1, 8192, "op", 7689.5, VAL,
        compile=True, float8="tensorwise+ag", precompute=True, memory_gib=47.77,
        optimizer="adamw_fused"),
    Row(TORCHAO, "llama3:8B", "h100-hbm2e", "nvlink4", 8, 1, 8192, "op", 6768, VAL,
        compile=True, float8="rowwise", memory_gib=47.79, optimizer="adamw_fused"),
    # torchao's same script on 8 MI300X (torchao/float8/README.md at 853f87d, 2025-08-11:
    # torch 2.9.0.dev20250811+rocm6.4, torchao 4fc4068, torchtitan 2c8b594; "a devgpu with 8
    # AMD MI300X GPUs ... without any performance debugging") and on 8 B200 "limited to 750W"
    # (torchao/prototype/mx_formats/README.md at d8bb51f, 2025-08-15: torch
    # 2.9.0.dev20250815+cu128, torchao e4e681b, torchtitan 6fc499f). llama3.sh at those
    # commits: llama3_8b.toml (local batch 1, seq 8192, per-operator SAC, bf16 parameters, fp32
    # reduction, FSDP over the node's 8, "output" left in bf16, fused AdamW) with
    # --training.compile (the blocks and the loss at those commits), float8 tensorwise with
    # FSDP's float8 all-gather and precomputed scales, or --float8.recipe_name (bf16
    # all-gathers); torchtitan's apply_fsdp after 83e6941 (the embedding, each block, norm with
    # output, the root). Attention through SDPA with torchtitan's backends: on MI300X flash
    # attention (torch's ROCm default, AOTriton), on B200 cuDNN first (has_cuda_capability(10,
    # 0)). The bf16 runs calibrate mi300x and b200; the 750 W cap is in the b200 preset's fit.
    Row(TORCHAO_MI300X, "llama3:8B", "mi300x", "xgmi", 8, 1, 8192, "op", 5376.5, CAL,
        compile=True, memory_gib=39.09, optimizer="adamw_fused"),
    Row(TORCHAO_MI300X, "llama3:8B", "mi300x", "xgmi", 8, 1, 8192, "op", 6166.0, VAL,
        compile=True, float8="tensorwise+ag", precompute=True, memory_gib=39.07,
        optimizer="adamw_fused"),
    Row(TORCHAO_MI300X, "llama3:8B", "mi300x", "xgmi", 8, 1, 8192, "op", 6100.0, VAL,
        compile=True, float8="rowwise_with_gw_hp", memory_gib=39.32, optimizer="adamw_fused"),
    Row(TORCHAO_MI300X, "llama3:8B", "mi300x", "xgmi", 8, 1, 8192, "op", 5891.0, VAL,
        compile=True, float8="rowwise", memory_gib=39.32, optimizer="adamw_fused"),
    Row(TORCHAO_B200, "llama3:8B", "b200", "nvlink5", 8, 1, 8192, "op", 8307.5, CAL,
        compile=True, memory_gib=33.71, optimizer="adamw_fused"),
    Row(TORCHAO_B200, "llama3:8B", "b200", "nvlink5", 8, 1, 8192, "op", 10417.0, VAL,
        compile=True, float8="tensorwise+ag", precompute=True, memory_gib=33.38,
        optimizer="adamw_fused"),
    Row(TORCHAO_B200, "llama3:8B", "b200", "nvlink5", 8, 1, 8192, "op", 8640.5, VAL,
        compile=True, float8="rowwise", memory_gib=33.72, optimizer="adamw_fused"),
    # KempnerForge on nodes of 4 H200 (NVLink inside, each pair of GPUs by its own links, no
    # NVSwitch; InfiniBand NDR across): FSDP2 with bf16
    # parameters, bf16 compute and fp32 reduction, full AC, fused AdamW, seq 4096, gradient
    # accumulation with set_requires_gradient_sync(False); peak allocated memory; the H200
    # preset is calibrated on the 7B FSDP=4 run (one node)
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 4, 4, 4096, "full", 38983 / 4, CAL, 2,
        compile=True, memory_gib=61.1, **_KF),
    # ... its runs with tensor parallelism alone and on one GPU: FSDP2 over a dp_shard
    # dimension of one rank all the same (kempnerforge/distributed/setup.py keeps dp_shard in
    # the mesh when tp > 1, and makes a mesh of it alone when every degree is 1)
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 2, 4, 4096, "full", 13163 / 2, VAL, 2,
        compile=True, tp=2, memory_gib=57.8, **_KF),
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 4, 4, 4096, "full", 25135 / 4, VAL, 2,
        compile=True, tp=4, memory_gib=39.4, **_KF),
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 2, 2, 4096, "full", 18728 / 2, VAL, 4,
        compile=True, memory_gib=62.4, **_KF),
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 1, 2, 4096, "full", 10471, VAL, 4,
        compile=True, memory_gib=80.7, **_KF),
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 4, 4, 4096, "full", 25980 / 4, VAL, 2,
        compile=True, tp=2, memory_gib=45.9, **_KF),
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 8, 4, 4096, "full", 44299 / 8, VAL, 2,
        compile=True, tp=4, memory_gib=32.7, **_KF),
    Row(KEMPNER, "kempner:13B", "h200", "nvlink4+ib-ndr", 8, 4, 4096, "full", 35405 / 8, VAL, 4,
        memory_gib=88.5, **_KF),
    Row(KEMPNER, "kempner:13B", "h200", "nvlink4+ib-ndr", 8, 4, 4096, "full", 27345 / 8, VAL, 4,
        compile=True, tp=4, memory_gib=45.1, **_KF),
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 16, 4, 4096, "full", 82988 / 16, VAL, 2,
        compile=True, tp=4, memory_gib=29.4, **_KF),
    Row(KEMPNER, "kempner:13B", "h200", "nvlink4+ib-ndr", 16, 4, 4096, "full", 53814 / 16, VAL,
        4, compile=True, tp=4, memory_gib=39.2, **_KF),
    Row(KEMPNER, "kempner:7B", "h200", "nvlink4+ib-ndr", 32, 4, 4096, "full", 155917 / 32, VAL,
        2, compile=True, tp=4, memory_gib=27.6, **_KF),
    Row(KEMPNER, "kempner:13B", "h200", "nvlink4+ib-ndr", 32, 4, 4096, "full", 104309 / 32, VAL,
        4, compile=True, tp=4, memory_gib=36.3, **_KF),
    Row(KEMPNER, "kempner:70B", "h200", "nvlink4+ib-ndr", 32, 2, 4096, "full", 17657 / 32, VAL,
        4, compile=True, tp=4, memory_gib=93.2, **_KF),
    # ... its configuration check (April 2026): the shipped configs
    Row(KEMPNER_CFG, "kempner:7B", "h200", "nvlink4+ib-ndr", 4, 8, 4096, "full", 38858 / 4, VAL,
        4, compile=True, memory_gib=81.0, **_KF),
    Row(KEMPNER_CFG, "kempner:7B", "h200", "nvlink4+ib-ndr", 12, 4, 4096, "full", 67045 / 12,
        VAL, 8, compile=True, tp=4, memory_gib=30.4, **_KF),
    Row(KEMPNER_CFG, "kempner:7B", "h200", "nvlink4+ib-ndr", 32, 4, 4096, "full", 297384 / 32,
        VAL, 4, compile=True, memory_gib=51.3, **_KF),
    # torchtitan, 64 A100 80 GB
    Row(TT_A100, "llama3:8B", "a100", "nvlink3+ib-hdr", 64, 1, 8192, "op", 2973, CAL),
    Row(TT_A100, "llama3:8B", "a100", "nvlink3+ib-hdr", 64, 1, 8192, "layer", 2904, VAL),
    Row(TT_A100, "llama3:70B", "a100", "nvlink3+ib-hdr", 64, 1, 8192, "full", 331, VAL),
    Row(TT_A100_OLD, "llama2:13B", "a100", "nvlink3+ib-hdr", 64, 2, 4096, "none", 2162, VAL),
    Row(TT_A100_OLD, "llama2:13B", "a100", "nvlink3+ib-hdr", 64, 2, 4096, "op", 1904, VAL),
    Row(TT_A100_OLD, "llama2:70B", "a100", "nvlink3+ib-hdr", 64, 1, 4096, "op", 355, VAL),
    Row(TT_A100_OLD, "llama2:70B", "a100", "nvlink3+ib-hdr", 64, 2, 4096, "full", 353, VAL),
    # IBM fms-fsdp: Llama 2 7B, FSDP1 HYBRID_SHARD (a node shards, nodes replicate), compiled;
    # 400 Gb/s per node of A100 (6.25 GB/s per GPU), 800 Gb/s per node of H100
    Row(FMS, "llama2:7B", "a100", "nvlink3", 128, 2, 4096, "none", 4550, VAL,
        sharding="HYBRID_SHARD", compile=True, inter_node_gbps=6.25),
    Row(FMS, "llama2:7B", "h100", "nvlink4+roce-100", 96, 2, 4096, "none", 9600, VAL,
        sharding="HYBRID_SHARD", compile=True),
    # llm-foundry, H100 80 GB (amp_bf16, FSDP mixed precision DEFAULT)
    Row(FOUNDRY, "mpt:7b", "h100", "nvlink4+ib-ndr", 8, 6, 2048, "none", 10643, CAL),
    Row(FOUNDRY, "mpt:1b", "h100", "nvlink4+ib-ndr", 8, 14, 2048, "none", 45455, VAL),
    Row(FOUNDRY, "mpt:760m", "h100", "nvlink4+ib-ndr", 8, 24, 2048, "none", 63147, VAL, 2),
    Row(FOUNDRY, "mpt:3b", "h100", "nvlink4+ib-ndr", 8, 3, 8192, "none", 16578, VAL, 6),
    Row(FOUNDRY, "mpt:7b", "h100", "nvlink4+ib-ndr", 8, 8, 8192, "full", 6935, VAL, 2),
    Row(FOUNDRY, "mpt:13b", "h100", "nvlink4+ib-ndr", 8, 2, 2048, "none", 4792, VAL),
    Row(FOUNDRY, "mpt:13b", "h100", "nvlink4+ib-ndr", 64, 2, 2048, "none", 4800, VAL),
    Row(FOUNDRY, "mpt:13b", "h100", "nvlink4+ib-ndr", 128, 16, 2048, "full", 5080, VAL),
    Row(FOUNDRY, "mpt:30b", "h100", "nvlink4+ib-ndr", 32, 14, 2048, "full", 2308, VAL, 3),
    Row(FOUNDRY, "mpt:70b", "h100", "nvlink4+ib-ndr", 64, 8, 2048, "full", 1039, VAL, 4),
    Row(FOUNDRY, "mpt:1b", "h100", "nvlink4+ib-ndr", 128, 12, 2048, "none", 44123, VAL,
        sharding="SHARD_GRAD_OP"),
    # llm-foundry, A100 80 GB
    Row(FOUNDRY, "mpt:7b", "a100", "nvlink3+ib-hdr", 8, 6, 2048, "none", 4641, CAL, 2),
    Row(FOUNDRY, "mpt:350m", "a100", "nvlink3+ib-hdr", 8, 32, 2048, "none", 58782, VAL, 2),
    Row(FOUNDRY, "mpt:1b", "a100", "nvlink3+ib-hdr", 8, 14, 2048, "none", 20513, VAL, 4),
    Row(FOUNDRY, "mpt:3b", "a100", "nvlink3+ib-hdr", 8, 3, 8192, "none", 7695, VAL, 6),
    Row(FOUNDRY, "mpt:7b", "a100", "nvlink3+ib-hdr", 8, 2, 32768, "full", 1672, VAL, 2),
    Row(FOUNDRY, "mpt:13b", "a100", "nvlink3+ib-hdr", 8, 10, 4096, "full", 2060, VAL, 3),
    Row(FOUNDRY, "mpt:30b", "a100", "nvlink3+ib-hdr", 8, 3, 2048, "full", 916, VAL, 21),
    Row(FOUNDRY, "mpt:70b", "a100", "nvlink3+ib-hdr", 64, 8, 2048, "full", 410, VAL, 4),
    # llm-foundry, A100 40 GB, 1600 Gb/s RoCE per node (bf16, FSDP mixed precision PURE)
    Row(FOUNDRY, "mpt:7b", "a100-40gb", "nvlink3+roce-200", 8, 12, 2048, "full", 3679, CAL, 4,
        mixed="PURE"),
    Row(FOUNDRY, "mpt:125m", "a100-40gb", "nvlink3+roce-200", 8, 26, 2048, "none", 136334, VAL,
        3, mixed="PURE"),
    Row(FOUNDRY, "mpt:1b", "a100-40gb", "nvlink3+roce-200", 8, 8, 2048, "none", 19271, VAL, 8,
        mixed="PURE"),
    Row(FOUNDRY, "mpt:3b", "a100-40gb", "nvlink3+roce-200", 8, 1, 8192, "none", 7149, VAL, 8,
        mixed="PURE"),
    Row(FOUNDRY, "mpt:13b", "a100-40gb", "nvlink3+roce-200", 64, 16, 2048, "full", 1976, VAL,
        mixed="PURE"),
]  # fmt: skip


# ------------------------------------------------------------------ models
LLAMA2 = {  # torchtitan's llama2 flavors (torchtitan/models/llama, 2024)
    "7B": {"dim": 4096, "n_layers": 32, "n_heads": 32, "vocab_size": 32000},
    "13B": {"dim": 5120, "n_layers": 40, "n_heads": 40, "vocab_size": 32000},
    "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "vocab_size": 32000,
            "ffn_dim_multiplier": 1.3, "multiple_of": 4096},
}  # fmt: skip
MPT = {  # llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml: d_model, n_heads, n_layers
    "125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24),
    "1b": (2048, 16, 24), "3b": (2560, 20, 32), "7b": (4096, 32, 32),
    "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80),
}  # fmt: skip


class MptBlock(nn.Module):
    """An MPT block as llm-foundry builds it (``MPTBlock`` at v0.3.0, ``GPTBlock`` of
    ``mosaic_gpt`` at ``9fa3ceb``, as the tables' yamls configure them): biases in every
    linear layer and LayerNorm (``no_bias`` defaults to False and no yaml sets it), the
    low-precision LayerNorm, fused QKV, flash attention, a GELU MLP of 4x the width."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm_1 = nn.LayerNorm(d)
        self.Wqkv = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)
        self.norm_2 = nn.LayerNorm(d)
        self.up_proj = nn.Linear(d, 4 * d)
        self.down_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.Wqkv(self.norm_1(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out_proj(att.transpose(1, 2).reshape(b, s, d))
        out: torch.Tensor = x + self.down_proj(F.gelu(self.up_proj(self.norm_2(x))))
        return out


class Mpt(nn.Module):
    """MPT with the learned positional embedding of its default config (``learned_pos_emb``
    True, ``alibi`` False: ``wpe``, ``max_seq_len`` rows, added to the token embedding), as
    the tables ran it: their parameter counts grow with the sequence length by ``d_model``
    per position (the 13B's 12,853,954,560 at 2,048 and 12,864,440,320 at 4,096) and hold
    13 ``d_model`` vectors of biases and LayerNorm shifts a block."""

    def __init__(self, d: int, heads: int, layers: int, seq: int, vocab: int = 50368) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(MptBlock(d, heads) for _ in range(layers))
        self.norm_f = nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        h = self.wte(ids) + self.wpe(pos)
        for block in self.blocks:
            h = block(h)
        return F.linear(self.norm_f(h), self.wte.weight)  # tied unembedding


class _Loss:
    """Cross-entropy of the float32 logits against the labels (the first samples', for a
    micro-batch of fewer)."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.labels = labels

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        labels = self.labels[: logits.shape[0]]
        out: torch.Tensor = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return out


class _XentropyFunction(torch.autograd.Function):
    """flash-attn's ``SoftmaxCrossEntropyLossFn`` (``flash_attn/losses/cross_entropy.py``,
    the ``xentropy_cuda_lib`` kernels, v1.0.9 and v2.3.2, llm-foundry's pins) as memory and
    kernels see it: the forward reads the logits as they are (bf16) and returns each row's
    loss and log-sum-exp in float32, saving the logits, the log-sum-exp and the labels; the
    backward reads the logits and writes their gradient into a new tensor of their dtype
    (``inplace_backward=False``, ``CrossEntropyLoss``'s default). No float32 copy of the
    logits is made."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        lse = logits.amax(-1).float()  # one pass over the logits; a float32 per row
        ctx.save_for_backward(logits, lse, labels)
        return lse.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, lse, _ = ctx.saved_tensors
        scale = (grad * lse).to(logits.dtype).unsqueeze(-1)
        return logits * scale, None  # one pass: read the logits, write their gradient


class _ComposerMptLoss:
    """llm-foundry's MPT step as Composer (v0.16) runs it, from the logits on:

    - the loss, ``loss_fn: fused_crossentropy`` (``ComposerMPTCausalLM``'s default:
      flash-attn's ``CrossEntropyLoss(ignore_index=-100)``) of the logits as the tied
      unembedding gives them (bf16), averaged over the tokens;
    - the model's outputs held by the trainer (``state.outputs``) until the micro-batch's
      backward is done;
    - then its train metrics (``use_train_metrics``, default True: ``LanguageCrossEntropy``
      and ``LanguagePerplexity``), updated after each micro-batch's backward
      (``Trainer._eval_train_metrics``, which reuses those outputs): each a
      ``torch.nn.CrossEntropyLoss(reduction='sum')`` of the logits under the ``amp_bf16``
      autocast, where cross-entropy runs in float32 (torch's autocast op list), without
      gradients.

    The metrics run in the backward of the token embedding's output (:meth:`embedded`), the
    last activation gradient of the micro-batch, once the blocks' activations are freed."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.labels = labels
        self.outputs: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        self.outputs = logits
        labels = self.labels[: logits.shape[0]].flatten()
        losses = _XentropyFunction.apply(logits.flatten(0, 1), labels)  # type: ignore[no-untyped-call]
        out: torch.Tensor = losses.sum() / labels.numel()
        return out

    def metrics(self) -> None:
        logits, self.outputs = self.outputs, None
        if logits is None:
            return
        labels = self.labels[: logits.shape[0]].flatten()
        with torch.no_grad():
            for _ in ("LanguageCrossEntropy", "LanguagePerplexity"):
                F.cross_entropy(logits.flatten(0, 1).float(), labels, reduction="sum")

    def embedded(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        """The token embedding's forward hook: its output, whose gradient runs the metrics."""
        out: torch.Tensor = _AfterBackward.apply(output, self.metrics)  # type: ignore[no-untyped-call]
        return out


class _AfterBackward(torch.autograd.Function):
    """Identity whose backward calls ``then`` (Composer's work after ``loss.backward()``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, then: Any) -> torch.Tensor:
        ctx.then = then
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.then()
        return grad, None


@dataclass
class Job:
    """A row as a user hands it to :func:`fsdpviz.analyze` or :func:`fsdpviz.tune`: the model
    (on meta), one rank's micro-batch, the recipe's analyze keywords (its ranks as
    ``world_size`` or ``mesh``), the machine, the ranks, and the tokens each rank trains on
    per optimizer step (the micro-batch's, times the accumulation)."""

    model: nn.Module
    inputs: Any
    kwargs: Mapping[str, Any]
    machine: Machine
    world_size: int
    tokens_per_step: int


def row_job(row: Row) -> Job:
    """The job of ``row`` (see :class:`Job`)."""
    family, size = row.model.split(":")
    if row.source == FMS:
        model, inputs, kwargs = _fms(row, size)
    elif family == "kempner":
        model, inputs, kwargs = _kempner(row, size)
    elif family in ("llama3", "llama2"):
        model, inputs, kwargs = _torchtitan(row, family, size)
    else:
        model, inputs, kwargs = _mpt(row, size)
    tokens = row.batch * row.seq * row.grad_accum
    return Job(model, inputs, kwargs, row_machine(row), row.gpus, tokens)


def analyze_row(row: Row) -> fsdpviz.Report:
    """The recipe of ``row`` planned: ``analyze`` of its job, on its machine."""
    job = row_job(row)
    return fsdpviz.analyze(job.model, job.inputs, machine=job.machine, progress=False, **job.kwargs)


_Recipe = tuple[nn.Module, Any, Mapping[str, Any]]


def _flavor(family: str, size: str) -> str:
    flavor = size if family == "llama3" else f"llama2-{size}"
    if family == "llama2":
        titan.FLAVORS.setdefault(flavor, LLAMA2[size])
    return flavor


def _torchtitan(row: Row, family: str, size: str) -> _Recipe:
    flavor = _flavor(family, size)
    mode, option = {"none": ("none", "2"), "full": ("full", "2"), "op": ("selective", "op"),
                    "layer": ("selective", "2")}[row.ac]  # fmt: skip
    job: dict[str, Any] = {
        "model": {"name": "llama3", "flavor": flavor},
        "training": {"local_batch_size": row.batch, "seq_len": row.seq},
        "parallelism": {"tensor_parallel_degree": row.tp, "context_parallel_degree": row.cp},
        "activation_checkpoint": {"mode": mode, "selective_ac_option": option},
    }
    if row.compile:  # torchtitan compiles each block, and the loss in its 2025 runs
        components = ["model", "loss"] if row.compiles_loss else ["model"]
        job["compile"] = {"enable": True, "components": components}
    if row.float8:
        job["model"]["converters"] = ["float8"]
        job["float8"] = (
            {
                "enable_fsdp_float8_all_gather": True,
                "filter_fqns": ["output"],
                "precompute_float8_dynamic_scale_for_fsdp": row.precompute,
            }
            if row.float8.endswith("+ag")
            else {"recipe_name": row.float8, "filter_fqns": ["output"]}
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tt = fsdpviz.from_torchtitan(job, world_size=row.gpus)
    # torchtitan's runs before 83e6941 (July 2025): its apply_fsdp shards each block (the
    # last kept unsharded after forward), then the root holding the embedding, final norm
    # and output, where from_torchtitan plans the later layout (embedding, and norm with
    # output, sharded on their own): the A100 tables of April 2024 (395a526, 1ea476e), the
    # H100 ones of December 2024 (9dec370), AWS's (ac90c36), torchao's float8 runs of March
    # 2025 (069bae2 to 54ef422), the async TP ones (820504e), Trainy's (e7c0cae). torchao's
    # runs of August 2025 (2c8b594, 6fc499f) ran the later layout, as planned
    config = dict(tt.config)
    if row.cudnn_attention_recomputed:
        spec = config["activation_checkpointing"]
        unsaved = {torch.ops.aten._scaled_dot_product_cudnn_attention.default, CPU_FLASH}
        config["activation_checkpointing"] = replace(spec, save_ops=spec.save_ops - unsaved)
    if not row.fsdp_2024:
        return tt.model, tt.inputs, config
    blocks = [f"layers.{n}" for n, _ in tt.model.get_submodule("layers").named_children()]
    config["fully_shard"] = blocks
    config["reshard_after_forward"] = {
        **{b: i < len(blocks) - 1 for i, b in enumerate(blocks)},
        "": row.root_reshards,
    }
    return tt.model, tt.inputs, config


# scaled_dot_product_attention as the trace runs it on the meta device (its stand-in for the
# GPU's fused kernel in a selective checkpoint's save list)
CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


# KempnerForge's Llama-3 shapes (benchmarks/mfu_scaling/mfu_bench.sh): the FFN is 2/3 of 4
# dim, times 1.3, rounded up to 256 (70B: its ffn_hidden_dim 28672); vocabulary 128256
KEMPNER_MODELS = {
    "7B": {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
           "ffn_dim_multiplier": 1.3, "multiple_of": 256},
    "13B": {"dim": 5120, "n_layers": 40, "n_heads": 40, "n_kv_heads": 8,
            "ffn_dim_multiplier": 1.3, "multiple_of": 256},
    "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8,
            "ffn_dim_multiplier": 1.3, "multiple_of": 4096},
}  # fmt: skip


# KempnerForge's profile of a 13B FSDP 6 x TP 4 run over 6 nodes of 4 H200
# (benchmarks/profiling/13b_24gpu_profiling.md, eager, 5 steps of 4 micro-batches, gradients
# reduced on the last): its FSDP2 collectives' GPU time per step, in seconds
KEMPNER_PROFILE_STEP_S = {"reduce_scatter": 2.9534 / 5, "all_gather": 15.8752 / 5}


def kempner_profile_collectives(m: Machine) -> dict[str, float]:
    """The FSDP2 collectives of one step of KempnerForge's profiled 13B FSDP 6 x TP 4 run as
    the machine ``m`` times them (seconds, as :data:`KEMPNER_PROFILE_STEP_S`): 40 blocks and
    the root (token embedding, replicated over tp, and the output projection, a quarter of it
    per tp rank), each all-gathered in bf16 for forward and again for backward in each of 4
    micro-batches and reduce-scattered in fp32 once, over the 6 ranks of a data-parallel
    group, one per node, whose node holds one rank of each of the 4 groups."""
    from fsdpviz.cost.topology import span_of

    with torch.device("meta"):
        model = titan.Transformer(KEMPNER_MODELS["13B"], 4096)
    layers = len(model.layers)
    block = sum(p.numel() for p in model.layers["0"].parameters()) / 4  # one tp rank's
    root = (model.tok_embeddings.weight.numel() + model.output.weight.numel() / 4
            + model.norm.weight.numel())  # fmt: skip
    span = span_of([("dp_shard", 6), ("tp", 4)], 0, 4)
    m = replace(m, gpus_per_node=4, intra_node_mesh=True)

    def each(kind: str, itemsize: int) -> float:
        return layers * m.collective_seconds(
            kind, block * itemsize, 6, span
        ) + m.collective_seconds(kind, root * itemsize, 6, span)

    return {"reduce_scatter": each("reduce_scatter", 4), "all_gather": 8 * each("all_gather", 2)}


class _BF16CrossEntropy:
    """KempnerForge's loss: cross-entropy of the logits as the model gives them (bf16)."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.labels = labels

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        labels = self.labels[: logits.shape[0]]
        out: torch.Tensor = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


def kempner_tp_plan() -> dict[str, Any]:
    """KempnerForge's ``apply_tensor_parallel`` (``kempnerforge/distributed/tensor_parallel.py``
    at the benchmarks' commit) on this model's module names: sequence-parallel norms; each
    projection its own style, so q, k, v (and the MLP's gate and up) each all-gather the
    norm's sequence-sharded output (``ColwiseParallel(input_layouts=Shard(1))``, no
    ``PrepareModuleInput`` gathering it once for the block as torchtitan's plan does) and
    each reduce-scatters its gradient; the token embedding replicated, its output made a
    replicated DTensor (its forward hook's ``DTensor.from_local``, as ``PrepareModuleOutput``
    does); the output head column-wise with the logits gathered for the loss."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    colwise = ColwiseParallel(input_layouts=Shard(1))
    rowwise = RowwiseParallel(output_layouts=Shard(1))
    block = {
        "attention_norm": SequenceParallel(), "attention.wq": colwise,
        "attention.wk": colwise, "attention.wv": colwise, "attention.wo": rowwise,
        "ffn_norm": SequenceParallel(), "feed_forward.w1": colwise,
        "feed_forward.w3": colwise, "feed_forward.w2": rowwise,
    }  # fmt: skip
    return {
        "tok_embeddings": PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Replicate(), use_local_output=False
        ),
        **{f"layers.*.{k}": v for k, v in block.items()},
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }


def _kempner(row: Row, size: str) -> _Recipe:
    """KempnerForge: a Llama-3 of bf16 parameters (``model.to(bfloat16)``), each block and
    then the root sharded with FSDP2 (``reshard_after_forward=True``, bf16 compute, fp32
    reduction), every block checkpointed, torch.compile on the whole model, gradient
    accumulation with ``set_requires_gradient_sync(False)``; with tp, its own plan
    (:func:`kempner_tp_plan`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    with torch.device("meta"):
        model = titan.Transformer(KEMPNER_MODELS[size], row.seq).to(torch.bfloat16).train()
    ids = torch.zeros(row.batch, row.seq, dtype=torch.long)
    labels = torch.zeros(row.batch, row.seq, dtype=torch.long, device="meta")
    blocks = [f"layers.{i}" for i in range(KEMPNER_MODELS[size]["n_layers"])]
    ranks: dict[str, Any] = {"world_size": row.gpus}
    if row.tp > 1:
        ranks = {"mesh": ("dp_shard", row.gpus // row.tp, "tp", row.tp),
                 "parallelize_plan": kempner_tp_plan()}  # fmt: skip
    kwargs: dict[str, Any] = dict(
        loss=_BF16CrossEntropy(labels),
        fully_shard=blocks,
        reshard_after_forward=True,
        mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32, cast_forward_inputs=True),
        activation_checkpointing=[titan.TransformerBlock],
        compile=row.compile,
        grad_accum=row.grad_accum,
        **ranks,
    )
    return model, ids, kwargs


def _fms(row: Row, size: str) -> _Recipe:
    """IBM's fms-fsdp: FSDP1 over each block, hybrid sharding (the node shards), bf16
    parameters, reduction and buffers, use_orig_params for torch.compile on the model."""
    model = titan.build_llama3(_flavor("llama2", size), row.seq)
    ids = torch.zeros(row.batch, row.seq, dtype=torch.long)
    labels = torch.zeros(row.batch, row.seq, dtype=torch.long, device="meta")
    bf16 = MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16)
    kwargs: dict[str, Any] = dict(
        loss=_Loss(labels),
        auto_wrap_policy=ModuleWrapPolicy({titan.TransformerBlock}),
        sharding_strategy=ShardingStrategy[row.sharding],
        mixed_precision=bf16,
        use_orig_params=True,
        compile=row.compile,
        world_size=row.gpus,
    )
    return model, ids, kwargs


def _mpt(row: Row, size: str) -> _Recipe:
    d, heads, layers = MPT[size]
    with torch.device("meta"):
        model = Mpt(d, heads, layers, row.seq)
    ids = torch.zeros(row.batch, row.seq, dtype=torch.long)
    labels = torch.zeros(row.batch, row.seq, dtype=torch.long, device="meta")
    reduce = torch.float32 if row.mixed == "DEFAULT" else torch.bfloat16
    loss = _ComposerMptLoss(labels)
    # a function, not the bound method: analyze's copy of the model keeps the same loss
    model.wte.register_forward_hook(lambda module, args, out: loss.embedded(module, args, out))
    kwargs: dict[str, Any] = dict(
        loss=loss,
        auto_wrap_policy=ModuleWrapPolicy({MptBlock}),
        sharding_strategy=ShardingStrategy[row.sharding],
        backward_prefetch=BackwardPrefetch.BACKWARD_POST,  # Composer's default
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=reduce),
        activation_checkpointing=[MptBlock] if row.ac == "full" else None,
        world_size=row.gpus,
    )
    return model, ids, kwargs


# ------------------------------------------------------------------ running
@dataclass
class Result:
    row: Row
    report: fsdpviz.Report = field(repr=False)
    predicted: float = 0.0
    mfu: float = 0.0
    memory: float = 0.0  # GiB, as the row's memory figure is (reserved or allocated)

    @property
    def error(self) -> float:
        return self.predicted / self.row.published - 1.0

    @property
    def memory_error(self) -> float | None:
        if self.row.memory_gib is None:
            return None
        return self.memory / self.row.memory_gib - 1.0


def trace_all(rows: list[Row]) -> list[Result]:
    """One trace per model, batch, sequence and checkpointing; other world sizes replayed."""
    traced: dict[tuple[Any, ...], fsdpviz.Report] = {}
    out = []
    for row in rows:
        key = (row.model, row.batch, row.seq, row.ac, row.sharding, row.mixed, row.compile,
               row.float8, row.tp, row.cp, row.source == FMS, row.compiles_loss,
               row.grad_accum if row.no_sync else 1, row.root_reshards,
               row.fsdp_2024, row.cudnn_attention_recomputed)  # fmt: skip
        base = traced.get(key)
        if base is None or (base.config.world_size != row.gpus and row.tp * row.cp > 1):
            report = traced[key] = analyze_row(row)
        elif base.config.world_size != row.gpus:
            report = replay(base, world_size=row.gpus)
        else:
            report = base
        out.append(Result(row, report))
    return out


def row_machine(row: Row, base: Machine | None = None) -> Machine:
    """The machine of ``row``: its GPU preset (or ``base``) on its network."""
    m = machine(base or row.gpu, network=row.network)
    if row.inter_node_gbps is not None:
        m = replace(m, inter_node_gbps=row.inter_node_gbps)
    if row.gpus_per_node != m.gpus_per_node:
        m = replace(m, gpus_per_node=row.gpus_per_node)
    if row.intra_node_mesh:
        m = replace(m, intra_node_mesh=True)
    return m


def accum(row: Row) -> int | None:
    """timeline's grad_accum: None where the report holds the micro-steps (no sync)."""
    return None if row.no_sync else row.grad_accum


def predict(results: list[Result], machines: dict[str, Machine] | None = None) -> None:
    for r in results:
        m = row_machine(r.row, (machines or {}).get(r.row.gpu))
        t = timeline(r.report, m, grad_accum=accum(r.row), optimizer=r.row.optimizer_name)
        r.predicted, r.mfu = t.totals["tokens_per_s"], t.totals["mfu"]
        if r.row.memory_gib is not None:
            kind, opt = r.row.memory, r.row.optimizer_name
            r.memory = step_memory(r.report, kind, opt, accum(r.row)) / 2**30


def stats(errors: list[float]) -> tuple[float, float]:
    a = sorted(abs(e) for e in errors)
    if not a:
        return math.nan, math.nan
    p90 = a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)]
    return statistics.median(a), p90


def fit(results: list[Result]) -> dict[str, float]:
    """Per GPU preset, the one factor on its compute and attention efficiencies that makes
    the calibration rows' median error zero (a bisection on the log error)."""
    factors: dict[str, float] = {}
    for gpu in sorted({r.row.gpu for r in results if r.row.split == CAL}):
        cal = [r for r in results if r.row.split == CAL and r.row.gpu == gpu]
        lo, hi = 0.5, 1.5
        for _ in range(30):
            mid = (lo + hi) / 2
            base = machine(gpu)
            m = replace(
                base,
                compute_efficiency=base.compute_efficiency * mid,
                attention_efficiency=base.attention_efficiency * mid,
                attention_backward_efficiency=base.attention_backward_efficiency * mid,
            )
            for r in cal:
                mm = row_machine(r.row, m)
                tl = timeline(r.report, mm, grad_accum=accum(r.row), optimizer=r.row.optimizer_name)
                r.predicted = tl.totals["tokens_per_s"]
            med = statistics.median(math.log(r.predicted / r.row.published) for r in cal)
            lo, hi = (mid, hi) if med < 0 else (lo, mid)
        factors[gpu] = (lo + hi) / 2
    return factors


def step_memory(
    report: fsdpviz.Report,
    kind: str = "reserved",
    optimizer: str = "adamw",
    grad_accum: int | None = None,
) -> float:
    """The most bytes of the steady optimizer step (every micro-step of it, under gradient
    accumulation; ``grad_accum``: as timeline takes it, micro-steps each reducing): the
    caching allocator's reserved estimate, or (``"allocated"``) the memory model's peak."""
    from fsdpviz.cost import memory_model
    from fsdpviz.cost.memory import micro_step_memory

    if report.config.grad_accum > 1:  # the last optimizer step's micro-steps, walked once
        mems = micro_step_memory(report, optimizer=optimizer)
    else:
        mems = [memory_model(report, optimizer=optimizer, grad_accum=grad_accum)]
    if kind == "allocated":
        return float(max(m.peak["bytes"] for m in mems))
    return float(max(m.reserved["bytes"] for m in mems))


# --------------------------------------------------------------- measured on this GPU

_PRESET_BY_NAME = (("H200", "h200"), ("B200", "b200"), ("MI300X", "mi300x"),
                   ("H100 PCIe", "h100-pcie"), ("H100", "h100"), ("A100", "a100"),
                   ("L40S", "l40s"))  # fmt: skip


def gpu_preset(name: str, total_bytes: int) -> str:
    """The preset of :func:`fsdpviz.cost.machine` for a CUDA device called ``name``."""
    for key, preset in _PRESET_BY_NAME:
        if key in name:
            if preset == "a100" and total_bytes < 60 * 2**30:
                return "a100-40gb"
            return preset
    raise SystemExit(f"no preset for GPU {name!r}: pass --gpu with one of {sorted(GPUS)}")


def measure_step(preset: str | None, out: str | None, steps: int = 10) -> dict[str, Any] | None:
    """Train a small Llama-shaped model with FSDP2 on this GPU; measured vs predicted."""
    import json

    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    if not torch.cuda.is_available():
        print("--measure: no CUDA GPU here; nothing measured")
        return None
    props = torch.cuda.get_device_properties(0)
    preset = preset or gpu_preset(props.name, props.total_memory)
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                      attn_implementation="sdpa")  # fmt: skip
    batch, seq = 4, 2048
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
        times = []
        for i in range(3 + steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        measured_s = statistics.median(times)
    finally:
        dist.destroy_process_group()
    with torch.device("meta"):
        meta = LlamaForCausalLM(cfg)
    inputs = {"input_ids": torch.zeros(batch, seq, dtype=torch.long)}
    inputs["labels"] = inputs["input_ids"]
    report = fsdpviz.analyze(meta, inputs, fully_shard=[LlamaDecoderLayer], mp_policy=mp,
                             world_size=1, progress=False)  # fmt: skip
    tl = timeline(report, machine(preset), optimizer="adamw_fused")
    params = sum(p.numel() for p in meta.parameters())
    name = f"llama {cfg.num_hidden_layers} x {cfg.hidden_size}, {params / 1e9:.2f}B parameters"
    result = {
        "gpu": props.name, "preset": preset, "model": name,
        "batch": batch, "seq": seq, "steps": steps,
        "measured_step_s": measured_s, "measured_tokens_per_s": batch * seq / measured_s,
        "predicted_step_s": tl.totals["step_s"],
        "predicted_tokens_per_s": tl.totals["tokens_per_s"],
    }  # fmt: skip
    result["error"] = result["predicted_tokens_per_s"] / result["measured_tokens_per_s"] - 1
    measured, predicted = result["measured_tokens_per_s"], result["predicted_tokens_per_s"]
    print(
        f"measured on {props.name} (preset {preset}): {measured:,.0f} tokens/s "
        f"({measured_s * 1e3:.1f} ms/step); predicted {predicted:,.0f} "
        f"({tl.totals['step_s'] * 1e3:.1f} ms/step), error {result['error']:+.1%}"
    )
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=[CAL, VAL])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--fit", action="store_true", help="fit the presets on calibration rows")
    parser.add_argument("--measure", action="store_true", help="also measure a step on this GPU")
    parser.add_argument("--gpu", choices=sorted(GPUS), help="the preset of this GPU (--measure)")
    parser.add_argument("--out", help="write the measured result here as JSON (--measure)")
    args = parser.parse_args()
    if args.measure:
        measure_step(args.gpu, args.out)
    rows = [r for r in ROWS if args.only in (None, r.split)]
    t0 = time.perf_counter()
    results = trace_all(rows)
    traced_s = time.perf_counter() - t0
    if args.fit:
        for gpu, factor in fit(results).items():
            m = machine(gpu)
            print(
                f"{gpu}: x{factor:.3f} -> compute_efficiency {m.compute_efficiency * factor:.3f}, "
                f"attention_efficiency {m.attention_efficiency * factor:.3f}, "
                f"attention_backward_efficiency {m.attention_backward_efficiency * factor:.3f}"
            )
    t1 = time.perf_counter()
    predict(results)
    timed_s = time.perf_counter() - t1
    header = ["set", "source", "configuration", "published tok/s/GPU", "predicted", "error",
              "MFU (pred.)", "memory", "predicted", "error"]  # fmt: skip
    lines = []
    for split in (CAL, VAL):
        for r in results:
            if r.row.split != split:
                continue
            mem = ["", "", ""]
            if r.memory_error is not None:
                kind = "alloc." if r.row.memory == "allocated" else "res."
                mem = [
                    f"{r.row.memory_gib:.1f} {kind}",
                    f"{r.memory:.1f}",
                    f"{r.memory_error:+.1%}",
                ]
            time_ = [f"{r.row.published:,.0f}", f"{r.predicted:,.0f}", f"{r.error:+.1%}"]
            lines.append([split, r.row.source, r.row.name, *time_, f"{r.mfu:.1%}", *mem])
    if args.markdown:  # compact, for the docs
        print("| set | source | run | published | predicted | error | memory GiB | predicted "
              "| error |")  # fmt: skip
        print("|---|---|---|--:|--:|--:|--:|--:|--:|")
        for line in lines:
            short = [line[0][:3], line[1], line[2], *line[3:6], *line[7:]]
            print("| " + " | ".join(short) + " |")
    else:
        widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
        for line in [header, *lines]:
            print("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)))
    print()
    for text in summary(results):
        print(text)
    print(f"{len(results)} rows: traced/replayed in {traced_s:.1f} s, timed in {timed_s:.2f} s")


def _line(what: str, errors: list[float]) -> str:
    med, p90 = stats(errors)
    return f"{what}: {len(errors)} runs, median |error| {med:.1%}, p90 |error| {p90:.1%}"


def summary(results: list[Result]) -> list[str]:
    """The errors of tokens/s and of memory: calibration rows, held-out (validation) rows,
    and the held-out rows of each kind of run."""
    out = []
    for split in (CAL, VAL):
        errs = [r.error for r in results if r.row.split == split]
        if errs:
            out.append(_line(f"tokens/s, {split}", errs))
    held = [r for r in results if r.row.split == VAL]
    memory = [r for r in results if r.memory_error is not None]
    cal_mem = [r.memory_error for r in memory if r.row.split == CAL and r.memory_error is not None]
    val_mem = [r.memory_error for r in memory if r.row.split == VAL and r.memory_error is not None]
    if cal_mem:
        out.append(_line("peak memory, calibration rows (no memory constant is fitted)", cal_mem))
    if val_mem:
        out.append(_line("peak memory, validation", val_mem))
    kinds = sorted({k for r in held for k in r.row.kinds})
    out.append("validation by kind of run (tokens/s; peak memory where published):")
    for kind in kinds:
        rows = [r for r in held if kind in r.row.kinds]
        text = "  " + _line(kind, [r.error for r in rows])
        mem = [r.memory_error for r in rows if r.memory_error is not None]
        if mem:
            med, p90 = stats(mem)
            text += f"; memory {len(mem)} runs, median {med:.1%}, p90 {p90:.1%}"
        out.append(text)
    gpus = sorted({r.row.gpu for r in held})
    sources = sorted({r.row.source.split()[0] for r in held})
    out.append(f"validation spans GPUs {', '.join(gpus)}; sources {', '.join(sources)}")
    return out


if __name__ == "__main__":
    main()
