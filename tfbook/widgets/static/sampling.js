// Next-token sampling. Python stores, for each step of a generation, the N most likely next
// tokens (the candidates, most likely first) with their raw logits, and the token chosen.
// This script applies the sampler itself, in HF's order, so every knob works without a
// kernel: temperature (0 = greedy), then top-k, then top-p, then a softmax over what is left.
// It mirrors tfbook.generate.sampling.kept_distribution, boundary rules and ties included:
// - top-k keeps every score >= the k-th largest (ties at the boundary stay);
// - top-p sorts the scores ascending (stable: ties in candidate order), takes the softmax
//   and its running sum, removes the tokens whose running sum is <= 1 - p, and always keeps
//   the most likely; p = 1 is skipped, as in HF's generate.
// Bars: the kept probability (blue) over the probability before filtering (grey); cut
// tokens stay listed, greyed, with probability 0. Each bar row carries data-p and data-kept,
// the summary data-kept, data-entropy (bits) and data-settings, for the tests.
// Token text arrives escaped (fromPage) and is always set with textContent, never as HTML.

/** Undo Python's page_text: "%3C" -> "<", "%25" -> "%" (the saved page never holds a raw "<"). */
function fromPage(text) {
  return text.replace(/%(25|3C)/g, (_, hex) => (hex === "25" ? "%" : "<"));
}

