"""Plans from one stored trace (fsdpviz/replan/stored_fsdp1.py, stored_fsdp2.py) equal analyze.

``analyze`` is pinned to real FSDP1 and FSDP2 by the conformance tests; here every
plan a stored trace answers must equal ``analyze(..., profile=False)`` field for
field (units, forward order, both iterations, warnings, modules, backward module
order), over the hand-written corner cases and the Hugging Face models: for FSDP1
several wrap policies and every prefetch / sharding / use_orig_params setting, for
FSDP2 several ``fully_shard`` recipes and every ``reshard_after_forward`` form.
What a stored trace does not model must be refused, not guessed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import handwritten_models as hm
import pytest
import torch
from hf_models import HF_MODELS
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

import fsdpviz
from fsdpviz.examples import ExampleConfig, example_inputs, example_model
from fsdpviz.replan import PlanOptions, Replanner
from fsdpviz.replan.replanner import PlanChanges
from fsdpviz.replan.stored_fsdp1 import StoredTrace
from fsdpviz.replan.stored_fsdp2 import StoredTrace as StoredTrace2

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


def test_fsdp2_recipe_plans_from_its_stored_trace_then_replays() -> None:
    """FSDP2: a stored-trace plan equals analyze; a profiled one replays world sizes."""
    config = ExampleConfig(num_layers=2)
    model, inputs = example_model(config), example_inputs(config)
    planner = Replanner(model, inputs)
    base = PlanOptions(layer_classes=("DecoderLayer",), recipe="FSDP2")
    for classes in [("DecoderLayer",), ("Attention", "MLP"), ()]:
        opts = base.replace(layer_classes=classes, policy="classes" if classes else "none")
        got = planner.plan(opts)
        assert planner.last_path == "stored trace" and got.profile is None
        assert got.to_dict() == _analyze(planner, opts, profile=False).to_dict()
    planner.profiled(base)
    assert planner.last_path == "trace"
    for change in [
        {"world_size": 32},
        {"reshard_after_forward": False},
        {"world_size": 16, "reshard_after_forward": 4},
        {"world_size": 2, "reshard_after_forward": False, "backward_prefetch": None},
    ]:
        opts = base.replace(**change)
        replayed = planner.plan(opts).to_dict()
        assert planner.last_path == "replay"
        want = _analyze(planner, opts, profile=True).to_dict()
        assert replayed["config"].pop("replayed") is True
        assert replayed == want


# ----------------------------------------------------------------------------- FSDP2

BLOCKS = [f"blocks.{i}" for i in range(4)]
FSDP2_RECIPES: dict[str, Any] = {
    "blocks": [hm.Block],
    "linears": [nn.Linear],
    "blocks+linears": [hm.Block, nn.Linear],
    "blocks by name": BLOCKS,
    "grouped head": [*BLOCKS, ("inp", "head")],
    "root only": [],
}
FSDP2_MODELS = [*hm.VIEW_ONLY, hm.WithNorm, hm.frozen_stack]


@functools.cache
def _stored2(build: Any) -> tuple[nn.Module, torch.Tensor, StoredTrace2]:
    torch.manual_seed(0)
    model, inputs = build(), torch.randn(4, 8)
    return model, inputs, StoredTrace2(model, inputs)


def _fsdp2_cases() -> list[Any]:
    """Every model with every recipe whose module names it has."""
    cases = []
    for build in FSDP2_MODELS:
        names = {n for n, _ in build().named_modules()}
        for recipe, calls in FSDP2_RECIPES.items():
            named = [c for c in calls if isinstance(c, str)]
            named += [n for c in calls if isinstance(c, tuple) for n in c]
            if all(n in names for n in named):
                cases.append(pytest.param(build, recipe, id=f"{build.__name__}-{recipe}"))
    return cases


@pytest.mark.parametrize("raf", [None, True, False, 2], ids=lambda r: f"raf={r}")
@pytest.mark.parametrize(("build", "recipe"), _fsdp2_cases())
def test_fsdp2_stored_trace_plans_equal_analyze(build: Any, recipe: str, raf: Any) -> None:
    model, inputs, stored = _stored2(build)
    kw: dict[str, Any] = {"fully_shard": FSDP2_RECIPES[recipe], "world_size": 4}
    if raf is not None:
        kw["reshard_after_forward"] = raf
    _assert_equal(stored.plan(**kw), model, inputs, **kw)


@pytest.mark.parametrize("recipe", ["layer", "linears", "root only"])
@pytest.mark.parametrize("name", list(HF_MODELS))
def test_fsdp2_stored_trace_plans_equal_analyze_hf(name: str, recipe: str) -> None:
    model, inputs, layer = HF_MODELS[name]()
    stored = StoredTrace2(model, inputs)
    calls = {"layer": [layer], "linears": [nn.Linear], "root only": []}[recipe]
    kw = {"fully_shard": calls, "world_size": 4}
    if recipe == "linears" and name != "llama":  # tied embeddings: FSDP2's own error
        with pytest.raises(fsdpviz.FSDPConfigError, match="shared with a parameter"):
            stored.plan(**kw)
        return
    _assert_equal(stored.plan(**kw), model, inputs, **kw)


def test_fsdp2_stored_trace_options_beyond_the_recipe() -> None:
    """Explicit prefetch maps, per-module resharding, ignored parameters, a reduce dtype,
    tied weights in one grouped call, and inputs that require grad."""
    model, inputs, stored = _stored2(hm.Stack)
    fwd = {f"blocks.{i}": [f"blocks.{i + 1}", f"blocks.{i + 2}"] for i in range(2)}
    bwd = {f"blocks.{i}": [f"blocks.{i - 1}"] for i in range(3, 0, -1)}
    for extra in [
        {"forward_prefetch": fwd, "backward_prefetch": bwd},
        {"reshard_after_forward": {"": False, "blocks.1": False}},
        {"ignored_params": [model.blocks[1].fc1.weight]},
        {"mp_policy": MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)},
    ]:
        kw = {"fully_shard": BLOCKS, "world_size": 4, **extra}
        _assert_equal(stored.plan(**kw), model, inputs, **kw)
    tied, ids = hm.Tied(), torch.randint(0, 32, (2, 6))
    stored_tied = StoredTrace2(tied, ids)
    for calls in [["blocks.0", "blocks.1", "blocks.2", ("emb", "head")], [hm.Block]]:
        kw = {"fully_shard": calls, "world_size": 4}
        _assert_equal(stored_tied.plan(**kw), tied, ids, **kw)
    x = torch.randn(4, 8, requires_grad=True)
    stored_grad = StoredTrace2(model, x)
    for calls in [[hm.Block], [nn.Linear], []]:
        kw = {"fully_shard": calls, "world_size": 4}
        _assert_equal(stored_grad.plan(**kw), model, x, **kw)


class _PassBlock(nn.Module):
    """Returns its input through an ``nn.Identity`` when told to skip."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.idn: nn.Module = nn.Identity()

    def forward(self, x: torch.Tensor, skip: bool = False) -> torch.Tensor:
        return self.idn(x) if skip else self.idn(self.lin(x)) + x


