"""The wrap-unit explorer figure: the module tree as an icicle or treemap.

Each wrap unit has its own colour (:func:`fsdpviz.views.unit_colors`); a module
takes the colour of the unit that manages its parameters. Unit roots are
labelled ``name [unit k]`` so that units stay identifiable where colours repeat;
the model itself reads ``(root)``. Labels are drawn at one readable size or not
at all (a block too small for its label shows it on hover). Hover shows the
module, its class and unit, parameters, bytes in full and per rank, dtype and
the FSDP warnings that name its unit. A click zooms into a module; the path bar
above the blocks leads back up. The figure takes the width it is given.

Example::

    fig = explorer_figure(report, kind="treemap", size="rank_bytes")
    fig.show()
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np
import plotly.graph_objects as go

from fsdpviz.schema.report import Report, unit_label
from fsdpviz.views.detail import UnitDetail, dtype_text, unit_details
from fsdpviz.views.style import (
    UNMANAGED_COLOR,
    Theme,
    format_bytes,
    template,
    theme_colors,
    unit_colors,
)
from fsdpviz.views.tree import ModuleTree, TreeNode, TreeView, module_tree, node_id, tree_view

__all__ = [
    "ExplorerKind",
    "ExplorerSize",
    "explorer_data",
    "explorer_details",
    "explorer_figure",
    "highlight_lines",
    "module_label",
]

ExplorerKind = Literal["icicle", "treemap"]
ExplorerSize = Literal["numel", "rank_bytes"]

VALIDATE_BELOW = 2000
LABEL_PX = 11
"""Size of every label in the figure; a label that does not fit its block at this size is
hidden (plotly's ``uniformtext``), never drawn smaller."""
OUTLINE_PX = 1.5
_HOVER = (
    "<b>%{customdata[7]}</b> (%{customdata[0]})<br>"
    "unit: %{customdata[1]}<br>"
    "parameters: %{customdata[2]}<br>"
    "bytes: %{customdata[3]} full, %{customdata[4]} per rank<br>"
    "dtype: %{customdata[5]}"
    "%{customdata[6]}<extra></extra>"
)


class ModuleColumns(TypedDict):
    """:func:`explorer_data`'s ``modules``: one list per key, one entry per module in tree
    order."""

    name: list[str]
    label: list[str]
    parent: list[int]
    cls: list[int]
    unit: list[int]
    numel: list[int]
    bytes: list[int]
    rank_bytes: list[int]


class ExplorerUnit(TypedDict):
    """A unit as the explorer shows it: ``name``, ``color``, ``dtype``, the ``warnings``
    (codes) that name it; under pipeline parallelism its ``stage`` and ``pp_rank``."""

    name: str
    color: str
    dtype: str
    warnings: list[str]
    stage: NotRequired[int]
    pp_rank: NotRequired[int]


class ExplorerData(TypedDict):
    """What :func:`explorer_data` returns (see it for each key)."""

    title: str
    modules: ModuleColumns
    classes: list[str]
    units: list[ExplorerUnit]
    unmanaged_color: str
    details: NotRequired[list[UnitDetail | None]]  # (the explorer widget sends them apart)


def explorer_figure(
    report: Report,
    *,
    kind: ExplorerKind = "icicle",
    size: ExplorerSize = "numel",
    theme: Theme = "light",
    highlight_unit: str | None = None,
    tree: ModuleTree | None = None,
    focus: str = "",
    width: int | None = None,
) -> go.Figure:
    """The module tree of ``report`` as a plotly icicle (default) or treemap.

    ``size`` picks the area: ``"numel"`` (parameters) or ``"rank_bytes"`` (bytes one
    rank holds). Modules with no parameters in their subtree have no area. The
    trace's ``ids`` are module FQNs (``<root>`` for the root; its text reads
    ``(root)``). ``highlight_unit`` outlines that unit's modules (see
    :func:`highlight_lines`); ``tree`` reuses a
    :func:`module_tree`. A model of more than :data:`~fsdpviz.views.tree.EXPLORER_BUDGET`
    modules is drawn as deep as that many modules allow, from ``focus`` (a module FQN,
    default the root): modules whose children are not drawn are marked ``▸``. ``width``
    (pixels, an image's): each icicle block's label shortened to fit its block (a unit's
    ``model.layers.0 [unit 1]`` to ``0 [unit 1]``, then ``[unit 1]``), as the page's
    explorer shortens them; without it, a label that does not fit is hidden.
    """
    if kind not in ("icicle", "treemap"):
        raise ValueError(f"unknown explorer kind {kind!r}; use 'icicle' or 'treemap'")
    if size not in ("numel", "rank_bytes"):
        raise ValueError(f"unknown size {size!r}; use 'numel' or 'rank_bytes'")
    tree = tree or module_tree(report)
    view = tree_view(tree, focus)
    colors = unit_colors(report)
    unit_index = {u.module: i for i, u in enumerate(report.units)}
    warn_codes = _warning_codes(report)
    ids, parents, labels, marker_colors, custom = [], [], [], [], []
    values = np.empty(len(view.indices), dtype=np.int64)
    for i, node in enumerate(tree.nodes[k] for k in view.indices):
        ids.append(node_id(node.fqn))
        top = node.fqn == view.focus
        parents.append(node_id(node.parent) if node.parent is not None and not top else "")
        label = _block_label(node, unit_index)
        if node.fqn in view.closed:
            label += " ▸"
        labels.append(label)
        marker_colors.append(UNMANAGED_COLOR if node.unit is None else colors[node.unit])
        values[i] = node.numel_total if size == "numel" else node.rank_bytes_total
        unit = tree.units.get(node.unit) if node.unit is not None else None
        dtype = "-" if unit is None else dtype_text(unit)
        codes = warn_codes.get(node.unit, []) if node.unit is not None else []
        note = f"<br>warnings: {', '.join(codes)}" if codes else ""
        if node.fqn in view.closed:
            note += f"<br>click to open its {len(node.children)} submodules"
        elif top and view.focus:
            note += "<br>click to go up"
        custom.append(
            [
                node.module_class,
                "not managed by FSDP" if node.unit is None else unit_label(node.unit),
                f"{node.numel_total:,}",
                format_bytes(node.bytes_total),
                format_bytes(node.rank_bytes_total),
                dtype,
                note,
                "(root)" if node.fqn == "" else node.fqn,
            ]
        )
    trace: dict[str, object] = {
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
            # One width for all (plotly.js cannot draw the path bar with per-node widths):
            # the highlighted unit is outlined in the text colour, the others separated by
            # the background's.
            "line": {
                "color": highlight_lines(tree, highlight_unit, view, theme),
                # thinner where hundreds of narrow blocks would turn into separators
                "width": OUTLINE_PX if len(view.indices) <= 300 else OUTLINE_PX / 2,
            },
        },
        "textfont": {"size": LABEL_PX},
        "name": "modules",
        "sort": False,
        "maxdepth": 6,
        # thick enough for its labels at LABEL_PX (uniformtext hides them otherwise)
        "pathbar": {
            "visible": True,
            "side": "top",
            "thickness": 22,
            "textfont": {"size": LABEL_PX},
        },
    }
    if kind == "icicle":
        trace.update(tiling={"orientation": "v"}, leaf={"opacity": 1.0})
        if width is not None:
            shown = [tree.nodes[k].fqn for k in view.indices]
            at = shown.index(view.focus) if view.focus in shown else 0
            scale = (width - 16) / max(int(values[at]), 1)  # (the margins: 8 px each side)
            trace["labels"] = [
                _fitted(t, float(v) * scale - 6) for t, v in zip(labels, values, strict=True)
            ]
    if view.focus or view.closed:  # drawn from its top, whatever a click zoomed to before
        trace["level"] = node_id(view.focus)
    units_word = "unit" if len(report.units) == 1 else "units"
    size_word = "parameters" if size == "numel" else "bytes per rank"
    ws = report.config.world_size
    title = f"Wrap units: {len(report.units)} {units_word}, area = {size_word}, world size {ws}"
    if view.focus:
        title += f"<br><sup>inside {unit_label(view.focus)}: click it to go up</sup>"
    elif view.closed:
        title += f"<br><sup>{len(tree.nodes):,} modules: click a block marked ▸ to open it</sup>"
    layout = {
        "template": template(theme),
        "title": {
            "text": title,
            "font": {"size": 14},
            "yref": "container",
            "y": 1.0,
            "yanchor": "top",
            "pad": {"t": 8},
        },
        # Room above the blocks for the title and for the path bar a zoom draws there.
        "margin": {"l": 8, "r": 8, "t": (84 if "<br>" in title else 68), "b": 8},
        "autosize": True,  # no width: the figure fills its output and follows its resizes
        "height": 540,
        "uniformtext": {"minsize": LABEL_PX, "mode": "hide"},
        "uirevision": f"explorer:{view.focus}" if view.focus else "explorer",  # new focus: unzoomed
    }
    # plotly's per-element validation costs ~1 s at 10,000 modules; small figures
    # (and so the golden tests) are still validated.
    return go.Figure(data=[trace], layout=layout, _validate=len(ids) < VALIDATE_BELOW)


