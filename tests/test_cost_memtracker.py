"""Anchor: fsdpviz's FSDP2 memory model against torch's ``FSDPMemTracker``.

The tracker runs real ``fully_shard`` on fake tensors with the fake process
group (4 ranks) and measures every tensor FSDP2 and the model allocate. For each
case the peak, every category at the peak (named as in
``memtracker_harness.MAPPING``, which says why some categories are compared as
sums) and every module's forward and backward peak agree to the byte, with what
the tracker counts that a GPU job does not have, or has its own way:

- Adam keeps a 4-byte ``step`` tensor per parameter (on the host on a GPU), which
  fsdpviz's optimizer state leaves out: added to fsdpviz's (``steps``).
- The tracker holds a unit's last unsharded gradient through FSDP's post-backward:
  each unit's backward peak as it sees it (``_as_the_tracker_sees``).
- It registers FSDP2's hooks one module at a time, which gathers a unit that groups
  several modules once per module (``test_tracker_gathers_a_group_once_per_module``).

On 2 gloo ranks with real CPU tensors (``memtracker_harness.spawn_gloo``) the same
comparison is exact to the byte, and the differences between a CPU run and the GPU
run fsdpviz models are each measured (docs/cost.md states them).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from memtracker_harness import (
    GLOO_WORLD_SIZE,
    MAPPING,
    GlooCase,
    Tracked,
    gloo_cases,
    load_tracked,
    spawn_gloo,
    tracked,
)
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.utils.checkpoint import checkpoint

import fsdpviz
from fsdpviz.cost import MemoryReport, memory_model
from fsdpviz.cost.hook_calls import tape
from fsdpviz.cost.sizes import unit_bytes
from fsdpviz.examples import DecoderLayer, ExampleConfig, ExampleModel
from fsdpviz.schema.memory import CATEGORIES

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


class CheckpointedExample(ExampleModel):
    """The example model with non-reentrant activation checkpointing around each layer."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        out: torch.Tensor = self.lm_head(self.norm(x))
        return out


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg)


def _ids() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(2, 64, dtype=torch.long)}


def _compare(
    real: Tracked, model: MemoryReport, backward: dict[str, int] | None = None, steps: int = 0
) -> None:
    """To the byte. ``backward``: each unit's backward peak as the tracker sees it
    (:func:`_as_the_tracker_sees`), else ``model.unit_peaks``'. ``steps``: the bytes of
    Adam's step counters, in the tracker's optimizer state and every total."""
    peak = real.peak["Total"]
    assert peak == model.peak["bytes"] + steps, (peak, model.peak)
    for name, (theirs, ours) in MAPPING.items():
        a = sum(real.peak.get(k, 0) for k in theirs)
        b = sum(model.peak["breakdown"][k] for k in ours) + (steps if "OptState" in theirs else 0)
        assert a == b, f"{name}: FSDPMemTracker {a} B, fsdpviz {b} B"
    assert set(real.modules) == set(model.unit_peaks)
    for module, phases in real.modules.items():
        for phase, value in phases.items():
            got = model.unit_peaks[module][phase]
            if phase == "backward" and backward is not None:
                got = backward[module]
            want = got + steps if got else 0  # 0: a backward that did not run
            assert value == want, f"{module!r} {phase} peak: {value} vs {want}"


def _as_the_tracker_sees(
    report: fsdpviz.Report,
    mem: MemoryReport,
    model: nn.Module,
    copies: bool = False,
) -> dict[str, int]:
    """Each unit's backward peak as ``FSDPMemTracker`` reports it: with ``copies`` (gloo's own
    reduce-scatter), a copy of its input, made while it completes, which the tracker counts
    when the reduced shard is allocated: the moment after the reduce-scatter, in the unit's
    window and the root's, reads it higher. (The stray reference of torch's post-backward
    wrapper to the unit's last ``.grad`` is dropped by the harness,
    ``memtracker_harness._post_backward_letting_go``.)
    """
    peaks = {unit: phases["backward"] for unit, phases in mem.unit_peaks.items()}
    if not copies:
        return peaks
    after = {m.event: sum(m.bytes) for m in mem.moments if m.kind == "event"}  # the last one
    sizes = unit_bytes(report, None)
    for k, e in enumerate(report.iterations[mem.config["iteration"]]):
        if e.kind != "reduce_scatter" or e.hook == "final_callback":  # in no module's window
            continue
        for name in {e.unit, ""}:
            peaks[name] = max(peaks[name], after[k] + sizes[e.unit].reduce_scatter)
    return peaks


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], list[nn.Module]], Any]] = {
    "example": (lambda: ExampleModel(ExampleConfig()), lambda m: list(m.layers), DecoderLayer),
    "example_checkpointed": (
        lambda: CheckpointedExample(ExampleConfig()),
        lambda m: list(m.layers),
        DecoderLayer,
    ),
    "llama": (_llama, lambda m: list(m.model.layers), None),
}


def _hf_loss(out: Any) -> torch.Tensor:
    loss: torch.Tensor = out.loss
    return loss


def _loss(out: Any) -> torch.Tensor:
    logits = out if isinstance(out, torch.Tensor) else out.logits
    total: torch.Tensor = logits.sum()
    return total


def _check(
    fake_pg: int,
    case: str,
    optimizer: bool = False,
    mesh_shape: tuple[int, int] | None = None,
    **kwargs: Any,
) -> None:
    build, blocks, block_cls = CASES[case]
    if block_cls is None:
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        block_cls = LlamaDecoderLayer
    real = tracked(
        build, _ids, blocks, fake_pg, _loss, optimizer=optimizer, mesh_shape=mesh_shape, **kwargs
    )
    with torch.device("meta"):
        model = build()
    ranks = {"mesh": mesh_shape} if mesh_shape else {"world_size": fake_pg}
    report = fsdpviz.analyze(model, _ids(), fully_shard=[block_cls], loss=_loss, **ranks, **kwargs)
    optim = "adam" if optimizer else None
    mem = memory_model(report, optimizer=optim, iteration=1 if optimizer else 0)
    steps = 4 * len(list(model.parameters())) if optimizer else 0  # Adam's step counters
    backward = _as_the_tracker_sees(report, mem, model)
    _compare(real, mem, backward=backward, steps=steps)


@pytest.mark.parametrize("case", list(CASES))
def test_against_fsdp_mem_tracker(fake_pg: int, case: str) -> None:
    _check(fake_pg, case)


def test_mixed_precision(fake_pg: int) -> None:
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    _check(fake_pg, "llama", mp_policy=mp)


def test_no_reshard_after_forward(fake_pg: int) -> None:
    _check(fake_pg, "llama", reshard_after_forward=False)


def test_adam_steady_state(fake_pg: int) -> None:
    _check(fake_pg, "example", optimizer=True)


def _frozen_attention_and_embedding() -> nn.Module:
    """The example model with its embedding and every layer's attention frozen: each group
    mixes frozen and trainable parameters."""
    model = ExampleModel(ExampleConfig())
    for name, p in model.named_parameters():
        if "self_attn" in name or "embed" in name:
            p.requires_grad_(False)
    return model


def test_for_loop_step_over_the_trainable_parameters(fake_pg: int) -> None:
    """AdamW's for-loop step loops over the parameters with a gradient only
    (``Adam._init_group`` skips the others): with frozen parameters in every group its
    temporaries are the trainable shards'. The step, tracked on its own, to the byte."""
    build = _frozen_attention_and_embedding
    real = tracked(build, _ids, lambda m: list(m.layers), fake_pg, _loss,
                   optimizer="adamw_for_loop", step=True)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, _ids(), fully_shard=[DecoderLayer], loss=_loss,
                             world_size=fake_pg)  # fmt: skip
    assert all(u.frozen_params for u in report.units)
    mem = memory_model(report, optimizer="adamw_for_loop", iteration=1)
    step = mem.moments[-1]
    assert step.where == "during the optimizer step after"
    steps = 4 * sum(p.requires_grad for p in model.parameters())  # AdamW's step counters
    got = dict(zip(CATEGORIES, step.bytes, strict=True))
    assert real.step_peak["Total"] == sum(step.bytes) + steps
    assert real.step_peak["OptState"] == got["optimizer"] + steps
    states = 2 * 4 * sum(u.trainable[1] for u in report.units)
    # a parameter's sqrt() and its division, the one before it's result still bound, over
    # the trainable parameters in order: an MLP's up_proj after its gate_proj
    shards = [p.numel() // fake_pg * 4 for p in model.parameters() if p.requires_grad]
    loop = max(2 * n + (shards[i - 1] if i else 0) for i, n in enumerate(shards))
    assert loop == 3 * 688 * 256 // fake_pg * 4
    assert got["optimizer"] == states + loop


def test_reshard_after_forward_onto_fewer_ranks(fake_pg: int) -> None:
    """``reshard_after_forward=2`` on 4 ranks, the LM head a unit of its own (run last):
    ``FSDPParam.to_sharded_post_forward`` clones each parameter's slice of its all-gather
    output before freeing that output, so at the head's post-forward its whole weight and its
    half are alive beside the logits: the root's forward peak (``ModTracker`` leaves the head
    before FSDP's post-forward hook runs, so not the head's). In the steady state (AdamW, the
    for-loop step) the peak before the step and every module's peaks to the byte; the
    tracker files the post-forward shards under forward tensors."""
    build = functools.partial(ExampleModel, ExampleConfig(vocab_size=4096))
    blocks = lambda m: [*m.layers, m.lm_head]  # noqa: E731
    real = tracked(build, _ids, blocks, fake_pg, _loss, optimizer="adamw_for_loop",
                   reshard_after_forward=2)  # fmt: skip
    with torch.device("meta"):
        model = build()
    units = [*[(f"layers.{i}",) for i in range(len(model.layers))], ("lm_head",)]
    report = fsdpviz.analyze(model, _ids(), fully_shard=units, loss=_loss, world_size=fake_pg,
                             reshard_after_forward=2)  # fmt: skip
    mem = memory_model(report, optimizer="adamw_for_loop", iteration=1)
    before_step = replace(mem, peak=_peak_of(mem.moments[:-1]))
    steps = 4 * len(list(model.parameters()))  # AdamW's step counters
    assert real.modules[""]["forward"] == mem.unit_peaks[""]["forward"] + steps
    head = 4096 * 256 * 4  # the head's weight, float32
    name = "at the reshard after forward onto fewer ranks in free 'lm_head'"
    k = next(k for k, m in enumerate(mem.moments) if m.where.startswith(name))
    assert sum(mem.moments[k].bytes) - sum(mem.moments[k + 1].bytes) == head  # then freed
    assert sum(mem.moments[k].bytes) == mem.unit_peaks[""]["forward"]
    assert mem.unit_peaks[""]["forward"] > mem.unit_peaks["lm_head"]["forward"]
    peak = dict(before_step.peak["breakdown"])
    peak["activations"] += peak["sharded_params"] - real.peak["Sharded Param"]
    peak["sharded_params"] = real.peak["Sharded Param"]
    backward = _as_the_tracker_sees(report, mem, model)
    _compare(real, replace(before_step, peak={**before_step.peak, "breakdown": peak}),
             backward=backward, steps=steps)  # fmt: skip


class _WithSpare(ExampleModel):
    """The example model with a linear layer in each decoder layer that no forward calls."""

    def __init__(self) -> None:
        super().__init__(ExampleConfig())
        for layer in self.layers:
            layer.spare = nn.Linear(256, 256)


def test_parameters_no_gradient_reaches(fake_pg: int) -> None:
    """A parameter that requires grad but that the forward never uses gets no ``.grad``:
    ``FSDPParamGroup.post_backward`` reduce-scatters only the parameters with one, and Adam
    keeps no state for it. In the steady state (Adam) the peak, every category at it and
    every module's peaks, to the byte (before, each layer's reduce-scatter buffer, gradient
    shard and optimizer state counted the unused layer's 257 KiB)."""
    real = tracked(_WithSpare, _ids, lambda m: list(m.layers), fake_pg, _loss, optimizer=True)
    with torch.device("meta"):
        model = _WithSpare()
    report = fsdpviz.analyze(model, _ids(), fully_shard=[DecoderLayer], loss=_loss,
                             world_size=fake_pg)  # fmt: skip
    unit = report.unit("layers.1")
    assert unit.unused_params == ["layers.1.spare.weight", "layers.1.spare.bias"]
    assert unit.trainable[1] == unit.sharded_numel - (256 * 256 + 256) // fake_pg
    mem = memory_model(report, optimizer="adam", iteration=1)
    steps = 4 * sum(".spare." not in n for n, _ in model.named_parameters())  # with a gradient
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model), steps=steps)


