// Pure timeline logic: the data sent by Python, stepping and playing in an order, the
// visible window, axis ticks and text. No DOM here, so vitest can test all of it in node.

/** One column per field, one entry per step: every event of every group, in issue order. */
export interface Steps {
  group: number[];
  kind: number[];
  unit: number[];
  phase: number[];
  prefetch: number[];
  hook: number[];
  hook_unit: number[];
  iteration: number[];
  index: number[];
  /** Hook call that issued it (into `calls`), and its place among the call's events. */
  call: number[];
  slot: number[];
  /** Lane its own mark is drawn in: a stream lane, or the CPU lane for a free. */
  lane: number[];
  /** x of the hook call that issued it (CPU lane); x0..x1 on its lane. */
  issue: number[];
  x0: number[];
  x1: number[];
  /** Bytes one rank sends (-1: unknown) and seconds compute waited for it (-1: unknown). */
  bytes: number[];
  exposed: number[];
  /** Tensor parallelism: the module that issued a collective (into `modules`; -1: none). */
  module?: number[];
}

export interface Calls {
  group: number[];
  hook: number[];
  unit: number[];
  x: number[];
  n: number[];
}

export interface ComputeSegments {
  group: number[];
  unit: number[];
  phase: number[];
  x0: number[];
  x1: number[];
  step: number[];
}

export interface Waits {
  group: number[];
  x0: number[];
  x1: number[];
  step: number[];
  phase: number[];
  tail: number[];
}

export interface MemoryPeak {
  moment: number;
  bytes: number;
  step: number;
  where: string;
  dominant: string;
  x: number;
}

/** One group's memory lane: bytes per category at every moment the model looked. */
export interface MemoryLane {
  group: number;
  lane: number;
  categories: string[];
  colors: string[];
  x0: number[];
  x1: number[];
  bytes: Record<string, number[]>;
  total: number[];
  step: number[];
  where: string[];
  peak: MemoryPeak;
  notes: string[];
}

export interface Lane {
  group: number;
  kind: "cpu" | "compute" | "stream" | "memory";
  name: string;
}

export interface Group {
  name: string;
  summary: string;
  exposed: { forward: number; backward: number; total: number; step: number } | null;
}

/** What `fsdpviz.views.timeline_data` returns (see its docstring). */
export interface TimelineData {
  version: number;
  source: string;
  units: string[];
  unit_numbers: number[];
  colors: string[];
  kinds: string[];
  hooks: string[];
  /** Modules named by tensor-parallel collectives (present only where they occur). */
  modules?: string[];
  timed: boolean;
  clock: string;
  groups: Group[];
  lanes: Lane[];
  n_steps: number;
  steps: Steps;
  stream_order: number[];
  calls: Calls;
  compute: ComputeSegments;
  waits: Waits;
  memory: MemoryLane[];
  marks: Array<{ step: number; text: string }>;
  iteration_starts: number[][];
}

export const FREE = 1;
export type Order = "issue" | "stream";

export function clampStep(step: number, n: number): number {
  if (n <= 0 || !Number.isFinite(step)) return 0;
  return Math.min(Math.max(Math.round(step), 0), n - 1);
}

/** The steps in `order`: issue order is the steps' own; stream order starts on the streams. */
export function orderOf(data: TimelineData, order: Order): number[] {
  if (order === "stream" && data.stream_order.length === data.n_steps) return data.stream_order;
  return Array.from({ length: data.n_steps }, (_, i) => i);
}

/** The x of a step's cursor in `order`: when its hook ran, or when it starts on its lane. */
export function cursorX(data: TimelineData, step: number, order: Order): number {
  if (data.n_steps === 0) return 0;
  const s = clampStep(step, data.n_steps);
  return order === "stream" ? data.steps.x0[s] : data.steps.issue[s];
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
  /** The order steps are walked in (default: 0, 1, 2, ...). */
  order?: number[];
  scheduler: FrameScheduler;
  onChange: (step: number, playing: boolean) => void;
}

/**
 * Stepping and playing, entirely in the browser, along an order of the steps: `pos` is
 * the place in `order`, `step` the step there. `speed` is steps per second; playing
 * advances by elapsed time (not by frame count), stops at the last step, and restarts
 * from the first when started at the end.
 */
export class Player {
  n: number;
  step: number;
  pos: number;
  speed: number;
  playing = false;
  private order: number[];
  private place: number[];
  private readonly scheduler: FrameScheduler;
  private readonly onChange: (step: number, playing: boolean) => void;
  private last: number | null = null;
  private carry = 0;

