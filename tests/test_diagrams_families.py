"""The model families chapter's figures (tfbook.diagrams.families), each held against the
object it is drawn from: the masks' cells are the masks, the cache's positions are the ones
its keys hold, the arrows are the module's recorded dataflow, the router's cells and counts
are the MoE layer's, the cache widths kv_cache_bytes_per_token's and the curves
rope_inverse_frequencies'; hostile labels stay text; each fits a phone's column and the
book's, with no text overlapping in Chromium."""

from __future__ import annotations

import doctest
import importlib
import time
import xml.etree.ElementTree as ET

import pytest
import torch

from tests import diagram_helpers as helpers
from tests.diagram_helpers import SVG
from tfbook.diagrams.dataflow import check_edges
from tfbook.diagrams.diagram import PHONE_COLUMN
from tfbook.diagrams.families import (
    mla_figure,
    moe_figure,
    qk_norm_figure,
    rope_scaling_figure,
    sliding_window_figure,
)
from tfbook.diagrams.svg import SMALL

DESKTOP_COLUMN = 672.0
# the module, not the function `families` that tfbook.diagrams also exports (an
# `import tfbook.diagrams.families as m` would bind that function)
families_figures = importlib.import_module("tfbook.diagrams.families")


def qk_attention():
    from tfbook.attention import MultiHeadAttention

    torch.manual_seed(0)
    return MultiHeadAttention(32, 4, n_kv_heads=2, bias=False, rope_base=10000.0,
                              qk_norm=True).eval(), torch.randn(1, 5, 32)


def small_moe():
    from tfbook.moe import MoEFeedForward

    torch.manual_seed(0)
    return MoEFeedForward(16, 32, n_experts=6, top_k=2).eval(), torch.randn(1, 8, 16)


TOKENS = ["The", " cat", " sat", " on", " the", " mat", ".", "\n"]




def small_mla():
    from tfbook.mla import MultiHeadLatentAttention

    torch.manual_seed(0)
    return MultiHeadLatentAttention(64, 4, kv_lora_rank=16, qk_nope_head_dim=16,
                                    qk_rope_head_dim=8, v_head_dim=16).eval(), \
        torch.randn(1, 6, 64)



SCALINGS = {
    "linear ×8": {"rope_type": "linear", "factor": 8.0},
    "dynamic NTK ×8": {"rope_type": "dynamic", "factor": 8.0,
                       "original_max_position_embeddings": 8192},
    "YaRN ×8": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192},
    "Llama 3 ×8": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}
def query_latent_mla():
    from tfbook.mla import MultiHeadLatentAttention

    torch.manual_seed(0)
    return MultiHeadLatentAttention(64, 4, kv_lora_rank=16, qk_nope_head_dim=16,
                                    qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=24).eval()


HOSTILE = ["<script>", "&amp;", '"q"', "</svg>", "\u202e", " a", "\n", "x" * 30]


def drawings() -> dict[str, object]:
    moe, x = small_moe()
    mla, x_mla = small_mla()
    return {
        "sliding window": sliding_window_figure(8, 3),
        "sliding window, tokens, early step": sliding_window_figure(8, 4, decode_at=2,
                                                                    tokens=TOKENS),
        "qk norm": qk_norm_figure(*qk_attention()),
        "moe": moe_figure(moe, x, TOKENS),
        "moe, hostile tokens": moe_figure(moe, x, HOSTILE),
        "mla": mla_figure(mla, x_mla, n_kv_heads=2),
        "mla, query latent": mla_figure(query_latent_mla(), x_mla, n_kv_heads=1),
        "rope scaling": rope_scaling_figure(64, 500000.0, SCALINGS),
    }


def texts(svg: str) -> str:
    return " | ".join(helpers.svg_texts(svg))


def panels(d) -> list[str]:
    return [svg for svg, _ in d._panels]


def grid_cells(svg: str) -> list[float]:
    """The fill opacity of every grid cell (Canvas.grid's rects) of a drawing, in order."""
    out = []
    for el in ET.fromstring(svg).iter(f"{SVG}rect"):
        style = el.get("style") or ""
        if "stroke-opacity:.35" in style:
            out.append(float(style.split("fill-opacity:")[1].split(";")[0]))
    return out


# --- sliding window ---------------------------------------------------------------------------

