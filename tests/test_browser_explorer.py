"""The explorer and the prefetch graph in real Chromium, as a user meets them: in JupyterLab
(the dashboard widget) and in the saved HTML page.

- every unit of a 49-unit plan clicked in the prefetch graph selects exactly that unit;
- at 120 units no two unit names on the prefetch graph's axis overlap, at two widths;
- the figures fill their output and follow its width; the explorer's labels are drawn at
  one readable size or not at all; its detail panel sits beside it (nothing below moves
  when a unit is selected); the search box selects and zooms; the path bar zooms back out
  without changing the selection.

``FSDPVIZ_SCREENSHOTS=<folder>`` keeps screenshots of each view, light and dark, at 5 and
at 120 units.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser_harness import (
    CHROMIUM_ARGS,
    EXPLORER_VIEW,
    PREFETCH_VIEW,
    KernelTraffic,
    LabServer,
    choose_theme,
    chromium_executable,
    click_node,
    explorer_state,
    jupyterlab_server,
    prefetch_state,
    require_browser_stack,
)
from views_models import needs_front_end

from fsdpviz import Report
from fsdpviz.examples import ExampleConfig, example_analysis
from fsdpviz.schema.report import unit_label
from fsdpviz.views.explorer import LABEL_PX
from fsdpviz.views.prefetch import prefetch_analysis

pytestmark = needs_front_end

SCREENSHOTS = os.environ.get("FSDPVIZ_SCREENSHOTS")
SMALL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2}
UI_MS = 20_000
LABEL_FONT = "11px system-ui, sans-serif"  # js/src/render.ts FONT: every label's
START_MS = 90_000  # the notebook's dashboards drawn once all its cells ran
KERNEL_S = 90.0  # a kernel's answer, behind any idle work it started before
RUN_ALL_MS = 240_000

# The rectangle of each x tick label of a plotly figure: its centre on the page, its
# unrotated size and its rotation (plotly rotates labels that would overlap flat).
_TICK_BOXES = """gd => [...gd.querySelectorAll('.xtick text')].map(t => {
  const r = t.getBoundingClientRect(), b = t.getBBox();
  const m = /rotate\\(([-\\d.]+)/.exec(t.getAttribute('transform') || '');
  return {text: t.textContent, cx: r.x + r.width / 2, cy: r.y + r.height / 2,
          w: b.width, h: b.height, angle: m ? Number(m[1]) : 0,
          size: parseFloat(getComputedStyle(t).fontSize)};
})"""

# Where plotly drew each unit of the prefetch graph: page coordinates of its marker centre.
_NODE_CENTRES = """gd => {
  const t = gd.data.find(d => d.name === 'units'), L = gd._fullLayout;
  const r = gd.getBoundingClientRect();
  return t.customdata.map((u, i) => [u, r.left + L._size.l + L.xaxis.l2p(t.x[i]),
                                      r.top + L._size.t + L.yaxis.l2p(t.y[i])]);
}"""

# Labels the explorer draws (visible ones: plotly hides those that do not fit).
_SLICE_LABELS = """gd => [...gd.querySelectorAll('g.slice text.slicetext')]
  .filter(t => { const r = t.getBoundingClientRect();
                 return t.textContent.trim() !== '' && r.width > 0 && r.height > 0; })
  .map(t => ({text: t.textContent, size: parseFloat(getComputedStyle(t).fontSize),
              box: t.getBoundingClientRect().toJSON(),
              slice: t.closest('g.slice').querySelector('path.surface')
                .getBoundingClientRect().toJSON()}))"""


def report_of(units: int) -> Report:
    return example_analysis(config=ExampleConfig(num_layers=units - 1, **SMALL), progress=False)


def overlapping(boxes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of tick labels whose (rotated) rectangles intersect by more than a pixel."""
    found = []
    ordered = sorted(boxes, key=lambda b: b["cx"])
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 : i + 4]:
            angle = math.radians(a["angle"])
            dx, dy = b["cx"] - a["cx"], b["cy"] - a["cy"]
            along = abs(dx * math.cos(angle) + dy * math.sin(angle))
            across = abs(-dx * math.sin(angle) + dy * math.cos(angle))
            # glyphs fill ~3/4 of a text box's height (the rest is line spacing)
            if along < (a["w"] + b["w"]) / 2 - 1 and across < 0.75 * (a["h"] + b["h"]) / 2 - 1:
                found.append((a["text"], b["text"]))
    return found


