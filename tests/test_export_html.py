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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from browser_harness import CHROMIUM_ARGS, chromium_executable, click_every_event, step_through
from export_models import recorded_run, report_49_units
from views_models import Block, Tiny, analyze_tiny, tiny_inputs

import fsdpviz
from fsdpviz import Report
from fsdpviz.views import explorer_figure, timeline_data
from fsdpviz.views.style import format_bytes

SCREENSHOTS = os.environ.get("FSDPVIZ_SCREENSHOTS")  # a folder to keep the screenshots in


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail('playwright is not installed: pip install -e ".[test]"', pytrace=False)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_ARGS)
        yield b
        b.close()


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

    def shot(self, name: str) -> None:
        if SCREENSHOTS:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"))


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    pages: list[Any] = []

    def open_(path: Path) -> Page:
        page = browser.new_page(viewport={"width": 1300, "height": 1500})
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


def _outlined(p: Page) -> list[str]:
    """Explorer node ids outlined in the text colour (the current unit's modules)."""
    return list(
        p.js(
            """() => { const t = document.getElementById('fv-explorer').data[0];
                 return t.ids.filter((_, i) => t.marker.line.color[i] === '#1f1f1f'); }"""
        )
    )


def _ring(p: Page, name: str) -> list[float]:
    return list(
        p.js(
            f"""() => [...(document.getElementById('fv-prefetch').data
                    .find(t => t.name === '{name}').x || [])]"""
        )
    )


def _views_drawn(p: Page, slices: int = 10) -> None:
    assert p.js("() => document.querySelectorAll('#fv-explorer g.slice').length") >= slices
    labels = p.js("() => document.getElementById('fv-explorer').textContent")
    assert "blocks.1 [unit 2]" in labels
    assert p.js("() => document.querySelectorAll('#fv-prefetch .scatterlayer .trace').length") > 4
    assert "units in forward order" in p.js(
        "() => document.getElementById('fv-prefetch').textContent"
    )
    painted = p.js(
        """() => { const c = document.querySelector('#fv-timeline canvas');
             const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
             let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }"""
    )
    assert painted > 5000


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
    assert "<root>" in _outlined(p)
    assert _ring(p, "current") == [0]

    p.page.click("button[title^='step forward']")
    p.page.wait_for_function("document.body.dataset.fvStep === '1'")
    assert p.info().startswith(f"step 1 of {data['n_steps']} · all_gather unit 1 'blocks.0' ")
    assert p.body("current-unit") == units[1] == "blocks.0"
    assert set(_outlined(p)) == {"blocks.0", "blocks.0.norm", "blocks.0.fc"}
    assert _ring(p, "current") == [1]
    p.shot("light-step-1")

    slider = p.page.locator(".fv-slider")
    slider.focus()
    p.page.keyboard.press("End")
    last = data["n_steps"] - 1
    p.page.wait_for_function(f"document.body.dataset.fvStep === '{last}'")
    assert p.info().startswith(f"step {last} of {data['n_steps']}")
    assert p.body("current-unit") == units[last] == ""
    assert "<root>" in _outlined(p) and "blocks.0" not in _outlined(p)

    p.page.click("button[title^='play']")
    p.page.wait_for_function("document.body.dataset.fvStep !== '" + str(last) + "'")
    p.page.click("button[title^='play']")

    assert p.console == [] and p.blocked == []


def test_click_on_a_unit_selects_it_in_the_timeline(
    report: Report, tmp_path: Path, open_page: Any
) -> None:
    p = open_page(report.save(tmp_path / "report.html"))
    p.page.locator("#fv-explorer g.slice", has_text="blocks.1 [unit 2]").first.click()
    p.page.wait_for_function("document.body.dataset.fvSelectedUnit === 'blocks.1'")
    assert p.body("current-unit") == "blocks.1"
    assert "all_gather unit 2 'blocks.1'" in p.info()
    assert "selected: unit 2 'blocks.1'" in p.info()
    assert _ring(p, "selected") == [2]
    assert p.js("() => window.fsdpvizModel.get('selected_unit')") == "blocks.1"
    p.page.wait_for_function(  # plotly's own zoom into the clicked unit
        "document.getElementById('fv-explorer')._fullData[0].level === 'blocks.1'"
    )

    # the prefetch graph's node of 'blocks.2' (x = 3 on its axis)
    p.page.locator("#fv-prefetch").scroll_into_view_if_needed()
    x, y = p.js(
        """() => { const gd = document.getElementById('fv-prefetch'), L = gd._fullLayout;
             const r = gd.getBoundingClientRect();
             return [r.left + L._size.l + L.xaxis.l2p(3), r.top + L._size.t + L.yaxis.l2p(0)]; }"""
    )
    p.page.mouse.move(x - 5, y)
    p.page.mouse.click(x, y)
    p.page.wait_for_function("document.body.dataset.fvSelectedUnit === 'blocks.2'")
    assert _ring(p, "selected") == [3]
    assert "'blocks.2'" in p.info()
    p.shot("light-selected")
    assert p.console == [] and p.blocked == []


