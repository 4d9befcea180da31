"""Anchor: fsdpviz's FSDP1 memory model against torch's ``MemTracker``.

Real ``FullyShardedDataParallel`` (fake process group, 4 ranks, on the CPU) runs a step
to make its buffers and set its orders, then one more step (its micro-steps, under
``no_sync()`` but the last) under ``torch.distributed._tools.mem_tracker.MemTracker``,
which counts every storage an operator makes and FSDP1's ``resize_`` of its unsharded
FlatParameters. Its peak equals the memory model's steady-state peak to the byte.

Two things make the tracker see all of FSDP1: its FlatParameters' buffers made before it
(the padded unsharded parameter, the low-precision shard, CPU offload's host gradient
buffer) are registered with it, so their ``resize_`` calls (and the copies into the host
buffer) are counted from the start; and it hooks only parameters that are
leaves and take a gradient (at a module's pre-forward it hooks every ``parameters()``,
and FSDP1's unsharded views of a FlatParameter are not leaves).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp._flat_param import FlatParamHandle
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.utils import _alloc_storage
from torch.utils.checkpoint import checkpoint

import fsdpviz
from fsdpviz.cost.memory import memory_model
from fsdpviz.cost.sizes import unit_bytes
from fsdpviz.examples import DecoderLayer, ExampleConfig, ExampleModel
from fsdpviz.schema.checkpointing import CheckpointEvery

# Odd sizes: each FlatParameter is padded to a multiple of the 4 ranks.
CONFIG = ExampleConfig(
    hidden_size=60, intermediate_size=170, num_layers=2, num_heads=4, vocab_size=101
)
BF16_FP32 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
BF16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
BF16_REDUCE = MixedPrecision(reduce_dtype=torch.bfloat16)


class _Tracker(MemTracker):  # type: ignore[misc]
    """``MemTracker`` hooking the gradients of the parameters that are leaves and take one."""

    def _track_module_params_and_buffers(
        self, module: nn.Module, install_grad_hooks: bool = True
    ) -> tuple[int, int]:
        def track(grad: torch.Tensor | None) -> None:
            if grad is not None:
                self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

        params = 0
        for p in module.parameters():
            params += sum(
                w.mem_consumed for w in self._update_and_maybe_create_winfos(p, _MemRefType.PARAM)
            )
            track(p.grad)
            hooked = self._param_to_grad_hook_handles.get(p) is not None
            if install_grad_hooks and p.is_leaf and p.requires_grad and not hooked:
                self._param_to_grad_hook_handles[p] = (
                    p.register_hook(track),
                    p.register_post_accumulate_grad_hook(lambda q: track(q.grad)),
                )
        buffers = 0
        for b in module.buffers():
            buffers += sum(
                w.mem_consumed for w in self._update_and_maybe_create_winfos(b, _MemRefType.BUFFER)
            )
        return params, buffers


def _ids(seq: int = 9) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, CONFIG.vocab_size, (2, seq), generator=g)


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.sum()


def _step(
    fsdp: FSDP, ids: torch.Tensor, micro_steps: int, tracker: MemTracker | None = None
) -> None:
    """The output held until backward returns, as fsdpviz's trace holds it."""
    for k in range(micro_steps):
        with fsdp.no_sync() if k < micro_steps - 1 else nullcontext():
            out = fsdp(ids)
            _loss(out).backward()
            del out
        if tracker is not None:
            tracker.reset_mod_stats()  # it follows one iteration at a time


