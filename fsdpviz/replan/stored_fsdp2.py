"""FSDP2 plans from one stored trace: re-planning ``fully_shard`` without running the model again.

FSDP2 computes with plain parameters, so the only nodes its hooks add to the
autograd graph are the post-backward nodes (``RegisterPostBackwardFunction``),
one per group each time the group enters the forward pass, applied to the
inputs that require grad; the pre-backward hooks are tensor hooks on the
group's outputs. :class:`StoredTrace` runs the model once on meta with such a
pass-through node in front of every module that owns parameters (any of them
may become a group) and keeps the module calls, the output nodes and the
autograd graph.

For a plan it builds the groups and their runtime as ``analyze`` does
(:func:`~fsdpviz.schedule.fsdp2.plan_groups`,
:func:`~fsdpviz.schedule.fsdp2_emulation.fsdp2_runtime`), drives the runtime through the
recorded calls (which says which calls enter the forward pass and so keep their node),
routes every use of a dropped node's output to the tensor it passed through, and
schedules the graph as the engine does
(:meth:`~fsdpviz.schedule.autograd_order.GraphEdit.order`): tensor hooks before their
node, a kept node's post-backward when it runs, a parameter's gradient when its
``AccumulateGrad`` runs. The report is ``analyze``'s
(:func:`~fsdpviz.schedule.fsdp2.fsdp2_report`).

What changes the graph in other ways makes :meth:`plan` return ``None`` and the caller
traces instead: ``mp_policy`` casts, recomputation inside backward, ``trace`` other than
meta, a model that already has ``fully_shard`` applied, a model whose forward fails with
the pass-through nodes (an in-place op on a module's input); so does
``unshard_in_backward`` other than ``True`` (whether a group's backward reads the
parameters it does not gather is measured by a trace).
``tests/test_replan_stored_trace.py`` checks that a plan equals :func:`fsdpviz.analyze`
across models and options.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Unpack

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from fsdpviz.plan.fsdp2 import GroupMemo, check_groups
from fsdpviz.plan.fsdp2_applied import fsdp2_states
from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.fsdp2_options import parse_fsdp2_options
from fsdpviz.plan.torch_fsdp import grad_tensors, installed, replace_grad_tensors
from fsdpviz.schedule.autograd_order import Graph, GraphEdit, NumberedGraph, capture
from fsdpviz.schedule.fsdp2 import fsdp2_report, plan_groups
from fsdpviz.schedule.fsdp2_emulation import fsdp2_runtime
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.report import Report
from fsdpviz.trace.copy import map_objects, model_copy, original_modules, original_params
from fsdpviz.trace.tracker import ModuleTracker, run_stored_step

__all__ = ["StoredTrace"]

_Output = tuple[Any, int, bool]  # grad_fn, output number, the tensor is a view


class _PassThrough(torch.autograd.Function):
    """The node FSDP2's ``RegisterPostBackwardFunction`` would be, for any module."""

    @staticmethod
    def forward(ctx: Any, *inputs: torch.Tensor) -> Any:
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        return grads


@dataclass
class _Node:
    """A pass-through node: where each of its inputs came from."""

    nexts: list[tuple[Any, int]]  # (grad_fn, output number) per input
    views: list[bool]  # the input tensor is a view


@dataclass
class _Call:
    """One module pre- or post-forward, as FSDP2's hooks around it would see it."""

    module: str
    pre: bool
    grad: bool
    node: Any = None  # pre: the pass-through node made here
    outputs: list[_Output] = field(default_factory=list)  # post: FSDP2's pre-backward hooks
    leaves: list[_Output] = field(default_factory=list)  # post: the module tracker's hooks


