// How the front end writes numbers and names: bytes, durations, axis ticks, as fsdpviz's
// Python API prints them. No DOM here.

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
