"""torchao's float8 tensor-parallel styles (``Float8ColwiseParallel``,
``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput``) in ``parallelize_plan=``, against
real FSDP2 x TP with torchao's float8 linears on a 2 x 2 mesh of the fake process group
(real CPU tensors: ``torch._scaled_mm`` runs on the CPU).

The styles cast an activation to float8 on each rank's part before its all-gather, which
moves one byte an element, and cast a linear's output gradient to float8 before its
redistribution back (a row-wise output's all-gather); every tp collective DTensor issues,
kind, bytes and dtype, equals fsdpviz's. The memory equals ``FSDPMemTracker``'s to the
byte (the tracker made to count every storage of a float8 tensor:
``memtracker_harness._track_every_storage``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import tp_models
from gloo_worker import _tp_collectives
from memtracker_harness import tracked
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

import fsdpviz
from fsdpviz.cost import memory_model

float8 = pytest.importorskip("torchao.float8")

BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
SIZES = {"vocab": 64, "dim": 32, "n_heads": 4, "hidden": 96, "layers": 2}
FLOAT8 = {"filter_fqns": ["output"]}  # torchtitan's: the output projection stays bf16


def _tokens() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.sum()


def _build(
    converted: bool, checkpointed: bool = False, gathered: bool = False, recipe: str = "tensorwise"
) -> nn.Module:
    model = tp_models.Llama(**SIZES, checkpointed=checkpointed)
    if converted:
        config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=gathered)
        if recipe != "tensorwise":
            config = float8.Float8LinearConfig.from_recipe_name(recipe)
        float8.convert_to_float8_training(
            model, config=config, module_filter_fn=lambda m, fqn: fqn != "output"
        )
    return model


def _analyze(checkpointed: bool = False, **kwargs: Any) -> fsdpviz.Report:
    with torch.device("meta"):
        model = _build(False, checkpointed)
    return fsdpviz.analyze(
        model, _tokens(), fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2), loss=_loss,
        mp_policy=BF16, progress=False,
        **{"float8": FLOAT8, "parallelize_plan": tp_models.float8_plan(), **kwargs},
    )  # fmt: skip


def _real(
    plan: dict[str, Any],
    checkpointed: bool = False,
    gathered: bool = False,
    recipe: str = "tensorwise",
) -> list[list[Any]]:
    """Every tp collective of one step of real FSDP2 x TP with float8 linears, in order
    (``gathered``: FSDP2 all-gathers their weights in float8; ``recipe``: torchao's)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = _build(True, checkpointed, gathered, recipe)
    parallelize_module(model, mesh["tp"], plan)
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=mesh["dp"], mp_policy=BF16)
    fully_shard(model, mesh=mesh["dp"], mp_policy=BF16)
    with _tp_collectives(dtypes=True) as seen:
        _loss(model(_tokens())).backward()
    return seen


def test_float8_styles_move_float8_as_torchao(fake_pg: int) -> None:
    """The blocks' input all-gathers move float8_e4m3fn (a rank's part cast first: 512
    bytes of a (2, 8, 32) activation, bf16's 1,024 before), the row-wise outputs' gradients
    come back all-gathered in float8_e5m2, the reduce-scatters stay bf16. fsdpviz refused
    the styles ("... is not modelled")."""
    seen = _real(tp_models.float8_plan())
    report = _analyze()
    predicted = [[e.kind, e.nbytes, e.dtype] for e in report.iterations[0] if e.tensor_parallel]
    assert predicted == seen
    assert predicted.count(["tp_all_gather", 2 * 8 * 32, "float8_e4m3fn"]) == 2 * 2
    assert predicted.count(["tp_all_gather", 2 * 8 * 32, "float8_e5m2"]) == 2 * 2
    gathered = next(e for e in report.iterations[0] if e.dtype == "float8_e4m3fn")
    assert "float8_e4m3fn" in gathered.describe()


