"""What the three views of fsdpviz's front end share: one ES module (``js/src/widget.ts``,
bundled into ``fsdpviz/static/widget.js``) draws the timeline, the explorer and the
prefetch graph, in the notebook and in the exported page alike.

Each view is an anywidget whose ``view`` trait names what the module draws. ``busy`` is
set while a re-plan is on its way (the view shows none of the old plan's numbers
meanwhile) and cleared with the new plan's data; ``error`` carries an error the browser
met back to Python (the dashboard shows it under the views).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import anywidget
import traitlets

__all__ = ["DATA", "STATIC", "FrontEnd", "check_built"]

STATIC = Path(__file__).resolve().parent.parent / "static"
"""Where the built front end is (``widget.js``, ``widget.css``, ``page.js``)."""


def check_built() -> None:
    """Raise, saying how to build it, when the front end was not built."""
    if not (STATIC / "widget.js").exists():
        raise FileNotFoundError(
            f"{STATIC / 'widget.js'} is missing: the front end was not built. Build it with "
            "`npm --prefix js ci && npm --prefix js run build` from a source checkout, or "
            "reinstall fsdpviz from a wheel"
        )


def _to_buffer(value: Any, widget: Any) -> memoryview:
    return memoryview(json.dumps(value, separators=(",", ":"), allow_nan=False).encode())


def _from_buffer(value: Any, widget: Any) -> Any:
    return json.loads(bytes(value))


DATA = {"sync": True, "to_json": _to_buffer, "from_json": _from_buffer}
"""How a view's ``data`` trait is synced: as UTF-8 JSON in one binary buffer. ipywidgets
then neither walks the (big, nested) data for buffers nor encodes it again as part of the
message; the front end reads it with ``dataOf`` (``js/src/wire.ts``)."""


class FrontEnd(anywidget.AnyWidget):
    """One view of fsdpviz's front end (see the module docstring)."""

    _esm = STATIC / "widget.js"
    _css = STATIC / "widget.css"

    view = traitlets.Unicode("timeline").tag(sync=True)
    busy = traitlets.Bool(False).tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)

    PAGE_TRAITS: ClassVar[tuple[str, ...]] = ("data",)
    """The traits the exported page draws the view from (its state there)."""

    def __init__(self, **kwargs: Any) -> None:
        check_built()
        super().__init__(**kwargs)

    def page_state(self) -> dict[str, Any]:
        """This view's state as the exported page takes it (``fsdpviz.export.html_page``'s
        ``states``): the view is drawn there as it is here."""
        return {name: getattr(self, name) for name in self.PAGE_TRAITS}
