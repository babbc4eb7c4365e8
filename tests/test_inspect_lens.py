"""The logit lens (tfbook.inspect.lens): both definitions, their relation, the readers."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.inspect_models import U, eiffel_run, readout_bound, tiny_run
from tfbook.inspect import run_with_cache
from tfbook.inspect.lens import (
    entropy,
    kl_to_final,
    lens_names,
    linearised_norm,
    logit_lens,
    norm_bias,
    norm_scale,
    residual_stack,
    scale_ratios,
    target_prob,
    target_rank,
    top_tokens,
)
from tfbook.models.bert import Bert, BertConfig

KINDS = ("gpt", "llama")


@pytest.fixture(scope="module", params=KINDS)
def run(request):
    """(model, ids, output, cache with every residual stream) of a tiny decoder."""
    return tiny_run(request.param, lambda m: lens_names(m, incl_mid=True), batch=2, seed=1)


def final_normed(model, stack):
    """|g (x - mu) / s_L| + |b| for every stream: the size of what the unembedding reads."""
    s_L = norm_scale(model.norm_f, stack[-1])
    bias = norm_bias(model.norm_f)
    return linearised_norm(model.norm_f, stack, s_L).abs() + (0 if bias is None else bias.abs())


@pytest.fixture(scope="module")
def smollm2():
    return eiffel_run(lens_names)


def test_stack_is_every_stream_in_order(run):
    model, _, _, cache = run
    stack, names = residual_stack(model, cache)
    assert names == ["blocks.0.residual_pre", "blocks.0.residual_post", "blocks.1.residual_post"]
    assert stack.shape == (3, 2, 9, 64)
    assert all(torch.equal(stack[i], cache[n]) for i, n in enumerate(names))
    _, with_mid = residual_stack(model, cache, incl_mid=True)
    assert with_mid == ["blocks.0.residual_pre", "blocks.0.residual_mid", "blocks.0.residual_post",
                        "blocks.1.residual_mid", "blocks.1.residual_post"]
    # the stream entering block 1 is the one leaving block 0 (TransformerLens's "1_pre")
    _, full = run_with_cache(model, run[1], names="*.residual_*")
    assert torch.equal(full["blocks.1.residual_pre"], full["blocks.0.residual_post"])


def test_shapes_and_positions(run):
    model, _, _, cache = run
    V = model.config.vocab_size
    assert logit_lens(model, cache).shape == (3, 2, 9, V)
    assert logit_lens(model, cache, incl_mid=True).shape == (5, 2, 9, V)
    full = logit_lens(model, cache, scale="final")
    last = logit_lens(model, cache, scale="final", positions=-1)  # the T axis dropped
    some = logit_lens(model, cache, scale="final", positions=[0, -1])
    assert last.shape == (3, 2, V) and some.shape == (3, 2, 2, V)
    bound = readout_bound(final_normed(model, residual_stack(model, cache)[0]),
                          model.lm_head.weight)
    assert ((last - full[:, :, -1]).abs() <= bound[:, :, -1]).all()
    assert ((some - full[:, :, [0, 8]]).abs() <= bound[:, :, [0, 8]]).all()


def test_recomputed_last_layer_is_the_models_logits(run):
    model, _, out, cache = run
    lens = logit_lens(model, cache)
    h = model.norm_f(cache["blocks.1.residual_post"])
    assert ((lens[-1] - out.logits).abs() <= readout_bound(h, model.lm_head.weight)).all()


def test_both_definitions_agree_at_the_last_layer(run):
    model, _, _, cache = run
    recomputed, final = logit_lens(model, cache), logit_lens(model, cache, scale="final")
    h = model.norm_f(cache["blocks.1.residual_post"])
    # the same norm computed two ways: one more rounding of the scale on each side
    bound = readout_bound(h, model.lm_head.weight) * 2
    assert ((final[-1] - recomputed[-1]).abs() <= bound).all()
    assert not torch.allclose(final[0], recomputed[0], atol=1e-3)  # and differ before it


def test_layer0_by_hand(run):
    """The embeddings through the final norm and the tied unembedding, written out."""
    model, ids, _, cache = run
    E, g, T = model.tok_emb.weight, model.norm_f.weight, ids.size(1)
    x0 = E[ids] if model.pos_emb is None else E[ids] + model.pos_emb.weight[:T]
    x_L = cache["blocks.1.residual_post"]
    if model.config.norm == "layer":
        b = model.norm_f.bias
        by_hand = F.layer_norm(x0, (64,), g, b) @ E.T
        s_L = torch.sqrt(x_L.var(-1, unbiased=False, keepdim=True) + 1e-5)
        final_by_hand = (g * (x0 - x0.mean(-1, keepdim=True)) / s_L + b) @ E.T
    else:
        by_hand = (g * x0 / torch.sqrt(x0.pow(2).mean(-1, keepdim=True) + 1e-5)) @ E.T
        s_L = torch.sqrt(x_L.pow(2).mean(-1, keepdim=True) + 1e-5)
        final_by_hand = (g * x0 / s_L) @ E.T
    h = model.norm_f(x0)
    bound = readout_bound(h.abs() + 1, E) * 2  # each side's norm within gamma_{C+8}
    assert ((logit_lens(model, cache)[0] - by_hand).abs() <= bound).all()
    h_final = (g * x0 / s_L).abs() + 1
    assert ((logit_lens(model, cache, scale="final")[0] - final_by_hand).abs()
            <= readout_bound(h_final, E) * 2).all()


def test_final_scale_is_recomputed_at_a_temperature(run):
    """Without the norm's bias: final_l = rho_l * recomputed_l, rho_l = s_l / s_L."""
    model, _, _, cache = run
    rho = scale_ratios(model, cache)[..., None]  # (N, B, T, 1)
    stack, _ = residual_stack(model, cache)
    recomputed, final = logit_lens(model, cache), logit_lens(model, cache, scale="final")
    bias = model.norm_f.bias if model.config.norm == "layer" else None
    shift = 0.0 if bias is None else bias @ model.lm_head.weight.T  # b W_U^T, (V,)
    bound = readout_bound(final_normed(model, stack), model.lm_head.weight) * 2
    assert ((final - shift - rho * (recomputed - shift)).abs() <= bound).all()
    assert torch.equal(rho[-1], torch.ones_like(rho[-1]))


