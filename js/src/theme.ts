// The colours every view draws with, from fsdpviz's one colour table
// (fsdpviz/views/colors.json, which fsdpviz.views.style reads too), and the theme of the
// page: JupyterLab's (body[data-jp-theme-light] and its CSS variables), or else the
// operating system's light or dark setting. Each view reads it from the page itself.
import table from "../../fsdpviz/views/colors.json";

export type ThemeName = "light" | "dark";

export interface ThemeColors {
  name: ThemeName;
  bg: string;
  fg: string;
  muted: string;
  grid: string;
  accent: string;
  wait: string;
  wait_fill: string;
  call: string;
  panel: string;
  border: string;
  warn: string;
  warn_bg: string;
  highlight: string;
  focus: string;
  /** A flight recorder's collective where a rank stopped (`wait`: where ranks diverge). */
  stuck: string;
}

/** The table's colours of each theme. */
export const THEMES: Record<ThemeName, ThemeColors> = {
  light: { name: "light", ...table.themes.light },
  dark: { name: "dark", ...table.themes.dark },
};

/** The 20 unit colours (as fsdpviz.views.style.PALETTE orders them) and the others. */
export const COLORS = {
  paletteDark: table.palette_dark,
  paletteLight: table.palette_light,
  unmanaged: table.unmanaged,
  categories: table.categories as Record<string, string>,
};

export const FONT = "11px system-ui, sans-serif";

/** Whether the page is dark: JupyterLab's flag where there is one, else the OS setting. */
export function pageIsDark(doc: Document = document): boolean {
  const flag = doc.body?.dataset.jpThemeLight;
  if (flag !== undefined) return flag === "false";
  return typeof matchMedia === "function" && matchMedia("(prefers-color-scheme: dark)").matches;
}

/** The page's theme, with JupyterLab's own colours where its CSS variables are set. */
export function readTheme(el: HTMLElement): ThemeColors {
  const base = THEMES[pageIsDark(el.ownerDocument) ? "dark" : "light"];
  const css = getComputedStyle(el);
  const v = (name: string, fallback: string): string =>
    css.getPropertyValue(name).trim() || fallback;
  return {
    ...base,
    bg: v("--jp-layout-color0", base.bg),
    fg: v("--jp-ui-font-color0", base.fg),
    muted: v("--jp-ui-font-color2", base.muted),
    grid: v("--jp-border-color2", base.grid),
    call: v("--jp-layout-color2", base.call),
    panel: v("--jp-layout-color1", base.panel),
    border: v("--jp-border-color1", base.border),
  };
}

/** The page's theme for a view's root `el` (see {@link readTheme}), also set on it as CSS
 * variables (--fv-fg, --fv-accent, ...): the stylesheet draws the legends, rings and
 * controls with them. */
export function takeTheme(el: HTMLElement): ThemeColors {
  const theme = readTheme(el);
  setThemeVariables(el, theme);
  return theme;
}

function setThemeVariables(el: HTMLElement, theme: ThemeColors): void {
  for (const [key, value] of Object.entries(theme)) {
    if (key !== "name") el.style.setProperty(`--fv-${key.replace(/_/g, "-")}`, value);
  }
  const [a, b, , c] = COLORS.paletteDark;
  el.style.setProperty("--fv-unit-a", a);
  el.style.setProperty("--fv-unit-b", b);
  el.style.setProperty("--fv-unit-c", c);
  el.style.setProperty("--fv-hatch", textOn(b));
}

/** Black or white text on `hex`, whichever contrasts more (fsdpviz.views.style.text_on). */
export function textOn(hex: string): string {
  const n = Number.parseInt(hex.slice(1, 7), 16);
  const lum = (0.299 * ((n >> 16) & 255) + 0.587 * ((n >> 8) & 255) + 0.114 * (n & 255)) / 255;
  return lum > 0.55 ? "#000000" : "#ffffff";
}

/**
 * Call `onChange` when the page's theme changes: JupyterLab's flag on the body, or the
 * OS setting where the page has no flag. Called again on the next frame, as the new
 * theme's CSS variables may apply after the flag. Returns what stops watching.
 */
export function watchTheme(onChange: () => void, doc: Document = document): () => void {
  const again = (): void => {
    onChange();
    if (typeof requestAnimationFrame === "function") requestAnimationFrame(() => onChange());
  };
  const stops: Array<() => void> = [];
  if (typeof MutationObserver === "function" && doc.body) {
    const flag = new MutationObserver(again);
    flag.observe(doc.body, { attributes: true, attributeFilter: ["data-jp-theme-light"] });
    stops.push(() => flag.disconnect());
  }
  const query =
    typeof matchMedia === "function" ? matchMedia("(prefers-color-scheme: dark)") : null;
  if (query !== null && typeof query.addEventListener === "function") {
    query.addEventListener("change", again);
    stops.push(() => query.removeEventListener("change", again));
  }
  return () => {
    for (const stop of stops) stop();
  };
}
