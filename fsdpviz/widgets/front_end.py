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
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

import anywidget
import traitlets

from fsdpviz.export import output_bundle
from fsdpviz.widgets._memo import SIZE

if TYPE_CHECKING:
    from fsdpviz.schema.report import Report

__all__ = [
    "DATA",
    "STATIC",
    "FrontEnd",
    "TraitChange",
    "TraitProposal",
    "check_built",
    "saved_output",
    "with_saved_views",
]


class TraitChange(TypedDict):
    """What traitlets passes an observer (``widget.observe(handler, names=...)``): the
    trait's ``name``, its ``old`` and ``new`` value, the widget that ``owner``s it and the
    ``type`` of change (``"change"``). The values are those of whichever trait changed."""

    name: str
    old: Any
    new: Any
    owner: Any
    type: str


class TraitProposal(TypedDict):
    """What traitlets passes a ``@traitlets.validate`` method: the ``trait``, the proposed
    ``value`` and the widget that ``owner``s it."""

    trait: Any
    value: Any
    owner: Any


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
    kept: OrderedDict[int, tuple[Any, bytes | None]] | None = getattr(widget, "_kept", None)
    entry = kept.get(id(value)) if kept is not None else None
    if entry is not None and entry[0] is value and entry[1] is not None:
        return memoryview(entry[1])  # kept by the view (see FrontEnd._keep_encoded)
    encoded = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    if kept is not None and entry is not None and entry[0] is value:
        kept[id(value)] = (value, encoded)
    return memoryview(encoded)


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
    saved_output = traitlets.Dict().tag(sync=True)
    """What the notebook output this view is in should hold now (its mimetypes and their
    data: :func:`with_saved_views`'s, without the live widget), set after a re-plan;
    fsdpviz's JupyterLab extension puts it in the output, so a saved notebook keeps the
    plan on screen (the view sends it up the page, ``js/src/widget.ts``)."""

    PAGE_TRAITS: ClassVar[tuple[str, ...]] = ("data",)
    """The traits the exported page draws the view from (its state there)."""

    def __init__(self, **kwargs: Any) -> None:
        check_built()
        super().__init__(**kwargs)

    def _keep_encoded(self, *values: Any) -> None:
        """Encode ``values`` (data the view remembers per plan, never changed in place)
        once, the first time they are sent; the last ``2 * SIZE`` are kept: going back to
        a plan sends the same bytes without encoding them again."""
        if not hasattr(self, "_kept"):  # (a subclass may make its data before __init__)
            self._kept: OrderedDict[int, tuple[Any, bytes | None]] = OrderedDict()
        for value in values:
            if id(value) not in self._kept or self._kept[id(value)][0] is not value:
                self._kept[id(value)] = (value, None)
            self._kept.move_to_end(id(value))
        while len(self._kept) > 2 * SIZE:
            self._kept.popitem(last=False)

    def page_state(self) -> dict[str, Any]:
        """This view's state as the exported page takes it (``fsdpviz.export.html_page``'s
        ``states``): the view is drawn there as it is here."""
        return {name: getattr(self, name) for name in self.PAGE_TRAITS}

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[Any, Any], dict[Any, Any]] | None:
        """The live view and, for the notebook once saved, the view's data (drawn by
        fsdpviz's JupyterLab extension without a kernel) and a static SVG of it."""
        shown = super()._repr_mimebundle_(**kwargs)
        if shown is None:
            return None
        bundle, metadata = shown
        report = self.shown_report()
        title = f"fsdpviz {self.view}" + (f": {_first_line(report)}" if report else "")
        states = {self.view: self.page_state()}
        return with_saved_views(bundle, states, report, title, title), metadata

    def shown_report(self) -> Report | None:
        """The report whose plan the static image of the view shows (``None``: none)."""
        return None


def _first_line(report: Report) -> str:
    return report.summary().splitlines()[0].removeprefix("fsdpviz ")


def saved_output(
    states: Mapping[str, Mapping[str, Any]], report: Report | None, title: str, text: str
) -> dict[str, object]:
    """What an output showing ``states`` saves (:func:`with_saved_views` without a widget):
    the value of a view's ``saved_output`` trait."""
    return with_saved_views({}, states, report, title, text)


def with_saved_views(
    bundle: dict[str, object],
    states: Mapping[str, Mapping[str, Any]],
    report: Report | None,
    title: str,
    text: str,
) -> dict[str, object]:
    """A widget's display ``bundle`` with what outlives its kernel
    (:func:`fsdpviz.export.output_bundle`: the views' ``states`` for fsdpviz's JupyterLab
    extension, a static SVG with ``report``'s units) and ``text`` as its ``text/plain``.
    Where those cannot be made, the widget's bundle, saying why in its ``text/plain``."""
    try:
        return output_bundle(states, report=report, title=title, text=text, base=bundle) | {
            "text/plain": text
        }
    except (ValueError, TypeError, KeyError) as e:
        return bundle | {"text/plain": f"{text}\n(no saved views: {type(e).__name__}: {e})"}
