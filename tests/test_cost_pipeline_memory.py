"""A pipeline rank's memory against torch's ``MemTracker`` on a real run, in one process.

``pipeline_memory.measure`` runs pipeline rank 0 of ``pipeline_job``'s pp 2 x dp_shard 2
job (the first stage: the embedding and the first blocks, parameters kept gathered across
microbatches) on the fake process group and follows every tensor; ``analyze`` of the unsplit
model must hold the same bytes at the steady step's peak and at each of its sends and
receives: the batch once (``step()`` splits it into views), every microbatch in flight
(its own too, while its output is sent), each later microbatch's gradients added into the
first's, and the gradients of the stage's output in the buffers ``PipelineStage`` receives
them into.
"""

from __future__ import annotations

import pipeline_job as pj
import pytest
from pipeline_memory import measure
from test_conformance_pipeline import predict
from torch.distributed.pipelining import PipelineStage

from fsdpviz.cost import memory_model

pytestmark = pytest.mark.skipif(
    not hasattr(PipelineStage, "_recv_meta"), reason="torch's PipelineStage infers shapes otherwise"
)


@pytest.mark.parametrize("name", ["1f1b-4", "gpipe-4"])
def test_the_first_pipeline_rank_holds_what_torch_holds(fake_pg: int, name: str) -> None:
    real = measure(*pj.CASES[name])
    rank = predict(name).pipeline.ranks[0]  # type: ignore[union-attr]
    mem = memory_model(rank, optimizer=None)
    assert real.peak == mem.peak["bytes"]
    events = rank.iterations[-1]
    assert [(kind, unit) for kind, unit, _ in real.events] == [(e.kind, e.unit) for e in events]
    p2p = [
        (e.action, used, row.total)
        for (_, _, used), e, row in zip(real.events, events, mem.events, strict=True)
        if e.kind in ("pp_send", "pp_recv")
    ]
    assert len(p2p) == 8 and all(used == total for _, used, total in p2p), p2p
