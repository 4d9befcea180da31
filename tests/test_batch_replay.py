"""A plan at any micro-batch from traces at two (fsdpviz.replan.batch_replay): each report
``capture.at(b)`` gives is, field for field, the one ``analyze`` makes at ``b``."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
import tp_models
from hf_models import gpt2_model, llama_model
from torch.distributed.fsdp import (
    CPUOffload,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.utils.checkpoint import checkpoint
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import fsdpviz
from fsdpviz.cost.hardware import machine
from fsdpviz.errors import ConfigError
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_model
from fsdpviz.replan.batch_replay import BatchCapture, batch_capture
from fsdpviz.schema.checkpointing import SelectiveCheckpoint
from fsdpviz.trace.probe_records import recording_moments

CONFIG = ExampleConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4
)
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _ids(batch: int, vocab: int = 256, seq: int = 32) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g)}


def _llama() -> torch.nn.Module:
    return llama_model(2, use_cache=False)


def _gpt2() -> torch.nn.Module:
    return gpt2_model(2, use_cache=False)


class _TTLlama(tp_models.Llama):
    """torchtitan's Llama (tp_models) taking the tokens as a keyword."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = checkpoint(layer, h, use_reentrant=False) if self.checkpointed else layer(h)
        return self.output(self.norm(h))


def _tokens(batch: int) -> dict[str, Any]:
    return {"tokens": _ids(batch, vocab=64, seq=16)["input_ids"]}


def _hf_ids(batch: int) -> dict[str, Any]:
    ids = _ids(batch, vocab=96, seq=12)["input_ids"]
    return {"input_ids": ids, "labels": ids}


@functools.cache
def _torchtitan(batch: int, cp: int = 2) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """torchtitan's debug Llama 3 over ``cp`` ranks of context parallelism (its loss takes
    the labels of ``batch`` samples)."""
    job: dict[str, Any] = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": batch, "seq_len": 64},
        "parallelism": {"context_parallel_degree": cp},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tt = fsdpviz.from_torchtitan(job, world_size=8)
    return tt.model, tt.inputs, dict(tt.config)


