"""One self-contained HTML page: summary, explorer, prefetch graph and step-through timeline.

Everything is inlined (the part of plotly.js the page draws with, ``plotly.js``
built from ``js/src/plotly.ts``; the timeline widget's own bundle; the page script
``standalone.js`` built from ``js/src/standalone.ts``; the data), so the page works
from a file, offline, without a kernel. plotly.js, the data and the widget are
packed (gzip, then base64, see :func:`pack`): a 10,000-module model's page is a few
MB instead of ten; the page script unpacks them with the browser's
``DecompressionStream``. The timeline widget runs against an in-page model; the
current step's unit is outlined in the figures and a click on a unit there selects
it in the timeline.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import ExportError
from fsdpviz.export._sources import memory_summary, ranks_of
from fsdpviz.views.style import Theme, format_bytes, theme_colors
from fsdpviz.views.timeline_steps import MemoryOption
from fsdpviz.views.tree import with_module_tree

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from fsdpviz.recording import RecordedRun
    from fsdpviz.schema.report import Report
    from fsdpviz.views.tree import ModuleTree

__all__ = ["html_page", "pack", "page_script"]

STATIC = Path(__file__).resolve().parent.parent / "static"
CSS = Path(__file__).with_name("page.css")
# The trace types js/src/plotly.ts registers (scatter is plotly.js's core).
PAGE_TRACES = ("scatter", "icicle", "treemap")
_PLOT_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


def html_page(
    obj: Report | RecordedRun,
    *,
    theme: Theme = "light",
    iteration: int | None = -1,
    memory: MemoryOption = "auto",
    title: str | None = None,
    machine: Machine | str | None = "h100",
) -> str:
    """The page as a string (see :func:`fsdpviz.export.save` for the options)."""
    from fsdpviz.views import explorer_figure, module_tree, prefetch_figure, timeline_data
    from fsdpviz.views.prefetch import prefetch_analysis
    from fsdpviz.views.tree import node_id

    theme_colors(theme)  # rejects an unknown theme before any work
    reports, names = ranks_of(obj)
    base = reports[0]
    drawn = reports if obj is base else obj  # a run: a lane group per rank, divergence marked
    data = timeline_data(
        drawn, iteration, memory=memory, rank_names=None if obj is base else names, machine=machine
    )
    tree_report = with_module_tree(base)
    tree = module_tree(tree_report)
    explorer = explorer_figure(tree_report, theme=theme, tree=tree)
    colors = theme_colors(theme)
    prefetch_iteration = -1 if iteration is None else iteration
    prefetch = prefetch_figure(base, prefetch_iteration, theme=theme)
    positions = prefetch_analysis(base, prefetch_iteration).positions
    config = {
        "figures": [
            {"div": "fv-explorer", "figure": _figure_json(explorer)},
            {"div": "fv-prefetch", "figure": _figure_json(prefetch)},
        ],
        "plotConfig": _PLOT_CONFIG,
        "timeline": data,
        "theme": theme,
        "explorer": {
            "div": "fv-explorer",
            "ids": [node_id(n.fqn) for n in tree.nodes],
            "parents": ["" if n.parent is None else node_id(n.parent) for n in tree.nodes],
            "units": [n.unit for n in tree.nodes],
            "outline": [colors["fg"], colors["bg"]],
            "tree": _explorer_tree(tree_report, tree, theme),
        },
        "prefetch": {"div": "fv-prefetch", "positions": positions},
        "find": {"input": "fv-find", "note": "fv-find-note"},
        "timelineDiv": "fv-timeline",
    }
    heading = title or _title(obj, base)
    return _PAGE.format(
        title=html.escape(heading),
        light="false" if theme == "dark" else "true",
        css=_read(CSS) + _read(STATIC / "timeline.css"),
        plotly=_packed_plotly(),
        header=_header(obj, reports, heading, iteration),
        unit_options="".join(
            f'<option value="{html.escape(u.module or "(root)")}"></option>' for u in base.units
        ),
        config=pack(json.dumps(config, separators=(",", ":"), allow_nan=False)),
        widget=pack(_read(STATIC / "timeline.js")),
        page_js=_inline_script(_read(STATIC / "standalone.js")),
        version=html.escape(_version()),
    )


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="fsdpviz {version}">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body data-jp-theme-light="{light}">
{header}
<section id="fv-timeline-section">
<h2>Timeline</h2>
<p class="fv-hint">Step with the buttons, the slider or the arrow keys (click the lanes first);
the unit of the current event is outlined in the explorer and the prefetch graph below.
Click a unit there to select it here.</p>
<div id="fv-timeline"></div>
</section>
<section class="fv-figures">
<div><h2>Wrap units</h2>
<p class="fv-find"><label>find <input id="fv-find" list="fv-find-units" type="search"
placeholder="a unit or module" autocomplete="off"></label>
<span id="fv-find-note" class="fv-hint" role="status"></span></p>
<datalist id="fv-find-units">{unit_options}</datalist>
<p class="fv-hint">Click a block to zoom into it; the path bar above the blocks leads back up.</p>
<div id="fv-explorer" class="fv-plot"></div></div>
<div><h2>Prefetch graph</h2><div id="fv-prefetch" class="fv-plot"></div></div>
</section>
<footer>Written by fsdpviz {version}. Works offline: everything it needs is in this file.</footer>
<script type="application/gzip" id="fv-plotly">{plotly}</script>
<script type="application/gzip" id="fv-config">{config}</script>
<script type="application/gzip" id="fv-widget-esm">{widget}</script>
<script type="module">{page_js}</script>
</body>
</html>
"""