def test_a_group_no_gradient_reaches(fake_pg: int) -> None:
    """A block run in the forward whose output does not reach the loss: none of its group's
    parameters gets a gradient, so the group reduces nothing and Adam keeps no state for it
    (before, its 1,104 elements counted as trainable). The steady state to the byte."""
    import handwritten_models as hm

    def inputs() -> dict[str, torch.Tensor]:
        return {"x": torch.randn(4, 8, generator=torch.Generator().manual_seed(0))}

    real = tracked(hm.SideOutput, inputs, lambda m: list(m.blocks), fake_pg, _loss,
                   optimizer=True)  # fmt: skip
    with torch.device("meta"):
        model = hm.SideOutput()
    report = fsdpviz.analyze(model, inputs(), fully_shard=[f"blocks.{i}" for i in range(4)],
                             loss=_loss, world_size=fake_pg)  # fmt: skip
    assert report.unit("blocks.3").trainable == (0, 0)
    mem = memory_model(report, optimizer="adam", iteration=1)
    steps = 4 * sum(not n.startswith("blocks.3.") for n, _ in model.named_parameters())
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model), steps=steps)


def _torchtitan_sac(module: nn.Module) -> None:
    """torchtitan's per-operator selective checkpointing (``selective_ac_option = "op"``) of
    ``module``'s forward: the outputs of matrix multiplies (every second one recomputed),
    fused attention and a few others saved."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from fsdpviz.schema.checkpointing import TORCHTITAN_SAVE_OPS

    aten, forward = torch.ops.aten, module.forward
    mms = {aten.mm.default, aten.linear.default}

    def run(*args: Any) -> Any:
        seen = {"forward": 0, "recompute": 0}

        def policy(ctx: Any, func: Any, *_: Any, **__: Any) -> CheckpointPolicy:
            mode = "recompute" if ctx.is_recompute else "forward"
            seen[mode] += func in mms
            every_second = func in mms and seen[mode] % 2 == 0
            if func in TORCHTITAN_SAVE_OPS and not every_second:
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        def contexts() -> Any:
            return create_selective_checkpoint_contexts(policy)  # type: ignore[no-untyped-call]

        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts)

    module.forward = run  # type: ignore[method-assign]


def _whole(module: nn.Module) -> None:
    forward = module.forward
    module.forward = functools.partial(checkpoint, forward, use_reentrant=False)  # type: ignore[method-assign]


_BF16_ONLY = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
_BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
# name -> (fsdpviz's activation_checkpointing, what the real model runs under it and where,
# fully_shard's options, parameters frozen (by name), micro-steps per optimizer step)
_CHECKPOINTED: dict[str, tuple[Any, Callable[[nn.Module], None], dict[str, Any], str, int]] = {
    "every-2nd-layer-raf2-bf16": (
        "every2",
        lambda m: [_whole(layer) for layer in list(m.layers)[1::2]],
        {"reshard_after_forward": 2, "mp_policy": _BF16},
        "",
        1,
    ),
    "selective-frozen-attention": (
        "selective",
        lambda m: [_torchtitan_sac(layer) for layer in m.layers],
        {},
        "self_attn",
        1,
    ),
    "mlps-accumulated-bf16-reduce": (
        "mlp",
        lambda m: [_whole(layer.mlp) for layer in m.layers],
        {"mp_policy": _BF16_ONLY, "reshard_after_forward": False},
        "embed",
        2,
    ),
}


@pytest.mark.parametrize("case", list(_CHECKPOINTED))
def test_activation_checkpointing_kinds(fake_pg: int, case: str) -> None:
    """Each kind of ``activation_checkpointing=`` fsdpviz takes (every n-th block whole,
    torchtitan's per-operator selective checkpointing, modules inside a unit), with what the
    real model runs under ``torch.utils.checkpoint``, on 7 x 13 tokens, combined with an int
    ``reshard_after_forward`` and bf16 parameters, frozen parameters, and two micro-steps
    without gradient sync reducing in bf16: the peak and every module's peaks over the
    micro-steps to the byte. The tracker calls what backward recomputes a temporary (its
    ``_in_ac`` only when FSDP's pre-forward runs again), fsdpviz activations: the forward's
    and backward's tensors are compared together (with the post-forward shards, filed under
    activations by the tracker, and the cast gradient shards, temporaries to it)."""
    from fsdpviz.examples import MLP
    from fsdpviz.schema.checkpointing import CheckpointEvery, SelectiveCheckpoint

    kind, wrap, options, frozen, n = _CHECKPOINTED[case]
    config = ExampleConfig(vocab_size=250, hidden_size=96, intermediate_size=176, num_layers=4)
    spec = {
        "every2": CheckpointEvery([DecoderLayer], 2),
        "selective": SelectiveCheckpoint([DecoderLayer]),
        "mlp": [MLP],
    }[kind]

    def build(real: bool) -> nn.Module:
        model = ExampleModel(config)
        for name, p in model.named_parameters():
            p.requires_grad_(not frozen or frozen not in name)
        if real:
            wrap(model)
        return model

    def ids() -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.randint(0, 250, (7, 13), generator=torch.Generator().manual_seed(0))
        }

    real = tracked(lambda: build(True), ids, lambda m: list(m.layers), fake_pg, _loss,
                   accumulate=n, **options)  # fmt: skip
    with torch.device("meta"):
        model = build(False)
    report = fsdpviz.analyze(model, ids(), fully_shard=[DecoderLayer], loss=_loss,
                             world_size=fake_pg, activation_checkpointing=spec,
                             **({"grad_accum": n} if n > 1 else {}), **options)  # fmt: skip
    assert report.config.activation_checkpointing is not None
    steps = [memory_model(report, optimizer=None, iteration=i) for i in range(n)]
    at_peak = max(steps, key=lambda m: m.peak["bytes"])
    assert real.peak["Total"] == at_peak.peak["bytes"]
    ours = ("sharded_params", "activations", "forward_temp", "backward_temp", "unsharded_grads",
            "sharded_grads", "reduce_scatter")  # fmt: skip
    theirs = ("Sharded Param", "Activation", "Temp", "Unsharded Grad", "Sharded Grad",
              "Reduce Scatter")  # fmt: skip
    mine = _as_the_tracker_names(report, at_peak).peak["breakdown"]
    assert sum(real.peak.get(k, 0) for k in theirs) == sum(mine[k] for k in ours)
    for name, (a, b) in MAPPING.items():
        if not set(a) & set(theirs):
            assert sum(real.peak.get(k, 0) for k in a) == sum(mine[k] for k in b), name
    for module, phases in real.modules.items():
        forward = max(m.unit_peaks[module]["forward"] for m in steps)
        backward = max(_as_the_tracker_sees(report, m, model)[module] for m in steps)
        assert (phases["forward"], phases["backward"]) == (forward, backward), module


def test_hybrid_sharding_mesh(fake_pg: int) -> None:
    """HSDP on a 2 x 2 mesh: shards and buffers of the shard dimension."""
    _check(fake_pg, "llama", mesh_shape=(2, 2), optimizer=True)


@pytest.mark.parametrize("case", ["example", "llama"])
def test_hybrid_sharding_reducing_in_the_compute_dtype(fake_pg: int, case: str) -> None:
    """HSDP with bf16 parameters reducing in bf16 (no ``reduce_dtype``): each param group
    keeps its all-reduced bf16 buffer (``AllReduceState``) beside the float32 gradient shard
    cast from it until the end of the backward. The peak and every module's peaks to the
    byte; the tracker counts the cast shards as temporaries, so the gradient shards and the
    backward's tensors are compared together."""
    build, blocks, block_cls = CASES[case]
    if block_cls is None:
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        block_cls = LlamaDecoderLayer
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    real = tracked(build, _ids, blocks, fake_pg, _loss, mesh_shape=(2, 2), mp_policy=mp)
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(
        model, _ids(), fully_shard=[block_cls], loss=_loss, mesh=(2, 2), mp_policy=mp
    )
    mem = memory_model(report, optimizer=None)
    _compare_cast_shards(real, mem, report, model)


def _large_head() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=8000,
                      max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(cfg)


def _large_head_on_a_mesh(
    fake_pg: int, mesh: tuple[int, int], mp: MixedPrecisionPolicy
) -> tuple[Tracked, fsdpviz.Report, nn.Module]:
    """:func:`_large_head` on two tokens, each decoder layer a unit, HSDP on ``mesh``
    (replicate x shard): the tracker's measurement, fsdpviz's plan and its meta model."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    def ids() -> dict[str, torch.Tensor]:
        return {"input_ids": torch.zeros(1, 2, dtype=torch.long)}

    real = tracked(_large_head, ids, lambda m: list(m.model.layers), fake_pg, _loss,
                   mesh_shape=mesh, mp_policy=mp)  # fmt: skip
    with torch.device("meta"):
        model = _large_head()
    report = fsdpviz.analyze(model, ids(), fully_shard=[LlamaDecoderLayer], loss=_loss,
                             mesh=mesh, mp_policy=mp)  # fmt: skip
    return real, report, model


@pytest.mark.parametrize("mesh", [(2, 2), (1, 4)], ids=["2x2", "one_replica"])
def test_hybrid_sharding_all_reduce_beside_the_last_gradient(
    fake_pg: int, mesh: tuple[int, int]
) -> None:
    """HSDP on a 2-D mesh: ``foreach_reduce``'s loop over the gradients keeps the last one
    bound until it returns, through the all-reduce across the replicas and the cast of its
    output, not only the reduce-scatter. With most parameters in the root (a large
    vocabulary, two tokens) that all-reduce makes the peak, which was the output
    projection's 1,024,000 B bf16 gradient low on 2 x 2. A replicate dimension of one rank
    is HSDP all the same (``HSDPMeshInfo``: the mesh is 2-D): its all-reduce and the
    all-reduced buffers each param group keeps (``AllReduceState``) were missing, the peak
    20,544 B low."""
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    real, report, model = _large_head_on_a_mesh(fake_pg, mesh, mp)
    mem = memory_model(report, optimizer=None)
    _compare_cast_shards(real, mem, report, model)
    assert mem.peak["where"].startswith("at all_reduce (root)")


@pytest.mark.parametrize("reduce_dtype", [None, torch.float32], ids=["bf16", "fp32_reduce"])
def test_one_rank_shard_group_copies_each_cast(fake_pg: int, reduce_dtype: Any) -> None:
    """HSDP replicating over all 4 ranks, each shard group one rank: no all-gather;
    ``wait_for_unshard`` copies each parameter's ``all_gather_inputs``, under mixed precision
    a cast of the shard, into its unsharded storage, the loop's variable holding one cast
    until the next is made and the last until the copy-out returns. Every module's forward
    peak to the byte (the root's was 935,376 B low, the block's 10,336 B). With no shard
    group to reduce-scatter over, ``foreach_reduce`` frees every gradient at the copy-in (no
    loop over them holds the last); the peak and the backward peaks to the byte too (the
    harness drops the tracker's own reference to the last, ``_post_backward_letting_go``)."""
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    real, report, _ = _large_head_on_a_mesh(fake_pg, (4, 1), mp)
    assert {u.shard_ranks for u in report.units} == {1} and real.all_gathers == 0
    assert not [e for e in report.iterations[0] if e.kind == "all_gather"]
    mem = memory_model(report, optimizer=None)
    assert real.modules == mem.unit_peaks
    assert real.peak["Total"] == mem.peak["bytes"]


def _most_over_micro_steps(
    report: fsdpviz.Report, steps: list[MemoryReport], model: nn.Module
) -> dict[str, dict[str, int]]:
    """Each unit's forward and backward peaks, the most over the micro-steps ``steps``, the
    backward one as the tracker sees it (:func:`_as_the_tracker_sees`)."""
    unit_peaks: dict[str, dict[str, int]] = {}
    for mem in steps:
        backward = _as_the_tracker_sees(report, mem, model)
        for unit, phases in mem.unit_peaks.items():
            slot = unit_peaks.setdefault(unit, {"forward": 0, "backward": 0})
            slot["forward"] = max(slot["forward"], phases["forward"])
            slot["backward"] = max(slot["backward"], backward[unit])
    return unit_peaks


def _compare_cast_shards(
    real: Tracked, mem: MemoryReport, report: fsdpviz.Report, model: nn.Module
) -> None:
    """The peak and every module's peaks to the byte; the tracker counts gradient shards cast
    to another dtype as temporaries, so the gradient shards and the backward's tensors are
    compared together."""
    assert real.peak["Total"] == mem.peak["bytes"]
    both = ("Sharded Grad", "Temp", "Unsharded Grad")
    ours = ("sharded_grads", "backward_temp", "unsharded_grads")
    assert sum(real.peak.get(k, 0) for k in both) == sum(mem.peak["breakdown"][k] for k in ours)
    backward = _as_the_tracker_sees(report, mem, model)
    for module, phases in real.modules.items():
        assert phases["forward"] == mem.unit_peaks[module]["forward"]
        assert phases["backward"] == backward[module]


@pytest.mark.parametrize("reduce_dtype", [None, torch.bfloat16], ids=["compute", "bf16"])
def test_reduce_output_cast_to_the_parameters_dtype(fake_pg: int, reduce_dtype: Any) -> None:
    """A 1-D mesh with bf16 parameters reducing in bf16 (no ``reduce_dtype``, or bf16 given),
    the LM head (4096 x 256) a unit of its own: ``foreach_reduce`` casts its bf16
    reduce-scatter output to the float32 gradient shard, both alive until the name is
    rebound; at the head's reduction (the step's peak) that is the head's bf16 shard above
    the moment after. The peak and every module's peaks to the byte; the tracker counts the
    cast shards as temporaries, so the gradient shards and the backward's tensors are
    compared together."""
    build = functools.partial(ExampleModel, ExampleConfig(vocab_size=4096))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    blocks = lambda m: [*m.layers, m.lm_head]  # noqa: E731
    ids = _ids
    real = tracked(build, ids, blocks, fake_pg, _loss, mp_policy=mp, reshard_after_forward=False)
    with torch.device("meta"):
        model = build()
    units = [*[(f"layers.{i}",) for i in range(len(model.layers))], ("lm_head",)]
    report = fsdpviz.analyze(model, ids(), fully_shard=units, loss=_loss, world_size=fake_pg,
                             mp_policy=mp, reshard_after_forward=False)  # fmt: skip
    mem = memory_model(report, optimizer=None)
    _compare_cast_shards(real, mem, report, model)
    assert str(mem.peak["where"]).startswith("at the cast of the reduced gradient shard")


def test_hybrid_sharding_reduce_scatter_every_micro_step(fake_pg: int) -> None:
    """HSDP accumulating with ``set_requires_all_reduce(False)``: every micro-step
    reduce-scatters, its output added into the partial reduce output the first one left
    (counted once, with the gradient shards: the tracker counts it as a temporary), the
    all-reduce across the replicas in the last; the peak of the optimizer step's three
    micro-steps, every category at it and every module's peaks, to the byte; the last
    micro-step's reduction adds each into its own output, then drops it."""
    build, blocks, _ = CASES["llama"]
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    n, mesh = 3, (2, 2)
    real = tracked(build, _ids, blocks, fake_pg, _loss, optimizer="adamw", mesh_shape=mesh,
                   accumulate=n, reduce_each=True)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, _ids(), fully_shard=[LlamaDecoderLayer], loss=_loss,
                             mesh=mesh, grad_accum=n, requires_all_reduce=False)  # fmt: skip
    steps = [memory_model(report, optimizer="adamw", iteration=i) for i in range(n, 2 * n)]
    at_peak = max(steps, key=lambda m: m.peak["bytes"])
    unit_peaks = _most_over_micro_steps(report, steps, model)
    partial = sum(u.sharded_numel * 4 for u in report.units)  # fp32
    assert steps[0].events[-1]["sharded_grads"] == partial  # left by the first micro-step
    assert steps[1].events[-1]["sharded_grads"] == partial  # added into, not twice
    assert steps[2].events[-1]["sharded_grads"] == partial  # the last: added into its own
    breakdown = dict(at_peak.peak["breakdown"])
    if at_peak is not steps[-1]:  # before the last micro-step the partial output is a Temp
        breakdown["backward_temp"] += breakdown.pop("sharded_grads")
        breakdown["sharded_grads"] = 0
    peak = {**at_peak.peak, "breakdown": breakdown}
    combined = replace(at_peak, peak=peak, unit_peaks=unit_peaks)
    _compare(real, combined, steps=4 * len(list(model.parameters())))


@pytest.mark.parametrize("mp", ["bf16", "fp16_fp32_reduce"])
def test_hybrid_sharding_last_reduction_holds_until_the_all_reduce(fake_pg: int, mp: str) -> None:
    """HSDP with ``set_requires_all_reduce(False)`` before the last of two micro-steps, mixed
    precision, the parameters kept after forward: the last micro-step's ``foreach_reduce``
    holds the unit's last gradient (its loop variable) and the param group's partial reduce
    output (``_partial_reduce_output``, rebound once it returns) through the all-reduce
    across the replicas and the cast. The peak and every module's peaks to the byte (before,
    the peak was 7,748 B low with bf16, 16,384 B with fp16 reducing in fp32); the tracker files the
    partial outputs under temporaries, so gradients, buffers and temporaries are compared
    together."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    if mp == "fp16_fp32_reduce":
        policy = MixedPrecisionPolicy(torch.float16, torch.float32)
    config = ExampleConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=3)
    build = functools.partial(ExampleModel, config)
    n, mesh = 2, (2, 2)

    def ids() -> dict[str, torch.Tensor]:  # few tokens: the reductions make the peak
        return {"input_ids": torch.zeros(2, 16, dtype=torch.long)}

    options = {"mp_policy": policy, "reshard_after_forward": False}
    real = tracked(build, ids, lambda m: list(m.layers), fake_pg, _loss, mesh_shape=mesh,
                   accumulate=n, reduce_each=True, **options)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, ids(), fully_shard=[DecoderLayer], loss=_loss, mesh=mesh,
                             grad_accum=n, requires_all_reduce=False, **options)  # fmt: skip
    steps = [memory_model(report, optimizer=None, iteration=i) for i in range(n)]
    at_peak = max(steps, key=lambda m: m.peak["bytes"])
    assert real.peak["Total"] == at_peak.peak["bytes"]
    theirs = ("Sharded Grad", "Temp", "Unsharded Grad", "Reduce Scatter")
    ours = ("sharded_grads", "backward_temp", "unsharded_grads", "reduce_scatter")
    mine = at_peak.peak["breakdown"]
    assert sum(real.peak.get(k, 0) for k in theirs) == sum(mine[k] for k in ours)
    assert real.modules == _most_over_micro_steps(report, steps, model)


@pytest.mark.parametrize("mesh", [None, (1, 4), (2, 2)], ids=["1d", "one_replica", "2x2"])
def test_accumulation_reducing_in_fp32_after_no_sync(
    fake_pg: int, mesh: tuple[int, int] | None
) -> None:
    """Two micro-steps, the first after ``set_requires_gradient_sync(False)``, bf16 parameters
    reducing in fp32, FSDP and HSDP: the last micro-step's post-backward adds each bf16
    ``.grad`` into the fp32 copy the first left and frees it before reducing the copy. The
    tracker's post-backward wrapper kept the unit's last bf16 ``.grad`` alive beside the
    reduce-scatter input (its loop variable): with the output projection last in the root,
    the measured peak was 12,604 B (FSDP, 1 x 4) and 103,444 B (2 x 2) above what the program
    holds. The peak, every category at it and every module's peaks, to the byte."""
    config = ExampleConfig(vocab_size=3000, hidden_size=60, intermediate_size=171, num_layers=2,
                           num_heads=1)  # fmt: skip
    build = functools.partial(ExampleModel, config)

    def ids() -> dict[str, torch.Tensor]:
        return {"input_ids": torch.zeros(2, 9, dtype=torch.long)}

    n, mp = 2, MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    real = tracked(build, ids, lambda m: list(m.layers), fake_pg, _loss, mesh_shape=mesh,
                   accumulate=n, mp_policy=mp)  # fmt: skip
    with torch.device("meta"):
        model = build()
    ranks: dict[str, Any] = {"mesh": mesh} if mesh else {"world_size": fake_pg}
    report = fsdpviz.analyze(model, ids(), fully_shard=[DecoderLayer], loss=_loss,
                             grad_accum=n, mp_policy=mp, **ranks)  # fmt: skip
    steps = [memory_model(report, optimizer=None, iteration=i) for i in range(n)]
    at_peak = max(steps, key=lambda m: m.peak["bytes"])
    _compare(real, replace(at_peak, unit_peaks=_most_over_micro_steps(report, steps, model)))


@pytest.mark.parametrize("precision", ["fp32", "bf16_fp32_reduce"])
def test_accumulation_reducing_every_micro_step(fake_pg: int, precision: str) -> None:
    """Accumulation without ``set_requires_gradient_sync(False)`` (torchtitan's, Composer's):
    every micro-step reduce-scatters, and from the second on adds its new gradient shard into
    the ``.grad`` the ones before left, then frees it. ``memory_model(grad_accum=N)`` of the
    plan of one micro-step is the optimizer step's peak (its last micro-step), every category
    at it and every module's peaks, to the byte."""
    build, blocks, _ = CASES["llama"]
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    mp = {}
    if precision != "fp32":
        mp = {"mp_policy": MixedPrecisionPolicy(torch.bfloat16, torch.float32)}
    n = 3
    real = tracked(build, _ids, blocks, fake_pg, _loss, optimizer="adamw", accumulate=n,
                   sync_each=True, **mp)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, _ids(), fully_shard=[LlamaDecoderLayer], loss=_loss,
                             world_size=fake_pg, **mp)  # fmt: skip
    mem = memory_model(report, optimizer="adamw", grad_accum=n)
    one = memory_model(report, optimizer="adamw")
    shards = sum(u.sharded_numel * 4 for u in report.units)  # fp32 gradient shards
    assert mem.events[0]["sharded_grads"] == shards  # left by the micro-steps before
    assert mem.peak["bytes"] > one.peak["bytes"]
    backward = _as_the_tracker_sees(report, mem, model)
    _compare(real, mem, backward=backward, steps=4 * len(list(model.parameters())))


