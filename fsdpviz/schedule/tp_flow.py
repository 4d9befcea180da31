"""Which tensors of fsdpviz's traced copy are DTensors in torch, followed operator by
operator while a tensor-parallel step runs (:class:`DTensorFlow`, for
:class:`~fsdpviz.schedule.tp_emulation.TPEmulation`), and the arithmetic between a DTensor
and a plain tensor that DTensor's dispatch refuses, noted; the autograd functions that
reports tensor parallelism's gradient collectives (:class:`GradCollective`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

Copy = Any  # Callable[[torch.Tensor], torch.Tensor] | None
Meet = Callable[[list[torch.Tensor], torch.Tensor], None]  # DTensors an operator met; its result

# arithmetic that meets two tensors, as a model's residual adds and scales do
_ARITHMETIC = {
    getattr(owner, name)
    for owner in (torch, torch.Tensor)
    for name in ("add", "sub", "mul", "div", "matmul", "add_", "sub_", "mul_", "div_")
    if hasattr(owner, name)
} | {
    getattr(torch.Tensor, f"__{op}__")
    for op in ("add", "radd", "iadd", "sub", "rsub", "isub", "mul", "rmul", "imul",
               "truediv", "rtruediv", "itruediv", "matmul", "rmatmul")
}  # fmt: skip
# what takes a plain tensor beside a DTensor: loss_parallel()'s handlers make a plain target
# (and weight) a DTensor (``_cast_to_dtensor``); the others read only its shape or dtype
_TAKE_PLAIN = {nn.functional.cross_entropy, nn.functional.nll_loss} | {
    getattr(torch.Tensor, name) for name in ("to", "type_as", "view_as", "expand_as", "reshape_as")
}


class DTensorFlow(TorchFunctionMode):
    """Which tensors of the traced copy are DTensors in torch: those the plan leaves
    (``use_local_output=False``, ``PrepareModuleInput``) and every tensor an operator
    computes from one (an operator on a DTensor gives a DTensor), but the plain tensors a
    style returns (``to_local()``). It follows the operators themselves, so it knows them
    where no autograd graph is built: frozen parameters and inputs that need no gradient,
    ``torch.no_grad()`` inside forward. Kept weakly: nothing here keeps a tensor (or the
    tensors its autograd node saves) alive."""

    def __init__(
        self, params: set[int], meet: Callable[[list[torch.Tensor], torch.Tensor], None]
    ) -> None:
        super().__init__()
        self._meet = meet  # told of the DTensors each arithmetic operator meets, and its result
        # tensor -> where the DTensor it is (or was computed from) came from, in words
        self.dtensors: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._params = params  # the ids of the parameters the plan makes DTensors
        self.mixed: dict[tuple[str, str], str] = {}  # (origin, operator) -> the warning

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.dtensors:
            return func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        origin = next((self.dtensors[t] for t in tensors if t in self.dtensors), None)
        if origin is not None and func not in _TAKE_PLAIN:
            self._check_mixed(func, tensors, origin)
        out = func(*args, **(kwargs or {}))
        if origin is not None:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.dtensors[t] = origin
            operands = [t for t in tensors if t is not out and t.numel() > 1]
            if (
                func in _ARITHMETIC
                and isinstance(out, torch.Tensor)
                and operands
                and all(t in self.dtensors for t in operands)
            ):  # DTensors alone (a plain tensor among them: _check_mixed's)
                self._meet(operands, out)
        return out

    def _check_mixed(self, func: Any, tensors: list[torch.Tensor], origin: str) -> None:
        """Note an operator that takes a DTensor and a plain tensor of more than one element
        (one the plan does not make a DTensor), which DTensor's dispatch refuses in every
        aten operator (``OpDispatcher.unwrap_to_op_info``: "got mixed torch.Tensor and
        DTensor"; a plain tensor of one element it takes as replicated): arithmetic, and a
        function as ``scaled_dot_product_attention`` whose operators do (but what
        ``_TAKE_PLAIN`` names). A warning, not an error, as the
        model may make the plain one a DTensor where fsdpviz does not see it (KempnerForge's
        forward hooks call ``DTensor.from_local`` on the blocks' outputs)."""
        for t in tensors:
            if t in self.dtensors or t.numel() <= 1 or id(t) in self._params:
                continue
            name = getattr(func, "__name__", str(func)).split(".")[0].strip("_")  # no overload
            if name[:1] in ("r", "i") and name[1:] in ("add", "sub", "mul", "truediv", "matmul"):
                name = name[1:]  # __radd__, __iadd__: aten.add
            name = {"truediv": "div"}.get(name, name)
            what = "a parameter outside the plan" if isinstance(t, nn.Parameter) else (
                "a plain tensor (a style's use_local_output=True, or one made outside the plan)"
            )  # fmt: skip
            self.mixed.setdefault(
                (origin, name),
                f"tensor parallelism: {name} takes a DTensor ({origin}) of shape "
                f"{tuple(next(x for x in tensors if x in self.dtensors).shape)} and {what} of "
                f"shape {tuple(t.shape)}, which torch refuses (RuntimeError: aten."
                f"{name if func in _ARITHMETIC else '<its operator>'} got "
                "mixed torch.Tensor and DTensor) unless the model makes the plain one a "
                "DTensor itself (DTensor.from_local in a forward hook). Make both the same: "
                "use_local_output alike on the styles whose outputs meet, or the plain one a "
                "DTensor (DTensor.from_local, or PrepareModuleInput on the module that takes it)",
            )
            return


class GradCollective(torch.autograd.Function):
    """Identity (or the collective's new buffer, ``copy``); its backward reports the
    gradient's collective (and makes its buffer, ``back_copy``)."""

    @staticmethod
    def forward(
        ctx: Any, report: Any, copy: Copy, back_copy: Copy, t: torch.Tensor
    ) -> torch.Tensor:
        ctx.report, ctx.back_copy = report, back_copy
        return copy(t) if copy is not None else t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ctx.report()
        return None, None, None, ctx.back_copy(grad) if ctx.back_copy is not None else grad
