"""Small static SVG figures for the notebook cards (:mod:`fsdpviz.views.card`).

Plain SVG strings: no JavaScript, no network, readable without a kernel (a saved
notebook, GitHub). Text and axes use ``currentColor`` so they follow the light or
dark theme of the page; units keep their colours from :func:`unit_colors`.

Example::

    svg = unit_bytes_svg(report)        # bars of bytes per rank, one per unit
    svg = memory_curve_svg(report.memory)
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from fsdpviz.schema.events import Event
from fsdpviz.schema.memory import MemoryReport
from fsdpviz.schema.report import Report
from fsdpviz.views.style import (
    MEMORY_CURVE_COLOR,
    UNMANAGED_COLOR,
    format_bytes,
    theme_colors,
    unit_colors,
)

__all__ = ["event_strips_svg", "memory_curve_svg", "unit_bytes_svg"]

WIDTH = 340
HEIGHT = 110
MAX_BARS = 400
MAX_STRIP_EVENTS = 240
DIVERGE_COLOR = theme_colors("light")["accent"]
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 8, 8, 18, 18
_FONT = 'font-family="system-ui, sans-serif" font-size="10"'
_KIND_HEIGHT = {
    "all_gather": 1.0, "free": 0.35, "reduce_scatter": 0.7, "all_reduce": 0.7,
    "h2d": 0.5, "d2h": 0.5, "cast": 0.5,
    "tp_all_gather": 0.5, "tp_reduce_scatter": 0.5, "tp_all_reduce": 0.5, "tp_all_to_all": 0.5,
    "cp_all_gather": 0.5, "cp_all_to_all": 0.5,
}  # fmt: skip


def _num(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0")


def _svg(body: list[str], label: str, height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(label)}" '
        'style="overflow:visible;color:inherit">' + "".join(body) + "</svg>"
    )


def _text(x: float, y: float, text: str, anchor: str = "start", opacity: float = 0.75) -> str:
    return (
        f'<text x="{_num(x)}" y="{_num(y)}" text-anchor="{anchor}" fill="currentColor" '
        f'fill-opacity="{opacity}" {_FONT}>{escape(text)}</text>'
    )


def _axis(y: float) -> str:
    return (
        f'<line x1="{_PAD_LEFT}" y1="{_num(y)}" x2="{WIDTH - _PAD_RIGHT}" y2="{_num(y)}" '
        'stroke="currentColor" stroke-opacity="0.35" stroke-width="1"/>'
    )


def unit_bytes_svg(report: Report) -> str:
    """Bars of bytes per rank, one per unit in handle order, in the units' colours."""
    colors = unit_colors(report)
    units = report.units[:MAX_BARS]
    top = max((u.sharded_bytes for u in units), default=0)
    plot_w = WIDTH - _PAD_LEFT - _PAD_RIGHT
    plot_h = HEIGHT - _PAD_TOP - _PAD_BOTTOM
    base = HEIGHT - _PAD_BOTTOM
    step = plot_w / max(len(units), 1)
    bar = min(step * 0.8 if len(units) < 60 else step, 28.0)
    body = [_text(_PAD_LEFT, 11, f"bytes per rank by unit (max {format_bytes(top)})")]
    for i, u in enumerate(units):
        h = plot_h * u.sharded_bytes / top if top else 0.0
        name = u.module or "(root)"
        body.append(
            f'<rect x="{_num(_PAD_LEFT + i * step + (step - bar) / 2)}" y="{_num(base - h)}" '
            f'width="{_num(max(bar, 0.5))}" height="{_num(h)}" fill="{colors[u.module]}">'
            f"<title>{escape(name)}: {format_bytes(u.sharded_bytes)} per rank</title></rect>"
        )
    body.append(_axis(base))
    more = f", first {MAX_BARS} of {len(report.units)}" if len(report.units) > MAX_BARS else ""
    body.append(_text(_PAD_LEFT, HEIGHT - 4, f"units in handle order{more}"))
    return _svg(body, "bytes per rank of each wrap unit")


