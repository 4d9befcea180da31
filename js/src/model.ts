// Pure timeline logic: the data sent by Python, stepping and playing, the visible
// window, hit testing and text. No DOM here, so vitest can test all of it in node.

/** One column per field, one entry per step (every event of every rank, in x order). */
export interface Steps {
  rank: number[];
  kind: number[];
  unit: number[];
  phase: number[];
  prefetch: number[];
  hook: number[];
  hook_unit: number[];
  iteration: number[];
  index: number[];
  x0: number[];
  x1: number[];
}

export interface ComputeSegments {
  rank: number[];
  unit: number[];
  phase: number[];
  x0: number[];
  x1: number[];
  step0: number[];
  step1: number[];
}

export interface MemorySeries {
  x: number[];
  bytes: number[];
  step: number[];
}

/** What `fsdpviz.views.timeline_data` returns (see its docstring). */
export interface TimelineData {
  version: number;
  source: string;
  units: string[];
  colors: string[];
  ranks: string[];
  kinds: string[];
  hooks: string[];
  timed: boolean;
  x_label: string;
  n_steps: number;
  steps: Steps;
  compute: ComputeSegments;
  memory: MemorySeries | null;
  peak_step: number | null;
  iteration_starts: number[];
}

export const LANES = ["compute", "all-gather", "reduce-scatter"] as const;
/** Lane of an event kind: all_gather, free and CPU offload's h2d copy -> all-gather;
 * reduce_scatter, all_reduce and the d2h copy -> reduce-scatter. */
export const KIND_LANE = [1, 1, 2, 2, 1, 2] as const;
export const FREE = 1;

export function clampStep(step: number, n: number): number {
  if (n <= 0 || !Number.isFinite(step)) return 0;
  return Math.min(Math.max(Math.round(step), 0), n - 1);
}

/** Something that calls back once per animation frame with a timestamp in ms. */
export interface FrameScheduler {
  start(onFrame: (now: number) => void): void;
  stop(): void;
}

export function animationFrames(): FrameScheduler {
  let handle = 0;
  return {
    start(onFrame) {
      const loop = (now: number): void => {
        onFrame(now);
        handle = requestAnimationFrame(loop);
      };
      handle = requestAnimationFrame(loop);
    },
    stop() {
      cancelAnimationFrame(handle);
    },
  };
}

export interface PlayerOptions {
  n: number;
  step?: number;
  speed?: number;
  scheduler: FrameScheduler;
  onChange: (step: number, playing: boolean) => void;
}

/**
 * Stepping and playing, entirely in the browser. `speed` is steps per second;
 * playing advances by elapsed time (not by frame count), stops at the last step,
 * and restarts from 0 when started at the end.
 */
export class Player {
  n: number;
  step: number;
  speed: number;
  playing = false;
  private readonly scheduler: FrameScheduler;
  private readonly onChange: (step: number, playing: boolean) => void;
  private last: number | null = null;
  private carry = 0;

  constructor(opts: PlayerOptions) {
    this.n = opts.n;
    this.step = clampStep(opts.step ?? 0, opts.n);
    this.speed = opts.speed ?? 20;
    this.scheduler = opts.scheduler;
    this.onChange = opts.onChange;
  }

  goTo(step: number): void {
    const s = clampStep(step, this.n);
    if (s === this.step) return;
    this.step = s;
    this.onChange(this.step, this.playing);
  }

  stepBy(delta: number): void {
    this.goTo(this.step + delta);
  }

  play(): void {
    if (this.playing || this.n <= 1) return;
    if (this.step >= this.n - 1) this.step = 0;
    this.playing = true;
    this.last = null;
    this.carry = 0;
    this.onChange(this.step, true);
    this.scheduler.start((now) => this.frame(now));
  }

  pause(): void {
    if (!this.playing) return;
    this.playing = false;
    this.scheduler.stop();
    this.onChange(this.step, false);
  }

  toggle(): void {
    if (this.playing) this.pause();
    else this.play();
  }

  /** New data: keeps the step where it still exists. */
  reset(n: number, step: number): void {
    this.pause();
    this.n = n;
    this.step = clampStep(step, n);
  }

