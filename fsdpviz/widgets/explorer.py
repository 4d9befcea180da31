"""``Explorer``: the wrap-unit icicle/treemap, a detail panel and live re-plan controls.

Example::

    ex = Explorer(report, model=model, inputs=ids)   # model/inputs enable re-planning
    ex.selected_unit = "layers.3"                     # opens the detail panel
    ex.find("layers.3.mlp")                           # what the search box does
    ex.controls.set(world_size=64)                    # re-plans from the same model
    ex.report                                         # the new report
"""

from __future__ import annotations

import time
from html import escape
from typing import Any, cast

import ipywidgets as w
import traitlets

from fsdpviz._gc import answering
from fsdpviz.replan import PlanOptions, Replanner
from fsdpviz.schema.report import Report, unit_label
from fsdpviz.views.detail import unit_detail_html
from fsdpviz.views.explorer import (
    ExplorerKind,
    ExplorerSize,
    explorer_parts,
    highlight_lines,
)
from fsdpviz.views.style import Theme, format_bytes
from fsdpviz.views.tree import ModuleTree, TreeView, module_tree, node_id, tree_view
from fsdpviz.widgets._errors import ErrorOutput
from fsdpviz.widgets._figure import ClickFigure
from fsdpviz.widgets._idle import Deferred
from fsdpviz.widgets.controls import PlanControls

__all__ = ["Explorer"]

# Seconds after the explorer is shown before the stored trace the controls re-plan from is
# made, when the kernel is idle.
WARM_AFTER_S = 0.5
# What a re-plan, the area or the theme change in the explorer trace (the modules stay).
_REPLANNED = ("labels", "values", "customdata", "marker")
# The picker's "(none)": ipywidgets shows an option whose value is None as an empty box.
_NO_UNIT = "\x00(none)"


