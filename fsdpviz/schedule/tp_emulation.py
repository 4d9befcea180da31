"""Tensor parallelism's collectives on fsdpviz's copy of the model.

The copy is traced with its parameters' global shapes (no DTensor); what each parallel
style does to activations is reproduced with hooks where ``parallelize_module`` puts its
own: before a module's forward (its inputs made DTensors and redistributed) and after it
(its output redistributed). A redistribution that moves data is reported to the
:class:`FSDP2Runtime` as a ``tp_*`` event with the bytes of the whole tensor; the
gradient's redistribution in backward is reported by an identity autograd node on that
tensor, when the gradient reaches it. An input a style leaves a DTensor (``PrepareModuleInput``,
``SequenceParallel`` with ``use_local_output=False``) is remembered, so the next style
redistributes it instead of making a DTensor of it again, as DTensor does.

While a :class:`~fsdpviz.trace.probe.CostProbe` measures (:meth:`TPEmulation.measure`), a
redistribution that gives a rank a new buffer (all-gather, reduce-scatter, all-to-all; an
all-reduce, whose functional collective reduces a clone) makes one on the traced copy too,
in the layout it arrives in, so the probe counts what a rank holds: the all-gathered input
of a column-parallel projection whole, the reduce-scattered output of a row-parallel one as
a share. A share is what the first rank of the tp group holds, the one with the most:
DTensor chunks a dim the tp ranks do not divide as ``torch.chunk`` does
(``Shard._split_tensor``), the first ranks a chunk of ``ceil(n / tp)``, the last ones less
(:func:`~fsdpviz.trace.probe_records.dim_share`), as the parameters' tp shards
(:func:`~fsdpviz.plan.tensor_parallel.local_shape`); its collectives pad every chunk to the
first's. A style that makes a plain tensor sharded on such a dim a DTensor
(``DTensor.from_local``, which assumes even shards) is refused, as torch fails on it; one
computed from a DTensor the plan left knows its shape and runs.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import torch
from torch import nn

from fsdpviz.plan.fsdp2 import float8_gathered_groups
from fsdpviz.plan.fsdp2_group import Group, owner_index
from fsdpviz.plan.job import JobOptions
from fsdpviz.plan.tensor_parallel import (
    PARTIAL,
    REPLICATE,
    Layout,
    Redistribution,
    TPModule,
    TPPlan,
    backward_collective,
    collective,
    layout_name,
    same_layout,
)
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime
from fsdpviz.schedule.tp_buffers import (
    chunk_buffer,
    in_float8,
    issuing_buffer,
    masked_ids,
    padded_bytes,
    uneven,
)
from fsdpviz.schedule.tp_float8 import Float8AmaxReduces, Float8GradCast, amax_reduced, report_amax
from fsdpviz.schedule.tp_flow import DTensorFlow, GradCollective, aliased
from fsdpviz.schedule.tp_implicit import (
    BatchOneMultiply,
    Move,
    batch_one_multiply,
    gathered_by_multiply,
    gathered_warning,
    implicit_warnings,
    issued_forward,
    multiplied_backward,
    normalised,
    partial_grad_warning,
    scatter_partial_weight,
    skipped_warning,
    topology_warning,
)
from fsdpviz.schedule.tp_mm_strategy import GPUS_PER_NODE
from fsdpviz.schedule.tp_refusals import (
    refuse_mislabelled_local,
    refuse_narrowed,
    refuse_uneven_local,
)
from fsdpviz.schema.report import FsdpWarning
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.probe_records import TPShares, dim_share

# A row-wise embedding's weight: its gradient is whole on every rank (TPShares.whole_grads).
_ROWWISE_EMBEDDING: Layout = ("shard", 0)


def _nothing() -> None:
    return None


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class TPEmulation:
    """The hooks of a :class:`TPPlan` on the traced copy, reporting to ``runtime``; DTensor's
    ``mm`` strategies picked for nodes of ``gpus_per_node`` GPUs (the machine's; None where
    ``analyze`` names none: :data:`~fsdpviz.schedule.tp_mm_strategy.GPUS_PER_NODE`, warned
    where a choice depends on it)."""

    def __init__(
        self,
        model: nn.Module,
        plan: TPPlan,
        groups: list[Group],
        runtime: FSDP2Runtime,
        job: JobOptions | None = None,
        gpus_per_node: int | None = None,
    ) -> None:
        self.runtime = runtime
        self._gpus_per_node = gpus_per_node
        # the GPUs per node a multiply's mm strategies were picked for, where one depends on
        # it (ReportConfig.tp_strategy_gpus_per_node); None while none does
        self.strategy_gpus_per_node: int | None = None
        self.plan = plan
        self._model = model
        self._probe: CostProbe | None = None
        self._dtensors: dict[int, tuple[weakref.ref[torch.Tensor], Layout]] = {}
        # the plain tensors a style returned: the layout of the tensor each is a part of
        self._plain: dict[int, tuple[weakref.ref[torch.Tensor], tuple[Layout, str]]] = {}
        # the DTensors an uneven all-to-all left narrowed: (dim, size, where) (_check_narrowed)
        self._narrowed: dict[int, tuple[weakref.ref[torch.Tensor], tuple[int, int, str]]] = {}
        # the layout each remembered DTensor's gradient comes back in (_explicit sets it)
        self._grads: dict[int, tuple[weakref.ref[torch.Tensor], list[Layout]]] = {}
        # the DTensors a float8 style left float8 (PrepareFloat8ModuleInput's), by id
        self._float8: dict[int, tuple[weakref.ref[torch.Tensor], bool]] = {}
        # the gradient layouts (the lists _grads holds) a Redistribute.backward takes back
        self._absorbing: dict[int, list[Layout]] = {}
        params = {id(p) for p in plan.placements(model)}
        self._flow = DTensorFlow(params, self._meet, self._plain, plan.size, self._normalised)
        # (module, input) -> the warning of a DTensor a style left to the operators
        self._implicit: dict[tuple[str, int | str], str] = {}
        self._handles: list[Any] = []
        self._groups = groups
        # module -> its output's layout and the buffers its multiply's forward made (_batch_one)
        self._produced: dict[str, tuple[BatchOneMultiply, list[torch.Tensor]]] = {}
        self._product_shares: dict[str, Fraction] = {}  # ... and the share of its product
        self._root = owner_index("", groups)  # the group of the loss's collectives
        self._running = ("", self._root)  # the plan's module begun last, and its group
        self._float8_in: dict[str, bool] = {}  # module -> whether its first input is float8
        self._masks: dict[str, list[torch.Tensor]] = {}  # a row-wise embedding's (masked_ids)
        # the sharded parameters whose gradient is whole on every rank (TPShares.whole_grads)
        self._whole_grads: set[nn.Parameter] = set()
        modules = dict(model.named_modules())
        for fqn, tpm in plan.modules.items():
            module = modules[fqn]
            i = owner_index(fqn, groups)
            self._handles.append(
                module.register_forward_pre_hook(
                    functools.partial(self._pre_forward, tpm, i), with_kwargs=True
                )
            )
            self._handles.append(
                module.register_forward_hook(
                    functools.partial(self._post_forward, tpm, i), prepend=True
                )
            )
        spec = job.float8 if job is not None else None
        self._amax: Float8AmaxReduces | None = None
        if job is not None and spec is not None:
            f8 = set(float8_gathered_groups(model, groups, job))
            gathered = {id(p) for g in groups if g.name in f8 for p in g.params}
            self._amax = Float8AmaxReduces(
                model, plan, job.float8_modules(model), gathered,
                lambda fqn: owner_index(fqn, groups), runtime, self._float8_in, spec.recipe_name,
            )  # fmt: skip

    def shares(self) -> TPShares:
        """What a rank of the tp group holds, for the probe."""
        placements = self.plan.placements(self._model)
        embeddings = {id(m.weight) for m in self._model.modules() if isinstance(m, nn.Embedding)}
        rowwise = (p for p, at in placements.items() if at == _ROWWISE_EMBEDDING)
        self._whole_grads.update(p for p in rowwise if id(p) in embeddings)
        return TPShares(
            self.plan.size,
            {
                p: dim_share(p.shape[(layout[1] or 0) % p.dim()], self.plan.size)
                for p, layout in placements.items()
                if layout[0] == "shard" and p.dim() > 0
            },
            frozenset(f for f, m in self.plan.modules.items() if m.base == "RowwiseParallel"),
            self._whole_grads,  # _scattered_weight adds to it
            self._sharded_dtensor,
            self._product_shares,  # _batch_one adds to it, _multiplied takes from it
        )

    def _sharded_dtensor(self, t: torch.Tensor) -> bool:
        """Whether ``t`` views a DTensor the plan left sharded (``use_local_output=False``)."""
        storage = t.untyped_storage()
        return any(
            (held := ref()) is not None
            and layout[0] == "shard"
            and held.untyped_storage() is storage
            for ref, layout in self._dtensors.values()
        )

    @contextmanager
    def attached(self) -> Iterator[None]:
        """Follow which tensors are DTensors (:class:`DTensorFlow`) while the step runs."""
        with self._flow:
            yield

    def measure(self, probe: CostProbe) -> None:
        """Give ``probe`` the buffers the collectives make (see the module's docstring), and
        plan the all-reduces ``loss_parallel()``'s handlers run in the loss (the root's)."""
        self._probe = probe
        probe.on_all_reduce = lambda t: self.runtime.tensor_parallel(
            self._root, "tp_all_reduce", "", "forward", t.numel() * t.element_size(),
            _dtype_name(t),
        )  # fmt: skip

    # ----------------------------------------------------------------- DTensors
    def _layout(self, t: torch.Tensor) -> Layout | None:
        """The layout ``t`` was left in as a DTensor, also through aliases of it (the same
        shape and strides: what an autograd function returning its input gives, as FSDP's
        pre-forward hook of the next module does)."""
        found = self._aliased(t, self._dtensors)
        return None if found is None else found[1]

    def _is_float8(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or an alias of it) is a DTensor a float8 style left float8."""
        return self._aliased(t, self._float8) is not None

    _aliased = staticmethod(aliased)

    def _remember(
        self, t: Any, layout: Layout | None, origin: str, grad: list[Layout] | None = None
    ) -> None:
        """``t`` is a DTensor in ``layout``; ``grad``: the layout its gradient comes back
        in, which a style that redistributes ``t`` explicitly sets (:meth:`_explicit`)."""
        if isinstance(t, torch.Tensor) and layout is not None:
            self._dtensors[id(t)] = (weakref.ref(t), layout)
            self._flow.dtensors[t] = origin
            if grad is not None:
                self._grads[id(t)] = (weakref.ref(t), grad)

    def _meet(self, tensors: list[torch.Tensor], out: torch.Tensor) -> None:
        """DTensors an arithmetic operator meets, as its sharding propagation takes them: a
        replicated one beside a sharded one is chunked (no collective), its gradient and
        the result sharded (see :meth:`_remember`)."""
        layouts = [(t, lay) for t in tensors if (lay := self._layout(t)) not in (None, PARTIAL)]
        if not layouts or len(layouts) < len(tensors):
            return
        n = out.dim()
        dims = {(lay[1] or 0) % t.dim() + n - t.dim() for t, lay in layouts if lay[0] == "shard"}
        if len(dims) > 1 or any(t.dim() > n for t in tensors):
            return
        layout: Layout = ("shard", dims.pop()) if dims else REPLICATE
        for t, lay in layouts if layout != REPLICATE else ():
            found = self._aliased(t, self._grads) if lay == REPLICATE and t.dim() == n else None
            if found is not None:
                found[1][0] = layout
        self._dtensors[id(out)] = (weakref.ref(out), layout)

    def _normalised(self, t: torch.Tensor, out: torch.Tensor, fused: bool, origin: str) -> Any:
        """A normalisation of a replicated DTensor (:func:`normalised`)."""
        if self._layout(t) != REPLICATE or self.plan.size == 1:
            return out
        found, probe, size = self._aliased(t, self._grads), self._probe, self.plan.size
        out, grad = normalised(out, fused, found, self.runtime, self._running, probe, size)
        self._remember(out, REPLICATE, origin, grad)
        return out

    def _explicit(self, t: Any, r: Redistribution, tpm: TPModule, known: Layout | None) -> bool:
        """Whether the style redistributes DTensor ``t`` (in ``known``) with
        ``DTensor.redistribute``: ``ColwiseParallel``, ``RowwiseParallel`` and
        ``PrepareModuleInput`` where their declared layouts differ, ``SequenceParallel``
        where the DTensor is not in its sequence layout. Its backward
        (``Redistribute.backward``) takes the gradient back to the layout ``t`` came in,
        whatever the layout the module's gradient has: a partial gradient all-reduced
        (``Partial()`` to ``Replicate()``), so the style that made ``t`` gets it
        replicated and reduce-scatters nothing (see :meth:`_remember`)."""
        if known is None or not isinstance(t, torch.Tensor) or t.dim() == 0:
            return False
        if tpm.base in ("ColwiseParallel", "RowwiseParallel", "PrepareModuleInput"):
            called = r.src != r.dst
        else:
            called = not same_layout(known, r.dst, t.dim())
        found = self._aliased(t, self._grads)
        if called and found is not None:
            found[1][0] = REPLICATE if known == PARTIAL else known
        return called

    def _local(self, t: Any, layout: Layout | None, where: str) -> None:
        """``t`` is a plain tensor a style returned (``to_local()``), a rank's part of a
        tensor in ``layout`` (as ``where`` left it)."""
        if isinstance(t, torch.Tensor) and t in self._flow.dtensors:
            del self._flow.dtensors[t]
        if isinstance(t, torch.Tensor) and layout is not None:
            self._plain[id(t)] = (weakref.ref(t), (layout, where))

    # ------------------------------------------------------------------- hooks
    def _redistribute(
        self,
        t: Any,
        r: Redistribution,
        tpm: TPModule,
        i: int,
        known: Layout | None,
        float8: tuple[bool, bool] = (False, False),
        moved: bool | None = None,
        grad_in: list[Layout] | None = None,
    ) -> Any:
        """Report ``t``'s collective in forward; return it with its gradient's hooked.
        ``float8``: whether the tensor (cast by a float8 style first, where the trace holds
        it in high precision: :meth:`_float8_in`) and its gradient move in float8 (see
        [Note: torchao's float8 tensor-parallel styles]). ``moved``: whether torch runs a
        redistribution whose backward takes the gradient back (by default: a plain tensor
        made a DTensor, or a DTensor whose layout changes). ``grad_in``: the layout the
        gradient comes back in, ``r.grad`` unless a style that takes the result changes it
        before the backward runs (:meth:`_pre_forward`)."""
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or self.plan.size == 1:
            # a tp group of one rank: DTensor's redistribution keeps the local tensor, no
            # collective and no new buffer, either way (``redistribute_local_tensor``)
            return t
        data_f8, grad_f8 = float8
        ndim, nbytes, src = t.dim(), t.numel() * t.element_size(), known or r.src
        forward, issue = collective(src, r.dst, ndim), None  # (reported as DTensor issues it)
        if forward is not None:
            sent = padded_bytes(
                t.numel() if data_f8 else nbytes, t.shape, forward, src, r.dst, self.plan.size
            )
            dtype = "float8_e4m3fn" if data_f8 else _dtype_name(t)
            issue = functools.partial(
                self.runtime.tensor_parallel, i, forward, tpm.fqn, "forward", sent, dtype
            )
        # a plain tensor's gradient goes back to the layout it was declared in; a DTensor's,
        # only through the redistribution (if any: one that moves nothing forward, as
        # Replicate -> Shard, a local chunk, still all-gathers its gradient back)
        if moved is None:
            moved = known is None or not same_layout(src, r.dst, ndim)
        probe, size = self._probe, self.plan.size
        made = issuing_buffer(probe, forward, src, r.dst, ndim, size, issue)
        copy = in_float8(probe, made or chunk_buffer(probe, src, r.dst, ndim, size), data_f8)
        if not moved or not (t.requires_grad and torch.is_grad_enabled()):
            if copy is None or not (t.requires_grad and torch.is_grad_enabled()):
                return t if copy is None else copy(t)
            # the buffer in the graph (a padded one is made anew): its gradient passes through
            return GradCollective.apply(_nothing, copy, None, t)  # type: ignore[no-untyped-call]
        # the gradient goes back to src (a partial one stays replicated)
        back_dst = REPLICATE if src == PARTIAL else src
        grad = grad_in if grad_in is not None else [r.grad]
        self._absorbing[id(grad)] = grad
        back_bytes, shape = t.numel() if grad_f8 else nbytes, t.shape
        back_dtype = "float8_e5m2" if grad_f8 else _dtype_name(t)

        def report() -> None:
            back = backward_collective(grad[0], src, ndim)
            if back is not None:
                sent = padded_bytes(back_bytes, shape, back, grad[0], back_dst, self.plan.size)
                self.runtime.tensor_parallel(i, back, tpm.fqn, "backward", sent, back_dtype)

        def back_copy(g: torch.Tensor) -> torch.Tensor:
            back = backward_collective(grad[0], src, ndim)
            made = issuing_buffer(probe, back, grad[0], back_dst, ndim, size, report)
            made = made or chunk_buffer(probe, grad[0], back_dst, ndim, size)
            make = in_float8(probe, made, grad_f8)
            return make(g) if make is not None else g

        return GradCollective.apply(_nothing, copy, back_copy, t)  # type: ignore[no-untyped-call]

    def _float8_input(self, t: torch.Tensor, tpm: TPModule, known: Layout | None) -> bool:
        """Whether a float8 style casts input ``t`` before redistributing it: the linear
        styles unless it is float8 already, ``PrepareFloat8ModuleInput`` always."""
        if not tpm.float8 or not t.is_floating_point():
            return False
        return tpm.base == "PrepareModuleInput" or known is None or not self._is_float8(t)

    def _pre_forward(
        self, tpm: TPModule, i: int, module: nn.Module, args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        self._running = (tpm.fqn, i)
        args, kwargs = list(args), dict(kwargs)
        for r in tpm.inputs:
            holder: Any = kwargs if isinstance(r.position, str) else args
            key = r.position
            if isinstance(key, str) and key not in holder:
                continue
            if isinstance(key, int) and key >= len(holder):
                continue
            t = holder[key]
            plain = self._plain.get(id(t))  # a plain tensor a style returned, as it is
            plain = plain if plain is not None and plain[0]() is t else None
            known = self._layout(t) if isinstance(t, torch.Tensor) and not plain else None
            # not in a checkpointed block's recomputation, which backward runs (the mode
            # that follows DTensors is off in it: Tensor.backward is handled by it): it
            # runs what the forward ran, which passed
            forward = torch._C._current_graph_task_id() == -1
            if known is None and isinstance(t, torch.Tensor) and forward:
                refuse_uneven_local(
                    t, r.src, tpm, self.plan.size, self._model, t in self._flow.dtensors
                )
                if plain and self.plan.size > 1 and not same_layout(plain[1][0], r.src, t.dim()):
                    refuse_mislabelled_local(tpm, plain[1], r.src)
            weight, size = getattr(module, "weight", None), self.plan.size  # a linear's
            gathered = isinstance(t, torch.Tensor) and (
                gathered_by_multiply(t, r, tpm, known, size)
            )  # fmt: skip
            node = self._gpus_per_node or GPUS_PER_NODE
            batch_one = None if gathered or not isinstance(t, torch.Tensor) else (
                batch_one_multiply(t, r, tpm, known, size, weight, node)
            )  # fmt: skip
            if batch_one is not None and batch_one.topology_dependent:
                self.strategy_gpus_per_node = node
                if self._gpus_per_node is None:
                    warning = topology_warning(tpm, size)
                    self._implicit.setdefault((tpm.fqn, "topology"), warning)
            skipped = not gathered and not batch_one and self._skipped(t, r, tpm, known)
            cast = isinstance(t, torch.Tensor) and self._float8_input(t, tpm, known)
            if cast and t.dim() > 0 and self.plan.size > 1:
                if amax_reduced(known or r.src):  # [Note: float8 amax all-reduces]
                    report_amax(self.runtime, i, tpm.fqn, "forward")
                if self._probe is not None:
                    t = self._probe.float8_cast(t)
            float8 = cast or (isinstance(t, torch.Tensor) and self._is_float8(t))
            if r is tpm.inputs[0]:
                self._float8_in[tpm.fqn] = float8
            explicit = self._explicit(t, r, tpm, known)
            prepared = tpm.base == "PrepareModuleInput"
            # a plain tensor's gradient comes back through to_local() in the layout it left in
            grad = [r.dst if prepared and tpm.inputs_local else r.grad]
            moved = False if gathered else explicit or None
            out = t if skipped else self._redistribute(
                t, r, tpm, i, known, (float8, False), moved, grad
            ) if batch_one is None else self._batch_one(t, batch_one, tpm, i)  # fmt: skip
            if gathered:  # the linear's multiply's backward, not the style's
                out = self._gathered_backward(t, out, tpm, i)
            if prepared and not tpm.inputs_local:
                if out is t and isinstance(t, torch.Tensor):
                    # nothing moved: the DTensor the module takes is not the caller's tensor
                    out = t.view_as(t)
                # use_local_output=False: a DTensor goes in, in the layout it has
                kept = known if skipped else r.dst
                self._remember(out, kept, f"the input {tpm.style} of {tpm.fqn!r} makes", grad)
                if float8 and isinstance(out, torch.Tensor):
                    self._float8[id(out)] = (weakref.ref(out), True)
            elif prepared:
                out = t.view_as(t) if out is t and isinstance(t, torch.Tensor) else out
                self._local(out, known if skipped else r.dst, f"{tpm.fqn} ({tpm.style})")
            self._check_narrowed(t, out, r, tpm, known)
            holder[key] = out
        if tpm.base == "RowwiseParallel" and isinstance(module, nn.Embedding) and args:
            self._masks[tpm.fqn] = masked_ids(self._probe, args[0], self.plan.size)
        return tuple(args), kwargs

    def _check_narrowed(
        self, t: Any, out: Any, r: Redistribution, tpm: TPModule, known: Layout | None
    ) -> None:
        """Refuse a linear style that takes, as it is, the DTensor an all-to-all left from a
        dim the tp ranks do not divide, with a dim before it of more than one: DTensor pads
        the dim, moves it, and cuts each rank's tensor back with a ``narrow``
        (``Shard._unpad_for_new_shard_dim``), which leaves it non-contiguous, and the
        linear's multiply views it flat (``aten.view`` of the decomposed ``aten.linear``), so
        torch fails, on every backend (the padding comes before the collective)."""
        if not isinstance(t, torch.Tensor) or t.dim() < 3 or self.plan.size == 1:
            return
        src, ndim = known or r.src, t.dim()
        moved = collective(src, r.dst, ndim)
        if moved == "tp_all_to_all" and uneven(t, src, self.plan.size):
            d = (src[1] or 0) % ndim
            if math.prod(t.shape[:d]) > 1:
                what = f"{tpm.fqn} ({layout_name(src)} -> {layout_name(r.dst)})"
                self._narrowed[id(out)] = (weakref.ref(out), (d, t.shape[d], what))
            return
        found = self._aliased(t, self._narrowed) if known is not None else None
        linear = isinstance(self._model.get_submodule(tpm.fqn), nn.Linear)
        if found is None or moved is not None or not linear or tpm.base == "PrepareModuleInput":
            return
        d, n, where = found[1]
        refuse_narrowed(tpm, d, n, where, self.plan.size)

    def _skipped(self, t: Any, r: Redistribution, tpm: TPModule, known: Layout | None) -> bool:
        """Whether the style leaves DTensor ``t`` (in ``known``) as it is although the style
        declares another layout for it: ``ColwiseParallel``, ``RowwiseParallel`` and
        ``PrepareModuleInput`` redistribute an input only where their declared layouts
        differ (``input_layouts != desired_input_layouts``, placements compared as given),
        from the layout the DTensor has (``DTensor.redistribute``); a DTensor in another
        layout than the declared one, where the declared ones are the same, goes on as it
        is, and DTensor's operators redistribute it implicitly (sharding propagation,
        ``redistribute_local_tensor(..., is_explicit=False)``). A linear's multiply needs
        its input in the style's desired layout, so a column- or row-wise linear's forward
        moves what the style's redistribution would (planned); ``PrepareModuleInput``
        moves nothing and leaves the DTensor in its own layout for the operators inside.
        Their backward follows the operators' sharding, not the style's: noted
        (:meth:`implicit_warnings`)."""
        if (
            known is None
            or not isinstance(t, torch.Tensor)
            or t.dim() == 0
            or self.plan.size == 1
            or tpm.base not in ("ColwiseParallel", "RowwiseParallel", "PrepareModuleInput")
            or r.src != r.dst
            or same_layout(known, r.src, t.dim())
        ):
            return False
        self._implicit.setdefault((tpm.fqn, r.position), skipped_warning(tpm, r, known))
        return tpm.base == "PrepareModuleInput"

    def _gathered_backward(self, t: torch.Tensor, out: Any, tpm: TPModule, i: int) -> Any:
        """The backward of a linear whose multiply gathered its ``_StridedShard`` input
        (:func:`gathered_by_multiply`): no ``Redistribute.backward`` (the style ran none), but
        the weight's gradient (``mm`` of the output's gradient and the saved input, still
        ``_StridedShard``) all-gathers the input again, and the input's gradient comes back
        ``Partial()``, to the redistribution that made ``t`` (planned there: a reduce-scatter
        back to a sharded layout, an all-reduce to a replicated one) or, where no style
        redistributed it, to DTensor's operators that made it, whose backward reduces it by
        their own sharding propagation (noted, not planned; its memory noted as not exact:
        :func:`gathered_warning`)."""
        found = self._aliased(t, self._grads)
        if found is not None:
            found[1][0] = PARTIAL
        absorbed = found is not None and id(found[1]) in self._absorbing
        warning = gathered_warning(tpm, self._layout(t) or REPLICATE, absorbed)
        self._implicit.setdefault((tpm.fqn, "gathered"), warning)
        weight = getattr(self._model.get_submodule(tpm.fqn), "weight", None)
        known, dtype = self._layout(t) or REPLICATE, _dtype_name(t)
        nbytes = padded_bytes(t.numel() * t.element_size(), t.shape, "tp_all_gather", known,
                              REPLICATE, self.plan.size)  # fmt: skip
        probe = self._probe

        def report() -> None:
            if isinstance(weight, nn.Parameter) and weight.requires_grad:
                self.runtime.tensor_parallel(i, "tp_all_gather", tpm.fqn, "backward", nbytes, dtype)

        def back_copy(g: torch.Tensor) -> torch.Tensor:
            if probe is not None and isinstance(weight, nn.Parameter) and weight.requires_grad:
                with probe.redistributed(None):  # the input gathered for the weight's gradient
                    g.new_empty(g.shape)
            return g

        return GradCollective.apply(report, None, back_copy, out)  # type: ignore[no-untyped-call]

    def _batch_one(self, t: torch.Tensor, m: BatchOneMultiply, tpm: TPModule, i: int) -> Any:
        """A batch of one's sequence-sharded input multiplied as DTensor's ``mm``
        strategies pick (:func:`batch_one_multiply`): the forward's redistributed operands
        (their collectives, their temporary buffers), the input's gradient's layout, and a
        ``Partial()`` weight gradient that FSDP2's post-backward reduce-scatters; the
        output's layout and the backward's at the output (:meth:`_multiplied`)."""
        where, size = (self.runtime, i, tpm.fqn, _dtype_name(t)), self.plan.size
        # the operands gathered held until the multiply ran; its product a share meanwhile
        self._produced[tpm.fqn] = (m, issued_forward(self._probe, m.forward, t, size, where))
        self._product_shares[tpm.fqn] = m.product_share
        found = self._aliased(t, self._grads)
        if found is not None:
            found[1][0] = m.input_grad
        if m.input_grad == PARTIAL and (found is None or id(found[1]) not in self._absorbing):
            warning = partial_grad_warning(tpm, self._layout(t) or REPLICATE)
            self._implicit.setdefault((tpm.fqn, "gathered"), warning)
        self._scattered_weight(t, m, tpm)
        return t

    def _scattered_weight(self, t: torch.Tensor, m: BatchOneMultiply, tpm: TPModule) -> None:
        weight = getattr(self._model.get_submodule(tpm.fqn), "weight", None)
        if m.weight_grad_partial and isinstance(weight, nn.Parameter):
            scatter_partial_weight(self._groups, f"{tpm.fqn}.weight", weight, t, self.plan.size)
            self._whole_grads.add(weight)  # its Partial() gradient: whole on each rank

    def _multiplied(
        self, tpm: TPModule, i: int, output: torch.Tensor
    ) -> tuple[Layout | None, torch.Tensor]:
        """The layout of a batch of one's product (:meth:`_batch_one`), None for another
        module's, and ``output`` hooked so that the backward's two multiplies (the weight's
        gradient, then the input's, as autograd runs them: :func:`multiplied_backward`)
        report their redistributed operands and make their temporaries as torch does."""
        made = self._produced.pop(tpm.fqn, None)
        self._product_shares.pop(tpm.fqn, None)
        if made is None:
            return None, output
        m, probe, size, dtype = made[0], self._probe, self.plan.size, _dtype_name(output)
        if not m.backward or not (output.requires_grad and torch.is_grad_enabled()):
            return m.output, output

        def report(moves: tuple[Move, ...]) -> None:
            for move in moves:
                self.runtime.tensor_parallel(i, move.kind, tpm.fqn, "backward", move.nbytes, dtype)

        w = getattr(self._model.get_submodule(tpm.fqn), "weight", None)
        back_copy = multiplied_backward(probe, m, getattr(w, "requires_grad", False), report, size)
        hooked: torch.Tensor = GradCollective.apply(_nothing, None, back_copy, output)  # type: ignore[no-untyped-call]
        return m.output, hooked

    def implicit_warnings(self) -> list[FsdpWarning]:
        """A warning for each input a style left to DTensor's operators (:meth:`_skipped`)."""
        return implicit_warnings(self._implicit)

    def _post_forward(
        self, tpm: TPModule, i: int, module: nn.Module, args: Any, output: Any
    ) -> Any:
        grad: list[Layout] | None = None
        self._masks.pop(tpm.fqn, None)  # let go of before the output's reduction
        if tpm.outputs:
            r = tpm.outputs[0]
            # a float8 linear style's output gradient comes back cast to float8
            # (NoopFwToFloat8BwDynamic after the redistribution)
            grad_f8 = tpm.float8 and tpm.base != "PrepareModuleInput"
            if isinstance(output, torch.Tensor):
                grad = [r.grad]  # which a later operator may change (_meet)
                known, output = self._multiplied(tpm, i, output)
                output = self._redistribute(output, r, tpm, i, known, (False, grad_f8), None, grad)
                if grad_f8 and output.requires_grad and torch.is_grad_enabled():
                    report = None
                    if amax_reduced(r.dst) and self.plan.size > 1:
                        report = functools.partial(
                            report_amax, self.runtime, i, tpm.fqn, "backward"
                        )
                    output = Float8GradCast.apply(self._probe, report, output)  # type: ignore[no-untyped-call]
            elif isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                output = (self._redistribute(output[0], r, tpm, i, None), *output[1:])
        if not tpm.local_output and isinstance(output, torch.Tensor):
            where = f"the output of {tpm.fqn!r} ({tpm.style}, use_local_output=False)"
            self._remember(output, tpm.output_layout, where, grad)
        elif tpm.outputs or tpm.base != "PrepareModuleInput":
            out = output[0] if isinstance(output, tuple) and output else output
            self._local(out, tpm.output_layout, f"{tpm.fqn} ({tpm.style})")
        return output

    def mixed_warnings(self) -> list[FsdpWarning]:
        """A warning for each DTensor met a plain tensor (:meth:`DTensorFlow.warnings`)."""
        return self._flow.warnings()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._amax is not None:
            self._amax.remove()
        tables = (self._dtensors, self._grads, self._absorbing, self._narrowed, self._plain)
        for table in (*tables, self._float8, self._flow.dtensors, self._masks):
            table.clear()
        if self._probe is not None:
            self._probe.on_all_reduce = None
        self._probe = None
