"""Real FSDP1 jobs for the recording tests; run with torchrun on the CPU (gloo).

``torchrun --nproc_per_node N tests/record_job.py MODES OUT_DIR`` where MODES is a
comma-separated list of

- ``case:<name>``: record case ``<name>`` of :func:`cases` into ``OUT_DIR/<name>``
  (3 training steps; cases in ``PROFILED`` are also profiled into
  ``OUT_DIR/<name>/trace-rank<r>.json``);
- ``gather``: record with ``gather=True`` into per-rank directories
  ``OUT_DIR/gather/local<r>`` (as on nodes that share no file system);
- ``diverge``: the last rank runs the blocks in another order (a rank-dependent
  branch in forward), recorded into ``OUT_DIR/diverge``;
- ``crash``: the last rank kills itself in the forward of iteration 3, after 3
  finished iterations, recorded into ``OUT_DIR/crash``;
- ``fsdp2:<name>``: record FSDP2 case ``<name>`` of :func:`fsdp2_cases` into
  ``OUT_DIR/<name>``.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import handwritten_models as hm
import torch
import torch.distributed as dist
from rank_exit import leave_rank
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz

ITERATIONS = 3
CRASH_ITERATION = 3


class RankBranch(hm.Stack):
    """The last rank runs blocks 1 and 2 in swapped order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = dist.get_rank() == dist.get_world_size() - 1
        h = self.inp(x)
        for i in (0, 2, 1, 3) if last else (0, 1, 2, 3):
            h = self.blocks[i](h)
        return self.head(h)


def inputs() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


def cases() -> dict[str, tuple[Callable[[], nn.Module], dict[str, Any]]]:
    """name -> (model factory, FSDP kwargs); built with ``torch.manual_seed(0)`` first."""
    block = ModuleWrapPolicy({hm.Block})
    return {
        "stack-post-fwd": (
            hm.Stack,
            {
                "auto_wrap_policy": block,
                "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
                "forward_prefetch": True,
            },
        ),
        "nested-grad-op": (
            hm.Nested,
            {
                "auto_wrap_policy": ModuleWrapPolicy({hm.Block, hm.Outer}),
                "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP,
                "use_orig_params": True,
            },
        ),
        "twice-no-shard": (
            hm.CalledTwice,
            {"auto_wrap_policy": block, "sharding_strategy": ShardingStrategy.NO_SHARD},
        ),
    }


def fsdp2_cases() -> dict[
    str, tuple[Callable[[], nn.Module], list[tuple[str, ...]], dict[str, Any]]
]:
    """name -> (model factory, fully_shard calls before the root, FSDP2 options)."""
    blocks = [(f"blocks.{i}",) for i in range(4)]
    return {
        "fsdp2-stack": (hm.Stack, blocks, {"forward_prefetch": {"blocks.0": ["blocks.1"]}}),
        "fsdp2-twice-grouped": (hm.CalledTwice, [*blocks, ("inp", "head")], {}),
    }


def wrap_fsdp2(
    build: Callable[[], nn.Module], calls: list[tuple[str, ...]], kwargs: dict[str, Any]
) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = build()
    mods = dict(model.named_modules())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for names in [*calls, ("",)]:
        targets = [mods[n] for n in names]
        fully_shard(targets if len(targets) > 1 else targets[0], mesh=mesh)
    for src, dsts in kwargs.get("forward_prefetch", {}).items():
        mods[src].set_modules_to_forward_prefetch([mods[d] for d in dsts])  # type: ignore[operator]
    return model


# case -> profiler schedule: None profiles every step, (wait, active) uses ProfilerStep spans
PROFILED: dict[str, tuple[int, int] | None] = {"stack-post-fwd": (1, 2), "twice-no-shard": None}


def wrap(build: Callable[[], nn.Module], kwargs: dict[str, Any]) -> FSDP:
    torch.manual_seed(0)
    return FSDP(build(), device_id=torch.device("cpu"), **kwargs)


def train(model: nn.Module, steps: int, after_step: Callable[[], Any] = lambda: None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = inputs()
    for _ in range(steps):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        after_step()


def record_case(name: str, out: Path) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    build, kwargs = cases()[name]
    model = wrap(build, kwargs)
    if name not in PROFILED:
        with fsdpviz.record(model, out_dir=out / name):
            train(model, ITERATIONS)
        return
    trace = out / name / f"trace-rank{dist.get_rank()}.json"
    plan = PROFILED[name]
    with (
        profile(
            activities=[ProfilerActivity.CPU],
            schedule=None if plan is None else schedule(wait=plan[0], warmup=0, active=plan[1]),
            on_trace_ready=None if plan is None else (lambda p: p.export_chrome_trace(str(trace))),
        ) as prof,
        fsdpviz.record(model, out_dir=out / name),
    ):
        train(model, ITERATIONS, after_step=prof.step if plan is not None else lambda: None)
    if plan is None:
        prof.export_chrome_trace(str(trace))


def run_mode(mode: str, out: Path) -> None:
    last = dist.get_rank() == dist.get_world_size() - 1
    if mode.startswith("case:"):
        record_case(mode.removeprefix("case:"), out)
    elif mode.startswith("fsdp2:"):
        name = mode.removeprefix("fsdp2:")
        model = wrap_fsdp2(*fsdp2_cases()[name])
        with fsdpviz.record(model, out_dir=out / name):
            train(model, ITERATIONS)
    elif mode == "gather":
        model = wrap(*cases()["stack-post-fwd"])
        with fsdpviz.record(model, out_dir=out / "gather" / f"local{dist.get_rank()}", gather=True):
            train(model, ITERATIONS)
    elif mode == "diverge":
        model = wrap(RankBranch, {"auto_wrap_policy": ModuleWrapPolicy({hm.Block})})
        with fsdpviz.record(model, out_dir=out / "diverge"):
            train(model, ITERATIONS)
    elif mode == "crash":
        model = wrap(*cases()["stack-post-fwd"])
        with fsdpviz.record(model, out_dir=out / "crash") as rec:

            def die(module: nn.Module, args: Any) -> None:
                if last and rec.iterations_written == CRASH_ITERATION:
                    os.kill(os.getpid(), signal.SIGKILL)

            model.module.blocks[2].register_forward_pre_hook(die)
            train(model, CRASH_ITERATION + 2)
    else:
        raise SystemExit(f"unknown mode {mode!r}: use case:<name>, gather, diverge or crash")


def main(modes: str, out: Path) -> None:
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    try:
        for mode in modes.split(","):
            run_mode(mode, out)
    except BaseException:
        dist.destroy_process_group()
        raise


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    leave_rank()  # every file is written and closed: see rank_exit.py
