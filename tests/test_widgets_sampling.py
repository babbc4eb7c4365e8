"""The next-token sampling widget: candidates and input checks in Python, live generation, and
the static page in Chromium (its sampler against tfbook.generate.sampling on a grid of
settings, the step control, the keyboard, safe text)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

from tests.browser import static_widget
from tests.conftest import ASSETS
from tfbook.generate.sampling import filter_logits, kept_distribution
from tfbook.widgets.base import bundle
from tfbook.widgets.sampling import (
    MAX_NEW_TOKENS,
    MAX_TOP_N,
    SamplingWidget,
    next_token_candidates,
    page_text,
)

HOSTILE = "</script><img src=x onerror=alert(1)>"
COMMENT = "<!--<script>"
V = 64
VOCAB = [f"t{i}" for i in range(V)]
PERCENT = "odds%3C%25"  # looks like page_text's escapes: must still show as typed
VOCAB[:7] = [" the", "\n", HOSTILE, COMMENT, "  two spaces", "end\n", PERCENT]


def random_logits(steps: int = 3, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return 2 * torch.randn(steps, V)  # (S, V)


def edge_logits() -> torch.Tensor:
    """Four steps that reach the samplers' edges. 0: random logits, 50 candidates (the default
    top_n). 1: ties at the top-k and top-p boundaries. 2: all tokens equal (probabilities 1/16,
    so the running sums hit 1 - p exactly). 3: a far tail, whose exp underflows to 0 at a low
    temperature (the token stays kept at p = 1). In 1 and 2 only 16 tokens are finite (the
    others banned, -inf): ties are compared on 16 candidates, where torch's sort keeps ties in
    order as the page does (top_p_filter's default sort is not stable beyond 16)."""
    torch.manual_seed(1)
    rows = 2 * torch.randn(4, V)  # (4, V)
    rows[1, 16:] = rows[2, 16:] = rows[3, 50:] = -math.inf
    rows[1, :16] = torch.tensor([3.0, 3.0, 1.5] + [1.0] * 5 + [0.5] * 4 + [-1.0] * 4)
    rows[2, :16] = 0.0
    rows[3, 49] = -200.0
    return rows


def fake_generate(prompt: str, max_new_tokens: int) -> tuple:
    """A stand-in model: characters as tokens, seeded random logits, greedy choice."""
    logits = random_logits(max_new_tokens, seed=len(prompt))
    return list(prompt), logits, logits.argmax(-1).tolist(), VOCAB


def test_candidates_are_the_most_likely_finite_tokens() -> None:
    logits = random_logits(1)[0]  # (V,)
    logits[logits.argmax()] = -math.inf  # a banned token is never a candidate
    ids, values, mass = next_token_candidates(logits, 10)
    expected = torch.topk(logits.double(), 10)
    assert ids == expected.indices.tolist() and values == expected.values.tolist()
    logz = torch.logsumexp(logits.double(), 0)
    assert mass == pytest.approx(sum(math.exp(v - logz) for v in values), abs=1e-12)
    few = torch.full((V,), -math.inf)
    few[[7, 3, 30]] = torch.tensor([1.0, 2.0, 1.0])
    assert next_token_candidates(few, 50) == ([3, 7, 30], [2.0, 1.0, 1.0], pytest.approx(1.0))


def test_widget_data() -> None:
    logits = random_logits(3)
    chosen = [5, 17, 39]
    w = SamplingWidget(["Hi", " there"], logits, chosen, VOCAB, top_n=12, top_k=100, step=7)
    assert (w.vocab_size, w.top_n, w.top_k, w.step, w.prompt) == (V, 12, 12, 2, "Hi there")
    for s, step in enumerate(w.steps):
        top = torch.topk(logits[s].double(), 12)
        assert step["ids"] == top.indices.tolist()
        assert step["tokens"] == [VOCAB[i] for i in top.indices]
        assert step["logits"] == pytest.approx(top.values.tolist(), abs=5e-7)  # 6 decimals
        assert step["chosen"] == chosen[s] and step["chosen_text"] == VOCAB[chosen[s]]
        assert step["chosen_rank"] == int((logits[s] > logits[s, chosen[s]]).sum())
    same = SamplingWidget([], logits.numpy(), np.array(chosen), VOCAB.__getitem__, top_n=12)
    assert same.steps == w.steps  # NumPy arrays, and token_text as a function


@pytest.mark.parametrize("change, error, message", [
    ({"step_logits": random_logits().masked_fill(torch.eye(3, V, dtype=torch.bool), math.nan)},
     ValueError, "must not contain NaN: step 0, token 0"),
    ({"step_logits": random_logits().index_put_((torch.tensor(2), torch.tensor(9)),
                                                 torch.tensor(math.inf))},
     ValueError, r"must not contain \+inf: step 2, token 9"),
    ({"step_logits": random_logits().index_fill_(0, torch.tensor(1), -math.inf)},
     ValueError, "step 1 has every logit -inf"),
    ({"step_logits": [[0.0] * V, [0.0] * (V - 1), [0.0] * V]}, ValueError, "ragged"),
    ({"step_logits": [[0.0] * V, ["x"] * V, [0.0] * V]}, TypeError, "logits must be numbers"),
    ({"step_logits": random_logits()[0]}, ValueError, r"must be \(steps, V\)"),
    ({"step_logits": torch.zeros(3, V, dtype=torch.bool)}, TypeError, "real numbers"),
    ({"step_logits": "logits"}, TypeError, "step_logits must be a"),
    ({"step_logits": torch.zeros(300, V), "chosen": [0] * 300}, ValueError, "at most 256 steps"),
    ({"chosen": [0, V, 1]}, ValueError, rf"chosen\[1\] must be between 0 and {V - 1}, got {V}"),
    ({"chosen": [0, -1, 1]}, ValueError, rf"chosen\[1\] must be between 0 and {V - 1}, got -1"),
    ({"chosen": [0, 1.0, 1]}, TypeError, r"chosen\[1\] must be an int, got float"),
    ({"chosen": [0, 1]}, ValueError, "chosen has 2 token ids but step_logits has 3 steps"),
    ({"step_logits": random_logits().index_fill_(1, torch.tensor(0), -math.inf)},
     ValueError, r"chosen\[0\] = 0 has logit -inf at step 0"),
    ({"top_n": 0}, ValueError, f"top_n must be between 1 and {MAX_TOP_N}, got 0"),
    ({"top_n": MAX_TOP_N + 1}, ValueError, f"top_n must be between 1 and {MAX_TOP_N}"),
    ({"top_n": True}, TypeError, "top_n must be an int, got bool"),
    ({"token_text": VOCAB[:-1]}, ValueError, f"token_text has {V - 1} strings but the logits "
                                             f"cover V = {V}"),
    ({"token_text": [*VOCAB[:3], 3, *VOCAB[4:]]}, TypeError, r"token_text\[3\] must be a str"),
    ({"token_text": lambda i: i}, TypeError, r"token_text\(\d+\) must return a str, got int"),
    ({"prompt_tokens": "Hi there"}, TypeError, "prompt_tokens must be a list of str, got str"),
    ({"prompt_tokens": ["Hi", b" there"]}, TypeError, r"prompt_tokens\[1\] must be a str"),
    ({"temperature": -0.1}, ValueError, "temperature must be between 0 .greedy. and 2.0"),
    ({"temperature": "hot"}, TypeError, "temperature must be a number, got str"),
    ({"top_k": 0}, ValueError, "top_k must be between 1 and 200, got 0"),
    ({"top_p": 0.0}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"generate_fn": "model"}, TypeError, "generate_fn must be callable"),
    ({"prompt": 3}, TypeError, "prompt must be a str or None, got int"),
    ({"step": "last"}, TypeError, "step must be an int, got str"),
])
def test_bad_arguments_are_clear_errors(change: dict, error: type, message: str) -> None:
    args = {"prompt_tokens": ["Hi"], "step_logits": random_logits(), "chosen": [0, 1, 2],
            "token_text": VOCAB, **change}
    with pytest.raises(error, match=message):
        SamplingWidget(**args)


