"""tfbook.diagrams.backward: the attention-backward graph shows the real call's shapes."""

from __future__ import annotations

import pytest
import torch

from tests.diagram_helpers import numbers, svg_texts
from tfbook.attention import scaled_dot_product_attention
from tfbook.diagrams import attention_backward_graph, trace_attention_backward
from tfbook.masks import causal_mask


def qkv(*lead: int, T: int = 5, S: int = 7, D: int = 4) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(*lead, T, D, dtype=torch.float64),
            torch.randn(*lead, S, D, dtype=torch.float64),
            torch.randn(*lead, S, D, dtype=torch.float64)]


def test_labels_are_the_traced_shapes() -> None:
    q, k, v = qkv()
    d = attention_backward_graph(trace_attention_backward(q, k, v))
    labels = {key: numbers(text) for key, text in d.shape_labels.items()}
    # an independent autograd run of the same call
    q_, k_, v_ = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, weights = scaled_dot_product_attention(q_, k_, v_)
    weights.retain_grad()
    out.backward(torch.ones_like(out))
    assert labels["forward.q"] == tuple(q.shape) == labels["backward.grad_q"]
    assert labels["forward.k"] == tuple(k.shape) == labels["backward.grad_k"]
    assert labels["forward.v"] == tuple(v.shape) == labels["backward.grad_v"]
    assert labels["forward.scores"] == labels["forward.weights"] == tuple(weights.shape)
    assert labels["backward.grad_weights"] == tuple(weights.grad.shape)
    assert labels["backward.grad_scores"] == tuple(weights.shape)
    assert labels["forward.out"] == labels["backward.grad_out"] == tuple(out.shape)
    assert labels["forward.scores"] == (5, 7)  # T queries against S keys, told apart
    assert d.shape_labels["forward.scores"] == "(T, S) = (5, 7)"
    assert d.shape_labels["backward.grad_k"] == "(S, D) = (7, 4)"
    texts = svg_texts(d.svg)
    for label in d.labels:
        assert label.text in texts


def test_hand_gradients_agree_with_autograd() -> None:
    tb = trace_attention_backward(*qkv(2, 3))
    # float64: the two computations differ only by rounding of a few products
    assert tb.max_difference < 1e-12
    assert not tb.masked


def test_changing_the_call_changes_the_drawing() -> None:
    base = attention_backward_graph(trace_attention_backward(*qkv())).shape_labels
    longer = attention_backward_graph(trace_attention_backward(*qkv(S=11))).shape_labels
    batched = attention_backward_graph(trace_attention_backward(*qkv(2, 3))).shape_labels
    wide = attention_backward_graph(trace_attention_backward(*qkv(D=8))).shape_labels
    assert numbers(longer["backward.grad_scores"]) == (5, 11) != numbers(
        base["backward.grad_scores"])
    assert batched["backward.grad_q"] == "(B, H, T, D) = (2, 3, 5, 4)"
    assert numbers(wide["backward.grad_v"]) == (7, 8)
    q, k, v = qkv(S=5)
    masked = attention_backward_graph(trace_attention_backward(q, k, v, causal_mask(5)))
    assert "scores, masked" in svg_texts(masked.svg)
    assert "scores, masked" not in svg_texts(attention_backward_graph(
        trace_attention_backward(q, k, v)).svg)


def test_panels_sit_side_by_side_in_the_books_column() -> None:
    """Forward and backward side by side in the 672 px column at 1,280 px (the page puts 24 px
    between panels), each narrow enough for a phone's column (about 358 px) on its own."""
    d = attention_backward_graph(trace_attention_backward(*qkv()))
    widths = [w + 16 for _, w in d._panels]  # natural width: the drawing and its margins
    assert len(widths) == 2 and sum(widths) + 24 <= 672
    assert all(w * 0.96 <= 350 for w in widths)


def test_bad_input() -> None:
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        trace_attention_backward([1.0], k, v)
    with pytest.raises(ValueError, match="k must be a floating-point tensor"):
        trace_attention_backward(q, k.long(), v)
    with pytest.raises(ValueError, match=r"grad_out must have the output's shape \(5, 4\)"):
        trace_attention_backward(q, k, v, grad_out=torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="needs a BackwardTrace"):
        attention_backward_graph("not a trace")


def test_the_backward_arrows_are_the_hand_derived_backwards_dependencies() -> None:
    """The dashed arrows (G -> dA, dV; dA -> dZ; dZ -> dQ, dK) are checked against a recording
    of `attention_backward` itself: dZ is computed from dA (and A) only, dQ and dK from dZ."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, 4, dtype=torch.float64) for n in (5, 7, 7))
    tb = trace_attention_backward(q, k, v)
    d = attention_backward_graph(tb)
    assert d.wired
    flow = tb.backward_flow
    assert flow.sources("dZ") == {"dA", "A"} and flow.sources("dA") == {"G", "V"}
    assert flow.depends("dQ", "dZ") and not flow.depends("dV", "dZ")
    assert ("backward.dZ", "backward.dQ") in d.edges and ("forward.v", "forward.heads") in d.edges