  /** One animation frame at time `now` (ms). Public for tests. */
  frame(now: number): void {
    if (!this.playing) return;
    if (this.last === null) {
      this.last = now;
      return;
    }
    this.carry += ((now - this.last) / 1000) * this.speed;
    this.last = now;
    const advance = Math.floor(this.carry);
    if (advance < 1) return;
    this.carry -= advance;
    const next = Math.min(this.step + advance, this.n - 1);
    this.step = next;
    if (next >= this.n - 1) {
      this.playing = false;
      this.scheduler.stop();
    }
    this.onChange(this.step, this.playing);
  }
}

/**
 * Calls `send` with the latest value at most once per `intervalMs`; `flush` sends a
 * pending value now. Keeps the kernel out of the per-step loop while playing.
 */
export class Throttle<T> {
  private pending: { value: T } | null = null;
  private lastSent = -Infinity;
  private timer: ReturnType<typeof setTimeout> | null = null;

  constructor(
    private readonly intervalMs: number,
    private readonly send: (value: T) => void,
    private readonly now: () => number = () => performance.now(),
  ) {}

  push(value: T): void {
    this.pending = { value };
    const wait = this.lastSent + this.intervalMs - this.now();
    if (wait <= 0) {
      this.flush();
    } else if (this.timer === null) {
      this.timer = setTimeout(() => this.flush(), wait);
    }
  }

  flush(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    if (this.pending === null) return;
    const { value } = this.pending;
    this.pending = null;
    this.lastSent = this.now();
    this.send(value);
  }
}

export interface Window {
  x0: number;
  x1: number;
}

export function fullRange(data: TimelineData): Window {
  const s = data.steps;
  if (data.n_steps === 0) return { x0: 0, x1: 1 };
  let x1 = s.x1[0];
  for (const v of s.x1) if (v > x1) x1 = v;
  return { x0: s.x0[0], x1 };
}

/**
 * The visible x window after the cursor moved to `x`: unchanged while `x` stays in
 * the middle 80%, otherwise re-centred; clamped to `bounds`; `span` is its width.
 */
export function follow(win: Window, x: number, span: number, bounds: Window): Window {
  const width = Math.min(span, bounds.x1 - bounds.x0);
  let x0 = win.x0;
  if (win.x1 - win.x0 !== width || x < x0 + 0.1 * width || x > x0 + 0.9 * width) {
    x0 = x - width / 2;
  }
  x0 = Math.max(bounds.x0, Math.min(x0, bounds.x1 - width));
  return { x0, x1: x0 + width };
}

