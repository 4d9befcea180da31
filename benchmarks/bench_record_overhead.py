"""What ``fsdpviz.record`` costs per training step, measured side by side.

Two gloo ranks on the CPU train a small transformer (FSDP1, one unit per
encoder layer) and alternate, round after round, blocks of steps without
recording, with ``fsdpviz.record`` (every event and module enter/exit, one JSON
line written per step) and, for reference, with torch's ``ModTracker``
(module tracking alone). Step time is forward + backward + optimizer step; rank
0 prints the median of each arm and the ratios.

Run: ``python benchmarks/bench_record_overhead.py [--rounds 12] [--steps 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed._tools.mod_tracker import ModTracker

import fsdpviz

VOCAB, D_MODEL, HEADS, LAYERS, BATCH, SEQ = 512, 128, 4, 4, 8, 32


class SmallTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(LAYERS)
        )
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def _arms(model: nn.Module, out_dir: str) -> dict[str, Callable[[], Any]]:
    return {
        "plain": contextlib.nullcontext,
        "fsdpviz.record": lambda: fsdpviz.record(model, out_dir=out_dir),
        "ModTracker": ModTracker,
    }


def _worker(rank: int, world_size: int, port: int, rounds: int, steps: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    model = FSDP(
        SmallTransformer(),
        auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer}),
        device_id=torch.device("cpu"),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    target = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)

    def step() -> float:
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as out_dir:
        arms = _arms(model, out_dir)
        for _ in range(5):
            step()
        for r in range(rounds):
            names = list(arms) if r % 2 == 0 else list(reversed(arms))
            for name in names:
                with arms[name]():
                    times.setdefault(name, []).extend(step() for _ in range(steps))
        last = fsdpviz.RecordedRun.load(out_dir).rank(rank)
    if rank == 0:
        events = sum(len(it) for it in last.iterations) / len(last.iterations)
        modules = sum(len(it) for it in last.module_events) / len(last.module_events)
        base = statistics.median(times["plain"])
        print(
            f"FSDP1, {world_size} gloo ranks, {LAYERS}-layer transformer (d={D_MODEL}, "
            f"{BATCH}x{SEQ} tokens), {rounds} alternating rounds of {steps} steps per arm; "
            f"fsdpviz.record wrote {events:.0f} FSDP events and {modules:.0f} module events "
            "per step"
        )
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:15s} median step {med * 1e3:8.2f} ms   ratio {med / base:.3f}")
    dist.destroy_process_group()
    # gloo's threads outlive destroy_process_group; a normal exit runs C++ static
    # destructors under them and sometimes aborts (tests/rank_exit.py): leave without them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, args.rounds, args.steps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
