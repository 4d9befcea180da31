"""What the prefetch graph shows, as data: unit positions, misordered and missed prefetches.

See :mod:`fsdpviz.views.prefetch` for the figure and what the two kinds of mistake mean.

Example::

    facts = prefetch_analysis(report)
    facts.missed   # [(previous unit, unit gathered on demand, its post-backward, gather)]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import networkx as nx

from fsdpviz.graphs import unit_graph
from fsdpviz.schema.events import Phase
from fsdpviz.schema.report import Report

__all__ = ["PrefetchAnalysis", "backward_unit_order", "forward_unit_order", "prefetch_analysis"]


@dataclass
class PrefetchAnalysis:
    """Facts behind the prefetch graph for one iteration.

    ``misordered``: ``(issuer, target, expected, position)`` per backward prefetch whose
    target is not the issuer's successor ``expected`` in the backward order.
    ``missed``: ``(previous, unit, post_backward_position, gather_position)`` per unit
    gathered on demand in backward although ``backward_prefetch`` is set (positions are
    event indices; ``post_backward_position`` is ``None`` when ``previous`` had no
    post-backward event). ``forward_order``: the units in the order their forward is
    first reached (``report.forward_order``, else what the events say; the root first).
    ``never_prefetched``: units all-gathered where a prefetch could have gathered them,
    and never by one (not the first unit of the forward, which nothing runs before, when
    it is not gathered again: FSDP1's root, kept unsharded for backward).
    """

    iteration: int
    positions: dict[str, int]
    backward_order: list[str]
    never_prefetched: list[str]
    forward_order: list[str] = field(default_factory=list)
    misordered: list[tuple[str, str, str | None, int]] = field(default_factory=list)
    missed: list[tuple[str, str, int | None, int]] = field(default_factory=list)


def backward_unit_order(report: Report, iteration: int = -1) -> list[str]:
    """Units in the order their backward is first reached.

    From ``report.module_backward_order``; for reports without it (a recording), the order
    in which ``report.iterations[iteration]``'s backward events name each unit, the unit
    whose pre-backward hook issued an event before the unit it names (a root kept
    unsharded gathers nothing in backward, but its pre-backward hook runs first).
    """
    units = {u.module for u in report.units}
    source = report.module_backward_order or _named_units(report, iteration, "backward")
    seen: dict[str, None] = {}
    for name in source:
        if name in units:
            seen.setdefault(name, None)
    return list(seen)


def forward_unit_order(report: Report, iteration: int = -1) -> list[str]:
    """Units in the order their forward is first reached: ``report.forward_order``, else
    (a recording that does not state it) the order in which the forward's events name
    them; the root first when it is a unit and neither names it (a root whose own
    parameters are none is never gathered, yet its forward wraps every other)."""
    units = {u.module for u in report.units}
    source = report.forward_order or _named_units(report, iteration, "forward")
    order = list(dict.fromkeys(n for n in source if n in units))
    if "" in units and "" not in order:
        order.insert(0, "")
    return order


def _named_units(report: Report, iteration: int, phase: Phase) -> list[str]:
    """The units ``report.iterations[iteration]``'s events of ``phase`` name, in order: an
    event issued by a unit's pre-hook (``pre_forward``, ``pre_backward``) names that unit
    before the unit it gathers."""
    pre_hook = f"pre_{phase}"
    return [
        name
        for e in report.iterations[iteration]
        if e.phase == phase
        for name in (e.hook_unit if e.hook == pre_hook else None, e.unit)
        if name is not None
    ]


def prefetch_analysis(
    report: Report, iteration: int = -1, graph: nx.MultiDiGraph | None = None
) -> PrefetchAnalysis:
    """Positions, never-prefetched units and the misordered and missed prefetches.
    ``graph``: ``unit_graph(report, iteration)``, when made already."""
    graph = unit_graph(report, iteration) if graph is None else graph
    index = graph.graph["iteration"]
    events = report.iterations[index]
    positions: dict[str, int] = {}
    order = forward_unit_order(report, index)
    for name in order:
        positions.setdefault(name, len(positions))
    for u in report.units:
        positions.setdefault(u.module, len(positions))
    backward = backward_unit_order(report, index)
    # under pipeline parallelism each stage is an FSDP root of its own: a unit's successor
    # in backward is the next unit of its stage (the stage before runs on another rank)
    pipe = report.pipeline
    stage = {u: s.index for s in pipe.stages for u in s.units} if pipe is not None else {}
    pairs = [(a, b) for a, b in itertools.pairwise(backward) if stage.get(a) == stage.get(b)]
    successor = dict(pairs)
    gathers = [(pos, e) for pos, e in enumerate(events) if e.kind == "all_gather"]
    first = next((e.unit for _, e in gathers if e.phase == "forward"), None)
    gathered_once_first = first is not None and all(
        e.unit != first for _, e in gathers if e.phase == "backward"
    )
    out = PrefetchAnalysis(
        iteration=index,
        positions=positions,
        backward_order=backward,
        never_prefetched=[
            n
            for n, d in graph.nodes(data=True)
            if d["never_prefetched"] and not (n == first and gathered_once_first)
        ],
        forward_order=order,
    )
    for a, b, data in graph.edges(data=True):
        if data["kind"] == "backward_prefetch" and successor.get(a) != b:
            out.misordered.append((a, b, successor.get(a), data["position"]))
    out.misordered.sort(key=lambda t: t[3])
    if not report.config.prefetches_backward:
        return out
    first_gather: dict[str, tuple[int, bool]] = {}
    post_backward: dict[str, int] = {}
    for pos, e in enumerate(events):
        if e.phase != "backward":
            continue
        if e.kind == "all_gather":
            first_gather.setdefault(e.unit, (pos, e.prefetch))
        if e.hook == "post_backward" and e.hook_unit is not None:
            post_backward.setdefault(e.hook_unit, pos)
    for a, b in pairs:
        if b in first_gather and not first_gather[b][1]:
            out.missed.append((a, b, post_backward.get(a), first_gather[b][0]))
    return out
