"""Activation checkpointing applied to fsdpviz's private copy of the model
(``analyze(..., activation_checkpointing=...)``), as trainers apply it.

accelerate (``apply_activation_checkpointing`` with its wrap policy), torchtitan
(``checkpoint_wrapper`` on each block) and Lightning (``activation_checkpointing_policy``)
run the chosen modules under non-reentrant ``torch.utils.checkpoint``: the forward saves
only the module's inputs, and backward runs the forward again. FSDP's hooks stay outside
the checkpointed region, so the recomputation issues no all-gather. The copy's chosen
modules run their forward that way; their names and parameters do not change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch.utils.checkpoint
from torch import nn

from fsdpviz.errors import ConfigError

CheckpointSpec = Sequence[type[nn.Module]] | Callable[[nn.Module], bool] | None


def checkpointed_modules(model: nn.Module, spec: CheckpointSpec) -> list[nn.Module]:
    """The modules ``spec`` picks: module classes, or a predicate ``module -> bool``.

    A picked module inside another picked module is not checkpointed twice (the outer
    region recomputes it), as ``apply_activation_checkpointing`` wraps the outermost.
    """
    if spec is None:
        return []
    if callable(spec) and not isinstance(spec, type):
        picks: Callable[[nn.Module], bool] = spec
    elif isinstance(spec, (list, tuple, set, frozenset)) and all(
        isinstance(c, type) and issubclass(c, nn.Module) for c in spec
    ):
        classes = tuple(spec)

        def picks(m: nn.Module) -> bool:
            return isinstance(m, classes)
    else:
        raise ConfigError(
            "activation_checkpointing must be a list of module classes or a callable "
            f"module -> bool, got {spec!r}"
        )
    chosen: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        if m is not model and picks(m):
            chosen.append(m)
            return
        for child in m.children():
            visit(child)

    visit(model)
    return chosen


def apply_checkpointing(model: nn.Module, spec: CheckpointSpec) -> int:
    """Run the picked modules of ``model`` (fsdpviz's own copy) under non-reentrant
    checkpointing; returns how many."""
    chosen = checkpointed_modules(model, spec)
    for module in chosen:
        module.forward = functools.partial(_checkpointed, module.forward)
    return len(chosen)


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
