"""Collectives on a machine of nodes: which links a process group's ring crosses, as the mesh
lays its ranks out (HSDP: shard inside a node, replicate across; FSDP x TP: tp inside)."""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import pytest
import torch
import tp_models
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost import machine, timeline
from fsdpviz.cost.topology import Span, consecutive, mesh_dims, span_of, spans
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model

GB = 1e9
SMALL = ExampleConfig(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4)


def test_device_mesh_layout_puts_the_last_dimension_inside_a_node() -> None:
    hsdp = [("dp_replicate", 4), ("dp_shard", 8)]
    assert span_of(hsdp, 1, 8) == Span("dp_shard", 8, 1, 8, 1)
    # one replicate group per shard rank, each with one rank in every node
    assert span_of(hsdp, 0, 8) == Span("dp_replicate", 4, 4, 1, 8)
    fsdp_tp = [("dp_shard", 32), ("tp", 8)]
    assert span_of(fsdp_tp, 1, 8) == Span("tp", 8, 1, 8, 1)
    assert span_of(fsdp_tp, 0, 8) == Span("dp_shard", 32, 32, 1, 8)
    # a shard group of 16 spans two full nodes; two replicate groups per node
    assert span_of([("r", 4), ("s", 16)], 1, 8) == Span("s", 16, 2, 8, 1)
    assert span_of([("r", 4), ("s", 16)], 0, 8) == Span("r", 4, 4, 1, 8)
    assert consecutive(64, 8) == Span("", 64, 8, 8, 1)
    assert consecutive(4, 8) == Span("", 4, 1, 4, 1)


def test_group_spanning_2_8_and_9_nodes_against_one_node() -> None:
    """An HSDP replicate all-reduce of a 7B model's shard (bf16, shard groups of 8): its
    ring crosses the network once per node, and the 8 replicate groups of a node share
    its cards, so 2, 8 and 9 nodes all run at one card's bandwidth per group."""
    m = machine("h100", network="roce-100", comm_efficiency=1.0)  # 12.5 GB/s per GPU
    shard = 7e9 * 2 / 8
    inside = m.collective_seconds("all_reduce", shard, 8, consecutive(8, 8))
    times = {}
    for nodes in (2, 8, 9):
        s = span_of([("dp_replicate", nodes), ("dp_shard", 8)], 0, 8)
        assert (s.nodes, s.per_node, s.sharing) == (nodes, 1, 8)
        times[nodes] = m.collective_seconds("all_reduce", shard, nodes, s)
        moved = 2 * (nodes - 1) / nodes * shard
        assert times[nodes] == pytest.approx(moved / (12.5 * GB), rel=0.01)
    # NVLink inside a node is ~36x the card's 12.5 GB/s
    assert times[8] > 30 * m.collective_seconds("all_reduce", shard, 8, consecutive(8, 8))
    assert inside < times[2] < times[8] < times[9]
    assert times[9] / times[8] == pytest.approx((8 / 9) / (7 / 8), rel=0.01)  # continuous
    # a plain FSDP group of 16 (two full nodes) has all 8 cards of each node to itself
    both = m.collective_seconds("all_gather", 1e9, 16)
    assert both == pytest.approx(15 / 16 * 1e9 / (8 * 12.5 * GB), rel=0.01)


def test_all_reduce_across_many_nodes_takes_the_tree_when_latency_bound() -> None:
    m = machine("h100")
    s = span_of([("dp_replicate", 64), ("dp_shard", 8)], 0, 8)
    ring = 10e-6 + 2 * 63 * 2.5e-6
    tree = 10e-6 + 2 * (6 * 2.5e-6 + 0)
    small = m.collective_seconds("all_reduce", 8.0, 64, s)
    assert small == pytest.approx(tree + 2 * 63 / 64 * 8.0 / (50 * GB * 0.8))
    assert small < ring


