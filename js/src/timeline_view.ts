// The timeline widget's view: its elements, the controls above the canvas, what it shows
// (data, window, theme, selection, hover) and its drawing. timeline_widget.ts binds it to the
// model's traits and to the page.
import type { AnyModel } from "@anywidget/types";
import { button, element, guarded, showViewError, Tooltip, zoomButtons } from "./dom";
import { axisTicks, exactBytes, formatBytes, formatSeconds, quote } from "./format";
import { animationFrames, Player, Throttle } from "./player";
import { type ThemeColors, takeTheme } from "./theme";
import {
  clampStep,
  computeDetails,
  cursorX,
  describeStep,
  eventDetails,
  exposedText,
  FREE,
  follow,
  memoryDetails,
  nearestStep,
  type Order,
  orderOf,
  pipelineSubject,
  stepWorkDetails,
  type TimelineData,
  tailPlace,
  unitText,
  type Window,
} from "./timeline_data";
import {
  capacityY,
  computeLayout,
  drawCurrent,
  drawFlows,
  drawHover,
  drawLayer,
  drawOverview,
  drawOverviewBitmap,
  flowSteps,
  Index,
  type LabelBox,
  type Layout,
  MARK,
  MarkList,
  type Picked,
  pxToX,
  type Scene,
  xToPx,
} from "./timeline_draw";
import { dataOf } from "./wire";

/** The traits of fsdpviz.widgets.TimelineWidget. */
export interface TimelineModel {
  view: "timeline";
  data: TimelineData;
  step: number;
  playing: boolean;
  speed: number;
  order: Order;
  selected_unit: string | null;
  /** A re-plan is on its way: nothing of the old plan is shown meanwhile. */
  busy: boolean;
  error: string;
  note: string;
  sync_interval_ms: number;
}

/** What the timeline starts with when Python gives only its data (the exported page). */
export function timelineDefaults(data: TimelineData): TimelineModel {
  return {
    view: "timeline",
    data,
    step: 0,
    playing: false,
    speed: 20,
    order: "issue",
    selected_unit: null,
    busy: false,
    error: "",
    note: "",
    sync_interval_ms: 150,
  };
}

type Model = AnyModel<TimelineModel>;

const SPEEDS = [1, 5, 20, 100, 500];
const MIN_WIDTH = 360;
/** Steps of one iteration beyond which the first view shows a part of it. */
const MAX_FIRST_STEPS = 1000;

/** The width of x the timeline shows first: one whole iteration (the first shown), or
 * MAX_FIRST_STEPS / 2 steps' worth of it when it has more than MAX_FIRST_STEPS. */
export function firstSpan(data: TimelineData, full: Window): number {
  const width = full.x1 - full.x0;
  const starts = data.iteration_starts[0] ?? [];
  const first = data.n_steps > 0 ? data.steps.iteration[0] : 0;
  let steps = 0;
  for (let i = 0; i < data.n_steps; i++) if (data.steps.iteration[i] === first) steps++;
  const iteration = starts.length > 1 ? starts[1] - full.x0 : width;
  const span = Math.min(Math.max(iteration, 0) || width, width);
  return steps > MAX_FIRST_STEPS ? (span * MAX_FIRST_STEPS) / 2 / steps : span;
}

/** `fn` on the next animation frame (a timer where there are no frames); returns a handle. */
export function nextFrame(fn: () => void): number {
  if (typeof requestAnimationFrame === "function") return requestAnimationFrame(() => fn());
  return setTimeout(fn, 16) as unknown as number;
}

