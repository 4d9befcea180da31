"""Activation checkpointing applied to fsdpviz's private copy of the model
(``analyze(..., activation_checkpointing=...)``), as trainers apply it.

accelerate (``apply_activation_checkpointing`` with its wrap policy), torchtitan
(``checkpoint_wrapper`` on each block) and Lightning (``activation_checkpointing_policy``)
run the chosen modules under non-reentrant ``torch.utils.checkpoint``: the forward saves
only the module's inputs, and backward runs the forward again. FSDP's hooks stay outside
the checkpointed region, so the recomputation issues no all-gather. The copy's chosen
modules run their forward that way; their names and parameters do not change.

:class:`~fsdpviz.schema.checkpointing.SelectiveCheckpoint` checkpoints per operator instead,
as torchtitan's ``activation_checkpoint.mode = "selective"`` with
``selective_ac_option = "op"`` does
(``torch.utils.checkpoint.create_selective_checkpoint_contexts``): inside each chosen
module, the outputs of matrix multiplies (every second one recomputed), fused attention
and a few others are saved, everything else is recomputed in backward.

Example::

    fsdpviz.analyze(model, ids, fully_shard=[Block],
                    activation_checkpointing=SelectiveCheckpoint([Block]))
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, TypedDict

import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from fsdpviz.errors import ConfigError
from fsdpviz.schema.checkpointing import (
    CheckpointEvery,
    CheckpointSpec,
    SelectiveCheckpoint,
    outermost_picked,
)
from fsdpviz.trace.copy import asked_of_originals

_aten = torch.ops.aten
_MATMULS = frozenset({_aten.mm.default, _aten.linear.default})


def checkpointed_modules(model: nn.Module, spec: CheckpointSpec) -> list[nn.Module]:
    """The modules ``spec`` picks: module classes, or a predicate ``module -> bool``.

    A picked module inside another picked module is not checkpointed twice (the outer
    region recomputes it), as ``apply_activation_checkpointing`` wraps the outermost.
    """
    if spec is None:
        return []
    every = spec.every if isinstance(spec, CheckpointEvery) else 1
    if isinstance(spec, (SelectiveCheckpoint, CheckpointEvery)):
        spec = spec.modules
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
            "activation_checkpointing must be a list of module classes, a callable "
            f"module -> bool, a SelectiveCheckpoint or a CheckpointEvery, got {spec!r}"
        )
    # every n-th module picked, checkpointed or not (CheckpointEvery counts them all)
    return [m for i, m in enumerate(outermost_picked(model, picks), 1) if i % every == 0]


class CheckpointingDict(TypedDict):
    """What ``Report.config.activation_checkpointing`` states (:func:`describe_checkpointing`)."""

    mode: Literal["full", "selective"]
    classes: list[str]
    modules: int


def describe_checkpointing(model: nn.Module, spec: CheckpointSpec) -> CheckpointingDict | None:
    """What ``Report.config.activation_checkpointing`` states for ``spec`` on ``model`` (the
    modules ``spec`` picks, and the model's own checkpoint wrappers): ``{"mode": "full" |
    "selective", "classes": [class names], "modules": how many}``; None for none."""
    chosen = checkpointed_modules(model, spec)
    chosen += [m for m in model.modules() if _wrapped(m) and all(m is not c for c in chosen)]
    if not chosen:
        return None
    classes = dict.fromkeys(type(_inner(m)).__name__ for m in chosen)
    mode: Literal["full", "selective"] = (
        "selective" if isinstance(spec, SelectiveCheckpoint) else "full"
    )
    return {"mode": mode, "classes": list(classes), "modules": len(chosen)}


def is_checkpointed(model: nn.Module) -> bool:
    """Whether some module of ``model`` (fsdpviz's copy) runs under activation checkpointing:
    one :func:`apply_checkpointing` picked, or a checkpoint wrapper of the model's own."""
    for m in model.modules():
        forward = m.__dict__.get("forward")
        if isinstance(forward, functools.partial) and forward.func in (_checkpointed, _selective):
            return True
        if _wrapped(m):
            return True
    return False


def is_selective(module: nn.Module) -> bool:
    """Whether ``module`` (of fsdpviz's copy) runs under a :class:`SelectiveCheckpoint`."""
    forward = module.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is _selective


def _wrapped(module: nn.Module) -> bool:
    """torch's ``CheckpointWrapper`` (``apply_activation_checkpointing``, ``checkpoint_wrapper``),
    told by its name: the class lives in a private module."""
    return type(module).__name__ == "CheckpointWrapper"


def _inner(module: nn.Module) -> nn.Module:
    inner = getattr(module, "_checkpoint_wrapped_module", None)
    return inner if isinstance(inner, nn.Module) and _wrapped(module) else module


def checkpointing_of_originals(
    spec: CheckpointSpec, originals: Mapping[int, nn.Module]
) -> CheckpointSpec:
    """``spec`` with its predicate asked of the user's modules (``originals``: ``id(copy's
    module) -> the user's``), so that one testing identity picks the same modules."""
    if isinstance(spec, SelectiveCheckpoint):
        return dataclasses.replace(spec, modules=asked_of_originals(spec.modules, originals))
    picked: CheckpointSpec = asked_of_originals(spec, originals)
    return picked


def apply_checkpointing(model: nn.Module, spec: CheckpointSpec) -> int:
    """Run the picked modules of ``model`` (fsdpviz's own copy) under non-reentrant
    checkpointing; returns how many."""
    chosen = checkpointed_modules(model, spec)
    selective = spec if isinstance(spec, SelectiveCheckpoint) else None
    for module in chosen:
        if selective is None:
            module.forward = functools.partial(_checkpointed, module.forward)
        else:
            module.forward = functools.partial(_selective, selective, module.forward)
    return len(chosen)


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not _RELEASE_LISTENERS:
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    region = _Region()  # held by the frame's recompute_fn, with the keywords

    def run(*a: Any, **kw: Any) -> Any:
        _ = region
        return forward(*a, **kw)

    weakref.finalize(region, _released)
    return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False, **kwargs)


