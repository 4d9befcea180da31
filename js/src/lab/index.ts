// fsdpviz's JupyterLab extension (built into fsdpviz/labextension by @jupyterlab/builder,
// shipped in the wheel under share/jupyter/labextensions/fsdpviz):
//
// - a renderer for `application/vnd.fsdpviz.report+json`, the outputs fsdpviz puts in a
//   notebook next to its live widget (`report.show()`, the card, recordings, comparisons,
//   diagnoses). While the kernel that made the output still holds the widget, the live
//   widget is shown; in a saved notebook reopened without it, the same views are drawn
//   from the output's data, by the page's own drawing path (page.ts `drawViews`), with
//   stepping, hover, click, the explorer and the prefetch graph, and no kernel;
// - a document: a report saved as `.fsdpviz.json` (`report.save("x.fsdpviz.json")`) opens
//   from the file browser as the interactive page; "Open With > fsdpviz report" offers the
//   same for the Chrome trace `.json` fsdpviz writes.
import type { JupyterFrontEnd, JupyterFrontEndPlugin } from "@jupyterlab/application";
import { MimeDocumentFactory } from "@jupyterlab/docregistry";
import { INotebookTracker, type NotebookPanel } from "@jupyterlab/notebook";
import { IRenderMimeRegistry } from "@jupyterlab/rendermime";
import type { IRenderMime } from "@jupyterlab/rendermime-interfaces";
import { Panel, Widget } from "@lumino/widgets";
import { type DrawnViews, drawViews, type PageConfig, unpackText, type ViewName } from "../page";
import * as widget from "../widget";
import { SAVED_EVENT } from "../widget";

/** The mimetype of fsdpviz's notebook outputs (fsdpviz.export's `MIME`). */
export const MIME = "application/vnd.fsdpviz.report+json";
/** The mimetype a report file is rendered as (the document's whole JSON). */
export const DOCUMENT_MIME = "application/vnd.fsdpviz.document+json";
const WIDGET_MIME = "application/vnd.jupyter.widget-view+json";
/** The key of a report file (`.fsdpviz.json`, or a Chrome trace fsdpviz wrote) that holds
 * the page (fsdpviz.export's `PAGE_KEY`). */
export const PAGE_KEY = "fsdpviz_page";
/** Before JupyterLab's widget renderer (rank -10): a live widget is still shown, by it. */
const RANK = -20;
/** How long a live widget may take to appear before the views are drawn from the data. */
const LIVE_WAIT_MS = 4000;

/** What fsdpviz puts under {@link MIME} (and under {@link PAGE_KEY} in a report file). */
export interface ReportData {
  version: string;
  title: string;
  /** The page's summary as HTML (a report file), or "" (a notebook output). */
  header: string;
  /** The page's config ({@link PageConfig}), packed as the page packs it. */
  config: string;
}

const VIEW_TITLES: Record<ViewName, string> = {
  timeline: "Timeline",
  explorer: "Wrap units",
  prefetch: "Prefetch graph",
};

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string,
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

function isReportData(value: unknown): value is ReportData {
  const v = value as Partial<ReportData> | null;
  return typeof v === "object" && v !== null && typeof v.config === "string";
}

/**
 * The views of one report, drawn from its data into `host`: a heading per view and the
 * view under it. Returns what removes them.
 */
export async function drawReport(host: HTMLElement, data: ReportData): Promise<DrawnViews> {
  const config = JSON.parse(await unpackText(data.config, "the report's data")) as PageConfig;
  const els: Record<ViewName, HTMLElement | null> = {
    timeline: null,
    explorer: null,
    prefetch: null,
  };
  for (const name of ["timeline", "explorer", "prefetch"] as const) {
    if (!config.views[name]) continue;
    const section = element("section", `fv-lab-section fv-lab-${name}`);
    section.appendChild(element("h3", "fv-lab-heading", VIEW_TITLES[name]));
    const el = element("div", "fv-lab-view");
    el.dataset.fvView = name;
    section.appendChild(el);
    host.appendChild(section);
    els[name] = el;
  }
  const drawn = await drawViews(widget, config, els);
  host.dataset.fvDrawn = "true";
  return drawn;
}

