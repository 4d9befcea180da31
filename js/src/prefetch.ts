// The prefetch graph drawn on a canvas, from the data fsdpviz.views.prefetch_data writes:
// units on one line in forward order, forward order along it, forward prefetches arcing
// above, backward prefetches below (vermillion where FSDP picks the wrong unit or prefetches
// too late). Where the units do not fit at a readable spacing the graph shows a window of
// them that follows the current unit, with an overview of all of them underneath; a drag,
// ctrl/shift + wheel, the buttons or a click in the overview move it. A click on a unit, or
// on an arc (its target), selects that unit.
import { CanvasView } from "./canvas_view";
import { dashPattern, element, fitText, sizeCanvas } from "./dom";
import { moduleName, quote } from "./format";
import { FONT, type ThemeColors, takeTheme, textOn } from "./theme";

export interface PrefetchData {
  title: string;
  notes: string[];
  /** Unit names in forward order: the x axis. */
  units: string[];
  /** Each unit's index in report.units (the number every view prints). */
  numbers: number[];
  colors: string[];
  hover: string[][];
  never: boolean[];
  edges: { kind: number[]; source: number[]; target: number[]; text: string[] };
  kinds: Array<{ name: string; label: string; color: string; dash: string; side: number }>;
}

const PAD_X = 28;
/** Units stand at least this far apart before the graph shows a window of them. */
export const MIN_SPACING = 22;
const R_MAX = 10;
const R_MIN = 3;
const ARC_TOP = 96;
const ARC_BOTTOM = 112;
const ARC_MISSED = 40;
const LABEL_MAX = 150;
const LABEL_GAP = 14; // px between upright names (11 px text)
const OVERVIEW_H = 22;

/** The units shown: positions [u0, u1) of the forward order. */
export interface UnitWindow {
  u0: number;
  u1: number;
}

/** What a pointer is on: a unit (its position) or an edge (its index). */
export type PrefetchPick = { kind: "unit"; u: number } | { kind: "edge"; e: number } | null;

/** One text per thing a pointer can be on: "" for nothing. */
const pickKey = (p: PrefetchPick): string =>
  p === null ? "" : p.kind === "unit" ? `u${p.u}` : `e${p.e}`;

export interface PrefetchEvents {
  /** A click chose `unit` (by its node, its name, or an arc into it). */
  select?(unit: string): void;
}

/** The vertical layout of the canvas (CSS pixels). */
export interface PrefetchLayout {
  width: number;
  height: number;
  plotW: number;
  baseY: number;
  top: number;
  bottom: number;
  labelTop: number;
  labelH: number;
  upright: boolean;
  overviewTop: number;
  /** Whether the overview strip is drawn (the units do not all fit). */
  windowed: boolean;
}

/** The layout of `data` on a canvas `width` px wide; `measure` gives a text's width. */
export function prefetchLayout(
  data: PrefetchData,
  width: number,
  measure: (text: string) => number,
): PrefetchLayout {
  const n = data.units.length;
  const plotW = Math.max(width - 2 * PAD_X, 60);
  const sides = new Set(data.edges.kind.map((k) => data.kinds[k]?.side ?? 0));
  const above = [...sides].some((s) => s > 0);
  const below = [...sides].some((s) => s < 0);
  const missed = [...sides].some((s) => s < -1);
  const top = above ? ARC_TOP : 12;
  const bottom = below ? ARC_BOTTOM + (missed ? ARC_MISSED : 0) : 12;
  const baseY = top + R_MAX;
  const spacing = Math.max(plotW / Math.max(n, 1), MIN_SPACING);
  const widest = Math.min(Math.max(0, ...data.units.map((u) => measure(moduleName(u)))), LABEL_MAX);
  const upright = widest + 6 > spacing;
  const labelTop = baseY + R_MAX + bottom;
  const labelH = upright ? widest + 10 : 18;
  const windowed = n * MIN_SPACING > plotW;
  const overviewTop = labelTop + labelH + 6;
  const height = overviewTop + (windowed ? OVERVIEW_H + 4 : 0);
  return {
    width,
    height,
    plotW,
    baseY,
    top,
    bottom,
    labelTop,
    labelH,
    upright,
    overviewTop,
    windowed,
  };
}

