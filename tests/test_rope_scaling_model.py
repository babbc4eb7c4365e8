"""RoPE scaling as a model setting (GPTConfig.rope_scaling): tiny tfbook GPTs equal Hugging
Face's LlamaForCausalLM (and Qwen3ForCausalLM) built with each rope_type, past the trained
length: trained on L = 16 positions (32 for Llama 3.1's rule, whose bands need a longer L
with these tiny heads), run on 40.

Bounds. With rope_precision="float32" (what config_from_hf_llama sets) the scaled frequencies
are computed in float32 operation for operation as HF computes them (tfbook.rope_scaling.
hf_float32_frequencies), so in float32, with HF's sdpa attention and our "torch" kernel, the
logits are asserted bit-for-bit equal on 1 and 2 pinned threads, uncached and cached, as in
tests/test_model_families.py. In float64 HF still computes its rotary table in float32 (so do
we: the same table), and everything else in float64: the logits agree to within 2^-40 of
their size (a few dozen roundings of 2^-53 each, with a margin of about a hundred), HF's
RMSNorm run in float64 as in test_model_families. With rope_precision="float64" our table
is the exact formula, HF's a float32 one: the two differ by at most the float32 error of
HF's frequencies (tests/test_rope_scaling.py float32_bound) carried through the angle, cos
and sin, asserted element by element.

"dynamic" (NTK) stretches by the current length T = max(position) + 1 of each call, so a
cached decode crosses the switch at T = L + 1, where the table leaves plain RoPE. HF keeps
the longest table it has built until a call shorter than L resets it; tfbook keeps nothing
between calls (the same tables whenever each call is at least as long as the one before, as
in generation; test_dynamic_keeps_no_state pins the difference).
"""

import dataclasses
import json
import math
import pickle

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from tests.pinned_threads import THREAD_COUNTS, pinned_threads
from tests.test_model_families import TINY as FAMILIES_TINY
from tests.test_model_families import decode_steps, hf_decode_steps, logits_of, randomized
from tests.test_rope_scaling import U, float32_bound
from tfbook.attention import MultiHeadAttention
from tfbook.blocks import BlockConfig
from tfbook.cache import KVCache
from tfbook.checkpoints.hf_llama import config_from_hf_llama, tfbook_from_hf_llama
from tfbook.generate.search import generate
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import smollm2_135m, tiny_llama
from tfbook.rope_scaling import (
    ROPE_SCALING_TYPES,
    RopeScaling,
    rope_inverse_frequencies,
    scaled_rope_cos_sin,
)
from tfbook.train.checkpoint import describe_model

F64_RELATIVE = 2.0**-40  # see the module docstring
BASE = 100.0  # a small base: the slow planes turn about once over L, so scaling matters
# test_model_families' tiny shapes (head size D = 8); max_position_embeddings set per type
TINY = {k: v for k, v in FAMILIES_TINY.items() if k != "max_position_embeddings"}
# rope_type -> (HF rope_parameters, HF max_position_embeddings)
SCALINGS = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, 64),
    "dynamic": ({"rope_type": "dynamic", "factor": 3.0}, 16),  # HF's L is max_position_...
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
              "beta_fast": 4.0, "beta_slow": 0.25}, 64),  # a ramp over planes 0 .. 3
    "llama3": ({"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 32,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}, 64),  # all three bands
}
IDS = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(2))  # (B, T)
# prefill and decode steps; "dynamic" crosses from plain RoPE (T <= 16) to stretched (T > 16)
CHUNKS = [[10, 1, 5, 1, 23], [14] + [1] * 26]


def llama(rope_type: str, attn: str = "sdpa") -> LlamaForCausalLM:
    settings, max_positions = SCALINGS[rope_type]
    torch.manual_seed(0)
    config = LlamaConfig(rope_parameters={"rope_theta": BASE, **settings},
                         max_position_embeddings=max_positions, attn_implementation=attn,
                         **TINY)
    return randomized(LlamaForCausalLM(config))


def qwen3_yarn(head_dim: int = 8) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(rope_parameters={"rope_theta": BASE, **SCALINGS["yarn"][0]},
                         max_position_embeddings=64, attn_implementation="sdpa",
                         rms_norm_eps=1e-6, **{**TINY, "head_dim": head_dim})
    return randomized(Qwen3ForCausalLM(config))


