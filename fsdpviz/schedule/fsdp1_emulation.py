"""Drive :class:`FSDP1Runtime` from real autograd on fsdpviz's copy of the model.

Each unit gets a FlatParameter-shaped leaf (on meta, or the model's device for
``trace="real"``); its parameters become views of it exactly when FSDP1 makes
them views (``torch.split`` + ``view`` during a forward unshard), so the
autograd graph, and therefore the order of FSDP's backward hooks, is the one
FSDP1 would get. Hooks are registered as FSDP1 registers them: the pre-/post-
forward around the unit's module, ``register_hook`` on forward outputs, an
``AccumulateGrad`` hook on the flat parameter, multi-grad hooks on the inputs
of frozen units, and a final callback queued on the autograd engine.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.autograd import Variable
from torch.autograd.graph import register_multi_grad_hook
from torch.distributed.utils import _apply_to_tensors, _cast_forward_inputs
from torch.utils._pytree import tree_leaves

from fsdpviz.plan.fsdp1 import Plan
from fsdpviz.schedule.autograd_order import GraphRecorder
from fsdpviz.schedule.fsdp1_runtime import FSDP1Runtime, Handle


class FSDP1Emulation:
    """Flat parameters, views and FSDP1 hooks installed on the copy."""

    def __init__(self, plan: Plan, use_orig_params: bool, real: bool) -> None:
        self.plan = plan
        self.use_orig_params = use_orig_params
        self.flats: dict[str, nn.Parameter] = {}
        self.runtime = FSDP1Runtime(plan.units, use_orig_params, self._make_views)
        self._post_backward_handles: dict[int, Any] = {}
        self.recorder: GraphRecorder | None = None
        self.index = {u.fqn: i for i, u in enumerate(plan.units)}
        self._hook_handles: list[Any] = []
        for unit in plan.units:
            if not unit.has_params:
                continue
            mp = unit.config.mixed_precision
            dtype = (mp.param_dtype if mp else None) or unit.dtype
            if real:
                originals = iter(unit.params)
                device = unit.params[0].device
                chunks = [
                    torch.zeros(n, device=device) if pad else next(originals).detach().reshape(-1)
                    for n, pad in zip(unit.split_numels, unit.is_padding, strict=True)
                ]
                data = torch.cat([c.to(dtype) for c in chunks])
            else:
                data = torch.empty(sum(unit.split_numels), dtype=dtype, device="meta")
            flat = nn.Parameter(data, requires_grad=unit.requires_grad)
            self.flats[unit.fqn] = flat
            unit.module._parameters["_fsdpviz_flat_param"] = flat
        for i, unit in enumerate(plan.units):
            self._hook_handles.append(
                unit.module.register_forward_pre_hook(
                    functools.partial(self._pre_forward, i), prepend=True, with_kwargs=True
                )
            )
            self._hook_handles.append(
                unit.module.register_forward_hook(functools.partial(self._post_forward, i))
            )
        for state in self.runtime.states:
            if state.handle is not None:
                with torch.no_grad():
                    self._set_views(state.handle)

    # ------------------------------------------------------------------ views
    def _set_views(self, h: Handle) -> list[torch.Tensor]:
        unit = h.unit
        flat = self.flats[unit.fqn]
        splits = torch.split(flat, unit.split_numels, dim=0)
        views = [s for s, pad in zip(splits, unit.is_padding, strict=True) if not pad]
        by_fqn: dict[str, torch.Tensor] = {}
        for view, shape, (sub, name, fqn) in zip(views, unit.shapes, unit.param_infos, strict=True):
            v = view.view(shape)
            by_fqn[fqn] = v
            self._setattr(sub, name, v)
        for sub, name, _, prim in unit.shared_infos:
            self._setattr(sub, name, by_fqn[prim])
        return list(by_fqn.values())

    def _setattr(self, module: nn.Module, name: str, tensor: torch.Tensor) -> None:
        if name in module._parameters:
            module._parameters[name] = tensor  # type: ignore[assignment]
        else:
            module.__dict__[name] = tensor

    def _make_views(self, h: Handle) -> None:
        with torch.enable_grad():
            views = self._set_views(h)
        if self.recorder is not None:
            self.recorder.add_views(self.index[h.name], views)

    # ------------------------------------------------------------------ hooks
    def _pre_forward(
        self, index: int, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        rt = self.runtime
        state = rt.states[index]
        mp = state.config.mixed_precision
        root_cast = state.is_root and mp is not None and mp.cast_root_forward_inputs
        if root_cast and mp is not None and mp.param_dtype is not None and module.training:
            args, kwargs = _cast_forward_inputs(mp.param_dtype, *args, **kwargs)
        grad = torch.is_grad_enabled()
        rt.pre_forward(index, grad)
        kind = rt.needs_post_backward_hook(index, grad)
        if kind == "acc_grad":
            flat = self.flats[state.unit.fqn]
            grad_fn = flat.expand_as(flat).grad_fn
            assert grad_fn is not None
            acc = grad_fn.next_functions[0][0]
            assert acc is not None
            self._post_backward_handles[index] = acc.register_hook(
                functools.partial(self._post_backward, index)
            )
            if self.recorder is not None:
                self.recorder.acc_hooks[acc] = index
        unit_cast = state.handle is not None and not rt.is_recompute(index)
        if unit_cast and mp is not None and mp.cast_forward_inputs and mp.param_dtype is not None:
            args, kwargs = _cast_forward_inputs(mp.param_dtype, *args, **kwargs)
        if kind == "reshard_only":
            inputs = [
                t
                for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor) and t.requires_grad
            ]
            self._post_backward_handles[index] = register_multi_grad_hook(
                inputs, functools.partial(self._reshard_only, index)
            )
            if self.recorder is not None:
                self.recorder.add_multi(index, inputs)
        return args, kwargs

    def _post_forward(self, index: int, module: nn.Module, args: Any, output: Any) -> Any:
        rt = self.runtime
        if rt.is_recompute(index):
            return output
        grad = torch.is_grad_enabled()
        any_requires_grad = False
        if grad:

            def register(t: torch.Tensor) -> torch.Tensor:
                nonlocal any_requires_grad
                if t.requires_grad:
                    t.register_hook(functools.partial(self._pre_backward, index))  # type: ignore[no-untyped-call]
                    any_requires_grad = True
                    if self.recorder is not None:
                        self.recorder.add_tensor_hook(t, index)
                return t

            output = _apply_to_tensors(register, output)
        rt.post_forward(index, grad, any_requires_grad)
        return output

    def _pre_backward(self, index: int, grad: torch.Tensor) -> None:
        if self.runtime.pre_backward(index):
            Variable._execution_engine.queue_callback(self._final_callback)

    def _post_backward(self, index: int, *unused: Any) -> None:
        with torch.no_grad():
            self.runtime.post_backward(index)

    def _reshard_only(self, index: int, *unused: Any) -> None:
        self.runtime.post_backward(index, reshard_only=True)

    def _final_callback(self) -> None:
        self.runtime.final_callback()
        for handle in self._post_backward_handles.values():
            handle.remove()
        self._post_backward_handles.clear()

    def end_iteration(self) -> None:
        """Drop gradients so the next iteration starts like one after ``zero_grad``."""
        for flat in self.flats.values():
            flat.grad = None

    def remove(self) -> None:
        for handle in [*self._hook_handles, *self._post_backward_handles.values()]:
            handle.remove()
        self._hook_handles.clear()
        self._post_backward_handles.clear()
