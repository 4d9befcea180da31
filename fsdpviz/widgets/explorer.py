"""``Explorer``: the wrap-unit explorer (:class:`ExplorerWidget`) under live re-plan controls.

Example::

    ex = Explorer(report, model=model, inputs=ids)   # model/inputs enable re-planning
    ex.selected_unit = "layers.3"                     # opens the detail panel
    ex.find("layers.3.mlp")                           # what the find box does
    ex.controls.set(world_size=64)                    # re-plans from the same model
    ex.report                                         # the new report
"""

from __future__ import annotations

from typing import Any, Unpack

import ipywidgets as w
import traitlets

from fsdpviz._deferred_gc import answering
from fsdpviz.api.keywords import AnalyzeKwargs
from fsdpviz.replan import PlanOptions, Replanner
from fsdpviz.schema.keywords import MimeBundleKwargs
from fsdpviz.schema.report import Report, unit_label
from fsdpviz.views.card import plural, warnings_html
from fsdpviz.views.style import format_bytes
from fsdpviz.views.tree import ModuleTree, module_tree
from fsdpviz.widgets._errors import ErrorOutput
from fsdpviz.widgets._idle import Deferred
from fsdpviz.widgets._memo import ReportMemo
from fsdpviz.widgets.controls import PlanControls
from fsdpviz.widgets.explorer_widget import ExplorerWidget
from fsdpviz.widgets.front_end import TraitChange, saved_output, with_saved_views

__all__ = ["Explorer"]

# Seconds after the explorer is shown before the stored trace the controls re-plan from is
# made, when the kernel is idle.
WARM_AFTER_S = 0.5
# Seconds after a re-plan's answer before every other unit's detail panel is made and sent:
# meanwhile the browser draws the new plan (on a small machine the kernel, the server and the
# browser share the cores); a unit picked sooner shows its panel as pending until then.
DETAILS_AFTER_S = 0.25
# Seconds after a re-plan before the notebook output is given the new plan (see
# fsdpviz.widgets.front_end.saved_output): a saved notebook keeps the plan on screen.
SAVE_AFTER_S = 1.0


def _shared(name: str, doc: str) -> Any:
    """A trait of the explorer's view, read and set through the explorer."""

    def get(self: Explorer) -> Any:
        return getattr(self.view, name)

    def set_(self: Explorer, value: Any) -> None:
        setattr(self.view, name, value)

    return property(get, set_, doc=doc)


