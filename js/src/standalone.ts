// The page that fsdpviz.export.save("report.html") writes: no kernel, no network.
// The timeline widget bundle (timeline.js, embedded base64) renders against an
// in-page model that implements anywidget's model interface; the current step's
// unit is outlined in the plotly explorer and prefetch figures, and a click on a
// unit there selects it in the timeline.
import { clampStep, type TimelineData } from "./model";
import { type TickedDiv, type TickList, thinnedTicks, tickUpdate } from "./ticks";
import {
  childrenOf,
  type ExplorerTree,
  fittingLabels,
  type TreeView,
  treeView,
  viewTitle,
  viewTrace,
} from "./tree";

export { thinnedTicks, tickUpdate } from "./ticks";
export {
  childrenOf,
  type ExplorerTree,
  fittingLabels,
  type TreeView,
  treeView,
  viewTitle,
  viewTrace,
};

import type { WidgetModel } from "./view";

/** What Python writes, as JSON, gzip-compressed and base64-encoded, into <script id="fv-config">. */
export interface PageConfig {
  /** plotly figures to draw first: `{data, layout}` as plotly.py writes them, per div id. */
  figures: Array<{ div: string; figure: { data: unknown[]; layout: unknown } }>;
  plotConfig: Record<string, unknown>;
  timeline: TimelineData;
  theme: "light" | "dark";
  /**
   * Explorer trace 0: every module's plotly id and unit (null: not managed by FSDP).
   * `tree` is there when the figure draws only part of the modules (a big model): what
   * the page needs to open and close blocks the way fsdpviz.views.explorer_figure does.
   */
  explorer: {
    div: string;
    ids: string[];
    /** Each module's parent id ("" for the root). */
    parents?: string[];
    units: Array<string | null>;
    /** Outline colours: of the current unit's modules, and of the others. */
    outline?: [string, string];
    tree?: ExplorerTree | null;
  } | null;
  /** The search box: an <input> whose value names a unit or module, and a note beside it. */
  find?: { input: string; note: string } | null;
  /** Prefetch figure: x position of each unit (its forward index). */
  prefetch: { div: string; positions: Record<string, number> } | null;
  timelineDiv: string;
}

/**
 * The page's packed scripts: each holds a text gzip-compressed and base64-encoded
 * (fsdpviz.export's `html_page` writes them), which keeps a big model's page a few MB.
 */
export const PACKED = {
  plotly: "fv-plotly",
  config: "fv-config",
  widget: "fv-widget-esm",
} as const;

type Handler = (...args: unknown[]) => void;

/**
 * anywidget's model interface over a plain object: get/set/on/off/save_changes/send.
 * `set` emits `change:<key>` (and `change`) when the value differs; there is no
 * kernel, so `save_changes` has nothing to send and `send` only records the message.
 */
export class PageModel<T extends object> {
  readonly sent: unknown[] = [];
  private readonly handlers = new Map<string, Set<Handler>>();

  constructor(private readonly state: T) {}

  get<K extends keyof T>(key: K): T[K] {
    return this.state[key];
  }

  set<K extends keyof T>(key: K, value: T[K]): void {
    if (Object.is(this.state[key], value)) return;
    this.state[key] = value;
    this.emit(`change:${String(key)}`, value);
    this.emit("change", key, value);
  }

  on(name: string, callback: Handler): void {
    for (const n of name.split(/\s+/).filter(Boolean)) {
      if (!this.handlers.has(n)) this.handlers.set(n, new Set());
      this.handlers.get(n)?.add(callback);
    }
  }

  off(name?: string | null, callback?: Handler | null): void {
    if (!name) {
      this.handlers.clear();
      return;
    }
    if (!callback) this.handlers.delete(name);
    else this.handlers.get(name)?.delete(callback);
  }

  save_changes(): void {}

  send(content: unknown, _callbacks?: unknown, _buffers?: unknown): void {
    this.sent.push(content);
  }

  listeners(): number {
    let n = 0;
    for (const set of this.handlers.values()) n += set.size;
    return n;
  }

  private emit(name: string, ...args: unknown[]): void {
    for (const h of [...(this.handlers.get(name) ?? [])]) h(...args);
  }
}

