"""The quick-start notebook in real JupyterLab, driven through headless Chromium as a person would.

One JupyterLab server and one browser page for the module: the notebook is opened and run
with Run → Run All Cells, then each test looks at the page, clicks, and asks the kernel for
the widgets' Python state through a cell it adds and runs in the UI.

Screenshots go to pytest's tmp dir and to ``tests/artifacts/`` (git-ignored).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser_harness import (
    CHROMIUM_ARGS,
    EVENT_CENTRE,
    KernelTraffic,
    LabServer,
    choose_theme,
    chromium_executable,
    click_every_event,
    jupyterlab_server,
    require_browser_stack,
)
from views_models import needs_front_end

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
NOTEBOOK = "quickstart.ipynb"

KERNEL_START_MS = 60_000
RUN_ALL_MS = 180_000
CELL_MS = 60_000
UI_MS = 20_000

# Error outputs render as stderr (JupyterLab has no renderer of its own for them).
_STDERR = "application/vnd.jupyter.stderr"
_ERROR_LINE = re.compile(r"^\w*(Error|Exception)\b.*:", re.MULTILINE)

# What the kernel reports about the dashboard `view` (one JSON line).
_STATE_CELL = (
    "import json as _json, os as _os, sys as _sys\n"
    "print(_json.dumps({'selected_unit': view.selected_unit, "
    "'explorer_selected_unit': view.explorer.selected_unit, "
    "'selected_module': view.explorer.selected_module, "
    "'timeline_selected_unit': view.timeline.selected_unit, "
    "'step': view.timeline.step, 'theme': view.timeline.theme, "
    "'error': view.timeline.error, "
    "'last_error': repr(view.errors.last_error or view.explorer.errors.last_error), "
    "'executable': _sys.executable, 'pid': _os.getpid()}))"
)

# plotly.js draws NaN paths during an icicle's zoom transition when marker.line.width is an
# array (the explorer outlines the current unit that way); the end state is drawn right.
_TOLERATED = re.compile(r'^Error: <path> attribute d: Expected number, ".*NaN')

pytestmark = needs_front_end


@dataclass
class Session:
    """The page with the run notebook, and what the browser reported so far."""

    lab: LabServer
    page: Any  # playwright.sync_api.Page
    shots: Path
    traffic: KernelTraffic
    errors: list[str] = field(default_factory=list)

    def dashboard(self) -> Any:
        """The output of the cell that shows the dashboard (the one with the timeline)."""
        return self.page.locator(".jp-CodeCell").filter(has=self.page.locator(".fsdpviz-timeline"))

    def timeline(self) -> Any:
        return self.dashboard().locator(".fsdpviz-timeline")

    def explorer_plot(self) -> Any:
        return (
            self.dashboard()
            .locator(".js-plotly-plot")
            .filter(has=self.page.locator(".iciclelayer .slice, .treemaplayer .slice"))
        )

    def screenshot(
        self, name: str, locator: Any = None, *, show: Any = None, block: str = "start"
    ) -> Path:
        """``locator``, else the page scrolled to ``show`` at its ``block``, as ``name.png``."""
        path = self.shots / f"{name}.png"
        self.page.mouse.move(1, 1)  # no hover label over the figures
        if show is not None:
            show.evaluate("(e, block) => e.scrollIntoView({block})", block)
        (locator or self.page).screenshot(path=str(path))
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(path, ARTIFACTS / path.name)
        return path

    def run_new_cell(self, code: str) -> str:
        """Add a cell at the end of the notebook through the UI, run it, return its output."""
        page = self.page
        cells = page.locator(".jp-Notebook .jp-Cell")
        n = cells.count()
        cells.nth(n - 1).locator(".jp-InputPrompt").click()
        toolbar = page.get_by_role("toolbar", name="main area toolbar")
        toolbar.get_by_role("button", name=re.compile(r"^Insert a cell below")).click()
        new = cells.nth(n)
        new.wait_for(timeout=UI_MS)
        new.locator(".cm-content").click()
        page.keyboard.insert_text(code)
        page.keyboard.press("Control+Enter")  # run, stay on the cell
        prompt = new.locator(".jp-InputPrompt")
        _wait_for_text(prompt, r"^\[\d+\]:$", CELL_MS, "the added cell to finish")
        return str(new.locator(".jp-Cell-outputArea").first.inner_text())

    def kernel_state(self) -> dict[str, Any]:
        out = self.run_new_cell(_STATE_CELL)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"no state printed by the kernel; the cell showed:\n{out}"
        state: dict[str, Any] = json.loads(lines[-1])
        return state

    def on_console(self, message: Any) -> None:
        if message.type == "error" and not _TOLERATED.search(message.text):
            self.errors.append(f"console.error: {message.text}")

    def assert_no_browser_errors(self) -> None:
        assert not self.errors, "errors in the browser:\n" + "\n".join(self.errors)


def _wait_for_text(locator: Any, pattern: str, timeout_ms: int, what: str) -> None:
    from playwright.sync_api import expect

    try:
        expect(locator).to_have_text(re.compile(pattern), timeout=timeout_ms)
    except AssertionError as e:
        raise AssertionError(f"timed out waiting for {what}: {e}") from e


def _prepare_notebook(root: Path) -> None:
    """A copy of the quick-start notebook, outputs cleared, in the server's root."""
    nb = nbformat.read(QUICKSTART, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nbformat.write(nb, root / NOTEBOOK)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    require_browser_stack()
    chromium = chromium_executable()
    from playwright.sync_api import sync_playwright

    root = tmp_path_factory.mktemp("lab") / "root"
    root.mkdir()
    shots = tmp_path_factory.mktemp("screenshots")
    _prepare_notebook(root)
    with jupyterlab_server(root) as lab, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            s = Session(lab, page, shots, KernelTraffic(page))
            page.on("pageerror", lambda e: s.errors.append(f"page error: {e}"))
            page.on("console", s.on_console)
            try:
                _open_and_run_all(s)
            except Exception:
                s.screenshot("failed-run-all")
                raise
            yield s
        finally:
            browser.close()


def _open_and_run_all(s: Session) -> None:
    page = s.page
    page.goto(s.lab.url + f"lab/tree/{NOTEBOOK}")
    # The indicator reads "idle" before the session exists too: first wait for the page's
    # connection to the kernel (the server counts it), then for the kernel to be idle.
    s.lab.wait_for_kernel_connection(KERNEL_START_MS / 1000)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]").wait_for(
        timeout=KERNEL_START_MS
    )
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    # Done: no cell queued or running, and every code cell ran (or one failed: Run All stops).
    page.wait_for_function(
        """() => {
          const STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';
          const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
            .map(p => p.textContent.trim());
          const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
          const idle = status !== null && status.dataset.status === 'idle';
          const failed = [...document.querySelectorAll(STDERR)]
            .some(o => o.textContent.includes('Traceback'));
          return idle && !prompts.includes('[*]:')
            && (failed || prompts.every(p => /^\\[\\d+\\]:$/.test(p)));
        }""",
        timeout=RUN_ALL_MS,
    )
    s.timeline().locator("canvas").wait_for(timeout=UI_MS)
    s.screenshot("notebook-after-run-all", show=s.dashboard())