def check_tick_labels(boxes: list[dict[str, Any]], names: list[str], least: int) -> None:
    assert len(boxes) >= least, f"only {len(boxes)} unit names on the axis"
    assert {b["text"] for b in boxes} <= set(names)
    assert min(b["size"] for b in boxes) >= 11
    assert not overlapping(boxes), overlapping(boxes)


def check_slice_labels(labels: list[dict[str, Any]]) -> None:
    """Every label drawn is LABEL_PX high and inside its block."""
    assert labels, "no label drawn in the explorer"
    assert {lab["size"] for lab in labels} == {LABEL_PX}, labels
    for lab in labels:
        box, inside = lab["box"], lab["slice"]
        assert box["left"] >= inside["left"] - 1 and box["right"] <= inside["right"] + 1, lab
        assert box["top"] >= inside["top"] - 1 and box["bottom"] <= inside["bottom"] + 1, lab


def path_bar(explorer: Any) -> list[str]:
    """The labels plotly's path bar shows (visible ones), left to right."""
    found: list[str] = explorer.evaluate(
        """gd => [...gd.querySelectorAll('g.pathbar text.slicetext')]
          .map(t => [t.getBoundingClientRect(), t.textContent])
          .filter(([r]) => r.width > 0).sort((a, b) => a[0].x - b[0].x).map(([, s]) => s)"""
    )
    return found


def point_at(page: Any, plot: Any, unit: str, x: float, y: float) -> None:
    """Move the mouse onto a unit's marker and wait for its hover label, as a user looks
    before clicking (plotly clicks the point it last hovered, at most every 50 ms)."""
    page.mouse.move(x - 3, y)
    page.wait_for_function(
        "([gd, name]) => (gd.querySelector('.hoverlayer .hovertext')?.textContent ?? '')"
        ".startsWith(name + ' (')",
        arg=[plot.element_handle(), unit_label(unit)],
        timeout=UI_MS,
    )


def _shot(locator: Any, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        locator.page.mouse.move(1, 1)  # no hover label over the figures
        locator.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"))


@pytest.fixture(scope="module")
def reports() -> dict[int, Report]:
    return {n: report_of(n) for n in (5, 49, 120)}


# ------------------------------------------------------------------ the saved page


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser_stack()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_ARGS)
        yield b
        b.close()


@dataclass
class Page:
    page: Any
    console: list[str] = field(default_factory=list)

    def body(self, key: str) -> str:
        return str(self.page.get_attribute("body", f"data-fv-{key}"))

    def plot(self, div: str) -> Any:
        return self.page.locator(f"#{div}")


@pytest.fixture
def open_page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    pages: list[Any] = []

    def open_(report: Report, theme: str = "light", width: int = 1300) -> Page:
        path = report.save(tmp_path / f"{len(report.units)}-{theme}.html", theme=theme)
        page = browser.new_page(viewport={"width": width, "height": 1400})
        pages.append(page)
        out = Page(page)
        page.on("console", lambda m: out.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: out.console.append(f"pageerror: {e}"))
        page.goto(path.resolve().as_uri())
        page.wait_for_selector("body[data-fv-ready=true]", timeout=30_000)
        return out

    yield open_
    for page in pages:
        page.close()


def test_page_every_prefetch_node_selects_its_unit(
    reports: dict[int, Report], open_page: Any
) -> None:
    report = reports[49]
    p = open_page(report)
    assert prefetch_state(p.page)["window"] == [0, 49]  # 49 units fit the page's width
    for unit in [u.module for u in report.units]:
        click_node(p.page, unit)
        p.page.wait_for_function(
            "u => document.body.dataset.fvSelectedUnit === u", arg=unit, timeout=UI_MS
        )
        assert prefetch_state(p.page)["selected"] == unit
    assert p.console == []


