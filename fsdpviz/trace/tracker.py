"""Module-level tracing of one forward/backward, in the style of ``ModTracker``.

Hooks go on fsdpviz's private copy of the model only. They record the order in
which modules first run, how often each runs, the tensor shapes each saw, and
which module was running when something failed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from fsdpviz.errors import ConfigError, TraceError


@dataclass
class ModuleCalls:
    calls: int = 0
    input_shapes: list[list[int]] = field(default_factory=list)
    output_shapes: list[list[int]] = field(default_factory=list)


def _shapes(obj: Any, limit: int = 8) -> list[list[int]]:
    out: list[list[int]] = []
    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            out.append(list(leaf.shape))
            if len(out) >= limit:
                break
    return out


class ModuleTracker:
    """Records module calls on ``model`` (a private copy) while tracing."""

    def __init__(self, model: nn.Module, on_call: Callable[[], None] | None = None) -> None:
        self.names = {m: n for n, m in model.named_modules()}
        self.records: dict[str, ModuleCalls] = {n: ModuleCalls() for n in self.names.values()}
        self.order: list[str] = []
        self.backward_order: list[str] = []
        self.stack: list[str] = []
        self._on_call = on_call
        self._in_backward: set[str] = set()
        # Set by the cost model's probe (fsdpviz.trace.probe): ``run_step`` runs under it.
        self.measure: Callable[[nn.Module, Any], AbstractContextManager[None]] | None = None
        self._handles = []
        for module in self.names:
            self._handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post))

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        name = self.names.get(module, "?")
        self.stack.append(name)
        rec = self.records.setdefault(name, ModuleCalls())
        if rec.calls == 0:
            self.order.append(name)
            rec.input_shapes = _shapes((args, kwargs))
        rec.calls += 1
        if self._on_call is not None:
            self._on_call()

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self.names.get(module, "?")
        rec = self.records[name]
        if not rec.output_shapes:
            rec.output_shapes = _shapes(output)
        if self.stack and self.stack[-1] == name:
            self.stack.pop()
        if torch.is_grad_enabled():
            for t in tree_leaves(output):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(functools.partial(self._backward_reached, name))  # type: ignore[no-untyped-call]

    def _backward_reached(self, name: str, grad: torch.Tensor) -> None:
        if name not in self._in_backward:
            self._in_backward.add(name)
            self.backward_order.append(name)

    def reset_calls(self) -> None:
        """Forget call counts (keep shapes) before tracing another iteration."""
        for rec in self.records.values():
            rec.calls = 0
        self.order.clear()
        self.backward_order.clear()
        self._in_backward.clear()
        self.stack.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def default_loss(output: Any) -> torch.Tensor:
    """``output.loss`` if set, else ``output.logits.sum()``, else the sum of float tensors."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits.sum()
    floats = [
        t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    if not floats:
        raise ConfigError(
            "the model output has no floating-point tensor to build a loss from; pass "
            "loss=lambda out: ... returning a scalar tensor"
        )
    total = floats[0].sum()
    for t in floats[1:]:
        total = total + t.sum()
    return total


def run_stored_step(
    model: nn.Module,
    inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    tracker: ModuleTracker,
    handles: list[Any],
    on_loss: Callable[[torch.Tensor], None],
) -> None:
    """One step of a stored trace on meta (``fsdpviz.replan.stored_fsdp1``,
    ``fsdpviz.replan.stored_fsdp2``); the tracker and ``handles`` are removed and gradients
    dropped however it ends."""
    from fsdpviz.trace.copy import inputs_copy

    try:
        args, kwargs = inputs_copy(inputs, "meta")
        run_step(model, args, kwargs, loss_fn, tracker, "the meta device", on_loss)
    finally:
        tracker.remove()
        for h in handles:
            h.remove()
        for p in model.parameters():
            p.grad = None


def run_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    tracker: ModuleTracker,
    where: str,
    on_loss: Callable[[torch.Tensor], None] | None = None,
) -> None:
    """One forward and backward on the copy; failures name the module that failed.

    With ``tracker.measure`` set (the cost model's probe), the step runs under it.
    """
    measure = tracker.measure(model, (args, kwargs)) if tracker.measure else nullcontext()
    with measure:
        _step(model, args, kwargs, loss_fn, tracker, where, on_loss)


def _step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    tracker: ModuleTracker,
    where: str,
    on_loss: Callable[[torch.Tensor], None] | None,
) -> None:
    try:
        output = model(*args, **kwargs)
    except Exception as e:
        failing = tracker.stack[-1] if tracker.stack else ""
        cls = type(dict(model.named_modules()).get(failing, model)).__name__
        label = failing or "<root>"
        raise TraceError(
            f"tracing on {where} failed in module {label!r} ({cls}): {type(e).__name__}: {e}\n"
            "If the model needs real data here (data-dependent control flow such as .item(), "
            "or an operator with no meta kernel), analyse with trace='real' on a model that "
            "lives on a real device, or with trace='fx' (torch.fx symbolic tracing runs no "
            "operator) for models fx can trace.",
            module=failing,
        ) from e
    loss = (loss_fn or default_loss)(output)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError("loss must return a scalar tensor")
    if not loss.requires_grad:
        raise ConfigError(
            "the loss does not require grad, so there is no backward pass to analyse; check "
            "that parameters require grad or pass loss=... that depends on them"
        )
    if on_loss is not None:
        on_loss(loss)
    loss.backward()  # type: ignore[no-untyped-call]
