// Drawing and picking without a browser: the marks the layer draws are what a click picks.
import { describe, expect, it } from "vitest";
import { formatBytes, formatSeconds } from "../src/format";
import { THEMES } from "../src/theme";
import { fullRange, stepWorkDetails, type TimelineData, type Window } from "../src/timeline_data";
import {
  computeLayout,
  drawLayer,
  flowSteps,
  Index,
  MARK,
  MarkList,
  type Scene,
} from "../src/timeline_draw";
import { byIndex, fakeContext, predicted, recorded } from "./fixtures";

function scene(data: TimelineData, win?: Window, width = 1000): Scene {
  const index = new Index(data);
  return {
    data,
    index,
    layout: computeLayout(data, width),
    win: win ?? index.full,
    theme: THEMES.light,
    selectedUnit: -1,
  };
}

/** Draw `sc` and return its marks. */
function draw(sc: Scene): MarkList {
  const marks = new MarkList();
  drawLayer(fakeContext(), sc, marks);
  return marks;
}

/** The centre of step's own mark (in its own lane) as drawn in `sc`, or null. */
function centre(
  sc: Scene,
  marks: MarkList,
  step: number,
): { x: number; y: number; w: number } | null {
  const row = sc.layout.rows[sc.data.steps.lane[step]];
  const m = marks.of(step, MARK.event).find((k) => k.y >= row.top - 1 && k.y < row.top + row.h);
  return m === undefined ? null : { x: m.x + m.w / 2, y: m.y + m.h / 2, w: m.w };
}

describe("index", () => {
  it("finds calls, lanes and the memory lane's top", () => {
    const data = predicted();
    const ix = new Index(data);
    expect(ix.callRange).toEqual([[0, data.calls.x.length]]);
    for (const [lane, entry] of ix.laneSteps) {
      expect(data.lanes[lane].kind).toBe("stream");
      expect(entry.x0).toEqual([...entry.x0].sort((a, b) => a - b));
    }
    expect(ix.memoryMax[0]).toBe(data.memory[0].peak.bytes);
    expect(ix.full).toEqual(fullRange(data));
  });

  it("packs hook calls issued at the same time side by side", () => {
    const data = predicted();
    const sc = scene(data);
    draw(sc);
    // steps 2 and 3: a free and an all-gather issued by two hooks (a post-forward and the
    // next pre-forward) that the CPU ran at the same modelled time
    expect(data.steps.call[2]).not.toBe(data.steps.call[3]);
    expect(data.steps.issue[2]).toBeCloseTo(data.steps.issue[3], 9);
    const [x2, w2] = sc.index.cell(2, sc.win, sc.layout);
    const [x3] = sc.index.cell(3, sc.win, sc.layout);
    expect(w2).toBeGreaterThanOrEqual(6);
    expect(x3).toBeGreaterThanOrEqual(x2 + w2);
  });
});

