"""Widget state in Python: the timeline's synced traitlets, the explorer's selection and
re-plan controls, and the dashboard's links between the three views.

A click in the page reaches Python as a state change the browser sends; the tests send it
the same way (``widget.set_state``). The browser side (drawing, stepping, playing, clicks)
is tested with vitest in ``js/test`` and in Chromium (``test_browser_*.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from views_models import Block, Tiny, analyze_tiny, needs_front_end, tiny_inputs

import fsdpviz
from fsdpviz import Report
from fsdpviz.export import page_script
from fsdpviz.replan import PlanOptions, Replanner
from fsdpviz.widgets import Dashboard, Explorer, ExplorerWidget, PrefetchWidget, TimelineWidget
from fsdpviz.widgets.sweep import gib

pytestmark = needs_front_end


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


def memory_model(r: Report) -> list[float]:
    n = len(r.iterations[-1])
    return [float(100 + (i if i <= n // 2 else n - i)) for i in range(n)]


def click(widget: Any, **state: Any) -> None:
    """What a click in the page sends: the view's new state, as the browser syncs it."""
    widget.set_state(state)


# ------------------------------------------------------------------ timeline


def test_timeline_traitlets(report: Report) -> None:
    view = TimelineWidget(report, memory=memory_model(report))
    assert set(view.keys) >= {"view", "data", "step", "playing", "speed", "selected_unit", "busy"}
    assert "theme" not in view.keys  # the browser reads the page's theme itself
    sent = view.get_state("data")["data"]  # one buffer of JSON: nothing walked, nothing re-encoded
    assert isinstance(sent, memoryview) and json.loads(bytes(sent)) == view.data
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
    assert isinstance(ex.view, ExplorerWidget) and ex.view.view == "explorer"
    details = ex.view.details
    assert [d["title"].split(":")[0] for d in details] == [f"unit {k} of 4" for k in range(4)]
    click(ex.view, selected_unit="blocks.1", selected_module="blocks.1.fc", focus="blocks.1")
    assert (ex.selected_module, ex.selected_unit, ex.focus) == (
        "blocks.1.fc",
        "blocks.1",
        "blocks.1",
    )
    ex.selected_unit = "blocks.2"
    assert (ex.view.selected_unit, ex.selected_module) == ("blocks.2", None)
    ex.selected_unit = "missing"  # shown under the widget, not raised into the kernel
    assert ex.selected_unit is None and ex.view.selected_unit is None
    assert "no wrap unit 'missing'" in str(ex.errors.last_error)


def test_explorer_current_unit_and_area(report: Report) -> None:
    ex = Explorer(report)
    ex.current_unit = "blocks.0"
    assert ex.view.current_unit == "blocks.0"
    click(ex.view, area="rank_bytes")
    assert ex.area == "rank_bytes"
    ex.view.error = "TypeError: x is undefined"  # what the JS reports
    assert "explorer (browser): TypeError" in str(ex.errors.last_error)


def test_explorer_without_model_cannot_replan(report: Report) -> None:
    ex = Explorer(report)
    assert ex.replanner is None
    assert all(c.disabled for c in ex.controls._all)
    assert "model" in ex.controls.world_size.tooltip
    # said in the widget too, not only in a tooltip
    assert ex.controls.note.layout.display is None
    assert "to change them and re-plan, give the model: report.show(model=model, " in (
        ex.controls.note.value
    )
    assert Explorer(report, model=Tiny(), inputs=tiny_inputs()).controls.note.layout.display == (
        "none"
    )
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
    assert isinstance(view.prefetch, PrefetchWidget)
    # step -> the current unit is outlined in the explorer and ringed in the prefetch graph
    step = next(i for i, e in enumerate(report.iterations[-1]) if e.unit == "blocks.1")
    view.timeline.step = step
    assert view.timeline.current_unit == "blocks.1"
    assert view.explorer.view.current_unit == view.prefetch.current_unit == "blocks.1"
    # a click in the timeline (it sends selected_unit and step) selects everywhere, in place
    click(view.timeline, selected_unit="blocks.2", step=step + 1)
    assert view.selected_unit == view.explorer.view.selected_unit == "blocks.2"
    assert view.prefetch.selected_unit == "blocks.2" and view.timeline.step == step + 1
    # a click in the explorer or the prefetch graph: selected everywhere, and the timeline
    # goes to that unit's next event
    click(view.explorer.view, selected_unit="blocks.0", selected_module="blocks.0.norm")
    assert view.timeline.selected_unit == view.prefetch.selected_unit == "blocks.0"
    assert view.timeline.current_unit == "blocks.0" and view.timeline.step > step + 1
    before = view.timeline.step
    click(view.prefetch, selected_unit="")
    assert view.timeline.selected_unit == view.explorer.selected_unit == ""
    assert view.timeline.current_unit == "" and view.timeline.step != before
    # set from Python: every view shows it, the timeline stays
    at = view.timeline.step
    view.selected_unit = "blocks.2"
    assert view.prefetch.selected_unit == view.timeline.selected_unit == "blocks.2"
    assert view.timeline.step == at
    # re-plan: the other views follow in the same answer, the memory model runs again
    view.explorer.controls.set(backward_prefetch="BACKWARD_POST")
    assert view.timeline.peak_step is not None
    assert len(view.timeline.data["memory"][0]["total"]) == len(view.explorer.report.iterations[-1])
    assert "BACKWARD_POST" in view.prefetch.data["title"]
    assert view.prefetch.selected_unit == "blocks.2"  # still a unit of the new plan
    assert view.errors.last_error is None and view.explorer.errors.last_error is None


