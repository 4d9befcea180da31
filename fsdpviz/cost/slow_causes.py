"""Why a step is slow: where the time model's step goes, cause by cause, each with the knob
that changes it.

:func:`slowdowns` splits the modelled optimizer step (``report.timeline``) into what costs
time beyond the compute of the model itself at the GPU's bf16 rate:

- ``precision``: matrix multiplies in float32 (on CUDA cores under torch's default
  ``float32_matmul_precision="highest"``, a tenth of the bf16 rate on an H100): the
  seconds they take beyond the same matrix multiplies in bf16 (``mp_policy`` /
  ``mixed_precision`` with bf16 parameters);
- ``recomputation``: activation checkpointing's forward run again in backward: its FLOPs
  (the hardware FLOPs beyond three times the forward's, as HFU and MFU count them) at the
  rate the step's matrix multiplies and attention reach;
- ``attention``: eager attention (its batched matrix multiplies, where the model has no
  fused attention kernel), or fused attention's own time where it dominates;
- ``small_matmuls``: matrix multiplies too small to reach half the GPU's matmul efficiency
  (the time model's ``gemm_half_us``): the time beyond that rate; ``misaligned``: matrix
  multiplies whose dimensions do not divide by 8 (tensor cores want them to: listed, not
  priced, as the time model does not price it);
- ``memory_bound``: element-wise, normalisation and softmax kernels at the memory's
  bandwidth (``torch.compile`` fuses them);
- ``cpu_bound``: where the GPU waits for the CPU to launch kernels (many small kernels:
  ``torch.compile``, larger micro-batches);
- ``communication``: the collectives the compute waits for
  (:meth:`~fsdpviz.schema.timeline.Timeline.bottlenecks` ranks them one by one);
- ``optimizer``: the optimizer step (CPU offload puts it on the host);
- ``bubbles``: under pipeline parallelism, the compute waiting for another pipeline rank
  (:meth:`~fsdpviz.schema.timeline.Timeline.bubbles`), then the slowest pipeline rank's own
  causes.

Each is a mapping: ``cause``, ``seconds`` (of the optimizer step), ``share`` (of the step),
``knob`` (the :func:`fsdpviz.tune` knob that changes it), ``text`` (in words) and, where
it applies, ``fix``. :func:`fsdpviz.tune` adds what it predicts for each knob.

Example::

    for s in fsdpviz.cost.slowdowns(report)[:3]:
        print(s["text"])
"""

from __future__ import annotations

from typing import TypedDict

from fsdpviz.cost.fit import machine_of
from fsdpviz.cost.kernels import gemm_seconds
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.schema.report import Report
from fsdpviz.schema.timeline import duration_text

__all__ = ["Slowdown", "slowdowns"]


class Slowdown(TypedDict):
    """One row of :func:`slowdowns` (see it for each key)."""

    cause: str
    seconds: float
    share: float
    knob: str
    text: str
    fix: str


# Below this share of its efficiency on large matrices a matrix multiply counts as small.
_SMALL = 0.5