const ROOT_ID = "<root>"; // fsdpviz.views.tree.ROOT_ID: the plotly id of the model's root

/** Outline colours of the explorer's nodes: `on` for `unit`'s modules, `off` elsewhere
 * (fsdpviz.views.explorer.highlight_lines). */
export function explorerOutline(
  units: Array<string | null>,
  unit: string | null,
  [on, off]: [string, string] = ["#1f1f1f", "#ffffff"],
): string[] {
  return units.map((u) => (unit !== null && u === unit ? on : off));
}

/** The module `text` names: `(root)`, a module id, else the first unit then module whose
 * name contains it (any case), as fsdpviz.widgets.Explorer.find; -1 when none does. */
export function findModule(ids: string[], units: Array<string | null>, text: string): number {
  const t = text.trim();
  if (t === "") return -1;
  if (t === "(root)") return ids.indexOf(ROOT_ID);
  const exact = ids.indexOf(t);
  if (exact >= 0 && t !== ROOT_ID) return exact;
  const low = t.toLowerCase();
  const name = (id: string): string => (id === ROOT_ID ? "(root)" : id).toLowerCase();
  const unitIds = [...new Set(units.filter((u): u is string => u !== null))].map((u) =>
    u === "" ? ROOT_ID : u,
  );
  const unit = unitIds.find((u) => ids.includes(u) && name(u).includes(low));
  if (unit !== undefined) return ids.indexOf(unit);
  return ids.findIndex((id) => name(id).includes(low));
}

/** Name of the unit of the event at `step`, or null when there are no events. */
export function unitOfStep(data: TimelineData, step: number): string | null {
  if (data.n_steps === 0) return null;
  return data.units[data.steps.unit[clampStep(step, data.n_steps)]] ?? null;
}

/** The next step after `from` whose event belongs to `unit` (wrapping around), or -1. */
export function nextStepOfUnit(data: TimelineData, unit: string, from: number): number {
  const u = data.units.indexOf(unit);
  const n = data.n_steps;
  if (u < 0 || n === 0) return -1;
  for (let k = 1; k <= n; k++) {
    const s = (from + k) % n;
    if (data.steps.unit[s] === u) return s;
  }
  return -1;
}

/** A plotly click point: the unit it stands for in the explorer or the prefetch graph. */
export interface ClickPoint {
  id?: unknown;
  pointNumber?: unknown;
  customdata?: unknown;
  data?: { name?: unknown };
}

export function explorerUnit(
  config: NonNullable<PageConfig["explorer"]>,
  point: ClickPoint,
): string | null {
  let i = typeof point.id === "string" ? config.ids.indexOf(point.id) : -1;
  if (i < 0 && typeof point.pointNumber === "number") i = point.pointNumber;
  return config.units[i] ?? null;
}

export function prefetchUnit(
  config: NonNullable<PageConfig["prefetch"]>,
  point: ClickPoint,
): string | null {
  const u = point.customdata;
  return typeof u === "string" && u in config.positions ? u : null;
}

/** The part of plotly.js the page uses. */
export interface PlotlyLike {
  newPlot(gd: HTMLElement, data: unknown[], layout: unknown, config: unknown): unknown;
  restyle(gd: HTMLElement, update: Record<string, unknown>, traces?: number[]): unknown;
  relayout?(gd: HTMLElement, update: Record<string, unknown>): unknown;
}

/** Figures at most this big follow each step at once (unless playing); bigger ones, and
 * any while playing, follow once the steps pause for FOLLOW_AFTER_MS. */
export const QUICK_EXPLORER = 150; // modules drawn
export const QUICK_PREFETCH = 40; // units
export const FOLLOW_AFTER_MS = 250;

interface PlotDiv extends HTMLElement, TickedDiv {
  data?: Array<{
    name?: string;
    ids?: string[];
    parents?: string[];
    x?: number[];
    visible?: unknown;
    marker?: RingStyle;
    texttemplate?: unknown;
  }>;
  _fullData?: Array<{
    level?: string;
    marker?: { size?: number; color?: string; line?: { width?: number } };
  }>;
  _fullLayout?: {
    _size?: { l: number; t: number };
    xaxis?: { _length?: number; range?: number[]; l2p?(v: number): number };
    yaxis?: { l2p?(v: number): number };
  };
  on?(event: string, callback: (ev: { points?: ClickPoint[] }) => unknown): void;
}

