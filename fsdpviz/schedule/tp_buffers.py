"""The buffers DTensor's collectives make on a tp rank, for
:class:`~fsdpviz.schedule.tp_emulation.TPEmulation`: a sharded dim the tp ranks do not
divide padded to chunks as large as the first (:func:`padded_bytes`, :func:`gathered_padded`,
:func:`scattered_padded`), an all-to-all's buffers as a GPU's kernel makes them
(:func:`all_to_all_buffers`), the share a rank holds (:func:`share_of`), when an
all-gather's result is a view of its buffer (:func:`viewable`), each collective reported as
DTensor issues it, after the buffers it makes before (:func:`issuing_buffer`), a row-wise
embedding's masked indices and mask (:func:`masked_ids`), and a reduce-scatter's output saved
by a selective checkpoint's policy (:func:`reduced_output`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import torch

from fsdpviz.plan.tensor_parallel import REPLICATE, Layout, same_layout
from fsdpviz.schedule.tp_flow import Copy
from fsdpviz.schedule.tp_refusals import chunks
from fsdpviz.trace.checkpointing import one_operator, recomputing_selective
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.probe_records import dim_share

Issue = Callable[[], None] | None  # a collective reported as DTensor issues it

# Collectives whose result is a new buffer on each rank (an all-reduce: its functional
# collective reduces a clone of its input, ``_c10d_functional.all_reduce``).
_NEW_BUFFER = {"tp_all_gather", "tp_reduce_scatter", "tp_all_to_all", "tp_all_reduce"}
_REDUCE_SCATTER = torch.ops._c10d_functional.reduce_scatter_tensor.default

__all__ = [
    "all_to_all_buffers",
    "gathered_padded",
    "issuing_buffer",
    "masked_ids",
    "padded_bytes",
    "padded_shape",
    "reduced_output",
    "scattered_padded",
    "share_of",
    "uneven",
    "viewable",
]


def padded_shape(t: torch.Tensor, d: int, tp: int) -> list[int]:
    """``t``'s shape with dim ``d`` padded to ``tp`` chunks as large as the first."""
    padded = list(t.shape)
    padded[d] = chunks(t.shape[d], tp)[0] * tp
    return padded


def viewable(shape: torch.Size, d: int) -> bool:
    """Whether every dim of ``shape`` before ``d`` is 1: chunks along ``d`` are then
    contiguous, and ``_maybe_view_chunk_cat`` views an all-gather's dim-0 result as
    gathered along ``d`` instead of copying it (``torch/_utils.py``)."""
    return math.prod(shape[:d]) == 1


def share_of(t: torch.Tensor, layout: Layout, tp: int) -> Fraction | None:
    """The share one rank of ``tp`` holds of ``t`` (its global shape) in ``layout``, or None
    (whole)."""
    if layout[0] != "shard" or t.dim() == 0:
        return None
    return dim_share(t.shape[(layout[1] or 0) % t.dim()], tp)


def uneven(t: torch.Tensor, layout: Layout, tp: int) -> bool:
    """Whether ``t`` (its global shape) in ``layout`` is sharded on a dim the tp ranks do
    not divide."""
    if layout[0] != "shard" or t.dim() == 0:
        return False
    return t.shape[(layout[1] or 0) % t.dim()] % tp != 0


def gathered_padded(probe: CostProbe, t: torch.Tensor, src: Layout, tp: int) -> torch.Tensor:
    """The all-gather of ``t``, sharded in ``src`` on a dim the tp ranks do not divide,
    as ``Shard._to_replicate_tensor`` makes it: every rank's chunk padded to the first's
    (the first rank's needs none), gathered on dim 0 into a buffer of the padded size
    (``all_gather_single``), on another dim its chunks put in place by ``torch.cat``
    into a second such buffer, then unpadded (``_maybe_unpad_tensor``: ``narrow``, then
    ``contiguous()``, a copy of the whole tensor beside the padded one where the dim is
    not 0, a view of the gathered buffer, held whole, where it is)."""
    d = (src[1] or 0) % t.dim()
    n = t.shape[d]
    padded = padded_shape(t, d, tp)
    with probe.redistributed(None):
        gathered = t.new_empty(padded)
        if d == 0:
            return gathered.narrow(0, 0, n)
        if viewable(t.shape, d):  # _maybe_view_chunk_cat: a view of the gathered buffer
            return gathered.narrow(d, 0, n).contiguous()
        placed = t.new_empty(padded)  # torch.cat of the gathered chunks along d
        del gathered
        return placed.narrow(d, 0, n).contiguous()


