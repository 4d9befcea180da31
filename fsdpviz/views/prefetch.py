"""The prefetch graph: units in forward order with forward-order and prefetch edges.

Built from :func:`fsdpviz.graphs.unit_graph`. Units sit on one line in forward
order (numbered by their forward index); forward order runs along the line,
forward-prefetch edges arc above it, backward-prefetch edges below it. Two
things FSDP gets wrong are drawn in vermillion:

- ``misordered``: a backward prefetch whose target is not the unit that runs
  its backward next (FSDP picks targets from the reversed *forward* order);
- ``missed``: two units consecutive in the backward order where the second is
  all-gathered on demand although backward prefetch is on. With
  ``BACKWARD_POST`` this is the rule, not the exception: a unit's post-backward
  hook (where it prefetches) runs after the next unit's pre-backward hook has
  already all-gathered it.

Units that are all-gathered but never by a prefetch get a square outline.

The unit markers are the figure's last pickable trace and edges answer hover only at
their middles, away from the line of units, so a click on a unit always picks that
unit. The figure has no fixed width: it fills its output. Unit names label the x axis,
as many as stand apart at the width drawn (``layout.meta.fsdpviz_ticks`` lists them
all; fsdpviz's widget and saved page thin them to the width, plotly rotates them).

Example::

    fig = prefetch_figure(report)            # steady state
    analysis = prefetch_analysis(report)     # the same facts as data
    analysis.missed                          # [('', 'layers.3', 9, 7), ...]
"""

from __future__ import annotations

import itertools
import math
from typing import Any, TypedDict

import networkx as nx
import numpy as np
import plotly.graph_objects as go

from fsdpviz.graphs import UnitEdge, UnitNode, unit_graph
from fsdpviz.schema.report import Report
from fsdpviz.schema.report import unit_label as L
from fsdpviz.views.prefetch_facts import (
    PrefetchAnalysis,
    backward_unit_order,
    prefetch_analysis,
)
from fsdpviz.views.style import (
    EDGE_COLORS,
    Theme,
    format_bytes,
    template,
    text_on,
    theme_colors,
)
from fsdpviz.views.style import unit_colors as palette_for

__all__ = [
    "PrefetchAnalysis",
    "backward_unit_order",
    "prefetch_analysis",
    "prefetch_data",
    "prefetch_figure",
    "prefetch_parts",
]

_LABELS = {
    "forward_order": "forward order",
    "forward_prefetch": "forward prefetch",
    "backward_prefetch": "backward prefetch",
    "misordered": "backward prefetch, not the next unit",
    "missed": "next in backward, gathered on demand",
}
_SIDES = {  # where each kind's arcs run: along the line, above it, below, further below
    "forward_order": 0.0,
    "forward_prefetch": 1.0,
    "backward_prefetch": -1.0,
    "misordered": -1.0,
    "missed": -1.6,
}
_NEVER = "never prefetched"
_MAX_TICK_LABELS = 60  # drawn where no script thins them to the width (static images)
TICK_MIN_PX = 16  # unit names stand at least this far apart (they are 11 px high)
_COMPACT_FROM = 2000  # points; smaller figures keep plain lists (readable golden files)
# From this many units the names stand upright (tickangle -90) under a bottom margin
# measured here: plotly's automargin would draw a graph this big twice (~0.5 s each).
_UPRIGHT_FROM = 100
_CHAR_PX = 0.62  # width of a character of the 11 px tick font, as a fraction of its size
_PLOT_PX = (1000.0, 260.0)  # typical plot area (width, height) the arrowheads are aimed for


class PrefetchEdges(TypedDict):
    """:func:`prefetch_data`'s ``edges``: one list per key, one entry per edge."""

    kind: list[int]
    source: list[int]
    target: list[int]
    text: list[str]


class EdgeKind(TypedDict):
    """An edge kind of :func:`prefetch_data`: ``name``, ``label``, ``color``, ``dash`` and
    ``side`` (where its arcs run)."""

    name: str
    label: str
    color: str
    dash: str
    side: float


class PrefetchData(TypedDict):
    """What :func:`prefetch_data` returns (see it for each key)."""

    title: str
    notes: list[str]
    units: list[str]
    numbers: list[int]
    colors: list[str]
    hover: list[list[str]]
    never: list[bool]
    edges: PrefetchEdges
    kinds: list[EdgeKind]


