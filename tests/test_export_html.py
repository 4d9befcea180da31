"""The saved HTML page in a real browser (headless Chromium through Playwright), offline.

Every request other than the file itself is blocked and recorded: the page must
need none. It must draw the three views, step through the timeline with the
widget's buttons and slider (the current event's text and the unit outlined in
the explorer and prefetch graph follow), and select a unit clicked in a figure.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from browser_harness import (
    click_block,
    click_every_event,
    click_node,
    explorer_root,
    explorer_state,
    hover_block,
    hover_node,
    painted_pixels,
    pixel,
    prefetch_root,
    prefetch_state,
    walk_cursor,
)
from export_models import recorded_run, report_49_units
from views_models import Block, Tiny, analyze_tiny, tiny_inputs

import fsdpviz
from fsdpviz import Report
from fsdpviz.recording import RunMark
from fsdpviz.schema.timeline import duration_text
from fsdpviz.views import module_tree, timeline_data
from fsdpviz.views.prefetch import prefetch_data
from fsdpviz.views.style import format_bytes

SCREENSHOTS = os.environ.get("FSDPVIZ_SCREENSHOTS")  # a folder to keep the screenshots in


@dataclass
class Page:
    page: Any
    console: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def info(self) -> str:
        return str(self.page.inner_text(".fv-info"))

    def body(self, key: str) -> str:
        return str(self.page.get_attribute("body", f"data-fv-{key}"))

    def js(self, expression: str) -> Any:
        return self.page.evaluate(expression)

    @property
    def explorer(self) -> Any:
        return explorer_root(self.page.locator("#fv-explorer"))

    @property
    def prefetch(self) -> Any:
        return prefetch_root(self.page.locator("#fv-prefetch"))

    def shot(self, name: str) -> None:
        if SCREENSHOTS:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"))


@pytest.fixture
def open_page(chromium: Any) -> Iterator[Any]:
    pages: list[Any] = []

    def open_(path: Path, color_scheme: str = "light") -> Page:
        page = chromium.new_page(
            viewport={"width": 1300, "height": 1500}, color_scheme=color_scheme
        )
        pages.append(page)
        out = Page(page)
        page.on("console", lambda m: out.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: out.console.append(f"pageerror: {e}"))

        def route(r: Any) -> None:
            url = r.request.url
            if url.startswith(("file:", "data:", "blob:")):
                r.continue_()
            else:
                out.blocked.append(url)
                r.abort()

        page.route("**/*", route)
        page.goto(path.resolve().as_uri())
        page.wait_for_selector("body[data-fv-ready=true]", timeout=30_000)
        return out

    yield open_
    for page in pages:
        page.close()


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


def _views_drawn(p: Page) -> None:
    explorer = explorer_state(p.explorer)
    assert "blocks.1 [unit 2]" in [label["text"] for label in explorer["labels"]]
    assert p.page.inner_text("#fv-prefetch .fv-title").startswith("Prefetch graph")
    for canvas in ("#fv-timeline canvas", "#fv-explorer canvas", "#fv-prefetch canvas"):
        assert painted_pixels(p.page, canvas) > 5000, canvas


def test_page_draws_steps_and_links_offline(report: Report, tmp_path: Path, open_page: Any) -> None:
    p = open_page(report.save(tmp_path / "report.html"))
    data = timeline_data(report)
    units = [data["units"][u] for u in data["steps"]["unit"]]
    _views_drawn(p)
    p.shot("light-start")
    assert p.body("step") == "0" and p.body("current-unit") == units[0] == ""
    assert p.info().startswith(f"step 0 of {data['n_steps']} · all_gather unit 0 (root) ")
    caption = p.page.inner_text(".fsdpviz-timeline")
    assert "modelled on H100 SXM 80GB by fsdpviz.cost.timeline" in caption  # the default
    assert "Steps are numbered from 0, as view.timeline.step." in caption
    assert p.page.locator(".fv-info").count() == 1  # one status line in the page
    assert explorer_state(p.explorer)["outlined"] == ["", "inp", "blocks", "head"]
    assert prefetch_state(p.prefetch)["current"] == ""

    p.page.click("button[title^='step forward']")
    p.page.wait_for_function("document.body.dataset.fvStep === '1'")
    assert p.info().startswith(f"step 1 of {data['n_steps']} · all_gather unit 1 'blocks.0' ")
    assert p.body("current-unit") == units[1] == "blocks.0"
    assert explorer_state(p.explorer)["outlined"] == ["blocks.0", "blocks.0.norm", "blocks.0.fc"]
    assert prefetch_state(p.prefetch)["current"] == "blocks.0"
    p.shot("light-step-1")

    slider = p.page.locator(".fv-slider")
    slider.focus()
    p.page.keyboard.press("End")
    last = data["n_steps"] - 1
    p.page.wait_for_function(f"document.body.dataset.fvStep === '{last}'")
    assert p.info().startswith(f"step {last} of {data['n_steps']}")
    assert p.body("current-unit") == units[last] == ""
    assert explorer_state(p.explorer)["outlined"] == ["", "inp", "blocks", "head"]

    p.page.click("button[title^='play']")
    p.page.wait_for_function("document.body.dataset.fvStep !== '" + str(last) + "'")
    p.page.click("button[title^='play']")

    assert p.console == [] and p.blocked == []


def test_click_on_a_unit_selects_it_in_the_timeline(
    report: Report, tmp_path: Path, open_page: Any
) -> None:
    p = open_page(report.save(tmp_path / "report.html"))
    click_block(p.page, p.explorer, "blocks.1")
    p.page.wait_for_function("document.body.dataset.fvSelectedUnit === 'blocks.1'")
    assert p.body("current-unit") == "blocks.1"
    assert "all_gather unit 2 'blocks.1'" in p.info()
    assert "selected: unit 2 'blocks.1'" in p.info()
    assert prefetch_state(p.prefetch)["selected"] == "blocks.1"
    assert p.js("() => window.fsdpvizModel.get('selected_unit')") == "blocks.1"
    explorer = explorer_state(p.explorer)
    assert explorer["focus"] == "blocks.1" and explorer["selected"] == "blocks.1"  # zoomed in
    assert p.body("focus") == "blocks.1"
    assert explorer["crumbs"] == "(root) › blocks › 1"

    click_node(p.page, p.prefetch, "blocks.2")
    p.page.wait_for_function("document.body.dataset.fvSelectedUnit === 'blocks.2'")
    assert prefetch_state(p.prefetch)["selected"] == "blocks.2"
    assert "'blocks.2'" in p.info()
    # the explorer brings the unit selected elsewhere into view
    assert explorer_state(p.explorer)["focus"] == "blocks"
    p.shot("light-selected")
    assert p.console == [] and p.blocked == []


def test_hover_says_what_python_says(report: Report, tmp_path: Path, open_page: Any) -> None:
    """The explorer's and the prefetch graph's hover details, as the page draws them, are
    the numbers of fsdpviz's Python API (module_tree, format_bytes, prefetch_data)."""
    p = open_page(report.save(tmp_path / "report.html"))
    node = module_tree(report).by_fqn["blocks.1.fc"]
    hover_block(p.page, p.explorer, "blocks.1.fc")
    assert p.page.locator("#fv-explorer .fv-tooltip").inner_text().splitlines() == [
        "blocks.1.fc (Linear)",
        "unit: 'blocks.1' (unit 2)",
        f"parameters: {node.numel_total:,}",
        f"bytes: {format_bytes(node.bytes_total)} full, {format_bytes(node.rank_bytes_total)} "
        "per rank",
        f"dtype: {report.units[2].dtype}",
        "click: select its unit",
    ]
    data = prefetch_data(report)
    hover_node(p.page, p.prefetch, "blocks.1")
    lines = p.page.locator("#fv-prefetch .fv-tooltip").inner_text().splitlines()
    assert lines == [*data["hover"][2], "unit 2; click: select it"]
    unit = report.units[2]  # as unit_graph says
    assert (
        f"bytes: {format_bytes(unit.bytes)} full, {format_bytes(unit.sharded_bytes)} per rank"
        in lines
    )
    assert p.console == [] and p.blocked == []


