"""Configurations side by side: replays equal fresh analyses, sweeps reuse traces."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from typing import Any

import pytest
import torch
import tp_models
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.replan import replay

CONFIG = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=250, num_heads=4)
POLICY = ModuleWrapPolicy({DecoderLayer})
PRE, POST = BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST
SS = ShardingStrategy.__members__


def _analyze(**kwargs: Any) -> fsdpviz.Report:
    return fsdpviz.analyze(example_model(CONFIG), example_inputs(CONFIG), **kwargs)


def _same(a: fsdpviz.Report, b: fsdpviz.Report) -> None:
    assert [u.to_dict() for u in a.units] == [u.to_dict() for u in b.units]
    assert a.forward_order == b.forward_order
    assert [[e.to_dict() for e in it] for it in a.iterations] == [
        [e.to_dict() for e in it] for it in b.iterations
    ]
    assert a.profile is not None and b.profile is not None
    assert [s.event_hook for s in a.profile.iterations] == [
        s.event_hook for s in b.profile.iterations
    ]
    assert a.memory.to_dict()["peak"] == b.memory.to_dict()["peak"]


@pytest.mark.parametrize("use_orig_params", [False, True])
def test_fsdp1_replay_equals_analyze(use_orig_params: bool) -> None:
    base = _analyze(auto_wrap_policy=POLICY, world_size=4, use_orig_params=use_orig_params)
    strategies = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
    grid = itertools.product([1, 3, 16], [PRE, POST, None], strategies)
    for ws, bp, strategy in grid:
        kw = {"world_size": ws, "backward_prefetch": bp, "sharding_strategy": SS[strategy]}
        if strategy == "HYBRID_SHARD" and ws % 8:
            continue
        fresh = _analyze(auto_wrap_policy=POLICY, use_orig_params=use_orig_params, **kw)
        _same(fresh, replay(base, **kw))


@pytest.mark.parametrize("mp", [None, MixedPrecision(param_dtype=torch.bfloat16)])
def test_an_offloaded_fsdp1_replay_equals_analyze(mp: MixedPrecision | None) -> None:
    """CPU offload's host-to-device copies (and, under parameter mixed precision, one on
    every unshard) and device-to-host copies of the gradient shards are the replayed plan's
    as much as the traced one's."""
    common: dict[str, Any] = {
        "cpu_offload": CPUOffload(offload_params=True), "mixed_precision": mp,
    }  # fmt: skip
    base = _analyze(auto_wrap_policy=POLICY, world_size=4, **common)
    for ws, strategy, bp in itertools.product([4, 16], ["FULL_SHARD", "SHARD_GRAD_OP"], [PRE]):
        kw = {"world_size": ws, "sharding_strategy": SS[strategy], "backward_prefetch": bp}
        _same(_analyze(auto_wrap_policy=POLICY, **common, **kw), replay(base, **kw))
    root_only = _analyze(world_size=8, **common)
    kw = {"sharding_strategy": SS["SHARD_GRAD_OP"]}
    _same(_analyze(world_size=8, **common, **kw), replay(root_only, **kw))


def test_fsdp2_replay_equals_analyze() -> None:
    calls = [DecoderLayer, ("embed_tokens", "lm_head")]
    base = _analyze(fully_shard=calls, world_size=4)
    for ws, raf in itertools.product([2, 8], [True, False, 2, {"layers.1": False}]):
        fresh = _analyze(fully_shard=calls, world_size=ws, reshard_after_forward=raf)
        _same(fresh, replay(base, world_size=ws, reshard_after_forward=raf))
    prefetch = {
        "forward_prefetch": {"layers.0": ["layers.1"]},
        "backward_prefetch": {"layers.3": ["layers.1"]},
    }
    _same(_analyze(fully_shard=calls, world_size=4, **prefetch), replay(base, **prefetch))