@pytest.mark.parametrize("precision", ["fp32", "bf16_fp32_reduce"])
def test_hybrid_sharding_accumulation_reducing_every_micro_step(
    fake_pg: int, precision: str
) -> None:
    """HSDP on a 2 x 2 mesh, accumulating without ``set_requires_gradient_sync(False)``: from
    the second micro-step on, each param group's all-reduced buffer (in the float32 reduce
    dtype, the new gradient shard's storage) is added into the ``.grad`` the ones before
    left, and the group keeps it (``AllReduceState``) until its next post-backward or the end
    of the backward: beside the gradient shard, not freed with the addition. The peak,
    every category at it and every module's peaks, to the byte (the first layer's backward
    peak was 141,120 B low)."""
    build = functools.partial(
        ExampleModel, ExampleConfig(vocab_size=101, hidden_size=60, intermediate_size=50)
    )
    mp = {}
    if precision != "fp32":
        mp = {"mp_policy": MixedPrecisionPolicy(torch.bfloat16, torch.float32)}
    n, mesh = 3, (2, 2)
    real = tracked(build, _ids, lambda m: list(m.layers), fake_pg, _loss, optimizer="adamw",
                   mesh_shape=mesh, accumulate=n, sync_each=True, **mp)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, _ids(), fully_shard=[DecoderLayer], loss=_loss, mesh=mesh,
                             **mp)  # fmt: skip
    mem = memory_model(report, optimizer="adamw", grad_accum=n)
    backward = _as_the_tracker_sees(report, mem, model)
    _compare(real, mem, backward=backward, steps=4 * len(list(model.parameters())))


