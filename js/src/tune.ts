// A tuning drawn on a canvas, from the data fsdpviz.views.tune_data writes: every
// configuration fsdpviz.tune evaluated as a point, tokens/s per GPU against the memory it
// needs per rank, the machine's usable memory (or the budget) as a line with the space
// past it shaded, the frontier joined, the best (★) and the configuration as given (◆)
// marked; filled points fit, open ones do not; a colour per world size. Beside it (below
// it in a narrow view) the knob table: per knob the best's value, the one given and the
// best alternative, whose text opens that configuration. A click on a point selects it
// (the notebook and the page then show its plan); ← → walk the frontier, ↑ ↓ every point
// by tokens/s, Enter selects, + − zoom, 0 shows all again; a drag or ctrl/shift + wheel
// moves and zooms.
import { CanvasView } from "./canvas_view";
import { button, element, sizeCanvas } from "./dom";
import { formatBytes } from "./format";
import { FONT, type ThemeColors, takeTheme } from "./theme";

export interface TuneData {
  title: string;
  summary: string[];
  x_label: string;
  y_label: string;
  capacity: { bytes: number; label: string } | null;
  groups: Array<{ world_size: number; label: string; color: string }>;
  points: {
    index: number[];
    x: number[];
    y: number[];
    fits: boolean[];
    frontier: boolean[];
    traced: boolean[];
    group: number[];
    hover: string[][];
  };
  /** Positions of the frontier's points, by x. */
  frontier: number[];
  best: number | null;
  user: number;
  /** What the knob table compares with: "best", or "lightest" when nothing fits. */
  anchor: string;
  knobs: Array<{
    knob: string;
    name: string;
    value: string;
    user: string;
    alternative: string | null;
    candidate: number | null;
  }>;
}

export interface TuneEvents {
  /** A click (or Enter) chose the configuration `index` (a candidate's index). */
  select?(index: number): void;
}

/** The window of the axes shown: bytes across, tokens/s up. */
export interface TuneWindow {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
}

const PAD = { left: 70, right: 16, top: 14, bottom: 44 };
const PICK_PX = 9;
/** From this width the knob table stands beside the scatter, below it otherwise. */
export const BESIDE_FROM = 1000;

/** Ticks from `lo` to `hi` about `count` of them, at 1, 2 or 5 times a power of ten of
 * `unit` (1, or a power of 1024 for bytes). */
export function niceTicks(lo: number, hi: number, count: number, unit = 1): number[] {
  const span = hi - lo > 0 ? hi - lo : 1;
  const raw = span / unit / Math.max(count, 1);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step =
    ([1, 2, 5, 10].map((m) => m * mag).find((t) => t >= raw * (1 - 1e-9)) ?? 10 * mag) * unit;
  const out: number[] = [];
  // to 12 digits: 0.6, not 0.6000000000000001; + 0: 0, not -0
  for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++)
    out.push(Number((k * step).toPrecision(12)) + 0);
  return out;
}

/** Byte ticks over [lo, hi]: in the binary unit the larger end is written in. */
export function byteTicks(lo: number, hi: number, count: number): number[] {
  let unit = 1;
  while (Math.max(Math.abs(lo), Math.abs(hi)) / unit >= 1024 && unit < 2 ** 40) unit *= 1024;
  return niceTicks(lo, hi, count, unit);
}

/** A tokens/s tick as Python writes tokens/s (`6,000`), with the decimals a small step needs. */
export function rateLabel(v: number, step: number): string {
  const decimals = step >= 1 ? 0 : Math.min(6, Math.ceil(-Math.log10(step) - 1e-9));
  if (Math.abs(v) < step * 1e-6) return "0";
  return v.toLocaleString("en-US", {
    minimumFractionDigits: decimals,
    maximumFractionDigits: decimals,
  });
}

/** The whole tuning: from 0 to past the largest point and the capacity line, unless the
 * line is more than three times as far (the points would be a smudge at the left: the
 * line is named at the edge instead), as fsdpviz.views.tune_figure does. */
export function fullWindow(data: TuneData): TuneWindow {
  const cap = data.capacity?.bytes ?? 0;
  const most = Math.max(...data.points.x, 0);
  const xMax = cap <= 3 * most || most <= 0 ? Math.max(cap, most) : most;
  const yMax = Math.max(...data.points.y, 0);
  return { x0: 0, x1: xMax > 0 ? xMax * 1.06 : 1, y0: 0, y1: yMax > 0 ? yMax * 1.1 : 1 };
}

