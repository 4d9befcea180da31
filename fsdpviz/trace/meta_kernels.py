"""Meta kernels that accept and refuse what the devices' kernels accept and refuse.

Meta kernels compute shapes; where one is stricter or more lenient than the CPU and GPU
kernels, a meta trace would fail where a device runs, or run where a device fails. While
fsdpviz traces on the meta device, :func:`device_rules` registers, for such operators, a
meta kernel that checks what the CPU kernel checks (with its message) and then runs torch's
own meta kernel; the registrations are removed when the trace ends, however it ends.

- More lenient: ``mm``, ``addmm`` (so ``F.linear`` and ``matmul``), ``mv`` and
  ``convolution`` compute any mix of dtypes on meta. A parameter FSDP leaves in float32
  (ignored, or outside mixed precision) meeting bfloat16 activations fails on a device
  (``expected m1 and m2 to have the same dtype``); the meta trace now fails the same way,
  with the CPU kernel's message (``bmm`` too, whose meta kernel words it otherwise).
  ``baddbmm``, ``dot``, ``addmv`` and attention check dtypes on meta already.
- Stricter: ``torch._grouped_mm`` (the grouped GEMM of mixture-of-experts layers, e.g.
  Hugging Face's Mixtral experts) runs in float32 and float16 on the CPU and GPU, but its
  meta kernel accepts bfloat16 only: the replacement runs torch's meta kernel on bfloat16
  stand-ins (casts cost nothing on meta) and returns the result in the inputs' dtype.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

# How the CPU kernels name dtypes in their messages: C++ type names and ScalarType names.
_CPP = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
}
_SCALAR = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
}


def _cpp(dtype: torch.dtype) -> str:
    return _CPP.get(dtype, str(dtype).removeprefix("torch."))


def _scalar(dtype: torch.dtype) -> str:
    return _SCALAR.get(dtype, str(dtype).removeprefix("torch."))


def _same_m1_m2(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise RuntimeError(
            "expected m1 and m2 to have the same dtype, but got: "
            f"{_cpp(a.dtype)} != {_cpp(b.dtype)}"
        )


def _stand_in(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(torch.bfloat16)
    return x


def _grouped_mm(meta_kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def kernel(mat_a: torch.Tensor, mat_b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        _same_m1_m2(mat_a, mat_b)  # the CPU kernel runs mm per group
        out_dtype = kwargs.pop("out_dtype", None)
        out = meta_kernel(
            _stand_in(mat_a), _stand_in(mat_b), *[_stand_in(a) for a in args], **kwargs
        )
        return out.to(out_dtype or mat_a.dtype)

    return kernel


def _mm(meta_mm: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        _same_m1_m2(a, b)
        return meta_mm(a, b)

    return mm


def _addmm(meta_mm: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def addmm(
        self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
    ) -> torch.Tensor:
        for name, t in (("self", self), ("mat1", mat1)):
            if t.dtype != mat2.dtype:
                raise RuntimeError(
                    f"{name} and mat2 must have the same dtype, but got {_scalar(t.dtype)} and "
                    f"{_scalar(mat2.dtype)}"
                )
        out = meta_mm(mat1, mat2)
        shape = torch.broadcast_shapes(self.shape, out.shape)  # type: ignore[no-untyped-call]
        if shape != out.shape:
            raise RuntimeError(
                f"The expanded size of the tensor ({list(self.shape)}) must match the "
                f"existing size {list(out.shape)}"
            )
        return out

    return addmm


def _bmm(meta_bmm: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.dtype != b.dtype:  # (meta refuses it too, naming the dtypes otherwise)
            raise RuntimeError(
                f"expected scalar type {_scalar(a.dtype)} but found {_scalar(b.dtype)}"
            )
        return meta_bmm(a, b)

    return bmm


def _mv(self: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    if self.dtype != vec.dtype:
        raise RuntimeError(
            "addmv input tensors must have the same dtype, but got "
            f"{_scalar(vec.dtype)}, {_scalar(self.dtype)}, and {_scalar(vec.dtype)}"
        )
    if self.dim() != 2 or vec.dim() != 1 or self.shape[1] != vec.shape[0]:
        raise RuntimeError(
            f"size mismatch, got mat ({'x'.join(map(str, self.shape))}), vec ({vec.numel()})"
        )
    return self.new_empty((self.shape[0],))


def _convolution(meta_conv: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def convolution(input: torch.Tensor, weight: torch.Tensor, *args: Any) -> torch.Tensor:
        # (the bias's dtype is checked before this operator, on meta too)
        if weight.dtype != input.dtype:
            raise RuntimeError(
                f"expected scalar type {_scalar(input.dtype)} but found {_scalar(weight.dtype)}"
            )
        return meta_conv(input, weight, *args)

    return convolution


def _kernels() -> dict[str, Callable[..., torch.Tensor]]:
    """Operator name -> its meta kernel, for the operators this torch has."""
    from torch import _meta_registrations as meta

    found: dict[str, Callable[..., torch.Tensor]] = {}
    grouped = getattr(meta, "meta_grouped_mm", None)
    if grouped is not None and hasattr(torch.ops.aten, "_grouped_mm"):
        found["_grouped_mm"] = _grouped_mm(grouped)
    meta_mm = getattr(meta, "meta_mm", None)
    if meta_mm is not None:
        found["mm"] = _mm(meta_mm)
        found["addmm"] = _addmm(meta_mm)
    meta_bmm = getattr(meta, "meta_bmm", None)
    if meta_bmm is not None:
        found["bmm"] = _bmm(meta_bmm)
    found["mv"] = _mv
    meta_conv = getattr(meta, "meta_conv", None)
    if meta_conv is not None:
        found["convolution"] = _convolution(meta_conv)
    return found


@contextmanager
def device_rules() -> Iterator[None]:
    """Within the block, the operators of :func:`_kernels` check dtypes on meta as the CPU
    kernels do, and ``torch._grouped_mm`` accepts any floating dtype."""
    kernels = _kernels()
    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    # torch < 2.13 refuses a second Python kernel for a key unless allowed (2.8 added
    # allow_override; 2.6 and 2.7 check their record of Python kernels, which is put back)
    overridable = "allow_override" in inspect.signature(lib.impl).parameters
    registered: set[str] = getattr(torch.library, "_impls", set())
    taken = set()
    try:
        for name, kernel in kernels.items():
            if overridable:
                lib.impl(name, kernel, "Meta", allow_override=True)  # type: ignore[no-untyped-call]
                continue
            key = f"aten/{name}/Meta"
            if key in registered:
                registered.discard(key)
                taken.add(key)
            lib.impl(name, kernel, "Meta")  # type: ignore[no-untyped-call]
        yield
    finally:
        lib._destroy()  # type: ignore[no-untyped-call]
        registered.update(taken)
