// @vitest-environment jsdom
// The explorer on its canvas: the tree's structure, the icicle's layout (every module, a
// pixel column for the thinnest), what a pointer picks, clicks (zoom in, up, select), the
// path above it, search and units selected elsewhere brought into view.
import { describe, expect, it, vi } from "vitest";
import {
  type ExplorerData,
  ExplorerView,
  findModule,
  fitBlockLabel,
  layoutIcicle,
  ModuleIndex,
  REVEAL_PX,
  ROW_H,
} from "../src/explorer";
import { explorerData, fakeCanvas, fakeContext } from "./fixtures";

const names = (d: ExplorerData): string[] => d.modules.name;
const at = (d: ExplorerData, name: string): number => names(d).indexOf(name);

/** A model of `layers` blocks of two linears each, under a ModuleList: 3 + 3 * layers modules. */
function wide(layers: number): ExplorerData {
  const m: ExplorerData["modules"] = {
    name: [""],
    label: ["(root) M [unit 0]"],
    parent: [-1],
    cls: [0],
    unit: [0],
    numel: [0],
    bytes: [0],
    rank_bytes: [0],
  };
  const add = (name: string, parent: number, cls: number, unit: number, numel: number) => {
    m.name.push(name);
    m.label.push(name.split(".").pop() ?? name);
    m.parent.push(parent);
    m.cls.push(cls);
    m.unit.push(unit);
    m.numel.push(numel);
    m.bytes.push(4 * numel);
    m.rank_bytes.push(numel);
    return m.name.length - 1;
  };
  const list = add("layers", 0, 1, 0, 20 * layers);
  for (let k = 0; k < layers; k++) {
    const b = add(`layers.${k}`, list, 2, k + 1, 20);
    add(`layers.${k}.a`, b, 3, k + 1, 10);
    add(`layers.${k}.b`, b, 3, k + 1, 10);
  }
  m.numel[0] = 20 * layers;
  m.bytes[0] = 80 * layers;
  m.rank_bytes[0] = 20 * layers;
  return {
    title: `${layers + 1} units, world size 8`,
    modules: m,
    classes: ["M", "ModuleList", "Block", "Linear"],
    units: [{ name: "", color: "#4E79A7", dtype: "float32", warnings: [] as string[] }].concat(
      Array.from({ length: layers }, (_, k) => ({
        name: `layers.${k}`,
        color: "#F28E2B",
        dtype: "bfloat16",
        warnings: k === 0 ? ["W1"] : [],
      })),
    ),
    unmanaged_color: "#999999",
    details: [],
  };
}

function mount(data: ExplorerData = explorerData()) {
  const el = document.createElement("div");
  document.body.appendChild(el);
  const selected: Array<[string | null, string]> = [];
  const focused: string[] = [];
  const view = new ExplorerView(el, data, {
    select: (unit, module) => selected.push([unit, module]),
    focus: (module) => focused.push(module),
  });
  return { el, view, selected, focused };
}

/** The centre of module `name`'s block as drawn. */
function centre(view: ExplorerView, name: string): [number, number] {
  const slot = view.slotOf(view.index.byName.get(name) ?? -1);
  if (slot === null) throw new Error(`${name} is not drawn`);
  return [slot.x + slot.w / 2, slot.y + slot.h / 2];
}

fakeCanvas();

describe("the module tree", () => {
  it("knows each module's children, depth, levels below it and each unit's module", () => {
    const d = explorerData();
    const index = new ModuleIndex(d);
    expect(index.children[0].map((i) => names(d)[i])).toEqual(["inp", "blocks", "head"]);
    expect(index.depth[at(d, "blocks.1.fc")]).toBe(3);
    expect(index.below[0]).toBe(3);
    expect(index.unitModule.map((i) => names(d)[i])).toEqual(d.units.map((u) => u.name));
    expect(index.path(at(d, "blocks.2.norm")).map((i) => names(d)[i])).toEqual([
      "",
      "blocks",
      "blocks.2",
      "blocks.2.norm",
    ]);
    expect(index.within(at(d, "blocks.2.norm"), at(d, "blocks"))).toBe(true);
    expect(index.within(at(d, "head"), at(d, "blocks"))).toBe(false);
  });

  it("finds a module by name, (root), or a part of a unit's or module's name", () => {
    const d = explorerData();
    const index = new ModuleIndex(d);
    const find = (t: string) => {
      const i = findModule(index, t);
      return i < 0 ? null : names(d)[i];
    };
    expect(find("(root)")).toBe("");
    expect(find(" blocks.0.fc ")).toBe("blocks.0.fc");
    expect(find("BLOCKS.1")).toBe("blocks.1"); // units first
    expect(find("nor")).toBe("blocks.0.norm");
    expect(find("ea")).toBe("head");
    expect(find("roo")).toBe(""); // the root reads (root)
    expect(find("nope")).toBeNull();
    expect(find("  ")).toBeNull();
  });
});

