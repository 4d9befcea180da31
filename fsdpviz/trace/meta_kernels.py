"""Shape-only meta kernels for operators whose meta kernel rejects dtypes the devices accept.

``torch._grouped_mm`` (the grouped GEMM of mixture-of-experts layers, e.g. Hugging Face's
Mixtral experts) runs in float32 and float16 on the CPU and GPU, but its meta kernel accepts
bfloat16 only, so an fp32 MoE model cannot be traced on the meta device. While fsdpviz traces,
:func:`shape_only_kernels` registers, for each such operator, a meta kernel that runs torch's
own meta kernel on bfloat16 stand-ins (casts cost nothing on meta) and returns the result in
the inputs' dtype; the registrations are removed when the trace ends, however it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _stand_in(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(torch.bfloat16)
    return x


def _shape_only(meta_kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def kernel(mat_a: torch.Tensor, mat_b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out_dtype = kwargs.pop("out_dtype", None)
        out = meta_kernel(
            _stand_in(mat_a), _stand_in(mat_b), *[_stand_in(a) for a in args], **kwargs
        )
        return out.to(out_dtype or mat_a.dtype)

    return kernel


def _kernels() -> dict[str, Callable[..., torch.Tensor]]:
    """Operator name -> its shape-only meta kernel, for the operators this torch has."""
    from torch import _meta_registrations

    found: dict[str, Callable[..., torch.Tensor]] = {}
    grouped = getattr(_meta_registrations, "meta_grouped_mm", None)
    if grouped is not None and hasattr(torch.ops.aten, "_grouped_mm"):
        found["_grouped_mm"] = _shape_only(grouped)
    return found


@contextmanager
def shape_only_kernels() -> Iterator[None]:
    """Within the block, the operators of :func:`_kernels` accept any floating dtype on meta."""
    kernels = _kernels()
    if not kernels:
        yield
        return
    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    try:
        for name, kernel in kernels.items():
            lib.impl(name, kernel, "Meta")  # type: ignore[no-untyped-call]
        yield
    finally:
        lib._destroy()  # type: ignore[no-untyped-call]
