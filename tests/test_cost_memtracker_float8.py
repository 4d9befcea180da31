"""Anchor: fsdpviz's memory of torchao's float8 training (``analyze(..., float8=...)``)
against torch's ``FSDPMemTracker`` on real ``fully_shard`` of models converted by torchao's
``convert_to_float8_training``: the fake process group (4 ranks), real CPU tensors (torchao's
tensor subclasses do not run on fake ones), bf16 compute reducing in float32 as float8
training runs. For each recipe the peak, every category at the peak
(``memtracker_harness.MAPPING``) and every module's forward and backward peak agree to the
byte. The tracker is a dispatch mode: what torchao allocates inside its float8 tensor's
``__torch_dispatch__`` (``float8_mm``'s operand copies and rowwise's rescaling) it does not
see, nor does fsdpviz count it (docs/cost.md).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from memtracker_harness import MAPPING, Tracked, tracked
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

import fsdpviz
from fsdpviz.cost import MemoryReport, memory_model
from fsdpviz.examples import DecoderLayer, ExampleConfig, ExampleModel

float8 = pytest.importorskip("torchao.float8")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

CONFIG = ExampleConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4
)
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _ids() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 256, (2, 32), generator=g)}


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.sum()


def _measure(
    fake_pg: int, spec: dict[str, Any], optimizer: bool = False
) -> tuple[Tracked, MemoryReport]:
    """The tracker on the converted model (the LM head left in bf16, as torchtitan's
    ``filter_fqns=["output"]`` does) and fsdpviz's prediction from the plain model. With
    ``optimizer``: Adam's steady state (a first step before the tracked one, and torchao's
    ``precompute_float8_dynamic_scale_for_fsdp`` after it where ``spec`` says so)."""
    recipe = spec.get("recipe_name")
    if recipe is None:
        gather = bool(spec.get("enable_fsdp_float8_all_gather"))
        config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=gather)
    else:
        config = float8.Float8LinearConfig.from_recipe_name(recipe)

    def picks(module: nn.Module, fqn: str) -> bool:
        return fqn != "lm_head"

    def build() -> nn.Module:
        model = ExampleModel(CONFIG)
        float8.convert_to_float8_training(model, config=config, module_filter_fn=picks)
        return model

    after = None
    if spec.get("precompute_float8_dynamic_scale_for_fsdp"):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp as after
    real = tracked(build, _ids, lambda m: list(m.layers), fake_pg, _loss, real=True,
                   mp_policy=BF16, optimizer=optimizer, after_step=after)  # fmt: skip
    with torch.device("meta"):
        model = ExampleModel(CONFIG)
    report = fsdpviz.analyze(model, _ids(), fully_shard=[DecoderLayer], loss=_loss,
                             world_size=fake_pg, mp_policy=BF16, progress=False,
                             float8={**spec, "filter_fqns": ["lm_head"]})  # fmt: skip
    if optimizer:
        return real, memory_model(report, optimizer="adam", iteration=1)
    return real, memory_model(report, optimizer=None, iteration=0)


def _differences(real: Tracked, mem: MemoryReport, steps: int = 0) -> dict[str, int]:
    """The tracker's bytes less fsdpviz's: the peak, each category at the peak, each
    module's forward and backward peak (only those that differ). ``steps``: the bytes of
    Adam's step counters, in the tracker's optimizer state, not in fsdpviz's."""
    out = {"peak": real.peak["Total"] - mem.peak["bytes"] - steps}
    for name, (theirs, ours) in MAPPING.items():
        a = sum(real.peak.get(k, 0) for k in theirs) - (steps if "OptState" in theirs else 0)
        out[name] = a - sum(mem.peak["breakdown"][k] for k in ours)
    for module, phases in real.modules.items():
        for phase, value in phases.items():
            out[f"{module!r} {phase}"] = value - steps - mem.unit_peaks[module][phase]
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_float8_recipes_against_fsdp_mem_tracker(fake_pg: int, recipe: str) -> None:
    """torchao's casts: each a float32 product, its clamp and the float8 result at once,
    the float8 operands kept beside the output, the input's gradient's kept through the
    weight's in backward (the peak: a layer's backward)."""
    spec = {} if recipe == "tensorwise" else {"recipe_name": recipe}
    real, mem = _measure(fake_pg, spec)
    assert _differences(real, mem) == {}


