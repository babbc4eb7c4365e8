"""The decoder-only GPT: shapes, causality, weight tying, every kernel == our code, bad input."""

from dataclasses import replace

import pytest
import torch

from tests.attention_kernels import KERNELS, OWN_CODE
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.tiny()).eval()


def test_shapes_loss_and_weights(model):
    idx = torch.randint(0, 256, (2, 10))
    targets = torch.randint(0, 256, (2, 10))
    out = model(idx, targets=targets, need_weights=True)
    assert out.logits.shape == (2, 10, 256)
    # at initialisation the prediction is near uniform: loss close to ln V
    assert abs(out.loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.5
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 10, 10)
    assert torch.all(out.attentions[1].triu(1) == 0)
    assert model(idx).attentions == []


def test_weight_tying(model):
    assert model.lm_head.weight is model.tok_emb.weight
    untied = GPT(replace(GPTConfig.tiny(), tie_weights=False))
    n_tied = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in untied.parameters()) - n_tied == 256 * 64


def test_future_tokens_do_not_change_the_past(model):
    idx = torch.randint(0, 256, (1, 12))
    changed = idx.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 256
    a, b = model(idx).logits, model(changed).logits
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_fused_kernels_and_our_code_agree(model):
    idx = torch.randint(0, 256, (2, 16))
    ours = GPT(replace(GPTConfig.tiny(), activation="gelu", **OWN_CODE)).eval()
    fused = GPT(replace(GPTConfig.tiny(), activation="gelu")).eval()  # torch's three kernels
    fused.load_state_dict(ours.state_dict())
    assert (ours(idx).logits - fused(idx).logits).abs().max() <= 1e-5
    targets = torch.randint(0, 256, (2, 16))
    ours(idx, targets).loss.backward()
    fused(idx, targets).loss.backward()
    for a, b in zip(ours.parameters(), fused.parameters(), strict=True):
        assert (a.grad - b.grad).abs().max() <= 1e-5


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("preset", ["gpt2", "llama"])
def test_every_attention_kernel_gives_the_same_logits(kernel, preset):
    """Left-padded batch, whole and step by step through the cache (grouped heads and RoPE
    for the Llama preset): each kernel gives the reference's logits at every real token."""
    config = GPTConfig.tiny() if preset == "gpt2" else tiny_llama()
    torch.manual_seed(0)
    reference = GPT(replace(config, attention="reference")).eval()
    model = GPT(replace(config, attention=kernel)).eval()
    model.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 256, (2, 9))
    real = torch.ones(2, 9, dtype=torch.bool)
    real[1, :3] = False  # the second prompt is left-padded by three
    expected = reference(ids, attention_mask=real).logits  # (B, T, V)
    whole = model(ids, attention_mask=real).logits
    cache = model.new_cache()
    steps = [model(ids[:, :6], attention_mask=real[:, :6], cache=cache).logits]
    steps += [model(ids[:, t:t + 1], attention_mask=real[:, :t + 1], cache=cache).logits
              for t in range(6, 9)]
    for out in (whole, torch.cat(steps, dim=1)):
        assert (out - expected)[real].abs().max() <= 1e-5


def test_bad_input(model):
    with pytest.raises(ValueError, match="length 65 exceeds the model's context length 64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 256\).*got values in \[3, 256\]"):
        model(torch.tensor([[3, 256]]))
    with pytest.raises(ValueError, match="GPTConfig: d_model=30 is not divisible by n_heads=4"):
        replace(GPTConfig.tiny(), d_model=30)
