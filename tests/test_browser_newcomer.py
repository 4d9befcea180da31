"""What a newcomer meets in JupyterLab, driven through headless Chromium: the quick start opens
unchanged; a plan that does not fit says why and what to try, its labels apart, its readout
naming the moment it reads; keys step the timeline after a click on its own buttons; a
re-plan is what the saved notebook keeps; a comparison shows its differences.

The suite has a JupyterLab server of its own (its notebooks start kernels of their own) with
this checkout's JupyterLab extension (tests/browser_harness.py). Screenshots, light and dark,
go to pytest's tmp dir and to ``tests/artifacts/`` (git-ignored).
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_harness import (
    ARTIFACTS,
    QUICKSTART,
    UI_MS,
    KernelClient,
    LabServer,
    choose_theme,
    explorer_root,
    explorer_state,
    jupyterlab_server,
    load_note,
    next_frame,
    timeline_root,
    views_drawn,
    wait_until,
)
from views_models import needs_front_end

pytestmark = needs_front_end

NOTEBOOK = "newcomer.ipynb"
MIME = "application/vnd.fsdpviz.report+json"
CELLS = {
    "# nv:plan": """\
import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
config = ExampleConfig(num_layers=4, vocab_size=4096, hidden_size=256, intermediate_size=512)
model, inputs = example_model(config), example_inputs(config, batch=8, seq=256)
planned = fsdpviz.analyze(model, inputs, fully_shard=[DecoderLayer], world_size=8)
# a GPU just too small for it: the peak a little over the line
gib = 1.5 + 0.97 * planned.memory.peak["bytes"] / 2**30
small = fsdpviz.cost.machine("h100", memory_gib=gib, name="Small GPU")
report = fsdpviz.analyze(model, inputs, fully_shard=[DecoderLayer], world_size=8, machine=small)
print(report.memory.fits)""",
    "# nv:show": "view = report.show(model=model, inputs=inputs)\nview",
    "# nv:compare": """\
other = fsdpviz.replan.replay(report, world_size=2)
cmp = fsdpviz.compare(report, other)
cmp""",
}


def _notebook(root: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"{m}\n{c}") for m, c in CELLS.items()]
    nb.metadata = json.loads(QUICKSTART.read_text())["metadata"]  # the quick start's own
    nbformat.write(nb, root / NOTEBOOK)
    shutil.copy(QUICKSTART, root / "quickstart.ipynb")


class Lab:
    """The suite's JupyterLab page, on one notebook at a time."""

    def __init__(self, server: LabServer, page: Any, shots: Path) -> None:
        self.server, self.page, self.shots = server, page, shots
        self.errors: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on(
            "console",
            lambda m: self.errors.append(f"console.error: {m.text}") if m.type == "error" else None,
        )

    def open(self, name: str) -> None:
        """``name`` alone in the page (a reset workspace: no other notebook restored)."""
        self.page.goto(self.server.url + f"lab/tree/{name}?reset")
        self.page.locator(".jp-Notebook").first.wait_for(timeout=UI_MS)

    def kernel_idle(self) -> None:
        """Until the page is connected to the notebook's kernel and it is idle (the
        indicator reads "idle" before the session exists too)."""
        self.server.wait_for_kernel_connection(UI_MS / 1000)
        self.page.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]").wait_for(
            timeout=UI_MS
        )

    def run_all(self) -> None:
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        try:
            wait_until(
                self.page,
                """() => {
                  const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                    .map(p => p.textContent.trim());
                  const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
                  return status && status.dataset.status === 'idle'
                    && prompts.every(p => /^\\[\\d+\\]:$/.test(p));
                }""",
                "Run All Cells to finish",
                timeout_ms=UI_MS * 5,
            )
        finally:
            self.screenshot("newcomer-run-all", self.page)

    def output(self, marker: str) -> Any:
        cell = self.page.locator(".jp-Notebook .jp-CodeCell").filter(
            has=self.page.locator(".jp-InputArea", has_text=marker)
        )
        return cell.locator(".jp-Cell-outputArea")

    def dirty(self) -> bool:
        return bool(
            self.page.evaluate(
                "() => document.querySelector('.jp-mod-current.jp-mod-dirty') !== null"
            )
        )

    def save(self, name: str) -> dict[str, Any]:
        """Save the notebook ``name`` open in front and return it as written: the file is
        read once JupyterLab has rewritten it whole (a notebook that was not modified shows
        no dirty mark to wait for, and a busy server may still be writing it)."""
        path = self.server.root / name
        before = path.stat().st_mtime_ns
        self.page.keyboard.press("Control+s")
        wait_until(self.page, "() => !document.querySelector('.jp-mod-dirty')", "the save",
                   timeout_ms=UI_MS)  # fmt: skip
        deadline = time.monotonic() + UI_MS / 1000
        while True:
            try:
                if path.stat().st_mtime_ns != before:
                    saved: dict[str, Any] = json.loads(path.read_text())
                    return saved
            except json.JSONDecodeError:
                pass  # being written
            if time.monotonic() > deadline:
                raise AssertionError(f"JupyterLab did not write {name} within {UI_MS} ms")
            self.page.wait_for_timeout(100)

    def shut_down_kernels(self) -> None:
        for k in self.server.api("api/kernels"):  # type: ignore[union-attr]
            self.server.api(f"api/kernels/{k['id']}", method="DELETE")

    def screenshot(self, name: str, locator: Any) -> Path:
        path = self.shots / f"{name}.png"
        self.page.mouse.move(1, 1)
        locator.screenshot(path=str(path))
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(path, ARTIFACTS / path.name)
        return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, chromium: Any) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("newcomer") / "root"
    root.mkdir()
    _notebook(root)
    with jupyterlab_server(root) as server:
        page = chromium.new_page(viewport={"width": 1400, "height": 1600})
        try:
            yield Lab(server, page, tmp_path_factory.mktemp("newcomer-shots"))
        finally:
            page.close()


