// @vitest-environment jsdom
// The anywidget front end in a DOM: controls step the view and sync `step`, Python's
// `step` moves the view, a click on an event sets `selected_unit`.

import type { AnyModel } from "@anywidget/types";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { TimelineView } from "../src/timeline_view";
import widget, { type WidgetModel } from "../src/widget";
import { byIndex, fakeContext, predicted } from "./fixtures";

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

function setup(data = byIndex()): { model: FakeModel; el: HTMLElement; cleanup: () => void } {
  const model = new FakeModel({
    data,
    step: 0,
    playing: false,
    speed: 20,
    order: "issue",
    note: "",
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
  // jsdom has no canvas: a context that draws nothing (the marks are still laid out).
  vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockImplementation(
    () => fakeContext() as unknown as ReturnType<HTMLCanvasElement["getContext"]>,
  );
  vi.spyOn(HTMLCanvasElement.prototype, "getBoundingClientRect").mockReturnValue(
    new DOMRect(0, 0, 1000, 400),
  );
});

afterEach(() => {
  vi.unstubAllGlobals();
  vi.restoreAllMocks();
  document.body.innerHTML = "";
});

/** The view behind a rendered widget (the root element carries it, for tests). */
const viewOf = (el: HTMLElement): TimelineView =>
  (el.querySelector(".fsdpviz-timeline") as unknown as { fsdpviz: TimelineView }).fsdpviz;

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
    expect(el.querySelector(".fv-info")?.textContent).toMatch(/^step 2 of 18 · /);
    expect(model.state.step).toBe(1);
    // ... and Python gets the latest step after the sync interval
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(model.state.step).toBe(2);
  });

  it("moves when Python sets step, numbered from 0 as Python numbers it", () => {
    const { model, el } = setup();
    model.fromPython("step", 10);
    expect(el.querySelector(".fv-info")?.textContent).toMatch(/^step 10 of 18 · /);
    expect((el.querySelector(".fv-slider") as HTMLInputElement).value).toBe("10");
    const root = el.querySelector(".fsdpviz-timeline") as HTMLElement;
    expect(root.dataset.fvStep).toBe("10");
  });

  it("jumps to the memory peak: the step, bytes and marker of the memory lane", async () => {
    const data = predicted();
    const { model, el } = setup(data);
    const peak = data.memory[0].peak;
    const button = buttonTitled(el, "jump to the memory peak");
    expect(button.title).toContain(`${peak.bytes.toLocaleString("en-US")} bytes`);
    expect(button.dataset.fvPeakBytes).toBe(String(peak.bytes));
    button.click();
    expect(el.querySelector(".fv-info")?.textContent).toMatch(new RegExp(`^step ${peak.step} of`));
    const root = el.querySelector(".fsdpviz-timeline") as HTMLElement;
    expect(root.dataset.fvLaneMax).toBe(String(peak.bytes));
    expect(root.dataset.fvMarkerBytes).toBe(String(peak.bytes));
    expect(root.dataset.fvMarkerStep).toBe(String(peak.step));
    const summary = el.querySelector(".fv-peak") as HTMLElement;
    expect(summary.dataset.fvPeakBytes).toBe(String(peak.bytes));
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(model.state.step).toBe(peak.step);
  });

  it("walks the stream-start order when asked, from the page or from Python", () => {
    const data = predicted();
    const { model, el } = setup(data);
    const order = el.querySelector(".fv-order") as HTMLSelectElement;
    order.value = "stream";
    order.dispatchEvent(new Event("change"));
    expect(model.state.order).toBe("stream");
    const seen = [viewOf(el).cursor()];
    for (let k = 1; k < data.n_steps; k++) {
      buttonTitled(el, "step forward").click();
      seen.push(viewOf(el).cursor());
    }
    expect(seen).toEqual([...seen].sort((a, b) => a - b));
    expect(viewOf(el).player.step).toBe(data.stream_order.at(-1));
    model.fromPython("order", "issue");
    expect(order.value).toBe("issue");
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

  it("a click at an event's centre selects that event and its unit", () => {
    const data = predicted();
    const { model, el } = setup(data);
    const view = viewOf(el);
    view.zoom(Number.POSITIVE_INFINITY);
    const c = view.markCentre(8);
    expect(c).not.toBeNull();
    const canvas = el.querySelector("canvas") as HTMLCanvasElement;
    canvas.dispatchEvent(new MouseEvent("click", { clientX: c?.x, clientY: c?.y }));
    expect(model.state.selected_unit).toBe("blocks.1");
    expect(model.state.step).toBe(8);
    expect(model.saved.some((ch) => ch.selected_unit === "blocks.1")).toBe(true);
    expect(el.querySelector(".fv-info")?.textContent).toContain("selected: unit 2 'blocks.1'");
  });

  it("says what is under the pointer", () => {
    const data = predicted();
    const { el } = setup(data);
    const view = viewOf(el);
    view.zoom(Number.POSITIVE_INFINITY);
    const c = view.markCentre(8);
    const canvas = el.querySelector("canvas") as HTMLCanvasElement;
    canvas.dispatchEvent(new MouseEvent("mousemove", { clientX: c?.x, clientY: c?.y }));
    const tip = el.querySelector(".fv-tooltip") as HTMLElement;
    expect(tip.hidden).toBe(false);
    expect(tip.textContent).toContain("all_gather unit 2 'blocks.1'");
    expect(tip.textContent).toContain("issued by pre_backward of 'blocks.2'");
    canvas.dispatchEvent(new MouseEvent("mouseleave"));
    expect(tip.hidden).toBe(true);
  });

  it("shows Python's note after the step", () => {
    const { model, el } = setup();
    model.fromPython("note", "the event at the old step is not in this plan: back to step 0");
    expect(el.querySelector(".fv-info")?.textContent).toContain("back to step 0");
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

  it("shows the peak button disabled without a memory lane", () => {
    const { el } = setup(byIndex());
    expect(buttonTitled(el, "no memory lane").disabled).toBe(true);
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
    expect(canvas.style.width).toBe("360px");
    width = 700;
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(canvas.style.width).toBe("700px");
  });

  it("explains its marks and the memory categories in a legend, and its x axis in a caption", () => {
    const { el } = setup(predicted());
    const text = el.querySelector(".fv-legend")?.textContent ?? "";
    for (const item of [
      "hook call",
      "prefetch",
      "free",
      "backward compute",
      "exposed",
      "optimizer",
    ])
      expect(text).toContain(item);
    expect(el.querySelector(".fv-note")?.textContent).toMatch(/^x: time in µs, modelled on H100/);
  });
});
