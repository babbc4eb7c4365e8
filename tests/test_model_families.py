"""Model families as settings of one block: each tiny tfbook GPT equals its Hugging Face model.

- QK-norm (qk_norm=True) equals `Qwen3ForCausalLM`;
- a sliding window (sliding_window=W) equals `MistralForCausalLM` on sequences longer than
  W, uncached and cached (the cache keeping only the window);
- a mixture of experts (ffn="moe") equals `MixtralForCausalLM`, and its load-balancing loss
  HF's `aux_loss`.

Bounds. In float32, with HF's sdpa attention and our "torch" kernel, both run the same
operations in the same order: the logits are asserted bit-for-bit equal on 1 and 2 pinned
threads (except Mixtral's, whose experts add their outputs in another order than HF's:
those are bounded, see its test).
In float64 both sides compute the same function with a few dozen roundings per
logit, each of relative size 2^-53, so they agree to within 2^-40 of the logits' size (a
margin of about a hundred times that error, and still a billionth of float32's rounding).
HF's RMSNorm rounds its input to float32 even inside a float64 model; the float64 tests run
it in the model's own dtype (`hf_norms_in_float64`), and use HF's sdpa attention (its eager
one takes the softmax in float32), so that nothing but float64 arithmetic is compared.
"""

import numpy as np
import pytest
import torch
from transformers import (
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.mistral.modeling_mistral import MistralRMSNorm
from transformers.models.mixtral.modeling_mixtral import MixtralRMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from tests.pinned_threads import THREAD_COUNTS, pinned_threads
from tfbook.blocks import BlockConfig
from tfbook.checkpoints.hf_llama import config_from_hf_llama, tfbook_from_hf_llama
from tfbook.families import random_norm_gains
from tfbook.generate.search import generate
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import (
    llama_config,
    mistral_7b,
    mixtral_8x7b,
    qwen3_0_6b,
    qwen3_8b,
    tiny_llama,
)
from tfbook.models.params import count_parameters
from tfbook.moe import MoEFeedForward, load_balancing_loss
from tfbook.sliding_window import SlidingWindowKVCache
from tfbook.train.loop import MoELoss, TrainConfig, train

F64_RELATIVE = 2.0**-40  # see the module docstring
TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=None,
            eos_token_id=None, pad_token_id=None, initializer_range=0.2)
IDS = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(2))  # (B, T)
CHUNKS = [[1] * 13, [7, 1, 1, 4], [3, 5, 2, 1, 1, 1]]  # prefill and decode steps


randomized = random_norm_gains  # random norm gains too (HF starts them at one)


def qwen3(attn: str) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return randomized(Qwen3ForCausalLM(Qwen3Config(rms_norm_eps=1e-6, attn_implementation=attn,
                                                   **TINY)))


def qwen3_wide_heads(attn: str) -> Qwen3ForCausalLM:
    """Heads wider than width / heads, as in Qwen3-0.6B (head_dim 128, width 1024, 16 heads)."""
    torch.manual_seed(0)
    return randomized(Qwen3ForCausalLM(Qwen3Config(rms_norm_eps=1e-6, attn_implementation=attn,
                                                   **{**TINY, "head_dim": 16})))


def mistral(window: int, attn: str) -> MistralForCausalLM:
    torch.manual_seed(0)
    return randomized(MistralForCausalLM(MistralConfig(sliding_window=window,
                                                       attn_implementation=attn, **TINY)))


def mixtral(attn: str) -> MixtralForCausalLM:
    torch.manual_seed(0)
    config = MixtralConfig(num_local_experts=4, num_experts_per_tok=2, attn_implementation=attn,
                           **TINY)
    config._experts_implementation = "eager"  # HF's reference loop; the default has no float64
    return randomized(MixtralForCausalLM(config))


FAMILIES = {"qwen3": qwen3, "qwen3-wide-heads": qwen3_wide_heads,
            "mistral-w1": lambda a: mistral(1, a),
            "mistral-w4": lambda a: mistral(4, a), "mistral-w6": lambda a: mistral(6, a),
            "mixtral": mixtral}


