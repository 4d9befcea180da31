"""Anchor: Hugging Face models' memory at every event against real torch.

FSDP2 (``fully_shard`` on each decoder layer, then the root) on transformers' Llama and
Qwen2 built from configs in code, fp32 and bf16 parameters reducing in fp32, with and
without activation checkpointing of the layers (transformers' own,
``gradient_checkpointing_enable``, non-reentrant; or torch's ``checkpoint_wrapper``, as
``analyze``'s ``activation_checkpointing=`` models it); and a LoRA adapter on the query and
value projections of a frozen Llama (``peft.get_peft_model``; on an fp32 base, or on a
bf16 one with the adapters in fp32, peft's default) under FSDP2 and under FSDP1 (each
layer a unit, ``use_orig_params=True``). The model's own loss of ``labels``. The events of
the second optimizer step, and at each the bytes in use and the most since the event
before, equal ``analyze``'s to the byte; the moments are those of ``every_event.py``.

With the embedding frozen, the first layer's inputs need no gradient: its post-backward
runs in the root's final callback, after the root's (frozen, its own never fires), and each
lets go of the reduce-scatter input the group before kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from every_event import Measured, fsdp1_events, fsdp2_events, same, steady
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import fsdpviz

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
transformers = pytest.importorskip("transformers")

BF16_FP32 = (torch.bfloat16, torch.float32)
_COMMON = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=96,
    max_position_embeddings=64,
)


def _ids() -> torch.Tensor:
    return torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))


def _base(family: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        config = getattr(transformers, f"{family}Config")(**_COMMON)
        model: nn.Module = getattr(transformers, f"{family}ForCausalLM")(config)
        return model

    return build


def _lora() -> nn.Module:
    from peft_models import adapt, llama_base

    return adapt(llama_base(), ["q_proj", "v_proj"])


def _bf16_lora() -> nn.Module:
    """LoRA on a bf16 Llama as peft adds it by default: the adapters in fp32
    (``autocast_adapter_dtype``), so each layer's group holds two dtypes."""
    from peft_models import adapt, llama_base

    return adapt(llama_base().to(torch.bfloat16), ["q_proj", "v_proj"])


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "llama": _base("Llama"),
    "qwen2": _base("Qwen2"),
    "llama-lora": _lora,
    "bf16-llama-lora": _bf16_lora,
}


