"""The RoPE widget: its data is the package's, the page's rotation equals `apply_rope`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.browser import (
    WIDGET_SNAPSHOT_JS,
    static_widget,
    wait_for_new_snapshot,
    wait_for_new_text,
)
from tests.conftest import ASSETS
from tfbook.rope import apply_rope, rope_frequencies
from tfbook.widgets.base import bundle
from tfbook.widgets.rope import RopeExplorer


def test_data_are_the_package_frequencies_and_seeded_vectors() -> None:
    w = RopeExplorer(head_size=12, base=500.0, seed=3, match=False)
    assert torch.allclose(torch.tensor(w.theta, dtype=torch.float64),
                          rope_frequencies(12, 500.0), atol=1e-8)
    assert len(w.q) == len(w.k) == 12 and w.q != w.k
    assert RopeExplorer(head_size=12, base=500.0, seed=3, match=False).q == w.q  # seeded
    same = RopeExplorer(head_size=12, seed=3, match=True)
    assert same.q == same.k


def test_scores_depend_only_on_the_offset() -> None:
    """`scores()` puts q at 0 or k at 0; any other pair of positions with that offset agrees."""
    w = RopeExplorer(head_size=8, seed=1, match=False, n_positions=20)
    offsets, scores = w.scores()
    assert offsets.tolist() == list(range(-19, 20))
    q = torch.tensor(w.q, dtype=torch.float64)
    k = torch.tensor(w.k, dtype=torch.float64)
    for i, j in [(5, 9), (11, 2), (19, 19), (0, 19)]:
        q_i = apply_rope(q[None], torch.tensor([i]))[0]
        k_j = apply_rope(k[None], torch.tensor([j]))[0]
        assert torch.allclose(q_i @ k_j, scores[offsets.tolist().index(j - i)])


def test_the_page_formula_rotating_k_alone_gives_the_same_scores() -> None:
    """What rope.js computes: sum over planes of q_n . R(m theta_n) k_n."""
    w = RopeExplorer(head_size=10, base=100.0, seed=4, match=False, n_positions=30)
    offsets, scores = w.scores()
    q = torch.tensor(w.q, dtype=torch.float64).view(5, 2)  # (planes, 2)
    k = torch.tensor(w.k, dtype=torch.float64).view(5, 2)
    angles = offsets[:, None].double() * torch.tensor(w.theta, dtype=torch.float64)  # (M, 5)
    ka = k[:, 0] * angles.cos() - k[:, 1] * angles.sin()  # (M, 5)
    kb = k[:, 0] * angles.sin() + k[:, 1] * angles.cos()
    page = (q[:, 0] * ka + q[:, 1] * kb).sum(-1)  # (M,)
    assert torch.allclose(page, scores, atol=1e-6)


def test_the_front_end_can_ask_python_for_new_vectors() -> None:
    w = RopeExplorer(head_size=8)
    w._on_front_end_message(w, {"type": "ping"}, [])
    assert w.live
    args = {"head_size": 32, "base": 100.0, "seed": 7, "match": False}
    w._on_front_end_message(w, {"type": "request", "args": args}, [])
    assert (len(w.q), len(w.theta), w.base, w.seed, w.match, w.error) == (
        32, 16, 100.0, 7, False, "")
    assert torch.allclose(torch.tensor(w.theta, dtype=torch.float64),
                          rope_frequencies(32, 100.0), atol=1e-8)


@pytest.mark.parametrize("args, message", [
    ({"head_size": 7}, "head_size must be even (RoPE rotates pairs), got 7"),
    ({"head_size": "wide"}, "head_size must be an int, got 'wide'"),
    ({"head_size": 128}, "head_size must be in [2, 64], got 128"),
    ({"base": 0.5}, "base must be a number greater than 1, got 0.5"),
    ({"seed": -1}, "seed must be in [0, 2147483647], got -1"),
    ({"match": "yes"}, "match must be True or False, got 'yes'"),
])
def test_a_bad_request_is_reported_not_applied(args: dict, message: str) -> None:
    w = RopeExplorer(head_size=8)
    before = (list(w.q), list(w.theta))
    w._on_front_end_message(w, {"type": "request", "args": args}, [])
    assert message in w.error
    assert (w.q, w.theta) == before  # the old data stay


def test_bad_constructor_arguments_raise() -> None:
    with pytest.raises(ValueError, match=r"n_positions must be in \[2, 512\], got 1"):
        RopeExplorer(n_positions=1)
    with pytest.raises(ValueError, match="head_size must be even"):
        RopeExplorer(head_size=5)


def test_the_script_is_bundled_and_inserts_no_html() -> None:
    script = bundle("rope.js")
    assert "function el(" in script and "export default { render }" in script
    assert "innerHTML" not in script


def test_in_the_browser_without_kernel(browser, tmp_path: Path) -> None:
    """Static page: keyboard and mouse move the offset; the page's score is apply_rope's."""
    w = RopeExplorer(head_size=16, seed=2, match=False, n_positions=64, query_position=0,
                     key_position=3)
    offsets, scores = w.scores()
    expected = dict(zip(offsets.tolist(), scores.tolist(), strict=True))
    with static_widget(browser, w, ASSETS, tmp_path) as (page, root, log):
        title = root.locator("div").nth(0)

        def offset_and_score() -> tuple[int, float]:
            text = title.inner_text()
            m = int(text.split("offset m = ")[1].split(",")[0])
            return m, float(title.get_attribute("data-score"))

        assert offset_and_score()[0] == 3
        before = root.evaluate(WIDGET_SNAPSHOT_JS)
        root.locator("input[type=range]").first.focus()
        page.keyboard.press("ArrowRight")  # i: 0 -> 1, so m: 3 -> 2
        wait_for_new_snapshot(root, before)
        m, score = offset_and_score()
        assert m == 2 and score == pytest.approx(expected[2], abs=1e-3)

        # "move both +1" rotates both vectors but keeps the offset, hence the score
        before = root.evaluate(WIDGET_SNAPSHOT_JS)
        root.locator("button", has_text="move both").click()
        wait_for_new_snapshot(root, before)  # the planes turn
        assert offset_and_score() == (m, score)

        # hovering the heatmap: left edge -> most negative offset, right -> most positive
        box = root.locator("canvas").bounding_box()
        for x, sign in [(box["x"] + 2, -1), (box["x"] + box["width"] - 2, 1)]:
            text = title.inner_text()
            page.mouse.move(x, box["y"] + box["height"] / 2)
            wait_for_new_text(title, text)
            m, score = offset_and_score()
            assert m * sign > 50 and score == pytest.approx(expected[m], abs=1e-3)

        # hovering the score plot sets the offset too
        plot = root.locator("svg.tfw-plot").bounding_box()
        text = title.inner_text()
        page.mouse.move(plot["x"] + plot["width"] * 0.55, plot["y"] + plot["height"] / 2)
        wait_for_new_text(title, text)
        m, score = offset_and_score()
        assert abs(m) < 20 and score == pytest.approx(expected[m], abs=1e-3)

        assert "static page" in root.inner_text()  # no kernel: live controls are off
        assert root.locator("button", has_text="recompute").is_disabled()
    assert not log.dialogs, log.dialogs
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log
