"""Interactive views at scale: figure build time and JSON size, and re-plan latency.

1. A 10,000-module model (the bundled example with 833 decoder layers): build time and
   JSON size of the explorer (icicle), prefetch graph and timeline figures, and of the
   timeline widget's payload (targets: explorer under 1 s and 5 MB).
2. A 1,000-module model (83 layers): what one change of a control costs in the
   explorer (``Replanner.plan`` from the stored trace, plus redrawing the explorer;
   target 200 ms), measured alternately with ``fsdpviz.analyze`` for the same options.

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


def replan(repeats: int, verbose: bool = False) -> None:
    """Control changes on a 1,000-module model: the explorer's answer vs tracing again.

    Side by side in one process, alternating: ``Replanner.plan`` (stored trace, or a
    replay) plus the explorer redraw, against ``fsdpviz.analyze`` for the same options
    (what every change cost before the stored traces). A stored trace is made once
    per recipe, on its first plan; that cost is printed separately.
    """
    from fsdpviz.analyze import analyze
    from fsdpviz.widgets import Explorer

    config = ExampleConfig(num_layers=83)
    model, inputs = example_model(config), example_inputs(config)
    planner = Replanner(model, inputs)
    n_modules = sum(1 for _ in model.modules())
    base = PlanOptions(layer_classes=("DecoderLayer",))
    start = time.perf_counter()
    report = planner.plan(base)
    first = time.perf_counter() - start
    start = time.perf_counter()
    planner.plan(base.replace(recipe="FSDP2"))
    first2 = time.perf_counter() - start
    explorer = Explorer(report, replanner=planner)
    changes = [
        {"layer_classes": ("Attention", "MLP")},
        {"layer_classes": ("DecoderLayer", "Linear")},
        {"policy": "size", "min_num_params": 200_000},
        {"policy": "none"},
        {"forward_prefetch": True},
        {"world_size": 64},
        {"backward_prefetch": "BACKWARD_POST"},
        {"sharding_strategy": "SHARD_GRAD_OP"},
        {"recipe": "FSDP2"},
        {"recipe": "FSDP2", "layer_classes": ("Attention", "MLP")},
        {"recipe": "FSDP2", "layer_classes": ("DecoderLayer", "Linear")},
        {"recipe": "FSDP2", "sharding_strategy": "SHARD_GRAD_OP", "world_size": 64},
    ]
    answer_s, traced_s, paths = [], [], []
    by_recipe: dict[str, list[float]] = {}
    for _ in range(repeats):
        planner._cache.clear()
        for change in changes:
            opts = base.replace(**change)
            start = time.perf_counter()
            new = planner.plan(opts)
            explorer.report = new
            answer_s.append(time.perf_counter() - start)
            by_recipe.setdefault(opts.recipe, []).append(answer_s[-1])
            paths.append(planner.last_path)
            if verbose:
                print(f"    {change}: {answer_s[-1] * 1000:.0f} ms ({planner.last_path})")
            start = time.perf_counter()
            analyze(model, inputs, **planner.fsdp_kwargs(opts))
            traced_s.append(time.perf_counter() - start)
    planner.profiled(base)
    start = time.perf_counter()
    planner.plan(base.replace(world_size=128))
    replayed = time.perf_counter() - start
    answer, traced = statistics.median(answer_s), statistics.median(traced_s)
    print(
        f"re-plan, {n_modules}-module model ({len(report.units)} units at first), "
        f"{len(answer_s)} control changes ({', '.join(sorted(set(map(str, paths))))}):"
    )
    print(f"  stored trace, made on the first plan      {first * 1000:7.0f} ms (once)")
    print(f"  FSDP2 stored trace, first FSDP2 plan      {first2 * 1000:7.0f} ms (once)")
    print(
        f"  answer: Replanner.plan + explorer redraw  {answer * 1000:7.0f} ms median"
        f"   (90th percentile {_quantile(answer_s, 0.9) * 1000:.0f}, max "
        f"{max(answer_s) * 1000:.0f}; target 200 ms)"
    )
    for recipe, times in by_recipe.items():
        median = statistics.median(times) * 1000
        print(f"    {recipe} recipe answers                 {median:7.0f} ms median")
    print(f"  fsdpviz.analyze for the same options      {traced * 1000:7.0f} ms median")
    print(f"  ratio analyze / answer                    {traced / answer:7.1f}x")
    print(f"  world size from a profiled report (replay) {replayed * 1000:6.0f} ms")


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="print every re-plan")
    args = parser.parse_args()
    replan(args.repeats, args.verbose)
    if not args.skip_big:
        big(args.repeats)


if __name__ == "__main__":
    main()
