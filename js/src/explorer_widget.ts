// The explorer of fsdpviz.widgets.ExplorerWidget (and of the exported page): the icicle
// (explorer.ts) and the selected unit's detail panel (detail.ts), bound to the model's
// traits. A click or the find box sets `selected_unit` and `selected_module`, a zoom
// `focus`, the width menu `area`; Python (or the page) sets `data`, `current_unit` (the
// timeline's) and `selected_unit` (another view's click), and `busy` while it re-plans.
import type { AnyModel } from "@anywidget/types";
import { DetailPanel, type PickedModule, type UnitDetail } from "./detail";
import { element } from "./dom";
import { type Area, type ExplorerData, ExplorerView } from "./explorer";
import { dataOf, traitOf } from "./wire";

/** The traits of fsdpviz.widgets.ExplorerWidget. */
export interface ExplorerModel {
  view: "explorer";
  data: ExplorerData;
  /** Each unit's detail panel (null: not made yet); empty: those in `data`. */
  details: Array<UnitDetail | null>;
  current_unit: string | null;
  selected_unit: string | null;
  selected_module: string | null;
  /** The module drawn at the top ("" for the model). */
  focus: string;
  area: Area;
  busy: boolean;
  error: string;
}

export function explorerDefaults(data: ExplorerData): ExplorerModel {
  return {
    view: "explorer",
    data,
    details: [],
    current_unit: null,
    selected_unit: null,
    selected_module: null,
    focus: "",
    area: "numel",
    busy: false,
    error: "",
  };
}

/** Below this width the panel goes over the icicle instead of beside it. */
export const BESIDE_FROM = 900;

/** An explorer with its panel: what `renderExplorer` puts into the page. */
export class ExplorerWidgetView {
  readonly root: HTMLElement;
  readonly view: ExplorerView;
  readonly panel: DetailPanel;
  /** A change this view made itself (a click): the model's echo of it moves nothing. */
  private own = false;

  constructor(
    readonly model: AnyModel<ExplorerModel>,
    el: HTMLElement,
  ) {
    this.root = element("div", "fsdpviz-explorer-box");
    el.appendChild(this.root);
    const left = element("div", "fv-explorer-main");
    this.panel = new DetailPanel();
    this.root.append(left, this.panel.el);
    this.view = new ExplorerView(left, dataOf<ExplorerData>(model), {
      select: (unit, module) => this.send({ selected_unit: unit, selected_module: module }),
      focus: (module) => this.send({ focus: module }),
      area: (area) => this.send({ area }),
    });
    this.view.onError = (text) => {
      model.set("error", text);
      model.save_changes();
    };
    (this.root as unknown as { fsdpviz: ExplorerWidgetView }).fsdpviz = this;
    this.view.setArea(model.get("area") === "rank_bytes" ? "rank_bytes" : "numel");
    this.focusOn(model.get("focus"));
    this.view.setCurrent(model.get("current_unit"));
    this.view.setSelected(model.get("selected_unit"), true, this.pickedModule());
    this.showDetail();
    this.showBusy();
  }

  /** Set `changes` on the model and send them: what a click in the view does. */
  private send(changes: Partial<ExplorerModel>): void {
    this.own = true;
    try {
      for (const [key, value] of Object.entries(changes))
        this.model.set(key as keyof ExplorerModel, value as never);
      this.model.save_changes();
    } finally {
      this.own = false;
    }
    this.showDetail();
  }

  guard(fn: () => void): () => void {
    return this.view.guard(fn);
  }

  private focusOn(name: string): void {
    const i = this.view.index.byName.get(name ?? "");
    if (i !== undefined && i !== this.view.focus) this.view.focusOn(i);
  }

  /** What a model change does to the view (Python's, the page's, or the echo of a click). */
  listen(): () => void {
    const m = this.model;
    const handlers: Array<[string, () => void]> = [
      [
        "change:data",
        () => {
          this.view.setData(dataOf<ExplorerData>(m));
          this.showDetail();
        },
      ],
      ["change:current_unit", () => this.view.setCurrent(m.get("current_unit"))],
      [
        "change:selected_unit",
        () => {
          if (!this.own) this.view.setSelected(m.get("selected_unit"), true, this.pickedModule());
          this.showDetail();
        },
      ],
      ["change:selected_module", () => this.showDetail()],
      ["change:details", () => this.showDetail()],
      [
        "change:focus",
        () => {
          if (!this.own) this.focusOn(m.get("focus"));
        },
      ],
      [
        "change:area",
        () => this.view.setArea(m.get("area") === "rank_bytes" ? "rank_bytes" : "numel"),
      ],
      ["change:busy", () => this.showBusy()],
    ];
    const guarded = handlers.map(([name, fn]): [string, () => void] => [name, this.guard(fn)]);
    for (const [name, fn] of guarded) m.on(name, fn);
    let beside: boolean | null = null;
    const place = this.guard(() => {
      const w = this.root.clientWidth;
      const now = w === 0 || w >= BESIDE_FROM;
      if (now === beside) return;
      beside = now;
      this.root.classList.toggle("fv-beside", now);
      this.panel.setOver(!now);
    });
    place();
    const observer = typeof ResizeObserver === "function" ? new ResizeObserver(place) : null;
    observer?.observe(this.root);
    return () => {
      observer?.disconnect();
      for (const [name, fn] of guarded) m.off(name, fn);
    };
  }

  /** The module picked in the selected unit: `selected_module` where it is one of the
   * unit's (a unit selected in another view leaves an older module behind), else null. */
  pickedModule(): string | null {
    const name = this.model.get("selected_module");
    const i = name === null ? undefined : this.view.index.byName.get(name);
    if (i === undefined) return null;
    const u = this.view.data.modules.unit[i];
    const unit = this.model.get("selected_unit");
    return (u < 0 ? null : this.view.data.units[u].name) === unit ? name : null;
  }

  /** The selected unit's panel, and the module picked in it. */
  showDetail(): void {
    const data = this.view.data;
    const unit = this.model.get("selected_unit");
    const k = unit === null ? -1 : data.units.findIndex((u) => u.name === unit);
    const name = this.pickedModule();
    const i = name === null ? undefined : this.view.index.byName.get(name);
    const m = data.modules;
    const picked: PickedModule | null =
      i === undefined || name === unit
        ? null
        : {
            name: m.name[i],
            cls: data.classes[m.cls[i]],
            numel: m.numel[i],
            bytes: m.bytes[i],
            rankBytes: m.rank_bytes[i],
          };
    const sent = traitOf<Array<UnitDetail | null>>(this.model, "details") ?? [];
    const details = sent.length > 0 ? sent : (data.details ?? []);
    if (k >= 0 && !details[k]) this.panel.showPending(data.units[k].name);
    else this.panel.show(k < 0 ? null : (details[k] ?? null), picked);
  }

  showBusy(): void {
    this.root.classList.toggle("fv-busy", Boolean(this.model.get("busy")));
  }

  dispose(): void {
    this.view.dispose();
  }
}

/** Draw the explorer of `model` into `el`; returns what removes it. */
export function renderExplorer(model: AnyModel<ExplorerModel>, el: HTMLElement): () => void {
  const w = new ExplorerWidgetView(model, el);
  const stop = w.listen();
  return () => {
    stop();
    w.dispose();
  };
}
