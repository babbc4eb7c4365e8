// The head explorer (tfbook/widgets/heads.py): every head of a model as one grid, layers as
// rows and heads as columns, each cell coloured by the score the reader picks; below or
// beside it the attention pattern of the selected head on the selected text, queries as
// rows and keys as columns, with the tokens on both axes and the weight under the pointer.
//
// Each text's maps arrive as maps.js says, in (L, H, T, T) order. This file comes after
// common.js, tokenspans.js (showWhitespace), maps.js (inflateMaps, paintBytes, pageRunner,
// TYPED_NAME, EMPTY_TEXT) and, when the page carries a model, gpt.js.
//
// What is drawn when: the grid's cells once (another score changes only their colours and
// labels); the pattern once per text, head and cell size, one pixel a weight scaled up by
// CSS to cells that fit the column; the row and column under the pointer as two outlines
// laid over it. Token text is set with textContent, never as HTML.
//
// The keyboard: the grid is one tab stop (aria-activedescendant names the selected cell);
// the arrow keys move the selected head, Home and End go to the first and last head of the
// layer, Page Up and Page Down five layers up or down, Enter or Space selects the head
// under the cursor. Layers and heads are counted from 0, as in the code. A new selection
// (the first draw, a key, a click, Python) is scrolled into the grid's own box, never the page.
//
// Timings for the tests and bench/bench_heads.py (performance.now(), in this view):
// node.headsTimes = {firstDraw, drawnAt, clicks, clickFrames}.

const HEADS_STYLE = `
.tfw-heads .tfw-body { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
.tfw-heads .tfw-gridbox { max-height: 420px; overflow: auto; flex: 0 1 auto; max-width: 100%;
  border: 1px solid #ddd; }
.tfw-heads .tfw-hgrid { display: inline-grid; gap: 1px; padding: 0 2px 2px 0; vertical-align: top; }
.tfw-heads .tfw-hgrid:focus { outline: none; }
.tfw-heads .tfw-hgrid:focus-visible .tfw-cell.tfw-on { outline: 3px solid #c000c0; }
.tfw-heads .tfw-hrow { display: contents; }
.tfw-heads .tfw-hgrid > .tfw-hrow > span { font-size: 12px; line-height: 22px; color: #444;
  background: #fff; }
.tfw-heads .tfw-colhead { position: sticky; top: 0; text-align: center; z-index: 1; }
/* one line: "L10" never breaks into "L1" / "0" (the root's overflow-wrap: anywhere) */
.tfw-heads .tfw-rowhead { position: sticky; left: 0; text-align: right; padding: 0 4px 0 2px;
  white-space: nowrap; overflow-wrap: normal; min-width: 3ch; }
.tfw-heads .tfw-cell { height: 22px; cursor: pointer; box-sizing: border-box;
  border: 1px solid rgba(0, 0, 0, 0.08); }
.tfw-heads .tfw-cell.tfw-on { outline: 3px solid #222; outline-offset: -3px; }
.tfw-heads .tfw-cell.tfw-hover { box-shadow: inset 0 0 0 2px #888; }
.tfw-heads .tfw-legend { display: flex; align-items: center; gap: 6px; font-size: 12px;
  color: #444; flex-wrap: wrap; }
.tfw-heads .tfw-ramp { display: inline-block; width: 110px; height: 10px; border: 1px solid #aaa; }
.tfw-heads .tfw-panel { flex: 1 1 300px; min-width: 0; }
.tfw-heads .tfw-said { font-size: 13px; margin: 2px 0 4px; }
.tfw-heads .tfw-readout { min-height: 2.8em; font-size: 12px; }
.tfw-heads .tfw-patternbox { overflow-x: auto; max-width: 100%; }
.tfw-heads .tfw-heat { display: grid; }
.tfw-heads .tfw-corner { font-size: 12px; color: #666; display: flex; flex-direction: column;
  justify-content: flex-end; align-items: flex-end; padding: 0 4px 2px 0; line-height: 1.2;
  white-space: nowrap; }
.tfw-heads .tfw-keys, .tfw-heads .tfw-queries, .tfw-heads .tfw-mapbox { position: relative; }
.tfw-heads .tfw-keys span, .tfw-heads .tfw-queries span { position: absolute; font: 12px monospace;
  white-space: pre; overflow: hidden; text-overflow: ellipsis; color: #333; }
.tfw-heads .tfw-keys span { bottom: 0; max-height: calc(100% - 4px); width: 14px; line-height: 14px;
  writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
.tfw-heads .tfw-queries span { right: 4px; height: 14px; line-height: 14px; max-width: calc(100% - 4px);
  text-align: right; }
.tfw-heads .tfw-keys span.tfw-hot, .tfw-heads .tfw-queries span.tfw-hot { color: #d62728;
  font-weight: bold; }
.tfw-heads .tfw-mapbox canvas { display: block; cursor: crosshair; touch-action: pan-x pan-y; }
.tfw-heads .tfw-mark { position: absolute; pointer-events: none; display: none;
  outline: 2px solid #d62728; }
.tfw-heads .tfw-cut { color: #b35900; }
.tfw-heads select { max-width: min(24em, 100%); }
/* 16 px: a phone does not zoom the page when the text box takes the focus */
.tfw-heads input[type=text] { width: min(30em, 90%); font: 16px system-ui, sans-serif; }
`;