@pytest.mark.parametrize("T, window, at", [(8, 3, None), (8, 4, 2), (6, 1, 5), (10, 5, 0)])
def test_the_masks_are_drawn_cell_by_cell_and_the_cache_is_read_back(T, window, at) -> None:
    from tfbook.masks import causal_mask
    from tfbook.sliding_window import sliding_window_mask

    d = sliding_window_figure(T, window, decode_at=at)
    at = T - 1 if at is None else at
    assert torch.equal(d.masks["causal"], causal_mask(T))
    assert torch.equal(d.masks["sliding"], sliding_window_mask(T, T, window))
    for svg, mask in zip(panels(d)[:2], (causal_mask(T), sliding_window_mask(T, T, window)),
                         strict=True):
        cells = grid_cells(svg)
        assert len(cells) == T * T
        assert [c > 0.5 for c in cells] == mask.reshape(-1).tolist()
    # what a rolling cache must hold, from the convention 0 <= p - j < window alone
    keep = window - 1
    assert d.cache["before"] == list(range(max(0, at - keep), at))
    assert d.cache["returned"] == list(range(max(0, at - keep), at + 1))
    assert d.cache["after"] == list(range(max(0, at + 1 - keep), at + 1))
    assert d.cache["returned"] == [j for j in range(T) if d.masks["sliding"][at, j]]
    words = texts(panels(d)[2])
    assert f"query at {at}" in words
    assert f"holds {len(d.cache['after'])} positions (at most window − 1 = {keep}" in words
    assert f"a full KVCache holds all {at + 1}" in words


def test_a_cache_that_keeps_too_much_is_refused(monkeypatch) -> None:
    """The cache panel is read from the cache: a cache that kept the whole window (one
    position too many) would return a key the window hides, and the figure refuses it."""
    from tfbook.sliding_window import SlidingWindowLayerCache

    plain = SlidingWindowLayerCache.__init__

    def wider(self, window: int) -> None:
        plain(self, window)
        self.window = window + 1  # keeps `window` positions instead of window - 1

    monkeypatch.setattr(SlidingWindowLayerCache, "__init__", wider)
    with pytest.raises(RuntimeError, match="the window's row reads"):
        sliding_window_figure(8, 3)


def test_sliding_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"T must be an int in \[2, 16\]"):
        sliding_window_figure(40, 3)
    with pytest.raises(ValueError, match="at least 1"):
        sliding_window_figure(8, 0)
    with pytest.raises(TypeError, match="positive integer"):
        sliding_window_figure(8, 2.5)
    with pytest.raises(ValueError, match="smaller than T"):
        sliding_window_figure(8, 8)
    with pytest.raises(ValueError, match=r"decode_at must be an int in \[0, 8\)"):
        sliding_window_figure(8, 3, decode_at=8)
    with pytest.raises(TypeError, match="list of 8 str"):
        sliding_window_figure(8, 3, tokens=["a"] * 7)


# --- QK-norm ----------------------------------------------------------------------------------

def test_qk_norm_arrows_are_the_modules_dataflow() -> None:
    """Norm after the projection and before RoPE, RoPE before the scores, V untouched: each
    arrow a dependency recorded while the module ran, every shape the module's."""
    attn, x = qk_attention()
    d = qk_norm_figure(attn, x)
    assert d.wired
    edges = set(d.edges)
    for edge in [("x", "q"), ("q", "q_norm"), ("q_norm", "q_rope"), ("q_rope", "weights"),
                 ("k", "k_norm"), ("k_norm", "k_rope"), ("k_rope", "weights"), ("x", "v"),
                 ("v", "heads"), ("weights", "heads"), ("heads", "output")]:
        assert edge in edges, edge
    assert d.flow.depends("q_rope", "q_norm") and not d.flow.depends("q_norm", "q_rope")
    for wrong in [("q_rope", "q_norm"), ("q", "q_rope"), ("v", "weights")]:
        with pytest.raises(ValueError, match="disagree with the computation"):
            check_edges([*d.edges, wrong], d.flow)
    D = attn.head_size
    assert d.shapes["gain"] == tuple(attn.q_norm.weight.shape) == (D,)
    assert d.shapes["q_norm"] == (1, 4, 5, D) and d.shapes["k_norm"] == (1, 2, 5, D)
    labels = d.shape_labels
    assert helpers.numbers(labels["q_norm"]) == (1, 4, 5, D)
    assert helpers.numbers(labels["k_norm"]) == (1, 2, 5, D)
    assert f"(D,) = ({D},)" in texts(d.svg)


