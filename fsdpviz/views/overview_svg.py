"""One static SVG of a report's views: the timeline's lanes and the plan's wrap units.

What a notebook output of fsdpviz shows where its interactive views cannot be drawn
(GitHub, nbviewer, ``jupyter nbconvert``, JupyterLab without fsdpviz's extension): made
in Python from the data the views draw (:func:`fsdpviz.views.timeline_data`), without
kaleido or a browser, and small (at most one mark per pixel of a lane, at most
``MAX_BARS`` unit bars), whatever the model's size. Drawn on a light background of its
own, so it reads in a dark page too.

Example::

    svg = overview_svg(timeline_data(report), report, "fsdpviz prediction")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from fsdpviz.schema.report import Report
from fsdpviz.views._svg import HEIGHT as BARS_HEIGHT
from fsdpviz.views._svg import unit_bytes_svg
from fsdpviz.views.style import theme_colors

__all__ = ["overview_svg"]

WIDTH = 760
LABEL_W = 150
LANE_H = 13
LANE_GAP = 3
MAX_GROUPS = 8
_FONT = 'font-family="system-ui, sans-serif" font-size="11"'
_COLORS = theme_colors("light")


def _num(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0")


def _text(x: float, y: float, text: str, *, size: int = 11, muted: bool = False) -> str:
    fill = _COLORS["muted"] if muted else _COLORS["fg"]
    return (
        f'<text x="{_num(x)}" y="{_num(y)}" fill="{fill}" font-family="system-ui, sans-serif" '
        f'font-size="{size}">{escape(text)}</text>'
    )


def _lane_marks(
    spans: Sequence[tuple[float, float, str]], x_at: Any, y: float, height: float
) -> list[str]:
    """Rectangles of the spans (x0, x1, colour), those meeting in one pixel merged."""
    marks: list[list[Any]] = []  # [px0, px1, colour]
    for x0, x1, color in sorted(spans):
        p0, p1 = x_at(x0), max(x_at(x1), x_at(x0) + 0.8)
        if marks and marks[-1][2] == color and p0 <= marks[-1][1] + 0.5:
            marks[-1][1] = max(marks[-1][1], p1)
        elif marks and p1 <= marks[-1][1] and p0 - marks[-1][0] < 1.0:
            continue  # inside the pixel drawn already
        else:
            marks.append([p0, p1, color])
    return [
        f'<rect x="{_num(p0)}" y="{_num(y)}" width="{_num(p1 - p0)}" height="{_num(height)}" '
        f'fill="{color}"/>'
        for p0, p1, color in marks
    ]


def _timeline(data: Mapping[str, Any], top: float) -> tuple[list[str], float]:
    """The lanes of the timeline (compute and the streams) from ``top``; the height used."""
    steps, compute = data["steps"], data["compute"]
    colors: list[str] = data["colors"]
    xs0 = list(steps["x0"]) + list(compute["x0"])
    xs1 = list(steps["x1"]) + list(compute["x1"])
    if not xs0:
        return [_text(LABEL_W, top + 12, "no events", muted=True)], 20.0
    lo, hi = min(xs0), max(xs1)
    span = (hi - lo) or 1.0
    plot_w = WIDTH - LABEL_W - 10

    def x_at(x: float) -> float:
        return float(LABEL_W + plot_w * (x - lo) / span)

    lanes = data["lanes"]
    groups = data["groups"]
    body: list[str] = []
    y = top
    shown = range(min(len(groups), MAX_GROUPS))
    for gi in shown:
        if len(groups) > 1:
            body.append(_text(4, y + 11, str(groups[gi]["name"])))
            y += 16
        for li, lane in enumerate(lanes):
            if lane["group"] != gi or lane["kind"] not in ("compute", "stream"):
                continue
            if lane["kind"] == "compute":
                spans = [
                    (compute["x0"][k], compute["x1"][k], colors[compute["unit"][k]])
                    for k in range(len(compute["x0"]))
                    if compute["group"][k] == gi
                ]
            else:
                spans = [
                    (steps["x0"][k], steps["x1"][k], colors[steps["unit"][k]])
                    for k in range(len(steps["x0"]))
                    if steps["lane"][k] == li
                ]
            body.append(_text(4, y + LANE_H - 2, str(lane["name"]), muted=True))
            body.append(
                f'<rect x="{LABEL_W}" y="{_num(y)}" width="{plot_w}" height="{LANE_H}" '
                f'fill="{_COLORS["panel"]}"/>'
            )
            body += _lane_marks(spans, x_at, y, LANE_H)
            y += LANE_H + LANE_GAP
    if len(groups) > MAX_GROUPS:
        body.append(_text(4, y + 11, f"first {MAX_GROUPS} of {len(groups)} ranks", muted=True))
        y += 16
    clock = str(data.get("clock", ""))
    body.append(_text(LABEL_W, y + 12, f"{data['n_steps']} events; {clock}", size=10, muted=True))
    return body, y + 18 - top


def overview_svg(timeline: Mapping[str, Any] | None, report: Report | None, title: str) -> str:
    """The timeline (``timeline``: :func:`~fsdpviz.views.timeline_data`'s JSON) over the
    plan's bytes per rank of each wrap unit (``report``), under ``title``; either part may
    be ``None``."""
    body = [_text(4, 16, title, size=13)]
    y = 26.0
    if timeline is not None:
        body.append(_text(4, y + 12, "Timeline", size=12))
        part, used = _timeline(timeline, y + 18)
        body += part
        y += 18 + used + 6
    if report is not None and report.units:
        body.append(_text(4, y + 12, "Wrap units", size=12))
        bars = unit_bytes_svg(report).replace(
            "<svg ", f'<svg x="{LABEL_W - 8}" y="{_num(y + 4)}" ', 1
        )
        body.append(f'<g color="{_COLORS["fg"]}">{bars}</g>')
        y += BARS_HEIGHT + 12
    body.append(
        _text(4, y + 10, "Static image: JupyterLab with fsdpviz draws the interactive views.",
              size=10, muted=True)
    )  # fmt: skip
    height = int(y + 18)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}" {_FONT}>'
        f'<rect width="{WIDTH}" height="{height}" fill="{_COLORS["bg"]}"/>'
        + "".join(body)
        + "</svg>"
    )
