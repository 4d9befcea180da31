"""The bookkeeping both recorders share: iterations, timestamps, the ``with`` exit, the config."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar

import torch.distributed as dist

from fsdpviz.plan.torch_fsdp import installed
from fsdpviz.schema.config import Api, ReportConfig
from fsdpviz.schema.events import Event

P = ParamSpec("P")
R = TypeVar("R")

now_ns = time.perf_counter_ns


def patch(stack: ExitStack, owner: Any, name: str, value: Any) -> None:
    """Set ``owner``'s attribute ``name`` to ``value`` until ``stack`` closes (a class's own
    attribute as its ``__dict__`` holds it, so that a staticmethod is restored as one)."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, original)


def recording_config(api: Api, extra: Mapping[str, Any] | None) -> ReportConfig:
    """What a recorder knows of its run: the API and torch release, and the world size and
    rank when ``torch.distributed`` is initialised; ``extra`` adds to it (or overrides)."""
    base: dict[str, Any] = {"api": api, "torch_version": installed().version}
    if dist.is_initialized():
        base.update(world_size=dist.get_world_size(), rank=dist.get_rank())
    return ReportConfig.from_dict({**base, **(extra or {})})


class EventLog:
    """Events of finished iterations and of the one in progress, optionally timestamped.

    ``timestamps=True`` gives every event ``t`` (seconds since the recorder was
    entered) and ``duration`` (host time of the call). ``on_iteration``, when set,
    is called with the index of each iteration FSDP's final callback ends, and
    ``on_amended`` with that of an ended iteration an event of the optimizer step after it
    joined (see :meth:`_after_step`).
    """

    def __init__(self, timestamps: bool) -> None:
        self.timestamps = timestamps
        self.t0_ns = 0
        self.on_iteration: Callable[[int], None] | None = None
        self.on_amended: Callable[[int], None] | None = None
        self.iterations: list[list[Event]] = []
        self._current: list[Event] = []
        self._stack: ExitStack | None = None
        self._prefetching = 0  # > 0 while FSDP's prefetch function runs

    def _started(self, stack: ExitStack) -> None:
        """The patches are in place: remember how to undo them and start the clock."""
        self._stack = stack
        self.t0_ns = now_ns()

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        if self._current:
            self.iterations.append(self._current)
            self._current = []

    def _append(self, event: Event) -> int:
        """Append an event; its index for :meth:`_timed` (-1 without timestamps)."""
        self._current.append(event)
        return len(self._current) - 1 if self.timestamps else -1

    def _timed(self, index: int, start_ns: int) -> None:
        """Stamp event ``index`` with its start and the time its call took."""
        if index >= 0:
            end = now_ns()
            e = self._current[index]
            t, duration = (start_ns - self.t0_ns) / 1e9, (end - start_ns) / 1e9
            self._current[index] = replace(e, t=t, duration=duration)

    def _call_timed(
        self, start_ns: int, index: int, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``fn(*args, **kwargs)``, the call of event ``index`` issued at ``start_ns``: the
        event is stamped (:meth:`_timed`) however the call ends."""
        try:
            return fn(*args, **kwargs)
        finally:
            self._timed(index, start_ns)

    def _after_step(self, event: Event, start_ns: int) -> None:
        """An event of the optimizer step, issued at ``start_ns``: the end of the iteration
        FSDP's final callback ended last (as a plan has it), or of the one in progress when
        none has ended or it has begun."""
        if self.timestamps:
            end = now_ns()
            event = replace(event, t=(start_ns - self.t0_ns) / 1e9, duration=(end - start_ns) / 1e9)
        if self._current or not self.iterations:
            self._append(event)
            return
        self.iterations[-1].append(event)
        if self.on_amended is not None:
            self.on_amended(len(self.iterations) - 1)

    def _end_iteration(self) -> None:
        """FSDP's final backward callback ended an iteration."""
        self.iterations.append(self._current)
        self._current = []
        if self.on_iteration is not None:
            self.on_iteration(len(self.iterations) - 1)

    def _wrap_prefetch(self, original: Callable[P, R]) -> Callable[P, R]:
        """FSDP's prefetch function, marking the all-gathers it issues as prefetches."""

        @functools.wraps(original)
        def prefetch(*args: P.args, **kwargs: P.kwargs) -> R:
            self._prefetching += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._prefetching -= 1

        return prefetch
