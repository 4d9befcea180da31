// What the explorer and the prefetch graph share: a root element holding a canvas and
// its hover box, errors shown under the view instead of lost, and the pointer, the view's
// width and the page's theme bound to what each view does with them.
import {
  bindControlKeys,
  bindPointer,
  element,
  guarded,
  showViewError,
  Tooltip,
  zoomButtons,
} from "./dom";
import { watchTheme } from "./theme";

export abstract class CanvasView {
  readonly root: HTMLElement;
  readonly canvas: HTMLCanvasElement;
  readonly stage: HTMLElement;
  readonly tooltip: Tooltip;
  disposed = false;
  /** Milliseconds the last draw took (the benchmark reads them). */
  lastDrawMs = 0;
  private readonly stops: Array<() => void> = [];

  constructor(
    el: HTMLElement,
    className: string,
    label: string,
    private readonly what: string,
  ) {
    this.root = element("div", `${className} fsdpviz-view`);
    el.appendChild(this.root);
    this.canvas = element("canvas", "fv-canvas");
    this.canvas.tabIndex = 0;
    this.canvas.setAttribute("aria-label", label);
    this.stage = element("div", "fv-stage");
    this.stage.append(this.canvas);
    this.tooltip = new Tooltip(this.stage);
    (this.root as unknown as { fsdpviz: CanvasView }).fsdpviz = this;
  }

  /** `fn` with any error shown under the view instead of lost. */
  guard(fn: () => void): () => void {
    return guarded(fn, (err) => this.showError(err));
  }

  /** Where errors go besides the view (a widget tells Python through its model). */
  onError: ((text: string) => void) | null = null;

  showError(err: unknown): void {
    const text = showViewError(this.root, this.what, err);
    console.error(err);
    this.onError?.(text);
  }

  /** The pointer moved to (x, y) of the canvas (CSS pixels). */
  abstract hoverAt(x: number, y: number): void;
  abstract clickAt(x: number, y: number): void;
  abstract leave(): void;
  /** Whether a drag moves the view up and down too (a scatter), not only across. */
  protected dragsBothWays = false;
  /** Lay out again at the root's width and the page's theme, and draw. */
  abstract resize(): void;
  /** A drag starts: returns what moves the view by `dx` (and `dy`) px from where it started. */
  protected abstract dragFrom(): (dx: number, dy: number) => void;
  /** ctrl/shift + wheel at (x, y): zoom by `factor` (> 1: show more) around it. */
  protected abstract wheelAt(x: number, factor: number, y: number): void;
  /** What a key does on the canvas, if anything. */
  protected abstract keyAction(key: string): (() => void) | undefined;
  /** Zoom by `factor` (> 1: show more) around the middle. */
  abstract zoom(factor: number): void;

  /** The view's zoom buttons (−, +, "all": `showAll`; see `zoomButtons`), titled `titles`. */
  protected zoomBar(titles: [string, string, string], showAll: () => void): HTMLElement {
    const bar = element("span", "fv-zoom");
    bar.append(
      ...zoomButtons(
        titles,
        (factor) => this.zoom(factor),
        showAll,
        (fn) => this.guard(fn),
      ),
    );
    return bar;
  }

  /** Mouse, wheel and keys on the canvas, the root's width and the page's theme. */
  protected listen(): void {
    this.stops.push(
      bindPointer(
        this.canvas,
        {
          hover: (x, y) => this.hoverAt(x, y),
          click: (x, y) => this.clickAt(x, y),
          leave: () => this.leave(),
          dragFrom: () => this.dragFrom(),
          dragsBothWays: this.dragsBothWays,
          wheel: (x, factor, y) => this.wheelAt(x, factor, y),
          keyAction: (key) => this.keyAction(key),
        },
        (fn) => this.guard(fn),
      ),
      bindControlKeys(
        this.root,
        (key) => this.keyAction(key),
        (fn) => this.guard(fn),
      ),
    );
    if (typeof ResizeObserver === "function") {
      let last = 0;
      const observer = new ResizeObserver(
        this.guard(() => {
          const w = this.root.clientWidth;
          if (w > 0 && w !== last) {
            last = w;
            this.resize();
          }
        }),
      );
      observer.observe(this.root);
      this.stops.push(() => observer.disconnect());
    }
    this.stops.push(
      watchTheme(
        this.guard(() => {
          if (!this.disposed) this.resize();
        }),
      ),
    );
  }

  /** Draw `layer` (the part redrawn only when the view moves) onto the canvas; returns the
   * canvas's context scaled to CSS pixels, for what is drawn over it. */
  protected overLayer(layer: HTMLCanvasElement): CanvasRenderingContext2D | null {
    const ctx = this.canvas.getContext("2d");
    if (ctx === null) return null;
    const ratio = (typeof window !== "undefined" && window.devicePixelRatio) || 1;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    ctx.drawImage(layer, 0, 0);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    return ctx;
  }

  dispose(): void {
    this.disposed = true;
    for (const stop of this.stops) stop();
  }
}
