// Drawing tokens, shared by the BPE-merges stepper (bpe.js) and the token-boundary view
// (tokens.js): Python puts this file after common.js and before the widget's own script.
// Token text is always set with textContent (through el), never parsed as HTML.

const TOKEN_COLORS = ["#cfe8ff", "#ffe0ad", "#c8f0cf", "#f7cfe6", "#ded5ff", "#fff1a1"];

const TOKEN_STYLE = `
.tfw-tokenline { font-family: monospace; line-height: 2; }
.tfw-token { margin-right: 1px; }
.tfw-tokenline .tfw-token { white-space: pre-wrap; }  /* a token longer than the line wraps */
.tfw-token.tfw-partial { font-style: italic; color: #555; outline: 1px dashed #888; }
.tfw-token.tfw-special { background: #444 !important; color: #fff; }
.tfw-token.tfw-hot { outline: 2px solid #d62728; }
.tfw-chunk { border-bottom: 2px solid #aaa; margin-right: 4px; padding-bottom: 1px; }
.tfw-details { font-family: monospace; background: #f6f8fa; border-radius: 4px; padding: 4px 8px;
               min-height: 2.8em; white-space: pre-wrap; }
.tfw-title { font-weight: 600; }
`;

/** Whitespace made visible: visibleText's space, newline and tab, plus \r, NBSP, zero-widths. */
function showWhitespace(text) {
  return visibleText(text)
    .replace(/\r/g, "␍")
    .replace(/\u00a0/g, "⍽")
    .replace(/[\u200b\u200c\u200d\u2060\ufeff]/g,
             (c) => `⟨${c.codePointAt(0).toString(16).toUpperCase()}⟩`);
}

/** Byte values as hex: [104, 105] -> "68 69". */
function hexBytes(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
}

// ignoreBOM: a token that is a byte-order mark (ef bb bf) is a character, not a signature
const STRICT_UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Length of the UTF-8 sequence that starts at bytes[i], or 0 if none does. */
function utf8Length(bytes, i) {
  const lead = bytes[i];
  const n = lead < 0x80 ? 1 : lead >> 5 === 6 ? 2 : lead >> 4 === 14 ? 3 : lead >> 3 === 30 ? 4 : 0;
  if (!n || i + n > bytes.length) return 0;
  try {
    STRICT_UTF8.decode(Uint8Array.from(bytes.slice(i, i + n)));
    return n;
  } catch (error) {
    return 0;  // bad continuation bytes, overlong form, surrogate
  }
}

/** A token's bytes as a label: {text, valid}. Whole characters are shown as text (whitespace
 *  made visible); bytes that are only a piece of a character (byte-level BPE can cut one)
 *  are shown in hex between ‹ ›, e.g. [32, 240, 159] -> "␣‹f0 9f›". */
function bytesLabel(bytes) {
  let text = "", run = [], valid = true;
  const flush = () => {
    if (run.length) text += `‹${hexBytes(run)}›`;
    run = [];
  };
  for (let i = 0; i < bytes.length;) {
    const n = utf8Length(bytes, i);
    if (n) {
      flush();
      text += showWhitespace(STRICT_UTF8.decode(Uint8Array.from(bytes.slice(i, i + n))));
      i += n;
    } else {
      run.push(bytes[i]);
      valid = false;
      i += 1;
    }
  }
  flush();
  return { text, valid };
}

/** A coloured token span; k picks the colour, so neighbours always differ. */
function tokenSpan(text, k, { valid = true, special = false } = {}) {
  const classes = ["tfw-token"];
  if (!valid) classes.push("tfw-partial");
  if (special) classes.push("tfw-special");
  const span = el("span", { class: classes.join(" ") }, text);
  span.style.background = TOKEN_COLORS[k % TOKEN_COLORS.length];
  return span;
}

/** A root element with the token styles next to the shared ones. */
function tokenRoot(element, className) {
  const node = root(element, className);
  node.append(el("style", {}, TOKEN_STYLE));
  return node;
}
