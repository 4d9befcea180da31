"""tune's code around FSDP, run: tensor parallelism, float8 linears and ``torch.compile``
as ``Candidate.code()`` prints them, executed on real FSDP2 (the fake process group's 4
ranks, on the CPU, as tests/test_tune_code_runs.py runs it) and compared with the plan: the
units and events, the modules each parallel style applies to, the linears converted to
float8, the blocks compiled. The code said nothing of float8 and compile, and tensor
parallelism only in a comment: run as printed, the model trained without them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import tp_models
from gloo_worker import _tp_collectives
from test_tune_code_runs import assert_ran_as_planned, run
from torch import nn

import fsdpviz
from fsdpviz.tuning import Candidate


def _llama() -> nn.Module:
    torch.manual_seed(0)
    return tp_models.Llama(layers=2)


def _tokens() -> dict[str, torch.Tensor]:
    return {"tokens": torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(0))}


def _tune(**kwargs: Any) -> list[Candidate]:
    t = fsdpviz.tune(
        _llama(),
        _tokens(),
        world_size=4,
        fully_shard=[tp_models.TransformerBlock],
        progress=False,
        workers=1,
        **kwargs,
    )
    return t.candidates


def fsdp_only(report: fsdpviz.Report) -> fsdpviz.Report:
    """The plan without tensor parallelism's events (what FSDP's recorder records)."""
    its = [[e.to_dict() for e in it if not e.tensor_parallel] for it in report.iterations]
    return fsdpviz.Report.from_dict({**report.to_dict(), "iterations": its})


def test_tensor_parallel_code_parallelizes_as_planned(fake_pg: int) -> None:
    (c,) = [
        c
        for c in _tune(
            mesh=("dp_shard", 2, "tp", 2),
            parallelize_plan=tp_models.whole_plan(),
            knobs=("mesh",),
        )
        if c.report.config.tp_world_size
    ]
    with _tp_collectives() as seen:
        _, real, _ = run(c, _llama)
    # the units (each parameter's tp placement and shard) and the FSDP recorder's events
    assert_ran_as_planned(dataclasses.replace(c, report=fsdp_only(c.report)), real)
    # DTensor's collectives of the three steps: the first's, then the steady one's twice
    first, steady = (
        [[e.kind, e.nbytes] for e in it if e.tensor_parallel] for it in c.report.iterations
    )
    assert steady and seen == first + steady + steady


def test_float8_code_converts_the_planned_linears(fake_pg: int) -> None:
    from torchao.float8.float8_linear import Float8Linear

    from fsdpviz.plan.job import Float8, float8_weights

    cands = _tune(allow=("float8",), knobs=("float8",), float8={"filter_fqns": ["output"]})
    assert {c.knobs["float8"] for c in cands} == {
        "off", "tensorwise, except output", "tensorwise, float8 all-gather, except output",
    }  # fmt: skip
    for c in cands:
        model, real, _ = run(c, _llama)
        assert_ran_as_planned(c, real)
        spec = c.report.config.float8
        converted = {
            f"{n}.weight".replace("_fsdp_wrapped_module.", "")
            for n, m in model.named_modules()
            if isinstance(m, Float8Linear)
        }
        planned = float8_weights(c.report.modules, Float8.from_dict(spec)) if spec else set()
        assert converted == planned and bool(planned) == bool(spec)
        assert "output.weight" not in planned
        gather = [
            m.config.enable_fsdp_float8_all_gather
            for m in model.modules()
            if isinstance(m, Float8Linear)
        ]
        assert set(gather) <= {bool(spec and spec["enable_fsdp_float8_all_gather"])}


def test_compile_code_compiles_the_planned_blocks(
    fake_pg: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each block compiled in place, as planned (dynamo's eager backend: inductor's C++ on a
    CPU takes minutes), FSDP's events as planned around them."""
    compile_module = nn.Module.compile

    def eager(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        compile_module(self, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(nn.Module, "compile", eager)
    torch._dynamo.reset()
    cands = _tune(allow=("compile",), knobs=("compile",))
    (c,) = [c for c in cands if c.knobs["compile"] != "off"]
    assert c.report.config.compile == ("TransformerBlock",)
    model, real, _ = run(c, _llama)
    assert_ran_as_planned(c, real)
    compiled = [
        n
        for n, m in model.named_modules()
        if getattr(m, "_compiled_call_impl", None) is not None
        and isinstance(m, tp_models.TransformerBlock)
    ]
    assert compiled == ["layers.0", "layers.1"]
    assert not [
        m for m in model.modules()
        if getattr(m, "_compiled_call_impl", None) is not None
        and not isinstance(m, tp_models.TransformerBlock)
    ]  # fmt: skip