/** What the marks mean (colour says which unit; the number on a block says it too). */
function legend(data: TimelineData): HTMLElement {
  const el = element("div", "fv-legend");
  const items: Array<[string, string]> = [
    ["fv-call", "hook call (CPU), its events below it"],
    ["fv-solid", "collective on its stream, numbered by unit"],
    ["fv-hatch", "prefetch"],
    ["fv-free", "free (reshard)"],
    ["fv-flow", "issued → runs"],
    ["fv-pale", "backward compute"],
    ["fv-wait", "compute waiting for communication (exposed)"],
  ];
  // one entry per kind of mark: where ranks diverge (or plans differ), where a rank is stuck
  const kinds = new Map<string, string>();
  for (const m of data.marks) {
    const kind = m.kind ?? "diverge";
    if (!kinds.has(kind)) kinds.set(kind, m.text);
  }
  for (const [kind, text] of kinds) items.push([kind === "stuck" ? "fv-stuck" : "fv-flag", text]);
  const cap = data.memory.find((m) => m.capacity)?.capacity;
  if (cap) {
    items.push([
      cap.fits ? "fv-capacity" : "fv-capacity fv-no-fit",
      `usable device memory (${cap.machine})`,
    ]);
    if (cap.reserved > 0) items.push(["fv-reserved", "reserved by the allocator (estimate)"]);
  }
  for (const [kind, text] of items) {
    const item = document.createElement("span");
    item.dataset.fvLegend = kind;
    const swatch = element("span", `fv-swatch ${kind}`);
    item.append(swatch, text);
    el.appendChild(item);
  }
  for (const mem of data.memory.slice(0, 1)) {
    mem.categories.forEach((c, k) => {
      const item = document.createElement("span");
      const swatch = element("span", "fv-swatch");
      swatch.style.background = mem.colors[k];
      item.append(swatch, c.replace(/_/g, " "));
      el.appendChild(item);
    });
  }
  return el;
}

export interface Controls {
  bar: HTMLElement;
  slider: HTMLInputElement;
  playButton: HTMLButtonElement;
  peakButton: HTMLButtonElement;
  speed: HTMLSelectElement;
  order: HTMLSelectElement;
}

/** The view of one widget (or of the exported page's timeline). */
export class TimelineView {
  readonly root: HTMLElement;
  readonly header: HTMLElement;
  readonly canvas: HTMLCanvasElement;
  readonly tooltip: Tooltip;
  readonly info: HTMLElement;
  readonly caption: HTMLElement;
  legendEl: HTMLElement;
  readonly controls: Controls;
  readonly player: Player;
  data: TimelineData;
  index: Index;
  layout: Layout;
  theme: ThemeColors;
  win: Window;
  span = 1;
  order: Order;
  selectedUnit = -1;
  hovered: Picked | null = null;
  /** Where the cursor was put other than at its event (the peak button, a click on the memory
   * lane): at that moment of that step, until the step changes. */
  pinned: { step: number; x: number; lane: number; moment: number } | null = null;
  /** The bottleneck table's rows, by step (for the current row's outline). */
  bottleneckRows = new Map<number, HTMLTableRowElement>();
  bottlenecksEl: HTMLElement;
  disposed = false;
  /** The marks of the drawn layer (what a click or hover picks). */
  readonly marks = new MarkList();
  /** The memory lanes' labels as last drawn (kept apart: tests read them). */
  labels: LabelBox[] = [];
  /** Milliseconds the last draw and the last pick took (the benchmark reads them). */
  lastDrawMs = 0;
  lastPickMs = 0;
  private readonly layer: HTMLCanvasElement;
  private readonly overview: HTMLCanvasElement;
  private layerKey = "";
  private width = MIN_WIDTH;
  private measured = false; // the width was measured (the view was in the page)
  private remeasure = 0;
  private readonly sync: Throttle<number>;

