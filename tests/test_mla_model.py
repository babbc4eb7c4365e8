"""Multi-head latent attention as a setting of the one block (kv_lora_rank in GPTConfig): a tiny
tfbook GPT equals Hugging Face's `DeepseekV3ForCausalLM` (every block dense), uncached and
through its cache of latents, and the one `generate` (greedy, sampled, beams, speculative)
runs through that cache.

Bounds. In float64 both sides compute the same function with a few dozen roundings per
logit, each of relative size 2^-53, so they agree to within 2^-40 of the logits' size (as in
test_model_families; HF's RMSNorm is run in the model's dtype, `hf_norms_in_float64`, and its
sdpa attention, whose softmax is not forced to float32). In float32 the two sum in other
orders (HF's interleaved RoPE writes the rotated pairs in halves, its key is assembled by
copies), so they are compared within 2 gamma_n (1 + max|logit|), gamma_n = n u / (1 - n u),
where n is the longest chain of sums from the embedding to a logit (`float32_bound`).
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

from tests.test_model_families import decode_steps, hf_decode_steps, logits_of
from tests.test_moe import hf_deepseek_router_in_input_dtype
from tfbook.blocks import BlockConfig, CrossAttentionBlock
from tfbook.cache import KVCache
from tfbook.checkpoints.hf_deepseek import (
    config_from_hf_deepseek_v3,
    tfbook_from_hf_deepseek_v3,
)
from tfbook.generate.beam import beam_search
from tfbook.generate.search import generate
from tfbook.generate.speculative import EarlyExitDraft, speculative_generate
from tfbook.mla import LatentKVCache, MultiHeadLatentAttention, kv_cache_bytes_per_token
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import deepseek_v3
from tfbook.models.params import decoder_forward_flops

F64_RELATIVE = 2.0**-40  # see the module docstring
DIMS = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12)
TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, first_k_dense_replace=2,
            max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=None,
            eos_token_id=None, pad_token_id=None, initializer_range=0.2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **DIMS)
IDS = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(2))  # (B, T)
CHUNKS = [7, 1, 1, 4]  # a prefill, then decode steps


def deepseek(q_lora_rank: int | None = 24, interleave: bool = True,
             attn: str = "sdpa") -> DeepseekV3ForCausalLM:
    """A tiny random DeepSeek-V3 with dense blocks and random norm gains (HF starts them at
    one, which would hide a missing gain)."""
    torch.manual_seed(0)
    config = DeepseekV3Config(q_lora_rank=q_lora_rank, rope_interleave=interleave,
                              attn_implementation=attn, **TINY)
    hf = DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
    return hf.eval()


VARIANTS = {"q-latent": {}, "q-direct": {"q_lora_rank": None},
            "halves": {"interleave": False}}


@pytest.fixture
def hf_norms_in_float64(monkeypatch):
    """HF's RMSNorm formula in the input's dtype (HF rounds the input to float32 first)."""
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                              + self.variance_epsilon))
    monkeypatch.setattr(DeepseekV3RMSNorm, "forward", forward)
    with hf_deepseek_router_in_input_dtype():  # and its router's logits (see there)
        yield


def float32_bound(config: GPTConfig, T: int, logits: torch.Tensor) -> float:
    """2 gamma_n (1 + max|logit|), n the longest chain of sums through the blocks: per block
    the two norms (2C), the query path (C, then q_lora_rank twice: its norm and W_UQ), the
    latent (C, its norm r, W_UK r), the scores (d_N + d_R), softmax and value mix (2T), W_O
    (H d_V), the SwiGLU (C + F); then the final norm and the head (2C)."""
    C, H, r = config.d_model, config.n_heads, config.kv_lora_rank
    q = 0 if config.q_lora_rank is None else 2 * config.q_lora_rank
    per_block = (5 * C + q + 2 * r + config.qk_nope_head_dim + config.qk_rope_head_dim
                 + 2 * T + H * config.v_head_dim + config.d_ff)
    n = config.n_layers * per_block + 2 * C
    u = 2.0**-24
    return 2 * n * u / (1 - n * u) * (1 + float(logits.abs().max()))


MOE = dict(first_k_dense_replace=0, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
           topk_group=2, moe_intermediate_size=12, n_shared_experts=2,
           routed_scaling_factor=2.5)


def deepseek_moe() -> DeepseekV3ForCausalLM:
    """A tiny DeepSeek-V3 whose every block is a mixture of experts, with a random score bias
    (HF starts it at zero, which would hide a bias that chose nothing)."""
    torch.manual_seed(0)
    config = DeepseekV3Config(q_lora_rank=24, attn_implementation="sdpa", **{**TINY, **MOE})
    config._experts_implementation = "eager"  # HF's reference loop; the default has no float64
    hf = DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for name, p in [*hf.named_parameters(), *hf.named_buffers()]:
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            elif "e_score_correction_bias" in name:
                p.copy_(0.2 * torch.randn_like(p))
    return hf.eval()


def test_every_block_a_mixture_of_experts_equals_hf(hf_norms_in_float64):
    """DeepSeek-V3's MoE (routing="sigmoid": bias, 2 of 4 groups, 2 shared experts, scaling
    2.5) in every block: float64 logits, cached and uncached, and greedy generate equal HF's."""
    hf = deepseek_moe().double()
    ours = tfbook_from_hf_deepseek_v3(hf, attention="reference").double()
    c = ours.config
    assert (c.ffn, c.routing, c.n_experts, c.top_k, c.n_expert_groups, c.top_groups,
            c.n_shared_experts, c.routed_scaling, c.d_ff) == ("moe", "sigmoid", 8, 3, 4, 2, 2,
                                                             2.5, 12)
    expected = logits_of(hf, IDS)
    atol = F64_RELATIVE * float(expected.abs().max())
    for logits in (logits_of(ours, IDS), decode_steps(ours, IDS, CHUNKS)):
        np.testing.assert_allclose(logits.numpy(), expected.numpy(), rtol=0, atol=atol)
    ids = IDS[:, :6]
    with torch.no_grad():
        tokens = hf.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(generate(ours, ids, 8).tokens, tokens)


