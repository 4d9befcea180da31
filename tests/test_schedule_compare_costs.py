"""What changes if I switch: compare() in peak memory, reserved, step time,
exposed communication and tokens/s."""

from __future__ import annotations

import json

import pytest
import torch

import fsdpviz
from fsdpviz.api.comparison import COSTS, plan_costs
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_model
from fsdpviz.schema.memory import size_text

CONFIG = ExampleConfig()


def _plan(batch: int = 2, **kwargs: object) -> fsdpviz.Report:
    ids = torch.zeros(batch, 128, dtype=torch.long)
    return fsdpviz.analyze(example_model(CONFIG), ids, fully_shard=[DecoderLayer], **kwargs)


@pytest.fixture(scope="module")
def base() -> fsdpviz.Report:
    return _plan()


def test_plans_differing_only_in_memory_and_time_are_not_identical(
    base: fsdpviz.Report,
) -> None:
    """Same wrapping and schedule (the same units and events), twice the batch: the peak,
    the reserved estimate and tokens/s differ, and the comparison says so."""
    bigger = _plan(batch=4)
    cmp = fsdpviz.compare(base, bigger)
    assert cmp.same_wrapping and not any(p.differs for p in cmp.pairs)
    assert not cmp.identical
    assert cmp.verdict == "same wrapping and schedule, different memory and time"
    assert set(cmp.costs) == set(COSTS)
    assert cmp.costs["peak_bytes"] == (base.memory.peak["bytes"], bigger.memory.peak["bytes"])
    assert cmp.delta("peak_bytes") == bigger.memory.peak["bytes"] - base.memory.peak["bytes"] > 0
    assert cmp.costs["reserved_bytes"][1] == bigger.memory.reserved["bytes"]
    tokens = cmp.costs["tokens_per_s"]
    assert tokens == (base.timeline.totals["tokens_per_s"], bigger.timeline.totals["tokens_per_s"])
    assert "peak_bytes" in cmp.cost_differs and "tokens_per_s" in cmp.cost_differs
    lines = cmp.summary().splitlines()
    assert lines[0].endswith(cmp.verdict)
    peak = next(line for line in lines if line.startswith("  peak: "))
    a, b = (base.memory.peak["bytes"] / 2**20, bigger.memory.peak["bytes"] / 2**20)
    assert peak.startswith(f"  peak: {a:.1f} MiB vs {b:.1f} MiB (+{b - a:.1f} MiB, +")
    assert any(line.startswith("  tokens/s: ") for line in lines)
    d = cmp.to_dict()
    assert d["identical"] is False and d["costs"]["peak_bytes"] == list(cmp.costs["peak_bytes"])
    json.dumps(d)


def test_reshard_after_forward_shows_its_memory_cost(base: fsdpviz.Report) -> None:
    kept = _plan(reshard_after_forward=False)
    cmp = fsdpviz.compare(base, kept)
    assert cmp.verdict == "same wrapping, different schedule"
    assert cmp.delta("peak_bytes") > 0  # parameters kept from forward to backward
    assert f"+{size_text(cmp.delta('peak_bytes'))}" in cmp.summary()


def test_a_plan_is_identical_to_itself_and_to_its_replay(base: fsdpviz.Report) -> None:
    from fsdpviz.replan import replay

    assert fsdpviz.compare(base, base).identical
    same = replay(base, world_size=base.config.world_size)
    cmp = fsdpviz.compare(base, same)
    assert cmp.identical and cmp.verdict == "identical" and not cmp.cost_differs
    assert "(same)" in cmp.summary()


def test_without_a_trace_profile_the_costs_are_left_out(base: fsdpviz.Report) -> None:
    bare = _plan(profile=False)
    assert plan_costs(bare) == {}
    cmp = fsdpviz.compare(base, bare)
    assert cmp.costs == {}
    assert "costs: not modelled (a plan has no trace profile)" in cmp.summary()


def test_activation_checkpointing_compares_unit_by_unit(base: fsdpviz.Report) -> None:
    """Checkpoint wrappers rename the parameters (``layers.0._checkpoint_wrapped_module.…``,
    as torchtitan's AC does): the units keep their names (a call on the block inside the
    wrapper names its unit as a recording does, without the wrapper's segment), they still
    match, their parameters listed under the same names (without the segment, as
    ``compare`` matches them), and the costs say what it buys."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    model = example_model(CONFIG)
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, DecoderLayer))
    ids = torch.zeros(2, 128, dtype=torch.long)
    checkpointed = fsdpviz.analyze(model, ids, fully_shard=[DecoderLayer])
    assert checkpointed.units[1].module == "layers.0"
    assert checkpointed.forward_order[:3] == ["", "layers.0", "layers.1"]
    cmp = fsdpviz.compare(base, checkpointed)
    assert cmp.same_wrapping and cmp.moved_params == {}
    assert [(p.a, p.b) for p in cmp.pairs][1] == ("layers.0", "layers.0")
    assert [u.params for u in checkpointed.units] == [u.params for u in base.units]
    assert checkpointed.unit("layers.0").params[0].startswith("layers.0.")
    assert cmp.delta("peak_bytes") < 0  # fewer activations saved
    assert cmp.delta("step_s") > 0  # the recomputation


def test_the_comparison_shows_its_differences(base: fsdpviz.Report) -> None:
    """As a cell's last line, and with show(): the view of the differences (each cost of
    both plans and the change, as print(cmp) says them) over both timelines."""
    pytest.importorskip("anywidget")
    from fsdpviz.api.comparison import cost_text
    from fsdpviz.widgets import ComparisonView

    bigger = _plan(batch=4)
    cmp = fsdpviz.compare(base, bigger)
    bundle = cmp._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == cmp.summary()
    table = bundle["text/html"]
    assert "<b>same wrapping and schedule, different memory and time</b>" in table
    for key in COSTS:
        a, b = cmp.costs[key]
        row = table.split(f'data-fv-cost="{key}"')[1].split("</tr>")[0]
        assert f">{cost_text(key, a)}<" in row and f">{cost_text(key, b)}<" in row
        assert f">{cmp.change_text(key)}<" in row
        assert f"({cmp.change_text(key)})" in str(cmp)  # the same words as print(cmp)
    view = cmp.show()
    assert isinstance(view, ComparisonView)
    assert view.differences.value == table
    assert len(view.timeline.data["groups"]) == 2


def test_changes_read_without_minus_zero() -> None:
    """A change too small for the cost's digits is not "-0 (-0%)"."""
    from fsdpviz.api.comparison import Comparison

    cmp = Comparison("a", "b", [], costs={"tokens_per_s": (5000.0, 4999.7),
                                          "step_s": (1.0, 1.0004)})  # fmt: skip
    assert cmp.change_text("tokens_per_s") == "-0.3, under 0.1%"
    assert cmp.change_text("step_s") == "+400 µs, under 0.1%"
    assert "-0" not in str(cmp).replace("-0.3", "")


def test_two_plans_of_one_api_are_told_apart_by_name(base: fsdpviz.Report) -> None:
    from fsdpviz.replan import replay

    cmp = fsdpviz.compare(base, replay(base, world_size=2))
    assert cmp.name_a.endswith(", world size 8") and cmp.name_b.endswith(", world size 2")
    assert cmp.name_a.startswith("FSDP2 prediction")
    same = fsdpviz.compare(base, base)
    assert same.name_a != same.name_b
