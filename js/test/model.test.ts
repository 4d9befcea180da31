import { describe, expect, it, vi } from "vitest";
import {
  axisTicks,
  clampStep,
  describeStep,
  type FrameScheduler,
  firstStepEndingAfter,
  follow,
  formatBytes,
  formatSeconds,
  fullRange,
  nearestStep,
  Player,
  stepAt,
  Throttle,
} from "../src/model";
import { sample } from "./fixtures";

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

describe("windows and hit testing", () => {
  const data = sample();

  it("spans the run", () => {
    expect(fullRange(data)).toEqual({ x0: 0, x1: 6 });
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

  it("finds the step under a point in each lane", () => {
    expect(firstStepEndingAfter(data.steps, 2.5)).toBe(2);
    expect(stepAt(data, 1.5, 0, 1)).toBe(1); // all-gather lane
    expect(stepAt(data, 3.2, 0, 2)).toBe(3); // reduce-scatter lane
    expect(stepAt(data, 3.2, 0, 1)).toBe(-1);
    expect(stepAt(data, 4.5, 0, 0)).toBe(3); // compute segment -> its first step
    expect(stepAt(data, 1.5, 1, 1)).toBe(-1); // no such rank
    expect(nearestStep(data, 2.4)).toBe(2);
    expect(nearestStep(data, 2.6)).toBe(3);
    expect(nearestStep(data, 99)).toBe(5);
  });
});

describe("text", () => {
  it("formats bytes in binary units", () => {
    expect(formatBytes(512)).toBe("512 B");
    expect(formatBytes(1536)).toBe("1.5 KiB");
    expect(formatBytes(3 * 2 ** 30)).toBe("3 GiB");
  });

  it("describes a predicted step by event index and a recorded one by time", () => {
    const d = sample();
    expect(describeStep(d, 1)).toBe(
      "step 2/6 · all_gather 'b' (prefetch) · forward · pre_forward hook of 'b' · event 1 of iteration 1 · memory 1 KiB",
    );
    expect(describeStep(sample(6, true), 4)).toContain("t = 2 s");
    expect(describeStep(d, 4)).toContain("memory 3 KiB");
  });

  it("marks a prediction's times as modelled", () => {
    const d = { ...sample(6, true), source: "prediction" };
    expect(describeStep(d, 4)).toContain("t = 2 s (modelled)");
    expect(describeStep({ ...d, source: "recording" }, 4)).not.toContain("modelled");
  });

  it("names the root's unit (FQN '') as (root)", () => {
    expect(describeStep(sample(), 0)).toContain(
      "all_gather (root) · forward · pre_forward hook of (root)",
    );
  });

  it("writes durations in the unit that suits them", () => {
    expect(formatSeconds(0)).toBe("0 s");
    expect(formatSeconds(0.000343)).toBe("343 µs");
    expect(formatSeconds(0.0123456)).toBe("12.3 ms");
    expect(formatSeconds(1.5)).toBe("1.5 s");
    expect(formatSeconds(4.2e-8)).toBe("42 ns");
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