class Explorer(w.VBox):  # type: ignore[misc]
    """The re-plan controls, a status line and the explorer view (:class:`ExplorerWidget`).

    ``report`` (a traitlet, replaced on re-plan). The view's traitlets, read and set here
    too (observe them on ``explorer.view``): ``selected_unit``, ``selected_module``,
    ``current_unit`` (outlined, e.g. the timeline's current unit), ``focus`` (the module
    drawn at the top), ``area`` (``numel``/``rank_bytes``), ``busy`` (a re-plan on its way).
    """

    report = traitlets.Instance(Report)
    selected_unit = _shared("selected_unit", "The selected unit (None: none).")
    selected_module = _shared("selected_module", "The module clicked or found in it.")
    current_unit = _shared("current_unit", "The unit outlined as the current step's.")
    focus = _shared("focus", 'The module drawn at the top ("" for the model).')
    area = _shared("area", 'What a block\'s width stands for: "numel" or "rank_bytes".')
    busy = _shared("busy", "A re-plan is on its way: the view shows none of the old plan.")

    def __init__(
        self,
        report: Report,
        *,
        model: Any = None,
        inputs: Any = None,
        replanner: Replanner | None = None,
        **analyze_kwargs: Unpack[AnalyzeKwargs],
    ) -> None:
        # a pipeline's plan is not re-planned from the controls (they plan FSDP alone)
        piped = report.pipeline is not None and bool(report.pipeline.ranks)
        if replanner is None and model is not None and not piped:
            replanner = Replanner(model, inputs, **analyze_kwargs)
        self.replanner = replanner
        self.errors = ErrorOutput()
        self._trees: ReportMemo[ModuleTree] = ReportMemo()  # per plan (see _memo.py)
        self.tree: ModuleTree = self._trees.get(report, lambda: module_tree(report))
        self.view = ExplorerWidget(report, tree=self.tree)
        """The icicle and the detail panel, drawn by the front end."""
        self.saves_output = True
        """Whether a re-plan gives the notebook output the new plan (the explorer shown on
        its own; a dashboard saves its three views itself)."""
        self.status = w.HTML()
        self.warnings = w.HTML(warnings_html(report))
        """The plan's warnings, each in words (the advice with it), as the card lists them."""
        if piped and model is not None:
            self.status.value = (
                "<small>a pipeline's plan: plan another schedule, microbatches or mesh with "
                "fsdpviz.analyze (the controls plan FSDP without the pipeline)</small>"
            )
        self.options = PlanOptions.from_report(report)
        """The options of the last re-plan (at first: what ``report.config`` says)."""
        if replanner is not None and report.source == "prediction":
            replanner.remember(self.options, report)  # what the controls show now
        why = (
            "A pipeline's plan: the controls show its FSDP options; plan another schedule, "
            "microbatches or mesh with fsdpviz.analyze."
            if piped and model is not None
            else None
        )
        self.controls = PlanControls(self.options, replanner, self._replan, no_replan=why)
        super().__init__([self.controls, self.status, self.warnings, self.view, self.errors])
        self.add_class("fsdpviz-explorer-widget")
        with self.hold_trait_notifications():
            self.report = report
        g = self.errors.guard
        # on the view: a click in the page sets its unit and module in one message, so its
        # observers see both (the explorer's own traits follow one after the other)
        self.view.observe(g(self._selection_changed), names=["selected_unit", "selected_module"])
        self.observe(g(self._on_report), names="report")
        self.view.observe(g(self._on_browser_error), names="error")
        self.status.value = self._summary(None)
        self._deferred = Deferred(self.errors.guard)
        if replanner is not None:  # in a kernel: the first control change need not wait
            self._deferred.run("warm", self._warm, delay=WARM_AFTER_S, idle_only=True)

    def _replan(self, options: PlanOptions) -> None:
        """Answer a control change: every view linked to ``busy`` hides the old plan's
        numbers until the new plan is drawn."""
        if self.replanner is None:
            return
        self.busy = True
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
                # every view shown again before the collector, paused meanwhile, looks at
                # what the answer made
                self.busy = False
        except Exception as e:
            self.status.value = "<b>re-plan failed</b> (see below)"
            self.errors.show(e)
        finally:
            self.busy = False

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
            f"{plural(len(r.units), 'unit')}, {format_bytes(per_rank)} of parameters per "
            f"rank, {plural(len(r.warnings), 'warning')}"
        )
        if seconds is not None:
            how = f" ({path})" if path in ("replay", "stored trace", "trace") else ""
            text += " · from cache" if cached else f" · re-planned in {seconds * 1000:.0f} ms{how}"
        return f"<small>{text}</small>"

    def _on_report(self, change: TraitChange) -> None:
        """A re-plan: the new plan drawn in this answer, with the selected unit's details;
        every other unit's follow once the browser has had ``DETAILS_AFTER_S`` to draw it."""
        report = self.report
        self.warnings.value = warnings_html(report)
        self.tree = self._trees.get(report, lambda: module_tree(report))  # other units
        if self.selected_unit is not None and self.selected_unit not in self.tree.units:
            self.selected_unit = None
        shown = [] if self.selected_unit is None else [self.selected_unit]
        self.view.set_report(report, tree=self.tree, details=shown)
        self._deferred.run("details", self._add_details, report, delay=DETAILS_AFTER_S)
        if self.saves_output:
            self._deferred.run("saved", self._save_output, report, delay=SAVE_AFTER_S)

    def _save_output(self, report: Report) -> None:
        """The plan on screen, for the notebook's saved output."""
        if self.report is report:
            text, title = self._titles()
            self.view.saved_output = saved_output(
                {"explorer": self.view.page_state()}, report, title, text
            )

    def _titles(self) -> tuple[str, str]:
        text = self.report.summary()
        return text, f"fsdpviz explorer: {text.splitlines()[0].removeprefix('fsdpviz ')}"

    def _add_details(self, report: Report) -> None:
        if self.report is report:  # not when a newer plan came meanwhile
            self.view.set_details(report, tree=self.tree)

    def _on_browser_error(self, change: TraitChange) -> None:
        if change["new"]:
            self.errors.show(RuntimeError(f"explorer (browser): {change['new']}"))

    def _repr_mimebundle_(self, **kwargs: Unpack[MimeBundleKwargs]) -> dict[str, object] | None:
        """The live explorer and what outlives its kernel (see
        :func:`fsdpviz.widgets.front_end.with_saved_views`)."""
        text, title = self._titles()
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        return with_saved_views(
            bundle, {"explorer": self.view.page_state()}, self.report, title, text
        )

    def find(self, text: str) -> str:
        """What the find box does: select the module or unit named ``text`` and draw it (a
        block at the top, its children below; a module without children inside its
        parent). ``text`` is a unit or module FQN, ``(root)``, or a part of a name
        (case-insensitive; units first, then modules, in model order). Returns the FQN
        found; raises ``KeyError`` (saying what to type) when nothing matches."""
        fqn = _match(self.tree, [u.module for u in self.report.units], text)
        node = self.tree.by_fqn[fqn]
        with self.view.hold_sync():
            self.focus = fqn if node.children or node.parent is None else node.parent
            self.select_module(fqn)
        self.status.value = self._summary(None) + f"<small> · found {unit_label(fqn)}</small>"
        return fqn

    def show_module(self, fqn: str) -> None:
        """Draw the tree from ``fqn``'s parent when ``fqn`` is not below the module at the
        top (no change when it is)."""
        if fqn not in self.tree.by_fqn:
            raise KeyError(f"no module {fqn!r} in the model")
        above = fqn
        while above != self.focus and above:
            above = self.tree.by_fqn[above].parent or ""
        if above != self.focus:
            self.focus = self.tree.by_fqn[fqn].parent or ""

    def select_module(self, fqn: str) -> None:
        """What a click on ``fqn`` does: select it and its unit."""
        node = self.tree.by_fqn[fqn]
        with self.view.hold_sync(), self.view.hold_trait_notifications():
            self.selected_module = fqn
            self.selected_unit = node.unit

    def _selection_changed(self, change: TraitChange) -> None:
        view = self.view
        if view.selected_unit is not None and view.selected_unit not in self.tree.units:
            bad = view.selected_unit
            view.selected_unit = None
            raise KeyError(f"no wrap unit {bad!r} in this report")
        module = self.tree.by_fqn.get(view.selected_module or "")
        if view.selected_module is not None and module is None:
            bad = view.selected_module
            view.selected_module = None
            raise KeyError(f"no module {bad!r} in the model")
        if module is not None and module.unit != view.selected_unit:
            view.selected_module = None  # the detail panel shows the new unit, not that module


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
