"""Widget state in Python: the timeline's synced traitlets, the explorer's selection, detail panel
and re-plan controls, and the dashboard's links between the three views.

The browser side (stepping, playing, clicks) is tested with vitest in ``js/test``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from views_models import Block, Tiny, analyze_tiny, needs_front_end, tiny_inputs

import fsdpviz
from fsdpviz import Report
from fsdpviz.replan import PlanOptions, Replanner
from fsdpviz.views.style import format_bytes
from fsdpviz.widgets import Dashboard, Explorer, TimelineWidget

pytestmark = needs_front_end


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


def memory_model(r: Report) -> list[float]:
    n = len(r.iterations[-1])
    return [float(100 + (i if i <= n // 2 else n - i)) for i in range(n)]


def click(trace: Any, index: int) -> SimpleNamespace:
    return SimpleNamespace(point_inds=[index], trace_name=trace.name)


# ------------------------------------------------------------------ timeline


def test_timeline_traitlets(report: Report) -> None:
    view = TimelineWidget(report, memory=memory_model(report))
    assert set(view.keys) >= {"data", "step", "playing", "speed", "selected_unit", "theme"}
    assert view.trait_metadata("step", "sync") and view.trait_metadata("selected_unit", "sync")
    assert view.n_steps == len(report.iterations[-1])
    view.step = 4
    rank, event = view.current_event  # type: ignore[misc]
    assert (rank, event) == (0, report.iterations[-1][4])
    assert view.current_unit == event.unit
    view.step = 10_000  # clamped, like the browser clamps
    assert view.step == view.n_steps - 1
    view.step = -5
    assert view.step == 0
    view.jump_to_peak()
    assert view.step == view.peak_step == view.data["memory"][0]["peak"]["step"]
    assert view.order == "issue" and view.trait_metadata("order", "sync")


def test_timeline_draws_the_memory_model_by_default(report: Report) -> None:
    view = TimelineWidget(report)
    assert view.peak_bytes == report.memory.peak["bytes"]
    assert view.current_event is not None
    view.jump_to_peak()
    assert view.current_event == (0, report.iterations[-1][report.memory.peak["event"]])
    none = TimelineWidget(report, memory=None)
    assert none.peak_step is None and none.peak_bytes is None
    with pytest.raises(ValueError, match="memory="):
        none.jump_to_peak()


def test_timeline_all_iterations_and_new_reports(report: Report) -> None:
    view = TimelineWidget(report, None)
    n0 = len(report.iterations[0])
    view.step = n0 + 2
    assert view.current_event == (0, report.iterations[1][2])
    small = analyze_tiny(auto_wrap_policy=None)
    view.set_reports(small)
    assert view.data["units"] == [""]
    assert view.step == 0 and "back to step 0" in view.note  # that event is gone


def test_a_re_plan_keeps_the_selected_event(report: Report) -> None:
    """The step follows its event (kind, unit, phase and occurrence) into the new plan."""
    view = TimelineWidget(report, machine=None)
    events = report.iterations[-1]
    k = next(i for i, e in enumerate(events) if e.kind == "reduce_scatter" and e.unit == "blocks.1")
    view.step = k
    other = analyze_tiny(backward_prefetch=None)
    view.set_reports(other)
    _group, event = view.current_event  # type: ignore[misc]
    assert (event.kind, event.unit, event.phase) == ("reduce_scatter", "blocks.1", "backward")
    assert view.step != k and view.note == ""  # no prefetch: the event moved


# ------------------------------------------------------------------ explorer


def test_explorer_click_selects_module_and_unit(report: Report) -> None:
    ex = Explorer(report)
    trace = ex.figure.data[0]
    index = list(trace.ids).index("blocks.1.fc")
    ex._on_click(trace, click(trace, index), None)
    assert (ex.selected_module, ex.selected_unit) == ("blocks.1.fc", "blocks.1")
    assert "blocks.1.fc.weight" in ex.detail.value
    assert ex.unit_picker.value == "blocks.1"
    ex.unit_picker.value = "blocks.2"
    assert (ex.selected_unit, ex.selected_module) == ("blocks.2", None)
    ex.selected_unit = "missing"  # shown under the widget, not raised into the kernel
    assert ex.selected_unit is None
    assert "no wrap unit 'missing'" in str(ex.errors.last_error)


def test_explorer_highlight_kind_and_size(report: Report) -> None:
    ex = Explorer(report)
    ex.highlight_unit = "blocks.0"
    lines = dict(zip(ex.figure.data[0].ids, ex.figure.data[0].marker.line.color, strict=True))
    assert lines["blocks.0.fc"] == "#1f1f1f" and lines["blocks.1.fc"] == "#ffffff"
    ex.view_kind.value = "treemap"
    assert ex.figure.data[0].type == "treemap"
    ex.view_size.value = "rank_bytes"
    assert "bytes per rank" in ex.figure.layout.title.text
    assert ex.errors.last_error is None


def test_explorer_without_model_cannot_replan(report: Report) -> None:
    ex = Explorer(report)
    assert ex.replanner is None
    assert all(c.disabled for c in ex.controls._all)
    assert "model" in ex.controls.world_size.tooltip
    # shown as the plan was made: only its API's and its policy's controls
    c = ex.controls
    assert c.min_params.layout.display == "none" and c.classes.layout.display is None
    assert c.reshard.layout.display == "none" and c.sharding.layout.display is None


def test_explorer_replans_live(report: Report) -> None:
    ex = Explorer(report, model=Tiny(), inputs=tiny_inputs())
    assert ex.controls.read() == PlanOptions.from_report(report)
    ex.selected_unit = "blocks.1"
    ex.controls.set(world_size=16)
    assert ex.report.config["world_size"] == 16
    assert "re-planned in" in ex.status.value
    assert ex.selected_unit == "blocks.1"  # still a unit: kept
    ex.controls.set(policy="none")
    assert [u.module for u in ex.report.units] == [""]
    assert ex.selected_unit is None
    ex.controls.set(policy="classes")
    assert "from cache" in ex.status.value  # the same options as before


def test_replan_errors_show_under_the_widget(
    report: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = Explorer(report, model=Tiny(), inputs=tiny_inputs())
    assert ex.replanner is not None

    def fail(opts: PlanOptions) -> Report:
        raise ValueError(f"cannot plan world size {opts.world_size}")

    monkeypatch.setattr(ex.replanner, "plan", fail)
    ex.controls.set(world_size=32)
    assert ex.report is report  # the last good report stays
    assert "cannot plan world size 32" in str(ex.errors.last_error)
    assert "failed" in ex.status.value
    monkeypatch.undo()
    ex.controls.set(world_size=64)
    assert ex.errors.last_error is None and ex.report.config["world_size"] == 64


def test_fsdp2_recipe_control(report: Report) -> None:
    ex = Explorer(report, model=Tiny(), inputs=tiny_inputs())
    assert not ex.controls.recipe.disabled
    ex.controls.set(recipe="FSDP2")
    assert ex.report.config["api"] == "FSDP2"
    assert ex.replanner is not None and ex.replanner.last_path == "stored trace"
    assert "stored trace" in ex.status.value
    assert ex.controls.backward.disabled and ex.controls.forward.disabled
    ex.controls.set(layer_classes=["Linear"])
    assert {u.module_class for u in ex.report.units} == {"Linear", "Tiny"}


def test_only_the_chosen_apis_controls_are_active(report: Report) -> None:
    """FSDP1 shows its sharding strategy and prefetch switches; FSDP2 shows
    reshard_after_forward (True, False or a factor of the world size) instead."""
    ex = Explorer(report, model=Tiny(), inputs=tiny_inputs())
    c = ex.controls
    assert c.reshard.layout.display == "none" and c.sharding.layout.display is None
    assert c.min_params.layout.display == "none"  # the size slider only under "size"
    c.set(policy="size")
    assert c.min_params.layout.display is None and c.classes.layout.display == "none"
    c.set(policy="classes", recipe="FSDP2")
    assert c.sharding.disabled and c.sharding.layout.display == "none"
    assert c.reshard.layout.display is None and not c.reshard.disabled
    assert [v for _, v in c.reshard.options] == [True, False, 2]  # 4 ranks
    c.set(reshard_after_forward=2)
    torch.manual_seed(0)
    want = fsdpviz.analyze(
        Tiny(), tiny_inputs(), fully_shard=[Block], reshard_after_forward=2, world_size=4
    )
    assert ex.report.to_dict()["iterations"] == want.to_dict()["iterations"]
    c.set(world_size=16)
    assert [v for _, v in c.reshard.options] == [True, False, 2, 4, 8]
    assert ex.options.reshard_after_forward == 2
    c.set(world_size=8, reshard_after_forward=4)
    c.set(world_size=2)  # 4 does not divide 2: back to True, as the control shows
    assert ex.options.reshard_after_forward is True and c.reshard.value is True
    assert ex.errors.last_error is None


def test_replanner_lists_layer_classes() -> None:
    planner = Replanner(Tiny(), tiny_inputs())
    assert planner.layer_classes() == [
        ("Linear", 5),
        ("Block", 3),
        ("LayerNorm", 3),
        ("ModuleList", 1),
    ]
    with pytest.raises(ValueError, match="no module class 'Nope'"):
        planner.plan(layer_classes=["Nope"])
    r = planner.plan(policy="size", min_num_params=80)
    assert [u.module for u in r.units] == ["", "blocks.0", "blocks.1", "blocks.2"]


# ------------------------------------------------------------------ dashboard


def test_dashboard_links_step_selection_and_replan(report: Report) -> None:
    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs(), memory=memory_model)
    rings = {t.name: t for t in view.prefetch.data if t.name in ("current", "selected")}
    units = next(t for t in view.prefetch.data if t.name == "units")
    # step -> the current unit is outlined in the explorer and ringed in the prefetch graph
    step = next(i for i, e in enumerate(report.iterations[-1]) if e.unit == "blocks.1")
    view.timeline.step = step
    assert view.timeline.current_unit == "blocks.1"
    assert view.explorer.highlight_unit == "blocks.1"
    assert list(rings["current"].x) == [list(units.customdata).index("blocks.1")]
    # a click in the timeline (JS sets selected_unit) selects everywhere
    view.timeline.selected_unit = "blocks.2"
    assert view.selected_unit == view.explorer.selected_unit == "blocks.2"
    assert list(rings["selected"].x) == [list(units.customdata).index("blocks.2")]
    # a click in the explorer or the prefetch graph too
    view.explorer.select_module("blocks.0.norm")
    assert view.timeline.selected_unit == "blocks.0"
    view._prefetch_clicked(units, click(units, 0), None)
    assert view.timeline.selected_unit == units.customdata[0]
    # re-plan: the other views follow, the memory model runs again
    view.explorer.controls.set(backward_prefetch="BACKWARD_POST")
    assert view.timeline.peak_step is not None
    assert len(view.timeline.data["memory"][0]["total"]) == len(view.explorer.report.iterations[-1])
    assert "BACKWARD_POST" in view.prefetch.layout.title.text
    assert view.errors.last_error is None and view.explorer.errors.last_error is None


def test_dashboard_theme_from_the_browser(report: Report) -> None:
    view = Dashboard(report)
    view.timeline.theme = "dark"  # what the JS reports from JupyterLab
    assert view.explorer.theme == "dark"
    assert view.prefetch.layout.template.layout.paper_bgcolor == "#111111"
    assert view.explorer.figure.layout.template.layout.paper_bgcolor == "#111111"


def test_browser_errors_show_under_the_dashboard(report: Report) -> None:
    view = Dashboard(report)
    view.timeline.error = "TypeError: x is undefined"  # what the JS reports
    assert "timeline (browser): TypeError" in str(view.errors.last_error)


def test_report_show_opens_the_dashboard(report: Report) -> None:
    view = report.show(memory=memory_model(report))
    assert isinstance(view, Dashboard)
    assert view.timeline.peak_step is not None


def test_dashboard_draws_the_memory_model_by_default(report: Report) -> None:
    """memory="auto": the lane is fsdpviz.cost.memory_lane, its peak report.memory's."""
    from fsdpviz.cost import memory_lane

    view = Dashboard(report)
    (m,) = view.timeline.data["memory"]
    assert m["total"] == memory_lane(report).total
    assert view.timeline.peak_bytes == report.memory.peak["bytes"]
    assert "activations included" in view.memory_note.value
    assert Dashboard(report, memory=None).timeline.data["memory"] == []


