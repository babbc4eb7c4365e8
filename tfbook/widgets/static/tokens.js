// Token-boundary view: one row of coloured tokens per tokenizer, for the example picked with
// the example slider (shown when there are several examples). Hovering a token, or walking
// through the first row's tokens with the token slider (keyboard), shows its id, text and
// bytes in the details panel and, when the tokenizers cut the same bytes (byte-level BPE),
// outlines the tokens of the other rows that cover any of its bytes.
// Each token is [id, text or null, hex bytes, start byte, end byte, is special].

function render({ model, el: element }) {
  const node = tokenRoot(element, "tfw-tokens");
  const pickExample = slider({ label: "example", min: 0, max: 1, value: 0,
                               onInput: (v) => select(v) });
  const pickToken = slider({ label: "token of the first row", min: 0, max: 1, value: 0,
                             onInput: (v) => focusToken(0, v) });
  const controls = el("div", { class: "tfw-row" });
  const textBox = el("div", { class: "tfw-tokenline tfw-note" });
  const rowsBox = el("div", { style: "display: grid; grid-template-columns: max-content 1fr; " +
                                     "gap: 6px 12px; align-items: baseline" });
  const details = el("div", { class: "tfw-details" });
  const input = el("textarea", { rows: 2, cols: 70, "aria-label": "your text" });
  const send = el("button", {}, "tokenize in Python");
  const note = el("span", { class: "tfw-note" }, "");
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" }, "");
  node.append(
    controls, textBox, rowsBox, details,
    el("div", { class: "tfw-row" }, input, el("div", {}, send, el("br"), note, errorBox, pythonStatus(model))),
  );
  send.addEventListener("click", () => request(model, { text: input.value }));
  watchLive(model, (live) => {
    input.disabled = send.disabled = !live;
    note.textContent = live ? "" : "static page: run the chapter in Jupyter to try your own text";
  });

  function select(e) {
    model.set("example", e);
    model.save_changes();
  }

  const HINT = "Hover a token (or move the token slider) to see its id and bytes; tokens of " +
    "the other rows that share its bytes get a red outline.";
  let rows = []; // per tokenizer: [{token, span}], for the example shown

  function describe(name, position, count, token) {
    const [id, text, hex, start, end, special] = token;
    const shown = text === null ? "(not whole characters: a piece of a multi-byte character)"
      : `"${showWhitespace(text)}"`;
    const kind = special ? "special token" : "token";
    const nBytes = hex ? hex.split(" ").length : 0;
    let line = `${name}: ${kind} ${position + 1} of ${count}, id ${id} = ${shown}\n` +
      `${nBytes} byte${nBytes === 1 ? "" : "s"}: ${hex}`;
    if (start >= 0) line += ` (bytes ${start} to ${end - 1} of the text)`;
    details.textContent = line;
  }

  /** Describe token k of row r and outline it and the tokens of other rows sharing bytes. */
  function focusToken(r, k) {
    if (!rows[r] || !rows[r][k]) return;
    const { token } = rows[r][k];
    describe(model.get("names")[r], k, rows[r].length, token);
    rows.forEach((row, r2) => row.forEach(({ token: other, span }, k2) => {
      const same = r2 === r && k2 === k;
      const overlaps = r2 !== r && token[3] >= 0 && other[3] >= 0 &&
        other[3] < token[4] && token[3] < other[4];
      span.classList.toggle("tfw-hot", same || overlaps);
    }));
  }

  function draw() {
    const texts = model.get("texts"), names = model.get("names");
    const e = Math.max(0, Math.min(texts.length - 1, model.get("example")));
    pickExample.input.max = String(texts.length - 1);
    pickExample.set(e);
    setChildren(controls, [...(texts.length > 1 ? [pickExample.node] : []), pickToken.node]);
    textBox.textContent = `example ${e + 1} of ${texts.length}: ${showWhitespace(texts[e])}`;
    showError(errorBox, model);
    const cells = [];
    rows = model.get("tokens")[e].map((tokens, r) => {
      cells.push(el("div", { class: "tfw-title" }, `${names[r]} (${tokens.length})`));
      const line = el("div", { class: "tfw-tokenline" });
      cells.push(line);
      return tokens.map((token, k) => {
        const [id, , hex, , , special] = token;
        const label = bytesLabel(hex ? hex.split(" ").map((h) => parseInt(h, 16)) : []);
        const span = tokenSpan(label.text, k, { valid: label.valid, special });
        span.dataset.id = String(id);
        span.addEventListener("mouseenter", () => focusToken(r, k));
        line.append(span, el("wbr"));
        return { token, span };
      });
    });
    rowsBox.replaceChildren(...cells);
    pickToken.input.max = String(Math.max(rows[0].length - 1, 0));
    pickToken.set(0);
    details.textContent = HINT;
  }

  for (const name of ["texts", "tokens", "example", "error"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
