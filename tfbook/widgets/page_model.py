"""The model in the reader's browser: a small tfbook GPT and its tokenizer as a page payload.

    export_page_model(model, tokenizer, "float16")  ->  {"config", "weights", "tokenizer"}
    static/gpt.js: new PageGPT(payload)  ->  the same forward pass, in plain JavaScript

The payload is JSON. Each weight is the base64 of a little-endian typed array, in the layout
torch keeps (a linear layer's weight is (out, in), so one output is one contiguous row):

    float32   4 bytes a number, exact
    float16   2 bytes a number (IEEE half); a matrix entry beyond 65,504 is an error
    int8      1 byte a number plus one float32 scale per row: w = q * scale, with
              scale = max |row| / 127 and q = round(w / scale) in [-127, 127]

Only matrices are quantised; vectors (biases, LayerNorm gains) stay float32: they are about
1% of the numbers and set the scale of everything after them. The tied output layer is the
token embedding, stored once. With float16 or int8 weights the page computes the model
whose weights are the de-quantised ones, `quantised_reference(model, dtype)`, in float32:
that model is the reference the page is tested against.

The tokenizer travels as what `encode` needs: tfbook's byte-level BPE (`BPETokenizer`; no
merges is plain bytes) as its byte ids, its merges in rank order and its split pattern in
JavaScript's syntax. JavaScript's regular expressions have no possessive quantifiers and
their Unicode tables are the browser's, so the known patterns (GPT-2's, GPT-4's) are written
out for JavaScript, with the letter, number and space classes spelled as the code point
ranges Python's `regex` uses: the page splits exactly as Python does, in any browser.
Shape legend: C model width, V vocab, F feed-forward width, T context length.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import regex
import torch
from torch import Tensor

from tfbook.models.gpt import GPT
from tfbook.quantize import int8_dequantise, int8_per_channel
from tfbook.tokenizers.base import Tokenizer
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.tokenizers.pretokenize import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN

FORMAT = "tfbook-page-gpt"
VERSION = 1
DTYPES = ("float32", "float16", "int8")
ACTIVATIONS = ("gelu_tanh", "gelu")  # what gpt.js computes
FLOAT16_MAX = 65504.0

# The split patterns gpt.js knows, in JavaScript's syntax (flag "u"). {L}, {N} and {WS} stand
# for the members of Python's \p{L}, \p{N} and \s, written as code point ranges; [^{WS}] is
# \S. A possessive quantifier (x++) never gives back what it took; in these patterns giving
# back could not lead to another match, so the plain greedy x+ matches the same chunks.
# (?i:s) also matches the long s, U+017F, in both languages.
JS_SPLIT_PATTERNS = {
    GPT2_SPLIT_PATTERN: (
        r"'(?:[sdmt]|ll|ve|re)| ?[{L}]+| ?[{N}]+| ?[^{WS}{L}{N}]+|[{WS}]+$|[{WS}]+(?![^{WS}])"
        r"|[{WS}]"
    ),
    GPT4_SPLIT_PATTERN: (
        r"'(?:[sSſdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n{L}{N}]?[{L}]+|[{N}]{1,3}"
        r"| ?[^{WS}{L}{N}]+[\r\n]*|[{WS}]+$|[{WS}]*[\r\n]|[{WS}]+(?![^{WS}])|[{WS}]"
    ),
}
CHARACTER_CLASSES = {"L": r"\p{L}", "N": r"\p{N}", "WS": r"\s"}


def check_page_model(model: GPT) -> None:
    """Raise a clear error unless `model` is a GPT that gpt.js can run: learned positions,
    LayerNorm, a GELU MLP, every head with its own keys and values, the head tied."""
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a tfbook GPT (tfbook.models.gpt.GPT), got "
                        f"{type(model).__name__}")
    config = model.config
    wanted = {"position": "learned", "norm": "layer", "ffn": "mlp", "tie_weights": True}
    for field, value in wanted.items():
        if getattr(config, field) != value:
            raise ValueError(f"the page runs GPTs with position='learned', norm='layer', "
                             f"ffn='mlp' and tie_weights=True; this GPTConfig has "
                             f"{field}={getattr(config, field)!r}")
    if config.activation not in ACTIVATIONS:
        raise ValueError(f"the page runs GPTs whose activation is one of {ACTIVATIONS}, got "
                         f"activation={config.activation!r}")
    if config.n_kv_heads not in (None, config.n_heads):
        raise ValueError(f"the page runs plain multi-head attention (n_kv_heads=None), got "
                         f"n_kv_heads={config.n_kv_heads} for n_heads={config.n_heads}")
    if model.lm_head.weight is not model.tok_emb.weight:
        raise ValueError("the model's lm_head.weight is not its tok_emb.weight: the page "
                         "needs the output layer tied to the token embedding")


def check_dtype(dtype: object) -> str:
    """The storage type of the matrices: one of DTYPES."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return dtype


