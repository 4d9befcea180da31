"""Activation checkpointing as ``analyze(..., activation_checkpointing=...)`` takes it: module
classes, a predicate ``module -> bool``, or one of the two frozen options below, as
torchtitan's ``activation_checkpoint`` section configures it (``fsdpviz.trace.checkpointing``
applies them to the traced copy).

- :class:`SelectiveCheckpoint`: per operator inside each chosen module, as torchtitan's
  ``mode = "selective"`` with ``selective_ac_option = "op"``
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the outputs of matrix
  multiplies (every second one recomputed), fused attention and a few others are saved,
  everything else is recomputed in backward.
- :class:`CheckpointEvery`: every ``n``-th chosen module whole, as
  ``selective_ac_option = "<n>"``.

Example::

    fsdpviz.analyze(model, ids, fully_shard=[Block],
                    activation_checkpointing=SelectiveCheckpoint([Block]))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fsdpviz.errors import ConfigError

_aten = torch.ops.aten
# torchtitan's save list (torchtitan/distributed/activation_checkpoint.py): outputs that are
# expensive to recompute. The probe runs scaled_dot_product_attention as the CPU flash kernel
# on the meta device, so that one is listed too.
TORCHTITAN_SAVE_OPS: frozenset[Any] = frozenset(
    {
        _aten.mm.default,
        _aten.linear.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten.max.default,
        _aten.topk.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
    }
)


@dataclass(frozen=True)
class SelectiveCheckpoint:
    """Per-operator selective activation checkpointing of ``modules`` (module classes or a
    predicate, as ``activation_checkpointing`` takes them), as torchtitan's
    ``selective_ac_option = "op"``: the outputs of ``save_ops`` are saved, except every
    ``recompute_every_mm``-th matrix multiply (``0``: none), and everything else is
    recomputed in backward.

    Example::

        fsdpviz.analyze(model, ids, fully_shard=[Block],
                        activation_checkpointing=SelectiveCheckpoint([Block]))
    """

    modules: Sequence[type[nn.Module]] | Callable[[nn.Module], bool]
    save_ops: frozenset[Any] = field(default=TORCHTITAN_SAVE_OPS)
    recompute_every_mm: int = 2


@dataclass(frozen=True)
class CheckpointEvery:
    """Every ``every``-th of the modules ``modules`` picks (module classes or a predicate, as
    ``activation_checkpointing`` takes them), counted in the model's module order from 1, is
    checkpointed whole: torchtitan's ``selective_ac_option = "<n>"`` (``every=2``: the 2nd,
    4th, ... block), a trade between memory and recomputation.

    Example::

        fsdpviz.analyze(model, ids, fully_shard=[Block],
                        activation_checkpointing=CheckpointEvery([Block], 2))
    """

    modules: Sequence[type[nn.Module]] | Callable[[nn.Module], bool]
    every: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise ConfigError(
                f"CheckpointEvery: every must be a positive int (1: every module), got "
                f"{self.every!r}"
            )


CheckpointSpec = (
    Sequence[type[nn.Module]]
    | Callable[[nn.Module], bool]
    | SelectiveCheckpoint
    | CheckpointEvery
    | None
)
"""What ``activation_checkpointing=`` takes (``None``: no checkpointing)."""


def outermost_picked(model: nn.Module, picks: Callable[[nn.Module], bool]) -> list[nn.Module]:
    """The modules of ``model`` (itself aside) that ``picks`` chooses, in module order, none
    inside another: a module chosen is not looked into (the blocks checkpointed, or compiled,
    one by one)."""
    chosen: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        if m is not model and picks(m):
            chosen.append(m)
            return
        for child in m.children():
            visit(child)

    visit(model)
    return chosen
