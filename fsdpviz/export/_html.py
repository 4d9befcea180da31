"""One self-contained HTML page: summary, step-through timeline, explorer and prefetch graph.

The page draws the very views the notebook shows: it holds the widget bundle
(``widget.js``, the ES module anywidget loads for :class:`~fsdpviz.widgets.TimelineWidget`,
``ExplorerWidget`` and ``PrefetchWidget``), each view's state (the traits the widget would
have: its data, and for a saved dashboard the step, the selection, the focus) and the
page's boot script ``page.js`` (``js/src/page.ts``), which imports the bundle as anywidget
does, draws the three views against in-page models and links them as the dashboard does.
Everything is inlined, so the page works from a file, offline, without a kernel. The
states and the bundle are packed (gzip, then base64, see :func:`pack`): a 10,000-module
model's page is about a MB instead of several.

:func:`write_page` writes what every page of fsdpviz's holds around its sections (a
tuning's page too, ``_tune_page.py``): the head with the stylesheets, the footer, the
packed config and bundle, the boot script.

The page follows the reader's light or dark setting (``theme="auto"``, the default), or
is drawn ``"light"`` or ``"dark"``; its colours come from fsdpviz's colour table.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fsdpviz._version import __version__
from fsdpviz.api.comparison import Comparison
from fsdpviz.cost.fit import modelled_memory
from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import ConfigError, ExportError
from fsdpviz.export._sources import memory_summary, ranks_of
from fsdpviz.views.explorer import explorer_data
from fsdpviz.views.prefetch import prefetch_data
from fsdpviz.views.style import format_bytes, theme_colors
from fsdpviz.views.timeline_lanes import MemoryOption
from fsdpviz.views.timeline_view import opening_iteration, timeline_data
from fsdpviz.views.tree import with_module_tree

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun
    from fsdpviz.schema.report import Report

__all__ = [
    "PageTheme",
    "check_theme",
    "html_page",
    "notes_list",
    "pack",
    "page_assets",
    "page_config",
    "page_header",
    "page_script",
    "summary_items",
    "write_page",
]

STATIC = Path(__file__).resolve().parent.parent / "static"
CSS = Path(__file__).with_name("page.css")
PageTheme = Literal["auto", "light", "dark"]
VIEWS = ("timeline", "explorer", "prefetch")


def html_page(
    obj: Report | RecordedRun | Comparison,
    *,
    theme: PageTheme = "auto",
    iteration: int | Literal["auto"] | None = "auto",
    memory: MemoryOption = "auto",
    title: str | None = None,
    machine: Machine | str | None = "auto",
    states: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The page as a string (see :func:`fsdpviz.export.save` for the options).

    ``states``: each view's state (``"timeline"``, ``"explorer"``, ``"prefetch"``: the
    traits the page draws it from, at least ``data``), as a dashboard saves itself
    (:meth:`fsdpviz.widgets.Dashboard.save`); by default made from ``obj`` as the
    widgets make theirs.
    """
    check_theme(theme)
    config = page_config(obj, iteration=iteration, memory=memory, machine=machine, states=states)
    heading, header = page_header(obj, iteration=iteration, title=title)
    figures = [(n, t) for n, t in (("explorer", "Wrap units"), ("prefetch", "Prefetch graph"))
               if config["views"][n] is not None]  # fmt: skip
    return write_page(
        heading,
        theme,
        header,
        _TIMELINE_SECTION.format(
            figures=_FIGURES.format(
                divs="".join(
                    f'<div><h2>{t}</h2><div id="fv-{n}" class="fv-plot"></div></div>'
                    for n, t in figures
                )
            )
            if figures
            else ""
        ),
        config,
    )


def check_theme(theme: str) -> None:
    """``theme`` as every page takes it: ``"auto"`` (the reader's setting), ``"light"`` or
    ``"dark"``; anything else is a :class:`~fsdpviz.errors.ConfigError`."""
    if theme not in ("auto", "light", "dark"):
        raise ConfigError(f"theme={theme!r} is not valid; use 'auto', 'light' or 'dark'")


def write_page(
    heading: str,
    theme: PageTheme,
    header: str,
    body: str,
    config: dict[str, Any],
    scripts: str = "",
) -> str:
    """A page as fsdpviz writes it: titled ``heading``, drawn in ``theme`` (the flag on
    ``<body>``; none for ``"auto"``), its ``header`` and ``body`` (the sections, HTML) between
    the head, which inlines the stylesheets (:func:`page_assets`), and the footer; then
    ``config`` packed (``fv-config``, what the boot script draws), the front end's bundle,
    ``scripts`` (more scripts, each on a line of its own) and the boot script."""
    light = "true" if theme == "light" else "false"
    return _PAGE.format(
        title=html.escape(heading),
        theme_flag="" if theme == "auto" else f' data-jp-theme-light="{light}"',
        header=header,
        body=body,
        config=pack(json.dumps(config, separators=(",", ":"), allow_nan=False)),
        scripts=scripts,
        **page_assets(),
    )


