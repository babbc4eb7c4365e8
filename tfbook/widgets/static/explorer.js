// The model explorer (tfbook/widgets/explorer.py): a decoder's architecture diagram, drawn
// in SVG from the layout Python computed from the model's config. Click a box to see its
// tensor for the reader's sentence as a heatmap (rows are tokens), with its shape, range,
// colour legend, explanation and formula; point at a cell to read its value; the logits box
// lists the most likely next tokens. Hover or tap a token to light its row in every view;
// the chart below plots the norm of the residual stream at each of its states.
//
// Where the tensors come from. With a page model (`page_model`, a small GPT's payload) the
// page runs the sentence itself: gpt.js's forward pass with its `record` hook, which hands
// over every intermediate under the same keys as Python's forward hooks (trace_decoder).
// Fed by Python (any tfbook decoder, in Jupyter), the page holds the tokens, the norms, the
// top next tokens and the selected box's tensor (`shown`); another box is asked of Python.
//
// The keyboard: the diagram is one tab stop (a roving tabindex); arrow keys move between its
// boxes, Page Up/Down to the same box of the block above or below, Home/End to the first or
// last; Enter or Space shows the focused box. Blocks and heads are counted from 0, as in the
// code's keys ("blocks.16.attn.q" is "block 16, q").
//
// Text from data (tokens, the sentence) is set with textContent only (common.js's rule).
// Timings for the tests and bench/bench_explorer.py (performance.now(), in this view):
// node.explorerTimes.

// one token's row in the heatmap and its label: 12 px text with room for what hangs below
// the baseline (the ␣ of a space)
const ROW_PX = 14;
const EXPLORER_STYLE = `
.tfw-explorer { max-width: 100%; }
.tfw-explorer .tfw-scroll { overflow-x: auto; max-width: 100%; }
.tfw-explorer .tfw-diagram { max-height: 700px; overflow-y: auto; flex: 0 1 auto; }
.tfw-explorer .tfw-body { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
/* beside the diagram when the column holds both, below it when it does not (a phone):
   flex-wrap decides from the container's width */
.tfw-explorer .tfw-panel { flex: 1 1 270px; min-width: 0; }
/* no text below the book's minimum size, 12 px (explorer.py's FONT_PX) */
.tfw-explorer svg text { font: 12px system-ui, sans-serif; }
.tfw-explorer svg text.tfw-shape { fill: #444; }
.tfw-explorer .tfw-box rect { stroke-width: 1; cursor: pointer; }
.tfw-explorer .tfw-box rect.tfw-hit { stroke: none; }
.tfw-explorer .tfw-box text { fill: #222; pointer-events: none; }
.tfw-explorer .tfw-box.tfw-on rect:not(.tfw-hit), .tfw-explorer .tfw-box.tfw-on circle {
  stroke: #111; stroke-width: 3; }
.tfw-explorer .tfw-box circle { stroke: #3b7dd8; fill: #fff; cursor: pointer; }
.tfw-explorer .tfw-box text.tfw-stream-label { fill: currentColor; }
.tfw-explorer .tfw-box:focus { outline: none; }
.tfw-explorer .tfw-box:focus-visible rect:not(.tfw-hit), .tfw-explorer .tfw-box:focus-visible circle {
  stroke: #c000c0; stroke-width: 3; }
.tfw-explorer .tfw-box:focus-visible rect.tfw-hit { stroke: #c000c0; stroke-width: 2;
  stroke-dasharray: 4 3; }
.tfw-explorer .tfw-edge { stroke: #777; stroke-width: 1.2; fill: none; }
.tfw-explorer .tfw-stream { stroke: #3b7dd8; stroke-width: 5; opacity: 0.55; }
.tfw-explorer .tfw-strip { display: flex; flex-wrap: wrap; gap: 2px; margin: 4px 0; }
.tfw-explorer .tfw-strip span, .tfw-explorer .tfw-labels span { font-family: monospace;
  white-space: pre; border-radius: 3px; padding: 0 2px; cursor: default; }
/* a token is a tap target at least 24 px tall */
.tfw-explorer .tfw-strip > span { background: rgba(127,127,127,0.15); min-height: 24px;
  line-height: 24px; padding: 0 4px; }
.tfw-explorer .tfw-piece { font-style: italic; color: #555; outline: 1px dashed #888;
  outline-offset: -1px; padding: 0 1px; }
.tfw-explorer .tfw-hot { background: #ffd54f !important; color: #222; }
.tfw-explorer .tfw-heat { display: flex; align-items: flex-start; gap: 4px; }
.tfw-explorer .tfw-labels { display: flex; flex-direction: column; text-align: right;
  max-width: 9em; overflow: hidden; flex: none; }
.tfw-explorer .tfw-labels > span { display: block; height: ${ROW_PX}px; line-height: ${ROW_PX}px;
  font-size: 12px; overflow: hidden; text-overflow: ellipsis; }
.tfw-explorer .tfw-labels > span.tfw-corner { font-family: system-ui, sans-serif; color: #666;
  white-space: normal; display: flex; align-items: flex-end; justify-content: flex-end;
  line-height: 1.2; }
.tfw-explorer .tfw-canvas-box { position: relative; overflow-x: auto; min-width: 0; }
.tfw-explorer .tfw-cols { position: relative; font-size: 12px; color: #444; }
.tfw-explorer .tfw-cols span { position: absolute; bottom: 0; white-space: pre; }
.tfw-explorer .tfw-cols.tfw-keys span { font-family: monospace; writing-mode: vertical-rl;
  transform: rotate(180deg); overflow: hidden; text-overflow: ellipsis; text-align: left;
  height: 100%; }
.tfw-explorer canvas { display: block; border: 1px solid #ccc; touch-action: pan-x pan-y; }
.tfw-explorer .tfw-row-mark { position: absolute; left: 0; height: ${ROW_PX}px;
  outline: 2px solid #d62728; pointer-events: none; display: none; }
.tfw-explorer .tfw-readout { min-height: 1.4em; font-size: 12px; margin-bottom: 6px; }
.tfw-explorer .tfw-legend { display: flex; align-items: center; gap: 6px; font-size: 12px;
  margin: 2px 0 4px; color: #444; }
.tfw-explorer .tfw-legend .tfw-ramp { width: 120px; height: 10px; border: 1px solid #aaa; }
.tfw-explorer .tfw-about { font-size: 12px; }
.tfw-explorer .tfw-formula { font-size: 14px; margin: 2px 0; }
.tfw-explorer .tfw-formula sub, .tfw-explorer .tfw-formula sup { font-size: 12px; }
.tfw-explorer .tfw-top { border-collapse: collapse; font-size: 12px; }
.tfw-explorer .tfw-top td { padding: 0 6px; }
.tfw-explorer .tfw-bar { display: inline-block; height: 9px; background: #1f77b4; }
.tfw-explorer .tfw-norms polyline { fill: none; stroke: #999; stroke-width: 1; }
.tfw-explorer .tfw-norms polyline.tfw-hot-line { stroke: #d62728; stroke-width: 2.5; }
.tfw-explorer .tfw-norms text { fill: currentColor; font-size: 12px; }
/* 16 px: a phone does not zoom the page when the text box takes the focus */
.tfw-explorer input[type=text] { width: min(36em, 90%); font: 16px system-ui, sans-serif; }
`;

