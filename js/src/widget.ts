// The anywidget front end of fsdpviz.widgets.TimelineWidget. Stepping and playing
// run here without waiting for the kernel; `step` is synced to Python at once for a
// single step, at most every `sync_interval_ms` during bursts (playing, a held key),
// and on pause.
//
// `render` puts together the view (view.ts: elements, controls, state, drawing), its
// bindings to the model's traits, and its bindings to the page (mouse and keys on the
// canvas, the widget's size, JupyterLab's theme).
import type { RenderProps } from "@anywidget/types";
import { clampStep } from "./model";
import { nextFrame, TimelineView, type WidgetModel } from "./view";

export type { WidgetModel } from "./view";

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
    ["change:data", () => view.resetData()],
  ];
  const guarded = handlers.map(([name, fn]): [string, () => void] => [name, view.guard(fn)]);
  for (const [name, fn] of guarded) model.on(name, fn);
  return () => {
    for (const [name, fn] of guarded) model.off(name, fn);
  };
}

/** Mouse and keys on the canvas: click to select, ctrl/shift + wheel to zoom, keys to step. */
function listenToInput(view: TimelineView): void {
  const { canvas, player } = view;
  canvas.addEventListener("click", (ev) => view.guard(() => view.clickAt(ev))());
  canvas.addEventListener("wheel", (ev) => {
    if (!ev.ctrlKey && !ev.shiftKey) return;
    ev.preventDefault();
    view.zoom(ev.deltaY > 0 ? 1.25 : 0.8);
  });
  canvas.addEventListener("keydown", (ev) => {
    const { data } = view;
    const keys: Record<string, () => void> = {
      ArrowLeft: () => player.stepBy(-1),
      ArrowRight: () => player.stepBy(1),
      " ": () => player.toggle(),
      Home: () => player.goTo(0),
      End: () => player.goTo(data.n_steps - 1),
      p: () => data.peak_step !== null && player.goTo(data.peak_step),
    };
    const action = keys[ev.key];
    if (action === undefined) return;
    ev.preventDefault();
    view.guard(action)();
  });
}

/** Redraw when the widget's size or JupyterLab's theme changes; returns what stops it. */
function watchPage(view: TimelineView): () => void {
  const observer = new ResizeObserver(view.guard(() => view.resize()));
  observer.observe(view.root);
  const applyTheme = view.guard(() => view.applyTheme());
  // Now, and again on the next frame: the new theme's CSS variables may apply after the flag.
  const themeWatch = new MutationObserver(() => {
    applyTheme();
    nextFrame(() => {
      if (!view.disposed) applyTheme();
    });
  });
  themeWatch.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light"] });
  return () => {
    observer.disconnect();
    themeWatch.disconnect();
  };
}

function render({ model, el }: RenderProps<WidgetModel>): () => void {
  const view = new TimelineView(model, el);
  const stopListening = listenToModel(view);
  listenToInput(view);
  const stopWatching = watchPage(view);
  view.start();
  return () => {
    view.dispose();
    stopWatching();
    stopListening();
  };
}

export default { render };
