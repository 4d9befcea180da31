"""What :class:`~fsdpviz.trace.probe.CostProbe` keeps while it counts: the kinds of live
storage it holds, a stretch's counts between two hook calls (:class:`Stretch`), a compiled
loss while it runs (:class:`CompiledLoss`), tensor parallelism's shares (:class:`TPShares`),
the hook log that marks each call (:class:`MarkingLog`), storages known by identity while
they live (:class:`StorageSet`), the views of the parameters a forward saved
(:class:`SavedParamViews`), and a tensor's storage bytes."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from fsdpviz.schema.profile import StretchMoments
from fsdpviz.trace.fusion import ModuleScope

__all__ = [
    "ACT",
    "BWD_TEMP",
    "FWD_TEMP",
    "GRAD",
    "CallGradients",
    "CompiledLoss",
    "MarkingLog",
    "SavedParamViews",
    "StorageSet",
    "StorageShares",
    "Stretch",
    "StretchMoments",
    "TPShares",
    "dim_share",
    "local_gemm",
    "local_part",
    "moments_recorded",
    "recording_moments",
    "storage_bytes",
    "storage_of",
]

# Kinds of live storage; ``CostProbe.live`` is indexed by them.
FWD_TEMP, ACT, GRAD, BWD_TEMP = 0, 1, 2, 3


def dim_share(size: int, ranks: int) -> Fraction:
    """The part of a tensor sharded over ``ranks`` ranks along a dim of ``size`` that the
    rank fsdpviz models holds: the first, which holds the most. DTensor splits a dim as
    ``torch.chunk`` does (``Shard._split_tensor``): chunks of ``ceil(size / ranks)``, the
    last ones smaller or empty (a vocabulary of 33 over 4 ranks: 9, 9, 9, 6), so the first
    rank holds ``ceil(size / ranks) / size`` of it, ``1 / ranks`` where ``ranks`` divides it.

    Example::

        dim_share(33, 4)  # Fraction(3, 11): 9 of the 33 rows
    """
    if size <= 0:
        return Fraction(1, ranks)
    return Fraction(-(-size // ranks), size)


def local_part(n: int, share: Fraction | None) -> int:
    """``n`` bytes (or elements) of a tensor as one rank holds them: all of them (``share``
    None), else its ``share``."""
    return n if share is None else n * share.numerator // share.denominator


def local_gemm(
    m: int, n: int, k: int, a_share: bool, b_share: bool, tp: int
) -> tuple[int, int, int]:
    """The ``m x k @ k x n`` multiply one rank of ``tp`` runs where ``a`` or ``b`` is its
    share of a tensor: both share the reduced dimension (``k``), or one its own (``b`` its
    columns, ``a`` its rows)."""
    if a_share and b_share:
        return m, n, -(-k // tp)
    if b_share:
        return m, -(-n // tp), k
    if a_share:
        return -(-m // tp), n, k
    return m, n, k


@dataclass(frozen=True)
class TPShares:
    """What a rank of a tensor-parallel group of ``size`` holds: the parameters the plan
    shards (each with the part of it the modelled rank holds, :func:`dim_share` of its
    sharded dim), the modules whose operators give whole tensors on every rank
    (``RowwiseParallel``: partial sums before their reduction), and the sharded parameters
    whose gradient is whole on every rank all the same (a row-wise embedding's: DTensor's
    ``embedding_dense_backward`` strategies give no ``Shard(0)`` weight gradient, only a
    replicated or partial one; a batch of one's column-wise weight whose multiply DTensor
    leaves its gradient ``Partial()``, which the tensor-parallel emulation adds to the set
    in forward, before the gradient is made), and the modules whose forward multiply of two
    shares gives a rank's share, and which (:attr:`product_shares`)."""

    size: int
    sharded_params: Mapping[torch.Tensor, Fraction]
    whole_outputs: frozenset[str]
    whole_grads: AbstractSet[torch.nn.Parameter] = frozenset()
    # whether a tensor is (a view of) a DTensor the plan leaves sharded: logits a loss then
    # takes inside loss_parallel()
    is_dtensor: Callable[[torch.Tensor], bool] = field(default=lambda t: False)
    # the modules whose forward multiply of two shares is a rank's share, not a whole
    # partial sum, with that share: a batch of one's column-wise linear whose multiply
    # DTensor's mm strategies run on one operand gathered (the weight gathered: the product
    # keeps the input's sequence sharding, Shard(0) viewed 2-D, a chunk of the sequence;
    # the input gathered: Shard(1), the weight's chunk of its rows, which differ where the
    # tp ranks do not divide the sequence); the tensor-parallel emulation adds to it in
    # forward, before the multiply runs
    product_shares: Mapping[str, Fraction] = field(default_factory=dict)

    def grad_bytes(self, p: torch.Tensor, n: int) -> int:
        """One rank's bytes of parameter ``p``'s gradient of ``n`` bytes: its share of the
        parameter (a row-wise embedding's, a partial one's, is whole: :attr:`whole_grads`)."""
        share = self.sharded_params.get(p)
        return n if p in self.whole_grads else local_part(n, share)


