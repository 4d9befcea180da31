"""Anchor: Hugging Face models' memory at every event against real torch.

FSDP2 (``fully_shard`` on each decoder layer, then the root) on transformers' Llama and
Qwen2 built from configs in code, fp32 and bf16 parameters reducing in fp32, with and
without activation checkpointing of the layers (transformers' own,
``gradient_checkpointing_enable``, non-reentrant; or torch's ``checkpoint_wrapper``, as
``analyze``'s ``activation_checkpointing=`` models it); and a LoRA adapter on the query and
value projections of a frozen Llama (``peft.get_peft_model``; on an fp32 base, or on a
bf16 one with the adapters in fp32, peft's default) under FSDP2 and under FSDP1 (each
layer a unit, ``use_orig_params=True``). The model's own loss of ``labels``. And gradient
accumulation over 2 and 3 micro-steps: under FSDP2 those before the last with
``set_requires_gradient_sync(False)``, and with ``set_reshard_after_backward(False)`` too
(each group kept gathered into the next micro-step, as ``analyze``'s ``grad_accum`` and
``reshard_after_backward=False`` model them), resharding after forward or not; under FSDP1
in ``no_sync``. The events of the second optimizer step's micro-steps, and at each the
bytes in use and the most since the event before, equal ``analyze``'s to the byte; the
moments are those of ``every_event.py``.

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
from every_event import Measured, fsdp1_run, fsdp2_events, same, steady
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


def _fsdp2_measured(
    model: nn.Module, options: dict[str, Any], micro_steps: int = 1, keep: bool = False
) -> Measured:
    """``model`` sharded (each layer, then the root): the events of the second optimizer
    step's micro-steps, those before the last with ``set_requires_gradient_sync(False)``
    (and ``set_reshard_after_backward(False)`` where ``keep``)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh("cpu", (4,))
    for layer in _layers(model):
        fully_shard(layer, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    ids = _ids()  # held through the step
    with fsdp2_events(model, ids, hsdp=False) as log:
        for step in range(2):
            if step == 1:
                log.restart()
            for k in range(micro_steps):
                last = k == micro_steps - 1
                cast(FSDPModule, model).set_requires_gradient_sync(last)
                if keep:
                    cast(FSDPModule, model).set_reshard_after_backward(last)
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


def _fsdp1_measured(model: nn.Module, options: dict[str, Any], micro_steps: int = 1) -> Measured:
    """``model`` under FSDP1 (each layer a unit): one optimizer step (its buffers made, its
    orders recorded), then the events of the next one's micro-steps, those before the last
    under ``no_sync``."""
    import warnings

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = ModuleWrapPolicy({type(_layers(model)[0])})
    ids = _ids()  # held through the step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the frozen base mixed with the adapters in a unit
        fsdp = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), **options)
    return fsdp1_run(fsdp, ids, micro_steps, lambda m: m(input_ids=ids, labels=ids), _loss)


# (precision, checkpointed by: see _build, micro-steps, the rank it runs as). Under no_sync
# the post-backward gives each parameter a view of the unsharded gradient by way of an
# empty_like of its part of the rank's shard, which the plan counts as the rank with the
# largest part holds it (rank 3's 2,048 elements of a layer; rank 0's: 1,024): these run as
# rank 3
FSDP1_CASES: dict[str, tuple[Any, str, int, int]] = {
    "llama-lora-fp32": (None, "", 1, 0),
    "llama-lora-bf16-checkpointed": (BF16_FP32, "hf", 1, 0),
    "llama-lora-fp32-no-sync-2": (None, "", 2, 3),
    "llama-lora-bf16-no-sync-3": (BF16_FP32, "", 3, 3),
    "llama-lora-bf16-checkpointed-no-sync-2": (BF16_FP32, "hf", 2, 3),
}


