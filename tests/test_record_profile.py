"""``fsdpviz.load_profile`` on ``torch.profiler`` traces of real 2-rank FSDP1 runs.

The traces come from the same torchrun job as ``test_record_run`` (the run was
profiled and recorded at once), so the schedule rebuilt from FSDP's labels is
checked against the prediction and against the recorder, event for event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from record_harness import job, predict
from record_job import ITERATIONS, PROFILED, cases

import fsdpviz

WORLD_SIZE = 2


@pytest.fixture(scope="module")
def out() -> Path:
    modes = ",".join([*(f"case:{name}" for name in cases()), "gather"])
    return job(WORLD_SIZE, modes)


@pytest.mark.slow
@pytest.mark.parametrize("rank", range(WORLD_SIZE))
@pytest.mark.parametrize("name", list(PROFILED))
def test_profile_rebuilds_the_recorded_collectives(out: Path, name: str, rank: int) -> None:
    predicted = predict(name, WORLD_SIZE)
    prof = fsdpviz.load_profile(out / name / f"trace-rank{rank}.json", reference=predicted)
    assert prof.config["rank"] == rank and prof.config["world_size"] == WORLD_SIZE
    assert prof.config["kinds"] == ["all_gather", "reduce_scatter", "all_reduce"]
    result = fsdpviz.diff(prof, predicted)
    assert result.equal, str(result)
    recorded = fsdpviz.load(out / name)
    assert isinstance(recorded, fsdpviz.RecordedRun)
    offset = prof.config["iteration_offset"]
    for i, events in enumerate(prof.iterations):
        expected = [e.untimed() for e in recorded.rank(rank).iterations[offset + i]]
        assert [e.untimed() for e in events] == [e for e in expected if e.kind != "free"]
        ts = [e.t for e in events]
        assert ts == sorted(ts)
        assert all(e.duration is not None and e.duration > 0 for e in events)


@pytest.mark.slow
def test_profiler_steps_are_iterations(out: Path) -> None:
    plan = PROFILED["stack-post-fwd"]
    assert plan is not None
    wait, active = plan
    prof = fsdpviz.load_profile(out / "stack-post-fwd" / "trace-rank0.json")
    assert prof.config["iteration_offset"] == wait
    assert len(prof.iterations) == active == ITERATIONS - wait
    assert prof.config["unit_names"] == "unknown"
    first = prof.iterations[0][0]
    assert (first.kind, first.unit, first.hook, first.phase) == (
        "all_gather",
        "?",
        "pre_forward",
        "forward",
    )


@pytest.mark.slow
def test_root_forwards_split_iterations_without_profiler_steps(out: Path) -> None:
    """NO_SHARD issues no all-gather, so only FSDP's root forward spans can split iterations."""
    prof = fsdpviz.load_profile(out / "twice-no-shard" / "trace-rank0.json")
    assert prof.config["iteration_offset"] == 0
    assert [len(it) for it in prof.iterations] == [5] * ITERATIONS
    assert {e.kind for it in prof.iterations for e in it} == {"all_reduce"}


def _trace(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _x(name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_gpu_kernel_time_is_the_duration(tmp_path: Path) -> None:
    """GPU traces link a collective to its NCCL kernel by ``External id``: its time counts."""
    kernel = {
        "ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL",
        "pid": 0, "tid": 7, "ts": 150.0, "dur": 40.0, "args": {"External id": 12},
    }  # fmt: skip
    path = _trace(
        tmp_path,
        [
            _x("FullyShardedDataParallel._pre_forward", 100.0, 30.0),
            _x("c10d::_allgather_base_", 105.0, 10.0, **{"External id": 11}),
            _x("record_param_comms", 106.0, 5.0, **{"External id": 12}),
            kernel,
        ],
    )
    (event,) = fsdpviz.load_profile(path).iterations[0]
    assert (event.kind, event.hook, event.prefetch) == ("all_gather", "pre_forward", False)
    assert event.t == pytest.approx(5e-6) and event.duration == pytest.approx(40e-6)


def test_profile_errors_say_what_to_do(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="export_chrome_trace"):
        fsdpviz.load_profile(bad)
    with pytest.raises(ValueError, match="no collective inside an FSDP hook label"):
        fsdpviz.load_profile(_trace(tmp_path, [_x("aten::mm", 0.0, 1.0)]))
    with pytest.raises(ValueError, match="no collective inside an FSDP hook label"):
        fsdpviz.load_profile(_trace(tmp_path, [_x("FSDP::pre_forward (blocks.0)", 0.0, 1.0)]))


@pytest.mark.parametrize("explicit", [False, True], ids=["implicit", "explicit_prefetch"])
def test_fsdp2_trace_names_its_units(fake_pg: int, tmp_path: Path, explicit: bool) -> None:
    """A real FSDP2 run profiled on the CPU: the trace alone gives the collectives."""
    import handwritten_models as hm
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model, x = hm.CalledTwice(), torch.randn(4, 8)
    predicted_model = hm.CalledTwice()
    prefetch = {"blocks.0": ["blocks.1", "blocks.2"]} if explicit else {}
    mesh = init_device_mesh("cpu", (fake_pg,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if explicit:
        model.blocks[0].set_modules_to_forward_prefetch([model.blocks[1], model.blocks[2]])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            model(x).sum().backward()
    trace = tmp_path / "fsdp2.json"
    prof.export_chrome_trace(str(trace))
    real = fsdpviz.load_profile(trace)
    assert real.config["api"] == "FSDP2" and real.config["unit_names"] == "from trace"
    assert len(real.iterations) == 3
    predicted = fsdpviz.analyze(
        predicted_model, x, fully_shard=[hm.Block], world_size=fake_pg, forward_prefetch=prefetch
    )
    result = fsdpviz.diff(real, predicted)
    assert result.equal, str(result)
    assert all(e.duration is not None and e.duration > 0 for e in real.iterations[1])
