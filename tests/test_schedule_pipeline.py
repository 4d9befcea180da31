"""FSDP2 under pipeline parallelism: the options, each rank's actions, the reports, memory and
time (in one process; tests/test_conformance_pipeline.py checks the schedule against real
torch on gloo ranks)."""

from __future__ import annotations

import warnings
from typing import Any

import pipeline_job as pj
import pytest
import torch
from torch import nn

import fsdpviz
from fsdpviz.plan.pipeline import default_stages, parse_pipeline_options
from fsdpviz.schedule.pipeline_order import rank_actions

BLOCKS = [f"layers.{i}" for i in range(pj.MODEL_ARGS["n_layers"])]
PLAN = ["tok_embeddings", *BLOCKS, ("norm", "output")]


def model() -> nn.Module:
    with torch.device("meta"):
        return pj.model()


def plan(schedule: str = "1F1B", microbatches: int = 4, batch: int = 8, **kw: Any) -> Any:
    ids = torch.zeros(batch, pj.SEQ, dtype=torch.long)
    return fsdpviz.analyze(
        model(),
        ids,
        fully_shard=PLAN,
        mesh=("pp", 2, "dp_shard", 2),
        pipeline_schedule=schedule,
        microbatches=microbatches,
        **kw,
    )


def test_single_stage_schedules_run_their_own_loops_not_torchs_plan() -> None:
    """1F1B's last rank runs forward 0 first; torch's _get_pipeline_order numbers it from 1."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    opts, _ = parse_pipeline_options(
        model(), 8, 2, {"pipeline_schedule": "1F1B", "microbatches": 4}
    )
    actions = rank_actions(opts)
    assert actions[1][:4] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]
    assert actions[1][-1] == "1REDUCE_GRAD"
    planned = [str(a) for a in get_schedule_ops("1F1B", 2, 4)[1] if a is not None]
    assert planned[0] == "1F1"  # the plan torch draws, not what its loop runs
    assert actions[0] == [
        "0F0",
        "0SEND_F0",
        "0F1",
        "0SEND_F1",
        "0RECV_B0",
        "0B0",
        "0F2",
        "0SEND_F2",
        "0RECV_B1",
        "0B1",
        "0F3",
        "0SEND_F3",
        "0RECV_B2",
        "0B2",
        "0RECV_B3",
        "0B3",
        "0REDUCE_GRAD",
    ]


def test_multi_stage_schedules_run_torchs_lowered_actions() -> None:
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    for name in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"):
        opts, _ = parse_pipeline_options(
            model(), 8, 2, {"pipeline_schedule": name, "microbatches": 4}
        )
        ops = get_schedule_ops(name, 2, 4, with_comms=True)
        assert rank_actions(opts) == {r: [str(a) for a in ops[r]] for r in range(2)}, name
    actions = rank_actions(
        parse_pipeline_options(
            model(), 8, 2, {"pipeline_schedule": "Interleaved1F1B", "microbatches": 4}
        )[0]
    )
    assert actions[0][:2] == ["0UNSHARD", "2UNSHARD"]
    assert actions[0].index("2REDUCE_GRAD") < actions[0].index("0REDUCE_GRAD")


def test_torchtitans_split_of_the_layers() -> None:
    """``_generate_llm_fqn_per_model_part``: the embedding and the output count as a layer;
    the first stages take a layer more where they do not divide."""
    m = model()
    warned: list[Any] = []
    assert default_stages(m, 2, warned) == [
        ["tok_embeddings", "layers.0", "layers.1"],
        ["layers.2", "layers.3", "norm", "output"],
    ]
    assert not warned
    assert default_stages(m, 4, warned) == [
        ["tok_embeddings", "layers.0"],
        ["layers.1", "layers.2"],
        ["layers.3"],
        ["norm", "output"],
    ]
    assert [w.code for w in warned] == ["uneven_stages"]


def test_each_rank_reports_its_stages_and_every_microbatch() -> None:
    report = plan("1F1B", 4)
    pipe = report.pipeline
    assert pipe is not None and pipe.schedule == "1F1B" and pipe.microbatches == 4
    assert [s.rank for s in pipe.stages] == [0, 1]
    assert [u.module for u in report.units] == ["tok_embeddings", *BLOCKS, "norm, output"]
    rank1 = pipe.ranks[1]
    assert [u.module for u in rank1.units] == ["layers.2", "layers.3", "norm, output"]
    assert rank1.config.pp_rank == 1 and rank1.config.world_size == 4
    assert report.config.mesh == {"pp": 2, "dp_shard": 2}
    assert report.config.parallel_dims.dp_replicate == 1
    steady = rank1.iterations[1]
    # resharded after each forward (fully_shard's default), never after a backward (the stage
    # turns that off): gathered again in each microbatch's backward, and reduced once
    gathers = [e for e in steady if e.kind == "all_gather" and e.unit == "layers.2"]
    assert [(e.phase, e.microbatch) for e in gathers] == [
        ("forward", 0),
        ("backward", 0),
        ("backward", 1),
        ("backward", 2),
        ("backward", 3),
    ]
    reduced = [e for e in steady if e.kind == "reduce_scatter"]
    assert [e.unit for e in reduced] == ["layers.2", "layers.3", "norm, output"]
    assert {e.action for e in reduced} == {"1REDUCE_GRAD"}
    assert [e.action for e in steady if e.pipeline][:2] == ["1RECV_F0", "1SEND_B0"]
    # the first step begins with the stages' shape inference: events with no action
    assert steady != rank1.iterations[0] and rank1.iterations[0][0].action is None
    assert report.iterations[1] == pipe.ranks[0].iterations[1] + steady
    again = fsdpviz.Report.from_json(report.to_json())
    assert again.to_dict() == report.to_dict()
    assert again.pipeline is not None and again.pipeline.ranks[1].pipeline is not None
    assert again.pipeline.ranks[1].pipeline.job is again


def test_memory_holds_the_microbatches_in_flight() -> None:
    """GPipe keeps every microbatch's activations until its backward; 1F1B keeps at most as
    many as stages after the rank's; gradients accumulate in place, one copy."""
    gpipe, one = plan("GPipe", 4), plan("1F1B", 4)
    act = [r.memory.peak["breakdown"]["activations"] for r in gpipe.pipeline.ranks]  # type: ignore[union-attr]
    act_1f1b = [r.memory.peak["breakdown"]["activations"] for r in one.pipeline.ranks]  # type: ignore[union-attr]
    assert act_1f1b[0] < act[0] and act_1f1b[1] < act[1]
    mem = one.memory
    worst = max(one.pipeline.ranks, key=lambda r: r.memory.needed)  # type: ignore[union-attr]
    assert mem.peak["bytes"] == worst.memory.peak["bytes"]
    assert mem.peak["pp_rank"] == worst.config.pp_rank and "pipeline rank" in mem.peak["where"]
    rank = one.pipeline.ranks[0]  # type: ignore[union-attr]
    grads = max(r["unsharded_grads"] for r in rank.memory.records())
    assert grads == sum(u.numel * 4 for u in rank.units)  # float32, one copy