@pytest.mark.parametrize("case", list(FSDP1_CASES))
def test_lora_under_fsdp1_holds_what_torch_holds_at_every_event(
    as_rank: Callable[..., None], case: str
) -> None:
    """Each layer a unit of the frozen base and its adapters (``use_orig_params=True``);
    with gradient accumulation, the micro-steps before the last under ``no_sync``."""
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    precision, checkpointed, micro_steps, rank = FSDP1_CASES[case]
    if rank:
        as_rank(rank, 4)
    options: dict[str, Any] = {"use_orig_params": True}
    if precision is not None:
        param, reduce = precision
        options["mixed_precision"] = MixedPrecision(param_dtype=param, reduce_dtype=reduce)
    real = _fsdp1_measured(_build("llama-lora", checkpointed), options, micro_steps)
    model = _build("llama-lora", checkpointed)
    policy = ModuleWrapPolicy({type(_layers(model)[0])})
    ids = _ids()
    report = fsdpviz.analyze(
        model, {"input_ids": ids, "labels": ids}, auto_wrap_policy=policy, world_size=4,
        loss=_loss, grad_accum=micro_steps, **options,
    )  # fmt: skip
    same(real, steady(report, micro_steps))


# (model, precision, checkpointed by: see _build, micro-steps, kept gathered after backward,
# reshard_after_forward)
ACCUM_CASES: dict[str, tuple[str, Any, str, int, bool, bool]] = {
    "llama-fp32-2": ("llama", None, "", 2, False, True),
    "llama-bf16-3": ("llama", BF16_FP32, "", 3, False, True),
    "llama-bf16-2-keep": ("llama", BF16_FP32, "", 2, True, True),
    "llama-fp32-3-keep": ("llama", None, "", 3, True, True),
    "llama-bf16-2-unresharded": ("llama", BF16_FP32, "", 2, False, False),
    "llama-fp32-3-keep-unresharded": ("llama", None, "", 3, True, False),
    "llama-bf16-checkpointed-2-keep": ("llama", BF16_FP32, "hf", 2, True, True),
    "llama-lora-fp32-2": ("llama-lora", None, "", 2, False, True),
    "llama-lora-bf16-checkpointed-3": ("llama-lora", BF16_FP32, "hf", 3, False, True),
    "llama-lora-fp32-2-keep": ("llama-lora", None, "", 2, True, True),
    "bf16-llama-lora-3-keep-unresharded": ("bf16-llama-lora", None, "", 3, True, False),
    "qwen2-bf16-2-keep": ("qwen2", BF16_FP32, "", 2, True, True),
    "qwen2-fp32-checkpointed-3": ("qwen2", None, "hf", 3, False, True),
    "llama-lora-fp32-checkpoint-wrapper-2-keep": ("llama-lora", None, "wrapper", 2, True, True),
    "bf16-llama-lora-bf16-checkpointed-2-keep": ("bf16-llama-lora", BF16_FP32, "hf", 2, True, True),
}


@pytest.mark.parametrize("case", list(ACCUM_CASES))
def test_hf_accumulation_holds_what_torch_holds_at_every_event(fake_pg: int, case: str) -> None:
    """Gradient accumulation: the micro-steps before the last without gradient sync (and
    kept gathered after backward, as ``analyze``'s ``reshard_after_backward=False`` models
    it), every event of the second optimizer step's micro-steps."""
    assert fake_pg == 4
    name, precision, checkpointed, micro_steps, keep, after_forward = ACCUM_CASES[case]
    options = _policy(precision)
    if not after_forward:
        options["reshard_after_forward"] = False
    real = _fsdp2_measured(_build(name, checkpointed), options, micro_steps, keep)
    model = _build(name, "" if checkpointed == "wrapper" else checkpointed)
    block = type(_layers(model)[0])
    if checkpointed == "wrapper":  # fsdpviz checkpoints the blocks of its copy
        options["activation_checkpointing"] = [block]
    accum: dict[str, Any] = {"grad_accum": micro_steps}
    if keep:
        accum["reshard_after_backward"] = False
    ids = _ids()
    report = fsdpviz.analyze(
        model, {"input_ids": ids, "labels": ids}, fully_shard=[block], mesh=(4,), loss=_loss,
        **options, **accum,
    )  # fmt: skip
    same(real, steady(report, micro_steps))
