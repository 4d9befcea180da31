"""What fsdpviz puts in a notebook's outputs, and in its report files, for JupyterLab.

Every output fsdpviz displays (``report.show()``, the card, a recording, a comparison, a
diagnosis) carries, beside its live widget (``application/vnd.jupyter.widget-view+json``,
which lives only as long as its kernel):

- :data:`MIME` (``application/vnd.fsdpviz.report+json``): the views' data, the page's
  config packed as the page packs it (:func:`fsdpviz.export._html.pack`). fsdpviz's
  JupyterLab extension (``js/src/lab/``, shipped in the wheel) draws the timeline, the
  explorer and the prefetch graph from it with the page's own front end, so a saved
  notebook reopens with its views, interactive, and no kernel;
- ``image/svg+xml``: the timeline and the plan as one static SVG
  (:func:`fsdpviz.views.overview_svg.overview_svg`, made in Python, no kaleido), for
  GitHub, nbviewer, ``jupyter nbconvert`` and editors without the extension;
- ``text/plain``.

A report file (``report.save("x.fsdpviz.json")``) holds the report as
:meth:`~fsdpviz.Report.to_dict` writes it (what :func:`fsdpviz.load` reads back) and,
under :data:`PAGE_KEY`, the same data with the page's summary: JupyterLab opens it from
the file browser as the page.

Example::

    bundle = output_bundle({"timeline": {"data": timeline_data(report)}}, report=report,
                           title="fsdpviz prediction", text=report.summary())
    bundle[MIME]["config"]       # the views' states, gzip + base64
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Unpack

from fsdpviz._version import __version__
from fsdpviz.export._html import VIEWS, pack, page_config, page_header
from fsdpviz.export._sources import ranks_of
from fsdpviz.schema.keywords import ReportFileKwargs
from fsdpviz.views.overview_svg import overview_svg

if TYPE_CHECKING:
    from fsdpviz.cost.hardware import Machine
    from fsdpviz.recording import RecordedRun
    from fsdpviz.schema.report import Report
    from fsdpviz.views.timeline_lanes import MemoryOption

__all__ = [
    "MIME",
    "PAGE_KEY",
    "SVG",
    "object_bundle",
    "output_bundle",
    "report_file",
    "report_mime",
]

MIME = "application/vnd.fsdpviz.report+json"
"""The mimetype of the views' data in a notebook output."""
SVG = "image/svg+xml"
PAGE_KEY = "fsdpviz_page"
"""The key of a report file (``.fsdpviz.json``, or a ``.json`` Chrome trace fsdpviz
wrote) that holds the page JupyterLab opens."""


def report_mime(
    states: Mapping[str, Mapping[str, Any]], *, title: str = "", header: str = ""
) -> dict[str, str]:
    """What :data:`MIME` holds: ``{"version", "title", "header", "config"}``, ``config``
    the views' ``states`` (each view's traits, as the page takes them) packed."""
    unknown = set(states) - set(VIEWS)
    if unknown or not states:
        raise ValueError(f"states name the views {sorted(states)}; give some of {VIEWS}")
    config = {
        "views": {name: dict(states[name]) if name in states else None for name in VIEWS},
        "divs": {name: f"fv-{name}" for name in VIEWS},
    }
    text = json.dumps(config, separators=(",", ":"), allow_nan=False)
    return {"version": __version__, "title": title, "header": header, "config": pack(text)}


def output_bundle(
    states: Mapping[str, Mapping[str, Any]],
    *,
    report: Report | None,
    title: str,
    text: str,
    base: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """``base`` (a widget's own bundle, or a card's) with :data:`MIME`, the static SVG
    (the timeline of ``states``, the units of ``report``) and ``text/plain`` added."""
    bundle = dict(base or {})
    bundle[MIME] = report_mime(states, title=title)
    timeline = states.get("timeline")
    bundle[SVG] = overview_svg(timeline["data"] if timeline else None, report, title)
    bundle.setdefault("text/plain", text)
    return bundle


def object_bundle(
    obj: Report | RecordedRun,
    *,
    base: Mapping[str, object] | None = None,
    iteration: int | Literal["auto"] | None = "auto",
    memory: MemoryOption = "auto",
    machine: Machine | str | None = "auto",
) -> dict[str, object]:
    """:func:`output_bundle` of a report or a recorded run, its views made from it as
    :meth:`~fsdpviz.Report.show` makes them (what the card and a run's card add)."""
    config = page_config(obj, iteration=iteration, memory=memory, machine=machine)
    states = {name: s for name, s in config["views"].items() if s is not None}
    heading, _ = page_header(obj, iteration=iteration)
    base_report = ranks_of(obj)[0][0]
    return output_bundle(states, report=base_report, title=heading, text=obj.summary(), base=base)


def report_file(obj: Report | RecordedRun, **kwargs: Unpack[ReportFileKwargs]) -> dict[str, Any]:
    """What a ``.fsdpviz.json`` file holds: ``obj.to_dict()`` and, under :data:`PAGE_KEY`,
    the page (its views, its summary). ``options``: ``iteration``, ``memory``,
    ``machine``, ``title``, as for the page."""
    options: dict[str, Any] = dict(kwargs)
    title = options.pop("title", None)
    iteration = options.get("iteration", "auto")
    config = page_config(obj, **options)
    states = {name: s for name, s in config["views"].items() if s is not None}
    heading, header = page_header(obj, iteration=iteration, title=title)
    return {**obj.to_dict(), PAGE_KEY: report_mime(states, title=heading, header=header)}
