"""Context parallelism together with tensor parallelism (torchtitan's
``context_parallel_degree`` with ``tensor_parallel_degree``): the mesh ``dp_shard x cp x tp``,
FSDP sharding each tp-local parameter over ``dp_shard x cp`` (``dp_shard_cp``), each tp rank
running the ring over the cp group on its own heads of its ``S / cp`` tokens, and the
parallel styles' collectives over the tp group on those ``S / cp`` tokens."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import fsdpviz
from fsdpviz.configs.torchtitan_plan import tp_plan
from fsdpviz.cost import machine, timeline
from fsdpviz.cost.hook_calls import tape
from fsdpviz.cost.topology import spans
from fsdpviz.replan import replay

# torchtitan's debugmodel: dim 256, 16 heads of 16 (keys and values repeated per head)
BATCH, SEQ, LAYERS, DIM, HEADS, HEAD = 2, 256, 6, 256, 16, 16


def _torchtitan(cp: int, tp: int, seq: int = SEQ, ac: str = "none") -> Any:
    job: dict[str, Any] = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": BATCH, "seq_len": seq},
        "parallelism": {"context_parallel_degree": cp, "tensor_parallel_degree": tp},
        "activation_checkpoint": {"mode": ac, "selective_ac_option": "op"},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fsdpviz.from_torchtitan(job, world_size=8)


def _plan(tt: Any, **changes: Any) -> fsdpviz.Report:
    return fsdpviz.analyze(tt.model, tt.inputs, **{**tt.config, **changes}, progress=False)


def _job(cp: int, tp: int, seq: int = SEQ, ac: str = "none") -> fsdpviz.Report:
    return _plan(_torchtitan(cp, tp, seq, ac))


def _events(report: fsdpviz.Report) -> list[dict[str, Any]]:
    return [e.to_dict() for it in report.iterations for e in it]


def test_the_mesh_shards_tp_local_parameters_over_dp_shard_and_cp() -> None:
    report = _job(2, 2)
    cfg = report.config
    assert cfg["mesh"] == {"dp_shard": 2, "cp": 2, "tp": 2}
    assert (cfg.cp_world_size, cfg.tp_world_size, cfg.shard_world_size) == (2, 2, 4)
    assert cfg.world_size == 8
    # FSDP shards each tp-local parameter over dp_shard x cp: the shards of FSDP 4 x TP 2
    alone = _job(1, 2)
    assert alone.config["mesh"] == {"dp_shard": 4, "tp": 2}
    for unit in ("tok_embeddings", "layers.0", "norm, output"):
        mine, theirs = report.unit(unit), alone.unit(unit)
        assert mine.sharded_numel == mine.padded_numel // 4
        assert (mine.padded_numel, mine.sharded_numel) == (
            theirs.padded_numel,
            theirs.sharded_numel,
        )
    assert report.profile is not None and report.profile.tokens == BATCH * SEQ // 2
    # each process group on its mesh dimension: tp the innermost, cp over it, FSDP over both
    # dp_shard and cp (torchtitan's flattened dp_shard_cp); on nodes of two GPUs the tp
    # group stays in a node, the cp group crosses two, FSDP's four
    where = spans(cfg, 2)
    assert (where["tp"].ranks, where["tp"].nodes) == (2, 1)
    assert (where["cp"].dim, where["cp"].ranks, where["cp"].nodes) == ("cp", 2, 2)
    assert (where["shard"].dim, where["shard"].ranks, where["shard"].nodes) == (
        "dp_shard_cp",
        4,
        4,
    )


def test_the_ring_runs_on_the_tp_local_heads_and_tp_on_the_sequence_share() -> None:
    """Ring attention gathers the rank's keys and values of its ``H / tp`` heads and
    ``S / cp`` positions over the cp group; sequence parallelism's all-gathers and
    reduce-scatters move the ``S / cp`` tokens' activations over the tp group."""
    cp, tp = 2, 2
    report = _job(cp, tp)
    events = report.iterations[-1]
    heads = BATCH * (HEADS // tp) * (SEQ // cp) * HEAD  # elements of one of keys, values
    for i in range(LAYERS):
        at = f"layers.{i}.attention"
        ring = [e for e in events if e.module == at and e.context_parallel]
        assert {e.group for e in ring} == {"cp"}
        assert [(e.kind, e.phase, e.nbytes) for e in ring] == [
            ("cp_all_gather", "forward", cp * 2 * heads * 2),
            ("cp_all_gather", "backward", cp * 2 * heads * 2),
        ] + [("cp_all_to_all", "backward", 2 * heads * 4)] * cp
        block = [e for e in events if e.group == "tp" and e.module.startswith(f"layers.{i}.")]
        tokens = BATCH * (SEQ // cp) * DIM * 2  # the sequence share's activations, bf16
        moves = [e for e in block if e.kind in ("tp_all_gather", "tp_reduce_scatter")]
        assert len(moves) == 8 and {e.nbytes for e in moves} == {tokens}
    # FSDP's collectives: over dp_shard x cp, of the tp-local shards
    fsdp = [e for e in events if e.kind in ("all_gather", "reduce_scatter")]
    assert fsdp and {e.group for e in fsdp} == {None}
    # the ring's bytes are half those of context parallelism alone: half the heads
    t, alone = timeline(report, "h100").totals, timeline(_job(cp, 1), "h100").totals
    assert t["cp_bytes"] * tp == pytest.approx(alone["cp_bytes"])
    moved = (cp - 1) / cp * cp * 2 * heads * 2 * 2 + cp * 2 * heads * 4  # per layer
    assert t["cp_bytes"] == pytest.approx(LAYERS * moved)


def test_the_time_model_puts_cp_and_tp_on_their_own_links() -> None:
    """On nodes of two GPUs the tp group (consecutive ranks) stays in its node while the cp
    group crosses to the next: the ring's collectives slow down, the tp ones do not."""
    report = _job(2, 2)

    def durations(t: Any, prefix: str) -> list[float]:
        return [r["end"] - r["start"] for r in t.records() if r["kind"].startswith(prefix)]

    wide, narrow = timeline(report, "h100"), timeline(report, machine("h100", gpus_per_node=2))
    assert {r["stream"] for r in wide.records() if r["kind"].startswith("cp_")} == {"cp"}
    assert {r["stream"] for r in wide.records() if r["kind"].startswith("tp_")} == {"tp"}
    assert durations(narrow, "tp_") == pytest.approx(durations(wide, "tp_"))
    assert all(n > w for n, w in zip(durations(narrow, "cp_"), durations(wide, "cp_"), strict=True))


def test_a_rank_saves_what_tp_saves_of_its_sequence_share() -> None:
    """With every block checkpointed, what a rank saves is what the plan of FSDP x TP saves
    of ``S / cp`` tokens."""

    def saved(report: fsdpviz.Report) -> int:
        calls = tape(report, 0).calls
        return next(
            c for c in calls if c.hook == "post_forward" and c.unit == "norm, output"
        ).activations

    assert saved(_job(2, 2, ac="full")) == saved(_job(1, 2, seq=SEQ // 2, ac="full"))


def test_one_tp_rank_or_one_cp_rank_plans_as_the_other_alone() -> None:
    """A tp dimension of one beside cp plans as context parallelism alone, and a cp
    dimension of one beside tp as FSDP x TP, event for event and byte for byte. (With one tp
    rank the replicated logits are the output projection's share itself, no all-gather
    making them whole: the loss's backward is aten's all the same, as its forward.)"""
    cp_alone = _torchtitan(2, 1)
    one_tp = _plan(
        cp_alone, mesh=("dp_shard", 4, "cp", 2, "tp", 1), parallelize_plan=tp_plan(False)
    )
    base = _plan(cp_alone)
    assert one_tp.config["mesh"] == {"dp_shard": 4, "cp": 2, "tp": 1}
    assert _events(one_tp) == _events(base)
    assert one_tp.memory.to_dict() == base.memory.to_dict()
    assert timeline(one_tp, "h100").totals == timeline(base, "h100").totals
    tp_alone = _torchtitan(1, 2)
    one_cp = _plan(tp_alone, mesh=("dp_shard", 4, "cp", 1, "tp", 2))
    base = _plan(tp_alone, mesh=("dp_shard", 4, "tp", 2))
    assert _events(one_cp) == _events(base)
    assert one_cp.memory.to_dict() == base.memory.to_dict()


def test_the_torchtitan_job_and_what_is_not_modelled() -> None:
    tt = _torchtitan(2, 2)
    assert tt.config["mesh"] == ("dp_shard", 2, "cp", 2, "tp", 2)
    assert "parallelize_plan" in tt.config
    # which heads a rank holds comes from the trace's profile
    with pytest.raises(fsdpviz.ConfigError, match="leave profile=False out"):
        _plan(tt, profile=False)
    job: dict[str, Any] = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": BATCH, "seq_len": SEQ},
        "parallelism": {
            "context_parallel_degree": 2,
            "tensor_parallel_degree": 2,
            "context_parallel_rotate_method": "alltoall",
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rotated = fsdpviz.from_torchtitan(job, world_size=8)
    assert any("'alltoall' is not modelled" in n for n in rotated.config.notes)


@pytest.mark.parametrize(
    ("cp", "tp", "mesh"),
    [
        (2, 1, ("dp_shard", 8, "cp", 2)),
        (2, 1, ("dp_replicate", 2, "dp_shard", 2, "cp", 2)),
        (2, 2, ("dp_replicate", 2, "dp_shard", 1, "cp", 2, "tp", 2)),
    ],
)
def test_a_replay_on_other_data_parallel_dimensions_keeps_the_cp_dimension(
    cp: int, tp: int, mesh: tuple[Any, ...]
) -> None:
    """A replay takes new data-parallel dimensions beside the report's cp (and tp) ones:
    FSDP shards over ``dp_shard x cp``, as the plan analyze gives on that mesh."""
    tt = _torchtitan(cp, tp)
    replayed = replay(_plan(tt), mesh=mesh)
    planned = _plan(tt, mesh=mesh)
    assert [u.to_dict() for u in replayed.units] == [u.to_dict() for u in planned.units]
    assert _events(replayed) == _events(planned)
    mine, theirs = replayed.config.to_dict(), planned.config.to_dict()
    mine.pop("replayed")
    assert mine == theirs
    assert replayed.memory.to_dict()["peak"] == planned.memory.to_dict()["peak"]
    assert replayed.timeline.totals == planned.timeline.totals


def test_a_replay_never_changes_context_parallelism() -> None:
    """The trace ran each rank's share of every sequence and its rings: a replay that
    changes the cp degree, drops it or adds it is refused."""
    cp = _plan(_torchtitan(2, 1))
    for mesh in (("dp_shard", 2, "cp", 4), ("dp_replicate", 2, "dp_shard", 4), None):
        with pytest.raises(fsdpviz.ConfigError, match="context parallelism over"):
            replay(cp, mesh=mesh)
    with pytest.raises(fsdpviz.ConfigError, match="context parallelism over 1 rank"):
        replay(_plan(_torchtitan(2, 2)), mesh=("dp_shard", 4, "tp", 2))
    with pytest.raises(fsdpviz.ConfigError, match="context parallelism over 2 rank"):
        replay(_plan(_torchtitan(1, 1)), mesh=("dp_shard", 4, "cp", 2))
