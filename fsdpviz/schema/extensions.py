"""Where the conveniences of a report come from, without the data model importing them.

``report.memory``, ``report.timeline``, ``report.module_graph()``,
``report.unit_graph()``, ``report.show()``, ``report.save()`` and the card a
notebook shows (``_repr_mimebundle_``), ``run.show()``, ``run.save()`` and the card of a
:class:`~fsdpviz.RecordedRun`, the ``show()`` and ``save()`` of a
:class:`~fsdpviz.Comparison` and the ``show()`` of a sweep's table, are declared, typed,
on the data types; what they do lives in the layers above (the cost model, graphs,
views, widgets, export), which register it here, as pandas registers ``DataFrame.plot``. ``import
fsdpviz`` registers them all (``fsdpviz/_conveniences.py``), each by name
(``"module:function"``): the module is imported when the method is first called, so
``import fsdpviz`` loads none of them.

Example::

    register_report_method("memory", "fsdpviz.cost.memory:memory_model")
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal

ReportMethod = Literal["memory", "timeline", "module_graph", "unit_graph", "show", "save", "card"]
RunMethod = Literal["show", "save", "card", "bundle"]
"""``bundle`` (``fn(run, base=..., **options)``): a notebook output of the run beside
``base`` (its views' data and a static image, see :func:`fsdpviz.export.object_bundle`)."""
Owner = Literal["comparison", "sweep", "tuning"]
Target = Callable[..., Any] | str
"""An implementation, or its ``"module:name"``, imported when it is first called."""

_REPORT: dict[str, Target] = {}
_RUN: dict[str, Target] = {}
_SHOW: dict[str, Target] = {}
_SAVE: dict[str, Target] = {}


def register_report_method(name: ReportMethod, target: Target) -> None:
    """``target`` (``fn(report, ...)``, or its ``"module:name"``) implements ``report.<name>``."""
    _REPORT[name] = target


def register_run_method(name: RunMethod, target: Target) -> None:
    """``target`` (``fn(run, ...)``, or its ``"module:name"``) implements ``run.<name>`` of a
    recorded run."""
    _RUN[name] = target


def register_show(owner: Owner, target: Target) -> None:
    """``target`` (``fn(obj, ...)``, or its ``"module:name"``) implements ``obj.show()`` of a
    comparison, a sweep table or a tuning."""
    _SHOW[owner] = target


def register_save(owner: Literal["comparison", "tuning"], target: Target) -> None:
    """``target`` (``fn(obj, path, ...)``, or its ``"module:name"``) implements
    ``obj.save(path)`` of a comparison or a tuning."""
    _SAVE[owner] = target


def save_method(owner: Literal["comparison", "tuning"]) -> Callable[..., Any]:
    """The implementation of ``save()`` of a comparison."""
    if owner not in _SAVE:
        raise RuntimeError(
            f"{owner}.save has no implementation registered; it comes with `import fsdpviz`"
        )
    return _resolved(_SAVE, owner)


def show_method(owner: Owner) -> Callable[..., Any]:
    """The implementation of ``show()`` of a comparison or a sweep table."""
    return _lookup(_SHOW, owner, owner)


def report_method(name: ReportMethod) -> Callable[..., Any]:
    """The implementation of ``report.<name>``."""
    return _lookup(_REPORT, name, "report")


def run_method(name: RunMethod) -> Callable[..., Any]:
    """The implementation of ``run.<name>``."""
    return _lookup(_RUN, name, "run")


def _lookup(table: dict[str, Target], name: str, what: str) -> Callable[..., Any]:
    if name not in table:
        what_name = f"{what}.{name}" if name != what else f"{what}.show"
        raise RuntimeError(
            f"{what_name} has no implementation registered; it comes with `import fsdpviz`"
        )
    return _resolved(table, name)


def _resolved(table: dict[str, Target], name: str) -> Callable[..., Any]:
    """``table[name]``; a ``"module:name"`` looked up in its module at each call (imported the
    first time), so the module's function is the one called, as a patched one would be."""
    target = table[name]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        found: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        return found
    return target
