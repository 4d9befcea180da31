"""Record what a real FSDP2 (``fully_shard``) run does on this rank.

For the duration of a ``with`` block (restored on exit, exceptions included)
the recorder wraps FSDP2's own code:

- ``foreach_all_gather`` (as called by ``FSDPParamGroup.unshard``): ``all_gather``,
- ``FSDPParamGroup._to_sharded`` / ``_to_sharded_post_forward`` leaving the
  unsharded state: ``free``,
- ``foreach_reduce``: ``reduce_scatter``; on a 2-D mesh (HSDP) the
  ``torch.distributed.all_reduce`` it issues across the replicas
  (``all_reduce``, group ``"replicate"``); with ``CPUOffloadPolicy``, the gradient
  shard's copy to host memory after it (``d2h``) and the shard's copy to the device
  before each all-gather of a fully sharded group (``h2d``),
- with torchao's float8 all-gather, the amax all-reduce ``funcol.all_reduce`` issues in its
  cast before an all-gather (``all_reduce``, group ``"shard"``, one a weight), and the one
  ``precompute_float8_dynamic_scale_for_fsdp`` issues after the optimizer step, for every
  weight at once (the ``torch._foreach_norm`` of the float8 weights it stacks marks it;
  recorded at the end of the step it follows, as the plan has it),
- ``FSDPParamGroup._prefetch_unshard``: marks the all-gathers it issues as prefetch,
- ``FSDPParamGroup.pre_forward`` / ``post_forward`` / ``post_backward``,
  ``FSDPState._pre_backward`` and the root's final callback: the hook each event
  comes from, and the end of each iteration.

Enter the recorder before the first forward after ``fully_shard`` (the
pre-backward hooks are bound when a forward registers them). With
``timestamps=True`` each event also carries ``t`` (seconds since the recorder
was entered) and ``duration`` (host time of the call).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg_mod
from torch.distributed.fsdp._fully_shard import _fsdp_state as state_mod

from fsdpviz.plan.fsdp2_applied import fsdp2_states
from fsdpviz.recording._events import EventLog, now_ns, patch, recording_config
from fsdpviz.recording._modules import unwrapped_class
from fsdpviz.schema.events import Event, Hook
from fsdpviz.schema.names import group_names, param_names, unwrapped_fqn
from fsdpviz.schema.report import Report, Unit, dtype_name

P = ParamSpec("P")
R = TypeVar("R")


def _sharded(group: Any) -> bool:
    """The group is fully sharded (not on its post-forward mesh): its all-gather input is
    the shard itself, in host memory under CPUOffloadPolicy."""
    return all(p.sharded_state.name == "SHARDED" for p in group.fsdp_params)


class _Amaxes:
    """An all-gather of torchao's float8 weights running: where its amax all-reduces go
    (before its event, at ``at``), what they are tagged with, and the weights' FQNs in the
    order ``all_gather_inputs`` casts them (see [Note: float8 all-gather amaxes])."""

    def __init__(self, event: Event, at: int, fqns: list[str]) -> None:
        self.event, self.at, self.fqns, self.count = event, at, fqns, 0


class FSDP2Recorder(EventLog):
    """Records the all-gathers, frees and reduce-scatters of a ``fully_shard`` model.

    Example::

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        with fsdpviz.FSDP2Recorder(model) as rec:
            for _ in range(2):
                model(x).sum().backward()
        report = rec.report()   # same types as fsdpviz.analyze(..., fully_shard=[...])
    """

    def __init__(self, model: nn.Module | Sequence[nn.Module], *, timestamps: bool = False) -> None:
        # several roots: the model parts of a pipeline-parallel rank, each sharded on its own
        self.parts = [model] if isinstance(model, nn.Module) else list(model)
        for part in self.parts:
            if not fsdp2_states(part):
                raise TypeError(
                    "FSDP2Recorder needs a model on which fully_shard was called; "
                    f"{type(part).__name__} has no FSDP2 state"
                )
        super().__init__(timestamps)
        self.model = self.parts[0]
        self._state_names: dict[int, str] = {}
        self._group_names: dict[int, str] = {}
        for part in self.parts:
            names = {m: n for n, m in part.named_modules()}
            states = list(fsdp2_states(part))
            owned = [set(s._modules) for s in states]
            calls = [[n for m, n in names.items() if m in mods] for mods in owned]
            for state, name in zip(states, group_names(calls), strict=True):
                self._state_names[id(state)] = name
                if state._fsdp_param_group is not None:
                    self._group_names[id(state._fsdp_param_group)] = name
        self._hook: tuple[Hook, str] | None = None
        self._ctx = next(iter(fsdp2_states(self.parts[0])))._state_ctx  # shared by every state
        self._in_final = False
        self._group: Any = None
        self._forward_order: list[str] = []
        self._stack: ExitStack | None = None
        self._reducing: Any = None  # the group inside foreach_reduce
        self._amaxes: _Amaxes | None = None  # the float8 all-gather inside foreach_all_gather
        self._float8 = False  # torchao's float8 is loaded: its amax all-reduces are recorded
        # the part of each parameter (by id): whose precomputation of float8 scales the
        # weights a _foreach_norm takes are; the part whose precomputation runs, and how
        # many amaxes it stacks (the elements of its all-reduce)
        self._part_of = {id(p): k for k, part in enumerate(self.parts) for p in part.parameters()}
        self._precomputing: tuple[int, int] | None = None
        # post_backward seen: the groups (ids) and their FSDPParams (ids) a gradient reached
        self._backward_groups: set[int] = set()
        self._reached: set[int] = set()

    def __enter__(self) -> FSDP2Recorder:
        group_cls = pg_mod.FSDPParamGroup
        state_cls = state_mod.FSDPState
        with ExitStack() as stack:
            for name, kind in (
                ("foreach_all_gather", "all_gather"),
                ("foreach_reduce", "reduce_scatter"),
            ):
                collective = self._wrap_collective(getattr(pg_mod, name), kind)
                patch(stack, pg_mod, name, collective)
            all_reduce = self._wrap_all_reduce(torch.distributed.all_reduce)
            patch(stack, torch.distributed, "all_reduce", all_reduce)
            # torchao's float8 all-gather: each weight's amax, all-reduced in its cast
            float8_utils = sys.modules.get("torchao.float8.float8_utils")
            if float8_utils is not None and hasattr(float8_utils, "all_reduce"):
                amax = self._wrap_amax(float8_utils.all_reduce)
                patch(stack, float8_utils, "all_reduce", amax)
                self._float8 = True
                norms = self._wrap_amax_norms(torch._foreach_norm)
                patch(stack, torch, "_foreach_norm", norms)
                patch(stack, funcol, "all_reduce", self._wrap_precomputed(funcol.all_reduce))
            for name in ("_to_sharded", "_to_sharded_post_forward"):
                patch(stack, group_cls, name, self._wrap_free(getattr(group_cls, name)))
            hooks: dict[str, Hook | None] = {
                "unshard": None,
                "pre_forward": "pre_forward",
                "post_forward": "post_forward",
                "post_backward": "post_backward",
            }
            for name, hook in hooks.items():
                patch(stack, group_cls, name, self._wrap_group(getattr(group_cls, name), hook))
            prefetch = self._wrap_prefetch(group_cls._prefetch_unshard)
            patch(stack, group_cls, "_prefetch_unshard", staticmethod(prefetch))
            pre_backward = self._wrap_pre_backward(state_cls._pre_backward)
            patch(stack, state_cls, "_pre_backward", pre_backward)
            final = self._wrap_final(state_cls._root_post_backward_final_callback)
            patch(stack, state_cls, "_root_post_backward_final_callback", final)
            self._started(stack.pop_all())  # undone by __exit__
        return self

    # -------------------------------------------------------------- wrappers
    def _name(self, group: Any) -> str:
        return self._group_names.get(id(group), "?")

    def _emit(
        self, kind: Any, group: Any, phase: Any, prefetch: bool = False, across: Any = None
    ) -> int:
        """Append an event; its index for :meth:`_timed` (-1 without timestamps)."""
        hook, hook_unit = self._hook or (None, None)
        event = Event(kind, self._name(group), phase, prefetch, hook, hook_unit, group=across)
        return self._append(event)

    @staticmethod
    def _phase(group: Any) -> str:
        return "forward" if group._training_state.name == "FORWARD" else "backward"

    def _wrap_collective(self, original: Callable[P, R], kind: str) -> Callable[P, R]:
        @functools.wraps(original)
        def collective(*args: P.args, **kwargs: P.kwargs) -> R:
            group = self._group
            if group is None:
                return original(*args, **kwargs)
            phase = "backward" if kind == "reduce_scatter" else self._phase(group)
            offload = any(p.offload_to_cpu for p in group.fsdp_params)
            if kind == "all_gather" and offload and _sharded(group):
                self._emit("h2d", group, phase)  # all_gather_inputs copies the host shard
            start = now_ns()
            i = self._emit(kind, group, phase, kind == "all_gather" and self._prefetching > 0)
            self._reducing = group if kind == "reduce_scatter" else None
            if kind == "all_gather" and self._float8:
                fqns = [
                    unwrapped_fqn(getattr(p, "_param_fqn", None) or "")
                    for p in group.fsdp_params
                    if hasattr(getattr(p, "_sharded_local_tensor", None), "fsdp_pre_all_gather")
                ]
                self._amaxes = _Amaxes(self._current[-1], len(self._current) - 1, fqns)
            try:
                return original(*args, **kwargs)
            finally:
                shift = self._amaxes.count if self._amaxes is not None else 0
                self._reducing, self._amaxes = None, None
                self._timed(i + shift if i >= 0 else i, start)
                if kind == "reduce_scatter" and offload:
                    self._emit("d2h", group, "backward")  # the gradient shard to host memory

        return collective

    def _wrap_all_reduce(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            group = self._reducing
            if group is None:
                return original(tensor, *args, **kwargs)
            # foreach_reduce all-reduces across the replicas of a 2-D mesh (HSDP)
            start = now_ns()
            i = self._emit("all_reduce", group, "backward", across="replicate")
            return self._call_timed(start, i, original, tensor, *args, **kwargs)

        return all_reduce

    def _wrap_amax(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            a = self._amaxes
            if a is None:
                return original(tensor, *args, **kwargs)
            e = a.event
            fqn = a.fqns[a.count] if a.count < len(a.fqns) else None
            nbytes = tensor.numel() * tensor.element_size()
            amax = replace(e, kind="all_reduce", group="shard", module=fqn, nbytes=nbytes,
                           dtype=dtype_name(tensor.dtype))  # fmt: skip
            self._current.insert(a.at + a.count, amax)
            a.count += 1
            return original(tensor, *args, **kwargs)

        return all_reduce

    def _wrap_amax_norms(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch._foreach_norm``: ``precompute_float8_dynamic_scale_for_fsdp`` takes the
        norms of every float8 weight of the module it was given (DTensors over a
        ``WeightWithDynamicFloat8CastTensor``) and stacks them; the all-reduce DTensor issues
        next, for the stack's clamp, is the precomputation's."""

        @functools.wraps(original)
        def foreach_norm(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if tensors and all(_float8_weight(t) for t in tensors):
                part = self._part_of.get(id(tensors[0]))
                self._precomputing = (part, len(tensors)) if part is not None else None
            return original(tensors, *args, **kwargs)

        return foreach_norm

    def _wrap_precomputed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """DTensor's ``funcol.all_reduce``: the precomputation's all-reduce of the stacked
        amaxes over the shard group, recorded at the end of the step it follows (the optimizer
        step's, after FSDP's final callback ended the step's last iteration). Under tensor
        parallelism DTensor reduces over the tp dimension next, which FSDP2's recorder leaves
        out as it leaves out every tensor-parallel collective."""

        @functools.wraps(original)
        def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            running, self._precomputing = self._precomputing, None
            if running is None or tensor.numel() != running[1]:  # not the stacked amaxes
                return original(tensor, *args, **kwargs)
            event = self._precomputed(running[0], tensor)
            start = now_ns()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._after_step(event, start)

        return all_reduce

    def _precomputed(self, part: int, tensor: torch.Tensor) -> Event:
        """The event of part ``part``'s precomputation reducing ``tensor``, its stacked
        amaxes: the part's root all-reduces it over the shard group."""
        root = self._state_names.get(id(fsdp2_states(self.parts[part])[0]), "?")
        return Event("all_reduce", root, "backward", group="shard",
                     nbytes=tensor.numel() * tensor.element_size(),
                     dtype=dtype_name(tensor.dtype))  # fmt: skip

    def _wrap_free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def to_sharded(group: Any) -> Any:
            if not group.is_unsharded:
                return original(group)
            start = now_ns()
            i = self._emit("free", group, self._phase(group))
            return self._call_timed(start, i, original, group)

        return to_sharded

    def _wrap_group(
        self, original: Callable[Concatenate[Any, P], R], hook: Hook | None
    ) -> Callable[Concatenate[Any, P], R]:
        @functools.wraps(original)
        def run(group: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            name = self._name(group)
            if hook == "post_forward" and args and args[0] is None:
                # the forward root's post-forward completes a grouped call whose forward
                # ran only some of its modules (no module given): the root's hook issues it
                root = self._ctx.iter_forward_root if self._ctx is not None else None
                self._hook = (hook, self._state_names.get(id(root), name))
            elif hook is not None and not (hook == "post_backward" and self._in_final):
                self._hook = (hook, name)
            first_iteration = hook == "pre_forward" and not self.iterations
            if first_iteration and name not in self._forward_order:
                self._forward_order.append(name)
            if hook == "post_backward":
                self._note_gradients(group)
            previous, self._group = self._group, group
            try:
                return original(group, *args, **kwargs)
            finally:
                self._group = previous

        return run

    def _note_gradients(self, group: Any) -> None:
        """Which of ``group``'s parameters have a gradient as its post-backward starts (what
        it reduce-scatters: ``FSDPParamGroup.post_backward`` skips those without)."""
        self._backward_groups.add(id(group))
        for fp in group.fsdp_params:
            if not hasattr(fp, "_unsharded_param"):
                continue
            if fp.unsharded_accumulated_grad is not None or fp.unsharded_param.grad is not None:
                self._reached.add(id(fp))

    def _wrap_pre_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def pre_backward(state: Any, grad: torch.Tensor) -> Any:
            self._hook = ("pre_backward", self._state_names.get(id(state), "?"))
            return original(state, grad)

        return pre_backward

    def _wrap_final(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def final(state: Any) -> Any:
            self._hook = ("final_callback", self._state_names.get(id(state), "?"))
            self._in_final = True
            try:
                return original(state)
            finally:
                self._in_final = False
                self._hook = None
                self._final_callback_ran()

        return final

    def _final_callback_ran(self) -> None:
        """The root's final callback ended a backward: the end of an iteration (under
        pipeline parallelism, of one microbatch's backward; see ``PipelineRecorder``)."""
        self._end_iteration()

    # ---------------------------------------------------------------- report
    def units(self) -> list[Unit]:
        """The parameter groups, in FSDP2's state order (``named_modules`` of the root)."""
        first: dict[nn.Parameter, str] = {}
        aliases: dict[nn.Parameter, dict[str, str]] = {}
        named = [
            (raw, p)
            for part in self.parts
            for raw, p in part.named_parameters(remove_duplicate=False)
        ]
        shown = param_names(raw for raw, _ in named)  # as a plan names them
        for raw, p in named:
            if p in first:
                aliases.setdefault(p, {})[shown[raw]] = first[p]
            else:
                first[p] = shown[raw]
        out: list[Unit] = []
        states = [state for part in self.parts for state in fsdp2_states(part)]
        tp = any(
            fp.is_dtensor
            for state in states
            if state._fsdp_param_group is not None
            for fp in state._fsdp_param_group.fsdp_params
        )
        for state in states:
            group = state._fsdp_param_group
            if group is None:
                continue
            params = group.fsdp_params
            # read from the policy: the FSDPParam dtype attributes exist only after lazy init
            every = {fp.sharded_param.dtype for fp in params}
            # FSDP2's orig dtype: the trainable parameters' (they share one)
            orig = {fp.sharded_param.dtype for fp in params if fp.sharded_param.requires_grad}
            orig = orig or set(every)
            dtype = orig.pop() if len(orig) == 1 else None
            mp = group.mp_policy
            compute = mp.param_dtype or (dtype if len(every) == 1 else None)
            grads = {fp.sharded_param.requires_grad for fp in params}
            fqns = [first[fp.sharded_param] for fp in params]
            trainable: dict[str, Any] = {}
            trains = [fp.sharded_param.requires_grad for fp in params]
            unused = [  # requires grad, but no gradient reached it in any post-backward
                f
                for fp, f, t in zip(params, fqns, trains, strict=True)
                if t and id(group) in self._backward_groups and id(fp) not in self._reached
            ]
            if len(grads) > 1 or unused:  # FSDP2 reduce-scatters each padded shard with a grad
                steps = [t and f not in unused for f, t in zip(fqns, trains, strict=True)]
                trainable = {
                    "frozen_params": [f for f, t in zip(fqns, trains, strict=True) if not t],
                    "unused_params": unused,
                    "trainable_numel": sum(
                        fp._orig_size.numel() for fp, t in zip(params, steps, strict=True) if t
                    ),
                    "trainable_sharded_numel": sum(
                        fp.padded_sharded_param_size.numel()
                        for fp, t in zip(params, steps, strict=True)
                        if t
                    ),
                }
            out.append(
                Unit(
                    module=self._name(group),
                    module_class=", ".join(unwrapped_class(m) for m in group.modules),
                    params=[first[fp.sharded_param] for fp in params],
                    shared_params={
                        k: v for fp in params for k, v in aliases.get(fp.sharded_param, {}).items()
                    },
                    numel=sum(fp._orig_size.numel() for fp in params),
                    flat_numel=sum(fp._orig_size.numel() for fp in params),
                    padded_numel=sum(fp.padded_sharded_param_size.numel() for fp in params)
                    * group.mesh_info.shard_mesh_size,
                    sharded_numel=sum(fp.padded_sharded_param_size.numel() for fp in params),
                    dtype=dtype_name(dtype),
                    compute_dtype=dtype_name(compute),
                    reduce_dtype=dtype_name(mp.reduce_dtype or mp.param_dtype or dtype),
                    requires_grad=None if len(grads) > 1 else (grads.pop() if grads else None),
                    sharding_strategy="FULL_SHARD"
                    if group.post_forward_mesh_info is not None
                    else "SHARD_GRAD_OP",
                    itemsize=torch.empty((), dtype=dtype or torch.float32).element_size(),
                    shard_shapes={
                        first[fp.sharded_param]: list(fp.padded_sharded_param_size) for fp in params
                    }
                    if tp or any(_shard_dim(fp) for fp in params)
                    else {},
                    shard_dims={
                        first[fp.sharded_param]: _shard_dim(fp) for fp in params if _shard_dim(fp)
                    },
                    tp_placements={
                        first[fp.sharded_param]: _placement(_tp_spec(fp).placements[-1])
                        for fp in params
                        if fp.is_dtensor
                    },
                    **trainable,
                    **(_dtypes(params, fqns) if len(every) > 1 else {}),
                )
            )
        return out

    def forward_order(self) -> list[str]:
        """Groups in the order their first-iteration forward started."""
        return list(self._forward_order)

    def report(self, config: dict[str, Any] | None = None) -> Report:
        """The recording as a report (see :meth:`FSDP1Recorder.report`)."""
        return Report(
            source="recording",
            config=recording_config("FSDP2", config),
            units=self.units(),
            forward_order=list(self._forward_order),
            iterations=[list(it) for it in self.iterations],
        )


def _float8_weight(t: Any) -> bool:
    """A sharded float8 weight, as torchao's precomputation picks them: a DTensor whose local
    tensor casts itself before FSDP2's all-gather (``fsdp_pre_all_gather``)."""
    return hasattr(getattr(t, "_local_tensor", None), "fsdp_pre_all_gather")


def _dtypes(params: list[Any], fqns: list[str]) -> dict[str, Any]:
    """A group of parameters in several dtypes: each dtype's, and their elements in all and
    in a rank's padded shard, as FSDP2 holds them."""
    names: dict[str, list[str]] = {}
    numels: dict[str, list[int]] = {}
    for fp, fqn in zip(params, fqns, strict=True):
        name = dtype_name(fp.sharded_param.dtype) or "?"
        names.setdefault(name, []).append(fqn)
        counts = numels.setdefault(name, [0, 0])
        counts[0] += fp._orig_size.numel()
        counts[1] += fp.padded_sharded_param_size.numel()
    return {"param_dtypes": names, "dtype_numels": numels}


def _tp_spec(fp: Any) -> Any:
    """The DTensor spec of a tensor-parallel parameter before FSDP sharded it."""
    spec = getattr(fp, "_unsharded_dtensor_spec", None)
    return spec if spec is not None else fp._tp_spec  # older torch


def _shard_dim(fp: Any) -> int:
    """The dim FSDP2 shards an ``FSDPParam`` on (its ``shard_placement_fn``'s; 0 by default)."""
    return int(fp.fsdp_placement.dim)


def _placement(p: Any) -> str:
    """A DTensor placement as fsdpviz writes it: ``Shard(0)``, ``Replicate()``, ``Partial()``."""
    name = type(p).__name__
    return f"Shard({p.dim})" if name in ("Shard", "_StridedShard") else f"{name}()"
