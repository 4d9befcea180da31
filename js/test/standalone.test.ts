// @vitest-environment jsdom
// The standalone HTML page: the in-page model, and the links between the timeline
// widget and the plotly figures (plotly replaced by a recorder of restyle calls).

import type { AnyModel } from "@anywidget/types";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { TimelineData } from "../src/model";
import {
  childrenOf,
  explorerOutline,
  explorerUnit,
  FOLLOW_AFTER_MS,
  findModule,
  fittingLabels,
  initialState,
  Linker,
  nextStepOfUnit,
  type PageConfig,
  PageModel,
  prefetchUnit,
  thinnedTicks,
  tickUpdate,
  treeView,
  unitOfStep,
  unpack,
  viewTitle,
  viewTrace,
} from "../src/standalone";
import widget, { type WidgetModel } from "../src/widget";
import { predicted } from "./fixtures";

/** The tiny prediction, its units renamed to b, c, d: "", b, c and d. */
function sample(): TimelineData {
  const data = predicted();
  data.units = ["", "b", "c", "d"];
  return data;
}

type ClickHandler = (ev: { points?: unknown[] }) => unknown;

/** A plotly graph div: `data` with trace names, `on` for its events; `click_` sends a
 * plotly_click, `fire` any event (returning what its handlers return). */
function plotDiv(
  id: string,
  names: string[],
): HTMLElement & {
  click_: (p: unknown) => void;
  fire: (e: string, p?: unknown) => unknown[];
  data: Array<Record<string, unknown>>;
  _fullData?: Array<{ level?: string }>;
} {
  const el = document.createElement("div") as unknown as HTMLElement & {
    data: Array<Record<string, unknown>>;
    on: (e: string, cb: ClickHandler) => void;
    click_: (p: unknown) => void;
    fire: (e: string, p?: unknown) => unknown[];
  };
  el.id = id;
  el.data = names.map((name) => ({ name }));
  const handlers = new Map<string, ClickHandler[]>();
  el.on = (e, cb) => {
    handlers.set(e, [...(handlers.get(e) ?? []), cb]);
  };
  el.fire = (e, p) => (handlers.get(e) ?? []).map((h) => h({ points: p === undefined ? [] : [p] }));
  el.click_ = (p) => {
    el.fire("plotly_click", p);
  };
  document.body.appendChild(el);
  return el;
}

function config(): PageConfig {
  return {
    figures: [],
    plotConfig: {},
    timeline: sample(),
    theme: "light",
    explorer: {
      div: "ex",
      ids: ["<root>", "b", "b.fc", "c"],
      parents: ["", "<root>", "b", "<root>"],
      units: ["", "b", "b", null],
      outline: ["F", "B"],
    },
    find: { input: "find", note: "find-note" },
    prefetch: { div: "pf", positions: { "": 0, b: 1, c: 2, d: 3 } },
    timelineDiv: "tl",
  };
}

/** A model with more modules than the explorer draws at once (budget 6): blocks b and c closed. */
function bigConfig(): PageConfig {
  const ids = ["<root>", "inp", "blocks", "b", "b.fc", "c", "c.fc", "head"];
  const parents = ["", "<root>", "<root>", "blocks", "b", "blocks", "c", "<root>"];
  return {
    ...config(),
    explorer: {
      div: "ex",
      ids,
      units: ["", "", "", "b", "b", null, null, ""],
      tree: {
        parents,
        labels: ["M [unit 0]", "inp", "blocks", "b [unit 1]", "fc", "c", "fc", "head"],
        values: [10, 1, 8, 4, 4, 4, 4, 1],
        colors: ids.map(() => "#E69F00"),
        customdata: ids.map(() => ["cls", "u", "1", "1 B", "1 B", "float32", ""]),
        budget: 6,
        title: "Wrap units",
      },
    },
  };
}

function setup(cfg: PageConfig = config(), prepared = false) {
  const explorer = plotDiv("ex", ["modules"]);
  const prefetch = plotDiv("pf", ["forward order", "units", "current", "selected"]);
  const find = document.createElement("input");
  find.id = "find";
  const note = document.createElement("span");
  note.id = "find-note";
  document.body.append(find, note);
  const tl = document.createElement("div");
  tl.id = "tl";
  document.body.append(tl);
  const status = tl;
  const calls: Array<{ id: string; update: Record<string, unknown>; traces?: number[] }> = [];
  const layouts: Array<Record<string, unknown>> = [];
  const plotly = {
    newPlot: () => undefined,
    restyle: (gd: HTMLElement, update: Record<string, unknown>, traces?: number[]) =>
      calls.push({ id: gd.id, update, traces }),
    relayout: (_gd: HTMLElement, update: Record<string, unknown>) => layouts.push(update),
  };
  const model = new PageModel<WidgetModel>(initialState(cfg));
  const render = (widget as { render: (p: unknown) => () => void }).render;
  render({ model: model as unknown as AnyModel<WidgetModel>, el: tl });
  const linker = new Linker(cfg, model, plotly, document);
  if (prepared) {
    // as mount does: each figure prepared, then drawn (the fake plotly draws its data as is)
    linker.prepare("ex", explorer);
    linker.prepare("pf", prefetch);
  }
  linker.start();
  return { cfg, model, calls, layouts, linker, explorer, prefetch, status, tl, find, note };
}

