"""Drive :class:`FSDP2Runtime` from real autograd on fsdpviz's copy of the model.

FSDP2 computes with plain unsharded parameters (no flat views), so the copy's
parameters are used as they are (cast to ``mp_policy.param_dtype``). What FSDP2
adds to the autograd graph is reproduced exactly: the input cast of
``MixedPrecisionPolicy``, ``RegisterPostBackwardFunction`` applied to a group's
inputs when it enters the forward pass (its backward is the post-backward
hook), ``register_hook`` on forward outputs (the pre-backward hook) and the
root's final callback queued on the autograd engine.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.autograd import Variable
from torch.distributed.utils import _apply_to_tensors

from fsdpviz.plan.fsdp2 import prefetch_indices
from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.fsdp2_options import FSDP2Options
from fsdpviz.plan.torch_fsdp import grad_tensors, replace_grad_tensors
from fsdpviz.schedule.fsdp2_runtime import Float8Scales, FSDP2Runtime, weight_scales
from fsdpviz.schedule.tp_emulation import TPEmulation


class _PostBackward(torch.autograd.Function):
    """Same graph node as FSDP2's ``RegisterPostBackwardFunction``."""

    @staticmethod
    def forward(ctx: Any, emulation: FSDP2Emulation, index: int, *inputs: torch.Tensor) -> Any:
        ctx.emulation = emulation
        ctx.index = index
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        ctx.emulation.post_backward(ctx.index)
        return (None, None, *grads)


def _cast(dtype: torch.dtype, t: torch.Tensor) -> torch.Tensor:
    if not torch.is_floating_point(t) or t.dtype == dtype:
        return t
    return t.to(dtype)


def float8_scales(model: nn.Module, groups: list[Group], opts: FSDP2Options) -> Float8Scales | None:
    """The float8 weights each group of ``model`` all-gathers in float8, whose scales take an
    amax all-reduce (see [Note: float8 all-gather amaxes])."""
    spec = opts.job.float8
    if spec is None or not spec.enable_fsdp_float8_all_gather:
        return None
    linears = {id(m.weight) for m in opts.job.float8_modules(model)}
    weights = {
        fqn
        for g in groups
        for p, fqn in zip(g.params, g.param_fqns, strict=True)
        if id(p) in linears
    }
    units = [g.schema for g in groups if g.schema is not None]
    tp = opts.tp is not None and opts.parallel_dims.tp > 1
    return weight_scales(units, weights, spec.precompute_float8_dynamic_scale_for_fsdp, tp)


def fsdp2_runtime(model: nn.Module, groups: list[Group], opts: FSDP2Options) -> FSDP2Runtime:
    """The runtime of ``opts``' plan of ``model`` in ``groups``, its explicit prefetches set:
    what every driver of FSDP2's hooks (a trace, a stored trace, a pipeline stage) runs."""
    scales = float8_scales(model, groups, opts)
    runtime = FSDP2Runtime(groups, opts.parallel_dims, opts.offload, opts.torch, scales)
    runtime.set_prefetch(
        prefetch_indices(opts.forward_prefetch, groups, "forward_prefetch"),
        prefetch_indices(opts.backward_prefetch, groups, "backward_prefetch"),
    )
    return runtime


def emulations(
    model: nn.Module, groups: list[Group], opts: FSDP2Options, gpus_per_node: int | None
) -> tuple[FSDP2Emulation, TPEmulation | None]:
    """FSDP2's hooks on ``model`` and, under tensor parallelism, ``parallelize_module``'s,
    whose hooks run after FSDP2's pre-forward and before its post-forward, both reporting
    to the one runtime (``gpus_per_node``: the machine's, for DTensor's mm strategies)."""
    emulation = FSDP2Emulation(model, groups, opts)
    if opts.tp is None:
        return emulation, None
    return emulation, TPEmulation(
        model, opts.tp, groups, emulation.runtime, opts.job, gpus_per_node
    )