def page_parameters(model: GPT) -> dict[str, Tensor]:
    """The tensors the page needs, by their torch names: the state dict without the tied
    lm_head.weight (it is tok_emb.weight)."""
    check_page_model(model)
    return {name: tensor.detach().to("cpu", torch.float32)
            for name, tensor in model.state_dict().items() if name != "lm_head.weight"}


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(array.tobytes()).decode("ascii")


def quantise(name: str, weight: Tensor, dtype: str) -> dict[str, Any]:
    """One tensor as a payload entry {shape, dtype, data[, scale]}; vectors stay float32.

    int8, per row r of a matrix: tfbook.quantize.int8_per_channel, the absmax rule with one
    block a row, scale_r = max_c |w_rc| / 127, q_rc = round(w_rc / scale_r) (a row of zeros:
    scale 1, q 0).
    """
    check_dtype(dtype)
    if not isinstance(weight, Tensor) or not weight.is_floating_point() or not (
            1 <= weight.dim() <= 2):
        got = (f"a {weight.dtype} tensor of shape {tuple(weight.shape)}"
               if isinstance(weight, Tensor) else type(weight).__name__)
        raise TypeError(f"weight {name} must be a floating tensor, a vector or a matrix, got "
                        f"{got}")
    if not bool(torch.isfinite(weight).all()):
        raise ValueError(f"weight {name} holds NaN or infinite values: the page cannot run it")
    w = weight.detach().to("cpu", torch.float32).numpy().astype("<f4")
    stored = dtype if w.ndim == 2 else "float32"
    entry: dict[str, Any] = {"shape": list(w.shape), "dtype": stored}
    if stored == "float32":
        entry["data"] = _b64(w)
    elif stored == "float16":
        if float(np.abs(w).max()) > FLOAT16_MAX:
            raise ValueError(f"weight {name} has an entry of size {float(np.abs(w).max()):.4g}, "
                             f"beyond float16's largest {FLOAT16_MAX:g}: use dtype 'float32'")
        entry["data"] = _b64(w.astype("<f2"))
    else:  # int8
        q, scale = int8_per_channel(torch.from_numpy(w))  # (rows, cols) in [-127, 127], (rows,)
        entry["data"] = _b64(q.numpy().astype("i1"))
        entry["scale"] = _b64(scale.numpy().astype("<f4"))
    return entry


def entry_shape(name: str, entry: object) -> list[int]:
    """A payload entry's shape, checked: one or two positive ints (a vector or a matrix)."""
    shape = entry.get("shape") if isinstance(entry, dict) else None
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 2 or any(
            not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in shape)):
        raise ValueError(f"weight {name}: expected a shape of one or two positive ints (a "
                         f"vector or a matrix), got {shape!r:.60}")
    return shape


