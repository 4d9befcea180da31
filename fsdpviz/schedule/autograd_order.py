"""The FSDP1 steady-state backward order with forward prefetch, without a second trace.

With ``forward_prefetch=True`` a prefetched unit's parameter views are created
during the previous unit's pre-forward (FSDP1 creates views whenever it
unshards in the forward), so their autograd nodes get earlier sequence numbers
and the autograd engine runs their post-backward hooks later. Instead of
tracing a second iteration (where no profile is measured: the compute between the
reordered hooks is not the first iteration's), fsdpviz captures the first iteration's autograd
graph and schedules it the way the engine's CPU ready queue does (dependencies
counted over the reachable graph, highest sequence number first,
``AccumulateGrad`` highest of all; tensor hooks before their node runs,
``AccumulateGrad`` hooks after it) with the moved view nodes re-numbered.

The simulation first replays the first iteration and must reproduce the hook
order the real engine produced; if it does not (or the model recomputes
activations inside backward), the caller traces a second iteration instead.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

HookLog = list[tuple[str, int, Any]]


@dataclass
class ViewInstance:
    """One ``_use_unsharded_views`` call: the split node and the view nodes."""

    unit: int
    nodes: list[Any]  # split node first, then one view node per parameter


@dataclass
class GraphRecorder:
    """What the emulation registers during the forward, in registration order."""

    views: list[ViewInstance] = field(default_factory=list)
    tensor_hooks: list[tuple[Any, str, int]] = field(default_factory=list)  # node, kind, payload
    acc_hooks: dict[Any, int] = field(default_factory=dict)  # AccumulateGrad node -> unit
    multi: dict[int, tuple[int, list[Any]]] = field(default_factory=dict)  # id -> unit, nodes
    supported: bool = True  # False when a hook sits on a leaf tensor (not modelled)

    def add_views(self, unit: int, views: list[torch.Tensor]) -> None:
        if not views or views[0].grad_fn is None:  # a frozen unit: no nodes to place
            self.supported = False
            return
        split = views[0].grad_fn.next_functions[0][0]
        self.views.append(ViewInstance(unit, [split, *(v.grad_fn for v in views)]))

    def add_tensor_hook(self, t: torch.Tensor, unit: int) -> None:
        if t.grad_fn is None:
            self.supported = False
            return
        self.tensor_hooks.append((t.grad_fn, "pre_backward", unit))

    def add_multi(self, unit: int, tensors: list[torch.Tensor]) -> None:
        key = len(self.multi)
        if any(t.grad_fn is None for t in tensors):
            self.supported = False
        nodes = [t.grad_fn for t in tensors]
        self.multi[key] = (unit, nodes)
        for node in nodes:
            self.tensor_hooks.append((node, "multi", key))


@dataclass
class Graph:
    seq: dict[Any, float]
    edges: dict[Any, list[Any]]
    root: Any


def capture(loss: torch.Tensor) -> Graph:
    """The autograd graph reachable from ``loss`` (before ``backward`` frees it)."""
    root: Any = loss.grad_fn
    seq: dict[Any, float] = {}
    edges: dict[Any, list[Any]] = {}
    queue = deque([root])
    seq[root] = float(root._sequence_nr())
    while queue:
        node = queue.popleft()
        nexts = [n for n, _ in node.next_functions if n is not None]
        edges[node] = nexts
        for n in nexts:
            if n not in seq:
                seq[n] = float(n._sequence_nr())
                queue.append(n)
    return Graph(seq, edges, root)


@dataclass
class NumberedGraph:
    """A captured graph with its nodes numbered (the root is 0), for plans that edit a
    copy of it many times (fsdpviz.replan's stored traces): ``deps`` counts each node's
    incoming edges; every node is reachable from the root."""

    nodes: list[Any]
    number: dict[Any, int]
    seq: list[float]
    edges: list[list[int]]
    deps: list[int]

    @classmethod
    def of(cls, graph: Graph) -> NumberedGraph:
        nodes = [graph.root, *(n for n in graph.edges if n is not graph.root)]
        number = {n: i for i, n in enumerate(nodes)}
        edges = [[number[n] for n in graph.edges[node]] for node in nodes]
        deps = [0] * len(nodes)
        for nexts in edges:
            for n in nexts:
                deps[n] += 1
        return cls(nodes, number, [graph.seq[n] for n in nodes], edges, deps)


@dataclass
class GraphEdit:
    """A copy of a :class:`NumberedGraph` edited for one plan: nodes added and edges moved,
    each edge counted in ``deps`` as it is made or moved."""

    seq: list[float]
    edges: list[list[int]]
    deps: list[int]

    @classmethod
    def of(cls, graph: NumberedGraph) -> GraphEdit:
        return cls(list(graph.seq), list(graph.edges), list(graph.deps))

    def add(self, seq: float, nexts: list[int]) -> int:
        """A new node (numbered next) with edges to ``nexts``."""
        self.seq.append(seq)
        self.edges.append(nexts)
        self.deps.append(0)
        for n in nexts:
            self.deps[n] += 1
        return len(self.seq) - 1

    def move(self, node: int, slot: int, target: int) -> int:
        """Point ``node``'s edge ``slot`` at ``target``; returns where it pointed."""
        nexts = self.edges[node] = list(self.edges[node])
        was = nexts[slot]
        self.deps[was] -= 1
        nexts[slot] = target
        self.deps[target] += 1
        return was

    def order(self, candidates: Iterable[int]) -> list[int]:
        """The engine's order of the nodes reached from node 0, once the nodes no edge
        reaches any more (among ``candidates`` and what only they reached) are taken out."""
        drop_unreached(self.edges, self.deps, candidates)
        return engine_order(self.seq, self.edges, self.deps)


def engine_order(seq: list[float], edges: list[list[int]], deps: list[int]) -> list[int]:
    """The order the engine's CPU ready queue runs the nodes reachable from node 0 in:
    a node is ready once every edge into it from a node that ran has been taken (``deps``
    counts the edges into each node from the reachable part, and is used up), the ready
    node with the highest sequence number runs first, ties in the order they got ready."""
    out: list[int] = []
    heap = [(-seq[0], 0, 0)]
    counter = 0
    pop, push = heapq.heappop, heapq.heappush
    node = -1  # the node that runs next without going through the heap, if any
    while heap or node >= 0:
        if node < 0:
            node = pop(heap)[2]
        out.append(node)
        ready = -1
        for n in edges[node]:
            deps[n] -= 1
            if deps[n] == 0:
                if ready >= 0:
                    counter += 1
                    push(heap, (-seq[ready], counter, ready))
                ready = n
        # one node got ready: it runs next when it is ahead of every queued node
        if ready >= 0 and (not heap or -seq[ready] < heap[0][0]):
            node = ready
        else:
            if ready >= 0:
                counter += 1
                push(heap, (-seq[ready], counter, ready))
            node = -1
    return out


def drop_unreached(edges: list[list[int]], deps: list[int], candidates: Iterable[int]) -> None:
    """Take out of ``deps`` the edges of the nodes no edge reaches any more, starting from
    ``candidates`` (nodes whose incoming edges were moved away), and of the nodes only they
    reached. The graph is acyclic, so a node is reached from node 0 exactly when it keeps
    an incoming edge once the unreached ones are taken away."""
    stack = [n for n in dict.fromkeys(candidates) if n != 0 and deps[n] == 0]
    while stack:
        node = stack.pop()
        for n in edges[node]:
            deps[n] -= 1
            if deps[n] == 0:
                stack.append(n)


def simulate(graph: Graph, rec: GraphRecorder, overrides: dict[Any, float]) -> HookLog:
    """FSDP1's backward hook calls in the order the autograd engine would make them
    (:func:`engine_order`, ``overrides`` giving nodes other sequence numbers)."""
    numbered = NumberedGraph.of(graph)
    seq = [overrides.get(n, s) for n, s in zip(numbered.nodes, numbered.seq, strict=True)]
    pre: dict[Any, list[tuple[str, int]]] = {}
    for node, kind, payload in rec.tensor_hooks:
        pre.setdefault(node, []).append((kind, payload))
    expected = {k: sum(1 for n in nodes if n in graph.edges) for k, (_, nodes) in rec.multi.items()}
    fired: dict[int, int] = dict.fromkeys(rec.multi, 0)
    out: HookLog = []
    for node in (numbered.nodes[n] for n in engine_order(seq, numbered.edges, numbered.deps)):
        for kind, payload in pre.get(node, ()):
            if kind == "pre_backward":
                out.append(("pre_backward", payload, False))
            else:
                fired[payload] += 1
                if fired[payload] == expected[payload]:
                    out.append(("post_backward_reshard_only", rec.multi[payload][0], False))
        if node in rec.acc_hooks:
            out.append(("post_backward", rec.acc_hooks[node], False))
    out.append(("final_callback", 0, False))
    return out


def steady_overrides(
    rec: GraphRecorder, creations: list[tuple[int, int, int, bool]], first_log_views: int
) -> dict[Any, float]:
    """New sequence numbers for view instances the steady state creates elsewhere.

    ``creations``: the steady-state view creations in order, as ``(unit,
    pre-forward unit, its call number, prefetch)``. Instance ``k`` of a unit in
    the first iteration is created at that unit's ``k``-th pre-forward.
    """
    by_unit: dict[int, list[ViewInstance]] = {}
    for inst in rec.views[:first_log_views]:
        by_unit.setdefault(inst.unit, []).append(inst)
    used: dict[int, int] = {}
    own_created: set[tuple[int, int]] = set()
    out: dict[Any, float] = {}
    for unit, host, call, prefetch in creations:
        k = used.get(unit, 0)
        used[unit] = k + 1
        inst = by_unit[unit][k]
        if not prefetch:
            own_created.add((host, call))
            continue
        host_inst = by_unit[host][call]
        base = host_inst.nodes[0]._sequence_nr()
        if (host, call) in own_created:
            anchor = float(host_inst.nodes[-1]._sequence_nr()) + 0.5
        else:  # the host was prefetched itself: nothing of its own is created here
            anchor = base - 0.5
        for t, node in enumerate(inst.nodes):
            out[node] = anchor + (t + 1) * 1e-6
    return out
