// The prefetch graph of fsdpviz.widgets.PrefetchWidget (and of the exported page),
// bound to the model's traits: a click on a unit or an arc sets `selected_unit`; Python
// (or the page) sets `data`, `current_unit` (the timeline's, which the window follows),
// `selected_unit` (another view's click) and `busy` while it re-plans.
import type { AnyModel } from "@anywidget/types";
import { type PrefetchData, PrefetchView } from "./prefetch";
import { bindView, Selection } from "./view_binding";
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
  const selected = new Selection(model, "selected_unit");
  const view = new PrefetchView(el, dataOf<PrefetchData>(model), { select: selected.select });
  const init = (): void => {
    view.setCurrent(model.get("current_unit"));
    view.setSelected(model.get("selected_unit"));
  };
  return bindView(model, view, init, [
    ["change:data", () => view.setData(dataOf<PrefetchData>(model))],
    ["change:current_unit", () => view.setCurrent(model.get("current_unit"))],
    selected.follow(() => view.setSelected(model.get("selected_unit"))),
  ]);
}
