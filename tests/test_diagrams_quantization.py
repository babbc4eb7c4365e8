"""The Q4_1 block diagram (tfbook/diagrams/quantization.py): every number on it is read from the
bytes (checked against gguf's own decoding), other bytes draw another picture, and each of its
two panels fits a phone's column while both sit side by side in the book's 672 px column."""

from __future__ import annotations

import re

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tfbook.checkpoints.smollm2 import smollm2_gguf_path
from tfbook.diagrams.quantization import q4_1_block
from tfbook.quantize import read_gguf_blocks


@pytest.fixture(scope="module")
def blocks() -> torch.Tensor:
    return read_gguf_blocks(smollm2_gguf_path(), ["blk.3.attn_q.weight"])[
        "blk.3.attn_q.weight"][1]


def test_every_label_is_read_from_the_bytes(blocks: torch.Tensor) -> None:
    block = blocks[7, 40:60]  # row 7, block 2
    labels = q4_1_block(block, "blk.3.attn_q.weight").shape_labels
    raw = block.numpy()
    assert [labels[f"byte.{i}"] for i in range(20)] == [f"{b:02x}" for b in raw]
    assert [int(labels[f"lo.{i}"]) for i in range(16)] == (raw[4:] & 15).tolist()
    assert [int(labels[f"hi.{i}"]) for i in range(16)] == (raw[4:] >> 4).tolist()
    values = dequantize(raw[None], GGMLQuantizationType.Q4_1)[0]
    examples = [key for key in labels if key.startswith("w.")]
    assert {"w.0", "w.16"} <= set(examples)
    for key in examples:
        assert labels[key].endswith(f"= {values[int(key[2:])]:.6g}")
    assert labels["d"].startswith(f"d = {float(raw[0:2].view('<f2')[0]):.6g},")
    assert labels["m"].startswith(f"m = {float(raw[2:4].view('<f2')[0]):.6g},")


def test_other_bytes_draw_another_picture(blocks: torch.Tensor) -> None:
    one, other = q4_1_block(blocks[7, 40:60]), q4_1_block(blocks[7, 60:80])
    assert one.shape_labels != other.shape_labels and one.svg != other.svg
    assert "blk.3.attn_q.weight" in q4_1_block(blocks[7, 40:60], "blk.3.attn_q.weight").svg


def natural_widths(d) -> list[float]:
    return [float(re.search(r'width="([\d.]+)"', svg).group(1)) for svg, _ in d._panels]


def test_fits_a_phone_and_the_book_column(blocks: torch.Tensor) -> None:
    """Side by side in the 672 px column at 1,280 px (24 px between the panels); at 390 px each
    panel's smallest legible size fits the phone's column (about 358 px) without scrolling."""
    for row in (0, 7, 100):
        d = q4_1_block(blocks[row, :20], "blk.3.attn_q.weight")
        assert len(d._panels) == 2
        assert sum(natural_widths(d)) + 24 <= 672
        for svg, _ in d._panels:
            assert float(re.search(r"min-width:([\d.]+)px", svg).group(1)) <= 350
        assert 'style="overflow-x:auto;max-width:100%' in d._repr_html_()


@pytest.mark.parametrize("args, error, message", [
    ((torch.zeros(18, dtype=torch.uint8),), ValueError,
     r"20 uint8 bytes of one Q4_1 block, got torch.uint8 \(18,\)"),
    ((torch.zeros(20),), ValueError, "got torch.float32"),
    ((bytes(20),), ValueError, "got bytes"),
    ((torch.zeros(20, dtype=torch.uint8), 3), TypeError, "name must be a str"),
])
def test_bad_input(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        q4_1_block(*args)
