"""What a newcomer waits for: ``import fsdpviz``, a first ``analyze``, and a mistake at the
command line, each in a fresh interpreter, against the floor under it, side by side.

Arms, alternated so that all see the same machine load (each a new ``python`` process):

- ``python``: the interpreter starting (``pass``), the floor of every other arm;
- ``import torch``: what planning cannot do without;
- ``import fsdpviz``: target at most ``python`` + 0.5 x (``import torch`` - ``python``):
  fsdpviz's public names load when first used, so importing it loads no torch at all;
- ``first analyze``: ``import fsdpviz`` and ``fsdpviz.analyze`` of a small FSDP2 model on
  the meta device, against ``torch + trace``: ``import torch`` and the same model's forward
  and backward on meta (target: at most 1.6x: what analyze loads beyond torch, the tracing,
  the plan and the cost model);
- ``CLI mistake``: ``fsdpviz report mymodule:build --wrold-size 8`` answered (exit 2), against
  ``python`` (target: at most ``python`` + 0.5 s: the flags are parsed and checked before
  torch is loaded).

``--baseline DIR`` runs every arm on another checkout too (``PYTHONPATH=DIR``, e.g. the
tree before a change), in the same alternation, and prints both.

    python benchmarks/bench_import.py [--repeats 5] [--baseline /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODEL = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

with torch.device("meta"):
    model = Net()
x = torch.zeros(8, 256, device="meta")
"""

ARMS: dict[str, list[str]] = {
    "python": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import fsdpviz": ["-c", "import fsdpviz"],
    "torch + trace": ["-c", MODEL + "model(x).sum().backward()"],
    "first analyze": [
        "-c",
        "import fsdpviz\n"
        + MODEL
        + "fsdpviz.analyze(model, x, fully_shard=[Block], progress=False)",
    ],
    "CLI mistake": ["-m", "fsdpviz", "report", "mymodule:build", "--wrold-size", "8"],
}
EXPECTED_EXIT = {"CLI mistake": 2}


def run(arm: str, tree: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    proc = subprocess.run(  # (not from a checkout: its fsdpviz would come first on the path)
        [sys.executable, *ARMS[arm]],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != EXPECTED_EXIT.get(arm, 0):
        raise RuntimeError(f"{arm} on {tree} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another checkout, measured alongside")
    args = ap.parse_args()
    trees = {"this tree": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    times: dict[tuple[str, str], list[float]] = {(t, a): [] for t in trees for a in ARMS}
    for tree in trees.values():  # warm the file cache
        for arm in ARMS:
            run(arm, tree)
    for _ in range(args.repeats):
        for name, tree in trees.items():
            for arm in ARMS:
                times[(name, arm)].append(run(arm, tree))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median of {args.repeats} fresh processes each, seconds (alternated):")
    print(f"{'':16}" + "".join(f"{t:>12}" for t in trees))
    for arm in ARMS:
        print(f"{arm:16}" + "".join(f"{med[(t, arm)]:12.2f}" for t in trees))
    for t in trees:
        py, torch_, fv = med[(t, "python")], med[(t, "import torch")], med[(t, "import fsdpviz")]
        share = (fv - py) / max(torch_ - py, 1e-9)
        first = med[(t, "first analyze")] / med[(t, "torch + trace")]
        mistake = med[(t, "CLI mistake")] - py
        print(
            f"{t}: import fsdpviz costs {share:.2f}x what import torch costs (target <= 0.5); "
            f"first analyze / torch + trace = {first:.2f}x (target <= 1.6); "
            f"a CLI mistake answered {mistake:.2f} s after the interpreter started "
            f"(target <= 0.5 s)"
        )


if __name__ == "__main__":
    main()
