"""Conformance on Hugging Face models (GPT-2, Llama, T5 encoder-decoder, BERT).

Each model is built from a small config in code; real FSDP1 runs on the CPU
with the fake process group and its recording must equal ``analyze``.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest
import torch
from fsdp_harness import check_conformance
from hf_models import HF_MODELS
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import (
    CustomPolicy,
    ModuleWrapPolicy,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

import fsdpviz

pytest.importorskip("transformers")


def _policy(kind: str, layer: type[nn.Module]) -> Any:
    if kind == "module_wrap":
        return ModuleWrapPolicy({layer})
    if kind == "transformer":
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer})
    if kind == "size_based":
        return functools.partial(size_based_auto_wrap_policy, min_num_params=3000)
    if kind == "lambda":
        return functools.partial(
            lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, (layer, nn.Embedding))
        )
    if kind == "custom":
        return CustomPolicy(
            lambda m: (
                {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP}
                if isinstance(m, layer)
                else False
            )
        )
    raise AssertionError(kind)


POLICIES = ["module_wrap", "transformer", "size_based", "lambda", "custom"]
PREFETCH = [BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST, None]
CASES = list(
    itertools.product(
        PREFETCH, [False, True], [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP]
    )
)
IDS = [f"{bp.name if bp else 'none'}-fwd{int(fp)}-{ss.name}" for bp, fp, ss in CASES]


@pytest.mark.parametrize(("bp", "fp", "ss"), CASES, ids=IDS)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", list(HF_MODELS))
def test_hf_models(fake_pg: int, name: str, policy: str, bp: Any, fp: bool, ss: Any) -> None:
    torch.manual_seed(0)
    model, inputs, layer = HF_MODELS[name]()
    kw = {
        "auto_wrap_policy": _policy(policy, layer),
        "backward_prefetch": bp,
        "forward_prefetch": fp,
        "sharding_strategy": ss,
    }
    report = check_conformance(model, inputs, kw, fake_pg)
    with_params = {u.module for u in report.units if u.params}
    never_run = with_params - set(report.forward_order)
    if never_run:  # e.g. T5's `shared`: only its tied `embed_tokens` copies are called
        warned = {n for w in report.warnings if w.code == "unit_unused_in_forward" for n in w.units}
        assert never_run == warned


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_hf_use_orig_params_mixed_precision(fake_pg: int, name: str) -> None:
    torch.manual_seed(0)
    model, inputs, layer = HF_MODELS[name]()
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kw = {
        "auto_wrap_policy": ModuleWrapPolicy({layer}),
        "use_orig_params": True,
        "mixed_precision": mp,
        "forward_prefetch": True,
    }
    report = check_conformance(model, inputs, kw, fake_pg)
    assert {u.compute_dtype for u in report.units} == {"bfloat16"}


def test_hf_gradient_checkpointing(fake_pg: int) -> None:
    torch.manual_seed(0)
    model, inputs, layer = HF_MODELS["llama"]()
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x's name
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    kw = {"auto_wrap_policy": ModuleWrapPolicy({layer})}
    # Checkpointing turns the cache off, and HF then checks the position ids for packed
    # sequences (a value the meta device does not hold): fsdpviz answers it as the model's
    # own position ids (one sequence per row) do, and both traces match real FSDP.
    report = check_conformance(model, inputs, kw, fake_pg)
    real = check_conformance(model, inputs, kw, fake_pg, trace="real")
    assert report.memory.peak == real.memory.peak


def test_hf_lora_style_frozen_base(fake_pg: int) -> None:
    """Frozen base weights with trainable norms, use_orig_params=True (PEFT-like)."""
    torch.manual_seed(0)
    model, inputs, layer = HF_MODELS["llama"]()
    for n, p in model.named_parameters():
        p.requires_grad_("norm" in n)
    kw = {"auto_wrap_policy": ModuleWrapPolicy({layer}), "use_orig_params": True}
    report = check_conformance(model, inputs, kw, fake_pg)
    assert any(w.code == "frozen_mixed" for w in report.warnings)


def _mixtral(dtype: torch.dtype) -> tuple[nn.Module, dict[str, Any], type[nn.Module]]:
    from transformers import MixtralConfig, MixtralForCausalLM
    from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

    cfg = MixtralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    return MixtralForCausalLM(cfg).to(dtype), {"input_ids": ids}, MixtralDecoderLayer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mixtral_experts_trace_on_meta_in_any_dtype(fake_pg: int, dtype: torch.dtype) -> None:
    """``torch._grouped_mm``'s meta kernel takes bfloat16 only; the CPU and GPU kernels, and
    so real FSDP, run float32 too: fsdpviz traces both and equals real FSDP1."""
    model, inputs, layer = _mixtral(dtype)
    report = check_conformance(model, inputs, {"auto_wrap_policy": ModuleWrapPolicy({layer})}, 4)
    assert {u.dtype for u in report.units} == {str(dtype).removeprefix("torch.")}
    # the shape-only kernel is gone once the trace ends
    a = torch.empty(6, 8, device="meta")
    with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
        torch._grouped_mm(a, torch.empty(2, 8, 4, device="meta"), offs=torch.empty(2).int())


def test_fx_says_why_a_wrapped_forward_cannot_be_traced() -> None:
    model, inputs, _ = _mixtral(torch.bfloat16)
    with pytest.raises(fsdpviz.TraceError) as err:
        fsdpviz.analyze(model, inputs, trace="fx")
    text = str(err.value)
    assert "MixtralForCausalLM.forward is a (*args, **kwargs) wrapper" in text
    assert "data-dependent" not in text and "Use trace='meta'" in text


def test_wrong_inputs_point_at_the_inputs() -> None:
    model, _, _ = HF_MODELS["llama"]()
    ids = torch.randint(0, 96, (2, 8))
    cases = [
        ({"inputs_ids": ids}, "'inputs_ids' is not a parameter of LlamaForCausalLM.forward "
         "(did you mean 'input_ids'?)"),
        ({"input_ids": ids[..., None].expand(2, 8, 3)}, "input_ids: int64[2, 8, 3]"),
        ({"input_ids": ids, "labels": ids[:1, :5]}, "labels: int64[1, 5]"),
        ({"input_ids": ids.float()}, "input_ids: float32[2, 8]"),
    ]  # fmt: skip
    for inputs, said in cases:
        with pytest.raises(fsdpviz.TraceError, match="The model rejected its inputs") as err:
            fsdpviz.analyze(model, inputs)
        assert said in str(err.value)
        assert "trace='real'" not in str(err.value)
        assert "LlamaForCausalLM.forward takes (input_ids, attention_mask," in str(err.value)


def test_token_ids_past_the_vocabulary_are_warned_about() -> None:
    model, _, _ = HF_MODELS["llama"]()
    ids = torch.randint(0, 96, (2, 8))
    ids[0, 0], ids[1, 3] = 0, 96
    report = fsdpviz.analyze(model, {"input_ids": ids})
    (warning,) = [w for w in report.warnings if w.code == "ids_out_of_range"]
    assert warning.message.startswith(
        "input_ids holds ids from 0 to 96, but 'model.embed_tokens' (Embedding) has 96 rows "
        "(ids 0 to 95)"
    )
    fine = fsdpviz.analyze(model, {"input_ids": ids.clamp(max=95)})
    assert not [w for w in fine.warnings if w.code == "ids_out_of_range"]
    fsdp2 = fsdpviz.analyze(model, {"input_ids": ids}, fully_shard=[])
    assert [w.code for w in fsdp2.warnings] == ["ids_out_of_range"]
