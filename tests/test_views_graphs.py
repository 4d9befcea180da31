"""Tests of fsdpviz.graphs: module and unit graphs of a tiny 3-block model, and their export.

Golden file: ``test_unit_graph_golden`` compares ``to_node_link(unit_graph(report))``
with ``tests/golden/graphs_unit_graph_small.json``. After an intended change, rewrite
it with ``FSDPVIZ_UPDATE_GOLDEN=1 pytest tests/test_views_graphs.py`` and review the diff.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import torch
from torch.distributed.fsdp import BackwardPrefetch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from views_models import Block, Tiny

import fsdpviz
from fsdpviz import Event, Report, Unit
from fsdpviz.graphs import module_graph, to_node_link, unit_graph, write_graph

GOLDEN = Path(__file__).parent / "golden" / "graphs_unit_graph_small.json"
BLOCKS = ["blocks.0", "blocks.1", "blocks.2"]
UNITS = ["", *BLOCKS]
MODULES = [
    "",
    "inp",
    "blocks",
    *(f"{b}{s}" for b in BLOCKS for s in ("", ".norm", ".fc")),
    "head",
]


def analyze_tiny(**kwargs: Any) -> Report:
    torch.manual_seed(0)
    model = Tiny()
    return fsdpviz.analyze(
        model,
        torch.randn(2, 4),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        world_size=4,
        **kwargs,
    )


@pytest.fixture(scope="module")
def report() -> Report:
    """Default FSDP1 settings: BACKWARD_PRE, no forward prefetch."""
    return analyze_tiny()


@pytest.fixture(scope="module")
def report_fwd() -> Report:
    return analyze_tiny(forward_prefetch=True)


def edges_of(g: nx.MultiDiGraph, kind: str) -> list[tuple[str, str, dict[str, Any]]]:
    return sorted(
        ((u, v, d) for u, v, d in g.edges(data=True) if d["kind"] == kind),
        key=lambda e: e[2].get("position", -1),
    )


def edge_set(g: nx.Graph) -> set[tuple[Any, ...]]:
    return set(g.edges(keys=True)) if g.is_multigraph() else set(g.edges())


# ------------------------------------------------------------------ module graph


def test_module_graph_nodes_and_tree(report: Report) -> None:
    g = module_graph(report)
    assert list(g.nodes) == MODULES == [m.fqn for m in report.modules]
    assert nx.is_arborescence(g)
    assert {d["kind"] for *_, d in g.edges(data=True)} == {"child"}
    assert set(g.successors("")) == {"inp", "blocks", "head"}
    assert list(g.successors("blocks")) == BLOCKS
    assert g.graph == {"source": "prediction", "world_size": 4}


def test_module_graph_attributes(report: Report) -> None:
    g = module_graph(report)
    fc = g.nodes["blocks.1.fc"]
    assert fc["module_class"] == "Linear"
    assert (fc["unit"], fc["is_unit"]) == ("blocks.1", False)
    assert fc["params"] == {"weight": [8, 8], "bias": [8]}
    assert (fc["numel"], fc["bytes"]) == (72, 288)
    assert fc["calls"] == 1
    assert fc["input_shapes"] == fc["output_shapes"] == [[2, 8]]
    assert fc["first_call"] == report.module_order.index("blocks.1.fc")
    assert (g.nodes["blocks.1"]["unit"], g.nodes["blocks.1"]["is_unit"]) == ("blocks.1", True)
    assert (g.nodes[""]["unit"], g.nodes[""]["is_unit"]) == ("", True)
    assert g.nodes["head"]["unit"] == ""  # not wrapped: the root unit manages it
    # a ModuleList has no parameters and is never called
    assert g.nodes["blocks"]["unit"] is None
    assert g.nodes["blocks"]["first_call"] is None
    assert g.nodes["blocks"]["is_unit"] is False
    assert [n for n in g if g.nodes[n]["is_unit"]] == UNITS
    assert report.module_graph().nodes(data=True) == g.nodes(data=True)


# -------------------------------------------------------------------- unit graph


def test_unit_graph_nodes_and_attributes(report: Report) -> None:
    g = unit_graph(report)
    assert isinstance(g, nx.MultiDiGraph)
    assert list(g.nodes) == UNITS == [u.module for u in report.units]
    assert g.graph == {"source": "prediction", "world_size": 4, "iteration": 1}
    b1 = g.nodes["blocks.1"]
    assert b1["module_class"] == "Block"
    assert (b1["numel"], b1["bytes"]) == (88, 352)
    assert (b1["sharded_numel"], b1["sharded_bytes"]) == (22, 88)  # 88 / world size 4
    assert (b1["dtype"], b1["sharding_strategy"], b1["n_params"]) == ("float32", "FULL_SHARD", 4)
    assert [g.nodes[u]["forward_index"] for u in UNITS] == [0, 1, 2, 3]
    assert report.unit_graph().nodes(data=True) == g.nodes(data=True)


def test_forward_order_edges_chain(report: Report) -> None:
    g = unit_graph(report)
    chain = [(u, v) for u, v, _ in edges_of(g, "forward_order")]
    assert sorted(chain) == list(itertools.pairwise(UNITS))
    # edge keys: the kind, and "<kind>@<position>" for prefetch edges
    for *_, key, d in g.edges(keys=True, data=True):
        assert key == (d["kind"] if "position" not in d else f"{d['kind']}@{d['position']}")


def test_backward_pre_prefetch_edges(report: Report) -> None:
    """BACKWARD_PRE: each block's pre-backward hook prefetches the block before it;
    the root's pre-backward hook prefetches the last block."""
    g = unit_graph(report)
    bwd = edges_of(g, "backward_prefetch")
    assert [(u, v) for u, v, _ in bwd] == [
        ("", "blocks.2"),
        ("blocks.2", "blocks.1"),
        ("blocks.1", "blocks.0"),
    ]
    events = report.iterations[-1]
    for u, v, d in bwd:
        assert d["hook"] == "pre_backward"
        e = events[d["position"]]
        assert (e.kind, e.unit, e.hook_unit, e.prefetch) == ("all_gather", v, u, True)
    assert edges_of(g, "forward_prefetch") == []
    assert [g.nodes[u]["prefetched_backward"] for u in UNITS] == [False, True, True, True]
    assert not any(g.nodes[u]["prefetched_forward"] for u in UNITS)


