"""Anchor: hybrid sharding's memory at every event against real torch.

FSDP1 ``HYBRID_SHARD`` and ``_HYBRID_SHARD_ZERO2``, FSDP2 HSDP (``fully_shard(mesh=...)``
on a 2-D mesh): shards over 2 ranks, 2 replicas (the fake process group's 4 ranks on a
2 x 2 mesh), float32 and bf16 parameters, with and without gradient accumulation (FSDP1's
``no_sync``, FSDP2's ``set_requires_gradient_sync(False)``). The real model runs one
optimizer step (its buffers made, its orders recorded), then another under torch's
``MemTracker`` and fsdpviz's recorder. At each event the recorder sees: the bytes in use at
the moment the plan's row stands for, and the most in use since the event before. The
plan's steady micro-steps hold the same events, and its memory model the same two figures
at each (``total``, ``peak_before``), to the byte.

The moments, as each API's code runs them: a free or a prefetch, once its call returns.
FSDP1: an all-gather once ``_unshard`` returns (``post_unshard`` frees the low-precision
shard it gathered); a reduce-scatter and the all-reduce across the replicas, once the
post-backward hook's work is let go (autograd lets go of the gradients the hook was passed,
a post hook of the ``AccumulateGrad`` node, as it returns). FSDP2: a group's own all-gather
once its hook's ``wait_for_unshard`` copied it out; a reduce-scatter once its collective
returns, inside ``foreach_reduce``; the all-reduce across the replicas, ``foreach_reduce``'s
last collective, once ``foreach_reduce`` returns.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any
from unittest.mock import patch

import pytest
import torch
import torch.distributed as dist
from test_cost_fsdp1_memtracker import (
    BF16_FP32,
    CONFIG,
    _ids,
    _loss,
    _SecondLayerTwice,
    _Tracker,
)
from torch import nn
from torch.distributed._tools.mem_tracker import _MemRefType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp import _runtime_utils as ru
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.utils._pytree import tree_leaves

import fsdpviz
from fsdpviz.cost.memory import memory_model
from fsdpviz.examples import DecoderLayer, ExampleModel
from fsdpviz.recording import FSDP1Recorder
from fsdpviz.schema.events import Event

Measured = list[tuple[str, str, int, int]]  # (kind, unit, bytes after it, peak since the last)


def _total(tracker: Any) -> int:
    return int(sum(snap["Total"] for snap in tracker.get_tracker_snapshot().values()))


def _settler(tracker: Any) -> Callable[[list[Any]], None]:
    """Sets an entry's bytes (``[2]``) to those in use now and its peak (``[3]``) to the
    most since the entry settled before; the tracker's peak starts afresh from now."""

    def settle(entry: list[Any]) -> None:
        now = tracker.get_tracker_snapshot()
        entry[2:] = [_total(tracker), int(sum(tracker._peak_mem.values()))]
        tracker._peak_mem_snap = now
        tracker._peak_mem = {dev: snap["Total"] for dev, snap in now.items()}

    return settle


