"""Conformance on 2 gloo ranks in the corners where the meta trace used to differ from real
FSDP: both accept a case and plan the same schedule, or both refuse it for the same reason.

- multi-head latent attention (DeepSeek-V3: the value head size differs from the query's);
- Qwen3, Gemma3 and Qwen3-MoE called with ``use_cache=False`` (transformers then reads
  the position ids' values, which meta tensors do not hold);
- FSDP1 and a scalar parameter ("FSDP doesn't support scalar parameters");
- a float32 parameter (left out of mixed precision) meeting bfloat16 activations, which
  the CPU and GPU matmul kernels refuse and the meta kernels did not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fsdp_harness import assert_same_schedule, timeline_collectives
from gloo_worker import corner_cases, spawn_suite

import fsdpviz
from fsdpviz.trace.meta_kernels import DtypeMismatch

pytest.importorskip("transformers")
WORLD_SIZE = 2


@pytest.fixture(scope="module")
def corners(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("corners"), WORLD_SIZE, "corners")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(corner_cases()))
def test_real_fsdp_and_fsdpviz_agree(corners: Path, name: str) -> None:
    case = corner_cases()[name]
    torch.manual_seed(0)
    model, inputs = case.build()
    options = case.options(model)
    refused = [corners / f"{name}-rank{rank}.error.json" for rank in range(WORLD_SIZE)]
    if case.accepts:
        assert not any(p.exists() for p in refused), refused[0].read_text()
        predicted = fsdpviz.analyze(model, inputs, world_size=WORLD_SIZE, loss=case.loss, **options)
        assert predicted.config.api == case.api
        collectives = timeline_collectives(predicted, WORLD_SIZE)
        for rank in range(WORLD_SIZE):
            real = fsdpviz.load(str(corners / f"{name}-rank{rank}.json"))
            assert_same_schedule(real, predicted)
            moved = json.loads((corners / f"{name}-collectives-rank{rank}.json").read_text())
            if case.partial_grads:  # the first of a group's two reduce-scatters moves less
                assert [k for k, _ in moved] == [k for k, _ in collectives]
                differ = [(a, b) for a, b in zip(moved, collectives, strict=True) if a != b]
                assert differ and all(a[0] == "reduce_scatter" and a[1] < b[1]
                                      for a, b in differ)  # fmt: skip
                continue
            assert moved == collectives  # every all-gather's output, reduce-scatter's input
        return
    said = {(e["type"], e["message"]) for e in (json.loads(p.read_text()) for p in refused)}
    assert len(said) == 1, said  # every rank refuses, for the same reason
    ((kind, message),) = said
    with pytest.raises(fsdpviz.FsdpvizError) as err:
        fsdpviz.analyze(model, inputs, world_size=WORLD_SIZE, **options)
    if isinstance(err.value.__cause__, DtypeMismatch):
        # the kernel's words depend on the kernel library the CPU picks: fsdpviz says it in
        # its own, and the real run refused in the forward's kernel
        assert kind == "RuntimeError", (kind, message)
        return
    if case.said is not None:  # real FSDP's message prints the module: its words, then ours
        assert message.startswith(case.said)
        message = case.said
    assert message in str(err.value)


def test_dtype_mismatch_says_which_parameters_and_the_fix() -> None:
    case = corner_cases()["fp32-head-fsdp1"]
    model, inputs = case.build()
    with pytest.raises(fsdpviz.TraceError) as err:
        fsdpviz.analyze(model, inputs, world_size=WORLD_SIZE, **case.options(model))
    text = str(err.value)
    assert "failed in module 'head' (Linear)" in text
    assert "met tensors of two dtypes (mat1 bfloat16, mat2 float32, bias float32)" in text
    assert "The float32 parameters 'head.weight' and 'head.bias' meet bfloat16 tensors" in text
    assert "FSDP casts only the parameters it manages" in text
    assert "model.get_submodule('head').to(torch.bfloat16)" in text
    assert err.value.module == "head"


def test_scalar_parameter_names_the_unit_and_the_fix() -> None:
    case = corner_cases()["scalar-fsdp1"]
    model, inputs = case.build()
    with pytest.raises(fsdpviz.FSDPConfigError) as err:
        fsdpviz.analyze(model, inputs, **case.options(model))
    assert str(err.value).startswith(
        "unit 'blocks.0': FSDP doesn't support scalar parameters. Change scale to a 1D tensor"
    )
    ignored = [model.get_parameter(f"blocks.{i}.scale") for i in range(2)]
    report = fsdpviz.analyze(model, inputs, ignored_states=ignored, **case.options(model))
    assert not any("scale" in p for u in report.units for p in u.params)
