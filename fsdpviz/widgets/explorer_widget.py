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

from collections.abc import Collection
from typing import Any, ClassVar, Literal, TypedDict, Unpack, cast

import traitlets

from fsdpviz.schema.report import Report
from fsdpviz.views.detail import UnitDetail
from fsdpviz.views.explorer import ExplorerData, explorer_data, explorer_details
from fsdpviz.views.tree import ModuleTree, module_tree, with_module_tree
from fsdpviz.widgets._memo import ReportMemo
from fsdpviz.widgets.front_end import DATA, FrontEnd

__all__ = ["ExplorerWidget"]


class ExplorerTraits(TypedDict, total=False):
    """The explorer's state a constructor may set (its traits)."""

    current_unit: str | None
    selected_unit: str | None
    selected_module: str | None
    focus: str
    area: Literal["numel", "rank_bytes"]


class ExplorerWidget(FrontEnd):
    """The module tree coloured by wrap unit, and the selected unit's details."""

    view = traitlets.Unicode("explorer").tag(sync=True)
    data = traitlets.Dict().tag(**DATA)
    current_unit = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    selected_unit = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    selected_module = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    focus = traitlets.Unicode("").tag(sync=True)
    area = traitlets.Enum(["numel", "rank_bytes"], "numel").tag(sync=True)

    details: traitlets.List[UnitDetail | None] = traitlets.List().tag(**DATA)
    """Each unit's detail panel (:func:`fsdpviz.views.unit_details`); ``None`` for one not
    made yet (after a re-plan only the selected unit's come with the answer)."""

    PAGE_TRAITS: ClassVar[tuple[str, ...]] = (
        "data",
        "details",
        "current_unit",
        "selected_unit",
        "selected_module",
        "focus",
        "area",
    )

    def __init__(
        self,
        report: Report,
        *,
        tree: ModuleTree | None = None,
        **kwargs: Unpack[ExplorerTraits],
    ) -> None:
        # per plan (see _memo.py): the data without details, and every unit's details
        self._memo: ReportMemo[ExplorerData] = ReportMemo()
        self._all_details: ReportMemo[list[UnitDetail | None]] = ReportMemo()
        super().__init__(
            details=self._details(report, tree, True), data=self._data(report, tree), **kwargs
        )
        self._report = report

    def _data(self, report: Report, tree: ModuleTree | None) -> ExplorerData:
        def make() -> ExplorerData:
            data = explorer_data(with_module_tree(report), tree=tree, details=False)
            del data["details"]
            return data

        data = self._memo.get(report, make, same=tree)
        self._keep_encoded(data)
        return data

    def _details(
        self, report: Report, tree: ModuleTree | None, which: bool | Collection[str]
    ) -> list[UnitDetail | None]:
        """``explorer_details`` of ``which``: taken from every unit's once they were made."""

        def make(which: bool | Collection[str]) -> list[UnitDetail | None]:
            shown = with_module_tree(report)
            return explorer_details(shown, tree or module_tree(shown), which)

        full = self._all_details.find(report, same=tree)
        if full is None and which is True:
            full = self._all_details.get(report, lambda: make(True), same=tree)
        if full is None:
            return make(which)  # only these units' (the others follow after the answer)
        if which is True:
            self._keep_encoded(full)
            return full
        wanted = set() if which is False else set(which)
        return [d if u.module in wanted else None for u, d in zip(report.units, full, strict=True)]

    def shown_report(self) -> Report | None:
        """The plan the explorer draws."""
        return self._report

    def set_report(
        self,
        report: Report,
        *,
        tree: ModuleTree | None = None,
        details: bool | Collection[str] = True,
    ) -> None:
        """Draw another plan of the same model (a re-plan), with the detail panels of
        ``details`` (all; or these units', the others following with :meth:`set_details`).
        ``busy`` stays as it is: the :class:`~fsdpviz.widgets.Explorer` ends it once every
        linked view has the plan."""
        self._report = report
        data = self._data(report, tree)
        shown = self._details(report, tree, details)
        with self.hold_sync():
            self.details = shown
            self.data = cast("dict[str, Any]", data)  # (the traitlet's type of the same dict)

    def set_details(self, report: Report, *, tree: ModuleTree | None = None) -> None:
        """Every unit's detail panel of ``report`` (the plan drawn)."""
        self.details = self._details(report, tree, True)
