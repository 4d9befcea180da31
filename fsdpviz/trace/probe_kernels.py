"""The kernels and FLOPs of each operator as :class:`~fsdpviz.trace.probe.CostProbe` counts
them (see :mod:`fsdpviz.schema.profile`, ``kernels``): a matrix multiply, a fused attention or
another operator with a FLOP formula as one rank runs it (under tensor parallelism on its shares
of the operands), every other kernel-launching operator merged per stretch, and those that
``torch.compile`` would fuse handed to :class:`~fsdpviz.trace.fusion.FusedRegions`.
:class:`KernelAccounting` is the part of the probe that does it."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Protocol

import torch

from fsdpviz.trace.fusion import FusedRegions, ModuleScope
from fsdpviz.trace.operators import op_arg, op_tensors, tensor_bytes
from fsdpviz.trace.probe_records import Stretch, TPShares, local_gemm, local_part
from fsdpviz.trace.recomputation import recomputing
from fsdpviz.trace.tracker import ModuleTracker

__all__ = ["KernelAccounting", "KernelHost"]


class KernelHost(Protocol):
    """What the kernel accounting reads and calls of the probe it is part of."""

    _stretch: Stretch
    _tp: TPShares | None
    _fused: FusedRegions
    _tracker: ModuleTracker
    _record_modules: bool
    _float8: ModuleScope | None
    _float8_recipe: str
    tp_ranks: int
    module_flops: dict[str, float]

    def _is_share(self, t: Any) -> bool: ...
    def _share(self, t: Any) -> Fraction | None: ...
    def _inputs_share(self, tensors: Any) -> Fraction | None: ...
    def _fusing(self) -> bool: ...
    def _add_kernel(self, key: tuple[Any, ...], count: int, nbytes: float) -> None: ...
    def _local_numel(self, t: torch.Tensor) -> int: ...
    def _local_bytes(self, x: Any) -> int: ...
    def _float8_casts(
        self, backward: int, grad: bool, a: torch.Tensor, b: torch.Tensor, out_bytes: int = 0
    ) -> bool: ...
    def _float8_rescale(self, backward: int, out: Any) -> None: ...


class KernelAccounting:
    """The probe's methods that count kernels and FLOPs (a mixin of
    :class:`~fsdpviz.trace.probe.CostProbe`, typed by :class:`KernelHost`)."""

    def _count_flops(self: KernelHost, flops: int) -> None:
        if torch._C._current_graph_task_id() != -1:
            self._stretch.flops_backward += flops
            return
        self._stretch.flops_forward += flops
        if self._record_modules:
            name = self._tracker.stack[-1] if self._tracker.stack else ""
            self.module_flops[name] = self.module_flops.get(name, 0.0) + flops

    def _count_kernel(
        self: KernelHost,
        cost: tuple[Any, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        flops: int,
        fresh: bool = True,
    ) -> None:
        """One GPU kernel this operator launches, merged with the same kernels of the stretch
        (see :mod:`fsdpviz.schema.profile`, ``kernels``). Under tensor parallelism, as one rank
        of the tp group runs it: its shares of the operands and output (the output already
        tracked), a matrix multiply on the shapes its shares leave."""
        backward = int(torch._C._current_graph_task_id() != -1)
        kind = cost[0]
        key: tuple[Any, ...]
        tp = self.tp_ranks if self._tp is not None else 1
        if kind == "mem":
            nbytes = self._local_bytes(args) + self._local_bytes(out)
            self._add_kernel(("mem", backward), 1, nbytes)
            if self._fusing():
                self._fused.add(backward, args, out, nbytes, fresh)
            else:
                self._fused.close()
            return
        self._fused.close()  # a matrix multiply, attention or convolution ends a fused run
        rescale = False
        if kind == "gemm":
            a, b = args[cost[1]], args[cost[1] + 1]
            *batch, m, k = a.shape
            n = b.shape[-1]
            nb = batch[0] if batch else 1
            if tp > 1:  # one rank's shares
                m, n, k = local_gemm(m, n, k, self._is_share(a), self._is_share(b), tp)
            isz = a.element_size()
            key = ("gemm", backward, m, n, k, nb, isz)
            nbytes = (m * k + k * n + m * n) * nb * isz
            float8 = self._float8 is not None and self._float8.active()
            # a checkpoint's recomputation in backward runs the linear's forward again
            gradient = bool(backward) and not recomputing()
            out_bytes = self._local_bytes(out)
            if float8 and self._float8_casts(backward, gradient, a, b, out_bytes):
                key = ("gemm", backward, m, n, k, nb, 1)  # operands in float8, output not
                nbytes = (m * k + k * n) * nb + m * n * nb * isz
                rescale = gradient and self._float8_recipe == "rowwise"
        elif kind == "attn":
            q, kv = args[cost[1]], args[cost[1] + 1]
            causal = cost[3] is not None and bool(op_arg(args, kwargs, cost[3], "is_causal"))
            b, h, sq, d = q.shape
            hkv = kv.shape[1]
            if tp > 1 and self._is_share(q):  # the rank's heads
                h, hkv = -(-h // tp), -(-hkv // tp)
            skv = kv.shape[2]
            isz = q.element_size()
            # the backward kernel (its query is argument 1) or the forward one, whatever the
            # phase: activation checkpointing's recomputation in backward runs the forward one
            grad = int(cost[1] == 1)
            key = ("attn", cost[2], backward, b, h, sq, skv, d, int(causal), isz, grad)
            nbytes = (2 * b * h * sq * d + 2 * b * hkv * skv * d) * isz * (1 + grad)
        else:
            local = local_part(flops, self._inputs_share(out) if tp > 1 else None)
            key = ("flops", backward, local)
            nbytes = self._local_bytes(args) + self._local_bytes(out)
        self._add_kernel(key, 1, nbytes)
        if rescale:
            self._float8_rescale(backward, out)

    def _local_numel(self: KernelHost, t: torch.Tensor) -> int:
        """The elements of ``t`` one rank holds: a tp share's part of them."""
        return local_part(t.numel(), self._share(t))

    def _local_bytes(self: KernelHost, x: Any) -> int:
        """Bytes of the tensors in ``x`` one rank holds: a tp share's part of them."""
        if self._tp is None:
            return tensor_bytes(x)
        return sum(local_part(t.numel() * t.element_size(), self._share(t)) for t in op_tensors(x))

    def _add_kernel(self: KernelHost, key: tuple[Any, ...], count: int, nbytes: float) -> None:
        if self._stretch.moments is not None:  # each call, for batch_replay to merge again
            self._stretch.moments.kernels.append((key, count, nbytes))
        rec = self._stretch.kernels.get(key)
        if rec is None:
            self._stretch.kernels[key] = [count, nbytes]
        else:
            rec[0] += count
            rec[1] += nbytes
