"""The explorer and the prefetch graph in real Chromium, as a user meets them: in JupyterLab
(the dashboard's widgets) and in the saved HTML page, which the same front end draws; each
test drives both through the same helpers (tests/browser_harness.py).

- every block of the explorer and every node of the prefetch graph, clicked, selects
  exactly its module and unit (and the kernel hears the last one);
- at 120 units no two unit names under the prefetch graph overlap, and the graph lays its
  units out again when the output narrows or widens;
- the views fill their output and follow its width; the explorer's labels are drawn at one
  readable size or not at all, keeping the end of a name; its detail panel sits beside it
  (nothing below moves when a unit is selected), or over it in a narrow output, and is
  never cut off; the find box selects and draws; the path above leads back up;
- what the views say on hover is what fsdpviz's Python API says.

``FSDPVIZ_SCREENSHOTS=<folder>`` keeps screenshots of each view, light and dark, at 5 and at
120 units, in JupyterLab and in the page.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from browser_harness import (
    SMALL,
    UI_MS,
    LabSession,
    choose_theme,
    click_block,
    click_every_block,
    click_every_node,
    click_node,
    explorer_root,
    explorer_state,
    hover_block,
    hover_node,
    next_frame,
    prefetch_root,
    prefetch_state,
    wait_until,
)
from views_models import needs_front_end

from fsdpviz import Report
from fsdpviz.examples import ExampleConfig, example_analysis
from fsdpviz.views import module_tree, prefetch_data
from fsdpviz.views.prefetch import prefetch_analysis
from fsdpviz.views.style import format_bytes

pytestmark = needs_front_end

SCREENSHOTS = os.environ.get("FSDPVIZ_SCREENSHOTS")
LABEL_FONT = "11px system-ui, sans-serif"  # js/src/theme.ts FONT: every label's


def report_of(units: int) -> Report:
    return example_analysis(config=ExampleConfig(num_layers=units - 1, **SMALL), progress=False)


def _shot(locator: Any, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        locator.page.mouse.move(1, 1)  # no hover box over the views
        locator.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"))


@pytest.fixture(scope="module")
def reports() -> dict[int, Report]:
    return {n: report_of(n) for n in (5, 49, 120)}


# Every label the explorer draws with its text's width as the page's canvas measures it.
_LABEL_WIDTHS = f"""root => {{ const v = root.fsdpviz;
  const ctx = document.createElement('canvas').getContext('2d'); ctx.font = '{LABEL_FONT}';
  return v.drawnLabels().map(l => ({{...l, text_w: ctx.measureText(l.text).width}})); }}"""


def check_labels(root: Any) -> None:
    """Every label drawn is one size (11 px) and inside its block: cut short, never smaller;
    a cut keeps the end of a module's name."""
    labels = root.evaluate(_LABEL_WIDTHS)
    assert labels, "no label drawn in the explorer"
    for label in labels:
        assert label["text_w"] <= label["w"] - 8 + 0.5, label
        if label["text"].startswith("…"):
            assert not label["text"].startswith("…."), label


def _names_apart(state: dict[str, Any], least: int) -> None:
    """Unit names under the prefetch graph: at least ``least`` of them, upright, each at
    least 14 px (11 px text) from the next."""
    xs = [x for _, x in state["names"]]
    assert state["upright"] and len(xs) >= least, state
    assert min(b - a for a, b in itertools.pairwise(xs)) >= 14


