"""The walk behind :func:`fsdpviz.cost.memory.memory_model` (see its module docstring)."""

from __future__ import annotations

from collections.abc import Sequence

from fsdpviz.cost.grad_sizes import Upcast, tp_chunk_shares
from fsdpviz.cost.hook_calls import HookCall, Tape
from fsdpviz.cost.memory_fsdp1 import FSDP1Steps
from fsdpviz.cost.memory_fsdp2 import FSDP2Steps
from fsdpviz.cost.memory_pipeline import PipelineSteps
from fsdpviz.cost.memory_pools import StreamPools
from fsdpviz.cost.memory_records import WAITS, Block, MemoryRecords
from fsdpviz.cost.sizes import UnitBytes
from fsdpviz.schema.events import CP_KINDS, TP_KINDS, Event
from fsdpviz.schema.memory import CATEGORIES, POOLS, MemoryEvent, MemoryPeak, Moment
from fsdpviz.schema.report import IGNORED, Report

_POST_BACKWARD = ("post_backward", "post_backward_reshard_only")
_ACTIVATIONS = frozenset((*TP_KINDS, *CP_KINDS))  # collectives of activations, not of FSDP


class Walker(MemoryRecords, StreamPools, FSDP1Steps, FSDP2Steps, PipelineSteps):
    """Steps one iteration's tape and keeps bytes per category.

    ``carry``: the walk of the micro-step before this one in the same optimizer step
    (gradient accumulation): the parameters it left unsharded (``SHARD_GRAD_OP`` under
    ``no_sync``) and the gradients it left unreduced are there when this one starts.
    ``sync``: whether this micro-step reduces its gradients. Unreduced gradients accumulate
    as torch does:

    - autograd adds each new gradient into the one an earlier micro-step left, in place
      (FSDP1's ``no_sync``; FSDP2 when the gradients are in the reduce dtype already): the
      new one lives from the operator that makes it until it is added (the trace's
      ``peak_in_place``);
    - FSDP2 with a ``reduce_dtype`` the gradients are not in (``upcast``): a micro-step that
      does not reduce casts each unit's gradients to the reduce dtype in its post-backward
      (``FSDPParam.to_accumulated_grad_if_needed``, one parameter at a time, after
      resharding); the next micro-step's gradients land in ``.grad`` as usual and are added
      into that copy, and freed, at the start of the unit's post-backward
      (``accumulate_unsharded_grad_if_needed``), and the synced micro-step reduce-scatters it.

    A micro-step that reduces after one that did (accumulation without ``no_sync``: every
    micro-step reduces, ``memory_model(report, grad_accum=N)``) starts with the gradient
    shards the ones before left in ``.grad``; each reduction adds its new shard into the
    unit's, then frees it.

    ``all_reduce``: False for the micro-steps before the last under FSDP2's
    ``set_requires_all_reduce(False)`` (HSDP): each reduce-scatters (``sync``), its output
    added into the unit's partial reduce output, which the first of them allocates (in the
    reduce dtype, counted with the gradient shards it becomes); the last micro-step's
    reduction adds it into its own output and drops it.

    ``last_grads``: FSDP2, each unit's last parameter's gradient (bytes, compute dtype).
    FSDP2's reduction frees the gradients once copied into the reduce-scatter input, but for
    the last one: ``foreach_reduce``'s loop over them leaves it bound to the loop variable
    until the function returns, after the reduced shard is allocated.

    ``stale``: FSDP2, the post-forward shards (groups resharded after forward to fewer ranks)
    the iteration before left, by unit: see [Note: stale post-forward shards]. A carried
    walk passes its own.

    ``scaled``: FSDP2 with torchao's float8 all-gather, whether the units were gathered
    before this iteration (an earlier one ran): see [Note: float8 all-gather scales] in
    ``memory_fsdp2.py``.

    ``placed``: FSDP2, the units whose ``shard_placement_fn`` shards parameters on a dim other
    than 0 (:func:`~fsdpviz.cost.grad_sizes.placed_grads`), and two temporaries of theirs (see
    [Note: shard_placement_fn] in ``fsdpviz/plan/fsdp2_shards.py``): the copy-out gathers each such
    parameter into a temporary of its unsharded size before ``torch.cat`` puts its chunks in
    place (``UnitBytes.copy_out``, all alive at the copy-out); the reduction rebuilds each such
    gradient as ``torch.cat(torch.chunk(grad, W, dim), dim=0)``, one at a time (the loop
    variable holds the gradient it replaces until the next one), and the last parameter's
    stays beside the reduce-scatter input until the copy-in is done.

    ``copies``: FSDP1 ``NO_SHARD`` under CPU offload, the device copies of the host
    parameters that the iteration before left, by unit (see [Note: NO_SHARD's copies]). A
    carried walk passes its own.
    """

    def __init__(
        self,
        report: Report,
        sizes: dict[str, UnitBytes],
        tp: Tape,
        steady: bool,
        carry: Walker | None = None,
        sync: bool = True,
        all_reduce: bool = True,
        upcast: dict[str, Upcast] | None = None,
        last_grads: dict[str, int] | None = None,
        step: tuple[int, int] | None = None,
        placed: dict[str, tuple[int, ...]] | None = None,
        stale: dict[str, int] | None = None,
        scaled: bool = False,
        copies: dict[str, int] | None = None,
    ):
        self.sizes = sizes
        self.tape = tp
        self.sync = sync
        self.all_reduce = all_reduce
        self.upcast = upcast or {}
        self.last_grads = last_grads or {}
        self.placed = placed or {}
        # the optimizer step after this iteration: (its states' bytes, its temporaries)
        self.step = step
        self._leftover = 0  # the last gradient a reduction holds until its event is over
        # FSDP2 HSDP: what a unit's reduction holds until foreach_reduce returns, after the
        # all-reduce across the replicas (its last gradient, its partial reduce output)
        self._until_all_reduce: dict[str, int] = {}
        cfg = report.config
        self.fsdp2 = cfg.api == "FSDP2"
        # FSDP2's set_unshard_in_backward(False): their pre-backward neither gathers nor waits
        self._not_unsharded_in_backward = set(cfg.unshard_in_backward)
        # each unit's reduce-scatter group (``foreach_reduce``'s ``world_size``): a pipeline
        # rank's FSDP mesh is its data-parallel part only
        self._reduce_ranks = {u.module: u.shard_ranks for u in report.units if u.sharded_numel}
        prof = report.profile
        # tensor parallelism: the trace measured one rank's activations, temporaries and
        # gradients for a tp group of prof.tp_ranks (the parameters' sizes are already one
        # rank's); a plan for another degree scales them
        dims = cfg.parallel_dims
        self.tp = max(1, dims.tp // (prof.tp_ranks if prof else 1))
        # the parameters sharded on dim 0 over the tp ranks: the part of each a rank holds
        self.tp_chunks, self.tp_ranks = tp_chunk_shares(report), dims.tp
        self.raf_int = cfg.post_forward_ranks
        self.replicas = dims.dp_replicate
        # FSDP2 on a 2-D mesh: foreach_reduce all-reduces across the replicas, one included
        self.hsdp = self.fsdp2 and dims.hsdp
        self.cat = dict.fromkeys(CATEGORIES, 0)
        self.cat["sharded_params"] = sum(s.sharded for s in sizes.values())
        self.cat["optimizer"] = sum(s.optimizer for s in sizes.values()) if steady else 0
        self.cat["inputs"] = prof.input_bytes if prof else 0
        self.cat["buffers"] = prof.buffer_bytes if prof else 0
        self.resident: set[str] = set()
        self.pending: dict[str, tuple[int, bool]] = {}  # unit -> (bytes, prefetch)
        self._pipeline_setup(report)  # a pipeline's stages, their UNSHARDs and roots
        self.held: tuple[str, int] | None = None  # see FSDP2Steps._release_held
        self._recomputed: set[str] = set()  # ... and a recompute's
        self.copied: dict[str, int] = {}  # unit -> its shard copied to the device (offload)
        self.orig_views = not self.fsdp2 and cfg.use_orig_params
        self._fsdp1_setup(tp, report)  # FSDP1: its copies under CPU offload, its forwards
        self.grads: dict[str, int] = {}
        # reduce-scatter inputs in flight (category, bytes; on the compute stream); those of
        # shard groups of one rank, which foreach_reduce copies (no collective), are
        # temporaries, as FSDPMemTracker names them (it names a "Reduce Scatter" buffer by
        # the collective), kept in backward_temp beside what the trace measured (one_rank_rs)
        self.rs: list[tuple[str, int]] = []
        self.one_rank_rs = 0
        # the bytes in each pool besides the compute stream's (see [Note: stream pools]), and
        # those pools block by block, in order: (block, bytes) allocates, (block, 0) frees;
        # what the allocator's fixed segments are replayed over (memory_pools.fixed_segments)
        self.pools = dict.fromkeys(POOLS[1:], 0)
        self.blocks: dict[str, list[tuple[Block, int]]] = {p: [] for p in POOLS[1:]}
        self._live: dict[str, dict[Block, int]] = {p: {} for p in POOLS[1:]}
        self._carried_copies({} if carry is not None else copies or {})
        # the pool of each unit's gradient shard (:meth:`_grad_pool`)
        self._shard_pool: dict[str, str] = {}
        self.post_forward_shard: dict[str, int] = {}
        # [Note: stale post-forward shards] FSDP2's root post-backward callback reshards
        # every group its backward did not reach (``post_backward`` -> ``_to_sharded``):
        # a group resharded after forward onto fewer ranks becomes SHARDED, but
        # ``FSDPParam.to_sharded`` does not free ``_sharded_post_forward_param_data``, nor
        # does the next copy-out (``to_unsharded`` frees it only from SHARDED_POST_FORWARD).
        # The old shards live on, through the optimizer step, until the group's next
        # reshard after forward replaces them, each parameter's once its new one is cloned.
        # Groups that no gradient reaches (frozen layers before the first adapter) do it.
        self.stale: set[str] = set()
        self.records: list[MemoryEvent] = []
        # Every moment the total is looked at, in order: where it is (a stretch of compute,
        # an event, a hook), the event it precedes or happens in, and bytes per category.
        self.moments: list[Moment] = []
        self._call = 0
        self._event_index = -1
        self.unit_peaks: dict[str, dict[str, int]] = {}
        self.notes: list[str] = []
        if not tp.measured:
            self.notes.append(
                "no trace profile (a recording, or trace='fx'): activations and temporaries "
                "are unknown, and each unit's gradient appears at its reduce-scatter"
            )
        # Open per-unit windows: (total when opened, index into _totals where they opened).
        self._open: dict[tuple[str, str], tuple[int, int]] = {}
        self._totals: list[int] = []  # the total at every moment, for the windows' peaks
        # Closed windows: (unit, direction, total when opened, first and end moment index).
        self._closed: list[tuple[str, str, int, int, int]] = []
        self._closing: list[tuple[str, str]] = []
        self._since = 0
        self._peak = -1
        self._peak_at: MemoryPeak = {}
        self._root: str | None = None
        self.in_backward = False
        self._accumulating: set[str] = set()
        # FSDP1 under gradient accumulation: a unit's new gradient, added into the one an
        # earlier micro-step left, until its post-backward hook returns
        self._arriving: dict[str, int] = {}
        # FSDP2: units holding an accumulated gradient in the reduce dtype, and this
        # micro-step's new gradients of them (in .grad until the unit's post-backward)
        self._cast: set[str] = set()
        self._fresh: dict[str, int] = {}
        # FSDP2 HSDP, set_requires_all_reduce(False): each unit's reduce-scatter output the
        # micro-steps add into (the param group's partial reduce output), kept until the
        # last micro-step's final callback
        self._partial: dict[str, int] = {}
        # FSDP2 HSDP: each unit's all-reduced buffer where it is not its gradient shard
        # (:meth:`_hold_all_reduced`), until the end of the backward
        self._all_reduced: dict[str, int] = {}
        # FSDP2 HSDP: each unit's reduce-scatter output until the all-reduce returns, and
        # whether it is the gradient shard (:meth:`_hold_reduce_output`)
        self._shard_output: dict[str, bool] = {}
        # units whose new gradient shard this micro-step added into the one in .grad
        self._added_into: set[str] = set()
        # units whose reduced gradient shard is in .grad: this micro-step's reductions, and
        # (``_held``) the ones before it left, which a reduction adds into
        self.reduced: set[str] = set()
        self._held: set[str] = set()
        # float8 all-gather scales: see [Note: float8 all-gather scales] in memory_fsdp2.py
        f8 = report.config.float8 or {}
        self._precomputed = bool(steady and f8.get("precompute_float8_dynamic_scale_for_fsdp"))
        scaled_units = [u for u, b in sizes.items() if b.scales] if self.fsdp2 else []
        self._scales: dict[str, int] = {}  # unit -> its weights' current scales (bytes)
        self._gathering: set[str] = set()  # units whose all-gather made new scales
        self._fwd_saved: set[str] = set()  # units whose forward saved their scales
        self._saved: dict[str, int] = {}  # unit -> its forward's saved scales, replaced since
        self._scale_extra = 0  # the bytes of the scales besides those in use, in a temp
        if self._precomputed:
            self.cat["unsharded_params"] += sum(sizes[u].scales for u in scaled_units)
        elif scaled:
            self._scales = {u: sizes[u].scales for u in scaled_units}
        if carry is not None:
            self.resident = set(carry.resident)
            self.cat["unsharded_params"] = carry.cat["unsharded_params"]
            self.grads = dict(carry.grads)
            self.cat["unsharded_grads"] = carry.cat["unsharded_grads"]
            self._cast = set(carry._cast)
            self.cat["sharded_grads"] = carry.cat["sharded_grads"]
            self._partial = dict(carry._partial)
            self._accumulating = set(carry.grads) - self._cast
            self.reduced = set(carry.reduced)
            self._held = set(carry.reduced)
            self.pools = dict(carry.pools)  # those carried: the parameters, the gradients
            self.forward_copies = dict(carry.forward_copies)
            self.backward_copies = dict(carry.backward_copies)
            self._shard_pool = dict(carry._shard_pool)
            stale = carry.post_forward_shard
            if not self._precomputed:
                self._scales = dict(carry._scales)
        if self.fsdp2 and stale:
            self.post_forward_shard = dict(stale)
            self.stale = set(stale)
            self.cat["sharded_params"] += sum(stale.values())

    # ------------------------------------------------------------------ walk
    def run(self) -> None:
        for k, call in enumerate(self.tape.calls):
            self._call = k
            self._compute(call)
            self._hook(call)
        self._call = len(self.tape.calls)
        self._compute(self.tape.tail)
        self._window(self.tape.tail, opening=False)
        ignored = self.sizes.get(IGNORED)
        if ignored is not None and not self.tape.measured and IGNORED not in self.grads:
            # unmeasured: the gradients FSDP does not manage are there by the end
            self.grads[IGNORED] = ignored.grad
            self.cat["unsharded_grads"] += ignored.grad
        if self.step is not None:
            self._optimizer_step(*self.step)
        self._unit_peaks()
        self._free_live()

    def _optimizer_step(self, states: int, temporaries: int) -> None:
        """``optimizer.step()`` after the iteration: the states (made by the first step) and
        the step's own temporaries (:class:`~fsdpviz.cost.optimizers.OptimizerSpec`), beside every
        shard and its reduced gradient."""
        if states == 0 and temporaries == 0:
            return
        self.cat["optimizer"] = states + temporaries
        self._moment("during the optimizer step after", None)
        self.cat["optimizer"] = states

    def _compute(self, c: HookCall) -> None:
        ran = c.kernels or c.flops_forward + c.flops_backward
        # without a profile each event is a hook call: a post-backward's next event goes on
        same = c.hook.startswith("post_backward") and (c.unit, "backward") in self._closing
        if self._closing and (ran or (c.hook != "pre_backward" and not same)):
            for key in self._closing:
                self._close(key)
            self._closing.clear()
        if self.tape.measured:
            tp = self.tp
            self._release_forward_copies(c)  # FSDP1 NO_SHARD: see [Note: NO_SHARD's copies]
            at_peak = (c.peak, c.peak_activations, c.peak_forward_temp, c.peak_grads)
            buffered, left = (0, 0) if self.fsdp2 else self._buffered_gradients(c)
            self._stretch_peak(c, at_peak, c.peak_in_place, buffered)
            for unit, n in c.grads.items():
                if unit in self._accumulating:
                    # added in place to the gradient an earlier micro-step left; FSDP1's
                    # post-backward hook, a hook of the FlatParameter's AccumulateGrad node,
                    # is passed the node's incoming gradient and holds it until it returns
                    if not self.fsdp2 and unit != IGNORED:
                        self._arriving[unit] = self._arriving.get(unit, 0) + n // tp
                        self.cat["unsharded_grads"] += n // tp
                    continue
                if unit in self._cast:  # in .grad until the unit's post-backward
                    self._fresh[unit] = self._fresh.get(unit, 0) + n // tp
                else:
                    self.grads[unit] = self.grads.get(unit, 0) + n // tp
                self.cat["unsharded_grads"] += n // tp
            self.cat["activations"] = c.activations // tp
            self.cat["forward_temp"] = c.forward_temp // tp
            self.cat["backward_temp"] = c.backward_temp // tp + self.one_rank_rs - left
            self.cat[self._scale_temp()] += self._release_saved(c)
        if ran and self._dropping:  # the backward nodes that saved views of them ran
            for unit in self._dropping:
                self._drop_saved_copies(unit)
            self._dropping.clear()
        if c.hook == "pre_backward" and not self.in_backward:
            self.cat["forward_temp"] -= self._scale_extra
            self.cat["backward_temp"] += self._scale_extra
            self.in_backward = True
        self._window(c, opening=True)

    def _stretch_peak(
        self, c: HookCall, at_peak: Sequence[int], in_place: Sequence[int] | None, less: int = 0
    ) -> None:
        """The most activations + temp + new gradients the trace saw in the compute before
        ``c`` (``at_peak``: peak, activations, forward temp, grads; ``in_place``: the peak,
        activations and forward temp with new gradients left out), as a moment."""
        tp, after = self.tp, dict(self.cat)
        peak, act, fwd, new = at_peak
        in_place_only = self._accumulating.issuperset(c.grads)
        if self._accumulating and c.grads and in_place and in_place_only:
            # each new gradient is added into an earlier micro-step's and freed
            peak, act, fwd, new = in_place[0], in_place[1], in_place[2], 0
        if less and c.peak_unbuffered and in_place_only:
            # FSDP1: the trace measured the stretch without the gradients one forward call
            # made that autograd held for another call's, which FSDP1 adds into .grad at
            # once (see [Note: a unit run twice under parameter mixed precision])
            unbuffered = c.peak_unbuffered
            peak, act, fwd, new = unbuffered[0], unbuffered[1], unbuffered[2], 0
            less = 0
        self.cat["unsharded_grads"] += new // tp
        self.cat["activations"] = act // tp
        self.cat["forward_temp"] = fwd // tp
        self.cat["backward_temp"] = (peak - act - fwd - new) // tp + self.one_rank_rs - less
        self.cat[self._scale_temp()] += self._scale_extra - self._saved_freed(c)
        self._moment("during the compute before", c)
        self.cat = after

    def _hook(self, c: HookCall) -> None:
        unit = c.unit
        self._pipeline_action(c)
        if self.fsdp2 and c.hook == "pre_forward" and self._root is None:
            self._root = unit
        events = self.tape.events
        waits = c.hook in WAITS
        own_gather = waits and any(
            events[e].kind == "all_gather" and events[e].unit == unit for e in c.events
        )
        if waits and not own_gather:
            self._wait(unit, c)
        # accumulating: the units finishing here (the final callback: those whose hook did not fire)
        finishing: list[str] = []
        if self._fresh or not self.sync:
            if c.hook in _POST_BACKWARD:
                finishing = [unit]
            elif c.hook == "final_callback":
                finishing = [u for u in self.grads if u not in self._cast or u in self._fresh]
        callback = self._callback_order(c, finishing) if c.hook == "final_callback" else None
        self._accumulate_fresh(finishing if callback is None else ())
        if c.hook in _POST_BACKWARD and (unit in self._saved or unit in self._fwd_saved):
            self._saved.pop(unit, None)  # the unit's backward let go of its forward's
            self._fwd_saved.discard(unit)
            self._rescale()
        if self.fsdp2 and c.hook == "post_forward":
            # ModTracker's global forward hook leaves the module before FSDP2's post-forward
            # runs (nn.Module._call_impl runs global hooks first): its resharding is outside
            # the unit's forward window (inside its parents'); FSDP1's runs inside it.
            self._window(c, opening=False)
        if not self.fsdp2:  # a reshard drops device copies of the host parameters
            self._reshard_copies(c)
            self._first_forward_gradient(c)
        reducing = {events[e].unit for e in c.events if events[e].kind == "reduce_scatter"}
        # FSDP2's post-backward, resharded, lets go of the reduce-scatter inputs kept by groups
        # before (``reduce_scatter_states``), frozen ones too, not without sync; the root's final
        # callback runs each post-backward that did not fire (frozen), which lets go the same
        reclaims = self.fsdp2 and self.sync and c.hook in ("post_backward", "final_callback")
        steps: list[tuple[tuple[str, ...], Sequence[int]]] = callback or [((), c.events)]
        for done, evs in steps:
            self._accumulate_fresh(done)
            for e in evs:
                ev = events[e]
                self._event_index = e
                if ev.unit in reducing:  # the unit's post-backward begins
                    self._redistribute_grads(ev, c, reducing)
                self._event(ev, c)
                if waits and ev.kind == "all_gather" and ev.unit == unit:
                    self._wait(unit, c)
                self._snapshot(e)
                if self.fsdp2 and ev.hook is not None:
                    self._redistribute_partial_grad(ev, c)  # a tp post-backward's
                in_callback = c.hook == "final_callback"
                if reclaims and ev.kind == "free" and (ev.unit == unit or in_callback):
                    self._release_reduce_scatter()
                self._event_index = -1
            for u in (done if callback else finishing) if not self.sync else ():
                self._cast_to_reduce_dtype(u, c)
        if c.hook in _POST_BACKWARD:
            self._unsharded_grad_views(c)  # FSDP1 under no_sync, before the hook returns
            self.cat["unsharded_grads"] -= self._arriving.pop(unit, 0)
        if c.hook == "final_callback" and self.sync:
            self._keep_low_precision(c)
            for u in self.reduced:  # CPU offload: .grad is the host copy from here on
                if self.sizes[u].grad_to_host:
                    self._drop_shard(u)
        if c.hook == "final_callback":
            self._release_reduce_scatter()
            self._release_all_reduced()
            # finalize_backward, in the last backward only, frees the all-gathers no hook
            # waited for (a unit whose backward never ran: frozen, its inputs needing no
            # gradient, prefetched by the unit after it); a pipeline's microbatches keep them
            # to REDUCE_GRAD, with FSDP2's _all_gather_result
            for name in list(self.pending) if not self._microbatch_backward else ():
                if self._root_of.get(name, unit) == unit:
                    self._drop_pending(name)
            self._moment("after the final callback of", c)
        # unmeasured (HookCall.param_views_freed): dropped after the compute that follows
        dropping = unit in self.saved_copies and unit not in self._views_freed
        if c.hook == "pre_backward" and dropping:
            self._dropping.add(unit)
        root = unit == self._root or unit in self._stage_roots
        ahead = self._recomputed if self.in_backward else ()  # a recompute's root, in backward
        root_done = (root and not self.in_backward) or unit in ahead
        if self.fsdp2 and c.hook == "post_forward" and root_done:
            self._release_held(unit)  # the forward root's post-forward frees the kept buffer
        self._window(c, opening=False)
        if c.hook == "final_callback":
            self.in_backward = False

    # ---------------------------------------------------------------- events
    def _event(self, e: Event, c: HookCall) -> None:
        s = self.sizes.get(e.unit)
        # a send or receive: its buffers are the inputs'; a float8 amax all-reduce: a scalar
        if s is None or e.pipeline or e.group == "shard":
            return
        if e.kind == "h2d" and s.communicates and self.fsdp2:  # the copy, until gathered
            self._alloc("all_gather", self._h2d_pool(), ("h2d", e.unit), s.h2d)
            self.copied[e.unit] = s.h2d
        elif e.kind == "h2d" and s.communicates:
            self._copy_to_device(e, s, c)
        elif e.kind in ("h2d", "cast") or (e.kind == "free" and not s.communicates):
            if not self.fsdp2:
                self._no_shard_copy(e, s, c)  # NO_SHARD's copies: see [Note: NO_SHARD's copies]
        elif e.kind == "d2h":
            pass  # into the host buffer
        elif e.kind in _ACTIVATIONS:  # an activation's: its buffers the compute's temporaries
            self._pad_partial_grad(e)  # (a post-backward's partial gradient's: its padding)
        elif e.kind == "all_gather":
            n = s.all_gather if self.fsdp2 else s.unsharded
            self.pending[e.unit] = (n, e.prefetch)
            if self.in_backward and e.phase == "forward":  # see FSDP2Steps._release_held
                self._recomputed.add(e.unit)
            if s.scales and self.fsdp2 and not self._precomputed:
                self._gathering.add(e.unit)  # fsdp_pre_all_gather's new scales
                self._rescale()
            if e.action is not None and e.action.endswith("UNSHARD"):
                # a pipeline stage's UNSHARD (unshard(async_op=True)) gathers on the compute
                # stream: its buffer is the compute pool's, counted with the parameters
                self.on_compute.add(e.unit)
                self.cat["unsharded_params"] += n
            # the shards cast for the copy-in, then the output (FSDP2 gathers in place)
            copies = self._copy_pool(e.unit)
            copy_in = self._copy_in(e.unit, s) if self.fsdp2 else s.copy_in
            if self.fsdp2 or e.unit not in self.copied:  # FSDP1 offloaded: made at h2d
                self._alloc("all_gather", copies, ("in", e.unit), copy_in)
            if e.unit not in self.on_compute:
                self._alloc("all_gather", "all_gather", ("out", e.unit), n)
            if copy_in or e.unit in self.copied:  # the shard's copy or cast, freed once gathered
                self._moment("at", c, e)
                self._free("all_gather", copies, ("in", e.unit), copy_in)
                h2d = self.copied.pop(e.unit, 0)
                self._free("all_gather", self._h2d_pool(), ("h2d", e.unit), h2d)
        elif e.kind == "free":
            if e.unit in self.pending:
                self._drop_pending(e.unit)
            elif e.unit in self.resident:
                self.resident.discard(e.unit)
                raf = self.raf_int.get(e.unit)
                old = e.unit in self.stale
                if raf and e.phase == "forward":
                    self._reshard_post_forward(e, s, raf, old)
                if self.fsdp2:
                    self.cat["unsharded_params"] -= s.unsharded + self._scales.get(e.unit, 0)
                    self._rescale()  # the scales stay
                else:  # FSDP1: the unsharded FlatParameter, the unshard stream's block
                    self._free("unsharded_params", "all_gather", ("out", e.unit), s.unsharded)
                if raf and e.phase == "forward":
                    if old:  # replaced: see [Note: stale post-forward shards]
                        self.stale.discard(e.unit)
                        self.cat["sharded_params"] -= self.post_forward_shard.pop(e.unit)
                    self.post_forward_shard[e.unit] = s.unsharded // raf
                    self.cat["sharded_params"] += s.unsharded // raf
        else:
            self._reduce(e, s)
        self._moment("at", c, e)
        if e.unit in self._until_all_reduce and e.kind == "reduce_scatter":
            return  # foreach_reduce goes on to the all-reduce across the replicas
        if self._leftover:
            self.cat["unsharded_grads"] -= self._leftover
            self._leftover = 0
        if e.group == "replicate" and e.unit in self._until_all_reduce:
            partial = self._until_all_reduce.pop(e.unit)
            self._free("sharded_grads", "reduce_scatter", ("partial", e.unit), partial)

    def _wait(self, unit: str, c: HookCall) -> None:
        s = self.sizes.get(unit)
        if s is None or unit in self.resident:
            return
        pending = self.pending.pop(unit, None)
        if pending is None and not self.fsdp2:
            return  # NO_SHARD, or never resharded
        if pending is None and self.in_backward and unit in self._not_unsharded_in_backward:
            return  # FSDP2 left it sharded (set_unshard_in_backward(False))
        self.resident.add(unit)
        if self.fsdp2:
            dropped = self._scales_out(unit, s, pending is not None, c)
            self.cat["unsharded_params"] += s.unsharded + self._scales.get(unit, 0)
            self._rescale()
        elif pending is not None:  # FSDP1: the FlatParameter in use, the same block
            self._add("all_gather", "all_gather", -pending[0])
            self._add("unsharded_params", "all_gather", s.unsharded)
        # FSDP2: the copy-out's temporaries of parameters sharded on a dim other than 0, and
        # the scales its fsdp_post_all_gather then replaces
        temp = ((s.copy_out if pending else s.one_rank_copy) + dropped) if self.fsdp2 else 0
        temps = "backward_temp" if self.in_backward else "forward_temp"
        self.cat[temps] += temp
        self._moment("at the copy-out in", c)
        self.cat[temps] -= temp
        if unit in self.post_forward_shard and unit not in self.stale:
            self._drop_post_forward_shard(unit)
        if not self.fsdp2 or pending is None:
            return
        if unit in self.on_compute:  # a stage's UNSHARD: copied out, its buffer freed
            self.cat[self._pool_of(unit)] -= pending[0]
            return
        forward = c.hook == "pre_forward" and (not self.in_backward or unit in self._recomputed)
        if forward:
            self._release_held()
        # a forward copy-out keeps it to the next copy-out (``wait_for_unshard``: in forward,
        # an all-gather without a work handle, an explicit prefetch's too, whatever its
        # docstring says; from 2.9 where the shard group has ranks besides this one, where
        # alone it all-gathers)
        if forward:
            self.held = (unit, pending[0])
        else:
            self._free("all_gather", "all_gather", ("out", unit), pending[0])

    def _reduce(self, e: Event, s: UnitBytes) -> None:
        if e.group == "replicate":  # hybrid sharding all-reduces the reduce output in place
            self._hold_all_reduced(e, s)
            return
        grads = self.grads.pop(e.unit, 0)
        if not self.tape.measured:
            grads = s.grad
            self.cat["unsharded_grads"] += grads
        if not self.fsdp2:
            self._reduce_fsdp1(e, s, grads)
            return
        if e.kind == "all_reduce":
            self.cat["unsharded_grads"] -= grads
            self._add_shard(e, s.sharded_grad, "reduce_scatter")
            return
        self._release_reduce_scatter()
        kept = self._chunk_cat(e, grads)
        # a shard group of one rank copies the input instead of reduce-scattering it
        # (foreach_reduce: ``if world_size > 1``): a temporary, no collective's buffer
        rs = "reduce_scatter" if self._regroups(e.unit) else "backward_temp"
        self.cat[rs] += s.reduce_scatter  # made on the compute stream
        if rs == "backward_temp":
            self.one_rank_rs += s.reduce_scatter
        self._moment("at", None, e)  # the copy-in: gradients and the input both alive
        self.cat["backward_temp"] -= kept
        last = self.last_grads.get(e.unit, 0) if self._regroups(e.unit) and grads else 0
        if last and e.unit in self._cast:  # accumulated in the reduce dtype
            last = round(last * self.upcast[e.unit].ratio)
        elif last and self._moved_to_reduce_dtype(e.unit, grads):
            last = round(last * self._pipeline_upcast[e.unit].ratio)
        self._leftover = min(last, grads)
        self.cat["unsharded_grads"] -= grads - self._leftover
        if self.all_reduce:
            # the last micro-step adds the partial output into its own, then drops it: the
            # param group's _partial_reduce_output, rebound once foreach_reduce returns
            if self.hsdp:
                self._hold_reduce_output(e, s)
                self._until_all_reduce[e.unit] = self._partial.pop(e.unit, 0)
            else:
                output = self._cast_reduce_output(e, s)
                self._add_shard(e, s.sharded_grad, self._grad_pool(e, s), output)
                partial = self._partial.pop(e.unit, 0)
                self._free("sharded_grads", "reduce_scatter", ("partial", e.unit), partial)
        elif e.unit not in self._partial:  # later micro-steps add into it (and free theirs)
            self._partial[e.unit] = s.partial
            self._alloc("sharded_grads", "reduce_scatter", ("partial", e.unit), s.partial)
        self.rs.append((rs, s.reduce_scatter))

    def _add_shard(
        self, e: Event, n: int, pool: str, replaced: tuple[Block, int] | None = None
    ) -> None:
        """A reduction's new gradient shard (``n`` bytes, made on ``pool``'s stream): the
        unit's ``.grad``, or, where an earlier micro-step or reduction left one there, added
        into it and freed (``foreach_reduce``: ``sharded_param.grad._local_tensor +=
        new_sharded_grad``). A module run twice reduces twice in a micro-step after one
        without gradient sync: its first post-backward finds the gradient accumulated before
        (autograd sums a parameter's two uses before its ``.grad``), its second the new one.
        ``replaced``: the reduction's output on the reduce-scatter stream the shard was cast
        from, freed once the shard is made, or, named ``("grad", unit)``, the shard itself
        (no cast made a new one)."""
        new = e.unit not in self._held and e.unit not in self.reduced
        block: Block = ("grad", e.unit)
        if new and replaced is not None and replaced[0] == block:
            self._add("sharded_grads", pool, n - replaced[1])  # the output is the shard
        else:
            if not new or block in self._live.get(pool, {}):
                block = ("grad", e.unit, len(self.moments))
            self._alloc("sharded_grads", pool, block, n)
            if replaced is not None:
                self._free("sharded_grads", "reduce_scatter", *replaced)
        if new:
            self._shard_pool[e.unit] = pool
        else:
            self._moment("at the addition into the accumulated gradient shard of", None, e)
            self._free("sharded_grads", pool, block, n)
            self._added_into.add(e.unit)
        self.reduced.add(e.unit)

    def _release_reduce_scatter(self) -> None:
        while self.rs:
            rs, n = self.rs.pop()
            self.cat[rs] -= n
            if rs == "backward_temp":
                self.one_rank_rs -= n

    def _drop_pending(self, unit: str) -> None:
        n, _ = self.pending.pop(unit)
        pool = self._pool_of(unit)
        if pool == "all_gather":
            self._free(pool, pool, ("out", unit), n)
        else:
            self.cat[pool] -= n
