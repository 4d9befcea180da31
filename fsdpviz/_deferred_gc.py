"""No garbage-collector pause inside a short answer (a re-plan, a redraw).

A full cyclic collection over a kernel that holds a model, its stored traces and a
dozen reports takes 300 ms or more, longer than the answer itself. :func:`answering`
pauses automatic collection while the answer is computed, :func:`collection_deferred`
while a model is traced; in a kernel (a running asyncio loop) one full collection runs
once it has been idle for ``IDLE_GC_S`` seconds, and an answer that starts meanwhile
postpones it again.

Example::

    with answering():
        report = planner.plan(options)
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

__all__ = [
    "IDLE_GC_S",
    "answering",
    "collection_deferred",
    "deferring_collection",
    "running_loop",
]

IDLE_GC_S = 0.3
# The interpreter's thread switch interval inside an answer (Python's default is 5 ms): the
# kernel's IOPub thread, which sends the widgets' messages, gets the interpreter lock soon
# after each message is queued, so "busy" and each view's data leave while the answer goes on.
ANSWER_SWITCH_S = 0.0005
_pending_gc: asyncio.TimerHandle | None = None


@contextmanager
def answering() -> Iterator[None]:
    """No automatic cyclic GC inside the block, and the interpreter lock handed to other
    threads often; one collection when the kernel is idle again."""
    with collection_deferred() as deferred:
        if not deferred:  # nested, or the user turned collection off: leave it be
            yield
            return
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, ANSWER_SWITCH_S))
        try:
            yield
        finally:
            sys.setswitchinterval(switch)


@contextmanager
def collection_deferred() -> Iterator[bool]:
    """No automatic cyclic GC inside the block; one collection when the kernel is idle again.
    Yields whether it deferred it (not when nested, or when the user turned collection off).

    A trace makes and drops objects by the hundred thousand: the collections they set off
    walk the model's copy and autograd's graph again and again, a tenth of the trace, and
    free none of the storages it counts (those die by reference count)."""
    global _pending_gc
    if _pending_gc is not None:
        _pending_gc.cancel()
        _pending_gc = None
    if not gc.isenabled():  # nested, or the user turned it off: leave it be
        yield False
        return
    gc.disable()
    try:
        yield True
    finally:
        gc.enable()
        loop = running_loop()
        if loop is not None:
            _pending_gc = loop.call_later(IDLE_GC_S, _collect)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def deferring_collection(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run inside :func:`collection_deferred`: a cost model's walk makes objects by the
    hundred thousand (every event's record), all freed by reference count, and the
    collections they set off would walk every report the process holds again and again."""

    @functools.wraps(fn)
    def deferred(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with collection_deferred():
            return fn(*args, **kwargs)

    return deferred


def _collect() -> None:
    global _pending_gc
    _pending_gc = None
    gc.collect()


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop (a kernel's), or ``None`` in a script."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