/** The window shown at first: every unit, or as many from the first as fit MIN_SPACING apart. */
export function firstWindow(n: number, plotW: number): UnitWindow {
  return { u0: 0, u1: Math.max(Math.min(n, plotW / MIN_SPACING), Math.min(n, 1)) };
}

/** A point of the arc from (x0, y) to (x1, y) bulging `h` px (up for h > 0) at t (0 to 1). */
export function arcPoint(
  x0: number,
  x1: number,
  y: number,
  h: number,
  t: number,
): [number, number] {
  // a quadratic Bézier whose control point is 2h off the line peaks h off it at t = 0.5
  const cx = (x0 + x1) / 2;
  const cy = y - 2 * h;
  const a = (1 - t) * (1 - t);
  const b = 2 * (1 - t) * t;
  const c = t * t;
  return [a * x0 + b * cx + c * x1, a * y + b * cy + c * y];
}

function distanceToSegment(
  px: number,
  py: number,
  [ax, ay]: [number, number],
  [bx, by]: [number, number],
): number {
  const dx = bx - ax;
  const dy = by - ay;
  const len = dx * dx + dy * dy;
  const t = len === 0 ? 0 : Math.max(0, Math.min(1, ((px - ax) * dx + (py - ay) * dy) / len));
  return Math.hypot(px - (ax + t * dx), py - (ay + t * dy));
}

/** The prefetch graph of one page or widget. */
export class PrefetchView extends CanvasView {
  readonly titleEl: HTMLElement;
  readonly notesEl: HTMLElement;
  readonly legendEl: HTMLElement;
  data: PrefetchData;
  layout: PrefetchLayout;
  win: UnitWindow = { u0: 0, u1: 1 };
  theme: ThemeColors;
  current = -1;
  selected = -1;
  hovered: PrefetchPick = null;
  private width = 600;
  private measured = false; // the width was measured (the view was in the page)
  private readonly layer: HTMLCanvasElement;
  private readonly position = new Map<string, number>();

  constructor(
    el: HTMLElement,
    data: PrefetchData,
    private readonly events: PrefetchEvents = {},
  ) {
    super(
      el,
      "fsdpviz-prefetch",
      "prefetch graph: units in forward order; + and − show fewer or more, arrow keys move along",
      "prefetch graph",
    );
    const header = element("div", "fv-header");
    this.titleEl = element("div", "fv-title");
    this.notesEl = element("div", "fv-notes");
    const bar = element("div", "fv-controls");
    const zoom = this.zoomBar(
      [
        "show more units (ctrl/shift + wheel)",
        "show fewer units (ctrl/shift + wheel)",
        "show every unit",
      ],
      () => this.showWindow({ u0: 0, u1: this.data.units.length }),
    );
    this.legendEl = element("div", "fv-legend");
    bar.append(zoom, this.legendEl);
    header.append(this.titleEl, this.notesEl, bar);
    const note = element("div", "fv-note");
    note.textContent =
      "Units in forward order, numbered as in report.units. Click a unit or an arc (its " +
      "target) to select it; a drag or ctrl/shift + wheel moves and zooms.";
    this.root.append(header, this.stage, note);
    this.layer = document.createElement("canvas");
    this.data = data;
    this.theme = takeTheme(this.root);
    this.layout = this.computeLayout();
    this.listen();
    this.setData(data);
  }

  setData(data: PrefetchData): void {
    const current = this.current >= 0 ? this.data.units[this.current] : null;
    const selected = this.selected >= 0 ? this.data.units[this.selected] : null;
    this.data = data;
    this.position.clear();
    data.units.forEach((u, i) => {
      this.position.set(u, i);
    });
    this.current = current === null ? -1 : (this.position.get(current) ?? -1);
    this.selected = selected === null ? -1 : (this.position.get(selected) ?? -1);
    this.hovered = null;
    this.titleEl.textContent = data.title;
    this.notesEl.replaceChildren(
      ...data.notes.map((t) => {
        const d = element("div", "fv-warn");
        d.textContent = t;
        return d;
      }),
    );
    this.writeLegend();
    this.win = { u0: 0, u1: 0 }; // laid out again at the width below
    if (this.measured) this.relayout();
    else this.resize();
  }