/** A ring trace's marker, as plotly.py writes it. */
interface RingStyle {
  size?: number;
  color?: string;
  line?: { width?: number };
}

/** The prefetch graph's ring traces: the current step's unit, the selected unit. */
const RINGS = ["current", "selected"];

/** The element that draws ring trace `trace` of `gd`, placed at the trace's point (hidden
 * when it has none), in the trace's marker size and colour. */
function placeRing(doc: Document, gd: PlotDiv, trace: number): void {
  const t = gd.data?.[trace];
  const L = gd._fullLayout;
  const [size, xaxis, yaxis] = [L?._size, L?.xaxis, L?.yaxis];
  if (t === undefined || size === undefined || !xaxis?.l2p || !yaxis?.l2p) return;
  const id = `fv-ring-${t.name ?? trace}`;
  let el = doc.getElementById(id);
  if (el === null) {
    // the trace's own style (a hidden trace has none in _fullData)
    const full = t.marker ?? gd._fullData?.[trace]?.marker;
    const size = full?.size ?? 20;
    el = doc.createElement("div");
    el.id = id;
    el.className = "fv-ring";
    const line = full?.line?.width ?? 2;
    Object.assign(el.style, {
      position: "absolute",
      pointerEvents: "none",
      boxSizing: "border-box",
      width: `${size}px`,
      height: `${size}px`,
      marginLeft: `${-size / 2}px`,
      marginTop: `${-size / 2}px`,
      borderRadius: "50%",
      border: `${line}px solid ${full?.color ?? "#D55E00"}`,
    });
    if (getComputedStyle(gd).position === "static") gd.style.position = "relative";
    gd.appendChild(el);
  }
  const x = t.x?.[0];
  el.hidden = x === undefined;
  if (x === undefined) return;
  el.style.left = `${size.l + xaxis.l2p(x)}px`;
  el.style.top = `${size.t + yaxis.l2p(0)}px`;
  el.dataset.fvX = String(x);
}

/** What {@link preThinTicks} reads of a figure's layout (and writes: the x ticks). */
interface PreThinLayout {
  margin?: { l?: number; r?: number };
  meta?: { fsdpviz_ticks?: TickList };
  xaxis?: { tickvals?: number[]; ticktext?: string[]; range?: number[] };
}

/**
 * Thin the x ticks of a figure that is `widthPx` wide before its first draw, as
 * tickUpdate does after it (over the axis's set range, else its positions and plotly's
 * padding), so that the check after the draw finds nothing to change: a change re-draws
 * the axis (0.1-0.2 s for a graph of hundreds of units).
 */
function preThinTicks(layout: PreThinLayout | undefined, widthPx: number): void {
  const ticks = layout?.meta?.fsdpviz_ticks;
  const length = widthPx - (layout?.margin?.l ?? 80) - (layout?.margin?.r ?? 80);
  if (!layout || !ticks || ticks.vals.length === 0 || length <= 0) return;
  const range = layout.xaxis?.range;
  const span =
    Array.isArray(range) && range.length === 2
      ? Math.abs(range[1] - range[0])
      : (Math.max(...ticks.vals) - Math.min(...ticks.vals)) / 0.9; // plotly's 5% each side
  const { vals, text } = thinnedTicks(ticks, length, span);
  layout.xaxis = { ...layout.xaxis, tickvals: vals, ticktext: text };
}

/** The width an icicle's slices share: the plot's, inside the figure's margins. */
function labelWidth(gd: HTMLElement, layout: PlotDiv["layout"]): number {
  const margin = (layout as { margin?: { l?: number; r?: number } } | undefined)?.margin;
  return Math.max(0, gd.clientWidth - (margin?.l ?? 80) - (margin?.r ?? 80));
}

/** Give `id` and its ancestors their labels back before plotly zooms to one of them:
 * the top of the figure always shows its label (fittingLabels blanked the slices too
 * narrow for one under their parent). The data is plotly's own: the zoom draws it. */
