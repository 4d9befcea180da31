"""The time model of a pipeline job under gradient accumulation: the relations a user relies
on when comparing ``grad_accum=N`` with single steps.

Under pipeline parallelism every ``step()`` of a micro-step reduces (``REDUCE_GRAD``) and
reshards, so each micro-step issues the same events and takes the same time; the optimizer
steps once per optimizer step. A rank's step of ``grad_accum=N`` is then ``N`` micro-steps
of the single step's time, and one optimizer step; the job's compute, communication,
bubbles and bytes ``N`` times the single step's; and ``timeline(report, grad_accum=N)`` of
the job planned without accumulation is the job planned with it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from test_schedule_pipeline import plan

from fsdpviz.cost import timeline

SCALED = ("compute_s", "comm_s", "exposed_comm_s", "bubble_s", "pp_bytes", "all_gather_bytes",
          "reduce_scatter_bytes", "model_flops", "tokens")  # fmt: skip


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble", "DualPipeV"])
def test_grad_accum_times_n_micro_steps_and_one_optimizer_step(schedule: str) -> None:
    single = plan(schedule, progress=False)
    one = [timeline(r, "h100") for r in single.pipeline.ranks]
    assert all(len(tl.micro_steps) == 1 for tl in one)
    for n in (2, 3):
        accum = plan(schedule, grad_accum=n, progress=False)
        job, job1 = timeline(accum, "h100"), timeline(single, "h100")
        for key in SCALED:
            assert math.isclose(job.totals[key], n * job1.totals[key], rel_tol=1e-9), key
        # the optimizer is the same once per step: more tokens in each step's time
        assert job.totals["tokens_per_s"] > job1.totals["tokens_per_s"]
        for rank, tl1 in zip(accum.pipeline.ranks, one, strict=True):
            tl = timeline(rank, "h100")
            opt = tl.totals["optimizer_s"]
            assert opt > 0 and opt == tl1.totals["optimizer_s"]
            micro = tl1.micro_steps[0].end - tl1.micro_steps[0].start
            assert len(tl.micro_steps) == n
            for k, m in enumerate(tl.micro_steps):
                assert m.sync  # each step() reduces
                assert math.isclose(m.start, k * micro, rel_tol=1e-9, abs_tol=1e-15)
                assert math.isclose(m.end - m.start, micro, rel_tol=1e-9)
            assert math.isclose(tl.totals["step_s"], n * micro + opt, rel_tol=1e-9)
            # two single steps: the optimizer twice
            assert tl.totals["step_s"] < n * tl1.totals["step_s"]
        # repeating the single step's iteration n times is the job planned with grad_accum=n
        assert timeline(single, "h100", grad_accum=n).totals == job.totals


PRECOMPUTED = {"enable_fsdp_float8_all_gather": True,
               "precompute_float8_dynamic_scale_for_fsdp": True}  # fmt: skip


@pytest.mark.parametrize(
    ("schedule", "kw"),
    [("1F1B", {}), ("ZBVZeroBubble", {}), ("1F1B", {"grad_accum": 2}),
     ("1F1B", {"float8": PRECOMPUTED})],
    ids=["1F1B", "ZBVZeroBubble", "grad_accum", "float8"],
)  # fmt: skip
def test_the_jobs_timeline_holds_each_ranks_step_work(schedule: str, kw: dict[str, Any]) -> None:
    """Each rank steps its optimizer once its own ``schedule.step()`` returns (after its last
    backward; no barrier with the other ranks): the job's timeline holds every rank's step
    work as the rank's own timeline places it (every rank's step starts at 0 on the job's
    clock), with its ``rank``; the job's step ends with the slowest rank's."""
    report = plan(schedule, progress=False, **kw)
    job = timeline(report, "h100")
    ranks = [timeline(r, "h100") for r in report.pipeline.ranks]
    assert job.step_work == [replace(w, rank=r) for r, tl in enumerate(ranks) for w in tl.step_work]
    names = {w.name for w in job.step_work}
    float8 = {"float8_amax", "float8_scales"} if kw.get("float8") else set()
    assert names == {"optimizer", *float8}
    ends = []
    for r, tl in enumerate(ranks):
        mine = [w for w in job.step_work if w.rank == r]
        last = tl.micro_steps[-1]
        # after the rank's own last micro-step (its last backward), in that micro-step's time
        assert mine[0].name == "optimizer" and mine[0].start == last.end - last.start
        assert max(c.end for c in tl.compute) <= mine[0].start
        assert math.isclose(last.start + mine[-1].end, tl.totals["step_s"], rel_tol=1e-12)
        ends.append(last.start + mine[-1].end)
    assert job.totals["step_s"] == max(tl.totals["step_s"] for tl in ranks)
    assert math.isclose(job.totals["step_s"], max(ends), rel_tol=1e-12)
    again = type(job).from_dict(job.to_dict())
    assert again.step_work == job.step_work