  private writeLegend(): void {
    const used = new Set(this.data.edges.kind);
    const items: HTMLElement[] = [];
    this.data.kinds.forEach((k, i) => {
      if (!used.has(i)) return;
      const item = document.createElement("span");
      const swatch = element("span", "fv-swatch fv-line");
      swatch.style.borderTopColor = k.color;
      swatch.style.borderTopStyle =
        k.dash === "solid" ? "solid" : k.dash === "dot" ? "dotted" : "dashed";
      item.append(swatch, k.label);
      items.push(item);
    });
    if (this.data.never.some(Boolean)) {
      const item = document.createElement("span");
      item.append(element("span", "fv-swatch fv-square"), "never prefetched");
      items.push(item);
    }
    for (const [cls, text] of [
      ["fv-ring-current", "current step's unit"],
      ["fv-ring-selected", "selected unit"],
    ]) {
      const item = document.createElement("span");
      item.append(element("span", `fv-swatch ${cls}`), text);
      items.push(item);
    }
    this.legendEl.replaceChildren(...items);
  }

  private computeLayout(): PrefetchLayout {
    const ctx = this.layer.getContext("2d");
    if (ctx !== null) ctx.font = FONT;
    const measure = (t: string): number =>
      ctx === null ? 6.5 * t.length : ctx.measureText(t).width;
    return prefetchLayout(this.data, this.width, measure);
  }

  resize(): void {
    const measured = this.root.clientWidth;
    if (measured > 0) {
      this.width = Math.max(measured, 240);
      this.measured = true;
    }
    this.theme = takeTheme(this.root);
    this.relayout();
  }

  /** Lay out and draw at the width and theme read last (see TimelineView.relayout). */
  private relayout(): void {
    const before = this.layout;
    this.layout = this.computeLayout();
    const n = this.data.units.length;
    if (this.win.u1 <= this.win.u0 || before.plotW !== this.layout.plotW) {
      const keep = this.win.u1 > this.win.u0 ? this.win : null;
      const was = firstWindow(n, before.plotW);
      const untouched = keep !== null && keep.u0 === was.u0 && keep.u1 === was.u1;
      if (keep === null || untouched) {
        // as the graph was first shown: every unit where they fit, else the first ones
        this.win = firstWindow(n, this.layout.plotW);
      } else {
        // zoomed or moved: the same units per pixel, around the same middle
        const span = Math.min(((keep.u1 - keep.u0) * this.layout.plotW) / before.plotW, n);
        const mid = (keep.u0 + keep.u1) / 2;
        const w = Math.max(span, Math.min(n, 1));
        this.win = { u0: mid - w / 2, u1: mid + w / 2 };
      }
    }
    this.showWindow(this.win);
  }

  get spacing(): number {
    return this.layout.plotW / Math.max(this.win.u1 - this.win.u0, 1e-9);
  }

  get radius(): number {
    return Math.max(R_MIN, Math.min(R_MAX, this.spacing * 0.34));
  }

  /** The x of unit position `u` (CSS pixels). */
  xOf(u: number): number {
    return PAD_X + (u + 0.5 - this.win.u0) * this.spacing;
  }

  /** Show positions [u0, u1) (kept inside the units, at least one unit wide). */
  showWindow(win: UnitWindow): void {
    const n = this.data.units.length;
    const span = Math.min(Math.max(win.u1 - win.u0, Math.min(1, n)), Math.max(n, 1));
    const u0 = Math.min(Math.max(win.u0, 0), Math.max(n - span, 0));
    this.win = { u0, u1: u0 + span };
    this.draw();
  }

  zoom(factor: number, at = 0.5): void {
    const span = this.win.u1 - this.win.u0;
    const next = span * factor;
    const pivot = this.win.u0 + at * span;
    this.showWindow({ u0: pivot - at * next, u1: pivot - at * next + next });
  }

