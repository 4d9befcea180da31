"""Conformance of what the largest jobs use: FSDP2 on a 2-D (replicate x shard) mesh, and
CPU offload for FSDP1 and FSDP2, against real FSDP on the fake process group (4 ranks).

Real FSDP1's CPU offload pins host memory and synchronises the device stream, which a
machine without an accelerator cannot do: the FSDP1 tests make ``pin_memory`` return the
tensor and give the CPU stream a no-op ``synchronize`` (neither changes what FSDP issues).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import handwritten_models as hm
import pytest
import torch
from fsdp_harness import assert_same_schedule, check_conformance, record_real_fsdp2
from hf_models import HF_MODELS
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz

BLOCKS = [(f"blocks.{i}",) for i in range(4)]


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def host_offload_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cpu.Stream, "synchronize", lambda self: None, raising=False)
    yield


FSDP1_OFFLOAD = {
    "full-shard": {},
    "grad-op": {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP},
    "mixed-precision": {"mixed_precision": MixedPrecision(param_dtype=torch.bfloat16)},
    "orig-params-post": {
        "use_orig_params": True,
        "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
    },
    "no-shard": {"sharding_strategy": ShardingStrategy.NO_SHARD},
    "no-shard-mixed-precision": {
        "sharding_strategy": ShardingStrategy.NO_SHARD,
        "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16),
        "forward_prefetch": True,
    },
}


@pytest.mark.parametrize("case", list(FSDP1_OFFLOAD))
def test_fsdp1_cpu_offload(fake_pg: int, host_offload_on_cpu: None, case: str) -> None:
    kwargs: dict[str, Any] = {
        "auto_wrap_policy": ModuleWrapPolicy({hm.Block}),
        "cpu_offload": CPUOffload(offload_params=True),
        **FSDP1_OFFLOAD[case],
    }
    report = check_conformance(hm.Stack(), _x(), kwargs, fake_pg)
    steady = report.iterations[1]
    assert report.config.cpu_offload and report.config["cpu_offload"] is True
    copies = [e for e in steady if e.kind in ("h2d", "d2h")]
    assert {e.kind for e in copies} == {"h2d", "d2h"}
    # every all-gather is preceded by its unit's host-to-device copy
    for i, e in enumerate(steady):
        if e.kind == "all_gather":
            assert (steady[i - 1].kind, steady[i - 1].unit) == ("h2d", e.unit)
        # NO_SHARD's low-precision copy is cast from the host parameters' copy
        if e.kind == "cast":
            assert (steady[i - 1].kind, steady[i - 1].unit) == ("h2d", e.unit)
    no_shard = kwargs.get("sharding_strategy") == ShardingStrategy.NO_SHARD
    assert any(e.kind == "cast" for e in steady) == (no_shard and "mixed_precision" in kwargs)


FSDP2_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (real fully_shard options, analyze options)
    "hsdp": ({"mesh_shape": (2, 2)}, {"mesh": ("dp_replicate", 2, "dp_shard", 2)}),
    "hsdp-no-reshard": (
        {"mesh_shape": (2, 2), "reshard_after_forward": False},
        {"mesh": {"dp_replicate": 2, "dp_shard": 2}, "reshard_after_forward": False},
    ),
    "offload": (
        {"offload_policy": CPUOffloadPolicy(pin_memory=False)},
        {"offload_policy": CPUOffloadPolicy(pin_memory=False), "world_size": 4},
    ),
    "offload-reshard-2": (
        {"offload_policy": CPUOffloadPolicy(pin_memory=False), "reshard_after_forward": 2},
        {"offload_policy": CPUOffloadPolicy(), "world_size": 4, "reshard_after_forward": 2},
    ),
    "hsdp-offload-bf16": (
        {"mesh_shape": (2, 2), "offload_policy": CPUOffloadPolicy(pin_memory=False),
         "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)},
        {"mesh": (2, 2), "offload_policy": CPUOffloadPolicy(pin_memory=False),
         "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FSDP2_CASES))
def test_fsdp2_meshes_and_offload(fake_pg: int, case: str) -> None:
    real_kwargs, kwargs = FSDP2_CASES[case]
    torch.manual_seed(0)
    real = record_real_fsdp2(hm.Stack(), _x(), BLOCKS, fake_pg, **real_kwargs)
    torch.manual_seed(0)
    predicted = fsdpviz.analyze(hm.Stack(), _x(), fully_shard=BLOCKS, **kwargs)
    assert_same_schedule(real, predicted)
    steady = predicted.iterations[1]
    if "mesh" in kwargs:
        assert predicted.config.world_size == 4 and predicted.config.shard_world_size == 2
        assert predicted.config["mesh"] in ({"dp_replicate": 2, "dp_shard": 2},
                                            {"replicate": 2, "shard": 2})  # fmt: skip
        reduced = [e.unit for e in steady if e.kind == "reduce_scatter"]
        across = [e.unit for e in steady if e.kind == "all_reduce" and e.group == "replicate"]
        assert reduced == across
    if "offload_policy" in kwargs:
        assert [e.unit for e in steady if e.kind == "d2h"] == reduced_units(steady)


def reduced_units(steady: list[fsdpviz.Event]) -> list[str]:
    return [e.unit for e in steady if e.kind == "reduce_scatter"]


def test_fsdp2_hsdp_llama(fake_pg: int) -> None:
    model, inputs, _ = HF_MODELS["llama"]()
    calls = [(f"model.layers.{i}",) for i in range(3)]
    real = record_real_fsdp2(model, inputs, calls, fake_pg, mesh_shape=(2, 2))
    predicted = fsdpviz.analyze(model, inputs, fully_shard=calls, mesh=(2, 2))
    assert_same_schedule(real, predicted)
    # the time model puts the all-reduce across replicas on the network
    times = predicted.timeline.records()
    assert any(r["kind"] == "all_reduce" for r in times)


def test_mesh_errors() -> None:
    with pytest.raises(fsdpviz.ConfigError, match="but the mesh has 8 ranks"):
        fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[hm.Block], mesh=(2, 4), world_size=4)
    with pytest.raises(fsdpviz.ConfigError, match="one or two dimensions"):
        fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[hm.Block], mesh=(2, 2, 2))
    with pytest.raises(fsdpviz.ConfigError, match="mesh sizes must be positive ints"):
        fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[hm.Block], mesh=("a", 0, "b", 2))