def _fsdp1(
    build: Callable[[ExampleConfig], nn.Module],
    config: ExampleConfig,
    kwargs: dict[str, Any],
    mesh: tuple[int, int] | None = None,
) -> FSDP:
    """The model of ``config`` (``build``, torch's generator seeded first) under FSDP1 on the
    CPU, each layer a unit (the root one), with ``kwargs`` (and ``mesh``, the fake process
    group's ranks as HSDP's device mesh, where given); FSDP's warnings ignored."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build(config)
        meshed = {} if mesh is None else {"device_mesh": init_device_mesh("cpu", mesh)}
        return FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
            device_id=torch.device("cpu"),
            **meshed,
            **kwargs,
        )


def _measured_peak(
    kwargs: dict[str, Any],
    micro_steps: int,
    optimizer: str | None = None,
    config: ExampleConfig = CONFIG,
    build: Callable[[ExampleConfig], nn.Module] = ExampleModel,
    seq: int = 9,
    at_peak: dict[str, int] | None = None,
    checkpointed: tuple[int, ...] = (),
) -> tuple[int, int]:
    """The peak of a step, and of the optimizer step after it (tracked on its own; AdamW,
    ``"for_loop"`` or ``"foreach"``: less its 4-byte step counters, on the host on a GPU;
    ``"sgd_momentum"``). ``build``: the model of ``config``; ``seq``: tokens per row;
    ``at_peak``, where given, gets the tracker's bytes per kind of reference at the step's
    peak (``"PARAM"``, ``"TEMP"``, ...); ``checkpointed``: the layers run under
    non-reentrant activation checkpointing, applied inside their units, as trainers do
    (``apply_activation_checkpointing`` after wrapping)."""
    fsdp = _fsdp1(build, config, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layers = [m for m in fsdp.modules() if isinstance(m, DecoderLayer)]
        picked = {id(layers[i]) for i in checkpointed}
        wrapper = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        apply_activation_checkpointing(
            fsdp, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: id(m) in picked
        )
        opt: torch.optim.Optimizer | None = None
        if optimizer == "sgd_momentum":
            opt = torch.optim.SGD(fsdp.parameters(), lr=1e-3, momentum=0.9)
        elif optimizer is not None:
            foreach = optimizer == "foreach"
            opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3, foreach=foreach)
        ids = _ids(seq)  # held through the optimizer step
        _step(fsdp, ids, micro_steps)  # buffers made, orders recorded, optimizer states made
        if opt is not None:
            opt.step()
        fsdp.zero_grad(set_to_none=True)
        tracker = _Tracker()
        tracker.track_external(fsdp, opt, ids)
        for module in fsdp.modules():
            if isinstance(module, FSDP) and module._handle is not None:
                flat = module._handle.flat_param
                for name in ("_full_param_padded", "_mp_shard", "_cpu_grad"):
                    buffer = getattr(flat, name, None)
                    if buffer is not None:
                        tracker._update_and_maybe_create_winfos(buffer, _MemRefType.OTH)
        with tracker:
            _step(fsdp, ids, micro_steps, tracker)
        snapshot = next(iter(tracker.get_tracker_snapshot("peak").values()))
        peak = snapshot["Total"]
        if at_peak is not None:
            at_peak.update({getattr(k, "name", str(k)): int(v) for k, v in snapshot.items()})
        step = 0
        if opt is not None:
            with tracker:  # its peak starts afresh
                opt.step()
                step = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
            counters = sum("step" in state for state in opt.state.values())
            peak, step = peak - 4 * counters, step - 4 * counters
    return int(peak), int(step)


def _report(
    kwargs: dict[str, Any],
    micro_steps: int,
    config: ExampleConfig = CONFIG,
    seq: int = 9,
    build: Callable[[ExampleConfig], nn.Module] = ExampleModel,
) -> fsdpviz.Report:
    """The plan of ``kwargs`` for the model of ``config`` (``build``), each layer a unit, on
    4 ranks, ``micro_steps`` per optimizer step."""
    with torch.device("meta"):
        model = build(config)
    accum = {"grad_accum": micro_steps} if micro_steps > 1 else {}
    report = fsdpviz.analyze(
        model,
        {"input_ids": _ids(seq)},
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        world_size=4,
        loss=_loss,
        **kwargs,
        **accum,
    )
    return report


def _predicted_peak(
    kwargs: dict[str, Any], micro_steps: int, config: ExampleConfig = CONFIG, seq: int = 9
) -> int:
    report = _report(kwargs, micro_steps, config, seq)
    steady = range(micro_steps, 2 * micro_steps)  # the second optimizer step's micro-steps
    return max(memory_model(report, optimizer=None, iteration=i).peak["bytes"] for i in steady)


CASES: dict[str, tuple[dict[str, Any], int]] = {
    # the reduce-scatter's input (a padded copy) and the gradient are freed when FSDP1's
    # post-backward hook returns: nothing of them is held into the next unit's backward
    "no_backward_prefetch": ({"backward_prefetch": None}, 1),
    # the gradient cast to float32, padded, its reduced float32 shard, beside the bf16 one
    "bf16_reduced_in_fp32": ({"mixed_precision": BF16_FP32}, 1),
    # the reduced bf16 shard cast to float32 beside it
    "bf16_reduced_in_bf16": ({"mixed_precision": BF16, "backward_prefetch": None}, 1),
    # NO_SHARD casts the float32 gradient to bf16, all-reduces that in place and casts it
    # back to float32: all three alive until the post-backward hook returns
    "no_shard_reduced_in_bf16": (
        {"mixed_precision": BF16_REDUCE, "sharding_strategy": ShardingStrategy.NO_SHARD},
        1,
    ),
    # NO_SHARD computes on a bf16 copy of each unit's parameters, made by every unshard and
    # freed by every reshard; here the forward and backward prefetches of another unit's
    # hooks make it too (see test_no_shard_low_precision_copy)
    "no_shard_bf16_prefetched": (
        {
            "mixed_precision": BF16,
            "sharding_strategy": ShardingStrategy.NO_SHARD,
            "forward_prefetch": True,
            "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
        },
        1,
    ),
    # forward prefetch: in the steady state a prefetched unit's gradient is assembled after
    # the backward of the unit before it (its views were made before that unit's forward)
    "forward_prefetch": ({"forward_prefetch": True}, 1),
    # under no_sync the new gradient, added into the accumulated one, is held by the
    # post-backward hook (a hook of the AccumulateGrad node, passed its incoming gradient)
    "no_sync_forward_prefetch": (
        {"mixed_precision": BF16_FP32, "forward_prefetch": True, "backward_prefetch": None},
        2,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_peak_equals_the_memtracker_peak(fake_pg: int, case: str) -> None:
    kwargs, micro_steps = CASES[case]
    assert fake_pg == 4
    assert _measured_peak(kwargs, micro_steps)[0] == _predicted_peak(kwargs, micro_steps)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_float8_linears(fake_pg: int, recipe: str, precision: str) -> None:
    """torchao's float8 linears (``convert_to_float8_training``, the LM head left out) under
    FSDP1: their casts' temporaries and the float8 operands kept beside each multiply are a
    layer's backward peak (see ``test_cost_memtracker_float8.py`` for FSDP2)."""
    float8 = pytest.importorskip("torchao.float8")
    config = ExampleConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4
    )
    spec: dict[str, Any] = {"filter_fqns": ["lm_head"]}
    if recipe != "tensorwise":
        spec["recipe_name"] = recipe
    cast = float8.Float8LinearConfig.from_recipe_name(recipe)

    def build(config: ExampleConfig) -> nn.Module:
        model = ExampleModel(config)
        float8.convert_to_float8_training(
            model, config=cast, module_filter_fn=lambda m, fqn: fqn != "lm_head"
        )
        return model

    kwargs: dict[str, Any] = {"backward_prefetch": None}
    if precision == "bf16":
        kwargs = {"mixed_precision": BF16_FP32}
    measured = _measured_peak(kwargs, 1, config=config, build=build, seq=64)[0]
    assert measured == _predicted_peak({**kwargs, "float8": spec}, 1, config, seq=64)


