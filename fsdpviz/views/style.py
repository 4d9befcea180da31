"""Colours and themes shared by every view: the plotly figures, the cards and the front end.

Units are coloured from a palette of 20 colours (Tableau's 20, its two greys
replaced by cyans so that no unit looks unmanaged), ordered so that neighbouring
units differ in hue and in lightness and no colour comes back within 20 units.
Every view also prints the unit's number (its index in ``report.units``) on it,
so units stay identifiable beyond colour.

Example::

    colors = unit_colors(report)      # {"": "#4E79A7", "layers.0": "#FFBE7D", ...}
    fig.update_layout(template=template("dark"))
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Literal, TypedDict, cast

import plotly.graph_objects as go

from fsdpviz.schema.memory import size_text
from fsdpviz.schema.report import Report

__all__ = [
    "CATEGORY_COLORS",
    "EDGE_COLORS",
    "MEMORY_CURVE_COLOR",
    "PALETTE",
    "TABLE",
    "UNMANAGED_COLOR",
    "Theme",
    "format_bytes",
    "template",
    "text_on",
    "theme_colors",
    "three_digits",
    "unit_colors",
]

Theme = Literal["light", "dark"]


class EdgeStyle(TypedDict):
    """How the prefetch graph draws an edge kind: its ``color`` and plotly ``dash``."""

    color: str
    dash: str


class ColorTable(TypedDict):
    """``fsdpviz/views/colors.json``: a note (``about``), the units' ``palette_dark`` and
    ``palette_light``, the ``unmanaged`` modules' and the ``memory_curve``'s colours, the
    memory ``categories``' colours, the prefetch graph's ``edges`` by kind and the
    ``themes`` (name -> colour name -> colour, see :func:`theme_colors`)."""

    about: str
    palette_dark: list[str]
    palette_light: list[str]
    unmanaged: str
    memory_curve: str
    categories: dict[str, str]
    edges: dict[str, EdgeStyle]
    themes: dict[str, dict[str, str]]


TABLE: ColorTable = cast(
    "ColorTable",
    json.loads(
        resources.files("fsdpviz.views").joinpath("colors.json").read_text(encoding="utf-8")
    ),
)
"""The colour table (``fsdpviz/views/colors.json``): the front end in ``js/`` bundles the
same file, so the plotly figures, the cards and the canvases draw the same colours."""

_DARK: tuple[str, ...] = tuple(TABLE["palette_dark"])
_LIGHT: tuple[str, ...] = tuple(TABLE["palette_light"])
# Dark and light alternate; the hue steps by 3 of 10 (darks) and starts half-way round
# (lights), so units k and k + 1 never share a hue and all 20 colours differ.
PALETTE: tuple[str, ...] = tuple(
    _DARK[(k // 2 * 3) % 10] if k % 2 == 0 else _LIGHT[(k // 2 * 3 + 5) % 10] for k in range(20)
)
UNMANAGED_COLOR: str = TABLE["unmanaged"]
MEMORY_CURVE_COLOR: str = TABLE["memory_curve"]
# The memory lane's categories (fsdpviz.cost.CATEGORIES), stacked bottom to top: parameters
# blue, gradients green, optimizer purple, activations orange, temporaries and buffers grey.
CATEGORY_COLORS: dict[str, str] = dict(TABLE["categories"])
# Edge kinds of the prefetch graph: colour and dash, so they differ without colour too.
EDGE_COLORS: dict[str, tuple[str, str]] = {
    kind: (edge["color"], edge["dash"]) for kind, edge in TABLE["edges"].items()
}
_THEMES: dict[str, dict[str, str]] = TABLE["themes"]


def theme_colors(theme: Theme) -> dict[str, str]:
    """The colours of ``theme``: background (``bg``), text (``fg``), ``muted`` text, ``grid``,
    ``accent`` (the selection and the memory peak), ``wait`` and ``wait_fill`` (compute
    waiting for communication), ``call`` (hook calls), ``panel``, ``border``, ``warn``,
    ``warn_bg``, ``highlight`` (a row picked out) and ``focus``."""
    if theme not in _THEMES:
        raise ValueError(f"unknown theme {theme!r}; use 'light' or 'dark'")
    return dict(_THEMES[theme])


def template(theme: Theme) -> go.layout.Template:
    """A small plotly template for ``theme`` (JupyterLab's light or dark background).

    Kept minimal on purpose: plotly's bundled templates add ~10 kB to every figure's JSON.
    """
    c = theme_colors(theme)
    axis: dict[str, str] = {
        "gridcolor": c["grid"],
        "zerolinecolor": c["grid"],
        "linecolor": c["grid"],
        "color": c["muted"],
    }
    return go.layout.Template(
        layout={
            "paper_bgcolor": c["bg"],
            "plot_bgcolor": c["bg"],
            "font": {"color": c["fg"], "family": "system-ui, sans-serif", "size": 12},
            "hoverlabel": {"font": {"family": "ui-monospace, monospace", "size": 11}},
            "xaxis": axis,
            "yaxis": axis,
            "legend": {"bgcolor": "rgba(0,0,0,0)"},
        }
    )


def text_on(color: str) -> str:
    """Black or white, whichever reads better on ``color`` (``#rrggbb``): the rule the front
    end's ``textOn`` applies, so a label reads the same on a canvas and in a figure."""
    n = int(color.lstrip("#")[:6], 16)
    lum = (0.299 * ((n >> 16) & 255) + 0.587 * ((n >> 8) & 255) + 0.114 * (n & 255)) / 255
    return "#000000" if lum > 0.55 else "#ffffff"


def unit_colors(report: Report) -> dict[str, str]:
    """Unit module FQN -> colour, cycling :data:`PALETTE` (20 colours) in handle order."""
    return {u.module: PALETTE[i % len(PALETTE)] for i, u in enumerate(report.units)}


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``; binary units, three significant digits
    (:func:`fsdpviz.schema.memory.size_text`, the one format of bytes)."""
    return size_text(n)


def three_digits(value: float) -> str:
    """Three significant digits, never in exponent form: ``999.7`` -> ``'1000'``, not ``1e+03``."""
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e" in text else text
