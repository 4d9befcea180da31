"""The quick-start notebook in real JupyterLab, driven through headless Chromium as a person would.

The session's JupyterLab (``jupyterlab``, tests/browser_harness.py) has run the notebook with
Run → Run All Cells; each test looks at the page, clicks, and asks the kernel for the
widgets' Python state (directly, once the kernel has answered what the page sent). Every
wait is for something the page or the kernel does, so the tests pass on a busy machine.

Screenshots go to pytest's tmp dir and to ``tests/artifacts/`` (git-ignored).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from browser_harness import (
    EVENT_CENTRE,
    UI_MS,
    LabSession,
    canvas_background,
    choose_theme,
    click_block,
    click_every_event,
    contrast,
    explorer_root,
    explorer_state,
    load_note,
    prefetch_root,
    prefetch_state,
    timeline_root,
    views_drawn,
    wait_until,
)
from views_models import needs_front_end

from fsdpviz.views.style import theme_colors

pytestmark = needs_front_end

TESTS = Path(__file__).resolve().parent

# Error outputs render as stderr (JupyterLab has no renderer of its own for them).
_STDERR = "application/vnd.jupyter.stderr"
_ERROR_LINE = re.compile(r"^\w*(Error|Exception)\b.*:", re.MULTILINE)

# What the kernel reports about the quick-start dashboard `view`.
_STATE = (
    "{'selected_unit': view.selected_unit, "
    "'explorer_selected_unit': view.explorer.selected_unit, "
    "'selected_module': view.explorer.selected_module, "
    "'timeline_selected_unit': view.timeline.selected_unit, "
    "'prefetch_selected_unit': view.prefetch.selected_unit, "
    "'step': view.timeline.step, 'current_unit': view.timeline.current_unit, "
    "'errors': [view.timeline.error, view.explorer.view.error, view.prefetch.error], "
    "'last_error': repr(view.errors.last_error or view.explorer.errors.last_error), "
    "'executable': __import__('sys').executable}"
)


def dashboard(s: LabSession) -> Any:
    """The output of the quick-start cell that shows the dashboard."""
    return (
        s.page.locator(".jp-CodeCell")
        .filter(has_text="view = report.show")
        .locator(".jp-Cell-outputArea")
    )


def _rgb(hex_color: str) -> list[int]:
    return [int(hex_color[k : k + 2], 16) for k in (1, 3, 5)]


# ---------------------------------------------------------------------------- tests


def test_quickstart_runs_and_draws_the_views(jupyterlab: LabSession) -> None:
    s = jupyterlab
    page = s.page
    stderr = page.locator(f'.jp-OutputArea-output[data-mime-type="{_STDERR}"]')
    raised = [t for t in stderr.all_inner_texts() if "Traceback" in t or _ERROR_LINE.search(t)]
    assert not raised, "a cell raised:\n" + "\n".join(raised)
    outputs = "\n".join(page.locator(".jp-OutputArea").all_inner_texts())
    for bad in ("Error displaying widget", "Error rendering", "Traceback", "fsdpviz:"):
        assert bad not in outputs, f"{bad!r} in the notebook's outputs:\n{outputs}"
    assert page.locator(".fv-error").count() == 0
    out = dashboard(s)
    units = s.py("[u.module for u in report.units]")

    # The explorer: every unit's own block drawn, labelled where its label fits
    root = explorer_root(out)
    explorer = explorer_state(root)
    drawn = root.evaluate(
        "(r, names) => names.map(n => r.fsdpviz.slotOf(r.fsdpviz.index.byName.get(n)))", units
    )
    assert all(slot is not None and slot["w"] >= 1 for slot in drawn), drawn
    labels = {label["text"]: label["w"] for label in explorer["labels"]}
    assert "(root) LlamaForCausalLM [unit 0]" in labels
    wide = [u for u, slot in zip(units, drawn, strict=True) if slot["w"] > 200]
    assert all(any(f"[unit {units.index(u)}]" in t for t in labels) for u in wide), labels
    assert explorer["title"] == f"{len(units)} units, world size 8"

    # The prefetch graph: every unit on its line, in forward order
    graph = prefetch_state(prefetch_root(out))
    assert graph["n"] == len(units) and graph["window"] == [0, len(units)]
    assert graph["title"] == s.py("fsdpviz.views.prefetch_data(report)['title']")

    # The timeline: first on the dashboard, controls, a painted canvas, the step described
    timeline = timeline_root(out)
    top = out.bounding_box()["y"]
    assert timeline.bounding_box()["y"] - top < 300  # above the explorer, not below it
    assert explorer_root(out).bounding_box()["y"] > timeline.bounding_box()["y"]
    assert timeline.get_by_role("button", name="step forward (→)").is_visible()
    painted = timeline.locator("canvas").first.evaluate(
        """c => {
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let n = 0;
          for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
          return {painted: n / (c.width * c.height), width: c.width, height: c.height};
        }"""
    )
    assert painted["width"] > 300 and painted["height"] > 100, painted
    assert painted["painted"] > 0.1, painted
    info = timeline.locator(".fv-info").inner_text()
    assert re.match(r"step 10 of \d+ · \w+ unit \d+ '", info), info  # view.timeline.step = 10
    # the numbers the page shows are Python's
    peak = s.py(
        "[report.memory.peak['bytes'], fsdpviz.views.format_bytes(report.memory.peak['bytes'])]"
    )
    assert timeline.locator(".fv-peak").first.get_attribute("data-fv-peak-bytes") == str(peak[0])
    assert f"peak {peak[1]} per rank" in timeline.locator(".fv-header").inner_text()
    s.screenshot("timeline", timeline)

    state = s.py(_STATE)
    assert state["executable"] == sys.executable, "the kernel is not the Python running pytest"
    assert state["current_unit"] == s.py("report.iterations[-1][10].unit")
    assert (
        explorer["current"]
        == prefetch_state(prefetch_root(out))["current"]
        == state["current_unit"]
    )
    assert state["errors"] == ["", "", ""] and state["last_error"] == "None", state
    s.screenshot("dashboard-light", out)
    s.assert_no_browser_errors()


def test_click_in_the_explorer_selects_the_unit(jupyterlab: LabSession) -> None:
    """A click on a block: the unit is selected in every view, the kernel hears it, the
    timeline goes to its next event, and the detail panel beside the icicle describes it
    with Python's numbers."""
    s = jupyterlab
    out = dashboard(s)
    root = explorer_root(out)
    unit = s.py("report.units[2].module")
    step = s.py("view.timeline.step")
    click_block(s.page, root, unit)
    explorer = explorer_state(root)
    assert explorer["model"]["selected_unit"] == unit and explorer["focus"] == unit
    state = s.py(_STATE)
    assert state["selected_unit"] == unit, state
    assert state["explorer_selected_unit"] == state["timeline_selected_unit"] == unit, state
    assert state["prefetch_selected_unit"] == unit and state["selected_module"] == unit, state
    assert state["step"] != step and state["current_unit"] == unit  # its next event
    assert prefetch_state(prefetch_root(out))["selected"] == unit
    detail = s.py("fsdpviz.views.unit_details(report)[2]")
    panel = explorer_state(root)["detail"]
    assert detail["title"] in panel and detail["facts"] in panel
    for section in detail["sections"]:
        for row in section.get("rows", [])[:5]:
            assert "".join(row) in panel.replace("\n", ""), row
    # beside the icicle, inside the output: nothing is cut off, it scrolls on its own
    box = out.locator(".fv-detail")
    body = out.locator(".fv-detail-body")
    area, icicle, panel_box = out.bounding_box(), root.bounding_box(), box.bounding_box()
    assert panel_box["x"] >= icicle["x"] + icicle["width"] - 1
    assert panel_box["x"] + panel_box["width"] <= area["x"] + area["width"] + 1
    assert body.evaluate("b => getComputedStyle(b).overflowY") == "auto"
    s.screenshot("explorer-after-click", out.locator(".fsdpviz-explorer-box"))
    s.assert_no_browser_errors()


