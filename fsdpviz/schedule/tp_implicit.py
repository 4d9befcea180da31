"""A DTensor a parallel style leaves to DTensor's operators (its declared layouts equal, the
DTensor in another layout: no ``DTensor.redistribute``), for
:class:`~fsdpviz.schedule.tp_emulation.TPEmulation`: where the operators' sharding
propagation is planned exactly (:func:`gathered_by_multiply`) and the warnings where it is
not (:func:`skipped_warning`, :func:`gathered_warning`).
"""

from __future__ import annotations

import math

import torch

from fsdpviz.plan.tensor_parallel import (
    PARTIAL,
    REPLICATE,
    Layout,
    Redistribution,
    TPModule,
    layout_name,
    same_layout,
)
from fsdpviz.schedule.tp_mm_strategy import mm_choice


def gathered_by_multiply(
    t: torch.Tensor,
    r: Redistribution,
    tpm: TPModule,
    known: Layout | None,
    tp: int,
    weight: torch.Tensor | None,
) -> bool:
    """Whether ``ColwiseParallel`` leaves DTensor ``t`` (in ``known``) to its linear's
    multiply in a layout whose sharding propagation fsdpviz plans exactly: sharded on a dim
    between the first and the last with a dim of more than one before it (a
    sequence-sharded activation of a batch of more than one; a dim the tp ranks do not
    divide padded to the first rank's chunk in each all-gather). The linear's ``view`` to 2-D
    makes it ``_StridedShard(0)`` (``view_groups``), which ``mm`` takes replicated: an
    all-gather in forward, the one the style would run, and another of the saved input for
    the weight's gradient in backward, whose input gradient comes back ``Partial()``
    (``TPEmulation._gathered_backward``). A batch of one views it ``Shard(0)``, for which
    ``mm``'s strategies weigh gathering the weight instead (:func:`input_gathered`): planned
    the same where DTensor's choice is that one, else noted (:func:`skipped_warning`)."""
    if (
        known is None or known[0] != "shard" or tpm.base != "ColwiseParallel" or tpm.float8
        or t.dim() < 3 or tp == 1 or r.src != r.dst or same_layout(known, r.src, t.dim())
        or not (t.requires_grad and torch.is_grad_enabled())
    ):  # fmt: skip
        return False
    d = (known[1] or 0) % t.dim()
    if not 0 < d < t.dim() - 1:
        return False
    return math.prod(t.shape[:d]) > 1 or input_gathered(t, weight, tp)


def input_gathered(t: torch.Tensor, weight: torch.Tensor | None, tp: int) -> bool:
    """Whether DTensor's ``mm`` strategies (:func:`~fsdpviz.schedule.tp_mm_strategy.mm_choice`,
    torch's own cost model) move a batch of one's sequence-sharded input ``t`` (viewed 2-D,
    ``Shard(0)``) as :func:`gathered_by_multiply` plans it: forward, the input gathered
    (not the weight), the product ``Shard(1)``; backward, the input's gradient ``Partial()``
    with nothing moved, and the weight's gradient (if it needs one) from the input gathered
    again (not the output's gradient moved by an all-to-all into a ``Partial()`` one)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return False
    rows, (out, features) = math.prod(t.shape[:-1]), weight.shape
    shard0, shard1 = ("shard", 0), ("shard", 1)
    dtype = t.dtype
    forward = mm_choice(((rows, features), shard0), ((features, out), shard1), dtype, tp)
    if forward.inputs != (REPLICATE, shard1):
        return False
    grad_in = mm_choice(((rows, out), shard1), ((out, features), shard0), dtype, tp)
    if grad_in.inputs != (shard1, shard0) or grad_in.output != PARTIAL:
        return False
    if not weight.requires_grad:
        return True
    grad_w = mm_choice(((out, rows), shard0), ((rows, features), shard0), dtype, tp)
    return grad_w.inputs == (shard0, REPLICATE)


def skipped_warning(tpm: TPModule, r: Redistribution, known: Layout) -> str:
    """The warning of a DTensor in ``known`` a style leaves as it is, its declared layouts
    (``r``) the same: DTensor's operators redistribute it, in ways not planned exactly."""
    declared = layout_name(r.src)
    return (
        f"tensor parallelism: {tpm.fqn or 'the root'} ({tpm.style}) takes a DTensor in "
        f"{layout_name(known)} where its input_layouts say {declared}; as they equal "
        f"its desired layout ({declared}), the style does not redistribute it (torch "
        "redistributes only where input_layouts != desired_input_layouts) and DTensor's "
        "operators redistribute it implicitly by their sharding propagation, whose "
        "collectives (the backward's above all) fsdpviz does not plan exactly. Declare "
        f"the layout it arrives in, input_layouts=({layout_name(known)},), so the style "
        "redistributes it explicitly"
    )


def gathered_warning(tpm: TPModule, known: Layout, absorbed: bool) -> str:
    """The warning of a linear whose multiply gathers a DTensor in ``known``
    (:func:`gathered_by_multiply`): its collectives planned, but for a ``Partial()``
    gradient no style's ``Redistribute.backward`` takes back (``absorbed``: one does), and
    its memory not exact."""
    layout = layout_name(known)
    back = "" if absorbed else (
        " DTensor's operators that made the DTensor (no style redistributed it) reduce that "
        "gradient by their own sharding propagation in backward, collectives fsdpviz does "
        "not plan."
    )  # fmt: skip
    return (
        f"tensor parallelism: {tpm.fqn} ({tpm.style}) takes a DTensor in {layout} that its "
        "declared layouts leave to its linear's multiply, which gathers it in forward and "
        "again for the weight's gradient in backward and gives its gradient back Partial() "
        f"(planned).{back} Its memory is not exact: torch saves the multiply's input as a "
        "rank's share (_StridedShard) and gathers it into temporary buffers, fsdpviz holds "
        "it gathered, whole, until backward (more than torch). Declare the layout it arrives "
        f"in, input_layouts=({layout},), so the style gathers it (the same forward "
        "collective), which fsdpviz plans exactly"
    )
