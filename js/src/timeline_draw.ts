// Canvas drawing of the timeline: a group of lanes per rank (or plan), the time axis on top,
// an overview strip of the whole run at the bottom. Everything that depends only on the
// visible window is drawn once into a layer (with the marks a click or hover can pick);
// each step then draws only the cursor and the current event over that layer.
import { axisTicks, byteTicks, formatBytes } from "./format";
import { COLORS, FONT, type ThemeColors, textOn } from "./theme";
import {
  type Capacity,
  FREE,
  fullRange,
  lowerBound,
  type Mark,
  STEP_WORK_LABELS,
  type TimelineData,
  upperBound,
  type Window,
} from "./timeline_data";

const LANE_H: Record<string, number> = { cpu: 24, compute: 20, stream: 22, memory: 116 };
/** A pipeline's microbatches, dark and light alternating (neighbours never share a hue). */
const MICROBATCH_COLORS = COLORS.paletteDark.flatMap((dark: string, k: number) => [
  dark,
  COLORS.paletteLight[(k + 5) % COLORS.paletteLight.length],
]);
const LANE_GAP = 3;
const GROUP_GAP = 10;
const CELL_MAX = 16; // px per event cell in a hook call, at most ...
const MIN_CELL = 7; // ... and at least, while calls can be packed
const MAX_DRIFT = 48; // px a packed call may sit right of its time

export interface Row {
  lane: number;
  top: number;
  h: number;
}

export interface Layout {
  width: number;
  height: number;
  labelW: number;
  plotW: number;
  axisH: number;
  /** One row per lane, in data.lanes order. */
  rows: Row[];
  /** Title rows (when there are several groups): a group's name over each run of its
   * lanes (its stream lanes, later its memory lane), its summary beside the first. */
  titles: Array<{ group: number; top: number; first: boolean }>;
  lanesTop: number;
  lanesBottom: number;
  overviewTop: number;
  overviewH: number;
}

export function computeLayout(data: TimelineData, width: number): Layout {
  const labelW = 156;
  const axisH = 20;
  const titled = data.groups.length > 1;
  const rows: Row[] = [];
  const titles: Layout["titles"] = [];
  let y = axisH + 4;
  const lanesTop = y;
  data.lanes.forEach((lane, i) => {
    const first = i === 0 || data.lanes[i - 1].group !== lane.group;
    if (first) {
      if (i > 0) y += GROUP_GAP;
      if (titled) {
        titles.push({
          group: lane.group,
          top: y,
          first: !titles.some((t) => t.group === lane.group),
        });
        y += 16;
      }
    }
    const h = LANE_H[lane.kind] ?? 22;
    rows.push({ lane: i, top: y, h });
    y += h + LANE_GAP;
  });
  const lanesBottom = y - LANE_GAP;
  const overviewTop = lanesBottom + 10;
  const overviewH = 18;
  return {
    width,
    height: overviewTop + overviewH + 4,
    labelW,
    plotW: Math.max(width - labelW - 12, 50),
    axisH,
    rows,
    titles,
    lanesTop,
    lanesBottom,
    overviewTop,
    overviewH,
  };
}

export const xToPx = (win: Window, l: Layout, x: number): number =>
  l.labelW + ((x - win.x0) / (win.x1 - win.x0 || 1)) * l.plotW;
export const pxToX = (win: Window, l: Layout, px: number): number =>
  win.x0 + ((px - l.labelW) / l.plotW) * (win.x1 - win.x0);

// ---------------------------------------------------------------------------- marks

export const MARK = {
  event: 0,
  call: 1,
  compute: 2,
  wait: 3,
  memory: 4,
  peak: 5,
  /** The optimizer step, or torchao's float8 precomputation (`moment`: its step work). */
  work: 6,
} as const;
export type MarkKind = (typeof MARK)[keyof typeof MARK];

/** What a pointer at (x, y) is on: the kind of mark, and the step (or moment) it stands for. */
export interface Picked {
  kind: MarkKind;
  step: number;
  /** For memory marks: which memory lane and moment. */
  lane: number;
  moment: number;
  x: number;
  y: number;
  w: number;
  h: number;
}

/** Every pickable mark of the drawn layer, in drawing order (later ones are on top). */
export class MarkList {
  n = 0;
  private cap = 0;
  private f = new Float64Array(0);
  private i = new Int32Array(0);

  clear(): void {
    this.n = 0;
  }

  add(
    kind: MarkKind,
    step: number,
    x: number,
    y: number,
    w: number,
    h: number,
    lane = -1,
    moment = -1,
  ): void {
    if (this.n === this.cap) this.grow();
    const k = this.n++;
    this.f.set([x, y, w, h], 4 * k);
    this.i.set([kind, step, lane, moment], 4 * k);
  }

  private grow(): void {
    this.cap = Math.max(1024, this.cap * 2);
    const f = new Float64Array(4 * this.cap);
    f.set(this.f);
    const i = new Int32Array(4 * this.cap);
    i.set(this.i);
    this.f = f;
    this.i = i;
  }

  get(k: number): Picked {
    const f = this.f;
    const i = this.i;
    return {
      kind: i[4 * k] as MarkKind,
      step: i[4 * k + 1],
      lane: i[4 * k + 2],
      moment: i[4 * k + 3],
      x: f[4 * k],
      y: f[4 * k + 1],
      w: f[4 * k + 2],
      h: f[4 * k + 3],
    };
  }

  /** The topmost mark containing (px, py); else the nearest within `slack` px in its row. */
  pick(px: number, py: number, slack = 3): Picked | null {
    const f = this.f;
    let near = -1;
    let best = slack + 1;
    for (let k = this.n - 1; k >= 0; k--) {
      const x = f[4 * k];
      const y = f[4 * k + 1];
      const w = f[4 * k + 2];
      const h = f[4 * k + 3];
      if (py < y || py > y + h) continue;
      if (px >= x && px <= x + w) return this.get(k);
      const d = px < x ? x - px : px - x - w;
      if (d < best) {
        best = d;
        near = k;
      }
    }
    return near >= 0 ? this.get(near) : null;
  }

  /** Marks of `step` of the given kind (for tests and the overlay). */
  of(step: number, kind: MarkKind = MARK.event): Picked[] {
    const out: Picked[] = [];
    for (let k = 0; k < this.n; k++) {
      if (this.i[4 * k] === kind && this.i[4 * k + 1] === step) out.push(this.get(k));
    }
    return out;
  }
}

