"""The explorer figure and its data: module tree sizes, colours, labels, hover and the golden JSON.

Golden files ``tests/golden/views_explorer_*.json``; rewrite them after an intended change
with ``FSDPVIZ_UPDATE_GOLDEN=1 pytest tests/test_views_explorer.py`` and review the diff.
"""

from __future__ import annotations

import itertools

import pytest
from views_models import (
    Tiny,
    analyze_tiny,
    check_front_end_data,
    check_golden,
    figure_json,
    tiny_inputs,
)

import fsdpviz
from fsdpviz import Report
from fsdpviz.examples import ExampleConfig, example_analysis
from fsdpviz.views import PALETTE, explorer_figure, module_tree, unit_colors, unit_details
from fsdpviz.views.detail import bytes_breakdown, dtype_text, param_rows
from fsdpviz.views.explorer import explorer_data, highlight_lines
from fsdpviz.views.tree import ROOT_ID


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


def test_explorer_golden(report: Report) -> None:
    check_golden("views_explorer_icicle.json", figure_json(explorer_figure(report)))


def test_explorer_treemap_golden(report: Report) -> None:
    fig = explorer_figure(
        report, kind="treemap", size="rank_bytes", theme="dark", highlight_unit="blocks.1"
    )
    check_golden("views_explorer_treemap_dark.json", figure_json(fig))


def test_tree_sizes_add_up_to_the_units(report: Report) -> None:
    tree = module_tree(report)
    root = tree.nodes[0]
    assert root.fqn == "" and root.parent is None
    assert root.numel_total == sum(u.numel for u in report.units)
    for u in report.units:
        owned = sum(n.numel for n in tree.nodes if n.unit == u.module)
        assert owned == u.numel
    # per rank: each unit's share of its padded shard, never more than the shard
    assert root.rank_bytes_total <= sum(u.sharded_bytes for u in report.units)
    assert tree.by_fqn["blocks"].unit == ""  # no parameters: the innermost unit around it
    assert tree.by_fqn["blocks.1.fc"].unit == "blocks.1"


def test_shared_parameters_count_once() -> None:
    r = example_analysis(config=ExampleConfig(num_layers=1, tie_word_embeddings=True))
    tree = module_tree(r)
    assert tree.by_fqn["lm_head"].numel == 0  # its weight is embed_tokens.weight
    assert tree.nodes[0].numel_total == sum(u.numel for u in r.units)


def test_trace_ids_labels_and_colours(report: Report) -> None:
    trace = explorer_figure(report).data[0]
    assert list(trace.ids) == [ROOT_ID if m.fqn == "" else m.fqn for m in report.modules]
    assert trace.parents[0] == ""
    labels = dict(zip(trace.ids, trace.labels, strict=True))
    assert labels["blocks.1"] == "blocks.1 [unit 2]"  # unit roots say which unit they are
    assert labels["blocks.1.fc"] == "fc"
    colors = unit_colors(report)
    assert colors == {u.module: PALETTE[i] for i, u in enumerate(report.units)}
    by_id = dict(zip(trace.ids, trace.marker.colors, strict=True))
    assert by_id["blocks.1.norm"] == colors["blocks.1"]
    assert by_id["head"] == colors[""]
    values = dict(zip(trace.ids, trace.values, strict=True))
    assert values["blocks.1"] == report.unit("blocks.1").numel


def test_hover_names_unit_bytes_dtype() -> None:
    r = analyze_tiny()
    trace = explorer_figure(r).data[0]
    i = list(trace.ids).index("blocks.0.fc")
    cls, unit, numel, full, rank, dtype, warn, name = trace.customdata[i]
    assert rank == "72 B"  # 1/4 of 288 B on 4 ranks
    assert (cls, unit, numel, full, dtype, warn, name) == (
        "Linear",
        "'blocks.0'",
        "72",
        "288 B",
        "float32",
        "",
        "blocks.0.fc",
    )
    assert "customdata[4]" in trace.hovertemplate and "per rank" in trace.hovertemplate


def test_palette_cycles_for_hundreds_of_units() -> None:
    r = example_analysis(
        config=ExampleConfig(num_layers=20, hidden_size=32, intermediate_size=32, vocab_size=64),
        progress=False,
    )
    colors = [unit_colors(r)[u.module] for u in r.units]
    assert len(set(colors)) == len(PALETTE)
    assert all(a != b for a, b in itertools.pairwise(colors))