const LINE = 15;  // between a box's name and its shape label (explorer.py's LINE)
const SUPERSCRIPT = "⁰¹²³⁴⁵⁶⁷⁸⁹";
const PROBABILITY_TOP = [40, 100, 200];  // the colour of weight 1 (0 is white)

/** The stream's state number p (0 .. 2L) in the book's notation (explorer.py's stream_label):
 *  x_t is a position's vector, so a superscript counts blocks: x⁽ˡ⁾ enters block l, x⁽ˡ⁾+a
 *  is the stream after block l's attention. */
function streamLabel(p) {
  const l = String(Math.floor(p / 2)).replace(/[0-9]/g, (d) => SUPERSCRIPT[d]);
  return `x⁽${l}⁾` + (p % 2 ? "+a" : "");
}

/** Python's markup of a formula -> nodes: "W_{Q}^{h}" is W with a subscript Q and a
 *  superscript h (<sub>, <sup>); everything else is text. */
function formulaNodes(text) {
  const nodes = [];
  let last = 0;
  for (const m of String(text).matchAll(/([_^])\{([^}]*)\}/g)) {
    if (m.index > last) nodes.push(document.createTextNode(text.slice(last, m.index)));
    nodes.push(el(m[1] === "_" ? "sub" : "sup", {}, m[2]));
    last = m.index + m[0].length;
  }
  nodes.push(document.createTextNode(text.slice(last)));
  return nodes;
}

// A piece of a character in a token label (gpt.js pageTokenLabel, Python's token_label):
// its bytes in hex between ‹ ›, e.g. "‹e2 80›", the first two bytes of "—".
const PIECE = /(‹[0-9a-f]{2}(?: [0-9a-f]{2})*›)/;

/** A token label as the token widgets show it (tokenspans.js bytesLabel): whitespace made
 *  visible in its characters, and a piece of a character as its hex bytes, in italics with a
 *  dashed outline (so "‹e2 80›" keeps the space between its bytes: no ␣ inside it). */
function tokenNodes(label) {
  return String(label).split(PIECE).filter((part) => part !== "").map((part) =>
    PIECE.test(part) ? el("span", { class: "tfw-piece", title: `bytes ${part.slice(1, -1)}: ` +
                                    "a piece of one character, which the next tokens finish" }, part)
      : document.createTextNode(showWhitespace(part)));
}

/** The same label as one string (for a readout or a tooltip). */
function tokenString(label) {
  return tokenNodes(label).map((node) => node.textContent).join("");
}

/** Shape labels wider than their boxes (a font wider than the layout's estimate) are
 *  narrowed to the box, so that no two labels run into each other: [text, width] pairs,
 *  measured in one pass (one layout, not one a label). */
function fitLabels(pairs) {
  for (const [text] of pairs) {
    text.removeAttribute("textLength");
    text.removeAttribute("lengthAdjust");
  }
  const lengths = pairs.map(([text]) => text.getComputedTextLength());
  pairs.forEach(([text, width], i) => {
    if (lengths[i] > width) {
      text.setAttribute("textLength", width);
      text.setAttribute("lengthAdjust", "spacingAndGlyphs");
    }
  });
}

const EMPTY_TEXT = "the text box is empty: type a sentence to run the model on";

/** What the page says when the text is longer than the context (explorer.py's cut_note). */
function cutNote(nTokens, maxLen) {
  return `the text has ${nTokens} tokens and the model reads at most ${maxLen}: ` +
    `its first ${nTokens - maxLen} were cut`;
}

