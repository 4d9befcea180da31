// Canvas drawing of the timeline: lanes per rank, an overview strip of the whole
// run, and the memory curve with its peak. Only the visible window is drawn.
import {
  axisTicks,
  FREE,
  firstStepEndingAfter,
  formatBytes,
  fullRange,
  KIND_LANE,
  LANES,
  type TimelineData,
  type Window,
} from "./model";

export interface ThemeColors {
  name: "light" | "dark";
  bg: string;
  fg: string;
  muted: string;
  grid: string;
  accent: string;
}

const FALLBACK: Record<"light" | "dark", ThemeColors> = {
  light: {
    name: "light",
    bg: "#ffffff",
    fg: "#1f1f1f",
    muted: "#616161",
    grid: "#e0e0e0",
    accent: "#D55E00",
  },
  dark: {
    name: "dark",
    bg: "#111111",
    fg: "#e0e0e0",
    muted: "#9e9e9e",
    grid: "#333333",
    accent: "#FF8C42",
  },
};

/** JupyterLab's theme (body[data-jp-theme-light]) or the OS preference, with its CSS colours. */
export function readTheme(el: HTMLElement): ThemeColors {
  const flag = document.body.dataset.jpThemeLight;
  const dark =
    flag !== undefined
      ? flag === "false"
      : typeof matchMedia === "function" && matchMedia("(prefers-color-scheme: dark)").matches;
  const base = FALLBACK[dark ? "dark" : "light"];
  const css = getComputedStyle(el);
  const v = (name: string, fallback: string): string =>
    css.getPropertyValue(name).trim() || fallback;
  return {
    name: base.name,
    bg: v("--jp-layout-color0", base.bg),
    fg: v("--jp-ui-font-color0", base.fg),
    muted: v("--jp-ui-font-color2", base.muted),
    grid: v("--jp-border-color2", base.grid),
    accent: base.accent,
  };
}

export interface Layout {
  width: number;
  height: number;
  labelW: number;
  plotW: number;
  laneH: number;
  laneTop: (rank: number, lane: number) => number;
  lanesBottom: number;
  axisH: number;
  overviewTop: number;
  overviewH: number;
  memTop: number;
  memH: number;
}

export function computeLayout(data: TimelineData, width: number): Layout {
  const labelW = 150;
  const laneH = 22;
  const laneGap = 4;
  const rankGap = 10;
  const top = 6;
  const rankH = LANES.length * (laneH + laneGap) + rankGap;
  const lanesBottom = top + data.ranks.length * rankH - rankGap;
  const axisH = 18;
  const overviewTop = lanesBottom + axisH + 6;
  const overviewH = 18;
  const memTop = overviewTop + overviewH + 10;
  const memH = data.memory !== null ? 90 : 0;
  return {
    width,
    height: memTop + memH + (memH > 0 ? 16 : 0),
    labelW,
    plotW: Math.max(width - labelW - 10, 50),
    laneH,
    laneTop: (rank, lane) => top + rank * rankH + lane * (laneH + laneGap),
    lanesBottom,
    axisH,
    overviewTop,
    overviewH,
    memTop,
    memH,
  };
}

export const xToPx = (win: Window, l: Layout, x: number): number =>
  l.labelW + ((x - win.x0) / (win.x1 - win.x0 || 1)) * l.plotW;
export const pxToX = (win: Window, l: Layout, px: number): number =>
  win.x0 + ((px - l.labelW) / l.plotW) * (win.x1 - win.x0);

export interface DrawState {
  step: number;
  selectedUnit: number;
  win: Window;
  theme: ThemeColors;
  layout: Layout;
}

function hatch(
  ctx: CanvasRenderingContext2D,
  x: number,
  y: number,
  w: number,
  h: number,
  color: string,
): void {
  ctx.save();
  ctx.beginPath();
  ctx.rect(x, y, w, h);
  ctx.clip();
  ctx.strokeStyle = color;
  ctx.lineWidth = 1;
  ctx.beginPath();
  for (let d = -h; d < w; d += 5) {
    ctx.moveTo(x + d, y + h);
    ctx.lineTo(x + d + h, y);
  }
  ctx.stroke();
  ctx.restore();
}

function label(
  ctx: CanvasRenderingContext2D,
  text: string,
  x: number,
  y: number,
  w: number,
  h: number,
  color: string,
): void {
  if (w < 28) return;
  const shown = ctx.measureText(text).width <= w - 6 ? text : "";
  if (!shown) return;
  ctx.fillStyle = color;
  ctx.fillText(shown, x + w / 2, y + h / 2);
}

/** Black or white text on `hex`, whichever contrasts more. */
export function textOn(hex: string): string {
  const n = parseInt(hex.slice(1), 16);
  const lum = (0.299 * ((n >> 16) & 255) + 0.587 * ((n >> 8) & 255) + 0.114 * (n & 255)) / 255;
  return lum > 0.55 ? "#000000" : "#ffffff";
}

