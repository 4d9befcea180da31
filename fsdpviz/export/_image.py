"""Static images of plotly figures through kaleido (which drives a local Chromium)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import ExportError
from fsdpviz.export._sources import ranks_of
from fsdpviz.views import explorer_figure, prefetch_figure, timeline_data, timeline_figure
from fsdpviz.views.style import Theme
from fsdpviz.views.timeline_lanes import MemoryOption
from fsdpviz.views.tree import with_module_tree

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from fsdpviz.recording import RecordedRun
    from fsdpviz.schema.report import Report

__all__ = ["FIGURES", "IMAGE_FORMATS", "figure", "write_image"]

IMAGE_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf", ".jpeg": "jpeg", ".jpg": "jpeg",
                 ".webp": "webp"}  # fmt: skip
FigureName = Literal["explorer", "prefetch", "timeline"]
FIGURES: tuple[FigureName, ...] = ("explorer", "prefetch", "timeline")
DEFAULT_WIDTH = 1100
DEFAULT_HEIGHT = 520

_INSTALL = (
    "install one with `apt-get install -y chromium` (Debian/Ubuntu), or let plotly download "
    "one with `plotly_get_chrome` (shell) or `kaleido.get_chrome_sync()` (Python); "
    "or point to an existing one with BROWSER_PATH=/path/to/chromium"
)


def figure(
    obj: Report | RecordedRun,
    name: FigureName = "explorer",
    *,
    theme: Theme = "light",
    iteration: int | None = -1,
    memory: MemoryOption = "auto",
    machine: Machine | str | None = "auto",
    width: int | None = None,
) -> go.Figure:
    """One view of ``obj`` as a plotly figure: ``"explorer"``, ``"prefetch"`` or ``"timeline"``.

    A recorded run's explorer and prefetch graph show its first rank; its timeline
    shows every rank. ``width``: the image's (default :data:`DEFAULT_WIDTH`), whose blocks
    the explorer's labels are fitted to.
    """
    reports, names = ranks_of(obj)
    if name == "explorer":
        return explorer_figure(
            with_module_tree(reports[0]), theme=theme, width=width or DEFAULT_WIDTH
        )
    if name == "prefetch":
        return prefetch_figure(reports[0], -1 if iteration is None else iteration, theme=theme)
    if name == "timeline":
        drawn = reports if len(reports) == 1 and obj is reports[0] else obj
        data = timeline_data(
            drawn,
            iteration,
            memory=memory,
            rank_names=None if obj is reports[0] else names,
            machine=machine,
        )
        return timeline_figure(reports, iteration, theme=theme, data=data)
    raise ValueError(f"unknown figure {name!r}; use one of {', '.join(map(repr, FIGURES))}")


def write_image(
    fig: go.Figure | dict[str, Any],
    path: str | Path,
    *,
    format: str | None = None,
    width: int | None = None,
    height: int | None = None,
    scale: float | None = None,
) -> Path:
    """Write any plotly figure to ``path`` as PNG, SVG, PDF, JPEG or WebP; returns the path.

    ``format`` defaults to the suffix. ``width`` / ``height`` (layout pixels) default to
    the figure's own size, else 1100 x 520; ``scale`` multiplies the pixels of raster
    formats (2 for a sharp PNG). Needs a Chromium-based browser on this machine (kaleido
    drives it); raises :class:`fsdpviz.ExportError` saying how to install one when there
    is none.

    Example::

        write_image(fsdpviz.views.explorer_figure(report), "units.png", scale=2)
    """
    import kaleido
    from kaleido.errors import BrowserClosedError, BrowserFailedError, ChromeNotFoundError

    p = Path(path)
    fmt = format or IMAGE_FORMATS.get(p.suffix.lower())
    if fmt not in IMAGE_FORMATS.values():
        raise ValueError(
            f"cannot write an image to {str(p)!r}: unknown format {fmt or p.suffix!r}; "
            f"use a path ending in {', '.join(IMAGE_FORMATS)}"
        )
    spec = fig if isinstance(fig, dict) else fig.to_dict()
    layout = spec.get("layout", {})
    opts = {
        "format": fmt,
        "width": width or layout.get("width") or DEFAULT_WIDTH,
        "height": height or layout.get("height") or DEFAULT_HEIGHT,
        "scale": scale or 1,
    }
    try:
        with _quiet_pipe_glitches():
            data = kaleido.calc_fig_sync(spec, opts=opts)
    except ChromeNotFoundError as exc:
        raise ExportError(f"cannot write {str(p)!r}: {_no_browser()}") from exc
    except (BrowserFailedError, BrowserClosedError) as exc:  # found, but did not run
        raise ExportError(
            f"cannot write {str(p)!r}: the browser kaleido uses failed to start ({exc}); {_INSTALL}"
        ) from exc
    p.write_bytes(data)
    return p


class _PipeGlitch(logging.Filter):
    """Drops the one log record choreographer writes, with a traceback, when it reads a
    message from the browser's pipe it cannot decode and then goes on without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("JSONError decoding message. Ignoring")


@contextmanager
def _quiet_pipe_glitches() -> Iterator[None]:
    logger = logging.getLogger("choreographer.channels.pipe")
    glitch = _PipeGlitch()
    logger.addFilter(glitch)
    try:
        yield
    finally:
        logger.removeFilter(glitch)


def _no_browser() -> str:
    where = os.environ.get("BROWSER_PATH")
    if where:
        return (
            f"no Chromium at BROWSER_PATH={where!r}, which kaleido needs to draw images; "
            f"fix BROWSER_PATH, or unset it and {_INSTALL}"
        )
    return f"no Chromium-based browser found, which kaleido needs to draw images; {_INSTALL}"
