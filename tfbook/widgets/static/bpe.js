// BPE-merges stepper. Step k shows merge k of training: the most frequent pairs just before
// it (a bar chart, the merged pair highlighted), the new token, and a sample text cut into
// tokens after merges 1..k. The sample's segmentation is computed here from its bytes by
// applying the merges in order, which is exactly how BPE encodes (lowest rank first).
// Pick a step with the slider (keyboard), the prev/next buttons, or by hovering the merge
// timeline (one row per merge, bar = how often the merged pair occurred).

/** Replace each (a, b) by newId, left to right: [1, 2, 3, 1, 2], 1, 2, 9 -> [9, 3, 9]. */
function mergePair(ids, a, b, newId) {
  const out = [];
  for (let i = 0; i < ids.length; i++) {
    if (i + 1 < ids.length && ids[i] === a && ids[i + 1] === b) {
      out.push(newId);
      i++;
    } else {
      out.push(ids[i]);
    }
  }
  return out;
}

function render({ model, el: element }) {
  const node = tokenRoot(element, "tfw-bpe");
  const title = el("div", { class: "tfw-title" });
  const pick = slider({ label: "merges applied", min: 0, max: 1, value: 0, onInput: (v) => select(v) });
  const prev = el("button", { "aria-label": "previous merge" }, "◀ prev");
  const next = el("button", { "aria-label": "next merge" }, "next ▶");
  const timeline = el("canvas", { class: "tfw-fit",
                                   "aria-label": "merge timeline: one row per merge, hover to pick it" });
  const mergeBox = el("div", { class: "tfw-details" });
  const chartBox = el("div", {});
  const ratioBox = el("div", {});
  const sampleHead = el("div", { class: "tfw-title" });
  const sampleBox = el("div", { class: "tfw-tokenline" });
  const details = el("div", { class: "tfw-details" });
  const textInput = el("textarea", { rows: 4, cols: 70, "aria-label": "training text" });
  const vocabInput = el("input", { type: "number", min: 257, max: 1256, "aria-label": "vocab size" });
  const patternInput = el("select", { "aria-label": "pre-split pattern" },
    el("option", { value: "gpt4" }, "GPT-4 pre-split"),
    el("option", { value: "gpt2" }, "GPT-2 pre-split"),
    el("option", { value: "lines" }, "lines only (<= 10,000 chars)"));
  const train = el("button", {}, "retrain in Python");
  const note = el("span", { class: "tfw-note" }, "");
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" }, "");
  node.append(
    title,
    el("div", { class: "tfw-row" }, prev, next, pick.node),
    el("div", { class: "tfw-row" },
      el("div", {}, el("div", { class: "tfw-note" }, "merge timeline (hover)"), timeline),
      el("div", { style: "flex: 1; min-width: 300px" }, mergeBox, chartBox, ratioBox)),
    sampleHead, sampleBox, details,
    el("div", { class: "tfw-row" }, el("div", {}, textInput),
      el("div", {}, "vocab size ", vocabInput, el("br"), patternInput, el("br"), train, el("br"),
         note, errorBox, pythonStatus(model))),
  );

  let vocab = []; // id -> its bytes
  let madeBy = []; // id -> the merge index that made it (-1 for bytes)

  function buildVocab() {
    vocab = Array.from({ length: 256 }, (_, b) => [b]);
    madeBy = Array(256).fill(-1);
    model.get("merges").forEach(([a, b], k) => {
      vocab.push(vocab[a].concat(vocab[b]));
      madeBy.push(k);
    });
  }

  const label = (id) => bytesLabel(vocab[id]);
  const quoted = (id) => {
    const { text, valid } = label(id);
    return valid ? `"${text}"` : `<${text}>`;
  };

  function select(k) {
    const n = model.get("merges").length;
    model.set("step", Math.max(0, Math.min(n, k)));
    model.save_changes();
  }

  prev.addEventListener("click", () => select(model.get("step") - 1));
  next.addEventListener("click", () => select(model.get("step") + 1));
  // An empty box retrains on the text trained on now (null): it is too long for the page.
  train.addEventListener("click", () => request(model, {
    text: textInput.value === "" ? null : textInput.value, vocab_size: Number(vocabInput.value),
    pattern: patternInput.value }));
  watchLive(model, (live) => {
    for (const input of [textInput, vocabInput, patternInput, train]) input.disabled = !live;
    note.textContent = live ? "" : "static page: run the chapter in Jupyter to retrain";
  });

  function drawTimeline(k) {
    const merges = model.get("merges"), tops = model.get("top_pairs");
    const n = merges.length;
    const width = 150, height = 260;
    timeline.width = width;
    timeline.height = height;
    const ctx = timeline.getContext("2d");
    ctx.fillStyle = "#fafafa";
    ctx.fillRect(0, 0, width, height);
    const maxLog = Math.log(1 + (n ? tops[0][0][2] : 1));
    const rowH = height / Math.max(n, 1);
    for (let i = 0; i < n; i++) {
      ctx.fillStyle = i === k - 1 ? "#d62728" : "#1f77b4";
      const w = (width * Math.log(1 + tops[i][0][2])) / maxLog;
      const y0 = Math.floor(i * rowH), y1 = Math.floor((i + 1) * rowH);
      ctx.fillRect(0, y0, w, Math.max(y1 - y0, 1));  // whole pixels: no stripes
    }
    if (k > 0) {  // a marker across the selected row, visible even when rows are thin
      ctx.fillStyle = "#d62728";
      ctx.fillRect(0, (k - 1) * rowH + rowH / 2 - 1, width, 2);
    }
  }

  function drawChart(top, winner) {
    const rowH = 18, width = 380, labelW = 150;
    const height = rowH * top.length + 4;
    const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "tfw-fit",
                               role: "img" });
    const max = top[0][2];
    top.forEach(([a, b, count], r) => {
      const y = r * rowH + 2;
      const w = ((width - labelW - 60) * count) / max;
      chart.append(svg("text", { x: labelW - 6, y: y + 12, "font-size": 11, "text-anchor": "end",
        "font-family": "monospace", text: `${quoted(a)} + ${quoted(b)}` }));
      chart.append(svg("rect", { x: labelW, y, width: Math.max(w, 1), height: rowH - 4,
        fill: r === 0 && winner ? "#d62728" : "#9ecae1" }));
      chart.append(svg("text", { x: labelW + w + 4, y: y + 12, "font-size": 11,
        text: count.toLocaleString("en") }));
    });
    return chart;
  }

  function drawSample(k) {
    const merges = model.get("merges").slice(0, k);
    const newId = k > 0 ? 255 + k : -1;
    let nTokens = 0, nBytes = 0, nNew = 0;
    const spans = [];
    for (const chunk of model.get("sample")) {
      let ids = chunk;
      merges.forEach(([a, b], i) => {
        if (ids.length > 1) ids = mergePair(ids, a, b, 256 + i);
      });
      const group = el("span", { class: "tfw-chunk" });
      for (const id of ids) {
        const { text, valid } = label(id);
        const span = tokenSpan(text, nTokens, { valid });
        span.dataset.id = String(id);
        if (id === newId) {
          span.classList.add("tfw-hot");
          nNew++;
        }
        span.addEventListener("mouseenter", () => describe(id));
        group.append(span);
        nTokens++;
      }
      nBytes += chunk.length;
      spans.push(group, el("wbr"));
      if (chunk.length && chunk[chunk.length - 1] === 10) spans.push(el("br"));
    }
    sampleBox.replaceChildren(...spans);
    const ratio = (nBytes / Math.max(nTokens, 1)).toFixed(2);
    sampleHead.textContent = `The sample after ${k} merges: ${nBytes} bytes in ${nTokens} tokens ` +
      `(${ratio} bytes per token)` + (k > 0 ? `; the new token appears ${nNew} time${nNew === 1 ? "" : "s"} (outlined)` : "") +
      ". Underlines mark the pre-split chunks, which merges never cross.";
  }

  function describe(id) {
    const bytes = vocab[id];
    let text = `token ${id} = ${quoted(id)}, ${bytes.length} byte${bytes.length > 1 ? "s" : ""}: ${hexBytes(bytes)}`;
    if (madeBy[id] >= 0) {
      const [a, b] = model.get("merges")[madeBy[id]];
      text += `\nmade by merge ${madeBy[id] + 1}: ${quoted(a)} (token ${a}) + ${quoted(b)} (token ${b})`;
    } else {
      text += "\none of the 256 byte tokens every byte-level BPE starts with";
    }
    details.textContent = text;
  }

  function draw() {
    buildVocab();
    const merges = model.get("merges"), tops = model.get("top_pairs");
    const lengths = model.get("lengths"), n = merges.length;
    const k = Math.max(0, Math.min(n, model.get("step")));
    const pattern = { gpt4: "GPT-4 pre-split", gpt2: "GPT-2 pre-split",
      lines: "cut at line ends only" }[model.get("pattern")] || "";
    title.textContent = `BPE trained on ${model.get("n_chars").toLocaleString("en")} characters ` +
      `(${pattern}): ${n} merges, vocabulary ${256 + n}. Step ${k} of ${n}.`;
    pick.input.max = String(n);
    pick.set(k);
    prev.disabled = k === 0;
    next.disabled = k === n;
    vocabInput.value = String(256 + n);
    patternInput.value = model.get("pattern");
    textInput.placeholder = `Empty: retrain on the ${model.get("n_chars").toLocaleString("en")} ` +
      "characters trained on now, with the vocabulary size and pre-split set here. Or type " +
      "or paste a text to train on it.";
    showError(errorBox, model);

    if (n === 0) {
      mergeBox.textContent = "no merges: the text has no adjacent pair inside a chunk";
      chartBox.replaceChildren();
    } else if (k === 0) {
      mergeBox.textContent = "Step 0: only the 256 byte tokens. Below: the most frequent " +
        "adjacent pairs in the training text; the top one (red) is merged first.";
      chartBox.replaceChildren(drawChart(tops[0], true));
    } else {
      const [a, b] = merges[k - 1];
      const examples = model.get("examples")[k - 1].map((c) => `"${showWhitespace(c)}"`);
      mergeBox.textContent = `Merge ${k}: ${quoted(a)} + ${quoted(b)} -> new token ${255 + k} ` +
        `${quoted(255 + k)}, found ${tops[k - 1][0][2].toLocaleString("en")} times, e.g. in ` +
        `${examples.join(", ")}. The pair counts just before this merge:`;
      chartBox.replaceChildren(drawChart(tops[k - 1], true));
    }
    const bytesPerToken = lengths.map((len) => model.get("n_bytes") / len);
    ratioBox.replaceChildren(linePlot([...Array(lengths.length).keys()], bytesPerToken, {
      width: 380, height: 130, marker: k, xLabel: "merges", yLabel: "training text: bytes per token" }));
    drawTimeline(k);
    drawSample(k);
    details.textContent = "Hover a token of the sample to see its id, its bytes and the merge that made it.";
  }

  timeline.addEventListener("mousemove", (event) => {
    const n = model.get("merges").length;
    const rect = timeline.getBoundingClientRect();
    const row = Math.floor(((event.clientY - rect.top) / rect.height) * n);
    const k = Math.max(1, Math.min(n, row + 1));
    if (n && k !== model.get("step")) select(k);
  });
  for (const name of ["merges", "sample", "step", "error"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