function showError(host: HTMLElement, err: unknown): void {
  const pre = element("pre", "fv-error", `fsdpviz: ${err instanceof Error ? err.message : err}`);
  host.appendChild(pre);
  console.error(err);
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * A notebook output of fsdpviz. With a live widget in the bundle (the widget view
 * mimetype) and a notebook whose kernel still holds it, the live widget is shown (by
 * JupyterLab's widget renderer, inside this one); otherwise the views are drawn from the
 * output's data. A card (`text/html` in the bundle) is shown as it is, its views under a
 * disclosure, drawn when first opened.
 */
class ReportOutput extends Panel implements IRenderMime.IRenderer {
  private model: IRenderMime.IMimeModel | null = null;
  private drawn: DrawnViews | null = null;
  private staticHost: Widget | null = null;
  private started = false;
  private observer: MutationObserver | null = null;

  constructor(
    private readonly options: IRenderMime.IRendererOptions,
    private readonly tracker: {
      find(fn: (p: NotebookPanel) => boolean): NotebookPanel | undefined;
    } | null,
  ) {
    super();
    this.addClass("fv-lab-output");
    this.node.addEventListener(SAVED_EVENT, (ev) => this.save(ev as CustomEvent));
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    if (model === this.model && this.node.dataset.fvLive === "true") return; // its data saved
    this.model = model;
    this.started = false;
    this.reset();
    if (this.isAttached) void this.start();
  }

  /**
   * The live views changed what they show (a re-plan): the output keeps the data Python
   * made for it, so the notebook saves the plan on screen, not the first one. The model's
   * own data is set (the notebook marks itself changed); the live widget stays as it is.
   */
  private save(ev: CustomEvent): void {
    const model = this.model;
    const saved = ev.detail as Record<string, unknown> | null;
    if (model === null || saved === null || typeof saved !== "object") return;
    if (!isReportData(saved[MIME])) return;
    ev.stopPropagation();
    const data = { ...model.data, ...saved } as typeof model.data;
    model.setData({ data });
    this.node.dataset.fvSaved = String(Number(this.node.dataset.fvSaved ?? "0") + 1);
  }

  protected onAfterAttach(msg: unknown): void {
    super.onAfterAttach(msg as never);
    if (this.model !== null && !this.started) void this.start();
  }

  dispose(): void {
    if (this.isDisposed) return;
    this.reset();
    super.dispose();
  }

  private reset(): void {
    this.observer?.disconnect();
    this.observer = null;
    this.drawn?.dispose();
    this.drawn = null;
    for (const child of [...this.widgets]) child.dispose();
    this.staticHost = null;
  }

  private async start(): Promise<void> {
    const model = this.model;
    if (model === null) return;
    this.started = true;
    const live = model.data[WIDGET_MIME] as { model_id?: string } | undefined;
    const panel = live?.model_id
      ? this.tracker?.find((p) => p.node.contains(this.node))
      : undefined;
    if (panel === undefined) {
      this.showStatic(model, "saved");
      return;
    }
    const session = panel.sessionContext;
    if (session.isReady && session.session?.kernel) {
      // a running kernel: most likely the one that made the widget (a cell just run)
      if (await this.tryLive(panel, model, LIVE_WAIT_MS)) return;
      if (this.model === model && this.staticHost === null) this.showStatic(model, "saved");
      return;
    }
    // the notebook is opening: draw the views now, and show the live widget instead if
    // the kernel it connects to still holds it (a page reloaded while the kernel ran)
    this.showStatic(model, "saved");
    await session.ready;
    await delay(0); // JupyterLab's widget manager is registered once the session is ready
    if (this.model === model && session.session?.kernel) await this.tryLive(panel, model, 0);
  }

  /** Show the live widget if the notebook's widget manager has its model. */
  private async tryLive(
    panel: NotebookPanel,
    model: IRenderMime.IMimeModel,
    waitMs: number,
  ): Promise<boolean> {
    const rendermime = panel.content.rendermime;
    if (!rendermime.mimeTypes.includes(WIDGET_MIME)) return false;
    const renderer = rendermime.createRenderer(WIDGET_MIME) as IRenderMime.IRenderer & Panel;
    renderer.hide();
    this.addWidget(renderer);
    const shown = (): boolean => renderer.widgets.length > 0;
    const swap = (): void => {
      if (this.model !== model || renderer.isDisposed) return;
      this.observer?.disconnect();
      this.observer = null;
      this.drawn?.dispose();
      this.drawn = null;
      this.staticHost?.dispose();
      this.staticHost = null;
      renderer.show();
      this.node.dataset.fvLive = "true";
    };
    const rendered = renderer.renderModel(model).catch(() => undefined);
    await (waitMs > 0 ? Promise.race([rendered, delay(waitMs)]) : rendered);
    if (shown()) {
      swap();
      return true;
    }
    // JupyterLab may still restore it from the kernel: show it then
    this.observer = new MutationObserver(() => {
      if (shown()) swap();
    });
    this.observer.observe(renderer.node, { childList: true });
    return false;
  }

  private showStatic(model: IRenderMime.IMimeModel, how: "saved"): void {
    const data = model.data[MIME];
    const host = new Widget();
    host.addClass("fv-lab-static");
    this.staticHost = host;
    this.addWidget(host);
    const card = model.data["text/html"];
    if (!isReportData(data)) {
      showError(host.node, new Error("the output's data is not a report fsdpviz wrote"));
      return;
    }
    host.node.dataset.fvShown = how;
    if (typeof card === "string") {
      // a card: shown as it is, its views drawn when first asked for
      const div = element("div", "fv-lab-card");
      div.innerHTML = model.trusted ? card : this.options.sanitizer.sanitize(card);
      host.node.appendChild(div);
      const details = element("details", "fv-lab-details");
      details.appendChild(
        element("summary", "", "Timeline, wrap units and prefetch graph (interactive)"),
      );
      const views = element("div", "fv-lab-views");
      details.appendChild(views);
      host.node.appendChild(details);
      details.addEventListener("toggle", () => {
        if (details.open && views.childElementCount === 0) this.draw(views, data, model);
      });
      return;
    }
    const views = element("div", "fv-lab-views");
    host.node.appendChild(views);
    host.node.appendChild(
      element(
        "p",
        "fv-lab-note",
        "Drawn from the notebook's saved output (fsdpviz " +
          `${data.version}): run the cell again for the live views and their controls.`,
      ),
    );
    this.draw(views, data, model);
  }

  private draw(views: HTMLElement, data: ReportData, model: IRenderMime.IMimeModel): void {
    drawReport(views, data).then(
      (drawn) => {
        if (this.model === model && views.isConnected) this.drawn = drawn;
        else drawn.dispose();
      },
      (err: unknown) => showError(views, err),
    );
  }
}

/** A report file opened as a document: the page's summary and its views. */
class ReportDocument extends Widget implements IRenderMime.IRenderer {
  private drawn: DrawnViews | null = null;

  constructor(private readonly options: IRenderMime.IRendererOptions) {
    super();
    this.addClass("fv-lab-document");
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this.drawn?.dispose();
    this.drawn = null;
    this.node.textContent = "";
    const file = model.data[this.options.mimeType] as Record<string, unknown> | null;
    const data = file !== null && typeof file === "object" ? file[PAGE_KEY] : undefined;
    if (!isReportData(data)) {
      showError(
        this.node,
        new Error(
          "this JSON file holds no fsdpviz page. fsdpviz opens the files it writes: " +
            'report.save("report.fsdpviz.json"), or a Chrome trace report.save("trace.json")',
        ),
      );
      return;
    }
    if (data.header) {
      const header = element("div", "fv-lab-header");
      header.innerHTML = this.options.sanitizer.sanitize(data.header);
      this.node.appendChild(header);
    }
    const views = element("div", "fv-lab-views");
    this.node.appendChild(views);
    try {
      this.drawn = await drawReport(views, data);
    } catch (err) {
      showError(views, err);
    }
  }

  dispose(): void {
    this.drawn?.dispose();
    this.drawn = null;
    super.dispose();
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: "fsdpviz:plugin",
  description: "fsdpviz's views from saved notebook outputs, and its report files as pages",
  autoStart: true,
  requires: [IRenderMimeRegistry],
  optional: [INotebookTracker],
  activate(
    app: JupyterFrontEnd,
    rendermime: IRenderMimeRegistry,
    tracker: INotebookTracker | null,
  ): void {
    rendermime.addFactory(
      {
        safe: true,
        mimeTypes: [MIME],
        defaultRank: RANK,
        createRenderer: (options) => new ReportOutput(options, tracker),
      },
      RANK,
    );
    const registry = app.docRegistry;
    registry.addFileType({
      name: "fsdpviz-report",
      displayName: "fsdpviz report",
      extensions: [".fsdpviz.json"],
      mimeTypes: [DOCUMENT_MIME],
      contentType: "file",
      fileFormat: "text",
    });
    const documentRenderer: IRenderMime.IRendererFactory = {
      safe: true,
      mimeTypes: [DOCUMENT_MIME],
      createRenderer: (options) => new ReportDocument(options),
    };
    rendermime.addFactory(documentRenderer, RANK);
    registry.addWidgetFactory(
      new MimeDocumentFactory({
        name: "fsdpviz report",
        label: "fsdpviz report",
        fileTypes: ["fsdpviz-report", "json"],
        defaultFor: ["fsdpviz-report"],
        primaryFileType: registry.getFileType("fsdpviz-report"),
        rendermime,
        dataType: "json",
        renderTimeout: 60_000,
        factory: documentRenderer,
      }),
    );
  },
};

export default [plugin];
