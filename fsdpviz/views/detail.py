"""The explorer's detail panel as HTML: one unit's parameters, traced shapes and where its bytes go.

Pure functions of a report (no widgets), so they are tested like the figures.

Example::

    html = unit_detail_html(report, "layers.0")
    rows = bytes_breakdown(report, module_tree(report), "layers.0")
"""

from __future__ import annotations

from html import escape
from typing import Any

from fsdpviz.schema.report import Report, Unit, unit_label
from fsdpviz.views.style import format_bytes, unit_colors
from fsdpviz.views.tree import ModuleTree, module_tree

__all__ = ["bytes_breakdown", "param_rows", "unit_detail_html"]

_MAX_ROWS = 200
_TABLE = (
    '<table style="border-collapse:collapse;font-size:12px;margin:4px 0 10px 0;'
    'font-family:var(--jp-code-font-family,ui-monospace,monospace)">'
)
_CELL = "padding:1px 8px;border-bottom:1px solid var(--jp-border-color2,#e0e0e0);text-align:{}"


def _table(header: list[str], rows: list[list[Any]], numeric: set[int]) -> str:
    def cell(i: int, v: Any, tag: str = "td") -> str:
        align = "right" if i in numeric else "left"
        return f'<{tag} style="{_CELL.format(align)}">{escape(str(v))}</{tag}>'

    head = "".join(cell(i, h, "th") for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell(i, v) for i, v in enumerate(row)) + "</tr>"
        for row in rows[:_MAX_ROWS]
    )
    more = (
        f'<tr><td colspan="{len(header)}">... {len(rows) - _MAX_ROWS} more</td></tr>'
        if len(rows) > _MAX_ROWS
        else ""
    )
    return f"{_TABLE}<tr>{head}</tr>{body}{more}</table>"


def param_rows(report: Report, unit: str) -> list[list[Any]]:
    """``[fqn, shape, numel, bytes, first used by]`` per parameter of ``unit``'s FlatParameter;
    under tensor parallelism also ``[tp placement, shard per rank]`` (a tp-sharded
    parameter's placement, ``Replicate()`` or ``-``, and its shape on one rank)."""
    u = report.unit(unit)
    shapes: dict[str, list[int]] = {}
    for m in report.modules:
        prefix = f"{m.fqn}." if m.fqn else ""
        for name, dims in m.params.items():
            shapes[prefix + name] = dims
    rows = []
    for fqn in u.params:
        shape: list[int] | None = shapes.get(fqn)
        numel = 1
        for s in shape or []:
            numel *= s
        rows.append(
            [
                fqn,
                "?" if shape is None else "×".join(map(str, shape)) or "scalar",
                f"{numel:,}" if shape is not None else "?",
                format_bytes(numel * u.itemsize) if shape is not None else "?",
                report.param_first_use.get(fqn, "-"),
                *_tp_cells(u, fqn),
            ]
        )
    return rows


def _tp_cells(u: Unit, fqn: str) -> list[str]:
    if not u.shard_shapes:
        return []
    placement = u.tp_placements.get(fqn, "-")
    mark = f"⊞ tp {placement}" if placement.startswith("Shard") else placement
    shard = u.shard_shapes.get(fqn)
    return [mark, "?" if shard is None else "×".join(map(str, shard)) or "scalar"]


def bytes_breakdown(report: Report, tree: ModuleTree, unit: str) -> list[list[Any]]:
    """Where ``unit``'s bytes go: ``[part, parameters, bytes full, bytes per rank, share]``.

    One row per top-level module of the unit (the unit root's own parameters first),
    then alignment and world-size padding, then the total FlatParameter.
    """
    u = report.unit(unit)
    parts: dict[str, list[int]] = {}
    root = tree.by_fqn.get(unit)
    for node in tree.nodes:
        if node.unit != unit or node.numel == 0:
            continue
        key = node.fqn
        if root is not None and node.fqn != unit:
            rel = node.fqn[len(unit) + 1 :] if unit else node.fqn
            key = f"{unit}.{rel.split('.', 1)[0]}" if unit else rel.split(".", 1)[0]
        acc = parts.setdefault(key, [0, 0, 0])
        acc[0] += node.numel
        acc[1] += node.bytes
        acc[2] += node.rank_bytes
    total = max(u.padded_numel * u.itemsize, 1)
    rows: list[list[Any]] = []
    for key, (numel, full, rank) in sorted(parts.items(), key=lambda kv: -kv[1][1]):
        rows.append(
            [
                key or "(root)",
                f"{numel:,}",
                format_bytes(full),
                format_bytes(rank),
                f"{100 * full / total:.1f}%",
            ]
        )
    align = (u.flat_numel - u.numel) * u.itemsize
    pad = (u.padded_numel - u.flat_numel) * u.itemsize
    if align:
        rows.append(
            [
                "alignment padding (use_orig_params)",
                "",
                format_bytes(align),
                "",
                f"{100 * align / total:.1f}%",
            ]
        )
    if pad:
        rows.append(
            [
                "padding to a multiple of the shard size",
                "",
                format_bytes(pad),
                "",
                f"{100 * pad / total:.1f}%",
            ]
        )
    rows.append(
        [
            "FlatParameter",
            f"{u.padded_numel:,}",
            format_bytes(u.padded_numel * u.itemsize),
            format_bytes(u.sharded_bytes),
            "100%",
        ]
    )
    return rows


