"""The time model: machine presets and overrides, and what the timeline shows."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import fields, replace
from types import ModuleType

import pytest
from torch.distributed.fsdp import BackwardPrefetch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost import CATEGORIES, Machine, MemoryReport, Timeline, machine, timeline
from fsdpviz.cost.hardware import MachineOverrides, ring_bytes
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.schema.memory import MemoryEvent

POLICY = ModuleWrapPolicy({DecoderLayer})

# Wider layers and more tokens than the default example, so compute and communication
# take comparable time and prefetching matters.
CONFIG = ExampleConfig(hidden_size=1024, intermediate_size=2816, num_layers=6, num_heads=8)


def _report(**kwargs: object) -> fsdpviz.Report:
    ids = example_inputs(CONFIG, batch=4, seq=256)
    return fsdpviz.analyze(example_model(CONFIG), ids, auto_wrap_policy=POLICY, **kwargs)


def test_presets_and_overrides() -> None:
    h100 = machine("h100")
    assert h100.tflops["bfloat16"] == 989.0 and h100.memory_gib == 80.0
    assert h100.intra_node_gbps == 450.0 and h100.inter_node_gbps == 50.0
    a100 = machine("a100", network="roce-100", compute_efficiency=0.5)
    assert (a100.inter_node_gbps, a100.intra_node_gbps, a100.compute_efficiency) == (
        12.5,
        300.0,
        0.5,
    )
    assert machine("l40s").intra_node_gbps == 32.0 and machine("h200").memory_gib == 141.0
    custom = Machine("mine", {"float32": 10.0}, 24.0, 500.0, 100.0, 10.0)
    assert machine(custom, gpus_per_node=4).gpus_per_node == 4
    json.dumps(h100.to_dict())
    with pytest.raises(fsdpviz.ConfigError, match="unknown GPU preset 'v100'; use one of"):
        machine("v100")
    with pytest.raises(fsdpviz.ConfigError, match="unknown network 'nvlink9'"):
        machine("h100", network="nvlink9")
    with pytest.raises(fsdpviz.ConfigError, match="unknown machine constant"):
        machine("h100", tflop=1.0)


def test_machine_overrides_name_every_constant() -> None:
    """``machine(**overrides)`` is typed by ``MachineOverrides``: every constant of a
    ``Machine`` but ``network`` (``machine``'s own argument), each overridable as typed."""
    constants = {f.name for f in fields(Machine)}
    assert set(MachineOverrides.__optional_keys__) == constants - {"network"}
    changed = machine("h100", memory_gib=96.0, gpus_per_node=4, float32_matmul_precision="high")
    assert (changed.memory_gib, changed.gpus_per_node, changed.tf32) == (96.0, 4, True)


def test_collective_formula() -> None:
    """NCCL's ring: a base latency, one step per hop, the bytes at the bus bandwidth."""
    m = machine("h100", comm_efficiency=1.0)
    size = 1e9
    inside = m.collective_seconds("all_gather", size, 8)
    expected = 10e-6 + 7 * 1e-6 + 7 / 8 * size / 450e9
    assert inside == pytest.approx(expected)
    across = m.collective_seconds("reduce_scatter", size, 64)
    # 8 cards of 50 GB/s per node carry a ring across nodes: 400 GB/s, below NVLink's 450
    assert across == pytest.approx(10e-6 + 63 * 2.5e-6 + 63 / 64 * size / 400e9)
    slow = machine("h100", comm_efficiency=1.0, network="roce-100")
    assert slow.collective_seconds("all_gather", size, 64) == pytest.approx(
        10e-6 + 63 * 2.5e-6 + 63 / 64 * size / 100e9
    )
    both = m.collective_seconds("all_reduce", size, 8)
    assert both == pytest.approx(10e-6 + 14 * 1e-6 + 2 * 7 / 8 * size / 450e9)
    assert m.collective_seconds("all_gather", size, 1) == 0.0
    assert m.compute_seconds(1e15, "bfloat16") == pytest.approx(1e15 / (989e12 * 0.542))


def test_timeline_shape_and_totals() -> None:
    report = _report(world_size=64)
    tl = report.timeline
    assert len(tl.events) == len(report.iterations[1])
    comm = sorted((r["start"], r["end"]) for r in tl.events if r["stream"] == "comm")
    assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(comm))  # one at a time
    t = tl.totals
    assert t["compute_s"] == pytest.approx(sum(c["end"] - c["start"] for c in tl.compute))
    by_kind = t["matmul_s"] + t["attention_s"] + t["memory_bound_s"] + t["copy_s"]
    assert t["compute_s"] == pytest.approx(by_kind + t["cpu_bound_s"])
    assert 0 <= t["exposed_comm_s"] <= t["comm_s"] + 1e-12
    assert t["step_s"] >= t["compute_s"] + t["optimizer_s"]
    assert math.isclose(t["overlap"], 1 - t["exposed_comm_s"] / t["comm_s"])
    gathered = sum(
        u.padded_numel * 4 * 63 / 64
        for e in report.iterations[1]
        if e.kind == "all_gather"
        for u in [report.unit(e.unit)]
    )
    assert t["all_gather_bytes"] == pytest.approx(gathered)
    assert "exposed" in tl.summary()
    json.dumps(tl.to_dict())


