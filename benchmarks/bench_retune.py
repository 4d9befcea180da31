"""``Tuning.retune`` against a fresh ``fsdpviz.tune``, side by side in one process, for the
questions a notebook asks after a first search: and on H200? on twice the GPUs? within 60 GiB?

The job is torchtitan's Llama 3 as its ``llama3_8b.toml`` ships it (``from_torchtitan``:
FSDP2, bf16 parameters, per-operator selective checkpointing, 1 x 8192 tokens per rank;
``--flavor 70B`` for the 70B model). It is tuned on ``--world-size`` H100s first; then, for
each question, a fresh ``tune`` and a ``retune`` of the search before (the traces of every
search so far reused), each from a cold start (shape-only results on meta forgotten first).
Prints both times per question and in all, their ratios, the traces each made, and whether
the two give the same search (every configuration's numbers and plan, the best, the summary
but for its counts).

    python benchmarks/bench_retune.py [--flavor 8B|70B] [--world-size 64] [--workers 1]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import fsdpviz
from fsdpviz.trace import meta_cache
from fsdpviz.tuning import Tuning

LLAMA3_TOML = """\
# torchtitan/models/llama3/train_configs/llama3_8b.toml (the keys fsdpviz reads)
[model]
name = "llama3"
flavor = "{flavor}"

[optimizer]
name = "AdamW"

[training]
local_batch_size = 1
seq_len = 8192

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[compile]
enable = false

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def same_search(a: Tuning, b: Tuning) -> bool:
    """Every configuration, number and plan the same (a plan the fresh search traced may be
    replayed in the retune, and says so), the best and the summary but for its counts."""
    if [c.label for c in a.candidates] != [c.label for c in b.candidates]:
        return False
    for x, y in zip(a.candidates, b.candidates, strict=True):
        rx, ry = x.row(), y.row()
        rx.pop("traced"), ry.pop("traced")
        dx, dy = x.report.to_dict(), y.report.to_dict()
        dx["config"].pop("replayed", None), dy["config"].pop("replayed", None)
        if rx != ry or dx != dy:
            return False
    head = re.compile(r"\(.*?the rest replayed\) in [\d.]+ s")
    sa, sb = (head.sub("", t.summary()) for t in (a, b))
    return (
        sa == sb and a.notes == b.notes and (a.best and a.best.index) == (b.best and b.best.index)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="8B", help="torchtitan's llama3 flavor: 8B, 70B")
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1, help="tune's workers (both arms)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama3.toml"
        path.write_text(LLAMA3_TOML.replace("{flavor}", args.flavor))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fsdpviz.ConfigNote)
            job = fsdpviz.from_torchtitan(path, world_size=args.world_size)
    base = {"machine": "h100", "world_size": args.world_size, "memory_budget": None}
    # the notebook's questions after the first search, each asked of the one before
    questions = [
        {"machine": "h200"},
        {"machine": "h200", "world_size": 2 * args.world_size},
        {"machine": "h100", "memory_budget": "60GiB"},
    ]
    options = {"progress": False, "workers": args.workers}
    meta_cache.clear()
    t0 = time.perf_counter()
    last = fsdpviz.tune(job, **base, **options)
    print(f"torchtitan Llama 3 {args.flavor}, workers={args.workers}")
    print(f"  tune {_args(base)}: {time.perf_counter() - t0:.1f} s, {last.traces} traces")
    fresh_total = again_total = 0.0
    same = True
    for q in questions:
        asked = {**base, **q}
        meta_cache.clear()
        t0 = time.perf_counter()
        fresh = fsdpviz.tune(job, **asked, **options)
        fresh_s = time.perf_counter() - t0
        meta_cache.clear()
        t0 = time.perf_counter()
        last = last.retune(**asked)
        again_s = time.perf_counter() - t0
        fresh_total, again_total = fresh_total + fresh_s, again_total + again_s
        same = same and same_search(last, fresh)
        print(
            f"  {_args(q)}: tune from scratch {fresh_s:.1f} s ({fresh.traces} traces), "
            f"retune {again_s:.1f} s ({last.traces} traces, {last.reused} reused): "
            f"{fresh_s / again_s:.1f}x; {len(last.candidates)} configurations"
        )
    print(
        f"  the {len(questions)} questions: tune from scratch {fresh_total:.1f} s, retune "
        f"{again_total:.1f} s: {fresh_total / again_total:.1f}x; same searches: "
        f"{'yes' if same else 'NO'}"
    )
    print(f"  {last.summary().splitlines()[0]}")


def _args(kwargs: dict[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v is not None)


if __name__ == "__main__":
    main()
