"""The bundled example model: runs for real on CPU, and analyses on meta."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import BackwardPrefetch

from fsdpviz.examples import (
    DecoderLayer,
    ExampleConfig,
    example_analysis,
    example_inputs,
    example_model,
)

TINY = ExampleConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=3, num_heads=2)


def test_cpu_forward_and_backward() -> None:
    torch.manual_seed(0)
    model = example_model(TINY, device="cpu")
    inputs = example_inputs(TINY, batch=2, seq=5, device="cpu")
    assert inputs["input_ids"].dtype == torch.long
    assert inputs["input_ids"].shape == (2, 5)
    logits = model(**inputs)
    assert logits.shape == (2, 5, TINY.vocab_size)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = example_model(TINY, device="cpu")
    ids = example_inputs(TINY, batch=1, seq=6, device="cpu")["input_ids"]
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % TINY.vocab_size
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_module_names_and_meta_default() -> None:
    model = example_model(TINY)
    names = dict(model.named_modules())
    for name in (
        "embed_tokens",
        "layers.0.input_layernorm",
        "layers.0.self_attn.q_proj",
        "layers.0.self_attn.o_proj",
        "layers.0.post_attention_layernorm",
        "layers.0.mlp.gate_proj",
        "layers.0.mlp.down_proj",
        "norm",
        "lm_head",
    ):
        assert name in names
    assert isinstance(names["layers.2"], DecoderLayer)
    assert all(p.is_meta for p in model.parameters())
    assert example_inputs(TINY)["input_ids"].is_meta


def test_tied_embeddings() -> None:
    untied = example_model(TINY)
    assert untied.lm_head.weight is not untied.embed_tokens.weight
    tied = example_model(ExampleConfig(tie_word_embeddings=True, num_layers=1))
    assert tied.lm_head.weight is tied.embed_tokens.weight
    report = example_analysis(config=ExampleConfig(tie_word_embeddings=True, num_layers=2))
    assert report.unit("").shared_params == {"lm_head.weight": "embed_tokens.weight"}


def test_meta_analysis_defaults() -> None:
    report = example_analysis(config=TINY)
    n = TINY.num_layers
    assert report.forward_order == ["", *(f"layers.{i}" for i in range(n))]
    assert [u.module for u in report.units] == ["", *(f"layers.{i}" for i in range(n))]
    assert report.config["world_size"] == 8
    assert report.config["backward_prefetch"] == "BACKWARD_PRE"
    assert "DecoderLayer" in report.config["auto_wrap_policy"]
    assert report.config["trace"] == "meta"
    assert len(report.iterations) == 2
    assert report.warnings == []


def test_meta_analysis_overrides() -> None:
    report = example_analysis(
        config=TINY, world_size=16, backward_prefetch=BackwardPrefetch.BACKWARD_POST
    )
    assert report.config["world_size"] == 16
    assert report.config["backward_prefetch"] == "BACKWARD_POST"
    default = example_analysis()
    assert len(default.units) == ExampleConfig().num_layers + 1