def explorer_data(
    report: Report, *, tree: ModuleTree | None = None, details: bool | Collection[str] = True
) -> ExplorerData:
    """The module tree as the explorer of fsdpviz's page draws it (``js/src/explorer.ts``):
    JSON-ready columns, one entry per module in tree order (parents before children).

    ``modules``: ``name`` (FQN, ``""`` for the root), ``label`` (as :func:`explorer_figure`
    writes it: ``name [unit k]`` for a unit's own module), ``parent`` (index, -1 for the
    root), ``cls`` (index into ``classes``), ``unit`` (index into ``units``, -1 when FSDP
    does not manage it), and the subtree's ``numel``, ``bytes`` and ``rank_bytes``.
    ``units``: per unit its ``name``, ``color``, ``dtype`` and the ``warnings`` (codes)
    that name it (under pipeline parallelism also its ``stage`` and the ``pp_rank`` that
    runs it). ``details``: the detail panel of each unit
    (:func:`fsdpviz.views.detail.unit_detail`; with ``details=`` a set of unit names, only
    theirs, ``None`` for the others; ``details=False``: none). The view draws every module;
    the area is ``numel`` or ``rank_bytes``.

    Example::

        data = explorer_data(report)
        data["modules"]["label"][0]     # '(root) ExampleModel [unit 0]'
    """
    tree = tree or module_tree(report)
    colors = unit_colors(report)
    unit_index = {u.module: i for i, u in enumerate(report.units)}
    warn_codes = _warning_codes(report)
    index = {n.fqn: i for i, n in enumerate(tree.nodes)}
    classes: dict[str, int] = {}
    nodes = tree.nodes
    modules: ModuleColumns = {
        "name": [node.fqn for node in nodes],
        "label": [_block_label(node, unit_index) for node in nodes],
        "parent": [-1 if node.parent is None else index[node.parent] for node in nodes],
        "cls": [classes.setdefault(node.module_class, len(classes)) for node in nodes],
        "unit": [-1 if node.unit is None else unit_index.get(node.unit, -1) for node in nodes],
        "numel": [node.numel_total for node in nodes],
        "bytes": [node.bytes_total for node in nodes],
        "rank_bytes": [node.rank_bytes_total for node in nodes],
    }
    units: list[ExplorerUnit] = []
    pipe = report.pipeline
    for u in report.units:
        stage = pipe.stage_of_unit(u.module) if pipe is not None else None
        entry: ExplorerUnit = {
            "name": u.module,
            "color": colors[u.module],
            "dtype": dtype_text(u),
            "warnings": warn_codes.get(u.module, []),
        }
        if stage is not None:  # pipeline parallelism: the stage holding it, its rank
            entry.update({"stage": stage.index, "pp_rank": stage.rank})
        units.append(entry)
    ws = report.config.world_size
    stages = ""
    if pipe is not None:
        stages = f", {len(pipe.stages)} pipeline stages on {pipe.pp_size} ranks ({pipe.schedule})"
    return {
        "title": f"{len(report.units)} {'unit' if len(report.units) == 1 else 'units'}, "
        f"world size {ws}{stages}",
        "modules": modules,
        "classes": list(classes),
        "units": units,
        "unmanaged_color": UNMANAGED_COLOR,
        "details": explorer_details(report, tree, details),
    }


