"""Interactive views at scale: figure build time and JSON size, and re-plan latency.

1. A 10,000-module model (the bundled example with 833 decoder layers): build time and
   JSON size of the explorer (icicle), prefetch graph and timeline figures, and of the
   timeline widget's payload (targets: explorer under 1 s and 5 MB).
2. A 1,000-module model (83 layers): what one change of a control costs in the
   explorer: ``Replanner.plan`` (today a full ``fsdpviz.analyze``, tracing again) plus
   redrawing the explorer widget (target: 200 ms in all).

    python benchmarks/bench_views.py [--repeats 3] [--skip-big]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from fsdpviz.examples import ExampleConfig, example_analysis, example_inputs, example_model
from fsdpviz.replan import PlanOptions, Replanner
from fsdpviz.views import explorer_figure, prefetch_figure, timeline_data, timeline_figure

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
    seconds, data = timed(lambda: timeline_data(report, None), repeats)
    print(
        f"  {'timeline widget payload':36s} build {seconds * 1000:7.0f} ms   JSON "
        f"{len(json.dumps(data)) / 1e6:5.2f} MB   ({data['n_steps']} steps)"
    )


def replan(repeats: int) -> None:
    from fsdpviz.widgets import Explorer

    config = ExampleConfig(num_layers=83)
    model, inputs = example_model(config), example_inputs(config)
    planner = Replanner(model, inputs)
    n_modules = sum(1 for _ in model.modules())
    base = PlanOptions(layer_classes=("DecoderLayer",))
    report = planner.plan(base)
    explorer = Explorer(report, replanner=planner)
    changes = [
        {"world_size": 16},
        {"world_size": 64},
        {"backward_prefetch": "BACKWARD_POST"},
        {"forward_prefetch": True},
        {"sharding_strategy": "SHARD_GRAD_OP"},
        {"layer_classes": ("Attention", "MLP")},
    ][: max(repeats * 2, 2)]
    plan_s, redraw_s = [], []
    for change in changes:
        opts = base.replace(**change)
        start = time.perf_counter()
        new = planner.plan(opts)
        plan_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        explorer.report = new
        redraw_s.append(time.perf_counter() - start)
    cached_start = time.perf_counter()
    planner.plan(base)
    cached = time.perf_counter() - cached_start
    print(
        f"re-plan, {n_modules}-module model ({len(report.units)} units), "
        f"median of {len(changes)} control changes:"
    )
    print(
        f"  Replanner.plan (fsdpviz.analyze) {statistics.median(plan_s) * 1000:7.0f} ms"
        f"   (min {min(plan_s) * 1000:.0f}, max {max(plan_s) * 1000:.0f})"
    )
    print(f"  explorer redraw                  {statistics.median(redraw_s) * 1000:7.0f} ms")
    print(
        f"  total                            "
        f"{(statistics.median(plan_s) + statistics.median(redraw_s)) * 1000:7.0f} ms"
        f"   (target 200 ms)"
    )
    print(f"  back to a cached setting         {cached * 1000:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-big", action="store_true")
    args = parser.parse_args()
    replan(args.repeats)
    if not args.skip_big:
        big(args.repeats)


if __name__ == "__main__":
    main()
