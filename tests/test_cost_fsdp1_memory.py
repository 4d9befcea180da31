"""FSDP1 anchor: the buffer sizes of the memory model equal the real FlatParameters.

Real ``FullyShardedDataParallel`` (fake process group, 4 ranks, on the CPU) runs
one step; for every FSDP instance its FlatParameter's shard, padded unsharded
buffer (in the compute dtype), low-precision shard (mixed precision) and
sharded gradient must have exactly the bytes ``fsdpviz.cost`` charges to that
unit, and the memory model's ``sharded_params`` must be their sum.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost.memory import memory_model
from fsdpviz.cost.sizes import unit_bytes
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model

# Odd sizes, so FlatParameters need padding to a multiple of the world size.
CONFIG = ExampleConfig(
    hidden_size=60, intermediate_size=170, num_layers=2, num_heads=4, vocab_size=101
)
BF16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

CASES: dict[str, dict[str, Any]] = {
    "full_shard": {},
    "use_orig_params": {"use_orig_params": True},
    "mixed_precision": {"mixed_precision": BF16},
    "mixed_precision_orig_params": {"mixed_precision": BF16, "use_orig_params": True},
    "shard_grad_op": {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP},
    "no_shard": {"sharding_strategy": ShardingStrategy.NO_SHARD},
}


def _real_flat_params(kwargs: dict[str, Any]) -> dict[str, dict[str, int]]:
    model = example_model(CONFIG, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fsdp = FSDP(
            copy.deepcopy(model),
            auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
            device_id=torch.device("cpu"),
            **kwargs,
        )
        fsdp(**example_inputs(CONFIG, device="cpu")).sum().backward()
    out: dict[str, dict[str, int]] = {}
    for name, module in fsdp.named_modules():
        if not isinstance(module, FSDP):
            continue
        fqn = name.replace("_fsdp_wrapped_module.", "").replace("._fsdp_wrapped_module", "")
        fp = module._handle.flat_param
        sizes = {"sharded": fp._sharded_size.numel() * fp.element_size()}
        assert fp.grad is not None
        sizes["sharded_grad"] = fp.grad.numel() * fp.grad.element_size()
        full = getattr(fp, "_full_param_padded", None)
        if module._handle.uses_sharded_strategy and full is not None:
            sizes["unsharded"] = full.numel() * full.element_size()
            reduce = module._handle._reduce_dtype or fp.dtype
            itemsize = torch.empty((), dtype=reduce).element_size()
            sizes["reduce_scatter"] = fp._padded_unsharded_size.numel() * itemsize
        mp_shard = getattr(fp, "_mp_shard", None)
        sizes["copy_in"] = 0 if mp_shard is None else mp_shard.numel() * mp_shard.element_size()
        out[fqn] = sizes
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_unit_bytes_equal_real_flat_parameters(fake_pg: int, case: str) -> None:
    kwargs = CASES[case]
    real = _real_flat_params(kwargs)
    report = fsdpviz.analyze(
        example_model(CONFIG),
        example_inputs(CONFIG),
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        world_size=fake_pg,
        **kwargs,
    )
    predicted = unit_bytes(report, optimizer=None)
    assert set(predicted) == set(real)
    for unit, sizes in real.items():
        got = predicted[unit]
        for key, value in sizes.items():
            assert getattr(got, key) == value, f"{case} unit {unit!r} {key}: {getattr(got, key)}"
    mem = memory_model(report, optimizer=None, iteration=0)
    assert mem.events[0]["sharded_params"] == sum(s["sharded"] for s in real.values())
    assert mem.events[-1]["sharded_grads"] == sum(s["sharded_grad"] for s in real.values())