# ---------------------------------------------------------------------------- tests


def test_quickstart_runs_and_draws_the_views(session: Session) -> None:
    page = session.page
    stderr = page.locator(f'.jp-OutputArea-output[data-mime-type="{_STDERR}"]')
    raised = [t for t in stderr.all_inner_texts() if "Traceback" in t or _ERROR_LINE.search(t)]
    assert not raised, "a cell raised:\n" + "\n".join(raised)
    outputs = "\n".join(page.locator(".jp-OutputArea").all_inner_texts())
    for bad in ("Error displaying widget", "Error rendering", "Traceback", "fsdpviz:"):
        assert bad not in outputs, f"{bad!r} in the notebook's outputs:\n{outputs}"
    assert page.locator(".fv-error").count() == 0

    # The explorer: an icicle with every wrap unit labelled
    explorer = session.explorer_plot()
    labels = explorer.locator("text.slicetext").evaluate_all(
        "ts => ts.map(t => t.getAttribute('data-unformatted') || t.textContent)"
    )
    status = session.dashboard().get_by_text(re.compile(r"^\d+ units?, .* per rank")).inner_text()
    n_units = int(status.split()[0])
    assert n_units >= 2, status
    for k in range(n_units):
        assert any(f"[unit {k}]" in label for label in labels), (k, labels)

    # The prefetch graph: a second plotly figure with its unit markers
    plots = session.dashboard().locator(".js-plotly-plot")
    assert plots.count() == 2
    assert plots.nth(1).locator(".scatterlayer .point").count() >= n_units

    # The timeline: controls, a painted canvas, the current step described
    timeline = session.timeline()
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
    session.screenshot("timeline", timeline)

    state = session.kernel_state()
    assert state["executable"] == sys.executable, "the kernel is not the Python running pytest"
    assert state["theme"] == "light"  # JupyterLab's default theme, read by the widget
    assert state["error"] == "" and state["last_error"] == "None", state
    session.assert_no_browser_errors()


