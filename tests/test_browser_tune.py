"""A tuning's page (``tuning.save("tune.html")``) in real Chromium, as a user meets it, and
its view in JupyterLab: the scatter drawn, what hover says of every point it checks is what
fsdpviz's Python API says of that candidate, a click on a point (the keys, a knob's
alternative) opens that configuration's plan below, with its numbers, or says the page
does not hold it.

``FSDPVIZ_SCREENSHOTS=<folder>`` keeps screenshots of the page, light and dark, of a
6-configuration tuning and a 132-configuration one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from browser_harness import UI_MS, LabSession, next_frame, wait_until
from views_models import needs_front_end, tune_many, tune_small

from fsdpviz import Candidate, Tuning
from fsdpviz.export._tune_page import kept_plans
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.timeline import duration_text
from fsdpviz.tuning.result import KNOB_NAMES
from fsdpviz.views.style import format_bytes

pytestmark = needs_front_end

SCREENSHOTS = os.environ.get("FSDPVIZ_SCREENSHOTS")


@pytest.fixture(scope="module")
def small() -> Tuning:
    return tune_small()


@pytest.fixture(scope="module")
def many() -> Tuning:
    return tune_many()


@dataclass
class TunePage:
    page: Any
    console: list[str] = field(default_factory=list)

    @property
    def tune(self) -> Any:
        return self.page.locator("#fv-tune .fsdpviz-tune")

    def point(self, index: int) -> tuple[float, float]:
        """Where candidate ``index``'s point is on the screen (scrolled into view)."""
        at = self.tune.evaluate(
            """(root, i) => { const v = root.fsdpviz; v.canvas.scrollIntoView({block: 'center'});
               const c = v.pointCentre(i); if (c === null) return null;
               const r = v.canvas.getBoundingClientRect(); return [r.left + c.x, r.top + c.y]; }""",
            index,
        )
        assert at is not None, f"#{index} is not drawn"
        return at[0], at[1]

    def hover(self, index: int) -> list[str]:
        self.page.mouse.move(*self.point(index))
        next_frame(self.page)
        tip = self.tune.locator(".fv-tooltip")
        assert tip.is_visible()
        lines: list[str] = tip.evaluate("t => [...t.children].map(c => c.textContent)")
        return lines

    def shown_plan(self) -> str:
        return str(self.page.evaluate("() => document.body.dataset.fvPlan"))

    def wait_for_plan(self, index: int | str) -> None:
        wait_until(
            self.page,
            "i => document.body.dataset.fvPlan === i",
            f"the plan of #{index} to be drawn",
            arg=str(index),
            timeout_ms=UI_MS,
        )
        next_frame(self.page)

    def shot(self, name: str) -> None:
        if SCREENSHOTS:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            self.page.mouse.move(1, 1)
            self.tune.screenshot(path=str(Path(SCREENSHOTS) / f"{name}-tune.png"))
            self.page.evaluate("() => window.scrollTo(0, 0)")
            self.page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}-page.png"))


@pytest.fixture
def open_tune(chromium: Any, tmp_path: Path) -> Iterator[Any]:
    pages: list[Any] = []

    def open_(tuning: Tuning, theme: str = "light", **options: Any) -> TunePage:
        path = tuning.save(str(tmp_path / f"tune-{len(pages)}.html"), theme=theme, **options)
        page = chromium.new_page(viewport={"width": 1400, "height": 1100})
        pages.append(page)
        out = TunePage(page)
        page.on("console", lambda m: out.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: out.console.append(f"pageerror: {e}"))
        page.goto(Path(path).resolve().as_uri())
        wait_until(page, "() => document.body.dataset.fvReady === 'true'", "the page to draw",
                   timeout_ms=UI_MS)  # fmt: skip
        return out

    yield open_
    for page in pages:
        page.close()


def api_lines(tuning: Tuning, c: Candidate) -> list[str]:
    """What hover must say of ``c``, from the Python API alone."""
    tags = [f"#{c.index}"]
    if c is tuning.best:
        tags.append("best")
    if c.user:
        tags.append("as given")
    if any(f is c for f in tuning.frontier):
        tags.append("on the frontier")
    tags.append("fits" if c.fits else "does not fit")
    if tuning.budget is not None:
        memory = (
            f"memory per rank: peak {size_text(c.peak_bytes)} of the "
            f"{size_text(tuning.budget)} budget (reserved ≈ {size_text(c.reserved_bytes)})"
        )
    else:
        memory = (
            f"memory per rank: {size_text(c.memory_bytes)} of "
            f"{size_text(c.usable_bytes)} (peak {size_text(c.peak_bytes)}, reserved ≈ "
            f"{size_text(c.reserved_bytes)})"
        )
    return [
        " · ".join(tags),
        f"{c.tokens_per_s:,.0f} tokens/s per GPU ({c.total_tokens_per_s:,.0f} on "
        f"{c.world_size} GPUs)",
        f"MFU {c.mfu:.1%}, step {duration_text(c.step_s)}, exposed communication "
        f"{duration_text(c.exposed_comm_s)}",
        memory,
        *([f"the peak is mostly {c.dominant}"] if c.dominant else []),
        *[f"{KNOB_NAMES[k]}: {v}" for k, v in c.knobs.items()],
        f"derived from {c.derived}: the plan a trace would make, untraced"
        if c.derived
        else "traced: the model ran for it"
        if c.traced
        else "replayed from another one's trace",
    ]


