// The wrap-unit explorer: the module tree as an icicle drawn on a canvas, from the data
// fsdpviz.views.explorer_data writes. The module drawn at the top (the focus) fills the
// width; each module below takes its share of its parent's width by parameters (or bytes
// per rank), so a module's own parameters are the part of it no child covers. Every module
// is drawn, however many: a block narrower than a pixel takes a pixel column (its first
// module answers a hover there), and ctrl/shift + wheel zooms across, a drag moves along.
// A click on a block zooms into it and selects its unit; the path above leads back up.
// The current unit's blocks are outlined in the text colour, the selected unit's in orange.
import { CanvasView } from "./canvas_view";
import type { UnitDetail } from "./detail";
import { button, element, fitText, sizeCanvas } from "./dom";
import { formatBytes, moduleName, quote } from "./format";
import { FONT, type ThemeColors, takeTheme, textOn } from "./theme";

export interface ExplorerData {
  /** "834 units, world size 8". */
  title: string;
  /** One entry per module, parents before children. */
  modules: {
    name: string[];
    label: string[];
    /** Index of the parent module; -1 for the root. */
    parent: number[];
    /** Index into `classes`. */
    cls: number[];
    /** Index into `units`; -1: not managed by FSDP. */
    unit: number[];
    /** Of the module's subtree. */
    numel: number[];
    bytes: number[];
    rank_bytes: number[];
  };
  classes: string[];
  units: Array<{
    name: string;
    color: string;
    dtype: string;
    warnings: string[];
    /** Pipeline parallelism: the stage holding the unit, and the rank that runs it. */
    stage?: number;
    pp_rank?: number;
  }>;
  unmanaged_color: string;
  /** Each unit's detail panel (fsdpviz.views.detail.unit_detail), in `units` order; null
   * for one not made yet. A widget sends them as a trait of their own (`details`). */
  details?: Array<UnitDetail | null>;
}

/** What a block's width stands for. */
export type Area = "numel" | "rank_bytes";
export const AREAS: Record<Area, string> = { numel: "parameters", rank_bytes: "bytes per rank" };

export const ROW_H = 24;
const MAX_ROWS = 9;
const LABEL_PAD = 4;
/** A module found or selected elsewhere is shown at least this wide (zoomed across): room
 * for a label such as "layers.400 [unit 401]". */
export const REVEAL_PX = 160;
const MIN_SPAN = 1e-6;

export interface ExplorerEvents {
  /** A click or the find box chose module `module`: `unit` is its unit's name (null: not
   * managed by FSDP). */
  select?(unit: string | null, module: string): void;
  /** The module drawn at the top changed (its name; "" for the model). */
  focus?(module: string): void;
  /** The block width changed (the width menu). */
  area?(area: Area): void;
}

/** The tree's structure, made once per data. */
export class ModuleIndex {
  readonly n: number;
  readonly children: number[][];
  readonly depth: number[];
  /** Levels below each module (0 for a leaf). */
  readonly below: number[];
  readonly byName = new Map<string, number>();
  /** The module of each unit (where `unit` is the unit's own). */
  readonly unitModule: number[];

  constructor(readonly data: ExplorerData) {
    const m = data.modules;
    this.n = m.name.length;
    this.children = m.name.map(() => []);
    this.depth = new Array<number>(this.n).fill(0);
    this.below = new Array<number>(this.n).fill(0);
    this.unitModule = data.units.map(() => -1);
    const unitIndex = new Map(data.units.map((u, k) => [u.name, k] as [string, number]));
    for (let i = 0; i < this.n; i++) {
      const p = m.parent[i];
      if (p >= 0) {
        this.children[p].push(i);
        this.depth[i] = this.depth[p] + 1;
      }
      this.byName.set(m.name[i], i);
      const k = unitIndex.get(m.name[i]);
      if (k !== undefined) this.unitModule[k] = i;
    }
    for (let i = this.n - 1; i > 0; i--) {
      const p = m.parent[i];
      if (p >= 0) this.below[p] = Math.max(this.below[p], this.below[i] + 1);
    }
  }

