"""The BPE-merges stepper: its replayed counts and lengths against a brute-force recount, live
requests and bad input, and the static page in Chromium (steps, segmentation, safe text)."""

from __future__ import annotations

import json
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from tests.browser import WIDGET_SNAPSHOT_JS, static_widget, wait_for_new_snapshot
from tests.conftest import ASSETS
from tfbook.corpus import stdlib_corpus
from tfbook.tokenizers import GPT4_SPLIT_PATTERN, BPETokenizer, regex_split
from tfbook.tokenizers.bpe import count_pairs
from tfbook.widgets.base import bundle
from tfbook.widgets.bpe import MAX_TEXT_CHARS, BPEMergesWidget, replay_training

HOSTILE = "<img src=x onerror=alert(1)>"
TEXT = stdlib_corpus(20_000)


@pytest.fixture(scope="module")
def widget() -> BPEMergesWidget:
    return BPEMergesWidget(TEXT, vocab_size=256 + 60, sample=TEXT[:300])


def recount(tokenizer: BPETokenizer, text: str, k: int) -> Counter:
    """Pair counts after k merges, from scratch: encode every chunk with the first k merges."""
    early = tokenizer.with_merges(k)
    counts: Counter = Counter()
    for chunk, n in Counter(regex_split(text, GPT4_SPLIT_PATTERN)).items():
        for pair, c in count_pairs(early.encode(chunk)).items():
            counts[pair] += c * n
    return counts


def test_merges_are_the_trainers(widget: BPEMergesWidget) -> None:
    trained = BPETokenizer.train(TEXT, 256 + 60)
    assert widget.merges == [list(pair) for pair, _ in sorted(trained.merges.items(),
                                                              key=lambda kv: kv[1])]
    assert [top[0][2] for top in widget.top_pairs] == [s.count for s in trained.trace]


@pytest.mark.parametrize("k", [0, 1, 7, 59])
def test_top_pairs_equal_a_brute_force_recount(widget: BPEMergesWidget, k: int) -> None:
    counts = recount(widget.tokenizer, TEXT, k)
    expected = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
    assert widget.top_pairs[k] == [[a, b, c] for (a, b), c in expected]


def test_lengths_are_the_encoded_lengths(widget: BPEMergesWidget) -> None:
    for k in (0, 10, 60):
        assert widget.lengths[k] == len(widget.tokenizer.with_merges(k).encode(TEXT))
    assert all(a > b for a, b in pairwise(widget.lengths))


def test_overlapping_pairs_shorten_less_than_their_count() -> None:
    tokenizer = BPETokenizer.train("aaaa aaaa", 257)
    tops, lengths, _ = replay_training(tokenizer, "aaaa aaaa")
    assert tops[0][0] == (97, 97, 6)  # "aaaa" holds the pair aa three times ...
    assert lengths == [9, 5]  # ... but merging makes only two tokens of it


def test_examples_hold_the_pair_and_sample_is_its_bytes(widget: BPEMergesWidget) -> None:
    vocab = widget.tokenizer.vocab
    for (a, b), chunks in zip(widget.merges, widget.examples, strict=True):
        assert 0 < len(chunks) <= 4
        assert all((vocab[a] + vocab[b]) in chunk.encode() for chunk in chunks)
    assert b"".join(bytes(chunk) for chunk in widget.sample) == TEXT[:300].encode()
    assert widget.sample_text == TEXT[:300] and widget.n_bytes == len(TEXT.encode())


def test_replay_on_another_text_is_refused(widget: BPEMergesWidget) -> None:
    with pytest.raises(RuntimeError, match="was the tokenizer trained on this text"):
        replay_training(widget.tokenizer, "something else entirely")


def test_the_front_end_can_retrain() -> None:
    w = BPEMergesWidget(TEXT, vocab_size=270)
    w._on_front_end_message(w, {"type": "ping"}, [])
    assert w.live
    request = {"text": "low lower lowest " * 20, "vocab_size": 262, "pattern": "gpt2"}
    w._on_front_end_message(w, {"type": "request", "args": request}, [])
    assert w.error == ""
    assert len(w.merges) == 6 and w.pattern == "gpt2" and w.n_chars == len(request["text"])
    assert w.sample_text == request["text"]  # the sample defaults to the text
    assert w.tokenizer.merges == BPETokenizer.train(request["text"], 262,
                                                    pattern=w.tokenizer.pattern).merges


