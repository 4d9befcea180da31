"""Keeping the kernel's answers short: work deferred until after an answer, and no GC pause in it.

In a notebook the widgets' callbacks run on the kernel's asyncio loop. An answer to
a control change (re-plan, redraw) should reach the browser in a fraction of a
second, so:

- :func:`answering` keeps Python's cyclic garbage collector out of the answer: a
  full collection over a kernel that holds a model, its stored traces and a dozen
  reports takes 300 ms or more. Automatic collection is paused while the answer is
  computed, and one full collection runs once the kernel has been idle for a moment
  (``IDLE_GC_S``); an answer that starts meanwhile postpones it again.
- :class:`Deferred` runs work after the answer has been sent (the linked views of a
  re-plan, a trace for the memory curve, warming a stored trace). A newer request
  under the same key replaces a pending one. Outside a running event loop (a script,
  a test) the work runs at once, or not at all for ``idle_only`` work, which only
  exists to hide latency in a kernel.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["IDLE_GC_S", "Deferred", "answering"]

IDLE_GC_S = 0.3
_pending_gc: asyncio.TimerHandle | None = None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@contextmanager
def answering() -> Iterator[None]:
    """No automatic cyclic GC inside the block; one collection when the kernel is idle again."""
    global _pending_gc
    if _pending_gc is not None:
        _pending_gc.cancel()
        _pending_gc = None
    if not gc.isenabled():  # nested, or the user turned it off: leave it be
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        loop = _running_loop()
        if loop is not None:
            _pending_gc = loop.call_later(IDLE_GC_S, _collect)


def _collect() -> None:
    global _pending_gc
    _pending_gc = None
    gc.collect()


class Deferred:
    """Work run after the current answer, one pending call per key.

    ``guard`` wraps each call (e.g. :meth:`ErrorOutput.guard`, so errors show under
    the widget).
    """

    def __init__(self, guard: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self._guard = guard
        self._handles: dict[str, asyncio.Handle] = {}

    def run(
        self,
        key: str,
        fn: Callable[..., Any],
        *args: Any,
        delay: float = 0.0,
        idle_only: bool = False,
    ) -> None:
        """``fn(*args)`` after ``delay`` seconds, replacing a pending call under ``key``."""
        self.cancel(key)
        loop = _running_loop()
        if loop is None:
            if not idle_only:
                self._guard(fn)(*args)
            return

        def call() -> None:
            self._handles.pop(key, None)
            with answering():
                self._guard(fn)(*args)

        self._handles[key] = loop.call_later(delay, call)

    def cancel(self, key: str) -> None:
        handle = self._handles.pop(key, None)
        if handle is not None:
            handle.cancel()

    def pending(self, key: str) -> bool:
        return key in self._handles