/** Where the prefetch graph's ring trace `trace` is (its data: the overlay draws it). */
const ringAt = (gd: { data: Array<Record<string, unknown>> }, trace: number) => gd.data[trace].x;

const lastRestyle = (
  calls: ReturnType<typeof setup>["calls"],
  id: string,
  trace: number,
  key?: string,
) =>
  [...calls]
    .reverse()
    .find((c) => c.id === id && c.traces?.[0] === trace && (key === undefined || key in c.update));

beforeEach(() => {
  vi.stubGlobal(
    "ResizeObserver",
    class {
      observe(): void {}
      disconnect(): void {}
    },
  );
  vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockReturnValue(null);
});

afterEach(() => {
  vi.unstubAllGlobals();
  vi.restoreAllMocks();
  document.body.innerHTML = "";
});

describe("PageModel", () => {
  it("implements get/set/on/off/save_changes/send; emits only real changes", () => {
    const model = new PageModel({ step: 0, unit: null as string | null });
    const seen: unknown[] = [];
    const onStep = (v: unknown) => seen.push(v);
    model.on("change:step", onStep);
    model.on("change", (k: unknown) => seen.push(`any:${String(k)}`));
    model.set("step", 3);
    model.set("step", 3);
    expect(model.get("step")).toBe(3);
    expect(seen).toEqual([3, "any:step"]);
    model.save_changes();
    model.send({ event: "ping" });
    expect(model.sent).toEqual([{ event: "ping" }]);
    model.off("change:step", onStep);
    model.set("step", 4);
    expect(seen).toEqual([3, "any:step", "any:step"]);
    model.off();
    expect(model.listeners()).toBe(0);
  });
});

describe("pure helpers", () => {
  it("outlines one unit's explorer nodes", () => {
    expect(explorerOutline(["", "b", "b", null], "b", ["F", "B"])).toEqual(["B", "F", "F", "B"]);
    expect(explorerOutline(["", null], null, ["F", "B"])).toEqual(["B", "B"]);
  });

  it("finds a module by name, (root), or a part of a unit's or module's name", () => {
    const ids = ["<root>", "inp", "blocks", "b", "b.fc", "c", "head"];
    const units = ["", "", "", "b", "b", null, ""];
    expect(findModule(ids, units, "(root)")).toBe(0);
    expect(findModule(ids, units, " b.fc ")).toBe(4);
    expect(findModule(ids, units, "B")).toBe(3); // units first
    expect(findModule(ids, units, "FC")).toBe(4);
    expect(findModule(ids, units, "ea")).toBe(6);
    expect(findModule(ids, units, "<root>")).toBe(-1); // the id is not a name
    expect(findModule(ids, units, "roo")).toBe(0); // the root reads (root)
    expect(findModule(ids, units, "nope")).toBe(-1);
    expect(findModule(ids, units, "  ")).toBe(-1);
  });

  it("finds the unit of a step and the next step of a unit, wrapping around", () => {
    const data = sample();
    expect(unitOfStep(data, 1)).toBe("b");
    expect(unitOfStep({ ...data, n_steps: 0 }, 0)).toBeNull();
    expect(nextStepOfUnit(data, "b", 1)).toBe(2);
    expect(nextStepOfUnit(data, "", 4)).toBe(16);
    expect(nextStepOfUnit(data, "", 17)).toBe(0);
    expect(nextStepOfUnit(data, "nope", 0)).toBe(-1);
  });

  it("maps plotly click points to units", () => {
    const cfg = config();
    const ex = cfg.explorer as NonNullable<PageConfig["explorer"]>;
    const pf = cfg.prefetch as NonNullable<PageConfig["prefetch"]>;
    expect(explorerUnit(ex, { id: "b.fc" })).toBe("b");
    expect(explorerUnit(ex, { pointNumber: 0 })).toBe("");
    expect(explorerUnit(ex, { id: "c" })).toBeNull();
    expect(prefetchUnit(pf, { customdata: "b" })).toBe("b");
    expect(prefetchUnit(pf, { customdata: ["x"] })).toBeNull();
  });
});