class FSDP2Emulation:
    """FSDP2's hooks on the copy (``model``), reporting to an :class:`FSDP2Runtime`."""

    def __init__(self, model: nn.Module, groups: list[Group], opts: FSDP2Options) -> None:
        self.groups = groups
        self.opts = opts
        self.rules = opts.torch
        self.runtime = fsdp2_runtime(model, groups, opts)
        self._handles: list[Any] = []
        self.view_outputs: dict[str, None] = {}
        self.reached: set[int] = set()  # ids of the parameters a gradient reached
        mp = opts.mp_policy
        if mp.param_dtype is not None:
            with torch.no_grad():
                for group in groups:
                    for p in group.params:
                        p.data = p.data.to(mp.param_dtype)
        for i, group in enumerate(groups):
            for m, module in enumerate(group.modules):
                self._handles.append(
                    module.register_forward_pre_hook(
                        functools.partial(self._pre_forward, i, m), prepend=True, with_kwargs=True
                    )
                )
                self._handles.append(
                    module.register_forward_hook(
                        functools.partial(self._post_forward, i, m),
                        always_call=len(group.modules) > 1,
                    )
                )

    def _cast_inputs(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        mp = self.opts.mp_policy
        if not (mp.cast_forward_inputs and mp.param_dtype):
            return args, kwargs
        cast = functools.partial(_cast, mp.param_dtype)
        return _apply_to_tensors(cast, args), _apply_to_tensors(cast, kwargs)

    def _pre_forward(
        self, i: int, member: int, module: nn.Module, args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        entering = self.runtime.pre_forward(i, member)
        if entering is None:  # FSDP2's pre-forward returned at once
            return args, kwargs
        args, kwargs = self._cast_inputs(args, kwargs)
        if entering and torch.is_grad_enabled():
            inputs = grad_tensors((args, kwargs), self.rules)
            if inputs:
                outputs = _PostBackward.apply(self, i, *inputs)  # type: ignore[no-untyped-call]
                args, kwargs = replace_grad_tensors((args, kwargs), outputs, self.rules)
        return args, kwargs

    def _post_forward(self, i: int, member: int, module: nn.Module, args: Any, output: Any) -> Any:
        completed = self.runtime.post_forward(i, torch._C._current_graph_task_id() != -1, member)
        for j in completed or ():
            output = self._register_pre_backward(j, output)
        # torch 2.13 casts every output (a grouped call's members, a recompute's); before,
        # only where the post-forward ran
        if completed is None and not self.rules.recompute_casts:
            return output
        return self._cast_output(output)

    def _cast_output(self, output: Any) -> Any:
        dtype = self.opts.mp_policy.output_dtype
        if dtype is None:
            return output
        return _apply_to_tensors(functools.partial(_cast, dtype), output)

    def _register_pre_backward(self, i: int, output: Any) -> Any:
        if not torch.is_grad_enabled():
            return output
        for t in grad_tensors(output, self.rules):
            if t._base is not None:
                self.view_outputs.setdefault(self.groups[i].name, None)
            t.register_hook(functools.partial(self._pre_backward, i))  # type: ignore[no-untyped-call]
        return output

    def _pre_backward(self, i: int, grad: torch.Tensor) -> None:
        if self.runtime.pre_backward(i):
            Variable._execution_engine.queue_callback(self._final_callback)

    def _has_grads(self, i: int) -> bool:
        params = self.groups[i].params
        self.reached.update(id(p) for p in params if p.grad is not None)
        found = any(p.grad is not None for p in params)
        for p in params:  # FSDP2 moves the unsharded gradient out when it reduces it
            p.grad = None
        return found

    def post_backward(self, i: int) -> None:
        self.runtime.post_backward(i, self._has_grads(i))

    def _final_callback(self) -> None:
        pending = {i: self._has_grads(i) for i in range(len(self.groups))}
        self.runtime.final_callback(pending)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