def slowdowns(report: Report, checkpointing: bool | None = None) -> list[Slowdown]:
    """What the step's time goes to beyond the model's compute in bf16, most first (see the
    module docstring); empty for a report without a trace profile. ``checkpointing``:
    whether the plan checkpoints activations (default: what its config states)."""
    pipe = report.pipeline
    if pipe is not None and pipe.ranks:
        return _pipeline_slowdowns(report, checkpointing)
    if report.profile is None or not report.profile.iterations:
        return []
    tl = report.timeline
    t = tl.totals
    step = float(t["step_s"])
    if step <= 0:
        return []
    m = machine_of(report)
    gemms = _gemms(report)
    out: list[Slowdown] = []

    def add(cause: str, seconds: float, knob: str, text: str, fix: str = "") -> None:
        if seconds > 0:
            share = seconds / step
            out.append(
                Slowdown(cause=cause, seconds=seconds, share=share, knob=knob, text=text, fix=fix)
            )

    matmul_s = float(t["matmul_s"])
    model_total = sum(gemm_seconds(m, *g[:5]) * g[5] for g in gemms) or 1.0
    scale = matmul_s / model_total  # the profile's iteration, scaled to the step's matmul time
    fp32 = [g for g in gemms if g[4] == 4]
    if fp32:
        at_fp32 = sum(gemm_seconds(m, *g[:5]) * g[5] for g in fp32) * scale
        at_bf16 = sum(gemm_seconds(m, *g[:4], 2) * g[5] for g in fp32) * scale
        rate = "TF32 tensor cores" if m.tf32 else "CUDA cores (float32_matmul_precision highest)"
        add(
            "precision",
            at_fp32 - at_bf16,
            "precision",
            f"float32 matrix multiplies on {rate}: {duration_text(at_fp32)}, "
            f"{duration_text(at_bf16)} in bf16",
            "bf16 parameters with float32 reduction (mp_policy / mixed_precision)",
        )
    if checkpointing is None:
        checkpointing = bool(getattr(report.config, "activation_checkpointing", None))
    recompute = float(t["hardware_flops"]) - float(t["model_flops"])
    flops = float(t["hardware_flops"])
    if checkpointing and recompute > 0 and flops > 0:
        share = recompute / flops
        add(
            "recomputation",
            share * (matmul_s + float(t["attention_s"])),
            "activation_checkpointing",
            f"activation checkpointing recomputes {share:.0%} of the FLOPs the step runs",
            "checkpoint less (every 2nd block, per op), where the memory allows",
        )
    eager = [g for g in gemms if g[3] > 1]
    if eager:
        seconds = sum(gemm_seconds(m, *g[:5]) * g[5] for g in eager) * scale
        add(
            "attention",
            seconds,
            "attention",
            f"batched matrix multiplies (eager attention: scores and their softmax in memory) "
            f"take {duration_text(seconds)}",
            "fused attention (torch's scaled_dot_product_attention; Hugging Face "
            "attn_implementation='sdpa')",
        )
    small = 0.0
    for g in gemms:
        one = gemm_seconds(m, *g[:5])
        ideal = one - m.gemm_half_us * 1e-6
        if ideal > 0 and ideal / one < _SMALL:
            small += (one - ideal) * g[5]
    add(
        "small_matmuls",
        small * scale,
        "micro_batch",
        f"matrix multiplies too small to reach half the GPU's rate lose "
        f"{duration_text(small * scale)}",
        "a larger micro-batch (fewer, larger matrix multiplies)",
    )
    add(
        "memory_bound",
        float(t["memory_bound_s"]),
        "compile",
        f"memory-bound kernels (element-wise, normalisation, softmax) take "
        f"{duration_text(float(t['memory_bound_s']))}",
        "torch.compile (fuses them)",
    )
    add(
        "cpu_bound",
        float(t["cpu_bound_s"]),
        "compile",
        f"the GPU waits {duration_text(float(t['cpu_bound_s']))} for the CPU to launch kernels",
        "torch.compile (fewer, larger kernels), a larger micro-batch",
    )
    add(
        "communication",
        float(t["exposed_comm_s"]),
        RESHARD.name,
        f"the compute waits {duration_text(float(t['exposed_comm_s']))} for collectives "
        "(report.timeline.bottlenecks() ranks them)",
        "resharding, prefetch, units, HSDP",
    )
    add(
        "optimizer",
        float(t["optimizer_s"]),
        "cpu_offload",
        f"the optimizer step takes {duration_text(float(t['optimizer_s']))}",
    )
    misaligned = [g for g in gemms if any(d % 8 for d in g[:3])]
    if misaligned:
        shapes = sorted({f"{g[0]}x{g[2]} @ {g[2]}x{g[1]}" for g in misaligned})[:3]
        out.append(
            {
                "cause": "misaligned",
                "seconds": 0.0,
                "share": 0.0,
                "knob": "",
                "text": f"{len(misaligned)} matrix multiply shape(s) with dimensions not "
                f"divisible by 8 ({', '.join(shapes)}): tensor cores run them slower (not "
                "priced by the time model)",
                "fix": "pad the vocabulary or hidden sizes to multiples of 8 (64 is better)",
            }
        )
    out.sort(key=lambda r: -r["seconds"])
    return out


def _pipeline_slowdowns(report: Report, checkpointing: bool | None) -> list[Slowdown]:
    """A pipeline's: its bubbles (the compute waiting for another pipeline rank), then the
    slowest pipeline rank's own causes."""
    t = report.timeline.totals
    step = float(t["step_s"])
    out: list[Slowdown] = []
    bubble = float(t.get("bubble_s", 0.0))
    if bubble > 0 and step > 0:
        worst = report.timeline.bubble_records()
        first = f"; the longest: {worst[0].reason}" if worst else ""
        out.append(
            {
                "cause": "bubbles",
                "seconds": bubble,
                "share": bubble / step,
                "knob": "pipeline",
                "text": f"the pipeline's bubbles take {duration_text(bubble)}{first}",
                "fix": "a schedule with a smaller bubble (interleaved, zero-bubble), more "
                "microbatches",
            }
        )
    assert report.pipeline is not None
    ranks = [r for r in report.pipeline.ranks if r.profile is not None]
    if ranks:
        slowest = max(ranks, key=lambda r: float(r.timeline.totals["step_s"]))
        out += slowdowns(slowest, checkpointing)
    out.sort(key=lambda r: -r["seconds"])
    return out


def _gemms(report: Report) -> list[tuple[int, int, int, int, int, int]]:
    """The matrix multiplies of the steady iteration: ``(M, N, K, batch, itemsize, count)``."""
    assert report.profile is not None
    step = report.profile.iterations[-1]
    out = []
    for stretch in step.kernels:
        for k in stretch:
            if k[0] == "gemm":
                out.append((int(k[2]), int(k[3]), int(k[4]), int(k[5]), int(k[6]), int(k[7])))
    return out
