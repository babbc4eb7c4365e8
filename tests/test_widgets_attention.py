"""The attention-map widget: data from attention weights, live runs, safe text, responsiveness."""

from __future__ import annotations

import base64
import json
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

from tests.browser import (
    WIDGET_SNAPSHOT_JS,
    main_thread_cpu,
    serve,
    static_widget,
    wait_for_new_snapshot,
    watch,
    widget_page,
)
from tests.conftest import ASSETS, ROOT
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.tokenizers.pretokenize import GPT4_SPLIT_PATTERN
from tfbook.train.corpus_lm import load_trained_gpt
from tfbook.widgets.attention import (
    PAGE_MODEL_ESM,
    AttentionExample,
    AttentionMap,
    gpt_attention_example,
    maps_module,
    quantise_maps,
    truncation_note,
)
from tfbook.widgets.base import STATIC
from tfbook.widgets.page_model import (
    MAX_PAGE_MODEL_BYTES,
    export_page_model,
    gpt_js_script_safe,
    payload_bytes,
    payload_json,
    quantised_reference,
    token_label,
)

HOSTILE = "<img src=x onerror=alert(1)>"


def random_weights(*shape: int) -> torch.Tensor:
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(0)), -1)


def unpacked(m: AttentionMap) -> np.ndarray:
    """The page's bytes: base64, then zlib's inflate (what DecompressionStream("deflate") does)."""
    return np.frombuffer(zlib.decompress(base64.b64decode(m.data)), dtype=np.uint8)


def test_maps_are_stored_as_quantised_bytes_in_order() -> None:
    w = random_weights(2, 3, 4, 4)
    m = AttentionMap(AttentionExample("s", list("abcd"), w))
    raw = unpacked(m).reshape(2, 3, 4, 4)
    assert np.abs(raw / 255 - w.numpy()).max() <= 0.5 / 255 + 1e-6
    assert m.examples[0] == {"name": "s", "tokens": list("abcd"), "keys": list("abcd"),
                             "cross": False, "shape": [2, 3, 4, 4], "note": ""}


def test_long_maps_of_mostly_zero_weights_pack_small() -> None:
    """A causal map of 256 tokens: each row spreads over its prefix, so most bytes are 0, and
    the packed data is a small part of a plain base64 of the bytes."""
    scores = torch.randn(4, 256, 256, generator=torch.Generator().manual_seed(1)) * 3
    causal = torch.ones(256, 256).triu(1).bool()
    w = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)  # (H, T, T)
    m = AttentionMap(AttentionExample("causal", [str(i) for i in range(256)], w))
    assert np.array_equal(unpacked(m).reshape(1, 4, 256, 256), quantise_maps(w[None]))
    assert len(m.data) < 0.25 * len(base64.b64encode(quantise_maps(w).tobytes()))


def test_cross_attention_and_lower_rank_weights() -> None:
    m = AttentionMap([AttentionExample("self", ["a", "b"], random_weights(2, 2)),
                      AttentionExample("cross", ["a", "b"], random_weights(4, 2, 3),
                                       ["x", "y", "z"])])
    assert [e["shape"] for e in m.examples] == [[1, 1, 2, 2], [1, 4, 2, 3]]
    assert m.examples[1]["cross"] and m.examples[1]["keys"] == ["x", "y", "z"]
    assert m.offsets == [0, 4]


@pytest.mark.parametrize("example, message", [
    (AttentionExample("x", ["a", "b"], random_weights(2, 3)), r"end in \(T, S\) = \(2, 3\)"),
    (AttentionExample("x", ["a"], torch.full((1, 1), 2.0)), "probabilities in"),
    (AttentionExample("x", ["a"], torch.ones(1, 1, 1, 1, 1)), "must be"),
])
def test_bad_weights_are_clear_errors(example: AttentionExample, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AttentionMap(example)


@pytest.mark.parametrize("example, message", [
    (AttentionExample("e", [], torch.zeros(0, 0)), "example 'e' has no tokens"),
    (AttentionExample("e", [], []), "example 'e' has no tokens"),
    (AttentionExample("e", [], torch.zeros(2, 3, 0, 0)), "example 'e' has no tokens"),
    (AttentionExample("e", ["a"], torch.zeros(1, 0), []), "example 'e' has no source tokens"),
    (AttentionExample("e", ["a"], torch.ones(0, 2, 1, 1)), r"at least one layer .* \(0, 2, 1, 1\)"),
    (AttentionExample("e", ["a"], torch.ones(2, 0, 1, 1)), r"at least one layer .* \(2, 0, 1, 1\)"),
])
def test_an_example_without_tokens_or_heads_is_a_value_error(example, message) -> None:
    with pytest.raises(ValueError, match=message):
        example.as_4d()
    with pytest.raises(ValueError, match=message):
        AttentionMap(example)


def test_not_examples_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="expected one or more AttentionExample"):
        AttentionMap([torch.ones(2, 2)])


