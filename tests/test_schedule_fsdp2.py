"""FSDP2 planning: recipe forms, reading an already-sharded model, options, compare()."""

from __future__ import annotations

from typing import Any

import handwritten_models as hm
import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz

BLOCKS = [f"blocks.{i}" for i in range(4)]


def _x() -> torch.Tensor:
    return torch.randn(4, 8)


@pytest.mark.parametrize(
    "spec",
    [
        [hm.Block],
        BLOCKS,
        lambda name, module: isinstance(module, hm.Block),
        [lambda name, module: name.startswith("blocks.") and name.count(".") == 1],
    ],
    ids=["class", "fqns", "callable", "callable_in_list"],
)
def test_recipe_forms_agree(spec: Any) -> None:
    report = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=spec, world_size=4)
    assert [u.module for u in report.units] == ["", *BLOCKS]
    assert report.forward_order == ["", *BLOCKS]
    assert report.units[0].params == ["inp.weight", "inp.bias", "head.weight", "head.bias"]


def test_grouped_call_name_and_sizes() -> None:
    report = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[*BLOCKS, ("head", "inp")], world_size=3)
    assert [u.module for u in report.units] == ["inp, head", *BLOCKS]  # no root group: no params
    group = report.unit("inp, head")
    # dim-0 sharding, each parameter padded on its own: inp.weight 16x8 -> 6 rows per rank
    assert group.sharded_numel == 6 * 8 + 6 + 1 * 16 + 1
    assert group.padded_numel == group.sharded_numel * 3


