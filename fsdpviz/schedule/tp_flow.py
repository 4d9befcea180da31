"""Which tensors of fsdpviz's traced copy are DTensors in torch, followed operator by
operator while a tensor-parallel step runs (:class:`DTensorFlow`, for
:class:`~fsdpviz.schedule.tp_emulation.TPEmulation`), and the arithmetic between a DTensor
and a plain tensor that DTensor's dispatch refuses, noted; the autograd functions that
reports tensor parallelism's gradient collectives (:class:`GradCollective`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from fsdpviz.plan.tensor_parallel import Layout, layout_name
from fsdpviz.schedule.tp_refusals import chunks
from fsdpviz.schema.report import FsdpWarning

Copy = Any  # Callable[[torch.Tensor], torch.Tensor] | None
Meet = Callable[[list[torch.Tensor], torch.Tensor], None]  # DTensors an operator met; its result
# a normalisation's input, its result, whether aten fuses it and where the DTensor came from:
# the result to go on with
Normalise = Callable[[torch.Tensor, torch.Tensor, bool, str], torch.Tensor]
# id -> a plain tensor a style returned (to_local()), its layout and the style, in words
Plain = dict[int, tuple[weakref.ref[torch.Tensor], tuple[Layout, str]]]

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
# normalisations over the last dims, each whether it is fused: F.layer_norm runs as
# aten.native_layer_norm (fused), F.rms_norm as arithmetic on the CPU (tp_implicit.normalised)
_NORMS = {
    nn.functional.layer_norm: True,
    torch.layer_norm: True,
    torch.rms_norm: False,
    nn.functional.rms_norm: False,
}
# what takes a plain tensor beside a DTensor: loss_parallel()'s handlers make a plain target
# (and weight) a DTensor (``_cast_to_dtensor``); the others read only its shape or dtype
_TAKE_PLAIN = {nn.functional.cross_entropy, nn.functional.nll_loss} | {
    getattr(torch.Tensor, name) for name in ("to", "type_as", "view_as", "expand_as", "reshape_as")
}


def aliased(t: torch.Tensor, table: dict[int, tuple[Any, Any]]) -> tuple[Any, Any] | None:
    """The entry of ``table`` (id -> (weak reference, what)) of ``t`` or of a tensor ``t``
    aliases."""
    entry = table.get(id(t))
    if entry is not None and entry[0]() is t:
        return entry
    # an alias: a view of the same base (a view's _base is the first tensor viewed)
    # with the same shape and strides, as an identity autograd function's output
    root = t._base if t._base is not None else t
    meta = (t.shape, t.stride(), t.storage_offset())
    for entry in table.values():
        held = entry[0]()
        if held is None or held is t:
            continue
        if (held._base if held._base is not None else held) is root and meta == (
            held.shape, held.stride(), held.storage_offset()
        ):  # fmt: skip
            return entry
    return None


class DTensorFlow(TorchFunctionMode):
    """Which tensors of the traced copy are DTensors in torch: those the plan leaves
    (``use_local_output=False``, ``PrepareModuleInput``) and every tensor an operator
    computes from one (an operator on a DTensor gives a DTensor), but the plain tensors a
    style returns (``to_local()``). It follows the operators themselves, so it knows them
    where no autograd graph is built: frozen parameters and inputs that need no gradient,
    ``torch.no_grad()`` inside forward. Kept weakly: nothing here keeps a tensor (or the
    tensors its autograd node saves) alive."""

    def __init__(
        self,
        params: set[int],
        meet: Callable[[list[torch.Tensor], torch.Tensor], None],
        plain: Plain | None = None,
        size: int = 1,
        normalise: Normalise | None = None,
    ) -> None:
        super().__init__()
        self._normalise = normalise  # told of a normalisation of a DTensor
        self._plain, self._size = plain if plain is not None else {}, size
        self.broadcast: dict[tuple[str, str], str] = {}  # the two styles -> the warning
        self._meet = meet  # told of the DTensors each arithmetic operator meets, and its result
        # tensor -> where the DTensor it is (or was computed from) came from, in words
        self.dtensors: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._params = params  # the ids of the parameters the plan makes DTensors
        self.mixed: dict[tuple[str, str], str] = {}  # (origin, operator) -> the warning

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self._plain and self._size > 1 and func in _ARITHMETIC:
            self._check_local(func, [t for t in args if isinstance(t, torch.Tensor)])
        if not self.dtensors:
            return func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        origin = next((self.dtensors[t] for t in tensors if t in self.dtensors), None)
        if origin is not None and func not in _TAKE_PLAIN:
            self._check_mixed(func, tensors, origin)
        out = func(*args, **(kwargs or {}))
        if (
            func in _NORMS
            and self._normalise is not None
            and origin is not None
            and args
            and torch.is_tensor(args[0])
            and isinstance(out, torch.Tensor)
        ):
            out = self._normalise(args[0], out, _NORMS[func], origin)
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

    def warnings(self) -> list[FsdpWarning]:
        """A warning for each DTensor met a plain tensor (:meth:`_check_mixed`), and each
        two plain tensors whose local parts broadcast (:meth:`_check_local`)."""
        return [FsdpWarning("tp_mixed_dtensor", text) for text in self.mixed.values()] + [
            FsdpWarning("tp_local_broadcast", text) for text in self.broadcast.values()
        ]

    def _local_shape(self, t: torch.Tensor, layout: Layout) -> tuple[int, ...]:
        d = None if layout[0] != "shard" else (layout[1] or 0) % max(1, t.dim())
        return tuple(chunks(n, self._size)[0] if k == d else n for k, n in enumerate(t.shape))

    def _check_local(self, func: Any, tensors: list[torch.Tensor]) -> None:
        """Note arithmetic between two plain tensors styles returned (``to_local()``) in
        other layouts whose local parts broadcast: a rank's part of a sequence-sharded
        tensor one position long (a sequence of ``tp`` positions) added to a replicated
        one. torch computes on the local tensors and broadcasts silently: each rank's
        result holds the whole sequence where the model meant a rank's part, and a later
        ``DTensor.from_local`` of it (``SequenceParallel``, a ``PrepareModuleInput``)
        makes a DTensor ``tp`` times the model's, whose collectives move ``tp`` times the
        bytes. The trace's tensors are whole, so fsdpviz plans the model as meant."""
        found = []
        for t in tensors:
            entry = aliased(t, self._plain)
            if entry is not None:
                found.append((t, *entry[1]))
        for (a, la, wa), (b, lb, wb) in itertools.combinations(found, 2):
            if la == lb or a.dim() != b.dim() or (wa, wb) in self.broadcast:
                continue
            sa, sb = self._local_shape(a, la), self._local_shape(b, lb)
            # a dim the local parts broadcast where the whole tensors do not
            parts = [(k, sa[k], sb[k]) for k in range(a.dim()) if a.shape[k] == b.shape[k]]
            dims = [k for k, x, y in parts if x != y and 1 in (x, y)]
            if not dims:
                continue
            k, name = dims[0], getattr(func, "__name__", str(func)).strip("_").lstrip("ri")
            self.broadcast[(wa, wb)] = (
                f"tensor parallelism: {name} meets the plain tensor {wa} returns (a rank's "
                f"part of a tensor in {layout_name(la)}: {tuple(sa)}) and the one {wb} "
                f"returns ({layout_name(lb)}: {tuple(sb)}). torch computes on the local "
                f"tensors and broadcasts dim {k} silently: each rank's result is "
                f"{tuple(max(x, y) for x, y in zip(sa, sb, strict=True))}, not its part "
                "of the sum the model means, so the job computes something other than "
                "intended, and a DTensor made of it later (DTensor.from_local: "
                "SequenceParallel, PrepareModuleInput) is larger than the model's, its "
                "collectives moving more bytes than fsdpviz plans (it plans the model as "
                "meant). Make both alike: use_local_output=False on both styles, or the "
                "same output layouts"
            )


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