// ---------------------------------------------------------------------------- indexes

/** The capacity line is on the memory scale while the machine's usable memory is at most
 * this many times what the plan holds (fsdpviz.views.timeline_view_figure.CAPACITY_IN_SCALE). */
export const CAPACITY_IN_SCALE = 3;

/**
 * The top of the memory lanes' y scale, one for all (a comparison's two plans side by
 * side): the most any lane holds, and each lane's reserved estimate and machine's usable
 * memory unless they are more than CAPACITY_IN_SCALE times that (then their line is drawn
 * at the top, marked off scale), as `memory_axis_top` in Python.
 */
export function memoryAxisTop(data: TimelineData, laneMax: number[]): number {
  let held = 0;
  data.memory.forEach((m, k) => {
    held = Math.max(held, laneMax[k] ?? 0, m.peak.bytes);
  });
  let top = held;
  for (const m of data.memory) {
    const cap = m.capacity;
    if (!cap) continue;
    for (const v of [cap.reserved, cap.usable])
      if (v > 0 && v <= CAPACITY_IN_SCALE * held) top = Math.max(top, v);
  }
  return top;
}

/** What drawing needs to find the visible part of each lane quickly (made once per data). */
export class Index {
  /** Per group: [first, end) of its calls (calls are in group order, by x). */
  readonly callRange: Array<[number, number]>;
  /** Steps of each call, by slot. */
  readonly callSteps: number[][];
  /** Per stream lane: its steps by x0, their x0, and the longest one. */
  readonly laneSteps = new Map<number, { steps: number[]; x0: number[]; longest: number }>();
  /** Per group: compute segments and waits, by x0. */
  readonly computeOf: number[][];
  readonly waitsOf: number[][];
  /** Per group: its step work (the optimizer step...), by x0; and the step each leads to. */
  readonly workOf: number[][];
  readonly workStep: number[];
  /** Per memory lane: the most of its totals. */
  readonly memoryMax: number[];
  /** The top of the memory lanes' one y scale (see {@link memoryAxisTop}). */
  readonly memoryTop: number;
  readonly full: Window;
  private readonly widths = new Map<string, number>();
  private boxX = new Float64Array(0);
  private boxW = new Float64Array(0);

  constructor(readonly data: TimelineData) {
    const nGroups = data.groups.length;
    this.callRange = Array.from({ length: nGroups }, () => [0, 0] as [number, number]);
    const calls = data.calls;
    for (let c = calls.group.length - 1; c >= 0; c--) this.callRange[calls.group[c]][0] = c;
    for (let c = 0; c < calls.group.length; c++) this.callRange[calls.group[c]][1] = c + 1;
    this.callSteps = calls.n.map((n) => new Array<number>(n).fill(-1));
    const s = data.steps;
    for (let i = 0; i < data.n_steps; i++) this.callSteps[s.call[i]][s.slot[i]] = i;
    for (let i = 0; i < data.n_steps; i++) {
      if (s.kind[i] === FREE) continue;
      let lane = this.laneSteps.get(s.lane[i]);
      if (lane === undefined) {
        lane = { steps: [], x0: [], longest: 0 };
        this.laneSteps.set(s.lane[i], lane);
      }
      lane.steps.push(i);
      lane.longest = Math.max(lane.longest, s.x1[i] - s.x0[i]);
    }
    for (const lane of this.laneSteps.values()) {
      lane.steps.sort((a, b) => s.x0[a] - s.x0[b] || a - b);
      lane.x0 = lane.steps.map((i) => s.x0[i]);
    }
    const byGroup = (group: number[], x0: number[]): number[][] => {
      const out: number[][] = Array.from({ length: nGroups }, () => []);
      group.forEach((g, k) => {
        out[g].push(k);
      });
      for (const list of out) list.sort((a, b) => x0[a] - x0[b]);
      return out;
    };
    this.computeOf = byGroup(data.compute.group, data.compute.x0);
    this.waitsOf = byGroup(data.waits.group, data.waits.x0);
    const work = data.step_work;
    this.workOf = work ? byGroup(work.group, work.x0) : byGroup([], []);
    // a click on it: the group's last event that starts before it ends
    this.workStep = (work?.x1 ?? []).map((x1, k) => {
      let last = -1;
      for (let i = 0; i < data.n_steps; i++)
        if (s.group[i] === work?.group[k] && s.x0[i] <= x1) last = i;
      return Math.max(last, 0);
    });
    this.memoryMax = data.memory.map((m) => {
      let max = 0;
      for (let k = 0; k < m.total.length; k++) {
        let sum = 0;
        for (const c of m.categories) sum += m.bytes[c][k];
        if (sum > max) max = sum;
      }
      return max;
    });
    this.memoryTop = memoryAxisTop(data, this.memoryMax);
    this.full = fullRange(data);
  }

  /** Width of `text` in the current font (measured once). */
  textWidth(ctx: CanvasRenderingContext2D, text: string): number {
    let w = this.widths.get(text);
    if (w === undefined) {
      w = ctx.measureText(text).width;
      this.widths.set(text, w);
    }
    return w;
  }

  /**
   * Where each visible hook call's cells go in `win` (px): from the call's time, as wide
   * as its events need (at most CELL_MAX each), up to the next call. Calls closer than
   * MIN_CELL px per event (issued at the same time, or zoomed out) are packed one after
   * another, at most MAX_DRIFT px right of their time; beyond that they overlap. Calls that
   * would run past the plot's right edge are pulled back inside it.
   */
  placeCalls(win: Window, l: Layout): void {
    const calls = this.data.calls;
    if (this.boxX.length !== calls.x.length) {
      this.boxX = new Float64Array(calls.x.length);
      this.boxW = new Float64Array(calls.x.length);
    }
    this.boxX.fill(Number.NaN);
    const slack = ((win.x1 - win.x0) / l.plotW) * MAX_DRIFT;
    for (const [first, end] of this.callRange) {
      let c = Math.max(first, lowerBound(calls.x, win.x0 - slack, first, end) - 1);
      let prevEnd = Number.NEGATIVE_INFINITY;
      for (; c < end && calls.x[c] <= win.x1; c++) {
        const x = xToPx(win, l, calls.x[c]);
        let bx = Math.max(x, prevEnd + 1);
        if (bx - x > MAX_DRIFT) bx = x;
        const n = calls.n[c];
        const next = c + 1 < end ? xToPx(win, l, calls.x[c + 1]) : Number.POSITIVE_INFINITY;
        const room = next - bx - 1;
        // by index a call spans its events' slots; on a clock, a few px per event
        const want = this.data.timed ? n * CELL_MAX : xToPx(win, l, calls.x[c] + n) - bx - 1;
        const w = room >= n * MIN_CELL ? Math.min(room, want) : n * MIN_CELL;
        this.boxX[c] = bx;
        this.boxW[c] = w;
        prevEnd = bx + w;
      }
      // the calls at the run's end (the final callback's, the last post-backward's) would
      // run past the plot's right edge: pull the last ones back inside, in order
      let limit = l.labelW + l.plotW;
      for (let k = c - 1; k >= first && !Number.isNaN(this.boxX[k]); k--) {
        if (this.boxX[k] + this.boxW[k] <= limit) break;
        this.boxX[k] = Math.max(limit - this.boxW[k], l.labelW);
        limit = this.boxX[k] - 1;
      }
    }
  }

