"""DTensor's ``mm`` strategy as fsdpviz asks torch's sharding propagation for it, on specs
alone (no process group), for a batch of one's multiply (``schedule/tp_mm_strategy.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fsdpviz.schedule.tp_mm_strategy import MMChoice, mm_choice

S0, S1, R, P = ("shard", 0), ("shard", 1), ("replicate", None), ("partial", None)


def test_the_smaller_operand_is_gathered_and_no_process_group_is_made() -> None:
    """torch's cost model (``redistribute_cost``) gathers the smaller operand: a 12 x 8
    input (192 bytes in bf16) against an 8 x 8 weight (128 bytes) gathers the weight, the
    product keeping the input's rows; a 6 x 16 input against a 16 x 12 weight gathers the
    input. A weight's gradient from a long sequence moves the output's gradient by an
    all-to-all into a Partial() product instead. No process group is made for it."""
    mm_choice.cache_clear()
    before = dist.is_initialized()
    assert mm_choice(((12, 8), S0), ((8, 8), S1), torch.bfloat16, 4) == MMChoice((S0, R), S0)
    assert mm_choice(((6, 16), S0), ((16, 12), S1), torch.float32, 4) == MMChoice((R, S1), S1)
    assert mm_choice(((12, 6), S0), ((6, 16), S0), torch.float32, 4) == MMChoice((S0, R), S0)
    grad_w = mm_choice(((12, 1024), S0), ((1024, 16), S0), torch.float32, 4)
    assert grad_w == MMChoice((S1, S0), P)
    assert dist.is_initialized() == before


def test_a_torch_that_cannot_be_asked_plans_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch whose ``DeviceMesh`` takes other arguments: no choice (the multiply's
    redistributions are then noted as not planned), not an error."""
    import torch.distributed.device_mesh as device_mesh

    def refuse(*args: object, **kwargs: object) -> None:
        raise TypeError("__init__() got an unexpected keyword argument '_rank'")

    monkeypatch.setattr(device_mesh, "DeviceMesh", refuse)
    mm_choice.cache_clear()
    try:
        assert mm_choice(((12, 8), S0), ((8, 8), S1), torch.bfloat16, 7) is None
    finally:
        mm_choice.cache_clear()
