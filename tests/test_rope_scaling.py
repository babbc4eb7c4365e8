"""RoPE scaling (linear, dynamic NTK, YaRN, Llama 3.1) against HF's ROPE_INIT_FUNCTIONS."""

import math

import pytest
import torch

from tfbook.rope import rope_frequencies, scaled_rope_frequencies
from tfbook.rope_scaling import (
    ROPE_SCALING_TYPES,
    RopeScaling,
    rope_inverse_frequencies,
    yarn_attention_factor,
)

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

U = 2.0**-24  # float32 unit roundoff: one correctly rounded float32 operation is within U


def hf(D, base, settings, max_positions, seq_len=None):
    """Hugging Face's (inv_freq, attention_factor) for a LlamaConfig with these rope settings."""
    config = LlamaConfig(
        hidden_size=2 * D, num_attention_heads=2, head_dim=D, num_hidden_layers=1,
        intermediate_size=8, vocab_size=8, max_position_embeddings=max_positions,
        rope_parameters={"rope_theta": base, **settings},
    )
    return ROPE_INIT_FUNCTIONS[settings["rope_type"]](config, "cpu", seq_len=seq_len)


def float32_bound(D, base, scaling):
    """A bound on |HF's float32 theta - exact theta| / exact theta, operation by operation.

    HF's plain table 1 / base^(2n/D) in float32: the exponent 2n/D (<= 1) is rounded (relative
    error ln(base) U in base^e), base itself is rounded to float32 (e U <= U), pow is within
    1 ulp (2U), the reciprocal U: (ln(base) + 4) U. Every further multiplication, division or
    sum adds U each; we allow 6 more, (ln(base) + 10) U in all. YaRN and Llama 3.1 mix theta
    and theta / factor with a weight w computed in float32: an error dw moves the result by
    at most dw (theta - theta / factor) <= dw factor result, so factor * dw is added:
    YaRN's ramp (n - low) / (high - low) is off by dw <= (3 + 2 (|low| + D/2) / (high - low)) U;
    Llama's s = (L / lambda - low) / (high - low), with L / lambda <= high in its band, carries
    the table's relative error times high / (high - low):
    dw <= high / (high - low) (ln(base) + 10) U.
    """
    rel = (math.log(base) + 10) * U
    if scaling.rope_type == "yarn":
        beta_fast, beta_slow = scaling.yarn_betas
        L = scaling.original_max_position_embeddings
        low = D * math.log(L / (beta_fast * 2 * math.pi)) / (2 * math.log(base))
        high = D * math.log(L / (beta_slow * 2 * math.pi)) / (2 * math.log(base))
        if scaling.truncate is not False:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, D - 1)
        width = max(high - low, 0.001)
        rel += scaling.factor * (3 + 2 * (abs(low) + D / 2) / width) * U
    if scaling.rope_type == "llama3":
        hi, lo = scaling.high_freq_factor, scaling.low_freq_factor
        rel += scaling.factor * hi / (hi - lo) * (math.log(base) + 10) * U
    return rel