@pytest.fixture
def hf_norms_in_float64(monkeypatch):
    """HF's RMSNorm formula in the input's dtype (HF rounds the input to float32 first)."""
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                              + self.variance_epsilon))
    for norm in (LlamaRMSNorm, Qwen3RMSNorm):
        monkeypatch.setattr(norm, "forward", forward)


@pytest.mark.parametrize("rope_type", SCALINGS)
def test_config_read_from_hf(rope_type):
    settings, max_positions = SCALINGS[rope_type]
    config = config_from_hf_llama(llama(rope_type).config)
    expected = dict(settings)
    if rope_type == "dynamic":  # HF stretches from its max_position_embeddings
        expected["original_max_position_embeddings"] = max_positions
    assert config.rope_scaling == expected and config.rope_base == BASE
    assert config.rope_precision == "float32" and config.rope_convention == "half"
    # "dynamic": HF's max_position_embeddings is where stretching starts, not a limit
    assert config.max_len == (48 if rope_type == "dynamic" else max_positions)
    assert config.max_len >= IDS.size(1)


@THREAD_COUNTS
@pytest.mark.parametrize("rope_type", SCALINGS)
def test_float32_logits_equal_hf_bit_for_bit(rope_type, n_threads):
    hf = llama(rope_type)
    ours = tfbook_from_hf_llama(hf, attention="torch")
    with pinned_threads(n_threads):
        assert torch.equal(logits_of(ours, IDS), logits_of(hf, IDS))
        for chunks in CHUNKS:  # each starts below L: HF's dynamic table is reset
            assert torch.equal(decode_steps(ours, IDS, chunks), hf_decode_steps(hf, IDS, chunks))


@THREAD_COUNTS
@pytest.mark.parametrize("head_dim", [8, 16])
def test_float32_qwen3_with_yarn_equals_hf_bit_for_bit(head_dim, n_threads):
    """QK-norm and YaRN together (Qwen3 ships YaRN settings for long inputs), with heads of
    width / heads and wider (head_dim 16: the ramp runs over the planes of D = 16)."""
    hf = qwen3_yarn(head_dim)
    ours = tfbook_from_hf_llama(hf, attention="torch")
    assert ours.config.qk_norm and ours.config.rope_scaling["rope_type"] == "yarn"
    assert ours.config.head_size == head_dim
    with pinned_threads(n_threads):
        assert torch.equal(logits_of(ours, IDS), logits_of(hf, IDS))
        assert torch.equal(decode_steps(ours, IDS, CHUNKS[0]), hf_decode_steps(hf, IDS, CHUNKS[0]))


@pytest.mark.parametrize("rope_type", SCALINGS)
def test_float64_cached_and_uncached_equal_hf(rope_type, hf_norms_in_float64):
    hf = llama(rope_type).double()
    ours = tfbook_from_hf_llama(hf, attention="reference").double()
    full = logits_of(ours, IDS)
    atol = F64_RELATIVE * float(full.abs().max())
    np.testing.assert_allclose(logits_of(hf, IDS).numpy(), full.numpy(), rtol=0, atol=atol)
    for chunks in CHUNKS:
        cached = decode_steps(ours, IDS, chunks)
        np.testing.assert_allclose(hf_decode_steps(hf, IDS, chunks).numpy(), cached.numpy(),
                                   rtol=0, atol=atol)
        if rope_type != "dynamic":  # the keys of a static table do not depend on the chunks
            np.testing.assert_allclose(cached.numpy(), full.numpy(), rtol=0, atol=atol)


def test_float64_qwen3_with_yarn_equals_hf(hf_norms_in_float64):
    hf = qwen3_yarn().double()
    ours = tfbook_from_hf_llama(hf, attention="reference").double()
    full = logits_of(ours, IDS)
    atol = F64_RELATIVE * float(full.abs().max())
    np.testing.assert_allclose(logits_of(hf, IDS).numpy(), full.numpy(), rtol=0, atol=atol)


