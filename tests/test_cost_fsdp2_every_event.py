"""Anchor: FSDP2's memory at every event against real torch, across ``fully_shard``'s
options.

``reshard_after_forward`` True, False and an int (onto 2 of 4 ranks; on HSDP's 2 x 4
mesh, onto 2 of the 4 shard ranks), with and without gradient accumulation (the micro-
steps before the last with ``set_requires_gradient_sync(False)``, and with
``set_reshard_after_backward(False)`` too, as ``analyze``'s ``grad_accum`` and
``reshard_after_backward=False`` model them), float32 and bf16 parameters (reducing in
bf16 or float32), and a layer whose parameters are all frozen. And configurations users
run (``SETUPS``): HSDP accumulating with ``set_requires_all_reduce(False)`` (reduce-
scatter every micro-step, all-reduce the last; over three micro-steps; kept gathered
after backward too); one ``fully_shard`` call over several modules (torch's list form:
the layers together, or the embedding and the head, which run first and last); explicit
prefetches (``set_modules_to_forward_prefetch`` / ``..._backward_...``, two groups ahead,
or from the root); parameters left out by ``ignored_params``; one frozen weight among a
group's trainable ones; the embedding in a call of its own, with
``set_unshard_in_backward(False)`` (not gathered in backward, as ``analyze``'s
``unshard_in_backward`` models it) and without; the same on one call of two embeddings
(the tokens' and learned positions', a group whose backward reads no parameter; the setter
called on its second module), and on the embedding and the head in one call kept unsharded
after forward (its pre-backward finds them gathered: no all-gather either way); the
embedding with the setter under activation checkpointing, alone (its recompute stops before
the lookup) and with a norm after it in one checkpointed region (its recompute, before the
group's pre-backward, all-gathers it). The
moments, and the two figures compared at each event (the bytes in use, the most since the
event before), are those of
``test_cost_hybrid_every_event.py``; on a 1-D mesh, and on HSDP's micro-steps that do not
all-reduce, the reduce-scatter is ``foreach_reduce``'s last collective, its moment the
post-backward's return (the function's loop's last gradient let go). ``CPUOffloadPolicy``
is not compared here: on the CPU the host's bytes and the device's are one count.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
import torch
from every_event import Measured, fsdp2_events, same, steady
from test_cost_fsdp1_memtracker import CONFIG, _ids, _loss
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleModel

BF16 = (torch.bfloat16, torch.bfloat16)
BF16_FP32 = (torch.bfloat16, torch.float32)


def _model(frozen: bool) -> ExampleModel:
    """The example model; ``frozen``: its first layer's parameters all frozen."""
    model = ExampleModel(CONFIG)
    if frozen:
        model.layers[0].requires_grad_(False)
    return model


Shard = Callable[[ExampleModel, DeviceMesh], None]  # fully_shard's calls, and setters after
Switch = Callable[[ExampleModel, bool], None]  # before a micro-step: whether it is the last


def _run(
    model: ExampleModel, mesh: tuple[int, ...], shard: Shard, switch: Switch, micro_steps: int
) -> Measured:
    """``shard`` applied to ``model`` on ``mesh``: the events of the second optimizer step's
    micro-steps (``switch`` called before each), each with the bytes in use at its moment
    and the most since the event before."""
    names = ("dp_replicate", "dp_shard")[-len(mesh) :]
    shard(model, init_device_mesh("cpu", mesh, mesh_dim_names=names))
    ids = _ids()  # held through the step
    with fsdp2_events(model, ids, hsdp=len(mesh) == 2) as log:
        for step in range(2):
            if step == 1:
                log.restart()
            for k in range(micro_steps):
                switch(model, k == micro_steps - 1)
                out = model(ids)
                _loss(out).backward()
                del out
            for p in model.parameters():
                p.grad = None
    return cast(Measured, log.measured())


def _layers_and_root(**options: Any) -> Shard:
    """``fully_shard(..., **options)`` on each layer, then the root."""
    from torch.distributed.fsdp import fully_shard

    def shard(model: ExampleModel, mesh: DeviceMesh) -> None:
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, **options)
        fully_shard(model, mesh=mesh, **options)

    return shard


