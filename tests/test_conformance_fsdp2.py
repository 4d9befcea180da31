"""Conformance: fsdpviz's FSDP2 prediction equals a recording of real ``fully_shard``.

Real FSDP2 runs in this process on the CPU with the fake process group (4
ranks); each case applies ``fully_shard`` bottom-up then to the root, records
three iterations, and compares units, forward order, the first iteration and
the steady state, event for event.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import handwritten_models as hm
import pytest
import torch
from fsdp_harness import assert_same_schedule, record_real_fsdp2
from hf_models import HF_MODELS
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

import fsdpviz

BLOCKS = [(f"blocks.{i}",) for i in range(4)]


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


def check(
    model: nn.Module, inputs: Any, calls: list[tuple[str, ...]], world_size: int, **kw: Any
) -> fsdpviz.Report:
    real = record_real_fsdp2(model, inputs, calls, world_size, **kw)
    predicted = fsdpviz.analyze(model, inputs, fully_shard=calls, world_size=world_size, **kw)
    assert_same_schedule(real, predicted)
    return predicted


CASES: dict[str, tuple[Any, list[tuple[str, ...]]]] = {
    "per_block": (hm.Stack, BLOCKS),
    "called_twice": (hm.CalledTwice, BLOCKS),
    "reordered": (hm.Reordered, BLOCKS),
    "grouped_head": (hm.Stack, [*BLOCKS, ("inp", "head")]),
    "nested": (
        hm.Nested,
        [("outers.0.inner.0",), ("outers.0.inner.1",), ("outers.0",), ("outers.1",)],
    ),
    # `aux` belongs to no group but the root and runs between blocks
    "module_outside_groups": (hm.WithAux, BLOCKS),
    "checkpointed": (hm.Checkpointed, BLOCKS),
    "side_output": (hm.SideOutput, BLOCKS),
    "root_only": (hm.Stack, []),
}


@pytest.mark.parametrize("raf", [None, True, False, 2], ids=lambda r: f"raf={r}")
@pytest.mark.parametrize("name", list(CASES))
def test_handwritten_recipes(fake_pg: int, name: str, raf: Any) -> None:
    build, calls = CASES[name]
    torch.manual_seed(0)
    kw = {} if raf is None else {"reshard_after_forward": raf}
    check(build(), _x(), calls, fake_pg, **kw)


@pytest.mark.parametrize("root_raf", [True, False])
def test_root_reshard_after_forward_per_module(fake_pg: int, root_raf: bool) -> None:
    torch.manual_seed(0)
    raf = {"": root_raf, "blocks.1": False}
    report = check(hm.Stack(), _x(), BLOCKS, fake_pg, reshard_after_forward=raf)
    frees_in_forward = {
        e.unit for e in report.iterations[1] if e.kind == "free" and e.phase == "forward"
    }
    assert ("" in frees_in_forward) is root_raf
    assert "blocks.1" not in frees_in_forward and "blocks.2" in frees_in_forward


def test_explicit_forward_and_backward_prefetch(fake_pg: int) -> None:
    torch.manual_seed(0)
    fwd = {f"blocks.{i}": [f"blocks.{i + 1}", f"blocks.{i + 2}"] for i in range(2)}
    bwd = {f"blocks.{i}": [f"blocks.{i - 1}"] for i in range(3, 0, -1)}
    report = check(hm.Stack(), _x(), BLOCKS, fake_pg, forward_prefetch=fwd, backward_prefetch=bwd)
    prefetched = [(e.hook_unit, e.unit) for e in report.iterations[1] if e.prefetch]
    assert ("blocks.0", "blocks.1") in prefetched and ("blocks.0", "blocks.2") in prefetched
    assert ("blocks.3", "blocks.2") in prefetched


def test_tied_weights_grouped(fake_pg: int) -> None:
    torch.manual_seed(0)
    calls = [("blocks.0",), ("blocks.1",), ("blocks.2",), ("emb", "head")]
    report = check(hm.Tied(), torch.randint(0, 32, (2, 6)), calls, fake_pg)
    group = report.unit("emb, head")
    assert group.params == ["emb.weight"] and group.shared_params == {"head.weight": "emb.weight"}


def test_tied_weights_in_different_groups_is_fsdps_error() -> None:
    with pytest.raises(fsdpviz.FSDPConfigError, match="shared with a parameter already managed"):
        fsdpviz.analyze(hm.Tied(), torch.randint(0, 32, (2, 6)), fully_shard=["emb", "head"])


def test_frozen_first_block(fake_pg: int) -> None:
    torch.manual_seed(0)
    report = check(hm.frozen_stack(), _x(), BLOCKS, fake_pg)
    assert not any(
        e.kind == "reduce_scatter" and e.unit == "blocks.0" for e in report.iterations[1]
    )


class _Idle(hm.Stack):
    """Five blocks, a linear layer in block 1 that no forward calls, block 4 never called."""

    def __init__(self) -> None:
        super().__init__(n=5)
        self.blocks[1].spare = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in list(self.blocks)[:4]:
            h = b(h)
        out: torch.Tensor = self.head(h)
        return out


@pytest.mark.parametrize("mesh", [None, (2, 2)], ids=["1d", "hsdp"])
def test_parameters_no_gradient_reaches(fake_pg: int, mesh: Any) -> None:
    """Parameters that require grad but that no gradient reaches (:class:`_Idle`): FSDP2
    reduce-scatters only the gradients that exist (``FSDPParamGroup.post_backward``), so the
    recording and the plan both state them unused and leave them out of each unit's
    trainable shard; the schedule, event for event, over two micro-steps."""
    from fsdp_harness import assert_same_accumulation

    torch.manual_seed(0)
    model, calls = _Idle(), [(f"blocks.{i}",) for i in range(5)]
    ranks = {"mesh": mesh} if mesh else {"world_size": fake_pg}
    real = record_real_fsdp2(model, _x(), calls, fake_pg, mesh_shape=mesh, grad_accum=2)
    predicted = fsdpviz.analyze(model, _x(), fully_shard=calls, grad_accum=2, **ranks)
    assert_same_accumulation(real, predicted, 2)
    assert [u.to_dict() for u in real.units] == [u.to_dict() for u in predicted.units]
    spare = predicted.unit("blocks.1")
    assert spare.unused_params == ["blocks.1.spare.weight", "blocks.1.spare.bias"]
    assert spare.trainable[0] == spare.numel - 16 * 16 - 16
    idle = predicted.unit("blocks.4")
    assert idle.trainable == (0, 0) and len(idle.unused_params) == len(idle.params)


def test_one_replica_mesh_all_reduces(fake_pg: int) -> None:
    """A 2-D mesh whose replicate dimension has one rank: torch still gives each group an
    ``HSDPMeshInfo`` (the mesh's dimensionality decides), so ``foreach_reduce`` all-reduces
    every gradient shard over the replicate group of one rank after its reduce-scatter;
    the plan issues those all-reduces (it planned a 1-D mesh's schedule, without them)."""
    torch.manual_seed(0)
    model, mesh = hm.Stack(), (1, fake_pg)
    real = record_real_fsdp2(model, _x(), BLOCKS, fake_pg, mesh_shape=mesh)
    predicted = fsdpviz.analyze(model, _x(), fully_shard=BLOCKS, mesh=mesh)
    assert_same_schedule(real, predicted)
    reduced = [e.unit for e in predicted.iterations[0] if e.kind == "reduce_scatter"]
    across = [e.unit for e in predicted.iterations[0] if e.group == "replicate"]
    assert across == reduced and len(across) == len(BLOCKS) + 1
    assert predicted.config.mesh == {"replicate": 1, "shard": fake_pg}


@pytest.mark.parametrize("name", list(HF_MODELS))
@pytest.mark.parametrize("mp", [False, True], ids=["fp32", "bf16"])
def test_hf_models_per_layer(fake_pg: int, name: str, mp: bool) -> None:
    torch.manual_seed(0)
    model, inputs, layer = HF_MODELS[name]()
    calls = [(n,) for n, m in model.named_modules() if isinstance(m, layer)]
    kw: dict[str, Any] = {}
    if mp:
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    real = record_real_fsdp2(model, inputs, calls, fake_pg, **kw)
    # the class form that recipes use: fully_shard every decoder layer
    predicted = fsdpviz.analyze(model, inputs, fully_shard=[layer], world_size=fake_pg, **kw)
    assert_same_schedule(real, predicted)
    # FSDP2 warns when a wrapped module returns a view (T5 blocks, BERT's root)
    warned = {n for w in predicted.warnings if w.code == "view_output" for n in w.units}
    assert bool(warned) is (name in ("t5", "bert"))


@pytest.mark.parametrize(
    ("mesh", "reshard_after_backward", "requires_all_reduce"),
    [(None, False, True), ((2, 2), True, False), ((2, 2), False, False)],
    ids=["keep-gathered", "hsdp-no-all-reduce", "hsdp-both"],
)
def test_accumulation_setters(
    fake_pg: int, mesh: Any, reshard_after_backward: bool, requires_all_reduce: bool
) -> None:
    """Gradient accumulation as pipeline schedules and HSDP jobs run it: before each micro-step
    but the last, ``set_reshard_after_backward(False)`` (the parameters stay gathered into the
    next micro-step: its forward all-gathers nothing) and ``set_requires_all_reduce(False)``
    (each micro-step reduce-scatters, the all-reduce across the replicas runs in the last)."""
    from fsdp_harness import assert_same_accumulation

    torch.manual_seed(0)
    model, n = hm.Stack(), 3
    ranks = {"mesh": mesh} if mesh else {"world_size": fake_pg}
    options = {"reshard_after_backward": reshard_after_backward,
               "requires_all_reduce": requires_all_reduce}  # fmt: skip
    real = record_real_fsdp2(model, _x(), BLOCKS, fake_pg, mesh_shape=mesh, grad_accum=n,
                             iterations=3, **options)  # fmt: skip
    predicted = fsdpviz.analyze(model, _x(), fully_shard=BLOCKS, grad_accum=n, **ranks, **options)
    assert_same_accumulation(real, predicted, n)
    first = predicted.iterations[n]  # the steady step's first micro-step
    if not reshard_after_backward:  # the steady step's micro-steps after the first gather less
        gathers = [sum(e.kind == "all_gather" for e in it) for it in predicted.iterations[n:]]
        assert gathers[1] < gathers[0]
    if not requires_all_reduce:
        kinds = {e.kind for e in first}
        assert "reduce_scatter" in kinds and not any(e.group == "replicate" for e in first)
        last = predicted.iterations[2 * n - 1]
        assert any(e.group == "replicate" for e in last)


def test_drawn_option_sets(fake_pg: int) -> None:
    """Twelve drawn FSDP2 jobs (a model and its groups; a 1-D or 2-D mesh; resharding as a
    bool, an int or per group; mixed precision; CPU offload; explicit prefetch; gradient
    accumulation with the setters HSDP and pipeline jobs use): each prediction equals the
    recording of real ``fully_shard``, event for event."""
    from fsdp_harness import assert_same_accumulation
    from torch.distributed.fsdp import CPUOffloadPolicy

    rng = random.Random("fsdp2 conformance")
    for _ in range(12):
        name = rng.choice([n for n in CASES if n not in ("nested", "root_only")])
        build, calls = CASES[name]
        mesh = rng.choice([None, (2, 2)])
        raf = rng.choice([None, True, False, 2, {"blocks.1": False}, {"blocks.0": 2, "": False}])
        if mesh and raf in (2, {"blocks.0": 2, "": False}):  # 2 of 2 shard ranks: True
            raf = {"blocks.0": True, "": False}
        kw: dict[str, Any] = {} if raf is None else {"reshard_after_forward": raf}
        if rng.random() < 0.4:
            reduce = rng.choice([None, torch.float32])
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
        if rng.random() < 0.3:
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        if name == "per_block" and rng.random() < 0.5:
            kw["forward_prefetch"] = {"blocks.0": ["blocks.1", "blocks.2"]}
            kw["backward_prefetch"] = {"blocks.3": ["blocks.2"], "blocks.2": ["blocks.0"]}
        n = rng.choice([1, 2])
        if n > 1:
            kw["reshard_after_backward"] = rng.choice([True, False])
            kw["requires_all_reduce"] = bool(not mesh or rng.choice([True, False]))
        torch.manual_seed(0)
        model = build()
        real = record_real_fsdp2(model, _x(), calls, fake_pg, mesh_shape=mesh, grad_accum=n, **kw)
        ranks = {"mesh": mesh} if mesh else {"world_size": fake_pg}
        predicted = fsdpviz.analyze(model, _x(), fully_shard=calls, grad_accum=n, **ranks, **kw)
        if n > 1:
            assert_same_accumulation(real, predicted, n)
        else:
            assert_same_schedule(real, predicted)


def test_blocks_wrapped_for_activation_checkpointing(fake_pg: int) -> None:
    """``apply_activation_checkpointing`` before ``fully_shard`` (torchtitan's order): the
    recording names each unit's parameters and class as the plan of
    ``activation_checkpointing=[Block]`` does, without the ``CheckpointWrapper`` between."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    torch.manual_seed(0)
    model = hm.Stack()
    wrapped = copy.deepcopy(model)
    apply_activation_checkpointing(wrapped, check_fn=lambda m: isinstance(m, hm.Block))
    real = record_real_fsdp2(wrapped, _x(), BLOCKS, fake_pg)
    predicted = fsdpviz.analyze(model, _x(), fully_shard=BLOCKS, world_size=fake_pg,
                                activation_checkpointing=[hm.Block])  # fmt: skip
    assert_same_schedule(real, predicted)
    assert real.unit("blocks.0").params[:2] == ["blocks.0.ln.weight", "blocks.0.ln.bias"]
    assert real.unit("blocks.0").module_class == "Block"


def test_a_checkpoint_wrapped_model_and_its_recording_name_each_unit_alike(fake_pg: int) -> None:
    """A model whose blocks ``apply_activation_checkpointing`` wrapped, planned as it is
    (``fully_shard`` on the block inside each wrapper, ``blocks.0._checkpoint_wrapped_module``,
    and on the last wrapper itself), recorded, and planned once sharded: each unit has one
    name, the block's without the wrapper's segment, in the units, the forward order and
    every event, and ``compare`` pairs each unit with itself under that name."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    torch.manual_seed(0)
    model = hm.Stack()
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, hm.Block))
    calls = [(f"blocks.{i}._checkpoint_wrapped_module",) for i in range(3)] + [("blocks.3",)]
    applied: list[fsdpviz.Report] = []  # the plan of the model fully_shard was applied to
    real = record_real_fsdp2(
        model, _x(), calls, fake_pg, after=lambda m: applied.append(fsdpviz.analyze(m, _x()))
    )
    predicted = fsdpviz.analyze(model, _x(), fully_shard=calls, world_size=fake_pg)
    names = ["", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert [u.module for u in predicted.units] == [u.module for u in real.units] == names
    assert [u.module for u in applied[0].units] == names
    inner = "blocks.0._checkpoint_wrapped_module"  # the module's own FQN finds its unit too
    assert predicted.unit(inner) is predicted.unit("blocks.0")
    assert real.unit(inner) is real.unit("blocks.0")
    assert predicted.forward_order == real.forward_order == names
    for p_it, r_it in zip(predicted.iterations, real.iterations, strict=False):
        assert [e.to_dict() for e in p_it] == [e.to_dict() for e in r_it]
    cmp = fsdpviz.compare(predicted, real)
    assert [(p.a, p.b) for p in cmp.pairs] == [(n, n) for n in names]
    assert cmp.same_wrapping and cmp.moved_params == {}
    # the options name a unit by its call's module or by the name it is shown under
    raf = {"blocks.0": False, "blocks.1._checkpoint_wrapped_module": False}
    kept = fsdpviz.analyze(model, _x(), fully_shard=calls, world_size=fake_pg,
                           reshard_after_forward=raf)  # fmt: skip
    assert kept.config.reshard_after_forward == {"": False, "blocks.0": False,
        "blocks.1": False, "blocks.2": True, "blocks.3": True}  # fmt: skip


def test_calls_on_a_checkpoint_wrapper_and_its_block_keep_the_wrappers_segment(
    fake_pg: int,
) -> None:
    """``fully_shard`` on a block inside its checkpoint wrapper and on the wrapper too: the
    two calls would share the block's name without the segment, so both keep theirs, in the
    plan and in the recording alike (the wrapper's call holds no parameter: no unit)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    torch.manual_seed(0)
    model = hm.Stack()
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, hm.Block))
    calls = [("blocks.0._checkpoint_wrapped_module",), ("blocks.0",), ("blocks.1",)]
    real = record_real_fsdp2(model, _x(), calls, fake_pg)
    predicted = fsdpviz.analyze(model, _x(), fully_shard=calls, world_size=fake_pg)
    names = ["", "blocks.0._checkpoint_wrapped_module", "blocks.1"]  # blocks.0 holds none
    assert [u.module for u in predicted.units] == [u.module for u in real.units] == names
    assert predicted.forward_order == real.forward_order
    for p_it, r_it in zip(predicted.iterations, real.iterations, strict=False):
        assert [e.to_dict() for e in p_it] == [e.to_dict() for e in r_it]


def test_a_checkpoint_wrapped_models_parameters_are_named_alike(fake_pg: int) -> None:
    """The model of the test above: each unit lists its parameters under one name, without
    the wrapper's segment (``blocks.0.ln.weight``, as the state dict keys it), in the plan,
    the plan once sharded and the recording alike, and the detail panel (its rows and the
    explorer's data) names them so, the plan's rows with their shapes and first use; its
    units are those of the same model planned without the wrappers, byte for byte."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    from fsdpviz.views.detail import param_rows
    from fsdpviz.views.explorer import explorer_details
    from fsdpviz.views.tree import module_tree

    torch.manual_seed(0)
    model = hm.Stack()
    plain = copy.deepcopy(model)
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, hm.Block))
    calls = [(f"blocks.{i}._checkpoint_wrapped_module",) for i in range(3)] + [("blocks.3",)]
    applied: list[fsdpviz.Report] = []
    real = record_real_fsdp2(
        model, _x(), calls, fake_pg, after=lambda m: applied.append(fsdpviz.analyze(m, _x()))
    )
    predicted = fsdpviz.analyze(model, _x(), fully_shard=calls, world_size=fake_pg)
    names = [u.params for u in real.units]
    assert names[1][:3] == ["blocks.0.ln.weight", "blocks.0.ln.bias", "blocks.0.fc1.weight"]
    assert [u.params for u in predicted.units] == [u.params for u in applied[0].units] == names
    rows = param_rows(predicted, "blocks.0")
    assert [r[0] for r in rows] == [r[0] for r in param_rows(real, "blocks.0")] == names[1]
    assert rows[2][:5] == ["blocks.0.fc1.weight", "32×16", "512", "2 KiB",
                           "blocks.0._checkpoint_wrapped_module.fc1"]  # fmt: skip
    panel = explorer_details(predicted, module_tree(predicted), ["blocks.0"])[1]
    assert panel is not None
    table = next(s for s in panel["sections"] if s["title"] == "Parameters")
    assert [r[0] for r in table["rows"]] == names[1]  # type: ignore[typeddict-item]
    unwrapped = fsdpviz.analyze(plain, _x(), fully_shard=BLOCKS, world_size=fake_pg)
    no_class = [{**u.to_dict(), "module_class": ""} for u in unwrapped.units]
    assert [{**u.to_dict(), "module_class": ""} for u in predicted.units] == no_class


