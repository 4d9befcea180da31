// The page that fsdpviz.export.save("report.html") writes: no kernel, no network.
// It imports the widget bundle (widget.js, embedded packed) as anywidget does, draws the
// timeline, the explorer and the prefetch graph with it from the state Python wrote (the
// same traits the notebook's widgets have), each against an in-page model that implements
// anywidget's model interface, and links them as fsdpviz.widgets.Dashboard does.

/** The state of one view: its traits (at least its `data`), as the widget would have them. */
export type ViewState = Record<string, unknown> & { data: unknown };

/** What Python writes, as JSON, gzip-compressed and base64-encoded, into <script id="fv-config">. */
export interface PageConfig {
  /** Each view's state; a view the page does not draw is null (a notebook's single
   * explorer or prefetch graph has no timeline). */
  views: { timeline: ViewState | null; explorer: ViewState | null; prefetch: ViewState | null };
  /** The elements each view is drawn in. */
  divs: { timeline: string; explorer: string; prefetch: string };
  /** A tuning's page (tuning.save("tune.html")): its tune view, and the plans it holds,
   * each drawn into `divs` when its point is selected. */
  tune?: TuneConfig | null;
}

/** What a tuning's page holds of one configuration's plan. */
export interface TunePlan {
  /** The packed script that holds its views' states ({@link PlanViews}). */
  script: string;
  title: string;
  /** Its knobs in one line. */
  label: string;
  /** Its summary, as HTML (as a report's page header writes it). */
  header: string;
}

/** The views of one plan, as a packed script of a tuning's page holds them. */
export interface PlanViews {
  views: PageConfig["views"];
}