def test_live_run_adds_the_new_sentence() -> None:
    def run(text: str) -> AttentionExample:
        tokens = text.split()
        return AttentionExample("your text", tokens, random_weights(2, len(tokens), len(tokens)))

    m = AttentionMap(AttentionExample("s", ["a", "b"], random_weights(2, 2, 2)), run=run)
    assert m.can_run
    m._on_front_end_message(m, {"type": "request", "args": {"text": "one two three"}}, [])
    assert m.error == "" and m.example == 1
    assert m.examples[1]["tokens"] == ["one", "two", "three"]
    m._on_front_end_message(m, {"type": "request", "args": {"text": "  "}}, [])
    assert "expected some text" in m.error and len(m.examples) == 2
    static = AttentionMap(AttentionExample("s", ["a"], random_weights(1, 1)))
    static._on_front_end_message(static, {"type": "request", "args": {"text": "hi"}}, [])
    assert "no model attached" in static.error


def test_static_page_interactions_safe_text_and_speed(browser, tmp_path: Path) -> None:
    """6 layers x 12 heads x 128 tokens: renders, and every interaction redraws fast."""
    tokens = [f"t{i}" for i in range(127)] + [HOSTILE]
    m = AttentionMap(AttentionExample("long", tokens, random_weights(6, 12, 128, 128)))
    page_file = widget_page(m, ASSETS, tmp_path)
    with serve(tmp_path) as base_url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        log = watch(page, base_url)
        page.goto(base_url + page_file.name)
        root = page.locator(".tfw").first
        root.wait_for(timeout=60000)
        assert root.locator(".tfw-grid canvas").count() == 6 * 12
        before = root.evaluate(WIDGET_SNAPSHOT_JS)
        cpu = main_thread_cpu(page)  # CPU ms of the page: a loaded machine hardly stretches it
        start, cpu_start = time.perf_counter(), cpu()
        root.locator("input[type=range]").nth(1).focus()
        page.keyboard.press("ArrowRight")  # next head: grid, map and strips redraw
        after_key = root.evaluate(WIDGET_SNAPSHOT_JS)
        key_cpu_ms, key_seconds = cpu() - cpu_start, time.perf_counter() - start
        assert after_key != before
        big = root.locator("canvas").first.bounding_box()
        page.mouse.move(big["x"] + 5, big["y"] + big["height"] - 2)  # the last query: HOSTILE
        wait_for_new_snapshot(root, after_key)
        assert HOSTILE.replace(" ", "␣") in root.inner_text()
        assert root.locator("img").count() == 0
        page.close()
    print(f"\na head change at 128 tokens: {key_cpu_ms:.0f} ms of the page's CPU time, "
          f"{key_seconds:.2f} s on the clock")
    assert key_cpu_ms < 2000, f"a head change took {key_cpu_ms:.0f} ms of CPU at 128 tokens"
    assert not log.dialogs, f"a script ran from the data: {log.dialogs}"
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log


def test_one_layer_shows_no_layer_slider(browser, tmp_path: Path) -> None:
    """Sliders only where there is a choice: the keyboard then moves the head."""
    m = AttentionMap(AttentionExample("one layer", list("abc"), random_weights(1, 2, 3, 3)),
                     placeholder="type digits")
    with static_widget(browser, m, ASSETS, tmp_path) as (page, root, log):
        assert root.locator("input[type=range]").count() == 1
        assert root.locator("input[type=range]").get_attribute("aria-label") == "head"
        assert root.locator("input[type=text]").get_attribute("placeholder") == "type digits"
        before = root.evaluate(WIDGET_SNAPSHOT_JS)
        text_before = root.evaluate("(r) => r.innerText")
        root.locator("input[type=range]").focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function("(b) => document.querySelector('.tfw').innerText !== b",
                               arg=text_before)
        assert root.evaluate(WIDGET_SNAPSHOT_JS) != before
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log


