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
    grad_w = mm_choice(((12, 4096), S0), ((4096, 64), S0), torch.float32, 4)
    assert grad_w == MMChoice((S1, S0), P)
    assert dist.is_initialized() == before


def _topology(mesh: object) -> tuple[list[float], list[float]]:
    from torch.distributed.tensor._collective_utils import MeshTopoInfo

    info = MeshTopoInfo.build_from_mesh(mesh)  # type: ignore[arg-type]
    return info.mesh_dim_bandwidth, info.mesh_dim_latency


def test_a_tp_group_is_costed_within_a_gpu_node_leaving_torchs_topology_alone() -> None:
    """torch costs a tp group of up to ``num_devices_per_host`` devices within a host
    (``MeshTopoInfo.build_from_mesh``): 87.7 GB/s and 0.6 us a hop, against a fifth of the
    bandwidth and 2.7 us across hosts. A weight's gradient of 12 x 1024 by 1024 x 16 (fp32)
    gathers the 64 KiB operand within a GPU node (as torchtitan's tp group of 4 on nodes of
    8 GPUs is), where across hosts (one CPU a host, as this machine's mesh has it; fsdpviz
    planned so) the latency of a second collective weighs more than the bytes, and it moves
    both operands (an all-to-all and a local chunk) into a Partial() product. The topology
    a user's mesh of the same ranks gets from torch is its own, before and after, and a
    topology torch cached for it first does not change fsdpviz's choice."""
    from torch.distributed.device_mesh import DeviceMesh, _mesh_resources

    from fsdpviz.schedule.tp_mm_strategy import topology_dependent

    mm_choice.cache_clear()
    a, b = ((12, 1024), S0), ((1024, 16), S0)
    user = DeviceMesh("cpu", torch.arange(4), _init_backend=False, _rank=0)
    mine = _topology(user)  # cached by torch first, with this machine's devices per host
    assert mine == ([87.7 * 0.22], [2.7])
    assert mm_choice(a, b, torch.float32, 4) == MMChoice((S0, R), S0)
    assert mm_choice(a, b, torch.float32, 4, devices_per_host=1) == MMChoice((S1, S0), P)
    assert topology_dependent(a, b, torch.float32, 4)
    assert not topology_dependent(((12, 4096), S0), ((4096, 64), S0), torch.float32, 4)
    assert not topology_dependent(a, b, torch.float32, 16)  # across nodes either way
    assert _topology(user) == mine
    assert "num_devices_per_host" not in vars(_mesh_resources)
    assert _mesh_resources.num_devices_per_host("cpu") == torch.cpu.device_count()


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