def test_fast_replan_then_activations_from_a_trace(report: Report) -> None:
    """A stored-trace re-plan answers without a profile; the traced curve follows it."""
    from fsdpviz.cost import memory_series

    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
    ex = view.explorer
    assert ex.replanner is not None
    assert view.timeline.data["clock"].startswith("modelled on H100")
    notes: list[str] = []
    view.memory_note.observe(lambda c: notes.append(c["new"]), names="value")
    labels: list[str] = []
    view.timeline.observe(lambda c: labels.append(c["new"]["clock"]), names="data")
    # The report the view opened with is the plan of the controls' first options: a world
    # size change replays it, profile and all.
    ex.controls.set(world_size=16)
    assert ex.replanner.last_path == "replay" and ex.report.profile is not None
    assert labels[-1].startswith("modelled")
    labels.clear()
    ex.controls.set(forward_prefetch=True)
    assert ex.report.profile is None and "stored trace" in ex.status.value
    assert any("parameters, gradients" in n for n in notes)
    # no FLOPs without a profile: laid out by index until the traced plan places it in time
    assert labels[0].startswith("event index") and labels[-1].startswith("modelled")
    # Outside a kernel the trace runs at once: the curve now includes activations.
    assert "activations included" in view.memory_note.value
    profiled = ex.replanner.cached(ex.options)
    assert profiled is not None and profiled.profile is not None
    curve = view.timeline.data["memory"][0]["total"]
    assert max(curve) == profiled.memory.peak["bytes"]
    assert max(curve) > max(memory_series(ex.report, iteration=-1))
    # A plain world-size change now replays the traced report: profile kept.
    ex.controls.set(world_size=32)
    assert ex.replanner.last_path == "replay" and ex.report.profile is not None


