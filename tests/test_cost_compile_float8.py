"""torch.compile and float8 linears in the time model: compile fuses the memory-bound
kernels and changes no event; float8 runs the linears' matrix multiplies in float8 and,
with FSDP2's float8 all-gather, gathers their weights in one byte per element."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost import machine, memory_model, timeline
from fsdpviz.cost.kernels import stretch_cost
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.trace.fusion import float8_casts

CONFIG = ExampleConfig(hidden_size=512, intermediate_size=1408, num_layers=2, num_heads=8)
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _report(**kwargs: object) -> fsdpviz.Report:
    ids = example_inputs(CONFIG, batch=2, seq=512)
    return fsdpviz.analyze(example_model(CONFIG), ids, world_size=8, progress=False, **kwargs)


def _events(report: fsdpviz.Report) -> list[list[dict[str, object]]]:
    return [[e.to_dict() for e in it] for it in report.iterations]


def test_fused_kernels_read_and_write_each_tensor_once() -> None:
    """Each fused record replaces its memory-bound kernels by fewer, smaller ones."""
    m = machine("h100")
    kernels = [["mem", 0, 10, 8e9], ["fused", 0, 10, 8e9, 2, 2e9]]
    eager, compiled = stretch_cost(kernels, m), stretch_cost(kernels, m, compiled=True)
    assert eager.memory_s == pytest.approx(m.memory_seconds(8e9) + 10 * m.kernel_us * 1e-6)
    assert compiled.memory_s == pytest.approx(m.memory_seconds(2e9) + 2 * m.kernel_us * 1e-6)
    assert compiled.kernels == 2 and eager.kernels == 10
    assert compiled.cpu_s == pytest.approx(2 * m.compiled_launch_us * 1e-6)


@pytest.mark.parametrize(
    "plan",
    [{"auto_wrap_policy": ModuleWrapPolicy({DecoderLayer})}, {"fully_shard": [DecoderLayer]}],
    ids=["fsdp1", "fsdp2"],
)
def test_compile_changes_compute_time_and_not_the_schedule(plan: dict[str, object]) -> None:
    eager = _report(**plan)
    whole = _report(compile=True, **plan)
    blocks = _report(compile=[DecoderLayer], **plan)
    assert _events(whole) == _events(eager) == _events(blocks)
    assert whole.config["compile"] is True and blocks.config["compile"] == ["DecoderLayer"]
    assert "compile" not in eager.config
    e, w, b = eager.timeline.totals, whole.timeline.totals, blocks.timeline.totals
    # matrix multiplies and attention as before; the memory-bound kernels fused
    assert w["matmul_s"] == pytest.approx(e["matmul_s"])
    assert w["attention_s"] == pytest.approx(e["attention_s"])
    assert w["memory_bound_s"] < e["memory_bound_s"] / 1.5
    # compiling the blocks alone leaves the loss and the final norm eager
    assert w["memory_bound_s"] < b["memory_bound_s"] < e["memory_bound_s"]
    assert w["compute_s"] < e["compute_s"]
    # the same fused regions are recorded for any report: compile it in the time model
    assert timeline(eager, compile=True).totals["compute_s"] == pytest.approx(w["compute_s"])
    assert timeline(whole, compile=False).totals["compute_s"] == pytest.approx(e["compute_s"])
    # every fused record covers kernels that the eager records hold too
    for ks in whole.profile.iterations[-1].kernels:  # type: ignore[union-attr]
        mem = sum(k[3] for k in ks if k[0] == "mem")
        fused = [k for k in ks if k[0] == "fused"]
        assert sum(k[3] for k in fused) <= mem + 1e-6
        assert all(0 < k[4] <= k[2] and 0 < k[5] <= k[3] + 1e-6 for k in fused)


def test_float8_linears_and_fsdp2_float8_all_gather() -> None:
    plain = _report(fully_shard=[DecoderLayer], mp_policy=BF16)
    spec = {"enable_fsdp_float8_all_gather": True, "filter_fqns": ["lm_head"]}
    f8 = _report(fully_shard=[DecoderLayer], mp_policy=BF16, float8=spec)
    # the same schedule, each block's all-gather preceded by its 7 float8 weights' amax
    # all-reduces over the shard group (see [Note: float8 all-gather amaxes])
    amaxes = [[e for e in it if e.group == "shard"] for it in f8.iterations]
    assert [len(a) for a in amaxes] == [
        7 * sum(e.kind == "all_gather" and e.unit != "" for e in it) for it in f8.iterations
    ]
    assert all(e.nbytes == 4 and e.dtype == "float32" for a in amaxes for e in a)
    rest = [[e.to_dict() for e in it if e.group != "shard"] for it in f8.iterations]
    assert rest == _events(plain)
    assert f8.config["float8"] == {
        "recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": True,
        "filter_fqns": ["lm_head"],
    }  # fmt: skip
    rows = [tuple(k) for ks in f8.profile.iterations[-1].kernels for k in ks]  # type: ignore[union-attr]
    fp8 = [r for r in rows if r[0] == "gemm" and r[6] == 1]
    bf16 = [r for r in rows if r[0] == "gemm" and r[6] == 2]
    # the 7 linears of each block run in float8 (forward and both backward products); the
    # LM head is filtered out and attention's own products stay in bf16
    assert sum(r[7] for r in fp8 if r[1] == 0) == 7 * CONFIG.num_layers
    assert sum(r[7] for r in fp8 if r[1] == 1) == 2 * 7 * CONFIG.num_layers
    assert any(r[2:6] == (1024, CONFIG.vocab_size, CONFIG.hidden_size, 1) for r in bf16)
    t8, tp = f8.timeline, plain.timeline
    assert t8.totals["matmul_s"] < tp.totals["matmul_s"]
    # the blocks' all-gathers move their linears' weights in float8 (their norms in bf16)
    shapes = {
        f"{m.fqn}.{n}": math.prod(s) for m in f8.modules for n, s in m.params.items()
    }  # fmt: skip
    units = {u.module: u for u in f8.units}
    gathered = [r for r in t8.events if r["kind"] == "all_gather"]
    for r in gathered:
        u = units[r["unit"]]
        fp8_numel = sum(
            shapes[p] for p in u.params if p.endswith("proj.weight") and "lm_head" not in p
        )
        share = fp8_numel / sum(shapes[p] for p in u.params)
        assert r.get("float8_share", 0.0) == pytest.approx(share)
        size = u.padded_numel * (share + (1 - share) * 2)
        assert r["bytes"] == pytest.approx(7 / 8 * size)
    assert any(r.get("float8_share") for r in gathered)
    assert t8.totals["all_gather_bytes"] < 0.6 * tp.totals["all_gather_bytes"]
    with pytest.raises(fsdpviz.ConfigError, match="enable_fsdp_float8_all_gather needs FSDP2"):
        _report(auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}), float8=spec)
    with pytest.raises(fsdpviz.ConfigError, match="unknown key 'all_gather'"):
        _report(fully_shard=[DecoderLayer], float8={"all_gather": True})
    with pytest.raises(fsdpviz.ConfigError, match="compile must be True"):
        _report(fully_shard=[DecoderLayer], compile="max-autotune")


def _gemms(report: fsdpviz.Report, backward: int) -> dict[int, int]:
    """The matrix multiplies of one direction by operand bytes (1: float8, 2: bf16)."""
    out: dict[int, int] = {}
    for ks in report.profile.iterations[-1].kernels:  # type: ignore[union-attr]
        for k in ks:
            if k[0] == "gemm" and k[1] == backward:
                out[k[6]] = out.get(k[6], 0) + k[-2]
    return out


def _mem_bytes(report: fsdpviz.Report) -> float:
    kernels = report.profile.iterations[-1].kernels  # type: ignore[union-attr]
    return sum(k[-1] for ks in kernels for k in ks if k[0] == "mem")


def test_float8_recipes_price_their_casts_and_precisions() -> None:
    """torchao's recipes: tensorwise casts each operand once (backward reuses the output
    gradient's cast through a transposed copy); rowwise scales along the dimension each
    multiply reduces, so every operand of every multiply is cast again; rowwise_with_gw_hp
    computes the weight gradient in bf16, without casts."""
    common = {"fully_shard": [DecoderLayer], "mp_policy": BF16}
    plain = _report(**common)
    f8 = {
        recipe: _report(float8={"recipe_name": recipe, "filter_fqns": ["lm_head"]}, **common)
        for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp")
    }
    linears = 7 * CONFIG.num_layers  # the blocks' projections; the LM head filtered out
    for report in f8.values():
        assert _events(report) == _events(plain)
        assert _gemms(report, 0) == {1: linears, 2: _gemms(plain, 0)[2] - linears}
    assert _gemms(f8["rowwise"], 1)[1] == _gemms(f8["tensorwise"], 1)[1] == 2 * linears
    assert _gemms(f8["rowwise_with_gw_hp"], 1)[1] == linears  # the input's gradient only
    tensorwise, rowwise, gw_hp = (_mem_bytes(f8[r]) for r in f8)
    assert rowwise > tensorwise and gw_hp < rowwise
    times = {r: timeline(report, "h100").totals["matmul_s"] for r, report in f8.items()}
    assert times["tensorwise"] == pytest.approx(times["rowwise"])
    assert times["rowwise_with_gw_hp"] > times["rowwise"]


class _Linear(torch.nn.Module):
    """One bias-free linear whose input needs its gradient (torchao's linear benchmark)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.requires_grad_(True))


def test_rowwise_backward_rescales_its_outputs_and_gw_hp_keeps_the_weight_gradient() -> None:
    """torchao runs a rowwise backward multiply (no fast accumulation) as the tensorwise
    cuBLAS kernel with unit scales, then ``output *= a_inverse_scale * b_inverse_scale``:
    eager, the scales' outer product in float32 and the in-place multiply (12 bytes per
    output element in bf16); compiled, a pass that reads the output and writes it where it
    outlives the fused region (4 bytes). The other recipes scale inside the kernel."""
    m, k, n = 256, 128, 64
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    outputs = m * k + n * k  # the input's gradient and the weight's
    backward: dict[str, list[object]] = {}
    gemms: dict[str, list[tuple[object, ...]]] = {}
    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        report = fsdpviz.analyze(
            _Linear(k, n).to("meta"), x, world_size=1, fully_shard=[_Linear], progress=False,
            float8={"recipe_name": recipe}, compile=True,
        )  # fmt: skip
        kernels = report.profile.iterations[-1].kernels  # type: ignore[union-attr]
        backward[recipe] = [k for ks in kernels for k in ks if k[0] in ("mem", "fused") and k[1]]
        gemms[recipe] = sorted(tuple(k[2:7]) for ks in kernels for k in ks if k[0] == "gemm")
    # rowwise casts every operand of both backward multiplies (read bf16 twice eager, write
    # one byte; fused, once along rows, twice down the columns of the weight and the input),
    # then scales both outputs
    cast = m * n + n * k + m * n + m * k
    mem, fused = backward["rowwise"]
    assert mem == ["mem", 1, 4 * 2 + 2 * 2, 5 * cast + 12 * outputs]
    across = 2 * (n * k + m * k)
    assert fused == [
        "fused", 1, 12, 5.0 * cast + 12 * outputs, 6 + 2, 3.0 * cast + across + 4 * outputs
    ]  # fmt: skip
    # tensorwise: one cast and three transposed copies; rowwise_with_gw_hp: the input's
    # gradient in float8 (the output gradient and the weight cast, no rescaling), the
    # weight's in bf16 (autograd runs it first here: the multiply that reads the weight is
    # the input's gradient, whatever the order)
    assert backward["tensorwise"][0] == ["mem", 1, 5, 5 * m * n + 2 * (m * n + n * k + m * k)]
    assert backward["rowwise_with_gw_hp"][0] == ["mem", 1, 4, 5 * (m * n + n * k)]
    assert gemms["rowwise_with_gw_hp"] == [(n, k, m, 1, 2), (m, n, k, 1, 1), (m, k, n, 1, 1)]
    assert gemms["rowwise"] == [(n, k, m, 1, 1), (m, n, k, 1, 1), (m, k, n, 1, 1)]


class _NormLinear(torch.nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(k, dtype=torch.bfloat16)
        self.fc = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x))


