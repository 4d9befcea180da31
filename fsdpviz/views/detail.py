"""The explorer's detail panel as data: one unit's parameters, traced shapes and where its
bytes go, in the words of the API that made the plan.

FSDP1 flattens a unit's parameters into one ``FlatParameter`` (padded to a multiple of the
shard size, after ``use_orig_params``' alignment); FSDP2 keeps each parameter a DTensor
sharded on dim 0 (each dim 0 padded to a multiple of the ranks) and all-gathers a group's
parameters together. The front end (``js/src/detail.ts``) draws these sections, in the
notebook and in the exported page alike. Pure functions of a report (no widgets).

Example::

    details = unit_details(report)          # one entry per unit, in report.units order
    details[1]["title"]                      # "unit 1 of 4: 'layers.0' (DecoderLayer)"
    rows = bytes_breakdown(report, module_tree(report), "layers.0")
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.schema.report import ModuleInfo, Report, Unit, param_shapes, unit_label
from fsdpviz.views.style import format_bytes
from fsdpviz.views.tree import ModuleTree, TreeNode, module_tree

__all__ = ["bytes_breakdown", "dtype_text", "param_rows", "unit_details"]

MAX_ROWS = 200
"""Rows of a table the panel lists; the rest are counted (``… 12 more``)."""


class DetailTable(TypedDict):
    """A table of the panel: its ``title``, a ``note``, the ``header``, ``rows`` of text (at
    most :data:`MAX_ROWS`), ``more`` (rows left out) and ``numeric`` (the columns aligned
    right)."""

    title: str
    note: str
    header: list[str]
    rows: list[list[str]]
    more: int
    numeric: list[int]


class DetailText(TypedDict):
    """A section of the panel that is a ``title`` and a paragraph of ``text``."""

    title: str
    text: str


class UnitDetail(TypedDict):
    """The panel of one unit (see :func:`unit_detail`)."""

    title: str
    facts: str
    warnings: list[str]
    sections: list[DetailTable | DetailText]


def dtype_text(unit: Unit) -> str:
    """A unit's dtype as every view writes it (the card, the explorer's hover, the detail
    panel): ``float32``, ``float32 (compute bfloat16)`` under mixed precision, ``no
    parameters`` for a unit without any (a parameterless root), ``unknown`` when a
    recording does not say."""
    if unit.numel == 0 and not unit.params:
        return "no parameters"
    if not unit.dtype:
        return "unknown"
    if unit.compute_dtype and unit.compute_dtype != unit.dtype:
        return f"{unit.dtype} (compute {unit.compute_dtype})"
    return str(unit.dtype)


def _shape(dims: list[int] | None) -> str:
    return "?" if dims is None else "×".join(map(str, dims)) or "scalar"


def _param_shapes(report: Report) -> dict[str, list[int]]:
    """Every parameter's shape, by FQN and by the name its unit lists it under."""
    return param_shapes(report.modules)


def param_rows(
    report: Report, unit: str, shapes: dict[str, list[int]] | None = None
) -> list[list[str]]:
    """``[fqn, shape, numel, bytes, first used by]`` per parameter of ``unit`` (FSDP1: in
    flattening order). Then, where a rank holds a piece of each parameter, ``shard per
    rank`` (FSDP2: dim 0 split over the ranks); under tensor parallelism ``[tp placement,
    shard per rank]`` (a tp-sharded parameter's placement, ``Replicate()`` or ``-``, and
    what one rank holds of it); a unit whose ``shard_placement_fn`` shards parameters on
    another dim ``[FSDP placement, shard per rank]`` (``Shard(dim)``). ``shapes``: every
    parameter's, when known already."""
    u = report.unit(unit)
    shapes = _param_shapes(report) if shapes is None else shapes
    fsdp2 = report.config.api == "FSDP2"
    ranks = report.config.parallel_dims.dp_shard_cp
    rows = []
    for fqn in u.params:
        shape: list[int] | None = shapes.get(fqn)
        numel = math.prod(shape) if shape is not None else None
        row = [
            fqn,
            _shape(shape),
            "?" if numel is None else f"{numel:,}",
            "?" if numel is None else format_bytes(numel * u.itemsize),
            report.param_first_use.get(fqn, "-"),
        ]
        if u.shard_shapes:
            if _tp_column(report, u):
                placement = u.tp_placements.get(fqn, "-")
                row.append(f"⊞ tp {placement}" if placement.startswith("Shard") else placement)
            if u.shard_dims:
                row.append(f"Shard({u.shard_dims.get(fqn, 0)})")
            row.append(_shape(u.shard_shapes.get(fqn)))
        elif fsdp2:
            local = None if not shape else [math.ceil(shape[0] / ranks), *shape[1:]]
            row.append(_shape(local))
        rows.append(row)
    return rows


