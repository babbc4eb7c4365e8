"""The flash attention diagrams: labels are the kernel's tiles and the traced running softmax."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.diagram_helpers import svg_texts
from tfbook.diagrams import TileCall, flash_tiles, running_softmax
from tfbook.flash import flash_attention, online_softmax_steps, tile_map


class CountTiles(TorchDispatchMode):
    """Each tile the kernel computes calls amax once (in online_softmax_update)."""

    def __init__(self) -> None:
        super().__init__()
        self.tiles = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.tiles += func is torch.ops.aten.amax.default
        return func(*args, **(kwargs or {}))


def kernel_tiles(T: int, S: int, bq: int, bk: int, causal: bool) -> int:
    q = torch.randn(1, 1, T, 4)
    k, v = torch.randn(2, 1, 1, S, 4).unbind(0)
    with CountTiles() as counter, torch.no_grad():
        flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
    return counter.tiles


def labels(d) -> dict[str, str]:
    return d.shape_labels


@pytest.mark.parametrize("T, S, bq, bk, causal", [(192, 192, 32, 32, True),
                                                  (64, 192, 32, 32, True),
                                                  (50, 70, 16, 24, True),
                                                  (40, 64, 16, 16, False)])
def test_tiles_are_the_kernels(T, S, bq, bk, causal) -> None:
    counted = kernel_tiles(T, S, bq, bk, causal)
    d = flash_tiles([TileCall(T, S, bq, bk, causal, computed=counted)])
    lab = labels(d)
    tiles = tile_map(T, S, bq, bk, causal)
    visited = [(i, j) for i, row in enumerate(tiles) for j, s in enumerate(row) if s != "skipped"]
    # numbered 1, 2, ... in the kernel's loop order: query blocks outside, key blocks inside
    assert [lab[f"tile.{i}.{j}"] for i, j in visited] == [str(n + 1) for n in range(counted)]
    assert not any(f"tile.{i}.{j}" in lab for i, row in enumerate(tiles)
                   for j, s in enumerate(row) if s == "skipped")
    n_tiles = len(tiles) * len(tiles[0])
    assert lab["subtitle"].endswith(f": {counted} of {n_tiles} tiles computed")


def test_count_disagreeing_with_the_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="the kernel computed 20 tiles but tile_map marks 21"):
        flash_tiles([TileCall(192, 192, 32, 32, computed=20)])


def test_changing_the_call_changes_the_drawing() -> None:
    base = flash_tiles([TileCall(192, 192, 32, 32)])
    assert base.svg != flash_tiles([TileCall(160, 160, 32, 32)]).svg
    assert base.svg != flash_tiles([TileCall(192, 192, 48, 48)]).svg
    assert base.svg != flash_tiles([TileCall(192, 192, 32, 32, causal=False)]).svg
    assert labels(flash_tiles([TileCall(192, 192, 32, 32, causal=False)]))["tile.0.5"] == "6"
    assert labels(base)["tile.1.0"] == "2"  # causal: tile (0, 1) is skipped
    cached = labels(flash_tiles([TileCall(64, 192, 32, 64)]))
    assert cached["title"] == "64 queries after 128 cached keys"
    assert cached["subtitle"].startswith("blocks of 32 × 64")


def test_two_calls_keep_both_labels() -> None:
    d = flash_tiles([TileCall(192, 192, 32, 32), TileCall(64, 192, 32, 32)])
    lab = labels(d)
    assert lab["call0.tile.5.5"] == "21" and lab["call1.tile.1.5"] == "11"
    assert "full: no mask needed" in d.svg and len(d._panels) == 2


def test_running_softmax_shows_the_traced_m_and_l() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 128, generator=g, dtype=torch.float64) * 2
    steps = list(online_softmax_steps(scores, block=16))
    lab = labels(running_softmax(steps))
    for j, (_, m, denom) in enumerate(steps):
        for r in range(3):
            assert lab[f"m.{r}.{j}"] == f"{m[r].item():.2f}"
            assert lab[f"l.{r}.{j}"] == f"{denom[r].item():.1f}"
    assert lab["title"] == "one query block, 8 key blocks of 16"
    other = running_softmax(list(online_softmax_steps(scores[:2, :100], block=25)))
    assert labels(other)["title"] == "one query block, 4 key blocks of 25"
    assert "m.2.0" not in labels(other)
    # a last block shorter than the others (100 = 3 x 30 + 10) is drawn too
    assert "m.0.3" in labels(running_softmax(list(online_softmax_steps(scores[:, :100], 30))))


def natural_widths(d) -> list[float]:
    return [w + 16 for _, w in d._panels] if d._panels else [
        float(re.search(r'width="([\d.]+)"', d.svg).group(1))]


def test_fits_the_column_and_a_phone() -> None:
    """Side by side in the 672 px column at 1,280 px (24 px between panels); at 390 px each
    panel's smallest legible size fits the phone's column (about 358 px) or scrolls in its box."""
    d = flash_tiles([TileCall(192, 192, 32, 32), TileCall(64, 192, 32, 32)])
    widths = natural_widths(d)
    assert sum(widths) + 24 <= 672
    for svg, _ in d._panels:
        assert float(re.search(r"min-width:([\d.]+)px", svg).group(1)) <= 350
    # the largest grids shrink their tiles to stay within a phone's column
    big = flash_tiles([TileCall(352, 352, 32, 32, causal=False)])
    assert float(re.search(r"min-width:([\d.]+)px", big.svg).group(1)) <= 350
    steps = list(online_softmax_steps(torch.randn(4, 128, dtype=torch.float64) * 30, 16))
    table = running_softmax(steps)
    assert float(re.search(r"min-width:([\d.]+)px", table.svg).group(1)) <= 350
    for d in (flash_tiles([TileCall(192, 192, 32, 32)]), table):
        assert 'class="tfbook-diagram" style="overflow-x:auto;max-width:100%' in d._repr_html_()


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="block_q must be a positive int, got float 3.0"):
        TileCall(10, 10, 3.0, 4)
    with pytest.raises(ValueError, match="T must be a positive int, got 0"):
        TileCall(0, 10, 4, 4)
    with pytest.raises(ValueError, match="a causal call needs T <= S"):
        TileCall(12, 10, 4, 4)
    with pytest.raises(TypeError, match="causal must be a bool, got int"):
        TileCall(10, 10, 4, 4, causal=1)
    with pytest.raises(ValueError, match="at most 11 query and key blocks, got 12 x 12"):
        flash_tiles([TileCall(12, 12, 1, 1)])
    with pytest.raises(TypeError, match="non-empty list of TileCall, got list"):
        flash_tiles([])
    with pytest.raises(TypeError, match="non-empty list of TileCall, got str"):
        flash_tiles("tiles")
    steps = list(online_softmax_steps(torch.randn(3, 64, dtype=torch.float64), 8))
    with pytest.raises(TypeError, match="needs the list of"):
        running_softmax([])
    with pytest.raises(TypeError, match=r"each step must be \(end, m, l\)"):
        running_softmax([(8, 1.0, 2.0)])
    with pytest.raises(ValueError, match="at most 8 key blocks, got 9"):
        running_softmax(list(online_softmax_steps(torch.randn(3, 72), 8)))
    with pytest.raises(ValueError, match="1 to 4 queries"):
        running_softmax(list(online_softmax_steps(torch.randn(5, 64), 8)))
    with pytest.raises(ValueError, match="end every `block` entries"):
        running_softmax([steps[0], steps[2]])
    assert math.isfinite(float(steps[-1][1][0]))


def test_the_legend_says_the_numbers_are_the_order_of_computation() -> None:
    d = flash_tiles([TileCall(64, 64, 32, 32), TileCall(32, 64, 32, 32)])
    texts = svg_texts(d.svg)
    assert "numbers: the order the kernel computes" in texts
    assert texts.count("numbers: the order the kernel computes") == 1  # once, in the legend
