"""What the trace measured for the memory and time model (:mod:`fsdpviz.cost`).

A prediction's :class:`~fsdpviz.schema.report.Report` carries a
:class:`TraceProfile` in ``report.profile``: per iteration, the sequence of FSDP
hook calls the trace saw and, for the compute *before* each hook, the FLOPs,
the bytes of activations saved for backward, other live tensors and the
unsharded gradients produced. Each event of ``report.iterations[i]`` points at
the hook call that issued it, so memory and time can be stepped event by event
without running the model again.

Schema of :meth:`TraceProfile.to_dict` (``report.to_dict()["profile"]``):

``iterations``
    One entry per entry of ``report.iterations``, each with ``hooks`` (list of
    ``[hook, unit, arg]``: ``hook`` one of ``pre_forward`` | ``post_forward`` |
    ``pre_backward`` | ``post_backward`` | ``post_backward_reshard_only`` |
    ``final_callback``, ``arg`` what the runtime state machine was called with, so
    the schedule can be replayed for other settings by :mod:`fsdpviz.replan.hook_replay`),
    ``event_hook`` (per event: index into ``hooks``) and arrays of length
    ``len(hooks) + 1`` (entry ``k`` is the compute before hook ``k``; the last
    entry is the compute after the last hook): ``flops_forward``,
    ``flops_backward`` (FLOPs counted in that stretch; backward includes
    activation-checkpoint recomputation), ``activations`` (bytes of live tensors
    saved for backward when hook ``k`` ran, recomputed ones included),
    ``forward_temp`` / ``backward_temp`` (bytes of other live tensors the
    forward created, such as the model output, or the backward created, such as
    gradients of activations; parameter gradients excluded), ``peak`` (the most
    ``activations + temp + new gradients`` reached in that stretch),
    ``peak_activations`` / ``peak_forward_temp`` / ``peak_grads`` (their share at
    that moment; the rest is backward temp), ``grads`` (``{unit: bytes}`` of unsharded parameter
    gradients created in that stretch) and ``peak_in_place`` (``[peak, activations,
    forward_temp]``: the most ``activations + temp`` reached with new gradients left out,
    what the stretch reaches when each gradient is added into one an earlier micro-step left
    and freed, as autograd accumulates under ``no_sync``; absent in reports saved before it
    was measured). ``param_views_freed`` (``{unit: [peak, activations, forward_temp, grads,
    in-place peak, its activations, its forward_temp]}``, where any): the stretch's ``peak``
    and ``peak_in_place`` as they stood when the last tensor the forward saved that views a
    unit's parameters (not a parameter itself: ``mm``'s transposed weight) was freed, so
    what holds the storage they view only until then (FSDP1's copy under ``NO_SHARD`` with
    CPU offload and ``use_orig_params=True``) is placed inside the stretch; absent in
    reports saved before it was measured. A unit run more than once in forward also has an
    entry per forward call ``k``, keyed ``"{unit}#{k}"``: for the last call, when its last
    such view was freed; for an earlier one, when the last tensor it saved of the unit's
    parameters (a parameter itself too) was (``SavedParamViews`` in
    ``fsdpviz/trace/probe_records.py``); absent in reports saved before they were measured.
    ``peak_unbuffered`` (``{stretch: [peak, activations, forward_temp]}``, the stretches
    where it differs from ``peak_in_place``): that peak less the gradients of a unit's
    parameters one forward call of the unit made that autograd held until another call's came
    in (``CallGradients`` in ``fsdpviz/trace/probe_records.py``), what FSDP1 under parameter
    mixed precision adds into ``.grad`` at once; absent in reports saved before it was
    measured.
``modules``
    ``{fqn: {"saved_bytes", "flops"}}``: bytes first saved for backward while the
    module was the innermost one running, and forward FLOPs counted while it was
    (children excluded), in the first traced iteration.
``input_bytes`` / ``buffer_bytes``
    Bytes of the model inputs and of the model's buffers.
``flop_ops``
    The operators whose FLOPs are counted (``torch.utils.flop_counter``'s
    formulas: matrix multiplies, attention, convolutions).
``tp_ranks``
    The tensor-parallel degree the bytes were measured for: activations,
    temporaries and gradients are one rank's of a tp group of this size (1: the
    whole model's).
``kernels_tp``
    The tensor-parallel degree the kernels were recorded for: each as one rank of a tp group
    of this size runs it, on its shares of the operands (1: the whole model's kernels, which
    the time model divides among the tp ranks; reports saved before this was recorded).
``tokens``
    Tokens in one traced batch: the elements of the first integer input (token ids,
    ``batch x sequence``), else the first two dimensions of the first input; 0 when
    the inputs hold no tensor.

Each iteration also has ``kernels``: per stretch (the same ``len(hooks) + 1`` entries),
the GPU kernels the operators of that stretch launch, identical ones merged, as lists
ending in ``count, bytes`` (bytes read and written, all of them together):

- ``["gemm", backward, M, N, K, batch, itemsize, count, bytes]``: a matrix multiply
  ``(batch x) M x K @ K x N`` (``mm``, ``addmm``, ``bmm``, ``baddbmm``);
- ``["attn", kernel, backward, B, H, Sq, Skv, D, causal, itemsize, grad, count, bytes]``: a
  fused attention kernel (``kernel`` ``"flash"`` or ``"efficient"``, ``backward`` 0 or 1,
  ``grad`` 1 for the backward kernel, 0 for the forward one, which activation checkpointing
  also runs in backward; eager attention is its matrix multiplies and softmax);
- ``["flops", backward, flops, count, bytes]``: another operator with a FLOP formula
  (convolutions);
- ``["mem", backward, count, bytes]``: every other operator that launches a kernel
  (element-wise, normalisation, softmax, casts, copies, losses), merged per stretch;
  views and allocations launch none.
- ``["fused", backward, eager_count, eager_bytes, count, bytes]``: what ``torch.compile``
  makes of the ``mem`` kernels of the compiled modules (``eager_count`` kernels moving
  ``eager_bytes``, already in the ``mem`` records): ``count`` fused kernels moving ``bytes``
  (see :mod:`fsdpviz.trace.fusion`); the time model reads them only for a compiled job.

A float8 linear's matrix multiplies are ``gemm`` records of ``itemsize`` 1 (the float8 rate),
their casts ``mem`` kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdpviz.schema.serial import Record, by_name, each, key


@dataclass
class StretchMoments:
    """Every moment a stretch's peaks were weighed at, in order (a trace made under
    :func:`fsdpviz.trace.probe_records.recording_moments`; not saved): each
    ``(activations, forward_temp, backward_temp, grads, scales_freed)``, the first the
    stretch's start, ``scales_freed`` the float8 scales freed so far as ``(unit, bytes)``
    pairs, or None while none is. ``peak`` is the first moment with the most
    ``activations + forward_temp + backward_temp + grads``, ``peak_in_place`` the first with
    the most of the first three. ``param_views_at``: by unit, how many moments were weighed
    when ``param_views_freed`` took its snapshot. ``kernels``: every kernel the stretch
    launched, ``(key, count, bytes)`` in order, before the probe merged the identical ones
    (those of ``kernels`` but the ``fused``). ``call_grads``: at each moment, where the
    trace measured ``peak_unbuffered``, the bytes of the gradients one forward call of a unit
    made that autograd held for another call's (``peak_unbuffered`` is the first moment with
    the most of the first three less those)."""

    moments: list[tuple[int, int, int, int, tuple[tuple[str, int], ...] | None]] = field(
        default_factory=list
    )
    call_grads: list[int] = field(default_factory=list)
    param_views_at: dict[str, int] = field(default_factory=dict)
    kernels: list[tuple[tuple[Any, ...], int, float]] = field(default_factory=list)
    # whether torch's partitioner decided what a compiled loss or compiled checkpointed
    # region saves in the stretch (by the bytes of its values: not affine in the batch)
    partitioned: bool = False


def _hook(h: list[Any]) -> tuple[str, str, Any]:
    name, unit, arg = h
    return str(name), str(unit), arg


_INTS = key(read=each(int), write=list)  # flat: copied as they are
_FLOATS = key(read=each(float), write=list)
_BY_UNIT = key(read=each(by_name(each(int))))


@dataclass
class StepProfile(Record):
    """Hook calls of one iteration and the compute measured between them."""

    hooks: list[tuple[str, str, Any]] = field(metadata=key(read=each(_hook)))
    event_hook: list[int] = field(metadata=_INTS)
    flops_forward: list[float] = field(metadata=_FLOATS)
    flops_backward: list[float] = field(metadata=_FLOATS)
    activations: list[int] = field(metadata=_INTS)
    forward_temp: list[int] = field(metadata=_INTS)
    backward_temp: list[int] = field(metadata=_INTS)
    peak: list[int] = field(metadata=_INTS)
    peak_activations: list[int] = field(metadata=_INTS)
    peak_forward_temp: list[int] = field(metadata=_INTS)
    peak_grads: list[int] = field(metadata=_INTS)
    grads: list[dict[str, int]] = field(metadata=key(read=each(by_name(int))))
    kernels: list[list[list[Any]]] = field(
        default_factory=list, metadata=key(read=each(each(list)))
    )
    peak_in_place: list[list[int]] = field(default_factory=list, metadata=key(read=each(each(int))))
    # by unit, the bytes of float8 weights' scales (FSDP2's float8 all-gather) a forward saved
    # that a backward node let go, [before the stretch's peak, by its end] (where any did)
    scales_freed: list[dict[str, list[int]]] = field(default_factory=list, metadata=_BY_UNIT)
    # by unit, the stretch's peak and in-place peak when the last tensor its forward saved
    # that views the unit's parameters was freed (see the module docstring)
    param_views_freed: list[dict[str, list[int]]] = field(default_factory=list, metadata=_BY_UNIT)
    # by stretch, where it differs, ``peak_in_place`` less the gradients of a unit's
    # parameters one forward call of the unit made that autograd held until another call's
    # came in (None: not measured)
    peak_unbuffered: dict[int, list[int]] | None = field(
        default=None,
        metadata=key(
            omit="none",
            write=lambda p: {str(k): list(v) for k, v in p.items()},
            read=lambda p: None if p is None else {int(k): each(int)(v) for k, v in p.items()},
        ),
    )
    # per stretch, its moments where the trace kept them (see StretchMoments; never saved)
    moments: list[StretchMoments | None] = field(
        default_factory=list, compare=False, repr=False, metadata=key(saved=False)
    )
    # per stretch, each checkpointed region's frame let go of in it (with what the region's
    # ``recompute_fn`` holds: its keyword inputs), in order: the stretch's peaks then
    # (``peak``, its activations, forward temp and grads, ``peak_in_place``, then
    # ``peak_unbuffered``: 10 ints), and how many of its moments were weighed before, where
    # it kept them (never saved)
    frames_released: list[list[tuple[tuple[int, ...], int | None]]] = field(
        default_factory=list, compare=False, repr=False, metadata=key(saved=False)
    )


_INT = key(read=int)


@dataclass
class TraceProfile(Record):
    """Activation bytes, FLOPs and hook positions recorded by the trace."""

    iterations: list[StepProfile] = field(metadata=key(read=each(StepProfile.from_dict)))
    modules: dict[str, dict[str, float]] = field(
        default_factory=dict, metadata=key(read=by_name(dict))
    )
    input_bytes: int = field(default=0, metadata=_INT)
    buffer_bytes: int = field(default=0, metadata=_INT)
    flop_ops: list[str] = field(default_factory=list, metadata=key(read=list))
    tokens: int = field(default=0, metadata=_INT)
    tp_ranks: int = field(default=1, metadata=_INT)
    kernels_tp: int = field(default=1, metadata=_INT)
