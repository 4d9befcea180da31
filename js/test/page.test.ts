// @vitest-environment jsdom
// The exported page: its in-page models, its packed scripts, and the three views drawn by
// the widget bundle itself, linked as the dashboard links them (the tiny model's data as
// Python writes it: js/test/data).

import { describe, expect, it } from "vitest";
import type { ExplorerView } from "../src/explorer";
import type { ExplorerWidgetView } from "../src/explorer_widget";
import { nextStepOfUnit, unitOfStep } from "../src/links";
import {
  drawViews,
  mountView,
  type PageConfig,
  PageModel,
  type PageModels,
  type TuneConfig,
  TunePage,
  unpack,
  type WidgetModule,
} from "../src/page";
import type { PrefetchView } from "../src/prefetch";
import type { TuneView } from "../src/tune";
import * as widget from "../src/widget";
import { explorerData, fakeCanvas, predicted, prefetchData, tuneData } from "./fixtures";

function config(): PageConfig {
  return {
    views: {
      timeline: { data: predicted() },
      explorer: { data: explorerData() },
      prefetch: { data: prefetchData() },
    },
    divs: { timeline: "tl", explorer: "ex", prefetch: "pf" },
  };
}

function setup(cfg: PageConfig = config()) {
  for (const id of ["tl", "ex", "pf"]) {
    const div = document.createElement("div");
    div.id = id;
    document.body.append(div);
  }
  const module = widget as unknown as WidgetModule;
  const models: PageModels = {
    timeline: mountView(document, module, cfg, "timeline"),
    explorer: mountView(document, module, cfg, "explorer"),
    prefetch: mountView(document, module, cfg, "prefetch"),
  };
  widget.linkViews(models as never);
  const model = models.timeline as PageModel<Record<string, unknown>>;
  const box = (
    document.querySelector(".fsdpviz-explorer-box") as unknown as {
      fsdpviz: ExplorerWidgetView;
    }
  ).fsdpviz;
  const explorer: ExplorerView = box.view;
  const prefetch = (
    document.querySelector(".fsdpviz-prefetch") as unknown as {
      fsdpviz: PrefetchView;
    }
  ).fsdpviz;
  const tl = document.getElementById("tl") as HTMLElement;
  return { cfg, models, model, box, explorer, prefetch, tl };
}

const stepForward = (tl: HTMLElement): void => {
  [...tl.querySelectorAll("button")].find((b) => b.title.startsWith("step forward"))?.click();
};

/** The centre of module `name`'s block in the explorer. */
function blockCentre(view: ExplorerView, name: string): [number, number] {
  const slot = view.slotOf(view.index.byName.get(name) ?? -1);
  if (slot === null) throw new Error(`${name} is not drawn`);
  return [slot.x + slot.w / 2, slot.y + slot.h / 2];
}

