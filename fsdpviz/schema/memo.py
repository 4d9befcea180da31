"""What a view made of a report, remembered, so that going back to a plan shown before
(a re-plan the re-planner answers from its cache) costs next to nothing, and a card shown
again (a notebook redrawing an output, the same report displayed twice) is not made again.

A report is a mutable dataclass: a field can be replaced (``report.config =
report.config.replace(machine=...)``) or a list changed in place (``check_fit`` rewrites
``report.warnings``). So an entry is used only for the very same report object whose
fields are, as when the entry was made, the same objects (or equal ones) holding the same
items: any field replaced by a different value, or any of its lists or dicts (and the
lists of events in ``iterations``) changed, and the entry is made again. The items
themselves (``Unit``, ``Event``, ``ModuleInfo``, ``FsdpWarning``, ``ReportConfig``) are
frozen. An entry keeps its report alive, so no other report can take its ``id``.

Example::

    memo: ReportMemo[dict[str, Any]] = ReportMemo()
    data = memo.get(report, lambda: prefetch_data(report))   # made
    data is memo.get(report, lambda: prefetch_data(report))  # True: remembered
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from fsdpviz.schema.report import Report

__all__ = ["ReportMemo", "report_state"]

T = TypeVar("T")

SIZE = 8
"""Plans a view remembers, the last drawn: the few a person goes back and forth between (the
data of a 10,000-module model's timeline takes tens of MB in Python)."""


def _items(value: Any) -> Any:
    """A list's or dict's items as a tuple (a list of lists: each one's too), else the value.

    (A report's lists hold items of one type: ``iterations`` and ``module_events`` lists.)"""
    if isinstance(value, list):
        return tuple(map(tuple, value)) if value and isinstance(value[0], list) else tuple(value)
    if isinstance(value, dict):
        return tuple(value.items())
    return value


def report_state(report: Report) -> tuple[Any, ...]:
    """What the views of ``report`` read, as it is now: each attribute (the fields, and
    ``memory`` and ``timeline`` once computed) with the items of its lists and dicts.

    Two states compare equal when every value is the same object or an equal one (a
    tuple compares its items by identity first, so an unchanged report compares fast)."""
    return tuple((name, _items(value)) for name, value in vars(report).items())


class ReportMemo(Generic[T]):
    """The last :data:`SIZE` values made for a report (see the module docstring)."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[int, Hashable], tuple[Report, Any, tuple[Any, ...], T]]
        self._entries = OrderedDict()

    def get(
        self, report: Report, make: Callable[[], T], *, key: Hashable = None, same: Any = None
    ) -> T:
        """The value made for ``report`` (and ``key``, and the object ``same``: compared by
        identity, e.g. a memory lane) when the report has not changed since; else
        ``make()``, remembered."""
        k = (id(report), (key, id(same)))
        entry = self._entries.get(k)
        state = report_state(report)
        if entry is not None and entry[0] is report and entry[1] is same and entry[2] == state:
            self._entries.move_to_end(k)
            return entry[3]
        # ``make`` reads the report (the views are pure functions of it); all it may add is
        # a cached property it then read (report.memory): the state is taken again then
        attributes = len(vars(report))
        value = make()
        if len(vars(report)) != attributes:
            state = report_state(report)
        self._entries[k] = (report, same, state, value)
        self._entries.move_to_end(k)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value

    def find(self, report: Report, *, key: Hashable = None, same: Any = None) -> T | None:
        """The value :meth:`get` would return without making one; ``None`` when none is."""
        entry = self._entries.get((id(report), (key, id(same))))
        if entry is None or entry[0] is not report or entry[1] is not same:
            return None
        if entry[2] != report_state(report):
            return None
        return entry[3]

    def clear(self) -> None:
        self._entries.clear()
