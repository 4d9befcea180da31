"""Record what a real FSDP1 (``FullyShardedDataParallel``) run does on this rank.

The recorder wraps FSDP's own functions for the duration of a ``with`` block
(and restores them on exit, exceptions included):

- ``FlatParamHandle._all_gather_flat_param``: an ``all_gather`` event,
- ``FlatParamHandle._free_unsharded_flat_param``: a ``free`` event when the
  padded unsharded FlatParameter is still allocated,
- ``_runtime_utils._prefetch_handle``: marks the all-gathers it issues as prefetch,
- ``FlatParamHandle.pre_unshard`` / ``_runtime_utils._offload_grad``: with
  ``CPUOffload(offload_params=True)``, the shard's host-to-device copy before an
  all-gather (``h2d``) and the sharded gradient's copy back (``d2h``),
- ``_runtime_utils._reduce_grad`` / ``_reduce_grad_no_shard``: gradient reduction,
  and the ``torch.distributed.all_reduce`` that ``_reduce_grad`` issues on the
  inter-node process group under hybrid sharding (an ``all_reduce`` across replicas),
- the pre-/post-forward, pre-/post-backward hooks and the final callback: the
  hook each event is issued from, and the end of each iteration.

The result is a :class:`~fsdpviz.schema.report.Report` of the same types as a
prediction, so every view and :func:`fsdpviz.analyze` comparisons work on it.
With ``timestamps=True`` each event also carries ``t`` (seconds since the
recorder was entered, :func:`time.perf_counter_ns` clock) and ``duration`` (how
long FSDP's call took on the host); :func:`fsdpviz.record` uses that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import _flat_param, _runtime_utils
from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp_mod
from torch.distributed.fsdp._common_utils import HandleTrainingState, clean_tensor_name

from fsdpviz.plan.fsdp1 import FlatLayout, optimizer_fields
from fsdpviz.recording._events import EventLog, now_ns, patch, recording_config
from fsdpviz.recording._modules import unwrapped_class
from fsdpviz.schema.events import Event, Hook
from fsdpviz.schema.report import Report, Unit, dtype_name

P = ParamSpec("P")
R = TypeVar("R")


def _patch(
    stack: ExitStack, owner: Any, name: str, wrapper: Callable[[Callable[..., Any]], Any]
) -> None:
    patch(stack, owner, name, wrapper(getattr(owner, name)))


def _copies_host_shard(handle: Any) -> bool:
    """Whether ``pre_unshard`` copies the host shard to the device under
    ``CPUOffload(offload_params=True)`` (on a GPU; on a CPU the copy is a no-op, so the
    FlatParameter is checked instead): with parameter mixed precision every time, else when
    the FlatParameter points at the host shard."""
    if not handle._offload_params:
        return False
    if handle._uses_param_mixed_precision and not handle._force_full_precision:
        return True
    flat = handle.flat_param
    return bool(flat.data.data_ptr() == flat._local_shard.data_ptr())


def _low_precision_allocated(handle: Any) -> bool:
    """Whether the low-precision shard ``_mp_shard`` holds memory (``_alloc_storage`` leaves
    an allocated one as it is; ``_free_storage`` one already freed)."""
    return bool(handle.flat_param._mp_shard.untyped_storage().size() > 0)


def _unsharded_allocated(handle: Any) -> bool:
    """Whether the padded unsharded FlatParameter still holds memory (a free of one already
    freed is no event)."""
    return bool(handle._get_padded_unsharded_flat_param().untyped_storage().size() != 0)


def _casts_no_shard(handle: Any) -> bool:
    """``NO_SHARD``'s low-precision copy of the parameters, made where it is not already
    (a sharded strategy's is the all-gather's input, which its event stands for)."""
    return not handle.uses_sharded_strategy and not _low_precision_allocated(handle)


def _frees_no_shard_cast(handle: Any) -> bool:
    """``NO_SHARD``'s low-precision copy freed by ``post_reshard`` (a sharded strategy
    frees its own once gathered, ``post_unshard``: no event)."""
    return not handle.uses_sharded_strategy and _low_precision_allocated(handle)


class FSDP1Recorder(EventLog):
    """Records the all-gathers, frees and reductions of a real FSDP1 model.

    Example::

        model = FSDP(model, auto_wrap_policy=policy, device_id=device)
        with fsdpviz.FSDP1Recorder(model) as rec:
            for _ in range(2):
                model(x).sum().backward()
        report = rec.report()   # same types as fsdpviz.analyze(...)

    ``timestamps=True`` adds ``t`` and ``duration`` to every event. ``on_iteration``,
    when set, is called with the index of each iteration FSDP's final callback ends.
    """

    def __init__(self, model: nn.Module, *, timestamps: bool = False) -> None:
        fsdp_modules = FSDP.fsdp_modules(model)
        if not fsdp_modules:
            raise TypeError(
                "FSDP1Recorder needs a model wrapped in FullyShardedDataParallel; "
                f"{type(model).__name__} has no FSDP instance"
            )
        super().__init__(timestamps)
        self.model = model
        self._fsdp_modules = fsdp_modules
        self._names: dict[int, str] = {}
        self._handle_names: dict[int, str] = {}
        self._hook: list[tuple[Hook, str]] = []
        self._reducing: list[tuple[Any, Any]] = []  # (FSDP state, handle) inside _reduce_grad
        for name, module in model.named_modules():
            if isinstance(module, FSDP):
                fqn = clean_tensor_name(name).rstrip(".")
                self._names[id(module)] = fqn
                if module._handle is not None:
                    self._handle_names[id(module._handle)] = fqn

    # ------------------------------------------------------------- patching
    def __enter__(self) -> FSDP1Recorder:
        handle_cls = _flat_param.FlatParamHandle
        with ExitStack() as stack:
            gather = self._wrap_event("all_gather", prefetch=True)
            _patch(stack, handle_cls, "_all_gather_flat_param", gather)
            free = self._wrap_event("free", _unsharded_allocated)
            _patch(stack, handle_cls, "_free_unsharded_flat_param", free)
            _patch(stack, handle_cls, "pre_unshard", self._wrap_event("h2d", _copies_host_shard))
            cast = self._wrap_event("cast", _casts_no_shard, prefetch=True)
            _patch(stack, handle_cls, "_use_low_precision_shard", cast)
            free_cast = self._wrap_event("free", _frees_no_shard_cast)
            _patch(stack, handle_cls, "_free_low_precision_sharded_param", free_cast)
            _patch(stack, _runtime_utils, "_offload_grad", self._wrap_offload_grad)
            _patch(stack, _runtime_utils, "_prefetch_handle", self._wrap_prefetch)
            _patch(stack, _runtime_utils, "_reduce_grad", self._wrap_reduce("reduce_scatter"))
            _patch(stack, _runtime_utils, "_reduce_grad_no_shard", self._wrap_reduce("all_reduce"))
            _patch(stack, torch.distributed, "all_reduce", self._wrap_all_reduce)
            _patch(stack, fsdp_mod, "_pre_forward", self._wrap_hook("pre_forward", 1))
            _patch(stack, fsdp_mod, "_post_forward", self._wrap_hook("post_forward", 1))
            _patch(stack, _runtime_utils, "_pre_backward_hook", self._wrap_hook("pre_backward", 2))
            _patch(
                stack, _runtime_utils, "_post_backward_hook", self._wrap_hook("post_backward", 1)
            )
            _patch(
                stack,
                _runtime_utils,
                "_post_backward_reshard_only_hook",
                self._wrap_hook("post_backward", 1),
            )
            _patch(stack, _runtime_utils, "_post_backward_final_callback", self._wrap_final)
            self._started(stack.pop_all())  # undone by __exit__
        return self

    def _name(self, handle: Any) -> str:
        return self._handle_names.get(id(handle), "?")

    def _emit(
        self, kind: Any, handle: Any, phase: Any, prefetch: bool = False, group: Any = None
    ) -> int:
        """Append an event; returns its index for :meth:`_timed` (-1 without timestamps)."""
        hook, hook_unit = self._hook[-1] if self._hook else (None, None)
        event = Event(kind, self._name(handle), phase, prefetch, hook, hook_unit, group=group)
        return self._append(event)

    @staticmethod
    def _phase(handle: Any) -> str:
        return "forward" if handle._training_state == _forward_state() else "backward"

    def _wrap_event(
        self, kind: str, when: Callable[[Any], bool] | None = None, *, prefetch: bool = False
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A ``FlatParamHandle`` method issuing a ``kind`` event where ``when(handle)`` holds
        (always without it); ``prefetch``: marked so while FSDP's prefetch function runs."""

        def wrap(
            original: Callable[Concatenate[Any, P], R],
        ) -> Callable[Concatenate[Any, P], R]:
            @functools.wraps(original)
            def run(handle: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
                if when is not None and not when(handle):
                    return original(handle, *args, **kwargs)
                start = now_ns()
                ahead = prefetch and self._prefetching > 0
                i = self._emit(kind, handle, self._phase(handle), ahead)
                return self._call_timed(start, i, original, handle, *args, **kwargs)

            return run

        return wrap

    def _wrap_reduce(self, kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(
            original: Callable[Concatenate[Any, Any, P], R],
        ) -> Callable[Concatenate[Any, Any, P], R]:
            @functools.wraps(original)
            def reduce(state: Any, handle: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
                start = now_ns()
                i = self._emit(kind, handle, "backward")
                self._reducing.append((state, handle))
                try:
                    return original(state, handle, *args, **kwargs)
                finally:
                    self._reducing.pop()
                    self._timed(i, start)

            return reduce

        return wrap

    def _wrap_offload_grad(
        self, original: Callable[Concatenate[Any, Any, P], R]
    ) -> Callable[Concatenate[Any, Any, P], R]:
        @functools.wraps(original)
        def offload_grad(state: Any, handle: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            if not handle._offload_params:
                return original(state, handle, *args, **kwargs)
            start = now_ns()
            i = self._emit("d2h", handle, "backward")
            return self._call_timed(start, i, original, state, handle, *args, **kwargs)

        return offload_grad

    def _wrap_all_reduce(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            if not self._reducing or group is None:
                return original(tensor, *args, **kwargs)
            state, handle = self._reducing[-1]
            if group is not getattr(state, "_inter_node_pg", None):
                return original(tensor, *args, **kwargs)
            start = now_ns()
            i = self._emit("all_reduce", handle, "backward", group="replicate")
            return self._call_timed(start, i, original, tensor, *args, **kwargs)

        return all_reduce

    def _wrap_hook(
        self, hook: Hook, handle_arg: int
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(original: Callable[P, R]) -> Callable[P, R]:
            @functools.wraps(original)
            def run(*args: P.args, **kwargs: P.kwargs) -> R:
                handle = args[handle_arg] if len(args) > handle_arg else None
                if handle is None:
                    return original(*args, **kwargs)
                self._hook.append((hook, self._name(handle)))
                try:
                    return original(*args, **kwargs)
                finally:
                    self._hook.pop()

            return run

        return wrap

    def _wrap_final(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def final(state: Any, module: Any) -> Any:
            self._hook.append(("final_callback", self._names.get(id(state), "")))
            try:
                return original(state, module)
            finally:
                self._hook.pop()
                self._end_iteration()

        return final

    # --------------------------------------------------------------- report
    def units(self) -> list[Unit]:
        """The wrap units of the real model, in FSDP's handle order.

        Empty until FSDP's lazy initialisation (the first forward) has run.
        """
        if self._fsdp_modules[0]._is_root is None:
            return []
        out: list[Unit] = []
        for fsdp in self._fsdp_modules:
            fqn = self._names[id(fsdp)]
            inner = fsdp._fsdp_wrapped_module
            handle = fsdp._handle
            if handle is None:  # no parameters of its own, a sharding strategy still
                strategy = fsdp.sharding_strategy.name
                out.append(Unit(module=fqn, module_class=unwrapped_class(inner), params=[],
                                sharding_strategy=strategy))  # fmt: skip
                continue
            fp = handle.flat_param
            join = functools.partial(_join, fqn)
            shared = {
                join(_join(info.module_name, info.param_name)): join(
                    _join(info.prim_module_name, info.prim_param_name)
                )
                for info in fp._shared_param_infos
            }
            if fp._params is not None:
                grads = {p.requires_grad for p in fp._params}
            else:
                grads = {fp.requires_grad}
            itemsize = torch.empty((), dtype=fp._local_shard.dtype).element_size()
            out.append(
                Unit(
                    module=fqn,
                    module_class=unwrapped_class(inner),
                    params=[join(f) for f in fp._fqns],
                    shared_params=shared,
                    numel=sum(fp._numels),
                    flat_numel=fp._unpadded_unsharded_size.numel(),
                    padded_numel=fp._padded_unsharded_size.numel()
                    if handle.uses_sharded_strategy
                    else fp._unpadded_unsharded_size.numel(),
                    sharded_numel=fp._sharded_size.numel(),
                    dtype=dtype_name(fp._local_shard.dtype),
                    compute_dtype=dtype_name(handle._fwd_bwd_param_dtype),
                    reduce_dtype=dtype_name(handle._reduce_dtype),
                    requires_grad=None if len(grads) > 1 else grads.pop(),
                    sharding_strategy=handle._sharding_strategy.name,
                    itemsize=itemsize,
                    **_trainable(handle, [join(f) for f in fp._fqns]),
                )
            )
        return out

    def forward_order(self) -> list[str]:
        root = self._fsdp_modules[0]
        order = root._exec_order_data.handles_pre_forward_order
        return [self._name(h) for h in order]

    def report(self, config: dict[str, Any] | None = None) -> Report:
        """The recording as a report: units, forward order, one event list per iteration.

        ``config`` adds to ``report.config`` (keys fsdpviz does not know go to its ``extra``).
        """
        return Report(
            source="recording",
            config=recording_config("FSDP1", config),
            units=self.units(),
            forward_order=self.forward_order(),
            iterations=[list(it) for it in self.iterations],
        )


@functools.cache
def _forward_state() -> Any:
    return HandleTrainingState.FORWARD


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


@contextmanager
def record_fsdp1(model: nn.Module) -> Iterator[FSDP1Recorder]:
    """``with record_fsdp1(fsdp_model) as rec: ...`` then ``rec.report()``."""
    with FSDP1Recorder(model) as rec:
        yield rec


def _trainable(handle: Any, fqns: list[str]) -> dict[str, Any]:
    """The ``Unit`` fields of what the optimizer steps (:func:`optimizer_fields`), read from
    the FlatParameter's real layout (each parameter's numel with the alignment padding,
    which are padding)."""
    if not handle._use_orig_params:  # the optimizer steps the FlatParameter
        return {}
    fp = handle.flat_param
    layout = FlatLayout(
        list(fp._numels_with_padding),
        list(fp._is_padding_mask),
        handle.world_size if handle.uses_sharded_strategy else 1,
    )
    trains = [p.requires_grad for p in fp._params]
    return optimizer_fields(fqns, trains, layout, handle._use_orig_params)
