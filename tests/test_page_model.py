"""The model in the reader's browser (tfbook/widgets/page_model.py and static/gpt.js).

Python: the payload decodes to the model's weights (exactly, or quantised as float16 / int8
computes it independently here), `quantised_reference` holds those weights, bad models and
tokenizers are clear errors, the JavaScript split patterns split as Python's, the payload of
the book's model size fits the page budget. Chromium: on a random GPT with a fixed seed, the
page's token ids equal the tokenizer's, its logits and attention weights equal PyTorch's
(the de-quantised model in float32), its cached generation equals the uncached forward and
tfbook's generate, its sampler keeps what filter_logits keeps, and its speed is measured;
hostile text stays text.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import regex
import torch
from playwright.sync_api import expect

from tests.browser import main_thread_cpu, serve, watch
from tfbook.generate.sampling import filter_logits, kept_distribution
from tfbook.generate.search import generate
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.tokenizers.pretokenize import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN
from tfbook.tokenizers.wordpiece import WordPieceTokenizer
from tfbook.widgets.base import STATIC
from tfbook.widgets.page_model import (
    JS_SPLIT_PATTERNS,
    code_point_ranges,
    estimated_payload_bytes,
    export_page_model,
    page_parameters,
    page_tokenizer,
    page_weights,
    payload_bytes,
    payload_json,
    quantise,
    quantised_reference,
    run_in_node,
    token_label,
)

HARNESS = Path(__file__).resolve().parent / "data" / "page_model.html"
HOSTILE = "</script><img src=x onerror=alert(1)>"
# The tokenizer learns from this text, so its merges hold pieces of multi-byte characters.
TRAINING_TEXT = (
    "The model reads the text. It's the model's text; they'll see what we've done. "
    "Café crème brûlée, naïve façade, Ærøskøbing. 中文分词测试：你好，世界。日本語のテキスト。 "
    "Emoji: 😀👍🏽 👨‍👩‍👧 🇫🇷. Numbers 12345 and 3.14159, ½ ² ٣. def f(x):\n    return x + 1\n\n"
)
PROMPTS = [
    "Hello, world!",
    "Café crème brûlée, naïve façade",
    "中文分词测试：你好，世界。",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧 🇫🇷",
    "it's 'LL 'ſ 'Re 'VE don't 'S",
    "tabs\tand  spaces \n\n  new\r\nlines \u00a0\u2003\u3000 \u0085end   ",
    HOSTILE,
    "12345 67 8.9e10 ½ ² ٣ 𝟙𝟚 Ⅻ",
    "x",
]
MAX_LEN = 64  # T of the test models, as the book's page model


def tokenizer(pattern: str | None = GPT4_SPLIT_PATTERN, vocab_size: int = 320) -> BPETokenizer:
    """A byte-level BPE trained on the multilingual text (no merges at vocab_size 256)."""
    if vocab_size == 256:
        return BPETokenizer({}, pattern)
    return BPETokenizer.train(TRAINING_TEXT * 3, vocab_size, pattern, keep_trace=False)


def random_gpt(vocab_size: int, seed: int = 0, **changes) -> GPT:
    """A GPT with random weights large enough that every layer matters (std 0.2, norm gains
    1 +- 0.1): parity on the N(0, 0.02) initialisation would compare numbers near zero."""
    config = replace(GPTConfig.tiny(), vocab_size=vocab_size, max_len=MAX_LEN, **changes)
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_gain = "norm" in name and name.endswith("weight")
            p.copy_(1 + 0.1 * torch.randn_like(p) if is_gain else 0.2 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return tokenizer()


@pytest.fixture(scope="module")
def model(bpe: BPETokenizer) -> GPT:
    return random_gpt(bpe.vocab_size)


def book_sized_tokenizer() -> BPETokenizer:
    """A BPE of the book's page model's size (V = 2048, GPT-4's split pattern); its merges
    are arbitrary (pair k is (k // 256, k % 256)): only their number matters here."""
    merges = {(k // 256, k % 256): 256 + k for k in range(2048 - 256)}
    return BPETokenizer(merges, GPT4_SPLIT_PATTERN)


# --- Python: the payload ------------------------------------------------------------------


def int8_rows(w: torch.Tensor) -> torch.Tensor:
    """Per-row symmetric int8, de-quantised, computed here with torch alone."""
    scale = w.abs().amax(dim=1, keepdim=True) / 127  # (rows, 1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(w / scale).clamp(-127, 127) * scale


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_the_payload_decodes_to_the_weights(model: GPT, bpe: BPETokenizer, dtype: str) -> None:
    payload = json.loads(payload_json(export_page_model(model, bpe, dtype)))  # through JSON
    decoded = page_weights(payload)
    state = model.state_dict()
    assert set(decoded) == set(state) - {"lm_head.weight"}  # the tied head is stored once
    for name, w in decoded.items():
        original = state[name]
        if original.dim() == 1 or dtype == "float32":
            expected = original  # vectors always float32
        elif dtype == "float16":
            expected = original.half().float()
        else:
            expected = int8_rows(original)
            step = original.abs().amax(dim=1, keepdim=True) / 127  # (rows, 1)
            assert bool(((w - original).abs() <= step / 2 + 1e-7).all()), name
        assert w.shape == original.shape and w.dtype == torch.float32
        assert torch.equal(w, expected), name
    assert payload["config"] == {
        "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 256, "max_len": MAX_LEN,
        "vocab_size": bpe.vocab_size, "norm_eps": 1e-5, "activation": "gelu_tanh",
        "bias": True,
    }


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_quantised_reference_holds_the_decoded_weights(model: GPT, bpe: BPETokenizer,
                                                       dtype: str) -> None:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reference = quantised_reference(model, dtype)
    decoded = page_weights(export_page_model(model, bpe, dtype))
    state = reference.state_dict()
    for name, w in decoded.items():
        assert torch.equal(state[name], w), name
    assert reference.lm_head.weight is reference.tok_emb.weight
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    changed = not torch.equal(state["tok_emb.weight"], before["tok_emb.weight"])
    assert changed == (dtype != "float32")


def test_the_tokenizer_payload(bpe: BPETokenizer) -> None:
    spec = page_tokenizer(bpe)
    merges = spec["merges"]
    assert len(merges) == 2 * (bpe.vocab_size - 256)
    assert {(merges[2 * k], merges[2 * k + 1]): 256 + k for k in range(len(merges) // 2)} == (
        bpe.merges)
    assert spec["byte_ids"] == list(range(256)) and spec["split"]["python"] == GPT4_SPLIT_PATTERN
    assert page_tokenizer(tokenizer(None, 256))["split"] is None


def python_syntax(source: str, classes: dict[str, str]) -> str:
    """The JavaScript split pattern in the syntax of Python's regex (\\u{X} -> \\UXXXXXXXX)."""
    filled = regex.sub(r"\{(L|N|WS)\}", lambda m: classes[m.group(1)], source)
    return regex.sub(r"\\u\{([0-9a-f]+)\}", lambda m: f"\\U{int(m.group(1), 16):08x}", filled)


@pytest.mark.parametrize("pattern", [GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN])
def test_the_javascript_patterns_split_as_python(pattern: str) -> None:
    """Read back in Python, the JavaScript pattern (greedy quantifiers, explicit classes) cuts
    text into the chunks of the original (possessive quantifiers, \\p classes)."""
    spec = page_tokenizer(BPETokenizer({}, pattern))["split"]
    assert spec["source"] == JS_SPLIT_PATTERNS[pattern]
    rewritten = regex.compile(python_syntax(spec["source"], spec["classes"]))
    original = regex.compile(pattern)
    edge = ["   ", " \n", "a \n", "x  \n\n y", "'S'Ll'VE'ſ", "a!!\n\nb", "1234567", "  end  "]
    for text in [*PROMPTS, TRAINING_TEXT, *edge]:
        assert rewritten.findall(text) == original.findall(text), text


def test_character_classes_are_pythons() -> None:
    spaces = code_point_ranges(r"\s")
    members = [chr(c) for c in range(0x3001) if regex.fullmatch(rf"[{python_syntax(spaces, {})}]",
                                                                 chr(c))]
    assert members == [chr(c) for c in range(0x3001) if regex.fullmatch(r"\s", chr(c))]
    assert "\\u{85}" in spaces and "\\u{feff}" not in spaces  # NEL is, BOM is not (unlike JS)


def test_payload_size_of_the_book_model() -> None:
    """The book's page model, 2 layers x 64 wide x 4 heads, V = 2048: its payload in each
    dtype for contexts of 64 and 256, within the 3 MB a page may spend."""
    sizes = {}
    for max_len in (64, 256):
        config = replace(GPTConfig.tiny(), vocab_size=2048, max_len=max_len)
        torch.manual_seed(0)
        gpt = GPT(config)
        n = sum(p.numel() for p in gpt.parameters())  # tied head counted once
        for dtype in ("float32", "float16", "int8"):
            sizes[max_len, dtype] = payload_bytes(export_page_model(gpt, book_sized_tokenizer(),
                                                                    dtype))
        print(f"\nmax_len {max_len}, {n:,} parameters: " + ", ".join(
            f"{d} {sizes[max_len, d] / 1e6:.3f} MB" for d in ("float32", "float16", "int8")))
        # base64 (4/3) of 4, 2 or about 1 byte per parameter, plus the tokenizer (~30 kB)
        assert 4 / 3 * 4 * n < sizes[max_len, "float32"] < 4 / 3 * 4 * n + 60_000
        assert sizes[max_len, "int8"] < sizes[max_len, "float16"] < sizes[max_len, "float32"]
        assert sizes[max_len, "float16"] <= 3_000_000


def test_payload_json_has_no_raw_less_than_sign(bpe: BPETokenizer) -> None:
    special = BPETokenizer(bpe.merges, GPT4_SPLIT_PATTERN, {"<|endoftext|>": bpe.vocab_size})
    payload = export_page_model(random_gpt(bpe.vocab_size + 1), special, "int8")
    text = payload_json(payload)
    assert "<" not in text
    assert json.loads(text)["tokenizer"]["special_tokens"] == {"<|endoftext|>": bpe.vocab_size}


@pytest.mark.parametrize("change, message", [
    ({"position": "rope"}, "position='rope'"),
    ({"norm": "rms"}, "norm='rms'"),
    ({"ffn": "swiglu", "activation": "silu"}, "ffn='swiglu'"),
    ({"tie_weights": False}, "tie_weights=False"),
    ({"activation": "relu"}, "activation='relu'"),
    ({"n_kv_heads": 2}, "n_kv_heads=2 for n_heads=4"),
])
def test_models_the_page_cannot_run_are_clear_errors(bpe: BPETokenizer, change: dict,
                                                      message: str) -> None:
    gpt = random_gpt(bpe.vocab_size, **change)
    with pytest.raises(ValueError, match=regex.escape(message)):
        export_page_model(gpt, bpe)
    with pytest.raises(ValueError, match=regex.escape(message)):
        quantised_reference(gpt)


def test_bad_arguments_are_clear_errors(model: GPT, bpe: BPETokenizer) -> None:
    with pytest.raises(TypeError, match="model must be a tfbook GPT .* got Linear"):
        export_page_model(torch.nn.Linear(2, 2), bpe)
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'float16', "
                                         r"'int8'\), got 'bfloat16'"):
        export_page_model(model, bpe, "bfloat16")
    with pytest.raises(TypeError, match="tokenizer must be a tfbook BPETokenizer .* got str"):
        export_page_model(model, "bytes")
    wordpiece = WordPieceTokenizer(["[UNK]", "a"])
    with pytest.raises(TypeError, match="got WordPieceTokenizer"):
        export_page_model(model, wordpiece)
    with pytest.raises(ValueError, match="split patterns of GPT-2 and GPT-4"):
        export_page_model(model, BPETokenizer({}, r"\w+|\W"))
    with pytest.raises(ValueError, match="ids up to 319, beyond the model's vocab_size 300"):
        export_page_model(random_gpt(300), bpe)
    untied = random_gpt(bpe.vocab_size)
    untied.lm_head.weight = torch.nn.Parameter(untied.tok_emb.weight.clone())
    with pytest.raises(ValueError, match="lm_head.weight is not its tok_emb.weight"):
        export_page_model(untied, bpe)
    big = random_gpt(bpe.vocab_size)
    with torch.no_grad():
        big.blocks[1].ff.fc_in.weight[3, 5] = 70000.0
    assert export_page_model(big, bpe, "int8")["dtype"] == "int8"  # int8 scales it
    with pytest.raises(ValueError, match="blocks.1.ff.fc_in.weight has an entry of size 7e"
                                         "[+]04, beyond float16's largest 65504"):
        export_page_model(big, bpe, "float16")
    with pytest.raises(ValueError, match="weight w holds NaN"):
        quantise("w", torch.tensor([[1.0, math.nan]]), "int8")
    payload = export_page_model(model, bpe, "int8")
    payload["weights"]["norm_f.bias"]["data"] = "AAAA"  # 3 bytes: not a float32
    with pytest.raises(ValueError, match="weight norm_f.bias: expected an entry"):
        page_weights(payload)
    with pytest.raises(ValueError, match="expected a payload of export_page_model"):
        page_weights({"weights": {}})


def test_the_helpers_check_their_arguments(model: GPT, bpe: BPETokenizer) -> None:
    w = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'float16', "
                                         r"'int8'\), got 'bfloat16'"):
        quantise("w", w, "bfloat16")  # never silently int8
    for bad, got in ((w.long(), "a torch.int64 tensor of shape \\(2, 3\\)"),
                     (torch.ones(2, 2, 2), "a torch.float32 tensor of shape \\(2, 2, 2\\)"),
                     ([[1.0]], "list")):
        with pytest.raises(TypeError, match=rf"weight w must be a floating tensor, a vector or a "
                                            rf"matrix, got {got}"):
            quantise("w", bad, "float32")
    for function in (page_parameters, lambda m: estimated_payload_bytes(m, "float16")):
        with pytest.raises(TypeError, match="model must be a tfbook GPT .* got NoneType"):
            function(None)
    for bad in (-1, bpe.vocab_size, 2.0, True, "a"):
        with pytest.raises(ValueError, match=rf"token_id must be an int in \[0, "
                                             rf"{bpe.vocab_size}\) \(the tokenizer's "
                                             rf"vocab_size\), got"):
            token_label(bpe, bad)
    with pytest.raises(TypeError, match=r"tokenizer must be a tfbook tokenizer "
                                        r"\(tfbook.tokenizers\), got NoneType"):
        token_label(None, 65)
    payload = export_page_model(model, bpe, "float32")
    payload["config"]["bias"] = "no"
    with pytest.raises(ValueError, match="a payload config's bias must be true or false, got "
                                         "'no'"):
        page_weights(payload)
    with pytest.raises(ValueError, match="expected a payload of export_page_model"):
        run_in_node({"format": "other"}, "hi")  # refused before Node.js starts


# --- Chromium: parity, speed, hostile text -------------------------------------------------

PAYLOADS = {  # file -> (how the model differs from the default random GPT, dtype)
    "payload.json": ({}, "float32"),
    "float16.json": ({}, "float16"),
    "int8.json": ({}, "int8"),
    "gelu_nobias.json": ({"activation": "gelu", "bias": False, "d_ff": 96}, "float32"),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory, model: GPT, bpe: BPETokenizer):
    """A folder with gpt.js, the test page and the payloads; yields (folder, references)."""
    folder = tmp_path_factory.mktemp("page_model")
    shutil.copy(STATIC / "gpt.js", folder / "gpt.js")
    shutil.copy(HARNESS, folder / "index.html")
    references = {}
    for name, (change, dtype) in PAYLOADS.items():
        gpt = random_gpt(bpe.vocab_size, seed=1, **change) if change else model
        (folder / name).write_text(payload_json(export_page_model(gpt, bpe, dtype)), "utf-8")
        references[name] = quantised_reference(gpt, dtype)
    for name, tok in {"gpt2.json": tokenizer(GPT2_SPLIT_PATTERN, 300),
                      "bytes.json": tokenizer(None, 256)}.items():
        (folder / name).write_text(json.dumps(page_tokenizer(tok)), "utf-8")
        references[name] = tok
    book = GPT(replace(GPTConfig.tiny(), vocab_size=2048))
    (folder / "book.json").write_text(payload_json(export_page_model(book, book_sized_tokenizer(),
                                                                     "float16")), "utf-8")
    return folder, references


@pytest.fixture(scope="module")
def page(browser, site):
    """The test page, open, with its model loaded; the log must stay clean."""
    folder, _ = site
    with serve(folder) as base_url:
        tab = browser.new_page()
        log = watch(tab, base_url)
        tab.goto(base_url + "index.html")
        tab.wait_for_function("window.pageModel !== undefined || window.pageModelError",
                              timeout=60000)
        assert tab.evaluate("window.pageModelError") is None
        yield tab
        tab.close()
        assert not (log.page_errors or log.console_errors or log.foreign_requests
                    or log.dialogs), log


FORWARD_JS = """async ([name, texts, maxLen]) => {
  const model = await loadModel(name);
  return texts.map((text) => {
    const ids = fitContext(model.tokenizer.encode(text), maxLen).ids;
    const out = model.forward(ids, { needWeights: true });
    return { ids, logits: Array.from(out.logits),
             attentions: out.attentions.map((a) => Array.from(a)) };
  });
}"""


def long_text() -> str:
    """More text than the context holds (the longest context: its last MAX_LEN tokens)."""
    return " ".join(PROMPTS) * 8


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_the_page_computes_what_pytorch_computes(page, site, bpe: BPETokenizer,
                                                 name: str) -> None:
    """For every prompt (non-ASCII, hostile, the full context; two of them for the other
    payloads): the page's ids are the tokenizer's, its weights the de-quantised ones, its
    logits within 1e-4 of the de-quantised PyTorch model, its attention weights within 1e-5."""
    _, references = site
    reference = references[name]
    texts = [*PROMPTS, long_text()] if name == "payload.json" else [PROMPTS[3], long_text()]
    results = page.evaluate(FORWARD_JS, [name, texts, MAX_LEN])
    worst_logit = worst_weight = 0.0
    for text, result in zip(texts, results, strict=True):
        ids = bpe.encode_ordinary(text)[-MAX_LEN:]  # the page keeps the last MAX_LEN
        assert result["ids"] == ids, text
        T = len(ids)
        with torch.no_grad():
            out = reference(torch.tensor([ids]), need_weights=True)
        logits = torch.tensor(result["logits"]).view(T, -1)  # (T, V)
        worst_logit = max(worst_logit, float((logits - out.logits[0]).abs().max()))
        for layer, weights in enumerate(result["attentions"]):
            expected = out.attentions[layer][0]  # (H, T, T)
            got = torch.tensor(weights).view(expected.shape)
            worst_weight = max(worst_weight, float((got - expected).abs().max()))
    assert len(results[-1]["ids"]) == MAX_LEN
    names = ["tok_emb.weight", "blocks.0.ff.fc_in.weight", "norm_f.weight"]
    decoded = page.evaluate("""async ([name, names]) => {
      const model = await loadModel(name);
      return names.map((n) => Array.from(model.weights[n]));
    }""", [name, names])
    state = reference.state_dict()  # the page decodes its weights to exactly these
    for weight_name, values in zip(names, decoded, strict=True):
        assert torch.equal(torch.tensor(values).view(state[weight_name].shape),
                           state[weight_name]), weight_name
    print(f"\n{name}: max |logit difference| {worst_logit:.2e}, "
          f"max |attention weight difference| {worst_weight:.2e}")
    assert worst_logit <= 1e-4 and worst_weight <= 1e-5


@pytest.mark.parametrize("name", ["payload.json", "gpt2.json", "bytes.json"])
def test_the_page_encodes_as_the_tokenizer(page, site, name: str) -> None:
    _, references = site
    tok = references[name] if name != "payload.json" else None
    script = """async ([name, texts]) => {
      const tokenizer = name === "payload.json" ? (await loadModel(name)).tokenizer
        : new PageTokenizer(await (await fetch(name)).json());
      return texts.map((t) => tokenizer.encode(t));
    }"""
    texts = [*PROMPTS, TRAINING_TEXT, long_text(), "", " ", "\n", "'s", "a" * 300]
    got = page.evaluate(script, [name, texts])
    tok = tok or tokenizer()
    assert got == [tok.encode_ordinary(t) for t in texts]
    decoded = page.evaluate("""async ([name, ids]) => {
      const tokenizer = (await loadModel(name)).tokenizer;
      return [tokenizer.decode(ids), ids.map((i) => tokenizer.tokenText(i))];
    }""", ["payload.json", tokenizer().encode_ordinary(PROMPTS[3])])
    assert decoded[0] == PROMPTS[3]
    bpe = tokenizer()
    assert decoded[1] == [token_label(bpe, i) for i in bpe.encode_ordinary(PROMPTS[3])]


GENERATE_JS = """async ([name, ids, settings]) => {
  const model = await loadModel(name);
  const run = model.generate(ids, settings);
  const all = ids.concat(run.tokens.slice(0, -1));  // every token that was fed to the model
  const uncached = [];
  for (let n = ids.length; n <= all.length; n++) {  // the last row of a full forward, no cache
    const out = model.forward(all.slice(0, n));
    uncached.push(Array.from(out.logits.subarray((n - 1) * out.V)));
  }
  return { tokens: run.tokens, stopped: run.stopped, uncached,
           logits: run.logits.map((l) => Array.from(l)) };
}"""


def test_cached_generation_equals_uncached_and_pytorch(page, site, bpe: BPETokenizer) -> None:
    """Greedy generation with the key/value cache: each step's logits equal a full forward's
    last row, and the tokens and logits equal tfbook's generate on the reference model; a
    prompt near the end of the context stops when the context is full."""
    _, references = site
    for name in ("payload.json", "int8.json"):
        for prompt, n_new in ((bpe.encode_ordinary(PROMPTS[1]), 12),
                              (bpe.encode_ordinary(long_text())[:MAX_LEN - 3], 10)):
            run = page.evaluate(GENERATE_JS, [name, prompt, {"maxNewTokens": n_new,
                                                             "temperature": 0}])
            n_done = min(n_new, MAX_LEN - len(prompt))
            assert len(run["tokens"]) == n_done
            assert run["stopped"] == ("context" if n_done < n_new else "max_new_tokens")
            cached, uncached = torch.tensor(run["logits"]), torch.tensor(run["uncached"])
            assert float((cached - uncached).abs().max()) <= 1e-5
            expected = generate(references[name], [prompt], n_done, temperature=0,
                                keep_logits=True)
            assert run["tokens"] == expected.new_tokens[0].tolist()
            assert float((cached - torch.cat(expected.logits)).abs().max()) <= 1e-4


SAMPLER_JS = """async ([name, ids, grid]) => {
  const model = await loadModel(name);
  const logits = model.forward(ids, { lastOnly: true }).logits;
  const filtered = grid.map(([t, k, p]) => Array.from(filterLogits(logits, t, k, p),
                                                      (s) => s !== -Infinity));
  const runs = grid.map(([t, k, p]) => [1, 1, 2].map((seed) => model.generate(ids,
    { maxNewTokens: 6, temperature: t, topK: k, topP: p, seed })));
  return { logits: Array.from(logits), filtered,
           runs: runs.map(([first, again, other]) => ({
             logits: first.logits.map((l) => Array.from(l)),
             tokens: [first.tokens, again.tokens, other.tokens] })) };
}"""


def test_the_sampler_keeps_what_python_keeps(page, bpe: BPETokenizer) -> None:
    """filterLogits keeps the set filter_logits keeps; a seed reproduces a generation, and
    every sampled token is one the Python sampler could have drawn at that step."""
    ids = bpe.encode_ordinary(PROMPTS[0])
    grid = [[t, k, p] for t in (0, 0.6, 1, 1.7) for k in (None, 1, 40)
            for p in (None, 0.3, 0.9, 1)]
    result = page.evaluate(SAMPLER_JS, ["payload.json", ids, grid])
    logits = torch.tensor(result["logits"])  # (V,)
    for (t, k, p), kept, runs in zip(grid, result["filtered"], result["runs"], strict=True):
        assert kept == (filter_logits(logits, t, k, p) > -math.inf).tolist(), (t, k, p)
        first, again, other = runs["tokens"]
        assert first == again, (t, k, p)  # the same seed, the same tokens
        probs = kept_distribution(torch.tensor(runs["logits"]), t, k, p)  # (steps, V)
        assert bool((probs[torch.arange(len(first)), first] > 0).all()), (t, k, p, first)
        if t == 0:
            assert other == first  # greedy draws no random number
    seeds_differ = any(r["tokens"][0] != r["tokens"][2] for r in result["runs"])
    assert seeds_differ  # some sampled setting reads its seed


def test_bad_input_in_the_page_is_a_clear_error(page) -> None:
    errors = page.evaluate("""async () => {
      const model = await loadModel("payload.json");
      const partial = await (await fetch("payload.json")).json();
      delete partial.weights["blocks.1.ff.fc_out.bias"];
      const attempts = [
        () => model.forward([]),
        () => model.forward(Array(65).fill(1)),
        () => model.forward([1, 1e6]),
        () => model.tokenizer.encode("ok \\uD800 no"),
        () => model.generate(Array(64).fill(1)),
        () => model.generate([1], { temperature: -1 }),
        () => model.generate([1], { temperature: 1, topK: 0 }),
        () => model.generate([1], { temperature: 1, topP: 0 }),
        () => new PageGPT({ format: "other" }),
        () => new PageGPT(partial),
      ];
      return attempts.map((attempt) => { try { attempt(); return "no error"; }
                                         catch (error) { return error.message; } });
    }""")
    expected = ["at least one token", "sequence length 65 exceeds the model's context length 64",
                "token ids must be integers in [0, 320), got 1000000",
                "lone surrogate U+D800 at UTF-16 index 3",
                "a prompt of 64 tokens leaves no room in the context of 64",
                "temperature must be a finite number >= 0", "topK must be an integer >= 1",
                "topP must lie in (0, 1]", "expected a payload of tfbook's export_page_model",
                "the payload has no weight blocks.1.ff.fc_out.bias"]
    for message, part in zip(errors, expected, strict=True):
        assert part in message, (message, part)


def test_speed_of_a_64_token_forward(page) -> None:
    """The book's page model (2 x 64 x 4 heads, V = 2048, float16 weights): the median time of
    a forward over 64 tokens (logits for all 64), with and without the attention weights,
    and of one cached generation step, printed. The bound is on the CPU time of the page's
    main thread per forward (a loaded machine stretches the clock times, not that)."""
    times = page.evaluate("""async () => {
      const model = await loadModel("book.json");
      const ids = Array.from({ length: 64 }, (_, i) => (i * 37) % model.config.vocab_size);
      const median = (run) => {
        run(); run();  // let the JIT compile it
        const times = [];
        for (let r = 0; r < 15; r++) {
          const start = performance.now();
          run();
          times.push(performance.now() - start);
        }
        return times.sort((a, b) => a - b)[7];
      };
      const cache = model.newCache();
      model.forward(ids.slice(0, 63), { cache });
      return {
        forward: median(() => model.forward(ids)),
        withWeights: median(() => model.forward(ids, { needWeights: true })),
        lastOnly: median(() => model.forward(ids, { lastOnly: true })),
        cachedStep: median(() => { cache.layers.forEach((l) => { l.length = 63; });
                                   model.forward([5], { cache, lastOnly: true }); }),
      };
    }""")
    print("\nmedian ms, 64 tokens, V = 2048: " + ", ".join(f"{k} {v:.1f}"
                                                         for k, v in times.items()))
    page.evaluate("""async () => {
      window.speedModel = await loadModel("book.json");
      window.speedIds = Array.from({ length: 64 },
                                   (_, i) => (i * 37) % window.speedModel.config.vocab_size);
      window.speedModel.forward(window.speedIds);  // compiled before the measurement
    }""")
    cpu, runs = main_thread_cpu(page), 10
    before = cpu()
    page.evaluate(f"() => {{ for (let r = 0; r < {runs}; r++) "
                  "window.speedModel.forward(window.speedIds); }")
    forward_cpu = (cpu() - before) / runs
    print(f"CPU time of the page's main thread per forward: {forward_cpu:.1f} ms")
    assert forward_cpu < 500


def test_hostile_text_is_shown_as_text(page, bpe: BPETokenizer) -> None:
    """Typed text, hostile or too long or empty, is encoded and shown with textContent: no
    element is made from it, no script runs, a cut context is said."""
    box = page.get_by_label("text")
    tokens = page.locator("#tokens li")
    status = page.locator("#status")
    for text in (HOSTILE, "<!--<script>alert(1)</script>", PROMPTS[3]):
        box.fill(text)
        expect(page.locator("#tokens")).to_have_attribute("data-text", text)
        ids = bpe.encode_ordinary(text)
        expect(tokens).to_have_count(len(ids))
        assert tokens.all_text_contents() == [token_label(bpe, i) for i in ids]
        expect(status).to_have_text(f"{len(ids)} tokens")
        assert page.locator("body img, body script:not([src])").count() == 1  # the page's own
    long = long_text().replace("\r", "")  # a text box turns CR LF into LF
    box.fill(long)
    expect(page.locator("#tokens")).to_have_attribute("data-text", long)
    n = len(bpe.encode_ordinary(long))
    expect(status).to_have_text(f"{n} tokens: the first {n - MAX_LEN} were dropped to fit the "
                                "context")
    expect(tokens).to_have_count(MAX_LEN)
    box.fill("")
    expect(status).to_have_text("empty text: nothing to run")
    expect(tokens).to_have_count(0)
    script = (STATIC / "gpt.js").read_text(encoding="utf-8")
    assert "innerHTML" not in script and "fetch(" not in script and "eval(" not in script


def test_node_runs_the_page_computation() -> None:
    """gpt.js in Node.js (what the chapter uses): ids, logits and weights equal PyTorch's."""
    from tfbook.widgets.page_model import run_in_node

    tokenizer = BPETokenizer.train("the cat sat on the mat " * 20, 300, keep_trace=False)
    torch.manual_seed(0)  # (the short text has fewer than 300 - 256 merges to learn)
    model = GPT(replace(GPTConfig.tiny(), vocab_size=tokenizer.vocab_size, max_len=32)).eval()
    text = "the cat — élan 中文 🙂 <b>"
    out = run_in_node(export_page_model(model, tokenizer, "float32"), text)
    ids = tokenizer.encode_ordinary(text)
    assert out["ids"] == ids
    with torch.no_grad():
        ref = model(torch.tensor([ids]), need_weights=True)
    assert (out["logits"] - ref.logits[0]).abs().max() < 1e-4
    for ours, theirs in zip(out["attentions"], ref.attentions, strict=True):
        assert (ours - theirs[0]).abs().max() < 1e-5
    with pytest.raises(ValueError, match="non-empty str"):
        run_in_node(export_page_model(model, tokenizer, "float32"), "")


# --- Bad input: vocabularies, budgets, shapes; token labels and the byte-order mark ------


def test_a_padded_vocabulary_is_refused_at_export(bpe: BPETokenizer) -> None:
    """A model with more ids than its tokenizer has tokens (a vocabulary padded to a round
    size) would let the page's sampler draw an id with no text: refused, with the numbers."""
    with pytest.raises(ValueError, match=f"vocab_size is {bpe.vocab_size + 64} but its "
                                         f"tokenizer has {bpe.vocab_size} tokens.*the 64 ids"):
        export_page_model(random_gpt(bpe.vocab_size + 64), bpe)


def test_the_budget_is_checked_before_encoding(bpe: BPETokenizer, monkeypatch) -> None:
    """The payload's size is estimated from the parameter counts (a lower bound of the real
    size), and a model over the budget is refused before anything is encoded, with advice
    that fits its dtype: a smaller dtype when one fits, else a smaller model."""
    from tfbook.widgets import page_model

    for dtype in ("float32", "float16", "int8"):
        estimate = page_model.estimated_payload_bytes(model_of(bpe), dtype)
        real = payload_bytes(export_page_model(model_of(bpe), bpe, dtype))
        assert estimate <= real < estimate + 4 * bpe.vocab_size + 200_000  # + the tokenizer
    wide = GPT(replace(GPTConfig.tiny(), vocab_size=bpe.vocab_size, d_model=384, n_heads=6,
                       n_layers=1))  # ~2.1 M parameters: float32 and float16 too big, int8 fits

    def no_encoding(*args, **kwargs):
        raise AssertionError("the payload was encoded before the budget was checked")

    monkeypatch.setattr(page_model, "export_page_model", no_encoding)
    with pytest.raises(ValueError, match=r"at least [\d,]+ bytes in float32.*dtype 'int8' "
                                         r"would take about [\d,]+"):
        page_model.page_payload(wide, bpe, "float32")
    with pytest.raises(ValueError, match=r"in float16.*dtype 'int8' would take about"):
        page_model.page_payload(wide, bpe, "float16")
    huge = GPT(replace(GPTConfig.tiny(), vocab_size=bpe.vocab_size, d_model=1024, n_heads=8,
                       n_layers=1))  # ~12.9 M parameters: nothing fits
    with pytest.raises(ValueError, match=r"in int8.*no storage type fits it \(int8 takes "
                                         r"about [\d,]+\): use a smaller model"):
        page_model.page_payload(huge, bpe, "int8")


def model_of(bpe: BPETokenizer) -> GPT:
    return random_gpt(bpe.vocab_size)


@pytest.mark.parametrize("where, shape, message", [
    ("norm_f.weight", [-64], "expected a shape of one or two positive ints"),
    ("norm_f.weight", [64.0], "expected a shape of one or two positive ints"),
    ("norm_f.weight", [True], "expected a shape of one or two positive ints"),
    ("norm_f.weight", [2, 2, 16], "expected a shape of one or two positive ints"),
    ("tok_emb.weight", [64, 320], r"its config needs shape \[320, 64\], the payload says "
                                  r"\[64, 320\]"),
    ("blocks.0.ff.fc_in.weight", [64, 256], r"needs shape \[256, 64\]"),
])
def test_weights_of_impossible_shapes_are_refused(model: GPT, bpe: BPETokenizer, where: str,
                                                   shape: list, message: str) -> None:
    """In Python (page_weights) and in the page (PageGPT): a shape that is not one or two
    positive ints, or not the one the config needs (same number of values, transposed)."""
    payload = export_page_model(model, bpe, "float32")
    payload["weights"][where]["shape"] = shape
    with pytest.raises(ValueError, match=message):
        page_weights(payload)
    if shape == [64.0]:
        return  # JSON has one kind of number: 64.0 reaches the page as the integer 64
    with pytest.raises(RuntimeError, match=message.replace("ints", "integers")):
        node_eval(payload, "new PageGPT(payload)")


def test_a_payload_with_missing_or_extra_weights_is_refused(model: GPT, bpe: BPETokenizer) -> None:
    payload = export_page_model(model, bpe, "float16")
    payload["weights"]["extra.weight"] = payload["weights"].pop("norm_f.bias")
    with pytest.raises(ValueError, match=r"weights must be exactly \[.*'norm_f.bias'.*got \["):
        page_weights(payload)
    payload = export_page_model(model, bpe, "float16")
    payload["config"]["n_layers"] = 0
    with pytest.raises(ValueError, match="a payload config needs positive ints"):
        page_weights(payload)


NODE_EVAL = r"""
const fs = require("fs"), vm = require("vm");
vm.runInThisContext(fs.readFileSync(process.argv[1], "utf8") + "\nglobalThis.PageGPT = PageGPT;"
                    + "\nglobalThis.PageTokenizer = PageTokenizer;");
const { payload, expression } = JSON.parse(fs.readFileSync(0, "utf8"));
try {
  process.stdout.write(JSON.stringify(eval(expression)));
} catch (error) {
  process.stderr.write(error.message);
  process.exit(1);
}
"""


def node_eval(payload: dict, expression: str):
    """Evaluate `expression` in Node.js with gpt.js loaded and `payload` defined; an error
    thrown there is a RuntimeError with its message."""
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.fail("these tests need Node.js (apt-get install nodejs), not found")
    done = subprocess.run([node, "-e", NODE_EVAL, str(STATIC / "gpt.js")], capture_output=True,
                          input=json.dumps({"payload": payload, "expression": expression}),
                          text=True, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return json.loads(done.stdout)


def test_pieces_of_a_character_show_as_hex_as_in_python(bpe: BPETokenizer) -> None:
    """Every token of the multilingual tokenizer (merges that cut 4-byte emoji and 3-byte CJK
    characters) has the same label in the page as token_label gives in Python: whole
    characters as text, pieces in hex between ‹ ›, never U+FFFD."""
    labels = [token_label(bpe, i) for i in range(bpe.vocab_size)]
    assert token_label(bpe, 0xF0) == "‹f0›" and token_label(bpe, ord("a")) == "a"
    pieces = [label for label in labels if "‹" in label]
    assert len(pieces) > 20 and not any("\ufffd" in label for label in labels)
    tokens = {"tokenizer": page_tokenizer(bpe)}
    page = node_eval(tokens, "Array.from({ length: payload.tokenizer.vocab_size }, (_, i) => "
                            "new PageTokenizer(payload.tokenizer).tokenText(i))")
    assert page == labels


def test_a_leading_byte_order_mark_is_kept() -> None:
    """U+FEFF at the start of a text is a character: encoded and decoded back by the page as by
    Python (a TextDecoder without ignoreBOM would drop it), and shown as a token."""
    tok = BPETokenizer({}, GPT4_SPLIT_PATTERN)
    text = "\ufeffhello \ufeff"
    ids = tok.encode_ordinary(text)
    assert tok.decode(ids) == text
    page = node_eval({"tokenizer": page_tokenizer(tok)}, f"""(() => {{
      const t = new PageTokenizer(payload.tokenizer);
      const ids = t.encode({json.dumps(text)});
      return [ids, t.decode(ids), t.decode(ids.slice(0, 3))];
    }})()""")
    assert page == [ids, text, "\ufeff"]


def test_int8_rows_are_tfbook_quantize_rows():
    """The page's int8 format is tfbook.quantize's absmax rule with one block a row."""
    from tfbook.quantize import quantise as quantise_blocks
    from tfbook.widgets.page_model import dequantise, quantise

    w = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    w[3] = 0.0  # a row of zeros: scale 1, codes 0
    entry = quantise("w", w, "int8")
    assert torch.equal(dequantise("w", entry), quantise_blocks(w, bits=8).values)
