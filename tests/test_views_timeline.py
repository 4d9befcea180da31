"""Timeline data and figure: lane groups, issue order, the time model's places and waits, the
memory lane (one truth with ``report.memory``), recordings on their clock, comparisons.
Golden file ``tests/golden/views_timeline_small.json`` and the front end's test data in
``js/test/data/`` (``FSDPVIZ_UPDATE_GOLDEN=1`` rewrites them).
"""

from __future__ import annotations

import dataclasses

import pytest
from export_models import recorded, recorded_run
from views_models import (
    Block,
    Tiny,
    analyze_tiny,
    check_front_end_data,
    check_golden,
    figure_json,
    tiny_inputs,
)

import fsdpviz
from fsdpviz import Event, RecordedRun, Report
from fsdpviz.cost import machine, memory_lane, timeline
from fsdpviz.views import timeline_data, timeline_figure
from fsdpviz.views.timeline_lanes import MODELLED_CLOCK, STREAM_LANES, UNTIMED_CLOCK
from fsdpviz.views.timeline_view import cursor_x, opening_iteration


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


@pytest.fixture(scope="module")
def fsdp2() -> Report:
    return fsdpviz.analyze(Tiny(), tiny_inputs(), fully_shard=[Block], world_size=4, progress=False)


def synthetic_memory(n: int) -> list[float]:
    """A made-up series (bytes after each event): peaks at the middle event."""
    return [1000.0 + 10 * min(i, n - 1 - i) for i in range(n)]


def diverging_run() -> RecordedRun:
    """Two ranks of ``analyze_tiny``; rank 1 issues its last iteration's events 3 and 4 swapped."""
    base = analyze_tiny(world_size=2)
    r0, r1 = recorded(base, 0, 1000.0), recorded(base, 1, 1000.01)
    last = list(r1.iterations[-1])
    a, b = last[3], last[4]
    last[3], last[4] = dataclasses.replace(b, t=a.t), dataclasses.replace(a, t=b.t)
    r1 = dataclasses.replace(r1, iterations=[*r1.iterations[:-1], last])
    return RecordedRun([r0, r1], None, [])


def test_timeline_golden(report: Report) -> None:
    fig = timeline_figure(report, step=3, machine="h100")
    check_golden("views_timeline_small.json", figure_json(fig))


CPU_AHEAD = dataclasses.replace(machine("h100"), launch_forward_us=1.0, launch_backward_us=1.0)


def test_front_end_test_data_is_current(report: Report) -> None:
    """js/test/data holds what timeline_data gives today: the front end is tested on it."""
    cases = {
        # kernels issued at 1 µs each: the CPU runs ahead, so the two step orders differ
        "prediction.json": timeline_data(report, machine=CPU_AHEAD),
        "untimed.json": timeline_data(report, memory=None),
        "recording.json": timeline_data(diverging_run()),
    }
    for name, data in cases.items():
        check_front_end_data(name, data)


def test_a_prediction_without_a_machine_is_laid_out_by_index(report: Report) -> None:
    d = timeline_data(report, memory=None)
    events = report.iterations[-1]
    n = len(events)
    assert d["version"] == 2 and d["n_steps"] == n
    assert d["timed"] is False and d["clock"] == UNTIMED_CLOCK
    s = d["steps"]
    assert s["issue"] == s["x0"] == [float(i) for i in range(n)]
    assert s["x1"] == [float(i + 1) for i in range(n)]
    assert [d["kinds"][k] for k in s["kind"]] == [e.kind for e in events]
    assert [d["units"][u] for u in s["unit"]] == [e.unit for e in events]
    assert [lane["name"] for lane in d["lanes"]] == [
        "CPU · hooks",
        "compute",
        "all-gather",
        "reduce-scatter",
    ]
    assert d["memory"] == [] and d["marks"] == []
    # every event sits in its own lane: frees in the CPU lane, collectives on their stream
    lanes = [d["lanes"][k]["name"] for k in s["lane"]]
    for e, lane in zip(events, lanes, strict=True):
        want = "CPU · hooks" if e.kind == "free" else STREAM_LANES[(e.kind, e.group)]
        assert lane == want, (e, lane)
    # a hook call's events are in one call, in its order
    for i, e in enumerate(events):
        c = s["call"][i]
        assert d["hooks"][d["calls"]["hook"][c]] == e.hook
        assert d["units"][d["calls"]["unit"][c]] == e.hook_unit


