"""Meta kernels that accept and refuse what the devices' kernels accept and refuse.

Meta kernels compute shapes; where one is stricter or more lenient than the CPU and GPU
kernels, a meta trace would fail where a device runs, or run where a device fails. While
fsdpviz traces on the meta device, :func:`device_rules` registers, for such operators, a
meta kernel that checks what the devices' kernels check and then runs torch's own meta
kernel; the registrations are removed when the trace ends, however it ends.

- More lenient: ``mm``, ``addmm`` (so ``F.linear`` and ``matmul``), ``bmm``, ``mv`` and
  ``convolution`` compute any mix of dtypes on meta. A parameter FSDP leaves in float32
  (ignored, or outside mixed precision) meeting bfloat16 activations fails on a device; the
  meta trace now fails too, with :class:`DtypeMismatch`, which says it in fsdpviz's words
  (the devices' own messages differ by kernel library: the CPU's oneDNN convolution words
  it unlike its reference kernel, and both unlike CUDA's).
  ``baddbmm``, ``dot``, ``addmv`` and attention check dtypes on meta already.
  The convolutions' own front ends (``F.conv1d``, ``F.conv2d``, ``F.conv3d``) check the
  bias's dtype before any kernel runs, on every device, in their own words: their
  replacement (for meta tensors, under autograd) checks every operand first, so that a
  convolution's mismatch is said one way whichever operand differs.
- Stricter: ``torch._grouped_mm`` (the grouped GEMM of mixture-of-experts layers, e.g.
  Hugging Face's Mixtral experts) runs in float32 and float16 on the CPU and GPU, but its
  meta kernel accepts bfloat16 only: the replacement runs torch's meta kernel on bfloat16
  stand-ins (casts cost nothing on meta) and returns the result in the inputs' dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import _meta_registrations as meta


def dtype_name(dtype: torch.dtype) -> str:
    """``bfloat16`` for ``torch.bfloat16``."""
    return str(dtype).removeprefix("torch.")


class DtypeMismatch(RuntimeError):
    """An operator met tensors of two dtypes, which the devices' kernels refuse.

    Attributes:
        operator: what ran, in words (``"a convolution (conv2d)"``).
        operands: each tensor's role in the operator (``"input"``, ``"weight"``) and the
            tensor itself (a meta tensor: the trace names the parameter it is).
    """

    def __init__(self, operator: str, operands: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.operator = operator
        self.operands = tuple(operands)
        said = ", ".join(f"{role} {dtype_name(t.dtype)}" for role, t in self.operands)
        super().__init__(
            f"{operator} met tensors of two dtypes ({said}); the devices' kernels (CPU and "
            "GPU alike) refuse mismatched dtypes, so the real forward fails here too"
        )

    @property
    def dtypes(self) -> list[torch.dtype]:
        """The dtypes met, each once, in the operands' order."""
        return list(dict.fromkeys(t.dtype for _, t in self.operands))


def _same_dtype(operator: str, *operands: tuple[str, torch.Tensor]) -> None:
    if len({t.dtype for _, t in operands}) > 1:
        raise DtypeMismatch(operator, operands)


def _stand_in(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(torch.bfloat16)
    return x


def _grouped_mm(meta_kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def kernel(mat_a: torch.Tensor, mat_b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        # (the CPU kernel runs mm per group)
        _same_dtype("a grouped matrix multiply (_grouped_mm)", ("mat_a", mat_a), ("mat_b", mat_b))
        out_dtype = kwargs.pop("out_dtype", None)
        out = meta_kernel(
            _stand_in(mat_a), _stand_in(mat_b), *[_stand_in(a) for a in args], **kwargs
        )
        return out.to(out_dtype or mat_a.dtype)

    return kernel


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _same_dtype("a matrix multiply (mm)", ("mat1", a), ("mat2", b))
    return meta.meta_mm(a, b)  # type: ignore[no-any-return]


def _addmm(
    self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    _same_dtype(
        "a matrix multiply with bias (addmm)", ("mat1", mat1), ("mat2", mat2), ("bias", self)
    )
    out: torch.Tensor = meta.meta_mm(mat1, mat2)
    shape = torch.broadcast_shapes(self.shape, out.shape)  # type: ignore[no-untyped-call]
    if shape != out.shape:
        raise RuntimeError(
            f"The expanded size of the tensor ({list(self.shape)}) must match the "
            f"existing size {list(out.shape)}"
        )
    return out


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _same_dtype("a batched matrix multiply (bmm)", ("batch1", a), ("batch2", b))
    return meta.meta_bmm(a, b)  # type: ignore[no-any-return]


def _mv(self: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    _same_dtype("a matrix-vector multiply (mv)", ("matrix", self), ("vector", vec))
    if self.dim() != 2 or vec.dim() != 1 or self.shape[1] != vec.shape[0]:
        raise RuntimeError(
            f"size mismatch, got mat ({'x'.join(map(str, self.shape))}), vec ({vec.numel()})"
        )
    return self.new_empty((self.shape[0],))


def _convolution(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *args: Any
) -> torch.Tensor:
    given = [("input", input), ("weight", weight)]
    if bias is not None:
        given.append(("bias", bias))
    _same_dtype("a convolution", *given)
    return meta.meta_conv(input, weight, bias, *args)  # type: ignore[no-any-return]


def _kernels() -> dict[str, Callable[..., torch.Tensor]]:
    """Operator name -> its meta kernel, for the operators this torch has."""
    found: dict[str, Callable[..., torch.Tensor]] = {
        "mm": _mm,
        "addmm": _addmm,
        "bmm": _bmm,
        "mv": _mv,
        "convolution": _convolution,
    }
    grouped = getattr(meta, "meta_grouped_mm", None)  # (torch 2.8 has none)
    if grouped is not None:
        found["_grouped_mm"] = _grouped_mm(grouped)
    return found


def _front_end(op: Any) -> Callable[..., torch.Tensor]:
    """``F.conv2d`` (and its kin) for meta tensors under autograd: the dtype check, then
    torch's own front end (which checks the bias before any kernel, in its own words)."""
    name = op._schema.name.removeprefix("aten::")

    def conv(
        input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *args: Any
    ) -> torch.Tensor:
        given = [("input", input), ("weight", weight)]
        if bias is not None:
            given.append(("bias", bias))
        _same_dtype(f"a convolution ({name})", *given)
        return op.decompose(input, weight, bias, *args)  # type: ignore[no-any-return]

    return conv


def _front_ends() -> dict[str, Callable[..., torch.Tensor]]:
    """Operator (``conv2d.padding``) -> its checked front end, for those this torch has."""
    found: dict[str, Callable[..., torch.Tensor]] = {}
    for name in ("conv1d", "conv2d", "conv3d"):
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            key = name if overload == "default" else f"{name}.{overload}"
            found[key] = _front_end(getattr(packet, overload))
    return found


@contextmanager
def device_rules() -> Iterator[None]:
    """Within the block, the operators of :func:`_kernels` (and the convolutions' front ends)
    refuse mismatched dtypes on meta as the devices' kernels do, with :class:`DtypeMismatch`,
    and ``torch._grouped_mm`` accepts any floating dtype."""
    kernels = _kernels()
    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    try:
        for name, kernel in kernels.items():
            # torch < 2.13 refuses a second Python kernel for a key unless allowed
            lib.impl(name, kernel, "Meta", allow_override=True)  # type: ignore[no-untyped-call]
        for name, kernel in _front_ends().items():
            lib.impl(name, kernel, "AutogradMeta")  # type: ignore[no-untyped-call]
        yield
    finally:
        lib._destroy()  # type: ignore[no-untyped-call]
