"""The import graph of fsdpviz flows one way (see ARCHITECTURE.md).

Every ``import`` that runs counts, at the top of a module or inside a function;
imports under ``if TYPE_CHECKING:`` only name types for annotations and never run, so they
count for cycles (a type named across a circle is still a circle) but not for layers.
The layers are read from the ``layers`` block of ARCHITECTURE.md, bottom first, each with
the layers it sits on directly: a module may import from its own layer and the layers below
it, those its layer sits on and theirs in turn (the layers are a DAG, not a stack). The page
also names every module (in its layer's row of the layer table) and every file of the front
end.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fsdpviz"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the fsdpviz module it loads
    names: tuple[str, ...]  # the names taken from it (``from target import ...``)
    line: int


@cache
def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, typing: bool) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run, in functions too; those under ``if TYPE_CHECKING`` only
    with ``typing``."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child) and not typing:
            for other in child.orelse:
                found.extend(_walk(other, typing))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append(child)
        found.extend(_walk(child, typing))
    return found


@cache
def imports(typing: bool = False) -> list[Import]:
    """Every import of an fsdpviz module; ``typing``: those under ``if TYPE_CHECKING`` too."""
    known = modules()
    out: list[Import] = []
    for name, path in known.items():
        for node in _walk(ast.parse(path.read_text(), str(path)), typing):
            if isinstance(node, ast.Import):
                out.extend(
                    Import(name, a.name, (), node.lineno)
                    for a in node.names
                    if a.name.split(".")[0] == "fsdpviz"
                )
                continue
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if _is_package(name) else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "fsdpviz":
                continue
            taken: list[str] = []
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    out.append(Import(name, full, (), node.lineno))
                else:
                    taken.append(alias.name)
            if taken:
                out.append(Import(name, base, tuple(taken), node.lineno))
    return out


@cache
def _layer_lines() -> list[list[str]]:
    """The ``layers`` block of ARCHITECTURE.md, bottom first: name, the layers it sits on
    (comma-separated, ``-`` for none), modules; ``#`` starts a comment line."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("```layers\n", 1)[1].split("```", 1)[0]
    return [line.split() for line in block.splitlines() if line.strip() and line[0] != "#"]


def layers() -> list[list[str]]:
    """The modules of each layer, bottom first."""
    return [line[2:] for line in _layer_lines()]


def layer_names() -> list[str]:
    """Each layer's name, bottom first."""
    return [line[0] for line in _layer_lines()]


@cache
def layer_graph() -> nx.DiGraph:
    """The declared layers: an arrow from each layer to each layer it sits on directly."""
    graph = nx.DiGraph()
    graph.add_nodes_from(layer_names())
    for line in _layer_lines():
        graph.add_edges_from((line[0], under) for under in line[1].split(",") if under != "-")
    return graph


def may_import(importer: int, target: int) -> bool:
    """Whether a module of layer ``importer`` may import one of layer ``target`` (indices):
    its own layer, or one it sits on, directly or through others."""
    names = layer_names()
    return importer == target or nx.has_path(layer_graph(), names[importer], names[target])


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (length of the matching prefix, layer)
    for index, members in enumerate(layers()):
        for prefix in members:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    assert best is not None, f"{module} is in no layer of ARCHITECTURE.md; add it to one"
    return best[1]


def test_every_module_is_in_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_the_layers_are_declared_bottom_first_as_a_dag() -> None:
    """Each layer sits only on layers declared before it (so there is no circle among them),
    each named once, each but the bottom one on at least one."""
    names = layer_names()
    assert len(set(names)) == len(names), f"a layer is declared twice: {names}"
    unknown = [(a, b) for a, b in layer_graph().edges if b not in names]
    assert not unknown, f"layers sit on layers that are not declared: {unknown}"
    upward = [(a, b) for a, b in layer_graph().edges if names.index(b) >= names.index(a)]
    assert not upward, f"layers sit on a layer declared after them (bottom first): {upward}"
    floating = [n for n in names[1:] if not layer_graph().out_degree(n)]
    assert not floating, f"layers that sit on none: {floating}"


def test_every_declared_arrow_is_used() -> None:
    """Each layer a layer sits on directly is one its modules import from, so the declaration
    says how the layers depend, and no more."""
    names = layer_names()
    used = {
        (names[layer_of(i.module)], names[layer_of(i.target)])
        for i in imports()
        if i.target in modules()
    }
    unused = [edge for edge in layer_graph().edges if edge not in used]
    assert not unused, f"arrows of ARCHITECTURE.md's layers that no import takes: {unused}"


def test_no_module_imports_from_a_layer_above_it() -> None:
    """No import runs against the declared layers: none up, none across to a sibling."""
    names = layer_names()
    against = [
        f"{i.module}:{i.line} imports {i.target} "
        f"(layer {names[layer_of(i.target)]} is not under {names[layer_of(i.module)]})"
        for i in imports()
        if i.target in modules() and not may_import(layer_of(i.module), layer_of(i.target))
    ]
    assert not against, "imports against the layers of ARCHITECTURE.md:\n" + "\n".join(against)


