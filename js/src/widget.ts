// The anywidget front end of fsdpviz.widgets.TimelineWidget. Stepping and playing
// run here without waiting for the kernel; `step` is synced to Python at once for a
// single step, at most every `sync_interval_ms` during bursts (playing, a held key),
// and on pause.
import type { AnyModel, RenderProps } from "@anywidget/types";
import {
  Player,
  Throttle,
  type TimelineData,
  type Window,
  animationFrames,
  clampStep,
  describeStep,
  follow,
  fullRange,
  nearestStep,
  stepAt,
} from "./model";
import {
  type Layout,
  type ThemeColors,
  computeLayout,
  drawMain,
  drawMemory,
  drawOverlay,
  drawOverviewBitmap,
  pxToX,
  readTheme,
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

const SPEEDS = [1, 5, 20, 100, 500];
const MIN_WIDTH = 300;

/** `fn` on the next animation frame (a timer where there are no frames); returns a handle. */
function nextFrame(fn: () => void): number {
  if (typeof requestAnimationFrame === "function") return requestAnimationFrame(() => fn());
  return setTimeout(fn, 16) as unknown as number;
}
const DEFAULT_VISIBLE_STEPS = 150;

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
  const el = document.createElement("div");
  el.className = "fv-legend";
  const items: Array<[string, string]> = [
    ["fv-solid", "collective, in its unit's colour"],
    ["fv-hatch", "prefetch (all-gather issued ahead)"],
    ["fv-tick", "free (reshard)"],
    ["fv-pale", "backward compute"],
    ["fv-line", "memory per rank"],
  ];
  for (const [kind, text] of items) {
    const item = document.createElement("span");
    const swatch = document.createElement("span");
    swatch.className = `fv-swatch ${kind}`;
    item.append(swatch, text);
    el.appendChild(item);
  }
  return el;
}

function showError(el: HTMLElement, model: AnyModel<WidgetModel>, err: unknown): void {
  const text = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  let pre = el.querySelector<HTMLPreElement>(".fv-error");
  if (pre === null) {
    pre = document.createElement("pre");
    pre.className = "fv-error";
    el.appendChild(pre);
  }
  pre.textContent = `fsdpviz timeline error: ${text}`;
  model.set("error", text);
  model.save_changes();
}

