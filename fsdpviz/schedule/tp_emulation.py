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
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch import nn

from fsdpviz.plan.fsdp2 import Group
from fsdpviz.plan.tensor_parallel import (
    Layout,
    Redistribution,
    TPModule,
    TPPlan,
    backward_collective,
    collective,
)
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime


class _GradCollective(torch.autograd.Function):
    """Identity; its backward reports the gradient's collective."""

    @staticmethod
    def forward(ctx: Any, report: Any, t: torch.Tensor) -> torch.Tensor:
        ctx.report = report
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.report()
        return None, grad


def owner_index(fqn: str, groups: list[Group]) -> int:
    """The group whose ``fully_shard`` call manages module ``fqn``: the deepest one above it."""
    best, depth = 0, -1
    for i, g in enumerate(groups):
        for f in g.fqns:
            if (f == "" or fqn == f or fqn.startswith(f + ".")) and len(f) > depth:
                best, depth = i, len(f)
    return best


class TPEmulation:
    """The hooks of a :class:`TPPlan` on the traced copy, reporting to ``runtime``."""

    def __init__(
        self, model: nn.Module, plan: TPPlan, groups: list[Group], runtime: FSDP2Runtime
    ) -> None:
        self.runtime = runtime
        self._dtensors: dict[int, tuple[weakref.ref[torch.Tensor], Layout]] = {}
        self._handles: list[Any] = []
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

    # ----------------------------------------------------------------- DTensors
    def _layout(self, t: torch.Tensor) -> Layout | None:
        entry = self._dtensors.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1]

    def _remember(self, t: Any, layout: Layout | None) -> None:
        if isinstance(t, torch.Tensor) and layout is not None:
            self._dtensors[id(t)] = (weakref.ref(t), layout)

    # ------------------------------------------------------------------- hooks
    def _redistribute(
        self, t: Any, r: Redistribution, tpm: TPModule, i: int, known: Layout | None
    ) -> Any:
        """Report ``t``'s collective in forward; return it with its gradient's hooked."""
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        ndim = t.dim()
        nbytes = t.numel() * t.element_size()
        src = known or r.src
        forward = collective(src, r.dst, ndim)
        if forward is not None:
            self.runtime.tensor_parallel(i, forward, tpm.fqn, "forward", nbytes)
        # a plain tensor's gradient goes back to the layout it was declared in; a DTensor's,
        # only through the redistribution (if any)
        back = (
            backward_collective(r.grad, src, ndim) if known is None or forward is not None else None
        )
        if back is None or not (t.requires_grad and torch.is_grad_enabled()):
            return t

        def report() -> None:
            self.runtime.tensor_parallel(i, back, tpm.fqn, "backward", nbytes)

        return _GradCollective.apply(report, t)  # type: ignore[no-untyped-call]

    def _pre_forward(
        self, tpm: TPModule, i: int, module: nn.Module, args: Any, kwargs: Any
    ) -> tuple[Any, Any]:
        args, kwargs = list(args), dict(kwargs)
        for r in tpm.inputs:
            holder: Any = kwargs if isinstance(r.position, str) else args
            key = r.position
            if isinstance(key, str) and key not in holder:
                continue
            if isinstance(key, int) and key >= len(holder):
                continue
            t = holder[key]
            known = self._layout(t) if isinstance(t, torch.Tensor) else None
            out = self._redistribute(t, r, tpm, i, known)
            if tpm.style == "PrepareModuleInput":
                self._remember(out, r.dst)  # use_local_output=False: a DTensor goes in
            holder[key] = out
        return tuple(args), kwargs

    def _post_forward(
        self, tpm: TPModule, i: int, module: nn.Module, args: Any, output: Any
    ) -> Any:
        if tpm.outputs:
            r = tpm.outputs[0]
            if isinstance(output, torch.Tensor):
                output = self._redistribute(output, r, tpm, i, None)
            elif isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                output = (self._redistribute(output[0], r, tpm, i, None), *output[1:])
        if not tpm.local_output and isinstance(output, torch.Tensor):
            self._remember(output, tpm.output_layout)
        return output

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._dtensors.clear()
