"""A DTensor a parallel style leaves to DTensor's operators (its declared layouts equal, the
DTensor in another layout: no ``DTensor.redistribute``), for
:class:`~fsdpviz.schedule.tp_emulation.TPEmulation`: where the operators' sharding
propagation is planned exactly (:func:`gathered_by_multiply`; :func:`batch_one_multiply`, a
batch of one's, by the strategies DTensor's cost model picks) and the warnings where it is
not (:func:`skipped_warning`, :func:`gathered_warning`, :func:`partial_grad_warning`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.tensor_parallel import (
    PARTIAL,
    REPLICATE,
    Layout,
    Redistribution,
    TPModule,
    layout_name,
    same_layout,
)
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime
from fsdpviz.schedule.tp_buffers import all_to_all_buffers, collective_buffer, padded_bytes
from fsdpviz.schedule.tp_flow import GradCollective
from fsdpviz.schedule.tp_mm_strategy import GPUS_PER_NODE, mm_choice, topology_dependent
from fsdpviz.schema.config import costed_within_node
from fsdpviz.schema.report import FsdpWarning
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.probe_records import dim_share


def gathered_by_multiply(
    t: torch.Tensor, r: Redistribution, tpm: TPModule, known: Layout | None, tp: int
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
    ``mm``'s strategies weigh gathering the weight instead (:func:`batch_one_multiply`)."""
    if (
        known is None or known[0] != "shard" or tpm.base != "ColwiseParallel" or tpm.float8
        or t.dim() < 3 or tp == 1 or r.src != r.dst or same_layout(known, r.src, t.dim())
        or not (t.requires_grad and torch.is_grad_enabled())
    ):  # fmt: skip
        return False
    d = (known[1] or 0) % t.dim()
    return 0 < d < t.dim() - 1 and math.prod(t.shape[:d]) > 1


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


def implicit_warnings(found: dict[tuple[str, int | str], str]) -> list[FsdpWarning]:
    """The warnings of the inputs styles left to DTensor's operators, by (module, what)."""
    codes = {"topology": "tp_topology_assumed"}
    return [FsdpWarning(codes.get(str(k[1]), "tp_implicit_redistribution"), t)
            for k, t in found.items()]  # fmt: skip


def topology_warning(tpm: TPModule, tp: int) -> str:
    """The warning of a batch of one's multiply whose ``mm`` strategies depend on the tp
    group's topology as torch costs it (:mod:`fsdpviz.schedule.tp_mm_strategy`), planned
    for nodes of :data:`GPUS_PER_NODE` as ``analyze`` named no machine."""
    within = costed_within_node(tp, GPUS_PER_NODE)
    where, other = ("within one node", "across nodes") if within else ("across nodes", "within one")
    return (
        f"tensor parallelism: the multiplies of {tpm.fqn} ({tpm.style}) are planned as "
        f"DTensor's mm strategies pick them for a tp group of {tp} costed {where} (torch's "
        "redistribute_cost: intra-host while tp <= num_devices_per_host, i.e. "
        f"torch.cuda.device_count()), on nodes of {GPUS_PER_NODE} GPUs each visible to "
        "every rank, as torchtitan's jobs run, since analyze was given no machine. Costed "
        f"{other} DTensor picks other strategies, with other collectives: pass "
        "analyze(..., machine=...) with your nodes' gpus_per_node to plan for them"
    )


_UNREDUCED = (
    "DTensor's operators that made the DTensor (no style redistributed it) reduce that "
    "gradient by their own sharding propagation in backward: where an operator cannot take "
    "it partial, a reduce-scatter or an all-reduce, and the redistributions of the tensors it "
    "meets there (a normalisation's statistics gathered), collectives fsdpviz does not plan, "
    "nor their buffers."
)
"""What a ``Partial()`` input gradient no style's ``Redistribute.backward`` takes back
meets in torch (``rms_norm``'s arithmetic on a sequence-sharded DTensor: reduce-scatters,
and its statistics all-gathered)."""


