"""``PrefetchWidget``: the prefetch graph, a view of fsdpviz's front end (``js/``).

Units on a line in forward order, forward prefetches arcing above, backward prefetches
below, FSDP's mistakes in vermillion (:func:`fsdpviz.views.prefetch_data` of its report,
as the exported page draws it). Where the units do not fit it shows a window of them that
follows ``current_unit``. Synced traitlets: ``selected_unit`` (set by a click on a unit or
an arc) and ``current_unit`` (ringed: the timeline's current event's unit).

Example::

    view = PrefetchWidget(report)
    view.current_unit = "layers.3"
"""

from __future__ import annotations

from typing import Any, ClassVar, TypedDict, Unpack, cast

import traitlets

from fsdpviz.schema.report import Report
from fsdpviz.views.prefetch import PrefetchData, prefetch_data
from fsdpviz.widgets._memo import ReportMemo
from fsdpviz.widgets.front_end import DATA, FrontEnd

__all__ = ["PrefetchWidget"]


class PrefetchTraits(TypedDict, total=False):
    """The prefetch graph's state a constructor may set (its traits)."""

    current_unit: str | None
    selected_unit: str | None


class PrefetchWidget(FrontEnd):
    """The prefetch graph of one iteration (default: the steady state)."""

    view = traitlets.Unicode("prefetch").tag(sync=True)
    data = traitlets.Dict().tag(**DATA)
    current_unit = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    selected_unit = traitlets.Unicode(None, allow_none=True).tag(sync=True)

    PAGE_TRAITS: ClassVar[tuple[str, ...]] = ("data", "current_unit", "selected_unit")

    def __init__(
        self, report: Report, iteration: int | None = -1, **kwargs: Unpack[PrefetchTraits]
    ) -> None:
        self.iteration = -1 if iteration is None else iteration
        self._memo: ReportMemo[PrefetchData] = ReportMemo()
        super().__init__(data=self._data(report), **kwargs)
        self._report = report

    def _data(self, report: Report) -> PrefetchData:
        """:func:`prefetch_data` of ``report``, made once per plan (see ``_memo.py``)."""
        it = self.iteration
        data = self._memo.get(report, lambda: prefetch_data(report, it), key=it)
        self._keep_encoded(data)
        return data

    def shown_report(self) -> Report | None:
        """The plan the graph draws."""
        return self._report

    def set_report(self, report: Report) -> None:
        """Draw another plan (a re-plan): its data reaches the browser in one message, which
        also ends ``busy``."""
        data = self._data(report)
        self._report = report
        with self.hold_sync():
            self.data = cast("dict[str, Any]", data)  # (the traitlet's type of the same dict)
            self.busy = False