def test_click_on_a_timeline_event_selects_its_unit(jupyterlab: LabSession) -> None:
    """A click at the centre of an all-gather of another unit: the page selects that event,
    and the kernel's dashboard (explorer and timeline) selects its unit at that step."""
    s = jupyterlab
    timeline = timeline_root(dashboard(s))
    handle = timeline.element_handle()
    before = s.py(_STATE)["selected_unit"]
    step = handle.evaluate(
        """(root, before) => { const d = root.fsdpviz.data, st = d.steps;
             for (let k = 0; k < d.n_steps; k++)
               if (d.kinds[st.kind[k]] === 'all_gather' && d.units[st.unit[k]] !== before)
                 return k;
             return -1; }""",
        before,
    )
    assert step >= 0, f"every all-gather is of the selected unit {before!r}"
    x, y, *_ = s.page.evaluate(EVENT_CENTRE, [handle, step])
    s.page.mouse.click(x, y)
    info = timeline.locator(".fv-info")
    m = re.match(
        rf"step {step} of \d+ · all_gather unit \d+ (?:'([^']*)'|\(root\))", info.inner_text()
    )
    assert m, info.inner_text()
    unit = m.group(1) or ""  # the root's unit reads (root)
    assert unit != before
    state = s.py(_STATE)
    assert state["timeline_selected_unit"] == state["selected_unit"] == unit, state
    assert state["explorer_selected_unit"] == unit and state["step"] == step, state
    s.screenshot("timeline-after-click", timeline)
    s.assert_no_browser_errors()


