"""Remembered shape-only results on meta give the very plans the kernels give: cold, warm,
and without the cache, for models of several kinds (compiled and float8 fused kernels,
checkpointing, mixed precision, both APIs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import hf_models
import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.trace import meta_cache

CONFIG = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=256, num_heads=4)
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


@pytest.fixture
def no_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    def off() -> None:
        monkeypatch.setattr(meta_cache, "run", lambda func, args, kwargs: func(*args, **kwargs))

    yield off


def _example(**kwargs: Any) -> Callable[[], dict[str, Any]]:
    return lambda: fsdpviz.analyze(
        example_model(CONFIG), example_inputs(CONFIG), progress=False, **kwargs
    ).to_dict()


def _hf(build: Callable[[], Any], **kwargs: Any) -> Callable[[], dict[str, Any]]:
    def plan() -> dict[str, Any]:
        model, inputs, block = build()
        return fsdpviz.analyze(
            model, inputs, fully_shard=[block], progress=False, **kwargs
        ).to_dict()

    return plan


PLANS = {
    "fsdp2 bf16 per-op checkpointing compiled float8": _example(
        fully_shard=[DecoderLayer],
        mp_policy=BF16,
        activation_checkpointing=fsdpviz.SelectiveCheckpoint([DecoderLayer]),
        compile=[DecoderLayer],
        float8=True,
    ),
    "fsdp1 every 2nd block checkpointed": _example(
        activation_checkpointing=fsdpviz.CheckpointEvery([DecoderLayer], 2), world_size=4
    ),
    "gpt2": _hf(hf_models.gpt2),
    "llama bf16": _hf(hf_models.llama, mp_policy=BF16),
    "t5": _hf(hf_models.t5),
}


@pytest.mark.parametrize("name", PLANS)
def test_the_cache_changes_no_number(name: str, no_cache: Callable[[], None]) -> None:
    plan = PLANS[name]
    meta_cache.clear()
    cold = plan()
    warm = plan()
    no_cache()
    kernels = plan()
    assert cold == kernels
    assert warm == kernels


PLAN_TWICE = {
    "hf llama": (
        "model, inputs, block = hf_models.llama()\n"
        "plan = lambda: fsdpviz.analyze(model, inputs, fully_shard=[block], progress=False)\n"
    ),
    # its first trace imports torch's Dynamo (torch._disable_dynamo does, on first use)
    "tensor parallel": (
        "plan = lambda: fsdpviz.analyze(tp_models.Llama(), tp_models.tokens(), progress=False,\n"
        "    fully_shard=tp_models.LAYERS, mesh=('dp_shard', 4, 'tp', 2),\n"
        "    parallelize_plan=tp_models.whole_plan())\n"
    ),
}


@pytest.mark.parametrize("name", PLAN_TWICE)
def test_a_process_first_plan_is_its_later_ones(tmp_path: Any, name: str) -> None:
    """Nothing a trace does once per process (a library's probe of its kernels, the cache's
    first misses, an import) shows in the plan: a fresh interpreter's first plan equals its
    second."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "twice.py"
    script.write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import fsdpviz, hf_models, tp_models\n"
        + PLAN_TWICE[name]
        + "plans = [plan().to_dict() for _ in range(2)]\n"
        "print(json.dumps(plans[0] == plans[1]))\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "true"
