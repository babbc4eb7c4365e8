"""tfbook.families: released configs as data. Every parameter count by formula equals the
Hugging Face class built on the meta device from the same values (no weights, no network);
the cache bytes per token equal tfbook.mla.kv_cache_bytes_per_token, the published figures
and the bytes a live cache of a tiny model holds; bad input is refused."""

import dataclasses
import re

import pytest
import torch

from tfbook.checkpoints.hf_deepseek import config_from_hf_deepseek_v3, tfbook_from_hf_deepseek_v3
from tfbook.checkpoints.hf_llama import config_from_hf_llama, tfbook_from_hf_llama
from tfbook.families import (
    RELEASED,
    TINY_FAMILIES,
    Released,
    active_parameter_count,
    cached_positions,
    gpt_config,
    hf_config,
    hf_mla_output,
    hf_on_meta,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_numbers_per_token,
    parameter_breakdown,
    parameter_count,
    released,
    tiny_hf_family,
)
from tfbook.mla import LatentCache, MultiHeadLatentAttention, kv_cache_bytes_per_token
from tfbook.models.gpt import GPT, gpt_on_meta
from tfbook.models.llama import mistral_7b, mixtral_8x7b, qwen3_0_6b, qwen3_8b, smollm2_135m
from tfbook.models.params import count_parameters
from tfbook.paths import book_file
from tfbook.sliding_window import SlidingWindowKVCache

TINY = dict(vocab_size=61, n_layers=2, d_model=32, n_heads=4, head_size=8, d_ff=40,
            max_len=64, tie_weights=False, norm_eps=1e-5, rope_base=10000.0)


def tiny(name: str = "tiny", n_kv_heads: int = 2, **changes) -> Released:
    return Released(name, "example/tiny", "touvron2023llama", "LlamaForCausalLM",
                    n_kv_heads=n_kv_heads, **{**TINY, **changes})


@pytest.mark.parametrize("name", RELEASED)
def test_parameter_count_equals_the_hf_class_on_meta(name):
    hf = hf_on_meta(name)
    assert all(p.device.type == "meta" for p in hf.parameters())  # no memory, no weights
    assert sum(p.numel() for p in hf.parameters()) == parameter_count(name)
    assert sum(parameter_breakdown(name).values()) == parameter_count(name)
    assert type(hf).__name__ == released(name).hf_class


def test_hf_config_keeps_the_special_settings():
    assert hf_config("Mistral-7B-v0.1").sliding_window == 4096
    assert hf_config("Qwen3-0.6B").head_dim == 128 != 1024 // 16
    llama3 = hf_config("Llama-3.1-8B").rope_parameters
    assert llama3["rope_type"] == "llama3" and llama3["factor"] == 8.0
    assert llama3["original_max_position_embeddings"] == 8192 and llama3["rope_theta"] == 5e5
    v3 = hf_config("DeepSeek-V3")
    assert (v3.n_routed_experts, v3.num_experts_per_tok, v3.n_shared_experts) == (256, 8, 1)
    assert (v3.kv_lora_rank, v3.qk_rope_head_dim, v3.first_k_dense_replace) == (512, 64, 3)
    assert v3.rope_parameters["rope_type"] == "yarn" and v3.rope_parameters["factor"] == 40.0
    assert hf_config("DeepSeek-V2-Lite").q_lora_rank is None


def test_the_released_sizes_round_to_the_published_ones():
    """The names and papers quote sizes in billions; the formula gives them to the digit."""
    published = {"GPT-2 small": (0.124, 0.0005), "Llama-2-7B": (6.7, 0.05),
                 "Llama-3.1-8B": (8.0, 0.05), "SmolLM2-135M": (0.135, 0.0005),
                 "Mistral-7B-v0.1": (7.24, 0.005), "Qwen3-8B": (8.2, 0.05),
                 "Qwen3-0.6B": (0.6, 0.005), "Mixtral-8x7B": (46.7, 0.05),
                 "DeepSeek-V2-Lite": (15.7, 0.05), "DeepSeek-V3": (671, 0.5)}
    assert set(published) == set(RELEASED)
    for name, (billions, half_step) in published.items():
        assert abs(parameter_count(name) / 1e9 - billions) <= half_step, name
    # active per token: Mixtral 12.9B (Jiang et al. 2024, "13B active"), DeepSeek-V3 37B
    assert round(active_parameter_count("Mixtral-8x7B") / 1e9, 1) == 12.9
    assert round(active_parameter_count("DeepSeek-V3") / 1e9) == 38
    assert active_parameter_count("Qwen3-8B") == parameter_count("Qwen3-8B")  # dense