  /** `i` and its ancestors, the model first. */
  path(i: number): number[] {
    const out: number[] = [];
    for (let k = i; k >= 0; k = this.data.modules.parent[k]) out.push(k);
    return out.reverse();
  }

  /** Whether `i` is `top` or below it. */
  within(i: number, top: number): boolean {
    for (let k = i; k >= 0; k = this.data.modules.parent[k]) if (k === top) return true;
    return false;
  }
}

/** The module `text` names: `(root)`, a module's name, else the first unit then module whose
 * name contains it (any case), as fsdpviz.widgets.Explorer.find; -1 when none does. */
export function findModule(index: ModuleIndex, text: string): number {
  const t = text.trim();
  if (t === "") return -1;
  if (t === "(root)") return 0;
  const exact = index.byName.get(t);
  if (exact !== undefined && t !== "") return exact;
  const low = t.toLowerCase();
  const shown = (name: string): string => moduleName(name).toLowerCase();
  const unit = index.data.units.findIndex((u) => shown(u.name).includes(low));
  if (unit >= 0 && index.unitModule[unit] >= 0) return index.unitModule[unit];
  return index.data.modules.name.findIndex((name) => shown(name).includes(low));
}

/** A label the explorer drew, with its module and its block (x, width, row). */
export interface DrawnLabel {
  node: number;
  text: string;
  x: number;
  w: number;
  row: number;
}

/** The blocks of one row, left to right: x and width in CSS pixels, and the module. */
export interface Row {
  x: number[];
  w: number[];
  node: number[];
}

/** The part of the focus's width [a, b] drawn across the canvas (0 to 1). */
export interface Span {
  a: number;
  b: number;
}

/**
 * The blocks drawn for `focus` over `rows` rows of a canvas `width` px wide, showing the
 * part `span` of the focus's width. A block narrower than a pixel takes the pixel column
 * it starts in, unless a block before it in the row already does.
 */
export function layoutIcicle(
  index: ModuleIndex,
  values: number[],
  focus: number,
  span: Span,
  width: number,
  rows: number,
): Row[] {
  const out: Row[] = Array.from({ length: rows }, () => ({ x: [], w: [], node: [] }));
  const taken = new Array<number>(rows).fill(-1); // last pixel column used in each row
  const scale = width / Math.max(span.b - span.a, MIN_SPAN);
  const stack: Array<[number, number, number, number]> = [[focus, 0, 1, 0]];
  while (stack.length > 0) {
    const [i, f0, f1, row] = stack.pop() as [number, number, number, number];
    const x0 = (f0 - span.a) * scale;
    const x1 = (f1 - span.a) * scale;
    if (x1 <= 0 || x0 >= width || row >= rows) continue;
    const r = out[row];
    if (x1 - x0 >= 1) {
      r.x.push(x0);
      r.w.push(x1 - x0);
      r.node.push(i);
      taken[row] = Math.ceil(x1) - 1;
    } else {
      const col = Math.floor(Math.max(x0, 0));
      if (col > taken[row]) {
        r.x.push(col);
        r.w.push(1);
        r.node.push(i);
        taken[row] = col;
      }
    }
    const total = values[i];
    const kids = index.children[i];
    if (!(total > 0) || kids.length === 0 || row + 1 >= rows) continue;
    const placed: Array<[number, number, number, number]> = [];
    let f = f0;
    for (const c of kids) {
      const share = ((f1 - f0) * values[c]) / total;
      if (values[c] > 0) placed.push([c, f, f + share, row + 1]);
      f += share;
    }
    for (let k = placed.length - 1; k >= 0; k--) stack.push(placed[k]);
  }
  return out;
}

/**
 * A block's label as it fits `room` px: whole; else, for a dotted name, its end, which
 * tells a model's modules apart ("…layers.12 [unit 13]", then "…layers.12" without its
 * unit's number), and for a leaf's own name its start ("gate_p…"); else nothing. Labels
 * are never drawn smaller.
 */
