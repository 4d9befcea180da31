"""Where the conveniences of a report come from, without the data model importing them.

``report.memory``, ``report.timeline``, ``report.module_graph()``,
``report.unit_graph()``, ``report.show()``, ``report.save()`` and the card a
notebook shows (``_repr_mimebundle_``), ``run.show()``, ``run.save()`` and the card of a
:class:`~fsdpviz.RecordedRun`, the ``show()`` and ``save()`` of a
:class:`~fsdpviz.Comparison` and the ``show()`` of a sweep's table, are declared, typed,
on the data types; what they do lives in the layers above (the cost model, graphs,
views, widgets, export), which register it here, as pandas registers ``DataFrame.plot``. ``import
fsdpviz`` registers them all (``fsdpviz/_conveniences.py``).

Example::

    @register_report_method("memory")
    def memory(report: Report) -> MemoryReport: ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

ReportMethod = Literal["memory", "timeline", "module_graph", "unit_graph", "show", "save", "card"]
RunMethod = Literal["show", "save", "card", "bundle"]
"""``bundle`` (``fn(run, base=..., **options)``): a notebook output of the run beside
``base`` (its views' data and a static image, see :func:`fsdpviz.export.object_bundle`)."""
Owner = Literal["comparison", "sweep", "tuning"]
F = TypeVar("F", bound=Callable[..., Any])

_REPORT: dict[str, Callable[..., Any]] = {}
_RUN: dict[str, Callable[..., Any]] = {}
_SHOW: dict[str, Callable[..., Any]] = {}
_SAVE: dict[str, Callable[..., Any]] = {}


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


def register_show(owner: Owner) -> Callable[[F], F]:
    """Decorator: ``fn(obj, ...)`` implements ``obj.show()`` of a comparison, a sweep table or
    a tuning."""

    def add(fn: F) -> F:
        _SHOW[owner] = fn
        return fn

    return add


def register_save(owner: Literal["comparison", "tuning"]) -> Callable[[F], F]:
    """Decorator: ``fn(obj, path, ...)`` implements ``obj.save(path)`` of a comparison or a
    tuning."""

    def add(fn: F) -> F:
        _SAVE[owner] = fn
        return fn

    return add


def save_method(owner: Literal["comparison", "tuning"]) -> Callable[..., Any]:
    """The implementation of ``save()`` of a comparison."""
    if owner not in _SAVE:
        raise RuntimeError(
            f"{owner}.save has no implementation registered; it comes with `import fsdpviz`"
        )
    return _SAVE[owner]


def show_method(owner: Owner) -> Callable[..., Any]:
    """The implementation of ``show()`` of a comparison or a sweep table."""
    return _lookup(_SHOW, owner, owner)


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
        what_name = f"{what}.{name}" if name != what else f"{what}.show"
        raise RuntimeError(
            f"{what_name} has no implementation registered; it comes with `import fsdpviz`"
        ) from None