def test_time_has_bubbles_and_more_microbatches_shrink_them() -> None:
    few, many = plan("GPipe", 2).timeline, plan("GPipe", 8, batch=16).timeline
    for tl in (few, many):
        assert tl.totals["bubble_s"] > 0
        assert sum(b["waited_s"] for b in tl.bubbles()) == pytest.approx(tl.totals["bubble_s"])
    share = [t.totals["bubble_s"] / (2 * t.totals["step_s"]) for t in (few, many)]
    assert share[1] < share[0]
    first = many.bubbles()[0]
    assert first["reason"].startswith(f"rank {first['rank']} waits ")
    assert "pipeline bubbles" in many.bottleneck_table()
    report = plan("1F1B", 4)
    tl = report.timeline
    ranks = [r.timeline for r in report.pipeline.ranks]  # type: ignore[union-attr]
    assert tl.totals["step_s"] == max(r.totals["step_s"] for r in ranks)
    assert tl.totals["bubble_s"] == pytest.approx(sum(r.totals["bubble_s"] for r in ranks))


def test_pipeline_option_errors() -> None:
    m, ids = model(), torch.zeros(8, pj.SEQ, dtype=torch.long)
    mesh = ("pp", 2, "dp_shard", 2)
    with pytest.raises(fsdpviz.ConfigError, match="'pp' dimension must be the first"):
        fsdpviz.analyze(m, ids, fully_shard=PLAN, mesh=("dp_shard", 2, "pp", 2))
    with pytest.raises(fsdpviz.ConfigError, match="Unknown schedule name '1f2b'"):
        fsdpviz.analyze(m, ids, fully_shard=PLAN, mesh=mesh, pipeline_schedule="1f2b")
    with pytest.raises(fsdpviz.ConfigError, match="does not split into 3 microbatches"):
        fsdpviz.analyze(m, ids, fully_shard=PLAN, mesh=mesh, microbatches=3)
    with pytest.raises(fsdpviz.FSDPConfigError, match="must be greater than or equal"):
        fsdpviz.analyze(m, ids, fully_shard=PLAN, mesh=mesh, microbatches=1)
    with pytest.raises(fsdpviz.ConfigError, match="planned with FSDP2"):
        fsdpviz.analyze(m, ids, mesh=mesh)
    # every group (a stage's blocks too) set not to unshard in backward: torch fails there
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"'layers\.0', whose backward reads"):
        fsdpviz.analyze(m, ids, fully_shard=PLAN, mesh=mesh, unshard_in_backward=False)
    with pytest.raises(fsdpviz.ConfigError, match=r"did you mean 'layers\.3'"):
        fsdpviz.analyze(
            m, ids, fully_shard=PLAN, mesh=mesh, pipeline_stages=[["tok_embeddings"], ["layers.33"]]
        )
    with pytest.raises(fsdpviz.ConfigError, match="in stage 0 and stage 1"):
        fsdpviz.analyze(
            m,
            ids,
            fully_shard=PLAN,
            mesh=mesh,
            pipeline_stages=[["tok_embeddings", "layers.0"], ["layers.0"]],
        )
    with pytest.raises(
        fsdpviz.ConfigError, match="single-stage schedule needs exactly 1 stage per rank"
    ):
        fsdpviz.analyze(m, ids, fully_shard=PLAN, mesh=mesh, pipeline_stages=1)

    class Listed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    with pytest.raises(fsdpviz.ConfigError, match="ModuleList"):
        fsdpviz.analyze(Listed(), torch.zeros(4, 4), fully_shard=[nn.Linear], mesh=mesh)


