// RoPE rotations. Python sends the frequencies theta_n and the vectors q, k; this script
// rotates them itself: plane n of q turns by i * theta_n, plane n of k by j * theta_n.
// - sliders (keyboard or mouse): the query position i and the key position j;
// - one small circle per plane with the two rotated arrows (fast planes first);
// - the score q_i . k_j against the offset m = j - i (hover or drag it to set m);
// - a heatmap of each plane's term of the score (rows: planes, columns: offsets); hovering
//   it sets the offset (x) and highlights a plane (y), whose own term joins the score plot.

const Q_COLOR = "#1f77b4";
const K_COLOR = "#ff7f0e";

/** Rotate (a, b) counter-clockwise by angle: the 2-D rotation RoPE applies to every plane. */
function rotate(a, b, angle) {
  const c = Math.cos(angle), s = Math.sin(angle);
  return [a * c - b * s, a * s + b * c];
}

/** Plane n's term of q_i . k_j: (R(i t) q_n) . (R(j t) k_n), which depends on j - i only. */
function planeTerm(q, k, theta, n, m) {
  const [ka, kb] = rotate(k[2 * n], k[2 * n + 1], m * theta[n]);
  return q[2 * n] * ka + q[2 * n + 1] * kb;
}

function render({ model, el: element }) {
  const node = root(element, "tfw-rope");
  const title = el("div", {}, "");
  const iSlider = slider({ label: "query position i", min: 0, max: 1, value: 0,
                           onInput: (v) => setPositions(v, model.get("key_position")) });
  const jSlider = slider({ label: "key position j", min: 0, max: 1, value: 0,
                           onInput: (v) => setPositions(model.get("query_position"), v) });
  const both = el("button", {}, "move both +1");
  const planes = el("div", { class: "tfw-row", style: "gap:4px" });
  const scoreBox = el("div", {});
  const canvas = el("canvas", { class: "tfw-fit", "aria-label": "each plane's term of the score" });
  const planeNote = el("div", { class: "tfw-note" }, "");
  const sizeInput = el("input", { type: "number", min: 2, max: 64, step: 2, "aria-label": "head size D" });
  const baseInput = el("input", { type: "number", min: 2, step: 1, "aria-label": "base" });
  const seedInput = el("input", { type: "number", min: 0, step: 1, "aria-label": "seed" });
  const matchInput = el("input", { type: "checkbox", "aria-label": "k = q" });
  const apply = el("button", {}, "recompute in Python");
  const note = el("span", { class: "tfw-note" }, "");
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" }, "");
  node.append(
    title,
    el("div", { class: "tfw-row" }, iSlider.node, jSlider.node, both),
    el("div", { class: "tfw-note" }, "each circle is one plane n of the head: ",
       el("span", { style: `color:${Q_COLOR}` }, "q turned by i·θ_n"), ", ",
       el("span", { style: `color:${K_COLOR}` }, "k turned by j·θ_n"),
       " (each plane on its own scale; under it: the turns (j−i)θ_n between the two)"),
    planes,
    el("div", { class: "tfw-row" }, scoreBox,
       el("div", { style: "max-width:270px" }, el("div", { class: "tfw-note" },
                        "each plane's term of the score (rows: planes n, fastest on top; columns: offset m)"),
          canvas, planeNote)),
    el("div", { class: "tfw-row" }, "D = ", sizeInput, " base = ", baseInput, " seed = ", seedInput,
       el("label", {}, matchInput, " k = q"), apply, note, errorBox, pythonStatus(model)),
  );
  let plane = 0; // the highlighted plane (local to this view)

  apply.addEventListener("click", () => request(model, {
    head_size: Number(sizeInput.value), base: Number(baseInput.value),
    seed: Number(seedInput.value), match: matchInput.checked }));
  both.addEventListener("click", () => {
    const last = model.get("n_positions") - 1;
    const i = model.get("query_position"), j = model.get("key_position");
    if (Math.max(i, j) < last) setPositions(i + 1, j + 1);
  });
  watchLive(model, (live) => {
    for (const input of [sizeInput, baseInput, seedInput, matchInput, apply]) input.disabled = !live;
    note.textContent = live ? "" : "static page: run the chapter in Jupyter to recompute";
  });

  function setPositions(i, j) {
    model.set("query_position", i);
    model.set("key_position", j);
    model.save_changes();
  }

  /** Set the offset m = j - i, moving j (or i when j would leave the range). */
  function setOffset(m) {
    const last = model.get("n_positions") - 1;
    let i = model.get("query_position"), j = i + m;
    if (j > last) { j = last; i = j - m; }
    if (j < 0) { j = 0; i = -m; }
    if (i !== model.get("query_position") || j !== model.get("key_position")) setPositions(i, j);
  }

  function drawPlanes(q, k, theta, i, j) {
    const size = 66, r = 27;
    const cells = theta.map((t, n) => {
      // each plane on its own scale (the longer of its two arrows touches the circle)
      const norm = Math.max(1e-9, Math.hypot(q[2 * n], q[2 * n + 1]), Math.hypot(k[2 * n], k[2 * n + 1]));
      const pic = svg("svg", { width: size, height: size, role: "img" });
      const c = size / 2;
      pic.append(svg("circle", { cx: c, cy: c, r, fill: n === plane ? "#fff6e0" : "#fafafa",
                                 stroke: n === plane ? "#d62728" : "#bbb" }));
      pic.append(svg("line", { x1: c - r, x2: c + r, y1: c, y2: c, stroke: "#ddd" }));
      pic.append(svg("line", { x1: c, x2: c, y1: c - r, y2: c + r, stroke: "#ddd" }));
      for (const [vec, pos, color] of [[q, i, Q_COLOR], [k, j, K_COLOR]]) {
        const [a, b] = rotate(vec[2 * n], vec[2 * n + 1], pos * t);
        const x = c + (a / norm) * r, y = c - (b / norm) * r; // SVG's y axis points down
        pic.append(svg("line", { x1: c, y1: c, x2: x.toFixed(2), y2: y.toFixed(2), stroke: color,
                                 "stroke-width": 2.5, "stroke-linecap": "round" }));
        pic.append(svg("circle", { cx: x.toFixed(2), cy: y.toFixed(2), r: 3, fill: color }));
      }
      const turns = (Math.abs(j - i) * t) / (2 * Math.PI);
      return el("div", { style: "text-align:center;font-size:10px;width:72px" }, pic,
                el("div", {}, `n=${n}, θ=${t.toPrecision(2)}`),
                el("div", { class: "tfw-note", style: "font-size:10px" }, `${turns.toFixed(2)} turns`));
    });
    planes.replaceChildren(...cells);
  }

  function drawScores(offsets, scores, terms, m) {
    const width = 400, height = 190, pad = { l: 44, r: 10, t: 22, b: 30 };
    const lo = Math.min(...scores, ...terms), hi = Math.max(...scores, ...terms);
    const sx = (x) => pad.l + ((x - offsets[0]) / (offsets[offsets.length - 1] - offsets[0])) * (width - pad.l - pad.r);
    const sy = (y) => height - pad.b - ((y - lo) / (hi - lo || 1)) * (height - pad.t - pad.b);
    const plot = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "tfw-plot tfw-fit",
                              role: "img", style: "cursor:crosshair" });
    plot.append(svg("rect", { x: pad.l, y: pad.t, width: width - pad.l - pad.r,
                              height: height - pad.t - pad.b, fill: "#fafafa", stroke: "#ccc" }));
    if (lo < 0 && hi > 0) {
      plot.append(svg("line", { x1: pad.l, x2: width - pad.r, y1: sy(0), y2: sy(0), stroke: "#ddd" }));
    }
    const path = (ys) => ys.map((y, n) => `${n ? "L" : "M"}${sx(offsets[n]).toFixed(1)},${sy(y).toFixed(1)}`).join("");
    plot.append(svg("path", { d: path(terms), fill: "none", stroke: "#d62728", "stroke-width": 1, opacity: 0.6 }));
    plot.append(svg("path", { d: path(scores), fill: "none", stroke: Q_COLOR, "stroke-width": 1.5 }));
    const mi = offsets.indexOf(m);
    plot.append(svg("line", { x1: sx(m), x2: sx(m), y1: pad.t, y2: height - pad.b,
                              stroke: "#444", "stroke-dasharray": "3,2" }));
    plot.append(svg("circle", { cx: sx(m), cy: sy(scores[mi]), r: 4, fill: "#444" }));
    const text = (x, y, s, anchor, color = "#222") =>
      plot.append(svg("text", { x, y, "font-size": 10, "text-anchor": anchor, fill: color, text: s }));
    text(pad.l - 4, pad.t + 8, hi.toFixed(2), "end");
    text(pad.l - 4, height - pad.b, lo.toFixed(2), "end");
    text(pad.l, height - 16, String(offsets[0]), "start");
    text(width - pad.r, height - 16, String(offsets[offsets.length - 1]), "end");
    text((width + pad.l) / 2, height - 3, "offset m = j − i", "middle");
    text(pad.l, 12, "score q_i·k_j", "start", Q_COLOR);
    text(width - pad.r, 12, `plane ${plane}'s term`, "end", "#d62728");
    const pick = (event) => {
      const rect = plot.getBoundingClientRect();  // (a narrow column shrinks the plot)
      const x = ((event.clientX - rect.left) * width) / rect.width;
      const frac = (x - pad.l) / (width - pad.l - pad.r);
      const span = offsets[offsets.length - 1] - offsets[0];
      setOffset(Math.round(offsets[0] + Math.max(0, Math.min(1, frac)) * span));
    };
    plot.addEventListener("mousemove", pick);
    plot.addEventListener("mousedown", pick);
    scoreBox.replaceChildren(plot);
  }

  function drawTerms(offsets, allTerms, m) {
    const P = allTerms.length, M = offsets.length;
    const cellW = Math.max(1, Math.floor(400 / M)), cellH = Math.max(6, Math.floor(128 / P));
    canvas.width = M * cellW;
    canvas.height = P * cellH;
    const ctx = canvas.getContext("2d");
    let vmax = 1e-9;
    for (const row of allTerms) for (const v of row) vmax = Math.max(vmax, Math.abs(v));
    for (let n = 0; n < P; n++) {
      for (let x = 0; x < M; x++) {
        ctx.fillStyle = divergingColor(allTerms[n][x], vmax);
        ctx.fillRect(x * cellW, n * cellH, cellW, cellH);
      }
    }
    ctx.strokeStyle = "#d62728";
    ctx.lineWidth = 2;
    ctx.strokeRect(1, plane * cellH + 1, M * cellW - 2, cellH - 2);
    ctx.fillStyle = "#000";
    ctx.fillRect(offsets.indexOf(m) * cellW, 0, Math.max(1, cellW / 2), P * cellH);
  }

  function draw() {
    const theta = model.get("theta"), q = model.get("q"), k = model.get("k");
    const N = model.get("n_positions"), P = theta.length;
    const i = Math.min(model.get("query_position"), N - 1), j = Math.min(model.get("key_position"), N - 1);
    const m = j - i;
    plane = Math.min(plane, P - 1);
    sizeInput.value = model.get("head_size");
    baseInput.value = model.get("base");
    seedInput.value = model.get("seed");
    matchInput.checked = model.get("match");
    showError(errorBox, model);
    for (const s of [iSlider, jSlider]) s.input.max = String(N - 1);
    iSlider.set(i);
    jSlider.set(j);

    const offsets = [];
    for (let o = -(N - 1); o < N; o++) offsets.push(o);
    const allTerms = theta.map((_, n) => offsets.map((o) => planeTerm(q, k, theta, n, o)));
    const scores = offsets.map((_, x) => allTerms.reduce((s, row) => s + row[x], 0));
    const score = scores[offsets.indexOf(m)];
    title.textContent = `D = ${q.length} (${P} planes), base ${model.get("base")}: ` +
      `i = ${i}, j = ${j}, offset m = ${m}, score q_i·k_j = ${score.toFixed(4)}`;
    title.setAttribute("data-score", score.toFixed(6));
    drawPlanes(q, k, theta, i, j);
    drawScores(offsets, scores, allTerms[plane], m);
    drawTerms(offsets, allTerms, m);
    planeNote.textContent = `plane ${plane}: θ = ${theta[plane].toPrecision(3)}, ` +
      `a full turn every ${(2 * Math.PI / theta[plane]).toFixed(1)} positions; ` +
      `its term at m = ${m}: ${allTerms[plane][offsets.indexOf(m)].toFixed(4)}`;
  }

  canvas.addEventListener("mousemove", (event) => {
    const rect = canvas.getBoundingClientRect();
    const N = model.get("n_positions"), P = model.get("theta").length;
    const fx = (event.clientX - rect.left) / rect.width, fy = (event.clientY - rect.top) / rect.height;
    const n = Math.max(0, Math.min(P - 1, Math.floor(fy * P)));
    const m = Math.max(-(N - 1), Math.min(N - 1, Math.floor(fx * (2 * N - 1)) - (N - 1)));
    if (n !== plane) {
      plane = n;
      draw();
    }
    setOffset(m);
  });
  for (const name of ["query_position", "key_position", "theta", "q", "k", "error", "n_positions"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
}

export default { render };
