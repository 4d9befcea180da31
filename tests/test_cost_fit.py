"""Will it fit: the memory model's peak against the modelled machine's device memory."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch
from torch import nn

import fsdpviz
from fsdpviz.cost import machine, memory_model
from fsdpviz.cost.fit import (
    CUDA_CONTEXT_BYTES,
    NCCL_BYTES_PER_GROUP,
    first_fix,
    machine_of,
    process_groups,
    runtime_overhead,
)
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.replan import replay
from fsdpviz.schema.memory import size_text

GiB = 2**30
# About 1.5 GiB of activations per sample of 4,096 tokens: 64 samples need ~95 GiB per rank,
# more than an H100's 80 GiB and less than an H200's 141 GiB; 32 samples ~48 GiB.
CONFIG = ExampleConfig(
    vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_layers=2, num_heads=8
)


def _analyze(batch: int, **kwargs: Any) -> fsdpviz.Report:
    with torch.device("meta"):
        model = example_model(CONFIG)
    ids = torch.zeros(batch, 4096, dtype=torch.long)
    return fsdpviz.analyze(model, ids, fully_shard=[DecoderLayer], world_size=8, **kwargs)


@pytest.fixture(scope="module")
def too_big() -> fsdpviz.Report:
    return _analyze(64)


@pytest.fixture(scope="module")
def fitting() -> fsdpviz.Report:
    return _analyze(32)


def test_a_plan_that_fits_an_h100(fitting: fsdpviz.Report) -> None:
    mem = fitting.memory
    assert mem.capacity == 80 * GiB and mem.machine == "H100 SXM 80GB"
    assert mem.overhead == CUDA_CONTEXT_BYTES + NCCL_BYTES_PER_GROUP == int(1.5 * GiB)
    assert mem.usable == mem.capacity - mem.overhead
    needed = max(mem.peak["bytes"], mem.reserved["bytes"])
    assert mem.needed == needed and mem.reserved["bytes"] >= mem.peak["bytes"]
    assert mem.headroom == mem.usable - needed and mem.headroom > 20 * GiB
    assert mem.fits
    assert "out_of_memory" not in [w.code for w in fitting.warnings]
    text = mem.summary().splitlines()[1]
    assert text.startswith("fits in H100 SXM 80GB: needs ") and "headroom" in text
    d = mem.to_dict()
    assert (d["capacity"], d["fits"], d["headroom"]) == (80 * GiB, True, mem.headroom)
    json.dumps(d)


def test_a_plan_that_does_not_fit_an_h100_is_warned(too_big: fsdpviz.Report) -> None:
    mem = too_big.memory
    assert not mem.fits and mem.peak["bytes"] > 80 * GiB and mem.headroom < 0
    assert mem.headroom == mem.usable - mem.reserved["bytes"]
    assert mem.summary().splitlines()[1].startswith("does not fit in H100 SXM 80GB: needs ")
    [warning] = [w for w in too_big.warnings if w.code == "out_of_memory"]
    msg = warning.message
    # the peak, where it happens, the capacity and the first thing to try
    assert msg.startswith("does not fit in H100 SXM 80GB: peak ")
    assert size_text(mem.peak["bytes"]) in msg and mem.peak["where"] in msg
    assert "80 GiB less 1.5 GiB for the CUDA context and NCCL leaves 78.5 GiB" in msg
    assert f"({size_text(-mem.headroom)} short)" in msg
    assert (
        "First try: activation checkpointing of each DecoderLayer with "
        "activation_checkpointing=[DecoderLayer] (activations and temporaries hold" in msg
    )
    assert warning.fix == {"activation_checkpointing": ["DecoderLayer"]}
    index = mem.peak["event"]
    assert warning.units == [too_big.iterations[-1][index].unit]
    # in words wherever the report is summarised
    assert "warning [out_of_memory]: does not fit in H100 SXM 80GB" in too_big.summary()


def test_the_machine_asked_for_is_the_one_checked_and_timed(too_big: fsdpviz.Report) -> None:
    h200 = _analyze(64, machine="h200")
    assert h200.config.machine == "h200" and h200.config.to_dict()["machine"] == "h200"
    assert h200.memory.capacity == 141 * GiB and h200.memory.fits
    assert "out_of_memory" not in [w.code for w in h200.warnings]
    assert h200.timeline.machine["name"] == "H200 SXM 141GB"
    assert fsdpviz.cost.timeline(h200).machine["name"] == "H200 SXM 141GB"
    # the same plan, one memory model: only the capacity differs
    assert h200.memory.peak == too_big.memory.peak
    # another machine asked of the cost model directly
    assert memory_model(too_big, machine="h200").fits
    assert not memory_model(h200, machine="a100-40gb").fits
    # read back, the report still knows its machine
    again = fsdpviz.Report.from_json(h200.to_json())
    assert again.memory.capacity == 141 * GiB and again.memory.fits


def test_a_custom_machine_is_kept_with_its_constants() -> None:
    mine = machine("h100", memory_gib=96.0, name="H100 96GB")
    report = _analyze(64, machine=mine)
    assert isinstance(report.config.machine, dict)
    assert machine_of(report) == mine
    assert report.memory.capacity == 96 * GiB and report.memory.machine == "H100 96GB"
    assert report.memory.fits == (report.memory.needed <= 96 * GiB - report.memory.overhead)
    again = fsdpviz.Report.from_json(report.to_json())
    assert machine_of(again) == mine


def test_an_unknown_machine_fails_before_tracing() -> None:
    class Untraceable(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("traced")

    with pytest.raises(fsdpviz.ConfigError, match="unknown GPU preset 'h1000'; use one of"):
        fsdpviz.analyze(Untraceable(), torch.zeros(2), machine="h1000")
    with pytest.raises(fsdpviz.ConfigError, match="machine must be a GPU preset name"):
        fsdpviz.analyze(Untraceable(), torch.zeros(2), machine=80)


class Wide(nn.Module):
    """Eight blocks of 1.1 B parameters (on meta): sharded over few ranks, parameters,
    gradients and AdamW states (16 bytes per parameter in fp32) dominate."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(33_000, 33_000, bias=False) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def test_a_replay_warns_for_its_own_plan() -> None:
    with torch.device("meta"):
        model = Wide()
    x = torch.zeros(1, 33_000, device="meta")
    spread = fsdpviz.analyze(model, x, fully_shard=[nn.Linear], world_size=64)
    assert spread.memory.fits and not [w for w in spread.warnings if w.code == "out_of_memory"]
    before = list(spread.warnings)
    few = replay(spread, world_size=2)
    assert spread.warnings == before  # the report replayed is left as it was
    assert few.memory.peak["dominant"] in ("optimizer", "sharded_params", "sharded_grads")
    [warning] = [w for w in few.warnings if w.code == "out_of_memory"]
    assert first_fix(few, few.memory) in warning.message
    found = re.search(
        r"First try: more ranks with world_size=(\d+) \(.* about \1 ranks instead of 2 would "
        "fit",
        warning.message,
    )
    assert found is not None, warning.message
    assert warning.fix == {"world_size": int(found.group(1))}
    # the advice holds: that many ranks fit
    enough = replay(spread, world_size=int(found.group(1)))
    assert enough.memory.fits
    # a replay that fits keeps no warning from the plan it came from
    assert not [w for w in replay(few, world_size=64).warnings if w.code == "out_of_memory"]


