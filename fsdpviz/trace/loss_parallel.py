"""Cross-entropy under ``torch.distributed.tensor.parallel.loss_parallel()`` on fsdpviz's copy.

Logits one rank holds a 1/tp share of along the vocabulary (a ``ColwiseParallel`` output
left a DTensor ``Shard(-1)``, ``use_local_output=False``) reach ``F.cross_entropy`` inside
``loss_parallel()``, where DTensor's custom handlers (``torch/distributed/tensor/parallel/
loss.py``'s ``customized_loss_ops``) replace aten's kernels: ``_log_softmax`` upcasts the
shard, makes the shifted logits and their exponent beside its result (all-reducing the
maxima and the sums); ``_nll_loss_forward`` masks the labels to the shard and all-reduces
the picked logits; the backward of ``nll_loss`` makes the gradient of ``log_softmax`` too
(``_nll_loss_and_log_softmax_backward``: the one-hot, the result's exponent, their sum and
its product by the loss's gradient, the saved result still held), and
``_log_softmax_backward_data`` passes it through. :func:`run` runs the same operators, in
the same order, on the traced tensors, so the probe counts what a rank holds: the shard's
tensors a share, the per-token ones (the maxima, the sums, the labels' masks, each
all-reduce's new buffer) whole. The all-reduces cost no kernel (as the tp collectives the
probe sees); each is told to the probe (``CostProbe.on_all_reduce``), whose plan reports it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from fsdpviz.errors import ConfigError
from fsdpviz.trace.probe_records import StorageSet, TPShares, storage_of

aten = torch.ops.aten

Held = Callable[[bool], AbstractContextManager[None]]  # the probe's: made tensors as shares?
# the probe's: an all-reduce of the tensor given, its result a whole new buffer
Collective = Callable[[torch.Tensor], AbstractContextManager[None]]

_IGNORE_MEAN, _SUM = 1, 2  # torch's Reduction: NONE 0, MEAN 1, SUM 2


def handled(func: Any) -> bool:
    """Whether ``loss_parallel()`` replaces operator ``func`` for a DTensor."""
    return func in (
        aten._log_softmax.default,
        aten._log_softmax_backward_data.default,
        aten.nll_loss_forward.default,
        aten.nll_loss_backward.default,
    )


class LossParallelAccounting:
    """What the probe does for ``loss_parallel()``'s operators: which it runs as their
    handlers would (:meth:`takes`), and the logits those made (a DTensor, as their input)."""

    def __init__(self) -> None:
        self._made = StorageSet()

    def takes(
        self,
        func: Any,
        args: tuple[Any, ...],
        backward: bool,
        is_share: Callable[[Any], bool],
        tp: TPShares,
        in_module: bool,
    ) -> bool:
        """Whether ``func`` is one ``loss_parallel()`` replaces, on logits one rank holds a
        share of along the vocabulary: in forward, in the loss (no module running), the
        share a DTensor (``use_local_output=False``); in backward, the result a handler made
        in forward (a plain tensor's ``log_softmax`` takes aten's backward: under a tp group
        of one rank a replicated output is the share itself, no collective making it whole)."""
        if not handled(func):
            return False
        backward_op = func in (
            aten.nll_loss_backward.default,
            aten._log_softmax_backward_data.default,
        )
        x = args[1] if backward_op else args[0]  # (the saved result, for the latter)
        if not is_share(x):
            return False
        if backward:
            return storage_of(x) in self._made
        return not in_module and (tp.is_dtensor(x) or storage_of(x) in self._made)

    def run(self, func: Any, args: tuple[Any, ...], held: Held, collective: Collective) -> Any:
        """:func:`run`, remembering what it made."""
        out = run(func, args, held, collective)
        if isinstance(out, torch.Tensor) and (st := storage_of(out)) is not None:
            self._made.add(st)  # a DTensor, as the handler's input was
        return out


def run(func: Any, args: tuple[Any, ...], held: Held, collective: Collective) -> Any:
    """What ``loss_parallel()``'s handler of ``func`` returns, made by traced operators."""
    if func is aten._log_softmax.default:
        x, dim, half_to_float = args
        return _log_softmax(x, dim, half_to_float, held, collective)
    if func is aten._log_softmax_backward_data.default:
        grad, _, _, input_dtype = args
        with held(True):
            return _to(grad, input_dtype) if grad.dtype != input_dtype else aten.alias(grad)
    if func is aten.nll_loss_forward.default:
        return _nll_loss_forward(*args, held=held, collective=collective)
    return _nll_loss_and_log_softmax_backward(*args, held=held)


def _to(
    t: torch.Tensor, dtype: torch.dtype, memory_format: torch.memory_format | None = None
) -> torch.Tensor:
    """``t.to(dtype, memory_format=...)``: ``t`` itself where nothing changes, else a copy (the
    copy's own operator: ``aten.to`` inside a dispatch mode may alias its input)."""
    if t.dtype == dtype and (memory_format is None or t.is_contiguous(memory_format=memory_format)):
        return t
    out: torch.Tensor = aten._to_copy(t, dtype=dtype, memory_format=memory_format)
    return out