describe("linked page", () => {
  it("outlines the first event's unit at start and follows the step buttons", () => {
    const { calls, status, tl, prefetch } = setup();
    expect(lastRestyle(calls, "ex", 0)?.update).toEqual({
      "marker.line.color": [["F", "B", "B", "B"]],
    });
    expect(ringAt(prefetch, 2)).toEqual([0]);
    expect(status.querySelector(".fv-info")?.textContent).toMatch(/^step 0 of 18 /);
    expect(document.body.dataset.fvCurrentUnit).toBe("");
    const forward = [...tl.querySelectorAll("button")].find((b) =>
      b.title.startsWith("step forward"),
    );
    forward?.click();
    expect(status.querySelector(".fv-info")?.textContent).toMatch(
      /^step 1 of 18 · all_gather unit 1 'b'/,
    );
    expect(document.body.dataset.fvCurrentUnit).toBe("b");
    expect(document.querySelectorAll(".fv-info")).toHaveLength(1); // one status line
    expect(lastRestyle(calls, "ex", 0)?.update).toEqual({
      "marker.line.color": [["B", "F", "F", "B"]],
    });
    expect(ringAt(prefetch, 2)).toEqual([1]);
  });

  it("a prepared page starts without re-drawing a figure, outlined and ringed as drawn", () => {
    const { calls, explorer, prefetch, tl } = setup(config(), true);
    const marker = explorer.data[0].marker as { line: { color: string[] } };
    expect(marker.line.color).toEqual(["F", "B", "B", "B"]); // the first event's unit
    expect(prefetch.data.map((t) => t.visible)).toEqual([undefined, undefined, false, false]);
    expect(calls).toEqual([]); // no restyle: nothing drawn twice
    expect(ringAt(prefetch, 2)).toEqual([0]);
    const forward = [...tl.querySelectorAll("button")].find((b) =>
      b.title.startsWith("step forward"),
    );
    forward?.click();
    expect(lastRestyle(calls, "ex", 0)?.update).toEqual({
      "marker.line.color": [["B", "F", "F", "B"]],
    });
  });

  it("follows the widget's slider", () => {
    const { status, tl } = setup();
    const slider = tl.querySelector(".fv-slider") as HTMLInputElement;
    slider.value = "4";
    slider.dispatchEvent(new Event("input"));
    expect(status.querySelector(".fv-info")?.textContent).toMatch(/^step 4 of 18 /);
    expect(document.body.dataset.fvStep).toBe("4");
  });

  it("a click on a unit in either figure selects it in the timeline", () => {
    const { model, explorer, prefetch, tl } = setup();
    explorer.click_({ id: "b" });
    expect(model.get("selected_unit")).toBe("b");
    expect(model.get("step")).toBe(1); // the next event of 'b'
    expect(tl.querySelector(".fv-info")?.textContent).toMatch(/^step 1 of 18 /);
    expect(ringAt(prefetch, 3)).toEqual([1]);
    explorer.click_({ id: "b.fc" });
    expect(model.get("step")).toBe(2);
    prefetch.click_({ customdata: "" });
    expect(model.get("selected_unit")).toBe("");
    expect(model.get("step")).toBe(16);
    expect(document.body.dataset.fvSelectedUnit).toBe("");
    explorer.click_({ id: "c" }); // not managed by FSDP: nothing to select
    expect(model.get("selected_unit")).toBe("");
  });
});