def test_click_in_the_explorer_selects_the_unit(session: Session) -> None:
    plot = session.explorer_plot()
    slices = plot.locator(".slice")
    labels = _slice_labels(slices)
    units = [m for label in labels if (m := _UNIT_LABEL.fullmatch(label))]
    assert len(units) > 2, f"no unit to click in the explorer: {labels}"
    session.traffic.wait_until_answered(after=-1)
    points = len(session.traffic.points)
    # Hover labels are drawn in the browser and no longer sent to the kernel: plotly's own
    # front end sent them, and ipywidgets merged a click made while one was in flight with
    # the unhover the icicle's zoom sends next, so the click was lost.
    x, y = _centre(slices, labels, units[1].group(0))
    session.page.mouse.move(x, y)
    plot.locator(".hoverlayer .hovertext").wait_for(timeout=UI_MS)
    assert units[1].group(1) in (plot.locator(".hoverlayer .hovertext").text_content() or "")
    # As a quick hand does: point at another unit and click at once.
    unit = units[2].group(1)
    x, y = _centre(slices, labels, units[2].group(0))
    session.page.mouse.move(x, y)
    session.page.mouse.click(x, y)
    picker = session.dashboard().locator(".widget-dropdown", has_text="unit").locator("select")
    _wait_for_value(picker, unit)
    assert session.traffic.points[points:] == ["plotly_click"]
    state = session.kernel_state()
    assert state["selected_unit"] == unit, state
    assert state["explorer_selected_unit"] == state["timeline_selected_unit"] == unit, state
    assert state["selected_module"] == unit, state
    explorer = session.dashboard().locator(".fsdpviz-explorer")
    detail = explorer.locator(".fsdpviz-detail")
    assert f"'{unit}'" in detail.inner_text()  # the detail panel shows the unit
    session.screenshot("explorer-after-click", explorer)
    session.assert_no_browser_errors()


_UNIT_LABEL = re.compile(r"(\S+) \[unit (\d+)\]")


def _settle(plot: Any) -> None:
    """Wait for plotly's animated transition of a redrawn hierarchy to end."""
    plot.page.wait_for_timeout(100)
    plot.page.wait_for_function(
        "el => !el._transitioning && !el._transitioningWithDuration",
        arg=plot.element_handle(),
        timeout=UI_MS,
    )
    plot.page.wait_for_timeout(600)  # the icicle's own zoom animation has no flag


def _centre(
    slices: Any, labels: list[str], label: str, part: str = "path.surface"
) -> tuple[float, float]:
    """The middle of a slice's ``part`` (its surface, or ``text.slicetext``: its label)."""
    target = slices.nth(labels.index(label)).locator(part)
    target.scroll_into_view_if_needed()
    box = target.bounding_box()
    assert box is not None
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def _slice_labels(slices: Any) -> list[str]:
    labels: list[str] = slices.evaluate_all(
        "ss => ss.map(s => s.querySelector('text.slicetext')"
        "?.getAttribute('data-unformatted') ?? '')"
    )
    return labels


def _wait_for_value(select: Any, unit: str) -> None:
    select.page.wait_for_function(
        "([el, unit]) => (el.options[el.selectedIndex]?.text ?? '').replace(/\\s/g, ' ')"
        ".endsWith(': ' + unit)",
        arg=[select.element_handle(), unit],
        timeout=UI_MS,
    )


