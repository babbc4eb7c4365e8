"""Direct logit attribution (tfbook.inspect.attribution): the parts add up to the logit."""

from dataclasses import replace

import pytest
import torch

from tests.inspect_models import U, eiffel_run, gamma, readout_bound, tiny_run
from tfbook.inspect import run_with_cache
from tfbook.inspect.attribution import (
    Attribution,
    attribution_names,
    direct_logit_attribution,
    final_stream_parts,
    logit_direction,
)
from tfbook.models.gpt import GPT, GPTConfig

KINDS = ("gpt", "llama")


@pytest.fixture(scope="module", params=KINDS)
def run(request):
    """(model, ids, output, cache) of a tiny decoder, every tensor attribution reads."""
    return tiny_run(request.param, attribution_names, batch=3, seed=2)


@pytest.fixture(scope="module")
def smollm2():
    model, tok, _, out, cache = eiffel_run(attribution_names)
    return model, tok, out, cache


def test_labels(run):
    model, _, _, cache = run
    parts, labels = final_stream_parts(model, cache)
    heads = [[f"L{i}H{h}" for h in range(4)] for i in range(2)]
    if model.config.bias:  # GPT-2 style: out_proj has a bias, the final LayerNorm too
        expected = ["embed", *heads[0], "L0bias", "MLP0", *heads[1], "L1bias", "MLP1"]
    else:
        expected = ["embed", *heads[0], "MLP0", *heads[1], "MLP1"]
    assert labels == expected and parts.shape == (len(expected), 3, 64)
    assert parts.dtype == torch.float64
    dla = direct_logit_attribution(model, cache, 5)
    assert dla.labels == expected + (["norm_bias"] if model.config.bias else [])


def test_parts_add_up_to_the_final_stream(run):
    """sum of the parts = blocks.1.residual_post, within the rounding of the model's 4
    additions (u |x_k| each) and of its out_proj products against our per-head split."""
    model, _, _, cache = run
    for position in (0, -1):
        parts, _ = final_stream_parts(model, cache, position)
        x_L = cache["blocks.1.residual_post"][:, position].double()
        bound = U * sum(cache[f"blocks.{i}.residual_{w}"][:, position].double().abs()
                        for i in range(2) for w in ("mid", "post"))
        for i, block in enumerate(model.blocks):
            z = cache[f"blocks.{i}.attn.heads"][:, :, position].reshape(3, 64).double()
            W = block.attn.out_proj
            bias = 0 if W.bias is None else W.bias.double().abs()
            bound = bound + gamma(65) * (z.abs() @ W.weight.double().abs().T + bias)
        assert ((parts.sum(0) - x_L).abs() <= bound).all()
        assert (parts.abs().amax(0) > 1000 * bound).any()  # parts far above the bound


def test_one_head_by_hand(run):
    """Head h's part is z_h W_O[:, h D:(h + 1) D]^T; a layer's heads and bias give attn.out."""
    model, ids, _, cache = run
    parts, labels = final_stream_parts(model, cache, position=4)
    W_O = model.blocks[1].attn.out_proj.weight.double()
    z = cache["blocks.1.attn.heads"][:, 2, 4].double()  # (B, D), head 2 at position 4
    assert torch.allclose(parts[labels.index("L1H2")], z @ W_O[:, 32:48].T, atol=1e-12)
    layer = [labels.index(f"L1H{h}") for h in range(4)]
    total = parts[layer].sum(0) + (parts[labels.index("L1bias")] if "L1bias" in labels else 0)
    _, out = run_with_cache(model, ids, names=["blocks.1.attn.out"])
    C = 64
    bound = gamma(C + 1) * (cache["blocks.1.attn.heads"][:, :, 4].reshape(3, C).double().abs()
                            @ W_O.abs().T + 1)
    assert ((total - out["blocks.1.attn.out"][:, 4].double()).abs() <= bound).all()


@pytest.mark.parametrize("other", [None, 7, torch.tensor([7, 8, 9])])
def test_terms_sum_to_the_logit_difference(run, other):
    model, _, out, cache = run
    target = torch.tensor([5, 6, 5]) if isinstance(other, torch.Tensor) else 5
    for position in (3, -1):
        dla = direct_logit_attribution(model, cache, target, other, position=position)
        assert isinstance(dla, Attribution) and dla.values.shape == (len(dla.labels), 3)
        assert ((dla.total() - dla.logit_diff).abs() <= dla.bound).all()
        # the bound is tight enough to catch one part left out, or one counted twice
        assert dla.values.abs().max() > 100 * dla.bound.max()
        # logit_diff is the model's own: its output's logits, up to the readout's rounding
        logits = out.logits[:, position]
        t = torch.as_tensor(target).expand(3)
        diff = logits.gather(1, t[:, None])[:, 0]
        if other is not None:
            diff = diff - logits.gather(1, torch.as_tensor(other).expand(3)[:, None])[:, 0]
        h = model.norm_f(cache["blocks.1.residual_post"][:, position])
        W = model.lm_head.weight
        rows = t if other is None else torch.cat([t, torch.as_tensor(other).expand(3)])
        assert ((dla.logit_diff - diff.double()).abs()
                <= 2 * readout_bound(h, W[rows]).max()).all()