def test_a_replay_keeps_what_is_not_unsharded_in_backward() -> None:
    """A plan whose embedding is not gathered in backward (``unshard_in_backward``) replayed
    with other world sizes, resharding, accumulation: the report, memory and timeline a fresh
    analyze gives. A change of the option, or a resharding that frees the embedding after
    forward where the trace kept it, needs a new trace (what its backward reads)."""
    calls: dict[str, Any] = {
        "fully_shard": ["embed_tokens", DecoderLayer],
        "unshard_in_backward": {"embed_tokens": False},
    }
    base = _analyze(**calls, world_size=4)
    assert not any(
        e.unit == "embed_tokens" and e.kind == "all_gather" and e.phase == "backward"
        for e in base.iterations[1]
    )
    for changes in [
        {"world_size": 8},
        {"reshard_after_forward": {"embed_tokens": 2}, "grad_accum": 3},
    ]:
        _identical(_analyze(**{**calls, "world_size": 4, **changes}), replay(base, **changes))
    with pytest.raises(fsdpviz.ConfigError, match="unshard_in_backward cannot be replayed"):
        replay(base, unshard_in_backward=True)
    kept = _analyze(**calls, world_size=4, reshard_after_forward={"embed_tokens": False})
    with pytest.raises(fsdpviz.ConfigError, match=r"'embed_tokens' after forward.*trace"):
        replay(kept, reshard_after_forward=True)