def test_qk_norm_with_heads_of_another_size() -> None:
    """Qwen3's heads need not split the width (Qwen3-0.6B: 16 heads of 128 in 1,024): the
    figure reads H D from the module, C from its input."""
    from tfbook.attention import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, n_kv_heads=2, bias=False, rope_base=10000.0,
                              qk_norm=True, head_dim=16).eval()
    d = qk_norm_figure(attn, torch.randn(1, 5, 32))
    assert d.wired and d.shapes["q_norm"] == (1, 4, 5, 16) and d.shapes["gain"] == (16,)
    assert helpers.numbers(d.shape_labels["output"]) == (1, 5, 32)


def test_qk_norm_bad_input_is_refused() -> None:
    from tfbook.attention import MultiHeadAttention

    attn, x = qk_attention()
    with pytest.raises(ValueError, match="qk_norm=True and a rope_base"):
        qk_norm_figure(MultiHeadAttention(32, 4, rope_base=10000.0), x)
    with pytest.raises(ValueError, match="qk_norm=True and a rope_base"):
        qk_norm_figure(MultiHeadAttention(32, 4, qk_norm=True), x)
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        qk_norm_figure(torch.nn.Linear(2, 2), x)
    with pytest.raises(ValueError, match=r"shape \(B, T, 32\)"):
        qk_norm_figure(attn, torch.randn(1, 5, 16))


# --- mixture of experts -----------------------------------------------------------------------

@pytest.mark.parametrize("routing", ["renormalised", "selected", "unnormalised"])
def test_moe_cells_choices_and_counts_are_the_layers(routing) -> None:
    from tfbook.moe import MoEFeedForward, route

    torch.manual_seed(1)
    moe = MoEFeedForward(16, 32, n_experts=5, top_k=2, routing=routing).eval()
    x = torch.randn(1, 7, 16)
    d = moe_figure(moe, x)
    logits = moe.router(x[0])
    probs = torch.softmax(logits, -1)
    weights, chosen = route(logits, 2, routing)
    assert torch.allclose(d.probs, probs) and torch.equal(d.chosen, chosen)
    assert torch.equal(d.counts, moe.tokens_per_expert)
    assert torch.equal(d.counts, torch.bincount(chosen.reshape(-1), minlength=5))
    assert int(d.counts.sum()) == 7 * 2
    cells = grid_cells(d.svg)
    expected = (probs / probs.max()).reshape(-1).tolist()
    assert [round(c, 2) for c in cells] == [round(p * 0.75 + 0.04, 2) for p in expected]
    shown = {lb.key: lb.text for lb in d.labels if lb.key}
    for e in range(5):
        assert shown[f"count.{e}"] == str(int(d.counts[e]))
    for t in range(7):
        for w, e in zip(weights[t].tolist(), chosen[t].tolist(), strict=True):
            assert shown[f"weight.{t}.{e}"] == families_figures._weight_text(w)
    assert sum(k.startswith("weight.") for k in shown) == 7 * 2


def test_moe_bad_input_is_refused() -> None:
    moe, x = small_moe()
    with pytest.raises(TypeError, match="MoEFeedForward"):
        moe_figure(torch.nn.Linear(2, 2), x)
    with pytest.raises(ValueError, match=r"\(1, T, 16\) with 1 <= T <= 12"):
        moe_figure(moe, torch.randn(2, 8, 16))
    with pytest.raises(ValueError, match=r"\(1, T, 16\) with 1 <= T <= 12"):
        moe_figure(moe, torch.randn(1, 13, 16))
    with pytest.raises(TypeError, match="list of 8 str"):
        moe_figure(moe, x, ["a"])


# --- multi-head latent attention --------------------------------------------------------------