/** Around the frontier's points (and the best and the given), with a margin. */
export function frontierWindow(data: TuneData): TuneWindow {
  const ks = [...data.frontier];
  if (data.best !== null) ks.push(data.best);
  ks.push(data.user);
  const xs = ks.map((k) => data.points.x[k]);
  const ys = ks.map((k) => data.points.y[k]);
  const cap = data.capacity?.bytes;
  if (cap !== undefined) xs.push(cap);
  const pad = (lo: number, hi: number): [number, number] => {
    const m = (hi - lo) * 0.08 || Math.abs(hi) * 0.05 || 1;
    return [Math.max(0, lo - m), hi + m];
  };
  const [x0, x1] = pad(Math.min(...xs), Math.max(...xs));
  const [y0, y1] = pad(Math.min(...ys), Math.max(...ys));
  return { x0, x1, y0, y1 };
}

/** The tuning's scatter and its knob table. */
export class TuneView extends CanvasView {
  readonly titleEl: HTMLElement;
  readonly headlineEl: HTMLElement;
  readonly summaryEl: HTMLElement;
  readonly legendEl: HTMLElement;
  readonly knobsEl: HTMLElement;
  readonly statusEl: HTMLElement;
  readonly main: HTMLElement;
  data: TuneData;
  theme: ThemeColors;
  win: TuneWindow;
  /** Positions (into data.points) of the selected, the keyboard's and the hovered point, or -1. */
  selected = -1;
  focus = -1;
  hovered = -1;
  /** The candidates whose plan can be opened (null: all of them). */
  saved: Set<number> | null = null;
  width = 640;
  height = 360;
  private beside = false;
  private readonly position = new Map<number, number>();

  constructor(
    el: HTMLElement,
    data: TuneData,
    private readonly events: TuneEvents = {},
  ) {
    super(
      el,
      "fsdpviz-tune",
      "configurations: tokens/s per GPU against memory per rank; arrow keys walk the frontier, Enter opens one",
      "tune view",
    );
    const header = element("div", "fv-header");
    this.titleEl = element("div", "fv-title");
    this.headlineEl = element("div", "fv-tune-headline");
    const details = element("details", "fv-tune-summary");
    const summary = element("summary", "");
    summary.textContent = "the tuning in words";
    this.summaryEl = element("pre", "fv-tune-text");
    details.append(summary, this.summaryEl);
    header.append(this.titleEl, this.headlineEl, details);
    const body = element("div", "fv-tune-body");
    this.main = element("div", "fv-tune-main");
    const bar = element("div", "fv-controls");
    const zoom = this.zoomBar(
      [
        "zoom out (−, ctrl/shift + wheel)",
        "zoom in (+, ctrl/shift + wheel)",
        "show every configuration (0)",
      ],
      () => this.showWindow(fullWindow(this.data)),
    );
    zoom.append(
      button(
        "frontier",
        "zoom to the frontier, the best and the configuration as given",
        this.guard(() => this.showWindow(frontierWindow(this.data))),
      ),
    );
    this.legendEl = element("div", "fv-legend");
    bar.append(zoom, this.legendEl);
    this.statusEl = element("div", "fv-tune-status");
    const note = element("div", "fv-note");
    note.textContent =
      "Click a point to open its plan; ← → walk the frontier, ↑ ↓ every configuration by " +
      "tokens/s, Enter opens, + − zoom, 0 shows all; a drag or ctrl/shift + wheel moves and zooms.";
    this.main.append(bar, this.stage, this.statusEl, note);
    this.knobsEl = element("div", "fv-tune-knobs");
    body.append(this.main, this.knobsEl);
    this.root.append(header, body);
    this.data = data;
    this.win = fullWindow(data);
    this.theme = takeTheme(this.root);
    this.dragsBothWays = true;
    this.listen();
    this.setData(data);
  }

  setData(data: TuneData): void {
    const selected = this.selected >= 0 ? this.data.points.index[this.selected] : null;
    this.data = data;
    this.position.clear();
    data.points.index.forEach((index, k) => {
      this.position.set(index, k);
    });
    this.selected = selected === null ? -1 : (this.position.get(selected) ?? -1);
    this.focus = -1;
    this.hovered = -1;
    this.tooltip.hide();
    this.titleEl.textContent = data.title;
    this.headlineEl.textContent = data.summary[1] ?? "";
    this.summaryEl.textContent = data.summary.join("\n");
    this.writeLegend();
    this.writeKnobs();
    this.win = fullWindow(data);
    this.resize();
  }