class _LayerTwice(ExampleModel):
    """The example model running its second layer again after the last."""

    def __init__(self) -> None:
        super().__init__(ExampleConfig())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.lm_head(self.norm(self.layers[1](x)))
        return out


def test_accumulation_with_a_layer_run_twice(fake_pg: int) -> None:
    """Two micro-steps, the first without gradient sync, a layer run twice: autograd sums a
    parameter's two uses before its ``.grad``, so the layer reduces once per step, but in the
    synced micro-step its first post-backward finds the gradient the first micro-step left
    and reduces it, its second the new one, which ``foreach_reduce`` adds into the gradient
    shard and frees. The peak, every category at it, every module's peaks and the gradient
    shards after backward, to the byte (before, the layer's 791,040-byte shard was counted
    twice from its second reduction to the end of the step)."""
    n = 2
    real = tracked(_LayerTwice, _ids, lambda m: list(m.layers), fake_pg, _loss, accumulate=n)
    with torch.device("meta"):
        model = _LayerTwice()
    report = fsdpviz.analyze(model, _ids(), fully_shard=[DecoderLayer], loss=_loss,
                             world_size=fake_pg, grad_accum=n)  # fmt: skip
    synced = [e.kind for e in report.iterations[n - 1] if e.unit == "layers.1"]
    assert synced.count("reduce_scatter") == 2
    steps = [memory_model(report, optimizer=None, iteration=i) for i in range(n)]
    at_peak = max(steps, key=lambda m: m.peak["bytes"])
    _compare(real, replace(at_peak, unit_peaks=_most_over_micro_steps(report, steps, model)))
    shards = sum(u.sharded_numel * 4 for u in report.units)  # fp32, each unit's once
    assert steps[-1].events[-1]["sharded_grads"] == shards == real.after_backward["Sharded Grad"]


def _cross_entropy(out: torch.Tensor) -> torch.Tensor:
    labels = torch.zeros(out.shape[:2], dtype=torch.long, device=out.device)
    return torch.nn.functional.cross_entropy(out.flatten(0, 1), labels.flatten())


@pytest.mark.parametrize("plan", ["sequence_parallel", "plain", "loss_parallel"])
def test_tensor_parallel_mesh(fake_pg: int, plan: str) -> None:
    """FSDP x TP on a 2 x 2 mesh, torchtitan's plan (logits replicated, or sharded with loss
    parallel) and one without sequence parallelism: what
    a rank holds of the parameters, its all-gather and reduce-scatter buffers, activations
    (the all-gathered inputs of column-parallel projections whole, the rest a 1/tp share),
    the tp collectives' buffers and the gradients equal FSDPMemTracker's to the byte, at the
    peak and at every module's forward and backward peak."""
    import tp_models
    from torch.distributed.tensor.parallel import parallelize_module

    whole = tp_models.plain_plan() if plan == "plain" else tp_models.whole_plan()
    loss, around = _loss, nullcontext
    if plan == "loss_parallel":  # torchtitan's default: logits stay sharded over the vocabulary
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel

        whole["output"] = ColwiseParallel(input_layouts=Shard(1), use_local_output=False)
        loss, around = _cross_entropy, loss_parallel

    def build() -> nn.Module:
        return tp_models.Llama(vocab=1000, dim=256, n_heads=4, hidden=704, layers=3)

    def parallelize(model: nn.Module, tp_mesh: Any) -> nn.Module:
        return parallelize_module(model, tp_mesh, whole)

    real = tracked(
        build, lambda: {"tokens": _ids()["input_ids"]}, lambda m: list(m.layers.values()),
        fake_pg, loss, mesh_shape=(2, 2), parallelize=parallelize, around=around,
    )  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(
        model, _ids()["input_ids"], fully_shard=[("layers.0",), ("layers.1",), ("layers.2",)],
        mesh=("dp_shard", 2, "tp", 2), parallelize_plan=whole, loss=loss,
    )  # fmt: skip
    assert real.peak["Sharded Param"] > 0 and real.peak["All Gather"] > 0
    _compare(real, memory_model(report, optimizer=None))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_loss_parallel_cross_entropy(fake_pg: int, precision: str) -> None:
    """The user's ``F.cross_entropy`` inside ``loss_parallel()`` on logits left sharded over
    the vocabulary (a small model, whose loss makes the step's peak): held as DTensor's
    handlers in ``torch/distributed/tensor/parallel/loss.py`` hold it (the upcast, the
    shifted logits and their exponent beside ``_log_softmax``'s result; the one-hot, the
    exponent, their sum and its product in the fused backward of ``nll_loss`` and
    ``log_softmax``; the per-token maxima, sums, masks and all-reduce buffers), not as aten's
    kernels: the peak, every category at it and every module's peaks, to the byte."""
    import tp_models
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel

    whole = tp_models.whole_plan()
    whole["output"] = ColwiseParallel(input_layouts=Shard(1), use_local_output=False)
    mp = {}
    if precision == "bf16":
        mp = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)}

    _check_tp_llama(fake_pg, whole, _cross_entropy, vocab=32, hidden=10, batch=2,
                    around=loss_parallel, reshard_after_forward=False, **mp)  # fmt: skip


def _check_tp_llama(
    fake_pg: int,
    plan: dict[str, Any],
    loss: Callable[[Any], torch.Tensor],
    *,
    vocab: int,
    hidden: int,
    batch: int,
    around: Callable[[], Any] = nullcontext,
    mesh: tuple[int, int] = (2, 2),
    seq: int = 8,
    checkpointed: bool = False,
    **kwargs: Any,
) -> None:
    """tp_models' Llama (2 layers, dim 8, a head per tp rank) under ``plan`` on a ``mesh``
    of dp x tp (2 x 2 unless said), each layer a unit, on ``batch`` sequences of ``seq``
    tokens: the peak, every category at it and every module's peaks to the byte."""
    import tp_models
    from torch.distributed.tensor.parallel import parallelize_module

    def build() -> nn.Module:
        return tp_models.Llama(
            vocab=vocab, dim=8, n_heads=mesh[1], hidden=hidden, layers=2, checkpointed=checkpointed
        )

    def ids() -> torch.Tensor:
        return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))

    def parallelize(model: nn.Module, tp_mesh: Any) -> nn.Module:
        return parallelize_module(model, tp_mesh, plan)

    real = tracked(build, lambda: {"tokens": ids()}, lambda m: list(m.layers.values()), fake_pg,
                   loss, mesh_shape=mesh, parallelize=parallelize, around=around,
                   **kwargs)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, ids(), fully_shard=[("layers.0",), ("layers.1",)],
                             mesh=("dp_shard", mesh[0], "tp", mesh[1]), parallelize_plan=plan,
                             loss=loss, **kwargs)  # fmt: skip
    mem = memory_model(report, optimizer=None)
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model))