def test_a_profiled_prediction_is_placed_by_the_time_model(report: Report) -> None:
    """Each event at its modelled start and end, issued when the CPU runs its hook; the
    steps in issue order never go back in time; stream order sorts by start."""
    events = report.iterations[-1]
    d = timeline_data(report, machine="a100")
    tl = timeline(report, "a100", iteration=-1)
    assert d["timed"] is True and d["clock"].startswith("modelled on A100")
    s = d["steps"]
    assert s["index"] == list(range(len(events)))
    by_index = {r["index"]: r for r in tl.events}
    assert s["x0"] == [by_index[i]["start"] for i in range(len(events))]
    assert s["x1"] == [by_index[i]["end"] for i in range(len(events))]
    assert s["issue"] == [by_index[i]["issued"] for i in range(len(events))]
    assert s["exposed"] == [by_index[i]["exposed"] for i in range(len(events))]
    assert s["issue"] == sorted(s["issue"])  # stepping in issue order never goes back
    starts = [s["x0"][i] for i in d["stream_order"]]
    assert starts == sorted(starts) and sorted(d["stream_order"]) == list(range(len(events)))
    # the CPU issues each event (its hook's cell) no later than it starts on its stream
    assert all(s["issue"][i] <= s["x0"][i] for i in range(len(events)))
    # compute: the time model's stretches, by the unit they belong to
    comp = d["compute"]
    assert list(zip(comp["x0"], comp["x1"], strict=True)) == [
        (c["start"], c["end"]) for c in tl.compute if c["owner"] in d["units"]
    ]
    # the waits are the exposed communication, by phase
    waits = d["waits"]
    total = {0: 0.0, 1: 0.0}
    for a, b, p in zip(waits["x0"], waits["x1"], waits["phase"], strict=True):
        total[p] += b - a
    exposed = d["groups"][0]["exposed"]
    assert total[0] == pytest.approx(tl.totals["exposed_forward_s"]) == exposed["forward"]
    assert total[1] == pytest.approx(tl.totals["exposed_backward_s"]) == exposed["backward"]
    assert exposed["total"] == pytest.approx(tl.totals["exposed_comm_s"])
    assert sum(total.values()) == pytest.approx(tl.totals["exposed_comm_s"])
    # a wait names the collective it waits for, which ends when the wait does
    for step, end, tail in zip(waits["step"], waits["x1"], waits["tail"], strict=True):
        assert s["kind"][step] != 1 and (tail or s["x1"][step] == pytest.approx(end))


def test_all_iterations_back_to_back(report: Report) -> None:
    d = timeline_data(report, None, machine="a100")
    n0, n1 = (len(it) for it in report.iterations)
    assert d["n_steps"] == n0 + n1
    first = timeline(report, "a100", iteration=0).totals["step_s"]
    assert d["iteration_starts"] == [[0.0, pytest.approx(first)]]
    assert d["steps"]["iteration"][n0] == 1
    assert d["steps"]["issue"] == sorted(d["steps"]["issue"])
    untimed = timeline_data(report, None, memory=None)
    assert untimed["iteration_starts"] == [[0.0, float(n0)]]


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
@pytest.mark.parametrize("profiled", [True, False])
def test_memory_lane_is_report_memory(
    report: Report, fsdp2: Report, api: str, profiled: bool
) -> None:
    """The lane's maximum, its marker and the peak's event are report.memory.peak, to the
    byte, with and without a trace profile, placed by the time model or by index."""
    base = report if api == "FSDP1" else fsdp2
    r = base if profiled else dataclasses.replace(base, profile=None)
    peak = r.memory.peak
    for on in ("h100", None):
        d = timeline_data(r, machine=on)
        (m,) = d["memory"]
        assert m["peak"]["bytes"] == peak["bytes"] == max(m["total"])
        k = m["peak"]["moment"]
        assert m["total"][k] == peak["bytes"] and m["where"][k] == peak["where"]
        sums = [sum(m["bytes"][c][j] for c in m["categories"]) for j in range(len(m["total"]))]
        assert sums == m["total"]
        step = m["peak"]["step"]
        assert d["steps"]["index"][step] == peak["event"]
        assert m["x0"][k] <= m["peak"]["x"] <= m["x1"][k]
        assert m["x0"] == sorted(m["x0"]) and all(
            a <= b for a, b in zip(m["x0"], m["x1"], strict=True)
        )
    lane = memory_lane(r)
    assert lane.peak["bytes"] == peak["bytes"] == max(lane.total)