def partial_grad_warning(tpm: TPModule, known: Layout) -> str:
    """The warning of a batch of one's multiply (:func:`batch_one_multiply`) whose input's
    gradient comes back ``Partial()`` where no style's ``Redistribute.backward`` takes it."""
    layout = layout_name(known)
    return (
        f"tensor parallelism: {tpm.fqn} ({tpm.style}) takes a DTensor in {layout} that its "
        "declared layouts leave to its linear's multiply, which gives its gradient back "
        f"Partial() (planned, as DTensor's mm strategies pick). {_UNREDUCED} Declare the "
        f"layout it arrives in, input_layouts=({layout},), so the style redistributes it "
        "explicitly (its backward reduce-scatters the gradient, planned)"
    )


def gathered_warning(tpm: TPModule, known: Layout, absorbed: bool) -> str:
    """The warning of a linear whose multiply gathers a DTensor in ``known``
    (:func:`gathered_by_multiply`): its collectives planned, but for a ``Partial()``
    gradient no style's ``Redistribute.backward`` takes back (``absorbed``: one does), and
    its memory not exact."""
    layout = layout_name(known)
    back = "" if absorbed else f" {_UNREDUCED}"
    return (
        f"tensor parallelism: {tpm.fqn} ({tpm.style}) takes a DTensor in {layout} that its "
        "declared layouts leave to its linear's multiply, which gathers it in forward and "
        "again for the weight's gradient in backward and gives its gradient back Partial() "
        f"(planned).{back} Its memory is not exact: torch saves the multiply's input as a "
        "rank's share (_StridedShard: the linear's 2-D view of a tensor sharded on a dim "
        "after a dim of more than one) and gathers it into temporary buffers, fsdpviz holds "
        "it gathered, whole, until backward (more than torch). "
        f"Declare the layout it arrives in, input_layouts=({layout},), so the style gathers "
        "it (the same forward collective), which fsdpviz plans exactly"
    )


@dataclass(frozen=True)
class Move:
    """One operand of a multiply redistributed by DTensor's sharding propagation.

    Attributes:
        kind: the collective (``tp_all_gather``, ``tp_all_to_all``).
        nbytes: the bytes it moves (a dim the tp ranks do not divide padded).
        shape: the operand's whole shape (the buffer it makes: whole for an all-gather, a
            rank's share for an all-to-all).
        dim: the dim of the 2-D operand it is sharded on (1: a transpose's, the weight's
            ``t()`` in forward).
        contiguous: whether a rank's operand is contiguous (not: the transpose of the
            output's gradient that the weight's gradient multiplies), which an all-to-all
            copies contiguous first (``Shard._pad_for_new_shard_dim``).
    """

    kind: str
    nbytes: int
    shape: tuple[int, ...]
    dim: int = 0
    contiguous: bool = True


@dataclass(frozen=True)
class BatchOneMultiply:
    """How DTensor multiplies a batch of one's sequence-sharded input (viewed 2-D:
    ``Shard(0)``) by a column-wise linear's weight, by the strategies its cost model picks
    (:func:`batch_one_multiply`).

    Attributes:
        forward: the operands the forward's ``mm`` redistributes, in order.
        output: the layout of the linear's output (``Shard(-1)``, or ``Shard(d)`` where the
            weight was gathered: the output keeps the input's sequence sharding).
        weight_backward: the operands the backward's ``mm`` for the weight's gradient
            (``mm_mat2_backward``) redistributes, which autograd runs first (below).
        input_backward: the operands the ``mm`` for the input's gradient
            (``mm_mat1_backward``) redistributes, after.
        input_grad: the layout the input's gradient comes back in.
        weight_grad_partial: whether the weight's gradient is ``Partial()`` (FSDP2's
            ``_get_grad_inner_tensor`` reduce-scatters it back to ``Shard(0)``).
        product_share: the share of the forward's product one rank holds: its chunk of the
            sequence where the product keeps the input's sharding (``Shard(0)`` viewed
            2-D), of the weight's rows where it is ``Shard(1)``; they differ where the tp
            ranks do not divide the sequence (16 of 62 rows over 4 ranks, 32 of 128
            features).
        weight_share: the share of the weight's rows (its ``Shard(0)`` chunk) one rank
            holds, and of its gradient where that is not ``Partial()`` (64 of 254 rows over
            4 ranks).
        topology_dependent: whether a strategy would differ on nodes on the other side of
            ``tp <= gpus_per_node`` (the tp group costed across hosts rather than within
            one, or the other way round:
            :func:`~fsdpviz.schedule.tp_mm_strategy.topology_dependent`).
    """

    forward: tuple[Move, ...]
    output: Layout
    weight_backward: tuple[Move, ...]
    input_backward: tuple[Move, ...]
    input_grad: Layout
    weight_grad_partial: bool
    product_share: Fraction
    weight_share: Fraction
    topology_dependent: bool = False

    @property
    def backward(self) -> tuple[Move, ...]:
        """The backward's redistributed operands in torch's order: autograd's generated
        ``MmBackward0::apply`` computes ``mat2``'s gradient (``mm_mat2_backward``: the
        weight's, ``mat2`` being the weight's ``t()``) before ``self``'s
        (``mm_mat1_backward``: the input's), as a dispatch log of a real run shows (the
        ``mm`` of the output's gradient's transpose and the saved input first). Each ``mm``
        redistributes its own operands in DTensor's dispatch
        (``redistribute_local_args``) as it runs."""
        return self.weight_backward + self.input_backward


