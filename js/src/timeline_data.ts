// The timeline's data as Python sends it (fsdpviz.views.timeline_data), the orders its
// steps are walked in, the visible window, and what the timeline says about a step in
// words. No DOM here, so vitest can test all of it in node.

import { exactBytes, formatBytes, formatSeconds, quote, threeDigits } from "./format";

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
  /** Pipeline parallelism: the stage and microbatch of the action that issued it (-1: none). */
  stage?: number[];
  microbatch?: number[];
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
  /** As the time model has them (-1: not modelled): FLOPs, achieved FLOP/s, share of peak. */
  flops?: number[];
  flops_per_s?: number[];
  peak_share?: number[];
  /** Pipeline parallelism: the action each stretch is part of, as torch writes it ("2F3":
   * stage 2's forward of microbatch 3; "" none), and its microbatch (-1 none). */
  label?: string[];
  microbatch?: number[];
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

/** Will it fit: the machine's memory against the plan's (`report.memory`, in Python). */
export interface Capacity {
  machine: string;
  /** The device's memory, what the CUDA context and NCCL take of it, what is left. */
  bytes: number;
  overhead: number;
  usable: number;
  /** The allocator's reserved estimate, the peak allocated, the larger of the two. */
  reserved: number;
  peak: number;
  needed: number;
  headroom: number;
  fits: boolean;
  /** `H100 SXM 80GB: 77.0 GiB usable`, and the whole answer in words (`fit_text()`). */
  label: string;
  text: string;
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
  /** A prediction's modelled lane: its machine's memory (null or absent otherwise). */
  capacity?: Capacity | null;
}

export interface Lane {
  group: number;
  kind: "cpu" | "compute" | "stream" | "memory";
  name: string;
}

/** A wait of the step, as `report.timeline.bottlenecks()` ranks them. */
export interface Bottleneck {
  step: number;
  unit: number;
  kind: string;
  phase: string;
  /** Seconds of compute lost waiting for it, its share of the step's, the part at the tail. */
  exposed: number;
  share: number;
  tail: number;
  cause: string;
  reason: string;
}

export interface Group {
  name: string;
  summary: string;
  exposed: { forward: number; backward: number; total: number; step: number } | null;
  /** Modelled: the waits, most exposed first (absent or null untimed). */
  bottlenecks?: Bottleneck[] | null;
}

/** A flagged event: where ranks diverge, where a rank is stuck, where two plans differ. */
export interface Mark {
  step: number;
  text: string;
  kind?: "diverge" | "stuck" | "difference";
}

/** The compute after a step's last micro-step, on the compute lane (the time model's
 * `Timeline.step_work`): the optimizer step ("optimizer") and torchao's float8 scale
 * precomputation around its all-reduce ("float8_amax", "float8_scales"). */
export interface StepWork {
  group: number[];
  name: string[];
  x0: number[];
  x1: number[];
  /** Memory traffic; kernels launched (0: not counted). */
  bytes: number[];
  kernels: number[];
  /** What it does, in the time model's words. */
  text: string[];
}

/** The short label of each kind of step work on its block (as the plotly figure's). */
export const STEP_WORK_LABELS: Record<string, string> = {
  optimizer: "optimizer step",
  float8_amax: "float8 amaxes",
  float8_scales: "float8 scales",
};

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
  marks: Mark[];
  iteration_starts: number[][];
  /** Present only where a group has compute after its last micro-step. */
  step_work?: StepWork;
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

/** The x of a step's cursor, in either order: where its event starts on its own lane (a
 * collective on its stream; a free, the hook's own work, on the CPU lane when its hook
 * ran). The CPU lane shows when the hook issued a collective (its cell is outlined).
 * `_order` is the order stepped in: it moves the cursor from event to event, never off it. */
export function cursorX(data: TimelineData, step: number, _order: Order = "issue"): number {
  if (data.n_steps === 0) return 0;
  const s = clampStep(step, data.n_steps);
  return data.steps.kind[s] === FREE ? data.steps.issue[s] : data.steps.x0[s];
}

/** The memory moment of `mem` that holds at x: the curve under a cursor there (moments
 * are in order, each holding until the next begins; of several begun at x, the last), or
 * -1 before the first. */
export function momentAt(mem: MemoryLane, x: number): number {
  if (mem.x0.length === 0 || x < mem.x0[0]) return -1;
  return upperBound(mem.x0, x) - 1;
}

export interface Window {
  x0: number;
  x1: number;
}