function labelChain(gd: PlotDiv, id: string): void {
  const t = gd.data?.[0];
  const template = t?.texttemplate;
  if (!t?.ids || !t.parents || !Array.isArray(template)) return;
  const parent = new Map(t.ids.map((x, i) => [x, t.parents?.[i] ?? ""] as [string, string]));
  for (let x: string | undefined = id; x; x = parent.get(x)) {
    const k = t.ids.indexOf(x);
    if (k >= 0) template[k] = "%{label}";
  }
}

/** Whether hierarchy node `id` is `level` or one of its ancestors (a click there zooms out). */
function zoomsOut(gd: PlotDiv, id: unknown, level: string): boolean {
  const t = gd.data?.[0];
  if (typeof id !== "string" || !level || !t?.ids || !t.parents) return false;
  const parent = new Map(t.ids.map((x, i) => [x, t.parents?.[i] ?? ""] as [string, string]));
  for (let x: string | undefined = level; x; x = parent.get(x)) if (x === id) return true;
  return false;
}

/**
 * Keeps the figures in step with the model: outlines the current step's unit in
 * the explorer, rings it (and the selected unit) in the prefetch graph, writes the
 * status line, and turns clicks on the figures into a selection in the timeline.
 */
export class Linker {
  private shown: string | null | undefined = undefined;
  private readonly children: number[][];
  /** The modules the explorer draws (every one when the config has no tree). */
  view: TreeView;
  private figuresTimer: ReturnType<typeof setTimeout> | null = null;
  private readonly ringed = new Map<string, string | null>();

  constructor(
    private readonly config: PageConfig,
    private readonly model: PageModel<WidgetModel>,
    private readonly plotly: PlotlyLike,
    private readonly doc: Document,
  ) {
    const ex = config.explorer;
    const ids = ex?.ids ?? [];
    this.children = ex?.tree ? childrenOf(ids, ex.tree.parents) : ids.map(() => []);
    this.view = ex?.tree
      ? treeView(this.children, 0, ex.tree.budget)
      : { focus: 0, indices: ids.map((_, i) => i), closed: new Set() };
  }

