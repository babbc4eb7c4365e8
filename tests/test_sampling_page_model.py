"""The sampling widget with a model in the page (SamplingWidget.from_page_model).

Python: the widget carries the payload of export_page_model (within the page budget, no raw
"<"), its first generation is tfbook's generate (greedy) on the page's weights, the page's
sampler mirrored in Python draws from kept_distribution and reproduces with its seed, a long
prompt keeps its last tokens, the live path in Jupyter computes the same, and bad input is a
clear error. Chromium, static page (no kernel): the reader's prompt and knobs generate in the
page; its tokens equal tfbook's generate (greedy) and Python's mirror (seeded sampling), its
candidates, kept sets and logits at every step equal the PyTorch model's, a seed reproduces,
hostile, empty, too long and malformed input are handled as text, the keyboard drives it, and
no request leaves the page. The same on the book's trained model (float16), if present.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from playwright.sync_api import expect

from tests.browser import static_widget
from tests.conftest import ASSETS, ROOT
from tests.test_page_model import random_gpt
from tfbook.generate.sampling import filter_logits, kept_distribution
from tfbook.generate.search import generate
from tfbook.models.gpt import GPT
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.tokenizers.pretokenize import GPT4_SPLIT_PATTERN
from tfbook.widgets.page_model import (
    MAX_PAGE_MODEL_BYTES,
    export_page_model,
    payload_json,
    quantised_reference,
    token_label,
)
from tfbook.widgets.sampling import (
    SamplingWidget,
    fit_prompt,
    mulberry32,
    next_token_candidates,
    page_generation,
    page_next_token,
)

HOSTILE = "</script><img src=x onerror=alert(1)> <!--<script>"
TEXT = ("The model reads the text and writes what comes next. Café crème, naïve façade; "
        "中文，你好。 Emoji 😀 and numbers 12345. def f(x):\n    return x + 1\n")
MAX_LEN = 64  # T of the test model, as the book's page model
TOP_N = 30  # candidates per step


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(TEXT * 3, 300, GPT4_SPLIT_PATTERN, keep_trace=False)


@pytest.fixture(scope="module")
def gpt(bpe: BPETokenizer) -> GPT:
    """A seeded random GPT whose weights are large enough (std 0.2, gains 1 +- 0.1) that the
    next-token distributions are neither flat nor one-hot."""
    return random_gpt(bpe.vocab_size, seed=0)


def widget_state(w: SamplingWidget) -> str:
    return json.dumps({k: v for k, v in w.get_state().items() if k != "_esm"})


# --- Python -------------------------------------------------------------------------------


def test_the_widget_carries_the_page_model(gpt: GPT, bpe: BPETokenizer) -> None:
    """The state holds export_page_model's payload, within the budget and without a raw "<";
    the first generation (greedy) is tfbook's generate on the page's weights."""
    w = SamplingWidget.from_page_model(gpt, bpe, "Café crème", max_new_tokens=8, top_n=TOP_N,
                                       dtype="int8", temperature=0, seed=7)
    assert json.loads(w.page_model) == json.loads(payload_json(export_page_model(gpt, bpe,
                                                                                 "int8")))
    state = widget_state(w)
    assert "<" not in state and len(state.encode()) < MAX_PAGE_MODEL_BYTES
    assert (w.can_run, w.seed, w.dropped, w.max_new_tokens, w.temperature) == (True, 7, 0, 8, 0)
    reference = quantised_reference(gpt, "int8")
    ids = bpe.encode_ordinary("Café crème")
    expected = generate(reference, [ids], 8, temperature=0, keep_logits=True)
    assert [s["chosen"] for s in w.steps] == expected.new_tokens[0].tolist()
    assert w.prompt_tokens == [token_label(bpe, i) for i in ids]
    assert "‹c3›" in w.prompt_tokens  # é cut after its first byte: hex, as the page shows it
    for step, logits in zip(w.steps, expected.logits, strict=True):
        assert step["ids"] == next_token_candidates(logits[0], TOP_N)[0]


def test_the_page_sampler_draws_from_the_kept_distribution() -> None:
    """page_next_token (inverse transform on mulberry32) hits each token as often as
    kept_distribution says, never a removed one, and a seed gives the same draws."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -2.0, -9.0])  # (V,)
    settings = (0.8, 5, 0.9)
    random = mulberry32(123)
    draws = torch.tensor([page_next_token(logits, *settings, random) for _ in range(6000)])
    expected = kept_distribution(logits, *settings)
    counts = torch.bincount(draws, minlength=len(logits)).double() / len(draws)
    assert float((counts - expected).abs().max()) < 0.02, (counts, expected)
    assert bool((counts[expected == 0] == 0).all())
    again = mulberry32(123)
    assert [page_next_token(logits, *settings, again) for _ in range(50)] == draws[:50].tolist()
    assert page_next_token(logits, 0, None, None, mulberry32(0)) == 0  # greedy: the argmax
    numbers = [mulberry32(9)() for _ in range(3)]
    assert len(set(numbers)) == 1 and 0 <= numbers[0] < 1  # a new generator starts over