def test_mla_arrows_are_the_modules_dataflow_and_the_bytes_its_cache() -> None:
    from tfbook.mla import kv_cache_bytes_per_token

    mla, x = small_mla()
    d = mla_figure(mla, x, n_kv_heads=2)
    assert d.wired
    edges = set(d.edges)
    for edge in [("naive.kv_a_layernorm", "naive.cached_latent"),
                 ("naive.k_rope", "naive.cached_rope_key"),
                 ("naive.cached_latent", "naive.kv_b_proj"),
                 ("naive.kv_b_proj", "naive.weights"), ("naive.kv_b_proj", "naive.heads"),
                 ("naive.cached_rope_key", "naive.weights"),
                 ("absorbed.q_proj", "absorbed.q_latent"),
                 ("absorbed.cached_latent", "absorbed.weights"),
                 ("absorbed.cached_latent", "absorbed.heads"),
                 ("absorbed.heads", "absorbed.values"),
                 ("absorbed.values", "absorbed.output")]:
        assert edge in edges, edge
    naive = d.flows["naive"]
    # nothing reaches the scores from x but through the cache and the query
    assert not naive.depends("kv_a_layernorm", "q_proj")
    for wrong in [("kv_a_layernorm", "kv_b_proj"), ("q_rope", "cached_rope_key")]:
        drawn = [(a.removeprefix("naive."), b.removeprefix("naive.")) for a, b in d.edges
                 if a.startswith("naive.")]
        with pytest.raises(ValueError, match="disagree with the computation"):
            check_edges([*drawn, wrong], naive)
    sizes = {"mha": kv_cache_bytes_per_token("mha", dtype=torch.float32, n_heads=4,
                                             head_size=16),
             "gqa": kv_cache_bytes_per_token("gqa", dtype=torch.float32, n_kv_heads=2,
                                             head_size=16),
             "mla": kv_cache_bytes_per_token("mla", dtype=torch.float32, kv_lora_rank=16,
                                             qk_rope_head_dim=8)}
    assert d.bytes_per_token == sizes == {"mha": 512, "gqa": 256, "mla": 96}
    assert d.measured == 96
    words = texts(panels(d)[2])
    for n in sizes.values():
        assert f"{n:,} B" in words
    assert "= 24 numbers" in words and "holds 96 bytes per token" in words
    assert helpers.numbers(d.shape_labels["naive.cached"]) == (1, 1, 6, 16)
    assert helpers.numbers(d.shape_labels["absorbed.q_latent"]) == (1, 4, 6, 16)


def test_mla_with_a_query_latent() -> None:
    """DeepSeek-V2/V3 compress the queries too (q_lora_rank): the query box is W_UQ's output,
    reached from X through the query latent, and the arrows still hold."""
    d = mla_figure(query_latent_mla(), torch.randn(1, 6, 64), n_kv_heads=1)
    assert d.wired and d.flows["naive"].sources("q_proj") == {"q_a_layernorm"}
    assert "q = cQ WUQ" in texts(panels(d)[0]) and "24 wide" in texts(panels(d)[0])
    assert d.bytes_per_token == {"mha": 512, "gqa": 128, "mla": 96}
    assert max(d.phone_widths) <= PHONE_COLUMN


def test_mla_bad_input_is_refused() -> None:
    mla, x = small_mla()
    with pytest.raises(TypeError, match="MultiHeadLatentAttention"):
        mla_figure(torch.nn.Linear(2, 2), x, 2)
    with pytest.raises(ValueError, match=r"shape \(B, T, 64\) and dtype"):
        mla_figure(mla, x.double(), 2)
    with pytest.raises(ValueError, match="must divide the 4 heads"):
        mla_figure(mla, x, 3)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive int"):
        mla_figure(mla, x, 0)


# --- RoPE scaling -----------------------------------------------------------------------------

def curve_points(svg: str) -> list[list[tuple[float, float]]]:
    """The points of every 2-px polyline (the curves, then the legend's lines)."""
    out = []
    for el in ET.fromstring(svg).iter(f"{SVG}polyline"):
        if "stroke-width:2" in (el.get("style") or ""):
            out.append([tuple(float(v) for v in p.split(",")) for p in
                        el.get("points").split()])
    return out


def test_rope_curves_are_rope_inverse_frequencies() -> None:
    import math

    from tfbook.rope_scaling import rope_inverse_frequencies

    d = rope_scaling_figure(64, 500000.0, SCALINGS)
    expected = {"plain RoPE": rope_inverse_frequencies(64, 500000.0)[0]}
    for name, s in SCALINGS.items():
        length = 8 * 8192 if s["rope_type"] == "dynamic" else None
        expected[name], factor = rope_inverse_frequencies(64, 500000.0, s, length)
        assert d.attention_factor[name] == factor
        assert torch.equal(d.theta[name], expected[name])
    assert d.attention_factor["YaRN ×8"] > 1 and d.attention_factor["linear ×8"] == 1
    for panel, svg in zip(("wavelength", "stretch"), panels(d), strict=True):
        ax = d.axes[panel]
        drawn = curve_points(svg)[:len(expected)]
        for (name, theta), points in zip(expected.items(), drawn, strict=True):
            values = (2 * math.pi / theta) if panel == "wavelength" else expected[
                "plain RoPE"] / theta
            for j, ((px, py), v) in enumerate(zip(points, values.tolist(), strict=True)):
                f = math.log10(v) if ax["log"] else v
                assert abs(px - (ax["x0"] + 240 * j / 31)) < 0.06
                assert abs(py - (ax["y0"] - 150 * (f - ax["lo"]) / (ax["hi"] - ax["lo"]))) \
                    < 0.06, (panel, name, j)
    words = texts(panels(d)[0])
    assert "cos and sin × 1.21" in words and "L = 8,192" in words
    assert "dynamic NTK ×8, at T = 65,536" in words
    # the stretch: linear slows every plane 8 times, YaRN and Llama 3 the slowest only
    assert torch.allclose(expected["plain RoPE"] / expected["linear ×8"],
                          torch.full((32,), 8.0, dtype=torch.float64))
    assert float(expected["plain RoPE"][0] / expected["YaRN ×8"][0]) == 1.0


