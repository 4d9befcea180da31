"""``ParallelDims``: the degrees of a job's mesh and the counts derived from them, built
directly and derived from the configs predictions state."""

from __future__ import annotations

import pytest
from torch.distributed.fsdp import ShardingStrategy

from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp1_options import parse_fsdp1_options
from fsdpviz.plan.fsdp2_options import parse_fsdp2_options
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.mesh import ParallelDims


def counts(d: ParallelDims) -> tuple[int, ...]:
    """world, replicate, shard, cp, tp, pp, dp, dp_shard_cp, dp_cp"""
    return (d.world_size, d.dp_replicate, d.dp_shard, d.cp, d.tp, d.pp, d.dp, d.dp_shard_cp,
            d.dp_cp)  # fmt: skip


def test_one_dimension() -> None:
    d = parse_fsdp2_options({"world_size": 8}).describe([]).parallel_dims
    assert counts(d) == (8, 1, 8, 1, 1, 1, 8, 8, 8) and not d.hsdp
    assert d.device_mesh == {"dp_shard": 8} and d.mesh_arg == ("dp_shard", 8)
    assert ReportConfig().parallel_dims == ParallelDims()  # a recording without its world size


def test_hsdp_two_dimensions() -> None:
    config = parse_fsdp2_options({"mesh": ("dp_replicate", 2, "dp_shard", 4)}).describe([])
    d = config.parallel_dims
    assert counts(d) == (8, 2, 4, 1, 1, 1, 8, 4, 8) and d.hsdp
    assert d.device_mesh == {"dp_replicate": 2, "dp_shard": 4}
    # a replicate dimension of one rank is HSDP still: foreach_reduce all-reduces over it
    one = parse_fsdp2_options({"mesh": ("dp_replicate", 1, "dp_shard", 8)}).describe([])
    assert one.parallel_dims.dp_replicate == 1 and one.parallel_dims.hsdp
    assert one.parallel_dims.device_mesh == {"dp_replicate": 1, "dp_shard": 8}


def test_dp_by_tp() -> None:
    config = ReportConfig(api="FSDP2", world_size=64, shard_world_size=8,
                          mesh={"dp_shard": 8, "tp": 8}, tp_world_size=8)  # fmt: skip
    d = config.parallel_dims
    assert counts(d) == (64, 1, 8, 1, 8, 1, 8, 8, 8) and not d.hsdp
    assert d.mesh_arg == ("dp_shard", 8, "tp", 8)
    hsdp = ReportConfig(api="FSDP2", world_size=64, shard_world_size=4, tp_world_size=8,
                        mesh={"dp_replicate": 2, "dp_shard": 4, "tp": 8})  # fmt: skip
    assert counts(hsdp.parallel_dims) == (64, 2, 4, 1, 8, 1, 8, 4, 8) and hsdp.parallel_dims.hsdp
    assert hsdp.parallel_dims.mesh_arg == ("dp_replicate", 2, "dp_shard", 4, "tp", 8)


def test_pp_by_dp_by_tp() -> None:
    """A pipeline job's config as its report states it: the pp dimension outermost."""
    config = ReportConfig(api="FSDP2", world_size=16, shard_world_size=2, tp_world_size=4,
                          pp_world_size=2, mesh={"pp": 2, "dp_shard": 2, "tp": 4})  # fmt: skip
    d = config.parallel_dims
    assert counts(d) == (16, 1, 2, 1, 4, 2, 2, 2, 2) and not d.hsdp
    assert d.device_mesh == {"pp": 2, "dp_shard": 2, "tp": 4}
    assert d == ParallelDims.filled(16, tp=4, pp=2)


def test_context_parallel() -> None:
    """FSDP shards over dp_shard x cp; a cp dimension beside a replicate one is HSDP."""
    config = parse_fsdp2_options({"mesh": ("dp_shard", 2, "cp", 4)}).describe([])
    d = config.parallel_dims
    assert config.shard_world_size == 8
    assert counts(d) == (8, 1, 2, 4, 1, 1, 2, 8, 8) and not d.hsdp
    assert d.device_mesh == {"dp_shard": 2, "cp": 4}
    mesh = ("dp_replicate", 2, "dp_shard", 2, "cp", 2)
    hsdp = parse_fsdp2_options({"mesh": mesh}).describe([]).parallel_dims
    assert counts(hsdp) == (8, 2, 2, 2, 1, 1, 4, 4, 8) and hsdp.hsdp