  constructor(
    readonly model: Model,
    el: HTMLElement,
  ) {
    this.root = element("div", "fsdpviz-timeline");
    el.appendChild(this.root);
    this.header = element("div", "fv-header");
    this.canvas = element("canvas", "fv-canvas");
    this.canvas.tabIndex = 0;
    this.canvas.setAttribute("aria-label", "FSDP event timeline; arrow keys step, space plays");
    const stage = element("div", "fv-stage");
    stage.append(this.canvas);
    this.tooltip = new Tooltip(stage);
    this.info = element("div", "fv-info");
    this.info.setAttribute("aria-live", "polite");
    this.caption = element("div", "fv-note");
    this.data = dataOf<TimelineData>(model);
    this.legendEl = legend(this.data);
    this.bottlenecksEl = element("div", "fv-bottlenecks");
    this.controls = this.makeControls();
    this.root.append(
      this.header,
      this.controls.bar,
      stage,
      this.info,
      this.legendEl,
      this.caption,
      this.bottlenecksEl,
    );
    this.layer = document.createElement("canvas");
    this.overview = document.createElement("canvas");
    this.index = new Index(this.data);
    this.layout = computeLayout(this.data, 800);
    this.theme = takeTheme(this.root);
    this.win = this.index.full;
    this.order = model.get("order") === "stream" ? "stream" : "issue";
    this.sync = new Throttle<number>(model.get("sync_interval_ms") || 150, (step) => {
      model.set("step", step);
      model.save_changes();
    });
    this.player = new Player({
      n: this.data.n_steps,
      step: model.get("step"),
      speed: model.get("speed"),
      order: orderOf(this.data, this.order),
      scheduler: animationFrames(),
      onChange: (step, playing) => {
        if (this.pinned !== null && this.pinned.step !== step) this.pinned = null;
        this.sync.push(step); // the first change goes out at once, bursts at most every interval
        if (model.get("playing") !== playing) {
          this.sync.flush();
          model.set("playing", playing);
          model.save_changes();
        }
        this.draw();
      },
    });
    (this.root as unknown as { fsdpviz: TimelineView }).fsdpviz = this;
  }

  private makeControls(): Controls {
    const bar = element("div", "fv-controls");
    const slider = element("input", "fv-slider");
    slider.type = "range";
    slider.min = "0";
    slider.setAttribute("aria-label", "place in the order");
    slider.addEventListener(
      "input",
      this.guard(() => this.player.goToPos(Number(slider.value))),
    );
    const playButton = button(
      "play",
      "play / pause (space)",
      this.guard(() => this.player.toggle()),
    );
    const peakButton = button(
      "peak",
      "jump to the memory peak (p)",
      this.guard(() => this.goToPeak()),
    );
    const speed = element("select", "fv-speed");
    speed.title = "steps per second while playing";
    for (const v of SPEEDS) speed.add(new Option(`${v}/s`, String(v)));
    speed.value = String(this.model.get("speed"));
    speed.addEventListener(
      "change",
      this.guard(() => {
        this.player.speed = Number(speed.value);
        this.model.set("speed", this.player.speed);
        this.model.save_changes();
      }),
    );
    const order = element("select", "fv-order");
    order.title =
      "the order ◀ ▶ walk: as FSDP's hooks issue the events, or as they start on their streams";
    order.setAttribute("aria-label", "step order");
    order.add(new Option("issue order", "issue"));
    order.add(new Option("stream-start order", "stream"));
    order.value = this.model.get("order") === "stream" ? "stream" : "issue";
    order.addEventListener(
      "change",
      this.guard(() => {
        this.setOrder(order.value === "stream" ? "stream" : "issue");
        this.model.set("order", this.order);
        this.model.save_changes();
      }),
    );
    bar.append(
      button(
        "|◀",
        "first step (Home)",
        this.guard(() => this.player.first()),
      ),
      button(
        "◀",
        "step back (←)",
        this.guard(() => this.player.stepBy(-1)),
      ),
      playButton,
      button(
        "▶",
        "step forward (→)",
        this.guard(() => this.player.stepBy(1)),
      ),
      button(
        "▶|",
        "last step (End)",
        this.guard(() => this.player.end()),
      ),
      peakButton,
      order,
      slider,
      speed,
      ...zoomButtons(
        ["zoom out (ctrl/shift + wheel)", "zoom in (ctrl/shift + wheel)", "show the whole run"],
        (factor) => this.zoom(factor),
        () => this.zoom(Number.POSITIVE_INFINITY),
        (fn) => this.guard(fn),
      ),
    );
    return { bar, slider, playButton, peakButton, speed, order };
  }

  /** `fn` with any error shown under the widget (and sent to Python) instead of lost. */
  guard(fn: () => void): () => void {
    return guarded(fn, (err) => this.showError(err));
  }