def test_pipeline_warnings() -> None:
    report = plan("Interleaved1F1B", 2)
    codes = [w.code for w in report.warnings]
    assert "few_microbatches" in codes and "uneven_stages" in codes
    stages = [["tok_embeddings", *BLOCKS[:2]], BLOCKS[2:]]
    dropped = plan("1F1B", 2, pipeline_stages=stages)
    missing = next(w for w in dropped.warnings if w.code == "modules_in_no_stage")
    assert missing.units == ["norm", "output"]
    older = plan("1F1B", 2, torch_version="2.8")
    assert "pipeline_installed_torch" in [w.code for w in older.warnings]
    assert "pipeline_installed_torch" not in [w.code for w in dropped.warnings]


def test_torchtitan_jobs_with_pipeline_parallelism() -> None:
    job = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": 4, "seq_len": 64},
        "parallelism": {
            "data_parallel_shard_degree": 2,
            "pipeline_parallel_degree": 2,
            "pipeline_parallel_schedule": "Interleaved1F1B",
            "pipeline_parallel_microbatch_size": 1,
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = fsdpviz.from_torchtitan(job).config
    assert config["mesh"] == ("pp", 2, "dp_shard", 2)
    assert config["pipeline_schedule"] == "Interleaved1F1B" and config["microbatches"] == 4
    assert (
        len(config["pipeline_stages"]) == 4 and config["pipeline_stages"][0][0] == "tok_embeddings"
    )
    assert set(config["reshard_after_forward"].values()) == {False}  # "default" under PP
    old = {  # torchtitan of 2024: [experimental], split points, microbatches
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"batch_size": 4, "seq_len": 64, "data_parallel_shard_degree": 2},
        "experimental": {
            "pipeline_parallel_degree": 2,
            "pipeline_parallel_split_points": ["layers.3"],
        },
    }
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always")
        old_job = fsdpviz.from_torchtitan(old)
    assert any("pipeline_parallel_split_points is read as" in str(n.message) for n in notes)
    stages = old_job.config["pipeline_stages"]
    assert stages[0] == ["tok_embeddings", "layers.0", "layers.1", "layers.2"]
    assert stages[1][-2:] == ["norm", "output"] and old_job.config["microbatches"] == 2
    report = fsdpviz.analyze(old_job.model, old_job.inputs, **old_job.config)
    assert report.pipeline is not None and len(report.pipeline.ranks) == 2


