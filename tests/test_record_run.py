"""``fsdpviz.record`` on a real 2-rank FSDP1 job (torchrun, gloo, CPU), read back with ``load``.

One torchrun job records every case of ``record_job.cases()`` on both ranks
(3 training steps each, optimizer included) and one case with ``gather=True``;
each test reads the directories back as a user would.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fsdp_harness import assert_same_schedule
from record_harness import job, predict, untimed
from record_job import ITERATIONS, cases, fsdp2_cases, inputs

import fsdpviz

WORLD_SIZE = 2


@pytest.fixture(scope="module")
def out() -> Path:
    modes = ",".join(
        [
            *(f"case:{name}" for name in cases()),
            *(f"fsdp2:{name}" for name in fsdp2_cases()),
            "gather",
        ]
    )
    return job(WORLD_SIZE, modes)


def _run(path: Path) -> fsdpviz.RecordedRun:
    run = fsdpviz.load(path)
    assert isinstance(run, fsdpviz.RecordedRun)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", list(cases()))
def test_every_rank_records_the_prediction(out: Path, name: str) -> None:
    run = _run(out / name)
    predicted = predict(name, WORLD_SIZE)
    assert [r.config["rank"] for r in run.ranks] == [0, 1]
    assert run.notes == []
    for report in run.ranks:
        assert report.config["world_size"] == WORLD_SIZE and report.config["api"] == "FSDP1"
        assert len(report.iterations) == ITERATIONS
        assert report.config["complete_iterations"] == ITERATIONS
        assert_same_schedule(untimed(report), predicted)
    result = fsdpviz.diff(run, predicted)
    assert result.equal, str(result)
    assert (
        str(result) == f"recording equals prediction: {WORLD_SIZE * ITERATIONS} iterations compared"
    )
    assert run.divergence() is None
    assert "all ranks agree" in repr(run)


@pytest.mark.slow
def test_events_carry_wall_clock_times_and_durations(out: Path) -> None:
    run = _run(out / "stack-post-fwd")
    for report in run.ranks:
        assert time.time() - 600 < report.config["started_unix"] <= time.time()
        events = [e for it in report.iterations for e in it]
        ts = [e.t for e in events]
        assert all(isinstance(t, float) for t in ts)
        assert ts == sorted(ts) and ts[0] > 0
        assert all(e.duration is not None and 0 <= e.duration < 5 for e in events)


@pytest.mark.slow
def test_module_events_show_compute_between_collectives(out: Path) -> None:
    run = _run(out / "stack-post-fwd")
    report = run.rank(0)
    assert len(report.module_events) == ITERATIONS
    modules = report.module_events[1]
    kinds = {(m.kind, m.module) for m in modules}
    for name in ("", "inp", "blocks.0", "blocks.0.fc1", "blocks.3", "head"):
        assert ("forward_enter", name) in kinds and ("forward_exit", name) in kinds
    for name in ("blocks.0", "blocks.3.fc2", "head"):
        assert ("backward_enter", name) in kinds and ("backward_exit", name) in kinds
    # forward enters and exits nest like calls
    stack: list[str] = []
    for m in modules:
        if m.kind == "forward_enter":
            stack.append(m.module)
        elif m.kind == "forward_exit":
            assert stack.pop() == m.module
    assert stack == []
    events = report.iterations[1]
    assert events[0].t is not None and modules[0].t < events[0].t < modules[-1].t
    # each unit's own pre-forward all-gather is issued inside that unit's module call
    for i, e in enumerate(events):
        if e.kind == "all_gather" and e.hook == "pre_forward" and not e.prefetch:
            assert run.module_path(0, 1, i)[-1] == e.unit
    backward = next(i for i, e in enumerate(events) if e.kind == "reduce_scatter")
    assert run.module_path(0, 1, backward) == ("", events[backward].hook_unit)


@pytest.mark.slow
def test_gather_collects_every_rank_on_rank_zero(out: Path) -> None:
    gathered = _run(out / "gather" / "local0")
    assert [r.config["rank"] for r in gathered.ranks] == [0, 1]
    for report in gathered.ranks:
        assert_same_schedule(untimed(report), predict("stack-post-fwd", WORLD_SIZE))
        assert report.module_events
    alone = _run(out / "gather" / "local1")
    assert [r.config["rank"] for r in alone.ranks] == [1]
    assert alone.notes == ["ranks [0] wrote no recording here"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(fsdp2_cases()))
def test_fsdp2_ranks_record_the_prediction(out: Path, name: str) -> None:
    build, calls, kwargs = fsdp2_cases()[name]
    import torch

    torch.manual_seed(0)
    predicted = fsdpviz.analyze(
        build(), inputs(), fully_shard=calls, world_size=WORLD_SIZE, **kwargs
    )
    run = _run(out / name)
    for report in run.ranks:
        assert report.config["api"] == "FSDP2" and len(report.iterations) == ITERATIONS
        assert all(e.t is not None and e.duration is not None for e in report.iterations[0])
        assert_same_schedule(untimed(report), predicted)
    result = fsdpviz.diff(run, predicted)
    assert result.equal, str(result)
    assert run.divergence() is None