def test_backward_post_prefetch_edges() -> None:
    g = unit_graph(analyze_tiny(backward_prefetch=BackwardPrefetch.BACKWARD_POST))
    bwd = edges_of(g, "backward_prefetch")
    assert [(u, v, d["hook"]) for u, v, d in bwd] == [
        ("blocks.2", "blocks.1", "post_backward"),
        ("blocks.1", "blocks.0", "post_backward"),
    ]
    # nothing prefetches the last block (its own pre-backward hook gathers it), nor the root
    assert [g.nodes[u]["never_prefetched"] for u in UNITS] == [True, False, False, True]
    assert [g.nodes[u]["prefetched_backward"] for u in UNITS] == [False, True, True, False]


def test_forward_prefetch_only_in_steady_state(report_fwd: Report) -> None:
    first = unit_graph(report_fwd, iteration=0)
    steady = unit_graph(report_fwd, iteration=1)
    assert edges_of(first, "forward_prefetch") == []
    assert not any(first.nodes[u]["prefetched_forward"] for u in UNITS)
    fwd = edges_of(steady, "forward_prefetch")
    assert [(u, v, d["hook"]) for u, v, d in fwd] == [
        ("", "blocks.0", "pre_forward"),
        ("blocks.0", "blocks.1", "pre_forward"),
        ("blocks.1", "blocks.2", "pre_forward"),
    ]
    assert [steady.nodes[u]["prefetched_forward"] for u in UNITS] == [False, True, True, True]
    # forward_order and forward_prefetch join the same pairs: both edges are kept
    assert steady.number_of_edges("blocks.0", "blocks.1") == 2
    assert unit_graph(report_fwd, iteration=-1).graph["iteration"] == 1
    assert first.graph["iteration"] == 0


def test_never_prefetched(report: Report) -> None:
    g = unit_graph(report)
    # the root is gathered once in forward and kept for backward: never by a prefetch
    assert [g.nodes[u]["never_prefetched"] for u in UNITS] == [True, False, False, False]
    none = unit_graph(analyze_tiny(backward_prefetch=None))
    assert all(none.nodes[u]["never_prefetched"] for u in UNITS)
    assert edges_of(none, "backward_prefetch") == []


def test_unit_graph_iteration_out_of_range(report: Report) -> None:
    with pytest.raises(IndexError, match="2 iteration"):
        unit_graph(report, iteration=2)
    with pytest.raises(IndexError):
        unit_graph(report, iteration=-3)


def recording_like() -> Report:
    """What FSDP1Recorder gives: no modules, no world size, any number of iterations."""
    units = [Unit("", "Net", ["w"], numel=4), Unit("a", "Lin", ["a.w"], numel=4)]
    step = [
        Event("all_gather", "", "forward", hook="pre_forward", hook_unit=""),
        Event("all_gather", "a", "forward", hook="pre_forward", hook_unit="a"),
        Event("all_gather", "a", "backward", prefetch=True, hook="pre_backward", hook_unit=""),
    ]
    return Report("recording", {"api": "FSDP1"}, units, ["", "a"], [step, step, step])


