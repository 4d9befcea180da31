"""``Tuning.retune`` for a second machine against a fresh ``fsdpviz.tune`` there, side by side
in one process.

The job is torchtitan's Llama 3 8B as its ``llama3_8b.toml`` ships it (``from_torchtitan``:
FSDP2, bf16 parameters, selective checkpointing, 1 x 8192 tokens per rank). It is tuned on
``--world-size`` H100s first; then, for ``--machine``, a fresh ``tune`` and a ``retune`` of
the first search, each from a cold start (shape-only results on meta forgotten first). Prints
both times, their ratio, the traces each made, and whether the two give the same search (every
configuration's numbers and plan, the best, the summary but for its counts).

    python benchmarks/bench_retune.py [--machine h200] [--world-size 64] [--workers 1]
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

LLAMA3_8B_TOML = """\
# torchtitan/models/llama3/train_configs/llama3_8b.toml (the keys fsdpviz reads)
[model]
name = "llama3"
flavor = "8B"

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
    parser.add_argument("--machine", default="h200", help="the second machine")
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1, help="tune's workers (both arms)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama3_8b.toml"
        path.write_text(LLAMA3_8B_TOML)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fsdpviz.ConfigNote)
            job = fsdpviz.from_torchtitan(path, world_size=args.world_size)
    options = {"world_size": args.world_size, "progress": False, "workers": args.workers}

    meta_cache.clear()
    t0 = time.perf_counter()
    first = fsdpviz.tune(job, machine="h100", **options)
    first_s = time.perf_counter() - t0

    meta_cache.clear()
    t0 = time.perf_counter()
    fresh = fsdpviz.tune(job, machine=args.machine, **options)
    fresh_s = time.perf_counter() - t0

    meta_cache.clear()
    t0 = time.perf_counter()
    again = first.retune(machine=args.machine)
    again_s = time.perf_counter() - t0

    n = len(fresh.candidates)
    print(f"torchtitan Llama 3 8B on {args.world_size} GPUs, workers={args.workers}")
    print(f"  tune on h100 (the first search):   {first_s:6.1f} s, {first.traces} traces")
    print(f"  tune on {args.machine} from scratch:        {fresh_s:6.1f} s, {fresh.traces} traces, "
          f"{n} configurations")  # fmt: skip
    print(f"  retune(machine={args.machine!r}):         {again_s:6.1f} s, {again.traces} traces, "
          f"{again.reused} reused, {len(again.candidates)} configurations")  # fmt: skip
    print(f"  from scratch / retune: {fresh_s / again_s:.1f}x")
    print(f"  same search: {'yes' if same_search(again, fresh) else 'NO'}")
    print(f"  {again.summary().splitlines()[0]}")


if __name__ == "__main__":
    main()
