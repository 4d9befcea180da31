"""What an aten operator is to the cost model: its FLOP formula (``torch.utils.flop_counter``'s,
fused attention's, grouped-query attention counted as full heads), whether its outputs
can be new storage, and the GPU kernel it launches (a matrix multiply, a fused attention,
another operator with a FLOP formula, a memory-bound kernel, or none); and a call's
argument, the bytes of its tensors and its output shapes, as
:class:`~fsdpviz.trace.probe.CostProbe` records them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

from fsdpviz.trace.attention import FUSED_FLOPS

_FLOPS: dict[Any, Callable[..., int]] = dict(flop_registry)
_FLOPS.update({op: flop_registry[like] for op, like in FUSED_FLOPS.items()})
FLOP_OPS = sorted(str(k) for k in _FLOPS)


def op_info(
    func: Any,
) -> tuple[Callable[..., int] | None, bool, bool, tuple[Any, ...] | None]:
    """The op's FLOP formula, whether it takes shapes, whether outputs can be new storage,
    and what kernel it launches on a GPU (None: none, as a view)."""
    schema = getattr(func, "_schema", None)
    returns = getattr(schema, "returns", ())
    fresh = not any(r.alias_info is not None for r in returns)
    writes = any(r.alias_info is not None and r.alias_info.is_write for r in returns)
    wrapped = _FLOPS.get(func._overloadpacket)
    # Most of flop_registry's formulas take shapes behind a pytree map of the arguments;
    # these ops take top-level tensors only, so call the formula on their shapes directly.
    raw = getattr(wrapped, "__wrapped__", None)
    cost = _kernel_kind(func, schema, wrapped is not None, fresh or writes)
    name = func._overloadpacket.__name__
    if raw is not None and name in _ATTENTION and not _counts_gqa():
        raw = _gqa_as_heads(raw, 1 if name.endswith("_backward") else 0)
    return (raw, True, fresh, cost) if raw is not None else (wrapped, False, fresh, cost)


@functools.cache
def _counts_gqa() -> bool:
    """Whether torch's attention FLOP formulas take fewer key/value heads than query heads
    (grouped-query attention; torch < 2.9 asserts equal heads)."""
    try:
        sdpa_flop_count((1, 2, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1))  # type: ignore[no-untyped-call]
    except AssertionError:
        return False
    return True


def _gqa_as_heads(formula: Callable[..., int], query: int) -> Callable[..., int]:
    """``formula`` with grouped-query key and value shapes given as many heads as the query
    (argument ``query``; key and value follow it): the kernels broadcast them, so the
    FLOPs are those of full heads."""

    def flops(*shapes: Any, **kwargs: Any) -> int:
        q = shapes[query]
        if len(shapes) > query + 2 and len(q) == 4:
            k, v = shapes[query + 1], shapes[query + 2]
            if len(k) == 4 and len(v) == 4 and k[1] != q[1]:
                k = (k[0], q[1], *k[2:])
                v = (v[0], q[1], *v[2:])
                shapes = (*shapes[: query + 1], k, v, *shapes[query + 3 :])
        return formula(*shapes, **kwargs)

    return flops


def _kernel_kind(func: Any, schema: Any, counted: bool, kernel: bool) -> tuple[Any, ...] | None:
    """``("gemm", first matrix arg)``, ``("attn", q arg, kernel, is_causal arg)``,
    ``("flops",)`` (another op with a FLOP formula), ``("mem",)`` or None (no kernel)."""
    name = func._overloadpacket.__name__
    if name in _GEMMS:
        return ("gemm", _GEMMS[name])
    if name in _ATTENTION:
        args = [a.name for a in schema.arguments]
        backward = name.endswith("_backward")
        causal = args.index("is_causal") if "is_causal" in args else None
        return ("attn", 1 if backward else 0, _ATTENTION[name], causal)
    if counted:
        return ("flops",)
    if not kernel or name in _NO_KERNEL:
        return None
    return ("mem",)


# Matrix multiplies (the index of their first matrix argument) and fused attention kernels.
_GEMMS = {"mm": 0, "bmm": 0, "addmm": 1, "baddbmm": 1}


_ATTENTION = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_backward": "flash",
    # what the probe routes scaled_dot_product_attention to on meta (a flash kernel on a GPU)
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "flash",
    "_scaled_dot_product_cudnn_attention": "flash",
    "_scaled_dot_product_cudnn_attention_backward": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_efficient_attention_backward": "efficient",
}


# Operators that allocate or reinterpret memory without launching a kernel.
_NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view",
    "detach", "lift_fresh", "alias", "_local_scalar_dense", "set_", "resize_",
}  # fmt: skip


def op_arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if index < len(args) else kwargs.get(name, False)


def tensor_bytes(x: Any) -> int:
    """Bytes of the tensors in ``x`` (a tensor, or a flat list or tuple of arguments)."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    n = 0
    if isinstance(x, (tuple, list)):
        for t in x:
            if isinstance(t, torch.Tensor):
                n += t.numel() * t.element_size()
            elif isinstance(t, (tuple, list)):
                n += sum(u.numel() * u.element_size() for u in t if isinstance(u, torch.Tensor))
    return n


def op_tensors(x: Any) -> list[torch.Tensor]:
    """The tensors in ``x``, an operator's arguments or outputs (a tensor, or tuples, lists
    and dicts of tensors and other values, nested), in the order ``tree_leaves`` gives them:
    the same walk without pytree's type lookups, which cost more than the operator on meta."""
    if isinstance(x, torch.Tensor):
        return [x]
    found: list[torch.Tensor] = []
    _collect_tensors(x, found)
    return found


def _collect_tensors(x: Any, found: list[torch.Tensor]) -> None:
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (tuple, list)) else ()
    for item in items:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list, dict)):
            _collect_tensors(item, found)


def output_shapes(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.shape
    if isinstance(out, (tuple, list)):
        return type(out)(t.shape if isinstance(t, torch.Tensor) else t for t in out)
    return out