def test_the_peak_inside_a_stretch_of_compute_is_drawn_over_that_stretch(report: Report) -> None:
    """The model's peak of the tiny plan is reached during a stretch of compute: the lane
    holds it over that stretch, not at an event."""
    d = timeline_data(report, machine="h100")
    (m,) = d["memory"]
    k = m["peak"]["moment"]
    assert m["where"][k].startswith("during the compute before")
    stretches = list(zip(d["compute"]["x0"], d["compute"]["x1"], strict=True))
    assert (m["x0"][k], m["x1"][k]) in stretches


def test_a_plain_series_is_one_category(report: Report) -> None:
    n = len(report.iterations[-1])
    series = synthetic_memory(n)
    d = timeline_data(report, memory=series)
    (m,) = d["memory"]
    assert m["categories"] == ["memory"] and m["total"] == series
    assert m["peak"]["bytes"] == max(series) and m["peak"]["step"] == series.index(max(series))
    with pytest.raises(ValueError, match="one value \\(bytes\\) per event"):
        timeline_data(report, memory=series[:-1])
    called = timeline_data(report, memory=lambda r: [1.0] * len(r.iterations[-1]))
    assert called["memory"][0]["total"] == [1.0] * n


def test_a_recording_is_on_its_clock_and_its_divergence_marked() -> None:
    run = diverging_run()
    d = timeline_data(run)
    assert d["source"] == "recording" and d["timed"] and d["clock"] == "recorded"
    assert [g["name"] for g in d["groups"]] == ["rank 0", "rank 1"]
    s = d["steps"]
    # rank 1 started 10 ms later: its events are 10 ms later on the shared clock
    first = {g: next(i for i in range(d["n_steps"]) if s["group"][i] == g) for g in (0, 1)}
    t0 = run.ranks[0].iterations[-1][0].t
    t1 = run.ranks[1].iterations[-1][0].t
    assert s["issue"][first[0]] == pytest.approx(t0)
    assert s["issue"][first[1]] == pytest.approx(0.01 + t1)
    assert s["issue"] == sorted(s["issue"])
    div = run.divergence()
    assert div is not None
    marked = {
        (s["group"][m["step"]], s["iteration"][m["step"]], s["index"][m["step"]])
        for m in d["marks"]
    }
    assert marked == {(0, div.iteration, div.index), (1, div.iteration, div.index)}
    # memory for the first rank only (parameters, gradients, optimizer: no profile)
    assert [m["group"] for m in d["memory"]] == [0]
    assert d["memory"][0]["peak"]["bytes"] == run.ranks[0].memory.peak["bytes"]


def test_a_comparison_draws_both_plans_units_matched(report: Report, fsdp2: Report) -> None:
    cmp = fsdpviz.compare(report, fsdp2)
    d = timeline_data(cmp, machine="h100")
    assert d["source"] == "comparison" and len(d["groups"]) == 2
    n_a = len(report.units)
    pairs = {p.b: p.a for p in cmp.pairs if p.a is not None and p.b is not None}
    for i, name in enumerate(d["units"][n_a:], start=n_a):
        twin = pairs.get(name)
        if twin is not None:
            j = d["units"].index(twin)
            assert d["unit_numbers"][i] == d["unit_numbers"][j]
            assert d["colors"][i] == d["colors"][j]
    assert [m["group"] for m in d["memory"]] == [0, 1]
    assert d["memory"][1]["peak"]["bytes"] == fsdp2.memory.peak["bytes"]
    # a plan that differs: prefetch off in the second; the first difference marked on both
    other = fsdpviz.analyze(Tiny(), tiny_inputs(), world_size=4, progress=False,
                            auto_wrap_policy=__import__("torch").distributed.fsdp.wrap.ModuleWrapPolicy({Block}),
                            backward_prefetch=None)  # fmt: skip
    d2 = timeline_data(fsdpviz.compare(report, other))
    marks = d2["marks"]
    assert len(marks) == 2 and {d2["steps"]["group"][m["step"]] for m in marks} == {0, 1}
    (i,) = {d2["steps"]["index"][m["step"]] for m in marks}
    ea, eb = report.iterations[-1], other.iterations[-1]
    assert all(a.untimed() == b.untimed() for a, b in zip(ea[:i], eb[:i], strict=True))
    assert ea[i].untimed() != eb[i].untimed()


