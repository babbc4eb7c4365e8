"""Attention equals torch: F.scaled_dot_product_attention and nn.MultiheadAttention."""

import sys

import pytest
import torch
import torch.nn.functional as F

from tests.attention_kernels import KERNELS
from tfbook.attention import (
    MultiHeadAttention,
    attend,
    scaled_dot_product_attention,
)
from tfbook.masks import causal_mask, combine_masks, padding_mask
from tfbook.torch_reference import torch_attention

B, H, T, S, D = 3, 4, 7, 5, 8
LENGTHS = torch.tensor([5, 3, 1])  # source lengths: padded keys


def qkv(T_q: int = T, S_k: int = S, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T_q, D, generator=g)
    k = torch.randn(B, H, S_k, D, generator=g)
    v = torch.randn(B, H, S_k, D, generator=g)
    return q, k, v


@pytest.mark.parametrize("kind", ["none", "causal", "padding", "causal+padding"])
def test_sdpa_equals_torch(kind):
    S_k = T if "causal" in kind else S
    q, k, v = qkv(T, S_k)
    causal = causal_mask(T) if "causal" in kind else None
    padding = padding_mask(LENGTHS, S_k) if "padding" in kind else None
    mask = combine_masks(causal, padding)
    ours, weights = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (ours - ref).abs().max() <= 1e-6
    assert torch.allclose(weights.sum(-1), torch.ones(B, H, T), atol=1e-6)
    if mask is not None:
        assert torch.all(weights[~mask.expand_as(weights)] == 0)


def test_sdpa_is_causal_flag_equals_mask():
    q, k, v = qkv(T, T)
    ours, _ = scaled_dot_product_attention(q, k, v, causal_mask(T))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (ours - ref).abs().max() <= 1e-6


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = qkv()
    mask = torch.ones(T, S, dtype=torch.bool)
    mask[2] = False  # query 2 may see nothing
    q.requires_grad_(True)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(out[:, :, 2] == 0) and torch.all(weights[:, :, 2] == 0)
    assert not out.isnan().any()
    out.sum().backward()
    assert not q.grad.isnan().any()


def test_scaling_keeps_unit_variance():
    # q.k of unit-variance vectors has variance D; dividing by sqrt(D) brings it back to 1
    g = torch.Generator().manual_seed(0)
    D_big = 256
    q, k = torch.randn(20000, D_big, generator=g), torch.randn(20000, D_big, generator=g)
    dots = (q * k).sum(-1)
    assert abs(dots.var().item() / D_big - 1) < 0.05
    assert abs((dots / D_big**0.5).var().item() - 1) < 0.05


def make_mha(C: int = 32, H_: int = 4, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(C, H_).eval()


def test_mha_self_attention_equals_torch():
    mha = make_mha()
    ref = torch_attention(mha).eval()
    x = torch.randn(B, T, 32)
    ours, w = mha(x)
    theirs, w_avg = ref(x, x, x, need_weights=True, average_attn_weights=True)
    _, w_heads = ref(x, x, x, need_weights=True, average_attn_weights=False)
    assert (ours - theirs).abs().max() <= 1e-5
    assert w.shape == (B, 4, T, T)
    assert (w - w_heads).abs().max() <= 1e-5
    assert (w.mean(1) - w_avg).abs().max() <= 1e-5


def test_mha_cross_attention_with_key_padding_equals_torch():
    mha = make_mha(seed=1)
    ref = torch_attention(mha).eval()
    x, memory = torch.randn(B, T, 32), torch.randn(B, S, 32)
    keep = padding_mask(LENGTHS, S)  # (B, 1, 1, S), True = real token
    ours, w = mha(x, memory, mask=keep)
    key_padding = ~keep[:, 0, 0, :]  # torch.nn: True = ignore
    theirs, w_heads = ref(
        x, memory, memory, key_padding_mask=key_padding, average_attn_weights=False
    )
    assert w.shape == (B, 4, T, S)
    assert (ours - theirs).abs().max() <= 1e-5
    assert (w - w_heads).abs().max() <= 1e-5


def test_mha_causal_equals_torch_attn_mask():
    mha = make_mha(seed=2)
    ref = torch_attention(mha).eval()
    x = torch.randn(B, T, 32)
    ours, _ = mha(x, causal=True)
    theirs, _ = ref(x, x, x, attn_mask=~causal_mask(T))
    assert (ours - theirs).abs().max() <= 1e-5


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [False, True])
def test_every_kernel_equals_the_reference(kernel, causal):
    mha = make_mha(seed=3)
    mha.attention = kernel
    x = torch.randn(B, T, 32)
    mask = padding_mask(torch.tensor([7, 4, 2]), T)
    manual, w = mha(x, mask=mask, causal=causal, need_weights=True)  # weights: the reference
    fast, none = mha(x, mask=mask, causal=causal, need_weights=False)
    assert none is None and w is not None
    assert (manual - fast).abs().max() <= 1e-6


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("T_q,S_k,causal",
                         [(7, 7, True), (3, 9, True), (5, 8, False), (1, 6, True)])
def test_attend_kernels_agree_with_grouped_heads_and_masks(kernel, T_q, S_k, causal):
    # 4 query heads share 2 key/value heads; with S > T the queries are the last T positions
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, T_q, D, generator=g)
    k, v = torch.randn(2, 2, S_k, D, generator=g), torch.randn(2, 2, S_k, D, generator=g)
    mask = padding_mask(torch.tensor([S_k, S_k - 2]), S_k)  # (2, 1, 1, S)
    ref, weights = attend(q, k, v, mask, causal, need_weights=True, kernel="reference")
    out, none = attend(q, k, v, mask, causal, kernel=kernel)
    assert none is None and weights.shape == (2, 4, T_q, S_k)
    assert (out - ref).abs().max() <= 1e-6