def test_selecting_another_unit_drops_a_module_outside_it(report: Report) -> None:
    ex = Explorer(report)
    assert ex.unit_picker.index == 0 and ex.unit_picker.label == "(none)"
    ex.select_module("blocks.0.norm")
    assert ex.selected_module == "blocks.0.norm" and ex.unit_picker.value == "blocks.0"
    ex.selected_unit = "blocks.1"
    assert ex.selected_module is None
    assert "blocks.0.norm" not in ex.detail.value
    ex.selected_unit = None
    assert ex.unit_picker.label == "(none)"


def test_plotly_panels_keep_hovers_in_the_browser(report: Report) -> None:
    """The explorer and prefetch panels load plotly's front end with hover traffic left out
    (a click made while a hover was in flight was lost); the browser test clicks as a quick
    hand does. A plotly release that changes the front end is noticed here."""
    from fsdpviz.widgets._figure import ClickFigure, click_only_bundle

    bundle = click_only_bundle()
    assert isinstance(bundle, str) and bundle.rstrip().endswith(");")
    assert '"plotly_hover"' in bundle.rsplit("_send_points_callback_message = function", 1)[1]
    view = Dashboard(report)
    assert isinstance(view.explorer.figure, ClickFigure) and isinstance(view.prefetch, ClickFigure)
    assert view.explorer.figure._esm == bundle


