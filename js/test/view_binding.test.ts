// @vitest-environment jsdom
// What the tune view and the prefetch graph share as widgets (`view_binding.ts`), checked on
// both as anywidget renders them: a click selects and saves once without being shown twice,
// Python's selection is shown, `busy` dims the view, an error in a callback reaches `error`,
// and removing the widget leaves no listener on the model.
import { describe, expect, it, vi } from "vitest";
import type { CanvasView } from "../src/canvas_view";
import type { PrefetchView } from "../src/prefetch";
import type { TuneView } from "../src/tune";
import { prefetchDefaults, tuneDefaults } from "../src/widget";
import { mount } from "./fake_model";
import { fakeCanvas, prefetchData, tuneData } from "./fixtures";

interface Case {
  name: string;
  className: string;
  /** Mount the widget; `trait` is the selection's trait. */
  mount: () => ReturnType<typeof mount<Record<string, unknown>>>;
  trait: string;
  /** A click in the view: the value it selects. */
  click: (view: CanvasView) => unknown;
  /** Another value Python may select. */
  other: unknown;
  /** The selection the view shows, as the model writes it. */
  shown: (view: CanvasView) => string;
  /** Data that makes the view's `setData` run. */
  data: () => unknown;
}

const tune = tuneData();
const CASES: Case[] = [
  {
    name: "tune",
    className: ".fsdpviz-tune",
    mount: () => mount<Record<string, unknown>>({ ...tuneDefaults(tuneData()) }),
    trait: "selected",
    click: (v) => {
      const view = v as TuneView;
      const index = tune.points.index[tune.best ?? 0];
      const c = view.pointCentre(index);
      if (c === null) throw new Error("the best is not drawn");
      view.clickAt(c.x, c.y);
      return index;
    },
    other: tune.points.index[tune.frontier[0]],
    shown: (v) => v.root.dataset.fvSelected ?? "",
    data: tuneData,
  },
  {
    name: "prefetch",
    className: ".fsdpviz-prefetch",
    mount: () => mount<Record<string, unknown>>({ ...prefetchDefaults(prefetchData()) }),
    trait: "selected_unit",
    click: (v) => {
      const view = v as PrefetchView;
      const c = view.nodeCentre("blocks.2");
      if (c === null) throw new Error("blocks.2 is not drawn");
      view.clickAt(c.x, c.y);
      return "blocks.2";
    },
    other: "blocks.1",
    shown: (v) => v.root.dataset.fvSelectedUnit ?? "",
    data: prefetchData,
  },
];

fakeCanvas(true);

describe.each(CASES)("the $name widget's binding to its model", (c) => {
  const setup = () => {
    const mounted = c.mount();
    const view = (mounted.el.querySelector(c.className) as unknown as { fsdpviz: CanvasView })
      .fsdpviz;
    return { ...mounted, view };
  };

  it("sets and saves the selection a click makes, once, and shows it once", () => {
    const { model, view } = setup();
    const shows = vi.spyOn(view as unknown as { setSelected: () => void }, "setSelected");
    const value = c.click(view);
    expect(model.state[c.trait]).toBe(value);
    expect(model.saved).toEqual([{ [c.trait]: value }]);
    expect(shows).toHaveBeenCalledTimes(1); // the view's own, not again from the model
    expect(c.shown(view)).toBe(String(value));
  });

  it("shows the selection Python sets, without saving it back", () => {
    const { model, view } = setup();
    model.fromPython(c.trait, c.other);
    expect(c.shown(view)).toBe(String(c.other));
    expect(model.saved).toEqual([]);
  });

  it("is dimmed while Python says it is busy", () => {
    const { model, view } = setup();
    expect(view.root.classList.contains("fv-busy")).toBe(false);
    model.fromPython("busy", true);
    expect(view.root.classList.contains("fv-busy")).toBe(true);
    model.fromPython("busy", false);
    expect(view.root.classList.contains("fv-busy")).toBe(false);
  });

  it("shows an error in a handler under the view and tells Python", () => {
    const { model, view, el } = setup();
    const logged = vi.spyOn(console, "error").mockImplementation(() => {});
    vi.spyOn(view as unknown as { setData: () => void }, "setData").mockImplementation(() => {
      throw new Error("no such unit");
    });
    model.fromPython("data", c.data());
    expect(model.state.error).toBe("Error: no such unit");
    expect(model.saved).toEqual([{ error: "Error: no such unit" }]);
    expect(el.querySelector(".fv-error")?.textContent).toContain("Error: no such unit");
    expect(logged).toHaveBeenCalled();
  });

  it("leaves no listener on the model once removed", () => {
    const { model, cleanup } = setup();
    expect(model.listeners()).toBeGreaterThan(0);
    cleanup();
    expect(model.listeners()).toBe(0);
  });
});