def test_compiled_rowwise_rescale_runs_inside_the_kernel_that_reads_the_output() -> None:
    """Compiled, the rescaling of the input's gradient is computed by the fused kernel that
    reads it next (the norm's backward): no bytes of its own, its two eager kernels gone;
    the weight's gradient leaves the region, so its scaled copy is read and written."""
    m, k, n = 256, 128, 64
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    fused: dict[str | None, list[object]] = {}
    for recipe in (None, "rowwise"):
        float8 = None if recipe is None else {"recipe_name": recipe}
        report = fsdpviz.analyze(
            _NormLinear(k, n).to("meta"), x, world_size=1, fully_shard=[_NormLinear],
            progress=False, float8=float8, compile=True,
        )  # fmt: skip
        kernels = report.profile.iterations[-1].kernels  # type: ignore[union-attr]
        fused[recipe] = next(k for ks in kernels for k in ks if k[0] == "fused" and k[1])
    cast = m * n + n * k + m * n + m * k
    plain, rowwise = fused[None], fused["rowwise"]
    # eager: the norm's backward, eight casting kernels and two rescales of two kernels each
    assert rowwise[2] == plain[2] + 8 + 2 * 2
    # fused: the norm's region (its rescale inside), four casts (the weight's and the
    # input's down their columns two kernels each), the weight's rescale
    assert rowwise[4] == plain[4] + 6 + 1
    across = 2 * (n * k + m * k)
    assert rowwise[5] == pytest.approx(plain[5] + 3 * cast + across + 4 * n * k)  # type: ignore[operator]


