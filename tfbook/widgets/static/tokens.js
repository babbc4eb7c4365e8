// Token-boundary view: one row of coloured tokens per tokenizer, for the example picked with
// the slider. Hovering a token shows its id, text and bytes in the details panel and, when
// the tokenizers cut the same bytes (byte-level BPE), outlines the tokens of the other rows
// that cover any of its bytes. Each token is [id, text or null, hex bytes, start, end, special].

function render({ model, el: element }) {
  const node = tokenRoot(element, "tfw-tokens");
  const pick = slider({ label: "example", min: 0, max: 1, value: 0, onInput: (v) => select(v) });
  const textBox = el("div", { class: "tfw-tokenline tfw-note" });
  const rowsBox = el("div", {
    style: "display: grid; grid-template-columns: max-content 1fr; gap: 6px 12px; align-items: baseline" });
  const details = el("div", { class: "tfw-details" });
  const input = el("textarea", { rows: 2, cols: 70, "aria-label": "your text" });
  const send = el("button", {}, "tokenize in Python");
  const note = el("span", { class: "tfw-note" }, "");
  const errorBox = el("span", { class: "tfw-note", style: "color:#b00" }, "");
  node.append(
    el("div", { class: "tfw-row" }, pick.node),
    textBox, rowsBox, details,
    el("div", { class: "tfw-row" }, input, el("div", {}, send, el("br"), note, errorBox)),
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

  const HINT = "Hover a token to see its id and bytes; tokens of the other rows that share " +
    "its bytes get a red outline.";

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

  function draw() {
    const texts = model.get("texts"), names = model.get("names");
    const e = Math.max(0, Math.min(texts.length - 1, model.get("example")));
    pick.input.max = String(texts.length - 1);
    pick.set(e);
    textBox.textContent = `example ${e + 1} of ${texts.length}: ${showWhitespace(texts[e])}`;
    errorBox.textContent = model.get("error");
    const rows = model.get("tokens")[e];
    const cells = [];
    const all = []; // [row, token, span] for outlining overlaps
    rows.forEach((tokens, r) => {
      cells.push(el("div", { class: "tfw-title" }, `${names[r]} (${tokens.length})`));
      const line = el("div", { class: "tfw-tokenline" });
      tokens.forEach((token, k) => {
        const [id, , hex, , , special] = token;
        const label = bytesLabel(hex ? hex.split(" ").map((h) => parseInt(h, 16)) : []);
        const span = tokenSpan(label.text, k, { valid: label.valid, special });
        span.dataset.id = String(id);
        span.addEventListener("mouseenter", () => {
          describe(names[r], k, tokens.length, token);
          for (const [r2, other, otherSpan] of all) {
            const overlaps = token[3] >= 0 && other[3] >= 0 && r2 !== r &&
              other[3] < token[4] && token[3] < other[4];
            otherSpan.classList.toggle("tfw-hot", overlaps);
          }
          span.classList.add("tfw-hot");
        });
        span.addEventListener("mouseleave", () => {
          for (const [, , otherSpan] of all) otherSpan.classList.remove("tfw-hot");
        });
        all.push([r, token, span]);
        line.append(span, el("wbr"));
      });
      cells.push(line);
    });
    rowsBox.replaceChildren(...cells);
    details.textContent = HINT;
  }

  for (const name of ["texts", "tokens", "example", "error"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
