"""The module tree of a report with per-module sizes, for the explorer and its detail panel.

Pure data, no plotly: :func:`module_tree` walks ``report.modules`` once and
returns one :class:`TreeNode` per module, with its owning unit and the sizes of
its subtree (parameters, bytes in full, bytes held by one rank).

Example::

    tree = module_tree(report)
    tree.nodes[0].numel_total        # parameters of the whole model
    tree.by_fqn["layers.0"].unit     # 'layers.0'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from fsdpviz.schema.names import unwrapped_fqn
from fsdpviz.schema.report import ModuleInfo, Report, Unit

__all__ = [
    "EXPLORER_BUDGET",
    "ROOT_ID",
    "ModuleTree",
    "TreeNode",
    "TreeView",
    "module_tree",
    "node_id",
    "tree_view",
    "with_module_tree",
]

ROOT_ID = "<root>"


def node_id(fqn: str) -> str:
    """Plotly id of a module: its FQN, ``<root>`` for the root (plotly reserves ``""``)."""
    return fqn if fqn else ROOT_ID


@dataclass
class TreeNode:
    """One module with the sizes of its direct parameters and of its subtree.

    ``unit`` is the wrap unit that manages the module's direct parameters or, for a
    module without parameters, the innermost unit around it; ``None`` for parameters
    FSDP does not manage (ignored modules). A parameter shared by several modules is
    counted once, under its first FQN (as FSDP flattens it).
    """

    fqn: str
    name: str
    parent: str | None
    module_class: str
    unit: str | None
    numel: int
    bytes: int
    rank_bytes: int
    numel_total: int = 0
    bytes_total: int = 0
    rank_bytes_total: int = 0
    children: list[str] = field(default_factory=list)

    @property
    def is_unit_root(self) -> bool:
        """The module is itself a wrap unit."""
        return self.unit == self.fqn


@dataclass
class ModuleTree:
    """All modules in ``report.modules`` order (parents before children)."""

    nodes: list[TreeNode]
    by_fqn: dict[str, TreeNode]
    units: dict[str, Unit]


def module_tree(report: Report) -> ModuleTree:
    """Build the :class:`ModuleTree` of ``report`` in one pass plus a bottom-up sum."""
    units = {u.module: u for u in report.units}
    shared = {name for u in report.units for name in u.shared_params}
    # each unit's (bytes in full, bytes per rank), read once
    shares = {name: (u.bytes, u.sharded_bytes) for name, u in units.items()}
    nodes: list[TreeNode] = []
    by_fqn: dict[str, TreeNode] = {}
    for m in report.modules:
        parent = by_fqn.get(m.parent) if m.parent is not None else None
        numel, nbytes = _counted(m, shared)
        unit = _owner(m, numel, units, parent)
        full, held = shares.get(unit, (0, 0)) if unit is not None else (0, 0)
        node = TreeNode(  # fqn, name, parent, module_class, unit, numel, bytes, rank_bytes
            m.fqn,
            m.fqn.rsplit(".", 1)[-1] if m.fqn else m.module_class,
            parent.fqn if parent is not None else None,
            m.module_class,
            unit,
            numel,
            nbytes,
            # one rank's share of the padded shard; unmanaged: every rank holds all of it
            nbytes * held // full if full else nbytes,
        )
        nodes.append(node)
        by_fqn[m.fqn] = node
        if parent is not None:
            parent.children.append(m.fqn)
    for node in reversed(nodes):
        node.numel_total += node.numel
        node.bytes_total += node.bytes
        node.rank_bytes_total += node.rank_bytes
        if node.parent is not None:
            up = by_fqn[node.parent]
            up.numel_total += node.numel_total
            up.bytes_total += node.bytes_total
            up.rank_bytes_total += node.rank_bytes_total
    return ModuleTree(nodes=nodes, by_fqn=by_fqn, units=units)


EXPLORER_BUDGET = 1500
"""Most modules an explorer figure draws at once (a browser draws each as an SVG path)."""


@dataclass(frozen=True)
class TreeView:
    """The part of a :class:`ModuleTree` a figure draws: the subtree of ``focus``, as many
    levels of it as fit the budget (always its children). ``closed`` modules have
    children that are not drawn; opening one (focusing on it) draws them."""

    focus: str
    indices: list[int]  # into tree.nodes, in tree order (parents before children)
    closed: frozenset[str]


def tree_view(tree: ModuleTree, focus: str = "", budget: int | None = None) -> TreeView:
    """What an explorer figure focused on ``focus`` draws (see :class:`TreeView`);
    ``budget`` defaults to :data:`EXPLORER_BUDGET`."""
    budget = EXPLORER_BUDGET if budget is None else budget
    if focus not in tree.by_fqn:
        raise KeyError(f"no module {focus!r} in the model")
    shown = {focus}
    level = [focus]
    while level:
        below = [c for f in level for c in tree.by_fqn[f].children]
        if not below or (len(shown) + len(below) > budget and len(shown) > 1):
            break
        shown.update(below)
        level = below
    closed = frozenset(
        f for f in level if tree.by_fqn[f].children and tree.by_fqn[f].children[0] not in shown
    )
    indices = [i for i, n in enumerate(tree.nodes) if n.fqn in shown]
    return TreeView(focus=focus, indices=indices, closed=closed)


def _counted(m: ModuleInfo, shared: set[str]) -> tuple[int, int]:
    """Direct parameters of ``m`` without the non-first names of shared parameters."""
    if m.numel == 0:
        return 0, 0
    if not m.params:  # older reports without shapes: trust the totals
        return m.numel, m.bytes
    if shared:
        prefix = f"{m.fqn}." if m.fqn else ""
        shapes = [
            shape
            for name, shape in m.params.items()
            if prefix + name not in shared and unwrapped_fqn(prefix + name) not in shared
        ]
    else:
        shapes = list(m.params.values())
    numel = sum(map(math.prod, shapes))
    nbytes = m.bytes * numel // m.numel
    return numel, nbytes


def _owner(
    m: ModuleInfo, numel: int, units: dict[str, Unit], parent: TreeNode | None
) -> str | None:
    if m.fqn in units:
        return m.fqn
    if numel > 0:
        return m.unit
    return parent.unit if parent is not None else None


def with_module_tree(report: Report) -> Report:
    """``report`` itself, or for a recording (which has no module tree) one made of its units.

    Each unit becomes a module under the nearest unit that contains it by FQN, so the
    explorer still shows every unit with its size.
    """
    if report.modules:
        return report
    names = {u.module for u in report.units}
    modules = []
    for u in report.units:
        parent: str | None = None
        if u.module:
            parts = u.module.split(".")
            parent = next(
                (
                    p
                    for p in (".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1))
                    if p in names
                ),
                "" if "" in names else None,
            )
        modules.append(
            ModuleInfo(
                fqn=u.module,
                module_class=u.module_class,
                parent=parent,
                unit=u.module,
                numel=u.numel,
                bytes=u.bytes,
            )
        )
    return replace(report, modules=modules)
