"""Interactive views at scale: figure build time and JSON size, and re-plan latency.

1. A 10,000-module model (the bundled example with 833 decoder layers): build time and
   JSON size of the explorer (icicle), prefetch graph and timeline figures, of the data
   the exported page draws the explorer and the prefetch graph from, and of the timeline
   widget's payload (targets: explorer under 1 s and 5 MB); its exported page in headless
   Chromium (target: under 5 MB, drawn in under 1 s): time to draw each stage, time per
   step, frames while playing.
2. A 1,000-module model (83 layers): what one change of a control costs in the
   dashboard as it runs in a kernel (the answer: all three views' new data sent),
   measured alternately with ``fsdpviz.analyze`` for the same options; and in
   JupyterLab, from a control changed in the page to all three views drawn with the new
   plan (target 200 ms), every frame meanwhile checked for a stale view.
3. A 500-unit plan's exported page in headless Chromium: hover and click on events
   spread over the iteration, and on units in the explorer and the prefetch graph, each
   until the next frame is drawn (target 50 ms), and a step drawn (target 16 ms per frame).

    python benchmarks/bench_views.py [--repeats 3] [--skip-big] [--skip-replan]
        [--skip-browser-replan] [--units 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from fsdpviz.examples import ExampleConfig, example_analysis, example_inputs, example_model
from fsdpviz.views import explorer_figure, prefetch_figure, timeline_data, timeline_figure
from fsdpviz.views.explorer import explorer_data
from fsdpviz.views.prefetch import prefetch_data

SMALL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2}


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def big(repeats: int) -> None:
    config = ExampleConfig(num_layers=833, **SMALL)
    start = time.perf_counter()
    report = example_analysis(config=config, progress=False)
    print(
        f"10k model: {len(report.modules)} modules, {len(report.units)} units, "
        f"analyze {time.perf_counter() - start:.1f} s"
    )
    n = len(report.iterations[-1])
    memory = [float(i % 97) for i in range(n)]
    builders: dict[str, Callable[[], Any]] = {
        "explorer (icicle)": lambda: explorer_figure(report),
        "explorer (treemap, bytes per rank)": lambda: explorer_figure(
            report, kind="treemap", size="rank_bytes"
        ),
        "prefetch graph": lambda: prefetch_figure(report),
        "timeline figure (+ memory)": lambda: timeline_figure(report, memory=memory),
    }
    for name, build in builders.items():
        seconds, fig = timed(build, repeats)
        size = len(fig.to_json())
        print(f"  {name:36s} build {seconds * 1000:7.0f} ms   JSON {size / 1e6:5.2f} MB")
    for name, make in (
        ("explorer data (the page's)", lambda: explorer_data(report)),
        ("prefetch graph data (the page's)", lambda: prefetch_data(report)),
    ):
        seconds, made = timed(make, repeats)
        print(
            f"  {name:36s} build {seconds * 1000:7.0f} ms   JSON "
            f"{len(json.dumps(made)) / 1e6:5.2f} MB"
        )
    seconds, data = timed(lambda: timeline_data(report, None), repeats)
    print(
        f"  {'timeline widget payload':36s} build {seconds * 1000:7.0f} ms   JSON "
        f"{len(json.dumps(data)) / 1e6:5.2f} MB   ({data['n_steps']} steps)"
    )
    stepping(report)


# In the page: each step waits for the next frame, so drawing is part of the time.
_STEP_JS = """async (n) => {
  const b = [...document.querySelectorAll('.fsdpviz-timeline button')]
    .find(x => x.title.startsWith('step forward'));
  const times = [], work = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    b.click();
    work.push(performance.now() - t0);
    await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  work.sort((a, b) => a - b);
  return {median: times[n >> 1], p95: times[Math.floor(n * 0.95)], max: times[n - 1],
          work: work[n >> 1], work95: work[Math.floor(n * 0.95)]};
}"""
_PLAY_JS = """async (ms) => {
  const play = [...document.querySelectorAll('.fsdpviz-timeline button')]
    .find(x => x.title.startsWith('play'));
  const speed = document.querySelector('.fsdpviz-timeline select.fv-speed');
  speed.value = '100';
  speed.dispatchEvent(new Event('change'));
  const s0 = window.fsdpvizModel.get('step');
  const gaps = [];
  let last = performance.now(), running = true;
  const loop = (now) => {
    gaps.push(now - last); last = now; if (running) requestAnimationFrame(loop);
  };
  requestAnimationFrame(loop);
  play.click();
  await new Promise(r => setTimeout(r, ms));
  running = false;
  play.click();
  gaps.sort((a, b) => a - b);
  return {steps: window.fsdpvizModel.get('step') - s0, frames: gaps.length,
          p95: gaps[Math.floor(gaps.length * 0.95)], max: gaps[gaps.length - 1]};
}"""


_POINTER_JS = """async (n) => {
  const root = document.querySelector('.fsdpviz-timeline'), v = root.fsdpviz;
  const st = v.data.steps;
  const frame = () => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
  const hover = [], click = [], tip = root.querySelector('.fv-tooltip');
  for (let k = 0; k < n; k++) {
    const s = Math.floor((k + 0.5) * v.data.n_steps / n);
    const w = Math.max(st.x1[s] - st.x0[s], 1e-9);
    v.showRange(st.x0[s] - 2 * w, st.x1[s] + 2 * w);
    await frame();
    const c = v.markCentre(s), r = v.canvas.getBoundingClientRect();
    const at = {clientX: r.left + c.x, clientY: r.top + c.y, bubbles: true};
    let t0 = performance.now();
    v.canvas.dispatchEvent(new MouseEvent('mousemove', at));
    await frame();
    hover.push(performance.now() - t0);
    if (tip.hidden) throw new Error('no hover details for step ' + s);
    t0 = performance.now();
    v.canvas.dispatchEvent(new MouseEvent('click', at));
    await frame();
    click.push(performance.now() - t0);
    if (v.player.step !== s) throw new Error(`the click on step ${s} selected ${v.player.step}`);
  }
  const q = (xs, p) =>
    [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))];
  return {hover: [q(hover, 0.5), q(hover, 0.95), Math.max(...hover)],
          click: [q(click, 0.5), q(click, 0.95), Math.max(...click)],
          pick: v.lastPickMs};
}"""


# Hover and click on the explorer's blocks and the prefetch graph's nodes, each until the
# next frame is drawn: n of each, spread over the model (the views zoom to what is clicked).
_VIEWS_POINTER_JS = """async (n) => {
  const frame = () => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
  const q = (xs, p) =>
    [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))];
  const ex = document.querySelector('#fv-explorer .fsdpviz-explorer').fsdpviz;
  const pf = document.querySelector('#fv-prefetch .fsdpviz-prefetch').fsdpviz;
  const out = {};
  const run = async (name, view, targets, centre, check) => {
    const hover = [], click = [];
    for (const t of targets) {
      const c = centre(t);
      if (c === null) throw new Error(`${name}: ${t} is not drawn`);
      const r = view.canvas.getBoundingClientRect();
      const at = {clientX: r.left + c[0], clientY: r.top + c[1], bubbles: true};
      let t0 = performance.now();
      view.canvas.dispatchEvent(new MouseEvent('mousemove', at));
      await frame();
      hover.push(performance.now() - t0);
      if (!view.tooltip.shown) throw new Error(`${name}: no hover details for ${t}`);
      t0 = performance.now();
      view.canvas.dispatchEvent(new MouseEvent('click', at));
      await frame();
      click.push(performance.now() - t0);
      check(t);
    }
    out[name] = {hover: [q(hover, 0.5), q(hover, 0.95), Math.max(...hover)],
                 click: [q(click, 0.5), q(click, 0.95), Math.max(...click)]};
  };
  const units = pf.data.units;
  const picks = Array.from({length: n}, (_, k) => units[Math.floor((k + 0.5) * units.length / n)]);
  await run('prefetch graph', pf, picks, (u) => {
    pf.follow(pf.data.units.indexOf(u));
    const c = pf.nodeCentre(u); return c && [c.x, c.y];
  }, (u) => { if (document.body.dataset.fvSelectedUnit !== u) throw new Error(`selected ${u}?`); });
  await run('explorer', ex, picks, (u) => {
    ex.focusOn(0); ex.reveal(ex.index.unitModule[ex.data.units.findIndex(x => x.name === u)]);
    const s = ex.slotOf(ex.index.unitModule[ex.data.units.findIndex(x => x.name === u)]);
    return s && [s.x + s.w / 2, s.y + s.h / 2];
  }, (u) => { if (document.body.dataset.fvSelectedUnit !== u) throw new Error(`selected ${u}?`); });
  return out;
}"""


_MARKS_JS = """() => performance.getEntriesByType("mark")
  .filter((m) => m.name.startsWith("fsdpviz:")).map((m) => [m.name, m.startTime])"""


def _open_page(p: Any, path: Any, chromium: str) -> tuple[Any, Any, float]:
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
    browser = p.chromium.launch(executable_path=chromium, args=args)
    page = browser.new_page(viewport={"width": 1300, "height": 1500})
    start = time.perf_counter()
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-fv-ready=true]", timeout=300_000)
    return browser, page, time.perf_counter() - start


def pointer(units: int) -> None:
    """Hover, click and step on the exported page of a ``units``-unit plan."""
    import shutil
    import tempfile
    from pathlib import Path

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("pointer in the browser: skipped (playwright is not installed)")
        return
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("pointer in the browser: skipped (no chromium)")
        return
    start = time.perf_counter()
    report = example_analysis(config=ExampleConfig(num_layers=units - 1, **SMALL), progress=False)
    print(
        f"{len(report.units)}-unit plan ({len(report.modules)} modules, "
        f"{len(report.iterations[-1])} events per iteration), analyze "
        f"{time.perf_counter() - start:.1f} s"
    )
    path = Path(tempfile.mkdtemp()) / "units.html"
    report.save(path)
    with sync_playwright() as p:
        browser, page, ready = _open_page(p, path, chromium)
        got = page.evaluate(_POINTER_JS, 100)
        step = page.evaluate(_STEP_JS, 200)
        views = page.evaluate(_VIEWS_POINTER_JS, 50)
        browser.close()
    print(f"  exported page ({path.stat().st_size / 1e6:.1f} MB) drawn in {ready:.2f} s")
    for name in ("hover", "click"):
        median, p95, most = got[name]
        print(
            f"  {name} answered and drawn: median {median:.0f} ms, 95th percentile {p95:.0f} ms, "
            f"max {most:.0f} ms (100 events; target 50 ms)"
        )
    for view, times in views.items():
        for name in ("hover", "click"):
            median, p95, most = times[name]
            print(
                f"  {view} {name} answered and drawn: median {median:.0f} ms, 95th percentile "
                f"{p95:.0f} ms, max {most:.0f} ms (50 units; target 50 ms)"
            )
    print(
        f"  one step: its work (state, text, canvas) median {step['work']:.1f} ms, 95th "
        f"percentile {step['work95']:.1f} ms (target 16 ms, a frame); shown on the next frame: "
        f"median {step['median']:.1f} ms, max {step['max']:.1f} ms (200 steps)"
    )


def stepping(report: Any) -> None:
    """The exported page of ``report`` in headless Chromium (no kernel, as in a notebook's
    front end): time to draw, time per step, frames while playing at 100 steps/s."""
    import shutil
    import tempfile
    from pathlib import Path

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("  stepping in the browser: skipped (playwright is not installed)")
        return
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("  stepping in the browser: skipped (no chromium)")
        return
    path = Path(tempfile.mkdtemp()) / "big.html"
    report.save(path)
    with sync_playwright() as p:
        browser, page, ready = _open_page(p, path, chromium)
        drawn = page.evaluate(
            "document.querySelector('#fv-explorer .fsdpviz-explorer').fsdpviz.rows"
            ".reduce((n, r) => n + r.x.length, 0)"
        )
        marks = page.evaluate(_MARKS_JS)
        step = page.evaluate(_STEP_JS, 200)
        play = page.evaluate(_PLAY_JS, 3000)
        browser.close()
    print(
        f"  exported page ({path.stat().st_size / 1e6:.2f} MB) drawn in {ready:.2f} s "
        f"(explorer: {drawn} blocks drawn for {len(report.modules)} modules, the thinnest as "
        "pixel columns); software-rendered headless Chromium"
    )
    stages, last = [], 0.0
    for name, at in marks:  # the page's performance marks: each stage's share of the time
        stages.append(f"{name.removeprefix('fsdpviz:').removeprefix('fv-')} {at - last:.0f}")
        last = at
    print(f"  stages (ms, from navigation start): {', '.join(stages)}")
    at = dict(marks)
    if "fsdpviz:first-view" in at and "fsdpviz:painted" in at:
        print(
            f"  first view (summary and timeline, usable) painted at "
            f"{at['fsdpviz:first-view'] / 1000:.2f} s; every view drawn, linked and painted at "
            f"{at['fsdpviz:painted'] / 1000:.2f} s from navigation start (target 1 s)"
        )
    print(
        f"  one step, drawn: median {step['median']:.0f} ms, 95th percentile "
        f"{step['p95']:.0f} ms, max {step['max']:.0f} ms (200 steps)"
    )
    print(
        f"  playing at 100 steps/s for 3 s: {play['steps']} steps, {play['frames']} frames, "
        f"95th percentile frame {play['p95']:.0f} ms, longest {play['max']:.0f} ms"
    )


# One control at a time, as a person changes them: every FSDP1 control, the recipe,
# then the FSDP2 controls. Each entry is one answer.
CHANGES: list[dict[str, Any]] = [
    {"layer_classes": ("Attention", "MLP")},
    {"layer_classes": ("DecoderLayer", "Linear")},
    {"layer_classes": ("DecoderLayer",)},
    {"policy": "size"},
    {"min_num_params": 200_000},
    {"min_num_params": 100_000_000},
    {"policy": "none"},
    {"policy": "classes"},
    {"forward_prefetch": True},
    {"world_size": 64},
    {"backward_prefetch": "BACKWARD_POST"},
    {"sharding_strategy": "SHARD_GRAD_OP"},
    {"backward_prefetch": "BACKWARD_PRE"},
    {"forward_prefetch": False},
    {"recipe": "FSDP2"},
    {"layer_classes": ("Attention", "MLP")},
    {"layer_classes": ("DecoderLayer", "Linear")},
    {"layer_classes": ("DecoderLayer",)},
    {"sharding_strategy": "FULL_SHARD"},
    {"world_size": 8},
    {"recipe": "FSDP1"},
]


def replan(repeats: int, verbose: bool = False) -> None:
    """Control changes on a 1,000-module model in the dashboard, as in a kernel.

    The dashboard runs on an asyncio loop as in JupyterLab. For each control change, the
    *answer*: the control's callback, from the change to the new plan's data of all three
    views (explorer, prefetch graph, timeline with its memory lane) handed to the widgets'
    comm, as one answer. Alternating, in the same process: ``fsdpviz.analyze`` for the same
    options (what a change cost without the stored traces). Between changes the bench does
    what the idle kernel does (one garbage collection); the trace for the memory curve, made
    once the controls rest, is not part of an answer. What the browser adds (the messages,
    the three redraws) is measured by ``replan_in_browser``.
    """
    asyncio.run(_replan(repeats, verbose))


def _model_1000() -> tuple[Any, Any, Any]:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from fsdpviz import analyze
    from fsdpviz.examples import DecoderLayer

    config = ExampleConfig(num_layers=83)
    model, inputs = example_model(config), example_inputs(config)
    report = analyze(
        model, inputs, auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}), progress=False
    )
    return model, inputs, report


async def _replan(repeats: int, verbose: bool) -> None:
    import gc

    from fsdpviz import analyze
    from fsdpviz.widgets import Dashboard

    model, inputs, report = _model_1000()
    n_modules = sum(1 for _ in model.modules())
    start = time.perf_counter()
    view = Dashboard(report, model=model, inputs=inputs)
    shown = time.perf_counter() - start
    explorer, planner = view.explorer, view.explorer.replanner
    assert planner is not None
    start = time.perf_counter()
    while explorer._deferred.pending("warm"):  # the shown recipe's stored trace, made idle
        await asyncio.sleep(0.01)
    warm = time.perf_counter() - start
    start = time.perf_counter()
    planner.warm(explorer.options.replace(recipe="FSDP2"))  # made on the first FSDP2 plan
    warm2 = time.perf_counter() - start
    sent: list[int] = [0]  # bytes of data each answer sends (JSON), the three views'
    for widget in (explorer.view, view.prefetch, view.timeline):
        widget.observe(lambda c: sent.__setitem__(-1, sent[-1] + len(json.dumps(c["new"]))),
                       names="data")  # fmt: skip
    answer_s: list[float] = []
    cpu_s: list[float] = []  # the answer's own CPU time: what a busy machine does not stretch
    traced_s: list[float] = []
    by_recipe: dict[str, list[float]] = {}
    paths: set[str] = set()
    for _ in range(repeats):
        planner._cache.clear()
        for change in CHANGES:
            gc.collect()  # what the idle kernel does between answers
            before = explorer.options
            start, cpu = time.perf_counter(), time.process_time()
            explorer.controls.set(**change, as_browser=True)  # as a click in the page
            answered = time.perf_counter()
            cpu_s.append(time.process_time() - cpu)
            assert explorer.options != before, f"{change} changed nothing"
            sent.append(0)
            view._deferred.cancel("profile")  # the next change comes before the controls rest
            assert explorer.errors.last_error is None and view.errors.last_error is None
            assert not (explorer.busy or view.prefetch.busy or view.timeline.busy)
            answer_s.append(answered - start)
            by_recipe.setdefault(explorer.options.recipe, []).append(answer_s[-1])
            paths.add(str(planner.last_path))
            if verbose:
                print(
                    f"    {change}: answer {answer_s[-1] * 1000:.0f} ms ({planner.last_path}, "
                    f"{len(explorer.report.units)} units)"
                )
            start = time.perf_counter()
            analyze(model, inputs, **planner.fsdp_kwargs(explorer.options))
            traced_s.append(time.perf_counter() - start)
    answer, traced = statistics.median(answer_s), statistics.median(traced_s)
    print(
        f"re-plan in the dashboard, {n_modules}-module model ({len(report.units)} units at "
        f"first), {len(answer_s)} control changes ({', '.join(sorted(paths))}):"
    )
    print(f"  dashboard shown                            {shown * 1000:7.0f} ms")
    print(f"  stored trace (FSDP1), made while idle      {warm * 1000:7.0f} ms (once)")
    print(f"  stored trace (FSDP2), made on first use    {warm2 * 1000:7.0f} ms (once)")
    print(
        f"  answer (all three views' data sent)  median {answer * 1000:5.0f} ms, 90th "
        f"percentile {_quantile(answer_s, 0.9) * 1000:4.0f}, max {max(answer_s) * 1000:4.0f}"
    )
    print(
        f"  its CPU time (the machine's load aside) median {statistics.median(cpu_s) * 1000:5.0f} "
        f"ms, 90th percentile {_quantile(cpu_s, 0.9) * 1000:4.0f}"
    )
    for recipe, times in by_recipe.items():
        median = statistics.median(times) * 1000
        print(f"    {recipe} answers                          {median:5.0f} ms median")
    print(
        f"  data sent per answer (JSON, 3 views)       {statistics.median(sent[:-1]) / 1e3:7.0f} kB"
        " median"
    )
    print(f"  fsdpviz.analyze for the same options       {traced * 1000:7.0f} ms median")
    print(f"  ratio analyze / answer                     {traced / answer:7.1f}x")


# In JupyterLab: a control changed in the page, timed until all three views have drawn the
# new plan (each was busy and is no more: it holds the new plan's data, and a frame has been
# drawn since); every frame meanwhile is checked for a view still showing the old plan (not
# yet busy) beside one showing the new.
_REPLAN_JS = """async ([cell, how]) => {
  const views = () => [
    cell.querySelector('.fsdpviz-explorer-box').fsdpviz.view,
    cell.querySelector('.fsdpviz-prefetch').fsdpviz,
    cell.querySelector('.fsdpviz-timeline').fsdpviz,
  ];
  const busy = (v) => v.root.closest('.fv-busy') !== null;
  const old = views().map((v) => v.data);
  let stale = 0, frames = 0;
  // a re-plan marks every view busy from its start until that view has the new plan's
  // data (which may equal the old, e.g. a prefetch option a plan does not use): watched
  // as it happens, however soon it ends
  const boxes = views().map((v) => v.root.closest('.fsdpviz-explorer-box') ?? v.root);
  const was = [false, false, false];
  let first = 0;
  const watch = new MutationObserver((records) => {
    if (first === 0) first = performance.now();
    for (const r of records) {
      const k = boxes.indexOf(r.target);
      const on = r.target.classList.contains('fv-busy');
      if (k >= 0 && (on || (r.oldValue ?? '').includes('fv-busy'))) was[k] = true;
    }
  });
  for (const b of boxes)
    watch.observe(b, {attributes: true, attributeFilter: ['class'], attributeOldValue: true});
  const t0 = performance.now();
  if (how.select !== undefined) {
    const select = [...cell.querySelectorAll('.widget-dropdown')]
      .find((d) => d.textContent.trim().startsWith(how.select)).querySelector('select');
    const index = [...select.options].findIndex((o) => o.textContent.trim() === how.to);
    select.selectedIndex = index;
    select.dispatchEvent(new Event('change', {bubbles: true}));
  } else {
    [...cell.querySelectorAll('button, label')]
      .find((b) => b.textContent.trim() === how.click).click();
  }
  return await new Promise((done, fail) => {
    const frame = () => {
      frames++;
      const vs = views();
      const fresh = vs.map((v, k) => v.data !== old[k]);
      const shown = vs.map((v) => !busy(v));
      if (fresh.some((f, k) => f && shown[k]) && fresh.some((f, k) => !f && shown[k] && !was[k]))
        stale++;
      if (was.every(Boolean) && shown.every(Boolean)) {
        const t = performance.now() - t0;
        watch.disconnect();
        requestAnimationFrame(() => done({ms: t, stale, frames, busy: first - t0}));
        return;
      }
      if (performance.now() - t0 > 60000) {
        watch.disconnect();
        fail(new Error(`no redraw in 60 s: new data ${fresh}, shown ${shown}, busy ${was}`));
        return;
      }
      requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
  });
}"""

# One control at a time through the page's own controls (a replay, plans from the stored
# traces, the other recipe), as a person changes them.
BROWSER_CHANGES: list[dict[str, str]] = [
    {"select": "world size", "to": "64"},
    {"select": "backward prefetch", "to": "BACKWARD_POST"},
    {"select": "sharding", "to": "SHARD_GRAD_OP"},
    {"click": "forward prefetch"},
    {"select": "world size", "to": "16"},
    {"select": "backward prefetch", "to": "BACKWARD_PRE"},
    {"select": "sharding", "to": "FULL_SHARD"},
    {"click": "forward prefetch"},
    {"click": "FSDP2"},
    {"select": "world size", "to": "8"},
    {"click": "FSDP1"},
]


def replan_in_browser(repeats: int) -> None:
    """The 1,000-module dashboard in JupyterLab: each control change timed in the page,
    from the change to all three views drawn with the new plan (the kernel's answer, the
    messages and the three redraws included), one change a second at most, as a person
    makes them (the kernel's idle garbage collection, 0.3 s after an answer, is over). The
    trace for the activations a dashboard makes once the controls rest is turned off: it is
    not part of a re-plan's answer (a change made while it runs waits for it)."""
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("re-plan in JupyterLab: skipped (playwright is not installed)")
        return
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("re-plan in JupyterLab: skipped (no chromium)")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import nbformat
    from browser_harness import CHROMIUM_ARGS, KernelTraffic, jupyterlab_server, views_drawn

    code = (
        "from torch.distributed.fsdp.wrap import ModuleWrapPolicy\n"
        "import fsdpviz\n"
        "from fsdpviz.examples import (DecoderLayer, ExampleConfig, example_inputs,"
        " example_model)\n"
        "config = ExampleConfig(num_layers=83)\n"
        "model, inputs = example_model(config), example_inputs(config)\n"
        "report = fsdpviz.analyze(model, inputs, progress=False,"
        " auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}))\n"
        "import fsdpviz.widgets.dashboard as _d\n"
        "_d.PROFILE_AFTER_S = 1e9  # no trace for the activations between changes\n"
        "view = report.show(model=model, inputs=inputs)\n"
        "planner = view.explorer.replanner  # both recipes' stored traces, made once\n"
        "planner.warm(view.explorer.options)\n"
        "planner.warm(view.explorer.options.replace(recipe='FSDP2'))\n"
        "view"
    )
    root = Path(tempfile.mkdtemp()) / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, root / "bench.ipynb")
    times: list[float] = []
    first: list[float] = []  # until the views hear a re-plan started (the kernel got it)
    stale = 0
    with jupyterlab_server(root) as lab, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        traffic = KernelTraffic(page)
        page.goto(lab.url + "lab/tree/bench.ipynb")
        lab.wait_for_kernel_connection(300)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]").wait_for(timeout=300_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        cell = page.locator(".jp-CodeCell").first
        views_drawn(cell, "the 1,000-module dashboard", timeout_ms=600_000)
        traffic.wait_until_answered(after=0, timeout=600, quiet=3.0)  # stored trace made
        handle = cell.element_handle()
        for _ in range(repeats):
            for how in BROWSER_CHANGES:
                try:
                    got = page.evaluate(_REPLAN_JS, [handle, how])
                except Exception as e:
                    raise RuntimeError(f"re-plan {how}: {e}") from e
                times.append(got["ms"] / 1000)
                first.append(got["busy"] / 1000)
                stale += got["stale"]
                # a person's pace: the kernel has answered and run its idle collection
                traffic.wait_until_answered(after=-1, timeout=120, quiet=1.0)
        browser.close()
    print(
        f"re-plan in JupyterLab, 1,001-module model, {len(times)} control changes in the page: "
        f"all three views drawn with the new plan {statistics.median(times) * 1000:.0f} ms "
        f"median, 90th percentile {_quantile(times, 0.9) * 1000:.0f} ms, max "
        f"{max(times) * 1000:.0f} ms (target 200 ms), of which until the views heard the "
        f"re-plan start {statistics.median(first) * 1000:.0f} ms median; frames with a view "
        f"showing the old plan beside one showing the new: {stale}"
    )


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--skip-replan", action="store_true")
    parser.add_argument("--skip-browser-replan", action="store_true")
    parser.add_argument("--units", type=int, default=500, help="units of the pointer bench")
    parser.add_argument("--verbose", action="store_true", help="print every re-plan")
    args = parser.parse_args()
    if not args.skip_replan:
        replan(args.repeats, args.verbose)
    if not args.skip_browser_replan:
        replan_in_browser(args.repeats)
    pointer(args.units)
    if not args.skip_big:
        big(args.repeats)


if __name__ == "__main__":
    main()
