"""MultiHeadLatentAttention: equal to Hugging Face's DeepSeek-V3 attention, cached decoding
equal to the full forward, the absorbed form equal to the naive one, the cache's size."""

import copy

import pytest
import torch

from tfbook.attention import MultiHeadAttention
from tfbook.cache import KVCache
from tfbook.mla import LatentCache, MultiHeadLatentAttention, kv_cache_bytes_per_token

DIMS = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12)
C, H = 64, 4
U32 = 2.0 ** -24  # float32 unit roundoff


def make_mla(q_lora_rank=24, bias=False, convention="interleaved", **kwargs):
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(C, H, q_lora_rank=q_lora_rank, bias=bias,
                                   rope_convention=convention, rope_precision="float32",
                                   **DIMS, **kwargs)
    with torch.no_grad():
        for p in mla.parameters():  # random gains and biases too, not only the matrices
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 2 else 1.0))
    return mla


def rounding_bound(mla: MultiHeadLatentAttention, x: torch.Tensor) -> float:
    """A first-order float32 error bound for one output: each of the ~8 stages (projections,
    norms, scores, softmax, value mix, output projection) is a sum of at most n = C terms, and
    a sum of n float32 products errs by at most n u times the sum of their magnitudes
    (Higham, gamma_n); the magnitudes at the output are bounded by |W_O| |y|, taken in float64.
    """
    m64 = copy.deepcopy(mla).double()
    heads = {}
    m64.o_proj.register_forward_hook(lambda mod, args, out: heads.setdefault("y", args[0]))
    with torch.no_grad():
        m64(x.double())
        scale = (heads["y"].abs() @ m64.o_proj.weight.abs().T).max().item()
    n = max(C, H * DIMS["v_head_dim"])
    return 8 * n * U32 * max(scale, 1.0)


@pytest.mark.parametrize("q_lora_rank", [None, 24])
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_hf_deepseek_v3_attention(q_lora_rank, interleave, bias):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    config = DeepseekV3Config(
        hidden_size=C, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_lora_rank,
        rope_interleave=interleave, attention_bias=bias,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **DIMS)
    config._attn_implementation = "eager"
    hf = DeepseekV3Attention(config, layer_idx=0).eval()
    ours = make_mla(q_lora_rank, bias, "interleaved" if interleave else "half").eval()
    hf.load_state_dict(ours.state_dict())  # the same names: strict loading checks them all
    B, T = 2, 7
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(T)[None].expand(B, T)
    cos, sin = DeepseekV3RotaryEmbedding(config)(x, positions)
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        expected, hf_weights = hf(x, (cos, sin), mask)
        got, weights = ours(x, need_weights=True)
    bound = rounding_bound(ours, x)
    err = (got - expected).abs().max().item()
    assert err <= bound, (err, bound)
    assert torch.allclose(weights, hf_weights, atol=64 * 8 * U32, rtol=0)
    # the convention matters: the other one pairs other features into planes and misses
    other = make_mla(q_lora_rank, bias, "half" if interleave else "interleaved").eval()
    with torch.no_grad():
        assert (other(x)[0] - expected).abs().max().item() > 100 * bound


@pytest.mark.parametrize("absorbed", [False, True])
@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_cached_decoding_equals_full_forward(absorbed, q_lora_rank):
    mla = make_mla(q_lora_rank).eval()
    x = torch.randn(2, 9, C, generator=torch.Generator().manual_seed(2))
    cache = LatentCache(max_len=9)
    with torch.no_grad():
        full, _ = mla(x)
        steps = [mla(x[:, :3], cache=cache, absorbed=absorbed)[0]]  # prefill, then 1 by 1
        steps += [mla(x[:, t : t + 1], cache=cache, absorbed=absorbed)[0] for t in range(3, 9)]
    cached = torch.cat(steps, dim=1)
    assert cache.length == 9
    assert (cached - full).abs().max().item() <= 2 * rounding_bound(mla, x)