def test_a_shard_group_of_one_rank_copies_its_reduction_input(fake_pg: int) -> None:
    """dp_shard 1 x tp 4: where the shard group has one rank, FSDP2's ``foreach_reduce``
    copies the reduce-scatter input into its output (``if world_size > 1`` ... ``else:
    reduce_output.copy_``), no collective, and FSDPMemTracker, which names a buffer "Reduce
    Scatter" when ``c10d._reduce_scatter_base_`` takes it, counts it a temporary. A
    vocabulary of 624 puts the peak at the root's reduction: fsdpviz named 512 B
    reduce-scatter buffers there, the tracker none (the totals equal); now the peak, every
    category at it and every module's peaks to the byte."""
    import tp_models

    _check_tp_llama(fake_pg, tp_models.plain_plan(), _loss, vocab=624, hidden=8, batch=1,
                    mesh=(1, 4))  # fmt: skip


@pytest.mark.parametrize("plan", ["plain", "loss_parallel"])
def test_tensor_parallel_group_of_one_rank(fake_pg: int, plan: str) -> None:
    """A tp dimension of one rank (``mesh=("dp_shard", 4, "tp", 1)``): DTensor's
    redistribution keeps the local tensor when the mesh dimension has one rank
    (``redistribute_local_tensor``'s ``num_chunks == 1``), no collective and no new buffer,
    nor does FSDP2's post-backward all-reduce a partial gradient (loss parallel's handlers
    do all-reduce on it, three values per token). The peak, every category
    at it and every module's peaks to the byte (the peak was 1,372 B high with the plain
    plan, the buffers of collectives that do not run)."""
    import tp_models
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    whole = tp_models.plain_plan() if plan == "plain" else tp_models.whole_plan()
    loss, around = _loss, nullcontext
    if plan == "loss_parallel":
        whole["output"] = ColwiseParallel(input_layouts=Shard(1), use_local_output=False)
        loss, around = _cross_entropy, loss_parallel
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32)

    def build() -> nn.Module:
        return tp_models.Llama(vocab=55, dim=2, n_heads=1, hidden=6, layers=1)

    def ids() -> torch.Tensor:
        return torch.randint(0, 55, (2, 4), generator=torch.Generator().manual_seed(0))

    def parallelize(model: nn.Module, tp_mesh: Any) -> None:
        parallelize_module(model, tp_mesh, whole)

    real = tracked(build, lambda: {"tokens": ids()}, lambda m: list(m.layers.values()), fake_pg,
                   loss, mesh_shape=(4, 1), parallelize=parallelize, around=around,
                   mp_policy=mp)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, ids(), fully_shard=[("layers.0",)], loss=loss, mp_policy=mp,
                             mesh=("dp_shard", 4, "tp", 1), parallelize_plan=whole)  # fmt: skip
    # but the loss's own all-reduces: loss_parallel()'s handlers call funcol.all_reduce on
    # the tp group whatever its size
    tp = [(e.kind, e.module) for e in report.iterations[0] if e.kind.startswith("tp_")]
    assert tp == ([("tp_all_reduce", "")] * 3 if plan == "loss_parallel" else [])
    mem = memory_model(report, optimizer=None)
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model))


def test_loss_parallel_with_a_class_weight_is_refused(fake_pg: int) -> None:
    """A class weight in the cross-entropy of vocabulary-sharded logits is not modelled: a
    clear error, not aten's kernels on the shard."""
    import tp_models
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    whole = tp_models.whole_plan()
    whole["output"] = ColwiseParallel(input_layouts=Shard(1), use_local_output=False)

    def weighted(out: torch.Tensor) -> torch.Tensor:
        labels = torch.zeros(out.shape[:2], dtype=torch.long, device=out.device)
        weight = torch.ones(out.shape[-1], device=out.device)
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), labels.flatten(), weight=weight)

    with torch.device("meta"):
        model = tp_models.Llama(vocab=32, dim=8, n_heads=2, hidden=10, layers=2)
    with pytest.raises(fsdpviz.ConfigError, match="class weight"):
        fsdpviz.analyze(
            model, torch.zeros(2, 8, dtype=torch.long), fully_shard=[("layers.0",)],
            mesh=("dp_shard", 2, "tp", 2), parallelize_plan=whole, loss=weighted,
        )  # fmt: skip


@pytest.mark.parametrize("plan", ["plain", "sequence_parallel"])
def test_replicated_logits_gradient_chunk(fake_pg: int, plan: str) -> None:
    """``ColwiseParallel(output_layouts=Replicate())`` on the output projection: its
    gradient goes back from ``Replicate`` to ``Shard(-1)`` with no collective, but DTensor's
    ``Shard._replicate_to_shard`` clones the rank's chunk (``_select_split_tensor(...,
    clone=True)``), a new buffer of a share held through the projection's backward, which
    makes the root's backward peak. The peak, every category at it and every module's peaks
    (the root's backward one was 448 B low with the plain plan, 896 B with sequence
    parallelism), to the byte."""
    import tp_models

    whole = tp_models.plain_plan() if plan == "plain" else tp_models.whole_plan()
    _check_tp_llama(fake_pg, whole, _loss, vocab=40, hidden=16, batch=3)


@pytest.mark.parametrize("mesh", [(2, 2), (1, 4)], ids=["tp2", "tp4"])
@pytest.mark.parametrize("plan", ["plain", "sequence_parallel", "loss_parallel"])
def test_tensor_parallel_uneven_vocabulary(fake_pg: int, plan: str, mesh: tuple[int, int]) -> None:
    """A vocabulary of 33 the tp ranks do not divide: DTensor chunks it as ``torch.chunk``
    does (``Shard._split_tensor``: 17 and 16 rows over 2 ranks, 9, 9, 9 and 6 over 4), and
    fsdpviz models the first rank, the one with the most, as it does the parameters' shards:
    the logits, their upcast, gradients and the loss-parallel handlers' tensors are its 9 of
    the 33 columns, not 1/tp of them. Replicating the logits gathers them as
    ``Shard._to_replicate_tensor`` does: into a buffer padded to 4 x 9 columns, put in place
    by ``torch.cat`` into a second, then copied out unpadded (``contiguous()``). The peak,
    every category at it and every module's peaks to the byte (the peak was 240 B low over
    2 ranks with the plain plan, 648 B over 4; the loss-parallel backward tensors 144 B and
    216 B)."""
    import tp_models
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel

    whole = tp_models.plain_plan() if plan == "plain" else tp_models.whole_plan()
    loss, around = _loss, nullcontext
    if plan == "loss_parallel":
        whole["output"] = ColwiseParallel(input_layouts=Shard(1), use_local_output=False)
        loss, around = _cross_entropy, loss_parallel
    _check_tp_llama(fake_pg, whole, loss, vocab=33, hidden=16, batch=3, around=around, mesh=mesh)


@pytest.mark.parametrize("batch", [1, 2])
def test_tensor_parallel_uneven_sequence(fake_pg: int, batch: int) -> None:
    """A sequence of 30 over 4 tp ranks, the residual stream kept a sequence-sharded DTensor:
    the first rank holds 8 of the 30 rows (``torch.chunk``: 8, 8, 8, 6). A reduce-scatter
    onto the sequence pads as ``Shard._reduce_shard_tensor`` does (the chunks padded or made
    contiguous, held while ``torch.cat`` joins them into a padded buffer, which
    ``_chunk_or_narrow_cat`` copies onto dim 0), an all-gather from it as
    ``Shard._to_replicate_tensor`` does, and with a batch of one ``_maybe_view_chunk_cat``
    views the gathered buffer instead of copying it. The peak, every category at it and
    every module's peaks to the byte (the root's backward peak was 2,816 B low with a batch
    of 2, 576 B with one; with the reduce-scatter right but no view, 768 B high with one)."""
    import tp_models

    _check_tp_llama(fake_pg, tp_models.dtensor_plan(), _loss, vocab=32, hidden=16,
                    batch=batch, mesh=(1, 4), seq=30)  # fmt: skip


class _TokenTable(nn.Embedding):
    """An embedding whose class name does not say so: ``RowwiseParallel`` shards it as one."""


@pytest.mark.parametrize("table", [nn.Embedding, _TokenTable], ids=["embedding", "subclass"])
def test_row_wise_embedding_gradient_redistributed_before_the_reduction(
    fake_pg: int, table: type[nn.Embedding]
) -> None:
    """A row-wise embedding's gradient is whole on every rank (DTensor's
    ``embedding_dense_backward``); the root's post-backward redistributes it to ``Shard(0)``
    before it reshards (``FSDPParam._get_grad_inner_tensor``), and
    ``Shard._replicate_to_shard`` clones the rank's chunk beside the whole one, which
    ``.grad = None`` then frees. In the final callback, which ``ModTracker`` counts in no
    module's window. The peak was 384 B low (the chunk) with bf16 parameters reducing in
    float32; now the peak, every category at it and every module's peaks to the byte."""
    import tp_models
    from torch.distributed.tensor.parallel import parallelize_module

    whole, mp = tp_models.whole_plan(), MixedPrecisionPolicy(torch.bfloat16, torch.float32)

    def build() -> nn.Module:
        model = tp_models.Llama(vocab=32, dim=16, n_heads=4, hidden=6, layers=1)
        model.tok_embeddings = table(32, 16)
        return model

    def parallelize(model: nn.Module, tp_mesh: Any) -> nn.Module:
        return parallelize_module(model, tp_mesh, whole)

    def ids() -> torch.Tensor:
        return torch.randint(0, 32, (1, 4), generator=torch.Generator().manual_seed(0))

    real = tracked(build, lambda: {"tokens": ids()}, lambda m: list(m.layers.values()), fake_pg,
                   _loss, mesh_shape=(2, 2), parallelize=parallelize, mp_policy=mp)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, ids(), fully_shard=[("layers.0",)], loss=_loss, mp_policy=mp,
                             mesh=("dp_shard", 2, "tp", 2), parallelize_plan=whole)  # fmt: skip
    mem = memory_model(report, optimizer=None)
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model))
    assert mem.peak["where"].startswith("at the redistribution of a whole gradient")


def test_head_after_a_norm(fake_pg: int) -> None:
    """The LM head as a unit of its own after the final norm: its backward peak closes at
    its post-backward, before the norm's backward (no FLOPs) and the next layer's copy-out."""
    n = ExampleConfig().num_layers
    real = tracked(
        lambda: ExampleModel(ExampleConfig()),
        _ids,
        lambda m: [*m.layers, m.lm_head],
        fake_pg,
        _loss,
    )
    with torch.device("meta"):
        model = ExampleModel(ExampleConfig())
    units = [*[(f"layers.{i}",) for i in range(n)], ("lm_head",)]
    report = fsdpviz.analyze(model, _ids(), fully_shard=units, loss=_loss, world_size=fake_pg)
    mem = memory_model(report, optimizer=None, iteration=0)
    backward = _as_the_tracker_sees(report, mem, model)
    _compare(real, mem, backward=backward)
    # FSDP holds lm_head's 1 MiB gradient until its reduction returns (foreach_reduce's loop
    # variable), after the reduced shard is allocated: lm_head's backward peak is that moment
    assert backward == {unit: phases["backward"] for unit, phases in mem.unit_peaks.items()}
    events = report.iterations[0]
    k = next(k for k, e in enumerate(events) if e.kind == "reduce_scatter" and e.unit == "lm_head")
    after = [m for m in mem.moments if m.kind == "event" and m.event == k][-1]
    grads = after.bytes[CATEGORIES.index("unsharded_grads")]
    assert grads == 2**20 and sum(after.bytes) == mem.unit_peaks["lm_head"]["backward"]