def test_page_prefetch_graph_of_120_units_follows_the_step(
    reports: dict[int, Report], open_page: Any
) -> None:
    """120 units do not fit: a window of them, which follows the timeline's current unit;
    a unit selected in the timeline is brought into it, and its node answers a click."""
    report = reports[120]
    p = open_page(report)
    u0, u1 = prefetch_state(p.page)["window"]
    assert u0 == 0 and 40 < u1 < 120
    p.page.locator(".fv-slider").focus()
    p.page.keyboard.press("End")  # the last event: the root's
    p.page.wait_for_function("document.body.dataset.fvStep !== '0'")
    last = report.iterations[-1][-1].unit
    assert prefetch_state(p.page)["current"] == last
    target = "layers.100"
    p.page.evaluate(f"() => window.fsdpvizModel.set('selected_unit', '{target}')")
    state = prefetch_state(p.page)
    position = prefetch_analysis(report).positions[target]
    assert state["selected"] == target
    assert state["window"][0] <= position < state["window"][1]
    click_node(p.page, "layers.99")
    p.page.wait_for_function("document.body.dataset.fvSelectedUnit === 'layers.99'")
    assert p.console == []


def _names_apart(state: dict[str, Any], least: int) -> None:
    """Unit names under the prefetch graph: at least ``least`` of them, upright, each at
    least 14 px (11 px text) from the next."""
    xs = [x for _, x in state["names"]]
    assert state["upright"] and len(xs) >= least, state
    assert min(b - a for a, b in itertools.pairwise(xs)) >= 14


