"""Sliding-window attention: the mask equals HF's, the rolling cache equals the full sequence."""

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer
from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

from tfbook.attention import attend
from tfbook.masks import causal_mask
from tfbook.sliding_window import (
    SlidingWindowKVCache,
    SlidingWindowLayerCache,
    sliding_window_mask,
)


def hf_mask(T_q, T_k, window, offset):
    """HF's sliding-window causal mask, queries at positions offset.., keys at 0.. (T_q, T_k)."""
    mask = sdpa_mask(batch_size=1, q_length=T_q, kv_length=T_k, q_offset=offset, kv_offset=0,
                     mask_function=sliding_window_causal_mask_function(window),
                     allow_is_causal_skip=False)
    return mask[0, 0]


GRID = [
    # (T_q, T_k, window, offset): square prefills shorter and longer than the window,
    # one-token decode steps before and past the window, chunks after a cached prefix
    (T, T, w, 0) for T in (1, 3, 5, 8, 13) for w in (1, 2, 3, 5, 8, 20)
] + [
    (1, S, w, S - 1) for S in (1, 2, 4, 7, 12) for w in (1, 2, 4, 6)
] + [
    (T, S, w, S - T) for T, S in ((3, 10), (4, 4), (2, 9), (6, 11)) for w in (1, 3, 5, 12)
]


@pytest.mark.parametrize("T_q, T_k, window, offset", GRID)
def test_mask_equals_hf(T_q, T_k, window, offset):
    ours = sliding_window_mask(T_q, T_k, window, offset=offset)
    assert ours.dtype == torch.bool and ours.shape == (T_q, T_k)
    assert torch.equal(ours, hf_mask(T_q, T_k, window, offset))
    if offset == T_k - T_q:  # the default offset: queries are the last T_q keys
        assert torch.equal(ours, sliding_window_mask(T_q, T_k, window))


def test_window_counts_the_query_itself():
    mask = sliding_window_mask(5, 5, window=3)
    assert mask.sum(-1).tolist() == [1, 2, 3, 3, 3]  # at most `window` keys, itself included
    assert torch.equal(sliding_window_mask(6, 6, window=6), causal_mask(6))
    assert torch.equal(sliding_window_mask(6, 6, window=1), torch.eye(6, dtype=torch.bool))


def hf_cache_keys(window, chunks, k, v):
    """The keys and values HF's sliding-window cache layer returns at each update."""
    layer, start, out = DynamicSlidingWindowLayer(window), 0, []
    for size in chunks:
        out.append(layer.update(k[:, :, start:start + size], v[:, :, start:start + size]))
        start += size
    return out


@pytest.mark.parametrize("window, chunks", [(4, [7, 1, 1, 1, 1, 2, 1]), (3, [1] * 9),
                                            (5, [2, 3, 1, 4, 1]), (1, [3, 1, 1]),
                                            (16, [5, 1, 1])])
def test_rolling_cache_equals_full_attention(window, chunks):
    torch.manual_seed(0)
    B, H, H_kv, D, N = 2, 4, 2, 8, sum(chunks)
    q = torch.randn(B, H, N, D, dtype=torch.float64)
    k = torch.randn(B, H_kv, N, D, dtype=torch.float64)
    v = torch.randn(B, H_kv, N, D, dtype=torch.float64)
    full, _ = attend(q, k, v, mask=sliding_window_mask(N, N, window))  # (B, H, N, D)
    cache, start, steps = SlidingWindowKVCache(n_layers=1, window=window), 0, []
    hf = hf_cache_keys(window, chunks, k, v)
    for size, (hf_k, hf_v) in zip(chunks, hf, strict=True):
        layer = cache[0]
        keys, values = layer.update(k[:, :, start:start + size], v[:, :, start:start + size])
        if window > 1:  # HF's slice [-window + 1:] keeps everything at window = 1 ([-0:])
            assert torch.equal(keys, hf_k) and torch.equal(values, hf_v)  # what HF returns
        assert torch.equal(layer.key_positions, torch.arange(start + size - keys.size(-2),
                                                             start + size))
        assert torch.equal(keys, k[:, :, layer.key_positions])
        assert layer.stored <= window - 1 and layer.keys.size(-2) == layer.stored
        assert cache.memory_bytes() == 2 * B * H_kv * D * layer.stored * 8
        out, _ = attend(q[:, :, start:start + size], keys, values, mask=layer.mask(size))
        steps.append(out)
        start += size
        assert cache.length == start
    assert cache[0].stored == min(window - 1, N)
    # same keys weighted the same; only the summation runs over fewer exact zeros
    np.testing.assert_allclose(torch.cat(steps, dim=2).numpy(), full.numpy(), rtol=0,
                               atol=1e-12)


def test_cache_memory_stops_growing():
    window, cache = 4, SlidingWindowLayerCache(4)
    for t in range(20):
        cache.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
        assert cache.stored == min(t + 1, window - 1)
        # the kept keys own their storage: nothing of earlier positions stays alive
        assert cache.keys.untyped_storage().nbytes() == cache.keys.numel() * 4
    cache = SlidingWindowLayerCache(4)
    cache.update(torch.randn(1, 2, 100, 8), torch.randn(1, 2, 100, 8))  # a long prefill
    assert cache.keys.untyped_storage().nbytes() == 1 * 2 * 3 * 8 * 4
    assert cache.length == 100 and cache.start == 97


