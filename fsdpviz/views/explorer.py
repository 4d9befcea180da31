"""The wrap-unit explorer figure: the module tree as an icicle or treemap.

Each wrap unit has its own colour (:func:`fsdpviz.views.unit_colors`); a module
takes the colour of the unit that manages its parameters. Unit roots are
labelled ``name [unit k]`` so that units stay identifiable where colours repeat.
Hover shows the module, its class and unit, parameters, bytes in full and per
rank, dtype and the FSDP warnings that name its unit.

Example::

    fig = explorer_figure(report, kind="treemap", size="rank_bytes")
    fig.show()
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import plotly.graph_objects as go

from fsdpviz.core.schema import Report
from fsdpviz.views._style import (
    UNMANAGED_COLOR,
    Theme,
    format_bytes,
    template,
    theme_colors,
    unit_colors,
)
from fsdpviz.views.tree import ModuleTree, module_tree, node_id

__all__ = [
    "ExplorerKind",
    "ExplorerSize",
    "explorer_figure",
    "explorer_parts",
    "highlight_lines",
]

ExplorerKind = Literal["icicle", "treemap"]
ExplorerSize = Literal["numel", "rank_bytes"]

VALIDATE_BELOW = 2000
_HOVER = (
    "<b>%{id}</b> (%{customdata[0]})<br>"
    "unit: %{customdata[1]}<br>"
    "parameters: %{customdata[2]}<br>"
    "bytes: %{customdata[3]} full, %{customdata[4]} per rank<br>"
    "dtype: %{customdata[5]}"
    "%{customdata[6]}<extra></extra>"
)


def explorer_figure(
    report: Report,
    *,
    kind: ExplorerKind = "icicle",
    size: ExplorerSize = "numel",
    theme: Theme = "light",
    highlight_unit: str | None = None,
    tree: ModuleTree | None = None,
) -> go.Figure:
    """The module tree of ``report`` as a plotly icicle (default) or treemap.

    ``size`` picks the area: ``"numel"`` (parameters) or ``"rank_bytes"`` (bytes one
    rank holds). Modules with no parameters in their subtree have no area. The
    trace's ``ids`` are module FQNs (``<root>`` for the root), so a click's point
    index maps back to ``report.modules``. ``highlight_unit`` outlines that unit's
    modules (see :func:`highlight_lines`); ``tree`` reuses a :func:`module_tree`.
    """
    trace, layout = explorer_parts(
        report, kind=kind, size=size, theme=theme, highlight_unit=highlight_unit, tree=tree
    )
    # plotly's per-element validation costs ~1 s at 10,000 modules; small figures
    # (and so the golden tests) are still validated.
    return go.Figure(data=[trace], layout=layout, _validate=len(trace["ids"]) < VALIDATE_BELOW)


def explorer_parts(
    report: Report,
    *,
    kind: ExplorerKind = "icicle",
    size: ExplorerSize = "numel",
    theme: Theme = "light",
    highlight_unit: str | None = None,
    tree: ModuleTree | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trace and the layout of :func:`explorer_figure` as plain dicts, not validated.

    For widgets that redraw on every re-plan: plotly's validation of a 1,000-node
    trace costs more than building it.
    """
    if kind not in ("icicle", "treemap"):
        raise ValueError(f"unknown explorer kind {kind!r}; use 'icicle' or 'treemap'")
    if size not in ("numel", "rank_bytes"):
        raise ValueError(f"unknown size {size!r}; use 'numel' or 'rank_bytes'")
    tree = tree or module_tree(report)
    colors = unit_colors(report)
    unit_index = {u.module: i for i, u in enumerate(report.units)}
    warn_codes: dict[str, list[str]] = {}
    for w in report.warnings:
        for name in w.units:
            warn_codes.setdefault(name, []).append(w.code)
    ids, parents, labels, marker_colors, custom = [], [], [], [], []
    values = np.empty(len(tree.nodes), dtype=np.int64)
    for i, node in enumerate(tree.nodes):
        ids.append(node_id(node.fqn))
        parents.append(node_id(node.parent) if node.parent is not None else "")
        label = node.name
        if node.is_unit_root:
            label = f"{node.fqn or node.name} [unit {unit_index[node.fqn]}]"
        labels.append(label)
        marker_colors.append(UNMANAGED_COLOR if node.unit is None else colors[node.unit])
        values[i] = node.numel_total if size == "numel" else node.rank_bytes_total
        unit = tree.units.get(node.unit) if node.unit is not None else None
        dtype = "-" if unit is None else str(unit.dtype)
        if unit is not None and unit.compute_dtype and unit.compute_dtype != unit.dtype:
            dtype += f" (compute {unit.compute_dtype})"
        codes = warn_codes.get(node.unit, []) if node.unit is not None else []
        custom.append(
            [
                node.module_class,
                "not managed by FSDP" if node.unit is None else repr(node.unit),
                f"{node.numel_total:,}",
                format_bytes(node.bytes_total),
                format_bytes(node.rank_bytes_total),
                dtype,
                f"<br>warnings: {', '.join(codes)}" if codes else "",
            ]
        )
    trace: dict[str, Any] = {
        "type": kind,
        "ids": ids,
        "parents": parents,
        "labels": labels,
        "values": _compact(values),
        "branchvalues": "total",
        "customdata": custom,
        "hovertemplate": _HOVER,
        "marker": {
            "colors": marker_colors,
            "line": {
                "color": theme_colors(theme)["fg"],
                "width": _compact(highlight_lines(tree, highlight_unit)),
            },
        },
        "name": "modules",
        "sort": False,
        "maxdepth": 6,
        # plotly.js draws the path bar with NaN coordinates after a zoom when nodes have
        # their own outline widths (the highlighted unit); clicking the top node zooms out.
        "pathbar": {"visible": False},
    }
    if kind == "icicle":
        trace.update(tiling={"orientation": "v"}, leaf={"opacity": 1.0})
    units_word = "unit" if len(report.units) == 1 else "units"
    size_word = "parameters" if size == "numel" else "bytes per rank"
    ws = report.config.get("world_size")
    layout = {
        "template": template(theme),
        "title": {
            "text": f"Wrap units: {len(report.units)} {units_word}, area = {size_word}, "
            f"world size {ws}",
            "font": {"size": 14},
        },
        "margin": {"l": 8, "r": 8, "t": 40, "b": 8},
        "height": 520,
        "uirevision": "explorer",
    }
    return trace, layout


def _compact(array: np.ndarray) -> np.ndarray | list[Any]:
    """Numpy (sent base64-encoded by plotly) for big figures, plain lists for small ones."""
    return array if len(array) >= VALIDATE_BELOW else array.tolist()


def highlight_lines(tree: ModuleTree, unit: str | None) -> np.ndarray:
    """Outline widths that make ``unit``'s modules stand out (thin separators elsewhere).

    Only widths change, so a widget can move the highlight by sending one numeric array.
    """
    widths = np.full(len(tree.nodes), 0.5)
    if unit is not None:
        for i, node in enumerate(tree.nodes):
            if node.unit == unit:
                widths[i] = 3.0
    return widths
