// @vitest-environment jsdom
// The standalone HTML page: the in-page model, its packed scripts, and the links between
// the timeline widget, the explorer and the prefetch graph (the tiny model's data as Python
// writes it: js/test/data).

import type { AnyModel } from "@anywidget/types";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  initialState,
  type Linker,
  mountViews,
  nextStepOfUnit,
  type PageConfig,
  PageModel,
  unitOfStep,
  unpack,
} from "../src/standalone";
import widget, { type WidgetModel } from "../src/widget";
import { explorerData, fakeContext, predicted, prefetchData } from "./fixtures";

function config(): PageConfig {
  return {
    timeline: predicted(),
    theme: "light",
    explorer: explorerData(),
    prefetch: prefetchData(),
    find: { input: "find", note: "find-note" },
    divs: { timeline: "tl", explorer: "ex", prefetch: "pf" },
  };
}

function setup(cfg: PageConfig = config()) {
  for (const id of ["tl", "ex", "pf"]) {
    const div = document.createElement("div");
    div.id = id;
    document.body.append(div);
  }
  const find = document.createElement("input");
  find.id = "find";
  const note = document.createElement("span");
  note.id = "find-note";
  document.body.append(find, note);
  const model = new PageModel<WidgetModel>(initialState(cfg));
  const render = (widget as { render: (p: unknown) => () => void }).render;
  const tl = document.getElementById("tl") as HTMLElement;
  render({ model: model as unknown as AnyModel<WidgetModel>, el: tl });
  const linker: Linker = mountViews(document, cfg, model);
  const explorer = linker.explorer;
  const prefetch = linker.prefetch;
  if (explorer === null || prefetch === null) throw new Error("a view is missing");
  return { cfg, model, linker, explorer, prefetch, tl, find, note };
}

const stepForward = (tl: HTMLElement): void => {
  [...tl.querySelectorAll("button")].find((b) => b.title.startsWith("step forward"))?.click();
};

/** The centre of module `name`'s block in the explorer. */
function blockCentre(view: NonNullable<Linker["explorer"]>, name: string): [number, number] {
  const slot = view.slotOf(view.index.byName.get(name) ?? -1);
  if (slot === null) throw new Error(`${name} is not drawn`);
  return [slot.x + slot.w / 2, slot.y + slot.h / 2];
}

beforeEach(() => {
  vi.stubGlobal(
    "ResizeObserver",
    class {
      observe(): void {}
      disconnect(): void {}
    },
  );
  vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockImplementation(
    () => fakeContext() as unknown as ReturnType<HTMLCanvasElement["getContext"]>,
  );
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

describe("steps and units", () => {
  it("finds the unit of a step and the next step of a unit, wrapping around", () => {
    const data = predicted();
    expect(unitOfStep(data, 1)).toBe("blocks.0");
    expect(unitOfStep({ ...data, n_steps: 0 }, 0)).toBeNull();
    expect(nextStepOfUnit(data, "blocks.0", 1)).toBe(2);
    expect(nextStepOfUnit(data, "", 4)).toBe(16);
    expect(nextStepOfUnit(data, "", 17)).toBe(0);
    expect(nextStepOfUnit(data, "nope", 0)).toBe(-1);
  });
});

describe("linked page", () => {
  it("outlines and rings the first event's unit at start and follows the step buttons", () => {
    const { explorer, prefetch, tl } = setup();
    expect(explorer.root.dataset.fvCurrentUnit).toBe("");
    expect(prefetch.root.dataset.fvCurrentUnit).toBe("");
    expect(tl.querySelector(".fv-info")?.textContent).toMatch(/^step 0 of 18 /);
    stepForward(tl);
    expect(tl.querySelector(".fv-info")?.textContent).toMatch(
      /^step 1 of 18 · all_gather unit 1 'blocks.0'/,
    );
    expect(document.body.dataset.fvCurrentUnit).toBe("blocks.0");
    expect(explorer.root.dataset.fvCurrentUnit).toBe("blocks.0");
    expect(prefetch.root.dataset.fvCurrentUnit).toBe("blocks.0");
    expect(document.querySelectorAll(".fv-info")).toHaveLength(1); // one status line
  });

  it("follows the widget's slider", () => {
    const { tl, explorer } = setup();
    const slider = tl.querySelector(".fv-slider") as HTMLInputElement;
    slider.value = "4";
    slider.dispatchEvent(new Event("input"));
    expect(tl.querySelector(".fv-info")?.textContent).toMatch(/^step 4 of 18 /);
    expect(document.body.dataset.fvStep).toBe("4");
    expect(explorer.root.dataset.fvCurrentUnit).toBe(document.body.dataset.fvCurrentUnit);
  });

  it("a click on a unit in either view selects it in the timeline, at its next event", () => {
    const { model, explorer, prefetch, tl } = setup();
    explorer.clickAt(...blockCentre(explorer, "blocks.1"));
    expect(model.get("selected_unit")).toBe("blocks.1");
    expect(model.get("step")).toBe(nextStepOfUnit(predicted(), "blocks.1", 0));
    expect(tl.querySelector(".fv-info")?.textContent).toContain("selected: unit 2 'blocks.1'");
    expect(prefetch.root.dataset.fvSelectedUnit).toBe("blocks.1");
    expect(explorer.data.modules.name[explorer.focus]).toBe("blocks.1"); // zoomed, as clicked
    explorer.clickAt(...blockCentre(explorer, "blocks.1.fc")); // inside it: stays
    expect(explorer.data.modules.name[explorer.focus]).toBe("blocks.1");
    const c = prefetch.nodeCentre("");
    if (c === null) throw new Error("(root) is not drawn");
    prefetch.clickAt(c.x, c.y);
    expect(model.get("selected_unit")).toBe("");
    expect(document.body.dataset.fvSelectedUnit).toBe("");
    expect(explorer.root.dataset.fvSelectedUnit).toBe("");
    expect(explorer.focus).toBe(0); // (root) selected elsewhere: brought into view
  });

  it("a unit selected in the timeline is outlined and ringed, brought into view", () => {
    const { model, explorer, prefetch } = setup();
    explorer.focusOn(explorer.index.byName.get("blocks.0") ?? 0);
    model.set("selected_unit", "blocks.2");
    expect(explorer.root.dataset.fvSelectedUnit).toBe("blocks.2");
    expect(explorer.data.modules.name[explorer.focus]).toBe("blocks");
    expect(prefetch.root.dataset.fvSelectedUnit).toBe("blocks.2");
    expect(document.body.dataset.fvFocus).toBe("blocks");
  });

  it("the search box selects the unit it names and draws the module", () => {
    const { find, note, model, explorer } = setup();
    find.value = "blocks.2.fc";
    find.dispatchEvent(new Event("change"));
    expect(note.textContent).toBe("found 'blocks.2.fc'");
    expect(model.get("selected_unit")).toBe("blocks.2");
    expect(explorer.data.modules.name[explorer.focus]).toBe("blocks.2");
    expect(document.body.dataset.fvFound).toBe("blocks.2.fc");
    find.value = "zzz";
    find.dispatchEvent(new Event("change"));
    expect(note.textContent).toMatch(/^no unit or module matches 'zzz'/);
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
