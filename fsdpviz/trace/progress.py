"""Progress bars for long traces (tqdm: notebook widget or terminal)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final


class _Bar:
    def __init__(self, bar: Any, total: int) -> None:
        self._bar = bar
        self._total = total
        self._n = 0

    def tick(self) -> None:
        if self._bar is not None and self._n < self._total:
            self._n += 1
            self._bar.update(1)


QUIET: Final = _Bar(None, 0)
"""A bar that shows nothing (for a second trace of the same modules)."""


@contextmanager
def progress_bar(total: int, desc: str, enabled: bool | None) -> Iterator[_Bar]:
    """A bar that only appears when the work takes over a second (``enabled=None``)."""
    if enabled is False:
        yield _Bar(None, total)
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit="module", delay=0 if enabled else 1.0, leave=False)
    try:
        yield _Bar(bar, total)
    finally:
        bar.close()