@pytest.mark.parametrize("width", [1300, 800])
def test_page_unit_names_never_overlap_at_120_units(
    reports: dict[int, Report], open_page: Any, width: int
) -> None:
    p = open_page(reports[120], width=width)
    _names_apart(prefetch_state(p.page), least=width // 40)
    # the graph follows the page's width, and the names follow the graph
    p.page.set_viewport_size({"width": width - 300, "height": 1400})
    p.page.wait_for_function(
        f"w => {PREFETCH_VIEW}.canvas.getBoundingClientRect().width < w",
        arg=width - 300,
        timeout=UI_MS,
    )
    _names_apart(prefetch_state(p.page), least=(width - 300) // 40)
    p.page.locator("#fv-prefetch .fv-zoom button", has_text="all").click()
    _names_apart(prefetch_state(p.page), least=(width - 300) // 40)
    assert p.console == []


# Every label the explorer draws with its text's width as the page's canvas measures it.
_LABEL_WIDTHS = f"""() => {{ const v = {EXPLORER_VIEW};
  const ctx = document.createElement('canvas').getContext('2d'); ctx.font = '{LABEL_FONT}';
  return v.drawnLabels().map(l => ({{...l, text_w: ctx.measureText(l.text).width}})); }}"""


def test_page_figures_fill_the_width_and_labels_stay_readable(
    reports: dict[int, Report], open_page: Any
) -> None:
    for units, theme in [(5, "light"), (120, "dark"), (120, "light"), (5, "dark")]:
        p = open_page(reports[units], theme=theme)
        for state in (explorer_state(p.page), prefetch_state(p.page)):
            assert state["outer"] > 1200 and abs(state["outer"] - state["width"]) <= 2, state
        labels = p.page.evaluate(_LABEL_WIDTHS)
        assert labels, "no label drawn in the explorer"
        for label in labels:  # one size (11 px), inside its block; cut short, never smaller
            assert label["text_w"] <= label["w"] - 8 + 0.5, label
        _shot(p.page.locator(".fv-figures"), f"page-{units}-units-{theme}")
        assert p.console == []


def test_page_search_box_and_path_bar(reports: dict[int, Report], open_page: Any) -> None:
    p = open_page(reports[49])
    find = p.page.locator("#fv-find")
    find.fill("layers.7")
    find.press("Enter")
    p.page.wait_for_function("document.body.dataset.fvSelectedUnit === 'layers.7'")
    assert p.page.inner_text("#fv-find-note") == "found 'layers.7'"
    state = explorer_state(p.page)
    assert state["focus"] == "layers.7"
    # the path above leads back up: (root), then 'layers'
    assert state["crumbs"] == "(root) › layers › 7"
    _shot(p.page.locator(".fv-figures"), "page-49-units-found")
    p.page.locator("#fv-explorer .fv-crumbs button", has_text="(root)").click()
    p.page.wait_for_function("document.body.dataset.fvFocus === ''")
    assert p.body("selected-unit") == "layers.7"  # going up selects nothing
    find.fill("nothing like it")
    find.press("Enter")
    assert p.page.inner_text("#fv-find-note").startswith("no unit or module matches")
    assert p.console == []


# ------------------------------------------------------------------ JupyterLab

NOTEBOOK = "explorer.ipynb"
_CELLS = [
    "from fsdpviz.examples import ExampleConfig, example_analysis\n"
    f"SMALL = {SMALL!r}\n"
    "r5, r49, r120 = (example_analysis(config=ExampleConfig(num_layers=n - 1, **SMALL),"
    " progress=False) for n in (5, 49, 120))",
    "view = r49.show()\nview",
    "big = r120.show()\nbig",
    "small = r5.show()\nsmall",
]


@dataclass
class Lab:
    lab: LabServer
    page: Any
    traffic: KernelTraffic
    errors: list[str] = field(default_factory=list)

    def output(self, k: int) -> Any:
        """The output area of code cell ``k``."""
        return self.page.locator(".jp-Notebook .jp-CodeCell").nth(k).locator(".jp-Cell-outputArea")

    def plots(self, k: int) -> Any:
        return self.output(k).locator(".js-plotly-plot")

    def run_new_cell(self, code: str) -> str:
        page = self.page
        cells = page.locator(".jp-Notebook .jp-Cell")
        n = cells.count()
        cells.nth(n - 1).locator(".jp-InputPrompt").click()
        toolbar = page.get_by_role("toolbar", name="main area toolbar")
        toolbar.get_by_role("button", name=re.compile(r"^Insert a cell below")).click()
        new = cells.nth(n)
        new.locator(".cm-content").click()
        page.keyboard.insert_text(code)
        page.keyboard.press("Control+Enter")
        from playwright.sync_api import expect

        expect(new.locator(".jp-InputPrompt")).to_have_text(
            re.compile(r"^\[\d+\]:$"), timeout=UI_MS
        )
        return str(new.locator(".jp-Cell-outputArea").first.inner_text())

    def kernel(self, expression: str) -> Any:
        out = self.run_new_cell(f"import json as _j\nprint(_j.dumps({expression}))")
        return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("explorer-lab") / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in _CELLS])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, root / NOTEBOOK)
    with jupyterlab_server(root) as server:
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        try:
            s = Lab(server, page, KernelTraffic(page))
            page.on("pageerror", lambda e: s.errors.append(f"page error: {e}"))
            page.on(
                "console",
                lambda m: s.errors.append(m.text) if m.type == "error" else None,
            )
            page.goto(server.url + f"lab/tree/{NOTEBOOK}")
            server.wait_for_kernel_connection(60)
            page.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]").wait_for(
                timeout=60_000
            )
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            page.wait_for_function(
                """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                   .every(p => /^\\[\\d+\\]:$/.test(p.textContent.trim()))""",
                timeout=RUN_ALL_MS,
            )
            # the three dashboards drawn (a start-up, on a busy machine slower than a UI answer)
            for k in (1, 2, 3):
                for what, view in [
                    ("timeline", s.output(k).locator(".fsdpviz-timeline canvas").first),
                    ("explorer", s.plots(k).nth(0).locator("g.slice").first),
                    ("prefetch graph", s.plots(k).nth(1).locator(".xtick").first),
                ]:
                    try:
                        view.wait_for(timeout=START_MS)
                    except Exception as e:
                        shown = s.output(k).inner_text()[:300]
                        raise AssertionError(f"cell {k}: no {what} drawn; shown: {shown}") from e
            # every view drawn and every message of their start answered (the kernel's
            # idle work included): a test's first action meets a page at rest
            s.traffic.wait_until_answered(after=0, timeout=KERNEL_S, quiet=2.0)
            yield s
        finally:
            page.close()


