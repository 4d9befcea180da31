"""Anchor: FSDP2's memory at every event against real torch, two ``fully_shard`` calls one
inside the other in one checkpointed region, with ``set_unshard_in_backward(False)``.

The embedding inside a call with a norm after it (whose backward reads its weight: the
region's recompute, in the norm's backward, runs before the embedding's pre-backward and
all-gathers it as a forward does), or with a learned shift after it (whose backward reads
no parameter), or the shift inside a call with the embedding; the outer call the region
itself (recomputed with it) or the checkpoint wrapper around it (its hooks outside the
recompute); the setter on the inner call, the outer or both; float32, bf16 (reducing in
float32, or kept gathered across micro-steps), resharding to 2 of 4 ranks, kept gathered
after forward, and HSDP's 2 x 2 mesh. The moments and the two figures compared at each
event are those of ``test_cost_fsdp2_every_event.py``. A bf16 ``LayerNorm`` is left out:
the CPU kernel keeps its mean and rstd in bf16, CUDA and meta in float32
(``test_gloo_bf16_layer_norm_statistics``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from test_cost_fsdp2_every_event import (
    BF16,
    BF16_FP32,
    Setup,
    Shard,
    Switch,
    _checkpoint_normed_embedding,
    _each_step,
    _holds_what_torch_holds,
    _layers_and_root,
    _policy,
    _sync,
    _sync_kept_gathered,
)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from fsdpviz.examples import DecoderLayer, ExampleModel


class Shifted(nn.Module):
    """A learned shift added to its input: its backward reads no parameter."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.shift


def _checkpoint_shifted_embedding(model: ExampleModel) -> None:
    """The embedding followed by a learned shift, the two under one ``checkpoint_wrapper``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    shifted = nn.Sequential(model.embed_tokens, Shifted(model.config.hidden_size))
    model.embed_tokens = cast(Any, checkpoint_wrapper(shifted))


WRAPPED = "embed_tokens._checkpoint_wrapped_module"  # the region a checkpoint recomputes


def _nested(
    inner: str, outer: str, off: tuple[str, ...], options: dict[str, Any], kept_gathered: bool
) -> tuple[Shard, Callable[[ExampleModel], dict[str, Any]]]:
    """``inner`` (a module of the checkpointed region) in a call of its own inside
    ``outer``'s call (the region, or the wrapper around it), each layer, then the root,
    ``options`` each; ``set_unshard_in_backward(False)`` on those of the two in ``off``
    (``kept_gathered``: kept unsharded after the backward of micro-steps that do not
    sync): the real calls, and ``analyze``'s keywords for the same."""
    from torch.distributed.fsdp import fully_shard

    def shard(model: ExampleModel, mesh: DeviceMesh) -> None:
        fully_shard(model.get_submodule(inner), mesh=mesh, **options)
        fully_shard(model.get_submodule(outer), mesh=mesh, **options)
        for name in off:
            cast(Any, model.get_submodule(name)).set_unshard_in_backward(False)
        _layers_and_root(**options)(model, mesh)

    def kwargs(model: ExampleModel) -> dict[str, Any]:
        every = [inner, outer, "layers.0", "layers.1", ""]
        raf = options.get("reshard_after_forward")
        return {
            "fully_shard": [inner, outer, DecoderLayer],
            "unshard_in_backward": dict.fromkeys(off, False),
            **({"mp_policy": options["mp_policy"]} if "mp_policy" in options else {}),
            **({"reshard_after_forward": dict.fromkeys(every, raf)} if raf is not None else {}),
            **({"reshard_after_backward": False} if kept_gathered else {}),
        }

    return shard, kwargs


# options on every call, a switch before each micro-step, the micro-steps; a bf16 LayerNorm
# is left out (the CPU kernel keeps its mean and rstd in bf16, CUDA and meta in float32)
_NESTED_VARIANTS: dict[str, tuple[dict[str, Any], Switch, int]] = {
    "fp32": ({}, _each_step, 1),
    "bf16-fp32-accum": ({"mp_policy": _policy(BF16_FP32)}, _sync, 2),
    "bf16-accum-kept-gathered": ({"mp_policy": _policy(BF16)}, _sync_kept_gathered, 2),
    "resharding-to-two-accum": ({"reshard_after_forward": 2}, _sync, 2),
    "kept-after-forward-accum": ({"reshard_after_forward": False}, _sync, 2),
    "hsdp-fp32": ({}, _each_step, 1),  # on a 2 x 2 mesh
}
_FEWER = ("fp32", "bf16-fp32-accum")  # where one of the two is left sharded in backward


def _nested_setups() -> dict[str, Setup]:
    """Two calls, one inside the other, in one checkpointed region (the outer the region,
    or the checkpoint wrapper around it: its forward outside the recompute), with
    ``set_unshard_in_backward(False)`` on the inner, the outer or both: the embedding
    inside a call with the norm after it (whose backward reads its weight: the region's
    recompute runs before the embedding's pre-backward), or with a learned shift after it
    (whose backward reads no parameter), or the shift inside a call with the embedding."""
    regions = {
        "normed": (_checkpoint_normed_embedding, (0,), ("inner",)),
        "shifted": (_checkpoint_shifted_embedding, (0, 1), ("inner", "outer", "both")),
    }
    out: dict[str, Setup] = {}
    for region, (prepare, inners, offs) in regions.items():
        for index in inners:
            inner = f"{WRAPPED}.{index}"
            for outer, where in ((WRAPPED, "region"), ("embed_tokens", "wrapper")):
                for which in offs:
                    off = {"inner": (inner,), "outer": (outer,), "both": (inner, outer)}[which]
                    for variant, (options, switch, steps) in _NESTED_VARIANTS.items():
                        if region == "normed" and "bf16" in variant:
                            continue
                        if (index == 1 and variant != "fp32") or (
                            region == "shifted" and which != "both" and variant not in _FEWER
                        ):
                            continue
                        kept = switch is _sync_kept_gathered
                        shard, kwargs = _nested(inner, outer, off, options, kept)
                        name = f"{region}-{index}-in-{where}-{which}-off-{variant}"
                        mesh = (2, 2) if variant.startswith("hsdp") else (4,)
                        out[name] = Setup(mesh, shard, kwargs, switch, steps, prepare=prepare)
    return out


NESTED = _nested_setups()


@pytest.mark.parametrize("case", list(NESTED))
def test_nested_calls_in_one_recomputed_region_hold_what_torch_holds_at_every_event(
    as_rank: Callable[..., None], case: str
) -> None:
    _holds_what_torch_holds(as_rank, NESTED[case])
