// How a view's data reaches the front end: fsdpviz.widgets send it as UTF-8 JSON in one
// binary buffer (anywidget hands it over as a DataView: no walk of a big nested object on
// either side); the exported page holds it as plain JSON. `dataOf` reads either, once.

const parsed = new WeakMap<object, unknown>();

/** The `data` trait of `model`, parsed (the same object for the same buffer). */
export function dataOf<T>(model: { get(key: "data"): unknown }): T {
  return traitOf<T>(model as { get(key: string): unknown }, "data");
}

/** A trait Python sends as a buffer of JSON (`data`, `details`), parsed once. */
export function traitOf<T>(model: { get(key: string): unknown }, key: string): T {
  const value = model.get(key);
  if (!(value instanceof DataView || value instanceof ArrayBuffer || ArrayBuffer.isView(value)))
    return value as T;
  const buffer = value as object;
  let out = parsed.get(buffer);
  if (out === undefined) {
    const bytes =
      value instanceof ArrayBuffer
        ? new Uint8Array(value)
        : new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
    out = JSON.parse(new TextDecoder().decode(bytes));
    parsed.set(buffer, out);
  }
  return out as T;
}