const LABEL_PX = 14;  // a token label's line: 12 px text
const PATTERN_CELL_MAX = 22;  // the pattern's cells, px: as large as the column allows, up to this
const PATTERN_CELL_MIN = 4;  // and down to this (a longer text scrolls sideways in its own box)
const PAGE_STEP = 5;  // layers moved by Page Up / Page Down

// A piece of a character in a token label (Python's token_label, gpt.js's pageTokenLabel):
// its bytes in hex between ‹ ›, kept as they are; whitespace elsewhere made visible.
const PIECE_RE = /(‹[0-9a-f]{2}(?: [0-9a-f]{2})*›)/;

function shownToken(label) {
  return String(label).split(PIECE_RE).map((part, i) => (i % 2 ? part : showWhitespace(part)))
    .join("");
}

/** A score as the page writes it: 4 significant digits. */
function scoreText(v) {
  return String(Number(v.toPrecision(4)));
}

function render({ model, el: element }) {
  const started = performance.now();
  const node = root(element, "tfw-heads");
  node.append(el("style", {}, HEADS_STYLE));
  const times = { firstDraw: null, drawnAt: null, clicks: [], clickFrames: [] };
  node.headsTimes = times;
  const [L, H] = model.get("heads");
  const gridId = `tfw-heads-${Math.random().toString(36).slice(2)}`;

  // --- controls -----------------------------------------------------------------------------
  const title = el("div", { class: "tfw-title", style: "font-weight: 600" });
  const scorePicker = el("select", { "aria-label": "score" });
  const textPicker = el("select", { "aria-label": "text" });
  const legend = el("div", { class: "tfw-legend", "aria-label": "colour legend" });
  node.append(title,
              el("div", { class: "tfw-row" }, el("label", {}, "colour by ", scorePicker), legend),
              el("div", { class: "tfw-row" }, el("label", {}, "text ", textPicker)));
  const textInput = el("input", { type: "text", "aria-label": "your text", spellcheck: "false",
                                  placeholder: "type a sentence" });
  const runButton = el("button", {}, "run");
  const note = el("div", { class: "tfw-note" });
  const status = el("span", { class: "tfw-note tfw-status", role: "status" });
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" });
  const liveRow = el("div", {}, el("div", { class: "tfw-row" }, textInput, runButton),
                     note, el("div", { class: "tfw-row" }, status, errorBox, pythonStatus(model)));
  node.append(liveRow);

  // --- the grid: a header row (heads), then a row a layer (its name, then its heads) ----------
  const grid = el("div", { class: "tfw-hgrid", role: "grid", tabindex: 0,
                           "aria-rowcount": L + 1, "aria-colcount": H + 1 });
  grid.style.gridTemplateColumns = `auto repeat(${H}, minmax(24px, 36px))`;
  const header = el("div", { class: "tfw-hrow", role: "row" },
                    el("span", { class: "tfw-colhead tfw-rowhead", role: "columnheader",
                                 "aria-label": "layer" }));
  for (let h = 0; h < H; h++) {
    header.append(el("span", { class: "tfw-colhead", role: "columnheader",
                               "aria-label": `head ${h}` }, `h${h}`));
  }
  const rows = [header];
  const cells = [];  // layer * H + head -> its cell
  for (let l = 0; l < L; l++) {
    const row = el("div", { class: "tfw-hrow", role: "row" },
                   el("span", { class: "tfw-rowhead", role: "rowheader",
                                "aria-label": `layer ${l}` }, `L${l}`));
    for (let h = 0; h < H; h++) {
      const cell = el("div", { class: "tfw-cell", role: "gridcell", id: `${gridId}-${l}-${h}`,
                               "data-layer": l, "data-head": h, "aria-selected": "false" });
      cells.push(cell);
      row.append(cell);
    }
    rows.push(row);
  }
  grid.append(...rows);
  const gridBox = el("div", { class: "tfw-gridbox" }, grid);
  const hoverLine = el("div", { class: "tfw-note tfw-hoverline" });

  // --- the pattern of the selected head -------------------------------------------------------
  const said = el("div", { class: "tfw-said", "aria-live": "polite" });
  const corner = el("span", { class: "tfw-corner" }, el("span", {}, "query ↓"), el("span", {}, "key →"));
  const keys = el("div", { class: "tfw-keys", "aria-hidden": "true" });
  const queries = el("div", { class: "tfw-queries", "aria-hidden": "true" });
  // the default 300 x 150 until the first pattern is painted (the book's page test waits
  // for every canvas to leave that size)
  const canvas = el("canvas", { role: "img" });
  const rowMark = el("div", { class: "tfw-mark" });
  const colMark = el("div", { class: "tfw-mark" });
  const mapBox = el("div", { class: "tfw-mapbox" }, canvas, rowMark, colMark);
  const heat = el("div", { class: "tfw-heat" }, corner, keys, queries, mapBox);
  const readout = el("div", { class: "tfw-readout" });
  const cutBox = el("div", { class: "tfw-note tfw-cut" });
  const patternNote = el("div", { class: "tfw-note" },
                         "white: weight 0, dark blue: 1; grey: a key after the query (masked)");
  const panel = el("div", { class: "tfw-panel" }, said, cutBox,
                   el("div", { class: "tfw-patternbox" }, heat), patternNote, readout);
  node.append(el("div", { class: "tfw-body" }, el("div", {}, gridBox, hoverLine), panel));

  // --- the data: Python's texts, then the page's own run -----------------------------------
  let decoded = { from: null, metas: [] };

  /** Python's examples with their text read back from the page (fromPage), once. */
  function metas() {
    const raw = model.get("examples");
    if (decoded.from !== raw) {
      decoded = { from: raw, metas: raw.map((m) => ({ name: fromPage(m.name), note: fromPage(m.note),
                                                     tokens: m.tokens.map(fromPage), T: m.T })) };
    }
    return decoded.metas;
  }

  const maps = mapStore(model, metas, draw, (message) => { said.textContent = message; });

  function current() {
    const list = maps.list();
    if (!list || !list.length) return null;
    const e = Math.min(Math.max(model.get("example"), 0), list.length - 1);
    const { meta, bytes, offset, key } = list[e];
    const layer = Math.min(Math.max(model.get("layer"), 0), L - 1);
    const head = Math.min(Math.max(model.get("head"), 0), H - 1);
    return { list, e, meta, bytes, offset, key, T: meta.T, layer, head,
             start: offset + (layer * H + head) * meta.T * meta.T };
  }

  function pick(changes) {
    for (const [key, value] of Object.entries(changes)) model.set(key, value);
    model.save_changes();
  }

  // --- drawing: each part remembers what it shows ---------------------------------------------
  const shown = { title: null, scores: null, score: null, selected: null,
                  labels: null, pattern: null, cell: 0, T: 0, masked: false };
  let hoverCell = null;
  let toReveal = null;  // a selected cell not yet scrolled into the grid's box
  let revealed = false;  // the first selection has been brought in sight

  function scoreOf(l, h) {
    const s = model.get("score");
    return model.get("scores")[s][l][h];
  }

  function scoreName() {
    return fromPage(model.get("score_names")[model.get("score")] || "");
  }

  /** The score's colour range: 0 is white; positive red, negative blue (common.js's
   *  divergingColor), the strongest at the largest |value|. */
  function scoreRange() {
    let lo = Infinity, hi = -Infinity;
    for (const row of model.get("scores")[model.get("score")]) {
      for (const v of row) { if (v < lo) lo = v; if (v > hi) hi = v; }
    }
    return { lo, hi, vmax: Math.max(Math.abs(lo), Math.abs(hi)) || 1 };
  }

  function drawScores() {
    const key = `${model.get("score")}`;
    if (shown.scores === model.get("scores") && shown.score === key) return;
    shown.scores = model.get("scores");
    shown.score = key;
    setOptions(scorePicker, model.get("score_names").map(fromPage), model.get("score"));
    const name = scoreName();
    const { lo, hi, vmax } = scoreRange();
    for (let l = 0; l < L; l++) {
      for (let h = 0; h < H; h++) {
        const v = scoreOf(l, h), cell = cells[l * H + h];
        cell.style.background = divergingColor(v, vmax);
        cell.setAttribute("aria-label", `layer ${l}, head ${h}: ${name} ${scoreText(v)}`);
      }
    }
    grid.setAttribute("aria-label", `${L} layers x ${H} heads coloured by ${name}: the arrow ` +
                      "keys move the selected head, Enter shows its pattern");
    const ends = lo >= 0 ? [0, vmax] : hi <= 0 ? [-vmax, 0] : [-vmax, vmax];
    const ramp = el("span", { class: "tfw-ramp" });
    const stops = lo >= 0 || hi <= 0 ? ends : [ends[0], 0, ends[1]];
    ramp.style.background = `linear-gradient(to right, ${stops.map((v) => divergingColor(v, vmax)).join(", ")})`;
    legend.replaceChildren(el("span", {}, scoreText(ends[0])), ramp, el("span", {}, scoreText(ends[1])),
                           el("span", {}, `(${name}: from ${scoreText(lo)} to ${scoreText(hi)})`));
    node.dataset.score = String(model.get("score"));
  }

  function drawSelection() {
    const layer = Math.min(Math.max(model.get("layer"), 0), L - 1);
    const head = Math.min(Math.max(model.get("head"), 0), H - 1);
    const cell = cells[layer * H + head];
    if (shown.selected !== cell) {
      if (shown.selected) {
        shown.selected.classList.remove("tfw-on");
        shown.selected.setAttribute("aria-selected", "false");
      }
      cell.classList.add("tfw-on");
      cell.setAttribute("aria-selected", "true");
      grid.setAttribute("aria-activedescendant", cell.id);
      shown.selected = cell;
      toReveal = cell;  // a new selection (first draw, keys, a click, Python): bring it in sight
    }
    reveal();
    node.dataset.layer = String(layer);
    node.dataset.head = String(head);
  }

  /** The cell size that fits the pattern in the panel (labels beside it). */
  function cellFor(T, labelWidth) {
    const room = (panel.clientWidth || 320) - labelWidth - 4;
    return Math.max(PATTERN_CELL_MIN, Math.min(PATTERN_CELL_MAX, Math.floor(room / T)));
  }

  /** The token labels of both axes; every k-th when the cells are narrower than a line. */
  function drawLabels(c, cell, labelWidth) {
    const T = c.T;
    const step = Math.ceil(LABEL_PX / cell);
    const texts = c.meta.tokens.map(shownToken);
    // the key labels stand above the map, as tall as the query labels are wide, and tall
    // enough for the corner's two lines
    heat.style.gridTemplateColumns = `${labelWidth}px ${T * cell + 2}px`;
    heat.style.gridTemplateRows = `${Math.max(labelWidth, 36)}px ${T * cell + 2}px`;
    const keySpans = [], querySpans = [];
    for (let t = 0; t < T; t += step) {
      const middle = 1 + t * cell + cell / 2 - LABEL_PX / 2;
      keySpans.push(el("span", { "data-index": t, title: texts[t], style: `left: ${middle}px` },
                       texts[t]));
      querySpans.push(el("span", { "data-index": t, title: texts[t], style: `top: ${middle}px` },
                         texts[t]));
    }
    keys.replaceChildren(...keySpans);
    queries.replaceChildren(...querySpans);
    node.dataset.labelStep = String(step);
  }

  function drawPattern(c) {
    const longest = Math.max(1, ...c.meta.tokens.map((t) => shownToken(t).length));
    const labelWidth = Math.max(58, Math.min(84, 8 * longest + 8));  // room for "query ↓"
    const cell = cellFor(c.T, labelWidth);
    const what = `${c.key}:${c.layer}:${c.head}:${cell}`;
    if (shown.pattern === what) return false;
    if (shown.labels !== `${c.key}:${cell}`) {
      shown.labels = `${c.key}:${cell}`;
      drawLabels(c, cell, labelWidth);
    }
    shown.pattern = what;
    shown.cell = cell;
    shown.T = c.T;
    paintBytes(canvas, c.bytes, c.start, c.T, c.T);  // one pixel a weight
    // the keys after each query: grey where the map is causal (all of them 0)
    let causal = true;
    for (let q = 0; q < c.T && causal; q++) {
      for (let k = q + 1; k < c.T; k++) {
        if (c.bytes[c.start + q * c.T + k] !== 0) { causal = false; break; }
      }
    }
    if (causal) {
      const context = canvas.getContext("2d");
      context.fillStyle = "#e4e4e4";
      for (let q = 0; q + 1 < c.T; q++) context.fillRect(q + 1, q, c.T - q - 1, 1);
    }
    shown.masked = causal;
    canvas.style.width = canvas.style.height = `${c.T * cell + 2}px`;  // + the border
    canvas.setAttribute("aria-label", `attention pattern of layer ${c.layer}, head ${c.head}: ` +
                        `${c.T} queries (rows) x ${c.T} keys (columns)`);
    cutBox.textContent = c.meta.note || "";
    readout.textContent = "point at a cell of the pattern to read its weight";
    node.headsShown = { example: c.e, layer: c.layer, head: c.head, T: c.T, cell,
                        tokens: c.meta.tokens };
    markCell(null);
    return true;
  }

  function draw() {
    errorBox.textContent = pageError || fromPage(model.get("error"));
    const text = fromPage(model.get("title"));
    if (shown.title !== text) {
      shown.title = text;
      title.textContent = text;
      title.style.display = text ? "" : "none";
    }
    drawScores();
    const c = current();
    drawSelection();
    if (!c) {
      if (!said.textContent) said.textContent = "unpacking the patterns…";
      return;
    }
    setOptions(textPicker, c.list.map((x) => x.meta.name), c.e);
    said.textContent = `layer ${c.layer}, head ${c.head}: ${scoreName()} ` +
      `${scoreText(scoreOf(c.layer, c.head))}; its pattern on “${c.meta.name}”, ${c.T} tokens`;
    if (drawPattern(c) && times.firstDraw === null) {
      times.drawnAt = performance.now();
      times.firstDraw = times.drawnAt - started;
    }
  }

  // --- the pointer over the pattern: the weight of one query and key --------------------------
  function markCell(at) {
    for (const span of [...keys.children, ...queries.children]) span.classList.remove("tfw-hot");
    if (!at) {
      rowMark.style.display = colMark.style.display = "none";
      return;
    }
    const { q, k } = at, cell = shown.cell, T = shown.T;
    Object.assign(rowMark.style, { display: "block", left: "1px", top: `${1 + q * cell}px`,
                                   width: `${T * cell}px`, height: `${cell}px` });
    Object.assign(colMark.style, { display: "block", left: `${1 + k * cell}px`, top: "1px",
                                   width: `${cell}px`, height: `${T * cell}px` });
    for (const [box, index] of [[queries, q], [keys, k]]) {
      const span = box.querySelector(`[data-index="${index}"]`);
      if (span) span.classList.add("tfw-hot");
    }
  }

  function readCell(event) {
    const c = current();
    if (!c || !shown.cell) return;
    const rect = canvas.getBoundingClientRect();
    const x = event.clientX - rect.left - canvas.clientLeft;
    const y = event.clientY - rect.top - canvas.clientTop;
    const q = Math.floor((y / canvas.clientHeight) * c.T);
    const k = Math.floor((x / canvas.clientWidth) * c.T);
    if (q < 0 || q >= c.T || k < 0 || k >= c.T) return;
    const byte = c.bytes[c.start + q * c.T + k];
    const tq = shownToken(c.meta.tokens[q]), tk = shownToken(c.meta.tokens[k]);
    readout.textContent = k > q && shown.masked
      ? `key “${tk}” (${k}) comes after query “${tq}” (${q}): masked, weight 0`
      : `query “${tq}” (${q}) reads key “${tk}” (${k}) with weight ${(byte / 255).toFixed(3)}`;
    node.headsCell = { q, k, byte, text: readout.textContent };
    markCell({ q, k });
  }
  canvas.addEventListener("pointermove", readCell);
  canvas.addEventListener("pointerdown", readCell);
  canvas.addEventListener("pointerleave", () => markCell(null));

  // --- choosing a head: a click, or the keyboard on the grid ----------------------------------
  function select(layer, head) {
    const clicked = performance.now();
    pick({ layer, head });
    draw();
    times.clicks.push(performance.now() - clicked);
    requestAnimationFrame(() => times.clickFrames.push(performance.now() - clicked));
  }

  /** The newly selected cell in sight inside the grid's own box: its scrollTop and
   *  scrollLeft only, never the page's scroll (no scrollIntoView). Before the box is laid
   *  out (not yet in the document, hidden) the cell waits for the box's first size. */
  function reveal() {
    const cell = toReveal;
    if (!cell) return;
    const box = gridBox.getBoundingClientRect(), r = cell.getBoundingClientRect();
    if (!box.height || !r.height) return;  // no layout yet: the ResizeObserver calls again
    toReveal = null;
    const inner = { top: box.top + gridBox.clientTop, left: box.left + gridBox.clientLeft };
    const top = inner.top + header.firstChild.offsetHeight + 1;  // below the sticky head names
    const bottom = inner.top + gridBox.clientHeight;
    if (!revealed) {  // the first time, the head opened on sits mid-box, its neighbours around
      revealed = true;
      gridBox.scrollTop += (r.top + r.bottom) / 2 - (top + bottom) / 2;
    } else if (r.top < top) gridBox.scrollTop -= top - r.top;
    else if (r.bottom > bottom) gridBox.scrollTop += r.bottom - bottom;
    const left = inner.left + rows[1].firstChild.offsetWidth + 1;  // right of the layer names
    const right = inner.left + gridBox.clientWidth;
    if (r.left < left) gridBox.scrollLeft -= left - r.left;
    else if (r.right > right) gridBox.scrollLeft += r.right - right;
  }
  if (typeof ResizeObserver !== "undefined") new ResizeObserver(reveal).observe(gridBox);

  const cellOf = (target) => target.closest && target.closest(".tfw-cell");
  grid.addEventListener("click", (event) => {
    const cell = cellOf(event.target);
    if (cell) select(Number(cell.dataset.layer), Number(cell.dataset.head));
  });
  grid.addEventListener("keydown", (event) => {
    let layer = model.get("layer"), head = model.get("head");
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1],
                    PageUp: [-PAGE_STEP, 0], PageDown: [PAGE_STEP, 0] };
    if (event.key in moves) {
      layer = Math.min(L - 1, Math.max(0, layer + moves[event.key][0]));
      head = Math.min(H - 1, Math.max(0, head + moves[event.key][1]));
    } else if (event.key === "Home") {
      head = 0;
    } else if (event.key === "End") {
      head = H - 1;
    } else if (event.key !== "Enter" && event.key !== " ") {
      return;
    }
    event.preventDefault();  // the page does not scroll under the reader's keys
    select(layer, head);  // drawSelection brings the cell in sight
  });
  grid.addEventListener("mouseover", (event) => {
    const cell = cellOf(event.target);
    if (!cell || cell === hoverCell) return;
    if (hoverCell) hoverCell.classList.remove("tfw-hover");
    hoverCell = cell;
    cell.classList.add("tfw-hover");
    const l = Number(cell.dataset.layer), h = Number(cell.dataset.head);
    hoverLine.textContent = `layer ${l}, head ${h}: ${scoreName()} ${scoreText(scoreOf(l, h))}`;
  });
  grid.addEventListener("mouseleave", () => {
    if (hoverCell) hoverCell.classList.remove("tfw-hover");
    hoverCell = null;
    hoverLine.textContent = "point at a head to read its score; click it to see its pattern";
  });
  hoverLine.textContent = "point at a head to read its score; click it to see its pattern";

  scorePicker.addEventListener("change", () => { pick({ score: Number(scorePicker.value) }); draw(); });
  textPicker.addEventListener("change", () => { pick({ example: Number(textPicker.value) }); draw(); });

  // --- the reader's text: Python (a kernel) or the page model ---------------------------------
  let live = false;
  let pageError = "";
  const hasPageModel = () => model.get("page_model") !== "";
  const inPython = () => live && model.get("can_run");
  const inPage = () => !inPython() && hasPageModel();
  const check = (run) => {
    if (run.L !== L || run.H !== H) {
      throw new Error(`the page model has ${run.L} x ${run.H} heads, the grid ${L} x ${H}`);
    }
  };
  const runInPage = pageRunner(model, { input: textInput, status, check,
                                        limit: () => model.get("max_tokens") }, (run, error) => {
    pageError = error;
    if (run) {  // the page's text comes after Python's
      maps.showRun(run, { name: TYPED_NAME, tokens: run.tokens, T: run.T, note: run.note });
      node.pageRun = run;  // for inspection
      pick({ example: metas().length });
    }
    draw();
  });

  function runText() {
    if (inPython()) {
      if (textInput.value.trim() === "") {
        status.textContent = EMPTY_TEXT;
        return;
      }
      status.textContent = "";
      request(model, { text: textInput.value });
    } else if (inPage()) {
      runInPage();
    }
  }
  runButton.addEventListener("click", runText);
  textInput.addEventListener("input", () => { if (inPage()) runText(); });
  textInput.addEventListener("keydown", (event) => { if (event.key === "Enter") runText(); });

  function drawMode() {
    const python = inPython(), page = inPage();
    textInput.disabled = runButton.disabled = !(python || page);
    runButton.style.display = page ? "none" : "";
    liveRow.style.display = model.get("can_run") || hasPageModel() ? "" : "none";
    note.textContent = python ? "Python runs the model on your text"
      : page ? "the model runs in this page as you type: no kernel, no network"
        : "this model is too big to run in the page: your own text needs a kernel (run the " +
          "chapter in Jupyter); the texts in the menu were computed when the page was made";
    node.dataset.mode = python ? "python" : page ? "page" : "static";
  }
  watchLive(model, (isLive) => {
    live = isLive;
    if (inPython() && maps.typed) {  // Python runs the reader's text from now on
      maps.typed = null;
      pick({ example: Math.min(model.get("example"), metas().length - 1) });
    }
    drawMode();
    draw();
  });

  for (const name of ["data", "examples", "offsets", "example", "layer", "head", "score",
                      "scores", "score_names", "title", "error"]) {
    model.on(`change:${name}`, draw);
  }
  model.on("change:page_model", drawMode);
  model.on("change:can_run", drawMode);
  // a new column width: the pattern's cells follow it (in the next frame, not inside the
  // observer's callback)
  if (typeof ResizeObserver !== "undefined") {
    let width = 0;
    new ResizeObserver(() => {
      if (panel.clientWidth === width) return;
      width = panel.clientWidth;
      requestAnimationFrame(draw);
    }).observe(panel);
  }
  draw();
}

export default { render };
