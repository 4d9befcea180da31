"""Conformance of FSDP2 under pipeline parallelism against real torch on 4 gloo ranks.

The ranks form a pp 2 x dp_shard 2 mesh; a small torchtitan Llama 3 is split into stages
and sharded as torchtitan does it (``pipeline_job``), and ``torch.distributed.pipelining``'s
own schedules run three steps of it: GPipe, 1F1B and Interleaved1F1B with 2 and 4
microbatches, FSDP's parameters kept gathered across microbatches (torchtitan's default
under PP) and resharded after every forward; LoopedBFS, the zero-bubble schedules
(InterleavedZeroBubble, ZBVZeroBubble: input and weight backward apart) and DualPipeV
(overlapped forward and backward, V placement) with 4, and ZBVZeroBubble with only the
blocks sharded (rank 0's two stage roots, ``(root of stage 0)`` and ``(root of stage 3)``,
hold the embeddings and the norm and output). ``analyze`` of the unsplit model
with the same schedule must equal every rank: its units, each action in torch's runtime
order, and every event of both steps (the first with the stages' shape inference) with the
stage, microbatch and action that issued it, sends and receives included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pipeline_job as pj
import pytest
import torch
import torch.nn.functional as F
from fsdp_harness import assert_same_schedule
from gloo_worker import spawn_suite

import fsdpviz

WORLD_SIZE = pj.PP * pj.DP


@pytest.fixture(scope="module")
def pipeline_recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("gloo-pp"), WORLD_SIZE, "pipeline")


def cross_entropy(microbatches: int) -> Any:
    """torchtitan's loss of the last stage, against one microbatch of the labels."""
    labels = pj.labels()[: pj.BATCH // microbatches]

    def loss(pred: torch.Tensor) -> torch.Tensor:
        target = labels.to(pred.device)
        return F.cross_entropy(pred.flatten(0, 1).float(), target.flatten(0, 1))

    return loss


def predict(name: str, loss: Any = None, **options: Any) -> fsdpviz.Report:
    """``analyze`` of case ``name``; ``loss``: of the last stage's output (default: the
    cross entropy against the labels); ``options``: more of ``analyze``'s."""
    schedule, microbatches, policy = pj.CASES[name]
    raf = pj.reshard_after_forward(policy)
    blocks = [f"layers.{i}" for i in range(pj.MODEL_ARGS["n_layers"])]
    with torch.device("meta"):
        model = pj.model()
    if policy == "blocks":  # each stage's root holds what no block does
        plan: dict[str, Any] = {"fully_shard": blocks, "reshard_after_forward": False}
    else:
        plan = {
            "fully_shard": ["tok_embeddings", *blocks, ("norm", "output")],
            "reshard_after_forward": {
                "tok_embeddings": raf,
                **dict.fromkeys(blocks, raf),
                "norm, output": raf,
            },
        }
    return fsdpviz.analyze(
        model,
        pj.tokens(),
        **plan,
        mesh=("pp", pj.PP, "dp_shard", pj.DP),
        pipeline_schedule=schedule,
        microbatches=microbatches,
        loss=loss or cross_entropy(microbatches),
        **options,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", list(pj.CASES))
def test_pipeline_schedules_match_four_gloo_ranks(pipeline_recordings: Path, name: str) -> None:
    predicted = predict(name)
    pipeline = predicted.pipeline
    assert pipeline is not None and len(pipeline.ranks) == pj.PP
    for rank in range(WORLD_SIZE):
        pp_rank = rank // pj.DP  # the pp dimension is the outer one
        real = fsdpviz.load(str(pipeline_recordings / f"{name}-rank{rank}.json"))
        mine = pipeline.ranks[pp_rank]
        assert real.pipeline is not None and real.pipeline.rank == pp_rank
        actions = json.loads((pipeline_recordings / f"{name}-rank{rank}.actions.json").read_text())
        assert actions == [pipeline.actions[pp_rank]] * pj.STEPS
        assert real.pipeline.actions == mine.pipeline.actions  # type: ignore[union-attr]
        assert [(s.index, s.modules, s.units) for s in real.pipeline.stages] == [
            (s.index, s.modules, s.units) for s in pipeline.stages_of(pp_rank)
        ]
        assert_same_schedule(real, mine)  # units, and every event of both steps
        assert real.iterations[1] == mine.iterations[1]
    # what the steps hold: one reduce-scatter per unit per step, each after the stage's last
    # backward; sends and receives of one microbatch's activations
    steady = pipeline.ranks[0].iterations[1]
    units = [u.module for u in pipeline.ranks[0].units]
    reduced = [e.unit for e in steady if e.kind == "reduce_scatter"]
    assert sorted(reduced) == sorted(units)
    assert all(
        e.action and e.action.endswith("REDUCE_GRAD") for e in steady if e.kind == "reduce_scatter"
    )
    sends = [e for e in steady if e.kind == "pp_send" and e.phase == "forward"]
    per_microbatch = pj.BATCH // pj.CASES[name][1] * pj.SEQ * pj.MODEL_ARGS["dim"] * 4
    assert sends and {e.nbytes for e in sends} == {per_microbatch}