/** Everything drawn: events (issue and stream), compute (the optimizer step's too), waits
 * and memory moments. */
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
  if (data.step_work) take(data.step_work.x0, data.step_work.x1);
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

/** The step whose cursor x is closest to x (of several, the first in `order`): for clicks
 * on the overview. */
export function nearestStep(data: TimelineData, x: number, order: Order = "issue"): number {
  const n = data.n_steps;
  if (n === 0) return 0;
  let best = -1;
  let bestD = Number.POSITIVE_INFINITY;
  for (const s of orderOf(data, order)) {
    const d = Math.abs(cursorX(data, s, order) - x);
    if (d < bestD) {
      bestD = d;
      best = s;
    }
  }
  return best;
}

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
 * are numbered from 0, as `view.timeline.step` counts them. The memory it gives is the
 * curve's at the cursor (the event's own start), or at `moment` when one is picked (the
 * peak button, a click on the memory lane). */
export function describeStep(
  data: TimelineData,
  step: number,
  order: Order = "issue",
  moment: number | null = null,
): string {
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
  const { compute, tail } = waitedFor(data, i);
  if (compute > 0) parts.push(`compute waited ${formatSeconds(compute)} for it`);
  if (tail > 0) parts.push(`the step's end waited ${formatSeconds(tail)} for it`);
  const mem = data.memory.find((m) => m.group === s.group[i]);
  if (mem !== undefined) {
    // the moment the memory is read at, said: the peak button's (the peak itself) and a
    // step's own (where its event starts) are two moments of the same step
    const k = moment ?? momentAt(mem, cursorX(data, i, order));
    if (k >= 0 && k < mem.total.length) {
      const peak = k === mem.peak.moment ? " ▼ peak" : "";
      const when = mem.where[k] ? ` ${mem.where[k]}` : "";
      parts.push(`memory ${formatBytes(mem.total[k])}${peak}${when}`);
    }
  }
  return parts.join(" · ");
}

/** What an event is about: its unit, or for a tensor-parallel collective the module that
 *  issued it and the unit it belongs to. */
export function eventSubject(data: TimelineData, step: number): string {
  const kind = data.kinds[data.steps.kind[step]];
  if (kind === "pp_send" || kind === "pp_recv") return pipelineSubject(data, step);
  const unit = unitText(data, data.steps.unit[step]);
  const m = data.steps.module?.[step] ?? -1;
  const name = m >= 0 ? data.modules?.[m] : undefined;
  return name === undefined ? unit : `${quote(name)} in ${unit}`;
}

/** A send or receive of pipeline parallelism: `microbatch 3's activations, stage 1 → 2`. */
export function pipelineSubject(data: TimelineData, step: number): string {
  const s = data.steps;
  const stage = s.stage?.[step] ?? -1;
  const mb = s.microbatch?.[step] ?? -1;
  const forward = s.phase[step] === 0;
  const send = data.kinds[s.kind[step]] === "pp_send";
  const peer = forward === send ? stage + 1 : stage - 1;
  const [from, to] = send ? [stage, peer] : [peer, stage];
  return `microbatch ${mb}'s ${forward ? "activations" : "gradients"}, stage ${from} → ${to}`;
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
  const { compute, tail } = waitedFor(data, i);
  const bubble = data.kinds[s.kind[i]] === "pp_recv";
  if (compute > 0)
    lines.push(
      `compute waited ${formatSeconds(compute)} for it (${bubble ? "a pipeline bubble: another rank had not sent it yet" : "exposed"})`,
    );
  if (tail > 0)
    lines.push(
      `the step's end waited ${formatSeconds(tail)} for it (${tailPlace(data, i)}, exposed)`,
    );
  if (s.exposed[i] === 0 && s.kind[i] !== FREE) lines.push("compute never waited for it (hidden)");
  for (const m of data.marks) if (m.step === i) lines.push(`${markSymbol(m)} ${m.text}`);
  return lines;
}

/** The lane of `precompute_float8_dynamic_scale_for_fsdp`'s all-reduce of the float8 weights'
 *  amaxes (fsdpviz.views.timeline_lanes.FLOAT8_SCALES), which runs after the optimizer step. */
export const FLOAT8_SCALES_LANE = "float8 scales all-reduce";

/** Where step `i`, which the step's end waits for, runs: after the optimizer step (the float8
 *  scales' all-reduce, which the next step's first all-gather waits for), else after the last
 *  compute. */
