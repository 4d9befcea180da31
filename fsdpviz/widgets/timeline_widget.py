"""``TimelineWidget``: the step-through timeline as an anywidget (front end in ``js/``).

Stepping and playing run in the browser. ``step``, ``playing``, ``speed`` and
``selected_unit`` are synced traitlets: ``view.step = 40`` moves the view, a
click on an event sets ``view.selected_unit`` (and ``step``). While playing, the
browser sends ``step`` at most every ``sync_interval_ms``. ``machine`` places a
profiled prediction at modelled times (:func:`fsdpviz.views.timeline_data`).

Example::

    view = TimelineWidget(report, memory=series)   # series: bytes after each event
    view.step = 40
    view.current_event                              # (0, Event(kind='all_gather', ...))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from fsdpviz.cost.hardware import Machine
from fsdpviz.schema.report import Event, Report
from fsdpviz.views.timeline_steps import MemorySeries, timeline_data

__all__ = ["STATIC", "TimelineWidget"]

STATIC = Path(__file__).resolve().parent.parent / "static"


class TimelineWidget(anywidget.AnyWidget):
    """Lanes per rank (compute, all-gather, reduce-scatter), memory curve, step and play."""

    _esm = STATIC / "timeline.js"
    _css = STATIC / "timeline.css"

    data = traitlets.Dict().tag(sync=True)
    step = traitlets.Int(0).tag(sync=True)
    playing = traitlets.Bool(False).tag(sync=True)
    speed = traitlets.Float(20.0).tag(sync=True)
    selected_unit = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    theme = traitlets.Unicode("light").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    sync_interval_ms = traitlets.Int(150).tag(sync=True)
    current_unit = traitlets.Unicode(None, allow_none=True)
    """Unit of the event at ``step`` (Python side only; follows ``step``)."""

    def __init__(
        self,
        reports: Report | Sequence[Report],
        iteration: int | None = -1,
        *,
        memory: MemorySeries | None = None,
        rank_names: Sequence[str] | None = None,
        machine: Machine | str | None = "h100",
        **kwargs: Any,
    ) -> None:
        if not (STATIC / "timeline.js").exists():
            raise FileNotFoundError(
                f"{STATIC / 'timeline.js'} is missing: the front end was not built. Build it with "
                "`npm --prefix js ci && npm --prefix js run build` from a source checkout, or "
                "reinstall fsdpviz from a wheel"
            )
        self._iteration = iteration
        self._rank_names = rank_names
        self._machine = machine
        self._reports: list[Report] = []
        super().__init__(**kwargs)
        self.set_reports(reports, memory=memory)

    def set_reports(
        self, reports: Report | Sequence[Report], *, memory: MemorySeries | None = None
    ) -> None:
        """Show other reports (e.g. after a re-plan); keeps the step where it still exists."""
        self._reports = [reports] if isinstance(reports, Report) else list(reports)
        data = timeline_data(
            self._reports,
            self._iteration,
            memory=memory,
            rank_names=self._rank_names,
            machine=self._machine,
        )
        with self.hold_trait_notifications():
            self.data = data
            self.step = min(self.step, max(data["n_steps"] - 1, 0))
        self._update_current()

    @property
    def n_steps(self) -> int:
        return int(self.data.get("n_steps", 0))

    @property
    def peak_step(self) -> int | None:
        """Step of the memory peak, ``None`` without a memory series."""
        peak = self.data.get("peak_step")
        return None if peak is None else int(peak)

    @property
    def current_event(self) -> tuple[int, Event] | None:
        """``(rank, event)`` at ``step``."""
        if self.n_steps == 0:
            return None
        s = self.data["steps"]
        rank, index, it = s["rank"][self.step], s["index"][self.step], s["iteration"][self.step]
        report = self._reports[rank]
        if self._iteration is None:
            offset = sum(len(report.iterations[i]) for i in range(it))
            return rank, report.iterations[it][index - offset]
        return rank, report.iterations[it][index]

    def jump_to_peak(self) -> None:
        """Move to the memory peak (``ValueError`` without a memory series)."""
        if self.peak_step is None:
            raise ValueError("no memory series: pass memory=[bytes per event] to see the peak")
        self.step = self.peak_step

    @traitlets.validate("step")
    def _valid_step(self, proposal: dict[str, Any]) -> int:
        n = int(self.data.get("n_steps", 0)) if self.data else 0
        return max(0, min(int(proposal["value"]), max(n - 1, 0)))

    @traitlets.observe("step")
    def _on_step(self, change: dict[str, Any]) -> None:
        self._update_current()

    def _update_current(self) -> None:
        if self.n_steps == 0:
            self.current_unit = None
            return
        self.current_unit = self.data["units"][self.data["steps"]["unit"][self.step]]
