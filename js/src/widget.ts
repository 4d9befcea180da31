// fsdpviz's front end, one ES module for every view: anywidget loads it for
// fsdpviz.widgets.TimelineWidget, ExplorerWidget, PrefetchWidget and TuneWidget (the model's `view`
// trait says which to draw), and the exported page imports the very same module, draws
// the same three views from the same state, and links them as the Dashboard does.
import type { AnyModel, RenderProps } from "@anywidget/types";
import { type ExplorerModel, renderExplorer } from "./explorer_widget";
import { type PrefetchModel, renderPrefetch } from "./prefetch_widget";
import type { TimelineModel } from "./timeline_view";
import { renderTimeline } from "./timeline_widget";
import { renderTune, type TuneModel } from "./tune_widget";

export { explorerDefaults } from "./explorer_widget";
export { linkViews, nextStepOfUnit, unitOfStep } from "./links";
export { prefetchDefaults } from "./prefetch_widget";
export { timelineDefaults } from "./timeline_view";
export { tuneDefaults } from "./tune_widget";
export type { ExplorerModel, PrefetchModel, TimelineModel, TuneModel };

export type ViewModel = TimelineModel | ExplorerModel | PrefetchModel | TuneModel;

/** The event a view sends up the page when the notebook output it is in should save other
 * data (`saved_output`: the output's mimetypes and their data, as Python made them for what the
 * views show now; fsdpviz's JupyterLab extension puts them in the output). */
export const SAVED_EVENT = "fsdpviz-saved";

/** Send the model's `saved_output` (set after a re-plan) up the page as {@link SAVED_EVENT}. */
function announceSaved(
  model: AnyModel<{ saved_output?: Record<string, unknown> }>,
  el: HTMLElement,
): () => void {
  const announce = (): void => {
    const saved = model.get("saved_output");
    if (saved && Object.keys(saved).length > 0)
      el.dispatchEvent(new CustomEvent(SAVED_EVENT, { bubbles: true, detail: saved }));
  };
  model.on("change:saved_output", announce);
  return () => model.off("change:saved_output", announce);
}

function renderView(model: AnyModel<ViewModel>, el: HTMLElement): () => void {
  const view = (model as AnyModel<{ view: string }>).get("view") ?? "timeline";
  if (view === "explorer") return renderExplorer(model as AnyModel<ExplorerModel>, el);
  if (view === "prefetch") return renderPrefetch(model as AnyModel<PrefetchModel>, el);
  if (view === "timeline") return renderTimeline(model as AnyModel<TimelineModel>, el);
  if (view === "tune") return renderTune(model as AnyModel<TuneModel>, el);
  const pre = document.createElement("pre");
  pre.className = "fv-error";
  pre.textContent = `fsdpviz: no view named '${view}' (timeline, explorer, prefetch or tune)`;
  el.appendChild(pre);
  return () => pre.remove();
}

/** Draw the view the model names into `el`; returns what removes it. */
function render({ model, el }: RenderProps<ViewModel>): () => void {
  const stop = renderView(model, el);
  const stopSaved = announceSaved(
    model as AnyModel<{ saved_output?: Record<string, unknown> }>,
    el,
  );
  return () => {
    stopSaved();
    stop();
  };
}

export default { render };