def test_dark_page(report: Report, tmp_path: Path, open_page: Any) -> None:
    p = open_page(report.save(tmp_path / "dark.html", theme="dark", iteration=None))
    _views_drawn(p)
    # under the head's block: the page's dark background
    assert pixel(p.page, "#fv-explorer canvas", -2, -2)[:3] == [17, 17, 17]
    assert p.js("() => getComputedStyle(document.body).backgroundColor") == "rgb(17, 17, 17)"
    timeline = "document.querySelector('.fsdpviz-timeline').fsdpviz"
    assert p.js(f"() => {timeline}.theme.name") == "dark"
    n = sum(len(it) for it in report.iterations)
    assert p.info().startswith(f"step 0 of {n} ")
    p.shot("dark")
    assert p.console == [] and p.blocked == []


def test_the_page_follows_the_readers_dark_setting(
    report: Report, tmp_path: Path, open_page: Any
) -> None:
    """theme="auto" (the default): dark where the reader's OS is dark, and it follows a
    change of the setting while open; every view reads the theme from the page itself."""
    p = open_page(report.save(tmp_path / "auto.html"), color_scheme="dark")
    _views_drawn(p)
    body = "() => getComputedStyle(document.body).backgroundColor"
    names = """() => [...document.querySelectorAll('.fsdpviz-timeline, .fsdpviz-view')]
                 .map(e => e.fsdpviz.theme.name)"""
    assert p.js(body) == "rgb(17, 17, 17)"
    assert p.js(names) == ["dark", "dark", "dark"]
    assert pixel(p.page, "#fv-explorer canvas", -2, -2)[:3] == [17, 17, 17]
    p.page.emulate_media(color_scheme="light")
    p.page.wait_for_function(f"() => ({names})().every(n => n === 'light')")
    assert p.js(body) == "rgb(255, 255, 255)"
    assert pixel(p.page, "#fv-explorer canvas", -2, -2)[:3] == [255, 255, 255]
    assert p.console == [] and p.blocked == []