def _settled_after(
    original: Callable[..., Any], entries: list[list[Any]], settle: Callable[[list[Any]], None]
) -> Callable[..., Any]:
    """``original``, which settles ``entries`` (and empties it) as it returns."""

    def run(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        for entry in entries:
            settle(entry)
        entries.clear()
        return out

    return run


def _measured_fsdp1(
    kwargs: dict[str, Any], micro_steps: int, build: type[nn.Module] = ExampleModel
) -> Measured:
    """FSDP1 hybrid sharding (each layer a unit, the root one): the events of the second
    optimizer step's micro-steps (the first ``micro_steps - 1`` under ``no_sync``), each
    with the bytes at its moment and the most since the event before; ``build``: the model
    of ``CONFIG``."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fsdp = FSDP(
            build(CONFIG),
            auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
            device_id=torch.device("cpu"),
            device_mesh=init_device_mesh("cpu", (2, 2)),
            **kwargs,
        )
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

    settle = _settler(tracker)

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

    unshard = _settled_after(ru._unshard, deferred["unshard"], settle)
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
            _settled_after(lambda: None, deferred["post_backward"], settle)()

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


def _steady(report: fsdpviz.Report, micro_steps: int) -> Measured:
    """The plan's events of its second optimizer step's micro-steps, each with the bytes
    after it and the most since the event before."""
    out: Measured = []
    for i in range(micro_steps, 2 * micro_steps):
        mem = memory_model(report, optimizer=None, iteration=i)
        events = zip(report.iterations[i], mem.events, strict=True)
        out += [(e.kind, e.unit, row.total, row.peak_before) for e, row in events]
    return out


def _same(real: Measured, mine: Measured) -> None:
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)


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
    _same(real, _steady(report, micro_steps))


def _measured_fsdp2(mp_policy: Any, micro_steps: int) -> Measured:
    """FSDP2 HSDP (replicate 2 x shard 2, ``fully_shard(mesh=...)`` on each layer and the
    root): the events of the second optimizer step's micro-steps (the first
    ``micro_steps - 1`` without gradient sync), each with the bytes in use at its moment and
    the most since the event before: a free or a prefetch, once its call returns; a
    group's own all-gather, once its hook's ``wait_for_unshard`` copied it out; a
    reduce-scatter, once its collective returns (inside ``foreach_reduce``); the all-reduce
    across the replicas, ``foreach_reduce``'s last collective, once ``foreach_reduce``
    returns."""
    from pipeline_memory import _tracker
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg_mod

    from fsdpviz.recording import FSDP2Recorder

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    model = ExampleModel(CONFIG)
    options = {"mp_policy": mp_policy} if mp_policy is not None else {}
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    ids = _ids()  # held through the step
    tracker = _tracker()
    tracker.track_external(model, ids)
    seen: list[list[Any]] = []  # [kind, unit, bytes, peak since the event before]
    issued: dict[int, list[Any]] = {}  # index in the recorder's iteration -> its entry
    reducing: set[int] = set()  # the reduce-scatters' indices: foreach_reduce's calls
    deferred: dict[str, list[list[Any]]] = {"copy_out": [], "collective": [], "reduce": []}
    settle = _settler(tracker)

    class Recorder(FSDP2Recorder):
        def _append(self, event: Event) -> int:
            entry = [event.kind, event.unit, None, None]
            seen.append(entry)
            super()._append(event)
            index = len(self._current) - 1
            if event.kind == "all_gather" and not event.prefetch:
                deferred["copy_out"].append(entry)
            elif event.kind == "reduce_scatter":
                deferred["collective"].append(entry)
                reducing.add(index)
            elif event.kind == "all_reduce":
                deferred["reduce"].append(entry)
            else:
                issued[index] = entry
            return index

        def _timed(self, index: int, start_ns: int) -> None:
            entry = issued.pop(index, None)
            if entry is not None:
                settle(entry)
            elif index in reducing:  # foreach_reduce returned: its all-reduce is done
                reducing.discard(index)
                _settled_after(lambda: None, deferred["reduce"], settle)()

    group_cls = pg_mod.FSDPParamGroup
    copy_out = _settled_after(group_cls.wait_for_unshard, deferred["copy_out"], settle)
    scatter = _settled_after(dist.reduce_scatter_single, deferred["collective"], settle)
    with (
        tracker,
        Recorder(model),
        patch.object(group_cls, "wait_for_unshard", copy_out),
        patch.object(dist, "reduce_scatter_single", scatter),
    ):
        for step in range(2):
            if step == 1:
                seen.clear()
                settle([None] * 4)  # its peaks start afresh
            for k in range(micro_steps):
                model.set_requires_gradient_sync(k == micro_steps - 1)
                out = model(ids)
                _loss(out).backward()
                del out
            for p in model.parameters():
                p.grad = None
    assert all(None not in entry for entry in seen), seen
    return [(kind, unit, used, peak) for kind, unit, used, peak in seen]


@pytest.mark.parametrize("micro_steps", [1, 2], ids=["one_step", "no_sync"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fsdp2_hybrid_sharding_holds_what_torch_holds_at_every_event(
    fake_pg: int, precision: str, micro_steps: int
) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert fake_pg == 4
    mp = None
    if precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    real = _measured_fsdp2(mp, micro_steps)
    with torch.device("meta"):
        model = ExampleModel(CONFIG)
    accum = {"grad_accum": micro_steps} if micro_steps > 1 else {}
    options = {"mp_policy": mp} if mp is not None else {}
    report = fsdpviz.analyze(
        model, {"input_ids": _ids()}, fully_shard=[DecoderLayer], mesh=(2, 2), loss=_loss,
        **options, **accum,
    )  # fmt: skip
    _same(real, _steady(report, micro_steps))