def scattered_padded(
    probe: CostProbe, t: torch.Tensor, dst: Layout, tp: int, issue: Issue = None
) -> torch.Tensor:
    """The reduce-scatter of ``t`` onto ``dst``, sharded on a dim the tp ranks do not
    divide, as ``Shard._reduce_shard_tensor`` makes it: ``_split_tensor`` chunks it,
    pads the short chunks to the first's and makes the others contiguous (copies where
    dims before the sharded one are not all 1), a list it holds until it returns;
    ``torch.cat`` of them into a padded buffer; on another dim than 0,
    ``reduce_scatter_single``'s ``_chunk_or_narrow_cat`` copies that into a second one;
    then the first rank's chunk, which needs no unpadding, is the collective's output."""
    d = (dst[1] or 0) % t.dim()
    parts = chunks(t.shape[d], tp)
    first = parts[0]
    padded = padded_shape(t, d, tp)
    contiguous = viewable(t.shape, d) and t.is_contiguous()
    held = []
    with probe.redistributed(None):
        for size in parts:
            if size < first or not contiguous:  # padded (a new tensor) or made contiguous
                held.append(t.new_empty([*t.shape[:d], first, *t.shape[d + 1 :]]))
        held.append(t.new_empty(padded))  # torch.cat(scattered_list, dim=d)
        if issue is not None:  # (the functional collective called)
            issue()
        if d != 0:
            held.append(t.new_empty(padded))  # _chunk_or_narrow_cat onto dim 0
    with probe.redistributed(share_of(t, dst, tp)):
        return reduced_output(t.clone)