def test_a_long_prompt_keeps_its_last_tokens(gpt: GPT, bpe: BPETokenizer) -> None:
    ids = bpe.encode_ordinary(TEXT * 3)
    assert len(ids) > MAX_LEN
    kept, dropped = fit_prompt(ids, MAX_LEN, 10)
    assert kept == ids[-(MAX_LEN - 10):] and dropped == len(ids) - (MAX_LEN - 10)
    assert fit_prompt(ids[:5], MAX_LEN, 10) == (ids[:5], 0)
    assert fit_prompt(ids, MAX_LEN, MAX_LEN) == (ids[-1:], len(ids) - 1)  # one token at least
    (tokens, logits, chosen, _), cut = page_generation(gpt, bpe, TEXT * 3, 10, temperature=0)
    assert cut == dropped and tokens == [token_label(bpe, i) for i in kept]
    assert chosen == generate(gpt, [kept], 10, temperature=0).new_tokens[0].tolist()
    _, _, chosen, _ = page_generation(gpt, bpe, TEXT * 3, MAX_LEN, temperature=0)[0]
    assert len(chosen) == MAX_LEN - 1  # the context is full: it stops there


def test_jupyter_computes_the_same_generation(gpt: GPT, bpe: BPETokenizer) -> None:
    """The live path (a kernel answers the front end) runs page_generation with the widget's
    knobs and the request's seed; a bad request is reported and not applied."""
    w = SamplingWidget.from_page_model(gpt, bpe, "Hello", max_new_tokens=4, top_n=TOP_N,
                                       dtype="float32", temperature=0.9, top_p=0.95)
    w._on_front_end_message(w, {"type": "ping"}, [])
    w.top_k = 20
    w._on_front_end_message(w, {"type": "request", "args": {
        "prompt": "def f(x):", "max_new_tokens": 6, "seed": 42}}, [])
    assert w.error == ""
    (tokens, logits, chosen, text), dropped = page_generation(gpt, bpe, "def f(x):", 6, 0.9, 20,
                                                              0.95, 42)
    expected = SamplingWidget(tokens, logits, chosen, text, top_n=TOP_N)
    assert w.steps == expected.steps and w.prompt_tokens == tokens
    assert (w.seed, w.dropped, w.prompt, w.max_new_tokens) == (42, dropped, "def f(x):", 6)
    before = w.steps
    for args, message in [({"prompt": " \n", "max_new_tokens": 3}, "the prompt is empty"),
                          ({"prompt": "Hi", "max_new_tokens": 3, "seed": -1},
                           "seed must be between 0 and 4294967295, got -1"),
                          ({"prompt": "Hi", "max_new_tokens": 3, "seed": "1"},
                           "seed must be an int, got str"),
                          ({"prompt": "Hi", "max_new_tokens": 65}, "max_new_tokens must be")]:
        w._on_front_end_message(w, {"type": "request", "args": args}, [])
        assert message in w.error
        assert w.steps == before