@pytest.mark.parametrize("kernel", ["reference", "torch"])
@pytest.mark.parametrize("convention", ["interleaved", "half"])
def test_absorbed_equals_naive(kernel, convention):
    mla = make_mla(24, bias=True, convention=convention, attention=kernel).eval()
    x = torch.randn(3, 6, C, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        naive, _ = mla(x)
        absorbed, _ = mla(x, absorbed=True)
        naive_w = mla(x, need_weights=True)[1]
        absorbed_w = mla(x, absorbed=True, need_weights=True)[1]
    assert (absorbed - naive).abs().max().item() <= 2 * rounding_bound(mla, x)
    assert torch.allclose(absorbed_w, naive_w, atol=64 * 8 * U32, rtol=0)
    # and in float64 the two agree to float64 rounding: the same function
    m64 = copy.deepcopy(mla).double()
    with torch.no_grad():
        diff = (m64(x.double())[0] - m64(x.double(), absorbed=True)[0]).abs().max().item()
    assert diff < 1e-10


def test_cache_bytes_per_token_measured():
    T = 5
    mla = make_mla(None).eval()
    cache = LatentCache(max_len=16)
    with torch.no_grad():
        mla(torch.randn(1, T, C), cache=cache)
    stored = sum(t[:, :, : cache.length].numel() * t.element_size()
                 for t in (cache.latent, cache.rope_key))  # from the tensors themselves
    assert stored == cache.memory_bytes()
    assert stored / T == kv_cache_bytes_per_token(
        "mla", dtype=torch.float32, kv_lora_rank=16, qk_rope_head_dim=4)
    for n_kv_heads, kind in ((H, "mha"), (1, "gqa"), (2, "gqa")):
        mha = MultiHeadAttention(C, H, n_kv_heads=n_kv_heads, rope_base=10000.0).eval()
        kv = KVCache(1, 16)
        with torch.no_grad():
            mha(torch.randn(1, T, C), causal=True, cache=kv[0])
        layer = kv[0]
        stored = sum(t[:, :, :T].numel() * t.element_size() for t in (layer.keys, layer.values))
        assert stored / T == kv_cache_bytes_per_token(
            kind, dtype=torch.float32, n_heads=H, n_kv_heads=n_kv_heads, head_size=C // H)
    # DeepSeek-V3's shapes (128 heads of 128, r = 512, d_R = 64) per layer in bfloat16
    assert kv_cache_bytes_per_token("mla", kv_lora_rank=512, qk_rope_head_dim=64) == 1152
    assert kv_cache_bytes_per_token("mha", n_heads=128, head_size=128) == 65536


@pytest.mark.parametrize("kwargs, words", [
    (dict(kv_lora_rank=65), "kv_lora_rank=65 is larger than the width d_model=64"),
    (dict(q_lora_rank=100), "q_lora_rank=100 is larger than the width"),
    (dict(v_head_dim=0), "v_head_dim must be a positive int, got 0"),
    (dict(qk_nope_head_dim=-2), "qk_nope_head_dim must be a positive int"),
    (dict(q_lora_rank=0), "q_lora_rank must be a positive int"),
    (dict(qk_rope_head_dim=3), "qk_rope_head_dim must be even"),
    (dict(rope_convention="sideways"), "rope_convention must be one of"),
    (dict(attention="flash"), "attention must be one of"),
])
def test_bad_settings(kwargs, words):
    settings = dict(d_model=C, n_heads=H, q_lora_rank=None, **DIMS) | kwargs
    with pytest.raises(ValueError, match=words):
        MultiHeadLatentAttention(**settings)


def test_bad_input():
    mla = make_mla(None)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 64\)"):
        mla(torch.randn(1, 3, 32))
    with pytest.raises(TypeError, match="dtype"):
        mla(torch.randn(1, 3, C, dtype=torch.float64))
    with pytest.raises(TypeError, match="LatentCache"):
        mla(torch.randn(1, 3, C), cache=KVCache(1, 8)[0])
    with pytest.raises(ValueError, match="at most 4 positions"):
        mla(torch.randn(1, 5, C), cache=LatentCache(4))
    with pytest.raises(ValueError, match="attention must be one of"):
        kv_cache_bytes_per_token("mqa", n_heads=1, head_size=8)
    with pytest.raises(ValueError, match="needs kv_lora_rank as a positive int"):
        kv_cache_bytes_per_token("mla", qk_rope_head_dim=64)
