"""The memory model as a user sees it: ``report.memory``, its records, arrays and peak."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.utils.checkpoint import checkpoint

import fsdpviz
from fsdpviz.cost import CATEGORIES, memory_model
from fsdpviz.examples import (
    DecoderLayer,
    ExampleConfig,
    ExampleModel,
    example_analysis,
    example_inputs,
    example_model,
)

POLICY = ModuleWrapPolicy({DecoderLayer})


class Checkpointed(ExampleModel):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        out: torch.Tensor = self.lm_head(self.norm(x))
        return out


@pytest.fixture(scope="module")
def report() -> fsdpviz.Report:
    return example_analysis(world_size=4)


def test_report_memory_has_one_record_per_event(report: fsdpviz.Report) -> None:
    mem = report.memory
    events = report.iterations[1]
    assert [(r["kind"], r["unit"]) for r in mem.records()] == [(e.kind, e.unit) for e in events]
    arrays = mem.arrays()
    assert set(arrays) == {*CATEGORIES, "total", "peak_before"}
    assert all(len(v) == len(events) for v in arrays.values())
    for r in mem.records():
        assert r["total"] == sum(r[c] for c in CATEGORIES)
        assert r["peak_before"] >= r["total"]
    assert mem.peak["bytes"] == max(arrays["peak_before"])
    assert mem.peak["dominant"] == max(mem.peak["breakdown"], key=mem.peak["breakdown"].get)
    assert "per rank" in mem.summary() and mem.peak["where"]
    json.dumps(mem.to_dict())


def test_steps_through_the_schedule(report: fsdpviz.Report) -> None:
    mem = memory_model(report, optimizer=None, iteration=0)
    layer = report.unit("layers.1")
    for r in mem.records():
        if r["unit"] == "layers.1" and r["kind"] == "all_gather" and r["phase"] == "forward":
            gathered = r
        if r["unit"] == "layers.1" and r["kind"] == "free" and r["phase"] == "forward":
            freed = r
    # FSDP1 gathers into the padded FlatParameter; the free releases exactly that.
    assert gathered["unsharded_params"] - freed["unsharded_params"] == layer.padded_numel * 4
    assert freed["activations"] > gathered["activations"]  # the layer saved activations
    last = mem.records()[-1]
    assert last["sharded_grads"] == sum(u.sharded_bytes for u in report.units)
    assert last["unsharded_grads"] == 0 and last["activations"] == 0


def test_optimizer_state_in_the_steady_state_only(report: fsdpviz.Report) -> None:
    shards = sum(u.sharded_bytes for u in report.units)
    for optimizer, states in (("adamw", 2), ("adam", 2), ("sgd_momentum", 1), ("sgd", 0), (3, 3)):
        steady = memory_model(report, optimizer=optimizer)
        assert steady.records()[0]["optimizer"] == states * shards
        assert memory_model(report, optimizer=optimizer, iteration=0).records()[0]["optimizer"] == 0
    assert report.memory.records()[0]["optimizer"] == 2 * shards  # AdamW by default
    with pytest.raises(fsdpviz.ConfigError, match="optimizer='lion' is not known; use one of"):
        memory_model(report, optimizer="lion")
    with pytest.raises(fsdpviz.ConfigError, match="iteration=5 is out of range"):
        memory_model(report, iteration=5)


def test_world_size_and_sharding_strategy() -> None:
    small = example_analysis(world_size=2).memory.peak["breakdown"]["sharded_params"]
    large = example_analysis(world_size=8).memory.peak["breakdown"]["sharded_params"]
    assert small == pytest.approx(4 * large, rel=0.01)
    full = memory_model(example_analysis(world_size=4), optimizer=None)
    keep = memory_model(
        example_analysis(world_size=4, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP),
        optimizer=None,
    )
    assert keep.peak["breakdown"]["unsharded_params"] > full.peak["breakdown"]["unsharded_params"]
    replicated = example_analysis(world_size=4, sharding_strategy=ShardingStrategy.NO_SHARD)
    mem = memory_model(replicated, optimizer=None)
    assert all(r["all_gather"] == 0 and r["unsharded_params"] == 0 for r in mem.records())
    assert mem.records()[0]["sharded_params"] == sum(u.numel * 4 for u in replicated.units)
    assert {r["kind"] for r in mem.records()} == {"all_reduce"}


def test_fsdp2_mixed_precision_and_post_forward_mesh() -> None:
    model, ids = example_model(), example_inputs()
    fp32 = fsdpviz.analyze(model, ids, fully_shard=[DecoderLayer], world_size=4)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    bf16 = fsdpviz.analyze(model, ids, fully_shard=[DecoderLayer], world_size=4, mp_policy=mp)
    a, b = (memory_model(r, optimizer=None).peak["breakdown"] for r in (fp32, bf16))
    assert b["unsharded_params"] * 2 == a["unsharded_params"]
    assert b["activations"] < a["activations"]
    raf2 = fsdpviz.analyze(
        model, ids, fully_shard=[DecoderLayer], world_size=4, reshard_after_forward=2
    )
    after_forward = [
        r["sharded_params"]
        for r in memory_model(raf2, optimizer=None).records()
        if r["kind"] == "free" and r["phase"] == "forward"
    ]
    base = sum(u.sharded_bytes for u in raf2.units)
    # After forward every group (the root too) keeps its parameters sharded over 2 ranks.
    assert after_forward[-1] == base + sum(u.padded_numel * 4 // 2 for u in raf2.units)


def test_resharding_to_the_whole_shard_dimension_is_resharding() -> None:
    """``reshard_after_forward`` equal to the shard dimension's size is ``True`` to torch
    (``_get_post_forward_mesh_info``), also where the mesh replicates: no post-forward
    shard, the memory and time of ``True``."""
    model, ids = example_model(), example_inputs()
    for mesh, n in (((2, 4), 4), ((2, 2), 2)):
        kw: dict[str, Any] = {"fully_shard": [DecoderLayer], "mesh": mesh}
        whole = fsdpviz.analyze(model, ids, reshard_after_forward=n, **kw)
        assert whole.config.post_forward_ranks == {}
        plain = fsdpviz.analyze(model, ids, reshard_after_forward=True, **kw)
        assert whole.memory.to_dict() == plain.memory.to_dict()
        assert whole.timeline.totals == plain.timeline.totals


def test_activation_checkpointing_and_fused_attention() -> None:
    cfg = ExampleConfig()
    ids = example_inputs(cfg)
    with torch.device("meta"):
        plain, ckpt = ExampleModel(cfg), Checkpointed(cfg)
    kept = {}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        rep = fsdpviz.analyze(model, ids, fully_shard=[DecoderLayer], world_size=4)
        records = memory_model(rep, optimizer=None).records()
        kept[name] = max(r["activations"] for r in records if r["phase"] == "forward")
        backward = max(r["activations"] for r in records if r["phase"] == "backward")
        if name == "ckpt":
            assert backward > 0  # recomputed in backward
    assert kept["ckpt"] < kept["plain"] / 4
    # Attention is traced with a fused kernel: activations grow linearly in the sequence.
    short, long = (
        fsdpviz.analyze(
            plain, example_inputs(cfg, seq=s), fully_shard=[DecoderLayer]
        ).profile.modules["layers.0.self_attn"]["saved_bytes"]
        for s in (64, 256)
    )
    assert long / short == pytest.approx(4.0, rel=0.02)


def test_profile_round_trips_and_can_be_absent(report: fsdpviz.Report) -> None:
    again = fsdpviz.Report.from_json(report.to_json())
    assert again.profile == report.profile
    assert again.memory.to_dict() == report.memory.to_dict()
    bare = replace(report, profile=None)
    assert "profile" not in bare.to_dict()
    mem = bare.memory
    assert mem.notes and "no trace profile" in mem.notes[0]
    assert all(r["activations"] == 0 for r in mem.records())
    off = example_analysis(world_size=4, profile=False)
    assert off.profile is None and off.iterations == report.iterations


def test_to_pandas_says_how_to_install(report: fsdpviz.Report) -> None:
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            report.memory.to_pandas()
    else:
        assert len(report.memory.to_pandas()) == len(report.iterations[1])


def test_memory_series_feeds_the_timeline_view(report: fsdpviz.Report) -> None:
    series = fsdpviz.cost.memory_series(report)
    assert len(series) == sum(len(it) for it in report.iterations)
    first = memory_model(report, iteration=0).arrays()["total"]
    assert series[: len(first)] == [float(v) for v in first]
    assert series[len(first) :] == [float(v) for v in report.memory.arrays()["total"]]


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_cpu_offload_keeps_shards_gradients_and_states_off_the_device(api: str) -> None:
    """Under CPU offload the device holds no sharded parameter, sharded gradient or optimizer
    state at any moment; each unit's shard comes over as an ``h2d`` copy of its bytes (held
    on the device until its all-gather, then freed) and its gradient shard leaves as a
    ``d2h`` copy; the time model moves both at the machine's PCIe rate."""
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy

    from fsdpviz.cost import machine, timeline

    if api == "FSDP1":
        plain = {"auto_wrap_policy": POLICY}
        offload: dict[str, object] = {**plain, "cpu_offload": CPUOffload(offload_params=True)}
    else:
        plain = {"fully_shard": [DecoderLayer]}
        offload = {**plain, "offload_policy": CPUOffloadPolicy(pin_memory=False)}
    cfg = ExampleConfig()
    base = fsdpviz.analyze(example_model(cfg), example_inputs(cfg), world_size=4, **plain)
    off = fsdpviz.analyze(example_model(cfg), example_inputs(cfg), world_size=4, **offload)
    assert [u.module for u in off.units] == [u.module for u in base.units]

    records = off.memory.records()
    for c in ("sharded_params", "sharded_grads", "optimizer"):
        # FSDP1 keeps each reduced gradient shard on the device (_saved_grad_shard) beside
        # its host copy until the final callback points .grad at the host copy
        kept = api == "FSDP1" and c == "sharded_grads"
        assert all(r[c] == 0 for r in records) != kept, c
        assert any(r[c] > 0 for r in base.memory.records()), c
    last = dict(zip(CATEGORIES, off.memory.moments[-1].bytes, strict=True))
    assert last["sharded_grads"] == 0
    assert off.memory.peak["bytes"] < base.memory.peak["bytes"]

    # every all-gather right after its unit's h2d copy of the shard (fp32: 4 bytes per
    # element, a quarter of the padded unit on 4 ranks), one d2h per reduce-scatter
    shard = {u.module: u.sharded_numel * 4 for u in off.units}
    assert all(4 * u.sharded_numel == u.padded_numel for u in off.units)
    events = off.iterations[1]
    for i, e in enumerate(events):
        if e.kind == "all_gather":
            assert (events[i - 1].kind, events[i - 1].unit) == ("h2d", e.unit)
    assert [e.unit for e in events if e.kind == "d2h"] == [
        e.unit for e in events if e.kind == "reduce_scatter"
    ]
    m = machine("h100")
    copies = [r for r in timeline(off, m).records() if r["kind"] in ("h2d", "d2h")]
    assert copies and all(r["stream"] == "copy" for r in copies)
    for r in copies:
        assert r["bytes"] == shard[r["unit"]]
        assert r["end"] - r["start"] == pytest.approx(shard[r["unit"]] / (m.pcie_gbps * 1e9))
    # 4 bytes per element at 50 GB/s (PCIe 5 x16): hand-computed for the first unit
    first = copies[0]
    assert m.pcie_gbps == 50.0
    assert first["end"] - first["start"] == pytest.approx(4 * off.units[0].sharded_numel / 50e9)


