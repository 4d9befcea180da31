"""A Llama-style model with torchtitan's tensor-parallel plan (``parallelize_llama.apply_tp``).

``Llama``: token embeddings, transformer blocks (``attention_norm``, ``attention`` with
``wq``/``wk``/``wv``/``wo``, ``ffn_norm``, ``feed_forward`` with ``w1``/``w2``/``w3``), a
final norm and the output projection; attention views use ``-1`` heads, as torchtitan's do,
so the model runs with tp-local shapes. :func:`block_plan` and :func:`top_plan` are
torchtitan's plans (sequence parallel, output replicated: no loss parallel);
:func:`whole_plan` is the same as one dict for the whole model, as ``analyze`` takes it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.utils.checkpoint import checkpoint

from fsdpviz.configs.torchtitan_model import FeedForward


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(
        self,
        vocab: int = 64,
        dim: int = 16,
        n_heads: int = 4,
        hidden: int = 32,
        layers: int = 2,
        checkpointed: bool = False,
    ) -> None:
        super().__init__()
        self.checkpointed = checkpointed  # non-reentrant activation checkpointing per block
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(dim, n_heads, hidden) for i in range(layers)}
        )
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = checkpoint(layer, h, use_reentrant=False) if self.checkpointed else layer(h)
        return self.output(self.norm(h))


class ScaledLlama(Llama):
    """:class:`Llama` with Gemma's embedding scale (the embedding's output times a number),
    computed under ``torch.no_grad()`` where ``no_grad`` is set."""

    def __init__(self, no_grad: bool = False, **sizes: Any) -> None:
        super().__init__(**sizes)
        self.no_grad = no_grad

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        with torch.no_grad() if self.no_grad else contextlib.nullcontext():
            h = h * 2.0
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def top_plan() -> dict[str, Any]:
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }


def block_plan() -> dict[str, Any]:
    return {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }


def whole_plan() -> dict[str, Any]:
    """torchtitan's plans as one dict over the whole model (``layers.*.`` patterns)."""
    return {**top_plan(), **{f"layers.*.{k}": v for k, v in block_plan().items()}}


def dtensor_plan() -> dict[str, Any]:
    """:func:`whole_plan` with the residual stream kept a sequence-sharded DTensor
    (``use_local_output=False`` on the embedding, the norms and the row-parallel outputs):
    DTensor knows its global shape, so a sequence the tp ranks do not divide runs."""
    seq, row = SequenceParallel(use_local_output=False), RowwiseParallel
    plan = whole_plan()
    plan["tok_embeddings"] = row(
        input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
    )
    plan["norm"] = seq
    for name in ("attention_norm", "ffn_norm"):
        plan[f"layers.*.{name}"] = seq
    for name in ("attention.wo", "feed_forward.w2"):
        plan[f"layers.*.{name}"] = row(output_layouts=Shard(1), use_local_output=False)
    return plan


def float8_plan() -> dict[str, Any]:
    """:func:`whole_plan` with torchao's float8 styles in the blocks, as torchtitan's
    ``apply_tp`` gives them to tensorwise float8 linears (``enable_float8_tensorwise_tp``)."""
    from torchao.float8 import float8_tensor_parallel as f8

    Col, Row = f8.Float8ColwiseParallel, f8.Float8RowwiseParallel
    Prepare = f8.PrepareFloat8ModuleInput

    block = {
        "attention_norm": SequenceParallel(),
        "attention": Prepare(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        **{f"attention.{w}": Col() for w in ("wq", "wk", "wv")},
        "attention.wo": Row(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": Prepare(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        **{f"feed_forward.{w}": Col() for w in ("w1", "w3")},
        "feed_forward.w2": Row(output_layouts=Shard(1)),
    }
    return {**top_plan(), **{f"layers.*.{k}": v for k, v in block.items()}}


def plain_plan() -> dict[str, Any]:
    """Tensor parallelism without sequence parallelism: replicated norms and residual stream,
    row-parallel outputs all-reduced."""
    col, row = ColwiseParallel(), RowwiseParallel()
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        **{f"layers.*.attention.{w}": col for w in ("wq", "wk", "wv")},
        "layers.*.attention.wo": row,
        **{f"layers.*.feed_forward.{w}": col for w in ("w1", "w3")},
        "layers.*.feed_forward.w2": row,
        "output": ColwiseParallel(output_layouts=Replicate()),
    }


def example_plan() -> dict[str, Any]:
    """A tensor-parallel plan for :func:`fsdpviz.examples.example_model` (Hugging Face's
    names): attention's and the MLP's projections colwise in, rowwise out."""
    at = "layers.*."
    return {
        at + "self_attn.[qkv]_proj": ColwiseParallel(),
        at + "self_attn.o_proj": RowwiseParallel(),
        at + "mlp.[gu]*_proj": ColwiseParallel(),
        at + "mlp.down_proj": RowwiseParallel(),
    }


def rewrap_block_outputs(model: Llama, tp_mesh: Any) -> None:
    """KempnerForge's forward hooks: the attention's and MLP's plain outputs made
    sequence-sharded DTensors again for the residual add (``DTensor.from_local``)."""
    from torch.distributed.tensor import DTensor

    def rewrap(module: nn.Module, args: Any, out: Any) -> Any:
        if isinstance(out, DTensor):
            return out
        return DTensor.from_local(out, tp_mesh, [Shard(1)], run_check=False)

    for block in model.layers.values():
        block.attention.register_forward_hook(rewrap)
        block.feed_forward.register_forward_hook(rewrap)


def parallelize(model: Llama, tp_mesh: Any) -> Llama:
    """torchtitan's ``apply_tp``: the top-level plan, then each block's."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, tp_mesh, top_plan())
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan())
    return model


def tokens() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


LAYERS = [("layers.0",), ("layers.1",)]
