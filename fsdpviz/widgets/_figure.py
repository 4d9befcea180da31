"""``ClickFigure``: a plotly ``FigureWidget`` whose hover events stay in the browser.

plotly's widget sends every hover, unhover and click to the kernel through one
synced trait. ipywidgets keeps at most one state message in flight and merges
the ones made meanwhile, so a click made while a hover is still in flight (a
busy kernel, or just a quick hand) is overwritten by the unhover that follows
it (an icicle sends one when the click zooms) and never reaches ``on_click``.
fsdpviz's views only listen to clicks, so this widget loads plotly's own front
end with hover and unhover left out of that traffic; the hover labels are drawn
in the browser as before. A click on the top module of the explorer reaches the
kernel without plotly's zoom (the explorer redraws from another module itself);
a click that zooms out (the path bar) selects nothing. The figure fills the width
of its output and follows it, and tick labels listed in ``layout.meta.fsdpviz_ticks``
are thinned to the width drawn (the prefetch graph's unit names). If a plotly
release changes the front end so that the patch does not apply, plotly's front end
is used unchanged.
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
_PLOTLY = re.compile(r"\b([\w$]+)\.default\.newPlot\(")
_PATCH = """
;(function (View, Plotly) {
  const proto = View && View.prototype;
  const send = proto && proto._send_points_callback_message;
  if (typeof send !== "function") return;
  proto._send_points_callback_message = function (data, type) {
    if (type === "plotly_hover" || type === "plotly_unhover") return;
    if (type === "plotly_click" && this._fvZoomOut) {
      this._fvZoomOut = false;  // a click that zooms out selects nothing
      return;
    }
    return send.call(this, data, type);
  };
  const render = proto.perform_render;
  const remove = proto.remove;
  if (typeof render !== "function") return;
  if (typeof remove === "function") {
    proto.remove = function () {
      if (this._fvResize) this._fvResize.disconnect();
      return remove.apply(this, arguments);
    };
  }
  // Whether hierarchy node `id` is `level` or one of its ancestors.
  const above = function (gd, id, level) {
    const t = gd.data && gd.data[0];
    if (!t || !t.ids || !t.parents) return false;
    const parent = new Map();
    for (let i = 0; i < t.ids.length; i++) parent.set(t.ids[i], t.parents[i]);
    for (let x = level; x; x = parent.get(x)) if (x === id) return true;
    return false;
  };
  // Tick labels listed in layout.meta.fsdpviz_ticks ({vals, text, min_px}; vals one apart):
  // every k-th, so that labels stand at least min_px apart at the width drawn.
  const thinTicks = function (gd) {
    const ticks = gd.layout && gd.layout.meta && gd.layout.meta.fsdpviz_ticks;
    const ax = gd._fullLayout && gd._fullLayout.xaxis;
    if (!Plotly || !ticks || !ax || !ax._length || !Array.isArray(ax.range)) return;
    const span = Math.abs(ax.range[1] - ax.range[0]) || 1;
    const step = Math.max(1, Math.ceil((ticks.min_px * span) / ax._length));
    const vals = [];
    const text = [];
    for (let k = 0; k < ticks.vals.length; k += step) {
      vals.push(ticks.vals[k]);
      text.push(ticks.text[k]);
    }
    const now = (gd.layout.xaxis && gd.layout.xaxis.tickvals) || [];
    if (now.length === vals.length && vals.every(function (v, k) { return now[k] === v; })) return;
    Plotly.relayout(gd, { "xaxis.tickvals": vals, "xaxis.ticktext": text });
  };
  proto.perform_render = function () {
    const out = render.apply(this, arguments);
    const view = this;
    const attach = function () {
      const gd = view.el;
      if (!gd || typeof gd.on !== "function") return false;
      // A click on a module marked "\u25b8" (its children are not drawn), or on the top
      // of a figure drawn from a module below the model's root, goes to the kernel as a
      // click without plotly's own zoom: the explorer redraws from another module itself
      // (fsdpviz.views.tree.tree_view). A click that zooms out (the path bar, or the
      // block zoomed into) is plotly's alone.
      const hierarchy = function (ev) {
        view._fvZoomOut = false;
        const pt = ev && ev.points && ev.points[0];
        if (!pt) return undefined;
        const closed = typeof pt.label === "string" && pt.label.endsWith(" \u25b8");
        const trace = gd._fullData && gd._fullData[pt.curveNumber || 0];
        const level = (trace && trace.level) || "";
        const atTop = !level || level === pt.id;
        if (closed || (!pt.parent && pt.id !== "<root>" && atTop)) {
          send.call(view, ev, "plotly_click");
          return false;
        }
        if (level && above(gd, pt.id, level)) view._fvZoomOut = true;
        return undefined;
      };
      gd.on("plotly_icicleclick", hierarchy);
      gd.on("plotly_treemapclick", hierarchy);
      gd.on("plotly_afterplot", function () { thinTicks(gd); });
      thinTicks(gd);
      // The figure fills its output and follows its resizes (plotly's widget sizes it
      // once, often before it is attached: 700 px).
      if (typeof ResizeObserver === "function" && !view._fvResize) {
        let width = 0;
        view._fvResize = new ResizeObserver(function (entries) {
          const w = Math.round(entries[entries.length - 1].contentRect.width);
          if (w > 0 && w !== width) {
            width = w;
            const full = gd._fullLayout;
            if (full && Math.round(full.width) !== w) view.autosizeFigure();
          }
        });
        view._fvResize.observe(gd);
      }
      return true;
    };
    if (!attach()) Promise.resolve(out).then(attach);
    return out;
  };
})(%s, %s);
"""


@functools.cache
def click_only_bundle() -> str | pathlib.Path:
    """plotly's widget front end with hover traffic left out (the file itself if it cannot be)."""
    source = _BUNDLE.read_text(encoding="utf-8")
    found = list(_EXPORT.finditer(source))
    if not found:
        return _BUNDLE
    plotly_js = _PLOTLY.search(source)
    plotly_ref = f"{plotly_js.group(1)}.default" if plotly_js else "null"
    return source + _PATCH % (found[-1].group(1), plotly_ref)


class ClickFigure(go.FigureWidget):  # type: ignore[misc]
    """A ``FigureWidget`` that sends clicks and selections to the kernel, not hovers.

    fsdpviz builds it with ``_validate=False`` (its figures are its own, and plotly's
    checks of a 1,000-node trace cost more than the re-plan that made it). plotly then
    stores what is assigned to a trace without telling the browser, so traces are
    changed through :meth:`restyle`, which does.
    """

    _esm = click_only_bundle()

    def set_level(self, index: int, level: str) -> None:
        """Zoom hierarchy trace ``index`` to the node with id ``level``, in the browser too.

        A click zooms in the browser without telling the kernel the new level, so the
        level is sent even when it is the one the kernel last set."""
        if self.data[index].level == level:
            self._send_restyle_msg({"level": [level]}, trace_indexes=[index])
        else:
            self.plotly_restyle({"level": [level]}, trace_indexes=[index])

    def restyle(self, index: int, props: dict[str, Any]) -> None:
        """Set ``props`` (``{"marker.line.color": [...], "ids": [...]}``) of trace ``index``,
        here and in the browser (only what changed is sent)."""
        self.plotly_restyle({key: [value] for key, value in props.items()}, trace_indexes=[index])