  showError(err: unknown): void {
    const text = showViewError(this.root, "timeline", err);
    this.model.set("error", text);
    this.model.save_changes();
  }

  start(): void {
    this.resetData();
    this.showBusy();
    if (this.model.get("playing")) this.player.play();
  }

  dispose(): void {
    this.disposed = true;
    this.player.pause();
    this.sync.flush();
  }

  /** The memory lane of the first group that has one (what the peak button goes to). */
  firstMemory(): TimelineData["memory"][number] | null {
    return this.data.memory[0] ?? null;
  }

  /** The cursor on the ▼ peak's moment, the readout giving the peak's bytes. */
  goToPeak(): void {
    const mem = this.firstMemory();
    if (mem !== null) this.pinMoment(0, mem.peak.moment);
  }

  /** Move to memory lane `m`'s moment `k`: its step, the cursor at the moment itself. */
  pinMoment(m: number, k: number): void {
    const mem = this.data.memory[m];
    if (mem === undefined || k < 0 || k >= mem.step.length) return;
    const step = mem.step[k];
    const x = k === mem.peak.moment ? mem.peak.x : (mem.x0[k] + mem.x1[k]) / 2;
    this.pinned = { step, x, lane: m, moment: k };
    if (step !== this.player.step) this.player.goTo(step);
    else this.draw();
  }

  setOrder(order: Order): void {
    this.order = order;
    this.controls.order.value = order;
    this.player.setOrder(orderOf(this.data, order));
    this.draw();
  }

  selectUnit(name: string | null): void {
    this.selectedUnit = name === null ? -1 : this.data.units.indexOf(name);
    this.layerKey = "";
  }

  resetData(): void {
    this.data = dataOf<TimelineData>(this.model);
    this.index = new Index(this.data);
    this.player.reset(this.data.n_steps, this.model.get("step"), orderOf(this.data, this.order));
    const full = this.index.full;
    this.span = firstSpan(this.data, full);
    this.win = { x0: full.x0, x1: full.x0 };
    this.controls.slider.max = String(Math.max(this.data.n_steps - 1, 0));
    const mem = this.firstMemory();
    const peak = this.controls.peakButton;
    peak.disabled = mem === null;
    peak.title =
      mem === null
        ? "no memory lane (TimelineWidget(..., memory='auto') draws the memory model's)"
        : `jump to the memory peak: ${exactBytes(mem.peak.bytes)} (${formatBytes(mem.peak.bytes)}) at step ${mem.peak.step} (p)`;
    peak.dataset.fvPeakStep = mem === null ? "" : String(mem.peak.step);
    peak.dataset.fvPeakBytes = mem === null ? "" : String(mem.peak.bytes);
    this.root.dataset.fvLaneMax = String(this.index.memoryMax[0] ?? "");
    this.root.dataset.fvMarkerBytes = mem === null ? "" : String(mem.peak.bytes);
    this.root.dataset.fvMarkerStep = mem === null ? "" : String(mem.peak.step);
    this.pinned = null;
    this.writeHeader();
    const fresh = legend(this.data);
    this.legendEl.replaceWith(fresh);
    this.legendEl = fresh;
    this.writeBottlenecks();
    this.selectUnit(this.model.get("selected_unit"));
    if (this.measured) this.relayout();
    else this.resize();
  }

