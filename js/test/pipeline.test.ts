// A pipeline's timeline: a lane group per pipeline rank, compute named and coloured by
// microbatch, the waits for another rank (bubbles) in words.
import { describe, expect, it } from "vitest";
import { THEMES } from "../src/theme";
import {
  actionText,
  computeDetails,
  eventDetails,
  eventSubject,
  pipelineSubject,
} from "../src/timeline_data";
import { computeLayout, drawLayer, Index, MarkList, type Scene } from "../src/timeline_draw";
import { fakeContext, piped } from "./fixtures";

describe("a pipeline's timeline", () => {
  it("names a stretch of compute by its action and the sends by their microbatch", () => {
    const data = piped();
    expect(data.groups.map((g) => g.name)).toEqual(["pp rank 0 · stage 0", "pp rank 1 · stage 1"]);
    const labels = data.compute.label ?? [];
    const k = labels.indexOf("1B1");
    expect(k).toBeGreaterThanOrEqual(0);
    expect(data.compute.microbatch?.[k]).toBe(1);
    expect(computeDetails(data, k)[1]).toBe("1B1: stage 1's backward of microbatch 1");
    expect(actionText("2I3")).toBe("stage 2's input-gradient backward of microbatch 3");
    const s = data.steps;
    const send = s.kind.findIndex((kind, i) => data.kinds[kind] === "pp_send" && s.phase[i] === 0);
    expect(pipelineSubject(data, send)).toBe(
      `microbatch ${s.microbatch?.[send]}'s activations, stage 0 → 1`,
    );
    expect(eventSubject(data, send)).toBe(pipelineSubject(data, send));
  });

  it("says a receive the compute waited for is a bubble", () => {
    const data = piped();
    const s = data.steps;
    const recv = s.kind.findIndex((kind, i) => data.kinds[kind] === "pp_recv" && s.exposed[i] > 0);
    expect(recv).toBeGreaterThanOrEqual(0);
    expect(eventDetails(data, recv).join("\n")).toContain("a pipeline bubble");
    const rows = data.groups
      .flatMap((g) => g.bottlenecks ?? [])
      .filter((b) => b.cause === "bubble");
    expect(rows.length).toBeGreaterThan(0);
    expect(rows[0].reason).toMatch(
      /^rank \d waits .* for microbatch \d's (activations|gradients) from stage \d/,
    );
  });

  it("lays out a lane group per rank, each with its compute and its memory lane", () => {
    const data = piped();
    const index = new Index(data);
    const sc: Scene = {
      data,
      index,
      layout: computeLayout(data, 1000),
      win: index.full,
      theme: THEMES.dark,
      selectedUnit: -1,
    };
    const marks = new MarkList();
    drawLayer(fakeContext(), sc, marks);
    expect(new Set(data.compute.group)).toEqual(new Set([0, 1]));
    expect(data.memory.map((m) => m.group)).toEqual([0, 1]);
    expect(sc.layout.rows.length).toBe(data.lanes.length);
    for (const lane of data.lanes.filter((l) => l.kind === "memory"))
      expect(sc.layout.rows[data.lanes.indexOf(lane)].h).toBeGreaterThan(0);
  });
});