def test_an_empty_retrain_box_retrains_on_the_text_trained_on() -> None:
    """The page's retrain box starts empty (the training text does not travel to the page):
    a request without text trains the same text again, with the new settings and sample."""
    w = BPEMergesWidget(TEXT, vocab_size=270, sample=TEXT[5:40])
    assert "placeholder" in w._esm and "characters trained on now" in w._esm
    w._on_front_end_message(w, {"type": "request", "args": {
        "text": None, "vocab_size": 275, "pattern": "gpt2"}}, [])
    assert w.error == "" and w.n_chars == len(TEXT) and w.sample_text == TEXT[5:40]
    assert w.tokenizer.merges == BPETokenizer.train(TEXT, 275, pattern=w.tokenizer.pattern).merges
    assert TEXT not in json.dumps(w.get_state())  # the state holds the sample, not the text


@pytest.mark.parametrize("args, message", [
    ({"text": ""}, "the training text is empty"),
    ({"text": 7}, "text must be a str"),
    ({"text": "x" * (MAX_TEXT_CHARS["gpt4"] + 1)}, "trains on at most 200,000"),
    ({"text": "abc" * 10_000, "pattern": "lines"}, "trains on at most 10,000"),
    ({"text": "abc", "vocab_size": 256}, "vocab_size must be between 257 and 1256"),
    ({"text": "abc", "vocab_size": "big"}, "vocab_size must be an int, got 'big'"),
    ({"text": "abc", "pattern": "gpt5"}, "pattern must be one of"),
    ({"text": "abc", "sample": "s" * 1501}, "the sample must have 1 to 1500 characters"),
    ({"text": 42}, "text must be a str, got int"),
])
def test_a_bad_request_is_reported_not_applied(args: dict, message: str) -> None:
    w = BPEMergesWidget(TEXT[:2000], vocab_size=270)
    before = list(w.merges)
    w._on_front_end_message(w, {"type": "request", "args": args}, [])
    assert message in w.error
    assert w.merges == before


def test_script_is_bundled_with_the_helpers() -> None:
    script = BPEMergesWidget._esm
    assert script.startswith(bundle("tokenspans.js").split("\n")[0])
    assert "function bytesLabel(" in script and "function mergePair(" in script
    assert script.count("export default { render }") == 1
    assert "innerHTML" not in script


def test_in_the_browser_without_kernel(browser, tmp_path: Path) -> None:
    """Static page: steps by keyboard, buttons and timeline; the sample's tokens after the
    last merge are the package's encoding; hostile tokens are shown as text."""
    text = TEXT[:6000] + (" " + HOSTILE) * 200
    sample = "We merge " + HOSTILE + " and “quotes” too."
    w = BPEMergesWidget(text, vocab_size=256 + 40, sample=sample, step=0)
    with static_widget(browser, w, ASSETS, tmp_path) as (page, root, log):
        ids_shown = "(r) => [...r.querySelectorAll('.tfw-tokenline [data-id]')].map((s) => +s.dataset.id)"  # noqa: E501
        assert root.evaluate(ids_shown) == list(sample.encode())  # step 0: the bytes

        before = root.evaluate(WIDGET_SNAPSHOT_JS)
        root.locator("input[type=range]").focus()
        page.keyboard.press("End")  # the slider to the last merge
        wait_for_new_snapshot(root, before)
        assert root.evaluate(ids_shown) == w.tokenizer.encode(sample)

        root.get_by_role("button", name="previous merge").click()
        assert "Step 39 of 40" in root.inner_text()
        box = root.locator("canvas").bounding_box()
        page.mouse.move(box["x"] + 5, box["y"] + 2)  # top row of the timeline: merge 1
        assert "Step 1 of 40" in root.inner_text()

        details = root.locator(".tfw-details").last
        hint = details.inner_text()
        root.locator(".tfw-tokenline .tfw-token").nth(3).hover()
        assert details.inner_text() != hint and "token" in details.inner_text()

        assert HOSTILE.replace(" ", "␣") in root.inner_text()  # the sample's tokens, as text
        assert root.locator("img").count() == 0
        assert "static page" in root.inner_text()
        assert root.get_by_role("button", name="retrain in Python").is_disabled()
    assert not log.dialogs, f"a script ran from the data: {log.dialogs}"
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log