  /** Select the candidate `index` (null: none), as a click would, without telling anyone. */
  setSelected(index: number | null): void {
    this.selected = index === null ? -1 : (this.position.get(index) ?? -1);
    this.writeStatus();
    this.markKnobRow();
    this.paint();
  }

  /** The candidates whose plans can be opened (null: every one). */
  setSaved(indices: number[] | null): void {
    this.saved = indices === null ? null : new Set(indices);
    this.writeStatus();
  }

  private writeLegend(): void {
    const items: HTMLElement[] = [];
    const add = (swatch: HTMLElement, text: string): void => {
      const item = document.createElement("span");
      item.append(swatch, text);
      items.push(item);
    };
    const several = this.data.groups.length > 1;
    for (const g of this.data.groups) {
      const dot = element("span", "fv-swatch fv-dot");
      dot.style.background = g.color;
      dot.style.borderColor = g.color;
      add(dot, several ? `${g.label}, fits` : "fits");
    }
    add(element("span", "fv-swatch fv-dot fv-open"), "does not fit");
    add(element("span", "fv-swatch fv-line fv-frontier-line"), "frontier");
    if (this.data.best !== null) add(element("span", "fv-swatch fv-glyph fv-star"), "best");
    add(element("span", "fv-swatch fv-glyph fv-diamond"), "as given");
    if (this.data.capacity !== null)
      add(element("span", "fv-swatch fv-line fv-capacity-line"), "capacity");
    add(element("span", "fv-swatch fv-ring-selected"), "selected");
    this.legendEl.replaceChildren(...items);
  }

  private writeKnobs(): void {
    const d = this.data;
    const caption = element("div", "fv-tune-knobs-title");
    caption.textContent =
      d.anchor === "best"
        ? "Per knob: the best's value, the one given, and the best alternative (click it to open)"
        : "Nothing fits. Per knob: the lightest's value, the one given, and the best alternative";
    const table = element("table", "fv-tune-table");
    const head = document.createElement("thead");
    const hr = document.createElement("tr");
    for (const t of ["knob", d.anchor, "as given", "best alternative"]) {
      const th = document.createElement("th");
      th.textContent = t;
      hr.append(th);
    }
    head.append(hr);
    const tbody = document.createElement("tbody");
    for (const row of d.knobs) {
      const tr = document.createElement("tr");
      tr.dataset.knob = row.knob;
      const cells = [row.name, row.value, row.user];
      for (const text of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.append(td);
      }
      const given = tr.children[2] as HTMLElement;
      given.classList.toggle("fv-differs", row.user !== row.value);
      if (row.user !== row.value)
        given.title = "differs from the configuration in the second column";
      const alt = document.createElement("td");
      if (row.alternative !== null && row.candidate !== null) {
        const k = row.candidate;
        const index = d.points.index[k];
        const b = document.createElement("button");
        b.type = "button";
        b.className = "fv-tune-alt";
        b.textContent = row.alternative;
        b.title = `configuration #${index}: click to open its plan`;
        b.dataset.candidate = String(index);
        b.addEventListener(
          "click",
          this.guard(() => this.choose(k)),
        );
        alt.append(b);
      } else {
        alt.textContent = "no other value tried";
        alt.className = "fv-muted";
      }
      tr.append(alt);
      tbody.append(tr);
    }
    table.append(head, tbody);
    this.knobsEl.replaceChildren(caption, table);
    this.markKnobRow();
  }

  private markKnobRow(): void {
    const selected = this.selected >= 0 ? String(this.data.points.index[this.selected]) : "";
    for (const b of this.knobsEl.querySelectorAll<HTMLElement>(".fv-tune-alt")) {
      b.closest("tr")?.classList.toggle("fv-current", b.dataset.candidate === selected);
    }
  }

  private writeStatus(): void {
    const k = this.selected;
    if (k < 0) {
      this.statusEl.textContent = "Nothing selected: click a point to open its plan.";
    } else {
      const [head, rate, , memory] = this.data.points.hover[k];
      const index = this.data.points.index[k];
      const missing = this.saved !== null && !this.saved.has(index);
      this.statusEl.textContent = `selected ${head}: ${rate}; ${memory}${
        missing ? " (its plan is not saved here)" : ""
      }`;
    }
    this.root.dataset.fvSelected = k < 0 ? "" : String(this.data.points.index[k]);
  }

