// A widget's model as anywidget gives it (get/set/on/off/save_changes, change events on
// set), and a widget rendered with the bundle's own render as anywidget renders it.
import type { AnyModel } from "@anywidget/types";
import widget from "../src/widget";

type Handler = () => void;

/** Enough of anywidget's model: get/set/on/off/save_changes, change events on set. */
export class FakeModel<T extends object> {
  state: T;
  saved: Array<Partial<T>> = [];
  private pending: Partial<T> = {};
  private handlers = new Map<string, Set<Handler>>();

  constructor(state: T) {
    this.state = state;
  }
  get<K extends keyof T>(key: K): T[K] {
    return this.state[key];
  }
  set<K extends keyof T>(key: K, value: T[K]): void {
    this.state[key] = value;
    this.pending[key] = value;
    for (const h of this.handlers.get(`change:${String(key)}`) ?? []) h();
  }
  /** A change coming from Python: no save. */
  fromPython<K extends keyof T>(key: K, value: T[K]): void {
    this.state[key] = value;
    for (const h of this.handlers.get(`change:${String(key)}`) ?? []) h();
  }
  save_changes(): void {
    this.saved.push(this.pending);
    this.pending = {};
  }
  on(name: string, cb: Handler): void {
    if (!this.handlers.has(name)) this.handlers.set(name, new Set());
    this.handlers.get(name)?.add(cb);
  }
  off(name?: string | null, cb?: Handler | null): void {
    if (name && cb) this.handlers.get(name)?.delete(cb);
  }
  listeners(): number {
    let n = 0;
    for (const set of this.handlers.values()) n += set.size;
    return n;
  }
}

/** Render `state` with the widget bundle's own render, as anywidget does. */
export function mount<T extends object>(state: T) {
  const model = new FakeModel(state);
  const el = document.createElement("div");
  document.body.appendChild(el);
  const render = (widget as { render: (p: unknown) => () => void }).render;
  const cleanup = render({ model: model as unknown as AnyModel<T>, el });
  return { model, el, cleanup };
}