def test_sliders_keep_the_keyboard_through_redraws(browser, tmp_path: Path) -> None:
    """Several arrow-key presses in a row on the layer and head sliders: each one moves."""
    m = AttentionMap(AttentionExample("grid", list("abcd"), random_weights(4, 5, 4, 4)))
    with static_widget(browser, m, ASSETS, tmp_path) as (page, root, log):
        for label, last in (("layer", 3), ("head", 4)):
            box = root.locator(f"input[aria-label={label}]")
            box.focus()
            for expected in range(1, last + 1):
                page.keyboard.press("ArrowRight")
                page.wait_for_function(
                    "([l, v]) => document.querySelector(`input[aria-label=${l}]`).value == v "
                    "&& document.activeElement === document.querySelector("
                    "`input[aria-label=${l}]`)", arg=[label, expected])
            caption = root.locator(".tfw-note").first.inner_text()
            assert f"{label} {last}" in caption
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log


def test_bad_weights_are_refused_before_the_page():
    import math

    import pytest
    import torch

    from tfbook.widgets.attention import AttentionExample, AttentionMap

    good = torch.full((2, 2), 0.5)
    for weights, error, message in [
        (torch.tensor([[0.5, math.nan], [0.5, 0.5]]), ValueError, "NaN or infinite"),
        (torch.tensor([[0.5, math.inf], [0.5, 0.5]]), ValueError, "NaN or infinite"),
        ([[0.5, 0.5], [1.0]], ValueError, "rectangular array"),
        (torch.full((2, 3), 0.3), ValueError, r"\(T, S\) = \(2, 3\)"),
    ]:
        with pytest.raises(error, match=message):
            AttentionMap(AttentionExample("bad", ["a", "b"], weights))
    with pytest.raises(TypeError, match="tokens must be a list of strings"):
        AttentionMap(AttentionExample("bad", ["a", 2], good))
    with pytest.raises(TypeError, match="tokens must be a list of strings"):
        AttentionMap(AttentionExample("bad", "ab", good))


# --- a GPT in the page: the reader's own text without a kernel ------------------------------

TRAINED = ROOT / "book" / "learning" / "data" / "training_gpt"
TEXTS = ["The function returns the value.", "Café crème, 中文分词, emoji 😀👍🏽.", HOSTILE]
LONG = "Return the number of items in the container, counted once. " * 12  # > 64 tokens
PAGE_RUN_JS = """(r) => r.pageRun && ({ids: r.pageRun.ids, tokens: r.pageRun.tokens,
  runs: r.pageRun.runs, dropped: r.pageRun.dropped,
  weights: r.pageRun.attentions.map((w) => Array.from(w))})"""


def tiny_gpt(vocab_size: int = 300, seed: int = 0, **changes) -> tuple[GPT, BPETokenizer]:
    """A random tfbook GPT (context 16) and a byte-level BPE of `vocab_size` tokens."""
    tokenizer = BPETokenizer.train("the cat sat on the mat; the dog ate the hat. " * 20,
                                   vocab_size, GPT4_SPLIT_PATTERN, keep_trace=False)
    torch.manual_seed(seed)  # the short text may offer fewer merges: V is the tokenizer's
    config = replace(GPTConfig.tiny(), vocab_size=tokenizer.vocab_size, max_len=16, **changes)
    return GPT(config).eval(), tokenizer


@pytest.fixture(scope="module")
def trained() -> tuple[GPT, BPETokenizer]:
    if not (TRAINED / "model.safetensors").exists():
        pytest.skip(f"the trained model is missing: run scripts/train_gpt.py (writes {TRAINED})")
    return load_trained_gpt(TRAINED)