class StoredTrace:
    """One meta trace of ``model`` on ``inputs`` that FSDP2 plans are computed from.

    ``loss`` as for :func:`fsdpviz.analyze`. ``reason`` says why plans cannot be
    computed from this trace (``None`` when they can).
    """

    def __init__(self, model: nn.Module, inputs: Any, loss: Any = None) -> None:
        self.reason: str | None = None
        self.calls: list[_Call] = []
        self.nodes: dict[Any, _Node] = {}
        self.module_names: list[str] = []
        self._graph: NumberedGraph | None = None
        # numbered consumer, edge slot, the pass-through node it takes, output number
        self._into: list[tuple[int, int, Any, int]] = []
        self._grads: dict[Any, nn.Parameter] = {}  # AccumulateGrad node -> parameter
        # the installed torch's FSDP2 finds the tensors its hooks take (a plan for a release
        # that finds them otherwise traces again)
        self.rules = installed()
        if fsdp2_states(model):
            self.reason = "the model already has fully_shard applied"
            return
        self.copy, self._mapping = model_copy(model, "meta")
        self._originals = original_modules(model, self._mapping)  # what a callable is asked of
        self._params = original_params(model, self._mapping)  # what shard_placement_fn is
        self._memo = GroupMemo.of(self.copy)  # what every plan of the copy shares
        self._backward = False
        try:
            self._trace(inputs, loss)
        except Exception as e:  # analyze gives the user's error; here it only means "trace"
            first_line = str(e).splitlines()[0]
            self.reason = f"the forward fails with a node in front of every module: {first_line}"

    def _trace(self, inputs: Any, loss: Any) -> None:
        acc: dict[Any, nn.Parameter] = {}
        for p in self.copy.parameters():
            if p.requires_grad:
                grad_fn = p.expand_as(p).grad_fn  # makes the AccumulateGrad node
                assert grad_fn is not None
                acc[grad_fn.next_functions[0][0]] = p
        tracker = ModuleTracker(self.copy)
        names = tracker.names
        self.module_names = list(names.values())
        owners = {m for m in names if next(m.parameters(), None) is not None}
        handles = []
        for module, name in names.items():
            handles.append(
                module.register_forward_pre_hook(
                    functools.partial(self._pre, name, module in owners),
                    prepend=True,
                    with_kwargs=True,
                )
            )
            handles.append(module.register_forward_hook(functools.partial(self._post, name)))
        graphs: list[Graph] = []
        into: list[tuple[Any, int, Any, int]] = []

        def on_loss(loss: torch.Tensor) -> None:
            graph = capture(loss)
            graphs.append(graph)
            for node in graph.edges:  # while the graph is whole: which output each edge takes
                slots = [(n, nr) for n, nr in node.next_functions if n is not None]
                for slot, (n, nr) in enumerate(slots):
                    if n in self.nodes:
                        into.append((node, slot, n, nr))
            self._backward = True

        run_stored_step(self.copy, inputs, loss, tracker, handles, on_loss)
        self.tracker = tracker
        graph = self._graph = NumberedGraph.of(graphs[0])
        self._into = [(graph.number[c], slot, n, nr) for c, slot, n, nr in into]
        self._grads = {node: p for node, p in acc.items() if node in graph.number}

    # ------------------------------------------------------------- recording
    def _pre(
        self, name: str, owner: bool, module: nn.Module, args: Any, kwargs: Any
    ) -> tuple[Any, Any] | None:
        if self._backward:
            self.reason = f"module {name!r} runs inside backward (activation recomputation)"
        call = _Call(name, True, torch.is_grad_enabled())
        self.calls.append(call)
        if not (owner and call.grad):
            return None
        inputs = grad_tensors((args, kwargs), self.rules)
        if not inputs:
            return None
        outputs = _PassThrough.apply(*inputs)  # type: ignore[no-untyped-call]
        call.node = outputs[0].grad_fn
        self.nodes[call.node] = _Node(
            list(call.node.next_functions), [t._base is not None for t in inputs]
        )
        return replace_grad_tensors((args, kwargs), outputs, self.rules)  # type: ignore[no-any-return]

    def _post(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        call = _Call(name, False, torch.is_grad_enabled())
        self.calls.append(call)
        if not call.grad:
            return
        for t in grad_tensors(output, self.rules):
            if t.grad_fn is None:
                self.reason = f"module {name!r} returns a leaf tensor that requires grad"
            call.outputs.append((t.grad_fn, t.output_nr, t._base is not None))
        call.leaves = [
            (t.grad_fn, t.output_nr, False)
            for t in tree_leaves(output)
            if isinstance(t, torch.Tensor) and t.requires_grad
        ]

    # -------------------------------------------------------------- planning
    def plan(self, **fsdp2_kwargs: Unpack[PlanKwargs]) -> Report | None:
        """The report :func:`fsdpviz.analyze` gives for these ``fully_shard`` options
        (without ``profile``); ``None`` when this trace cannot answer (see ``reason``).
        """
        if self.reason is not None:
            return None
        opts = parse_fsdp2_options(dict(fsdp2_kwargs))
        mp = opts.mp_policy
        if opts.trace != "meta" or mp.param_dtype is not None or mp.output_dtype is not None:
            return None
        if opts.activation_checkpointing or opts.job.grad_accum > 1:
            return None
        if opts.unshard_in_backward is not True:  # what backward reads is not measured here
            return None
        if opts.parallel_dims.cp > 1:  # the trace ran whole sequences, no ring attention
            return None
        if opts.torch.hooks_enter_dataclasses != self.rules.hooks_enter_dataclasses:
            return None
        ignored = set(map_objects(opts.ignored_params, self._mapping, "ignored_params") or [])
        groups = plan_groups(self.copy, opts, self._originals, self._params, ignored, self._memo)
        check_groups(self.copy, groups, opts)
        runtime = fsdp2_runtime(self.copy, groups, opts)
        schedule = _Schedule(self, groups, runtime)
        return fsdp2_report(
            self.copy,
            groups,
            opts,
            runtime,
            self.tracker,
            {id(p) for p in self._grads.values()},  # an AccumulateGrad node in the graph
            schedule.backward_order,
            list(schedule.view_outputs),
            named=list(self._memo.modules.items()),
        )


class _Schedule:
    """One iteration of one plan over a :class:`StoredTrace`, fed to the runtime."""

    def __init__(self, trace: StoredTrace, groups: list[Group], runtime: FSDP2Runtime) -> None:
        self.trace = trace
        self.runtime = runtime
        self.kept: dict[Any, int] = {}  # pass-through node -> the group whose node it is
        self.view_outputs: dict[str, None] = {}
        self.backward_order: list[str] = []
        self._hooks: list[tuple[Any, str, int]] = []
        member = {f: (i, m) for i, g in enumerate(groups) for m, f in enumerate(g.fqns)}
        self._forward(member, groups)
        self._backward(groups)

    def _resolve(self, node: Any, nr: int) -> Any:
        """The node a use of ``(node, nr)`` reaches once dropped pass-throughs are gone."""
        nodes = self.trace.nodes
        while node in nodes and node not in self.kept:
            node, nr = nodes[node].nexts[nr]
        return node

    def _is_view(self, node: Any, nr: int, view: bool) -> bool:
        nodes = self.trace.nodes
        while node in nodes:
            if node in self.kept:
                return True  # an output of FSDP2's post-backward node is a view
            view = nodes[node].views[nr]
            node, nr = nodes[node].nexts[nr]
        return view

    def _forward(self, member: dict[str, tuple[int, int]], groups: list[Group]) -> None:
        rt = self.runtime
        module_ids = {n: k for k, n in enumerate(self.trace.module_names)}
        for call in self.trace.calls:
            found = member.get(call.module)
            if found is not None and call.pre:
                entering = rt.pre_forward(found[0], found[1])
                if entering and call.node is not None:
                    self.kept[call.node] = found[0]
            elif found is not None:
                completed = rt.post_forward(found[0], False, found[1])
                for j in (completed or ()) if call.grad else ():
                    for node, nr, view in call.outputs:
                        if self._is_view(node, nr, view):
                            self.view_outputs.setdefault(groups[j].name, None)
                        self._hooks.append((self._resolve(node, nr), "pre_backward", j))
            if not call.pre:
                for node, nr, _ in call.leaves:
                    self._hooks.append((self._resolve(node, nr), "module", module_ids[call.module]))

    def _backward(self, groups: list[Group]) -> None:
        """The stored graph with each dropped pass-through's uses sent to where its input
        came from, scheduled as the engine does (edge counts move with the edges, so the
        dropped nodes, no longer reached, never count)."""
        graph = self.trace._graph
        assert graph is not None
        number = graph.number
        g = GraphEdit.of(graph)
        moved: list[int] = []
        for consumer, slot, node, nr in self.trace._into:
            target = self._resolve(node, nr)
            if target is not node:
                moved.append(g.move(consumer, slot, number[target]))
        calls: dict[int, list[tuple[str, int, Any]]] = {}  # a node -> the hooks it runs
        for node, kind, payload in self._hooks:
            if node in number:  # else its gradient is never made
                calls.setdefault(number[node], []).append((kind, payload, False))
        for node, j in self.kept.items():  # after the node runs
            if node in number:
                calls.setdefault(number[node], []).append(("post_backward", j, False))
        group_of = {id(p): i for i, g in enumerate(groups) for p in g.params}
        for n, p in self.trace._grads.items():
            if id(p) in group_of:
                calls.setdefault(number[n], []).append(("ran", group_of[id(p)], False))
        log: list[tuple[str, int, Any]] = []
        for node in g.order(moved):
            if node in calls:
                log.extend(calls[node])
        log.append(("final_callback", 0, False))
        rt = self.runtime
        pending: set[int] = set()  # groups with a gradient since their last post-backward
        queued = False  # the root's final callback is queued by the first pre-backward
        reached: dict[str, None] = {}
        for kind, payload, _ in log:
            if kind == "ran":
                pending.add(payload)
            elif kind == "module":
                reached.setdefault(self.trace.module_names[payload], None)
            elif kind == "pre_backward":
                queued = rt.pre_backward(payload) or queued
            elif kind == "post_backward":
                rt.post_backward(payload, payload in pending)
                pending.discard(payload)
            elif kind == "final_callback" and queued:
                rt.final_callback({i: i in pending for i in range(len(groups))})
        self.backward_order = list(reached)
