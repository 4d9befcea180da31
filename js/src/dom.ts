// What every view of the front end builds its elements with: tags with a class, buttons
// with a title, a canvas sized for the screen's pixel ratio, text fitted to a width, and
// the hover box.

export function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  el.className = className;
  return el;
}

export function button(label: string, title: string, onClick: () => void): HTMLButtonElement {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.title = title;
  b.setAttribute("aria-label", title);
  b.addEventListener("click", onClick);
  return b;
}

/** Give `canvas` `width` x `height` CSS pixels, drawn at the screen's pixel ratio; returns
 * its context scaled to CSS pixels (null where the browser has no 2-D canvas). */
export function sizeCanvas(
  canvas: HTMLCanvasElement,
  width: number,
  height: number,
): CanvasRenderingContext2D | null {
  const ratio = (typeof window !== "undefined" && window.devicePixelRatio) || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx?.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

/** `text` as it fits `maxW` px in the context's font: whole, cut short with "…" (at least
 * `least` characters kept), or "" where not even that fits. Labels are never drawn smaller. */
export function fitText(
  ctx: CanvasRenderingContext2D,
  text: string,
  maxW: number,
  least = 3,
): string {
  if (maxW <= 0 || text === "") return "";
  if (ctx.measureText(text).width <= maxW) return text;
  let lo = 0;
  let hi = text.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (ctx.measureText(`${text.slice(0, mid)}…`).width <= maxW) lo = mid;
    else hi = mid - 1;
  }
  return lo >= Math.min(least, text.length - 1) && lo > 0 ? `${text.slice(0, lo)}…` : "";
}

/** `fn` with any error it throws handed to `onError` instead of lost. */
export function guarded(fn: () => void, onError: (err: unknown) => void): () => void {
  return (): void => {
    try {
      fn();
    } catch (err) {
      onError(err);
    }
  };
}

/** Show `err` under a view (`root`), as "fsdpviz <what> error: ..."; returns its text. */
export function showViewError(root: HTMLElement, what: string, err: unknown): string {
  const text = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  let pre = root.querySelector<HTMLPreElement>(".fv-error");
  if (pre === null) {
    pre = element("pre", "fv-error");
    root.appendChild(pre);
  }
  pre.textContent = `fsdpviz ${what} error: ${text}`;
  return text;
}

/** The box of hover details over a view's canvas: its first line in bold. */
export class Tooltip {
  readonly el: HTMLElement;

  constructor(stage: HTMLElement) {
    this.el = element("div", "fv-tooltip");
    this.el.hidden = true;
    stage.appendChild(this.el);
  }

  /** Show `lines` by the pointer at (x, y) of a stage `width` px wide (left of the
   * pointer where the box would overflow on the right). */
  show(lines: string[], x: number, y: number, width: number): void {
    this.el.replaceChildren(
      ...lines.map((t, k) => {
        const d = document.createElement(k === 0 ? "b" : "div");
        d.textContent = t;
        return d;
      }),
    );
    this.el.hidden = false;
    const w = this.el.offsetWidth || 260;
    const left = x + 14 + w > width ? Math.max(x - 14 - w, 0) : x + 14;
    this.el.style.left = `${left}px`;
    this.el.style.top = `${y + 14}px`;
  }

  hide(): void {
    this.el.hidden = true;
  }

  get shown(): boolean {
    return !this.el.hidden;
  }

  /** The lines shown (for tests). */
  get lines(): string[] {
    return [...this.el.children].map((c) => c.textContent ?? "");
  }
}

/** The line dash of an edge style as plotly names them. */
export function dashPattern(dash: string): number[] {
  const patterns: Record<string, number[]> = {
    solid: [],
    dash: [6, 4],
    dot: [2, 3],
    dashdot: [6, 3, 2, 3],
  };
  return patterns[dash] ?? [];
}
