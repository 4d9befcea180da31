"""Colours and themes shared by every view (plotly figures and the JS timeline).

Units are coloured from the Okabe-Ito palette (readable with the common forms of
colour blindness), cycling by unit index in FSDP's handle order: neighbouring
units always differ, and with hundreds of units the views also print the unit's
name (labels, hover) wherever colour alone would be ambiguous.

Example::

    colors = unit_colors(report)      # {"": "#E69F00", "layers.0": "#56B4E9", ...}
    fig.update_layout(template=template("dark"))
"""

from __future__ import annotations

from typing import Any, Literal

import plotly.graph_objects as go

from fsdpviz.schema.report import Report

__all__ = [
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

# Okabe & Ito (2008), without black (it vanishes on a dark background).
PALETTE: tuple[str, ...] = (
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#009E73",  # bluish green
    "#F0E442",  # yellow
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
)
UNMANAGED_COLOR = "#999999"
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
    """Unit module FQN -> colour, cycling :data:`PALETTE` in handle order."""
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
