"""A pipeline rank's memory against torch's ``MemTracker`` on a real run, in one process.

``pipeline_memory.measure`` runs one pipeline rank of ``pipeline_job``'s pp 2 x dp_shard 2
job (parameters kept gathered across microbatches) on the fake process group and follows
every tensor; ``analyze`` of the unsplit model must hold the same bytes at the steady step's
peak and at each of its sends and receives. The first stage (global rank 0): the batch
once (``step()`` splits it into views), every microbatch in flight (its own too, while its
output is sent), each later microbatch's gradients added into the first's, and the
gradients of the stage's output in the buffers ``PipelineStage`` receives them into. The
last stage (global rank 2): its outputs and losses, kept for ``step()``, and the gradient
of its input, referenced until it is sent (GPipe) or until the next backward (1F1B).
Interleaved1F1B resharding after forward: each stage, an FSDP root of its own, frees the
all-gather buffer its forward kept at its root's post-forward. The zero-bubble schedules:
what their input backward keeps until their weight backward.

The loss is the mean square of the output: the cross entropy against labels would hold the
labels, which ``analyze``'s ``loss=`` closes over and the real step receives as a target.
"""

from __future__ import annotations

from typing import Any

import pipeline_job as pj
import pytest
import torch
from fsdp_harness import assert_same_schedule
from pipeline_memory import Measured, measure
from test_conformance_pipeline import predict
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.pipelining import PipelineStage

from fsdpviz.cost import memory_model
from fsdpviz.schema.events import Event
from fsdpviz.schema.memory import MemoryReport
from fsdpviz.schema.pipeline import Pipeline
from fsdpviz.schema.report import Report

pytestmark = pytest.mark.skipif(
    not hasattr(PipelineStage, "_recv_meta"), reason="torch's PipelineStage infers shapes otherwise"
)


def _square(pred: torch.Tensor) -> torch.Tensor:
    return pred.float().square().mean()


