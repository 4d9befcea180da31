"""The scalar amax all-reduces of torchao's tensorwise float8 casts under tensor parallelism.

[Note: float8 amax all-reduces]
A tensorwise cast (``hp_tensor_to_float8_dynamic`` -> ``tensor_to_scale``) takes the amax
of the whole tensor: ``torch.max(torch.abs(x))``. On a DTensor sharded over the tp ranks
that is a ``Partial("max")`` scalar, which ``amax_to_scale`` upcasts to float64 and DTensor
all-reduces over the tp group (``Partial._reduce_value``: ``funcol.all_reduce``) before the
scale is computed from it: one collective of 8 bytes (float64) a cast, latency-bound. A
replicated DTensor's amax is replicated already (no collective), as is a plain tensor's
(``reduce_amax=False``: the float8 linears never reduce it themselves). So, a cast each:

- a float8 style's cast of its input (``Float8ColwiseParallel``, ``Float8RowwiseParallel``,
  ``PrepareFloat8ModuleInput``), where the input is sharded when it is cast (before its
  all-gather); and ``NoopFwToFloat8BwDynamic``'s cast of a float8 linear style's output
  gradient in backward, where the output's layout is sharded;
- inside a float8 linear (``matmul_with_hp_or_float8_args``) with a tp style: forward, the
  input where it reaches the linear sharded (a row-wise linear's ``Shard(-1)``) and not
  float8 already, and the weight (sharded by the style) unless FSDP2 gathered it in float8;
  backward, in its order, the output gradient (sharded where the linear's output is:
  column-wise ``Shard(-1)``; a row-wise output's ``Partial`` comes back replicated) unless
  a float8 style cast it, the weight for the input's gradient, the output gradient again
  for the weight's, and the input as its forward saved it.

An activation checkpoint's recomputation runs the forward's casts again. Only the tensorwise
recipe reduces a scalar; a rowwise recipe's amaxes are vectors along the scaled dim and are
not planned here.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch
from torch import nn

from fsdpviz.plan.tensor_parallel import Layout, TPModule, TPPlan
from fsdpviz.trace.probe import CostProbe

__all__ = ["AMAX_BYTES", "AMAX_DTYPE", "Float8AmaxReduces", "Float8GradCast", "amax_reduced"]

AMAX_BYTES = 8  # one float64 scalar: amax_to_scale's upcast amax
AMAX_DTYPE = "float64"


class _Runtime(Protocol):
    def tensor_parallel(
        self, i: int, kind: str, module: str, phase: str, nbytes: int, dtype: str | None = None
    ) -> None: ...


def amax_reduced(layout: Layout | None) -> bool:
    """Whether a tensorwise cast of a DTensor in ``layout`` all-reduces its amax: a sharded
    one's amax is a partial max."""
    return layout is not None and layout[0] == "shard"


class Float8GradCast(torch.autograd.Function):
    """torchao's ``NoopFwToFloat8BwDynamic`` after a float8 linear style's output: identity
    forward; backward casts the gradient to float8 (on the probe, when one measures) after
    ``report`` (its amax's all-reduce, where the gradient is sharded)."""

    @staticmethod
    def forward(ctx: Any, probe: CostProbe | None, report: Any, t: torch.Tensor) -> torch.Tensor:
        ctx.probe, ctx.report = probe, report
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        if ctx.report is not None:
            ctx.report()
        probe = ctx.probe
        return None, None, probe.float8_cast(grad) if probe is not None else grad


class _LinearBackward(torch.autograd.Function):
    """Identity on a float8 linear's input (or, where the input needs no gradient, its
    output); its backward reports that linear's backward's amax all-reduces. On the input it
    runs just after the linear's backward, so after the recomputation an activation
    checkpoint runs when that backward unpacks what it saved, as the casts do."""

    @staticmethod
    def forward(ctx: Any, report: Any, t: torch.Tensor) -> torch.Tensor:
        ctx.report = report
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.report()
        return None, grad