  private writeHeader(): void {
    const h = this.header;
    h.replaceChildren();
    this.data.groups.forEach((g, gi) => {
      const line = element("div", "fv-group-summary");
      const parts: Array<string | HTMLElement> = [];
      if (this.data.groups.length > 1) {
        const b = document.createElement("b");
        b.textContent = `${g.name}: `;
        parts.push(b);
      }
      parts.push(g.summary);
      const mem = this.data.memory.find((m) => m.group === gi);
      if (mem !== undefined) {
        const peak = element("span", "fv-peak");
        peak.textContent = `peak ${formatBytes(mem.peak.bytes)} per rank`;
        peak.title = `${exactBytes(mem.peak.bytes)} ${mem.peak.where}; dominated by ${mem.peak.dominant}`;
        peak.dataset.fvPeakBytes = String(mem.peak.bytes);
        parts.push(" · ", peak, ` ${mem.peak.where}`);
      }
      const exposed = exposedText(g);
      if (exposed) parts.push(" · ", exposed);
      line.append(...parts);
      h.appendChild(line);
      const cap = mem?.capacity;
      if (cap) {
        const fit = element("div", cap.fits ? "fv-fit fv-fits" : "fv-fit fv-no-fit");
        fit.textContent = `${cap.fits ? "✓" : "✗"} ${cap.text}`;
        fit.dataset.fvFits = String(cap.fits);
        h.appendChild(fit);
      }
    });
  }

  /** Why is it slow: each group's waits as `report.timeline.bottlenecks()` ranks them, a
   * click on a row selecting that event. */
  private writeBottlenecks(): void {
    const el = this.bottlenecksEl;
    el.replaceChildren();
    this.bottleneckRows.clear();
    const groups = this.data.groups.filter((g) => g.bottlenecks);
    for (const g of groups) {
      const rows = g.bottlenecks ?? [];
      const box = document.createElement("details");
      box.open = true;
      const summary = document.createElement("summary");
      const total = g.exposed;
      const bubbles = rows.filter((b) => b.cause === "bubble");
      const bubbleText = bubbles.length
        ? `, pipeline bubbles ${formatSeconds(bubbles.reduce((t, b) => t + b.exposed, 0))} (${bubbles.length} wait(s) for another rank)`
        : "";
      const head =
        total === null
          ? `${rows.length} wait(s)`
          : `exposed communication ${formatSeconds(total.total)} of a ${formatSeconds(total.step)} step${bubbleText}, ${rows.length} wait(s)`;
      summary.textContent = `Why is it slow${groups.length > 1 || this.data.groups.length > 1 ? ` (${g.name})` : ""}: ${head}${rows.length ? ", most exposed first; click a row to go to it" : ": the compute never waits for communication"}`;
      box.appendChild(summary);
      if (rows.length > 0) box.appendChild(this.bottleneckTable(rows));
      el.appendChild(box);
    }
  }

