"""FSDP1's runtime state machine, emitting the events a rank issues.

This is a port of ``torch.distributed.fsdp._runtime_utils`` and
``_exec_order_utils`` (PyTorch 2.13) reduced to the state that decides
all-gathers, frees, prefetches and reductions: per handle ``_prefetched``,
``_needs_pre_forward_unshard``, ``_needs_pre_backward_unshard``,
``_ran_pre_backward_hook``, the training state, the pre-/post-forward order
indices (with FSDP's ``if handle._post_forward_index:`` quirk that treats index
0 as unset), and whether the padded unsharded FlatParameter is allocated.

The hooks are called by :mod:`fsdpviz.schedule.fsdp1_emulation` from real autograd on
a meta copy of the model, so the order in which they fire is torch's own.
Every call is logged so a later iteration whose hook order cannot differ can be
replayed without running the model again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from torch.distributed.fsdp import BackwardPrefetch

from fsdpviz.plan.fsdp1 import NO_RESHARD_AFTER_FORWARD, RESHARD_AFTER_FORWARD, PlannedUnit
from fsdpviz.schema.events import Event, Hook
from fsdpviz.schema.mesh import HYBRID_STRATEGIES


class TrainingState(enum.Enum):
    IDLE = "idle"
    FORWARD = "forward"
    BACKWARD_PRE = "backward_pre"
    BACKWARD_POST = "backward_post"


class Handle:
    """The emulated ``FlatParamHandle`` of one unit."""

    def __init__(self, unit: PlannedUnit, use_orig_params: bool) -> None:
        self.unit = unit
        self.name = unit.fqn
        self.sharded = unit.uses_sharded_strategy
        self.use_orig_params = use_orig_params
        self.requires_grad = unit.requires_grad
        self.unsharded_allocated = False
        self.using_sharded = True
        mp = unit.config.mixed_precision
        self.low_shard = bool(mp and mp.param_dtype not in (None, unit.dtype))
        # NO_SHARD with parameter mixed precision: whether ``_mp_shard``, the low-precision
        # copy it computes on, is allocated (made by ``pre_unshard``, freed by ``post_reshard``)
        self.cast_allocated = False
        self.skipped_sharded_views = False
        self.prefetched = False
        self.needs_pre_forward_unshard = False
        self.needs_pre_backward_unshard = False
        self.ran_pre_backward_hook = False
        self.training_state = TrainingState.IDLE
        self.pre_forward_order_index: int | None = None
        self.post_forward_index: int | None = None
        self.post_backward_registered = False


class UnitState:
    """The emulated ``_FSDPState`` of one FSDP instance (a unit, maybe without handle)."""

    def __init__(self, unit: PlannedUnit, handle: Handle | None, is_root: bool) -> None:
        self.unit = unit
        self.handle = handle
        self.is_root = is_root
        self.config = unit.config
        self.post_backward_callback_queued = False


# Called when FSDP would switch a handle to unsharded views in the forward
# (``_use_unsharded_views(as_params=False)``), which creates autograd nodes.
ViewsFn = Callable[[Handle], None]


class FSDP1Runtime:
    """One rank's FSDP1 runtime over the planned units."""

    def __init__(
        self, units: list[PlannedUnit], use_orig_params: bool, make_views: ViewsFn
    ) -> None:
        self.states: list[UnitState] = []
        for i, unit in enumerate(units):
            handle = Handle(unit, use_orig_params) if unit.has_params else None
            self.states.append(UnitState(unit, handle, is_root=i == 0))
        self.root = self.states[0]
        self.make_views = make_views
        self.pre_forward_order: list[Handle] = []
        self.post_forward_order: list[Handle] = []
        self.iteration = 0
        self.events: list[Event] = []
        self.log: list[tuple[str, int, bool]] = []
        self._hook: tuple[Hook, str] | None = None
        self._prefetching = False
        # each unit's grad mode at its last replayed pre-forward (:meth:`replay`)
        self._replay_grad: dict[int, bool] = {}
        # ``_sync_gradients`` of every FSDP state: False inside ``model.no_sync()`` (set by
        # whoever drives the runtime, per iteration: it is not part of the hook log)
        self.sync = True

    # ----------------------------------------------------------------- events
    def _emit(self, kind: Any, handle: Handle, phase: Any, group: Any = None) -> None:
        hook, hook_unit = self._hook or (None, None)
        self.events.append(
            Event(
                kind,
                handle.name,
                phase,
                self._prefetching and kind in ("all_gather", "cast"),
                hook,
                hook_unit,
                group=group,
            )
        )

    def take_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    # ------------------------------------------------------- unshard/reshard
    def _unshard(self, h: Handle) -> None:
        phase = "forward" if h.training_state == TrainingState.FORWARD else "backward"
        if h.unit.config.offload_params and h.unit.has_params and (h.using_sharded or h.low_shard):
            # pre_unshard copies the host shard to the device: when the FlatParameter points
            # at it, and on every unshard with parameter mixed precision (the low-precision
            # shard is made from it each time)
            self._emit("h2d", h, phase)
        if not h.sharded and h.low_shard and h.unit.has_params and not h.cast_allocated:
            # NO_SHARD computes on the low-precision copy (_use_low_precision_shard): made by
            # every unshard, freed by every reshard (post_reshard); no collective marks it
            self._emit("cast", h, phase)
            h.cast_allocated = True
        if h.sharded and not h.unsharded_allocated:
            self._emit("all_gather", h, phase)
            h.unsharded_allocated = True
        h.using_sharded = False
        in_forward = h.training_state == TrainingState.FORWARD
        if (
            h.use_orig_params
            and h.skipped_sharded_views
            and h.training_state == TrainingState.BACKWARD_PRE
        ):
            return
        if in_forward:
            self.make_views(h)

    def _reshard(self, h: Handle, free: bool, grad_enabled: bool = True) -> None:
        if h.use_orig_params:
            skip = (
                grad_enabled
                and h.training_state == TrainingState.FORWARD
                and h.unit.config.sharding_strategy in NO_RESHARD_AFTER_FORWARD
            )
            h.skipped_sharded_views = skip
        h.using_sharded = True
        if free and h.unsharded_allocated:
            phase = "forward" if h.training_state == TrainingState.FORWARD else "backward"
            self._emit("free", h, phase)
            h.unsharded_allocated = False
        if h.cast_allocated:  # NO_SHARD: post_reshard frees the low-precision copy
            phase = "forward" if h.training_state == TrainingState.FORWARD else "backward"
            self._emit("free", h, phase)
            h.cast_allocated = False
        h.prefetched = False

    def _prefetch(self, state: UnitState, h: Handle, backward: bool) -> None:
        target = self._handle_to_prefetch(state, h)
        if target is None:
            return
        prev = target.training_state
        target.training_state = TrainingState.BACKWARD_PRE if backward else TrainingState.FORWARD
        self._prefetching = True
        try:
            self._unshard(target)
        finally:
            self._prefetching = False
        target.training_state = prev
        target.prefetched = True

    def _handle_to_prefetch(self, state: UnitState, h: Handle) -> Handle | None:
        ts = h.training_state
        bp = state.config.backward_prefetch
        if (ts == TrainingState.BACKWARD_PRE and bp == BackwardPrefetch.BACKWARD_PRE) or (
            ts == TrainingState.BACKWARD_POST and bp == BackwardPrefetch.BACKWARD_POST
        ):
            idx = h.post_forward_index
            if idx is None or idx - 1 < 0:
                return None
            cand = self.post_forward_order[idx - 1]
            return cand if cand.needs_pre_backward_unshard and not cand.prefetched else None
        if ts == TrainingState.FORWARD and state.config.forward_prefetch:
            idx = h.pre_forward_order_index
            if idx is None or idx + 1 >= len(self.pre_forward_order):
                return None
            cand = self.pre_forward_order[idx + 1]
            return cand if cand.needs_pre_forward_unshard and not cand.prefetched else None
        return None

    def _should_free_in_backward(self, h: Handle) -> bool:
        """Under ``no_sync`` FSDP keeps the strategies that do not reshard after forward
        (``SHARD_GRAD_OP``, ``_HYBRID_SHARD_ZERO2``) unsharded through backward."""
        if not h.sharded:
            return False
        return self.sync or h.unit.config.sharding_strategy in RESHARD_AFTER_FORWARD

    # ------------------------------------------------------------- forward
    def is_recompute(self, index: int) -> bool:
        """True when the unit runs inside backward (activation-checkpoint recompute)."""
        h = self.states[index].handle
        return h is not None and h.training_state == TrainingState.BACKWARD_PRE

    def pre_forward(self, index: int, grad_enabled: bool) -> None:
        self.log.append(("pre_forward", index, grad_enabled))
        state = self.states[index]
        h = state.handle
        if state.is_root and state.config.forward_prefetch:
            for s in self.states:
                if s.handle is not None:
                    s.handle.needs_pre_forward_unshard = True
                    s.handle.prefetched = False
        if h is None:
            return
        if h.training_state == TrainingState.BACKWARD_PRE:
            return
        self._hook = ("pre_forward", h.name)
        if self.iteration == 0 and h.pre_forward_order_index is None:
            h.pre_forward_order_index = len(self.pre_forward_order)
            self.pre_forward_order.append(h)
        h.training_state = TrainingState.FORWARD
        if not h.prefetched:
            self._unshard(h)
        h.needs_pre_forward_unshard = False
        self._prefetch(state, h, backward=False)
        self._hook = None

    def needs_post_backward_hook(self, index: int, grad_enabled: bool) -> str | None:
        """The post-backward hook FSDP registers now: ``acc_grad``, ``reshard_only`` or None."""
        h = self.states[index].handle
        if not grad_enabled or h is None or h.post_backward_registered:
            return None
        if h.training_state == TrainingState.BACKWARD_PRE:
            return None
        h.post_backward_registered = True
        return "acc_grad" if h.requires_grad else "reshard_only"

    def post_forward(self, index: int, grad_enabled: bool, output_requires_grad: bool) -> None:
        self.log.append(("post_forward", index, output_requires_grad))
        state = self.states[index]
        h = state.handle
        if h is not None and h.training_state == TrainingState.BACKWARD_PRE:
            return
        if h is not None:
            self._hook = ("post_forward", h.name)
            if h.post_forward_index:
                self.post_forward_order.append(h)
            else:
                h.post_forward_index = len(self.post_forward_order)
                self.post_forward_order.append(h)
            free = not state.is_root and h.unit.config.sharding_strategy in RESHARD_AFTER_FORWARD
            self._reshard(h, free, grad_enabled)
        if grad_enabled:
            if state.is_root:
                state.post_backward_callback_queued = False
            if h is not None:
                h.needs_pre_backward_unshard = output_requires_grad
                h.ran_pre_backward_hook = False
        if h is not None:
            h.training_state = TrainingState.IDLE
        self._hook = None

    # ------------------------------------------------------------ backward
    def pre_backward(self, index: int) -> bool:
        """Returns True when the root's final callback must be queued now."""
        self.log.append(("pre_backward", index, False))
        state = self.states[index]
        h = state.handle
        if h is not None and h.ran_pre_backward_hook:
            return False
        queue = state.is_root and not state.post_backward_callback_queued
        if queue:
            state.post_backward_callback_queued = True
        if h is None:
            return queue
        self._hook = ("pre_backward", h.name)
        h.training_state = TrainingState.BACKWARD_PRE
        if h.needs_pre_backward_unshard and not h.prefetched:
            self._unshard(h)
        h.needs_pre_backward_unshard = False
        self._prefetch(state, h, backward=True)
        h.ran_pre_backward_hook = True
        self._hook = None
        return queue

    def post_backward(self, index: int, reshard_only: bool = False) -> None:
        self.log.append(
            ("post_backward_reshard_only" if reshard_only else "post_backward", index, False)
        )
        state = self.states[index]
        h = state.handle
        assert h is not None
        self._hook = ("post_backward", h.name)
        h.training_state = TrainingState.BACKWARD_POST
        self._reshard(h, self._should_free_in_backward(h))
        self._prefetch(state, h, backward=True)
        if not reshard_only and self.sync:  # no_sync: the gradient accumulates unreduced
            self._emit("reduce_scatter" if h.sharded else "all_reduce", h, "backward")
            # hybrid sharding all-reduces across the replicas, over the inter-node group
            # of one rank too (``_reduce_grad``: unconditionally, a group of one where the
            # shard group is every rank)
            if h.sharded and h.unit.config.sharding_strategy.name in HYBRID_STRATEGIES:
                self._emit("all_reduce", h, "backward", group="replicate")
            if h.unit.config.offload_params:
                self._emit("d2h", h, "backward")  # _offload_grad
        self._hook = None

    def final_callback(self) -> None:
        self.log.append(("final_callback", 0, False))
        self.iteration += 1
        self.post_forward_order.clear()
        self._hook = ("final_callback", self.root.unit.fqn)
        for state in self.states:
            h = state.handle
            if h is not None:
                if not (h.using_sharded and not h.skipped_sharded_views):
                    self._reshard(h, self._should_free_in_backward(h))
                h.post_backward_registered = False
                h.ran_pre_backward_hook = False
                h.needs_pre_backward_unshard = False
                h.post_forward_index = None
                h.training_state = TrainingState.IDLE
                h.prefetched = False
        self.root.post_backward_callback_queued = False
        self._hook = None

    # -------------------------------------------------------------- replay
    def micro_step(self, sync: bool, *_: bool) -> None:
        """Set up the next iteration: the last micro-step of an optimizer step synchronises
        its gradients, one before it runs inside ``no_sync()`` (FSDP2's other switches have
        no FSDP1 counterpart)."""
        self.sync = sync

    def optimizer_step(self) -> None:
        """The end of a micro-step: FSDP1 issues nothing at the optimizer step."""

    def replay(self, log: list[tuple[str, int, bool]]) -> None:
        """Feed a logged hook sequence through the state machine (no model run). A
        post-forward runs in the grad mode its unit's pre-forward logged: a forward under
        ``no_grad`` leaves the unit's pre-backward state as its last forward with grad set
        it (``_register_pre_backward_hooks`` returns at once), which backward prefetches
        read."""
        for name, index, flag in log:
            if name == "pre_forward":
                self._replay_grad[index] = flag
                self.pre_forward(index, flag)
                self.needs_post_backward_hook(index, flag)
            elif name == "post_forward":
                self.post_forward(index, self._replay_grad.get(index, True), flag)
            elif name == "pre_backward":
                self.pre_backward(index)
            elif name == "post_backward":
                self.post_backward(index)
            elif name == "post_backward_reshard_only":
                self.post_backward(index, reshard_only=True)
            elif name == "final_callback":
                self.final_callback()
