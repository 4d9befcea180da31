"""FSDP2's float8 all-gather with precomputed scales under pipeline parallelism, against one
real pipeline rank of ``pipeline_job``'s pp 2 x dp_shard 2 job on the fake process group.

torchtitan calls ``precompute_float8_dynamic_scale_for_fsdp`` on each model part after the
optimizer step: each of a rank's stages reduces the amaxes of its float8 weights in one
all-reduce over its shard group, and its all-gathers after it cast with the scales so made
(see [Note: float8 all-gather amaxes]); the first step's all-gathers, before any optimizer
step, still reduce each weight's amax.
"""

from __future__ import annotations

from typing import Any

import pipeline_job as pj
import pytest
import torch
from pipeline_memory import _neighbours_metadata
from test_conformance_pipeline import predict

import fsdpviz

float8 = pytest.importorskip("torchao.float8")

SPEC = {"enable_fsdp_float8_all_gather": True, "filter_fqns": ["output"],
        "precompute_float8_dynamic_scale_for_fsdp": True}  # fmt: skip


def _square(pred: torch.Tensor) -> torch.Tensor:
    return pred.float().square().mean()


def _float8_model() -> torch.nn.Module:
    """``pipeline_job``'s model with torchtitan's float8 linears (the output left out)."""
    config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    whole = _plain()
    return float8.convert_to_float8_training(
        whole, config=config, module_filter_fn=lambda m, fqn: fqn != "output"
    )


_plain = pj.model


def _run(name: str, accum: int, monkeypatch: pytest.MonkeyPatch) -> fsdpviz.Report:
    """Three optimizer steps of this rank, each after ``accum`` steps (torchtitan's gradient
    accumulation under PP: one ``step()`` per micro-step) and followed, per model part, by
    the precomputation of the scales (torchtitan's ``Float8Converter.post_optimizer_hook``)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (pj.PP, pj.DP), mesh_dim_names=("pp", "dp_shard"))
    schedule_name, microbatches, policy = pj.CASES[name]
    with monkeypatch.context() as m:
        m.setattr(pj, "model", _float8_model)
        schedule, stages = pj.build_schedule(
            mesh, schedule_name, microbatches, policy, lambda pred, _: _square(pred)
        )
    first = any(st.is_first for st in stages)
    parts = [st.submod for st in stages]
    opt = torch.optim.SGD([p for part in parts for p in part.parameters()], lr=1e-3)
    with (
        _neighbours_metadata(pj.BATCH // microbatches, torch.float32),
        fsdpviz.recording.PipelineRecorder(schedule) as recorder,
    ):
        for k in range(3 * accum):
            target = torch.empty(pj.BATCH, 0) if any(st.is_last for st in stages) else None
            if first:
                schedule.step(pj.tokens(), target=target)
            else:
                schedule.step(target=target)
            if (k + 1) % accum:
                continue
            opt.step()
            opt.zero_grad(set_to_none=True)
            for part in parts:
                float8.precompute_float8_dynamic_scale_for_fsdp(part)
    return recorder.report()


@pytest.mark.parametrize(
    ("name", "rank", "accum"),
    [
        ("1f1b-4", 0, 1),
        ("1f1b-4", 2, 1),
        ("gpipe-4", 2, 1),
        ("interleaved-4", 0, 1),
        ("zbv-4", 0, 1),
        ("1f1b-4", 2, 2),
        ("interleaved-4-always", 2, 2),
    ],
)
def test_each_stage_precomputes_its_scales_after_the_optimizer_step(
    as_rank: Any, monkeypatch: pytest.MonkeyPatch, name: str, rank: int, accum: int
) -> None:
    """The rank's plan holds, after each optimizer step, one all-reduce of the stacked amaxes
    (4 bytes a float8 weight, in float32) per stage it holds with float8 weights (V and
    interleaved schedules: two stages, the last without), tagged with the stage, and
    none after a micro-step without one; event for event as the real rank's, two optimizer
    steps of ``accum`` micro-steps (the first one's all-gathers reducing each weight's
    amax, the steady one's none)."""
    as_rank(rank)
    real = _run(name, accum, monkeypatch)
    planned = predict(name, loss=_square, float8=SPEC, grad_accum=accum)
    assert planned.pipeline is not None
    mine = planned.pipeline.ranks[rank // pj.DP]
    r = [[e.to_dict() for e in it] for it in real.iterations]
    p = [[e.to_dict() for e in it] for it in mine.iterations]
    assert len(r) == 3 * accum and len(p) == 2 * accum
    for k in range(2 * accum):
        assert r[k] == p[k], f"micro-step {k}"
    assert r[2 * accum :] == r[accum : 2 * accum]
    # each stage's float8 weights, as its first all-gathers reduce their amaxes one by one
    weights: dict[int | None, set[str]] = {}
    for e in mine.iterations[0]:
        if e.group == "shard" and e.module is not None:
            weights.setdefault(e.stage, set()).add(e.module)
    # a stage without float8 weights (the norm and the output, left bf16) reduces nothing:
    # torchao's precomputation returns before its all-reduce
    stages = [s.index for s in planned.pipeline.stages_of(rank // pj.DP) if s.index in weights]
    assert stages and sorted(weights) == sorted(stages)
    for k, events in enumerate(mine.iterations):
        precomputed = [
            (e.stage, e.nbytes, e.dtype) for e in events if e.group == "shard" and e.module is None
        ]
        stepped = (k + 1) % accum == 0
        assert precomputed == [(s, 4 * len(weights[s]), "float32") for s in stages if stepped]


def test_the_cost_models_walk_each_stages_precomputation() -> None:
    """The memory and time models walk a rank's steps with the precomputations after them:
    the time model prices each all-reduce of the stacked amaxes over the shard group."""
    from fsdpviz.cost import memory_model, timeline

    planned = predict("interleaved-4", loss=_square, float8=SPEC)
    assert planned.pipeline is not None
    mine = planned.pipeline.ranks[0]
    steady = mine.iterations[-1]
    at = [i for i, e in enumerate(steady) if e.group == "shard" and e.module is None]
    assert [steady[i].stage for i in at] == [s.index for s in planned.pipeline.stages_of(0)]
    assert memory_model(mine).peak["bytes"] > 0
    timed = {t.index: t for t in timeline(mine, "h100").events}
    assert all(timed[i].end > timed[i].start for i in at)