def test_config_read_from_hf():
    config = config_from_hf_deepseek_v3(deepseek().config)
    assert (config.kv_lora_rank, config.q_lora_rank, config.qk_nope_head_dim,
            config.qk_rope_head_dim, config.v_head_dim) == (16, 24, 8, 4, 12)
    assert (config.position, config.rope_convention, config.ffn, config.norm) == (
        "rope", "interleaved", "swiglu", "rms")
    assert config_from_hf_deepseek_v3(deepseek(interleave=False).config).rope_convention == "half"
    model = GPT(config)
    assert all(isinstance(block.attn, MultiHeadLatentAttention) for block in model.blocks)
    assert isinstance(model.new_cache(), LatentKVCache)


@pytest.mark.parametrize("variant", VARIANTS)
def test_float64_logits_equal_hf_cached_and_uncached(variant, hf_norms_in_float64):
    hf = deepseek(**VARIANTS[variant]).double()
    ours = tfbook_from_hf_deepseek_v3(hf, attention="reference").double()
    full = logits_of(ours, IDS)
    atol = F64_RELATIVE * float(full.abs().max())
    np.testing.assert_allclose(logits_of(hf, IDS).numpy(), full.numpy(), rtol=0, atol=atol)
    cached = decode_steps(ours, IDS, CHUNKS)
    np.testing.assert_allclose(cached.numpy(), full.numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(hf_decode_steps(hf, IDS, CHUNKS).numpy(), cached.numpy(),
                               rtol=0, atol=atol)


@pytest.mark.parametrize("kernel", ["reference", "torch"])
def test_absorbed_setting_is_the_same_function(kernel, hf_norms_in_float64):
    """mla_absorbed=True (W_UK in the query, W_UV in W_O) equals HF too, on either kernel."""
    hf = deepseek().double()
    ours = tfbook_from_hf_deepseek_v3(hf, attention=kernel, mla_absorbed=True).double()
    assert all(block.attn.absorbed for block in ours.blocks)
    expected = logits_of(hf, IDS)
    atol = F64_RELATIVE * float(expected.abs().max())
    for logits in (logits_of(ours, IDS), decode_steps(ours, IDS, CHUNKS)):
        np.testing.assert_allclose(logits.numpy(), expected.numpy(), rtol=0, atol=atol)


def test_float32_logits_within_the_derived_bound():
    hf = deepseek()
    ours = tfbook_from_hf_deepseek_v3(hf, attention="torch")
    expected = logits_of(hf, IDS)
    bound = float32_bound(ours.config, IDS.size(1), expected)
    for logits in (logits_of(ours, IDS), decode_steps(ours, IDS, CHUNKS)):
        assert float((logits - expected).abs().max()) <= bound
    # the bound can fail: RoPE in the other pairing changes the logits by far more
    swapped = GPT(replace(ours.config, rope_convention="half")).eval()
    swapped.load_state_dict(ours.state_dict())
    assert float((logits_of(swapped, IDS) - expected).abs().max()) > 10 * bound


def test_greedy_generation_equals_hf_cached_and_uncached(hf_norms_in_float64):
    hf = deepseek().double()
    ours = tfbook_from_hf_deepseek_v3(hf, attention="reference").double()
    ids = IDS[:, :6]
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=12, do_sample=False)
    for use_cache in (True, False):
        assert torch.equal(generate(ours, ids, 12, use_cache=use_cache).tokens, expected)


