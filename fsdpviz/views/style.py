"""Colours and themes shared by every view (plotly figures and the JS timeline).

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

from typing import Any, Literal

import plotly.graph_objects as go

from fsdpviz.schema.report import Report

__all__ = [
    "CATEGORY_COLORS",
    "EDGE_COLORS",
    "PALETTE",
    "UNMANAGED_COLOR",
    "Theme",
    "format_bytes",
    "template",
    "theme_colors",
    "three_digits",
    "unit_colors",
]

Theme = Literal["light", "dark"]

_DARK = ("#4E79A7", "#F28E2B", "#59A14F", "#E15759", "#B07AA1",
         "#9D7660", "#D37295", "#B6992D", "#499894", "#17BECF")  # fmt: skip
_LIGHT = ("#A0CBE8", "#FFBE7D", "#8CD17D", "#FF9D9A", "#D4A6C8",
          "#D7B5A6", "#FABFD2", "#F1CE63", "#86BCB6", "#9EDAE5")  # fmt: skip
# Dark and light alternate; the hue steps by 3 of 10 (darks) and starts half-way round
# (lights), so units k and k + 1 never share a hue and all 20 colours differ.
PALETTE: tuple[str, ...] = tuple(
    _DARK[(k // 2 * 3) % 10] if k % 2 == 0 else _LIGHT[(k // 2 * 3 + 5) % 10] for k in range(20)
)
UNMANAGED_COLOR = "#999999"
# The memory lane's categories (fsdpviz.cost.CATEGORIES), stacked bottom to top: parameters
# blue, gradients green, optimizer purple, activations orange, temporaries and buffers grey.
CATEGORY_COLORS: dict[str, str] = {
    "sharded_params": "#1F5F99",
    "unsharded_params": "#6BAED6",
    "all_gather": "#9ECAE1",
    "unsharded_grads": "#31A354",
    "reduce_scatter": "#A1D99B",
    "sharded_grads": "#006D2C",
    "activations": "#E6550D",
    "forward_temp": "#FDAE6B",
    "backward_temp": "#FDD0A2",
    "optimizer": "#756BB1",
    "inputs": "#969696",
    "buffers": "#BDBDBD",
    "memory": "#888888",
}
# Edge kinds of the prefetch graph: colour and dash, so they differ without colour too.
EDGE_COLORS: dict[str, tuple[str, str]] = {
    "forward_order": ("#888888", "solid"),
    "forward_prefetch": ("#0072B2", "dash"),
    "backward_prefetch": ("#009E73", "dot"),
    "misordered": ("#D55E00", "solid"),
    "missed": ("#D55E00", "dashdot"),
}

_THEMES: dict[str, dict[str, str]] = {
    "light": {"bg": "#ffffff", "fg": "#1f1f1f", "muted": "#616161", "grid": "#e0e0e0"},
    "dark": {"bg": "#111111", "fg": "#e0e0e0", "muted": "#9e9e9e", "grid": "#333333"},
}


def theme_colors(theme: Theme) -> dict[str, str]:
    """Background, foreground, muted text and grid colours of ``theme``."""
    if theme not in _THEMES:
        raise ValueError(f"unknown theme {theme!r}; use 'light' or 'dark'")
    return dict(_THEMES[theme])


def template(theme: Theme) -> go.layout.Template:
    """A small plotly template for ``theme`` (JupyterLab's light or dark background).

    Kept minimal on purpose: plotly's bundled templates add ~10 kB to every figure's JSON.
    """
    c = theme_colors(theme)
    axis: dict[str, Any] = {
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


def unit_colors(report: Report) -> dict[str, str]:
    """Unit module FQN -> colour, cycling :data:`PALETTE` (20 colours) in handle order."""
    return {u.module: PALETTE[i % len(PALETTE)] for i, u in enumerate(report.units)}


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``; binary units, three significant digits."""
    value = float(n)
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or suffix == "TiB":
            return f"{value:.0f} {suffix}" if suffix == "B" else f"{three_digits(value)} {suffix}"
        value /= 1024
    raise AssertionError("unreachable")


def three_digits(value: float) -> str:
    """Three significant digits, never in exponent form: ``999.7`` -> ``'1000'``, not ``1e+03``."""
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e" in text else text
