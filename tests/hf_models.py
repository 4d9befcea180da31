"""Small Hugging Face models built from configs in code (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _ids(vocab: int = 96, batch: int = 2, seq: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def gpt2_model(layers: int = 3, **config: Any) -> nn.Module:
    """GPT-2 of ``layers`` blocks, 32 wide, 4 heads, 96 tokens (``config``: other fields)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=32, n_layer=layers, n_head=4, vocab_size=96, n_positions=32, **config)
    return GPT2LMHeadModel(cfg)


def gpt2() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    ids = _ids()
    model = gpt2_model(bos_token_id=0, eos_token_id=0)
    return model, {"input_ids": ids, "labels": ids}, GPT2Block


def llama_model(layers: int = 3, **config: Any) -> nn.Module:
    """Llama of ``layers`` decoder layers, 32 wide, 4 heads of which 2 for keys and values,
    96 tokens (``config``: other fields)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        **config,
    )
    return LlamaForCausalLM(cfg)


def llama() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return llama_model(), {"input_ids": _ids()}, LlamaDecoderLayer


def t5() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.models.t5.modeling_t5 import T5Block

    cfg = T5Config(
        d_model=32,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        vocab_size=96,
        d_kv=8,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    ids = _ids()
    return T5ForConditionalGeneration(cfg), {"input_ids": ids, "labels": ids}, T5Block


def bert() -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    from transformers import BertConfig, BertForMaskedLM
    from transformers.models.bert.modeling_bert import BertLayer

    cfg = BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=96,
    )
    return BertForMaskedLM(cfg), {"input_ids": _ids()}, BertLayer


HF_MODELS: dict[str, Callable[[], tuple[nn.Module, dict[str, Any], type[nn.Module]]]] = {
    "gpt2": gpt2,
    "llama": llama,
    "t5": t5,
    "bert": bert,
}
