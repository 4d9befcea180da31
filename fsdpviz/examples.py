"""A bundled example: a small Llama-style decoder-only transformer in plain torch.

It needs nothing beyond torch and runs on the meta device, so it is what
``fsdpviz demo`` analyses::

    from fsdpviz.examples import example_analysis

    report = example_analysis(world_size=16)
    print(report.summary())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Unpack

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from fsdpviz.api.keywords import AnalyzeKwargs
from fsdpviz.api.predict import analyze
from fsdpviz.schema.report import Report


@dataclass(frozen=True)
class ExampleConfig:
    """Sizes of the example model (defaults: ~10M parameters)."""

    vocab_size: int = 1024
    hidden_size: int = 256
    intermediate_size: int = 688
    num_layers: int = 4
    num_heads: int = 4
    tie_word_embeddings: bool = False


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (as in Llama)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal multi-head self-attention with q/k/v/o projections."""

    def __init__(self, config: ExampleConfig) -> None:
        super().__init__()
        if config.hidden_size % config.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        self.num_heads = config.num_heads
        h = config.hidden_size
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (
            p(x).view(b, s, self.num_heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        proj: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(b, s, h))
        return proj


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: ExampleConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then MLP, each with a residual."""

    def __init__(self, config: ExampleConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class ExampleModel(nn.Module):
    """Embedding, ``num_layers`` decoder layers, final norm and LM head."""

    def __init__(self, config: ExampleConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(batch, seq, vocab_size)``."""
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits


def example_model(config: ExampleConfig | None = None, device: str = "meta") -> ExampleModel:
    """Build the example model on ``device`` (meta by default: nothing is allocated)."""
    with torch.device(device):
        return ExampleModel(config or ExampleConfig())


def example_inputs(
    config: ExampleConfig | None = None, batch: int = 2, seq: int = 64, device: str = "meta"
) -> dict[str, torch.Tensor]:
    """Keyword inputs for the example model: ``{"input_ids": (batch, seq) int64}``."""
    vocab = (config or ExampleConfig()).vocab_size
    return {"input_ids": torch.randint(0, vocab, (batch, seq), device=device)}


class ExampleKwargs(AnalyzeKwargs, total=False):
    """What :func:`example_analysis` takes: :func:`fsdpviz.analyze`'s keywords and the
    model's size."""

    config: ExampleConfig | None


def example_analysis(**overrides: Unpack[ExampleKwargs]) -> Report:
    """Run :func:`fsdpviz.analyze` on the example model, one ``DecoderLayer`` per unit.

    ``overrides`` replace the defaults (``auto_wrap_policy``, ``backward_prefetch``,
    ``world_size=8``) or add any other :func:`fsdpviz.analyze` keyword; ``config``
    selects the model size.
    """
    config: ExampleConfig | None = overrides.pop("config", None)
    kwargs: dict[str, Any] = {
        "auto_wrap_policy": ModuleWrapPolicy({DecoderLayer}),
        "backward_prefetch": BackwardPrefetch.BACKWARD_PRE,
        "world_size": 8,
        **overrides,
    }
    return analyze(example_model(config), example_inputs(config), **kwargs)
