"""Conformance of fine-tuning with ``peft`` adapters on 2 gloo ranks: LoRA (Llama) and DoRA
(GPT-NeoX, a magnitude vector per adapted linear) under FSDP1 (each layer a unit with
``use_orig_params=True``, or peft's own wrap policy as accelerate applies it) and FSDP2.

Each rank equals ``analyze``: the units (which parameters are frozen, the trainable elements
a rank holds), the forward order and both iterations event for event. And the bytes: every
all-gather's output and reduce-scatter's input the rank issued equals the time model's and
the memory model's (FSDP2 reduce-scatters the adapters' gradients only; FSDP1 the whole
FlatParameter's), and after a step of AdamW over ``model.parameters()`` its state (the
adapters' shards only, as the rank that holds the most) and the gradients FSDP left equal
the memory model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_harness import assert_same_schedule, timeline_collectives
from gloo_worker import peft_cases, spawn_suite

import fsdpviz
from fsdpviz.cost import memory_model
from fsdpviz.cost.sizes import unit_bytes
from fsdpviz.schema.memory import CATEGORIES

pytest.importorskip("peft")
pytest.importorskip("transformers")
WORLD_SIZE = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("peft"), WORLD_SIZE, "peft")


def _hf_loss(out: Any) -> torch.Tensor:
    loss: torch.Tensor = out.loss
    return loss


@pytest.mark.slow
@pytest.mark.parametrize("name", list(peft_cases()))
def test_adapters_on_gloo_ranks(runs: Path, name: str) -> None:
    case = peft_cases()[name]
    torch.manual_seed(0)
    model, inputs = case.build()
    options = case.options(model)
    predicted = fsdpviz.analyze(model, inputs, world_size=WORLD_SIZE, loss=_hf_loss, **options)
    mixed = [u for u in predicted.units if u.requires_grad is None]
    if name.endswith("peft-policy"):  # each adapter its own unit: none mixes
        assert not mixed and any(u.requires_grad for u in predicted.units)
    else:
        assert mixed and all(u.frozen_params for u in mixed)
    fsdp2 = predicted.config.api == "FSDP2"
    sizes = unit_bytes(predicted, "adamw")
    by_event = [
        [e.kind, sizes[e.unit].all_gather or sizes[e.unit].unsharded]
        if e.kind == "all_gather"
        else [e.kind, sizes[e.unit].reduce_scatter]
        for i in (0, 1, 1)
        for e in predicted.iterations[i]
        if e.kind in ("all_gather", "reduce_scatter")
    ]
    collectives = timeline_collectives(predicted, WORLD_SIZE)
    assert collectives == by_event  # the time model and the memory model agree
    mem = memory_model(predicted, optimizer="adamw")
    optimizer = mem.peak["breakdown"]["optimizer"]
    assert optimizer == 2 * sum(4 * u.trainable[1] for u in predicted.units)
    grads = mem.moments[-1].bytes[CATEGORIES.index("sharded_grads")]
    most = 0
    for rank in range(WORLD_SIZE):
        real = fsdpviz.load(str(runs / f"{name}-rank{rank}.json"))
        assert_same_schedule(real, predicted)
        measured = json.loads((runs / f"{name}-measured-rank{rank}.json").read_text())
        assert measured["collectives"][: measured["recorded"]] == collectives
        assert measured["sharded_grads"] == grads
        most = max(most, measured["optimizer"])
        if fsdp2:  # each rank holds the same padded shards; rank 0 all their rows
            assert measured["optimizer"] <= optimizer
    assert most == optimizer
