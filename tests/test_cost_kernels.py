"""The per-kernel roofline of the time model, on small cases computed by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fsdpviz
from fsdpviz.cost import Machine, machine, timeline
from fsdpviz.cost.kernels import attention_seconds, gemm_seconds, stretch_cost

# A made-up GPU with round numbers: 100 TFLOP/s, 1 TB/s.
TOY = Machine(
    "toy", {"bfloat16": 100.0, "float32": 50.0}, 16.0, 1000.0, 100.0, 10.0,
    compute_efficiency=0.5, gemm_half_us=20.0, memory_efficiency=1.0,
    attention_efficiency=0.5, attention_backward_efficiency=0.25, attention_seq_half=256.0,
    kernel_us=2.0, launch_forward_us=10.0, launch_backward_us=5.0,
)  # fmt: skip


def test_gemm_is_compute_or_memory_bound() -> None:
    # 1000^3 in bf16: 2 GFLOP at 0.5 of 100 TFLOP/s (40 us), plus 20 us
    assert gemm_seconds(TOY, 1000, 1000, 1000, 1, 2) == pytest.approx(2e9 / 50e12 + 20e-6)
    # a matrix-vector product: 2 GFLOP but ~2 GB to read, so 2 ms at 1 TB/s
    skinny = gemm_seconds(TOY, 1_000_000, 1, 1000, 1, 2)
    assert skinny == pytest.approx((1e9 + 1000 + 1e6) * 2 / 1e12)
    # small GEMMs reach less of the peak: 8x fewer FLOPs take more than 1/8 of the time
    big = gemm_seconds(TOY, 2000, 2000, 2000, 1, 2)
    small = gemm_seconds(TOY, 1000, 1000, 1000, 1, 2)
    assert small > big / 8


def test_float8_matmul_at_the_rate_the_vendor_measures() -> None:
    """A float8 matrix multiply on MI300X runs at AMD's measured FP8 to BF16 ratio of
    hipBLASLt GEMMs (1273 / 708 TFLOP/s), not the data sheet's 2.00; on H100 at the data
    sheet's; ``float8_matmul_share=1.0`` puts MI300X back on its data sheet."""
    size = 8192

    def ratio(m: Machine) -> float:  # bf16 over float8, the gemm_half_us of each left out
        one = [["gemm", 0, size, size, size, 1, isz, 1, 0] for isz in (2, 1)]
        bf16, f8 = (stretch_cost([k], m).matmul_s - m.gemm_half_us * 1e-6 for k in one)
        return bf16 / f8

    mi300x = machine("mi300x")
    assert mi300x.float8_matmul_share == pytest.approx(0.899, abs=5e-4)
    assert ratio(mi300x) == pytest.approx(1273.0 / 708.0)
    assert ratio(machine("mi300x", float8_matmul_share=1.0)) == pytest.approx(2.0, abs=1e-3)
    assert ratio(machine("h100")) == pytest.approx(1979.0 / 989.0)
    assert mi300x.peak_flops("float8_e4m3fnuz") == pytest.approx(2614.9e12)  # the data sheet's


def test_attention_by_kernel_sequence_and_causality() -> None:
    shape = (1, 8, 1024, 1024, 128)
    fwd = attention_seconds(TOY, "flash", False, shape, False, 2)
    flops = 4.0 * 8 * 1024 * 1024 * 128
    eff = 0.5 * 1024 / (1024 + 256)  # head dim 128: no head-dim factor
    assert fwd == pytest.approx(flops / (100e12 * eff))
    causal = attention_seconds(TOY, "flash", False, shape, True, 2)
    assert causal == pytest.approx(fwd * 0.5 * (1 + 128 / 1024))
    bwd = attention_seconds(TOY, "flash", True, shape, False, 2)
    assert bwd == pytest.approx(fwd * 2.5 * 0.5 / 0.25)
    eff_kernel = attention_seconds(TOY, "efficient", False, shape, False, 2)
    assert eff_kernel == pytest.approx(fwd / TOY.efficient_attention_factor)
    short = attention_seconds(TOY, "flash", False, (1, 8, 256, 256, 128), False, 2)
    assert short > fwd / 16  # 16x fewer FLOPs, a lower efficiency


