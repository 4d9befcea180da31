"""Which stream's pool of the caching allocator holds each byte the memory walk counts:
:class:`StreamPools`, the part of :class:`~fsdpviz.cost.memory_walker.Walker` that keeps
``pools`` (bytes per pool besides the compute stream's) and ``blocks`` (those pools' allocations
and frees in order, for :func:`fixed_segments`); and what the allocator reserves for them
(:func:`reserved_estimate`, the memory model's ``reserved``).

[Note: stream pools]
The caching allocator keeps the blocks of each stream apart (a block freed by one stream is
not handed to another's requests; with expandable segments, each stream maps its own segment),
and a block belongs to the stream current when it was allocated, wherever it is used after.
Read from torch's code (2.8 and 2.13 alike), per buffer of the walk:

FSDP2 (``torch/distributed/fsdp/_fully_shard/``):
- ``all_gather``: ``foreach_all_gather`` (``_fsdp_collectives.py``) makes the copy-in casts
  (``_get_param_all_gather_inputs``; under CPU offload the shard's copy to the device) and
  the all-gather output inside ``with device_handle.stream(all_gather_copy_in_stream)``: the
  copy-in stream's pool (``all_gather`` here). ``get_all_gather_streams`` gives that stream in
  forward and pre-backward (prefetches included); ``unshard(async_op=True)`` (a pipeline
  stage's ``UNSHARD``) uses the current stream: the compute pool.
- ``unsharded_params``: ``foreach_all_gather_copy_out`` allocates them in ``wait_for_unshard``
  on the current stream: compute.
- ``reduce_scatter``: ``foreach_reduce`` allocates ``reduce_scatter_input`` before it enters
  ``with device_handle.stream(reduce_scatter_stream)``: compute. ``reduce_output`` is made
  inside that block: the reduce-scatter pool; the new gradient shards are ``torch.as_strided``
  views of it (or of its cast to the parameters' dtype, made on ``post_reduce_stream``: the
  reduce-scatter stream, the all-reduce stream under HSDP, ``all_reduce`` here), so they stay in
  that pool until ``zero_grad`` frees them and the next backward's outputs reuse their blocks.
  A partial output (``set_requires_all_reduce(False)``) and the all-reduced buffer HSDP holds
  are reduce outputs too.
- gradients, activations, temporaries, the optimizer step, inputs, buffers: compute.

FSDP1 (``torch/distributed/fsdp/_runtime_utils.py``, ``_flat_param.py``):
- ``_unshard`` runs ``pre_unshard`` on the pre-unshard stream (``pre_unshard`` here): the
  low-precision shard ``_mp_shard`` (``_use_low_precision_shard``) and CPU offload's copy of
  the shard to the device; then ``unshard`` on the unshard stream: the padded unsharded
  FlatParameter (``_alloc_padded_unsharded_flat_param``) is that pool's (``all_gather`` here)
  from its all-gather, through its use (``unsharded_params``), to its free at resharding.
- ``_post_backward_hook`` runs ``_reduce_grad`` under ``state._post_backward_stream``
  (``reduce_scatter`` here): the gradient's cast to the reduce dtype, its padding, the
  reduce-scatter output and its cast to the parameters' dtype, so ``_saved_grad_shard``, the
  ``.grad`` the final callback gives the optimizer. Under ``HYBRID_SHARD`` the cast is made in
  ``with state._device_handle.stream(state._all_reduce_stream)``. ``NO_SHARD`` keeps autograd's
  gradient (compute) where no cast makes a new one. ``keep_low_precision_grads``' cast in the
  final callback (``prepare_gradient_for_optim``) is the compute stream's.
"""

from __future__ import annotations

from typing import Protocol

from fsdpviz.cost.memory_records import Block
from fsdpviz.cost.sizes import UnitBytes
from fsdpviz.schema.events import Event
from fsdpviz.schema.memory import POOLS, Moment, Reserved

__all__ = ["PoolsHost", "StreamPools", "fixed_segments", "reserved_estimate"]


class PoolsHost(Protocol):
    """What the pools read and keep of the walker they are part of."""

    cat: dict[str, int]
    pools: dict[str, int]
    blocks: dict[str, list[tuple[Block, int]]]
    _live: dict[str, dict[Block, int]]
    _shard_pool: dict[str, str]
    sizes: dict[str, UnitBytes]
    on_compute: set[str]
    fsdp2: bool
    replicas: int
    hsdp: bool

    def _add(self, category: str, pool: str, n: int) -> None: ...
    def _free(self, category: str, pool: str, block: Block, n: int) -> None: ...
    def _h2d_pool(self) -> str: ...