def test_a_re_plan_hides_the_old_plan_until_each_view_has_the_new_one(report: Report) -> None:
    """Each view is told a re-plan started before any work is done, and gets the new plan's
    data and the end of it in one message: the old plan's numbers are never shown beside the
    new plan's."""
    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
    sent: list[tuple[str, dict[str, Any]]] = []
    for name, w in (("explorer", view.explorer.view), ("prefetch", view.prefetch),
                    ("timeline", view.timeline)):  # fmt: skip
        w.send_state = lambda key=None, name=name, w=w: sent.append(  # type: ignore[method-assign]
            (name, w.get_state(key))
        )
    view.explorer.controls.set(world_size=16)
    busy = [name for name, state in sent if state.get("busy") is True]
    assert sorted(busy) == ["explorer", "prefetch", "timeline"]
    first_data = min(i for i, (_, state) in enumerate(sent) if "data" in state)
    assert all(i < first_data for i, (_, s) in enumerate(sent) if s.get("busy") is True)
    for name in ("prefetch", "timeline"):
        (message,) = [s for n, s in sent if n == name and "data" in s]
        assert message["busy"] is False  # the new data and the end of busy together
    assert not (view.explorer.busy or view.prefetch.busy or view.timeline.busy)
    assert "world size 16" in view.explorer.view.data["title"]


def test_a_re_plan_ends_before_the_garbage_collector_runs_again(report: Report) -> None:
    """The collector, paused while the answer is made, runs again only once every view has
    been told the re-plan is over: its pass over what the answer made (tens of ms on a large
    model) does not hold back the new plan on the screen."""
    import gc

    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
    order: list[str] = []
    for name, w in (("explorer", view.explorer.view), ("prefetch", view.prefetch),
                    ("timeline", view.timeline)):  # fmt: skip
        w.send_state = lambda key=None, name=name, w=w: order.append(  # type: ignore[method-assign]
            f"{name} busy" if w.get_state(key).get("busy") is False else name
        )

    def collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            order.append("collection")

    gc.collect()
    gc.callbacks.append(collected)
    try:
        view.explorer.controls.set(world_size=16)
    finally:
        gc.callbacks.remove(collected)
    assert "explorer busy" in order, order
    if "collection" in order:
        assert order.index("collection") > order.index("explorer busy"), order
    assert not (view.explorer.busy or view.prefetch.busy or view.timeline.busy)


