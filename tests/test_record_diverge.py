"""Four real ranks (torchrun, gloo, CPU): conformant FSDP1 and FSDP2 runs, and one that diverges.

In ``diverge`` the last rank runs blocks 2 and 1 in swapped order (a
rank-dependent branch in forward). Every block has the same size, so the
collectives still pair up and the job finishes, silently wrong: exactly what
FSDP checks only under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_harness import assert_same_schedule
from record_harness import job, predict, untimed
from record_job import fsdp2_cases, inputs

import fsdpviz
from fsdpviz import Event

WORLD_SIZE = 4


@pytest.fixture(scope="module")
def out() -> Path:
    return job(WORLD_SIZE, "case:stack-post-fwd,fsdp2:fsdp2-twice-grouped,diverge")


def _run(path: Path) -> fsdpviz.RecordedRun:
    run = fsdpviz.load(path)
    assert isinstance(run, fsdpviz.RecordedRun)
    return run


@pytest.mark.slow
def test_four_ranks_record_the_prediction(out: Path) -> None:
    run = _run(out / "stack-post-fwd")
    predicted = predict("stack-post-fwd", WORLD_SIZE)
    assert [r.config["rank"] for r in run.ranks] == [0, 1, 2, 3]
    for report in run.ranks:
        assert report.config["world_size"] == WORLD_SIZE
        assert_same_schedule(untimed(report), predicted)
    assert fsdpviz.diff(run, predicted).equal
    assert run.divergence() is None


@pytest.mark.slow
def test_four_fsdp2_ranks_record_the_prediction(out: Path) -> None:
    import torch

    build, calls, kwargs = fsdp2_cases()["fsdp2-twice-grouped"]
    torch.manual_seed(0)
    model = build()
    predicted = fsdpviz.analyze(model, inputs(), fully_shard=calls, world_size=WORLD_SIZE, **kwargs)
    run = _run(out / "fsdp2-twice-grouped")
    assert [r.config["api"] for r in run.ranks] == ["FSDP2"] * WORLD_SIZE
    for report in run.ranks:
        assert_same_schedule(untimed(report), predicted)
    assert fsdpviz.diff(run, predicted).equal


@pytest.mark.slow
def test_rank_dependent_branch_is_found_on_every_rank(out: Path) -> None:
    run = _run(out / "diverge")
    d = run.divergence()
    assert d is not None
    assert (d.iteration, d.index) == (0, 3)
    assert d.previous == Event("free", "blocks.0", "forward", False, "post_forward", "blocks.0")
    expected = {r: "blocks.1" for r in range(WORLD_SIZE - 1)} | {WORLD_SIZE - 1: "blocks.2"}
    assert [r.rank for r in d.ranks] == list(range(WORLD_SIZE))
    for r in d.ranks:
        unit = expected[r.rank]
        assert r.event is not None
        assert r.event.untimed() == Event("all_gather", unit, "forward", False, "pre_forward", unit)
        assert r.module_path == ("", unit)
    text = str(d)
    assert "Ranks diverge in iteration 0 at event 3 (forward)" in text
    assert (
        "ranks 0, 1, 2: all_gather 'blocks.1' (pre_forward of 'blocks.1')  in RankBranch > blocks.1"
        in text
    )
    assert (
        "rank 3: all_gather 'blocks.2' (pre_forward of 'blocks.2')  in RankBranch > blocks.2"
        in text
    )
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in text
    assert "ranks diverge in iteration 0 at event 3" in repr(run)