@pytest.mark.parametrize("rope_type", ["dynamic", "yarn"])
def test_greedy_generation_equals_hf_cached_and_uncached(rope_type, hf_norms_in_float64):
    """From a 6-token prompt to 36 tokens, past L = 16. "dynamic" rotates each new key
    with the table of its step when cached, every key with the last table when not: two
    different continuations, each HF's own with and without its cache."""
    hf = llama(rope_type).double()
    ours = tfbook_from_hf_llama(hf, attention="reference").double()
    ids = IDS[:, :6]
    found = {}
    for use_cache in (True, False):
        with torch.no_grad():
            expected = hf.generate(ids, max_new_tokens=30, do_sample=False, use_cache=use_cache)
        assert expected.size(1) == 36
        found[use_cache] = generate(ours, ids, 30, use_cache=use_cache).tokens
        assert torch.equal(found[use_cache], expected)
    assert torch.equal(found[True], found[False]) == (rope_type != "dynamic")


def test_dynamic_is_plain_rope_up_to_the_trained_length():
    """"dynamic" at T <= L is plain RoPE bit for bit; at T = L + 1 every position moves."""
    scaled = tfbook_from_hf_llama(llama("dynamic"))
    plain = GPT(dataclasses.replace(scaled.config, rope_scaling=None)).eval()
    plain.load_state_dict(scaled.state_dict())
    assert torch.equal(logits_of(scaled, IDS[:, :16]), logits_of(plain, IDS[:, :16]))
    longer = logits_of(scaled, IDS[:, :17]) - logits_of(plain, IDS[:, :17])
    assert (longer[:, 1:].abs().amax(-1) > 1e-4).all()  # position 0 is never rotated


def test_dynamic_keeps_no_state():
    """HF, after a longer call, reuses its longer table for a shorter one above L; tfbook
    computes each call's table from that call alone, as HF does on a fresh model."""
    hf = llama("dynamic")
    ours = tfbook_from_hf_llama(hf)
    fresh = logits_of(hf, IDS[:, :30])
    logits_of(hf, IDS)  # HF now holds the table of T = 40
    assert not torch.equal(logits_of(hf, IDS[:, :30]), fresh)
    logits_of(ours, IDS)
    assert torch.equal(logits_of(ours, IDS[:, :30]), fresh)


@pytest.mark.parametrize("rope_type", SCALINGS)
def test_float64_table_within_the_float32_bound_of_hf(rope_type):
    """rope_precision="float64" (the exact formula) against HF's float32 table: the angle
    p theta carries HF's relative error on theta (float32_bound) plus one rounding of the
    product; cos and sin move by at most the angle's error, plus 4 U for torch's float32 cos
    and sin (within 2 ulps), all times the attention factor, plus U for rounding ours."""
    hf = llama(rope_type)
    config = config_from_hf_llama(hf.config)
    positions = torch.arange(40)
    theirs = hf.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions[None])
    ours = scaled_rope_cos_sin(positions, 8, BASE, config.rope_scaling, "float64")
    scaling = RopeScaling.from_dict(dict(config.rope_scaling))
    theta, factor = rope_inverse_frequencies(8, BASE, scaling, seq_len=40)
    angles = positions[:, None].double() * theta  # (T, D/2) the exact angles
    bound = factor * (angles * (float32_bound(8, BASE, scaling) + U) + 4 * U) + U
    for ours_t, theirs_t in zip(ours, theirs, strict=True):
        error = (ours_t.double() - theirs_t[0, :, :4].double()).abs()
        assert (error <= bound).all(), float((error / bound).max())
    assert float((ours[0] - theirs[0][0, :, :4]).abs().max()) > 0  # not the same table


