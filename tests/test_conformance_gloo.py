"""Conformance on a real multi-process job: FSDP1 on 2 gloo ranks (CPU).

One spawn runs every case on both ranks and writes each rank's recording;
each test then checks that both ranks equal ``analyze(world_size=2)``.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from fsdp_harness import assert_same_schedule
from gloo_worker import gloo_cases, gloo_fsdp2_cases, run

import fsdpviz

pytest.importorskip("transformers")
WORLD_SIZE = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gloo")
    mp.spawn(run, args=(WORLD_SIZE, _free_port(), str(out)), nprocs=WORLD_SIZE, join=True)
    return out


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