  /** Draw the explorer focused on module `focus` (an index into the config's ids). */
  focus(focus: number): void {
    const ex = this.config.explorer;
    const gd = this.div(ex?.div);
    if (!ex?.tree || gd === null || focus === this.view.focus) return;
    this.view = treeView(this.children, focus, ex.tree.budget);
    const trace = viewTrace(ex.ids, ex.tree, this.children, this.view);
    const units = this.view.indices.map((i) => ex.units[i]);
    trace["marker.line.color"] = explorerOutline(units, this.shown ?? null, ex.outline);
    trace.level = ex.ids[focus]; // drawn from its top, whatever plotly zoomed to before
    trace.texttemplate = fittingLabels(
      trace as { ids: string[]; parents: string[]; labels: string[]; values: number[] },
      labelWidth(gd, gd.layout),
      ex.ids[focus],
    );
    const update: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(trace)) update[k] = [v];
    this.plotly.restyle(gd, update, [0]);
    this.plotly.relayout?.(gd, {
      "title.text": viewTitle(ex.ids, ex.tree, this.view),
      uirevision: focus === 0 ? "explorer" : `explorer:${ex.ids[focus]}`,
    });
    this.doc.body.dataset.fvFocus = focus === 0 ? "" : ex.ids[focus];
  }

  /** The highest focus that draws module `i` (`opened`: with its children). */
  focusFor(i: number, opened: boolean): number {
    const ex = this.config.explorer;
    if (!ex?.tree) return 0;
    const parent = new Map<number, number>();
    this.children.forEach((cs, p) => {
      for (const c of cs) parent.set(c, p);
    });
    const chain = [i];
    for (let p = parent.get(i); p !== undefined; p = parent.get(p)) chain.push(p);
    for (const candidate of chain.reverse()) {
      const view = treeView(this.children, candidate, ex.tree.budget);
      if (view.indices.includes(i) && !(opened && view.closed.has(i))) return candidate;
    }
    return i;
  }

  /** Whether a click on `point` opens a block or goes up (instead of plotly's own zoom):
   * the top, when plotly has not zoomed into it (`level`, the module it shows on top). */
  refocuses(point: ClickPoint, level = ""): boolean {
    const ex = this.config.explorer;
    if (!ex?.tree || typeof point.id !== "string") return false;
    const i = ex.ids.indexOf(point.id);
    const atTop = level === "" || level === point.id;
    return i >= 0 && (this.view.closed.has(i) || (i === this.view.focus && i !== 0 && atTop));
  }

  /** The search box's answer: select the module `text` names and zoom the explorer to it
   * (its parent for a module without children). Returns the module's id, or null. */
  find(text: string): string | null {
    const ex = this.config.explorer;
    const gd = this.div(ex?.div);
    if (!ex) return null;
    const i = findModule(ex.ids, ex.units, text);
    if (i < 0) return null;
    const parents = ex.tree?.parents ?? ex.parents ?? [];
    const parentIndex = ex.ids.indexOf(parents[i] ?? "");
    const leaf = ex.tree ? this.children[i].length === 0 : !parents.includes(ex.ids[i]);
    const top = leaf && parentIndex >= 0 ? parentIndex : i;
    if (ex.tree) this.focus(this.focusFor(top, true));
    const unit = ex.units[i];
    if (unit !== null) this.select(unit);
    if (gd !== null) {
      labelChain(gd, ex.ids[top]);
      this.plotly.restyle(gd, { level: [ex.ids[top]] }, [0]);
    }
    this.doc.body.dataset.fvFound = ex.ids[i];
    return ex.ids[i];
  }

  private explorerClicked(point: ClickPoint): void {
    const ex = this.config.explorer;
    if (!ex) return;
    const i = typeof point.id === "string" ? ex.ids.indexOf(point.id) : -1;
    if (ex.tree && i >= 0) {
      if (this.view.closed.has(i)) this.focus(i);
      else if (i === this.view.focus && i !== 0) {
        const parent = this.children.findIndex((cs) => cs.includes(i));
        if (parent >= 0) this.focus(this.focusFor(parent, true));
      }
    }
    this.select(explorerUnit(ex, point));
  }

  /**
   * Fit `figure`, to be drawn in `div`, to the page before its first draw, so that
   * {@link start} re-draws nothing (a re-draw of a 10,000-module model's figures takes
   * the browser ~0.5 s each): the explorer outlines the first step's unit and labels
   * only the slices whose label can be read (see fittingLabels), and the prefetch
   * graph's ring traces are hidden (elements placed over the plot draw them).
   */
  prepare(div: string, figure: { data: unknown[]; layout?: unknown }): void {
    const ex = this.config.explorer;
    if (ex && div === ex.div && figure.data.length > 0) {
      const data = this.config.timeline;
      const current = unitOfStep(data, clampStep(this.model.get("step"), data.n_steps));
      const units = this.view.indices.map((i) => ex.units[i]);
      const trace = figure.data[0] as { marker?: { line?: Record<string, unknown> } };
      const line = { ...trace.marker?.line, color: explorerOutline(units, current, ex.outline) };
      trace.marker = { ...trace.marker, line };
      this.shown = current;
      const t = figure.data[0] as Record<string, unknown>;
      const gd = this.div(div);
      const arrays = ["ids", "parents", "labels", "values"].every((k) => Array.isArray(t[k]));
      if (gd !== null && arrays && (t.tiling as { orientation?: string })?.orientation !== "h") {
        const fit = t as { ids: string[]; parents: string[]; labels: string[]; values: number[] };
        const layout = figure.layout as PlotDiv["layout"];
        t.texttemplate = fittingLabels(fit, labelWidth(gd, layout), String(t.level ?? fit.ids[0]));
      }
    }
    if (div === this.config.prefetch?.div) {
      for (const t of figure.data as Array<{ name?: string; visible?: unknown }>) {
        if (RINGS.includes(t.name ?? "")) t.visible = false;
      }
      const gd = this.div(div);
      if (gd !== null) preThinTicks(figure.layout as PreThinLayout | undefined, gd.clientWidth);
    }
  }

  start(): void {
    this.startRings();
    this.model.on("change:step", () => this.update());
    this.model.on("change:selected_unit", () => this.update());
    this.model.on("change:playing", () => {
      if (!this.model.get("playing")) this.followStep(); // caught up when playing stops
    });
    const explorer = this.div(this.config.explorer?.div);
    const prefetch = this.div(this.config.prefetch?.div);
    // A click that opens a block or goes up re-draws the explorer itself: plotly must not
    // also zoom to the clicked module (returning false skips its zoom and its plotly_click).
    // A click that zooms out (the path bar, or the block zoomed into) selects nothing.
    let zoomOut = false;
    explorer?.on?.("plotly_click", (ev) => {
      const p = ev.points?.[0];
      if (p && !zoomOut) this.explorerClicked(p);
      zoomOut = false;
    });
    const hierarchyClick = (ev: { points?: ClickPoint[] }): false | undefined => {
      const p = ev.points?.[0];
      const level = (explorer?._fullData?.[0]?.level ?? "") || "";
      zoomOut = false;
      if (p === undefined) return undefined;
      if (this.refocuses(p, level)) {
        this.explorerClicked(p);
        return false;
      }
      zoomOut = explorer !== null && zoomsOut(explorer, p.id, level);
      if (explorer !== null && typeof p.id === "string") labelChain(explorer, p.id);
      return undefined; // plotly zooms: to p, or up from it
    };
    explorer?.on?.("plotly_icicleclick", hierarchyClick);
    explorer?.on?.("plotly_treemapclick", hierarchyClick);
    prefetch?.on?.("plotly_click", (ev) => {
      const p = ev.points?.[0];
      if (p && this.config.prefetch) this.select(prefetchUnit(this.config.prefetch, p));
    });
    // Unit names on the x axis: as many as stand apart at the width drawn.
    const thin = (): void => {
      const update = prefetch === null ? null : tickUpdate(prefetch);
      if (update !== null && prefetch !== null) this.plotly.relayout?.(prefetch, update);
    };
    prefetch?.on?.("plotly_afterplot", thin);
    thin();
    const find = this.config.find;
    const input = find ? (this.doc.getElementById(find.input) as HTMLInputElement | null) : null;
    const note = find ? this.doc.getElementById(find.note) : null;
    input?.addEventListener("change", () => {
      const text = input.value;
      if (text.trim() === "") return;
      const found = this.find(text);
      if (note !== null) {
        note.textContent =
          found === null
            ? `no unit or module matches '${text.trim()}': type a part of a module name, or (root)`
            : `found ${found === ROOT_ID ? "(root)" : `'${found}'`}`;
      }
    });
    this.update();
  }

  /** Select `unit` in the timeline and move to its next event. */
  select(unit: string | null): void {
    if (unit === null) return;
    const ex = this.config.explorer;
    const i = ex ? ex.ids.indexOf(unit === "" ? ROOT_ID : unit) : -1;
    if (ex?.tree && i >= 0 && !this.view.indices.includes(i)) this.focus(this.focusFor(i, false));
    this.model.set("selected_unit", unit);
    const s = nextStepOfUnit(this.config.timeline, unit, this.model.get("step"));
    if (s >= 0) this.model.set("step", s);
    this.update();
  }

  update(): void {
    const data = this.config.timeline;
    const step = clampStep(this.model.get("step"), data.n_steps);
    const current = unitOfStep(data, step);
    const selected = this.model.get("selected_unit");
    const body = this.doc.body;
    body.dataset.fvStep = String(step);
    body.dataset.fvCurrentUnit = current ?? "";
    body.dataset.fvSelectedUnit = selected ?? "";
    this.ring("selected", selected); // a click: at once
    // Restyling a figure takes the browser tens of milliseconds, hundreds for a big one:
    // while the steps come quickly (playing, a held key) the figures follow once they pause.
    const units = Object.keys(this.config.prefetch?.positions ?? {}).length;
    const quick = this.view.indices.length <= QUICK_EXPLORER && units <= QUICK_PREFETCH;
    if (this.figuresTimer !== null) clearTimeout(this.figuresTimer);
    this.figuresTimer = null;
    if (quick && !this.model.get("playing")) this.followStep();
    else {
      this.figuresTimer = setTimeout(() => {
        this.figuresTimer = null;
        if (!this.model.get("playing")) this.followStep();
      }, FOLLOW_AFTER_MS);
    }
  }

  /** The current step's unit outlined in the explorer and ringed in the prefetch graph. */
  followStep(): void {
    const data = this.config.timeline;
    const current = unitOfStep(data, clampStep(this.model.get("step"), data.n_steps));
    if (current !== this.shown) {
      this.shown = current;
      this.outline();
    }
    this.ring("current", current);
  }

  /** Outline the current unit's modules in the explorer. */
  outline(): void {
    const ex = this.config.explorer;
    const explorer = this.div(ex?.div);
    if (!explorer || !ex) return;
    const units = this.view.indices.map((i) => ex.units[i]);
    const colors = explorerOutline(units, this.shown ?? null, ex.outline);
    this.plotly.restyle(explorer, { "marker.line.color": [colors] }, [0]);
  }

  /** Ring `unit` in the prefetch graph. A re-plot of a graph of hundreds of units takes
   * the browser ~200 ms, so the ring is an element placed over the plot (moved on each
   * re-plot), and the trace's own points are hidden; the trace's data follows, so
   * `gd.data` says where each ring is. */
  private ring(name: string, unit: string | null): void {
    const gd = this.div(this.config.prefetch?.div);
    const positions = this.config.prefetch?.positions;
    if (!gd || !positions || !gd.data) return;
    if (this.ringed.get(name) === unit) return; // already there
    this.ringed.set(name, unit);
    const trace = gd.data.findIndex((t) => t.name === name);
    if (trace < 0) return;
    const x = unit !== null && unit in positions ? [positions[unit]] : [];
    Object.assign(gd.data[trace], { x, y: x.map(() => 0) });
    placeRing(this.doc, gd, trace);
  }

  /** Hide the ring traces' own points (the overlays draw them) and keep the overlays in
   * place whenever plotly re-plots (a resize, the axis labels thinned). */
  private startRings(): void {
    const gd = this.div(this.config.prefetch?.div);
    if (!gd?.data) return;
    const traces = gd.data.flatMap((t, i) => (RINGS.includes(t.name ?? "") ? [i] : []));
    if (traces.length === 0) return;
    for (const i of traces) placeRing(this.doc, gd, i);
    // hidden before the first draw when the page prepared the figure (see prepare)
    const shown = traces.filter((i) => gd.data?.[i]?.visible !== false);
    if (shown.length > 0) this.plotly.restyle(gd, { visible: false }, shown);
    gd.on?.("plotly_afterplot", () => {
      for (const i of traces) placeRing(this.doc, gd, i);
    });
  }

  private div(id: string | undefined): PlotDiv | null {
    return id === undefined ? null : (this.doc.getElementById(id) as PlotDiv | null);
  }
}