def test_step_button_moves_the_timeline(jupyterlab: LabSession) -> None:
    s = jupyterlab
    timeline = timeline_root(dashboard(s))
    info = timeline.locator(".fv-info")
    canvas = timeline.locator("canvas").first
    m = re.match(r"step (\d+) of (\d+)", info.inner_text())
    assert m, info.inner_text()
    step, n = int(m.group(1)), int(m.group(2))
    if step + 1 >= n:
        timeline.get_by_role("button", name="first step (Home)").click()
        step = 0
    image = canvas.evaluate("c => c.toDataURL()")
    timeline.get_by_role("button", name="step forward (→)").click()
    wait_until(
        s.page,
        "([el, text]) => el.textContent.startsWith(text)",
        "the timeline to step",
        arg=[info.element_handle(), f"step {step + 1} of {n} · "],
        timeout_ms=UI_MS,
    )
    assert timeline.locator("input.fv-slider").input_value() == str(step + 1)
    assert canvas.evaluate("c => c.toDataURL()") != image, "the canvas did not change"
    state = s.py(_STATE)
    assert state["step"] == step + 1
    out = dashboard(s)
    current = explorer_state(explorer_root(out))["current"]
    assert current == prefetch_state(prefetch_root(out))["current"] == state["current_unit"]
    s.assert_no_browser_errors()


def test_dark_theme_restyles_every_view(jupyterlab: LabSession) -> None:
    """Settings → Theme → JupyterLab Dark: each view reads the theme from the page itself
    (nothing goes to the kernel and back) and draws on JupyterLab's background; back to
    light the same way. The sweep's best row stays readable in both."""
    s = jupyterlab
    out = dashboard(s)
    for theme, light, name in [
        ("JupyterLab Dark", False, "dark"),
        ("JupyterLab Light", True, "light"),
    ]:
        choose_theme(s.page, theme, light)
        bg = s.page.evaluate(
            "() => { const d = document.createElement('div');"
            " d.style.color = 'var(--jp-layout-color0)'; document.body.append(d);"
            " const c = getComputedStyle(d).color; d.remove();"
            " return c.match(/\\d+/g).slice(0, 3).map(Number); }"
        )
        assert contrast(bg, _rgb(theme_colors(name)["bg"])) < 1.3  # JupyterLab's own shade
        for root in (explorer_root(out), prefetch_root(out)):
            assert canvas_background(root) == bg, (name, root)
        assert timeline_root(out).evaluate("t => t.fsdpviz.theme.name") == name
        # JupyterLab hides the notebook for a moment while it swaps themes: the timeline
        # keeps filling the cell's width instead of shrinking to its minimum.
        widths = timeline_root(out).evaluate(
            "t => [t.clientWidth, t.querySelector('canvas').getBoundingClientRect().width]"
        )
        assert widths[0] > 600 and abs(widths[0] - widths[1]) <= 1, widths
        if name == "dark":
            s.screenshot("dashboard-dark", out)
    assert s.py(_STATE)["last_error"] == "None"
    s.assert_no_browser_errors()


