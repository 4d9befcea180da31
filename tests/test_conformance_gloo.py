"""Conformance on real multi-process jobs: FSDP1 and FSDP2 on gloo ranks (CPU).

One spawn per suite runs every case of that suite on each rank and writes each rank's
recording; each test then checks that every rank equals ``analyze`` of the same case:
2 ranks (FSDP1 and FSDP2 cases), 1 rank (FSDP1 switches to NO_SHARD) and 4 ranks in two
shard groups of 2 (FSDP1's hybrid strategies: all-gathers and reduce-scatters within the
shard group, all-reduces across the replicas).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fsdp_harness import assert_same_schedule
from gloo_worker import (
    HYBRID_SHARD_GROUP,
    gloo_cases,
    gloo_fsdp2_cases,
    hybrid_cases,
    one_rank_cases,
    spawn_suite,
)

import fsdpviz

pytest.importorskip("transformers")
WORLD_SIZE = 2
HYBRID_WORLD_SIZE = 4


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("gloo"), WORLD_SIZE, "two")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("gloo1"), 1, "one")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("gloo4"), HYBRID_WORLD_SIZE, "hybrid")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(gloo_cases()))
def test_two_gloo_ranks_match_prediction(recordings: Path, name: str) -> None:
    build, inputs, kwargs = gloo_cases()[name]
    torch.manual_seed(0)
    predicted = fsdpviz.analyze(build(), inputs(), world_size=WORLD_SIZE, **kwargs)
    for rank in range(WORLD_SIZE):
        real = fsdpviz.load(str(recordings / f"{name}-rank{rank}.json"))
        assert real.config["rank"] == rank and real.config["world_size"] == WORLD_SIZE
        assert_same_schedule(real, predicted)
    if isinstance(kwargs.get("backward_prefetch"), str):
        assert not [e for e in predicted.iterations[1] if e.prefetch and e.phase == "backward"]
        assert [w.code for w in predicted.warnings] == ["string_option"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(gloo_fsdp2_cases()))
def test_two_gloo_ranks_fsdp2(recordings: Path, name: str) -> None:
    build, inputs, calls, kwargs = gloo_fsdp2_cases()[name]
    torch.manual_seed(0)
    predicted = fsdpviz.analyze(
        build(), inputs(), fully_shard=calls, world_size=WORLD_SIZE, **kwargs
    )
    for rank in range(WORLD_SIZE):
        real = fsdpviz.load(str(recordings / f"{name}-rank{rank}.json"))
        assert real.config["api"] == "FSDP2" and real.config["rank"] == rank
        assert_same_schedule(real, predicted)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(one_rank_cases()))
def test_one_gloo_rank_runs_no_shard(one_rank: Path, name: str) -> None:
    build, inputs, kwargs = one_rank_cases()[name]
    torch.manual_seed(0)
    predicted = fsdpviz.analyze(build(), inputs(), world_size=1, **kwargs)
    real = fsdpviz.load(str(one_rank / f"{name}-rank0.json"))
    assert_same_schedule(real, predicted)
    assert {e.kind for it in real.iterations for e in it} == {"all_reduce"}
    assert {u.sharding_strategy for u in predicted.units} == {"NO_SHARD"}
    assert "no_shard_world_size_1" in [w.code for w in predicted.warnings]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(hybrid_cases()))
def test_hybrid_shard_groups_of_two_on_four_gloo_ranks(hybrid: Path, name: str) -> None:
    build, inputs, kwargs = hybrid_cases()[name]
    torch.manual_seed(0)
    predicted = fsdpviz.analyze(
        build(), inputs(), world_size=HYBRID_WORLD_SIZE, shard_group_size=HYBRID_SHARD_GROUP,
        **kwargs,
    )  # fmt: skip
    for rank in range(HYBRID_WORLD_SIZE):
        real = fsdpviz.load(str(hybrid / f"{name}-rank{rank}.json"))
        assert_same_schedule(real, predicted)
    steady = predicted.iterations[1]
    reduced = [e.unit for e in steady if e.kind == "reduce_scatter"]
    across = [e.unit for e in steady if e.kind == "all_reduce" and e.group == "replicate"]
    assert reduced == across and len(across) == len(predicted.units)
    assert all(u.padded_numel == 2 * u.sharded_numel for u in predicted.units)
