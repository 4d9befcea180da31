"""Conformance of ``shard_placement_fn`` on real multi-process jobs: FSDP2 on 2 gloo ranks.

Each case shards the 2-D weights on dim 1 (or -1) and the rest on dim 0, the head's
3-element bias padded across the 2 ranks; every rank's recording equals ``analyze``'s
prediction unit for unit (sizes, shard shapes and dims) and event for event, and the
tensor every collective moved (an all-gather's output, a reduce-scatter's input) has the
bytes the prediction gives it, in the time model and the memory model alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fsdp_harness import assert_same_schedule, timeline_collectives
from gloo_worker import placement_cases, spawn_suite

import fsdpviz
from fsdpviz.cost.sizes import unit_bytes

WORLD_SIZE = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("placement"), WORLD_SIZE, "placement")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(placement_cases()))
def test_shard_placement_fn_on_gloo_ranks(runs: Path, name: str) -> None:
    build, inputs, calls, kwargs = placement_cases()[name]
    torch.manual_seed(0)
    predicted = fsdpviz.analyze(
        build(), inputs(), fully_shard=calls, world_size=WORLD_SIZE, **kwargs
    )
    placed = {f: d for u in predicted.units for f, d in u.shard_dims.items()}
    assert placed and set(placed.values()) == {1}
    head = predicted.unit("")
    assert head.shard_shapes["head.bias"] == [2]  # 3 elements on 2 ranks: padded
    sizes = unit_bytes(predicted, None)
    by_event = [
        [e.kind, getattr(sizes[e.unit], e.kind)]  # an all-gather's output, a reduce-scatter's input
        for i in (0, 1, 1)
        for e in predicted.iterations[i]
        if e.kind in ("all_gather", "reduce_scatter")
    ]
    collectives = timeline_collectives(predicted, WORLD_SIZE)
    assert collectives == by_event  # the time model and the memory model agree
    for rank in range(WORLD_SIZE):
        real = fsdpviz.load(str(runs / f"{name}-rank{rank}.json"))
        assert real.config["api"] == "FSDP2" and real.config["rank"] == rank
        assert_same_schedule(real, predicted)
        moved = json.loads((runs / f"{name}-collectives-rank{rank}.json").read_text())
        assert moved == collectives