def test_an_input_cut_from_a_larger_tensor(fake_pg: int) -> None:
    """The tracker counts the whole storage of an input cut from a larger tensor; fsdpviz
    counts the batch, what it holds once moved to a GPU."""

    def cut() -> dict[str, torch.Tensor]:
        return {"input_ids": torch.zeros(100, 64, dtype=torch.long)[2:4]}

    build = functools.partial(ExampleModel, ExampleConfig())
    real = tracked(build, cut, lambda m: list(m.layers), fake_pg, _loss)
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, cut(), fully_shard=[DecoderLayer], world_size=fake_pg)
    mem = memory_model(report, optimizer=None, iteration=0)
    rest = (100 - 2) * 64 * 8
    assert mem.peak["breakdown"]["inputs"] == 2 * 64 * 8
    assert real.peak["Inputs"] == mem.peak["breakdown"]["inputs"] + rest
    assert real.peak["Total"] == mem.peak["bytes"] + rest


class _Picking(nn.Module):
    """A block that indexes with a list, as Falcon picks its keys and values
    (``qkv[:, :, :, [-2]]``), and with a tensor made from data on the activations' device."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x).view(*x.shape[:-1], 8, 4)
        picked = h[..., [-2]] * h[..., torch.tensor([1], device=h.device)]
        return picked.flatten(-2).repeat(1, 1, 2)


class _Picks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Picking() for _ in range(3))
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.head(x)
        return out


@pytest.mark.parametrize("optimizer", [False, True], ids=["no-optimizer", "adam"])
def test_index_tensors_torch_makes_of_lists_and_data(fake_pg: int, optimizer: bool) -> None:
    """torch turns a list index into an int64 tensor on the indexed tensor's device, and
    ``torch.tensor(data, device=...)`` makes its storage, both before any operator runs;
    indexing saves them for its backward, so every layer holds 16 bytes more until its
    backward: counted to the byte (before, each peak missed 8 bytes per layer)."""

    def inputs() -> dict[str, torch.Tensor]:
        return {"x": torch.ones(2, 6, 16)}

    real = tracked(_Picks, inputs, lambda m: list(m.layers), fake_pg, _loss, optimizer=optimizer)
    with torch.device("meta"):
        model = _Picks()
    report = fsdpviz.analyze(
        model, inputs(), fully_shard=[_Picking], world_size=fake_pg, loss=_loss
    )
    mem = memory_model(report, optimizer="adam" if optimizer else None, iteration=int(optimizer))
    steps = 4 * len(list(model.parameters())) if optimizer else 0  # Adam's step counters
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model), steps=steps)
    assert mem.unit_peaks["layers.2"]["forward"] - mem.unit_peaks["layers.0"]["forward"] >= 32


def test_tracker_gathers_a_group_once_per_module(fake_pg: int) -> None:
    """``FSDPMemTracker`` registers FSDP2's forward hooks again one module at a time, so a
    unit that groups several modules is all-gathered (and freed, and reduce-scattered) once
    per module; FSDP does it once per unit, as fsdpviz predicts."""
    from memtracker_harness import count_all_gathers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def groups(m: nn.Module) -> list[list[nn.Module]]:
        return [[layer.self_attn, layer.mlp] for layer in m.layers]

    real = tracked(lambda: ExampleModel(ExampleConfig()), _ids, groups, fake_pg, _loss)
    mesh = init_device_mesh("cpu", (fake_pg,))
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = ExampleModel(ExampleConfig())
        for group in groups(model):
            fully_shard(group, mesh=mesh)
        fully_shard(model, mesh=mesh)
        with count_all_gathers() as untracked:
            _loss(model(**_ids())).backward()
    with torch.device("meta"):
        model = ExampleModel(ExampleConfig())
    units = [(f"layers.{i}.self_attn", f"layers.{i}.mlp") for i in range(len(model.layers))]
    report = fsdpviz.analyze(model, _ids(), fully_shard=units, loss=_loss, world_size=fake_pg)
    predicted = sum(e.kind == "all_gather" for e in report.iterations[0])
    n = len(units)
    assert untracked.count == predicted == 2 * n + 1  # each group in forward and backward, root
    assert real.all_gathers == 4 * n + 1  # each module of each group
    mem = memory_model(report, optimizer=None, iteration=0)
    assert mem.peak["bytes"] - real.peak["Total"] == 885_248


# ------------------------------------------------------------------ gloo ranks


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_gloo(tmp_path_factory.mktemp("memtracker-gloo"))


def _predict(case: GlooCase) -> tuple[fsdpviz.Report, MemoryReport, nn.Module]:
    report, steps, model = _predict_step(case)
    return report, steps[-1], model


def _predict_step(case: GlooCase) -> tuple[fsdpviz.Report, list[MemoryReport], nn.Module]:
    """The case planned, and the memory of each micro-step of the optimizer step the tracker
    follows (the second one with an optimizer: the steady state)."""
    with torch.device("meta"):
        model = case.build()
    extra = {"grad_accum": case.accumulate} if case.accumulate > 1 else {}
    report = fsdpviz.analyze(
        model, case.inputs(), fully_shard=case.units, loss=case.loss,
        world_size=GLOO_WORLD_SIZE, **case.options, **extra,
    )  # fmt: skip
    first = case.accumulate if case.optimizer else 0
    steps = [
        memory_model(report, optimizer=case.optimizer, iteration=i)
        for i in range(first, first + case.accumulate)
    ]
    return report, steps, model


def _ranks(out: Path, name: str) -> list[Tracked]:
    return [load_tracked(out, name, rank) for rank in range(GLOO_WORLD_SIZE)]


def _storage_bytes(inputs: dict[str, torch.Tensor]) -> int:
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in inputs.values()}
    return sum(storages.values())


def _after_forward(report: fsdpviz.Report, iteration: int) -> int:
    """fsdpviz's activations and forward temporaries when the root's forward returns."""
    calls = tape(report, iteration).calls
    end = next(c for c in calls if c.hook == "post_forward" and c.unit == "")
    return end.activations + end.forward_temp


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-labels", "shifted-views", "neox-labels"])
def test_gloo_ranks_exact(gloo: Path, name: str) -> None:
    """Exact to the byte on each rank: the peak, every category at it, every module's forward
    and backward peak. ``llama-labels`` and ``neox-labels`` pass ``labels=input_ids`` (one
    tensor under two names: one storage of inputs) and shard the LM head on its own after the
    final RMSNorm / LayerNorm; ``shifted-views`` passes ``batch[:, :-1]`` and ``batch[:, 1:]``
    (two views: the batch's storage once)."""
    case = gloo_cases()[name]
    report, mem, model = _predict(case)
    inputs = _storage_bytes(case.inputs())
    assert mem.peak["breakdown"]["inputs"] == inputs
    backward = _as_the_tracker_sees(report, mem, model)
    for real in _ranks(gloo, name):
        assert real.peak["Inputs"] == inputs
        _compare(real, mem, backward=backward)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-accumulate", "llama-accumulate-bf16"])
def test_gloo_gradient_accumulation_exact(gloo: Path, name: str) -> None:
    """Three micro-steps per AdamW step, the first two without gradient sync: the step's peak,
    every category at it and every module's forward and backward peak (the most over the
    micro-steps) equal the tracker's to the byte. fp32 gradients are added into the earlier
    micro-steps' in place; with bf16 compute and an fp32 ``reduce_dtype`` FSDP2 keeps the
    unreduced gradients in fp32 between micro-steps (``to_accumulated_grad_if_needed``):
    twice the bytes of a bf16 copy, all of the model's before the last micro-step."""
    case = gloo_cases()[name]
    report, steps, model = _predict_step(case)
    at_peak = max(steps, key=lambda m: m.peak["bytes"])
    unit_peaks = _most_over_micro_steps(report, steps, model)
    combined = replace(at_peak, unit_peaks=unit_peaks)
    steps_bytes = 4 * len(list(model.parameters()))  # AdamW's step counters
    grads = sum(model.get_parameter(p).numel() for u in report.units for p in u.params)
    # what the last micro-step starts with: fp32 either way (fp32 parameters' gradients, or
    # bf16 ones cast to the reduce dtype)
    assert steps[-2].events[-1]["unsharded_grads"] == grads * 4
    for real in _ranks(gloo, name):
        _compare(real, combined, steps=steps_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["foreach", "for_loop", "fused"])
def test_gloo_optimizer_step_temporaries(gloo: Path, impl: str) -> None:
    """AdamW's step after backward, as each implementation runs it: foreach makes
    ``exp_avg_sq.sqrt()`` of every shard at once (one state's bytes), the for-loop one of a
    parameter at a time and its division (the previous parameter's still bound), fused nothing. The
    tracker follows the step on its own: its peak, every category at it, equal fsdpviz's step
    to the byte; and the micro-steps' peak and module peaks as before."""
    name = f"llama8-step-{impl}"
    case = gloo_cases()[name]
    report, mem, model = _predict(case)
    step = mem.moments[-1]
    assert step.where == "during the optimizer step after"
    got = dict(zip(CATEGORIES, step.bytes, strict=True))
    states = sum(u.sharded_numel for u in report.units) * 4
    # for-loop: a parameter's sqrt() and its division, the previous parameter's result still
    # bound to the loop's variable: the LM head's two (the largest), the final norm's one
    shards = [p.numel() // GLOO_WORLD_SIZE * 4 for p in model.parameters()]
    loop = max(2 * n + (shards[i - 1] if i else 0) for i, n in enumerate(shards))
    extra = {"foreach": states, "for_loop": loop, "fused": 0}[impl]
    assert got["optimizer"] == 2 * states + extra
    steps = 4 * len(list(model.parameters()))  # AdamW's step counters
    backward = _as_the_tracker_sees(report, mem, model)
    before_step = replace(mem, peak=_peak_of(mem.moments[:-1]))
    for real in _ranks(gloo, name):
        assert real.step_peak["Total"] == sum(step.bytes) + steps
        for label, (theirs, ours) in MAPPING.items():
            a = sum(real.step_peak.get(k, 0) for k in theirs)
            b = sum(got[k] for k in ours) + (steps if "OptState" in theirs else 0)
            assert a == b, f"{label} at the step: FSDPMemTracker {a} B, fsdpviz {b} B"
        _compare(real, before_step, backward=backward, steps=steps)


def _peak_of(moments: list[Any]) -> dict[str, Any]:
    """A memory report's ``peak`` over these moments."""
    top = max(moments, key=lambda m: sum(m.bytes))
    breakdown = dict(zip(CATEGORIES, top.bytes, strict=True))
    return {"bytes": sum(top.bytes), "where": top.where, "breakdown": breakdown}


@pytest.mark.slow
def test_gloo_copies_each_reduce_scatter_input(gloo: Path) -> None:
    """gloo's reduce-scatter copies its input while it completes (NCCL does not): each copy is
    the unit's reduce-scatter input, and the unit's backward peak reads it when its
    reduce-scatter is the unit's highest moment (lm_head's here)."""
    name = "llama-gloo-reduce-scatter"
    report, mem, model = _predict(gloo_cases()[name])
    sizes = unit_bytes(report, None)
    events = report.iterations[0]
    inputs = [sizes[e.unit].reduce_scatter for e in events if e.kind == "reduce_scatter"]
    assert inputs == [65_536, 147_968, 147_968, 65_792]  # lm_head, layers.1, layers.0, root
    backward = _as_the_tracker_sees(report, mem, model, copies=True)
    assert backward["lm_head"] - mem.unit_peaks["lm_head"]["backward"] == 57_344
    for real in _ranks(gloo, name):
        assert real.reduce_scatter_copies == inputs
        _compare(real, mem, backward=backward)


@pytest.mark.slow
def test_gloo_adamw_step_counters(gloo: Path) -> None:
    """AdamW keeps a 4-byte ``step`` tensor per parameter, on the host on a GPU (unless
    ``capturable`` or ``fused``), in the tracker's optimizer state on a CPU."""
    case = gloo_cases()["llama-adamw"]
    report, mem, model = _predict(case)
    steps = 4 * len(list(model.parameters()))
    assert steps == 84
    backward = _as_the_tracker_sees(report, mem, model)
    for real in _ranks(gloo, "llama-adamw"):
        assert real.peak["OptState"] == mem.peak["breakdown"]["optimizer"] + steps
        _compare(real, mem, backward=backward, steps=steps)


@pytest.mark.slow
def test_gloo_bf16_layer_norm_statistics(gloo: Path) -> None:
    """CPU ``native_layer_norm`` keeps a bf16 input's mean and rstd in bf16; meta and CUDA
    keep them in fp32: 4 bytes less per token per layer norm on the CPU, while they live."""
    case = gloo_cases()["neox-bf16"]
    report, mem, model = _predict(case)
    norms = sum(isinstance(m, nn.LayerNorm) for m in model.modules())
    tokens = case.inputs()["input_ids"].numel()
    statistics = norms * 2 * tokens * (4 - 2)  # mean and rstd, fp32 -> bf16
    assert (norms, tokens, statistics) == (5, 32, 640)
    backward = _as_the_tracker_sees(report, mem, model)
    for real in _ranks(gloo, "neox-bf16"):
        assert real.after_forward["Activation"] == _after_forward(report, 0) - statistics
        assert real.peak["Total"] == mem.peak["bytes"] - 256  # the last layer's two norms
        # lm_head runs after every norm, before any of their backwards
        assert real.modules["lm_head"]["forward"] == mem.unit_peaks["lm_head"]["forward"] - 640
        assert real.modules["lm_head"]["backward"] == backward["lm_head"] - 640


@pytest.mark.slow
def test_gloo_list_index_tensors(gloo: Path) -> None:
    """``logits[:, [3, 7, 11]]`` makes an int64 tensor of the list on the device of the tensor
    indexed (torch's ``sequenceToVariable(self.options(), ...)``), saved for backward: 8 bytes
    per index, counted as a GPU holds them."""
    case = gloo_cases()["picked-list-index"]
    report, mem, model = _predict(case)
    backward = _as_the_tracker_sees(report, mem, model)
    for real in _ranks(gloo, "picked-list-index"):
        assert real.after_forward["Activation"] == _after_forward(report, 0)
        _compare(real, mem, backward=backward)  # backward has freed it by the peak


# ------------------------------------------------------------------ fine-tuning adapters


def _collect_after_dora(model: nn.Module) -> nn.Module:
    """Collect garbage after each DoRA layer's forward. The identity matrix DoRA builds
    (``torch.eye(in_features)``, the input of its ``lora_A``) is saved by that linear's
    backward node, which the gradient hook torch's ``ModTracker`` puts on ``lora_B``'s input
    (``register_multi_grad_hook``, mode "all") keeps in its closure: a reference cycle
    through the hooked tensor, until Python's garbage collector runs. Without it the matrix
    dies when the forward returns, as fsdpviz counts it (the peak measured with no module
    followed and nothing collected is the same)."""
    import gc

    from peft.tuners.lora.dora import DoraLinearLayer

    def collect(*_: Any) -> None:
        gc.collect()

    for module in model.modules():
        if isinstance(module, DoraLinearLayer):
            module.register_forward_hook(collect)
    return model


@pytest.mark.parametrize("optimizer", [None, "adamw"])
@pytest.mark.parametrize(
    "name", ["llama-lora", "neox-dora", "llama-lora-bf16", "llama-dora-embedding"]
)
def test_peft_adapters(fake_pg: int, name: str, optimizer: str | None) -> None:
    """LoRA (Llama) and DoRA (GPT-NeoX, a magnitude vector per adapted linear) as
    ``peft.get_peft_model`` builds them, LoRA on a bf16 Llama with peft's fp32 adapters
    (each group in two dtypes), and DoRA on Llama's embedding (a graph built in forward and
    dropped there, its saved tensors with it), each layer a unit, real CPU tensors: AdamW
    keeps state for the adapters only, FSDP2 reduce-scatters and keeps their gradients only,
    and the peak, every category at it and every module's peaks equal FSDPMemTracker's to
    the byte."""
    pytest.importorskip("peft")
    from peft_models import MODELS

    factory = MODELS[name]
    layer = factory()[2]
    real = tracked(
        lambda: _collect_after_dora(factory()[0]), lambda: dict(factory()[1]),
        lambda m: [x for x in m.modules() if isinstance(x, layer)], fake_pg, _hf_loss,
        optimizer=optimizer or False, real=True,
    )  # fmt: skip
    # measured again with no module window followed and no garbage collected: the peak and
    # every category at it are the run's own (see _collect_after_dora)
    bare = tracked(
        lambda: factory()[0], lambda: dict(factory()[1]),
        lambda m: [x for x in m.modules() if isinstance(x, layer)], fake_pg, _hf_loss,
        optimizer=optimizer or False, real=True, follow_modules=False,
    )  # fmt: skip
    assert bare.peak == real.peak
    with torch.device("meta"):
        model, inputs, _ = factory()
    report = fsdpviz.analyze(model, inputs, fully_shard=[layer], loss=_hf_loss, world_size=fake_pg)
    mem = memory_model(report, optimizer=optimizer, iteration=1 if optimizer else 0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert 0 < sum(p.numel() for p in trainable) < sum(p.numel() for p in model.parameters()) / 10
    steps = 4 * len(trainable) if optimizer else 0  # AdamW's step counters
    _compare(real, mem, backward=_as_the_tracker_sees(report, mem, model), steps=steps)
    if optimizer:  # two states of each adapter's shard, none of the frozen weights
        shards = sum(u.trainable[1] for u in report.units)
        assert mem.peak["breakdown"]["optimizer"] == 2 * 4 * shards > 0
    # the gradients left after backward: each unit's trainable shards
    last = mem.moments[-1].bytes[CATEGORIES.index("sharded_grads")]
    assert (
        real.after_backward["Sharded Grad"] == last == sum(4 * u.trainable[1] for u in report.units)
    )


def test_post_forward_shards_of_layers_no_gradient_reaches(fake_pg: int) -> None:
    """LoRA on the LM head only, each frozen layer resharded after forward onto 2 of the 4
    ranks, two micro-steps: no gradient reaches the layers, so FSDP2's root post-backward
    callback reshards them (``post_backward`` -> ``_to_sharded``), which leaves their
    post-forward shards allocated (only ``to_unsharded`` from SHARDED_POST_FORWARD frees
    them); the second micro-step's forward holds them until each layer's reshard after
    forward replaces them. The peak and every module's peaks over the micro-steps to the
    byte (the tracker files post-forward shards as forward tensors: those two compared
    together)."""
    pytest.importorskip("peft")
    from peft_models import llama_lora_head

    n, options = 2, {"reshard_after_forward": 2}
    layer = llama_lora_head()[2]
    real = tracked(
        lambda: llama_lora_head()[0], lambda: dict(llama_lora_head()[1]),
        lambda m: [x for x in m.modules() if isinstance(x, layer)], fake_pg, _hf_loss,
        real=True, accumulate=n, **options,
    )  # fmt: skip
    with torch.device("meta"):
        model, inputs, _ = llama_lora_head()
    report = fsdpviz.analyze(model, inputs, fully_shard=[layer], loss=_hf_loss,
                             world_size=fake_pg, grad_accum=n, **options)  # fmt: skip
    steps = [memory_model(report, optimizer=None, iteration=i) for i in range(n)]
    at_peak = max(steps, key=lambda m: m.peak["bytes"])
    assert real.peak["Total"] == at_peak.peak["bytes"]
    mine = at_peak.peak["breakdown"]
    theirs = real.peak.get("Sharded Param", 0) + real.peak.get("Activation", 0)
    assert theirs == mine["sharded_params"] + mine["activations"] + mine["forward_temp"]
    layers = [u.module for u in report.units if u.module.endswith(("layers.0", "layers.1"))]
    assert len(layers) == 2 and all(real.modules[m]["backward"] == 0 for m in layers)
    assert real.modules == _most_over_micro_steps(report, steps, model)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_tied_gpt2_with_labels_and_a_long_sequence(fake_pg: int, bf16: bool) -> None:
    """GPT-2 (its LM head tied to the token embedding, in the root's group) called with
    ``labels=input_ids`` on 2 x 512 tokens: exact in float32. With bf16 compute the tracker's
    forward tensors are lower by the layer norms' statistics alone, which the CPU keeps in
    bf16 and a GPU in fp32 (2 bytes per token for each of a norm's mean and rstd, while
    saved): no tensor is counted twice."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    def build() -> nn.Module:
        config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=1024)
        return GPT2LMHeadModel(config)

    def inputs() -> dict[str, torch.Tensor]:
        ids = torch.zeros(2, 512, dtype=torch.long)
        return {"input_ids": ids, "labels": ids}

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None)
    real = tracked(build, inputs, lambda m: list(m.transformer.h), fake_pg, _hf_loss, mp_policy=mp)
    with torch.device("meta"):
        model = build()
    assert model.lm_head.weight is model.transformer.wte.weight
    report = fsdpviz.analyze(model, inputs(), fully_shard=[GPT2Block], world_size=fake_pg,
                             loss=_hf_loss, mp_policy=mp)  # fmt: skip
    mem = memory_model(report, optimizer=None, iteration=0)
    if not bf16:
        _compare(real, mem)
        return
    norms = sum(isinstance(m, nn.LayerNorm) for m in model.modules())
    statistics = norms * 2 * 2 * 512 * (4 - 2)  # mean and rstd per token, fp32 -> bf16
    assert (norms, statistics) == (5, 20_480)
    assert real.after_forward["Activation"] == _after_forward(report, 0) - statistics
    assert real.peak["Total"] == mem.peak["bytes"] - 3 * statistics // norms  # 3 norms saved


# ------------------------------------------------------------- shard_placement_fn


def _on_last_dim(p: nn.Parameter) -> Any:
    """Shard the 2-D weights on their last dim where the 4 ranks divide it and the rows are
    not the vocabulary's (-1: FSDP2 counts from the end); the rest on dim 0, padded where
    uneven (the 1022-row embedding and head)."""
    from torch.distributed.tensor import Shard

    return Shard(-1) if p.ndim == 2 and p.shape[1] % 4 == 0 and p.shape[0] != 1022 else None


def _uneven_example() -> nn.Module:
    return ExampleModel(ExampleConfig(vocab_size=1022, intermediate_size=690))


class _WideBlock(nn.Module):
    """Three bias-free projections through ``width`` features, the largest registered last:
    FSDP2's reduction keeps its rebuilt gradient beside the reduce-scatter input until the
    copy-in is done."""

    def __init__(self, width: int = 1024) -> None:
        super().__init__()
        self.down = nn.Linear(width, 16, bias=False)
        self.back = nn.Linear(16, 64, bias=False)
        self.up = nn.Linear(64, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.back(self.down(torch.relu(self.up(x))))


class _WideNet(nn.Module):
    """Two wide blocks before a narrow one. With ``head=8192`` a bias-free head of 8192
    outputs, the root's last parameter: the root's reduction, in the final callback, is the
    step's peak when its reduce dtype doubles its gradients, with its rebuilt gradient kept
    beside the reduce-scatter input."""

    def __init__(self, head: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 64)
        self.blocks = nn.ModuleList(_WideBlock(w) for w in (1024, 1024, 64))
        self.head = nn.Linear(64, head, bias=head == 50)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def _wide_up(p: nn.Parameter) -> Any:
    """The wide blocks' ``up`` weights on dim 1, the rest on dim 0."""
    from torch.distributed.tensor import Shard

    return Shard(1) if p.shape[0] in (1024, 8192) else None


def _short_ids() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(2, 8, dtype=torch.long)}


def _as_the_tracker_names(report: fsdpviz.Report, mem: MemoryReport) -> MemoryReport:
    """``mem`` with the tracker's names at a peak where they are not fsdpviz's:

    - inside a unit's first copy-out: FSDP2 makes the unit's unsharded parameters there
      (``init_all_gather_outputs``), which the tracker counts as forward tensors until FSDP2's
      pre-forward returns and it labels them "Unsharded Param" (later copy-outs refill the
      same storages, labelled already);
    - at a reduction's copy-in: the tracker labels the reduce-scatter input "Reduce Scatter"
      when the collective runs, after the copy-in; until then it is a backward tensor.
    """
    where = str(mem.peak["where"])
    sizes = unit_bytes(report, None)
    moved, field, into = 0, "", ""
    if where.startswith("at the copy-out in pre_forward") and mem.config["iteration"] == 0:
        unit = where.partition(" of ")[2].strip("'")
        moved, field, into = sizes[unit].unsharded, "unsharded_params", "forward_temp"
    elif where.startswith("at reduce_scatter "):
        at = int(mem.peak["moment"])
        later = mem.moments[at + 1].where if at + 1 < len(mem.moments) else ""
        named = where.removeprefix("at reduce_scatter ").partition(" (")[0]
        unit = "" if named == "(root)" else named.strip("'")
        if later == where:  # the copy-in (the moment after it is the collective's)
            moved, field, into = sizes[unit].reduce_scatter, "reduce_scatter", "backward_temp"
    if not moved:
        return mem
    breakdown = dict(mem.peak["breakdown"])
    breakdown[field] -= moved
    breakdown[into] += moved
    return replace(mem, peak={**mem.peak, "breakdown": breakdown})


_PLACED: dict[str, tuple[Callable[[], nn.Module], Any, Any, dict[str, Any]]] = {
    "wide-up": (_WideNet, _short_ids, _WideBlock, {"shard_placement_fn": _wide_up}),
    "wide-head-bf16": (
        functools.partial(_WideNet, head=8192),
        _short_ids,
        _WideBlock,
        {
            "mp_policy": MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32
            ),
            "shard_placement_fn": _wide_up,
        },
    ),
    "wide-up-bf16": (
        _WideNet,
        _short_ids,
        _WideBlock,
        {
            "mp_policy": MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32
            ),
            "shard_placement_fn": _wide_up,
        },
    ),
    "example": (_uneven_example, _ids, DecoderLayer, {}),
    "example-bf16": (
        _uneven_example,
        _ids,
        DecoderLayer,
        {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)},
    ),
    "example-adam": (_uneven_example, _ids, DecoderLayer, {"optimizer": True}),
    "wide-bf16": (
        _WideNet,
        _short_ids,
        _WideBlock,
        {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)},
    ),
}