def _option_sets(api: str, rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    """A traced configuration and a replayed change, drawn from the options each API
    replays and those it keeps from the trace."""
    pick = rng.choice
    if api == "FSDP1":
        base = {
            "auto_wrap_policy": pick([POLICY, None]), "world_size": pick([4, 8]),
            "use_orig_params": pick([False, True]), "forward_prefetch": pick([False, True]),
            "mixed_precision": pick([None, MixedPrecision(param_dtype=torch.bfloat16)]),
            "cpu_offload": pick([None, CPUOffload(offload_params=True)]),
            "limit_all_gathers": pick([True, False]),
            "sharding_strategy": pick(list(ShardingStrategy)),
            "backward_prefetch": pick([PRE, POST, None]), "grad_accum": pick([1, 2]),
        }  # fmt: skip
        choices: dict[str, list[Any]] = {
            "world_size": [2, 8, 16, 32], "sharding_strategy": list(ShardingStrategy),
            "backward_prefetch": [PRE, POST, None],
            "grad_accum": [1] if base["forward_prefetch"] else [1, 3],
        }  # fmt: skip
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        base = {
            "fully_shard": pick([[DecoderLayer], [DecoderLayer, ("embed_tokens", "lm_head")]]),
            "world_size": pick([4, 8]), "mp_policy": pick([MixedPrecisionPolicy(), mp]),
            "reshard_after_forward": pick([True, False, 2]), "grad_accum": pick([1, 2]),
            **pick([{}, {"offload_policy": CPUOffloadPolicy()}]),
        }  # fmt: skip
        choices = {
            "world_size": [4, 8, 16], "reshard_after_forward": [True, False, 2, {"layers.1": 2}],
            "grad_accum": [1, 3], "offload_policy": [CPUOffloadPolicy()],
        }  # fmt: skip
    changes = {k: pick(v) for k, v in choices.items() if rng.random() < 0.5}
    return base, changes


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_replays_of_drawn_option_sets_equal_analyze(api: str) -> None:
    """Sixteen drawn pairs of a traced configuration and a change: each replay is the
    report, memory and timeline a fresh analyze gives, field for field."""
    rng = random.Random(f"replay {api}")
    for _ in range(16):
        base, changes = _option_sets(api, rng)
        _identical(_analyze(**{**base, **changes}), replay(_analyze(**base), **changes))


def test_an_fsdp2_replay_reads_mesh_as_analyze_does() -> None:
    """A replay reads ``mesh=`` as analyze does: HSDP's dimensions named as given, and a tp
    dimension refused on a plan without ``parallelize_plan``, as analyze refuses it."""
    calls = [DecoderLayer, ("embed_tokens", "lm_head")]
    base = _analyze(fully_shard=calls, world_size=4)
    for mesh in [("dp_replicate", 2, "dp_shard", 4), (2, 4), ("dp_shard", 8)]:
        fresh = _analyze(fully_shard=calls, mesh=mesh)
        got = replay(base, mesh=mesh)
        _same(fresh, got)
        assert got.config.mesh == fresh.config.mesh
    for analyzed in (lambda: _analyze(fully_shard=calls, mesh=("dp_shard", 4, "tp", 2)),
                     lambda: replay(base, mesh=("dp_shard", 4, "tp", 2))):  # fmt: skip
        with pytest.raises(fsdpviz.ConfigError, match="the mesh has a 'tp' dimension"):
            analyzed()


def test_replay_refuses_what_needs_a_new_trace() -> None:
    base = _analyze(auto_wrap_policy=POLICY, world_size=4)
    with pytest.raises(
        fsdpviz.ConfigError, match=r"use_orig_params cannot be replayed.*analyze again"
    ):
        replay(base, use_orig_params=True)
    with pytest.raises(fsdpviz.ConfigError, match="has no trace profile"):
        replay(replace(base, profile=None), world_size=8)


def test_sweep_reuses_one_trace_per_wrap_plan() -> None:
    table = fsdpviz.sweep(
        example_model(CONFIG),
        example_inputs(CONFIG),
        world_size=[8, 64],
        backward_prefetch=[PRE, POST, None],
        policies={"layer": POLICY, "root": None},
        memory_budget="12MiB",
    )
    assert (len(table.rows), table.traces, table.replays) == (12, 2, 10)
    first = table.rows[0]
    assert first["config"] == {
        "policy": "layer",
        "world_size": 8,
        "backward_prefetch": "BACKWARD_PRE",
    }
    assert first["traced"] and not table.rows[1]["traced"]
    for row in table.rows:
        assert row["fits"] == (row["peak_bytes"] <= 12 * 2**20)
        assert row["bytes_moved"] == row["all_gather_bytes"] + row["reduce_scatter_bytes"]
    best = table.best()
    fitting = [r for r in table.rows if r["fits"]]
    assert best in fitting
    assert best["exposed_comm_s"] == min(r["exposed_comm_s"] for r in fitting)
    fresh = _analyze(auto_wrap_policy=POLICY, world_size=64, backward_prefetch=None)
    assert table.rows[5]["peak_bytes"] == fresh.memory.peak["bytes"]
    assert "2 trace(s) and 10 replay(s)" in table.summary()
    json.dumps(table.to_dict())


def test_sweep_over_graph_changing_options_traces_each_value() -> None:
    table = fsdpviz.sweep(
        example_model(CONFIG),
        example_inputs(CONFIG),
        auto_wrap_policy=POLICY,
        world_size=[4, 8],
        forward_prefetch=[False, True],
    )
    assert (table.traces, table.replays) == (2, 2)
    with pytest.raises(fsdpviz.ConfigError, match="no configuration fits"):
        replace(table, budget=1, rows=[{**r, "fits": False} for r in table.rows]).best()


def test_fsdp1_replay_keeps_a_hybrid_plans_shard_group() -> None:
    """A replay keeps the shard group the report was planned with; a new world size gets
    the default group, as analyze without shard_group_size does."""
    hybrid = {"auto_wrap_policy": POLICY, "sharding_strategy": SS["HYBRID_SHARD"]}
    base = _analyze(world_size=16, shard_group_size=4, **hybrid)
    for changes, fresh in [
        ({"backward_prefetch": POST}, {"world_size": 16, "shard_group_size": 4}),
        ({"world_size": 32}, {"world_size": 32}),
        ({"world_size": 32, "shard_group_size": 2}, {"world_size": 32, "shard_group_size": 2}),
    ]:
        expected = _analyze(**hybrid, **{**fresh, **changes})
        got = replay(base, **changes)
        _same(expected, got)
        assert got.config.to_dict() == {**expected.config.to_dict(), "replayed": True}
        assert [w.to_dict() for w in got.warnings] == [w.to_dict() for w in expected.warnings]


def _tp(mesh: tuple[Any, ...] = ("dp_shard", 4, "tp", 2), **kwargs: Any) -> fsdpviz.Report:
    torch.manual_seed(0)
    return fsdpviz.analyze(
        tp_models.Llama(),
        tp_models.tokens(),
        fully_shard=tp_models.LAYERS,
        mesh=mesh,
        parallelize_plan=tp_models.whole_plan(),
        progress=False,
        **kwargs,
    )


def _identical(fresh: fsdpviz.Report, replayed: fsdpviz.Report) -> None:
    """Field for field: the report's JSON (its config aside from ``replayed``), its memory
    report and its timeline."""
    got, expected = json.loads(replayed.to_json()), json.loads(fresh.to_json())
    assert got.pop("config") == {**expected.pop("config"), "replayed": True}
    assert got == expected
    assert replayed.memory.to_dict() == fresh.memory.to_dict()
    assert replayed.timeline.to_dict() == fresh.timeline.to_dict()


HSDP_TP = ("dp_replicate", 2, "dp_shard", 2, "tp", 2)


@pytest.mark.parametrize(
    ("traced", "changes"),
    [
        ({}, {"grad_accum": 4}),
        ({"grad_accum": 4}, {"grad_accum": 1}),
        ({}, {"reshard_after_forward": False}),
        ({"reshard_after_forward": False}, {"reshard_after_forward": True}),
        ({}, {"reshard_after_forward": {"layers.0": False}, "grad_accum": 3}),
        ({"mesh": HSDP_TP, "grad_accum": 2, "reshard_after_backward": False,
          "requires_all_reduce": False}, {"grad_accum": 4}),
        ({"mesh": HSDP_TP}, {"offload_policy": CPUOffloadPolicy(), "grad_accum": 2}),
        ({}, {"forward_prefetch": {"layers.0": ["layers.1"]},
              "backward_prefetch": {"layers.1": ["layers.0"]}}),
    ],
)  # fmt: skip
def test_a_tensor_parallel_replay_equals_analyze(
    traced: dict[str, Any], changes: dict[str, Any]
) -> None:
    """Resharding, prefetching, offloading and accumulation replay on a tp plan: the
    parallel styles' collectives in every micro-step, the partial gradients' all-reduces in
    each reducing post-backward, FSDP's shards of the tp-local tensors."""
    base = _tp(**traced)
    replayed = replay(base, **changes)
    _identical(_tp(**{**traced, **changes}), replayed)
    kinds = {e.kind for e in replayed.iterations[-1]}
    assert {"tp_all_gather", "tp_reduce_scatter", "tp_all_reduce"} <= kinds


@pytest.mark.parametrize(
    ("traced", "changes"),
    [
        ({}, {"mesh": ("dp_shard", 3, "tp", 2), "grad_accum": 2}),  # padded shards
        ({}, {"mesh": HSDP_TP, "reshard_after_forward": False}),
        ({"mesh": HSDP_TP, "grad_accum": 2}, {"mesh": (16, 2), "reshard_after_forward": False}),
    ],
)
def test_a_tensor_parallel_replay_changes_the_data_parallel_mesh(
    traced: dict[str, Any], changes: dict[str, Any]
) -> None:
    """The dp dimensions decide nothing the trace records (FSDP's hooks are called alike,
    the tp-local activations and collectives are the same): FSDP's shards of the tp-local
    tensors and its collectives' ranks are recomputed, as analyze plans them."""
    base = _tp(**traced)
    replayed = replay(base, **changes)
    _identical(_tp(**{**traced, **changes}), replayed)
    assert replayed.config.tp_world_size == 2


def test_a_tensor_parallel_replay_keeps_its_tp_dimension() -> None:
    base = _tp()
    with pytest.raises(fsdpviz.ConfigError, match=r"which mesh dimension.*mesh=\('dp_shard'"):
        replay(base, world_size=16)
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"tensor-parallel DTensors"):
        replay(base, reshard_after_forward=2)  # 2 of 4 dp ranks: FSDP2 refuses it for DTensors
    for mesh in [("dp_shard", 2, "tp", 4), None, ("dp_shard", 8)]:
        with pytest.raises(fsdpviz.ConfigError, match=r"call fsdpviz.analyze"):
            replay(base, mesh=mesh)
    # a report whose last iteration does not show a group reducing cannot say which of its
    # parameters' partial gradients are all-reduced first
    last = [e for e in base.iterations[-1] if e.unit != "layers.1" or e.kind != "reduce_scatter"]
    with pytest.raises(fsdpviz.ConfigError, match=r"partial gradients: 'layers.1'"):
        replay(replace(base, iterations=[*base.iterations[:-1], last]), grad_accum=2)