def _explorer_tree(report: Report, tree: ModuleTree, theme: Theme) -> dict[str, Any] | None:
    """Every module as the explorer draws it, for a page whose figure shows only part of a
    big model: the page opens and closes blocks itself (``js/src/standalone.ts``)."""
    from fsdpviz.views.explorer import explorer_parts
    from fsdpviz.views.tree import EXPLORER_BUDGET, TreeView

    if len(tree.nodes) <= EXPLORER_BUDGET:
        return None
    everything = TreeView(focus="", indices=list(range(len(tree.nodes))), closed=frozenset())
    trace, layout = explorer_parts(report, theme=theme, tree=tree, view=everything)
    return {
        "parents": trace["parents"],
        "labels": trace["labels"],
        "values": [int(v) for v in trace["values"]],
        "colors": trace["marker"]["colors"],
        "customdata": trace["customdata"],
        "budget": EXPLORER_BUDGET,
        "title": layout["title"]["text"],
    }


def _read(path: Path) -> str:
    if not path.exists():
        raise ExportError(
            f"{path} is missing: the front end was not built. Build it with "
            "`npm --prefix js ci && npm --prefix js run build` from a source checkout, or "
            "reinstall fsdpviz from a wheel"
        )
    return path.read_text(encoding="utf-8")


@functools.cache
def _packed_plotly() -> str:
    """The page's plotly.js, packed once per process (the same bytes for every page)."""
    return pack(_read(STATIC / "plotly.js"))


def _figure_json(fig: go.Figure) -> dict[str, Any]:
    """A figure as plotly.js draws it; its traces must be of the types the page's plotly.js
    holds (:data:`PAGE_TRACES`)."""
    data: dict[str, Any] = json.loads(fig.to_json())
    for trace in data.get("data", []):
        kind = trace.get("type", "scatter")
        if kind not in PAGE_TRACES:
            raise ExportError(
                f"a figure of the page draws a {kind!r} trace, which the page's plotly.js "
                f"does not hold (only {', '.join(PAGE_TRACES)}): add it in js/src/plotly.ts "
                "and to PAGE_TRACES"
            )
    return {"data": data.get("data", []), "layout": data.get("layout", {})}


def _inline_script(source: str) -> str:
    if "</script" in source.lower():
        raise ExportError("a script to inline contains '</script'; it cannot be embedded")
    return source


def pack(text: str) -> str:
    """``text`` as the page holds it: gzip-compressed (no timestamp, so a page is the same
    bytes for the same report), then base64-encoded. :func:`page_script` reverses it, as the
    page script does (``unpack`` in ``js/src/standalone.ts``)."""
    return base64.b64encode(gzip.compress(text.encode(), compresslevel=6, mtime=0)).decode("ascii")