def _measured(
    mesh: tuple[int, ...], options: dict[str, Any], micro_steps: int, keep: bool, frozen: bool
) -> Measured:
    """``fully_shard(..., **options)`` on each layer and the root, the micro-steps before
    the last without gradient sync (and kept gathered after backward where ``keep``)."""

    def switch(model: ExampleModel, last: bool) -> None:
        model.set_requires_gradient_sync(last)
        if keep:
            model.set_reshard_after_backward(last)

    torch.manual_seed(0)
    return _run(_model(frozen), mesh, _layers_and_root(**options), switch, micro_steps)


def _check(
    mesh: tuple[int, ...],
    reshard: bool | int,
    precision: tuple[torch.dtype, torch.dtype] | None,
    micro_steps: int,
    keep: bool = False,
    frozen: bool = False,
) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    options: dict[str, Any] = {"reshard_after_forward": reshard}
    if precision is not None:
        param, reduce = precision
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)
    real = _measured(mesh, options, micro_steps, keep, frozen)
    with torch.device("meta"):
        model = _model(frozen)
    accum: dict[str, Any] = {"grad_accum": micro_steps} if micro_steps > 1 else {}
    if keep:
        accum["reshard_after_backward"] = False
    report = fsdpviz.analyze(
        model, {"input_ids": _ids()}, fully_shard=[DecoderLayer], mesh=mesh, loss=_loss,
        **options, **accum,
    )  # fmt: skip
    same(real, steady(report, micro_steps))


