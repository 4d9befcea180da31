"""``ExplorerWidget``: the wrap-unit explorer, a view of fsdpviz's front end (``js/``).

The module tree as an icicle on a canvas, each module's width its share of its parent's
parameters (or bytes per rank), coloured by wrap unit, with the selected unit's detail
panel beside it (over it in a narrow output). It draws :func:`fsdpviz.views.explorer_data`
of its report, as the exported page does. Synced traitlets: ``selected_unit`` and
``selected_module`` (set by a click or the find box), ``current_unit`` (outlined: the
timeline's current event's unit), ``focus`` (the module drawn at the top, ``""`` for the
model) and ``area`` (``"numel"`` or ``"rank_bytes"``).

:class:`~fsdpviz.widgets.Explorer` puts it under the re-plan controls.

Example::

    view = ExplorerWidget(report)
    view.selected_unit = "layers.3"     # outlined, brought into view, its details shown
"""

from __future__ import annotations

from typing import Any, ClassVar

import traitlets

from fsdpviz.schema.report import Report
from fsdpviz.views.explorer import explorer_data
from fsdpviz.views.tree import ModuleTree, with_module_tree
from fsdpviz.widgets.front_end import FrontEnd

__all__ = ["ExplorerWidget"]


class ExplorerWidget(FrontEnd):
    """The module tree coloured by wrap unit, and the selected unit's details."""

    view = traitlets.Unicode("explorer").tag(sync=True)
    data = traitlets.Dict().tag(sync=True)
    current_unit = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    selected_unit = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    selected_module = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    focus = traitlets.Unicode("").tag(sync=True)
    area = traitlets.Enum(["numel", "rank_bytes"], "numel").tag(sync=True)

    PAGE_TRAITS: ClassVar[tuple[str, ...]] = (
        "data",
        "current_unit",
        "selected_unit",
        "selected_module",
        "focus",
        "area",
    )

    def __init__(self, report: Report, *, tree: ModuleTree | None = None, **kwargs: Any) -> None:
        super().__init__(data=explorer_data(with_module_tree(report), tree=tree), **kwargs)

    def set_report(self, report: Report, *, tree: ModuleTree | None = None) -> None:
        """Draw another plan of the same model (a re-plan). ``busy`` stays as it is: the
        :class:`~fsdpviz.widgets.Explorer` ends it once every linked view has the plan."""
        self.data = explorer_data(with_module_tree(report), tree=tree)