  constructor(opts: PlayerOptions) {
    this.n = opts.n;
    this.step = clampStep(opts.step ?? 0, opts.n);
    [this.order, this.place] = placesOf(opts.order ?? null, opts.n);
    this.pos = this.place[this.step] ?? 0;
    this.speed = opts.speed ?? 20;
    this.scheduler = opts.scheduler;
    this.onChange = opts.onChange;
  }

  /** Walk the steps in `order` (null: 0, 1, 2, ...); the current step stays. */
  setOrder(order: number[] | null): void {
    [this.order, this.place] = placesOf(order, this.n);
    this.pos = this.place[this.step] ?? 0;
  }

  /** The step at place `pos` of the order. */
  stepAtPos(pos: number): number {
    return this.order[clampStep(pos, this.n)] ?? 0;
  }

  goTo(step: number): void {
    const s = clampStep(step, this.n);
    if (s === this.step) return;
    this.step = s;
    this.pos = this.place[s] ?? 0;
    this.onChange(this.step, this.playing);
  }

  goToPos(pos: number): void {
    this.goTo(this.stepAtPos(pos));
  }

  stepBy(delta: number): void {
    this.goToPos(this.pos + delta);
  }

  first(): void {
    this.goToPos(0);
  }

  end(): void {
    this.goToPos(this.n - 1);
  }

