"""Write reports and recorded runs to files: HTML, images, Chrome traces, graphs.

May import every layer up to the views (not the widgets).

:func:`save` picks the format from the suffix (``report.save(path)`` and
``run.save(path)`` call it): ``.html`` (one self-contained interactive page),
``.png`` / ``.svg`` / ``.pdf`` / ``.jpeg`` / ``.webp`` (one figure, through
kaleido), ``.json`` (a Chrome trace that :func:`fsdpviz.load` reads back),
``.graphml`` and ``.nodelink.json`` (the unit or module graph). :data:`SUFFIXES`
lists them and :func:`suffix_of` gives a path's. :func:`write_image` writes any
plotly figure; :func:`chrome_trace` and :func:`html_page` return what ``.json``
and ``.html`` files hold; :func:`page_script` reads a page's packed data back.
:func:`output_bundle` and :func:`object_bundle` make what fsdpviz's notebook outputs hold
beside a live widget (:data:`MIME`, the views' data that fsdpviz's JupyterLab extension
draws without a kernel, and a static SVG); :func:`report_file` what ``.fsdpviz.json``
files hold. :func:`tune_page` is the page of a tuning (``tuning.save("tune.html")``) and
:func:`save_tuning` writes it or its image.

Example::

    report = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=8)
    report.save("report.html")                 # open in any browser, offline
    report.save("units.pdf", figure="explorer")
    report.save("trace.json")                  # https://ui.perfetto.dev, or fsdpviz.load
"""

from __future__ import annotations

from fsdpviz.export._html import html_page, page_script
from fsdpviz.export._image import write_image
from fsdpviz.export._notebook import MIME, PAGE_KEY, object_bundle, output_bundle, report_file
from fsdpviz.export._save import SUFFIXES, save, suffix_of
from fsdpviz.export._trace import chrome_trace
from fsdpviz.export._tune_page import save_tuning, tune_page

__all__ = [
    "MIME",
    "PAGE_KEY",
    "SUFFIXES",
    "chrome_trace",
    "html_page",
    "object_bundle",
    "output_bundle",
    "page_script",
    "report_file",
    "save",
    "save_tuning",
    "suffix_of",
    "tune_page",
    "write_image",
]
