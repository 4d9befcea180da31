"""Run real FSDP1 with fsdpviz's recorder and compare with ``fsdpviz.analyze``."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

import fsdpviz
from fsdpviz.trace.tracker import default_loss


def record_real_fsdp1(
    model: nn.Module,
    inputs: Any,
    fsdp_kwargs: dict[str, Any],
    loss: Callable[[Any], torch.Tensor] | None = None,
    iterations: int = 3,
    grad_accum: int = 1,
    after: Callable[[nn.Module], None] | None = None,
    copied: bool = True,
) -> fsdpviz.Report:
    """Wrap a copy of ``model`` in real FSDP1 on the CPU, train ``iterations`` steps, record.

    ``copied=False`` wraps ``model`` itself: a policy that tests module identity
    (``CustomPolicy(lambda m: m is model.head)``) then meets the modules it names.

    ``grad_accum=N``: each step is ``N`` micro-steps, the first ``N - 1`` under
    ``no_sync()``, then the gradients are dropped as ``zero_grad`` does. ``after`` is called
    with the wrapped model once the recording is done."""
    memo: dict[int, Any] = {}
    real = copy.deepcopy(model, memo) if copied else model
    fsdp_kwargs = dict(fsdp_kwargs)
    for key in ("ignored_modules", "ignored_states"):
        if fsdp_kwargs.get(key) is not None and copied:
            fsdp_kwargs[key] = [memo[id(o)] for o in fsdp_kwargs[key]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fsdp = FSDP(real, device_id=torch.device("cpu"), **fsdp_kwargs)
        with fsdpviz.FSDP1Recorder(fsdp) as rec:
            for _ in range(iterations):
                for k in range(grad_accum):
                    quiet = fsdp.no_sync() if k < grad_accum - 1 else contextlib.nullcontext()
                    with quiet:
                        args, kwargs = _split(inputs)
                        out = fsdp(*args, **kwargs)
                        (loss or default_loss)(out).backward()
                if grad_accum > 1:
                    fsdp.zero_grad(set_to_none=True)
        if after is not None:
            after(fsdp)
    return rec.report()


def _split(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _fmt(events: list[dict[str, Any]], i: int) -> str:
    lo, hi = max(0, i - 3), i + 4
    return "\n".join(
        f"{'>>' if j == i else '  '} {j:3d} {e}" for j, e in enumerate(events[lo:hi], start=lo)
    )


def assert_same_schedule(real: fsdpviz.Report, predicted: fsdpviz.Report) -> None:
    """Units, forward order and both iterations must be equal, event for event."""
    for r_unit, p_unit in zip(real.units, predicted.units, strict=False):
        assert p_unit.to_dict() == r_unit.to_dict(), (
            f"unit differs:\nreal      {r_unit}\npredicted {p_unit}"
        )
    assert [u.module for u in predicted.units] == [u.module for u in real.units]
    assert predicted.forward_order == real.forward_order
    assert len(real.iterations) >= 3, "record at least three iterations"
    steady = [e.to_dict() for e in real.iterations[2]]
    assert [e.to_dict() for e in real.iterations[1]] == steady, "real run has no steady state"
    for n, (r_it, p_it) in enumerate(zip(real.iterations[:2], predicted.iterations, strict=True)):
        r = [e.to_dict() for e in r_it]
        p = [e.to_dict() for e in p_it]
        for i, (a, b) in enumerate(zip(r, p, strict=False)):
            if a != b:
                raise AssertionError(
                    f"iteration {n}: first difference at event {i}\nreal:\n{_fmt(r, i)}\n"
                    f"predicted:\n{_fmt(p, i)}"
                )
        assert len(r) == len(p), f"iteration {n}: {len(r)} real events vs {len(p)} predicted"


def assert_same_accumulation(real: fsdpviz.Report, predicted: fsdpviz.Report, n: int) -> None:
    """Gradient accumulation over ``n`` micro-steps: the prediction's two optimizer steps (the
    first, and the steady one) equal the recording's first two, micro-step by micro-step and
    event by event, and the recording's third step equals its second."""
    assert predicted.config.grad_accum == n and len(predicted.iterations) == 2 * n
    assert len(real.iterations) >= 3 * n, "record at least three optimizer steps"
    steady = [[e.to_dict() for e in it] for it in real.iterations[n : 2 * n]]
    third = [[e.to_dict() for e in it] for it in real.iterations[2 * n : 3 * n]]
    assert third == steady, "real run has no steady state"
    for k, (r_it, p_it) in enumerate(zip(real.iterations, predicted.iterations, strict=False)):
        r = [e.to_dict() for e in r_it]
        p = [e.to_dict() for e in p_it]
        for i, (a, b) in enumerate(zip(r, p, strict=False)):
            if a != b:
                raise AssertionError(
                    f"step {k // n} micro-step {k % n}: first difference at event {i}\n"
                    f"real:\n{_fmt(r, i)}\npredicted:\n{_fmt(p, i)}"
                )
        assert len(r) == len(p), f"micro-step {k}: {len(r)} real events vs {len(p)} predicted"


