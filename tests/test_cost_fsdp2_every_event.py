"""Anchor: FSDP2's memory at every event against real torch, across ``fully_shard``'s
options.

``reshard_after_forward`` True, False and an int (onto 2 of 4 ranks; on HSDP's 2 x 4 mesh,
onto 2 of the 4 shard ranks), with and without gradient accumulation (the micro-steps
before the last with ``set_requires_gradient_sync(False)``, and with
``set_reshard_after_backward(False)`` too, as ``analyze``'s ``grad_accum`` and
``reshard_after_backward=False`` model them), float32 and bf16 parameters (reducing in
bf16 or float32), and a layer whose parameters are all frozen. The moments, and the two
figures compared at each event (the bytes in use, the most since the event before), are
those of ``test_cost_hybrid_every_event.py``; on a 1-D mesh the reduce-scatter is
``foreach_reduce``'s last collective, its moment the function's return (its loop's last
gradient let go). ``CPUOffloadPolicy`` is not compared here: on the CPU the host's bytes and
the device's are one count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from every_event import Measured, fsdp2_events, same, steady
from test_cost_fsdp1_memtracker import CONFIG, _ids, _loss
from torch.distributed.device_mesh import init_device_mesh

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleModel

BF16 = (torch.bfloat16, torch.bfloat16)
BF16_FP32 = (torch.bfloat16, torch.float32)


def _model(frozen: bool) -> ExampleModel:
    """The example model; ``frozen``: its first layer's parameters all frozen."""
    model = ExampleModel(CONFIG)
    if frozen:
        model.layers[0].requires_grad_(False)
    return model


def _measured(
    mesh: tuple[int, ...], options: dict[str, Any], micro_steps: int, keep: bool, frozen: bool
) -> Measured:
    """``fully_shard(..., **options)`` on each layer and the root: the events of the second
    optimizer step's micro-steps (the first ``micro_steps - 1`` without gradient sync, and
    kept gathered after backward where ``keep``), each with the bytes in use at its moment
    and the most since the event before."""
    from torch.distributed.fsdp import fully_shard

    names = ("dp_replicate", "dp_shard")[-len(mesh) :]
    device_mesh = init_device_mesh("cpu", mesh, mesh_dim_names=names)
    torch.manual_seed(0)
    model = _model(frozen)
    for layer in model.layers:
        fully_shard(layer, mesh=device_mesh, **options)
    fully_shard(model, mesh=device_mesh, **options)
    ids = _ids()  # held through the step
    with fsdp2_events(model, ids, hsdp=len(mesh) == 2) as log:
        for step in range(2):
            if step == 1:
                log.restart()
            for k in range(micro_steps):
                last = k == micro_steps - 1
                model.set_requires_gradient_sync(last)
                if keep:
                    model.set_reshard_after_backward(last)
                out = model(ids)
                _loss(out).backward()
                del out
            for p in model.parameters():
                p.grad = None
    return cast(Measured, log.measured())


def _check(
    mesh: tuple[int, ...],
    reshard: bool | int,
    precision: tuple[torch.dtype, torch.dtype] | None,
    micro_steps: int,
    keep: bool = False,
    frozen: bool = False,
) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    options: dict[str, Any] = {"reshard_after_forward": reshard}
    if precision is not None:
        param, reduce = precision
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)
    real = _measured(mesh, options, micro_steps, keep, frozen)
    with torch.device("meta"):
        model = _model(frozen)
    accum: dict[str, Any] = {"grad_accum": micro_steps} if micro_steps > 1 else {}
    if keep:
        accum["reshard_after_backward"] = False
    report = fsdpviz.analyze(
        model, {"input_ids": _ids()}, fully_shard=[DecoderLayer], mesh=mesh, loss=_loss,
        **options, **accum,
    )  # fmt: skip
    same(real, steady(report, micro_steps))


# (reshard_after_forward, precision, micro-steps, kept gathered after backward, frozen)
CASES: dict[str, tuple[bool | int, Any, int, bool, bool]] = {
    "int-fp32": (2, None, 1, False, False),
    "int-bf16-accum": (2, BF16, 2, False, False),
    "int-bf16-fp32-accum-keep": (2, BF16_FP32, 2, True, False),
    "false-fp32-accum-keep": (False, None, 2, True, False),
    "true-bf16-fp32-accum-keep": (True, BF16_FP32, 2, True, False),
    "false-bf16-frozen-accum": (False, BF16, 2, False, True),
    "int-fp32-frozen": (2, None, 1, False, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fully_shard_options_hold_what_torch_holds_at_every_event(fake_pg: int, case: str) -> None:
    assert fake_pg == 4
    reshard, precision, micro_steps, keep, frozen = CASES[case]
    _check((4,), reshard, precision, micro_steps, keep, frozen)


# HSDP, 2 replicas x 4 shard ranks: (reshard_after_forward, precision, micro-steps, frozen)
HSDP_CASES: dict[str, tuple[bool | int, Any, int, bool]] = {
    "int-bf16-fp32-accum": (2, BF16_FP32, 2, False),
    "int-bf16-accum": (2, BF16, 2, False),
    "int-fp32-frozen": (2, None, 1, True),
    "true-bf16-frozen-accum": (True, BF16, 2, True),
}


@pytest.mark.parametrize("case", list(HSDP_CASES))
def test_hybrid_sharding_options_hold_what_torch_holds_at_every_event(
    as_rank: Callable[..., None], case: str
) -> None:
    as_rank(0, 8)
    reshard, precision, micro_steps, frozen = HSDP_CASES[case]
    _check((2, 4), reshard, precision, micro_steps, frozen=frozen)


@pytest.mark.parametrize("micro_steps", [1, 2], ids=["one_step", "no_sync"])
@pytest.mark.parametrize("precision", [None, BF16_FP32], ids=["fp32", "bf16"])
def test_hybrid_sharding_over_two_shard_ranks_holds_what_torch_holds_at_every_event(
    fake_pg: int, precision: Any, micro_steps: int
) -> None:
    """HSDP on the fake process group's 4 ranks, 2 replicas x 2 shard ranks, resharding
    after forward."""
    assert fake_pg == 4
    _check((2, 2), True, precision, micro_steps)
