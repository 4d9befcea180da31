// A big model's explorer in the exported page: which modules the figure draws when
// focused on one of them, and the trace and title for that: the rules of
// fsdpviz.views.tree.tree_view and fsdpviz.views.explorer.explorer_parts, in the page
// (tests/test_export_html.py compares what the page draws with what Python draws).
import { quote } from "./model";

/** Every module of the explorer, as `explorer_parts` draws it with nothing closed. */
export interface ExplorerTree {
  parents: string[];
  labels: string[];
  values: number[];
  colors: string[];
  customdata: unknown[][];
  /** Most modules drawn at once (fsdpviz.views.tree.EXPLORER_BUDGET). */
  budget: number;
  /** The figure's title without the line about opening blocks. */
  title: string;
}

/** The modules drawn when focused on `focus` (indices, in tree order); `closed` ones have
 * children that are not drawn. Mirrors fsdpviz.views.tree.tree_view. */
export interface TreeView {
  focus: number;
  indices: number[];
  closed: Set<number>;
}

export function childrenOf(ids: string[], parents: string[]): number[][] {
  const index = new Map(ids.map((id, i) => [id, i] as [string, number]));
  const children: number[][] = ids.map(() => []);
  parents.forEach((p, i) => {
    const j = index.get(p);
    if (p !== "" && j !== undefined) children[j].push(i);
  });
  return children;
}

export function treeView(children: number[][], focus: number, budget: number): TreeView {
  const shown = new Set([focus]);
  let level = [focus];
  while (level.length > 0) {
    const below = level.flatMap((i) => children[i]);
    if (below.length === 0 || (shown.size + below.length > budget && shown.size > 1)) break;
    for (const i of below) shown.add(i);
    level = below;
  }
  const closed = new Set(level.filter((i) => children[i].length > 0 && !shown.has(children[i][0])));
  return { focus, indices: [...shown].sort((a, b) => a - b), closed };
}

/** The explorer trace's arrays for `view` (what explorer_parts gives for that focus). */
export function viewTrace(
  ids: string[],
  tree: ExplorerTree,
  children: number[][],
  view: TreeView,
): Record<string, unknown> {
  const pick = <T>(xs: T[]): T[] => view.indices.map((i) => xs[i]);
  return {
    ids: pick(ids),
    parents: view.indices.map((i) => (i === view.focus ? "" : tree.parents[i])),
    labels: view.indices.map((i) => tree.labels[i] + (view.closed.has(i) ? " ▸" : "")),
    values: pick(tree.values),
    customdata: view.indices.map((i) => {
      const row = [...tree.customdata[i]];
      if (view.closed.has(i))
        row[6] = `${String(row[6])}<br>click to open its ${children[i].length} submodules`;
      else if (i === view.focus && view.focus !== 0) row[6] = `${String(row[6])}<br>click to go up`;
      return row;
    }),
    "marker.colors": pick(tree.colors),
  };
}

/** The figure's title for `view` (as explorer_parts writes it). */
export function viewTitle(ids: string[], tree: ExplorerTree, view: TreeView): string {
  if (view.focus !== 0)
    return `${tree.title}<br><sup>inside ${quote(ids[view.focus])}: click it to go up</sup>`;
  if (view.closed.size > 0) {
    return `${tree.title}<br><sup>${ids.length.toLocaleString("en-US")} modules: click a block marked ▸ to open it</sup>`;
  }
  return tree.title;
}

/** What plotly draws a slice's label with: the explorer's font size (11 px) and the
 * share of it one character takes, at most. */
const LABEL_FONT_PX = 11;
const CHAR_SHARE = 0.65;

/**
 * Per-slice `texttemplate` of an icicle: its label where it can be read in some zoom
 * of the figure, "" where it cannot. A slice is widest (short of being the top, which
 * always shows its label) when plotly zooms to its parent: if its label does not fit
 * across `widthPx` then, plotly hides it in every zoom (uniformtext), yet measures it
 * in the page each draw (~1 ms a label: 0.8 s for a 10,000-module model's blocks);
 * a blank one it measures once. `top` is the slice drawn at the top (its id).
 */
export function fittingLabels(
  trace: { ids: string[]; parents: string[]; labels: string[]; values: number[] },
  widthPx: number,
  top: string,
): string[] {
  const value = new Map(trace.ids.map((id, i) => [id, trace.values[i]] as [string, number]));
  return trace.ids.map((id, i) => {
    const parent = value.get(trace.parents[i]);
    if (id === top || parent === undefined || !(parent > 0)) return "%{label}";
    const wide = (trace.values[i] / parent) * widthPx;
    return wide >= trace.labels[i].length * LABEL_FONT_PX * CHAR_SHARE ? "%{label}" : "";
  });
}
