"""LayerNorm from scratch equals nn.LayerNorm."""

import torch
from torch import nn

from tests.pinned_threads import THREAD_COUNTS, pinned_threads
from tfbook.normalization import LayerNorm


def test_equals_torch_layernorm_values_and_gradients():
    torch.manual_seed(0)
    ours, ref = LayerNorm(16, eps=1e-12), nn.LayerNorm(16, eps=1e-12)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    ref.load_state_dict(ours.state_dict())
    x = (torch.randn(4, 5, 16) * 3 + 2).requires_grad_(True)
    y_ours, y_ref = ours(x), ref(x)
    assert (y_ours - y_ref).abs().max() <= 1e-5
    g = torch.randn_like(y_ours)
    grads_ours = torch.autograd.grad(y_ours, (x, ours.weight, ours.bias), g)
    grads_ref = torch.autograd.grad(y_ref, (x, ref.weight, ref.bias), g)
    for a, b in zip(grads_ours, grads_ref, strict=True):
        assert (a - b).abs().max() <= 1e-4


def test_output_has_zero_mean_unit_variance_per_position():
    y = LayerNorm(64)(torch.randn(3, 7, 64) * 10 + 5)
    assert torch.allclose(y.mean(-1), torch.zeros(3, 7), atol=1e-5)
    assert torch.allclose(y.var(-1, unbiased=False), torch.ones(3, 7), atol=1e-3)


def test_fused_flag_computes_the_same_function():
    torch.manual_seed(0)
    ours, fused = LayerNorm(16), LayerNorm(16, fused=True)
    with torch.no_grad():
        ours.weight.normal_()
    fused.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 16)
    assert (ours(x) - fused(x)).abs().max() <= 1e-5


@THREAD_COUNTS
def test_rms_norm_equals_its_formula_and_hugging_face(n_threads):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from tfbook.normalization import RMSNorm

    torch.manual_seed(1)
    ours, ref = RMSNorm(16, eps=1e-5), LlamaRMSNorm(16, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 16) * 4
    by_formula = ours.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert (ours(x) - by_formula).abs().max() <= 1e-5
    with pinned_threads(n_threads):  # the same operations in the same order, same threads
        assert torch.equal(ours(x), ref(x))
    # half precision: the statistics in float32 keep it finite where float16 squares overflow
    big = (torch.randn(2, 16) * 400).half()
    assert torch.isfinite(ours.half()(big)).all()
    with pinned_threads(n_threads):
        assert torch.equal(ours(big), ref.half()(big))


def test_make_norm_refuses_unknown_kinds():
    import pytest

    from tfbook.normalization import make_norm

    with pytest.raises(ValueError, match=r"norm must be one of \('layer', 'rms'\), got 'batch'"):
        make_norm("batch", 8, 1e-5)
