"""Timeline data and figure: lanes, uniform spacing for predictions, recorded times when events
carry ``t``, several ranks, and the memory hook with its peak. Golden file
``tests/golden/views_timeline_small.json`` (``FSDPVIZ_UPDATE_GOLDEN=1`` rewrites it).
"""

from __future__ import annotations

import dataclasses

import pytest
from views_models import analyze_tiny, check_golden, figure_json

from fsdpviz import Event, Report
from fsdpviz.views import timeline_data, timeline_figure
from fsdpviz.views.timeline_steps import UNTIMED_LABEL, resolve_memory


@dataclasses.dataclass(frozen=True)
class TimedEvent(Event):
    """An event with a recorded time, whether or not ``Event`` has ``t`` yet."""

    t: float | None = None  # type: ignore[misc]


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


def synthetic_memory(n: int) -> list[float]:
    """A made-up series (the memory model is separate): peaks at the middle event."""
    return [1000.0 + 10 * min(i, n - 1 - i) for i in range(n)]


def test_timeline_golden(report: Report) -> None:
    n = len(report.iterations[-1])
    fig = timeline_figure(report, memory=synthetic_memory(n), step=3)
    check_golden("views_timeline_small.json", figure_json(fig))


def test_predictions_are_laid_out_by_index(report: Report) -> None:
    d = timeline_data(report)
    events = report.iterations[-1]
    assert d["n_steps"] == len(events)
    assert d["timed"] is False and d["x_label"] == UNTIMED_LABEL
    assert d["steps"]["x0"] == [float(i) for i in range(len(events))]
    assert d["steps"]["x1"] == [float(i + 1) for i in range(len(events))]
    kinds = [d["kinds"][k] for k in d["steps"]["kind"]]
    assert kinds == [e.kind for e in events]
    assert [d["units"][u] for u in d["steps"]["unit"]] == [e.unit for e in events]
    assert d["memory"] is None and d["peak_step"] is None


def test_predictions_are_placed_by_the_time_model(report: Report) -> None:
    """With a machine, a profiled prediction's events sit at the modelled times, steps keep
    FSDP's issue order, and the memory curve moves forward in time."""
    from fsdpviz.cost import machine, timeline

    events = report.iterations[-1]
    memory = synthetic_memory(len(events))
    d = timeline_data(report, memory=memory, machine="a100")
    tl = timeline(report, "a100", iteration=-1)
    assert d["timed"] is True and d["x_label"].startswith("time (s, modelled on A100")
    assert d["steps"]["index"] == list(range(len(events)))  # issue order
    assert [d["kinds"][k] for k in d["steps"]["kind"]] == [e.kind for e in events]
    by_index = {r["index"]: r for r in tl.events}
    assert d["steps"]["x0"] == [by_index[i]["start"] for i in range(len(events))]
    assert d["steps"]["x1"] == [by_index[i]["end"] for i in range(len(events))]
    assert max(d["steps"]["x1"]) <= tl.totals["step_s"]
    xs = d["memory"]["x"]
    assert xs == sorted(xs) and d["memory"]["bytes"] == memory
    assert d["peak_step"] == (len(events) - 1) // 2
    # the compute lane: the time model's stretches, coloured by the unit they belong to
    comp = d["compute"]
    assert list(zip(comp["x0"], comp["x1"], strict=True)) == [
        (c["start"], c["end"]) for c in tl.compute if c["owner"] in d["units"]
    ]
    owned = {(d["units"][u], p) for u, p in zip(comp["unit"], comp["phase"], strict=True)}
    assert {("blocks.0", 0), ("blocks.0", 1), ("", 0), ("", 1)} <= owned
    assert all(c["owner"] == c["unit"] for c in tl.compute if c["hook"] == "post_forward")
    # another machine, other times; all iterations back to back
    slower = timeline_data(report, machine=machine("a100", intra_node_latency_us=100.0))
    assert slower["steps"]["x1"][-1] > d["steps"]["x1"][-1]
    both = timeline_data(report, None, machine="a100")
    first = timeline(report, "a100", iteration=0).totals["step_s"]
    assert both["iteration_starts"] == [0.0, pytest.approx(first)]