@pytest.mark.parametrize("case", list(_PLACED))
def test_shard_placement_fn(fake_pg: int, case: str) -> None:
    """Parameters sharded on their last dim (and dim-0 ones padded beside them): the peak,
    every category at it and every module's peaks to the byte, the copy-out's temporaries
    (the peak sits in a copy-out) and the gradients rebuilt before the reduce-scatter
    (``wide-bf16``: the blocks' backward peaks) included."""
    build, inputs, block, options = _PLACED[case]
    optimizer = bool(options.get("optimizer", False))
    options = {"shard_placement_fn": _on_last_dim} | {
        k: v for k, v in options.items() if k != "optimizer"
    }
    real = tracked(build, inputs, lambda m: list(m.layers if hasattr(m, "layers") else m.blocks),
                   fake_pg, _loss, optimizer=optimizer, **options)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, inputs(), fully_shard=[block], loss=_loss, world_size=fake_pg,
                             **options)  # fmt: skip
    assert any(u.shard_dims for u in report.units)
    mem = memory_model(report, optimizer="adam" if optimizer else None, iteration=int(optimizer))
    steps = 4 * len(list(model.parameters())) if optimizer else 0  # Adam's step counters
    backward = _as_the_tracker_sees(report, mem, model)
    if case == "wide-head-bf16":
        backward[""] = _root_before_final_callback(report, mem)
    _compare(real, _as_the_tracker_names(report, mem), backward=backward, steps=steps)