@pytest.fixture
def hf_norms_in_float64(monkeypatch):
    """HF's RMSNorm formula in the input's dtype (HF rounds the input to float32 first)."""
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                              + self.variance_epsilon))
    for norm in (MistralRMSNorm, MixtralRMSNorm, Qwen3RMSNorm):
        monkeypatch.setattr(norm, "forward", forward)


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def decode_steps(model, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """Logits of `ids` fed through a new cache of `model` in chunks of the given sizes."""
    cache, steps, start = model.new_cache(), [], 0
    with torch.no_grad():
        for size in chunks:
            steps.append(model(ids[:, start:start + size], cache=cache).logits)
            start += size
    return torch.cat(steps, dim=1)


def hf_decode_steps(hf, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    steps, start, past = [], 0, None
    with torch.no_grad():
        for size in chunks:
            out = hf(ids[:, start:start + size], past_key_values=past, use_cache=True)
            past = out.past_key_values
            steps.append(out.logits)
            start += size
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_config_read_from_hf(family):
    config = config_from_hf_llama(FAMILIES[family]("eager").config)
    assert config.qk_norm == family.startswith("qwen3")
    assert config.head_size == FAMILIES[family]("eager").config.head_dim
    assert config.sliding_window == (int(family[-1]) if "mistral" in family else None)
    assert (config.ffn, config.n_experts, config.top_k) == (
        ("moe", 4, 2) if family == "mixtral" else ("swiglu", 8, 2))
    assert config.sliding_window is None or IDS.size(1) > config.sliding_window


@THREAD_COUNTS
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "mixtral"])
def test_float32_logits_equal_hf_bit_for_bit(family, n_threads):
    hf = FAMILIES[family]("sdpa")
    ours = tfbook_from_hf_llama(hf, attention="torch")
    with pinned_threads(n_threads):
        assert torch.equal(logits_of(ours, IDS), logits_of(hf, IDS))
        if family.startswith("qwen3"):  # QK-norm adds nothing to the cache: decoding bit-equal
            assert torch.equal(decode_steps(ours, IDS, CHUNKS[2]),
                               hf_decode_steps(hf, IDS, CHUNKS[2]))


@THREAD_COUNTS
def test_float32_mixtral_logits_within_the_expert_order_bound(n_threads):
    """Mixtral's experts: HF adds the k weighted expert outputs of a token in the order of its
    expert loop, tfbook in the order of the top-k; the two sums differ by about one float32
    rounding (2^-24 relative) per MoE layer, which the rest of the network carries to the
    logits with a gain of order one. Bound: 2^-16 of the largest logit (256 such roundings).
    A token sent to a wrong expert, or a weight left out, moves the logits by order one."""
    hf = FAMILIES["mixtral"]("sdpa")
    ours = tfbook_from_hf_llama(hf, attention="torch")
    with pinned_threads(n_threads):
        expected, got = logits_of(hf, IDS), logits_of(ours, IDS)
        cached = decode_steps(ours, IDS, CHUNKS[1])
    scale = expected.abs().max()
    assert (got - expected).abs().max() <= 2.0**-16 * scale
    assert (cached - expected).abs().max() <= 2.0**-16 * scale


@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_float64_cached_equals_uncached_and_hf(family, chunks, hf_norms_in_float64):
    hf = FAMILIES[family]("sdpa").double()  # HF's eager softmax is float32 in any model
    ours = tfbook_from_hf_llama(hf, attention="reference").double()
    full = logits_of(ours, IDS)
    atol = F64_RELATIVE * float(full.abs().max())
    np.testing.assert_allclose(logits_of(hf, IDS).numpy(), full.numpy(), rtol=0, atol=atol)
    cached = decode_steps(ours, IDS, chunks)
    np.testing.assert_allclose(cached.numpy(), full.numpy(), rtol=0, atol=atol)
    if family != "mistral-w1":  # HF's window-1 cache keeps every key ([-0:]), then fails
        np.testing.assert_allclose(hf_decode_steps(hf, IDS, chunks).numpy(), cached.numpy(),
                                   rtol=0, atol=atol)


@pytest.mark.parametrize("kernel", ["torch", "flash"])
@pytest.mark.parametrize("family", ["qwen3", "mistral-w4"])
def test_every_attention_kernel_takes_the_window_and_qk_norm(family, kernel):
    """The fused and tiled kernels, uncached and through the rolling cache, equal ours."""
    hf = FAMILIES[family]("sdpa").double()
    reference = logits_of(tfbook_from_hf_llama(hf, attention="reference").double(), IDS)
    fast = tfbook_from_hf_llama(hf, attention=kernel).double()
    atol = F64_RELATIVE * float(reference.abs().max())
    for logits in (logits_of(fast, IDS), decode_steps(fast, IDS, CHUNKS[2])):
        np.testing.assert_allclose(logits.numpy(), reference.numpy(), rtol=0, atol=atol)


@pytest.mark.parametrize("family", ["qwen3", "mistral-w4", "mixtral"])
def test_greedy_generation_equals_hf_cached_and_uncached(family, hf_norms_in_float64):
    """tfbook's generate, through the family's cache and without one, picks HF's tokens."""
    hf = FAMILIES[family]("sdpa").double()
    ours = tfbook_from_hf_llama(hf, attention="reference").double()
    ids = IDS[:, :6]
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=12, do_sample=False)
    for use_cache in (True, False):
        assert torch.equal(generate(ours, ids, 12, use_cache=use_cache).tokens, expected)