describe("marks", () => {
  it("picks the topmost mark under the pointer, else the nearest in its row", () => {
    const marks = new MarkList();
    marks.add(MARK.event, 1, 10, 0, 20, 10);
    marks.add(MARK.event, 2, 15, 0, 4, 10);
    expect(marks.pick(16, 5)?.step).toBe(2);
    expect(marks.pick(12, 5)?.step).toBe(1);
    expect(marks.pick(32, 5)?.step).toBe(1); // 2 px off its right edge
    expect(marks.pick(40, 5)).toBeNull();
    expect(marks.pick(12, 20)).toBeNull();
    for (let k = 0; k < 3000; k++) marks.add(MARK.event, k, k, 30, 1, 10);
    expect(marks.pick(2500.5, 35)?.step).toBe(2500);
  });

  for (const [name, make] of [
    ["a prediction placed by the time model", predicted],
    ["a prediction by index", byIndex],
    ["a recording of two ranks", recorded],
  ] as const) {
    it(`a click at the centre of every event of ${name} picks exactly that event`, () => {
      const data = make();
      const full = new Index(data).full;
      for (let step = 0; step < data.n_steps; step++) {
        // zoomed out until the event's own mark is at least 4 px wide and on top
        let span = full.x1 - full.x0;
        let ok = false;
        for (let zoom = 0; zoom < 12 && !ok; zoom++, span /= 2) {
          const s = data.steps;
          const mid = s.kind[step] === 1 ? s.issue[step] : (s.x0[step] + s.x1[step]) / 2;
          const x0 = Math.max(full.x0, Math.min(mid - span / 2, full.x1 - span));
          const sc = scene(data, { x0, x1: x0 + span });
          const marks = draw(sc);
          const c = centre(sc, marks, step);
          if (c === null || c.w < 4) continue;
          const picked = marks.pick(c.x, c.y);
          ok = picked !== null && picked.kind === MARK.event && picked.step === step;
        }
        expect(ok, `step ${step} of ${name}`).toBe(true);
      }
    });
  }

  it("marks the memory peak where the lane draws it, picking the peak's step", () => {
    const data = predicted();
    const sc = scene(data);
    const marks = draw(sc);
    const peak = marks.of(data.memory[0].peak.step, MARK.peak);
    expect(peak).toHaveLength(1);
    const p = marks.pick(peak[0].x + peak[0].w / 2, peak[0].y + peak[0].h / 2);
    expect(p?.kind).toBe(MARK.peak);
    expect(p?.moment).toBe(data.memory[0].peak.moment);
  });

  it("draws the flows of the current and the hovered event and their neighbours only", () => {
    const data = predicted();
    const sc = scene(data);
    const st = data.steps;
    const near = (s: number, at: number): boolean =>
      Math.abs(s - at) <= 1 || st.call[s] === st.call[at];
    const current = flowSteps(sc, 8, null);
    expect(current).toContain(8);
    expect(current.every((s) => near(s, 8) && st.kind[s] !== 1)).toBe(true); // no free
    expect(current.length).toBeLessThan(data.n_steps / 3);
    const both = flowSteps(sc, 8, 14);
    expect(both).toEqual(
      [...new Set([...current, ...flowSteps(sc, 14, null)])].sort((a, b) => a - b),
    );
    expect(flowSteps(sc, -1, null)).toEqual([]);
  });
});

describe("step work", () => {
  it("draws the optimizer step on the compute lane, after the last compute, to the step's end", () => {
    const data = predicted();
    const work = data.step_work;
    expect(work?.name).toEqual(["optimizer"]);
    if (!work) return;
    // it starts where the micro-step ends (its last compute or the last wait for it) and the
    // data's x range ends with it
    const ends = [...data.compute.x1, ...data.waits.x1, ...data.steps.x1];
    expect(work.x0[0]).toBeCloseTo(Math.max(...ends), 15);
    expect(fullRange(data).x1).toBe(work.x1[0]);
    const sc = scene(data);
    const marks = draw(sc);
    const drawn = marks.of(new Index(data).workStep[0], MARK.work);
    expect(drawn).toHaveLength(1);
    const compute = sc.layout.rows.find((r) => data.lanes[r.lane].kind === "compute");
    expect(drawn[0].y).toBe(compute?.top);
    const p = marks.pick(drawn[0].x + drawn[0].w / 2, drawn[0].y + drawn[0].h / 2);
    expect(p?.kind).toBe(MARK.work);
    expect(p?.moment).toBe(0);
  });

  it("says what the time model says of it", () => {
    const data = predicted();
    const lines = stepWorkDetails(data, 0);
    expect(lines[0]).toBe(data.step_work?.text[0]);
    const w = data.step_work;
    expect(lines[1]).toBe(
      `${formatSeconds((w?.x1[0] ?? 0) - (w?.x0[0] ?? 0))}, ${formatBytes(w?.bytes[0] ?? 0)} moved`,
    );
    expect(stepWorkDetails(byIndex(), 0)).toEqual([]);
  });
});