def test_a_four_dimensional_job_shares_tensor_parallelism() -> None:
    """torchtitan's pp x dp x tp mesh: the plan states every dimension, the sends carry one
    tp rank's share of the sequence-parallel activations, tp's collectives their action."""
    job = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": 4, "seq_len": 64},
        "parallelism": {
            "data_parallel_shard_degree": 2,
            "tensor_parallel_degree": 2,
            "pipeline_parallel_degree": 2,
            "pipeline_parallel_microbatch_size": 2,
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        titan = fsdpviz.from_torchtitan(job)
        report = fsdpviz.analyze(titan.model, titan.inputs, **titan.config)
    c = report.config
    assert c.mesh == {"pp": 2, "dp_shard": 2, "tp": 2} and c.world_size == 8
    assert c.parallel_dims.tp == 2 and c.parallel_dims.pp == 2 and c.parallel_dims.dp_replicate == 1
    assert "layers.0.attention.wq" in (c.parallelize_plan or {})
    assert "layers.5.attention.wq" in (c.parallelize_plan or {})  # the last stage's too
    steady = report.pipeline.ranks[0].iterations[1]  # type: ignore[union-attr]
    send = next(e for e in steady if e.kind == "pp_send")
    assert send.nbytes == 2 * 64 * 256 * 2 // 2  # microbatch x seq x dim, bf16, half per tp rank
    tp = [e for e in steady if e.tensor_parallel]
    assert tp and all(e.stage == 0 and e.action is not None for e in tp)
    # each rank's kernels were traced as one tp rank runs them, and its profile says so: the
    # time model takes them as they are, not a 1/tp share of them again
    assert all(r.profile is not None and r.profile.kernels_tp == 2 for r in report.pipeline.ranks)  # type: ignore[union-attr]


def test_gradients_accumulate_in_the_reduce_dtype() -> None:
    """FSDP2 keeps a no-sync backward's gradient in ``reduce_dtype``: float32 under bfloat16
    compute, twice the bytes, until REDUCE_GRAD reduces it."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    report = plan("1F1B", 4, mp_policy=mp, reshard_after_forward=False)
    rank = report.pipeline.ranks[1]  # type: ignore[union-attr]
    records = rank.memory.records()
    grads = max(r["unsharded_grads"] for r in records)
    assert grads == sum(u.numel * 4 for u in rank.units)  # float32: one copy per unit
    first_reduce = next(i for i, r in enumerate(records) if r["kind"] == "reduce_scatter")
    assert records[first_reduce - 1]["unsharded_grads"] == grads  # all of them, until reduced


def test_pipelines_compare_by_schedule_and_are_not_replayed() -> None:
    one, interleaved = plan("1F1B", 4), plan("Interleaved1F1B", 4)
    cmp = fsdpviz.compare(one, interleaved)
    assert cmp.same_wrapping and cmp.pipeline_differs
    assert cmp.verdict == "same wrapping, different schedule"
    assert cmp.costs["step_s"][0] != cmp.costs["step_s"][1]
    with pytest.raises(fsdpviz.ConfigError, match="a pipeline's plan is not replayed"):
        fsdpviz.replan.replay(one, world_size=8)
    assert one.profiled and not one.pipeline.ranks[0].pipeline.ranks  # type: ignore[union-attr]


def test_a_split_backward_fsdpviz_cannot_trace_counts_whole_backwards_and_says_so() -> None:
    """Under torchtitan's selective checkpointing the stage's split trace fails in its
    weight backward (``W``), a checkpointed region's second backward ("Trying to backward
    an extra time"): that stage's ``I`` and ``W`` are counted as a whole backward's memory,
    and the report says its peak may come out low."""
    from fsdpviz.configs.torchtitan_model import TransformerBlock
    from fsdpviz.schema.checkpointing import SelectiveCheckpoint

    report = plan("ZBVZeroBubble", activation_checkpointing=SelectiveCheckpoint([TransformerBlock]))
    said = [w for r in report.pipeline.ranks for w in r.warnings]
    said = [w for w in said if w.code == "pipeline_split_untraced"]
    assert said and "selective activation checkpoint" in said[0].message
    assert all(r.memory.peak["bytes"] > 0 for r in report.pipeline.ranks)


def test_each_stage_runs_the_float8_recipe_asked_for() -> None:
    """``rowwise_with_gw_hp`` computes the weight's gradient in bf16 (slower than rowwise's
    float8 multiply) without casting its operands (less memory than rowwise's casts)."""
    rowwise = plan(float8={"recipe_name": "rowwise"})
    high = plan(float8={"recipe_name": "rowwise_with_gw_hp"})
    assert high.timeline.totals["matmul_s"] > rowwise.timeline.totals["matmul_s"]
    assert high.memory.peak["bytes"] < rowwise.memory.peak["bytes"]


def test_ignored_params_are_said_to_be_left_out_of_a_ranks_memory() -> None:
    """A pipeline rank's memory does not count the parameters FSDP leaves whole: the report
    says so, naming them, rather than a peak that is silently low."""
    m = model()
    ids = torch.zeros(8, pj.SEQ, dtype=torch.long)
    report = fsdpviz.analyze(m, ids, fully_shard=PLAN, mesh=("pp", 2, "dp_shard", 2),
                             pipeline_schedule="1F1B", microbatches=4,
                             ignored_params={m.norm.weight})  # fmt: skip
    said = [w for w in report.warnings if w.code == "pipeline_ignored_params_not_counted"]
    assert len(said) == 1 and "ignored_params (norm.weight)" in said[0].message
    assert "pipeline_ignored_params_not_counted" not in [w.code for w in plan().warnings]


def test_sequence_parallel_makes_each_stages_frozen_norms_trainable() -> None:
    """A pipeline of two stages under torchtitan's tp plan, everything but the output
    projection frozen: ``SequenceParallel`` makes each stage's norms trainable, as
    ``parallelize_module`` does (``nn.Parameter`` requires grad), and each stage warns of
    its own (the pipeline said nothing); the model passed in keeps its norms frozen."""
    from fsdpviz.configs.torchtitan_plan import tp_plan

    m = model()
    for name, p in m.named_parameters():
        p.requires_grad_(name.startswith("output"))
    ids = torch.zeros(8, pj.SEQ, dtype=torch.long)
    report = fsdpviz.analyze(m, ids, fully_shard=PLAN, mesh=("pp", 2, "dp_shard", 1, "tp", 2),
                             parallelize_plan=tp_plan(False), pipeline_schedule="1F1B",
                             microbatches=2, progress=False)  # fmt: skip
    texts = [w.message for w in report.warnings if w.code == "tp_unfreezes"]
    assert len(texts) == 2
    assert "layers.0.attention_norm.weight" in texts[0] and "norm.weight" in texts[1]
    assert not any(p.requires_grad for name, p in m.named_parameters() if "norm" in name)


def test_a_frozen_first_stage_is_planned_and_warned_where_it_loses_gradients() -> None:
    """Stage 0's parameters all frozen (fine-tuning above frozen embeddings): torch runs it
    and fsdpviz plans it (its output needs no gradient, so the next stage sends none, stage
    0's backward computes nothing and its ``REDUCE_GRAD`` frees without a reduce-scatter;
    against a real rank in ``test_cost_pipeline_memory``). Under a zero-bubble schedule
    stage 1 is then not trained (``stage_backward_input`` finds no input that needs a
    gradient: no autograd, no parameter group, so ``W`` computes none): ZBVZeroBubble and
    InterleavedZeroBubble split every microbatch of stage 1, which gets no reduce-scatter;
    DualPipeV splits only its last microbatch (1I3), whose gradient is lost, the others'
    reduced. torch loses those gradients silently; fsdpviz plans it so and warns, saying
    which stage, units and microbatches and what to change."""
    m = model()
    ids = torch.zeros(8, pj.SEQ, dtype=torch.long)
    kw: dict[str, Any] = {"fully_shard": PLAN, "mesh": ("pp", 2, "dp_shard", 2),
                          "microbatches": 4}  # fmt: skip
    m.tok_embeddings.requires_grad_(False)
    m.layers["0"].requires_grad_(False)
    m.layers["1"].requires_grad_(False)
    report = fsdpviz.analyze(m, ids, **kw)
    assert report.pipeline is not None
    stage0 = set(report.pipeline.stages[0].units)
    for rank in report.pipeline.ranks:
        for events in rank.iterations:
            assert not any(e.kind == "reduce_scatter" and e.unit in stage0 for e in events)
            # no gradient passes between stages 0 and 1
            assert not any(e.group == "pp" and e.phase == "backward" for e in events)
    assert not any(w.code == "pipeline_frozen_input_lost_gradients" for w in report.warnings)
    m.layers["1"].requires_grad_(True)  # V placement, 4 stages: stage 0 is layers.0's
    for schedule, lost in [("ZBVZeroBubble", "any microbatch: they are never trained"),
                           ("InterleavedZeroBubble", "any microbatch: they are never trained"),
                           ("DualPipeV", "microbatch 3 (only 0, 1, 2, whose backward is whole, "
                            "do: the reduced gradient is partial)")]:  # fmt: skip
        report = fsdpviz.analyze(m, ids, **kw, pipeline_schedule=schedule)
        assert report.pipeline is not None
        stage1 = set(report.pipeline.stages[1].units)
        (w,) = [w for w in report.warnings if w.code == "pipeline_frozen_input_lost_gradients"]
        assert set(w.units) == stage1 and stage1
        assert f"{schedule}: pipeline stage 0 (tok_embeddings, layers.0) has no trainable" in (
            w.message
        )
        assert "splits stage 1's backward" in w.message and lost in w.message
        assert "loses those gradients silently" in w.message
        assert "(1F1B, Interleaved1F1B" in w.message
        reduced = {e.unit for e in report.iterations[-1] if e.kind == "reduce_scatter"}
        assert (stage1 <= reduced) == (schedule == "DualPipeV"), reduced
        assert stage1.isdisjoint(reduced) == (schedule != "DualPipeV"), reduced


@pytest.mark.parametrize("precompute", [False, True], ids=["dynamic", "precomputed"])
def test_float8_all_gather_amaxes_in_each_stage(precompute: bool) -> None:
    """FSDP2's float8 all-gather under pipeline parallelism: a stage's all-gather from the
    sharded state reduces each of its float8 weights' amaxes first (see [Note: float8
    all-gather amaxes]), one ``all_reduce`` over the shard group a weight; with precomputed
    scales the steady step's all-gathers reduce none (the rank's replay planned none), and
    each step ends with the precomputation's one all-reduce of every weight's amax per stage."""
    from fsdpviz.cost.sizes import float8_gathered

    spec = {"enable_fsdp_float8_all_gather": True,
            "precompute_float8_dynamic_scale_for_fsdp": precompute}  # fmt: skip
    report = plan(float8=spec, progress=False)
    weights = float8_gathered(report)
    for k, events in enumerate(report.iterations):
        run: list[str] = []
        for e in events:
            if e.group == "shard" and e.module is None:  # the precomputation's
                assert e.stage is not None and e.kind == "all_reduce"
            elif e.group == "shard":
                assert e.module in weights[e.unit] and (e.nbytes, e.dtype) == (4, "float32")
                run.append(e.module or "")
            elif e.kind == "all_gather" and run:
                assert sorted(run) == sorted(weights[e.unit])
                run = []
        assert not run
        reduced = sum(e.group == "shard" and e.module is not None for e in events)
        assert reduced == 0 if precompute and k > 0 else reduced > 0
        precomputed = sum(e.group == "shard" and e.module is None for e in events)
        assert report.pipeline is not None  # every rank's events: each stage's precomputation
        assert precomputed == (len(report.pipeline.stages) if precompute else 0)


@pytest.mark.parametrize(
    "mp", [(None, None), (torch.bfloat16, torch.float32), (None, torch.bfloat16)]
)
def test_micro_step_memory_of_a_pipeline_rank(mp: tuple[Any, Any]) -> None:
    """A pipeline rank's report under ``grad_accum=2``: each ``step()`` reduces its gradients
    in full, where a micro-step's memory on its own reduces only as the last does; the
    micro-steps walked once give what ``memory_model`` gives each of them."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from fsdpviz.cost import memory_model
    from fsdpviz.cost.memory import micro_step_memory

    report = plan(grad_accum=2, mp_policy=MixedPrecisionPolicy(*mp))
    for rank in (report, *report.pipeline.ranks):
        n = len(rank.iterations)
        each = micro_step_memory(rank, optimizer="sgd", iteration=n - 1)
        alone = [memory_model(rank, optimizer="sgd", iteration=k) for k in (n - 2, n - 1)]
        assert [m.to_dict() for m in each] == [m.to_dict() for m in alone]


def test_a_stages_mm_strategies_are_picked_for_the_machines_nodes() -> None:
    """A batch of one's sequence-sharded feed-forward input (each microbatch one sample)
    left to its column-wise linears: DTensor's mm strategies for tp 4 depend on whether
    torch costs the group within a node. Without a machine they are picked for nodes of 8
    (warned); on nodes of 2 for those, unwarned; the job's and each rank's config say which,
    and a timeline or a memory model on the other side of tp <= nodes says its strategies
    are not torch's."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    from fsdpviz.configs.torchtitan_model import Transformer
    from fsdpviz.cost import machine, memory_model, timeline

    plan: dict[str, object] = {}
    for i in range(2):
        ff = f"layers.{i}.feed_forward"
        plan[ff] = PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
            use_local_output=False,
        )  # fmt: skip
        plan[f"{ff}.w1"] = plan[f"{ff}.w3"] = ColwiseParallel()
        plan[f"{ff}.w2"] = RowwiseParallel()
    args = {"dim": 128, "n_layers": 2, "n_heads": 4, "vocab_size": 32, "multiple_of": 16,
            "ffn_dim_multiplier": 0.18}  # fmt: skip
    with torch.device("meta"):
        model = Transformer(args, 64)
    nodes = machine("h100", gpus_per_node=4)
    for given, planned in ((None, 8), (machine("h100", gpus_per_node=2), 2)):
        report = fsdpviz.analyze(
            model, torch.zeros(2, 64, dtype=torch.long), fully_shard=["layers.0", "layers.1"],
            parallelize_plan=plan, mesh=("pp", 2, "dp", 1, "tp", 4), pipeline_schedule="1F1B",
            microbatches=2, progress=False, **({} if given is None else {"machine": given}),
        )  # fmt: skip
        assert report.pipeline is not None
        configs = [report.config, *(r.config for r in report.pipeline.ranks)]
        assert [c.tp_strategy_gpus_per_node for c in configs] == [planned] * 3
        assumed = [w for w in report.warnings if w.code == "tp_topology_assumed"]
        assert bool(assumed) == (given is None)
        moved = [n for n in timeline(report, nodes).notes if "DTensor's mm strategies" in n]
        assert len(moved) == (planned == 2)
        # the memory model notes it too, of the job (its largest rank) and of each rank
        for r in (report, *report.pipeline.ranks):
            notes = memory_model(r, machine=nodes).notes
            assert [n for n in notes if "DTensor's mm strategies" in n] == moved