def _kernel(lab: Lab) -> KernelClient:
    return KernelClient(lab.server)


def _unpack(data: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode(data["config"])))
    return config


def test_the_quick_start_opens_unchanged(lab: Lab) -> None:
    """Opened and connected to its kernel, the quick start is not marked as changed: its
    kernelspec and language are the ones JupyterLab reports (where the kernel's Python is
    another version than the one the notebook was saved with, that version is all that
    changes, as for any notebook)."""
    import platform

    committed = json.loads(QUICKSTART.read_text())["metadata"]
    lab.open("quickstart.ipynb")
    lab.kernel_idle()
    lab.page.locator(".jp-MarkdownCell .jp-RenderedMarkdown h1").first.wait_for(timeout=UI_MS)
    next_frame(lab.page)
    lab.page.wait_for_timeout(1000)  # (the kernel's info reaches the notebook's metadata)
    lab.screenshot("quickstart-opened", lab.page)
    same_python = committed["language_info"]["version"] == platform.python_version()
    if same_python:
        assert not lab.dirty(), "the quick start shows as modified on opening"
    saved = lab.save("quickstart.ipynb")["metadata"]
    assert saved["kernelspec"] == committed["kernelspec"]
    assert {**saved["language_info"], "version": None} == {
        **committed["language_info"],
        "version": None,
    }
    lab.shut_down_kernels()


def test_a_plan_that_does_not_fit_in_jupyterlab(lab: Lab) -> None:
    lab.open(NOTEBOOK)
    lab.kernel_idle()
    lab.run_all()
    kernel = _kernel(lab)
    try:
        _does_not_fit(lab, kernel)
        _keys_after_a_click_on_play(lab, kernel)
        _a_re_plan_is_what_the_notebook_saves(lab, kernel)
        _the_comparison_shows_its_differences(lab, kernel)
    finally:
        kernel.close()
    assert not lab.errors, "errors in the browser:\n" + "\n".join(lab.errors)
    _the_saved_notebook_reopens_with_the_last_plan(lab)


