// The page that fsdpviz.export.save("report.html") writes: no kernel, no network.
// The timeline widget bundle (timeline.js, embedded base64) renders against an
// in-page model that implements anywidget's model interface; the current step's
// unit is outlined in the plotly explorer and prefetch figures, and a click on a
// unit there selects it in the timeline.
import { type TimelineData, clampStep, describeStep, quote } from "./model";
import type { WidgetModel } from "./widget";

/** What Python writes into <script type="application/json" id="fv-config">. */
export interface PageConfig {
  /** plotly figures to draw first: `{data, layout}` as plotly.py writes them, per div id. */
  figures: Array<{ div: string; figure: { data: unknown[]; layout: unknown } }>;
  plotConfig: Record<string, unknown>;
  timeline: TimelineData;
  theme: "light" | "dark";
  /** Explorer trace 0: the unit of each node (null: not managed by FSDP), by node id. */
  explorer: { div: string; ids: string[]; units: Array<string | null> } | null;
  /** Prefetch figure: x position of each unit (its forward index). */
  prefetch: { div: string; positions: Record<string, number> } | null;
  timelineDiv: string;
  statusDiv: string;
  /** id of the <script type="text/plain"> holding timeline.js, base64-encoded. */
  widgetScript: string;
}

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

/** Outline widths of the explorer's nodes: 3 for `unit`'s modules, 0.5 elsewhere. */
export function explorerWidths(units: Array<string | null>, unit: string | null): number[] {
  return units.map((u) => (unit !== null && u === unit ? 3 : 0.5));
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

export function explorerUnit(config: NonNullable<PageConfig["explorer"]>, point: ClickPoint): string | null {
  let i = typeof point.id === "string" ? config.ids.indexOf(point.id) : -1;
  if (i < 0 && typeof point.pointNumber === "number") i = point.pointNumber;
  return config.units[i] ?? null;
}

export function prefetchUnit(config: NonNullable<PageConfig["prefetch"]>, point: ClickPoint): string | null {
  const u = point.customdata;
  return typeof u === "string" && u in config.positions ? u : null;
}

/** The part of plotly.js the page uses. */
export interface PlotlyLike {
  newPlot(gd: HTMLElement, data: unknown[], layout: unknown, config: unknown): unknown;
  restyle(gd: HTMLElement, update: Record<string, unknown>, traces?: number[]): unknown;
}

interface PlotDiv extends HTMLElement {
  data?: Array<{ name?: string }>;
  on?(event: string, callback: (ev: { points?: ClickPoint[] }) => void): void;
}


/**
 * Keeps the figures in step with the model: outlines the current step's unit in
 * the explorer, rings it (and the selected unit) in the prefetch graph, writes the
 * status line, and turns clicks on the figures into a selection in the timeline.
 */
export class Linker {
  private shown: string | null | undefined = undefined;

  constructor(
    private readonly config: PageConfig,
    private readonly model: PageModel<WidgetModel>,
    private readonly plotly: PlotlyLike,
    private readonly doc: Document,
  ) {}

  start(): void {
    this.model.on("change:step", () => this.update());
    this.model.on("change:selected_unit", () => this.update());
    const explorer = this.div(this.config.explorer?.div);
    const prefetch = this.div(this.config.prefetch?.div);
    explorer?.on?.("plotly_click", (ev) => {
      const p = ev.points?.[0];
      if (p && this.config.explorer) this.select(explorerUnit(this.config.explorer, p));
    });
    prefetch?.on?.("plotly_click", (ev) => {
      const p = ev.points?.[0];
      if (p && this.config.prefetch) this.select(prefetchUnit(this.config.prefetch, p));
    });
    this.update();
  }

  /** Select `unit` in the timeline and move to its next event. */
  select(unit: string | null): void {
    if (unit === null) return;
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
    const status = this.doc.getElementById(this.config.statusDiv);
    if (status !== null) {
      const parts = [describeStep(data, step)];
      if (current !== null) parts.push(`outlined in the figures: unit ${quote(current)}`);
      if (selected) parts.push(`selected: ${quote(selected)}`);
      status.textContent = parts.join(" · ");
    }
    if (current !== this.shown) {
      this.shown = current;
      const explorer = this.div(this.config.explorer?.div);
      if (explorer && this.config.explorer) {
        const widths = explorerWidths(this.config.explorer.units, current);
        this.plotly.restyle(explorer, { "marker.line.width": [widths] }, [0]);
      }
    }
    this.ring("current", current);
    this.ring("selected", selected);
  }

  private ring(name: string, unit: string | null): void {
    const gd = this.div(this.config.prefetch?.div);
    const positions = this.config.prefetch?.positions;
    if (!gd || !positions || !gd.data) return;
    const trace = gd.data.findIndex((t) => t.name === name);
    if (trace < 0) return;
    const x = unit !== null && unit in positions ? [positions[unit]] : [];
    this.plotly.restyle(gd, { x: [x], y: [x.map(() => 0)] }, [trace]);
  }

  private div(id: string | undefined): PlotDiv | null {
    return id === undefined ? null : (this.doc.getElementById(id) as PlotDiv | null);
  }
}

interface WidgetModule {
  default: { render(props: { model: unknown; el: HTMLElement }): unknown };
}

/** Import the embedded widget bundle (an ES module) from a blob: URL, as anywidget does. */
export async function importWidget(base64: string): Promise<WidgetModule> {
  const bytes = Uint8Array.from(atob(base64.replace(/\s+/g, "")), (c) => c.charCodeAt(0));
  const url = URL.createObjectURL(new Blob([bytes], { type: "text/javascript" }));
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
  };
}

/** Read the page's config, draw the figures and the timeline, and link them. */
export async function mount(doc: Document, plotly: PlotlyLike): Promise<PageModel<WidgetModel>> {
  const config = JSON.parse(doc.getElementById("fv-config")?.textContent ?? "null") as PageConfig;
  for (const { div, figure } of config.figures) {
    const gd = doc.getElementById(div);
    if (gd === null) throw new Error(`the page has no element #${div} for a figure`);
    await plotly.newPlot(gd, figure.data, figure.layout, config.plotConfig);
  }
  const model = new PageModel<WidgetModel>(initialState(config));
  const el = doc.getElementById(config.timelineDiv);
  const source = doc.getElementById(config.widgetScript)?.textContent ?? "";
  if (el === null || source === "") throw new Error("the page lacks the timeline or its script");
  const widget = await importWidget(source);
  widget.default.render({ model, el });
  new Linker(config, model, plotly, doc).start();
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

if (typeof document !== "undefined" && document.getElementById("fv-config") !== null) {
  const plotly = window.Plotly;
  if (plotly === undefined) {
    showPageError(document, new Error("plotly.js did not load"));
  } else {
    mount(document, plotly).then(
      (model) => {
        window.fsdpvizModel = model;
        document.body.dataset.fvReady = "true";
      },
      (err: unknown) => showPageError(document, err),
    );
  }
}
