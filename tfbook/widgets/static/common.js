// Helpers shared by every tfbook widget. Python prepends this file to each widget's own
// script (tfbook/widgets/base.py), so there is no build step and no import to resolve.
//
// Rule: text that comes from data (tokens, labels) is always set with textContent, never
// as HTML, so a token such as "<img src=x onerror=alert(1)>" is shown literally.

const SVG_NS = "http://www.w3.org/2000/svg";

/** Create an HTML element: el("div", {class: "x"}, "text", child) */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Create an SVG element with attributes: svg("rect", {x: 0, y: 0, width: 4}) */
function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = String(value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
}

/** Make whitespace visible in a token: space -> "␣", newline -> "↵", tab -> "⇥". */
function visibleText(text) {
  return String(text).replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥");
}

/** Diverging colour for value v in [-vmax, vmax]: blue (negative), white, red (positive). */
function divergingColor(v, vmax) {
  const t = Math.max(-1, Math.min(1, v / (vmax || 1)));
  const fade = Math.round(255 * (1 - Math.abs(t)));
  return t >= 0 ? `rgb(255,${fade},${fade})` : `rgb(${fade},${fade},255)`;
}

/** Sequential colour for value v in [0, vmax]: white to dark blue. */
function sequentialColor(v, vmax) {
  const t = Math.max(0, Math.min(1, v / (vmax || 1)));
  return `rgb(${Math.round(255 - 215 * t)},${Math.round(255 - 155 * t)},${Math.round(255 - 55 * t)})`;
}

/**
 * Make `children` the children of `parent`, touching the DOM only if they differ. Moving a
 * node (even to where it already is) takes the keyboard focus away from it, so a redraw
 * must not re-insert the slider the reader is pressing arrow keys on.
 */
function setChildren(parent, children) {
  const same = parent.children.length === children.length &&
    children.every((child, i) => parent.children[i] === child);
  if (!same) parent.replaceChildren(...children);
}

/** A labelled range slider; onInput(value) is called on every change (mouse or keyboard). */
function slider({ label, min, max, step = 1, value, onInput }) {
  const output = el("span", { class: "tfw-value" }, String(value));
  const input = el("input", { type: "range", min, max, step, value, "aria-label": label });
  input.addEventListener("input", () => {
    output.textContent = input.value;
    onInput(Number(input.value));
  });
  const set = (v) => {
    input.value = String(v);
    output.textContent = input.value;
  };
  return { node: el("label", { class: "tfw-slider" }, label + " ", input, " ", output), input, set };
}

/** A line plot of ys against xs in an SVG of the given size; returns the <svg> node. */
function linePlot(xs, ys, { width = 360, height = 160, marker = null, yLabel = "", xLabel = "" } = {}) {
  const pad = { l: 40, r: 10, t: yLabel ? 20 : 10, b: 28 };
  const plot = svg("svg", { width, height, class: "tfw-plot", role: "img" });
  const xmin = Math.min(...xs), xmax = Math.max(...xs);
  const ymin = Math.min(...ys), ymax = Math.max(...ys);
  const sx = (x) => pad.l + ((x - xmin) / (xmax - xmin || 1)) * (width - pad.l - pad.r);
  const sy = (y) => height - pad.b - ((y - ymin) / (ymax - ymin || 1)) * (height - pad.t - pad.b);
  plot.append(svg("rect", { x: pad.l, y: pad.t, width: width - pad.l - pad.r,
                             height: height - pad.t - pad.b, fill: "#fafafa", stroke: "#ccc" }));
  const d = xs.map((x, i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(ys[i]).toFixed(1)}`).join("");
  plot.append(svg("path", { d, fill: "none", stroke: "#1f77b4", "stroke-width": 1.5 }));
  if (marker !== null) {
    plot.append(svg("line", { x1: sx(marker), x2: sx(marker), y1: pad.t, y2: height - pad.b,
                               stroke: "#d62728", "stroke-dasharray": "3,2" }));
  }
  const text = (x, y, s, anchor) =>
    plot.append(svg("text", { x, y, "font-size": 10, "text-anchor": anchor, text: s }));
  text(pad.l - 4, pad.t + 8, ymax.toFixed(2), "end");
  text(pad.l - 4, height - pad.b, ymin.toFixed(2), "end");
  text(pad.l, height - 14, String(xmin), "start");
  text(width - pad.r, height - 14, String(xmax), "end");
  text((width + pad.l) / 2, height - 2, xLabel, "middle");
  if (yLabel) text(pad.l, 12, yLabel, "start");
  return plot;
}

/**
 * Live mode. In Jupyter a kernel answers the widget's "ping" by setting `live`; in the
 * static HTML nothing answers, so controls that need Python stay disabled and the widget
 * explores the data computed at build time.
 */
function watchLive(model, onChange) {
  model.on("change:live", () => onChange(model.get("live")));
  onChange(model.get("live"));
  try {
    model.send({ type: "ping" });
  } catch (error) {
    // no kernel (static page): stay in static mode
  }
}

/** Ask Python for new data (only meaningful when live). */
function request(model, args) {
  model.send({ type: "request", args });
}

const TFW_STYLE = `
.tfw { font: 13px/1.4 system-ui, sans-serif; color: #222; }
.tfw-row { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; margin: 4px 0; }
.tfw-slider input { vertical-align: middle; width: 200px; }
.tfw-value { display: inline-block; min-width: 3em; font-family: monospace; }
.tfw-note { color: #666; font-size: 12px; }
.tfw-token { font-family: monospace; white-space: pre; padding: 0 2px; border-radius: 3px; }
.tfw canvas { image-rendering: pixelated; border: 1px solid #ccc; cursor: crosshair; }
.tfw button { font: inherit; padding: 1px 8px; }
.tfw input[type=number] { width: 5em; }
`;

/** The widget's root element, with the shared style attached once. */
function root(element, className) {
  const node = el("div", { class: `tfw ${className}` });
  node.append(el("style", {}, TFW_STYLE));
  element.append(node);
  return node;
}
