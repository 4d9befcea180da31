// Timeline data as Python makes it (tests/test_views_timeline.py writes and checks these
// files): the tiny model's prediction placed by the time model, the same laid out by index
// with no memory lane, a recording of two ranks that diverge, and a pipeline of two ranks.
import { afterEach, beforeEach, vi } from "vitest";
import type { ExplorerData } from "../src/explorer";
import type { PrefetchData } from "../src/prefetch";
import type { TimelineData } from "../src/timeline_data";
import type { TuneData } from "../src/tune";
import explorer from "./data/explorer.json";
import pipeline from "./data/pipeline.json";
import prediction from "./data/prediction.json";
import prefetch from "./data/prefetch.json";
import prefetchMissed from "./data/prefetch_post.json";
import recording from "./data/recording.json";
import tune from "./data/tune.json";
import untimed from "./data/untimed.json";

const copy = (d: unknown): TimelineData => structuredClone(d) as TimelineData;

export const predicted = (): TimelineData => copy(prediction);
export const byIndex = (): TimelineData => copy(untimed);
export const recorded = (): TimelineData => copy(recording);
/** A pipeline (1F1B, 2 pipeline ranks, 2 microbatches): a lane group per pipeline rank. */
export const piped = (): TimelineData => copy(pipeline);

/** A canvas context that draws nothing: text is 6 px per character. */
export function fakeContext(): CanvasRenderingContext2D {
  const state: Record<string | symbol, unknown> = {};
  return new Proxy(state, {
    get(target, key) {
      if (key === "measureText") return (text: string) => ({ width: 6 * text.length });
      if (key in target) return target[key];
      return () => undefined;
    },
    set(target, key, value) {
      target[key] = value;
      return true;
    },
  }) as unknown as CanvasRenderingContext2D;
}

/** jsdom has no canvas: before each test of the file, a context that draws nothing (the marks
 * are still laid out) and, with `observeResize`, a ResizeObserver that observes nothing; after
 * each, the stubs and mocks undone and the page emptied. */
export function fakeCanvas(observeResize = false): void {
  beforeEach(() => {
    if (observeResize)
      vi.stubGlobal(
        "ResizeObserver",
        class {
          observe(): void {}
          disconnect(): void {}
        },
      );
    vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockImplementation(
      () => fakeContext() as unknown as ReturnType<HTMLCanvasElement["getContext"]>,
    );
  });
  afterEach(() => {
    vi.unstubAllGlobals();
    vi.restoreAllMocks();
    document.body.innerHTML = "";
  });
}

/** The tiny model's explorer and prefetch graph as Python writes them (explorer_data,
 * prefetch_data; tests/test_views_explorer.py and test_views_prefetch.py keep them current):
 * forward prefetch above the line and backward prefetch below; BACKWARD_POST's misses. */
export const explorerData = (): ExplorerData => structuredClone(explorer) as ExplorerData;
export const prefetchData = (): PrefetchData => structuredClone(prefetch) as PrefetchData;
export const prefetchPost = (): PrefetchData => structuredClone(prefetchMissed) as PrefetchData;

/** A tuning of 6 configurations as Python writes it (tune_data; tests/test_views_tune.py
 * keeps it current): 3 fit a budget, the best on the frontier, the given the fastest. */
export const tuneData = (): TuneData => structuredClone(tune) as TuneData;