  /** The x span (px) of a call's cells, as placed by `placeCalls` (else at its time). */
  callBox(c: number, win: Window, l: Layout): [number, number] {
    if (c < this.boxX.length && !Number.isNaN(this.boxX[c])) return [this.boxX[c], this.boxW[c]];
    return [xToPx(win, l, this.data.calls.x[c]), MIN_CELL * this.data.calls.n[c]];
  }

  /** The x span of a step's cell in its call. */
  cell(step: number, win: Window, l: Layout): [number, number] {
    const s = this.data.steps;
    const c = s.call[step];
    const [x, w] = this.callBox(c, win, l);
    const n = this.data.calls.n[c];
    return [x + (w * s.slot[step]) / n, w / n];
  }

  /** The steps of stream lane `lane` that may show in `win`, by start. */
  visibleOnLane(lane: number, win: Window): number[] {
    const entry = this.laneSteps.get(lane);
    if (entry === undefined) return [];
    const a = lowerBound(entry.x0, win.x0 - entry.longest);
    const b = upperBound(entry.x0, win.x1, a);
    const s = this.data.steps;
    return entry.steps.slice(a, b).filter((i) => s.x1[i] >= win.x0);
  }
}

// ---------------------------------------------------------------------------- drawing

export interface Scene {
  data: TimelineData;
  index: Index;
  layout: Layout;
  win: Window;
  theme: ThemeColors;
  selectedUnit: number;
  /** Filled by the drawing, where given: the labels of the memory lanes, as drawn. */
  labels?: LabelBox[];
}

/** A label drawn in a memory lane, its box in CSS px (kept apart from the others). */
export interface LabelBox {
  text: string;
  x: number;
  y: number;
  w: number;
  h: number;
}

function overlap(a: LabelBox, b: LabelBox): number {
  const w = Math.min(a.x + a.w, b.x + b.w) - Math.max(a.x, b.x);
  const h = Math.min(a.y + a.h, b.y + b.h) - Math.max(a.y, b.y);
  return w > 0 && h > 0 ? w * h : 0;
}

/** The first of `candidates` that overlaps none of `taken` (else the one that overlaps
 * them least). */
function placeLabel(candidates: LabelBox[], taken: LabelBox[]): LabelBox {
  let best = candidates[0];
  let least = Number.POSITIVE_INFINITY;
  for (const c of candidates) {
    const o = taken.reduce((sum, t) => sum + overlap(c, t), 0);
    if (o === 0) return c;
    if (o < least) {
      least = o;
      best = c;
    }
  }
  return best;
}

function hatch(
  ctx: CanvasRenderingContext2D,
  x: number,
  y: number,
  w: number,
  h: number,
  color: string,
  gap = 5,
): void {
  ctx.save();
  ctx.beginPath();
  ctx.rect(x, y, w, h);
  ctx.clip();
  ctx.strokeStyle = color;
  ctx.lineWidth = 1;
  ctx.beginPath();
  // only the lines that cross the canvas (a zoomed-in mark can be millions of px wide);
  // the first keeps its phase, so the stripes do not move as the window pans
  const left = Math.max(x, 0);
  const right = Math.min(x + w, ctx.canvas.width);
  const first = -h + Math.max(0, Math.floor((left - x) / gap)) * gap;
  for (let d = first; d < right - x; d += gap) {
    ctx.moveTo(x + d, y + h);
    ctx.lineTo(x + d + h, y);
  }
  ctx.stroke();
  ctx.restore();
}

/** The label that fits in `w` px: `3 layers.2`, else `3`, else nothing. */
function fitLabel(
  ctx: CanvasRenderingContext2D,
  index: Index,
  full: string,
  short: string,
  w: number,
): string {
  if (w < 12) return "";
  if (index.textWidth(ctx, full) <= w - 6) return full;
  if (index.textWidth(ctx, short) <= w - 4) return short;
  return "";
}

function unitLabels(data: TimelineData, unit: number): [string, string] {
  const number = String(data.unit_numbers[unit]);
  const name = data.units[unit] === "" ? "(root)" : data.units[unit];
  return [`${number} ${name}`, number];
}

/** Everything that depends on the window: lanes, labels, axis; fills `marks`. */
export function drawLayer(ctx: CanvasRenderingContext2D, sc: Scene, marks: MarkList): void {
  const { data, layout: l } = sc;
  marks.clear();
  sc.index.placeCalls(sc.win, l);
  ctx.clearRect(0, 0, l.width, l.height);
  ctx.font = FONT;
  drawAxis(ctx, sc);
  drawLaneLabels(ctx, sc);
  ctx.save();
  ctx.beginPath();
  ctx.rect(l.labelW, l.lanesTop - 2, l.plotW, l.lanesBottom - l.lanesTop + 4);
  ctx.clip();
  drawIterationStarts(ctx, sc);
  for (const row of l.rows) {
    const lane = data.lanes[row.lane];
    if (lane.kind === "compute") drawCompute(ctx, sc, row, marks);
    else if (lane.kind === "stream") drawStream(ctx, sc, row, marks);
  }
  for (const row of l.rows) if (data.lanes[row.lane].kind === "cpu") drawCalls(ctx, sc, row, marks);
  for (const row of l.rows)
    if (data.lanes[row.lane].kind === "memory") drawMemory(ctx, sc, row, marks);
  drawMarks(ctx, sc);
  ctx.restore();
  drawMemoryAxes(ctx, sc);
}

function rowOf(l: Layout, lane: number): Row {
  return l.rows[lane];
}