OFFLOAD = CPUOffload(offload_params=True)
# a 3000-word vocabulary: the root's backward, after the layers reduced theirs, is the peak
BIG_ROOT = ExampleConfig(
    hidden_size=60, intermediate_size=170, num_layers=2, num_heads=4, vocab_size=3000
)
OFFLOAD_CASES: dict[str, tuple[dict[str, Any], int, ExampleConfig]] = {
    # the root is not freed after forward: its pre-backward copies the host shard to the
    # device and drops it, gathering nothing
    "full_shard_no_sync": ({"cpu_offload": OFFLOAD, "backward_prefetch": None}, 2, CONFIG),
    # each unit's reduced gradient shard stays on the device (_saved_grad_shard) until the
    # final callback, beside its host copy
    "full_shard_reduced_shards_kept": ({"cpu_offload": OFFLOAD}, 1, BIG_ROOT),
    # SHARD_GRAD_OP gathers nothing in backward: every unit's copy is dropped at once
    "shard_grad_op": (
        {
            "cpu_offload": OFFLOAD,
            "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP,
            "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
        },
        1,
        CONFIG,
    ),
    # NO_SHARD keeps the all-reduced gradient in .grad, on the device, until the final
    # callback; it computes on a device copy of the host parameters, which the module's
    # views of it keep from its forward to the next forward, and in backward another, made
    # by the pre-backward (or a prefetch) and dropped by the reshard
    "no_shard": (
        {"cpu_offload": OFFLOAD, "sharding_strategy": ShardingStrategy.NO_SHARD},
        1,
        BIG_ROOT,
    ),
    "no_shard_prefetched_no_sync": (
        {
            "cpu_offload": OFFLOAD,
            "sharding_strategy": ShardingStrategy.NO_SHARD,
            "forward_prefetch": True,
            "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
        },
        2,
        CONFIG,
    ),
    # with use_orig_params=True every unshard moves the module's views to its copy: the
    # backward copy lives into the next forward, the forward copy in autograd's saved views
    # (the output projection's transposed weight) into the unit's backward: the root's and
    # both layers' were missing (1,440,240 + 2 x 180,480 B)
    "no_shard_original_parameters": (
        {
            "cpu_offload": OFFLOAD,
            "sharding_strategy": ShardingStrategy.NO_SHARD,
            "use_orig_params": True,
        },
        1,
        BIG_ROOT,
    ),
    "no_shard_original_parameters_no_sync": (
        {
            "cpu_offload": OFFLOAD,
            "sharding_strategy": ShardingStrategy.NO_SHARD,
            "use_orig_params": True,
            "backward_prefetch": None,
        },
        2,
        BIG_ROOT,
    ),
    # a sharded unit's copy of its host shard, which flat_param_to points the original
    # parameters at, lives past its all-gather to the unit's reshard: the backward's of the
    # root and of both layers were missing (12,180 + 2 x 45,120 B)
    "full_shard_original_parameters": (
        {"cpu_offload": OFFLOAD, "use_orig_params": True},
        1,
        CONFIG,
    ),
    # SHARD_GRAD_OP's post-forward reshard leaves the views: the forward copies into backward
    "shard_grad_op_original_parameters_no_sync": (
        {
            "cpu_offload": OFFLOAD,
            "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP,
            "use_orig_params": True,
            "backward_prefetch": None,
        },
        2,
        BIG_ROOT,
    ),
    # with bf16 parameters NO_SHARD computes on the low-precision copy: the host
    # parameters' copy to the device is cast into it and dropped at once
    "no_shard_bf16": (
        {
            "cpu_offload": OFFLOAD,
            "sharding_strategy": ShardingStrategy.NO_SHARD,
            "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16),
        },
        1,
        CONFIG,
    ),
    "bf16": (
        {"cpu_offload": OFFLOAD, "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16)},
        1,
        BIG_ROOT,
    ),
}


def _copies_to_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies of the host shard to the device that ``pre_unshard`` makes on a GPU and a
    CPU run skips (the host is the device: ``Tensor.to`` returns the tensor itself), made
    here as the copies they are on a GPU: ``flat_param_to(self.device)`` where the
    FlatParameter points at the host shard, and ``_use_low_precision_shard``'s
    ``_local_shard.to(self.device)`` of an offloaded shard, cast into the low-precision
    shard and dropped. And the host gradient a sharded unit's pre-backward makes with
    ``use_orig_params=True`` (``_writeback_orig_params``: the post-forward reshard pointed the
    original parameters' ``.grad`` at ``_cpu_grad``, which it writes into
    ``torch.zeros_like(flat_param)``, the host shard), dropped as on a GPU, where
    ``prepare_gradient_for_backward`` finds it off the device (``grad_offloaded``) and sets
    ``flat_param.grad = None``; on the CPU it would keep it as ``_saved_grad_shard``."""
    pre_unshard = FlatParamHandle.pre_unshard

    def copy_host_shard(handle: FlatParamHandle) -> bool:
        ran = pre_unshard(handle)
        flat = handle.flat_param
        host = flat.data_ptr() == flat._local_shard.data_ptr()  # type: ignore[attr-defined]
        if handle._offload_params and host:
            handle.flat_param_to(torch.device("cpu"), copy=True)
            return True
        return ran

    def use_low_precision_shard(handle: FlatParamHandle) -> None:
        flat = handle.flat_param
        _alloc_storage(flat._mp_shard, flat._local_shard.size())  # type: ignore[attr-defined]
        host = flat._local_shard  # type: ignore[attr-defined]
        flat._mp_shard.copy_(host.clone() if handle._offload_params else host)  # type: ignore[attr-defined]
        flat.data = flat._mp_shard  # type: ignore[attr-defined]

    writeback = FlatParamHandle._writeback_orig_params

    def host_gradient_writeback(handle: FlatParamHandle) -> bool:
        ran = writeback(handle)
        flat = handle.flat_param
        shard = flat._local_shard.size()  # type: ignore[attr-defined]
        host = flat.grad is not None and flat.grad.size() == shard
        if handle._offload_params and handle.uses_sharded_strategy and host:
            flat.grad = None
        return ran

    monkeypatch.setattr(FlatParamHandle, "pre_unshard", copy_host_shard)
    monkeypatch.setattr(FlatParamHandle, "_use_low_precision_shard", use_low_precision_shard)
    monkeypatch.setattr(FlatParamHandle, "_writeback_orig_params", host_gradient_writeback)


@pytest.mark.parametrize("case", list(OFFLOAD_CASES))
def test_cpu_offload_device_memory(
    fake_pg: int, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """``CPUOffload(offload_params=True)``: what is on the device is what the tracker
    measures on the CPU less what stays on the host, each unit's shard and its gradient's
    host copy (``_cpu_grad``, registered with the tracker from the start: the copy into it
    would otherwise count it from then on). A CPU run does not copy the shards to the
    device: the copies are made here as on a GPU (:func:`_copies_to_the_device`)."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cpu.Stream, "synchronize", lambda self: None, raising=False)
    _copies_to_the_device(monkeypatch)
    kwargs, micro_steps, config = OFFLOAD_CASES[case]
    host = sum(2 * u.sharded_bytes for u in _report(kwargs, micro_steps, config).units)
    measured = _measured_peak(kwargs, micro_steps, None, config)[0]
    assert measured - host == _predicted_peak(kwargs, micro_steps, config)


NO_SHARD_ORIG = {
    "cpu_offload": OFFLOAD,
    "sharding_strategy": ShardingStrategy.NO_SHARD,
    "use_orig_params": True,
}
CHECKPOINTED: dict[str, tuple[dict[str, Any], Any, tuple[int, ...]]] = {
    # a checkpointed layer's forward saves no view of its parameters: its forward copy goes
    # when its backward unshard moves the views to the backward copy, not at the end of
    # the layer's recomputation and backward (each layer's was held: 184,800 B over)
    "no_shard": (NO_SHARD_ORIG, [DecoderLayer], (0, 1)),
    # the second layer checkpointed, the first saving its views (180,480 B over)
    "no_shard_second_layer": (NO_SHARD_ORIG, CheckpointEvery([DecoderLayer], every=2), (1,)),
    # the copies of the host shards the original parameters view (102,420 B under)
    "full_shard": ({"cpu_offload": OFFLOAD, "use_orig_params": True}, [DecoderLayer], (0, 1)),
}


@pytest.mark.parametrize("case", list(CHECKPOINTED))
def test_cpu_offload_original_parameters_checkpointed(
    fake_pg: int, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """CPU offload with ``use_orig_params=True`` under activation checkpointing
    (``activation_checkpointing=`` against ``apply_activation_checkpointing`` after
    wrapping): the device's peak to the byte (see :func:`test_cpu_offload_device_memory`)."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cpu.Stream, "synchronize", lambda self: None, raising=False)
    _copies_to_the_device(monkeypatch)
    kwargs, spec, layers = CHECKPOINTED[case]
    report = _report({**kwargs, "activation_checkpointing": spec}, 1)
    host = sum(2 * u.sharded_bytes for u in report.units)
    measured = _measured_peak(kwargs, 1, checkpointed=layers)[0] - host
    assert memory_model(report, optimizer=None, iteration=1).peak["bytes"] == measured


class _SecondLayerTwice(ExampleModel):
    """The second layer run twice per forward (the layers in the order of ``order``)."""

    order = (0, 1, 1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for i in self.order:
            x = self.layers[i](x)
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits


class _FirstLayerAgain(_SecondLayerTwice):
    """The first layer run again after the second."""

    order = (0, 1, 0)


@pytest.mark.parametrize("build", [_SecondLayerTwice, _FirstLayerAgain])
def test_no_shard_offload_original_parameters_unit_run_twice(
    fake_pg: int, monkeypatch: pytest.MonkeyPatch, build: type[_SecondLayerTwice]
) -> None:
    """A unit run twice in forward under ``NO_SHARD``, CPU offload, ``use_orig_params=True``:
    the backward unshard rebinds the last forward's views only, so its copy goes with its
    own saved views, the first forward's with all that forward saved of the parameters, in
    the unit's backward after it (both held to the first's: 154,728 B over with either
    order)."""
    report, measured = _offloaded_second_layer_twice(monkeypatch, NO_SHARD_ORIG, build)
    mem = memory_model(report, optimizer=None, iteration=1)
    assert mem.peak["bytes"] == measured
    assert not [n for n in mem.notes if "runs more than once in forward" in n]
    # saved before the forward calls were recorded apart: both copies held to the last
    # saved view, an upper bound by less than a copy, noted
    saved = report.to_dict()
    for step in saved["profile"]["iterations"]:
        for freed in step.get("param_views_freed", []):
            for key in [k for k in freed if "#" in k]:
                del freed[key]
    mem = memory_model(fsdpviz.Report.from_dict(saved), optimizer=None, iteration=1)
    twice = f"layers.{build.order[-1]}"
    assert measured < mem.peak["bytes"] < measured + unit_bytes(report, None)[twice].h2d
    assert [n for n in mem.notes if f"{twice!r} runs more than once in forward" in n]


def _offloaded_second_layer_twice(
    monkeypatch: pytest.MonkeyPatch,
    kwargs: dict[str, Any],
    build: type[_SecondLayerTwice] = _SecondLayerTwice,
) -> tuple[fsdpviz.Report, int]:
    """The plan of CPU offload under ``kwargs`` with a layer run twice (``build``), and the
    peak a real run's tracker measures (the host's shards and gradients left out)."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cpu.Stream, "synchronize", lambda self: None, raising=False)
    _copies_to_the_device(monkeypatch)
    with torch.device("meta"):
        model = build(CONFIG)
    report = fsdpviz.analyze(
        model,
        {"input_ids": _ids()},
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        world_size=4,
        loss=_loss,
        **kwargs,
    )
    host = sum(2 * u.sharded_bytes for u in report.units)
    return report, _measured_peak(kwargs, 1, build=build)[0] - host