def _moves(
    operands: list[tuple[tuple[int, int], Layout, Layout]],
    itemsize: int,
    tp: int,
    transposed: int | None = None,
) -> tuple[Move, ...] | None:
    """The collectives taking each 2-D operand (shape, layout, the layout a strategy wants)
    there (``transposed``: the index of an operand that is a transpose); None for one
    fsdpviz does not plan (a partial operand)."""
    moves: list[Move] = []
    for n, (shape, src, dst) in enumerate(operands):
        if src in (dst, REPLICATE):
            continue
        if src[0] != "shard" or dst == PARTIAL:
            return None
        kind = "tp_all_gather" if dst == REPLICATE else "tp_all_to_all"
        nbytes = padded_bytes(math.prod(shape) * itemsize, torch.Size(shape), kind, src, dst, tp)
        moves.append(Move(kind, nbytes, shape, (src[1] or 0) % 2, n != transposed))
    return tuple(moves)


def batch_one_multiply(
    t: torch.Tensor,
    r: Redistribution,
    tpm: TPModule,
    known: Layout | None,
    tp: int,
    weight: torch.Tensor | None,
    gpus_per_node: int = GPUS_PER_NODE,
) -> BatchOneMultiply | None:
    """How DTensor multiplies ``t``, a batch of one's DTensor sharded on the sequence that
    ``ColwiseParallel`` leaves to its linear (its declared layouts equal), where its ``mm``
    strategies (torch's cost model: :func:`~fsdpviz.schedule.tp_mm_strategy.mm_choice`)
    pick: in forward the input gathered (the product ``Shard(1)``) or the weight (the
    product then sequence-sharded, which the style's output redistribution moves on); in
    backward the input gathered again for the weight's gradient or the output's gradient
    moved by an all-to-all (the weight's gradient ``Partial()`` then), the weight gathered
    again for the input's gradient or the output's gradient moved (the input's gradient
    ``Partial()``). The tp group is costed as on nodes of ``gpus_per_node`` GPUs. None where
    it is not that case, or DTensor's choice is one fsdpviz does not plan (noted:
    :func:`skipped_warning`)."""
    if (
        known is None or known[0] != "shard" or tpm.base != "ColwiseParallel" or tpm.float8
        or t.dim() < 3 or tp == 1 or r.src != r.dst or same_layout(known, r.src, t.dim())
        or not isinstance(weight, torch.Tensor) or weight.dim() != 2
    ):  # fmt: skip
        return None
    d = (known[1] or 0) % t.dim()
    if not 0 < d < t.dim() - 1 or math.prod(t.shape[:d]) > 1:
        return None
    rows, (out, features) = math.prod(t.shape[:-1]), weight.shape
    s0, s1 = ("shard", 0), ("shard", 1)
    dtype, size = t.dtype, t.element_size()
    Operand = tuple[tuple[int, int], Layout]
    asked: list[tuple[Operand, Operand]] = [(((rows, features), s0), ((features, out), s1))]
    fwd = mm_choice(*asked[0], dtype, tp, gpus_per_node)
    if fwd is not None:
        asked.append((((rows, out), fwd.output), ((out, features), s0)))
    gi = mm_choice(*asked[1], dtype, tp, gpus_per_node) if fwd else None
    if fwd is None or gi is None or fwd.output not in (s0, s1):
        return None
    forward = _moves([((rows, features), s0, fwd.inputs[0]),
                      ((features, out), s1, fwd.inputs[1])], size, tp)  # fmt: skip
    grad = fwd.output  # the output's gradient, 2-D, as the product was
    backward: tuple[Move, ...] | None = ()
    grads = torch.is_grad_enabled()
    if t.requires_grad and grads:  # the input's gradient (mm_mat1_backward)
        backward = _moves([((rows, out), grad, gi.inputs[0]),
                           ((out, features), s0, gi.inputs[1])], size, tp)  # fmt: skip
    more: tuple[Move, ...] = ()  # the weight's gradient's (mm_mat2_backward)
    partial = False
    if weight.requires_grad and grads:
        grad_t: Layout = s0 if grad == s1 else s1
        asked.append((((out, rows), grad_t), ((rows, features), s0)))
        gw = mm_choice(*asked[-1], dtype, tp, gpus_per_node)
        if gw is None or gw.output not in (s0, PARTIAL):
            return None
        found = _moves([((out, rows), grad_t, gw.inputs[0]),
                        ((rows, features), s0, gw.inputs[1])], size, tp, 0)  # fmt: skip
        if found is None:
            return None
        more, partial = found, gw.output == PARTIAL
    if forward is None or backward is None or gi.output not in (s0, PARTIAL):
        return None
    sequence: Layout = ("shard", d)
    return BatchOneMultiply(
        forward, sequence if fwd.output == s0 else ("shard", -1), more, backward,
        sequence if gi.output == s0 else PARTIAL, partial,
        dim_share(rows if fwd.output == s0 else out, tp), dim_share(out, tp),
        any(topology_dependent(a, b, dtype, tp, gpus_per_node) for a, b in asked),
    )  # fmt: skip


