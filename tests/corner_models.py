"""Models of the corners real FSDP and fsdpviz must agree on (small, built in code).

Hugging Face models that the meta trace used to stop on (multi-head latent attention, whose
value head size differs from the query's; training calls with ``use_cache=False``), and
models that real FSDP refuses (a scalar parameter, a float32 parameter meeting bfloat16
activations).
"""

from __future__ import annotations

from typing import Any

import torch
from handwritten_models import Block, Stack
from torch import nn

_VOCAB = 96


def _ids(batch: int = 2, seq: int = 12) -> torch.Tensor:
    return torch.randint(0, _VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))


def deepseek_mla() -> tuple[nn.Module, dict[str, Any]]:
    """DeepSeek-V3's attention (MLA): query/key head size 24, value head size 8."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=_VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=8,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    ids = _ids()
    return DeepseekV3ForCausalLM(cfg), {"input_ids": ids, "labels": ids}


_SMALL = {
    "vocab_size": _VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 64,
}  # fmt: skip


def no_cache(name: str) -> tuple[nn.Module, dict[str, Any]]:
    """Qwen3, Gemma3 or Qwen3-MoE called as training loops call them: ``use_cache=False``."""
    import transformers

    torch.manual_seed(0)
    if name == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_SMALL))
    elif name == "gemma3":
        config = transformers.Gemma3TextConfig(**_SMALL, sliding_window=4)
        model = transformers.Gemma3ForCausalLM(config)
    else:
        config = transformers.Qwen3MoeConfig(
            **_SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16
        )
        model = transformers.Qwen3MoeForCausalLM(config)
    ids = _ids()
    return model, {"input_ids": ids, "labels": ids, "use_cache": False}


def bart() -> tuple[nn.Module, dict[str, Any]]:
    """BART called without masks: its decoder builds one of ones itself."""
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(
        vocab_size=_VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    ids = _ids()
    return BartForConditionalGeneration(cfg), {"input_ids": ids, "labels": ids}


class LearnedBiasAttention(nn.Module):
    """Attention whose mask is a learned bias per head and position pair (as Swin's
    relative-position bias): the mask needs a gradient."""

    def __init__(self, d: int = 16, heads: int = 2, tokens: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.bias = nn.Parameter(torch.randn(heads, tokens, tokens) * 0.02)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = self.bias.unsqueeze(0).expand(b, -1, -1, -1)
        y = nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(b, n, d))
        return x + out


class BiasedStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(LearnedBiasAttention() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return h


def biased_stack() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return BiasedStack(), torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))


class Scaled(nn.Module):
    """A block with a learned 0-dim scale (as some norm layers and adapters hold)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.fc(x)


class WithScalar(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Scaled(d) for _ in range(2))
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def stack() -> Stack:
    """The plain stack; ``head`` left out of mixed precision (ignored) meets bf16."""
    torch.manual_seed(0)
    return Stack()


class Activation(nn.Module):
    """An activation as a module: no parameters of its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class WithActivation(Stack):
    """The plain stack with a parameter-less module between the blocks and the head, which
    a policy wraps as a unit of its own (with its own sharding strategy)."""

    def __init__(self) -> None:
        super().__init__()
        self.act = Activation()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.act(h))


class ChunkedHead(nn.Module):
    """The forward ends at the final norm; the loss runs the head chunk by chunk after it
    (a chunked loss), the head and the norm one ``fully_shard([norm, head])`` group."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, nn.Module]:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.norm(h), self.head


def chunked_loss(out: tuple[torch.Tensor, nn.Module]) -> torch.Tensor:
    hidden, head = out
    total: torch.Tensor = sum((head(c).sum() for c in hidden.chunk(2)), torch.zeros(()))
    return total
