// Bundles src/widget.ts into ../fsdpviz/static/widget.js (the ES module of every view, which
// anywidget loads in the notebook and the exported page imports), src/page.ts into
// ../fsdpviz/static/page.js (the page's boot script: it unpacks the data and the widget
// module, draws and links the views) and copies the stylesheet widget.css. Run by
// `npm run build`, and by hatch-jupyter-builder during `pip install` (see pyproject.toml).

import { copyFile, mkdir } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const outdir = resolve(here, "..", "fsdpviz", "static");
await mkdir(outdir, { recursive: true });
const options = {
  bundle: true,
  format: "esm",
  target: "es2020",
  minify: process.argv.includes("--minify") || process.env.NODE_ENV === "production",
  sourcemap: false,
  legalComments: "none",
  logLevel: "info",
};
await build({
  ...options,
  entryPoints: [resolve(here, "src", "widget.ts")],
  outfile: resolve(outdir, "widget.js"),
});
await build({
  ...options,
  entryPoints: [resolve(here, "src", "page.ts")],
  outfile: resolve(outdir, "page.js"),
});
await copyFile(resolve(here, "src", "widget.css"), resolve(outdir, "widget.css"));
console.log(`wrote ${outdir}/widget.js, page.js and widget.css`);
