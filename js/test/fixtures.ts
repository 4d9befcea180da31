import type { TimelineData } from "../src/model";

/** 6 events of one rank: all_gather a, all_gather b (prefetch), free a, reduce_scatter b, free b, all_reduce a. */
export function sample(n = 6, timed = false): TimelineData {
  const kinds = [0, 0, 1, 2, 1, 3];
  const idx = Array.from({ length: n }, (_, i) => i);
  const x0 = timed ? idx.map((i) => i * 0.5) : idx.map((i) => i);
  return {
    version: 1,
    source: "prediction",
    units: ["", "b"],
    colors: ["#E69F00", "#56B4E9"],
    ranks: ["rank 0"],
    kinds: ["all_gather", "free", "reduce_scatter", "all_reduce"],
    hooks: ["pre_forward", "post_forward", "pre_backward", "post_backward", "final_callback"],
    timed,
    x_label: "event index",
    n_steps: n,
    steps: {
      rank: idx.map(() => 0),
      kind: idx.map((i) => kinds[i % 6]),
      unit: idx.map((i) => i % 2),
      phase: idx.map((i) => (i < n / 2 ? 0 : 1)),
      prefetch: idx.map((i) => (i === 1 ? 1 : 0)),
      hook: idx.map((i) => (i < n / 2 ? 0 : 3)),
      hook_unit: idx.map((i) => i % 2),
      iteration: idx.map(() => 1),
      index: idx,
      x0,
      x1: x0.map((x) => x + (timed ? 0.5 : 1)),
    },
    compute: {
      rank: [0, 0],
      unit: [0, 1],
      phase: [0, 1],
      x0: [0, 3],
      x1: [3, n],
      step0: [0, 3],
      step1: [2, n - 1],
    },
    memory: {
      x: x0.map((x) => x + 0.5),
      bytes: idx.map((i) => (i === 4 ? 3072 : 1024)),
      step: idx,
    },
    peak_step: 4,
    iteration_starts: [0],
  };
}
