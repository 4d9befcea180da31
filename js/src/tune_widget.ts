// The tune view of fsdpviz.widgets.TuneWidget (and of the page tuning.save("tune.html")
// writes), bound to the model's traits: a click on a point, Enter, or an alternative in
// the knob table sets `selected` (a candidate's index); Python (or the page) sets `data`,
// `selected`, `saved` (the candidates whose plans can be opened; null: all) and `busy`.
import type { AnyModel } from "@anywidget/types";
import { type TuneData, TuneView } from "./tune";
import { bindView, Selection } from "./view_binding";
import { dataOf } from "./wire";

/** The traits of fsdpviz.widgets.TuneWidget. */
export interface TuneModel {
  view: "tune";
  data: TuneData;
  selected: number | null;
  saved: number[] | null;
  busy: boolean;
  error: string;
}

export function tuneDefaults(data: TuneData): TuneModel {
  return { view: "tune", data, selected: null, saved: null, busy: false, error: "" };
}

/** Draw the tune view of `model` into `el`; returns what removes it. */
export function renderTune(model: AnyModel<TuneModel>, el: HTMLElement): () => void {
  const selected = new Selection(model, "selected");
  const view = new TuneView(el, dataOf<TuneData>(model), { select: selected.select });
  const show = (): void => view.setSelected(model.get("selected") ?? null);
  const init = (): void => {
    view.setSaved(model.get("saved") ?? null);
    show();
  };
  return bindView(model, view, init, [
    [
      "change:data",
      () => {
        view.setData(dataOf<TuneData>(model));
        show();
      },
    ],
    selected.follow(show),
    ["change:saved", () => view.setSaved(model.get("saved") ?? null)],
  ]);
}
