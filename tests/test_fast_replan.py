"""FSDP1 plans from one stored trace (fsdpviz/fsdp1/fast.py) equal fsdpviz.analyze.

``analyze`` is pinned to real FSDP1 by the conformance tests; here every plan
the stored trace answers must equal ``analyze(..., profile=False)`` field for
field (units, forward order, both iterations, warnings, modules, backward
module order), over the hand-written corner cases and the Hugging Face models,
for several wrap policies and every prefetch / sharding / use_orig_params
setting. What the stored trace does not model must be refused, not guessed.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import handwritten_models as hm
import pytest
import torch
from hf_models import HF_MODELS
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

import fsdpviz
from fsdpviz.examples import ExampleConfig, example_inputs, example_model
from fsdpviz.fsdp1.fast import StoredTrace
from fsdpviz.replan import PlanOptions, Replanner, fully_shard_supported

SETTINGS = list(
    itertools.product(
        [BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST, None],
        [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP],
        [False, True],  # forward_prefetch
        [False, True],  # use_orig_params
    )
)
HANDWRITTEN = [*hm.VIEW_ONLY, hm.WithNorm]
POLICIES: dict[str, Any] = {
    "blocks": ModuleWrapPolicy({hm.Block, hm.Outer}),
    "linears": ModuleWrapPolicy({nn.Linear}),
    "blocks+linears": ModuleWrapPolicy({hm.Block, nn.Linear}),
    "size": functools.partial(size_based_auto_wrap_policy, min_num_params=200),
    "root only": None,
}


def _kwargs(policy: Any, bp: Any, ss: Any, fp: bool, orig: bool) -> dict[str, Any]:
    kw = {
        "backward_prefetch": bp,
        "sharding_strategy": ss,
        "forward_prefetch": fp,
        "use_orig_params": orig,
        "world_size": 4,
    }
    if policy is not None:
        kw["auto_wrap_policy"] = policy
    return kw


def _assert_equal(fast: fsdpviz.Report | None, model: nn.Module, inputs: Any, **kw: Any) -> None:
    traced = fsdpviz.analyze(model, inputs, profile=False, progress=False, **kw)
    assert fast is not None, "the stored trace should answer this plan"
    got, want = fast.to_dict(), traced.to_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == want[key], key


@functools.cache
def _stored(model_cls: type[nn.Module]) -> tuple[nn.Module, torch.Tensor, StoredTrace]:
    torch.manual_seed(0)
    model, inputs = model_cls(), torch.randn(4, 8)
    return model, inputs, StoredTrace(model, inputs)


@pytest.mark.parametrize(("bp", "ss", "fp", "orig"), SETTINGS)
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("model_cls", HANDWRITTEN, ids=lambda m: m.__name__)
def test_stored_trace_plans_equal_analyze(
    model_cls: type[nn.Module], policy: str, bp: Any, ss: Any, fp: bool, orig: bool
) -> None:
    model, inputs, stored = _stored(model_cls)
    kw = _kwargs(POLICIES[policy], bp, ss, fp, orig)
    _assert_equal(stored.plan(**kw), model, inputs, **kw)


@pytest.mark.parametrize(("fp", "orig"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("policy", ["layer", "linears", "root only"])
@pytest.mark.parametrize("name", list(HF_MODELS))
def test_stored_trace_plans_equal_analyze_hf(name: str, policy: str, fp: bool, orig: bool) -> None:
    model, inputs, layer = HF_MODELS[name]()
    stored = StoredTrace(model, inputs)
    wrap = {"layer": ModuleWrapPolicy({layer}), "linears": ModuleWrapPolicy({nn.Linear})}
    kw = _kwargs(
        wrap.get(policy), BackwardPrefetch.BACKWARD_PRE, ShardingStrategy.FULL_SHARD, fp, orig
    )
    _assert_equal(stored.plan(**kw), model, inputs, **kw)


def test_tied_weights_plan_equal_analyze_or_refuse() -> None:
    """A tied weight used by a later unit: answered exactly, or refused."""
    model, inputs = hm.Tied(), torch.randint(0, 32, (2, 6))
    stored = StoredTrace(model, inputs)
    answered = 0
    for policy in [ModuleWrapPolicy({hm.Block}), ModuleWrapPolicy({hm.Block, nn.Linear}), None]:
        for fp in (False, True):
            kw = _kwargs(
                policy, BackwardPrefetch.BACKWARD_PRE, ShardingStrategy.FULL_SHARD, fp, False
            )
            fast = stored.plan(**kw)
            if fast is not None:
                answered += 1
                _assert_equal(fast, model, inputs, **kw)
    assert answered >= 2


@pytest.mark.parametrize(
    ("model", "reason"),
    [(hm.Checkpointed(), "inside backward"), (hm.frozen_stack(), "frozen")],
    ids=["recompute", "frozen"],
)
def test_refuses_what_it_does_not_model(model: nn.Module, reason: str) -> None:
    stored = StoredTrace(model, torch.randn(4, 8))
    assert stored.reason is not None and reason in stored.reason
    assert stored.plan(auto_wrap_policy=ModuleWrapPolicy({hm.Block})) is None


def test_refuses_mixed_precision_and_leaves_the_model_untouched() -> None:
    model = hm.Stack()
    before = {n: (p.device, p.requires_grad, id(p)) for n, p in model.named_parameters()}
    stored = StoredTrace(model, torch.randn(4, 8))
    mp = MixedPrecision(param_dtype=torch.bfloat16)
    assert stored.plan(auto_wrap_policy=ModuleWrapPolicy({hm.Block}), mixed_precision=mp) is None
    assert stored.plan(auto_wrap_policy=ModuleWrapPolicy({hm.Block})) is not None
    after = {n: (p.device, p.requires_grad, id(p)) for n, p in model.named_parameters()}
    assert after == before
    assert all(p.grad is None for p in model.parameters())
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_plans_do_not_leak_into_each_other() -> None:
    """Planning restores the stored copy: the same plan before and after others."""
    _model, _inputs, stored = _stored(hm.Nested)
    kw = _kwargs(
        POLICIES["blocks"], BackwardPrefetch.BACKWARD_PRE, ShardingStrategy.FULL_SHARD, True, False
    )
    first = stored.plan(**kw)
    for other in ("linears", "root only", "size"):
        stored.plan(**_kwargs(POLICIES[other], None, ShardingStrategy.FULL_SHARD, False, False))
    again = stored.plan(**kw)
    assert first is not None and again is not None
    assert first.to_dict() == again.to_dict()


def test_replanner_takes_the_fastest_exact_path() -> None:
    config = ExampleConfig(num_layers=3)
    model, inputs = example_model(config), example_inputs(config)
    planner = Replanner(model, inputs)
    base = PlanOptions(layer_classes=("DecoderLayer",), world_size=8)

    first = planner.plan(base)
    assert planner.last_path == "stored trace" and first.profile is None
    assert planner.plan(base) is first and planner.last_path == "cache"

    profiled = planner.profiled(base)
    assert planner.last_path == "trace" and profiled.profile is not None
    assert profiled.to_dict()["iterations"] == first.to_dict()["iterations"]

    wider_opts = base.replace(world_size=32, backward_prefetch="BACKWARD_POST")
    wider = planner.plan(wider_opts)
    assert planner.last_path == "replay" and wider.profile is not None
    reference = _analyze(planner, wider_opts, profile=True)
    assert wider.to_dict()["iterations"] == reference.to_dict()["iterations"]
    assert [u.to_dict() for u in wider.units] == [u.to_dict() for u in reference.units]

    other_opts = base.replace(layer_classes=("Attention", "MLP"), forward_prefetch=True)
    other = planner.plan(other_opts)
    assert planner.last_path == "stored trace"
    assert other.to_dict() == _analyze(planner, other_opts, profile=False).to_dict()


def _analyze(planner: Replanner, opts: PlanOptions, profile: bool) -> fsdpviz.Report:
    kwargs = planner.fsdp_kwargs(opts)
    kwargs["profile"] = profile
    return fsdpviz.analyze(planner.model, planner.inputs, **kwargs)


@pytest.mark.skipif(not fully_shard_supported(), reason="this fsdpviz has no FSDP2 recipe")
def test_fsdp2_recipe_replays_world_size_and_resharding() -> None:
    """FSDP2: a traced report replays other world sizes and reshard_after_forward exactly."""
    config = ExampleConfig(num_layers=2)
    model, inputs = example_model(config), example_inputs(config)
    planner = Replanner(model, inputs)
    base = PlanOptions(layer_classes=("DecoderLayer",), recipe="FSDP2")
    planner.plan(base)
    assert planner.last_path == "trace"
    for change in [
        {"world_size": 32},
        {"sharding_strategy": "SHARD_GRAD_OP"},
        {"world_size": 2, "sharding_strategy": "SHARD_GRAD_OP", "backward_prefetch": None},
    ]:
        opts = base.replace(**change)
        got = planner.plan(opts).to_dict()
        assert planner.last_path == "replay"
        want = _analyze(planner, opts, profile=True).to_dict()
        assert got["config"].pop("replayed") is True
        assert got == want