interface WidgetModule {
  default: { render(props: { model: unknown; el: HTMLElement }): unknown };
}

/** Import the embedded widget bundle (an ES module) from a blob: URL, as anywidget does. */
export async function importWidget(source: string): Promise<WidgetModule> {
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  try {
    return (await import(/* @vite-ignore */ url)) as WidgetModule;
  } finally {
    URL.revokeObjectURL(url);
  }
}

export function initialState(config: PageConfig): WidgetModel {
  return {
    data: config.timeline,
    step: 0,
    playing: false,
    speed: 20,
    selected_unit: null,
    theme: config.theme,
    error: "",
    sync_interval_ms: 100,
    order: "issue",
    note: "",
  };
}

/** The text held by a packed script of the page (see {@link PACKED}). */
export async function unpack(doc: Document, id: string): Promise<string> {
  const packed = doc.getElementById(id)?.textContent;
  if (packed === undefined || packed === null || packed === "") {
    throw new Error(`the page has no packed script #${id}`);
  }
  // a data: URL: the browser decodes base64 natively, far sooner than atob and a loop
  const response = await fetch(`data:application/gzip;base64,${packed.replace(/\s+/g, "")}`);
  const body = response.body;
  if (body === null) throw new Error(`the packed script #${id} is empty`);
  return await new Response(body.pipeThrough(new DecompressionStream("gzip"))).text();
}

