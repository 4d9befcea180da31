"""A tuning as a view: every configuration :func:`fsdpviz.tune` evaluated, tokens/s per GPU
against the memory it needs per rank, with the capacity line, the frontier joined, the best
and the user's own configuration marked, and the knob table beside it.

- x: the memory a configuration needs per rank (:attr:`~fsdpviz.tuning.Candidate.memory_bytes`):
  the larger of its peak and the allocator's reserved estimate (what ``fits`` checks against
  the machine's usable memory), or, with a ``memory_budget``, its peak (what ``fits`` checks
  against the budget); so a point left of the capacity line fits, and one right of it does
  not;
- y: tokens/s per GPU (:attr:`~fsdpviz.tuning.Candidate.tokens_per_s`);
- ``frontier``: :attr:`~fsdpviz.tuning.Tuning.frontier` (no other configuration is both faster
  and lighter), joined from left to right;
- the knob table: per knob, the value of the best (or, when nothing fits, of the lowest
  peak), the user's, and the best alternative :meth:`~fsdpviz.tuning.Tuning.alternatives`
  gives, with its text.

:func:`tune_data` is what fsdpviz's front end draws (``js/src/tune.ts``) in the notebook
(:class:`fsdpviz.widgets.TuneView`) and in the page ``tuning.save("tune.html")`` writes;
:func:`tune_figure` draws the same as a plotly figure (``tuning.save("tune.png")``).

Example::

    tuning = fsdpviz.tune(model, ids, world_size=[8, 16])
    data = tune_data(tuning)                 # JSON-ready
    tune_figure(tuning, theme="dark").show()
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING, Literal, TypedDict

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fsdpviz.schema.memory import size_text
from fsdpviz.schema.timeline import duration_text
from fsdpviz.views.style import TABLE, Theme, format_bytes, template, theme_colors

if TYPE_CHECKING:  # (the search's package loads torch: fsdpviz.views, and the command line's
    # check of an output's suffix, do not)
    from fsdpviz.tuning.result import Candidate, Tuning

__all__ = ["anchor_of", "tune_data", "tune_figure", "tune_svg"]

GROUP_COLORS: tuple[str, ...] = tuple(TABLE["palette_dark"])
"""One colour per world size compared, in order (the colour table's dark palette)."""


class Capacity(TypedDict):
    """:func:`tune_data`'s capacity line: where it stands (``bytes``) and its ``label``."""

    bytes: int
    label: str


class WorldSizeGroup(TypedDict):
    """A world size compared: ``world_size``, its ``label`` and ``color``."""

    world_size: int
    label: str
    color: str


class TunePoints(TypedDict):
    """:func:`tune_data`'s ``points``: one list per key, one entry per candidate."""

    index: list[int]
    x: list[int]
    y: list[float]
    fits: list[bool]
    frontier: list[bool]
    traced: list[bool]
    group: list[int]
    hover: list[list[str]]


class KnobRow(TypedDict):
    """A row of the knob table: the ``knob``, its ``name`` in words, its ``value`` in the
    configuration compared with, the ``user``'s, the best ``alternative`` (text) and that
    alternative's ``candidate`` (position in ``points``), ``None`` when no other was tried."""

    knob: str
    name: str
    value: str
    user: str
    alternative: str | None
    candidate: int | None


class TuneData(TypedDict):
    """What :func:`tune_data` returns (see it for each key)."""

    title: str
    summary: list[str]
    x_label: str
    y_label: str
    capacity: Capacity | None
    groups: list[WorldSizeGroup]
    points: TunePoints
    frontier: list[int]
    best: int | None
    user: int
    anchor: Literal["best", "lightest"]
    knobs: list[KnobRow]


def _capacity(tuning: Tuning) -> Capacity | None:
    if tuning.budget is not None:
        return {"bytes": tuning.budget, "label": f"budget: {size_text(tuning.budget)} per rank"}
    usable = max((c.usable_bytes for c in tuning.candidates), default=0)
    if usable <= 0:
        return None
    return {"bytes": usable, "label": f"{tuning.machine}: {size_text(usable)} usable"}


def anchor_of(tuning: Tuning) -> Candidate:
    """What the knob table compares with: the best, else the lightest (as
    :meth:`~fsdpviz.tuning.Tuning.alternatives` does)."""
    best = tuning.best
    if best is not None:
        return best
    return min(tuning.candidates, key=lambda c: c.memory_bytes)


def _hover(tuning: Tuning, c: Candidate, frontier: set[int]) -> list[str]:
    from fsdpviz.tuning.space import KNOB_NAMES  # lazy: loads torch, which the views do without

    best = tuning.best
    tags = [f"#{c.index}"]
    if best is not None and c is best:
        tags.append("best")
    if c.user:
        tags.append("as given")
    if c.index in frontier:
        tags.append("on the frontier")
    tags.append("fits" if c.fits else "does not fit")
    if tuning.budget is not None:
        memory = (
            f"memory per rank: peak {size_text(c.peak_bytes)} of the "
            f"{size_text(tuning.budget)} budget (reserved ≈ {size_text(c.reserved_bytes)})"
        )
    else:
        of = size_text(c.usable_bytes) if c.usable_bytes else "?"
        memory = (
            f"memory per rank: {size_text(c.memory_bytes)} of {of} "
            f"(peak {size_text(c.peak_bytes)}, reserved ≈ {size_text(c.reserved_bytes)})"
        )
    lines = [
        " · ".join(tags),
        f"{c.tokens_per_s:,.0f} tokens/s per GPU ({c.total_tokens_per_s:,.0f} on "
        f"{c.world_size} GPUs)",
        f"MFU {c.mfu:.1%}, step {duration_text(c.step_s)}, exposed communication "
        f"{duration_text(c.exposed_comm_s)}",
        memory,
    ]
    if c.dominant:
        lines.append(f"the peak is mostly {c.dominant}")
    lines += [f"{KNOB_NAMES.get(k, k)}: {v}" for k, v in c.knobs.items()]
    if c.derived:
        lines.append(f"derived from {c.derived}: the plan a trace would make, untraced")
    else:
        lines.append(
            "traced: the model ran for it" if c.traced else "replayed from another one's trace"
        )
    return lines


def tune_data(tuning: Tuning) -> TuneData:
    """The tuning as the front end draws it (JSON-ready).

    ``points``: one column per field, one entry per candidate in ``tuning.candidates``'
    order (``index``: the candidate's :attr:`~fsdpviz.tuning.Candidate.index`; ``x``: bytes,
    see the module docstring; ``y``: tokens/s per GPU; ``fits``, ``frontier``, ``traced``,
    ``group``: its world size's entry in ``groups``; ``hover``: its lines of text);
    ``frontier``: positions of the frontier's points, by x; ``best`` and ``user``:
    positions (``best`` ``None`` when nothing fits); ``capacity``: the line (``bytes``,
    ``label``) or ``None``; ``knobs``: the knob table's rows; ``summary``: the lines of
    :meth:`~fsdpviz.tuning.Tuning.summary`.
    """
    from fsdpviz.tuning.space import KNOB_NAMES  # lazy: loads torch, which the views do without

    cands = tuning.candidates
    position = {id(c): k for k, c in enumerate(cands)}
    frontier = tuning.frontier
    on_frontier = {c.index for c in frontier}
    sizes = list(dict.fromkeys([*tuning.world_sizes, *(c.world_size for c in cands)]))
    groups: list[WorldSizeGroup] = [
        {
            "world_size": ws,
            "label": f"{ws} ranks",
            "color": GROUP_COLORS[k % len(GROUP_COLORS)],
        }
        for k, ws in enumerate(sizes)
    ]
    group_of = {ws: k for k, ws in enumerate(sizes)}
    xs = [c.memory_bytes for c in cands]
    best = tuning.best
    anchor = anchor_of(tuning)
    alternatives = {a["knob"]: a for a in tuning.alternatives()}
    knobs: list[KnobRow] = []
    for knob, value in anchor.knobs.items():
        alt = alternatives.get(knob)
        other: Candidate | None = alt["candidate"] if alt is not None else None
        knobs.append(
            {
                "knob": knob,
                "name": KNOB_NAMES.get(knob, knob),
                "value": value,
                "user": tuning.user.knobs.get(knob, ""),
                "alternative": None if alt is None else str(alt["text"]),
                "candidate": None if other is None else position[id(other)],
            }
        )
    budget = tuning.budget is not None
    return {
        "title": tuning.summary().splitlines()[0],
        "summary": tuning.summary().splitlines(),
        "x_label": "memory per rank: peak"
        if budget
        else "memory per rank: the larger of peak and reserved",
        "y_label": "tokens/s per GPU",
        "capacity": _capacity(tuning),
        "groups": groups,
        "points": {
            "index": [c.index for c in cands],
            "x": xs,
            "y": [c.tokens_per_s for c in cands],
            "fits": [c.fits for c in cands],
            "frontier": [c.index in on_frontier for c in cands],
            "traced": [c.traced for c in cands],
            "group": [group_of[c.world_size] for c in cands],
            "hover": [_hover(tuning, c, on_frontier) for c in cands],
        },
        "frontier": sorted(
            (position[id(c)] for c in frontier), key=lambda k: (xs[k], -cands[k].tokens_per_s)
        ),
        "best": None if best is None else position[id(best)],
        "user": position[id(tuning.user)],
        "anchor": "best" if best is not None else "lightest",
        "knobs": knobs,
    }


def tune_figure(tuning: Tuning, *, theme: Theme = "light") -> go.Figure:
    """:func:`tune_data` as a plotly figure, for static images: the scatter (filled: fits;
    open: does not fit; one colour per world size), the frontier joined, the best (★) and
    the configuration as given (◆) marked, the capacity line with the space past it
    shaded, and the knob table beside it."""
    data = tune_data(tuning)
    c = theme_colors(theme)
    p = data["points"]
    n = len(p["index"])
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.58, 0.42],
        specs=[[{"type": "xy"}, {"type": "table"}]],
        horizontal_spacing=0.04,
    )
    cap = data["capacity"]
    top = _x_top(p["x"], cap["bytes"] if cap else None)
    if cap is not None and cap["bytes"] > top:  # far past every point: named at the edge
        fig.add_annotation(
            x=1,
            y=0,
            xref="x domain",
            yref="y domain",
            text=f"<b>{cap['label']}</b> →",
            showarrow=False,
            xanchor="right",
            yanchor="bottom",
            font={"color": c["fg"], "size": 11},
            bgcolor=c["bg"],
        )
    elif cap is not None:
        fig.add_shape(
            type="rect",
            xref="x",
            yref="y domain",
            x0=cap["bytes"],
            x1=top,
            y0=0,
            y1=1,
            fillcolor=c["wait_fill"],
            line_width=0,
            layer="below",
        )
        fig.add_shape(
            type="line",
            xref="x",
            yref="y domain",
            x0=cap["bytes"],
            x1=cap["bytes"],
            y0=0,
            y1=1,
            line={"color": c["fg"], "width": 2},
        )
        fig.add_annotation(
            x=cap["bytes"],
            y=1,
            xref="x",
            yref="y domain",
            text=f"<b>{cap['label']}</b>",
            showarrow=False,
            xanchor="right",
            yanchor="top",
            xshift=-4,
            font={"color": c["fg"], "size": 11},
            bgcolor=c["bg"],
        )
    order = data["frontier"]
    fig.add_trace(
        go.Scatter(
            x=[p["x"][k] for k in order],
            y=[p["y"][k] for k in order],
            mode="lines",
            line={"color": c["muted"], "width": 1.5},
            name="frontier",
            hoverinfo="skip",
        ),
        row=1,
        col=1,
    )
    hover = ["<br>".join(lines) for lines in p["hover"]]
    for g, group in enumerate(data["groups"]):
        for fits in (True, False):
            ks = [k for k in range(n) if p["group"][k] == g and p["fits"][k] == fits]
            if not ks:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[p["x"][k] for k in ks],
                    y=[p["y"][k] for k in ks],
                    mode="markers",
                    name=f"{group['label']}, {'fits' if fits else 'does not fit'}",
                    marker={
                        "color": group["color"],
                        "size": 8,
                        "symbol": "circle" if fits else "circle-open",
                        "line": {"width": 1.5 if not fits else 0.5, "color": group["color"]},
                    },
                    text=[hover[k] for k in ks],
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=1,
                col=1,
            )
    same = data["best"] == data["user"]
    marks: tuple[tuple[Literal["best", "user"], str, str, str], ...]
    marks = (("best", "star", "best, as given" if same else "best", "top center"),
             ("user", "diamond-open", "" if same else "as given", "bottom center"))  # fmt: skip
    for key, symbol, label, where in marks:
        k = data[key]
        if k is None:
            continue
        group = data["groups"][p["group"][k]]
        fig.add_trace(
            go.Scatter(
                x=[p["x"][k]],
                y=[p["y"][k]],
                mode="markers+text",
                name="best" if key == "best" else "as given",
                text=[label],
                textposition=where,
                textfont={"color": c["fg"]},
                marker={
                    "symbol": symbol,
                    "size": 18 if key == "best" else 14,
                    "color": group["color"] if key == "best" else c["fg"],
                    "line": {"width": 1.5 if key == "best" else 2, "color": c["fg"]},
                },
                hovertext=[hover[k]],
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    turned = [r for r in data["knobs"] if r["alternative"]]
    fixed = [f"{r['name']} {r['value']}" for r in data["knobs"] if not r["alternative"]]
    rows = [(r["name"], r["value"], r["alternative"] or "") for r in turned]
    if fixed:
        rows.append(("not turned", "; ".join(fixed), "no other value tried"))
    fig.add_trace(
        go.Table(
            columnwidth=[0.8, 1.6, 2.6],
            header={
                "values": ["knob", data["anchor"], "best alternative"],
                "fill_color": c["call"],
                "font": {"color": c["fg"], "size": 11},
                "align": "left",
                "line_color": c["grid"],
            },
            cells={
                "values": [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]],
                "fill_color": c["bg"],
                "font": {"color": c["fg"], "size": 10},
                "align": "left",
                "line_color": c["grid"],
            },
        ),
        row=1,
        col=2,
    )
    ticks = _byte_ticks(top)
    fig.update_xaxes(
        title_text=data["x_label"],
        range=[0, top],
        tickvals=ticks,
        ticktext=[format_bytes(v) if v else "0" for v in ticks],
        showgrid=True,
        row=1,
        col=1,
    )
    ys = p["y"]
    fig.update_yaxes(
        title_text=data["y_label"],
        range=[0, (max(ys, default=0.0) or 1.0) * 1.1],
        tickformat=",.0f",
        row=1,
        col=1,
    )
    fig.update_layout(
        template=template(theme),
        title={"text": data["title"], "font": {"size": 13}},
        legend={"orientation": "h", "y": -0.18, "x": 0},
        margin={"l": 70, "r": 20, "t": 60, "b": 90},
        # the table's rows, wrapped at about 40 characters, all shown
        height=max(560, 190 + sum(15 * (1 + max(len(r[1]), len(r[2])) // 40) + 16 for r in rows)),
        width=1300,
    )
    return fig


def _x_top(xs: list[int], capacity: int | None) -> float:
    """The right end of the memory axis: past the largest point, and past the capacity
    line unless that is more than three times as far (then the points would be a
    smudge at the left: the line is named at the edge instead), as the front end does."""
    most = max(xs, default=0)
    if capacity is not None and capacity <= 3 * most:
        most = max(most, capacity)
    elif capacity is not None and most <= 0:
        most = capacity
    return most * 1.06 or 1.0


def _nice_ticks(top: float, count: int) -> list[float]:
    """About ``count`` ticks from 0 to ``top`` at 1, 2 or 5 times a power of ten."""
    if top <= 0:
        return [0.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next((m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9)), 10 * mag)
    return [k * step for k in range(int(top / step + 1e-9) + 1)]


def _byte_ticks(top: float) -> list[int]:
    """About six ticks from 0 to ``top`` bytes, at 1, 2 or 5 times a power of ten of the
    binary unit ``top`` is written in (``format_bytes`` labels them); the front end's
    ``niceTicks`` picks the same."""
    if top <= 0:
        return [0]
    scale = 1
    while top / scale >= 1024 and scale < 2**40:
        scale *= 1024
    raw = top / scale / 6
    mag = 10 ** math.floor(math.log10(raw))
    step = next((m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9)), 10 * mag)
    count = int(top / scale / step + 1e-9)
    return [round(k * step * scale) for k in range(count + 1)]


def tune_svg(data: TuneData, width: int = 560, height: int = 260) -> str:
    """:func:`tune_data` as a small static SVG (no script, no kaleido): the points, the
    frontier, the capacity line, the best (★) and the given (◆), for what a saved notebook
    shows without fsdpviz's front end. Text, axes and lines use ``currentColor``, so it
    follows the page's light or dark theme."""
    p = data["points"]
    cap = data["capacity"]
    top = _x_top(p["x"], cap["bytes"] if cap else None)
    y_top = (max(p["y"], default=0.0) or 1.0) * 1.1
    left, right, up, down = 58, 10, 22, 30
    pw, ph = width - left - right, height - up - down

    def at(x: float, y: float) -> tuple[float, float]:
        return left + x / top * pw, up + ph - y / y_top * ph

    def text(x: float, y: float, t: str, anchor: str = "start", extra: str = "") -> str:
        return (
            f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="currentColor" '
            f'font-family="system-ui, sans-serif" font-size="10"{extra}>{escape(t)}</text>'
        )

    n, fit = len(p["index"]), sum(p["fits"])
    body = [text(left, 12, f"{n} configurations, {fit} fit: {data['y_label']} against memory")]
    body.append(
        f'<rect x="{left}" y="{up}" width="{pw}" height="{ph}" fill="none" '
        'stroke="currentColor" stroke-opacity="0.35"/>'
    )
    for v in _byte_ticks(top):
        x, _ = at(v, 0)
        body.append(
            text(x, up + ph + 12, format_bytes(v) if v else "0", "middle", ' opacity="0.7"')
        )
    for rate in _nice_ticks(y_top, 5):
        _, y = at(0, rate)
        body.append(text(left - 4, y + 3, f"{rate:,.0f}", "end", ' opacity="0.7"'))
    body.append(text(left + pw / 2, height - 4, data["x_label"], "middle"))
    if cap is not None and cap["bytes"] <= top:
        x, _ = at(cap["bytes"], 0)
        body.append(
            f'<rect x="{x:.1f}" y="{up}" width="{left + pw - x:.1f}" height="{ph}" '
            f'fill="{theme_colors("light")["wait"]}" fill-opacity="0.10"/>'
            f'<line x1="{x:.1f}" y1="{up}" x2="{x:.1f}" y2="{up + ph}" stroke="currentColor" '
            'stroke-width="1.5"/>'
        )
        room = x - left > 6 * len(cap["label"])  # about 6 px a character
        body.append(
            text(
                x + (-4 if room else 4),
                up + ph - 6,
                cap["label"],
                "end" if room else "start",
                ' font-weight="600"',
            )
        )
    elif cap is not None:
        body.append(text(left + pw - 4, up + ph - 6, f"{cap['label']} →", "end"))
    line = " ".join("{:.1f},{:.1f}".format(*at(p["x"][k], p["y"][k])) for k in data["frontier"])
    body.append(
        f'<polyline points="{line}" fill="none" stroke="currentColor" stroke-opacity="0.6"/>'
    )
    k: int | None  # a point's position; the best's and the user's may be None
    for k in range(len(p["index"])):
        x, y = at(p["x"][k], p["y"][k])
        color = data["groups"][p["group"][k]]["color"]
        fill = color if p["fits"][k] else "none"
        body.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{fill}" stroke="{color}" '
            'stroke-width="1.3"><title>'
            + escape(" | ".join(p["hover"][k][:4]))
            + "</title></circle>"
        )
    marks: tuple[tuple[Literal["best", "user"], str], ...]
    marks = (("user", "◆ as given"), ("best", "★ best"))
    for key, mark in marks:
        k = data[key]
        if k is not None:
            x, y = at(p["x"][k], p["y"][k])
            body.append(text(x, y - 7, mark, "middle", ' font-weight="600"'))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(data["title"])}" '
        'style="overflow:visible;color:inherit">' + "".join(body) + "</svg>"
    )
