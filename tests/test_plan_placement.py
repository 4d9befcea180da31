"""FSDP2's ``shard_placement_fn``: each parameter sharded on the dim its call's function returns.

The sizes are checked against the ``FSDPParam`` of real ``fully_shard`` (fake process group,
a meta model); the forms the option takes, what ``fully_shard`` refuses, a replay and a
stored trace against a fresh ``analyze``, and the extra copies the time model charges.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from handwritten_models import Block, Stack
from torch import nn
from torch.distributed.tensor import Replicate, Shard

import fsdpviz
from fsdpviz.cost import timeline
from fsdpviz.cost.hardware import machine
from fsdpviz.cost.sizes import placed_bytes
from fsdpviz.plan.fsdp2_shards import shard_shape, sharded_numel
from fsdpviz.replan import replay
from fsdpviz.replan.stored_fsdp2 import StoredTrace

BLOCKS = [f"blocks.{i}" for i in range(4)]


def _on_dim_1(p: nn.Parameter) -> Any:
    return Shard(1) if p.ndim == 2 else None


def _stack() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Stack(), torch.randn(4, 8)


def _analyze(fn: Any, **kwargs: Any) -> fsdpviz.Report:
    model, x = _stack()
    return fsdpviz.analyze(model, x, fully_shard=BLOCKS, shard_placement_fn=fn, **kwargs)


@pytest.mark.parametrize(
    ("shape", "ws", "dim", "shard"),
    [
        ([6, 8], 4, 0, [2, 8]),  # ranks 0-2 hold rows, rank 3 only padding
        ([6, 8], 4, 1, [6, 2]),
        ([3], 4, 0, [1]),  # fewer rows than ranks: one padded row each
        ([0, 5], 4, 0, [0, 5]),  # an empty parameter: empty shards
        ([2, 12, 5], 4, 1, [2, 3, 5]),
        ([7, 4], 1, 1, [7, 4]),
    ],
)
def test_shard_shape(shape: list[int], ws: int, dim: int, shard: list[int]) -> None:
    assert shard_shape(shape, ws, dim) == shard
    assert sharded_numel(shape, ws, dim) == torch.Size(shard).numel()
    # torch's own chunking: the first chunk (the largest) is every rank's padded shard
    chunks = torch.empty(shape, device="meta").chunk(ws, dim=dim) if shape[dim] else []
    if chunks:
        assert list(chunks[0].shape) == shard


def test_units_equal_real_fully_shard(fake_pg: int) -> None:
    """A meta model with ``fully_shard`` applied (fake process group, 4 ranks): each unit's
    sizes, shard shapes and dims read from FSDP2's own state equal the prediction's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = Stack()
    predicted = fsdpviz.analyze(
        model, torch.randn(4, 8), fully_shard=BLOCKS, world_size=fake_pg,
        shard_placement_fn=_on_dim_1,
    )  # fmt: skip
    mesh = init_device_mesh("cpu", (fake_pg,))
    for name in BLOCKS:
        fully_shard(model.get_submodule(name), mesh=mesh, shard_placement_fn=_on_dim_1)
    fully_shard(model, mesh=mesh, shard_placement_fn=_on_dim_1)
    states = {m: m._get_fsdp_state() for m in model.modules() if hasattr(m, "_get_fsdp_state")}
    for unit in predicted.units:
        group = states[model.get_submodule(unit.module)]._fsdp_param_group
        params = group.fsdp_params
        assert unit.sharded_numel == sum(fp.padded_sharded_param_size.numel() for fp in params)
        assert unit.shard_shapes == {
            f: list(fp.padded_sharded_param_size) for f, fp in zip(unit.params, params, strict=True)
        }
        assert unit.shard_dims == {
            f: fp.fsdp_placement.dim
            for f, fp in zip(unit.params, params, strict=True)
            if fp.fsdp_placement.dim
        }
    assert predicted.unit("").shard_shapes["head.bias"] == [1]  # 3 elements on 4 ranks: padded
    read = fsdpviz.analyze(model, torch.randn(4, 8))  # the plan read from FSDP2's state
    assert [u.to_dict() for u in read.units] == [u.to_dict() for u in predicted.units]


def test_called_on_the_users_parameters_once_each() -> None:
    model, x = _stack()
    seen: list[nn.Parameter] = []

    def fn(p: nn.Parameter) -> Any:
        seen.append(p)
        return Shard(1) if p is model.blocks[2].fc1.weight else None

    report = fsdpviz.analyze(model, x, fully_shard=BLOCKS, shard_placement_fn=fn)
    params = list(model.parameters())
    assert len(seen) == len(params) and all(any(p is q for q in params) for p in seen)
    assert {f: d for u in report.units for f, d in u.shard_dims.items()} == {
        "blocks.2.fc1.weight": 1
    }


def test_mapping_by_module() -> None:
    """``{module FQN: function}``: the calls it names (a grouped call by any of its modules),
    the others on dim 0; a key that is no call's module is refused."""
    model, x = _stack()
    calls = ["blocks.0", "blocks.1", ("blocks.2", "blocks.3")]
    report = fsdpviz.analyze(
        model,
        x,
        fully_shard=calls,
        shard_placement_fn={"blocks.1": _on_dim_1, "blocks.3": _on_dim_1},
    )
    dims = {u.module: sorted(u.shard_dims) for u in report.units}
    assert dims["blocks.0"] == [] and dims[""] == []
    assert dims["blocks.1"] == ["blocks.1.fc1.weight", "blocks.1.fc2.weight"]
    assert len(dims["blocks.2, blocks.3"]) == 4
    with pytest.raises(fsdpviz.ConfigError, match=r"'blocks\.9' is not a module fully_shard"):
        fsdpviz.analyze(model, x, fully_shard=calls, shard_placement_fn={"blocks.9": _on_dim_1})
    with pytest.raises(fsdpviz.ConfigError, match="shard_placement_fn must be fully_shard's"):
        fsdpviz.analyze(model, x, fully_shard=calls, shard_placement_fn=Shard(1))