def test_point_to_point_links_give_two_of_four_gpus_a_third_of_nvlink() -> None:
    """4 H200 on an HGX board, each GPU's 18 NVLinks split 6 to each of the other three (no
    NVSwitch): a ring of two reaches only its pair's links, a third of a GPU's bandwidth, a
    ring of three two thirds, of four all of it; through a switch any group gets all of it.
    A ring with one rank per node crosses no link inside; a send to a peer uses one pair's."""
    from dataclasses import replace

    mesh = machine("h200", network="nvlink4+ib-ndr", gpus_per_node=4, intra_node_mesh=True,
                   comm_efficiency=1.0)  # fmt: skip
    switched = replace(mesh, intra_node_mesh=False)
    size = 1e9
    assert [mesh.intra_gbps(k) for k in (1, 2, 3, 4)] == [450.0, 150.0, 300.0, 450.0]
    two = mesh.collective_seconds("all_gather", size, 2)
    assert two == pytest.approx(10e-6 + 1e-6 + 1 / 2 * size / (150 * GB))
    assert switched.collective_seconds("all_gather", size, 2) == pytest.approx(
        10e-6 + 1e-6 + 1 / 2 * size / (450 * GB)
    )
    assert mesh.collective_seconds("reduce_scatter", size, 4) == pytest.approx(
        switched.collective_seconds("reduce_scatter", size, 4)
    )
    assert mesh.collective_seconds("all_reduce", size, 3) == pytest.approx(
        10e-6 + 4e-6 + 2 * 2 / 3 * size / (300 * GB)
    )
    # FSDP 8 x TP 4: each dp group has one rank in each node, the network carries it
    dp = span_of([("dp_shard", 8), ("tp", 4)], 0, 4)
    assert mesh.collective_seconds("all_gather", size, 8, dp) == pytest.approx(
        switched.collective_seconds("all_gather", size, 8, dp)
    )
    assert mesh.p2p_seconds(size, False) == pytest.approx(11e-6 + size / (150 * GB))
    assert mesh.p2p_seconds(size, True) == switched.p2p_seconds(size, True)
    # FSDP 2 x TP 2 on one such node: every tp collective at a pair's bandwidth
    torch.manual_seed(0)
    report = fsdpviz.analyze(
        tp_models.Llama(), tp_models.tokens(), fully_shard=tp_models.LAYERS,
        mesh=("dp_shard", 2, "tp", 2), parallelize_plan=tp_models.whole_plan(), progress=False,
    )  # fmt: skip
    events = report.iterations[-1]
    tp = [r for r in timeline(report, mesh).events if r["kind"].startswith("tp_")]
    assert tp
    for r in tp:
        kind = events[r["index"]].kind.removeprefix("tp_")
        nbytes = float(events[r["index"]].nbytes or 0)
        passes = 2 if kind == "all_reduce" else 1
        expected = 10e-6 + passes * 1e-6 + passes * nbytes / 2 / (150 * GB)
        assert r["end"] - r["start"] == pytest.approx(expected)


def _hsdp_report(api: str) -> fsdpviz.Report:
    ids = example_inputs(SMALL, batch=2, seq=64)
    if api == "FSDP2":
        return fsdpviz.analyze(
            example_model(SMALL), ids, fully_shard=[DecoderLayer],
            mesh=("dp_replicate", 4, "dp_shard", 8), progress=False,
        )  # fmt: skip
    return fsdpviz.analyze(
        example_model(SMALL), ids, auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        sharding_strategy=ShardingStrategy.HYBRID_SHARD, world_size=32, progress=False,
    )  # fmt: skip


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_hsdp_replicate_all_reduce_is_timed_by_the_network(api: str) -> None:
    report = _hsdp_report(api)
    assert [r for r, _, _ in mesh_dims(report.config)] == ["replicate", "shard"]
    m = machine("h100")
    tl = timeline(report, m)
    found = spans(report.config, 8)
    assert found["replicate"].nodes == 4 and found["shard"].nodes == 1
    events = report.iterations[-1]
    replicate = [r for r in tl.events if events[r["index"]].group == "replicate"]
    gathers = [r for r in tl.events if r["kind"] == "all_gather"]
    assert replicate and gathers
    units = {u.module: u for u in report.units}
    for r in replicate:
        u = units[r["unit"]]
        size = u.sharded_numel * 4  # the fp32 gradient shard
        expected = m.collective_seconds("all_reduce", size, 4, found["replicate"])
        assert r["end"] - r["start"] == pytest.approx(expected)
        # at one card's bandwidth, not NVLink's (the former model's 8 ranks inside a node)
        assert expected > m.collective_seconds("all_reduce", size, 4, consecutive(4, 8))
    for r in gathers:
        size = units[r["unit"]].padded_numel * 4
        copy_in = m.memory_seconds(2 * size / 8) if api == "FSDP2" else 0.0
        expected = m.collective_seconds("all_gather", size, 8) + copy_in
        assert r["end"] - r["start"] == pytest.approx(expected)
    topology = {t["role"]: t for t in tl.machine["topology"]}
    assert topology["replicate"]["link"] == "network" and topology["shard"]["link"] == "intra-node"