def test_offload_copies_get_their_own_lane() -> None:
    from torch.distributed.fsdp import CPUOffload
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    r = analyze_tiny(cpu_offload=CPUOffload(offload_params=True))
    d = timeline_data(r, machine="h100")
    names = [lane["name"] for lane in d["lanes"]]
    assert "host-device copies" in names
    s = d["steps"]
    copies = [i for i in range(d["n_steps"]) if d["kinds"][s["kind"][i]] in ("h2d", "d2h")]
    assert copies and {names[s["lane"][i]] for i in copies} == {"host-device copies"}
    del ModuleWrapPolicy


def test_no_shard_casts_get_their_own_lane() -> None:
    """``NO_SHARD`` with bf16 parameters: each unshard's ``cast`` (its low-precision copy of
    the parameters, on the copy stream) on a lane of its own, drawn only where casts occur;
    the reshard's ``free`` of the copy in the CPU lane, as every free."""
    import torch
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

    r = analyze_tiny(
        sharding_strategy=ShardingStrategy.NO_SHARD,
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16),
    )
    d = timeline_data(r, machine="h100")
    names = [lane["name"] for lane in d["lanes"]]
    s = d["steps"]
    kinds = [d["kinds"][k] for k in s["kind"]]
    casts = [i for i, k in enumerate(kinds) if k == "cast"]
    frees = [i for i, k in enumerate(kinds) if k == "free"]
    assert casts and len(casts) == len(frees)
    assert {names[s["lane"][i]] for i in casts} == {"parameter casts"}
    assert {names[s["lane"][i]] for i in frees} == {"CPU · hooks"}
    assert all(s["x1"][i] > s["x0"][i] for i in casts)
    plain = timeline_data(analyze_tiny(), machine="h100")
    assert "parameter casts" not in [lane["name"] for lane in plain["lanes"]]


def test_several_reports_are_groups(report: Report) -> None:
    d = timeline_data([report, report], rank_names=["rank 0", "rank 3"], memory=None)
    n = len(report.iterations[-1])
    assert d["n_steps"] == 2 * n and [g["name"] for g in d["groups"]] == ["rank 0", "rank 3"]
    assert d["steps"]["group"][:4] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="2 rank names for 1 reports"):
        timeline_data(report, rank_names=["a", "b"])
    with pytest.raises(TypeError, match="takes reports, a RecordedRun or a Comparison"):
        timeline_data(["not a report"])  # type: ignore[list-item]


def test_event_describe_names_the_root() -> None:
    e = Event(kind="free", unit="", phase="forward", hook="post_forward", hook_unit="")
    assert e.describe() == "free (root) (post_forward of (root))"


def test_figure_draws_lanes_memory_and_peak(report: Report) -> None:
    fig = timeline_figure(report, machine="h100")
    names = {t.name for t in fig.data}
    assert {"compute (forward solid, backward pale)", "peak", "issued by a hook (CPU)"} <= names
    peak = next(t for t in fig.data if t.name == "peak")
    assert peak.y[0] == report.memory.peak["bytes"]
    assert fig.layout.xaxis2.title.text.startswith("time (µs), modelled on H100")
    stacked = [t for t in fig.data if getattr(t, "stackgroup", None)]
    assert {t.name for t in stacked} >= {"sharded params", "optimizer"}
    multi = timeline_figure(recorded_run(), memory=None)
    assert len(multi.layout.yaxis.categoryarray) == 8  # 4 lanes per rank


def test_the_cpu_runs_ahead_and_the_memory_lane_stays_on_the_compute_stream() -> None:
    """On a GPU-bound FSDP2 plan the CPU issues the hooks well ahead of the compute: every
    step is issued no later than it starts, the hook cells come in time order, and the memory
    lane's moments stay in the compute stream's order (never drawn back in time)."""
    from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model

    cfg = ExampleConfig(hidden_size=1024, intermediate_size=2816, num_layers=6, num_heads=8)
    ids = example_inputs(cfg, batch=4, seq=256)
    r = fsdpviz.analyze(example_model(cfg), ids, world_size=64, fully_shard=[DecoderLayer])
    d = timeline_data(r, machine="h100")
    s, n = d["steps"], d["n_steps"]
    assert all(s["issue"][i] <= s["x0"][i] for i in range(n))
    assert d["calls"]["x"] == sorted(d["calls"]["x"])
    # the CPU is through the forward's hooks while the compute is still in its first layers
    forward = [i for i in range(n) if s["phase"][i] == 0]
    assert max(s["issue"][i] for i in forward) < max(s["x0"][i] for i in forward) / 2
    (m,) = d["memory"]
    assert m["x0"] == sorted(m["x0"]) and all(a <= b for a, b in zip(m["x0"], m["x1"], strict=True))