@pytest.mark.parametrize(
    ("fn", "error", "match"),
    [
        (
            lambda p: Shard(2) if p.ndim == 2 else None,
            fsdpviz.FSDPConfigError,
            r"of 'blocks.0' returned Shard\(2\) for 'blocks.0.fc1.weight'.*from -2 to 1",
        ),
        (lambda p: Shard(-3), fsdpviz.FSDPConfigError, r"Shard\(-3\).*negative dims count"),
        (lambda p: Shard(1), fsdpviz.FSDPConfigError, r"'blocks.0.ln.weight', a 1-D parameter"),
        (lambda p: Replicate(), fsdpviz.FSDPConfigError, r"returned Replicate\(\).*Shard\(dim\)"),
        (lambda p: 1, fsdpviz.FSDPConfigError, "Invalid shard_placement_fn result"),
        (lambda p: p.missing, fsdpviz.ConfigError, "raised AttributeError for parameter"),
    ],
)
def test_refused_as_fully_shard_refuses(fn: Any, error: type, match: str) -> None:
    model, x = _stack()
    before = {n: (p.shape, p.requires_grad) for n, p in model.named_parameters()}
    data = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(error, match=match):
        fsdpviz.analyze(model, x, fully_shard=BLOCKS, shard_placement_fn=fn)
    assert {n: (p.shape, p.requires_grad) for n, p in model.named_parameters()} == before
    assert all(torch.equal(a, b) for a, b in zip(data, model.parameters(), strict=True))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_uneven_dims_and_post_forward_meshes_refused() -> None:
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"uneven sharding on dim 1.*Shard it"):
        _analyze(_on_dim_1, world_size=3)  # 8 and 16 columns over 3 ranks
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"reshard_after_forward=2 .*IndexError"):
        _analyze(_on_dim_1, world_size=4, reshard_after_forward=2)
    # resharding to the whole shard group is True's
    _analyze(_on_dim_1, world_size=4, reshard_after_forward=4)


def test_replay_equals_analyze() -> None:
    base = _analyze(_on_dim_1, world_size=4)
    for ws, raf in itertools.product([2, 8], [True, False, {"blocks.1": False}]):
        fresh = _analyze(_on_dim_1, world_size=ws, reshard_after_forward=raf)
        replayed = replay(base, world_size=ws, reshard_after_forward=raf)
        assert [u.to_dict() for u in replayed.units] == [u.to_dict() for u in fresh.units]
        assert replayed.iterations == fresh.iterations
        assert replayed.memory.to_dict()["peak"] == fresh.memory.to_dict()["peak"]
        assert replayed.timeline.totals == fresh.timeline.totals
    with pytest.raises(fsdpviz.FSDPConfigError, match="uneven sharding on dim 1"):
        replay(base, world_size=3)


def test_stored_trace_equals_analyze() -> None:
    model, x = _stack()
    stored = StoredTrace(model, x)

    def fn(p: nn.Parameter) -> Any:  # asked of the user's parameters
        return Shard(1) if p is model.blocks[1].fc1.weight or p is model.head.weight else None

    for calls in [BLOCKS, [Block], []]:
        kw = {"fully_shard": calls, "world_size": 4, "shard_placement_fn": fn}
        planned = stored.plan(**kw)
        assert planned is not None
        fresh = fsdpviz.analyze(model, x, **kw)
        assert [u.to_dict() for u in planned.units] == [u.to_dict() for u in fresh.units]
        assert planned.iterations == fresh.iterations
        assert any(u.shard_dims for u in planned.units)


def _even(p: nn.Parameter) -> Any:
    """Dim 1 for the 2-D weights whose dim 0 the 4 ranks divide too: the same shard sizes as
    on dim 0, so only the copies differ."""
    return Shard(1) if p.ndim == 2 and p.shape[0] % 4 == 0 else None


def test_time_model_charges_the_extra_copies() -> None:
    """The copy-out of a unit with parameters on dim 1 copies them once more (torch.cat of the
    temporary), and its reduction rebuilds their gradients before the copy-in: each a
    memory-bound pass over their bytes, read and written, on the compute stream; the
    reduce-scatter itself takes as long as without them."""
    placed, plain = _analyze(_even, world_size=4), _analyze(None, world_size=4)
    assert [u.sharded_numel for u in placed.units] == [u.sharded_numel for u in plain.units]
    m = machine("H100")
    a, b = timeline(placed, m), timeline(plain, m)
    extra = {u.module: sum(placed_bytes(u).values()) for u in placed.units}
    assert extra["blocks.0"] == (32 * 16 + 16 * 32) * 4
    gathers = [e for e in placed.iterations[-1] if e.kind == "all_gather"]
    scatters = [e for e in placed.iterations[-1] if e.kind == "reduce_scatter"]
    copies = sum(m.memory_seconds(2 * extra[e.unit]) for e in gathers + scatters)
    assert a.totals["copy_s"] - b.totals["copy_s"] == pytest.approx(copies, rel=1e-9)
    for ra, rb in zip(a.records(), b.records(), strict=True):
        if ra["kind"] == "reduce_scatter":
            assert ra["end"] - ra["start"] == pytest.approx(rb["end"] - rb["start"])