def prefetch_figure(
    report: Report,
    iteration: int = -1,
    *,
    theme: Theme = "light",
    highlight_unit: str | None = None,
    selected_unit: str | None = None,
) -> go.Figure:
    """The prefetch graph of ``report.iterations[iteration]`` (default: steady state).

    The last two traces are the ``current`` and ``selected`` unit rings (one point
    each, empty when ``None``) so a widget can move them without rebuilding.
    """
    traces, layout = prefetch_parts(
        report,
        iteration,
        theme=theme,
        highlight_unit=highlight_unit,
        selected_unit=selected_unit,
    )
    return go.Figure(data=traces, layout=layout)


def prefetch_parts(
    report: Report,
    iteration: int = -1,
    *,
    theme: Theme = "light",
    highlight_unit: str | None = None,
    selected_unit: str | None = None,
) -> tuple[list[dict[str, object]], dict[str, object]]:
    """The traces and the layout of :func:`prefetch_figure` as plain dicts, not validated
    (for widgets that redraw on every re-plan)."""
    graph = unit_graph(report, iteration)
    facts = prefetch_analysis(report, iteration, graph)
    pos = facts.positions
    colors = palette_for(report)
    c = theme_colors(theme)
    traces: list[dict[str, object]] = []
    arcs = _arcs(graph, facts)
    # Screen pixels per unit of y over pixels per unit of x, to point arrowheads along arcs.
    # The y range holds the arcs drawn (none above the line without forward prefetch).
    flat = _flatness(len(pos))
    heights = [
        _arc(pos[a], pos[b], side, 2, flat)[1][1]
        for edges in arcs.values()
        for a, b, side, _ in edges
    ]
    y_range = [min([0.0, *heights]) - 0.5, max([0.0, *heights]) + 0.5]
    aspect = (_PLOT_PX[1] / (y_range[1] - y_range[0])) / (_PLOT_PX[0] / max(len(pos) - 1, 1))
    for kind, edges in arcs.items():
        if edges:
            traces += _edge_traces(kind, edges, pos, aspect)
    size = _node_size(len(pos))
    traces += _node_traces(graph, pos, colors, facts.never_prefetched, c, size)
    for name, unit, color in (  # not pickable: a click goes to the unit below
        ("current", highlight_unit, c["fg"]),
        ("selected", selected_unit, c["accent"]),
    ):
        xs = [pos[unit]] if unit is not None and unit in pos else []
        traces.append(
            {
                "type": "scatter",
                "x": xs,
                "y": [0.0] * len(xs),
                "mode": "markers",
                "name": name,
                "hoverinfo": "skip",
                "marker": {
                    "symbol": "circle-open",
                    "size": round(size + 10, 1),
                    "color": color,
                    "line": {"width": 3 if size >= 12 else 2},
                },
                "showlegend": False,
            }
        )
    return traces, _layout(report, facts, pos, theme, y_range)


def prefetch_data(report: Report, iteration: int = -1) -> PrefetchData:
    """The prefetch graph as fsdpviz's front end draws it (``js/src/prefetch.ts``): the
    facts of :func:`prefetch_figure` as JSON-ready columns, units in forward order.

    ``units``: FQNs in forward order (the x axis); ``numbers``: each one's index in
    ``report.units`` (the number the timeline and the explorer print); ``colors``;
    ``hover``: lines per unit; ``never``: never all-gathered by a prefetch. ``edges``:
    ``kind`` (index into ``kinds``), ``source`` and ``target`` (indices into ``units``)
    and ``text`` per edge. ``kinds``: ``name``, ``label``, ``color``, ``dash`` and
    ``side`` (0: along the line of units, 1: above it, -1: below, -1.6: further below).

    Example::

        data = prefetch_data(report)
        data["units"][:3]          # ['', 'layers.0', 'layers.1']
    """
    graph = unit_graph(report, iteration)
    facts = prefetch_analysis(report, iteration, graph)
    pos = facts.positions
    names = sorted(pos, key=pos.__getitem__)
    number = {u.module: i for i, u in enumerate(report.units)}
    colors = palette_for(report)
    never = set(facts.never_prefetched)
    title, notes = _heading(report, facts)
    kinds = list(_LABELS)
    edges: PrefetchEdges = {"kind": [], "source": [], "target": [], "text": []}
    for kind, arcs in _arcs(graph, facts).items():
        for a, b, _side, text in arcs:
            edges["kind"].append(kinds.index(kind))
            edges["source"].append(pos[a])
            edges["target"].append(pos[b])
            edges["text"].append(text)
    return {
        "title": title,
        "notes": notes,
        "units": names,
        "numbers": [number[n] for n in names],
        "colors": [colors[n] for n in names],
        "hover": [_unit_lines(graph, n, n in never) for n in names],
        "never": [n in never for n in names],
        "edges": edges,
        "kinds": [
            {
                "name": k,
                "label": _LABELS[k],
                "color": EDGE_COLORS[k][0],
                "dash": EDGE_COLORS[k][1],
                "side": _SIDES[k],
            }
            for k in kinds
        ],
    }