class _TiedBlock(nn.Module):
    """Two linears sharing one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_a_shared_parameter_inside_a_checkpoint_wrapper_is_named_alike(fake_pg: int) -> None:
    """A weight two linears of a checkpoint-wrapped block share: the plan and the recording
    name it and its other name without the wrapper's segment, and the module tree counts
    it once, as for the block unwrapped."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from fsdpviz.views.tree import module_tree

    torch.manual_seed(0)
    plain = nn.Sequential(_TiedBlock(), _TiedBlock())
    model = nn.Sequential(*(checkpoint_wrapper(copy.deepcopy(b)) for b in plain))
    calls = [("0._checkpoint_wrapped_module",), ("1._checkpoint_wrapped_module",)]
    real = record_real_fsdp2(model, _x(), calls, fake_pg)
    predicted = fsdpviz.analyze(model, _x(), fully_shard=calls, world_size=fake_pg)
    shared = {"0.b.weight": "0.a.weight"}
    assert predicted.unit("0").shared_params == real.unit("0").shared_params == shared
    assert predicted.unit("0").params == real.unit("0").params == ["0.a.weight", "0.a.bias",
                                                                   "0.b.bias"]  # fmt: skip
    unwrapped = fsdpviz.analyze(plain, _x(), fully_shard=[("0",), ("1",)], world_size=fake_pg)
    counted = [module_tree(r).by_fqn["0"].numel_total for r in (predicted, unwrapped)]
    assert counted == [80, 80]  # 64 + 8 + 8: the shared weight once