def _log_softmax(
    x: torch.Tensor, dim: int, half_to_float: bool, held: Held, collective: Collective
) -> torch.Tensor:
    """torch's ``_log_softmax`` (loss.py), its all-reduces a new buffer each."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    computation_dtype, result_dtype = elementwise_dtypes(
        x, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    )
    with held(True):
        x = _to(x, computation_dtype, torch.contiguous_format)
    with held(False):
        x_max = torch.amax(x, dim, keepdim=True)
    with collective(x_max):
        x_max = x_max.clone()
    with held(True):
        shifted = x - x_max
        exp = torch.exp(shifted)
    with held(False):
        shifted_sumexp = torch.sum(exp, dim, keepdim=True)
    del exp
    with collective(shifted_sumexp):
        shifted_sumexp = shifted_sumexp.clone()
    with held(False):
        shifted_logsumexp = torch.log(shifted_sumexp)
    with held(True):
        result = shifted - shifted_logsumexp
        if not half_to_float:
            result = _to(result, result_dtype)
    return result


def _nll_loss_forward(
    x: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    reduction: int,
    ignore_index: int,
    *,
    held: Held,
    collective: Collective,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's ``_nll_loss_forward`` (loss.py) without a class weight, on rank 0's shard
    (whose classes start at 0)."""
    if weight is not None:
        raise _weighted()
    channel_dim = 1 if x.dim() > 1 else 0
    with held(False):
        safe_target = torch.where(target != ignore_index, target, 0)
        safe_target_ = safe_target.unsqueeze(channel_dim)
        mask, masked = _mask(safe_target_, x.shape[channel_dim])
        result_partial = torch.gather(x, channel_dim, masked)
        result_partial.masked_fill_(mask, 0.0)  # apply_mask; the mask is then released
        del mask
    with collective(result_partial):  # _MaskPartial._reduce_value
        result_reduced = result_partial.clone()
    with held(False):
        result = -result_reduced.squeeze(channel_dim)
        result = torch.where(target != ignore_index, result, 0)
        if reduction == 0 and x.dim() > 1:
            return result, x.new_full((), 0.0)
        total_weight = _to((target != ignore_index).sum(), x.dtype)
        if reduction == _SUM:
            result = result.sum()
        elif reduction == _IGNORE_MEAN:
            result = result.sum() / total_weight
    return result, total_weight


def _weighted() -> ConfigError:
    return ConfigError(
        "fsdpviz cannot trace a cross-entropy with a class weight on logits left sharded over "
        "the vocabulary (loss_parallel()): drop the weight, or keep the output projection's "
        "logits local (use_local_output=True) or replicated (output_layouts=Replicate())"
    )


def _mask(tensor: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_MaskPartial._mask_tensor`` for rank 0's shard (offset 0, ``size`` classes)."""
    mask = (tensor < 0) | (tensor >= size)
    masked = tensor.clone() - 0
    masked.masked_fill_(mask, 0)
    return mask, masked


def _nll_loss_and_log_softmax_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    reduction: int,
    ignore_index: int,
    total_weight: torch.Tensor,
    *,
    held: Held,
) -> torch.Tensor:
    """torch's ``_nll_loss_and_log_softmax_backward`` (loss.py) without a class weight."""
    if weight is not None:
        raise _weighted()
    channel_dim = 0 if x.dim() < 2 else 1
    with held(False):
        if reduction == _IGNORE_MEAN:
            grad_output = grad_output / total_weight
        target = target.unsqueeze(channel_dim)
        safe_target = torch.where(target != ignore_index, target, 0)
    with held(True):
        grad_input = torch.zeros_like(x)
    with held(False):
        safe_target = safe_target.squeeze(channel_dim).flatten()
        mask, masked_safe_target = _mask(safe_target, x.shape[channel_dim])
        grad_update = mask.to(grad_input.dtype) - 1.0
        arange_1d = torch.arange(masked_safe_target.shape[0], device=masked_safe_target.device)
    with held(True):
        if x.dim() == 1:
            grad_input[masked_safe_target] = grad_update
        elif x.dim() == 2:
            grad_input[arange_1d, masked_safe_target] = grad_update
        else:
            grad_input_t = grad_input.transpose(channel_dim, -1)
            shape = grad_input_t.shape
            grad_input_2d = grad_input_t.reshape(-1, x.shape[channel_dim])
            grad_input_2d[arange_1d, masked_safe_target] = grad_update
            grad_input = grad_input_2d.view(shape).transpose(channel_dim, -1)
    with held(False):
        if grad_input.dim() > grad_output.dim() > 0:
            grad_output = grad_output.unsqueeze(channel_dim)
        grad_output = torch.where(target != ignore_index, grad_output, 0)
    with held(True):
        return (grad_input + torch.exp(x)) * grad_output