function render({ model, el }: RenderProps<WidgetModel>): () => void {
  const root = document.createElement("div");
  root.className = "fsdpviz-timeline";
  el.appendChild(root);
  const controls = document.createElement("div");
  controls.className = "fv-controls";
  const canvas = document.createElement("canvas");
  canvas.tabIndex = 0;
  canvas.setAttribute("aria-label", "FSDP event timeline; arrow keys step, space plays");
  const info = document.createElement("div");
  info.className = "fv-info";
  const note = document.createElement("div");
  note.className = "fv-note";
  root.append(controls, canvas, info, legend(), note);

  let data = model.get("data");
  let layout: Layout = computeLayout(data, 800);
  let theme: ThemeColors = readTheme(root);
  let win: Window = fullRange(data);
  let span = 1;
  let selectedUnit = -1;
  const overview = document.createElement("canvas");
  const dpr = (): number => window.devicePixelRatio || 1;

  const sync = new Throttle<number>(model.get("sync_interval_ms") || 150, (step) => {
    model.set("step", step);
    model.save_changes();
  });
  const player = new Player({
    n: data.n_steps,
    step: model.get("step"),
    speed: model.get("speed"),
    scheduler: animationFrames(),
    onChange: (step, playing) => {
      sync.push(step); // the first change goes out at once, bursts at most every interval
      if (model.get("playing") !== playing) {
        sync.flush();
        model.set("playing", playing);
        model.save_changes();
      }
      draw();
    },
  });

  const slider = document.createElement("input");
  slider.type = "range";
  slider.min = "0";
  slider.className = "fv-slider";
  slider.setAttribute("aria-label", "step");
  slider.addEventListener("input", () => player.goTo(Number(slider.value)));
  const playButton = button("play", "play / pause (space)", () => player.toggle());
  const peakButton = button("peak", "jump to the memory peak (p)", () => {
    if (data.peak_step !== null) player.goTo(data.peak_step);
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
  const zoom = (factor: number): void => {
    const full = fullRange(data);
    const minSpan = Math.min((full.x1 - full.x0) / Math.max(data.n_steps, 1) * 8, full.x1 - full.x0);
    span = Math.min(Math.max(span * factor, minSpan), full.x1 - full.x0);
    win = { x0: win.x0, x1: win.x0 };
    draw();
  };
  controls.append(
    button("|◀", "first step (Home)", () => player.goTo(0)),
    button("◀", "step back (←)", () => player.stepBy(-1)),
    playButton,
    button("▶", "step forward (→)", () => player.stepBy(1)),
    button("▶|", "last step (End)", () => player.goTo(data.n_steps - 1)),
    peakButton,
    slider,
    speed,
    button("−", "zoom out (wheel)", () => zoom(2)),
    button("+", "zoom in (wheel)", () => zoom(0.5)),
    button("all", "show the whole run", () => zoom(Infinity)),
  );

  function resetData(): void {
    data = model.get("data");
    player.reset(data.n_steps, model.get("step"));
    const full = fullRange(data);
    span = (full.x1 - full.x0) * Math.min(1, DEFAULT_VISIBLE_STEPS / Math.max(data.n_steps, 1));
    win = { x0: full.x0, x1: full.x0 };
    slider.max = String(Math.max(data.n_steps - 1, 0));
    peakButton.disabled = data.peak_step === null;
    peakButton.title = data.peak_step === null
      ? "no memory series given (TimelineWidget(..., memory=...))"
      : "jump to the memory peak (p)";
    note.textContent = `x: ${data.x_label}`;
    selectedUnit = data.units.indexOf(model.get("selected_unit") ?? "\u0000");
    resize();
  }

  // The width laid out last. A hidden widget, or one not yet in the page, measures 0
  // (JupyterLab also hides the notebook for a moment while it switches themes, too
  // briefly for the ResizeObserver to report): keep the last width and look again on
  // the next frame instead of shrinking to the minimum.
  let width = MIN_WIDTH;
  let remeasure = 0;
  let disposed = false;
  function resize(): void {
    const measured = root.clientWidth;
    if (measured > 0) {
      width = Math.max(measured, MIN_WIDTH);
    } else if (remeasure === 0) {
      remeasure = nextFrame(() => {
        remeasure = 0;
        if (disposed) return;
        if (root.clientWidth > 0 && Math.max(root.clientWidth, MIN_WIDTH) !== width) guard(resize)();
      });
    }
    layout = computeLayout(data, width);
    const ratio = dpr();
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(layout.height * ratio);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${layout.height}px`;
    overview.width = Math.round(width * ratio);
    overview.height = Math.round(layout.overviewH * ratio);
    const octx = overview.getContext("2d");
    if (octx !== null) {
      octx.setTransform(ratio, 0, 0, ratio, 0, 0);
      drawOverviewBitmap(octx, data, layout, theme);
    }
    draw();
  }

  function draw(): void {
    const step = player.step;
    if (data.n_steps > 0) win = follow(win, data.steps.x0[step], span, fullRange(data));
    slider.value = String(step);
    playButton.textContent = player.playing ? "pause" : "play";
    info.textContent = describeStep(data, step);
    const ctx = canvas.getContext("2d");
    if (ctx === null) return;
    const st = { step, selectedUnit, win, theme, layout };
    ctx.setTransform(dpr(), 0, 0, dpr(), 0, 0);
    drawMain(ctx, data, st);
    drawOverlay(ctx, overview, data, st, dpr());
    drawMemory(ctx, data, st);
  }

  function clickAt(ev: MouseEvent): void {
    const rect = canvas.getBoundingClientRect();
    const px = ev.clientX - rect.left;
    const py = ev.clientY - rect.top;
    if (px < layout.labelW) return;
    if (py >= layout.overviewTop - 3 && py <= layout.overviewTop + layout.overviewH + 3) {
      player.goTo(nearestStep(data, pxToX(fullRange(data), layout, px)));
      return;
    }
    const x = pxToX(win, layout, px);
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
        selectedUnit = unit;
        model.set("selected_unit", data.units[unit] ?? null);
        model.save_changes();
        player.goTo(s);
        draw();
        return;
      }
    }
  }

  const guard = (fn: () => void) => (): void => {
    try {
      fn();
    } catch (err) {
      showError(root, model, err);
    }
  };
  const onStep = guard(() => {
    const s = clampStep(model.get("step"), data.n_steps);
    if (s !== player.step) player.goTo(s);
  });
  const onPlaying = guard(() => {
    if (model.get("playing") && !player.playing) player.play();
    if (!model.get("playing") && player.playing) player.pause();
  });
  const onSelected = guard(() => {
    selectedUnit = data.units.indexOf(model.get("selected_unit") ?? "\u0000");
    draw();
  });
  const onSpeed = guard(() => {
    player.speed = model.get("speed");
    speed.value = String(player.speed);
  });
  const onData = guard(resetData);
  model.on("change:step", onStep);
  model.on("change:playing", onPlaying);
  model.on("change:selected_unit", onSelected);
  model.on("change:speed", onSpeed);
  model.on("change:data", onData);

  canvas.addEventListener("click", (ev) => guard(() => clickAt(ev))());
  canvas.addEventListener("wheel", (ev) => {
    if (!ev.ctrlKey && !ev.shiftKey) return;
    ev.preventDefault();
    zoom(ev.deltaY > 0 ? 1.25 : 0.8);
  });
  canvas.addEventListener("keydown", (ev) => {
    const keys: Record<string, () => void> = {
      ArrowLeft: () => player.stepBy(-1),
      ArrowRight: () => player.stepBy(1),
      " ": () => player.toggle(),
      Home: () => player.goTo(0),
      End: () => player.goTo(data.n_steps - 1),
      p: () => data.peak_step !== null && player.goTo(data.peak_step),
    };
    const action = keys[ev.key];
    if (action === undefined) return;
    ev.preventDefault();
    guard(action)();
  });

  const observer = new ResizeObserver(guard(resize));
  observer.observe(root);
  const applyTheme = guard(() => {
    theme = readTheme(root);
    if (model.get("theme") !== theme.name) {
      model.set("theme", theme.name);
      model.save_changes();
    }
    resize();
  });
  // Now, and again on the next frame: the new theme's CSS variables may apply after the flag.
  const themeWatch = new MutationObserver(() => {
    applyTheme();
    nextFrame(() => {
      if (!disposed) applyTheme();
    });
  });
  themeWatch.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light"] });
  guard(() => {
    resetData();
    if (model.get("theme") !== theme.name) {
      model.set("theme", theme.name);
      model.save_changes();
    }
    if (model.get("playing")) player.play();
  })();

  return () => {
    disposed = true;
    player.pause();
    sync.flush();
    observer.disconnect();
    themeWatch.disconnect();
    model.off("change:step", onStep);
    model.off("change:playing", onPlaying);
    model.off("change:selected_unit", onSelected);
    model.off("change:speed", onSpeed);
    model.off("change:data", onData);
  };
}

export default { render };