def test_gpt_example_is_the_models_forward_on_the_last_tokens() -> None:
    model, tokenizer = tiny_gpt()
    e = gpt_attention_example(model, tokenizer, "the cat sat")
    ids = tokenizer.encode_ordinary("the cat sat")
    with torch.no_grad():
        direct = model(torch.tensor([ids]), need_weights=True).attentions
    assert e.name == "the cat sat" and e.note == ""
    assert e.tokens == [token_label(tokenizer, i) for i in ids]
    assert torch.equal(e.weights, torch.stack(direct)[:, 0])  # (L, H, T, T)
    long = "the dog ate the hat " * 10
    ids = tokenizer.encode_ordinary(long)
    cut = gpt_attention_example(model, tokenizer, long, "long")
    with torch.no_grad():
        direct = model(torch.tensor([ids[-16:]]), need_weights=True).attentions
    assert len(ids) > 16 and cut.note == truncation_note(len(ids), 16)
    assert f"first {len(ids) - 16} tokens were cut" in cut.note
    assert torch.equal(cut.weights, torch.stack(direct)[:, 0])
    with pytest.raises(ValueError, match="expected some text"):
        gpt_attention_example(model, tokenizer, " \n ")


def test_gpt_example_keeps_at_most_max_tokens() -> None:
    """max_tokens below the context keeps that many last tokens and says so in the head
    explorer's words; above it, the context is the limit and the note the map's."""
    model, tokenizer = tiny_gpt()  # context 16
    text = "the dog ate the hat " * 10
    ids = tokenizer.encode_ordinary(text)
    short = gpt_attention_example(model, tokenizer, text, max_tokens=5)
    with torch.no_grad():
        direct = model(torch.tensor([ids[-5:]]), need_weights=True).attentions
    assert torch.equal(short.weights, torch.stack(direct)[:, 0])
    assert short.tokens == [token_label(tokenizer, i) for i in ids[-5:]]
    assert short.note == truncation_note(len(ids), 5, 16) == (
        f"the text is {len(ids)} tokens long and this explorer shows at most 5 (the model "
        f"reads up to 16): its first {len(ids) - 5} tokens were cut, the maps show the last 5")
    assert gpt_attention_example(model, tokenizer, "the cat", max_tokens=5).note == ""
    wide = gpt_attention_example(model, tokenizer, text, max_tokens=100)
    assert len(wide.tokens) == 16 and wide.note == truncation_note(len(ids), 16)
    assert truncation_note(len(ids), 16) == truncation_note(len(ids), 16, 16)
    for bad in (0, -3, True, 2.5, "5"):
        with pytest.raises(ValueError, match="max_tokens must be a positive int"):
            gpt_attention_example(model, tokenizer, text, max_tokens=bad)
    with pytest.raises(TypeError, match="model must be a tfbook decoder"):
        gpt_attention_example(torch.nn.Linear(2, 2), tokenizer, text)
    with pytest.raises(TypeError, match="tokenizer must be a tfbook tokenizer"):
        gpt_attention_example(model, "bytes", text)


def test_modules_are_whole_files_put_together() -> None:
    """Each map widget's module is whole files of static/ (no file cut up): common.js,
    maps.js, gpt.js only for a page model, then the widget's own file."""
    def read(name: str) -> str:
        return (STATIC / name).read_text(encoding="utf-8")

    common, maps, attention = read("common.js"), read("maps.js"), read("attention.js")
    assert AttentionMap._esm == "\n".join([common, maps, attention])
    assert PAGE_MODEL_ESM == "\n".join([common, maps, gpt_js_script_safe(), attention])
    heads = maps_module("heads.js", helpers=["tokenspans.js"])
    assert heads == "\n".join([common, read("tokenspans.js"), maps, read("heads.js")])
    for module in (AttentionMap._esm, PAGE_MODEL_ESM, heads):
        assert module.count("function render(") == 1 and module.count("function pageRunner(") == 1
    assert "function shrinkMap(" not in heads  # attention.js's own code stays in its file