@pytest.mark.parametrize(
    ("checkpointed", "gathered"), [(False, False), (True, False), (False, True)],
    ids=["eager", "checkpointed", "float8-all-gather"],
)  # fmt: skip
@pytest.mark.parametrize("which", ["float8", "whole", "plain"])
def test_float8_amax_all_reduces_as_torchao(
    fake_pg: int, which: str, checkpointed: bool, gathered: bool
) -> None:
    """Each tensorwise cast of a tp-sharded tensor all-reduces its amax, a float64 scalar
    (8 bytes), over the tp ranks (see [Note: float8 amax all-reduces]): the float8 styles'
    casts of a sharded input and of a sharded output gradient, and inside the float8
    linears the sharded weight, a row-wise input, a column-wise output gradient (twice in
    backward), forward and backward, again in an activation checkpoint's recomputation; no
    weight's where FSDP2 gathered it in float8 (cast already).
    Every one in its place among the other tp collectives, as a real step issues them;
    fsdpviz planned none of them (a block's 25 under the float8 styles, 28 under torch's
    sequence-parallel and plain plans, per micro-step, 11 and 9 more recomputed)."""
    plan = {"float8": tp_models.float8_plan, "whole": tp_models.whole_plan,
            "plain": tp_models.plain_plan}[which]  # fmt: skip
    seen = _real(plan(), checkpointed, gathered)
    f8 = {**FLOAT8, "enable_fsdp_float8_all_gather": gathered}
    report = _analyze(parallelize_plan=plan(), checkpointed=checkpointed, float8=f8)
    predicted = [[e.kind, e.nbytes, e.dtype] for e in report.iterations[0] if e.tensor_parallel]
    assert predicted == seen
    amax = ["tp_all_reduce", 8, "float64"]
    assert predicted.count(amax) == seen.count(amax) > 0
    # the time model prices each over the tp ranks: latency-bound, never free
    steady = report.iterations[-1]
    timed = [t for t in report.timeline.events if steady[t.index].dtype == "float64"]
    assert len(timed) == seen.count(amax)
    assert all(t.stream == "tp" and t.end > t.start and t.bytes == 8 for t in timed)


@pytest.mark.parametrize(
    ("recipe", "which", "checkpointed"),
    [("rowwise", "plain", False), ("rowwise", "whole", True),
     ("rowwise_with_gw_hp", "plain", False), ("rowwise_with_gw_hp", "whole", True)],
    ids=["rowwise-plain", "rowwise-whole-checkpointed", "gw-hp-plain", "gw-hp-whole-checkpointed"],
)  # fmt: skip
def test_rowwise_float8_amax_all_reduces_as_torchao(
    fake_pg: int, recipe: str, which: str, checkpointed: bool
) -> None:
    """The rowwise recipes' casts scale along one dim: where a tp style shards the tensor
    along it, its amax is a float64 vector all-reduced over the tp ranks (see [Note: float8
    amax all-reduces]): a row-wise linear's input (one element a row: 16, 128 bytes) and
    weight (``out_features``: 256 bytes) in forward, a column-wise linear's output gradient
    (a row each) and weight (``in_features``; ``rowwise_with_gw_hp`` casts it tensorwise,
    8 bytes, and so a row-wise linear's too) in backward, again in a recomputation. Every
    one in its place among the other tp collectives, as a real step issues them; fsdpviz
    planned none of them (28 a step, 128 and 256 bytes, under the plain plan)."""
    plan = {"whole": tp_models.whole_plan, "plain": tp_models.plain_plan}[which]
    seen = _real(plan(), checkpointed, recipe=recipe)
    f8 = {**FLOAT8, "recipe_name": recipe}
    report = _analyze(parallelize_plan=plan(), checkpointed=checkpointed, float8=f8)
    predicted = [[e.kind, e.nbytes, e.dtype] for e in report.iterations[0] if e.tensor_parallel]
    assert predicted == seen
    amaxes = [c for c in seen if c[2] == "float64"]
    expected = {128, 256} | ({8} if recipe == "rowwise_with_gw_hp" else set())
    assert {c[1] for c in amaxes} == expected
    assert [c for c in predicted if c[2] == "float64"] == amaxes


def test_float8_styles_memory_against_fsdp_mem_tracker(fake_pg: int) -> None:
    """Each style's cast of a rank's part (its moment, the float8 part and its scale), the
    float8 all-gathered activation the column-wise linears hold for backward (no cast of
    their own, nor for the weight's gradient), the float8 output gradient gathered for a
    row-wise linear's backward: the peak, every category at it and every module's peaks to
    the byte."""
    from test_cost_memtracker import _as_the_tracker_sees, _compare
    from torch.distributed.tensor.parallel import parallelize_module

    real = tracked(lambda: _build(True), lambda: {"tokens": _tokens()},
                   lambda m: list(m.layers.values()), fake_pg, _loss, mesh_shape=(2, 2),
                   parallelize=lambda m, tp: parallelize_module(m, tp, tp_models.float8_plan()),
                   mp_policy=BF16, every_storage=True)  # fmt: skip
    report = _analyze()
    mem = memory_model(report, optimizer=None)
    with torch.device("meta"):
        model = _build(False)
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model))


