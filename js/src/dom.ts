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

/** A view's zoom buttons, titled `titles` in order: − (twice as much shown), + (half as
 * much) and "all" (`showAll`), each run through `guard`. */
export function zoomButtons(
  titles: [string, string, string],
  zoom: (factor: number) => void,
  showAll: () => void,
  guard: (fn: () => void) => () => void,
): HTMLButtonElement[] {
  return [
    button(
      "−",
      titles[0],
      guard(() => zoom(2)),
    ),
    button(
      "+",
      titles[1],
      guard(() => zoom(0.5)),
    ),
    button("all", titles[2], guard(showAll)),
  ];
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
 * `least` characters kept), or "" where not even that fits. Labels are never drawn smaller.
 * `keep: "end"` cuts the start instead ("…layers.12"): the end of a module's name tells
 * the modules of a model apart. */
export function fitText(
  ctx: CanvasRenderingContext2D,
  text: string,
  maxW: number,
  least = 3,
  keep: "start" | "end" = "start",
): string {
  if (maxW <= 0 || text === "") return "";
  if (ctx.measureText(text).width <= maxW) return text;
  // from the end, a name's parts stay whole: "…layers.12", not "….layers.12"
  const cut = (n: number): string =>
    keep === "end" ? `…${text.slice(text.length - n).replace(/^\./, "")}` : `${text.slice(0, n)}…`;
  let lo = 0;
  let hi = text.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (ctx.measureText(cut(mid)).width <= maxW) lo = mid;
    else hi = mid - 1;
  }
  return lo >= Math.min(least, text.length - 1) && lo > 0 ? cut(lo) : "";
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

/** What a view does with the pointer and the keys on its canvas (see {@link bindPointer}). */
export interface PointerHandlers {
  /** The pointer moved to (x, y) of the canvas (CSS pixels), not dragging. */
  hover(x: number, y: number): void;
  /** A click that ended no drag. */
  click(x: number, y: number): void;
  leave(): void;
  /** A drag starts: returns what moves the view by `dx` (and `dy`) px from where it started. */
  dragFrom(): (dx: number, dy: number) => void;
  /** Whether a drag moves the view up and down too (else only a move across starts one). */
  dragsBothWays?: boolean;
  /** ctrl/shift + wheel at (x, y): zoom by `factor` (1.25: show more, 0.8: less) around it. */
  wheel(x: number, factor: number, y: number): void;
  /** What a key does on the canvas, if anything. */
  keyAction(key: string): (() => void) | undefined;
}

/**
 * Mouse, wheel and keys on `canvas`, each through `guard`: hover, click (not after a drag),
 * drag with the left button (more than 4 px), ctrl/shift + wheel (then a hover where the
 * pointer is, so its details follow the zoom), keys. Returns what
 * removes the listener it puts on the window (a drag may end outside the canvas).
 */
export function bindPointer(
  canvas: HTMLCanvasElement,
  h: PointerHandlers,
  guard: (fn: () => void) => () => void,
): () => void {
  const at = (ev: MouseEvent): [number, number] => {
    const rect = canvas.getBoundingClientRect();
    return [ev.clientX - rect.left, ev.clientY - rect.top];
  };
  let down: { x: number; y: number; move: (dx: number, dy: number) => void } | null = null;
  let dragged = false;
  canvas.addEventListener("mousedown", (ev) => {
    down = { x: ev.clientX, y: ev.clientY, move: h.dragFrom() };
    dragged = false;
  });
  const up = (): void => {
    down = null;
  };
  window.addEventListener("mouseup", up);
  canvas.addEventListener("mousemove", (ev) => {
    if (
      down !== null &&
      (ev.buttons & 1) === 1 &&
      (dragged ||
        Math.abs(ev.clientX - down.x) > 4 ||
        (h.dragsBothWays === true && Math.abs(ev.clientY - down.y) > 4))
    ) {
      dragged = true;
      const { move, x, y } = down;
      guard(() => move(ev.clientX - x, ev.clientY - y))();
      return;
    }
    const [x, y] = at(ev);
    guard(() => h.hover(x, y))();
  });
  canvas.addEventListener("mouseleave", () => guard(() => h.leave())());
  canvas.addEventListener("click", (ev) => {
    if (dragged) return;
    const [x, y] = at(ev);
    guard(() => h.click(x, y))();
  });
  canvas.addEventListener("wheel", (ev) => {
    if (!ev.ctrlKey && !ev.shiftKey) return;
    ev.preventDefault();
    const [x, y] = at(ev);
    guard(() => h.wheel(x, ev.deltaY > 0 ? 1.25 : 0.8, y))();
    // what is under the pointer now: the hover details follow the zoom
    guard(() => h.hover(x, y))();
  });
  canvas.addEventListener("keydown", (ev) => {
    const action = h.keyAction(ev.key);
    if (action === undefined) return;
    ev.preventDefault();
    ev.stopPropagation(); // the view's key, not the notebook's (JupyterLab's shortcuts)
    guard(action)();
  });
  return () => window.removeEventListener("mouseup", up);
}

/**
 * The view's keys where its own controls have the keyboard focus (a click on the play
 * button leaves it there): on a button, the view's keys step, play and jump as on the
 * canvas (space and Enter still press the button); on a slider or a list, its own keys
 * move it. Either way the key is the view's, not the notebook's (JupyterLab's shortcuts
 * would otherwise act on it). Returns what removes the listener.
 */
export function bindControlKeys(
  root: HTMLElement,
  keyAction: (key: string) => (() => void) | undefined,
  guard: (fn: () => void) => () => void,
): () => void {
  const onKey = (ev: KeyboardEvent): void => {
    const t = ev.target;
    if (t instanceof HTMLButtonElement) {
      if (ev.key === " " || ev.key === "Enter") {
        ev.stopPropagation(); // the button's press
        return;
      }
      const action = keyAction(ev.key);
      if (action === undefined) return;
      ev.preventDefault();
      ev.stopPropagation();
      guard(action)();
    } else if (
      t instanceof HTMLSelectElement ||
      (t instanceof HTMLInputElement && t.type === "range")
    )
      ev.stopPropagation();
  };
  root.addEventListener("keydown", onKey);
  return () => root.removeEventListener("keydown", onKey);
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