  /** The plot's area (CSS px): left, top, width, height. */
  get plot(): { left: number; top: number; w: number; h: number } {
    return {
      left: PAD.left,
      top: PAD.top,
      w: Math.max(this.width - PAD.left - PAD.right, 40),
      h: Math.max(this.height - PAD.top - PAD.bottom, 40),
    };
  }

  /** Where bytes `x` and tokens/s `y` are drawn (CSS px). */
  toScreen(x: number, y: number): [number, number] {
    const p = this.plot;
    const w = this.win;
    return [
      p.left + ((x - w.x0) / (w.x1 - w.x0 || 1)) * p.w,
      p.top + p.h - ((y - w.y0) / (w.y1 - w.y0 || 1)) * p.h,
    ];
  }

  /** Where candidate `index`'s point is drawn (CSS px of the canvas), or null when it is
   * not in the window: for tests. */
  pointCentre(index: number): { x: number; y: number } | null {
    const k = this.position.get(index);
    if (k === undefined) return null;
    const [x, y] = this.toScreen(this.data.points.x[k], this.data.points.y[k]);
    const p = this.plot;
    if (x < p.left - 0.5 || x > p.left + p.w + 0.5 || y < p.top - 0.5 || y > p.top + p.h + 0.5)
      return null;
    return { x, y };
  }

  resize(): void {
    const w = this.root.clientWidth;
    const beside = w === 0 || w >= BESIDE_FROM;
    if (beside !== this.beside) {
      this.beside = beside;
      this.root.classList.toggle("fv-beside", beside);
    }
    const main = this.main.clientWidth || (beside ? w * 0.6 : w);
    if (main > 0) this.width = Math.max(main, 320);
    this.height = Math.round(Math.min(Math.max(this.width * 0.55, 300), 440));
    this.theme = takeTheme(this.root);
    this.writeStatus();
    this.draw();
  }

  showWindow(win: TuneWindow): void {
    const fix = (a: number, b: number): [number, number] =>
      b - a > 0 ? [a, b] : [a - (Math.abs(a) * 0.05 || 1), a + (Math.abs(a) * 0.05 || 1)];
    const [x0, x1] = fix(win.x0, win.x1);
    const [y0, y1] = fix(win.y0, win.y1);
    this.win = { x0, x1, y0, y1 };
    this.draw();
  }

  /** Zoom by `factor` (> 1: show more) around (fx, fy), fractions of the plot across and up. */
  zoom(factor: number, fx = 0.5, fy = 0.5): void {
    const w = this.win;
    const cx = w.x0 + fx * (w.x1 - w.x0);
    const cy = w.y0 + fy * (w.y1 - w.y0);
    this.showWindow({
      x0: cx - fx * (w.x1 - w.x0) * factor,
      x1: cx + (1 - fx) * (w.x1 - w.x0) * factor,
      y0: cy - fy * (w.y1 - w.y0) * factor,
      y1: cy + (1 - fy) * (w.y1 - w.y0) * factor,
    });
  }

  draw(): void {
    const start = performance.now();
    const ctx = sizeCanvas(this.canvas, this.width, this.height);
    if (ctx !== null) this.paintOn(ctx);
    this.lastDrawMs = performance.now() - start;
  }

  /** Draw again (a selection, the keyboard's point or the hovered point changed). */
  paint(): void {
    const ctx = this.canvas.getContext("2d");
    if (ctx === null) return;
    const ratio = (typeof window !== "undefined" && window.devicePixelRatio) || 1;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    this.paintOn(ctx);
  }

  private paintOn(ctx: CanvasRenderingContext2D): void {
    const t = this.theme;
    const p = this.plot;
    ctx.fillStyle = t.bg;
    ctx.fillRect(0, 0, this.width, this.height);
    this.drawAxes(ctx);
    ctx.save();
    ctx.beginPath();
    ctx.rect(p.left, p.top, p.w, p.h);
    ctx.clip();
    this.drawCapacity(ctx);
    this.drawFrontier(ctx);
    this.drawPoints(ctx);
    this.drawMarks(ctx);
    ctx.restore();
    this.drawCapacityLabel(ctx);
    this.drawMarkLabels(ctx);
    const ds = this.root.dataset;
    ds.fvWindow = `${this.win.x0},${this.win.x1},${this.win.y0},${this.win.y1}`;
    ds.fvFocus = this.focus < 0 ? "" : String(this.data.points.index[this.focus]);
  }