def _root_before_final_callback(report: fsdpviz.Report, mem: MemoryReport) -> int:
    """The root's backward peak as the tracker sees it where the root's own reduction is the
    most: its window (``ModTracker``'s) closes when autograd is done with the root, before
    FSDP2's final callback, where the root reduces its gradients; fsdpviz's root window, like
    FSDP2's post-backward of the root, holds the final callback."""
    calls = tape(report, mem.config["iteration"]).calls
    opened = next(k for k, c in enumerate(calls) if c.hook == "pre_backward" and c.unit == "")
    final = next(k for k, c in enumerate(calls) if c.hook == "final_callback")
    return max(
        sum(m.bytes)
        for m in mem.moments
        if opened <= m.call < final and not (m.call == opened and m.kind == "compute")
    )


@pytest.mark.parametrize(
    ("precision", "sizes", "tokens"),
    [("fp32", (50, 32, 4, 8, 3), (1, 6)), ("bf16_fp32_reduce", (48, 16, 2, 12, 2), (3, 6))],
    ids=["fp32", "bf16_fp32_reduce"],
)
def test_tensor_parallel_accumulation(
    fake_pg: int, precision: str, sizes: tuple[int, ...], tokens: tuple[int, int]
) -> None:
    """FSDP x TP on a 2 x 2 mesh accumulating over two micro-steps, the first without
    gradient sync: the row-wise embedding's gradient is whole on every rank (DTensor's
    ``embedding_dense_backward`` gives a replicated weight gradient, never ``Shard(0)``), and
    stays so into the next micro-step. The step's peak, every category at it and every
    module's peaks, to the byte."""
    import tp_models
    from torch.distributed.tensor.parallel import parallelize_module

    whole = tp_models.plain_plan()
    mp = {}
    if precision != "fp32":
        mp = {"mp_policy": MixedPrecisionPolicy(torch.bfloat16, torch.float32)}
    vocab, dim, heads, hidden, layers = sizes

    def build() -> nn.Module:
        return tp_models.Llama(vocab=vocab, dim=dim, n_heads=heads, hidden=hidden, layers=layers)

    def parallelize(model: nn.Module, tp_mesh: Any) -> nn.Module:
        return parallelize_module(model, tp_mesh, whole)

    def ids() -> torch.Tensor:
        return torch.randint(0, vocab, tokens, generator=torch.Generator().manual_seed(0))

    n, units = 2, [(f"layers.{i}",) for i in range(layers)]
    real = tracked(build, lambda: {"tokens": ids()}, lambda m: list(m.layers.values()),
                   fake_pg, _loss, mesh_shape=(2, 2), parallelize=parallelize, accumulate=n,
                   **mp)  # fmt: skip
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(model, ids(), fully_shard=units, mesh=("dp_shard", 2, "tp", 2),
                             parallelize_plan=whole, loss=_loss, grad_accum=n, **mp)  # fmt: skip
    steps = [memory_model(report, optimizer=None, iteration=i) for i in range(n)]
    unit_peaks = _most_over_micro_steps(report, steps, model)
    at_peak = max(steps, key=lambda m: m.peak["bytes"])
    _compare(real, replace(at_peak, unit_peaks=unit_peaks))
    if precision == "fp32":  # left by the first micro-step: each rank's share of every
        # gradient (the norms' whole), but the embedding's, whole (twice its share)
        shares = sum(u.numel for u in report.units) * 4
        assert steps[0].events[-1]["unsharded_grads"] == shares + vocab * dim * 4 // 2


def test_tensor_parallel_with_activation_checkpointing(fake_pg: int) -> None:
    """FSDP2 x TP with each block checkpointed: the recomputation's saved tensors are freed
    by the backward that reads them, as on a real run. (The emulation once kept every
    autograd node its styles made, and with them the recomputed blocks' saved tensors, to
    the end of the step: KempnerForge's 7B on TP 2 came to 88.5 GiB against 57.8 GiB.)"""
    import tp_models

    _check_tp_llama(fake_pg, tp_models.whole_plan(), _loss, vocab=32, hidden=16, batch=2,
                    checkpointed=True)  # fmt: skip