def test_controls_re_plan_every_view(jupyterlab: LabSession) -> None:
    """World size (a replay) and forward prefetch (a plan from the stored trace) changed in
    the page: all three views draw the new plan (none shows the old plan's numbers meanwhile),
    and once the controls rest the memory curve gains the activations from a trace."""
    s = jupyterlab
    out = dashboard(s)
    # the status line's box (its text is written anew on each answer)
    status = out.locator(".widget-html-content").filter(
        has_text=re.compile(r"^\d+ units?, \S+ \S+ of parameters per rank")
    )
    world = out.locator(".widget-dropdown", has_text="world size").locator("select")
    world.select_option("64")
    wait_until(
        s.page,
        "el => /re-planned in \\d+ ms \\(replay\\)/.test(el.textContent)",
        "the world-size re-plan",
        arg=status.element_handle(),
        timeout_ms=UI_MS,
    )
    s.settle()
    assert explorer_state(explorer_root(out))["title"].endswith("world size 64")
    timeline = timeline_root(out)
    assert "world size 64" in timeline.locator(".fv-header").inner_text()
    assert not out.locator(".fv-busy").count()
    # the numbers follow too: the explorer's bytes per rank are the new plan's
    rank_bytes = explorer_root(out).evaluate("r => r.fsdpviz.data.modules.rank_bytes[0]")
    assert rank_bytes == s.py(
        "fsdpviz.views.module_tree(view.explorer.report).nodes[0].rank_bytes_total"
    )
    out.get_by_role("checkbox", name="forward prefetch").check()
    wait_until(
        s.page,
        "el => /re-planned in \\d+ ms \\(stored trace\\)/.test(el.textContent)",
        "a stored-trace plan",
        arg=status.element_handle(),
        timeout_ms=UI_MS,
    )
    s.settle()
    assert "forward_prefetch=True" in prefetch_state(prefetch_root(out))["title"]
    note = out.locator(".widget-html-content").filter(has_text=re.compile(r"^memory: "))
    wait_until(
        s.page,
        "el => el.textContent.includes('activations included')",
        "the traced memory curve",
        arg=note.element_handle(),
        timeout_ms=UI_MS,
    )
    state = s.py(
        "{'world_size': view.explorer.report.config['world_size'], "
        "'forward_prefetch': view.explorer.report.config['forward_prefetch'], "
        "'path': view.explorer.replanner.last_path, "
        "'curve_is_traced': view.timeline.data['memory'][0]['total'] == "
        "fsdpviz.cost.memory_lane(view.explorer.replanner.cached(view.explorer.options)).total, "
        "'peak': view.timeline.peak_bytes, "
        "'clock': view.timeline.data['clock'], "
        "'errors': repr(view.errors.last_error or view.explorer.errors.last_error)}"
    )
    assert state["world_size"] == 64 and state["forward_prefetch"] is True, state
    assert state["curve_is_traced"] and state["clock"].startswith("modelled on H100"), state
    assert state["errors"] == "None", state
    s.settle()
    header = timeline.locator(".fv-peak").first.get_attribute("data-fv-peak-bytes")
    assert header == str(state["peak"])
    s.screenshot("dashboard-after-re-plan", out)
    s.assert_no_browser_errors()


def test_a_click_zooms_into_a_block_and_the_path_leads_back(jupyterlab: LabSession) -> None:
    """A click on a block with modules below draws it at the top (the kernel hears the focus
    and the selection); the path above the blocks leads back up, selecting nothing."""
    s = jupyterlab
    out = dashboard(s)
    root = explorer_root(out)
    click_block(s.page, root, "model")
    assert explorer_state(root)["focus"] == "model"
    assert s.py("[view.explorer.focus, view.explorer.selected_module]") == ["model", "model"]
    root.locator(".fv-crumbs button", has_text="(root)").click()
    assert explorer_state(root)["focus"] == ""
    assert s.py("[view.explorer.focus, view.explorer.selected_module]") == ["", "model"]
    s.assert_no_browser_errors()


# The views below are added at the end of the notebook: keep these tests last.


def test_every_event_of_a_49_unit_plan_and_a_recording_answers_its_click(
    jupyterlab: LabSession,
) -> None:
    """In JupyterLab: the centre of every event's mark selects exactly that event (and the
    kernel hears the last one), for a 49-unit plan and for each rank of a recording."""
    s = jupyterlab
    s.run_new_cell(
        f"import sys as _sys\n_sys.path.insert(0, {str(TESTS)!r})\n"
        "from export_models import recorded_run as _run, report_49_units as _r49\n"
        "big49 = fsdpviz.widgets.TimelineWidget(_r49())\nbig49"
    )
    timeline = timeline_root(s.last_output())
    timeline.locator("canvas").first.wait_for(timeout=UI_MS)
    n, wrong = click_every_event(s.page, timeline)
    assert n == 243 and wrong == []
    assert s.py("[big49.step, big49.selected_unit]") == [242, ""]  # the root's
    s.run_new_cell("run2 = _run()\nrun2.show()")
    timeline = timeline_root(s.last_output())
    timeline.locator("canvas").first.wait_for(timeout=UI_MS)
    n, wrong = click_every_event(s.page, timeline)
    assert n == 36 and wrong == []
    s.screenshot("recording-after-clicks", timeline)
    s.assert_no_browser_errors()


