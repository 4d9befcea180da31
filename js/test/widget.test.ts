// @vitest-environment jsdom
// The anywidget front end in a DOM: controls step the view and sync `step`, Python's
// `step` moves the view, a click on an event sets `selected_unit`.

import { beforeEach, describe, expect, it, vi } from "vitest";
import type { ExplorerWidgetView } from "../src/explorer_widget";
import { formatBytes, formatSeconds } from "../src/format";
import type { PrefetchView } from "../src/prefetch";
import { THEMES } from "../src/theme";
import { cursorX, eventDetails, FREE, fullRange, momentAt } from "../src/timeline_data";
import { capacityY, markColor } from "../src/timeline_draw";
import { firstSpan, type TimelineView } from "../src/timeline_view";
import {
  explorerDefaults,
  prefetchDefaults,
  type TimelineModel,
  timelineDefaults,
} from "../src/widget";
import { mount } from "./fake_model";
import { byIndex, explorerData, fakeCanvas, predicted, prefetchData, recorded } from "./fixtures";

function setup(data = byIndex()) {
  return mount<TimelineModel>({ ...timelineDefaults(data) });
}

const buttonTitled = (el: HTMLElement, title: string): HTMLButtonElement => {
  const b = [...el.querySelectorAll("button")].find((x) => x.title.startsWith(title));
  if (!b) throw new Error(`no button ${title}`);
  return b;
};

fakeCanvas(true);