def test_first_fix_follows_what_dominates() -> None:
    """Units kept unsharded from forward to backward: resharding them is the fix, and it fits."""
    with torch.device("meta"):
        model = Wide()
    x = torch.zeros(1, 33_000, device="meta")
    kept = fsdpviz.analyze(
        model, x, fully_shard=[nn.Linear], world_size=64, reshard_after_forward=False,
        machine="a100-40gb",
    )  # fmt: skip
    assert not kept.memory.fits and kept.memory.peak["dominant"] == "unsharded_params"
    [warning] = [w for w in kept.warnings if w.code == "out_of_memory"]
    assert warning.message.startswith("does not fit in A100 SXM 40GB: peak ")
    assert (
        "First try: resharding after forward with reshard_after_forward=True (8 unit(s) keep "
        "their parameters" in warning.message
    )
    assert warning.fix == {"reshard_after_forward": True}
    assert replay(kept, reshard_after_forward=True).memory.fits


def test_process_groups_and_overhead(too_big: fsdpviz.Report) -> None:
    assert process_groups(too_big) == 1
    alone = replay(too_big, world_size=1)
    assert process_groups(alone) == 0 and runtime_overhead(alone) == CUDA_CONTEXT_BYTES
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    with torch.device("meta"):
        model = example_model(ExampleConfig())
    hybrid = fsdpviz.analyze(
        model,
        torch.zeros(1, 16, dtype=torch.long),
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        shard_group_size=8,
        world_size=16,
    )
    assert process_groups(hybrid) == 2
    assert hybrid.memory.overhead == CUDA_CONTEXT_BYTES + 2 * NCCL_BYTES_PER_GROUP