def page_script(page: str, script_id: str) -> str:
    """The text of the packed script ``script_id`` of a page :func:`html_page` wrote
    (``fv-plotly``, ``fv-config`` or ``fv-widget-esm``)."""
    match = re.search(
        rf'<script type="application/gzip" id="{re.escape(script_id)}">(.*?)</script>', page, re.S
    )
    if match is None:
        raise ExportError(f"the page has no packed script #{script_id}")
    return gzip.decompress(base64.b64decode(match.group(1))).decode()


def _version() -> str:
    from fsdpviz._version import __version__

    return __version__


def _title(obj: Report | RecordedRun, base: Report) -> str:
    api = base.config.api
    ws = base.config.world_size
    if obj is base:
        what = "prediction" if base.source == "prediction" else "recording"
        return f"fsdpviz {what}: {api}, {len(base.units)} units, world size {ws}"
    return f"fsdpviz recording: {api}, {len(base.units)} units, world size {ws}"


def _header(
    obj: Report | RecordedRun, reports: list[Report], heading: str, iteration: int | None
) -> str:
    base = reports[0]
    rows: list[tuple[str, str]] = []
    if obj is base:
        rows.append(("source", base.source))
    else:
        rows.append(("source", f"recording of {len(reports)} ranks"))
    full = sum(u.bytes for u in base.units)
    per_rank = sum(u.sharded_bytes for u in base.units)
    rows.append(("wrap units", f"{len(base.units)}"))
    cfg = base.config
    if cfg.mesh and len(cfg.mesh) > 1:
        mesh = " × ".join(f"{name} {size}" for name, size in cfg.mesh.items())
        if cfg.tp_world_size:
            mesh += f"; tensor parallel over {cfg.tp_world_size} ranks"
        rows.append(("mesh", mesh))
    rows.append(("parameters", f"{format_bytes(full)} in all, {format_bytes(per_rank)} per rank"))
    peak = memory_summary(base)
    if peak is not None:
        rows.append(
            (
                "peak memory per rank",
                f"{format_bytes(peak['bytes'])} (modelled) {peak['where']}; "
                f"dominated by {peak['dominant']}",
            )
        )
    if base.source == "prediction":
        step, *throughput = _step_time(base).splitlines()
        rows.append(("step time (modelled)", step))
        if throughput:
            rows.append(("throughput (modelled)", throughput[0]))
    rows.append(("events", _event_counts(reports, iteration)))
    notes = [f"[{w.code}] {w.message.splitlines()[0]}" for w in base.warnings]
    div = getattr(obj, "divergence", None)
    if callable(div):
        d = div()
        if d is None:
            rows.append(("ranks", "all agree"))
        else:
            rows.append(("ranks", str(d).splitlines()[0].rstrip(":") + " (below)"))
            notes.append(str(d))
        notes += list(getattr(obj, "notes", []))
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in rows)
    warn = ""
    if notes:
        warn = (
            '<ul class="fv-warnings" aria-label="warnings">'
            + "".join(f"<li>{html.escape(n)}</li>" for n in notes)
            + "</ul>"
        )
    return (
        f'<header><h1>{html.escape(heading)}</h1><dl class="fv-summary">{items}</dl>{warn}</header>'
    )


def _step_time(report: Report) -> str:
    try:
        return report.timeline.summary()
    except (ValueError, KeyError, IndexError) as exc:
        return f"not modelled ({exc})"


def _event_counts(reports: list[Report], iteration: int | None) -> str:
    base = reports[0]
    n = len(base.iterations)
    its = range(n) if iteration is None else [iteration % n] if n else []
    counts: dict[str, int] = {}
    for i in its:
        for e in base.iterations[i]:
            counts[e.kind] = counts.get(e.kind, 0) + 1
    text = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"
    if iteration is None:
        shown = f"all {n} iterations"
    elif base.source == "prediction":
        shown = "first iteration" if iteration % n == 0 else "steady state"
    else:
        shown = f"iteration {iteration % n} of {n}"
    return f"{text} ({shown}{', first rank' if len(reports) > 1 else ''}; shown in the timeline)"
