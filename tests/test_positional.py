"""Sinusoidal and learned positional encodings."""

import math

import pytest
import torch

from tfbook.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    sinusoidal_encoding,
    t5_relative_bucket,
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


@pytest.mark.parametrize("H", [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 40])
def test_alibi_slopes_match_the_bloom_implementation(H):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    reference = _get_alibi_slopes(H, torch.device("cpu")).double()  # float32 there
    assert torch.allclose(alibi_slopes(H), reference, rtol=1e-6, atol=0)


def test_alibi_slopes_power_of_two_is_geometric():
    assert torch.equal(alibi_slopes(8), 2.0 ** -torch.arange(1, 9, dtype=torch.float64))


def test_alibi_slopes_refuse_bad_head_counts():
    with pytest.raises(ValueError, match="at least one head, got H=0"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="H must be an int number of heads, got float"):
        alibi_slopes(4.0)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64)])
def test_t5_buckets_match_hugging_face(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = torch.arange(-1000, 1001)
    reference = T5Attention._relative_position_bucket(
        offsets, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    ours = t5_relative_bucket(offsets, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, reference)


def test_t5_buckets_refuse_bad_input():
    with pytest.raises(TypeError, match="integer tensor, got dtype torch.float32"):
        t5_relative_bucket(torch.zeros(3))
    with pytest.raises(ValueError, match="num_buckets=2"):
        t5_relative_bucket(torch.zeros(3, dtype=torch.long), num_buckets=2)
