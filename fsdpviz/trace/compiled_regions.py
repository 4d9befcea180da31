"""Compiled modules under per-operator selective activation checkpointing, as
:class:`~fsdpviz.trace.probe.CostProbe` counts what they hold between forward and backward.

torchtitan compiles each block with its selective checkpoint inside (``selective_ac_option
= "op"``, then ``torch.compile`` of the block): Dynamo traces the checkpoint, the policy tags
each operator ``MUST_SAVE`` or ``PREFER_RECOMPUTE``, and AOTAutograd's partitioner keeps of
the block only what its backward reads. Eager selective checkpointing keeps every output the
policy saves whether the backward reads it or not: the last matrix multiply of a block (the
feed-forward's down projection, whose output is only added to the residual) is held by eager
and not by the compiled block. :class:`CompiledRegionAccounting` asks torch's partitioner
(:func:`~fsdpviz.trace.compiled_saves.partitioner_saves`, the region's forward captured with
its policy's tags) what the block keeps; when the block's forward returns, the storages it
made that eager keeps and the partitioner does not stop counting, and what the partitioner
keeps that eager does not make is held as tensors of its own until the block's backward has
given its inputs' gradients. Its kernels and their time are unchanged.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import torch
from torch import nn
from torch.torch_version import TorchVersion
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from fsdpviz.trace.checkpointing import is_selective
from fsdpviz.trace.compiled_saves import PartitionSaves, partitioner_saves
from fsdpviz.trace.operators import op_tensors
from fsdpviz.trace.probe_records import ACT, Stretch, local_part, storage_of

__all__ = ["CompiledRegion", "CompiledRegionAccounting", "RegionHost", "compiled_checkpoints"]


# The torch releases whose capture of a checkpointed region (make_fx with autograd on)
# carries the selective policy's tags to the partitioner, as its partition of the compiled
# block shows (checked on 2.13 and 2.14; on 2.8 the capture loses them, and the partitioner
# keeps more than torch.compile does)
PARTITIONED_SINCE = "2.13"

# what the partitioner keeps of a region, by the operators its forward ran (each with its
# outputs' shapes and dtypes) and its inputs: a model's identical blocks, and every trace
# of the same model, partition once (a cache of partitioner_saves, not a second answer)
_SAVES: dict[tuple[Any, ...], PartitionSaves | None] = {}


@dataclass
class CompiledRegion:
    """A compiled checkpointed module's forward while it runs: the storages its operators
    made, in the order they made them (``(bytes, dtype, weak reference)``: a list, not a
    table keyed by ``id``, since a storage made after a freed one may get its ``id``, and
    which storages the partitioner's saves are matched to would then depend on where
    Python's allocator put them) and the operators it ran."""

    made: list[tuple[int, torch.dtype, weakref.ref[torch.UntypedStorage]]] = field(
        default_factory=list
    )
    ops: list[tuple[Any, ...]] = field(default_factory=list)


class RegionHost(Protocol):
    """What the compiled regions' accounting reads and calls of the probe it is part of."""

    _regions: list[CompiledRegion]
    _region_extras: list[torch.Tensor]
    _stretch: Stretch
    _live: dict[int, list[Any]]
    live: list[int]
    _measuring: bool

    def _hold(self, st: Any, key: int, n: int, kind: int) -> None: ...
    def _inputs_share(self, tensors: Any) -> Fraction | None: ...


class CompiledRegionAccounting:
    """The probe's methods for compiled checkpointed modules (a mixin of
    :class:`~fsdpviz.trace.probe.CostProbe`, typed by :class:`RegionHost`)."""

    _regions: list[CompiledRegion]  # the compiled regions whose forward runs, innermost last

    def _region_hooks(self: RegionHost, modules: list[nn.Module]) -> list[Any]:
        """Hooks on ``modules`` (compiled, each a selective checkpoint) that hold what the
        partitioner keeps of their forward; removed by the caller."""
        handles = []
        for m in modules:
            enter = functools.partial(CompiledRegionAccounting._region_enter, self)
            leave = functools.partial(CompiledRegionAccounting._region_leave, self)
            handles.append(m.register_forward_pre_hook(enter))
            # before the module's other hooks (FSDP's post-forward): the compiled forward
            # has returned by then
            handles.append(
                m.register_forward_hook(leave, prepend=True, with_kwargs=True, always_call=True)
            )
        return handles

    def _region_enter(self: RegionHost, module: nn.Module, args: tuple[Any, ...]) -> None:
        if not self._measuring or torch._C._current_graph_task_id() != -1:
            return
        region = CompiledRegion()
        self._regions.append(region)
        module.__dict__["_fsdpviz_region"] = region

    def _region_leave(
        self: RegionHost,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        region = module.__dict__.pop("_fsdpviz_region", None)
        if region is None:
            return
        if region in self._regions:
            self._regions.remove(region)
        if output is None:  # the forward raised: eager accounting stands
            return
        leaves, spec = tree_flatten((args, kwargs))
        where = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
        inputs: list[torch.Tensor] = [leaves[i] for i in where]
        key = (
            type(module),
            tuple(region.ops),
            tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.requires_grad) for t in inputs),
            spec,
        )
        if key in _SAVES:
            saves = _SAVES[key]
        else:
            forward = module.forward

            def on_tensors(*ts: torch.Tensor) -> Any:
                flat = list(leaves)
                for i, t in zip(where, ts, strict=True):
                    flat[i] = t
                a, kw = tree_unflatten(flat, spec)
                return forward(*a, **kw)

            what = f"the compiled {type(module).__name__}"
            saves = _SAVES.setdefault(
                key, partitioner_saves(on_tensors, inputs, checkpointed=True, what=what)
            )
        if saves is not None:
            if self._stretch.moments is not None:  # saves by bytes: not affine in the batch
                self._stretch.moments.partitioned = True
            _hold_saves(self, region, saves, inputs, output)

    def _region_op(self: RegionHost, func: Any, out: Any) -> None:
        """An operator ran in the forward of the running compiled regions."""
        sig = (func, tuple((tuple(t.shape), t.dtype) for t in op_tensors(out)))
        for region in self._regions:
            region.ops.append(sig)

    def _region_made(self: RegionHost, t: torch.Tensor) -> None:
        """A storage an operator of the running compiled regions made in forward."""
        st = storage_of(t)
        if st is not None:
            for region in self._regions:
                region.made.append((st.nbytes(), t.dtype, weakref.ref(st)))