def _arcs(
    graph: nx.MultiDiGraph, facts: PrefetchAnalysis
) -> dict[str, list[tuple[str, str, float, str]]]:
    """The graph's edges by kind: ``(from, to, side, text)``; ``side`` is where the arc
    runs (0: along the line of units, 1: above, -1: below, -1.6: further below)."""
    arcs: dict[str, list[tuple[str, str, float, str]]] = {k: [] for k in _LABELS}
    for a, b in itertools.pairwise(facts.forward_order):
        arcs["forward_order"].append(
            (a, b, _SIDES["forward_order"], f"forward order: {L(a)} then {L(b)}")
        )
    edges: list[tuple[str, str, UnitEdge]] = list(graph.edges(data=True))
    for a, b, data in edges:
        kind = data["kind"]
        if kind == "forward_prefetch":
            arcs[kind].append(
                (
                    a,
                    b,
                    _SIDES[kind],
                    f"forward prefetch of {L(b)} by {L(a)} {data['hook']} "
                    f"(event {data['position']})",
                )
            )
    wrong = {(a, b, p) for a, b, _, p in facts.misordered}
    for a, b, data in edges:
        if data["kind"] != "backward_prefetch":
            continue
        kind = "misordered" if (a, b, data["position"]) in wrong else "backward_prefetch"
        text = f"backward prefetch of {L(b)} by {L(a)} {data['hook']} (event {data['position']})"
        if kind == "misordered":
            expected = next(
                e for x, y, e, p in facts.misordered if (x, y, p) == (a, b, data["position"])
            )
            text += f"; the next unit in backward is {L(expected)}"
        arcs[kind].append((a, b, _SIDES[kind], text))
    for a, b, post, gather in facts.missed:
        when = "never" if post is None else f"at event {post}"
        arcs["missed"].append(
            (
                a,
                b,
                _SIDES["missed"],
                f"{L(b)} runs its backward after {L(a)} but was all-gathered on demand "
                f"(event {gather}); {L(a)} post-backward {when}",
            )
        )
    return arcs


def _arc(
    x0: float, x1: float, side: float, steps: int, flat: float = 1.0
) -> tuple[list[float], list[float]]:
    """The points of an arc from x0 to x1 on the line of units, ``side`` of it; ``flat``
    (at most 1) flattens arcs between near units, where many units share the width."""
    if side == 0.0:
        return [x0, x1], [0.0, 0.0]
    if abs(side) == 1.0:
        height = side * min((0.35 + 0.12 * abs(x1 - x0)) * flat, 1.6)
    else:
        height = side * max(flat, 0.2)
    xs, ys = [], []
    for i in range(steps + 1):
        t = i / steps
        xs.append((1 - t) * x0 + t * x1)
        ys.append(4 * height * t * (1 - t))
    return xs, ys


def _flatness(n: int) -> float:
    """Arcs keep the shape they have at 40 units; where more units share the width, arcs
    between near units are flatter (tall, narrow loops would merge into a band)."""
    return min(1.0, 40 / max(n, 1))


