// Attention maps: a layers x heads grid of small maps, one head in large, and a heat strip
// of what the selected query token attends to. Hover the large map (or click a token) to
// pick the query; click a small map (or use the sliders) to pick the layer and head.

const CELL_GRID = 52; // size of a small map, px

function decode(data) {
  const raw = atob(data);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

/** Paint one (T, S) map of bytes (0..255) into a canvas of the given pixel size. */
function paintMap(canvas, bytes, start, T, S, width, height) {
  const small = document.createElement("canvas");
  small.width = S;
  small.height = T;
  const ctx = small.getContext("2d");
  const image = ctx.createImageData(S, T);
  for (let i = 0; i < T * S; i++) {
    const v = bytes[start + i] / 255;
    image.data[4 * i] = Math.round(255 - 215 * v);
    image.data[4 * i + 1] = Math.round(255 - 155 * v);
    image.data[4 * i + 2] = Math.round(255 - 55 * v);
    image.data[4 * i + 3] = 255;
  }
  ctx.putImageData(image, 0, 0);
  canvas.width = width;
  canvas.height = height;
  const out = canvas.getContext("2d");
  out.imageSmoothingEnabled = false;
  out.drawImage(small, 0, 0, width, height);
}

function render({ model, el: element }) {
  const node = root(element, "tfw-attention");
  const picker = el("select", { "aria-label": "example" });
  const layerSlider = slider({ label: "layer", min: 0, max: 0, value: 0, onInput: (v) => pick({ layer: v }) });
  const headSlider = slider({ label: "head", min: 0, max: 0, value: 0, onInput: (v) => pick({ head: v }) });
  const big = el("canvas", { "aria-label": "attention map of the selected head" });
  const grid = el("div", { class: "tfw-grid" });
  const controls = el("div", { class: "tfw-row" });
  const caption = el("div", { class: "tfw-note" });
  const queries = el("div", { class: "tfw-strip" });
  const strip = el("div", { class: "tfw-strip" });
  const textInput = el("input", { type: "text", size: 50, "aria-label": "your input",
                                   placeholder: model.get("placeholder") });
  const run = el("button", {}, "run the model");
  const note = el("span", { class: "tfw-note" });
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" });
  const liveRow = el("div", { class: "tfw-row" }, textInput, run, note, errorBox);
  node.append(
    el("style", {}, `.tfw-grid { display: grid; gap: 3px; align-items: center; }
      .tfw-grid canvas { cursor: pointer; border: 2px solid transparent; }
      .tfw-grid canvas.selected { border-color: #d62728; }
      .tfw-strip { line-height: 1.9; max-width: 900px; }
      .tfw-strip .tfw-token { display: inline-block; border: 1px solid #ddd; margin: 1px;
        cursor: pointer; }
      .tfw-strip .tfw-token.selected { outline: 2px solid #d62728; }`),
    controls,
    el("div", { class: "tfw-row" }, el("div", {}, big, caption), grid),
    el("div", { class: "tfw-note" }, "query tokens (click one):"), queries,
    el("div", { class: "tfw-note" }, "attention of the selected query over the keys:"), strip,
    liveRow,
  );
  picker.addEventListener("change", () => pick({ example: Number(picker.value), query: 0 }));
  run.addEventListener("click", () => request(model, { text: textInput.value }));
  watchLive(model, (live) => {
    const usable = live && model.get("can_run");
    textInput.disabled = run.disabled = !usable;
    liveRow.style.display = model.get("can_run") ? "" : "none";
    note.textContent = usable ? "" : "static page: run the chapter in Jupyter to try your own text";
  });

  let bytes = new Uint8Array(0);
  let decodedFrom = null;

  function pick(changes) {
    for (const [key, value] of Object.entries(changes)) model.set(key, value);
    model.save_changes();
  }

  function current() {
    const examples = model.get("examples");
    const offsets = model.get("offsets");
    if (!examples.length || offsets.length !== examples.length) return null;
    if (decodedFrom !== model.get("data")) {
      decodedFrom = model.get("data");
      bytes = decode(decodedFrom);
    }
    const e = Math.min(model.get("example"), examples.length - 1);
    const ex = examples[e];
    const [L, H, T, S] = ex.shape;
    const layer = Math.min(model.get("layer"), L - 1);
    const head = Math.min(model.get("head"), H - 1);
    const query = Math.min(model.get("query"), T - 1);
    return { e, ex, L, H, T, S, layer, head, query, offset: offsets[e] };
  }

  const mapStart = (c, l, h) => c.offset + ((l * c.H + h) * c.T) * c.S;

  function drawGrid(c) {
    grid.replaceChildren();
    grid.style.gridTemplateColumns = `auto repeat(${c.H}, ${CELL_GRID + 4}px)`;
    grid.append(el("span", {}));
    for (let h = 0; h < c.H; h++) grid.append(el("span", { class: "tfw-note" }, `h${h}`));
    for (let l = 0; l < c.L; l++) {
      grid.append(el("span", { class: "tfw-note" }, `L${l}`));
      for (let h = 0; h < c.H; h++) {
        const small = el("canvas", { title: `layer ${l}, head ${h}` });
        paintMap(small, bytes, mapStart(c, l, h), c.T, c.S, CELL_GRID, CELL_GRID);
        if (l === c.layer && h === c.head) small.classList.add("selected");
        small.addEventListener("click", () => pick({ layer: l, head: h }));
        grid.append(small);
      }
    }
  }

  function drawBig(c) {
    const cell = Math.max(2, Math.min(24, Math.floor(420 / Math.max(c.T, c.S))));
    paintMap(big, bytes, mapStart(c, c.layer, c.head), c.T, c.S, c.S * cell, c.T * cell);
    const ctx = big.getContext("2d");
    ctx.strokeStyle = "#d62728";
    ctx.lineWidth = 2;
    ctx.strokeRect(1, c.query * cell + 1, c.S * cell - 2, cell - 2);
    caption.textContent = `${c.ex.cross ? "cross" : "self"}-attention, layer ${c.layer}, head ${c.head}: ` +
      `${c.T} queries (rows) x ${c.S} keys (columns)`;
  }

  function drawStrips(c) {
    queries.replaceChildren(...c.ex.tokens.map((t, i) => {
      const span = el("span", { class: "tfw-token" + (i === c.query ? " selected" : ""),
                                 title: `query ${i}` }, visibleText(t));
      span.addEventListener("click", () => pick({ query: i }));
      return span;
    }));
    const start = mapStart(c, c.layer, c.head) + c.query * c.S;
    strip.replaceChildren(...c.ex.keys.map((t, j) => {
      const w = bytes[start + j] / 255;
      return el("span", { class: "tfw-token", title: `key ${j}: ${w.toFixed(3)}`,
                          style: `background:${sequentialColor(w, 1)};color:${w > 0.6 ? "#fff" : "#222"}` },
                visibleText(t));
    }));
  }

  function draw() {
    const c = current();
    if (!c) return;
    const examples = model.get("examples");
    picker.replaceChildren(...examples.map((x, i) => el("option", { value: i }, x.name)));
    picker.value = String(c.e);
    picker.style.display = examples.length > 1 ? "" : "none";
    // a slider only where there is a choice (one layer: no layer slider)
    setChildren(controls, [picker, ...(c.L > 1 ? [layerSlider.node] : []),
                           ...(c.H > 1 ? [headSlider.node] : [])]);
    layerSlider.input.max = String(c.L - 1);
    headSlider.input.max = String(c.H - 1);
    layerSlider.set(c.layer);
    headSlider.set(c.head);
    errorBox.textContent = model.get("error");
    drawGrid(c);
    drawBig(c);
    drawStrips(c);
  }

  big.addEventListener("mousemove", (event) => {
    const c = current();
    if (!c) return;
    const rect = big.getBoundingClientRect();
    const q = Math.floor(((event.clientY - rect.top) / rect.height) * c.T);
    if (q >= 0 && q < c.T && q !== c.query) pick({ query: q });
  });
  // a new query only redraws the large map and the strips; the grid waits for layer/head
  model.on("change:query", () => {
    const c = current();
    if (c) {
      drawBig(c);
      drawStrips(c);
    }
  });
  for (const name of ["data", "example", "layer", "head", "error"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
}

export default { render };