def check_conformance(
    model: nn.Module,
    inputs: Any,
    fsdp_kwargs: dict[str, Any],
    world_size: int,
    loss: Callable[[Any], torch.Tensor] | None = None,
    trace: str = "meta",
) -> fsdpviz.Report:
    """``analyze`` (on the meta device by default) must equal the recording of real FSDP1."""
    predicted = fsdpviz.analyze(
        model, inputs, world_size=world_size, loss=loss, trace=trace, **fsdp_kwargs
    )
    real = record_real_fsdp1(model, inputs, fsdp_kwargs, loss)
    assert_same_schedule(real, predicted)
    return predicted


def record_real_fsdp2(
    model: nn.Module,
    inputs: Any,
    calls: list[tuple[str, ...]],
    world_size: int,
    reshard_after_forward: Any = None,
    mp_policy: Any = None,
    forward_prefetch: dict[str, list[str]] | None = None,
    backward_prefetch: dict[str, list[str]] | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
    iterations: int = 3,
    mesh_shape: tuple[int, int] | None = None,
    offload_policy: Any = None,
    ignored_params: list[str] | None = None,
    grad_accum: int = 1,
    after: Callable[[nn.Module], None] | None = None,
    reshard_after_backward: bool = True,
    requires_all_reduce: bool = True,
    shard_placement_fn: Any = None,
) -> fsdpviz.Report:
    """Apply ``fully_shard`` to a copy (``calls`` in order, then the root) and record.

    ``mesh_shape=(replicate, shard)`` gives FSDP2 a 2-D mesh (HSDP); ``ignored_params``
    (parameter FQNs) are left out of the root's call. ``grad_accum=N``: each
    step is ``N`` micro-steps, the first ``N - 1`` after ``set_requires_gradient_sync(False)``,
    then the gradients are dropped as ``zero_grad`` does; ``requires_all_reduce=False``
    calls ``set_requires_all_reduce(False)`` instead before those (HSDP: reduce-scatter, no
    all-reduce), and ``reshard_after_backward=False`` adds ``set_reshard_after_backward(False)``.
    ``after`` is called with the sharded model once the recording is done.
    ``shard_placement_fn``: a function for every call, or ``{module FQN: function}``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fsdpviz.recording import FSDP2Recorder

    real = copy.deepcopy(model)
    mods = dict(real.named_modules())
    if mesh_shape is None:
        mesh = init_device_mesh("cpu", (world_size,))
    else:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp_replicate", "dp_shard"))

    def kwargs_for(names: tuple[str, ...]) -> dict[str, Any]:
        kw: dict[str, Any] = {"mesh": mesh}
        if offload_policy is not None:
            kw["offload_policy"] = offload_policy
        raf = reshard_after_forward
        if isinstance(raf, dict):
            raf = next((raf[n] for n in (", ".join(names), *names) if n in raf), None)
        if raf is not None:
            kw["reshard_after_forward"] = raf
        if mp_policy is not None:
            kw["mp_policy"] = mp_policy
        fn = shard_placement_fn
        if isinstance(fn, dict):
            fn = next((fn[n] for n in (", ".join(names), *names) if n in fn), None)
        if fn is not None:
            kw["shard_placement_fn"] = fn
        return kw

    for names in [*calls, ("",)]:
        targets = [mods[n] for n in names]
        kw = kwargs_for(names)
        if names == ("",) and ignored_params:
            kw["ignored_params"] = {real.get_parameter(n) for n in ignored_params}
        fully_shard(targets if len(targets) > 1 else targets[0], **kw)
    for key, attr in (
        (forward_prefetch, "set_modules_to_forward_prefetch"),
        (backward_prefetch, "set_modules_to_backward_prefetch"),
    ):
        for src, dsts in (key or {}).items():
            getattr(mods[src], attr)([mods[d] for d in dsts])
    with FSDP2Recorder(real) as rec:
        for _ in range(iterations):
            for k in range(grad_accum):
                if grad_accum > 1:
                    last = k == grad_accum - 1
                    if requires_all_reduce:
                        real.set_requires_gradient_sync(last)  # type: ignore[operator]
                    else:
                        real.set_requires_all_reduce(last)  # type: ignore[operator]
                    if not reshard_after_backward:
                        real.set_reshard_after_backward(last)  # type: ignore[operator]
                args, kwargs = _split(inputs)
                out = real(*args, **kwargs)
                (loss or default_loss)(out).backward()
            if grad_accum > 1:
                real.zero_grad(set_to_none=True)
    if after is not None:
        after(real)
    return rec.report()


def timeline_collectives(report: fsdpviz.Report, world_size: int) -> list[list[Any]]:
    """``[kind, bytes of the tensor]`` of every FSDP collective of the first iteration and of
    the steady state twice (what three recorded iterations issue), as the time model sizes
    them: its bus bytes back to the tensor's (``(n - 1) / n`` of it over ``n`` ranks, twice
    that for an all-reduce)."""
    from fsdpviz.cost import timeline

    out: list[list[Any]] = []
    for i in (0, 1, 1):
        for rec in timeline(report, iteration=i).records():
            if rec["kind"] in ("all_gather", "reduce_scatter", "all_reduce"):
                share = (world_size - 1) / world_size * (2 if rec["kind"] == "all_reduce" else 1)
                out.append([rec["kind"], round(rec["bytes"] / share)])
    return out
