"""fsdpviz's JupyterLab extension in real JupyterLab (the session's server, its own pages):

- the quick-start notebook, run and saved, its kernel shut down and the page reloaded:
  the timeline, the explorer and the prefetch graph are drawn from the saved outputs
  (``application/vnd.fsdpviz.report+json``), and a click on a timeline mark selects its
  event; while the kernel ran, the live widget was shown;
- a report file (``.fsdpviz.json``) double-clicked in the file browser opens as the page,
  and "Open With > fsdpviz report" opens the Chrome trace fsdpviz writes.

Screenshots (light and dark theme) go to pytest's tmp dir and ``tests/artifacts/``.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser_harness import (
    ARTIFACTS,
    EVENT_CENTRE,
    QUICKSTART,
    UI_MS,
    LabServer,
    choose_theme,
    explorer_root,
    load_note,
    prefetch_root,
    timeline_root,
    views_drawn,
    wait_until,
)
from views_models import needs_front_end

pytestmark = needs_front_end

MIME = "application/vnd.fsdpviz.report+json"
SAVED = "saved_quickstart.ipynb"
RUN_ALL_MS = 1_200_000
_DONE = """() => {
  const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
    .map(p => p.textContent.trim());
  const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return status !== null && status.dataset.status === 'idle' && prompts.length > 0
    && prompts.every(p => /^\\[\\d+\\]:$/.test(p));
}"""


def _shot(page: Any, shots: Path, name: str, locator: Any = None) -> Path:
    path = shots / f"{name}.png"
    page.mouse.move(1, 1)
    (locator or page).screenshot(path=str(path))
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(path, ARTIFACTS / path.name)
    return path


def _click_events(page: Any, root: Any, steps: list[int]) -> list[str]:
    """Click the marks of ``steps`` in the timeline ``root``; what went wrong."""
    handle = root.element_handle()
    n = int(handle.evaluate("r => r.fsdpviz.data.n_steps"))
    wrong = []
    for s in (s % n for s in steps):
        want = handle.evaluate(
            "(r, s) => { const d = r.fsdpviz.data; return d.units[d.steps.unit[s]]; }", s
        )
        at = page.evaluate(EVENT_CENTRE, [handle, s])
        if at is None:
            wrong.append(f"step {s}: no mark")
            continue
        page.mouse.click(at[0], at[1])
        got = handle.evaluate(
            "r => ({step: r.fsdpviz.player.step, unit: r.fsdpviz.model.get('selected_unit')})"
        )
        if got != {"step": s, "unit": want}:
            wrong.append(f"step {s} ({want}): the click selected {got}")
    return wrong


def _cell_output(page: Any, text: str) -> Any:
    return page.locator(".jp-CodeCell").filter(has_text=text).locator(".jp-Cell-outputArea")


def _shut_down_kernels(lab: LabServer, *paths: str) -> None:
    """Shut the sessions of ``paths`` down (what this test's pages started)."""
    sessions = lab.api("api/sessions")
    assert isinstance(sessions, list)
    for session in sessions:
        if session["path"].endswith(paths):
            lab.api(f"api/sessions/{session['id']}", method="DELETE")


def _wait_for_kernel(page: Any, lab: LabServer, path: str) -> None:
    """Until the notebook ``path``'s kernel is connected to the page and idle (a "Select
    Kernel" dialog, where JupyterLab asks, answered with its choice)."""
    deadline = time.monotonic() + UI_MS / 1000
    while time.monotonic() < deadline:
        select = page.locator(".jp-Dialog button.jp-mod-accept")
        if select.count():
            select.first.click()
        sessions = lab.api("api/sessions")
        assert isinstance(sessions, list)
        kernels = [s["kernel"] for s in sessions if s["path"].endswith(path)]
        if any(k["connections"] > 0 and k["execution_state"] == "idle" for k in kernels):
            page.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]").wait_for(
                timeout=UI_MS
            )
            return
        page.wait_for_timeout(200)
    raise AssertionError(f"no kernel connected and idle for {path}; {load_note()}")


def _light(page: Any) -> None:
    if page.evaluate("() => document.body.dataset.jpThemeLight") != "true":
        choose_theme(page, "JupyterLab Light", True)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lab-extension-shots")