def multiplied_backward(
    probe: CostProbe | None,
    m: BatchOneMultiply,
    weight_grad: bool,
    report: Any,
    size: int,
) -> Any:
    """What a batch of one's multiply (``m``) does in backward from its output's gradient
    on, in torch's order (:attr:`BatchOneMultiply.backward`): the weight's gradient's
    operands redistributed (``report(moves)``: their collectives; their temporaries made)
    as the gradient reaches the multiply, then the ``mm`` for the weight's gradient (when
    ``weight_grad``: the weight takes one), then the input's gradient's operands, before the
    ``mm`` for it, which the probe runs (:meth:`~fsdpviz.trace.probe.CostProbe.
    before_backward_mm`): the weight's gradient held by then, as torch holds it, and those
    operands' buffers until the ``mm`` has made its product. That product, the input's
    gradient, is a rank's share where it keeps the sequence sharding (the weight gathered:
    ``Shard(0)`` of the 2-D product), whole where it is ``Partial()``. The function to
    hook on the output's gradient (``GradCollective``'s copy)."""

    def back_copy(g: torch.Tensor) -> torch.Tensor:
        if probe is None or not weight_grad:
            report(m.weight_backward)

        def weight_side() -> list[torch.Tensor]:  # each reported as it is issued
            return moves_made(probe, m.weight_backward, g, size, lambda mv: report((mv,)))

        def input_side() -> list[torch.Tensor]:
            report(m.input_backward)
            return moves_made(probe, m.input_backward, g, size)

        rows = math.prod(g.shape[:-1])
        made = None if m.input_grad == PARTIAL or g.dim() == 0 else dim_share(rows, size)
        if probe is not None and weight_grad:  # Shard(0) (the weight's chunk) or Partial()
            probe.before_backward_mm(0, weight_side, None if m.weight_grad_partial else
                                     m.weight_share)  # fmt: skip
        if probe is None or (not m.input_backward and made is None):
            input_side()
        else:
            probe.before_backward_mm(1 if weight_grad else 0, input_side, made)
        return g

    return back_copy