def memory_curve_svg(memory: MemoryReport) -> str:
    """Memory per rank through the iteration (compute peaks included), the peak marked."""
    records = memory.events
    n = len(records)
    # Two points per event: the most reached in the compute before it, then the total after it.
    ys: list[float] = []
    for r in records:
        ys.extend((float(r.peak_before), float(r.total)))
    peak = float(memory.peak["bytes"])
    top = max([peak, *ys]) if ys else peak
    plot_w = WIDTH - _PAD_LEFT - _PAD_RIGHT
    plot_h = HEIGHT - _PAD_TOP - _PAD_BOTTOM
    base = HEIGHT - _PAD_BOTTOM

    def x_at(i: float) -> float:
        return _PAD_LEFT + plot_w * i / max(n, 1)

    def y_at(v: float) -> float:
        return base - (plot_h * v / top if top else 0.0)

    body = [_text(_PAD_LEFT, 11, f"memory per rank (peak {format_bytes(peak)})")]
    backward = next((i for i, r in enumerate(records) if r.phase == "backward"), None)
    if backward is not None:
        bx = x_at(backward)
        body.append(
            f'<line x1="{_num(bx)}" y1="{_PAD_TOP}" x2="{_num(bx)}" y2="{_num(base)}" '
            'stroke="currentColor" stroke-opacity="0.35" stroke-dasharray="3 3"/>'
        )
        body.append(_text(bx + 3, base - 3, "backward"))
    points = " ".join(f"{_num(x_at(k / 2))},{_num(y_at(v))}" for k, v in enumerate(ys))
    if points:
        body.append(
            f'<polyline points="{points}" fill="none" stroke="{MEMORY_CURVE_COLOR}" '
            'stroke-width="1.75" stroke-linejoin="round"/>'
        )
    at = int(memory.peak.get("event", 0))
    during = at < n and float(records[at].peak_before) == peak
    px, py = x_at(at if during else at + 0.5), y_at(peak)
    where = escape(str(memory.peak.get("where", "")))
    body.append(
        f'<circle cx="{_num(px)}" cy="{_num(py)}" r="3.5" fill="{DIVERGE_COLOR}">'
        f"<title>peak {format_bytes(peak)} {where}</title></circle>"
    )
    body.append(_axis(base))
    body.append(_text(_PAD_LEFT, HEIGHT - 4, f"{n} events of the iteration"))
    return _svg(body, "memory per rank through one iteration, peak marked")


def event_strips_svg(
    ranks: Sequence[Report],
    iteration: int,
    diverge_at: int | None = None,
) -> str:
    """One row per rank: the events of ``iteration`` as ticks in their units' colours.

    All-gathers are full height, reduce-scatters shorter, frees short; where the
    ranks diverge (``diverge_at``, an event index) a vermillion line is drawn.
    Long iterations show a window of events around the divergence.
    """
    colors = unit_colors(ranks[0]) if ranks else {}
    lengths = [len(r.iterations[iteration]) if iteration < len(r.iterations) else 0 for r in ranks]
    longest = max(lengths, default=0)
    start = 0
    if longest > MAX_STRIP_EVENTS and diverge_at is not None:
        start = max(0, min(diverge_at - MAX_STRIP_EVENTS // 2, longest - MAX_STRIP_EVENTS))
    stop = min(longest, start + MAX_STRIP_EVENTS)
    row_h, gap, label_w = 14, 4, 46
    height = _PAD_TOP + len(ranks) * (row_h + gap) + _PAD_BOTTOM
    plot_w = WIDTH - label_w - _PAD_RIGHT
    step = plot_w / max(stop - start, 1)
    body = [_text(_PAD_LEFT, 11, f"events of iteration {iteration} per rank")]
    for k, report in enumerate(ranks):
        top = _PAD_TOP + k * (row_h + gap)
        rank = k if report.config.rank is None else report.config.rank
        body.append(_text(_PAD_LEFT, top + row_h - 3, f"rank {rank}"))
        events: list[Event] = (
            report.iterations[iteration][start:stop] if iteration < len(report.iterations) else []
        )
        for i, e in enumerate(events):
            h = row_h * _KIND_HEIGHT.get(e.kind, 0.5)
            body.append(
                f'<rect x="{_num(label_w + i * step)}" y="{_num(top + row_h - h)}" '
                f'width="{_num(max(step * 0.85, 0.5))}" height="{_num(h)}" '
                f'fill="{colors.get(e.unit, UNMANAGED_COLOR)}">'
                f"<title>{start + i}: {escape(e.describe())}</title></rect>"
            )
    if diverge_at is not None and start <= diverge_at <= stop:
        dx = label_w + (diverge_at - start) * step - 1
        bottom = height - _PAD_BOTTOM
        body.append(
            f'<line x1="{_num(dx)}" y1="{_PAD_TOP - 2}" x2="{_num(dx)}" y2="{_num(bottom)}" '
            f'stroke="{DIVERGE_COLOR}" stroke-width="2"/>'
        )
        anchor = "start" if dx < WIDTH / 2 else "end"
        body.append(_text(dx, height - 4, f"ranks diverge at event {diverge_at}", anchor, 1))
    else:
        window = f"events {start}-{stop - 1} of {longest}" if longest else "no events"
        body.append(_text(_PAD_LEFT, height - 4, window))
    return _svg(body, "events per rank in unit colours", height)
