// The timeline widget's view: its elements, the controls above the canvas, what it shows
// (data, window, theme, selection) and its drawing. widget.ts binds it to the model's
// traits and to the page.
import type { AnyModel } from "@anywidget/types";
import {
  animationFrames,
  describeStep,
  follow,
  fullRange,
  nearestStep,
  Player,
  stepAt,
  Throttle,
  type TimelineData,
  type Window,
} from "./model";
import {
  computeLayout,
  drawMain,
  drawMemory,
  drawOverlay,
  drawOverviewBitmap,
  type Layout,
  pxToX,
  readTheme,
  type ThemeColors,
} from "./render";

export interface WidgetModel {
  data: TimelineData;
  step: number;
  playing: boolean;
  speed: number;
  selected_unit: string | null;
  theme: string;
  error: string;
  sync_interval_ms: number;
}

type Model = AnyModel<WidgetModel>;

const SPEEDS = [1, 5, 20, 100, 500];
const MIN_WIDTH = 300;
const DEFAULT_VISIBLE_STEPS = 150;

/** `fn` on the next animation frame (a timer where there are no frames); returns a handle. */
export function nextFrame(fn: () => void): number {
  if (typeof requestAnimationFrame === "function") return requestAnimationFrame(() => fn());
  return setTimeout(fn, 16) as unknown as number;
}

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  el.className = className;
  return el;
}

function button(label: string, title: string, onClick: () => void): HTMLButtonElement {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.title = title;
  b.setAttribute("aria-label", title);
  b.addEventListener("click", onClick);
  return b;
}

/** What the marks mean (colour alone says only which unit). */
function legend(): HTMLElement {
  const el = element("div", "fv-legend");
  const items: Array<[string, string]> = [
    ["fv-solid", "collective, in its unit's colour"],
    ["fv-hatch", "prefetch (all-gather issued ahead)"],
    ["fv-tick", "free (reshard)"],
    ["fv-pale", "backward compute"],
    ["fv-line", "memory per rank"],
  ];
  for (const [kind, text] of items) {
    const item = document.createElement("span");
    item.append(element("span", `fv-swatch ${kind}`), text);
    el.appendChild(item);
  }
  return el;
}

function showError(el: HTMLElement, model: Model, err: unknown): void {
  const text = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  let pre = el.querySelector<HTMLPreElement>(".fv-error");
  if (pre === null) {
    pre = element("pre", "fv-error");
    el.appendChild(pre);
  }
  pre.textContent = `fsdpviz timeline error: ${text}`;
  model.set("error", text);
  model.save_changes();
}

/** The controls above the canvas that the view updates as it draws. */
interface Controls {
  slider: HTMLInputElement;
  playButton: HTMLButtonElement;
  peakButton: HTMLButtonElement;
  speed: HTMLSelectElement;
}

/** The timeline's elements, what it shows (data, window, theme, selection) and its drawing. */
export class TimelineView {
  readonly root = element("div", "fsdpviz-timeline");
  readonly canvas = document.createElement("canvas");
  readonly controls: Controls;
  readonly player: Player;
  private readonly info = element("div", "fv-info");
  private readonly note = element("div", "fv-note");
  private readonly overview = document.createElement("canvas");
  private readonly sync: Throttle<number>;
  data: TimelineData;
  theme: ThemeColors;
  selectedUnit = -1;
  private layout: Layout;
  private win: Window;
  private span = 1;
  // The width laid out last. A hidden widget, or one not yet in the page, measures 0
  // (JupyterLab also hides the notebook for a moment while it switches themes, too
  // briefly for the ResizeObserver to report): keep the last width and look again on
  // the next frame instead of shrinking to the minimum.
  private width = MIN_WIDTH;
  private remeasure = 0;
  disposed = false;