function drawAxis(ctx: CanvasRenderingContext2D, sc: Scene): void {
  const { data, layout: l, win, theme } = sc;
  const ticks = axisTicks(win.x0, win.x1, l.plotW, data.timed);
  ctx.fillStyle = theme.muted;
  ctx.textBaseline = "middle";
  const y = l.axisH / 2;
  ticks.values.forEach((t, k) => {
    const px = xToPx(win, l, t);
    if (px < l.labelW - 0.5 || px > l.labelW + l.plotW + 0.5) return;
    ctx.fillStyle = theme.grid;
    ctx.fillRect(px, l.axisH - 3, 1, l.lanesBottom - l.axisH + 3);
    ctx.fillStyle = theme.muted;
    const half = index(sc).textWidth(ctx, ticks.labels[k]) / 2;
    ctx.textAlign = "center";
    ctx.fillText(
      ticks.labels[k],
      Math.min(Math.max(px, l.labelW + half), l.labelW + l.plotW - half),
      y,
    );
  });
  ctx.textAlign = "right";
  ctx.fillText(data.timed ? `time (${ticks.unit})` : "event", l.labelW - 8, y);
}

const index = (sc: Scene): Index => sc.index;

function drawLaneLabels(ctx: CanvasRenderingContext2D, sc: Scene): void {
  const { data, layout: l, theme } = sc;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  if (data.groups.length > 1) {
    ctx.font = `bold ${FONT}`;
    ctx.textAlign = "left";
    ctx.fillStyle = theme.fg;
    for (const t of l.titles) {
      const g = data.groups[t.group];
      const y = t.top + 7;
      ctx.fillText(g.name, 6, y);
      if (!t.first) continue;
      // the summary after the name: at the lanes' left edge, or past a longer name
      const after = Math.max(l.labelW, 6 + ctx.measureText(g.name).width + 12);
      ctx.fillStyle = theme.muted;
      ctx.font = FONT;
      ctx.fillText(g.summary, after, y);
      ctx.fillStyle = theme.fg;
      ctx.font = `bold ${FONT}`;
    }
    ctx.font = FONT;
    ctx.textAlign = "right";
  }
  ctx.fillStyle = theme.muted;
  for (const row of l.rows) {
    const lane = data.lanes[row.lane];
    if (lane.kind === "memory") {
      // at the left of the column, half-way down: the byte axis's labels are on its right
      ctx.textAlign = "left";
      ctx.fillText("memory per rank", 6, row.top + row.h / 2);
      ctx.textAlign = "right";
    } else {
      ctx.fillText(lane.name, l.labelW - 8, row.top + row.h / 2);
    }
  }
}

