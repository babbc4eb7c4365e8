// Next-token sampling. Python stores, for each step of a generation, the N most likely next
// tokens (the candidates, most likely first) with their raw logits, and the token chosen.
// The page applies the sampler itself to the candidates, so every knob works without a
// kernel: gpt.js's keptDistribution (the pages' one sampler, the mirror of
// tfbook.generate.sampling.kept_distribution, boundary rules and ties included):
// temperature (0 = greedy), then top-k, then top-p, then a softmax over what is left.
// Bars: the kept probability (blue) over the probability before filtering (grey); cut
// tokens stay listed, greyed, with probability 0. Each bar row carries data-p and data-kept,
// the summary data-kept, data-entropy (nats) and data-settings, for the tests.
// Token text arrives escaped (fromPage) and is always set with textContent, never as HTML.
//
// With a page model (Python's from_page_model stores a small GPT's payload in `page_model`),
// the prompt box works without a kernel: static/gpt.js, bundled before this file, encodes
// the typed text and generates with the knobs and the seed, and pageStep cuts each step's
// (V,) logits to its candidates as Python's build_steps does. The page's run lives in this
// view only (pageRun): the full logits stay here, so the summary can also count what the
// sampler keeps of the whole vocabulary. In Jupyter, with a kernel, the box asks Python,
// which computes the same generation (tfbook.widgets.sampling.page_generation).

const MAX_NEW_TOKENS = 64;  // as Python's MAX_NEW_TOKENS
const MAX_PROMPT_CHARS = 2000;  // as Python's MAX_PROMPT_CHARS
const MAX_SEED = 4294967295;  // mulberry32 keeps 32 bits
const EMPTY_PROMPT = "the prompt is empty: type a few words to continue";

/** One step as Python's build_steps makes it, from the page's logits (V,): the topN most
 *  likely finite tokens (ties by id), their texts and logits, the chosen id, its text, its
 *  rank in the vocabulary (0 = most likely) and the candidates' mass at temperature 1. */
function pageStep(logits, chosen, topN, text) {
  const V = logits.length;
  const order = [];  // (V,) finite tokens, most likely first
  for (let i = 0; i < V; i++) if (logits[i] > -Infinity) order.push(i);
  order.sort((a, b) => logits[b] - logits[a] || a - b);
  const ids = order.slice(0, topN);  // (N,)
  const max = logits[order[0]];
  let total = 0;
  for (const i of order) total += Math.exp(logits[i] - max);  // softmax over all V
  let mass = 0;
  for (const i of ids) mass += Math.exp(logits[i] - max) / total;
  return { ids, tokens: ids.map(text), logits: ids.map((i) => logits[i]), chosen,
           chosen_text: text(chosen), chosen_rank: order.indexOf(chosen), mass };
}

/** The reader's request, checked as Python checks it: {prompt, maxNewTokens, seed}, or an
 *  Error whose message says what was expected. */
function checkRequest(prompt, maxNewTokens, seed) {
  if (!prompt.trim()) throw new Error(EMPTY_PROMPT);
  const chars = [...prompt].length;  // code points, as Python's len
  if (chars > MAX_PROMPT_CHARS) {
    throw new Error(`the prompt has ${chars.toLocaleString("en")} characters; the widget ` +
                    `takes at most ${MAX_PROMPT_CHARS.toLocaleString("en")}`);
  }
  const n = Number(maxNewTokens), s = Number(seed);
  if (maxNewTokens === "" || !Number.isInteger(n) || n < 1 || n > MAX_NEW_TOKENS) {
    throw new Error(`new tokens must be an integer between 1 and ${MAX_NEW_TOKENS}, got ` +
                    `${JSON.stringify(String(maxNewTokens))}`);
  }
  if (seed === "" || !Number.isInteger(s) || s < 0 || s > MAX_SEED) {
    throw new Error(`seed must be an integer between 0 and ${MAX_SEED}, got ` +
                    `${JSON.stringify(String(seed))}`);
  }
  return { prompt, maxNewTokens: n, seed: s };
}

/** Generate in the page: the prompt encoded and cut to leave room for the new tokens (its
 *  last max(1, T - n) tokens, as Python's fit_prompt), continued by PageGPT.generate with
 *  the cache and the seeded sampler, each step cut to its topN candidates. */
function generateInPage(gpt, prompt, { maxNewTokens, temperature, topK, topP, seed, topN }) {
  const all = gpt.tokenizer.encode(prompt);
  if (!all.length) throw new Error(EMPTY_PROMPT);
  const room = Math.max(1, gpt.config.max_len - maxNewTokens);
  const { ids, dropped } = fitContext(all, room);
  const run = gpt.generate(ids, { maxNewTokens, temperature, topK, topP, seed });
  const text = (id) => toPage(gpt.tokenizer.tokenText(id));
  return { ids, dropped, tokens: run.tokens, logits: run.logits, stopped: run.stopped,
           promptTokens: ids.map(text),
           steps: run.tokens.map((c, s) => pageStep(run.logits[s], c, topN, text)) };
}

