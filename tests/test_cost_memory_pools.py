"""The reserved estimate's pools, one per stream that allocates, as torch's FSDP allocates on
them (see [Note: stream pools] in ``fsdpviz/cost/memory_pools.py``): what
``report.memory.reserved`` says of a small model whose buffers are whole MiB."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost import machine, memory_model
from fsdpviz.schema.memory import CATEGORIES

MIB = 2**20


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(1024, 4096, bias=False)
        self.down = nn.Linear(4096, 1024, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(x)))
        return out


class _Lm(nn.Module):
    """An embedding and an output layer of 64 MiB (float32), four blocks of 32 MiB."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16384, 1024)
        self.blocks = nn.ModuleList(_Block() for _ in range(4))
        self.out = nn.Linear(1024, 16384, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        out: torch.Tensor = self.out(x)
        return out


IDS = torch.zeros(1, 64, dtype=torch.long)
BF16 = torch.bfloat16


def _plan(api: str, world_size: int = 2, **kw: object) -> fsdpviz.Report:
    wrap: dict[str, object] = (
        {"fully_shard": [_Block, nn.Embedding]}
        if api == "FSDP2"
        else {"auto_wrap_policy": ModuleWrapPolicy({_Block, nn.Embedding})}
    )
    return fsdpviz.analyze(_Lm(), IDS, world_size=world_size, progress=False, **wrap, **kw)


def _most(mem: fsdpviz.MemoryReport, *categories: str, less: tuple[str, ...] = ()) -> int:
    """The most any moment holds of ``categories`` (all of them when none is named) less
    ``less``, rounded up to the allocator's 2 MiB blocks."""
    names = categories or CATEGORIES
    most = 0
    for m in mem.moments:
        b = dict(zip(CATEGORIES, m.bytes, strict=True))
        most = max(most, sum(b[c] for c in names) - sum(b[c] for c in less))
    return -(-most // (2 * MIB)) * 2 * MIB


def test_reserved_memory_sums_each_streams_own_peak() -> None:
    from fsdpviz.cost.memory_pools import reserved_estimate
    from fsdpviz.schema.memory import POOLS, Moment

    def moment(**pools: int) -> Moment:
        row = tuple(pools.get(p, 0) for p in POOLS)
        return Moment("event", 0, 0, 0, "", (sum(row), *(0,) * (len(CATEGORIES) - 1)), row)

    # the all-gather buffer peaks while the compute stream holds little, and the other way
    # round: one pool per stream keeps both (3 MiB rounds up to 4 MiB blocks); a pool that
    # never holds a byte is named only if it is one of the three every plan has
    moments = [
        moment(all_gather=3 * MIB, compute=10 * MIB),
        moment(compute=20 * MIB, reduce_scatter=2 * MIB),
    ]
    est = reserved_estimate(moments)
    assert est["pools"] == {"compute": 20 * MIB, "all_gather": 4 * MIB, "reduce_scatter": 2 * MIB}
    assert est["bytes"] == 26 * MIB
    est = reserved_estimate([*moments, moment(all_reduce=MIB)])
    assert est["pools"]["all_reduce"] == 2 * MIB and est["bytes"] == 28 * MIB


def test_fsdp2_gradient_shards_are_the_reduce_scatter_streams() -> None:
    """``foreach_reduce`` allocates the reduce-scatter input on the compute stream and the
    output on the reduce-scatter stream; the gradient shards are views of the output, alive
    to the end of the backward: that pool holds every shard (float32: 32 MiB for the root's
    output layer and the embedding each, 16 MiB per block), the compute pool the inputs."""
    report = _plan("FSDP2")
    shards = sum(u.sharded_numel * 4 for u in report.units)
    assert shards == 128 * MIB
    for name in ("h100", "mi300x"):  # each shard a segment the next iteration's reuses
        mem = memory_model(report, machine=name)
        pools = mem.reserved["pools"]
        assert pools["reduce_scatter"] == shards, name
        assert pools["compute"] == _most(mem, less=("all_gather", "sharded_grads"))
        assert mem.reserved["bytes"] == sum(pools.values())
        assert set(pools) == {"compute", "all_gather", "reduce_scatter"}
    assert _most(mem, "reduce_scatter") >= 64 * MIB  # the embedding's input, on compute


def test_fsdp1_flat_parameters_and_gradient_shards_are_fsdps_streams() -> None:
    """FSDP1's ``_unshard`` allocates the unsharded FlatParameter on the unshard stream, in
    use until it is freed; ``_post_backward_hook`` reduces on the post-backward stream,
    whose output is ``_saved_grad_shard``, the gradient the optimizer steps with."""
    report = _plan("FSDP1")
    mem = report.memory
    pools = mem.reserved["pools"]
    assert pools["all_gather"] == _most(mem, "unsharded_params", "all_gather") == 160 * MIB
    assert pools["reduce_scatter"] == sum(u.sharded_numel * 4 for u in report.units) == 128 * MIB
    rest = ("unsharded_params", "all_gather", "sharded_grads")
    assert pools["compute"] == _most(mem, less=rest)
    assert mem.reserved["bytes"] == sum(pools.values())


def test_fsdp1_mixed_precision_casts_the_shard_on_the_pre_unshard_stream() -> None:
    """``pre_unshard`` (the pre-unshard stream) makes the bfloat16 shard each all-gather
    sends, 16 MiB at most (the root's and the embedding's: 8M elements on a rank); the
    post-backward stream holds the float32 gradient shards (128 MiB), and, beside them,
    the last reduction's bfloat16 output while it is cast (the embedding's: 16 MiB)."""
    mp = MixedPrecision(param_dtype=BF16, reduce_dtype=BF16)
    mem = _plan("FSDP1", mixed_precision=mp).memory
    pools = mem.reserved["pools"]
    assert pools["pre_unshard"] == 16 * MIB
    assert pools["reduce_scatter"] == 144 * MIB
    assert mem.reserved["bytes"] == sum(pools.values())


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_hybrid_sharding_casts_the_gradient_shard_on_the_all_reduce_stream(api: str) -> None:
    """Reducing in bfloat16 under hybrid sharding, the float32 gradient shard is made on the
    all-reduce stream (FSDP2's ``post_reduce_stream``; FSDP1's ``_accumulate_sharded_grad``
    inside ``state._all_reduce_stream``): 128 MiB over two shard ranks. FSDP2 holds each
    group's bfloat16 all-reduced buffer on the reduce-scatter stream to the end of the
    backward (64 MiB); FSDP1's post-backward stream keeps only each reduction's own
    buffers (the root's and the embedding's bfloat16 output, 16 MiB)."""
    if api == "FSDP2":
        mp: dict[str, object] = {
            "mesh": (2, 2),
            "mp_policy": MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=BF16),
        }
    else:
        mp = {
            "sharding_strategy": ShardingStrategy.HYBRID_SHARD,
            "shard_group_size": 2,
            "mixed_precision": MixedPrecision(param_dtype=BF16, reduce_dtype=BF16),
        }
    report = _plan(api, world_size=4, **mp)
    pools = report.memory.reserved["pools"]
    shards = sum(u.sharded_numel * 4 for u in report.units)
    assert pools["all_reduce"] == shards
    assert pools["reduce_scatter"] == (64 * MIB if api == "FSDP2" else shards // 8)


def test_reserved_memory_without_expandable_segments_replays_fixed_segments() -> None:
    """Without expandable segments each ``cudaMalloc`` is a segment only its stream's later
    requests can split. FSDP1's unshard stream: the embedding's 64 MiB FlatParameter is
    freed after forward and its segment split by the blocks' 32 MiB ones, so backward's
    finds no 64 MiB free and takes a third segment of 64 MiB (160 MiB at most are alive)."""
    report = _plan("FSDP1")
    grown = memory_model(report, machine="h100")
    fixed = memory_model(report, machine="mi300x")
    assert machine("mi300x").expandable_segments is False
    assert machine("h100", expandable_segments=False).expandable_segments is False
    assert grown.reserved["pools"]["all_gather"] == 160 * MIB
    assert fixed.reserved["pools"]["all_gather"] == 192 * MIB
    assert fixed.reserved["pools"]["compute"] == grown.reserved["pools"]["compute"]
    assert fixed.reserved["bytes"] == grown.reserved["bytes"] + 32 * MIB
    assert fixed.peak == grown.peak
    assert any("does not use expandable segments" in n for n in fixed.notes)
    assert not any("expandable segments" in n for n in grown.notes)
    same = memory_model(report, machine=machine("h100", expandable_segments=False))
    assert same.reserved == fixed.reserved