def test_recorded_run_shows_every_rank(tmp_path: Path, open_page: Any) -> None:
    run = recorded_run()
    p = open_page(run.save(tmp_path / "run.html"))
    _views_drawn(p)  # a recording has no module tree: a block per unit
    height = p.js("() => document.querySelector('#fv-timeline canvas').clientHeight")
    assert height > 2 * 3 * 22  # two ranks of three lanes
    p.page.click("button[title^='step forward']")
    p.page.wait_for_function("document.body.dataset.fvStep === '1'")
    assert "rank 0 · issued at " in p.info()
    p.page.locator(".fv-slider").focus()
    p.page.keyboard.press("End")
    p.page.wait_for_function("document.body.dataset.fvStep !== '1'")
    assert "rank 1 · issued at " in p.info()
    p.shot("run")
    assert p.console == [] and p.blocked == []


def test_explorer_goes_in_up_and_across(report: Report, tmp_path: Path, open_page: Any) -> None:
    """A click zooms into a block, a click on the top block or the path above goes back up
    (selecting nothing new), and ctrl + wheel zooms across, 'all' back out."""
    p = open_page(report.save(tmp_path / "report.html"))
    click_block(p.page, p.explorer, "blocks")
    p.page.wait_for_function("document.body.dataset.fvFocus === 'blocks'")
    assert p.body("selected-unit") == ""  # 'blocks' is the root unit's
    click_block(p.page, p.explorer, "blocks.0.norm")  # a leaf: selects its unit, stays
    p.page.wait_for_function("document.body.dataset.fvSelectedUnit === 'blocks.0'")
    assert explorer_state(p.explorer)["focus"] == "blocks"
    click_block(p.page, p.explorer, "blocks")  # the top: up one
    p.page.wait_for_function("document.body.dataset.fvFocus === ''")
    assert p.body("selected-unit") == ""  # the top block's unit: the root's
    click_block(p.page, p.explorer, "blocks.2")
    p.page.wait_for_function("document.body.dataset.fvFocus === 'blocks.2'")
    p.explorer.locator(".fv-crumbs button", has_text="(root)").click()
    p.page.wait_for_function("document.body.dataset.fvFocus === ''")
    assert p.body("selected-unit") == "blocks.2"  # going up selects nothing
    box = p.page.locator("#fv-explorer canvas").bounding_box()
    p.page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + 10)
    p.page.keyboard.down("Control")
    for _ in range(4):
        p.page.mouse.wheel(0, -100)
    p.page.keyboard.up("Control")
    a, b = explorer_state(p.explorer)["span"]
    assert b - a == pytest.approx(0.8**4)
    assert a < 0.75 < b  # around the pointer
    assert "zoomed" in explorer_state(p.explorer)["crumbs"]
    p.explorer.locator(".fv-zoom button", has_text="all").click()
    assert explorer_state(p.explorer)["span"] == [0, 1]
    p.shot("explorer-zoomed")
    assert p.console == [] and p.blocked == []