  /** Move the window so that position `u` is inside it (centred when it was not). */
  follow(u: number): void {
    if (u < 0) return;
    const { u0, u1 } = this.win;
    if (u >= u0 && u + 1 <= u1) return;
    const span = u1 - u0;
    this.showWindow({ u0: u + 0.5 - span / 2, u1: u + 0.5 + span / 2 });
  }

  setCurrent(unit: string | null): void {
    const u = unit === null ? -1 : (this.position.get(unit) ?? -1);
    if (u === this.current) return;
    this.current = u;
    if (u >= 0 && (u < this.win.u0 || u + 1 > this.win.u1)) this.follow(u);
    else this.paint();
  }

  setSelected(unit: string | null): void {
    const u = unit === null ? -1 : (this.position.get(unit) ?? -1);
    this.selected = u;
    if (u >= 0 && (u < this.win.u0 || u + 1 > this.win.u1)) this.follow(u);
    else this.paint();
  }

  /** Draw the window into the layer, then paint. */
  draw(): void {
    const start = performance.now();
    const l = this.layout;
    const lctx = sizeCanvas(this.layer, l.width, l.height);
    sizeCanvas(this.canvas, l.width, l.height);
    if (lctx !== null) this.drawGraph(lctx);
    this.paint();
    this.root.dataset.fvWindow = `${this.win.u0},${this.win.u1}`;
    this.lastDrawMs = performance.now() - start;
  }

  /** Height of edge `e`'s arc in px (up for > 0), 0 for one along the line. */
  arcHeight(e: number): number {
    const kind = this.data.kinds[this.data.edges.kind[e]];
    const side = kind?.side ?? 0;
    if (side === 0) return 0;
    const d = Math.abs(this.xOf(this.data.edges.target[e]) - this.xOf(this.data.edges.source[e]));
    const l = this.layout;
    const room =
      side > 0
        ? l.top - 6
        : side < -1
          ? l.bottom - 6
          : l.bottom - 6 - (l.bottom > ARC_BOTTOM ? ARC_MISSED : 0);
    return Math.sign(side) * Math.min(room, (10 + 0.3 * d) * Math.abs(side));
  }

  /** Edges with some part in the window. */
  visibleEdges(): number[] {
    const { source, target } = this.data.edges;
    const out: number[] = [];
    for (let e = 0; e < source.length; e++) {
      const lo = Math.min(source[e], target[e]);
      const hi = Math.max(source[e], target[e]);
      if (hi + 1 >= this.win.u0 && lo <= this.win.u1) out.push(e);
    }
    return out;
  }

