"""Frozen parameters (a fine-tune with adapters): what trains is what costs.

The backward of a frozen linear computes its input's gradient only (the trace's kernels), the
optimizer keeps state for the trainable parameters' shards, FSDP2 reduce-scatters the
gradients that exist (FSDP1 the whole FlatParameter's), and the card, the summaries and the
timeline's header say how many parameters train. Real FSDP's side of each is checked in
``test_conformance_peft.py`` (gloo) and ``test_cost_memtracker.py`` (FSDPMemTracker).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost import timeline
from fsdpviz.cost.sizes import unit_bytes
from fsdpviz.plan.fsdp1 import flat_param_layout
from fsdpviz.replan import replay
from fsdpviz.views.card import report_html
from fsdpviz.views.timeline_view import timeline_data

D, TOKENS = 64, 32


class Adapted(nn.Module):
    """A frozen linear with a low-rank adapter beside it (LoRA's shape)."""

    def __init__(self, rank: int = 4) -> None:
        super().__init__()
        self.base = nn.Linear(D, D, bias=False)
        self.down = nn.Linear(D, rank, bias=False)
        self.up = nn.Linear(rank, D, bias=False)
        self.base.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


class Model(nn.Module):
    def __init__(self, adapters: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(D, D, bias=False)
        self.blocks = nn.ModuleList(Adapted() if adapters else nn.Linear(D, D, bias=False)
                                    for _ in range(3))  # fmt: skip
        if adapters:
            self.inp.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return x


def _x() -> torch.Tensor:
    return torch.zeros(TOKENS, D)


def _fsdp2(model: nn.Module, **kw: Any) -> fsdpviz.Report:
    return fsdpviz.analyze(model, _x(), fully_shard=[("blocks.0",), ("blocks.1",), ("blocks.2",)],
                           **kw)  # fmt: skip


def test_a_frozen_weight_gets_no_gradient_kernel() -> None:
    """FLOPs of the step, per matrix multiply: ``2 t d d`` for each forward; in backward the
    first linear's input needs no gradient and a frozen weight gets none, so the frozen
    model's backward computes only its adapters' weight gradients and the activations'."""
    with torch.device("meta"):
        full, tuned = Model(adapters=False), Model(adapters=True)
    mm = 2 * TOKENS * D * D  # one (t x d) @ (d x d)
    trained = timeline(_fsdp2(full, world_size=2)).totals["hardware_flops"]
    # forward 4 mm; backward: inp's weight, each block's weight and input
    assert trained == 4 * mm + (1 + 3 * 2) * mm
    low = 2 * TOKENS * D * 4  # (t x d) @ (d x r), (t x r) @ (r x d), (d x t) @ (t x r), ...
    # forward: inp, and per block base, down and up
    forward = 4 * mm + 3 * 2 * low
    # backward, per block: the gradient of down's output and the adapters' two weight
    # gradients; the input's gradient (through base and down) for blocks 1 and 2 only: the
    # first block's input comes from inp, whose weight is frozen and input needs none
    backward = 3 * 3 * low + 2 * (mm + low)
    frozen = timeline(_fsdp2(tuned, world_size=2))
    assert frozen.totals["hardware_flops"] == forward + backward
    assert any("trainable of" in n and "no weight gradient" in n for n in frozen.notes)


def test_optimizer_state_and_fsdp2_reduce_scatter_count_the_adapters() -> None:
    with torch.device("meta"):
        model = Model(adapters=True)
    report = _fsdp2(model, world_size=4)
    block = report.unit("blocks.0")
    assert block.requires_grad is None
    assert block.frozen_params == ["blocks.0.base.weight"]
    adapters = 2 * 4 * D
    assert block.trainable == (adapters, adapters // 4)
    sizes = unit_bytes(report, "adamw")["blocks.0"]
    assert sizes.optimizer == 2 * 4 * adapters // 4  # AdamW: two fp32 states per element
    assert sizes.sharded_grad == 4 * adapters // 4
    assert sizes.reduce_scatter == 4 * adapters  # the adapters' padded gradients only
    assert sizes.sharded == 4 * (D * D + adapters) // 4  # every parameter stays sharded
    root = unit_bytes(report, "adamw")[""]  # inp: frozen, no gradient
    assert (root.optimizer, root.reduce_scatter, root.sharded_grad) == (0, 0, 0)
    reduced = [r for r in timeline(report).records() if r["kind"] == "reduce_scatter"]
    assert [r["bytes"] for r in reduced] == [3 / 4 * 4 * adapters] * 3  # (n - 1) / n of it


def test_fsdp1_reduces_the_whole_flat_parameter_and_steps_the_adapters() -> None:
    with torch.device("meta"):
        model = Model(adapters=True)
    policy = ModuleWrapPolicy({Adapted})
    report = fsdpviz.analyze(model, _x(), auto_wrap_policy=policy, world_size=4,
                             use_orig_params=True)  # fmt: skip
    block = report.unit("blocks.0")
    sizes = unit_bytes(report, "adamw")["blocks.0"]
    assert sizes.reduce_scatter == 4 * block.padded_numel  # zeros where frozen, reduced too
    assert sizes.sharded_grad == 4 * block.sharded_numel
    # base.weight (4096) fills rank 0's and part of rank 1's shard of 4608: rank 1 holds
    # 512 more elements, all of them the adapters': the most any rank holds of them
    assert block.sharded_numel == 1152 and block.trainable == (512, 512)
    assert sizes.optimizer == 2 * 4 * 512


def test_flat_layout_counts_the_trainable_elements_of_the_fullest_shard() -> None:
    layout = flat_param_layout([10, 3, 7], 4, use_orig_params=True, shard_world_size=3)
    # aligned to 4 elements: [10, pad 2, 3, pad 1, 7, pad 1] = 24 -> shards of 8
    assert layout.split_numels == [10, 2, 3, 1, 7, 1] and layout.sharded_numel == 8
    assert layout.trainable([False, True, True]) == (10, 7)  # rank 2: 16..24 holds 7 of 7
    assert layout.trainable([True, False, False]) == (10, 8)
    assert layout.trainable([False, False, False]) == (0, 0)


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_replay_recomputes_what_trains(api: str) -> None:
    def plan(ws: int) -> fsdpviz.Report:
        with torch.device("meta"):
            model = Model(adapters=True)
        if api == "FSDP2":
            return _fsdp2(model, world_size=ws)
        return fsdpviz.analyze(model, _x(), auto_wrap_policy=ModuleWrapPolicy({Adapted}),
                               use_orig_params=True, world_size=ws)  # fmt: skip

    base = plan(2)
    for ws in (3, 8):
        fresh, replayed = plan(ws), replay(base, world_size=ws)
        assert [u.to_dict() for u in replayed.units] == [u.to_dict() for u in fresh.units]
        assert replayed.memory.peak == fresh.memory.peak


def test_the_card_summaries_and_timeline_say_what_trains() -> None:
    with torch.device("meta"):
        tuned, full = Model(adapters=True), Model(adapters=False)
    report = _fsdp2(tuned, world_size=2)
    n, adapters = 4 * D * D + 3 * 2 * 4 * D, 3 * 2 * 4 * D
    said = f"{adapters:,} trainable of {n:,} parameters (8.57%)"
    assert report.trainable_text() == said
    assert f"  {said}: optimizer state and gradients of those" in report.summary()
    assert f"\n{said}: optimizer state and gradients of those\n" in report.memory.summary()
    assert "<b>1,536 trainable</b> of 17.9 K parameters" in report_html(report)
    group = timeline_data(report)["groups"][0]
    assert group["summary"].endswith(f"world size 2 · {said}")
    whole = _fsdp2(full, world_size=2)
    assert whole.trainable_text() == "" and "trainable" not in report_html(whole)
    assert "trainable" not in whole.summary() + whole.memory.summary()
    assert not [n for n in whole.timeline.notes if "trainable" in n]


def test_units_read_back_with_what_trains() -> None:
    with torch.device("meta"):
        report = _fsdp2(Model(adapters=True), world_size=2)
    back = fsdpviz.Report.from_json(report.to_json())
    assert back.units == report.units
    assert "frozen_params" not in report.unit("").to_dict()  # all frozen: requires_grad says
    for u, k in itertools.product(report.units[1:], ("frozen_params", "trainable_numel")):
        assert k in u.to_dict()