def test_every_show_draws_in_jupyterlab(jupyterlab: LabSession) -> None:
    """A rank's recording, a comparison and a sweep table, each shown by its show(); the
    sweep's best row (★) reads in the light and the dark theme, its bytes in GiB."""
    s = jupyterlab
    s.run_new_cell("run2.ranks[1].show()")
    views_drawn(s.last_output(), "a rank's dashboard")
    groups = s.last_output().locator(".fv-group-summary").all_inner_texts()
    assert len(groups) == 1 and "recording" in groups[0], groups
    s.run_new_cell(
        "fsdp2 = fsdpviz.analyze(model, inputs, fully_shard=[LlamaDecoderLayer], world_size=8)\n"
        "fsdpviz.compare(report, fsdp2).show()"
    )
    timeline = timeline_root(s.last_output())
    timeline.locator("canvas").first.wait_for(timeout=UI_MS)
    header = timeline.locator(".fv-group-summary").all_inner_texts()
    assert len(header) == 2 and "FSDP1" in header[0] and "FSDP2" in header[1], header
    s.screenshot("comparison", timeline)
    s.run_new_cell(
        "sweep_view = fsdpviz.sweep(model, inputs, fully_shard=[LlamaDecoderLayer], "
        "world_size=[8, 64]).show()\nsweep_view"
    )
    table = s.last_output().locator(".fsdpviz-sweep")
    table.wait_for(timeout=UI_MS)
    cells = table.locator(".widget-html")
    assert any(" GiB" in t for t in cells.all_inner_texts())
    best = table.locator(".fsdpviz-sweep-best").first
    for theme, light in [("JupyterLab Dark", False), ("JupyterLab Light", True)]:
        choose_theme(s.page, theme, light)
        colours = best.evaluate(
            """el => { const c = getComputedStyle(el);
              const rgb = (s) => s.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number);
              return [rgb(c.color), rgb(c.backgroundColor)]; }"""
        )
        ratio = contrast(*colours)
        assert ratio >= 4.5, (theme, colours, ratio)
    table.get_by_role("button", name="open").first.click()
    views_drawn(s.last_output(), "a sweep row's dashboard")
    s.screenshot("sweep", s.last_output())
    assert s.py("sweep_view.opened") in {0, 1}
    s.assert_no_browser_errors()


def test_a_wait_that_ends_on_its_failsafe_names_a_busy_machine(
    jupyterlab: LabSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait that ends on its failsafe says what it waited for, and that the machine was
    busy when it was (the message a newcomer on a loaded machine gets)."""
    s = jupyterlab
    cpus = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0 * cpus, 0.0, 0.0))
    with pytest.raises(AssertionError) as info:
        wait_until(s.page, "() => false", "something that never happens", timeout_ms=200)
    text = str(info.value)
    assert text.startswith("waited 0 s for something that never happens; the machine was busy")
    assert f"load average {3.0 * cpus:.1f}" in text and load_note() in text
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert load_note() == ""


def test_a_bottleneck_row_selects_its_event_in_the_notebook(jupyterlab: LabSession) -> None:
    """The dashboard's timeline ranks the step's waits beside its lanes, as
    report.timeline.bottlenecks() does; a click on a row moves the kernel's timeline there.
    (Last in the file: the unit it selects is brought into view in the explorer.)"""
    s = jupyterlab
    timeline = timeline_root(dashboard(s))
    rows = timeline.locator(".fv-bottleneck-table tbody tr")
    want = s.py(
        "[(b['kind'], b['exposed_s'], b['reason'], b['event']) "
        "for b in view.timeline._reports[0].timeline.bottlenecks()]"
    )
    assert want and rows.count() == len(want)
    steps = s.py("view.timeline.data['steps']['index']")
    for k, (kind, _exposed, reason, event) in enumerate(want[:10]):
        row = rows.nth(k)
        assert reason in row.inner_text() and kind in row.inner_text()
        assert steps[int(row.get_attribute("data-fv-step") or -1)] == event
    target = rows.nth(min(len(want), 10) - 1)
    step = int(target.get_attribute("data-fv-step") or -1)
    target.click()
    info = timeline.locator(".fv-info")
    wait_until(
        s.page,
        "([el, text]) => el.textContent.startsWith(text)",
        "the timeline to go to the row's event",
        arg=[info.element_handle(), f"step {step} of "],
        timeout_ms=UI_MS,
    )
    state = s.py(_STATE)
    assert state["step"] == step, state
    s.screenshot("bottleneck-row-clicked", timeline)
    s.assert_no_browser_errors()