# (reshard_after_forward, precision, micro-steps, kept gathered after backward, frozen)
CASES: dict[str, tuple[bool | int, Any, int, bool, bool]] = {
    "int-fp32": (2, None, 1, False, False),
    "int-bf16-accum": (2, BF16, 2, False, False),
    "int-bf16-fp32-accum-keep": (2, BF16_FP32, 2, True, False),
    "false-fp32-accum-keep": (False, None, 2, True, False),
    "true-bf16-fp32-accum-keep": (True, BF16_FP32, 2, True, False),
    "false-bf16-frozen-accum": (False, BF16, 2, False, True),
    "int-fp32-frozen": (2, None, 1, False, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fully_shard_options_hold_what_torch_holds_at_every_event(fake_pg: int, case: str) -> None:
    assert fake_pg == 4
    reshard, precision, micro_steps, keep, frozen = CASES[case]
    _check((4,), reshard, precision, micro_steps, keep, frozen)


# HSDP, 2 replicas x 4 shard ranks: (reshard_after_forward, precision, micro-steps, frozen)
HSDP_CASES: dict[str, tuple[bool | int, Any, int, bool]] = {
    "int-bf16-fp32-accum": (2, BF16_FP32, 2, False),
    "int-bf16-accum": (2, BF16, 2, False),
    "int-fp32-frozen": (2, None, 1, True),
    "true-bf16-frozen-accum": (True, BF16, 2, True),
}


@pytest.mark.parametrize("case", list(HSDP_CASES))
def test_hybrid_sharding_options_hold_what_torch_holds_at_every_event(
    as_rank: Callable[..., None], case: str
) -> None:
    as_rank(0, 8)
    reshard, precision, micro_steps, frozen = HSDP_CASES[case]
    _check((2, 4), reshard, precision, micro_steps, frozen=frozen)


@pytest.mark.parametrize("micro_steps", [1, 2], ids=["one_step", "no_sync"])
@pytest.mark.parametrize("precision", [None, BF16_FP32], ids=["fp32", "bf16"])
def test_hybrid_sharding_over_two_shard_ranks_holds_what_torch_holds_at_every_event(
    fake_pg: int, precision: Any, micro_steps: int
) -> None:
    """HSDP on the fake process group's 4 ranks, 2 replicas x 2 shard ranks, resharding
    after forward."""
    assert fake_pg == 4
    _check((2, 2), True, precision, micro_steps)


def _sync(model: ExampleModel, last: bool) -> None:
    model.set_requires_gradient_sync(last)


def _all_reduce(model: ExampleModel, last: bool) -> None:
    model.set_requires_all_reduce(last)


def _all_reduce_kept_gathered(model: ExampleModel, last: bool) -> None:
    model.set_requires_all_reduce(last)
    model.set_reshard_after_backward(last)


def _each_step(model: ExampleModel, last: bool) -> None:
    """Every micro-step reduces (or there is one)."""


def _grouped_layers(model: ExampleModel, mesh: DeviceMesh) -> None:
    """The layers in one ``fully_shard`` call (torch's list form: one group), then the root."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(list(model.layers), mesh=mesh, mp_policy=_policy(BF16_FP32))
    fully_shard(model, mesh=mesh, mp_policy=_policy(BF16_FP32))


def _grouped_resharding_to_two(model: ExampleModel, mesh: DeviceMesh) -> None:
    """The first two of three layers in one call, the third in a list of its own, both
    resharding onto 2 ranks after forward, in bf16; then the root."""
    from torch.distributed.fsdp import fully_shard

    first, second, third = model.layers
    policy = _policy(BF16)
    fully_shard([first, second], mesh=mesh, reshard_after_forward=2, mp_policy=policy)
    fully_shard([third], mesh=mesh, reshard_after_forward=2, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def _grouped_ends(model: ExampleModel, mesh: DeviceMesh) -> None:
    """Each layer, then the embedding and the head in one call (a group whose modules run
    first and last), then the root (the final norm)."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=2)
    fully_shard([model.embed_tokens, model.lm_head], mesh=mesh, reshard_after_forward=2)
    fully_shard(model, mesh=mesh)


def _embedding_own_call(**options: Any) -> Shard:
    """The embedding, each layer, then the root, with ``options`` each."""
    from torch.distributed.fsdp import fully_shard

    def shard(model: ExampleModel, mesh: DeviceMesh) -> None:
        fully_shard(model.embed_tokens, mesh=mesh, **options)
        _layers_and_root(**options)(model, mesh)

    return shard


def _embedding_not_gathered_for_backward(**options: Any) -> Shard:
    """:func:`_embedding_own_call`, and the embedding's ``set_unshard_in_backward(False)``
    (its backward makes the weight's gradient from the indices)."""

    def shard(model: ExampleModel, mesh: DeviceMesh) -> None:
        _embedding_own_call(**options)(model, mesh)
        cast(Any, model.embed_tokens).set_unshard_in_backward(False)

    return shard


class PositionalModel(ExampleModel):
    """The example model with learned positions: a second embedding, added to the tokens'."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.embed_positions = nn.Embedding(16, config.hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed_tokens(input_ids) + self.embed_positions(positions)
        for layer in self.layers:
            x = layer(x)
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits


def _grouped_embeddings_not_gathered_for_backward(**options: Any) -> Shard:
    """The two embeddings in one call (torch's list form), each layer, then the root, with
    ``options`` each; the group's ``set_unshard_in_backward(False)``, called on its second
    module (a setter of any member sets the call's group)."""
    from torch.distributed.fsdp import fully_shard

    def shard(model: ExampleModel, mesh: DeviceMesh) -> None:
        positional = cast(PositionalModel, model)
        fully_shard([positional.embed_tokens, positional.embed_positions], mesh=mesh, **options)
        _layers_and_root(**options)(model, mesh)
        cast(Any, positional.embed_positions).set_unshard_in_backward(False)

    return shard


def _grouped_embeddings(**kwargs: Any) -> Callable[[ExampleModel], dict[str, Any]]:
    """``analyze``'s keywords for :func:`_grouped_embeddings_not_gathered_for_backward`."""
    return lambda model: {
        "fully_shard": [("embed_tokens", "embed_positions"), DecoderLayer],
        "unshard_in_backward": {"embed_positions": False},
        **kwargs,
    }


def _grouped_ends_kept_gathered(model: ExampleModel, mesh: DeviceMesh) -> None:
    """Each layer, then the embedding and the head in one call kept unsharded after forward
    with ``set_unshard_in_backward(False)`` (its pre-backward finds them unsharded: the
    head's backward reads its weight), then the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard([model.embed_tokens, model.lm_head], mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh)
    cast(Any, model.embed_tokens).set_unshard_in_backward(False)


def _prefetching_two_ahead(model: ExampleModel, mesh: DeviceMesh) -> None:
    """Each of three layers and the root; the first layer prefetches the other two in
    forward, the last the other two in backward."""
    _layers_and_root()(model, mesh)
    first, second, third = model.layers
    first.set_modules_to_forward_prefetch([second, third])
    third.set_modules_to_backward_prefetch([second, first])


def _prefetching_from_the_root(model: ExampleModel, mesh: DeviceMesh) -> None:
    """Each of three layers and the root, resharding after forward; the root prefetches the
    first two layers in forward, the second prefetches the first in backward, the first
    nothing."""
    _layers_and_root(reshard_after_forward=True)(model, mesh)
    first, second, _ = model.layers
    model.set_modules_to_forward_prefetch([first, second])
    second.set_modules_to_backward_prefetch([first])
    first.set_modules_to_backward_prefetch([])


def _ignoring(model: ExampleModel, mesh: DeviceMesh) -> None:
    """Each layer and the root, the first layer's up projection left out of sharding."""
    _layers_and_root(ignored_params={_up(model)})(model, mesh)


def _ignoring_the_head_too(model: ExampleModel, mesh: DeviceMesh) -> None:
    """Each layer and the root, the first layer's up projection and the head left out."""
    _layers_and_root(ignored_params={_up(model), model.lm_head.weight})(model, mesh)


def _up(model: ExampleModel) -> nn.Parameter:
    return cast(nn.Parameter, model.layers[0].mlp.up_proj.weight)


def _freeze_one_weight(model: ExampleModel) -> None:
    model.layers[0].self_attn.q_proj.weight.requires_grad_(False)


def _policy(precision: tuple[torch.dtype, torch.dtype]) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=precision[0], reduce_dtype=precision[1])


@dataclass(frozen=True)
class Setup:
    """A configuration as users run it: ``shard`` on the real model, ``switch`` before each
    micro-step, and ``kwargs``, ``analyze``'s keywords for the same on the meta copy."""

    mesh: tuple[int, ...]
    shard: Shard
    kwargs: Callable[[ExampleModel], dict[str, Any]]
    switch: Switch = _each_step
    micro_steps: int = 1
    layers: int = 2
    prepare: Callable[[ExampleModel], None] = lambda model: None  # the model as built
    model: type[ExampleModel] = ExampleModel


def _layers(**kwargs: Any) -> Callable[[ExampleModel], dict[str, Any]]:
    return lambda model: {"fully_shard": [DecoderLayer], **kwargs}


def _embedding(**kwargs: Any) -> Callable[[ExampleModel], dict[str, Any]]:
    """``analyze``'s keywords for :func:`_embedding_not_gathered_for_backward`'s calls."""
    return lambda model: {
        "fully_shard": ["embed_tokens", DecoderLayer],
        "unshard_in_backward": {"embed_tokens": False},
        **kwargs,
    }


def _checkpoint_embedding(model: ExampleModel) -> None:
    """The embedding under ``checkpoint_wrapper`` (non-reentrant), recomputed in backward."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model.embed_tokens = cast(Any, checkpoint_wrapper(model.embed_tokens))


def _checkpoint_normed_embedding(model: ExampleModel) -> None:
    """The embedding followed by a norm (BLOOM's ``word_embeddings_layernorm``), the two
    under one ``checkpoint_wrapper``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    normed = nn.Sequential(model.embed_tokens, nn.LayerNorm(model.config.hidden_size))
    model.embed_tokens = cast(Any, checkpoint_wrapper(normed))


NORMED_EMBEDDING = "embed_tokens._checkpoint_wrapped_module.0"


def _normed_embedding_not_gathered_for_backward(**options: Any) -> Shard:
    """The embedding of :func:`_checkpoint_normed_embedding` in a call of its own, with
    ``set_unshard_in_backward(False)``, each layer, then the root, with ``options`` each."""
    from torch.distributed.fsdp import fully_shard

    def shard(model: ExampleModel, mesh: DeviceMesh) -> None:
        embedding = model.get_submodule(NORMED_EMBEDDING)
        fully_shard(embedding, mesh=mesh, **options)
        cast(Any, embedding).set_unshard_in_backward(False)
        _layers_and_root(**options)(model, mesh)

    return shard


def _normed_embedding(**kwargs: Any) -> Callable[[ExampleModel], dict[str, Any]]:
    """``analyze``'s keywords for :func:`_normed_embedding_not_gathered_for_backward`."""
    return lambda model: {
        "fully_shard": [NORMED_EMBEDDING, DecoderLayer],
        "unshard_in_backward": {NORMED_EMBEDDING: False},
        **kwargs,
    }


def _sync_kept_gathered(model: ExampleModel, last: bool) -> None:
    model.set_requires_gradient_sync(last)
    model.set_reshard_after_backward(last)


SETUPS: dict[str, Setup] = {
    # HSDP accumulating as torchtitan does: reduce-scatter each micro-step, all-reduce the last
    "hsdp-requires-all-reduce-bf16-fp32": Setup(
        (2, 4), _layers_and_root(mp_policy=_policy(BF16_FP32)),
        _layers(requires_all_reduce=False, mp_policy=_policy(BF16_FP32)), _all_reduce, 2,
    ),
    "hsdp-requires-all-reduce-3-steps": Setup(
        (2, 2), _layers_and_root(), _layers(requires_all_reduce=False), _all_reduce, 3
    ),
    "hsdp-requires-all-reduce-kept-gathered-bf16": Setup(
        (2, 2), _layers_and_root(mp_policy=_policy(BF16)),
        _layers(requires_all_reduce=False, reshard_after_backward=False, mp_policy=_policy(BF16)),
        _all_reduce_kept_gathered, 2,
    ),
    "grouped-layers-bf16-fp32-accum": Setup(
        (4,), _grouped_layers,
        lambda m: {"fully_shard": [("layers.0", "layers.1")], "mp_policy": _policy(BF16_FP32)},
        _sync, 2,
    ),
    "grouped-resharding-to-two-bf16-accum": Setup(
        (4,), _grouped_resharding_to_two,
        lambda m: {
            "fully_shard": [("layers.0", "layers.1"), ("layers.2",)],
            "reshard_after_forward": {"layers.0": 2, "layers.2": 2, "": False},
            "mp_policy": _policy(BF16),
        },
        _sync, 2, layers=3,
    ),
    "grouped-first-and-last": Setup(
        (4,), _grouped_ends,
        lambda m: {
            "fully_shard": [DecoderLayer, ("embed_tokens", "lm_head")],
            "reshard_after_forward": {"layers.0": 2, "layers.1": 2, "embed_tokens": 2, "": False},
        },
    ),
    "prefetch-two-ahead": Setup(
        (4,), _prefetching_two_ahead,
        _layers(
            forward_prefetch={"layers.0": ["layers.1", "layers.2"]},
            backward_prefetch={"layers.2": ["layers.1", "layers.0"]},
        ),
        layers=3,
    ),
    "prefetch-from-root-accum": Setup(
        (4,), _prefetching_from_the_root,
        _layers(
            reshard_after_forward=True,
            forward_prefetch={"": ["layers.0", "layers.1"]},
            backward_prefetch={"layers.1": ["layers.0"], "layers.0": []},
        ),
        _sync, 2, layers=3,
    ),
    "ignored-param-accum": Setup(
        (4,), _ignoring, lambda m: {"fully_shard": [DecoderLayer], "ignored_params": {_up(m)}},
        _sync, 2,
    ),
    "hsdp-ignored-param-and-head-accum": Setup(
        (2, 2), _ignoring_the_head_too,
        lambda m: {"fully_shard": [DecoderLayer], "ignored_params": {_up(m), m.lm_head.weight}},
        _sync, 2,
    ),
    "frozen-weight-bf16-fp32-accum": Setup(
        (4,), _layers_and_root(mp_policy=_policy(BF16_FP32)),
        _layers(mp_policy=_policy(BF16_FP32)), _sync, 2, prepare=_freeze_one_weight,
    ),
    "hsdp-frozen-weight": Setup(
        (2, 2), _layers_and_root(), _layers(), prepare=_freeze_one_weight
    ),
    # the embedding in a call of its own, accumulating in float32: the root's post-backward
    # callback runs its post-backward after the root's (state order), each adding its new
    # gradients into, or casting them to, the float32 ones in turn
    "embedding-own-call-bf16-fp32-accum": Setup(
        (4,), _embedding_own_call(mp_policy=_policy(BF16_FP32)),
        lambda m: {"fully_shard": ["embed_tokens", DecoderLayer], "mp_policy": _policy(BF16_FP32)},
        _sync, 2,
    ),
    # set_unshard_in_backward(False) on the embedding: not gathered (nor prefetched) in
    # backward, its gradient made from the indices and reduce-scattered all the same
    "embedding-not-unsharded-in-backward-fp32": Setup(
        (4,), _embedding_not_gathered_for_backward(), _embedding(),
    ),
    "embedding-not-unsharded-in-backward-bf16-fp32-accum": Setup(
        (4,), _embedding_not_gathered_for_backward(mp_policy=_policy(BF16_FP32)),
        _embedding(mp_policy=_policy(BF16_FP32)), _sync, 2,
    ),
    "embedding-not-unsharded-in-backward-bf16-accum-kept-gathered": Setup(
        (4,), _embedding_not_gathered_for_backward(mp_policy=_policy(BF16)),
        _embedding(mp_policy=_policy(BF16), reshard_after_backward=False),
        _sync_kept_gathered, 2,
    ),
    "embedding-not-unsharded-in-backward-resharding-to-two-accum": Setup(
        (4,), _embedding_not_gathered_for_backward(reshard_after_forward=2),
        _embedding(reshard_after_forward={"embed_tokens": 2, "layers.0": 2, "layers.1": 2, "": 2}),
        _sync, 2,
    ),
    "hsdp-embedding-not-unsharded-in-backward-bf16-fp32": Setup(
        (2, 2), _embedding_not_gathered_for_backward(mp_policy=_policy(BF16_FP32)),
        _embedding(mp_policy=_policy(BF16_FP32)),
    ),
    # ... under activation checkpointing: its recompute in backward, after its pre-backward
    # (the group then PRE_BACKWARD), stops at its first saved tensor, the indices (the
    # checkpoint's early stop), before the lookup reads the weight: nothing gathered
    "checkpointed-embedding-not-unsharded-in-backward-fp32": Setup(
        (4,), _embedding_not_gathered_for_backward(), _embedding(), prepare=_checkpoint_embedding,
    ),
    # ... checkpointed with the norm after it: the region's recompute, in the norm's backward,
    # runs before the embedding's pre-backward (the group IDLE, not PRE_BACKWARD), so its
    # pre-forward all-gathers the group in backward as a forward does (FORWARD: the buffer
    # kept to its post-forward, the recompute's forward root; no reshard there)
    "checkpointed-normed-embedding-not-unsharded-in-backward-fp32": Setup(
        (4,), _normed_embedding_not_gathered_for_backward(), _normed_embedding(),
        prepare=_checkpoint_normed_embedding,
    ),
    "checkpointed-normed-embedding-not-unsharded-in-backward-bf16-fp32-accum": Setup(
        (4,), _normed_embedding_not_gathered_for_backward(mp_policy=_policy(BF16_FP32)),
        _normed_embedding(mp_policy=_policy(BF16_FP32)), _sync, 2,
        prepare=_checkpoint_normed_embedding,
    ),
    # set_unshard_in_backward(False) on one call of two embeddings (torch's list form): the
    # group gathered once in forward, neither gathered nor prefetched in backward
    "grouped-embeddings-not-unsharded-in-backward-fp32": Setup(
        (4,), _grouped_embeddings_not_gathered_for_backward(), _grouped_embeddings(),
        model=PositionalModel,
    ),
    "grouped-embeddings-not-unsharded-in-backward-bf16-fp32-accum": Setup(
        (4,), _grouped_embeddings_not_gathered_for_backward(mp_policy=_policy(BF16_FP32)),
        _grouped_embeddings(mp_policy=_policy(BF16_FP32)), _sync, 2, model=PositionalModel,
    ),
    "grouped-embeddings-not-unsharded-in-backward-resharding-to-two-accum": Setup(
        (4,), _grouped_embeddings_not_gathered_for_backward(reshard_after_forward=2),
        _grouped_embeddings(
            reshard_after_forward={"embed_tokens": 2, "layers.0": 2, "layers.1": 2, "": 2}
        ),
        _sync, 2, model=PositionalModel,
    ),
    "grouped-embeddings-not-unsharded-in-backward-bf16-accum-kept-gathered": Setup(
        (4,), _grouped_embeddings_not_gathered_for_backward(mp_policy=_policy(BF16)),
        _grouped_embeddings(mp_policy=_policy(BF16), reshard_after_backward=False),
        _sync_kept_gathered, 2, model=PositionalModel,
    ),
    "hsdp-grouped-embeddings-not-unsharded-in-backward-bf16-fp32": Setup(
        (2, 2), _grouped_embeddings_not_gathered_for_backward(mp_policy=_policy(BF16_FP32)),
        _grouped_embeddings(mp_policy=_policy(BF16_FP32)), model=PositionalModel,
    ),
    "grouped-first-and-last-kept-gathered-not-unsharded-in-backward-accum": Setup(
        (4,), _grouped_ends_kept_gathered,
        lambda m: {
            "fully_shard": [DecoderLayer, ("embed_tokens", "lm_head")],
            "reshard_after_forward": {"embed_tokens": False},
            "unshard_in_backward": {"embed_tokens": False},
        },
        _sync, 2,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SETUPS))
def test_configurations_users_run_hold_what_torch_holds_at_every_event(
    as_rank: Callable[..., None], case: str
) -> None:
    _holds_what_torch_holds(as_rank, SETUPS[case])


def _holds_what_torch_holds(as_rank: Callable[..., None], setup: Setup) -> None:
    ranks = math.prod(setup.mesh)
    if ranks != 4:
        as_rank(0, ranks)
    config = dataclasses.replace(CONFIG, num_layers=setup.layers)
    torch.manual_seed(0)
    model = setup.model(config)
    setup.prepare(model)
    real = _run(model, setup.mesh, setup.shard, setup.switch, setup.micro_steps)
    with torch.device("meta"):
        copy = setup.model(config)
    setup.prepare(copy)
    accum = {"grad_accum": setup.micro_steps} if setup.micro_steps > 1 else {}
    report = fsdpviz.analyze(
        copy, {"input_ids": _ids()}, mesh=setup.mesh, loss=_loss, **setup.kwargs(copy), **accum
    )
    # (a call on a module inside a checkpoint wrapper: its unit named without the wrapper's
    # segment, by the plan as by the recorder)
    same(real, steady(report, setup.micro_steps))


def test_grouped_call_whose_head_reads_its_weight_not_unsharded_is_refused(fake_pg: int) -> None:
    """``set_unshard_in_backward(False)`` on one call of the embedding and the head, freed
    after forward: the group's pre-backward (on the head's output, the group's last module
    to run) does not gather them, and the head's backward reads its weight: torch fails,
    and fsdpviz refuses it, naming the group."""
    from torch.distributed.fsdp import fully_shard

    def shard(model: ExampleModel, mesh: DeviceMesh) -> None:
        fully_shard([model.embed_tokens, model.lm_head], mesh=mesh)
        _layers_and_root()(model, mesh)
        cast(Any, model.lm_head).set_unshard_in_backward(False)

    assert fake_pg == 4
    torch.manual_seed(0)
    real = ExampleModel(CONFIG)
    shard(real, init_device_mesh("cpu", (4,)))
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 0"):
        _loss(real(_ids())).backward()
    with torch.device("meta"):
        copy = ExampleModel(CONFIG)
    said = "unshard_in_backward=False for 'embed_tokens, lm_head', whose backward reads"
    with pytest.raises(fsdpviz.FSDPConfigError, match=said):
        fsdpviz.analyze(
            copy, {"input_ids": _ids()}, world_size=4, loss=_loss,
            fully_shard=[("embed_tokens", "lm_head"), DecoderLayer],
            unshard_in_backward={"lm_head": False},
        )  # fmt: skip