describe("the icicle's layout", () => {
  it("gives each module its share of its parent's width; the parent's own parameters stay bare", () => {
    const d = explorerData();
    const index = new ModuleIndex(d);
    const rows = layoutIcicle(index, d.modules.numel, 0, { a: 0, b: 1 }, 644, 4);
    expect(rows[0]).toEqual({ x: [0], w: [644], node: [0] });
    const total = d.modules.numel[0];
    expect(rows[1].node.map((i) => names(d)[i])).toEqual(["inp", "blocks", "head"]);
    rows[1].node.forEach((i, k) => {
      expect(rows[1].w[k]).toBeCloseTo((644 * d.modules.numel[i]) / total, 9);
    });
    // in model order, left to right, never overlapping
    for (const r of rows) {
      for (let k = 1; k < r.x.length; k++)
        expect(r.x[k]).toBeGreaterThanOrEqual(r.x[k - 1] + r.w[k - 1] - 1e-9);
    }
    // blocks.0 holds norm and fc only: they fill it
    const b0 = rows[2].node.indexOf(at(d, "blocks.0"));
    const kids = rows[3].node
      .map((i, k) => [i, k])
      .filter(([i]) => d.modules.parent[i] === at(d, "blocks.0"));
    const covered = kids.reduce((s, [, k]) => s + rows[3].w[k], 0);
    expect(covered).toBeCloseTo(rows[2].w[b0], 9);
  });

  it("draws a part of the width zoomed across, nothing outside it", () => {
    const d = explorerData();
    const index = new ModuleIndex(d);
    const rows = layoutIcicle(index, d.modules.numel, 0, { a: 0.5, b: 1 }, 600, 4);
    expect(rows[0]).toEqual({ x: [-600], w: [1200], node: [0] });
    expect(rows[1].node.map((i) => names(d)[i])).toEqual(["blocks", "head"]); // inp is left of it
  });

  it("draws every module of a 10,000-module model, a pixel column where blocks are thinner", () => {
    const d = wide(3333);
    const index = new ModuleIndex(d);
    expect(index.n).toBe(10001);
    const rows = layoutIcicle(index, d.modules.numel, 0, { a: 0, b: 1 }, 1000, 9);
    expect(rows.slice(0, 4).map((r) => r.x.length)).toEqual([1, 1, 1000, 1000]);
    expect(rows[2].x.slice(0, 3)).toEqual([0, 1, 2]);
    // zoomed in 100x across: 34 blocks of about 30 px, each with its two halves
    const near = layoutIcicle(index, d.modules.numel, 0, { a: 0.5, b: 0.51 }, 1000, 9);
    expect(near[2].x.length).toBeGreaterThanOrEqual(34);
    expect(near[2].w.slice(1, -1).every((w) => Math.abs(w - 30.003) < 0.01)).toBe(true);
    // each block's halves, but where a block at an edge has one of them off the canvas
    expect(near[3].x.length).toBeGreaterThanOrEqual(2 * near[2].x.length - 2);
    expect(near[3].x.length).toBeLessThanOrEqual(2 * near[2].x.length);
  });
});

