"""The widget foundation: data computed in Python, requests from the front end, safe text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.browser import WIDGET_SNAPSHOT_JS, static_widget, wait_for_new_snapshot
from tests.conftest import ASSETS
from tfbook.positional import sinusoidal_encoding
from tfbook.widgets import PositionalEncodingExplorer
from tfbook.widgets.base import bundle

HOSTILE = "<img src=x onerror=alert(1)>"


def test_explorer_data_is_the_package_table() -> None:
    w = PositionalEncodingExplorer(n_positions=12, d_model=16)
    table = torch.tensor(w.table)
    assert table.shape == (12, 16)
    assert torch.allclose(table, sinusoidal_encoding(12, 16), atol=1e-4)  # rounded to 4 digits
    assert w.labels == [str(t) for t in range(12)]


def test_labels_set_the_number_of_positions() -> None:
    w = PositionalEncodingExplorer(labels=["The", " cat", " sat"], d_model=8, position=7)
    assert len(w.table) == 3 and w.position == 2  # the position is clamped


def test_the_front_end_can_ask_python_for_new_data() -> None:
    w = PositionalEncodingExplorer(n_positions=10, d_model=8)
    assert not w.live
    w._on_front_end_message(w, {"type": "ping"}, [])
    assert w.live
    w._on_front_end_message(w, {"type": "request", "args": {"d_model": 32, "base": 100.0}}, [])
    assert (len(w.table[0]), w.d_model, w.base, w.error) == (32, 32, 100.0, "")
    assert torch.allclose(torch.tensor(w.table), sinusoidal_encoding(10, 32, 100.0), atol=1e-4)


@pytest.mark.parametrize("args, message", [
    ({"d_model": 7}, "d_model must be even"),
    ({"d_model": "wide"}, "d_model must be a positive int, got 'wide'"),
    ({"base": 0.5}, "base must be greater than 1, got 0.5"),
])
def test_a_bad_request_is_reported_not_applied(args: dict, message: str) -> None:
    w = PositionalEncodingExplorer(n_positions=10, d_model=8)
    w._on_front_end_message(w, {"type": "request", "args": args}, [])
    assert message in w.error
    assert len(w.table[0]) == 8  # the old data stays


def test_bad_constructor_arguments_raise() -> None:
    with pytest.raises(ValueError, match="d_model must be even and at most 512, got 5"):
        PositionalEncodingExplorer(d_model=5)


def test_every_widget_script_is_shipped_and_bundled_with_the_helpers() -> None:
    script = bundle("positions.js")
    assert "function el(" in script and "export default { render }" in script
    assert "innerHTML" not in script  # data is inserted as text, never as HTML


def test_in_the_browser_without_kernel(browser, tmp_path: Path) -> None:
    """Static page: the widget renders, responds to the keyboard, and shows tokens as text."""
    labels = ["The", " cat", HOSTILE, " sat"]
    widget = PositionalEncodingExplorer(labels=labels, d_model=16, position=1)
    with static_widget(browser, widget, ASSETS, tmp_path) as (page, root, log):
        before = root.evaluate(WIDGET_SNAPSHOT_JS)
        root.locator("input[type=range]").focus()
        page.keyboard.press("ArrowRight")  # to position 2, the hostile label
        wait_for_new_snapshot(root, before)
        # displayed literally (with its spaces made visible)
        assert HOSTILE.replace(" ", "␣") in root.inner_text()
        assert root.locator("img").count() == 0  # and never parsed as HTML
        assert "static page" in root.inner_text()  # no kernel: live controls are off
        assert root.locator("button").is_disabled()
    assert not log.dialogs, f"a script ran from the data: {log.dialogs}"
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log