def test_recordings_are_not_warned(fitting: fsdpviz.Report) -> None:
    from dataclasses import replace

    from fsdpviz.cost.fit import check_fit

    recorded = replace(fitting, source="recording", warnings=[])
    check_fit(recorded)
    assert recorded.warnings == []


def test_re_planning_keeps_the_machine() -> None:
    """The explorer's re-plans (a stored trace, a new trace, a replay) are all planned for the
    machine asked for, and each checks its own fit."""
    from fsdpviz.replan.replanner import PlanOptions, Replanner

    config = ExampleConfig(num_layers=3)
    planner = Replanner(example_model(config), example_inputs(config), machine="h200")
    base = PlanOptions(layer_classes=("DecoderLayer",), world_size=8)
    paths = []
    for plan in (
        lambda: planner.plan(base),
        lambda: planner.profiled(base),
        lambda: planner.plan(base.replace(world_size=32)),
    ):
        report = plan()
        paths.append(planner.last_path)
        assert report.config.machine == "h200" and report.memory.capacity == 141 * GiB
        assert report.memory.fits and "out_of_memory" not in [w.code for w in report.warnings]
    assert paths == ["stored trace", "trace", "replay"]


def _llama(layers: int = 4) -> tuple[nn.Module, type[nn.Module]]:
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=4,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config), LlamaDecoderLayer


def test_advice_follows_what_the_plan_already_has() -> None:
    """Checkpointing on: the advice is not to checkpoint, but what is left, each step of it
    holding: the KV cache a Hugging Face model keeps by default (use_cache=True, measured),
    then float32 activations (bfloat16 mixed precision fits)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model, layer = _llama()
    ids = torch.zeros(128, 2048, dtype=torch.long)
    plan: dict[str, Any] = {
        "fully_shard": [layer], "world_size": 8, "activation_checkpointing": [layer],
        "machine": "a100-40gb", "progress": False,
    }  # fmt: skip
    cached = fsdpviz.analyze(model, {"input_ids": ids}, **plan)
    assert cached.config.activation_checkpointing == {
        "mode": "full", "classes": ["LlamaDecoderLayer"], "modules": 4,
    }  # fmt: skip
    again = fsdpviz.Report.from_json(cached.to_json())
    assert again.config.activation_checkpointing == cached.config.activation_checkpointing
    [cache] = [w for w in cached.warnings if w.code == "use_cache_checkpointed"]
    assert cache.fix == {"use_cache": False} and cache.frees is not None and cache.frees > 0
    assert "the model returns a KV cache (use_cache=True" in cache.message
    assert (
        "Training needs no cache: use_cache=False (as gradient_checkpointing_enable() sets "
        f"it) takes {size_text(cache.frees)} per rank off the peak" in cache.message
    )
    [oom] = [w for w in cached.warnings if w.code == "out_of_memory"]
    assert "First try: no KV cache with use_cache=False" in oom.message, oom.message
    assert "activation checkpointing of each" not in oom.message
    assert oom.fix == {"use_cache": False}
    assert again.warnings == cached.warnings  # fix and frees are kept

    no_cache = fsdpviz.analyze(model, {"input_ids": ids, "use_cache": False}, **plan)
    assert no_cache.memory.peak["bytes"] == cached.memory.peak["bytes"] - cache.frees
    assert "use_cache_checkpointed" not in [w.code for w in no_cache.warnings]
    [oom] = [w for w in no_cache.warnings if w.code == "out_of_memory"]
    assert (
        "First try: bfloat16 mixed precision with "
        "mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16) (activations and "
        "temporaries hold" in oom.message
    ), oom.message
    assert "LlamaDecoderLayer already checkpointed" in oom.message
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    bf16 = fsdpviz.analyze(model, {"input_ids": ids, "use_cache": False}, mp_policy=mp, **plan)
    assert bf16.memory.fits, bf16.memory.summary()


def test_a_cache_costs_nothing_without_checkpointing() -> None:
    model, layer = _llama(2)
    report = fsdpviz.analyze(
        model, torch.zeros(2, 64, dtype=torch.long), fully_shard=[layer], progress=False
    )
    assert report.config.activation_checkpointing is None
    assert "activation_checkpointing" not in report.config.to_dict()
    assert "use_cache_checkpointed" not in [w.code for w in report.warnings]