function drawIterationStarts(ctx: CanvasRenderingContext2D, sc: Scene): void {
  const { data, layout: l, win, theme } = sc;
  ctx.strokeStyle = theme.muted;
  ctx.setLineDash([2, 3]);
  data.iteration_starts.forEach((starts, g) => {
    const rows = l.rows.filter((r) => data.lanes[r.lane].group === g);
    if (rows.length === 0) return;
    const top = rows[0].top;
    const bottom = rows[rows.length - 1].top + rows[rows.length - 1].h;
    for (const x of starts.slice(1)) {
      const px = Math.round(xToPx(win, l, x)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(px, top);
      ctx.lineTo(px, bottom);
      ctx.stroke();
    }
  });
  ctx.setLineDash([]);
}

function drawCalls(ctx: CanvasRenderingContext2D, sc: Scene, row: Row, marks: MarkList): void {
  const { data, index: ix, layout: l, win, theme } = sc;
  const group = data.lanes[row.lane].group;
  const [first, end] = ix.callRange[group];
  const calls = data.calls;
  const s = data.steps;
  const top = row.top;
  const headH = 10;
  const cellTop = top + headH + 1;
  const cellH = row.h - headH - 1;
  // calls are by x: from the last one starting before the window
  let c = Math.max(first, lowerBound(calls.x, win.x0, first, end) - 1);
  ctx.textBaseline = "middle";
  ctx.textAlign = "left";
  for (; c < end && calls.x[c] <= win.x1; c++) {
    const [x, w] = ix.callBox(c, win, l);
    if (x + w < l.labelW || x > l.labelW + l.plotW) continue;
    ctx.fillStyle = theme.call;
    ctx.fillRect(x, top, w, headH);
    const steps = ix.callSteps[c];
    const hook = calls.hook[c] >= 0 ? data.hooks[calls.hook[c]] : "hook";
    if (w > 30 && steps.length > 0) {
      const name = calls.unit[c] >= 0 ? String(data.unit_numbers[calls.unit[c]]) : "?";
      const full = `${hook} ${name}`;
      ctx.font = "9px system-ui, sans-serif";
      const text = ix.textWidth(ctx, `9|${full}`) <= w - 4 ? full : "";
      ctx.fillStyle = theme.muted;
      if (text) ctx.fillText(text, x + 2, top + headH / 2 + 0.5);
      ctx.font = FONT;
    }
    if (steps.length > 0) marks.add(MARK.call, steps[0], x, top, w, headH);
    const cw = w / Math.max(steps.length, 1);
    steps.forEach((i, k) => {
      const cx = x + k * cw;
      const color = data.colors[s.unit[i]];
      const gap = cw > 4 ? 1 : 0;
      if (s.kind[i] === FREE) {
        ctx.strokeStyle = color;
        ctx.lineWidth = 2;
        ctx.strokeRect(cx + 1 + gap / 2, cellTop + 1, Math.max(cw - 2 - gap, 1), cellH - 2);
        ctx.fillStyle = color;
        ctx.fillRect(cx + gap / 2, cellTop + cellH - 3, Math.max(cw - gap, 1), 3);
      } else {
        ctx.fillStyle = color;
        ctx.fillRect(cx + gap / 2, cellTop, Math.max(cw - gap, 1), cellH);
        if (s.prefetch[i]) hatch(ctx, cx, cellTop, cw - gap, cellH, textOn(color), 4);
      }
      if (s.unit[i] === sc.selectedUnit) {
        ctx.strokeStyle = theme.fg;
        ctx.lineWidth = 1.5;
        ctx.strokeRect(cx + 0.5, cellTop - 0.5, Math.max(cw - 1, 1), cellH + 1);
      }
      marks.add(MARK.event, i, cx, cellTop, cw, cellH);
    });
  }
}

/** Where a flow from the CPU lane ends: the start of the event's box on its stream lane. */
function flowPath(ctx: CanvasRenderingContext2D, sc: Scene, i: number): boolean {
  const { data, index: ix, layout: l, win } = sc;
  const s = data.steps;
  if (s.kind[i] === FREE) return false;
  const cpu = l.rows.find(
    (r) => data.lanes[r.lane].kind === "cpu" && data.lanes[r.lane].group === s.group[i],
  );
  const dst = rowOf(l, s.lane[i]);
  if (cpu === undefined || dst === undefined) return false;
  const [cx, cw] = ix.cell(i, win, l);
  const x0 = cx + cw / 2;
  const y0 = cpu.top + cpu.h;
  const x1 = xToPx(win, l, s.x0[i]) + 1;
  const y1 = dst.top + 1;
  ctx.moveTo(x0, y0);
  const mid = (y0 + y1) / 2;
  ctx.bezierCurveTo(x0, mid, x1, mid, x1, y1);
  return true;
}

function arrowHead(ctx: CanvasRenderingContext2D, sc: Scene, i: number, size: number): void {
  const { data, layout: l, win } = sc;
  const dst = rowOf(l, data.steps.lane[i]);
  const x = xToPx(win, l, data.steps.x0[i]) + 1;
  const y = dst.top + 1;
  ctx.moveTo(x, y);
  ctx.lineTo(x - size / 2, y - size);
  ctx.lineTo(x + size / 2, y - size);
  ctx.closePath();
}

/**
 * The events whose flows (hook cell -> where the collective runs) are drawn: the current
 * event's and the hovered one's, and their neighbours (the other events of the same hook
 * call, the steps just before and after). All of them at once would fan across the
 * lanes and hide the labels (FSDP2, hybrid sharding).
 */
export function flowSteps(sc: Scene, step: number, hovered: number | null): number[] {
  const { data, index } = sc;
  const out = new Set<number>();
  for (const s of [step, hovered]) {
    if (s === null || s < 0 || s >= data.n_steps) continue;
    for (const k of [s - 1, s, s + 1]) if (k >= 0 && k < data.n_steps) out.add(k);
    for (const k of index.callSteps[data.steps.call[s]] ?? []) if (k >= 0) out.add(k);
  }
  return [...out].filter((i) => data.steps.kind[i] !== FREE).sort((a, b) => a - b);
}

/** Faint flows of `steps` (see {@link flowSteps}), drawn over the layer. */
export function drawFlows(ctx: CanvasRenderingContext2D, sc: Scene, steps: number[]): void {
  if (!sc.data.timed || steps.length === 0) return; // by index a collective sits under its cell
  const { layout: l } = sc;
  ctx.save();
  ctx.beginPath();
  ctx.rect(l.labelW - 2, 0, l.plotW + 4, l.lanesBottom + 2);
  ctx.clip();
  ctx.globalAlpha = sc.theme.name === "dark" ? 0.6 : 0.5;
  ctx.strokeStyle = sc.theme.muted;
  ctx.fillStyle = sc.theme.muted;
  ctx.lineWidth = 1;
  for (const i of steps) {
    ctx.beginPath();
    if (!flowPath(ctx, sc, i)) continue;
    ctx.stroke();
    ctx.beginPath();
    arrowHead(ctx, sc, i, 5);
    ctx.fill();
  }
  ctx.restore();
}

/** The current event's flow, in the accent colour (drawn over the layer). */
export function drawFlow(ctx: CanvasRenderingContext2D, sc: Scene, i: number, color: string): void {
  ctx.save();
  ctx.strokeStyle = color;
  ctx.fillStyle = color;
  ctx.lineWidth = 2;
  ctx.beginPath();
  if (flowPath(ctx, sc, i)) {
    ctx.stroke();
    ctx.beginPath();
    arrowHead(ctx, sc, i, 6);
    ctx.fill();
  }
  ctx.restore();
}

function drawCompute(ctx: CanvasRenderingContext2D, sc: Scene, row: Row, marks: MarkList): void {
  const { data, index: ix, layout: l, win, theme } = sc;
  const group = data.lanes[row.lane].group;
  const c = data.compute;
  for (const k of ix.computeOf[group]) {
    if (c.x1[k] < win.x0 || c.x0[k] > win.x1) continue;
    const x = xToPx(win, l, c.x0[k]);
    const w = Math.max(xToPx(win, l, c.x1[k]) - x, 1);
    // pipeline parallelism: coloured and named by microbatch ("2F3": stage 2's forward of 3)
    const mb = c.microbatch?.[k] ?? -1;
    const action = c.label?.[k] ?? "";
    const color =
      mb >= 0 ? MICROBATCH_COLORS[mb % MICROBATCH_COLORS.length] : data.colors[c.unit[k]];
    ctx.globalAlpha = c.phase[k] === 0 ? 1 : 0.6;
    ctx.fillStyle = color;
    ctx.fillRect(x, row.top, w, row.h);
    ctx.globalAlpha = 1;
    if (c.unit[k] === sc.selectedUnit) {
      ctx.strokeStyle = theme.fg;
      ctx.lineWidth = 1.5;
      ctx.strokeRect(x + 0.75, row.top + 0.75, Math.max(w - 1.5, 1), row.h - 1.5);
    }
    const [full, short] = action !== "" ? [action, `${mb}`] : unitLabels(data, c.unit[k]);
    const text = fitLabel(ctx, ix, c.phase[k] === 0 || action ? full : `${full} (bwd)`, short, w);
    if (text) {
      ctx.fillStyle = textOn(color);
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillText(text, x + w / 2, row.top + row.h / 2);
    }
    marks.add(MARK.compute, c.step[k], x, row.top, w, row.h, -1, k);
  }
  const work = data.step_work;
  if (work) {
    const color = COLORS.categories.optimizer;
    for (const k of ix.workOf[group]) {
      if (work.x1[k] < win.x0 || work.x0[k] > win.x1) continue;
      const x = xToPx(win, l, work.x0[k]);
      const w = Math.max(xToPx(win, l, work.x1[k]) - x, 1);
      ctx.globalAlpha = work.name[k] === "optimizer" ? 1 : 0.6;
      ctx.fillStyle = color;
      ctx.fillRect(x, row.top, w, row.h);
      ctx.globalAlpha = 1;
      const full = STEP_WORK_LABELS[work.name[k]] ?? work.name[k];
      const text = fitLabel(ctx, ix, full, full.split(" ")[0], w);
      if (text) {
        ctx.fillStyle = textOn(color);
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        ctx.fillText(text, x + w / 2, row.top + row.h / 2);
      }
      marks.add(MARK.work, ix.workStep[k], x, row.top, w, row.h, -1, k);
    }
  }
  const wt = data.waits;
  for (const k of ix.waitsOf[group]) {
    if (wt.x1[k] < win.x0 || wt.x0[k] > win.x1) continue;
    const x = xToPx(win, l, wt.x0[k]);
    const w = Math.max(xToPx(win, l, wt.x1[k]) - x, 1);
    ctx.fillStyle = theme.wait_fill;
    ctx.fillRect(x, row.top, w, row.h);
    hatch(ctx, x, row.top, w, row.h, theme.wait, 6);
    const target = wt.step[k];
    const kind = data.kinds[data.steps.kind[target]];
    const what =
      kind === "pp_recv"
        ? `bubble: waits for microbatch ${data.steps.microbatch?.[target] ?? "?"}`
        : `waits for ${waitedKind(kind)} ${data.unit_numbers[data.steps.unit[target]]}`;
    const text = fitLabel(ctx, ix, what, "wait", w);
    if (text) {
      ctx.fillStyle = theme.wait;
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.font = `bold ${FONT}`;
      ctx.fillText(text, x + w / 2, row.top + row.h / 2);
      ctx.font = FONT;
    }
    marks.add(MARK.wait, target, x, row.top, w, row.h, -1, k);
  }
}

function drawStream(ctx: CanvasRenderingContext2D, sc: Scene, row: Row, marks: MarkList): void {
  const { data, index: ix, layout: l, win, theme } = sc;
  const s = data.steps;
  for (const i of ix.visibleOnLane(row.lane, win)) {
    const x = xToPx(win, l, s.x0[i]);
    const x1 = xToPx(win, l, s.x1[i]);
    const w = Math.max(x1 - x, 1);
    const color = data.colors[s.unit[i]];
    const gap = w > 4 ? 1 : 0;
    ctx.fillStyle = color;
    ctx.fillRect(x, row.top, Math.max(w - gap, 1), row.h);
    if (s.prefetch[i]) hatch(ctx, x, row.top, w - gap, row.h, textOn(color));
    const [full, short] = unitLabels(data, s.unit[i]);
    const text = fitLabel(ctx, ix, full, short, w);
    if (text) {
      const tw = ix.textWidth(ctx, text);
      // a plate under the label keeps it readable over the hatching
      if (s.prefetch[i]) {
        ctx.fillStyle = color;
        ctx.fillRect(x + w / 2 - tw / 2 - 2, row.top + row.h / 2 - 6, tw + 4, 12);
      }
      ctx.fillStyle = textOn(color);
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillText(text, x + w / 2, row.top + row.h / 2);
    }
    if (s.unit[i] === sc.selectedUnit) {
      ctx.strokeStyle = theme.fg;
      ctx.lineWidth = 1.5;
      ctx.strokeRect(x + 0.75, row.top + 0.75, Math.max(w - 1.5 - gap, 1), row.h - 1.5);
    }
    marks.add(MARK.event, i, x, row.top, w, row.h);
  }
}

function drawMemory(ctx: CanvasRenderingContext2D, sc: Scene, row: Row, marks: MarkList): void {
  const { data, index: ix, layout: l, win, theme } = sc;
  const m = data.memory.findIndex((entry) => entry.lane === row.lane);
  if (m < 0) return;
  const mem = data.memory[m];
  const max = ix.memoryTop || 1;
  const plotTop = row.top + 16;
  const plotH = row.h - 18;
  const y = (b: number): number => plotTop + plotH - (b / max) * plotH;
  const cats = mem.categories;
  const n = mem.total.length;
  let k = lowerBound(mem.x1, win.x0);
  const cols = new Map<number, number>(); // pixel column -> moment with the most bytes there
  const stack = (q: number, x: number, w: number): void => {
    let base = 0;
    for (let c = 0; c < cats.length; c++) {
      const b = mem.bytes[cats[c]][q];
      if (b <= 0) continue;
      ctx.fillStyle = mem.colors[c];
      const top = y(base + b);
      ctx.fillRect(x, top, w, y(base) - top);
      base += b;
    }
  };
  for (; k < n && mem.x0[k] <= win.x1; k++) {
    const x0 = xToPx(win, l, mem.x0[k]);
    const x1 = xToPx(win, l, mem.x1[k]);
    if (x1 - x0 >= 1.5) {
      stack(k, x0, x1 - x0);
      marks.add(MARK.memory, mem.step[k], x0, plotTop, x1 - x0, plotH, m, k);
    } else {
      const col = Math.floor(x0);
      const had = cols.get(col);
      if (had === undefined || mem.total[k] > mem.total[had]) cols.set(col, k);
    }
  }
  for (const [col, q] of cols) {
    stack(q, col, 1.5);
    marks.add(MARK.memory, mem.step[q], col, plotTop, 1.5, plotH, m, q);
  }
  const taken = mem.capacity ? drawCapacity(ctx, sc, mem.capacity, y, plotTop) : [];
  // the peak: a line at its height, the marker over its moment
  const peak = mem.peak;
  const py = y(peak.bytes);
  ctx.strokeStyle = theme.accent;
  ctx.setLineDash([3, 3]);
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(l.labelW, Math.round(py) + 0.5);
  ctx.lineTo(l.labelW + l.plotW, Math.round(py) + 0.5);
  ctx.stroke();
  ctx.setLineDash([]);
  const px = xToPx(win, l, peak.x);
  if (px >= l.labelW - 6 && px <= l.labelW + l.plotW + 6) {
    ctx.fillStyle = theme.accent;
    ctx.beginPath();
    ctx.moveTo(px - 6, py - 12);
    ctx.lineTo(px + 6, py - 12);
    ctx.lineTo(px, py - 2);
    ctx.closePath();
    ctx.fill();
    // beside the marker, right or left of it, above or below its line: where it covers
    // neither the capacity's label nor the reserved estimate's
    const label = `peak ${formatBytes(peak.bytes)}`;
    const tw = ix.textWidth(ctx, label);
    const box = (x: number, top: number): LabelBox => ({
      text: label,
      x,
      y: top,
      w: tw + 3,
      h: 12,
    });
    const fitsRight = px + 9 + tw < l.labelW + l.plotW;
    const sides = fitsRight ? [px + 8, px - 10 - tw] : [px - 10 - tw, px + 8];
    const below = py + 2 + 12 <= plotTop + plotH ? [py + 2] : [];
    const all = [py - 13, ...below].flatMap((top) => sides.map((x) => box(x, top)));
    const inside = all.filter((b) => b.x >= l.labelW && b.x + b.w <= l.labelW + l.plotW);
    const spot = placeLabel(inside.length > 0 ? inside : all, taken);
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    ctx.fillStyle = theme.bg;
    ctx.fillRect(spot.x, spot.y, spot.w, spot.h);
    ctx.fillStyle = theme.accent;
    ctx.fillText(label, spot.x + 1, spot.y + 6);
    marks.add(MARK.peak, peak.step, px - 7, py - 13, 14, 12, m, peak.moment);
    taken.push(spot);
  }
  sc.labels?.push(...taken);
}

/** Where the capacity line of a memory lane is drawn (CSS px), or null: for tests. */
export function capacityY(sc: Scene, m: number): { usable: number; reserved: number } | null {
  const mem = sc.data.memory[m];
  const cap = mem?.capacity;
  if (!cap) return null;
  const row = rowOf(sc.layout, mem.lane);
  const plotTop = row.top + 16;
  const plotH = row.h - 18;
  const max = sc.index.memoryTop || 1;
  const y = (b: number): number => plotTop + plotH - (b / max) * plotH;
  const at = (b: number): number => (b <= max * 1.000001 ? y(b) : plotTop);
  return { usable: at(cap.usable), reserved: at(cap.reserved) };
}

/**
 * The machine's usable memory as a line, labelled (`H100 SXM 80GB: 77.0 GiB usable`), in
 * the warning colour with the space above it shaded when the plan does not fit; at the
 * lane's top, dotted, when it is off the scale; the reserved estimate dashed.
 */
function drawCapacity(
  ctx: CanvasRenderingContext2D,
  sc: Scene,
  cap: Capacity,
  y: (b: number) => number,
  plotTop: number,
): LabelBox[] {
  const boxes: LabelBox[] = [];
  const { index: ix, layout: l, theme } = sc;
  const left = l.labelW;
  const right = l.labelW + l.plotW;
  const onScale = cap.usable <= (ix.memoryTop || 1) * 1.000001;
  const cy = Math.round(onScale ? y(cap.usable) : plotTop) + 0.5;
  const color = cap.fits ? theme.fg : theme.wait;
  if (!cap.fits && cy > plotTop) {
    ctx.fillStyle = theme.wait_fill;
    ctx.fillRect(left, plotTop, l.plotW, cy - plotTop);
  }
  if (cap.reserved > 0) {
    const above = cap.reserved > (ix.memoryTop || 1) * 1.000001;
    const ry = Math.round(above ? plotTop : y(cap.reserved)) + 0.5;
    ctx.strokeStyle = theme.muted;
    ctx.setLineDash(above ? [2, 3] : [6, 3]);
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(left, ry);
    ctx.lineTo(right, ry);
    ctx.stroke();
    ctx.setLineDash([]);
    const text = `${above ? "▲ " : ""}reserved ≈ ${formatBytes(cap.reserved)}${above ? " (above)" : ""}`;
    const tw = ix.textWidth(ctx, text);
    ctx.fillStyle = theme.bg;
    ctx.fillRect(left + 3, ry - 12, tw + 4, 11);
    ctx.fillStyle = theme.muted;
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    ctx.fillText(text, left + 5, ry - 6.5);
    boxes.push({ text, x: left + 3, y: ry - 12, w: tw + 4, h: 11 });
  }
  ctx.strokeStyle = color;
  ctx.lineWidth = onScale ? 2 : 1.5;
  ctx.setLineDash(onScale ? [] : [2, 3]);
  ctx.beginPath();
  ctx.moveTo(left, cy);
  ctx.lineTo(right, cy);
  ctx.stroke();
  ctx.setLineDash([]);
  const label = onScale
    ? `${cap.label}${cap.fits ? "" : ": does not fit"}`
    : `▲ ${cap.label} (above: ${formatBytes(cap.headroom)} headroom)`;
  ctx.font = `bold ${FONT}`;
  const tw = ctx.measureText(label).width;
  // above its line where there is room, else below; apart from the reserved label
  const at = (ty: number): LabelBox => ({
    text: label,
    x: right - tw - 8,
    y: ty - 6,
    w: tw + 6,
    h: 12,
  });
  const above = onScale && cy - plotTop > 13 ? [at(cy - 7)] : [];
  const box = placeLabel([...above, at(cy + 7)], boxes);
  const ty = box.y + 6;
  ctx.fillStyle = theme.bg;
  ctx.fillRect(box.x, box.y, box.w, box.h);
  ctx.fillStyle = color;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.fillText(label, right - 5, ty);
  ctx.font = FONT;
  boxes.push(box);
  return boxes;
}

/** The memory lane's y axis (in the label column, outside the plot's clip). */
export function drawMemoryAxes(ctx: CanvasRenderingContext2D, sc: Scene): void {
  const { data, index: ix, layout: l, theme } = sc;
  ctx.font = FONT;
  data.memory.forEach((mem, m) => {
    const row = rowOf(l, mem.lane);
    const max = ix.memoryTop || 1;
    const own = ix.memoryMax[m] || 0;
    const plotTop = row.top + 16;
    const plotH = row.h - 18;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const v of byteTicks(max, plotH)) {
      const y = Math.round(plotTop + plotH - (v / max) * plotH) + 0.5;
      ctx.fillStyle = theme.grid;
      ctx.fillRect(l.labelW - 4, y - 0.5, 4, 1);
      if (y < plotTop + 8) continue; // the top is labelled by the maximum below
      ctx.fillStyle = theme.muted;
      ctx.fillText(v === 0 ? "0" : formatBytes(v), l.labelW - 8, y);
    }
    ctx.fillStyle = theme.fg;
    ctx.fillText(own === max ? `max ${formatBytes(max)}` : formatBytes(max), l.labelW - 8, plotTop);
    ctx.fillStyle = theme.grid;
    ctx.fillRect(l.labelW, plotTop + plotH, l.plotW, 1);
    ctx.fillRect(l.labelW - 1, plotTop, 1, plotH);
  });
}