class _Region:
    """What a checkpointed region's frame holds (through its ``recompute_fn``), to tell when
    the frame lets go of it."""


_RELEASE_LISTENERS: list[Callable[[], None]] = []


def _released() -> None:
    for listener in _RELEASE_LISTENERS:
        listener()


@contextmanager
def frames_released(listener: Callable[[], None]) -> Iterator[None]:
    """Call ``listener`` each time the frame of a checkpointed region of fsdpviz's copy
    (:func:`apply_checkpointing`, whole modules) lets go of what it holds: its
    ``recompute_fn``, closing over the region's keyword inputs (``fn(*args, **kwargs)`` in
    ``torch.utils.checkpoint``'s non-reentrant checkpoint), is freed with the frame when the
    last tensor the region saved in forward is released in backward."""
    _RELEASE_LISTENERS.append(listener)
    try:
        yield
    finally:
        _RELEASE_LISTENERS.remove(listener)


@dataclasses.dataclass
class _SelectiveCall:
    """One call of a selective region: its option, and what :func:`one_operator` saved of
    its forward for its recomputation, per operator in order (torch's SAC storage)."""

    spec: SelectiveCheckpoint
    saved: dict[Any, list[tuple[torch.Tensor, ...]]] = dataclasses.field(default_factory=dict)


_SELECTIVE: list[_SelectiveCall] = []  # the selective regions running, innermost last
_SAC_MODES = ("_CachingTorchDispatchMode", "_CachedTorchDispatchMode")  # forward, recompute


@contextmanager
def one_operator(op: Any) -> Iterator[list[tuple[torch.Tensor, ...]] | None]:
    """Run the block inside as the one operator ``op`` to the policy of the selective region
    running, as torch runs what the trace emulates of it: context parallelism's ring inside
    DTensor's dispatch of the fused-attention kernel, a tensor-parallel reduce-scatter's
    buffer inside ``_c10d_functional.reduce_scatter_tensor``. The region's dispatch mode asks
    its policy of ``op`` alone and saves (or not) its outputs alone.

    The region's dispatch mode (``_CachingTorchDispatchMode`` in forward,
    ``_CachedTorchDispatchMode`` in the recomputation) is off meanwhile, so none of the
    block's operators is saved or counted; where the policy saves ``op`` (a save op that is
    not a matrix multiply), yields the region's list of ``op``'s saved outputs (the block
    appends its outputs in forward, and takes them back, first in first out, in the
    recomputation instead of making them again), else None. Outside a selective region, or
    where the region's mode is not the innermost (torch's partitioner capturing a compiled
    region, whose modes are), yields None and changes nothing."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

    if not _SELECTIVE or type(_get_current_dispatch_mode()).__name__ not in _SAC_MODES:
        yield None
        return
    call = _SELECTIVE[-1]
    saved = call.saved.setdefault(op, []) if op in call.spec.save_ops else None
    with _pop_mode_temporarily():
        yield saved


def recomputing_selective() -> bool:
    """Whether a selective region runs its recomputation (autograd runs a graph)."""
    return bool(_SELECTIVE) and torch._C._current_graph_task_id() != -1


def attention_saved() -> bool:
    """Whether the code running is inside a selective checkpoint that saves fused attention's
    output: its recomputation in backward takes the saved output, not running it again (as
    for context parallelism's ring attention, one operator to the policy)."""
    return bool(_SELECTIVE) and FUSED_ATTENTION in _SELECTIVE[-1].spec.save_ops


FUSED_ATTENTION = _aten._scaled_dot_product_flash_attention_for_cpu.default


def _selective(
    spec: SelectiveCheckpoint, forward: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    counts = {"forward": 0, "recompute": 0}  # matrix multiplies seen, per pass of this call
    call = _SelectiveCall(spec)

    def run(*a: Any, **kw: Any) -> Any:
        _SELECTIVE.append(call)
        try:
            return forward(*a, **kw)
        finally:
            _SELECTIVE.pop()

    def policy(ctx: Any, func: Any, *_: Any, **__: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in _MATMULS:
            counts[mode] += 1
        if func not in spec.save_ops:
            return CheckpointPolicy.PREFER_RECOMPUTE
        every = spec.recompute_every_mm
        if func in _MATMULS and every and counts[mode] % every == 0:
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    return torch.utils.checkpoint.checkpoint(
        run,
        *args,
        use_reentrant=False,
        context_fn=lambda: create_selective_checkpoint_contexts(policy),  # type: ignore[no-untyped-call]
        **kwargs,
    )