export function fitBlockLabel(ctx: CanvasRenderingContext2D, label: string, room: number): string {
  if (ctx.measureText(label).width <= room) return label;
  const keep = (name: string): "start" | "end" => (name.includes(".") ? "end" : "start");
  const unit = /^(.*) (\[unit \d+\])$/.exec(label);
  if (unit !== null) {
    const [, name, number] = unit;
    const suffix = ` ${number}`;
    const room1 = room - ctx.measureText(suffix).width;
    const withNumber = fitText(ctx, name, room1, 6, keep(name));
    if (withNumber !== "") return withNumber + suffix;
    return fitText(ctx, name, room, 3, keep(name));
  }
  return fitText(ctx, label, room, 3, keep(label));
}

/** The block of `row` under x (the last one starting at or before it that covers it). */
function blockAt(r: Row, x: number): number {
  let lo = 0;
  let hi = r.x.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (r.x[mid] <= x) {
      found = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return found >= 0 && x <= r.x[found] + Math.max(r.w[found], 1) ? found : -1;
}

let lists = 0; // the find boxes' lists of units, one id each in a page

/** The explorer of one page or widget: its elements, its state and its drawing. */
export class ExplorerView extends CanvasView {
  readonly crumbs: HTMLElement;
  readonly titleEl: HTMLElement;
  readonly areaSelect: HTMLSelectElement;
  /** The find box: a unit or module by name, (root), or a part of a name. */
  readonly findInput: HTMLInputElement;
  readonly findNote: HTMLElement;
  private readonly findList: HTMLDataListElement;
  data: ExplorerData;
  index: ModuleIndex;
  area: Area = "numel";
  focus = 0;
  span: Span = { a: 0, b: 1 };
  /** Units (indices) outlined: the current step's, and the selected one. */
  current = -1;
  selected = -1;
  hovered = -1;
  rows: Row[] = [];
  theme: ThemeColors;
  width = 600;
  private measured = false; // the width was measured (the view was in the page)
  private readonly layer: HTMLCanvasElement;
  private nRows = 1;
  private labels: DrawnLabel[] = [];

  constructor(
    el: HTMLElement,
    data: ExplorerData,
    private readonly events: ExplorerEvents = {},
  ) {
    super(
      el,
      "fsdpviz-explorer",
      "module tree coloured by wrap unit; click a block to zoom into it, Backspace goes up, " +
        "+ and − zoom across, arrow keys move along",
      "explorer",
    );
    const header = element("div", "fv-header");
    this.titleEl = element("span", "fv-title");
    this.areaSelect = element("select", "fv-area");
    this.areaSelect.title = "what a block's width stands for";
    this.areaSelect.setAttribute("aria-label", "block width");
    for (const [value, text] of Object.entries(AREAS))
      this.areaSelect.add(new Option(`width: ${text}`, value));
    this.areaSelect.addEventListener(
      "change",
      this.guard(() => {
        const area = this.areaSelect.value === "rank_bytes" ? "rank_bytes" : "numel";
        this.setArea(area);
        this.events.area?.(area);
      }),
    );
    const find = element("label", "fv-find");
    find.append("find ");
    this.findInput = element("input", "fv-find-input");
    this.findInput.type = "search";
    this.findInput.placeholder = "a unit or module";
    this.findInput.autocomplete = "off";
    this.findInput.setAttribute("aria-label", "find a unit or module");
    this.findList = element("datalist", "fv-find-units");
    this.findList.id = `fv-find-units-${++lists}`;
    this.findInput.setAttribute("list", this.findList.id);
    this.findNote = element("span", "fv-hint");
    this.findNote.setAttribute("role", "status");
    find.append(this.findInput, this.findList);
    // Enter (or a name picked from the list) finds, once; Enter goes no further (in
    // JupyterLab it would edit the cell instead)
    let last = "";
    const typed = this.guard(() => {
      if (this.findInput.value === last) return;
      last = this.findInput.value;
      this.findTyped();
    });
    this.findInput.addEventListener("change", typed);
    this.findInput.addEventListener("keydown", (ev) => {
      ev.stopPropagation();
      if (ev.key !== "Enter") return;
      ev.preventDefault();
      last = "";
      typed();
    });
    const zoom = this.zoomBar(
      [
        "zoom out across (ctrl/shift + wheel)",
        "zoom in across (ctrl/shift + wheel)",
        "the whole width of the module at the top",
      ],
      () => this.showSpan({ a: 0, b: 1 }),
    );
    header.append(this.titleEl, this.areaSelect, zoom, find, this.findNote);
    this.crumbs = element("nav", "fv-crumbs");
    this.crumbs.setAttribute("aria-label", "modules above the top block");
    const hint = element("div", "fv-note");
    hint.textContent =
      "Click a block to zoom into it and select its unit; the path above leads back up. " +
      "ctrl/shift + wheel zooms across, a drag moves along.";
    this.root.append(header, this.crumbs, this.stage, hint);
    this.layer = document.createElement("canvas");
    this.data = data;
    this.index = new ModuleIndex(data);
    this.theme = takeTheme(this.root);
    this.listen();
    this.setData(data);
  }

  /** New data (a re-plan): the same module stays at the top where it still exists. */
  setData(data: ExplorerData): void {
    const focusName = this.data.modules.name[this.focus] ?? "";
    const current = this.unitName(this.current);
    const selected = this.unitName(this.selected);
    this.data = data;
    this.index = new ModuleIndex(data);
    this.focus = this.index.byName.get(focusName) ?? 0;
    this.current = this.unitIndex(current);
    this.selected = this.unitIndex(selected);
    this.hovered = -1;
    this.titleEl.textContent = data.title;
    this.findList.replaceChildren(...data.units.map((u) => new Option(moduleName(u.name))));
    this.nRows = Math.min(this.index.below[0] + 1, MAX_ROWS);
    // at the width and theme read last (see TimelineView.relayout)
    if (this.measured) this.draw();
    else this.resize();
  }

  private unitName(k: number): string | null {
    return k >= 0 ? (this.data.units[k]?.name ?? null) : null;
  }

  private unitIndex(name: string | null): number {
    return name === null ? -1 : this.data.units.findIndex((u) => u.name === name);
  }

  values(): number[] {
    return this.data.modules[this.area];
  }

  setArea(area: Area): void {
    this.area = area;
    this.areaSelect.value = area;
    this.draw();
  }

  /** The unit outlined as the current step's (null: none). */
  setCurrent(unit: string | null): void {
    const k = this.unitIndex(unit);
    if (k === this.current) return;
    this.current = k;
    this.paint();
  }

  /** The unit outlined as selected; `reveal`: brought into view if it is not drawn (the
   * module picked in it, `module`, where there is one). */
  setSelected(unit: string | null, reveal = true, module: string | null = null): void {
    this.selected = this.unitIndex(unit);
    if (reveal && this.selected >= 0) {
      const picked = module === null ? undefined : this.index.byName.get(module);
      const i = picked ?? this.index.unitModule[this.selected];
      if (i >= 0) this.reveal(i);
    }
    this.paint();
  }

  /** Draw module `i` at the top. */
  focusOn(i: number): void {
    if (i < 0 || i >= this.index.n) return;
    const changed = i !== this.focus;
    this.focus = i;
    this.span = { a: 0, b: 1 };
    this.hovered = -1;
    this.tooltip.hide();
    this.draw();
    if (changed) this.events.focus?.(this.data.modules.name[i]);
  }

  /** Show module `i` at least REVEAL_PX wide: from its parent when it is not below the
   * module at the top, zoomed across to it when it is narrower. */
  reveal(i: number): void {
    if (!this.index.within(i, this.focus)) {
      const p = this.data.modules.parent[i];
      this.focusOn(i === 0 ? 0 : p >= 0 ? p : 0);
    }
    const where = this.fractionOf(i);
    if (where === null) return;
    const [f0, f1] = where;
    const shown = this.span.b - this.span.a;
    const drawn = ((f1 - f0) / shown) * this.width;
    const inside = f0 >= this.span.a && f1 <= this.span.b;
    if (inside && drawn >= Math.min(REVEAL_PX, this.width)) return;
    // zoomed in until it is REVEAL_PX wide (never out), or out until all of it fits
    const narrow = drawn < REVEAL_PX ? ((f1 - f0) * this.width) / REVEAL_PX : shown;
    const w = Math.max(Math.min(shown, narrow), f1 - f0);
    const mid = (f0 + f1) / 2;
    this.showSpan({ a: mid - w / 2, b: mid + w / 2 });
  }

  /** Where module `i` lies across the module at the top (0 to 1), or null when it is
   * not below it or has no width. */
  fractionOf(i: number): [number, number] | null {
    const path = this.index.path(i);
    const from = path.indexOf(this.focus);
    if (from < 0) return null;
    const values = this.values();
    let f0 = 0;
    let f1 = 1;
    for (let k = from; k < path.length - 1; k++) {
      const parent = path[k];
      const total = values[parent];
      if (!(total > 0)) return null;
      let f = f0;
      for (const c of this.index.children[parent]) {
        const share = ((f1 - f0) * values[c]) / total;
        if (c === path[k + 1]) {
          f0 = f;
          f1 = f + share;
          break;
        }
        f += share;
      }
    }
    return f1 > f0 ? [f0, f1] : null;
  }

  /** The module named (see findModule) at the top, or its parent for a module without
   * children, and its unit selected. Returns the module's index, -1 when none matches. */
  find(text: string): number {
    const i = findModule(this.index, text);
    if (i < 0) return -1;
    const p = this.data.modules.parent[i];
    this.focusOn(this.index.children[i].length > 0 || p < 0 ? i : p);
    this.reveal(i);
    this.choose(i);
    return i;
  }

  /** The find box's answer: the module it names drawn and its unit selected, or why not. */
  findTyped(): void {
    const text = this.findInput.value;
    if (text.trim() === "") return;
    const i = this.find(text);
    this.findNote.textContent =
      i < 0
        ? `no unit or module matches '${text.trim()}': type a part of a module name, or (root)`
        : `found ${quote(this.data.modules.name[i])}`;
    this.root.dataset.fvFound = i < 0 ? "" : this.data.modules.name[i];
  }

  /** Show the part `span` of the top module's width. */
  showSpan(span: Span): void {
    const w = Math.min(Math.max(span.b - span.a, MIN_SPAN), 1);
    const a = Math.min(Math.max(span.a, 0), 1 - w);
    this.span = { a, b: a + w };
    this.draw();
  }

  /** Zoom across by `factor` (2: twice as much shown) around `at` (0 to 1 of the width). */
  zoom(factor: number, at = 0.5): void {
    const w = this.span.b - this.span.a;
    const nw = Math.min(Math.max(w * factor, MIN_SPAN), 1);
    const pivot = this.span.a + at * w;
    this.showSpan({ a: pivot - at * nw, b: pivot - at * nw + nw });
  }

  resize(): void {
    const measured = this.root.clientWidth;
    if (measured > 0) {
      this.width = Math.max(measured, 240);
      this.measured = true;
    }
    this.theme = takeTheme(this.root);
    this.draw();
  }

  /** Lay the blocks out and draw them into the layer, then paint. */
  draw(): void {
    const start = performance.now();
    this.rows = layoutIcicle(
      this.index,
      this.values(),
      this.focus,
      this.span,
      this.width,
      this.nRows,
    );
    const height = this.nRows * ROW_H;
    const lctx = sizeCanvas(this.layer, this.width, height);
    sizeCanvas(this.canvas, this.width, height);
    if (lctx !== null) this.drawBlocks(lctx);
    this.writeCrumbs();
    this.paint();
    this.root.dataset.fvFocus = this.data.modules.name[this.focus];
    this.root.dataset.fvSpan = `${this.span.a},${this.span.b}`;
    this.lastDrawMs = performance.now() - start;
  }

  private colorOf(i: number): string {
    const u = this.data.modules.unit[i];
    return u >= 0
      ? (this.data.units[u]?.color ?? this.data.unmanaged_color)
      : this.data.unmanaged_color;
  }

  private drawBlocks(ctx: CanvasRenderingContext2D): void {
    const t = this.theme;
    ctx.fillStyle = t.bg;
    ctx.fillRect(0, 0, this.width, this.nRows * ROW_H);
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    const labels = this.data.modules.label;
    this.labels = [];
    this.rows.forEach((r, row) => {
      const y = row * ROW_H;
      for (let k = 0; k < r.x.length; k++) {
        const x = r.x[k];
        const w = r.w[k];
        const fill = this.colorOf(r.node[k]);
        ctx.fillStyle = fill;
        // a pixel of the background between blocks wide enough to spare it
        ctx.fillRect(x, y, w >= 3 ? w - 1 : w, ROW_H - 1);
        const left = Math.max(x, 0) + LABEL_PAD;
        const room = Math.min(x + w, this.width) - left - LABEL_PAD;
        const text = room >= 12 ? fitBlockLabel(ctx, labels[r.node[k]], room) : "";
        if (text !== "") {
          ctx.fillStyle = textOn(fill);
          ctx.fillText(text, left, y + ROW_H / 2);
          this.labels.push({ node: r.node[k], text, x, w, row });
        }
      }
    });
  }

  /** The layer, then the current and selected units' outlines and the hovered block. */
  paint(): void {
    const ctx = this.overLayer(this.layer);
    if (ctx === null) return;
    const units = this.data.modules.unit;
    const outline = (unit: number, color: string, width: number): void => {
      if (unit < 0) return;
      ctx.strokeStyle = color;
      ctx.lineWidth = width;
      this.rows.forEach((r, row) => {
        for (let k = 0; k < r.x.length; k++) {
          if (units[r.node[k]] !== unit) continue;
          const w = Math.max(r.w[k] - 1, 1);
          ctx.strokeRect(
            r.x[k] + width / 2,
            row * ROW_H + width / 2,
            Math.max(w - width, 0.5),
            ROW_H - 1 - width,
          );
        }
      });
    };
    outline(this.current, this.theme.fg, 2);
    outline(this.selected, this.theme.accent, 2);
    if (this.hovered >= 0) {
      const at = this.slotOf(this.hovered);
      if (at !== null) {
        ctx.strokeStyle = this.theme.fg;
        ctx.lineWidth = 1;
        ctx.setLineDash([3, 2]);
        ctx.strokeRect(at.x + 0.5, at.y + 0.5, Math.max(at.w - 2, 1), ROW_H - 2);
        ctx.setLineDash([]);
      }
    }
    const ds = this.root.dataset;
    ds.fvCurrentUnit = this.unitName(this.current) ?? "";
    ds.fvSelectedUnit = this.unitName(this.selected) ?? "";
  }

  private writeCrumbs(): void {
    const names = this.data.modules.name;
    const path = this.index.path(this.focus);
    const parts: Array<string | HTMLElement> = [];
    path.forEach((i, k) => {
      const text =
        i === 0
          ? "(root)"
          : names[i].slice(names[path[k - 1]].length + (path[k - 1] === 0 ? 0 : 1));
      if (k > 0) parts.push(" › ");
      if (i === this.focus) {
        const b = element("b", "fv-crumb-here");
        b.textContent = text;
        parts.push(b);
      } else {
        parts.push(
          button(
            text,
            `draw ${i === 0 ? "the whole model" : quote(names[i])} at the top`,
            this.guard(() => this.focusOn(i)),
          ),
        );
      }
    });
    const zoomed = this.span.b - this.span.a < 1 - 1e-9;
    if (zoomed) {
      const note = element("span", "fv-hint");
      note.textContent = ` · zoomed ${Number((1 / (this.span.b - this.span.a)).toPrecision(2))}× across`;
      parts.push(note);
    }
    this.crumbs.replaceChildren(...parts);
  }

  /** The module at (x, y) of the canvas (CSS pixels), or -1. */
  pickAt(x: number, y: number): number {
    const row = Math.floor(y / ROW_H);
    const r = this.rows[row];
    if (r === undefined || x < 0 || x > this.width) return -1;
    const k = blockAt(r, x);
    return k >= 0 ? r.node[k] : -1;
  }

  /** Where module `i` is drawn (CSS pixels of the canvas), or null: for tests. */
  slotOf(i: number): { x: number; y: number; w: number; h: number } | null {
    for (let row = 0; row < this.rows.length; row++) {
      const r = this.rows[row];
      const k = r.node.indexOf(i);
      if (k >= 0) return { x: r.x[k], y: row * ROW_H, w: r.w[k], h: ROW_H - 1 };
    }
    return null;
  }

  /** The modules drawn outlined as the current step's unit's (for tests). */
  outlinedModules(): string[] {
    const m = this.data.modules;
    if (this.current < 0) return [];
    return this.rows.flatMap((r) =>
      r.node.filter((i) => m.unit[i] === this.current).map((i) => m.name[i]),
    );
  }

  /** The labels drawn, each with its block (for tests). */
  drawnLabels(): DrawnLabel[] {
    return this.labels;
  }

  /** What hovering module `i` says. */
  hoverLines(i: number): string[] {
    const m = this.data.modules;
    const u = m.unit[i];
    const unit = u >= 0 ? this.data.units[u] : null;
    const lines = [
      `${moduleName(m.name[i])} (${this.data.classes[m.cls[i]]})`,
      `unit: ${unit === null ? "not managed by FSDP" : `${quote(unit.name)} (unit ${u})`}`,
      `parameters: ${m.numel[i].toLocaleString("en-US")}`,
      `bytes: ${formatBytes(m.bytes[i])} full, ${formatBytes(m.rank_bytes[i])} per rank`,
      `dtype: ${unit === null ? "-" : unit.dtype}`,
    ];
    if (unit?.stage !== undefined)
      lines.push(`pipeline stage ${unit.stage}, on pp rank ${unit.pp_rank ?? "?"}`);
    if (unit !== null && unit.warnings.length > 0)
      lines.push(`warnings: ${unit.warnings.join(", ")}`);
    const kids = this.index.children[i].filter((c) => this.values()[c] > 0).length;
    if (i === this.focus && i !== 0) lines.push("click: go up");
    else if (i !== this.focus && kids > 0) lines.push(`click: zoom into its ${kids} submodules`);
    else lines.push("click: select its unit");
    return lines;
  }

  /** A click on module `i`: up from the top block, into a block with children, and its unit
   * selected. */
  clickAt(x: number, y: number): void {
    const i = this.pickAt(x, y);
    if (i < 0) return;
    if (i === this.focus) {
      if (i !== 0) this.focusOn(this.data.modules.parent[i]);
      this.choose(i);
      return;
    }
    if (this.index.children[i].some((c) => this.values()[c] > 0)) this.focusOn(i);
    this.choose(i);
  }

  /** Select module `i`'s unit and tell the page or the kernel. */
  private choose(i: number): void {
    const u = this.data.modules.unit[i];
    const unit = u >= 0 ? this.data.units[u].name : null;
    if (unit !== null) this.setSelected(unit, false); // as the click or the search left it
    this.events.select?.(unit, this.data.modules.name[i]);
  }

  hoverAt(x: number, y: number): void {
    const i = this.pickAt(x, y);
    if (i === this.hovered) return;
    this.hovered = i;
    if (i < 0) this.tooltip.hide();
    else this.tooltip.show(this.hoverLines(i), x, y, this.width);
    this.paint();
  }

  leave(): void {
    if (this.hovered < 0) return;
    this.hovered = -1;
    this.tooltip.hide();
    this.paint();
  }

  protected dragFrom(): (dx: number) => void {
    const { a, b } = this.span;
    return (dx) => {
      const df = (dx / this.width) * (b - a);
      this.showSpan({ a: a - df, b: b - df });
    };
  }

  protected wheelAt(x: number, factor: number): void {
    this.zoom(factor, x / this.width);
  }

  /** Backspace or Escape: up one module; + and −: zoom across; ← →: move along. */
  protected keyAction(key: string): (() => void) | undefined {
    const w = this.span.b - this.span.a;
    const keys: Record<string, () => void> = {
      Backspace: () => this.focusOn(Math.max(this.data.modules.parent[this.focus], 0)),
      Escape: () => this.focusOn(Math.max(this.data.modules.parent[this.focus], 0)),
      "+": () => this.zoom(0.5),
      "=": () => this.zoom(0.5),
      "-": () => this.zoom(2),
      ArrowLeft: () => this.showSpan({ a: this.span.a - w / 4, b: this.span.b - w / 4 }),
      ArrowRight: () => this.showSpan({ a: this.span.a + w / 4, b: this.span.b + w / 4 }),
    };
    return keys[key];
  }
}