class _MLP(torch.nn.Module):
    def __init__(self, k: int, h: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(k, h, bias=False, dtype=torch.bfloat16)
        self.down = torch.nn.Linear(h, k, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class _Outer(torch.nn.Module):
    def __init__(self, k: int, h: int) -> None:
        super().__init__()
        self.mlp = _MLP(k, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_checkpoint_recomputation_runs_the_float8_forward(recipe: str) -> None:
    """A checkpointed block recomputes its linears in backward as torchao's forward: the
    input and the weight cast (two kernels each), no transposed copy and no rowwise
    rescaling (the forward multiply scales inside the kernel). The last one too: torch stops
    the recomputation once the forward's last saved tensor is saved again, before a plain
    ``mm`` (it saves its inputs first) but after torchao's ``matmul_with_hp_or_float8_args``
    (an ``autograd.Function``, whose tensors are saved once its forward has cast and
    multiplied); before, the down projection's recast was not counted."""
    m, k, h = 256, 128, 64
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")

    def backward_mem(float8: bool, checkpointed: bool) -> tuple[int, int]:
        kwargs: dict[str, object] = {"world_size": 1, "fully_shard": [_MLP], "progress": False}
        if checkpointed:
            kwargs["activation_checkpointing"] = [_MLP]
        if float8:
            kwargs["float8"] = {"recipe_name": recipe}
        report = fsdpviz.analyze(_Outer(k, h).to("meta"), x, **kwargs)  # type: ignore[arg-type]
        kernels = report.profile.iterations[-1].kernels  # type: ignore[union-attr]
        (rec,) = [k for ks in kernels for k in ks if k[0] == "mem" and k[1]]
        return int(rec[2]), int(rec[3])

    recomputed = [
        backward_mem(f8, True)[i] - backward_mem(f8, False)[i]
        for f8 in (True, False)
        for i in (0, 1)
    ]
    float8_kernels, float8_bytes, plain_kernels, plain_bytes = recomputed
    assert float8_kernels - plain_kernels == 2 * (2 + 2)
    # up: its input (m x k) and weight (h x k); down: its input (m x h) and weight (k x h)
    assert float8_bytes - plain_bytes == 5 * m * k + 5 * h * k + 5 * m * h + 5 * k * h


def test_compiled_casts_read_twice_where_the_amax_reduces_across_rows() -> None:
    """Compiled, a cast whose amax runs along the tensor's rows is one kernel reading it
    once; one whose amax spans rows (tensorwise: the whole tensor; rowwise down the columns)
    is a reduction and then the cast: two kernels, two reads (bf16 here: 2 bytes an
    element, one written)."""
    m, k, n = 256, 128, 64
    shapes = ((m, k), (n, k), (m, n))
    x, w, g = (torch.empty(s, dtype=torch.bfloat16, device="meta") for s in shapes)

    def cast(kernels: int, t: torch.Tensor, reads: int) -> tuple[int, float, int, float]:
        return (2, 5.0 * t.numel(), kernels, float((2 * reads + 1) * t.numel()))

    tensorwise = float8_casts(False, x, w.t(), False, True)
    assert tensorwise == [cast(1, x, 1), cast(2, w, 2)]  # the weight: a graph input
    assert float8_casts(False, x, w.t(), True, True) == [cast(1, x, 1)]  # gathered in float8
    assert float8_casts(False, x, w.t(), False, True, "rowwise") == [cast(1, x, 1), cast(1, w, 1)]
    # the input's gradient: the output gradient along its rows, the weight down its columns
    assert float8_casts(True, g, w, False, True, "rowwise") == [cast(1, g, 1), cast(2, w, 2)]
    # the weight's: the output gradient's column amax is the second read of the two casts
    # of it; the input down its columns
    assert float8_casts(True, g.t(), x, False, False, "rowwise") == [cast(1, g, 1), cast(2, x, 2)]
    # rowwise_with_gw_hp: the weight cast tensorwise for the input's gradient, no casts for
    # the weight's
    gw_hp = "rowwise_with_gw_hp"
    assert float8_casts(True, g, w, False, True, gw_hp) == [cast(1, g, 1), cast(2, w, 2)]
    assert float8_casts(True, g.t(), x, False, False, gw_hp) == []


class _Stop(Exception):
    pass


def _cast(x: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's dynamic float8 cast (``hp_tensor_to_float8_dynamic`` of ``6243040``:
    ``tensor_to_amax``, ``amax_to_scale`` with power-of-2 scales for rowwise,
    ``to_scaled_tc_float8``'s scaled, saturated cast)."""
    f8 = torch.float8_e4m3fn
    a = x.abs()
    amax = torch.max(a) if dim is None else torch.amax(a, dim=dim, keepdim=True)
    scale = (torch.finfo(f8).max / torch.clamp(amax.to(torch.float64), min=1e-12)).float()
    if dim is not None:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    top = torch.finfo(f8).max
    return (x.to(torch.float32) * scale).clamp(min=-top, max=top).to(f8), scale


@pytest.mark.parametrize(
    ("dims", "reads"),
    [((None,), 2), ((0,), 2), ((-1,), 1), ((-1, 0), 2)],
    ids=["tensorwise", "columns", "rows", "rows and columns"],
)
def test_inductor_reads_a_cast_tensor_once_per_reduction_across_rows(
    dims: tuple[int | None, ...], reads: int
) -> None:
    """What Inductor makes of torchao's cast of a row-major tensor: the kernels (scheduler
    nodes after fusion, before any code is generated) that read the tensor. Along rows the
    amax, the scale and the cast fuse into one; a reduction over the whole tensor or down
    its columns ends before any element is cast. The output gradient's two rowwise casts
    (along rows for the input's gradient, down columns for the weight's) take two reads."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor import config
    from torch._inductor.virtualized import V

    readers: list[int] = []

    def stop(nodes: list[object]) -> list[object]:
        inputs = set(V.graph.graph_input_names)
        for node in nodes:
            names = {dep.name for dep in node.read_writes.reads}  # type: ignore[attr-defined]
            readers.append(int(bool(names & inputs)))
        raise _Stop  # counted: no code to generate

    def casts(x: torch.Tensor) -> list[torch.Tensor]:
        return [t for d in dims for t in _cast(x, d)]

    x = torch.randn(64, 128, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with config.patch(_post_fusion_custom_pass=stop), pytest.raises(BackendCompilerFailed):
        torch.compile(casts, fullgraph=True)(x)
    assert sum(readers) == reads


def test_compiled_float8_casts_hold_only_their_float8_results() -> None:
    """An eager cast holds a float32 product, its clamp and the float8 result (9 bytes an
    element, ``tests/test_cost_memtracker_float8.py``); under ``torch.compile`` Inductor
    writes the float8 result from the kernel that reads the input (1 byte an element). One
    linear's backward (input's gradient first, its float8 operands kept): eager, its peak
    is the weight's gradient's input cast (the output gradient's float8 and scale kept,
    9 bytes an input element and a scale); compiled, the moment after that multiply (both
    float8 operands, their scales and the weight's gradient)."""
    m, k, n = 256, 128, 64
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    peaks = {}
    for compiled in (False, True):
        report = fsdpviz.analyze(
            _Linear(k, n).to("meta"), x, world_size=1, fully_shard=[_Linear], progress=False,
            float8=True, compile=compiled,
        )  # fmt: skip
        peaks[compiled] = memory_model(report, optimizer=None).peak["bytes"]
    eager = m * n + 4 + 9 * m * k + 4
    fused = (m * n + 4 + m * k + 4) + n * k * 2
    assert peaks[False] - peaks[True] == eager - fused


def test_precomputed_scales_all_reduce_after_the_optimizer_step() -> None:
    """torchtitan calls ``precompute_float8_dynamic_scale_for_fsdp`` after
    ``optimizer.step()``: its norms of the float8 weights' shards start when the optimizer's
    last kernel ends, the all-reduce of every float8 weight's amax when they end, once per
    optimizer step however many micro-steps it accumulates, and the scales' clamp after it;
    the step ends when that does (the next step's first all-gather waits for it)."""
    spec = {"enable_fsdp_float8_all_gather": True, "filter_fqns": ["lm_head"],
            "precompute_float8_dynamic_scale_for_fsdp": True}  # fmt: skip
    report = _report(fully_shard=[DecoderLayer], mp_policy=BF16, float8=spec)
    m = machine("h100")
    for optimizer in ("adamw_fused", "adamw"):  # (the default last: grad_accum below)
        tl = timeline(report, m, optimizer=optimizer)
        t = tl.totals
        # the steady state's only amax all-reduce: the precomputation's, of all 14 weights
        (pre,) = [r for r in tl.events if r.group == "shard"]
        assert pre.module is None and pre.bytes == pytest.approx(2 * 7 / 8 * 14 * 4)
        rest = [r for r in tl.events if r.index != pre.index]
        micro_end = max([r.end for r in rest] + [c.end for c in tl.compute])
        assert t["micro_step_s"] == pytest.approx(micro_end)
        assert t["optimizer_s"] > 0
        # the compute after the last micro-step: the optimizer step, torchao's norms of the
        # float8 weights' shards, the all-reduce, the clamp and reciprocal of the amaxes
        opt, amax, scales = tl.step_work
        assert [w.name for w in tl.step_work] == ["optimizer", "float8_amax", "float8_scales"]
        assert opt.start == pytest.approx(micro_end)
        assert opt.end - opt.start == pytest.approx(t["optimizer_s"])
        assert amax.start == pytest.approx(opt.end) and pre.start == pytest.approx(amax.end)
        # each weight's padded shard read once (float32: the sharded parameters), in one
        # multi-tensor launch, its cleanup kernel, and torch.stack of the 14 norms
        shards = sum(
            math.ceil(shape[0] / 8) * shape[1]
            for mod in report.modules
            for name, shape in mod.params.items()
            if mod.module_class == "Linear" and name == "weight" and "lm_head" not in mod.fqn
        )
        assert amax.bytes == 4 * shards + 4 * 14 + 2 * 14 * 4 and amax.kernels == 3
        launched = 3 * m.launch_forward_us * 1e-6
        ran = m.memory_seconds(4 * shards + 4 * 14) + m.memory_seconds(2 * 14 * 4)
        ran += 3 * m.kernel_us * 1e-6
        assert amax.end - amax.start == pytest.approx(max(launched, ran))
        assert scales.start == pytest.approx(pre.end) and scales.kernels == 4
        assert scales.end - scales.start == pytest.approx(4 * m.launch_forward_us * 1e-6)
        assert pre.held == "optimizer" and pre.issued == pre.start
        took = pre.end - pre.start
        assert took > 0 and pre.exposed == pytest.approx(took)
        computed = (amax.end - amax.start) + (scales.end - scales.start)
        assert (
            t["step_s"]
            == pytest.approx(scales.end)
            == pytest.approx(t["micro_step_s"] + t["optimizer_s"] + computed + took)
        )
        (why,) = [b for b in tl.bottlenecks() if b["event"] == pre.index]
        assert (
            why["cause"] == "tail"
            and "after the optimizer step and torchao's norms" in why["reason"]
        )
    # three micro-steps, each reducing its gradients: one precomputation, after the optimizer
    three = timeline(report, m, grad_accum=3)
    t3 = three.totals
    assert t3["step_s"] == pytest.approx(3 * t["micro_step_s"] + t["optimizer_s"] + computed + took)
    assert [w.name for w in three.step_work] == [w.name for w in tl.step_work]
    assert t3["comm_s"] == pytest.approx(3 * (t["comm_s"] - took) + took)


def _tensor_parallel_precomputed() -> fsdpviz.Report:
    """FSDP 2 x TP 2 with float8 all-gathers and precomputed scales (the conformance test's
    model, ``tests/test_conformance_float8_all_gather.py``)."""
    import tp_models

    with torch.device("meta"):
        model = tp_models.Llama(vocab=64, dim=32, n_heads=4, hidden=96, layers=2)
    f8 = {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
          "precompute_float8_dynamic_scale_for_fsdp": True}  # fmt: skip
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    return fsdpviz.analyze(
        model, tokens, fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2), mp_policy=BF16,
        loss=lambda out: out.sum(), float8=f8, parallelize_plan=tp_models.plain_plan(),
        progress=False,
    )  # fmt: skip


def test_precomputed_scales_under_tensor_parallelism_reduce_over_tp_after_the_shard_group() -> None:
    """DTensor redistributes the stacked ``(Partial, Partial)`` amaxes one mesh dimension at
    a time: the tp ranks' all-reduce starts when the shard group's ends, both after the
    optimizer step, and the step ends with the second."""
    tl = timeline(_tensor_parallel_precomputed(), "h100")
    t = tl.totals
    (shard,) = [r for r in tl.events if r.group == "shard" and r.module is None]
    (tp,) = [r for r in tl.events if r.kind == "tp_all_reduce" and r.module is None]
    assert tp.index == shard.index + 1 and tp.group == "tp" and tp.stream == "tp"
    _, amax, scales = tl.step_work
    assert shard.start == pytest.approx(amax.end)
    assert amax.start == pytest.approx(t["micro_step_s"] + t["optimizer_s"])
    assert tp.start == pytest.approx(shard.end) and tp.held == shard.held == "optimizer"
    assert tp.end > tp.start and tp.exposed == pytest.approx(tp.end - tp.start)
    # the clamp after both all-reduces; the step ends with it
    assert scales.start == pytest.approx(tp.end) and t["step_s"] == pytest.approx(scales.end)
