// The explorer's detail panel: the selected unit's facts, where its bytes go, its
// parameters and the shapes the trace saw, in the words of the API that made the plan
// (fsdpviz.views.detail writes them). Beside the icicle where the view is wide enough,
// else over it; it scrolls on its own, so nothing is cut off and nothing below it moves.
import { button, element } from "./dom";
import { formatBytes, moduleName, quote } from "./format";

/** A table of the panel, or a line of text (`text`). */
export interface DetailSection {
  title: string;
  note?: string;
  header?: string[];
  rows?: string[][];
  /** Rows left out of `rows`. */
  more?: number;
  /** Columns aligned right. */
  numeric?: number[];
  text?: string;
}

/** One unit's panel: fsdpviz.views.detail.unit_detail. */
export interface UnitDetail {
  title: string;
  facts: string;
  warnings: string[];
  sections: DetailSection[];
}

/** A module picked inside the unit: its name, class and the sizes of its subtree. */
export interface PickedModule {
  name: string;
  cls: string;
  numel: number;
  bytes: number;
  rankBytes: number;
}

export const EMPTY_TEXT = "Click a module or find a unit to see its parameters, shapes and bytes.";

/** Where a name may break: after each dot (between the names of its modules); `UNDERSCORES`
 * too where a table would otherwise be wider than the panel. */
const DOTS = /(?<=\.)/;
const UNDERSCORES = /(?<=[._])/;

function table(section: DetailSection, breaks: RegExp = DOTS): HTMLElement {
  const t = element("table", "fv-detail-table");
  const numeric = new Set(section.numeric ?? []);
  const row = (cells: string[], tag: "th" | "td"): HTMLTableRowElement => {
    const tr = document.createElement("tr");
    cells.forEach((text, k) => {
      const c = document.createElement(tag);
      if (tag === "td" && !numeric.has(k)) {
        // a name may break where the panel is narrow: between the names of its modules
        // (post_attention_layernorm stays whole), inside one only where it must (see show)
        text.split(breaks).forEach((part, j) => {
          if (j > 0) c.appendChild(document.createElement("wbr"));
          c.append(part);
        });
      } else c.textContent = text;
      if (numeric.has(k)) c.className = "fv-num";
      tr.appendChild(c);
    });
    return tr;
  };
  if (section.header) t.appendChild(row(section.header, "th"));
  for (const r of section.rows ?? []) t.appendChild(row(r, "td"));
  if (section.more) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = section.header?.length ?? 1;
    td.textContent = `… ${section.more.toLocaleString("en-US")} more`;
    tr.appendChild(td);
    t.appendChild(tr);
  }
  return t;
}

/** The panel of one explorer: shows a unit's detail, or what to do to see one. */
export class DetailPanel {
  readonly el: HTMLElement;
  readonly body: HTMLElement;
  /** Over the icicle (a narrow view) rather than beside it: then it can be closed. */
  private over = false;
  private closed = false;
  private shown: UnitDetail | null = null;

  constructor(onClose?: () => void) {
    this.el = element("aside", "fv-detail");
    this.el.setAttribute("aria-label", "the selected unit's details");
    const close = button("×", "close the details (they open again on the next selection)", () => {
      this.closed = true;
      this.place();
      onClose?.();
    });
    close.className = "fv-detail-close";
    this.body = element("div", "fv-detail-body");
    this.el.append(close, this.body);
    this.show(null, null);
  }

  /** Beside the icicle (`over` false) or over it. */
  setOver(over: boolean): void {
    this.over = over;
    this.place();
  }

  private place(): void {
    this.el.classList.toggle("fv-detail-over", this.over);
    this.el.hidden = this.over && (this.closed || this.shown === null);
  }

  /** Show `detail` (null: the hint), and the `module` picked in it if any. */
  show(detail: UnitDetail | null, module: PickedModule | null): void {
    this.shown = detail;
    this.closed = false;
    const parts: HTMLElement[] = [];
    const tables: Array<[HTMLElement, DetailSection]> = [];
    if (detail === null) {
      const p = element("p", "fv-hint");
      p.textContent =
        module === null
          ? EMPTY_TEXT
          : `Module ${quote(module.name)} holds no parameters FSDP manages.`;
      parts.push(p);
    } else {
      const title = element("div", "fv-detail-title");
      title.textContent = detail.title;
      const facts = element("div", "fv-detail-facts");
      facts.textContent = detail.facts;
      parts.push(title, facts);
      if (module !== null) {
        const p = element("p", "fv-detail-module");
        p.textContent =
          `Selected module ${quote(module.name)} (${module.cls}): ` +
          `${module.numel.toLocaleString("en-US")} parameters, ${formatBytes(module.bytes)} full, ` +
          `${formatBytes(module.rankBytes)} per rank.`;
        parts.push(p);
      }
      for (const w of detail.warnings) {
        const p = element("p", "fv-warn");
        p.textContent = `warning ${w}`;
        parts.push(p);
      }
      for (const section of detail.sections) {
        const h = element("div", "fv-detail-section");
        const b = document.createElement("b");
        b.textContent = section.title;
        h.appendChild(b);
        if (section.note) h.append(` (${section.note})`);
        parts.push(h);
        if (section.text !== undefined) {
          const p = element("p", "fv-detail-text");
          p.textContent = section.text;
          parts.push(p);
        } else {
          const t = table(section);
          tables.push([t, section]);
          parts.push(t);
        }
      }
    }
    this.body.replaceChildren(...parts);
    // a table wider than the panel with its names broken between modules: broken at their
    // underscores too, so that every column (the numbers) stays in sight
    const body = this.body;
    if (body.clientWidth > 0 && body.scrollWidth > body.clientWidth)
      for (const [t, section] of tables) t.replaceWith(table(section, UNDERSCORES));
    this.el.dataset.fvUnit = detail === null ? "" : detail.title;
    this.el.dataset.fvModule = module === null ? "" : moduleName(module.name);
    this.place();
  }

  /** A unit whose details are on their way (made right after a re-plan's answer). */
  showPending(unit: string): void {
    this.shown = null;
    this.closed = false;
    const p = element("p", "fv-hint");
    p.textContent = `${quote(unit)}: its details are on their way…`;
    this.body.replaceChildren(p);
    this.el.dataset.fvUnit = "";
    this.el.hidden = false;
  }

  /** The panel's text (for tests). */
  get text(): string {
    return this.body.textContent ?? "";
  }
}