def test_the_standalone_attention_builds_the_same_table():
    """MultiHeadAttention without a model's table builds its own from its rope_scaling, for
    the positions after its cache ("dynamic": their current length), uncached and cached."""
    torch.manual_seed(0)
    scaling = {"rope_type": "dynamic", "factor": 3.0, "original_max_position_embeddings": 16}
    attn = MultiHeadAttention(32, 4, n_kv_heads=2, rope_base=BASE, rope_convention="half",
                              rope_scaling=scaling).double().eval()
    assert attn.rope_scaling == scaling
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    positions = torch.arange(40)

    def run(own_table: bool) -> torch.Tensor:
        cache, steps, start = KVCache(1, 40)[0], [], 0
        for size in CHUNKS[0]:
            table = None if own_table else scaled_rope_cos_sin(
                positions[start:start + size], 8, BASE, scaling, "float64", torch.float64)
            steps.append(attn(x[:, start:start + size], causal=True, cache=cache,
                              need_weights=False, rope_table=table)[0])
            start += size
        return torch.cat(steps, 1)

    with torch.no_grad():
        whole = scaled_rope_cos_sin(positions, 8, BASE, scaling, "float64", torch.float64)
        assert torch.equal(attn(x, causal=True, need_weights=False)[0],
                           attn(x, causal=True, need_weights=False, rope_table=whole)[0])
        assert torch.equal(run(own_table=True), run(own_table=False))


def test_the_block_and_model_carry_the_setting():
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    config = dataclasses.replace(tiny_llama(), rope_scaling=scaling)
    assert config.block_config().rope_scaling == scaling
    model = GPT(config)
    assert all(block.attn.rope_scaling == scaling for block in model.blocks)
    linear_1 = dataclasses.replace(tiny_llama(), rope_precision="float32",
                                   rope_scaling={"rope_type": "linear", "factor": 1.0})
    positions = torch.arange(50)
    plain = GPT(dataclasses.replace(linear_1, rope_scaling=None)).rope_table(positions,
                                                                             torch.float32)
    for ours, theirs in zip(GPT(linear_1).rope_table(positions, torch.float32), plain,
                            strict=True):
        assert torch.equal(ours, theirs)  # stretching by 1 is plain RoPE, bit for bit


def test_the_setting_is_frozen_json_and_hashable():
    settings = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    config = dataclasses.replace(tiny_llama(), rope_scaling=settings)
    settings["factor"] = 8.0  # the caller's dict: the config keeps its own copy
    assert config.rope_scaling["factor"] == 4.0
    with pytest.raises(TypeError, match=r"cannot be changed in place; make a new config"):
        config.rope_scaling["factor"] = 8.0
    with pytest.raises(TypeError, match=r"cannot be changed in place"):
        config.rope_scaling.update(factor=8.0)
    assert hash(config) == hash(dataclasses.replace(config))  # hashable, dict left out
    assert dataclasses.replace(config) == config
    stored = describe_model(GPT(config))["config"]
    assert stored["rope_scaling"] == {**settings, "factor": 4.0}
    assert GPTConfig(**json.loads(json.dumps(stored))) == config  # a checkpoint reads it back
    assert pickle.loads(pickle.dumps(config)) == config
    assert dataclasses.asdict(BlockConfig(rope_base=10000.0, rope_scaling=settings))[
        "rope_scaling"] == settings
    assert GPTConfig().rope_scaling is None and BlockConfig().rope_scaling is None


def test_smollm2_takes_a_scaling_through_replace():
    """The path of a long-context experiment: SmolLM2's config with a scaling and a longer
    max_len, as a new model on the same weights or as the loaded model's own config."""
    from tfbook.checkpoints.smollm2 import load_smollm2

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}
    assert dataclasses.replace(smollm2_135m(), rope_scaling=yarn).rope_scaling == yarn
    model = load_smollm2()
    config = dataclasses.replace(model.config, rope_scaling=yarn, max_len=32768)
    with torch.device("meta"):
        scaled = GPT(config)
    scaled.load_state_dict(model.state_dict(), assign=True)
    ids = torch.tensor([[1, 504, 3458, 282, 4372, 314, 253, 30]])
    far = torch.arange(20000, 20008)  # past the trained 8,192 positions
    with torch.no_grad():
        plain = model(ids).logits
        logits = scaled(ids, positions=far).logits
        model.config = config  # the table is rebuilt from model.config at every call
        assert torch.equal(model(ids, positions=far).logits, logits)
        near = model(ids).logits
    assert torch.isfinite(logits).all()
    assert float((near - plain).abs().max()) > 0.1  # YaRN's factor and slow planes


