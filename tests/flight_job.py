"""Real FSDP jobs on gloo (CPU) that hang on purpose, each rank dumping torch's flight recorder.

``python tests/flight_job.py OUT_DIR [SCENARIO ...]`` runs every scenario of
:data:`SCENARIOS` (or the ones named) at once and writes ``OUT_DIR/<scenario>/rank<r>``
(the pickle ``torch._C._distributed_c10d._dump_fr_trace()`` returns, written by
``fsdpviz.dump_flight_recorder``). Exit status 0 when every rank wrote its dump.

How a hang is made fast and deterministic: every iteration starts with a barrier on the
store (not a collective, so not recorded); iterations before the one that goes wrong run
under a 60 s collective timeout, that one under :data:`TIMEOUT_S`. A rank whose collective
is never matched times out, dumps, and waits on the store until every rank has dumped,
then leaves with ``os._exit`` (see ``rank_exit.py``). gloo aborts the process (SIGABRT)
when two ranks exchange collectives of different sizes, so in a ``guard``-ed scenario every
rank posts each collective's kind and size on the store before issuing it, and the rank that
goes wrong, before each of its own, reads what the others posted for the same collective:
where they differ (or the others posted nothing) it waits until they have timed out and
dumped. Its collective is then recorded and fails at once ("connection closed"), as a
mismatch hangs under NCCL.

Ranks are forked from one forkserver that imported torch once; the processes of all
scenarios run together (most of their time is the waiting for a timeout).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

TIMEOUT_S = 3.0
ITERATIONS = 3


class Block(nn.Module):
    """``Linear(8, hidden) -> relu -> Linear(hidden, 8)``: 17 * hidden + 8 parameters."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(8, hidden)
        self.down = nn.Linear(hidden, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Adapter(nn.Module):
    """Maps 16 features to 8; runs only for wider inputs (a data-dependent branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Model(nn.Module):
    """An adapter for 16-wide inputs, then three blocks: ``blocks.0`` (76 parameters) and
    ``blocks.1``, ``blocks.2`` of the same size (144): their collectives look alike."""

    def __init__(self) -> None:
        super().__init__()
        self.adapter = Adapter()
        self.blocks = nn.ModuleList([Block(4), Block(8), Block(8)])
        self.skip: int | None = None  # a block this rank leaves out of its forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 8:
            x = self.adapter(x)
        for i, block in enumerate(self.blocks):
            if i != self.skip:
                x = block(x)
        return x


UNITS = ("adapter", "blocks.0", "blocks.1", "blocks.2")


def inputs(width: int = 8) -> torch.Tensor:
    return torch.randn(4, width, generator=torch.Generator().manual_seed(0))


def model_and_inputs() -> tuple[Model, torch.Tensor]:
    """The job's model and a batch, as ``fsdpviz report`` / ``fsdpviz doctor`` take them."""
    torch.manual_seed(0)
    return Model(), inputs()


@dataclass(frozen=True)
class Scenario:
    """One job: ``api``, ranks, and what goes wrong on ``rank`` in iteration ``at``."""

    api: str  # "fsdp1" | "fsdp2" | "hsdp" (FSDP2 on a 2 x 2 replicate x shard mesh)
    world_size: int = 2
    wrong: str = ""  # "" | "skip" | "extra" | "shape"
    rank: int = 1
    at: int = 1
    skip: int = 1  # the block "skip" leaves out
    buffer: int = 2000  # TORCH_FR_BUFFER_SIZE
    guard: bool = False  # hold back a collective that differs from the others' (see above)
    json: bool = False  # also dump the JSON form, to OUT_DIR/<scenario>-json/rank<r>.json


SCENARIOS: dict[str, Scenario] = {
    "fsdp1-healthy": Scenario("fsdp1", json=True),
    "fsdp2-healthy": Scenario("fsdp2"),
    # blocks.1 has a twin (blocks.2): nothing differs in size where the ranks part
    "fsdp1-skip": Scenario("fsdp1", wrong="skip", skip=1, guard=True, json=True),
    # blocks.0 is unique: the rank's next all-gather is of another size
    "fsdp2-skip": Scenario("fsdp2", wrong="skip", skip=0, guard=True),
    "fsdp1-extra": Scenario("fsdp1", wrong="extra"),
    "fsdp2-extra": Scenario("fsdp2", wrong="extra"),
    "fsdp1-shape": Scenario("fsdp1", wrong="shape", guard=True),
    "fsdp2-shape": Scenario("fsdp2", wrong="shape", guard=True),
    "hsdp-extra": Scenario("hsdp", world_size=4, wrong="extra", rank=3),
    # a ring buffer of 10 entries: the dumps keep iteration 2's last collectives only
    "fsdp1-ring": Scenario("fsdp1", wrong="extra", buffer=10),
}


def build(s: Scenario, world_size: int) -> tuple[nn.Module, Model]:
    """The wrapped model and the plain one inside it."""
    torch.manual_seed(0)
    model = Model()
    if s.api == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        wrapped = FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Block, Adapter}),
            device_id=torch.device("cpu"),
        )
        return wrapped, model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = None
    if s.api == "hsdp":
        mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("replicate", "shard"))
    for name in UNITS:
        fully_shard(model.get_submodule(name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, model


def run_rank(name: str, rank: int, out: str, store_path: str) -> None:
    s = SCENARIOS[name]
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(s.buffer)
    warnings_off()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store_path}",
        rank=rank,
        world_size=s.world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    import fsdpviz

    store = dist.distributed_c10d._get_default_store()
    ws = s.world_size
    model, plain = build(s, ws)
    wrong_here = s.wrong and rank == s.rank
    iterations = ITERATIONS + (1 if wrong_here and s.wrong == "extra" else 0)
    guard = _Guard(store, rank) if s.guard else None
    try:
        for it in range(iterations):
            store.set(f"it{it}-{rank}", "1")
            if it < ITERATIONS:
                store.wait([f"it{it}-{r}" for r in range(ws)], datetime.timedelta(seconds=60))
            if it == (ITERATIONS if s.wrong == "extra" else s.at):
                dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=TIMEOUT_S))
                for g in _subgroups():
                    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=TIMEOUT_S), g)
            here = wrong_here and it == s.at
            if guard is not None and here:
                guard.active = True
            plain.skip = s.skip if here and s.wrong == "skip" else None
            width = 16 if here and s.wrong == "shape" else 8
            model(inputs(width)).sum().backward()
    except Exception as exc:  # the collective that timed out: what the dump is for
        if os.environ.get("FLIGHT_JOB_DEBUG"):
            print(f"{name} rank {rank}: {time.time():.2f} {str(exc)[:200]}", file=sys.stderr)
    finally:
        if guard is not None:
            guard.remove()
    fsdpviz.dump_flight_recorder(Path(out) / name)
    if s.json:
        fsdpviz.dump_flight_recorder(Path(out) / f"{name}-json", json=True)
    store.set(f"dumped{rank}", "1")
    store.wait([f"dumped{r}" for r in range(ws)], datetime.timedelta(seconds=60))
    sys.stdout.flush()
    os._exit(0)  # see rank_exit.py: gloo's threads outlive the process group


