// The page that fsdpviz.export.save("report.html") writes: no kernel, no network.
// The timeline widget bundle (timeline.js, embedded packed) renders against an in-page
// model that implements anywidget's model interface; the explorer and the prefetch graph
// (explorer.ts, prefetch.ts) are drawn below it. The current step's unit is outlined in
// both, and a click on a unit there selects it in the timeline.
import { type ExplorerData, ExplorerView } from "./explorer";
import { quote } from "./format";
import { type PrefetchData, PrefetchView } from "./prefetch";
import { clampStep, type TimelineData } from "./timeline_data";
import type { WidgetModel } from "./timeline_view";

/** What Python writes, as JSON, gzip-compressed and base64-encoded, into <script id="fv-config">. */
export interface PageConfig {
  timeline: TimelineData;
  theme: "light" | "dark";
  /** fsdpviz.views.explorer_data of the report (null: the page has no explorer). */
  explorer: ExplorerData | null;
  /** fsdpviz.views.prefetch.prefetch_data of the report (null: no prefetch graph). */
  prefetch: PrefetchData | null;
  /** The search box: an <input> whose value names a unit or module, and a note beside it. */
  find?: { input: string; note: string } | null;
  /** The elements each view is drawn in. */
  divs: { timeline: string; explorer: string; prefetch: string };
}

/**
 * The page's packed scripts: each holds a text gzip-compressed and base64-encoded
 * (fsdpviz.export's `html_page` writes them), which keeps a big model's page a few MB.
 */
export const PACKED = {
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

/**
 * Keeps the explorer and the prefetch graph in step with the timeline's model: the
 * current step's unit outlined in the explorer and ringed in the prefetch graph (which
 * follows it), the selected unit in both, and the status in the body's data attributes;
 * a click on a unit in either selects it in the timeline and moves to its next event.
 */
export class Linker {
  /** A selection made in the explorer itself: it stays as the click left it. */
  private choosing = false;

  constructor(
    private readonly config: PageConfig,
    private readonly model: PageModel<WidgetModel>,
    readonly explorer: ExplorerView | null,
    readonly prefetch: PrefetchView | null,
    private readonly doc: Document,
  ) {}

  start(): void {
    this.model.on("change:step", () => this.update());
    this.model.on("change:selected_unit", () => this.showSelected());
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
            : `found ${quote(found)}`;
      }
    });
    this.doc.body.dataset.fvFocus = "";
    this.update();
    this.showSelected();
  }

  /** The search box's answer: the module `text` names, drawn and its unit selected. */
  find(text: string): string | null {
    if (this.explorer === null) return null;
    const i = this.explorer.find(text);
    if (i < 0) return null;
    const name = this.explorer.data.modules.name[i];
    this.doc.body.dataset.fvFound = name;
    return name;
  }

  /** A click in the explorer chose `unit`. */
  chosenInExplorer(unit: string | null): void {
    this.choosing = true;
    try {
      this.select(unit);
    } finally {
      this.choosing = false;
    }
  }

  /** Select `unit` in the timeline and move to its next event. */
  select(unit: string | null): void {
    if (unit === null) return;
    this.model.set("selected_unit", unit);
    const s = nextStepOfUnit(this.config.timeline, unit, this.model.get("step"));
    if (s >= 0) this.model.set("step", s);
    this.showSelected();
    this.update();
  }

  private showSelected(): void {
    const selected = this.model.get("selected_unit");
    this.doc.body.dataset.fvSelectedUnit = selected ?? "";
    this.explorer?.setSelected(selected, !this.choosing);
    this.prefetch?.setSelected(selected);
  }

  update(): void {
    const data = this.config.timeline;
    const step = clampStep(this.model.get("step"), data.n_steps);
    const current = unitOfStep(data, step);
    const body = this.doc.body;
    body.dataset.fvStep = String(step);
    body.dataset.fvCurrentUnit = current ?? "";
    this.explorer?.setCurrent(current);
    this.prefetch?.setCurrent(current);
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

/** The browser's next paint, then a task after it; at most `ms` later (a page in a
 * background tab gets no animation frames). */
function afterPaint(doc: Document, ms = 100): Promise<void> {
  return new Promise((resolve) => {
    doc.defaultView?.requestAnimationFrame(() => setTimeout(resolve, 0));
    setTimeout(resolve, ms);
  });
}

/** Draw the timeline (the top of the page). */
export async function mountTimeline(
  doc: Document,
  config: PageConfig,
  widgetSource: string,
): Promise<PageModel<WidgetModel>> {
  const model = new PageModel<WidgetModel>(initialState(config));
  const el = doc.getElementById(config.divs.timeline);
  if (el === null) throw new Error("the page lacks the timeline's element");
  const widget = await importWidget(widgetSource);
  widget.default.render({ model, el });
  performance.mark(`fsdpviz:${config.divs.timeline}`);
  return model;
}

/** Draw the explorer and the prefetch graph below the timeline and link them to the
 * timeline's `model`. */
export function mountViews(
  doc: Document,
  config: PageConfig,
  model: PageModel<WidgetModel>,
): Linker {
  let linker: Linker | null = null;
  const div = (id: string): HTMLElement => {
    const el = doc.getElementById(id);
    if (el === null) throw new Error(`the page has no element #${id} for a view`);
    return el;
  };
  const explorer =
    config.explorer === null
      ? null
      : new ExplorerView(div(config.divs.explorer), config.explorer, {
          select: (unit) => linker?.chosenInExplorer(unit),
          focus: (module) => {
            doc.body.dataset.fvFocus = module;
          },
        });
  performance.mark(`fsdpviz:${config.divs.explorer}`);
  const prefetch =
    config.prefetch === null
      ? null
      : new PrefetchView(div(config.divs.prefetch), config.prefetch, {
          select: (unit) => linker?.select(unit),
        });
  performance.mark(`fsdpviz:${config.divs.prefetch}`);
  linker = new Linker(config, model, explorer, prefetch, doc);
  linker.start();
  performance.mark("fsdpviz:linked");
  return linker;
}

/**
 * Unpack the page's data and draw it from the top: the timeline first, painted, then the
 * explorer and the prefetch graph, then link them. Each stage leaves a performance mark
 * (`fsdpviz:unpacked`, `fsdpviz:<div>` for the timeline, `fsdpviz:first-view` once it is
 * painted, `fsdpviz:<div>` per view, `fsdpviz:linked`, `fsdpviz:painted` once all of it is
 * on the screen), which benchmarks/bench_views.py reads.
 */
export async function boot(doc: Document): Promise<PageModel<WidgetModel>> {
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
  mountViews(doc, config, model);
  await afterPaint(doc);
  performance.mark("fsdpviz:painted");
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
