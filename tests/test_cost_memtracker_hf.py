"""fsdpviz's memory of Hugging Face model families under ``fully_shard``, against torch's
``FSDPMemTracker`` on real FSDP2 (fake process group, CPU): grouped-query attention with
query and key norms, sliding-window and soft-capped attention, mixture-of-experts routing
(Mixtral's, Qwen3's, GPT-OSS's with its attention sinks), DeepSeek-V3's latent attention
with dense and routed layers. The peak, each category and every module's peaks, to the
byte, with the logits summed and with the model's own loss of ``labels``, in fp32 and with
bf16 parameters reducing in fp32; three of them under FSDP1 against ``MemTracker``; and
LoRA on Llama under transformers' checkpointing over two micro-steps, the tracker
following no module (its module hooks keep tensors alive there).

Left out, because the CPU run does not do what a GPU does (fsdpviz predicts the GPU):
``LayerNorm`` families in bf16 (the CPU kernel keeps the mean and rstd in bf16, CUDA in
fp32: ``test_gloo_bf16_layer_norm_statistics``), and models whose cache holds a sliding
window as a tensor (made on the CPU and moved to the device in the first layer, a copy a
CPU run does not make).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from memtracker_harness import MAPPING, tracked
from test_cost_memtracker import _as_the_tracker_sees
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

import fsdpviz
from fsdpviz.cost import memory_model

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
transformers = pytest.importorskip("transformers")

_COMMON = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=128,
)
_FAMILIES: dict[str, dict[str, Any]] = {
    "Qwen3": {"head_dim": 32},
    "Gemma2": {"head_dim": 32},
    "Mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "Qwen3Moe": {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "head_dim": 32,
    },
    "GptOss": {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 32},
    "DeepseekV3": {
        "q_lora_rank": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16,
        "v_head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 64, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    },
}  # fmt: skip


def _builder(family: str) -> Callable[[], nn.Module]:
    config = getattr(transformers, f"{family}Config")(**_COMMON, **_FAMILIES[family])
    model_class = getattr(transformers, f"{family}ForCausalLM")

    def build() -> nn.Module:
        model: nn.Module = model_class(config)
        return model

    return build


def _inputs(labels: bool) -> Callable[[], dict[str, torch.Tensor]]:
    def inputs() -> dict[str, torch.Tensor]:
        ids = torch.arange(64).remainder(512).view(2, 32)
        return {"input_ids": ids, **({"labels": ids.clone()} if labels else {})}

    return inputs


def _loss(labels: bool) -> Callable[[Any], torch.Tensor]:
    def loss(out: Any) -> torch.Tensor:
        value: torch.Tensor = out.loss if labels else out.logits.sum()
        return value

    return loss


def _layers(model: nn.Module) -> list[nn.Module]:
    return list(model.get_submodule("model.layers"))


@pytest.mark.parametrize("labels", [False, True], ids=["logits", "labels"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(_FAMILIES))
def test_family_against_fsdp_mem_tracker(
    fake_pg: int, family: str, bf16: bool, labels: bool
) -> None:
    build = _builder(family)
    options: dict[str, Any] = {}
    if bf16:
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    real = tracked(build, _inputs(labels), _layers, fake_pg, _loss(labels), **options)
    with torch.device("meta"):
        model = build()
    block = type(_layers(model)[0])
    report = fsdpviz.analyze(model, _inputs(labels)(), fully_shard=[block], loss=_loss(labels),
                             world_size=fake_pg, **options)  # fmt: skip
    mem = memory_model(report, optimizer=None, iteration=0)
    assert real.peak["Total"] == mem.peak["bytes"]
    for name, (theirs, ours) in MAPPING.items():
        a = sum(real.peak.get(k, 0) for k in theirs)
        b = sum(mem.peak["breakdown"][k] for k in ours)
        assert a == b, f"{name}: FSDPMemTracker {a} B, fsdpviz {b} B"
    backward = _as_the_tracker_sees(report, mem, model)
    assert set(real.modules) == set(mem.unit_peaks)
    for module, phases in real.modules.items():
        assert phases["forward"] == mem.unit_peaks[module]["forward"], module
        assert phases["backward"] == backward[module], module


@pytest.mark.parametrize(
    ("mixed", "orig"), [(False, False), (True, True)], ids=["fp32-flat", "bf16-orig-params"]
)
@pytest.mark.parametrize("family", ["Mixtral", "GptOss", "DeepseekV3"])
def test_family_under_fsdp1_against_mem_tracker(
    fake_pg: int, family: str, mixed: bool, orig: bool
) -> None:
    """The same families under ``FullyShardedDataParallel`` (each decoder layer a unit, real
    CPU tensors, the experts routed by the data): the steady step's peak against torch's
    ``MemTracker`` to the byte, FlatParameters' own buffers registered with it."""
    import warnings

    from test_cost_fsdp1_memtracker import _Tracker
    from torch.distributed._tools.mem_tracker import _MemRefType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    build, loss, ids = _builder(family), _loss(False), _inputs(False)()["input_ids"]
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    torch.manual_seed(0)
    model = build()
    policy = ModuleWrapPolicy({type(_layers(model)[0])})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fsdp = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"),
                    mixed_precision=mp, use_orig_params=orig)  # fmt: skip
        loss(fsdp(input_ids=ids)).backward()  # buffers made, orders recorded
        fsdp.zero_grad(set_to_none=True)
        tracker = _Tracker()
        tracker.track_external(fsdp, ids)
        for module in fsdp.modules():
            if isinstance(module, FSDP) and module._handle is not None:
                for name in ("_full_param_padded", "_mp_shard"):
                    buffer = getattr(module._handle.flat_param, name, None)
                    if buffer is not None:
                        tracker._update_and_maybe_create_winfos(buffer, _MemRefType.OTH)
        with tracker:
            out = fsdp(input_ids=ids)
            loss(out).backward()
            del out
    real = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
    with torch.device("meta"):
        meta = build()
    report = fsdpviz.analyze(meta, {"input_ids": ids}, auto_wrap_policy=policy, world_size=fake_pg,
                             loss=loss, mixed_precision=mp, use_orig_params=orig)  # fmt: skip
    assert real == memory_model(report, optimizer=None, iteration=1).peak["bytes"]


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_lora_under_transformers_checkpointing_accumulating(fake_pg: int, bf16: bool) -> None:
    """LoRA (peft) on Llama under transformers' non-reentrant checkpointing, two micro-steps,
    the first without gradient sync: the peak over both, to the byte, and every category at
    it (the tensors of forward and backward as one: the tracker files the recomputation's
    under forward). Transformers' checkpointing makes the frozen embedding's output require
    grad (``enable_input_require_grads``), a leaf: the hooks of torch's ``ModTracker`` keep
    it and its gradient alive past the micro-step, which the program lets go of, so the
    tracker here follows no module."""
    from test_cost_hf_every_event import _build, _ids

    n, ids = 2, _ids()
    options: dict[str, Any] = {}
    if bf16:
        options["mp_policy"] = MixedPrecisionPolicy(torch.bfloat16, torch.float32)

    build = lambda: _build("llama-lora", "hf")  # noqa: E731
    real = tracked(build, lambda: {"input_ids": ids, "labels": ids}, _peft_layers, fake_pg,
                   _loss(True), real=True, accumulate=n, follow_modules=False,
                   **options)  # fmt: skip
    model = _build("llama-lora", "hf")
    report = fsdpviz.analyze(model, {"input_ids": ids, "labels": ids}, world_size=fake_pg,
                             fully_shard=[type(_peft_layers(model)[0])], loss=_loss(True),
                             grad_accum=n, **options)  # fmt: skip
    steps = [memory_model(report, optimizer=None, iteration=i) for i in range(n)]
    mem = max(steps, key=lambda m: m.peak["bytes"])
    assert real.peak["Total"] == mem.peak["bytes"]
    mapping = dict(MAPPING)
    forward, backward = mapping.pop("forward tensors"), mapping.pop("backward tensors")
    mapping["tensors"] = (forward[0] + backward[0], forward[1] + backward[1])
    for name, (theirs, ours) in mapping.items():
        a = sum(real.peak.get(k, 0) for k in theirs)
        b = sum(mem.peak["breakdown"][k] for k in ours)
        assert a == b, f"{name}: FSDPMemTracker {a} B, fsdpviz {b} B"


def _peft_layers(model: nn.Module) -> list[nn.Module]:
    return list(model.get_base_model().get_submodule("model.layers"))
