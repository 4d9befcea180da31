"""The step-through timeline as a static plotly figure (the widget draws the same data in JS).

Lanes per rank: compute, all-gather (frees as ticks) and reduce-scatter; the
memory series, when given, below with its peak marked. See
:mod:`fsdpviz.views.timeline_steps` for how events are placed in time.

Example::

    fig = timeline_figure(report, memory=series, step=40)
    fig.write_image("timeline.png")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fsdpviz.schema.report import Report
from fsdpviz.views.style import Theme, format_bytes, template, theme_colors
from fsdpviz.views.timeline_steps import KINDS, MemorySeries, timeline_data

__all__ = ["lane_names", "timeline_figure"]

_LANES = ("compute", "all-gather", "reduce-scatter")
_MAX_LABELLED_SEGMENTS = 400


def lane_names(ranks: Sequence[str]) -> list[str]:
    """Category names of the lanes, top to bottom."""
    return [f"{r} · {lane}" for r in ranks for lane in _LANES]


def timeline_figure(
    reports: Report | Sequence[Report],
    iteration: int | None = -1,
    *,
    memory: MemorySeries | None = None,
    step: int | None = None,
    theme: Theme = "light",
    data: dict[str, Any] | None = None,
) -> go.Figure:
    """Lanes of ``reports`` (one report per rank) for ``iteration`` (``None``: all).

    ``step`` draws the cursor at that step; ``data`` reuses a :func:`timeline_data`.
    """
    d = data if data is not None else timeline_data(reports, iteration, memory=memory)
    c = theme_colors(theme)
    has_memory = d["memory"] is not None
    fig = make_subplots(
        rows=2 if has_memory else 1,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        row_heights=[0.62, 0.38] if has_memory else [1.0],
    )
    units, colors, ranks = d["units"], d["colors"], d["ranks"]
    s = d["steps"]
    n = d["n_steps"]
    comp = d["compute"]
    labelled = len(comp["unit"]) <= _MAX_LABELLED_SEGMENTS
    fig.add_trace(
        go.Bar(
            name="compute (unit whose hooks run)",
            orientation="h",
            base=comp["x0"],
            x=[b - a for a, b in zip(comp["x0"], comp["x1"], strict=True)],
            y=[f"{ranks[r]} · compute" for r in comp["rank"]],
            marker={
                "color": [colors[u] for u in comp["unit"]],
                "pattern": {
                    "shape": ["" if p == 0 else "." for p in comp["phase"]],
                    "fgcolor": c["bg"],
                    "size": 8,
                    "solidity": 0.15,
                },
            },
            text=[units[u] or "(root)" for u in comp["unit"]] if labelled else None,
            textposition="inside",
            insidetextanchor="middle",
            textangle=0,
            hovertext=[
                f"{'forward' if p == 0 else 'backward'} of {units[u]!r}, steps {a}-{b}"
                for u, p, a, b in zip(
                    comp["unit"], comp["phase"], comp["step0"], comp["step1"], strict=True
                )
            ],
            hovertemplate="%{hovertext}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    lanes = {0: "all-gather", 1: "all-gather", 2: "reduce-scatter", 3: "reduce-scatter"}
    hooks = d["hooks"]
    for kind_index, label, want_prefetch in (
        (0, "all-gather", False),
        (0, "all-gather (prefetch)", True),
        (2, "reduce-scatter", None),
        (3, "all-reduce", None),
    ):
        idx = [
            i
            for i in range(n)
            if s["kind"][i] == kind_index
            and (want_prefetch is None or bool(s["prefetch"][i]) == want_prefetch)
        ]
        if not idx:
            continue
        fig.add_trace(
            go.Bar(
                name=label,
                orientation="h",
                base=[s["x0"][i] for i in idx],
                x=[s["x1"][i] - s["x0"][i] for i in idx],
                y=[f"{ranks[s['rank'][i]]} · {lanes[kind_index]}" for i in idx],
                marker={
                    "color": [colors[s["unit"][i]] for i in idx],
                    "line": {"width": 0.5, "color": c["bg"]},
                    "pattern": {
                        "shape": "/" if want_prefetch else "",
                        "fgcolor": c["fg"],
                        "size": 5,
                    },
                },
                hovertext=[_event_text(s, i, units, hooks) for i in idx],
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    frees = [i for i in range(n) if s["kind"][i] == 1]
    if frees:
        fig.add_trace(
            go.Scatter(
                name="free",
                mode="markers",
                x=[s["x1"][i] for i in frees],
                y=[f"{ranks[s['rank'][i]]} · all-gather" for i in frees],
                marker={"symbol": "line-ns", "size": 16, "line": {"width": 2, "color": c["fg"]}},
                hovertext=[_event_text(s, i, units, hooks) for i in frees],
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    if has_memory:
        _add_memory(fig, d, c)
    _layout(fig, d, step, theme, has_memory)
    return fig


def _event_text(s: dict[str, list[Any]], i: int, units: list[str], hooks: list[str]) -> str:
    kind = KINDS[s["kind"][i]]
    parts = [f"step {i}: <b>{kind}</b> {units[s['unit'][i]]!r}"]
    if s["prefetch"][i]:
        parts.append("(prefetch)")
    parts.append("forward" if s["phase"][i] == 0 else "backward")
    if s["hook"][i] >= 0:
        hook_unit = units[s["hook_unit"][i]] if s["hook_unit"][i] >= 0 else None
        parts.append(f"<br>hook {hooks[s['hook'][i]]} of {hook_unit!r}")
    parts.append(f"<br>event {s['index'][i]} of iteration {s['iteration'][i]}")
    return " ".join(parts)


def _add_memory(fig: go.Figure, d: dict[str, Any], c: dict[str, str]) -> None:
    mem = d["memory"]
    if not mem["x"]:
        return
    # each value holds from its x to the next one's; the last to the end of its event
    ends = [*mem["x"][1:], d["steps"]["x1"][mem["step"][-1]]]
    fig.add_trace(
        go.Scatter(
            name="memory",
            mode="lines",
            x=[*mem["x"], ends[-1]],
            y=[*mem["bytes"], mem["bytes"][-1]],
            line={"shape": "hv", "color": c["fg"]},
            hovertext=[
                f"step {s}: {format_bytes(b)}"
                for s, b in zip(mem["step"], mem["bytes"], strict=True)
            ]
            + [f"step {mem['step'][-1]}: {format_bytes(mem['bytes'][-1])}"],
            hovertemplate="%{hovertext}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    if d["peak_step"] is not None:
        k = mem["step"].index(d["peak_step"])
        peak = mem["bytes"][k]
        fig.add_trace(
            go.Scatter(
                name="peak",
                mode="markers+text",
                x=[(mem["x"][k] + ends[k]) / 2],
                y=[peak],
                text=[f"peak {format_bytes(peak)}"],
                textposition="middle right",
                cliponaxis=False,
                marker={"symbol": "triangle-down", "size": 12, "color": "#D55E00"},
                hovertemplate=f"peak at step {d['peak_step']}: {format_bytes(peak)}<extra></extra>",
            ),
            row=2,
            col=1,
        )


def _layout(
    fig: go.Figure, d: dict[str, Any], step: int | None, theme: Theme, has_memory: bool
) -> None:
    lanes = lane_names(d["ranks"])
    fig.update_layout(
        template=template(theme),
        barmode="overlay",
        bargap=0.25,
        title={"text": f"Timeline ({d['source']}): {d['n_steps']} events", "font": {"size": 14}},
        height=160 + 60 * len(lanes) + (160 if has_memory else 0),
        margin={"l": 8, "r": 8, "t": 48, "b": 8},
        legend={"orientation": "h", "y": -0.18 if has_memory else -0.3, "x": 0},
        uniformtext={"minsize": 8, "mode": "hide"},
        hovermode="closest",
        uirevision="timeline",
    )
    fig.update_yaxes(automargin=True)
    fig.update_yaxes(
        categoryorder="array", categoryarray=lanes[::-1], type="category", row=1, col=1
    )
    fig.update_xaxes(title_text=d["x_label"], row=2 if has_memory else 1, col=1)
    if has_memory:
        fig.update_yaxes(title_text="bytes", row=2, col=1)
    for start in d["iteration_starts"][1:]:
        fig.add_vline(
            x=start, line={"dash": "dot", "width": 1, "color": theme_colors(theme)["muted"]}
        )
    if step is not None and 0 <= step < d["n_steps"]:
        x = d["steps"]["x0"][step]
        fig.add_vline(x=x, line={"width": 2, "color": "#D55E00"}, name="cursor")
