// The model explorer (tfbook/widgets/explorer.py): a decoder's architecture diagram, drawn
// in SVG from the layout Python computed from the model's config. Click a box to see its
// tensor for the reader's sentence as a heatmap (rows are tokens), with its shape and range;
// the logits box lists the most likely next tokens. Hover a token to light its row in every
// view; the chart below plots the norm of the residual stream at each of its states.
//
// Where the tensors come from. With a page model (`page_model`, a small GPT's payload) the
// page runs the sentence itself: gpt.js's forward pass with its `record` hook, which hands
// over every intermediate under the same keys as Python's forward hooks (trace_decoder).
// Fed by Python (any tfbook decoder, in Jupyter), the page holds the tokens, the norms, the
// top next tokens and the selected box's tensor (`shown`); another box is asked of Python.
//
// Text from data (tokens, the sentence) is set with textContent only (common.js's rule).
// Timings for the tests (performance.now(), in this view): node.explorerTimes.

// one token's row in the heatmap and its label: 12 px text with room for what hangs below
// the baseline (the ␣ of a space)
const ROW_PX = 14;
const EXPLORER_STYLE = `
.tfw-explorer { max-width: 100%; }
.tfw-explorer .tfw-scroll { overflow-x: auto; max-width: 100%; }
.tfw-explorer .tfw-diagram { max-height: 560px; overflow-y: auto; flex: 0 1 auto; }
.tfw-explorer .tfw-body { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
/* beside the diagram when the column holds both, below it when it does not (the book's
   688 px column and a phone, with every text at 12 px): flex-wrap decides from the
   container's width */
.tfw-explorer .tfw-panel { flex: 1 1 270px; min-width: 0; }
/* no text below the book's minimum size, 12 px (explorer.py's FONT_PX) */
.tfw-explorer svg text { font: 12px system-ui, sans-serif; }
.tfw-explorer svg text.tfw-shape { fill: #444; }
.tfw-explorer .tfw-box rect { stroke: #555; stroke-width: 1; cursor: pointer; }
.tfw-explorer .tfw-box rect.tfw-hit { stroke: none; }
.tfw-explorer .tfw-box text { fill: #222; pointer-events: none; }
.tfw-explorer .tfw-box.tfw-on rect:not(.tfw-hit), .tfw-explorer .tfw-box.tfw-on circle { stroke: #d62728; stroke-width: 3; }
.tfw-explorer .tfw-box circle { stroke: #555; fill: #fff; cursor: pointer; }
.tfw-explorer .tfw-box text.tfw-stream-label { fill: currentColor; }
.tfw-explorer .tfw-box:focus:not(:focus-visible) { outline: none; }
.tfw-explorer .tfw-edge { stroke: #888; stroke-width: 1.2; fill: none; }
.tfw-explorer .tfw-stream { stroke: #1f77b4; stroke-width: 4; opacity: 0.5; }
.tfw-explorer .tfw-strip { display: flex; flex-wrap: wrap; gap: 2px; margin: 4px 0; }
.tfw-explorer .tfw-strip span, .tfw-explorer .tfw-labels span { font-family: monospace;
  white-space: pre; border-radius: 3px; padding: 0 2px; cursor: default; }
.tfw-explorer .tfw-strip span { background: rgba(127,127,127,0.15); }
.tfw-explorer .tfw-hot { background: #ffd54f !important; color: #222; }
.tfw-explorer .tfw-heat { display: flex; align-items: flex-start; gap: 4px; }
.tfw-explorer .tfw-labels { display: flex; flex-direction: column; text-align: right;
  max-width: 9em; overflow: hidden; flex: none; }
.tfw-explorer .tfw-labels span { display: block; height: ${ROW_PX}px; line-height: ${ROW_PX}px;
  font-size: 12px; overflow: hidden; text-overflow: ellipsis; }
.tfw-explorer .tfw-canvas-box { position: relative; overflow-x: auto; }
.tfw-explorer canvas { display: block; border: 1px solid #ccc; }
.tfw-explorer .tfw-row-mark { position: absolute; left: 0; right: 0; height: ${ROW_PX}px;
  outline: 2px solid #d62728; pointer-events: none; display: none; }
.tfw-explorer .tfw-top { border-collapse: collapse; font-size: 12px; }
.tfw-explorer .tfw-top td { padding: 0 6px; }
.tfw-explorer .tfw-bar { display: inline-block; height: 9px; background: #1f77b4; }
.tfw-explorer .tfw-norms polyline { fill: none; stroke: #999; stroke-width: 1; }
.tfw-explorer .tfw-norms polyline.tfw-hot-line { stroke: #d62728; stroke-width: 2.5; }
.tfw-explorer .tfw-norms text { fill: currentColor; font-size: 12px; }
.tfw-explorer input[type=text] { width: min(36em, 90%); font: inherit; }
`;