@pytest.mark.parametrize("window", [1, 4, 6])
def test_the_cache_keeps_only_the_window(window):
    ours = tfbook_from_hf_llama(mistral(window, "eager"))
    cache = ours.new_cache()
    assert isinstance(cache, SlidingWindowKVCache) and cache.window == window
    with torch.no_grad():
        for t in range(IDS.size(1)):
            ours(IDS[:, t:t + 1], cache=cache)
            assert all(layer.stored == min(window - 1, t + 1) for layer in cache.layers)
    assert cache.length == IDS.size(1)


def test_window_wider_than_the_text_is_the_causal_model():
    """A window no shorter than the sequence changes nothing: bit-identical logits."""
    torch.manual_seed(0)
    plain = GPT(tiny_llama()).eval()
    windowed = GPT(llama_config(vocab_size=256, max_len=64, n_layers=2, d_model=64, n_heads=4,
                                n_kv_heads=2, d_ff=96, sliding_window=13)).eval()
    windowed.load_state_dict(plain.state_dict())
    ids = IDS % 256
    assert torch.equal(logits_of(plain, ids), logits_of(windowed, ids))


def test_padded_batch_with_a_window_equals_each_row_alone():
    """Left padding and the window together: each row's logits at its real tokens equal the
    row run alone, uncached and through the rolling cache."""
    ours = tfbook_from_hf_llama(mistral(4, "eager"), attention="reference").double()
    ids = IDS.clone()
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :3] = False  # row 1 is left-padded by 3
    with torch.no_grad():
        positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
        batch = ours(ids, attention_mask=mask, positions=positions).logits
        alone = ours(ids[1:, 3:]).logits
        np.testing.assert_allclose(batch[1, 3:].numpy(), alone[0].numpy(), rtol=0,
                                   atol=F64_RELATIVE * float(alone.abs().max()))
        cache, steps = ours.new_cache(), []
        for t in range(ids.size(1)):
            out = ours(ids[:, t:t + 1], attention_mask=mask[:, :t + 1],
                       positions=positions[:, t:t + 1], cache=cache)
            steps.append(out.logits)
        np.testing.assert_allclose(torch.cat(steps, 1)[1, 3:].numpy(), alone[0].numpy(),
                                   rtol=0, atol=F64_RELATIVE * float(alone.abs().max()))


def test_moe_load_balancing_loss_equals_hf(hf_norms_in_float64):
    """The router's auxiliary loss over every layer equals HF's aux_loss; tokens per expert
    are counted (N * k assignments per layer)."""
    hf = mixtral("sdpa").double()
    ours = tfbook_from_hf_llama(hf, attention="reference").double()
    with torch.no_grad():
        expected = hf(IDS, output_router_logits=True).aux_loss
        ours(IDS)
    moes = [block.ff for block in ours.blocks]
    assert all(isinstance(m, MoEFeedForward) for m in moes)
    aux = load_balancing_loss([m.router_logits for m in moes], 4, 2)
    np.testing.assert_allclose(float(aux), float(expected), rtol=2.0**-40)
    assert all(int(m.tokens_per_expert.sum()) == IDS.numel() * 2 for m in moes)


def test_moe_training_loss_and_router_gradient_equal_hf(hf_norms_in_float64):
    """MoELoss (cross-entropy + coef x load balance) equals MixtralForCausalLM's training loss
    with output_router_logits=True, and so does the gradient reaching every router. HF takes
    the cross-entropy of float32 logits (it upcasts, and a float64 model's logits are rounded
    down to float32): the two agree to float32's rounding, 2^-20 of their size with margin."""
    hf = FAMILIES["mixtral"]("sdpa").double()
    hf.router_aux_loss_coef = 0.02  # Mixtral-8x7B's (the model copies it from its config)
    ours = tfbook_from_hf_llama(hf, attention="reference").double()
    expected = hf(IDS, labels=IDS, output_router_logits=True).loss
    expected.backward()
    ignore = torch.full_like(IDS[:, :1], -100)
    loss = MoELoss(0.02)(ours, (IDS, torch.cat([IDS[:, 1:], ignore], dim=1)))
    loss.backward()
    assert abs(loss.item() - expected.item()) <= 2.0**-20 * expected.item()
    for i, block in enumerate(ours.blocks):
        hf_grad = hf.model.layers[i].mlp.gate.weight.grad
        assert hf_grad.abs().max() > 0
        np.testing.assert_allclose(block.ff.router.weight.grad.numpy(), hf_grad.numpy(),
                                   rtol=0, atol=2.0**-20 * float(hf_grad.abs().max()))
    # without the balance term the loss is the cross-entropy alone, a different number
    assert abs(MoELoss(0.0)(ours, (IDS, torch.cat([IDS[:, 1:], ignore], dim=1))).item()
               - loss.item()) > 1e-3
    with pytest.raises(ValueError, match="MoELoss needs a model with mixture-of-experts"):
        MoELoss()(GPT(tiny_llama()), (IDS, IDS))
    with pytest.raises(ValueError, match="MoELoss: coef must be a number >= 0, got -1"):
        MoELoss(-1)