def dequantise(name: str, entry: dict[str, Any]) -> Tensor:
    """A payload entry back to a float32 tensor, computed as gpt.js computes it (q * scale
    rounded once to float32); a malformed entry is a ValueError naming the weight."""
    shape = entry_shape(name, entry)
    try:
        stored = entry["dtype"]
        data = base64.b64decode(entry["data"], validate=True)
        kind = {"float32": "<f4", "float16": "<f2", "int8": "i1"}[stored]
        values = np.frombuffer(data, dtype=kind).reshape(shape)
        if stored == "int8":
            scale = np.frombuffer(base64.b64decode(entry["scale"], validate=True), dtype="<f4")
            values = int8_dequantise(torch.from_numpy(values.copy()).reshape(shape[0], -1),
                                     torch.from_numpy(scale.copy())).numpy().reshape(shape)
        values = values.astype("<f4")
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"weight {name}: expected an entry {{shape, dtype in {DTYPES}, data"
                         f" (base64)[, scale]}} whose data fills the shape, got an error: "
                         f"{error}") from None
    return torch.from_numpy(np.ascontiguousarray(values))


def page_weights(payload: dict[str, Any]) -> dict[str, Tensor]:
    """The weights a payload holds, decoded as the page decodes them: name -> float32 tensor."""
    check_payload(payload)
    return {name: dequantise(name, entry) for name, entry in payload["weights"].items()}


def check_payload(payload: object) -> None:
    """A payload of export_page_model: its format, a config, and exactly the weights that
    config needs, each of the shape it needs (the data itself is checked when decoded)."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"expected a payload of export_page_model (format {FORMAT!r}), got "
                         f"{type(payload).__name__}")
    expected = page_shapes(payload.get("config"))
    weights = payload.get("weights")
    if not isinstance(weights, dict) or set(weights) != set(expected):
        names = sorted(weights) if isinstance(weights, dict) else weights
        raise ValueError(f"the payload's weights must be exactly {sorted(expected)} for its "
                         f"config, got {names!r:.300}")
    for name, entry in weights.items():
        shape = entry_shape(name, entry)
        if shape != expected[name]:
            raise ValueError(f"weight {name}: its config needs shape {expected[name]}, the "
                             f"payload says {shape!r:.60}")


def page_shapes(config: object) -> dict[str, list[int]]:
    """The names and shapes of the weights a payload config needs (C width, T context, V
    vocab, F feed-forward width), as gpt.js reads them."""
    fields = {"d_model", "n_heads", "n_layers", "d_ff", "max_len", "vocab_size"}
    if not isinstance(config, dict) or any(
            not isinstance(config.get(f), int) or isinstance(config.get(f), bool)
            or config[f] < 1 for f in fields):
        raise ValueError(f"a payload config needs positive ints {sorted(fields)}, got "
                         f"{config!r:.200}")
    C, T, V, F = config["d_model"], config["max_len"], config["vocab_size"], config["d_ff"]
    linear = {  # name -> (out, in)
        **{f"attn.{p}": (C, C) for p in ("q_proj", "k_proj", "v_proj", "out_proj")},
        "ff.fc_in": (F, C), "ff.fc_out": (C, F)}
    bias = config.get("bias", True)  # False: no linear or LayerNorm biases
    if not isinstance(bias, bool):
        raise ValueError(f"a payload config's bias must be true or false, got {bias!r:.40}")
    shapes = {"tok_emb.weight": [V, C], "pos_emb.weight": [T, C], "norm_f.weight": [C]}
    if bias:
        shapes["norm_f.bias"] = [C]
    for layer in range(config["n_layers"]):
        p = f"blocks.{layer}."
        for name, shape in {**linear, "norm1": (C,), "norm2": (C,)}.items():
            shapes[p + name + ".weight"] = list(shape)
            if bias:
                shapes[p + name + ".bias"] = [shape[0]]
    return shapes


def quantised_reference(model: GPT, dtype: str = "float16") -> GPT:
    """A copy of `model` whose weights are the ones the page computes with (quantised to
    `dtype`, then back to float32): the reference of the page's parity tests."""
    check_page_model(model)
    check_dtype(dtype)
    weights = {name: dequantise(name, quantise(name, w, dtype))
               for name, w in page_parameters(model).items()}
    reference = copy.deepcopy(model).to("cpu", torch.float32).eval()  # the tie survives
    missing, unexpected = reference.load_state_dict(weights, strict=False)
    if missing != ["lm_head.weight"] or unexpected:  # the head is tok_emb.weight, loaded
        raise ValueError(f"the model's weights are not the page's: missing {missing}, "
                         f"unexpected {unexpected}")
    return reference