def test_rope_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="positive even head size"):
        rope_scaling_figure(63, 10000.0, SCALINGS)
    with pytest.raises(TypeError, match="a dict of 1 to 5"):
        rope_scaling_figure(64, 10000.0, {})
    with pytest.raises(ValueError, match="rope_type must be one of"):
        rope_scaling_figure(64, 10000.0, {"x": {"rope_type": "longrope", "factor": 2.0}})
    with pytest.raises(ValueError, match="factor must be > 0"):
        rope_scaling_figure(64, 10000.0, {"x": {"rope_type": "linear", "factor": 0.0}})
    with pytest.raises(TypeError, match="a RopeScaling or a rope_scaling dict"):
        rope_scaling_figure(64, 10000.0, {"x": 8.0})


# --- hostile labels, sizes, Chromium ----------------------------------------------------------

def test_hostile_labels_stay_text() -> None:
    moe, x = small_moe()
    hostile_rope = {"<b>lin</b> & \"q\"": {"rope_type": "linear", "factor": 2.0}}
    for d in [moe_figure(moe, x, HOSTILE), sliding_window_figure(8, 3, tokens=HOSTILE),
              rope_scaling_figure(16, 10000.0, hostile_rope)]:
        for svg in [d.svg, *panels(d)]:
            root = ET.fromstring(svg)  # parses: nothing broke out of its element
            assert not any(el.tag.endswith(("script", "b")) for el in root.iter())
            assert "<script" not in svg and "<b>" not in svg and "\u202e" not in svg
    words = texts(moe_figure(moe, x, HOSTILE).svg)
    assert "<script>" in words and "&amp;" in words and "\\n" in words
    assert "x" * 10 in words and "x" * 11 not in words  # cut to 10 characters
    assert '<b>lin</b> & "q"' in texts(rope_scaling_figure(16, 10000.0, hostile_rope).svg)


@pytest.fixture(scope="module")
def drawn() -> dict[str, object]:
    return drawings()


def test_drawing_is_cheap() -> None:
    start = time.process_time()
    drawings()
    assert time.process_time() - start < 5.0


def test_fits_a_phone_and_the_book_column_with_legible_text(drawn) -> None:
    for name, d in drawn.items():
        assert d.wired, name
        assert d._wide_min <= DESKTOP_COLUMN, (name, d._wide_min)
        assert max(d.phone_widths) <= PHONE_COLUMN, (name, d.phone_widths)
        for svg in [d.svg, *panels(d)]:
            sizes = [float(el.get("font-size")) for el in ET.fromstring(svg).iter(f"{SVG}text")]
            assert min(sizes) >= SMALL, name


@pytest.mark.parametrize("width", [1280, 390])
def test_no_text_overlaps_and_no_line_crosses_text_in_chromium(browser, drawn, tmp_path,
                                                                width: int) -> None:
    """Measured in Chromium by the post-training figures' check: no sideways scroll in the
    book's column at either width, text of 12 px or more, none overlapping, no line across."""
    from tests.test_diagrams_posttrain import (
        test_no_text_overlaps_and_no_line_crosses_text_in_chromium as no_overlap_in_chromium,
    )

    no_overlap_in_chromium(browser, drawn, tmp_path, width)


def test_docstring_examples() -> None:
    assert doctest.testmod(families_figures).failed == 0


if __name__ == "__main__":  # `python -m tests.test_diagrams_families OUT.html`: to look at
    import sys
    from pathlib import Path

    from tests.diagram_gallery import page

    Path(sys.argv[1]).write_text(page([("model_families", n, d) for n, d in drawings().items()]))
