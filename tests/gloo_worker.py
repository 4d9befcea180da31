"""Worker for the 2-process gloo conformance test (spawned by torch.multiprocessing)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import handwritten_models as hm
import torch
import torch.distributed as dist
from fsdp_harness import record_real_fsdp1
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def gloo_cases() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    """name -> (model factory, inputs factory, FSDP kwargs); deterministic on every rank."""
    from hf_models import HF_MODELS

    def x() -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    def llama() -> Any:
        return HF_MODELS["llama"]()[0]

    def llama_inputs() -> Any:
        return HF_MODELS["llama"]()[1]

    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    block = ModuleWrapPolicy({hm.Block})
    return {
        "stack-pre": (hm.Stack, x, {"auto_wrap_policy": block}),
        "twice-post-fwd": (
            hm.CalledTwice,
            x,
            {
                "auto_wrap_policy": block,
                "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
                "forward_prefetch": True,
            },
        ),
        "nested-grad-op": (
            hm.Nested,
            x,
            {
                "auto_wrap_policy": ModuleWrapPolicy({hm.Block, hm.Outer}),
                "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP,
                "use_orig_params": True,
            },
        ),
        "llama-fwd-prefetch": (
            llama,
            llama_inputs,
            {"auto_wrap_policy": ModuleWrapPolicy({LlamaDecoderLayer}), "forward_prefetch": True},
        ),
    }


def run(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        for name, (build, inputs, kwargs) in gloo_cases().items():
            torch.manual_seed(0)
            report = record_real_fsdp1(build(), inputs(), kwargs)
            report.to_json(Path(out_dir) / f"{name}-rank{rank}.json")
    finally:
        dist.destroy_process_group()