# Matrix multiplies of two matrices: of two shares, the result is a whole partial sum.


@dataclass
class Stretch:
    kernels: dict[tuple[Any, ...], list[float]] = field(default_factory=dict)
    flops_forward: float = 0.0
    flops_backward: float = 0.0
    peak: int = 0
    peak_activations: int = 0
    peak_forward_temp: int = 0
    peak_grads: int = 0
    grad_bytes: int = 0
    grads: dict[str, int] = field(default_factory=dict)
    # the most activations + temp reached, new gradients left out: what a step that adds its
    # gradients into existing ones in place reaches (each is freed once added)
    peak_in_place: tuple[int, int, int] = (0, 0, 0)
    # the same, less the gradients one forward call of a unit made that autograd holds for
    # another call's (CallGradients)
    peak_unbuffered: tuple[int, int, int] = (0, 0, 0)
    # unit -> bytes of float8 weights' scales a forward saved that a backward node let go
    # (FSDP2's float8 all-gather), by now and when ``peak`` was reached
    scales_freed: dict[str, int] = field(default_factory=dict)
    peak_scales_freed: dict[str, int] = field(default_factory=dict)
    # unit -> [peak, activations, forward temp, grads, *peak_in_place] when the last view of
    # its parameters its forward saved was freed (see SavedParamViews)
    param_views_freed: dict[str, list[int]] = field(default_factory=dict)
    # every moment the peaks were weighed at, while :func:`recording_moments` (else None)
    moments: StretchMoments | None = None
    # each checkpointed region's frame let go of in the stretch: the peaks then (``peak``,
    # its activations, forward temp and grads, ``peak_in_place``, ``peak_unbuffered``), how
    # many moments were weighed (where kept)
    released: list[tuple[tuple[int, ...], int | None]] = field(default_factory=list)


_MOMENTS: ContextVar[bool] = ContextVar("fsdpviz_moments", default=False)


@contextmanager
def recording_moments() -> Iterator[None]:
    """Traces made inside keep, per stretch, every moment its peaks were weighed at
    (:class:`~fsdpviz.schema.profile.StretchMoments`, ``StepProfile.moments``), what
    :mod:`fsdpviz.replan.batch_replay` derives the peaks at another batch from. Off by
    default: a trace then keeps none."""
    token = _MOMENTS.set(True)
    try:
        yield
    finally:
        _MOMENTS.reset(token)


def moments_recorded() -> bool:
    """Whether a trace made now keeps its moments (see :func:`recording_moments`)."""
    return _MOMENTS.get()


@dataclass
class CompiledLoss:
    """The compiled loss while it runs: the storages it made that are not written out yet
    (``id(storage) -> [bytes, kind, weakref, shape, dtype]``), those of them eager
    autograd saved, and the values torch's partitioner keeps that eager does not make."""

    scope: ModuleScope
    pending: dict[int, list[Any]] = field(default_factory=dict)
    saved: set[int] = field(default_factory=set)
    extras: list[torch.Tensor] = field(default_factory=list)
    forward_done: bool = False

    def captures(self) -> bool:
        """Whether a storage made now stays inside the compiled loss's kernels."""
        if torch._C._current_graph_task_id() == -1:
            return self.scope.depth > 0
        return self.forward_done and self.scope.active()


