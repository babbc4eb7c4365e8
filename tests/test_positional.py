"""Sinusoidal and learned positional encodings."""

import math

import pytest
import torch

from tfbook.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)


def test_table_matches_the_formula_entry_by_entry():
    T, C = 9, 8
    pe = sinusoidal_encoding(T, C)
    for pos in range(T):
        for i in range(C // 2):
            angle = pos / 10000 ** (2 * i / C)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_dot_product_depends_only_on_distance():
    # PE[p] . PE[p + k] = sum_i cos(k w_i): the same for every p
    pe = sinusoidal_encoding(200, 64).double()
    for k in (1, 5, 30):
        dots = (pe[: 200 - k] * pe[k:]).sum(-1)
        assert torch.allclose(dots, dots[0].expand_as(dots), atol=1e-5)


def test_modules_add_to_the_input_and_check_length():
    x = torch.randn(2, 5, 8)
    sin = SinusoidalPositionalEncoding(16, 8)
    assert torch.allclose(sin(x), x + sinusoidal_encoding(5, 8))
    assert len(list(sin.parameters())) == 0
    learned = LearnedPositionalEmbedding(16, 8)
    assert torch.allclose(learned(x), x + learned.weight[:5])
    with pytest.raises(ValueError, match="length 17 exceeds the model.s context length 16"):
        learned(torch.randn(1, 17, 8))
    with pytest.raises(ValueError, match="sequence length 17 exceeds"):
        sin(torch.randn(1, 17, 8))
    with pytest.raises(ValueError, match="even width C, got C=7"):
        sinusoidal_encoding(4, 7)
