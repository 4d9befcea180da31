// @vitest-environment jsdom
// The prefetch graph on its canvas: its layout (arcs above and below the line as the
// edges need, names flat or upright), what a pointer picks (units over arcs, every arc by
// its own line), clicks, the window of a graph of hundreds of units and its overview.
import { describe, expect, it, vi } from "vitest";
import {
  arcPoint,
  firstWindow,
  MIN_SPACING,
  type PrefetchData,
  PrefetchView,
  prefetchLayout,
} from "../src/prefetch";
import { fakeCanvas, prefetchData, prefetchPost } from "./fixtures";

/** `n` units in a chain: forward order along it, each prefetching the one before in backward. */
function chain(n: number): PrefetchData {
  const d = prefetchData();
  const units = Array.from({ length: n }, (_, k) => (k === 0 ? "" : `layers.${k - 1}`));
  const edges: PrefetchData["edges"] = { kind: [], source: [], target: [], text: [] };
  for (let k = 0; k + 1 < n; k++) {
    edges.kind.push(0);
    edges.source.push(k);
    edges.target.push(k + 1);
    edges.text.push(`forward order ${k}`);
    edges.kind.push(2);
    edges.source.push(k + 1);
    edges.target.push(k);
    edges.text.push(`backward prefetch of ${k} by ${k + 1}`);
  }
  return {
    ...d,
    units,
    numbers: units.map((_, k) => k),
    colors: units.map((_, k) => (k % 2 ? "#F28E2B" : "#4E79A7")),
    hover: units.map((u) => [u, "forward index"]),
    never: units.map((_, k) => k === 0),
    edges,
  };
}

function mount(data: PrefetchData = prefetchData()) {
  const el = document.createElement("div");
  document.body.appendChild(el);
  const selected: string[] = [];
  const view = new PrefetchView(el, data, { select: (u) => selected.push(u) });
  return { el, view, selected };
}

fakeCanvas();

const measure = (t: string): number => 6 * t.length;

describe("the prefetch graph's layout", () => {
  it("makes room above the line for forward prefetch and below it for backward prefetch", () => {
    const both = prefetchLayout(prefetchData(), 1000, measure);
    expect(both.top).toBeGreaterThan(50);
    expect(both.bottom).toBeGreaterThan(50);
    const post = prefetchLayout(prefetchPost(), 1000, measure);
    expect(post.bottom).toBeGreaterThan(both.bottom); // the misses run further below
    const flat = prefetchLayout({ ...chain(4), edges: chain(1).edges }, 1000, measure);
    expect([flat.top, flat.bottom]).toEqual([12, 12]);
    expect(both.upright).toBe(false); // four names side by side
    expect(both.windowed).toBe(false);
  });

  it("stands the names upright and shows a window of units where they do not fit", () => {
    const l = prefetchLayout(chain(500), 1000, measure);
    expect(l.upright).toBe(true);
    expect(l.windowed).toBe(true);
    expect(l.labelH).toBe(6 * "layers.498".length + 10);
    expect(firstWindow(500, l.plotW)).toEqual({ u0: 0, u1: l.plotW / MIN_SPACING });
    expect(firstWindow(4, l.plotW)).toEqual({ u0: 0, u1: 4 });
  });

  it("draws an arc that peaks its height off the line half-way", () => {
    expect(arcPoint(0, 100, 50, 20, 0)).toEqual([0, 50]);
    expect(arcPoint(0, 100, 50, 20, 0.5)).toEqual([50, 30]);
    expect(arcPoint(0, 100, 50, -20, 1)).toEqual([100, 50]);
  });
});