def test_lab_every_prefetch_node_selects_its_unit(lab: Lab, reports: dict[int, Report]) -> None:
    report = reports[49]
    plot = lab.plots(1).nth(1)
    plot.scroll_into_view_if_needed()
    picker = lab.output(1).locator(".widget-dropdown", has_text="unit").locator("select")
    centres = plot.evaluate(_NODE_CENTRES)
    assert sorted(u for u, _, _ in centres) == sorted(u.module for u in report.units)
    lab.traffic.wait_until_answered(after=-1)
    clicks = lab.traffic.points.count("plotly_click")
    index = {u.module: i for i, u in enumerate(report.units)}
    for unit, x, y in centres:
        point_at(plot.page, plot, unit, x, y)
        plot.page.mouse.click(x, y)
        # the explorer's unit picker, set by the kernel: "<index>: <name>"
        plot.page.wait_for_function(
            "([el, text]) => (el.options[el.selectedIndex]?.text ?? '')"
            ".replace(/\\s/g, ' ') === text",
            arg=[picker.element_handle(), f"{index[unit]}: {unit or '(root)'}"],
            timeout=UI_MS,
        )
        # the rest of the kernel's answer (the rings and outlines it restyles) lands before
        # the next hover: a restyle after the hover clears plotly's hovered point, and a
        # click then selects nothing, as a person's would who clicked mid-redraw
        lab.traffic.wait_until_answered(after=-1, timeout=KERNEL_S)
    assert lab.traffic.points.count("plotly_click") - clicks == len(centres)
    state = lab.kernel(
        "[view.selected_unit, view.timeline.selected_unit, repr(view.errors.last_error)]"
    )
    assert state == [centres[-1][0], centres[-1][0], "None"]


def test_lab_unit_names_never_overlap_at_120_units(lab: Lab, reports: dict[int, Report]) -> None:
    names = ["(root)" if u.module == "" else u.module for u in reports[120].units]
    plot = lab.plots(2).nth(1)
    plot.scroll_into_view_if_needed()
    check_tick_labels(plot.evaluate(_TICK_BOXES), names, least=25)
    width = plot.evaluate("gd => gd.getBoundingClientRect().width")
    lab.page.set_viewport_size({"width": 900, "height": 1400})
    try:
        lab.page.wait_for_function(
            "([gd, w]) => gd.querySelector('.main-svg').getBoundingClientRect().width < w - 300",
            arg=[plot.element_handle(), width],
            timeout=UI_MS,
        )
        lab.page.wait_for_timeout(500)
        check_tick_labels(plot.evaluate(_TICK_BOXES), names, least=15)
    finally:
        lab.page.set_viewport_size({"width": 1400, "height": 1400})


def test_lab_figures_fill_the_output_and_the_panel_sits_beside(lab: Lab) -> None:
    out = lab.output(1)
    explorer, prefetch = lab.plots(1).nth(0), lab.plots(1).nth(1)
    detail = out.locator(".fsdpviz-detail")
    lab.page.wait_for_function(  # the widget's figure takes its width once attached
        "gd => Math.abs(gd.querySelector('.main-svg').getBoundingClientRect().width"
        " - gd.getBoundingClientRect().width) <= 2",
        arg=explorer.element_handle(),
        timeout=UI_MS,
    )
    area = out.bounding_box()
    ex, pf, panel = explorer.bounding_box(), prefetch.bounding_box(), detail.bounding_box()
    assert pf["width"] > 0.9 * area["width"], (pf, area)
    assert ex["width"] > 0.5 * area["width"], (ex, area)
    assert ex["width"] + panel["width"] > 0.9 * area["width"], (ex, panel, area)
    assert panel["x"] >= ex["x"] + ex["width"] - 1 and abs(panel["y"] - ex["y"]) < 40
    below = prefetch.bounding_box()["y"] - out.bounding_box()["y"]
    lab.run_new_cell("view.selected_unit = 'layers.3'")
    lab.page.wait_for_function(
        "el => el.textContent.includes(\"'layers.3'\")", arg=detail.element_handle(), timeout=UI_MS
    )
    # the panel did not push what follows down
    assert prefetch.bounding_box()["y"] - out.bounding_box()["y"] == below
    assert detail.bounding_box()["height"] <= ex["height"] + 1
    check_slice_labels(explorer.evaluate(_SLICE_LABELS))
    # and the figures follow the output's width
    lab.page.set_viewport_size({"width": 1000, "height": 1400})
    try:
        lab.page.wait_for_function(
            "gd => gd.querySelector('.main-svg').getBoundingClientRect().width < 900",
            arg=prefetch.element_handle(),
            timeout=UI_MS,
        )
    finally:
        lab.page.set_viewport_size({"width": 1400, "height": 1400})
    assert not lab.errors, lab.errors