def test_the_memory_lane_says_whether_it_fits_as_report_memory(report: Report) -> None:
    """The capacity line's numbers are report.memory's, on the report's own machine by
    default; another machine's memory where the view is timed on another."""
    d = timeline_data(report, machine="auto")
    cap = d["memory"][0]["capacity"]
    mem = report.memory
    assert cap["machine"] == mem.machine == "H100 SXM 80GB"
    assert (cap["bytes"], cap["usable"], cap["overhead"]) == (
        mem.capacity,
        mem.usable,
        mem.overhead,
    )
    assert cap["reserved"] == mem.reserved["bytes"] and cap["needed"] == mem.needed
    assert cap["fits"] is mem.fits is True and cap["headroom"] == mem.headroom
    assert cap["text"] == mem.fit_text()
    assert cap["label"] == f"H100 SXM 80GB: {fsdpviz.schema.memory.size_text(mem.usable)} usable"
    other = timeline_data(report, machine="a100-40gb")["memory"][0]["capacity"]
    assert other["machine"] == machine("a100-40gb").name
    assert other["bytes"] == int(machine("a100-40gb").memory_gib * 2**30)
    assert other["text"].startswith(f"fits in {other['machine']}")
    # a caller's series is not the memory model's: no capacity drawn against it
    n = len(report.iterations[-1])
    assert timeline_data(report, memory=synthetic_memory(n))["memory"][0]["capacity"] is None


def test_a_plan_that_does_not_fit_is_over_its_line() -> None:
    tight = dataclasses.replace(machine("h100"), name="tiny GPU", memory_gib=1.5 + 2**11 / 2**30)
    report = analyze_tiny(machine=tight)
    assert not report.memory.fits
    cap = timeline_data(report, machine="auto")["memory"][0]["capacity"]
    # 2 KiB left once the CUDA context and NCCL take theirs: less than the 3.3 KiB peak
    assert cap["fits"] is False and cap["usable"] == 2**11 < cap["peak"] <= cap["needed"]
    assert cap["text"].startswith("does not fit in tiny GPU")
    fig = timeline_figure(report, machine="auto")
    line = next(t for t in fig.data if t.name.startswith("capacity: tiny GPU"))
    assert line.y[0] == cap["usable"] or "off scale" in line.text[1]
    assert "does not fit" in line.text[1]


def test_views_default_to_the_machine_the_report_was_planned_for() -> None:
    report = analyze_tiny(machine="a100-40gb")
    name = machine("a100-40gb").name
    assert timeline_data(report, machine="auto")["clock"] == MODELLED_CLOCK.format(machine=name)
    from fsdpviz.export import chrome_trace
    from fsdpviz.widgets import TimelineWidget

    assert TimelineWidget(report).data["clock"] == MODELLED_CLOCK.format(machine=name)
    assert chrome_trace(report)["otherData"]["machine"] == "a100-40gb"  # as it was named
    assert TimelineWidget(report, machine="h100").data["memory"][0]["capacity"]["machine"] == (
        machine("h100").name
    )


def test_the_bottlenecks_beside_the_timeline_are_report_timeline_s(report: Report) -> None:
    """Each group's waits, ranked as report.timeline.bottlenecks() ranks them, each naming
    the step of the event waited for; they add up to the exposed communication."""
    d = timeline_data(report, machine="auto")
    rows = d["groups"][0]["bottlenecks"]
    want = report.timeline.bottlenecks()
    assert [(b["kind"], b["unit"], b["exposed"], b["reason"]) for b in rows] == [
        (w["kind"], d["units"].index(w["unit"]), w["exposed_s"], w["reason"]) for w in want
    ]
    s = d["steps"]
    for b, w in zip(rows, want, strict=True):
        assert s["index"][b["step"]] == w["event"] and s["exposed"][b["step"]] == w["exposed_s"]
    assert sum(b["exposed"] for b in rows) == pytest.approx(
        report.timeline.totals["exposed_comm_s"], rel=1e-12
    )
    assert timeline_data(report, memory=None)["groups"][0]["bottlenecks"] is None