/** The colour a mark of `kind` is drawn in: a stuck collective its own, the others the
 * warning colour. */
export function markColor(theme: ThemeColors, kind: Mark["kind"]): string {
  return kind === "stuck" ? theme.stuck : theme.wait;
}

/**
 * Marks on the events `data.marks` names: where ranks diverge or two plans differ, a flag
 * over a solid outline; where a rank is stuck (its last collective in a flight recorder's
 * dump), a pause sign over a dashed outline, in its own colour.
 */
function drawMarks(ctx: CanvasRenderingContext2D, sc: Scene): void {
  const { data, index: ix, layout: l, win, theme } = sc;
  for (const mark of data.marks) {
    const i = mark.step;
    const s = data.steps;
    const row = rowOf(l, s.lane[i]);
    const [x, w] =
      s.kind[i] === FREE
        ? ix.cell(i, win, l)
        : [xToPx(win, l, s.x0[i]), xToPx(win, l, s.x1[i]) - xToPx(win, l, s.x0[i])];
    const color = markColor(theme, mark.kind);
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 2;
    if (mark.kind === "stuck") {
      ctx.setLineDash([4, 2]);
      ctx.strokeRect(x - 2, row.top - 2, Math.max(w, 2) + 4, row.h + 4);
      ctx.setLineDash([]);
      ctx.fillRect(x - 1, row.top - 11, 3, 8);
      ctx.fillRect(x + 4, row.top - 11, 3, 8);
      continue;
    }
    ctx.strokeRect(x - 1, row.top - 1, Math.max(w, 2) + 2, row.h + 2);
    ctx.beginPath();
    ctx.moveTo(x - 1, row.top - 1);
    ctx.lineTo(x - 1, row.top - 9);
    ctx.lineTo(x + 7, row.top - 6);
    ctx.lineTo(x - 1, row.top - 3);
    ctx.fill();
  }
}

