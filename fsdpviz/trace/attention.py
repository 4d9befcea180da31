"""Fused attention on the meta device, so the trace saves what a GPU kernel saves.

On the meta device ``F.scaled_dot_product_attention`` runs its *math*
decomposition: it materialises and saves the ``seq x seq`` attention matrix per
head, which flash / memory-efficient attention on a GPU (and the flash kernel
PyTorch uses on a CPU) never keep. While the cost probe measures a step,
:func:`fused_attention` routes such calls on meta tensors to
``aten._scaled_dot_product_flash_attention_for_cpu`` (it has meta kernels and an
autograd formula), which saves query, key, value, output and the per-row
log-sum-exp, like the GPU kernels (grouped-query attention included, without
copying key and value per head). Where the value head size differs from the
query's (DeepSeek's multi-head latent attention: 128 against 192), which flash
kernels refuse, a GPU runs the memory-efficient kernel: such calls go to
``aten._scaled_dot_product_efficient_attention``, whose meta kernel gives the
output the value's head size and saves the same kinds of tensors; so do calls whose mask
needs a gradient (a learned bias added to it, as Swin's relative positions), which a GPU
also runs there (its backward gives the mask's gradient, flash's gives none). Calls with
dropout, or not on meta, are left alone, and so is grouped-query attention with
such a value (the GPU falls back to the math path there too). The fused op takes
the place of the decomposition's nodes in the autograd graph with the same inputs
and outputs, so the order of FSDP's hooks does not change (the conformance suite
checks it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

_SDPA = F.scaled_dot_product_attention
_FUSED = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_FUSED_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_EFFICIENT = torch.ops.aten._scaled_dot_product_efficient_attention.default


@functools.cache
def _fused_takes_gqa() -> bool:
    """Whether the fused kernel's backward gives key and value gradients of their own head
    count under grouped-query attention (torch < 2.9's meta kernel gives the query's)."""
    q = torch.empty(1, 2, 1, 1, device="meta")
    kv = torch.empty(1, 1, 1, 1, device="meta")
    out, lse = _FUSED(q, kv, kv, 0.0, False)
    grads = _FUSED_BACKWARD(out, q, kv, kv, out, lse, 0.0, False)
    return tuple(grads[1].shape) == tuple(kv.shape)


class _GroupedFused(torch.autograd.Function):
    """The fused kernel under grouped-query attention where torch's autograd formula for it
    gives key and value gradients of the query's head count: the same saved tensors, each
    key/value gradient summed over the query heads that share it."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> torch.Tensor:
        query, key, value, attn_mask, is_causal, scale = args
        out, lse = _FUSED(query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.attn_mask, ctx.is_causal, ctx.scale = attn_mask, is_causal, scale
        result: torch.Tensor = out
        return result

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        query, key, value, out, lse = ctx.saved_tensors
        gq, gk, gv = _FUSED_BACKWARD(
            grads[0], query, key, value, out, lse, 0.0, ctx.is_causal,
            attn_mask=ctx.attn_mask, scale=ctx.scale,
        )  # fmt: skip
        heads = key.shape[1]
        if gk.shape[1] != heads:
            gk = gk.unflatten(1, (heads, -1)).sum(2)
            gv = gv.unflatten(1, (heads, -1)).sum(2)
        return gq, gk, gv, None, None, None


def _fused(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    if dropout_p != 0.0 or query.device.type != "meta" or query.dim() != 4:
        return None
    if key.dim() != 4 or value.dim() != 4:
        return None
    if key.shape[1] != query.shape[1] and not enable_gqa:
        return None  # torch raises its own error for this
    other_value_size = value.shape[-1] != query.shape[-1]
    if other_value_size and key.shape[1] != query.shape[1]:
        return None  # no fused kernel takes both: the GPU runs the math path
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
            attn_mask.logical_not(), float("-inf")
        )
    learned = attn_mask is not None and attn_mask.requires_grad
    if other_value_size or learned:  # flash takes no mask gradient: a GPU runs this kernel
        grad = query.requires_grad or key.requires_grad or value.requires_grad or learned
        out = _EFFICIENT(query, key, value, attn_mask, grad, 0.0, is_causal, scale=scale)[0]
    elif key.shape[1] != query.shape[1] and not _fused_takes_gqa():
        out = _GroupedFused.apply(query, key, value, attn_mask, is_causal, scale)  # type: ignore[no-untyped-call]
    else:
        out, _ = _FUSED(query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
    result: torch.Tensor = out
    return result


Ring = Callable[..., "torch.Tensor | None"]
_RINGS: list[Ring] = []  # ring_attention's, innermost last
_FUSING = [0]  # fused_attention's depth


def _sdpa(*args: Any, **kwargs: Any) -> torch.Tensor:
    if _RINGS:
        out = _RINGS[-1](*args, **kwargs)
        if out is not None:
            return out
    if _FUSING[0]:
        out = _fused(*args, **kwargs)
        if out is not None:
            return out
    return _SDPA(*args, **kwargs)


def _route() -> None:
    F.scaled_dot_product_attention = _sdpa if _RINGS or _FUSING[0] else _SDPA


@contextmanager
def fused_attention() -> Iterator[None]:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` to the fused kernel.

    The function is replaced on ``torch.nn.functional`` for the duration (a torch
    function mode would not see the recomputation activation checkpointing runs
    inside backward, which must take the same path as the forward). What the installed
    torch's kernel does under grouped-query attention is asked first, before the trace's
    dispatch mode is on: its probe is not the model's compute.
    """
    _fused_takes_gqa()
    _FUSING[0] += 1
    _route()
    try:
        yield
    finally:
        _FUSING[0] -= 1
        _route()


@contextmanager
def ring_attention(ring: Ring) -> Iterator[None]:
    """Route ``scaled_dot_product_attention`` to ``ring`` (context parallelism's ring
    attention, :mod:`fsdpviz.schedule.cp_emulation`) for the duration, measured or not; a
    call ``ring`` returns None for takes the usual path."""
    _RINGS.append(ring)
    _route()
    try:
        yield
    finally:
        _RINGS.remove(ring)
        _route()


def flash_block(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused attention kernel on meta tensors: its output and log-sum-exp (float32,
    ``(batch, heads, sequence)``), as a flash kernel gives them."""
    out, lse = _FUSED(query, key, value, 0.0, causal, scale=scale)
    return out, lse


def flash_block_backward(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernel of :func:`flash_block`: the gradients of query, key and value
    (under grouped-query attention, key and value's of their own head count, as the CUDA
    kernel gives them; torch < 2.9's meta kernel gives the query's)."""
    dq, dk, dv = _FUSED_BACKWARD(grad, query, key, value, out, lse, 0.0, causal, scale=scale)
    heads = key.shape[1]
    if dk.shape[1] != heads:
        dk = dk.unflatten(1, (heads, -1)).sum(2)
        dv = dv.unflatten(1, (heads, -1)).sum(2)
    return dq, dk, dv


# FLOP formulas of the fused kernel: those of the CUDA flash kernel (same arguments first).
FUSED_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: (
        torch.ops.aten._scaled_dot_product_flash_attention
    ),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        torch.ops.aten._scaled_dot_product_flash_attention_backward
    ),
}