@pytest.mark.parametrize("step", ["first", "steady", "precomputed"])
def test_float8_all_gather_against_fsdp_mem_tracker(fake_pg: int, step: str) -> None:
    """FSDP2's float8 all-gather: each float8 weight gathered and held unsharded in one byte
    an element, in a flat ``uint8`` all-gather buffer; no weight cast in the linears. And
    its float32 scale as torchao keeps it ([Note: float8 all-gather scales] in
    ``fsdpviz/cost/memory_walker.py``): made anew by every all-gather
    (``fsdp_pre_all_gather``) beside the one the weight has until the copy-out replaces it
    (``fsdp_post_all_gather``), kept after resharding, a forward's saved for its backward
    beside the backward's own; with ``precompute_float8_dynamic_scale_for_fsdp`` after the
    optimizer step, one tensor of them all, made by it. The first iteration, Adam's steady
    state and the precomputed scales: the peak, every category at it, every module's peaks
    to the byte (before: 56 B low at the peak, 84 B in the second layer's backward), but
    for the scales the steady state kept from the step before the tracker started, which it
    does not see: the second layer's, in the first layer's forward."""
    spec: dict[str, Any] = {"enable_fsdp_float8_all_gather": True}
    if step == "precomputed":
        spec["precompute_float8_dynamic_scale_for_fsdp"] = True
    real, mem = _measure(fake_pg, spec, optimizer=step != "first")
    with torch.device("meta"):
        steps = 4 * len(list(ExampleModel(CONFIG).parameters())) if step != "first" else 0
    unseen = {"'layers.0' forward": -4 * 7} if step == "steady" else {}  # 7 float8 weights
    assert _differences(real, mem, steps) == unseen


def test_float8_all_gather_with_a_reshard_to_fewer_ranks_is_refused(fake_pg: int) -> None:
    """FSDP2 cannot all-gather a float8 weight from the smaller mesh ``reshard_after_forward=2``
    reshards it to after forward: real ``fully_shard`` raises ``NotImplementedError``
    (``FSDPParam.all_gather_inputs``) at the backward's all-gather. fsdpviz refuses the plan
    saying so, from ``analyze`` and from a replay of a plan that reshards fully, as it does a
    group of tensor-parallel DTensors; before, it planned it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    real = ExampleModel(CONFIG)
    float8.convert_to_float8_training(real, config=config)
    mesh = init_device_mesh("cpu", (fake_pg,))
    for layer in real.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=2, mp_policy=BF16)
    fully_shard(real, mesh=mesh, mp_policy=BF16)
    with pytest.raises(NotImplementedError):
        _loss(real(**_ids())).backward()

    with torch.device("meta"):
        model = ExampleModel(CONFIG)
    spec = {"enable_fsdp_float8_all_gather": True}
    with pytest.raises(fsdpviz.FSDPConfigError, match="float8 weights FSDP2 all-gathers"):
        fsdpviz.analyze(model, _ids(), fully_shard=[DecoderLayer], world_size=fake_pg,
                        reshard_after_forward={"layers.0": 2}, mp_policy=BF16, float8=spec,
                        progress=False)  # fmt: skip
    report = fsdpviz.analyze(model, _ids(), fully_shard=[DecoderLayer], world_size=fake_pg,
                             mp_policy=BF16, float8=spec, progress=False)  # fmt: skip
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"layers\.1.*float8 weights"):
        fsdpviz.replan.replay(report, reshard_after_forward={"layers.1": 2})


@pytest.mark.parametrize(
    ("checkpointing", "recipe", "hidden"),
    [("full", "rowwise_with_gw_hp", 32), ("selective", "tensorwise", 64),
     ("selective", "rowwise", 64)],
)  # fmt: skip
def test_float8_linears_recomputed_by_activation_checkpoints(
    fake_pg: int, checkpointing: str, recipe: str, hidden: int
) -> None:
    """Checkpointed blocks recompute torchao's forward, as torch runs it. Non-reentrant
    checkpointing stops recomputing once the forward's last saved tensor is saved again: a
    plain linear's ``mm`` saves its inputs before it computes, so the trace of the block's
    last linear (the MLP's down projection) multiplies nothing, but torchao's
    ``matmul_with_hp_or_float8_args`` (an ``autograd.Function``) saves after its forward, so
    its casts run, and its multiply (full: with the weight gradient in bf16, that recast is
    the backward's peak; before, 3,072 B low). Under torchtitan's per-operator policy the
    linears whose ``mm`` output was saved take it from the cache in the recomputation, the
    down projection's too (before, held to the end of the block's backward: 4,096 B high),
    still casting first; and tensorwise casts' ``torch.max`` (``aten.max.default``, on
    torchtitan's save list) are saved from the forward until the recomputation's casts
    (before, 2 B a cast low in each forward). The peak, every category at it and every
    module's peaks to the byte."""
    from test_cost_memtracker import (
        _as_the_tracker_names,
        _as_the_tracker_sees,
        _torchtitan_sac,
        _whole,
    )

    from fsdpviz.schema.checkpointing import SelectiveCheckpoint

    config = ExampleConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=96, num_layers=2, num_heads=4
    )
    f8 = float8.Float8LinearConfig.from_recipe_name(recipe)
    wrap = _whole if checkpointing == "full" else _torchtitan_sac

    def build() -> nn.Module:
        model = ExampleModel(config)
        float8.convert_to_float8_training(
            model, config=f8, module_filter_fn=lambda m, fqn: fqn != "lm_head"
        )
        for layer in model.layers:
            wrap(layer)
        return model

    def ids() -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"input_ids": torch.randint(0, 128, (2, 24), generator=g)}

    real = tracked(build, ids, lambda m: list(m.layers), fake_pg, _loss, real=True, mp_policy=BF16)
    with torch.device("meta"):
        model = ExampleModel(config)
    spec = [DecoderLayer] if checkpointing == "full" else SelectiveCheckpoint([DecoderLayer])
    f8spec = {"recipe_name": recipe, "filter_fqns": ["lm_head"]}
    report = fsdpviz.analyze(model, ids(), fully_shard=[DecoderLayer], loss=_loss,
                             world_size=fake_pg, mp_policy=BF16, progress=False,
                             activation_checkpointing=spec, float8=f8spec)  # fmt: skip
    mem = memory_model(report, optimizer=None)
    assert real.peak["Total"] == mem.peak["bytes"]
    named = _as_the_tracker_names(report, mem).peak["breakdown"]
    # the tracker calls what backward recomputes a temporary, fsdpviz activations
    both = ("forward tensors", "backward tensors")
    for name, (theirs, ours) in MAPPING.items():
        if name not in both:
            assert sum(real.peak.get(k, 0) for k in theirs) == sum(named[k] for k in ours), name
    assert sum(real.peak.get(k, 0) for n in both for k in MAPPING[n][0]) == sum(
        named[k] for n in both for k in MAPPING[n][1]
    )
    backward = _as_the_tracker_sees(report, mem, model)
    for module, phases in real.modules.items():
        assert phases["forward"] == mem.unit_peaks[module]["forward"], module
        assert phases["backward"] == backward[module], module