def test_time_model_needs_a_profile_and_leaves_recordings_alone(report: Report) -> None:
    unprofiled = dataclasses.replace(report, profile=None)
    d = timeline_data(unprofiled, machine="h100")
    assert d["timed"] is False and d["x_label"] == UNTIMED_LABEL
    events = [
        TimedEvent(
            **{f.name: getattr(e, f.name) for f in dataclasses.fields(Event) if f.name != "t"},
            t=0.5 + 0.25 * i,
        )
        for i, e in enumerate(report.iterations[-1])
    ]
    rec = dataclasses.replace(report, source="recording", iterations=[events])
    assert timeline_data(rec, machine="h100")["x_label"] == "time (s, recorded)"


def test_all_iterations_concatenated(report: Report) -> None:
    d = timeline_data(report, None)
    n0, n1 = (len(it) for it in report.iterations)
    assert d["n_steps"] == n0 + n1
    assert d["iteration_starts"] == [0.0, float(n0)]
    assert d["steps"]["iteration"][n0] == 1


def test_compute_lane_follows_the_hooks(report: Report) -> None:
    c = timeline_data(report)["compute"]
    units = timeline_data(report)["units"]
    forward = [units[u] for u, p in zip(c["unit"], c["phase"], strict=True) if p == 0]
    assert forward == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert all(a < b for a, b in zip(c["x0"], c["x1"], strict=True))


def test_memory_series_and_peak(report: Report) -> None:
    n = len(report.iterations[-1])
    series = synthetic_memory(n)
    d = timeline_data(report, memory=series)
    assert d["memory"]["bytes"] == series
    assert d["peak_step"] == series.index(max(series))
    fig = timeline_figure(report, memory=series)
    peak = next(t for t in fig.data if t.name == "peak")
    assert peak.y[0] == max(series) and "peak" in peak.text[0]
    with pytest.raises(ValueError, match="one value \\(bytes\\) per event"):
        timeline_data(report, memory=series[:-1])


def test_memory_model_callable_is_called_with_the_report(report: Report) -> None:
    assert resolve_memory(lambda r: [1, 2] * len(r.units), report) == [1.0, 2.0] * 4
    assert resolve_memory(None, report) is None


def test_recorded_times_are_used(report: Report) -> None:
    events = [
        TimedEvent(
            **{f.name: getattr(e, f.name) for f in dataclasses.fields(Event) if f.name != "t"},
            t=0.5 + 0.25 * i,
        )
        for i, e in enumerate(report.iterations[-1])
    ]
    rec = dataclasses.replace(report, source="recording", iterations=[events])
    d = timeline_data(rec)
    assert d["timed"] is True and d["x_label"].startswith("time")
    assert d["steps"]["x0"][:3] == [0.5, 0.75, 1.0]
    assert d["steps"]["x1"][-1] == pytest.approx(d["steps"]["x0"][-1] + 0.25)


def test_recorded_durations_set_the_width(report: Report) -> None:
    @dataclasses.dataclass(frozen=True)
    class Lasting(TimedEvent):
        duration: float | None = None  # type: ignore[misc]

    base = report.iterations[-1][:3]
    events = [
        Lasting(kind=e.kind, unit=e.unit, phase=e.phase, t=float(i), duration=0.1 * (i + 1))
        for i, e in enumerate(base)
    ]
    d = timeline_data(dataclasses.replace(report, iterations=[events]))
    assert d["steps"]["x1"] == pytest.approx([0.1, 1.2, 2.3])


def test_several_ranks_interleave(report: Report) -> None:
    d = timeline_data([report, report], rank_names=["rank 0", "rank 3"])
    n = len(report.iterations[-1])
    assert d["n_steps"] == 2 * n and d["ranks"] == ["rank 0", "rank 3"]
    assert d["steps"]["rank"][:4] == [0, 1, 0, 1]
    fig = timeline_figure([report, report])
    assert len(fig.layout.yaxis.categoryarray) == 6  # 3 lanes per rank
    with pytest.raises(ValueError, match="2 rank names for 1 reports"):
        timeline_data(report, rank_names=["a", "b"])