@pytest.mark.parametrize("checkpointed", [False, True], ids=["eager", "checkpointed"])
@pytest.mark.parametrize("which", ["float8", "plain"])
def test_float8_all_gather_scales_against_fsdp_mem_tracker(
    fake_pg: int, which: str, checkpointed: bool
) -> None:
    """FSDP2's float8 all-gather under tensor parallelism, the first iteration: a unit
    gathered again in backward holds its forward's scales, each until the backward node
    that saved its weight has run (autograd then frees the node's saved tensors), not to
    the unit's post-backward (fsdpviz was 8 B high at the peak, in the last layer's
    backward, two of its linears' scales freed); a forward under the model's own activation
    checkpoint saves none, and the scales the copy-out replaces are alive through its split
    of the all-gather output (28 B high at the peak, 28 B low in the first layer's
    backward). The peak and every module's peaks to the byte, and every category at the
    peak but, with checkpointed blocks, the scales of the last layer, which the tracker
    counts as unsharded parameters after its reshard (the recomputation's pre-forward made
    them the parameters' in its eyes), fsdpviz as temporaries, as a unit resharded keeps
    them."""
    from memtracker_harness import MAPPING
    from test_cost_memtracker import _as_the_tracker_sees
    from torch.distributed.tensor.parallel import parallelize_module

    plan = {"float8": tp_models.float8_plan, "plain": tp_models.plain_plan}[which]
    real = tracked(lambda: _build(True, checkpointed, True), lambda: {"tokens": _tokens()},
                   lambda m: list(m.layers.values()), fake_pg, _loss, mesh_shape=(2, 2),
                   parallelize=lambda m, tp: parallelize_module(m, tp, plan()),
                   mp_policy=BF16, every_storage=True)  # fmt: skip
    f8 = {**FLOAT8, "enable_fsdp_float8_all_gather": True}
    report = _analyze(parallelize_plan=plan(), checkpointed=checkpointed, float8=f8)
    mem = memory_model(report, optimizer=None, iteration=0)
    with torch.device("meta"):
        model = _build(False, checkpointed)
    backward = _as_the_tracker_sees(report, mem, model)
    differences = {"peak": real.peak["Total"] - mem.peak["bytes"]}
    for name, (theirs, ours) in MAPPING.items():
        theirs_bytes = sum(real.peak.get(k, 0) for k in theirs)
        differences[name] = theirs_bytes - sum(mem.peak["breakdown"][k] for k in ours)
    for module, phases in real.modules.items():
        for phase, value in phases.items():
            ours_peak = backward[module] if phase == "backward" else mem.unit_peaks[module][phase]
            differences[f"{module!r} {phase}"] = value - ours_peak
    kept = {"unsharded params": 4 * 7, "backward tensors": -4 * 7} if checkpointed else {}
    assert {k: v for k, v in differences.items() if v} == kept
    # the trace's record of it is kept in the report: the same read back
    again = memory_model(fsdpviz.Report.from_dict(report.to_dict()), optimizer=None, iteration=0)
    assert again.peak == mem.peak and again.unit_peaks == mem.unit_peaks


def test_float8_styles_refused_where_torchao_refuses_them(fake_pg: int) -> None:
    """Without float8 linears, on a linear the float8 options leave in bf16, or under a
    rowwise recipe (the styles cast tensorwise): a clear error each."""
    with pytest.raises(fsdpviz.FSDPConfigError, match="needs torchao's float8 linears"):
        _analyze(float8=None)
    with pytest.raises(fsdpviz.FSDPConfigError, match="Expecting module to be Float8Linear"):
        _analyze(float8={"filter_fqns": ["output", "w2"]})
    with pytest.raises(fsdpviz.ConfigError, match="cast tensorwise"):
        _analyze(float8={**FLOAT8, "recipe_name": "rowwise"})