def test_timeline_and_memory_rows_are_records_their_json_reads_back() -> None:
    """The rows are typed records (read by attribute, or by key as the dicts they were), and
    a timeline's and a memory report's JSON read back gives the same JSON."""
    report = _report(world_size=64, grad_accum=2)
    tl, mem = report.timeline, report.memory
    first = tl.events[0]
    assert first.kind == first["kind"] == tl.records()[0]["kind"]
    assert first.get("bubble", 0.0) == 0.0 and "bubble" not in first
    assert [s.sync for s in tl.micro_steps] == [s["sync"] for s in tl.micro_steps] == [False, True]
    assert tl.compute[-1].duration == tl.compute[-1]["end"] - tl.compute[-1]["start"]
    text = json.dumps(tl.to_dict())
    assert json.dumps(Timeline.from_dict(json.loads(text)).to_dict()) == text
    row = mem.events[-1]
    assert row.total == sum(row.breakdown().values()) == row["total"]
    assert list(mem.records()[0]) == ["index", "kind", "unit", "phase", "hook", "hook_unit",
                                      *CATEGORIES, "total", "peak_before"]  # fmt: skip
    assert [MemoryEvent.from_dict(r) for r in mem.records()] == mem.events
    text = json.dumps(mem.to_dict())
    assert json.dumps(MemoryReport.from_dict(json.loads(text)).to_dict()) == text


def test_prefetch_and_interconnect_change_exposed_communication() -> None:
    pre = _report(world_size=64)
    off = _report(world_size=64, backward_prefetch=None)
    assert off.timeline.totals["exposed_comm_s"] > pre.timeline.totals["exposed_comm_s"]
    assert off.timeline.totals["comm_s"] == pytest.approx(pre.timeline.totals["comm_s"])
    node = _report(world_size=8)
    slow_net = machine("h100", network="roce-100")  # 8 x 12.5 GB/s across nodes, NVLink inside
    inside = timeline(node, slow_net).totals["comm_s"]
    assert inside < timeline(pre, slow_net).totals["comm_s"] / 3
    slow = timeline(pre, slow_net)
    assert slow.totals["exposed_comm_s"] > pre.timeline.totals["exposed_comm_s"]
    fast = timeline(pre, "h100", optimizer=None)
    assert fast.totals["optimizer_s"] == 0.0


def test_fsdp2_and_reports_without_profile() -> None:
    ids = example_inputs(CONFIG)
    fsdp2 = fsdpviz.analyze(example_model(CONFIG), ids, fully_shard=[DecoderLayer], world_size=16)
    assert fsdp2.timeline.totals["step_s"] > 0
    post = _report(world_size=8, backward_prefetch=BackwardPrefetch.BACKWARD_POST)
    bare = replace(post, profile=None)
    tl = timeline(bare)
    assert tl.totals["compute_s"] == 0.0 and tl.totals["comm_s"] > 0
    assert "no trace profile" in tl.notes[0]


@pytest.mark.parametrize(
    "options",
    [
        {"auto_wrap_policy": POLICY},
        {"auto_wrap_policy": POLICY, "limit_all_gathers": False},
        {"fully_shard": [DecoderLayer]},
        {"fully_shard": [DecoderLayer], "reshard_after_forward": False},
    ],
    ids=["fsdp1", "fsdp1-unlimited", "fsdp2", "fsdp2-no-reshard"],
)
def test_events_are_issued_on_the_cpu_clock_before_they_start(options: dict[str, object]) -> None:
    """The CPU runs ahead of the GPU: each event is issued when the CPU runs its hook (the
    CPU clock, never behind), no event starts on its stream before it is issued, and the
    compute stream is at or past that time when the hook's events take effect; the hooks
    are issued in order and the CPU is ahead of the compute stream on this GPU-bound plan."""
    ids = example_inputs(CONFIG, batch=4, seq=256)
    report = fsdpviz.analyze(example_model(CONFIG), ids, world_size=64, **options)
    tl = timeline(report, "h100")
    issued = [r["issued"] for r in sorted(tl.events, key=lambda r: r["index"])]
    assert issued == sorted(issued)
    assert [h["t"] for h in tl.hooks] == sorted(h["t"] for h in tl.hooks)
    for r in tl.events:
        assert r["start"] >= r["issued"] - 1e-15, r
        assert r["compute_t"] >= r["issued"] - 1e-15, r
    for h in tl.hooks:
        assert h["compute_t"] >= h["t"] - 1e-15
    ahead = [r for r in tl.events if r["issued"] < r["compute_t"] - 1e-9]
    assert len(ahead) > len(tl.events) // 2
    # an all-gather issued early (prefetch, or the CPU ahead) starts before its hook is
    # reached on the compute stream, and never before the CPU issued it
    early = [r for r in tl.events if r["kind"] == "all_gather" and r["start"] < r["compute_t"]]
    assert early