def test_the_front_end_can_ask_for_a_generation() -> None:
    w = SamplingWidget.from_generate(fake_generate, "Once", max_new_tokens=3, top_n=8,
                                     temperature=0.5)
    assert w.can_run and w.prompt == "Once" and len(w.steps) == 3 and w.temperature == 0.5
    assert w.prompt_tokens == list("Once")
    w._on_front_end_message(w, {"type": "ping"}, [])
    assert w.live
    w.step = 2
    w._on_front_end_message(w, {"type": "request",
                                "args": {"prompt": "Upon a time", "max_new_tokens": 5}}, [])
    assert w.error == ""
    assert (w.prompt, w.max_new_tokens, w.step, len(w.steps)) == ("Upon a time", 5, 0, 5)
    expected = SamplingWidget(*fake_generate("Upon a time", 5), top_n=8)
    assert w.steps == expected.steps and w.prompt_tokens == list("Upon a time")


def broken_generate(prompt: str, max_new_tokens: int) -> tuple:
    prompt_tokens, logits, chosen, text = fake_generate(prompt, max_new_tokens)
    return prompt_tokens, logits.fill_(math.nan), chosen, text


@pytest.mark.parametrize("args, generate_fn, message", [
    ({"prompt": "  ", "max_new_tokens": 3}, fake_generate, "the prompt is empty"),
    ({"prompt": 7, "max_new_tokens": 3}, fake_generate, "prompt must be a str, got int"),
    ({"prompt": "x" * 2001, "max_new_tokens": 3}, fake_generate, "at most 2,000"),
    ({"prompt": "Hi", "max_new_tokens": 0}, fake_generate,
     f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got 0"),
    ({"prompt": "Hi", "max_new_tokens": "3"}, fake_generate, "max_new_tokens must be an int"),
    ({"prompt": "Hi", "max_new_tokens": 3}, lambda p, n: [p], "generate_fn must return"),
    ({"prompt": "Hi", "max_new_tokens": 3}, broken_generate, "must not contain NaN"),
    ({"prompt": "Hi", "max_new_tokens": 3}, None, "no model attached"),
])
def test_a_bad_request_is_reported_not_applied(args: dict, generate_fn, message: str) -> None:
    w = SamplingWidget(["Hi"], random_logits(), [0, 1, 2], VOCAB, generate_fn=generate_fn)
    before = w.steps
    w._on_front_end_message(w, {"type": "request", "args": args}, [])
    assert message in w.error
    assert w.steps == before and w.prompt_tokens == ["Hi"]


def test_no_raw_less_than_sign_reaches_the_page() -> None:
    """The saved state holds no "<" (so no token can open or close a script element), while
    Python keeps the real text."""
    w = SamplingWidget([HOSTILE, COMMENT], edge_logits(), [0, 2, 5, 9], VOCAB, top_n=16,
                       generate_fn=fake_generate, prompt=COMMENT + PERCENT)
    state = json.dumps({k: v for k, v in w.get_state().items() if k != "_esm"})
    assert "<" not in state
    assert page_text(HOSTILE) in state and page_text(PERCENT) in state
    assert w.steps[2]["tokens"][:7] == VOCAB[:7] and w.prompt_tokens == [HOSTILE, COMMENT]


def test_script_is_bundled_with_the_helpers() -> None:
    script = SamplingWidget._esm
    assert script.startswith(bundle("tokenspans.js").split("\n")[0])
    assert "function showWhitespace(" in script and "function keptDistribution(" in script
    assert "class PageGPT" in script  # the page model's forward pass, for from_page_model
    assert script.count("export default { render }") == 1
    assert "innerHTML" not in script
    assert not re.search("<(!--|script|/script)", script, re.IGNORECASE)  # safe in a <script>


# Sets the widget's controls as a reader would (input and change events), waits until the
# page has redrawn for those settings, and reads what it drew. One call runs a whole grid.
READ_GRID_JS = """async (root, grid) => {
  const control = (label) => root.querySelector(`input[aria-label="${label}"]`);
  const range = (input, value) => {
    input.value = String(value);
    input.dispatchEvent(new Event("input", { bubbles: true }));
  };
  const check = (input, on) => {
    if (input.checked !== on) {
      input.checked = on;
      input.dispatchEvent(new Event("change", { bubbles: true }));
    }
  };
  const summary = root.querySelector(".tfw-summary");
  const until = async (want) => {
    for (const start = performance.now(); summary.dataset.settings !== want;) {
      if (performance.now() - start > 60000) {
        throw new Error(`page stuck at ${summary.dataset.settings}, wanted ${want}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
  };
  const out = [];
  for (const [step, temperature, k, p] of grid) {
    range(control("step"), step + 1);  // the slider counts steps from 1
    range(control("temperature"), temperature);
    check(control("use top-k"), k !== null);
    if (k !== null) range(control("top-k: keep the k most likely tokens"), k);
    check(control("use top-p"), p !== null);
    if (p !== null) range(control("top-p: keep the most likely tokens until p"), p);
    await until(JSON.stringify([step, temperature, k, p]));
    const rows = [...root.querySelectorAll(".tfw-bar")];
    out.push({ probs: rows.map((r) => Number(r.dataset.p)),
               kept: rows.map((r) => r.dataset.kept === "1"),
               count: Number(summary.dataset.kept), entropy: Number(summary.dataset.entropy) });
  }
  return out;
}"""

TEMPERATURES = [0, 0.25, 0.7, 1, 1.55, 2]
TOP_KS = [None, 1, 2, 5, 16, 50]
TOP_PS = [None, 0.05, 0.25, 0.5, 0.75, 0.9, 1.0]


def test_the_page_samples_as_python_does(browser, tmp_path: Path) -> None:
    """Static page, no kernel: for every step and every setting of a grid, the kept set, the
    probabilities, the number kept and the entropy drawn by the page are those of
    tfbook.generate.sampling (filter_logits, kept_distribution) on the same candidates."""
    w = SamplingWidget(["A"], edge_logits(), [0, 2, 5, 9], VOCAB)
    assert w.steps[2]["ids"] == list(range(16))  # equal logits: candidates by id
    assert [len(s["ids"]) for s in w.steps] == [50, 16, 16, 50]
    grid = [[s, t, k, p] for s in range(4) for t in TEMPERATURES for k in TOP_KS for p in TOP_PS]
    with static_widget(browser, w, ASSETS, tmp_path) as (page, root, log):
        drawn = root.evaluate(READ_GRID_JS, grid)
    assert len(drawn) == len(grid)
    kept_counts, underflow = set(), False
    for (s, t, k, p), page_result in zip(grid, drawn, strict=True):
        candidates = torch.tensor(w.steps[s]["logits"], dtype=torch.float64)  # (N,)
        expected = kept_distribution(candidates, t, k, p)  # (N,)
        kept = filter_logits(candidates, t, k, p) > -math.inf  # (N,)
        where = f"step {s}, temperature {t}, top_k {k}, top_p {p}"
        assert page_result["kept"] == kept.tolist(), where
        assert page_result["probs"] == pytest.approx(expected.tolist(), abs=1e-6), where
        assert page_result["count"] == int(kept.sum()), where
        nonzero = expected[expected > 0]
        entropy = -float((nonzero * torch.log(nonzero)).sum())  # nats
        assert page_result["entropy"] == pytest.approx(entropy, abs=1e-6), where
        kept_counts.add((s, page_result["count"]))
        underflow |= bool((kept & (expected == 0)).any())
    # The edges were reached: top-k ties (k=1 keeps both 3.0s; k=5 keeps all eight >= 1.0),
    # top-p's "<= 1 - p" on exact sums (p=0.25 over 16 equal tokens keeps 4, not 5), and a
    # kept token with probability 0.
    assert {(1, 2), (1, 8), (2, 4), (2, 8)} <= kept_counts and underflow
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log


def context_text(prompt_tokens: list[str], w: SamplingWidget, step: int) -> str:
    """The text the page shows at `step`: prompt and chosen tokens, whitespace made visible."""
    tokens = prompt_tokens + [s["chosen_text"] for s in w.steps[:step + 1]]
    return "".join(t.replace(" ", "␣").replace("\n", "↵") for t in tokens)


def test_steps_keyboard_and_safe_text(browser, tmp_path: Path) -> None:
    """Static page: the step slider and buttons walk the generation, the keyboard drives every
    control, and hostile or blank tokens are shown literally, never run."""
    logits = random_logits(5, seed=3)
    logits[:, :7] += 6  # the hostile and whitespace tokens are the likeliest candidates
    unlikely = int(logits[4].argmin())  # the last step chose the least likely token
    chosen = [2, 1, 3, 0, unlikely]
    prompt_tokens = ["Say", " ", HOSTILE, "\n", COMMENT]
    w = SamplingWidget(prompt_tokens, logits, chosen, VOCAB, top_n=10, generate_fn=fake_generate)
    with static_widget(browser, w, ASSETS, tmp_path) as (page, root, log):
        context = root.locator(".tfw-context")
        summary = root.locator(".tfw-summary")
        chosen_bar = root.locator(".tfw-bar.tfw-chosen")
        expect(context).to_have_text(context_text(prompt_tokens, w, 0))
        expect(chosen_bar).to_have_attribute("data-id", "2")

        step = root.get_by_role("slider", name="step")
        step.focus()
        page.keyboard.press("End")
        expect(context).to_have_text(context_text(prompt_tokens, w, 4))
        expect(root.locator(".tfw-context .tfw-chosen")).to_have_text(VOCAB[unlikely])
        expect(root).to_contain_text(f"the {V}th most likely of {V}")
        expect(root).to_contain_text("It is not among the 10 candidates")
        assert chosen_bar.count() == 0
        root.get_by_role("button", name="previous step").click()
        expect(summary).to_have_attribute("data-settings", json.dumps([3, 1, None, None],
                                                                      separators=(",", ":")))
        expect(chosen_bar).to_have_attribute("data-id", "0")
        expect(root.locator(".tfw-context .tfw-chosen")).to_have_text("␣the")
        page.keyboard.press("Tab")  # from "previous" to "next"
        page.keyboard.press("Enter")
        expect(context).to_have_text(context_text(prompt_tokens, w, 4))
        step.focus()
        page.keyboard.press("Home")
        expect(context).to_have_text(context_text(prompt_tokens, w, 0))

        temperature = root.get_by_role("slider", name="temperature")
        temperature.focus()
        page.keyboard.press("Home")  # temperature 0: greedy
        expect(root).to_contain_text("0 (greedy)")
        expect(summary).to_have_attribute("data-kept", "1")
        page.keyboard.press("End")  # temperature 2
        expect(summary).to_have_attribute("data-kept", "10")
        root.get_by_role("checkbox", name="use top-k").focus()
        page.keyboard.press("Space")  # top-k on, at the slider's k = 10
        top_k = root.get_by_role("slider", name="top-k: keep the k most likely tokens")
        expect(top_k).to_be_enabled()
        top_k.focus()
        page.keyboard.press("Home")  # k = 1
        expect(summary).to_have_attribute("data-kept", "1")
        page.keyboard.press("ArrowRight")  # k = 2
        expect(summary).to_have_attribute("data-kept", "2")
        expect(root.locator(".tfw-bar.tfw-cut")).to_have_count(8)  # cut tokens stay listed
        expect(root.locator(".tfw-bar.tfw-cut .tfw-prob").first).to_contain_text("0 (cut)")
        page.keyboard.press("Shift+Tab")  # back to the top-k box: off again
        page.keyboard.press("Space")
        root.get_by_role("checkbox", name="use top-p").focus()
        page.keyboard.press("Space")  # top-p on, at the slider's p = 0.9
        root.get_by_role("slider", name="top-p").focus()
        page.keyboard.press("ArrowLeft")
        expect(summary).to_have_attribute("data-settings", "[0,2,null,0.89]")

        text = root.inner_text()
        shown = [HOSTILE.replace(" ", "␣"), COMMENT, "␣the", "↵", "␣␣two␣spaces", "end↵", PERCENT]
        assert all(s in text for s in shown), [s for s in shown if s not in text]
        assert root.locator("img").count() == 0 and root.locator("script").count() == 0
        assert "static page" in text
        assert root.get_by_role("button", name="generate in Python").is_disabled()
    assert not log.dialogs, f"a script ran from the data: {log.dialogs}"
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log


def sampling_generate(prompt: str, max_new_tokens: int, *, temperature: float,
                      top_k: int | None, top_p: float | None, seed: int) -> tuple:
    """A stand-in model that samples as it is told: seeded random logits per prompt, each
    token drawn from kept_distribution with the given knobs and a generator seeded by seed."""
    logits = random_logits(max_new_tokens, seed=len(prompt))  # (S, V)
    generator = torch.Generator().manual_seed(seed)
    chosen = [int(torch.multinomial(kept_distribution(row, temperature, top_k, top_p), 1,
                                    generator=generator)) for row in logits]
    return list(prompt), logits, chosen, VOCAB


def test_python_generates_with_the_widgets_own_knobs() -> None:
    """A generate_fn that takes the knobs gets the widget's, at build time and on every live
    request: with top-k 1 every chosen token is the most likely, and the seed box matters."""
    calls = []

    def recording(prompt: str, max_new_tokens: int, **settings) -> tuple:
        calls.append(settings)
        return sampling_generate(prompt, max_new_tokens, **settings)

    w = SamplingWidget.from_generate(recording, "Once", max_new_tokens=3, top_n=8,
                                     temperature=0.7, top_p=0.9, seed=5)
    assert w.sampler_settings == ["temperature", "top_k", "top_p", "seed"]
    assert calls == [{"temperature": 0.7, "top_k": None, "top_p": 0.9, "seed": 5}]
    w.temperature, w.top_k, w.top_p = 1.5, 1, None
    w._on_front_end_message(w, {"type": "request",
                                "args": {"prompt": "Upon a time", "max_new_tokens": 6,
                                         "seed": 9}}, [])
    assert w.error == "" and w.seed == 9
    assert calls[-1] == {"temperature": 1.5, "top_k": 1, "top_p": None, "seed": 9}
    assert [step["chosen_rank"] for step in w.steps] == [0] * 6  # never "could not have"
    w.top_k = None  # T = 1.5 over 64 tokens: another seed, another text
    texts = set()
    for seed in range(4):
        w._on_front_end_message(w, {"type": "request", "args": {
            "prompt": "Upon a time", "max_new_tokens": 6, "seed": seed}}, [])
        texts.add(tuple(step["chosen"] for step in w.steps))
    assert len(texts) > 1


def test_a_generate_fn_gets_only_the_knobs_it_takes() -> None:
    seen = []

    def temperature_only(prompt: str, max_new_tokens: int, temperature: float) -> tuple:
        seen.append(temperature)
        return fake_generate(prompt, max_new_tokens)

    w = SamplingWidget.from_generate(temperature_only, "Once", max_new_tokens=2, top_n=8,
                                     temperature=0.3)
    assert w.sampler_settings == ["temperature"] and seen == [0.3]
    w.temperature = 1.2
    w._on_front_end_message(
        w, {"type": "request", "args": {"prompt": "Hi", "max_new_tokens": 2}}, [])
    assert w.error == "" and seen == [0.3, 1.2]
    plain = SamplingWidget.from_generate(fake_generate, "Once", max_new_tokens=2, top_n=8)
    assert plain.sampler_settings == []
    with pytest.raises(ValueError, match="seed must be between 0 and 4294967295, got -1"):
        SamplingWidget.from_generate(fake_generate, "Once", seed=-1)


def test_python_says_when_it_is_done_and_answers_a_ping() -> None:
    """Every request ends with a "done" message (the page's busy state ends there), and a
    ping with "live"; a request whose args are not an object is an error, not a crash."""
    w = SamplingWidget.from_generate(fake_generate, "Once", max_new_tokens=2, top_n=8)
    sent = []
    w.send = lambda content, buffers=None: sent.append(content)
    w._on_front_end_message(w, {"type": "ping"}, [])
    w._on_front_end_message(
        w, {"type": "request", "args": {"prompt": " ", "max_new_tokens": 2}}, [])
    assert "the prompt is empty" in w.error
    w._on_front_end_message(w, {"type": "request", "args": ["Hi", 2]}, [])
    assert "a request's args must be an object, got list" in w.error
    assert sent == [{"type": "live"}, {"type": "done"}, {"type": "done"}]


@pytest.mark.parametrize("settings", [
    {"temperature": 1.5, "top_k": 1, "top_p": None},
    {"temperature": 0.7, "top_k": None, "top_p": 0.9},
    {"temperature": 0.0, "top_k": None, "top_p": None},
    {"temperature": 1.2, "top_k": 5, "top_p": 0.8},
])
def test_a_real_model_samples_what_the_widget_keeps(settings: dict) -> None:
    """tfbook's generate behind the widget, told the widget's knobs (as the decoding chapter
    uses SmolLM2): every chosen token is one the widget's own settings keep."""
    from dataclasses import replace

    from tfbook.generate.search import generate
    from tfbook.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(replace(GPTConfig.tiny(), vocab_size=V, max_len=32)).eval()

    def sampler(prompt: str, max_new_tokens: int, *, temperature: float, top_k: int | None,
                top_p: float | None, seed: int) -> tuple:
        ids = [ord(c) % V for c in prompt]
        run = generate(model, [ids], max_new_tokens, temperature=temperature, top_k=top_k,
                       top_p=top_p, keep_logits=True,
                       generator=torch.Generator().manual_seed(seed))
        chosen = run.new_tokens[0, : len(run.logits)].tolist()
        return list(prompt), torch.cat(run.logits), chosen, VOCAB

    w = SamplingWidget.from_generate(sampler, "Once upon", max_new_tokens=12, top_n=V,
                                     **settings, seed=3)
    for step in w.steps:
        kept = kept_distribution(torch.tensor(step["logits"]), w.temperature, w.top_k, w.top_p)
        assert float(kept[step["ids"].index(step["chosen"])]) > 0