def test_a_sweep_with_tensor_parallelism_traces_once() -> None:
    torch.manual_seed(0)
    tp = {"mesh": ("dp_shard", 4, "tp", 2), "parallelize_plan": tp_models.whole_plan()}
    table = fsdpviz.sweep(
        tp_models.Llama(), tp_models.tokens(), fully_shard=tp_models.LAYERS,
        reshard_after_forward=[True, False], **tp,
    )  # fmt: skip
    assert (table.traces, table.replays) == (1, 1)
    kept = _tp(reshard_after_forward=False)
    assert table.rows[1]["peak_bytes"] == kept.memory.peak["bytes"]
    assert table.rows[1]["step_s"] == kept.timeline.totals["step_s"]


BF16, FP32, FP16 = torch.bfloat16, torch.float32, torch.float16


@pytest.mark.parametrize(
    ("traced", "changes"),
    [
        ({"mixed_precision": MixedPrecision(param_dtype=BF16, reduce_dtype=FP32)},
         {"mixed_precision": MixedPrecision(param_dtype=BF16, reduce_dtype=BF16)}),
        ({"mixed_precision": MixedPrecision(param_dtype=BF16, reduce_dtype=FP32)},
         {"mixed_precision": MixedPrecision(param_dtype=BF16), "grad_accum": 3,
          "world_size": 16, "sharding_strategy": SS["HYBRID_SHARD"]}),
        ({"mixed_precision": MixedPrecision(param_dtype=BF16), "grad_accum": 2,
          "sharding_strategy": SS["NO_SHARD"]},
         {"mixed_precision": MixedPrecision(param_dtype=BF16, reduce_dtype=FP32)}),
        ({"mixed_precision": MixedPrecision(reduce_dtype=FP16), "use_orig_params": True},
         {"mixed_precision": MixedPrecision(reduce_dtype=FP32), "grad_accum": 2}),
        ({"fully_shard": [DecoderLayer],
          "mp_policy": MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=FP32)},
         {"mp_policy": MixedPrecisionPolicy(param_dtype=BF16)}),
        ({"fully_shard": [DecoderLayer], "mp_policy": MixedPrecisionPolicy(param_dtype=BF16)},
         {"mp_policy": MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=FP32),
          "grad_accum": 4, "reshard_after_forward": False}),
        ({"fully_shard": [DecoderLayer], "mesh": (2, 2), "grad_accum": 2,
          "reshard_after_backward": False, "requires_all_reduce": False},
         {"mp_policy": MixedPrecisionPolicy(reduce_dtype=BF16), "grad_accum": 3}),
    ],
    ids=["fsdp1", "fsdp1-accum-hybrid", "fsdp1-no-shard", "fsdp1-orig-params", "fsdp2",
         "fsdp2-accum", "fsdp2-hsdp-accum"],
)  # fmt: skip
def test_a_reduce_dtype_replay_equals_analyze(
    traced: dict[str, Any], changes: dict[str, Any]
) -> None:
    """Another reduce dtype changes what the reductions move and what the gradients take
    (FSDP2's accumulated ones upcast), not the trace: a replay equals a fresh analyze."""
    policy = {} if "fully_shard" in traced else {"auto_wrap_policy": POLICY}
    kw = {"world_size": 4, "progress": False, **policy, **traced}
    base = _analyze(**kw)
    fresh = _analyze(**{**kw, **changes})
    _identical(fresh, replay(base, **changes))
    assert [u.reduce_dtype for u in fresh.units] != [u.reduce_dtype for u in base.units]


