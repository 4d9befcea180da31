"""One self-contained HTML page: summary, step-through timeline, explorer and prefetch graph.

Everything is inlined (the timeline widget's bundle; the page script ``standalone.js``
built from ``js/src/standalone.ts``, which draws the explorer and the prefetch graph on
canvases; the data), so the page works from a file, offline, without a kernel. The data
and the widget are packed (gzip, then base64, see :func:`pack`): a 10,000-module model's
page is about a MB instead of several; the page script unpacks them with the browser's
``DecompressionStream``. The timeline widget runs against an in-page model; the current
step's unit is outlined in the explorer and ringed in the prefetch graph, and a click on
a unit there selects it in the timeline.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import ExportError
from fsdpviz.export._sources import memory_summary, ranks_of
from fsdpviz.views.style import Theme, format_bytes, theme_colors
from fsdpviz.views.timeline_view import MemoryOption
from fsdpviz.views.tree import with_module_tree

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun
    from fsdpviz.schema.report import Report

__all__ = ["html_page", "pack", "page_script"]

STATIC = Path(__file__).resolve().parent.parent / "static"
CSS = Path(__file__).with_name("page.css")


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
    from fsdpviz.views.explorer import explorer_data
    from fsdpviz.views.prefetch import prefetch_data
    from fsdpviz.views.timeline_view import timeline_data

    theme_colors(theme)  # rejects an unknown theme before any work
    reports, names = ranks_of(obj)
    base = reports[0]
    drawn = reports if obj is base else obj  # a run: a lane group per rank, divergence marked
    data = timeline_data(
        drawn, iteration, memory=memory, rank_names=None if obj is base else names, machine=machine
    )
    config = {
        "timeline": data,
        "theme": theme,
        "explorer": explorer_data(with_module_tree(base)),
        "prefetch": prefetch_data(base, -1 if iteration is None else iteration),
        "find": {"input": "fv-find", "note": "fv-find-note"},
        "divs": {"timeline": "fv-timeline", "explorer": "fv-explorer", "prefetch": "fv-prefetch"},
    }
    heading = title or _title(obj, base)
    return _PAGE.format(
        title=html.escape(heading),
        light="false" if theme == "dark" else "true",
        css=_read(CSS) + _read(STATIC / "timeline.css"),
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
<div id="fv-explorer" class="fv-plot"></div></div>
<div><h2>Prefetch graph</h2><div id="fv-prefetch" class="fv-plot"></div></div>
</section>
<footer>Written by fsdpviz {version}. Works offline: everything it needs is in this file.</footer>
<script type="application/gzip" id="fv-config">{config}</script>
<script type="application/gzip" id="fv-widget-esm">{widget}</script>
<script type="module">{page_js}</script>
</body>
</html>
"""


def _read(path: Path) -> str:
    if not path.exists():
        raise ExportError(
            f"{path} is missing: the front end was not built. Build it with "
            "`npm --prefix js ci && npm --prefix js run build` from a source checkout, or "
            "reinstall fsdpviz from a wheel"
        )
    return path.read_text(encoding="utf-8")


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
    (``fv-config`` or ``fv-widget-esm``)."""
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