/** "off" for a filter that is switched off (null), else the value. */
function knob(value) {
  return value === null ? "off" : String(value);
}

/** Entropy in nats of a distribution: -sum p ln p over p > 0 (the book's unit). */
function entropyNats(probs) {
  let h = 0;
  for (const p of probs) if (p > 0) h -= p * Math.log(p);
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
.tfw-bar .tfw-rank { flex: none; width: 2.5em; text-align: right; color: #888; font-size: 11px; }
.tfw-bar .tfw-label { flex: 0 1 15em; min-width: 0; overflow: hidden; text-overflow: ellipsis;
  font-family: monospace; white-space: pre; }
.tfw-bar .tfw-track { position: relative; flex: 0 1 260px; min-width: 40px; height: 13px;
  background: #f4f4f4; }
.tfw-bar .tfw-before { position: absolute; left: 0; top: 0; height: 100%; background: #c8c8c8; }
.tfw-bar .tfw-fill { position: absolute; left: 0; top: 3px; height: 7px; background: #1f77b4; }
.tfw-bar .tfw-prob { flex: none; width: 17ch; font-family: monospace; font-size: 12px;
  white-space: pre; }
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
  const seedInput = el("input", { type: "number", min: 0, max: MAX_SEED, step: 1, "aria-label": "seed" });
  const seedLabel = el("span", {}, " seed ", seedInput);
  const run = el("button", {}, "generate in Python");
  const note = el("span", { class: "tfw-note" });
  const errorBox = el("span", { class: "tfw-note tfw-error", style: "color:#b00" });
  const pageStatus = el("div", { class: "tfw-note tfw-page-status" });
  const liveRow = el("div", { class: "tfw-row" }, promptInput,
    el("div", {}, "new tokens ", lengthInput, seedLabel, " ", run, el("br"), note, errorBox, pythonStatus(model)));
  node.append(
    el("style", {}, SAMPLING_STYLE),
    title,
    el("div", { class: "tfw-row" }, prev, next, pickStep.node),
    context, chosenNote,
    el("div", { class: "tfw-row" }, temperature.node,
       el("span", { class: "tfw-knob" }, el("label", {}, kOn, " top-k"), " ", kSlider.node),
       el("span", { class: "tfw-knob" }, el("label", {}, pOn, " top-p"), " ", pSlider.node)),
    summary, bars, caption, liveRow, pageStatus,
  );
  prev.addEventListener("click", () => set({ step: Math.max(model.get("step") - 1, 0) }));
  next.addEventListener("click", () => set({ step: Math.min(model.get("step") + 1,
                                                             model.get("steps").length - 1) }));
  // Who generates: Python when a kernel answers (Jupyter), else the page model if there is
  // one, else nobody (the static page of a widget without a page model).
  let live = false;
  const hasPageModel = () => model.get("page_model") !== "";
  // Python's generation uses the knobs it takes (all of them with a page model)
  const takesSeed = () => hasPageModel() || model.get("sampler_settings").includes("seed");
  const inPython = () => live && model.get("can_run");
  let gpt = null;  // the PageGPT, decoded from the payload on the first request
  let pageRun = null;  // the page's last generation while it is shown: its full logits
  let fromPageRun = false;  // true while this view sets the steps of its own generation
  let runs = 0;

  function generate() {
    if (inPython()) {
      request(model, { prompt: promptInput.value, max_new_tokens: Number(lengthInput.value),
                       ...(takesSeed() ? { seed: Number(seedInput.value) } : {}) });
    } else if (hasPageModel()) {
      generateHere();
    }
  }

  function generateHere() {
    let result, settings, ms;
    try {
      const asked = checkRequest(promptInput.value, lengthInput.value, seedInput.value);
      settings = { ...asked, temperature: model.get("temperature"), topK: model.get("top_k"),
                   topP: model.get("top_p"), topN: model.get("top_n") };
      gpt = gpt || new PageGPT(JSON.parse(model.get("page_model")));
      const start = performance.now();
      result = generateInPage(gpt, settings.prompt, settings);
      ms = performance.now() - start;
    } catch (error) {
      model.set("error", toPage(error.message));  // this view only: nothing is sent anywhere
      return;
    }
    runs += 1;
    pageRun = null;  // until the model holds the new steps
    fromPageRun = true;
    model.set("error", "");
    model.set("prompt", toPage(settings.prompt));
    model.set("max_new_tokens", settings.maxNewTokens);
    model.set("seed", settings.seed);
    model.set("dropped", result.dropped);
    model.set("prompt_tokens", result.promptTokens);
    model.set("vocab_size", gpt.config.vocab_size);
    model.set("step", 0);
    model.set("steps", result.steps);
    fromPageRun = false;
    pageRun = { ...result, settings, ms };
    draw();
  }

  // The boxes keep what the reader typed: a redraw refills them from the model.
  const whole = (value, low, high) => value !== "" && Number.isInteger(Number(value)) &&
    Number(value) >= low && Number(value) <= high;
  lengthInput.addEventListener("input", () => {
    if (whole(lengthInput.value, 1, MAX_NEW_TOKENS)) set({ max_new_tokens: Number(lengthInput.value) });
  });
  seedInput.addEventListener("input", () => {
    if (whole(seedInput.value, 0, MAX_SEED)) set({ seed: Number(seedInput.value) });
  });
  run.addEventListener("click", generate);
  promptInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      generate();
    }
  });
  model.on("change:steps", () => { if (!fromPageRun) pageRun = null; });  // Python's steps

  function drawMode() {
    const python = inPython(), page = !python && hasPageModel();
    promptInput.disabled = lengthInput.disabled = seedInput.disabled = run.disabled = !(python || page);
    liveRow.style.display = model.get("can_run") || hasPageModel() ? "" : "none";
    seedLabel.style.display = takesSeed() ? "" : "none";
    run.textContent = page ? "generate in the page" : "generate in Python";
    const knobs = model.get("sampler_settings");
    note.textContent = python ? (knobs.length === 4 ? "" : knobs.length
      ? `Python generates with this widget's ${knobs.join(", ")}; the other knobs only re-filter the stored candidates`
      : "Python generates with its own settings; the knobs only re-filter the stored candidates") : page
      ? "the model runs in this page: no kernel, no network (Ctrl+Enter in the prompt generates)"
      : "static page: run the chapter in Jupyter to generate from your own prompt";
  }
  watchLive(model, (isLive) => {
    live = isLive;
    drawMode();
  });

  function drawStatus() {
    const dropped = model.get("dropped");
    const kept = model.get("prompt_tokens").length;
    const parts = [];
    if (dropped) {
      parts.push(`The prompt is longer than the context leaves room for: its first ${dropped} ` +
                 `tokens were dropped, and the model reads only the last ${kept} (shown above).`);
    }
    if (pageRun) {
      const { settings: st, tokens, stopped, ms } = pageRun;
      parts.push(`Generated in this page: ${tokens.length} tokens in ${ms.toFixed(0)} ms, with ` +
                 `temperature ${st.temperature}, top-k ${knob(st.topK)}, top-p ${knob(st.topP)}, ` +
                 `seed ${st.seed}; the same settings give the same text.` +
                 (stopped === "context" ? " It stopped early: the context is full." : ""));
      pageStatus.dataset.ids = JSON.stringify(pageRun.ids);
      pageStatus.dataset.tokens = JSON.stringify(tokens);
      pageStatus.dataset.stopped = stopped;
      pageStatus.dataset.ms = String(ms);
    }
    pageStatus.dataset.runs = String(runs);
    pageStatus.dataset.dropped = String(dropped);
    pageStatus.textContent = parts.join(" ");
  }

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
      row.dataset.logit = String(logit);
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
    if (document.activeElement !== seedInput) seedInput.value = String(model.get("seed"));
    showError(errorBox, model);
    drawMode();
    drawStatus();

    drawContext(steps, s);
    const sampler = keptDistribution(step.logits, T, k, p);
    const probs = sampler.probs;
    drawBars(step, sampler, keptDistribution(step.logits, T, null, null).probs);

    const kept = sampler.kept.filter(Boolean).length;
    const entropy = entropyNats(probs);
    let whole = "";
    if (pageRun) {  // the page holds this step's logits over the whole vocabulary
      const scores = filterLogits(pageRun.logits[s], T, k, p);
      const keptVocab = scores.filter((x) => x !== -Infinity).length;
      whole = ` · the sampler keeps ${keptVocab.toLocaleString("en")} of the ` +
        `${scores.length.toLocaleString("en")} tokens`;
      summary.dataset.keptVocab = String(keptVocab);
    } else {
      delete summary.dataset.keptVocab;
    }
    summary.textContent = `kept ${kept} of ${n} candidates${whole} · entropy ${entropy.toFixed(3)} nats`;
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

  for (const name of ["steps", "step", "temperature", "top_k", "top_p", "error", "prompt_tokens",
                      "dropped", "seed", "can_run", "sampler_settings"]) {
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
