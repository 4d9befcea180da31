"""``Dashboard``: the timeline, the explorer and the prefetch graph of one report, linked.

Three views of fsdpviz's front end (:class:`TimelineWidget`, :class:`ExplorerWidget`,
:class:`PrefetchWidget`), under the explorer's re-plan controls, linked as the exported
page links them (``js/src/links.ts``):

- the timeline's current event's unit is outlined in the explorer and ringed in the
  prefetch graph (``current_unit``);
- ``selected_unit`` is shared: a click in any view selects the unit in all three; a unit
  chosen in the explorer or the prefetch graph also moves the timeline to its next event;
- a re-plan redraws all three in one answer: each view shows none of the old plan's
  numbers from the moment the re-plan starts (``busy``) until it draws the new one;
- ``memory="auto"`` (the default) draws the memory model's lane
  (:func:`fsdpviz.cost.memory_lane`, the same numbers as ``report.memory``) in the
  timeline. A re-plan answered from the stored trace has no trace profile, so its lane
  first shows parameters, gradients and optimizer state; the activations follow from a
  trace made once the controls have rested for ``PROFILE_AFTER_S`` seconds
  (``memory_note`` says which);
- ``ranks``: the timeline of several ranks (reports, or a :class:`~fsdpviz.RecordedRun`:
  a lane group per rank on the recorded clock, where ranks diverge marked); a recording
  has no module tree, so the explorer shows its units as modules;
- ``iteration`` (default ``"auto"``: a recording's first iteration where its ranks diverge,
  else the last, a prediction's steady state; ``None``: every iteration);
- ``machine`` (default ``"auto"``: the machine the report was planned for,
  ``analyze(..., machine=...)``; a preset name or :func:`fsdpviz.cost.machine`) places a
  prediction's events at the times :func:`fsdpviz.cost.timeline` models, once the plan
  has a trace profile (``None``: by event index), and its device memory is the memory
  lane's capacity line.

Each view reads the page's theme itself (JupyterLab's light or dark). ``save`` writes the
dashboard as it is now (the plan, the step, the selection) to an HTML page.

Example::

    view = Dashboard(report, model=model, inputs=ids, memory=my_memory_model)
    view.timeline.step = 40          # moves the timeline; outlines that event's unit
    view.selected_unit = "layers.3"  # selects it in all views
    view.save("now.html")            # the page of what the dashboard shows
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack

import ipywidgets as w
import traitlets

from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.memory import MemoryLane
from fsdpviz.export import html_page
from fsdpviz.schema.keywords import DashboardKwargs, MimeBundleKwargs, PlanKwargs
from fsdpviz.schema.report import Report
from fsdpviz.views.timeline_lanes import MemoryOption
from fsdpviz.views.timeline_memory import auto_memory
from fsdpviz.views.timeline_view import opening_iteration
from fsdpviz.views.tree import with_module_tree
from fsdpviz.widgets._errors import ErrorOutput
from fsdpviz.widgets._idle import Deferred
from fsdpviz.widgets._memo import ReportMemo
from fsdpviz.widgets.explorer import SAVE_AFTER_S, Explorer
from fsdpviz.widgets.front_end import TraitChange, saved_output, with_saved_views
from fsdpviz.widgets.prefetch_widget import PrefetchWidget
from fsdpviz.widgets.timeline_widget import TimelineWidget

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun

__all__ = ["Dashboard", "show"]

# Seconds the controls must rest before a re-plan without activations is traced for them
# (the trace keeps the kernel busy: a control changed meanwhile would wait for it).
PROFILE_AFTER_S = 1.5


def _heading(text: str) -> w.HTML:
    return w.HTML(f"<b>{text}</b>", layout=w.Layout(margin="8px 0 0 0"))


class Dashboard(w.VBox):  # type: ignore[misc]
    """The three linked views of one report; see the module docstring."""

    selected_unit = traitlets.Unicode(None, allow_none=True)

    def __init__(
        self,
        report: Report,
        *,
        model: Any = None,
        inputs: Any = None,
        memory: MemoryOption = "auto",
        ranks: Sequence[Report] | RecordedRun | None = None,
        iteration: int | Literal["auto"] | None = "auto",
        machine: Machine | str | None = "auto",
        **analyze_kwargs: Unpack[PlanKwargs],
    ) -> None:
        self.memory = memory
        iteration = opening_iteration(ranks if ranks is not None else report, iteration)
        self.iteration = iteration
        self.errors = ErrorOutput()
        self._deferred = Deferred(self.errors.guard)
        self._linking = False
        self.memory_note = w.HTML()
        self._lanes: ReportMemo[MemoryLane | None] = ReportMemo()  # per plan (see _memo.py)
        self.explorer = Explorer(
            with_module_tree(report), model=model, inputs=inputs, **analyze_kwargs
        )
        self.explorer.saves_output = False  # the dashboard's output saves all three views
        self.prefetch = PrefetchWidget(report, iteration)
        self._shown: Report | Sequence[Report] | RecordedRun = (
            ranks if ranks is not None else report
        )
        self.timeline = TimelineWidget(
            self._shown, iteration, memory=self._memory(report), machine=machine
        )
        super().__init__(
            [
                self.explorer.controls,
                self.explorer.status,
                self.explorer.warnings,
                _heading("Timeline"),
                self.timeline,
                self.memory_note,
                _heading("Wrap units"),
                self.explorer.view,
                _heading("Prefetch graph"),
                self.prefetch,
                self.explorer.errors,
                self.errors,
            ]
        )
        self.add_class("fsdpviz-dashboard")
        g = self.errors.guard
        self.timeline.observe(g(self._on_current), names="current_unit")
        self.observe(g(self._on_selected), names="selected_unit")
        for view in (self.timeline, self.explorer.view, self.prefetch):
            view.observe(g(self._on_view_selected), names="selected_unit")
        for view in (self.timeline, self.prefetch):  # the explorer shows its own
            view.observe(g(self._on_js_error), names="error")
        self.explorer.view.observe(g(self._on_busy), names="busy")
        self.explorer.observe(g(self._on_report), names="report")
        self._on_current()

    @contextmanager
    def _link(self) -> Iterator[None]:
        """Changes the dashboard makes itself: they are not clicks to answer."""
        self._linking = True
        try:
            yield
        finally:
            self._linking = False

    def _on_current(self, change: TraitChange | None = None) -> None:
        """The current step's unit outlined in the explorer and ringed in the prefetch graph."""
        unit = self.timeline.current_unit
        self.explorer.current_unit = unit
        self.prefetch.current_unit = unit

    def _share(self, unit: str | None) -> None:
        with self._link():
            self.selected_unit = unit
            for view in (self.timeline, self.explorer.view, self.prefetch):
                view.selected_unit = unit

    def _on_selected(self, change: TraitChange) -> None:
        if not self._linking:  # set from Python: every view shows it
            self._share(self.selected_unit)

    def _on_view_selected(self, change: TraitChange) -> None:
        """A view's own selection (a click, the find box): the others follow, and a unit
        chosen outside the timeline moves it to that unit's next event."""
        if self._linking:
            return
        unit = change["new"]
        self._share(unit)
        if change["owner"] is not self.timeline and unit is not None:
            step = self.timeline.next_step_of(unit)
            if step is not None:
                self.timeline.step = step

    def _on_busy(self, change: TraitChange) -> None:
        # A re-plan starts: the other views hide the old plan at once. Each shows the new
        # plan with its data (a failed re-plan leaves the old plan shown again).
        self.prefetch.busy = self.timeline.busy = change["new"]

    def _memory(self, report: Report) -> MemoryOption:
        if self.memory != "auto":
            return self.memory
        iteration = self.iteration
        try:
            lane = self._lanes.get(report, lambda: auto_memory(report, iteration), key=iteration)
        except Exception as e:  # the views stay usable without the memory lane
            self.memory_note.value = f"<small>no memory lane: {type(e).__name__}: {e}</small>"
            return None
        measured = report.profiled
        self.memory_note.value = (
            "<small>memory: modelled from the trace (activations included)</small>"
            if measured
            else "<small>memory: parameters, gradients and optimizer state only "
            "(no trace profile)</small>"
        )
        return lane

    def _on_report(self, change: TraitChange) -> None:
        """A re-plan: the prefetch graph and the timeline show it in the same answer as the
        explorer. A pending trace of an older plan is dropped."""
        self._deferred.cancel("profile")
        report: Report = change["new"]
        self.prefetch.set_report(report)
        self._shown = report
        self.timeline.set_reports(report, memory=self._memory(report))
        with self._link():
            for view in (self.explorer.view, self.prefetch, self.timeline):
                view.selected_unit = self.explorer.selected_unit
            self.selected_unit = self.explorer.selected_unit
        planner = self.explorer.replanner
        if self.memory == "auto" and report.profile is None and planner is not None:
            self.memory_note.value = (
                "<small>memory: parameters and gradients; the activations follow from a "
                "trace once the controls rest</small>"
            )
            self._deferred.run("profile", self._add_profile, report, delay=PROFILE_AFTER_S)
        self._deferred.run("saved", self._save_output, delay=SAVE_AFTER_S)

    def _save_output(self) -> None:
        """The plan on screen, for the notebook's saved output (see ``SAVE_AFTER_S``)."""
        self.timeline.saved_output = saved_output(self._states(), *self._titles())

    def _titles(self) -> tuple[Report, str, str]:
        """The report, title and text of what the dashboard shows now."""
        report = self.explorer.report
        text = report.summary()
        if not isinstance(self._shown, Report):
            text = getattr(self._shown, "summary", lambda: text)()
        return report, text.splitlines()[0], text

    def _add_profile(self, report: Report) -> None:
        """The memory curve with activations: the same plan, traced (skipped if stale)."""
        planner = self.explorer.replanner
        options = self.explorer.options
        if planner is None or self.explorer.report is not report:
            return
        if planner.cached(options) is not report:  # not a re-plan of these options
            return
        self.memory_note.value = "<small>memory: tracing the activations...</small>"
        profiled = planner.profiled(options)
        if self.explorer.report is report:
            self.timeline.set_reports(profiled, memory=self._memory(profiled))
            self._deferred.run("saved", self._save_output, delay=SAVE_AFTER_S)

    def _on_js_error(self, change: TraitChange) -> None:
        if change["new"]:
            what = change["owner"].view
            self.errors.show(RuntimeError(f"{what} (browser): {change['new']}"))

    def _repr_mimebundle_(self, **kwargs: Unpack[MimeBundleKwargs]) -> dict[str, object] | None:
        """The live dashboard and, for the notebook once saved, its three views' data as
        they are now (drawn by fsdpviz's JupyterLab extension without a kernel) and a
        static SVG of the timeline and the plan
        (:func:`fsdpviz.widgets.front_end.with_saved_views`)."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        return with_saved_views(bundle, self._states(), *self._titles())

    def _states(self) -> dict[str, dict[str, Any]]:
        return {
            "timeline": self.timeline.page_state(),
            "explorer": self.explorer.view.page_state(),
            "prefetch": self.prefetch.page_state(),
        }

    def save(self, path: str | Path, *, theme: str = "auto", title: str | None = None) -> Path:
        """Write the dashboard as it is now to an HTML page: the plan it shows (after any
        re-plan), the step, the selection, the explorer's focus, drawn by the same front
        end. ``theme``: ``"auto"`` (the reader's OS setting), ``"light"`` or ``"dark"``."""
        states = self._states()
        p = Path(path)
        p.write_text(
            html_page(
                self._shown,  # type: ignore[arg-type]
                theme=theme,  # type: ignore[arg-type]
                title=title,
                states=states,
                iteration=self.iteration,
            ),
            encoding="utf-8",
        )
        return p


def show(report: Report, **kwargs: Unpack[DashboardKwargs]) -> Dashboard:
    """The :class:`Dashboard` of ``report`` (``kwargs`` as for ``Dashboard``).

    As the last line of a notebook cell it is displayed; keep it to drive it from Python.
    """
    return Dashboard(report, **kwargs)