def _hover_says_what_python_says(page: Any, scope: Any, report: Report) -> None:
    """The explorer's and the prefetch graph's hover details are fsdpviz's Python numbers
    (module_tree, format_bytes, prefetch_data)."""
    unit = report.units[3]
    module = f"{unit.module}.mlp"
    node = module_tree(report).by_fqn[module]
    ex = explorer_root(scope)
    ex.evaluate(
        "(root, name) => { const v = root.fsdpviz; v.reveal(v.index.byName.get(name)); }",
        module,
    )
    hover_block(page, ex, module)
    lines = ex.locator(".fv-tooltip").inner_text().splitlines()
    assert lines[:5] == [
        f"{module} ({node.module_class})",
        f"unit: '{unit.module}' (unit 3)",
        f"parameters: {node.numel_total:,}",
        f"bytes: {format_bytes(node.bytes_total)} full, {format_bytes(node.rank_bytes_total)} "
        "per rank",
        f"dtype: {unit.dtype}",
    ]
    data = prefetch_data(report)
    pf = prefetch_root(scope)
    pf.evaluate("(root, u) => root.fsdpviz.follow(u)", data["units"].index(unit.module))
    hover_node(page, pf, unit.module)
    lines = pf.locator(".fv-tooltip").inner_text().splitlines()
    k = data["units"].index(unit.module)
    assert lines == [*data["hover"][k], f"unit {data['numbers'][k]}; click: select it"]
    assert (
        f"bytes: {format_bytes(unit.bytes)} full, {format_bytes(unit.sharded_bytes)} per rank"
        in lines
    )
    page.mouse.move(1, 1)


# ------------------------------------------------------------------ the saved page


@dataclass
class Page:
    page: Any
    console: list[str] = field(default_factory=list)

    @property
    def explorer(self) -> Any:
        return explorer_root(self.page.locator("#fv-explorer"))

    @property
    def prefetch(self) -> Any:
        return prefetch_root(self.page.locator("#fv-prefetch"))


@pytest.fixture
def open_page(chromium: Any, tmp_path: Path) -> Iterator[Any]:
    pages: list[Any] = []

    def open_(report: Report, theme: str = "light", width: int = 1300) -> Page:
        path = report.save(tmp_path / f"{len(report.units)}-{theme}.html", theme=theme)
        page = chromium.new_page(viewport={"width": width, "height": 1400})
        pages.append(page)
        out = Page(page)
        page.on("console", lambda m: out.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: out.console.append(f"pageerror: {e}"))
        page.goto(path.resolve().as_uri())
        wait_until(page, "() => document.body.dataset.fvReady === 'true'", "the page to draw",
                   timeout_ms=UI_MS)  # fmt: skip
        return out

    yield open_
    for page in pages:
        page.close()


def test_page_every_prefetch_node_selects_its_unit(
    reports: dict[int, Report], open_page: Any
) -> None:
    report = reports[49]
    p = open_page(report)
    assert prefetch_state(p.prefetch)["window"] == [0, 49]  # 49 units fit the page's width
    n, wrong = click_every_node(p.page, p.prefetch)
    assert n == 49 and wrong == []
    last = prefetch_data(report)["units"][-1]  # clicked in forward order
    assert p.page.evaluate("() => window.fsdpvizModel.get('selected_unit')") == last
    assert p.console == []


def test_page_every_explorer_block_selects_its_module(
    reports: dict[int, Report], open_page: Any
) -> None:
    p = open_page(reports[5])
    n, wrong = click_every_block(p.page, p.explorer)
    assert n == len(reports[5].modules) and wrong == []
    last = reports[5].modules[-1]
    assert p.page.evaluate("() => window.fsdpvizModels.explorer.get('selected_module')") == (
        last.fqn
    )
    assert p.console == []


