"""Callback errors shown under the widget (an ``ipywidgets.Output``), never swallowed silently."""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import ipywidgets

P = ParamSpec("P")
R = TypeVar("R")


class ErrorOutput(ipywidgets.Output):  # type: ignore[misc]
    """An ``Output`` that shows the last callback error; ``last_error`` keeps it for tests."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.last_error: BaseException | None = None

    def show(self, error: BaseException) -> None:
        self.last_error = error
        self.outputs = ()
        with self:
            short = "".join(traceback.format_exception_only(type(error), error)).strip()
            print(f"fsdpviz: {short}")
            if not isinstance(error, ValueError | KeyError):
                traceback.print_exception(error)

    def clear(self) -> None:
        self.last_error = None
        self.outputs = ()

    def guard(self, fn: Callable[P, R]) -> Callable[P, R | None]:
        """``fn`` with any exception shown here instead of lost in the kernel log (then it
        returns ``None``)."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                self.show(e)
                return None

        return wrapper