def _events_line(report: Report, unit: str) -> str:
    it = report.iterations[-1] if report.iterations else []
    words = []
    for pos, e in enumerate(it):
        if e.unit != unit:
            continue
        w = e.kind + (" (prefetch)" if e.prefetch else "")
        if e.hook is not None:
            w += f" by {e.hook} of {unit_label(e.hook_unit)}"
        words.append(f"{pos}: {w}")
    return "; ".join(words) or "no events"


def unit_detail_html(
    report: Report, unit: str | None, module: str | None = None, tree: ModuleTree | None = None
) -> str:
    """The detail panel for ``unit`` (and the clicked ``module``, when given)."""
    if unit is None:
        if module is not None:
            return f"<p>Module <code>{escape(module)}</code> holds no parameters FSDP manages.</p>"
        return "<p>Click a module or pick a unit to see its parameters, shapes and bytes.</p>"
    tree = tree or module_tree(report)
    u = report.unit(unit)
    index = next(i for i, x in enumerate(report.units) if x.module == unit)
    color = unit_colors(report)[unit]
    parts = [
        f'<div style="font-size:13px"><span style="display:inline-block;width:12px;height:12px;'
        f'background:{color};margin-right:6px;border:1px solid #0004"></span>'
        f"<b>unit {index} of {len(report.units)}: {escape(unit_label(unit))}</b> "
        f"({escape(u.module_class)})"
        f" · {escape(u.sharding_strategy)} · {u.numel:,} parameters in {len(u.params)} tensors · "
        f"{escape(str(u.dtype))}"
        + (
            f" (compute {escape(str(u.compute_dtype))})"
            if u.compute_dtype not in (None, u.dtype)
            else ""
        )
        + f" · {format_bytes(u.bytes)} full, {format_bytes(u.sharded_bytes)} per rank</div>"
    ]
    if module is not None and module in tree.by_fqn and module != unit:
        picked = tree.by_fqn[module]
        parts.append(
            f"<p>Selected module <code>{escape(module)}</code> ({escape(picked.module_class)}): "
            f"{picked.numel_total:,} parameters, {format_bytes(picked.bytes_total)} full, "
            f"{format_bytes(picked.rank_bytes_total)} per rank.</p>"
        )
    for w in report.warnings:
        if unit in w.units:
            parts.append(
                f'<p style="color:var(--jp-warn-color0,#b35900)">warning [{escape(w.code)}]: '
                f"{escape(w.message.splitlines()[0])}</p>"
            )
    parts.append("<b>Where its bytes go</b>")
    parts.append(
        _table(
            ["part", "parameters", "full", "per rank", "share"],
            bytes_breakdown(report, tree, unit),
            {1, 2, 3, 4},
        )
    )
    parts.append("<b>Parameters</b> (flattening order)")
    tp = ["tensor parallel", "shard per rank"] if u.shard_shapes else []
    parts.append(
        _table(
            ["parameter", "shape", "numel", "bytes", "first used by", *tp],
            param_rows(report, unit),
            {2, 3},
        )
    )
    if u.tp_placements:
        sharded = sum(1 for p in u.tp_placements.values() if p.startswith("Shard"))
        parts.append(
            f"<p>⊞ {sharded} of {len(u.params)} parameters are sharded by tensor parallelism "
            "(DTensor placement on the tp dimension); FSDP shards each rank's piece on dim 0. "
            "Shapes above are the whole parameter; “shard per rank” is what one rank holds.</p>"
        )
    if u.shared_params:
        shared = ", ".join(f"{escape(a)} = {escape(b)}" for a, b in u.shared_params.items())
        parts.append(f"<p>Shared parameters: {shared}</p>")
    shape_rows = []
    for m in report.modules:
        node = tree.by_fqn.get(m.fqn)
        if node is None or node.unit != unit or (m.calls == 0 and not m.params):
            continue
        shape_rows.append(
            [
                m.fqn or "(root)",
                m.module_class,
                m.calls,
                "; ".join(map(str, m.input_shapes)) or "-",
                "; ".join(map(str, m.output_shapes)) or "-",
            ]
        )
    parts.append("<b>Shapes seen in the trace</b>")
    parts.append(_table(["module", "class", "calls", "inputs", "outputs"], shape_rows, {2}))
    parts.append(
        f"<b>Events (steady state)</b><p style='font-size:12px'>"
        f"{escape(_events_line(report, unit))}</p>"
    )
    return "".join(parts)