@pytest.mark.parametrize("kernel,absorbed", [("reference", False), ("torch", True)])
def test_generate_through_the_latent_cache(kernel, absorbed):
    """Sampling through the cache draws the tokens it draws without one; a left-padded row
    gets the tokens it gets alone; beams and early-exit speculation (crop, first_layers) give
    their uncached or plain answers; with either form and kernel."""
    ours = tfbook_from_hf_deepseek_v3(deepseek(), attention=kernel,
                                      mla_absorbed=absorbed).double()
    prompts = [IDS[0, :6].tolist(), IDS[1, :3].tolist()]

    def sampled(use_cache, rows=prompts):
        return generate(ours, rows, 10, temperature=1.0, top_k=20, use_cache=use_cache,
                        generator=torch.Generator().manual_seed(5)).tokens
    assert torch.equal(sampled(True), sampled(False))
    greedy = generate(ours, prompts, 10).tokens
    alone = generate(ours, prompts[1:], 10).tokens
    assert torch.equal(greedy[1, 3:], alone[0])  # padding hidden by the mask
    beams = [beam_search(ours, IDS[:, :5], 3, 6, use_cache=c).sequences for c in (True, False)]
    assert torch.equal(beams[0], beams[1])
    prompt = IDS[0, :5].tolist()
    plain = generate(ours, [prompt], 12).tokens[0].tolist()
    spec = speculative_generate(ours, prompt, 12, EarlyExitDraft(ours, 1), draft_length=3)
    assert spec.tokens == plain and sum(spec.proposed) > 0


def test_cache_bytes_per_token_measured_from_the_live_cache():
    """What the cache holds after a prefill of T tokens, from its tensors, is T x B x
    kv_cache_bytes_per_token("mla", ...) over every layer: (r + d_R) numbers per layer."""
    for dtype in (torch.float32, torch.float64):
        ours = tfbook_from_hf_deepseek_v3(deepseek()).to(dtype)
        cache = ours.new_cache()
        with torch.no_grad():
            ours(IDS, cache=cache)
        B, T = IDS.shape
        stored = sum(t[:, :, : layer.length].numel() * t.element_size()
                     for layer in cache.layers for t in (layer.latent, layer.rope_key))
        per_token = kv_cache_bytes_per_token("mla", dtype=dtype, n_layers=2, kv_lora_rank=16,
                                             qk_rope_head_dim=4)
        assert stored == cache.memory_bytes() == B * T * per_token


def test_cache_crop_and_reorder():
    ours = tfbook_from_hf_deepseek_v3(deepseek(), attention="reference").double()
    full = logits_of(ours, IDS)
    cache = ours.new_cache()
    with torch.no_grad():
        ours(IDS[:, :9], cache=cache)
        cache.crop(6)  # forget positions 6..8, then feed them again
        again = ours(IDS[:, 6:], cache=cache).logits
        assert cache.length == 13
        np.testing.assert_allclose(again.numpy(), full[:, 6:].numpy(), rtol=0,
                                   atol=F64_RELATIVE * float(full.abs().max()))
        swapped = ours.new_cache()
        ours(IDS[:, :8], cache=swapped)
        swapped.reorder(torch.tensor([1, 0]))  # row 0 now continues sequence 1
        step = ours(IDS[[1, 0], 8:9], cache=swapped).logits
    np.testing.assert_allclose(step.numpy(), full[[1, 0], 8:9].numpy(), rtol=0,
                               atol=F64_RELATIVE * float(full.abs().max()))
    with pytest.raises(ValueError, match=r"crop needs a length in \[0, 13\]"):
        cache.crop(14)


def test_preset_has_deepseek_v3_shapes():
    """The preset's attention and dense shapes are those of HF's DeepseekV3Config defaults."""
    hf = DeepseekV3Config(first_k_dense_replace=61)  # every block dense, as the preset
    expected = config_from_hf_deepseek_v3(hf)
    assert replace(deepseek_v3(), attention=expected.attention) == expected
    assert deepseek_v3().block_config().rope_head_size == 64


SMALL = dict(vocab_size=97, max_len=32, n_layers=1, n_heads=4, d_model=32, position="rope")