@pytest.mark.parametrize(
    ("strategy", "group", "expected", "hsdp"),
    [
        ("HYBRID_SHARD", 4, (8, 2, 4, 1, 1, 1, 8, 4, 8), True),
        ("_HYBRID_SHARD_ZERO2", 2, (8, 4, 2, 1, 1, 1, 8, 2, 8), True),
        ("HYBRID_SHARD", 8, (8, 1, 8, 1, 1, 1, 8, 8, 8), False),  # one shard group
        ("FULL_SHARD", None, (8, 1, 8, 1, 1, 1, 8, 8, 8), False),
        # NO_SHARD all-reduces over its process group: neither shard nor replicas
        ("NO_SHARD", None, (8, 1, 1, 1, 1, 1, 1, 1, 8), False),
    ],
)
def test_fsdp1(strategy: str, group: int | None, expected: tuple[int, ...], hsdp: bool) -> None:
    kwargs = {"world_size": 8, "sharding_strategy": ShardingStrategy[strategy]}
    if group:
        kwargs["shard_group_size"] = group
    opts = parse_fsdp1_options(kwargs)
    d = opts.describe().parallel_dims
    assert counts(d) == expected and d.hsdp is hsdp
    assert (
        d
        == ParallelDims.fsdp1(8, group or 8, strategy)
        == opts.parallel_dims(opts.sharding_strategy)
    )


def test_filled_takes_the_ranks_the_others_leave() -> None:
    assert counts(ParallelDims.filled(64, tp=8)) == (64, 1, 8, 1, 8, 1, 8, 8, 8)
    hsdp = ParallelDims.filled(64, dp_replicate=-1, dp_shard=4, tp=8)
    assert (hsdp.dp_replicate, hsdp.dp_shard, hsdp.hsdp) == (2, 4, True)
    assert ParallelDims.filled(8, dp_replicate=2, dp_shard=4).world_size == 8
    with pytest.raises(ConfigError, match="12 ranks do not divide by the other degrees' product 8"):
        ParallelDims.filled(12, tp=8)
    with pytest.raises(ConfigError, match="product 4"):
        ParallelDims.filled(8, dp_replicate=2, dp_shard=2)


def test_degrees_are_checked_once() -> None:
    with pytest.raises(ConfigError, match=r"ParallelDims\.tp must be 1 or more, got 0"):
        ParallelDims(world_size=8, tp=0)
    with pytest.raises(ConfigError, match="world_size"):
        ParallelDims(world_size=2.0)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        ParallelDims().tp = 2  # type: ignore[misc]


def test_product_stated_and_post_forward() -> None:
    """The world size from the degrees; the degrees from a report's counts; FSDP2's shard
    group split for ``reshard_after_forward=N``."""
    d = ParallelDims.product(dp_replicate=2, dp_shard=4, tp=2, hsdp=True)
    assert counts(d) == (16, 2, 4, 1, 2, 1, 8, 4, 8) and d.hsdp
    assert ParallelDims.stated(64, 8, tp=4) == ParallelDims.filled(64, dp_replicate=-1,
                                                                   dp_shard=8, tp=4)  # fmt: skip
    cp = ParallelDims.stated(16, 8, cp=4, hsdp=False)
    assert counts(cp) == (16, 2, 2, 4, 1, 1, 4, 8, 16) and not cp.hsdp
    # counts that do not divide, as a report may state them: rounded down, at least 1
    assert counts(ParallelDims.stated(6, 4, cp=8)) == (6, 1, 1, 8, 1, 1, 1, 8, 6)
    assert ParallelDims.stated(8, 4, dp_replicate=1).hsdp is False
    assert ParallelDims.filled(16).post_forward(8) == (2, 8)
    assert ParallelDims.filled(16, cp=2).post_forward(4) == (4, 4)  # of dp_shard x cp


def test_meshed_degrees_make_the_world_size() -> None:
    """FSDP1's ``NO_SHARD`` (neither shard nor replicas) as DDP: every rank a replica; degrees
    whose product is the world size as they are."""
    ddp = ParallelDims.fsdp1(8, 8, "NO_SHARD").meshed
    assert (ddp.dp_replicate, ddp.dp_shard, ddp.world_size, ddp.hsdp) == (8, 1, 8, False)
    hsdp = ParallelDims.fsdp1(8, 4, "HYBRID_SHARD")
    assert hsdp.meshed is hsdp


@pytest.mark.parametrize(
    "kwargs",
    [
        {"world_size": 8},
        {"mesh": ("dp_replicate", 2, "dp_shard", 4)},
        {"mesh": ("dp_shard", 2, "cp", 4)},
        {"mesh": (2, 4)},
    ],
)
def test_fsdp2_options_hold_their_ranks_once(kwargs: dict[str, object]) -> None:
    """The parser reads the mesh into one ``ParallelDims``; the report states it."""
    opts = parse_fsdp2_options(dict(kwargs))
    assert opts.world_size == opts.parallel_dims.world_size
    assert opts.describe([]).parallel_dims == opts.parallel_dims
    assert not {"shard_size", "replicas", "cp_size", "tp_size"} & set(vars(opts))
