// What the tune view and the prefetch graph share as widgets: a canvas view bound to its
// model's traits, one of which a click in the view selects (`Selection`), with `busy`
// dimming the view and an error in its callbacks written to `error` (`bindView`).
import type { AnyModel } from "@anywidget/types";
import type { CanvasView } from "./canvas_view";

/** The traits every bound view has. */
export interface BoundModel {
  busy: boolean;
  error: string;
}

/** A model's change handler: the event's name and what it does. */
export type Handler = [string, () => void];

/** The trait `trait` of `model` as the view's selection: `select` is what the view's
 * click calls (it sets the trait and saves it), `follow` what shows the trait's changes
 * in the view, except those `select` made (the view shows them already). */
export class Selection<T extends object, K extends keyof T & string> {
  private own = false;

  constructor(
    private readonly model: AnyModel<T>,
    private readonly trait: K,
  ) {}

  readonly select = (value: T[K]): void => {
    this.own = true;
    try {
      this.model.set(this.trait, value);
      this.model.save_changes();
    } finally {
      this.own = false;
    }
  };

  /** The trait's change handler: `show` unless the change is the view's own. */
  follow(show: () => void): Handler {
    return [
      `change:${this.trait}`,
      () => {
        if (!this.own) show();
      },
    ];
  }
}

/** Bind `view` to `model`: an error in the view's callbacks goes to `error`, `init`
 * shows the model's state, `busy` dims the view now and on each change, and `handlers`
 * (each guarded, as the view's own callbacks are) follow the model. Returns what unbinds
 * them and removes the view. */
export function bindView(
  model: AnyModel<BoundModel>,
  view: CanvasView,
  init: () => void,
  handlers: Handler[],
): () => void {
  view.onError = (text) => {
    model.set("error", text);
    model.save_changes();
  };
  const busy = (): void => {
    view.root.classList.toggle("fv-busy", Boolean(model.get("busy")));
  };
  init();
  busy();
  const guarded = [...handlers, ["change:busy", busy] as Handler].map(
    ([name, fn]): Handler => [name, view.guard(fn)],
  );
  for (const [name, fn] of guarded) model.on(name, fn);
  return () => {
    for (const [name, fn] of guarded) model.off(name, fn);
    view.dispose();
  };
}