def test_no_import_cycles() -> None:
    """No circle, counting the imports that only name types (``if TYPE_CHECKING:``)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(modules())
    graph.add_edges_from((i.module, i.target) for i in imports(True) if i.target in modules())
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    cycles += [[m] for m in graph if graph.has_edge(m, m)]
    assert not cycles, f"import cycles among fsdpviz modules: {cycles}"


def _private_module_owner(target: str) -> str | None:
    """The package a private module (``pkg._name``) belongs to, or None if none is private."""
    parts = target.split(".")
    for k in range(len(parts) - 1, 0, -1):
        if parts[k].startswith("_") and not parts[k].startswith("__"):
            return ".".join(parts[:k])
    return None


def test_no_private_name_is_imported_across_modules() -> None:
    wrong: list[str] = []
    for i in imports():
        private = [n for n in i.names if n.startswith("_") and not n.startswith("__")]
        if private:
            wrong.append(f"{i.module}:{i.line} takes {', '.join(private)} from {i.target}")
        owner = _private_module_owner(i.target)
        if owner is not None and not (i.module == owner or i.module.startswith(owner + ".")):
            wrong.append(f"{i.module}:{i.line} imports {i.target}, private to {owner}")
    assert not wrong, "make these names public in their package:\n" + "\n".join(wrong)


def _bound_names(package: str) -> set[str]:
    """Names a package's ``__init__`` binds to something other than its own submodules."""
    tree = ast.parse(modules()[package].read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            own = node.module == package and not node.level
            names.update(a.asname or a.name for a in node.names if not (own and a.asname is None))
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_no_module_is_hidden_by_a_name_of_its_package() -> None:
    """``fsdpviz.analyze`` is the function, and no module ``fsdpviz/analyze.py`` hides behind it
    (``import fsdpviz.x.y as m`` would give the package's ``y``, not the module)."""
    hidden = [
        name
        for name in modules()
        if "." in name and name.rpartition(".")[2] in _bound_names(name.rpartition(".")[0])
    ]
    assert not hidden, f"modules hidden by a name their package binds: {hidden}"


def test_the_checks_see_imports_inside_functions() -> None:
    """An import that runs only inside a function counts; one under TYPE_CHECKING counts
    only for cycles."""
    edges = {(i.module, i.target) for i in imports()}
    typed = {(i.module, i.target) for i in imports(True)}
    assert ("fsdpviz._conveniences", "fsdpviz.widgets") in edges  # inside show()
    only_typed = ("fsdpviz.views.card", "fsdpviz.recording")  # TYPE_CHECKING only
    assert only_typed not in edges
    assert only_typed in typed


def test_every_package_says_what_it_may_import() -> None:
    """Each package's docstring says in a line what the package may import."""
    quiet = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if "May import" not in doc and "Imports nothing" not in doc:
            quiet.append(init.parent.name)
    assert not quiet, f"packages whose docstring does not say what they may import: {quiet}"


def _table_rows() -> dict[str, str]:
    """The layer table of ARCHITECTURE.md: each layer's row, by the layer's name."""
    rows: dict[str, str] = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3:
            rows[cells[0]] = line
    return rows


def test_architecture_names_every_module() -> None:
    """Each module of fsdpviz is named (``name.py``) in the row of its layer in the layer
    table, and each file of the front end (``js/src/*.ts``) on the page."""
    names = layer_names()
    rows = _table_rows()
    missing = []
    for module, path in modules().items():
        if path.name == "__init__.py" and module != "fsdpviz":
            continue  # a package is named by its folder
        row = rows.get(names[layer_of(module)], "")
        if f"`{path.name}`" not in row:
            missing.append(f"{path.relative_to(ROOT)} (layer {names[layer_of(module)]})")
    text = (ROOT / "ARCHITECTURE.md").read_text()
    missing += [
        str(ts.relative_to(ROOT))
        for ts in sorted((ROOT / "js" / "src").glob("*.ts"))
        if f"`{ts.name}`" not in text
    ]
    assert not missing, "modules ARCHITECTURE.md does not name:\n" + "\n".join(missing)


def test_architecture_names_no_file_that_is_gone() -> None:
    """Every ``name.py`` and ``name.ts`` ARCHITECTURE.md names is a file of the repository."""
    named = set(re.findall(r"`(\w+\.(?:py|ts))`", (ROOT / "ARCHITECTURE.md").read_text()))
    files = {p.name for d in ("fsdpviz", "js/src", "tests") for p in (ROOT / d).rglob("*.*")}
    assert not named - files, f"ARCHITECTURE.md names files that do not exist: {named - files}"