describe("the prefetch graph view", () => {
  it("shows the title, the notes and a legend of the edges it draws", () => {
    const { el } = mount(prefetchPost());
    expect(el.querySelector(".fv-title")?.textContent).toBe(prefetchPost().title);
    expect(el.querySelector(".fv-notes")?.textContent).toMatch(
      /^BACKWARD_POST prefetches too late/,
    );
    const legend = el.querySelector(".fv-legend")?.textContent ?? "";
    expect(legend).toContain("next in backward, gathered on demand");
    expect(legend).not.toContain("misordered");
    expect(legend).not.toContain("never prefetched"); // every unit gathered ahead at least once
    const never = prefetchPost();
    never.never[2] = true;
    const other = mount(never);
    expect(other.el.querySelector(".fv-legend")?.textContent).toContain("never prefetched");
  });

  it("picks the unit at every node and every name, before the arcs into it", () => {
    const { view } = mount();
    const d = view.data;
    d.units.forEach((u, i) => {
      const c = view.nodeCentre(u);
      expect(c).not.toBeNull();
      if (c === null) return;
      expect(view.pickAt(c.x, c.y)).toEqual({ kind: "unit", u: i });
      expect(view.pickAt(c.x + 2, c.y - 3)).toEqual({ kind: "unit", u: i });
      expect(view.pickAt(c.x, view.layout.labelTop + 5)).toEqual({ kind: "unit", u: i });
    });
  });

  it("picks every arc by its own line, and a click on it selects its target", () => {
    const { view, selected } = mount();
    const d = view.data;
    const y = view.layout.baseY;
    for (let e = 0; e < d.edges.kind.length; e++) {
      if (d.kinds[d.edges.kind[e]].side === 0) continue;
      const x0 = view.xOf(d.edges.source[e]);
      const x1 = view.xOf(d.edges.target[e]);
      const [px, py] = arcPoint(x0, x1, y, view.arcHeight(e), 0.5);
      expect(view.pickAt(px, py)).toEqual({ kind: "edge", e });
      view.hoverAt(px, py);
      expect(view.tooltip.lines).toEqual([
        d.kinds[d.edges.kind[e]].label,
        d.edges.text[e],
        `click: select ${d.units[d.edges.target[e]] === "" ? "(root)" : `'${d.units[d.edges.target[e]]}'`}`,
      ]);
      view.clickAt(px, py);
      expect(selected.at(-1)).toBe(d.units[d.edges.target[e]]);
    }
    expect(view.data.kinds[view.data.edges.kind[3]].name).toBe("forward_prefetch");
    expect(view.arcHeight(3)).toBeGreaterThan(0); // above the line
    expect(view.arcHeight(6)).toBeLessThan(0); // backward: below
  });

  it("rings the current and the selected unit; a click on a unit selects it", () => {
    const { view, selected } = mount();
    view.setCurrent("blocks.1");
    expect(view.root.dataset.fvCurrentUnit).toBe("blocks.1");
    const c = view.nodeCentre("blocks.2");
    if (c === null) throw new Error("blocks.2 is not drawn");
    view.hoverAt(c.x, c.y);
    expect(view.tooltip.lines[0]).toBe("'blocks.2' (Block)");
    expect(view.tooltip.lines.at(-1)).toBe("unit 3; click: select it");
    view.clickAt(c.x, c.y);
    expect(selected).toEqual(["blocks.2"]);
    expect(view.root.dataset.fvSelectedUnit).toBe("blocks.2");
  });

  it("shows a window of a 500-unit graph that follows the current unit, names apart", () => {
    const { view, el } = mount(chain(500));
    const shown = view.win.u1 - view.win.u0;
    expect(view.spacing).toBeCloseTo(MIN_SPACING, 9);
    view.setCurrent("layers.300");
    expect(view.win.u0).toBeLessThanOrEqual(301);
    expect(view.win.u1).toBeGreaterThanOrEqual(302);
    expect(view.win.u1 - view.win.u0).toBeCloseTo(shown, 9);
    const c = view.nodeCentre("layers.300");
    expect(c && c.x > 0 && c.x < view.layout.width).toBe(true);
    const xs = view.names().map(([u]) => view.xOf(u));
    for (let k = 1; k < xs.length; k++) expect(xs[k] - xs[k - 1]).toBeGreaterThanOrEqual(14);
    [...el.querySelectorAll<HTMLButtonElement>(".fv-zoom button")]
      .find((b) => b.textContent === "all")
      ?.click();
    expect(view.win).toEqual({ u0: 0, u1: 500 });
    const names = view.names();
    expect(names.length).toBeLessThan(500 / 10); // every k-th, apart at this spacing
    const gaps = names.slice(1).map(([u], k) => view.xOf(u) - view.xOf(names[k][0]));
    expect(Math.min(...gaps)).toBeGreaterThanOrEqual(14);
    // keys on the canvas: + shows fewer units, arrows move along
    const press = (key: string): void => {
      view.canvas.dispatchEvent(new KeyboardEvent("keydown", { key }));
    };
    press("+");
    expect(view.win).toEqual({ u0: 125, u1: 375 });
    press("ArrowLeft");
    expect(view.win.u0).toBeCloseTo(62.5, 9);
    // a click in the overview centres the window there
    view.zoom(0.1);
    const l = view.layout;
    view.clickAt(28 + 0.8 * l.plotW, l.overviewTop + 10);
    expect((view.win.u0 + view.win.u1) / 2).toBeCloseTo(400, 6);
  });

  it("lays its units out again when the page narrows: all of them, or a window and its overview", () => {
    let width = 1920;
    vi.spyOn(HTMLElement.prototype, "clientWidth", "get").mockImplementation(() => width);
    const { view } = mount(chain(70)); // 70 units fit 1,920 px 22 px apart
    expect(view.win).toEqual({ u0: 0, u1: 70 });
    expect(view.layout.windowed).toBe(false);
    width = 1000;
    view.resize();
    expect(view.layout.windowed).toBe(true); // an overview of them all underneath
    expect(view.win.u0).toBe(0);
    expect(view.win.u1).toBeCloseTo((1000 - 56) / MIN_SPACING, 9);
    expect(view.spacing).toBeCloseTo(MIN_SPACING, 9);
    width = 1920;
    view.resize();
    expect(view.win).toEqual({ u0: 0, u1: 70 });
    expect(view.layout.windowed).toBe(false);
  });

  it("says what is under the pointer after a ctrl + wheel zoom, not what was", () => {
    const { view } = mount(chain(40));
    const at = view.nodeCentre("layers.10");
    if (at === null) throw new Error("layers.10 is not drawn");
    const where = { clientX: at.x + 9, clientY: at.y, bubbles: true };
    view.canvas.dispatchEvent(new MouseEvent("mousemove", where));
    expect(view.tooltip.lines[0]).toBe("layers.10");
    view.canvas.dispatchEvent(new WheelEvent("wheel", { ...where, deltaY: 100, ctrlKey: true }));
    const now = view.pickAt(at.x + 9, at.y);
    expect(now).not.toBeNull();
    if (now !== null) expect(view.tooltip.lines).toEqual(view.hoverLines(now));
    expect(view.tooltip.lines[0]).not.toBe("layers.10"); // more units shown: another's node
  });
});