def test_summary_gives_each_time_in_a_readable_unit() -> None:
    from fsdpviz.schema.timeline import duration_text

    assert [duration_text(s) for s in (4.88e-5, 2.45e-3, 1.69, 0.99996e-3)] == [
        "48.8 µs", "2.45 ms", "1.69 s", "1 ms",
    ]  # fmt: skip
    tl = _report(world_size=64).timeline
    t = tl.totals
    assert f"of which {duration_text(t['exposed_comm_s'])} exposed" in tl.summary()
    assert tl.summary().startswith(f"step {duration_text(t['step_s'])} on H100")


def test_float32_matmuls_take_the_matmul_precision_setting() -> None:
    """fp32 training: the full FP32 peak under torch's default, TF32 tensor cores under
    'high' (given to analyze, or set in the process when analyze runs), and a note says
    which one the time model assumed."""
    fp32 = _report(world_size=8)
    assert "float32_matmul_precision" not in fp32.config  # 'highest' is not stated
    slow = timeline(fp32, "h100")
    assert any("full-precision FP32 peak" in n for n in slow.notes)
    tf32 = _report(world_size=8, float32_matmul_precision="high")
    assert tf32.config["float32_matmul_precision"] == "high"
    fast = timeline(tf32, "h100")
    assert any("TF32 tensor cores" in n for n in fast.notes)
    assert fast.totals["matmul_s"] < slow.totals["matmul_s"] / 4  # 494.5 vs 67 TFLOP/s
    # the machine's own setting wins over the report's
    back = timeline(tf32, machine("h100", float32_matmul_precision="highest"))
    assert back.totals["matmul_s"] == pytest.approx(slow.totals["matmul_s"])
    torch = pytest.importorskip("torch")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        seen = _report(world_size=8)
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen.config.float32_matmul_precision == "high"
    with pytest.raises(fsdpviz.ConfigError, match="float32_matmul_precision must be one of"):
        _report(world_size=8, float32_matmul_precision="tf32")
    with pytest.raises(fsdpviz.ConfigError, match="float32_matmul_precision must be one of"):
        machine("a100", float32_matmul_precision="fast")


def test_no_shard_all_reduces_the_padded_flat_parameter() -> None:
    import torch
    from torch.distributed.fsdp import ShardingStrategy

    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    report = fsdpviz.analyze(
        model, torch.randn(4, 7), world_size=8, sharding_strategy=ShardingStrategy.NO_SHARD,
        use_orig_params=True, progress=False,
    )  # fmt: skip
    tl = timeline(report, "h100")
    units = {u.module: u for u in report.units}
    reduced = [r for r in tl.events if r["kind"] == "all_reduce"]
    assert reduced
    assert any(u.flat_numel > u.numel for u in units.values())  # alignment padding
    for r in reduced:
        u = units[r["unit"]]
        assert r["bytes"] == pytest.approx(2 * 7 / 8 * u.flat_numel * 4)


def test_no_shard_casts_its_parameters_on_the_copy_stream() -> None:
    """``NO_SHARD`` with bf16 parameters makes the bf16 copy it computes on at each unshard
    (``cast``): on the copy stream, for reading the float32 parameters and writing the copy."""
    import torch
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    report = fsdpviz.analyze(
        model, torch.randn(4, 7), world_size=8, sharding_strategy=ShardingStrategy.NO_SHARD,
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), progress=False,
    )  # fmt: skip
    h100 = machine("h100")
    tl = timeline(report, h100)
    u = report.units[0]
    casts = [r for r in tl.events if r["kind"] == "cast"]
    assert [r["phase"] for r in casts] == ["forward", "backward"]
    for r in casts:
        assert r["stream"] == "copy" and r["bytes"] == u.numel * (4 + 2)
        assert r["end"] - r["start"] == pytest.approx(h100.memory_seconds(u.numel * 6))


