"""A 10,000-module model (the bundled example with 833 decoder layers, ~12 modules each):
every figure's JSON stays under 5 MB and the timeline carries over 5,000 steps.

Build times are measured in ``benchmarks/bench_views.py``, not asserted here.
"""

from __future__ import annotations

import json

import pytest

from fsdpviz import Report
from fsdpviz.examples import ExampleConfig, example_analysis
from fsdpviz.views import (
    explorer_figure,
    module_tree,
    prefetch_figure,
    timeline_data,
    timeline_figure,
)
from fsdpviz.views.tree import EXPLORER_BUDGET

LIMIT = 5_000_000
LAYERS = 833
SMALL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2}


@pytest.fixture(scope="module")
def big() -> Report:
    config = ExampleConfig(num_layers=LAYERS, **SMALL)
    return example_analysis(config=config, progress=False)


def test_model_has_ten_thousand_modules(big: Report) -> None:
    assert len(big.modules) >= 10_000
    assert len(big.units) == LAYERS + 1


@pytest.mark.parametrize("kind", ["icicle", "treemap"])
def test_explorer_json_under_5_mb(big: Report, kind: str) -> None:
    fig = explorer_figure(big, kind=kind, size="rank_bytes")  # type: ignore[arg-type]
    assert len(fig.to_json()) < LIMIT
    # The browser draws every module as an SVG path: the top of the tree is drawn, down to
    # the blocks, each marked as one to open.
    trace = fig.data[0]
    assert len(trace.ids) == 1 + 4 + LAYERS <= EXPLORER_BUDGET
    blocks = [label for label in trace.labels if label.startswith("layers.")]
    assert len(blocks) == LAYERS and all(label.endswith(" ▸") for label in blocks)
    assert trace.values[0] == sum(u.sharded_bytes for u in big.units)  # the whole model
    assert "10,001 modules: click a block marked ▸ to open it" in fig.layout.title.text


def test_explorer_opens_a_block(big: Report) -> None:
    tree = module_tree(big)
    fig = explorer_figure(big, tree=tree, focus="layers.400")
    trace = fig.data[0]
    inside = [n.fqn for n in tree.nodes if n.fqn.startswith("layers.400")]
    assert list(trace.ids) == inside and trace.parents[0] == ""
    assert trace.values[0] == tree.by_fqn["layers.400"].numel_total
    assert not any(label.endswith(" ▸") for label in trace.labels)
    assert "inside 'layers.400': click it to go up" in fig.layout.title.text


def test_prefetch_and_timeline_json_under_5_mb(big: Report) -> None:
    assert len(prefetch_figure(big).to_json()) < LIMIT
    n = len(big.iterations[-1])
    memory = [float(i % 97) for i in range(n)]
    assert len(timeline_figure(big, memory=memory).to_json()) < LIMIT


def test_timeline_widget_payload_for_5000_steps(big: Report) -> None:
    data = timeline_data(big, None)
    assert data["n_steps"] > 5_000
    # sent once; stepping and playing then run in the browser
    assert len(json.dumps(data)) < LIMIT
