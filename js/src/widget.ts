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
    ["change:order", () => view.setOrder(model.get("order") === "stream" ? "stream" : "issue")],
    ["change:note", () => view.paint()],
    ["change:data", () => view.resetData()],
  ];
  const guarded = handlers.map(([name, fn]): [string, () => void] => [name, view.guard(fn)]);
  for (const [name, fn] of guarded) model.on(name, fn);
  return () => {
    for (const [name, fn] of guarded) model.off(name, fn);
  };
}

/** Mouse and keys on the canvas: click to select, hover for details, drag or ctrl/shift +
 * wheel to move and zoom, keys to step. */
function listenToInput(view: TimelineView): void {
  const { canvas, player } = view;
  const at = (ev: MouseEvent): [number, number] => {
    const rect = canvas.getBoundingClientRect();
    return [ev.clientX - rect.left, ev.clientY - rect.top];
  };
  let down: { x: number; win: { x0: number; x1: number } } | null = null;
  let dragged = false;
  canvas.addEventListener("mousedown", (ev) => {
    down = { x: ev.clientX, win: { ...view.win } };
    dragged = false;
  });
  window.addEventListener("mouseup", () => {
    down = null;
  });
  canvas.addEventListener("mousemove", (ev) => {
    if (down !== null && (ev.buttons & 1) === 1 && Math.abs(ev.clientX - down.x) > 4) {
      dragged = true;
      const { win } = down;
      const dx = ((ev.clientX - down.x) / view.layout.plotW) * (win.x1 - win.x0);
      view.guard(() => view.showRange(win.x0 - dx, win.x1 - dx))();
      return;
    }
    const [x, y] = at(ev);
    view.guard(() => view.hoverAt(x, y))();
  });
  canvas.addEventListener("mouseleave", () => view.guard(() => view.leave())());
  canvas.addEventListener("click", (ev) => {
    if (dragged) return;
    const [x, y] = at(ev);
    view.guard(() => view.clickAt(x, y))();
  });
  canvas.addEventListener("wheel", (ev) => {
    if (!ev.ctrlKey && !ev.shiftKey) return;
    ev.preventDefault();
    view.zoom(ev.deltaY > 0 ? 1.25 : 0.8);
  });
  canvas.addEventListener("keydown", (ev) => {
    const keys: Record<string, () => void> = {
      ArrowLeft: () => player.stepBy(-1),
      ArrowRight: () => player.stepBy(1),
      " ": () => player.toggle(),
      Home: () => player.first(),
      End: () => player.end(),
      p: () => view.goToPeak(),
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
  view.guard(() => view.start())();
  return () => {
    view.dispose();
    stopWatching();
    stopListening();
  };
}

export default { render };