def test_compute_carries_its_flops_and_rate(report: Report) -> None:
    d = timeline_data(report, machine="auto")
    c = d["compute"]
    tl = report.timeline
    assert c["flops"] and all(f >= 0 for f in c["flops"])
    by_span = {(x["start"], x["end"]): x for x in tl.compute}
    for x0, x1, f, r in zip(c["x0"], c["x1"], c["flops"], c["flops_per_s"], strict=True):
        src = by_span[(x0, x1)]
        assert (f, r) == (src["flops"], src["flops_per_s"])
    assert set(timeline_data(report, memory=None)["compute"]["flops"]) == {-1.0}


def test_the_cursor_stands_where_each_event_starts_on_its_own_lane(report: Report) -> None:
    d = timeline_data(report, machine=CPU_AHEAD)
    s = d["steps"]
    own = [cursor_x(d, i) for i in range(d["n_steps"])]
    for i in range(d["n_steps"]):
        assert own[i] == (s["issue"][i] if d["kinds"][s["kind"][i]] == "free" else s["x0"][i])
    assert [own[i] for i in d["stream_order"]] == sorted(own)


def test_a_recording_opens_on_its_first_divergent_iteration() -> None:
    base = analyze_tiny(world_size=2)
    r0, r1 = recorded(base, 0, 1000.0), recorded(base, 1, 1000.01)
    first = list(r1.iterations[0])
    first[3], first[4] = (
        dataclasses.replace(first[4], t=first[3].t),
        dataclasses.replace(first[3], t=first[4].t),
    )
    run = RecordedRun(
        [r0, dataclasses.replace(r1, iterations=[first, *r1.iterations[1:]])], None, []
    )
    assert len(run.ranks[0].iterations) > 1
    assert opening_iteration(run) == 0 and opening_iteration(run, -1) == -1
    assert opening_iteration(base) == -1
    d = timeline_data(run, opening_iteration(run))
    s = d["steps"]
    assert {s["iteration"][m["step"]] for m in d["marks"]} == {0}
    assert {s["group"][m["step"]] for m in d["marks"]} == {0, 1}  # on every rank
    assert {m["kind"] for m in d["marks"]} == {"diverge"}
    from fsdpviz.widgets import Dashboard

    view = Dashboard(run.ranks[0], ranks=run)
    assert view.iteration == 0 and len(view.timeline.data["marks"]) == 2


def test_the_tail_s_wait_is_the_step_s_end_s_in_every_hover(report: Report) -> None:
    """The last reduce-scatter's wait is the step's end's: the figure's hover says so, and
    never that the compute waited for it."""
    d = timeline_data(report, machine="auto")
    w = d["waits"]
    tails = [k for k, t in enumerate(w["tail"]) if t]
    assert tails
    fig = timeline_figure(report, machine="auto", data=d)
    waits = next(t for t in fig.data if t.name == "compute waiting for communication (exposed)")
    for k in tails:
        assert waits.hovertext[k].startswith("the step's end waits ")
    events = [t for t in fig.data if t.hovertext and t.name == "collective"]
    step = w["step"][tails[0]]
    text = next(h for t in events for h in t.hovertext if h.startswith(f"step {step}:"))
    assert "the step's end waited" in text and "compute waited" not in text


