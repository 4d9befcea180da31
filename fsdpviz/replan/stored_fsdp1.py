"""FSDP1 plans from one stored trace: re-planning without running the model again.

:func:`fsdpviz.analyze` runs the model (on meta) for every configuration, with
FSDP1's hooks and flat-parameter views in place, so that torch's autograd
engine orders the backward hooks. :class:`StoredTrace` runs the model once
with no FSDP hooks and keeps what every plan needs:

- the module calls in order, each with the autograd sequence number reached
  at that point (where FSDP1 would create a unit's parameter views) and the
  ``grad_fn`` of the outputs (where FSDP1 registers its pre-backward hooks);
- the autograd graph of the step and the ``AccumulateGrad`` node of every
  parameter.

For a plan it drives :class:`~fsdpviz.schedule.fsdp1_runtime.FSDP1Runtime` through the
recorded calls, which says when each unit's views are created (forward
prefetch moves them to the previous unit's pre-forward), rebuilds the graph
FSDP1 would get (each use of a parameter goes through the view created last
before it, the split node and the unit's flat ``AccumulateGrad``), and
schedules it as the engine does (:meth:`~fsdpviz.schedule.autograd_order.GraphEdit.order`).
The plan and its report are ``analyze``'s (:func:`~fsdpviz.schedule.fsdp1.plan_units`,
:func:`~fsdpviz.schedule.fsdp1.fsdp1_report`).

Only FSDP's views change the graph in the cases handled here. Anything else
that would (mixed-precision casts, frozen parameters, activation-checkpoint
recomputation, a parameter used before its unit's forward or returned as an
output, ignored modules, ``trace`` other than meta) makes :meth:`plan` return
``None`` and the caller traces instead. ``tests/test_replan_stored_trace.py`` checks
that a plan equals :func:`fsdpviz.analyze` across models and options.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from typing import Any, Unpack

import torch
from torch import nn
from torch._C._autograd import _get_sequence_nr
from torch.autograd.graph import Node
from torch.distributed.utils import _apply_to_tensors
from torch.utils._pytree import tree_leaves

from fsdpviz.plan.fsdp1 import Plan, PlannedUnit, WrapMemo
from fsdpviz.plan.fsdp1_options import FSDP1Options, parse_fsdp1_options
from fsdpviz.schedule.autograd_order import Graph, GraphEdit, NumberedGraph, capture
from fsdpviz.schedule.fsdp1 import Traced, fsdp1_report, plan_units
from fsdpviz.schedule.fsdp1_runtime import FSDP1Runtime, Handle
from fsdpviz.schema.events import Event
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.report import Report
from fsdpviz.trace.copy import model_copy, original_modules
from fsdpviz.trace.tracker import ModuleCalls, ModuleTracker, run_stored_step

__all__ = ["StoredTrace"]

_ACC_SEQ = float(2**64 - 1)  # the engine runs AccumulateGrad first of all ready nodes
_STEP = 1 / 1024  # between view instances made at the same point of the forward


@dataclass
class _Call:
    """One module pre- or post-forward, as FSDP1's hooks around it would see it."""

    module: str
    pre: bool
    seq: int  # the sequence number the next autograd node gets
    grad: bool
    outputs: list[Any] = field(default_factory=list)  # post: FSDP's pre-backward hook nodes
    leaves: list[Any] = field(default_factory=list)  # post: the module tracker's hook nodes
    requires_grad: bool = False  # post: an output requires grad