class StreamPools:
    """The walker's pools (a mixin of :class:`~fsdpviz.cost.memory_walker.Walker`, typed by
    :class:`PoolsHost`): see [Note: stream pools]."""

    def _add(self: PoolsHost, category: str, pool: str, n: int) -> None:
        """``n`` bytes (negative: freed) of ``category`` in ``pool``, the pool of the stream
        that allocated them (:data:`~fsdpviz.schema.memory.POOLS`), not replayed as a block."""
        self.cat[category] += n
        if pool != "compute":
            self.pools[pool] += n

    def _alloc(self: PoolsHost, category: str, pool: str, block: Block, n: int) -> None:
        """``n`` bytes of ``category`` allocated on ``pool``'s stream as ``block``: a block
        of a pool besides the compute stream's is kept, in order, for the replay of its
        segments (``blocks``, :func:`fixed_segments`)."""
        self._add(category, pool, n)
        if n and pool != "compute":
            self.blocks[pool].append((block, n))
            self._live[pool][block] = n

    def _free(self: PoolsHost, category: str, pool: str, block: Block, n: int) -> None:
        """``block`` (``n`` bytes of ``category``) back to ``pool``."""
        self._add(category, pool, -n)
        if n and pool != "compute":
            self.blocks[pool].append((block, 0))
            self._live[pool].pop(block, None)

    def _free_live(self: PoolsHost) -> None:
        """The replay's frees of the blocks the walk leaves allocated: the next iteration's
        ``zero_grad`` frees the gradient shards before its reductions allocate them again."""
        for pool, live in self._live.items():
            self.blocks[pool].extend((block, 0) for block in live)
            live.clear()

    def _copy_pool(self: PoolsHost, unit: str) -> str:
        """The pool of the shard's copy or cast an all-gather sends: see [Note: stream
        pools]."""
        return "compute" if unit in self.on_compute else self._h2d_pool()

    def _h2d_pool(self: PoolsHost) -> str:
        """The pool of CPU offload's copy of a shard to the device, and of the cast of a shard
        an all-gather sends where the compute stream does not make it: FSDP1's ``pre_unshard``
        makes them on the pre-unshard stream; FSDP2's is counted on the copy-in stream from its
        ``h2d`` event (a pipeline stage's ``UNSHARD`` makes it on the compute stream, which
        the walk does not know at that event)."""
        return "all_gather" if self.fsdp2 else "pre_unshard"

    def _grad_pool(self: PoolsHost, e: Event, s: UnitBytes) -> str:
        """The pool of the stream that makes a unit's new gradient shard: see [Note: stream
        pools]."""
        if self.fsdp2:  # the reduce-scatter output, or under HSDP its cast
            cast = self.hsdp and bool(s.reduce_cast)
            return "all_reduce" if cast else "reduce_scatter"
        if e.kind == "all_reduce":  # NO_SHARD: the gradient itself, or a cast of it
            return "reduce_scatter" if s.reduced_shard else "compute"
        cast = s.reduced_shard != s.sharded_grad
        return "all_reduce" if self.replicas > 1 and cast else "reduce_scatter"

    def _drop_shard(self: PoolsHost, unit: str, kept: int = 0) -> None:
        """The unit's gradient shard freed (its host copy is ``.grad`` from here on), or
        replaced by a cast to ``kept`` bytes on the compute stream."""
        n = self.sizes[unit].sharded_grad
        self._free("sharded_grads", self._shard_pool.pop(unit, "compute"), ("grad", unit), n)
        self._add("sharded_grads", "compute", kept)
        if kept:
            self._shard_pool[unit] = "compute"


_BLOCK = 2 * 2**20  # the caching allocator rounds large allocations to 2 MiB
_ALWAYS = ("compute", "all_gather", "reduce_scatter")  # the pools a result always names