@pytest.mark.parametrize(
    ("recipe", "checkpointed"), [("tensorwise", False), ("rowwise", False), ("rowwise", True)]
)
def test_float8_linears_under_tensor_parallelism(
    fake_pg: int, recipe: str, checkpointed: bool
) -> None:
    """FSDP2 x TP on a 2 x 2 mesh, torch's column- and row-wise styles on torchao's float8
    linears (no sequence parallelism): each backward's casts and float8 operands are one
    rank's part of each tensor, the column-wise linear's output gradient and weight split
    on the out-features (its input and input's gradient whole), the row-wise one's weight,
    input and gradients on the in-features (its output gradient whole). Before, every
    moment was the output gradient's share of the whole linear's: a row-wise linear's whole
    (7,168 B high at the backward's peak with tensorwise). In forward a column-wise
    linear's weight is a rank's out-features, and rowwise scales one per local column of it
    (with checkpointed blocks the forward's cast was its peak: 128 B high, the whole
    weight's scales). The peak, every category at it and every module's peaks to the
    byte."""
    import tp_models
    from test_cost_memtracker import _as_the_tracker_sees, _compare
    from torch.distributed.tensor.parallel import parallelize_module

    plan = tp_models.plain_plan()
    f8 = float8.Float8LinearConfig.from_recipe_name(recipe)

    def build(converted: bool) -> nn.Module:
        model = tp_models.Llama(
            vocab=64, dim=32, n_heads=4, hidden=64, layers=2, checkpointed=checkpointed
        )
        if converted:
            float8.convert_to_float8_training(
                model, config=f8, module_filter_fn=lambda m, fqn: fqn != "output"
            )
        return model

    def tokens() -> torch.Tensor:
        return torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))

    real = tracked(lambda: build(True), lambda: {"tokens": tokens()},
                   lambda m: list(m.layers.values()), fake_pg, _loss, mesh_shape=(2, 2),
                   parallelize=lambda m, tp: parallelize_module(m, tp, plan),
                   mp_policy=BF16)  # fmt: skip
    with torch.device("meta"):
        model = build(False)
    report = fsdpviz.analyze(model, tokens(), fully_shard=[("layers.0",), ("layers.1",)],
                             mesh=("dp_shard", 2, "tp", 2), parallelize_plan=plan, loss=_loss,
                             mp_policy=BF16, progress=False,
                             float8={"recipe_name": recipe, "filter_fqns": ["output"]})  # fmt: skip
    mem = memory_model(report, optimizer=None)
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model))