export function drawMain(ctx: CanvasRenderingContext2D, data: TimelineData, st: DrawState): void {
  const { layout: l, win, theme } = st;
  ctx.clearRect(0, 0, l.width, l.memTop + l.memH + 16);
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.fillStyle = theme.muted;
  data.ranks.forEach((rank, r) => {
    LANES.forEach((lane, k) => {
      ctx.fillText(`${rank} · ${lane}`, l.labelW - 8, l.laneTop(r, k) + l.laneH / 2);
    });
  });
  ctx.save();
  ctx.beginPath();
  ctx.rect(l.labelW, 0, l.plotW, l.lanesBottom + 2);
  ctx.clip();
  ctx.textAlign = "center";
  ctx.strokeStyle = theme.muted;
  ctx.setLineDash([2, 3]);
  for (const x of data.iteration_starts.slice(1)) {
    const px = xToPx(win, l, x);
    ctx.beginPath();
    ctx.moveTo(px, 0);
    ctx.lineTo(px, l.lanesBottom);
    ctx.stroke();
  }
  ctx.setLineDash([]);
  drawCompute(ctx, data, st);
  drawEvents(ctx, data, st);
  ctx.restore();
  drawAxis(ctx, data, st);
  drawCursor(ctx, data, st, 0, l.lanesBottom);
}

function drawCompute(ctx: CanvasRenderingContext2D, data: TimelineData, st: DrawState): void {
  const { layout: l, win, theme } = st;
  const c = data.compute;
  for (let i = 0; i < c.x0.length; i++) {
    if (c.x1[i] < win.x0 || c.x0[i] > win.x1) continue;
    const x = xToPx(win, l, c.x0[i]);
    const w = Math.max(xToPx(win, l, c.x1[i]) - x - 1, 1);
    const y = l.laneTop(c.rank[i], 0);
    const color = data.colors[c.unit[i]];
    ctx.globalAlpha = c.phase[i] === 0 ? 1 : 0.55;
    ctx.fillStyle = color;
    ctx.fillRect(x, y, w, l.laneH);
    ctx.globalAlpha = 1;
    if (c.unit[i] === st.selectedUnit) {
      ctx.strokeStyle = theme.fg;
      ctx.lineWidth = 2;
      ctx.strokeRect(x + 1, y + 1, w - 2, l.laneH - 2);
    }
    const name = data.units[c.unit[i]] || "(root)";
    label(ctx, c.phase[i] === 0 ? name : `${name} (bwd)`, x, y, w, l.laneH, textOn(color));
  }
}

function drawEvents(ctx: CanvasRenderingContext2D, data: TimelineData, st: DrawState): void {
  const { layout: l, win, theme } = st;
  const s = data.steps;
  for (let i = firstStepEndingAfter(s, win.x0); i < data.n_steps && s.x0[i] <= win.x1; i++) {
    const lane = KIND_LANE[s.kind[i]];
    const y = l.laneTop(s.rank[i], lane);
    const x = xToPx(win, l, s.x0[i]);
    const x1 = xToPx(win, l, s.x1[i]);
    const color = data.colors[s.unit[i]];
    if (s.kind[i] === FREE) {
      ctx.fillStyle = theme.fg;
      ctx.fillRect(x1 - 1, y - 2, 2, l.laneH + 4);
    } else {
      const w = Math.max(x1 - x - 1, 1);
      ctx.fillStyle = color;
      ctx.fillRect(x, y, w, l.laneH);
      if (s.prefetch[i]) hatch(ctx, x, y, w, l.laneH, textOn(color));
      label(ctx, data.units[s.unit[i]] || "(root)", x, y, w, l.laneH, textOn(color));
    }
    if (s.unit[i] === st.selectedUnit && s.kind[i] !== FREE) {
      ctx.strokeStyle = theme.fg;
      ctx.lineWidth = 2;
      ctx.strokeRect(x + 1, y + 1, Math.max(x1 - x - 3, 1), l.laneH - 2);
    }
    if (i === st.step) {
      ctx.strokeStyle = theme.accent;
      ctx.lineWidth = 3;
      ctx.strokeRect(x - 1, y - 2, Math.max(x1 - x + 1, 3), l.laneH + 4);
    }
  }
}