@pytest.mark.parametrize("rank", [0, 2])
@pytest.mark.parametrize("name", ["1f1b-4", "gpipe-4", "interleaved-4-always"])
def test_a_pipeline_rank_holds_what_torch_holds(as_rank: object, name: str, rank: int) -> None:
    as_rank(rank)  # type: ignore[operator]
    _check(name, rank // pj.DP)


@pytest.mark.parametrize("name", ["1f1b-4", "gpipe-2"])
def test_a_middle_stage_holds_what_torch_holds(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """pp 4 x dp 1, pipeline rank 1: it receives and sends both ways; GPipe's and 1F1B's
    loops keep their last forward's output (their variable ``output``) to the step's end."""
    monkeypatch.setattr(pj, "PP", 4)
    monkeypatch.setattr(pj, "DP", 1)
    as_rank(1)  # type: ignore[operator]
    _check(name, 1)


@pytest.mark.parametrize("rank", [0, 2])
def test_mixed_precision_keeps_the_gradients_in_the_reduce_dtype(
    as_rank: object, rank: int
) -> None:
    """bf16 parameters reducing in fp32: FSDP2 moves a stage's first gradients into an
    fp32 copy (``to_accumulated_grad_if_needed``), so each later microbatch's gradient is a
    new bf16 ``.grad`` until its unit's post-backward adds it into the copy and frees it
    (``accumulate_unsharded_grad_if_needed``), not an addition in place."""
    as_rank(rank)  # type: ignore[operator]
    _check("1f1b-4", rank // pj.DP, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32))


@pytest.mark.parametrize("rank", [0, 2])
@pytest.mark.parametrize("name", ["1f1b-4", "gpipe-4", "zero-bubble-4"])
def test_a_reduce_dtype_narrower_than_the_gradients(as_rank: object, name: str, rank: int) -> None:
    """fp32 parameters reducing in bf16: FSDP2 moves a backward's fp32 gradients into a bf16
    copy too (``to_accumulated_grad_if_needed`` casts whenever the dtypes differ, to fewer
    bytes as to more), so between microbatches a stage holds half the bytes, and each later
    microbatch's fp32 gradient is new until its post-backward adds it into the copy."""
    as_rank(rank)  # type: ignore[operator]
    _check(name, rank // pj.DP, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.bfloat16))


def _check(name: str, pp_rank: int, **options: Any) -> None:
    real = measure(*pj.CASES[name], loss_fn=lambda pred, _: _square(pred),
                   target=lambda: torch.empty(pj.BATCH, 0), **options)  # fmt: skip
    mine = predict(name, loss=_square, **options).pipeline.ranks[pp_rank]  # type: ignore[union-attr]
    mem = memory_model(mine, optimizer=None)
    assert real.peak == mem.peak["bytes"]
    events = mine.iterations[-1]
    assert [(kind, unit) for kind, unit, _ in real.events] == [(e.kind, e.unit) for e in events]
    _same_at_every_event(real, events, mem)


def _same_at_every_event(real: Measured, events: list[Event], mem: MemoryReport) -> None:
    """The bytes the plan holds at each of the steady step's events (the state its call
    leaves: an all-gather with its unit's copy-out, a free done, a reduce-scatter's input
    and output made; a send or receive moves none) are those the real run held then
    (``real``'s last ``len(events)`` events)."""
    n = len(events)
    assert real.events[-n:] and len(real.after) == len(real.events)
    rows = zip(real.events[-n:], real.after[-n:], events, mem.events, strict=True)
    differ = [
        (i, e.kind, e.unit, e.action, used if after is None else after, row.total)
        for i, ((_, _, used), after, e, row) in enumerate(rows)
        if (used if after is None else after) != row.total
    ]
    assert not differ, differ


def test_zero_bubble_gives_no_gradient_to_groups_resharded_before_the_input_backward(
    as_rank: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """InterleavedZeroBubble resharding after forward: ``stage_backward_input`` finds the
    stage's weights (``submod.parameters()``) before autograd runs FSDP's pre-backward, so a
    group still resharded from its forward is found by its sharded parameters, which the
    graph does not use: that microbatch's ``W`` gives it no gradient, and where no
    microbatch's does, ``REDUCE_GRAD`` frees it without a reduce-scatter. Every event of the
    real run's steady step, on the rank holding stages 1 and 3, and its peak."""
    monkeypatch.setitem(pj.MODEL_ARGS, "n_layers", 7)
    monkeypatch.setitem(pj.CASES, "zero-bubble-4-always", ("InterleavedZeroBubble", 4, "always"))
    as_rank(2)  # type: ignore[operator]
    real = measure(*pj.CASES["zero-bubble-4-always"], loss_fn=lambda pred, _: _square(pred),
                   target=lambda: torch.empty(pj.BATCH, 0))  # fmt: skip
    mine = predict("zero-bubble-4-always", loss=_square).pipeline.ranks[1]  # type: ignore[union-attr]
    steady = mine.iterations[-1]
    assert [(kind, unit) for kind, unit, _ in real.events] == [(e.kind, e.unit) for e in steady]
    reduced = {e.unit for e in steady if e.kind == "reduce_scatter"}
    assert reduced and {"layers.6", "norm, output"}.isdisjoint(reduced)
    lost = [w for w in mine.warnings if w.code == "pipeline_lost_gradients"]
    assert len(lost) == 1 and {"layers.6", "norm, output"} <= set(lost[0].units)
    assert real.peak == memory_model(mine, optimizer=None).peak["bytes"]


@pytest.mark.parametrize(("dp", "policy"), [(2, "always"), (4, "2")])
def test_zero_bubble_fails_where_a_forward_reshards_between_input_and_weight_backward(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, dp: int, policy: str
) -> None:
    """InterleavedZeroBubble on 3 stages per rank, resharding after forward: torch's own
    run of pipeline rank 1 fails at ``3W1`` in ``stage_backward_weight`` (its ``I`` found
    ``layers.2`` gathered, ``3F2`` resharded it), and ``analyze`` refuses the job naming
    that rank, action and unit (tests/test_schedule_pipeline.py); rank 0 runs. Resharding
    onto 2 of 4 ranks fails alike: ``3F2`` registers new post-forward parameters
    (``to_sharded_post_forward``), whose ``AccumulateGrad`` nodes are not those of I's graph."""
    import fsdpviz

    monkeypatch.setattr(pj, "DP", dp)
    monkeypatch.setattr(pj, "stages_per_rank", lambda schedule: 3)
    monkeypatch.setitem(pj.CASES, "zero-bubble-3", ("InterleavedZeroBubble", 4, policy))
    with pytest.raises(fsdpviz.FSDPConfigError, match="rank 1: torch fails at 3W1") as caught:
        predict("zero-bubble-3", loss=_square, pipeline_stages=pj.split(6))
    assert "found 'layers.2' gathered, and 3F2" in str(caught.value)
    args = (*pj.CASES["zero-bubble-3"],)
    kw: dict[str, Any] = {"loss_fn": lambda pred, _: _square(pred),
                          "target": lambda: torch.empty(pj.BATCH, 0)}  # fmt: skip
    as_rank(0, 2 * dp)  # type: ignore[operator]
    assert measure(*args, **kw).peak > 0
    as_rank(dp, 2 * dp)  # type: ignore[operator]
    with pytest.raises(KeyError, match="AccumulateGrad"):
        measure(*args, **kw)


# zero-bubble cases resharding after every forward
_ALWAYS = {
    "zero-bubble-4-always": ("InterleavedZeroBubble", 4, "always"),
    "zbv-4-always": ("ZBVZeroBubble", 4, "always"),
    "dualpipev-4-always": ("DualPipeV", 4, "always"),
}


@pytest.mark.parametrize(
    "name",
    ["gpipe-4-always", "1f1b-4-always", "interleaved-4-always", "zero-bubble-4-always",
     "zbv-4-always", "dualpipev-4-always"],
)  # fmt: skip
def test_the_embedding_not_unsharded_in_backward_holds_what_torch_holds(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """``set_unshard_in_backward(False)`` on the first stage's embedding, resharding after
    every forward: each microbatch's forward gathers it (or the stage's ``UNSHARD``, in the
    IDLE state, before the first), its backward (``B``, or the first stage's ``W``) gathers
    it not, and ``REDUCE_GRAD`` reduce-scatters the gradients the microbatches made from
    the indices. Every event of the steady step of the rank holding stage 0, and its peak
    (before, refused as not modelled)."""
    for case, spec in {**_ALWAYS, "gpipe-4-always": ("GPipe", 4, "always")}.items():
        monkeypatch.setitem(pj.CASES, case, spec)
    as_rank(0)  # type: ignore[operator]
    real = measure(*pj.CASES[name], loss_fn=lambda pred, _: _square(pred),
                   target=lambda: torch.empty(pj.BATCH, 0),
                   not_unsharded=("tok_embeddings",))  # fmt: skip
    report = predict(name, loss=_square, unshard_in_backward={"tok_embeddings": False})
    mine = report.pipeline.ranks[0]  # type: ignore[union-attr]
    mem = memory_model(mine, optimizer=None)
    assert real.peak == mem.peak["bytes"]
    events = mine.iterations[-1]
    assert [(kind, unit) for kind, unit, _ in real.events] == [(e.kind, e.unit) for e in events]
    _same_at_every_event(real, events, mem)
    gathered = [e.action for e in events if e.kind == "all_gather" and e.unit == "tok_embeddings"]
    assert gathered and all(a.lstrip("0123456789")[0] in "FU" for a in gathered if a)  # F, UNSHARD


def test_a_stage_group_read_in_backward_not_unsharded_is_refused(as_rank: object) -> None:
    """``set_unshard_in_backward(False)`` on the last stage's norm and output (one call),
    resharding after forward: the output projection's backward reads its freed weight and
    torch fails; ``analyze`` refuses it from the stage's trace, naming the group. A mapping
    naming no module of the model is refused too."""
    import fsdpviz

    as_rank(2)  # type: ignore[operator]
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 0"):
        measure(*pj.CASES["1f1b-4-always"], loss_fn=lambda pred, _: _square(pred),
                target=lambda: torch.empty(pj.BATCH, 0), not_unsharded=("output",))  # fmt: skip
    said = "unshard_in_backward=False for 'norm, output', whose backward reads its parameters"
    with pytest.raises(fsdpviz.FSDPConfigError, match=said):
        predict("1f1b-4-always", loss=_square, unshard_in_backward={"output": False})
    with pytest.raises(fsdpviz.ConfigError, match="'outputs' is not a module of the model"):
        predict("1f1b-4-always", loss=_square, unshard_in_backward={"outputs": False})


@pytest.mark.parametrize(
    ("name", "rank"),
    [("zero-bubble-4", 0), ("zero-bubble-4", 2), ("zbv-4", 0), ("zbv-4", 2), ("dualpipev-4", 2),
     ("zero-bubble-4-always", 2), ("zbv-4-always", 2), ("dualpipev-4-always", 0)],
)  # fmt: skip
def test_a_zero_bubble_rank_holds_what_torch_holds(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, name: str, rank: int
) -> None:
    """The input backward (``I``, ``stage_backward_input``) keeps the graph below the
    weights' operators, the gradients at them and the stage's output until the weight
    backward (``W``, ``stage_backward_weight``); the first ``W`` sets the gradients, later
    ones add into them; the input's gradient stays in its buffer's ``.grad`` to the step's
    end. On a V schedule stage 1 hands its output to stage 2 as its input buffer
    (``set_local_fwd_input``), counted once. Resharding after forward, ``I`` finds the
    sharded weights of a unit still resharded, whose part of the graph it then keeps not."""
    for case, spec in _ALWAYS.items():
        monkeypatch.setitem(pj.CASES, case, spec)
    as_rank(rank)  # type: ignore[operator]
    _check(name, rank // pj.DP)


@pytest.mark.parametrize(
    ("schedule", "dp", "policy", "rank"),
    [("InterleavedZeroBubble", 4, "2", 4), ("ZBVZeroBubble", 4, "2", 4), ("DualPipeV", 4, "2", 0),
     ("InterleavedZeroBubble", 2, "1", 2)],
)  # fmt: skip
def test_a_zero_bubble_rank_resharding_onto_fewer_ranks_holds_what_torch_holds(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, schedule: str, dp: int, policy: str,
    rank: int,
) -> None:  # fmt: skip
    """pp 2 x dp_shard 4, each block resharded after forward onto 2 ranks: an ``I`` finds a
    unit still resharded by its post-forward parameters (``stage_backward_input``'s
    ``weight_grad_fns``), which keep their shards to its end, past the unit's copy-out, as
    its ``W`` gives the unit no gradient. Onto 1 of 2 ranks is keeping them gathered
    (``_get_post_forward_mesh_info``: ``False``)."""
    monkeypatch.setattr(pj, "DP", dp)
    monkeypatch.setitem(pj.CASES, "fewer", (schedule, 4, policy))
    as_rank(rank, 2 * dp)  # type: ignore[operator]
    _check("fewer", rank // dp)


@pytest.mark.parametrize("name", ["zero-bubble-4", "zbv-4"])
def test_a_zero_bubble_middle_rank_holds_what_torch_holds(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """pp 4 x dp 1, 8 stages of 6 blocks, pipeline rank 1: its two stages both receive
    and send (a V schedule's also hand each other their activations and gradients)."""
    monkeypatch.setattr(pj, "PP", 4)
    monkeypatch.setattr(pj, "DP", 1)
    monkeypatch.setitem(pj.MODEL_ARGS, "n_layers", 6)
    as_rank(1)  # type: ignore[operator]
    _check(name, 1)


@pytest.mark.parametrize(("name", "rank"), [("zero-bubble-4", 0), ("zbv-4", 2), ("dualpipev-4", 0)])
def test_zero_bubble_moves_each_weight_gradient_into_the_reduce_dtype(
    as_rank: object, name: str, rank: int
) -> None:
    """bf16 parameters reducing in fp32: each ``W`` sets a bf16 ``.grad``; the next
    backward's post-backward (an ``I``'s, of any microbatch) moves it into FSDP2's fp32
    copy (``to_accumulated_grad_if_needed``, the first time) or adds it there and frees it
    (``accumulate_unsharded_grad_if_needed``), so the next ``W`` sets a new one; a ``W``
    before that adds into the one there."""
    as_rank(rank)  # type: ignore[operator]
    _check(name, rank // pj.DP, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32))


def test_a_v_stage_output_is_counted_once_when_its_backward_begins(
    as_rank: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DualPipeV resharding after forward, bf16 parameters reducing in fp32, pipeline rank
    1 (stages 1 and 2): stage 1's output is stage 2's input buffer (``set_local_fwd_input``)
    and ``backward_one_chunk`` keeps it (``stage_output``) through stage 1's backward. The
    rank's peak is the first pre-backward of that backward, where the next unit's
    all-gather is prefetched: the output is held there once, not left out."""
    monkeypatch.setitem(pj.CASES, "dualpipev-4-always", _ALWAYS["dualpipev-4-always"])
    as_rank(2)  # type: ignore[operator]
    _check("dualpipev-4-always", 1, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32))


def test_a_reduction_on_one_rank_keeps_no_gradient_to_its_end(
    as_rank: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pp 4 x dp 1, InterleavedZeroBubble resharding after forward, bf16 parameters
    reducing in fp32, pipeline rank 2: the peak is stage 6's ``REDUCE_GRAD`` reduction. Its
    reduce-scatter group is one rank, so ``foreach_reduce`` skips the loop whose variable
    would keep the last gradient alive (``world_size > 1``): ``unsharded_grads.clear()``
    frees them all before the output is allocated."""
    monkeypatch.setattr(pj, "PP", 4)
    monkeypatch.setattr(pj, "DP", 1)
    monkeypatch.setitem(pj.MODEL_ARGS, "n_layers", 6)
    monkeypatch.setitem(pj.CASES, "zero-bubble-4-always", _ALWAYS["zero-bubble-4-always"])
    as_rank(2)  # type: ignore[operator]
    _check("zero-bubble-4-always", 2, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32))


@pytest.mark.parametrize("case", [("GPipe", 4, "always"), ("InterleavedZeroBubble", 4, "always")])
def test_a_frozen_unit_keeps_its_prefetched_all_gather_to_reduce_grad(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, case: tuple[str, int, str]
) -> None:
    """GPipe resharding after forward, the embedding frozen, pipeline rank 0: in each
    backward ``layers.0`` prefetches the embedding's all-gather, which no hook waits for (the
    embedding's backward never runs). FSDP2 frees such an ``_all_gather_result`` in
    ``finalize_backward`` only, which the root's final callback runs in the last backward:
    ``PipelineStage`` sets ``set_is_last_backward(False)`` for each microbatch, so the buffer
    is held at every later receive of a gradient, to ``REDUCE_GRAD``: that of its own stage,
    an FSDP root of its own (InterleavedZeroBubble: stage 2's ``REDUCE_GRAD``, before stage
    0's last gradient arrives, leaves stage 0's buffer alone)."""
    whole = pj.model

    def frozen() -> torch.nn.Module:
        m = whole()
        m.tok_embeddings.requires_grad_(False)
        return m

    monkeypatch.setattr(pj, "model", frozen)
    monkeypatch.setitem(pj.CASES, "frozen", case)
    as_rank(0)  # type: ignore[operator]
    _check("frozen", 0)


@pytest.mark.parametrize(
    "mp", [(torch.bfloat16, torch.float32), (None, torch.bfloat16)], ids=["bf16-fp32", "fp32-bf16"]
)
def test_gradient_accumulation_over_steps_reduces_in_every_step(
    as_rank: object, mp: tuple[Any, Any]
) -> None:
    """Gradients kept over two steps (``grad_accum=2``), a reduce dtype other than the
    gradients': ``REDUCE_GRAD`` (``perform_reduce_grad``) turns gradient sync on in every
    step, so the first step leaves gradient shards in the parameters' dtype, not unsharded
    gradients (or a partial reduce output) in the reduce dtype to add the next step's into."""
    as_rank(0)  # type: ignore[operator]
    policy = MixedPrecisionPolicy(*mp)
    real = measure(*pj.CASES["1f1b-4"], loss_fn=lambda pred, _: _square(pred), mp_policy=policy,
                   target=lambda: torch.empty(pj.BATCH, 0), accumulate=True)  # fmt: skip
    planned = predict("1f1b-4", loss=_square, mp_policy=policy, grad_accum=2)
    assert planned.pipeline is not None
    mine = planned.pipeline.ranks[0]
    mem = memory_model(mine, optimizer=None)
    _same_at_every_event(real, mine.iterations[-1], mem)
    assert real.peak == mem.peak["bytes"]


@pytest.mark.parametrize(("name", "rank"), [("1f1b-4", 0), ("1f1b-4", 2), ("zbv-4", 2)])
def test_gradient_accumulation_plans_two_optimizer_steps_of_micro_steps(
    as_rank: object, name: str, rank: int
) -> None:
    """``grad_accum=2`` under a pipeline, an AdamW step after every two ``step()`` calls:
    the rank's report holds two optimizer steps of two micro-steps each, event for event as
    the real run's; the steady one's memory holds the optimizer's states from its first
    micro-step (an optimizer step ran before it) and its peak is the real one; its time is
    its two steady micro-steps', each reducing (``REDUCE_GRAD`` in every ``step()``), not
    the first step's shape inference and first all-gathers; its summary and the card's job
    line say every micro-step syncs."""
    from fsdp_harness import assert_same_accumulation

    from fsdpviz.cost import timeline
    from fsdpviz.views.card import job_items

    as_rank(rank)  # type: ignore[operator]
    real = measure(*pj.CASES[name], loss_fn=lambda pred, _: _square(pred),
                   target=lambda: torch.empty(pj.BATCH, 0), adamw=2)  # fmt: skip
    planned = predict(name, loss=_square, grad_accum=2)
    assert planned.pipeline is not None and real.report is not None
    mine = planned.pipeline.ranks[rank // pj.DP]
    assert_same_accumulation(real.report, mine, 2)
    mem = memory_model(mine, optimizer="adamw_foreach")
    assert real.peak == mem.peak["bytes"]
    _same_at_every_event(real, mine.iterations[-1], mem)  # the last micro-step's
    tl = timeline(mine, "h100")
    once = timeline(predict(name, loss=_square).pipeline.ranks[rank // pj.DP], "h100")  # type: ignore[union-attr]
    assert [(m.iteration, m.sync) for m in tl.micro_steps] == [(2, True), (3, True)]
    for key in ("all_gather_bytes", "reduce_scatter_bytes", "pp_bytes"):
        assert tl.totals[key] == 2 * once.totals[key]
    # and in words: every micro-step synced
    assert "steady step, micro-step 1/2 (synced)" in mine.summary()
    assert "grad_accum 2 (each step() reduces)" in job_items(mine.config)


@pytest.mark.parametrize(
    ("schedule", "pp", "rank"),
    [("1F1B", 3, 2), ("Interleaved1F1B", 4, 4), ("ZBVZeroBubble", 4, 3)],
)
def test_a_deeper_pipeline_over_two_shards_holds_what_torch_holds(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, schedule: str, pp: int, rank: int
) -> None:
    """pp 3 or 4 x dp_shard 2, 6 blocks, one microbatch per pipeline rank, a rank of a
    middle stage (the V's rank 1 holds stages 1 and 6; ``rank`` is the second shard's):
    its actions, every event of three steps (the first with the shape inference) with its
    bytes, the steady step's peak and the bytes held at each send and receive."""
    monkeypatch.setattr(pj, "PP", pp)
    monkeypatch.setattr(pj, "DP", 2)
    monkeypatch.setattr(pj, "BATCH", 12 if pp == 3 else 8)
    monkeypatch.setitem(pj.MODEL_ARGS, "n_layers", 6)
    monkeypatch.setitem(pj.CASES, "deep", (schedule, pp, "default"))
    as_rank(rank, pp * 2)  # type: ignore[operator]
    real = measure(*pj.CASES["deep"], loss_fn=lambda pred, _: _square(pred),
                   target=lambda: torch.empty(pj.BATCH, 0), steps=3)  # fmt: skip
    planned = predict("deep", loss=_square)
    assert planned.pipeline is not None and real.report is not None
    mine = planned.pipeline.ranks[rank // 2]
    assert real.report.pipeline is not None and mine.pipeline is not None
    assert real.report.pipeline.actions == mine.pipeline.actions
    assert_same_schedule(real.report, mine)
    mem = memory_model(mine, optimizer=None)
    assert real.peak == mem.peak["bytes"]
    _same_at_every_event(real, mine.iterations[-1], mem)


@pytest.mark.parametrize(("name", "rank"), [("zbv-4-always", 0), ("zero-bubble-4-always", 2)])
def test_a_unit_no_microbatch_gives_a_gradient_has_no_optimizer_state(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, name: str, rank: int
) -> None:
    """Zero-bubble schedules resharding after forward, 7 blocks: the groups whose every
    ``I`` finds them resharded (``norm, output``; on InterleavedZeroBubble's rank 1
    ``layers.6`` too) get no gradient in the step, so AdamW keeps no state for them: their
    unit lists the parameters as unused, as the recorder sees them (a post-backward ran and
    no gradient reached them), and the steady step's peak with AdamW is the real one."""
    monkeypatch.setitem(pj.MODEL_ARGS, "n_layers", 7)
    monkeypatch.setitem(pj.CASES, name, _ALWAYS[name])
    as_rank(rank)  # type: ignore[operator]
    real = measure(*pj.CASES[name], loss_fn=lambda pred, _: _square(pred),
                   target=lambda: torch.empty(pj.BATCH, 0), adamw=1)  # fmt: skip
    mine = predict(name, loss=_square).pipeline.ranks[rank // pj.DP]  # type: ignore[union-attr]
    assert real.report is not None
    assert_same_schedule(real.report, mine)
    unused = {u.module for u in mine.units if u.unused_params}
    assert "norm, output" in unused
    assert real.peak == memory_model(mine, optimizer="adamw_foreach").peak["bytes"]


def _frozen_run(
    as_rank: object,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    rank: int,
    frozen_fqns: tuple[str, ...],
) -> tuple[Measured, Pipeline[Report], Report]:
    """Case ``name`` on global rank ``rank`` with the modules ``frozen_fqns`` frozen, run by
    torch and planned (a squared output as the loss): the measurement, the job's pipeline and
    the pipeline rank's plan, whose events of both steps are checked to be torch's."""
    whole = pj.model

    def frozen() -> torch.nn.Module:
        m = whole()
        for fqn in frozen_fqns:
            m.get_submodule(fqn).requires_grad_(False)
        return m

    monkeypatch.setattr(pj, "model", frozen)
    as_rank(rank)  # type: ignore[operator]
    real = measure(*pj.CASES[name], loss_fn=lambda pred, _: _square(pred),
                   target=lambda: torch.empty(pj.BATCH, 0), frozen=1)  # fmt: skip
    planned = predict(name, loss=_square)
    assert planned.pipeline is not None and real.report is not None
    mine = planned.pipeline.ranks[rank // pj.DP]
    assert [[e.to_dict() for e in it] for it in real.report.iterations] == [
        [e.to_dict() for e in it] for it in mine.iterations
    ]
    return real, planned.pipeline, mine


@pytest.mark.parametrize(
    ("name", "rank", "pp"),
    [(n, r, 2) for n in ("1f1b-4", "gpipe-4", "interleaved-4") for r in (0, 2)]
    + [("1f1b-4", 0, 4), ("1f1b-4", 1, 4), ("gpipe-4", 3, 4)],
)
def test_a_frozen_first_stage_is_planned_as_torch_runs_it(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, name: str, rank: int, pp: int
) -> None:
    """Stage 0's parameters all frozen (fine-tuning above frozen embeddings and blocks): its
    output needs no gradient (``_derive_grad_metas``), so the next stage's inputs need none,
    it sends no gradient back and stage 0 receives none (no ``pp_recv``/``pp_send`` of a
    gradient, no receive buffer for one), stage 0's ``B`` computes nothing and releases the
    output its forward kept (``fwd_cache.pop``), its ``REDUCE_GRAD`` frees without a
    reduce-scatter. Every event of both steps and the steady step's peak and the memory at
    each send and receive, as torch's; on pp 2 x dp_shard 2 and pp 4 x dp_shard 1 (stage 1
    holds a frozen block and a trainable one: it trains, and sends stage 0 no gradient)."""
    if pp == 4:
        monkeypatch.setattr(pj, "PP", 4)
        monkeypatch.setattr(pj, "DP", 1)
    real, pipeline, mine = _frozen_run(
        as_rank, monkeypatch, name, rank, ("tok_embeddings", "layers.0", "layers.1")
    )
    stage0 = set(pipeline.stages[0].units)
    events = mine.iterations[-1]
    reduced = {e.unit for e in events if e.kind == "reduce_scatter"}
    assert reduced.isdisjoint(stage0)
    assert bool(reduced) == (rank // pj.DP != 0 or name == "interleaved-4")  # stages 1-3 train
    back = {(e.kind, e.stage) for e in events if e.group == "pp" and e.phase == "backward"}
    assert not back & {("pp_recv", 0), ("pp_send", 1)}
    mem = memory_model(mine, optimizer=None)
    assert real.peak == mem.peak["bytes"]
    _same_at_every_event(real, events, mem)


@pytest.mark.parametrize(
    ("name", "rank"),
    [(n, r) for n in ("zbv-4", "zero-bubble-4", "dualpipev-4") for r in (0, 2)]
    + [("zero-bubble-4-always", 2)],
)
def test_a_frozen_first_stage_under_a_split_backward_loses_gradients_as_torch_does(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, name: str, rank: int
) -> None:
    """Stage 0 (the embedding and ``layers.0``) frozen under a schedule that splits stage
    1's backward into ``I`` and ``W``: stage 1's inputs need no gradient, so torch's
    ``stage_backward_input`` runs no autograd (no FSDP hook) and finds no parameter group,
    detaches the outputs (the graph goes) and keeps them with their gradient for ``W``,
    which computes nothing. ZBVZeroBubble splits every microbatch of stage 1: its units get
    no gradient and no reduce-scatter; DualPipeV only the last: the others' full backward
    gives a partial gradient, reduced. Every event, the memory at each send and receive and
    the peak as a real pipeline rank's; the plan warns, naming the stage and its units."""
    # resharded after forward: stage 1's I finds its groups resharded, and unshards none
    monkeypatch.setitem(pj.CASES, "zero-bubble-4-always", ("InterleavedZeroBubble", 4, "always"))
    real, pipeline, mine = _frozen_run(
        as_rank, monkeypatch, name, rank, ("tok_embeddings", "layers.0")
    )
    stage1 = set(pipeline.stages[1].units)
    reduced = {e.unit for e in mine.iterations[-1] if e.kind == "reduce_scatter"}
    if rank // pj.DP == 1:
        assert stage1 and (stage1 <= reduced) == (name == "dualpipev-4"), reduced
        assert stage1.isdisjoint(reduced) == (name != "dualpipev-4"), reduced
    lost = [w for w in mine.warnings if w.code == "pipeline_frozen_input_lost_gradients"]
    assert len(lost) == 1 and set(lost[0].units) == stage1
    assert f"stage 1's units {', '.join(map(repr, lost[0].units))} get no gradient" in (
        lost[0].message
    )
    mem = memory_model(mine, optimizer=None)
    _same_at_every_event(real, mine.iterations[-1], mem)
    assert real.peak == mem.peak["bytes"]


@pytest.mark.parametrize(
    ("case", "blocks", "batch", "mp"),
    [
        (("InterleavedZeroBubble", 4, "default"), 4, 4, (torch.bfloat16, torch.float32)),
        (("ZBVZeroBubble", 4, "default"), 4, 4, (None, torch.bfloat16)),
        (("ZBVZeroBubble", 2, "default"), 6, 2, (torch.bfloat16, torch.float32)),
    ],
    ids=["zero-bubble-bf16-fp32", "zbv-fp32-bf16", "zbv-2-microbatches-6-blocks"],
)
def test_reduce_grad_adds_the_last_weight_gradient_in_before_it_reshards(
    as_rank: object,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, int, str],
    blocks: int,
    batch: int,
    mp: tuple[Any, Any],
) -> None:
    """A reduce dtype other than the gradients', a split backward: the last ``W`` of a
    stage leaves a new ``.grad`` beside FSDP2's reduce-dtype copy. ``REDUCE_GRAD``'s
    ``post_backward`` adds it into the copy and frees it first
    (``accumulate_unsharded_grad_if_needed``), then reshards (the ``free``), then reduces:
    at the ``free`` the rank holds neither that gradient nor the parameters (stage 2's
    ``layers.3``: its bf16 gradient, 6720 bytes; stage 3's ``norm, output``: its float32
    one, 4160 bytes, which a plan that kept them to the reduction counted there). The add
    is in place across the dtypes, with no cast of the gradient made: with 2 microbatches
    of one sample and 6 blocks the rank's peak (88104 bytes) is the compute before stage
    3's ``REDUCE_GRAD``, not at that add (5184 bytes more)."""
    monkeypatch.setitem(pj.MODEL_ARGS, "n_layers", blocks)
    monkeypatch.setattr(pj, "BATCH", batch)
    monkeypatch.setitem(pj.CASES, "split", case)
    as_rank(0)  # type: ignore[operator]
    _check("split", 0, mp_policy=MixedPrecisionPolicy(*mp))


def test_a_stage_unshard_over_one_rank_copies_as_its_first_action_starts(
    as_rank: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pp 2 x dp 1, ZBVZeroBubble resharding after forward, pipeline rank 0 (stages 0 and
    3): the runtime's ``UNSHARD`` of a stage over a shard group of one rank issues no
    all-gather (``FSDPParamGroup.unshard`` only notes a result); the runtime waits for it
    as the stage's first ``F`` starts (``_assert_unsharded``), where ``wait_for_unshard``
    copies every group's shard into its unsharded parameters at once: at the embedding's
    ``free`` in ``0F0``, ``layers.0`` is unsharded already (13440 bytes, which a plan
    copying it at its own pre-forward left out)."""
    monkeypatch.setattr(pj, "DP", 1)
    monkeypatch.setitem(pj.CASES, "zbv-4-always", _ALWAYS["zbv-4-always"])
    as_rank(0, pj.PP)  # type: ignore[operator]
    _check("zbv-4-always", 0)


@pytest.mark.parametrize(
    ("case", "batch"), [(("GPipe", 1, "always"), 1), (("1F1B", 3, "default"), 3)]
)
def test_a_reduction_keeps_the_last_gradient_in_the_reduce_dtype(
    as_rank: object, monkeypatch: pytest.MonkeyPatch, case: tuple[str, int, str], batch: int
) -> None:
    """pp 3 x dp_shard 2, one block, bf16 parameters reducing in fp32, pipeline rank 0:
    stage 0 holds the embedding alone, one parameter, whose gradient the backward's
    post-backward moved into FSDP2's fp32 copy. ``REDUCE_GRAD``'s ``foreach_reduce`` loops
    over the gradients (``world_size > 1``), its loop variable keeping the last one, here
    all of it, alive past ``unsharded_grads.clear()`` while it allocates the reduce-scatter
    output: in fp32 (4096 bytes), not bf16, the rank's peak (GPipe, one microbatch: 13120
    bytes, not 11072)."""
    monkeypatch.setattr(pj, "PP", 3)
    monkeypatch.setattr(pj, "BATCH", batch)
    monkeypatch.setitem(pj.MODEL_ARGS, "n_layers", 1)
    monkeypatch.setitem(pj.CASES, "embedding", case)
    as_rank(1, 6)  # type: ignore[operator]
    _check("embedding", 0, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32))