export interface TuneConfig {
  /** The tune view's state: its data, the selected candidate, the candidates saved. */
  state: ViewState;
  div: string;
  /** The plans the page holds, by candidate index. */
  plans: Record<string, TunePlan>;
  /** Which plans the page holds, in words. */
  kept: string;
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

/** What the page uses of the widget bundle (widget.ts). */
export interface WidgetModule {
  default: { render(props: { model: unknown; el: HTMLElement }): unknown };
  timelineDefaults(data: never): object;
  explorerDefaults(data: never): object;
  prefetchDefaults(data: never): object;
  tuneDefaults(data: never): object;
  linkViews(models: { timeline: unknown; explorer: unknown; prefetch: unknown }): () => void;
}

/** Import the embedded widget bundle (an ES module) from a blob: URL, as anywidget does. */
export async function importWidget(source: string): Promise<WidgetModule> {
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  try {
    return (await import(/* webpackIgnore: true */ /* @vite-ignore */ url)) as WidgetModule;
  } finally {
    URL.revokeObjectURL(url);
  }
}

/** The text held by a packed script of the page (see {@link PACKED}). */
export async function unpack(doc: Document, id: string): Promise<string> {
  const packed = doc.getElementById(id)?.textContent;
  if (packed === undefined || packed === null || packed === "") {
    throw new Error(`the page has no packed script #${id}`);
  }
  return await unpackText(packed, `the packed script #${id}`);
}

/** A text packed as fsdpviz packs it (gzip, then base64: fsdpviz.export's `pack`), read
 * back; `what` names it in the error an empty one raises. */
export async function unpackText(packed: string, what = "the packed text"): Promise<string> {
  // a data: URL: the browser decodes base64 natively, far sooner than atob and a loop
  const response = await fetch(`data:application/gzip;base64,${packed.replace(/\s+/g, "")}`);
  const body = response.body;
  if (body === null) throw new Error(`${what} is empty`);
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

export type ViewName = "timeline" | "explorer" | "prefetch";

/** The page's models, one per view drawn. */
export type PageModels = Record<ViewName, PageModel<Record<string, unknown>> | null>;

/** The model of a view: the widget's defaults, then the state Python wrote. */
export function pageModel(
  widget: WidgetModule,
  name: ViewName,
  state: ViewState,
): PageModel<Record<string, unknown>> {
  const defaults = {
    timeline: widget.timelineDefaults,
    explorer: widget.explorerDefaults,
    prefetch: widget.prefetchDefaults,
  }[name](state.data as never);
  return new PageModel<Record<string, unknown>>({ ...defaults, ...state, view: name });
}

/** Draw view `name` of `config` with the widget bundle; null when the page has none. */
export function mountView(
  doc: Document,
  widget: WidgetModule,
  config: PageConfig,
  name: ViewName,
): PageModel<Record<string, unknown>> | null {
  const state = config.views[name];
  if (state === null || state === undefined) return null;
  const el = doc.getElementById(config.divs[name]);
  if (el === null) throw new Error(`the page has no element #${config.divs[name]} for a view`);
  const model = pageModel(widget, name, state);
  widget.default.render({ model, el });
  performance.mark(`fsdpviz:${config.divs[name]}`);
  return model;
}

/** The views drawn by {@link drawViews}: their models, and what removes them all. */
export interface DrawnViews {
  models: PageModels;
  dispose(): void;
}

/**
 * Draw the views of `config` into the elements `els` gives (one per view; a view the
 * config lacks is left out), linked as the page links them: what JupyterLab's fsdpviz
 * renderer draws a saved output or a report file with (`lab.ts`), the page's own path
 * with elements of the renderer's making. The timeline is drawn first and painted.
 */
export async function drawViews(
  widget: WidgetModule,
  config: PageConfig,
  els: Record<ViewName, HTMLElement | null>,
): Promise<DrawnViews> {
  const models: PageModels = { timeline: null, explorer: null, prefetch: null };
  const cleanups: (() => void)[] = [];
  const mount = (name: ViewName): void => {
    const state = config.views[name];
    const el = els[name];
    if (state === null || state === undefined || el === null) return;
    const model = pageModel(widget, name, state);
    const cleanup = widget.default.render({ model, el });
    if (typeof cleanup === "function") cleanups.push(cleanup as () => void);
    models[name] = model;
  };
  mount("timeline");
  const doc = Object.values(els).find((el) => el !== null)?.ownerDocument;
  if (doc !== undefined) await afterPaint(doc);
  mount("explorer");
  mount("prefetch");
  if (models.timeline !== null) cleanups.push(widget.linkViews(models));
  return {
    models,
    dispose: () => {
      for (const cleanup of cleanups.splice(0).reverse()) cleanup();
      for (const model of Object.values(models)) model?.off();
      for (const name of ["timeline", "explorer", "prefetch"] as const) {
        if (models[name] !== null) els[name]?.replaceChildren();
      }
    },
  };
}

/** Mirror the linked state on the body (data-fv-step, -current-unit, -selected-unit), for
 * whoever reads the page from outside (tests, benchmarks). */
function mirror(doc: Document, models: PageModels): void {
  const timeline = models.timeline;
  if (timeline === null) return;
  const show = (): void => {
    const ds = doc.body.dataset;
    ds.fvStep = String(timeline.get("step"));
    ds.fvSelectedUnit = String(timeline.get("selected_unit") ?? "");
    const current = models.explorer ?? models.prefetch;
    ds.fvCurrentUnit = String(current?.get("current_unit") ?? "");
    ds.fvFocus = String(models.explorer?.get("focus") ?? "");
  };
  for (const m of [timeline, models.explorer, models.prefetch]) m?.on("change", () => show());
  show();
}

/**
 * Unpack the page's data and draw it from the top: the timeline first, painted, then the
 * explorer and the prefetch graph, then link them. Each stage leaves a performance mark
 * (`fsdpviz:unpacked`, `fsdpviz:<div>` per view, `fsdpviz:first-view` once the timeline is
 * painted, `fsdpviz:linked`, `fsdpviz:painted` once all of it is on the screen), which
 * benchmarks/bench_views.py reads.
 */
export async function boot(doc: Document): Promise<PageModels> {
  const [configText, widgetSource] = await Promise.all([
    unpack(doc, PACKED.config),
    unpack(doc, PACKED.widget),
  ]);
  performance.mark("fsdpviz:unpacked");
  const config = JSON.parse(configText) as PageConfig;
  const widget = await importWidget(widgetSource);
  if (config.tune) return (await bootTune(doc, widget, config, config.tune)).views;
  const models: PageModels = { timeline: null, explorer: null, prefetch: null };
  models.timeline = mountView(doc, widget, config, "timeline");
  await afterPaint(doc);
  performance.mark("fsdpviz:first-view");
  doc.body.dataset.fvFirstView = "true";
  models.explorer = mountView(doc, widget, config, "explorer");
  models.prefetch = mountView(doc, widget, config, "prefetch");
  if (models.timeline !== null) widget.linkViews(models);
  mirror(doc, models);
  performance.mark("fsdpviz:linked");
  await afterPaint(doc);
  performance.mark("fsdpviz:painted");
  return models;
}

/**
 * A tuning's page: the tune view, then the plan of its selected configuration under it
 * (its timeline, explorer and prefetch graph, linked), which a selection swaps for the
 * newly selected configuration's, unpacked from its script when first shown, or for a
 * note where the page does not hold that plan.
 */
export class TunePage {
  readonly model: PageModel<Record<string, unknown>>;
  /** The candidate whose plan is drawn (null: none; see `missing`). */
  shown: number | null = null;
  drawn: DrawnViews | null = null;
  private readonly plans = new Map<string, Promise<PlanViews>>();
  private turn = 0;

  constructor(
    private readonly doc: Document,
    private readonly widget: WidgetModule,
    private readonly config: PageConfig,
    private readonly tune: TuneConfig,
  ) {
    const el = doc.getElementById(tune.div);
    if (el === null) throw new Error(`the page has no element #${tune.div} for the tune view`);
    const defaults = widget.tuneDefaults(tune.state.data as never);
    this.model = new PageModel<Record<string, unknown>>({
      ...defaults,
      ...tune.state,
      view: "tune",
    });
    widget.default.render({ model: this.model, el });
  }

  /** The models of the plan drawn (all null when none is). */
  get views(): PageModels {
    return this.drawn?.models ?? { timeline: null, explorer: null, prefetch: null };
  }

  /** Draw the plan of candidate `index` (null: none) in place of the one drawn. */
  async show(index: number | null): Promise<void> {
    const turn = ++this.turn;
    const doc = this.doc;
    const plan = index === null ? undefined : this.tune.plans[String(index)];
    const title = doc.getElementById("fv-plan-title");
    const header = doc.getElementById("fv-plan-header");
    const missing = doc.getElementById("fv-plan-missing");
    const views = doc.getElementById("fv-plan-views");
    let states: PlanViews | null = null;
    if (plan !== undefined) {
      let loading = this.plans.get(plan.script);
      if (loading === undefined) {
        loading = unpack(doc, plan.script).then((text) => JSON.parse(text) as PlanViews);
        this.plans.set(plan.script, loading);
      }
      states = await loading;
      if (turn !== this.turn) return; // another selection came meanwhile
    }
    this.drawn?.dispose();
    this.drawn = null;
    this.shown = null;
    if (plan === undefined || states === null) {
      if (title !== null)
        title.textContent =
          index === null ? "Plan" : `Configuration #${index}: its plan is not in this page`;
      if (header !== null) header.replaceChildren();
      if (missing !== null) {
        missing.hidden = false;
        missing.textContent =
          index === null ? "Select a configuration above to see its plan." : this.tune.kept;
      }
      if (views !== null) views.hidden = true;
      doc.body.dataset.fvPlan = "";
      return;
    }
    if (title !== null) title.textContent = plan.title;
    if (header !== null) {
      // fsdpviz's own summary of the plan, escaped in Python as a report's page header is
      header.innerHTML = `<p class="fv-plan-label">${escapeHtml(plan.label)}</p>${plan.header}`;
    }
    if (missing !== null) missing.hidden = true;
    if (views !== null) views.hidden = false;
    const els = {
      timeline: doc.getElementById(this.config.divs.timeline),
      explorer: doc.getElementById(this.config.divs.explorer),
      prefetch: doc.getElementById(this.config.divs.prefetch),
    };
    const drawn = await drawViews(this.widget, { ...this.config, views: states.views }, els);
    if (turn !== this.turn) {
      drawn.dispose();
      return;
    }
    this.drawn = drawn;
    this.shown = index;
    mirror(doc, drawn.models);
    doc.body.dataset.fvPlan = String(index);
  }
}

function escapeHtml(text: string): string {
  return text.replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c] ?? c,
  );
}