def padded_bytes(
    nbytes: int, shape: torch.Size, kind: str, src: Layout, dst: Layout, tp: int
) -> int:
    """The bytes collective ``kind`` from ``src`` to ``dst`` moves of a tensor of
    ``nbytes`` and ``shape``: DTensor pads a sharded dim the tp ranks do not divide to
    the next multiple first, so every rank's chunk is as large as the first: an
    all-gather's source dim (``Shard._to_replicate_tensor``), a reduce-scatter's
    destination dim (``Shard._reduce_shard_tensor``), both dims of an all-to-all
    (``Shard._pad_for_new_shard_dim``: a sequence of 30 going from ``Shard(1)`` to
    ``Shard(2)`` over 4 ranks moves 32 rows)."""
    padded = {
        "tp_all_gather": (src,),
        "tp_reduce_scatter": (dst,),
        "tp_all_to_all": (src, dst),
    }.get(kind, ())
    if not shape or nbytes == 0:
        return nbytes
    whole = list(shape)
    for layout in padded:
        if layout[0] == "shard":
            d = (layout[1] or 0) % len(shape)
            whole[d] = -(-whole[d] // tp) * tp
    numel = math.prod(shape)
    return nbytes if numel == 0 else nbytes // numel * math.prod(whole)


def all_to_all_buffers(
    probe: CostProbe,
    t: torch.Tensor,
    src: Layout,
    dst: Layout,
    tp: int,
    issue: Issue = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """The all-to-all of ``t`` from ``Shard(g)`` to ``Shard(s)`` as DTensor makes it on a
    GPU (``Shard._to_new_shard_dim``; the CPU's fallback gathers instead), on the first
    rank, whose chunks are as large as any: a dim ``s`` the tp ranks do not divide padded
    to chunks as large as the first (``_pad_for_new_shard_dim``: a copy); then the kernel of
    ``_dtensor::shard_dim_alltoall`` (``Functional.cpp``): the rank's tensor viewed with
    ``s`` split into the ranks' chunks, those moved to the front and made contiguous (a copy
    unless every dim before ``s`` is 1), a receiving buffer as large (``empty_like``), that
    moved back along ``g`` and made contiguous (a copy unless every dim before ``g`` is 1,
    ``s`` counted as a chunk), viewed as the result; a dim ``g`` the tp ranks do not divide
    comes back padded, cut to its size by a ``narrow`` (``_unpad_for_new_shard_dim``): a
    view, the padded buffer held. Each buffer holds ``g`` gathered (padded) and a chunk of
    ``s``; the kernel holds its three until it returns, the padded copy until the
    redistribution returns, the result alone after: at a batch of one either the send or
    the result is a view, so two buffers, three at a larger batch. A rank's tensor that is
    not ``contiguous`` (a transpose) and whose ``s`` needs no padding is copied contiguous
    first (the same function), held as the padded copy is: the first rank's chunk of ``g``
    is never padded, so it is copied where the tp ranks do not divide ``g`` too (a
    transposed gradient of 254 features over 4 ranks: 64 of them, contiguous)."""
    g, s = (src[1] or 0) % t.dim(), (dst[1] or 0) % t.dim()
    chunk_g, chunk_s = chunks(t.shape[g], tp)[0], chunks(t.shape[s], tp)[0]
    local = list(t.shape)  # the first rank's tensor as the kernel takes it
    local[g], local[s] = chunk_g, chunk_s * tp
    moved = list(local)
    moved[s] = chunk_s
    gathered = list(t.shape)  # a buffer's shape, global: a chunk of s is a rank's share
    gathered[g] = chunk_g * tp
    with probe.redistributed(share_of(t, dst, tp)):
        # the padded copy, or the contiguous one (the first rank's chunk of g: never padded)
        padded = t.new_empty(gathered) if chunk_s * tp != t.shape[s] or not contiguous else None
        if issue is not None:  # (the kernel called)
            issue()
        sent = t.new_empty(gathered) if math.prod(local[:s]) > 1 else None
        received = t.new_empty(gathered)
        out = received.clone() if math.prod(moved[:g]) > 1 else received
    del padded, sent, received
    return out.narrow(g, 0, t.shape[g]) if chunk_g * tp != t.shape[g] else out


def collective_buffer(
    probe: CostProbe | None,
    collective: str | None,
    src: Layout,
    dst: Layout,
    ndim: int,
    tp: int,
    issue: Issue = None,
) -> Copy:
    """A function making the new buffer of ``collective`` from ``src`` to ``dst`` on a tp
    group of ``tp`` ranks, or None. It calls ``issue`` (the collective reported) as DTensor
    issues it: after what DTensor makes before it (a dim the tp ranks do not divide padded:
    a reduce-scatter's padded chunks and their ``torch.cat``, an all-to-all's padded copy),
    before the rest.

    Collectives run on dimension 0: an all-gather along another dimension gathers into a
    whole buffer first and copies it into place, a reduce-scatter along another dimension
    copies its input into a whole buffer first; a rank briefly holds both. But for an
    all-gather whose dims before the gathered one are all 1 (a batch of one gathered on
    the sequence): ``all_gather_single``'s ``_maybe_view_chunk_cat`` views the gathered
    buffer in place then.
    """
    if probe is None or collective not in _NEW_BUFFER:
        return None
    moved = src if collective == "tp_all_gather" else dst
    rearranged = (
        collective in ("tp_all_gather", "tp_reduce_scatter")
        and moved[0] == "shard"
        and (moved[1] or 0) % ndim != 0
    )

    def make(t: torch.Tensor) -> torch.Tensor:
        if collective == "tp_all_to_all":
            return all_to_all_buffers(probe, t, src, dst, tp, issue)
        if collective == "tp_reduce_scatter" and uneven(t, dst, tp):
            return scattered_padded(probe, t, dst, tp, issue)
        if issue is not None:  # (the first rank's chunk is never padded before it)
            issue()
        if collective == "tp_all_gather" and uneven(t, src, tp):
            return gathered_padded(probe, t, src, tp)
        copied = rearranged and not (
            collective == "tp_all_gather" and viewable(t.shape, (src[1] or 0) % t.dim())
        )
        with probe.redistributed(None):
            whole = t.clone() if copied else t
        with probe.redistributed(share_of(t, dst, tp)):
            return (
                reduced_output(whole.clone) if collective == "tp_reduce_scatter" else whole.clone()
            )

    return make


def reduced_output(make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A reduce-scatter's output, which ``make`` makes: under a selective checkpoint whose
    policy saves ``_c10d_functional.reduce_scatter_tensor`` (torchtitan's does), saved in
    forward and taken back in the recomputation, which makes none (what DTensor makes
    before the collective it makes again)."""
    with one_operator(_REDUCE_SCATTER) as saved:
        if saved is not None and recomputing_selective():
            return saved.pop(0)[0]
        out = make()
        if saved is not None:
            saved.append((out.detach(),))
        return out


def issuing_buffer(
    probe: CostProbe | None,
    collective: str | None,
    src: Layout,
    dst: Layout,
    ndim: int,
    tp: int,
    issue: Issue,
) -> Copy:
    """:func:`collective_buffer`, which calls ``issue`` as it makes the buffer, or None,
    ``issue`` called now (it makes none)."""
    made = collective_buffer(probe, collective, src, dst, ndim, tp, issue)
    if made is None and issue is not None:
        issue()
    return made


def in_float8(probe: CostProbe | None, copy: Copy, float8: bool) -> Copy:
    """``copy`` making its buffer of float8 data (one byte an element) when ``float8``."""
    if copy is None or not float8 or probe is None:
        return copy

    def make(t: torch.Tensor) -> torch.Tensor:
        with probe.made_in_float8():
            out: torch.Tensor = copy(t)
        probe.float8_scale(out)
        return out

    return make


def chunk_buffer(probe: CostProbe | None, src: Layout, dst: Layout, ndim: int, tp: int) -> Copy:
    """A function making a rank's chunk of a replicated tensor going to ``Shard``, or
    None: DTensor's ``Shard._replicate_to_shard`` moves nothing but clones the chunk
    (``_select_split_tensor(..., clone=True)``), a new buffer of a share (as the
    gradient of ``ColwiseParallel(output_layouts=Replicate())``'s output goes back to
    ``Shard(-1)``)."""
    if probe is None or src != REPLICATE or dst[0] != "shard" or same_layout(src, dst, ndim):
        return None

    def make(t: torch.Tensor) -> torch.Tensor:
        share = share_of(t, dst, tp)
        with probe.held_as(share if share is not None else False):
            return t.clone()

    return make


def masked_ids(probe: CostProbe | None, ids: Any, tp: int) -> list[torch.Tensor]:
    """What a row-wise embedding (weight ``Shard(0)``) makes of its replicated indices
    ``ids`` before its lookup, held by the caller: the indices moved to the rank's rows and
    their mask. DTensor's strategy takes the indices as ``_MaskPartial``
    (``_MaskPartial._partition_value``, ``_mask_tensor``): two comparisons and their ``|``,
    the mask, kept in the placement's ``MaskBuffer``; a clone less the offset, the masked
    indices (their out-of-range ones set in place), which the lookup takes and its dispatch
    lets go of once it has run; the mask until the output's redistribution applies it and
    releases it, before its collective (``_reduce_value``, ``_reduce_shard_value``). One
    rank holds all of them; the probe counts their bytes, not their kernels."""
    if probe is None or tp == 1 or not isinstance(ids, torch.Tensor):
        return []
    with probe.redistributed(None):
        below = ids.new_empty(ids.shape, dtype=torch.bool)
        above = below.new_empty(ids.shape)
        mask = below.new_empty(ids.shape)  # their |
        del below, above
        copy = ids.clone()
        masked = ids.clone()  # the copy less the offset
        del copy
    return [masked, mask]