/** The cursor and the current event over the layer. */
export function drawCurrent(
  ctx: CanvasRenderingContext2D,
  sc: Scene,
  step: number,
  px: number,
): void {
  const { data, index: ix, layout: l, win, theme } = sc;
  if (data.n_steps === 0) return;
  const s = data.steps;
  ctx.save();
  ctx.beginPath();
  ctx.rect(l.labelW - 2, 0, l.plotW + 4, l.lanesBottom + 2);
  ctx.clip();
  ctx.fillStyle = theme.accent;
  ctx.globalAlpha = 0.8;
  ctx.fillRect(Math.round(px) - 1, l.axisH - 2, 2, l.lanesBottom - l.axisH + 2);
  ctx.globalAlpha = 1;
  ctx.strokeStyle = theme.accent;
  ctx.lineWidth = 2.5;
  const [cx, cw] = ix.cell(step, win, l);
  const cpu = l.rows.find(
    (r) => data.lanes[r.lane].kind === "cpu" && data.lanes[r.lane].group === s.group[step],
  );
  if (cpu !== undefined) ctx.strokeRect(cx - 1, cpu.top - 1, Math.max(cw, 2) + 2, cpu.h + 2);
  if (s.kind[step] !== FREE) {
    const row = rowOf(l, s.lane[step]);
    const x0 = xToPx(win, l, s.x0[step]);
    const x1 = xToPx(win, l, s.x1[step]);
    ctx.strokeRect(x0 - 1, row.top - 2, Math.max(x1 - x0, 2) + 2, row.h + 4);
    drawFlow(ctx, sc, step, theme.accent);
  }
  ctx.restore();
}