def test_highlight_outlines_one_unit(report: Report) -> None:
    tree = module_tree(report)
    lines = highlight_lines(tree, "blocks.2", theme="dark")
    outlined = {n.fqn for n, c in zip(tree.nodes, lines, strict=True) if c == "#e0e0e0"}
    assert outlined == {"blocks.2", "blocks.2.norm", "blocks.2.fc"}
    assert set(lines) == {"#e0e0e0", "#111111"}  # the others: the background
    assert set(highlight_lines(tree, None)) == {"#ffffff"}


def test_bad_options_say_what_to_use(report: Report) -> None:
    with pytest.raises(ValueError, match="'icicle' or 'treemap'"):
        explorer_figure(report, kind="sunburst")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'numel' or 'rank_bytes'"):
        explorer_figure(report, size="bytes")  # type: ignore[arg-type]


def test_detail_panel(report: Report) -> None:
    rows = param_rows(report, "blocks.1")
    assert [r[0] for r in rows] == report.unit("blocks.1").params
    assert rows[2][1:4] == ["8×8", "64", "256 B"]
    parts = bytes_breakdown(report, module_tree(report), "blocks.1")
    assert [p[0] for p in parts] == ["blocks.1.fc", "blocks.1.norm", "FlatParameter"]
    odd = analyze_tiny(world_size=3)  # 88 parameters: padded to 90
    parts = bytes_breakdown(odd, module_tree(odd), "blocks.1")
    assert parts[-2] == ["padding to a multiple of the shard size", "", "8 B", "", "2.2%"]
    detail = unit_details(report)[2]
    assert detail["title"] == "unit 2 of 4: 'blocks.1' (Block)"
    assert (
        detail["facts"]
        == "FULL_SHARD · 88 parameters in 4 tensors · float32 · 352 B full, 88 B per rank"
    )
    titles = [s["title"] for s in detail["sections"]]
    assert titles == [
        "Where its bytes go",
        "Parameters",
        "Shapes seen in the trace",
        "Events (steady state)",
    ]
    params = detail["sections"][1]
    assert params["note"] == "in flattening order: one FlatParameter"
    assert [r[0] for r in params["rows"]] == report.unit("blocks.1").params
    shapes = detail["sections"][2]["rows"]
    assert ["blocks.1.fc", "Linear", "1", "[2, 8]", "[2, 8]"] in shapes


def test_an_fsdp2_unit_is_described_in_fsdp2_words() -> None:
    """No FlatParameter, flattening order or sharding strategy for a fully_shard plan: each
    parameter is a DTensor sharded on dim 0, the unit's resharding is reshard_after_forward."""
    fsdp2 = fsdpviz.analyze(Tiny(), tiny_inputs(), fully_shard=["blocks.0", "blocks.1", "blocks.2"],
                            reshard_after_forward=False, world_size=3, progress=False)  # fmt: skip
    detail = unit_details(fsdp2)[2]
    text = str(detail)
    for fsdp1_word in ("FlatParameter", "flattening", "SHARD_GRAD_OP", "FULL_SHARD"):
        assert fsdp1_word not in text, fsdp1_word
    assert detail["facts"].startswith("reshard_after_forward=False · 88 parameters in 4 tensors")
    bytes_rows = detail["sections"][0]["rows"]
    assert bytes_rows[-1][0] == "in all (one all-gather)"
    assert bytes_rows[-2][0] == "padding: each dim 0 to a multiple of 3 ranks"
    params = detail["sections"][1]
    assert params["note"] == "each a DTensor sharded on dim 0, all-gathered together"
    assert params["header"][-1] == "shard per rank"
    assert params["rows"][2][1] == "8×8" and params["rows"][2][-1] == "3×8"  # 8 rows over 3


def test_a_parameterless_unit_reads_the_same_everywhere() -> None:
    """A root that holds no parameters of its own (FSDP1 wraps every layer): its dtype reads
    one way in the card, the explorer's hover and data, and its details."""
    from torch import nn
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from fsdpviz.views.card import units_table

    layers = ModuleWrapPolicy({nn.Linear, nn.LayerNorm})
    report = fsdpviz.analyze(
        Tiny(), tiny_inputs(), auto_wrap_policy=layers, world_size=4, progress=False
    )
    root = report.unit("")
    assert root.numel == 0 and root.dtype is None
    assert dtype_text(root) == "no parameters"
    assert explorer_data(report)["units"][0]["dtype"] == "no parameters"
    assert explorer_figure(report).data[0].customdata[0][5] == "no parameters"  # the hover
    assert "no parameters" in units_table(report)
    assert "no parameters" in unit_details(report)[0]["facts"]