class StoredTrace:
    """One meta trace of ``model`` on ``inputs`` that FSDP1 plans are computed from.

    ``loss`` as for :func:`fsdpviz.analyze`. ``reason`` says why plans cannot be
    computed from this trace (``None`` when they can).
    """

    def __init__(self, model: nn.Module, inputs: Any, loss: Any = None) -> None:
        self.copy, mapping = model_copy(model, "meta")
        self._originals = original_modules(model, mapping)  # what a policy is asked of
        self.reason: str | None = None
        self.calls: list[_Call] = []
        self._acc: dict[str, Node | None] = {}  # parameter FQN -> its AccumulateGrad node
        self._graph: NumberedGraph | None = None
        self._users: dict[str, list[tuple[int, int]]] = {}  # registration -> (node, edge slot)
        # a node -> the modules whose output gradient it makes (the module backward order)
        self._module_hooks: dict[int, list[int]] = {}
        # per module output made with grad: the module, the nodes of its outputs (numbered)
        self._outputs: list[tuple[str, list[int]]] = []
        self.order: list[str] = []
        self.records: dict[str, ModuleCalls] = {}
        self.module_names: list[str] = []
        self.module_ids: dict[str, int] = {}
        self._memo = WrapMemo.of(self.copy)  # what every plan of the copy shares
        if any(not p.requires_grad for p in self.copy.parameters()):
            self.reason = "the model has frozen parameters"
            return
        # Each registration of a shared parameter gets its own leaf while tracing: a plan
        # may put the registrations in different units (FSDP1 then flattens it twice).
        shared = self._split_shared()
        try:
            self._trace(inputs, loss)
        finally:
            for (module, name), p in shared.items():
                module._parameters[name] = p

    def _split_shared(self) -> dict[tuple[nn.Module, str], nn.Parameter]:
        seen: set[int] = set()
        shared: dict[tuple[nn.Module, str], nn.Parameter] = {}
        for fqn, p in list(self.copy.named_parameters(remove_duplicate=False)):
            if id(p) in seen:
                owner, _, name = fqn.rpartition(".")
                module = self.copy.get_submodule(owner)
                shared[(module, name)] = p
                module._parameters[name] = nn.Parameter(torch.empty_like(p), requires_grad=True)
            seen.add(id(p))
        return shared

    def _trace(self, inputs: Any, loss: Any) -> None:
        for n, p in self.copy.named_parameters(remove_duplicate=False):
            grad_fn = p.expand_as(p).grad_fn  # makes the AccumulateGrad node, held by _acc
            assert grad_fn is not None
            self._acc[n] = grad_fn.next_functions[0][0]
        tracker = ModuleTracker(self.copy)
        names = tracker.names
        self.module_names = list(names.values())
        self.module_ids = {name: i for i, name in enumerate(self.module_names)}
        handles = []
        for module in names:
            handles.append(
                module.register_forward_pre_hook(
                    functools.partial(self._pre, names[module]), prepend=True
                )
            )
            handles.append(
                module.register_forward_hook(functools.partial(self._post, names[module]))
            )
        self._backward = False
        graphs: list[Graph] = []

        def on_loss(loss: torch.Tensor) -> None:
            graphs.append(capture(loss))
            self._backward = True

        run_stored_step(self.copy, inputs, loss, tracker, handles, on_loss)
        self.order = list(tracker.order)
        self.records = tracker.records
        graph = self._graph = NumberedGraph.of(graphs[0])
        param_of = {
            graph.number[node]: fqn for fqn, node in self._acc.items() if node in graph.number
        }
        for user, nexts in enumerate(graph.edges):
            for slot, acc in enumerate(nexts):
                fqn = param_of.get(acc)
                if fqn is not None:
                    self._users.setdefault(fqn, []).append((user, slot))
        for call in self.calls:
            if call.pre or not call.grad:
                continue
            reached = [graph.number[n] for n in call.outputs if n in graph.number]
            self._outputs.append((call.module, reached))  # others' gradients are never made
            for node in call.leaves:
                if node in graph.number:
                    hooks = self._module_hooks.setdefault(graph.number[node], [])
                    hooks.append(self.module_ids[call.module])

    # ------------------------------------------------------------- recording
    def _pre(self, name: str, module: nn.Module, args: Any) -> None:
        if self._backward:
            self.reason = f"module {name!r} runs inside backward (activation recomputation)"
        self.calls.append(_Call(name, True, _get_sequence_nr(), torch.is_grad_enabled()))

    def _post(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        call = _Call(name, False, _get_sequence_nr(), torch.is_grad_enabled())
        if call.grad:

            def collect(t: torch.Tensor) -> torch.Tensor:
                if t.requires_grad:
                    call.requires_grad = True
                    if t.grad_fn is None:
                        self.reason = f"module {name!r} returns a leaf tensor that requires grad"
                    call.outputs.append(t.grad_fn)
                return t

            _apply_to_tensors(collect, output)
            call.leaves = [
                t.grad_fn
                for t in tree_leaves(output)
                if isinstance(t, torch.Tensor) and t.requires_grad
            ]
        self.calls.append(call)

    # -------------------------------------------------------------- planning
    def plan(self, **fsdp_kwargs: Unpack[PlanKwargs]) -> Report | None:
        """The report :func:`fsdpviz.analyze` gives for these options (without ``profile``).

        ``None`` when this trace cannot answer (see ``reason`` and the module docstring).
        """
        if self.reason is not None:
            return None
        opts = parse_fsdp1_options(dict(fsdp_kwargs))
        if (
            opts.mixed_precision is not None
            or opts.ignored_modules
            or opts.ignored_states
            or opts.trace != "meta"
            or opts.activation_checkpointing
            or opts.job.grad_accum > 1  # micro-steps: analyze (or replay) plans them
        ):
            return None
        saved = [(m._parameters, dict(m._parameters)) for _, m in self._memo.named]
        try:
            plan = plan_units(self.copy, opts, self._originals, None, None, self._memo)
            if any(u.has_params and not u.requires_grad for u in plan.units):
                return None
            schedule = _Schedule(self, plan, opts)
            iterations = schedule.run()
            if iterations is None:
                return None
            traced = Traced(
                iterations, schedule.runtime, self.order, self.records,
                backward_order=schedule.backward_order,
            )  # fmt: skip
            return fsdp1_report(self.copy, plan, opts, traced, self._memo.named)
        finally:  # planning takes the flattened parameters off their modules
            for params, was in saved:
                if len(params) != len(was) or any(params.get(k) is not p for k, p in was.items()):
                    params.clear()
                    params.update(was)


class _Schedule:
    """Two iterations of one plan over a :class:`StoredTrace`."""

    def __init__(self, trace: StoredTrace, plan: Plan, opts: FSDP1Options) -> None:
        self.trace = trace
        self.plan = plan
        self.index = {u.fqn: i for i, u in enumerate(plan.units)}
        self.runtime = FSDP1Runtime(plan.units, opts.use_orig_params, self._views)
        self.backward_order: list[str] = []
        self._at: float | None = None  # where views created now go in sequence-number order
        self._last = -1.0
        self._next = 0.0
        self._created: list[tuple[int, float]] = []  # (unit, position) per view instance
        self._acc_hooks: set[int] = set()
        self._unexpected = False

    def _views(self, h: Handle) -> None:
        if self._at is None:  # FSDP1 creates views only in a pre-forward
            self._unexpected = True
            return
        # Views made at one point in the forward (nested pre-forwards with no operator
        # between them) are numbered in the order they are made, below the next node.
        self._at += _STEP
        self._last = self._at
        if self._at >= self._next:
            self._unexpected = True
        self._created.append((self.index[h.name], self._at))

    def _forward(self) -> list[tuple[str, int, Any]]:
        rt = self.runtime
        start = len(rt.log)
        self._last = -1.0
        for call in self.trace.calls:
            i = self.index.get(call.module)
            if i is None:
                continue
            if call.pre:
                self._next = float(call.seq)  # the sequence number of the next node
                self._at = max(self._last, self._next - 1.0)
                rt.pre_forward(i, call.grad)
                if rt.needs_post_backward_hook(i, call.grad) == "acc_grad":
                    self._acc_hooks.add(i)
            else:
                self._at = None
                rt.post_forward(i, call.grad, call.requires_grad)
        self._at = None
        return list(rt.log[start:])

    def run(self) -> list[list[Event]] | None:
        rt = self.runtime
        iterations: list[list[Event]] = []
        forward_prefetch = any(u.config.forward_prefetch for u in self.plan.units)
        first: list[tuple[str, int, Any]] = []
        for it in range(2):
            if it == 1 and not forward_prefetch:
                rt.replay(first)  # the same hook order again (what analyze does)
                iterations.append(rt.take_events())
                break
            self._created.clear()
            self._acc_hooks.clear()
            forward = self._forward()
            backward = self._backward(record_order=it == 0)
            if backward is None or self._unexpected:
                return None
            rt.replay(backward)
            first = forward + backward
            iterations.append(rt.take_events())
        return iterations

    def _backward(self, record_order: bool) -> list[tuple[str, int, Any]] | None:
        """The backward hook calls the engine makes for this iteration's views.

        The stored graph is copied and edited: each view instance adds a split node
        (numbered at the instance's place in the forward) into the unit's flat
        ``AccumulateGrad``, and each use of a parameter goes through a view node of the
        instance current at that use. Edge counts are kept as edges move, so the nodes
        no edge reaches any more (a parameter's own ``AccumulateGrad``, an instance no
        use goes through) never count."""
        trace, graph = self.trace, self.trace._graph
        assert graph is not None
        g = GraphEdit.of(graph)
        instances: dict[int, list[tuple[float, int]]] = {}
        flat: dict[int, int] = {}
        for made, at in self._created:
            if made not in flat:
                flat[made] = g.add(_ACC_SEQ, [])
            instances.setdefault(made, []).append((at, g.add(at, [flat[made]])))
        acc_hooks = {flat[i]: i for i in self._acc_hooks if i in flat}
        for index, unit in enumerate(self.plan.units):
            if not unit.has_params or index not in instances:
                continue
            if not self._route(unit, instances[index], g):
                return None
        calls: dict[int, list[tuple[str, int, Any]]] = {}  # a node -> the hooks it runs
        for module, outputs in trace._outputs:
            hooked = self.index.get(module)
            if hooked is not None:
                for node in outputs:
                    calls.setdefault(node, []).append(("pre_backward", hooked, False))
        for node, made in acc_hooks.items():  # after the node runs
            calls.setdefault(node, []).append(("post_backward", made, False))
        # an instance no use goes through is not reached (a split counts through its views)
        order = g.order(split for splits in instances.values() for _, split in splits)
        log: list[tuple[str, int, Any]] = []
        for node in order:
            if node in calls:
                log.extend(calls[node])
        log.append(("final_callback", 0, False))
        if record_order:
            hooks = trace._module_hooks
            reached = dict.fromkeys(i for node in order if node in hooks for i in hooks[node])
            self.backward_order = [trace.module_names[i] for i in reached]
        return log

    def _route(self, unit: PlannedUnit, made: list[tuple[float, int]], g: GraphEdit) -> bool:
        """Send every use of the unit's parameters through the view current at that use."""
        positions = [at for at, _ in made]
        view_of = {fqn: j for j, (_, _, fqn) in enumerate(unit.param_infos)}
        registrations = list(view_of.items())
        registrations += [(fqn, view_of[prim]) for _, _, fqn, prim in unit.shared_infos]
        step = _STEP / (len(view_of) + 2)  # the views follow their split node
        views: dict[tuple[int, int], int] = {}
        users = self.trace._users
        for fqn, j in registrations:
            for node, slot in users.get(fqn, ()):
                k = bisect.bisect_left(positions, g.seq[node]) - 1
                if k < 0:
                    return False  # used before the unit's first forward: not modelled here
                at, split = made[k]
                view = views.get((k, j))
                if view is None:
                    view = views[(k, j)] = g.add(at + (j + 1) * step, [split])
                g.move(node, slot, view)
        return True