/** Compare numbers for Array.sort; -Infinity is equal to itself (a - b would give NaN). */
function byValue(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** softmax(scores) with the max subtracted first; a score of -Infinity gets probability 0. */
function softmax(scores) {
  const top = Math.max(...scores);
  const exps = scores.map((s) => Math.exp(s - top));
  let total = 0;
  for (const e of exps) total += e;
  return exps.map((e) => e / total);
}

/** The sampler over the candidates: {kept: [true, true, false, ...], probs: [0.7, 0.3, 0, ...]}.
 *  topK and topP are null when off; temperature 0 keeps only the first argmax. A kept token
 *  can still get probability 0 when its exp underflows (a tiny temperature). */
function keptDistribution(logits, temperature, topK, topP) {
  const n = logits.length;
  if (temperature === 0) {
    let best = 0;
    for (let i = 1; i < n; i++) if (logits[i] > logits[best]) best = i;
    return { kept: logits.map((_, i) => i === best), probs: logits.map((_, i) => (i === best ? 1 : 0)) };
  }
  const scores = logits.map((x) => x / temperature);
  if (topK !== null) {
    const k = Math.min(Math.max(topK, 1), n);
    const kth = [...scores].sort((a, b) => byValue(b, a))[k - 1];
    scores.forEach((s, i) => { if (s < kth) scores[i] = -Infinity; });
  }
  if (topP !== null && topP < 1) {
    const order = scores.map((_, i) => i).sort((a, b) => byValue(scores[a], scores[b]));
    const probs = softmax(order.map((i) => scores[i]));
    const cut = 1 - topP;
    let cumulative = 0;
    order.forEach((i, r) => {
      cumulative += probs[r];
      if (cumulative <= cut && r < n - 1) scores[i] = -Infinity;  // the last is the most likely
    });
  }
  return { kept: scores.map((s) => s !== -Infinity), probs: softmax(scores) };
}

/** Entropy in bits of a distribution: -sum p log2 p over p > 0. */
function entropyBits(probs) {
  let h = 0;
  for (const p of probs) if (p > 0) h -= p * Math.log2(p);
  return h;
}

/** A probability for the bars: 4 decimals, tiny ones in exponent notation. */
function formatProbability(p) {
  if (p === 0) return "0";
  return p >= 1e-4 ? p.toFixed(4) : p.toExponential(1);
}

const SAMPLING_STYLE = `
.tfw-sampling .tfw-bars { max-height: 380px; overflow-y: auto; border: 1px solid #ddd;
  padding: 2px 4px; max-width: 640px; }
.tfw-bar { display: flex; align-items: center; gap: 6px; height: 19px; }
.tfw-bar .tfw-rank { width: 2.5em; text-align: right; color: #888; font-size: 11px; }
.tfw-bar .tfw-label { width: 15em; overflow: hidden; text-overflow: ellipsis;
  font-family: monospace; white-space: pre; }
.tfw-bar .tfw-track { position: relative; width: 260px; height: 13px; background: #f4f4f4; }
.tfw-bar .tfw-before { position: absolute; left: 0; top: 0; height: 100%; background: #c8c8c8; }
.tfw-bar .tfw-fill { position: absolute; left: 0; top: 3px; height: 7px; background: #1f77b4; }
.tfw-bar .tfw-prob { font-family: monospace; font-size: 12px; white-space: pre; }
.tfw-bar.tfw-cut { color: #aaa; }
.tfw-bar.tfw-chosen .tfw-label { outline: 2px solid #d62728; }
.tfw-sampling .tfw-context { max-width: 760px; }
.tfw-sampling .tfw-context .tfw-chosen { outline: 2px solid #d62728; font-weight: 600; }
.tfw-sampling .tfw-summary { font-weight: 600; }
.tfw-sampling .tfw-knob { white-space: nowrap; }
.tfw-sampling .tfw-knob .tfw-slider input { width: 130px; }
`;

function render({ model, el: element }) {
  const node = tokenRoot(element, "tfw-sampling");
  const set = (changes) => {
    for (const [key, value] of Object.entries(changes)) model.set(key, value);
    model.save_changes();
  };
  const title = el("div", { class: "tfw-title" });
  const pickStep = slider({ label: "step", min: 1, max: 1, value: 1, onInput: (v) => set({ step: v - 1 }) });
  const prev = el("button", { "aria-label": "previous step" }, "◀ prev");
  const next = el("button", { "aria-label": "next step" }, "next ▶");
  const context = el("div", { class: "tfw-tokenline tfw-context" });
  const chosenNote = el("div", { class: "tfw-note" });
  const temperature = slider({ label: "temperature", min: 0, max: 2, step: 0.05, value: 1,
                               onInput: (v) => set({ temperature: v }) });
  const kOn = el("input", { type: "checkbox", "aria-label": "use top-k" });
  const kSlider = slider({ label: "", min: 1, max: 200, value: 10, onInput: (v) => set({ top_k: v }) });
  kSlider.input.setAttribute("aria-label", "top-k: keep the k most likely tokens");
  const pOn = el("input", { type: "checkbox", "aria-label": "use top-p" });
  const pSlider = slider({ label: "", min: 0.01, max: 1, step: 0.01, value: 0.9,
                           onInput: (v) => set({ top_p: v }) });
  pSlider.input.setAttribute("aria-label", "top-p: keep the most likely tokens until p");
  kOn.addEventListener("change", () => set({ top_k: kOn.checked ? Number(kSlider.input.value) : null }));
  pOn.addEventListener("change", () => set({ top_p: pOn.checked ? Number(pSlider.input.value) : null }));
  const summary = el("div", { class: "tfw-summary" });
  const bars = el("div", { class: "tfw-bars" });
  const caption = el("div", { class: "tfw-note" });
  const promptInput = el("textarea", { rows: 2, cols: 60, "aria-label": "your prompt" });
  const lengthInput = el("input", { type: "number", min: 1, max: 64, "aria-label": "new tokens" });
  const run = el("button", {}, "generate in Python");
  const note = el("span", { class: "tfw-note" });
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" });
  const liveRow = el("div", { class: "tfw-row" }, promptInput,
    el("div", {}, "new tokens ", lengthInput, " ", run, el("br"), note, errorBox));
  node.append(
    el("style", {}, SAMPLING_STYLE),
    title,
    el("div", { class: "tfw-row" }, prev, next, pickStep.node),
    context, chosenNote,
    el("div", { class: "tfw-row" }, temperature.node,
       el("span", { class: "tfw-knob" }, el("label", {}, kOn, " top-k"), " ", kSlider.node),
       el("span", { class: "tfw-knob" }, el("label", {}, pOn, " top-p"), " ", pSlider.node)),
    summary, bars, caption, liveRow,
  );
  prev.addEventListener("click", () => set({ step: Math.max(model.get("step") - 1, 0) }));
  next.addEventListener("click", () => set({ step: Math.min(model.get("step") + 1,
                                                             model.get("steps").length - 1) }));
  run.addEventListener("click", () => request(model, {
    prompt: promptInput.value, max_new_tokens: Number(lengthInput.value) }));
  watchLive(model, (live) => {
    const usable = live && model.get("can_run");
    promptInput.disabled = lengthInput.disabled = run.disabled = !usable;
    liveRow.style.display = model.get("can_run") ? "" : "none";
    note.textContent = usable ? "" : "static page: run the chapter in Jupyter to generate from your own prompt";
  });

  function drawContext(steps, s) {
    const tokens = [...model.get("prompt_tokens"), ...steps.slice(0, s).map((st) => st.chosen_text)]
      .map(fromPage);
    const spans = [];
    const add = (text, k, hot) => {
      const span = tokenSpan(showWhitespace(text), k);
      if (hot) span.classList.add("tfw-chosen");
      spans.push(span, el("wbr"));
      if (text.endsWith("\n")) spans.push(el("br"));
    };
    tokens.forEach((text, k) => add(text, k, false));
    add(fromPage(steps[s].chosen_text), tokens.length, true);
    context.replaceChildren(...spans);
  }

  function drawBars(step, { kept: keptSet, probs }, before) {
    const scale = Math.max(...probs);
    const rows = step.logits.map((logit, i) => {
      const p = probs[i], kept = keptSet[i];
      const text = fromPage(step.tokens[i]);
      const label = el("span", { class: "tfw-label", title: text },
                       text === "" ? "(empty)" : showWhitespace(text));
      const fill = el("div", { class: "tfw-fill" });
      fill.style.width = `${(100 * p) / scale}%`;
      const ghost = el("div", { class: "tfw-before" });
      ghost.style.width = `${(100 * before[i]) / scale}%`;
      const chosen = step.ids[i] === step.chosen;
      const row = el("div", { class: "tfw-bar" + (kept ? "" : " tfw-cut") + (chosen ? " tfw-chosen" : ""),
                              title: `token ${step.ids[i]}, logit ${logit}` },
        el("span", { class: "tfw-rank" }, String(i + 1)), label,
        el("div", { class: "tfw-track" }, ghost, fill),
        el("span", { class: "tfw-prob" }, (kept ? formatProbability(p) : "0 (cut)") + (chosen ? "  ◀ chosen" : "")));
      row.dataset.rank = String(i);
      row.dataset.id = String(step.ids[i]);
      row.dataset.p = String(p);
      row.dataset.kept = kept ? "1" : "0";
      return row;
    });
    bars.replaceChildren(...rows);
  }

  function draw() {
    const steps = model.get("steps");
    const S = steps.length;
    if (!S) return;
    const s = Math.max(0, Math.min(S - 1, model.get("step")));
    const step = steps[s];
    const n = step.logits.length;
    const T = model.get("temperature"), k = model.get("top_k"), p = model.get("top_p");
    const maxN = Math.max(...steps.map((st) => st.logits.length));

    title.textContent = `Step ${s + 1} of ${S}: the next-token distribution`;
    pickStep.input.max = String(S);
    pickStep.set(s + 1);
    prev.disabled = s === 0;
    next.disabled = s === S - 1;
    temperature.set(T);
    temperature.node.querySelector(".tfw-value").textContent = T === 0 ? "0 (greedy)" : String(T);
    kSlider.input.max = String(maxN);
    kOn.checked = k !== null;
    kSlider.input.disabled = k === null;
    kSlider.set(k === null ? Number(kSlider.input.value) : k);
    if (k === null) kSlider.node.querySelector(".tfw-value").textContent = "off";
    pOn.checked = p !== null;
    pSlider.input.disabled = p === null;
    pSlider.set(p === null ? Number(pSlider.input.value) : p);
    if (p === null) pSlider.node.querySelector(".tfw-value").textContent = "off";
    if (document.activeElement !== promptInput && !promptInput.value) promptInput.value = fromPage(model.get("prompt"));
    if (document.activeElement !== lengthInput) lengthInput.value = String(model.get("max_new_tokens"));
    errorBox.textContent = model.get("error");

    drawContext(steps, s);
    const sampler = keptDistribution(step.logits, T, k, p);
    const probs = sampler.probs;
    drawBars(step, sampler, keptDistribution(step.logits, T, null, null).probs);

    const kept = sampler.kept.filter(Boolean).length;
    const entropy = entropyBits(probs);
    summary.textContent = `kept ${kept} of ${n} candidates · entropy ${entropy.toFixed(3)} bits`;
    summary.dataset.kept = String(kept);
    summary.dataset.entropy = String(entropy);
    summary.dataset.settings = JSON.stringify([s, T, k, p]);

    const where = step.ids.indexOf(step.chosen);
    let line = `The model chose "${showWhitespace(fromPage(step.chosen_text))}" (token ${step.chosen}, ` +
      `the ${step.chosen_rank ? ordinal(step.chosen_rank + 1) + " " : ""}most likely of ${model.get("vocab_size").toLocaleString("en")}). `;
    if (where < 0) line += `It is not among the ${n} candidates below.`;
    else if (sampler.kept[where]) line += `These settings give it probability ${formatProbability(probs[where])}.`;
    else line += "These settings would cut it: it could not have been sampled.";
    chosenNote.textContent = line;
    caption.textContent = `Candidates: the ${n} most likely next tokens of the vocabulary of ` +
      `${model.get("vocab_size").toLocaleString("en")}; at ` +
      `temperature 1 they hold ${(100 * step.mass).toFixed(2)}% of the probability. The tail ` +
      "beyond them is cut: every distribution drawn here is over these candidates only. Grey: " +
      "the probability after the temperature, before top-k and top-p; blue: after them, " +
      "renormalised.";
  }

  for (const name of ["steps", "step", "temperature", "top_k", "top_p", "error", "prompt_tokens"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
}

/** 1 -> "1st", 2 -> "2nd", 11 -> "11th", 23 -> "23rd". */
function ordinal(n) {
  const tens = n % 100, ones = n % 10;
  const suffix = tens >= 11 && tens <= 13 ? "th" : ones === 1 ? "st" : ones === 2 ? "nd" : ones === 3 ? "rd" : "th";
  return `${n}${suffix}`;
}

export default { render };