@functools.cache
def code_point_ranges(pattern: str) -> str:
    """The members of a one-character class of Python's `regex`, as the inside of a
    JavaScript class: r"\\s" -> r"\\u{9}-\\u{d}\\u{20}\\u{85}..." (surrogates excluded)."""
    member = regex.compile(pattern).fullmatch
    ranges: list[list[int]] = []
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF or not member(chr(c)):
            continue
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return "".join(f"\\u{{{a:x}}}" + (f"-\\u{{{b:x}}}" if b > a else "") for a, b in ranges)


def page_tokenizer(tokenizer: BPETokenizer) -> dict[str, Any]:
    """What gpt.js needs to encode like `tokenizer.encode_ordinary` and to show tokens: byte
    ids, merges as [left, right, left, right, ...] in rank order (pair k makes id 256 + k),
    the split pattern for JavaScript with its classes, and the special tokens (shown only)."""
    if not isinstance(tokenizer, BPETokenizer):
        raise TypeError(f"tokenizer must be a tfbook BPETokenizer (byte-level BPE; "
                        f"BPETokenizer({{}}) for plain bytes), got {type(tokenizer).__name__}")
    pattern = tokenizer.pattern
    if pattern is not None and pattern not in JS_SPLIT_PATTERNS:
        raise ValueError(f"the page knows the split patterns of GPT-2 and GPT-4 (or None) in "
                         f"JavaScript, got {pattern!r:.80}")
    merges = [0] * (2 * len(tokenizer.merges))
    for (left, right), new_id in tokenizer.merges.items():
        merges[2 * (new_id - 256)], merges[2 * (new_id - 256) + 1] = left, right
    split = None
    if pattern is not None:
        split = {"python": pattern, "source": JS_SPLIT_PATTERNS[pattern],
                 "classes": {name: code_point_ranges(p) for name, p in CHARACTER_CLASSES.items()}}
    return {"kind": "bpe", "byte_ids": list(tokenizer.byte_ids), "merges": merges,
            "split": split, "special_tokens": dict(tokenizer.special_tokens),
            "vocab_size": tokenizer.vocab_size}


