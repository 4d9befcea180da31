import { describe, expect, it, vi } from "vitest";
import {
  axisTicks,
  byteTicks,
  exactBytes,
  formatBytes,
  formatSeconds,
  threeDigits,
} from "../src/format";
import { type FrameScheduler, Player, Throttle } from "../src/player";
import {
  clampStep,
  computeDetails,
  cursorX,
  describeStep,
  eventDetails,
  exposedText,
  FLOAT8_SCALES_LANE,
  FREE,
  follow,
  formatFlops,
  fullRange,
  lowerBound,
  memoryDetails,
  nearestStep,
  orderOf,
  tailPlace,
  upperBound,
  waitedFor,
} from "../src/timeline_data";
import { byIndex, predicted } from "./fixtures";

/** A scheduler the test drives by hand: frames happen when `tick` is called. */
function manualFrames(): FrameScheduler & { tick(now: number): void; running: boolean } {
  let cb: ((now: number) => void) | null = null;
  return {
    running: false,
    start(onFrame) {
      cb = onFrame;
      this.running = true;
    },
    stop() {
      cb = null;
      this.running = false;
    },
    tick(now) {
      cb?.(now);
    },
  };
}

describe("clampStep", () => {
  it("keeps steps inside [0, n)", () => {
    expect(clampStep(-3, 10)).toBe(0);
    expect(clampStep(42, 10)).toBe(9);
    expect(clampStep(4.6, 10)).toBe(5);
    expect(clampStep(Number.NaN, 10)).toBe(0);
    expect(clampStep(3, 0)).toBe(0);
  });
});

describe("Player", () => {
  it("steps forward and back, clamped, reporting each change once", () => {
    const onChange = vi.fn();
    const p = new Player({ n: 5, scheduler: manualFrames(), onChange });
    p.stepBy(1);
    p.stepBy(1);
    p.stepBy(-1);
    expect(p.step).toBe(1);
    p.stepBy(-5);
    expect(p.step).toBe(0);
    p.stepBy(-1); // already at 0: no change reported
    expect(onChange.mock.calls.map((c) => c[0])).toEqual([1, 2, 1, 0]);
    p.goTo(99);
    expect(p.step).toBe(4);
  });

  it("plays by elapsed time at `speed` steps per second and stops at the end", () => {
    const frames = manualFrames();
    const seen: Array<[number, boolean]> = [];
    const p = new Player({
      n: 50,
      speed: 10,
      scheduler: frames,
      onChange: (s, playing) => seen.push([s, playing]),
    });
    p.play();
    expect(frames.running).toBe(true);
    frames.tick(1000); // first frame only sets the clock
    frames.tick(1050); // 0.5 step: nothing yet
    expect(p.step).toBe(0);
    frames.tick(1100); // 1 step
    expect(p.step).toBe(1);
    frames.tick(1400); // 3 more
    expect(p.step).toBe(4);
    frames.tick(100_000); // far past the end
    expect(p.step).toBe(49);
    expect(p.playing).toBe(false);
    expect(frames.running).toBe(false);
    expect(seen.at(-1)).toEqual([49, false]);
  });

  it("pauses, resumes and restarts from 0 when played at the end", () => {
    const frames = manualFrames();
    const p = new Player({ n: 3, step: 2, speed: 1000, scheduler: frames, onChange: () => {} });
    p.toggle();
    expect(p.playing).toBe(true);
    expect(p.step).toBe(0);
    p.toggle();
    expect(p.playing).toBe(false);
    expect(frames.running).toBe(false);
    frames.tick(5000); // a stray frame after pause changes nothing
    expect(p.step).toBe(0);
  });

  it("walks a given order, and keeps the step when the order changes", () => {
    const seen: number[] = [];
    const order = [0, 2, 1, 3];
    const p = new Player({ n: 4, order, scheduler: manualFrames(), onChange: (s) => seen.push(s) });
    p.stepBy(1);
    p.stepBy(1);
    expect(seen).toEqual([2, 1]);
    expect(p.pos).toBe(2);
    p.setOrder(null);
    expect(p.step).toBe(1);
    expect(p.pos).toBe(1);
    p.end();
    expect(p.step).toBe(3);
    p.setOrder(order);
    p.first();
    expect(p.step).toBe(0);
  });

  it("plays along its order", () => {
    const frames = manualFrames();
    const p = new Player({
      n: 4,
      order: [3, 2, 1, 0],
      speed: 10,
      scheduler: frames,
      onChange: () => {},
    });
    expect(p.step).toBe(0);
    p.play(); // at the end of the order: starts over from its first step
    expect(p.step).toBe(3);
    frames.tick(0);
    frames.tick(200);
    expect(p.step).toBe(1);
  });

  it("keeps the step on new data when it still exists", () => {
    const p = new Player({ n: 100, step: 40, scheduler: manualFrames(), onChange: () => {} });
    p.reset(30, 40);
    expect(p.step).toBe(29);
    p.reset(300, 40);
    expect(p.step).toBe(40);
  });
});