export function tailPlace(data: TimelineData, i: number): string {
  return data.lanes[data.steps.lane[i]]?.name === FLOAT8_SCALES_LANE
    ? "after the optimizer step"
    : "after the last compute";
}

/** ⚑ where ranks diverge or plans differ, ⏸ where a rank is stuck. */
export function markSymbol(m: Mark): string {
  return m.kind === "stuck" ? "⏸" : "⚑";
}

/**
 * Seconds waited for step `i`: by the compute (before it could go on) and by the step's end
 * (the tail: after the last compute, for the last reduce-scatter). Their sum is its
 * `exposed`; where the waits are not drawn, all of it is the compute's.
 */
export function waitedFor(data: TimelineData, i: number): { compute: number; tail: number } {
  const exposed = data.steps.exposed[i];
  if (!(exposed > 0)) return { compute: 0, tail: 0 };
  const w = data.waits;
  let tail = 0;
  let any = false;
  for (let k = 0; k < w.step.length; k++) {
    if (w.step[k] !== i) continue;
    any = true;
    if (w.tail[k]) tail += w.x1[k] - w.x0[k];
  }
  if (!any) return { compute: exposed, tail: 0 };
  tail = Math.min(tail, exposed);
  // what is not the tail's is the compute's (the drawn waits add up to it)
  const compute = exposed - tail > exposed * 1e-9 ? exposed - tail : 0;
  return { compute, tail };
}

/** The lines of a compute stretch's hover: whose, when, how long, its FLOPs and rate. */
export function computeDetails(data: TimelineData, k: number): string[] {
  const c = data.compute;
  const phase = c.phase[k] === 0 ? "forward" : "backward";
  const lines = [`${phase} compute of ${unitText(data, c.unit[k])}`];
  const action = c.label?.[k] ?? "";
  if (action !== "") lines.push(`${action}: ${actionText(action)}`);
  if (data.groups.length > 1) lines.push(data.groups[c.group[k]].name);
  if (data.timed)
    lines.push(`starts ${formatSeconds(c.x0[k])}, lasts ${formatSeconds(c.x1[k] - c.x0[k])}`);
  const flops = c.flops?.[k] ?? -1;
  const rate = c.flops_per_s?.[k] ?? -1;
  const share = c.peak_share?.[k] ?? -1;
  if (flops >= 0) lines.push(`${formatFlops(flops)} (modelled, from the traced kernels)`);
  if (rate > 0)
    lines.push(
      `achieved ${formatFlops(rate)}/s${share >= 0 ? `, ${(share * 100).toFixed(1)}% of the GPU's peak` : ""}`,
    );
  const i = c.step[k];
  lines.push(
    `click: the event it leads to (step ${i}, ${data.kinds[data.steps.kind[i]]} ${unitText(data, data.steps.unit[i])})`,
  );
  return lines;
}

/** The lines of a block of step work's hover (as the plotly figure's): what it does, how
 * long it takes, its memory traffic and kernels, all the time model's. */
export function stepWorkDetails(data: TimelineData, k: number): string[] {
  const w = data.step_work;
  if (!w) return [];
  let took = `${formatSeconds(w.x1[k] - w.x0[k])}, ${formatBytes(w.bytes[k])} moved`;
  if (w.kernels[k]) took += ` in ${w.kernels[k]} kernels`;
  const lines = [w.text[k], took];
  if (data.groups.length > 1) lines.push(data.groups[w.group[k]].name);
  lines.push("after the step's last micro-step, before the next step's first all-gather");
  return lines;
}

/** A pipeline action in words: `2F3` -> `stage 2's forward of microbatch 3`. */
export function actionText(action: string): string {
  const m = /^(\d+)([FBIW])(\d+)$/.exec(action);
  if (m === null) return action;
  const what: Record<string, string> = {
    F: "forward",
    B: "backward",
    I: "input-gradient backward",
    W: "weight-gradient backward",
  };
  return `stage ${m[1]}'s ${what[m[2]]} of microbatch ${m[3]}`;
}

/** `1.23 TFLOP`, `456 GFLOP`: FLOPs to three significant figures. */
export function formatFlops(n: number): string {
  const units: Array<[number, string]> = [
    [1e15, "PFLOP"],
    [1e12, "TFLOP"],
    [1e9, "GFLOP"],
    [1e6, "MFLOP"],
    [1e3, "kFLOP"],
  ];
  for (const [scale, unit] of units) if (n >= scale) return `${threeDigits(n / scale)} ${unit}`;
  return `${Math.round(n)} FLOP`;
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