/** A hovered mark's outline. */
export function drawHover(ctx: CanvasRenderingContext2D, sc: Scene, picked: Picked): void {
  ctx.save();
  ctx.strokeStyle = sc.theme.fg;
  ctx.setLineDash([3, 2]);
  ctx.lineWidth = 1;
  ctx.strokeRect(picked.x - 0.5, picked.y - 0.5, picked.w + 1, picked.h + 1);
  ctx.restore();
}

/** The whole run, drawn once per data/theme/size into `ctx`: every stream lane, one strip per group. */
export function drawOverviewBitmap(
  ctx: CanvasRenderingContext2D,
  data: TimelineData,
  ix: Index,
  l: Layout,
  theme: ThemeColors,
): void {
  const full = ix.full;
  ctx.clearRect(0, 0, l.width, l.overviewH);
  ctx.fillStyle = theme.grid;
  ctx.fillRect(l.labelW, 0, l.plotW, l.overviewH);
  const streams = data.lanes
    .map((lane, i) => (lane.kind === "stream" ? i : -1))
    .filter((i) => i >= 0);
  const h = l.overviewH / Math.max(streams.length, 1);
  const s = data.steps;
  streams.forEach((lane, k) => {
    for (const i of ix.visibleOnLane(lane, full)) {
      const x = xToPx(full, l, s.x0[i]);
      const w = Math.max(xToPx(full, l, s.x1[i]) - x, 1);
      ctx.fillStyle = data.colors[s.unit[i]];
      ctx.fillRect(x, k * h, w, h);
    }
  });
  ctx.fillStyle = theme.muted;
  ctx.font = FONT;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.fillText("overview", l.labelW - 8, l.overviewH / 2);
}

export function drawOverview(
  ctx: CanvasRenderingContext2D,
  bitmap: CanvasImageSource,
  sc: Scene,
  cursorX: number,
): void {
  const { index: ix, layout: l, win, theme } = sc;
  const full = ix.full;
  ctx.clearRect(0, l.overviewTop - 4, l.width, l.overviewH + 8);
  ctx.drawImage(bitmap, 0, l.overviewTop, l.width, l.overviewH);
  const a = xToPx(full, l, win.x0);
  const b = xToPx(full, l, win.x1);
  ctx.strokeStyle = theme.fg;
  ctx.lineWidth = 1.5;
  ctx.strokeRect(a, l.overviewTop - 1, Math.max(b - a, 2), l.overviewH + 2);
  ctx.fillStyle = theme.accent;
  ctx.fillRect(xToPx(full, l, cursorX) - 1, l.overviewTop - 3, 2, l.overviewH + 6);
}

/** What the compute waits for, in words: an FSDP all-gather or reduction, or a tensor-parallel
 *  or context-parallel collective (`tp_all_gather` reads "tensor-parallel all-gather"). */
function waitedKind(kind: string): string {
  if (kind === "all_gather") return "all-gather";
  if (kind.startsWith("tp_")) return `tensor-parallel ${kind.slice(3).replace(/_/g, "-")}`;
  if (kind.startsWith("cp_")) return `context-parallel ${kind.slice(3).replace(/_/g, "-")}`;
  return "reduce";
}