def test_bad_arguments_are_clear_errors(gpt: GPT, bpe: BPETokenizer) -> None:
    with pytest.raises(TypeError, match="model must be a tfbook GPT"):
        SamplingWidget.from_page_model(torch.nn.Linear(2, 2), bpe, "Hi")
    with pytest.raises(ValueError, match=r"dtype must be one of .* got 'bfloat16'"):
        SamplingWidget.from_page_model(gpt, bpe, "Hi", dtype="bfloat16")
    with pytest.raises(ValueError, match="seed must be between 0 and 4294967295, got -1"):
        SamplingWidget.from_page_model(gpt, bpe, "Hi", seed=-1)
    with pytest.raises(ValueError, match="the prompt is empty"):
        SamplingWidget.from_page_model(gpt, bpe, "   ")
    with pytest.raises(ValueError, match="temperature must be between 0"):
        SamplingWidget.from_page_model(gpt, bpe, "Hi", temperature=3)
    with pytest.raises(ValueError, match=r"max_new_tokens must be between 1 and 64, got 0"):
        SamplingWidget.from_page_model(gpt, bpe, "Hi", max_new_tokens=0)
    big = GPT(replace(gpt.config, d_model=512, n_heads=8, n_layers=1))
    with pytest.raises(ValueError, match=r"the page model takes at least [\d,]+ bytes in "
                                         r"float32, more than the 3,000,000.*no storage type "
                                         r"fits it"):
        SamplingWidget.from_page_model(big, bpe, "Hi", dtype="float32")


def test_page_generation_without_a_tokenizer_or_model_is_a_clear_error(gpt: GPT,
                                                                          bpe: BPETokenizer
                                                                          ) -> None:
    for bad in (None, "bytes", {}):
        with pytest.raises(TypeError, match=r"tokenizer must be a tfbook BPETokenizer \(the "
                                            r"page's tokenizer; BPETokenizer\(\{\}\) for plain "
                                            rf"bytes\), got {type(bad).__name__}"):
            page_generation(gpt, bad, "Hi", 3)
    with pytest.raises(TypeError, match=r"model must be a tfbook GPT \(tfbook.models.gpt.GPT\), "
                                        r"got NoneType"):
        page_generation(None, bpe, "Hi", 3)
    logits = torch.randn(10)
    with pytest.raises(TypeError, match=r"logits must be one step's floating tensor \(V,\), got "
                                        r"a torch.float32 tensor of shape \(1, 10\)"):
        page_next_token(logits[None], 1.0, None, None, mulberry32(0))
    with pytest.raises(TypeError, match="random must be a function"):
        page_next_token(logits, 1.0, None, None, 0.5)
    with pytest.raises(ValueError, match="temperature must be between 0"):
        page_next_token(logits, -1.0, None, None, mulberry32(0))
    with pytest.raises(TypeError, match="ids must be a list of token ids, got str"):
        fit_prompt("abc", 6, 3)
    for name, args in (("max_len", (0, 3)), ("max_new_tokens", (6, -1))):
        with pytest.raises(ValueError, match=rf"{name} must be between"):
            fit_prompt([1, 2], *args)
    with pytest.raises(TypeError, match="max_len must be an int, got float"):
        fit_prompt([1, 2], 6.0, 3)


def test_the_script_makes_no_request() -> None:
    script = SamplingWidget._esm
    assert "fetch(" not in script and "XMLHttpRequest" not in script and "import(" not in script
    assert "innerHTML" not in script and "eval(" not in script


# --- Chromium: the static page generates ---------------------------------------------------

