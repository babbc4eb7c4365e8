// Sinusoidal positional-encoding explorer: heatmap of PE (rows: positions, columns:
// dimensions), a position slider (keyboard or mouse), hover a row to select it, and
// the dot product PE[p] . PE[j] plotted against j.

function render({ model, el: element }) {
  const node = root(element, "tfw-positions");
  const title = el("div", {}, "");
  const canvas = el("canvas", { class: "tfw-fit", "aria-label": "positional encoding heatmap" });
  const plotBox = el("div", {});
  const vectorBox = el("div", {});
  const pick = slider({ label: "position p", min: 0, max: 1, value: 0, onInput: (v) => select(v) });
  const widthInput = el("input", { type: "number", min: 2, max: 512, step: 2, "aria-label": "d_model" });
  const baseInput = el("input", { type: "number", min: 2, step: 1, "aria-label": "base" });
  const apply = el("button", {}, "recompute in Python");
  const note = el("span", { class: "tfw-note" }, "");
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" }, "");
  node.append(
    title,
    el("div", { class: "tfw-row" }, pick.node),
    el("div", { class: "tfw-row" }, canvas, el("div", {}, plotBox, vectorBox)),
    el("div", { class: "tfw-row" }, "C = ", widthInput, " base = ", baseInput, apply, note, errorBox,
       pythonStatus(model)),
  );
  apply.addEventListener("click", () =>
    request(model, { d_model: Number(widthInput.value), base: Number(baseInput.value) }));
  watchLive(model, (live) => {
    for (const input of [widthInput, baseInput, apply]) input.disabled = !live;
    note.textContent = live ? "" : "static page: run the chapter in Jupyter to recompute";
  });

  function select(p) {
    model.set("position", p);
    model.save_changes();
  }

  function draw() {
    const table = model.get("table");
    const labels = model.get("labels");
    const T = table.length, C = table[0].length;
    const p = Math.min(model.get("position"), T - 1);
    widthInput.value = model.get("d_model");
    baseInput.value = model.get("base");
    showError(errorBox, model);
    pick.input.max = String(T - 1);
    pick.set(p);
    title.textContent = `PE table: ${T} positions x ${C} dimensions; selected p = ${p} (${visibleText(labels[p])})`;

    // heatmap, one cell per value, scaled up; the selected row is outlined
    const cell = Math.max(2, Math.floor(Math.min(320 / C, 320 / T)));
    canvas.width = C * cell;
    canvas.height = T * cell;
    const ctx = canvas.getContext("2d");
    for (let t = 0; t < T; t++) {
      for (let c = 0; c < C; c++) {
        ctx.fillStyle = divergingColor(table[t][c], 1);
        ctx.fillRect(c * cell, t * cell, cell, cell);
      }
    }
    ctx.strokeStyle = "#000";
    ctx.lineWidth = 2;
    ctx.strokeRect(1, p * cell + 1, C * cell - 2, cell - 2);

    // dot product of the selected position with every position
    const dots = table.map((row) => row.reduce((s, v, c) => s + v * table[p][c], 0));
    plotBox.replaceChildren(linePlot([...Array(T).keys()], dots, {
      marker: p, xLabel: "position j", yLabel: "PE[p]·PE[j]" }));

    // the vector at p, as a strip of colours
    const strip = svg("svg", { width: 360, height: 24, viewBox: "0 0 360 24", class: "tfw-fit" });
    const w = 360 / C;
    table[p].forEach((v, c) => strip.append(svg("rect", {
      x: c * w, y: 0, width: w, height: 24, fill: divergingColor(v, 1) })));
    vectorBox.replaceChildren(el("div", { class: "tfw-note" }, "PE[p] (dimension 0 on the left)"), strip);
  }

  canvas.addEventListener("mousemove", (event) => {
    const T = model.get("table").length;
    const rect = canvas.getBoundingClientRect();
    const t = Math.floor(((event.clientY - rect.top) / rect.height) * T);
    if (t >= 0 && t < T && t !== model.get("position")) select(t);
  });
  model.on("change:position", draw);
  model.on("change:table", draw);
  model.on("change:error", draw);
  draw();
}

export default { render };
