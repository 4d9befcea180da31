"""A pipeline rank with tensor parallelism against torch's ``MemTracker`` on a real run, in one
process: ``pipeline_job``'s model on a pp 2 x dp_shard 2 x tp 2 mesh of the fake process
group, stage 0 (the embedding and two blocks) parallelized with torchtitan's plan (the
embedding row-wise, sequence parallel) and sharded with bf16 parameters reducing in fp32.

The row-wise embedding's weight gradient is whole on every tp rank (DTensor's
``embedding_dense_backward`` strategies give none sharded on the vocabulary: the rank
computes the whole vocabulary's, replicated); without gradient sync between microbatches
FSDP2 keeps it in the reduce dtype (``to_accumulated_grad_if_needed``), so the stage holds
the whole vocabulary's gradient in fp32 from its first backward to ``REDUCE_GRAD``, whose
post-backward takes the rank's rows (``_get_grad_inner_tensor``) and reduce-scatters them.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import pipeline_job as pj
import pytest
import torch
from pipeline_memory import _total, _tracker
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage

import fsdpviz
from fsdpviz.configs.torchtitan_plan import tp_plan
from fsdpviz.cost import memory_model
from fsdpviz.recording import PipelineRecorder
from fsdpviz.schema.events import Event

pytestmark = pytest.mark.skipif(
    not hasattr(PipelineStage, "_recv_meta"), reason="torch's PipelineStage infers shapes otherwise"
)

MICROBATCHES = 4
MP = MixedPrecisionPolicy(torch.bfloat16, torch.float32)
BLOCKS = [f"layers.{i}" for i in range(pj.MODEL_ARGS["n_layers"])]


def _square(pred: torch.Tensor) -> torch.Tensor:
    return pred.float().square().mean()


def _real() -> tuple[int, list[tuple[str, str, int]], Any]:
    """Stage 0 on global rank 0: the last step's peak, (kind, unit, bytes) at each event, and
    the embedding's accumulated gradient after each backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import _utils
    from torch.distributed.pipelining.schedules import Schedule1F1B
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp_shard", "tp"))
    part = pj.split_module(pj.model(), pj.split(2)[0])
    modules = dict(part.named_modules())
    plan = {k: v for k, v in tp_plan(False).items() if any(fnmatch.fnmatch(n, k) for n in modules)}
    parallelize_module(part, mesh["tp"], plan)
    for m in part.modules():  # torchtitan's views take the rank's heads (``-1``)
        if hasattr(m, "n_kv_heads"):
            m.n_heads //= 2
            m.n_kv_heads //= 2
    pj.shard(part, mesh["dp_shard"], "default", mp_policy=MP)
    stage = PipelineStage(part, 0, 2, torch.device("cpu"), group=mesh["pp"].get_group())
    # what stage 1 sends back: the gradient of one microbatch's sequence-sharded hidden state
    shape = (pj.BATCH // MICROBATCHES, pj.SEQ // 2, pj.MODEL_ARGS["dim"])
    metas = _utils.extract_tensor_metas((torch.empty(shape, dtype=torch.bfloat16,
                                                     requires_grad=True),))  # fmt: skip
    grads = _utils._StageBackwardMeta(backward_metas=_utils._derive_grad_metas(metas))
    stage._recv_meta = lambda src: grads  # type: ignore[method-assign]
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=pj.loss_fn,
                            scale_grads=False)  # fmt: skip
    param = fully_shard.state(part.tok_embeddings)._fsdp_param_group.fsdp_params[0]
    held: list[Any] = []
    backward = stage.backward_one_chunk

    def backward_one_chunk(*args: Any, **kwargs: Any) -> None:
        backward(*args, **kwargs)
        acc = param.unsharded_accumulated_grad
        held.append(None if acc is None else (acc._local_tensor.shape, acc.dtype))

    stage.backward_one_chunk = backward_one_chunk  # type: ignore[method-assign]
    tracker = _tracker()
    tracker.track_external(part)
    seen: list[tuple[str, str, int]] = []

    class Recorder(PipelineRecorder):
        def _append(self, event: Event) -> int:
            seen.append((event.kind, event.unit, _total(tracker)))
            return super()._append(event)

    tokens = pj.tokens()
    with tracker, Recorder(schedule):
        for step in range(2):
            if step:  # the last step's peak and events
                now = tracker.get_tracker_snapshot()
                tracker._peak_mem_snap = now
                tracker._peak_mem = {dev: snap["Total"] for dev, snap in now.items()}
                seen.clear()
                held.clear()
            schedule.step(tokens)
            for p in part.parameters():
                p.grad = None
        peak = sum(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
    assert param.unsharded_accumulated_grad is None  # REDUCE_GRAD's post-backward freed it
    return peak, seen, held


def test_the_row_wise_embeddings_whole_gradient_is_held_in_fp32_to_reduce_grad(
    as_rank: Any,
) -> None:
    as_rank(0, 8)
    peak, seen, held = _real()
    vocab, dim = pj.MODEL_ARGS["vocab_size"], pj.MODEL_ARGS["dim"]
    assert held == [(torch.Size([vocab, dim]), torch.float32)] * MICROBATCHES
    with torch.device("meta"):
        model = pj.model()
    report = fsdpviz.analyze(
        model, pj.tokens(), fully_shard=["tok_embeddings", *BLOCKS, ("norm", "output")],
        reshard_after_forward=False, parallelize_plan=tp_plan(False), mp_policy=MP,
        mesh=("pp", 2, "dp_shard", 2, "tp", 2), pipeline_schedule="1F1B",
        microbatches=MICROBATCHES, loss=_square, progress=False,
    )  # fmt: skip
    assert report.pipeline is not None
    mine = report.pipeline.ranks[0]
    # the trace's gradient of the embedding: the whole vocabulary's, in fp32
    profile = mine.profile
    assert profile is not None
    made = [g["tok_embeddings"]
            for g in profile.iterations[-1].grads if g.get("tok_embeddings")]  # fmt: skip
    assert made == [vocab * dim * 4]
    mem = memory_model(mine, optimizer=None)
    assert mem.peak["bytes"] == peak
    events = [e for e in mine.iterations[-1] if e.group != "tp"]  # the recorder sees no tp's
    rows = [row for e, row in zip(mine.iterations[-1], mem.events, strict=True) if e.group != "tp"]
    assert [(k, u) for k, u, _ in seen] == [(e.kind, e.unit) for e in events]
    p2p = [(used, row.total) for (_, _, used), e, row in zip(seen, events, rows, strict=True)
           if e.kind in ("pp_send", "pp_recv")]  # fmt: skip
    assert p2p and all(used == total for used, total in p2p), p2p
    # held from the first backward's end (its receive of the next gradient) to REDUCE_GRAD
    at = {e.action: row.unsharded_grads for e, row in zip(events, rows, strict=True)}
    assert at["0RECV_B0"] == 0 and at["0RECV_B1"] >= vocab * dim * 4