def _build(name: str, checkpointed: str) -> nn.Module:
    """The model ``name``; ``checkpointed``: ``"hf"``, its layers checkpointed by
    transformers (non-reentrant), ``"wrapper"``, by torch's ``checkpoint_wrapper``
    (``apply_activation_checkpointing``, as trainers apply it before sharding), ``""``: not."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    torch.manual_seed(0)
    model: Any = BUILDERS[name]()
    if checkpointed == "hf" and hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(  # transformers 5's name
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    elif checkpointed == "hf":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif checkpointed == "wrapper":
        block = type(_layers(model)[0])
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, block))
    model.train()
    return cast(nn.Module, model)


def _layers(model: nn.Module) -> list[nn.Module]:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(inner.get_submodule("model.layers"))


def _loss(out: Any) -> torch.Tensor:
    loss: torch.Tensor = out.loss
    return loss


def _fsdp2_measured(model: nn.Module, options: dict[str, Any]) -> Measured:
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (4,))
    for layer in _layers(model):
        fully_shard(layer, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    ids = _ids()  # held through the step
    with fsdp2_events(model, ids, hsdp=False) as log:
        for step in range(2):
            if step == 1:
                log.restart()
            out = model(input_ids=ids, labels=ids)
            _loss(out).backward()
            del out
            for p in model.parameters():
                p.grad = None
    return cast(Measured, log.measured())


def _policy(precision: tuple[torch.dtype, torch.dtype] | None) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision is None:
        return {}
    param, reduce = precision
    return {"mp_policy": MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)}


# (model, precision, checkpointed by: see _build)
FSDP2_CASES: dict[str, tuple[str, Any, str]] = {
    "llama-fp32": ("llama", None, ""),
    "llama-bf16": ("llama", BF16_FP32, ""),
    "llama-fp32-checkpointed": ("llama", None, "hf"),
    "llama-bf16-checkpointed": ("llama", BF16_FP32, "hf"),
    "llama-bf16-checkpoint-wrapper": ("llama", BF16_FP32, "wrapper"),
    "qwen2-bf16": ("qwen2", BF16_FP32, ""),
    "qwen2-fp32-checkpointed": ("qwen2", None, "hf"),
    "llama-lora-fp32": ("llama-lora", None, ""),
    "llama-lora-bf16-checkpointed": ("llama-lora", BF16_FP32, "hf"),
    "llama-lora-fp32-checkpoint-wrapper": ("llama-lora", None, "wrapper"),
    "bf16-llama-lora": ("bf16-llama-lora", None, ""),
    "bf16-llama-lora-bf16-checkpointed": ("bf16-llama-lora", BF16_FP32, "hf"),
}


@pytest.mark.parametrize("case", list(FSDP2_CASES))
def test_hf_fully_shard_holds_what_torch_holds_at_every_event(fake_pg: int, case: str) -> None:
    assert fake_pg == 4
    name, precision, checkpointed = FSDP2_CASES[case]
    options = _policy(precision)
    real = _fsdp2_measured(_build(name, checkpointed), options)
    model = _build(name, "" if checkpointed == "wrapper" else checkpointed)
    block = type(_layers(model)[0])
    if checkpointed == "wrapper":  # fsdpviz checkpoints the blocks of its copy
        options["activation_checkpointing"] = [block]
    ids = _ids()
    report = fsdpviz.analyze(
        model, {"input_ids": ids, "labels": ids}, fully_shard=[block], mesh=(4,), loss=_loss,
        **options,
    )  # fmt: skip
    same(real, steady(report, 1))


def _fsdp1_measured(model: nn.Module, options: dict[str, Any]) -> Measured:
    import warnings

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = ModuleWrapPolicy({type(_layers(model)[0])})
    ids = _ids()  # held through the step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the frozen base mixed with the adapters in a unit
        fsdp = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), **options)
        _loss(fsdp(input_ids=ids, labels=ids)).backward()  # buffers made, orders recorded
    fsdp.zero_grad(set_to_none=True)
    with fsdp1_events(fsdp, ids) as log:
        out = fsdp(input_ids=ids, labels=ids)
        _loss(out).backward()
        del out
    return cast(Measured, log.measured())


# (precision, checkpointed by: see _build)
FSDP1_CASES: dict[str, tuple[Any, str]] = {
    "llama-lora-fp32": (None, ""),
    "llama-lora-bf16-checkpointed": (BF16_FP32, "hf"),
}


@pytest.mark.parametrize("case", list(FSDP1_CASES))
def test_lora_under_fsdp1_holds_what_torch_holds_at_every_event(fake_pg: int, case: str) -> None:
    """Each layer a unit of the frozen base and its adapters (``use_orig_params=True``)."""
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    assert fake_pg == 4
    precision, checkpointed = FSDP1_CASES[case]
    options: dict[str, Any] = {"use_orig_params": True}
    if precision is not None:
        param, reduce = precision
        options["mixed_precision"] = MixedPrecision(param_dtype=param, reduce_dtype=reduce)
    real = _fsdp1_measured(_build("llama-lora", checkpointed), options)
    model = _build("llama-lora", checkpointed)
    policy = ModuleWrapPolicy({type(_layers(model)[0])})
    ids = _ids()
    report = fsdpviz.analyze(
        model, {"input_ids": ids, "labels": ids}, auto_wrap_policy=policy, world_size=4,
        loss=_loss, **options,
    )  # fmt: skip
    same(real, steady(report, 1))