def test_click_on_a_timeline_event_selects_its_unit(session: Session) -> None:
    """A click at the centre of an all-gather of another unit: the page selects that event,
    and the kernel's dashboard (explorer and timeline) selects its unit at that step."""
    timeline = session.timeline()
    handle = timeline.element_handle()
    before = session.kernel_state()["selected_unit"]
    step = handle.evaluate(
        """(root, before) => { const d = root.fsdpviz.data, st = d.steps;
             for (let s = 0; s < d.n_steps; s++)
               if (d.kinds[st.kind[s]] === 'all_gather' && d.units[st.unit[s]] !== before)
                 return s;
             return -1; }""",
        before,
    )
    assert step >= 0, f"every all-gather is of the selected unit {before!r}"
    x, y, *_ = session.page.evaluate(EVENT_CENTRE, [handle, step])
    session.page.mouse.click(x, y)
    info = timeline.locator(".fv-info")
    m = re.match(
        rf"step {step} of \d+ · all_gather unit \d+ (?:'([^']*)'|\(root\))", info.inner_text()
    )
    assert m, info.inner_text()
    unit = m.group(1) or ""  # the root's unit reads (root)
    assert unit != before
    state = session.kernel_state()
    assert state["timeline_selected_unit"] == state["selected_unit"] == unit, state
    assert state["explorer_selected_unit"] == unit, state
    assert state["step"] == step, state
    session.screenshot("timeline-after-click", timeline)
    session.assert_no_browser_errors()


def test_step_button_moves_the_timeline(session: Session) -> None:
    timeline = session.timeline()
    info = timeline.locator(".fv-info")
    canvas = timeline.locator("canvas").first
    m = re.match(r"step (\d+) of (\d+)", info.inner_text())
    assert m, info.inner_text()
    step, n = int(m.group(1)), int(m.group(2))
    assert step + 1 < n, "already at the last step"
    image = canvas.evaluate("c => c.toDataURL()")
    timeline.get_by_role("button", name="step forward (→)").click()
    _wait_for_text(info, rf"^step {step + 1} of {n} · ", UI_MS, "the timeline to step")
    assert timeline.locator("input.fv-slider").input_value() == str(step + 1)
    assert canvas.evaluate("c => c.toDataURL()") != image, "the canvas did not change"
    assert session.kernel_state()["step"] == step + 1
    session.screenshot("timeline-after-step", timeline)
    last = session.page.locator(".jp-Notebook .jp-Cell").last
    session.screenshot("notebook-at-the-end", show=last, block="end")
    session.assert_no_browser_errors()


def test_dark_theme_restyles_every_view(session: Session) -> None:
    """Settings → Theme → JupyterLab Dark: the timeline reads the theme, the kernel hears it and
    redraws the plotly panels dark; back to light the same way."""
    page = session.page

    def backgrounds() -> list[str]:
        plots = session.dashboard().locator(".js-plotly-plot svg.main-svg:first-of-type")
        found: list[str] = plots.evaluate_all("ss => ss.map(s => getComputedStyle(s).background)")
        return found

    for theme, light, name, bg in [
        ("JupyterLab Dark", False, "dark", "rgb(17, 17, 17)"),
        ("JupyterLab Light", True, "light", "rgb(255, 255, 255)"),
    ]:
        choose_theme(page, theme, light, timeout_ms=UI_MS)
        deadline = time.monotonic() + UI_MS / 1000
        while session.kernel_state()["theme"] != name:
            assert time.monotonic() < deadline, f"the kernel never heard of the {name} theme"
        page.wait_for_function(
            "([sel, bg]) => { const ss = [...document.querySelectorAll(sel)];"
            " return ss.length >= 2"
            " && ss.every(s => getComputedStyle(s).background.includes(bg)); }",
            arg=[".jp-CodeCell .js-plotly-plot svg.main-svg:first-of-type", bg],
            timeout=UI_MS,
        )
        assert all(bg in b for b in backgrounds()), backgrounds()
        # JupyterLab hides the notebook for a moment while it swaps themes: the timeline
        # keeps filling the cell's width instead of shrinking to its minimum.
        widths = session.timeline().evaluate(
            "t => [t.clientWidth, t.querySelector('canvas').getBoundingClientRect().width]"
        )
        assert widths[0] > 600 and abs(widths[0] - widths[1]) <= 1, widths
        if name == "dark":
            session.screenshot("dashboard-dark", session.dashboard())
    session.assert_no_browser_errors()