def test_readers_by_hand():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    assert target_rank(logits, 2).tolist() == [2, 0]  # two logits above 2.0; ties rank 0
    assert target_rank(logits, torch.tensor([1, 3])).tolist() == [0, 0]
    p = torch.softmax(logits, -1)
    assert torch.allclose(target_prob(logits, 0), p[:, 0])
    probs, ids = top_tokens(logits, k=2)
    assert ids[0].tolist() in ([1, 3], [3, 1]) and torch.allclose(probs[0], p[0, [1, 3]])
    assert abs(entropy(logits)[1].item() - math.log(4)) <= 8 * U * math.log(4)
    lens = torch.stack([logits, logits.flip(-1), logits])  # (N=3, 2, V)
    kl = kl_to_final(lens)
    assert kl.shape == (3, 2) and kl[-1].abs().max() <= 1e-6 and kl[0].abs().max() <= 1e-6
    by_hand = (p * (p.log() - torch.log_softmax(logits.flip(-1), -1))).sum(-1)
    assert torch.allclose(kl[1], by_hand, atol=1e-6)


def test_smollm2_the_two_lenses(smollm2):
    model, tok, ids, out, cache = smollm2
    recomputed = logit_lens(model, cache, positions=-1)  # (31, 1, V)
    final = logit_lens(model, cache, scale="final", positions=-1)
    assert recomputed.shape == final.shape == (31, 1, 49152)
    h = model.norm_f(cache["blocks.29.residual_post"][:, -1])
    bound = readout_bound(h, model.lm_head.weight)
    assert ((recomputed[-1] - out.logits[:, -1]).abs() <= bound).all()
    assert ((final[-1] - out.logits[:, -1]).abs() <= 2 * bound).all()
    paris = tok.encode(" Paris")[0]
    assert target_rank(recomputed[-1], paris).item() == 0  # the model's answer
    # the embeddings' stream is tiny next to the last one: divided by the last one's scale
    # its logits are nearly uniform, while its own scale reads a confident guess
    rho = scale_ratios(model, cache, positions=-1)[:, 0]
    H_rec, H_fin = entropy(recomputed)[:, 0], entropy(final)[:, 0]
    log_V = math.log(49152)
    assert rho[0] < 0.01 and H_fin[0] > 0.99 * log_V and H_rec[0] < 0.1
    assert (H_fin[:-1] > H_rec[:-1]).sum() >= 25  # flatter at nearly every layer
    assert torch.equal(top_tokens(recomputed[0], 1)[1], top_tokens(final[0], 1)[1])


def test_bad_input(run):
    model, ids, _, cache = run
    with pytest.raises(ValueError, match="scale must be one of"):
        logit_lens(model, cache, scale="cached")
    with pytest.raises(ValueError, match="lens_names"):
        logit_lens(model, {"blocks.0.residual_pre": cache["blocks.0.residual_pre"]})
    with pytest.raises(TypeError, match="ActivationCache"):
        logit_lens(model, [1, 2])
    with pytest.raises(TypeError, match="decoder"):
        logit_lens(Bert(BertConfig(vocab_size=50, max_len=16, n_layers=1, n_heads=2,
                                   d_model=8, d_ff=16)), cache)
    with pytest.raises(TypeError, match="decoder"):
        lens_names(torch.nn.Linear(2, 2))
    with pytest.raises(IndexError, match="out of range"):
        logit_lens(model, cache, positions=9)
    with pytest.raises(TypeError, match="positions"):
        logit_lens(model, cache, positions=1.5)
    logits = torch.zeros(3, 5)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        target_rank(logits, 5)
    with pytest.raises(TypeError, match="token id"):
        target_prob(logits, 1.0)
    with pytest.raises(ValueError, match="broadcast"):
        target_rank(logits, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="k must be"):
        top_tokens(logits, 6)
    with pytest.raises(TypeError, match="float tensor"):
        entropy(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="layers on axis 0"):
        kl_to_final(torch.zeros(5))
