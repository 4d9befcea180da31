"""One float8 linear at a time: published H100 kernel and linear timings against the model.

The end-to-end float8 rows of ``bench_published.py`` mix every kernel of a step; this script
isolates one ``nn.Linear`` (forward and backward, as the sources ran it) and prints the
published time or speed-up next to what fsdpviz gives for the same linear on the matching GPU
preset. The modelled side is fsdpviz's own path: the linear is traced by ``fsdpviz.analyze``
(one rank, ``fully_shard`` on the module, ``compile`` and ``float8`` as published) and timed by
its timeline (``compute_s``: the stretches' kernels, no optimizer step); the GEMM-only rows
time the forward matrix multiply record that trace produces with
``fsdpviz.cost.kernels.gemm_seconds``. The traced step also sums the output (the loss) and
writes its gradient, as ``bench_linear_float8.py`` does; torchao's roofline script instead
feeds a given gradient (one fewer memory-bound pass over the output).

Sources (all H100; "H100 500 W" and torchao's roofline, whose specs name "Meta's H100
variant" at 2.4 TB/s, are the ``h100-hbm2e`` preset, an unspecified H100 the ``h100`` one):

- GEMM only, bf16 against float8 (one ``torch._scaled_mm``):
  FBGEMM PR #2546 (April 2024, "H100 500W", its CUTLASS rowwise GEMM without the casts:
  "fp8 row gemm only"); float8_experimental PR #38 (August 2023, cuBLAS tensorwise, the
  forward GEMM of Llama 2 70B's single-GPU shapes).
- Linear forward + backward with ``torch.compile``, bf16 against float8 rowwise:
  torchao PR #2185 (May 2025, ``benchmarks/float8/bench_linear_float8.py``: compiled
  ``linear(x).sum().backward()``, ``x`` requiring its gradient; "tensorwise w/ rescale", the
  rowwise recipe as torchao runs it, with ``use_fast_accum=True``).
- LayerNorm -> Linear -> Sigmoid forward + backward with ``torch.compile``, float8 rowwise
  speed-up over bf16: torchao's README table (``docs/static/fp8-rowwise-perf.png``, added in
  ``fdddb2cf``, June 2025, PyTorch 2.8.0a0+git48807d5, ``benchmarks/float8/float8_roofline.py``
  ``b_fp8_e2e_spdp``, GPU kernel time from the profiler), read from the image at the shapes
  nearest the published runs' per-rank linears; float8 tensorwise: the README's two worked
  examples (``e2dad4a6``, September 2024).

Run: ``python benchmarks/bench_float8_linears.py`` (about a minute on one CPU core).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

import fsdpviz
from fsdpviz.cost import machine
from fsdpviz.cost.kernels import gemm_seconds


class LinearOnly(nn.Module):
    """``bench_linear_float8.py``'s module: one bias-free linear whose input needs its
    gradient (three matrix multiplies)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.requires_grad_(True))


