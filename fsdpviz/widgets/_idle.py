"""Keeping the kernel's answers short: work deferred until after an answer, and no GC pause in it.

In a notebook the widgets' callbacks run on the kernel's asyncio loop. An answer to
a control change (re-plan, redraw) should reach the browser in a fraction of a
second, so:

- :func:`fsdpviz._deferred_gc.answering` keeps Python's cyclic garbage collector out of
  the answer (see there);
- :class:`Deferred` runs work after the answer has been sent (the linked views of a
  re-plan, a trace for the memory curve, warming a stored trace). A newer request
  under the same key replaces a pending one. Outside a running event loop (a script,
  a test) the work runs at once, or not at all for ``idle_only`` work, which only
  exists to hide latency in a kernel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fsdpviz._deferred_gc import answering, running_loop

__all__ = ["Deferred"]


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
        loop = running_loop()
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
