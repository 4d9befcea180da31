"""Small fine-tuning models as ``peft`` builds them (no downloads): LoRA and DoRA adapters on
frozen Llama and GPT-NeoX shapes, as ``get_peft_model`` returns them.

Each factory returns ``(model, inputs, layer class)``; every rank builds the same model from
the same seed. DoRA adds a magnitude vector per adapted linear (a parameter of a new shape)
and, in forward, the norm of the frozen weight plus the adapter's update.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB = 96
RANK = 4  # LoRA's r


def tokens(batch: int = 2, seq: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))


def llama_base() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


def neox_base() -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=64,
    )  # fmt: skip
    return GPTNeoXForCausalLM(cfg)


def adapt(base: nn.Module, targets: list[str], *, dora: bool = False) -> nn.Module:
    """``peft.get_peft_model`` with LoRA (or DoRA) of rank :data:`RANK` on ``targets``."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=RANK, lora_alpha=8, target_modules=targets, use_dora=dora)
    return get_peft_model(base, config)


def llama_lora() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    """LoRA on the attention's query and value projections (peft's default for Llama)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.manual_seed(0)
    ids = tokens()
    model = adapt(llama_base(), ["q_proj", "v_proj"])
    return model, {"input_ids": ids, "labels": ids}, LlamaDecoderLayer


def neox_dora() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    """DoRA on GPT-NeoX's fused query-key-value projection and its MLP's input."""
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer

    torch.manual_seed(0)
    ids = tokens()
    model = adapt(neox_base(), ["query_key_value", "dense_h_to_4h"], dora=True)
    return model, {"input_ids": ids, "labels": ids}, GPTNeoXLayer


def llama_lora_bf16() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    """LoRA on a bf16 Llama as peft adds it by default: the adapters in fp32
    (``autocast_adapter_dtype``), so each layer's group holds two dtypes."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.manual_seed(0)
    ids = tokens()
    model = adapt(llama_base().to(torch.bfloat16), ["q_proj", "v_proj"])
    return model, {"input_ids": ids, "labels": ids}, LlamaDecoderLayer


def llama_dora_embedding() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    """DoRA on the embedding and the query projection. peft's embedding takes the norm of its
    weight plus the update through a new ``nn.Parameter`` of the transposed weight
    (``transpose(weight, fan_in_fan_out=True)``), so autograd records it, then detaches the
    norm: the vocabulary-by-hidden sum the norm saved dies with that graph, in forward."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.manual_seed(0)
    ids = tokens()
    model = adapt(llama_base(), ["embed_tokens", "q_proj"], dora=True)
    return model, {"input_ids": ids, "labels": ids}, LlamaDecoderLayer


def llama_lora_head() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    """LoRA on the LM head only: no gradient reaches the (frozen) layers, so their backward
    never runs and FSDP2's root post-backward callback reshards them."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.manual_seed(0)
    ids = tokens()
    model = adapt(llama_base(), ["lm_head"])
    return model, {"input_ids": ids, "labels": ids}, LlamaDecoderLayer


MODELS = {
    "llama-lora": llama_lora,
    "neox-dora": neox_dora,
    "llama-lora-bf16": llama_lora_bf16,
    "llama-dora-embedding": llama_dora_embedding,
    "llama-lora-head": llama_lora_head,
}