class LNLinearSigmoid(nn.Module):
    """``float8_roofline.py``'s module (LayerNorm without affine, linear, sigmoid)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(k, elementwise_affine=False, dtype=torch.bfloat16)
        self.fc = nn.Linear(k, n, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc(self.ln(x.requires_grad_(True))))


def traced(
    module: type[nn.Module], shape: tuple[int, int, int], recipe: str | None, gpu: str
) -> fsdpviz.Report:
    """fsdpviz's report of one step of ``module`` at forward ``M, K, N`` (bf16 when
    ``recipe`` is None), compiled."""
    m, k, n = shape
    kwargs: dict[str, object] = {
        "world_size": 1, "fully_shard": [module], "progress": False, "machine": gpu,
        "compile": True,
    }  # fmt: skip
    if recipe is not None:
        kwargs["float8"] = {"recipe_name": recipe}
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    return fsdpviz.analyze(module(k, n).to("meta"), x, **kwargs)  # type: ignore[arg-type]


def linear_seconds(
    module: type[nn.Module], shape: tuple[int, int, int], recipe: str | None, gpu: str
) -> float:
    """The modelled GPU time of one compiled forward + backward of the module."""
    return float(traced(module, shape, recipe, gpu).timeline.totals["compute_s"])


def forward_gemm_seconds(shape: tuple[int, int, int], recipe: str | None, gpu: str) -> float:
    """The modelled time of the forward matrix multiply record the trace makes."""
    report = traced(LinearOnly, shape, recipe, gpu)
    m = machine(gpu)
    for ks in report.profile.iterations[-1].kernels:  # type: ignore[union-attr]
        for k in ks:
            if k[0] == "gemm" and k[1] == 0:
                return gemm_seconds(m, k[2], k[3], k[4], k[5], k[6])
    raise AssertionError("no forward matrix multiply traced")


@dataclass(frozen=True)
class GemmRow:
    source: str
    gpu: str
    recipe: str
    shape: tuple[int, int, int]  # forward M, K, N
    bf16_ms: float
    fp8_ms: float


GEMMS = [
    GemmRow("FBGEMM #2546 row gemm", "h100-hbm2e", "rowwise", (8192, 8192, 8192), 1.879, 0.977),
    GemmRow("FBGEMM #2546 row gemm", "h100-hbm2e", "rowwise", (65536, 8192, 7168), 13.383, 7.108),
    GemmRow("FBGEMM #2546 row gemm", "h100-hbm2e", "rowwise", (65536, 3584, 8192), 7.044, 3.372),
    GemmRow("float8_exp. #38 fwd", "h100", "tensorwise", (16384, 8192, 1280), 0.604, 0.243),
    GemmRow("float8_exp. #38 fwd", "h100", "tensorwise", (16384, 1024, 8192), 0.500, 0.251),
    GemmRow("float8_exp. #38 fwd", "h100", "tensorwise", (16384, 8192, 7168), 3.57, 1.39),
    GemmRow("float8_exp. #38 fwd", "h100", "tensorwise", (16384, 3584, 8192), 1.59, 0.745),
]

LINEARS = [  # torchao #2185, rowwise, compiled, fwd + bwd of linear(x).sum()
    GemmRow("ao #2185 attn.wqkv", "h100", "rowwise", (16384, 8192, 1280), 1.954, 1.757),
    GemmRow("ao #2185 attn.w0", "h100", "rowwise", (16384, 1024, 8192), 1.701, 1.193),
    GemmRow("ao #2185 ffn.w13", "h100", "rowwise", (16384, 8192, 7168), 9.871, 5.707),
    GemmRow("ao #2185 ffn.w2", "h100", "rowwise", (16384, 3584, 8192), 5.192, 3.034),
]

# LNLinearSigmoid speed-ups (float8 over bf16) read from torchao's README tables
LN_LINEAR_SIGMOID = [
    ("rowwise", (8192, 4096, 1024), 0.52),
    ("rowwise", (8192, 4096, 4096), 1.00),
    ("rowwise", (8192, 4096, 16384), 1.17),
    ("rowwise", (8192, 16384, 4096), 1.03),
    ("rowwise", (16384, 4096, 1024), 0.57),
    ("rowwise", (16384, 1024, 4096), 0.73),
    ("rowwise", (16384, 8192, 8192), 1.33),
    ("rowwise", (32768, 4096, 1024), 0.59),
    ("rowwise", (32768, 4096, 2048), 0.81),
    ("rowwise", (32768, 1024, 4096), 0.77),
    ("rowwise", (32768, 2048, 4096), 0.91),
    ("rowwise", (32768, 8192, 1024), 0.63),
    ("rowwise", (32768, 8192, 4096), 1.11),
    ("rowwise", (32768, 1024, 8192), 0.87),
    ("rowwise", (32768, 4096, 8192), 1.28),
    ("rowwise", (32768, 32768, 32768), 1.52),
    ("tensorwise", (1024, 2048, 1024), 0.80),
    ("tensorwise", (4096, 8192, 16384), 1.39),
]


HEADER = (
    f"{'source':24} {'gpu':11} {'recipe':10} {'M, K, N':20} {'pub bf16':>9} {'pub fp8':>8} "
    f"{'pub x':>6}  {'mod bf16':>9} {'mod fp8':>8} {'mod x':>6} {'mod/pub x':>9}"
)


def row_line(r: GemmRow, bf16_ms: float, fp8_ms: float) -> str:
    """One printed row: published and modelled times (ms) and speed-ups (bf16 / float8)."""
    pub, mod = r.bf16_ms / r.fp8_ms, bf16_ms / fp8_ms
    return (
        f"{r.source:24} {r.gpu:11} {r.recipe:10} {r.shape!s:20} {r.bf16_ms:9.3f} "
        f"{r.fp8_ms:8.3f} {pub:6.2f}  {bf16_ms:9.3f} {fp8_ms:8.3f} {mod:6.2f} {mod / pub:9.2f}"
    )


def main() -> None:
    start = time.perf_counter()
    print("GEMM only (one forward matrix multiply), ms; speed-up x = bf16 / float8")
    print(HEADER)
    for r in GEMMS:
        b = forward_gemm_seconds(r.shape, None, r.gpu) * 1e3
        print(row_line(r, b, forward_gemm_seconds(r.shape, r.recipe, r.gpu) * 1e3))
    print()
    print("linear fwd + bwd, compiled (bench_linear_float8.py), ms; speed-up x = bf16 / float8")
    print(HEADER)
    for r in LINEARS:
        b = linear_seconds(LinearOnly, r.shape, None, r.gpu) * 1e3
        print(row_line(r, b, linear_seconds(LinearOnly, r.shape, r.recipe, r.gpu) * 1e3))
    print()
    print("LayerNorm -> Linear -> Sigmoid fwd + bwd, compiled (torchao README, h100-hbm2e)")
    print(
        f"{'recipe':10} {'M, K, N':22} {'pub x':>6}  {'mod bf16 ms':>11} {'mod fp8 ms':>10} "
        f"{'mod x':>6} {'mod/pub x':>9}"
    )
    for recipe, shape, pub in LN_LINEAR_SIGMOID:
        b = linear_seconds(LNLinearSigmoid, shape, None, "h100-hbm2e") * 1e3
        f = linear_seconds(LNLinearSigmoid, shape, recipe, "h100-hbm2e") * 1e3
        print(
            f"{recipe:10} {shape!s:22} {pub:6.2f}  {b:11.3f} {f:10.3f} {b / f:6.2f} "
            f"{b / f / pub:9.2f}"
        )
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