def test_no_shard_offload_unit_run_twice(fake_pg: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``NO_SHARD`` under CPU offload (``use_orig_params=False``), the second layer run twice:
    its second forward's copy takes the module's views, and what the first forward saved
    for backward holds the first copy into the layer's backward (92,592 B under)."""
    kwargs = {"cpu_offload": OFFLOAD, "sharding_strategy": ShardingStrategy.NO_SHARD}
    report, measured = _offloaded_second_layer_twice(monkeypatch, kwargs)
    assert memory_model(report, optimizer=None, iteration=1).peak["bytes"] == measured


class _SecondLayerAgainCheckpointed(_SecondLayerTwice):
    """The second layer run twice, its call ``checkpointed`` (0 or 1) under non-reentrant
    activation checkpointing, which saves the call's input, nothing of its parameters."""

    checkpointed = 1

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](self.embed_tokens(input_ids))
        for k in range(2):
            layer = self.layers[1]
            x = checkpoint(layer, x, use_reentrant=False) if k == self.checkpointed else layer(x)
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits


class _SecondLayerFirstCallCheckpointed(_SecondLayerAgainCheckpointed):
    checkpointed = 0


@pytest.mark.parametrize(
    ("build", "orig"),
    [
        (_SecondLayerAgainCheckpointed, True),
        (_SecondLayerFirstCallCheckpointed, True),
        (_SecondLayerFirstCallCheckpointed, False),
    ],
    ids=["last_call_orig", "first_call_orig", "first_call"],
)
def test_no_shard_offload_unit_run_twice_one_call_saving_nothing(
    fake_pg: int, monkeypatch: pytest.MonkeyPatch, build: type[_SecondLayerTwice], orig: bool
) -> None:
    """``NO_SHARD`` under CPU offload, the second layer run twice, one of its forward calls
    checkpointed: that call saves nothing of its copy of the host parameters, which the
    module's views alone hold, so it goes when they move off it, at the next unshard (the
    second forward's, or with ``use_orig_params=True`` the backward unshard's rebinding of
    the last forward's views). It was held into the layer's backward: the peak one copy
    (180,480 B) over, with no note."""
    kwargs = NO_SHARD_ORIG if orig else {**NO_SHARD_ORIG, "use_orig_params": False}
    report, measured = _offloaded_second_layer_twice(monkeypatch, kwargs, build)
    mem = memory_model(report, optimizer=None, iteration=1)
    assert mem.peak["bytes"] == measured
    assert not [n for n in mem.notes if "runs more than once in forward" in n]


