// Bundles src/widget.ts into ../fsdpviz/static/timeline.js (ES module for anywidget),
// src/standalone.ts into ../fsdpviz/static/standalone.js (the script of the HTML page
// fsdpviz.export writes) and copies the stylesheet. Run by `npm run build`, and by
// hatch-jupyter-builder during `pip install` (see pyproject.toml).

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
  outfile: resolve(outdir, "timeline.js"),
});
await build({
  ...options,
  entryPoints: [resolve(here, "src", "standalone.ts")],
  outfile: resolve(outdir, "standalone.js"),
});
await copyFile(resolve(here, "src", "widget.css"), resolve(outdir, "timeline.css"));
console.log(`wrote ${outdir}/timeline.js, standalone.js and timeline.css`);