def explorer_details(
    report: Report, tree: ModuleTree, which: bool | Collection[str] = True
) -> list[UnitDetail | None]:
    """``explorer_data``'s ``details``: the detail panel of each unit in ``which`` (all
    for ``True``, none for ``False``, else the units named), ``None`` for the others."""
    if which is True:
        return list(unit_details(report, tree))
    wanted = set() if which is False else set(which)
    indices = [i for i, u in enumerate(report.units) if u.module in wanted]
    if not indices:
        return [None] * len(report.units)
    some = dict(zip(indices, unit_details(report, tree, indices), strict=True))
    return [some.get(i) for i in range(len(report.units))]


def _block_label(node: TreeNode, unit_index: dict[str, int]) -> str:
    """A module's label: a unit's own module named in full, with its number (which layer
    it is); others by their last FQN part."""
    label = module_label(node.fqn, node.name)
    if node.is_unit_root:
        label = f"{node.fqn or label} [unit {unit_index[node.fqn]}]"
    return label


_CHAR_PX = 0.62 * LABEL_PX  # (about: a label's width per character, in the figure's font)


def _fitted(label: str, room: float) -> str:
    """``label`` as it fits ``room`` pixels: whole; a unit's with the last part of its name
    (``0 [unit 1]``), then ``[unit 1]``, ``unit 1``, ``1``; another cut short with ``…``;
    ``""`` where nothing fits (as the page's explorer fits its labels, ``fitBlockLabel`` in
    js/src/explorer.ts)."""

    def fits(text: str) -> bool:
        return len(text) * _CHAR_PX <= room

    if fits(label):
        return label
    unit = re.match(r"^(.*) \[unit (\d+)\]( ▸)?$", label)
    if unit is not None:
        name, k, more = unit.group(1), unit.group(2), unit.group(3) or ""
        last = name.rsplit(".", 1)[-1]
        for text in (f"{last} [unit {k}]{more}", f"[unit {k}]{more}", f"unit {k}", k):
            if fits(text):
                return text
        return ""
    for n in range(len(label) - 1, 2, -1):
        if fits(label[:n] + "…"):
            return label[:n] + "…"
    return ""