def test_a_failed_re_plan_shows_the_old_plan_again(
    report: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
    assert view.explorer.replanner is not None

    def fail(opts: PlanOptions) -> Report:
        raise ValueError("no")

    monkeypatch.setattr(view.explorer.replanner, "plan", fail)
    view.explorer.controls.set(world_size=32)
    assert not (view.explorer.busy or view.prefetch.busy or view.timeline.busy)
    assert view.explorer.report is report


def test_dashboard_saves_what_it_shows(report: Report, tmp_path: Path) -> None:
    """The page of a dashboard is drawn from its widgets' own state: the plan after a
    re-plan, the step, the selection, the explorer's focus."""
    import json

    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
    view.explorer.controls.set(world_size=16)
    view.timeline.step = 5
    view.selected_unit = "blocks.1"
    view.explorer.focus = "blocks"
    page = view.save(tmp_path / "now.html").read_text()
    config = json.loads(page_script(page, "fv-config"))
    states = config["views"]
    assert states["timeline"]["data"] == view.timeline.data and states["timeline"]["step"] == 5
    assert states["timeline"]["selected_unit"] == "blocks.1"
    assert states["explorer"]["data"] == view.explorer.view.data
    assert states["explorer"]["focus"] == "blocks"
    assert states["prefetch"]["data"]["title"] == view.prefetch.data["title"]
    assert "world size 16" in page


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
    ex.select_module("blocks.0.norm")
    assert ex.selected_module == "blocks.0.norm" and ex.view.selected_unit == "blocks.0"
    ex.selected_unit = "blocks.1"
    assert ex.selected_module is None and ex.view.selected_module is None
    ex.selected_unit = None
    assert ex.view.selected_unit is None


def test_controls_changed_as_the_page_does(report: Report) -> None:
    """``set(..., as_browser=True)`` sends each control the state the page sends (an index
    for the pickers); the explorer re-plans exactly as for a change made from Python."""
    ex = Explorer(report, model=Tiny(), inputs=tiny_inputs())
    answered: list[int] = []
    ex.observe(lambda c: answered.append(c["new"].config.world_size), names="report")
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
    assert len(answered) == len(changes) and ex.errors.last_error is None


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
    # in GiB, as the printed table (table.summary()) counts them
    assert all(gib(r["peak_bytes"]) in p for r, p in zip(table.rows, peaks, strict=True))
    assert all(re.search(r">\S* ?\d+\.\d\d GiB", p) for p in peaks), peaks
    assert "moved GiB" in table.summary()
    best = [c.value for c in rows if "fsdpviz-sweep-best" in getattr(c, "value", "")]
    assert best and "★" in best[0]
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


def test_explorer_find_selects_and_draws_the_module(report: Report) -> None:
    """What the find box does: a unit or module name, (root), or a part of a name; the
    module is selected and drawn (at the top, or inside its parent for a leaf)."""
    ex = Explorer(report)
    assert ex.find("blocks.1") == "blocks.1"
    assert (ex.selected_unit, ex.selected_module, ex.view.focus) == ("blocks.1",) * 3
    assert "found 'blocks.1'" in ex.status.value
    ex.find("FC")  # no unit's name holds it: the first module's does
    assert (ex.selected_unit, ex.selected_module) == ("blocks.0", "blocks.0.fc")
    assert ex.view.focus == "blocks.0"
    ex.find("(root)")
    assert ex.selected_unit == "" and ex.view.focus == ""
    with pytest.raises(KeyError, match="no unit or module matches 'zzz'"):
        ex.find("zzz")
    assert ex.selected_unit == "" and ex.errors.last_error is None


def test_the_dashboard_says_the_warnings() -> None:
    """A plan that does not fit: the dashboard lists the warning's text (what does not fit,
    and the first thing to try), as the card does; one warning is "1 warning"."""
    from fsdpviz.views.card import report_html

    big = analyze_tiny()
    fitting = fsdpviz.replan.replay(big, world_size=4)
    tiny = fsdpviz.cost.machine("h100", memory_gib=1e-4, name="Tiny GPU")
    report = fsdpviz.analyze(
        Tiny(), tiny_inputs(), auto_wrap_policy=ModuleWrapPolicy({Block}), machine=tiny
    )
    [warning] = report.warnings
    assert warning.code == "out_of_memory"
    view = Dashboard(report)
    assert view.explorer.warnings in view.children
    shown = view.explorer.warnings.value
    assert "1 warning<" in shown and "out_of_memory" in shown
    assert "does not fit in Tiny GPU: peak" in shown and "First try: " in shown
    assert shown in report_html(report)  # the card's list, word for word
    assert "1 warning" in view.explorer.status.value
    assert "1 warnings" not in view.explorer.status.value
    quiet = Dashboard(fitting)
    assert quiet.explorer.warnings.value == "" and "0 warnings" in quiet.explorer.status.value


def test_a_re_plan_gives_the_notebook_output_the_plan_on_screen(report: Report) -> None:
    """After a re-plan, the output saves the new plan (its three views' data, the static
    SVG, the summary), not the first one: the dashboard's timeline carries it to fsdpviz's
    JupyterLab extension, which puts it in the output (``saved``)."""
    import base64
    import gzip

    from fsdpviz.export import MIME

    def views(saved: dict[str, Any]) -> dict[str, Any]:
        packed = saved[MIME]["config"]
        config: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode(packed)))
        return config["views"]

    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
    first = view._repr_mimebundle_()
    assert first is not None and view.timeline.saved_output == {}
    view.explorer.controls.set(world_size=16)
    saved = view.timeline.saved_output
    assert set(saved) == {MIME, "image/svg+xml", "text/plain"}
    shown = views(saved)
    assert shown["explorer"]["data"]["title"].endswith("world size 16")
    assert shown["timeline"]["data"] == view.timeline.data
    assert saved["text/plain"].startswith(view.explorer.report.summary().splitlines()[0])
    assert "world size 16" in saved["text/plain"]
    before = f"world size {report.config.world_size}"
    assert before != "world size 16"
    assert views(first)["explorer"]["data"]["title"].endswith(before)
    # on its own, the explorer saves its own view
    alone = Explorer(report, model=Tiny(), inputs=tiny_inputs())
    alone.controls.set(world_size=2)
    assert views(alone.view.saved_output)["explorer"]["data"]["title"].endswith("world size 2")
    assert view.explorer.view.saved_output == {}  # in a dashboard, the dashboard saves
