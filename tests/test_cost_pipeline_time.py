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