def test_crop_within_the_kept_positions():
    cache = SlidingWindowLayerCache(4)
    cache.update(torch.randn(1, 1, 10, 2), torch.randn(1, 1, 10, 2))
    cache.crop(8)
    assert cache.length == 8 and cache.stored == 1
    with pytest.raises(ValueError, match=r"keeps only positions 7 onwards"):
        cache.crop(6)


@pytest.mark.parametrize("window, error, match", [
    (0, ValueError, "at least 1, got 0"), (-3, ValueError, "at least 1, got -3"),
    (2.5, TypeError, "positive integer, got 2.5 of type float"),
    (True, TypeError, "got True of type bool"), ("4", TypeError, "got '4' of type str"),
])
def test_bad_window(window, error, match):
    with pytest.raises(error, match=match):
        sliding_window_mask(3, 3, window)
    with pytest.raises(error, match=match):
        SlidingWindowKVCache(2, window)
    with pytest.raises(error, match=match):
        SlidingWindowLayerCache(window)


def test_bad_mask_arguments():
    with pytest.raises(ValueError, match=r"T_q >= 1"):
        sliding_window_mask(0, 3, 2)
    with pytest.raises(ValueError, match=r"T_k >= 1"):
        sliding_window_mask(1, True, 2)
    with pytest.raises(ValueError, match=r"offset >= 0"):
        sliding_window_mask(1, 3, 2, offset=-1)
    with pytest.raises(ValueError, match=r"would see no key at all"):
        sliding_window_mask(1, 3, 2, offset=4)
    cache = SlidingWindowLayerCache(3)
    cache.update(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))
    with pytest.raises(ValueError, match=r"1 <= T <= 2"):
        cache.mask(3)
    with pytest.raises(ValueError, match=r"T >= 1, got 0"):
        cache.next_mask(0)
    with pytest.raises(ValueError, match=r"start a new cache"):
        cache.update(torch.randn(2, 1, 1, 4), torch.randn(2, 1, 1, 4))


def tiny_mistral_attention(window):
    """HF's MistralAttention (eager, float64) and tfbook's MultiHeadAttention with its weights."""
    from transformers import MistralConfig
    from transformers.models.mistral.modeling_mistral import (
        MistralAttention,
        MistralRotaryEmbedding,
    )

    from tfbook.attention import MultiHeadAttention

    config = MistralConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=64, num_hidden_layers=1, vocab_size=16,
                           sliding_window=window, attn_implementation="eager",
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    hf = MistralAttention(config, layer_idx=0).double().eval()
    ours = MultiHeadAttention(32, 4, n_kv_heads=2, bias=False, rope_base=10000.0,
                              rope_convention="half").double().eval()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(ours, name).weight.copy_(getattr(hf, name).weight)
        ours.out_proj.weight.copy_(hf.o_proj.weight)
    return config, hf, MistralRotaryEmbedding(config).double(), ours


def test_mistral_attention_layer_equals_ours():
    """HF's MistralAttention with its own sliding-window mask == tfbook's module with ours,
    uncached and step by step through SlidingWindowKVCache, on a sequence 3x the window."""
    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_sliding_window_causal_mask

    window, N = 4, 12
    config, hf, rotary, ours = tiny_mistral_attention(window)
    x = torch.randn(2, N, 32, dtype=torch.float64)
    positions = torch.arange(N)[None].expand(2, N)
    with torch.no_grad():
        hf_mask = create_sliding_window_causal_mask(config, x, None, None,
                                                    position_ids=positions)
        expected, _ = hf(x, rotary(x, positions), hf_mask)  # (B, N, C)
        full, _ = ours(x, mask=sliding_window_mask(N, N, window)[None, None])
        # HF's eager attention takes its softmax in float32 even for float64 inputs: the two
        # agree to a few float32 roundings of the output's size, not to float64's
        bound = 4 * torch.finfo(torch.float32).eps * float(expected.abs().max())
        np.testing.assert_allclose(full.numpy(), expected.numpy(), rtol=0, atol=bound)
        cache, hf_cache, start, steps, hf_steps = SlidingWindowKVCache(1, window), \
            DynamicCache(config=config), 0, [], []
        for size in (6, 1, 1, 3, 1):
            part, pos = x[:, start:start + size], positions[:, start:start + size]
            # the mask is built before the update: T new queries against kept + T keys
            out, _ = ours(part, cache=cache[0], need_weights=False,
                          mask=cache[0].next_mask(size)[None, None])
            steps.append(out)
            m = create_sliding_window_causal_mask(config, part, None, hf_cache, position_ids=pos)
            hf_steps.append(hf(part, rotary(part, pos), m, past_key_values=hf_cache)[0])
            start += size
    # each side cached equals itself uncached (float64 throughout on our side)
    np.testing.assert_allclose(torch.cat(steps, 1).numpy(), full.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(torch.cat(hf_steps, 1).numpy(), expected.numpy(), rtol=0,
                               atol=bound)
    assert cache[0].stored == window - 1 == hf_cache.layers[0].keys.size(-2)


def test_reorder_and_crop_every_layer():
    cache = SlidingWindowKVCache(2, window=3)
    k = torch.arange(3 * 5, dtype=torch.float32).view(3, 1, 5, 1)  # row b, position t
    for layer in cache.layers:
        layer.update(k, k)
    cache.reorder(torch.tensor([2, 0]))  # beam search keeps rows 2 and 0
    for layer in cache.layers:
        assert torch.equal(layer.keys, k[[2, 0], :, 3:])  # the last window - 1 positions
    cache.crop(4)
    assert cache.length == 4 and all(layer.stored == 1 for layer in cache.layers)
    assert cache.memory_bytes() == 2 * 2 * (2 * 1 * 1 * 1 * 4)