def test_dark_page(report: Report, tmp_path: Path, open_page: Any) -> None:
    p = open_page(report.save(tmp_path / "dark.html", theme="dark", iteration=None))
    _views_drawn(p)
    assert p.js("() => getComputedStyle(document.body).backgroundColor") == "rgb(17, 17, 17)"
    assert p.js("() => window.fsdpvizModel.get('theme')") == "dark"
    n = sum(len(it) for it in report.iterations)
    assert p.info().startswith(f"step 0 of {n} ")
    p.shot("dark")
    assert p.console == [] and p.blocked == []


def test_recorded_run_shows_every_rank(tmp_path: Path, open_page: Any) -> None:
    run = recorded_run()
    p = open_page(run.save(tmp_path / "run.html"))
    _views_drawn(p, slices=4)  # a recording has no module tree: one node per unit
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


def test_big_model_opens_and_closes_blocks(
    report: Report, tmp_path: Path, open_page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model with more modules than the explorer draws at once (here: a budget of 7 for
    the 13 modules of the test model) is drawn down to its blocks, each marked ▸; a click
    opens one, a click on the opened block goes back up, all in the page."""
    import fsdpviz.views.tree as tree_module

    monkeypatch.setattr(tree_module, "EXPLORER_BUDGET", 7)
    p = open_page(report.save(tmp_path / "big.html"))

    def slices() -> list[str]:
        labels: list[str] = p.js(
            "() => [...document.querySelectorAll('#fv-explorer g.slice text.slicetext')]"
            ".map(t => t.getAttribute('data-unformatted') || t.textContent)"
        )
        return labels

    def title() -> str:
        return str(p.js("() => document.querySelector('#fv-explorer .gtitle').textContent"))

    def drawn() -> list[Any]:
        trace: list[Any] = p.js(
            "() => { const t = document.getElementById('fv-explorer').data[0];"
            " return [t.ids, t.parents, t.labels, t.customdata]; }"
        )
        return trace

    def as_python(focus: str) -> list[Any]:
        t = explorer_figure(report, focus=focus).data[0]
        return [list(t.ids), list(t.parents), list(t.labels), [list(r) for r in t.customdata]]

    assert len(slices()) == 7 and "blocks.1 [unit 2] ▸" in slices()
    assert drawn() == as_python("")
    assert "13 modules: click a block marked ▸ to open it" in title()
    p.page.locator("#fv-explorer g.slice", has_text="blocks.1 [unit 2] ▸").first.click()
    p.page.wait_for_function("document.body.dataset.fvFocus === 'blocks.1'")
    p.page.wait_for_function("document.querySelectorAll('#fv-explorer g.slice').length === 3")
    assert sorted(slices()) == ["blocks.1 [unit 2]", "fc", "norm"]
    assert drawn() == as_python("blocks.1")  # the page's rules are Python's
    assert p.body("selected-unit") == "blocks.1" and "'blocks.1'" in p.info()
    assert "inside 'blocks.1': click it to go up" in title()
    p.shot("big-opened")
    p.page.locator("#fv-explorer g.slice", has_text="blocks.1 [unit 2]").first.click()
    p.page.wait_for_function("document.body.dataset.fvFocus === ''")
    p.page.wait_for_function("document.querySelectorAll('#fv-explorer g.slice').length === 7")
    assert "blocks.0 [unit 1] ▸" in slices()
    # A unit chosen elsewhere that the explorer does not draw brings it back into view.
    p.page.locator("#fv-explorer g.slice", has_text="blocks.0 [unit 1] ▸").first.click()
    p.page.wait_for_function("document.body.dataset.fvFocus === 'blocks.0'")
    p.page.locator("#fv-prefetch").scroll_into_view_if_needed()
    x, y = p.js(
        """() => { const gd = document.getElementById('fv-prefetch'), L = gd._fullLayout;
             const r = gd.getBoundingClientRect();
             return [r.left + L._size.l + L.xaxis.l2p(3), r.top + L._size.t + L.yaxis.l2p(0)]; }"""
    )
    p.page.mouse.move(x - 5, y)  # plotly clicks what it hovers
    p.page.mouse.click(x, y)  # the prefetch graph's node of 'blocks.2'
    p.page.wait_for_function("document.body.dataset.fvSelectedUnit === 'blocks.2'")
    p.page.wait_for_function("document.body.dataset.fvFocus === ''")
    assert "blocks.2 [unit 3] ▸" in slices()
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
    """A whole iteration stepped with →: the cursor never moves left, in either order."""
    p = open_page(report49.save(tmp_path / "big.html"))
    xs = step_through(p.page, p.page.locator(".fsdpviz-timeline"), order)
    assert len(xs) == len(report49.iterations[-1])
    assert all(b >= a for a, b in itertools.pairwise(xs)), order
    assert xs[-1] > xs[0]


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
    assert p.console == []