def _tp_column(report: Report, u: Unit) -> bool:
    """Whether ``u``'s parameters table has a tensor-parallel column: its shards are tensor
    parallelism's (not only ``shard_placement_fn``'s dims)."""
    return bool(u.shard_shapes) and bool(
        report.config.tp_world_size or u.tp_placements or not u.shard_dims
    )


def _nodes_by_unit(tree: ModuleTree) -> dict[str | None, list[TreeNode]]:
    """The modules with parameters of each unit, in tree order."""
    out: dict[str | None, list[TreeNode]] = {}
    for node in tree.nodes:
        if node.numel:
            out.setdefault(node.unit, []).append(node)
    return out


def bytes_breakdown(
    report: Report,
    tree: ModuleTree,
    unit: str,
    nodes: dict[str | None, list[TreeNode]] | None = None,
) -> list[list[str]]:
    """Where ``unit``'s bytes go: ``[part, parameters, bytes full, bytes per rank, share]``.

    One row per top-level module of the unit (the unit root's own parameters first), then
    padding (FSDP1: ``use_orig_params``' alignment and the FlatParameter padded to a
    multiple of the shard size; FSDP2: each parameter's dim 0 padded to a multiple of the
    ranks), then the total: FSDP1's ``FlatParameter``, FSDP2's group, all-gathered in one.
    ``nodes``: the tree's modules with parameters by unit, when known already.
    """
    u = report.unit(unit)
    parts: dict[str, list[int]] = {}
    root = tree.by_fqn.get(unit)
    nodes = _nodes_by_unit(tree) if nodes is None else nodes
    for node in nodes.get(unit, []):
        key = node.fqn
        if root is not None and node.fqn != unit:
            rel = node.fqn[len(unit) + 1 :] if unit else node.fqn
            key = f"{unit}.{rel.split('.', 1)[0]}" if unit else rel.split(".", 1)[0]
        acc = parts.setdefault(key, [0, 0, 0])
        acc[0] += node.numel
        acc[1] += node.bytes
        acc[2] += node.rank_bytes
    total = max(u.padded_numel * u.itemsize, 1)

    def share(n: int) -> str:
        return f"{100 * n / total:.1f}%"

    rows: list[list[str]] = []
    for key, (numel, full, rank) in sorted(parts.items(), key=lambda kv: -kv[1][1]):
        rows.append([key or "(root)", f"{numel:,}", format_bytes(full), format_bytes(rank),
                     share(full)])  # fmt: skip
    fsdp2 = report.config.api == "FSDP2"
    align = (u.flat_numel - u.numel) * u.itemsize
    pad = (u.padded_numel - u.flat_numel) * u.itemsize
    if align:
        rows.append(["alignment padding (use_orig_params)", "", format_bytes(align), "",
                     share(align)])  # fmt: skip
    if pad:
        what = (
            f"padding: each dim 0 to a multiple of {report.config.parallel_dims.dp_shard_cp} ranks"
            if fsdp2
            else "padding to a multiple of the shard size"
        )
        rows.append([what, "", format_bytes(pad), "", share(pad)])
    rows.append(
        [
            "in all (one all-gather)" if fsdp2 else "FlatParameter",
            f"{u.padded_numel:,}",
            format_bytes(u.padded_numel * u.itemsize),
            format_bytes(u.sharded_bytes),
            "100%",
        ]
    )
    return rows


def _events_lines(report: Report) -> dict[str, str]:
    """Each unit's events of the steady state, in words."""
    it = report.iterations[-1] if report.iterations else []
    words: dict[str, list[str]] = {}
    for pos, e in enumerate(it):
        w = e.kind + (" (prefetch)" if e.prefetch else "")
        if e.hook is not None:
            w += f" by {e.hook} of {unit_label(e.hook_unit)}"
        words.setdefault(e.unit, []).append(f"{pos}: {w}")
    return {unit: "; ".join(ws) for unit, ws in words.items()}


def _how_sharded(report: Report, u: Unit) -> str:
    """FSDP1's sharding strategy, or FSDP2's resharding after forward (:data:`RESHARD`)
    for this unit."""
    c = report.config
    if c.api != "FSDP2":
        return u.sharding_strategy
    value = c.resharding(u.module)
    if value is None:  # not stated (a recording): what the unit's sizes imply
        value = u.sharding_strategy != "SHARD_GRAD_OP"
    ranks = f"{value} ranks" if not isinstance(value, bool) else str(value)
    return f"{RESHARD.name}={ranks}"


def _table(
    title: str, header: list[str], rows: list[list[str]], numeric: list[int], note: str = ""
) -> DetailTable:
    return {
        "title": title,
        "note": note,
        "header": header,
        "rows": rows[:MAX_ROWS],
        "more": max(len(rows) - MAX_ROWS, 0),
        "numeric": numeric,
    }


