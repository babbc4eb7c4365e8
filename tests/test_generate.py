"""The one generation loop: greedy and sampled, cached == uncached, batches == one by one."""

import pytest
import torch

from tfbook.generate.search import generate, left_pad, positions_from_mask
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.models.transformer import Transformer, TransformerConfig

CONFIGS = {"gpt": GPTConfig.tiny(), "llama": tiny_llama()}


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request) -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIGS[request.param]).eval()


def test_greedy_is_the_argmax_of_the_full_recomputation(model):
    prompt = torch.randint(0, 256, (2, 5))
    out = generate(model, prompt, max_new_tokens=12, keep_logits=True)
    assert out.tokens.shape == (2, 17) and torch.equal(out.tokens[:, :5], prompt)
    for t in range(5, 17):
        full = model(out.tokens[:, :t]).logits[:, -1]  # (B, V), no cache
        assert torch.equal(out.tokens[:, t], full.argmax(-1))
        assert (out.logits[t - 5] - full).abs().max() <= 1e-5  # cached logits == uncached


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.8, "top_k": 20, "top_p": 0.9}])
def test_cached_and_uncached_give_the_same_tokens(model, settings):
    prompt = torch.randint(0, 256, (3, 4))
    a = generate(model, prompt, 20, generator=torch.Generator().manual_seed(5), **settings)
    b = generate(model, prompt, 20, generator=torch.Generator().manual_seed(5),
                 use_cache=False, **settings)
    assert torch.equal(a.tokens, b.tokens)


def test_batch_of_different_lengths_equals_one_by_one(model):
    prompts = [[5, 6, 7, 8, 9, 10], [11], [12, 13, 14]]
    batch = generate(model, prompts, max_new_tokens=10)
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], max_new_tokens=10)
        assert torch.equal(batch.new_tokens[row], alone.new_tokens[0])


def test_seeded_sampling_is_reproducible(model):
    prompt = torch.randint(0, 256, (1, 3))
    runs = [generate(model, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(7))
            for _ in range(2)]
    other = generate(model, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(8))
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert not torch.equal(runs[0].tokens, other.tokens)


def test_stops_at_end_tokens_and_pads_finished_rows(model):
    prompt = torch.randint(0, 256, (2, 4))
    free = generate(model, prompt, 8)
    end = int(free.new_tokens[0, 2])  # row 0 produces this token at step 2
    out = generate(model, prompt, 8, end_ids=[end], pad_id=0)
    row = out.new_tokens[0].tolist()
    assert row[: row.index(end) + 1] == free.new_tokens[0, : row.index(end) + 1].tolist()
    assert all(t == 0 for t in row[row.index(end) + 1 :])  # padding after the end token
    assert not out.attention_mask[0, 4 + row.index(end) + 1 :].any()


def test_encoder_decoder_cached_equals_uncached():
    torch.manual_seed(1)
    model = Transformer(TransformerConfig.tiny()).eval()
    src = torch.randint(0, 50, (2, 9))
    memory, _ = model.encode(src)
    start = torch.zeros(2, 1, dtype=torch.long)
    a = generate(model, start, 10, memory=memory)
    b = generate(model, start, 10, memory=memory, use_cache=False)
    assert torch.equal(a.tokens, b.tokens)


def test_helpers():
    ids, mask = left_pad([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert positions_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_bad_requests(model):
    prompt = torch.zeros(1, 60, dtype=torch.long)
    with pytest.raises(ValueError, match="needs 65 positions, more than the model's context"):
        generate(model, prompt, 5)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int, got 0"):
        generate(model, prompt[:, :3], 0)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, [[1, 2], []], 3)
    with pytest.raises(ValueError, match=r"shape \(B, T\) with T >= 1, got \(1, 0\)"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"end token ids must be ints in \[0, 256\), got 999"):
        generate(model, prompt[:, :3], 3, end_ids=[999])
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt[:, :3], 3, temperature=-1.0)
