"""Roofline time of the GPU kernels the trace saw between two FSDP hook calls.

The trace profile lists, per stretch of compute, every kernel its operators launch
(:mod:`fsdpviz.schema.profile`, ``kernels``). Each takes the longer of its compute and
its memory traffic on a :class:`~fsdpviz.cost.hardware.Machine`::

    time = max(flops / achieved FLOP/s, bytes / (hbm_gbps * memory_efficiency))

- **matrix multiplies** (``gemm``): ``2 M N K`` FLOPs per batch entry at
  ``peak * compute_efficiency`` (one-byte operands: the float8 peak, times
  ``float8_matmul_share``; :meth:`~fsdpviz.cost.hardware.Machine.matmul_flops`), plus
  ``gemm_half_us`` (small matrices reach less of the peak: one that would take
  ``gemm_half_us`` reaches half), bytes of both operands and the result;
- **fused attention** (``attn``): the kernel's FLOPs (forward ``4 B H Sq Skv D``, backward
  2.5 times that, the flash backward recomputing the scores; the forward kernel that
  activation checkpointing runs again in backward is a forward one), a causal mask doing only the
  blocks on and below the diagonal, at ``peak * attention_efficiency`` (forward) or
  ``attention_backward_efficiency``, scaled by ``S / (S + attention_seq_half)`` and
  ``D / (D + 32)`` relative to ``D = 128`` (short sequences and small heads reach less);
  the memory-efficient kernel at ``efficient_attention_factor`` of that. Eager attention is
  its matrix multiplies and softmax, costed as such.
- **other operators with FLOPs** (convolutions) as a large matrix multiply;
- **memory-bound operators** (``mem``: element-wise, normalisation, softmax, casts,
  cross-entropy, copies): their bytes at ``hbm_gbps * memory_efficiency``, plus
  ``kernel_us`` per kernel.

Every kernel is also launched by the CPU: ``launch_forward_us`` each in forward (Python
modules and the dispatcher), ``launch_backward_us`` in backward (the autograd engine). A
GPU faster than the CPU that feeds it waits for it: the time model gives a stretch the
longer of its GPU time and its CPU time.

**torch.compile** (``compiled=True``): Inductor fuses each run of memory-bound operators
between two matrix multiplies or attention kernels (in the compiled modules, forward and
backward) into one kernel. The trace records those runs (``fused``: see
:mod:`fsdpviz.schema.profile`): a fused region reads each tensor it takes from outside once
and writes each tensor that outlives it once (what a later kernel reads, or autograd saves),
instead of every operator reading and writing its own; it costs those bytes at the memory
bandwidth plus one ``kernel_us``, and ``compiled_launch_us`` of CPU time to launch.
Matrix multiplies and attention keep their kernels and their time. Assumed: no
recomputation chosen by AOTAutograd's partitioner beyond activation checkpointing's, no
CUDA graphs, no matmul epilogue fusion (``max_autotune`` off).

Example::

    m = machine("h100")
    stretch_cost(report.profile.iterations[0].kernels[3], m).seconds
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fsdpviz.cost.hardware import Machine

# Bytes per element -> the dtype a kernel of that size computes in (the machine's rate).
_DTYPES = {1: "float8_e4m3fn", 2: "bfloat16", 4: "float32", 8: "float64"}
_CAUSAL_BLOCK = 128  # flash kernels skip the blocks above the diagonal in tiles of this


@dataclass(frozen=True)
class StretchCost:
    """GPU seconds, CPU seconds and counted FLOPs of one stretch of kernels."""

    gpu_s: float
    cpu_s: float
    kernels: int
    matmul_s: float  # of gpu_s: matrix multiplies and other FLOP-bound kernels
    attention_s: float  # of gpu_s: fused attention
    memory_s: float  # of gpu_s: memory-bound kernels

    @property
    def seconds(self) -> float:
        return max(self.gpu_s, self.cpu_s)


ZERO = StretchCost(0.0, 0.0, 0, 0.0, 0.0, 0.0)


def gemm_seconds(m: Machine, rows: int, cols: int, inner: int, batch: int, itemsize: int) -> float:
    """One ``(batch x) rows x inner @ inner x cols`` matrix multiply."""
    flops = 2.0 * rows * cols * inner * batch
    nbytes = float(rows * inner + inner * cols + rows * cols) * batch * itemsize
    return max(m.matmul_seconds(flops, _dtype(m, itemsize)), m.memory_seconds(nbytes))


def attention_seconds(
    m: Machine,
    kernel: str,
    backward: bool,
    shape: tuple[int, int, int, int, int],
    causal: bool,
    itemsize: int,
) -> float:
    """One fused attention kernel; ``shape`` is ``(B, H, Sq, Skv, D)``."""
    b, h, sq, skv, d = shape
    flops = 4.0 * b * h * sq * skv * d * (2.5 if backward else 1.0)
    if causal:
        flops *= min(1.0, 0.5 * (1.0 + _CAUSAL_BLOCK / max(skv, 1)))
    eff = m.attention_backward_efficiency if backward else m.attention_efficiency
    seq = max(sq, skv)
    eff *= seq / (seq + m.attention_seq_half) * (d / (d + 32.0)) / (128.0 / 160.0)
    if kernel == "efficient":
        eff *= m.efficient_attention_factor
    peak = m.peak_flops(_dtype(m, itemsize))
    nbytes = float((2 * b * h * sq * d + 2 * b * h * skv * d) * itemsize * (2 if backward else 1))
    return max(flops / (peak * min(eff, 1.0)), m.memory_seconds(nbytes))


_REMEMBERED: dict[tuple[Any, ...], StretchCost] = {}


def machine_key(m: Machine) -> tuple[Any, ...]:
    """A hashable stand-in for every number of ``m`` (a machine holds dictionaries)."""
    return tuple(
        (f.name, tuple(sorted(v.items())) if isinstance(v, dict) else v)
        for f in dataclasses.fields(m)
        for v in (getattr(m, f.name),)
    )


def remembered_stretch_cost(
    kernels: tuple[tuple[Any, ...], ...], m: Machine, key: tuple[Any, ...], compiled: bool
) -> StretchCost:
    """:func:`stretch_cost` of kernels held as tuples on ``m`` (``key``: its
    :func:`machine_key`), remembered: a profile's stretches are costed again on every
    replay of it (a re-plan that changes the world size, sharding or prefetch)."""
    at = (kernels, key, compiled)
    found = _REMEMBERED.get(at)
    if found is None:
        if len(_REMEMBERED) >= 8192:
            _REMEMBERED.clear()
        found = _REMEMBERED[at] = stretch_cost(kernels, m, compiled)
    return found


def stretch_cost(
    kernels: Sequence[Sequence[Any]], m: Machine, compiled: bool = False
) -> StretchCost:
    """The time of one stretch's kernels (a ``StepProfile.kernels`` entry) on ``m``, eager
    or (``compiled``) with its fused regions as ``torch.compile`` runs them."""
    if not kernels:
        return ZERO
    matmul = attention = memory = cpu = 0.0
    count = 0
    for k in kernels:
        kind = k[0]
        n, nbytes = int(k[-2]), float(k[-1])
        if kind == "fused":
            if compiled:  # these memory-bound kernels run as n fused ones
                eager_n, eager_bytes = int(k[2]), float(k[3])
                launch = m.launch_backward_us if k[1] else m.launch_forward_us
                memory += m.memory_seconds(nbytes) + n * m.kernel_us * 1e-6
                memory -= m.memory_seconds(eager_bytes) + eager_n * m.kernel_us * 1e-6
                cpu += n * m.compiled_launch_us - eager_n * launch
                count += n - eager_n
            continue
        count += n
        if kind == "gemm":
            matmul += n * gemm_seconds(m, k[2], k[3], k[4], k[5], k[6])
            cpu += n * (m.launch_backward_us if k[1] else m.launch_forward_us)
        elif kind == "attn":
            shape = (int(k[3]), int(k[4]), int(k[5]), int(k[6]), int(k[7]))
            grad = bool(k[10] if len(k) > 12 else k[2])  # the backward kernel, not the phase
            attention += n * attention_seconds(m, str(k[1]), grad, shape, bool(k[8]), k[9])
            cpu += n * (m.launch_backward_us if k[2] else m.launch_forward_us)
        elif kind == "flops":
            flops = float(k[2]) * n
            matmul += max(m.matmul_seconds(flops, "bfloat16", n), m.memory_seconds(nbytes))
            cpu += n * (m.launch_backward_us if k[1] else m.launch_forward_us)
        else:  # memory-bound
            memory += m.memory_seconds(nbytes) + n * m.kernel_us * 1e-6
            cpu += n * (m.launch_backward_us if k[1] else m.launch_forward_us)
    memory, cpu = max(memory, 0.0), max(cpu, 0.0)
    return StretchCost(matmul + attention + memory, cpu * 1e-6, count, matmul, attention, memory)


def _dtype(m: Machine, itemsize: int) -> str:
    return _DTYPES.get(int(itemsize), "float32")
