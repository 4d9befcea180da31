// How the three views of a page follow each other, on their models: what
// fsdpviz.widgets.Dashboard does in Python for the notebook, the exported page does here.
//
// - the timeline's current step's unit is the explorer's and the prefetch graph's
//   `current_unit` (outlined, ringed);
// - `selected_unit` is shared: set in one view, it is set in the others;
// - a unit chosen in the explorer or the prefetch graph moves the timeline to that unit's
//   next event (wrapping around), as a click on it in the page says it will.
import type { ExplorerModel } from "./explorer_widget";
import type { PrefetchModel } from "./prefetch_widget";
import { clampStep, type TimelineData } from "./timeline_data";
import type { TimelineModel } from "./timeline_view";
import { dataOf } from "./wire";

/** The part of anywidget's model interface the links use. */
export interface Model<T> {
  get<K extends keyof T>(key: K): T[K];
  set<K extends keyof T>(key: K, value: T[K]): void;
  on(name: string, callback: () => void): void;
  off(name?: string | null, callback?: (() => void) | null): void;
  save_changes(): void;
}

export interface LinkedModels {
  timeline: Model<TimelineModel>;
  explorer: Model<ExplorerModel> | null;
  prefetch: Model<PrefetchModel> | null;
}

/** Name of the unit of the event at `step`, or null when there are no events. */
export function unitOfStep(data: TimelineData, step: number): string | null {
  if (data.n_steps === 0) return null;
  return data.units[data.steps.unit[clampStep(step, data.n_steps)]] ?? null;
}

/** The next step after `from` whose event belongs to `unit` (wrapping around), or -1. */
export function nextStepOfUnit(data: TimelineData, unit: string, from: number): number {
  const u = data.units.indexOf(unit);
  const n = data.n_steps;
  if (u < 0 || n === 0) return -1;
  for (let k = 1; k <= n; k++) {
    const s = (from + k) % n;
    if (data.steps.unit[s] === u) return s;
  }
  return -1;
}

/** Link the views' models (see the top of this file); returns what unlinks them. */
export function linkViews(m: LinkedModels): () => void {
  const { timeline } = m;
  const others = [m.explorer, m.prefetch].filter((x) => x !== null) as Array<
    Model<ExplorerModel> | Model<PrefetchModel>
  >;
  let linking = false;
  const set = <T extends { selected_unit: string | null }>(
    model: Model<T>,
    key: keyof T,
    value: unknown,
  ): void => {
    if (model.get(key) === value) return;
    model.set(key, value as T[keyof T]);
    model.save_changes();
  };
  const current = (): void => {
    const unit = unitOfStep(dataOf<TimelineData>(timeline), timeline.get("step"));
    for (const o of others) set(o as Model<PrefetchModel>, "current_unit", unit);
  };
  const share = (from: object, moveTimeline: boolean) => (): void => {
    if (linking) return;
    linking = true;
    try {
      const source = from as Model<PrefetchModel>;
      const unit = source.get("selected_unit");
      for (const o of [timeline, ...others])
        if (o !== from) set(o as Model<PrefetchModel>, "selected_unit", unit);
      if (moveTimeline && unit !== null) {
        const step = nextStepOfUnit(dataOf<TimelineData>(timeline), unit, timeline.get("step"));
        if (step >= 0) {
          timeline.set("step", step);
          timeline.save_changes();
        }
      }
    } finally {
      linking = false;
    }
  };
  const handlers: Array<[Model<never>, string, () => void]> = [
    [timeline as Model<never>, "change:step", current],
    [timeline as Model<never>, "change:data", current],
    [timeline as Model<never>, "change:selected_unit", share(timeline, false)],
  ];
  for (const o of others)
    handlers.push([o as Model<never>, "change:selected_unit", share(o, true)]);
  for (const [model, name, fn] of handlers) model.on(name, fn);
  current();
  return () => {
    for (const [model, name, fn] of handlers) model.off(name, fn);
  };
}