def test_float8_scales_all_reduce_gets_its_own_lane_after_the_optimizer_step() -> None:
    """FSDP2's float8 all-gather with ``precompute_float8_dynamic_scale_for_fsdp``: each
    weight's amax all-reduce of the first step (torchao's ``fsdp_pre_all_gather``, in FSDP2's
    ``foreach_all_gather`` on its copy-in stream) on the all-gather lane; the precomputation's
    (DTensor's, after the optimizer step, on the compute stream) on a lane of its own, placed
    where the time model places it: after the optimizer step, the step's last."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model

    scales_lane = "float8 scales all-reduce"  # (timeline_lanes.FLOAT8_SCALES)
    config = ExampleConfig(hidden_size=256, intermediate_size=768, num_layers=2, num_heads=4)
    spec = {"enable_fsdp_float8_all_gather": True, "filter_fqns": ["lm_head"],
            "precompute_float8_dynamic_scale_for_fsdp": True}  # fmt: skip
    r = fsdpviz.analyze(
        example_model(config), example_inputs(config, batch=2, seq=64), world_size=8,
        fully_shard=[DecoderLayer], float8=spec, progress=False,
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16),
    )  # fmt: skip
    d = timeline_data(r, None, machine="h100")
    names = [lane["name"] for lane in d["lanes"]]
    assert names.index("reduce-scatter") < names.index(scales_lane)
    s = d["steps"]
    shard = [i for i in range(d["n_steps"]) if d["kinds"][s["kind"][i]] == "all_reduce"]
    lanes = [names[s["lane"][i]] for i in shard]
    per_weight = [i for i, lane in zip(shard, lanes, strict=True) if lane == "all-gather"]
    scales = [i for i, lane in zip(shard, lanes, strict=True) if lane == scales_lane]
    assert set(lanes) == {"all-gather", scales_lane}
    # the first step's all-gathers (the 2 blocks', forward and backward) reduce their 7
    # weights' amaxes; every step precomputes once
    assert len(per_weight) == 7 * 2 * 2 and len(scales) == len(r.iterations)
    for it, i in enumerate(scales):
        tl = timeline(r, "h100", iteration=it)
        (pre,) = [e for e in tl.events if e.group == "shard" and e.module is None]
        start = d["iteration_starts"][0][it]
        assert s["x0"][i] == pytest.approx(start + pre.start)
        assert s["x1"][i] == pytest.approx(start + pre.end)
        # on the compute lane: the optimizer step from the micro-step's end, for exactly
        # optimizer_s; torchao's norms up to the all-reduce, its clamp from its end to the
        # step's end (the time model's numbers, placed)
        w = d["step_work"]
        mine = [k for k in range(len(w["name"])) if w["x0"][k] >= start - 1e-12][:3]
        mine = [k for k in mine if start + tl.totals["step_s"] >= w["x1"][k] - 1e-12]
        assert [w["name"][k] for k in mine] == ["optimizer", "float8_amax", "float8_scales"]
        opt, amax, clamp = mine
        assert w["x0"][opt] == pytest.approx(start + tl.totals["micro_step_s"])
        assert w["x1"][opt] - w["x0"][opt] == pytest.approx(tl.totals["optimizer_s"])
        assert w["x1"][opt] == pytest.approx(w["x0"][amax])
        assert w["x1"][amax] == pytest.approx(s["x0"][i])
        assert w["x0"][clamp] == pytest.approx(s["x1"][i])
        assert w["x1"][clamp] == pytest.approx(start + tl.totals["step_s"])
        for k, work in zip(mine, tl.step_work, strict=True):
            assert w["x1"][k] - w["x0"][k] == pytest.approx(work.end - work.start)
            assert w["bytes"][k] == work.bytes and w["text"][k] == work.text


def test_the_front_end_names_the_float8_scales_lane_as_the_data_does() -> None:
    """The front end says the float8 scales' all-reduce runs after the optimizer step by its
    lane's name (``FLOAT8_SCALES_LANE`` in ``js/src/timeline_data.ts``): the data's."""
    from pathlib import Path

    from fsdpviz.views.timeline_lanes import FLOAT8_SCALES

    source = Path(__file__).parents[1] / "js" / "src" / "timeline_data.ts"
    assert f'export const FLOAT8_SCALES_LANE = "{FLOAT8_SCALES}";' in source.read_text()


def test_the_tensor_parallel_half_of_the_float8_scales_all_reduce_has_a_lane() -> None:
    """Under tensor parallelism the precomputation all-reduces the amaxes over the tp ranks
    too (group ``tp``, as every tensor-parallel collective): on the tensor parallel lane, and
    the timeline draws (it raised "no lane for tp_all_reduce")."""
    from test_cost_compile_float8 import _tensor_parallel_precomputed

    d = timeline_data(_tensor_parallel_precomputed(), machine="h100")
    names = [lane["name"] for lane in d["lanes"]]
    s = d["steps"]
    last = [(d["kinds"][s["kind"][i]], names[s["lane"][i]]) for i in range(d["n_steps"])][-2:]
    assert last == [
        ("all_reduce", "float8 scales all-reduce"),
        ("tp_all_reduce", "tensor parallel"),
    ]