# ------------------------------------------------ every mark answers, stepping, one peak


@pytest.fixture(scope="module")
def report49() -> Report:
    return report_49_units()


def test_every_event_of_a_49_unit_plan_answers_its_click(
    report49: Report, tmp_path: Path, open_page: Any
) -> None:
    """The centre of every event's mark, in every lane: the click selects exactly that
    event (the cursor goes to it, its unit is selected) and the hover names it."""
    p = open_page(report49.save(tmp_path / "big.html"))
    n, wrong = click_every_event(p.page, p.page.locator(".fsdpviz-timeline"))
    assert n == len(report49.iterations[-1]) == 243
    assert wrong == []
    assert p.console == []


def test_every_event_of_a_recording_answers_its_click(tmp_path: Path, open_page: Any) -> None:
    run = recorded_run()
    p = open_page(run.save(tmp_path / "run.html"))
    n, wrong = click_every_event(p.page, p.page.locator(".fsdpviz-timeline"))
    assert n == sum(len(r.iterations[-1]) for r in run.ranks)
    assert wrong == []
    assert p.console == []


@pytest.mark.parametrize("order", ["issue", "stream"])
def test_stepping_never_moves_back(
    report49: Report, tmp_path: Path, open_page: Any, order: str
) -> None:
    """A whole iteration stepped with →: in issue order the hooks' times never go back, in
    stream-start order the cursor never moves left; in both, the cursor is on the event."""
    p = open_page(report49.save(tmp_path / "big.html"))
    walk = walk_cursor(p.page, p.page.locator(".fsdpviz-timeline"), order)
    assert len(walk) == len(report49.iterations[-1])
    xs = [w["issue"] if order == "issue" else w["x"] for w in walk]
    assert all(b >= a for a, b in itertools.pairwise(xs)), order
    assert xs[-1] > xs[0]
    assert [w["x"] for w in walk] == [w["start"] for w in walk]


@pytest.mark.parametrize("order", ["issue", "stream"])
def test_the_cursor_is_on_each_event_of_an_fsdp2_step(
    tmp_path: Path, open_page: Any, order: str
) -> None:
    """Every step of an FSDP2 plan, in either order: the cursor is drawn at the event's own
    start on its own lane (a collective's on its stream, not its hook's issue time on the
    CPU), and the readout gives the memory curve's value at the cursor."""
    from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model

    config = ExampleConfig(num_layers=6, vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_heads=2)  # fmt: skip
    fsdp2 = fsdpviz.analyze(example_model(config), example_inputs(config), world_size=8,
                            fully_shard=[DecoderLayer], progress=False)  # fmt: skip
    p = open_page(fsdp2.save(tmp_path / "fsdp2.html"))
    walk = walk_cursor(p.page, p.page.locator(".fsdpviz-timeline"), order)
    assert len(walk) == len(fsdp2.iterations[-1])
    assert sorted(int(w["step"]) for w in walk) == list(range(len(walk)))
    for w in walk:
        assert w["x"] == w["start"], w
        assert w["px"] == pytest.approx(w["mark_px"], abs=0.01), w
    # the CPU runs ahead: somewhere the cursor is not at the hook's issue time
    assert any(w["x"] != w["issue"] for w in walk)
    assert p.console == []