# Sets the knobs, the prompt, the number of new tokens and the seed as a reader would (input
# and change events), presses "generate in the page", then walks every step and reads what
# the page drew: the bars (ids, logits, kept, probabilities), the summary and the context.
GENERATE_JS = """async (root, [prompt, n, seed, temperature, k, p]) => {
  const control = (label) => root.querySelector(`[aria-label="${label}"]`);
  const fire = (input, value, type = "input") => {
    input.value = String(value);
    input.dispatchEvent(new Event(type, { bubbles: true }));
  };
  const check = (input, on) => {
    if (input.checked !== on) {
      input.checked = on;
      input.dispatchEvent(new Event("change", { bubbles: true }));
    }
  };
  fire(control("temperature"), temperature);
  check(control("use top-k"), k !== null);
  if (k !== null) fire(control("top-k: keep the k most likely tokens"), k);
  check(control("use top-p"), p !== null);
  if (p !== null) fire(control("top-p: keep the most likely tokens until p"), p);
  fire(control("your prompt"), prompt);
  fire(control("new tokens"), n);
  fire(control("seed"), seed);
  const status = root.querySelector(".tfw-page-status");
  const summary = root.querySelector(".tfw-summary");
  const runs = Number(status.dataset.runs);
  [...root.querySelectorAll("button")].find((b) => b.textContent === "generate in the page")
    .click();
  const error = root.querySelector(".tfw-error").textContent;
  if (Number(status.dataset.runs) === runs) return { error, runs };
  const tokens = JSON.parse(status.dataset.tokens);
  const steps = [];
  for (let s = 0; s < tokens.length; s++) {
    fire(control("step"), s + 1);
    const want = JSON.stringify([s, temperature, k, p]);
    for (const start = performance.now(); summary.dataset.settings !== want;) {
      if (performance.now() - start > 60000) {
        throw new Error(`stuck at ${summary.dataset.settings}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
    const rows = [...root.querySelectorAll(".tfw-bar")];
    steps.push({ ids: rows.map((r) => Number(r.dataset.id)),
                 logits: rows.map((r) => Number(r.dataset.logit)),
                 probs: rows.map((r) => Number(r.dataset.p)),
                 kept: rows.map((r) => r.dataset.kept === "1"),
                 keptVocab: Number(summary.dataset.keptVocab) });
  }
  return { error, runs: Number(status.dataset.runs), ids: JSON.parse(status.dataset.ids),
           tokens, steps, dropped: Number(status.dataset.dropped), stopped: status.dataset.stopped,
           ms: Number(status.dataset.ms), status: status.textContent,
           context: root.querySelector(".tfw-context").textContent };
}"""


