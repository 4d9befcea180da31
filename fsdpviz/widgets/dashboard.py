"""``Dashboard``: explorer, prefetch graph and timeline in one layout, linked.

- the timeline's current event outlines its unit in the explorer and rings it in
  the prefetch graph;
- ``selected_unit`` is shared: a click in any view selects the unit in all three;
- a re-plan in the explorer redraws the prefetch graph and the timeline (and calls
  the memory model again when ``memory`` is a callable);
- a re-plan made in the page answers in the explorer first; the prefetch graph and
  the timeline follow right after that answer has reached the browser (a change made
  from Python, ``view.explorer.controls.set(world_size=64)``, updates all three
  before it returns);
- ``memory="auto"`` (the default) draws the memory model's lane
  (:func:`fsdpviz.cost.memory_lane`, the same numbers as ``report.memory``) in the
  timeline. A re-plan answered from the stored trace has no trace profile, so its
  lane first shows parameters, gradients and optimizer state; the activations
  follow from a trace made once the controls have rested for ``PROFILE_AFTER_S``
  seconds (``memory_note`` says which);
- ``ranks``: the timeline of several ranks (reports, or a :class:`~fsdpviz.RecordedRun`:
  a lane group per rank on the recorded clock, where ranks diverge marked); a recording
  has no module tree, so the explorer shows its units as modules;
- ``machine`` (default ``"h100"``; a preset name or :func:`fsdpviz.cost.machine`)
  places a prediction's events at the times :func:`fsdpviz.cost.timeline` models,
  once the plan has a trace profile (``None``: by event index);
- the theme the timeline reads from JupyterLab restyles the plotly panels.

Example::

    view = Dashboard(report, model=model, inputs=ids, memory=my_memory_model)
    view.timeline.step = 40          # moves the timeline; outlines that event's unit
    view.selected_unit = "layers.3"  # selects it in all views
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import traitlets

from fsdpviz.cost.hardware import Machine
from fsdpviz.schema.report import Report
from fsdpviz.views.prefetch import prefetch_parts
from fsdpviz.views.timeline_view import MemoryOption, auto_memory
from fsdpviz.views.tree import with_module_tree
from fsdpviz.widgets._errors import ErrorOutput
from fsdpviz.widgets._figure import ClickFigure
from fsdpviz.widgets._idle import Deferred
from fsdpviz.widgets.explorer import Explorer
from fsdpviz.widgets.timeline_widget import TimelineWidget

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun

__all__ = ["Dashboard", "show"]

# Figures at most this big follow each step at once; bigger ones follow once the timeline's
# steps pause for FOLLOW_AFTER_S seconds (as in the exported page, js/src/standalone.ts).
_QUICK_EXPLORER = 150  # modules drawn
_QUICK_PREFETCH = 40  # units
FOLLOW_AFTER_S = 0.25
# Seconds the controls must rest before a re-plan without activations is traced for them
# (the trace keeps the kernel busy: a control changed meanwhile would wait for it).
PROFILE_AFTER_S = 1.5


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
        iteration: int | None = -1,
        theme: str = "light",
        machine: Machine | str | None = "h100",
        **analyze_kwargs: Any,
    ) -> None:
        self.memory = memory
        self.iteration = iteration
        self.errors = ErrorOutput()
        self._deferred = Deferred(self.errors.guard)
        self.memory_note = w.HTML()
        self.explorer = Explorer(
            with_module_tree(report), model=model, inputs=inputs, theme=theme, **analyze_kwargs
        )
        traces, layout = prefetch_parts(report, theme=theme)  # type: ignore[arg-type]
        self.prefetch = ClickFigure({"data": traces, "layout": layout}, _validate=False)
        shown = ranks if ranks is not None else report
        self.timeline = TimelineWidget(
            shown, iteration, memory=self._memory(report), machine=machine
        )
        super().__init__(
            [
                w.HTML("<b>Wrap units</b>"),
                self.explorer,
                w.HTML("<b>Prefetch graph</b>"),
                self.prefetch,
                w.HTML(
                    "<b>Timeline</b> <small>(← → step, space plays; click an event to "
                    "select its unit; shift+wheel zooms)</small>"
                ),
                self.timeline,
                self.memory_note,
                self.errors,
            ]
        )
        g = self.errors.guard
        traitlets.link((self, "selected_unit"), (self.explorer, "selected_unit"))
        traitlets.link((self, "selected_unit"), (self.timeline, "selected_unit"))
        self.timeline.observe(g(self._on_current), names=["current_unit", "playing"])
        self.timeline.observe(g(self._on_theme), names="theme")
        self.timeline.observe(g(self._on_js_error), names="error")
        self.explorer.observe(g(self._on_report), names="report")
        self.observe(g(self._on_selected), names="selected_unit")
        self._bind_prefetch_click()
        self._on_current()

    def _bind_prefetch_click(self) -> None:
        for trace in self.prefetch.data:
            if trace.name == "units":
                trace.on_click(self.errors.guard(self._prefetch_clicked))

    def _prefetch_clicked(self, trace: Any, points: Any, state: Any) -> None:
        if points.point_inds:
            self.selected_unit = trace.customdata[points.point_inds[0]]

    def _ring(self, name: str, unit: str | None) -> None:
        xs: list[float] = []
        units = next((t for t in self.prefetch.data if t.name == "units"), None)
        if unit is not None and units is not None and unit in list(units.customdata):
            xs = [units.x[list(units.customdata).index(unit)]]
        for k, trace in enumerate(self.prefetch.data):
            if trace.name == name:
                self.prefetch.restyle(k, {"x": xs, "y": [0.0] * len(xs)})

    def _on_current(self, change: dict[str, Any] | None = None) -> None:
        # Restyling a figure takes the browser tens of milliseconds, hundreds for a big one:
        # small figures follow each step at once; big ones, and any while the timeline plays,
        # follow once the steps pause, so stepping and playing stay smooth.
        quick = (
            len(self.explorer.view.indices) <= _QUICK_EXPLORER
            and len(self.explorer.report.units) <= _QUICK_PREFETCH
        )
        self._deferred.cancel("follow")
        if quick and not self.timeline.playing:
            self._follow_step()
        elif not self.timeline.playing:
            self._deferred.run("follow", self._follow_step, delay=FOLLOW_AFTER_S)

    def _follow_step(self) -> None:
        """The current step's unit outlined in the explorer and ringed in the prefetch graph."""
        unit = self.timeline.current_unit
        self._ring("current", unit)
        self.explorer.highlight_unit = unit

    def _on_selected(self, change: dict[str, Any]) -> None:
        self._ring("selected", self.selected_unit)

    def _memory(self, report: Report) -> MemoryOption:
        if self.memory != "auto":
            return self.memory
        try:
            lane = auto_memory(report, self.iteration)
        except Exception as e:  # the views stay usable without the memory lane
            self.memory_note.value = f"<small>no memory lane: {type(e).__name__}: {e}</small>"
            return None
        measured = report.profile is not None
        self.memory_note.value = (
            "<small>memory: modelled from the trace (activations included)</small>"
            if measured
            else "<small>memory: parameters, gradients and optimizer state only "
            "(no trace profile)</small>"
        )
        return lane

    def _on_report(self, change: dict[str, Any]) -> None:
        # A click in the page: the explorer has answered, the prefetch graph and the
        # timeline follow as soon as that answer is sent. A change made from Python
        # updates all three before it returns. A pending trace of an older plan is dropped.
        self._deferred.cancel("profile")
        self._deferred.cancel("linked")
        if self.explorer.answering_browser:
            self._deferred.run("linked", self._update_linked, change["new"])
        else:
            self._update_linked(change["new"])

    def _update_linked(self, report: Report) -> None:
        if self.explorer.report is not report:
            return  # a newer re-plan is on its way
        self._replace_prefetch(report)
        self.timeline.set_reports(report, memory=self._memory(report))
        planner = self.explorer.replanner
        if self.memory == "auto" and report.profile is None and planner is not None:
            self.memory_note.value = (
                "<small>memory: parameters and gradients; the activations follow from a "
                "trace once the controls rest</small>"
            )
            self._deferred.run("profile", self._add_profile, report, delay=PROFILE_AFTER_S)

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

    def _replace_prefetch(self, report: Report) -> None:
        traces, layout = prefetch_parts(
            report,
            theme=self.explorer.theme,  # type: ignore[arg-type]
            highlight_unit=self.timeline.current_unit,
            selected_unit=self.selected_unit,
        )
        same = [(t.type, t.name) for t in self.prefetch.data] == [
            (t["type"], t.get("name")) for t in traces
        ]
        with self.prefetch.batch_update():
            if same:  # the same kinds of edges: update in place (plotly re-validates added traces)
                for k, new in enumerate(traces):
                    self.prefetch.restyle(k, {key: v for key, v in new.items() if key != "type"})
            else:
                self.prefetch.data = []
                self.prefetch.add_traces(traces)
            self.prefetch.layout = layout
        if not same:
            self._bind_prefetch_click()

    def _on_js_error(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.errors.show(RuntimeError(f"timeline (browser): {change['new']}"))

    def _on_theme(self, change: dict[str, Any]) -> None:
        self.explorer.theme = self.timeline.theme
        self._replace_prefetch(self.explorer.report)


def show(report: Report, **kwargs: Any) -> Dashboard:
    """The :class:`Dashboard` of ``report`` (``kwargs`` as for ``Dashboard``).

    As the last line of a notebook cell it is displayed; keep it to drive it from Python.
    """
    return Dashboard(report, **kwargs)