@pytest.mark.parametrize(
    ("api", "profile"), [("FSDP1", True), ("FSDP1", False), ("FSDP2", True), ("FSDP2", False)]
)
def test_one_memory_peak_on_the_page(
    tmp_path: Path, open_page: Any, api: str, profile: bool
) -> None:
    """The page's summary, the timeline's header, the lane's maximum, the ▼ marker and the
    peak button agree to the byte with ``report.memory.peak``; the button goes to its step."""
    if api == "FSDP2":
        torch.manual_seed(0)
        report = fsdpviz.analyze(
            Tiny(), tiny_inputs(), fully_shard=[Block], world_size=4, profile=profile
        )
    else:
        report = analyze_tiny(profile=profile)
    peak = report.memory.peak
    p = open_page(report.save(tmp_path / "peak.html"))
    root = p.page.locator(".fsdpviz-timeline")
    button = root.locator("button[title^='jump to the memory peak']")
    values = {
        "header": root.locator(".fv-peak").first.get_attribute("data-fv-peak-bytes"),
        "lane maximum": root.get_attribute("data-fv-lane-max"),
        "marker": root.get_attribute("data-fv-marker-bytes"),
        "button": button.get_attribute("data-fv-peak-bytes"),
    }
    assert values == dict.fromkeys(values, str(peak["bytes"]))
    assert format_bytes(peak["bytes"]) in p.page.inner_text("body")  # the page's summary
    button.click()
    marker_step = root.get_attribute("data-fv-marker-step")
    p.page.wait_for_function(f"document.body.dataset.fvStep === '{marker_step}'")
    assert marker_step == button.get_attribute("data-fv-peak-step")
    assert p.body("step") == marker_step
    # the cursor on the ▼ moment, the readout giving the peak's value, not the step start's
    cursor, marker = p.js(
        """() => { const v = document.querySelector('.fsdpviz-timeline').fsdpviz;
                 return [v.cursor(), v.data.memory[0].peak.x]; }"""
    )
    assert cursor == marker
    assert f"memory {format_bytes(peak['bytes'])} ▼ peak" in p.info()
    assert p.console == []


def test_the_first_view_shows_the_whole_step(tmp_path: Path, open_page: Any) -> None:
    """A plan's timeline opens on its whole iteration, FSDP2's as FSDP1's (no part of it
    hidden to the right of the first window)."""
    from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model

    config = ExampleConfig(num_layers=40, vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_heads=2)  # fmt: skip
    fsdp2 = fsdpviz.analyze(example_model(config), example_inputs(config), world_size=8,
                            fully_shard=[DecoderLayer], progress=False)  # fmt: skip
    assert fsdp2.config.api == "FSDP2" and len(fsdp2.iterations[-1]) > 150
    p = open_page(fsdp2.save(tmp_path / "fsdp2.html"))
    shown = p.js(
        """() => { const v = document.querySelector('.fsdpviz-timeline').fsdpviz;
                 return [v.win.x0, v.win.x1, v.index.full.x0, v.index.full.x1]; }"""
    )
    assert shown[:2] == pytest.approx(shown[2:])
    assert p.console == []