def _edge_traces(
    kind: str,
    edges: list[tuple[str, str, float, str]],
    pos: dict[str, int],
    aspect: float,
) -> list[dict[str, object]]:
    color, dash = EDGE_COLORS[kind]
    xs: list[float | None] = []
    ys: list[float | None] = []
    mid_x, mid_y, tips_x, tips_y, angles, texts = [], [], [], [], [], []
    # Points per arc: 12 where there is room, fewer where hundreds of units share the axis.
    steps = max(4, min(12, round(_PLOT_PX[0] * 3 / max(len(pos), 1))))
    for a, b, side, text in edges:
        ax, ay = _arc(pos[a], pos[b], side, steps, _flatness(len(pos)))
        xs += [*ax, None]
        ys += [*ay, None]
        m = len(ax) // 2
        mid_x.append(ax[m])
        mid_y.append(ay[m])
        texts.append(text)
        # Arrowhead just before the target node, pointing along the arc.
        k = max(len(ax) - 3, 0)
        tips_x.append(ax[k + 1] if len(ax) > 2 else ax[0] + 0.8 * (ax[1] - ax[0]))
        tips_y.append(ay[k + 1] if len(ay) > 2 else 0.0)
        dx, dy = ax[-1] - ax[k], ay[-1] - ay[k]
        angles.append(round(math.degrees(math.atan2(dx, dy * aspect)), 1))
    label = _LABELS[kind]
    arrow = round(max(5.0, min(11.0, 0.5 * _PLOT_PX[0] / max(len(pos), 1))), 1)
    traces: list[dict[str, object]] = [
        {
            "type": "scatter",
            "x": _compact(xs),
            "y": _compact(ys),
            "mode": "lines",
            "name": label,
            "legendgroup": kind,
            "hoverinfo": "skip",
            "line": {"color": color, "dash": dash, "width": 2 if kind != "forward_order" else 1.5},
        },
        {
            "type": "scatter",
            "x": _compact(tips_x),
            "y": _compact(tips_y),
            "mode": "markers",
            "legendgroup": kind,
            "showlegend": False,
            "hoverinfo": "skip",
            "marker": {"symbol": "arrow", "size": arrow, "color": color, "angle": _compact(angles)},
        },
    ]
    if kind != "forward_order":  # its segments join neighbours on the line of units
        traces.append(  # hover at each arc's middle, off the line: never over a unit
            {
                "type": "scatter",
                "x": _compact(mid_x),
                "y": _compact(mid_y),
                "mode": "markers",
                "legendgroup": kind,
                "showlegend": False,
                "text": texts,
                "hovertemplate": "%{text}<extra></extra>",
                "marker": {"size": 8, "color": color, "opacity": 0.0},
            }
        )
    return traces


def _unit_lines(graph: nx.MultiDiGraph, n: str, never: bool) -> list[str]:
    """What hovering unit ``n`` says, a line each."""
    d: UnitNode = graph.nodes[n]
    fi = d["forward_index"]
    lines = [
        f"{L(n)} ({d['module_class']})",
        f"forward index: {'not run in forward' if fi is None else fi}",
        f"parameters: {d['numel']:,} in {d['n_params']} tensors",
        f"bytes: {format_bytes(d['bytes'])} full, {format_bytes(d['sharded_bytes'])} per rank",
        f"prefetched in forward: {d['prefetched_forward']}, in backward: "
        f"{d['prefetched_backward']}",
    ]
    if never:
        lines.append(_NEVER)
    return lines


def _node_size(n: int) -> float:
    """Unit markers shrink to fit the plot (never below 7 px, still a target for a click)."""
    return max(7.0, min(20.0, 0.75 * _PLOT_PX[0] / max(n, 1)))


def _node_traces(
    graph: nx.MultiDiGraph,
    pos: dict[str, int],
    colors: dict[str, str],
    never: list[str],
    c: dict[str, str],
    size: float,
) -> list[dict[str, object]]:
    names = sorted(pos, key=pos.__getitem__)
    many = size < 15  # their forward index is printed inside while it fits
    hover = []
    for n in names:
        first, *rest = _unit_lines(graph, n, n in never)  # the name, the last line in bold
        rest = [f"<b>{t}</b>" if t == _NEVER else t for t in rest]
        hover.append("<br>".join([f"<b>{L(n)}</b>{first[len(L(n)) :]}", *rest]))
    traces: list[dict[str, object]] = []
    if never:
        traces.append(
            {
                "type": "scatter",
                "x": [pos[n] for n in never],
                "y": [0.0] * len(never),
                "mode": "markers",
                "name": "never prefetched",
                "hoverinfo": "skip",
                "marker": {
                    "symbol": "square-open",
                    "size": round(size + 6, 1),
                    "color": c["muted"],
                    "line": {"width": 2 if size >= 12 else 1.5},
                },
            }
        )
    traces.append(
        {
            "type": "scatter",
            "x": [pos[n] for n in names],
            "y": [0.0] * len(names),
            "customdata": names,
            "mode": "markers" if many else "markers+text",
            "name": "units",
            "showlegend": False,
            "text": [str(pos[n]) for n in names],
            "textposition": "middle center",
            "textfont": {"size": 10, "color": [text_on(colors[n]) for n in names]},
            "hovertext": hover,
            "hovertemplate": "%{hovertext}<extra></extra>",
            "marker": {
                "size": round(size, 1),
                "color": [colors[n] for n in names],
                "line": {"width": 1, "color": c["bg"]},
            },
        }
    )
    return traces