describe("the explorer view", () => {
  it("draws the tree from the model down, titled, with the path above it", () => {
    const { view, el } = mount();
    expect(view.rows.map((r) => r.x.length)).toEqual([1, 3, 3, 6]);
    expect(el.querySelector(".fv-title")?.textContent).toBe("4 units, world size 4");
    expect(el.querySelector(".fv-crumbs")?.textContent).toBe("(root)");
    expect(el.querySelector("canvas")?.style.height).toBe(`${4 * ROW_H}px`);
    const labels = view.drawnLabels();
    expect(labels.map((l) => l.text)).toContain("(root) Tiny [unit 0]");
    for (const l of labels) expect(6 * l.text.length).toBeLessThanOrEqual(l.w - 8); // inside
  });

  it("says on hover what a module is; picks the block under the pointer in every row", () => {
    const { view } = mount();
    const d = view.data;
    for (const name of names(d)) {
      const [x, y] = centre(view, name);
      expect(names(d)[view.pickAt(x, y)]).toBe(name);
    }
    const [x, y] = centre(view, "blocks.1.fc");
    view.hoverAt(x, y);
    expect(view.tooltip.lines).toEqual([
      "blocks.1.fc (Linear)",
      "unit: 'blocks.1' (unit 2)",
      "parameters: 72",
      "bytes: 288 B full, 72 B per rank",
      "dtype: float32",
      "click: select its unit",
    ]);
    view.hoverAt(...centre(view, "blocks"));
    expect(view.tooltip.lines.at(-1)).toBe("click: zoom into its 3 submodules");
    view.leave();
    expect(view.tooltip.shown).toBe(false);
  });

  it("zooms into a clicked block and selects its unit; a click on the top or the path goes up", () => {
    const { view, el, selected, focused } = mount();
    view.clickAt(...centre(view, "blocks.1"));
    expect(names(view.data)[view.focus]).toBe("blocks.1");
    expect(focused).toEqual(["blocks.1"]);
    expect(selected).toEqual([["blocks.1", "blocks.1"]]);
    expect(view.rows[0].w[0]).toBe(view.width); // it fills the width
    expect(el.querySelector(".fv-crumbs")?.textContent).toBe("(root) › blocks › 1");
    expect(view.root.dataset.fvSelectedUnit).toBe("blocks.1");
    view.clickAt(...centre(view, "blocks.1.norm")); // a leaf: selects, stays
    expect(names(view.data)[view.focus]).toBe("blocks.1");
    view.clickAt(...centre(view, "blocks.1")); // the top: up one
    expect(names(view.data)[view.focus]).toBe("blocks");
    const root = [...el.querySelectorAll<HTMLButtonElement>(".fv-crumbs button")].find(
      (b) => b.textContent === "(root)",
    );
    root?.click();
    expect(view.focus).toBe(0);
    expect(focused).toEqual(["blocks.1", "blocks", ""]);
  });

  it("outlines the current and the selected unit; a unit selected elsewhere comes into view", () => {
    const { view } = mount();
    view.setCurrent("blocks.0");
    expect(view.root.dataset.fvCurrentUnit).toBe("blocks.0");
    view.focusOn(at(view.data, "blocks.0"));
    view.setSelected("blocks.2"); // not below the top: drawn from its parent
    expect(names(view.data)[view.focus]).toBe("blocks");
    expect(view.slotOf(at(view.data, "blocks.2"))).not.toBeNull();
    view.setSelected(null);
    expect(view.root.dataset.fvSelectedUnit).toBe("");
  });

  it("zooms across to a unit too thin to see, and back out with 'all'", () => {
    const { view, el } = mount(wide(2000));
    const i = at(view.data, "layers.1234");
    expect(view.slotOf(i)?.w).toBe(1); // a pixel column (600 px for 2,000 blocks): shared
    view.setSelected("layers.1234");
    const slot = view.slotOf(i);
    expect(slot?.w).toBeGreaterThanOrEqual(REVEAL_PX - 1e-6);
    expect(slot && slot.x >= 0 && slot.x + slot.w <= view.width).toBe(true);
    expect(el.querySelector(".fv-crumbs")?.textContent).toMatch(/zoomed \d+× across/);
    expect(view.pickAt(slot ? slot.x + slot.w / 2 : 0, 2.5 * ROW_H)).toBe(i);
    [...el.querySelectorAll<HTMLButtonElement>(".fv-zoom button")]
      .find((b) => b.textContent === "all")
      ?.click();
    expect(view.span).toEqual({ a: 0, b: 1 });
  });

  it("answers keys on its canvas: Backspace goes up, + and − zoom across, arrows move", () => {
    const { view } = mount();
    const press = (key: string): void => {
      view.canvas.dispatchEvent(new KeyboardEvent("keydown", { key, cancelable: true }));
    };
    view.focusOn(at(view.data, "blocks.1"));
    press("Backspace");
    expect(names(view.data)[view.focus]).toBe("blocks");
    press("Escape");
    expect(view.focus).toBe(0);
    press("+");
    expect(view.span).toEqual({ a: 0.25, b: 0.75 });
    press("ArrowRight");
    expect(view.span).toEqual({ a: 0.375, b: 0.875 });
    press("-");
    expect(view.span).toEqual({ a: 0, b: 1 });
  });

  it("finds what the search box names: a block at the top, a leaf inside its parent", () => {
    const { view, selected } = mount();
    expect(view.find("blocks.2")).toBe(at(view.data, "blocks.2"));
    expect(names(view.data)[view.focus]).toBe("blocks.2");
    expect(view.find("head")).toBe(at(view.data, "head"));
    expect(view.focus).toBe(0);
    expect(selected.at(-1)).toEqual(["", "head"]);
    expect(view.find("nothing like it")).toBe(-1);
  });

  it("sizes blocks by bytes per rank when asked, and keeps the top module on new data", () => {
    const { view, el } = mount();
    const select = el.querySelector(".fv-area") as HTMLSelectElement;
    select.value = "rank_bytes";
    select.dispatchEvent(new Event("change"));
    const d = view.data;
    const inp = view.slotOf(at(d, "inp"));
    expect(inp?.w).toBeCloseTo((view.width * d.modules.rank_bytes[1]) / d.modules.rank_bytes[0], 9);
    view.focusOn(at(d, "blocks"));
    view.setData(explorerData());
    expect(names(view.data)[view.focus]).toBe("blocks");
  });

  it("cuts a label to keep the end of the module's name, then its unit's number", () => {
    const ctx = fakeContext(); // 6 px per character
    const label = "model.layers.12 [unit 13]";
    expect(fitBlockLabel(ctx, label, 150)).toBe(label);
    expect(fitBlockLabel(ctx, label, 130)).toBe("…layers.12 [unit 13]");
    expect(fitBlockLabel(ctx, label, 100)).toBe("model.layers.12");
    expect(fitBlockLabel(ctx, label, 60)).toBe("…layers.12");
    expect(fitBlockLabel(ctx, "self_attn", 36)).toBe("self_…");
    expect(fitBlockLabel(ctx, "(root) Model [unit 0]", 100)).toBe("(root)… [unit 0]");
    expect(fitBlockLabel(ctx, "mlp", 12)).toBe("");
  });
});

