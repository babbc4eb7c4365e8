"""The KV cache: cached and uncached forward passes agree on every model; misuse is refused."""

import pytest
import torch

from tfbook.cache import KVCache, cache_bytes
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.models.transformer import Transformer, TransformerConfig


def step_by_step(model, idx, chunks):
    """Feed idx (B, T) to the model in chunks of the given sizes through one cache."""
    cache, outs, start = model.new_cache(), [], 0
    for size in chunks:
        outs.append(model(idx[:, start : start + size], cache=cache).logits)
        start += size
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("config", [GPTConfig.tiny(), tiny_llama()], ids=["gpt", "llama"])
def test_cached_equals_uncached_decoder(config):
    torch.manual_seed(0)
    model = GPT(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 20))
    full = model(idx).logits  # (B, T, V)
    chunked, cache = step_by_step(model, idx, [7, 1, 1, 5, 6])
    assert (full - chunked).abs().max() <= 1e-5
    assert cache.length == 20
    H_kv = config.n_kv_heads or config.n_heads
    assert cache.memory_bytes() == cache_bytes(config.n_layers, H_kv, config.head_size, 20, 4, 2)


def test_cached_step_gets_its_true_position():
    # learned positions: a cached step at position 9 must use row 9 of the table, not row 0
    torch.manual_seed(1)
    model = GPT(GPTConfig.tiny()).eval()
    idx = torch.randint(0, 256, (1, 10))
    _, cache = step_by_step(model, idx, [9])
    last = model(idx[:, 9:], cache=cache).logits[:, -1]
    at_zero = model(idx[:, 9:], positions=torch.tensor([0]), cache=model.new_cache()).logits
    assert torch.allclose(last, model(idx).logits[:, -1], atol=1e-5)
    assert not torch.allclose(last, at_zero[:, -1], atol=1e-3)


def test_cached_equals_uncached_encoder_decoder():
    torch.manual_seed(2)
    model = Transformer(TransformerConfig.tiny()).eval()
    src, tgt = torch.randint(0, 50, (3, 9)), torch.randint(0, 50, (3, 8))
    src_mask = torch.arange(9) < torch.tensor([9, 6, 4])[:, None]  # (B, S)
    memory, _ = model.encode(src, src_mask)
    full = model.decode(tgt, memory, src_mask=src_mask).logits
    cache, steps = model.new_cache(), []
    for t in range(8):
        steps.append(model.decode(tgt[:, t : t + 1], memory, src_mask=src_mask, cache=cache).logits)
    assert (full - torch.cat(steps, 1)).abs().max() <= 1e-5
    # the source's keys and values were computed once and kept: (B, H_kv, S, D) per layer
    assert all(layer.cross[0].shape == (3, 4, 9, 8) for layer in cache.layers)


def test_cache_refuses_misuse():
    model = GPT(GPTConfig.tiny()).eval()
    cache = model.new_cache()
    model(torch.zeros(2, 60, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="holds a batch of 2 sequences, got a batch of 3"):
        model(torch.zeros(3, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="length 65 exceeds the model's context length 64"):
        model(torch.zeros(2, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="KVCache with 2 layers"):
        model(torch.zeros(2, 1, dtype=torch.long), cache=KVCache(3, 64))
    with pytest.raises(ValueError, match="n_layers >= 1, got 0"):
        KVCache(0, 10)


def test_reorder_follows_beams():
    torch.manual_seed(3)
    model = GPT(tiny_llama()).eval()
    idx = torch.randint(0, 256, (3, 6))
    _, cache = step_by_step(model, idx, [6])
    cache.reorder(torch.tensor([2, 2, 0]))
    nxt = torch.randint(0, 256, (3, 1))
    stepped = model(nxt, cache=cache).logits[:, -1]
    direct = model(torch.cat([idx[[2, 2, 0]], nxt], 1)).logits[:, -1]
    assert (stepped - direct).abs().max() <= 1e-5


def test_grouped_query_attention_saves_cache_memory():
    # SmolLM2-135M's shapes: 30 layers, 3 key/value heads of size 64 instead of 9
    full = cache_bytes(30, 9, 64, 8192, 2)
    grouped = cache_bytes(30, 3, 64, 8192, 2)
    assert full == 3 * grouped and grouped == 2 * 30 * 3 * 64 * 8192 * 2
