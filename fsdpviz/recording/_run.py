"""``fsdpviz.record``: record a real FSDP run on every rank into a directory.

Each rank writes its own files (see :mod:`fsdpviz.recording._writer`): a header
when recording starts and one line per iteration, at the end of that
iteration (FSDP's final backward callback). Nothing is written on the hot path
in between; module enter/exit events wait in a list until then.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

from fsdpviz.recording._fsdp1 import FSDP1Recorder
from fsdpviz.recording._fsdp2 import FSDP2Recorder
from fsdpviz.recording._modules import ModuleEventRecorder
from fsdpviz.recording._recorded import rank_report
from fsdpviz.recording._writer import (
    FORMAT,
    FORMAT_VERSION,
    RankWriter,
    read_all,
    read_rank,
    write_all,
)
from fsdpviz.schema.events import Event
from fsdpviz.schema.report import SCHEMA_VERSION, Report, Unit


class ScheduleRecorder(Protocol):
    """What :func:`record` needs from the recorder of one FSDP flavour.

    :class:`~fsdpviz.recording.FSDP1Recorder` (``timestamps=True``) provides it;
    an FSDP2 recorder plugs in by providing the same and being returned by
    :func:`schedule_recorder`.
    """

    iterations: list[list[Event]]
    on_iteration: Callable[[int], None] | None
    on_amended: Callable[[int], None] | None
    t0_ns: int

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def units(self) -> list[Unit]: ...

    def forward_order(self) -> list[str]: ...


def schedule_recorder(model: nn.Module) -> tuple[str, ScheduleRecorder]:
    """The FSDP flavour ``model`` is wrapped in and a timestamping recorder for it."""
    modules = list(model.modules())
    if any(isinstance(m, FullyShardedDataParallel) for m in modules):
        return "FSDP1", FSDP1Recorder(model, timestamps=True)
    if any(isinstance(m, FSDPModule) for m in modules):
        return "FSDP2", FSDP2Recorder(model, timestamps=True)
    raise TypeError(
        f"fsdpviz.record needs an FSDP model; {type(model).__name__} contains no "
        "FullyShardedDataParallel (FSDP1) or fully_shard (FSDP2) module. Wrap it first, "
        "then record the wrapped model"
    )


def _dist_info() -> tuple[int, int, str | None]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    return 0, 1, None


class RunRecorder:
    """Records this rank of a real FSDP run; returned by :func:`fsdpviz.record`.

    ``rank``, ``world_size`` and ``out_dir`` say where the files go;
    ``iterations_written`` counts the iterations on disk so far.
    """

    def __init__(
        self, model: nn.Module, out_dir: str | Path, *, gather: bool, modules: bool
    ) -> None:
        self.api, self._schedule = schedule_recorder(model)
        self._module_events = ModuleEventRecorder(model) if modules else None
        self.out_dir = Path(out_dir)
        self.gather = gather
        self.rank, self.world_size, self.backend = _dist_info()
        self.iterations_written = 0
        self._writer: RankWriter | None = None
        self._stack: ExitStack | None = None
        self._header: dict[str, Any] = {}
        self._used = False
        self._last_modules: list[dict[str, Any]] = []  # the module events last written

    def __enter__(self) -> RunRecorder:
        if self._used:
            raise RuntimeError(
                "a recorder records one block; call fsdpviz.record(model, out_dir=...) again "
                "for another recording"
            )
        self._used = True
        writer = RankWriter(self.out_dir, self.rank)
        stack = ExitStack()
        try:
            stack.enter_context(self._schedule)
            started = time.time()
            if self._module_events is not None:
                stack.enter_context(self._module_events)
            self._schedule.on_iteration = self._write_iteration
            self._schedule.on_amended = self._amend_iteration
            self._header = {
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "schema_version": SCHEMA_VERSION,
                "api": self.api,
                "rank": self.rank,
                "world_size": self.world_size,
                "backend": self.backend,
                "started_unix": started,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "finished": False,
                "units": [u.to_dict() for u in self._schedule.units()],
                "forward_order": self._schedule.forward_order(),
            }
            writer.header(self._header)
        except BaseException:
            stack.close()
            writer.close()
            raise
        self._writer, self._stack = writer, stack
        return self

    def _write_iteration(self, index: int, complete: bool = True) -> None:
        if self._writer is None:
            return
        origin = self._schedule.t0_ns
        modules = self._module_events.take(origin) if self._module_events is not None else []
        self._last_modules = modules
        self._writer.iteration(
            {
                "iteration": index,
                "complete": complete,
                "events": [e.to_dict() for e in self._schedule.iterations[index]],
                "module_events": modules,
            }
        )
        self.iterations_written = index + 1
        if index == 0:
            self._update_header()

    def _amend_iteration(self, index: int) -> None:
        """An event of the optimizer step joined iteration ``index``, written already: its
        line again, whole, which replaces the first when read back (see
        :func:`~fsdpviz.recording._writer.read_rank`)."""
        if self._writer is None or index != self.iterations_written - 1:
            return
        self._writer.iteration(
            {
                "iteration": index,
                "complete": True,
                "events": [e.to_dict() for e in self._schedule.iterations[index]],
                "module_events": self._last_modules,
            }
        )

    def _update_header(self, *, finished: bool | None = None) -> None:
        """Write the header again with the units and forward order made so far (and, at the
        end, whether the run finished)."""
        if self._writer is not None:
            self._header.update(
                {} if finished is None else {"finished": finished},
                units=[u.to_dict() for u in self._schedule.units()],
                forward_order=self._schedule.forward_order(),
            )
            self._writer.header(self._header)

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._stack is None:
            return
        try:
            self._stack.close()
            for i in range(self.iterations_written, len(self._schedule.iterations)):
                self._write_iteration(i, complete=False)
            self._update_header(finished=exc_type is None)
        finally:
            self._schedule.on_iteration = self._schedule.on_amended = None
            self._stack = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        if self.gather and exc_type is None:
            self._gather()

    def _gather(self) -> None:
        """Send every rank's files to rank 0, which writes them into its ``out_dir``."""
        if self.world_size == 1:
            return
        payload = read_all(self.out_dir, self.rank)
        received: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(payload, received, dst=0)
        for r, item in enumerate(received or []):
            if r != self.rank and item is not None:
                write_all(self.out_dir, r, *item)

    def report(self) -> Report:
        """This rank's recording so far, read back from ``out_dir``."""
        return rank_report(read_rank(self.out_dir, self.rank))


def record(
    model: nn.Module,
    out_dir: str | Path = "fsdpviz-run",
    *,
    gather: bool = False,
    modules: bool = True,
) -> RunRecorder:
    """Record a real FSDP run on this rank into ``out_dir``; call it on every rank.

    ``model`` is already wrapped in ``FullyShardedDataParallel``. Inside the
    ``with`` block every all-gather, free, reduce-scatter and prefetch is
    recorded with its wall-clock time, pass and unit FQN, plus each module's
    forward/backward enter and exit (``modules=False`` skips those). Each rank
    writes ``rank{r}.json`` / ``rank{r}.jsonl`` into ``out_dir`` at the end of
    every iteration, so a crash keeps every finished iteration. With
    ``gather=True`` rank 0 also collects every rank's files into its own
    ``out_dir`` when the block ends (for directories that are not shared; every
    rank must then leave the block without an exception).

    Example::

        with fsdpviz.record(model, out_dir="fsdpviz-run"):
            for batch in batches:
                model(batch).sum().backward(); opt.step(); opt.zero_grad()
        run = fsdpviz.load("fsdpviz-run")     # a RecordedRun: run.ranks[r] is a Report
    """
    return RunRecorder(model, out_dir, gather=gather, modules=modules)
