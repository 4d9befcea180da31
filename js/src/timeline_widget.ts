// The timeline of fsdpviz.widgets.TimelineWidget. Stepping and playing run here without
// waiting for the kernel; `step` is synced to Python at once for a single step, at most
// every `sync_interval_ms` during bursts (playing, a held key), and on pause.
//
// `renderTimeline` puts together the view (timeline_view.ts: elements, controls, state,
// drawing), its bindings to the model's traits, and its bindings to the page (mouse and
// keys on the canvas, the widget's size, the page's theme).
import type { AnyModel } from "@anywidget/types";
import { bindControlKeys, bindPointer } from "./dom";
import { watchTheme } from "./theme";
import { clampStep } from "./timeline_data";
import { type TimelineModel, TimelineView } from "./timeline_view";

/** Follow Python's changes to the traits; returns what stops following them. */
function listenToModel(view: TimelineView): () => void {
  const { model, player } = view;
  const handlers: Array<[string, () => void]> = [
    [
      "change:step",
      () => {
        const s = clampStep(model.get("step"), view.data.n_steps);
        if (s !== player.step) player.goTo(s);
      },
    ],
    [
      "change:playing",
      () => {
        if (model.get("playing") && !player.playing) player.play();
        if (!model.get("playing") && player.playing) player.pause();
      },
    ],
    [
      "change:selected_unit",
      () => {
        view.selectUnit(model.get("selected_unit"));
        view.draw();
      },
    ],
    [
      "change:speed",
      () => {
        player.speed = model.get("speed");
        view.controls.speed.value = String(player.speed);
      },
    ],
    ["change:order", () => view.setOrder(model.get("order") === "stream" ? "stream" : "issue")],
    ["change:note", () => view.paint()],
    ["change:busy", () => view.showBusy()],
    ["change:data", () => view.resetData()],
  ];
  const guarded = handlers.map(([name, fn]): [string, () => void] => [name, view.guard(fn)]);
  for (const [name, fn] of guarded) model.on(name, fn);
  return () => {
    for (const [name, fn] of guarded) model.off(name, fn);
  };
}

/** Mouse and keys on the canvas: click to select, hover for details, drag or ctrl/shift +
 * wheel to move and zoom, keys to step; the same keys on the view's own buttons. */
function listenToInput(view: TimelineView): () => void {
  const { player } = view;
  const keys: Record<string, () => void> = {
    ArrowLeft: () => player.stepBy(-1),
    ArrowRight: () => player.stepBy(1),
    " ": () => player.toggle(),
    Home: () => player.first(),
    End: () => player.end(),
    p: () => view.goToPeak(),
  };
  const stopKeys = bindControlKeys(
    view.root,
    (key) => keys[key],
    (fn) => view.guard(fn),
  );
  const stopPointer = bindPointer(
    view.canvas,
    {
      hover: (x, y) => view.hoverAt(x, y),
      click: (x, y) => view.clickAt(x, y),
      leave: () => view.leave(),
      dragFrom: () => {
        const win = { ...view.win };
        return (dx) => {
          const d = (dx / view.layout.plotW) * (win.x1 - win.x0);
          view.showRange(win.x0 - d, win.x1 - d);
        };
      },
      wheel: (_x, factor) => view.zoom(factor),
      keyAction: (key) => keys[key],
    },
    (fn) => view.guard(fn),
  );
  return () => {
    stopKeys();
    stopPointer();
  };
}

/** Redraw when the widget's size or the page's theme changes; returns what stops it. */
function watchPage(view: TimelineView): () => void {
  const observer = new ResizeObserver(view.guard(() => view.resize()));
  observer.observe(view.root);
  const stopTheme = watchTheme(
    view.guard(() => {
      if (!view.disposed) view.applyTheme();
    }),
  );
  return () => {
    observer.disconnect();
    stopTheme();
  };
}

/** Draw the timeline of `model` into `el`; returns what removes it. */
export function renderTimeline(model: AnyModel<TimelineModel>, el: HTMLElement): () => void {
  const view = new TimelineView(model, el);
  const stopListening = listenToModel(view);
  const stopInput = listenToInput(view);
  const stopWatching = watchPage(view);
  view.guard(() => view.start())();
  return () => {
    view.dispose();
    stopInput();
    stopWatching();
    stopListening();
  };
}