BAD = [
    ({"rope_type": "ntk", "factor": 2.0}, ValueError,
     rf"GPTConfig: rope_scaling rope_type must be one of {ROPE_SCALING_TYPES}".replace(
         "(", r"\(").replace(")", r"\)")),
    ({"rope_type": "linear", "factor": 0}, ValueError,
     r"GPTConfig: rope_scaling factor must be > 0, got factor=0"),
    ({"rope_type": "linear", "factor": -2.0}, ValueError, r"factor must be > 0"),
    ({"rope_type": "linear", "factor": "2"}, TypeError,
     r"GPTConfig: rope_scaling factor must be a number"),
    ({"rope_type": "yarn", "factor": 4.0}, ValueError,
     r"GPTConfig: rope_scaling of rope_type 'yarn' needs original_max_position_embeddings"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16},
     ValueError, r"'llama3' needs low_freq_factor"),
    ({"factor": 2.0}, ValueError, r"GPTConfig: rope_scaling needs rope_type"),
    ({"rope_type": "linear"}, ValueError, r"GPTConfig: rope_scaling needs factor"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 8.0}, ValueError,
     r"beta_fast belongs to rope_type 'yarn'"),
    ({"rope_type": "linear", "factor": 2.0, "scale": 2.0}, ValueError,
     r"GPTConfig: rope_scaling has unknown settings \['scale'\]"),
    ("yarn", TypeError, r"GPTConfig: rope_scaling must be None or a dict such as "),
    ([("rope_type", "linear")], TypeError, r"must be None or a dict .* got list"),
    (RopeScaling("linear", 2.0), TypeError, r"got RopeScaling"),
]


@pytest.mark.parametrize("value,error,message", BAD)
def test_bad_settings_are_refused_by_the_config(value, error, message):
    with pytest.raises(error, match=message):
        dataclasses.replace(tiny_llama(), rope_scaling=value)
    with pytest.raises(error, match=message.replace("GPTConfig", "BlockConfig")):
        BlockConfig(rope_base=10000.0, rope_scaling=value)


def test_scaling_without_rope_is_refused():
    linear = {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match=r"GPTConfig: rope_scaling scales the rotary "
                                         r"frequencies, but position='learned' has none"):
        GPTConfig(rope_scaling=linear)
    with pytest.raises(ValueError, match=r"BlockConfig: .* no RoPE here \(rope_base=None\)"):
        BlockConfig(rope_scaling=linear)
    with pytest.raises(ValueError, match=r"MultiHeadAttention: .* no RoPE here"):
        MultiHeadAttention(32, 4, rope_scaling=linear)
    with pytest.raises(ValueError, match=r"MultiHeadAttention: rope_scaling factor must be"):
        MultiHeadAttention(32, 4, rope_base=BASE, rope_scaling={"rope_type": "linear",
                                                                "factor": 0.0})
    with pytest.raises(ValueError, match=r"GPTConfig: rope_scaling of rope_type 'dynamic' "
                                         r"\(NTK-aware\) needs a head size D >= 4"):
        GPTConfig(position="rope", n_heads=32, d_model=64, rope_scaling={
            "rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8})


def test_unsupported_hf_rope_settings_are_refused():
    config = LlamaConfig(**TINY)
    config.rope_parameters = {"rope_type": "longrope", "rope_theta": BASE, "factor": 4.0}
    with pytest.raises(ValueError, match=r"expected rope_type 'default' or one of "
                                         r"\('linear', 'dynamic', 'yarn', 'llama3'\), got "
                                         r"'longrope'"):
        config_from_hf_llama(config)
    config.rope_parameters = {"rope_type": "default", "rope_theta": BASE,
                              "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match=r"partial_rotary_factor=0.5"):
        config_from_hf_llama(config)
    # YaRN without a factor: HF's max_position_embeddings / original_max_position_embeddings
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": BASE,
                              "original_max_position_embeddings": 16, "beta_fast": 0}
    config.max_position_embeddings = 64
    assert config_from_hf_llama(config).rope_scaling == {
        "rope_type": "yarn", "original_max_position_embeddings": 16, "factor": 4.0}
    assert math.isclose(config_from_hf_llama(config, max_len=100).max_len, 100)