def test_page_prefetch_graph_of_120_units_follows_the_step(
    reports: dict[int, Report], open_page: Any
) -> None:
    """120 units do not fit: a window of them, which follows the timeline's current unit;
    a unit selected in the timeline is brought into it, and its node answers a click."""
    report = reports[120]
    p = open_page(report)
    u0, u1 = prefetch_state(p.prefetch)["window"]
    assert u0 == 0 and 40 < u1 < 120
    p.page.locator(".fv-slider").focus()
    p.page.keyboard.press("End")  # the last event: the root's
    wait_until(p.page, "() => document.body.dataset.fvStep !== '0'", "the last step",
               timeout_ms=UI_MS)  # fmt: skip
    last = report.iterations[-1][-1].unit
    assert prefetch_state(p.prefetch)["current"] == last
    target = "layers.100"
    p.page.evaluate(f"() => window.fsdpvizModel.set('selected_unit', '{target}')")
    state = prefetch_state(p.prefetch)
    position = prefetch_analysis(report).positions[target]
    assert state["selected"] == target
    assert state["window"][0] <= position < state["window"][1]
    click_node(p.page, p.prefetch, "layers.99")
    assert prefetch_state(p.prefetch)["selected"] == "layers.99"
    assert p.page.evaluate("() => window.fsdpvizModel.get('selected_unit')") == "layers.99"
    assert p.console == []


