"""FSDP1's own steps of :class:`~fsdpviz.cost.memory_walker.Walker`: CPU offload's copy of a
shard to the device, ``NO_SHARD``'s copy of the parameters it computes on (see [Note: NO_SHARD's
copies]), the post-backward reduction of a FlatParameter's gradient, the original parameters'
gradient views it makes (see [Note: a unit run twice under parameter mixed precision]
FSDP1 registers a unit's post-backward hook on the ``AccumulateGrad`` node of its first forward
(``_register_post_backward_hook``: ``flat_param.expand_as(flat_param)``, once per backward).
Under parameter mixed precision each forward that runs the unit makes an ``AccumulateGrad`` of
its own (torch's comment there): the last forward's gradient, whose backward runs first,
becomes ``.grad``; the first forward's node adds its gradient into ``.grad`` in place, and the
hook, passed that incoming gradient, holds it until it returns: one more unsharded gradient in
the compute dtype through the reshard and the reduction (beside the cast to the reduce dtype
and its reduce-scatter input). Without it the forwards share one node, which gets their sum.
A forward under ``no_grad`` builds no graph: no node, no gradient (only those with grad count).
Under gradient accumulation a micro-step adds each forward's gradient into the one an earlier
micro-step left, and frees it: the trace, computing without FSDP (one node), holds the last
forward's gradient in autograd's buffer from the end of that forward's backward until the
first's is added to it, as temporaries the walk takes out of the stretches in between. The
trace measures each stretch's peak without them (``StepProfile.peak_unbuffered``, see
:class:`~fsdpviz.trace.probe_records.CallGradients`), which the walk takes where it has it:
the peak of a stretch may come before the gradient is held (a last call checkpointed: its
backward, after its recomputation's unshard, is a stretch of its own, whose peak is its
flat gradient's concatenation, with the first call's activations still alive), where taking
the held gradient out of the stretch's peak was low by the activations the first call's
backward frees. Reports saved before it was measured take it out of the peak.

[Note: gradient views of the original parameters]) and the final
callback's cast under ``keep_low_precision_grads``. :class:`FSDP1Steps` is that part of the
walker (a mixin, typed by :class:`FSDP1Host`).

[Note: NO_SHARD's copies]
``NO_SHARD`` issues no collective, yet ``_unshard`` runs ``pre_unshard`` (``_flat_param.py``)
each time the unit unshards (its pre-forward, its pre-backward and prefetches by another unit's
hooks), and it may make a copy of the parameters that the unit then computes on:

- with parameter mixed precision, the low-precision shard ``_mp_shard``
  (``_use_low_precision_shard``), which for ``NO_SHARD`` is the unsharded parameter itself:
  kept through the compute and freed by the reshard (``post_reshard`` ->
  ``_free_low_precision_sharded_param``, a ``resize_(0)`` of its storage, which frees it
  though autograd holds views of it). Its own events mark both: ``cast`` where it is made
  and ``free`` where the reshard frees it. Under CPU offload, the host shard's copy to the
  device (``_local_shard.to(device)``) is made after ``_mp_shard`` is allocated, cast into
  it and dropped at once.
- under CPU offload without it, the host parameters' copy to the device (``flat_param_to``),
  at the ``h2d`` event: a plain tensor, which the reshard (``_use_sharded_flat_param``) only
  stops pointing at. With ``use_orig_params=False`` a forward unshard hands the module views
  of it (``_use_unsharded_views(as_params=False)``), which nothing replaces until the unit's
  next forward unshard: each forward copy lives through the iteration into the next one, to
  the next forward copy of its unit, which is made before the views move to it. A backward
  unshard makes no views: its copy lives until the unit's reshard (its post-backward hook,
  or the final callback's catch-all reshard).
- the same copies with ``use_orig_params=True``: every unshard, forward and backward, hands
  the module views of its copy (``_use_unsharded_views(as_params=False)``): the forward's
  are kept in ``flat_param._tensors`` and the backward's rebind them (``tensor.data =
  view``), so the copy a unit's last unshard made lives until its next one makes another
  (the backward copy into the next iteration, to the next forward copy). The reshard only
  points the original parameters at the host shard (``_use_sharded_views``). The forward
  copy outlives its views' rebinding: autograd's saved tensors derived from the views
  (``mm``'s transposed weight, ``weight.t()``, a view of its own) hold it until the
  backward node that saved them runs, in the unit's backward. Its storage goes when the
  last of them runs, the backward of the unit's first such module in forward (a block's
  first projection; a root's output projection, computed after its nested units, where
  its modules before them save no such view, as an embedding saves none). The trace
  sees that moment (:class:`~fsdpviz.trace.probe_records.SavedParamViews`: the stretch in
  which the last saved view of the unit's parameters is freed, and the stretch's peak as
  it stood then, ``HookCall.param_views_freed``): the copy is held to that peak and
  dropped there, before the rest of the stretch (the flat gradient's concatenation after
  a layer's first projection's backward). A unit whose forward saved no such view (each
  of its modules checkpointed: ``torch.utils.checkpoint`` saves their inputs, and the
  views its recomputation saves are the backward copy's) holds its forward copy by the
  views alone: the backward unshard's rebinding drops it, once the backward copy is made.
  Reports saved before the trace measured saved views drop it at the end of the first
  stretch of compute after the unit's pre-backward hook (the whole backward of a unit without
  nested units; a root's before its nested units' backward), else (no compute measured)
  at its post-backward hook. A unit run more than once in forward makes a copy each time:
  the second forward's views replace the first's in ``flat_param._tensors``, and the
  backward unshard rebinds those only, so the last forward's copy is held by its saved
  views alone, an earlier forward's by all it saved of the parameters (its parameters'
  views too, a norm's weight its multiply saved), freed later in the unit's backward. The
  trace records each forward call's moment apart (``"{unit}#{k}"`` in
  ``HookCall.param_views_freed``), and each copy is dropped at its own. A forward call that
  saved nothing of the parameters (checkpointed, or run under ``no_grad``) has no such
  moment: its copy is held by the views alone and goes when they move off it, at the next
  forward's unshard (the backward unshard's, for the last forward). Reports saved
  before it was recorded hold every forward copy to the unit's last saved view: an upper
  bound by up to one copy, noted.

Both are ``unsharded_params`` (the parameters the unit computes on), made on the pre-unshard
stream (its pool, [Note: stream pools]).

[Note: the shard's copy the original parameters view]
A sharded unit under CPU offload with ``use_orig_params=True`` (without parameter mixed
precision, whose ``_use_low_precision_shard`` moves no view): ``pre_unshard`` copies the host
shard to the device by ``flat_param_to``, which points the original parameters at the copy
(``_use_sharded_views``, the views "may have changed storage"). The unshard then hands the
module views of the unsharded parameter, but the original parameters (``flat_param._params``)
keep their views of the copy: it lives past the all-gather, until the next
``_use_sharded_views``, the unit's reshard (``_use_sharded_flat_param``), or the next copy. A
post-forward reshard of ``SHARD_GRAD_OP`` (and ``_HYBRID_SHARD_ZERO2``) skips it while grad is
enabled (``skip_use_sharded_views``): the forward copy lives into backward, to the pre-backward's
copy (``SHARD_GRAD_OP`` gathers nothing in backward) or the post-backward's reshard. The root
under ``FULL_SHARD`` is not freed after forward, yet its post-forward reshard moves the views.
Counted with the sharded parameters, on the pre-unshard stream.

[Note: gradient views of the original parameters]
With ``use_orig_params=True`` the post-backward hook, once the unit's gradient is reduced
(and cast), points each original parameter's ``.grad`` at its part of the gradient shard
(``_post_reduce_grad_callback`` -> ``_use_sharded_grad_views``, ``_flat_param.py``). Under
``keep_low_precision_grads`` it does not assign the view directly (it may be of another dtype):
a parameter without a gradient is first given ``torch.empty_like(param)``, of the
parameter's part of the shard in the parameters' dtype (the whole parameter under
``NO_SHARD``), whose storage ``param.grad.data = view`` frees at once: one parameter's
part at a time, beside the reduction's temporaries (``_reduce_grad``'s locals and the
autograd gradient the hook holds), the reduced shard and its cast (the output it was cast
from freed). The parameters have a gradient after the unit's first reduction since
``zero_grad(set_to_none=True)`` and after a micro-step under ``no_sync`` (views of the
unsharded gradient, ``_use_unsharded_grad_views``): then nothing is made. The most of one
parameter's part on any rank is ``UnitBytes.grad_views``, counted with the gradient
shards, on the post-backward stream (HSDP's all-reduce stream, where the callback runs).

[Note: unsharded gradient views of the original parameters]
Under ``no_sync`` with ``use_orig_params=True`` the post-backward hook, once it resharded (and
prefetched, ``BACKWARD_POST``), gives each original parameter a view of the unsharded
gradient (``_use_unsharded_grad_views``): where the parameter's shape or dtype is not the
view's and it has no gradient, ``param.grad = torch.empty_like(param)`` first, whose
storage ``param.grad.data = view`` frees at once. A sharded unit's parameter is its 1-D part
of the rank's shard, in the parameters' dtype: each part in turn (a 1-D parameter whole in
the shard, in a unit computing in its parameters' dtype, gets the view itself). Under
``NO_SHARD`` the parameter is whole and the view in the compute dtype: with bf16 parameters
each parameter in turn. Frozen parameters too (the views cover the FlatParameter). The
most, ``UnitBytes.unsharded_grad_views`` (the most any rank has, an upper bound where the
ranks' parts differ), beside the gradient the hook holds, on the compute stream. Only where
the unit's parameters have no gradient: its first micro-step since
``zero_grad(set_to_none=True)``.

[Note: gradient bases kept by the original parameters]
Under ``no_sync`` with ``use_orig_params=True`` the post-backward hook gives the original
parameters views of the unsharded gradient (``_use_unsharded_grad_views``): a parameter whose
shape and dtype are the view's gets the view itself (``param.grad = view``, a view whose base
is the tensor in ``flat_param.grad``), the others ``empty_like`` with the view's data. The
hook has resharded the unit first (``reshard`` switches to the sharded views even where it
keeps the unsharded parameter, ``SHARD_GRAD_OP`` under ``no_sync``): a parameter is a 1-D
slice of the shard in the parameters' dtype, so a trainable 1-D parameter whole in the
rank's shard, in a unit computing in its parameters' dtype, gets the view. The last
micro-step accumulates into that tensor in place; its hook moves the tensor's data to the
copy in the reduce dtype where that differs (``flat_param.grad.data =
flat_param.grad.to(reduce_dtype)``) and drops ``flat_param.grad``. Under
``keep_low_precision_grads`` ``_use_sharded_grad_views`` points each gradient at its part of
the shard by ``param.grad.data = ...``, which keeps the view's base: the tensor, its storage
the copy in the reduce dtype (else the unsharded gradient), is alive until ``zero_grad``
frees the gradients, through the optimizer step. Without ``keep_low_precision_grads`` it
assigns new views (``param.grad = ...``) and the tensor is freed with the hook. The units
that keep it differ by rank (``UnitBytes.grad_base``: those of the rank that keeps the most
of them, beside the optimizer states of the rank that keeps the most states, an upper bound
where those are two ranks); it is counted with the unsharded gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fsdpviz.cost.hook_calls import HookCall, Tape
from fsdpviz.cost.memory_records import Block
from fsdpviz.cost.optimizers import optimizer_spec
from fsdpviz.cost.sizes import UnitBytes, fsdp1_grad_dtype
from fsdpviz.schema.events import Event
from fsdpviz.schema.report import Report

__all__ = ["FSDP1Host", "FSDP1Steps", "low_precision_grads_notes"]


class FSDP1Host(Protocol):
    """What FSDP1's steps read and change of the walker they are part of.

    ``NO_SHARD`` under CPU offload (see [Note: NO_SHARD's copies]): ``forward_copies``, each
    unit's device copy of its host parameters that its views hold since its last forward
    unshard (with ``use_orig_params=True``, since its last unshard, the views moving at
    every one); ``backward_copies``, the one its backward unshard made, until its reshard;
    ``saved_copies``, with ``use_orig_params=True``, this iteration's forward copies that
    autograd's saved views hold into the unit's backward (``forward_copied``: the units
    copied in forward); ``_views_freed``: the units whose last saved view the trace saw
    freed (:attr:`HookCall.param_views_freed`), ``_dropping`` those it did not see, their
    pre-backward run: dropped after the compute that follows.
    """

    tape: Tape
    _live: dict[str, dict[Block, int]]
    _views_freed: set[str]
    _by_call: set[str]
    _dropping: set[str]
    cat: dict[str, int]
    sizes: dict[str, UnitBytes]
    copied: dict[str, int]
    reduced: set[str]
    blocks: dict[str, list[tuple[Block, int]]]
    _event_index: int
    forward_copies: dict[str, tuple[Block, int]]
    backward_copies: dict[str, tuple[Block, int]]
    saved_copies: dict[str, list[tuple[Block, int]]]
    forward_copied: set[str]
    orig_views: bool
    notes: list[str]
    _forwards: dict[str, int]
    _traced_grads: dict[str, int]
    _arriving: dict[str, int]
    tp: int
    _buffered: dict[str, int]
    _buffering: dict[str, int]
    _backward_seen: set[str]
    shard_copies: dict[str, tuple[Block, int]]
    _views_after_forward: set[str]
    _held: set[str]
    _accumulating: set[str]
    replicas: int
    fsdp2: bool
    sync: bool
    grads: dict[str, int]

    def _moment(self, where: str, c: HookCall | None, e: Event | None = None) -> None: ...
    def _add(self, category: str, pool: str, n: int) -> None: ...
    def _alloc(self, category: str, pool: str, block: Block, n: int) -> None: ...
    def _free(self, category: str, pool: str, block: Block, n: int) -> None: ...
    def _add_shard(
        self, e: Event, n: int, pool: str, replaced: tuple[Block, int] | None = None
    ) -> None: ...
    def _grad_pool(self, e: Event, s: UnitBytes) -> str: ...
    def _drop_shard(self, unit: str, kept: int = 0) -> None: ...
    def _orig_grad_views(self, e: Event, s: UnitBytes, cast: int) -> None: ...
    def _unsharded_grad_views(self, c: HookCall) -> None: ...
    def _orig_params_copy(self, e: Event, s: UnitBytes, c: HookCall) -> None: ...
    def _drop_saved_copies(self, unit: str) -> None: ...
    def _drop_saved_copy(self, unit: str, call: int) -> None: ...
    def _viewed_shard_copy(self, e: Event, s: UnitBytes, c: HookCall) -> None: ...
    def _first_forward_gradient(self, c: HookCall) -> None: ...
    def _saves_views(self, unit: str, call: int | None = None) -> bool: ...
    def _buffered_gradients(self, c: HookCall) -> tuple[int, int]: ...
    def _drop_shard_copy(self, unit: str) -> None: ...
    def _no_shard_reshard(self, unit: str) -> None: ...
    def _stretch_peak(
        self, c: HookCall, at_peak: Sequence[int], in_place: Sequence[int] | None, less: int = 0
    ) -> None: ...


class FSDP1Steps:
    """FSDP1's steps of the walker (its state: see :class:`FSDP1Host`)."""

    forward_copies: dict[str, tuple[Block, int]]
    backward_copies: dict[str, tuple[Block, int]]
    saved_copies: dict[str, list[tuple[Block, int]]]
    forward_copied: set[str]
    _dropping: set[str]
    _views_freed: set[str]
    _by_call: set[str]
    shard_copies: dict[str, tuple[Block, int]]
    _views_after_forward: set[str]
    _buffered: dict[str, int]
    _buffering: dict[str, int]
    _backward_seen: set[str]
    _traced_grads: dict[str, int]

    def _fsdp1_setup(self: FSDP1Host, tape: Tape, report: Report) -> None:
        """FSDP1's own state at the start of a walk: CPU offload's copies the views hold,
        none yet (see :class:`FSDP1Host`); the units whose post-forward reshard moves the
        original parameters' views; how many times each unit runs in forward with grad
        enabled (a forward under ``no_grad`` makes no ``AccumulateGrad`` of its own)."""
        self.shard_copies = {}
        self._buffered, self._buffering = {}, {}
        self._backward_seen = set()
        self._forwards = {}
        for c in tape.calls:  # a forward under no_grad (its argument: grad mode) makes no
            if c.hook == "pre_forward" and c.arg is not False:  # gradient of its own
                self._forwards[c.unit] = self._forwards.get(c.unit, 0) + 1
        # each unit's gradient as the trace measured it (with use_orig_params=True, with the
        # alignment padding between parameters)
        self._traced_grads = {u: n for c in (*tape.calls, tape.tail) for u, n in c.grads.items()}
        reshard = ("FULL_SHARD", "HYBRID_SHARD")
        self._views_after_forward = {
            u.module for u in report.units if u.sharding_strategy in reshard
        }
        self.forward_copies = {}
        self.backward_copies = {}
        self.saved_copies = {}
        self.forward_copied = set()
        self._dropping = set()
        self._views_freed = {u for c in (*tape.calls, tape.tail) for u in c.param_views_freed}
        self._by_call = {u.partition("#")[0] for u in self._views_freed if "#" in u}

    def _carried_copies(self: FSDP1Host, copies: dict[str, int]) -> None:
        """The device copies the iteration before left, by unit: the copy the views hold
        (with ``use_orig_params=True``, the last unshard's, a backward one)."""
        phase = "backward" if self.orig_views else "forward"
        for unit, n in copies.items():
            self.forward_copies[unit] = (("h2d", unit, phase), n)
            self._add("unsharded_params", "pre_unshard", n)
            self._live["pre_unshard"][("h2d", unit, phase)] = n

    def _release_forward_copies(self: FSDP1Host, c: HookCall) -> None:
        """The forward copies whose last saved view the trace saw freed in the compute
        before ``c``: held to the stretch's peak as it stood then, a moment each, and
        dropped (see [Note: NO_SHARD's copies])."""
        freed = sorted((list(v), u) for u, v in c.param_views_freed.items())
        for at, key in freed:
            unit, _, call = key.partition("#")
            if unit not in self.saved_copies or (unit in self._by_call and not call):
                continue
            self._stretch_peak(c, at[:4], at[4:])
            if call:  # a unit run more than once in forward: that forward's copy
                self._drop_saved_copy(unit, int(call))
            else:
                self._drop_saved_copies(unit)

    def _copy_to_device(self: FSDP1Host, e: Event, s: UnitBytes, c: HookCall) -> None:
        """FSDP1 offloading a sharded unit: ``pre_unshard`` copies the host shard to the
        device for the all-gather; with parameter mixed precision the low-precision shard is
        made, the copy cast into it and dropped. With no all-gather after it (the root after
        forward, ``SHARD_GRAD_OP``'s backward) both are dropped at once (``post_unshard``).
        ``pre_unshard`` runs on the pre-unshard stream: its pool holds them."""
        if self.orig_views and not s.copy_in:
            self._viewed_shard_copy(e, s, c)
            return
        nxt = self._event_index + 1
        gathers = nxt in c.events and self.tape.events[nxt].kind == "all_gather"
        self._alloc("all_gather", "pre_unshard", ("in", e.unit), s.copy_in)
        self._alloc("all_gather", "pre_unshard", ("h2d", e.unit), s.h2d)
        self._moment("at", c, e)
        h2d = s.h2d if s.copy_in or not gathers else 0
        self._free("all_gather", "pre_unshard", ("h2d", e.unit), h2d)
        if gathers:
            self.copied[e.unit] = 0 if s.copy_in else s.h2d
        else:
            self._free("all_gather", "pre_unshard", ("in", e.unit), s.copy_in)

    def _viewed_shard_copy(self: FSDP1Host, e: Event, s: UnitBytes, c: HookCall) -> None:
        """The host shard's copy to the device that the original parameters view until the
        unit reshards, the copy before it dropped once it is made (see [Note: the shard's
        copy the original parameters view])."""
        block: Block = ("h2d", e.unit, self._event_index)
        self._alloc("sharded_params", "pre_unshard", block, s.h2d)
        self._moment("at", c, e)
        self._drop_shard_copy(e.unit)
        self.shard_copies[e.unit] = (block, s.h2d)

    def _drop_shard_copy(self: FSDP1Host, unit: str) -> None:
        old = self.shard_copies.pop(unit, None)
        if old is not None:
            self._free("sharded_params", "pre_unshard", *old)

    def _first_forward_gradient(self: FSDP1Host, c: HookCall) -> None:
        """A unit run more than once in forward under parameter mixed precision: its
        post-backward hook holds the first forward's gradient beside ``.grad`` (see [Note: a
        unit run twice under parameter mixed precision]), until it returns."""
        s = self.sizes.get(c.unit)
        if c.hook != "post_backward" or s is None or not s.copy_in:
            return
        if self._forwards.get(c.unit, 0) > 1 and c.unit not in self._accumulating:
            n = self._traced_grads.get(c.unit, s.grad) // self.tp
            self._arriving[c.unit] = self._arriving.get(c.unit, 0) + n
            self.cat["unsharded_grads"] += n

    def _buffered_gradients(self: FSDP1Host, c: HookCall) -> tuple[int, int]:
        """Under accumulation, the gradients of a unit run more than once under parameter
        mixed precision that the trace held in autograd's buffer in the compute before
        ``c`` and a real run added into ``.grad`` and freed (see [Note: a unit run twice
        under parameter mixed precision]): bytes at the stretch's peak, at its end."""
        consumed = c.unit if c.hook == "post_backward" else None
        peak = sum(self._buffered.values())
        end = sum(
            n for u, n in (*self._buffered.items(), *self._buffering.items()) if u != consumed
        )
        self._buffered.update(self._buffering)
        self._buffering.clear()
        self._buffered.pop(c.unit if consumed else "", None)
        s = self.sizes.get(c.unit)
        first = c.hook == "pre_backward" and c.unit not in self._backward_seen
        if first and s is not None and s.copy_in and self._forwards.get(c.unit, 0) > 1:
            self._backward_seen.add(c.unit)
            if c.unit in self._accumulating:
                self._buffering[c.unit] = self._traced_grads.get(c.unit, s.grad) // self.tp
        return peak, end

    def _reshard_copies(self: FSDP1Host, c: HookCall) -> None:
        """The device copies of the host parameters a reshard in hook ``c`` drops (see [Note:
        NO_SHARD's copies] and [Note: the shard's copy the original parameters view])."""
        if c.hook in ("post_backward", "post_backward_reshard_only"):
            self._no_shard_reshard(c.unit)
            self._drop_shard_copy(c.unit)
        elif c.hook == "final_callback":  # the catch-all reshard, the rest
            for u in [*self.backward_copies, *self.saved_copies]:
                self._no_shard_reshard(u)
            for u in list(self.shard_copies):
                self._drop_shard_copy(u)
        elif c.hook == "post_forward" and c.unit in self._views_after_forward:
            self._drop_shard_copy(c.unit)

    def _no_shard_copy(self: FSDP1Host, e: Event, s: UnitBytes, c: HookCall) -> None:
        """A ``NO_SHARD`` unit's ``cast``, ``free`` or ``h2d`` event: see [Note: NO_SHARD's
        copies]."""
        if e.kind == "cast":
            self._alloc("unsharded_params", "pre_unshard", ("cast", e.unit), s.copy_in)
            if s.h2d:  # offloaded: the host shard's copy, cast into it and dropped
                self._alloc("unsharded_params", "pre_unshard", ("h2d", e.unit), s.h2d)
                self._moment("at", c, e)
                self._free("unsharded_params", "pre_unshard", ("h2d", e.unit), s.h2d)
        elif e.kind == "free":
            self._free("unsharded_params", "pre_unshard", ("cast", e.unit), s.copy_in)
        elif e.kind == "h2d" and not s.copy_in and self.orig_views:
            self._orig_params_copy(e, s, c)
        elif e.kind == "h2d" and not s.copy_in:
            copies = self.forward_copies if e.phase == "forward" else self.backward_copies
            block: Block = ("h2d", e.unit, e.phase)
            old = copies.pop(e.unit, None)
            again = e.phase == "forward" and e.unit in self.forward_copied
            call = len(self.saved_copies.get(e.unit, []))  # the old copy's forward call
            if old is not None and again and self._saves_views(e.unit, call):
                # run again in forward: the views move, and the tensors the forward before
                # saved (views of its copy) hold that copy into the unit's backward
                self.saved_copies.setdefault(e.unit, []).append(old)
                block = (*block, len(self.saved_copies[e.unit]))
            elif old is not None:  # the unit's views move from the old copy to the new one
                self._add("unsharded_params", "pre_unshard", s.h2d)
                self._moment("at", c, e)
                self._add("unsharded_params", "pre_unshard", -s.h2d)
                # the old block freed, then the new one (of the same name: what the replay
                # of the allocator's segments pairs, iteration after iteration)
                self._free("unsharded_params", "pre_unshard", *old)
                if again and e.unit in self._by_call:  # a forward that saved nothing of it
                    self.saved_copies.setdefault(e.unit, []).append((old[0], 0))
                    block = (*block, len(self.saved_copies[e.unit]))
            self._alloc("unsharded_params", "pre_unshard", block, s.h2d)
            copies[e.unit] = (block, s.h2d)
            if e.phase == "forward":
                self.forward_copied.add(e.unit)

    def _saves_views(self: FSDP1Host, unit: str, call: int | None = None) -> bool:
        """Whether the unit's forward saved views of its parameters for backward (unknown in
        reports saved before the trace measured them: taken as saved). ``call``: of a unit
        run more than once in forward, whether that forward call (counted from 0) saved
        any of them (what holds its copy: see [Note: NO_SHARD's copies])."""
        if not self.tape.views_measured:
            return True
        if call is not None and unit in self._by_call:
            return f"{unit}#{call}" in self._views_freed
        return unit in self._views_freed

    def _orig_params_copy(self: FSDP1Host, e: Event, s: UnitBytes, c: HookCall) -> None:
        """A ``NO_SHARD`` unit's ``h2d`` event with ``use_orig_params=True``: its views move
        to the new copy; the copy they leave is dropped, but a forward copy of this
        iteration, which autograd's saved views hold into the unit's backward (see [Note:
        NO_SHARD's copies])."""
        old = self.forward_copies.pop(e.unit, None)
        saved = self.saved_copies.setdefault(e.unit, [])
        # a trace that measured saved views and saw none of the unit's freed: its forward
        # saved none (each module checkpointed, or none saves one): nothing holds the copy;
        # of a unit run more than once in forward, the old copy's own forward call
        forward = old is not None and old[0][2] == "forward" and e.unit in self.forward_copied
        held = self._saves_views(e.unit, len(saved))
        if old is not None and forward and held:
            saved.append(old)
        elif old is not None:
            self._add("unsharded_params", "pre_unshard", s.h2d)
            self._moment("at", c, e)
            self._add("unsharded_params", "pre_unshard", -s.h2d)
            self._free("unsharded_params", "pre_unshard", *old)
            if forward and e.unit in self._by_call:  # left in place, of no bytes, to keep
                saved.append((old[0], 0))  # the calls' order (_drop_saved_copy)
        block: Block = ("h2d", e.unit, e.phase)
        if any(b == block for b, _ in saved):  # a second forward copy beside the first
            block = (*block, len(saved))
        if block != ("h2d", e.unit, e.phase) and e.unit not in self._by_call:
            note = (
                f"unit {e.unit!r} runs more than once in forward (NO_SHARD, CPU offload, "
                "use_orig_params=True): each forward copy of its parameters is held until "
                "the last view any of its forwards saved is freed, an upper bound by up to "
                "one copy (the last forward's copy goes when its own saved views do)"
            )
            if note not in self.notes:
                self.notes.append(note)
        if not saved:
            del self.saved_copies[e.unit]
        if e.phase == "forward":
            self.forward_copied.add(e.unit)
        self._alloc("unsharded_params", "pre_unshard", block, s.h2d)
        self.forward_copies[e.unit] = (block, s.h2d)

    def _drop_saved_copy(self: FSDP1Host, unit: str, call: int) -> None:
        """``use_orig_params=True``: the copy forward call ``call`` of a unit run more than
        once in forward made, dropped once what that forward saved of it is freed (see
        [Note: NO_SHARD's copies]); left in place, of no bytes, to keep the calls' order."""
        saved = self.saved_copies.get(unit, [])
        if call < len(saved):
            self._free("unsharded_params", "pre_unshard", *saved[call])
            saved[call] = (saved[call][0], 0)

    def _drop_saved_copies(self: FSDP1Host, unit: str) -> None:
        """``use_orig_params=True``: the unit's forward copies autograd's saved views held,
        dropped as its backward ran (see [Note: NO_SHARD's copies])."""
        for old in self.saved_copies.pop(unit, []):
            self._free("unsharded_params", "pre_unshard", *old)

    def _no_shard_reshard(self: FSDP1Host, unit: str) -> None:
        """A ``NO_SHARD`` unit's reshard in backward drops its backward copy of the host
        parameters (see [Note: NO_SHARD's copies]), and what is left of its forward copies
        with ``use_orig_params=True``."""
        old = self.backward_copies.pop(unit, None)
        if old is not None:
            self._free("unsharded_params", "pre_unshard", *old)
        self._drop_saved_copies(unit)

    def _keep_low_precision(self: FSDP1Host, c: HookCall) -> None:
        """FSDP1's final callback with ``keep_low_precision_grads``: each unit reduced in this
        backward casts its gradient shard to the compute dtype (``prepare_gradient_for_optim``,
        the units in order), the shard it replaces freed once cast. The final callback runs
        on the compute stream: the cast is that stream's."""
        for unit in [u for u in self.sizes if u in self.reduced]:
            s = self.sizes[unit]
            if not s.grad_kept:
                continue
            self._add("sharded_grads", "compute", s.grad_kept)
            self._moment("at the cast of the gradient shard to the compute dtype in", c)
            self._add("sharded_grads", "compute", -s.grad_kept)
            self._drop_shard(unit, s.grad_kept)

    def _orig_grad_views(self: FSDP1Host, e: Event, s: UnitBytes, cast: int) -> None:
        """The post-backward hook's gradient views of the original parameters, after the
        reduction and its ``cast`` (the output freed once cast), the temporaries alive: see
        [Note: gradient views of the original parameters]. Only a unit's first reduction
        since ``zero_grad`` makes them, after no micro-step under ``no_sync`` (whose
        post-backward gave the parameters views of the unsharded gradient)."""
        if not s.grad_views or e.unit in self.reduced or e.unit in self._held:
            return
        if e.unit in self._accumulating:
            return
        pool = (
            "all_reduce" if self.replicas > 1 and e.kind == "reduce_scatter" else "reduce_scatter"
        )
        output = s.reduced_shard if cast else 0
        self._add("sharded_grads", self._grad_pool(e, s), cast)
        self._add("sharded_grads", "reduce_scatter", -output)
        self._add("sharded_grads", pool, s.grad_views)
        self._moment("at the gradient views of the original parameters in", None, e)
        self._add("sharded_grads", pool, -s.grad_views)
        self._add("sharded_grads", "reduce_scatter", output)
        self._add("sharded_grads", self._grad_pool(e, s), -cast)

    def _unsharded_grad_views(self: FSDP1Host, c: HookCall) -> None:
        """The end of a post-backward hook under ``no_sync``: see [Note: unsharded gradient
        views of the original parameters]."""
        s = self.sizes.get(c.unit)
        if self.fsdp2 or self.sync or s is None or not s.unsharded_grad_views:
            return
        if c.unit in self._accumulating or c.unit not in self.grads:
            return  # its parameters have a gradient; or it made none (frozen)
        self._add("unsharded_grads", "compute", s.unsharded_grad_views)
        self._moment("at the gradient views of the original parameters in", c)
        self._add("unsharded_grads", "compute", -s.unsharded_grad_views)

    def _reduce_fsdp1(self: FSDP1Host, e: Event, s: UnitBytes, grads: int) -> None:
        """FSDP1's post-backward reduction of a FlatParameter's gradient (``grads`` bytes),
        ``_post_backward_hook``: the gradient cast to the reduce dtype, padded to a multiple
        of the shard ranks (``_get_reduce_scatter_tensors``), the reduce-scatter output (a
        shard in the reduce dtype) and its cast to the parameters' dtype are made beside it
        (:class:`~fsdpviz.cost.sizes.UnitBytes`), and every one of them but the shard kept
        is freed when the hook returns, the gradient too, and the incoming gradient the hook
        is passed where it is not ``.grad`` (a post hook of the ``AccumulateGrad`` node; under
        ``no_sync`` it was added into ``.grad``): nothing of it outlives the hook (on a GPU
        the caching allocator keeps the gradient's block from reuse until the reduction is
        done, ``record_stream``, but it no longer counts as allocated).
        ``NO_SHARD`` all-reduces in place and casts. The hook runs on the post-backward
        stream: its pool holds all but the gradient (autograd's, the compute stream's) and,
        under ``HYBRID_SHARD``, the shard's cast, made on the all-reduce stream."""
        temps = s.grad_cast + s.grad_pad
        # the parameters keep the copy in the reduce dtype, else the gradient itself: see
        # [Note: gradient bases kept by the original parameters]
        first = e.unit not in self.reduced and e.unit not in self._held
        base = s.grad_base and e.unit in self._accumulating and first
        kept = s.grad_cast if base else 0
        self._alloc("reduce_scatter", "reduce_scatter", ("rs", e.unit), temps - kept)
        self._alloc("reduce_scatter", "reduce_scatter", ("base", e.unit), kept)
        cast = (
            s.sharded_grad
            if e.kind == "reduce_scatter" and s.reduced_shard != s.sharded_grad
            else 0
        )
        pool = self._grad_pool(e, s)
        # the output, the shard the unit keeps where no cast follows it
        output: tuple[Block, int] = (("output" if cast else "grad", e.unit), s.reduced_shard)
        self._alloc("sharded_grads", "reduce_scatter", *output)
        if temps or s.reduced_shard:
            self._moment("at", None, e)
        if cast:
            self._add("sharded_grads", pool, cast)
            self._moment("at the cast of the reduced gradient shard in", None, e)
            self._add("sharded_grads", pool, -cast)
        self._orig_grad_views(e, s, cast)
        self._free("reduce_scatter", "reduce_scatter", ("rs", e.unit), temps - kept)
        self.cat["reduce_scatter"] -= kept
        self.cat["unsharded_grads"] += kept
        if not base or kept:
            self.cat["unsharded_grads"] -= grads
        # the incoming gradient the hook was passed beside ``.grad`` (an earlier micro-step's
        # or another forward's node's ``.grad``), let go with the hook's other tensors
        self.cat["unsharded_grads"] -= self._arriving.pop(e.unit, 0)
        self._add_shard(e, s.sharded_grad, pool, output)


def low_precision_grads_notes(report: Report, optimizer: str | int | None) -> list[str]:
    """The note that torch's optimizer ``optimizer`` fails at its step on the gradients FSDP1
    leaves under ``keep_low_precision_grads`` where they are in another dtype than their
    parameters (:func:`~fsdpviz.cost.sizes.fsdp1_grad_dtype`): Adam's and AdamW's updates
    (``exp_avg.lerp_(grad, ...)``, ``torch._foreach_lerp_``, ``torch._fused_adamw_``) and
    every fused step (``torch._fused_sgd_``) take a gradient of the parameter's dtype only.
    SGD's for-loop and foreach steps add the gradient into the float32 parameter and run."""
    if report.config.api != "FSDP1" or optimizer is None or isinstance(optimizer, int):
        return []
    if not (report.config.mixed_precision or {}).get("keep_low_precision_grads"):
        return []
    spec = optimizer_spec(optimizer)
    if not spec.adam and spec.implementation != "fused":
        return []
    differ = [
        (u.module, u.dtype, grad)
        for u in report.units
        if u.trainable[0] and (grad := fsdp1_grad_dtype(u, True)) != u.dtype
    ]
    if not differ:
        return []
    unit, param, grad = differ[0]
    which = "Adam and AdamW (every implementation)" if spec.adam else "fused optimizers"
    return [
        f"optimizer={optimizer!r} does not run on this plan: FSDP1 with MixedPrecision("
        f"keep_low_precision_grads=True) leaves {grad} gradients on {param} parameters "
        f"({len(differ)} unit{'s' if len(differ) > 1 else ''}, {unit!r} first), and torch's "
        f"{which} refuse them at optimizer.step() (RuntimeError: expected dtype float for "
        "`end` but got dtype ..., or expected scalar type Float but found ...); the step "
        "modelled here is the one it would take. Use keep_low_precision_grads=False, or "
        "an optimizer that takes them (SGD, for-loop or foreach: optimizer='sgd_momentum')"
    ]
