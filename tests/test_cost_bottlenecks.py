"""Why is it slow: the waits of a step ranked by exposed time, each with its reason."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from torch.distributed.fsdp import BackwardPrefetch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost import Timeline, machine, timeline
from fsdpviz.examples import (
    DecoderLayer,
    ExampleConfig,
    example_analysis,
    example_inputs,
    example_model,
)
from fsdpviz.schema.report import unit_label
from fsdpviz.schema.rows import ComputeStretch, TimedEvent, Wait

# Comparable compute and communication: 16 ranks across two nodes of 100 Gb/s RoCE.
CONFIG = ExampleConfig(hidden_size=1024, intermediate_size=2816, num_layers=6, num_heads=8)
SLOW = machine("h100", network="roce-100")
CAUSES = {
    "first", "not_prefetched", "rate_limited", "queued", "copy_out", "cpu_offload",
    "short_window", "tensor_parallel", "tail",
}  # fmt: skip
PLANS: dict[str, dict[str, Any]] = {
    "fsdp1 BACKWARD_PRE": {"auto_wrap_policy": ModuleWrapPolicy({DecoderLayer})},
    "fsdp1 BACKWARD_POST": {
        "auto_wrap_policy": ModuleWrapPolicy({DecoderLayer}),
        "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
    },
    "fsdp1 no prefetch": {
        "auto_wrap_policy": ModuleWrapPolicy({DecoderLayer}),
        "backward_prefetch": None,
    },
    "fsdp2": {"fully_shard": [DecoderLayer]},
    "fsdp2 kept": {"fully_shard": [DecoderLayer], "reshard_after_forward": False},
}


@pytest.fixture(scope="module", params=list(PLANS))
def plan(request: pytest.FixtureRequest) -> tuple[str, fsdpviz.Report, Timeline]:
    ids = example_inputs(CONFIG, batch=4, seq=256)
    report = fsdpviz.analyze(example_model(CONFIG), ids, world_size=16, **PLANS[request.param])
    return request.param, report, timeline(report, SLOW)


def test_bottlenecks_are_ranked_and_sum_to_the_exposed_communication(
    plan: tuple[str, fsdpviz.Report, Timeline],
) -> None:
    name, report, tl = plan
    rows = tl.bottlenecks()
    assert len(rows) >= 3, name
    exposed = [b["exposed_s"] for b in rows]
    assert all(e > 0 for e in exposed) and exposed == sorted(exposed, reverse=True)
    assert sum(exposed) == tl.totals["exposed_comm_s"]  # exactly, in this order
    assert math.isclose(sum(b["share"] for b in rows), 1.0)
    # one row per event the compute waited for, and each its events' own exposure
    by_event = {r["index"]: r for r in tl.events}
    assert sorted(b["event"] for b in rows) == sorted(
        r["index"] for r in tl.events if r["exposed"] > 0
    )
    events = report.iterations[-1]
    for b in rows:
        rec = by_event[b["event"]]
        waited = sum(w["end"] - w["start"] for w in tl.waits if w["event"] == b["event"])
        assert math.isclose(rec["exposed"], waited, rel_tol=1e-9)
        assert (b["unit"], b["kind"], b["phase"]) == (rec["unit"], rec["kind"], rec["phase"])
        e = events[b["event"]]
        assert (b["hook"], b["hook_unit"], b["prefetch"]) == (e.hook, e.hook_unit, e.prefetch)
        assert b["cause"] in CAUSES and b["duration_s"] == b["end"] - b["start"]
        assert b["reason"] and b["reason"][0].islower() and not b["reason"].endswith(".")
    json.dumps(rows)
    # the step ends waiting for its last reduce-scatter: one tail row, and it is exposed
    [tail] = [b for b in rows if b["tail_s"] > 0]
    assert tail["cause"] == "tail" and tail["kind"] == "reduce_scatter"
    assert tail["reason"].startswith("the step's tail: the final callback waits ")
    last = max((r for r in tl.events if r["stream"] == "comm"), key=lambda r: r["end"])
    assert tail["event"] == last["index"] and last["exposed"] >= tail["tail_s"] > 0
    [wait] = [w for w in tl.waits if w["tail"]]
    assert tail["tail_s"] == wait["end"] - wait["start"]
    assert wait["end"] == last["end"] == tl.totals["micro_step_s"]  # the step ends with it
    # the first all-gather has nothing before it to hide it
    first = next(b for b in rows if b["event"] == 0)
    assert first["cause"] == "first" and "the step's first all_gather" in first["reason"]


def test_the_reasons_name_what_held_each_collective(
    plan: tuple[str, fsdpviz.Report, Timeline],
) -> None:
    name, _, tl = plan
    rows = tl.bottlenecks()
    by_event = {r["index"]: r for r in tl.events}
    for b in rows:
        rec = by_event[b["event"]]
        if b["cause"] == "queued":
            ahead = by_event[rec["held_by"]]
            assert rec["held"] == "stream" and ahead["end"] == rec["start"]
            assert f"queued behind {ahead['kind']} {unit_label(ahead['unit'])}" in b["reason"]
        if b["cause"] == "copy_out":
            assert name.startswith("fsdp2") and "copied out" in b["reason"]
        if b["prefetch"]:
            assert f"prefetched by {b['hook']} of {unit_label(b['hook_unit'])}" in b["reason"]
    if name == "fsdp1 no prefetch":
        backward = [b for b in rows if b["phase"] == "backward" and b["kind"] == "all_gather"]
        assert backward and all("not prefetched" in b["reason"] for b in backward)
        assert any("backward prefetch (FSDP1 BACKWARD_PRE" in b["reason"] for b in backward)
    table = tl.bottleneck_table(limit=2).splitlines()
    assert table[0].startswith("exposed communication ") and len(table) == 2 + 2 + 1
    assert table[-1].startswith(f"… {len(rows) - 2} more wait(s)")


def test_each_compute_stretch_states_its_rate() -> None:
    tl = timeline(example_analysis(world_size=8))
    peak = machine("h100").peak_flops("float32")
    assert tl.compute
    for c in tl.compute:
        assert c["duration"] == c["end"] - c["start"] > 0
        assert c["flops_per_s"] == c["flops"] / c["duration"]
        assert c["peak_share"] == c["flops_per_s"] / peak and c["peak_share"] < 1


def test_the_end_of_step_reduce_scatter_reads_the_same_everywhere() -> None:
    """The tail's wait is its reduce-scatter's exposed time: the wait mark ("compute waits
    34.8 µs for reduce_scatter (root)") and the event ("compute waited 34.8 µs for it")
    agree, in the time model and in the data the timeline view draws."""
    from fsdpviz.views.timeline_view import timeline_data

    report = example_analysis(world_size=8)
    tl = report.timeline
    [wait] = [w for w in tl.waits if w["tail"]]
    rec = next(r for r in tl.events if r["index"] == wait["event"])
    assert rec["kind"] == "reduce_scatter" and rec["unit"] == ""
    assert math.isclose(rec["exposed"], wait["end"] - wait["start"], rel_tol=1e-12)
    assert f"{rec['exposed'] * 1e6:.1f}" == "34.8"
    data = timeline_data(report, machine="h100")
    steps, waits = data["steps"], data["waits"]
    k = waits["tail"].index(1)
    step = waits["step"][k]
    assert math.isclose(steps["exposed"][step], waits["x1"][k] - waits["x0"][k], rel_tol=1e-9)


def _timeline(events: list[dict[str, Any]], waits: list[dict[str, Any]]) -> Timeline:
    base = {
        "stream": "comm", "bytes": 0.0, "compute_t": 0.0, "hook": "pre_forward",
        "hook_unit": "", "prefetch": False, "rate_limited_s": 0.0, "held": "", "held_by": -1,
        "module": None, "phase": "forward",
    }  # fmt: skip
    records = [TimedEvent.from_dict({**base, **e}) for e in events]
    exposed = sum(sorted((r.exposed for r in records if r.exposed > 0), reverse=True))
    compute = [ComputeStretch("pre_forward", "", 0, 0.0, 1e-3, 0.0, "forward", "", 0)]
    totals = {"exposed_comm_s": exposed, "step_s": 1e-2}
    rows = [Wait.from_dict(w) for w in waits]
    return Timeline({"name": "test"}, records, compute, totals, waits=rows)


def _wait(event: int, start: float, end: float, tail: bool = False) -> dict[str, Any]:
    return {"event": event, "start": start, "end": end, "phase": "forward", "tail": tail}


def test_each_cause_in_words() -> None:
    """Causes real plans of the example model rarely show, on a hand-made timeline."""
    free = {"index": 0, "kind": "free", "unit": "a", "stream": "compute", "issued": 0.0,
            "start": 1e-3, "end": 1e-3, "exposed": 0.0}  # fmt: skip
    events = [
        free,
        # FSDP1's rate limiter held the CPU until the free of 'a'
        {"index": 1, "kind": "all_gather", "unit": "b", "hook_unit": "a", "prefetch": True,
         "issued": 1e-3, "start": 1e-3, "end": 3e-3, "exposed": 1.5e-3,
         "rate_limited_s": 8e-4, "held": "rate_limiter", "held_by": 0},
        # FSDP2: waited for the copy-out of 'b'
        {"index": 2, "kind": "all_gather", "unit": "c", "hook_unit": "b", "prefetch": True,
         "issued": 2e-3, "start": 3.5e-3, "end": 5e-3, "exposed": 1e-3, "held": "copy_out",
         "held_by": 1},
        # prefetched, with too little compute ahead
        {"index": 3, "kind": "all_gather", "unit": "d", "hook_unit": "c", "prefetch": True,
         "hook": "post_backward", "phase": "backward", "issued": 5e-3, "start": 5e-3,
         "end": 7e-3, "exposed": 5e-4},
        # not prefetched at all
        {"index": 4, "kind": "all_gather", "unit": "e", "hook_unit": "e", "issued": 7e-3,
         "start": 7e-3, "end": 8e-3, "exposed": 9e-4, "phase": "backward",
         "hook": "pre_backward"},
        # tensor parallelism's collective
        {"index": 5, "kind": "tp_all_reduce", "unit": "e", "hook_unit": "e", "stream": "tp",
         "module": "e.proj", "issued": 8e-3, "start": 8e-3, "end": 8.2e-3, "exposed": 2e-4},
        # CPU offload: its shard's copy first
        {"index": 6, "kind": "all_gather", "unit": "f", "hook_unit": "e", "prefetch": True,
         "issued": 8e-3, "start": 9e-3, "end": 9.5e-3, "exposed": 1e-4, "held": "h2d",
         "held_by": 0},
    ]  # fmt: skip
    waits = [
        _wait(1, 1.5e-3, 3e-3),
        _wait(2, 4e-3, 5e-3),
        _wait(3, 6.5e-3, 7e-3),
        _wait(4, 7.1e-3, 8e-3),
        _wait(5, 8e-3, 8.2e-3),
        _wait(6, 9.4e-3, 9.5e-3),
    ]
    rows = {b["event"]: b for b in _timeline(events, waits).bottlenecks()}
    assert rows[1]["cause"] == "rate_limited"
    assert rows[1]["reason"].startswith(
        "rate-limited: FSDP1's limit_all_gathers (at most two all-gathers in flight) held the "
        "CPU 800 µs until free 'a' ran, so pre_forward of 'a' issued it only 500 µs before its "
        "compute needed it; it took 2 ms"
    )
    assert rows[2]["cause"] == "copy_out"
    assert (
        "started 1.5 ms after its issue, once all_gather 'b' was copied out" in (rows[2]["reason"])
    )
    assert rows[3]["cause"] == "short_window"
    assert rows[3]["reason"] == (
        "prefetched by post_backward of 'c' (BACKWARD_POST: after that unit's backward; "
        "BACKWARD_PRE issues it earlier) 1.5 ms before its compute needed it, and it takes "
        "2 ms: communication longer than the compute that hides it"
    )
    assert rows[4]["cause"] == "not_prefetched"
    assert rows[4]["reason"].startswith(
        "not prefetched, pre_backward of 'e' issued it when its compute needed it (100 µs "
        "before), so nothing hides its 1 ms; backward prefetch (FSDP1 BACKWARD_PRE"
    )
    assert rows[5]["cause"] == "tensor_parallel"
    assert "tensor parallelism's all_reduce of 'e.proj' in 'e'" in rows[5]["reason"]
    assert rows[6]["cause"] == "cpu_offload"
    assert rows[6]["reason"].startswith("waited 1 ms for its shard's copy from host memory")


def test_a_step_without_waits() -> None:
    tl = _timeline([], [])
    assert tl.bottlenecks() == []
    assert tl.bottleneck_table().endswith(": the compute never waits for communication")