/** base64 of little-endian float32 -> Float32Array. */
function floatsOf(text) {
  const bytes = base64Bytes(text);
  const view = new DataView(bytes.buffer);
  const out = new Float32Array(bytes.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

/** The n most likely next tokens of one row of logits (V,): softmax in double. */
function topOf(logits, n) {
  const probs = probabilities(logits);
  const order = Array.from(probs.keys()).sort((a, b) => probs[b] - probs[a] || a - b);
  return order.slice(0, n).map((id) => ({ id, prob: probs[id] }));
}

/** A heatmap cell's colour: weights from white (0) to dark blue (1); any other tensor blue
 *  (negative) through white (0) to red (positive), at ±vmax the strongest. */
function cellColour(x, probability, vmax) {
  if (probability) {
    const t = Math.max(0, Math.min(1, x));
    return PROBABILITY_TOP.map((top) => 255 - (255 - top) * t);
  }
  const t = Math.max(-1, Math.min(1, x / vmax));
  const fade = 255 * (1 - Math.abs(t));
  return t >= 0 ? [255, fade, fade] : [fade, fade, 255];
}

/** A column step for index labels at least `px` apart: 1, 2, 5, 10, 20, 50, ... */
function tickStep(cell, px) {
  for (let step = 1; ; step *= 10) {
    for (const k of [1, 2, 5]) if (k * step * cell >= px) return k * step;
  }
}

function render({ model, el: element }) {
  const started = performance.now();
  const node = root(element, "tfw-explorer");
  node.append(el("style", {}, EXPLORER_STYLE));
  // firstDraw: render() to the first complete drawing; drawnAt: its end, from navigation;
  // clicks: a click to the box's panel drawn, clickFrames: to the next animation frame;
  // typing: a key (an input event) to every view drawn for the new text; runs: forward passes
  const times = { firstDraw: null, drawnAt: null, clicks: [], clickFrames: [], typing: [],
                  runs: [] };
  node.explorerTimes = times;
  const touch = window.matchMedia && window.matchMedia("(hover: none)").matches;
  const point = touch ? "tap" : "hover";

  const layout = model.get("diagram");
  const n = layout.sizes;  // C, H, H_kv, D, F, V, L, T_max
  const boxes = new Map(layout.boxes.map((b) => [b.key, b]));
  const order = layout.boxes.map((b) => b.key);  // reading order: rows top to bottom

  // --- controls --------------------------------------------------------------------------
  const textInput = el("input", { type: "text", "aria-label": "your sentence", spellcheck: "false" });
  textInput.value = fromPage(model.get("text"));
  const runButton = el("button", {}, "run");
  const note = el("span", { class: "tfw-note" });
  const status = el("div", { class: "tfw-note tfw-status", role: "status" });
  const cut = el("div", { class: "tfw-note tfw-cut" });
  const headSlider = slider({ label: "head", min: 0, max: n.H - 1, value: model.get("head"),
                              onInput: (v) => select(model.get("box"), v) });
  node.append(el("div", { class: "tfw-row" }, textInput, runButton, note),
              el("div", { class: "tfw-row" }, headSlider.node, pythonStatus(model)), status, cut);
  if (n.H === 1) headSlider.node.style.display = "none";
  const strip = el("div", { class: "tfw-strip", "aria-label": "tokens" });
  node.append(strip);

  // --- the diagram -----------------------------------------------------------------------
  const diagram = svg("svg", {
    width: layout.width, height: layout.height + 8,
    viewBox: `0 -4 ${layout.width} ${layout.height + 8}`, role: "group", tabindex: -1,
    "aria-label": `the model's architecture, ${order.length} boxes: arrow keys move between ` +
      "them, Enter shows the focused box's tensor" });
  const defs = svg("defs");
  const marker = svg("marker", { id: `tfw-arrow-${Math.random().toString(36).slice(2)}`,
                                 viewBox: "0 0 6 6", refX: 6, refY: 3, markerWidth: 6,
                                 markerHeight: 6, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M0,0 L6,3 L0,6 z", fill: "#777" }));
  defs.append(marker);
  diagram.append(defs);
  const streamBoxes = layout.boxes.filter((b) => b.kind === "stream");
  const streamX = streamBoxes[0].x + streamBoxes[0].w / 2;
  const last = boxes.get("norm_f");
  // the stream's segments ([state, next state] edges) are this one line
  diagram.append(svg("line", { class: "tfw-stream", x1: streamX, x2: streamX,
                               y1: streamBoxes[0].y + 17, y2: last.y + last.h / 2 }));
  const arrow = (d, from, to) => diagram.append(svg("path", {
    class: "tfw-edge", d, "marker-end": `url(#${marker.id})`, "data-from": from, "data-to": to }));
  const mid = (b) => b.y + b.h / 2;
  const spans = (b, y) => y > b.y && y < b.y + b.h;
  for (const [from, to] of layout.edges) {
    const a = boxes.get(from), b = boxes.get(to);
    if (a.kind === "stream" && b.kind === "stream") continue;  // the stream's own line
    if (a.kind === "stream") {  // a norm reads the stream
      arrow(`M${streamX},${mid(b)} L${b.x},${mid(b)}`, from, to);
    } else if (b.kind === "stream") {  // down from the box, then left into the stream's circle
      const x = a.x + a.w / 2;
      arrow(`M${x},${a.y + a.h} L${x},${mid(b)} L${b.x + b.w / 2 + 12},${mid(b)}`, from, to);
    } else {  // rightwards: straight where the two boxes face each other, else a fork's elbow
      const y = a.h <= b.h ? mid(a) : mid(b);
      if (spans(a, y) && spans(b, y)) {
        arrow(`M${a.x + a.w},${y} L${b.x},${y}`, from, to);
      } else {
        const bus = (a.x + a.w + b.x) / 2;
        arrow(`M${a.x + a.w},${mid(a)} L${bus},${mid(a)} L${bus},${mid(b)} L${b.x},${mid(b)}`,
              from, to);
      }
    }
  }
  const shapeTexts = new Map();  // key -> the <text> that says the shape
  const boxNodes = new Map();
  for (const b of layout.boxes) {
    const g = svg("g", { class: "tfw-box", tabindex: -1, role: "button", "data-key": b.key,
                         "aria-label": b.name, "aria-description": b.about,
                         "aria-pressed": "false" });
    g.append(svg("title", { text: `${b.name}: ${b.about}` }));
    let shape;
    if (b.kind === "stream") {
      const cx = b.x + b.w / 2;
      // the circle and its label are one target: a transparent rect under both
      const reach = 18 + 7.2 * b.label.length;  // to the end of its name (0.6 em a character)
      g.append(svg("rect", { class: "tfw-hit", x: b.x, y: b.y + 4, width: b.w / 2 + reach,
                             height: b.h, fill: "transparent" }));
      g.append(svg("circle", { cx, cy: mid(b), r: 11 }));
      g.append(svg("text", { x: cx, y: mid(b) + 4, "text-anchor": "middle", text: "+" }));
      // below the line that brings the sub-layer's output back to the circle
      g.append(svg("text", { class: "tfw-stream-label", x: cx + 18, y: mid(b) + 13, text: b.label }));
      shape = svg("text", { class: "tfw-stream-label", x: cx + 18, y: mid(b) + 13 + LINE });
    } else {
      // the book's diagrams' tint for the concept (tfbook.diagrams.svg.COLOURS)
      g.append(svg("rect", { x: b.x, y: b.y, width: b.w, height: b.h, rx: 4, fill: "#fff" }));
      g.append(svg("rect", { x: b.x, y: b.y, width: b.w, height: b.h, rx: 4, fill: b.colour,
                             "fill-opacity": 0.16, stroke: b.colour }));
      // two lines of 12 px text, centred in the box by the height of their capitals
      g.append(svg("text", { x: b.x + b.w / 2, y: mid(b) - 3, "text-anchor": "middle", text: b.label }));
      shape = svg("text", { class: "tfw-shape", x: b.x + b.w / 2, y: mid(b) - 3 + LINE,
                            "text-anchor": "middle" });
    }
    g.append(shape);
    shapeTexts.set(b.key, shape);
    boxNodes.set(b.key, g);
    diagram.append(g);
  }
  // a deep model (SmolLM2: 30 blocks) scrolls inside its own box, not the page
  const diagramBox = el("div", { class: "tfw-scroll tfw-diagram" }, diagram);

  // --- the panel of the selected box ---------------------------------------------------------
  const title = el("div", { class: "tfw-title", style: "font-weight: 600; margin-top: 6px" });
  const about = el("div", { class: "tfw-about" });
  const formula = el("div", { class: "tfw-formula" });
  const facts = el("div", { class: "tfw-note tfw-facts" });
  // a change of box is read out by a screen reader: name, explanation, shape and range
  const said = el("div", { class: "tfw-said", "aria-live": "polite" }, title, about, formula, facts);
  const legend = el("div", { class: "tfw-legend" });
  const labels = el("div", { class: "tfw-labels" });
  const cols = el("div", { class: "tfw-cols", "aria-hidden": "true" });
  const canvas = el("canvas", { width: 1, height: 1, role: "img", "aria-label": "the tensor as a heatmap" });
  const rowMark = el("div", { class: "tfw-row-mark" });
  const canvasBox = el("div", { class: "tfw-canvas-box" }, cols, canvas, rowMark);
  const heat = el("div", { class: "tfw-heat" }, labels, canvasBox);
  const readout = el("div", { class: "tfw-note tfw-readout" });
  const topTable = el("table", { class: "tfw-top" });
  const chartTitle = el("div", { class: "tfw-note" },
                        "norm of the residual stream ‖xₜ‖ after each addition, one line a " +
                        "token: x⁽ˡ⁾ enters block l, x⁽ˡ⁾+a is after its attention");
  const CHART_W = 270;  // fits the panel beside the diagram
  const chart = svg("svg", { class: "tfw-norms", width: CHART_W, height: 150, role: "img",
                             "aria-label": "the norm of the residual stream at each state" });
  // the diagram and the selected box's panel side by side when the column is wide enough
  const panel = el("div", { class: "tfw-panel" }, said, legend, heat, readout, topTable,
                   chartTitle, el("div", { class: "tfw-scroll" }, chart));
  node.append(el("div", { class: "tfw-body" }, diagramBox, panel));

  // --- state --------------------------------------------------------------------------------
  let run = null;  // {ids, tokens, dropped, tensors: {key: Float32Array}, norms: [[T]], T}
  let hover = -1;  // the token under the pointer, -1 for none
  let shownView = null;  // the heatmap on screen: its view and cell width
  let gpt = null;
  let live = false;
  let runs = 0;
  let pending = false;
  let focusKey = model.get("box");  // the diagram's one tab stop
  const hasPageModel = () => model.get("page_model") !== "";
  const inPage = () => hasPageModel();
  const inPython = () => !hasPageModel() && live;

  /** The (rows, cols) values the selected box shows for head h, and its description. */
  function view(key, h) {
    const b = boxes.get(key);
    if (!run) return null;
    const values = run.tensors[key];
    if (!values) return { missing: true, b };
    const T = run.T;
    if (key === "logits") return { logits: values, b, rows: T, cols: n.V };
    if (b.kind === "weights") {
      const S = values.length / (n.H * T);
      return { b, rows: T, cols: S, values: values.subarray(h * T * S, (h + 1) * T * S),
               shape: `(T, T) = (${T}, ${S}), head ${h} of (H, T, T) = (${n.H}, ${T}, ${S})`,
               probabilities: true };
    }
    const width = values.length / T;
    if (b.kind === "head") {
      const isQ = key.endsWith(".q");
      const group = n.H / n.H_kv;
      const g = isQ ? h : Math.floor(h / group);  // grouped heads share a key/value head
      const part = new Float32Array(T * n.D);
      for (let t = 0; t < T; t++) part.set(values.subarray(t * width + g * n.D, t * width + (g + 1) * n.D), t * n.D);
      const which = isQ || group === 1 ? `head ${h}` : `key/value head ${g} (shared by query heads ${g * group}-${(g + 1) * group - 1})`;
      return { b, rows: T, cols: n.D, values: part, first: g * n.D,
               shape: `(T, D) = (${T}, ${n.D}), ${which} of (T, ${isQ ? "C" : "H_kv·D"}) = (${T}, ${width})` };
    }
    const dims = b.shape.map((d) => (d === "T" ? T : n[d]));
    return { b, rows: T, cols: width, values,
             shape: `(${b.shape.join(", ")}) = (${dims.join(", ")})` };
  }

  function drawShapes() {
    const changed = [];
    for (const b of layout.boxes) {
      const text = shapeTexts.get(b.key);
      const dims = b.shape.map((d) => (d === "T" ? (run ? run.T : "T") : n[d]));
      const label = `(${dims.join(", ")})`;
      if (text.textContent === label) continue;  // same T: nothing to draw or measure
      text.textContent = label;
      if (b.kind !== "stream") changed.push([text, b.w - 4]);
    }
    if (changed.length) fitLabels(changed);
  }

  function drawStrip() {
    const spans = run ? run.tokens.map((t, i) => el("span", { "data-index": i }, ...tokenNodes(t))) : [];
    strip.replaceChildren(...spans);
  }

  /** The colour legend of the heatmap: its scale from end to end. */
  function drawLegend(v, vmax) {
    const stops = v.probabilities ? [[255, 255, 255], PROBABILITY_TOP]
      : [[0, 0, 255], [255, 255, 255], [255, 0, 0]];
    const ramp = el("span", { class: "tfw-ramp" });
    ramp.style.background = `linear-gradient(to right, ${stops.map((c) => `rgb(${c.join(",")})`).join(", ")})`;
    const ends = v.probabilities ? ["0", "1"] : [`−${vmax.toPrecision(3)}`, `+${vmax.toPrecision(3)}`];
    legend.replaceChildren(el("span", {}, "colour:"), el("span", {}, ends[0]), ramp,
                           el("span", {}, ends[1]),
                           el("span", {}, v.probabilities ? "(weight)" : "(0 is white)"));
    legend.style.display = "";
  }

  /** The labels of the heatmap's rows (tokens) and columns (key tokens for the weights,
   *  feature indices otherwise), for cells `cell` px wide. */
  function drawAxes(v, cell) {
    const weights = Boolean(v.probabilities);
    const height = weights ? 64 : 16;
    cols.className = weights ? "tfw-cols tfw-keys" : "tfw-cols";
    cols.style.height = `${height}px`;
    cols.style.width = `${v.cols * cell + 2}px`;
    const heads = [];
    if (weights) {  // one key token a column, read from the bottom up
      for (let s = 0; s < v.cols; s++) {
        heads.push(el("span", { style: `left: ${1 + s * cell}px; width: ${cell}px; line-height: ${cell}px` },
                      tokenString(run.tokens[s])));
      }
    } else {
      const step = tickStep(cell, 36);
      for (let c = 0; c < v.cols; c += step) {
        const at = 1 + c * cell + cell / 2;
        heads.push(el("span", { style: `left: ${at}px; transform: translateX(${c ? -50 : 0}%)` },
                      String((v.first || 0) + c)));
      }
    }
    cols.replaceChildren(...heads);
    const corner = el("span", { class: "tfw-corner", style: `height: ${height + 1}px` },
                      weights ? "query ↓ key →" : "feature →");
    labels.replaceChildren(corner, ...run.tokens.map((t, i) =>
      el("span", { "data-index": i, title: tokenString(t) }, ...tokenNodes(t))));
    rowMark.style.width = `${v.cols * cell + 2}px`;
    rowMark.dataset.top = String(height);
  }

  /** The heatmap of the selected box: one pixel a value, scaled up on the canvas. */
  function drawPanel() {
    const key = model.get("box"), h = model.get("head");
    for (const [k, g] of boxNodes) {
      g.classList.toggle("tfw-on", k === key);
      g.setAttribute("aria-pressed", String(k === key));
    }
    const v = view(key, h);
    const b = boxes.get(key);
    title.textContent = b.name;
    about.replaceChildren(b.about);
    formula.replaceChildren(...formulaNodes(b.formula));
    topTable.replaceChildren();
    heat.style.display = legend.style.display = "none";
    readout.textContent = "";
    shownView = null;
    node.explorerShown = null;
    if (!v) { facts.textContent = ""; return; }
    if (v.missing) {
      facts.textContent = inPython() ? "asking Python for this box…"
        : "this box was not saved with the page: run the chapter in Jupyter to see it";
      return;
    }
    if (v.logits) { drawTop(v); return; }
    let min = Infinity, max = -Infinity;
    for (const x of v.values) { if (x < min) min = x; if (x > max) max = x; }
    facts.textContent = `shape ${v.shape}; values from ${min.toPrecision(4)} to ${max.toPrecision(4)}`;
    const vmax = Math.max(Math.abs(min), Math.abs(max)) || 1;
    const room = (panel.clientWidth || 400) - 90;  // beside the token labels
    // attention weights in square cells, one key token a column (the box scrolls sideways
    // for a long text); other tensors as wide as the panel allows
    const cell = v.probabilities ? ROW_PX : Math.max(1, Math.min(12, Math.floor(room / v.cols)));
    const image = new ImageData(v.cols, v.rows);
    for (let i = 0; i < v.values.length; i++) {
      image.data.set([...cellColour(v.values[i], v.probabilities, vmax), 255], 4 * i);
    }
    const small = el("canvas", { width: v.cols, height: v.rows });
    small.getContext("2d").putImageData(image, 0, 0);
    canvas.width = v.cols * cell;
    canvas.height = v.rows * ROW_PX;
    const context = canvas.getContext("2d");
    context.imageSmoothingEnabled = false;
    context.drawImage(small, 0, 0, canvas.width, canvas.height);
    drawLegend(v, vmax);
    drawAxes(v, cell);
    heat.style.display = "";
    shownView = { v, cell };
    readout.textContent = `${touch ? "tap" : "point at"} a cell to read its value`;
    node.explorerShown = { key, head: h, rows: v.rows, cols: v.cols, values: v.values, min, max };
    drawHover();
  }

  /** The value under the pointer or finger: its token, its column and the number. */
  function readCell(event) {
    if (!shownView || !run) return;
    const { v, cell } = shownView;
    const rect = canvas.getBoundingClientRect();
    const t = Math.floor((event.clientY - rect.top - 1) / ROW_PX);
    const c = Math.floor((event.clientX - rect.left - 1) / cell);
    if (t < 0 || t >= v.rows || c < 0 || c >= v.cols) return;
    const x = v.values[t * v.cols + c];
    readout.textContent = v.probabilities
      ? `query “${tokenString(run.tokens[t])}” (${t}) reads key “${tokenString(run.tokens[c])}” ` +
        `(${c}) with weight ${x.toFixed(4)}`
      : `token “${tokenString(run.tokens[t])}” (${t}), feature ${(v.first || 0) + c}: ` +
        `${x.toPrecision(4)}`;
    node.explorerCell = { row: t, col: c, value: x, text: readout.textContent };
    setHover(t);
  }

  /** The logits box: the most likely next tokens after the hovered token (or the last). */
  function drawTop(v) {
    const t = hover >= 0 && hover < run.T ? hover : run.T - 1;
    let top;
    if (run.top) {  // from Python
      top = run.top.tokens[t].map((token, i) => ({ token: fromPage(token), prob: run.top.probs[t][i] }));
    } else {
      const row = v.logits.subarray(t * n.V, (t + 1) * n.V);
      top = topOf(row, 10).map(({ id, prob }) => ({ id, token: gpt.tokenizer.tokenText(id), prob }));
    }
    facts.textContent = `shape (T, V) = (${run.T}, ${n.V}); the next token after ` +
      `“${tokenString(run.tokens[t])}” (position ${t}; ${point} a token for another)`;
    topTable.replaceChildren(...top.map(({ token, prob }) => el("tr", {},
      el("td", { class: "tfw-token" }, ...tokenNodes(token)),
      el("td", {}, el("span", { class: "tfw-bar", style: `width: ${Math.round(prob * 120)}px` })),
      el("td", {}, prob.toFixed(4)))));
    node.explorerShown = { key: "logits", row: t, top };
  }

  function drawNorms() {
    chart.replaceChildren();
    if (!run || !run.norms) return;
    const P = run.norms.length, T = run.T;
    const W = CHART_W, H = 150, pad = { l: 40, r: 18, t: 8, b: 22 };  // r: room for the last name
    let top = 0;
    for (const row of run.norms) for (const x of row) top = Math.max(top, x);
    const sx = (p) => pad.l + (p / Math.max(1, P - 1)) * (W - pad.l - pad.r);
    const sy = (y) => H - pad.b - (y / (top || 1)) * (H - pad.t - pad.b);
    chart.append(svg("rect", { x: pad.l, y: pad.t, width: W - pad.l - pad.r,
                               height: H - pad.t - pad.b, fill: "none", stroke: "#aaa" }));
    for (let t = 0; t < T; t++) {
      const points = run.norms.map((row, p) => `${sx(p).toFixed(1)},${sy(row[t]).toFixed(1)}`).join(" ");
      chart.append(svg("polyline", { points, "data-index": t }));
    }
    const every = P <= 5 ? 1 : 2 * Math.ceil((P - 1) / 10);  // at most 6 names, none crowded
    for (let p = 0; p < P; p += every) {
      chart.append(svg("text", { x: sx(p), y: H - pad.b + 15, "text-anchor": "middle",
                                 text: streamLabel(p) }));
    }
    const topText = top >= 1000 ? `${(top / 1000).toFixed(1)}k` : top.toFixed(1);
    chart.append(svg("text", { x: pad.l - 4, y: pad.t + 9, "text-anchor": "end", text: topText }));
    chart.append(svg("text", { x: pad.l - 4, y: H - pad.b, "text-anchor": "end", text: "0" }));
  }

  /** Light the hovered token's row everywhere. */
  function drawHover() {
    for (const span of strip.children) span.classList.toggle("tfw-hot", Number(span.dataset.index) === hover);
    for (const span of labels.children) {
      span.classList.toggle("tfw-hot", span.dataset.index !== undefined && Number(span.dataset.index) === hover);
    }
    for (const line of chart.querySelectorAll("polyline")) {
      const hot = Number(line.dataset.index) === hover;
      line.classList.toggle("tfw-hot-line", hot);
      if (hot) chart.append(line);  // on top
    }
    rowMark.style.display = hover >= 0 && heat.style.display !== "none" ? "block" : "none";
    rowMark.style.top = `${Number(rowMark.dataset.top || 0) + hover * ROW_PX + 1}px`;
    if (model.get("box") === "logits" && run) drawTop(view("logits", 0));
  }

  function setHover(t) {
    if (t === hover) return;
    hover = t;
    drawHover();
  }

  function drawAll() {
    drawShapes();
    drawStrip();
    drawNorms();
    drawPanel();
    cut.textContent = run && run.dropped ? cutNote(run.T + run.dropped, n.T_max) : "";
  }

  /** A new text: nothing of the last one stays (its cut note, the hovered token). */
  function forgetText() {
    hover = -1;
    cut.textContent = "";
  }

  // --- the sentence: run in the page, or Python's data ------------------------------------
  function normsOf(tensors, T) {
    const keys = ["embed"];
    for (let l = 0; l < n.L; l++) keys.push(`blocks.${l}.resid1`, `blocks.${l}.resid2`);
    return keys.map((key) => {
      const x = tensors[key], C = x.length / T, out = [];
      for (let t = 0; t < T; t++) {
        let sum = 0;
        for (let c = 0; c < C; c++) sum += x[t * C + c] * x[t * C + c];
        out.push(Math.sqrt(sum));
      }
      return out;
    });
  }

  function runHere(typedAt) {
    pending = false;
    const text = textInput.value;
    if (text.trim() === "") {
      forgetText();
      drawHover();
      status.textContent = EMPTY_TEXT;
      return;
    }
    try {
      gpt = gpt || new PageGPT(JSON.parse(model.get("page_model")));
      const start = performance.now();
      const all = gpt.tokenizer.encode(text);
      if (!all.length) throw new Error("the text has no tokens");
      const { ids, dropped } = fitContext(all, gpt.config.max_len);
      const tensors = {};
      gpt.forward(ids, { record: (key, tensor) => { tensors[key] = tensor; } });
      const T = ids.length;
      runs += 1;
      run = { ids, tokens: ids.map((id) => gpt.tokenizer.tokenText(id)), dropped, tensors, T,
              norms: normsOf(tensors, T), runs };
      node.explorerRun = run;
      times.runs.push(performance.now() - start);
      status.textContent = "";
    } catch (error) {
      status.textContent = error.message;  // e.g. a lone surrogate: the views stay as they were
      return;
    }
    forgetText();
    drawAll();
    if (typedAt !== undefined) times.typing.push(performance.now() - typedAt);
  }

  function fromPython() {
    const tokens = model.get("tokens");
    if (!tokens.length) return;
    const shown = model.get("shown");
    const tensors = {};
    if (shown && shown.key && shown.data) tensors[shown.key] = floatsOf(shown.data);
    if (shown && shown.key === "logits") tensors.logits = new Float32Array(0);
    const text = tokens.join("");
    if (run && run.text !== text) forgetText();
    run = { ids: null, tokens: tokens.map(fromPage), dropped: model.get("dropped"), tensors,
            T: tokens.length, norms: model.get("norms"), top: model.get("top"), text };
    node.explorerRun = run;
    drawAll();
  }

  function select(key, h) {
    const clicked = performance.now();
    const changed = key !== model.get("box") || h !== model.get("head");
    model.set("box", key);
    model.set("head", h);
    model.save_changes();
    headSlider.set(h);
    setFocusKey(key);
    if (inPython() && changed && !(run && run.tensors[key] && model.get("shown").head === h)) {
      request(model, { box: key, head: h });
    }
    drawPanel();
    const drawn = performance.now();
    times.clicks.push(drawn - clicked);
    requestAnimationFrame(() => times.clickFrames.push(performance.now() - clicked));
  }

  // --- the keyboard: one tab stop, arrow keys between the boxes ---------------------------
  function setFocusKey(key) {
    if (!boxNodes.has(key)) return;
    boxNodes.get(focusKey)?.setAttribute("tabindex", "-1");
    focusKey = key;
    boxNodes.get(key).setAttribute("tabindex", "0");
  }

  const centre = (b) => [b.x + b.w / 2, b.y + b.h / 2];

  /** The box the key `name` moves to from box `key` (or undefined). */
  function neighbour(key, name) {
    const at = order.indexOf(key), b = boxes.get(key);
    if (name === "ArrowRight") return order[at + 1];
    if (name === "ArrowLeft") return order[at - 1];
    if (name === "Home") return order[0];
    if (name === "End") return order[order.length - 1];
    if (name === "PageDown" || name === "PageUp") {  // the same box of the next block
      const step = name === "PageDown" ? 1 : -1;
      if (b.layer < 0) {  // from above the blocks into block 0, from below into the last
        const above = at < order.indexOf("blocks.0.norm1");
        if (above && step > 0) return "blocks.0.norm1";
        return !above && step < 0 ? `blocks.${n.L - 1}.norm1` : undefined;
      }
      const other = key.replace(/^blocks\.\d+\./, `blocks.${b.layer + step}.`);
      return boxes.has(other) ? other : (step > 0 ? "norm_f" : "embed");
    }
    if (name === "ArrowDown" || name === "ArrowUp") {  // the nearest box below or above
      const down = name === "ArrowDown";
      const [cx] = centre(b);
      let best, score = Infinity;
      for (const c of layout.boxes) {
        const gap = down ? c.y - (b.y + b.h) : b.y - (c.y + c.h);
        if (c === b || gap < 0) continue;
        const s = gap + 2 * Math.abs(centre(c)[0] - cx);
        if (s < score) { score = s; best = c.key; }
      }
      return best;
    }
    return undefined;
  }

  /** The box in sight inside the diagram's own scroll box: vertically only, so that the
   *  residual stream at the left stays in view (a phone never opens scrolled sideways).
   *  Never scrolls the page. */
  function reveal(key) {
    const g = boxNodes.get(key);
    const box = diagramBox.getBoundingClientRect();
    if (!g || !box.width || !box.height) return;  // not laid out yet
    const r = g.getBoundingClientRect();
    if (r.top < box.top || r.bottom > box.bottom) {
      diagramBox.scrollTop += (r.top + r.bottom) / 2 - (box.top + box.bottom) / 2;
    }
  }

  diagram.addEventListener("click", (event) => {
    const g = event.target.closest(".tfw-box");
    if (g) select(g.dataset.key, model.get("head"));
  });
  diagram.addEventListener("keydown", (event) => {
    const g = event.target.closest && event.target.closest(".tfw-box");
    if (!g) return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      select(g.dataset.key, model.get("head"));
      return;
    }
    const next = neighbour(g.dataset.key, event.key);
    if (next === undefined && !["ArrowDown", "ArrowUp", "ArrowLeft", "ArrowRight", "Home", "End",
                                "PageDown", "PageUp"].includes(event.key)) return;
    event.preventDefault();  // the page does not scroll under the reader's arrow keys
    if (next === undefined) return;
    setFocusKey(next);
    boxNodes.get(next).focus({ preventScroll: true });
    reveal(next);
  });
  diagram.addEventListener("focusin", (event) => {
    const g = event.target.closest && event.target.closest(".tfw-box");
    if (g) setFocusKey(g.dataset.key);
  });

  // --- the pointer: a token's row everywhere, a cell's value ---------------------------------
  const hoverFrom = (event) => {
    const index = event.target.closest && event.target.closest("[data-index]");
    if (index) setHover(Number(index.dataset.index));
  };
  for (const target of [strip, labels, chart]) {
    target.addEventListener("mouseover", hoverFrom);
    target.addEventListener("pointerdown", hoverFrom);  // a tap
  }
  canvas.addEventListener("pointermove", readCell);
  canvas.addEventListener("pointerdown", readCell);

  function submit(typedAt) {
    if (inPage()) {
      if (!pending) {
        pending = true;  // one run per frame however fast the reader types
        requestAnimationFrame(() => runHere(typedAt));
      }
    } else if (inPython()) {
      if (textInput.value.trim() === "") {
        forgetText();
        drawHover();
        status.textContent = EMPTY_TEXT;
        return;
      }
      status.textContent = "";
      request(model, { text: textInput.value });
    }
  }
  textInput.addEventListener("input", () => { if (inPage()) submit(performance.now()); });
  textInput.addEventListener("keydown", (event) => { if (event.key === "Enter") submit(performance.now()); });
  runButton.addEventListener("click", () => submit(performance.now()));

  function drawMode() {
    const page = inPage(), python = inPython();
    textInput.disabled = runButton.disabled = !(page || python);
    runButton.style.display = page ? "none" : "";
    note.textContent = page ? "the model runs in this page as you type: no kernel, no network"
      : python ? "Python runs the model" : "static page: run the chapter in Jupyter to try your own text";
  }
  watchLive(model, (isLive) => { live = isLive; drawMode(); if (isLive && !hasPageModel()) drawPanel(); });
  for (const name of ["tokens", "norms", "top", "shown", "dropped"]) {
    model.on(`change:${name}`, () => { if (!hasPageModel()) fromPython(); });
  }
  model.on("change:error", () => showError(status, model));
  model.on("change:box", () => { setFocusKey(model.get("box")); drawPanel(); });
  model.on("change:head", () => { headSlider.set(model.get("head")); drawPanel(); });

  setFocusKey(focusKey);
  drawMode();
  if (hasPageModel()) runHere();
  else fromPython();
  if (!run) drawAll();
  times.drawnAt = performance.now();
  times.firstDraw = times.drawnAt - started;
  requestAnimationFrame(() => reveal(model.get("box")));  // once the page has laid it out
}

export default { render };
