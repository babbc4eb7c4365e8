"""The token-boundary view: token spans against the tokenizers' own encodings, live requests
and bad input, and the static page in Chromium (example slider, hover details, safe text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import WIDGET_SNAPSHOT_JS, static_widget, wait_for_new_snapshot
from tests.conftest import ASSETS
from tfbook.corpus import stdlib_corpus, stress_lines
from tfbook.tokenizers import BPETokenizer, load_gpt2, load_minilm_wordpiece
from tfbook.widgets.tokens import MAX_EXAMPLE_CHARS, MAX_EXAMPLES, TokenView, token_spans

HOSTILE = "<img src=x onerror=alert(1)>"
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def small() -> BPETokenizer:
    return BPETokenizer.train(stdlib_corpus(20_000), 300, special_tokens=[EOT])


@pytest.mark.parametrize("line", stress_lines())
def test_spans_are_the_encoding_and_cover_the_bytes(small: BPETokenizer, line: str) -> None:
    for tokenizer in (small, load_gpt2()):
        spans = token_spans(tokenizer, line)
        assert [s[0] for s in spans] == tokenizer.encode(line, disallowed_special=())
        assert b"".join(bytes.fromhex(s[2]) for s in spans) == line.encode()
        starts = [0] + [s[4] for s in spans]
        assert [s[3] for s in spans] == starts[:len(spans)]  # contiguous, from byte 0
        for _, text, hex_bytes, *_ in spans:
            raw = bytes.fromhex(hex_bytes)
            assert text == (raw.decode() if is_utf8(raw) else None)


def is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_a_byte_level_token_can_be_part_of_a_character(small: BPETokenizer) -> None:
    spans = token_spans(small, "東")  # three bytes, no merge for them in a tiny vocabulary
    assert [(s[1], s[2]) for s in spans] == [(None, "e6"), (None, "9d"), (None, "b1")]


def test_special_tokens_only_when_allowed(small: BPETokenizer) -> None:
    text = "a" + EOT + "b"
    assert not any(s[5] for s in token_spans(small, text))  # ordinary text by default
    spans = token_spans(small, text, allowed_special={EOT})
    assert [s[5] for s in spans] == [False, True, False]
    assert spans[1][:2] == [small.special_tokens[EOT], EOT]


def test_unaligned_tokenizers_get_no_offsets() -> None:
    wordpiece = load_minilm_wordpiece()  # lowercases and adds ## prefixes
    spans = token_spans(wordpiece, "Tokenizers DIFFER")
    assert [s[1] for s in spans] == [wordpiece.id_to_token(i)
                                     for i in wordpiece.encode("Tokenizers DIFFER")]
    assert all(s[3] == s[4] == -1 for s in spans)


def test_view_data_and_live_requests(small: BPETokenizer) -> None:
    view = TokenView({"small": small, "GPT-2": load_gpt2()}, stress_lines()[:3], example=9)
    assert view.names == ["small", "GPT-2"] and view.example == 2  # clamped
    assert view.tokens[1][1] == token_spans(load_gpt2(), stress_lines()[1])
    view._on_front_end_message(view, {"type": "request", "args": {"text": "new text"}}, [])
    assert view.error == "" and view.texts[-1] == "new text" and view.example == 3
    assert view.tokens[3][0] == token_spans(small, "new text")


def test_live_examples_are_capped(small: BPETokenizer) -> None:
    view = TokenView({"small": small}, ["x"] * MAX_EXAMPLES)
    view.compute(text="newest")
    assert len(view.texts) == MAX_EXAMPLES and view.texts[-1] == "newest"


@pytest.mark.parametrize("args, message", [
    ({"text": 3}, "an example must be a str, got int"),
    ({"text": "y" * (MAX_EXAMPLE_CHARS + 1)}, "the view shows at most 4,000"),
])
def test_a_bad_request_is_reported_not_applied(small: BPETokenizer, args: dict,
                                               message: str) -> None:
    view = TokenView({"small": small}, "one line")
    view._on_front_end_message(view, {"type": "request", "args": args}, [])
    assert message in view.error
    assert view.texts == ["one line"]


def test_bad_constructor_arguments_raise(small: BPETokenizer) -> None:
    with pytest.raises(TypeError, match="non-empty mapping"):
        TokenView({}, "text")
    with pytest.raises(TypeError, match="tokenizer 'f' needs encode"):
        TokenView({"f": str.split}, "text")
    with pytest.raises(ValueError, match="expected 1 to 100 examples, got 0"):
        TokenView({"small": small}, [])


def test_in_the_browser_without_kernel(browser, small: BPETokenizer, tmp_path: Path) -> None:
    """Static page: the slider changes the example, hovering fills the details and outlines
    the overlapping tokens of the other row, and token text never becomes HTML."""
    lines = ["plain words here", "say " + HOSTILE, stress_lines()[6]]
    view = TokenView({"small": small, "GPT-2": load_gpt2()}, lines)
    with static_widget(browser, view, ASSETS, tmp_path) as (page, root, log):
        before = root.evaluate(WIDGET_SNAPSHOT_JS)
        root.locator("input[type=range]").first.focus()
        page.keyboard.press("ArrowRight")  # to the hostile example
        wait_for_new_snapshot(root, before)
        ids = root.evaluate("(r) => [...r.querySelectorAll('[data-id]')].map((s) => +s.dataset.id)")
        assert ids == small.encode(lines[1]) + load_gpt2().encode(lines[1])
        assert root.locator("img").count() == 0
        assert HOSTILE.replace(" ", "␣") in root.inner_text()

        details = root.locator(".tfw-details")
        hint = details.inner_text()
        first_gpt2 = root.locator(f"[data-id='{load_gpt2().encode(lines[1])[0]}']").last
        first_gpt2.hover()  # GPT-2's "say" overlaps the small tokenizer's first tokens
        assert details.inner_text() != hint and "GPT-2: token 1 of" in details.inner_text()
        assert root.locator(".tfw-hot").count() >= 2

        root.locator("input[type=range]").first.focus()
        page.keyboard.press("End")  # the emoji line: pieces of characters shown as hex
        assert root.locator(".tfw-partial").count() > 0
        assert "static page" in root.inner_text()
        assert root.get_by_role("button", name="tokenize in Python").is_disabled()
    assert not log.dialogs, f"a script ran from the data: {log.dialogs}"
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log


def test_one_example_the_keyboard_walks_the_tokens(browser, small: BPETokenizer,
                                                   tmp_path: Path) -> None:
    """With a single example there is no example slider: the first range input walks
    through the tokens, so the keyboard alone reaches every token's details."""
    view = TokenView({"small": small, "GPT-2": load_gpt2()}, "one example only")
    with static_widget(browser, view, ASSETS, tmp_path, "one.html") as (page, root, log):
        first = root.locator("input[type=range]").first
        assert root.locator("input[type=range]").count() == 1
        assert first.get_attribute("aria-label") == "token of the first row"
        first.focus()
        page.keyboard.press("ArrowRight")
        second = small.encode("one example only")[1]
        assert f"small: token 2 of {len(small.encode('one example only'))}, id {second}" in (
            root.locator(".tfw-details").inner_text())
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log


def test_the_example_slider_keeps_the_keyboard(browser, small: BPETokenizer,
                                               tmp_path: Path) -> None:
    """Three arrow-key presses in a row on the example slider: each one moves it."""
    view = TokenView({"small": small}, ["first", "second", "third", "fourth"])
    with static_widget(browser, view, ASSETS, tmp_path) as (page, root, log):
        root.locator("input[aria-label=example]").focus()
        for expected in (1, 2, 3):
            page.keyboard.press("ArrowRight")
            page.wait_for_function(
                "(v) => document.querySelector('input[aria-label=example]').value == v && "
                "document.activeElement === document.querySelector('input[aria-label=example]')",
                arg=expected)
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log