def test_recording_without_modules(tmp_path: Path) -> None:
    rep = recording_like()
    assert module_graph(rep).number_of_nodes() == 0
    g = unit_graph(rep)
    assert g.graph == {"source": "recording", "world_size": None, "iteration": 2}
    assert [(u, v) for u, v, _ in edges_of(g, "backward_prefetch")] == [("", "a")]
    back = nx.read_graphml(write_graph(g, tmp_path / "rec.graphml"), force_multigraph=True)
    assert "world_size" not in back.graph
    assert "dtype" not in back.nodes["a"]


def test_unknown_unit_in_events_raises() -> None:
    rep = recording_like()
    rep.iterations[-1] = [Event("all_gather", "zzz", "backward", prefetch=True, hook_unit="a")]
    with pytest.raises(ValueError, match="'zzz'"):
        unit_graph(rep)


def test_graph_of_loaded_report(report: Report, tmp_path: Path) -> None:
    report.to_json(tmp_path / "r.json")
    loaded = fsdpviz.load(str(tmp_path / "r.json"))
    assert to_node_link(unit_graph(loaded)) == to_node_link(unit_graph(report))
    assert to_node_link(module_graph(loaded)) == to_node_link(module_graph(report))


# ------------------------------------------------------------------------ export


def test_to_node_link_is_json(report: Report) -> None:
    for g in (module_graph(report), unit_graph(report)):
        data = to_node_link(g)
        assert json.loads(json.dumps(data)) == data
        back = nx.node_link_graph(data, edges="edges")
        assert list(back.nodes) == list(g.nodes)
        assert edge_set(back) == edge_set(g)
        assert dict(back.nodes(data=True)) == dict(g.nodes(data=True))


def test_to_node_link_converts_non_json_values() -> None:
    g = nx.DiGraph(shape=(2, 3))
    g.add_node("a", dtype=torch.float16, tags={"y", "x"}, by_rank={0: (1, 2)}, none=None)
    data = to_node_link(g)
    assert data["graph"] == {"shape": [2, 3]}
    node = {"dtype": "torch.float16", "tags": ["x", "y"], "by_rank": {"0": [1, 2]}, "none": None}
    assert data["nodes"] == [{"id": "a", **node}]
    json.dumps(data)


@pytest.mark.parametrize("which", ["module", "unit"])
def test_write_graph_json_and_graphml(report_fwd: Report, tmp_path: Path, which: str) -> None:
    g = module_graph(report_fwd) if which == "module" else unit_graph(report_fwd)
    before = copy.deepcopy(to_node_link(g))
    js = write_graph(g, tmp_path / "g.json")
    back = nx.node_link_graph(json.loads(js.read_text()), edges="edges")
    assert list(back.nodes) == list(g.nodes)
    assert edge_set(back) == edge_set(g)

    gml = write_graph(g, str(tmp_path / "g.GraphML"))
    back = nx.read_graphml(gml, force_multigraph=g.is_multigraph())
    assert list(back.nodes) == list(g.nodes)
    assert edge_set(back) == edge_set(g)
    assert back.graph["world_size"] == 4
    for n, attrs in g.nodes(data=True):
        for k, v in attrs.items():
            got = back.nodes[n].get(k)
            if v is None:
                assert got is None  # left out
            elif isinstance(v, list | dict):
                assert json.loads(got) == v
            else:
                assert got == v
    for *ends, attrs in g.edges(data=True, **({"keys": True} if g.is_multigraph() else {})):
        assert back.edges[tuple(ends)]["kind"] == attrs["kind"]
    assert to_node_link(g) == before  # the caller's graph is untouched


def test_write_graph_rejects_other_suffixes(report: Report, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.json, \.graphml") as info:
        write_graph(unit_graph(report), tmp_path / "g.dot")
    assert "'.dot'" in str(info.value)
    assert not (tmp_path / "g.dot").exists()


# ------------------------------------------------------------------------ golden


def test_unit_graph_golden(report: Report) -> None:
    data = to_node_link(unit_graph(report))
    if os.environ.get("FSDPVIZ_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(data, indent=1) + "\n")
        pytest.skip(f"rewrote {GOLDEN.name}")
    assert GOLDEN.exists(), f"missing {GOLDEN}; create it with FSDPVIZ_UPDATE_GOLDEN=1"
    assert data == json.loads(GOLDEN.read_text())