@pytest.mark.parametrize("changes,error,message", [
    ({"kv_lora_rank": 33}, ValueError, r"GPTConfig: kv_lora_rank=33 is larger than the width "
                                       r"d_model=32"),
    ({"kv_lora_rank": 16, "q_lora_rank": 40}, ValueError, r"GPTConfig: q_lora_rank=40 is "
                                                          r"larger than the width"),
    ({"kv_lora_rank": 16, "qk_rope_head_dim": 5}, ValueError, r"GPTConfig: RoPE rotates "
                                                              r"planes, so qk_rope_head_dim"),
    ({"kv_lora_rank": 16, "position": "learned"}, ValueError, r"GPTConfig: multi-head latent "
                                                              r"attention \(kv_lora_rank=16\) "
                                                              r".*needs position='rope'"),
    ({"kv_lora_rank": 16, "attention": "flash"}, ValueError, r"GPTConfig: attention must be one"
                                                             r" of \('reference', 'torch'\) "
                                                             r"for multi-head latent"),
    ({"kv_lora_rank": 16.0}, ValueError, r"GPTConfig: kv_lora_rank must be a positive int "
                                         r"\(or None\), got 16.0"),
    ({"v_head_dim": "8"}, ValueError, r"GPTConfig: v_head_dim must be a positive int, got '8'"),
    ({"q_lora_rank": True}, ValueError, r"GPTConfig: q_lora_rank must be a positive int"),
    ({"kv_lora_rank": 16, "n_kv_heads": 2}, ValueError, r"GPTConfig: .*leave n_kv_heads None"),
    ({"kv_lora_rank": 16, "qk_norm": True}, ValueError, r"GPTConfig: .*has no qk_norm"),
    ({"kv_lora_rank": 16, "sliding_window": 4}, ValueError, r"GPTConfig: .*no sliding_window"),
    ({"mla_absorbed": 1}, ValueError, r"GPTConfig: mla_absorbed must be True or False"),
])
def test_bad_mla_settings_are_refused_in_the_configs_words(changes, error, message):
    with pytest.raises(error, match=message):
        GPTConfig(**{**SMALL, **changes})


def test_bad_block_settings_and_caches():
    with pytest.raises(ValueError, match=r"BlockConfig: multi-head latent attention "
                                         r"\(kv_lora_rank=16\) .*needs rope_base"):
        BlockConfig(kv_lora_rank=16)
    with pytest.raises(ValueError, match=r"CrossAttentionBlock: multi-head latent attention is "
                                         r"causal self-attention only"):
        CrossAttentionBlock(BlockConfig(d_model=32, n_heads=4, rope_base=10000.0,
                                        kv_lora_rank=16, **{k: v for k, v in DIMS.items()
                                                            if k != "kv_lora_rank"}))
    mla = GPT(GPTConfig(**SMALL, **DIMS))
    plain = GPT(GPTConfig(**SMALL))
    ids = IDS[:, :4]
    with pytest.raises(ValueError, match=r"cache must be a LatentKVCache with 1 layers"):
        mla(ids, cache=KVCache(1, 16))
    with pytest.raises(ValueError, match=r"cache must be a KVCache with 1 layers"):
        plain(ids, cache=LatentKVCache(1, 16))
    with pytest.raises(ValueError, match=r"KVCache needs max_len >= 1, got 0"):
        LatentKVCache(1, 0)
    with pytest.raises(ValueError, match=r"multi-head latent attention \(kv_lora_rank=16\) has "
                                         r"others, not counted here"):
        decoder_forward_flops(mla.config, 1, 8, 1)


def test_head_size_of_the_width_need_not_be_even():
    """MLA rotates qk_rope_head_dim, not C / H: a width of 36 over 4 heads (9 each) is fine
    with MLA and refused without it (RoPE would rotate the 9-wide heads)."""
    config = GPTConfig(**{**SMALL, "d_model": 36}, **DIMS)
    assert GPT(config)(IDS[:, :3]).logits.shape == (2, 3, 97)
    with pytest.raises(ValueError, match=r"GPTConfig: RoPE needs .* an even head size"):
        GPTConfig(**{**SMALL, "d_model": 36})


@pytest.mark.parametrize("changes,message", [
    ({"first_k_dense_replace": 1}, r"one BlockConfig serves every block: "
                                   r"first_k_dense_replace=1 makes layers 0..0 dense"),
    ({"first_k_dense_replace": 0, "norm_topk_prob": False}, r"expected norm_topk_prob=True"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                          "original_max_position_embeddings": 16}},
     r"only plain RoPE is supported, got rope_type='yarn'"),
    ({"attention_bias": True}, r"without attention biases"),
    ({"rms_norm_eps": 1e-5}, r"expected rms_norm_eps=1e-06"),
    ({"num_key_value_heads": 2}, r"expected num_key_value_heads = num_attention_heads = 4"),
])
def test_unsupported_hf_configs_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf_deepseek_v3(DeepseekV3Config(**{**TINY, **changes}))
