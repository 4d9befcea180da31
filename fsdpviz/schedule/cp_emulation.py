"""Context parallelism's ring attention on fsdpviz's copy of the model.

torch's context parallelism (``torch.distributed.tensor.experimental.context_parallel``,
torchtitan's ``context_parallel_degree``) gives each rank of a ``cp`` group ``1 / cp`` of
every sequence, cut into ``2 cp`` chunks so that causal attention's work is balanced (rank
``r`` holds chunks ``r`` and ``2 cp - 1 - r``), and runs every
``scaled_dot_product_attention`` as a ring (``_templated_ring_attention``, torch's default
rotation ``allgather``):

- forward: the rank's keys and values, flattened into one buffer, are all-gathered over
  the cp group (one ``cp_all_gather`` of ``cp`` such buffers); meanwhile the rank's own
  block runs causal attention on its own keys; then, for each of the ``cp - 1`` other
  ranks' keys, one block without a mask on half of the queries (the traced rank, rank 0,
  holds the earliest and the latest chunk: only the latest sees the others), its output and
  log-sum-exp merged into float32 ones (``_SDPAMerger``);
- backward: the keys and values are all-gathered again; each block's backward adds its key
  and value gradients into float32 buffers that travel round the ring, one
  ``cp_all_to_all`` per block (``_AllToAllRotater``: each rank sends the buffer to the next
  rank), the last received once all blocks are done.

Inside a compiled module (``torch.compile``, torchtitan's per-block compile) the ring is
traced into the graph, where a functional collective is waited on as soon as it is issued
(torch's ``_functional_collectives._maybe_wrap_tensor`` returns ``wait_tensor`` of it while
tracing, not an ``AsyncCollectiveTensor`` waited on at first use; torch 2.6 onwards, and
Inductor moves no wait later unless ``reorder_for_compute_comm_overlap`` is set): there,
each collective's wait follows its issue, and no block of attention runs under it.

The traced copy runs exactly that on meta tensors (:func:`~fsdpviz.trace.attention.flash_block`
for each block), so the cost probe measures every kernel and buffer as a rank makes them,
and each collective is reported to the :class:`FSDP2Runtime` as an event of the group whose
module called the attention; where the ring waits for one, the runtime logs a hook call
(``cp_forward_wait`` / ``cp_backward_wait``) that the time model lets the compute after it
wait at. Autograd saves what the flash kernel saves: the rank's queries, keys, values,
output and log-sum-exp.

What a rank holds between the ring's collectives is torch's to the byte (the lifetimes of
``_templated_ring_attention``'s and its backward's local names kept: a buffer is let go
where torch rebinds the name holding it): the rank's contiguous keys and values, held by the
first block's ``k`` and ``v`` until the second block's; the buffer sent to the all-gather,
let go once it is issued in forward, in backward held until the next block's is made (the
last to the end); in backward, the keys and values as saved, which autograd's node holds
until the ring's backward returns (under activation checkpointing too, where nothing else
does); the float32 gradient accumulators, made before the backward's all-gather with the
strides of the keys as saved (a transposed view's, so their ``flatten()`` copies before the
first all-to-all); each block's gradients until the next block's are made; the buffer sent
by an all-to-all until the next is received.

Under a selective activation checkpoint (torchtitan's per-operator policy) the ring is one
operator to the policy, as in torch, where DTensor's dispatch of the attention kernel runs the
whole ring below the checkpoint's dispatch mode: the policy saves (or not) the merged output and
log-sum-exp, and where it saves them the recomputation takes them and runs no ring
(:func:`~fsdpviz.trace.checkpointing.one_operator`).

The inputs: each tensor of two or more dimensions is cut along dimension 1, the sequence,
as torchtitan passes its inputs and labels to ``context_parallel`` (:func:`shard_sequence`);
the traced rank holds ``1 / cp`` of it, in the storage of the whole tensor
(``context_parallel`` copies the share into the tensor, ``resize_``, which keeps its bytes).

With tensor parallelism too (a ``dp_shard x cp x tp`` mesh), the ring runs over the cp group
(``mesh["cp"].get_group()`` in torch's ring handlers) on the local tensors a tp rank's attention
computes: its heads of its ``S / cp`` positions, the heads the column-parallel query, key and
value projections leave it. The copy is traced with global shapes, its tp shares counted by the
cost probe (:class:`~fsdpviz.trace.probe.CostProbe`): the ring's buffers and kernels come out a
rank's from there, and the bytes of each collective are those of the rank's heads
(:meth:`CPEmulation.held`). Where a rank holds one head, its keys, values and the ring's results
are contiguous whichever way their heads dimension is ordered, where the trace's, of all heads,
are not: the ring's ``contiguous()`` and ``flatten()`` copy nothing there, and its results come
back laid out as the model gave the inputs, so that moving the heads back copies nothing either
(:meth:`CPEmulation.one_head`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch._prims_common import make_contiguous_strides_for

from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp2_group import Group, owner_index
from fsdpviz.plan.job import JobOptions
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime
from fsdpviz.trace.attention import flash_block, flash_block_backward, ring_attention
from fsdpviz.trace.checkpointing import FUSED_ATTENTION, attention_saved, one_operator
from fsdpviz.trace.compiled_saves import partitioning
from fsdpviz.trace.probe import traced_as_share
from fsdpviz.trace.tracker import ModuleTracker

_HALVES = 2  # torch's round-robin load balancing: two chunks of a sequence per rank


def shard_sequence(args: tuple[Any, ...], kwargs: dict[str, Any], cp: int) -> Any:
    """One cp rank's share of the inputs: every tensor of two or more dimensions cut along
    dimension 1 into ``2 cp`` chunks, the rank's two of them (the same storage cut once), in
    a storage of the whole tensor's bytes, as ``context_parallel`` leaves it."""
    cut: dict[int, torch.Tensor] = {}

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            return t
        if id(t) not in cut:
            n = t.shape[1]
            if n % (_HALVES * cp):
                raise ConfigError(
                    f"context parallelism over {cp} ranks cuts each input's sequence "
                    f"(dimension 1) into {_HALVES * cp} chunks, but an input has {n} "
                    f"positions (shape {tuple(t.shape)}): use a sequence length divisible by "
                    f"{_HALVES * cp}"
                )
            # ``context_parallel`` copies the share into the tensor itself (``resize_``),
            # whose storage keeps the whole sequence's bytes
            share = t.clone()
            share.resize_(t.narrow(1, 0, n // cp).shape)
            cut[id(t)] = share
        return cut[id(t)]

    return tuple(_walk(a, one) for a in args), {k: _walk(v, one) for k, v in kwargs.items()}


def compiled_names(
    model: torch.nn.Module, job: JobOptions, chosen: list[torch.nn.Module] | None
) -> frozenset[str] | None:
    """The names in ``model`` of ``job``'s compiled modules (``chosen``, as
    ``job.compiled_modules(model)`` gives them): none without ``torch.compile``, None where
    the whole model is compiled."""
    if not job.compile:
        return frozenset()
    if chosen is None:
        return None
    ids = {id(m) for m in chosen}
    return frozenset(name for name, m in model.named_modules() if id(m) in ids)


def _walk(obj: Any, fn: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        return type(obj)(_walk(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _walk(v, fn) for k, v in obj.items()}
    return fn(obj)


class CPEmulation:
    """Ring attention over a cp group of ``size`` ranks on the traced copy, reporting its
    collectives to ``runtime`` (see the module's docstring)."""

    def __init__(
        self,
        groups: list[Group],
        runtime: FSDP2Runtime,
        size: int,
        tracker: ModuleTracker,
        compiled: frozenset[str] | None = frozenset(),
        tp: int = 1,
    ) -> None:
        self.groups = groups
        self.runtime = runtime
        self.size = size
        self.tracker = tracker
        self.compiled = compiled  # the compiled modules' names; None: the whole model
        self.tp = tp  # the tp group's ranks (tensor parallelism beside the ring)

    def held(self, t: torch.Tensor, itemsize: int) -> int:
        """The bytes of ``t`` (batch, heads, sequence, head size) the traced rank holds, its
        elements ``itemsize`` bytes each: under tensor parallelism, where the trace holds
        ``t`` as a 1/tp share, its heads of the tp group's first rank (the attention's
        inputs come from column-parallel projections, ``ceil(heads / tp)`` of them, as
        DTensor's ``Shard`` gives the first rank)."""
        heads = t.shape[1]
        local = -(-heads // self.tp) if self.tp > 1 and traced_as_share(t) else heads
        return t.numel() // max(heads, 1) * local * itemsize

    def one_head(self, t: torch.Tensor) -> bool:
        """Whether the rank holds one of the heads of ``t`` (batch, heads, sequence, head
        size), laid out densely, which the trace holds whole under tensor parallelism: the
        rank's tensor is contiguous however its heads dimension is ordered in memory (a
        dimension of one element takes no part), where the trace's, of all heads, is not."""
        heads = t.shape[1]
        one = heads > 1 and self.tp > 1 and -(-heads // self.tp) == 1
        return one and traced_as_share(t) and _dense(t)

    def contiguous(self, t: torch.Tensor) -> torch.Tensor:
        """``t.contiguous()`` as the rank runs it: a copy unless the rank's tensor is
        contiguous (:meth:`as_contiguous`)."""
        if t.is_contiguous() or not self.one_head(t):
            return t.contiguous()
        return self.as_contiguous(t, t)

    def as_contiguous(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``t``, in ``like``'s shape and strides, as the rank holds it: where the rank holds
        one head of ``like`` (:meth:`one_head`), the trace's ``t`` in contiguous strides, as
        the rank's is contiguous (a view of the same bytes: a rank's values are not traced)."""
        if t.is_contiguous() or not self.one_head(like):
            return t
        return t.as_strided(t.shape, make_contiguous_strides_for(t.shape))

    def laid_as(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``t``, a result of the ring in ``like``'s shape, in ``like``'s strides where the rank
        holds one head of it (:meth:`one_head`): the rank's result is contiguous whether its
        heads dimension is moved back or not, so a model's ``transpose`` back and
        ``reshape`` copy nothing; the trace's, of all heads, is, when laid out as the model
        gave the input (a view of the same bytes)."""
        if not self.one_head(like) or t.stride() == like.stride():
            return t
        return t.as_strided(like.shape, like.stride())

    def _in_compiled(self) -> bool:
        """Whether the attention running now is in a compiled module (by name: activation
        checkpointing's recomputation calls the block's forward without its hooks)."""
        if self.compiled is None:
            return True
        for name in self.tracker.stack:
            parts = name.split(".")
            if any(".".join(parts[:n]) in self.compiled for n in range(1, len(parts) + 1)):
                return True
        return False

    @contextmanager
    def attached(self) -> Iterator[None]:
        """Every ``scaled_dot_product_attention`` of the block runs as the ring."""
        with ring_attention(self._ring):
            yield

    def _ring(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        module = self.tracker.stack[-1] if self.tracker.stack else ""
        where = repr(module) if module else "the root"
        if attn_mask is not None or not is_causal or dropout_p:
            raise ConfigError(
                f"context parallelism: the attention in {where} is not causal "
                "scaled_dot_product_attention without a mask and dropout, which torch's ring "
                "attention (with its load balancing) needs"
            )
        if query.dim() != 4 or query.device.type != "meta":
            raise ConfigError(
                f"context parallelism: the attention in {where} takes (batch, heads, "
                "sequence, head size) tensors, traced on the meta device"
            )
        if query.shape[2] % _HALVES:
            raise ConfigError(
                f"context parallelism: the attention in {where} sees {query.shape[2]} positions, "
                "which its load balancing cannot cut in two"
            )
        i = owner_index(module, self.groups)
        out: torch.Tensor = _RingAttention.apply(  # type: ignore[no-untyped-call]
            self, (i, module, self._in_compiled()), scale, query, key, value
        )
        return out

    def issue(
        self, i: int, kind: str, module: str, nbytes: int, quiet: bool = False, now: bool = False
    ) -> None:
        """Issue a collective of the ring; ``now``: traced (compiled), waited on at once.
        ``quiet``, or while torch's partitioner captures a compiled region (which runs the
        ring once more on fake tensors): nothing is issued."""
        if not quiet and not partitioning():
            self.runtime.context_parallel(i, kind, module, _phase(), nbytes)
            if now:
                self.runtime.context_parallel_wait(i, _phase(), kind.removeprefix("cp_"))

    def wait(self, i: int, kind: str, quiet: bool = False) -> None:
        if not quiet and not partitioning():
            self.runtime.context_parallel_wait(i, _phase(), kind)


def _phase() -> str:
    """Backward while autograd runs a graph (activation checkpointing's recomputation too)."""
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


class _Merger:
    """``_SDPAMerger`` of torch's ring attention, ``convert_to_f32`` (its default)."""

    def __init__(self) -> None:
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None
        self.dtypes = (torch.float32, torch.float32)

    def step(self, out: torch.Tensor, lse: torch.Tensor, partial: bool) -> None:
        self.dtypes = (out.dtype, lse.dtype)
        out, lse = out.to(torch.float32), lse.to(torch.float32).unsqueeze(-1)
        if self.out is None or self.lse is None:
            self.out, self.lse = out, lse
            return
        # torch rebinds one name to the old merged chunk and then to the new one: the old
        # log-sum-exp goes once ``self.lse`` is replaced, before the output's new buffer
        merged_lse = self.lse.chunk(_HALVES, dim=2)[1] if partial else self.lse
        merged_out = self.out.chunk(_HALVES, dim=2)[1] if partial else self.out
        merged_out = merged_out - F.sigmoid(lse - merged_lse) * (merged_out - out)
        merged_lse = merged_lse - F.logsigmoid(merged_lse - lse)
        if partial:
            self.lse = _partial_update(self.lse, merged_lse, 1, add=False)
            self.out = _partial_update(self.out, merged_out, 1, add=False)
        else:
            self.out, self.lse = merged_out, merged_lse

    def results(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.out is not None and self.lse is not None
        return self.out.to(self.dtypes[0]), self.lse.squeeze(-1).to(self.dtypes[1])


def _partial_update(original: torch.Tensor, new: torch.Tensor, idx: int, add: bool) -> torch.Tensor:
    """torch's ``_partial_update``: chunk ``idx`` of two along the sequence replaced by (or
    added to) ``new``, the result a new tensor."""
    chunks = list(original.chunk(_HALVES, dim=2))
    if add:
        chunks[idx] += new
    else:
        chunks[idx] = new
    return torch.cat(chunks, dim=2)


def _blocks(
    kv: torch.Tensor, key: torch.Tensor, cp: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The other ranks' keys and values in the gathered buffer, in the order the ring uses
    them (rank 0: from rank ``cp - 1`` down to rank 1)."""
    gathered = kv.new_empty(cp * kv.numel())  # the all-gather's output
    parts = gathered.chunk(cp)
    out = []
    for step in range(1, cp):
        buf = parts[(0 - step) % cp]
        out.append((buf[: key.numel()].view(key.shape), buf[key.numel() :].view(key.shape)))
    return out


class _RingAttention(torch.autograd.Function):
    """Ring attention of the traced rank (rank 0 of its cp group) on meta tensors."""

    @staticmethod
    def forward(
        ctx: Any,
        emu: CPEmulation,
        where: tuple[int, str, bool],
        scale: float | None,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
    ) -> torch.Tensor:
        ctx.emu, ctx.where, ctx.scale = emu, where, scale
        if where[2]:  # compiled: the region's policy tags the captured graph's nodes
            # a selective checkpoint that saves attention takes the saved output in
            # backward: its recomputation issues no collective
            quiet = _phase() == "backward" and attention_saved()
            result, result_lse = _ring_forward(emu, where, scale, query, key, value, quiet)
        else:
            # to a selective checkpoint the ring is the attention kernel, whose outputs its
            # policy saves (or not): saved, its recomputation runs nothing
            with one_operator(FUSED_ATTENTION) as saved:
                if saved is not None and _phase() == "backward":
                    result, result_lse = saved.pop(0)
                else:
                    result, result_lse = _ring_forward(emu, where, scale, query, key, value)
                    if saved is not None:
                        saved.append((result.detach(), result_lse.detach()))
        # autograd saves the operator's inputs as given, and its outputs
        ctx.save_for_backward(query, key, value, result, result_lse)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        # torch's ``_templated_ring_attention_backward`` on rank 0, its names and their
        # lifetimes kept: each buffer is let go where torch rebinds the name holding it
        emu: CPEmulation = ctx.emu
        (i, module, now), scale, cp = ctx.where, ctx.scale, emu.size
        # autograd's node holds what it unpacked until the kernel returns: the keys and
        # values as saved outlive the names rebound below (under activation checkpointing,
        # where the saved-tensor hooks hand them back, nothing else holds them)
        saved = ctx.saved_tensors
        query, key, value, out, lse = saved
        # the float32 accumulators take the strides of the tensors as saved (a transposed
        # view's: their ``flatten()`` below copies, unless the rank holds one head), made
        # before the keys are gathered
        grad_query = torch.zeros_like(query, dtype=torch.float32)
        grad_key = emu.as_contiguous(torch.zeros_like(key, dtype=torch.float32), key)
        grad_value = emu.as_contiguous(torch.zeros_like(value, dtype=torch.float32), value)
        shape, n = key.shape, key.numel()
        key, value = emu.contiguous(key), emu.contiguous(value)
        gathered = cp * 2 * emu.held(key, key.element_size())
        passed = 2 * emu.held(key, 4)  # each all-to-all: the rank's float32 buffer
        blocks: list[tuple[torch.Tensor, torch.Tensor]] = []
        next_kv: torch.Tensor | None = None
        received: torch.Tensor | None = None  # the rotater's buffer, what the last rank sent
        next_grad_kv: torch.Tensor | None = None
        for step in range(cp):
            if step > 0:
                if step == 1 and not now:
                    emu.wait(i, "all_gather")
                key, value = blocks[step - 1]
            if step != cp - 1:
                next_kv = torch.cat([key.flatten(), value.flatten()])
                if step == 0:
                    emu.issue(i, "cp_all_gather", module, gathered, now=now)
                    blocks = _blocks(next_kv, key, cp)
            if step == 0:
                q, out_, dout, lse_ = query, out, grad, lse
            else:  # rank 0's latest chunk of queries sees every other rank's keys
                q, out_, dout, lse_ = (
                    query.chunk(_HALVES, dim=2)[1],
                    out.chunk(_HALVES, dim=2)[1],
                    grad.chunk(_HALVES, dim=2)[1],
                    lse.chunk(_HALVES, dim=2)[1].contiguous(),
                )
            k, v = key, value  # (after: the last block's held while lse_'s copy is made)
            grad_query_, grad_key_, grad_value_ = flash_block_backward(
                dout, q, k, v, out_, lse_, step == 0, scale
            )
            if step == 0:
                grad_key += grad_key_
                grad_value += grad_value_
            else:
                if not now:
                    emu.wait(i, "all_to_all")
                assert received is not None
                next_grad_kv = received
                grad_key = next_grad_kv[:n].view(shape)
                grad_value = next_grad_kv[n:].view(shape)
                grad_key += grad_key_
                grad_value += grad_value_
            next_grad_kv = torch.cat([grad_key.flatten(), grad_value.flatten()])
            emu.issue(i, "cp_all_to_all", module, passed, now=now)
            received = torch.empty_like(next_grad_kv)
            if step == 0:
                grad_query += grad_query_
            else:
                grad_query = _partial_update(grad_query, grad_query_, 1, add=True)
        del next_kv, next_grad_kv, blocks, key, value, q, k, v, out_, dout, lse_
        del grad_query_, grad_key_, grad_value_
        grad_query = grad_query.to(query.dtype)
        if not now:
            emu.wait(i, "all_to_all")
        assert received is not None
        final = received.to(query.dtype)
        del received
        _, given_key, given_value, _, _ = saved
        return (
            None,
            None,
            None,
            emu.laid_as(grad_query, query),
            emu.laid_as(final[:n].view(shape), given_key),
            emu.laid_as(final[n:].view(shape), given_value),
        )


def _ring_forward(
    emu: CPEmulation,
    where: tuple[int, str, bool],
    scale: float | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    quiet: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's ``_templated_ring_attention`` on rank 0, its names and their lifetimes kept
    (each buffer is let go where torch rebinds the name holding it): the merged output and
    log-sum-exp; ``quiet``: its collectives not issued."""
    cp = emu.size
    i, module, now = where  # now: compiled, each collective waited on once issued
    given = query
    key, value = emu.contiguous(key), emu.contiguous(value)
    if value.shape != key.shape:
        raise ConfigError(
            f"context parallelism: the attention in {module!r} has keys and values of "
            "different shapes, which the ring passes on as one buffer"
        )
    gathered = cp * 2 * emu.held(key, key.element_size())
    merger = _Merger()
    blocks: list[tuple[torch.Tensor, torch.Tensor]] = []
    for step in range(cp):
        if step > 0:
            if step == 1 and not now:
                emu.wait(i, "all_gather", quiet)
            key, value = blocks[step - 1]  # views of the gathered buffer
        if step < cp - 1:
            # sent by the all-gather (once), then let go: ``exchange_buffers`` returns None
            next_kv = torch.cat([key.flatten(), value.flatten()])
            if step == 0:
                emu.issue(i, "cp_all_gather", module, gathered, quiet, now)
                blocks = _blocks(next_kv, key, cp)
            del next_kv
        # rank 0's latest chunk of queries sees every other rank's keys; ``k`` and ``v``
        # hold the rank's own (contiguous) keys and values until the next block's
        q = query if step == 0 else query.chunk(_HALVES, dim=2)[1]
        k, v = key, value
        out, lse = flash_block(q, k, v, step == 0, scale)
        merger.step(out, lse, partial=step > 0)
    result, result_lse = merger.results()  # while the loop's buffers are held
    del blocks, key, value, q, k, v, out, lse, merger
    return emu.laid_as(result, given), result_lse


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its extent in some order of its dimensions (no gaps, no
    overlap): a contiguous tensor with its dimensions permuted."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride(), strict=True) if n > 1)
    expected = 1
    for stride, n in dims:
        if stride != expected:
            return False
        expected *= n
    return True