const LINE = 15;  // between a box's name and its shape label (explorer.py's LINE)
const BOX_FILL = { embed: "#d9ead3", stream: "#fff", norm: "#fff2cc", head: "#cfe2f3",
                   weights: "#cfe2f3", linear: "#cfe2f3", hidden: "#f4cccc", logits: "#d9d2e9" };
const KIND_TITLE = {
  embed: "a row of a weight matrix for each token", stream: "the residual stream: everything adds to it",
  norm: "the stream normalised (its gain and bias applied)", head: "one head's slice of the projection",
  weights: "softmax(q kᵀ / √D) of one head: row t is where token t looks",
  linear: "the sub-layer's output, added to the stream", hidden: "the FFN's hidden units after the activation",
  logits: "h Eᵀ: a score for every token of the vocabulary",
};
const SUPERSCRIPT = "⁰¹²³⁴⁵⁶⁷⁸⁹";

/** The stream's state number p (0 .. 2L) in the book's notation (explorer.py's stream_label):
 *  x_t is a position's vector, so a superscript counts blocks: x⁽ˡ⁾ enters block l, x⁽ˡ⁾+a
 *  is the stream after block l's attention. */
function streamLabel(p) {
  const l = String(Math.floor(p / 2)).replace(/[0-9]/g, (d) => SUPERSCRIPT[d]);
  return `x⁽${l}⁾` + (p % 2 ? "+a" : "");
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

function render({ model, el: element }) {
  const started = performance.now();
  const node = root(element, "tfw-explorer");
  node.append(el("style", {}, EXPLORER_STYLE));
  const times = { firstDraw: null, clicks: [], typing: [], runs: [] };
  node.explorerTimes = times;

  const layout = model.get("diagram");
  const n = layout.sizes;  // C, H, H_kv, D, F, V, L, T_max
  const boxes = new Map(layout.boxes.map((b) => [b.key, b]));

  // --- controls --------------------------------------------------------------------------
  const textInput = el("input", { type: "text", "aria-label": "your sentence", spellcheck: "false" });
  textInput.value = fromPage(model.get("text"));
  const runButton = el("button", {}, "run");
  const note = el("span", { class: "tfw-note" });
  const status = el("div", { class: "tfw-note tfw-status", role: "status" });
  const cut = el("div", { class: "tfw-note tfw-cut" });
  const headSlider = slider({ label: "head", min: 1, max: n.H, value: model.get("head") + 1,
                              onInput: (v) => select(model.get("box"), v - 1) });
  node.append(el("div", { class: "tfw-row" }, textInput, runButton, note),
              el("div", { class: "tfw-row" }, headSlider.node, pythonStatus(model)), status, cut);
  if (n.H === 1) headSlider.node.style.display = "none";
  const strip = el("div", { class: "tfw-strip", "aria-label": "tokens" });
  node.append(strip);

  // --- the diagram -----------------------------------------------------------------------
  const diagram = svg("svg", { width: layout.width, height: layout.height + 8,
                               viewBox: `0 -4 ${layout.width} ${layout.height + 8}`,
                               role: "img", "aria-label": "the model's architecture" });
  const defs = svg("defs");
  const marker = svg("marker", { id: `tfw-arrow-${Math.random().toString(36).slice(2)}`,
                                 viewBox: "0 0 6 6", refX: 6, refY: 3, markerWidth: 6,
                                 markerHeight: 6, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M0,0 L6,3 L0,6 z", fill: "#888" }));
  defs.append(marker);
  diagram.append(defs);
  const streamBoxes = layout.boxes.filter((b) => b.kind === "stream");
  const streamX = streamBoxes[0].x + streamBoxes[0].w / 2;
  const last = layout.boxes.find((b) => b.key === "norm_f");
  diagram.append(svg("line", { class: "tfw-stream", x1: streamX, x2: streamX,
                               y1: streamBoxes[0].y + 17, y2: last.y + last.h / 2 }));
  const arrow = (d) => diagram.append(svg("path", { class: "tfw-edge", d,
                                                     "marker-end": `url(#${marker.id})` }));
  const mid = (b) => b.y + b.h / 2;
  for (const [from, to] of layout.edges) {
    const a = boxes.get(from), b = boxes.get(to);
    if (b.kind === "stream") {  // down from the box, then left into the stream's circle
      const x = a.x + a.w / 2;
      arrow(`M${x},${a.y + a.h} L${x},${mid(b)} L${b.x + b.w / 2 + 12},${mid(b)}`);
    } else if (a.y === b.y) {
      arrow(`M${a.x + a.w},${mid(a)} L${b.x},${mid(b)}`);
    } else {
      arrow(`M${a.x + a.w / 2},${a.y + a.h} L${b.x + b.w / 2},${b.y}`);
    }
  }
  for (const b of layout.boxes) {  // every norm reads the stream
    if (b.kind === "norm") arrow(`M${streamX},${mid(b)} L${b.x},${mid(b)}`);
  }
  const shapeTexts = new Map();  // key -> the <text> that says the shape
  const boxNodes = new Map();
  for (const b of layout.boxes) {
    const g = svg("g", { class: "tfw-box", tabindex: 0, role: "button", "data-key": b.key });
    g.append(svg("title", { text: `${b.label}: ${KIND_TITLE[b.kind]}` }));
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
      g.append(svg("rect", { x: b.x, y: b.y, width: b.w, height: b.h, rx: 4,
                             fill: BOX_FILL[b.kind] }));
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
  const facts = el("div", { class: "tfw-note tfw-facts" });
  const labels = el("div", { class: "tfw-labels" });
  const canvas = el("canvas", { width: 1, height: 1, "aria-label": "the tensor as a heatmap" });
  const rowMark = el("div", { class: "tfw-row-mark" });
  const canvasBox = el("div", { class: "tfw-canvas-box" }, canvas, rowMark);
  const heat = el("div", { class: "tfw-heat" }, labels, canvasBox);
  const topTable = el("table", { class: "tfw-top" });
  const chartTitle = el("div", { class: "tfw-note" },
                        "norm of the residual stream ‖xₜ‖ after each addition, one line a " +
                        "token: x⁽ˡ⁾ enters block l, x⁽ˡ⁾+a is after its attention");
  const CHART_W = 270;  // fits the panel beside the diagram
  const chart = svg("svg", { class: "tfw-norms", width: CHART_W, height: 150, role: "img" });
  // the diagram and the selected box's panel side by side when the column is wide enough
  const panel = el("div", { class: "tfw-panel" }, title, facts,
                   el("div", { class: "tfw-scroll" }, heat), topTable, chartTitle,
                   el("div", { class: "tfw-scroll" }, chart));
  node.append(el("div", { class: "tfw-body" }, diagramBox, panel));

  // --- state --------------------------------------------------------------------------------
  let run = null;  // {ids, tokens, dropped, tensors: {key: Float32Array}, norms: [[T]], T}
  let hover = -1;  // the token under the pointer, -1 for none
  let gpt = null;
  let live = false;
  let runs = 0;
  let pending = false;
  const hasPageModel = () => model.get("page_model") !== "";
  const inPage = () => hasPageModel();
  const inPython = () => !hasPageModel() && live;

  /** The (rows, cols) values the selected box shows for head h, and its description. */
  function view(key, h) {
    const b = boxes.get(key);
    if (!run) return null;
    let values = run.tensors[key];
    if (!values) return { missing: true, b };
    const T = run.T;
    if (key === "logits") return { logits: values, b, rows: T, cols: n.V };
    if (b.kind === "weights") {
      const S = values.length / (n.H * T);
      return { b, rows: T, cols: S, values: values.subarray(h * T * S, (h + 1) * T * S),
               shape: `(T, T) = (${T}, ${S}), head ${h + 1} of (H, T, T) = (${n.H}, ${T}, ${S})`,
               probabilities: true };
    }
    const width = values.length / T;
    if (b.kind === "head") {
      const isQ = key.endsWith(".q");
      const group = n.H / n.H_kv;
      const g = isQ ? h : Math.floor(h / group);  // grouped heads share a key/value head
      const part = new Float32Array(T * n.D);
      for (let t = 0; t < T; t++) part.set(values.subarray(t * width + g * n.D, t * width + (g + 1) * n.D), t * n.D);
      const which = isQ || group === 1 ? `head ${h + 1}` : `key/value head ${g + 1} (shared by query heads ${g * group + 1}-${(g + 1) * group})`;
      return { b, rows: T, cols: n.D, values: part,
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
    const spans = run ? run.tokens.map((t, i) => el("span", { "data-index": i }, visibleText(t))) : [];
    strip.replaceChildren(...spans);
    const rows = run ? run.tokens.map((t, i) => el("span", { "data-index": i, title: t }, visibleText(t))) : [];
    labels.replaceChildren(...rows);
  }

  /** The heatmap of the selected box: one pixel a value, scaled up on the canvas. */
  function drawPanel() {
    const key = model.get("box"), h = model.get("head");
    for (const [k, g] of boxNodes) g.classList.toggle("tfw-on", k === key);
    const v = view(key, h);
    const b = boxes.get(key);
    title.textContent = b.label + (b.layer >= 0 && b.kind !== "stream" ? ` (block ${b.layer})` : "");
    topTable.replaceChildren();
    heat.style.display = "none";
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
    facts.textContent = `shape ${v.shape}; values from ${min.toPrecision(4)} to ${max.toPrecision(4)}` +
      (v.probabilities ? "; white 0, dark blue 1" : "; blue negative, red positive");
    const room = (panel.clientWidth || 400) - 90;  // beside the token labels
    const cell = Math.max(1, Math.min(12, Math.floor(room / v.cols)));
    const image = new ImageData(v.cols, v.rows);
    const vmax = Math.max(Math.abs(min), Math.abs(max)) || 1;
    for (let i = 0; i < v.values.length; i++) {
      const x = v.values[i];
      let r, g, bl;
      if (v.probabilities) {
        const t = Math.max(0, Math.min(1, x));
        r = 255 - 215 * t; g = 255 - 155 * t; bl = 255 - 55 * t;
      } else {
        const t = Math.max(-1, Math.min(1, x / vmax));
        const fade = 255 * (1 - Math.abs(t));
        [r, g, bl] = t >= 0 ? [255, fade, fade] : [fade, fade, 255];
      }
      image.data.set([r, g, bl, 255], 4 * i);
    }
    const small = el("canvas", { width: v.cols, height: v.rows });
    small.getContext("2d").putImageData(image, 0, 0);
    canvas.width = v.cols * cell;
    canvas.height = v.rows * ROW_PX;
    const context = canvas.getContext("2d");
    context.imageSmoothingEnabled = false;
    context.drawImage(small, 0, 0, canvas.width, canvas.height);
    heat.style.display = "";
    node.explorerShown = { key, head: h, rows: v.rows, cols: v.cols, values: v.values, min, max };
    drawHover();
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
      `“${visibleText(run.tokens[t])}” (position ${t + 1}; hover a token for another)`;
    topTable.replaceChildren(...top.map(({ token, prob }) => el("tr", {},
      el("td", { class: "tfw-token" }, visibleText(token)),
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
    for (const span of labels.children) span.classList.toggle("tfw-hot", Number(span.dataset.index) === hover);
    for (const line of chart.querySelectorAll("polyline")) {
      const hot = Number(line.dataset.index) === hover;
      line.classList.toggle("tfw-hot-line", hot);
      if (hot) chart.append(line);  // on top
    }
    rowMark.style.display = hover >= 0 && heat.style.display !== "none" ? "block" : "none";
    rowMark.style.top = `${hover * ROW_PX + 1}px`;
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
    if (text.trim() === "") { status.textContent = EMPTY_TEXT; return; }
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
    if (hover >= run.T) hover = -1;
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
    run = { ids: null, tokens: tokens.map(fromPage), dropped: model.get("dropped"), tensors,
            T: tokens.length, norms: model.get("norms"), top: model.get("top") };
    node.explorerRun = run;
    drawAll();
  }

  function select(key, h) {
    const clicked = performance.now();
    const changed = key !== model.get("box") || h !== model.get("head");
    model.set("box", key);
    model.set("head", h);
    model.save_changes();
    headSlider.set(h + 1);
    if (inPython() && changed && !(run && run.tensors[key] && model.get("shown").head === h)) {
      request(model, { box: key, head: h });
    }
    drawPanel();
    times.clicks.push(performance.now() - clicked);
  }

  diagram.addEventListener("click", (event) => {
    const g = event.target.closest(".tfw-box");
    if (g) select(g.dataset.key, model.get("head"));
  });
  diagram.addEventListener("keydown", (event) => {
    const g = event.target.closest && event.target.closest(".tfw-box");
    if (g && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      select(g.dataset.key, model.get("head"));
    }
  });
  const hoverFrom = (event) => {
    const index = event.target.dataset && event.target.dataset.index;
    if (index !== undefined) setHover(Number(index));
  };
  strip.addEventListener("mouseover", hoverFrom);
  labels.addEventListener("mouseover", hoverFrom);
  chart.addEventListener("mouseover", hoverFrom);
  canvas.addEventListener("mousemove", (event) => {
    const rect = canvas.getBoundingClientRect();
    const t = Math.floor(((event.clientY - rect.top) / rect.height) * (run ? run.T : 0));
    if (run && t >= 0 && t < run.T) setHover(t);
  });

  function submit(typedAt) {
    if (inPage()) {
      if (!pending) {
        pending = true;  // one run per frame however fast the reader types
        requestAnimationFrame(() => runHere(typedAt));
      }
    } else if (inPython()) {
      if (textInput.value.trim() === "") { status.textContent = EMPTY_TEXT; return; }
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
  model.on("change:box", drawPanel);
  model.on("change:head", () => { headSlider.set(model.get("head") + 1); drawPanel(); });

  /** The selected box in sight inside the diagram's own scroll box (a deep model opens on a
   *  box far down; on a phone the box may lie off to the right). Never scrolls the page. */
  function revealSelected() {
    const g = boxNodes.get(model.get("box"));
    const view = diagramBox.getBoundingClientRect();
    if (!g || !view.width || !view.height) return;  // nothing selected, or not laid out yet
    const r = g.getBoundingClientRect();
    if (r.left < view.left || r.right > view.right) {
      diagramBox.scrollLeft += (r.left + r.right) / 2 - (view.left + view.right) / 2;
    }
    if (r.top < view.top || r.bottom > view.bottom) {
      diagramBox.scrollTop += (r.top + r.bottom) / 2 - (view.top + view.bottom) / 2;
    }
  }

  drawMode();
  if (hasPageModel()) runHere();
  else fromPython();
  if (!run) drawAll();
  times.firstDraw = performance.now() - started;
  requestAnimationFrame(revealSelected);  // once the page has laid the widget out
}

export default { render };