@pytest.mark.parametrize(
    ("strategy", "micro_steps", "orig"),
    [
        (ShardingStrategy.FULL_SHARD, 1, False),
        (ShardingStrategy.NO_SHARD, 1, False),
        (ShardingStrategy.FULL_SHARD, 2, False),
        (ShardingStrategy.SHARD_GRAD_OP, 3, False),
        (ShardingStrategy.FULL_SHARD, 1, True),
        (ShardingStrategy.FULL_SHARD, 2, True),
    ],
)
def test_unit_run_twice_under_parameter_mixed_precision(
    fake_pg: int, strategy: ShardingStrategy, micro_steps: int, orig: bool
) -> None:
    """bf16 parameters reduced in float32, the second layer run twice: its post-backward hook
    holds the first forward's bf16 gradient beside ``.grad`` and its float32 cast (the peak
    was 45,120 B under with FULL_SHARD); under accumulation each forward's gradient is added
    into ``.grad`` and freed, where the trace held the second's for the first's backward
    (43,800 B over with FULL_SHARD, 2 micro-steps). With ``use_orig_params=True`` the gradient
    is the flat one, with the alignment padding between parameters, as the trace measures it."""
    kwargs = {"mixed_precision": BF16_FP32, "sharding_strategy": strategy, "use_orig_params": orig}
    accum = {"grad_accum": micro_steps} if micro_steps > 1 else {}
    with torch.device("meta"):
        model = _SecondLayerTwice(CONFIG)
    report = fsdpviz.analyze(
        model,
        {"input_ids": _ids()},
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        world_size=4,
        loss=_loss,
        **kwargs,
        **accum,
    )
    measured = _measured_peak(kwargs, micro_steps, build=_SecondLayerTwice)[0]
    steady = range(micro_steps, 2 * micro_steps)
    predicted = max(memory_model(report, optimizer=None, iteration=i).peak["bytes"] for i in steady)
    assert predicted == measured


@pytest.mark.parametrize(
    ("mp", "strategy", "micro_steps", "orig"),
    [
        (BF16, ShardingStrategy.FULL_SHARD, 2, False),
        (BF16_FP32, ShardingStrategy.SHARD_GRAD_OP, 3, True),
    ],
    ids=["bf16_full_shard", "fp32_reduce_shard_grad_op_orig"],
)
def test_unit_run_twice_last_call_checkpointed_under_accumulation(
    fake_pg: int, mp: MixedPrecision, strategy: ShardingStrategy, micro_steps: int, orig: bool
) -> None:
    """bf16 parameters, the second layer run twice, its last call checkpointed, under
    accumulation: each forward call has an ``AccumulateGrad`` of its own, so the last
    call's gradient goes into ``.grad`` (and is freed) once its backward is done, but the
    trace, one node per parameter, holds it until the first call's comes in. The
    checkpointed call's backward is a stretch of its own (its recomputation's unshard),
    whose peak, the flat gradient's concatenation with the first call's activations alive,
    comes before any gradient is held: the trace measures each stretch without the held
    gradients (``peak_unbuffered``). Taking the held gradient out of that stretch's peak,
    the peak was low by the first call's activations: 46,440 B with bf16 reduction (FULL_SHARD,
    2 micro-steps), 1,312 B reduced in float32 (where the reduction's own peak is near)."""
    kwargs = {"mixed_precision": mp, "sharding_strategy": strategy, "use_orig_params": orig}
    kwargs["backward_prefetch"] = None
    build = _SecondLayerAgainCheckpointed
    with torch.device("meta"):
        model = build(CONFIG)
    report = fsdpviz.analyze(
        model,
        {"input_ids": _ids()},
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        world_size=4,
        loss=_loss,
        grad_accum=micro_steps,
        **kwargs,
    )
    measured = _measured_peak(kwargs, micro_steps, build=build)[0]
    steady = range(micro_steps, 2 * micro_steps)
    for r in (report, fsdpviz.Report.from_dict(report.to_dict())):
        peak = max(memory_model(r, optimizer=None, iteration=i).peak["bytes"] for i in steady)
        assert peak == measured
    assert report.profile is not None
    assert any(step.peak_unbuffered for step in report.profile.iterations)


class _SecondLayerAgainWithoutGrad(_SecondLayerTwice):
    """The second layer run again under ``no_grad`` after the last, its output added to the
    one that takes a gradient."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        with torch.no_grad():
            extra = self.layers[1](x)
        logits: torch.Tensor = self.lm_head(self.norm(x + extra))
        return logits


@pytest.mark.parametrize(
    "strategy", [ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD], ids=lambda s: s.name
)
def test_unit_run_again_without_grad_under_parameter_mixed_precision(
    fake_pg: int, strategy: ShardingStrategy
) -> None:
    """bf16 parameters, the second layer run again under ``no_grad``: that forward builds no
    graph, so no ``AccumulateGrad`` of its own, and the post-backward hook holds no first
    forward's gradient beside ``.grad`` (counted as for a unit run twice with grad: the
    peak, at the layer's reduce-scatter, 90,240 B over)."""
    kwargs: dict[str, Any] = {"mixed_precision": BF16_FP32, "sharding_strategy": strategy}
    groups: dict[str, Any] = {}
    if strategy == ShardingStrategy.HYBRID_SHARD:
        groups = {"shard_group_size": 2}
        measured = _measured_peak(
            {**kwargs, "device_mesh": init_device_mesh("cpu", (2, 2))},
            1,
            build=_SecondLayerAgainWithoutGrad,
        )[0]
    else:
        measured = _measured_peak(kwargs, 1, build=_SecondLayerAgainWithoutGrad)[0]
    with torch.device("meta"):
        model = _SecondLayerAgainWithoutGrad(CONFIG)
    report = fsdpviz.analyze(
        model,
        {"input_ids": _ids()},
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        world_size=4,
        loss=_loss,
        **kwargs,
        **groups,
    )
    assert memory_model(report, optimizer=None, iteration=1).peak["bytes"] == measured


