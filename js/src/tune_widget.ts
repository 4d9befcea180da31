// The tune view of fsdpviz.widgets.TuneWidget (and of the page tuning.save("tune.html")
// writes), bound to the model's traits: a click on a point, Enter, or an alternative in
// the knob table sets `selected` (a candidate's index); Python (or the page) sets `data`,
// `selected`, `saved` (the candidates whose plans can be opened; null: all) and `busy`.
import type { AnyModel } from "@anywidget/types";
import { type TuneData, TuneView } from "./tune";
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
  let own = false;
  const view = new TuneView(el, dataOf<TuneData>(model), {
    select: (index) => {
      own = true;
      try {
        model.set("selected", index);
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
  view.setSaved(model.get("saved") ?? null);
  view.setSelected(model.get("selected") ?? null);
  busy();
  const handlers: Array<[string, () => void]> = [
    [
      "change:data",
      () => {
        view.setData(dataOf<TuneData>(model));
        view.setSelected(model.get("selected") ?? null);
      },
    ],
    [
      "change:selected",
      () => {
        if (!own) view.setSelected(model.get("selected") ?? null);
      },
    ],
    ["change:saved", () => view.setSaved(model.get("saved") ?? null)],
    ["change:busy", busy],
  ];
  const guarded = handlers.map(([name, fn]): [string, () => void] => [name, view.guard(fn)]);
  for (const [name, fn] of guarded) model.on(name, fn);
  return () => {
    for (const [name, fn] of guarded) model.off(name, fn);
    view.dispose();
  };
}
