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
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    kw = {"auto_wrap_policy": ModuleWrapPolicy({layer})}
    # In training mode HF checks the (data-dependent) position ids for packed
    # sequences, which the meta device cannot answer: fsdpviz names the module
    # and points to trace="real", which then matches real FSDP exactly.
    with pytest.raises(
        fsdpviz.TraceError, match=r"(?s)module 'model' \(LlamaModel\).*trace='real'"
    ) as err:
        fsdpviz.analyze(model, inputs, world_size=fake_pg, **kw)
    assert err.value.module == "model"
    check_conformance(model, inputs, kw, fake_pg, trace="real")


def test_hf_lora_style_frozen_base(fake_pg: int) -> None:
    """Frozen base weights with trainable norms, use_orig_params=True (PEFT-like)."""
    torch.manual_seed(0)
    model, inputs, layer = HF_MODELS["llama"]()
    for n, p in model.named_parameters():
        p.requires_grad_("norm" in n)
    kw = {"auto_wrap_policy": ModuleWrapPolicy({layer}), "use_orig_params": True}
    report = check_conformance(model, inputs, kw, fake_pg)
    assert any(w.code == "frozen_mixed" for w in report.warnings)