  private drawGraph(ctx: CanvasRenderingContext2D): void {
    const l = this.layout;
    const t = this.theme;
    const d = this.data;
    ctx.fillStyle = t.bg;
    ctx.fillRect(0, 0, l.width, l.height);
    const r = this.radius;
    const lo = Math.max(Math.floor(this.win.u0) - 1, 0);
    const hi = Math.min(Math.ceil(this.win.u1) + 1, d.units.length);
    ctx.save();
    ctx.beginPath();
    ctx.rect(0, 0, l.width, l.labelTop);
    ctx.clip();
    for (const e of this.visibleEdges()) this.drawEdge(ctx, e, r);
    // units over the edges
    ctx.font = "10px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (let u = lo; u < hi; u++) {
      const x = this.xOf(u);
      if (d.never[u]) {
        ctx.strokeStyle = t.muted;
        ctx.lineWidth = 1.5;
        ctx.strokeRect(x - r - 3, l.baseY - r - 3, 2 * r + 6, 2 * r + 6);
      }
      ctx.beginPath();
      ctx.arc(x, l.baseY, r, 0, 2 * Math.PI);
      ctx.fillStyle = d.colors[u];
      ctx.fill();
      ctx.strokeStyle = t.bg;
      ctx.lineWidth = 1;
      ctx.stroke();
      const number = String(d.numbers[u]);
      if (r >= 7 && ctx.measureText(number).width <= 2 * r - 2) {
        ctx.fillStyle = textOn(d.colors[u]);
        ctx.fillText(number, x, l.baseY + 0.5);
      }
    }
    ctx.restore();
    this.drawNames(ctx);
    if (l.windowed) this.drawOverview(ctx);
  }

  private drawEdge(ctx: CanvasRenderingContext2D, e: number, r: number): void {
    const d = this.data;
    const kind = d.kinds[d.edges.kind[e]];
    const y = this.layout.baseY;
    const x0 = this.xOf(d.edges.source[e]);
    const x1 = this.xOf(d.edges.target[e]);
    const h = this.arcHeight(e);
    ctx.strokeStyle = kind.color;
    ctx.fillStyle = kind.color;
    ctx.lineWidth = kind.side === 0 ? 1.5 : 2;
    ctx.setLineDash(dashPattern(kind.dash));
    ctx.beginPath();
    let tip: [number, number];
    let dir: [number, number];
    if (h === 0) {
      const s = Math.sign(x1 - x0) || 1;
      ctx.moveTo(x0 + s * r, y);
      ctx.lineTo(x1 - s * r, y);
      tip = [x1 - s * r, y];
      dir = [s, 0];
    } else {
      ctx.moveTo(x0, y);
      ctx.quadraticCurveTo((x0 + x1) / 2, y - 2 * h, x1, y);
      // the arrow's tip where the arc meets the unit's circle, along the arc's end
      const cx = (x0 + x1) / 2;
      const cy = y - 2 * h;
      const len = Math.hypot(x1 - cx, y - cy) || 1;
      dir = [(x1 - cx) / len, (y - cy) / len];
      tip = [x1 - dir[0] * (r + 1), y - dir[1] * (r + 1)];
    }
    ctx.stroke();
    ctx.setLineDash([]);
    const size = Math.max(4, Math.min(7, this.spacing / 4));
    if (Math.abs(x1 - x0) > 2 * r + size) {
      const [tx, ty] = tip;
      const [dx, dy] = dir;
      ctx.beginPath();
      ctx.moveTo(tx, ty);
      ctx.lineTo(tx - size * dx - (size / 2) * dy, ty - size * dy + (size / 2) * dx);
      ctx.lineTo(tx - size * dx + (size / 2) * dy, ty - size * dy - (size / 2) * dx);
      ctx.closePath();
      ctx.fill();
    }
  }

  /** Every `k`-th unit's name is drawn where names would otherwise overlap. */
  nameStride(): number {
    const l = this.layout;
    if (l.upright) return Math.max(1, Math.ceil(LABEL_GAP / this.spacing));
    return 1;
  }

  private drawNames(ctx: CanvasRenderingContext2D): void {
    const l = this.layout;
    ctx.font = FONT;
    ctx.fillStyle = this.theme.muted;
    const k = this.nameStride();
    for (const [u, text] of this.names()) {
      if (u % k !== 0) continue;
      const x = this.xOf(u);
      if (l.upright) {
        ctx.save();
        ctx.translate(x, l.labelTop + 2);
        ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "right";
        ctx.textBaseline = "middle";
        ctx.fillText(text, 0, 0);
        ctx.restore();
      } else {
        ctx.textAlign = "center";
        ctx.textBaseline = "top";
        ctx.fillText(text, x, l.labelTop + 2);
      }
    }
  }

  /** The names drawn: position and text (cut short past LABEL_MAX px). */
  names(): Array<[number, string]> {
    const ctx = this.layer.getContext("2d");
    const out: Array<[number, string]> = [];
    const k = this.nameStride();
    const lo = Math.max(Math.ceil(this.win.u0 - 0.5), 0);
    const hi = Math.min(Math.floor(this.win.u1 + 0.5), this.data.units.length);
    if (ctx !== null) ctx.font = FONT;
    for (let u = lo; u < hi; u++) {
      if (u % k !== 0) continue;
      const name = moduleName(this.data.units[u]);
      out.push([u, ctx === null ? name : fitText(ctx, name, LABEL_MAX)]);
    }
    return out;
  }

  private drawOverview(ctx: CanvasRenderingContext2D): void {
    const l = this.layout;
    const n = this.data.units.length;
    const y = l.overviewTop;
    ctx.fillStyle = this.theme.call;
    ctx.fillRect(PAD_X, y, l.plotW, OVERVIEW_H);
    const w = l.plotW / n;
    for (let u = 0; u < n; u++) {
      ctx.fillStyle = this.data.colors[u];
      ctx.fillRect(PAD_X + u * w, y + 4, Math.max(w, 1), OVERVIEW_H - 8);
    }
    ctx.strokeStyle = this.theme.fg;
    ctx.lineWidth = 1.5;
    ctx.strokeRect(
      PAD_X + this.win.u0 * w,
      y + 0.75,
      Math.max((this.win.u1 - this.win.u0) * w, 2),
      OVERVIEW_H - 1.5,
    );
  }

  /** The layer, then the rings of the current and the selected unit and the hovered mark. */
  paint(): void {
    const ctx = this.overLayer(this.layer);
    if (ctx === null) return;
    const l = this.layout;
    const r = this.radius;
    const ring = (u: number, color: string, extra: number, width: number): void => {
      if (u < 0) return;
      const x = this.xOf(u);
      if (x >= 0 && x <= l.width) {
        ctx.beginPath();
        ctx.arc(x, l.baseY, r + extra, 0, 2 * Math.PI);
        ctx.strokeStyle = color;
        ctx.lineWidth = width;
        ctx.stroke();
      }
      if (l.windowed) {
        const w = l.plotW / this.data.units.length;
        ctx.fillStyle = color;
        ctx.fillRect(PAD_X + (u + 0.5) * w - 1, l.overviewTop - 3, 2, OVERVIEW_H + 6);
      }
    };
    ring(this.current, this.theme.fg, 4, 2);
    ring(this.selected, this.theme.accent, this.selected === this.current ? 7.5 : 4, 2.5);
    const h = this.hovered;
    if (h?.kind === "edge") {
      const kind = this.data.kinds[this.data.edges.kind[h.e]];
      ctx.save();
      ctx.globalAlpha = 0.35;
      ctx.lineWidth = 6;
      ctx.strokeStyle = kind.color;
      ctx.beginPath();
      this.tracePath(ctx, h.e);
      ctx.stroke();
      ctx.restore();
    } else if (h?.kind === "unit") {
      ctx.beginPath();
      ctx.arc(this.xOf(h.u), l.baseY, r + 2, 0, 2 * Math.PI);
      ctx.strokeStyle = this.theme.muted;
      ctx.lineWidth = 1;
      ctx.stroke();
    }
    const ds = this.root.dataset;
    ds.fvCurrentUnit = this.current >= 0 ? this.data.units[this.current] : "";
    ds.fvSelectedUnit = this.selected >= 0 ? this.data.units[this.selected] : "";
  }

  private tracePath(ctx: CanvasRenderingContext2D, e: number): void {
    const y = this.layout.baseY;
    const x0 = this.xOf(this.data.edges.source[e]);
    const x1 = this.xOf(this.data.edges.target[e]);
    const h = this.arcHeight(e);
    ctx.moveTo(x0, y);
    if (h === 0) ctx.lineTo(x1, y);
    else ctx.quadraticCurveTo((x0 + x1) / 2, y - 2 * h, x1, y);
  }

  /** What is at (x, y): a unit (its node or its name) first, else the nearest arc within 5 px. */
  pickAt(x: number, y: number): PrefetchPick {
    const l = this.layout;
    const n = this.data.units.length;
    if (n === 0) return null;
    const u = Math.round((x - PAD_X) / this.spacing - 0.5 + this.win.u0);
    const inWindow = u >= 0 && u < n && u + 0.5 >= this.win.u0 && u + 0.5 <= this.win.u1;
    const r = this.radius;
    if (inWindow) {
      const dx = Math.abs(x - this.xOf(u));
      const onNode = dx <= Math.max(r + 3, this.spacing / 2) && Math.abs(y - l.baseY) <= r + 4;
      const onName =
        y >= l.labelTop && y <= l.labelTop + l.labelH && dx <= Math.max(this.spacing / 2, 6);
      if (onNode || onName) return { kind: "unit", u };
    }
    if (y > l.labelTop) return null;
    let best = 5.01;
    let found = -1;
    for (const e of this.visibleEdges()) {
      const x0 = this.xOf(this.data.edges.source[e]);
      const x1 = this.xOf(this.data.edges.target[e]);
      const h = this.arcHeight(e);
      if (x < Math.min(x0, x1) - 6 || x > Math.max(x0, x1) + 6) continue;
      let prev = arcPoint(x0, x1, l.baseY, h, 0);
      const steps = h === 0 ? 1 : 24;
      for (let k = 1; k <= steps; k++) {
        const next = arcPoint(x0, x1, l.baseY, h, k / steps);
        const dist = distanceToSegment(x, y, prev, next);
        if (dist < best) {
          best = dist;
          found = e;
        }
        prev = next;
      }
    }
    return found >= 0 ? { kind: "edge", e: found } : null;
  }

  /** Where unit `name`'s node is drawn (CSS pixels of the canvas), or null: for tests. */
  nodeCentre(name: string): { x: number; y: number } | null {
    const u = this.position.get(name);
    if (u === undefined) return null;
    const x = this.xOf(u);
    if (x < 0 || x > this.layout.width) return null;
    return { x, y: this.layout.baseY };
  }

  hoverLines(p: NonNullable<PrefetchPick>): string[] {
    const d = this.data;
    if (p.kind === "unit") {
      return [...d.hover[p.u], `unit ${d.numbers[p.u]}; click: select it`];
    }
    const kind = d.kinds[d.edges.kind[p.e]];
    const target = d.units[d.edges.target[p.e]];
    return [kind.label, d.edges.text[p.e], `click: select ${quote(target)}`];
  }

  hoverAt(x: number, y: number): void {
    const p = this.pickAt(x, y);
    if (pickKey(p) === pickKey(this.hovered)) return;
    this.hovered = p;
    if (p === null) this.tooltip.hide();
    else this.tooltip.show(this.hoverLines(p), x, y, this.layout.width);
    this.paint();
  }

  leave(): void {
    if (this.hovered === null) return;
    this.hovered = null;
    this.tooltip.hide();
    this.paint();
  }

  clickAt(x: number, y: number): void {
    const l = this.layout;
    if (l.windowed && y >= l.overviewTop - 3 && y <= l.overviewTop + OVERVIEW_H + 3) {
      const u = ((x - PAD_X) / l.plotW) * this.data.units.length;
      const span = this.win.u1 - this.win.u0;
      this.showWindow({ u0: u - span / 2, u1: u + span / 2 });
      return;
    }
    const p = this.pickAt(x, y);
    if (p === null) return;
    const u = p.kind === "unit" ? p.u : this.data.edges.target[p.e];
    const unit = this.data.units[u];
    this.setSelected(unit);
    this.events.select?.(unit);
  }

  protected dragFrom(): (dx: number) => void {
    const { u0, u1 } = this.win;
    const spacing = this.spacing;
    return (dx) => this.showWindow({ u0: u0 - dx / spacing, u1: u1 - dx / spacing });
  }

  /** + and −: fewer or more units; ← →: move along by a quarter of the window. */
  protected keyAction(key: string): (() => void) | undefined {
    const span = this.win.u1 - this.win.u0;
    const move = (d: number) => () => this.showWindow({ u0: this.win.u0 + d, u1: this.win.u1 + d });
    const keys: Record<string, () => void> = {
      "+": () => this.zoom(0.5),
      "=": () => this.zoom(0.5),
      "-": () => this.zoom(2),
      ArrowLeft: move(-span / 4),
      ArrowRight: move(span / 4),
    };
    return keys[key];
  }

  protected wheelAt(x: number, factor: number): void {
    this.zoom(factor, Math.min(Math.max((x - PAD_X) / this.layout.plotW, 0), 1));
  }
}