def test_stretch_gpu_and_cpu_time() -> None:
    kernels = [
        ["gemm", 0, 1000, 1000, 1000, 1, 2, 3, 3 * 6_000_000],
        ["mem", 0, 10, 4_000_000_000],
        ["mem", 1, 4, 1_000_000],
    ]
    cost = stretch_cost(kernels, TOY)
    assert cost.matmul_s == pytest.approx(3 * (2e9 / 50e12 + 20e-6))
    assert cost.memory_s == pytest.approx(4e9 / 1e12 + 10 * 2e-6 + 1e6 / 1e12 + 4 * 2e-6)
    assert cost.cpu_s == pytest.approx((13 * 10 + 4 * 5) * 1e-6)
    assert cost.kernels == 17 and cost.seconds == max(cost.gpu_s, cost.cpu_s)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 64)
        self.up = nn.Linear(64, 256)
        self.down = nn.Linear(256, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.up(self.emb(ids))))
        return out


def _mlp_report(**kwargs: object) -> fsdpviz.Report:
    ids = torch.zeros(4, 8, dtype=torch.long)
    return fsdpviz.analyze(_Mlp(), ids, world_size=2, progress=False, **kwargs)


def test_trace_records_each_kernel() -> None:
    report = _mlp_report(auto_wrap_policy=None)
    assert report.profile is not None and report.profile.tokens == 32
    step = report.profile.iterations[-1]
    rows = [tuple(k) for ks in step.kernels for k in ks]
    gemms = {r[:7]: r[7] for r in rows if r[0] == "gemm"}
    # forward: the two linears as addmm on (32 tokens x features), float32
    assert gemms[("gemm", 0, 32, 256, 64, 1, 4)] == 1
    assert gemms[("gemm", 0, 32, 64, 256, 1, 4)] == 1
    # backward: input gradient of `down` and both weight gradients
    assert gemms[("gemm", 1, 32, 256, 64, 1, 4)] == 1  # grad_out(32x64) @ W(64x256)
    assert gemms[("gemm", 1, 256, 64, 32, 1, 4)] == 1  # grad_out^T(256x32) @ x(32x64)
    assert ("gemm", 1, 64, 256, 32, 1, 4) in gemms
    forward_mem = [r for r in rows if r[0] == "mem" and r[1] == 0]
    assert forward_mem and all(r[-1] > 0 for r in forward_mem)


class _Attend(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 3 * 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 4, 16)).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).flatten(2)


def test_recomputed_attention_is_a_forward_kernel() -> None:
    # activation checkpointing runs the block's forward again in backward: the attention
    # it recomputes launches the forward kernel, priced as one, not as the backward kernel
    model = nn.Sequential(_Attend(), _Attend())
    x = torch.randn(2, 32, 64)
    for ac in (None, [_Attend]):
        report = fsdpviz.analyze(
            model, x, world_size=2, fully_shard=["0", "1"], activation_checkpointing=ac,
            loss=lambda out: out.sum(), progress=False,
        )  # fmt: skip
        assert report.profile is not None
        rows = [tuple(k) for ks in report.profile.iterations[-1].kernels for k in ks]
        attn: dict[tuple[object, ...], int] = {}
        for r in rows:
            if r[0] == "attn":  # (phase, backward kernel): count
                attn[r[2], r[10]] = attn.get((r[2], r[10]), 0) + r[11]
                assert r[3:10] == (2, 4, 32, 32, 16, 1, 4)  # B, H, Sq, Skv, D, causal, fp32
        recomputed = {} if ac is None else {(1, 0): 2}
        assert attn == {(0, 0): 2, **recomputed, (1, 1): 2}
    tl = timeline(report, TOY, optimizer=None)
    shape = (2, 4, 32, 32, 16)
    fwd = attention_seconds(TOY, "flash", False, shape, True, 4)
    bwd = attention_seconds(TOY, "flash", True, shape, True, 4)
    assert tl.totals["attention_s"] == pytest.approx(4 * fwd + 2 * bwd)