@contextmanager
def _rank(rank: int) -> Iterator[None]:
    """The fake process group as seen by ``rank`` of the same 4, rank 0's again after.

    DTensor's sharding propagation caches decisions by mesh, and a mesh made after the
    group is made again equals one made before, whose process groups are gone: the caches
    are cleared with the group, or a later test's DTensor collectives would name a group
    that no longer exists."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
    _clear_sharding_prop_cache()
    try:
        yield
    finally:
        dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        _clear_sharding_prop_cache()


# 61 wide, one head: each parameter aligned to 16 bytes leaves padding after every norm,
# and each unit's parts of a shard differ by rank
PADDED = ExampleConfig(
    hidden_size=61, intermediate_size=171, num_layers=2, num_heads=1, vocab_size=101
)


@pytest.mark.parametrize(
    ("optimizer", "config"),
    [
        ("adamw_for_loop", CONFIG),
        ("adamw_foreach", CONFIG),
        ("adamw_for_loop", PADDED),
        ("adamw_foreach", PADDED),
        ("sgd_momentum", PADDED),
    ],
)
def test_optimizer_step_of_the_original_parameters(
    fake_pg: int, optimizer: str, config: ExampleConfig
) -> None:
    """``use_orig_params=True``: the optimizer steps the original parameters, each a view of
    its part of the rank's shard, and a part that is empty gets no gradient: the states and
    the step's temporaries are of the parts (the for-loop's, one parameter's part at a time),
    none of the padding. The peak before the step is the most any rank reaches: the states of
    the rank that keeps the most in all (each unit's most can be on another rank, and their
    sum is more than any rank keeps: 12 to 40 B more on the padded model); the step, the
    most any rank's states and temporaries reach. Both to the byte."""
    kwargs = {"use_orig_params": True}
    measured = []
    for rank in range(fake_pg):
        with _rank(rank):
            measured.append(_measured_peak(kwargs, 1, optimizer.removeprefix("adamw_"), config))
    mem = memory_model(_report(kwargs, 1, config), optimizer=optimizer, iteration=1)
    *before, step = mem.moments
    assert step.where == "during the optimizer step after"
    assert max(m[1] for m in measured) == sum(step.bytes)
    assert max(m[0] for m in measured) == max(sum(m.bytes) for m in before)


def test_optimizer_states_of_the_original_parameters_parts(fake_pg: int) -> None:
    """``use_orig_params=True`` aligns each parameter to 16 bytes in the FlatParameter (a
    61-wide model: padding after every norm): the optimizer keeps states for the
    parameters' parts of the shard, not for the padding, so each unit's
    ``Unit.trainable[1]`` is the most elements of states any rank keeps for it."""
    config = PADDED
    ids = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(0))
    most: dict[str, int] = {}
    for rank in range(fake_pg):
        with _rank(rank), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fsdp = FSDP(
                ExampleModel(config),
                auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
                device_id=torch.device("cpu"),
                use_orig_params=True,
            )
            opt = torch.optim.SGD(fsdp.parameters(), lr=1e-3, momentum=0.9)
            _loss(fsdp(ids)).backward()
            opt.step()
            for name, module in fsdp.named_modules():
                if isinstance(module, FSDP) and module._handle is not None:
                    unit = name.replace("_fsdp_wrapped_module.", "").replace(
                        "._fsdp_wrapped_module", ""
                    )
                    params = module._handle.flat_param._params
                    kept = sum(
                        opt.state[p]["momentum_buffer"].numel() for p in params if p in opt.state
                    )
                    most[unit] = max(most.get(unit, 0), kept)
    with torch.device("meta"):
        model = ExampleModel(config)
    report = fsdpviz.analyze(
        model,
        {"input_ids": ids},
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        world_size=fake_pg,
        loss=_loss,
        use_orig_params=True,
    )
    assert {u.module: u.trainable[1] for u in report.units} == most
    assert any(u.trainable[1] < u.sharded_numel for u in report.units)


@pytest.mark.parametrize("strategy", [ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD])
def test_keep_low_precision_grads(fake_pg: int, strategy: ShardingStrategy) -> None:
    """``keep_low_precision_grads=True`` with a float32 reduction: the sharded strategies
    cast the reduced shard to float32 in the post-backward hook as ever, and the final
    callback casts it to bf16 (``prepare_gradient_for_optim``); ``NO_SHARD`` leaves the
    all-reduced gradient in float32. SGD's momentum buffers are copies of those gradients,
    in their dtype. The peak and the step, to the byte."""
    mp = MixedPrecision(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, keep_low_precision_grads=True
    )
    kwargs = {"mixed_precision": mp, "sharding_strategy": strategy}
    peak, step = _measured_peak(kwargs, 1, "sgd_momentum")
    mem = memory_model(_report(kwargs, 1), optimizer="sgd_momentum", iteration=1)
    *before, last = mem.moments
    assert last.where == "during the optimizer step after"
    assert (peak, step) == (max(sum(m.bytes) for m in before), sum(last.bytes))


def test_no_shard_low_precision_copy(fake_pg: int) -> None:
    """``NO_SHARD`` with bf16 parameters computes on a bf16 copy of each unit's parameters
    (``_mp_shard``), made when the unit unshards and freed when it reshards, each marked by
    an event of its own (``cast``, ``free``): the peak to the byte, and at it the
    parameters, the float32 ones and the bf16 copies alive (the tracker's ``PARAM``, as the
    FlatParameter points at its copy while it is unsharded)."""
    kwargs = {"mixed_precision": BF16, "sharding_strategy": ShardingStrategy.NO_SHARD}
    at_peak: dict[str, int] = {}
    peak, _ = _measured_peak(kwargs, 1, at_peak=at_peak)
    report = _report(kwargs, 1)
    mem = memory_model(report, optimizer=None, iteration=1)
    assert peak == mem.peak["bytes"]
    params = mem.peak["breakdown"]
    assert params["unsharded_params"] > 0
    assert at_peak["PARAM"] == params["sharded_params"] + params["unsharded_params"]
    kinds = [(e.kind, e.unit, e.phase) for e in report.iterations[1]]
    assert kinds.count(("cast", "layers.0", "forward")) == 1
    assert kinds.count(("free", "layers.0", "forward")) == 1
    assert not any("NO_SHARD" in note for note in mem.notes)


