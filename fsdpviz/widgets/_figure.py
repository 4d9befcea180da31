"""``ClickFigure``: a plotly ``FigureWidget`` whose hover events stay in the browser.

plotly's widget sends every hover, unhover and click to the kernel through one
synced trait. ipywidgets keeps at most one state message in flight and merges
the ones made meanwhile, so a click made while a hover is still in flight (a
busy kernel, or just a quick hand) is overwritten by the unhover that follows
it (an icicle sends one when the click zooms) and never reaches ``on_click``.
fsdpviz's views only listen to clicks, so this widget loads plotly's own front
end with hover and unhover left out of that traffic; the hover labels are drawn
in the browser as before. A click on the top module of the explorer reaches the
kernel without plotly's zoom (the explorer redraws from another module itself).
If a plotly release changes the front end so that the patch does not apply,
plotly's front end is used unchanged.
"""

from __future__ import annotations

import functools
import pathlib
import re
from typing import Any

import plotly
import plotly.graph_objects as go

__all__ = ["ClickFigure"]

_BUNDLE = pathlib.Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
_EXPORT = re.compile(r"export\{[^{}]*?\b([\w$]+) as FigureView\b[^{}]*\};")
_PATCH = """
;(function (View) {
  const proto = View && View.prototype;
  const send = proto && proto._send_points_callback_message;
  if (typeof send !== "function") return;
  proto._send_points_callback_message = function (data, type) {
    if (type === "plotly_hover" || type === "plotly_unhover") return;
    return send.call(this, data, type);
  };
  // A click on the top of a hierarchy, or on a module marked "▸" (its children are not
  // drawn), goes to the kernel as a click without plotly's own zoom: the explorer redraws
  // from another module itself (fsdpviz.views.tree.tree_view).
  const render = proto.perform_render;
  if (typeof render !== "function") return;
  proto.perform_render = function () {
    const out = render.apply(this, arguments);
    const view = this;
    const attach = function () {
      const gd = view.el;
      if (!gd || typeof gd.on !== "function") return false;
      const top = function (ev) {
        const pt = ev && ev.points && ev.points[0];
        const closed = pt && typeof pt.label === "string" && pt.label.endsWith(" \u25b8");
        if (!pt || (pt.parent && !closed)) return undefined;
        send.call(view, ev, "plotly_click");
        return false;
      };
      gd.on("plotly_icicleclick", top);
      gd.on("plotly_treemapclick", top);
      return true;
    };
    if (!attach()) Promise.resolve(out).then(attach);
    return out;
  };
})(%s);
"""


@functools.cache
def click_only_bundle() -> str | pathlib.Path:
    """plotly's widget front end with hover traffic left out (the file itself if it cannot be)."""
    source = _BUNDLE.read_text(encoding="utf-8")
    found = list(_EXPORT.finditer(source))
    if not found:
        return _BUNDLE
    return source + _PATCH % found[-1].group(1)


class ClickFigure(go.FigureWidget):  # type: ignore[misc]
    """A ``FigureWidget`` that sends clicks and selections to the kernel, not hovers.

    fsdpviz builds it with ``_validate=False`` (its figures are its own, and plotly's
    checks of a 1,000-node trace cost more than the re-plan that made it). plotly then
    stores what is assigned to a trace without telling the browser, so traces are
    changed through :meth:`restyle`, which does.
    """

    _esm = click_only_bundle()

    def restyle(self, index: int, props: dict[str, Any]) -> None:
        """Set ``props`` (``{"marker.line.width": [...], "ids": [...]}``) of trace ``index``,
        here and in the browser (only what changed is sent)."""
        self.plotly_restyle({key: [value] for key, value in props.items()}, trace_indexes=[index])