def test_active_parameters_by_hand():
    m = released("Mixtral-8x7B")
    expert = 3 * m.d_model * m.d_ff  # one SwiGLU expert
    assert parameter_count(m) - active_parameter_count(m) == m.n_layers * 6 * expert
    v3 = released("DeepSeek-V3")
    assert v3.moe_layers == 58
    expert = 3 * v3.d_model * v3.expert_d_ff
    assert parameter_count(v3) - active_parameter_count(v3) == 58 * (256 - 8) * expert


@pytest.mark.parametrize("name", RELEASED)
def test_kv_bytes_per_token_equals_mla_kv_cache_bytes(name):
    m = released(name)
    numbers, formula = kv_numbers_per_token(m)
    for dtype, size in ((torch.bfloat16, 2), (torch.float16, 2), (torch.float32, 4)):
        per_layer = kv_bytes_per_token(m, dtype, whole_model=False)
        assert per_layer == numbers * size
        assert kv_bytes_per_token(m, dtype) == m.n_layers * per_layer
    kwargs = dict(kv_lora_rank=m.kv_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim) \
        if m.attention == "mla" else dict(n_heads=m.n_heads, n_kv_heads=m.n_kv_heads,
                                          head_size=m.head_size)
    assert kv_bytes_per_token(m) == kv_cache_bytes_per_token(m.attention, n_layers=m.n_layers,
                                                             **kwargs)
    # the formula string multiplies out to the number
    factors = [int(x) for x in re.findall(r"\d+", formula.split("=")[1])]
    assert (sum(factors) if m.attention == "mla" else factors[0] * factors[1] * factors[2]) \
        == numbers


def test_published_cache_sizes():
    """Llama 3's 128 KiB per token in bf16 (32 layers x 8 heads x 128 x K and V x 2 bytes);
    DeepSeek-V2/V3's (d_c + d_R) l = (512 + 64) l numbers per token (DeepSeek-AI 2024, Table 1)."""
    assert kv_bytes_per_token("Llama-3.1-8B") == 128 * 1024
    assert kv_bytes_per_token("DeepSeek-V3") == (512 + 64) * 61 * 2
    assert kv_bytes_per_token("Llama-2-7B") == 4 * kv_bytes_per_token("Llama-3.1-8B")
    assert kv_numbers_per_token("Llama-2-7B")[1] == "2·H·D = 2·32·128"


def test_sliding_window_caps_the_cache():
    assert cached_positions("Mistral-7B-v0.1", 100) == 100
    assert cached_positions("Mistral-7B-v0.1", 32768) == 4095
    assert cached_positions("Mixtral-8x7B", 32768) == 32768  # no window in its config
    assert kv_cache_bytes("Mistral-7B-v0.1", 32768, batch_size=2) == \
        2 * 4095 * kv_bytes_per_token("Mistral-7B-v0.1")


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_live_cache_of_a_tiny_model_holds_the_computed_bytes(n_kv_heads):
    m = tiny(n_kv_heads=n_kv_heads)
    assert m.attention == ("mha" if n_kv_heads == 4 else "gqa")
    torch.manual_seed(0)
    model = GPT(gpt_config(m)).to(torch.bfloat16).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 61, (1, 9)), cache=cache)
        model(torch.randint(0, 61, (1, 1)), cache=cache)
    assert cache.memory_bytes() == kv_cache_bytes(m, 10) == 10 * kv_bytes_per_token(m)
    assert count_parameters(model) == parameter_count(m)


def test_live_sliding_window_cache_holds_window_minus_one_positions():
    m = tiny(sliding_window=4)
    model = GPT(gpt_config(m)).to(torch.bfloat16).eval()
    cache = model.new_cache()
    assert isinstance(cache, SlidingWindowKVCache)
    with torch.no_grad():
        for t in range(9):
            model(torch.randint(0, 61, (1, 1)), cache=cache)
            assert cache.memory_bytes() == kv_cache_bytes(m, t + 1)
    assert cached_positions(m, 9) == 3


