"""Anchor: FSDP1 hybrid sharding's memory at every event against real torch.

``HYBRID_SHARD`` and ``_HYBRID_SHARD_ZERO2``: shards over 2 ranks, 2 replicas (the fake
process group's 4 ranks), float32 and bf16 parameters, with and without ``no_sync``. The
real model runs one optimizer step (its buffers made, its orders recorded), then another
under torch's ``MemTracker`` and fsdpviz's recorder. At each event the recorder sees: the
bytes in use at the moment the plan's row stands for, and the most in use since the event
before. The plan's steady micro-steps hold the same events, and its memory model the same
two figures at each (``total``, ``peak_before``), to the byte, at the moments
:func:`every_event.fsdp1_events` names (FSDP2's HSDP is anchored in
``test_cost_fsdp2_every_event.py``).
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any, cast

import pytest
import torch
from every_event import Measured, fsdp1_events, same, steady
from test_cost_fsdp1_memtracker import (
    BF16_FP32,
    CONFIG,
    _fsdp1,
    _ids,
    _loss,
    _SecondLayerTwice,
)
from torch import nn
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleModel


def _measured_fsdp1(
    kwargs: dict[str, Any], micro_steps: int, build: type[nn.Module] = ExampleModel
) -> Measured:
    """FSDP1 hybrid sharding (each layer a unit, the root one): the events of the second
    optimizer step's micro-steps (the first ``micro_steps - 1`` under ``no_sync``), each
    with the bytes at its moment and the most since the event before; ``build``: the model
    of ``CONFIG``."""
    fsdp = _fsdp1(build, CONFIG, kwargs, mesh=(2, 2))
    ids = _ids()

    def step(tracker: Any = None) -> None:
        for k in range(micro_steps):
            with fsdp.no_sync() if k < micro_steps - 1 else nullcontext():
                out = fsdp(ids)
                _loss(out).backward()
                del out
            if tracker is not None:
                tracker.reset_mod_stats()  # it follows one iteration at a time

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step()
    fsdp.zero_grad(set_to_none=True)
    with fsdp1_events(fsdp, ids) as log:
        step(log.tracker)
    return cast(Measured, log.measured())


STRATEGIES = [ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2]


@pytest.mark.parametrize("micro_steps", [1, 2], ids=["one_step", "no_sync"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name.lower())
def test_fsdp1_hybrid_sharding_holds_what_torch_holds_at_every_event(
    fake_pg: int, strategy: ShardingStrategy, precision: str, micro_steps: int
) -> None:
    assert fake_pg == 4
    kwargs: dict[str, Any] = {"sharding_strategy": strategy}
    if precision == "bf16":
        kwargs["mixed_precision"] = BF16_FP32
    _check_fsdp1(kwargs, micro_steps)


@pytest.mark.parametrize("micro_steps", [1, 2], ids=["one_step", "no_sync"])
def test_fsdp1_unit_run_twice_under_parameter_mixed_precision_at_every_event(
    fake_pg: int, micro_steps: int
) -> None:
    """The second layer run twice, bf16 parameters: its post-backward hook is passed the
    first forward's gradient beside ``.grad`` (the second's), let go as the hook returns."""
    assert fake_pg == 4
    kwargs = {"sharding_strategy": ShardingStrategy.HYBRID_SHARD, "mixed_precision": BF16_FP32}
    _check_fsdp1(kwargs, micro_steps, _SecondLayerTwice)


def _check_fsdp1(
    kwargs: dict[str, Any], micro_steps: int, build: type[nn.Module] = ExampleModel
) -> None:
    real = _measured_fsdp1(kwargs, micro_steps, build)
    with torch.device("meta"):
        model = build(CONFIG)
    accum = {"grad_accum": micro_steps} if micro_steps > 1 else {}
    report = fsdpviz.analyze(
        model,
        {"input_ids": _ids()},
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        world_size=4,
        shard_group_size=2,
        loss=_loss,
        **kwargs,
        **accum,
    )
    same(real, steady(report, micro_steps))