def _layout(
    report: Report,
    facts: PrefetchAnalysis,
    pos: dict[str, int],
    theme: Theme,
    y_range: list[float],
) -> dict[str, object]:
    names = sorted(pos, key=pos.__getitem__)
    step = max(1, math.ceil(len(names) / _MAX_TICK_LABELS))
    shown = names[::step]
    text = [L(n) if n == "" else n for n in names]
    title, notes = _heading(report, facts)
    xaxis: dict[str, object] = {
        "tickvals": [pos[n] for n in shown],
        "ticktext": text[::step],
        # no tickangle: plotly picks the first of these at which labels do not overlap
        "autotickangles": [0, -40, -90],
        "tickfont": {"size": 11},
        # the names stand inside the plot's width (thinned, margin made): plotly need not
        # lay each one out to test it for overflow
        "ticklabeloverflow": "allow",
        "showgrid": False,
        "zeroline": False,
        "automargin": True,  # room for the rotated unit names, then the axis title
        "title": {"text": "units in forward order", "standoff": 8},
    }
    bottom = 8
    if len(names) >= _UPRIGHT_FROM:  # names upright at any width, the margin made here
        longest = max(len(t) for t in text)
        bottom = math.ceil(longest * 11 * _CHAR_PX) + 8 + 34  # names, standoff, title
        pad = 0.06 * (len(names) - 1)  # about what plotly's autorange leaves on each side
        # a set range: the page thins the names before the first draw, to the same ones
        xaxis.update(tickangle=-90, automargin=False, range=[-pad, len(names) - 1 + pad])
        del xaxis["autotickangles"]
    return dict(
        template=template(theme),
        title={"text": title, "font": {"size": 14}},
        xaxis=xaxis,
        yaxis={"visible": False, "range": y_range, "fixedrange": True},
        legend={"orientation": "h", "yanchor": "top", "y": 1.0, "x": 1.0, "xanchor": "right"},
        margin={"l": 16, "r": 16, "t": 48 + 16 * len(notes), "b": bottom},
        autosize=True,  # no width: the figure fills its output
        # arcs on both sides get more height; upright names get their margin on top of it
        height=(440 if y_range[0] < -0.5 and y_range[1] > 0.5 else 360) + bottom - 8,
        meta={
            "fsdpviz_ticks": {
                "vals": [pos[n] for n in names],
                "text": text,
                "min_px": TICK_MIN_PX,
            }
        },
        hovermode="closest",
        uirevision="prefetch",
        annotations=[
            {
                "text": "<br>".join(notes),
                "xref": "paper",
                "yref": "paper",
                "x": 0,
                "y": 1.0,
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"color": EDGE_COLORS["missed"][0], "size": 12},
            }
        ]
        if notes
        else [],
    )


def _heading(report: Report, facts: PrefetchAnalysis) -> tuple[str, list[str]]:
    """The graph's title (which iteration, which prefetch settings) and its notes (what
    FSDP gets wrong in it)."""
    it = "first iteration" if facts.iteration == 0 else "steady state"
    cfg = report.config
    notes = []
    if facts.missed and cfg.backward_prefetch == "BACKWARD_POST":
        a, b, post, gather = facts.missed[0]
        notes.append(
            f"BACKWARD_POST prefetches too late: {_count(facts.missed, 'backward all-gather')} "
            f"on demand; e.g. {L(a)} post-backward at event {post}, {L(b)} already gathered at "
            f"event {gather}"
        )
    elif facts.missed:
        notes.append(
            f"{_count(facts.missed, 'backward all-gather')} on demand despite backward prefetch"
        )
    if facts.misordered:
        notes.append(
            f"{_count(facts.misordered, 'backward prefetch')} not for the next unit in backward"
        )
    if cfg.api == "FSDP2":
        explicit = sum(
            len(targets)
            for spec in (cfg.explicit_forward_prefetch, cfg.explicit_backward_prefetch)
            for targets in (spec or {}).values()
        )
        setting = f"FSDP2, implicit prefetch + {explicit} explicit targets"
    elif not (cfg.states("forward_prefetch") or cfg.states("backward_prefetch")):
        setting = f"recorded ({cfg.api})"  # a recording's config has no options
    else:
        setting = (
            f"forward_prefetch={cfg.forward_prefetch}, backward_prefetch={cfg.backward_prefetch}"
        )
    return f"Prefetch graph ({it}): {setting}", notes


def _count(items: list[Any], noun: str) -> str:
    return f"{len(items)} {noun}" + ("" if len(items) == 1 else "s")


def _compact(values: list[Any]) -> Any:
    """Numbers as a numpy array (sent base64-encoded by plotly) when there are many of them;
    ``None`` (a gap between arcs) becomes NaN."""
    if len(values) < _COMPACT_FROM:
        return values
    return np.array([np.nan if v is None else v for v in values], dtype=float)
