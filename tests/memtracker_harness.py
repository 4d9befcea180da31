"""Run torch's ``FSDPMemTracker`` on real ``fully_shard`` (fake tensors, fake process group).

``tracked(build, ...)`` builds the model under ``FakeTensorMode`` on the CPU, applies
``fully_shard`` to each block then the root on a mesh of the fake process group,
and measures one forward+backward with ``FSDPMemTracker``. The step holds the
model output until backward returns (``out = model(x); loss(out).backward()``),
like fsdpviz's trace. With ``optimizer=True`` a first step with Adam runs
before tracking, so the tracked step is the steady state.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# FSDPMemTracker category -> the fsdpviz categories it is compared with. Two
# differences are in how the two tools name memory, not in how much there is:
# - "Activation" is every live tensor the forward allocated; fsdpviz splits it
#   into "activations" (saved for backward) and "forward_temp" (the model output
#   the training loop holds, tensors in use).
# - FSDPMemTracker calls a parameter gradient "Temp" until the unit's
#   post-backward runs, then "Unsharded Grad"; fsdpviz calls it "unsharded_grads"
#   from the moment autograd accumulates it and the gradients of activations
#   "backward_temp". Their sums are compared.
MAPPING: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sharded params": (("Sharded Param",), ("sharded_params",)),
    "unsharded params": (("Unsharded Param",), ("unsharded_params",)),
    "all-gather buffers": (("All Gather",), ("all_gather",)),
    "reduce-scatter buffers": (("Reduce Scatter",), ("reduce_scatter",)),
    "sharded grads": (("Sharded Grad",), ("sharded_grads",)),
    "forward tensors": (("Activation",), ("activations", "forward_temp")),
    "backward tensors": (("Temp", "Unsharded Grad"), ("backward_temp", "unsharded_grads")),
    "optimizer state": (("OptState",), ("optimizer",)),
    "inputs": (("Inputs",), ("inputs",)),
    "buffers": (("Buffer",), ("buffers",)),
}


@dataclass
class Tracked:
    peak: dict[str, int]  # FSDPMemTracker category -> bytes at the global peak
    modules: dict[str, dict[str, int]]  # module FQN -> {"forward", "backward"} peak bytes
    tracker: Any


def tracked(
    build: Callable[[], nn.Module],
    inputs: Callable[[], dict[str, torch.Tensor]],
    blocks: Callable[[nn.Module], list[nn.Module]],
    world_size: int,
    loss: Callable[[Any], torch.Tensor],
    optimizer: bool = False,
    mesh_shape: tuple[int, int] | None = None,
    parallelize: Callable[[nn.Module, Any], object] | None = None,
    around: Callable[[], AbstractContextManager[object]] = nullcontext,
    **fully_shard_kwargs: Any,
) -> Tracked:
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if mesh_shape is None:
        mesh = init_device_mesh("cpu", (world_size,))
    elif parallelize is not None:  # FSDP x TP: parallelize on tp, fully_shard on dp_shard
        both = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp_shard", "tp"))
        mesh = both["dp_shard"]
    else:  # HSDP: replicate over the first dimension, shard over the second
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp_replicate", "dp_shard"))
    # allow_non_fake_inputs: fully_shard(reshard_after_forward=int) builds a mesh from real tensors.
    # FSDP x TP runs on real CPU tensors (the models are small): DTensor computes each output's
    # placement on fake tensors of the global shape, under the fake mode that is active, and
    # FSDPMemTracker entered inside a fake mode counts those as allocations; outside one it
    # skips them (torch's comment in MemTracker.__torch_dispatch__).
    fake = FakeTensorMode(allow_non_fake_inputs=True) if parallelize is None else nullcontext()
    with fake:
        model = build()
        if parallelize is not None:
            parallelize(model, both["tp"])
        # the dp x tp mesh fully_shard joins is computed from real tensors (nonzero on a fake
        # tensor has no fixed shape); the parameters stay fake
        with unset_fake_temporarily():
            for block in blocks(model):
                fully_shard(block, mesh=mesh, **fully_shard_kwargs)
            fully_shard(model, mesh=mesh, **fully_shard_kwargs)
        batch = inputs()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3) if optimizer else None
        if opt is not None:
            loss(model(**batch)).backward()
            opt.step()
            opt.zero_grad()
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((batch,))
        with tracker, around():
            out = model(**batch)
            loss(out).backward()
        del out
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    modules: dict[str, dict[str, int]] = {}
    for stats in tracker.memory_tracking.values():
        fqn = stats.mod_fqn.partition(".")[2]  # drop the root class name
        by_state = {state.value: snaps for state, snaps in stats.snapshots.items()}
        modules[fqn] = {
            phase: max(next(iter(s.values()))["Total"] for s in by_state[f"Peak {name}"])
            for phase, name in (("forward", "Forward"), ("backward", "Backward"))
        }
    cats = {str(getattr(k, "value", k)): int(v) for k, v in peak.items()}
    return Tracked(cats, modules, tracker)
