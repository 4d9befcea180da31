// The prefetch graph of fsdpviz.widgets.PrefetchWidget (and of the exported page),
// bound to the model's traits: a click on a unit or an arc sets `selected_unit`; Python
// (or the page) sets `data`, `current_unit` (the timeline's, which the window follows),
// `selected_unit` (another view's click) and `busy` while it re-plans.
import type { AnyModel } from "@anywidget/types";
import { type PrefetchData, PrefetchView } from "./prefetch";
import { dataOf } from "./wire";

/** The traits of fsdpviz.widgets.PrefetchWidget. */
export interface PrefetchModel {
  view: "prefetch";
  data: PrefetchData;
  current_unit: string | null;
  selected_unit: string | null;
  busy: boolean;
  error: string;
}

export function prefetchDefaults(data: PrefetchData): PrefetchModel {
  return {
    view: "prefetch",
    data,
    current_unit: null,
    selected_unit: null,
    busy: false,
    error: "",
  };
}

/** Draw the prefetch graph of `model` into `el`; returns what removes it. */
export function renderPrefetch(model: AnyModel<PrefetchModel>, el: HTMLElement): () => void {
  let own = false;
  const view = new PrefetchView(el, dataOf<PrefetchData>(model), {
    select: (unit) => {
      own = true;
      try {
        model.set("selected_unit", unit);
        model.save_changes();
      } finally {
        own = false;
      }
    },
  });
  view.onError = (text) => {
    model.set("error", text);
    model.save_changes();
  };
  const busy = (): void => {
    view.root.classList.toggle("fv-busy", Boolean(model.get("busy")));
  };
  view.setCurrent(model.get("current_unit"));
  view.setSelected(model.get("selected_unit"));
  busy();
  const handlers: Array<[string, () => void]> = [
    ["change:data", () => view.setData(dataOf<PrefetchData>(model))],
    ["change:current_unit", () => view.setCurrent(model.get("current_unit"))],
    [
      "change:selected_unit",
      () => {
        if (!own) view.setSelected(model.get("selected_unit"));
      },
    ],
    ["change:busy", busy],
  ];
  const guarded = handlers.map(([name, fn]): [string, () => void] => [name, view.guard(fn)]);
  for (const [name, fn] of guarded) model.on(name, fn);
  return () => {
    for (const [name, fn] of guarded) model.off(name, fn);
    view.dispose();
  };
}
