"""The timeline view as a static plotly figure (the widget draws the same data in JS).

A group of lanes per rank (or plan): hook calls on the CPU, compute with its waits for
communication shaded, a lane per stream, and the memory lane stacked by category with
the peak marked. See :mod:`fsdpviz.views.timeline_view` for how events are placed.
Times are drawn in the unit that suits the run (µs, ms or s), named on the axis.

Example::

    fig = timeline_figure(report, step=40)
    fig.write_image("timeline.png")
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fsdpviz.schema.timeline import duration_text
from fsdpviz.views.style import CATEGORY_COLORS, Theme, format_bytes, template, theme_colors
from fsdpviz.views.timeline_columns import TimelineData
from fsdpviz.views.timeline_lanes import FREE, MemoryOption
from fsdpviz.views.timeline_memory import CapacityEntry, MemoryEntry
from fsdpviz.views.timeline_view import cursor_x, timeline_data

__all__ = ["CAPACITY_IN_SCALE", "lane_names", "memory_axis_top", "time_unit", "timeline_figure"]

_MAX_LABELLED = 400


def lane_names(d: TimelineData) -> list[str]:
    """Category names of the event lanes, top to bottom (``group · lane``)."""
    groups = d["groups"]
    return [
        f"{groups[lane['group']]['name']} · {lane['name']}"
        for lane in d["lanes"]
        if lane["kind"] != "memory"
    ]


def time_unit(d: TimelineData) -> tuple[float, str]:
    """Scale and name of the unit the x axis is drawn in: ``(1e6, "µs")``, or ``(1, "event")``."""
    if not d["timed"]:
        return 1.0, "event"
    top = max([abs(x) for x in d["steps"]["x1"]] or [0.0])
    for scale, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "µs")):
        if top * scale >= 1:
            return scale, unit
    return 1e9, "ns"


def timeline_figure(
    reports: Any,
    iteration: int | None = -1,
    *,
    memory: MemoryOption = "auto",
    step: int | None = None,
    theme: Theme = "light",
    data: TimelineData | None = None,
    machine: str | None = None,
) -> go.Figure:
    """Lanes of ``reports`` (as :func:`timeline_data` takes them) for ``iteration``.

    ``step`` draws the cursor at that step (where the event starts on its own lane, as the
    front end's cursor); ``data`` reuses a :func:`timeline_data`. The memory lanes share one
    y scale (:func:`memory_axis_top`) and a prediction's draw its machine's usable memory
    and the reserved estimate.
    """
    if data is None:
        data = timeline_data(reports, iteration, memory=memory, machine=machine)
    d = data
    c = theme_colors(theme)
    mem = d["memory"]
    rows = 1 + len(mem)
    heights = [0.62] + [0.38 / max(len(mem), 1)] * len(mem) if mem else [1.0]
    fig = make_subplots(
        rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.05, row_heights=heights
    )
    scale, unit = time_unit(d)
    lanes = lane_names(d)
    event_lanes = [i for i, lane in enumerate(d["lanes"]) if lane["kind"] != "memory"]
    category = dict(zip(event_lanes, lanes, strict=True))
    _add_compute(fig, d, category, scale, c)
    _add_streams(fig, d, category, scale, c)
    _add_calls(fig, d, category, scale, c)
    top = memory_axis_top(mem)
    for k, entry in enumerate(mem):
        _add_memory(fig, d, entry, k + 2, scale, c, top)
    _layout(fig, d, step, theme, lanes, scale, unit)
    return fig


def _label(d: TimelineData, unit: int) -> str:
    name = d["units"][unit] or "(root)"
    return f"{d['unit_numbers'][unit]} {name}"


def _spans(x0: list[float], x1: list[float], scale: float) -> dict[str, object]:
    """A horizontal bar trace's ``orientation``, ``base`` and ``x`` for the spans ``x0[i]`` to
    ``x1[i]``, drawn ``scale`` times their length (the time unit's)."""
    return {
        "orientation": "h",
        "base": [x * scale for x in x0],
        "x": [(b - a) * scale for a, b in zip(x0, x1, strict=True)],
    }


def _add_compute(
    fig: go.Figure, d: TimelineData, category: dict[int, str], scale: float, c: dict[str, str]
) -> None:
    comp = d["compute"]
    groups = d["groups"]
    lane_of = {lane["group"]: i for i, lane in enumerate(d["lanes"]) if lane["kind"] == "compute"}
    labelled = len(comp["unit"]) <= _MAX_LABELLED
    if comp["unit"]:
        fig.add_trace(
            go.Bar(
                name="compute (forward solid, backward pale)",
                **_spans(comp["x0"], comp["x1"], scale),
                y=[category[lane_of[g]] for g in comp["group"]],
                marker={
                    "color": [d["colors"][u] for u in comp["unit"]],
                    "opacity": [1.0 if p == 0 else 0.6 for p in comp["phase"]],
                },
                text=[_label(d, u) for u in comp["unit"]] if labelled else None,
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                hovertext=[
                    f"{'forward' if p == 0 else 'backward'} of {_label(d, u)}"
                    + (f" · {groups[g]['name']}" if len(groups) > 1 else "")
                    for u, p, g in zip(comp["unit"], comp["phase"], comp["group"], strict=True)
                ],
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    _add_step_work(fig, d, category, scale, lane_of)
    waits = d["waits"]
    if waits["step"]:
        s = d["steps"]
        fig.add_trace(
            go.Bar(
                name="compute waiting for communication (exposed)",
                **_spans(waits["x0"], waits["x1"], scale),
                y=[category[lane_of[g]] for g in waits["group"]],
                marker={
                    "color": c["wait_fill"],
                    "line": {"color": c["wait"], "width": 1},
                    "pattern": {"shape": "/", "fgcolor": c["wait"], "size": 6},
                },
                hovertext=[
                    f"{_WAITER[bool(tail)]} waits "
                    f"{(x1 - x0) * 1e6:.3g} µs for {d['kinds'][s['kind'][i]]} "
                    f"{_label(d, s['unit'][i])}"
                    for i, x0, x1, tail in zip(
                        waits["step"], waits["x0"], waits["x1"], waits["tail"], strict=True
                    )
                ],
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1,
            col=1,
        )


STEP_WORK_LABELS = {
    "optimizer": "optimizer step",
    "float8_amax": "float8 amaxes",
    "float8_scales": "float8 scales",
}
"""The short label of each kind of :class:`~fsdpviz.schema.rows.StepWork` on its block."""


def step_work_details(d: TimelineData, k: int) -> list[str]:
    """The hover lines of the compute after the step's last micro-step ``k``: what it does,
    how long it takes, its memory traffic and kernels (the time model's numbers)."""
    w = d["step_work"]
    took = f"{duration_text(w['x1'][k] - w['x0'][k])}, {format_bytes(w['bytes'][k])} moved"
    if w["kernels"][k]:
        took += f" in {w['kernels'][k]} kernels"
    lines = [w["text"][k], took]
    if len(d["groups"]) > 1:
        lines.append(d["groups"][w["group"][k]]["name"])
    lines.append("after the step's last micro-step, before the next step's first all-gather")
    return lines


def _add_step_work(
    fig: go.Figure,
    d: TimelineData,
    category: dict[int, str],
    scale: float,
    lane_of: dict[int, int],
) -> None:
    """The optimizer step (and torchao's float8 precomputation) on the compute lane."""
    w = d.get("step_work")
    if not w:
        return
    color = CATEGORY_COLORS["optimizer"]
    fig.add_trace(
        go.Bar(
            name="optimizer step"
            + (" and float8 scales" if any(n != "optimizer" for n in w["name"]) else ""),
            **_spans(w["x0"], w["x1"], scale),
            y=[category[lane_of[g]] for g in w["group"]],
            marker={
                "color": color,
                "opacity": [1.0 if n == "optimizer" else 0.6 for n in w["name"]],
            },
            text=[STEP_WORK_LABELS.get(n, n) for n in w["name"]],
            textposition="inside",
            insidetextanchor="middle",
            textangle=0,
            hovertext=["<br>".join(step_work_details(d, k)) for k in range(len(w["name"]))],
            hovertemplate="%{hovertext}<extra></extra>",
        ),
        row=1,
        col=1,
    )


_WAITER = {True: "the step's end", False: "compute"}
"""Who waits for a collective: the compute, or the step's end (the tail's reduce-scatter)."""


def _add_streams(
    fig: go.Figure, d: TimelineData, category: dict[int, str], scale: float, c: dict[str, str]
) -> None:
    s = d["steps"]
    n = d["n_steps"]
    for label, want in (("collective", 0), ("prefetch (all-gather issued ahead)", 1)):
        idx = [i for i in range(n) if s["kind"][i] != FREE and s["prefetch"][i] == want]
        if not idx:
            continue
        fig.add_trace(
            go.Bar(
                name=label,
                orientation="h",
                base=[s["x0"][i] * scale for i in idx],
                x=[max(s["x1"][i] - s["x0"][i], 0.0) * scale for i in idx],
                y=[category[s["lane"][i]] for i in idx],
                marker={
                    "color": [d["colors"][s["unit"][i]] for i in idx],
                    "line": {"width": 0.5, "color": c["bg"]},
                    "pattern": {"shape": "/" if want else "", "fgcolor": c["fg"], "size": 5},
                },
                text=[_label(d, s["unit"][i]) for i in idx] if n <= _MAX_LABELLED else None,
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                hovertext=[_event_text(d, i) for i in idx],
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1,
            col=1,
        )


def _add_calls(
    fig: go.Figure, d: TimelineData, category: dict[int, str], scale: float, c: dict[str, str]
) -> None:
    """Each event where its hook issued it on the CPU: a square, an open one for a free."""
    s = d["steps"]
    cpu = {lane["group"]: i for i, lane in enumerate(d["lanes"]) if lane["kind"] == "cpu"}
    for label, free in (("issued by a hook (CPU)", False), ("free (reshard)", True)):
        idx = [i for i in range(d["n_steps"]) if (s["kind"][i] == FREE) == free]
        if not idx:
            continue
        fig.add_trace(
            go.Scatter(
                name=label,
                mode="markers",
                x=[s["issue"][i] * scale for i in idx],
                y=[category[cpu[s["group"][i]]] for i in idx],
                marker={
                    "symbol": "square-open" if free else "square",
                    "size": 9,
                    "color": [d["colors"][s["unit"][i]] for i in idx],
                    "line": {"width": 2 if free else 0.5, "color": c["bg"]}
                    if not free
                    else {"width": 2, "color": [d["colors"][s["unit"][i]] for i in idx]},
                },
                hovertext=[_event_text(d, i) for i in idx],
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1,
            col=1,
        )


def _event_text(d: TimelineData, i: int) -> str:
    s = d["steps"]
    parts = [f"step {i}: <b>{d['kinds'][s['kind'][i]]}</b> {_label(d, s['unit'][i])}"]
    if s["prefetch"][i]:
        parts.append("(prefetch)")
    parts.append("forward" if s["phase"][i] == 0 else "backward")
    if s["hook"][i] >= 0:
        who = _label(d, s["hook_unit"][i]) if s["hook_unit"][i] >= 0 else "?"
        parts.append(f"<br>issued by {d['hooks'][s['hook'][i]]} of {who}")
    if s["exposed"][i] > 0:
        w = d["waits"]
        at = [k for k, step in enumerate(w["step"]) if step == i]
        tail = sum(w["x1"][k] - w["x0"][k] for k in at if w["tail"][k])
        tail = min(tail, s["exposed"][i]) if at else 0.0
        if s["exposed"][i] - tail > s["exposed"][i] * 1e-9:
            parts.append(f"<br>compute waited {(s['exposed'][i] - tail) * 1e6:.3g} µs for it")
        if tail > 0:
            parts.append(f"<br>the step's end waited {tail * 1e6:.3g} µs for it")
    parts.append(f"<br>event {s['index'][i]} of iteration {s['iteration'][i]}")
    return " ".join(parts)


def memory_axis_top(entries: list[MemoryEntry]) -> float:
    """The top of the memory lanes' one y scale (a comparison's lanes share it): the most
    any lane holds, and each lane's reserved estimate and its machine's usable memory unless
    they are more than :data:`CAPACITY_IN_SCALE` times that (then their line is drawn at the
    top, marked as off scale). ``js/src/timeline_draw.ts`` draws with the same rule."""
    held = 0.0
    for m in entries:
        held = max(held, max(m["total"], default=0.0), float(m["peak"]["bytes"]))
    top = held
    for m in entries:
        cap = m.get("capacity")
        for v in (float(cap["reserved"]), float(cap["usable"])) if cap else ():
            if 0 < v <= CAPACITY_IN_SCALE * held:
                top = max(top, v)
    return top


CAPACITY_IN_SCALE = 3.0
"""The capacity line is on the memory lane's scale while the machine's usable memory is at
most this many times what the plan holds (its peak, its reserved estimate)."""


def _add_memory(
    fig: go.Figure, d: TimelineData, m: MemoryEntry, row: int, scale: float,
    c: dict[str, str], top: float,
) -> None:  # fmt: skip
    xs = [x * scale for x in m["x0"]] + ([m["x1"][-1] * scale] if m["x1"] else [])
    for name, color in zip(m["categories"], m["colors"], strict=True):
        ys = list(m["bytes"][name])
        fig.add_trace(
            go.Scatter(
                name=name.replace("_", " "),
                x=xs,
                y=[*ys, ys[-1]] if ys else [],
                mode="lines",
                line={"shape": "hv", "width": 0, "color": color},
                fillcolor=color,
                stackgroup=f"memory{m['group']}",
                hovertemplate=f"{name.replace('_', ' ')}: %{{y:,}} bytes<extra></extra>",
                legendgroup="memory",
            ),
            row=row,
            col=1,
        )
    peak = m["peak"]
    fig.add_trace(
        go.Scatter(
            name="peak",
            mode="markers+text",
            x=[peak["x"] * scale],
            y=[peak["bytes"]],
            text=[f"peak {format_bytes(peak['bytes'])}"],
            textposition="top center",
            cliponaxis=False,
            marker={"symbol": "triangle-down", "size": 12, "color": c["accent"]},
            hovertemplate=(
                f"peak {peak['bytes']:,} bytes at step {peak['step']}<br>{peak['where']}"
                "<extra></extra>"
            ),
        ),
        row=row,
        col=1,
    )
    cap = m.get("capacity")
    if cap:
        _add_capacity(fig, m, cap, row, scale, c, top)
    fig.update_yaxes(
        title_text=f"{d['groups'][m['group']]['name'] if len(d['groups']) > 1 else 'memory'}",
        tickformat="~s",
        ticksuffix="B",
        range=[0, top * 1.15 if top else 1],
        row=row,
        col=1,
    )


def _add_capacity(
    fig: go.Figure, m: MemoryEntry, cap: CapacityEntry, row: int, scale: float,
    c: dict[str, str], top: float,
) -> None:  # fmt: skip
    """The machine's usable memory as a line (at the top, marked off scale, when it is far
    above the plan) and the allocator's reserved estimate, dashed; the verdict beside."""
    x0 = (m["x0"][0] if m["x0"] else 0.0) * scale
    x1 = (m["x1"][-1] if m["x1"] else 1.0) * scale
    usable = float(cap["usable"])
    on_scale = usable <= top * 1.0001
    y = usable if on_scale else top * 1.1
    color = c["fg"] if cap["fits"] else c["wait"]
    label = cap["label"] + ("" if on_scale else " (above, off scale)")
    verdict = "fits" if cap["fits"] else "does not fit"
    fig.add_trace(
        go.Scatter(
            name=f"capacity: {cap['label']}",
            mode="lines+text",
            x=[x0, x1],
            y=[y, y],
            text=["", f"{label} · {verdict}"],
            textposition="top left",
            cliponaxis=False,
            line={"color": color, "width": 2, "dash": "solid" if on_scale else "dot"},
            hovertemplate=f"{cap['text']}<extra></extra>",
            legendgroup="capacity",
        ),
        row=row,
        col=1,
    )
    reserved = float(cap["reserved"])
    if reserved > 0:
        above = reserved > top * 1.0001
        fig.add_trace(
            go.Scatter(
                name=f"reserved (estimated) {format_bytes(reserved)}"
                + (" (above, off scale)" if above else ""),
                mode="lines",
                x=[x0, x1],
                y=[top * 1.05, top * 1.05] if above else [reserved, reserved],
                line={"color": c["muted"], "width": 1, "dash": "dash"},
                hovertemplate=(
                    f"the caching allocator reserves about {format_bytes(reserved)} "
                    f"({int(reserved):,} bytes)<extra></extra>"
                ),
                legendgroup="capacity",
            ),
            row=row,
            col=1,
        )


def _layout(
    fig: go.Figure,
    d: TimelineData,
    step: int | None,
    theme: Theme,
    lanes: list[str],
    scale: float,
    unit: str,
) -> None:
    has_memory = bool(d["memory"])
    title = " · ".join(g["summary"] for g in d["groups"][:2])
    fig.update_layout(
        template=template(theme),
        barmode="overlay",
        bargap=0.25,
        title={"text": f"Timeline: {title}", "font": {"size": 14}},
        height=160 + 34 * len(lanes) + (170 * len(d["memory"]) if has_memory else 0),
        margin={"l": 8, "r": 8, "t": 48, "b": 8},
        legend={"orientation": "h", "y": -0.12, "x": 0},
        uniformtext={"minsize": 8, "mode": "hide"},
        hovermode="closest",
        uirevision="timeline",
    )
    fig.update_yaxes(automargin=True)
    fig.update_yaxes(
        categoryorder="array", categoryarray=lanes[::-1], type="category", row=1, col=1
    )
    axis = f"time ({unit}), {d['clock']}" if d["timed"] else d["clock"]
    fig.update_xaxes(title_text=axis, row=1 + len(d["memory"]), col=1)
    muted = theme_colors(theme)["muted"]
    for starts in d["iteration_starts"]:
        for start in starts[1:]:
            fig.add_vline(x=start * scale, line={"dash": "dot", "width": 1, "color": muted})
    if step is not None and 0 <= step < d["n_steps"]:
        x = cursor_x(d, step) * scale
        fig.add_vline(x=x, line={"width": 2, "color": theme_colors(theme)["accent"]}, name="cursor")