def _warning_codes(report: Report) -> dict[str, list[str]]:
    """The codes of the FSDP warnings that name each unit."""
    codes: dict[str, list[str]] = {}
    for w in report.warnings:
        for name in w.units:
            codes.setdefault(name, []).append(w.code)
    return codes


def _compact(array: np.ndarray) -> np.ndarray | list[Any]:
    """Numpy (sent base64-encoded by plotly) for big figures, plain lists for small ones."""
    return array if len(array) >= VALIDATE_BELOW else array.tolist()


def module_label(fqn: str, name: str) -> str:
    """A module's label in the explorer: its last FQN part; ``(root) ClassName`` for the model."""
    return f"(root) {name}" if fqn == "" else name


def highlight_lines(
    tree: ModuleTree, unit: str | None, view: TreeView | None = None, theme: Theme = "light"
) -> list[str]:
    """Outline colours that make ``unit``'s modules stand out: the theme's text colour for
    them, its background (plain separators) elsewhere; one per module ``view`` draws
    (default: every module).

    Only colours change, so a widget moves the highlight by sending one array.
    """
    c = theme_colors(theme)
    nodes = tree.nodes if view is None else [tree.nodes[k] for k in view.indices]
    return [c["fg"] if unit is not None and n.unit == unit else c["bg"] for n in nodes]
