"""The explorer figure and its data: module tree sizes, colours, labels, hover and the golden JSON.

Golden files ``tests/golden/views_explorer_*.json``; rewrite them after an intended change
with ``FSDPVIZ_UPDATE_GOLDEN=1 pytest tests/test_views_explorer.py`` and review the diff.
"""

from __future__ import annotations

import itertools

import pytest
from views_models import analyze_tiny, check_front_end_data, check_golden, figure_json

from fsdpviz import Report
from fsdpviz.examples import ExampleConfig, example_analysis
from fsdpviz.views import PALETTE, explorer_figure, module_tree, unit_colors, unit_detail_html
from fsdpviz.views.detail import bytes_breakdown, param_rows
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
    html = unit_detail_html(report, "blocks.1", "blocks.1.fc")
    for text in (
        "unit 2 of 4",
        "Where its bytes go",
        "blocks.1.fc.weight",
        "Shapes seen",
        "[2, 8]",
        "Selected module",
    ):
        assert text in html
    assert "Click a module" in unit_detail_html(report, None)


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