def _text(title: str, text: str) -> DetailText:
    return {"title": title, "text": text}


class _Facts:
    """What every unit's panel reads from the report, gathered once."""

    def __init__(self, report: Report, tree: ModuleTree) -> None:
        self.shapes = _param_shapes(report)
        self.nodes = _nodes_by_unit(tree)
        self.events = _events_lines(report)
        self.modules: dict[str | None, list[ModuleInfo]] = {}
        for m in report.modules:
            node = tree.by_fqn.get(m.fqn)
            if node is not None and (m.calls or m.params):
                self.modules.setdefault(node.unit, []).append(m)


def unit_detail(
    report: Report, tree: ModuleTree, index: int, known: _Facts | None = None
) -> UnitDetail:
    """The panel of ``report.units[index]``: ``title``, ``facts`` (one line), ``warnings``
    and ``sections``, each a table (``title``, ``note``, ``header``, ``rows`` of text,
    ``more``: rows left out, ``numeric``: the columns aligned right) or a ``text``."""
    known = _Facts(report, tree) if known is None else known
    u = report.units[index]
    fsdp2 = report.config.api == "FSDP2"
    stage = report.pipeline.stage_of_unit(u.module) if report.pipeline is not None else None
    facts = [
        *([f"pipeline stage {stage.index} (pp rank {stage.rank})"] if stage else []),
        _how_sharded(report, u),
        f"{u.numel:,} parameters in {len(u.params)} tensors",
        dtype_text(u),
        f"{format_bytes(u.bytes)} full, {format_bytes(u.sharded_bytes)} per rank",
    ]
    sections: list[DetailTable | DetailText] = [
        _table(
            "Where its bytes go",
            ["part", "parameters", "full", "per rank", "share"],
            bytes_breakdown(report, tree, u.module, known.nodes),
            [1, 2, 3, 4],
        )
    ]
    header = ["parameter", "shape", "numel", "bytes", "first used by"]
    if _tp_column(report, u):
        header += ["tensor parallel"]
    if u.shard_dims:
        header += ["FSDP placement"]
    if fsdp2 or u.shard_shapes:
        header += ["shard per rank"]
    sections.append(
        _table(
            "Parameters",
            header,
            param_rows(report, u.module, known.shapes),
            [2, 3],
            note="each a DTensor sharded on dim 0, all-gathered together"
            if fsdp2 and not u.shard_dims
            else "each a DTensor sharded on its dim (shard_placement_fn), all-gathered together"
            if fsdp2
            else "in flattening order: one FlatParameter",
        )
    )
    if u.tp_placements:
        sharded = sum(1 for p in u.tp_placements.values() if p.startswith("Shard"))
        sections.append(
            _text(
                "Tensor parallelism",
                f"⊞ {sharded} of {len(u.params)} parameters are sharded by tensor parallelism "
                "(DTensor placement on the tp dimension); FSDP shards each rank's piece on "
                "dim 0. Shapes are the whole parameter; “shard per rank” is what one rank holds.",
            )
        )
    if u.shared_params:
        shared = ", ".join(f"{a} = {b}" for a, b in u.shared_params.items())
        sections.append(_text("Shared parameters", shared))
    shape_rows = []
    for m in known.modules.get(u.module, []):
        shape_rows.append(
            [
                m.fqn or "(root)",
                m.module_class,
                str(m.calls),
                "; ".join(map(str, m.input_shapes)) or "-",
                "; ".join(map(str, m.output_shapes)) or "-",
            ]
        )
    if shape_rows:
        sections.append(
            _table(
                "Shapes seen in the trace",
                ["module", "class", "calls", "inputs", "outputs"],
                shape_rows,
                [2],
            )
        )
    sections.append(_text("Events (steady state)", known.events.get(u.module, "no events")))
    return {
        "title": f"unit {index} of {len(report.units)}: {unit_label(u.module)} ({u.module_class})",
        "facts": " · ".join(facts),
        "warnings": [
            f"[{w.code}] {w.message.splitlines()[0] if w.message else ''}"
            for w in report.warnings
            if u.module in w.units
        ],
        "sections": sections,
    }


def unit_details(
    report: Report, tree: ModuleTree | None = None, indices: Sequence[int] | None = None
) -> list[UnitDetail]:
    """:func:`unit_detail` of every unit, in ``report.units`` order (of the units at
    ``indices`` only, when given)."""
    tree = tree or module_tree(report)
    facts = _Facts(report, tree)
    which = range(len(report.units)) if indices is None else indices
    return [unit_detail(report, tree, i, facts) for i in which]