def test_live_latent_cache_holds_the_computed_bytes():
    m = tiny("tiny-mla", n_kv_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4)
    assert m.attention == "mla"
    mla = MultiHeadLatentAttention(m.d_model, m.n_heads, kv_lora_rank=16, qk_nope_head_dim=8,
                                   qk_rope_head_dim=4, v_head_dim=m.head_size)
    mla = mla.to(torch.bfloat16).eval()
    cache = LatentCache(32)
    with torch.no_grad():
        mla(torch.randn(1, 7, m.d_model, dtype=torch.bfloat16), cache=cache)
    one_layer = cache.memory_bytes()  # one attention layer's latent cache
    assert one_layer == 7 * kv_bytes_per_token(m, whole_model=False) == 7 * (16 + 4) * 2
    assert kv_cache_bytes(m, 7) == m.n_layers * one_layer


EXPRESSIBLE = ["GPT-2 small", "Llama-2-7B", "Llama-3.1-8B", "SmolLM2-135M", "Mistral-7B-v0.1",
               "Qwen3-8B", "Qwen3-0.6B", "Mixtral-8x7B"]


@pytest.mark.parametrize("name", EXPRESSIBLE)
def test_gpt_config_builds_the_same_model(name):
    config = gpt_config(name)
    assert count_parameters(gpt_on_meta(config)) == parameter_count(name)
    assert config.head_size == released(name).head_size
    if name != "GPT-2 small":  # the HF loader reads the same config to the same GPTConfig
        assert config_from_hf_llama(hf_config(name)) == config