  constructor(
    readonly model: Model,
    el: HTMLElement,
  ) {
    el.appendChild(this.root);
    const bar = element("div", "fv-controls");
    this.canvas.tabIndex = 0;
    this.canvas.setAttribute("aria-label", "FSDP event timeline; arrow keys step, space plays");
    this.root.append(bar, this.canvas, this.info, legend(), this.note);
    this.data = model.get("data");
    this.layout = computeLayout(this.data, 800);
    this.theme = readTheme(this.root);
    this.win = fullRange(this.data);
    this.sync = new Throttle<number>(model.get("sync_interval_ms") || 150, (step) => {
      model.set("step", step);
      model.save_changes();
    });
    this.player = new Player({
      n: this.data.n_steps,
      step: model.get("step"),
      speed: model.get("speed"),
      scheduler: animationFrames(),
      onChange: (step, playing) => {
        this.sync.push(step); // the first change goes out at once, bursts at most every interval
        if (model.get("playing") !== playing) {
          this.sync.flush();
          model.set("playing", playing);
          model.save_changes();
        }
        this.draw();
      },
    });
    this.controls = buildControls(this, bar);
  }

  /** ``fn`` with its errors shown under the widget (and in the model's ``error``). */
  guard(fn: () => void): () => void {
    return () => {
      try {
        fn();
      } catch (err) {
        showError(this.root, this.model, err);
      }
    };
  }

  /** The first draw: the model's data, theme and playing state. */
  start(): void {
    this.guard(() => {
      this.resetData();
      this.reportTheme();
      if (this.model.get("playing")) this.player.play();
    })();
  }

  dispose(): void {
    this.disposed = true;
    this.player.pause();
    this.sync.flush();
  }

  resetData(): void {
    const { model, player, controls } = this;
    const data = model.get("data");
    this.data = data;
    player.reset(data.n_steps, model.get("step"));
    const full = fullRange(data);
    this.span =
      (full.x1 - full.x0) * Math.min(1, DEFAULT_VISIBLE_STEPS / Math.max(data.n_steps, 1));
    this.win = { x0: full.x0, x1: full.x0 };
    controls.slider.max = String(Math.max(data.n_steps - 1, 0));
    controls.peakButton.disabled = data.peak_step === null;
    controls.peakButton.title =
      data.peak_step === null
        ? "no memory series given (TimelineWidget(..., memory=...))"
        : "jump to the memory peak (p)";
    this.note.textContent = `x: ${data.x_label}`;
    this.selectUnit(model.get("selected_unit"));
    this.resize();
  }

  selectUnit(name: string | null): void {
    this.selectedUnit = this.data.units.indexOf(name ?? "\u0000");
  }

  /** Zoom the visible window by ``factor`` (``Infinity``: the whole run). */
  zoom(factor: number): void {
    const { data } = this;
    const full = fullRange(data);
    const width = full.x1 - full.x0;
    const minSpan = Math.min((width / Math.max(data.n_steps, 1)) * 8, width);
    this.span = Math.min(Math.max(this.span * factor, minSpan), width);
    this.win = { x0: this.win.x0, x1: this.win.x0 };
    this.draw();
  }