/** Draw a tuning's page: its tune view, painted, then the selected configuration's plan;
 * a selection shows another's. */
export async function bootTune(
  doc: Document,
  widget: WidgetModule,
  config: PageConfig,
  tune: TuneConfig,
): Promise<TunePage> {
  const page = new TunePage(doc, widget, config, tune);
  await afterPaint(doc);
  performance.mark("fsdpviz:first-view");
  doc.body.dataset.fvFirstView = "true";
  const show = (): void => {
    const selected = page.model.get("selected");
    page.show(typeof selected === "number" ? selected : null).then(
      () => {
        window.fsdpvizModels = page.views;
        window.fsdpvizModel = page.views.timeline;
      },
      (err: unknown) => showPageError(doc, err),
    );
  };
  page.model.on("change:selected", show);
  const selected = page.model.get("selected");
  await page.show(typeof selected === "number" ? selected : null);
  if (typeof window !== "undefined") window.fsdpvizTune = page;
  performance.mark("fsdpviz:linked");
  await afterPaint(doc);
  performance.mark("fsdpviz:painted");
  return page;
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
    /** The page's models (the timeline's, the explorer's, the prefetch graph's). */
    fsdpvizModels?: PageModels;
    /** The timeline's model. */
    fsdpvizModel?: PageModel<Record<string, unknown>> | null;
    /** A tuning's page: the tune view's model and the plan drawn. */
    fsdpvizTune?: TunePage;
  }
}

if (typeof document !== "undefined" && document.getElementById(PACKED.config) !== null) {
  boot(document).then(
    (models) => {
      window.fsdpvizModels = models;
      window.fsdpvizModel = models.timeline;
      document.body.dataset.fvReady = "true";
    },
    (err: unknown) => showPageError(document, err),
  );
}
