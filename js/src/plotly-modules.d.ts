// plotly.js's partial-bundle entry points (CommonJS, untyped): the core and trace modules.
declare module "plotly.js/lib/core" {
  const Plotly: { register(modules: unknown[]): void };
  export default Plotly;
}
declare module "plotly.js/lib/icicle" {
  const trace: unknown;
  export default trace;
}
declare module "plotly.js/lib/treemap" {
  const trace: unknown;
  export default trace;
}