def moves_made(
    probe: CostProbe | None,
    moves: tuple[Move, ...],
    like: torch.Tensor,
    tp: int,
    issue: Callable[[Move], None] | None = None,
) -> list[torch.Tensor]:
    """The buffers ``moves`` make, temporaries the multiply frees once it has run (the
    caller holds them until then): whole for an all-gather (a dim the tp ranks do not
    divide gathered padded, ``Shard._to_replicate_tensor``, and cut to its size by a
    ``narrow`` that keeps the padded buffer: 64 rows held of a sequence of 62 over 4
    ranks); an all-to-all's as the GPU's kernel makes them
    (:func:`~fsdpviz.schedule.tp_buffers.all_to_all_buffers`), its result a rank's share."""
    if probe is None:
        return []
    made = []
    for move in moves:
        issued = functools.partial(issue, move) if issue is not None else None
        if move.kind == "tp_all_to_all":  # the operand's shape, no storage of its own
            operand = like.as_strided(move.shape, [0] * len(move.shape))
            src, dst = ("shard", move.dim), ("shard", 1 - move.dim)
            made.append(all_to_all_buffers(probe, operand, src, dst, tp, issued, move.contiguous))
            continue
        if issued is not None:
            issued()
        padded, d = list(move.shape), move.dim  # a dim the tp ranks do not divide, padded
        padded[d] = -(-padded[d] // tp) * tp
        with probe.redistributed(None):  # _maybe_unpad_tensor's narrow: the buffer held
            made.append(like.new_empty(padded).narrow(d, 0, move.shape[d]))
    return made


def issued_forward(
    probe: CostProbe | None,
    moves: tuple[Move, ...],
    like: torch.Tensor,
    tp: int,
    where: tuple[FSDP2Runtime, int, str, str],
) -> list[torch.Tensor]:
    """The forward's ``moves`` issued (``where``: the runtime, the group, the module and the
    dtype they are reported with) and the buffers they leave, which the
    multiply frees once it has run (the caller holds them until then), as
    ``Shard._to_replicate_tensor`` makes an all-gather's: ``_maybe_pad_tensor`` makes a
    rank's chunk contiguous first (the weight's transpose, sharded on dim 1, is not: a copy
    of the chunk, held while the collective is issued and until it returns);
    ``all_gather_single`` gathers on dim 0 into a whole buffer and, on dim 1 of a matrix of
    more than one row, puts the chunks in place by ``torch.cat`` into another
    (``_maybe_view_chunk_cat``), letting go of the first; ``_maybe_unpad_tensor``'s
    ``contiguous()`` then copies nothing (the result is contiguous). An all-to-all's buffer
    is a rank's share (:func:`moves_made`)."""
    runtime, i, fqn, dtype = where

    def issue(move: Move) -> None:
        runtime.tensor_parallel(i, move.kind, fqn, "forward", move.nbytes, dtype)

    made: list[torch.Tensor] = []
    for move in moves:
        if probe is None or move.kind != "tp_all_gather" or move.dim == 0:
            issue(move)
            made += moves_made(probe, (move,), like, tp)
            continue
        chunk, padded = list(move.shape), list(move.shape)
        chunk[1] = -(-chunk[1] // tp)  # the first rank's, as large as any (padded)
        padded[1] = chunk[1] * tp
        with probe.redistributed(None):
            contiguous = like.new_empty(chunk)  # the chunk of the transpose, made contiguous
            issue(move)
            gathered = like.new_empty(padded)  # all_gather_into_tensor, on dim 0
            placed = like.new_empty(padded) if move.shape[0] > 1 else gathered  # cat
            del gathered, contiguous
            if padded != list(move.shape):  # _maybe_unpad_tensor: narrow, then contiguous()
                placed = like.new_empty(move.shape)
        made.append(placed)
    return made


def scatter_partial_weight(
    groups: list[Group], fqn: str, weight: torch.Tensor, like: torch.Tensor, tp: int
) -> None:
    """A batch of one's weight ``fqn`` whose gradient its multiply leaves ``Partial()``
    (:attr:`BatchOneMultiply.weight_grad_partial`), in the compute dtype of ``like``: its
    group's post-backward reduce-scatters it to the weight's shard (FSDP2's
    ``_get_grad_inner_tensor``) over the ``tp`` ranks, in the group's order of parameters,
    a dim 0 they do not divide padded (``Shard._reduce_shard_tensor``)."""
    nbytes = weight.numel() * like.element_size()
    nbytes = padded_bytes(nbytes, weight.shape, "tp_reduce_scatter", PARTIAL, ("shard", 0), tp)
    for g in groups:
        i = next((i for i, p in enumerate(g.params) if p is weight), None)
        if i is None:
            continue
        name = g.param_fqns[i]  # ``fqn`` as its unit lists it (without wrapper segments)
        entry = (name, nbytes, str(like.dtype).removeprefix("torch."))
        if entry not in g.tp_partial_grads:
            g.tp_partial_grads.append(entry)
            g.tp_partial_grads.sort(key=lambda e: g.param_fqns.index(e[0]))
            g.tp_scattered_grads.add(name)


def normalised(
    out: torch.Tensor,
    fused: bool,
    found: tuple[Any, list[Layout]] | None,
    runtime: FSDP2Runtime,
    running: tuple[str, int],
    probe: CostProbe | None,
    tp: int,
) -> tuple[torch.Tensor, list[Layout]]:
    """A normalisation over the last dims of a replicated DTensor: its result (to go on
    with) and the layout list of the result's gradient, its input's gradient coming back in
    ``found``'s list (the input's entry of the gradients' layouts; replicated where none).
    Its collective is reported in ``running``: the plan's module begun last, and its group.
    ``aten.native_layer_norm_backward`` (``fused``) takes the output's gradient in the
    input's layout and gives the input's in it (``layer_norm_bwd_single_dim_strategy``,
    ``torch/distributed/tensor/_ops/_math_ops.py``): a ``Partial()`` gradient all-reduced
    there, into a new buffer, beside the partial one, which DTensor's dispatch (the
    operator's argument) holds until the operator has run. ``rms_norm`` is planned as it
    runs on the CPU, as arithmetic (``rms_norm_symint``; ``_fused_rms_norm`` has CUDA, XPU
    and MPS kernels alone), whose operators take a ``Partial()`` gradient as it is: the
    input's gradient comes back as the output's, reduced where it goes back (a
    ``PrepareModuleInput``'s redistribution). On a GPU torch may run the fused kernel, whose
    backward's strategies (``rms_norm_bwd_single_dim_strategy``) take the gradient as
    ``layer_norm``'s do: not checked against a GPU run."""
    grad_in = found[1] if found is not None else [REPLICATE]
    if not fused or not (out.requires_grad and torch.is_grad_enabled()):
        return out, grad_in
    grad_out = [grad_in[0]]  # as the consumers leave it (a column-wise linear's: Partial())
    # (the closures keep no tensor past the backward: the autograd graph keeps them to the
    # step's end)
    nbytes, dtype = out.numel() * out.element_size(), str(out.dtype).removeprefix("torch.")

    def reported() -> None:
        grad_in[0] = REPLICATE if grad_out[0] == PARTIAL else grad_out[0]
        if grad_out[0] == PARTIAL:
            fqn, i = running
            runtime.tensor_parallel(i, "tp_all_reduce", fqn, "backward", nbytes, dtype)

    held: list[torch.Tensor] = []  # the Partial() gradient, until the norm's backward ran

    def reduced(g: torch.Tensor) -> torch.Tensor:
        make = collective_buffer(probe, "tp_all_reduce", PARTIAL, REPLICATE, g.dim(), tp)
        if make is None or grad_out[0] != PARTIAL:
            return g
        held.append(g)
        reduced_copy: torch.Tensor = make(g)
        return reduced_copy

    def ran(*_: Any) -> None:
        held.clear()

    hooked = GradCollective.apply(reported, None, reduced, out)  # type: ignore[no-untyped-call]
    if out.grad_fn is not None:
        out.grad_fn.register_hook(ran)
    return hooked, grad_out