class _Pair(torch.nn.Module):
    """Takes its input under two names, as ``model(input_ids=ids, labels=ids)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(96, 16)
        self.head = torch.nn.Linear(16, 96)

    def forward(self, input_ids: torch.Tensor, labels: Any = None) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), input_ids.flatten())


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_inputs_that_share_memory_count_once(api: str) -> None:
    ids = torch.randint(0, 96, (2, 33))
    kw: dict[str, Any] = {"fully_shard": [torch.nn.Linear]} if api == "FSDP2" else {}
    cases = {
        "labels": {"input_ids": ids, "labels": ids},
        "views": {"input_ids": ids[:, :-1], "labels": ids[:, 1:]},
        "dict and list": {"input_ids": ids, "labels": {"again": [ids, ids[0]]}},
    }
    for name, inputs in cases.items():
        report = fsdpviz.analyze(_Pair(), inputs, world_size=2, loss=lambda out: out, **kw)
        assert report.profile is not None and report.profile.input_bytes == ids.nbytes, name
        assert report.memory.peak["breakdown"]["inputs"] == ids.nbytes, name


def test_unit_backward_windows_without_a_profile(report: fsdpviz.Report) -> None:
    """A recording has no compute between hook calls: a unit's backward peak runs from its
    pre-backward to its post-backward's last event (its reduce-scatter), with the pre-backward
    events right after it, not to the end of backward. (A unit whose pre-backward issued no
    event, all-gathered ahead by the one before, has no window without a profile.)"""
    bare = replace(report, profile=None)
    records = bare.memory.records()
    checked = 0
    for unit in [u.module for u in bare.units if u.module]:
        starts = [
            i for i, r in enumerate(records)
            if r["hook"] == "pre_backward" and r["hook_unit"] == unit
        ]  # fmt: skip
        if not starts:
            continue
        peak, done = records[starts[0] - 1]["total"], False
        for r in records[starts[0] :]:
            mine = r["hook"].startswith("post_backward") and r["hook_unit"] == unit
            if done and not mine and r["hook"] != "pre_backward":
                break
            done = done or mine
            peak = max(peak, r["peak_before"])
        assert done, unit
        assert bare.memory.unit_peaks[unit]["backward"] == peak, unit
        checked += 1
    assert checked == 3
    assert bare.memory.unit_peaks["layers.3"]["backward"] < bare.memory.peak["bytes"]


@pytest.mark.parametrize("impl", ["foreach", "for_loop", "fused"])
def test_the_optimizer_step_holds_its_states_and_temporaries(
    report: fsdpviz.Report, impl: str
) -> None:
    """After the iteration, ``optimizer.step()``: every shard, its reduced gradient, the states
    and what the implementation makes (torch's default foreach: ``exp_avg_sq.sqrt()`` of every
    shard, one state's bytes; for-loop: a parameter's and its division's; fused: none)."""
    mem = memory_model(report, optimizer=f"adamw_{impl}")
    step = mem.moments[-1]
    assert step.where == "during the optimizer step after"
    got = dict(zip(CATEGORIES, step.bytes, strict=True))
    states = sum(u.sharded_numel * 4 for u in report.units) * 2
    assert got["sharded_grads"] == states // 2 and got["activations"] == 0
    # for-loop: one parameter's sqrt() and its division, the previous one's result still bound
    shards = [u.sharded_numel * 4 for u in report.units]  # FSDP1: the FlatParameters
    loop = max(2 * n + (shards[i - 1] if i else 0) for i, n in enumerate(shards))
    extra = {"foreach": states // 2, "for_loop": loop, "fused": 0}[impl]
    assert got["optimizer"] == states + extra
    assert memory_model(report).moments[-1].bytes == step.bytes or impl != "foreach"
    # the step's memory traffic: fused reads and writes each state once, foreach each
    # operation its own pass
    from fsdpviz.cost import timeline

    fused = timeline(report, optimizer="adamw_fused").totals["optimizer_s"]
    assert timeline(report, optimizer=f"adamw_{impl}").totals["optimizer_s"] == pytest.approx(
        fused * (1 if impl == "fused" else 3)
    )


def test_optimizer_names_say_what_is_known(report: fsdpviz.Report) -> None:
    with pytest.raises(fsdpviz.ConfigError, match=r"_foreach, _fused, _for_loop"):
        memory_model(report, optimizer="adamw_fast")
    # the first iteration's step makes the states
    first = memory_model(report, iteration=0, optimizer="adamw_fused")
    assert first.moments[-2].bytes[CATEGORIES.index("optimizer")] == 0
    assert first.moments[-1].bytes[CATEGORIES.index("optimizer")] > 0


@pytest.mark.parametrize("release", ["2.8", "2.13"])
def test_fsdp2_one_rank_keeps_the_forward_all_gather_buffer_where_torch_gathers(
    release: str,
) -> None:
    """FSDP2 on one rank: torch 2.8 all-gathers all the same and, in forward, keeps each
    group's all-gather output until the next group's copy-out (``wait_for_unshard`` defers
    the free whatever the world size); from 2.9 one rank copies its shard with no all-gather
    and no buffer. The forward peak of every unit holds the previous group's buffer under 2.8
    (the model once freed it wherever the job had one rank; FSDPMemTracker under torch 2.8
    measures every unit's forward peak 3,164,160 B, one block's buffer, above that)."""
    model, ids = example_model(), example_inputs()
    old = fsdpviz.analyze(model, ids, fully_shard=[DecoderLayer], world_size=1,
                          torch_version=release)  # fmt: skip
    mem = memory_model(old, optimizer=None)
    where = "at the copy-out in pre_forward of 'layers.1'"
    held = next(m for m in mem.moments if m.where == where).bytes[CATEGORIES.index("all_gather")]
    gathers = [e for e in old.iterations[0] if e.kind == "all_gather" and e.phase == "forward"]
    if release == "2.8":  # layers.0's buffer beside layers.1's own
        assert len(gathers) == len(old.units)
        assert held == 2 * sum(u.padded_numel for u in old.units if u.module == "layers.0") * 4
    else:
        assert gathers == [] and held == 0


@pytest.mark.parametrize("per_node", [2, 4])
def test_memory_on_other_nodes_notes_the_tp_strategies_as_the_timeline_does(
    per_node: int,
) -> None:
    """A batch of one's sequence-sharded input left to the column-wise linears of a tp group
    of 4: DTensor's mm strategies (and so the collectives and buffers the memory model walks)
    depend on whether torch costs the group within a node. ``memory_model`` on a machine on
    the other side of ``tp <= gpus_per_node`` says so, as ``timeline`` does (the same note),
    and nothing on the report's own machine or one on the same side; the bytes are the
    report's either way (a note, not a refusal: the timeline's)."""
    import tp_models
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    from fsdpviz.cost import machine, timeline

    plan = tp_models.plain_plan()
    plan["layers.*.feed_forward"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=False
    )
    with torch.device("meta"):
        meta = tp_models.Llama(vocab=32, dim=128, n_heads=4, hidden=64)
    report = fsdpviz.analyze(meta, torch.zeros(1, 64, dtype=torch.long),
                             fully_shard=tp_models.LAYERS, parallelize_plan=plan,
                             mesh=("dp", 1, "tp", 4), progress=False,
                             machine=machine("h100", gpus_per_node=per_node))  # fmt: skip
    assert report.config.tp_strategy_gpus_per_node == per_node
    other = machine("h100", gpus_per_node={2: 4, 4: 2}[per_node])  # across tp <= 4
    same = machine("h200", gpus_per_node={2: 3, 4: 16}[per_node])

    def moved(notes: list[str]) -> list[str]:
        return [n for n in notes if "DTensor's mm strategies" in n]

    there = memory_model(report, machine=other)
    assert moved(there.notes) == moved(timeline(report, other).notes)
    assert len(moved(there.notes)) == 1
    assert f"nodes of {other.gpus_per_node} torch costs" in moved(there.notes)[0]
    assert not moved(memory_model(report, machine=same).notes)
    assert not moved(memory_model(report).notes) and not moved(report.memory.notes)
    assert there.peak == memory_model(report, machine=same).peak


def test_a_checkpoint_wrapped_tensor_parallel_model_keeps_its_tp_shares() -> None:
    """FSDP2 x TP on a model whose blocks are inside ``checkpoint_wrapper`` (its tp plan
    naming the wrapper's segment): each tp-sharded parameter's share a rank holds
    (``tp_chunk_shares``, which sizes a ``Partial()`` weight gradient's reduce-scatter) is
    found by the name its unit lists it under, as for the same model unwrapped."""
    import warnings

    import tp_models
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from fsdpviz.cost.grad_sizes import tp_chunk_shares

    def shares(wrapped: bool) -> dict[str, Any]:
        with torch.device("meta"):
            model = tp_models.Llama()
        if wrapped:
            for k in list(model.layers):
                model.layers[k] = checkpoint_wrapper(model.layers[k])
        segment = "._checkpoint_wrapped_module" if wrapped else ""
        blocks = {f"layers.*{segment}.{k}": v for k, v in tp_models.block_plan().items()}
        plan = {**tp_models.top_plan(), **blocks}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = fsdpviz.analyze(model, tp_models.tokens(), fully_shard=tp_models.LAYERS,
                                     mesh=("dp_shard", 2, "tp", 2), parallelize_plan=plan,
                                     progress=False)  # fmt: skip
        return tp_chunk_shares(report)

    plain, wrapped = shares(False), shares(True)
    assert len(plain) == 12
    assert wrapped == plain