  private drawAxes(ctx: CanvasRenderingContext2D): void {
    const t = this.theme;
    const p = this.plot;
    const w = this.win;
    ctx.font = FONT;
    ctx.lineWidth = 1;
    const xs = byteTicks(w.x0, w.x1, Math.max(2, Math.floor(p.w / 90)));
    const ys = niceTicks(w.y0, w.y1, Math.max(2, Math.floor(p.h / 40)));
    const yStep = ys.length > 1 ? ys[1] - ys[0] : 1;
    ctx.strokeStyle = t.grid;
    ctx.fillStyle = t.muted;
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const v of xs) {
      const [x] = this.toScreen(v, 0);
      if (x < p.left - 0.5 || x > p.left + p.w + 0.5) continue;
      const px = Math.round(x) + 0.5;
      ctx.beginPath();
      ctx.moveTo(px, p.top);
      ctx.lineTo(px, p.top + p.h);
      ctx.stroke();
      ctx.fillText(Math.abs(v) < 1e-9 ? "0" : formatBytes(v), x, p.top + p.h + 4);
    }
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const v of ys) {
      const [, y] = this.toScreen(0, v);
      if (y < p.top - 0.5 || y > p.top + p.h + 0.5) continue;
      const py = Math.round(y) + 0.5;
      ctx.beginPath();
      ctx.moveTo(p.left, py);
      ctx.lineTo(p.left + p.w, py);
      ctx.stroke();
      ctx.fillText(rateLabel(v, yStep), p.left - 6, y);
    }
    ctx.strokeStyle = t.border;
    ctx.strokeRect(p.left + 0.5, p.top + 0.5, p.w - 1, p.h - 1);
    ctx.fillStyle = t.fg;
    ctx.textAlign = "center";
    ctx.textBaseline = "bottom";
    ctx.fillText(this.data.x_label, p.left + p.w / 2, this.height - 4);
    ctx.save();
    ctx.translate(14, p.top + p.h / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textBaseline = "middle";
    ctx.fillText(this.data.y_label, 0, 0);
    ctx.restore();
  }

  /** The capacity line's x (CSS px), or null where there is none. */
  capacityX(): number | null {
    const cap = this.data.capacity;
    return cap === null ? null : this.toScreen(cap.bytes, 0)[0];
  }

  private drawCapacity(ctx: CanvasRenderingContext2D): void {
    const x = this.capacityX();
    if (x === null) return;
    const p = this.plot;
    const t = this.theme;
    const cx = Math.round(x) + 0.5;
    if (cx < p.left + p.w) {
      ctx.fillStyle = t.wait_fill;
      ctx.fillRect(Math.max(cx, p.left), p.top, p.left + p.w - Math.max(cx, p.left), p.h);
    }
    ctx.strokeStyle = t.fg;
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(cx, p.top);
    ctx.lineTo(cx, p.top + p.h);
    ctx.stroke();
  }

  private drawCapacityLabel(ctx: CanvasRenderingContext2D): void {
    const cap = this.data.capacity;
    const x = this.capacityX();
    if (cap === null || x === null) return;
    const p = this.plot;
    ctx.font = `bold ${FONT}`;
    if (x < p.left || x > p.left + p.w) {
      // off the window: named at the edge it lies beyond
      const right = x > p.left + p.w;
      const text = right ? `${cap.label} →` : `← ${cap.label}`;
      const tw = ctx.measureText(text).width;
      const tx = right ? p.left + p.w - 6 - tw : p.left + 6;
      const ty = p.top + p.h - 11; // at the bottom: the fastest points are at the top
      ctx.fillStyle = this.theme.bg;
      ctx.fillRect(tx - 2, ty - 7, tw + 4, 14);
      ctx.fillStyle = right ? this.theme.fg : this.theme.wait;
      ctx.textAlign = "left";
      ctx.textBaseline = "middle";
      ctx.fillText(text, tx, ty);
      ctx.font = FONT;
      return;
    }
    const text = cap.label;
    const tw = ctx.measureText(text).width;
    const left = x - 6 - tw >= p.left + 2;
    const tx = left ? x - 6 - tw : x + 6;
    const ty = p.top + p.h - 11; // at the bottom: the fastest points are at the top
    ctx.fillStyle = this.theme.bg;
    ctx.fillRect(tx - 2, ty - 7, tw + 4, 14);
    ctx.fillStyle = this.theme.fg;
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    ctx.fillText(text, tx, ty);
    ctx.font = `${FONT}`;
    ctx.fillStyle = this.theme.wait;
    const past = "does not fit →";
    const pw = ctx.measureText(past).width;
    if (x + 6 + pw < p.left + p.w) {
      ctx.fillText(past, x + 6, left ? ty : ty - 16);
    }
    ctx.font = FONT;
  }

  private drawFrontier(ctx: CanvasRenderingContext2D): void {
    const d = this.data;
    if (d.frontier.length < 2) return;
    ctx.strokeStyle = this.theme.muted;
    ctx.lineWidth = 1.5;
    ctx.setLineDash([]);
    ctx.beginPath();
    d.frontier.forEach((k, i) => {
      const [x, y] = this.toScreen(d.points.x[k], d.points.y[k]);
      if (i === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }

  /** Radius of point `k`'s circle. */
  radius(k: number): number {
    return this.data.points.frontier[k] ? 5 : 4;
  }

  private drawPoints(ctx: CanvasRenderingContext2D): void {
    const d = this.data;
    const pts = d.points;
    const t = this.theme;
    const n = pts.index.length;
    // off the frontier first, then the frontier over them; the best and the given last
    const order = [...Array(n).keys()].sort(
      (a, b) => Number(pts.frontier[a]) - Number(pts.frontier[b]),
    );
    for (const k of order) {
      if (k === d.best) continue;
      const [x, y] = this.toScreen(pts.x[k], pts.y[k]);
      const color = d.groups[pts.group[k]]?.color ?? t.fg;
      const r = this.radius(k);
      ctx.beginPath();
      ctx.arc(x, y, r, 0, 2 * Math.PI);
      if (pts.fits[k]) {
        ctx.fillStyle = color;
        ctx.fill();
        ctx.strokeStyle = pts.frontier[k] ? t.fg : t.bg;
        ctx.lineWidth = pts.frontier[k] ? 1.25 : 0.75;
        ctx.stroke();
      } else {
        ctx.fillStyle = t.bg;
        ctx.fill();
        ctx.strokeStyle = color;
        ctx.lineWidth = 1.75;
        ctx.stroke();
      }
    }
  }

  private star(ctx: CanvasRenderingContext2D, x: number, y: number, r: number): void {
    ctx.beginPath();
    for (let i = 0; i < 10; i++) {
      const a = -Math.PI / 2 + (i * Math.PI) / 5;
      const rr = i % 2 === 0 ? r : r * 0.45;
      if (i === 0) ctx.moveTo(x + rr * Math.cos(a), y + rr * Math.sin(a));
      else ctx.lineTo(x + rr * Math.cos(a), y + rr * Math.sin(a));
    }
    ctx.closePath();
  }

  private drawMarks(ctx: CanvasRenderingContext2D): void {
    const d = this.data;
    const t = this.theme;
    const at = (k: number): [number, number] => this.toScreen(d.points.x[k], d.points.y[k]);
    {
      const [x, y] = at(d.user);
      ctx.beginPath();
      ctx.moveTo(x, y - 9);
      ctx.lineTo(x + 9, y);
      ctx.lineTo(x, y + 9);
      ctx.lineTo(x - 9, y);
      ctx.closePath();
      ctx.strokeStyle = t.fg;
      ctx.lineWidth = 2;
      ctx.stroke();
    }
    if (d.best !== null) {
      const [x, y] = at(d.best);
      this.star(ctx, x, y, 10);
      ctx.fillStyle = d.groups[d.points.group[d.best]]?.color ?? t.fg;
      ctx.fill();
      ctx.strokeStyle = t.fg;
      ctx.lineWidth = 1.5;
      ctx.stroke();
    }
    const ring = (k: number, color: string, r: number, width: number, dash: number[]): void => {
      if (k < 0) return;
      const [x, y] = at(k);
      ctx.beginPath();
      ctx.arc(x, y, r, 0, 2 * Math.PI);
      if (dash.length === 0 && width > 2) {
        // a halo of the background: the ring stands apart from a mark of its colour
        ctx.strokeStyle = t.bg;
        ctx.lineWidth = width + 2.5;
        ctx.stroke();
      }
      ctx.strokeStyle = color;
      ctx.lineWidth = width;
      ctx.setLineDash(dash);
      ctx.stroke();
      ctx.setLineDash([]);
    };
    ring(this.hovered, t.muted, 10, 1, []);
    ring(this.focus, t.focus, 13, 2, [3, 2]);
    ring(this.selected, t.accent, this.selected === d.best ? 15 : 11, 2.5, []);
  }

  private drawMarkLabels(ctx: CanvasRenderingContext2D): void {
    const d = this.data;
    const p = this.plot;
    const labels: Array<[number, string]> = [];
    if (d.best !== null && d.best === d.user) labels.push([d.best, "best, as given"]);
    else {
      if (d.best !== null) labels.push([d.best, "best"]);
      labels.push([d.user, "as given"]);
    }
    ctx.font = `bold ${FONT}`;
    ctx.textBaseline = "middle";
    const placed: Array<[number, number, number, number]> = [];
    for (const [k, text] of labels) {
      const c = this.pointCentre(d.points.index[k]);
      if (c === null) continue;
      const tw = ctx.measureText(text).width;
      // right of the mark, else left of it; lower when it would cover another label
      let tx = c.x + 14;
      if (tx + tw > p.left + p.w - 2) tx = c.x - 14 - tw;
      let ty = c.y - 12;
      if (ty < p.top + 8) ty = c.y + 14;
      for (const [ax, ay, aw] of placed) {
        if (Math.abs(ty - ay) < 14 && tx < ax + aw && ax < tx + tw) ty = ay + 15;
      }
      placed.push([tx, ty, tw, 14]);
      ctx.fillStyle = this.theme.bg;
      ctx.globalAlpha = 0.85;
      ctx.fillRect(tx - 2, ty - 7, tw + 4, 14);
      ctx.globalAlpha = 1;
      ctx.fillStyle = this.theme.fg;
      ctx.textAlign = "left";
      ctx.fillText(text, tx, ty);
    }
    ctx.font = FONT;
  }

  /** The point under (x, y), or -1: the nearest within a few px; among points drawn on
   * one another the best, the given, the frontier's, a fitting one, then the first. */
  pickAt(x: number, y: number): number {
    const pts = this.data.points;
    let found = -1;
    let bestDist = PICK_PX + 1e-9;
    let bestRank = Number.POSITIVE_INFINITY;
    for (let k = 0; k < pts.index.length; k++) {
      const c = this.pointCentre(pts.index[k]);
      if (c === null) continue;
      const dist = Math.hypot(c.x - x, c.y - y);
      if (dist > PICK_PX) continue;
      const rank = this.rank(k);
      if (dist < bestDist - 0.5 || (Math.abs(dist - bestDist) <= 0.5 && rank < bestRank)) {
        found = k;
        bestDist = dist;
        bestRank = rank;
      }
    }
    return found;
  }

  private rank(k: number): number {
    const d = this.data;
    if (k === d.best) return 0;
    if (k === d.user) return 1;
    if (d.points.frontier[k]) return 2;
    return d.points.fits[k] ? 3 : 4;
  }

  /** The other points drawn within 3 px of point `k`. */
  under(k: number): number[] {
    const pts = this.data.points;
    const c = this.pointCentre(pts.index[k]);
    if (c === null) return [];
    const out: number[] = [];
    for (let j = 0; j < pts.index.length; j++) {
      if (j === k) continue;
      const o = this.pointCentre(pts.index[j]);
      if (o !== null && Math.hypot(o.x - c.x, o.y - c.y) <= 3) out.push(j);
    }
    return out;
  }

  /** What hover shows of point `k`: fsdpviz.views.tune_data's lines, what else is drawn
   * there, and what a click does. */
  hoverLines(k: number): string[] {
    const pts = this.data.points;
    const lines = [...pts.hover[k]];
    const others = this.under(k);
    if (others.length > 0) {
      const names = others.slice(0, 6).map((j) => `#${pts.index[j]}`);
      const more = others.length > 6 ? ` and ${others.length - 6} more` : "";
      lines.push(`drawn here too: ${names.join(", ")}${more}`);
    }
    const index = pts.index[k];
    lines.push(
      this.saved === null || this.saved.has(index)
        ? "click: open its plan"
        : "click: select it (its plan is not saved here)",
    );
    return lines;
  }

  /** The details of point `k` by (x, y), kept inside the canvas (above the point where
   * they would run past its bottom). */
  private showTip(k: number, x: number, y: number): void {
    this.tooltip.show(this.hoverLines(k), x, y, this.width);
    const h = this.tooltip.el.offsetHeight;
    if (h > 0 && y + 14 + h > this.height) {
      this.tooltip.el.style.top = `${Math.max(0, Math.min(y - 14 - h, this.height - h))}px`;
    }
  }

  hoverAt(x: number, y: number): void {
    const k = this.pickAt(x, y);
    if (k === this.hovered) return;
    this.hovered = k;
    if (k < 0) this.tooltip.hide();
    else this.showTip(k, x, y);
    this.paint();
  }

  leave(): void {
    if (this.hovered < 0) return;
    this.hovered = -1;
    this.tooltip.hide();
    this.paint();
  }

  clickAt(x: number, y: number): void {
    const k = this.pickAt(x, y);
    if (k >= 0) this.choose(k);
  }

  /** Select point `k` and tell the model: a click, Enter, or a row of the knob table. */
  choose(k: number): void {
    this.focus = k;
    this.setSelected(this.data.points.index[k]);
    this.events.select?.(this.data.points.index[k]);
  }

  /** Move the keyboard's point to `k`: in the window (moved there if it was not), its
   * details shown. */
  focusOn(k: number): void {
    if (k < 0) return;
    this.focus = k;
    if (this.pointCentre(this.data.points.index[k]) === null) {
      const w = this.win;
      const x = this.data.points.x[k];
      const y = this.data.points.y[k];
      const hw = (w.x1 - w.x0) / 2;
      const hh = (w.y1 - w.y0) / 2;
      this.showWindow({ x0: x - hw, x1: x + hw, y0: y - hh, y1: y + hh });
    }
    const c = this.pointCentre(this.data.points.index[k]);
    if (c !== null) this.showTip(k, c.x, c.y);
    this.paint();
  }

  /** The frontier's neighbour of the keyboard's point (`step` -1: left, +1: right). */
  alongFrontier(step: number): number {
    const d = this.data;
    const f = d.frontier;
    if (f.length === 0) return this.focus;
    const at = f.indexOf(this.focus);
    if (at >= 0) return f[Math.min(Math.max(at + step, 0), f.length - 1)];
    // not on the frontier: the frontier's point nearest in memory
    const from = this.focus >= 0 ? this.focus : (d.best ?? d.user);
    const x = d.points.x[from];
    let near = f[0];
    for (const k of f) if (Math.abs(d.points.x[k] - x) < Math.abs(d.points.x[near] - x)) near = k;
    return near;
  }

  /** The next point by tokens/s from the keyboard's (`step` +1: faster, -1: slower). */
  byRate(step: number): number {
    const pts = this.data.points;
    const order = [...pts.index.keys()].sort((a, b) => pts.y[a] - pts.y[b] || pts.x[b] - pts.x[a]);
    const from = this.focus >= 0 ? this.focus : (this.data.best ?? this.data.user);
    const at = order.indexOf(from);
    return order[Math.min(Math.max(at + step, 0), order.length - 1)];
  }

  protected keyAction(key: string): (() => void) | undefined {
    const keys: Record<string, () => void> = {
      ArrowRight: () => this.focusOn(this.alongFrontier(1)),
      ArrowLeft: () => this.focusOn(this.alongFrontier(-1)),
      ArrowUp: () => this.focusOn(this.byRate(1)),
      ArrowDown: () => this.focusOn(this.byRate(-1)),
      Home: () => this.focusOn(this.data.best ?? this.data.user),
      Enter: () => {
        if (this.focus >= 0) this.choose(this.focus);
      },
      Escape: () => {
        this.focus = -1;
        this.tooltip.hide();
        this.paint();
      },
      "+": () => this.zoomAtFocus(0.5),
      "=": () => this.zoomAtFocus(0.5),
      "-": () => this.zoomAtFocus(2),
      "0": () => this.showWindow(fullWindow(this.data)),
    };
    return keys[key];
  }

  private zoomAtFocus(factor: number): void {
    if (this.focus < 0) {
      this.zoom(factor);
      return;
    }
    const w = this.win;
    const fx = (this.data.points.x[this.focus] - w.x0) / (w.x1 - w.x0 || 1);
    const fy = (this.data.points.y[this.focus] - w.y0) / (w.y1 - w.y0 || 1);
    this.zoom(factor, Math.min(Math.max(fx, 0), 1), Math.min(Math.max(fy, 0), 1));
  }

  protected dragFrom(): (dx: number, dy: number) => void {
    const w = { ...this.win };
    const p = this.plot;
    return (dx, dy) => {
      const sx = ((w.x1 - w.x0) / p.w) * dx;
      const sy = ((w.y1 - w.y0) / p.h) * dy;
      this.showWindow({ x0: w.x0 - sx, x1: w.x1 - sx, y0: w.y0 + sy, y1: w.y1 + sy });
    };
  }

  protected wheelAt(x: number, factor: number, y?: number): void {
    const p = this.plot;
    const fx = Math.min(Math.max((x - p.left) / p.w, 0), 1);
    const fy = y === undefined ? 0.5 : Math.min(Math.max(1 - (y - p.top) / p.h, 0), 1);
    this.zoom(factor, fx, fy);
  }
}
