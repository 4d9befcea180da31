// Bundles src/widget.ts into ../fsdpviz/static/widget.js (the ES module of every view, which
// anywidget loads in the notebook and the exported page imports), src/page.ts into
// ../fsdpviz/static/page.js (the page's boot script: it unpacks the data and the widget
// module, draws and links the views) and copies the stylesheet widget.css. Then the
// JupyterLab extension (src/lab/index.ts, with the same views) into lib/index.js, which
// @jupyterlab/builder (webpack) makes a prebuilt extension in ../fsdpviz/labextension
// (shipped in the wheel as share/jupyter/labextensions/fsdpviz).
// Run by `npm run build`, and by hatch-jupyter-builder during `pip install` (see
// pyproject.toml); `--no-lab` skips the extension.

import { spawnSync } from "node:child_process";
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

if (!process.argv.includes("--no-lab")) {
  // JupyterLab and Lumino are JupyterLab's own, shared at run time (module federation)
  await build({
    ...options,
    minify: false,
    entryPoints: [resolve(here, "src", "lab", "index.ts")],
    outfile: resolve(here, "lib", "index.js"),
    external: ["@jupyterlab/*", "@lumino/*"],
  });
  await buildLabExtension();
}

/**
 * `build-labextension` of @jupyterlab/builder (webpack, module federation) against the
 * JupyterLab core that @jupyterlab/core-meta describes: what `jupyter labextension build`
 * runs, with no Python or JupyterLab needed to build.
 */
async function buildLabExtension() {
  const core = resolve(here, "lib", "core");
  await mkdir(core, { recursive: true });
  const meta = resolve(here, "node_modules", "@jupyterlab", "core-meta", "core.package.json");
  await copyFile(meta, resolve(core, "package.json"));
  const builder = resolve(here, "node_modules", "@jupyterlab", "builder", "lib");
  const args = [resolve(builder, "build-labextension.js"), "--core-path", core];
  if (process.env.NODE_ENV === "development") args.push("--development");
  const run = spawnSync(process.execPath, [...args, here], { cwd: here, stdio: "inherit" });
  if (run.status !== 0) throw new Error(`build-labextension failed (exit ${run.status})`);
  console.log(`wrote ${resolve(here, "..", "fsdpviz", "labextension")}`);
}