def test_zero_bubble_refuses_a_stage_resharded_between_input_and_weight_backward() -> None:
    """InterleavedZeroBubble with 3 stages per rank runs a forward of stage 3 (``3F2``)
    between the input backward ``3I1``, which began with the stage gathered, and its weight
    backward ``3W1``: resharded after that forward, the stage's ``submod.parameters()`` are
    the sharded ones there, and torch's ``stage_backward_weight`` fails to find the weights
    of I's graph among them (``KeyError: <AccumulateGrad>``; under activation checkpointing
    W's recompute fails first, on the sharded parameters). With the parameters kept
    gathered, or on 2 stages per rank, it plans."""
    from fsdpviz.configs.torchtitan_model import TransformerBlock

    stages = pj.split(6)  # one block a stage: 3 stages per rank
    for extra in ({}, {"activation_checkpointing": [TransformerBlock]}):
        with pytest.raises(fsdpviz.FSDPConfigError) as caught:
            plan("InterleavedZeroBubble", 4, batch=4, pipeline_stages=stages,
                 reshard_after_forward=True, **extra)  # fmt: skip
        message = str(caught.value)
        assert message.startswith("InterleavedZeroBubble on pipeline rank 1: torch fails at 3W1")
        assert "KeyError: <AccumulateGrad ...> in torch.distributed.pipelining._backward" in message
        assert "found 'layers.2' gathered, and 3F2, a forward of the same stage" in message
        assert "reshard_after_forward=False" in message
    kept = plan("InterleavedZeroBubble", 4, batch=4, pipeline_stages=stages,
                reshard_after_forward=False)  # fmt: skip
    assert kept.pipeline is not None and len(kept.pipeline.stages) == 6
    two = plan("InterleavedZeroBubble", 4, batch=4, reshard_after_forward=True)  # 2 a rank
    assert two.pipeline is not None and len(two.pipeline.stages) == 4
    assert any(w.code == "pipeline_lost_gradients" for w in two.warnings)