describe("search box, path bar and axis labels", () => {
  it("the search box selects the unit it names and zooms the explorer to it", () => {
    const { model, calls, find, note } = setup();
    find.value = "fc";
    find.dispatchEvent(new Event("change"));
    expect(model.get("selected_unit")).toBe("b");
    expect(model.get("step")).toBe(1);
    // b.fc has no children: the explorer shows it inside its parent
    expect(lastRestyle(calls, "ex", 0, "level")?.update).toEqual({ level: ["b"] });
    expect(note.textContent).toBe("found 'b.fc'");
    expect(document.body.dataset.fvFound).toBe("b.fc");
    find.value = "(root)";
    find.dispatchEvent(new Event("change"));
    expect(model.get("selected_unit")).toBe("");
    expect(lastRestyle(calls, "ex", 0, "level")?.update).toEqual({ level: ["<root>"] });
    expect(note.textContent).toBe("found (root)");
    find.value = "nope";
    find.dispatchEvent(new Event("change"));
    expect(note.textContent).toMatch(/^no unit or module matches 'nope'/);
    expect(model.get("selected_unit")).toBe("");
  });

  it("a click that zooms out (the path bar) selects nothing; a click that zooms in does", () => {
    const { model, explorer } = setup();
    explorer.data[0] = { name: "modules", ids: ["<root>", "b", "b.fc", "c"] };
    explorer.data[0].parents = ["", "<root>", "b", "<root>"];
    explorer._fullData = [{ level: "b" }]; // zoomed into 'b'
    model.set("selected_unit", "c");
    expect(explorer.fire("plotly_icicleclick", { id: "<root>" })).toEqual([undefined]);
    explorer.click_({ id: "<root>" }); // plotly's own zoom out, then its click
    expect(model.get("selected_unit")).toBe("c");
    explorer.fire("plotly_icicleclick", { id: "b.fc" });
    explorer.click_({ id: "b.fc" });
    expect(model.get("selected_unit")).toBe("b");
  });

  it("keeps every k-th unit name so that names stand apart at the width drawn", () => {
    const ticks = {
      vals: [0, 1, 2, 3, 4, 5, 6],
      text: ["a", "b", "c", "d", "e", "f", "g"],
      min_px: 16,
    };
    expect(thinnedTicks(ticks, 700, 7).vals).toEqual([0, 1, 2, 3, 4, 5, 6]);
    expect(thinnedTicks(ticks, 70, 7)).toEqual({ vals: [0, 2, 4, 6], text: ["a", "c", "e", "g"] });
    const gd = {
      layout: { meta: { fsdpviz_ticks: ticks }, xaxis: { tickvals: [0, 2, 4, 6] } },
      _fullLayout: { xaxis: { _length: 70, range: [-0.5, 6.5] } },
    };
    expect(tickUpdate(gd)).toBeNull(); // already thinned so
    gd._fullLayout.xaxis._length = 30;
    expect(tickUpdate(gd)).toEqual({ "xaxis.tickvals": [0, 4], "xaxis.ticktext": ["a", "e"] });
    expect(tickUpdate({ layout: {} })).toBeNull();
  });
});

describe("a big model's explorer in the page", () => {
  it("draws as many levels as the budget allows, like tree_view", () => {
    const ex = bigConfig().explorer as NonNullable<PageConfig["explorer"]>;
    const tree = ex.tree as NonNullable<typeof ex.tree>;
    const children = childrenOf(ex.ids, tree.parents);
    const top = treeView(children, 0, 6);
    expect(top.indices).toEqual([0, 1, 2, 3, 5, 7]);
    expect([...top.closed].sort()).toEqual([3, 5]);
    const trace = viewTrace(ex.ids, tree, children, top);
    expect(trace.labels).toEqual(["M [unit 0]", "inp", "blocks", "b [unit 1] ▸", "c ▸", "head"]);
    expect((trace.customdata as string[][])[3][6]).toBe("<br>click to open its 1 submodules");
    expect(viewTitle(ex.ids, tree, top)).toBe(
      "Wrap units<br><sup>8 modules: click a block marked ▸ to open it</sup>",
    );
    const inside = treeView(children, 3, 6);
    const opened = viewTrace(ex.ids, tree, children, inside);
    expect(opened.ids).toEqual(["b", "b.fc"]);
    expect(opened.parents).toEqual(["", "b"]);
    expect((opened.customdata as string[][])[0][6]).toBe("<br>click to go up");
    expect(viewTitle(ex.ids, tree, inside)).toBe(
      "Wrap units<br><sup>inside 'b': click it to go up</sup>",
    );
  });

  it("opens a block on a click, goes back up on a click on it, and shows a unit picked elsewhere", () => {
    const { model, calls, layouts, linker, explorer, prefetch } = setup(bigConfig());
    explorer.click_({ id: "b" });
    expect(linker.view.focus).toBe(3);
    expect(lastRestyle(calls, "ex", 0, "ids")?.update.ids).toEqual([["b", "b.fc"]]);
    expect(layouts.at(-1)).toMatchObject({ uirevision: "explorer:b" });
    expect(document.body.dataset.fvFocus).toBe("b");
    expect(model.get("selected_unit")).toBe("b");
    explorer.click_({ id: "b" }); // the opened block: up
    expect(linker.view.focus).toBe(0);
    expect(lastRestyle(calls, "ex", 0, "ids")?.update.ids).toEqual([
      ["<root>", "inp", "blocks", "b", "c", "head"],
    ]);
    linker.focus(5);
    prefetch.click_({ customdata: "b" }); // 'b' is not drawn inside 'c': back to where it is
    expect(linker.view.focus).toBe(0);
  });

  it("outlines and rings the current unit once the steps pause, never while playing", async () => {
    const cfg = bigConfig();
    (cfg.explorer as NonNullable<PageConfig["explorer"]>).ids.push(
      ...Array.from({ length: 200 }, (_, i) => `x${i}`),
    );
    const ex = cfg.explorer as NonNullable<PageConfig["explorer"]>;
    ex.units.push(...Array.from({ length: 200 }, () => null));
    const tree = ex.tree as NonNullable<typeof ex.tree>;
    for (let i = 0; i < 200; i++) {
      tree.parents.push("<root>");
      tree.labels.push(`x${i}`);
      tree.values.push(0);
      tree.colors.push("#999999");
      tree.customdata.push(["", "", "", "", "", "", ""]);
    }
    tree.budget = 1000; // 208 modules drawn: a big figure
    cfg.timeline = sample(); // played slowly: not to its end during the test
    const { model, calls, tl, prefetch } = setup(cfg);
    const forward = [...tl.querySelectorAll("button")].find((b) =>
      b.title.startsWith("step forward"),
    );
    const before = calls.length;
    forward?.click();
    forward?.click();
    expect(calls.length).toBe(before); // not yet: the steps may go on
    // the page model hears the second step after the widget's sync interval (100 ms)
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_AFTER_MS + 200));
    expect(lastRestyle(calls, "ex", 0)?.update["marker.line.color"]).toBeDefined();
    expect(document.body.dataset.fvStep).toBe("2");
    const n = calls.length;
    model.set("playing", true);
    forward?.click();
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_AFTER_MS + 200));
    expect(calls.length).toBe(n); // nothing while playing
    model.set("playing", false); // caught up at once: the current unit ringed
    const current = document.body.dataset.fvCurrentUnit ?? "";
    const x = (cfg.prefetch as NonNullable<PageConfig["prefetch"]>).positions[current];
    expect(ringAt(prefetch, 2)).toEqual([x]);
  });
});