def test_presets_say_what_calibrated_them() -> None:
    """H200, MI300X and B200 are each fitted on a run of their own, their peaks from the
    data sheets: the H100 SXM's efficiencies times one factor each (1.37 on H200; 0.556 on
    MI300X and 0.531 on B200, torchao's Llama 3 8B bf16 runs)."""
    h100, h200 = machine("h100"), machine("h200")
    assert h200.tflops == h100.tflops and h200.hbm_gbps == 4800.0
    assert h200.compute_efficiency / h100.compute_efficiency == pytest.approx(1.369, rel=0.02)
    b200 = machine("b200")
    assert (b200.peak_flops("bfloat16"), b200.intra_node_gbps) == (2250e12, 900.0)
    mi300x = machine("mi300x")
    assert mi300x.peak_flops("bfloat16") == pytest.approx(1307.4e12)
    assert (mi300x.memory_gib, mi300x.intra_node_gbps, mi300x.network) == (
        192.0,
        448.0,
        "xgmi+roce-400",
    )
    for m, factor in ((mi300x, 0.556), (b200, 0.531)):
        for what in ("compute", "attention", "attention_backward"):
            ratio = getattr(m, f"{what}_efficiency") / getattr(h100, f"{what}_efficiency")
            assert ratio == pytest.approx(factor, abs=0.01)


def test_mi300x_and_b200_are_what_fit_gives_on_their_calibration_rows(
    bench_published: ModuleType,
) -> None:
    """``bench_published.py --fit`` on the calibration rows of MI300X and B200 (torchao's
    Llama 3 8B bf16 runs) leaves their presets as they are: a factor of 1 on each; the B200
    run's per-operator checkpointing recomputes its cuDNN attention (torchtitan's save list
    of the time names the flash and efficient kernels alone), the MI300X run's saves it."""
    bench = bench_published
    rows = [r for r in bench.ROWS if r.split == bench.CAL and r.gpu in ("mi300x", "b200")]
    assert sorted(r.gpu for r in rows) == ["b200", "mi300x"]
    saves = {r.gpu: bench.row_job(r).kwargs["activation_checkpointing"].save_ops for r in rows}
    assert bench.CPU_FLASH in saves["mi300x"] and bench.CPU_FLASH not in saves["b200"]
    factors = bench.fit(bench.trace_all(rows))
    assert factors == {
        "b200": pytest.approx(1.0, abs=0.005),
        "mi300x": pytest.approx(1.0, abs=0.005),
    }


def test_fsdp2_copies_gradients_into_the_reduce_scatter_buffer_on_the_compute_stream() -> None:
    """``foreach_reduce`` allocates the reduce-scatter input and copies the gradients into it
    on the compute stream, then the reduce-scatter's stream waits for it (pytorch#129721): the
    copy delays the compute after the post-backward hook, not the collective, which takes
    just its own time and starts once the copy is done."""
    h100 = machine("h100")
    report = fsdpviz.analyze(example_model(CONFIG), example_inputs(CONFIG),
                             fully_shard=[DecoderLayer], world_size=8)  # fmt: skip
    tl = timeline(report, h100)
    scatters = [r for r in tl.records() if r["kind"] == "reduce_scatter"]
    assert scatters
    for r in scatters:
        size = r["bytes"] * 8 / 7
        assert r["end"] - r["start"] == pytest.approx(
            h100.collective_seconds("reduce_scatter", size, 8)
        )
        # the copy ran on the compute stream before it: the compute clock had passed the hook
        assert r["start"] > r["compute_t"]
    copies = sum(2 * r["bytes"] * 8 / 7 for r in scatters)
    assert tl.totals["copy_s"] >= h100.memory_seconds(copies) - 1e-12


def test_fsdp2_all_reduce_over_one_replica_costs_nothing() -> None:
    """FSDP2 on a 2-D mesh with one replica all-reduces each gradient shard over a group of
    one rank (HSDP all the same): NCCL moves nothing between ranks for it, so each such
    all-reduce takes no time and no bytes, and the step is the 1-D mesh's."""
    ids = example_inputs(CONFIG, batch=4, seq=256)
    flat = fsdpviz.analyze(example_model(CONFIG), ids, fully_shard=[DecoderLayer], world_size=16)
    one = fsdpviz.analyze(example_model(CONFIG), ids, fully_shard=[DecoderLayer], mesh=(1, 16))
    a, b = timeline(flat, "h100"), timeline(one, "h100")
    reduced = [r for r in b.events if r["kind"] == "all_reduce"]
    assert len(reduced) == len(one.units)
    assert all(r["end"] == r["start"] and r["bytes"] == 0 for r in reduced)
    assert b.totals["step_s"] == a.totals["step_s"] and b.totals["comm_s"] == a.totals["comm_s"]