def test_fsdp_x_tp_all_gathers_cross_nodes_with_tp_inside() -> None:
    torch.manual_seed(0)
    report = fsdpviz.analyze(
        tp_models.Llama(), tp_models.tokens(), fully_shard=tp_models.LAYERS,
        mesh=("dp_shard", 4, "tp", 2), parallelize_plan=tp_models.whole_plan(), progress=False,
    )  # fmt: skip
    m = machine("h100", gpus_per_node=2)  # each node holds one tp group
    tl = timeline(report, m)
    found = spans(report.config, 2)
    assert found["shard"] == Span("dp_shard", 4, 4, 1, 2)
    assert found["tp"] == Span("tp", 2, 1, 2, 1)
    units = {u.module: u for u in report.units}
    gathers = [r for r in tl.events if r["kind"] == "all_gather"]
    assert gathers
    for r in gathers:
        size = units[r["unit"]].padded_numel * 4
        copy_in = m.memory_seconds(2 * size / 4)
        expected = m.collective_seconds("all_gather", size, 4, found["shard"]) + copy_in
        assert r["end"] - r["start"] == pytest.approx(expected)
        # the two dp groups of a node share its two cards: one card each
        moved = 3 / 4 * size
        assert r["end"] - r["start"] >= moved / (m.inter_node_gbps * GB * m.comm_efficiency)
    tp = [r for r in tl.events if r["kind"].startswith("tp_")]
    events = report.iterations[-1]
    for r in tp:
        kind = events[r["index"]].kind.removeprefix("tp_")
        nbytes = float(events[r["index"]].nbytes or 0)
        assert r["end"] - r["start"] == pytest.approx(m.collective_seconds(kind, nbytes, 2))


def test_mi300x_infinity_fabric_joins_each_pair_directly() -> None:
    """MI300X's eight GPUs are joined pair by pair by Infinity Fabric (7 links of 64 GB/s), no
    switch: a ring of two of them gets one link, of all eight every link; an NVLink network
    named on it goes back through a switch."""
    mi = machine("mi300x")
    assert mi.intra_node_mesh
    assert [mi.intra_gbps(k) for k in (2, 4, 8)] == [64.0, 192.0, 448.0]
    assert not machine("mi300x", network="nvlink4").intra_node_mesh
    assert not machine("h100").intra_node_mesh


def test_kempner_network_per_gpu_gives_its_profiled_collectives(
    bench_published: ModuleType,
) -> None:
    """KempnerForge's profile of a 13B FSDP 6 x TP 4 run (nodes of 4 H200, each data-parallel
    ring one rank per node) times FSDP2's all-gathers and reduce-scatters of a step: the
    bench's network for its runs (200 Gb/s per GPU) gives their sum within 10%; 400 Gb/s per
    GPU, what ``ib-ndr`` gives a GPU, under half of it."""
    bench = bench_published
    base = machine("h200", network="nvlink4+ib-ndr")
    measured = sum(bench.KEMPNER_PROFILE_STEP_S.values())

    def step(gbps: float) -> float:
        m = replace(base, inter_node_gbps=gbps)
        return float(sum(bench.kempner_profile_collectives(m).values()))

    assert step(bench.KEMPNER_INTER_NODE_GBPS) == pytest.approx(measured, rel=0.1)
    assert step(base.inter_node_gbps) < 0.5 * measured
    kempner = [r for r in bench.ROWS if r.source.startswith("KempnerForge")]
    assert kempner and all(r.inter_node_gbps == bench.KEMPNER_INTER_NODE_GBPS for r in kempner)


def test_a_one_rank_cp_dimension_beside_tp_keeps_dp_shard_fsdps() -> None:
    """``("dp_shard", 4, "cp", 1, "tp", 2)``: a context-parallel dimension of one rank, which
    ``init_device_mesh`` keeps; FSDP shards over ``dp_shard`` (flattened with cp,
    ``dp_shard_cp``, of 4 ranks) and no rank replicates. fsdpviz read the cp dimension only
    where the config stated a cp degree (none for one rank), so ``dp_shard`` became the
    replicate dimension and cp's one rank FSDP's shard group, timed as a group of one."""
    torch.manual_seed(0)
    report = fsdpviz.analyze(
        tp_models.Llama(), tp_models.tokens(), fully_shard=tp_models.LAYERS,
        mesh=("dp_shard", 4, "cp", 1, "tp", 2), parallelize_plan=tp_models.whole_plan(),
        progress=False,
    )  # fmt: skip
    assert mesh_dims(report.config) == [("shard", "dp_shard_cp", 4), ("tp", "tp", 2)]
    assert mesh_dims(report.config, cp=True) == [
        ("shard", "dp_shard", 4), ("cp", "cp", 1), ("tp", "tp", 2),
    ]  # fmt: skip
    found = spans(report.config, 2)
    assert found["shard"] == Span("dp_shard_cp", 4, 4, 1, 2) and "replicate" not in found
    same = fsdpviz.analyze(
        tp_models.Llama(), tp_models.tokens(), fully_shard=tp_models.LAYERS,
        mesh=("dp_shard", 4, "tp", 2), parallelize_plan=tp_models.whole_plan(), progress=False,
    )  # fmt: skip
    m = machine("h100", gpus_per_node=2)

    def gathers(r: fsdpviz.Report) -> list[float]:
        return [e["end"] - e["start"] for e in timeline(r, m).events if e["kind"] == "all_gather"]

    assert gathers(report) == pytest.approx(gathers(same))
