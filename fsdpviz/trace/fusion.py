"""What ``torch.compile`` and float8 linears change in the kernels a trace records.

:class:`ModuleScope` tells whether the operator running now belongs to some modules: in
forward, while their forward runs (an activation-checkpoint recomputation included); in
backward, while the autograd engine runs a node their forward created (each such node
is marked in ``node.metadata`` when the module's forward returns: the nodes reachable
from its outputs, created after it started).

:class:`FusedRegions` collects what Inductor would fuse: each run of memory-bound
operators inside the compiled modules, ended by a matrix multiply, an attention kernel, a
collective, an operator outside the compiled modules or an FSDP hook, is one fused
kernel. It reads each tensor it takes from outside the run once, and writes each tensor
it makes that outlives the run (read by a later kernel, or saved by autograd) once.

Float8 linears (torchao's ``Float8Linear``) run their matrix multiplies in float8:
:func:`float8_casts` gives the memory-bound work around each one, and
:func:`float8_rescale` the pass over the output that the rowwise recipe's backward
multiplies add.

Example::

    scope = ModuleScope("compiled", [block for block in model.layers])
    ...
    scope.active()   # inside a compiled block's forward or backward
    scope.remove()
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._C._autograd import _get_sequence_nr
from torch.utils._pytree import tree_leaves

from fsdpviz.trace.operators import op_tensors

_ACCUMULATE = 2**63  # AccumulateGrad nodes run last: their sequence number is the largest


def _sequence_nr() -> int:
    """The autograd sequence number the next node created will have, so that nodes created
    from now on can be told apart."""
    return int(_get_sequence_nr())


class ModuleScope:
    """Whether the current operator runs in the forward or backward of ``modules`` (None:
    of the whole model). Hooks are removed by :meth:`remove`."""

    def __init__(self, name: str, modules: Sequence[nn.Module] | None) -> None:
        self.name = f"fsdpviz_{name}"
        self.everywhere = modules is None
        self.depth = 0
        self._starts: list[int] = []
        self._handles: list[Any] = []
        for m in modules or ():
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave))

    def active(self) -> bool:
        if self.everywhere or self.depth > 0:
            return True
        node = torch._C._current_autograd_node()
        return node is not None and self.name in _metadata(node)

    def enter(self) -> None:
        """A region of the scope begins (as a module's forward pre-hook does)."""
        self._enter(None, None)

    def leave(self, output: Any) -> None:
        """The region that began last returns ``output``: the backward nodes made from then
        on, reachable from it, belong to the scope."""
        self._leave(None, None, output)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def abandon(self) -> None:
        """The region that began last never returns: an activation checkpoint's
        recomputation stopped inside it (``_StopRecomputationError``, raised once the last
        tensor the checkpoint saved is recomputed), so its forward hook does not run."""
        self.depth -= 1
        if self._starts:
            self._starts.pop()

    def _enter(self, module: nn.Module | None, args: Any) -> None:
        self.depth += 1
        self._starts.append(_sequence_nr())

    def _leave(self, module: nn.Module | None, args: Any, output: Any) -> None:
        self.depth -= 1
        start = self._starts.pop() if self._starts else 0
        if not torch.is_grad_enabled():
            return
        todo: list[Any] = [
            t.grad_fn
            for t in tree_leaves(output)
            if isinstance(t, torch.Tensor) and t.grad_fn is not None
        ]
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            nr = int(node._sequence_nr())
            if nr < start or nr >= _ACCUMULATE:
                continue  # made before this forward (its input's graph), or a leaf's
            _metadata(node)[self.name] = True
            todo.extend(n for n, _ in node.next_functions)


def _metadata(node: Any) -> dict[str, Any]:
    """``node.metadata``: a dict kept on the autograd node (a property at run time)."""
    meta: dict[str, Any] = node.metadata
    return meta


def _bytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


@dataclass
class _Region:
    backward: int
    # storages read from outside, made inside, and written in place (outside ones), each
    # as bytes and a weak reference (a freed storage's id can come back for another)
    reads: dict[int, tuple[int, Any]] = field(default_factory=dict)
    made: dict[int, tuple[int, Any]] = field(default_factory=dict)
    written: dict[int, tuple[int, Any]] = field(default_factory=dict)
    stale: int = 0  # bytes read or written of a storage freed since (its id reused)
    eager_count: int = 0
    eager_bytes: float = 0.0


def _note(table: dict[int, tuple[int, Any]], region: _Region, st: Any, n: int) -> None:
    """Record ``n`` bytes of storage ``st`` in ``table`` (the most seen of it)."""
    key = id(st)
    old = table.get(key)
    if old is not None and old[1]() is not st:  # another storage that had the same id
        if table is not region.made:  # a freed intermediate was never written out
            region.stale += old[0]
        old = None
    table[key] = (max(n, old[0] if old else 0), weakref.ref(st))


class FusedRegions:
    """Memory-bound operators grouped into the kernels Inductor would make (see the module
    docstring), per stretch: :meth:`take` gives ``["fused", backward, eager count, eager
    bytes, kernels, bytes]`` records."""

    def __init__(self, size: Callable[[torch.Tensor], int] | None = None) -> None:
        self._open: _Region | None = None
        self._done: dict[int, list[float]] = {}
        self._size = size or _bytes  # a tensor's bytes on one rank (a tp share's 1 / tp)

    def add(
        self, backward: int, args: Any, out: Any, nbytes: float, fresh: bool, count: int = 1
    ) -> None:
        """A memory-bound operator (``count`` kernels of ``nbytes`` eager) in the compiled
        modules."""
        r = self._open
        if r is None or r.backward != backward:
            self.close()
            r = self._open = _Region(backward)
        r.eager_count += count
        r.eager_bytes += nbytes
        size = self._size
        for t in op_tensors(args):
            st = _storage(t)
            if st is not None and not _holds(r.made, st):
                _note(r.reads, r, st, size(t))
        for t in op_tensors(out):
            st = _storage(t)
            if st is None or _holds(r.made, st):
                continue
            _note(r.made if fresh else r.written, r, st, size(t))

    def extra(
        self, backward: int, eager_count: int, eager_bytes: float, fused: float, kernels: int = 1
    ) -> None:
        """Kernels of their own (a float8 cast): eager ``eager_count`` kernels of
        ``eager_bytes``, fused ``kernels`` of ``fused`` bytes."""
        rec = self._done.setdefault(backward, [0, 0.0, 0, 0.0])
        rec[0] += eager_count
        rec[1] += eager_bytes
        rec[2] += kernels
        rec[3] += fused

    def close(self) -> None:
        """End the current run: it becomes one fused kernel."""
        r, self._open = self._open, None
        if r is None:
            return
        out = sum(n for n, ref in r.made.values() if ref() is not None)
        fused = sum(n for n, _ in r.reads.values()) + out + sum(n for n, _ in r.written.values())
        fused += r.stale
        rec = self._done.setdefault(r.backward, [0, 0.0, 0, 0.0])
        rec[0] += r.eager_count
        rec[1] += r.eager_bytes
        rec[2] += 1
        rec[3] += fused

    def take(self) -> list[list[Any]]:
        self.close()
        done, self._done = self._done, {}
        return [
            ["fused", backward, int(n), float(b), int(k), float(f)]
            for backward, (n, b, k, f) in sorted(done.items())
        ]


def _storage(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _holds(table: dict[int, tuple[int, Any]], st: Any) -> bool:
    entry = table.get(id(st))
    return entry is not None and entry[1]() is st


def float8_casts(
    backward: bool,
    a: torch.Tensor,
    b: torch.Tensor,
    weight_in_float8: bool,
    first: bool,
    recipe: str = "tensorwise",
    share: Callable[[torch.Tensor], int] | None = None,
    float8_operand: bool = False,
) -> list[tuple[int, float, int, float]]:
    """The memory-bound kernels around one float8 matrix multiply ``a @ b`` (its operands as
    the trace saw them, in the high precision), as ``(eager kernels, eager bytes, fused
    kernels, fused bytes)`` each: a cast is an amax reduction and a scaled cast (eager two
    kernels, reading the tensor twice and writing one byte per element); a transposed copy
    reads and writes float8.

    Compiled, what a cast costs depends on where its amax runs. Along the tensor's
    contiguous rows (rowwise scaling along the last dimension) Inductor computes the amax and
    the cast in one kernel, a row at a time: one read. Over the whole tensor (tensorwise) or
    down its columns (rowwise along the first dimension) every element's cast needs a
    reduction over other rows first: a reduction kernel (on GPU a split reduction and its
    small final stage) then the cast, two reads. That is charged where it holds whatever
    produced the tensor: the weight's casts (a graph input) and the columns of the input
    that the weight's gradient multiplies. The output gradient cast along both dimensions
    for rowwise's two backward multiplies is one reduction down its columns and one kernel
    that reduces its rows and writes both casts: two reads for the two, one each. A
    tensorwise cast of an activation stays at one read: on GPU Inductor splits the global
    amax along the ranges of the reduction that produced its input
    (``extract_input_node_reduction_ranges``), so after a norm its first stage runs inside
    the norm's kernel; after a matrix multiply or attention it is a pass of its own.

    ``tensorwise`` (one scale per tensor): forward (``input @ weight.t()``) casts the input,
    and the weight unless FSDP gathered it in float8 (``weight_in_float8``). Backward: the
    first matrix multiply of a linear's backward (``first``: the input's gradient) casts the
    output gradient; the other reuses it through a transposed copy; each also copies its
    float8 second operand (saved by forward) transposed. ``rowwise`` (a scale per row along
    the dimension each multiply reduces, torchao's axiswise scaling): a tensor's scales
    differ between its two multiplies, so every operand of every multiply is cast from the
    high precision, forward and backward (FSDP all-gathers in bf16): forward the input and
    the weight along their rows; the input's gradient the output gradient along its rows
    and the weight down its columns; the weight's gradient the output gradient and the
    input down their columns. ``rowwise_with_gw_hp``: rowwise, but the weight is cast
    tensorwise for the input's gradient and the weight's gradient (the second multiply of
    backward) is computed in the high precision, with no cast (:func:`float8_gemm`).
    ``share``: the elements of a tensor one rank holds (a tensor-parallel share's ``1 /
    tp``; default all of them). ``float8_operand``: ``a`` (forward the input, backward the
    output gradient) is float8 already, cast by a float8 tensor-parallel style (tensorwise):
    no cast of it.
    """
    casts: list[tuple[int, float, int, float]] = []
    count = share or (lambda t: t.numel())

    def cast(t: torch.Tensor, across: bool = False) -> None:
        """``across``: the amax reduces across rows (the whole tensor or its columns)."""
        n = count(t)
        high = n * t.element_size()
        passes = 2 if across else 1
        casts.append((2, 2.0 * high + n, passes, float(passes * high + n)))

    def transposed(t: torch.Tensor) -> None:
        n = float(count(t))
        casts.append((1, 2.0 * n, 1, 2.0 * n))

    if recipe != "tensorwise":
        if not backward:
            cast(a)
            cast(b)
        elif float8_gemm(backward, first, recipe):
            cast(a)
            cast(b, across=True)
        return casts
    if not backward:
        if not float8_operand:
            cast(a)
        if not weight_in_float8:
            cast(b, across=True)
        return casts
    if first:
        if not float8_operand:
            cast(a)
    else:
        transposed(a)
    transposed(b)
    return casts


def float8_rescale(
    out: torch.Tensor, share: Callable[[torch.Tensor], int] | None = None
) -> tuple[int, float]:
    """The kernels torchao runs after a rowwise recipe's backward matrix multiply, as
    ``(eager kernels, eager bytes)``: ``_scaled_mm`` without fast accumulation and with a
    scale per row is a CUTLASS kernel slow enough that torchao runs the tensorwise cuBLAS
    one with unit scales and scales the output afterwards (``addmm_float8_unwrapped`` in
    ``torchao/float8/float8_ops.py``, from ``6a177c9``, December 2024, to this day:
    ``post_inverse_scale = a_inverse_scale * b_inverse_scale`` then ``output *=
    post_inverse_scale``). Both backward multiplies of ``rowwise`` run without fast
    accumulation (``Float8LinearConfig``'s ``gemm_config_grad_input`` and
    ``gemm_config_grad_weight``); the forward one runs with it, in the rowwise kernel.

    Eager that is two kernels: the outer product of the two scale vectors, written as an
    ``M x N`` float32 tensor, and the in-place multiply (reads the output and that tensor,
    writes the output). Compiled, the multiply is a single-use pointwise operator that
    Inductor computes inside the kernel reading the output next: no traffic of its own when
    that is a fused memory-bound kernel, else one pass that reads the output and writes the
    scaled one (where a matrix multiply, attention, a collective or FSDP reads it; the probe
    places it). The scale vectors themselves (``M + N`` floats) are left out. ``share``: as
    in :func:`float8_casts`.
    """
    n = (share or (lambda t: t.numel()))(out)
    high = out.element_size()
    return 2, float(n * 4 + n * (2 * high + 4))


def float8_gemm(backward: bool, first: bool, recipe: str) -> bool:
    """Whether a float8 linear's matrix multiply runs in float8: all three do but, under
    ``rowwise_with_gw_hp``, the weight's gradient (backward's second)."""
    return not (recipe == "rowwise_with_gw_hp" and backward and not first)
