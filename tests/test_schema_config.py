"""``Report.config``: a typed, frozen ReportConfig that writes the JSON the plain dict did."""

from __future__ import annotations

import dataclasses
import json

import pytest
from torch.distributed.fsdp import ShardingStrategy
from views_models import analyze_tiny

import fsdpviz
from fsdpviz import Report, ReportConfig

HYBRID_SHARD, FULL_SHARD = ShardingStrategy.HYBRID_SHARD, ShardingStrategy.FULL_SHARD
FSDP1_JSON = {
    "api": "FSDP1",
    "world_size": 4,
    "shard_world_size": 4,
    "sharding_strategy": "FULL_SHARD",
    "auto_wrap_policy": "ModuleWrapPolicy({Block})",
    "backward_prefetch": None,
    "forward_prefetch": False,
    "use_orig_params": True,
    "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": None, "buffer_dtype": None},
    "trace": "meta",
}
FSDP2_JSON = {
    "api": "FSDP2",
    "world_size": 8,
    "fully_shard": ["blocks.0", "blocks.1", ""],
    "reshard_after_forward": {"blocks.0": True, "blocks.1": 2, "": False},
    "mp_policy": {
        "param_dtype": None,
        "reduce_dtype": None,
        "output_dtype": None,
        "cast_forward_inputs": True,
    },
    "forward_prefetch": {"blocks.0": ["blocks.1"]},
    "backward_prefetch": {},
    "trace": "real",
    "replayed": True,
}
RECORDING_JSON = {
    "api": "FSDP2",
    "trace": "/runs/trace.json",
    "world_size": None,
    "rank": 3,
    "backend": "nccl",
    "kinds": ["all_gather", "reduce_scatter"],
    "iteration_offset": 2,
    "unit_names": "from trace",
    "job": "llama-70b",  # a recorder's config= extra
}


@pytest.mark.parametrize("data", [FSDP1_JSON, FSDP2_JSON, RECORDING_JSON])
def test_json_round_trips_key_for_key_in_order(data: dict[str, object]) -> None:
    cfg = ReportConfig.from_dict(data)
    assert list(cfg.to_dict().items()) == list(data.items())
    assert json.dumps(cfg.to_dict()) == json.dumps(data)
    assert ReportConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_fields_are_typed_and_shared_keys_land_in_the_right_field() -> None:
    one, two, rec = (ReportConfig.from_dict(d) for d in (FSDP1_JSON, FSDP2_JSON, RECORDING_JSON))
    assert (one.world_size, one.parallel_dims.dp_shard_cp, one.use_orig_params) == (4, 4, True)
    assert one.backward_prefetch is None and one.explicit_backward_prefetch is None
    assert not one.prefetches_backward
    assert two.fully_shard == ("blocks.0", "blocks.1", "")
    assert two.explicit_forward_prefetch == {"blocks.0": ("blocks.1",)}
    assert two.forward_prefetch is False and two.prefetches_backward  # FSDP2 always does
    assert two.trace == "real" and two.replayed
    assert two.reshard_ranks("blocks.1") == 2 and two.reshard_ranks("blocks.0") is None
    assert rec.profiler_trace == "/runs/trace.json" and rec.trace is None
    assert rec.world_size is None and rec.ranks == 1  # the recording could not tell
    assert rec.kinds == ("all_gather", "reduce_scatter") and rec.extra == {"job": "llama-70b"}


def test_a_key_not_stated_reads_as_its_one_default() -> None:
    cfg = ReportConfig.from_dict({"api": "FSDP1"})
    assert cfg.to_dict() == {"api": "FSDP1"}
    assert (cfg.world_size, cfg.ranks, cfg.sharding_strategy, cfg.backward_prefetch) == (
        None,
        1,
        "FULL_SHARD",
        None,
    )
    assert cfg.iteration_offset == 0 and cfg.kinds is None and cfg.rank is None


def test_it_still_reads_as_the_mapping_it_was() -> None:
    cfg = analyze_tiny(world_size=2).config
    assert cfg["world_size"] == 2 and cfg.get("rank") is None and "rank" not in cfg
    assert {**cfg, "rank": 1}["rank"] == 1
    assert dict(cfg) == cfg.to_dict() and cfg == cfg.to_dict()
    with pytest.raises(KeyError):
        cfg["rank"]


def test_it_is_frozen_and_replace_states_what_it_changes() -> None:
    cfg = ReportConfig.from_dict(FSDP1_JSON)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.world_size = 8  # type: ignore[misc]
    other = cfg.replace(world_size=16, replayed=True)
    assert list(other.to_dict()) == [*FSDP1_JSON, "replayed"]
    assert other["world_size"] == 16 and cfg["world_size"] == 4


def test_reports_take_a_plain_dict_as_before_and_save_the_same_json() -> None:
    report = analyze_tiny(world_size=2)
    assert isinstance(report.config, ReportConfig)
    again = Report.from_dict(json.loads(report.to_json()))
    assert again.config == report.config and again.to_dict() == report.to_dict()
    plain = dataclasses.replace(report, config={**report.config, "rank": 0})
    assert isinstance(plain.config, ReportConfig) and plain.config.rank == 0
    assert fsdpviz.ReportConfig is ReportConfig


def test_unstate_drops_keys_and_their_values() -> None:
    hybrid = ReportConfig.from_dict({**FSDP1_JSON, "process_group_size": 2, "job": "x"})
    plain = hybrid.unstate("process_group_size", "job")
    assert plain.to_dict() == FSDP1_JSON and plain.process_group_size is None
    assert plain.extra == {}


def test_a_replay_to_hybrid_sharding_states_its_process_group() -> None:
    report = analyze_tiny(world_size=2)
    four = fsdpviz.replan.replay(report, world_size=4, sharding_strategy=HYBRID_SHARD)
    assert four.config.process_group_size == 4 and four.config.replayed
    assert list(four.config)[-2:] == ["process_group_size", "replayed"]
    back = fsdpviz.replan.replay(four, world_size=2, sharding_strategy=FULL_SHARD)
    assert "process_group_size" not in back.config and back.config.process_group_size is None


def test_the_shard_replica_split_is_worked_out_once() -> None:
    """The options, a unit's own strategy and a report's config read one rule."""
    from torch.distributed.fsdp import ShardingStrategy

    from fsdpviz.plan.fsdp1_options import parse_fsdp1_options
    from fsdpviz.schema.mesh import ParallelDims

    def shard_split(world_size: int, group: int, strategy: str) -> tuple[int, int]:
        dims = ParallelDims.fsdp1(world_size, group, strategy)
        return dims.dp_shard, dims.dp_replicate

    assert shard_split(8, 4, "HYBRID_SHARD") == (4, 2)
    assert shard_split(8, 4, "_HYBRID_SHARD_ZERO2") == (4, 2)
    assert shard_split(8, 8, "FULL_SHARD") == (8, 1)
    assert shard_split(8, 8, "NO_SHARD") == (1, 1)
    for strategy, group in (("HYBRID_SHARD", 4), ("FULL_SHARD", None), ("NO_SHARD", None)):
        kwargs = {"world_size": 8, "sharding_strategy": ShardingStrategy[strategy]}
        if group:
            kwargs["shard_group_size"] = group
        opts = parse_fsdp1_options(kwargs)
        config = opts.describe()
        assert (opts.shard_world_size, opts.replicas) == shard_split(8, group or 8, strategy), (
            strategy
        )
        dims = config.parallel_dims
        assert (dims.dp_shard_cp, dims.dp_replicate) == (opts.shard_world_size, opts.replicas)
