"""Context parallelism planned: a ``cp`` mesh dimension (torchtitan's
``context_parallel_degree``), each rank traced on its share of every sequence, every attention
run as torch's ring attention (``_templated_ring_attention`` with the ``allgather`` rotation):
which collectives run on which group, their bytes, what a rank holds, and how the time model
times them."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import fsdpviz
from fsdpviz.cost import machine, timeline
from fsdpviz.cost.hook_calls import tape
from fsdpviz.cost.topology import spans
from fsdpviz.examples import DecoderLayer, example_inputs, example_model

BATCH, SEQ, LAYERS = 2, 256, 6  # torchtitan's debugmodel: dim 256, 16 heads of 16


def _job(
    cp: int, seq: int = SEQ, ac: str = "none", compile: bool = False, **parallel: Any
) -> fsdpviz.Report:
    job: dict[str, Any] = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": BATCH, "seq_len": seq},
        "parallelism": {"context_parallel_degree": cp, **parallel},
        "activation_checkpoint": {"mode": ac, "selective_ac_option": "op"},
    }
    if compile:  # torchtitan compiles each block
        job["compile"] = {"enable": True, "components": ["model"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tt = fsdpviz.from_torchtitan(job, world_size=8)
    return fsdpviz.analyze(tt.model, tt.inputs, **tt.config, progress=False)


def _ring_bytes(cp: int, itemsize: int) -> int:
    """A rank's keys and values (torchtitan repeats them per head): B x H x S/cp x D each."""
    return 2 * BATCH * 16 * (SEQ // cp) * 16 * itemsize


def test_a_cp_mesh_shards_parameters_over_dp_shard_and_cp() -> None:
    report = _job(4)
    cfg = report.config
    assert cfg["mesh"] == {"dp_shard": 2, "cp": 4}
    assert (cfg.cp_world_size, cfg.shard_world_size, cfg.world_size) == (4, 8, 8)
    layer = report.unit("layers.0")
    assert layer.sharded_numel == layer.padded_numel // 8
    # each rank traced its share of the sequence
    assert report.profile is not None and report.profile.tokens == BATCH * SEQ // 4
    where = spans(cfg, 8)
    assert (where["shard"].ranks, where["cp"].ranks) == (8, 4)
    assert "context parallel over 4 ranks" in report.summary()


@pytest.mark.parametrize("cp", [2, 4])
def test_each_attention_runs_a_ring(cp: int) -> None:
    """Forward: one all-gather of every rank's keys and values per attention. Backward: the
    keys and values gathered again, and their float32 gradients passed round the ring, one
    all-to-all per block (``cp`` of them)."""
    report = _job(cp)
    events = report.iterations[-1]
    ring = [e for e in events if e.context_parallel]
    assert {e.group for e in ring} == {"cp"}
    for phase, kind, count, nbytes in (
        ("forward", "cp_all_gather", 1, cp * _ring_bytes(cp, 2)),
        ("backward", "cp_all_gather", 1, cp * _ring_bytes(cp, 2)),
        ("backward", "cp_all_to_all", cp, _ring_bytes(cp, 4)),
    ):
        for i in range(LAYERS):
            mine = [e for e in ring if e.kind == kind and e.phase == phase
                    and e.module == f"layers.{i}.attention"]  # fmt: skip
            assert len(mine) == count, (phase, kind, i)
            assert {e.unit for e in mine} == {f"layers.{i}"}
            assert {e.nbytes for e in mine} == {nbytes}
    # the steady state replays the first iteration's ring
    assert [e.untimed() for e in report.iterations[0]] == [e.untimed() for e in events]


def test_checkpointing_recomputes_the_ring_unless_attention_is_saved() -> None:
    """Full activation checkpointing runs each attention again in backward, its ring too;
    torchtitan's per-operator checkpointing saves attention's output, so no ring runs again."""

    def backward_gathers(report: fsdpviz.Report) -> int:
        return sum(
            e.kind == "cp_all_gather" and e.phase == "backward" for e in report.iterations[-1]
        )

    assert backward_gathers(_job(2, ac="none")) == LAYERS
    assert backward_gathers(_job(2, ac="full")) == 2 * LAYERS
    assert backward_gathers(_job(2, ac="selective")) == LAYERS


def test_a_rank_holds_its_share_of_the_sequence() -> None:
    """With every block checkpointed, what a rank saves is the same as a plan of its share of
    the sequence without context parallelism; the ring's float32 buffers are temporaries."""

    def saved(report: fsdpviz.Report) -> int:
        calls = tape(report, 0).calls
        return next(
            c for c in calls if c.hook == "post_forward" and c.unit == "norm, output"
        ).activations

    assert saved(_job(2, ac="full")) == saved(_job(1, seq=SEQ // 2, ac="full"))


def test_the_time_model_times_the_ring_on_its_group() -> None:
    report = _job(4)
    fast = timeline(report, "h100")
    t = fast.totals
    moved = 3 / 4 * 4 * _ring_bytes(4, 2) * 2 + 4 * _ring_bytes(4, 4)  # per layer
    assert t["cp_bytes"] == pytest.approx(LAYERS * moved)
    ring = [r for r in fast.records() if r["kind"].startswith("cp_")]
    assert ring and {r["stream"] for r in ring} == {"cp"}
    assert all(r["end"] > r["start"] for r in ring)
    # on a slow link the ring's next block waits for the keys and values
    slow = timeline(report, machine("h100", intra_node_gbps=0.05))
    waits = [b for b in slow.bottlenecks() if b["kind"].startswith("cp_")]
    assert waits and waits[0]["cause"] == "context_parallel"
    assert slow.totals["step_s"] > t["step_s"]


def test_a_compiled_ring_waits_for_each_collective_once_issued() -> None:
    """In a compiled block the ring is traced into the graph, where torch waits for a
    functional collective as soon as it is issued (``_maybe_wrap_tensor`` while tracing):
    no attention runs under the keys' all-gather or the gradients' all-to-all, in forward,
    in full checkpointing's recomputation or in backward. Eager, the all-gather runs under
    the rank's own block and each all-to-all under the next block."""

    def between(report: fsdpviz.Report) -> list[tuple[str, float]]:
        """Each ring collective's kind and the FLOPs run from its issue to its wait."""
        calls = tape(report, 0).calls
        out = []
        for k, c in enumerate(calls):
            if c.hook in ("cp_forward", "cp_backward"):
                kind = c.arg[0].removeprefix("cp_")
                wait = next(
                    j for j in range(k + 1, len(calls))
                    if calls[j].hook.endswith("_wait") and calls[j].arg == kind
                )  # fmt: skip
                flops = sum(x.flops_forward + x.flops_backward for x in calls[k + 1 : wait + 1])
                out.append((c.arg[0], flops))
        return out

    compiled = _job(2, ac="full", compile=True)
    ring = between(compiled)
    assert len(ring) == LAYERS * (3 + 2)  # a layer: 3 all-gathers, 2 all-to-alls
    assert all(flops == 0 for _, flops in ring)
    eager = between(_job(2, ac="full"))
    assert [kind for kind, _ in eager] == [kind for kind, _ in ring]
    # eager, only a ring's last all-to-all (its gradients' last hop) has nothing under it:
    # forward's all-gathers, then for each layer in backward the recomputation's all-gather,
    # backward's, and the two all-to-alls
    under = [True] * LAYERS + [True, True, True, False] * LAYERS
    assert [flops > 0 for _, flops in eager] == under
    # what the time model makes of it: on a slow link, every collective waited for whole
    t = timeline(compiled, machine("h100", intra_node_gbps=0.05))
    cp = [r for r in t.records() if r["kind"].startswith("cp_")]
    assert sum(r["exposed"] for r in cp) == pytest.approx(sum(r["end"] - r["start"] for r in cp))
    waits = [b for b in t.bottlenecks() if b["kind"].startswith("cp_")]
    assert len(waits) == len(ring)
    assert all("as soon as it is issued" in b["reason"] for b in waits)


def test_the_partitioners_capture_of_a_compiled_block_issues_no_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's partitioner, run on a compiled block under a selective checkpoint the first time
    a process meets it, runs the block's ring again on fake tensors: no collective of the step
    (it had added a forward all-gather of the block's module, its bytes the whole heads')."""
    from fsdpviz.trace import compiled_regions

    monkeypatch.setattr(compiled_regions, "_SAVES", {})  # as a fresh process: not partitioned yet
    report = _job(2, ac="selective", compile=True)
    ring = [e for e in report.iterations[0] if e.context_parallel]
    assert {e.module for e in ring} == {f"layers.{i}.attention" for i in range(LAYERS)}
    gathers = [e for e in ring if e.kind == "cp_all_gather" and e.phase == "forward"]
    assert len(gathers) == LAYERS
    assert [e.untimed() for e in report.iterations[0]] == [
        e.untimed() for e in _job(2, ac="selective", compile=True).iterations[0]
    ]


def test_a_stored_trace_does_not_answer_a_context_parallel_plan() -> None:
    """A stored trace ran whole sequences without ring attention: a plan on a cp mesh is
    traced (before, it came back without a single ring collective)."""
    from fsdpviz.replan.stored_fsdp2 import StoredTrace

    model, inputs = example_model(), example_inputs(seq=512)
    stored = StoredTrace(model, inputs, None)
    assert stored.plan(fully_shard=[DecoderLayer], world_size=8) is not None
    assert stored.plan(fully_shard=[DecoderLayer], mesh=("dp_shard", 2, "cp", 4)) is None


def test_context_parallel_mistakes_say_what_to_do() -> None:
    with pytest.raises(fsdpviz.ConfigError, match="divisible by 8"):
        _job(4, seq=260)
    with pytest.raises(fsdpviz.ConfigError, match="right after the data-parallel"):
        fsdpviz.analyze(
            example_model(), example_inputs(), fully_shard=[DecoderLayer],
            mesh=("cp", 2, "dp_shard", 2), progress=False,
        )  # fmt: skip
    # before: a ValueError from the loss, whose labels held a share of the sequence
    with pytest.raises(fsdpviz.ConfigError, match="under pipeline parallelism is not modelled"):
        _job(2, pipeline_parallel_degree=2)


def test_attention_with_a_mask_is_refused() -> None:
    """torch's ring attention takes causal attention without a mask (its load balancing)."""

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = self.proj(x).view(x.shape[0], x.shape[1], 2, 8).transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q)  # not causal
            return out.sum()

    with torch.device("meta"):
        model = Masked()
    with pytest.raises(fsdpviz.ConfigError, match="not causal"):
        fsdpviz.analyze(
            model, torch.zeros(2, 8, 16), fully_shard=["proj"], mesh=("dp_shard", 1, "cp", 2),
            loss=lambda out: out, progress=False,
        )  # fmt: skip
