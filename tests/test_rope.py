"""RoPE: relative property, norms, the two conventions, one table per forward pass."""

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tfbook.attention import MultiHeadAttention
from tfbook.models.gpt import GPT
from tfbook.models.llama import tiny_llama
from tfbook.rope import (
    apply_rope,
    half_split_permutation,
    relative_scores,
    rope_cos_sin,
    rope_frequencies,
    scaled_rope_frequencies,
    to_half_split,
    to_interleaved,
)

D = 16


def rotated(x: torch.Tensor, pos: int, convention: str) -> torch.Tensor:
    return apply_rope(x[None], torch.tensor([pos]), convention=convention)[0]


@settings(max_examples=60, deadline=None)
@given(
    i=st.integers(0, 5000), j=st.integers(0, 5000), shift=st.integers(-3000, 3000),
    seed=st.integers(0, 2**16), convention=st.sampled_from(["interleaved", "half"]),
)
def test_score_depends_only_on_offset(i, j, shift, seed, convention):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(D, generator=g, dtype=torch.float64), torch.randn(D, generator=g,
                                                                         dtype=torch.float64)
    i2, j2 = i + shift, j + shift
    if i2 < 0 or j2 < 0:
        i2, j2 = i - shift, j - shift
    score = rotated(q, i, convention) @ rotated(k, j, convention)
    shifted = rotated(q, i2, convention) @ rotated(k, j2, convention)
    assert torch.allclose(score, shifted, atol=1e-9)


def test_rotation_keeps_norms_and_position_zero_is_identity():
    x = torch.randn(2, 10, D, dtype=torch.float64)
    for convention in ("interleaved", "half"):
        y = apply_rope(x, convention=convention)
        assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1))
        assert torch.allclose(y[:, 0], x[:, 0])


def test_first_plane_rotates_by_position_radians():
    x = torch.zeros(3, D, dtype=torch.float64)
    x[:, 0] = 1.0  # unit vector along the first coordinate of plane 0 (theta_0 = 1)
    y = apply_rope(x)
    for pos in range(3):
        expected = torch.tensor([torch.cos(torch.tensor(pos * 1.0)),
                                 torch.sin(torch.tensor(pos * 1.0))], dtype=torch.float64)
        assert torch.allclose(y[pos, :2], expected)


def test_conventions_agree_up_to_the_feature_permutation():
    x = torch.randn(2, 3, 12, D, dtype=torch.float64)
    inter = apply_rope(x, convention="interleaved", base=500.0)
    half = apply_rope(to_half_split(x), convention="half", base=500.0)
    assert torch.allclose(to_half_split(inter), half)
    assert torch.allclose(inter, to_interleaved(half))
    assert half_split_permutation(6).tolist() == [0, 2, 4, 1, 3, 5]
    assert torch.equal(to_interleaved(to_half_split(x)), x)


def test_bad_arguments():
    with pytest.raises(ValueError, match="one of .*got 'neox'"):
        apply_rope(torch.randn(3, D), convention="neox")
    with pytest.raises(ValueError, match="even head size D, got D=5"):
        apply_rope(torch.randn(3, 5))
    with pytest.raises(ValueError, match=r"\(T,\) = \(3,\), got \(4,\)"):
        apply_rope(torch.randn(3, D), torch.arange(4))


def test_relative_scores_equal_rotating_both_vectors():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(D, generator=g, dtype=torch.float64), torch.randn(D, generator=g,
                                                                         dtype=torch.float64)
    offsets = torch.arange(0, 40)
    scores = relative_scores(q, k, offsets, convention="half")
    for m in (0, 7, 39):
        both = rotated(q, 100, "half") @ rotated(k, 100 + m, "half")
        assert torch.allclose(scores[m], both)
    # long-term decay: with q = k = ones the score shrinks (on average) with the distance
    decay = relative_scores(torch.ones(64), torch.ones(64), torch.arange(0, 1000))
    assert decay[0] == 64 and decay[:10].mean() > decay[100:200].abs().mean()


def test_no_table_is_kept_between_calls():
    """rope.py remembers nothing: the model builds the table once per forward pass."""
    import tfbook.rope

    cached = [name for name, f in vars(tfbook.rope).items() if hasattr(f, "cache_info")]
    assert cached == [] and not hasattr(tfbook.rope, "_LAST_TABLE")
    positions = torch.arange(5)
    first = rope_cos_sin(positions, 8)
    positions.add_(3)  # changed in place: a new call sees the new positions
    assert torch.equal(rope_cos_sin(positions, 8)[0], rope_cos_sin(torch.arange(3, 8), 8)[0])
    assert not torch.equal(rope_cos_sin(positions, 8)[0], first[0])


def counting(monkeypatch, module, calls: list) -> None:
    """Replace module.rope_cos_sin by a wrapper that records each call."""
    plain = module.rope_cos_sin

    def wrapper(*args, **kwargs):
        calls.append(args[0].shape)
        return plain(*args, **kwargs)

    monkeypatch.setattr(module, "rope_cos_sin", wrapper)