def check_hover(p: TunePage, tuning: Tuning, c: Candidate) -> None:
    """Hover at ``c``'s point says what the API says of the candidate drawn on top there
    (``c``, or one drawn at the same place, which hover then names), and whether the page
    holds its plan (as :func:`fsdpviz.export._tune_page.kept_plans` chose)."""
    lines = p.hover(c.index)
    shown = tuning.candidates[int(lines[0].split(" · ")[0][1:])]
    expected = api_lines(tuning, shown)
    assert lines[: len(expected)] == expected
    if shown is not c:
        assert f"#{c.index}" in lines[len(expected)], lines
    first = best if (best := tuning.best) is not None else tuning.user
    saved = any(k is shown for k in kept_plans(tuning, first))
    click = "click: open its plan" if saved else "click: select it (its plan is not saved here)"
    assert lines[-1] == click


def check_plan(p: TunePage, tuning: Tuning, c: Candidate) -> None:
    """The plan drawn below is ``c``'s: its title, and the report's own numbers."""
    p.wait_for_plan(c.index)
    title = p.page.inner_text("#fv-plan-title")
    assert title.startswith(f"Configuration #{c.index}")
    assert f"{c.tokens_per_s:,.0f} tokens/s per GPU" in title
    header = p.page.inner_text("#fv-plan-header")
    assert c.label in header
    peak = c.report.memory.peak["bytes"]
    assert f"{format_bytes(peak)} (modelled)" in header
    assert c.report.timeline.summary().splitlines()[0] in header
    n = p.page.evaluate("() => window.fsdpvizModel.get('data').n_steps")
    assert n == len(c.report.iterations[-1])
    summary = p.page.inner_text("#fv-timeline .fv-group-summary")
    assert f"peak {format_bytes(peak)} per rank" in summary
    assert p.page.locator("#fv-explorer .fsdpviz-explorer-box").count() == 1
    assert p.page.locator("#fv-prefetch .fsdpviz-prefetch").count() == 1


def test_the_page_draws_and_hover_says_what_the_api_says(small: Tuning, open_tune: Any) -> None:
    p = open_tune(small)
    best = small.best
    assert best is not None
    assert p.tune.locator(".fv-title").inner_text() == small.summary().splitlines()[0]
    assert p.tune.locator(".fv-tune-headline").inner_text() == small.summary().splitlines()[1]
    data_cap = p.tune.evaluate("root => root.fsdpviz.data.capacity.label")
    assert data_cap == f"budget: {size_text(small.budget or 0)} per rank"
    for c in small.candidates:
        check_hover(p, small, c)
    # the knob table: the best's value, the one given, the alternative's text
    alts = {a["knob"]: a for a in small.alternatives()}
    for knob, value in best.knobs.items():
        row = p.tune.locator(f"tr[data-knob='{knob}'] td")
        cells = row.all_inner_texts()
        assert cells[:3] == [KNOB_NAMES[knob], value, small.user.knobs[knob]]
        assert cells[3] == (alts[knob]["text"] if knob in alts else "no other value tried")
    check_plan(p, small, best)  # the best's plan shown first
    status = p.tune.locator(".fv-tune-status").inner_text()
    assert status.startswith(f"selected #{best.index} · best") and (
        f"{best.tokens_per_s:,.0f} tokens/s per GPU" in status
    )
    p.shot("tune-small-light")
    assert p.console == []


def test_a_click_on_a_point_opens_its_plan(small: Tuning, open_tune: Any) -> None:
    p = open_tune(small)
    for c in [small.user, *small.frontier]:
        p.page.mouse.click(*p.point(c.index))
        check_plan(p, small, c)
        assert p.tune.evaluate("root => root.dataset.fvSelected") == str(c.index)
    # a knob's best alternative, from the table
    alt = small.alternatives()[0]
    p.tune.locator(f"tr[data-knob='{alt['knob']}'] .fv-tune-alt").click()
    check_plan(p, small, alt["candidate"])
    assert "fv-current" in (
        p.tune.locator(f"tr[data-knob='{alt['knob']}']").get_attribute("class") or ""
    )
    # the keys: Home (the best), → along the frontier, Enter
    p.tune.locator("canvas").focus()
    p.page.keyboard.press("Home")
    p.page.keyboard.press("ArrowRight")
    order = sorted(small.frontier, key=lambda c: (c.memory_bytes, -c.tokens_per_s))
    best = small.best
    assert best is not None
    at = [c.index for c in order].index(best.index)
    target = order[min(at + 1, len(order) - 1)]
    p.page.keyboard.press("Enter")
    check_plan(p, small, target)
    assert p.console == []