def test_embedding_term_by_hand(run):
    """The embeddings' term: the final norm frozen at s(x_L), then W_U[5] - W_U[7]."""
    model, _, _, cache = run
    x0 = cache["blocks.0.residual_pre"][:, -1].double()  # (B, C)
    x_L = cache["blocks.1.residual_post"][:, -1].double()
    g = model.norm_f.weight.double()
    if model.config.norm == "layer":
        x0 = x0 - x0.mean(-1, keepdim=True)
        s = torch.sqrt(x_L.var(-1, unbiased=False, keepdim=True) + 1e-5)
    else:
        s = torch.sqrt(x_L.pow(2).mean(-1, keepdim=True) + 1e-5)
    u = (model.lm_head.weight[5] - model.lm_head.weight[7]).double()
    by_hand = (g * x0 / s) @ u
    dla = direct_logit_attribution(model, cache, 5, 7)
    assert torch.allclose(dla["embed"], by_hand, rtol=1e-12, atol=1e-12)
    assert torch.equal(logit_direction(model, 5, 7), model.lm_head.weight[5] -
                       model.lm_head.weight[7])


def test_views(run):
    model, _, _, cache = run
    dla = direct_logit_attribution(model, cache, 5, 7)
    assert dla.heads().shape == (2, 4, 3) and dla.mlps().shape == (2, 3)
    assert torch.equal(dla.heads()[1, 2], dla["L1H2"]) and torch.equal(dla.mlps()[0], dla["MLP0"])
    top = dla.top(3)
    assert len(top) == 3 and abs(top[0][1]) >= abs(top[1][1]) >= abs(top[2][1])
    assert top[0][1] == pytest.approx(float(dla[top[0][0]].mean()))
    with pytest.raises(KeyError, match="L<l>H<h>"):
        dla["L9H9"]


def test_smollm2_paris_over_rome(smollm2):
    model, tok, out, cache = smollm2
    paris, rome = tok.encode(" Paris")[0], tok.encode(" Rome")[0]
    dla = direct_logit_attribution(model, cache, paris, rome)
    assert len(dla.labels) == 1 + 30 * 9 + 30  # embed, 270 heads, 30 MLPs (no biases)
    assert ((dla.total() - dla.logit_diff).abs() <= dla.bound).all()
    logits = out.logits[0, -1]
    h = model.norm_f(cache["blocks.29.residual_post"][0, -1])
    W = model.lm_head.weight[[paris, rome]]
    assert abs(dla.logit_diff.item() - (logits[paris] - logits[rome]).item()) \
        <= 2 * readout_bound(h, W).max().item()
    # the model prefers Paris by far more than the bound, and the largest part is far above it
    assert dla.logit_diff.item() > 1.0 > 10 * dla.bound.item()
    assert abs(dla.top(1)[0][1]) > 10 * dla.bound.item()


def test_bad_input(run):
    model, _, _, cache = run
    with pytest.raises(ValueError, match="attribution_names"):
        direct_logit_attribution(model, {"blocks.0.residual_pre": torch.zeros(1, 2, 64)}, 5)
    with pytest.raises(TypeError, match="ActivationCache"):
        final_stream_parts(model, None)
    with pytest.raises(ValueError, match="position must be"):
        direct_logit_attribution(model, cache, 5, position=9)
    with pytest.raises(ValueError, match=r"\[0, 256\)"):
        direct_logit_attribution(model, cache, 256)
    with pytest.raises(TypeError, match="token id"):
        direct_logit_attribution(model, cache, 5, other=2.0)
    with pytest.raises(ValueError, match="one id per sequence"):
        direct_logit_attribution(model, cache, torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="decoder"):
        attribution_names(torch.nn.Linear(3, 3))
    dropping = GPT(replace(GPTConfig.tiny(), dropout=0.1))  # in training mode
    _, dropped = run_with_cache(dropping, torch.zeros(1, 4, dtype=torch.long),
                                names=attribution_names(dropping))
    with pytest.raises(ValueError, match="eval mode"):
        direct_logit_attribution(dropping, dropped, 1)