/** `text` gzip-compressed and base64-encoded, as Python's gzip and base64 modules do. */
async function gzipBase64(text: string): Promise<string> {
  const body = new Response(text).body as ReadableStream<BufferSource>;
  const gzipped = new Response(body.pipeThrough(new CompressionStream("gzip")));
  const bytes = new Uint8Array(await gzipped.arrayBuffer());
  return btoa(Array.from(bytes, (b) => String.fromCharCode(b)).join(""));
}

describe("packed scripts", () => {
  it("unpacks gzip and base64 as Python's fsdpviz.export.pack writes them", async () => {
    const text = `{"unit":"layers.0","bytes":${2 ** 40},"note":"é ✓"}`.repeat(50);
    const script = document.createElement("script");
    script.type = "application/gzip";
    script.id = "fv-packed-test";
    // base64 broken over lines, as some editors re-wrap long lines: whitespace is ignored
    script.textContent = (await gzipBase64(text)).replace(/(.{76})/g, "$1\n");
    document.body.append(script);
    try {
      expect(await unpack(document, "fv-packed-test")).toBe(text);
    } finally {
      script.remove();
    }
  });

  it("names the script a page lacks", async () => {
    await expect(unpack(document, "fv-missing")).rejects.toThrow(
      "the page has no packed script #fv-missing",
    );
  });
});

describe("explorer labels", () => {
  const trace = {
    ids: ["M", "blocks", "lm_head", "blocks.0", "blocks.1"],
    parents: ["", "M", "M", "blocks", "blocks"],
    labels: ["M", "blocks", "lm_head", "blocks.0", "blocks.1"],
    values: [100, 99, 1, 98, 1],
  };

  it("labels a slice only where its label fits once its parent fills the width", () => {
    // at 1000 px: lm_head is 10 px under M (needs 7 x 7.15), blocks.1 10 px under blocks
    expect(fittingLabels(trace, 1000, "M")).toEqual(["%{label}", "%{label}", "", "%{label}", ""]);
    // at 10,000 px both fit; the top always shows its label, however narrow
    expect(fittingLabels(trace, 10_000, "M")).toEqual(trace.ids.map(() => "%{label}"));
    expect(fittingLabels(trace, 100, "blocks.1")[4]).toBe("%{label}");
  });

  it("gives the zoom target and its ancestors their labels before plotly zooms", () => {
    const { explorer } = setup();
    explorer.data[0] = { ...trace, name: "modules", texttemplate: ["%{label}", "", "", "", ""] };
    explorer.fire("plotly_icicleclick", { id: "blocks.1" });
    expect(explorer.data[0].texttemplate).toEqual(["%{label}", "%{label}", "", "", "%{label}"]);
  });
});