fakeCanvas(true);

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
    expect(explorer.root.dataset.fvCurrentUnit).toBe(unitOfStep(predicted(), 4));
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
  });

  it("the find box selects the unit it names and draws the module", () => {
    const { models, model, explorer } = setup();
    explorer.findInput.value = "blocks.2.fc";
    explorer.findInput.dispatchEvent(new Event("change"));
    expect(explorer.findNote.textContent).toBe("found 'blocks.2.fc'");
    expect(model.get("selected_unit")).toBe("blocks.2");
    expect(models.explorer?.get("selected_module")).toBe("blocks.2.fc");
    expect(explorer.data.modules.name[explorer.focus]).toBe("blocks.2");
    expect(models.explorer?.get("focus")).toBe("blocks.2");
    explorer.findInput.value = "zzz";
    explorer.findInput.dispatchEvent(new Event("change"));
    expect(explorer.findNote.textContent).toMatch(/^no unit or module matches 'zzz'/);
  });

  it("shows the selected unit's details beside the explorer, in the plan's words", () => {
    const { box, explorer } = setup();
    expect(box.panel.text).toContain("Click a module or find a unit");
    explorer.clickAt(...blockCentre(explorer, "blocks.1"));
    explorer.clickAt(...blockCentre(explorer, "blocks.1.fc"));
    const text = box.panel.text;
    expect(text).toContain("unit 2 of 4: 'blocks.1' (Block)");
    expect(text).toContain("FULL_SHARD");
    expect(text).toContain("Selected module 'blocks.1.fc' (Linear)");
    expect(text).toContain("Parameters (in flattening order: one FlatParameter)");
    expect(text).toContain("blocks.1.fc.weight");
  });

  it("hides the old plan while a re-plan is on its way", () => {
    const { models, tl } = setup();
    for (const m of [models.timeline, models.explorer, models.prefetch]) m?.set("busy", true);
    expect(tl.querySelector(".fsdpviz-timeline")?.classList.contains("fv-busy")).toBe(true);
    expect(document.querySelector(".fsdpviz-explorer-box")?.classList.contains("fv-busy")).toBe(
      true,
    );
    expect(document.querySelector(".fsdpviz-prefetch")?.classList.contains("fv-busy")).toBe(true);
    models.prefetch?.set("busy", false);
    expect(document.querySelector(".fsdpviz-prefetch")?.classList.contains("fv-busy")).toBe(false);
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

describe("views drawn into given elements (JupyterLab's renderer)", () => {
  it("draws, links and removes the views of a config", async () => {
    const els = { timeline: null, explorer: null, prefetch: null } as Record<
      "timeline" | "explorer" | "prefetch",
      HTMLElement | null
    >;
    for (const name of ["timeline", "explorer", "prefetch"] as const) {
      const el = document.createElement("div");
      document.body.append(el);
      els[name] = el;
    }
    const drawn = await drawViews(widget as unknown as WidgetModule, config(), els);
    const { timeline, explorer, prefetch } = drawn.models;
    expect(els.timeline?.querySelector(".fsdpviz-timeline")).not.toBeNull();
    expect(els.explorer?.querySelector(".fsdpviz-explorer-box")).not.toBeNull();
    expect(els.prefetch?.querySelector(".fsdpviz-prefetch")).not.toBeNull();
    explorer?.set("selected_unit", "blocks.1"); // linked as the page links them
    expect(timeline?.get("selected_unit")).toBe("blocks.1");
    expect(prefetch?.get("selected_unit")).toBe("blocks.1");
    drawn.dispose();
    expect(timeline?.listeners()).toBe(0);
    expect(els.timeline?.querySelector(".fsdpviz-timeline")).toBeNull();
  });

  it("draws only the views a config has (a comparison's timeline)", async () => {
    const cfg = config();
    cfg.views.explorer = null;
    cfg.views.prefetch = null;
    const el = document.createElement("div");
    document.body.append(el);
    const drawn = await drawViews(widget as unknown as WidgetModule, cfg, {
      timeline: el,
      explorer: null,
      prefetch: null,
    });
    expect(drawn.models.explorer).toBeNull();
    expect(el.querySelector(".fsdpviz-timeline")).not.toBeNull();
    drawn.dispose();
  });
});

describe("a tuning's page", () => {
  it("draws the selected configuration's plan under the tune view, and swaps it", async () => {
    const d = tuneData();
    const best = d.points.index[d.best ?? 0];
    const given = d.points.index[d.user];
    document.body.innerHTML = `<div id="fv-tune"></div><h2 id="fv-plan-title"></h2>
      <div id="fv-plan-header"></div><p id="fv-plan-missing" hidden></p>
      <div id="fv-plan-views"><div id="tl"></div><div id="ex"></div><div id="pf"></div></div>`;
    const script = document.createElement("script");
    script.type = "application/gzip";
    script.id = `fv-plan-${best}`;
    script.textContent = await gzipBase64(JSON.stringify({ views: config().views }));
    document.body.append(script);
    const tune: TuneConfig = {
      state: { data: d, selected: best, saved: [best] },
      div: "fv-tune",
      plans: {
        [String(best)]: {
          script: script.id,
          title: `Configuration #${best} (best)`,
          label: "ranks 8 ranks",
          header: "<dl><dt>wrap units</dt><dd>4</dd></dl>",
        },
      },
      kept: "This page holds the plans of 1 of the 6 configurations.",
    };
    const cfg: PageConfig = {
      views: { timeline: null, explorer: null, prefetch: null },
      divs: { timeline: "tl", explorer: "ex", prefetch: "pf" },
      tune,
    };
    const page = new TunePage(document, widget as unknown as WidgetModule, cfg, tune);
    await page.show(best);
    expect(page.shown).toBe(best);
    expect(document.body.dataset.fvPlan).toBe(String(best));
    expect(document.getElementById("fv-plan-title")?.textContent).toBe(
      `Configuration #${best} (best)`,
    );
    expect(document.getElementById("fv-plan-header")?.textContent).toBe("ranks 8 rankswrap units4");
    expect(document.querySelector("#tl .fsdpviz-timeline")).not.toBeNull();
    expect(document.querySelector("#ex .fsdpviz-explorer-box")).not.toBeNull();
    expect(page.views.timeline).not.toBeNull();
    // a point whose plan the page does not hold: said so, no other plan's numbers left
    page.model.set("selected", given);
    await page.show(given);
    expect(page.shown).toBeNull();
    expect(page.views.timeline).toBeNull();
    expect(document.querySelector("#tl .fsdpviz-timeline")).toBeNull();
    expect(document.getElementById("fv-plan-views")?.hidden).toBe(true);
    expect(document.getElementById("fv-plan-missing")?.textContent).toBe(tune.kept);
    expect(document.getElementById("fv-plan-title")?.textContent).toBe(
      `Configuration #${given}: its plan is not in this page`,
    );
    const root = document.querySelector(".fsdpviz-tune") as unknown as { fsdpviz: TuneView };
    expect(root.fsdpviz.selected).toBe(d.user);
    // and back: drawn again from the script unpacked before
    await page.show(best);
    expect(document.getElementById("fv-plan-views")?.hidden).toBe(false);
    expect(document.querySelector("#tl .fsdpviz-timeline")).not.toBeNull();
    page.drawn?.dispose();
    document.body.innerHTML = "";
  });
});
