"""FSDP2's runtime state machine (``torch/distributed/fsdp/_fully_shard``, PyTorch 2.6 to 2.14).

A port of ``FSDPState`` / ``FSDPParamGroup`` reduced to what decides the
all-gathers, frees and reduce-scatters: each group's sharded state
(sharded, sharded to the post-forward mesh, unsharded), a pending all-gather,
the training state, the post-forward indices and the shared post-forward order
that implicit backward prefetch pops from, explicit forward/backward prefetch
targets, grouped calls (``_modules_to_run_forward``) and the root's final
callback. Driven by :mod:`fsdpviz.schedule.fsdp2_emulation` from real autograd; every call
is logged so a later iteration can be replayed. Where releases differ it follows the
:class:`~fsdpviz.plan.torch_fsdp.TorchFSDP` it is given (torch 2.13's FSDP2 is described
below; the differences are listed in ``plan/torch_fsdp.py``'s [Note: FSDP2 across releases]).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.torch_fsdp import TorchFSDP, installed
from fsdpviz.schema.events import Event, Hook
from fsdpviz.schema.mesh import ParallelDims
from fsdpviz.schema.report import DTYPE_SIZES, Unit


class EventTag(TypedDict, total=False):
    """What every event of a runtime is tagged with: under pipeline parallelism, the stage
    it runs, and the microbatch and action of the schedule's step (:class:`Event`'s fields)."""

    stage: int
    microbatch: int | None
    action: str


class TrainingState(enum.Enum):
    """torch's ``TrainingState``: where one ``FSDPState`` or ``FSDPParamGroup`` is in the step."""

    IDLE = "idle"
    FORWARD = "forward"
    PRE_BACKWARD = "pre_backward"
    POST_BACKWARD = "post_backward"


class Sharded(enum.Enum):
    SHARDED = "sharded"
    POST_FORWARD = "sharded_post_forward"
    UNSHARDED = "unsharded"


class GroupState:
    """An emulated ``FSDPParamGroup``."""

    def __init__(self, group: Group, world_size: int) -> None:
        self.group = group
        self.name = group.name
        self.frees_after_forward = group.frees_after_forward
        self.use_post_forward_mesh = group.post_forward_ranks(world_size) is not None
        self.unshard_in_backward = group.unshard_in_backward
        self.world_size = world_size
        self.sharded = Sharded.SHARDED
        self.pending = False
        self.training_state = TrainingState.IDLE
        self.post_forward_indices: list[int] = []
        self.ever_unsharded = False
        # unsharded gradients accumulated by a backward without gradient sync
        self.accumulated = False


# [Note: float8 all-gather amaxes]
# With torchao's float8 all-gather a float8 linear's sharded weight is a
# ``WeightWithDynamicFloat8CastTensor``, and FSDP2's ``FSDPParam.all_gather_inputs`` calls its
# ``fsdp_pre_all_gather(shard_mesh)`` from the sharded state (not from the post-forward mesh's
# shard: that is float8 already) inside ``foreach_all_gather``, before the all-gather. Unless
# a scale was precomputed, it casts with ``hp_tensor_to_float8_dynamic(reduce_amax=True,
# device_mesh=shard_mesh)``: ``tensor_to_amax`` takes ``torch.max(torch.abs(x))`` in the
# sharded parameter's dtype and all-reduces it (MAX) over the shard mesh with
# ``funcol.all_reduce``: one scalar a weight (4 bytes in float32), latency-bound, at every
# all-gather of its group, forward and backward. ``precompute_float8_dynamic_scale_for_fsdp``
# (torchtitan calls it after each optimizer step) stacks every weight's amax instead and
# reduces them in one all-reduce (``torch.clamp`` of the ``Partial`` DTensor), and the
# all-gathers after it cast with the precomputed scale: no collective. The first step's, before
# any optimizer step, still reduce at each all-gather.
@dataclass(frozen=True)
class Float8Scales:
    """torchao's float8 all-gather (``enable_fsdp_float8_all_gather``), the amax all-reduces
    over FSDP's shard group that its scales take (see [Note: float8 all-gather amaxes]).

    Attributes:
        weights: per group (its name), the weights of its float8 linears, each as
            ``(fqn, dtype of its sharded parameter)``.
        precomputed: ``precompute_float8_dynamic_scale_for_fsdp`` runs after each optimizer
            step: one all-reduce of every weight's amax there, none at an all-gather after it.
        tensor_parallel: the weights are DTensors over a tp dimension too, whose amaxes the
            precomputation reduces over each mesh dimension in turn (DTensor redistributes
            ``(Partial, Partial)`` with one all-reduce a dimension): shard, then tp.
    """

    weights: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    precomputed: bool = False
    tensor_parallel: bool = False