def test_a_plan_that_does_not_fit_says_so_and_is_over_the_line(
    tmp_path: Path, open_page: Any
) -> None:
    """The page's header and the timeline's say "does not fit" in words; the memory lane
    draws the machine's usable memory as a line in the warning colour, the peak above it."""
    tight = replace(fsdpviz.cost.machine("h100"), name="tiny GPU", memory_gib=1.5 + 2**11 / 2**30)
    report = analyze_tiny(machine=tight)
    mem = report.memory
    assert not mem.fits
    p = open_page(report.save(tmp_path / "tight.html", theme="light"))
    verdict = p.page.locator("header .fv-verdict")
    assert "fv-no-fit" in (verdict.get_attribute("class") or "")
    assert verdict.inner_text() == f"✗ {mem.fit_text()}"
    assert mem.fit_text().startswith("does not fit in tiny GPU")
    assert p.page.inner_text(".fsdpviz-timeline .fv-fit") == f"✗ {mem.fit_text()}"
    state = p.js(
        """() => { const v = document.querySelector('.fsdpviz-timeline').fsdpviz;
                 const m = v.data.memory[0]; const row = v.layout.rows[m.lane];
                 const plotH = row.h - 18, top = v.index.memoryTop;
                 return { cap: m.capacity, line: v.capacityLines()[0], top,
                          peakY: row.top + 16 + plotH - (m.peak.bytes / top) * plotH,
                          x0: v.layout.labelW, w: v.layout.plotW }; }"""
    )
    cap = state["cap"]
    assert (cap["usable"], cap["needed"], cap["fits"]) == (mem.usable, mem.needed, False)
    assert state["peakY"] < state["line"]["usable"]  # the peak is drawn above the line
    # the line is drawn in the warning colour across the lane
    y = round(state["line"]["usable"])
    xs = [int(state["x0"] + state["w"] * f) for f in (0.3, 0.45, 0.6)]
    wait = [0xC6, 0x28, 0x28]
    hits = [x for x in xs if pixel(p.page, "#fv-timeline canvas", x, y)[:3] == wait]
    assert hits, [pixel(p.page, "#fv-timeline canvas", x, y) for x in xs]
    p.shot("does_not_fit")
    assert p.console == []


def test_the_bottleneck_table_ranks_the_waits_and_selects_them(
    report: Report, tmp_path: Path, open_page: Any
) -> None:
    """Beside the timeline, report.timeline.bottlenecks() as a table, most exposed first; a
    click on a row moves the timeline to that event."""
    want = report.timeline.bottlenecks()
    assert want
    p = open_page(report.save(tmp_path / "slow.html"))
    rows = p.page.locator(".fsdpviz-timeline .fv-bottleneck-table tbody tr")
    assert rows.count() == len(want)
    events = report.iterations[-1]
    for k, b in enumerate(want[:10]):
        text = rows.nth(k).inner_text()
        assert duration_text(b["exposed_s"]) in text and b["reason"] in text, (k, text)
        step = int(rows.nth(k).get_attribute("data-fv-step") or -1)
        index = p.js(
            f"() => document.querySelector('.fsdpviz-timeline').fsdpviz.data.steps.index[{step}]"
        )
        assert events[index].kind == b["kind"] and index == b["event"]
    summary = p.page.inner_text(".fsdpviz-timeline .fv-bottlenecks summary")
    assert duration_text(report.timeline.totals["exposed_comm_s"]) in summary
    target = rows.nth(min(len(want), 10) - 1)
    step = target.get_attribute("data-fv-step")
    target.click()
    p.page.wait_for_function(f"document.body.dataset.fvStep === '{step}'")
    assert p.info().startswith(f"step {step} of")
    assert "fv-current" in (target.get_attribute("class") or "")
    x, start = p.js(
        f"""() => {{ const v = document.querySelector('.fsdpviz-timeline').fsdpviz;
                  return [v.cursor(), v.data.steps.x0[{step}]]; }}"""
    )
    assert x == start
    assert p.console == []


