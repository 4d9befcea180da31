"""Which stream's pool of the caching allocator holds each byte the memory walk counts:
:class:`StreamPools`, the part of :class:`~fsdpviz.cost.memory_walker.Walker` that keeps
``pools`` (bytes per pool besides the compute stream's) and ``blocks`` (those pools' allocations
and frees in order, for :func:`fsdpviz.cost.memory.fixed_segments`).

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

__all__ = ["PoolsHost", "StreamPools"]


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
        segments (``blocks``, :func:`fsdpviz.cost.memory.fixed_segments`)."""
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
