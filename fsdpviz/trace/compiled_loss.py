"""A ``torch.compile``'d loss as :class:`~fsdpviz.trace.probe.CostProbe` counts its memory
(see :mod:`fsdpviz.trace.compiled_saves`): inside its kernels only what they write out, and
between its forward and backward only what torch's partitioner saves.
:class:`CompiledLossAccounting` is the part of the probe that does it."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from fsdpviz.trace.compiled_saves import PartitionSaves, partitioner_saves
from fsdpviz.trace.fusion import ModuleScope
from fsdpviz.trace.probe_records import (
    ACT,
    FWD_TEMP,
    CompiledLoss,
    StorageShares,
    Stretch,
    local_part,
    storage_of,
)

__all__ = ["CompiledLossAccounting", "LossHost"]


class LossHost(Protocol):
    """What the compiled loss's accounting reads and calls of the probe it is part of."""

    _loss: CompiledLoss | None
    _stretch: Stretch
    _live: dict[int, list[Any]]
    live: list[int]
    _sharded: StorageShares
    _measuring: bool

    def _hold(self, st: Any, key: int, n: int, kind: int) -> None: ...
    def _inputs_share(self, tensors: Any) -> Fraction | None: ...
    def _write_out(self, loss: CompiledLoss, key: int, kind: int) -> None: ...
    def _end_loss(self) -> None: ...
    def _loss_saves(
        self, loss: CompiledLoss, saves: PartitionSaves, tensors: list[torch.Tensor]
    ) -> None: ...


class CompiledLossAccounting:
    """The probe's methods for a compiled loss (a mixin of
    :class:`~fsdpviz.trace.probe.CostProbe`, typed by :class:`LossHost`)."""

    _loss: CompiledLoss | None  # the compiled loss running now, set by the probe

    def _pending_freed(self: LossHost, loss: CompiledLoss, key: int, ref: Any) -> None:
        self._sharded.forget(key)
        entry = loss.pending.get(key)
        if entry is not None and entry[2] is ref:
            del loss.pending[key]
            loss.saved.discard(key)

    def _call_loss(self: LossHost, fn: Callable[[Any], torch.Tensor], output: Any) -> torch.Tensor:
        """Run the loss as ``torch.compile`` would hold its memory (see
        :mod:`fsdpviz.trace.compiled_saves`): inside it only what its kernels write out
        counts, and between forward and backward only what torch's partitioner saves."""
        leaves, spec = tree_flatten(output)
        where = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
        tensors = [leaves[i] for i in where]

        def on_tensors(*ts: torch.Tensor) -> torch.Tensor:
            args = list(leaves)
            for i, t in zip(where, ts, strict=True):
                args[i] = t
            return fn(tree_unflatten(args, spec))

        saves = partitioner_saves(on_tensors, tensors) if self._measuring else None
        if saves is None:
            return fn(output)
        if self._stretch.moments is not None:  # saves by bytes: not affine in the batch
            self._stretch.moments.partitioned = True
        self._end_loss()
        loss = self._loss = CompiledLoss(ModuleScope("compiled_loss", ()))
        loss.scope.enter()
        try:
            result = fn(output)
        except BaseException:
            loss.scope.leave(None)
            self._end_loss()
            raise
        loss.scope.leave(result)
        self._loss_saves(loss, saves, tensors)
        return result

    def _loss_saves(
        self: LossHost, loss: CompiledLoss, saves: PartitionSaves, tensors: list[torch.Tensor]
    ) -> None:
        """The compiled loss's forward is over: hold what the partitioner saves."""
        for i in saves.inputs:  # its inputs it keeps, held until its backward
            st = storage_of(tensors[i])
            rec = None if st is None else self._live.get(id(st))
            if rec is not None and rec[1] == FWD_TEMP:
                self.live[FWD_TEMP] -= rec[0]
                rec[1] = ACT
                self.live[ACT] += rec[0]
        # its intermediates: those eager autograd saved of the same shape and dtype, the
        # others as tensors of their own, held until its backward is over
        wanted = list(saves.values)
        for key in sorted(loss.saved):
            entry = loss.pending[key]
            if (entry[3], entry[4]) in wanted:
                wanted.remove((entry[3], entry[4]))
                self._write_out(loss, key, ACT)
        share = self._inputs_share(tensors)
        for shape, dtype in wanted:
            with _disable_current_modes():
                t = torch.empty(shape, dtype=dtype, device="meta")
            loss.extras.append(t)
            st = t.untyped_storage()
            n = local_part(st.nbytes(), share if t.dim() > 0 else None)
            self._hold(st, id(st), n, ACT)
        # what it returns (the loss) and whatever else it left alive, but what only eager
        # autograd would have saved
        for key in list(loss.pending):
            if key not in loss.saved:
                self._write_out(loss, key, loss.pending[key][1])
        loss.pending.clear()
        loss.saved.clear()
        loss.forward_done = True

    def _write_out(self: LossHost, loss: CompiledLoss, key: int, kind: int) -> None:
        """A storage the compiled loss made leaves its kernels: count it from now on."""
        n, _, ref = loss.pending.pop(key)[:3]
        loss.saved.discard(key)
        st = ref()
        if st is not None:
            self._hold(st, key, n, kind)

    def _end_loss(self: LossHost) -> None:
        """The compiled loss's backward is over: what its kernels return is written out
        (its gradients), what it saved is freed."""
        loss, self._loss = self._loss, None
        if loss is None:
            return
        for key in list(loss.pending):
            if key not in loss.saved:
                self._write_out(loss, key, loss.pending[key][1])
        loss.pending.clear()
        loss.extras.clear()