def compiled_checkpoints(
    model: nn.Module, compiled: list[nn.Module] | None, compile: object
) -> list[nn.Module]:
    """The modules of ``model`` under a selective checkpoint that ``torch.compile`` compiles:
    those inside the ``compiled`` modules (None: the whole model), when ``compile`` is on.
    Dynamo traces each such checkpoint whole, its policy's tags in its graph. None under a
    torch before :data:`PARTITIONED_SINCE`, which keep eager autograd's count."""
    if not compile or TorchVersion(torch.__version__) < PARTITIONED_SINCE:
        return []
    roots = [model] if compiled is None else compiled
    return [m for root in roots for m in root.modules() if is_selective(m)]


def _hold_saves(
    host: RegionHost,
    region: CompiledRegion,
    saves: PartitionSaves,
    inputs: list[torch.Tensor],
    output: Any,
) -> None:
    """The compiled region's forward has returned: of the storages it made that are still
    alive, its output and those the partitioner keeps (matched by size and dtype) stay
    counted, the others (eager autograd's or the selective checkpoint's) stop counting; what
    the partitioner keeps that eager did not make is held as tensors of its own."""
    out = {id(st) for t in tree_leaves(output) if isinstance(t, torch.Tensor)
           and (st := storage_of(t)) is not None}  # fmt: skip
    wanted = saves.sized
    for nbytes, dtype, ref in region.made:
        st = ref()
        if st is None:
            continue  # freed since
        key = id(st)
        rec = host._live.get(key)
        if rec is None or rec[2]() is not st or key in out or rec[0] == 0:
            continue  # not counted, or kept anyway
        made = (nbytes, dtype)
        if made in wanted:
            wanted.remove(made)
            continue
        host.live[rec[1]] -= rec[0]  # eager keeps it, the compiled region does not
        rec[0] = 0
    if not wanted:
        return
    share = host._inputs_share(inputs)
    extras = []
    for n, dtype in wanted:
        with _disable_current_modes():
            t = torch.empty(n // dtype.itemsize, dtype=dtype, device="meta")
        extras.append(t)
        st = t.untyped_storage()
        host._hold(st, id(st), local_part(st.nbytes(), share), ACT)
    host._region_extras.extend(extras)
    grads = [t for t in inputs if t.requires_grad]
    if grads:  # freed when the region's backward has given its inputs' gradients
        release = functools.partial(_release, host._region_extras, extras)
        torch.autograd.graph.register_multi_grad_hook(grads, release, mode="any")


def _release(held: list[torch.Tensor], extras: list[torch.Tensor], _grad: Any) -> None:
    for t in extras:
        for i, h in enumerate(held):
            if h is t:
                del held[i]
                break
