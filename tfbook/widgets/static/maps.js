// What the attention map and the head explorer share (attention.py, maps_module).

const TYPED_NAME = "your text";  // the example of the reader's text (Python's name too)
const EMPTY_TEXT = "the text box is empty: type a sentence to see its attention";

/** Colour of byte v (weight v / 255), as common.js's sequentialColor: r, g, b per byte. */
const PALETTE = (() => {
  const rgb = new Uint8ClampedArray(256 * 3);
  for (let v = 0; v < 256; v++) {
    rgb[3 * v] = Math.round(255 - (215 * v) / 255);
    rgb[3 * v + 1] = Math.round(255 - (155 * v) / 255);
    rgb[3 * v + 2] = Math.round(255 - (55 * v) / 255);
  }
  return rgb;
})();

/** base64 text -> its bytes (Uint8Array.fromBase64 where the browser has it: faster). */
function fromBase64(text) {
  if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(text);
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

/** Python's pack_maps undone: base64 -> deflate stream (zlib format) -> the map bytes. */
async function inflateMaps(text) {
  if (typeof DecompressionStream === "undefined") {
    throw new Error("this browser cannot unpack the maps (it has no DecompressionStream)");
  }
  const stream = new Blob([fromBase64(text)]).stream()
    .pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** Paint rows x cols bytes from `start` into `canvas`, one pixel per byte. */
function paintBytes(canvas, bytes, start, rows, cols) {
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(cols, rows);
  const px = image.data;
  for (let i = 0; i < rows * cols; i++) {
    const v = 3 * bytes[start + i];
    px[4 * i] = PALETTE[v];
    px[4 * i + 1] = PALETTE[v + 1];
    px[4 * i + 2] = PALETTE[v + 2];
    px[4 * i + 3] = 255;
  }
  ctx.putImageData(image, 0, 0);
}

/** A select's options, one a name (rebuilt when the names change), `value` selected. */
function setOptions(select, names, value) {
  const key = names.join("\u0000");
  if (select.shownNames !== key) {
    select.shownNames = key;
    select.replaceChildren(...names.map((name, i) => el("option", { value: i }, name)));
  }
  select.value = String(value);
}

/** The examples shown, [{meta, bytes, offset, key}]: Python's (`data` inflated once, then
 *  ready()), then the page's run (showRun); null until inflated. */
function mapStore(model, metas, ready, failed) {
  let inflated = { from: null, bytes: null };
  let version = 0;  // bumped whenever the bytes behind an example may change
  const store = {
    typed: null,
    showRun(run, meta) {
      store.typed = { meta, bytes: run.bytes, offset: 0, key: `page${run.runs}` };
    },
    list() {
      const data = model.get("data");
      if (inflated.from !== data) {
        inflated = { from: data, bytes: null };
        inflateMaps(data).then((bytes) => {
          if (inflated.from !== data) return;  // newer data arrived meanwhile
          inflated.bytes = bytes;
          version += 1;
          ready();
        }, (error) => failed(error.message));
      }
      const list = metas(), offsets = model.get("offsets");
      if (!inflated.bytes || offsets.length !== list.length) return null;
      const all = list.map((meta, i) => ({ meta, bytes: inflated.bytes, offset: offsets[i],
                                           key: `${version}:${i}` }));
      if (store.typed) all.push(store.typed);
      return all;
    },
  };
  return store;
}

/** Python's truncation_note: a text of nTokens cut to its last `limit`. */
function truncationNote(nTokens, limit, context) {
  const reads = limit === context ? `the model reads at most ${limit}`
    : `this explorer shows at most ${limit} (the model reads up to ${context})`;
  return `the text is ${nTokens} tokens long and ${reads}: its first ${nTokens - limit} ` +
    `tokens were cut, the maps show the last ${limit}`;
}

/** A function that runs the page model on `input`'s last limit() tokens at the next frame
 *  and hands `show` the run (its bytes as Python's) or null, and an error ("" if none). */
function pageRunner(model, { input, status, limit = () => Infinity, check = () => {} }, show) {
  let gpt = null;  // the PageGPT, decoded from the payload on the first run
  let runs = 0;
  let pending = false;
  model.on("change:page_model", () => { gpt = null; });

  function runHere() {
    pending = false;
    const text = input.value;
    if (text.trim() === "") {
      status.textContent = EMPTY_TEXT;
      show(null, "");
      return;
    }
    let run;
    try {
      gpt = gpt || new PageGPT(JSON.parse(model.get("page_model")));
      const start = performance.now();
      const all = gpt.tokenizer.encode(text);
      if (!all.length) throw new Error("the text has no tokens");
      const context = gpt.config.max_len, keep = Math.min(limit(), context);
      const { ids, dropped } = fitContext(all, keep);
      const { attentions } = gpt.forward(ids, { needWeights: true, lastOnly: true });
      const T = ids.length, L = attentions.length, H = gpt.config.n_heads;
      const bytes = new Uint8Array(L * H * T * T);
      attentions.forEach((w, l) => {  // w (H, T, T)
        for (let i = 0; i < w.length; i++) bytes[l * H * T * T + i] = Math.round(w[i] * 255);
      });
      runs += 1;
      run = { ids, tokens: ids.map((id) => gpt.tokenizer.tokenText(id)), dropped, attentions,
              ms: performance.now() - start, runs, L, H, T, bytes,
              note: dropped ? truncationNote(all.length, keep, context) : "" };
      check(run);
    } catch (error) {
      show(null, error.message);  // e.g. a lone surrogate: the maps stay as they were
      return;
    }
    status.textContent = `computed in this page in ${run.ms.toFixed(0)} ms`;
    show(run, "");
  }

  return () => {
    if (!pending) requestAnimationFrame(runHere);  // one run a frame however fast one types
    pending = true;
  };
}
