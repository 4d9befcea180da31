"""The FSDP1 steady state with forward prefetch: simulated engine order vs a traced second pass.

Without a profile (``profile=False``) fsdpviz schedules the captured autograd graph
instead of tracing a second iteration (fsdpviz/schedule/autograd_order.py). These tests
pin it to the traced result on every hand-written model and prefetch setting, and check
the fallbacks. With a profile the second iteration is traced: the compute between the
reordered hooks is not the first iteration's (tests/test_cost_fsdp1_memtracker.py).
"""

from __future__ import annotations

import itertools
from typing import Any

import handwritten_models as hm
import pytest
import torch
from hf_models import HF_MODELS
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
import fsdpviz.schedule.fsdp1 as fsdp1_analyze

POLICY = ModuleWrapPolicy({hm.Block, hm.Outer})
MODELS = hm.VIEW_ONLY
SETTINGS = list(
    itertools.product(
        [BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST, None],
        [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP],
        [False, True],
    )
)


def _both(
    monkeypatch: pytest.MonkeyPatch, model: nn.Module, inputs: Any, **kw: Any
) -> tuple[Any, Any, bool]:
    used: list[bool] = []
    original = fsdp1_analyze._simulated_steady

    def spy(*args: Any) -> Any:
        result = original(*args)
        used.append(result is not None)
        return result

    monkeypatch.setattr(fsdp1_analyze, "_simulated_steady", spy)
    simulated = fsdpviz.analyze(model, inputs, forward_prefetch=True, profile=False, **kw)
    monkeypatch.setattr(fsdp1_analyze, "STEADY_BY_SIMULATION", False)
    traced = fsdpviz.analyze(model, inputs, forward_prefetch=True, profile=False, **kw)
    monkeypatch.setattr(fsdp1_analyze, "STEADY_BY_SIMULATION", True)
    return simulated, traced, bool(used and used[0])


@pytest.mark.parametrize(("bp", "ss", "orig"), SETTINGS)
@pytest.mark.parametrize("model_cls", MODELS, ids=lambda m: m.__name__)
def test_simulated_steady_state_equals_a_traced_one(
    monkeypatch: pytest.MonkeyPatch, model_cls: Any, bp: Any, ss: Any, orig: bool
) -> None:
    kw = {
        "auto_wrap_policy": POLICY,
        "backward_prefetch": bp,
        "sharding_strategy": ss,
        "use_orig_params": orig,
    }
    simulated, traced, used = _both(monkeypatch, model_cls(), torch.randn(4, 8), **kw)
    assert used, "the simulation should be trusted for this model"
    assert simulated.to_dict()["iterations"] == traced.to_dict()["iterations"]


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_simulated_steady_state_hf(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    model, inputs, layer = HF_MODELS[name]()
    simulated, traced, used = _both(
        monkeypatch, model, inputs, auto_wrap_policy=ModuleWrapPolicy({layer})
    )
    assert used
    assert simulated.to_dict()["iterations"] == traced.to_dict()["iterations"]


@pytest.mark.parametrize(
    "model", [hm.Checkpointed(), hm.frozen_stack()], ids=["recompute", "frozen"]
)
def test_falls_back_to_tracing_when_the_graph_cannot_be_scheduled(
    monkeypatch: pytest.MonkeyPatch, model: nn.Module
) -> None:
    policy = ModuleWrapPolicy({hm.Block, nn.Linear})
    simulated, traced, used = _both(monkeypatch, model, torch.randn(4, 8), auto_wrap_policy=policy)
    assert not used
    assert simulated.to_dict()["iterations"] == traced.to_dict()["iterations"]
