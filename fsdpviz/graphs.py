"""A report as networkx graphs: the module tree and the units with their prefetch edges.

:func:`module_graph` is a ``networkx.DiGraph`` (parent -> child);
:func:`unit_graph` is a ``networkx.MultiDiGraph`` (a ``DiGraph`` subclass), because
two units can be joined by several edges, e.g. ``forward_order`` and
``forward_prefetch``. :func:`to_node_link` and :func:`write_graph` export either
one to node-link JSON or GraphML.

Example::

    report = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=8)
    g = unit_graph(report)
    [(u, v, d["hook"]) for u, v, d in g.edges(data=True) if d["kind"] == "backward_prefetch"]
    write_graph(g, "units.graphml")
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import NotRequired, TypeAlias, TypedDict, cast

import networkx as nx

from fsdpviz.schema.events import Hook
from fsdpviz.schema.report import Report, unit_label

__all__ = ["module_graph", "to_node_link", "unit_graph", "write_graph"]

SUFFIXES = (".json", ".graphml")

Json: TypeAlias = str | int | float | bool | list["Json"] | dict[str, "Json"] | None
"""A JSON value: what :func:`to_node_link` gives, ``json.dumps`` takes."""


class ModuleNode(TypedDict):
    """The attributes of a node of :func:`module_graph` (see it for each)."""

    module_class: str
    unit: str | None
    is_unit: bool
    numel: int
    bytes: int
    params: dict[str, list[int]]
    calls: int
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]
    first_call: int | None


class UnitNode(TypedDict):
    """The attributes of a node of :func:`unit_graph` (see it for each)."""

    module_class: str
    numel: int
    bytes: int
    sharded_numel: int
    sharded_bytes: int
    dtype: str | None
    sharding_strategy: str
    n_params: int
    forward_index: int | None
    prefetched_forward: bool
    prefetched_backward: bool
    never_prefetched: bool


class UnitEdge(TypedDict):
    """The attributes of an edge of :func:`unit_graph`: its ``kind``; a prefetch's ``hook``
    and ``position`` (the event's index in the iteration)."""

    kind: str
    hook: NotRequired[Hook | None]
    position: NotRequired[int]


class NodeLinkData(TypedDict):
    """What :func:`to_node_link` gives: ``networkx.node_link_data``'s keys, every attribute
    value JSON (the graph's own attributes, and each node's and edge's with its ``id``, or
    its ``source``, ``target`` and a multigraph's ``key``)."""

    directed: bool
    multigraph: bool
    graph: dict[str, Json]
    nodes: list[dict[str, Json]]
    edges: list[dict[str, Json]]


def module_graph(report: Report) -> nx.DiGraph:
    """The module tree of ``report`` as a ``networkx.DiGraph``.

    One node per module of ``report.modules``, keyed by its FQN (``""`` for the
    root), with attributes ``module_class``, ``unit`` (the unit managing its
    direct parameters, or ``None``), ``is_unit`` (the module is itself a wrap
    unit), ``numel`` and ``bytes`` (direct parameters), ``params`` (name ->
    shape), ``calls``, ``input_shapes``, ``output_shapes`` and ``first_call``
    (its index in ``report.module_order``, ``None`` if it never ran). Edges go
    parent -> child with ``kind="child"``. ``graph["source"]`` and
    ``graph["world_size"]`` come from the report.

    Example::

        g = module_graph(report)
        g.nodes["layers.0.attn"]["unit"]       # 'layers.0'
        list(g.successors("layers"))           # ['layers.0', 'layers.1', ...]
    """
    graph = nx.DiGraph()
    graph.graph.update(source=report.source, world_size=report.config.world_size)
    units = {u.module for u in report.units}
    first_call: dict[str, int] = {}
    for i, fqn in enumerate(report.module_order):
        first_call.setdefault(fqn, i)
    for m in report.modules:
        attrs: ModuleNode = {
            "module_class": m.module_class,
            "unit": m.unit,
            "is_unit": m.fqn in units,
            "numel": m.numel,
            "bytes": m.bytes,
            "params": {name: list(shape) for name, shape in m.params.items()},
            "calls": m.calls,
            "input_shapes": [list(s) for s in m.input_shapes],
            "output_shapes": [list(s) for s in m.output_shapes],
            "first_call": first_call.get(m.fqn),
        }
        graph.add_node(m.fqn, **attrs)
    for m in report.modules:
        if m.parent is not None and m.parent in graph:
            graph.add_edge(m.parent, m.fqn, kind="child")
    return graph


def unit_graph(report: Report, iteration: int = -1) -> nx.MultiDiGraph:
    """The wrap units of ``report`` with forward-order and prefetch edges.

    A ``networkx.MultiDiGraph`` (a ``DiGraph`` subclass) with one node per unit,
    keyed by the unit's module FQN (``""`` for the root). Node attributes:
    ``module_class``, ``numel``, ``bytes``, ``sharded_numel``, ``sharded_bytes``,
    ``dtype``, ``sharding_strategy``, ``n_params``, ``forward_index`` (index in
    ``report.forward_order``, ``None`` if unused in forward) and, for the events of
    ``report.iterations[iteration]`` (default: the steady state),
    ``prefetched_forward`` / ``prefetched_backward`` (all-gathered with
    ``prefetch=True`` in that phase) and ``never_prefetched`` (all-gathered, but
    never by a prefetch).

    Edges, each with an attribute ``kind`` equal to its key:

    - ``forward_order``: between consecutive units of ``report.forward_order``;
    - ``forward_prefetch`` / ``backward_prefetch``: from the unit whose hook issued
      a prefetching all-gather (``hook_unit``) to the unit it gathers, with
      ``hook`` (e.g. ``pre_backward``) and ``position`` (the event's index in the
      iteration). Their keys are ``"<kind>@<position>"``. A prefetch without a
      ``hook_unit`` gets no edge; an event naming an unknown unit raises ``ValueError``.

    Example::

        g = unit_graph(report, iteration=1)
        [(u, v) for u, v, k in g.edges(keys=True) if k.startswith("backward_prefetch")]
        # BACKWARD_PRE on 3 blocks: [('', 'blocks.2'), ('blocks.2', 'blocks.1'), ...]
    """
    n = len(report.iterations)
    if not -n <= iteration < n:
        raise IndexError(
            f"iteration {iteration} is out of range: the report has {n} iteration(s) "
            "(0 is the first iteration, -1 the last: the steady state)"
        )
    index = iteration % n
    events = report.iterations[index]
    graph = nx.MultiDiGraph()
    graph.graph.update(source=report.source, world_size=report.config.world_size, iteration=index)
    forward_index: dict[str, int] = {}
    for i, fqn in enumerate(report.forward_order):
        forward_index.setdefault(fqn, i)
    gathered: set[str] = set()
    prefetched: dict[str, set[str]] = {"forward": set(), "backward": set()}
    for e in events:
        if e.kind == "all_gather":
            gathered.add(e.unit)
            if e.prefetch:
                prefetched[e.phase].add(e.unit)
    for u in report.units:
        node: UnitNode = {
            "module_class": u.module_class,
            "numel": u.numel,
            "bytes": u.bytes,
            "sharded_numel": u.sharded_numel,
            "sharded_bytes": u.sharded_bytes,
            "dtype": u.dtype,
            "sharding_strategy": u.sharding_strategy,
            "n_params": len(u.params),
            "forward_index": forward_index.get(u.module),
            "prefetched_forward": u.module in prefetched["forward"],
            "prefetched_backward": u.module in prefetched["backward"],
            "never_prefetched": u.module in gathered
            and u.module not in prefetched["forward"] | prefetched["backward"],
        }
        graph.add_node(u.module, **node)
    for a, b in itertools.pairwise(report.forward_order):
        _check_units(graph, "forward_order", a, b)
        order: UnitEdge = {"kind": "forward_order"}
        graph.add_edge(a, b, key="forward_order", **order)
    for pos, e in enumerate(events):
        if e.kind != "all_gather" or not e.prefetch or e.hook_unit is None:
            continue
        kind = f"{e.phase}_prefetch"
        _check_units(graph, f"event {pos} of iteration {index}", e.hook_unit, e.unit)
        key = f"{kind}@{pos}"
        prefetch: UnitEdge = {"kind": kind, "hook": e.hook, "position": pos}
        graph.add_edge(e.hook_unit, e.unit, key=key, **prefetch)
    return graph


def _check_units(graph: nx.MultiDiGraph, where: str, *names: str) -> None:
    for name in names:
        if name not in graph:
            raise ValueError(
                f"{where} refers to unit {unit_label(name)}, which is not in report.units"
            )


def to_node_link(graph: nx.Graph) -> NodeLinkData:
    """``graph`` as node-link data that ``json.dumps`` accepts.

    ``networkx.node_link_data(graph, edges="edges")`` with tuples and sets turned
    into lists, dict keys into strings and any other non-JSON value into its
    ``str``; ``None`` stays ``null``. Read it back with
    ``networkx.node_link_graph(data, edges="edges")``.

    Example::

        data = to_node_link(unit_graph(report))
        json.dumps(data)
        data["edges"][0]   # {'kind': 'forward_order', 'source': '', 'target': ..., 'key': ...}
    """
    return cast("NodeLinkData", _jsonable(nx.node_link_data(graph, edges="edges")))


def _jsonable(value: object) -> Json:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [_jsonable(v) for v in items]
    return str(value)


def write_graph(graph: nx.Graph, path: str | Path) -> Path:
    """Write ``graph`` to ``path``, in the format its suffix names; returns the path.

    - ``.json``: node-link JSON (:func:`to_node_link`);
    - ``.graphml``: GraphML via ``networkx.write_graphml``. GraphML holds only
      scalars, so list and dict attribute values are written as JSON strings and
      ``None`` values are left out (``networkx.read_graphml`` then gives back
      strings: decode them with ``json.loads``).

    Any other suffix raises ``ValueError``.

    Example::

        write_graph(module_graph(report), "modules.graphml")
        g = networkx.read_graphml("modules.graphml")
        json.loads(g.nodes["layers.0.mlp"]["params"])
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".json":
        p.write_text(json.dumps(to_node_link(graph), indent=1) + "\n")
    elif suffix == ".graphml":
        nx.write_graphml(_graphml_safe(graph), p)
    else:
        raise ValueError(
            f"cannot write a graph to {str(p)!r}: unsupported suffix {p.suffix!r}; "
            f"use one of {', '.join(SUFFIXES)}"
        )
    return p


def _graphml_safe(graph: nx.Graph) -> nx.Graph:
    out = graph.copy()
    out.graph = _scalars(graph.graph)
    for node, attrs in graph.nodes(data=True):
        out.nodes[node].clear()
        out.nodes[node].update(_scalars(attrs))
    edges = graph.edges(keys=True, data=True) if graph.is_multigraph() else graph.edges(data=True)
    for *ends, attrs in edges:
        out.edges[tuple(ends)].clear()
        out.edges[tuple(ends)].update(_scalars(attrs))
    return out


def _scalars(attrs: Mapping[str, object]) -> dict[str, str | int | float | bool]:
    out: dict[str, str | int | float | bool] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, bool | int | float | str):
            out[k] = v
        else:
            out[k] = json.dumps(_jsonable(v))
    return out