  resize(): void {
    const { root, canvas, overview } = this;
    const measured = root.clientWidth;
    if (measured > 0) {
      this.width = Math.max(measured, MIN_WIDTH);
    } else if (this.remeasure === 0) {
      this.remeasure = nextFrame(() => {
        this.remeasure = 0;
        if (this.disposed) return;
        if (root.clientWidth > 0 && Math.max(root.clientWidth, MIN_WIDTH) !== this.width) {
          this.guard(() => this.resize())();
        }
      });
    }
    const width = this.width;
    this.layout = computeLayout(this.data, width);
    const ratio = dpr();
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(this.layout.height * ratio);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${this.layout.height}px`;
    overview.width = Math.round(width * ratio);
    overview.height = Math.round(this.layout.overviewH * ratio);
    const octx = overview.getContext("2d");
    if (octx !== null) {
      octx.setTransform(ratio, 0, 0, ratio, 0, 0);
      drawOverviewBitmap(octx, this.data, this.layout, this.theme);
    }
    this.draw();
  }

  draw(): void {
    const { data, player, controls } = this;
    const step = player.step;
    if (data.n_steps > 0)
      this.win = follow(this.win, data.steps.x0[step], this.span, fullRange(data));
    controls.slider.value = String(step);
    controls.playButton.textContent = player.playing ? "pause" : "play";
    this.info.textContent = describeStep(data, step);
    const ctx = this.canvas.getContext("2d");
    if (ctx === null) return;
    const st = {
      step,
      selectedUnit: this.selectedUnit,
      win: this.win,
      theme: this.theme,
      layout: this.layout,
    };
    ctx.setTransform(dpr(), 0, 0, dpr(), 0, 0);
    drawMain(ctx, data, st);
    drawOverlay(ctx, this.overview, data, st, dpr());
    drawMemory(ctx, data, st);
  }

  /** A click on the canvas: the overview or the memory curve moves to a step; an event
   * selects its unit (sent to Python) and moves to it. */
  clickAt(ev: MouseEvent): void {
    const { data, layout, player, model } = this;
    const rect = this.canvas.getBoundingClientRect();
    const px = ev.clientX - rect.left;
    const py = ev.clientY - rect.top;
    if (px < layout.labelW) return;
    if (py >= layout.overviewTop - 3 && py <= layout.overviewTop + layout.overviewH + 3) {
      player.goTo(nearestStep(data, pxToX(fullRange(data), layout, px)));
      return;
    }
    const x = pxToX(this.win, layout, px);
    if (py >= layout.memTop) {
      player.goTo(nearestStep(data, x));
      return;
    }
    for (let r = 0; r < data.ranks.length; r++) {
      for (let lane = 0; lane < 3; lane++) {
        const top = layout.laneTop(r, lane);
        if (py < top - 2 || py > top + layout.laneH + 2) continue;
        const s = stepAt(data, x, r, lane);
        if (s < 0) return;
        const unit = lane === 0 ? data.steps.hook_unit[s] : data.steps.unit[s];
        this.selectedUnit = unit;
        model.set("selected_unit", data.units[unit] ?? null);
        model.save_changes();
        player.goTo(s);
        this.draw();
        return;
      }
    }
  }

  /** Read the page's theme again, tell Python, and redraw. */
  applyTheme(): void {
    this.theme = readTheme(this.root);
    this.reportTheme();
    this.resize();
  }

  private reportTheme(): void {
    if (this.model.get("theme") !== this.theme.name) {
      this.model.set("theme", this.theme.name);
      this.model.save_changes();
    }
  }
}

function dpr(): number {
  return window.devicePixelRatio || 1;
}

/** Buttons, slider and speed picker, appended to ``bar``. */
function buildControls(view: TimelineView, bar: HTMLElement): Controls {
  const { player, model } = view;
  const slider = element("input", "fv-slider");
  slider.type = "range";
  slider.min = "0";
  slider.setAttribute("aria-label", "step");
  slider.addEventListener("input", () => player.goTo(Number(slider.value)));
  const playButton = button("play", "play / pause (space)", () => player.toggle());
  const peakButton = button("peak", "jump to the memory peak (p)", () => {
    if (view.data.peak_step !== null) player.goTo(view.data.peak_step);
  });
  const speed = document.createElement("select");
  speed.title = "steps per second while playing";
  for (const v of SPEEDS) speed.add(new Option(`${v}/s`, String(v)));
  speed.value = String(model.get("speed"));
  speed.addEventListener("change", () => {
    player.speed = Number(speed.value);
    model.set("speed", player.speed);
    model.save_changes();
  });
  bar.append(
    button("|◀", "first step (Home)", () => player.goTo(0)),
    button("◀", "step back (←)", () => player.stepBy(-1)),
    playButton,
    button("▶", "step forward (→)", () => player.stepBy(1)),
    button("▶|", "last step (End)", () => player.goTo(view.data.n_steps - 1)),
    peakButton,
    slider,
    speed,
    button("−", "zoom out (wheel)", () => view.zoom(2)),
    button("+", "zoom in (wheel)", () => view.zoom(0.5)),
    button("all", "show the whole run", () => view.zoom(Infinity)),
  );
  return { slider, playButton, peakButton, speed };
}
