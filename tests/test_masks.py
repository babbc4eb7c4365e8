"""Masks: shapes, the True = may-attend convention, and combining (property-tested)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tfbook.masks import causal_mask, check_mask, combine_masks, padding_mask


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)
    for i in range(4):
        for j in range(4):
            assert bool(m[i, j]) == (j <= i)


def test_causal_mask_with_cached_keys_puts_queries_last():
    m = causal_mask(2, 5)  # queries are positions 3 and 4 of 5
    assert m.tolist() == [[True] * 4 + [False], [True] * 5]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_padding_mask_from_lengths_equals_from_bool(lengths):
    lengths_t = torch.tensor(lengths)
    S = max(lengths)
    keep = torch.tensor([[j < n for j in range(S)] for n in lengths])  # (B, S)
    from_lengths = padding_mask(lengths_t)
    assert from_lengths.shape == (len(lengths), 1, 1, S)
    assert torch.equal(from_lengths, padding_mask(keep))
    assert torch.equal(from_lengths, padding_mask(keep.long()))  # HF-style 1/0 attention_mask
    assert from_lengths.sum().item() == sum(lengths)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_combine_is_and(T, lengths):
    S = max(max(lengths), T)
    pad = padding_mask(torch.tensor(lengths), S)
    causal = causal_mask(T, S)
    both = combine_masks(causal, None, pad)
    assert both.shape == (len(lengths), 1, T, S)
    for b, n in enumerate(lengths):
        for i in range(T):
            for j in range(S):
                assert bool(both[b, 0, i, j]) == (j < n and j <= i + S - T)


def test_combine_nothing_is_none():
    assert combine_masks(None, None) is None


def test_bad_masks_raise_with_expected_and_given():
    with pytest.raises(TypeError, match=r"torch.bool.*got torch.float32"):
        check_mask(torch.ones(3, 3), 3, 3)
    with pytest.raises(ValueError, match=r"T=3, S=4\), got shape \(3, 3\)"):
        check_mask(torch.ones(3, 3, dtype=torch.bool), 3, 4)
    with pytest.raises(TypeError, match="integer tensor, got dtype torch.float32"):
        padding_mask(torch.tensor([2.0, 3.0]))
    with pytest.raises(ValueError, match=r"got shape \(1, 2, 3\)"):
        padding_mask(torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="1 <= T <= S, got T=4, S=2"):
        causal_mask(4, 2)


def test_padding_mask_refuses_lengths_outside_the_sequence():
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, S=4\], got values in \[2, 5\]"):
        padding_mask(torch.tensor([2, 5]), 4)
    with pytest.raises(ValueError, match=r"got values in \[-1, 3\]"):
        padding_mask(torch.tensor([-1, 3]), 4)
    with pytest.raises(ValueError, match="only 0/1"):
        padding_mask(torch.tensor([[1, 2, 0]]))
    with pytest.raises(ValueError, match="at least one length"):
        padding_mask(torch.tensor([], dtype=torch.long))
    with pytest.raises(TypeError, match="expects a tensor, got list"):
        padding_mask([3, 2])