function drawAxis(ctx: CanvasRenderingContext2D, data: TimelineData, st: DrawState): void {
  const { layout: l, win, theme } = st;
  const ticks = axisTicks(win.x0, win.x1, l.plotW, data.timed);
  ctx.fillStyle = theme.muted;
  ctx.textBaseline = "top";
  const y = l.lanesBottom + 5;
  ticks.values.forEach((t, k) => {
    const px = xToPx(win, l, t);
    ctx.fillRect(px, l.lanesBottom + 1, 1, 4);
    // Centred under the tick, kept inside the plot at both ends.
    const half = ctx.measureText(ticks.labels[k]).width / 2;
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

function drawCursor(
  ctx: CanvasRenderingContext2D,
  data: TimelineData,
  st: DrawState,
  y0: number,
  y1: number,
): void {
  if (data.n_steps === 0) return;
  const { layout: l, win, theme } = st;
  const px = xToPx(win, l, data.steps.x0[st.step]);
  if (px < l.labelW || px > l.labelW + l.plotW) return;
  ctx.fillStyle = theme.accent;
  ctx.fillRect(px - 1, y0, 2, y1 - y0);
}

/** The whole run at one pixel per column, drawn once per data/theme/size into `ctx`. */
export function drawOverviewBitmap(
  ctx: CanvasRenderingContext2D,
  data: TimelineData,
  l: Layout,
  theme: ThemeColors,
): void {
  const full = fullRange(data);
  ctx.clearRect(0, 0, l.width, l.overviewH);
  ctx.fillStyle = theme.grid;
  ctx.fillRect(l.labelW, 0, l.plotW, l.overviewH);
  const s = data.steps;
  const h = l.overviewH / 2;
  for (let i = 0; i < data.n_steps; i++) {
    const lane = KIND_LANE[s.kind[i]];
    if (s.kind[i] === FREE) continue;
    const x = xToPx(full, l, s.x0[i]);
    const w = Math.max(xToPx(full, l, s.x1[i]) - x, 1);
    ctx.fillStyle = data.colors[s.unit[i]];
    ctx.fillRect(x, lane === 1 ? 0 : h, w, h);
  }
  ctx.fillStyle = theme.muted;
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.fillText("overview", l.labelW - 8, l.overviewH / 2);
}

export function drawOverlay(
  ctx: CanvasRenderingContext2D,
  bitmap: CanvasImageSource,
  data: TimelineData,
  st: DrawState,
  dpr: number,
): void {
  const { layout: l, win, theme } = st;
  const full = fullRange(data);
  ctx.drawImage(bitmap, 0, l.overviewTop, l.width, l.overviewH);
  void dpr;
  const a = xToPx(full, l, win.x0);
  const b = xToPx(full, l, win.x1);
  ctx.strokeStyle = theme.fg;
  ctx.lineWidth = 1.5;
  ctx.strokeRect(a, l.overviewTop - 1, Math.max(b - a, 2), l.overviewH + 2);
  if (data.n_steps > 0) {
    ctx.fillStyle = theme.accent;
    ctx.fillRect(xToPx(full, l, data.steps.x0[st.step]) - 1, l.overviewTop - 3, 2, l.overviewH + 6);
  }
}

export function drawMemory(ctx: CanvasRenderingContext2D, data: TimelineData, st: DrawState): void {
  const mem = data.memory;
  if (mem === null || mem.bytes.length === 0) return;
  const { layout: l, win, theme } = st;
  const top = l.memTop;
  let max = 0;
  for (const b of mem.bytes) if (b > max) max = b;
  const y = (b: number): number => top + l.memH - (b / (max || 1)) * (l.memH - 14);
  ctx.fillStyle = theme.muted;
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.fillText("memory", l.labelW - 8, top + l.memH / 2);
  ctx.fillText(formatBytes(max), l.labelW - 8, y(max));
  ctx.fillStyle = theme.grid;
  ctx.fillRect(l.labelW, top + l.memH, l.plotW, 1);
  ctx.save();
  ctx.beginPath();
  ctx.rect(l.labelW, top - 2, l.plotW, l.memH + 4);
  ctx.clip();
  ctx.strokeStyle = theme.fg;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  // Each value holds from its x to the next value's; the last to the end of its event.
  const n = mem.x.length;
  const end = (k: number): number => (k + 1 < n ? mem.x[k + 1] : data.steps.x1[mem.step[k]]);
  for (let k = 0; k < n; k++) {
    const x0 = xToPx(win, l, mem.x[k]);
    if (k === 0) ctx.moveTo(x0, y(mem.bytes[k]));
    else ctx.lineTo(x0, y(mem.bytes[k]));
    ctx.lineTo(xToPx(win, l, end(k)), y(mem.bytes[k]));
  }
  ctx.stroke();
  if (data.peak_step !== null) {
    const k = mem.step.indexOf(data.peak_step);
    const px = xToPx(win, l, (mem.x[k] + end(k)) / 2);
    const py = y(mem.bytes[k]);
    ctx.fillStyle = theme.accent;
    ctx.beginPath();
    ctx.moveTo(px - 6, py - 12);
    ctx.lineTo(px + 6, py - 12);
    ctx.lineTo(px, py - 2);
    ctx.closePath();
    ctx.fill();
    ctx.textAlign = "left";
    ctx.fillText(`peak ${formatBytes(mem.bytes[k])}`, px + 8, py - 7);
  }
  ctx.restore();
  drawCursor(ctx, data, st, top, top + l.memH);
}