def test_no_shard_offload_original_parameters_forward_copy_within_its_backward(
    fake_pg: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NO_SHARD`` under CPU offload with ``use_orig_params=True`` on the standard model: a
    layer's forward copy goes inside its backward, when its first projection's backward
    frees the last view of it autograd saved (``q_proj``'s transposed weight; the norm
    before it saves the parameter itself, which the backward unshard points at the
    backward copy). The trace sees that moment and the stretch's peak then: the layers'
    backward peak before it (five copies held) is the peak to the byte, the flat gradient's
    concatenation after it (a copy fewer) below. Dropped at the end of that stretch, as a
    report saved before that was measured still has it, the peak was 154,728 B over (less
    than a copy); before that, 528,024 B (46%) low, the copies not modelled (a note said
    so), and no note is left."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cpu.Stream, "synchronize", lambda self: None, raising=False)
    _copies_to_the_device(monkeypatch)
    kwargs = {
        "cpu_offload": OFFLOAD,
        "sharding_strategy": ShardingStrategy.NO_SHARD,
        "use_orig_params": True,
    }
    report = _report(kwargs, 1)
    host = sum(2 * u.sharded_bytes for u in report.units)
    measured = _measured_peak(kwargs, 1)[0] - host
    mem = memory_model(report, optimizer=None, iteration=1)
    assert mem.peak["bytes"] == measured
    assert not [n for n in mem.notes if "NO_SHARD" in n]
    # a report saved before the trace measured it: the copy dropped at the stretch's end
    saved = report.to_dict()
    for step in saved["profile"]["iterations"]:
        del step["param_views_freed"]
    old = memory_model(fsdpviz.Report.from_dict(saved), optimizer=None, iteration=1)
    copy = max(unit_bytes(report, None)[u.module].h2d for u in report.units)
    assert measured < old.peak["bytes"] < measured + copy


LOW_PRECISION_GRADS = MixedPrecision(
    param_dtype=torch.bfloat16, reduce_dtype=torch.float32, keep_low_precision_grads=True
)
GRAD_VIEWS_CASES: dict[str, tuple[ShardingStrategy, int, ExampleConfig]] = {
    "full_shard": (ShardingStrategy.FULL_SHARD, 1, CONFIG),
    "full_shard_padded": (ShardingStrategy.FULL_SHARD, 1, PADDED),
    "shard_grad_op": (ShardingStrategy.SHARD_GRAD_OP, 1, CONFIG),
    "no_shard": (ShardingStrategy.NO_SHARD, 1, CONFIG),
    "no_shard_padded": (ShardingStrategy.NO_SHARD, 1, PADDED),
    # under no_sync the parameters have views of the unsharded gradient when the last
    # micro-step reduces: its post-backward makes nothing
    "full_shard_no_sync": (ShardingStrategy.FULL_SHARD, 2, CONFIG),
}


@pytest.mark.parametrize("case", list(GRAD_VIEWS_CASES))
def test_gradient_views_of_the_original_parameters(fake_pg: int, case: str) -> None:
    """``use_orig_params=True`` with ``keep_low_precision_grads=True``: the post-backward
    hook gives each original parameter without a gradient ``torch.empty_like(param)`` (its
    part of the shard, float32) before pointing it at its part of the reduced shard, one
    parameter at a time, beside the reduction's temporaries (see [Note: gradient views of
    the original parameters] in ``memory_fsdp1.py``). The parts differ by rank: the most
    any rank reaches (``NO_SHARD``: every rank alike) is the peak to the byte, and at it
    the tracker's parameters, activations, and gradients with temporaries are the
    model's categories."""
    strategy, micro_steps, config = GRAD_VIEWS_CASES[case]
    kwargs = {
        "mixed_precision": LOW_PRECISION_GRADS,
        "sharding_strategy": strategy,
        "use_orig_params": True,
    }
    measured = []
    for rank in range(fake_pg if strategy != ShardingStrategy.NO_SHARD else 1):
        at_peak: dict[str, int] = {}
        with _rank(rank):
            peak = _measured_peak(kwargs, micro_steps, config=config, at_peak=at_peak)[0]
        measured.append((peak, at_peak))
    peak, at_peak = max(measured, key=lambda m: m[0])
    report = _report(kwargs, micro_steps, config)
    steady = range(micro_steps, 2 * micro_steps)
    mem = max(
        (memory_model(report, optimizer=None, iteration=i) for i in steady),
        key=lambda m: int(m.peak["bytes"]),
    )
    assert peak == mem.peak["bytes"]
    cat = mem.peak["breakdown"]
    assert at_peak["PARAM"] == cat["sharded_params"] + cat["unsharded_params"] + cat["all_gather"]
    assert at_peak["ACT"] == cat["activations"] + cat["forward_temp"]
    temps = ("unsharded_grads", "reduce_scatter", "sharded_grads", "backward_temp")
    assert at_peak["GRAD"] + at_peak["TEMP"] == sum(cat[k] for k in temps)
    assert ("gradient views" in mem.peak["where"]) == (micro_steps == 1)


@pytest.mark.parametrize("config", [CONFIG, PADDED], ids=["even", "padded"])
def test_momentum_of_low_precision_gradients_of_the_original_parameters(
    fake_pg: int, config: ExampleConfig
) -> None:
    """``use_orig_params=True`` with ``keep_low_precision_grads=True`` and SGD's momentum:
    each momentum buffer is a copy of its parameter's bf16 gradient (its part of the
    rank's shard), so the rank that keeps the most states keeps them in bf16. The step, the
    most any rank's states and temporaries reach, to the byte; the peak before it, the
    states of that rank beside the gradient views of any rank (see
    :func:`test_gradient_views_of_the_original_parameters`): to the byte where that rank
    also makes the most views, never less than any rank reaches."""
    kwargs = {"mixed_precision": LOW_PRECISION_GRADS, "use_orig_params": True}
    measured = []
    for rank in range(fake_pg):
        with _rank(rank):
            measured.append(_measured_peak(kwargs, 1, "sgd_momentum", config))
    mem = memory_model(_report(kwargs, 1, config), optimizer="sgd_momentum", iteration=1)
    *before, step = mem.moments
    assert step.where == "during the optimizer step after"
    assert max(m[1] for m in measured) == sum(step.bytes)
    peak = max(sum(m.bytes) for m in before)
    assert peak >= max(m[0] for m in measured)
    if config is CONFIG:
        assert peak == max(m[0] for m in measured)


@pytest.mark.parametrize("keep", [True, False])
def test_offload_with_low_precision_grads_fails_from_the_second_iteration(
    fake_pg: int, monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    """CPU offload with ``keep_low_precision_grads``: real FSDP1 runs the first iteration and
    fails in the second's ``prepare_gradient_for_optim`` (the host gradient buffer cast to
    bf16 in place by the first); fsdpviz warns exactly then (``offload_low_precision_grads``)."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cpu.Stream, "synchronize", lambda self: None, raising=False)
    mp = MixedPrecision(torch.bfloat16, torch.float32, keep_low_precision_grads=keep)
    kwargs: dict[str, Any] = dict(
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        mixed_precision=mp,
        cpu_offload=CPUOffload(offload_params=True),
    )
    torch.manual_seed(0)
    fsdp = FSDP(ExampleModel(CONFIG), device_id=torch.device("cpu"), **kwargs)
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    failed = None
    for _ in range(2):
        try:
            _step(fsdp, _ids(), 1)
        except RuntimeError as e:
            failed = str(e)
            break
        opt.step()
        opt.zero_grad()
    with torch.device("meta"):
        model = ExampleModel(CONFIG)
    report = fsdpviz.analyze(model, {"input_ids": _ids().to("meta")}, world_size=fake_pg,
                             progress=False, **kwargs)  # fmt: skip
    codes = [w.code for w in report.warnings]
    assert ("offload_low_precision_grads" in codes) == keep
    assert (failed is not None) == keep
    if keep:
        assert failed is not None and "assign a gradient" in failed


REDUCED_ONLY_KEPT = MixedPrecision(reduce_dtype=torch.bfloat16, keep_low_precision_grads=True)
FULL, NO = ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD
# mixed precision, strategy, use_orig_params, optimizer, whether torch's step fails
OPTIMIZER_CASES: dict[str, tuple[MixedPrecision, ShardingStrategy, bool, str, bool]] = {
    "full_shard_adamw_foreach": (LOW_PRECISION_GRADS, FULL, False, "adamw_foreach", True),
    "full_shard_sgd_momentum": (LOW_PRECISION_GRADS, FULL, False, "sgd_momentum", False),
    "full_shard_sgd_fused": (LOW_PRECISION_GRADS, FULL, False, "sgd_fused", True),
    "orig_params_adamw_for_loop": (LOW_PRECISION_GRADS, FULL, True, "adamw_for_loop", True),
    "no_shard_reduced_adam_for_loop": (REDUCED_ONLY_KEPT, NO, False, "adam_for_loop", True),
    "full_shard_reduced_adamw_fused": (REDUCED_ONLY_KEPT, FULL, False, "adamw_fused", False),
}


def _torch_optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    """torch's optimizer named as fsdpviz's ``memory_model(optimizer=...)`` takes it."""
    kind, _, impl = name.partition("_")
    if kind == "sgd":
        momentum = {"momentum": 0.9} if impl.startswith("momentum") else {}
        return torch.optim.SGD(params, lr=1e-3, fused=impl == "fused" or None, **momentum)
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    return cls(params, lr=1e-3, foreach=impl == "foreach", fused=impl == "fused" or None)


@pytest.mark.parametrize("case", list(OPTIMIZER_CASES))
def test_optimizers_that_refuse_low_precision_grads_are_noted(fake_pg: int, case: str) -> None:
    """``keep_low_precision_grads=True`` leaves gradients in another dtype than their float32
    parameters (the sharded strategies: the compute dtype; ``NO_SHARD``: the reduce dtype):
    torch's Adam and AdamW, every implementation, and any fused optimizer fail at their
    first step; SGD's for-loop and foreach steps run, and so does any optimizer where the
    gradients stay float32. ``memory_model(optimizer=...)``'s notes say so exactly where
    torch fails."""
    mp, strategy, orig, optimizer, fails = OPTIMIZER_CASES[case]
    kwargs = {"mixed_precision": mp, "sharding_strategy": strategy, "use_orig_params": orig}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fsdp = FSDP(ExampleModel(CONFIG), auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
                    device_id=torch.device("cpu"), **kwargs)  # fmt: skip
    opt = _torch_optimizer(optimizer, fsdp.parameters())
    _step(fsdp, _ids(), 1)
    failed = False
    try:
        opt.step()
    except RuntimeError as e:
        failed = "expected" in str(e)
    notes = memory_model(_report(kwargs, 1), optimizer=optimizer).notes
    noted = [n for n in notes if "keep_low_precision_grads" in n]
    assert failed == fails
    assert len(noted) == fails
    if noted:
        assert noted[0].startswith(f"optimizer={optimizer!r} does not run")
        assert "bfloat16 gradients on float32 parameters" in noted[0]


# a 3000-word vocabulary, 50-wide MLPs: the root's backward after the layers reduced is the
# peak, and each layer's norm lies whole in rank 0's shard
SMALL_LAYERS = ExampleConfig(
    hidden_size=60, intermediate_size=50, num_layers=2, num_heads=1, vocab_size=3000
)


KEPT_IN_BF16 = MixedPrecision(reduce_dtype=torch.bfloat16, keep_low_precision_grads=True)
BASES_CASES: dict[str, tuple[MixedPrecision, ShardingStrategy]] = {
    "reduced_in_bf16": (KEPT_IN_BF16, ShardingStrategy.FULL_SHARD),
    "no_cast": (MixedPrecision(keep_low_precision_grads=True), ShardingStrategy.FULL_SHARD),
    # resharded (to the sharded views) under no_sync though the parameter is kept
    "shard_grad_op": (KEPT_IN_BF16, ShardingStrategy.SHARD_GRAD_OP),
}


@pytest.mark.parametrize("case", list(BASES_CASES))
def test_gradient_bases_kept_by_the_original_parameters(fake_pg: int, case: str) -> None:
    """``use_orig_params=True`` with ``keep_low_precision_grads`` after a micro-step under
    ``no_sync``: a norm's weight whole in the rank's shard got a view of the unsharded
    gradient as its ``.grad``, and the last micro-step's ``param.grad.data = ...`` keeps the
    view's base, the tensor that held the unsharded gradient (its data by then the copy in
    the reduce dtype), until ``zero_grad`` (see [Note: gradient bases kept by the original
    parameters] in ``memory_fsdp1.py``). The peak, in the root's backward, and SGD's step,
    the most any rank reaches, to the byte (both were 94,080 B low with the bf16 copies,
    188,160 B with the float32 gradients)."""
    mp, strategy = BASES_CASES[case]
    kwargs = {"mixed_precision": mp, "use_orig_params": True, "sharding_strategy": strategy}
    measured = []
    for rank in range(fake_pg):
        with _rank(rank):
            measured.append(_measured_peak(kwargs, 2, "sgd_momentum", SMALL_LAYERS))
    report = _report(kwargs, 2, SMALL_LAYERS)
    first, last = (memory_model(report, optimizer="sgd_momentum", iteration=i) for i in (2, 3))
    *before, step = last.moments
    assert step.where == "during the optimizer step after"
    peak = max(first.peak["bytes"], *(sum(m.bytes) for m in before))
    assert (peak, sum(step.bytes)) == (max(m[0] for m in measured), max(m[1] for m in measured))
    assert sum(u.grad_base for u in unit_bytes(report, "sgd_momentum").values()) == 2