  private bottleneckTable(
    rows: NonNullable<TimelineData["groups"][number]["bottlenecks"]>,
  ): HTMLElement {
    const table = element("table", "fv-bottleneck-table");
    const head = table.createTHead().insertRow();
    for (const name of ["", "exposed", "share", "event", "phase", "step", "why"]) {
      const th = document.createElement("th");
      th.textContent = name;
      head.appendChild(th);
    }
    const body = table.createTBody();
    const LIMIT = 10;
    rows.forEach((b, k) => {
      const tr = body.insertRow();
      tr.dataset.fvStep = String(b.step);
      tr.tabIndex = 0;
      tr.title = "click: select this event on the timeline";
      if (k >= LIMIT) tr.hidden = true;
      const swatch = element("span", "fv-swatch");
      swatch.style.background = this.data.colors[b.unit] ?? "";
      const what =
        b.kind === "pp_recv" || b.kind === "pp_send"
          ? `${b.kind} ${pipelineSubject(this.data, b.step)}`
          : `${b.kind} ${unitText(this.data, b.unit)}`;
      const cells: Array<string | HTMLElement> = [
        swatch,
        formatSeconds(b.exposed),
        `${Math.round(b.share * 100)}%`,
        what,
        b.phase,
        String(b.step),
        b.reason,
      ];
      for (const c of cells) {
        const td = tr.insertCell();
        td.append(c);
      }
      const go = this.guard(() => this.selectStep(b.step));
      tr.addEventListener("click", go);
      tr.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          go();
        }
      });
      this.bottleneckRows.set(b.step, tr);
    });
    if (rows.length > LIMIT) {
      const more = button(
        `show all ${rows.length}`,
        "show every wait",
        this.guard(() => {
          for (const tr of Array.from(body.rows)) tr.hidden = false;
          more.remove();
        }),
      );
      const wrap = element("div", "fv-bottleneck-more");
      wrap.appendChild(more);
      const out = element("div", "fv-bottleneck-wrap");
      out.append(table, wrap);
      return out;
    }
    return table;
  }

  /** The width laid out last. A hidden widget, or one not yet in the page, measures 0
   * (JupyterLab also hides the notebook for a moment while it switches themes, too briefly
   * for the ResizeObserver to report): keep the last width and look again on the next
   * frame instead of shrinking to the minimum. */
  resize(): void {
    const measured = this.root.clientWidth;
    if (measured > 0) {
      this.width = Math.max(measured, MIN_WIDTH);
      this.measured = true;
    } else if (this.remeasure === 0) {
      this.remeasure = nextFrame(() => {
        this.remeasure = 0;
        if (this.disposed) return;
        const w = this.root.clientWidth;
        if (w > 0 && Math.max(w, MIN_WIDTH) !== this.width) this.guard(() => this.resize())();
      });
    }
    this.relayout();
  }

  /** Lay out and draw at the width measured last (new data: the ResizeObserver reports a
   * change of width, and measuring now would make the browser lay out the whole page at
   * once, with the header, legend and table just rewritten). */
  private relayout(): void {
    const { width } = this;
    this.layout = computeLayout(this.data, width);
    const ratio = window.devicePixelRatio || 1;
    for (const c of [this.canvas, this.layer]) {
      c.width = Math.round(width * ratio);
      c.height = Math.round(this.layout.height * ratio);
    }
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${this.layout.height}px`;
    this.overview.width = Math.round(width * ratio);
    this.overview.height = Math.round(this.layout.overviewH * ratio);
    const octx = this.overview.getContext("2d");
    if (octx !== null) {
      octx.setTransform(ratio, 0, 0, ratio, 0, 0);
      drawOverviewBitmap(octx, this.data, this.index, this.layout, this.theme);
    }
    this.layerKey = "";
    this.draw();
  }

  applyTheme(): void {
    this.theme = takeTheme(this.root);
    this.resize();
  }

  /** While a re-plan is on its way the old plan's numbers are not shown. */
  showBusy(): void {
    this.root.classList.toggle("fv-busy", Boolean(this.model.get("busy")));
  }

  zoom(factor: number): void {
    const full = this.index.full;
    const width = full.x1 - full.x0;
    const minSpan = Math.min((width / Math.max(this.data.n_steps, 1)) * 4, width);
    this.span = Math.min(Math.max(this.span * factor, minSpan), width);
    this.win = { x0: this.win.x0, x1: this.win.x0 };
    this.draw();
  }

  /** Show [x0, x1] (clamped to the run). */
  showRange(x0: number, x1: number): void {
    const full = this.index.full;
    this.span = Math.min(Math.max(x1 - x0, 1e-12), full.x1 - full.x0);
    const start = Math.max(full.x0, Math.min(x0, full.x1 - this.span));
    this.win = { x0: start, x1: start + this.span };
    this.layerKey = "";
    this.paint();
  }

  scene(): Scene {
    return {
      data: this.data,
      index: this.index,
      layout: this.layout,
      win: this.win,
      theme: this.theme,
      selectedUnit: this.selectedUnit,
      labels: [],
    };
  }

  /** The cursor's x: the current event's own start on its lane, or the moment pinned. */
  cursor(): number {
    const p = this.pinned;
    if (p !== null && p.step === this.player.step) return p.x;
    return cursorX(this.data, this.player.step, this.order);
  }

  /** The cursor's x in CSS pixels, as drawn: on the current event's own mark (a free's
   * cell where its hook call is placed on the CPU lane), or at the pinned moment. */
  cursorPx(): number {
    const step = this.player.step;
    const p = this.pinned;
    const pinned = p !== null && p.step === step;
    if (!pinned && this.data.n_steps > 0 && this.data.steps.kind[step] === FREE)
      return this.index.cell(step, this.win, this.layout)[0];
    return xToPx(this.win, this.layout, this.cursor());
  }

  /** Follow the cursor, then paint. */
  draw(): void {
    if (this.data.n_steps > 0)
      this.win = follow(this.win, this.cursor(), this.span, this.index.full);
    this.paint();
  }

  /** The layer (redrawn only when the window, size, theme or selection changed), then the
   * cursor, the current event and the hovered mark over it. */
  paint(): void {
    const start = performance.now();
    const { player, controls } = this;
    const step = player.step;
    controls.slider.value = String(player.pos);
    controls.playButton.textContent = player.playing ? "pause" : "play";
    this.writeInfo();
    const ratio = window.devicePixelRatio || 1;
    const sc = this.scene();
    const key = `${this.win.x0}|${this.win.x1}|${this.layout.width}|${this.theme.name}|${this.theme.bg}|${this.selectedUnit}|${ratio}`;
    if (key !== this.layerKey) {
      const lctx = this.layer.getContext("2d");
      if (lctx === null) return;
      lctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      drawLayer(lctx, sc, this.marks);
      this.layerKey = key;
      this.labels = sc.labels ?? [];
      this.root.dataset.fvLabels = JSON.stringify(this.labels);
      const ticks = axisTicks(this.win.x0, this.win.x1, this.layout.plotW, this.data.timed);
      this.caption.textContent = this.data.timed
        ? `x: time in ${ticks.unit}, ${this.data.clock}. Steps are numbered from 0, as view.timeline.step.`
        : `x: ${this.data.clock}. Steps are numbered from 0, as view.timeline.step.`;
    }
    const ctx = this.canvas.getContext("2d");
    if (ctx === null) return;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    ctx.drawImage(this.layer, 0, 0);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const x = this.cursor();
    const h = this.hovered;
    const hoveredStep =
      h !== null && (h.kind === MARK.event || h.kind === MARK.call) ? h.step : null;
    drawFlows(ctx, sc, flowSteps(sc, step, hoveredStep));
    const px = this.cursorPx();
    drawCurrent(ctx, sc, step, px);
    if (this.hovered !== null) drawHover(ctx, sc, this.hovered);
    drawOverview(ctx, this.overview, sc, x);
    const ds = this.root.dataset;
    ds.fvStep = String(step);
    ds.fvCursorX = String(x);
    ds.fvCursorPx = String(px);
    for (const [s, tr] of this.bottleneckRows) tr.classList.toggle("fv-current", s === step);
    ds.fvOrder = this.order;
    ds.fvWindow = `${this.win.x0},${this.win.x1}`;
    this.lastDrawMs = performance.now() - start;
  }

  private writeInfo(): void {
    const p = this.pinned;
    const moment = p !== null && p.step === this.player.step ? p.moment : null;
    const parts = [describeStep(this.data, this.player.step, this.order, moment)];
    const selected = this.model.get("selected_unit");
    if (selected !== null && this.selectedUnit >= 0)
      parts.push(`selected: ${unitText(this.data, this.selectedUnit)}`);
    else if (selected !== null) parts.push(`selected: ${quote(selected)}`);
    const note = this.model.get("note");
    if (note) parts.push(note);
    this.info.textContent = parts.join(" · ");
  }

  /** What is at (px, py) in the canvas (CSS pixels), or null. */
  pickAt(px: number, py: number): Picked | null {
    const start = performance.now();
    const l = this.layout;
    let picked: Picked | null = null;
    if (px >= l.labelW && py >= l.lanesTop - 2 && py <= l.lanesBottom + 2)
      picked = this.marks.pick(px, py);
    this.lastPickMs = performance.now() - start;
    return picked;
  }

  /** A click: select what is there (an event, the event a mark stands for), or move the overview. */
  clickAt(px: number, py: number): void {
    const l = this.layout;
    if (px < l.labelW) return;
    if (py >= l.overviewTop - 3 && py <= l.overviewTop + l.overviewH + 3) {
      this.player.goTo(nearestStep(this.data, pxToX(this.index.full, l, px), this.order));
      return;
    }
    const picked = this.pickAt(px, py);
    if (picked === null) return;
    if (picked.kind === MARK.memory || picked.kind === MARK.peak) {
      this.selectStep(picked.step);
      this.pinMoment(picked.lane, picked.moment);
      return;
    }
    this.selectStep(picked.step);
  }

  /** Select the event at `step`: its unit becomes the selected unit, the cursor goes there. */
  selectStep(step: number): void {
    const s = clampStep(step, this.data.n_steps);
    const unit = this.data.steps.unit[s];
    this.selectedUnit = unit;
    this.layerKey = "";
    const name = this.data.units[unit] ?? null;
    if (this.model.get("selected_unit") !== name) {
      this.model.set("selected_unit", name);
      this.model.save_changes();
    }
    if (s !== this.player.step) this.player.goTo(s);
    else this.draw();
  }

  /** The pointer moved to (px, py): outline what is there and say what it is. */
  hoverAt(px: number, py: number): void {
    const picked = this.pickAt(px, py);
    const same =
      picked !== null &&
      this.hovered !== null &&
      picked.kind === this.hovered.kind &&
      picked.step === this.hovered.step &&
      picked.moment === this.hovered.moment &&
      picked.x === this.hovered.x;
    if (same) return;
    this.hovered = picked;
    if (picked === null) this.tooltip.hide();
    else this.tooltip.show(this.hoverLines(picked), px, py, this.layout.width);
    this.paint();
  }

  hoverLines(p: Picked): string[] {
    const data = this.data;
    if (p.kind === MARK.memory || p.kind === MARK.peak)
      return memoryDetails(data, data.memory[p.lane], p.moment);
    if (p.kind === MARK.compute) return computeDetails(data, p.moment);
    if (p.kind === MARK.work) return stepWorkDetails(data, p.moment);
    if (p.kind === MARK.wait) {
      const i = p.step;
      const w = data.waits;
      const k = p.moment;
      const wait = formatSeconds(w.x1[k] - w.x0[k]);
      const what = `${data.kinds[data.steps.kind[i]]} ${unitText(data, data.steps.unit[i])}`;
      const head = w.tail[k]
        ? [
            `the step's end waited ${wait} for this ${what}`,
            `${tailPlace(data, i)}: no compute left to hide it (exposed)`,
          ]
        : [`compute waits ${wait} for ${what}`, "communication not hidden by compute (exposed)"];
      return [...head, ...eventDetails(data, i).slice(1)];
    }
    if (p.kind === MARK.call) {
      const i = p.step;
      const c = data.steps.call[i];
      const hook = data.calls.hook[c] >= 0 ? data.hooks[data.calls.hook[c]] : "hook";
      const n = data.calls.n[c];
      return [
        `${hook} of ${unitText(data, data.calls.unit[c])}`,
        `issues ${n} event${n === 1 ? "" : "s"}: ${this.index.callSteps[c].map((s) => `${data.kinds[data.steps.kind[s]]} ${data.unit_numbers[data.steps.unit[s]]}`).join(", ")}`,
        "click: its first event",
      ];
    }
    return eventDetails(data, p.step);
  }

  leave(): void {
    if (this.hovered === null) return;
    this.hovered = null;
    this.tooltip.hide();
    this.paint();
  }

  /** Where each memory lane's capacity line and reserved estimate are drawn (CSS pixels,
   * null for a lane without one): for tests. */
  capacityLines(): Array<{ usable: number; reserved: number } | null> {
    const sc = this.scene();
    return this.data.memory.map((_, m) => capacityY(sc, m));
  }

  /** The centre of step's own mark in the drawn layer (CSS pixels), or null: for tests. */
  markCentre(step: number): { x: number; y: number; w: number; h: number } | null {
    const own = this.marks.of(step, MARK.event);
    const s = this.data.steps;
    const want = own.find((m) => {
      const row = this.layout.rows[s.lane[step]];
      return m.y >= row.top - 1 && m.y <= row.top + row.h;
    });
    if (want === undefined) return null;
    return { x: want.x + want.w / 2, y: want.y + want.h / 2, w: want.w, h: want.h };
  }
}