class Explorer(w.VBox):  # type: ignore[misc]
    """Module tree coloured by wrap unit; click a module or pick a unit for its details.

    Traitlets: ``report`` (replaced on re-plan), ``selected_unit``, ``selected_module``,
    ``highlight_unit`` (outlined, e.g. the timeline's current unit), ``theme``,
    ``kind`` (``icicle``/``treemap``), ``size`` (``numel``/``rank_bytes``).
    """

    report = traitlets.Instance(Report)
    selected_unit = traitlets.Unicode(None, allow_none=True)
    selected_module = traitlets.Unicode(None, allow_none=True)
    highlight_unit = traitlets.Unicode(None, allow_none=True)
    theme = traitlets.Unicode("light")
    kind = traitlets.Unicode("icicle")
    size = traitlets.Unicode("numel")
    focus = traitlets.Unicode("")

    def __init__(
        self,
        report: Report,
        *,
        model: Any = None,
        inputs: Any = None,
        replanner: Replanner | None = None,
        theme: str = "light",
        **analyze_kwargs: Any,
    ) -> None:
        if replanner is None and model is not None:
            replanner = Replanner(model, inputs, **analyze_kwargs)
        self.replanner = replanner
        self.errors = ErrorOutput()
        self.tree: ModuleTree = module_tree(report)
        self.view: TreeView = tree_view(self.tree)
        """The modules the figure draws (all of them, up to ``EXPLORER_BUDGET``)."""
        trace, layout = explorer_parts(
            report, theme=cast(Theme, theme), tree=self.tree, view=self.view
        )
        # Not validated: the figure is fsdpviz's own (explorer_figure is checked by the
        # golden tests), and plotly's checks would cost more than a re-plan.
        self.figure = ClickFigure({"data": [trace], "layout": layout}, _validate=False)
        # The detail panel sits beside the figure, as high as it and scrolled on its own, so
        # a selection never pushes the page down; in a narrow output it wraps below.
        # (no margin: at its full height, it is no taller than the figure beside it)
        self.detail = w.HTML(
            layout=w.Layout(
                flex="1 1 0",
                min_width="300px",
                max_height=f"{layout['height']}px",
                overflow="auto",
                margin="0",
                padding="0 0 0 8px",
            )
        )
        self.detail.add_class("fsdpviz-detail")
        self.search = w.Combobox(
            placeholder="find a unit or module",
            description="find",
            ensure_option=False,
            continuous_update=False,
            style={"description_width": "initial"},
            layout=w.Layout(width="260px"),
        )
        self.status = w.HTML()
        self.unit_picker = w.Dropdown(
            description="unit",
            style={"description_width": "initial"},
            layout=w.Layout(width="auto"),
        )
        self.view_kind = w.ToggleButtons(options=["icicle", "treemap"], value="icicle")
        self.view_size = w.ToggleButtons(
            options=[("parameters", "numel"), ("bytes per rank", "rank_bytes")], value="numel"
        )
        self.answering_browser = False
        self.options = PlanOptions.from_report(report)
        """The options of the last re-plan (at first: what ``report.config`` says)."""
        if replanner is not None and report.source == "prediction":
            replanner.remember(self.options, report)  # what the controls show now
        self.controls = PlanControls(self.options, replanner, self._replan)
        super().__init__(
            [
                self.controls,
                w.HBox(
                    [self.view_kind, self.view_size, self.unit_picker, self.search],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.status,
                w.HBox(
                    [
                        # The figure takes the width the panel leaves, and follows it.
                        w.VBox([self.figure], layout=w.Layout(flex="2 1 0", min_width="480px")),
                        self.detail,
                    ],
                    layout=w.Layout(flex_flow="row wrap", align_items="flex-start"),
                ),
                self.errors,
            ]
        )
        self.add_class("fsdpviz-explorer")
        with self.hold_trait_notifications():
            self.theme = theme
            self.report = report
        self._set_picker()
        self._bind()
        self._show_detail()
        self.status.value = self._summary(None)
        self._deferred = Deferred(self.errors.guard)
        if replanner is not None:  # in a kernel: the first control change need not wait
            self._deferred.run("warm", self._warm, delay=WARM_AFTER_S, idle_only=True)

    def _bind(self) -> None:
        g = self.errors.guard
        self.figure.data[0].on_click(g(self._on_click))
        self.unit_picker.observe(g(self._picked), names="value")
        self.search.observe(g(self._searched), names="value")
        self.view_kind.observe(g(lambda c: setattr(self, "kind", c["new"])), names="value")
        self.view_size.observe(g(lambda c: setattr(self, "size", c["new"])), names="value")
        self.observe(g(self._selection_changed), names=["selected_unit", "selected_module"])
        self.observe(g(self._highlight_changed), names="highlight_unit")
        self.observe(g(self._redraw), names=["kind", "size", "theme", "focus"])
        self.observe(g(self._on_report), names="report")

    def _replan(self, options: PlanOptions, from_browser: bool = False) -> None:
        """Answer a control change. ``answering_browser`` tells the dashboard whether to
        answer here first and update the other views after (a click in the page) or all
        at once (a change made from Python)."""
        if self.replanner is None:
            return
        self.answering_browser = from_browser
        try:
            with answering():
                self.status.value = "<i>re-planning...</i>"
                report = self.replanner.plan(options)
                planner = self.replanner
                answer = (planner.last_seconds, planner.last_cached, planner.last_path)
                self.errors.clear()
                self.options = options
                self.report = report
                self.status.value = self._summary(*answer)
        except Exception as e:
            self.status.value = "<b>re-plan failed</b> (see below)"
            self.errors.show(e)
        finally:
            self.answering_browser = False

    def _warm(self) -> None:
        """Make the stored trace the shown recipe re-plans from (the other recipe's is made
        on its first plan), saying so while the kernel is busy with it."""
        if self.replanner is None or self.replanner.has_stored_trace(self.options):
            return
        shown = self.status.value
        self.status.value = "<small><i>tracing the model once for re-planning...</i></small>"
        try:
            self.replanner.warm(self.options)
        finally:
            if self.status.value.startswith("<small><i>tracing the model once"):
                self.status.value = shown

    def _summary(self, seconds: float | None, cached: bool = False, path: str | None = None) -> str:
        r = self.report
        per_rank = sum(u.sharded_bytes for u in r.units)
        text = (
            f"{len(r.units)} units, {format_bytes(per_rank)} of parameters per rank, "
            f"{len(r.warnings)} warnings"
        )
        if seconds is not None:
            how = f" ({path})" if path in ("replay", "stored trace", "trace") else ""
            text += " · from cache" if cached else f" · re-planned in {seconds * 1000:.0f} ms{how}"
        return f"<small>{text}</small>"

    def _on_report(self, change: dict[str, Any]) -> None:
        start = time.perf_counter()
        self.tree = module_tree(self.report)  # the same modules, other units
        self._set_picker()
        if self.selected_unit is not None and self.selected_unit not in self.tree.units:
            self.selected_unit = None
        self._redraw()
        self._show_detail()
        self.last_render_seconds = time.perf_counter() - start

    def _redraw(self, change: dict[str, Any] | None = None) -> None:
        drawn = self.view
        self.view = tree_view(self.tree, self.focus)
        trace, layout = explorer_parts(
            self.report,
            kind=cast(ExplorerKind, self.kind),
            size=cast(ExplorerSize, self.size),
            theme=cast(Theme, self.theme),
            highlight_unit=self.highlight_unit,
            tree=self.tree,
            view=self.view,
        )
        with self.figure.batch_update():
            self.figure.layout = layout
            if self.figure.data[0].type != trace["type"] or self.view != drawn:
                # Other modules (opened, closed) or another kind: a new trace. Restyled
                # instead, plotly.js moves the old slices while its own click zoom runs and
                # leaves some where they were.
                self.figure.data = []
                self.figure.add_trace(trace)
                self.figure.data[0].on_click(self.errors.guard(self._on_click))
            else:  # the same modules: send what a plan or a theme changes
                self.figure.restyle(0, {k: trace[k] for k in _REPLANNED})

    def _highlight_changed(self, change: dict[str, Any]) -> None:
        colors = highlight_lines(self.tree, self.highlight_unit, self.view, cast(Theme, self.theme))
        self.figure.restyle(0, {"marker.line.color": colors})

    def find(self, text: str) -> str:
        """What the search box does: select the module or unit named ``text`` and zoom the
        figure to it. ``text`` is a unit or module FQN, ``(root)``, or a part of a name
        (case-insensitive; units first, then modules, in model order). Returns the FQN
        found; raises ``KeyError`` (saying what to type) when nothing matches."""
        fqn = _match(self.tree, [u.module for u in self.report.units], text)
        node = self.tree.by_fqn[fqn]
        # A block fills the figure, its children drawn; a leaf is shown inside its parent.
        top = fqn if node.children or node.parent is None else node.parent
        focus = self._focus_for(top, opened=True)
        if focus != self.view.focus:
            self.focus = focus
        self.select_module(fqn)
        self.figure.set_level(0, node_id(top))
        self.status.value = self._summary(None) + f"<small> · found {unit_label(fqn)}</small>"
        return fqn

    def _searched(self, change: dict[str, Any]) -> None:
        text = change["new"].strip()
        if not text:
            return
        try:
            self.find(text)
        except KeyError as e:
            self.status.value = f"<small>{escape(str(e.args[0]), quote=False)}</small>"

    def _on_click(self, trace: Any, points: Any, state: Any) -> None:
        if not points.point_inds:
            return
        node = self.tree.nodes[self.view.indices[points.point_inds[0]]]
        if node.fqn in self.view.closed:
            self.focus = node.fqn  # open it
        elif node.fqn == self.view.focus and node.parent is not None:
            self.focus = self._focus_for(node.parent, opened=True)  # up
        self.select_module(node.fqn)

    def _focus_for(self, fqn: str, *, opened: bool) -> str:
        """The highest focus whose figure draws ``fqn`` (``opened``: with its children)."""
        chain = [fqn]
        while (parent := self.tree.by_fqn[chain[-1]].parent) is not None:
            chain.append(parent)
        for candidate in reversed(chain):
            view = tree_view(self.tree, candidate)
            drawn = any(self.tree.nodes[k].fqn == fqn for k in view.indices)
            if drawn and not (opened and fqn in view.closed):
                return candidate
        return fqn

    def show_module(self, fqn: str) -> None:
        """Focus the figure so that ``fqn`` is drawn (no change when it already is)."""
        if fqn not in self.tree.by_fqn:
            raise KeyError(f"no module {fqn!r} in the model")
        drawn = {self.tree.nodes[k].fqn for k in self.view.indices}
        if fqn not in drawn:
            self.focus = self._focus_for(fqn, opened=False)

    def select_module(self, fqn: str) -> None:
        """What a click on ``fqn`` does: select it and its unit."""
        node = self.tree.by_fqn[fqn]
        with self.hold_trait_notifications():
            self.selected_module = fqn
            self.selected_unit = node.unit

    def _picked(self, change: dict[str, Any]) -> None:
        unit = None if change["new"] == _NO_UNIT else change["new"]
        if unit != self.selected_unit:
            self.selected_module = None
            self.selected_unit = unit

    def _selection_changed(self, change: dict[str, Any]) -> None:
        if self.selected_unit is not None and self.selected_unit not in self.tree.units:
            bad = self.selected_unit
            self.selected_unit = None
            raise KeyError(f"no wrap unit {bad!r} in this report")
        module = self.tree.by_fqn.get(self.selected_module or "")
        if module is not None and module.unit != self.selected_unit:
            self.selected_module = None  # the detail panel shows the new unit, not that module
        if self.selected_unit is not None:
            self.show_module(self.selected_unit)  # picked elsewhere: bring it into view
        self._set_picker_value()
        self._show_detail()

    def _show_detail(self) -> None:
        self.detail.value = unit_detail_html(
            self.report, self.selected_unit, self.selected_module, self.tree
        )

    def _set_picker(self) -> None:
        options = [("(none)", _NO_UNIT)] + [
            (f"{i}: {u.module or '(root)'}", u.module) for i, u in enumerate(self.report.units)
        ]
        self.unit_picker.options = options
        self.search.options = [u.module or "(root)" for u in self.report.units]
        self._set_picker_value()

    def _set_picker_value(self) -> None:
        unit = self.selected_unit if self.selected_unit in self.tree.units else None
        self.unit_picker.value = _NO_UNIT if unit is None else unit


def _match(tree: ModuleTree, units: list[str], text: str) -> str:
    """The module FQN ``text`` names (see :meth:`Explorer.find`)."""
    text = text.strip()
    if text in ("(root)", "") and "" in tree.by_fqn:
        return ""
    if text in tree.by_fqn:
        return text
    low = text.lower()
    for name in [*units, *(n.fqn for n in tree.nodes)]:
        if name in tree.by_fqn and low in (name or "(root)").lower():
            return name
    raise KeyError(
        f"no unit or module matches {text!r}: type a module name such as "
        f"{next((u for u in units if u), '(root)')!r}, a part of one, or (root)"
    )
