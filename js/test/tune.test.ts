// @vitest-environment jsdom
// The tune view on its canvas: its axes, where each configuration is drawn and what a
// pointer, a click, the keys and the knob table do; bound to a widget's model.
import { describe, expect, it } from "vitest";
import { formatBytes } from "../src/format";
import {
  byteTicks,
  frontierWindow,
  fullWindow,
  niceTicks,
  rateLabel,
  type TuneData,
  TuneView,
} from "../src/tune";
import { type TuneModel, tuneDefaults } from "../src/widget";
import { mount as mountWidget } from "./fake_model";
import { fakeCanvas, tuneData } from "./fixtures";

function mount(data: TuneData = tuneData()) {
  const el = document.createElement("div");
  document.body.appendChild(el);
  const selected: number[] = [];
  const view = new TuneView(el, data, { select: (i) => selected.push(i) });
  return { el, view, selected };
}

fakeCanvas();

const press = (view: TuneView, key: string): void => {
  view.canvas.dispatchEvent(new KeyboardEvent("keydown", { key }));
};

describe("the tune view's axes", () => {
  it("ticks at 1, 2 or 5 times a power of ten, bytes in their binary unit", () => {
    expect(niceTicks(0, 70000, 7)).toEqual([0, 10000, 20000, 30000, 40000, 50000, 60000, 70000]);
    expect(niceTicks(0, 1, 5)).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1]);
    expect(niceTicks(0, 1, 4)).toEqual([0, 0.5, 1]);
    const mib = 2 ** 20;
    expect(byteTicks(0, 3.5 * mib, 7)).toEqual(
      [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5].map((v) => v * mib),
    );
    expect(
      byteTicks(0, 3.5 * mib, 7)
        .map(formatBytes)
        .slice(1, 3),
    ).toEqual(["512 KiB", "1 MiB"]);
    expect(byteTicks(0, 80 * 2 ** 30, 4)).toEqual([0, 20, 40, 60, 80].map((v) => v * 2 ** 30));
    expect(rateLabel(60000, 10000)).toBe("60,000");
    expect(rateLabel(-0, 10000)).toBe("0");
    expect(rateLabel(0.5, 0.1)).toBe("0.5");
  });

  it("shows every point and the capacity line, or names a far-off line at the edge", () => {
    const d = tuneData();
    const cap = d.capacity?.bytes ?? 0;
    const win = fullWindow(d);
    expect(win.x0).toBe(0);
    expect(win.x1).toBeCloseTo(Math.max(cap, ...d.points.x) * 1.06, 3);
    expect(win.y1).toBeCloseTo(Math.max(...d.points.y) * 1.1, 3);
    const far = { ...d, capacity: { bytes: 80 * 2 ** 30, label: "H100: 78.5 GiB usable" } };
    expect(fullWindow(far).x1).toBeCloseTo(Math.max(...d.points.x) * 1.06, 3);
    const near = frontierWindow(d);
    for (const k of d.frontier) {
      expect(d.points.x[k]).toBeGreaterThanOrEqual(near.x0);
      expect(d.points.x[k]).toBeLessThanOrEqual(near.x1);
    }
  });
});