def test_throughput_mfu_and_hfu() -> None:
    report = _mlp_report(auto_wrap_policy=None)
    m = machine("h100")
    tl = timeline(report, m, optimizer=None)
    t = tl.totals
    forward = 2 * 32 * (64 * 256 + 256 * 64)  # the two linears
    assert t["model_flops"] == pytest.approx(3 * forward)
    assert t["tokens"] == 32 and t["tokens_per_s"] == pytest.approx(32 / t["step_s"])
    assert t["mfu"] == pytest.approx(3 * forward / t["step_s"] / (67.0e12))
    assert t["hfu"] >= t["mfu"] > 0
    assert "tokens/s per GPU, MFU" in tl.summary()
    # a model this small is launch-bound: the GPU waits for the CPU
    assert t["cpu_bound_s"] > 0


def test_gradient_accumulation_repeats_the_synced_iteration() -> None:
    report = _mlp_report(auto_wrap_policy=None)
    one = timeline(report, "h100")
    four = timeline(report, "h100", grad_accum=4)
    t1, t4 = one.totals, four.totals
    assert t4["step_s"] == pytest.approx(4 * t1["micro_step_s"] + t1["optimizer_s"])
    assert t4["tokens"] == 4 * t1["tokens"]
    assert t4["compute_s"] == pytest.approx(4 * t1["compute_s"])  # per optimizer step
    assert [s["sync"] for s in four.micro_steps] == [True] * 4
    assert four.micro_steps[1]["start"] == pytest.approx(four.micro_steps[0]["end"])
    with pytest.raises(fsdpviz.ConfigError, match="grad_accum must be a positive int"):
        timeline(report, grad_accum=0)
    with pytest.raises(fsdpviz.ConfigError, match=r"analyze\(\.\.\., grad_accum=N\)"):
        timeline(report, grad_accum=4, no_sync=True)


def test_fsdp2_copies_and_cpu_launches() -> None:
    fsdp2 = _mlp_report(fully_shard=["up", "down"])
    assert timeline(fsdp2, "h100").totals["copy_s"] > 0
    fsdp1 = _mlp_report(auto_wrap_policy=None)
    assert timeline(fsdp1, "h100").totals["copy_s"] == 0.0
    slow_cpu = timeline(fsdp1, machine("h100", launch_forward_us=1000.0, launch_backward_us=1000.0))
    steady = fsdp1.profile.iterations[-1].kernels  # type: ignore[union-attr]
    kernels = sum(k[-2] for ks in steady for k in ks if k[0] != "fused")
    assert slow_cpu.totals["step_s"] >= kernels * 1e-3


def test_fixed_segments_replay_the_allocators_best_fit() -> None:
    from fsdpviz.cost.memory_pools import fixed_segments

    mib = 2**20
    # an embedding's 1000 MiB buffer, blocks of 400 MiB two at a time, then the output's
    # 1000 MiB: the blocks split the embedding's freed segment and a 400 MiB one of their
    # own, so the output finds no 1000 MiB free and takes a third segment (1400 MiB at most
    # are alive at once; expandable segments would hold that)
    ops = [(("e",), 1000 * mib), (("b0",), 400 * mib), (("e",), 0), (("b1",), 400 * mib)]
    ops += [(("b0",), 0), (("b2",), 400 * mib), (("b1",), 0), (("b3",), 400 * mib)]
    ops += [(("b2",), 0), (("o",), 1000 * mib), (("b3",), 0), (("o",), 0)]
    assert fixed_segments(ops) == 2400 * mib
    # small requests share 2 MiB segments; 1 to 10 MiB ones a 20 MiB one
    assert fixed_segments([(("a",), 1000), (("b",), 1000)]) == 2 * mib
    assert fixed_segments([((k,), 5 * mib) for k in "abcd"], passes=1) == 20 * mib


def test_card_page_and_sweep_show_throughput() -> None:
    from fsdpviz.views.card import report_html

    report = _mlp_report(auto_wrap_policy=None)
    t = report.timeline.totals
    card = report_html(report)
    assert f"{t['tokens_per_s']:,.0f} tokens/s per GPU" in card and f"MFU {t['mfu']:.1%}" in card
    assert report.memory.reserved["bytes"] >= report.memory.peak["bytes"]
    table = fsdpviz.sweep(_Mlp(), torch.zeros(4, 8, dtype=torch.long), world_size=[2, 4])
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] <= r["hfu"] for r in table.rows)
    assert "tok/s/GPU" in table.summary() and "MFU" in table.summary()
