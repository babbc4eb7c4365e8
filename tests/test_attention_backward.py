"""The hand-derived backward passes pass gradcheck (float64) and equal autograd's."""

import torch
from torch.autograd import gradcheck

from tfbook.attention import scaled_dot_product_attention
from tfbook.attention_backward import (
    AttentionFunction,
    LayerNormFunction,
    SelfAttentionFunction,
    attention_manual_backward,
    layer_norm_manual_backward,
)
from tfbook.masks import causal_mask, combine_masks, padding_mask
from tfbook.normalization import layer_norm

B, H, T, S, D, C = 2, 3, 5, 4, 6, 8


def leaf(*shape: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(True)


def test_attention_gradcheck_with_and_without_mask():
    q, k, v = leaf(B, H, T, D, seed=0), leaf(B, H, S, D, seed=1), leaf(B, H, S, D, seed=2)
    assert gradcheck(AttentionFunction.apply, (q, k, v, None))
    mask = padding_mask(torch.tensor([4, 2]), S)  # (B, 1, 1, S)
    assert gradcheck(AttentionFunction.apply, (q, k, v, mask))


def test_attention_backward_equals_autograd():
    q, k, v = leaf(B, H, T, D, seed=3), leaf(B, H, T, D, seed=4), leaf(B, H, T, D, seed=5)
    mask = combine_masks(causal_mask(T), padding_mask(torch.tensor([5, 3]), T))
    grad_y = torch.randn(B, H, T, D, dtype=torch.float64)
    ours = torch.autograd.grad(attention_manual_backward(q, k, v, mask), (q, k, v), grad_y)
    reference = scaled_dot_product_attention(q, k, v, mask)[0]
    theirs = torch.autograd.grad(reference, (q, k, v), grad_y)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def test_self_attention_weight_and_input_gradients():
    x = leaf(B, T, C, seed=6)
    w_q, w_k, w_v = leaf(C, D, seed=7), leaf(C, D, seed=8), leaf(C, D, seed=9)
    mask = causal_mask(T)
    assert gradcheck(SelfAttentionFunction.apply, (x, w_q, w_k, w_v, mask))
    grad_y = torch.randn(B, T, D, dtype=torch.float64)
    inputs = (x, w_q, w_k, w_v)
    ours = torch.autograd.grad(SelfAttentionFunction.apply(*inputs, mask), inputs, grad_y)
    reference = scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, mask)[0]
    theirs = torch.autograd.grad(reference, inputs, grad_y)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def test_layer_norm_gradcheck_and_equals_autograd():
    x = leaf(B, T, C, seed=10)
    w, b = leaf(C, seed=11), leaf(C, seed=12)
    assert gradcheck(LayerNormFunction.apply, (x, w, b, 1e-5))
    grad_y = torch.randn(B, T, C, dtype=torch.float64)
    ours = torch.autograd.grad(layer_norm_manual_backward(x, w, b), (x, w, b), grad_y)
    theirs = torch.autograd.grad(layer_norm(x, w, b), (x, w, b), grad_y)
    for a, b_ in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b_, atol=1e-12)
