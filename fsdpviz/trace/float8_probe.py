"""A float8 linear's kernels as :class:`~fsdpviz.trace.probe.CostProbe` counts them: the
casts around each matrix multiply (:func:`~fsdpviz.trace.fusion.float8_casts`), whether the
multiply runs in float8, and the rescaling of a rowwise backward multiply's output, eager or
placed in the fused kernel that reads it next under ``torch.compile``.
:class:`Float8Accounting` is the part of the probe that does it."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, Protocol

import torch
from torch.utils import checkpoint as _checkpoint
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils.checkpoint import (
    CheckpointPolicy,
    SelectiveCheckpointContext,
    _CachedTorchDispatchMode,
    _CachingTorchDispatchMode,
)

from fsdpviz.trace.fusion import (
    FusedRegions,
    ModuleScope,
    float8_casts,
    float8_gemm,
    float8_rescale,
)
from fsdpviz.trace.operators import op_tensors
from fsdpviz.trace.probe_records import (
    ACT,
    BWD_TEMP,
    FWD_TEMP,
    Stretch,
    TPShares,
    local_gemm,
    storage_of,
)
from fsdpviz.trace.recomputation import recomputing

# A selective checkpoint's cache: newer torch (2.13) keeps each operator's outputs by call index,
# marking an entry recomputed or taken (these markers); torch 2.8 keeps a list the
# recomputation pops from.
_RECOMPUTE = getattr(_checkpoint, "_RECOMPUTE", object())
_CONSUMED = getattr(_checkpoint, "_CONSUMED", object())

__all__ = ["Float8Accounting", "Float8Host", "float8_cast_bytes"]

_SIZES = {2: torch.bfloat16, 4: torch.float32, 1: torch.float8_e4m3fn, 8: torch.float64}


def float8_cast_bytes(
    recipe: str, grad: bool, first: bool, a: tuple[int, int, int], b: tuple[int, int, int]
) -> list[tuple[int, int]]:
    """The casts torchao's ``matmul_with_hp_or_float8_args`` makes for one matrix multiply
    ``a @ b`` of a float8 linear, in its order, each as (elements, scales): ``a`` and ``b``
    as (elements, rows, columns) of the high-precision operands this trace multiplies
    (forward: the input and the transposed weight; the input's gradient: the output
    gradient and the weight; the weight's: the output gradient transposed and the input).
    Tensorwise scaling keeps one scale per tensor; rowwise scales along the dimension the
    multiply reduces (``get_maybe_axiswise_dim``): one per row of ``a`` and per column of
    ``b``; ``rowwise_with_gw_hp`` casts its weight tensorwise for the input's gradient and
    nothing for the weight's (computed in high precision)."""
    if grad and not first and recipe == "rowwise_with_gw_hp":
        return []
    axis_a = recipe != "tensorwise"
    axis_b = recipe == "rowwise" or (recipe == "rowwise_with_gw_hp" and not grad)
    return [(a[0], a[1] if axis_a else 1), (b[0], b[2] if axis_b else 1)]


def _cast_peak(
    casts: list[tuple[int, int]], fused: bool = False, saved: int = 0
) -> tuple[int, int]:
    """The most bytes torchao's casts hold at once above what was alive before them, and
    what they leave (each float8 tensor and its float32 scales, alive until the autograd
    function returns). One eager cast (``hp_tensor_to_float8_dynamic``: the scales from the
    amax, then ``_ToFloat8ConstrFunc``'s ``tensor.to(float32) * scale`` and
    ``to_fp8_saturated``'s clamp and cast) holds at its end the product and the clamped
    tensor in float32 and the float8 result: 9 bytes an element, and its scales. ``fused``
    (``torch.compile``): Inductor computes the cast in the kernel that writes the float8
    result, one byte an element. ``saved``: the bytes of each cast's amax that selective
    checkpointing saves (:meth:`Float8Accounting._float8_saved_amaxes`), alive from the cast's
    start."""
    most = kept = 0
    for n, scales in casts:
        kept += saved
        most = max(most, kept + (1 if fused else 9) * n + 4 * scales)
        kept += n + 4 * scales
    return most, kept


class Float8Host(Protocol):
    """What the float8 accounting reads and calls of the probe it is part of."""

    _float8_weights: dict[int, weakref.ref[Any]]
    _rescales: dict[int, tuple[weakref.ref[Any], int, int, float, float]]
    _float8_gathered: bool
    _float8_recipe: str
    _float8_fused: bool
    _float8_pair: weakref.ref[Any] | None
    _float8_running: tuple[torch.Tensor, Any, Any] | None
    # SAC storage id -> the amaxes its forward's casts saved, oldest first
    _float8_amaxes: dict[int, list[torch.Tensor]]
    # the selective checkpoint's dispatch mode the running float8 linear's forward is under
    # (found in its forward pre-hook: inside an operator the modes above the probe's are off)
    _float8_sac: Any
    _float8_seen: bool  # the running float8 linear's forward multiply reached the probe
    # the running float8 linear's weight FSDP2 gathered in float8 (its storage) and its unit,
    # while its forward may save it; the stretch a backward node lets its scale go in
    _float8_saving: tuple[Any, str] | None
    _stretch: Stretch
    _by_unit: dict[str, list[torch.nn.Parameter]]
    _float8: ModuleScope | None
    _float8_data: dict[int, weakref.ref[Any]]
    _in_float8: bool
    _float8_inputs: dict[int, bool]
    _float8_hooks: list[Any]
    _live: dict[int, list[Any]]
    _tp: TPShares | None
    live: list[int]
    _fused: FusedRegions

    def _add_kernel(self, key: tuple[Any, ...], count: int, nbytes: float) -> None: ...
    def _fusing(self) -> bool: ...
    def _local_numel(self, t: torch.Tensor) -> int: ...
    def _local_bytes(self, x: Any) -> int: ...
    def _bump_peak(self) -> None: ...
    def _share(self, t: Any) -> Fraction | None: ...
    def redistributed(self, share: Fraction | None) -> Any: ...
    def _float8_over(self, kind: int, extras: list[int]) -> None: ...
    def _hold(self, st: Any, key: int, n: int, kind: int) -> None: ...
    def _float8_enter(self, module: torch.nn.Module, args: Any) -> None: ...
    def _float8_leave(self, module: torch.nn.Module, args: Any, out: Any) -> None: ...


class Float8Accounting:
    """The probe's methods for float8 linears (a mixin of
    :class:`~fsdpviz.trace.probe.CostProbe`, typed by :class:`Float8Host`)."""

    _float8_pair: weakref.ref[Any] | None
    _float8_running: tuple[torch.Tensor, Any, Any] | None
    _float8_saving: tuple[Any, str] | None

    def _float8_setup(
        self: Float8Host,
        float8: list[torch.nn.Module] | None,
        gathered: bool,
        recipe: str,
        fused: bool,
    ) -> None:
        """The probe's float8 state: the float8 linears (``float8``), whether FSDP gathers
        their weights in float8 (``gathered``), the recipe, and whether the job compiles
        (``fused``: casts in compiled modules fused)."""
        self._float8 = ModuleScope("float8", float8) if float8 else None
        # a float8 linear whose forward a checkpoint's recomputation runs: its input and
        # weight, until the forward returns (see Float8Accounting._float8_stopped)
        self._float8_running = None
        self._float8_saving = None
        self._float8_amaxes = dict[int, list[torch.Tensor]]()
        self._float8_sac = None
        self._float8_seen = False
        self._float8_hooks = [
            h
            for m in float8 or ()
            for h in (
                m.register_forward_pre_hook(self._float8_enter),
                m.register_forward_hook(self._float8_leave),
            )
        ]
        self._float8_gathered = gathered
        self._float8_recipe = recipe
        self._float8_fused = fused  # the job compiles: casts in compiled modules fused
        # the storages of the float8 linears' weights as their forward multiplies read them
        # (by id, held weakly): backward's multiply that reads one computes the input's
        # gradient, the other the weight's, in whichever order autograd runs them
        self._float8_weights = dict[int, weakref.ref[Any]]()
        # storages that hold float8 data where the trace holds high precision (by id, held
        # weakly: an activation or gradient torchao's float8 tensor-parallel styles cast),
        # counted at one byte an element; inside made_in_float8() every new one is such
        self._float8_data = dict[int, weakref.ref[Any]]()
        self._in_float8 = False
        # weight storage id -> whether the input of its float8 linear's forward was float8
        self._float8_inputs = dict[int, bool]()
        # the output gradient of the float8 linear whose backward's first multiply ran last
        self._float8_pair = None

    @contextmanager
    def made_in_float8(self: Float8Host, on: bool = True) -> Iterator[None]:
        """The tensors made in this block hold float8 data (``on``): one byte an element
        where the trace's tensor is in high precision (a tp collective's buffer of a
        float8 activation or gradient)."""
        before, self._in_float8 = self._in_float8, on or self._in_float8
        try:
            yield
        finally:
            self._in_float8 = before

    def is_float8(self: Float8Host, t: Any) -> bool:
        """Whether tensor ``t`` holds float8 data where the trace holds high precision."""
        st = storage_of(t) if isinstance(t, torch.Tensor) else None
        ref = None if st is None else self._float8_data.get(id(st))
        return ref is not None and ref() is st

    def float8_cast(self: Float8Host, t: torch.Tensor) -> torch.Tensor:
        """torchao's tensorwise cast of an activation or a gradient by a float8 tensor-parallel
        style (``hp_tensor_to_float8_dynamic`` on the DTensor: each rank casts its part):
        the cast's moment (:func:`_cast_peak`) and kernels (an amax and a scaled cast,
        fused under ``torch.compile``), and the float8 tensor it makes, of ``t``'s share."""
        backward = int(torch._C._current_graph_task_id() != -1)
        n = self._local_numel(t) if self._tp is not None else t.numel()
        fused = self._float8_fused and self._fusing()
        most, _ = _cast_peak([(n, 1)], fused)
        self._float8_over(BWD_TEMP if backward else FWD_TEMP, [most])
        high = n * t.element_size()
        self._add_kernel(("mem", backward), 2, 2.0 * high + n)
        if self._fusing():
            self._fused.extra(backward, 2, 2.0 * high + n, float(high + n), 1)
        with self.redistributed(self._share(t)), Float8Accounting.made_in_float8(self):
            out = t.clone()
        Float8Accounting.float8_scale(self, out)
        return out

    def float8_scale(self: Float8Host, t: torch.Tensor) -> None:
        """The float32 scale a float8 tensor ``t`` the probe holds keeps beside it (4 bytes,
        whole on every rank: tensorwise), counted with it. The tensor a collective makes of
        a cast one takes the cast's scale, which lives on with it."""
        st = storage_of(t)
        rec = None if st is None else self._live.get(id(st))
        if rec is None:
            return
        rec[0] += 4
        self.live[rec[1]] += 4
        self._bump_peak()

    def _float8_casts(
        self: Float8Host,
        backward: int,
        grad: bool,
        a: torch.Tensor,
        b: torch.Tensor,
        out_bytes: int = 0,
        made: bool = False,
    ) -> bool:
        """The casts around a float8 linear's matrix multiply (:func:`float8_casts`; ``grad``:
        one of its backward's, not its forward run in the ``backward`` phase by a
        recomputation); whether the multiply runs in float8 (:func:`float8_gemm`).
        ``made``: a forward multiply whose output the trace does not hold
        (:meth:`_float8_stopped`)."""
        weights = self._float8_weights
        first = True
        if not grad:
            st = storage_of(b)
            if st is not None:
                weights[id(st)] = weakref.ref(st)
        else:  # the input's gradient multiplies by the weight, the weight's does not
            first = False
            for t in (a, b):
                st = storage_of(t)
                ref = None if st is None else weights.get(id(st))
                first = first or (ref is not None and ref() is st)
        compiled = self._fusing()
        recipe = self._float8_recipe
        share = self._local_numel if self._tp is not None else None
        # operands a float8 tensor-parallel style cast already (tensor_already_casted_to_fp8):
        # forward the input, backward the output gradient, and the input the weight's
        # gradient multiplies (as its forward found it, by the weight)
        a_f8 = Float8Accounting.is_float8(self, a)
        if not grad:
            st = storage_of(b)
            if st is not None:
                self._float8_inputs[id(st)] = a_f8
            input_f8 = a_f8
        elif first:
            st = storage_of(b)
            input_f8 = st is not None and self._float8_inputs.get(id(st), False)
        else:
            input_f8 = Float8Accounting.is_float8(self, b)
        casts = float8_casts(
            grad, a, b, self._float8_gathered, first, recipe, share, float8_operand=a_f8
        )
        for count, eager, kernels, fused in casts:
            self._add_kernel(("mem", backward), count, eager)
            if compiled:
                self._fused.extra(backward, count, eager, fused, kernels)
        Float8Accounting._float8_memory(self, grad, first, a, b, out_bytes, made, (a_f8, input_f8))
        return float8_gemm(grad, first, recipe)

    def _float8_memory(
        self: Float8Host,
        grad: bool,
        first: bool,
        a: torch.Tensor,
        b: torch.Tensor,
        out: int,
        made: bool = False,
        float8: tuple[bool, bool] = (False, False),
    ) -> None:
        """The bytes torchao's eager float8 linear holds around this multiply beyond what the
        trace of the high-precision linear holds (its output, ``out`` bytes, tracked already):
        its casts (:func:`float8_cast_bytes`) before an output is made, then the float8
        operands they leave beside it until the autograd function returns. Its backward
        (``matmul_with_hp_or_float8_args.backward``) computes the input's gradient first,
        keeping its float8 operands while it casts for and computes the weight's; the trace
        of the high-precision linear runs the two multiplies in autograd's order, so at the
        first of them the whole backward is counted, and the second adds nothing. A weight
        FSDP2 gathered in float8 is cast by the all-gather, not here. Under ``torch.compile``
        (a compiled module's linear) the casts are fused (:func:`_cast_peak`). ``made``: a
        forward whose output the trace does not hold, allocated beside the float8 operands
        (:meth:`_float8_stopped`). ``float8``: whether the multiply's first operand (forward
        the input, backward the output gradient) and the linear's input are float8 already
        (a float8 tensor-parallel style cast them): torchao casts neither again."""
        fused = self._float8_fused and self._fusing()
        first_f8, input_f8 = float8
        kind = BWD_TEMP if torch._C._current_graph_task_id() != -1 else FWD_TEMP
        numel = self._local_numel if self._tp is not None else (lambda t: t.numel())
        recipe, gathered = self._float8_recipe, self._float8_gathered
        if not grad:
            self._float8_seen = True
            # torchao multiplies the input flattened to rows (``reshape(-1, in_features)``);
            # one rank's part under tensor parallelism: a row-wise linear splits the input and
            # the weight on the in-features k, a column-wise one the weight on the out-features
            # n (its rowwise scales one a local column)
            k, n = b.shape[-2], b.shape[-1]
            m = a.numel() // max(k, 1)
            s_a, s_b = numel(a) / max(a.numel(), 1), numel(b) / max(b.numel(), 1)
            if s_a < 1:
                k = max(round(k * s_a), 1)
            elif s_b < 1:
                n = max(round(n * s_b), 1)
            casts = float8_cast_bytes(recipe, False, True, (m * k, m, k), (k * n, k, n))
            casts = [c for c, done in zip(casts, (first_f8, gathered), strict=True) if not done]
            amaxes = Float8Accounting._float8_saved_amaxes(self, len(casts), a.element_size())
            most, kept = _cast_peak(casts, fused, amaxes[1])
            self._float8_over(kind, [most, kept + out] if made else [most - out, kept])
            amaxes[0]()
            return
        pending = self._float8_pair
        st = storage_of(a)
        if pending is not None and pending() is st:  # the linear's second multiply
            self._float8_pair = None
            return
        self._float8_pair = None if st is None else weakref.ref(st)
        go = a if first else a.transpose(-2, -1)  # the output gradient, rows by columns
        n = go.shape[-1]
        m = go.numel() // max(n, 1)  # its rows, the batch flattened
        k = b.shape[-1]  # the weight's in-features: its columns, the input's
        # one rank's part under tensor parallelism: a column-wise linear splits the
        # out-features n (the output gradient and the weight; the input and the input's
        # gradient, a partial sum, whole), a row-wise one the in-features k (the weight, the
        # input and both gradients; the output gradient whole)
        s_go = numel(go) / max(go.numel(), 1)
        s_b = numel(b) / max(b.numel(), 1)  # the weight's (first) or the input's share
        if s_go < 1:
            n = max(round(n * s_go), 1)
        elif s_b < 1:
            k = max(round(k * s_b), 1)
        isz = a.element_size()
        gi = float8_cast_bytes(recipe, True, True, (m * n, m, n), (n * k, n, k))
        gw = float8_cast_bytes(recipe, True, False, (m * n, n, m), (m * k, m, k))
        gi = [c for c, done in zip(gi, (first_f8, gathered), strict=False) if not done]
        gw = [c for c, done in zip(gw, (first_f8, input_f8), strict=False) if not done]
        gi_most, gi_kept = _cast_peak(gi, fused)
        gw_most, gw_kept = _cast_peak(gw, fused)
        gi_out, gw_out = m * k * isz, n * k * isz
        moments = [gi_most, gi_kept + gi_out, gi_kept + gi_out + gw_most]
        moments.append(gi_kept + gi_out + gw_kept + gw_out)
        self._float8_over(kind, [x - out for x in moments])

    def _float8_saved_amaxes(
        self: Float8Host, casts: int, size: int
    ) -> tuple[Callable[[], None], int]:
        """The amaxes of a forward's ``casts`` tensorwise casts (``size`` bytes each: the
        high-precision tensor's dtype) that per-operator selective checkpointing saves: its
        policy decides on ``aten.max.default`` (``tensor_to_amax``'s ``torch.max``, in
        torchtitan's save list: "the absolute maximum is used to compute the scaling
        factor"). The forward's are held from their casts until the recomputation's
        casts take them from the cache, each freed once its cast is done. Returns what to
        call once the casts' moments are counted (hold the forward's, free the
        recomputation's) and the bytes each cast adds to them (0 in the recomputation: its
        amaxes are held already)."""
        if self._float8_recipe != "tensorwise" or not casts:
            return (lambda: None), 0
        mode = self._float8_sac
        if mode is None:
            return (lambda: None), 0
        held = self._float8_amaxes.setdefault(id(mode.storage), [])
        if isinstance(mode, _CachedTorchDispatchMode):  # the recomputation's casts
            return (lambda: held.__delitem__(slice(0, casts))), 0
        amax = torch.empty((), dtype=_SIZES[size], device="meta")
        ctx = SelectiveCheckpointContext(is_recompute=False)
        policy = mode.policy_fn(ctx, torch.ops.aten.max.default, amax)
        if policy not in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE, True):
            return (lambda: None), 0

        def hold() -> None:
            for _ in range(casts):
                t = torch.empty((), dtype=_SIZES[size], device="meta")
                st = t.untyped_storage()
                self._hold(st, id(st), st.nbytes(), ACT)
                held.append(t)

        return hold, size

    def _float8_enter(self: Float8Host, module: torch.nn.Module, args: Any) -> None:
        """A float8 linear's forward pre-hook: the selective checkpoint's dispatch mode it runs
        under, and inside a checkpoint's recomputation its input and weight, held until its
        forward returns (:meth:`_float8_leave`) or the next operator finds it stopped
        (:meth:`_float8_stopped`; the input, saved for backward, outlives both)."""
        stack = _get_current_dispatch_mode_stack()
        sac = (_CachingTorchDispatchMode, _CachedTorchDispatchMode)
        self._float8_sac = next((m for m in stack if isinstance(m, sac)), None)
        self._float8_seen = False
        if recomputing() and args and isinstance(args[0], torch.Tensor):
            self._float8_running = (args[0], module.weight, self._float8_sac)
        weight: Any = module.weight
        if self._float8_gathered and torch._C._current_graph_task_id() == -1:
            unit = next(
                (u for u, ps in self._by_unit.items() if any(p is weight for p in ps)), None
            )
            st = storage_of(weight)
            self._float8_saving = None if unit is None or st is None else (st, unit)

    def float8_weight_saved(self: Float8Host, st: Any, packed: torch.Tensor) -> None:
        """A forward saving (``packed``, of storage ``st``) the weight FSDP2 gathered in float8
        of the float8 linear running: the scale it holds lives until the backward node that
        saved it lets it go (autograd frees a node's saved tensors once it has run), which
        the stretch then running counts (``Stretch.scales_freed``): see [Note: float8
        all-gather scales] in ``fsdpviz/cost/memory_fsdp2.py``."""
        saving = self._float8_saving
        if saving is None or saving[0] is not st:
            return
        self._float8_saving = None
        unit = saving[1]

        def freed() -> None:
            s = self._stretch
            s.scales_freed[unit] = s.scales_freed.get(unit, 0) + 4

        weakref.finalize(packed, freed).atexit = False

    def _float8_leave(self: Float8Host, module: torch.nn.Module, args: Any, out: Any) -> None:
        """A float8 linear's forward hook. In a recomputation under per-operator selective
        checkpointing, a linear whose ``mm`` output the forward saved gets it from the cache
        (``_CachedTorchDispatchMode``), so the trace saw no multiply: torchao's forward
        still casts its operands first (the output held, the amaxes taken from the
        cache), counted here, but no multiply runs."""
        running, self._float8_running = self._float8_running, None
        if running is not None and not self._float8_seen:
            Float8Accounting._float8_unseen(self, running, stopped=False)
        self._float8_sac = None
        self._float8_saving = None

    def _float8_stopped(self: Float8Host) -> None:
        """A checkpoint's recomputation stopped inside a float8 linear's forward (the first
        operator after it, out of the recomputation, finds its forward unreturned).

        Non-reentrant checkpointing stops recomputing once the last tensor its forward saved
        is saved again (``_StopRecomputationError`` from ``_recomputation_hook``'s pack hook).
        A plain linear's ``mm`` saves its inputs before it computes, so the stop comes before
        its kernel and the trace of it runs no multiply; torchao's
        ``matmul_with_hp_or_float8_args`` is an ``autograd.Function``, whose
        ``ctx.save_for_backward`` tensors autograd packs after ``forward`` returns: its casts
        and its float8 multiply have run, the output beside the float8 operands, before the
        stop frees them (a checkpointed block that ends in a float8 linear: the MLP's down
        projection recast in every block's backward). Under per-operator selective
        checkpointing a multiply whose output the forward saved takes it from the cache
        (``_CachedTorchDispatchMode`` marks the entry consumed): alive through the casts, and
        freed at the stop, where the trace's plain linear, never reaching its ``mm``, left
        it in the cache until the block's backward ended."""
        running, self._float8_running = self._float8_running, None
        assert running is not None
        if self._float8 is not None:
            self._float8.abandon()
        if not self._float8_seen:
            Float8Accounting._float8_unseen(self, running, stopped=True)
        self._float8_sac = None

    def _float8_unseen(
        self: Float8Host, running: tuple[torch.Tensor, Any, Any], stopped: bool
    ) -> None:
        """The recomputed forward of a float8 linear whose multiply the trace did not see
        (:meth:`_float8_leave`, :meth:`_float8_stopped`): its casts' moments and kernels, its
        amaxes taken from the selective checkpoint's cache, and its multiply's output and
        kernel unless the cache gives the output."""
        x, weight, sac = running
        with _disable_current_modes():  # views no checkpoint's mode nor the probe is to see
            a = x.reshape(-1, x.shape[-1])
            b = weight.t()
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        share = self._local_numel(a) / max(a.numel(), 1) if self._tp is not None else 1.0
        isz = x.element_size()
        mm = torch.ops.aten.mm.default
        cache = None if sac is None else sac.storage.get(mm)
        cached = not stopped  # the trace's mm went to the cache
        entry = None
        if stopped and isinstance(cache, dict):
            idx = sac.func_counter.get(mm, 0)
            entry = cache.get(idx)
            cached = entry is not None and entry is not _RECOMPUTE and entry is not _CONSUMED
            if cached:  # taken by torchao's mm: held through the casts, freed at the stop
                cache[idx] = _CONSUMED
        elif stopped and isinstance(cache, list):  # torch 2.8: torchao's mm pops the first
            cached = bool(cache)
            if cached:
                entry = cache.pop(0)
        new = 0 if cached else round(m * n * isz * share)  # a cached output is held already
        float8 = Float8Accounting._float8_casts(self, 1, False, a, b, new, made=True)
        if sac is not None and self._float8_recipe == "tensorwise":  # its casts' amaxes
            held = self._float8_amaxes.get(id(sac.storage), [])
            del held[: 1 if self._float8_gathered else 2]
        del entry  # the cached output, if any: freed now
        if cached:
            return
        if self._tp is not None:  # one rank's share of the multiply, as _count_kernel's
            sa, sb = self._local_numel(a) < a.numel(), self._local_numel(b) < b.numel()
            m, n, k = local_gemm(m, n, k, sa, sb, self._tp.size)
        if float8:
            self._add_kernel(("gemm", 1, m, n, k, 1, 1), 1, m * k + k * n + m * n * isz)
        else:
            self._add_kernel(("gemm", 1, m, n, k, 1, isz), 1, (m * k + k * n + m * n) * isz)

    def _float8_over(self: Float8Host, kind: int, extras: list[int]) -> None:
        """Moments of torchao's float8 linear the trace does not hold: ``extras`` bytes
        above what it holds now, each counted towards the stretch's peak."""
        for extra in extras:
            self.live[kind] += extra
            self._bump_peak()
            self.live[kind] -= extra

    def _float8_rescale(self: Float8Host, backward: int, out: Any) -> None:
        """The multiply of a rowwise float8 backward matrix multiply's output by its scales
        (:func:`float8_rescale`): eager, its own kernels; compiled, a pointwise operator on
        the output that Inductor computes inside the kernel that reads the output next when
        that is a fused memory-bound one (no traffic of its own), and otherwise writes out
        (:meth:`_rescale_read`)."""
        st = storage_of(out) if isinstance(out, torch.Tensor) else None
        if st is None:
            return
        share = self._local_numel if self._tp is not None else None
        count, eager = float8_rescale(out, share)
        self._add_kernel(("mem", backward), count, eager)
        if self._fusing():
            nbytes = float(self._local_bytes(out))
            self._rescales[id(st)] = (weakref.ref(st), backward, count, eager, nbytes)

    def _rescale_read(self: Float8Host, args: Any, fused: bool) -> None:
        """An operator reads ``args``: the rescaling of any of them still to place runs
        inside it when it is a fused memory-bound operator (``fused``: the rescale joins its
        region and reads nothing more), else as a kernel of its own that reads and writes
        the output (a matrix multiply, attention, a collective or an operator outside the
        compiled modules reads the scaled output from memory)."""
        for t in op_tensors(args):
            st = storage_of(t)
            entry = None if st is None else self._rescales.get(id(st))
            if entry is None or entry[0]() is not st:
                continue
            del self._rescales[id(st)]
            _, backward, count, eager, nbytes = entry
            if fused:
                self._fused.add(backward, (t,), (), eager, True, count)
            else:
                self._fused.extra(backward, count, eager, 2.0 * nbytes)

    def _place_rescales(self: Float8Host) -> None:
        """The rescalings no operator of this stretch read: the output leaves the compiled
        region (a weight's gradient, handed to FSDP's reduction), so the scaled one is
        written."""
        pending = list(self._rescales.values())
        self._rescales.clear()
        for _, backward, count, eager, nbytes in pending:
            self._fused.extra(backward, count, eager, 2.0 * nbytes)
