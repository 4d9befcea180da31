"""``TuneView``: a tuning in the notebook (``tuning.show()``); a point opens its plan's views.

On top, the configurations :func:`fsdpviz.tune` evaluated as a scatter with the knob table
beside it (:class:`TuneWidget`: tokens/s per GPU against memory per rank, the capacity
line, the frontier, the best ★ and the configuration as given ◆). Below, the
:class:`~fsdpviz.widgets.Dashboard` (timeline, explorer, prefetch graph) of the
configuration selected: at first the best (when nothing fits, the lightest), then
whichever a click on a point, Enter, or an alternative in the knob table selects, in place
of the one shown before.

Example::

    view = tuning.show()                 # a TuneView
    view.open_plan(tuning.user.index)    # the configuration as given, below
    view.selected                        # its index; view.dashboard: its views
    view.save("tune.html")               # the page, opening on what is selected
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any, Unpack, cast

import ipywidgets as w
import traitlets

from fsdpviz.export import object_bundle, save_tuning
from fsdpviz.schema.keywords import DashboardOptions, MimeBundleKwargs, TuneSaveKwargs
from fsdpviz.tuning.result import Candidate, Tuning
from fsdpviz.views.tune_view import TuneData, anchor_of, tune_svg
from fsdpviz.widgets._errors import ErrorOutput
from fsdpviz.widgets.dashboard import Dashboard
from fsdpviz.widgets.front_end import TraitChange
from fsdpviz.widgets.tune_widget import TuneWidget

__all__ = ["TuneView"]


class TuneView(w.VBox):  # type: ignore[misc]
    """A :class:`~fsdpviz.tuning.Tuning` as a scatter whose points open their plans.

    ``selected``: the index (:attr:`~fsdpviz.tuning.Candidate.index`) of the configuration
    whose views are shown, or ``None``; ``dashboard``: those views. ``selected=``: the
    index shown first (default ``"best"``: the best, else the lightest; ``None``: none).
    ``model=`` (the model tuned) lets each opened dashboard's controls re-plan from that
    configuration; other keywords go to each :class:`~fsdpviz.widgets.Dashboard`.
    """

    selected = traitlets.Int(None, allow_none=True)

    def __init__(
        self,
        tuning: Tuning,
        *,
        selected: int | str | None = "best",
        model: Any = None,
        **dashboard_kwargs: Unpack[DashboardOptions],
    ) -> None:
        self.tuning = tuning
        self.dashboard: Any = None
        self._model = model
        self._kwargs = dashboard_kwargs
        self._opening = False
        self.errors = ErrorOutput()
        self.scatter = TuneWidget(tuning)
        self.title = w.HTML(layout=w.Layout(margin="10px 0 2px 0"))
        self.views = w.Box(layout=w.Layout(width="100%"))
        n = len(tuning.candidates)
        head = w.HTML(
            f"<b>Tune</b>: {n} configurations, {len(tuning.fitting)} fit. Click a point (or "
            "a knob's alternative in the table) to open its plan below; ★ is "
            "<code>tuning.best</code>, ◆ <code>tuning.user</code>, the configuration as given."
        )
        super().__init__([head, self.scatter, self.errors, self.title, self.views])
        self.add_class("fsdpviz-tune-view")
        g = self.errors.guard
        self.scatter.observe(g(self._on_click), names="selected")
        self.scatter.observe(g(self._on_js_error), names="error")
        self.observe(g(self._on_selected), names="selected")
        first = anchor_of(tuning).index if selected == "best" else selected
        if first is not None:
            if not isinstance(first, int):
                raise ValueError(f"selected={selected!r}: give a candidate's index, 'best' or None")
            self.open_plan(first)

    def candidate(self, index: int) -> Candidate:
        """The candidate whose :attr:`~fsdpviz.tuning.Candidate.index` is ``index``."""
        for c in self.tuning.candidates:
            if c.index == index:
                return c
        raise IndexError(
            f"no candidate has index {index}: the tuning has {len(self.tuning.candidates)}"
        )

    def open_plan(self, index: int) -> Any:
        """Show the views of candidate ``index`` below the scatter (selected there too);
        returns its :class:`~fsdpviz.widgets.Dashboard`."""
        c = self.candidate(index)
        if self._model is not None:
            merged: dict[str, Any] = {**c.kwargs, **self._kwargs}
            dashboard = Dashboard(c.report, model=self._model, inputs=c.inputs, **merged)
        else:
            dashboard = Dashboard(c.report, **self._kwargs)
        self.dashboard = dashboard
        self.title.value = self._title(c)
        self.views.children = [dashboard]
        self._opening = True
        try:
            self.scatter.selected = index
            self.selected = index
        finally:
            self._opening = False
        return dashboard

    def _title(self, c: Candidate) -> str:
        hover = self.scatter.data["points"]["hover"]
        k = self.scatter.data["points"]["index"].index(c.index)
        head, rate, _, memory, *_ = hover[k]
        return (
            f"<b>Configuration {escape(head)}</b>: {escape(rate)}; {escape(memory)}<br>"
            f"<small>{escape(c.label)}</small>"
        )

    def _on_click(self, change: TraitChange) -> None:
        """A point (or an alternative) chosen in the browser: its views below."""
        if self._opening or change["new"] is None or change["new"] == self.selected:
            return
        self.open_plan(change["new"])

    def _on_selected(self, change: TraitChange) -> None:
        """``view.selected = i`` from Python: as a click."""
        if self._opening:
            return
        if change["new"] is None:
            self.views.children = []
            self.title.value = ""
            self.dashboard = None
            self.scatter.selected = None
        else:
            self.open_plan(change["new"])

    def _on_js_error(self, change: TraitChange) -> None:
        if change["new"]:
            self.errors.show(RuntimeError(f"tune view (browser): {change['new']}"))

    def save(self, path: str | Path, **options: Unpack[TuneSaveKwargs]) -> Path:
        """Write the tuning's page (``.html``), opening on the configuration selected
        here (options as ``tuning.save`` takes them)."""
        if Path(path).suffix.lower() == ".html" and self.selected is not None:
            options.setdefault("selected", self.selected)
        return save_tuning(self.tuning, path, **options)

    def _repr_mimebundle_(self, **kwargs: Unpack[MimeBundleKwargs]) -> dict[str, object] | None:
        """The live view and, for the notebook once saved, the scatter as a static SVG with
        the tuning in words (``text/html``), and the views of the configuration shown (else
        the best) for fsdpviz's JupyterLab extension, with a static SVG of them
        (:func:`fsdpviz.export.object_bundle`)."""
        bundle: dict[str, object] | None = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        text = self.tuning.summary()
        c = self.candidate(self.selected) if self.selected is not None else anchor_of(self.tuning)
        shown = f"configuration #{c.index}: {c.label}"
        data = cast("TuneData", self.scatter.data)  # (the traitlet holds tune_data's)
        words = {
            "text/plain": text,
            "text/html": f'<div class="fsdpviz-tune-static">{tune_svg(data)}'
            '<pre class="fsdpviz-tune-summary" style="font-size:12px">'
            f"{escape(text)}\n\n(the views below: {escape(shown)})</pre></div>",
        }
        try:
            out: dict[str, object] = object_bundle(c.report, base=bundle | words)
            return out | {"text/plain": text}
        except (ValueError, TypeError, KeyError, IndexError) as e:
            return bundle | words | {"text/plain": f"{text}\n(no saved views: {e})"}
