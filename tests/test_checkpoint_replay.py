"""Every n-th block checkpointed from two traces (fsdpviz.replan.checkpoint_replay): each
report ``capture.every(n)`` gives is, field for field, the one ``analyze`` makes with
``CheckpointEvery([Block], n)``."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hf_models import gpt2_model, llama_model
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import fsdpviz
from fsdpviz.errors import ConfigError
from fsdpviz.examples import DecoderLayer, ExampleConfig, ExampleModel, example_model
from fsdpviz.replan.checkpoint_replay import CheckpointCapture, checkpoint_capture
from fsdpviz.schema.checkpointing import CheckpointEvery, SelectiveCheckpoint
from fsdpviz.trace.probe_records import recording_moments

CONFIG = ExampleConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=5, num_heads=4
)
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _ids(vocab: int = 256, seq: int = 32, labels: bool = False) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, seq), generator=g)
    return {"input_ids": ids, "labels": ids} if labels else {"input_ids": ids}


def _llama() -> torch.nn.Module:
    return llama_model(4, use_cache=False)


def _gpt2() -> torch.nn.Module:
    return gpt2_model(3, use_cache=False)


@functools.cache
def _torchtitan() -> tuple[torch.nn.Module, Any, dict[str, Any], type[torch.nn.Module]]:
    """torchtitan's debug Llama 3 (6 blocks, its freqs_cis a positional input of each), its
    job's keywords without checkpointing, and its block."""
    job = {"model": {"name": "llama3", "flavor": "debugmodel"},
           "training": {"local_batch_size": 2, "seq_len": 32}}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tt = fsdpviz.from_torchtitan(job, world_size=8)
    kwargs = dict(tt.config)
    kwargs.pop("activation_checkpointing", None)
    kwargs.pop("world_size", None)
    block = type(next(iter(tt.model.layers.values())))
    return tt.model, tt.inputs, kwargs, block


Case = tuple[
    Callable[[], torch.nn.Module], Callable[[], Any], type[torch.nn.Module], dict[str, Any]
]

