"""The option dataclasses as the parsers hand them on (frozen, changed by ``replace``, which
checks again) and the table of shared FSDP options that the command line reads."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch
from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy

from fsdpviz._options_cli import FLAGS, add_fsdp_flags, flags_for
from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp1_options import enum_value, parse_fsdp1_options
from fsdpviz.plan.fsdp2_options import parse_fsdp2_options
from fsdpviz.plan.job import JobOptions
from fsdpviz.plan.option_specs import FSDP_OPTIONS, OPTIONS


def test_fsdp1_options_are_frozen_and_replace_checks_the_change() -> None:
    opts = parse_fsdp1_options({"world_size": 4, "backward_prefetch": "BACKWARD_PRE"})
    assert opts.backward_prefetch is None and [w.code for w in opts.warnings] == ["string_option"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.world_size = 8  # type: ignore[misc]
    changed = opts.replace(forward_prefetch=True, profile=False)
    assert (changed.forward_prefetch, changed.profile, changed.world_size) == (True, False, 4)
    assert (opts.forward_prefetch, opts.profile) == (False, True)
    with pytest.raises(ConfigError, match="world_size must be a positive int, got 0"):
        opts.replace(world_size=0)
    with pytest.raises(ConfigError, match="forward_prefetch must be True or False, got 1"):
        opts.replace(forward_prefetch=1)
    with pytest.raises(ConfigError, match="shard_group_size only applies to HYBRID_SHARD"):
        opts.replace(shard_group_size=2)
    hybrid = parse_fsdp1_options(
        {"world_size": 16, "sharding_strategy": ShardingStrategy.HYBRID_SHARD}
    )
    assert (hybrid.hybrid, hybrid.shard_group_size, hybrid.process_group_size) == (True, 8, 8)
    with pytest.raises(ConfigError, match="must be a positive divisor of world_size=16"):
        hybrid.replace(shard_group_size=3)
    # a string strategy with a group size: the string is what is wrong, and how to write it
    with pytest.raises(ConfigError, match=r"'HYBRID_SHARD' is a string.*ShardingStrategy\.HYBRID"):
        parse_fsdp1_options(
            {"world_size": 16, "sharding_strategy": "HYBRID_SHARD", "shard_group_size": 8}
        )


def test_keep_low_precision_grads_is_read_from_the_mixed_precision() -> None:
    plain = parse_fsdp1_options({"mixed_precision": MixedPrecision(param_dtype=torch.bfloat16)})
    keep = parse_fsdp1_options(
        {
            "mixed_precision": MixedPrecision(
                param_dtype=torch.bfloat16, keep_low_precision_grads=True
            )
        }
    )
    assert not plain.keep_low_precision_grads and keep.keep_low_precision_grads
    assert not parse_fsdp1_options({}).keep_low_precision_grads


def test_fsdp2_and_job_options_replace_checks_the_change() -> None:
    opts = parse_fsdp2_options({"fully_shard": ["layers.0"], "grad_accum": 2})
    assert opts.replace(reshard_after_forward=2).reshard_after_forward == 2
    with pytest.raises(ConfigError, match="reshard_after_forward must be a bool, an int"):
        opts.replace(reshard_after_forward="yes")
    with pytest.raises(ConfigError, match="trace='fx' is not valid for FSDP2"):
        opts.replace(trace="fx")
    assert opts.job.replace(grad_accum=4).grad_accum == 4
    with pytest.raises(ConfigError, match="grad_accum must be a positive int"):
        JobOptions().replace(grad_accum=0)
    with pytest.raises(ConfigError, match="float32_matmul_precision must be one of"):
        JobOptions().replace(float32_matmul_precision="low")


def test_each_shared_option_is_one_flag_read_as_its_table_says() -> None:
    parser = argparse.ArgumentParser()
    add_fsdp_flags(parser)
    for spec in FSDP_OPTIONS:
        (flag,) = [f for f in FLAGS if f.option == spec.name]
        assert (flag.name, flag.help, flag.dest) == (spec.flag, spec.help, spec.name)
        if spec.kind == "enum":
            for word, value in spec.words.items():
                args = parser.parse_args([f"{spec.flag}", word])
                assert spec.stored(getattr(args, spec.dest)) == value
                assert flags_for({spec.name: value}) == f"{spec.flag} {word}"
        if spec.kind == "bool":
            assert getattr(parser.parse_args([f"{spec.flag}"]), spec.dest) is True
            assert flags_for({spec.name: True}) == spec.flag
    assert parser.parse_args(["--reshard-after-forward", "4"]).reshard_after_forward == 4


def test_enum_values_and_code_as_torch_writes_them() -> None:
    prefetch, sharding = OPTIONS["backward_prefetch"], OPTIONS["sharding_strategy"]
    assert enum_value(prefetch, "BACKWARD_POST") is BackwardPrefetch.BACKWARD_POST
    assert enum_value(prefetch, None) is None
    assert enum_value(sharding, "HYBRID_SHARD") is ShardingStrategy.HYBRID_SHARD
    assert prefetch.code(None) == "backward_prefetch=None"
    assert sharding.code("NO_SHARD") == "sharding_strategy=ShardingStrategy.NO_SHARD"
    assert OPTIONS["reshard_after_forward"].code(2) == "reshard_after_forward=2"
    assert OPTIONS["world_size"].summary_line() == "  --world-size N              ranks (default 8)"


def test_each_api_takes_the_keywords_its_typed_dict_declares_and_refuses_the_others() -> None:
    from fsdpviz.plan.options import KEYWORDS
    from fsdpviz.schema.keywords import FSDP1Kwargs, FSDP2Kwargs

    assert FSDP1Kwargs.__optional_keys__ <= KEYWORDS["FSDP1"]
    assert FSDP2Kwargs.__optional_keys__ <= KEYWORDS["FSDP2"]
    assert not (FSDP1Kwargs.__optional_keys__ & KEYWORDS["FSDP2"])
    assert {"world_size", "progress", "grad_accum", "trace"} <= KEYWORDS["FSDP1"] & KEYWORDS[
        "FSDP2"
    ]
    for key in sorted(FSDP2Kwargs.__optional_keys__ - {"fully_shard"}):
        with pytest.raises(ConfigError, match=f"'{key}' is an option of FSDP2's fully_shard"):
            parse_fsdp1_options({key: None})
    for key in sorted(FSDP1Kwargs.__optional_keys__):
        with pytest.raises(ConfigError, match=f"'{key}' is an option of FSDP1"):
            parse_fsdp2_options({"fully_shard": [], key: None})


def test_float8_and_job_options_read_back_as_stated() -> None:
    from fsdpviz.plan.job import Float8, parse_job_options

    spec = Float8(filter_fqns=("output",), precompute_float8_dynamic_scale_for_fsdp=True)
    assert Float8.from_dict(spec.to_dict()) == spec
    assert Float8().to_dict() == {
        "recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": False, "filter_fqns": [],
    }  # fmt: skip
    assert Float8.from_dict({"recipe_name": None, "filter_fqns": None}) == Float8()
    job = parse_job_options({"grad_accum": 1, "compile": True, "float8": None}, "FSDP1")
    assert job.stated == ("compile",)
    with pytest.raises(ConfigError, match="grad_accum must be a positive int"):
        job.replace(grad_accum=0)