def test_default_reshard_after_forward_root_false() -> None:
    report = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=BLOCKS)
    assert report.config["reshard_after_forward"] == {"": False, **{b: True for b in BLOCKS}}
    forward_frees = {
        e.unit for e in report.iterations[1] if e.kind == "free" and e.phase == "forward"
    }
    assert forward_frees == set(BLOCKS)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        (
            {"fully_shard": ["blocks.9"]},
            fsdpviz.ConfigError,
            r"no module named 'blocks\.9' in the model; did you mean 'blocks\.\d'",
        ),
        (
            {"fully_shard": [torch.nn.Conv2d]},
            fsdpviz.ConfigError,
            "no module of class Conv2d",
        ),
        ({"fully_shard": [3]}, fsdpviz.ConfigError, "module classes, FQNs, tuples"),
        (
            {"fully_shard": BLOCKS, "mesh": "2x4"},
            fsdpviz.ConfigError,
            "mesh must be a DeviceMesh",
        ),
        (
            {"fully_shard": BLOCKS, "reshard_after_forward": 3},
            fsdpviz.FSDPConfigError,
            "factor of 8",
        ),
        (
            {"fully_shard": BLOCKS, "forward_prefetch": {"blocks.0": ["inp"]}},
            fsdpviz.ConfigError,
            "'inp' is not a module fully_shard is applied to",
        ),
        (
            {"fully_shard": BLOCKS, "forward_prefetch": ["blocks.1"]},
            fsdpviz.ConfigError,
            "set_modules_to_forward_prefetch",
        ),
        (
            {"fully_shard": BLOCKS, "mp_policy": torch.bfloat16},
            fsdpviz.ConfigError,
            "MixedPrecisionPolicy",
        ),
        (
            {"fully_shard": BLOCKS, "reshard_after_froward": True},
            fsdpviz.ConfigError,
            "did you mean 'reshard_after_forward'",
        ),
    ],
)
def test_bad_fsdp2_options(kwargs: dict[str, Any], error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        fsdpviz.analyze(hm.Stack(), _x(), **kwargs)


def test_offload_policy_must_be_fsdp2s() -> None:
    from torch.distributed.fsdp import CPUOffload

    with pytest.raises(fsdpviz.ConfigError, match=r"CPUOffloadPolicy\(\) or OffloadPolicy\(\)"):
        fsdpviz.analyze(hm.Stack(), _x(), fully_shard=BLOCKS, offload_policy=CPUOffload())


def test_model_already_fully_sharded_on_meta(fake_pg: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh("cpu", (fake_pg,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with torch.device("meta"):
        model = hm.Stack()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=2)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.blocks[0].set_modules_to_backward_prefetch([model.blocks[2]])
    classes = [type(m) for m in model.modules()]
    read = fsdpviz.analyze(model, torch.randn(4, 8, device="meta"))
    recipe = fsdpviz.analyze(
        hm.Stack(),
        _x(),
        fully_shard=BLOCKS,
        world_size=fake_pg,
        mp_policy=mp,
        reshard_after_forward={b: 2 for b in BLOCKS},
        backward_prefetch={"blocks.0": ["blocks.2"]},
    )
    assert read.to_dict()["iterations"] == recipe.to_dict()["iterations"]
    assert [u.to_dict() for u in read.units] == [u.to_dict() for u in recipe.units]
    assert read.config == recipe.config
    # the user's model keeps its FSDP2 classes, sharded parameters and hooks
    assert [type(m) for m in model.modules()] == classes
    assert isinstance(model.blocks[0], FSDPModule)
    assert all(type(p).__name__ == "DTensor" for p in model.parameters())
    with pytest.raises(fsdpviz.ConfigError, match="already has fully_shard applied"):
        fsdpviz.analyze(model, torch.randn(4, 8, device="meta"), world_size=8)


def _sharded_on_meta(mesh: Any, **kwargs: Any) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = hm.Stack()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


@pytest.mark.parametrize("shape", [(2, 2), (1, 4)], ids=["2x2", "one_replica"])
def test_model_already_fully_sharded_on_an_hsdp_mesh_with_offload(
    fake_pg: int, shape: tuple[int, int]
) -> None:
    """A model ``fully_shard`` was applied to on a 2-D (HSDP) mesh with
    ``CPUOffloadPolicy``: read as the recipe plans it, the all-reduce across the replicas
    and the host-memory shards included (before: a 2-rank 1-D mesh without either). A
    replicate dimension of one rank is HSDP all the same (``HSDPMeshInfo``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy

    names = ("dp_replicate", "dp_shard")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    offload = CPUOffloadPolicy(pin_memory=False)
    model = _sharded_on_meta(mesh, offload_policy=offload)
    read = fsdpviz.analyze(model, torch.randn(4, 8, device="meta"))
    recipe = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=BLOCKS, offload_policy=offload,
                             mesh=("dp_replicate", shape[0], "dp_shard", shape[1]))  # fmt: skip
    assert read.config == recipe.config
    assert read.config.world_size == 4 and read.config.cpu_offload
    assert [u.to_dict() for u in read.units] == [u.to_dict() for u in recipe.units]
    assert read.to_dict()["iterations"] == recipe.to_dict()["iterations"]
    assert any(e.kind == "all_reduce" for e in read.iterations[1])


@pytest.mark.parametrize(
    ("setter", "said"),
    [
        (lambda m: m.set_reduce_scatter_unused_params(True), "set_reduce_scatter_unused_params"),
        (lambda m: m.set_reduce_scatter_max_input_buffers(2), "max_input_buffers"),
        (lambda m: m.set_requires_gradient_sync(False), "set_requires_gradient_sync"),
        (lambda m: m.set_reshard_after_backward(False), "set_reshard_after_backward"),
    ],
    ids=["unused_params", "input_buffers", "gradient_sync", "after_bwd"],
)
def test_fully_sharded_model_with_unmodelled_settings_is_refused(
    fake_pg: int, setter: Any, said: str
) -> None:
    """FSDPModule's setters that change what FSDP2 does and that fsdpviz does not model:
    a clear error naming the setter and the group, not the plan of the defaults."""
    from torch.distributed.device_mesh import init_device_mesh

    model = _sharded_on_meta(init_device_mesh("cpu", (fake_pg,)))
    setter(model)
    with pytest.raises(fsdpviz.ConfigError, match=f"{said}.*does not model"):
        fsdpviz.analyze(model, torch.randn(4, 8, device="meta"))


@pytest.mark.parametrize("precision", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_fully_sharded_model_not_unsharded_in_backward_reads_as_the_keyword(
    fake_pg: int, precision: torch.dtype | None
) -> None:
    """A model ``fully_shard`` was applied to, its embedding's
    ``set_unshard_in_backward(False)`` called: read from FSDP2's state, the same report as
    ``unshard_in_backward={"embed_tokens": False}`` plans (before: refused as not modelled)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fsdpviz.examples import DecoderLayer, ExampleConfig, ExampleModel

    config = ExampleConfig(hidden_size=32, intermediate_size=64, num_layers=2, vocab_size=50)
    mp = MixedPrecisionPolicy(param_dtype=precision, reduce_dtype=torch.float32)
    mesh = init_device_mesh("cpu", (fake_pg,))
    with torch.device("meta"):
        applied, planned = ExampleModel(config), ExampleModel(config)
    for module in [applied.embed_tokens, *applied.layers, applied]:
        fully_shard(module, mesh=mesh, mp_policy=mp)
    applied.embed_tokens.set_unshard_in_backward(False)  # type: ignore[operator]
    ids = torch.randint(0, 50, (2, 8))
    read = fsdpviz.analyze(applied, {"input_ids": ids}, grad_accum=2)
    recipe = fsdpviz.analyze(
        planned, {"input_ids": ids}, fully_shard=["embed_tokens", DecoderLayer], mp_policy=mp,
        world_size=fake_pg, unshard_in_backward={"embed_tokens": False}, grad_accum=2,
    )  # fmt: skip
    assert read.config == recipe.config
    assert read.config.unshard_in_backward == {"embed_tokens": False}
    assert read.to_dict()["iterations"] == recipe.to_dict()["iterations"]
    assert read.memory.to_dict() == recipe.memory.to_dict()
    gathered = {(e.unit, e.phase) for it in read.iterations for e in it if e.kind == "all_gather"}
    assert ("embed_tokens", "forward") in gathered and ("embed_tokens", "backward") not in gathered
    assert ("layers.0", "backward") in gathered
    reduced = [e.unit for e in read.iterations[-1] if e.kind == "reduce_scatter"]
    assert "embed_tokens" in reduced  # its gradient, made from the indices, reduced all the same


def _linear_stack(mesh: Any) -> torch.nn.Module:
    """A stack of linears and ReLUs, each linear its own ``fully_shard`` call, then the root."""
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    for i in (0, 2):
        fully_shard(model[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def test_not_unsharding_in_backward_a_group_backward_reads_fails_as_in_torch(fake_pg: int) -> None:
    """``set_unshard_in_backward(False)`` on a linear after another: its backward multiplies
    by its weight (its input's gradient), freed after forward and not gathered: torch fails
    in backward, and fsdpviz refuses it, named, by the keyword and on the applied model
    alike. The first linear's backward needs no weight (its input needs no gradient): torch
    and fsdpviz both let that one be."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (fake_pg,))
    real = _linear_stack(mesh)
    real[0].set_unshard_in_backward(False)  # type: ignore[operator]
    real(torch.randn(4, 8)).sum().backward()
    real = _linear_stack(mesh)
    real[0].set_unshard_in_backward(False)  # type: ignore[operator]
    real[2].set_unshard_in_backward(False)  # type: ignore[operator]
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 0"):
        real(torch.randn(4, 8)).sum().backward()
    x = torch.randn(4, 8, device="meta")
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    kw: dict[str, Any] = {"fully_shard": ["0", "2"], "world_size": fake_pg}
    fsdpviz.analyze(model, x, unshard_in_backward={"0": False}, **kw)
    said = "unshard_in_backward=False for '2', whose backward reads its parameters"
    with pytest.raises(fsdpviz.FSDPConfigError, match=said):
        fsdpviz.analyze(model, x, unshard_in_backward=False, **kw)
    with torch.device("meta"):
        applied = _linear_stack(mesh)
    applied[2].set_unshard_in_backward(False)  # type: ignore[operator]
    with pytest.raises(fsdpviz.FSDPConfigError, match=said):
        fsdpviz.analyze(applied, x)
    # kept unsharded after forward, its backward reads the parameters it never freed
    fsdpviz.analyze(model, x, unshard_in_backward=False, reshard_after_forward=False, **kw)


def test_compare_fsdp1_policy_with_fsdp2_recipe() -> None:
    fsdp1 = fsdpviz.analyze(
        hm.Stack(), _x(), auto_wrap_policy=ModuleWrapPolicy({hm.Block}), world_size=3
    )
    fsdp2 = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[hm.Block], world_size=3)
    cmp = fsdpviz.compare(fsdp1, fsdp2)
    assert cmp.same_wrapping
    assert [(p.a, p.b) for p in cmp.pairs] == [(u, u) for u in ["", *BLOCKS]]
    # FSDP2 pads each parameter's dim 0, FSDP1 pads one flat parameter: 397 vs 368 numel
    assert "bytes per rank" in cmp.pairs[1].differs
    assert (cmp.pairs[1].sharded_bytes_a, cmp.pairs[1].sharded_bytes_b) == (368 * 4, 397 * 4)
    # FSDP1 does not free the root after forward; FSDP2 keeps the root by default too
    assert cmp.pairs[0].events_a["all_gather"] == cmp.pairs[0].events_b["all_gather"] == 1
    assert "FSDP1 prediction" in cmp.summary() and "same wrapping" in cmp.summary()
    assert cmp.pairs[1].bytes_note == (
        "sharded over 3 ranks; padding 0 vs 87 elements: FSDP1 pads its flat parameter to a "
        "multiple of the shard ranks; FSDP2 pads dim 0 of each parameter to a multiple of the "
        "shard ranks"
    )
    import json

    json.dumps(cmp.to_dict())


def test_compare_says_when_only_bytes_per_rank_differ() -> None:
    a = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[hm.Block], world_size=3)
    b = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[hm.Block], world_size=5)
    cmp = fsdpviz.compare(a, b)
    assert cmp.same_wrapping and not cmp.identical
    assert cmp.verdict == "same wrapping and schedule, different bytes per rank"
    assert cmp.summary().splitlines()[0].endswith(cmp.verdict)
    assert {tuple(p.differs) for p in cmp.pairs} == {("bytes per rank",)}
    assert "(sharded over 3 vs 5 ranks; padding 87 vs 191 elements: FSDP2 pads dim 0" in (
        cmp.summary()
    )
    assert cmp.to_dict()["verdict"] == cmp.verdict


def test_compare_two_recipes_lists_moved_parameters() -> None:
    a = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=BLOCKS)
    b = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[*BLOCKS, ("inp", "head")])
    cmp = fsdpviz.compare(a, b, names=("per-block", "grouped head"))
    # same parameter sets under other names: the root's group is now "inp, head",
    # which is resharded after forward (the root is not), so its events differ
    assert cmp.same_wrapping and cmp.moved_params == {}
    assert (cmp.pairs[0].a, cmp.pairs[0].b) == ("", "inp, head")
    assert cmp.pairs[0].differs == ["events"]
    assert cmp.pairs[0].events_b["all_gather"] == cmp.pairs[0].events_a["all_gather"] + 1
    c = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[*BLOCKS[:2], ("blocks.2", "blocks.3")])
    cmp = fsdpviz.compare(a, c)
    assert cmp.moved_params["blocks.2.fc1.weight"] == ("blocks.2", "blocks.2, blocks.3")
    assert not cmp.same_wrapping
    assert any(p.a == "blocks.3" and p.b is None for p in cmp.pairs)


def test_backward_prefetch_difference_is_reported() -> None:
    a = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=ModuleWrapPolicy({hm.Block}))
    b = fsdpviz.analyze(
        hm.Stack(), _x(), auto_wrap_policy=ModuleWrapPolicy({hm.Block}), backward_prefetch=None
    )
    cmp = fsdpviz.compare(a, b)
    assert cmp.same_wrapping and not cmp.identical
    assert any("backward prefetch" in p.differs for p in cmp.pairs)


def test_compare_keeps_parameters_that_stay_in_the_root() -> None:
    """The root gains the blocks' parameters; what it held before has not moved."""
    model = hm.Stack()
    wrapped = fsdpviz.analyze(model, torch.randn(4, 8), fully_shard=[hm.Block])
    root_only = fsdpviz.analyze(model, torch.randn(4, 8), fully_shard=[])
    cmp = fsdpviz.compare(wrapped, root_only)
    assert "inp.weight" not in cmp.moved_params
    assert cmp.moved_params["blocks.0.fc1.weight"] == ("blocks.0", "")
