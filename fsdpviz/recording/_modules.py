"""Module forward/backward enter and exit on a real run, in the style of ``ModTracker``.

Cheaper than ``torch.distributed._tools.mod_tracker.ModTracker``: two global
module hooks that look the module up in a dict and append
``(perf_counter_ns, kind, fqn)`` to a list, and for backward one autograd
node pre-hook per distinct node (no multi-grad hooks); consecutive modules,
where one's output is the next one's input, share that node's hook. Events
become :class:`~fsdpviz.schema.events.ModuleEvent` dicts only when
:meth:`ModuleEventRecorder.take` is called, at the end of an iteration.

- ``forward_enter`` / ``forward_exit``: the module's forward starts / returns.
- ``backward_enter``: autograd is about to run the node that produced the
  module's (first grad-requiring) output: its gradient is complete, so the
  module's backward starts.
- ``backward_exit``: the same for its first grad-requiring positional input:
  the module's backward is done. Modules whose inputs need no gradient (an
  embedding fed token ids) have no ``backward_exit``.

Marks fired by one node come exits first (innermost module first), then enters
(outermost first), all at the same time.

Modules are named by FQN with wrapper segments (``_fsdp_wrapped_module``,
``_checkpoint_wrapped_module``, ``_orig_mod``) dropped, so an FSDP1 wrapper
carries the name of the module it wraps (its pre-forward all-gather then falls
inside that module's span) and the wrapped module itself is not tracked twice.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as module_mod
from torch.utils.hooks import RemovableHandle

from fsdpviz.schema.events import ModuleEventKind
from fsdpviz.schema.names import WRAPPER_SEGMENTS, unwrapped_fqn

KINDS: tuple[ModuleEventKind, ...] = (
    "forward_enter",
    "forward_exit",
    "backward_enter",
    "backward_exit",
)


def unwrapped_class(module: nn.Module) -> str:
    """The class name of the module a wrapper (``CheckpointWrapper``, ``torch.compile``'s
    ``OptimizedModule``) holds, else of ``module``; FSDP2's own class (``FSDP<name>``)
    counts as the class it was made from."""
    for segment in WRAPPER_SEGMENTS:
        inner = getattr(module, segment, None)
        if isinstance(inner, nn.Module):
            return unwrapped_class(inner)
    from fsdpviz.plan.fsdp2_applied import unwrapped_class as fsdp2_original

    return fsdp2_original(type(module)).__name__


def module_names(model: nn.Module) -> dict[nn.Module, str]:
    """Module -> FQN without wrapper segments; the outermost module of each name wins."""
    names: dict[nn.Module, str] = {}
    seen: set[str] = set()
    for fqn, module in model.named_modules():
        clean = unwrapped_fqn(fqn)
        if clean not in seen:
            seen.add(clean)
            names[module] = clean
    return names


def _first_grad_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor needing a gradient in ``value`` or one level inside it."""
    if isinstance(value, torch.Tensor):
        return value if value.requires_grad else None
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.values()
    elif isinstance(value, tuple | list):
        items = value
    else:
        return None
    for item in items:
        if isinstance(item, torch.Tensor) and item.requires_grad:
            return item
    return None


class _NodeMarks:
    """The modules whose backward starts (``enters``) or ends (``exits``) at one autograd node."""

    __slots__ = ("enters", "exits")

    def __init__(self) -> None:
        self.enters: list[str] = []
        self.exits: list[str] = []


class ModuleEventRecorder:
    """Records module enter/exit events of ``model`` while entered.

    Example::

        with ModuleEventRecorder(model) as recorder:
            model(x).sum().backward()
        events = recorder.take(origin_ns=recorder.t0_ns)   # [{"kind", "module", "t"}, ...]
    """

    def __init__(self, model: nn.Module) -> None:
        self._names = module_names(model)
        self._events: list[tuple[int, int, str]] = []
        self._handles: list[RemovableHandle] = []
        self._active = False
        self._last: tuple[Any, _NodeMarks] | None = None
        self.t0_ns = 0

    def __enter__(self) -> ModuleEventRecorder:
        names = self._names
        append = self._events.append
        now = time.perf_counter_ns
        grad_enabled = torch.is_grad_enabled
        tensor = torch.Tensor
        marks_for = self._marks_for

        def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
            name = names.get(module)
            if name is None:
                return
            append((now(), 0, name))
            if grad_enabled():
                for a in args:
                    if isinstance(a, tensor) and a.requires_grad:
                        marks_for(a).exits.append(name)
                        break

        def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            name = names.get(module)
            if name is None:
                return
            append((now(), 1, name))
            out = _first_grad_tensor(output)
            if out is not None:
                marks_for(out).enters.append(name)

        self._active = True
        self.t0_ns = now()
        try:
            self._handles.append(module_mod.register_module_forward_pre_hook(pre))
            self._handles.append(module_mod.register_module_forward_hook(post))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _marks_for(self, t: torch.Tensor) -> _NodeMarks:
        """The marks of the node that produces ``t``'s gradient, hooked on first use."""
        node = t.grad_fn
        if self._last is not None and node is not None and self._last[0] is node:
            return self._last[1]
        marks = _NodeMarks()
        fire = functools.partial(self._fire, marks)
        if node is not None:
            node.register_prehook(fire)
            self._last = (node, marks)
        else:
            t.register_hook(fire)  # type: ignore[no-untyped-call]
        return marks

    def _fire(self, marks: _NodeMarks, *grads: Any) -> None:
        if self._active:
            ns = time.perf_counter_ns()
            append = self._events.append
            for name in reversed(marks.exits):
                append((ns, 3, name))
            for name in reversed(marks.enters):
                append((ns, 2, name))

    def __exit__(self, *exc: Any) -> None:
        self._active = False
        self._last = None
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def take(self, origin_ns: int) -> list[dict[str, Any]]:
        """The events since the last call as :meth:`ModuleEvent.to_dict` dicts.

        ``t`` is in seconds since ``origin_ns``; dicts, not objects, because this
        runs inside the training step, just before the dicts are written as JSON.
        """
        self._last = None
        events = self._events[:]
        del self._events[: len(events)]
        return [
            {"kind": KINDS[k], "module": name, "t": (ns - origin_ns) / 1e9}
            for ns, k, name in events
        ]