def _needs_grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled()


class Float8AmaxReduces:
    """Hooks on the float8 linears a tp style distributes, reporting the amax all-reduces of
    their casts to ``runtime`` (see [Note: float8 amax all-reduces]). ``float8_inputs``: by
    module, whether the input its style gave it is float8 (filled by the tp emulation's
    pre-forward hook, which runs before this one's); ``gathered``: the ids of the weights
    FSDP2 all-gathers in float8."""

    def __init__(
        self,
        model: nn.Module,
        plan: TPPlan,
        linears: list[nn.Module],
        gathered: set[int],
        owner: Any,
        runtime: _Runtime,
        float8_inputs: dict[str, bool],
    ) -> None:
        self.runtime = runtime
        self._inputs = float8_inputs
        self._handles: list[Any] = []
        self._on_input: set[str] = set()  # the linears running whose input reports
        if plan.size == 1:
            return
        layouts = {id(p): layout for p, layout in plan.placements(model).items()}
        names = {id(m): fqn for fqn, m in model.named_modules()}
        for module in linears:
            fqn = names.get(id(module))
            tpm = plan.modules.get(fqn) if fqn is not None else None
            weight = getattr(module, "weight", None)
            if tpm is None or tpm.base not in ("ColwiseParallel", "RowwiseParallel"):
                continue
            sharded = amax_reduced(layouts.get(id(weight))) and id(weight) not in gathered
            hooks = functools.partial(self._forward, tpm, owner(tpm.fqn), sharded)
            self._handles.append(module.register_forward_pre_hook(hooks))
            wrap = functools.partial(self._output, tpm, owner(tpm.fqn), sharded)
            self._handles.append(module.register_forward_hook(wrap, prepend=True))

    def _report(self, i: int, fqn: str, phase: str, count: int) -> None:
        for _ in range(count):
            self.runtime.tensor_parallel(i, "tp_all_reduce", fqn, phase, AMAX_BYTES, AMAX_DTYPE)

    def _input_reduced(self, tpm: TPModule) -> bool:
        """Whether the linear casts its input and that cast reduces: the input arrives in the
        style's desired layout, sharded, and not float8 already."""
        layout = tpm.inputs[0].dst if tpm.inputs else None
        return amax_reduced(layout) and not self._inputs.get(tpm.fqn, tpm.float8)

    def _backward_count(self, tpm: TPModule, weight: bool) -> int:
        # the output gradient is sharded where the output is (column-wise), and float8
        # already where a float8 style cast it
        grad = tpm.base == "ColwiseParallel" and not tpm.float8
        return 2 * int(grad) + int(weight) + int(self._input_reduced(tpm))

    def _reporter(self, tpm: TPModule, i: int, weight: bool) -> Any:
        count = self._backward_count(tpm, weight)
        return lambda: self._report(i, tpm.fqn, "backward", count)

    def _forward(self, tpm: TPModule, i: int, weight: bool, module: nn.Module, args: Any) -> Any:
        self._report(i, tpm.fqn, "forward", int(self._input_reduced(tpm)) + int(weight))
        if not args or not _needs_grad(args[0]) or self._backward_count(tpm, weight) == 0:
            return None
        self._on_input.add(tpm.fqn)
        report = self._reporter(tpm, i, weight)
        return (_LinearBackward.apply(report, args[0]), *args[1:])  # type: ignore[no-untyped-call]

    def _output(
        self, tpm: TPModule, i: int, weight: bool, module: nn.Module, args: Any, out: Any
    ) -> Any:
        if tpm.fqn in self._on_input:
            self._on_input.discard(tpm.fqn)
            return out
        if not _needs_grad(out) or self._backward_count(tpm, weight) == 0:
            return out
        return _LinearBackward.apply(self._reporter(tpm, i, weight), out)  # type: ignore[no-untyped-call]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