describe("the tune view", () => {
  it("says what the tuning found, with a legend and the knob table", () => {
    const d = tuneData();
    const { el } = mount(d);
    expect(el.querySelector(".fv-title")?.textContent).toBe(d.title);
    expect(el.querySelector(".fv-tune-headline")?.textContent).toBe(d.summary[1]);
    expect(el.querySelector(".fv-tune-text")?.textContent).toBe(d.summary.join("\n"));
    const legend = el.querySelector(".fv-legend")?.textContent ?? "";
    for (const t of ["fits", "does not fit", "frontier", "best", "as given", "capacity"])
      expect(legend).toContain(t);
    const rows = [...el.querySelectorAll(".fv-tune-table tbody tr")];
    expect(rows.map((r) => r.children[0].textContent)).toEqual(d.knobs.map((k) => k.name));
    expect(rows.map((r) => r.children[1].textContent)).toEqual(d.knobs.map((k) => k.value));
    expect(rows.map((r) => r.children[2].textContent)).toEqual(d.knobs.map((k) => k.user));
    const alts = [...el.querySelectorAll<HTMLButtonElement>(".fv-tune-alt")];
    expect(alts.map((b) => b.textContent)).toEqual(
      d.knobs.filter((k) => k.alternative !== null).map((k) => k.alternative),
    );
    const differs = [...el.querySelectorAll(".fv-differs")].map((td) => td.textContent);
    expect(differs).toEqual(d.knobs.filter((k) => k.user !== k.value).map((k) => k.user));
  });

  it("answers a hover at every point with its lines, and a click selects it", () => {
    const d = tuneData();
    const { view, selected } = mount(d);
    d.points.index.forEach((index, k) => {
      const c = view.pointCentre(index);
      expect(c).not.toBeNull();
      if (c === null) return;
      expect(view.pickAt(c.x + 2, c.y - 2)).toBe(k);
      view.hoverAt(c.x, c.y);
      expect(view.tooltip.lines.slice(0, d.points.hover[k].length)).toEqual(d.points.hover[k]);
      expect(view.tooltip.lines.at(-1)).toBe("click: open its plan");
      view.clickAt(c.x, c.y);
      expect(selected.at(-1)).toBe(index);
      expect(view.root.dataset.fvSelected).toBe(String(index));
      expect(view.statusEl.textContent).toContain(d.points.hover[k][1]);
    });
    view.clickAt(1, 1); // nothing there
    expect(selected.length).toBe(d.points.index.length);
    view.leave();
    expect(view.tooltip.shown).toBe(false);
  });

  it("places the points as the data says: more memory right, more tokens/s up", () => {
    const d = tuneData();
    const { view } = mount(d);
    const at = d.points.index.map((i) => view.pointCentre(i));
    for (let a = 0; a < at.length; a++)
      for (let b = 0; b < at.length; b++) {
        const pa = at[a];
        const pb = at[b];
        if (pa === null || pb === null) continue;
        if (d.points.x[a] < d.points.x[b]) expect(pa.x).toBeLessThan(pb.x);
        if (d.points.y[a] > d.points.y[b]) expect(pa.y).toBeLessThan(pb.y);
      }
    const cap = view.capacityX();
    expect(cap).not.toBeNull();
    d.points.index.forEach((i, k) => {
      const c = view.pointCentre(i);
      if (c !== null && cap !== null) expect(c.x <= cap + 1e-9).toBe(d.points.fits[k]);
    });
  });

  it("walks the frontier with ← →, every point by tokens/s with ↑ ↓; Enter selects", () => {
    const d = tuneData();
    const { view, selected } = mount(d);
    press(view, "Home");
    expect(view.focus).toBe(d.best);
    const walked: number[] = [];
    press(view, "ArrowLeft");
    for (let i = 0; i < d.frontier.length + 1; i++) {
      walked.push(view.focus);
      press(view, "ArrowRight");
    }
    const from = d.frontier.indexOf(d.best ?? -1);
    expect(walked[0]).toBe(d.frontier[Math.max(from - 1, 0)]);
    expect(walked.at(-1)).toBe(d.frontier.at(-1));
    expect(view.tooltip.lines[0]).toBe(d.points.hover[d.frontier.at(-1) ?? 0][0]);
    press(view, "Enter");
    expect(selected).toEqual([d.points.index[d.frontier.at(-1) ?? 0]]);
    const fastest = d.points.y.indexOf(Math.max(...d.points.y));
    for (let i = 0; i < d.points.y.length; i++) press(view, "ArrowUp");
    expect(view.focus).toBe(fastest);
    press(view, "ArrowDown");
    expect(d.points.y[view.focus]).toBeLessThanOrEqual(d.points.y[fastest]);
    press(view, "Escape");
    expect(view.focus).toBe(-1);
  });

  it("zooms with + and − and the buttons, and shows all again with 0", () => {
    const d = tuneData();
    const { view, el } = mount(d);
    const all = { ...view.win };
    press(view, "+");
    expect(view.win.x1 - view.win.x0).toBeCloseTo((all.x1 - all.x0) / 2, 3);
    press(view, "0");
    expect(view.win).toEqual(all);
    [...el.querySelectorAll<HTMLButtonElement>(".fv-zoom button")]
      .find((b) => b.textContent === "frontier")
      ?.click();
    expect(view.win).toEqual(frontierWindow(d));
  });

  it("opens an alternative from the knob table and outlines its row", () => {
    const d = tuneData();
    const { el, view, selected } = mount(d);
    const row = d.knobs.find((k) => k.candidate !== null);
    if (row === undefined || row.candidate === null) throw new Error("no alternative");
    const b = el.querySelector<HTMLButtonElement>(`tr[data-knob="${row.knob}"] .fv-tune-alt`);
    b?.click();
    expect(selected).toEqual([d.points.index[row.candidate]]);
    expect(el.querySelector(`tr[data-knob="${row.knob}"]`)?.classList.contains("fv-current")).toBe(
      true,
    );
    expect(view.selected).toBe(row.candidate);
  });

  it("says where a plan is not saved", () => {
    const d = tuneData();
    const { view } = mount(d);
    view.setSaved([d.points.index[d.best ?? 0]]);
    const k = d.user;
    const c = view.pointCentre(d.points.index[k]);
    if (c === null) throw new Error("the given is not drawn");
    view.hoverAt(c.x, c.y);
    expect(view.tooltip.lines.at(-1)).toBe("click: select it (its plan is not saved here)");
    view.setSelected(d.points.index[k]);
    expect(view.statusEl.textContent).toContain("(its plan is not saved here)");
  });
});

describe("the tune widget", () => {
  it("is drawn for view 'tune' with the model's selection, kept when its data changes", () => {
    const d = tuneData();
    const { model, el } = mountWidget<TuneModel>({
      ...tuneDefaults(d),
      selected: d.points.index[d.user],
    });
    const root = el.querySelector(".fsdpviz-tune") as unknown as { fsdpviz: TuneView };
    const view = root.fsdpviz;
    expect(view.selected).toBe(d.user);
    model.fromPython("data", tuneData());
    expect(view.selected).toBe(d.user);
  });
});