class _PassModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(_PassBlock() for _ in range(3))
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](self.inp(x))
        return self.head(self.blocks[2](self.blocks[1](h, skip=True)))


def test_fsdp2_module_returning_its_input() -> None:
    """A group that returns its input returns FSDP2's view: warned exactly as analyze."""
    model, x = _PassModel(), torch.randn(4, 8)
    stored = StoredTrace2(model, x)
    for calls in [[_PassBlock], [nn.Linear], [_PassBlock, nn.Linear], ["blocks.1"], []]:
        kw = {"fully_shard": calls, "world_size": 4}
        fast = stored.plan(**kw)
        _assert_equal(fast, model, x, **kw)
    assert fast is not None


@pytest.mark.parametrize(
    ("model", "reason"),
    [(hm.Checkpointed(), "inside backward"), (_PassModel(), "modified inplace")],
    ids=["recompute", "in-place on an input"],
)
def test_fsdp2_refuses_what_it_does_not_model(model: nn.Module, reason: str) -> None:
    if isinstance(model, _PassModel):
        model.blocks[1].idn = nn.ReLU(inplace=True)
    stored = StoredTrace2(model, torch.randn(4, 8))
    assert stored.reason is not None and reason in stored.reason
    assert stored.plan(fully_shard=[nn.Linear]) is None


def test_fsdp2_refuses_mixed_precision_and_leaves_the_model_untouched() -> None:
    model = hm.Stack()
    before = {n: (p.device, p.requires_grad, id(p)) for n, p in model.named_parameters()}
    stored = StoredTrace2(model, torch.randn(4, 8))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    assert stored.plan(fully_shard=[hm.Block], mp_policy=mp) is None
    assert stored.plan(fully_shard=[hm.Block], trace="real") is None
    assert stored.plan(fully_shard=[hm.Block]) is not None
    after = {n: (p.device, p.requires_grad, id(p)) for n, p in model.named_parameters()}
    assert after == before
    assert all(p.grad is None for p in model.parameters())
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_plan_changes_name_every_plan_option() -> None:
    """``Replanner.plan(**changes)`` and the controls' ``set(**changes)`` are typed by
    ``PlanChanges``: every field of ``PlanOptions``, none else."""
    assert set(PlanChanges.__optional_keys__) == {f.name for f in dataclasses.fields(PlanOptions)}
