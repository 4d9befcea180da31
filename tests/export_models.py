"""Reports and recorded runs shared by the export tests."""

from __future__ import annotations

from dataclasses import replace

from views_models import analyze_tiny

from fsdpviz import RecordedRun, Report


def recorded(report: Report, rank: int, started: float, step: float = 0.004) -> Report:
    """``report``'s schedule as rank ``rank`` would record it: times, durations, no modules."""
    iterations = []
    t = 0.05 + 0.001 * rank
    for it in report.iterations:
        events = []
        for e in it:
            events.append(replace(e, t=round(t, 6), duration=None if e.kind == "free" else 0.002))
            t += step
        iterations.append(events)
        t += 0.02
    config = {
        "api": report.config.get("api"),
        "world_size": 2,
        "rank": rank,
        "backend": "gloo",
        "started_unix": started,
        "complete_iterations": len(iterations),
    }
    return Report(
        source="recording",
        config=config,
        units=report.units,
        forward_order=report.forward_order,
        iterations=iterations,
    )


def recorded_run() -> RecordedRun:
    """Two ranks of ``analyze_tiny``'s schedule; rank 1 started recording 10 ms later."""
    base = analyze_tiny(world_size=2)
    return RecordedRun([recorded(base, 0, 1000.0), recorded(base, 1, 1000.01)], None, [])


def report_49_units() -> Report:
    """The bundled example with 48 decoder layers, small: 49 wrap units, profiled."""
    from fsdpviz.examples import ExampleConfig, example_analysis

    config = ExampleConfig(
        num_layers=48, vocab_size=256, hidden_size=64, intermediate_size=128, num_heads=2
    )
    return example_analysis(config=config, progress=False)