def page_assets() -> dict[str, str]:
    """What every page fsdpviz writes inlines: ``css`` (the theme's colours, the page's and
    the views' stylesheets), ``widget`` (the front end's bundle, packed), ``page_js`` (the
    page's boot script) and ``version`` (fsdpviz's, HTML-escaped)."""
    return {
        "css": _theme_css() + _read(CSS) + _read(STATIC / "widget.css"),
        "widget": pack(_read(STATIC / "widget.js")),
        "page_js": _inline_script(_read(STATIC / "page.js")),
        "version": html.escape(__version__),
    }


def page_config(
    obj: Report | RecordedRun | Comparison,
    *,
    iteration: int | Literal["auto"] | None = "auto",
    memory: MemoryOption = "auto",
    machine: Machine | str | None = "auto",
    states: Mapping[str, Mapping[str, Any]] | None = None,
    required: tuple[str, ...] = ("timeline",),
) -> dict[str, Any]:
    """What the page draws, as JSON: ``{"views": {name: state or None}, "divs": {...}}``.

    ``states`` as :func:`html_page` takes them (by default each view made from ``obj`` as
    the widgets make theirs; a comparison's page draws its timeline only); ``required``:
    the views ``states`` must give. JupyterLab's fsdpviz renderer draws the same config
    (:func:`fsdpviz.export._notebook.report_mime`).
    """
    iteration = opening_iteration(obj, iteration)
    if isinstance(obj, Comparison):
        if obj.reports is None:
            raise ExportError("this comparison was read back without its plans; compare() again")
        if states is None:
            data = timeline_data(obj, iteration, memory=memory, machine=machine)
            states = {"timeline": {"data": data}}
    elif states is None:
        reports, names = ranks_of(obj)
        base = reports[0]
        drawn = reports if obj is base else obj  # a run: a lane group per rank, divergence marked
        states = {
            "timeline": {
                "data": timeline_data(
                    drawn,
                    iteration,
                    memory=memory,
                    rank_names=None if obj is base else names,
                    machine=machine,
                )
            },
            "explorer": {"data": explorer_data(with_module_tree(base))},
            "prefetch": {"data": prefetch_data(base, -1 if iteration is None else iteration)},
        }
    unknown = set(states) - set(VIEWS)
    if unknown or not set(required) <= set(states):
        raise ExportError(
            f"states name the views {sorted(states)}; give 'timeline', and 'explorer' and "
            "'prefetch' where the page draws them"
        )
    return {
        "views": {name: dict(states[name]) if name in states else None for name in VIEWS},
        "divs": {name: f"fv-{name}" for name in VIEWS},
    }


def page_header(
    obj: Report | RecordedRun | Comparison,
    *,
    iteration: int | Literal["auto"] | None = "auto",
    title: str | None = None,
) -> tuple[str, str]:
    """The page's heading and its summary (an HTML ``<header>``), as :func:`html_page`
    writes them."""
    if isinstance(obj, Comparison):
        heading = title or f"fsdpviz comparison: {obj.name_a} vs {obj.name_b}"
        return heading, _comparison_header(obj, heading)
    iteration = opening_iteration(obj, iteration)
    reports, _ = ranks_of(obj)
    heading = title or _title(obj, reports[0])
    return heading, _header(obj, reports, heading, iteration)


# The variables of JupyterLab's theme the views read, from fsdpviz's colour table.
_THEME_VARIABLES = {
    "--jp-layout-color0": "bg",
    "--jp-layout-color1": "panel",
    "--jp-layout-color2": "call",
    "--jp-ui-font-color0": "fg",
    "--jp-ui-font-color1": "fg",
    "--jp-ui-font-color2": "muted",
    "--jp-border-color1": "border",
    "--jp-border-color2": "grid",
    "--fv-accent": "accent",
    "--fv-warn": "warn",
    "--fv-warn-bg": "warn_bg",
    "--fv-wait": "wait",
    "--fv-wait-fill": "wait_fill",
}