@pytest.mark.parametrize(
    ("traced", "changes"),
    [
        ({"mp_policy": MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=FP32)},
         {"mp_policy": MixedPrecisionPolicy(param_dtype=BF16), "grad_accum": 2}),
        # the traced syncing micro-step all-reduced the norms' partial gradients in float32
        ({"mp_policy": MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=FP32), "grad_accum": 2},
         {"mp_policy": MixedPrecisionPolicy(param_dtype=BF16), "grad_accum": 3}),
        ({"mp_policy": MixedPrecisionPolicy(param_dtype=BF16), "grad_accum": 2},
         {"mp_policy": MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=FP32)}),
    ],
)  # fmt: skip
def test_a_tensor_parallel_reduce_dtype_replay_equals_analyze(
    traced: dict[str, Any], changes: dict[str, Any]
) -> None:
    _identical(_tp(**{**traced, **changes}), replay(_tp(**traced), **changes))


def test_a_replay_refuses_precision_that_changes_the_trace() -> None:
    mp = MixedPrecision(param_dtype=BF16, reduce_dtype=FP32)
    base = _analyze(auto_wrap_policy=POLICY, world_size=4, mixed_precision=mp)
    for other in [
        MixedPrecision(param_dtype=FP16, reduce_dtype=FP32),
        MixedPrecision(param_dtype=BF16, reduce_dtype=FP32, cast_forward_inputs=True),
        MixedPrecision(param_dtype=BF16, reduce_dtype=FP32, buffer_dtype=BF16),
    ]:
        with pytest.raises(fsdpviz.ConfigError, match=r"only reduce_dtype.*fsdpviz.analyze"):
            replay(base, mixed_precision=other)
    with pytest.raises(fsdpviz.ConfigError, match=r"_module_classes_to_ignore.*analyze"):
        replay(base, mixed_precision=None)
    # the report states MixedPrecision's other fields where they are not the default
    cast = MixedPrecision(param_dtype=BF16, reduce_dtype=FP32, cast_forward_inputs=True)
    flagged = _analyze(auto_wrap_policy=POLICY, world_size=4, mixed_precision=cast)
    assert flagged.config["mixed_precision"]["cast_forward_inputs"] is True
    assert "cast_forward_inputs" not in base.config["mixed_precision"]
    with pytest.raises(fsdpviz.ConfigError, match=r"changes cast_forward_inputs"):
        replay(flagged, mixed_precision=MixedPrecision(param_dtype=BF16))
    # units FSDP disabled mixed precision for (_module_classes_to_ignore) reduce in their own
    norm = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 8)
    )
    normed = fsdpviz.analyze(
        norm, torch.randn(4, 8), auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
        mixed_precision=mp, world_size=2, progress=False,
    )  # fmt: skip
    assert {w.code for w in normed.warnings} >= {"mixed_precision_override"}
    with pytest.raises(fsdpviz.ConfigError, match=r"disabled mixed precision for some units"):
        replay(normed, mixed_precision=MixedPrecision(param_dtype=BF16))
    plain = _analyze(auto_wrap_policy=POLICY, world_size=4)
    with pytest.raises(fsdpviz.ConfigError, match=r"mixed_precision=None.*analyze"):
        replay(plain, mixed_precision=mp)
    with pytest.raises(fsdpviz.ConfigError, match=r"must be a torch\.distributed\.fsdp\.Mixed"):
        replay(base, mixed_precision="bf16")  # type: ignore[typeddict-item]
    fsdp2 = _analyze(fully_shard=[DecoderLayer], world_size=4)
    for policy in [
        MixedPrecisionPolicy(param_dtype=BF16),
        MixedPrecisionPolicy(output_dtype=FP32),
        MixedPrecisionPolicy(cast_forward_inputs=False),
    ]:
        with pytest.raises(fsdpviz.ConfigError, match=r"mp_policy changes.*call fsdpviz.analyze"):
            replay(fsdp2, mp_policy=policy)
    # the same precision is no change at all
    _identical(fsdp2, replay(fsdp2, mp_policy=MixedPrecisionPolicy()))
