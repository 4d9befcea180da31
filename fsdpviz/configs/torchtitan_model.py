"""torchtitan's Llama 3 (``torchtitan/models/llama3/model``), built on the meta device.

The flavors torchtitan trains (:data:`FLAVORS`) as its ``Transformer``: the same module
names and parameter shapes, rotary embeddings and grouped-query attention as torchtitan
computes them (:func:`build_llama3`). A pipeline stage holds some of its modules, the
others set to None, as torchtitan's ``pipeline_module_split`` leaves them.
"""

from __future__ import annotations

import math
from typing import NotRequired, TypedDict

import torch
import torch.nn.functional as F
from torch import nn


class LlamaArgs(TypedDict):
    """A flavor's ``TransformerModelArgs`` as torchtitan gives them (the rest at its
    defaults: ``n_kv_heads`` ``n_heads``, ``vocab_size`` 128256, ``multiple_of`` 256, no
    ``ffn_dim_multiplier``)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: NotRequired[int]
    vocab_size: NotRequired[int]
    ffn_dim_multiplier: NotRequired[float]
    multiple_of: NotRequired[int]


# torchtitan's llama3_args (torchtitan/models/llama3/__init__.py)
FLAVORS: dict[str, LlamaArgs] = {
    "debugmodel": {"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048},
    "8B": {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
           "ffn_dim_multiplier": 1.3, "multiple_of": 1024},
    "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8,
            "ffn_dim_multiplier": 1.3, "multiple_of": 4096},
    "405B": {"dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8,
             "ffn_dim_multiplier": 1.2, "multiple_of": 4096},
}  # fmt: skip


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = _rotate(self.wq(x).view(b, s, self.n_heads, self.head_dim), rope)
        k = _rotate(self.wk(x).view(b, s, self.n_kv_heads, self.head_dim), rope)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        rep = self.n_heads // self.n_kv_heads  # torchtitan's repeat_kv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, s, -1))
        return result


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return result


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: LlamaArgs) -> None:
        super().__init__()
        self.layer_id = layer_id
        dim = args["dim"]
        self.attention = Attention(dim, args["n_heads"], args.get("n_kv_heads") or args["n_heads"])
        self.feed_forward = FeedForward(dim, _ffn_hidden(args))
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = x + self.attention(self.attention_norm(x), rope)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


class Transformer(nn.Module):
    """torchtitan's Llama 3 ``Transformer``: module names and shapes as torchtitan has them."""

    def __init__(self, args: LlamaArgs, seq_len: int) -> None:
        super().__init__()
        dim, vocab = args["dim"], args.get("vocab_size", 128256)
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args) for i in range(args["n_layers"])}
        )
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)
        half = dim // args["n_heads"] // 2
        angles = torch.outer(
            torch.arange(seq_len).float(), 1.0 / 500000 ** (torch.arange(half) / half)
        )
        # torchtitan's precompute_freqs_cis: complex rotations, one per position and pair
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # a pipeline stage holds some of the modules, the others set to None (torchtitan's
        # pipeline_module_split): it takes the previous stage's hidden states as tokens
        h: torch.Tensor = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        rope = self.get_buffer("freqs_cis")[: tokens.shape[1]]
        for layer in self.layers.values():
            h = layer(h, rope)
        h = self.norm(h) if self.norm else h
        return self.output(h) if self.output else h


def _rotate(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (batch, seq, heads, head_dim) as torchtitan's apply_rotary_emb:
    interleaved pairs as complex numbers, multiplied by the rotations, in float32."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(pairs * freqs_cis[None, :, None, :]).flatten(3)
    return out.type_as(x)


def _ffn_hidden(args: LlamaArgs) -> int:
    """torchtitan's FeedForward hidden size: 2/3 of 4*dim, scaled, rounded up to multiple_of."""
    hidden = int(2 * (4 * args["dim"]) / 3)
    if args.get("ffn_dim_multiplier") is not None:
        hidden = int(args["ffn_dim_multiplier"] * hidden)
    multiple = args.get("multiple_of", 256)
    return int(multiple * math.ceil(hidden / multiple))


def build_llama3(flavor: str, seq_len: int) -> nn.Module:
    """torchtitan's Llama 3 ``flavor`` on the meta device, float32 as torchtitan builds it."""
    with torch.device("meta"):
        return Transformer(FLAVORS[flavor], seq_len).train()


__all__ = [
    "FLAVORS",
    "Attention",
    "FeedForward",
    "Transformer",
    "TransformerBlock",
    "build_llama3",
]