def test_controls_re_plan_every_view(session: Session) -> None:
    """World size (a replay) and forward prefetch (a plan from the stored trace) changed in the
    page: the explorer answers, the prefetch graph and the timeline follow, and once the controls
    rest the memory curve gains the activations from a trace."""
    explorer = session.dashboard().locator(".fsdpviz-explorer")
    status = explorer.get_by_text(re.compile(r"^\d+ units?, .* per rank"))
    world = explorer.locator(".widget-dropdown", has_text="world size").locator("select")
    world.select_option("64")
    _wait_for_text(status, r"re-planned in \d+ ms \(replay\)", UI_MS, "the world-size re-plan")
    title = session.explorer_plot().locator(".gtitle")
    _wait_for_text(title, r"world size 64$", UI_MS, "the explorer to redraw")
    # the modules' bytes per rank in the hover text follow too (the trace, not only the title)
    per_rank = session.explorer_plot().evaluate("gd => gd.data[0].customdata[0][4]")
    kernel = session.run_new_cell("print(view.explorer.figure.data[0].customdata[0][4])")
    assert per_rank == kernel.strip().splitlines()[-1], (per_rank, kernel)
    explorer.get_by_role("checkbox", name="forward prefetch").check()
    _wait_for_text(status, r"re-planned in \d+ ms \(stored trace\)", UI_MS, "a stored-trace plan")
    prefetch_title = session.dashboard().locator(".js-plotly-plot .gtitle").nth(1)
    _wait_for_text(prefetch_title, r"forward_prefetch=True", UI_MS, "the prefetch graph")
    note = session.dashboard().get_by_text(re.compile(r"^memory: "))
    _wait_for_text(note, r"activations included", 60_000, "the traced memory curve")
    out = session.run_new_cell(
        "import json as _json\n"
        "from fsdpviz.cost import memory_lane as _ml\n"
        "_r = view.explorer.report\n"
        "print(_json.dumps({'world_size': _r.config['world_size'], "
        "'forward_prefetch': _r.config['forward_prefetch'], "
        "'path': view.explorer.replanner.last_path, "
        "'curve_is_traced': view.timeline.data['memory'][0]['total'] == _ml("
        "view.explorer.replanner.cached(view.explorer.options)).total, "
        "'clock': view.timeline.data['clock'], "
        "'errors': repr(view.errors.last_error or view.explorer.errors.last_error)}))"
    )
    state = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert state["world_size"] == 64 and state["forward_prefetch"] is True, state
    assert state["curve_is_traced"] and state["clock"].startswith("modelled on H100"), state
    assert state["errors"] == "None", state
    session.screenshot("dashboard-after-re-plan", show=session.dashboard())
    session.assert_no_browser_errors()


def test_a_big_model_opens_and_closes_blocks_in_the_explorer(session: Session) -> None:
    """More modules than the explorer draws at once (a budget of 20 for the quick-start
    Llama): a click on a block marked ▸ opens it, a click on the opened block goes back up;
    the kernel hears both (focus, selected unit)."""
    session.run_new_cell(
        "import fsdpviz.views.tree as _tree\n"
        "_tree.EXPLORER_BUDGET = 20\n"
        "big = fsdpviz.widgets.Explorer(report)\n"
        "big"
    )
    cells = session.page.locator(".jp-Notebook .jp-Cell")
    cell = cells.nth(cells.count() - 1)  # the cell just run
    plot = cell.locator(".js-plotly-plot").last
    plot.wait_for(timeout=UI_MS)
    slices = plot.locator(".slice")
    labels = _slice_labels(slices)
    closed = [label for label in labels if label.endswith(" ▸")]
    assert closed and len(labels) <= 20, labels
    x, y = _centre(slices, labels, closed[0])
    session.page.mouse.move(x, y)
    session.page.mouse.click(x, y)
    block = closed[0].removesuffix(" ▸").split(" [unit")[0]
    title = plot.locator(".gtitle")
    _wait_for_text(title, rf"inside '{re.escape(block)}'", UI_MS, "the block to open")
    plot.locator(".slice").nth(2).wait_for(timeout=UI_MS)  # its modules drawn
    _settle(plot)
    labels = _slice_labels(plot.locator(".slice"))
    assert not any(label.endswith(" ▸") for label in labels) and len(labels) > 2, labels
    out = session.run_new_cell("print(repr(big.focus), repr(big.selected_module))")
    assert f"'{block}' '{block}'" in out, out
    top = next(label for label in labels if label.startswith(block))
    # on its label: the top slice's surface spans the whole figure in plotly's icicle
    x, y = _centre(plot.locator(".slice"), labels, top, "text.slicetext")
    session.page.mouse.move(x, y)
    session.page.mouse.click(x, y)
    _wait_for_text(title, r"click a block marked", UI_MS, "the explorer to go back up")
    _settle(plot)
    labels = _slice_labels(plot.locator(".slice"))
    assert labels[0].endswith("[unit 0]") and f"{block} [unit 1] ▸" in labels, labels
    # drawn where it belongs: below the root, not left at the top by plotly's zoom (the
    # blocks, their labels hidden where they do not fit, compared by their surfaces)
    y_root = _centre(plot.locator(".slice"), labels, labels[0])[1]
    y_block = _centre(plot.locator(".slice"), labels, f"{block} [unit 1] ▸")[1]
    assert y_block > y_root + 50, (y_root, y_block)
    assert "'' " in session.run_new_cell("print(repr(big.focus), repr(big.selected_module))")
    session.run_new_cell("_tree.EXPLORER_BUDGET = 1500")
    session.screenshot("big-explorer", cell)
    session.assert_no_browser_errors()


