"""Where the conveniences of a report come from, without the data model importing them.

``report.memory``, ``report.timeline``, ``report.module_graph()``,
``report.unit_graph()``, ``report.show()``, ``report.save()`` and the card a
notebook shows (``_repr_mimebundle_``), and ``run.save()`` and the card of a
:class:`~fsdpviz.RecordedRun`, are declared, typed, on the data types; what they
do lives in the layers above (the cost model, graphs, views, widgets, export),
which register it here, as pandas registers ``DataFrame.plot``. ``import
fsdpviz`` registers them all (``fsdpviz/_conveniences.py``).

Example::

    @register_report_method("memory")
    def memory(report: Report) -> MemoryReport: ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

ReportMethod = Literal["memory", "timeline", "module_graph", "unit_graph", "show", "save", "card"]
RunMethod = Literal["save", "card"]
F = TypeVar("F", bound=Callable[..., Any])

_REPORT: dict[str, Callable[..., Any]] = {}
_RUN: dict[str, Callable[..., Any]] = {}


def register_report_method(name: ReportMethod) -> Callable[[F], F]:
    """Decorator: ``fn(report, ...)`` implements ``report.<name>``."""

    def add(fn: F) -> F:
        _REPORT[name] = fn
        return fn

    return add


def register_run_method(name: RunMethod) -> Callable[[F], F]:
    """Decorator: ``fn(run, ...)`` implements ``run.<name>`` of a recorded run."""

    def add(fn: F) -> F:
        _RUN[name] = fn
        return fn

    return add


def report_method(name: ReportMethod) -> Callable[..., Any]:
    """The implementation of ``report.<name>``."""
    return _lookup(_REPORT, name, "report")


def run_method(name: RunMethod) -> Callable[..., Any]:
    """The implementation of ``run.<name>``."""
    return _lookup(_RUN, name, "run")


def _lookup(table: dict[str, Callable[..., Any]], name: str, what: str) -> Callable[..., Any]:
    try:
        return table[name]
    except KeyError:
        raise RuntimeError(
            f"{what}.{name} has no implementation registered; it comes with `import fsdpviz`"
        ) from None
