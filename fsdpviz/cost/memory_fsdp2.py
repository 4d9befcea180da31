"""FSDP2's own steps of :class:`~fsdpviz.cost.memory_walker.Walker`: torchao's float8
all-gather scales, resharding after forward onto fewer ranks (and the copy-in's copy of those
shards), the gradients' redistribution under tensor parallelism (a whole one's chunk, a
partial one's all-reduced copy or reduce-scattered chunk) and their cast to the reduce dtype
without gradient sync, the cast of the reduce output, HSDP's reduce-scatter output and
all-reduced buffer, and the chunk and cat of gradients sharded on a dim other than 0.
:class:`FSDP2Steps` is that part of the walker (a mixin, typed by :class:`FSDP2Host`).

[Note: float8 all-gather scales]
torchao's ``fsdp_pre_all_gather`` makes each float8 weight's scale (a float32 scalar) anew for
every all-gather, kept as FSDP's all-gather metadata until the copy-out's
``fsdp_post_all_gather`` sets it on the unsharded weight (``out._scale``), dropping the one it
had. Resharding frees the gathered bytes, not the scale: a unit gathered once keeps a scale a
weight. A forward saves the weight, scale and all, for its backward (unless an activation
checkpoint recomputes it), so a unit gathered again in backward holds its forward's scales
beside the new ones, each until the backward node that saved it has run (autograd then frees
its saved tensors: the float8 linear's backward, ``HookCall.scales_freed`` as the trace saw
it; they were held to the unit's post-backward, 20 to 28 B a unit high against
``FSDPMemTracker`` inside its backward). The scales of a unit in use count with its
unsharded parameters, the others (kept, all-gather metadata, saved) as temporaries of the phase
they are in (:meth:`FSDP2Steps._rescale`). With ``precompute_float8_dynamic_scale_for_fsdp``
after each optimizer step (steady state) every scale is a view of one float32 tensor it made,
one element a weight, held with the unsharded parameters throughout; no all-gather makes any.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Protocol

from fsdpviz.cost.grad_sizes import Upcast
from fsdpviz.cost.hook_calls import HookCall, Tape
from fsdpviz.cost.memory_records import Block
from fsdpviz.cost.sizes import UnitBytes
from fsdpviz.schema.events import Event

__all__ = ["FSDP2Host", "FSDP2Steps"]


class FSDP2Host(Protocol):
    """What FSDP2's steps read and change of the walker they are part of."""

    sizes: dict[str, UnitBytes]
    cat: dict[str, int]
    fsdp2: bool
    replicas: int
    hsdp: bool
    in_backward: bool
    resident: set[str]
    grads: dict[str, int]
    upcast: dict[str, Upcast]
    placed: dict[str, tuple[int, ...]]
    tp_chunks: dict[str, Fraction]
    tp_ranks: int
    _cast: set[str]
    _fresh: dict[str, int]
    _reduce_ranks: dict[str, int]
    raf_int: dict[str, int]
    post_forward_shard: dict[str, int]
    stale: set[str]
    _all_reduced: dict[str, int]
    _shard_output: dict[str, bool]
    _held: set[str]
    reduced: set[str]
    _live: dict[str, dict[Block, int]]
    _added_into: set[str]
    _precomputed: bool
    _scales: dict[str, int]
    _gathering: set[str]
    _fwd_saved: set[str]
    _saved: dict[str, int]
    _scale_extra: int
    _scale_swap: int
    _saved_totals: dict[str, int] | None
    tape: Tape
    held: tuple[str, int] | None
    _recomputed: set[str]

    def _moment(self, where: str, c: HookCall | None, e: Event | None = None) -> None: ...
    def _all_reduce_partial_grad(self, e: Event, c: HookCall) -> None: ...
    def _scatter_partial_grad(self, e: Event, c: HookCall) -> None: ...
    def _pad_partial_grad(self, e: Event) -> None: ...
    def _partial_grad_sizes(self, e: Event) -> tuple[int, int, int] | None: ...
    def _add(self, category: str, pool: str, n: int) -> None: ...
    def _alloc(self, category: str, pool: str, block: Block, n: int) -> None: ...
    def _free(self, category: str, pool: str, block: Block, n: int) -> None: ...
    def _scale_temp(self) -> str: ...
    def _release_all_reduced(self, unit: str | None = None) -> None: ...
    def _grad_pool(self, e: Event, s: UnitBytes) -> str: ...
    def _add_shard(
        self, e: Event, n: int, pool: str, replaced: tuple[Block, int] | None = None
    ) -> None: ...
    def _regroups(self, unit: str) -> bool: ...