describe("Throttle", () => {
  it("sends the first value at once, then the latest at most once per interval", () => {
    vi.useFakeTimers();
    let now = 0;
    const sent: number[] = [];
    const t = new Throttle<number>(
      100,
      (v) => sent.push(v),
      () => now,
    );
    t.push(1);
    t.push(2);
    t.push(3);
    expect(sent).toEqual([1]);
    now = 100;
    vi.advanceTimersByTime(100);
    expect(sent).toEqual([1, 3]);
    t.push(4);
    t.flush();
    expect(sent).toEqual([1, 3, 4]);
    t.flush(); // nothing pending
    expect(sent).toEqual([1, 3, 4]);
    vi.useRealTimers();
  });

  it("sends a handful of messages while playing 5,000 steps", () => {
    vi.useFakeTimers();
    let now = 0;
    const sent: number[] = [];
    const t = new Throttle<number>(
      150,
      (v) => sent.push(v),
      () => now,
    );
    const frames = manualFrames();
    const p = new Player({ n: 5000, speed: 500, scheduler: frames, onChange: (s) => t.push(s) });
    p.play();
    for (now = 0; now <= 11_000; now += 16) {
      frames.tick(now);
      vi.advanceTimersByTime(16);
    }
    t.flush();
    expect(p.step).toBe(4999);
    expect(sent.at(-1)).toBe(4999);
    expect(sent.length).toBeLessThan(11_000 / 150 + 5);
    vi.useRealTimers();
  });
});

describe("orders and windows", () => {
  it("walks the steps in issue order without going back in time, or by stream start", () => {
    const data = predicted();
    for (const order of ["issue", "stream"] as const) {
      const steps = orderOf(data, order);
      expect([...steps].sort((a, b) => a - b)).toEqual([...Array(data.n_steps).keys()]);
      // issue order: by when the hooks ran; stream order: by where each starts on its lane
      const xs = steps.map((s) => (order === "issue" ? data.steps.issue[s] : cursorX(data, s)));
      expect(xs).toEqual([...xs].sort((a, b) => a - b));
    }
    // in either order the cursor stands where the event starts on its own lane
    for (let s = 0; s < data.n_steps; s++) {
      const own = data.steps.kind[s] === FREE ? data.steps.issue[s] : data.steps.x0[s];
      expect(cursorX(data, s, "issue")).toBe(own);
      expect(cursorX(data, s, "stream")).toBe(own);
    }
    expect(orderOf(data, "stream")).toEqual(data.stream_order);
    expect(orderOf(data, "stream")).not.toEqual(orderOf(data, "issue"));
  });

  it("spans every mark of the run", () => {
    const data = predicted();
    const full = fullRange(data);
    expect(full.x0).toBe(0);
    expect(full.x1).toBeGreaterThanOrEqual(Math.max(...data.steps.x1));
    expect(fullRange(byIndex())).toEqual({ x0: 0, x1: byIndex().n_steps });
  });

  it("follows the cursor and stays inside the run", () => {
    const bounds = { x0: 0, x1: 100 };
    let win = follow({ x0: 0, x1: 0 }, 0, 20, bounds);
    expect(win).toEqual({ x0: 0, x1: 20 });
    win = follow(win, 10, 20, bounds); // inside the middle: unchanged
    expect(win).toEqual({ x0: 0, x1: 20 });
    win = follow(win, 19, 20, bounds); // near the edge: re-centred
    expect(win).toEqual({ x0: 9, x1: 29 });
    win = follow(win, 99, 20, bounds);
    expect(win).toEqual({ x0: 80, x1: 100 });
    expect(follow(win, 5, 500, bounds)).toEqual({ x0: 0, x1: 100 });
  });

  it("finds the nearest step to a point of the overview, in either order", () => {
    const data = byIndex();
    expect(nearestStep(data, 2.4)).toBe(2);
    expect(nearestStep(data, 2.6)).toBe(3);
    expect(nearestStep(data, 99)).toBe(data.n_steps - 1);
    const p = predicted();
    const s = p.stream_order[5];
    expect(nearestStep(p, cursorX(p, s), "stream")).toBe(s);
  });

  it("hovers a compute stretch with its start, duration, FLOPs and achieved rate", () => {
    const data = predicted();
    const c = data.compute;
    const k = c.unit.findIndex((_, j) => (c.flops?.[j] ?? -1) > 0);
    expect(k).toBeGreaterThanOrEqual(0);
    const lines = computeDetails(data, k).join("\n");
    expect(lines).toContain(
      `starts ${formatSeconds(c.x0[k])}, lasts ${formatSeconds(c.x1[k] - c.x0[k])}`,
    );
    expect(lines).toContain(formatFlops(c.flops?.[k] ?? 0));
    expect(lines).toContain(`achieved ${formatFlops(c.flops_per_s?.[k] ?? 0)}/s`);
    expect(formatFlops(1.5e12)).toBe("1.5 TFLOP");
    expect(formatFlops(2.345e9)).toBe("2.35 GFLOP");
  });

  it("says the step's end waited for the tail's reduce-scatter, never that compute did", () => {
    const data = predicted();
    const w = data.waits;
    const k = w.tail.indexOf(1);
    expect(k).toBeGreaterThanOrEqual(0);
    const i = w.step[k];
    const lines = eventDetails(data, i).join("\n");
    expect(lines).toContain(`the step's end waited ${formatSeconds(w.x1[k] - w.x0[k])} for it`);
    expect(lines).not.toContain("never waited");
    expect(lines).not.toContain("compute waited");
    const { compute, tail } = waitedFor(data, i);
    expect(compute + tail).toBeCloseTo(data.steps.exposed[i], 15);
  });

  it("says the float8 scales' all-reduce runs after the optimizer step, not the last compute", () => {
    const data = predicted();
    const k = data.waits.tail.indexOf(1);
    const i = data.waits.step[k];
    expect(tailPlace(data, i)).toBe("after the last compute");
    // the same step on the lane of precompute_float8_dynamic_scale_for_fsdp's all-reduce
    const lanes = data.lanes.map((l, j) =>
      j === data.steps.lane[i] ? { ...l, name: FLOAT8_SCALES_LANE } : l,
    );
    const scales = { ...data, lanes };
    const lines = eventDetails(scales, i).join("\n");
    expect(lines).toContain("(after the optimizer step, exposed)");
    expect(lines).not.toContain("after the last compute");
  });

  it("binary-searches sorted columns, in a range", () => {
    const xs = [0, 1, 1, 2, 5];
    expect(lowerBound(xs, 1)).toBe(1);
    expect(upperBound(xs, 1)).toBe(3);
    expect(lowerBound(xs, 9)).toBe(5);
    expect(lowerBound(xs, 1, 2, 4)).toBe(2);
  });
});