  play(): void {
    if (this.playing || this.n <= 1) return;
    if (this.pos >= this.n - 1) {
      this.pos = 0;
      this.step = this.stepAtPos(0);
    }
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

  /** New data: n steps, in `order`, at `step`. */
  reset(n: number, step: number, order: number[] | null = null): void {
    this.pause();
    this.n = n;
    this.step = clampStep(step, n);
    this.setOrder(order);
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
    this.pos = Math.min(this.pos + advance, this.n - 1);
    this.step = this.stepAtPos(this.pos);
    if (this.pos >= this.n - 1) {
      this.playing = false;
      this.scheduler.stop();
    }
    this.onChange(this.step, this.playing);
  }
}

/** `order` (0, 1, 2, ... when null or of another length) and the place of each step in it. */
function placesOf(order: number[] | null, n: number): [number[], number[]] {
  const o = order !== null && order.length === n ? order : Array.from({ length: n }, (_, i) => i);
  const place = new Array<number>(n);
  o.forEach((s, p) => {
    place[s] = p;
  });
  return [o, place];
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

/** Everything drawn: events (issue and stream), compute, waits and memory moments. */
export function fullRange(data: TimelineData): Window {
  let x0 = Infinity;
  let x1 = -Infinity;
  const take = (xs: number[], ys: number[]): void => {
    for (const v of xs) if (v < x0) x0 = v;
    for (const v of ys) if (v > x1) x1 = v;
  };
  take(data.steps.issue, data.steps.x1);
  take(data.steps.x0, data.steps.issue);
  take(data.compute.x0, data.compute.x1);
  take(data.waits.x0, data.waits.x1);
  for (const m of data.memory) take(m.x0, m.x1);
  if (!Number.isFinite(x0) || !Number.isFinite(x1)) return { x0: 0, x1: 1 };
  if (x1 <= x0) return { x0, x1: x0 + 1 };
  return { x0, x1 };
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

/** First index in [lo, hi) with xs[i] >= x, for `xs` sorted ascending (hi if none). */
export function lowerBound(xs: ArrayLike<number>, x: number, lo = 0, hi = xs.length): number {
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** First index in [lo, hi) with xs[i] > x, for `xs` sorted ascending (hi if none). */
export function upperBound(xs: ArrayLike<number>, x: number, lo = 0, hi = xs.length): number {
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** The step whose cursor x (in `order`) is closest to x: for clicks on the overview. */
export function nearestStep(data: TimelineData, x: number, order: Order = "issue"): number {
  const n = data.n_steps;
  if (n === 0) return 0;
  const steps = orderOf(data, order);
  const xs = steps.map((s) => cursorX(data, s, order));
  const i = Math.min(lowerBound(xs, x), n - 1);
  const j = Math.max(i - 1, 0);
  return Math.abs(xs[j] - x) <= Math.abs(xs[i] - x) ? steps[j] : steps[i];
}

/**
 * `v` to three significant figures as Python's `f"{v:.3g}"` rounds it (a tie, where `v` is
 * exactly half-way, goes to the even digit: 160.5 -> 160, not toPrecision's 161), never in
 * exponent form; so the page prints the numbers fsdpviz's Python API prints.
 */
export function threeDigits(v: number): string {
  if (v === 0 || !Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  const text =
    a >= 999.5 ? String(roundEven(a, 1 + Math.floor(Math.log10(a)))) : String(roundEven(a, 3));
  return v < 0 ? `-${text}` : text;
}

/** `a` (> 0) rounded to `digits` significant digits from its exact decimal value, a tie to
 * the even digit, as Python's format does (`(48.85).toPrecision(3)` and a scaled
 * `Math.round` see ties that are not there, or miss them). */
function roundEven(a: number, digits: number): number {
  const [mantissa, exponent] = a.toExponential(100).split("e");
  const all = mantissa.replace(".", "");
  let n = Number(all.slice(0, digits));
  const rest = all.slice(digits);
  if (rest[0] > "5" || (rest[0] === "5" && (/[1-9]/.test(rest.slice(1)) || n % 2 === 1))) n += 1;
  return Number((n * 10 ** (Number(exponent) - digits + 1)).toPrecision(Math.max(digits, 1)));
}

export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  for (let u = 0; u < units.length; u++) {
    if (Math.abs(v) < 1024 || u === units.length - 1) {
      return u === 0 ? `${Math.round(v)} B` : `${threeDigits(v)} ${units[u]}`;
    }
    v /= 1024;
  }
  return `${n} B`;
}

/** `30999176` -> `30,999,176 bytes`: the exact number, for titles and tests. */
export function exactBytes(n: number): string {
  return `${Math.round(n).toLocaleString("en-US")} bytes`;
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
  let k = TIME_UNITS.findIndex(([s]) => Math.abs(seconds) >= s);
  if (k < 0) k = TIME_UNITS.length - 1;
  let text = threeDigits(seconds / TIME_UNITS[k][0]);
  if (Math.abs(Number(text)) >= 1000 && k > 0) {
    k -= 1; // 999.7 µs reads 1 ms, as fsdpviz.cost.time.duration_text writes it
    text = threeDigits(seconds / TIME_UNITS[k][0]);
  }
  return `${text} ${TIME_UNITS[k][1]}`;
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

/** Ticks for bytes from 0 to `max` on an axis `h` pixels tall: 1, 2 or 5 times a power of 2^10 steps. */
export function byteTicks(max: number, h: number): number[] {
  if (max <= 0) return [0];
  const count = Math.max(1, Math.floor(h / 28));
  const raw = max / count;
  let scale = 1;
  while (raw >= scale * 1024) scale *= 1024;
  const mag = 10 ** Math.floor(Math.log10(raw / scale));
  const tick =
    ([1, 2, 5, 10].map((m) => m * mag).find((t) => t * scale >= raw) ?? 10 * mag) * scale;
  const out: number[] = [];
  for (let v = 0; v <= max * (1 + 1e-9); v += tick) out.push(v);
  return out;
}

/** A module's name as the views show it unquoted: `(root)` for the root (whose FQN is ""). */
export const moduleName = (name: string): string => (name === "" ? "(root)" : name);

/** A unit's name as the views show it: quoted, `(root)` for the root's (whose FQN is ""). */
export const quote = (name: string): string => (name === "" ? "(root)" : `'${name}'`);

/** `3 'layers.2'`: the unit's number (its index in report.units) and its name. */
export function unitText(data: TimelineData, unit: number): string {
  if (unit < 0) return "?";
  return `unit ${data.unit_numbers[unit]} ${quote(data.units[unit])}`;
}

/** Where the cursor is in words: when the event's hook ran and when it ran on its lane. */
function timeText(data: TimelineData, s: number): string {
  const st = data.steps;
  if (!data.timed) return `event ${st.index[s]} of iteration ${st.iteration[s]}`;
  const lane = data.lanes[st.lane[s]]?.name ?? "";
  if (st.kind[s] === FREE) return `issued at ${formatSeconds(st.issue[s])}`;
  return `issued at ${formatSeconds(st.issue[s])}, on ${lane} ${formatSeconds(st.x0[s])}–${formatSeconds(st.x1[s])}`;
}

/** The status line: `step 3 of 23 · all_gather unit 2 'layers.1' (prefetch) · ...`. Steps
 * are numbered from 0, as `view.timeline.step` counts them. */
export function describeStep(data: TimelineData, step: number, order: Order = "issue"): string {
  const s = data.steps;
  if (data.n_steps === 0) return "no events";
  const i = clampStep(step, data.n_steps);
  const parts = [
    `step ${i} of ${data.n_steps}${order === "stream" ? " (stream-start order)" : ""}`,
    `${data.kinds[s.kind[i]]} ${eventSubject(data, i)}${s.prefetch[i] ? " (prefetch)" : ""}`,
    s.phase[i] === 0 ? "forward" : "backward",
  ];
  if (s.hook[i] >= 0) parts.push(`${data.hooks[s.hook[i]]} of ${quoteUnit(data, s.hook_unit[i])}`);
  if (data.groups.length > 1) parts.push(data.groups[s.group[i]].name);
  parts.push(timeText(data, i));
  if (s.exposed[i] > 0) parts.push(`compute waited ${formatSeconds(s.exposed[i])} for it`);
  const mem = data.memory.find((m) => m.group === s.group[i]);
  if (mem !== undefined) {
    const k = lastMomentOf(mem, i);
    if (k >= 0) parts.push(`memory ${formatBytes(mem.total[k])}`);
  }
  return parts.join(" · ");
}

/** What an event is about: its unit, or for a tensor-parallel collective the module that
 *  issued it and the unit it belongs to. */
export function eventSubject(data: TimelineData, step: number): string {
  const unit = unitText(data, data.steps.unit[step]);
  const m = data.steps.module?.[step] ?? -1;
  const name = m >= 0 ? data.modules?.[m] : undefined;
  return name === undefined ? unit : `${quote(name)} in ${unit}`;
}

function quoteUnit(data: TimelineData, unit: number): string {
  return unit < 0 ? "?" : quote(data.units[unit]);
}

/** The last memory moment that belongs to `step` (the state after it), or -1. */
export function lastMomentOf(mem: MemoryLane, step: number): number {
  let k = -1;
  for (let j = 0; j < mem.step.length; j++) if (mem.step[j] === step) k = j;
  return k;
}

/** The lines of an event's hover: what, when, how long, who issued it, what it cost. */
export function eventDetails(data: TimelineData, step: number): string[] {
  const s = data.steps;
  const i = clampStep(step, data.n_steps);
  const kind = data.kinds[s.kind[i]];
  const lines = [
    `${kind} ${eventSubject(data, i)}`,
    `step ${i} · ${s.phase[i] === 0 ? "forward" : "backward"} · iteration ${s.iteration[i]}, event ${s.index[i]}`,
  ];
  if (data.groups.length > 1) lines.push(data.groups[s.group[i]].name);
  if (s.hook[i] >= 0)
    lines.push(`issued by ${data.hooks[s.hook[i]]} of ${quoteUnit(data, s.hook_unit[i])}`);
  if (s.kind[i] === 0)
    lines.push(
      s.prefetch[i]
        ? "prefetch: issued ahead by another unit's hook"
        : "not a prefetch: its own hook issued it",
    );
  if (s.bytes[i] >= 0 && s.kind[i] !== FREE)
    lines.push(`sends ${formatBytes(s.bytes[i])} per rank`);
  if (data.timed) {
    lines.push(`issued at ${formatSeconds(s.issue[i])}`);
    if (s.kind[i] !== FREE) {
      lines.push(
        `starts ${formatSeconds(s.x0[i])} on ${data.lanes[s.lane[i]]?.name ?? "its stream"}, lasts ${formatSeconds(s.x1[i] - s.x0[i])}`,
      );
    }
  } else {
    lines.push("placed by index: no durations modelled");
  }
  if (s.exposed[i] > 0)
    lines.push(`compute waited ${formatSeconds(s.exposed[i])} for it (exposed)`);
  else if (s.exposed[i] === 0 && s.kind[i] !== FREE)
    lines.push("compute never waited for it (hidden)");
  for (const m of data.marks) if (m.step === i) lines.push(`⚑ ${m.text}`);
  return lines;
}

/** The lines of a memory moment's hover: total, the biggest categories, where it is. */
export function memoryDetails(data: TimelineData, mem: MemoryLane, k: number): string[] {
  const parts = mem.categories
    .map((c) => [c, mem.bytes[c][k]] as [string, number])
    .filter(([, b]) => b > 0)
    .sort((a, b) => b[1] - a[1]);
  const lines = [`${formatBytes(mem.total[k])} in use (${exactBytes(mem.total[k])})`, mem.where[k]];
  if (k === mem.peak.moment) lines.unshift("▼ the peak of this iteration");
  for (const [c, b] of parts.slice(0, 6)) lines.push(`${c.replace(/_/g, " ")}: ${formatBytes(b)}`);
  if (parts.length > 6) lines.push(`… ${parts.length - 6} more`);
  lines.push(
    `click: step ${mem.step[k]} (${data.kinds[data.steps.kind[mem.step[k]]]} ${unitText(data, data.steps.unit[mem.step[k]])})`,
  );
  return lines;
}

/** Exposed communication of a group in words: `forward 0.14 ms, backward 0.23 ms of a 0.44 ms step`. */
export function exposedText(g: Group): string {
  const e = g.exposed;
  if (e === null) return "";
  return `exposed communication: forward ${formatSeconds(e.forward)}, backward ${formatSeconds(e.backward)} (${formatSeconds(e.total)} of a ${formatSeconds(e.step)} step)`;
}