def assert_equal_to_hf(D, base, settings, max_positions, seq_len=None):
    scaling = RopeScaling.from_dict(settings)
    ours, our_factor = rope_inverse_frequencies(D, base, scaling, seq_len=seq_len)
    theirs, their_factor = hf(D, base, dict(settings), max_positions, seq_len)
    assert ours.dtype == torch.float64 and ours.shape == theirs.shape == (D // 2,)
    assert theirs.dtype == torch.float32
    rel = ((theirs.double() - ours).abs() / ours).max().item()
    assert rel <= float32_bound(D, base, scaling), (settings, rel)
    assert our_factor == their_factor  # the same Python float arithmetic: exactly equal
    return ours, our_factor


DIMS = (4, 8, 64, 128)
BASES = (10000.0, 500000.0, 1000000.0)


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", (1.0, 2.0, 4.0, 8.0, 0.5))
def test_linear_equals_hf(D, base, factor):
    settings = {"rope_type": "linear", "factor": factor}
    theta, attention = assert_equal_to_hf(D, base, settings, 2048)
    assert torch.equal(theta, rope_frequencies(D, base) / factor) and attention == 1.0
    if factor >= 1:  # the rope chapter's position interpolation
        assert torch.equal(theta, scaled_rope_frequencies(D, factor, "interpolation", base))


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", (1.0, 2.0, 4.0, 16.0))
@pytest.mark.parametrize("seq_len", (None, 100, 2048, 3000, 8192, 40000))
def test_dynamic_equals_hf(D, base, factor, seq_len):
    L = 2048
    settings = {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": L}
    hf_settings = {"rope_type": "dynamic", "factor": factor}
    scaling = RopeScaling.from_dict(settings)
    ours, attention = rope_inverse_frequencies(D, base, scaling, seq_len=seq_len)
    theirs, their_attention = hf(D, base, hf_settings, L, seq_len)
    rel = ((theirs.double() - ours).abs() / ours).max().item()
    assert rel <= float32_bound(D, base, scaling) and attention == their_attention == 1.0
    if seq_len is None or seq_len <= L:  # within the trained context: plain RoPE
        assert torch.allclose(ours, rope_frequencies(D, base), rtol=1e-13)
    elif seq_len == 2 * L * 2:  # T = 4L: stretch s = 3 factor + 1, the book's static NTK
        assert torch.allclose(ours, scaled_rope_frequencies(D, 3 * factor + 1, "ntk", base),
                              rtol=1e-13)


YARN_CASES = [
    {},
    {"beta_fast": 16.0, "beta_slow": 2.0},
    {"beta_fast": 64, "beta_slow": 0.5, "truncate": False},
    {"truncate": False},
    {"attention_factor": 0.75},
    {"mscale": 1.0, "mscale_all_dim": 0.707},  # DeepSeek-V3's pair, ratio != 1
    {"mscale": 0.707, "mscale_all_dim": 0.707},  # DeepSeek-V2's: the ratio is 1
]


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", (1.0, 2.0, 4.0, 40.0))
@pytest.mark.parametrize("L", (512, 4096))
@pytest.mark.parametrize("extra", YARN_CASES, ids=range(len(YARN_CASES)))
def test_yarn_equals_hf(D, base, factor, L, extra):
    settings = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L,
                **extra}
    theta, attention = assert_equal_to_hf(D, base, settings, int(L * factor))
    plain = rope_frequencies(D, base)
    # every plane lies between position interpolation and plain RoPE
    assert bool(((theta <= plain * (1 + 1e-15)) & (theta >= plain / factor * (1 - 1e-15))).all())
    if not extra:
        assert attention == yarn_attention_factor(factor) == (
            1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0)


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", (1.0, 2.0, 8.0, 32.0))
@pytest.mark.parametrize("L,low,high", [(8192, 1.0, 4.0), (1024, 1.0, 4.0), (8192, 2.0, 8.0),
                                        (256, 0.5, 1.5)])
def test_llama3_equals_hf(D, base, factor, L, low, high):
    settings = {"rope_type": "llama3", "factor": factor, "original_max_position_embeddings": L,
                "low_freq_factor": low, "high_freq_factor": high}
    theta, attention = assert_equal_to_hf(D, base, settings, int(L * factor))
    plain = rope_frequencies(D, base)
    wavelength = 2 * math.pi / plain
    assert torch.equal(theta[wavelength < L / high], plain[wavelength < L / high])
    assert torch.equal(theta[wavelength > L / low], plain[wavelength > L / low] / factor)
    assert attention == 1.0


def test_llama_3_1_release_settings():
    # Llama 3.1's own config: factor 8, low 1, high 4, original 8192, rope_theta 500000, D 128
    settings = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    theta, _ = assert_equal_to_hf(128, 500000.0, settings, 131072)
    plain = rope_frequencies(128, 500000.0)
    kept, divided = (theta == plain).sum().item(), (theta == plain / 8).sum().item()
    assert kept > 0 and divided > 0 and kept + divided < 64  # some planes in the smooth band


def test_no_scaling_is_plain_rope():
    theta, attention = rope_inverse_frequencies(64, 10000.0)
    assert torch.equal(theta, rope_frequencies(64, 10000.0)) and attention == 1.0


def test_a_dict_and_the_old_type_key_are_accepted():
    a = rope_inverse_frequencies(16, 10000.0, {"type": "linear", "factor": 2.0})
    b = rope_inverse_frequencies(16, 10000.0, RopeScaling("linear", 2.0))
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
    assert RopeScaling.from_dict({"rope_type": "linear", "factor": 2, "rope_theta": 1e4})


def test_settings_are_frozen():
    scaling = RopeScaling("linear", 2.0)
    with pytest.raises(AttributeError):
        scaling.factor = 3.0


@pytest.mark.parametrize("bad,error,words", [
    ({"rope_type": "ntk", "factor": 2.0}, ValueError, "('linear', 'dynamic', 'yarn', 'llama3')"),
    ({"rope_type": "linear", "factor": 0.0}, ValueError, "factor must be > 0"),
    ({"rope_type": "linear", "factor": -2.0}, ValueError, "factor must be > 0"),
    ({"rope_type": "linear", "factor": "4"}, TypeError, "factor must be a number"),
    ({"rope_type": "linear", "factor": True}, TypeError, "factor must be a number"),
    ({"rope_type": "linear", "factor": None}, TypeError, "factor must be a number"),
    ({"rope_type": "linear"}, ValueError, "needs factor"),
    ({"factor": 2.0}, ValueError, "needs rope_type"),
    ({"rope_type": "dynamic", "factor": 2.0}, ValueError,
     "needs original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 2.0}, ValueError, "needs original_max_position_embeddings"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
      "low_freq_factor": 1.0}, ValueError, "needs high_freq_factor"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
      "low_freq_factor": 4.0, "high_freq_factor": 1.0}, ValueError,
     "high_freq_factor must be greater than low_freq_factor"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0}, ValueError,
     "original_max_position_embeddings must be a positive int"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096.0},
     ValueError, "original_max_position_embeddings must be a positive int"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512,
      "beta_fast": 1.0, "beta_slow": 2.0}, ValueError, "beta_fast must be greater than beta_slow"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512,
      "beta_slow": 0}, ValueError, "beta_slow must be > 0"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512,
      "truncate": "yes"}, TypeError, "truncate must be True or False"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 32.0}, ValueError,
     "beta_fast belongs to rope_type 'yarn'"),
    ({"rope_type": "linear", "factor": 2.0, "scale": 2.0}, ValueError,
     "unknown settings ['scale']"),
])
def test_bad_settings_are_named(bad, error, words):
    with pytest.raises(error) as info:
        rope_inverse_frequencies(16, 10000.0, bad)
    assert words in str(info.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive even head size D"):
        rope_inverse_frequencies(7, 10000.0, {"rope_type": "linear", "factor": 2.0})
    with pytest.raises(TypeError, match="base must be a number"):
        rope_inverse_frequencies(8, "1e4")
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        rope_inverse_frequencies(8, 1e4, RopeScaling("dynamic", 2.0, 512), seq_len=0)
    with pytest.raises(ValueError, match="NTK-aware scaling needs D >= 4"):
        rope_inverse_frequencies(2, 1e4, RopeScaling("dynamic", 2.0, 512), seq_len=1024)
    with pytest.raises(TypeError, match="scaling must be a RopeScaling"):
        rope_inverse_frequencies(8, 1e4, "linear")
    assert set(ROPE_SCALING_TYPES) <= set(ROPE_INIT_FUNCTIONS)


FLOAT32_CASES = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "linear", "factor": 2.5},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
     "beta_fast": 64, "beta_slow": 0.5, "truncate": False},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
     "mscale": 1.0, "mscale_all_dim": 0.707},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
     "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    {"rope_type": "llama3", "factor": 3.0, "original_max_position_embeddings": 256,
     "low_freq_factor": 0.5, "high_freq_factor": 1.5},
]


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("settings", FLOAT32_CASES, ids=range(len(FLOAT32_CASES)))
def test_float32_precision_is_hf_bit_for_bit(D, base, settings):
    """precision="float32" repeats HF's float32 operations: the very same table."""
    ours, factor = rope_inverse_frequencies(D, base, settings, precision="float32")
    theirs, their_factor = hf(D, base, dict(settings), 8192)
    assert ours.dtype == torch.float32 and torch.equal(ours, theirs) and factor == their_factor


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", (1.7, 2.0, 16.0))
@pytest.mark.parametrize("seq_len", (None, 100, 2048, 2049, 3000, 40000))
def test_float32_dynamic_is_hf_forward_bit_for_bit(D, base, factor, seq_len):
    """HF's rotary module keeps its first table up to L; past L it rebuilds it from the
    length as a tensor (max(position_ids) + 1), which makes the stretched base float32."""
    L = 2048
    ours, _ = rope_inverse_frequencies(D, base, {"rope_type": "dynamic", "factor": factor,
                                                 "original_max_position_embeddings": L},
                                       seq_len=seq_len, precision="float32")
    rebuilt = seq_len is not None and seq_len > L
    theirs, _ = hf(D, base, {"rope_type": "dynamic", "factor": factor}, L,
                   torch.tensor(seq_len) if rebuilt else None)
    assert torch.equal(ours, theirs)


def test_bad_precision():
    with pytest.raises(ValueError, match=r"precision must be one of \('float64', 'float32'\)"):
        rope_inverse_frequencies(8, 1e4, {"rope_type": "linear", "factor": 2.0},
                                 precision="float16")
