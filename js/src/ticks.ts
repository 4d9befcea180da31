// Axis labels that never overlap: the prefetch graph lists every unit's name in
// layout.meta.fsdpviz_ticks (fsdpviz.views.prefetch), and the page keeps every k-th of
// them, so that labels stand min_px apart at the width drawn (plotly then rotates them
// as far as they need). fsdpviz.widgets._figure does the same in the notebook widget.

/** What layout.meta.fsdpviz_ticks holds: positions one apart, their labels, the spacing. */
export interface TickList {
  vals: number[];
  text: string[];
  min_px: number;
}

/** Every k-th tick of `ticks`, for an axis `lengthPx` long showing `span` positions. */
export function thinnedTicks(
  ticks: TickList,
  lengthPx: number,
  span: number,
): { vals: number[]; text: string[] } {
  const step = Math.max(1, Math.ceil((ticks.min_px * Math.max(span, 1e-9)) / lengthPx));
  const vals: number[] = [];
  const text: string[] = [];
  for (let k = 0; k < ticks.vals.length; k += step) {
    vals.push(ticks.vals[k]);
    text.push(ticks.text[k]);
  }
  return { vals, text };
}

/** A drawn plotly graph div, as far as thinning its x ticks reads it. */
export interface TickedDiv {
  layout?: { meta?: { fsdpviz_ticks?: TickList }; xaxis?: { tickvals?: number[] } };
  _fullLayout?: { xaxis?: { _length?: number; range?: number[] } };
}

/** The x-axis update that thins `gd`'s ticks to its width, or null when nothing changes. */
export function tickUpdate(gd: TickedDiv): Record<string, unknown> | null {
  const ticks = gd.layout?.meta?.fsdpviz_ticks;
  const ax = gd._fullLayout?.xaxis;
  if (!ticks || !ax?._length || !Array.isArray(ax.range) || ax.range.length < 2) return null;
  const { vals, text } = thinnedTicks(ticks, ax._length, Math.abs(ax.range[1] - ax.range[0]));
  const now = gd.layout?.xaxis?.tickvals ?? [];
  if (now.length === vals.length && vals.every((v, k) => now[k] === v)) return null;
  return { "xaxis.tickvals": vals, "xaxis.ticktext": text };
}