/** First step with x0 >= x (steps are sorted by x0). */
export function firstStepStartingAt(steps: Steps, x: number): number {
  let lo = 0;
  let hi = steps.x0.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (steps.x0[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** First step with x1 > x (steps are sorted by x0, and x1 >= x0). */
export function firstStepEndingAfter(steps: Steps, x: number): number {
  // Events that start before x may still cover it: walk back over a few.
  let i = firstStepStartingAt(steps, x);
  while (i > 0 && steps.x1[i - 1] > x) i -= 1;
  return i;
}

/** The step drawn at x in `lane` (0 compute, 1 all-gather, 2 reduce-scatter) of `rank`, or -1. */
export function stepAt(data: TimelineData, x: number, rank: number, lane: number): number {
  const s = data.steps;
  if (lane === 0) {
    const c = data.compute;
    for (let i = 0; i < c.x0.length; i++) {
      if (c.rank[i] === rank && c.x0[i] <= x && x < c.x1[i]) return c.step0[i];
    }
    return -1;
  }
  let best = -1;
  for (let i = firstStepEndingAfter(s, x); i < data.n_steps && s.x0[i] <= x; i++) {
    if (s.rank[i] === rank && KIND_LANE[s.kind[i]] === lane && x < s.x1[i]) best = i;
  }
  return best;
}

/** The step whose x0 is closest to x (for clicks on the overview and the memory curve). */
export function nearestStep(data: TimelineData, x: number): number {
  const n = data.n_steps;
  if (n === 0) return 0;
  const i = Math.min(firstStepStartingAt(data.steps, x), n - 1);
  const j = Math.max(i - 1, 0);
  return Math.abs(data.steps.x0[j] - x) <= Math.abs(data.steps.x0[i] - x) ? j : i;
}

export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  for (let u = 0; u < units.length; u++) {
    if (Math.abs(v) < 1024 || u === units.length - 1) {
      return u === 0 ? `${Math.round(v)} B` : `${Number(v.toPrecision(3))} ${units[u]}`;
    }
    v /= 1024;
  }
  return `${n} B`;
}

const TIME_UNITS: ReadonlyArray<readonly [number, string]> = [
  [1, "s"],
  [1e-3, "ms"],
  [1e-6, "µs"],
  [1e-9, "ns"],
];

/** A duration in seconds with 3 significant digits in the unit that suits it: `343 µs`, `12.3 ms`. */
export function formatSeconds(seconds: number): string {
  if (seconds === 0) return "0 s";
  const [scale, unit] =
    TIME_UNITS.find(([s]) => Math.abs(seconds) >= s) ?? TIME_UNITS[TIME_UNITS.length - 1];
  return `${Number((seconds / scale).toPrecision(3))} ${unit}`;
}

export interface AxisTicks {
  values: number[];
  labels: string[];
  /** What the labels count: a time unit (`ms`), or `event`. */
  unit: string;
}

/**
 * Ticks for the x window [x0, x1] drawn `plotW` pixels wide: about one per 90 px at
 * 1, 2 or 5 times a power of ten. Times are labelled in the unit that suits the
 * window (`0`, `0.5`, `1.0` ms), event indices as integers.
 */
export function axisTicks(x0: number, x1: number, plotW: number, timed: boolean): AxisTicks {
  const span = x1 - x0 > 0 ? x1 - x0 : 1;
  const raw = span / Math.max(2, Math.floor(plotW / 90));
  const mag = 10 ** Math.floor(Math.log10(raw));
  let tick = [1, 2, 5, 10].map((m) => m * mag).find((t) => t >= raw * (1 - 1e-9)) ?? mag * 10;
  if (!timed) tick = Math.max(1, Math.round(tick));
  const values: number[] = [];
  for (let k = Math.ceil(x0 / tick - 1e-9); k * tick <= x1 + tick * 1e-9; k++)
    values.push(k * tick);
  if (!timed) return { values, labels: values.map((v) => String(Math.round(v))), unit: "event" };
  const top = Math.max(Math.abs(x0), Math.abs(x1));
  const [scale, unit] = TIME_UNITS.find(([s]) => top >= s) ?? TIME_UNITS[TIME_UNITS.length - 1];
  const decimals = Math.max(0, Math.ceil(-Math.log10(tick / scale) - 1e-9));
  const labels = values.map((v) =>
    Math.abs(v) < tick * 1e-6 ? "0" : (v / scale).toFixed(decimals),
  );
  return { values, labels, unit };
}

/** A unit's name as the views show it: quoted, `(root)` for the root's (whose FQN is ""). */
export const quote = (name: string): string => (name === "" ? "(root)" : `'${name}'`);

/** One line describing a step, e.g. `all_gather 'layers.3' (prefetch) · forward · ...`. */
export function describeStep(data: TimelineData, step: number): string {
  const s = data.steps;
  if (data.n_steps === 0) return "no events";
  const i = clampStep(step, data.n_steps);
  const parts = [
    `step ${i + 1}/${data.n_steps}`,
    `${data.kinds[s.kind[i]]} ${quote(data.units[s.unit[i]])}${s.prefetch[i] ? " (prefetch)" : ""}`,
    s.phase[i] === 0 ? "forward" : "backward",
  ];
  if (s.hook[i] >= 0) {
    const hu = s.hook_unit[i] >= 0 ? quote(data.units[s.hook_unit[i]]) : "?";
    parts.push(`${data.hooks[s.hook[i]]} hook of ${hu}`);
  }
  if (data.ranks.length > 1) parts.push(data.ranks[s.rank[i]]);
  parts.push(
    data.timed
      ? `t = ${formatSeconds(s.x0[i])}${data.source === "prediction" ? " (modelled)" : ""}`
      : `event ${s.index[i]} of iteration ${s.iteration[i]}`,
  );
  if (data.memory !== null) {
    const k = data.memory.step.indexOf(i);
    if (k >= 0) parts.push(`memory ${formatBytes(data.memory.bytes[k])}`);
  }
  return parts.join(" · ");
}