beforeEach(() => {
  vi.spyOn(HTMLCanvasElement.prototype, "getBoundingClientRect").mockReturnValue(
    new DOMRect(0, 0, 1000, 400),
  );
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

  it("reads its data from the binary buffer Python sends, as from plain JSON", () => {
    const data = predicted();
    const bytes = new TextEncoder().encode(JSON.stringify(data));
    const { el } = mount<TimelineModel>({
      ...timelineDefaults(data),
      data: new DataView(bytes.buffer) as unknown as TimelineModel["data"],
    });
    expect(viewOf(el).data.n_steps).toBe(data.n_steps);
    expect(el.querySelector(".fv-info")?.textContent).toMatch(/^step 0 of 18 · /);
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

  it("says what is under the pointer after a ctrl + wheel zoom, not what was", () => {
    const data = predicted();
    const { el } = setup(data);
    const view = viewOf(el);
    view.zoom(Number.POSITIVE_INFINITY);
    const c = view.markCentre(8);
    if (c === null) throw new Error("step 8 is not drawn");
    const canvas = el.querySelector("canvas") as HTMLCanvasElement;
    const where = { clientX: c.x, clientY: c.y, bubbles: true };
    canvas.dispatchEvent(new MouseEvent("mousemove", where));
    const before = view.tooltip.lines;
    expect(before[0]).toContain("all_gather unit 2 'blocks.1'");
    canvas.dispatchEvent(new WheelEvent("wheel", { ...where, deltaY: -100, shiftKey: true }));
    canvas.dispatchEvent(new WheelEvent("wheel", { ...where, deltaY: -100, shiftKey: true }));
    const now = view.pickAt(c.x, c.y);
    if (now === null) expect(view.tooltip.shown).toBe(false);
    else expect(view.tooltip.lines).toEqual(view.hoverLines(now));
    expect(view.tooltip.lines).not.toEqual(before);
  });

  it("shows one whole iteration first, however many events it has, up to a thousand", () => {
    const data = predicted();
    const full = fullRange(data);
    expect(firstSpan(data, full)).toBe(full.x1 - full.x0);
    const { el } = setup(data);
    const win = viewOf(el).win;
    expect([win.x0, win.x1]).toEqual([full.x0, full.x1]);
    // two iterations shown (all of them): the first, whole
    const two = { ...data, iteration_starts: [[full.x0, full.x0 + 0.4 * (full.x1 - full.x0)]] };
    expect(firstSpan(two, full)).toBeCloseTo(0.4 * (full.x1 - full.x0), 12);
    // a huge iteration: a part of it, 500 steps' worth
    const many = { ...data, steps: { ...data.steps, iteration: new Array(2000).fill(1) } };
    expect(firstSpan({ ...many, n_steps: 2000 }, full)).toBeCloseTo((full.x1 - full.x0) / 4, 12);
  });

  it("shows Python's note after the step", () => {
    const { model, el } = setup();
    model.fromPython("note", "the event at the old step is not in this plan: back to step 0");
    expect(el.querySelector(".fv-info")?.textContent).toContain("back to step 0");
  });

  it("reads the page's theme itself, and cleans up its listeners", () => {
    document.body.dataset.jpThemeLight = "false";
    const { el, model, cleanup } = setup();
    const view = viewOf(el);
    expect(view.theme.name).toBe("dark");
    expect(view.root.style.getPropertyValue("--fv-accent")).toBe("#FF8C42");
    expect("theme" in model.state).toBe(false); // nothing sent to Python and back
    expect(model.listeners()).toBeGreaterThan(0);
    cleanup();
    expect(model.listeners()).toBe(0);
    delete document.body.dataset.jpThemeLight;
  });

  it("hides the old plan while Python re-plans, and shows the new one with its data", () => {
    const { model, el } = setup(predicted());
    const root = el.querySelector(".fsdpviz-timeline") as HTMLElement;
    model.fromPython("busy", true);
    expect(root.classList.contains("fv-busy")).toBe(true);
    model.fromPython("data", byIndex());
    model.fromPython("busy", false);
    expect(root.classList.contains("fv-busy")).toBe(false);
    expect(el.querySelector(".fv-info")?.textContent).toMatch(/^step 0 of 18 · /);
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

  it("peak: the cursor on the ▼ moment, the readout giving the peak's bytes", () => {
    const data = predicted();
    const { el } = setup(data);
    const view = viewOf(el);
    const peak = data.memory[0].peak;
    view.player.goTo(0);
    buttonTitled(el, "jump to the memory peak").click();
    expect(view.player.step).toBe(peak.step);
    expect(view.cursor()).toBe(peak.x);
    const info = el.querySelector(".fv-info")?.textContent ?? "";
    expect(info).toContain(`memory ${formatBytes(peak.bytes)} ▼ peak`);
    // the next step leaves the peak: the cursor goes back to that event's own start
    buttonTitled(el, "step forward").click();
    expect(view.pinned).toBeNull();
    expect(view.cursor()).toBe(cursorX(data, view.player.step));
  });

  it("in either order, the cursor stands on the current event's own mark", () => {
    const data = predicted();
    const { el } = setup(data);
    const view = viewOf(el);
    for (const order of ["issue", "stream"] as const) {
      view.setOrder(order);
      for (let s = 0; s < data.n_steps; s++) {
        view.player.goTo(s);
        const c = view.markCentre(s);
        if (c === null) throw new Error(`step ${s} is not drawn`);
        expect(Math.abs(view.cursorPx() - (c.x - c.w / 2))).toBeLessThan(0.01);
        const own = data.steps.kind[s] === FREE ? data.steps.issue[s] : data.steps.x0[s];
        expect(view.cursor()).toBe(own);
      }
    }
  });

  it("the readout says which moment its memory is read at: the peak's, or the event's", () => {
    const data = predicted();
    const { el } = setup(data);
    const view = viewOf(el);
    const mem = data.memory[0];
    const peak = mem.peak;
    const info = (): string => el.querySelector(".fv-info")?.textContent ?? "";
    buttonTitled(el, "jump to the memory peak").click();
    expect(info()).toContain(`memory ${formatBytes(peak.bytes)} ▼ peak ${mem.where[peak.moment]}`);
    expect(mem.where[peak.moment]).toBe(peak.where);
    // the same step reached with the step buttons: the event's own moment, said as such
    buttonTitled(el, "step forward").click();
    buttonTitled(el, "step back").click();
    expect(view.player.step).toBe(peak.step);
    const k = momentAt(mem, view.cursor());
    expect(k).not.toBe(peak.moment);
    expect(info()).toContain(`memory ${formatBytes(mem.total[k])} ${mem.where[k]}`);
    expect(mem.where[k]).not.toBe(mem.where[peak.moment]);
  });

  it("keys step the view where its own buttons have the focus, and stay out of the notebook", () => {
    const { el } = setup();
    const view = viewOf(el);
    const seen: string[] = [];
    const notebook = (ev: KeyboardEvent): void => {
      seen.push(ev.key);
    };
    document.addEventListener("keydown", notebook);
    const play = buttonTitled(el, "play / pause");
    play.focus();
    play.dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowRight", bubbles: true }));
    play.dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowRight", bubbles: true }));
    expect(view.player.step).toBe(2);
    buttonTitled(el, "step back").dispatchEvent(
      new KeyboardEvent("keydown", { key: "End", bubbles: true }),
    );
    expect(view.player.step).toBe(view.data.n_steps - 1);
    // space still presses the focused button (not the notebook's either)
    const space = new KeyboardEvent("keydown", { key: " ", bubbles: true, cancelable: true });
    play.dispatchEvent(space);
    expect(space.defaultPrevented).toBe(false);
    const slider = el.querySelector(".fv-slider") as HTMLInputElement;
    slider.dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowLeft", bubbles: true }));
    document.removeEventListener("keydown", notebook);
    expect(seen).toEqual([]);
  });

  it("keeps the memory lane's labels apart: the peak's never covers the capacity's", () => {
    // the peak just over a machine's usable memory, near the right end: where both labels
    // would be drawn at the same place
    const data = predicted();
    const mem = data.memory[0];
    const peak = mem.peak.bytes;
    Object.assign(mem.capacity as object, {
      usable: Math.round(peak * 0.97),
      reserved: Math.round(peak * 1.0),
      fits: false,
      label: "small GPU: 1 GiB usable",
    });
    let width = 700;
    vi.spyOn(HTMLElement.prototype, "clientWidth", "get").mockImplementation(() => width);
    const { el } = setup(data);
    const view = viewOf(el);
    for (const [w, at] of [
      [700, 0.5],
      [968, 0.98],
      [1400, 0.02],
      [968, 0.5],
    ]) {
      width = w;
      view.resize();
      const full = view.index.full;
      const span = (full.x1 - full.x0) / 4; // the peak at `at` of the window's width
      view.showRange(mem.peak.x - at * span, mem.peak.x + (1 - at) * span);
      const labels = view.labels;
      expect(labels.map((b) => b.text.split(" ")[0]).sort()).toEqual(["peak", "reserved", "small"]);
      for (const a of labels)
        for (const b of labels) {
          if (a === b) continue;
          const apart =
            a.x + a.w <= b.x || b.x + b.w <= a.x || a.y + a.h <= b.y || b.y + b.h <= a.y;
          expect(apart, `${a.text} and ${b.text}`).toBe(true);
        }
    }
    expect(JSON.parse(view.root.dataset.fvLabels ?? "[]")).toEqual(view.labels);
  });

  it("the readout's memory is the curve's under the cursor", () => {
    const data = predicted();
    const { el } = setup(data);
    const view = viewOf(el);
    const mem = data.memory[0];
    for (let s = 0; s < data.n_steps; s++) {
      view.player.goTo(s);
      const k = momentAt(mem, view.cursor());
      if (k < 0) continue;
      const info = el.querySelector(".fv-info")?.textContent ?? "";
      expect(info).toContain(`memory ${formatBytes(mem.total[k])}`);
    }
  });

  it("ranks the waits in a table beside the timeline; a click on a row selects that event", async () => {
    const data = predicted();
    const { model, el } = setup(data);
    const view = viewOf(el);
    const waits = data.groups[0].bottlenecks ?? [];
    expect(waits.length).toBeGreaterThan(0);
    const rows = [...el.querySelectorAll<HTMLTableRowElement>(".fv-bottleneck-table tbody tr")];
    expect(rows.map((r) => Number(r.dataset.fvStep))).toEqual(waits.map((b) => b.step));
    const exposed = waits.map((b) => b.exposed);
    expect(exposed).toEqual([...exposed].sort((a, b) => b - a));
    const total = waits.reduce((a, b) => a + b.exposed, 0);
    expect(total).toBeCloseTo(data.groups[0].exposed?.total ?? -1, 12);
    expect(rows[0].textContent).toContain(formatSeconds(waits[0].exposed));
    expect(rows[0].textContent).toContain(waits[0].reason);
    const target = rows.at(-1) as HTMLTableRowElement;
    target.click();
    const step = Number(target.dataset.fvStep);
    expect(view.player.step).toBe(step);
    expect(view.cursor()).toBe(cursorX(data, step));
    expect(target.classList.contains("fv-current")).toBe(true);
    expect(el.querySelector(".fv-info")?.textContent).toMatch(new RegExp(`^step ${step} of`));
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(model.state.step).toBe(step);
  });

  it("draws the machine's usable memory as a line; a plan over it says it does not fit", () => {
    const data = predicted();
    const cap = data.memory[0].capacity;
    if (!cap) throw new Error("no capacity in the prediction's data");
    expect(cap.label).toMatch(/^H100 SXM 80GB: .* usable$/);
    const { el } = setup(data);
    const fits = el.querySelector(".fv-fit") as HTMLElement;
    expect(fits.dataset.fvFits).toBe("true");
    expect(fits.textContent).toBe(`✓ ${cap.text}`);
    // the same plan on a device smaller than its peak
    const small = predicted();
    const peak = small.memory[0].peak.bytes;
    Object.assign(small.memory[0].capacity as object, {
      usable: Math.round(peak * 0.6),
      headroom: Math.round(peak * 0.6) - cap.needed,
      fits: false,
      label: "small GPU: 1 GiB usable",
      text: "does not fit in small GPU: needs more",
    });
    document.body.innerHTML = "";
    const other = setup(small);
    const view = viewOf(other.el);
    const header = other.el.querySelector(".fv-fit") as HTMLElement;
    expect(header.classList.contains("fv-no-fit")).toBe(true);
    expect(header.textContent).toContain("does not fit");
    const line = capacityY(view.scene(), 0);
    const row = view.layout.rows[small.memory[0].lane];
    const plotH = row.h - 18;
    const peakY = row.top + 16 + plotH - (peak / view.index.memoryTop) * plotH;
    expect(line).not.toBeNull();
    expect(peakY).toBeLessThan(line?.usable ?? 0); // the peak is above the line
    const legend = other.el.querySelector(".fv-legend")?.textContent ?? "";
    expect(legend).toContain("usable device memory");
  });

  it("draws a stuck collective apart from a divergent one: its own colour, a legend entry each", () => {
    const data = recorded();
    expect(data.marks.every((m) => m.kind === "diverge")).toBe(true);
    data.marks[1] = { ...data.marks[1], kind: "stuck", text: "where this rank stopped" };
    const { el } = setup(data);
    const entries = [...el.querySelectorAll<HTMLElement>(".fv-legend [data-fv-legend]")];
    const kinds = entries.map((e) => e.dataset.fvLegend);
    expect(kinds).toContain("fv-flag");
    expect(kinds).toContain("fv-stuck");
    const stuck = entries.find((e) => e.dataset.fvLegend === "fv-stuck");
    expect(stuck?.textContent).toBe("where this rank stopped");
    expect(markColor(THEMES.light, "stuck")).toBe(THEMES.light.stuck);
    expect(markColor(THEMES.dark, "stuck")).not.toBe(markColor(THEMES.dark, "diverge"));
    const lines = eventDetails(data, data.marks[1].step).join("\n");
    expect(lines).toContain("⏸ where this rank stopped");
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

const explorerBox = (el: HTMLElement): ExplorerWidgetView =>
  (el.querySelector(".fsdpviz-explorer-box") as unknown as { fsdpviz: ExplorerWidgetView }).fsdpviz;

/** The centre of module `name`'s block in the explorer's canvas. */
function blockAt(box: ExplorerWidgetView, name: string): [number, number] {
  const slot = box.view.slotOf(box.view.index.byName.get(name) ?? -1);
  if (slot === null) throw new Error(`${name} is not drawn`);
  return [slot.x + slot.w / 2, slot.y + slot.h / 2];
}

describe("explorer widget", () => {
  it("draws the model's view and tells Python what a click selects", () => {
    const { model, el } = mount({ ...explorerDefaults(explorerData()) });
    const box = explorerBox(el);
    box.view.clickAt(...blockAt(box, "blocks.1"));
    expect(model.state.selected_unit).toBe("blocks.1");
    expect(model.state.selected_module).toBe("blocks.1");
    expect(model.state.focus).toBe("blocks.1"); // it zoomed into the block
    expect(model.saved.at(-1)).toEqual({ selected_unit: "blocks.1", selected_module: "blocks.1" });
    expect(box.panel.text).toContain("unit 2 of 4: 'blocks.1' (Block)");
  });

  it("follows Python: the current unit, a unit selected elsewhere, the focus and the width", () => {
    const { model, el } = mount({ ...explorerDefaults(explorerData()) });
    const box = explorerBox(el);
    model.fromPython("current_unit", "blocks.0");
    expect(box.view.root.dataset.fvCurrentUnit).toBe("blocks.0");
    model.fromPython("selected_unit", "blocks.2");
    expect(box.view.root.dataset.fvSelectedUnit).toBe("blocks.2");
    expect(box.panel.text).toContain("'blocks.2'");
    model.fromPython("focus", "blocks.0");
    expect(box.view.data.modules.name[box.view.focus]).toBe("blocks.0");
    model.fromPython("area", "rank_bytes");
    expect(box.view.areaSelect.value).toBe("rank_bytes");
    model.fromPython("busy", true);
    expect(box.root.classList.contains("fv-busy")).toBe(true);
  });

  it("shows a unit's details as they come: the selected one's with a re-plan, then all", () => {
    const data = explorerData();
    const all = data.details ?? [];
    const { model, el } = mount({
      ...explorerDefaults(data),
      details: all.map((d, k) => (k === 2 ? d : null)),
      selected_unit: "blocks.0",
    });
    const box = explorerBox(el);
    expect(box.panel.text).toBe("'blocks.0': its details are on their way…");
    model.fromPython("selected_unit", "blocks.1");
    expect(box.panel.text).toContain("unit 2 of 4: 'blocks.1' (Block)");
    model.fromPython("selected_unit", "blocks.0");
    model.fromPython("details", all);
    expect(box.panel.text).toContain("unit 1 of 4: 'blocks.0' (Block)");
  });

  it("puts its panel beside the icicle in a wide output and over it in a narrow one", () => {
    let width = 1200;
    vi.spyOn(HTMLElement.prototype, "clientWidth", "get").mockImplementation(() => width);
    const wide = explorerBox(mount({ ...explorerDefaults(explorerData()) }).el);
    expect(wide.root.classList.contains("fv-beside")).toBe(true);
    expect(wide.panel.el.hidden).toBe(false); // its hint, before anything is selected
    width = 700;
    const { model, el } = mount({ ...explorerDefaults(explorerData()) });
    const narrow = explorerBox(el);
    expect(narrow.root.classList.contains("fv-beside")).toBe(false);
    expect(narrow.panel.el.hidden).toBe(true); // nothing to show over the icicle yet
    model.fromPython("selected_unit", "blocks.1");
    expect(narrow.panel.el.hidden).toBe(false);
    expect(narrow.panel.el.classList.contains("fv-detail-over")).toBe(true);
    (narrow.panel.el.querySelector(".fv-detail-close") as HTMLButtonElement).click();
    expect(narrow.panel.el.hidden).toBe(true);
  });
});

describe("prefetch widget", () => {
  it("draws the model's graph and rings Python's current unit", () => {
    const { model, el } = mount({ ...prefetchDefaults(prefetchData()) });
    const view = (el.querySelector(".fsdpviz-prefetch") as unknown as { fsdpviz: PrefetchView })
      .fsdpviz;
    model.fromPython("current_unit", "blocks.1");
    expect(view.root.dataset.fvCurrentUnit).toBe("blocks.1");
  });
});