def test_gpt_config_carries_rope_scaling_and_head_dim():
    assert gpt_config("Llama-3.1-8B").rope_scaling == {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    assert gpt_config("Qwen3-0.6B").head_dim == 128 and gpt_config("Qwen3-8B").head_dim is None


def test_gpt_config_equals_the_presets():
    assert gpt_config("Qwen3-8B") == qwen3_8b()
    assert gpt_config("Mistral-7B-v0.1") == mistral_7b()
    assert gpt_config("Mixtral-8x7B") == mixtral_8x7b()
    assert gpt_config("Qwen3-0.6B") == qwen3_0_6b()
    smol = smollm2_135m()  # the GGUF's layout: RoPE on adjacent pairs, float64 angles
    assert gpt_config("SmolLM2-135M") == dataclasses.replace(
        smol, rope_convention="half", rope_precision="float32")


@pytest.mark.parametrize("name, words", [
    ("DeepSeek-V3", "its first 3 layer(s) are dense and the other 58 mixtures of experts"),
    ("DeepSeek-V2-Lite", "its first 1 layer(s) are dense and the other 26"),
])
def test_gpt_config_says_what_it_cannot_express(name, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        gpt_config(name)
    every_block_moe = dataclasses.replace(released(name), dense_layers=0)
    with pytest.raises(ValueError, match="YaRN with latent attention"):
        gpt_config(every_block_moe)


@pytest.mark.parametrize("name", ["DeepSeek-V3", "DeepSeek-V2-Lite"])
def test_deepseek_with_every_block_moe_is_a_gpt_config(name):
    """Latent attention, shared experts and DeepSeek's routers are settings of the block: with
    every block a MoE and plain RoPE, tfbook's model, the formula and HF's class agree (on 2
    of the layers: a tfbook expert is a module, and 61 x 256 of them take seconds to build)."""
    m = dataclasses.replace(released(name), dense_layers=0, rope_scaling=None, n_layers=2)
    config = gpt_config(m)
    assert config.kv_lora_rank == 512 and config.routing == m.routing
    assert count_parameters(gpt_on_meta(config)) == parameter_count(m)
    assert sum(p.numel() for p in hf_on_meta(m).parameters()) == parameter_count(m)
    if name == "DeepSeek-V3":  # the HF loader reads the same config to the same GPTConfig
        assert config_from_hf_deepseek_v3(hf_config(m)) == config


def test_sources_and_citations():
    bib = book_file("references.bib").read_text()
    for m in RELEASED.values():
        assert m.source == f"https://huggingface.co/{m.repo}/blob/main/config.json"
        assert f"{{{m.cite}," in bib, m.cite


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown model family 'GPT-5'; known: GPT-2 small"):
        released("GPT-5")
    with pytest.raises(ValueError, match="unknown model family"):
        parameter_count("llama")
    with pytest.raises(TypeError, match="name must be a str"):
        released(7)
    with pytest.raises(ValueError, match="family must be one of"):
        tiny_hf_family("gemma")


@pytest.mark.parametrize("change, words", [
    (dict(n_layers=0), "n_layers must be a positive int, got 0"),
    (dict(d_model=-8), "d_model must be a positive int"),
    (dict(n_heads=2.5), "n_heads must be a positive int"),
    (dict(sliding_window=0), "sliding_window must be a positive int"),
    (dict(ffn="moe", n_experts=4, top_k=5), "top_k=5 is more than n_experts=4"),
    (dict(ffn="moe"), "needs n_experts and top_k"),
    (dict(kv_lora_rank=64, qk_nope_head_dim=8, qk_rope_head_dim=4), "larger than the width"),
    (dict(kv_lora_rank=16), "needs all of"),
    (dict(n_shared_experts=-1), "n_shared_experts must be an int >= 0"),
    (dict(ffn="conv"), "ffn must be one of"),
    (dict(ffn="moe", n_experts=4, top_k=2, routing="softmax"), "routing must be one of"),
])
def test_bad_records_are_refused(change, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        tiny(**change)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="context must be a positive int, got 0"):
        kv_cache_bytes("Mistral-7B-v0.1", 0)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        kv_cache_bytes("Mistral-7B-v0.1", 5, batch_size=-1)
    with pytest.raises(ValueError, match="window must be a positive int"):
        tiny_hf_family("mistral", window=0)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        kv_bytes_per_token("Qwen3-8B", "bf16")


@pytest.mark.parametrize("family", [f for f in TINY_FAMILIES if f != "deepseek_v3"])
def test_tiny_hf_family_loads_into_the_one_block(family):
    hf = tiny_hf_family(family, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                              "original_max_position_embeddings": 8})
    ours = tfbook_from_hf_llama(hf, attention="torch")
    ids = torch.randint(0, 97, (1, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = hf(ids).logits, ours(ids).logits
    assert (got - expected).abs().max() <= 2.0**-16 * expected.abs().max()
    assert ours.config.qk_norm == (family == "qwen3")
    assert ours.config.sliding_window == (4 if family == "mistral" else None)
    assert ours.config.rope_scaling["rope_type"] == "yarn"


def test_tiny_deepseek_v3_loads_into_the_one_block():
    hf = tiny_hf_family("deepseek_v3")
    ours = tfbook_from_hf_deepseek_v3(hf, attention="torch")
    ids = torch.randint(0, 97, (1, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = hf(ids).logits, ours(ids).logits
    assert (got - expected).abs().max() <= 2.0**-16 * expected.abs().max()
    c = ours.config
    assert (c.kv_lora_rank, c.routing, c.n_shared_experts, c.routed_scaling) == (
        16, "sigmoid", 1, 2.5)
    biases = [b for n, b in hf.named_buffers() if n.endswith("e_score_correction_bias")]
    assert biases and all(b.abs().max() > 0 for b in biases)  # the router biases are random


def test_tiny_hf_family_dynamic_scaling_reads_its_length_from_max_position_embeddings():
    hf = tiny_hf_family("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                                               "original_max_position_embeddings": 16})
    assert hf.config.max_position_embeddings == 16
    assert "original_max_position_embeddings" not in hf.config.rope_parameters
    with pytest.raises(ValueError, match="rope_type must be one of"):
        tiny_hf_family("llama", rope_scaling={"rope_type": "ntk", "factor": 2.0})


def test_hf_mla_output_is_deepseek_v3_attention_with_our_weights():
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(32, 4, kv_lora_rank=12, qk_nope_head_dim=8,
                                   qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=16,
                                   rope_precision="float32").eval()
    with torch.no_grad():
        for p in mla.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 2 else 1.0))
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = mla(x)[0]
    theirs = hf_mla_output(mla, x)
    assert (ours - theirs).abs().max() <= 2.0**-16 * theirs.abs().max()
    with pytest.raises(TypeError, match="mla must be a MultiHeadLatentAttention"):
        hf_mla_output(torch.nn.Linear(2, 2), x)
    with pytest.raises(ValueError, match=r"x must be a tensor \(B, T, C\)"):
        hf_mla_output(mla, x[0])
