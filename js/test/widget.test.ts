// @vitest-environment jsdom
// The anywidget front end in a DOM: controls step the view and sync `step`, Python's
// `step` moves the view, a click on an event sets `selected_unit`.

import type { AnyModel } from "@anywidget/types";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import widget, { type WidgetModel } from "../src/widget";
import { sample } from "./fixtures";

type Handler = () => void;

/** Enough of anywidget's model: get/set/on/off/save_changes, change events on set. */
class FakeModel {
  state: WidgetModel;
  saved: Array<Partial<WidgetModel>> = [];
  private pending: Partial<WidgetModel> = {};
  private handlers = new Map<string, Set<Handler>>();

  constructor(state: WidgetModel) {
    this.state = state;
  }
  get<K extends keyof WidgetModel>(key: K): WidgetModel[K] {
    return this.state[key];
  }
  set<K extends keyof WidgetModel>(key: K, value: WidgetModel[K]): void {
    this.state[key] = value;
    this.pending[key] = value;
    for (const h of this.handlers.get(`change:${key}`) ?? []) h();
  }
  /** A change coming from Python: no save. */
  fromPython<K extends keyof WidgetModel>(key: K, value: WidgetModel[K]): void {
    this.state[key] = value;
    for (const h of this.handlers.get(`change:${key}`) ?? []) h();
  }
  save_changes(): void {
    this.saved.push(this.pending);
    this.pending = {};
  }
  on(name: string, cb: Handler): void {
    if (!this.handlers.has(name)) this.handlers.set(name, new Set());
    this.handlers.get(name)?.add(cb);
  }
  off(name?: string | null, cb?: Handler | null): void {
    if (name && cb) this.handlers.get(name)?.delete(cb);
  }
  listeners(): number {
    let n = 0;
    for (const set of this.handlers.values()) n += set.size;
    return n;
  }
}

function setup(): { model: FakeModel; el: HTMLElement; cleanup: () => void } {
  const model = new FakeModel({
    data: sample(),
    step: 0,
    playing: false,
    speed: 20,
    selected_unit: null,
    theme: "light",
    error: "",
    sync_interval_ms: 150,
  });
  const el = document.createElement("div");
  document.body.appendChild(el);
  const render = (widget as { render: (p: unknown) => () => void }).render;
  const cleanup = render({ model: model as unknown as AnyModel<WidgetModel>, el });
  return { model, el, cleanup };
}

const buttonTitled = (el: HTMLElement, title: string): HTMLButtonElement => {
  const b = [...el.querySelectorAll("button")].find((x) => x.title.startsWith(title));
  if (!b) throw new Error(`no button ${title}`);
  return b;
};

beforeEach(() => {
  vi.stubGlobal(
    "ResizeObserver",
    class {
      observe(): void {}
      disconnect(): void {}
    },
  );
  // jsdom has no canvas: drawing is skipped, everything else runs.
  vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockReturnValue(null);
});

afterEach(() => {
  vi.unstubAllGlobals();
  vi.restoreAllMocks();
  document.body.innerHTML = "";
});

describe("timeline widget", () => {
  it("steps with the buttons and the keyboard; syncs the first step at once, bursts later", async () => {
    const { model, el } = setup();
    buttonTitled(el, "step forward").click();
    expect(model.state.step).toBe(1); // sent to Python at once
    expect(model.saved.some((c) => c.step === 1)).toBe(true);
    el.querySelector("canvas")?.dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowRight" }));
    buttonTitled(el, "step forward").click();
    buttonTitled(el, "step back").click();
    // the view moved at once, without waiting for the kernel ...
    expect(el.querySelector(".fv-info")?.textContent).toContain("step 3/6");
    expect(model.state.step).toBe(1);
    // ... and Python gets the latest step after the sync interval
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(model.state.step).toBe(2);
  });

  it("moves when Python sets step, and jumps to the peak", async () => {
    const { model, el } = setup();
    model.fromPython("step", 5);
    expect(el.querySelector(".fv-info")?.textContent).toContain("step 6/6");
    expect((el.querySelector(".fv-slider") as HTMLInputElement).value).toBe("5");
    buttonTitled(el, "jump to the memory peak").click();
    expect(el.querySelector(".fv-info")?.textContent).toContain("step 5/6");
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(model.state.step).toBe(4);
  });

  it("plays and pauses from the button, and from Python", () => {
    const { model, el } = setup();
    const play = buttonTitled(el, "play / pause");
    play.click();
    expect(model.state.playing).toBe(true);
    expect(play.textContent).toBe("pause");
    play.click();
    expect(model.state.playing).toBe(false);
    model.fromPython("playing", true);
    expect(play.textContent).toBe("pause");
  });

  it("a click on an event selects its unit and step", () => {
    const { model, el } = setup();
    const canvas = el.querySelector("canvas") as HTMLCanvasElement;
    // 300 px wide: labels 150 px, plot 140 px for x in [0, 6); lane 1 (all-gather) at y 32..54
    canvas.dispatchEvent(new MouseEvent("click", { clientX: 150 + (1.5 / 6) * 140, clientY: 40 }));
    expect(model.state.selected_unit).toBe("b");
    expect(model.state.step).toBe(1);
    expect(model.saved.some((c) => c.selected_unit === "b")).toBe(true);
  });

  it("reports the JupyterLab theme and cleans up its listeners", () => {
    document.body.dataset.jpThemeLight = "false";
    const { model, cleanup } = setup();
    expect(model.state.theme).toBe("dark");
    expect(model.listeners()).toBeGreaterThan(0);
    cleanup();
    expect(model.listeners()).toBe(0);
    delete document.body.dataset.jpThemeLight;
  });

  it("shows the peak button disabled without a memory series", () => {
    const data = { ...sample(), memory: null, peak_step: null };
    const { model, el } = setup();
    model.fromPython("data", data);
    expect(buttonTitled(el, "no memory series").disabled).toBe(true);
  });

  it("keeps its width while the notebook is hidden for a moment (a theme switch)", async () => {
    let width = 968;
    vi.spyOn(HTMLElement.prototype, "clientWidth", "get").mockImplementation(() => width);
    const { el } = setup();
    const canvas = el.querySelector("canvas") as HTMLCanvasElement;
    expect(canvas.style.width).toBe("968px");
    width = 0; // JupyterLab hides the shell while it swaps the theme's CSS ...
    document.body.dataset.jpThemeLight = "false";
    await Promise.resolve(); // the MutationObserver runs
    expect(canvas.style.width).toBe("968px");
    width = 968; // ... and shows it again within the frame
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(canvas.style.width).toBe("968px");
    delete document.body.dataset.jpThemeLight;
  });

  it("takes the new width on the next frame when it measured none", async () => {
    let width = 0;
    vi.spyOn(HTMLElement.prototype, "clientWidth", "get").mockImplementation(() => width);
    const { el } = setup(); // rendered before it is in the page
    const canvas = el.querySelector("canvas") as HTMLCanvasElement;
    expect(canvas.style.width).toBe("300px");
    width = 700;
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(canvas.style.width).toBe("700px");
  });

  it("explains its marks in a legend", () => {
    const { el } = setup();
    const text = el.querySelector(".fv-legend")?.textContent ?? "";
    for (const item of ["prefetch", "free", "backward compute", "memory"])
      expect(text).toContain(item);
  });
});