def test_explorer_of_a_big_model_opens_and_closes_blocks(
    report: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More modules than the figure draws at once: the blocks are drawn closed (▸); a click
    opens one, a click on the opened block goes back up; a unit picked elsewhere is shown."""
    import fsdpviz.views.tree as tree_module

    monkeypatch.setattr(tree_module, "EXPLORER_BUDGET", 7)  # the root, 3 children, 3 blocks
    ex = Explorer(report)
    trace = ex.figure.data[0]
    assert len(trace.ids) == 7 and "blocks.1 [unit 2] ▸" in trace.labels
    assert len(trace.marker.line.color) == 7
    ex._on_click(trace, click(trace, list(trace.ids).index("blocks.1")), None)
    trace = ex.figure.data[0]
    assert ex.focus == "blocks.1" and ex.selected_unit == "blocks.1"
    assert list(trace.ids) == ["blocks.1", "blocks.1.norm", "blocks.1.fc"]
    assert list(trace.parents) == ["", "blocks.1", "blocks.1"]
    assert "inside 'blocks.1'" in ex.figure.layout.title.text
    ex.highlight_unit = "blocks.1"
    assert list(ex.figure.data[0].marker.line.color) == ["#1f1f1f"] * 3
    ex._on_click(trace, click(trace, 0), None)  # the opened block: up
    assert ex.focus == "" and len(ex.figure.data[0].ids) == 7
    ex.focus = "blocks.0"
    ex.selected_unit = "blocks.2"  # e.g. a click in the timeline
    assert ex.focus == "" and "blocks.2" in ex.figure.data[0].ids
    assert ex.errors.last_error is None


class SentToBrowser:
    """What a plotly FigureWidget sends to its view in the browser (restyle, update,
    relayout, added traces)."""

    def __init__(self, fig: Any) -> None:
        self.restyled: list[tuple[set[str], list[int]]] = []
        self.relaid: list[set[str]] = []
        fig.observe(self._restyle, names="_py2js_restyle")
        fig.observe(self._update, names="_py2js_update")
        fig.observe(self._relayout, names="_py2js_relayout")
        fig.observe(self._add, names="_py2js_addTraces")
        self._fig = fig

    def _restyle(self, change: dict[str, Any]) -> None:
        if change["new"]:
            msg = change["new"]
            self.restyled.append((set(msg["restyle_data"]), list(msg["restyle_traces"])))

    def _update(self, change: dict[str, Any]) -> None:
        if change["new"]:
            msg = change["new"]
            if msg["style_data"]:
                self.restyled.append((set(msg["style_data"]), list(msg["style_traces"])))
            if msg["layout_data"]:
                self.relaid.append(set(msg["layout_data"]))

    def _add(self, change: dict[str, Any]) -> None:
        if change["new"]:
            added = change["new"]["trace_data"]
            first = len(self._fig.data) - len(added)
            for k, trace in enumerate(added):
                self.restyled.append((set(trace), [first + k]))

    def _relayout(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.relaid.append(set(change["new"]["relayout_data"]))

    def trace_keys(self, index: int) -> set[str]:
        return {k for keys, traces in self.restyled if index in traces for k in keys}


def test_every_change_reaches_the_browser(report: Report) -> None:
    """The plotly panels are built without plotly's validation, where assigning to a trace
    would change it here only: re-plans, outlines, rings and a block opened are sent."""
    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
    explorer, prefetch = SentToBrowser(view.explorer.figure), SentToBrowser(view.prefetch)
    view.timeline.step = 3
    assert "marker.line.color" in explorer.trace_keys(0)
    ring = next(k for k, t in enumerate(view.prefetch.data) if t.name == "current")
    assert "x" in prefetch.trace_keys(ring)
    view.explorer.controls.set(policy="none")  # every module in the root's unit now
    assert {"labels", "customdata", "marker"} <= explorer.trace_keys(0)
    assert explorer.relaid and prefetch.relaid
    view.explorer.controls.set(policy="classes")
    view.selected_unit = "blocks.1"
    selected = next(k for k, t in enumerate(view.prefetch.data) if t.name == "selected")
    assert "x" in prefetch.trace_keys(selected)


def test_opening_a_block_reaches_the_browser(
    report: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsdpviz.views.tree as tree_module

    monkeypatch.setattr(tree_module, "EXPLORER_BUDGET", 7)
    ex = Explorer(report)
    sent = SentToBrowser(ex.figure)
    ex.focus = "blocks.1"
    assert {"ids", "parents", "labels", "values", "level"} <= sent.trace_keys(0)


def test_controls_changed_as_the_page_does(report: Report) -> None:
    """``set(..., as_browser=True)`` sends each control the state the page sends (an index
    for the pickers); the explorer re-plans exactly as for a change made from Python."""
    ex = Explorer(report, model=Tiny(), inputs=tiny_inputs())
    answered: list[bool] = []
    ex.observe(lambda c: answered.append(ex.answering_browser), names="report")
    changes: list[dict[str, Any]] = [
        {"world_size": 16},
        {"sharding_strategy": "SHARD_GRAD_OP"},
        {"backward_prefetch": None},
        {"forward_prefetch": True},
        {"layer_classes": ["Block", "Linear"]},
        {"policy": "size"},
        {"min_num_params": 5000},
        {"recipe": "FSDP2", "policy": "classes"},
        {"reshard_after_forward": False},
    ]
    for change in changes:
        ex.controls.set(**change, as_browser=True)
        for key, value in change.items():
            expected = tuple(value) if isinstance(value, list) else value
            assert getattr(ex.options, key) == expected, (key, ex.options)
    assert answered and all(answered)
    assert ex.errors.last_error is None
    ex.controls.set(world_size=32)
    assert answered[-1] is False and ex.answering_browser is False


# ------------------------------------------------------------------ sweep table


def test_sweep_table_shows_sorts_and_opens_rows() -> None:
    """``sweep(...).show()``: one row per configuration with its numbers; a heading
    click sorts by that column; "open" shows that row's dashboard of the same plan."""
    torch.manual_seed(0)
    table = fsdpviz.sweep(
        Tiny(),
        tiny_inputs(),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        world_size=[2, 8],
        memory_budget="1GiB",
    )
    view = table.show()
    rows = view.grid.children
    n_cols = len(view._columns) + 1
    assert len(rows) == n_cols * (1 + len(table.rows))
    headings = [b.description for b in rows[1:n_cols]]
    assert headings[:2] == ["world_size", "API"] and "peak per rank" in headings
    peak_col = headings.index("peak per rank") + 1
    peaks = [rows[n_cols * (r + 1) + peak_col].value for r in range(len(table.rows))]
    assert all(format_bytes(r["peak_bytes"]) in p for r, p in zip(table.rows, peaks, strict=True))
    # sort by peak, descending on the second click: the first row holds the largest peak
    heading = rows[peak_col]
    heading.click()
    heading.click()
    first = view._order[0]
    assert table.rows[first]["peak_bytes"] == max(r["peak_bytes"] for r in table.rows)
    assert rows is not view.grid.children and "▼" in view.grid.children[peak_col].description
    # open the second row shown: its dashboard is that configuration's plan
    open_button = view.grid.children[n_cols * 2]
    assert open_button.description == "open"
    open_button.click()
    row = view._order[1]
    assert view.opened == row and view.errors.last_error is None
    assert view.dashboard.explorer.report is table.reports[row]
    assert view.grid.children[n_cols * 2].description == "shown"


def test_explorer_search_box_selects_and_zooms(report: Report) -> None:
    """Typed in the search box: a unit or module name, (root), or a part of a name; the
    module is selected, the figure zooms to it (its parent for a module without children),
    and the zoom reaches the browser even when the kernel had set that level before."""
    ex = Explorer(report)
    sent = SentToBrowser(ex.figure)
    assert ex.search.options == ("(root)", "blocks.0", "blocks.1", "blocks.2")
    ex.search.value = "blocks.1"
    assert (ex.selected_unit, ex.selected_module) == ("blocks.1", "blocks.1")
    assert ex.figure.data[0].level == "blocks.1" and "unit 2 of 4" in ex.detail.value
    assert "found 'blocks.1'" in ex.status.value
    ex.search.value = "FC"  # no unit's name holds it: the first module's does
    assert (ex.selected_unit, ex.selected_module) == ("blocks.0", "blocks.0.fc")
    assert ex.figure.data[0].level == "blocks.0"
    ex.search.value = "(root)"
    assert ex.selected_unit == "" and ex.figure.data[0].level == "<root>"
    ex.search.value = "nothing like it"
    assert "no unit or module matches 'nothing like it'" in ex.status.value
    assert ex.selected_unit == ""
    levels = sum("level" in keys for keys, _ in sent.restyled)
    ex.find("root")  # (a click zoomed the browser elsewhere meanwhile): sent again
    assert sum("level" in keys for keys, _ in sent.restyled) == levels + 1
    with pytest.raises(KeyError, match="no unit or module matches 'zzz'"):
        ex.find("zzz")
    assert ex.errors.last_error is None