class _SecondLayerTwice(torch.nn.Module):
    """The example model with its second layer run twice per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.model = example_model(CONFIG)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.embed_tokens(input_ids)
        for i in (0, 1, 1):
            x = m.layers[i](x)
        out: torch.Tensor = m.lm_head(m.norm(x))
        return out


Case = tuple[
    Callable[[], torch.nn.Module],
    Callable[[int], Any],
    dict[str, Any] | Callable[[int], dict[str, Any]],  # analyze's keywords (at a batch)
]

CASES: dict[str, Case] = {
    "example, FSDP1": (
        lambda: example_model(CONFIG), _ids,
        {"auto_wrap_policy": ModuleWrapPolicy({DecoderLayer})},
    ),
    "example, FSDP2, bf16, checkpointed": (
        lambda: example_model(CONFIG), _ids,
        {"fully_shard": [DecoderLayer], "mp_policy": BF16,
         "activation_checkpointing": SelectiveCheckpoint([DecoderLayer])},
    ),
    "Llama (HF), FSDP2, checkpointed": (
        _llama, _hf_ids,
        {"fully_shard": [LlamaDecoderLayer], "activation_checkpointing": [LlamaDecoderLayer]},
    ),
    "GPT-2 (HF), FSDP1, bf16": (
        _gpt2, _hf_ids,
        {"auto_wrap_policy": ModuleWrapPolicy({GPT2Block}),
         "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16)},
    ),
    "torchtitan Llama, FSDP2 x TP 2": (
        lambda: _TTLlama(layers=2), _tokens,
        {"fully_shard": [tp_models.TransformerBlock], "mesh": ("dp_shard", 4, "tp", 2),
         "parallelize_plan": tp_models.whole_plan(), "world_size": 8},
    ),
    "example, FSDP2, float8 all-gather": (
        lambda: example_model(CONFIG), _ids,
        {"fully_shard": [DecoderLayer], "mp_policy": BF16,
         "float8": {"enable_fsdp_float8_all_gather": True}},
    ),
    "example, FSDP2, float8 rowwise, checkpointed, compiled": (
        lambda: example_model(CONFIG), _ids,
        {"fully_shard": [DecoderLayer], "mp_policy": BF16, "compile": True,
         "float8": {"recipe_name": "rowwise"}, "activation_checkpointing": [DecoderLayer]},
    ),
    "torchtitan Llama 3, FSDP2 x CP 2": (
        lambda: _torchtitan(2)[0], lambda b: _torchtitan(b)[1], lambda b: _torchtitan(b)[2],
    ),
    "example, a layer run twice, FSDP1 NO_SHARD offloaded, original parameters": (
        _SecondLayerTwice, _ids,
        {"auto_wrap_policy": ModuleWrapPolicy({DecoderLayer}), "use_orig_params": True,
         "sharding_strategy": ShardingStrategy.NO_SHARD,
         "cpu_offload": CPUOffload(offload_params=True)},
    ),
    "example, a layer run twice, FSDP1, bf16": (
        _SecondLayerTwice, _ids,
        {"auto_wrap_policy": ModuleWrapPolicy({DecoderLayer}),
         "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16)},
    ),
    "example, FSDP2, compiled": (
        lambda: example_model(CONFIG), _ids,
        {"fully_shard": [DecoderLayer], "mp_policy": BF16, "compile": True},
    ),
}  # fmt: skip


def _analyze(case: Case, batch: int, moments: bool = False) -> fsdpviz.Report:
    build, inputs, given = case
    kwargs = {"world_size": 8, "progress": False, **(given(batch) if callable(given) else given)}
    if not moments:
        return fsdpviz.analyze(build(), inputs(batch), **kwargs)
    with recording_moments():
        return fsdpviz.analyze(build(), inputs(batch), **kwargs)


def _capture(case: Case) -> BatchCapture:
    capture = batch_capture(_analyze(case, 3, True), _analyze(case, 2, True), 3, 2)
    assert capture is not None
    return capture


@pytest.mark.parametrize("name", list(CASES))
def test_a_capture_of_two_batches_is_analyze_at_any(name: str) -> None:
    """(The larger batch given first: a capture takes them in either order.)"""
    case = CASES[name]
    capture = _capture(case)
    for batch in (4, 6, 9):
        derived = capture.at(batch)
        assert derived is not None
        assert derived.to_dict() == _analyze(case, batch).to_dict(), batch
    assert capture.at(1) is None  # torch's dims of size 1 are its own case: traced


def test_the_peaks_moment_changes_with_the_batch() -> None:
    """A stretch whose peak is reached at another moment at another batch: a plain line
    through the two traced peaks misses it (a backward stretch of the example's peaks at
    one moment up to 16 samples, at another from 17)."""
    case = CASES["example, FSDP1"]
    low, high = _analyze(case, 2, True), _analyze(case, 3, True)
    capture = batch_capture(low, high, 2, 3)
    assert capture is not None
    assert low.profile is not None and high.profile is not None
    traced = _analyze(case, 24)
    assert traced.profile is not None
    naive = [
        lp + 22 * (hp - lp)
        for lp, hp in zip(
            low.profile.iterations[0].peak, high.profile.iterations[0].peak, strict=True
        )
    ]
    assert naive != traced.profile.iterations[0].peak
    derived = capture.at(24)
    assert derived is not None and derived.to_dict() == traced.to_dict()


def test_traces_without_their_moments_are_not_captured() -> None:
    case = CASES["example, FSDP1"]
    plain = _analyze(case, 2)
    assert plain.profile is not None  # a trace keeps no moments unless asked
    assert all(m is None for step in plain.profile.iterations for m in step.moments)
    assert batch_capture(plain, _analyze(case, 3), 2, 3) is None
    low = _analyze(case, 2, True)
    other = _analyze((case[0], case[1], {"fully_shard": [DecoderLayer]}), 3, True)
    assert batch_capture(low, other, 2, 3) is None  # another plan: nothing pairs
    with pytest.raises(ConfigError, match="two different positive batches"):
        batch_capture(low, low, 2, 2)
    capture = _capture(case)
    with pytest.raises(ConfigError, match="positive int"):
        capture.at(0)


def test_the_fit_is_checked_at_the_batch_asked() -> None:
    """A GPU on which 3 samples fit and 9 do not: the report at 9 warns out_of_memory, as
    analyze's does, where the traces at 2 and 3 did not."""
    h100 = machine("h100")
    build, inputs, kwargs = CASES["example, FSDP1"]
    at = {b: _analyze((build, inputs, {**kwargs, "machine": h100}), b) for b in (3, 9)}
    need = {b: max(r.memory.peak["bytes"], r.memory.reserved["bytes"]) for b, r in at.items()}
    spare = at[3].memory.usable - (need[3] + need[9]) / 2
    small = replace(h100, memory_gib=h100.memory_gib - spare / 2**30)
    case: Case = (build, inputs, {**kwargs, "machine": small})
    low, high = _analyze(case, 2, True), _analyze(case, 3, True)
    assert all(w.code != "out_of_memory" for w in [*low.warnings, *high.warnings])
    capture = batch_capture(low, high, 2, 3)
    assert capture is not None
    derived, traced = capture.at(9), _analyze(case, 9)
    assert derived is not None and derived.to_dict() == traced.to_dict()
    assert "out_of_memory" in [w.code for w in derived.warnings]


def _squares(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().pow(2).mean()


@pytest.mark.parametrize(
    "compiled",
    [
        {"loss": torch.compile(_squares)},
        {"compile": True, "activation_checkpointing": SelectiveCheckpoint([DecoderLayer])},
    ],
    ids=["compiled loss", "compiled selective checkpoints"],
)
def test_what_torchs_partitioner_saves_is_traced(compiled: dict[str, Any]) -> None:
    """torch's min-cut partitioner weighs a compiled region's values by their bytes
    (``torch/_functorch/partitioners.py``, ``get_node_weight``), so what it saves may change
    with the batch (torchtitan's compiled loss of Llama 3 8B saves less at 12 samples than a
    line through 3, 6 and 9 gives): never derived."""
    case: Case = (
        lambda: example_model(CONFIG),
        _ids,
        {"fully_shard": [DecoderLayer], "mp_policy": BF16, **compiled},
    )
    low, high = _analyze(case, 2, True), _analyze(case, 3, True)
    assert low.profile is not None
    assert any(m is not None and m.partitioned for s in low.profile.iterations for m in s.moments)
    assert batch_capture(low, high, 2, 3) is None
