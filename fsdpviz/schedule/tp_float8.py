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

An activation checkpoint's recomputation runs the forward's casts again.

The rowwise recipes (``rowwise``, ``rowwise_with_gw_hp``) scale each cast along one dim
(``tensor_to_amax``'s ``torch.amax(torch.abs(x), dim=axiswise_dim, keepdim=True)``): the
amax is a vector, a partial max only where the tensor is sharded along the dim it reduces,
and then all-reduced as the scalar is (float64, 8 bytes an element). Forward: the input
along its last dim where it is sharded there (a row-wise linear's ``Shard(-1)``: one element
a row, ``numel / in_features``), and ``weight.t()`` along dim 0 where the weight is sharded
on its dim 1 (row-wise: ``out_features`` elements). Backward: the output gradient along its
last dim where the output is sharded there (column-wise: one a row), then ``weight.t()``
along its last dim where the weight is sharded on dim 0 (column-wise: ``in_features``;
``rowwise_with_gw_hp`` casts that weight tensorwise: a scalar where it is sharded at all);
the weight gradient's casts, along dim 0 (``rowwise``; ``rowwise_with_gw_hp`` keeps those
operands in high precision), reduce over rows no tp style shards.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from fsdpviz.plan.tensor_parallel import Layout, TPModule, TPPlan
from fsdpviz.schedule.tp_flow import GradCollective
from fsdpviz.trace.probe import CostProbe

__all__ = [
    "AMAX_BYTES",
    "AMAX_DTYPE",
    "Float8AmaxReduces",
    "Float8GradCast",
    "amax_reduced",
    "report_amax",
]

AMAX_BYTES = 8  # one float64 scalar: amax_to_scale's upcast amax
AMAX_DTYPE = "float64"


class _Runtime(Protocol):
    def tensor_parallel(
        self, i: int, kind: str, module: str, phase: str, nbytes: int, dtype: str | None = None
    ) -> None: ...


def report_amax(runtime: _Runtime, i: int, fqn: str, phase: str, nbytes: int = AMAX_BYTES) -> None:
    """One amax all-reduce (float64, ``nbytes``) over the tp ranks, of a cast in module
    ``fqn`` of unit ``i``."""
    runtime.tensor_parallel(i, "tp_all_reduce", fqn, phase, nbytes, AMAX_DTYPE)


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


def _needs_grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled()


@dataclass(frozen=True)
class _Linear:
    """A float8 linear a tp style distributes: its style, unit, and the bytes of the amax
    all-reduces of its weight's casts (forward; backward, for the input's gradient)."""

    tpm: TPModule
    unit: int
    weight: tuple[int, ...]
    weight_backward: tuple[int, ...]
    in_features: int


