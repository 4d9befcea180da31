"""Module call order from ``torch.fx`` symbolic tracing (``trace="fx"``).

Symbolic tracing runs no tensor operation, so a model with operators that have
no meta kernel (custom CUDA extensions) can still be planned. It records every
module call (enter and exit, nested) in forward order. There is no autograd
graph, so :func:`inferred_backward` derives the backward hook order from the
forward call tree the way FSDP sees it in a model without forward prefetch:
a unit's pre-backward hook when the backward reaches its output, its
post-backward hook once its compute (and that of the units nested in it) is
done. Reports built this way carry an ``approximate_backward_order`` warning.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.fx
from torch import nn
from torch.utils._pytree import tree_leaves

from fsdpviz.errors import TraceError


@dataclass
class Call:
    """One module call in the forward, with the calls made inside it."""

    fqn: str
    children: list[Call] = field(default_factory=list)
    output: tuple[int, ...] = ()  # ids of the proxies the call returned


class _RecordingTracer(torch.fx.Tracer):
    def __init__(self, names: dict[nn.Module, str]) -> None:
        super().__init__()
        self.names = names
        self.root_call = Call("")
        self.stack = [self.root_call]
        self.failed_in: str | None = None

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return False

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        call = Call(self.names.get(m, module_qualified_name_of(self, m)))
        self.stack[-1].children.append(call)
        self.stack.append(call)
        try:
            ret = super().call_module(m, forward, args, kwargs)
            call.output = tuple(id(x) for x in tree_leaves(ret) if isinstance(x, torch.fx.Proxy))
            return ret
        except Exception:
            if self.failed_in is None:
                self.failed_in = call.fqn
            raise
        finally:
            self.stack.pop()


def module_qualified_name_of(tracer: torch.fx.Tracer, m: nn.Module) -> str:
    try:
        return tracer.path_of_module(m)
    except NameError:
        return "?"


def fx_call_tree(model: nn.Module) -> Call:
    """Symbolically trace ``model`` and return its root call with nested module calls."""
    tracer = _RecordingTracer({m: n for n, m in model.named_modules()})
    try:
        tracer.trace(model)
    except Exception as e:
        failing = tracer.failed_in or ""
        raise TraceError(
            f"torch.fx symbolic tracing failed in module {failing or '<root>'!r}: "
            f"{type(e).__name__}: {e}\n{_fx_cause(model, failing, e)} Use trace='meta' "
            "(the default) or trace='real' for this model.",
            module=failing,
        ) from e
    return tracer.root_call


def _fx_cause(model: nn.Module, failing: str, e: Exception) -> str:
    """Why symbolic tracing failed, in words: fx's known limits, else its own message."""
    module = dict(model.named_modules()).get(failing, model)
    code = getattr(type(module).forward, "__code__", None)
    varargs = code is not None and code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    if not failing and varargs:
        return (
            f"{type(module).__name__}.forward is a (*args, **kwargs) wrapper (a decorator "
            "wraps it, as Hugging Face does), and fx's tracer can only make inputs for "
            "named parameters."
        )
    if isinstance(e, torch.fx.proxy.TraceError) or "symbolically traced" in str(e):
        return (
            "fx cannot follow control flow that depends on tensor values "
            "(an if, a loop or a .item() on a traced tensor)."
        )
    return "fx runs no operator, so code that needs real tensors fails under it."


def hook_sequence(root: Call, units: dict[str, int]) -> list[tuple[str, int]]:
    """Forward then inferred backward hook calls ``(hook, unit index)`` for one iteration."""
    forward: list[tuple[str, int]] = []

    def walk(call: Call) -> None:
        index = units.get(call.fqn)
        if index is not None:
            forward.append(("pre_forward", index))
        for child in call.children:
            walk(child)
        if index is not None:
            forward.append(("post_forward", index))

    walk(root)
    return forward + inferred_backward(root, units)


def inferred_backward(root: Call, units: dict[str, int]) -> list[tuple[str, int]]:
    """Pre-/post-backward in reverse forward order; a unit's post after its earliest call."""
    remaining: dict[int, int] = {}

    def count(call: Call) -> None:
        if call.fqn in units:
            remaining[units[call.fqn]] = remaining.get(units[call.fqn], 0) + 1
        for child in call.children:
            count(child)

    count(root)
    out: list[tuple[str, int]] = []

    def same_output_child(call: Call) -> Call | None:
        # A unit returning its last child's output tensor as is: both pre-backward
        # hooks sit on that tensor and fire in registration order, child first.
        if not call.output:
            return None
        return next((c for c in reversed(call.children) if c.output == call.output), None)

    def pre_chain(call: Call) -> None:
        child = same_output_child(call)
        if child is not None:
            pre_chain(child)
        if call.fqn in units:
            out.append(("pre_backward", units[call.fqn]))

    def walk_back(call: Call, pre_done: bool) -> None:
        if not pre_done:
            pre_chain(call)
        chained = same_output_child(call)
        for child in reversed(call.children):
            walk_back(child, pre_done=child is chained)
        index = units.get(call.fqn)
        if index is not None:
            remaining[index] -= 1
            if remaining[index] == 0:
                out.append(("post_backward", index))

    walk_back(root, pre_done=False)
    return out


def module_order(root: Call) -> list[str]:
    """Module FQNs in the order they are first called."""
    seen: dict[str, None] = {}

    def walk(call: Call) -> None:
        seen.setdefault(call.fqn, None)
        for child in call.children:
            walk(child)

    walk(root)
    return list(seen)


def call_counts(root: Call) -> dict[str, int]:
    counts: dict[str, int] = {}

    def walk(call: Call) -> None:
        counts[call.fqn] = counts.get(call.fqn, 0) + 1
        for child in call.children:
            walk(child)

    walk(root)
    return counts