def _theme_css() -> str:
    """The page's light and dark colours: dark where the page says so
    (``data-jp-theme-light="false"``) or, with no flag, where the reader's OS is dark."""

    def block(theme: Literal["light", "dark"]) -> str:
        c = theme_colors(theme)
        return "".join(f"{var}: {c[key]}; " for var, key in _THEME_VARIABLES.items())

    return (
        f"body {{ {block('light')}}}\n"
        f'body[data-jp-theme-light="false"] {{ {block("dark")}}}\n'
        "@media (prefers-color-scheme: dark) {\n"
        f"  body:not([data-jp-theme-light]) {{ {block('dark')}}}\n"
        "}\n"
    )


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<meta name="generator" content="fsdpviz {version}">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body{theme_flag}>
{header}
{body}
<footer>Written by fsdpviz {version}. Works offline: everything it needs is in this file.</footer>
<script type="application/gzip" id="fv-config">{config}</script>
<script type="application/gzip" id="fv-widget-esm">{widget}</script>
{scripts}<script type="module">{page_js}</script>
</body>
</html>
"""
_TIMELINE_SECTION = """<section id="fv-timeline-section">
<h2>Timeline</h2>
<p class="fv-hint">Step with the buttons, the slider or the arrow keys (click the lanes first);
the unit of the current event is outlined in the explorer and the prefetch graph below.
Click a unit there to select it here and go to its next event.</p>
<div id="fv-timeline"></div>
</section>
{figures}"""


_FIGURES = '<section class="fv-figures">\n{divs}\n</section>'


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
    page script does (``unpack`` in ``js/src/page.ts``)."""
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
    if base.config.torch_version:
        verb = "predicted" if base.source == "prediction" else "recorded"
        rows.append(("FSDP", f"{base.config.whose_fsdp} ({verb})"))
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
    fit = _fit(base)
    if fit is not None:
        rows.append(("device memory", fit[1]))
    if base.source == "prediction":
        step, *throughput = _step_time(base).splitlines()
        rows.append(("step time (modelled)", step))
        if throughput:
            rows.append(("throughput (modelled)", throughput[0]))
    rows.append(("events", _event_counts(reports, iteration)))
    notes = [f"[{w.code}] {w.message.splitlines()[0]}" for w in base.warnings]
    findings = getattr(obj, "findings", None)
    if callable(findings):  # a recorded run: whether its ranks agree, and the details
        verdict, details = findings()
        rows.append(("ranks", verdict))
        notes += details
    items = summary_items(rows)
    warn = notes_list(notes, "warnings")
    verdict = ""
    if fit is not None:
        fits, text = fit
        mark, cls = ("✓", "fv-fits") if fits else ("✗", "fv-no-fit")
        verdict = f'<p class="fv-verdict {cls}">{mark} {html.escape(text)}</p>'
    return (
        f"<header><h1>{html.escape(heading)}</h1>{verdict}"
        f'<dl class="fv-summary">{items}</dl>{warn}</header>'
    )


def _comparison_header(cmp: Comparison, heading: str) -> str:
    """A comparison's summary: its verdict, the costs side by side, whether each plan fits."""
    a, b = cmp.reports or (None, None)
    rows: list[tuple[str, str]] = [("plans", f"{cmp.name_a} vs {cmp.name_b}: {cmp.verdict}")]
    for line in cmp.cost_lines():
        key, _, value = line.strip().partition(": ")
        rows.append((key, value))
    verdicts = []
    for name, report in ((cmp.name_a, a), (cmp.name_b, b)):
        fit = _fit(report) if report is not None else None
        if fit is None:
            continue
        rows.append((f"device memory, {name}", fit[1]))
        fits, text = fit
        mark, cls = ("✓", "fv-fits") if fits else ("✗", "fv-no-fit")
        verdicts.append(
            f'<p class="fv-verdict {cls}">{mark} {html.escape(name)}: {html.escape(text)}</p>'
        )
    items = summary_items(rows)
    return (
        f"<header><h1>{html.escape(heading)}</h1>{''.join(verdicts)}"
        f'<dl class="fv-summary">{items}</dl></header>'
    )


def summary_items(rows: list[tuple[str, str]]) -> str:
    """A page header's summary, each (name, value) of ``rows`` a term and its description
    (the items of its ``<dl class="fv-summary">``)."""
    return "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in rows)


def notes_list(notes: list[str], label: str) -> str:
    """A page header's ``notes`` as a list named ``label`` (for screen readers); "" for none."""
    if not notes:
        return ""
    return (
        f'<ul class="fv-warnings" aria-label="{label}">'
        + "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        + "</ul>"
    )


def _fit(report: Report) -> tuple[bool, str] | None:
    """Whether a prediction fits in its machine's memory, and that in words
    (``report.memory.fit_text()``); ``None`` for a recording or where it is not modelled."""
    memory = modelled_memory(report)
    if memory is None or memory.capacity <= 0:
        return None
    return memory.fits, memory.fit_text()


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