class MarkingLog(list[Any]):
    """The runtime's hook log; every append records a mark first."""

    def __init__(self, items: list[Any], on_append: Callable[[Any], None]) -> None:
        super().__init__(items)
        self._on_append = on_append

    def append(self, item: Any) -> None:
        self._on_append(item)
        super().append(item)


class StorageSet:
    """Storages, each a member while it lives. A storage is looked up by its ``id`` and
    then checked to be the very one added (a weak reference): a storage made after another
    is freed may get the freed one's ``id``, and a set of ids would take the new storage
    for the old, so that what a trace counts would depend on where Python's allocator put
    its objects."""

    def __init__(self, storages: Iterable[torch.UntypedStorage] = ()) -> None:
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        for st in storages:
            self.add(st)

    def add(self, st: torch.UntypedStorage) -> None:
        self._refs[id(st)] = weakref.ref(st)

    def update(self, other: StorageSet) -> None:
        """Add the live members of ``other``."""
        for key, ref in other._refs.items():
            if ref() is not None:
                self._refs[key] = ref

    def forget(self, key: int) -> None:
        """Drop the storage that had ``id`` ``key`` once it is freed (a weak reference's
        callback); a live storage that has that ``id`` now stays."""
        ref = self._refs.get(key)
        if ref is not None and ref() is None:
            del self._refs[key]

    def __contains__(self, st: object) -> bool:
        ref = self._refs.get(id(st))
        return ref is not None and ref() is st

    def __len__(self) -> int:
        return sum(ref() is not None for ref in self._refs.values())


class StorageShares:
    """Storages one rank holds a share of, each with its share (:func:`dim_share`), a
    member while it lives (looked up as :class:`StorageSet` does, by ``id`` and then a weak
    reference to the very storage added)."""

    def __init__(self) -> None:
        self._refs: dict[int, tuple[weakref.ref[torch.UntypedStorage], Fraction]] = {}

    def add(self, st: torch.UntypedStorage, share: Fraction) -> None:
        self._refs[id(st)] = (weakref.ref(st), share)

    def update(self, other: StorageShares) -> None:
        """Add the live members of ``other``."""
        for key, (ref, share) in other._refs.items():
            if ref() is not None:
                self._refs[key] = (ref, share)

    def forget(self, key: int) -> None:
        """Drop the storage that had ``id`` ``key`` once it is freed; a live storage that has
        that ``id`` now stays."""
        entry = self._refs.get(key)
        if entry is not None and entry[0]() is None:
            del self._refs[key]

    def share(self, st: object) -> Fraction | None:
        """The share one rank holds of storage ``st``, or None (whole)."""
        entry = self._refs.get(id(st))
        return entry[1] if entry is not None and entry[0]() is st else None

    def __contains__(self, st: object) -> bool:
        return self.share(st) is not None


def storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    """The storage under ``t``, or None for sparse or opaque tensors."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse or opaque tensors
        return None


def storage_bytes(tensors: Any) -> int:
    """Bytes of the storages under ``tensors`` (a pytree), each storage once."""
    seen: dict[int, int] = {}
    for t in tree_leaves(tensors):
        if isinstance(t, torch.Tensor) and (st := storage_of(t)) is not None:
            seen[id(st)] = st.nbytes()
    return sum(seen.values())


def batch_tokens(inputs: Any) -> int:
    """Tokens in a batch: the first integer tensor's elements (token ids), else the first two
    dimensions of the first tensor."""
    tensors = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    for t in tensors:
        if not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool:
            return int(t.numel())
    if not tensors:
        return 0
    shape = tensors[0].shape
    return int(shape[0] * shape[1]) if len(shape) >= 2 else int(shape[0]) if shape else 1


class SavedParamViews:
    """The tensors a forward saves for backward that view a unit's parameters without being
    one (``mm``'s transposed weight, ``weight.t()``; an operator that saves the parameter
    itself, as a multiply by a norm's weight does, saves the tensor object), by unit, and
    the stretch in which the last of each unit's is freed (autograd frees a node's saved
    tensors once it has run).

    What they hold on a real run is the storage the parameters viewed in forward: FSDP1's
    device copy of the host parameters under ``NO_SHARD`` with CPU offload and
    ``use_orig_params=True``, which the backward unshard takes the parameters themselves
    from (``_use_unsharded_views``: ``tensor.data = view``), so it lives until the last
    such view is freed (see [Note: NO_SHARD's copies] in ``fsdpviz/cost/memory_fsdp1.py``).
    The stretch records its peak as it stood then (``Stretch.param_views_freed``): the
    most reached while the copy was alive.

    A unit run more than once in forward makes a copy each time, and the backward unshard
    rebinds the views of the last forward only (those ``flat_param._tensors`` holds): each
    forward's copy goes on its own. So each forward call ``k`` of such a unit (counted by
    its ``pre_forward`` hook, :meth:`forward`) is also recorded, as ``"{unit}#{k}"``: the
    last call's when its saved views are freed, an earlier call's when all it saved of the
    parameters is (the parameter itself too: its forward's view, which nothing rebinds)."""

    def __init__(
        self, by_unit: Mapping[str, Iterable[torch.Tensor]], stretch: Callable[[], Stretch]
    ) -> None:
        self._stretch = stretch
        self._params = {id(p) for ps in by_unit.values() for p in ps}
        self._units: dict[int, tuple[weakref.ref[torch.UntypedStorage], str]] = {}
        for unit, params in by_unit.items():
            for p in params:
                if (st := storage_of(p)) is not None:
                    self._units[id(st)] = (weakref.ref(st), unit)
        self._held: dict[str, int] = {}
        self._calls: dict[str, int] = {}  # unit -> its forward calls so far
        # (unit, forward call) -> [saved views, saved parameters] not yet freed
        self._by_call: dict[tuple[str, int], list[int]] = {}

    def forward(self, unit: str) -> None:
        """The unit's ``pre_forward`` hook ran (not a recomputation's, in backward)."""
        if torch._C._current_graph_task_id() == -1:
            self._calls[unit] = self._calls.get(unit, 0) + 1

    def saved(self, t: torch.Tensor, st: Any, packed: torch.Tensor) -> None:
        """The forward saved ``t`` (of storage ``st``) as ``packed``, which autograd holds
        until the node that saved it has run."""
        if st is None or torch._C._current_graph_task_id() != -1:
            return
        entry = self._units.get(id(st))
        if entry is None or entry[0]() is not st:
            return
        unit, own = entry[1], id(t) in self._params
        if not own:
            self._held[unit] = self._held.get(unit, 0) + 1
        call = (unit, self._calls.get(unit, 1) - 1)
        counts = self._by_call.setdefault(call, [0, 0])
        counts[own] += 1
        weakref.finalize(packed, self._freed, call, own).atexit = False

    def _freed(self, call: tuple[str, int], own: bool) -> None:
        unit, k = call
        counts = self._by_call[call]
        counts[own] -= 1
        n = self._calls.get(unit, 1)
        # the last call's parameters are rebound in backward: its saved views alone hold it
        gone = not own and not counts[0] if k == n - 1 else counts == [0, 0]
        if n > 1 and gone:
            self._record(f"{unit}#{k}")
        if own:
            return
        self._held[unit] -= 1
        if not self._held[unit]:
            del self._held[unit]
            self._record(unit)

    def _record(self, key: str) -> None:
        """The stretch's peak as it stands now, at ``key`` (a unit, or its forward call)."""
        s = self._stretch()
        if s.moments is not None:
            s.moments.param_views_at[key] = len(s.moments.moments)
        s.param_views_freed[key] = [
            s.peak, s.peak_activations, s.peak_forward_temp, s.peak_grads, *s.peak_in_place
        ]  # fmt: skip


class CallGradients:
    """The gradients of a unit's parameters that one forward call of the unit made and
    autograd holds in its buffer until another call's arrive: what the trace, computing
    without FSDP (one ``AccumulateGrad`` node per parameter, which runs once all its
    gradients are in), holds and FSDP1 under parameter mixed precision does not (each
    forward call of a unit makes an ``AccumulateGrad`` of its own, so each call's gradient
    goes into ``.grad`` once it is in: see [Note: a unit run twice under parameter mixed
    precision] in ``fsdpviz/cost/memory_fsdp1.py``).

    Each forward call ``k`` of a unit starts at its ``pre_forward`` hook (:meth:`forward`,
    autograd's sequence number then). Once the step's forward is done (:meth:`graph`, from
    its output), every node with an edge to a parameter's ``AccumulateGrad`` is found and
    attributed to the call that made it (the last one started before it). A parameter's
    gradient from call ``k`` complete while another call's is still to come is held:
    ``held`` keeps its storage (by id) until the parameter's ``AccumulateGrad`` runs
    (:meth:`accumulated`) or the storage is freed (:meth:`freed`)."""

    def __init__(self, by_unit: Mapping[str, Iterable[torch.Tensor]]) -> None:
        self._unit = {id(p): unit for unit, ps in by_unit.items() for p in ps}
        self._starts: dict[str, list[int]] = {}  # unit -> each forward call's sequence nr
        self._pending: dict[int, dict[int, int]] = {}  # id(param) -> call -> edges to come
        self._storages: dict[int, list[int]] = {}  # id(param) -> storages held for it
        self.held: dict[int, int] = {}  # id(storage) -> bytes (backward temp)
        self.bytes = 0

    def forward(self, unit: str) -> None:
        """The unit's ``pre_forward`` hook ran (not a recomputation's, in backward)."""
        if torch._C._current_graph_task_id() == -1:
            self._starts.setdefault(unit, []).append(_sequence_nr())

    def graph(self, output: Any, live: Callable[[int], int]) -> None:
        """The step's forward is done: hook the nodes that feed a parameter of a unit run
        more than once with grad (``live``: the bytes of backward temp a storage holds,
        by id, else 0)."""
        units = {u for u, starts in self._starts.items() if len(starts) > 1}
        if not units:
            return
        seen: set[int] = set()
        stack = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
        found: list[tuple[Any, int, int, int]] = []  # node, edge, id(param), call
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            for i, (nxt, _) in enumerate(node.next_functions):
                p = getattr(nxt, "variable", None)
                unit = None if p is None else self._unit.get(id(p))
                if unit in units:
                    starts = self._starts[unit]
                    seq = node._sequence_nr()
                    call = max((k for k, s in enumerate(starts) if s <= seq), default=0)
                    found.append((node, i, id(p), call))
                elif nxt is not None:
                    stack.append(nxt)
        by_node: dict[int, list[tuple[int, int, int]]] = {}
        for node, i, key, call in found:
            calls = self._pending.setdefault(key, {})
            calls[call] = calls.get(call, 0) + 1
            if id(node) not in by_node:
                by_node[id(node)] = []
                node.register_hook(functools.partial(self._arrived, by_node[id(node)], live))
            by_node[id(node)].append((i, key, call))

    def _arrived(
        self, edges: list[tuple[int, int, int]], live: Callable[[int], int], grads: Any, _: Any
    ) -> None:
        for i, key, call in edges:
            calls = self._pending.get(key)
            if calls is None or call not in calls:
                continue
            calls[call] -= 1
            others = any(n > 0 for k, n in calls.items() if k != call)
            g = grads[i] if i < len(grads) else None
            st = None if g is None else storage_of(g)
            if calls[call] or not others or st is None or id(st) in self.held:
                continue
            n = live(id(st))
            if n:
                self.held[id(st)] = n
                self.bytes += n
                self._storages.setdefault(key, []).append(id(st))

    def accumulated(self, p: torch.Tensor) -> None:
        """Parameter ``p``'s ``AccumulateGrad`` ran: what it held is in ``.grad``."""
        self._pending.pop(id(p), None)
        for key in self._storages.pop(id(p), []):
            self.freed(key)

    def freed(self, key: int) -> None:
        """Storage ``key`` is freed (or taken in)."""
        self.bytes -= self.held.pop(key, 0)


def _sequence_nr() -> int:
    """Autograd's sequence number now: that of a node made now (one is, and let go)."""
    with _disable_current_modes(), torch.enable_grad():
        leaf = torch.zeros((), requires_grad=True)
        node = leaf.view(()).grad_fn
    return int(node._sequence_nr()) if node is not None else 0
