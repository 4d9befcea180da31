"""Anchor: FSDP1's memory at every event against real torch, across its options.

``FULL_SHARD``, ``SHARD_GRAD_OP`` and ``NO_SHARD`` on the fake process group's 4 ranks,
each layer a unit (the root one), with the backward prefetches (``BACKWARD_PRE``,
``BACKWARD_POST``, none), forward prefetch, ``limit_all_gathers=False``,
``use_orig_params=True``, bf16 parameters (reduced in float32 or bf16), gradient
accumulation under ``no_sync``, the layers under non-reentrant activation checkpointing
(applied inside their units after wrapping, as trainers do) and a layer whose parameters
are all frozen. The moments, and the two figures compared at each event (the bytes in
use, the most since the event before), are those of ``test_cost_hybrid_every_event.py``
(:func:`every_event.fsdp1_run`). A case runs as rank 0, or where the plan counts the most
any rank holds and another rank holds more, as that rank (``Case.rank``). CPU offload is
not compared here: on the CPU the host's bytes and the device's are one count (its peaks
are, in ``test_cost_fsdp1_memtracker.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
from every_event import fsdp1_run, same, steady
from test_cost_fsdp1_memtracker import BF16, BF16_FP32, CONFIG, _fsdp1, _ids, _report
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

from fsdpviz.examples import DecoderLayer, ExampleConfig, ExampleModel

FULL = ShardingStrategy.FULL_SHARD
GRAD_OP = ShardingStrategy.SHARD_GRAD_OP
NO_SHARD = ShardingStrategy.NO_SHARD
PRE = BackwardPrefetch.BACKWARD_PRE
POST = BackwardPrefetch.BACKWARD_POST


@dataclass(frozen=True)
class Case:
    """FSDP1's keywords (the same for ``analyze``), the micro-steps of an optimizer step,
    whether the layers are checkpointed and whether the first layer is frozen."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    micro_steps: int = 1
    checkpointed: bool = False
    frozen: bool = False
    rank: int = 0  # the fake process group's rank it runs as


def _model(config: ExampleConfig, frozen: bool) -> ExampleModel:
    """The example model; ``frozen``: its first layer's parameters all frozen."""
    model = ExampleModel(config)
    if frozen:
        model.layers[0].requires_grad_(False)
    return model


CASES: dict[str, Case] = {
    "full-shard": Case({"sharding_strategy": FULL, "backward_prefetch": PRE}),
    "full-shard-post": Case({"sharding_strategy": FULL, "backward_prefetch": POST}),
    "full-shard-none": Case({"sharding_strategy": FULL, "backward_prefetch": None}),
    "full-shard-forward-prefetch": Case({"forward_prefetch": True}),
    "full-shard-unlimited": Case({"limit_all_gathers": False, "forward_prefetch": True}),
    "full-shard-orig": Case({"use_orig_params": True}),
    "full-shard-bf16-fp32": Case({"mixed_precision": BF16_FP32}),
    "full-shard-bf16": Case({"mixed_precision": BF16, "backward_prefetch": POST}),
    "full-shard-no-sync": Case({}, 2),
    "full-shard-bf16-fp32-no-sync-3": Case({"mixed_precision": BF16_FP32}, 3),
    "full-shard-checkpointed": Case({}, checkpointed=True),
    "full-shard-checkpointed-bf16-fp32-no-sync": Case(
        {"mixed_precision": BF16_FP32}, 2, checkpointed=True
    ),
    "full-shard-frozen-orig": Case({"use_orig_params": True}, frozen=True),
    # under no_sync the post-backward gives each parameter (its 1-D part of the rank's
    # shard) a view of the unsharded gradient by way of an empty_like of the part; the
    # frozen layer's backward after the second layer's is too small to hide it: a part's
    # bytes were missing after that layer's reshard. The plan counts the most any rank
    # has, rank 3's (10,200 float32 elements; rank 0's: 3,600): these run as rank 3
    "full-shard-frozen-orig-bf16-fp32-no-sync": Case(
        {"use_orig_params": True, "mixed_precision": BF16_FP32}, 2, frozen=True, rank=3
    ),
    "full-shard-frozen-orig-post-forward-prefetch-no-sync": Case(
        {"use_orig_params": True, "backward_prefetch": POST, "forward_prefetch": True},
        2,
        frozen=True,
        rank=3,
    ),
    "shard-grad-op": Case({"sharding_strategy": GRAD_OP}),
    "shard-grad-op-post-bf16-fp32": Case(
        {"sharding_strategy": GRAD_OP, "backward_prefetch": POST, "mixed_precision": BF16_FP32}
    ),
    "shard-grad-op-no-sync-orig": Case({"sharding_strategy": GRAD_OP, "use_orig_params": True}, 2),
    "shard-grad-op-checkpointed-forward-prefetch": Case(
        {"sharding_strategy": GRAD_OP, "forward_prefetch": True}, checkpointed=True
    ),
    "no-shard": Case({"sharding_strategy": NO_SHARD}),
    "no-shard-bf16-fp32-no-sync": Case(
        {"sharding_strategy": NO_SHARD, "mixed_precision": BF16_FP32}, 2
    ),
    # the post-backward under no_sync gives each parameter (float32, no gradient yet) a
    # view of the bf16 gradient by way of an empty_like of it: the largest parameter's
    # bytes (a layer's 40,800 B, the root's 24,240 B) were missing after each unit's
    # reshard, the most since the event before 6,448 B and 3,504 B low at two rows
    "no-shard-orig-bf16-fp32-no-sync": Case(
        {"sharding_strategy": NO_SHARD, "use_orig_params": True, "mixed_precision": BF16_FP32}, 2
    ),
    "no-shard-orig-bf16-no-sync-3-frozen-checkpointed": Case(
        {"sharding_strategy": NO_SHARD, "use_orig_params": True, "mixed_precision": BF16},
        3,
        checkpointed=True,
        frozen=True,
    ),
    "no-shard-bf16-post": Case(
        {"sharding_strategy": NO_SHARD, "mixed_precision": BF16, "backward_prefetch": POST}
    ),
    "no-shard-frozen-orig-checkpointed": Case(
        {"sharding_strategy": NO_SHARD, "use_orig_params": True}, checkpointed=True, frozen=True
    ),
}


def compare(setup: Case, as_rank: Callable[..., None], hybrid: bool = False) -> None:
    """Run ``setup`` in real FSDP1 (``hybrid``: on a 2 x 2 mesh, 2 shards and 2 replicas)
    and plan it; the two agree at every event of the steady step."""
    if setup.rank:
        as_rank(setup.rank, 4)
    mesh: dict[str, Any] = {"mesh": (2, 2)} if hybrid else {}
    fsdp = _fsdp1(lambda c: _model(c, setup.frozen), CONFIG, setup.kwargs, **mesh)
    if setup.checkpointed:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wrapper = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            apply_activation_checkpointing(
                fsdp, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, DecoderLayer)
            )
    real = fsdp1_run(fsdp, _ids(), setup.micro_steps)
    kwargs = dict(setup.kwargs)
    if hybrid:
        kwargs["shard_group_size"] = 2
    if setup.checkpointed:
        kwargs["activation_checkpointing"] = [DecoderLayer]
    build = partial(_model, frozen=setup.frozen)
    report = _report(kwargs, setup.micro_steps, build=build)
    same(real, steady(report, setup.micro_steps))


@pytest.mark.parametrize("case", list(CASES))
def test_fsdp1_options_hold_what_torch_holds_at_every_event(
    as_rank: Callable[..., None], case: str
) -> None:
    compare(CASES[case], as_rank)