describe("text", () => {
  it("formats bytes in binary units, and exactly", () => {
    expect(formatBytes(512)).toBe("512 B");
    // as fsdpviz.views.style.format_bytes writes them (Python rounds a tie to even)
    const python: Array<[number, string]> = [
      [164352, "160 KiB"],
      [1048064, "1024 KiB"],
      [1023692.8, "1000 KiB"],
      [20608, "20.1 KiB"],
      [1053818.88, "1 MiB"],
      [172335562752, "160 GiB"],
      [2401.28, "2.35 KiB"],
      [102912, "100 KiB"],
    ];
    for (const [n, text] of python) expect(formatBytes(n)).toBe(text);
    // fsdpviz.views.style.three_digits, from the exact value of each number
    const digits: Array<[number, string]> = [
      [48.85, "48.9"],
      [160.5, "160"],
      [1023.5, "1024"],
      [999.5, "1000"],
      [999.4, "999"],
      [0.1235, "0.123"],
      [2.675, "2.67"],
      [100.05, "100"],
      [1.005, "1"],
      [12.25, "12.2"],
    ];
    for (const [v, text] of digits) expect(threeDigits(v)).toBe(text);
    expect(formatBytes(1536)).toBe("1.5 KiB");
    expect(formatBytes(3 * 2 ** 30)).toBe("3 GiB");
    expect(exactBytes(30999176)).toBe("30,999,176 bytes");
  });

  it("numbers steps from 0, as view.timeline.step, and names the root (root)", () => {
    const d = byIndex();
    expect(describeStep(d, 0)).toBe(
      "step 0 of 18 · all_gather unit 0 (root) · forward · pre_forward of (root) · event 0 of iteration 1",
    );
    expect(describeStep(d, 17)).toContain("step 17 of 18");
  });

  it("names the module of a tensor-parallel collective, and its unit", () => {
    const d = predicted();
    d.modules = ["blocks.1.fc1"];
    d.steps.module = d.steps.kind.map((_, i) => (i === 8 ? 0 : -1));
    expect(describeStep(d, 8)).toContain("'blocks.1.fc1' in unit 2 'blocks.1'");
    expect(eventDetails(d, 8)[0]).toContain("'blocks.1.fc1' in unit 2 'blocks.1'");
    expect(describeStep(d, 7)).not.toContain("blocks.1.fc1");
  });

  it("says when an event was issued and when it ran, and how long compute waited", () => {
    const d = predicted();
    const text = describeStep(d, 8);
    expect(text).toContain("all_gather unit 2 'blocks.1' (prefetch)");
    expect(text).toContain("pre_backward of 'blocks.2'");
    expect(text).toContain("issued at 48 µs, on all-gather 65 µs–78 µs");
    expect(text).not.toContain("compute waited"); // a prefetch the backward's compute hides
    // the first block's all-gather in forward is not prefetched: compute waits for it
    expect(describeStep(d, 1)).toMatch(/compute waited [\d.]+ µs for it/);
    expect(text).toMatch(/memory [\d.]+ KiB/);
    expect(describeStep(d, 8, "stream")).toContain("(stream-start order)");
  });

  it("details an event on hover: unit, kind, phase, bytes, issue, start, duration, hook, prefetch, wait", () => {
    const d = predicted();
    const lines = eventDetails(d, 8).join("\n");
    for (const part of [
      "all_gather unit 2 'blocks.1'",
      "backward",
      "issued by pre_backward of 'blocks.2'",
      "prefetch: issued ahead",
      "sends",
      "issued at 48 µs",
      "starts 65 µs on all-gather, lasts 13 µs",
    ])
      expect(lines).toContain(part);
    expect(eventDetails(d, 1).join("\n")).toContain("compute waited");
    expect(eventDetails(d, 9).join("\n")).not.toContain("starts"); // a free has no stream time
  });

  it("details a memory moment and says which is the peak", () => {
    const d = predicted();
    const mem = d.memory[0];
    const lines = memoryDetails(d, mem, mem.peak.moment);
    expect(lines[0]).toBe("▼ the peak of this iteration");
    expect(lines[1]).toContain(exactBytes(mem.peak.bytes));
    expect(lines).toContain(mem.peak.where);
    expect(lines.at(-1)).toContain(`click: step ${mem.peak.step}`);
  });

  it("sums exposed communication by phase", () => {
    const g = predicted().groups[0];
    expect(exposedText(g)).toMatch(
      /^exposed communication: forward [\d.]+ µs, backward [\d.]+ µs \([\d.]+ µs of a [\d.]+ µs step\)$/,
    );
  });

  it("writes durations in the unit that suits them", () => {
    expect(formatSeconds(0)).toBe("0 s");
    expect(formatSeconds(0.000343)).toBe("343 µs");
    expect(formatSeconds(0.0123456)).toBe("12.3 ms");
    expect(formatSeconds(1.5)).toBe("1.5 s");
    expect(formatSeconds(4.2e-8)).toBe("42 ns");
    expect(formatSeconds(999.7e-6)).toBe("1 ms"); // as duration_text: not "1000 µs"
    expect(formatSeconds(48.85e-6)).toBe("48.9 µs");
  });
});