def test_explorer_data_holds_what_the_figure_draws(report: Report) -> None:
    """explorer_data, what the exported page draws: every module in tree order with the
    figure's labels and colours, its parent, unit and subtree sizes."""
    data = explorer_data(report)
    m = data["modules"]
    trace = explorer_figure(report).data[0]
    tree = module_tree(report)
    assert m["name"] == [n.fqn for n in tree.nodes]
    assert m["label"] == list(trace.labels)
    assert [-1 if p < 0 else m["name"][p] for p in m["parent"]] == [
        -1 if n.parent is None else n.parent for n in tree.nodes
    ]
    assert m["numel"] == list(trace.values) == [n.numel_total for n in tree.nodes]
    assert m["rank_bytes"] == [n.rank_bytes_total for n in tree.nodes]
    units = data["units"]
    colors = [data["unmanaged_color"] if u < 0 else units[u]["color"] for u in m["unit"]]
    assert colors == list(trace.marker.colors)
    assert [units[u]["name"] for u in m["unit"]] == [n.unit for n in tree.nodes]
    assert [data["classes"][c] for c in m["cls"]] == [n.module_class for n in tree.nodes]
    assert units[0] == {
        "name": "",
        "color": unit_colors(report)[""],
        "dtype": "float32",
        "warnings": [],
    }
    assert data["title"] == "4 units, world size 4"


def test_front_end_test_data_is_current(report: Report) -> None:
    """js/test/data/explorer.json holds what explorer_data gives today."""
    check_front_end_data("explorer.json", explorer_data(report))


def test_an_image_labels_every_unit_block_that_has_room() -> None:
    """In an image (its width known), a unit's block too narrow for ``model.layers.0
    [unit 1]`` is labelled shorter (``unit 1``), never left blank where a short label fits;
    no label is longer than its block."""
    from fsdpviz.examples import ExampleConfig, example_analysis
    from fsdpviz.views.explorer import _CHAR_PX

    report = example_analysis(config=ExampleConfig(num_layers=8, vocab_size=32000),
                              progress=False)  # fmt: skip
    units = {u.module for u in report.units}
    fig = explorer_figure(report, width=1100)
    trace = fig.data[0]
    top = max(trace.values)
    drawn = dict(zip(trace.ids, zip(trace.labels, trace.values, strict=True), strict=True))
    for unit in units - {""}:
        label, value = drawn[unit]
        room = value / top * (1100 - 16) - 6
        assert label and len(label) * _CHAR_PX <= room, (unit, label, room)
        number = report.units.index(report.unit(unit))
        assert label in (f"{unit.rsplit('.')[-1]} [unit {number}]", f"[unit {number}]",
                         f"unit {number}", str(number)), label  # fmt: skip
    whole = dict(zip(trace.ids, explorer_figure(report).data[0].labels, strict=True))
    assert whole["layers.0"] == "layers.0 [unit 1]"  # no width: the whole label


def test_detail_panel_shows_each_parameters_fsdp_placement() -> None:
    """A unit whose ``shard_placement_fn`` shards weights on dim 1: the parameters table
    gives each parameter's placement and its padded shard (no tensor-parallel column)."""
    import torch
    from handwritten_models import Stack
    from torch.distributed.tensor import Shard

    torch.manual_seed(0)
    report = fsdpviz.analyze(
        Stack(), torch.randn(4, 8), fully_shard=["blocks.0"], world_size=4,
        shard_placement_fn=lambda p: Shard(1) if p.ndim == 2 else None,
    )  # fmt: skip
    table = next(s for s in unit_details(report)[1]["sections"] if s["title"] == "Parameters")
    assert table["header"][5:] == ["FSDP placement", "shard per rank"]
    assert "shard_placement_fn" in table["note"]
    rows = {r[0]: r[5:] for r in table["rows"]}
    assert rows["blocks.0.fc1.weight"] == ["Shard(1)", "32×4"]
    assert rows["blocks.0.fc1.bias"] == ["Shard(0)", "8"]
    root = param_rows(report, "")
    assert {r[0]: r[5:] for r in root}["head.bias"] == ["Shard(0)", "1"]  # 3 over 4: padded
