// Attention maps: a layers x heads grid of small maps, one head in large, and a heat strip
// of what the selected query token attends to. Hover the large map (or click a token) to
// pick the query; click a small map (or use the sliders) to pick the layer and head.
//
// After common.js and maps.js. It paints only what changed (72 heads of 512 tokens stay
// quick):
//   - a small map once per example: a pixel holds the largest byte of the cells it covers;
//   - the large map once per layer/head, one pixel per cell (CSS scales it up);
//   - the selected query as a rectangle on a canvas laid over the large map (a hover);
//   - the token strips once per example; a new query or head recolours the key tokens.
//
// With a page model (gpt.js) the page runs the text box (pageRunner). Token text is always
// set with textContent, never as HTML.

const CELL_GRID = 52;  // size of a small map, px (a narrow column shrinks it, to 20 px)
const CELL_MIN = 20;

/** A (T, S) map shrunk to h x w (h <= T, w <= S): each pixel the largest byte of its block,
 *  rows [floor(y T / h), floor((y + 1) T / h)) and the same for columns. */
function shrinkMap(bytes, start, T, S, h, w) {
  const out = new Uint8Array(h * w);
  const colBin = new Int32Array(S);  // key column -> pixel column
  for (let s = 0; s < S; s++) colBin[s] = Math.floor((s * w) / S);
  for (let t = 0; t < T; t++) {
    const row = Math.floor((t * h) / T) * w;
    const at = start + t * S;
    for (let s = 0; s < S; s++) {
      const v = bytes[at + s];
      if (v > out[row + colBin[s]]) out[row + colBin[s]] = v;
    }
  }
  return out;
}