/** Run plotly.js's bundle as a classic script (it defines `window.Plotly`). */
function loadPlotly(doc: Document, source: string): PlotlyLike {
  const script = doc.createElement("script");
  script.textContent = source;
  doc.head.append(script);
  script.remove();
  const plotly = doc.defaultView?.Plotly;
  if (plotly === undefined) throw new Error("plotly.js did not load");
  return plotly;
}

/** The browser's next paint, then a task after it; at most `ms` later (a page in a
 * background tab gets no animation frames). */
function afterPaint(doc: Document, ms = 100): Promise<void> {
  return new Promise((resolve) => {
    doc.defaultView?.requestAnimationFrame(() => setTimeout(resolve, 0));
    setTimeout(resolve, ms);
  });
}

/** Draw the timeline (the top of the page; it needs no plotly.js). */
export async function mountTimeline(
  doc: Document,
  config: PageConfig,
  widgetSource: string,
): Promise<PageModel<WidgetModel>> {
  const model = new PageModel<WidgetModel>(initialState(config));
  const el = doc.getElementById(config.timelineDiv);
  if (el === null) throw new Error("the page lacks the timeline's element");
  const widget = await importWidget(widgetSource);
  widget.default.render({ model, el });
  performance.mark(`fsdpviz:${config.timelineDiv}`);
  return model;
}