@pytest.mark.parametrize("width", [1300, 800])
def test_page_unit_names_never_overlap_at_120_units(
    reports: dict[int, Report], open_page: Any, width: int
) -> None:
    p = open_page(reports[120], width=width)
    _names_apart(prefetch_state(p.prefetch), least=width // 40)
    # the graph follows the page's width, and the names follow the graph
    p.page.set_viewport_size({"width": width - 300, "height": 1400})
    wait_until(
        p.page,
        "([root, w]) => root.fsdpviz.canvas.getBoundingClientRect().width < w",
        "the prefetch graph to narrow",
        arg=[p.prefetch.element_handle(), width - 300],
        timeout_ms=UI_MS,
    )
    _names_apart(prefetch_state(p.prefetch), least=(width - 300) // 40)
    p.prefetch.locator(".fv-zoom button", has_text="all").click()
    _names_apart(prefetch_state(p.prefetch), least=(width - 300) // 40)
    assert p.console == []


def test_page_prefetch_graph_lays_out_again_on_resize(
    reports: dict[int, Report], open_page: Any
) -> None:
    """49 units fit 1,920 px; at 1,000 px they do not: a window of them and an overview of
    all; back at 1,920 px, every unit again."""
    p = open_page(reports[49], width=1920)
    state = prefetch_state(p.prefetch)
    assert state["window"] == [0, 49] and not state["windowed"]
    for width, windowed in [(1000, True), (1920, False)]:
        p.page.set_viewport_size({"width": width, "height": 1400})
        wait_until(
            p.page,
            "([root, w]) => Math.abs(root.fsdpviz.canvas.getBoundingClientRect().width"
            " - root.getBoundingClientRect().width) <= 2 && root.fsdpviz.layout.width <= w",
            f"the prefetch graph to lay out at {width} px",
            arg=[p.prefetch.element_handle(), width],
            timeout_ms=UI_MS,
        )
        state = prefetch_state(p.prefetch)
        assert state["windowed"] is windowed, (width, state)
        assert (state["window"][1] < 49) is windowed, (width, state)
        assert state["outer"] < width
    assert p.console == []


def test_page_views_fill_the_width_and_labels_stay_readable(
    reports: dict[int, Report], open_page: Any
) -> None:
    for units, theme in [(5, "light"), (120, "dark"), (120, "light"), (5, "dark")]:
        p = open_page(reports[units], theme=theme)
        for state in (explorer_state(p.explorer), prefetch_state(p.prefetch)):
            assert state["theme"] == theme
            assert abs(state["outer"] - state["width"]) <= 2, state
        assert prefetch_state(p.prefetch)["outer"] > 1200
        check_labels(p.explorer)
        _shot(p.page.locator("body"), f"page-{units}-units-{theme}")
        assert p.console == []


def test_page_find_box_path_and_panel(reports: dict[int, Report], open_page: Any) -> None:
    p = open_page(reports[49])
    find = p.explorer.locator(".fv-find-input")
    find.fill("layers.7")
    find.press("Enter")
    state = explorer_state(p.explorer)
    assert state["found"] == "found 'layers.7'" and state["focus"] == "layers.7"
    assert state["model"]["selected_unit"] == "layers.7"
    # the path above leads back up: (root), then 'layers'
    assert state["crumbs"] == "(root) › layers › 7"
    assert "unit 8 of 49: 'layers.7' (DecoderLayer)" in state["detail"]
    _shot(p.page.locator(".fv-figures"), "page-49-units-found")
    p.explorer.locator(".fv-crumbs button", has_text="(root)").click()
    state = explorer_state(p.explorer)
    assert state["focus"] == "" and state["model"]["selected_unit"] == "layers.7"  # nothing new
    find.fill("nothing like it")
    find.press("Enter")
    assert explorer_state(p.explorer)["found"].startswith("no unit or module matches")
    _hover_says_what_python_says(p.page, p.page, reports[49])
    assert p.console == []


def test_page_narrow_panel_goes_over_the_explorer(
    reports: dict[int, Report], open_page: Any
) -> None:
    """In a narrow page the panel opens over the icicle when a unit is selected, inside the
    page and scrolling on its own; its × closes it."""
    p = open_page(reports[49], width=760)
    box = p.page.locator("#fv-explorer .fsdpviz-explorer-box")
    panel = box.locator(".fv-detail")
    assert panel.is_hidden()
    click_block(p.page, p.explorer, "layers.3")
    assert panel.is_visible()
    area, rect = box.bounding_box(), panel.bounding_box()
    assert rect["x"] >= area["x"] - 1 and rect["x"] + rect["width"] <= area["x"] + area["width"] + 1
    assert box.locator(".fv-detail-body").evaluate("b => getComputedStyle(b).overflowY") == "auto"
    assert "'layers.3'" in panel.inner_text()
    _shot(box, "page-49-units-narrow-panel")
    panel.locator(".fv-detail-close").click()
    assert panel.is_hidden()
    assert p.console == []


# ------------------------------------------------------------------ JupyterLab


def test_lab_every_prefetch_node_selects_its_unit(
    jupyterlab: LabSession, reports: dict[int, Report]
) -> None:
    s = jupyterlab
    out = s.output("# fv:v49")
    root = prefetch_root(out)
    n, wrong = click_every_node(s.page, root)
    assert n == 49 and wrong == []
    last = prefetch_data(reports[49])["units"][-1]  # clicked in forward order
    state = s.py(
        "[v49.selected_unit, v49.timeline.selected_unit, v49.explorer.selected_unit, "
        "repr(v49.errors.last_error)]"
    )
    assert state == [last, last, last, "None"]
    s.assert_no_browser_errors()


def test_lab_every_explorer_block_selects_its_module(
    jupyterlab: LabSession, reports: dict[int, Report]
) -> None:
    s = jupyterlab
    root = explorer_root(s.output("# fv:v5"))
    n, wrong = click_every_block(s.page, root)
    assert n == len(reports[5].modules) and wrong == []
    last = reports[5].modules[-1]
    state = s.py("[v5.explorer.selected_module, v5.selected_unit, v5.explorer.focus]")
    assert state == [last.fqn, explorer_state(root)["model"]["selected_unit"], state[2]]
    assert state[2] == explorer_state(root)["focus"]
    s.assert_no_browser_errors()


def test_lab_unit_names_never_overlap_at_120_units_and_follow_the_width(
    jupyterlab: LabSession,
) -> None:
    s = jupyterlab
    root = prefetch_root(s.output("# fv:v120"))
    root.scroll_into_view_if_needed()
    _names_apart(prefetch_state(root), least=25)
    width = prefetch_state(root)["outer"]
    s.page.set_viewport_size({"width": 900, "height": 1600})
    try:
        wait_until(
            s.page,
            "([root, w]) => root.getBoundingClientRect().width < w - 300"
            " && Math.abs(root.fsdpviz.layout.width - root.getBoundingClientRect().width) <= 2",
            "the prefetch graph to lay out at the narrower width",
            arg=[root.element_handle(), width],
            timeout_ms=UI_MS,
        )
        _names_apart(prefetch_state(root), least=15)
    finally:
        s.page.set_viewport_size({"width": 1400, "height": 1600})
    s.assert_no_browser_errors()


def test_lab_views_fill_the_output_and_the_panel_sits_beside(
    jupyterlab: LabSession, reports: dict[int, Report]
) -> None:
    s = jupyterlab
    out = s.output("# fv:v49")
    explorer, prefetch = explorer_root(out), prefetch_root(out)
    box = out.locator(".fsdpviz-explorer-box")
    panel = box.locator(".fv-detail")
    area = out.bounding_box()
    ex, pf, side = explorer.bounding_box(), prefetch.bounding_box(), panel.bounding_box()
    assert pf["width"] > 0.9 * area["width"], (pf, area)
    assert ex["width"] > 0.5 * area["width"], (ex, area)
    assert ex["width"] + side["width"] > 0.9 * area["width"], (ex, side, area)
    assert side["x"] >= ex["x"] + ex["width"] - 1 and abs(side["y"] - ex["y"]) < 40
    below = prefetch.bounding_box()["y"]
    s.kernel.run("v49.selected_unit = 'layers.3'")
    wait_until(
        s.page,
        "el => el.textContent.includes(\"'layers.3'\")",
        "the panel to show 'layers.3'",
        arg=panel.element_handle(),
        timeout_ms=UI_MS,
    )
    assert prefetch.bounding_box()["y"] == below  # the panel did not push what follows down
    assert box.locator(".fv-detail-body").evaluate("b => getComputedStyle(b).overflowY") == "auto"
    # every column of its tables in sight: long names break, the numbers stay in the panel
    assert box.locator(".fv-detail-body").evaluate("b => b.scrollWidth <= b.clientWidth")
    assert (
        panel.bounding_box()["x"] + panel.bounding_box()["width"] <= area["x"] + area["width"] + 1
    )
    detail = s.py("fsdpviz.views.unit_details(r49)[4]")
    text = panel.inner_text()
    assert detail["title"] in text and detail["facts"] in text
    check_labels(explorer)
    _hover_says_what_python_says(s.page, out, reports[49])
    s.assert_no_browser_errors()


def test_lab_find_box_and_path(jupyterlab: LabSession) -> None:
    s = jupyterlab
    out = s.output("# fv:v49")
    root = explorer_root(out)
    find = root.locator(".fv-find-input")
    find.fill("layers.11")
    find.press("Enter")
    state = explorer_state(root)
    assert state["focus"] == "layers.11" and state["crumbs"] == "(root) › layers › 11"
    assert s.py("[v49.selected_unit, v49.explorer.selected_module, v49.explorer.focus]") == [
        "layers.11",
        "layers.11",
        "layers.11",
    ]
    assert "'layers.11'" in explorer_state(root)["detail"]
    root.locator(".fv-crumbs button", has_text="(root)").click()
    assert s.py("[v49.selected_unit, v49.explorer.focus]") == ["layers.11", ""]
    find.fill("no such module")
    find.press("Enter")
    assert explorer_state(root)["found"].startswith("no unit or module matches")
    s.assert_no_browser_errors()


def test_lab_screenshots_light_and_dark(jupyterlab: LabSession) -> None:
    """The dashboards of 5 and 120 units in both themes: each view reads the theme itself;
    its labels stay readable."""
    s = jupyterlab
    for theme, light in [("JupyterLab Dark", False), ("JupyterLab Light", True)]:
        choose_theme(s.page, theme, light)
        name = "light" if light else "dark"
        for marker, units in [("# fv:v5", 5), ("# fv:v120", 120)]:
            out = s.output(marker)
            out.scroll_into_view_if_needed()
            next_frame(s.page)
            assert explorer_state(explorer_root(out))["theme"] == name
            check_labels(explorer_root(out))
            _shot(out, f"lab-dashboard-{units}-units-{name}")
    s.assert_no_browser_errors()