# The views below are added at the end of the notebook: keep these tests last.


def _last_output(session: Session) -> Any:
    return session.page.locator(".jp-Notebook .jp-Cell").last.locator(".jp-Cell-outputArea")


def test_every_event_of_a_49_unit_plan_and_a_recording_answers_its_click(
    session: Session,
) -> None:
    """In JupyterLab: the centre of every event's mark selects exactly that event (and the
    kernel hears the last one), for a 49-unit plan and for each rank of a recording."""
    session.run_new_cell(
        f"import sys as _sys\n_sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from export_models import recorded_run as _run, report_49_units as _r49\n"
        "big49 = fsdpviz.widgets.TimelineWidget(_r49())\nbig49"
    )
    timeline = _last_output(session).locator(".fsdpviz-timeline")
    timeline.locator("canvas").first.wait_for(timeout=UI_MS)
    n, wrong = click_every_event(session.page, timeline)
    assert n == 243 and wrong == []
    out = session.run_new_cell("print(big49.step, repr(big49.selected_unit))")
    assert out.strip().splitlines()[-1] == "242 ''"  # the last event is the root's
    session.run_new_cell("run2 = _run()\nrun2.show()")
    timeline = _last_output(session).locator(".fsdpviz-timeline")
    timeline.locator("canvas").first.wait_for(timeout=UI_MS)
    n, wrong = click_every_event(session.page, timeline)
    assert n == 36 and wrong == []
    session.screenshot("recording-after-clicks", timeline)
    session.assert_no_browser_errors()


def test_every_show_draws_in_jupyterlab(session: Session) -> None:
    """A rank's recording, a comparison and a sweep table, each shown by its show()."""
    session.run_new_cell("run2.ranks[1].show()")
    _last_output(session).locator(".fsdpviz-timeline canvas").first.wait_for(timeout=UI_MS)
    groups = _last_output(session).locator(".fv-group-summary").all_inner_texts()
    assert len(groups) == 1 and "recording" in groups[0], groups
    session.run_new_cell(
        "fsdp2 = fsdpviz.analyze(model, inputs, fully_shard=[LlamaDecoderLayer], world_size=8)\n"
        "fsdpviz.compare(report, fsdp2).show()"
    )
    timeline = _last_output(session).locator(".fsdpviz-timeline")
    timeline.locator("canvas").first.wait_for(timeout=UI_MS)
    header = timeline.locator(".fv-group-summary").all_inner_texts()
    assert len(header) == 2 and "FSDP1" in header[0] and "FSDP2" in header[1], header
    session.screenshot("comparison", timeline)
    session.run_new_cell(
        "sweep_view = fsdpviz.sweep(model, inputs, fully_shard=[LlamaDecoderLayer], "
        "world_size=[8, 64]).show()\nsweep_view"
    )
    table = _last_output(session).locator(".fsdpviz-sweep")
    table.wait_for(timeout=UI_MS)
    table.get_by_role("button", name="open").first.click()
    _last_output(session).locator(".fsdpviz-timeline canvas").first.wait_for(timeout=CELL_MS)
    session.screenshot("sweep", _last_output(session))
    out = session.run_new_cell("print(sweep_view.opened)")
    assert out.strip().splitlines()[-1] in {"0", "1"}
    session.assert_no_browser_errors()