@pytest.mark.parametrize("n_layers", [1, 3])
def test_a_model_builds_the_table_once_per_forward_pass(monkeypatch, n_layers):
    import tfbook.attention
    import tfbook.models.gpt

    torch.manual_seed(0)
    model = GPT(replace(tiny_llama(), n_layers=n_layers)).eval()
    ids = torch.randint(0, 256, (2, 6))
    expected = model(ids).logits
    by_model, by_layers = [], []
    counting(monkeypatch, tfbook.models.gpt, by_model)
    counting(monkeypatch, tfbook.attention, by_layers)
    assert torch.equal(model(ids).logits, expected)
    cache = model.new_cache()
    model(ids[:, :5], cache=cache)  # prefill, then one decode step
    step = model(ids[:, 5:], cache=cache).logits
    assert by_model == [(6,), (5,), (1,)] and by_layers == []  # once per pass, never per layer
    assert (step - expected[:, 5:]).abs().max() <= 1e-5


@pytest.mark.parametrize("per_row", [False, True])
def test_standalone_attention_builds_the_same_table_itself(per_row):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, n_kv_heads=2, rope_base=500.0).eval()
    x = torch.randn(2, 5, 32)
    positions = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]]) if per_row else torch.arange(5)
    own, _ = mha(x, positions=positions)
    given, _ = mha(x, rope_table=rope_cos_sin(positions, 8, 500.0))
    assert torch.equal(own, given)
    torch.manual_seed(0)  # the same weights, without RoPE: the rotation did something
    unrotated, _ = MultiHeadAttention(32, 4, n_kv_heads=2).eval()(x)
    assert not torch.allclose(own, unrotated, atol=1e-3)


def test_bad_tables_are_refused():
    mha = MultiHeadAttention(32, 4, rope_base=500.0)
    x = torch.randn(2, 5, 32)
    cos, sin = rope_cos_sin(torch.arange(6), 8, 500.0)  # six positions for five queries
    with pytest.raises(ValueError, match=r"rope_table must be \(cos, sin\), each of shape "
                                         r"\(T, D/2\) = \(5, 4\).*got \(\(6, 4\), \(6, 4\)\)"):
        mha(x, rope_table=(cos, sin))
    with pytest.raises(ValueError, match=r"rope_table must be \(cos, sin\).*got Tensor"):
        mha(x, rope_table=cos)
    table = rope_cos_sin(torch.arange(5), 8, 500.0)
    with pytest.raises(ValueError, match=r"this call is without RoPE \(rope_base=None\)"):
        MultiHeadAttention(32, 4)(x, rope_table=table)
    with pytest.raises(ValueError, match=r"this call is cross-attention"):
        mha(x, torch.randn(2, 3, 32), rope_table=table)


@pytest.mark.parametrize("method,rope_type", [("interpolation", "linear"), ("ntk", "dynamic")])
@pytest.mark.parametrize("D,factor", [(64, 4.0), (128, 8.0), (16, 2.0)])
def test_scaled_frequencies_match_hugging_face(method, rope_type, D, factor):
    from transformers import LlamaConfig
    from transformers import modeling_rope_utils as utils

    config = LlamaConfig(
        hidden_size=4 * D, num_attention_heads=4, max_position_embeddings=2048,
        rope_parameters={"rope_type": rope_type, "factor": factor, "rope_theta": 10000.0},
    )
    if rope_type == "linear":
        reference = utils._compute_linear_scaling_rope_parameters(config)[0]
    else:
        # dynamic NTK raises the base by (factor * T / L - (factor - 1))^(D / (D - 2)) at
        # length T; at T = L (2 factor - 1) / factor that is the static factor^(D / (D - 2))
        T = 2048 * (2 * factor - 1) / factor
        reference = utils._compute_dynamic_ntk_parameters(config, seq_len=T)[0]
    reference = reference.double()  # float32 there
    ours = scaled_rope_frequencies(D, factor, method)
    assert torch.allclose(ours, reference, rtol=1e-5, atol=0)


def test_ntk_keeps_the_fastest_plane_and_slows_the_slowest_by_the_factor():
    plain = rope_frequencies(64)
    ntk = scaled_rope_frequencies(64, 8.0, "ntk")
    assert math.isclose(ntk[0].item(), plain[0].item())
    assert math.isclose((plain[-1] / ntk[-1]).item(), 8.0, rel_tol=1e-12)


def test_scaled_frequencies_refuse_bad_arguments():
    with pytest.raises(ValueError, match="method must be one of"):
        scaled_rope_frequencies(64, 2.0, "yarn")
    with pytest.raises(ValueError, match="factor >= 1, got factor=0.5"):
        scaled_rope_frequencies(64, 0.5, "ntk")
