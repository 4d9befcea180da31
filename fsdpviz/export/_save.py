"""``save``: one entry point, the format named by the path's suffix."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from fsdpviz.api.comparison import Comparison
from fsdpviz.errors import ConfigError, did_you_mean
from fsdpviz.export._html import html_page
from fsdpviz.export._image import FIGURES, IMAGE_FORMATS, figure, write_image
from fsdpviz.export._notebook import PAGE_KEY, report_file
from fsdpviz.export._sources import ranks_of
from fsdpviz.export._trace import chrome_trace
from fsdpviz.graphs import module_graph, unit_graph, write_graph
from fsdpviz.schema.keywords import SaveKwargs
from fsdpviz.views.tree import with_module_tree

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun
    from fsdpviz.schema.report import Report

__all__ = ["SUFFIXES", "save"]

NODE_LINK = ".nodelink.json"
REPORT_JSON = ".fsdpviz.json"
SUFFIXES: dict[str, str] = {
    ".html": "interactive page: summary, explorer, prefetch graph, timeline (self-contained)",
    REPORT_JSON: "the report as JSON (fsdpviz.load reads it back; JupyterLab opens it as the page)",
    ".json": "Chrome trace (Perfetto, chrome://tracing) that fsdpviz.load reads back",
    NODE_LINK: "the unit or module graph as networkx node-link JSON",
    ".graphml": "the unit or module graph as GraphML",
    **{s: f"one figure as {f.upper()} (kaleido)" for s, f in IMAGE_FORMATS.items()},
}
"""Every suffix :func:`save` writes, with what it writes."""

_OPTIONS: dict[str, tuple[str, ...]] = {
    "html": ("theme", "iteration", "memory", "title", "machine"),
    "image": ("figure", "theme", "iteration", "memory", "width", "height", "scale", "machine"),
    "json": ("iteration", "machine", "indent"),
    "report": ("iteration", "memory", "title", "machine", "indent"),
    "graph": ("graph", "iteration"),
}


def suffix_of(path: str | Path) -> str:
    """The suffix :func:`save` dispatches on (``.nodelink.json`` and ``.fsdpviz.json`` count
    as one), lower case."""
    name = Path(path).name.lower()
    if name.endswith(NODE_LINK):
        return NODE_LINK
    if name.endswith(REPORT_JSON):
        return REPORT_JSON
    return Path(name).suffix


def save(
    obj: Report | RecordedRun | Comparison, path: str | Path, **kwargs: Unpack[SaveKwargs]
) -> Path:
    """Write ``obj`` (a :class:`~fsdpviz.Report` or :class:`~fsdpviz.RecordedRun`; a
    :class:`~fsdpviz.Comparison` as a page) to ``path``.

    The format follows the suffix (case-insensitive):

    - ``.html``: one self-contained page (no kernel, no network): summary, the
      step-through timeline, the wrap-unit explorer and the prefetch graph, linked, drawn
      by the front end the notebook's widgets use (inlined in the page, no plotly.js).
      Options: ``theme`` (``"auto"``: the reader's OS setting, the default; ``"light"`` |
      ``"dark"``), ``iteration``
      (default: the steady state, ``-1``, or a recording's first iteration where its
      ranks diverge; ``None`` for all), ``memory`` (``"auto"``: the
      memory model; ``None``: no curve; or bytes per event, or ``report -> bytes``),
      ``title``, ``machine`` (times the timeline of a prediction that has a trace
      profile; default ``"auto"``, the machine the report was planned for; ``None``: by
      event index).
    - ``.png``, ``.svg``, ``.pdf``, ``.jpeg``/``.jpg``, ``.webp``: one figure through
      kaleido (needs Chromium). Options: ``figure`` (``"explorer"`` (default),
      ``"prefetch"``, ``"timeline"``), ``width``, ``height``, ``scale``, ``theme``,
      ``iteration``, ``memory``, ``machine``.
    - ``.fsdpviz.json``: the report as JSON (:meth:`~fsdpviz.Report.to_dict`, which
      :func:`fsdpviz.load` reads back) with its page (the views' data and the summary,
      packed): JupyterLab with fsdpviz opens it from the file browser as the interactive
      page. Options as for ``.html`` (not ``theme``), and ``indent``.
    - ``.json``: a Chrome trace (Trace Event Format) holding the report too, so that
      Perfetto opens it and :func:`fsdpviz.load` reads it back, and the page (JupyterLab's
      "Open With > fsdpviz report"). Options: ``iteration``
      (default ``None``, all), ``machine`` (times a prediction; default ``"auto"``,
      the machine it was planned for),
      ``indent``.
    - ``.graphml`` and ``.nodelink.json``: the unit graph (``graph="unit"``, default) or
      the module tree (``graph="module"``); ``iteration`` picks the unit graph's.

    A recorded run's ``.html``, timeline image and ``.json`` show every rank.
    Returns the path written.

    Example::

        report.save("report.html", theme="dark")
        report.save("report.fsdpviz.json")      # fsdpviz.load reads it; JupyterLab opens it
        report.save("units.svg", figure="explorer")
        run.save("run.json")                     # open in https://ui.perfetto.dev
    """
    options: dict[str, Any] = dict(kwargs)  # each format takes some, checked below
    p = Path(path)
    suffix = suffix_of(p)
    if suffix == ".html":
        _check("html", suffix, options)
        text = html_page(obj, **options)
        p.write_text(text, encoding="utf-8")
        return p
    if isinstance(obj, Comparison):
        raise ConfigError(
            f"a comparison is saved as a page (.html), not {suffix or 'a file without suffix'}; "
            "save each plan's report for the other formats"
        )
    if suffix in IMAGE_FORMATS:
        _check("image", suffix, options)
        name = options.pop("figure", "explorer")
        if name not in FIGURES:
            raise ConfigError(f"figure={name!r} is not one of {', '.join(map(repr, FIGURES))}")
        size = {k: options.pop(k) for k in ("width", "height", "scale") if k in options}
        fig = figure(obj, name, width=size.get("width"), **options)
        return write_image(fig, p, **size)
    if suffix == REPORT_JSON:
        _check("report", suffix, options)
        indent = options.pop("indent", None)
        text = json.dumps(report_file(obj, **options), indent=indent, allow_nan=False)
        p.write_text(text + "\n", encoding="utf-8")
        return p
    if suffix == ".json":
        _check("json", suffix, options)
        indent = options.pop("indent", None)
        trace = chrome_trace(obj, **options)
        # the page, for JupyterLab's "Open With > fsdpviz report" (its views as the page's)
        page = {"machine": options["machine"]} if "machine" in options else {}
        trace[PAGE_KEY] = report_file(obj, **page)[PAGE_KEY]
        text = json.dumps(trace, indent=indent, allow_nan=False)
        p.write_text(text + "\n", encoding="utf-8")
        return p
    if suffix in (".graphml", NODE_LINK):
        _check("graph", suffix, options)
        return _write_graph(obj, p, **options)
    known = "\n".join(f"  {s:<15} {what}" for s, what in SUFFIXES.items())
    raise ConfigError(
        f"cannot save to {str(p)!r}: unknown suffix {suffix or '(none)'!r}. Use one of:\n{known}"
    )


def _check(kind: str, suffix: str, options: Mapping[str, object]) -> None:
    check_options(options, _OPTIONS[kind], f"{suffix} files")


def check_options(
    options: Mapping[str, object], allowed: tuple[str, ...] | list[str], what: str
) -> None:
    """Refuse an option not in ``allowed`` for ``what`` (``".html files"``), with the
    nearest name and the ones there are."""
    for key in options:
        if key not in allowed:
            tip = did_you_mean(key, allowed)
            raise ConfigError(
                f"unknown option {key!r} for {what}{tip} (options: {', '.join(allowed)})"
            )


def _write_graph(
    obj: Report | RecordedRun, p: Path, *, graph: str = "unit", iteration: int = -1
) -> Path:
    report = ranks_of(obj)[0][0]
    if graph == "unit":
        g = unit_graph(report, iteration)
    elif graph == "module":
        g = module_graph(with_module_tree(report))
    else:
        raise ConfigError(f"graph={graph!r} is not valid; use 'unit' or 'module'")
    return write_graph(g, p)  # a .nodelink.json path ends in .json: node-link JSON