def test_the_one_training_loop_trains_a_mixture_of_experts():
    """A tiny MoE GPT through `train` with MoELoss: the loss falls on a repeated batch and
    every router weight moves (the balance term reaches it)."""
    torch.manual_seed(0)
    model = GPT(llama_config(vocab_size=97, max_len=16, n_layers=2, d_model=32, n_heads=4,
                             n_kv_heads=2, d_ff=48, n_experts=4, top_k=2))
    routers = [block.ff.router.weight.detach().clone() for block in model.blocks]
    x = IDS[:, :12]
    batch = (x, torch.cat([x[:, 1:], torch.full_like(x[:, :1], -100)], dim=1))
    history = train(model, lambda generator: batch,
                    TrainConfig(steps=8, lr=1e-2, schedule="constant"), loss_fn=MoELoss(0.02),
                    progress=False)
    assert history.loss[-1] < history.loss[0]
    assert all(not torch.equal(before, block.ff.router.weight)
               for before, block in zip(routers, model.blocks, strict=True))


def test_presets():
    qwen, mistral_config = qwen3_8b(), mistral_7b()
    assert qwen.qk_norm and qwen.head_size == 128 and qwen.sliding_window is None
    assert mistral_config.sliding_window == 4096 and not mistral_config.qk_norm
    assert qwen.block_config().qk_norm and mistral_config.block_config().sliding_window == 4096
    moe = mixtral_8x7b().block_config()
    assert (moe.ffn, moe.n_experts, moe.top_k, moe.sliding_window) == ("moe", 8, 2, None)


def test_head_dim_preset_and_parameters_equal_hf():
    """Qwen3-0.6B's heads (128 wide, 16 of them in a width of 1024): the preset's parameter
    count equals HF's Qwen3ForCausalLM built on the meta device from the released shapes."""
    config = qwen3_0_6b()
    assert config.head_size == 128 and config.n_heads * config.head_size == 2 * config.d_model
    with torch.device("meta"):
        ours = GPT(config)
        hf = Qwen3ForCausalLM(Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128,
            tie_word_embeddings=True))
    assert count_parameters(ours) == count_parameters(hf) == 596_049_920
    assert tuple(ours.blocks[0].attn.out_proj.weight.shape) == (1024, 2048)


@pytest.mark.parametrize("head_dim", [0, -8, 2.5, True, "16"])
def test_bad_head_dim_is_refused_by_the_config(head_dim):
    with pytest.raises(ValueError, match=r"GPTConfig: head_dim must be a positive int, or None"):
        GPTConfig(head_dim=head_dim)


def test_defaults_add_no_parameters():
    """Without the new settings a model has exactly the parameters it had before."""
    model = GPT(tiny_llama())
    assert not any("q_norm" in n or "k_norm" in n for n, _ in model.named_parameters())
    qk = GPT(llama_config(vocab_size=256, max_len=64, n_layers=2, d_model=64, n_heads=4,
                          n_kv_heads=2, d_ff=96, qk_norm=True))
    extra = sum(p.numel() for p in qk.parameters()) - sum(p.numel() for p in model.parameters())
    assert extra == 2 * 2 * 16  # two blocks, q_norm and k_norm, one gain per head feature


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "4"])
def test_bad_window_is_refused_by_the_config(window):
    with pytest.raises(ValueError, match=r"GPTConfig: sliding_window counts the positions"):
        GPTConfig(sliding_window=window)
    with pytest.raises(ValueError, match=r"BlockConfig: sliding_window"):
        BlockConfig(sliding_window=window)


@pytest.mark.parametrize("changes,message", [
    ({"n_experts": 0}, r"GPTConfig: n_experts must be a positive int, got 0"),
    ({"top_k": 3, "n_experts": 2}, r"GPTConfig: top_k=3 experts per token cannot exceed "
                                   r"n_experts=2"),
    ({"routing": "softmax"}, r"GPTConfig: routing must be one of \('renormalised', "),
    ({"ffn": "experts"}, r"GPTConfig: ffn must be one of \('mlp', 'swiglu', 'moe'\)"),
])
def test_bad_moe_settings_are_refused_by_the_config(changes, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**changes)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_bad_qk_norm_is_refused_by_the_config(value):
    with pytest.raises(ValueError, match=r"GPTConfig: qk_norm must be True or False"):
        GPTConfig(qk_norm=value)


def test_unsupported_hf_configs_are_refused():
    with pytest.raises(ValueError, match=r"use_sliding_window=True"):
        config_from_hf_llama(Qwen3Config(use_sliding_window=True, sliding_window=4,
                                         **TINY))