def token_label(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as text for display, as the page shows it (gpt.js `tokenText`): whole UTF-8
    characters as text, bytes that are only a piece of a character in hex between ‹ ›.

    >>> token_label(BPETokenizer({}), 0xF0)  # the first byte of a 4-byte character
    '‹f0›'
    """
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a tfbook tokenizer (tfbook.tokenizers), got "
                        f"{type(tokenizer).__name__}")
    if isinstance(token_id, bool) or not isinstance(token_id, int | np.integer) or not (
            0 <= token_id < tokenizer.vocab_size):
        raise ValueError(f"token_id must be an int in [0, {tokenizer.vocab_size}) (the "
                         f"tokenizer's vocab_size), got {token_id!r:.40}")
    data = tokenizer.decode_bytes([token_id])
    text, piece, i = [], [], 0
    while i < len(data):
        lead = data[i]
        n = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else (
            4 if lead >> 3 == 30 else 0)
        try:
            character = data[i:i + n].decode("utf-8") if n and i + n <= len(data) else None
        except UnicodeDecodeError:
            character = None  # bad continuation bytes, overlong form, surrogate
        if character is None:
            piece.append(data[i])
            i += 1
            continue
        if piece:
            text.append("‹" + " ".join(f"{b:02x}" for b in piece) + "›")
            piece = []
        text.append(character)
        i += n
    if piece:
        text.append("‹" + " ".join(f"{b:02x}" for b in piece) + "›")
    return "".join(text)


def export_page_model(model: GPT, tokenizer: BPETokenizer, dtype: str = "float16") -> dict:
    """A GPT and its tokenizer as a JSON-ready payload for static/gpt.js (see the module)."""
    check_page_model(model)
    check_dtype(dtype)
    config = model.config
    tokens = page_tokenizer(tokenizer)
    if tokens["vocab_size"] > config.vocab_size:
        raise ValueError(f"the tokenizer makes ids up to {tokens['vocab_size'] - 1}, beyond the "
                         f"model's vocab_size {config.vocab_size}")
    if tokens["vocab_size"] < config.vocab_size:  # a vocabulary padded (e.g. to a multiple of 64)
        raise ValueError(f"the model's vocab_size is {config.vocab_size} but its tokenizer has "
                         f"{tokens['vocab_size']} tokens: the page's sampler could draw one of "
                         f"the {config.vocab_size - tokens['vocab_size']} ids no text belongs "
                         f"to; export a model whose vocab_size equals the tokenizer's")
    d_ff = config.block_config().d_ff
    return {
        "format": FORMAT, "version": VERSION, "dtype": dtype,
        "config": {"d_model": config.d_model, "n_heads": config.n_heads,
                   "n_layers": config.n_layers, "d_ff": d_ff, "max_len": config.max_len,
                   "vocab_size": config.vocab_size, "norm_eps": config.norm_eps,
                   "activation": config.activation, "bias": config.bias},
        "weights": {name: quantise(name, w, dtype)
                    for name, w in page_parameters(model).items()},
        "tokenizer": tokens,
    }


def payload_json(payload: dict[str, Any]) -> str:
    """The payload as compact JSON without a raw "<" (written as \\u003c), so that it can sit
    inside a <script> element of a page."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")


def payload_bytes(payload: dict[str, Any]) -> int:
    """The size of `payload_json(payload)` in UTF-8 bytes: what the page downloads."""
    return len(payload_json(payload).encode("utf-8"))


GPT_JS = Path(__file__).resolve().parent / "static" / "gpt.js"
MAX_PAGE_MODEL_BYTES = 3_000_000  # the budget of model data in one page


