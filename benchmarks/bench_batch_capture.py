"""A plan at another micro-batch: ``analyze`` at that batch against ``at(batch)`` of a capture
of two traces (:mod:`fsdpviz.replan.batch_replay`), side by side, in one run.

For each published run named (``benchmarks/bench_published.py``'s rows; default MPT-7B's of
6 samples and KempnerForge's 7B of 8), the job as its recipe builds it is traced at 2 and 3
samples keeping its moments (what that costs over a plain trace is printed), captured, and
then for each batch asked up to the recipe's (a recipe's loss holds that many samples'
labels) ``analyze`` is timed against ``capture.at``, and the two reports compared whole.

    python benchmarks/bench_batch_capture.py [--rows NAME_OR_SUBSTRING ...] [--batches 1 4 6 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_published as pub

import fsdpviz
from fsdpviz.replan.batch_replay import batch_capture
from fsdpviz.trace.probe_records import recording_moments
from fsdpviz.tuning.space import micro_batch_inputs


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def bench_row(row: pub.Row, batches: list[int]) -> None:
    job = pub.row_job(row)
    kwargs = {k: v for k, v in job.kwargs.items() if k != "grad_accum"}
    given = next(t for t in tree_leaves(job.inputs) if isinstance(t, torch.Tensor)).shape[0]

    def trace(samples: int, moments: bool = False) -> fsdpviz.Report:
        inputs = micro_batch_inputs(job.inputs, given, samples)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not moments:
                return fsdpviz.analyze(
                    job.model, inputs, machine=job.machine, progress=False, **kwargs
                )
            with recording_moments():
                return fsdpviz.analyze(
                    job.model, inputs, machine=job.machine, progress=False, **kwargs
                )

    trace(2)  # warm the operator cache as tune's later traces find it
    _, plain = _timed(lambda: trace(2))
    low, with_moments = _timed(lambda: trace(2, True))
    high, _ = _timed(lambda: trace(3, True))
    capture, build = _timed(lambda: batch_capture(low, high, 2, 3))
    print(f"{row.name}: a trace at 2 samples {plain:.2f} s, keeping its moments "
          f"{with_moments:.2f} s; the capture of 2 and 3 made in {build:.2f} s")  # fmt: skip
    if capture is None:
        print("  the capture refused the two traces: every batch is traced")
        return
    print(f"  {'batch':>5}  {'analyze s':>9}  {'at s':>7}  {'ratio':>6}  same report")
    for b in [b for b in batches if b <= given]:
        traced, t_analyze = _timed(lambda b=b: trace(b))
        derived, t_at = _timed(lambda b=b: capture.at(b))
        if derived is None:  # a batch of 1 from traces of more: traced (torch's special case)
            print(f"  {b:>5}  {t_analyze:9.2f}     none       -  (not derived: traced)")
            continue
        same = derived.to_dict() == traced.to_dict()
        ratio = t_analyze / t_at
        print(f"  {b:>5}  {t_analyze:9.2f}  {t_at:7.3f}  {ratio:6.1f}  {'yes' if same else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows",
        nargs="*",
        default=[
            "mpt:7b 8xh100 b6 s2048 AC=none",
            "kempner:7B 4xh200 b8 x4 s4096 AC=full, compile",
        ],
    )
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 4, 6, 8])
    args = parser.parse_args()
    exact = [r for r in pub.ROWS if r.name in args.rows]
    rows = exact or [r for r in pub.ROWS if any(s in r.name for s in args.rows)]
    for row in rows:
        bench_row(row, args.batches)


if __name__ == "__main__":
    main()
