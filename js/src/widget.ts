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

/** Draw the view the model names into `el`; returns what removes it. */
function render({ model, el }: RenderProps<ViewModel>): () => void {
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

export default { render };