def test_a_big_tuning_keeps_some_plans_and_says_so_for_the_others(
    many: Tuning, open_tune: Any
) -> None:
    p = open_tune(many)
    saved = set(p.tune.evaluate("root => [...root.fsdpviz.saved]"))
    assert len(many.candidates) > 100 and 10 <= len(saved) <= 24
    best = many.best
    assert best is not None and best.index in saved
    assert {c.index for c in many.frontier} <= saved
    for c in [best, many.user, *many.frontier]:
        check_hover(p, many, c)
    out = [c for c in many.candidates if c.index not in saved]
    visible = [
        c for c in out if p.tune.evaluate("(root, i) => root.fsdpviz.pointCentre(i)", c.index)
    ]
    for c in visible[:: max(len(visible) // 12, 1)]:
        check_hover(p, many, c)
    # a point whose plan the page does not hold: said so, and no other plan's numbers
    on_top = p.tune.evaluate(
        """(root, out) => { const v = root.fsdpviz, idx = v.data.points.index;
           return out.filter(i => { const c = v.pointCentre(i);
             return c !== null && idx[v.pickAt(c.x, c.y)] === i; }); }""",
        [c.index for c in out],
    )
    c = many.candidates[on_top[0]]
    p.page.mouse.click(*p.point(c.index))
    p.wait_for_plan("")
    assert p.page.inner_text("#fv-plan-title") == (
        f"Configuration #{c.index}: its plan is not in this page"
    )
    assert "tuning.candidates[i].report.save" in p.page.inner_text("#fv-plan-missing")
    assert not p.page.locator("#fv-plan-views").is_visible()
    assert p.page.locator("#fv-timeline .fsdpviz-timeline").count() == 0
    status = p.tune.locator(".fv-tune-status").inner_text()
    assert status.startswith(f"selected #{c.index}") and status.endswith(
        "(its plan is not saved here)"
    )
    p.page.mouse.click(*p.point(many.user.index))
    check_plan(p, many, many.user)
    p.page.evaluate("() => window.scrollTo(0, 0)")
    p.shot("tune-many-light")
    assert p.console == []


@pytest.mark.parametrize("which", ["small", "many"])
def test_dark_pages(which: str, small: Tuning, many: Tuning, open_tune: Any) -> None:
    tuning = small if which == "small" else many
    p = open_tune(tuning, theme="dark")
    theme = p.tune.evaluate("root => root.fsdpviz.theme.name")
    assert theme == "dark"
    bg = p.tune.evaluate("root => getComputedStyle(root).getPropertyValue('--fv-bg').trim()")
    assert bg == "#111111"
    p.shot(f"tune-{which}-dark")
    assert p.console == []


# ------------------------------------------------------------------ JupyterLab

_LAB_CELL = """# fv:tune
from fsdpviz.examples import ExampleConfig, example_inputs, example_model
import fsdpviz
_c = ExampleConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_heads=2,
                   num_layers=3)
tuning = fsdpviz.tune(example_model(_c), example_inputs(_c), world_size=8,
                      knobs=["wrap", "activation_checkpointing"], memory_budget="2.3MiB",
                      progress=False)
tv = tuning.show()
tv"""


def test_lab_a_click_on_a_point_opens_its_plan(jupyterlab: LabSession) -> None:
    lab = jupyterlab
    lab.run_new_cell(_LAB_CELL)
    out = lab.output("# fv:tune")
    root = out.locator(".fsdpviz-tune")
    root.wait_for(timeout=UI_MS)
    wait_until(
        lab.page,
        "() => document.querySelectorAll('.fsdpviz-tune-view .fsdpviz-timeline').length > 0",
        "the best's dashboard under the scatter",
        timeout_ms=UI_MS,
    )
    best = lab.py("tuning.best.index")
    assert lab.py("tv.selected") == best
    target = lab.py("tuning.user.index")
    at = root.evaluate(
        """(root, i) => { const v = root.fsdpviz; v.canvas.scrollIntoView({block: 'center'});
           const c = v.pointCentre(i); const r = v.canvas.getBoundingClientRect();
           return [r.left + c.x, r.top + c.y]; }""",
        target,
    )
    lines = root.evaluate(
        "(root, i) => root.fsdpviz.hoverLines(root.fsdpviz.data.points.index.indexOf(i))", target
    )
    lab.page.mouse.click(at[0], at[1])
    lab.settle()
    assert lab.py("tv.selected") == target
    assert lab.py("tv.dashboard.explorer.report is tuning.candidates[tv.selected].report")
    assert lines[1] == lab.py(
        "f'{tuning.user.tokens_per_s:,.0f} tokens/s per GPU "
        "({tuning.user.total_tokens_per_s:,.0f} on {tuning.user.world_size} GPUs)'"
    )
    title = out.locator(".fsdpviz-tune-view > .widget-html").nth(1).inner_text()
    assert f"#{target}" in title
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        lab.page.mouse.move(1, 1)
        out.screenshot(path=str(Path(SCREENSHOTS) / "tune-lab-light.png"))