describe("byte ticks", () => {
  it("ticks 0 to the maximum in round binary amounts", () => {
    expect(byteTicks(3 * 2 ** 20, 100)).toEqual([0, 2 ** 20, 2 * 2 ** 20, 3 * 2 ** 20]);
    expect(byteTicks(0, 100)).toEqual([0]);
    const t = byteTicks(30999176, 98);
    expect(t[0]).toBe(0);
    expect(t.length).toBeLessThanOrEqual(5);
    expect(t.at(-1)).toBeLessThanOrEqual(30999176);
  });
});

describe("axis ticks", () => {
  it("labels a window of milliseconds in ms, about one tick per 90 px", () => {
    const t = axisTicks(0, 0.0044, 800, true);
    expect(t.unit).toBe("ms");
    expect(t.labels).toEqual(["0", "1", "2", "3", "4"]);
    const wide = axisTicks(0, 0.0044, 1400, true);
    expect(wide.labels).toEqual(["0", "0.5", "1.0", "1.5", "2.0", "2.5", "3.0", "3.5", "4.0"]);
    expect(wide.values.length).toBeLessThanOrEqual(1400 / 90 + 1);
  });

  it("has fewer ticks when the plot is narrow, and no float drift", () => {
    const t = axisTicks(0.0003, 0.0031, 140, true);
    expect(t.values.length).toBeLessThanOrEqual(3);
    expect(t).toMatchObject({ unit: "ms", labels: ["2"] });
    expect(axisTicks(0, 450e-6, 900, true)).toMatchObject({
      unit: "µs",
      labels: ["0", "50", "100", "150", "200", "250", "300", "350", "400", "450"],
    });
  });

  it("counts event indices in integers", () => {
    const t = axisTicks(0, 7, 900, false);
    expect(t.unit).toBe("event");
    expect(t.labels).toEqual(["0", "1", "2", "3", "4", "5", "6", "7"]);
    expect(axisTicks(0, 5000, 900, false).labels.slice(0, 3)).toEqual(["0", "500", "1000"]);
  });
});
