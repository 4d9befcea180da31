"""FSDP2's float8 all-gather (torchao's ``enable_fsdp_float8_all_gather``) against real FSDP2
on the fake process group: the amax all-reduces over the shard group that its weights'
scales take (see [Note: float8 all-gather amaxes]), at every all-gather from the sharded
state, or, with ``precompute_float8_dynamic_scale_for_fsdp`` after each optimizer step, one
for all the weights there and none at the all-gathers after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import tp_models
from torch.distributed.fsdp import MixedPrecisionPolicy

import fsdpviz

float8 = pytest.importorskip("torchao.float8")

BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
SIZES = {"vocab": 64, "dim": 32, "n_heads": 4, "hidden": 96, "layers": 2}


def _tokens() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


@contextmanager
def _collectives() -> Iterator[list[list[Any]]]:
    """FSDP2's all-gathers (``foreach_all_gather``, issued after it made its inputs) and
    every all-reduce a step issues besides the gradients': torchao's amax all-reduces
    (``tensor_to_amax``'s ``funcol.all_reduce``, bound in ``float8_utils``) and DTensor's
    (``precompute_float8_dynamic_scale_for_fsdp``'s clamp of the stacked amaxes), as
    ``[kind, bytes, dtype]``."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group
    import torchao.float8.float8_utils as float8_utils

    seen: list[list[Any]] = []
    gather = param_group.foreach_all_gather
    amax, dtensor = float8_utils.all_reduce, funcol.all_reduce

    def all_gather(*args: Any, **kwargs: Any) -> Any:
        out = gather(*args, **kwargs)  # the amaxes of its inputs first, then the all-gather
        seen.append(["all_gather", None, None])
        return out

    def wrap(reduce: Any) -> Any:
        def all_reduce(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            seen.append(["all_reduce", t.numel() * t.element_size(), str(t.dtype)[6:]])
            return reduce(t, *args, **kwargs)

        return all_reduce

    param_group.foreach_all_gather = all_gather
    float8_utils.all_reduce, funcol.all_reduce = wrap(amax), wrap(dtensor)
    try:
        yield seen
    finally:
        param_group.foreach_all_gather = gather
        float8_utils.all_reduce, funcol.all_reduce = amax, dtensor


def _model(ranks: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """tp_models' Llama with float8 linears gathered in float8 (the output projection left
    bf16, as torchtitan's ``filter_fqns``), sharded per block and at the root, and its SGD."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ranks,))
    torch.manual_seed(0)
    model = tp_models.Llama(**SIZES)
    config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    float8.convert_to_float8_training(
        model, config=config, module_filter_fn=lambda m, fqn: fqn != "output"
    )
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=mesh, mp_policy=BF16)
    fully_shard(model, mesh=mesh, mp_policy=BF16)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _planned(ranks: int, precompute: bool) -> fsdpviz.Report:
    with torch.device("meta"):
        model = tp_models.Llama(**SIZES)
    f8 = {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
          "precompute_float8_dynamic_scale_for_fsdp": precompute}  # fmt: skip
    return fsdpviz.analyze(
        model, _tokens(), fully_shard=tp_models.LAYERS, world_size=ranks, mp_policy=BF16,
        loss=lambda out: out.sum(), float8=f8, progress=False,
    )  # fmt: skip


def _real(ranks: int, precompute: bool) -> tuple[list[list[list[Any]]], fsdpviz.Report]:
    """Two steps of real FSDP2 with float8 linears gathered in float8 (the output projection
    left bf16, as torchtitan's ``filter_fqns``), each ending with the optimizer step and,
    with ``precompute``, torchao's precomputation of the scales (as torchtitan calls it);
    and their recording."""
    model, optimizer = _model(ranks)
    steps = []
    with fsdpviz.FSDP2Recorder(model) as recorder:
        for _ in range(2):
            with _collectives() as seen:
                model(_tokens()).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                if precompute:
                    float8.precompute_float8_dynamic_scale_for_fsdp(model)
            steps.append(seen)
    return steps, recorder.report()


@pytest.mark.parametrize("precompute", [False, True], ids=["dynamic", "precomputed"])
def test_float8_all_gather_amax_all_reduces_as_torchao(fake_pg: int, precompute: bool) -> None:
    """Each all-gather of a block reduces its 7 float8 weights' amaxes (a float32 scalar, 4
    bytes, each) before it, forward and backward; the root's (no float8 weight) none. With
    the scales precomputed, the first step's all-gathers still reduce (no optimizer step
    before them), and each step ends with one all-reduce of all 14 amaxes (56 bytes); the
    second step's all-gathers reduce none. fsdpviz planned none of them."""
    real, recorded = _real(fake_pg, precompute)
    report = _planned(fake_pg, precompute)
    planned = [
        [[e.kind, e.nbytes, e.dtype] for e in it if e.kind in ("all_gather", "all_reduce")]
        for it in report.iterations
    ]
    assert planned == real
    # the recorder records each all-gather's amaxes and the precomputation's all-reduce
    # after each optimizer step as planned, event for event
    events = [[e.to_dict() for e in it] for it in report.iterations]
    assert [[e.to_dict() for e in it] for it in recorded.iterations] == events
    assert real[1].count(["all_reduce", 4, "float32"]) == (0 if precompute else 4 * 7)
    assert real[1].count(["all_reduce", 4 * 14, "float32"]) == int(precompute)
    # the time model prices each over the shard group: latency-bound, never free
    steady = report.iterations[-1]
    timed = [t for t in report.timeline.events if steady[t.index].group == "shard"]
    assert len(timed) == len([e for e in steady if e.group == "shard"]) > 0
    assert all(t.end > t.start and t.bytes < 2 * 56 for t in timed)


def test_a_recording_on_disk_keeps_the_precomputations_all_reduce(
    fake_pg: int, tmp_path: Any
) -> None:
    """``fsdpviz.record`` writes each iteration's line when FSDP's final callback ends it;
    the precomputation's all-reduce comes after, with the optimizer step: the iteration's
    line is written again with it, and read back in place of the first, so the run loaded
    from disk has every planned event, the lines' module events kept."""
    model, optimizer = _model(fake_pg)
    with fsdpviz.record(model, out_dir=tmp_path) as rec:
        for _ in range(2):
            model(_tokens()).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            float8.precompute_float8_dynamic_scale_for_fsdp(model)
    assert rec.iterations_written == 2
    lines = (tmp_path / "rank0.jsonl").read_text().splitlines()
    assert len(lines) == 4  # each iteration, then again with the precomputation's all-reduce
    (run,) = fsdpviz.load(str(tmp_path)).ranks
    assert run.config.complete_iterations == 2 and all(run.module_events)
    loaded = [
        [{k: v for k, v in e.to_dict().items() if k not in ("t", "duration")} for e in it]
        for it in run.iterations
    ]
    assert loaded == [[e.to_dict() for e in it] for it in _planned(fake_pg, True).iterations]


def test_precomputed_scales_under_tensor_parallelism(fake_pg: int) -> None:
    """FSDP 2 x TP 2: the weights are DTensors over both dimensions, so the precomputation's
    stacked amaxes are ``(Partial, Partial)``, which DTensor all-reduces over each in turn:
    one over the shard group, one over the tp ranks (fsdpviz planned the first only); each
    all-gather's own amaxes stay over the shard group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = tp_models.Llama(**SIZES)
    config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    float8.convert_to_float8_training(
        model, config=config, module_filter_fn=lambda m, fqn: fqn != "output"
    )
    parallelize_module(model, mesh["tp"], tp_models.plain_plan())
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=mesh["dp"], mp_policy=BF16)
    fully_shard(model, mesh=mesh["dp"], mp_policy=BF16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    real = []
    with fsdpviz.FSDP2Recorder(model, timestamps=True) as recorder:
        for _ in range(2):
            with _collectives() as seen:
                model(_tokens()).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                float8.precompute_float8_dynamic_scale_for_fsdp(model)
            # the scales' all-reduces (float32), not DTensor's of activations or tensorwise
            # amaxes
            real.append([c for c in seen if c[0] == "all_gather" or c[2] == "float32"])
    with torch.device("meta"):
        meta = tp_models.Llama(**SIZES)
    f8 = {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
          "precompute_float8_dynamic_scale_for_fsdp": True}  # fmt: skip
    report = fsdpviz.analyze(
        meta, _tokens(), fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2), mp_policy=BF16,
        loss=lambda out: out.sum(), float8=f8, parallelize_plan=tp_models.plain_plan(),
        progress=False,
    )  # fmt: skip
    planned = [
        [
            [e.kind.removeprefix("tp_"), e.nbytes, e.dtype]
            for e in it
            if e.kind == "all_gather" or e.group == "shard" or e.dtype == "float32"
        ]
        for it in report.iterations
    ]
    assert planned == real
    assert real[1][-2:] == [["all_reduce", 4 * 14, "float32"]] * 2
    # the recorder (which leaves tensor parallelism's collectives out) records the
    # precomputation's all-reduce over the shard group once a step, timed, where the plan has it
    recorded = [
        [{k: v for k, v in e.to_dict().items() if k not in ("t", "duration")} for e in it]
        for it in recorder.report().iterations
    ]
    fsdp = [[e.to_dict() for e in it if not e.tensor_parallel] for it in report.iterations]
    assert recorded == fsdp
    last = recorder.report().iterations[-1][-1]
    assert (last.nbytes, last.duration is not None) == (4 * 14, True)


def test_flight_recorder_expects_each_amax_by_its_bytes() -> None:
    """A flight recorder's dump holds each amax all-reduce as the 4 bytes it moves over the
    shard group: the prediction's, aligned against it, has that size (it had its unit's
    parameters' elements, which no dumped collective matches)."""
    from fsdpviz.flight._align import expected_streams

    with torch.device("meta"):
        model = tp_models.Llama(**SIZES)
    f8 = {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True}
    report = fsdpviz.analyze(
        model, _tokens(), fully_shard=tp_models.LAYERS, world_size=4, mp_policy=BF16,
        loss=lambda out: out.sum(), float8=f8, progress=False,
    )  # fmt: skip
    amaxes = [p for p in expected_streams(report, 2)["shard"] if p.event.group == "shard"]
    assert len(amaxes) == 2 * 4 * 7
    assert {(p.kind, p.size, p.by_bytes) for p in amaxes} == {("all_reduce", 4, True)}


def test_amax_all_reduces_leave_a_plan_without_profile_as_it_was() -> None:
    """A plan without a trace profile (``profile=False``) walks each event as its own hook
    call; a float8 weight's amax all-reduce, which torchao runs inside its unit's all-gather,
    goes with that all-gather: the memory at every event is what the same plan without the
    4-byte all-reduces holds (each had stood as a hook call before its all-gather, so the
    copy-out waited for an all-gather not issued yet and every gathered unit stayed held)."""
    import dataclasses

    from fsdpviz.cost.memory import memory_model

    with torch.device("meta"):
        model = tp_models.Llama(**SIZES)
    f8 = {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True}
    report = fsdpviz.analyze(
        model, _tokens(), fully_shard=tp_models.LAYERS, world_size=4, mp_policy=BF16,
        loss=lambda out: out.sum(), float8=f8, profile=False, progress=False,
    )  # fmt: skip
    amaxes = [[e for e in events if e.group != "shard"] for events in report.iterations]
    assert sum(map(len, amaxes)) < sum(map(len, report.iterations))
    bare = dataclasses.replace(report, iterations=amaxes)
    planned, without = memory_model(report), memory_model(bare)
    assert planned.peak["bytes"] == without.peak["bytes"]
    kept = [(e.kind, e.unit, e.total) for e in planned.events if e.kind != "all_reduce"]
    assert kept == [(e.kind, e.unit, e.total) for e in without.events]


@pytest.mark.parametrize("precompute", [False, True], ids=["dynamic", "precomputed"])
def test_waits_name_the_amax_all_reduces_as_such(precompute: bool) -> None:
    """What the compute waits for, in words: an all-gather queued behind its float8 weights'
    amax all-reduces says so (not a bare ``all_reduce``, FSDP's name for a gradient's
    reduction), with prefetch as the fix (they go with the all-gather); the precomputation's
    all-reduce at the step's end is torchao's, after the optimizer step, which the final
    callback does not wait for."""
    with torch.device("meta"):
        model = tp_models.Llama(**SIZES)
    f8 = {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
          "precompute_float8_dynamic_scale_for_fsdp": precompute}  # fmt: skip
    report = fsdpviz.analyze(
        model, _tokens(), fully_shard=tp_models.LAYERS, world_size=64, mp_policy=BF16,
        loss=lambda out: out.sum(), float8=f8, progress=False,
    )  # fmt: skip
    rows = report.timeline.bottlenecks()
    table = report.timeline.bottleneck_table(limit=None)
    assert "queued behind all_reduce" not in table
    if not precompute:
        queued = [
            b for b in rows if "queued behind the float8 amax all-reduce of 'layers." in b["reason"]
        ]
        assert queued and all(b["kind"] == "all_gather" for b in queued)
        assert any("forward prefetch" in b["reason"] for b in queued)
        return
    (scales,) = [b for b in rows if b["kind"] == "all_reduce"]
    assert scales["cause"] == "tail"
    assert scales["reason"].startswith(
        "the step's tail: the float8 scales' all-reduce of (root) (every float8 weight's amax, "
        "reduced by precompute_float8_dynamic_scale_for_fsdp after the optimizer step)"
    )
    assert "final callback" not in scales["reason"]
    assert f"#{scales['event']} float8 amax all_reduce (root) (backward)" in table