CASES: dict[str, Case] = {
    "example, FSDP2": (
        lambda: example_model(CONFIG), _ids, DecoderLayer, {"fully_shard": [DecoderLayer]},
    ),
    "example, FSDP2, bf16": (
        lambda: example_model(CONFIG), _ids, DecoderLayer,
        {"fully_shard": [DecoderLayer], "mp_policy": BF16},
    ),
    "example, FSDP1": (
        lambda: example_model(CONFIG), _ids, DecoderLayer,
        {"auto_wrap_policy": ModuleWrapPolicy({DecoderLayer})},
    ),
    "example, FSDP1, bf16": (
        lambda: example_model(CONFIG), _ids, DecoderLayer,
        {"auto_wrap_policy": ModuleWrapPolicy({DecoderLayer}),
         "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16)},
    ),
    "torchtitan Llama 3, FSDP2, bf16": (
        lambda: _torchtitan()[0], lambda: _torchtitan()[1], _torchtitan()[3], _torchtitan()[2],
    ),
    "GPT-2 (HF), FSDP1, bf16": (
        _gpt2, lambda: _ids(96, 12, True), GPT2Block,
        {"auto_wrap_policy": ModuleWrapPolicy({GPT2Block}),
         "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16)},
    ),
    "GPT-2 (HF), FSDP2": (
        _gpt2, lambda: _ids(96, 12, True), GPT2Block, {"fully_shard": [GPT2Block]},
    ),
}  # fmt: skip


def _analyze(case: Case, checkpointing: Any, moments: bool = False) -> fsdpviz.Report:
    build, inputs, _, given = case
    with recording_moments() if moments else _nothing():
        return fsdpviz.analyze(
            build(), inputs(), world_size=8, progress=False,
            activation_checkpointing=checkpointing, **given,
        )  # fmt: skip


@functools.cache
def _capture(name: str) -> CheckpointCapture:
    case = CASES[name]
    capture = checkpoint_capture(_analyze(case, None), _analyze(case, [case[2]]))
    assert capture is not None
    return capture


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: Any) -> None:
        return None


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_every_nth_block_is_analyze(name: str, n: int) -> None:
    case = CASES[name]
    derived = _capture(name).every(n)
    assert derived.to_dict() == _analyze(case, CheckpointEvery([case[2]], n)).to_dict()


def test_every_block_and_none_give_the_traces_back() -> None:
    case = CASES["example, FSDP2"]
    capture = _capture("example, FSDP2")
    assert capture.blocks == [f"layers.{i}" for i in range(5)]
    assert capture.every(1).to_dict() == _analyze(case, [DecoderLayer]).to_dict()
    assert capture.every(6).to_dict() == _analyze(case, None).to_dict()  # more than blocks
    assert (
        capture.every(6).to_dict() == _analyze(case, CheckpointEvery([DecoderLayer], 6)).to_dict()
    )
    with pytest.raises(ConfigError, match="positive int"):
        capture.every(0)


def test_the_moments_are_carried() -> None:
    """Traces that kept their moments give a plan with the moments its trace keeps, each
    stretch's activations shifted as its counters are."""
    case = CASES["example, FSDP2, bf16"]
    capture = checkpoint_capture(_analyze(case, None, True), _analyze(case, [DecoderLayer], True))
    assert capture is not None
    derived = capture.every(2)
    traced = _analyze(case, CheckpointEvery([DecoderLayer], 2), True)
    assert derived.to_dict() == traced.to_dict()
    assert derived.profile is not None and traced.profile is not None
    for mine, theirs in zip(derived.profile.iterations, traced.profile.iterations, strict=True):
        assert mine.moments == theirs.moments and any(m is not None for m in mine.moments)
    # with one trace's moments alone, none (as a trace made without them)
    one = checkpoint_capture(_analyze(case, None), _analyze(case, [DecoderLayer], True))
    assert one is not None
    plan = one.every(2)
    assert plan.to_dict() == traced.to_dict()
    assert plan.profile is not None
    assert all(m is None for step in plan.profile.iterations for m in step.moments)


def test_refused_where_not_whole_blocks_or_one_unit_each() -> None:
    """Per-operator checkpointing is no block's whole forward; blocks grouped two to a unit
    would put two blocks' compute, each from another trace, in one stretch."""
    case = CASES["example, FSDP2"]
    none = _analyze(case, None)
    assert checkpoint_capture(none, _analyze(case, SelectiveCheckpoint([DecoderLayer]))) is None
    assert checkpoint_capture(none, none) is None

    pairs: Case = (
        lambda: example_model(CONFIG),
        _ids,
        DecoderLayer,
        {"fully_shard": [("layers.0", "layers.1"), ("layers.2", "layers.3"), "layers.4"]},
    )
    grouped = (_analyze(pairs, None), _analyze(pairs, [DecoderLayer]))
    assert checkpoint_capture(*grouped) is None


def test_refused_for_a_compiled_job() -> None:
    """torch's partitioner decides what a compiled region saves, by its values' bytes."""
    case = CASES["example, FSDP2, bf16"]
    build, inputs, block, given = case
    compiled = (build, inputs, block, {**given, "compile": True})
    assert checkpoint_capture(_analyze(compiled, None), _analyze(compiled, [block])) is None


LLAMA: dict[str, dict[str, Any]] = {
    "FSDP2": {"fully_shard": [LlamaDecoderLayer]},
    "FSDP1": {"auto_wrap_policy": ModuleWrapPolicy({LlamaDecoderLayer})},
}


@functools.cache
def _llama_capture(api: str) -> tuple[fsdpviz.Report, CheckpointCapture | None]:
    case: Case = (_llama, lambda: _ids(96, 12, True), LlamaDecoderLayer, LLAMA[api])
    full = _analyze(case, [LlamaDecoderLayer])
    return full, checkpoint_capture(_analyze(case, None), full)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("api", list(LLAMA))
def test_hugging_face_llama_whose_checkpoints_hold_keyword_inputs(api: str, n: int) -> None:
    """Hugging Face's Llama passes ``position_embeddings`` (cos, sin, which each layer saves
    too) and ``position_ids`` (which none saves) to each decoder layer as keywords. torch's
    non-reentrant checkpoint saves only the positional inputs; its ``recompute_fn`` closes
    over the keywords, held with the frame until the region's backward lets go of it. So
    ``position_ids`` is held until the first checkpointed block's frame lets go, in its
    backward, where the trace without checkpointing lets go of it as the forward returns:
    the plans are ``analyze``'s field for field, the first checkpointed block's peaks taken
    as they were before its frame let go where they were reached after it. Where the last
    layer is not checkpointed (every 3rd), the trace without checkpointing lets go of
    ``position_ids`` as the forward returns, in the last layer's last forward stretch: that
    stretch is the checkpointed trace's, which holds it on, as the plan does."""
    case: Case = (_llama, lambda: _ids(96, 12, True), LlamaDecoderLayer, LLAMA[api])
    full, capture = _llama_capture(api)
    assert capture is not None and capture.derives(n)
    derived = capture.every(n)
    assert derived.to_dict() == _analyze(case, CheckpointEvery([LlamaDecoderLayer], n)).to_dict()
    if n == 1:
        assert derived.to_dict() == full.to_dict()


def test_the_moments_are_carried_where_keywords_are_kept() -> None:
    """The moments of the first checkpointed block's stretch after its frame let go of the
    keyword inputs hold that much less."""
    case: Case = (_llama, lambda: _ids(96, 12, True), LlamaDecoderLayer, LLAMA["FSDP1"])
    none, full = _analyze(case, None, True), _analyze(case, [LlamaDecoderLayer], True)
    capture = checkpoint_capture(none, full)
    assert capture is not None
    for n in (2, 3, 4):
        derived = capture.every(n)
        traced = _analyze(case, CheckpointEvery([LlamaDecoderLayer], n), True)
        assert derived.to_dict() == traced.to_dict()
        assert derived.profile is not None and traced.profile is not None
        for mine, theirs in zip(derived.profile.iterations, traced.profile.iterations, strict=True):
            assert mine.moments == theirs.moments and any(m is not None for m in mine.moments)


@pytest.mark.parametrize("api", list(LLAMA))
@pytest.mark.parametrize("layers", [3, 5])
def test_the_last_block_not_checkpointed_where_keywords_are_kept(api: str, layers: int) -> None:
    """Every 2nd of 3 decoder layers, every 2nd to 4th of 5: the trace without checkpointing
    lets go of ``position_ids`` in the last layer's last forward stretch, as the forward
    returns, at a moment it does not show, where the plan's first checkpointed layer's frame
    still holds it: that stretch is taken from the checkpointed trace, which holds it too,
    with the deltas of the layers not checkpointed (see test_hugging_face_llama_...: every
    3rd of 4). Moments recorded, they are carried too."""
    case: Case = (
        lambda: llama_model(layers, use_cache=False), lambda: _ids(96, 12, True),
        LlamaDecoderLayer, LLAMA[api],
    )  # fmt: skip
    none, full = _analyze(case, None, True), _analyze(case, [LlamaDecoderLayer], True)
    capture = checkpoint_capture(none, full)
    assert capture is not None
    for n in range(2, layers):
        assert capture.derives(n)
        traced = _analyze(case, CheckpointEvery([LlamaDecoderLayer], n), True)
        assert capture.every(n).to_dict() == traced.to_dict()


@pytest.mark.parametrize("api", list(LLAMA))
def test_refused_where_the_keywords_release_stretch_does_not_agree(api: str) -> None:
    """Where the stretch in which the trace without checkpointing lets go of the keyword
    inputs is not the checkpointed trace's with the blocks' saves (here: other FLOPs, as a
    trace whose model does more there would have), every 3rd of 4 layers is refused; every
    2nd (the last checkpointed) still derives. A checkpointed trace read back from JSON
    (where each frame let go is not saved) gives no capture."""
    full, capture = _llama_capture(api)
    assert capture is not None and capture.derives(3)
    case: Case = (_llama, lambda: _ids(96, 12, True), LlamaDecoderLayer, LLAMA[api])
    none = _analyze(case, None)
    assert none.profile is not None
    blocks = [m for m in none.modules if m.module_class == "LlamaDecoderLayer"]
    last = blocks[-1].fqn
    for step in none.profile.iterations:
        post = next(k for k, (hook, unit, _) in enumerate(step.hooks)
                    if unit == last and hook.startswith("post_forward"))  # fmt: skip
        step.flops_forward[post + 1] += 1
    other = checkpoint_capture(none, full)
    assert other is not None and other.derives(2) and not other.derives(3)
    with pytest.raises(ValueError, match="not exact"):
        other.every(3)
    read_back = fsdpviz.Report.from_dict(full.to_dict())
    assert checkpoint_capture(_analyze(case, None), read_back) is None


class _Shifted(torch.nn.Module):
    """A residual MLP block whose input is shifted by a keyword tensor, not saved (an add)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(hidden, 2 * hidden)
        self.down = torch.nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor, *, shift: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(x + shift)))
        return out


class _KeywordShift(torch.nn.Module):
    """Blocks each given the same keyword tensor, made in forward, that only they hold
    past it: the checkpoints' frames keep it into the first checkpointed block's backward."""

    def __init__(self, hidden: int = 32, blocks: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, hidden)
        self.blocks = torch.nn.ModuleList(_Shifted(hidden) for _ in range(blocks))
        self.head = torch.nn.Linear(hidden, 64)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        shift = torch.full(x.shape, 0.5, device=x.device)
        for block in self.blocks:
            x = block(x, shift=shift)
        out: torch.Tensor = self.head(x)
        return out


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("api", ["FSDP2", "FSDP1"])
def test_a_keyword_tensor_only_the_blocks_hold(api: str, n: int) -> None:
    def build() -> torch.nn.Module:
        with torch.device("meta"):
            return _KeywordShift()

    given: dict[str, Any] = (
        {"fully_shard": [_Shifted]}
        if api == "FSDP2"
        else {"auto_wrap_policy": ModuleWrapPolicy({_Shifted})}
    )
    case: Case = (build, lambda: _ids(64, 16), _Shifted, given)
    capture = checkpoint_capture(_analyze(case, None), _analyze(case, [_Shifted]))
    assert capture is not None and capture.derives(n)
    assert capture.every(n).to_dict() == _analyze(case, CheckpointEvery([_Shifted], n)).to_dict()


class _Mixer(torch.nn.Module):
    """A residual projection, a unit of its own."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.proj(x)
        return out


class _MixedTwice(ExampleModel):
    """The example with one unit run twice in forward: before the decoder layers and again
    after them."""

    def __init__(self, config: ExampleConfig) -> None:
        super().__init__(config)
        self.mixer = _Mixer(config.hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.mixer(self.embed_tokens(input_ids))
        for layer in self.layers:
            x = layer(x)
        logits: torch.Tensor = self.lm_head(self.norm(self.mixer(x)))
        return logits


@pytest.mark.parametrize("accum", [1, 2])
def test_the_peaks_without_held_call_gradients_are_carried(accum: int) -> None:
    """FSDP1 under parameter mixed precision, a unit run twice (``peak_unbuffered``: each
    stretch's peak less the gradient of the unit's last call, which autograd holds through
    the decoder layers' backward until its first call's comes in; see ``CallGradients``),
    with and without gradient accumulation: each stretch's comes from its trace, shifted by
    what the blocks holding their saves hold in the plan, field for field as ``analyze``
    makes it."""

    def build() -> torch.nn.Module:
        with torch.device("meta"):
            return _MixedTwice(CONFIG)

    case: Case = (build, _ids, DecoderLayer, {
        "auto_wrap_policy": ModuleWrapPolicy({DecoderLayer, _Mixer}),
        "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16), "grad_accum": accum,
    })  # fmt: skip
    none, full = _analyze(case, None), _analyze(case, [DecoderLayer])
    capture = checkpoint_capture(none, full)
    assert capture is not None
    assert none.profile is not None and full.profile is not None
    unbuffered = [p.iterations[-1].peak_unbuffered for p in (none.profile, full.profile)]
    assert unbuffered[0] and unbuffered[1] and unbuffered[0] != unbuffered[1]
    for n in (2, 3):
        derived = capture.every(n)
        traced = _analyze(case, CheckpointEvery([DecoderLayer], n))
        assert derived.to_dict() == traced.to_dict()
        assert derived.profile is not None and len(derived.profile.iterations) == 2 * accum
        mine = derived.profile.iterations[-1].peak_unbuffered
        assert mine and mine not in unbuffered
        assert derived.memory.peak == traced.memory.peak


class _Residual(torch.nn.Module):
    """A residual MLP block."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(hidden, 2 * hidden)
        self.down = torch.nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(x)))
        return out


class _RawInput(torch.nn.Module):
    """Blocks over the raw input, the first's needing no gradient (no embedding before it)."""

    def __init__(self, hidden: int = 32, blocks: int = 5) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Residual(hidden) for _ in range(blocks))
        self.head = torch.nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("precision", [None, BF16], ids=["fp32", "bf16"])
def test_a_first_block_whose_input_needs_no_gradient(
    precision: MixedPrecisionPolicy | None, n: int, accum: int
) -> None:
    """FSDP2: the first block takes the raw input, so no post-backward hook is registered
    on it (``FSDPState._register_post_backward_hook`` finds no input requiring a gradient)
    and its post-backward runs in the root's final callback
    (``_root_post_backward_final_callback``): its backward stretch ends at that callback,
    in both traces, and the plans are ``analyze``'s field for field."""

    def build() -> torch.nn.Module:
        with torch.device("meta"):
            return _RawInput()

    def inputs() -> torch.Tensor:
        return torch.randn(8, 16, 32, generator=torch.Generator().manual_seed(0))

    given: dict[str, Any] = {"fully_shard": [_Residual], "grad_accum": accum}
    if precision is not None:
        given["mp_policy"] = precision
    case: Case = (build, inputs, _Residual, given)
    none, full = _analyze(case, None), _analyze(case, [_Residual])
    assert full.profile is not None
    hooks = full.profile.iterations[0].hooks
    assert not any(h == "post_backward" and u == "blocks.0" for h, u, _ in hooks)
    capture = checkpoint_capture(none, full)
    assert capture is not None and capture.blocks == [f"blocks.{i}" for i in range(5)]
    assert capture.every(n).to_dict() == _analyze(case, CheckpointEvery([_Residual], n)).to_dict()
    assert capture.every(1).to_dict() == full.to_dict()
