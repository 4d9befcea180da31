"""Anchor: FSDP1 hybrid sharding's memory at every event against real torch.

``HYBRID_SHARD`` and ``_HYBRID_SHARD_ZERO2``: shards over 2 ranks, 2 replicas (the fake
process group's 4 ranks), float32 and bf16 parameters, with and without ``no_sync``. The
real model runs one optimizer step (its buffers made, its orders recorded), then another
under torch's ``MemTracker`` and fsdpviz's recorder. At each event the recorder sees: the
bytes in use at the moment the plan's row stands for, and the most in use since the event
before. The plan's steady micro-steps hold the same events, and its memory model the same
two figures at each (``total``, ``peak_before``), to the byte (``every_event.py``; FSDP2's
HSDP is anchored in ``test_cost_fsdp2_every_event.py``).

The moments, as FSDP1's code runs them: a free or a prefetch, once its call returns; an
all-gather once ``_unshard`` returns (``post_unshard`` frees the low-precision shard it
gathered); a reduce-scatter and the all-reduce across the replicas, once the post-backward
hook's work is let go (autograd lets go of the gradients the hook was passed, a post hook
of the ``AccumulateGrad`` node, as it returns).
"""

from __future__ import annotations

import warnings
import weakref
from contextlib import nullcontext
from typing import Any
from unittest.mock import patch

import pytest
import torch
from every_event import Measured, same, settled_after, settler, steady
from test_cost_fsdp1_memtracker import (
    BF16_FP32,
    CONFIG,
    _fsdp1,
    _ids,
    _loss,
    _SecondLayerTwice,
    _Tracker,
)
from torch import nn
from torch.distributed._tools.mem_tracker import _MemRefType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp import _runtime_utils as ru
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.utils._pytree import tree_leaves

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleModel
from fsdpviz.recording import FSDP1Recorder
from fsdpviz.schema.events import Event


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
    tracker = _Tracker()
    tracker.track_external(fsdp, ids)
    for module in fsdp.modules():
        if isinstance(module, FSDP) and module._handle is not None:
            flat = module._handle.flat_param
            for name in ("_full_param_padded", "_mp_shard"):
                buffer = getattr(flat, name, None)
                if buffer is not None:
                    tracker._update_and_maybe_create_winfos(buffer, _MemRefType.OTH)
    seen: list[list[Any]] = []  # [kind, unit, bytes after, peak since the event before]
    issued: dict[int, list[Any]] = {}  # index in the recorder's iteration -> its entry
    # events whose moment is the end of an enclosing call: an all-gather's, its
    # ``_unshard`` (``post_unshard`` frees the low-precision shard it gathered); a
    # reduction's, the post-backward hook's, once autograd lets go of the gradients it was
    # passed (as it returns; its buffers and .grad went before)
    deferred: dict[str, list[list[Any]]] = {"unshard": [], "post_backward": []}

    settle = settler(tracker)

    class Recorder(FSDP1Recorder):
        def _append(self, event: Event) -> int:
            entry = [event.kind, event.unit, None, None]
            seen.append(entry)
            super()._append(event)
            if event.kind == "all_gather":
                deferred["unshard"].append(entry)
            elif event.kind in ("reduce_scatter", "all_reduce"):
                deferred["post_backward"].append(entry)
            else:
                issued[len(self._current) - 1] = entry
            return len(self._current) - 1

        def _timed(self, index: int, start_ns: int) -> None:
            entry = issued.pop(index, None)
            if entry is not None:
                settle(entry)

    unshard = settled_after(ru._unshard, deferred["unshard"], settle)
    original_hook = ru._post_backward_hook
    passed: list[weakref.ref[Any]] = []  # the storages of the gradients the hook was passed

    def post_backward_hook(*args: Any) -> Any:
        grads = [t for t in tree_leaves(args[3:]) if isinstance(t, torch.Tensor)]
        passed[:] = [weakref.ref(t.untyped_storage()) for t in grads]
        return original_hook(*args)

    def delete_callback(*args: Any) -> None:
        """The tracker lets go of a storage: once autograd lets go of every gradient the
        post-backward hook was passed (as the hook returns), its reductions are done."""
        tracker_delete(*args)
        if passed and all(ref() is None for ref in passed):
            passed.clear()
            settled_after(lambda: None, deferred["post_backward"], settle)()

    tracker_delete = tracker._delete_callback
    tracker._delete_callback = delete_callback
    with (
        warnings.catch_warnings(),
        tracker,
        patch.object(ru, "_unshard", unshard),
        patch.object(ru, "_post_backward_hook", post_backward_hook),
        Recorder(fsdp),
    ):
        warnings.simplefilter("ignore")
        settle([None] * 4)  # its peaks start afresh
        step(tracker)
    assert all(None not in entry for entry in seen), seen
    return [tuple(entry) for entry in seen]


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