def estimated_payload_bytes(model: GPT, dtype: str) -> int:
    """The bytes of the weights in the payload, from the parameter counts alone (before any
    encoding): base64 of 4, 2 or 1 bytes a number (matrices; vectors stay float32), plus a
    float32 scale per row of an int8 matrix. A lower bound of payload_bytes."""
    check_page_model(model)
    check_dtype(dtype)
    width = {"float32": 4, "float16": 2, "int8": 1}[dtype]
    total = 0
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied: it is tok_emb.weight
        if tensor.dim() == 2:
            total += 4 * -(-tensor.numel() * width // 3)  # base64: 4 characters per 3 bytes
            if dtype == "int8":
                total += 4 * -(-tensor.shape[0] * 4 // 3)
        else:
            total += 4 * -(-tensor.numel() * 4 // 3)
    return total


def page_payload(model: GPT, tokenizer: BPETokenizer, dtype: str = "float16") -> dict:
    """export_page_model, refused with a clear error when it exceeds the page's budget: from
    the parameter count before anything is encoded, then from the payload's real size."""
    check_page_model(model)
    check_dtype(dtype)
    estimate = estimated_payload_bytes(model, dtype)
    if estimate > MAX_PAGE_MODEL_BYTES:
        raise ValueError(f"the page model takes at least {estimate:,} bytes in {dtype}, more "
                         f"than the {MAX_PAGE_MODEL_BYTES:,} a page may hold: "
                         f"{_budget_advice(model, dtype)}")
    payload = export_page_model(model, tokenizer, dtype)
    size = payload_bytes(payload)
    if size > MAX_PAGE_MODEL_BYTES:
        raise ValueError(f"the page model takes {size:,} bytes in {dtype}, more than the "
                         f"{MAX_PAGE_MODEL_BYTES:,} a page may hold: "
                         f"{_budget_advice(model, dtype)}")
    return payload


def _budget_advice(model: GPT, dtype: str) -> str:
    """What would fit: a smaller storage type if one does, else a smaller model."""
    for smaller in DTYPES[DTYPES.index(dtype) + 1:]:
        if estimated_payload_bytes(model, smaller) <= MAX_PAGE_MODEL_BYTES:
            return f"dtype {smaller!r} would take about " \
                   f"{estimated_payload_bytes(model, smaller):,}"
    return ("no storage type fits it (int8 takes about "
            f"{estimated_payload_bytes(model, 'int8'):,}): use a smaller model (fewer or "
            "narrower layers, a smaller vocabulary)")


def gpt_js_script_safe() -> str:
    """static/gpt.js made safe to sit in a widget's module in the saved page: "<" before
    "!--", "script" or "/script" becomes \\x3C, which reads as "<" in a string or a regular
    expression and is inert in a comment, the only places such text can be."""
    return re.sub(r"<(?=!--|/?script)", r"\\x3C", GPT_JS.read_text(encoding="utf-8"),
                  flags=re.IGNORECASE)
# gpt.js declares its names at the top of a classic script; Node runs it the same way (vm)
NODE_RUNNER = r"""
const fs = require("fs"), vm = require("vm");
vm.runInThisContext(fs.readFileSync(process.argv[1], "utf8") + "\nglobalThis.PageGPT = PageGPT;");
const { payload, text } = JSON.parse(fs.readFileSync(0, "utf8"));
const model = new PageGPT(payload);
const ids = model.tokenizer.encode(text);
const out = model.forward(ids, { needWeights: true });
// the CPU time of one forward (this process's, user + system: other programs on a loaded
// machine do not count); two of each kind to warm the compiler up, then 9 alternated; the
// fastest kept (what disturbs a run only ever adds time)
const time = (options) => {
  const start = process.cpuUsage();
  model.forward(ids, options);
  const used = process.cpuUsage(start);
  return (used.user + used.system) / 1000;
};
const full = [], last = [];
for (let i = 0; i < 11; i++) {
  const f = time({}), l = time({ lastOnly: true });
  if (i >= 2) { full.push(f); last.push(l); }
}
process.stdout.write(JSON.stringify({
  ids, logits: Array.from(out.logits), attentions: out.attentions.map((a) => Array.from(a)),
  ms: Math.min(...full), ms_last_only: Math.min(...last),
}));
"""


def run_in_node(payload: dict[str, Any], text: str) -> dict[str, Any]:
    """The page's computation outside a browser: static/gpt.js run by Node.js (V8, the engine
    of Chromium) on `text`. -> {"ids": [...], "logits": (T, V), "attentions": per block
    (H, T, T), "ms": the CPU time of a forward (the fastest of 9, after 2 to warm up),
    "ms_last_only": of a forward that computes the output layer for the last position only},
    for comparing with PyTorch in a notebook."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty str, got {text!r:.60}")
    check_payload(payload)  # a payload of export_page_model, before Node.js reads it
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("run_in_node needs Node.js (apt-get install nodejs), not found")
    done = subprocess.run([node, "-e", NODE_RUNNER, str(GPT_JS)], capture_output=True,
                          input=json.dumps({"payload": payload, "text": text}), text=True,
                          encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"gpt.js failed in Node.js: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout)
    T, config = len(out["ids"]), payload["config"]
    H = config["n_heads"]
    return {
        "ids": out["ids"],
        "logits": torch.tensor(out["logits"]).view(T, config["vocab_size"]),  # (T, V)
        "attentions": [torch.tensor(a).view(H, T, T) for a in out["attentions"]],  # (H, T, T)
        "ms": out["ms"], "ms_last_only": out["ms_last_only"],
    }