class FSDP2Steps:
    """FSDP2's steps of the walker."""

    _scale_swap = 0  # see _extra_scales
    _saved_totals: dict[str, int] | None = None  # see _forward_saved
    held: tuple[str, int] | None = None  # see _release_held

    def _release_held(self: FSDP2Host, unit: str | None = None) -> None:
        """The all-gather buffer a copy-out in ``FORWARD`` keeps (``comm_ctx.all_gather_state``)
        let go, as the next such copy-out or the forward root's post-forward lets it go
        (``unit``: the root's, a recompute's). A recompute that runs a group before its
        pre-backward (a checkpointed region that runs it and more) gathers it in ``FORWARD``,
        keeps the buffer, and is its forward's root (``iter_forward_root``): the group's
        post-forward in backward lets it go."""
        if self.held is not None:
            self._free("all_gather", "all_gather", ("out", self.held[0]), self.held[1])
            self.held = None
        self._recomputed.discard(unit or "")

    def _scales_out(self: FSDP2Host, unit: str, s: UnitBytes, gathered: bool, c: HookCall) -> int:
        """The copy-out of ``unit`` (``fsdp_post_all_gather``): its new scales replace those
        it had, which its forward's saved tensors keep if its backward gathered it again
        (see [Note: float8 all-gather scales]). The bytes of those it lets go, alive through
        the copy-out's split of the all-gather output (``foreach_all_gather_copy_out``),
        which comes before ``init_unsharded_param`` replaces them."""
        dropped = 0
        if not s.scales or self._precomputed:
            return dropped
        if gathered and unit in self._gathering:
            self._gathering.discard(unit)
            saved = FSDP2Steps._forward_saved(self, unit, s)
            if self.in_backward and unit in self._fwd_saved and unit in self._scales and saved:
                self._saved[unit] = saved
            else:
                dropped = self._scales.get(unit, 0)
            self._fwd_saved.discard(unit)
            self._scales[unit] = s.scales
        if c.hook == "pre_forward" and not self.in_backward and s.scales_saved:
            self._fwd_saved.add(unit)
        return dropped

    def _forward_saved(self: FSDP2Host, unit: str, s: UnitBytes) -> int:
        """The bytes of the scales ``unit``'s forward saved for its backward: those the
        trace saw its backward let go (``HookCall.scales_freed``: a forward under an
        activation checkpoint, the model's own included, saves none), else (no profile, or one
        saved before it was measured, a pipeline's) one a float8 weight outside the
        checkpoints ``activation_checkpointing=`` applies."""
        if not self.tape.scales_measured:
            return s.scales_saved
        if self._saved_totals is None:
            totals: dict[str, int] = {}
            for c in [*self.tape.calls, self.tape.tail]:
                for u, f in c.scales_freed.items():
                    totals[u] = totals.get(u, 0) + f[1]
            self._saved_totals = totals
        return self._saved_totals.get(unit, 0)

    def _rescale(self: FSDP2Host) -> None:
        """Count the float8 scales besides those of the units in use (``_scale_extra``) in
        the temporaries of the phase: see [Note: float8 all-gather scales]."""
        extra = FSDP2Steps._extra_scales(self)
        self.cat[self._scale_temp()] += extra - self._scale_extra
        self._scale_extra = extra

    def _saved_freed(self: FSDP2Host, c: HookCall) -> int:
        """The forward's saved scales, replaced since, that the compute before ``c`` let go
        before its peak: out of the unsharded parameters where the unit is in use (see
        :meth:`_extra_scales`); the bytes of the others, out of the temporaries."""
        if not self._saved or not c.scales_freed:
            return 0  # (most calls: nothing saved, or nothing freed)
        freed = {
            u: min(f[0], self._saved[u]) for u, f in c.scales_freed.items() if u in self._saved
        }
        self.cat["unsharded_params"] -= sum(n for u, n in freed.items() if u in self.resident)
        return sum(n for u, n in freed.items() if u not in self.resident)

    def _release_saved(self: FSDP2Host, c: HookCall) -> int:
        """Drop the saved scales the compute before ``c`` let go; the bytes of the scales
        besides those in use after it (``_scale_extra``, in a temporary of the phase)."""
        for u, f in c.scales_freed.items() if self._saved else ():
            if u in self._saved:
                self._saved[u] = max(0, self._saved[u] - f[1])
        self._scale_extra = FSDP2Steps._extra_scales(self)
        return self._scale_extra

    def _extra_scales(self: FSDP2Host) -> int:
        """The bytes of the float8 scales besides those of the units in use. A unit in use
        whose forward's scales are still saved counts those with its unsharded parameters
        and its new ones as temporaries, as ``FSDPMemTracker`` sees them (the forward's were
        the parameter's when its pre-forward counted them; it first sees the new ones made
        by ``fsdp_pre_all_gather``, a temporary): the difference moves
        (``_scale_swap``)."""
        if not self._scales and not self._gathering and not self._saved:
            self.cat["unsharded_params"] -= self._scale_swap  # (no float8 scales: all 0)
            self._scale_swap = 0
            return 0
        extra = sum(n for u, n in self._scales.items() if u not in self.resident)
        extra += sum(self.sizes[u].scales for u in self._gathering)
        extra += sum(self._saved.values())
        swap = sum(n - self._scales.get(u, 0) for u, n in self._saved.items() if u in self.resident)
        self.cat["unsharded_params"] += swap - self._scale_swap
        self._scale_swap = swap
        return extra - swap

    def _scale_temp(self: FSDP2Host) -> str:
        return "backward_temp" if self.in_backward else "forward_temp"

    def _copy_in(self: FSDP2Host, unit: str, s: UnitBytes) -> int:
        """The copy-in's copy of ``unit``'s shards for its all-gather: their cast to the
        compute dtype (``UnitBytes.copy_in``), or, gathered from the post-forward shards of a
        group resharded after forward onto fewer ranks, their copy: the fast path of
        ``_get_param_all_gather_inputs`` (a parameter with a ``param_dtype`` to cast to, not
        offloaded) copies those shards, already in that dtype, into one flat buffer
        (``torch._foreach_copy_``), each ``shard ranks / post-forward ranks`` times its
        shard; offloaded, ``FSDPParam.all_gather_inputs`` takes them as they are (no copy)."""
        if unit not in self.post_forward_shard or unit in self.stale or not s.copy_in:
            return s.copy_in
        if s.h2d:
            return 0
        return s.copy_in * self._reduce_ranks[unit] // self.raf_int[unit]

    def _reshard_post_forward(self: FSDP2Host, e: Event, s: UnitBytes, raf: int, old: bool) -> None:
        """FSDP2 resharding a unit after forward onto ``raf`` ranks (its
        ``ReportConfig.post_forward_ranks``): ``FSDPParam.to_sharded_post_forward``, one
        parameter at a time, clones the rank's slice of the parameter's all-gather output,
        then frees that output (and with ``old``, the slice the iteration before left, see
        [Note: stale post-forward shards]). The moment the most is alive: the slices cloned
        so far beside the outputs (and old slices) not yet freed."""
        if not s.gathered_params:
            return
        best, at, cloned, freed = -1, 0, 0, 0
        for i, n in enumerate(s.gathered_params):
            cloned += n // raf
            if cloned - freed > best:
                best, at = cloned - freed, i
            freed += n + (n // raf if old else 0)
        clones = sum(n // raf for n in s.gathered_params[: at + 1])
        gone = sum(s.gathered_params[:at])
        olds = sum(n // raf for n in s.gathered_params[:at]) if old else 0
        self.cat["sharded_params"] += clones - olds
        self.cat["unsharded_params"] -= gone
        self._moment("at the reshard after forward onto fewer ranks in", None, e)
        self.cat["sharded_params"] -= clones - olds
        self.cat["unsharded_params"] += gone

    def _redistribute_grads(self: FSDP2Host, e: Event, c: HookCall, reducing: set[str]) -> None:
        """FSDP2's post-backward, before it reshards: each gradient left whole though its
        parameter is a tp shard (``UnitBytes.replicated_grads``) redistributed, the rank's
        chunk cloned beside it, the whole one freed as ``.grad`` lets go of it."""
        reducing.discard(e.unit)
        s = self.sizes.get(e.unit)
        if not self.fsdp2 or s is None or not s.replicated_grads or not self.grads.get(e.unit):
            return
        ratio = self.upcast[e.unit].ratio if e.unit in self._cast else 1.0
        for whole, chunk in s.replicated_grads:
            self.cat["unsharded_grads"] += round(chunk * ratio)
            self._moment("at the redistribution of a whole gradient to its shard, before", c, e)
            self.cat["unsharded_grads"] -= round(whole * ratio)
            self.grads[e.unit] -= round(whole * ratio) - round(chunk * ratio)

    def _all_reduce_partial_grad(self: FSDP2Host, e: Event, c: HookCall) -> None:
        """FSDP2's post-backward, past ``e`` (the event stands where the collective is
        issued): a replicated tp parameter's ``Partial()`` gradient all-reduced
        (``FSDPParam._get_grad_inner_tensor``: ``DTensor.redistribute``, whose functional
        all-reduce clones its input and reduces the clone), the result beside it until
        ``.grad = None`` lets go of it, before the next parameter's."""
        copy = e.nbytes or 0
        self.cat["unsharded_grads"] += copy
        self._moment("at the all-reduced copy of a partial gradient, after", c, e)
        self.cat["unsharded_grads"] -= copy

    def _accumulate_fresh(self: FSDP2Host, units: Iterable[str]) -> None:
        """The post-backward of each of ``units`` without gradient sync before: FSDP2 adds
        the new gradients into the accumulated ones, and frees them."""
        for u in units:
            if u in self._fresh:
                self.cat["unsharded_grads"] -= self._fresh.pop(u)

    def _callback_order(
        self: FSDP2Host, c: HookCall, finishing: list[str]
    ) -> list[tuple[tuple[str, ...], Sequence[int]]] | None:
        """FSDP2's root post-backward callback ``c`` runs the post-backward of each group
        whose own did not run (``finishing``: those that accumulate) in state order, the
        units' order: each unit as a step of its own, with its events (the post-backward's
        gradients added, its events, its gradients cast). ``None`` where nothing is split
        (FSDP1, nothing accumulating, events in another order)."""
        if not self.fsdp2 or not finishing:
            return None
        order = {u: i for i, u in enumerate(self._reduce_ranks)}
        by_unit: dict[str, list[int]] = {}
        for e in c.events:
            by_unit.setdefault(self.tape.events[e].unit, []).append(e)
        units = sorted({*by_unit, *finishing}, key=lambda u: order.get(u, -1))
        steps: list[tuple[tuple[str, ...], Sequence[int]]] = [
            ((u,) if u in finishing else (), by_unit.get(u, [])) for u in units
        ]
        if [e for _, evs in steps for e in evs] != list(c.events):
            return None
        return steps

    def _redistribute_partial_grad(self: FSDP2Host, e: Event, c: HookCall) -> None:
        """FSDP2's post-backward, past ``e``: a tp collective there turns a ``Partial()``
        gradient into the parameter's placement, all-reduced or reduce-scattered."""
        if e.kind == "tp_all_reduce":
            self._all_reduce_partial_grad(e, c)
        elif e.kind == "tp_reduce_scatter":
            self._scatter_partial_grad(e, c)

    def _partial_grad_sizes(self: FSDP2Host, e: Event) -> tuple[int, int, int] | None:
        """A post-backward's reduce-scatter ``e`` of a tp-sharded parameter's ``Partial()``
        gradient: the gradient's bytes, its first rank's chunk's, and what
        ``Shard._reduce_shard_tensor`` makes before it issues the collective where the tp
        ranks do not divide dim 0 (``_split_tensor(..., with_padding=True)``: each chunk
        shorter than the first padded, a copy, and their ``torch.cat``, the padded whole,
        which the event's bytes are); None for another event."""
        share = self.tp_chunks.get(e.module or "")
        padded = e.nbytes or 0
        if share is None or not padded or e.hook is None or e.kind != "tp_reduce_scatter":
            return None
        chunk = padded // self.tp_ranks
        if not chunk:
            return None
        whole = int(chunk / share)
        made = 0 if whole == padded else (self.tp_ranks - whole // chunk) * chunk + padded
        return whole, chunk, made

    def _pad_partial_grad(self: FSDP2Host, e: Event) -> None:
        """What :meth:`_partial_grad_sizes` says torch makes before it issues ``e``."""
        sizes = self._partial_grad_sizes(e) if self.fsdp2 else None
        if sizes is not None and self.grads.get(e.unit):
            self.cat["unsharded_grads"] += sizes[2]

    def _scatter_partial_grad(self: FSDP2Host, e: Event, c: HookCall) -> None:
        """FSDP2's post-backward, past ``e`` (the event stands where the collective is
        issued): a tp-sharded parameter's ``Partial()`` gradient (a batch of one's
        column-wise weight: DTensor's ``mm`` strategy), whole on the rank until now,
        reduce-scattered to its ``Shard(0)`` chunk (``FSDPParam._get_grad_inner_tensor``:
        ``DTensor.redistribute``, ``Partial._reduce_shard_value`` ->
        ``Shard._reduce_shard_tensor``: ``funcol.reduce_scatter_tensor`` makes the chunk
        beside its input), the whole one freed as ``.grad = None`` lets go of it, before the
        next parameter's. A dim 0 the tp ranks do not divide is padded first
        (:meth:`_pad_partial_grad`), its buffers let go of once the collective returns."""
        sizes = self._partial_grad_sizes(e)
        if sizes is None or not self.grads.get(e.unit):
            return
        whole, chunk, made = sizes
        self.cat["unsharded_grads"] += chunk
        self._moment("at the reduce-scattered chunk of a partial gradient, after", c, e)
        self.cat["unsharded_grads"] -= whole + made
        self.grads[e.unit] -= whole - chunk

    def _cast_to_reduce_dtype(self: FSDP2Host, unit: str, c: HookCall) -> None:
        """FSDP2's post-backward without gradient sync, after resharding: the unit's
        gradients cast to the reduce dtype one parameter at a time
        (``to_accumulated_grad_if_needed``), each compute-dtype one freed once cast."""
        up = self.upcast.get(unit)
        held = self.grads.get(unit, 0)
        if up is None or unit in self._cast or held == 0:
            return
        peak = up.cast_peak()
        self.cat["unsharded_grads"] += peak
        self._moment("at the cast of the gradients to the reduce dtype in", c)
        cast = round(held * up.ratio)
        self.cat["unsharded_grads"] += cast - held - peak
        self.grads[unit] = cast
        self._cast.add(unit)

    def _cast_reduce_output(self: FSDP2Host, e: Event, s: UnitBytes) -> tuple[Block, int] | None:
        """FSDP2 on a 1-D mesh, reducing in a dtype other than the parameters': the
        reduce-scatter output, in the reduce dtype, is cast to the parameters' dtype
        (``foreach_reduce``'s ``reduce_output = _to_dtype_if_needed(reduce_output,
        orig_dtype)``), both alive until the rebinding frees the first, which it returns
        (both on the reduce-scatter stream). Under HSDP the all-reduced buffer outlives the
        cast (:meth:`_hold_all_reduced`); with the shards offloaded the gradient's device
        copies are not modelled."""
        if not s.reduce_cast or not s.sharded_grad or self.hsdp:
            return None
        output = (("output", e.unit), s.reduce_cast)
        self._alloc("sharded_grads", "reduce_scatter", *output)
        self._add("sharded_grads", "reduce_scatter", s.sharded_grad)
        self._moment("at the cast of the reduced gradient shard in", None, e)
        self._add("sharded_grads", "reduce_scatter", -s.sharded_grad)
        return output

    def _hold_reduce_output(self: FSDP2Host, e: Event, s: UnitBytes) -> None:
        """FSDP2 HSDP's reduce-scatter: its output (the reduce dtype), which the all-reduce
        across the replicas reduces in place; ``foreach_reduce`` makes the unit's gradient
        shard of it only once that returns (:meth:`_hold_all_reduced`). The param group
        let go of the buffer it kept from its reduction before (``_wait_for_post_backward``,
        before ``foreach_reduce``). The output is the gradient shard itself where it is in
        the parameters' dtype, on the device, and the unit's new ``.grad``; otherwise the
        param group keeps it (``AllReduceState``, so that the allocator does not hand its
        block to the next reduce-scatter while the all-reduce may still run) until its next
        post-backward or the end of the backward (``finalize_backward``) beside the shard: a
        reduce dtype of its own, the shard offloaded to the host, or added into the ``.grad``
        an earlier micro-step left."""
        self._release_all_reduced(e.unit)
        block: Block = ("grad", e.unit)
        pool = self._grad_pool(e, s)
        new = e.unit not in self._held and e.unit not in self.reduced
        if s.partial == s.sharded_grad and new and block not in self._live.get(pool, {}):
            self._shard_output[e.unit] = True
        else:
            self._shard_output[e.unit] = False
            self._all_reduced[e.unit] = s.partial
            block = ("reduced", e.unit)
        self._alloc("sharded_grads", "reduce_scatter", block, s.partial)

    def _hold_all_reduced(self: FSDP2Host, e: Event, s: UnitBytes) -> None:
        """FSDP2 HSDP's all-reduce across the replicas: ``foreach_reduce`` makes the unit's
        gradient shard of the reduce-scatter output (:meth:`_hold_reduce_output`), the
        output itself where it is the shard, else a cast of it (or its copy to the host)
        beside it."""
        shard = self._shard_output.pop(e.unit, None) if self.fsdp2 else None
        if shard is None:
            return
        output = (("grad", e.unit), s.partial) if shard else None
        self._add_shard(e, s.sharded_grad, self._grad_pool(e, s), output)

    def _release_all_reduced(self: FSDP2Host, unit: str | None = None) -> None:
        for u in [unit] if unit is not None else list(self._all_reduced):
            n = self._all_reduced.pop(u, 0)
            self._free("sharded_grads", "reduce_scatter", ("reduced", u), n)

    def _regroups(self: FSDP2Host, unit: str) -> bool:
        """Whether ``foreach_reduce`` loops over its gradients (``world_size > 1``)."""
        return self._reduce_ranks.get(unit, 1) > 1

    def _chunk_cat(self: FSDP2Host, e: Event, grads: int) -> int:
        """FSDP2's reduction of gradients sharded on a dim other than 0 rebuilds each (see
        ``placed``): the most that is alive beside the gradients while it does, then what
        stays until the copy-in is done (the last parameter's copy), which it returns."""
        cats = self.placed.get(e.unit) if self._regroups(e.unit) and grads else None
        if not cats or not any(cats):
            return 0
        ratio = self.upcast[e.unit].ratio if e.unit in self._cast else 1.0
        most, kept = round(max(cats) * ratio), round(cats[-1] * ratio)
        self.cat["backward_temp"] += most
        self._moment("at the chunk and cat of the gradients for", None, e)
        self.cat["backward_temp"] -= most - kept
        return kept