def test_the_flash_kernel_names_its_module_when_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tfbook.flash", None)  # as if the file did not exist
    q, k, v = qkv()
    with pytest.raises(ModuleNotFoundError, match=r"tfbook\.flash is missing.*'reference' or "
                                                  r"'torch'"):
        attend(q, k, v, kernel="flash")
    out, w = attend(q, k, v, kernel="flash", need_weights=True)  # weights: the reference runs
    assert w is not None and out.shape == (B, H, T, D)


def test_bad_kernels_are_refused_by_name():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"kernel must be one of \('reference', 'torch', "
                                         r"'flash'\), got 'fused'"):
        attend(q, k, v, kernel="fused")
    with pytest.raises(ValueError, match=r"MultiHeadAttention: attention must be one of .*"
                                         r"got True"):
        MultiHeadAttention(32, 4, attention=True)
    with pytest.raises(ValueError, match=r"'flash' kernel has no dropout, got dropout_p=0.1"):
        attend(q, k, v, dropout_p=0.1, kernel="flash")


def test_attention_without_positions_is_permutation_equivariant():
    mha = make_mha(seed=4)
    x = torch.randn(B, T, 32)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(0))
    out, w = mha(x)
    out_p, w_p = mha(x[:, perm])
    assert torch.allclose(out_p, out[:, perm], atol=1e-6)
    assert torch.allclose(w_p, w[:, :, perm][:, :, :, perm], atol=1e-6)


def test_bad_inputs_name_expected_and_given():
    with pytest.raises(ValueError, match="MultiHeadAttention: d_model=30 is not divisible by "
                                         "n_heads=4"):
        MultiHeadAttention(30, 4)
    with pytest.raises(TypeError, match="positional"):  # only C and H by position
        MultiHeadAttention(32, 4, 0.1)
    mha = make_mha()
    x = torch.randn(B, T, 32)
    with pytest.raises(TypeError, match="torch.bool.*got torch.int64"):
        mha(x, mask=torch.ones(1, 1, T, T, dtype=torch.long))
    with pytest.raises(ValueError, match=r"T=7, S=7\), got shape \(1, 1, 7, 5\)"):
        mha(x, mask=torch.ones(1, 1, T, S, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"T=7, S=7\), got shape \(1, 1, 7, 5\)"):
        mha(x, mask=torch.ones(1, 1, T, S, dtype=torch.bool), need_weights=False)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 32\), got \(3, 7, 16\)"):
        mha(torch.randn(B, T, 16))
    q, k, v = qkv()
    with pytest.raises(ValueError, match="matching D and S"):
        scaled_dot_product_attention(q, k[..., :4], v)


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_fully_masked_query_gives_bias_only(need_weights):
    # a query that may see no key gets a zero head output, so out_proj returns its bias
    mha = make_mha(seed=5)
    x = torch.randn(B, T, 32)
    mask = torch.ones(1, 1, T, T, dtype=torch.bool)
    mask[..., 0, :] = False
    out, _ = mha(x, mask=mask, need_weights=need_weights)
    assert torch.allclose(out[:, 0], mha.out_proj.bias.expand(B, -1))


def test_causal_cross_attention_to_a_longer_source_fused_equals_manual():
    # queries are the last T of S positions (as with cached keys): both paths must agree
    mha = make_mha(seed=6)
    x, memory = torch.randn(B, 3, 32), torch.randn(B, 8, 32)
    manual, w = mha(x, memory, causal=True)
    fused, _ = mha(x, memory, causal=True, need_weights=False)
    assert (manual - fused).abs().max() <= 1e-6
    assert torch.all(w[:, :, 0, 6:] == 0) and torch.all(w[:, :, 2] > 0)


def test_a_two_dimensional_mask_is_refused_as_ambiguous():
    # with B == T a (B, S) key-padding mask and a (T, S) mask have the same shape: the module
    # takes only 4-D masks, so neither can be silently read as the other
    mha = make_mha()
    x = torch.randn(4, 4, 32)  # B == T == 4
    keep = torch.ones(4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"4 dimensions \(B, H, T, S\).*got \(4, 4\)"):
        mha(x, mask=keep)
    lengths = torch.tensor([4, 3, 2, 1])
    as_padding, _ = mha(x, mask=padding_mask(lengths, 4))  # (B, 1, 1, S): explicit
    as_rows, _ = mha(x, mask=causal_mask(4)[None, None])  # (1, 1, T, S): explicit
    assert not torch.allclose(as_padding, as_rows)


def test_an_input_of_another_dtype_is_refused_by_name():
    attn = MultiHeadAttention(32, 4)  # float32 weights
    with pytest.raises(TypeError, match=r"expected x of this module's dtype torch.float32 .*"
                                        r"got torch.float64"):
        attn(torch.randn(2, 5, 32, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"expected source of .*torch.float32.*got torch.float16"):
        attn(torch.randn(2, 5, 32), torch.randn(2, 3, 32, dtype=torch.float16))
    out, _ = attn.double()(torch.randn(2, 5, 32, dtype=torch.float64))  # matching: it runs
    assert out.dtype == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts for the module
        assert attn.float()(torch.randn(2, 5, 32, dtype=torch.bfloat16))[0].shape == (2, 5, 32)