describe("detail panel", () => {
  it("breaks a name between its modules, never inside one", async () => {
    const { DetailPanel } = await import("../src/detail");
    const panel = new DetailPanel();
    const name = "model.layers.0.post_attention_layernorm.weight";
    const detail = {
      title: "unit 1 'model.layers.0'",
      facts: "",
      warnings: [],
      sections: [
        { title: "parameters", header: ["name", "numel"], rows: [[name, "512"]], numeric: [1] },
      ],
    };
    panel.show(detail, null);
    const cell = panel.el.querySelector(".fv-detail-table td") as HTMLElement;
    expect(cell.textContent).toBe(name);
    // a break opportunity after each dot, and only there
    const parts = [...cell.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent);
    expect(parts).toEqual(["model.", "layers.", "0.", "post_attention_layernorm.", "weight"]);
    expect(cell.querySelectorAll("wbr").length).toBe(4);
    expect((panel.el.querySelector("td.fv-num") as HTMLElement).textContent).toBe("512");
    // a panel too narrow for the name broken between modules: inside them too, so the
    // numbers stay in sight
    vi.spyOn(HTMLElement.prototype, "clientWidth", "get").mockReturnValue(200);
    vi.spyOn(HTMLElement.prototype, "scrollWidth", "get").mockReturnValue(260);
    panel.show(detail, null);
    const narrow = panel.el.querySelector(".fv-detail-table td") as HTMLElement;
    expect(narrow.textContent).toBe(name);
    expect(narrow.querySelectorAll("wbr").length).toBe(6);
    vi.restoreAllMocks();
  });
});
