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

/** A line plot of ys against xs in an SVG of the given size (it shrinks with a narrow
 *  column); returns the <svg> node. */
function linePlot(xs, ys, { width = 360, height = 160, marker = null, yLabel = "", xLabel = "" } = {}) {
  const pad = { l: 40, r: 10, t: yLabel ? 20 : 10, b: 28 };
  const plot = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`,
                            class: "tfw-plot tfw-fit", role: "img" });
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

/** Undo Python's page_text: "%3C" -> "<", "%25" -> "%" (the saved page never holds a raw "<"). */
function fromPage(text) {
  return String(text).replace(/%(25|3C)/g, (_, hex) => (hex === "25" ? "%" : "<"));
}

/** Python's page_text: "%" -> "%25", then "<" -> "%3C"; text made in the page is stored
 *  as Python stores it, so every drawing reads it back with fromPage. */
function toPage(text) {
  return String(text).replace(/%/g, "%25").replace(/</g, "%3C");
}

/** The widget's error (Python's, or the page's own), as text in `box`. */
function showError(box, model) {
  box.textContent = fromPage(model.get("error"));
}

// Live mode. In Jupyter a kernel answers the widget's "ping" by setting `live`, and answers
// every "request" with a "done" message once it has computed (or failed). In the static HTML
// nothing answers, so controls that need Python stay disabled and the widget explores the
// data computed at build time. The link to Python has a state per view, shown by
// pythonStatus and in the root's data-python: "static", "live", "busy" (a request is in
// flight) or "gone" (the kernel restarted or stopped: the widget's messages have nowhere to
// go any more, and only running its cell again makes a widget that Python answers).
const PYTHON_BUSY = "Python is computing…";
const PYTHON_GONE = "The kernel restarted or stopped, so this widget has lost its Python. " +
  "Run its cell again (Shift+Enter) to get a live widget.";
const LINKS = new WeakMap();  // model (one per view) -> {state, onChange, nodes}

function linkOf(model) {
  if (!LINKS.has(model)) LINKS.set(model, { state: "static", onChange: () => {}, nodes: [] });
  return LINKS.get(model);
}

function setPythonState(model, state) {
  const link = linkOf(model);
  if (link.state === "gone") return;  // nothing revives this view: its cell makes a new one
  const wasLive = link.state === "live" || link.state === "busy";
  link.state = state;
  for (const node of link.nodes) drawPythonStatus(node, state);
  const isLive = state === "live" || state === "busy";
  if (isLive !== wasLive) link.onChange(isLive);
}

function drawPythonStatus(node, state) {
  node.textContent = state === "busy" ? PYTHON_BUSY : state === "gone" ? PYTHON_GONE : "";
  node.style.color = state === "gone" ? "#b00" : "";
  const root = node.closest(".tfw");
  if (root) root.dataset.python = state;
}

/** A line that says when Python is computing, or when the widget has lost its kernel. */
function pythonStatus(model) {
  const node = el("span", { class: "tfw-note tfw-python", role: "status" });
  linkOf(model).nodes.push(node);
  queueMicrotask(() => drawPythonStatus(node, linkOf(model).state));  // once it is in the page
  return node;
}

/** Send a message to Python; false (and the widget says it lost its Python) if the kernel
 *  is gone: JupyterLab then refuses to send ("Cannot send"). */
function sendToPython(model, message) {
  try {
    model.send(message);
    return true;
  } catch (error) {
    setPythonState(model, "gone");
    return false;
  }
}

/** Call onChange(live) now and whenever Python answers or goes away. */
function watchLive(model, onChange) {
  const link = linkOf(model);
  link.onChange = onChange;
  model.on("change:live", () => { if (model.get("live")) setPythonState(model, "live"); });
  model.on("msg:custom", (message) => {
    if (!message) return;
    if (message.type === "live") setPythonState(model, "live");  // the answer to a ping
    if (message.type === "done" && link.state === "busy") setPythonState(model, "live");
  });
  // The widget manager marks the model's connection on a kernel restart or shutdown: ask
  // again, and a send that fails says the kernel is gone.
  model.on("comm_live_update", () => sendToPython(model, { type: "ping" }));
  onChange(false);
  // In a static page the ping goes nowhere and nothing answers.
  if (sendToPython(model, { type: "ping" }) && model.get("live")) setPythonState(model, "live");
}

/** Ask Python for new data (only meaningful when live); the widget shows it is busy until
 *  Python's "done". */
function request(model, args) {
  if (sendToPython(model, { type: "request", args })) setPythonState(model, "busy");
}

// Every widget fits a phone's column (390 px wide screen): rows wrap, text wraps, a text box
// or a menu shrinks to the column, and so does a canvas or an SVG (with a viewBox) of class
// tfw-fit, keeping its proportions (mouse positions are read relative to its drawn size),
// instead of widening the page. The widget keeps its light colours in the theme's dark mode
// (which puts widgets on a light box; color-scheme: the controls are drawn light too).
const TFW_STYLE = `
.tfw { font: 13px/1.4 system-ui, sans-serif; color: #222; color-scheme: light;
  max-width: 100%; overflow-wrap: anywhere; }
.tfw-row { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; margin: 4px 0; }
.tfw-row > * { min-width: 0; max-width: 100%; }
.tfw-slider input { vertical-align: middle; width: 200px; max-width: 100%; }
.tfw-value { display: inline-block; min-width: 3em; font-family: monospace; }
.tfw-note { color: #666; font-size: 12px; }
.tfw-token { font-family: monospace; white-space: pre; padding: 0 2px; border-radius: 3px; }
.tfw canvas { image-rendering: pixelated; border: 1px solid #ccc; cursor: crosshair; }
.tfw canvas.tfw-fit { box-sizing: border-box; max-width: 100%; height: auto; }
.tfw svg.tfw-fit { max-width: 100%; height: auto; }
.tfw select, .tfw textarea, .tfw input[type=text] { max-width: 100%; box-sizing: border-box; }
.tfw button { font: inherit; padding: 1px 8px; }
.tfw input[type=number] { width: 5em; }
.tfw .tfw-python:empty { display: none; }
`;

/** The widget's root element, with the shared style attached once. */
function root(element, className) {
  const node = el("div", { class: `tfw ${className}` });
  node.append(el("style", {}, TFW_STYLE));
  element.append(node);
  return node;
}