def test_rated_stretches_keep_every_field_of_the_stretch() -> None:
    """The time model rates each compute stretch (duration, FLOP/s, share of the peak) in a new
    record that keeps every other field as it was (a pipeline's action, stage, microbatch, rank)."""
    from fsdpviz.cost.time import _rates
    from fsdpviz.schema.rows import ComputeStretch

    given = {"hook": "pre_backward", "unit": "layers.1", "index": 7, "start": 1.0, "end": 3.0,
             "flops": 8.0, "phase": "backward", "owner": "layers.2", "next_event": 5,
             "action": "1B0", "stage": 1, "microbatch": 0, "rank": 3}  # fmt: skip
    rated_fields = {"duration", "flops_per_s", "peak_share"}
    assert {f.name for f in fields(ComputeStretch)} == set(given) | rated_fields
    m = machine("h100")
    (rated,) = _rates([ComputeStretch(**given)], m, "bfloat16")  # type: ignore[arg-type]
    peak = m.peak_flops("bfloat16")
    assert rated == ComputeStretch(**given, duration=2.0, flops_per_s=4.0, peak_share=4.0 / peak)  # type: ignore[arg-type]


def test_cost_models_pause_cyclic_collection_while_they_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The time and memory models walk a tape with automatic cyclic GC paused (their records,
    by the hundred thousand, die by reference count), and leave it on as they found it."""
    import gc

    from fsdpviz.cost import memory_model
    from fsdpviz.cost.memory_walker import Walker
    from fsdpviz.cost.time_sim import MicroStepSim

    seen: list[bool] = []
    for cls in (Walker, MicroStepSim):
        run = cls.run
        monkeypatch.setattr(
            cls, "run", lambda self, run=run: (seen.append(gc.isenabled()), run(self))[1]
        )
    report = fsdpviz.analyze(example_model(), example_inputs(), world_size=2, progress=False)
    assert gc.isenabled()
    seen.clear()  # (analyze's own walks, inside its paused trace)
    timeline(report)
    memory_model(report)
    assert seen and not any(seen)
    assert gc.isenabled()
    gc.disable()  # turned off by the user: left off
    try:
        memory_model(report)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_published_float8_all_gathers_precompute_their_scales_where_their_commands_do(
    bench_published: ModuleType,
) -> None:
    """The published runs with FSDP's float8 all-gather are planned with torchtitan's
    ``float8.precompute_float8_dynamic_scale_for_fsdp`` (default False) where their command or
    script sets it: Trainy's H200 command, AWS's TOML, torchao's
    ``float8_training_benchmark.sh`` and ``llama3.sh``; torchtitan's December 2024 H100 tables
    give no command and keep the default."""
    b = bench_published
    seen: dict[str, set[bool]] = {}
    for row in b.ROWS:
        if row.float8.endswith("+ag"):
            spec = b.row_job(row).kwargs["float8"]
            seen.setdefault(row.source, set()).add(
                spec.get("precompute_float8_dynamic_scale_for_fsdp", False)
            )
    assert seen == {
        b.TT_H100: {False},
        b.TT_H200: {True},
        b.TT_SAGEMAKER: {True},
        b.TORCHAO: {True},
        b.TORCHAO_MI300X: {True},
        b.TORCHAO_B200: {True},
    }


def test_a_ring_moves_all_but_a_ranks_own_share() -> None:
    """NCCL's ring: each of 8 ranks sends 7/8 of an all-gather's 800 bytes, a
    reduce-scatter's the same, an all-reduce's twice (a reduce-scatter, then an all-gather);
    one rank moves nothing. The timeline's bytes on the wire and the collectives' bandwidth
    time both take them from ``ring_bytes``."""
    assert ring_bytes("all_gather", 800, 8) == ring_bytes("reduce_scatter", 800, 8) == 700
    assert ring_bytes("all_reduce", 800, 8) == 1400
    assert ring_bytes("all_gather", 800, 1) == 0
    m = machine("h100")
    latency = m.collective_seconds("all_gather", 1.0, 8)  # the same latency, bytes aside
    more = m.collective_seconds("all_gather", 1.0 + 8e9, 8) - latency
    assert more == pytest.approx(
        ring_bytes("all_gather", 8e9, 8) / (m.intra_gbps(8) * 1e9 * m.comm_efficiency)
    )