def test_saved_notebook_reopens_with_its_views(
    lab_server: LabServer, chromium: Any, shots: Path
) -> None:
    lab = lab_server
    nb = nbformat.read(QUICKSTART, as_version=4)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, lab.root / SAVED)
    page = chromium.new_page(viewport={"width": 1400, "height": 1600})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    try:
        page.goto(lab.url + f"lab/workspaces/fv-saved/tree/{SAVED}")
        _wait_for_kernel(page, lab, SAVED)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        wait_until(page, _DONE, "the quick-start notebook to run", timeout_ms=RUN_ALL_MS)
        live = _cell_output(page, "view = report.show")
        views_drawn(live, "the live dashboard")
        # the kernel holds the dashboard: the live widget is shown, in fsdpviz's renderer
        wait_until(
            page,
            "el => el.querySelector('.fv-lab-output[data-fv-live=true] .fsdpviz-timeline')",
            "the live widget shown",
            arg=live.element_handle(),
            timeout_ms=UI_MS,
        )
        assert live.locator(".fv-lab-static").count() == 0

        page.keyboard.press("Control+s")
        wait_until(
            page,
            "() => !document.querySelector('.jp-mod-dirty')",
            "the notebook saved",
            timeout_ms=UI_MS,
        )
        saved = nbformat.read(lab.root / SAVED, as_version=4)
        shown = [
            o for c in saved.cells if c.cell_type == "code" for o in c.outputs
            if MIME in o.get("data", {})
        ]  # fmt: skip
        assert len(shown) >= 2, "the card and the dashboard carry the views' data"
        _shut_down_kernels(lab, SAVED)  # Kernel > Shut Down Kernel

        page.reload()
        out = _cell_output(page, "view = report.show")
        views_drawn(out, "the saved dashboard, reloaded")
        static = out.locator(".fv-lab-static[data-fv-shown=saved]")
        assert static.count() == 1, "the views are not the saved output's"
        assert out.locator(".fv-lab-output[data-fv-live=true]").count() == 0
        assert "Error displaying widget" not in out.inner_text()
        timeline = timeline_root(static)
        n = int(timeline.evaluate("r => r.fsdpviz.data.n_steps"))
        assert n > 20
        wrong = _click_events(page, timeline, [0, n // 2, n - 1])
        assert not wrong, "\n".join(wrong) + f"\n{load_note()}"
        # linked as the page links them: the clicked unit is the explorer's and the graph's
        unit = timeline.evaluate("r => r.fsdpviz.model.get('selected_unit')")
        for root in (explorer_root(static), prefetch_root(static)):
            assert root.evaluate("r => r.dataset.fvSelectedUnit") == unit
        # hover names the event under the mouse
        at = page.evaluate(EVENT_CENTRE, [timeline.element_handle(), 1])
        page.mouse.move(at[0], at[1])
        tip = timeline.locator(".fv-tooltip")
        assert tip.is_visible() and tip.inner_text().strip()
        # the card: as it was, its views drawn when asked for
        card = _cell_output(page, "report = fsdpviz.analyze(")
        assert "fsdpviz</b>" in card.inner_html() or "fsdpviz" in card.inner_text()
        card.locator(".fv-lab-details > summary").click()
        views_drawn(card, "the card's views")
        assert not errors, errors
        _light(page)
        _shot(page, shots, "lab-saved-notebook-light", out)
        choose_theme(page, "JupyterLab Dark", False)
        _shot(page, shots, "lab-saved-notebook-dark", out)
        _light(page)
    finally:
        page.close()
        _shut_down_kernels(lab, SAVED)


def test_report_file_opens_as_the_page(lab_server: LabServer, chromium: Any, shots: Path) -> None:
    from export_models import report_49_units

    lab = lab_server
    report = report_49_units()
    report.save(lab.root / "plan.fsdpviz.json")
    report.save(lab.root / "plan-trace.json")
    page = chromium.new_page(viewport={"width": 1400, "height": 1400})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    try:
        page.goto(lab.url + "lab/workspaces/fv-files")
        item = page.locator(".jp-DirListing-item", has_text="plan.fsdpviz.json")
        item.wait_for(timeout=UI_MS)
        item.dblclick()
        doc = page.locator(".jp-MainAreaWidget .fv-lab-document").last
        views_drawn(doc, "the report file's page")
        header = doc.locator(".fv-lab-header").inner_text()
        assert "49" in header and re.search(r"wrap units\s*49", header), header
        timeline = timeline_root(doc)
        n = int(timeline.evaluate("r => r.fsdpviz.data.n_steps"))
        wrong = _click_events(page, timeline, [3, n // 3])
        assert not wrong, "\n".join(wrong) + f"\n{load_note()}"
        _light(page)
        _shot(page, shots, "lab-report-file-light")
        choose_theme(page, "JupyterLab Dark", False)
        _shot(page, shots, "lab-report-file-dark")
        _light(page)

        # the Chrome trace: Open With > fsdpviz report
        trace = page.locator(".jp-DirListing-item", has_text="plan-trace.json")
        trace.click(button="right")
        page.locator(".lm-Menu-item:has-text('Open With')").hover()
        page.locator(".lm-Menu-item:has-text('fsdpviz report')").click()
        views_drawn(page.locator(".jp-MainAreaWidget .fv-lab-document").last, "the trace's page")
        assert not errors, errors
    finally:
        page.close()