def _does_not_fit(lab: Lab, kernel: KernelClient) -> None:
    out = lab.output("# nv:show")
    views_drawn(out, "the dashboard")
    assert kernel.json("report.memory.fits") is False
    # the warning's text (what does not fit, and the first thing to try), pluralised
    shown = out.locator(".widget-html-content").filter(has_text="does not fit in Small GPU")
    text = shown.first.inner_text()
    first_line = kernel.json("report.warnings[0].message.splitlines()[0]")
    assert "1 warning" in text and "1 warnings" not in text, text
    assert first_line in text and "First try: " in text
    # the memory lane's labels kept apart
    timeline = timeline_root(out)
    labels = json.loads(timeline.evaluate("r => r.dataset.fvLabels"))
    assert {b["text"].split(" ")[0] for b in labels} >= {"peak", "Small"}, labels
    for a in labels:
        for b in labels:
            if a is not b:
                apart = (a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"]
                         or a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"])  # fmt: skip
                assert apart, (a, b)
    # the peak: the readout says which moment it reads, with the bytes Python gives
    timeline.get_by_role("button", name=re.compile("^jump to the memory peak")).click()
    info = timeline.locator(".fv-info")
    peak = kernel.json("[fsdpviz.schema.memory.size_text(report.memory.peak['bytes']),"
                       " report.memory.peak['where']]")  # fmt: skip
    wait_until(lab.page, "el => el.textContent.includes('▼ peak')", "the peak's readout",
               arg=info.element_handle(), timeout_ms=UI_MS)  # fmt: skip
    assert f"memory {peak[0]} ▼ peak {peak[1]}" in info.inner_text()
    # ... and all of it shows (the readout is not cut off at its end)
    assert info.evaluate("el => el.scrollHeight <= el.clientHeight + 1")
    for theme, light in (("JupyterLab Light", True), ("JupyterLab Dark", False)):
        choose_theme(lab.page, theme, light)
        lab.screenshot(f"no-fit-dashboard-{'light' if light else 'dark'}", out)
    choose_theme(lab.page, "JupyterLab Light", True)


def _keys_after_a_click_on_play(lab: Lab, kernel: KernelClient) -> None:
    """A click on play (and one to pause) leaves the keyboard with the timeline: → steps it,
    and the notebook (its active cell) does not move."""
    timeline = timeline_root(lab.output("# nv:show"))
    play = timeline.get_by_role("button", name="play / pause (space)")
    timeline.get_by_role("button", name="first step (Home)").click()
    play.click()
    play.click()
    start = int(timeline.evaluate("r => r.fsdpviz.player.step"))
    active = lab.page.evaluate(
        "() => [...document.querySelectorAll('.jp-Cell')].findIndex(c => "
        "c.classList.contains('jp-mod-active'))"
    )
    lab.page.keyboard.press("ArrowRight")
    lab.page.keyboard.press("ArrowRight")
    next_frame(lab.page)
    assert int(timeline.evaluate("r => r.fsdpviz.player.step")) == start + 2
    assert active == lab.page.evaluate(
        "() => [...document.querySelectorAll('.jp-Cell')].findIndex(c => "
        "c.classList.contains('jp-mod-active'))"
    )


def _a_re_plan_is_what_the_notebook_saves(lab: Lab, kernel: KernelClient) -> None:
    out = lab.output("# nv:show")
    world = out.locator(".widget-dropdown", has_text="world size").locator("select")
    world.select_option("16")
    wait_until(
        lab.page,
        "el => el.dataset.fvSaved !== undefined",
        "the re-plan given to the output",
        arg=out.locator(".fv-lab-output").first.element_handle(),
        timeout_ms=UI_MS,
    )
    assert explorer_state(explorer_root(out))["title"].endswith("world size 16")
    assert kernel.json("view.explorer.report.config.world_size") == 16
    saved = lab.save(NOTEBOOK)
    [cell] = [c for c in saved["cells"] if "".join(c["source"]).startswith("# nv:show")]
    [output] = [o for o in cell["outputs"] if MIME in o.get("data", {})]
    views = _unpack(output["data"][MIME])["views"]
    assert views["explorer"]["data"]["title"].endswith("world size 16")
    assert "world size 16" in "".join(output["data"]["text/plain"])


def _the_comparison_shows_its_differences(lab: Lab, kernel: KernelClient) -> None:
    out = lab.output("# nv:compare")
    table = out.locator("table.fsdpviz-costs")
    table.wait_for(timeout=UI_MS)
    timeline_root(out).locator("canvas").first.wait_for(timeout=UI_MS)
    rows = kernel.json(
        "[[k, fsdpviz.api.comparison.cost_text(k, a), "
        "fsdpviz.api.comparison.cost_text(k, b), cmp.change_text(k)] "
        "for k, (a, b) in cmp.costs.items()]"
    )
    assert len(rows) == 5
    for key, a, b, change in rows:
        cells = table.locator(f'tr[data-fv-cost="{key}"] td').all_inner_texts()
        assert cells[1:] == [a, b, change], (key, cells)
    assert kernel.json("cmp.verdict") in out.inner_text()
    groups = timeline_root(out).locator(".fv-group-summary").all_inner_texts()
    assert len(groups) == 2, groups
    for theme, light in (("JupyterLab Dark", False), ("JupyterLab Light", True)):
        choose_theme(lab.page, theme, light)
        lab.screenshot(f"comparison-{'light' if light else 'dark'}", out)


def _the_saved_notebook_reopens_with_the_last_plan(lab: Lab) -> None:
    """No kernel: the views drawn from the saved outputs show the plan on screen when it was
    saved (world size 16), not the first one."""
    lab.shut_down_kernels()
    lab.page.goto("about:blank")
    lab.open(NOTEBOOK)
    out = lab.output("# nv:show")
    try:
        out.locator(".fv-lab-static[data-fv-shown=saved]").first.wait_for(timeout=UI_MS)
        views_drawn(out, "the reopened dashboard")
    except Exception as e:
        raise AssertionError(f"the reopened notebook drew no views; {load_note()}") from e
    assert explorer_state(explorer_root(out))["title"].endswith("world size 16")
    for theme, light in (("JupyterLab Dark", False), ("JupyterLab Light", True)):
        choose_theme(lab.page, theme, light)
        lab.screenshot(f"reloaded-notebook-{'light' if light else 'dark'}", out)