def reserved_estimate(
    moments: list[Moment], blocks: dict[str, list[tuple[Block, int]]] | None = None
) -> Reserved:
    """The allocator's peak reserved bytes: each stream's pool at its own peak, summed.

    ``moments``: their ``pools``, the bytes each stream's pool holds
    (:data:`~fsdpviz.schema.memory.POOLS`). ``blocks``: without expandable segments, the
    pools besides the compute stream's, their allocations and frees in order
    (``Walker.blocks``): those pools are what their fixed segments come to
    (:func:`fixed_segments`), at least their peak. The result names ``compute``,
    ``all_gather`` and ``reduce_scatter``, and the other pools where they hold bytes.

    Example::

        reserved_estimate(memory_model(report).moments)["bytes"] / 2**30
    """
    peaks = dict.fromkeys(POOLS, 0)
    columns = zip(*(m.pools for m in moments), strict=True)  # each pool at every moment
    for pool, column in zip(POOLS, columns, strict=False):  # (none without moments)
        peaks[pool] = max(peaks[pool], *column)
    rounded = {k: -(-v // _BLOCK) * _BLOCK for k, v in peaks.items()}
    for pool, ops in (blocks or {}).items():
        rounded[pool] = max(rounded[pool], fixed_segments(ops))
    pools = {k: v for k, v in rounded.items() if v or k in _ALWAYS}
    return {"bytes": sum(pools.values()), "pools": pools}


# torch's caching allocator (c10/cuda/CUDACachingAllocator.cpp), without expandable segments
_MIN_BLOCK = 512  # kMinBlockSize: every request rounds up to a multiple of it
_SMALL = 2**20  # kSmallSize: the largest request of the small pool
_SMALL_BUFFER = 2 * 2**20  # kSmallBuffer: the small pool's segments
_MIN_LARGE_ALLOC = 10 * 2**20  # kMinLargeAlloc: smaller large requests take ...
_LARGE_BUFFER = 20 * 2**20  # kLargeBuffer: ... a segment of 20 MiB
_ROUND_LARGE = 2 * 2**20  # kRoundLarge: larger ones a segment of their size in 2 MiB


def fixed_segments(ops: list[tuple[Block, int]], passes: int = 2) -> int:
    """Bytes torch's caching allocator reserves for one stream's pool without expandable
    segments, replaying ``ops`` (``(block, bytes)`` allocates, ``(block, 0)`` frees) ``passes``
    times: a steady iteration after the ones before it left their segments cached.

    The allocator's rules (``DeviceCachingAllocator::malloc``): a request rounds up to 512
    bytes; it takes the smallest cached free block of its pool (small: up to 1 MiB; large)
    that fits, split when what is left exceeds 1 MiB (large pool; 512 bytes in the small
    one); else a new segment (2 MiB for a small request, 20 MiB below 10 MiB, otherwise its
    size rounded up to 2 MiB). A freed block merges with free neighbours of its segment;
    segments are never returned (no ``empty_cache``, no allocation failure).

    Example::

        fixed_segments([(("a",), 600 * 2**20), (("a",), 0), (("b",), 700 * 2**20)])
    """
    # per segment, its blocks in address order: [size, in use]
    segments: list[list[list[int]]] = []
    small_of: list[bool] = []
    live: dict[tuple[int, Block], tuple[int, int]] = {}  # block -> (segment, index)
    for p in range(passes):
        for block, n in ops:
            if n == 0:
                # this pass's block, or one the pass before left to this one
                at = live.pop((p, block), None) or live.pop((p - 1, block), None)
                if at is None:
                    continue  # allocated before the replay began
                seg, i = at
                blocks = segments[seg]
                blocks[i][1] = 0
                for j in (i + 1, i):  # merge with the free neighbours, after then before
                    if 0 < j < len(blocks) and not blocks[j][1] and not blocks[j - 1][1]:
                        blocks[j - 1][0] += blocks.pop(j)[0]
                _reindex(live, seg, blocks)
                continue
            size = max(_MIN_BLOCK, -(-n // _MIN_BLOCK) * _MIN_BLOCK)
            small = size <= _SMALL
            fits = [
                (b[0], seg, i)
                for seg, blocks in enumerate(segments)
                if small_of[seg] == small
                for i, b in enumerate(blocks)
                if not b[1] and b[0] >= size
            ]
            if fits:
                _, seg, i = min(fits)
            else:
                if small:
                    whole = _SMALL_BUFFER
                elif size < _MIN_LARGE_ALLOC:
                    whole = _LARGE_BUFFER
                else:
                    whole = -(-size // _ROUND_LARGE) * _ROUND_LARGE
                segments.append([[whole, 0]])
                small_of.append(small)
                seg, i = len(segments) - 1, 0
            blocks = segments[seg]
            left = blocks[i][0] - size
            if (left >= _MIN_BLOCK) if small else (left > _SMALL):
                blocks[i][0] = size
                blocks.insert(i + 1, [left, 0])
            blocks[i][1] = 1
            live[(p, block)] = (seg, i)
            _reindex(live, seg, blocks)
    return sum(b[0] for blocks in segments for b in blocks)


def _reindex(
    live: dict[tuple[int, Block], tuple[int, int]], seg: int, blocks: list[list[int]]
) -> None:
    """Keep ``live``'s indices into segment ``seg`` right after a split or a merge."""
    mine = sorted((i, key) for key, (s, i) in live.items() if s == seg)
    used = [i for i, b in enumerate(blocks) if b[1]]
    for (_, key), i in zip(mine, used, strict=True):
        live[key] = (seg, i)
