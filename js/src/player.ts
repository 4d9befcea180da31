// Stepping and playing along an order of steps, entirely in the browser, and the throttle
// that keeps the kernel out of the per-step loop. No DOM here.

import { clampStep } from "./timeline_data";

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
