"""The attention-map widget: data from attention weights, live runs, safe text, responsiveness."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.browser import (
    WIDGET_SNAPSHOT_JS,
    serve,
    static_widget,
    wait_for_new_snapshot,
    watch,
    widget_page,
)
from tests.conftest import ASSETS
from tfbook.widgets.attention import AttentionExample, AttentionMap

HOSTILE = "<img src=x onerror=alert(1)>"


def random_weights(*shape: int) -> torch.Tensor:
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(0)), -1)


def test_maps_are_stored_as_quantised_bytes_in_order() -> None:
    w = random_weights(2, 3, 4, 4)
    m = AttentionMap(AttentionExample("s", list("abcd"), w))
    raw = np.frombuffer(base64.b64decode(m.data), dtype=np.uint8).reshape(2, 3, 4, 4)
    assert np.abs(raw / 255 - w.numpy()).max() <= 0.5 / 255 + 1e-6
    assert m.examples[0] == {"name": "s", "tokens": list("abcd"), "keys": list("abcd"),
                             "cross": False, "shape": [2, 3, 4, 4]}


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
        root.wait_for(timeout=30000)
        assert root.locator(".tfw-grid canvas").count() == 6 * 12
        before = root.evaluate(WIDGET_SNAPSHOT_JS)
        start = time.perf_counter()
        root.locator("input[type=range]").nth(1).focus()
        page.keyboard.press("ArrowRight")  # next head: grid, map and strips redraw
        after_key = root.evaluate(WIDGET_SNAPSHOT_JS)
        key_seconds = time.perf_counter() - start
        assert after_key != before
        big = root.locator("canvas").first.bounding_box()
        page.mouse.move(big["x"] + 5, big["y"] + big["height"] - 2)  # the last query: HOSTILE
        wait_for_new_snapshot(root, after_key)
        assert HOSTILE.replace(" ", "␣") in root.inner_text()
        assert root.locator("img").count() == 0
        page.close()
    assert key_seconds < 2.0, f"a head change took {key_seconds:.2f} s at 128 tokens"
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
