"""A float8 linear's kernels as :class:`~fsdpviz.trace.probe.CostProbe` counts them: the
casts around each matrix multiply (:func:`~fsdpviz.trace.fusion.float8_casts`), whether the
multiply runs in float8, and the rescaling of a rowwise backward multiply's output, eager or
placed in the fused kernel that reads it next under ``torch.compile``.
:class:`Float8Accounting` is the part of the probe that does it."""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch

from fsdpviz.trace.fusion import FusedRegions, float8_casts, float8_gemm, float8_rescale
from fsdpviz.trace.operators import op_tensors
from fsdpviz.trace.probe_records import TPShares, storage_of

__all__ = ["Float8Accounting", "Float8Host"]


class Float8Host(Protocol):
    """What the float8 accounting reads and calls of the probe it is part of."""

    _float8_weights: dict[int, weakref.ref[Any]]
    _rescales: dict[int, tuple[weakref.ref[Any], int, int, float, float]]
    _float8_gathered: bool
    _float8_recipe: str
    _tp: TPShares | None
    _fused: FusedRegions

    def _add_kernel(self, key: tuple[Any, ...], count: int, nbytes: float) -> None: ...
    def _fusing(self) -> bool: ...
    def _local_numel(self, t: torch.Tensor) -> int: ...
    def _local_bytes(self, x: Any) -> int: ...


class Float8Accounting:
    """The probe's methods for float8 linears (a mixin of
    :class:`~fsdpviz.trace.probe.CostProbe`, typed by :class:`Float8Host`)."""

    def _float8_casts(
        self: Float8Host, backward: int, grad: bool, a: torch.Tensor, b: torch.Tensor
    ) -> bool:
        """The casts around a float8 linear's matrix multiply (:func:`float8_casts`; ``grad``:
        one of its backward's, not its forward run in the ``backward`` phase by a
        recomputation); whether the multiply runs in float8 (:func:`float8_gemm`)."""
        weights = self._float8_weights
        first = True
        if not grad:
            st = storage_of(b)
            if st is not None:
                weights[id(st)] = weakref.ref(st)
        else:  # the input's gradient multiplies by the weight, the weight's does not
            first = False
            for t in (a, b):
                st = storage_of(t)
                ref = None if st is None else weights.get(id(st))
                first = first or (ref is not None and ref() is st)
        compiled = self._fusing()
        recipe = self._float8_recipe
        share = self._local_numel if self._tp is not None else None
        casts = float8_casts(grad, a, b, self._float8_gathered, first, recipe, share)
        for count, eager, kernels, fused in casts:
            self._add_kernel(("mem", backward), count, eager)
            if compiled:
                self._fused.extra(backward, count, eager, fused, kernels)
        return float8_gemm(grad, first, recipe)

    def _float8_rescale(self: Float8Host, backward: int, out: Any) -> None:
        """The multiply of a rowwise float8 backward matrix multiply's output by its scales
        (:func:`float8_rescale`): eager, its own kernels; compiled, a pointwise operator on
        the output that Inductor computes inside the kernel that reads the output next when
        that is a fused memory-bound one (no traffic of its own), and otherwise writes out
        (:meth:`_rescale_read`)."""
        st = storage_of(out) if isinstance(out, torch.Tensor) else None
        if st is None:
            return
        share = self._local_numel if self._tp is not None else None
        count, eager = float8_rescale(out, share)
        self._add_kernel(("mem", backward), count, eager)
        if self._fusing():
            nbytes = float(self._local_bytes(out))
            self._rescales[id(st)] = (weakref.ref(st), backward, count, eager, nbytes)

    def _rescale_read(self: Float8Host, args: Any, fused: bool) -> None:
        """An operator reads ``args``: the rescaling of any of them still to place runs
        inside it when it is a fused memory-bound operator (``fused``: the rescale joins its
        region and reads nothing more), else as a kernel of its own that reads and writes
        the output (a matrix multiply, attention, a collective or an operator outside the
        compiled modules reads the scaled output from memory)."""
        for t in op_tensors(args):
            st = storage_of(t)
            entry = None if st is None else self._rescales.get(id(st))
            if entry is None or entry[0]() is not st:
                continue
            del self._rescales[id(st)]
            _, backward, count, eager, nbytes = entry
            if fused:
                self._fused.add(backward, (t,), (), eager, True, count)
            else:
                self._fused.extra(backward, count, eager, 2.0 * nbytes)

    def _place_rescales(self: Float8Host) -> None:
        """The rescalings no operator of this stretch read: the output leaves the compiled
        region (a weight's gradient, handed to FSDP's reduction), so the scaled one is
        written."""
        pending = list(self._rescales.values())
        self._rescales.clear()
        for _, backward, count, eager, nbytes in pending:
            self._fused.extra(backward, count, eager, 2.0 * nbytes)