def weight_scales(
    units: Iterable[Unit], weights: Collection[str], precomputed: bool, tp: bool = False
) -> Float8Scales | None:
    """The :class:`Float8Scales` of ``weights`` (the FQNs of the weights FSDP2 all-gathers
    in float8), each in its unit's dtype for it (its sharded parameter's); ``None`` without
    any."""
    found = {}
    for u in units:
        dtypes = {f: d for d, fs in u.param_dtypes.items() for f in fs}
        picked = tuple((f, dtypes.get(f, u.dtype or "float32")) for f in u.params if f in weights)
        if picked:
            found[u.module] = picked
    return Float8Scales(found, precomputed, tp) if found else None


class FSDPState:
    """An emulated ``FSDPState``: one ``fully_shard`` call (zero or one group)."""

    def __init__(self, group: Group, world_size: int) -> None:
        self.group = group
        self.groups = [GroupState(group, world_size)] if group.params else []
        self.training_state = TrainingState.IDLE
        self.n_modules = len(group.modules)
        self.modules_to_run: set[int] = set()
        self.forward_prefetch: list[FSDPState] = []
        self.backward_prefetch: list[FSDPState] = []


class FSDP2Runtime:
    """``dims``: the job's ranks by mesh dimension (a group is sharded over their
    ``dp_shard_cp``; where ``hsdp``, a 2-D mesh, each gradient shard is all-reduced across
    ``dp_replicate``, one replica included); ``offload``: CPUOffloadPolicy (shards come
    from, gradients go to, host memory); ``rules``: whose FSDP2 (default: the installed
    torch's)."""

    def __init__(
        self,
        groups: list[Group],
        dims: ParallelDims,
        offload: bool = False,
        rules: TorchFSDP | None = None,
        float8: Float8Scales | None = None,
    ) -> None:
        self.rules = rules or installed()
        self.float8 = float8 if float8 is not None and float8.weights else None
        # whether an optimizer step ran (and with it torchao's precompute), and whether the
        # running micro-step ends one
        self.scales_ready = False
        self.steps = True
        self.states = [FSDPState(g, dims.dp_shard_cp) for g in groups]
        self.hsdp = dims.hsdp
        self.offload = offload
        self.post_forward_order: list[GroupState] = []
        self.iter_forward_root: FSDPState | None = None
        self.callback_queued = False
        self.callback_state = self.states[0]
        self.events: list[Event] = []
        self.log: list[tuple[str, int, Any]] = []
        self._hook: tuple[Hook, str] | None = None
        self._prefetching = False
        # set_requires_gradient_sync: False for the micro-steps that accumulate gradients
        # without reducing them (set per iteration by whoever drives the runtime, see
        # micro_step); set_requires_all_reduce likewise; set_reshard_after_backward and
        # set_is_last_backward too, and a pipeline stage turns both off (with gradient sync)
        # before each microbatch's backward, on for REDUCE_GRAD
        self.sync = True
        self.all_reduce = True
        self.reshard_after_backward = True
        self.is_last_backward = True
        # what every event is tagged with (a pipeline stage's action: stage, microbatch, action)
        self.tag: EventTag = {}
        # grouped calls some of whose modules did not run forward before backward (before
        # torch 2.13 FSDP2 never completes their forward and warns in the final callback)
        self.incomplete: dict[str, None] = {}

    def micro_step(self, sync: bool, reshard_after_backward: bool = True,
                   requires_all_reduce: bool = True) -> None:  # fmt: skip
        """Set up the next iteration: the last micro-step of an optimizer step (``sync``)
        reduces and reshards as usual; one before it runs with gradient sync off, or, when
        ``requires_all_reduce`` is False, reduce-scatters and skips HSDP's all-reduce, and
        keeps its parameters gathered after backward when ``reshard_after_backward`` is."""
        self.sync = sync or not requires_all_reduce
        self.steps = sync
        self.all_reduce = sync or requires_all_reduce
        self.reshard_after_backward = sync or reshard_after_backward

    def set_prefetch(self, forward: dict[int, list[int]], backward: dict[int, list[int]]) -> None:
        for i, targets in forward.items():
            self.states[i].forward_prefetch = [self.states[t] for t in targets]
        for i, targets in backward.items():
            self.states[i].backward_prefetch = [self.states[t] for t in targets]

    def optimizer_step(self) -> None:
        """The end of a micro-step: after the optimizer step that follows a synchronised one,
        torchao's ``precompute_float8_dynamic_scale_for_fsdp`` (where the job calls it) takes
        every float8 weight's amax in one all-reduce: ``torch._foreach_norm`` of the weights,
        stacked (a ``Partial`` DTensor), clamped, which redistributes it."""
        if not self.steps or self.float8 is None or not self.float8.precomputed:
            return
        weights = [w for ws in self.float8.weights.values() for w in ws]
        nbytes = sum(DTYPE_SIZES[dtype] for _, dtype in weights)
        root = self.states[0].group.name  # the module torchao is given: the root's
        dtype = weights[0][1]
        self.events.append(
            Event("all_reduce", root, "backward", group="shard", nbytes=nbytes, dtype=dtype,
                  **self.tag)
        )  # fmt: skip
        if self.float8.tensor_parallel:
            self.events.append(
                Event("tp_all_reduce", root, "backward", group="tp", nbytes=nbytes, dtype=dtype,
                      **self.tag)
            )  # fmt: skip
        self.scales_ready = True

    def _reduce_amaxes(self, g: GroupState, phase: Any) -> None:
        """``fsdp_pre_all_gather`` of each float8 weight of ``g`` from its sharded state:
        ``hp_tensor_to_float8_dynamic(reduce_amax=True)``, a scalar amax all-reduced (MAX)
        over the shard mesh, unless its scale was precomputed."""
        if self.float8 is None or self.scales_ready or g.sharded != Sharded.SHARDED:
            return
        hook, hook_unit = self._hook or (None, None)
        for fqn, dtype in self.float8.weights.get(g.name, ()):
            self.events.append(
                Event("all_reduce", g.name, phase, self._prefetching, hook, hook_unit,
                      group="shard", module=fqn, nbytes=DTYPE_SIZES[dtype], dtype=dtype, **self.tag)
            )  # fmt: skip

    def take_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def _emit(self, kind: Any, g: GroupState, phase: Any, group: Any = None) -> None:
        hook, hook_unit = self._hook or (None, None)
        prefetch = self._prefetching and kind == "all_gather"
        self.events.append(
            Event(kind, g.name, phase, prefetch, hook, hook_unit, group=group, **self.tag)
        )

    def gathered(self, name: str) -> bool:
        """Whether group ``name``'s parameters are unsharded now (a recompute that runs its
        forward before its pre-backward gathers it, ``set_unshard_in_backward(False)`` or
        not: its state is then ``FORWARD``, not ``PRE_BACKWARD``)."""
        return any(g.name == name and g.sharded == Sharded.UNSHARDED
                   for s in self.states for g in s.groups)  # fmt: skip

    # ----------------------------------------------------------- group ops
    def _unshard(self, g: GroupState) -> None:
        if g.pending or g.sharded == Sharded.UNSHARDED:
            return
        if not g.unshard_in_backward and g.training_state == TrainingState.PRE_BACKWARD:
            return  # set_unshard_in_backward(False): its pre-backward, a prefetch, a recompute
        phase = "forward" if g.training_state == TrainingState.FORWARD else "backward"
        if self.offload and g.sharded == Sharded.SHARDED:
            self._emit("h2d", g, phase)  # all_gather_inputs copies the host shard over
        if g.world_size > 1 or not self.rules.one_rank_copies:
            self._reduce_amaxes(g, phase)
            self._emit("all_gather", g, phase)
        g.pending = True

    def _wait(self, g: GroupState) -> None:
        if g.pending:
            g.pending = False
            g.sharded = Sharded.UNSHARDED
            g.ever_unsharded = True

    def _to(self, g: GroupState, target: Sharded) -> None:
        if g.sharded == target:
            return
        if g.sharded == Sharded.UNSHARDED:
            self._emit(
                "free", g, "forward" if g.training_state == TrainingState.FORWARD else "backward"
            )
        g.sharded = target

    def _reshard(self, g: GroupState) -> None:
        if g.training_state == TrainingState.FORWARD:
            if not g.frees_after_forward:
                return
            if g.use_post_forward_mesh:
                self._to(g, Sharded.POST_FORWARD)
                return
        self._to(g, Sharded.SHARDED)

    def _prefetch(self, g: GroupState, backward: bool) -> None:
        prev = g.training_state
        g.training_state = TrainingState.PRE_BACKWARD if backward else TrainingState.FORWARD
        self._prefetching = True
        try:
            self._unshard(g)
        finally:
            self._prefetching = False
            g.training_state = prev

    def _backward_prefetch(self, g: GroupState) -> None:
        if g.training_state != TrainingState.PRE_BACKWARD or not g.post_forward_indices:
            return
        index = g.post_forward_indices.pop()
        if index > 0:
            self._prefetch(self.post_forward_order[index - 1], backward=True)

    # ------------------------------------------------------------- forward
    def pre_forward(self, i: int, member: int = 0) -> list[int] | None:
        """Module ``member`` of call ``i`` starts its forward (FSDP's forward pre-hook).

        Returns the groups entering the forward pass (they register post-backward), or
        None when FSDP's pre-forward returns at once (inputs not cast): before torch 2.13 a
        recompute inside backward, or a grouped call's member after the first.
        """
        self.log.append(("pre_forward", i, member))
        rules = self.rules
        state = self.states[i]
        first_member = False
        if state.n_modules > 1 and not state.modules_to_run:
            state.modules_to_run = set(range(state.n_modules))
            first_member = True
        if state.n_modules > 1 and not first_member and not rules.grouped_per_member:
            return None  # the group's pre-hook ran for its first member only
        if state.training_state == TrainingState.PRE_BACKWARD:  # activation-checkpoint recompute
            if rules.recompute_unshards:
                for g in state.groups:
                    if g.sharded != Sharded.UNSHARDED:
                        self._unshard(g)
                        self._wait(g)
            return [] if rules.recompute_casts else None
        self._hook = ("pre_forward", state.group.name)
        first_in_pass = state.training_state != TrainingState.FORWARD
        state.training_state = TrainingState.FORWARD
        if first_in_pass and self.iter_forward_root is None:
            self.iter_forward_root = state
        entering = []
        for n, g in enumerate(state.groups):
            if g.training_state != TrainingState.FORWARD:
                entering.append(n)
            g.training_state = TrainingState.FORWARD
            self._unshard(g)
            self._wait(g)
        if first_in_pass:
            for target in state.forward_prefetch:
                for g in target.groups:
                    self._prefetch(g, backward=False)
        return entering

    def post_forward(self, i: int, in_backward: bool, member: int = 0) -> list[int] | None:
        """Module ``member`` of call ``i`` finished its forward (FSDP's forward hook).

        Returns None when FSDP's post-forward does nothing now (a grouped call
        waiting for its other members, or a recompute inside backward), else the
        states whose post-forward ran: this one and any the root force-completed.
        """
        self.log.append(("post_forward", i, (in_backward, member)))
        rules = self.rules
        state = self.states[i]
        if state.n_modules > 1:
            if rules.grouped_per_member and member not in state.modules_to_run:
                return None
            state.modules_to_run.discard(member)
            if state.modules_to_run:
                return None
        if state.training_state == TrainingState.PRE_BACKWARD:
            return None
        self._complete_forward(state, in_backward)
        forced: list[int] = [i]
        if self.iter_forward_root is state:
            for j in reversed(range(len(self.states))) if rules.grouped_per_member else ():
                other = self.states[j]
                if other is state or not other.modules_to_run:
                    continue
                self._complete_forward(other, in_backward, by=state)
                other.modules_to_run.clear()
                forced.append(j)
            self.iter_forward_root = None
        return forced

    def _complete_forward(
        self, state: FSDPState, in_backward: bool, by: FSDPState | None = None
    ) -> None:
        """``state``'s post-forward, run by its own hook or (``by``) the forward root's,
        which completes a grouped call whose forward ran only some of its modules."""
        self._hook = ("post_forward", (by or state).group.name)
        skip = in_backward and self.rules.post_forward_in_backward_skips
        for g in state.groups:
            if not skip:
                self._reshard(g)
                g.post_forward_indices.append(len(self.post_forward_order))
                self.post_forward_order.append(g)
            g.training_state = TrainingState.IDLE
        state.training_state = TrainingState.IDLE

    # ------------------------------------------------------------ backward
    def pre_backward(self, i: int) -> bool:
        """Returns True when the root's final callback must be queued now."""
        self.log.append(("pre_backward", i, None))
        state = self.states[i]
        self._hook = ("pre_backward", state.group.name)
        state.training_state = TrainingState.PRE_BACKWARD
        queue = not self.callback_queued
        if queue:  # the callback is bound to the state whose pre-backward ran first
            self.callback_state = state
        self.callback_queued = True
        default_prefetch = not state.backward_prefetch
        for g in state.groups:
            if g.training_state == TrainingState.PRE_BACKWARD:
                continue
            g.training_state = TrainingState.PRE_BACKWARD
            self._unshard(g)
            self._wait(g)
            if default_prefetch:
                self._backward_prefetch(g)
        for target in state.backward_prefetch:
            for g in reversed(target.groups):
                self._prefetch(g, backward=True)
        return queue

    def post_backward(self, i: int, has_grads: bool) -> None:
        self.log.append(("post_backward", i, has_grads))
        self._hook = ("post_backward", self.states[i].group.name)
        for g in self.states[i].groups:
            self._post_backward(g, has_grads)

    def _post_backward(self, g: GroupState, has_grads: bool) -> None:
        g.training_state = TrainingState.POST_BACKWARD
        # without gradient sync the group keeps its unsharded gradient (a tp partial gradient
        # stays partial: no redistribute) and reshards, unless told not to after backward
        if not self.sync:
            g.accumulated = g.accumulated or has_grads
            if self.reshard_after_backward:
                self._reshard(g)
            return
        accumulated = g.accumulated
        has_grads = has_grads or accumulated
        g.accumulated = False
        if has_grads and g.ever_unsharded:
            # unsharded_grad_data: a replicated tp parameter's partial gradient is all-reduced
            # over the tp dimension (DTensor redistribute), before the parameters are freed,
            # in its dtype; after micro-steps without sync, the gradient they kept
            # (unsharded_accumulated_grad_data: its reduce dtype)
            kept = g.group.tp_accumulated_dtype if accumulated else None
            for fqn, nbytes, dtype in g.group.tp_partial_grads:
                if kept is not None and dtype is not None:
                    nbytes, dtype = nbytes // DTYPE_SIZES[dtype] * DTYPE_SIZES[kept], kept
                kind = "tp_reduce_scatter" if fqn in g.group.tp_scattered_grads else "tp_all_reduce"
                event = self._tp_event(kind, g.name, fqn, "backward", nbytes, True)
                self.events.append(replace(event, dtype=dtype))
        if self.reshard_after_backward:
            self._reshard(g)
        if has_grads and g.ever_unsharded:
            self._emit("reduce_scatter", g, "backward")
            if self.hsdp and self.all_reduce:  # HSDP's all-reduce across replicas
                self._emit("all_reduce", g, "backward", group="replicate")
            if self.offload:  # foreach_reduce copies the gradient shard to host memory
                self._emit("d2h", g, "backward")

    def final_callback(self, has_grads: dict[int, bool]) -> None:
        self.log.append(("final_callback", 0, has_grads))
        self._hook = ("final_callback", self.callback_state.group.name)
        self.iter_forward_root = None
        for i, state in enumerate(self.states):
            if state.modules_to_run and not self.rules.grouped_per_member:
                self.incomplete.setdefault(state.group.name, None)  # FSDP2 warns, clears
            state.modules_to_run.clear()
            for g in reversed(state.groups):
                if self._post_backward_pending(g):
                    self._post_backward(g, has_grads.get(i, False))
                g.training_state = TrainingState.IDLE
            state.training_state = TrainingState.IDLE
            if self.is_last_backward:  # finalize_backward
                for g in state.groups:
                    g.pending = False
                    g.post_forward_indices.clear()
        if self.is_last_backward:
            self.post_forward_order.clear()
        self.callback_queued = False
        self._hook = None

    # ------------------------------------------------- a pipeline stage's FSDP actions
    def unshard_all(self) -> None:
        """``UNSHARD``: ``FSDPModule.unshard(async_op=True)`` on each of the stage's FSDP
        modules, in ``modules()`` order (no FSDP hook issues it)."""
        self._hook = None
        for state in self.states:
            for g in state.groups:
                self._unshard(g)

    def wait_all(self) -> None:
        """The runtime waits for a stage's ``UNSHARD`` before computing on it."""
        for state in self.states:
            for g in state.groups:
                self._wait(g)

    def reshard_all(self) -> None:
        """``RESHARD`` (and shape inference's clean-up): ``FSDPModule.reshard()`` on each."""
        self._hook = None
        for state in self.states:
            for g in state.groups:
                self._reshard(g)

    def reduce_grad(self) -> None:
        """``REDUCE_GRAD`` (``PipelineStage.perform_reduce_grad``): gradient sync, resharding
        after backward and the last backward turned on, every group's post-backward called in
        state order (each frees its parameters, then reduce-scatters what the microbatches
        accumulated), then the root's final callback."""
        self.sync = self.reshard_after_backward = self.is_last_backward = True
        for state in self.states:
            for g in state.groups:
                self._hook = ("post_backward", g.name)
                self._post_backward(g, False)
        self.final_callback({})

    def _post_backward_pending(self, g: GroupState) -> bool:
        """Whether the final callback runs ``g``'s post-backward (its inputs did not require
        grad, so autograd never did): torch 2.7 asks its training state, 2.6 whether it is
        still unsharded."""
        if self.rules.final_callback_by_state:
            return g.training_state != TrainingState.POST_BACKWARD
        return g.sharded == Sharded.UNSHARDED

    def tensor_parallel(
        self, i: int, kind: str, module: str, phase: str, nbytes: int, dtype: str | None = None
    ) -> None:
        """A collective of tensor parallelism, issued in the forward or backward of ``module``
        (in group ``i``), moving ``nbytes`` of ``dtype``: it changes no FSDP state, but is
        logged so a replay issues it too."""
        self.log.append((f"tp_{phase}", i, (kind, module, phase, nbytes, dtype)))
        event = self._tp_event(kind, self.states[i].group.name, module, phase, nbytes)
        self.events.append(replace(event, dtype=dtype) if dtype is not None else event)

    def context_parallel(self, i: int, kind: Any, module: str, phase: Any, nbytes: int) -> None:
        """A collective of context parallelism's ring attention, issued in the attention of
        ``module`` (in group ``i``): logged so a replay issues it too."""
        self.log.append((f"cp_{phase}", i, (kind, module, phase, nbytes)))
        group = self.states[i].group.name
        self.events.append(Event(kind, group, phase, group="cp", module=module, nbytes=nbytes))

    def context_parallel_wait(self, i: int, phase: str, kind: str) -> None:
        """The ring attention in group ``i`` waits for its last ``kind`` collective: no event,
        a hook call the compute after it waits at (the time model's)."""
        self.log.append((f"cp_{phase}_wait", i, kind))

    def _tp_event(
        self, kind: Any, unit: str, module: str, phase: Any, nbytes: int, fsdp: bool = False
    ) -> Event:
        """A ``tp_*`` event; ``fsdp``: issued inside an FSDP hook (a partial gradient's
        all-reduce in post-backward), otherwise by the model's parallel styles (no hook)."""
        hook, hook_unit = self._hook if fsdp and self._hook else (None, None)
        return Event(kind, unit, phase, False, hook, hook_unit, group="tp", module=module,
                     nbytes=int(nbytes), **self.tag)  # fmt: skip

    def replay(self, log: list[tuple[str, int, Any]]) -> None:
        """Feed a logged call sequence through the state machine (no model run)."""
        for name, i, flag in log:
            if name in ("tp_forward", "tp_backward"):
                self.tensor_parallel(i, *flag)
            elif name in ("cp_forward", "cp_backward"):
                self.context_parallel(i, *flag)
            elif name in ("cp_forward_wait", "cp_backward_wait"):
                self.context_parallel_wait(i, name.split("_")[1], flag)
            elif name == "pre_forward":
                self.pre_forward(i, flag)
            elif name == "post_forward":
                self.post_forward(i, *flag)
            elif name == "pre_backward":
                self.pre_backward(i)
            elif name == "post_backward":
                self.post_backward(i, flag)
            elif name == "final_callback":
                self.final_callback(flag)