function render({ model, el: element }) {
  const node = root(element, "tfw-attention");
  const picker = el("select", { "aria-label": "example" });
  const layerSlider = slider({ label: "layer", min: 0, max: 0, value: 0, onInput: (v) => pick({ layer: v }) });
  const headSlider = slider({ label: "head", min: 0, max: 0, value: 0, onInput: (v) => pick({ head: v }) });
  const big = el("canvas", { class: "tfw-fit", "aria-label": "attention map of the selected head" });
  const overlay = el("canvas", { class: "tfw-overlay tfw-fit", "aria-hidden": "true" });
  const mapBox = el("div", { class: "tfw-mapbox" }, big, overlay);
  const grid = el("div", { class: "tfw-grid" });
  // the layers x heads grid shrinks its maps to the column; past CELL_MIN it scrolls
  // sideways in its own box, never the page
  const gridBox = el("div", { class: "tfw-gridbox" }, grid);
  const controls = el("div", { class: "tfw-row" });
  const caption = el("div", { class: "tfw-note" }, "unpacking the maps…");
  const exampleNote = el("div", { class: "tfw-note tfw-cut" });
  const queries = el("div", { class: "tfw-strip" });
  const strip = el("div", { class: "tfw-strip" });
  const textInput = el("input", { type: "text", size: 50, "aria-label": "your input",
                                   placeholder: model.get("placeholder") });
  const run = el("button", {}, "run the model");
  const note = el("span", { class: "tfw-note" });
  const status = el("span", { class: "tfw-note tfw-status" });
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" });
  const liveRow = el("div", { class: "tfw-row" }, textInput, run, note, status, errorBox,
                        pythonStatus(model));
  node.append(
    el("style", {}, `.tfw-gridbox { overflow-x: auto; }
      .tfw-grid { display: grid; gap: 3px; align-items: center; }
      .tfw-grid canvas { cursor: pointer; border: 2px solid transparent; width: 100%;
        box-sizing: border-box; aspect-ratio: 1; height: auto; }
      .tfw-grid canvas.selected { border-color: #d62728; }
      .tfw-grid span { white-space: nowrap; }
      .tfw-mapbox { position: relative; display: inline-block; line-height: 0; max-width: 100%; }
      .tfw-mapbox .tfw-overlay { position: absolute; left: 0; top: 0; pointer-events: none;
        border-color: transparent; }
      .tfw-cut { color: #b35900; }
      .tfw-strip { line-height: 1.9; max-width: 900px; }
      .tfw-strip .tfw-token { display: inline-block; border: 1px solid #ddd; margin: 1px;
        cursor: pointer; }
      .tfw-strip .tfw-token.selected { outline: 2px solid #d62728; }`),
    controls,
    el("div", { class: "tfw-row" }, el("div", {}, mapBox, caption, exampleNote), gridBox),
    el("div", { class: "tfw-note" }, "query tokens (click one):"), queries,
    el("div", { class: "tfw-note" }, "attention of the selected query over the keys:"), strip,
    liveRow,
  );

  // --- the data: Python's examples, then the page's own run --------------------------------
  const maps = mapStore(model, () => model.get("examples"), draw,
                        (message) => { caption.textContent = message; });

  function current() {
    const list = maps.list();
    if (!list || !list.length) return null;
    const e = Math.min(Math.max(model.get("example"), 0), list.length - 1);
    const { meta: ex, bytes, offset, key } = list[e];
    const [L, H, T, S] = ex.shape;
    const layer = Math.min(model.get("layer"), L - 1);
    const head = Math.min(model.get("head"), H - 1);
    const query = Math.min(model.get("query"), T - 1);
    return { list, e, ex, bytes, key, L, H, T, S, layer, head, query, offset };
  }

  function pick(changes) {
    for (const [key, value] of Object.entries(changes)) model.set(key, value);
    model.save_changes();
  }

  const mapStart = (c, l, h) => c.offset + ((l * c.H + h) * c.T) * c.S;

  // --- drawing: each part remembers what it shows and repaints only when that changes -----
  const shown = { grid: null, cells: [], selected: null, big: null, cell: 0,
                  overlayQuery: null, strips: null, querySpans: [], keySpans: [],
                  stripQuery: null, keys: null };

  function drawGrid(c) {
    if (shown.grid !== c.key) {
      shown.grid = c.key;
      shown.selected = null;
      shown.cells = [];
      const h = Math.min(c.T, CELL_GRID), w = Math.min(c.S, CELL_GRID);
      const parts = [el("span", {})];
      for (let hd = 0; hd < c.H; hd++) parts.push(el("span", { class: "tfw-note" }, `h${hd}`));
      for (let l = 0; l < c.L; l++) {
        parts.push(el("span", { class: "tfw-note" }, `L${l}`));
        for (let hd = 0; hd < c.H; hd++) {
          const small = el("canvas", { title: `layer ${l}, head ${hd}` });
          paintBytes(small, shrinkMap(c.bytes, mapStart(c, l, hd), c.T, c.S, h, w), 0, h, w);
          small.addEventListener("click", () => pick({ layer: l, head: hd }));
          shown.cells.push(small);
          parts.push(small);
        }
      }
      grid.style.gridTemplateColumns =
        `auto repeat(${c.H}, minmax(${CELL_MIN}px, ${CELL_GRID + 4}px))`;
      grid.replaceChildren(...parts);
    }
    const selected = shown.cells[c.layer * c.H + c.head];
    if (shown.selected !== selected) {
      if (shown.selected) shown.selected.classList.remove("selected");
      selected.classList.add("selected");
      shown.selected = selected;
    }
  }

  function drawBig(c) {
    const what = `${c.key}:${c.layer}:${c.head}`;
    if (shown.big !== what) {
      shown.big = what;
      const cell = Math.max(2, Math.min(24, Math.floor(420 / Math.max(c.T, c.S))));
      paintBytes(big, c.bytes, mapStart(c, c.layer, c.head), c.T, c.S);
      for (const canvas of [big, overlay]) {  // (+ 2: the border; the height follows)
        canvas.style.width = `${c.S * cell + 2}px`;
      }
      overlay.width = c.S * cell;
      overlay.height = c.T * cell;
      shown.cell = cell;
      shown.overlayQuery = null;  // resizing the overlay cleared it
      caption.textContent = `${c.ex.cross ? "cross" : "self"}-attention, layer ${c.layer}, ` +
        `head ${c.head}: ${c.T} queries (rows) x ${c.S} keys (columns)`;
      exampleNote.textContent = c.ex.note || "";
    }
    if (shown.overlayQuery !== c.query) {  // the rectangle of the selected query, alone
      shown.overlayQuery = c.query;
      const ctx = overlay.getContext("2d");
      ctx.clearRect(0, 0, overlay.width, overlay.height);
      ctx.strokeStyle = "#d62728";
      ctx.lineWidth = 2;
      ctx.strokeRect(1, c.query * shown.cell + 1, c.S * shown.cell - 2, shown.cell - 2);
    }
  }

  function drawStrips(c) {
    if (shown.strips !== c.key) {
      shown.strips = c.key;
      shown.keys = null;
      shown.querySpans = c.ex.tokens.map((t, i) => el("span", { class: "tfw-token",
        title: `query ${i}`, "data-index": i }, visibleText(t)));
      queries.replaceChildren(...shown.querySpans);
      shown.keySpans = c.ex.keys.map((t) => el("span", { class: "tfw-token" }, visibleText(t)));
      strip.replaceChildren(...shown.keySpans);
      shown.stripQuery = null;
    }
    if (shown.stripQuery !== c.query) {
      if (shown.stripQuery !== null) shown.querySpans[shown.stripQuery].classList.remove("selected");
      shown.querySpans[c.query].classList.add("selected");
      shown.stripQuery = c.query;
    }
    const what = `${c.layer}:${c.head}:${c.query}`;
    if (shown.keys !== what) {  // recolour the keys: the selected query's row of the map
      shown.keys = what;
      const start = mapStart(c, c.layer, c.head) + c.query * c.S;
      shown.keySpans.forEach((span, j) => {
        const v = c.bytes[start + j];
        span.title = `key ${j}: ${(v / 255).toFixed(3)}`;
        span.style.background = `rgb(${PALETTE[3 * v]},${PALETTE[3 * v + 1]},${PALETTE[3 * v + 2]})`;
        span.style.color = v > 153 ? "#fff" : "#222";  // weight > 0.6
      });
    }
  }

  function draw() {
    errorBox.textContent = pageError || fromPage(model.get("error"));
    const c = current();
    if (!c) return;
    setOptions(picker, c.list.map((x) => x.meta.name), c.e);
    picker.style.display = c.list.length > 1 ? "" : "none";
    // a slider only where there is a choice (one layer: no layer slider)
    setChildren(controls, [picker, ...(c.L > 1 ? [layerSlider.node] : []),
                           ...(c.H > 1 ? [headSlider.node] : [])]);
    layerSlider.input.max = String(c.L - 1);
    headSlider.input.max = String(c.H - 1);
    layerSlider.set(c.layer);
    headSlider.set(c.head);
    drawGrid(c);
    drawBig(c);
    drawStrips(c);
  }

  // --- the reader's text: Python (a kernel) or the page model -----------------------------
  let live = false;
  let pageError = "";
  const hasPageModel = () => model.get("page_model") !== "";
  const inPython = () => live && model.get("can_run");
  const inPage = () => !inPython() && hasPageModel();
  const runInPage = pageRunner(model, { input: textInput, status }, (run, error) => {
    pageError = error;
    if (run) {  // the page's example comes last, after Python's
      const { tokens, L, H, T } = run;
      maps.showRun(run, { name: TYPED_NAME, tokens, keys: tokens, cross: false,
                          shape: [L, H, T, T], note: run.note });
      node.pageRun = run;  // for inspection
      pick({ example: model.get("examples").length, query: Math.min(model.get("query"), T - 1) });
    }
    draw();
  });

  function runText() {
    if (inPython()) {
      request(model, { text: textInput.value });
    } else if (inPage()) {
      runInPage();
    }
  }

  run.addEventListener("click", runText);
  textInput.addEventListener("input", () => { if (inPage()) runText(); });
  textInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter") runText();
  });

  function drawMode() {
    const python = inPython(), page = inPage();
    textInput.disabled = run.disabled = !(python || page);
    liveRow.style.display = model.get("can_run") || hasPageModel() ? "" : "none";
    run.textContent = page ? "run the model in the page" : "run the model";
    note.textContent = python ? "" : page
      ? "the model runs in this page as you type: no kernel, no network"
      : "static page: run the chapter in Jupyter to try your own text";
  }
  watchLive(model, (isLive) => {
    live = isLive;
    drawMode();
  });

  picker.addEventListener("change", () => pick({ example: Number(picker.value), query: 0 }));
  queries.addEventListener("click", (event) => {
    const index = event.target.dataset && event.target.dataset.index;
    if (index !== undefined) pick({ query: Number(index) });
  });
  mapBox.addEventListener("mousemove", (event) => {
    const c = current();
    if (!c) return;
    const rect = big.getBoundingClientRect();
    const q = Math.floor(((event.clientY - rect.top) / rect.height) * c.T);
    if (q >= 0 && q < c.T && q !== c.query) pick({ query: q });
  });
  for (const name of ["data", "examples", "offsets", "example", "layer", "head", "query",
                      "error"]) {
    model.on(`change:${name}`, draw);
  }
  model.on("change:page_model", drawMode);
  model.on("change:can_run", drawMode);
  draw();
}

export default { render };