def test_a_comparison_s_page_puts_both_memory_lanes_on_one_scale(
    report: Report, tmp_path: Path, open_page: Any
) -> None:
    """compare(a, b).save(): the costs side by side, whether each plan fits, both timelines;
    the two memory lanes on one byte scale, each with its machine's capacity line."""
    torch.manual_seed(0)
    fsdp2 = fsdpviz.analyze(Tiny(), tiny_inputs(), fully_shard=[Block], world_size=4,
                            progress=False)  # fmt: skip
    cmp = fsdpviz.compare(report, fsdp2)
    p = open_page(cmp.save(tmp_path / "compare.html", theme="dark"))
    header = p.page.inner_text("header")
    assert f"{cmp.name_a} vs {cmp.name_b}" in header
    for line in cmp.cost_lines():
        assert line.strip().partition(": ")[2] in header
    assert f"device memory, {cmp.name_b}" in header and fsdp2.memory.fit_text() in header
    state = p.js(
        """() => { const v = document.querySelector('.fsdpviz-timeline').fsdpviz;
                 return { top: v.index.memoryTop, own: v.index.memoryMax,
                          lines: v.capacityLines(),
                          rows: v.data.memory.map(m => v.layout.rows[m.lane].top),
                          peaks: v.data.memory.map(m => m.peak.bytes) }; }"""
    )
    assert state["peaks"] == [report.memory.peak["bytes"], fsdp2.memory.peak["bytes"]]
    assert state["top"] >= max(state["own"])
    # one scale: each plan's capacity line and reserved estimate at its own height on the
    # shared axis (at the lane's top where it is off the scale)
    plot_h = 116 - 18

    def height(v: float) -> float:
        return 16 + plot_h - v / state["top"] * plot_h if v <= state["top"] else 16

    for line, row, r in zip(state["lines"], state["rows"], (report, fsdp2), strict=True):
        assert line["reserved"] - row == pytest.approx(height(r.memory.reserved["bytes"]))
        assert line["usable"] - row == pytest.approx(height(r.memory.usable))
    assert p.page.locator("#fv-explorer").count() == 0  # a comparison's page: the timelines
    p.shot("comparison_dark")
    assert p.console == []


class _StuckRun(fsdpviz.RecordedRun):
    """A recording whose ranks disagree at event 3 of the last iteration and stop at event 6
    (as a flight recorder's diagnosis marks its run)."""

    def marks(self) -> list[RunMark]:
        it = len(self.ranks[0].iterations) - 1
        return [
            *(RunMark(r, it, 3, "first collective where the ranks disagree") for r in (0, 1)),
            *(RunMark(r, it, 6, "where this rank stopped", "stuck") for r in (0, 1)),
        ]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_stuck_collective_is_drawn_apart_from_a_divergent_one(
    tmp_path: Path, open_page: Any, theme: str
) -> None:
    """Each kind of mark has its legend entry and its colour: a stuck collective's is the
    colour table's ``stuck``, a divergent one's its ``wait``."""
    plain = recorded_run()
    run = _StuckRun(plain.ranks, None, [])
    p = open_page(run.save(tmp_path / "stuck.html", theme=theme))
    legend = p.page.locator(".fsdpviz-timeline .fv-legend")
    assert legend.locator("[data-fv-legend='fv-flag']").inner_text().strip() == (
        "first collective where the ranks disagree"
    )
    assert legend.locator("[data-fv-legend='fv-stuck']").inner_text().strip() == (
        "where this rank stopped"
    )
    marks = p.js(
        """() => { const v = document.querySelector('.fsdpviz-timeline').fsdpviz;
                 return v.data.marks.map(m => { const c = v.markCentre(m.step);
                   const row = v.layout.rows[v.data.steps.lane[m.step]];
                   return [m.kind, c === null ? null : [c.x - c.w / 2, row.top]]; }); }"""
    )
    assert sorted(k for k, _ in marks) == ["diverge", "diverge", "stuck", "stuck"]
    colors = fsdpviz.views.style.theme_colors(theme)
    want = {"stuck": colors["stuck"], "diverge": colors["wait"]}
    assert all(box is not None for _, box in marks)
    for kind, (left, top) in marks:
        # over the event's lane, at its left edge: the stuck one's pause sign, the flag
        x, y = round(left), round(top - 7)
        got = pixel(p.page, "#fv-timeline canvas", x, y)[:3]
        hexed = "#" + "".join(f"{c:02X}" for c in got)
        assert hexed == want[kind].upper(), (kind, hexed, left, top)
    p.shot(f"stuck_{theme}")
    assert p.console == []
