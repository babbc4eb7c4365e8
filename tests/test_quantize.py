"""Weight quantisation in blocks (tfbook/quantize.py): parity with llama.cpp's GGUF formats
(the `gguf` package's reference quantisers, Q8_0 and Q4_1), the rounding bound, the sizes,
and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from tfbook.quantize import quantise


def weights(rows: int = 16, cols: int = 128, seed: int = 0) -> torch.Tensor:
    """Gaussian weights with a few outliers, as trained matrices have."""
    g = torch.Generator().manual_seed(seed)
    w = 0.05 * torch.randn(rows, cols, generator=g)
    w[torch.rand(rows, cols, generator=g) < 0.01] *= 8
    return w


@pytest.mark.parametrize("kind, bits, scheme", [
    (GGMLQuantizationType.Q8_0, 8, "absmax"),
    (GGMLQuantizationType.Q4_1, 4, "zero_point"),
])
def test_blocks_of_32_with_float16_scales_are_ggufs(kind, bits: int, scheme: str) -> None:
    w = weights()
    ours = quantise(w, bits, block=32, scheme=scheme, scale_dtype=torch.float16).values
    theirs = dequantize(quantize(w.numpy(), kind), kind)
    assert np.array_equal(ours.numpy(), theirs)


@pytest.mark.parametrize("scheme", ["absmax", "zero_point"])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block", [None, 64, 32, 8])
def test_every_weight_moves_by_at_most_half_a_step(scheme: str, bits: int, block) -> None:
    w = weights()
    q = quantise(w, bits, block, scheme)
    blocks = (q.values - w).abs().reshape(q.codes.shape)  # (R, B, n)
    assert bool((blocks <= q.step_bound * (1 + 1e-5) + 1e-9).all())
    levels = 2 ** bits - 1 if scheme == "zero_point" else 2 ** bits - 2
    assert int(q.codes.max() - q.codes.min()) <= levels


def test_smaller_blocks_never_have_a_larger_bound() -> None:
    """A block's largest |w| is at most its row's: the bound of every weight can only shrink
    when a row is cut into blocks."""
    w = weights()
    row = quantise(w, 4, None).step_bound  # (R, 1, 1)
    for block in (64, 32, 8):
        assert bool((quantise(w, 4, block).step_bound <= row).all())


def test_zero_point_step_is_at_most_absmaxs() -> None:
    """(max - min) / (2^b - 1) <= 2 max|w| / (2^b - 1) < max|w| / (2^(b-1) - 1)."""
    w = weights()
    for bits in (4, 8):
        a = quantise(w, bits, 32, "absmax").step_bound
        z = quantise(w, bits, 32, "zero_point").step_bound
        assert bool((z < a).all())


def test_bits_per_weight() -> None:
    w = weights()
    assert quantise(w, 8, 32, scale_dtype=torch.float16).bits_per_weight == 8.5  # Q8_0
    assert quantise(w, 4, 32, "zero_point", torch.float16).bits_per_weight == 5.0  # Q4_1
    assert quantise(w, 8, None).bits_per_weight == 8 + 32 / 128  # a float32 scale per row


def test_a_zero_block_stays_zero() -> None:
    w = torch.zeros(2, 64)
    for scheme in ("absmax", "zero_point"):
        assert torch.equal(quantise(w, 4, 32, scheme).values, w)


@pytest.mark.parametrize("args, error, message", [
    ((torch.zeros(4), 8), TypeError, r"2-D float tensor \(R, K\), got torch.Size\(\[4\]\)"),
    ((torch.zeros(2, 4, dtype=torch.int64), 8), TypeError, "2-D float tensor"),
    (([[1.0]], 8), TypeError, "got list"),
    ((torch.tensor([[1.0, float("nan")]]), 8), ValueError, "NaN or infinite"),
    ((torch.zeros(2, 64), 1), ValueError, "bits must be an int from 2 to 8, got 1"),
    ((torch.zeros(2, 64), 8.0), ValueError, "bits must be an int from 2 to 8, got 8.0"),
    ((torch.zeros(2, 64), 8, 48), ValueError, "divides the row length 64, got 48"),
    ((torch.zeros(2, 64), 8, 0), ValueError, "divides the row length 64, got 0"),
    ((torch.zeros(2, 64), 8, 32, "nf4"), ValueError, "scheme must be one of"),
    ((torch.zeros(2, 64), 8, 32, "absmax", torch.bfloat16), ValueError, "scale_dtype"),
])
def test_bad_input_is_a_clear_error(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        quantise(*args)
