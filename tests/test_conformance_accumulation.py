"""Gradient accumulation against real FSDP on two gloo ranks: ``analyze(..., grad_accum=N)``
gives every micro-step of two optimizer steps as FSDP issues it, event by event: FSDP1
under ``no_sync()`` (``FULL_SHARD`` frees as usual and reduces nothing; ``SHARD_GRAD_OP``
never frees in backward, so the next micro-step all-gathers nothing), FSDP2 after
``set_requires_gradient_sync(False)``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fsdp_harness import assert_same_accumulation
from gloo_worker import ACCUM, accum_cases, spawn_suite
from torch.distributed.fsdp import ShardingStrategy

import fsdpviz

pytest.importorskip("transformers")
WORLD_SIZE = 2


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("accum"), WORLD_SIZE, "accum")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(accum_cases()))
def test_accumulated_micro_steps_match_real_fsdp(recordings: Path, name: str) -> None:
    build, inputs, calls, kwargs = accum_cases()[name]
    torch.manual_seed(0)
    if calls is not None:
        kwargs = {**kwargs, "fully_shard": calls}
    predicted = fsdpviz.analyze(
        build(), inputs(), world_size=WORLD_SIZE, grad_accum=ACCUM, progress=False, **kwargs
    )
    for rank in range(WORLD_SIZE):
        real = fsdpviz.load(str(recordings / f"{name}-rank{rank}.json"))
        assert real.config["rank"] == rank
        assert_same_accumulation(real, predicted, ACCUM)
        assert fsdpviz.diff(real, predicted).equal  # all three steps, micro-step by micro-step
    quiet, synced = predicted.iterations[ACCUM], predicted.iterations[2 * ACCUM - 1]
    reductions = ("reduce_scatter", "all_reduce")
    assert not [e for e in quiet if e.kind in reductions]
    assert [e for e in synced if e.kind in reductions]
    if kwargs.get("sharding_strategy") == ShardingStrategy.SHARD_GRAD_OP:
        # no_sync keeps every unit unsharded: no free in backward, and the synced micro-step
        # that follows all-gathers nothing
        assert not [e for e in quiet if e.kind == "free"]
        assert [e for e in predicted.iterations[ACCUM + 1] if e.kind == "all_gather"] == []