def test_from_page_model_carries_the_model_and_runs_it_in_python() -> None:
    model, tokenizer = tiny_gpt()
    m = AttentionMap.from_page_model(model, tokenizer, ["the cat", "the dog"], layer=1, head=3)
    payload = export_page_model(model, tokenizer, "float16")
    assert m.page_model == payload_json(payload) and json.loads(m.page_model) == payload
    assert "class PageGPT" in m._esm and "class PageGPT" not in AttentionMap._esm
    assert (m.layer, m.head, m.can_run) == (1, 3, True)
    reference = quantised_reference(model, "float16")  # the page's weights, in Python
    expected = gpt_attention_example(reference, tokenizer, "the dog")
    shape = list(expected.weights.shape)
    assert m.examples[1]["shape"] == shape
    raw = unpacked(m)[m.offsets[1]:].reshape(shape)
    assert np.array_equal(raw, quantise_maps(expected.weights))
    m._on_front_end_message(m, {"type": "request", "args": {"text": "the hat"}}, [])
    assert m.error == "" and m.example == 2 and m.examples[2]["name"] == "your text"
    assert m.examples[2]["tokens"] == [token_label(tokenizer, i)
                                       for i in tokenizer.encode_ordinary("the hat")]


def test_from_page_model_bad_input() -> None:
    model, tokenizer = tiny_gpt()
    with pytest.raises(TypeError, match="texts must be a str or a list of str"):
        AttentionMap.from_page_model(model, tokenizer, [1])
    with pytest.raises(ValueError, match="dtype must be one of"):
        AttentionMap.from_page_model(model, tokenizer, "the cat", dtype="bfloat16")
    with pytest.raises(ValueError, match="expected some text"):
        AttentionMap.from_page_model(model, tokenizer, "")
    big, big_tokenizer = tiny_gpt(n_layers=4, d_model=256)  # about 3.4 M float16 numbers
    with pytest.raises(ValueError, match="more than the 3,000,000 a page may hold"):
        AttentionMap.from_page_model(big, big_tokenizer, "the cat")


def test_typed_text_runs_the_page_model(browser, trained, tmp_path: Path) -> None:
    """The static page: typed text is encoded and run by gpt.js; its weights equal PyTorch's
    (float32 weights in the page) within 1e-5, the maps redraw, a long text is cut with a
    note, empty text gets a message, hostile text stays text, nothing leaves the page."""
    model, tokenizer = trained
    m = AttentionMap.from_page_model(model, tokenizer, "The function returns", dtype="float32")
    assert payload_bytes(json.loads(m.page_model)) <= MAX_PAGE_MODEL_BYTES
    with static_widget(browser, m, ASSETS, tmp_path) as (page, root, log):
        requests = []  # every request from here on, local or not: there should be none
        page.on("request", lambda request: requests.append(request.url))
        box = root.locator("input[type=text]")
        assert box.is_enabled() and "runs in this page" in root.inner_text()
        runs = 0
        for text in [*TEXTS, LONG]:
            before = root.evaluate(WIDGET_SNAPSHOT_JS)
            box.fill(text)
            runs += 1
            page.wait_for_function("([r, n]) => r.pageRun && r.pageRun.runs === n",
                                   arg=[root.element_handle(), runs])
            run = root.evaluate(PAGE_RUN_JS)
            ids = tokenizer.encode_ordinary(text)
            kept = ids[-model.config.max_len:]
            assert run["ids"] == kept and run["dropped"] == len(ids) - len(kept)
            assert run["tokens"] == [token_label(tokenizer, i) for i in kept]
            with torch.no_grad():
                expected = model(torch.tensor([kept]), need_weights=True).attentions
            for layer, w in enumerate(expected):  # (1, H, T, T)
                got = torch.tensor(run["weights"][layer]).reshape(w.shape[1:])
                assert torch.allclose(got, w[0], atol=1e-5, rtol=0), (text, layer)
            assert wait_for_new_snapshot(root, before) != before  # the maps were redrawn
            shown = "".join(root.locator(".tfw-strip").first.locator("span").all_inner_texts())
            assert shown == "".join(t.replace(" ", "␣").replace("\n", "↵") for t in run["tokens"])
            note = root.locator(".tfw-cut").inner_text()
            assert note == (truncation_note(len(ids), model.config.max_len) if run["dropped"]
                            else "")
        assert root.locator("select").input_value() == "1"  # "your text", after Python's
        box.fill("   ")
        expect(root.locator(".tfw-status")).to_contain_text("the text box is empty")
        assert root.evaluate(PAGE_RUN_JS)["runs"] == runs
        assert root.locator("img").count() == 0
    assert not log.dialogs, f"a script ran from the text: {log.dialogs}"
    assert not requests, f"the page made requests while it ran the model: {requests}"
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log