def test_lab_search_box_and_path_bar(lab: Lab) -> None:
    out = lab.output(1)
    explorer = lab.plots(1).nth(0)
    search = out.locator(".fsdpviz-explorer input[list]")
    search.fill("layers.11")
    search.press("Enter")
    picker = out.locator(".widget-dropdown", has_text="unit").locator("select")
    lab.page.wait_for_function(
        "el => (el.options[el.selectedIndex]?.text ?? '').replace(/\\s/g, ' ') === '12: layers.11'",
        arg=picker.element_handle(),
        timeout=UI_MS,
    )
    lab.page.wait_for_function(
        "gd => gd._fullData[0].level === 'layers.11'", arg=explorer.element_handle(), timeout=UI_MS
    )
    lab.page.wait_for_timeout(800)
    assert path_bar(explorer) == ["(root) ExampleModel [unit 0]", "layers"]
    assert "'layers.11'" in out.locator(".fsdpviz-detail").inner_text()
    check_slice_labels(explorer.evaluate(_SLICE_LABELS))
    lab.traffic.wait_until_answered(after=-1)
    explorer.locator("g.pathbar", has_text="(root)").click()
    lab.page.wait_for_function(
        "gd => (gd._fullData[0].level || '<root>') === '<root>'",
        arg=explorer.element_handle(),
        timeout=UI_MS,
    )
    state = lab.kernel("[view.selected_unit, view.explorer.selected_module]")
    assert state == ["layers.11", "layers.11"]  # zooming out selected nothing
    search.fill("no such module")
    search.press("Enter")
    status = out.get_by_text(re.compile(r"^no unit or module matches"))
    status.wait_for(timeout=UI_MS)
    assert not lab.errors, lab.errors


def test_lab_screenshots_light_and_dark(lab: Lab) -> None:
    """The explorer and the prefetch graph at 5 and 120 units, in both themes; the dark
    theme restyles them (their background follows JupyterLab's)."""
    page = lab.page

    backgrounds = (
        "() => [...document.querySelectorAll("
        "'.jp-CodeCell .js-plotly-plot svg.main-svg:first-of-type')]"
        ".map(s => getComputedStyle(s).backgroundColor)"
    )
    for theme, light, bg in [
        ("JupyterLab Dark", False, "rgb(17, 17, 17)"),
        ("JupyterLab Light", True, "rgb(255, 255, 255)"),
    ]:
        sent = lab.traffic.sent
        choose_theme(page, theme, light, timeout_ms=UI_MS)
        # each timeline tells its kernel the theme; the kernel may first finish work it
        # does while idle (a stored trace for re-planning), then restyles the figures
        lab.traffic.wait_until_answered(after=sent, timeout=KERNEL_S)
        try:
            page.wait_for_function(
                f"() => ({backgrounds})().every(c => c === {bg!r})", timeout=UI_MS
            )
        except Exception as e:
            seen = page.evaluate(backgrounds)
            seen += page.evaluate(
                "() => [...document.querySelectorAll('.jp-CodeCell .js-plotly-plot')]"
                ".map(g => [g.layout?.paper_bgcolor, g.layout?.template?.layout?.paper_bgcolor,"
                " g._fullLayout?.paper_bgcolor, g.offsetWidth])"
            )
            shown = page.locator(".jp-CodeCell .jp-OutputArea-output").all_inner_texts()
            seen += [t for t in shown if "fsdpviz:" in t or "Error" in t]
            raise AssertionError(f"figure backgrounds {seen}, not all {bg}") from e
        page.wait_for_timeout(500)
        for k, units in [(3, 5), (2, 120)]:
            out = lab.output(k)
            check_slice_labels(lab.plots(k).nth(0).evaluate(_SLICE_LABELS))
            name = "dark" if not light else "light"
            _shot(out.locator(".fsdpviz-explorer"), f"lab-explorer-{units}-units-{name}")
            _shot(lab.plots(k).nth(1), f"lab-prefetch-{units}-units-{name}")
    assert not lab.errors, lab.errors