_GUARDED = """
def guarded(*args, **kwargs):
    guard.check(name, args, kwargs)
    return fn(*args, **kwargs)
"""


class _Guard:
    """Posts each collective this rank issues (``rank/group/count -> kind:numel``); while
    ``active``, holds one the other members of its group issue differently (or not at all)
    until they have dumped. (torch < 2.13 has no ``*_single`` collectives.)"""

    NAMES = (
        "all_gather", "all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
        "reduce_scatter_tensor", "all_reduce",
    )  # fmt: skip

    def __init__(self, store: Any, rank: int) -> None:
        self.store, self.rank, self.active = store, rank, False
        self.counts: dict[str, int] = {}
        self.originals = {n: getattr(dist, n) for n in self.NAMES if hasattr(dist, n)}
        for name, fn in self.originals.items():
            setattr(dist, name, self._wrap(name, fn))

    def remove(self) -> None:
        for name, fn in self.originals.items():
            setattr(dist, name, fn)

    def _wrap(self, name: str, fn: Any) -> Any:
        # compiled under a name like "<...>", so that the dumps' stacks read as without it:
        # the innermost frame of the job's own code stays the model's or the training loop's
        scope = {"guard": self, "name": name, "fn": fn}
        exec(compile(_GUARDED, "<flight_job guard>", "exec"), scope)
        return scope["guarded"]

    def check(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        numel = tensors[-1].numel() if tensors else 0
        group = kwargs.get("group") or next(
            (a for a in args if isinstance(a, dist.ProcessGroup)), None
        )
        group = group or dist.distributed_c10d._get_default_group()
        key = dist.distributed_c10d._get_process_group_name(group)
        count = self.counts.get(key, 0) + 1
        self.counts[key] = count
        mine = f"{name}:{numel}"
        self.store.set(f"{self.rank}/{key}/{count}", mine)
        if self.active:
            others = [r for r in dist.get_process_group_ranks(group) if r != self.rank]
            if any(self._theirs(r, key, count) != mine for r in others):
                wait = [f"dumped{r}" for r in others]
                self.store.wait(wait, datetime.timedelta(seconds=60))

    def _theirs(self, rank: int, key: str, count: int) -> str | None:
        try:
            self.store.wait([f"{rank}/{key}/{count}"], datetime.timedelta(seconds=2 * TIMEOUT_S))
        except RuntimeError:
            return None  # it never issued it
        return bytes(self.store.get(f"{rank}/{key}/{count}")).decode()


def _subgroups() -> list[Any]:
    groups = []
    for pg in list(dist.distributed_c10d._world.pg_map):
        if pg is not dist.distributed_c10d._get_default_group():
            groups.append(pg)
    return groups


def warnings_off() -> None:
    import warnings

    warnings.simplefilter("ignore")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def _rank_entry(name: str, rank: int, out: str, store_path: str) -> None:
    try:
        run_rank(name, rank, out, store_path)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def main(argv: list[str]) -> int:
    import multiprocessing as mp

    out = Path(argv[0])
    names = argv[1:] or list(SCENARIOS)
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed.fsdp", "fsdpviz", "__main__"])
    procs: list[tuple[str, int, Any]] = []
    for name in names:
        s = SCENARIOS[name]
        store = out / f".store-{name}"
        for rank in range(s.world_size):
            p = ctx.Process(target=_rank_entry, args=(name, rank, str(out), str(store)))
            p.start()
            procs.append((name, rank, p))
    deadline = time.monotonic() + 150
    failed = []
    for name, rank, p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            failed.append(f"{name} rank {rank}: still running after 150 s")
        elif p.exitcode != 0:
            failed.append(f"{name} rank {rank}: exit code {p.exitcode}")
    for name, rank, _ in procs:
        if not (out / name / f"rank{rank}").is_file():
            failed.append(f"{name} rank {rank}: no dump")
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
