"""A rank killed mid-iteration leaves every finished iteration of every rank readable.

Two real FSDP1 ranks (torchrun, gloo, CPU) record; after 3 finished iterations
the last rank ``SIGKILL``s itself inside a block's forward. Rank 0 then fails in
its next collective and torchrun tears the job down.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from fsdp_harness import assert_same_schedule
from record_harness import job, predict, untimed
from record_job import CRASH_ITERATION

import fsdpviz

WORLD_SIZE = 2


@pytest.mark.slow
def test_killed_rank_keeps_every_finished_iteration() -> None:
    run = fsdpviz.load(job(WORLD_SIZE, "crash", expect_failure=True) / "crash")
    assert isinstance(run, fsdpviz.RecordedRun)
    assert [r.config["rank"] for r in run.ranks] == [0, 1]
    predicted = predict("stack-post-fwd", WORLD_SIZE)
    killed = run.rank(WORLD_SIZE - 1)
    assert len(killed.iterations) == CRASH_ITERATION
    for report in run.ranks:
        assert report.config["complete_iterations"] == CRASH_ITERATION
        assert len(report.module_events[CRASH_ITERATION - 1]) > 0
        n = CRASH_ITERATION
        finished = replace(report, iterations=report.iterations[:n], module_events=[])
        assert_same_schedule(untimed(finished), predicted)
        assert fsdpviz.diff(finished, predicted).equal
    for rank in range(WORLD_SIZE):
        assert any(n.startswith(f"rank {rank} did not finish recording") for n in run.notes)
    assert run.divergence() is None