class Float8AmaxReduces:
    """Hooks on the float8 linears a tp style distributes, reporting the amax all-reduces of
    their casts to ``runtime`` (see [Note: float8 amax all-reduces]). ``float8_inputs``: by
    module, whether the input its style gave it is float8 (filled by the tp emulation's
    pre-forward hook, which runs before this one's); ``gathered``: the ids of the weights
    FSDP2 all-gathers in float8; ``recipe``: torchao's recipe (tensorwise or rowwise)."""

    def __init__(
        self,
        model: nn.Module,
        plan: TPPlan,
        linears: list[nn.Module],
        gathered: set[int],
        owner: Any,
        runtime: _Runtime,
        float8_inputs: dict[str, bool],
        recipe: str = "tensorwise",
    ) -> None:
        self.runtime = runtime
        self._inputs = float8_inputs
        self._recipe = recipe
        self._rowwise = recipe != "tensorwise"
        self._handles: list[Any] = []
        self._on_input: set[str] = set()  # the linears running whose input reports
        self._rows: dict[str, int] = {}  # the rows of each linear's latest input
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
            layout = layouts.get(id(weight)) if id(weight) not in gathered else None
            linear = self._linear(tpm, owner(tpm.fqn), layout, module)
            hooks = functools.partial(self._forward, linear)
            self._handles.append(module.register_forward_pre_hook(hooks))
            wrap = functools.partial(self._output, linear)
            self._handles.append(module.register_forward_hook(wrap, prepend=True))

    def _linear(self, tpm: TPModule, unit: int, layout: Layout | None, m: nn.Module) -> _Linear:
        """The weight's casts: tensorwise, a scalar each where it is sharded; rowwise, along
        dim 0 of ``weight.t()`` in forward, along its last dim in backward."""
        n_in, n_out = int(getattr(m, "in_features", 0)), int(getattr(m, "out_features", 0))
        if not amax_reduced(layout):
            return _Linear(tpm, unit, (), (), n_in)
        if not self._rowwise:
            return _Linear(tpm, unit, (AMAX_BYTES,), (AMAX_BYTES,), n_in)
        assert layout is not None
        on_in = (layout[1] or 0) % 2 == 1  # the weight (out, in) sharded on its in features
        forward = (AMAX_BYTES * n_out,) if on_in else ()
        backward = () if on_in else (AMAX_BYTES * n_in,)
        if self._recipe == "rowwise_with_gw_hp":  # the input's gradient's weight: tensorwise
            backward = (AMAX_BYTES,)
        return _Linear(tpm, unit, forward, backward, n_in)

    def _report(self, i: int, fqn: str, phase: str, sizes: list[int] | tuple[int, ...]) -> None:
        for nbytes in sizes:
            report_amax(self.runtime, i, fqn, phase, nbytes)

    def _input_reduced(self, tpm: TPModule) -> bool:
        """Whether the linear casts its input and that cast reduces: the input arrives in the
        style's desired layout, sharded (rowwise: on its last dim), and not float8 already."""
        layout = tpm.inputs[0].dst if tpm.inputs else None
        if self._rowwise and layout is not None and layout[1] != -1:
            return False  # (torch's styles shard a linear's input on -1 only)
        return amax_reduced(layout) and not self._inputs.get(tpm.fqn, tpm.float8)

    def _backward_sizes(self, lin: _Linear, rows: int) -> list[int]:
        # the output gradient is sharded where the output is (column-wise), and float8
        # already where a float8 style cast it
        tpm = lin.tpm
        grad = tpm.base == "ColwiseParallel" and not tpm.float8
        if self._rowwise:
            return [AMAX_BYTES * rows] * int(grad) + list(lin.weight_backward)
        tail = [AMAX_BYTES] * (int(grad) + int(self._input_reduced(tpm)))
        return [AMAX_BYTES] * int(grad) + list(lin.weight_backward) + tail

    def _reporter(self, lin: _Linear, rows: int) -> Any:
        sizes = self._backward_sizes(lin, rows)
        return lambda: self._report(lin.unit, lin.tpm.fqn, "backward", sizes)

    def _forward(self, lin: _Linear, module: nn.Module, args: Any) -> Any:
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        rows = x.numel() // max(x.shape[-1], 1) if x is not None and x.dim() > 0 else 1
        first = [AMAX_BYTES * (rows if self._rowwise else 1)] * int(self._input_reduced(lin.tpm))
        self._report(lin.unit, lin.tpm.fqn, "forward", first + list(lin.weight))
        self._rows[lin.tpm.fqn] = rows
        if not args or not _needs_grad(args[0]) or not self._backward_sizes(lin, rows):
            return None
        self._on_input.add(lin.tpm.fqn)
        report = self._reporter(lin, rows)
        # identity on the input: its backward runs just after the linear's, so after the
        # recomputation an activation checkpoint runs when that backward unpacks its saves
        reported = GradCollective.apply(report, None, None, args[0])  # type: ignore[no-untyped-call]
        return (reported, *args[1:])

    def _output(self, lin: _Linear, module: nn.Module, args: Any, out: Any) -> Any:
        fqn = lin.tpm.fqn
        if fqn in self._on_input:
            self._on_input.discard(fqn)
            return out
        rows = self._rows.get(fqn, 1)
        if not _needs_grad(out) or not self._backward_sizes(lin, rows):
            return out
        return GradCollective.apply(self._reporter(lin, rows), None, None, out)  # type: ignore[no-untyped-call]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