def shown(text: str) -> str:
    """Text as the page shows it: tokenspans.js's showWhitespace, written again here."""
    for c, mark in {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍", "\u00a0": "⍽"}.items():
        text = text.replace(c, mark)
    for c in "\u200b\u200c\u200d\u2060\ufeff":
        text = text.replace(c, f"⟨{ord(c):X}⟩")
    return text


def check_run(run: dict, model: GPT, bpe: BPETokenizer, prompt: str, n: int,
              settings: tuple) -> float:
    """The page's run against Python: its prompt ids, its tokens (tfbook's generate when
    greedy, page_generation's seeded draw otherwise), and at every step its candidates,
    their logits, the kept sets (candidates and whole vocabulary) and the probabilities.
    Returns the largest logit difference."""
    seed, temperature, k, p = settings
    assert run["error"] == "", run["error"]
    ids, dropped = fit_prompt(bpe.encode_ordinary(prompt), MAX_LEN, n)
    assert run["ids"] == ids and run["dropped"] == dropped
    n_new = min(n, MAX_LEN - len(ids))
    assert len(run["tokens"]) == n_new
    assert run["stopped"] == ("max_new_tokens" if n_new == n else "context")
    (_, _, chosen, _), _ = page_generation(model, bpe, prompt, n, temperature, k, p, seed)
    assert run["tokens"] == chosen, settings  # Python's mirror of the page's sampler
    if temperature == 0:
        assert chosen == generate(model, [ids], n_new, temperature=0).new_tokens[0].tolist()
    with torch.no_grad():  # the logits before each new token, by teacher forcing
        logits = model(torch.tensor([ids + chosen[:-1]])).logits[0, len(ids) - 1:]  # (N, V)
    worst = 0.0
    for s, step in enumerate(run["steps"]):
        candidates, values, _ = next_token_candidates(logits[s], TOP_N)
        assert step["ids"] == candidates, (settings, s)
        worst = max(worst, max(abs(a - b) for a, b in zip(step["logits"], values, strict=True)))
        scores = torch.tensor(values, dtype=torch.float64)  # (N,)
        kept = filter_logits(scores, temperature, k, p) > -math.inf  # (N,)
        assert step["kept"] == kept.tolist(), (settings, s)
        assert step["probs"] == pytest.approx(kept_distribution(scores, temperature, k, p)
                                              .tolist(), abs=1e-5)
        kept_vocab = int((filter_logits(logits[s], temperature, k, p) > -math.inf).sum())
        assert step["keptVocab"] == kept_vocab, (settings, s)
    text = [token_label(bpe, i) for i in ids + chosen]
    assert run["context"] == shown("".join(text))  # the last step: the whole text
    return worst


@pytest.fixture(scope="module")
def page(browser, gpt: GPT, bpe: BPETokenizer, tmp_path_factory):
    """The widget of the float32 random GPT in a static page; the log must stay clean."""
    w = SamplingWidget.from_page_model(gpt, bpe, "The model", max_new_tokens=5, top_n=TOP_N,
                                       dtype="float32")
    folder = tmp_path_factory.mktemp("sampling_page")
    with static_widget(browser, w, ASSETS, folder) as (tab, root, log):
        yield tab, root
        assert not (log.page_errors or log.console_errors or log.foreign_requests
                    or log.dialogs), log


def test_generate_reproduces_the_saved_text(page) -> None:
    """The page opens on Python's sampled generation (temperature 1, seed 0) with its prompt,
    length and seed in the boxes: pressing generate gives the same text in the page."""
    tab, root = page
    status = root.locator(".tfw-page-status")
    expect(status).to_have_attribute("data-runs", "0")
    context = root.locator(".tfw-context")
    step = root.get_by_role("slider", name="step")
    step.focus()
    tab.keyboard.press("End")
    saved = context.text_content()
    assert saved.startswith("The␣model") and "Generated in this page" not in status.inner_text()
    root.get_by_role("button", name="generate in the page").click()
    expect(status).to_have_attribute("data-runs", "1")
    expect(status).to_contain_text("seed 0; the same settings give the same text")
    step.focus()
    tab.keyboard.press("End")
    expect(context).to_have_text(saved)


SETTINGS = [  # (seed, temperature, top_k, top_p)
    (0, 0, None, None),
    (3, 1, None, None),
    (3, 0.7, 20, None),
    (11, 1.5, None, 0.8),
    (5, 0.9, 8, 0.95),
]


def test_the_page_generates_as_python(page, gpt: GPT, bpe: BPETokenizer) -> None:
    """Static page: for greedy and seeded sampled settings, on a non-ASCII prompt and on one
    longer than the context, the page's tokens and every step's candidates and kept sets are
    Python's; the same settings give the same text twice, another seed other text."""
    _, root = page
    worst, times = 0.0, []
    prompts = {"Café crème, 中文 😀": 12, TEXT * 2: 20}
    for prompt, n in prompts.items():
        for settings in SETTINGS:
            run = root.evaluate(GENERATE_JS, [prompt, n, *settings])
            worst = max(worst, check_run(run, gpt, bpe, prompt, n, settings))
            times.append(run["ms"] / len(run["tokens"]))
    long_run = run
    assert long_run["dropped"] > 0
    assert f"its first {long_run['dropped']} tokens were dropped" in long_run["status"]
    again = root.evaluate(GENERATE_JS, [TEXT * 2, 20, *SETTINGS[-1]])
    assert again["tokens"] == long_run["tokens"] and again["runs"] == long_run["runs"] + 1
    other = [root.evaluate(GENERATE_JS, [TEXT * 2, 20, seed, *SETTINGS[-1][1:]])["tokens"]
             for seed in (6, 7)]
    assert any(tokens != long_run["tokens"] for tokens in other)  # the seed is read
    print(f"\nmax |page logit - PyTorch logit| {worst:.2e}; "
          f"ms per generated token (cache): median {sorted(times)[len(times) // 2]:.2f}")
    assert worst <= 1e-4


def test_bad_input_in_the_page(page, bpe: BPETokenizer) -> None:
    """Empty prompt, bad numbers and a lone surrogate are said in the widget, nothing runs;
    hostile text is generated from and shown literally, never as markup."""
    tab, root = page
    errors = {
        (" \n ", 5, 0): "the prompt is empty: type a few words to continue",
        ("Hi", 0, 0): 'new tokens must be an integer between 1 and 64, got "0"',
        ("Hi", 65, 0): 'new tokens must be an integer between 1 and 64, got "65"',
        ("Hi", 5, -1): 'seed must be an integer between 0 and 4294967295, got "-1"',
        ("x" * 2001, 5, 0): "the prompt has 2,001 characters; the widget takes at most 2,000",
        ("ok \ud800 no", 5, 0): "lone surrogate U+D800",
    }
    for (prompt, n, seed), message in errors.items():
        before = root.locator(".tfw-page-status").get_attribute("data-runs")
        run = root.evaluate(GENERATE_JS, [prompt, n, seed, 0, None, None])
        assert message in run["error"] and str(run["runs"]) == before, (prompt, run)
    run = root.evaluate(GENERATE_JS, [HOSTILE, 3, 0, 0, None, None])
    assert run["error"] == ""
    ids = bpe.encode_ordinary(HOSTILE)
    assert run["ids"] == ids
    assert run["context"].startswith(shown(HOSTILE))
    assert root.locator("img").count() == 0 and root.locator("script").count() == 0
    expect(root.locator(".tfw-context")).to_contain_text("<img␣src=x␣onerror=alert(1)>")
    assert not tab.evaluate("document.querySelector('body img')")


def test_the_keyboard_generates(page) -> None:
    """Type the prompt, Ctrl+Enter generates; Tab to the seed, type, Tab to the button and
    Enter generates again."""
    tab, root = page
    status = root.locator(".tfw-page-status")
    runs = int(status.get_attribute("data-runs"))
    prompt = root.get_by_role("textbox", name="your prompt")
    prompt.focus()
    tab.keyboard.press("Control+a")
    tab.keyboard.type("def f(x):")
    tab.keyboard.press("Control+Enter")
    expect(status).to_have_attribute("data-runs", str(runs + 1))
    first = status.get_attribute("data-tokens")
    expect(root.locator(".tfw-context")).to_contain_text("def␣f(x):")
    root.get_by_role("spinbutton", name="seed").focus()
    tab.keyboard.press("Control+a")
    tab.keyboard.type("9")
    tab.keyboard.press("Tab")
    tab.keyboard.press("Enter")
    expect(status).to_have_attribute("data-runs", str(runs + 2))
    expect(status).to_contain_text("seed 9")
    assert len(json.loads(status.get_attribute("data-tokens"))) == len(json.loads(first))


# --- the book's trained model ---------------------------------------------------------------

TRAINED = ROOT / "book" / "learning" / "data" / "training_gpt"


def test_the_trained_model_in_the_page(browser, tmp_path: Path) -> None:
    """The GPT of scripts/train_gpt.py in float16: within the page budget, and the page's
    greedy and seeded generations are Python's on the de-quantised model."""
    if not (TRAINED / "model.safetensors").exists():
        pytest.skip(f"the trained model is missing: run scripts/train_gpt.py (writes {TRAINED})")
    from safetensors.torch import load_model

    from tfbook.train.corpus_lm import PROMPT, gpt_config

    tokenizer = BPETokenizer.load(TRAINED / "tokenizer.json")
    model = GPT(gpt_config(tokenizer.vocab_size)).eval()
    load_model(model, str(TRAINED / "model.safetensors"))
    w = SamplingWidget.from_page_model(model, tokenizer, PROMPT, max_new_tokens=12,
                                       top_n=TOP_N, dtype="float16", temperature=0)
    size = len(widget_state(w).encode())
    print(f"\ntrained model widget state: {size / 1e6:.3f} MB")
    assert size < MAX_PAGE_MODEL_BYTES
    reference = quantised_reference(model, "float16")
    with static_widget(browser, w, ASSETS, tmp_path) as (_, root, log):
        for settings in [(0, 0, None, None), (1, 0.8, 20, 0.9)]:
            run = root.evaluate(GENERATE_JS, [PROMPT, 20, *settings])
            worst = check_run(run, reference, tokenizer, PROMPT, 20, settings)
            assert worst <= 1e-4
            print(f"{settings}: {tokenizer.decode(run['tokens'])!r}, {run['ms']:.0f} ms")
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log