/** Draw the figures below the timeline, one painted before the next is drawn, and link
 * them to the timeline's `model`. */
export async function mountFigures(
  doc: Document,
  plotly: PlotlyLike,
  config: PageConfig,
  model: PageModel<WidgetModel>,
): Promise<void> {
  const linker = new Linker(config, model, plotly, doc);
  for (const { div, figure } of config.figures) {
    const gd = doc.getElementById(div);
    if (gd === null) throw new Error(`the page has no element #${div} for a figure`);
    linker.prepare(div, figure);
    await plotly.newPlot(gd, figure.data, figure.layout, config.plotConfig);
    performance.mark(`fsdpviz:${div}`);
    await afterPaint(doc);
  }
  linker.start();
  performance.mark("fsdpviz:linked");
}

/**
 * Unpack the page's scripts and draw it from the top: the timeline first (shown and
 * usable while plotly.js starts), then each figure, then link them. Each stage leaves a
 * performance mark (`fsdpviz:unpacked`, `fsdpviz:<div>` for the timeline,
 * `fsdpviz:first-view` once it is painted, `fsdpviz:plotly`, `fsdpviz:<div>` per figure,
 * `fsdpviz:linked`), which benchmarks/bench_views.py reads.
 */
export async function boot(doc: Document): Promise<PageModel<WidgetModel>> {
  const plotlySource = unpack(doc, PACKED.plotly); // unpacked while the timeline draws
  const [configText, widgetSource] = await Promise.all([
    unpack(doc, PACKED.config),
    unpack(doc, PACKED.widget),
  ]);
  performance.mark("fsdpviz:unpacked");
  const config = JSON.parse(configText) as PageConfig;
  const model = await mountTimeline(doc, config, widgetSource);
  await afterPaint(doc);
  performance.mark("fsdpviz:first-view");
  doc.body.dataset.fvFirstView = "true";
  const plotly = loadPlotly(doc, await plotlySource);
  performance.mark("fsdpviz:plotly");
  await mountFigures(doc, plotly, config, model);
  return model;
}

function showPageError(doc: Document, err: unknown): void {
  const pre = doc.createElement("pre");
  pre.className = "fv-page-error";
  pre.textContent = `fsdpviz page error: ${err instanceof Error ? err.message : String(err)}`;
  doc.body.prepend(pre);
  console.error(err);
}

declare global {
  interface Window {
    Plotly?: PlotlyLike;
    fsdpvizModel?: PageModel<WidgetModel>;
  }
}

if (typeof document !== "undefined" && document.getElementById(PACKED.config) !== null) {
  boot(document).then(
    (model) => {
      window.fsdpvizModel = model;
      document.body.dataset.fvReady = "true";
    },
    (err: unknown) => showPageError(document, err),
  );
}
