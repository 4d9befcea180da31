"""Measure what the memory and time model needs while fsdpviz's copy runs one step.

:class:`CostProbe` is a ``TorchDispatchMode`` plus ``saved_tensors_hooks`` that
counts, on the meta device, without allocating anything:

- **activations**: storages saved for backward (``saved_tensors_hooks`` pack),
  deduplicated by storage and attributed to the innermost module running;
  parameters, buffers and inputs are never counted (no operator inside the
  step creates them). Tensors an activation-checkpoint recomputation creates
  inside backward count as activations too; what a checkpointed region would
  have saved is not saved, so it is not counted in forward.
- **forward / backward temp**: every other live storage an operator created, in
  forward (the model output, tensors not yet freed) or in backward (gradients of
  activations).
- **gradients**: the storage that lands in a parameter's ``.grad`` (FSDP1: the
  FlatParameter's), by unit, moved out of *temp* by a post-accumulate-grad hook.
- **tensor parallelism** (``tp``, a :class:`TPShares`): one rank's bytes of every
  storage. A storage holds a share when an input of the operator that made it
  does (starting from the parameters the plan shards), except the whole (partial)
  result of a matrix multiply of two shares and anything a ``RowwiseParallel``
  module computes; a tp collective's output buffer (:meth:`CostProbe.redistributed`)
  is counted in the layout it arrives in, and costs no kernel. A share is the part
  of its sharded dim the first tp rank holds (:func:`~fsdpviz.trace.probe_records.dim_share`:
  ``1/tp``, or more where tp does not divide the dim, as DTensor chunks it), passed on
  from the inputs (the largest of theirs) to what is computed from them.
- **FLOPs** of the operators ``torch.utils.flop_counter`` has formulas for
  (matrix multiplies, attention, convolutions), forward and backward. Other
  operators are not counted: next to a transformer's matrix multiplies their
  FLOPs are negligible (they are memory-bound, see the README).
- **kernels** (:mod:`fsdpviz.schema.profile`): every GPU kernel an operator launches
  (:mod:`fsdpviz.trace.operators` says which, and its FLOP formula), and
  the fused kernels ``torch.compile`` would make of the memory-bound ones in the compiled
  modules (``compiled``; default: the whole model), see :mod:`fsdpviz.trace.fusion`. The
  matrix multiplies of float8 linears (``float8``) are recorded in float8, with the casts
  around them (their weights arrive in float8 with ``float8_weights_gathered``).
- **compiled modules under selective activation checkpointing** (``compiled_checkpoints``,
  see :func:`~fsdpviz.trace.compiled_regions.compiled_checkpoints`): between forward and
  backward only what torch's partitioner keeps of them, see
  :mod:`fsdpviz.trace.compiled_regions`.
- **a compiled loss** (given as ``torch.compile(loss_fn)``): held as ``torch.compile`` holds
  it, by torch's own partitioner (:mod:`fsdpviz.trace.compiled_saves`): between its forward
  and backward only the inputs and values the partitioner saves; inside them only what its
  kernels write out (its output, its saves, the gradients it returns), its kernels fused.

While measuring, :func:`~fsdpviz.trace.attention.fused_attention` makes
``scaled_dot_product_attention`` save what a fused GPU kernel saves. Frees are
seen through weak references to the storages. Each FSDP hook call (an append
to the runtime's ``log``) records a :class:`Mark`: the counters, and the number
of events issued so far; :func:`fsdpviz.trace.hook_counters.cut_profile` cuts the marks
into one :class:`~fsdpviz.schema.profile.StepProfile` per iteration.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    _get_current_dispatch_mode_stack,
)
from torch.utils._pytree import tree_leaves

from fsdpviz.schema.profile import StretchMoments, TraceProfile
from fsdpviz.schema.report import IGNORED
from fsdpviz.trace import meta_cache
from fsdpviz.trace.attention import fused_attention
from fsdpviz.trace.checkpointing import frames_released
from fsdpviz.trace.compiled_loss import CompiledLossAccounting
from fsdpviz.trace.compiled_regions import CompiledRegion, CompiledRegionAccounting
from fsdpviz.trace.float8_probe import Float8Accounting
from fsdpviz.trace.fusion import FusedRegions, ModuleScope
from fsdpviz.trace.hook_counters import Mark, cut_profile, without_backward
from fsdpviz.trace.loss_parallel import LossParallelAccounting
from fsdpviz.trace.operators import (
    FLOP_OPS,
    op_info,
    output_shapes,
)
from fsdpviz.trace.probe_kernels import KernelAccounting
from fsdpviz.trace.probe_records import (
    ACT,
    BWD_TEMP,
    FWD_TEMP,
    GRAD,
    CallGradients,
    CompiledLoss,
    MarkingLog,
    SavedParamViews,
    StorageSet,
    Stretch,
    TPShares,
    batch_tokens,
    local_part,
    moments_recorded,
    storage_bytes,
    storage_of,
)
from fsdpviz.trace.probe_shares import ShareAccounting
from fsdpviz.trace.recomputation import recomputing
from fsdpviz.trace.tracker import ModuleTracker


class CostProbe(
    CompiledLossAccounting,
    CompiledRegionAccounting,
    Float8Accounting,
    KernelAccounting,
    ShareAccounting,
    TorchDispatchMode,
):  # type: ignore[no-untyped-call]
    """Counts activation/temp/gradient bytes and FLOPs of one traced step.

    ``grad_owner`` maps each leaf parameter whose ``.grad`` FSDP reduces (FSDP1:
    the FlatParameters; FSDP2: the parameters) to its unit's name;
    ``unit_names[i]`` names the unit of the runtime's hook index ``i``.
    """

    def __init__(
        self,
        tracker: ModuleTracker,
        grad_owner: dict[torch.nn.Parameter, str],
        unit_names: list[str],
        buffers: list[torch.Tensor],
        tp: TPShares | None = None,
        compiled: list[torch.nn.Module] | None = None,
        float8: list[torch.nn.Module] | None = None,
        float8_weights_gathered: bool = False,
        float8_recipe: str = "tensorwise",
        float8_fused: bool = False,
        compiled_checkpoints: list[torch.nn.Module] | None = None,
        call_gradients: bool = False,
    ) -> None:
        """``call_gradients``: measure each stretch's peak without the gradients one forward
        call of a unit made that autograd holds for another call's (FSDP1 under parameter
        mixed precision, which holds none: see :class:`CallGradients`)."""
        super().__init__()  # type: ignore[no-untyped-call]
        self._measure_calls = call_gradients
        self._tracker = tracker
        self._loss: CompiledLoss | None = None
        tracker.call_loss = self._call_loss  # a loss given as torch.compile(loss_fn)
        self._compiled = ModuleScope("compiled", compiled)
        self._regions: list[CompiledRegion] = []
        self._region_extras: list[torch.Tensor] = []
        self._region_handles = self._region_hooks(compiled_checkpoints or [])
        self._float8_setup(float8, float8_weights_gathered, float8_recipe, float8_fused)
        # rowwise backward outputs whose rescaling a compiled region has yet to place (by
        # storage id): its storage, phase, eager kernels and bytes, the output's local bytes
        self._rescales: dict[int, tuple[weakref.ref[Any], int, int, float, float]] = {}
        self._shares_setup(tp)
        self._fused = FusedRegions(self._local_bytes if tp is not None else None)
        self._loss_parallel = LossParallelAccounting()  # F.cross_entropy in loss_parallel()
        self._unit_names = unit_names
        self._by_unit: dict[str, list[torch.nn.Parameter]] = {}
        for p, name in grad_owner.items():
            self._by_unit.setdefault(name, []).append(p)
        self._live: dict[int, list[Any]] = {}  # id(storage) -> [bytes, kind, weakref]
        self._ops: dict[Any, Any] = {}
        self._external = StorageSet()  # the parameters', buffers' and inputs' storages
        # id(param) -> (its gradient's record in _live, bytes): not its storage's id (reused)
        self._param_grad: dict[int, tuple[list[Any], int]] = {}
        self.live = [0, 0, 0, 0]  # bytes by kind
        self._keep_moments = moments_recorded()
        self._call_grads = CallGradients({})  # see step()
        self._stretch = self._new_stretch()
        self._param_views = SavedParamViews({}, lambda: self._stretch)  # see step()
        # storages no backward may read (forbid_in_backward): id -> (weakref, unit)
        self._unread: dict[int, tuple[weakref.ref[torch.UntypedStorage], str]] = {}
        self.read_in_backward: dict[str, str] = {}  # unit -> the first operator that read it
        self._gathered: Callable[[str], bool] = lambda unit: False  # ... gathered now
        self.marks: list[Mark] = []
        self._tails: dict[int, Mark] = {}  # mark count at the end of a step -> its last stretch
        self._watch: list[int] | None = None  # see watch()
        self._measuring = False
        self._count_events: Callable[[], int] = lambda: 0
        self.module_saved: dict[str, float] = {}
        self.module_flops: dict[str, float] = {}
        self._record_modules = True
        self.input_bytes = 0
        self.tokens = 0
        self.buffer_bytes = storage_bytes(buffers)
        self._handles = [
            p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                functools.partial(self._grad_ready, name)
            )
            for p, name in grad_owner.items()
            if p.requires_grad
        ]

    # ------------------------------------------------------------ attaching
    def attach(self, runtime: Any) -> None:
        """Measure every ``run_step`` of the tracker; mark every hook call of ``runtime``."""
        runtime.log = MarkingLog(list(runtime.log), self._on_hook)
        self._count_events = lambda: len(runtime.events)
        self._tracker.measure = self.step

    def forbid_in_backward(
        self, by_unit: Mapping[str, Sequence[torch.Tensor]], gathered: Callable[[str], bool]
    ) -> None:
        """Record in :attr:`read_in_backward`, by unit, the first operator of a backward (a
        recomputation's included) that reads the storage of one of ``by_unit``'s tensors
        while ``gathered(unit)`` is False: what fails on a real run where they were freed
        after forward and are not gathered again (FSDP2's ``set_unshard_in_backward(False)``).
        A recomputation that starts before the unit's own pre-backward (a checkpointed
        region that runs the unit and more) gathers it as a forward does."""
        self._gathered = gathered
        for unit, tensors in by_unit.items():
            for t in tensors:
                if (st := storage_of(t)) is not None:
                    self._unread[id(st)] = (weakref.ref(st), unit)

    def _reads_forbidden(self, func: Any, args: tuple[Any, ...]) -> None:
        for t in tree_leaves(args):
            st = storage_of(t) if isinstance(t, torch.Tensor) else None
            entry = self._unread.get(id(st)) if st is not None else None
            if entry is None or entry[0]() is not st or self._gathered(entry[1]):
                continue
            # name an operator that computes with it rather than a detach (an alias)
            if self.read_in_backward.get(entry[1], "aten.detach") == "aten.detach":
                self.read_in_backward[entry[1]] = str(func.overloadpacket)

    @contextmanager
    def step(self, model: torch.nn.Module, inputs: Any) -> Iterator[None]:
        """Measure one forward+backward of ``model`` (parameters and buffers are not counted)."""
        self.input_bytes = storage_bytes(inputs)
        self.tokens = batch_tokens(inputs)
        self._external = StorageSet(
            st
            for t in [*model.parameters(), *model.buffers(), *tree_leaves(inputs)]
            if isinstance(t, torch.Tensor) and (st := storage_of(t)) is not None
        )
        self._step_shares()
        self._stretch = self._new_stretch()
        self._param_views = SavedParamViews(self._by_unit, lambda: self._stretch)
        self._call_grads = CallGradients(self._by_unit if self._measure_calls else {})
        self._measuring = True
        done = model.register_forward_hook(self._forward_done)
        try:
            with (
                saved_tensors_hooks(self._pack, _unpack),
                fused_attention(),
                frames_released(self._frame_released),
                self,
            ):
                yield
        finally:
            done.remove()
            self._end_loss()
            self._regions.clear()
            self._region_extras.clear()
            self._measuring = False
            self._tails[len(self.marks)] = self._close_stretch()
            self._record_modules = False

    def _forward_done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """The step's forward is done: the gradients autograd will hold for another forward
        call's (see :class:`~fsdpviz.trace.probe_records.CallGradients`)."""
        if torch._C._current_graph_task_id() == -1:
            self._call_grads.graph(output, self._temp_bytes)

    def _temp_bytes(self, key: int) -> int:
        rec = self._live.get(key)
        return int(rec[0]) if rec is not None and rec[1] == BWD_TEMP else 0

    def remove(self) -> None:
        self._tracker.measure = None
        self._tracker.call_loss = None
        self._compiled.remove()
        if self._float8 is not None:
            self._float8.remove()
        for handles in (self._region_handles, self._float8_hooks, self._handles):
            for h in handles:
                h.remove()
            handles.clear()

    # ------------------------------------------------------------- counting
    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        loss = self._loss
        backward = torch._C._current_graph_task_id() != -1
        if backward and self._unread:
            self._reads_forbidden(func, args)
        _operands: list[Any] = []  # what _backward_mm's redistributions made, held until
        # the operator's product is counted (DTensor lets go of them once it has run)
        if backward and self._mm_waits and func is torch.ops.aten.mm.default and not recomputing():
            _operands = self._backward_mm()  # (a checkpoint's recomputed forward's mm: none)
        if self._float8_running is not None and not recomputing():
            self._float8_stopped()
        if loss is not None and loss.forward_done and backward and not loss.captures():
            self._end_loss()  # the compiled loss's backward is over
        tp = self._tp
        if tp is not None and self._held is None and loss is None:
            in_module = bool(self._tracker.stack)
            if self._loss_parallel.takes(func, args, backward, self._is_share, tp, in_module):
                with self:  # the handler's operators, each counted
                    return self._loss_parallel.run(func, args, self.held_as, self._whole)
        out = meta_cache.run(func, args, kwargs)
        if self._regions and not backward:
            self._region_op(func, out)
        if self._forced is not None:
            if self._rescales:
                self._rescale_read(args, False)
            self._fused.close()  # a collective's buffer: a fused kernel cannot span it
            self._track_all(out, self._forced[0])
            return out
        op = self._ops.get(func)
        if op is None:
            op = self._ops[func] = op_info(func)
        flop_fn, on_shapes, fresh, cost = op
        flops = 0
        if flop_fn is not None and on_shapes:
            shapes = [a.shape if isinstance(a, torch.Tensor) else a for a in args]
            flops = flop_fn(*shapes, **kwargs, out_shape=output_shapes(out))
            self._count_flops(flops)
        elif flop_fn is not None:
            flops = flop_fn(*args, **kwargs, out_val=out)
            self._count_flops(flops)
        if fresh:  # (views and in-place ops return storage that already exists)
            share = self._made_share(func, args, kwargs) if self._tp is not None else None
            self._track_all(out, share)
        if cost is not None:
            if self._rescales:
                self._rescale_read(args, cost[0] == "mem" and self._fusing())
            self._count_kernel(cost, args, kwargs, out, flops, fresh)
        return out

    def _track_all(self, out: Any, share: Fraction | None) -> None:
        if isinstance(out, torch.Tensor):
            self._track(out, share)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._track(t, share)

    def _track(self, t: torch.Tensor, share: Fraction | None = None) -> None:
        st = storage_of(t)
        if st is None:
            return
        key = id(st)
        if key in self._live or st in self._external:
            return
        loss = self._loss
        if loss is not None and key in loss.pending:
            return
        n = st.nbytes()
        if n == 0:
            return
        if self._in_float8 and t.element_size() > 1:  # float8 data: one byte an element
            n //= t.element_size()
            self._float8_data[key] = weakref.ref(st)
        if share is not None and t.dim() > 0:  # a scalar is whole on every rank
            self._sharded.add(st, share)
            n = local_part(n, share)
        kind = FWD_TEMP
        if torch._C._current_graph_task_id() != -1:
            kind = ACT if recomputing() else BWD_TEMP
        elif self._regions:
            self._region_made(t)
        if loss is not None and loss.captures():  # written out only if it leaves the kernels
            gone = functools.partial(self._pending_freed, loss, key)
            loss.pending[key] = [n, kind, weakref.ref(st, gone), tuple(t.shape), t.dtype]
            return
        self._hold(st, key, n, kind)

    def _hold(self, st: Any, key: int, n: int, kind: int) -> None:
        """Count storage ``st`` (``n`` bytes of ``kind``) until it is freed."""
        ref = weakref.ref(st, functools.partial(self._freed, key))
        self._live[key] = [n, kind, ref]
        self.live[kind] += n
        self._bump_peak()

    def _fusing(self) -> bool:
        """Whether the operator running now is Inductor's to fuse: in the compiled modules or
        in a compiled loss (forward or backward)."""
        if self._compiled.active():
            return True
        loss = self._loss
        if loss is None:
            return False
        return loss.scope.depth > 0 or (loss.forward_done and loss.scope.active())

    def _bump_peak(self) -> None:
        s, live = self._stretch, self.live
        held = live[ACT] + live[FWD_TEMP] + live[BWD_TEMP]
        now = held + s.grad_bytes
        if now > s.peak:
            s.peak, s.peak_grads = now, s.grad_bytes
            s.peak_activations, s.peak_forward_temp = live[ACT], live[FWD_TEMP]
            if s.scales_freed:  # (empty until a saved float8 scale is freed in the stretch)
                s.peak_scales_freed = dict(s.scales_freed)
        if held > s.peak_in_place[0]:
            s.peak_in_place = (held, live[ACT], live[FWD_TEMP])
        if held - self._call_grads.bytes > s.peak_unbuffered[0]:
            s.peak_unbuffered = (held - self._call_grads.bytes, live[ACT], live[FWD_TEMP])
        if s.moments is not None:
            freed = tuple(s.scales_freed.items()) if s.scales_freed else None
            s.moments.moments.append(
                (live[ACT], live[FWD_TEMP], live[BWD_TEMP], s.grad_bytes, freed)
            )
            s.moments.call_grads.append(self._call_grads.bytes)
        if self._watch is not None and sum(live) > self._watch[0]:
            self._watch[:] = [sum(live), *live]

    def _freed(self, key: int, ref: Any) -> None:
        self._sharded.forget(key)
        rec = self._live.get(key)
        if rec is None or rec[2] is not ref:
            return
        del self._live[key]
        self.live[rec[1]] -= rec[0]
        self._call_grads.freed(key)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        """Count ``t``'s storage as saved for backward; keep it as autograd does.

        What is packed is ``t`` detached: autograd keeps an operator's saved output without
        its ``grad_fn`` (no reference cycle), so a graph nothing refers to any more (a value
        computed with gradients, then detached: DoRA's weight norm of an embedding) is freed
        with what it saved at once. Packing ``t`` itself would hold the output's node from
        its own saved tensor (torch's warning in ``saved_tensors_hooks``): a cycle that lives
        until the garbage collector runs, and none runs while ``analyze`` traces (a graph
        kept past a partial backward, a zero-bubble stage's input backward with
        ``retain_graph=True``, would hold it too).
        """
        st = storage_of(t)
        rec = None if st is None else self._live.get(id(st))
        loss = self._loss
        if rec is None and loss is not None and st is not None and id(st) in loss.pending:
            loss.saved.add(id(st))  # the partitioner decides when the loss's forward ends
            return _detached(t)
        if rec is None and st is not None and t.is_meta and st not in self._external:
            # made before any operator ran: the index tensor torch makes of a list on the
            # indexed tensor's device (``x[:, [-2]]``), ``torch.tensor(data, device=...)``
            rec = self._made_outside(st)
        if rec is not None and rec[1] in (FWD_TEMP, BWD_TEMP):
            self.live[rec[1]] -= rec[0]
            rec[1] = ACT
            self.live[ACT] += rec[0]
            if self._record_modules and torch._C._current_graph_task_id() == -1:
                name = self._tracker.stack[-1] if self._tracker.stack else ""
                self.module_saved[name] = self.module_saved.get(name, 0.0) + rec[0]
        packed = _detached(t)
        Float8Accounting.float8_weight_saved(self, st, packed)
        self._param_views.saved(t, st, packed)
        return packed

    def _made_outside(self, st: Any) -> list[Any] | None:
        """Count storage ``st`` no operator made (``internal_new_from_data``, on meta)."""
        if st.nbytes() == 0:
            return None
        self._hold(st, id(st), st.nbytes(), FWD_TEMP)
        return self._live[id(st)]

    def _grad_ready(self, owner: str, p: torch.Tensor) -> None:
        self._call_grads.accumulated(p)
        grad = p.grad
        st = None if grad is None else storage_of(grad)
        if st is None:
            return
        key = id(st)
        rec = self._live.get(key)
        n = st.nbytes() if self._tp is None else self._tp.grad_bytes(p, st.nbytes())
        if rec is None:
            ref = weakref.ref(st, functools.partial(self._freed, key))
            rec = self._live[key] = [n, GRAD, ref]
            self.live[GRAD] += rec[0]
        elif rec[1] != GRAD or rec[0] != n:
            self.live[rec[1]] -= rec[0]
            rec[0], rec[1] = n, GRAD
            self.live[GRAD] += n
        prev_rec, prev_bytes = self._param_grad.get(id(p), (None, 0))
        if prev_rec is rec:
            return  # accumulated in place
        self._param_grad[id(p)] = (rec, rec[0])
        delta = rec[0] - prev_bytes
        self._stretch.grads[owner] = self._stretch.grads.get(owner, 0) + delta
        self._stretch.grad_bytes += delta
        self._bump_peak()

    def watch(self) -> None:
        """Follow the most bytes held (every kind) from now on, for :meth:`watched`."""
        self._watch = [sum(self.live), *self.live]

    def watched(self) -> list[int]:
        """The most bytes held since :meth:`watch`, then each kind's bytes at that moment
        (indexed by kind, as :attr:`live`)."""
        most, self._watch = self._watch or [0, 0, 0, 0, 0], None
        return most

    def uncounted(self, tensors: list[torch.Tensor]) -> None:
        """Leave out the storages of ``tensors``, made before the step (as its inputs)."""
        for t in tensors:
            if (st := storage_of(t)) is not None:
                self._external.add(st)

    # ---------------------------------------------------------------- marks
    def _close_stretch(self) -> Mark:
        self._place_rescales()
        s, live = self._stretch, self.live
        self._bump_peak()
        mark = Mark(
            [[*key, int(n), int(b)] for key, (n, b) in s.kernels.items()] + self._fused.take(),
            s.flops_forward,
            s.flops_backward,
            live[ACT],
            live[FWD_TEMP],
            live[BWD_TEMP],
            s.peak,
            s.peak_activations,
            s.peak_forward_temp,
            s.peak_grads,
            s.grads,
            self._count_events(),
            self._measuring,
            s.peak_in_place,
            {u: [s.peak_scales_freed.get(u, 0), n] for u, n in s.scales_freed.items()},
            dict(s.param_views_freed),
            s.moments,
            s.peak_unbuffered,
            list(s.released),
        )
        self._stretch = self._new_stretch()
        return mark

    def _frame_released(self) -> None:
        """A checkpointed region's frame let go of what it held (``frames_released``)."""
        s = self._stretch
        s.released.append((_peaks(s), None if s.moments is None else len(s.moments.moments)))

    def _new_stretch(self) -> Stretch:
        live = self.live
        held = live[ACT] + live[FWD_TEMP] + live[BWD_TEMP]
        start = (live[ACT], live[FWD_TEMP], live[BWD_TEMP], 0, None)
        return Stretch(
            peak=held,
            peak_activations=live[ACT],
            peak_forward_temp=live[FWD_TEMP],
            peak_in_place=(held, live[ACT], live[FWD_TEMP]),
            peak_unbuffered=(held - self._call_grads.bytes, live[ACT], live[FWD_TEMP]),
            moments=(
                StretchMoments([start], call_grads=[self._call_grads.bytes])
                if self._keep_moments
                else None
            ),
        )

    def _on_hook(self, entry: Any) -> None:
        name, index = entry[0], entry[1]
        if torch._C._current_graph_task_id() != -1:
            self._end_loss()
        self.marks.append(self._close_stretch())
        if name.startswith("post_backward"):
            self._forget_grads(self._unit_names[index])
        elif name == "pre_forward":
            self._param_views.forward(self._unit_names[index])
            self._call_grads.forward(self._unit_names[index])
        elif name == "final_callback":
            for unit in self._by_unit:
                self._forget_grads(unit)
            # the gradients of parameters FSDP does not manage stay in .grad to the optimizer step
            # (the model counts them); the next makes them anew, as after zero_grad(set_to_none)
            for p in self._by_unit.get(IGNORED, []):
                p.grad = None

    def _forget_grads(self, unit: str) -> None:
        """The unit's gradient is reduced now: stop counting it (the model does)."""
        for p in self._by_unit.get(unit, []):
            self._param_grad.pop(id(p), None)
            st = None if p.grad is None else storage_of(p.grad)
            rec = None if st is None else self._live.pop(id(st), None)
            if rec is not None:
                self.live[rec[1]] -= rec[0]

    # --------------------------------------------------------------- result
    def profile(
        self, log: list[Any], n_events: list[int], backward: bool = True
    ) -> TraceProfile | None:
        """The measured profile, one :class:`StepProfile` per iteration (see ``cut_profile``;
        ``backward=False``: of one step that ran no backward, see ``without_backward``)."""
        marks, tails = self.marks, self._tails
        if not backward:
            marks, tails, log = without_backward(marks, tails, log, n_events)
        names = sorted(set(self.module_saved) | set(self.module_flops))
        modules = {n: {"saved_bytes": self.module_saved.get(n, 0.0),
                       "flops": self.module_flops.get(n, 0.0)} for n in names}  # fmt: skip
        base = TraceProfile([], modules, self.input_bytes, self.buffer_bytes, FLOP_OPS,
                            self.tokens, self.tp_ranks, self.tp_ranks)  # fmt: skip
        return cut_profile(marks, tails, log, n_events, self._unit_names, base, self._measure_calls)


def _detached(t: torch.Tensor) -> torch.Tensor:
    """``t.detach()``, an alias of its storage no operator of the trace ran."""
    with _disable_current_modes():
        return t.detach()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def traced_as_share(t: torch.Tensor) -> bool:
    """Whether the trace running now holds ``t`` as one tensor-parallel rank's 1/tp share
    (``False`` outside a trace): what code run by the trace, such as a loss, asks of its
    inputs."""
    return any(
        isinstance(mode, CostProbe) and mode.holds_share(t)
        for mode in _get_current_dispatch_mode_stack()
    )


def _peaks(s: Stretch) -> tuple[int, ...]:
    """The peaks of stretch ``s`` so far: ``peak``, ``peak_activations``,
    ``peak_forward_temp``, ``peak_grads``, ``peak_in_place``, ``peak_unbuffered``."""
    return (s.peak, s.peak_activations, s.peak_forward_temp, s.peak_grads,
            *s.peak_in_place, *s.peak_unbuffered)  # fmt: skip
