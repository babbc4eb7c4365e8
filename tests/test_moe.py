"""Mixture of experts: equal to Hugging Face's Mixtral sparse MoE block and its auxiliary loss."""

import contextlib
import unittest.mock

import pytest
import torch

from tests.pinned_threads import THREAD_COUNTS, pinned_threads
from tfbook.feedforward import SwiGLU
from tfbook.moe import MoEFeedForward, load_balancing_loss, route, sigmoid_route

C, F, E, K = 16, 24, 4, 2
U = torch.finfo(torch.float32).eps / 2  # unit roundoff of float32


def mixtral_block(ours: MoEFeedForward):
    """HF's MixtralSparseMoeBlock (transformers 5.23) with our weights copied across."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=C, intermediate_size=F, num_local_experts=E,
                        num_experts_per_tok=K, num_attention_heads=2, num_key_value_heads=2,
                        hidden_act="silu")
    cfg._experts_implementation = "eager"  # the reference loop in modeling_mixtral.py
    ref = MixtralSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        ref.gate.weight.copy_(ours.router.weight)  # (E, C)
        for e, ex in enumerate(ours.experts):  # gate_up_proj[e] = [W_gate; W_1] (2F, C)
            ref.experts.gate_up_proj[e].copy_(torch.cat([ex.fc_gate.weight, ex.fc_in.weight]))
            ref.experts.down_proj[e].copy_(ex.fc_out.weight)  # (C, F)
    return ref


def output_bound(moe: MoEFeedForward, x: torch.Tensor, weights, idx) -> torch.Tensor:
    """Entrywise first-order bound on |ours - HF|: twice each side's float32 rounding error.

    Per chosen expert: gate and value are dot products of length C (gamma_C |x||W|), SiLU
    (slope at most 1.1) adds a few roundings, the product one, the down projection a dot
    product of length F; the k weights carry (E + 4) u relative error, the sum k roundings.
    """
    xd = x.detach().double().reshape(-1, C)
    err = torch.zeros_like(xd)
    for j in range(idx.size(1)):
        for e in range(E):
            rows = idx[:, j] == e
            if not rows.any():
                continue
            ex, xe = moe.experts[e], xd[rows]
            Wg, W1, Wo = (m.weight.detach().double() for m in (ex.fc_gate, ex.fc_in, ex.fc_out))
            g, v = xe @ Wg.T, xe @ W1.T
            err_g = C * U * (xe.abs() @ Wg.abs().T)
            err_v = C * U * (xe.abs() @ W1.abs().T)
            s = g * torch.sigmoid(g)
            err_s = 1.1 * err_g + 4 * U * s.abs()
            h = s * v
            err_h = s.abs() * err_v + v.abs() * err_s + U * h.abs()
            o = h @ Wo.T
            err_o = F * U * (h.abs() @ Wo.abs().T) + err_h @ Wo.abs().T
            w = weights[rows, j].double()[:, None]
            err[rows] += w * err_o + (E + 4 + K) * U * w * o.abs()
    return 2 * err.reshape(x.shape)


@THREAD_COUNTS
def test_equals_mixtral_sparse_moe_block(n_threads):
    torch.manual_seed(0)
    ours = MoEFeedForward(C, F, E, K, fused=True)
    ref = mixtral_block(ours)
    x = torch.randn(3, 7, C)
    with pinned_threads(n_threads), torch.no_grad():
        y, logits = ours(x, return_router_logits=True)
        ref_logits, ref_w, ref_idx = ref.gate(x.reshape(-1, C))
        y_ref = ref(x)
    assert torch.equal(logits, ref_logits)  # the same F.linear: bit for bit
    w, idx = route(logits, K)
    assert torch.equal(idx, ref_idx) and torch.equal(w, ref_w)  # same softmax, topk, division
    bound = output_bound(ours, x, w, idx)
    assert ((y - y_ref).double().abs() <= bound).all()
    assert bound.max() < 1e-4 * y_ref.abs().max()  # the bound is tight enough to mean something
    assert ours.router_logits is logits
    counts = torch.bincount(ref_idx.reshape(-1), minlength=E)
    assert torch.equal(ours.tokens_per_expert, counts) and counts.sum() == 3 * 7 * K


def test_unfused_silu_is_within_the_same_bound():
    torch.manual_seed(1)
    ours = MoEFeedForward(C, F, E, K)  # the book's x * sigmoid(x), not torch's F.silu
    x = torch.randn(2, 9, C)
    with torch.no_grad():
        y, y_ref = ours(x), mixtral_block(ours)(x)
        w, idx = route(ours.router_logits, K)
    assert ((y - y_ref).double().abs() <= output_bound(ours, x, w, idx)).all()


def hf_loss(logits, mask=None):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    return load_balancing_loss_func(tuple(logits), E, K, mask)


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_load_balancing_loss_equals_hugging_face(masked):
    g = torch.Generator().manual_seed(2)
    B, T, L = 3, 5, 2
    layers = [torch.randn(B * T, E, generator=g) * 2 for _ in range(L)]
    mask = None
    if masked:
        mask = torch.ones(B, T, dtype=torch.long)
        mask[0, :2] = 0  # left padding
        mask[2, 3:] = 0  # right padding
    ours, ref = load_balancing_loss(layers, E, K, mask), hf_loss(layers, mask)
    n = L * B * T
    # counts are exact; P_e sums n probabilities, each within (E + 4) u: relative (n + E + 6) u
    assert abs(ours - ref) <= 2 * (n + E + 6) * U * ref
    one_layer = load_balancing_loss(layers[0], E, K, mask)
    assert abs(one_layer - hf_loss(layers[:1], mask)) <= 2 * (n + E + 6) * U * one_layer
    if masked:  # the padding really is left out
        assert abs(ours - hf_loss(layers, None)) > 1e-4


def test_load_balancing_loss_extremes():
    uniform = torch.zeros(8, E)  # every expert equally likely; ties chosen by topk
    assert abs(load_balancing_loss(uniform, E, E) - E) <= 4 * E * U * E  # f_e = 1, P_e = 1/E
    collapsed = torch.zeros(8, E)
    collapsed[:, 0] = 100.0  # all to expert 0: f_0 = 1, P_0 = 1
    assert abs(load_balancing_loss(collapsed, E, 1) - E) <= 8 * E * U


def test_all_experts_is_the_dense_weighted_sum():
    torch.manual_seed(3)
    moe = MoEFeedForward(C, F, E, E)
    x = torch.randn(2, 6, C)
    with torch.no_grad():
        y = moe(x)
        p = torch.softmax(moe.router(x), dim=-1)  # (B, T, E)
        outs = torch.stack([ex(x) for ex in moe.experts], dim=-2)  # (B, T, E, C)
        dense = (p[..., None] * outs).sum(-2)  # (B, T, C)
    # the same expert outputs; weights within (E + 4) u relative, sums of E terms
    terms = (p[..., None] * outs).abs().sum(-2).double()
    assert ((y - dense).double().abs() <= 2 * (2 * E + 6) * U * terms).all()
    assert torch.equal(moe.tokens_per_expert, torch.full((E,), 12))


def test_selected_softmax_is_renormalised_softmax():
    logits = torch.randn(50, 8, generator=torch.Generator().manual_seed(4)) * 3
    w_all, i_all = route(logits, 3, "renormalised")
    w_sel, i_sel = route(logits, 3, "selected")
    assert torch.equal(i_all, i_sel)
    assert ((w_all - w_sel).abs() <= 32 * U * w_all).all()
    w_un, _ = route(logits, 3, "unnormalised")
    assert (w_un.sum(-1) < 1).all() and torch.allclose(w_un / w_un.sum(-1, keepdim=True), w_all)


def test_experts_are_the_books_swiglu_and_only_chosen_tokens_reach_them():
    torch.manual_seed(5)
    moe = MoEFeedForward(C, F, 8, 2)
    assert all(type(ex) is SwiGLU for ex in moe.experts)
    seen = [0] * 8
    for e, ex in enumerate(moe.experts):
        ex.hidden.register_forward_hook(lambda m, i, o, e=e: seen.__setitem__(e, o.size(0)))
    moe(torch.randn(4, 5, C))
    assert seen == moe.tokens_per_expert.tolist() and sum(seen) == 4 * 5 * 2


def test_gradient_reaches_router_and_experts():
    torch.manual_seed(6)
    moe = MoEFeedForward(C, F, E, K)
    x = torch.randn(2, 5, C, requires_grad=True)
    y, logits = moe(x, return_router_logits=True)
    (y.square().sum() + load_balancing_loss(logits, E, K)).backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    assert x.grad.abs().sum() > 0
    used = moe.tokens_per_expert > 0
    for e, ex in enumerate(moe.experts):
        has_grad = ex.fc_out.weight.grad is not None and ex.fc_out.weight.grad.abs().sum() > 0
        assert has_grad == bool(used[e])
    # the output alone also trains the router (through the routing weights)
    moe.zero_grad()
    moe(x).square().sum().backward()
    assert moe.router.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("n_experts, top_k, error, message", [
    (4, 5, ValueError, r"top_k must be at most n_experts = 4 .*got top_k = 5"),
    (4, 0, ValueError, r"top_k must be at least 1 .*got 0"),
    (0, 1, ValueError, r"n_experts must be at least 1, got 0"),
    (4.0, 2, TypeError, r"n_experts must be an int, got float 4.0"),
    (4, "2", TypeError, r"top_k must be an int, got str '2'"),
    (4, True, TypeError, r"top_k must be an int, got bool True"),
])
def test_bad_expert_counts(n_experts, top_k, error, message):
    with pytest.raises(error, match=message):
        MoEFeedForward(C, F, n_experts, top_k)
    with pytest.raises(error, match=message):
        load_balancing_loss(torch.zeros(3, 4), n_experts, top_k)


def test_bad_routing_shapes_and_masks():
    with pytest.raises(ValueError, match=r"routing must be one of .*got 'softmax'"):
        MoEFeedForward(C, F, E, K, routing="softmax")
    with pytest.raises(ValueError, match=r"expects x of shape \(B, T, C\), got \(5, 16\)"):
        MoEFeedForward(C, F, E, K)(torch.randn(5, C))
    with pytest.raises(ValueError, match=r"shape \(N, n_experts = 4\), got \(6, 3\)"):
        load_balancing_loss(torch.zeros(6, 3), E, K)
    with pytest.raises(ValueError, match=r"attention_mask has 5 entries .* rows; they must match"):
        load_balancing_loss(torch.zeros(6, E), E, K, torch.ones(1, 5))
    with pytest.raises(TypeError, match=r"router_logits must be a tensor"):
        load_balancing_loss([], E, K)


@pytest.mark.parametrize("family, norm, routing", [
    ("qwen2_moe", False, "unnormalised"), ("qwen3_moe", True, "renormalised"),
    ("olmoe", False, "unnormalised")])
def test_routings_equal_the_routers_of_other_families(family, norm, routing):
    import importlib

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    prefix = {"qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "olmoe": "Olmoe"}[family]
    cfg = getattr(importlib.import_module("transformers"), f"{prefix}Config")(
        hidden_size=C, num_experts=8, num_experts_per_tok=3, norm_topk_prob=norm,
        num_attention_heads=2, num_key_value_heads=2)
    router = getattr(module, f"{prefix}TopKRouter")(cfg)
    torch.nn.init.normal_(router.weight, generator=torch.Generator().manual_seed(7))
    x = torch.randn(20, C, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logits, scores, idx = router(x)
    w, i = route(logits, 3, routing)
    assert torch.equal(i, idx) and torch.equal(w, scores)


# -- DeepSeek-V3's MoE: routing="sigmoid", groups, shared experts, routed scaling ---------------

DEEPSEEK = dict(n_expert_groups=4, top_groups=2, n_shared_experts=2, routed_scaling=2.5)


def deepseek_moe(ours: MoEFeedForward):
    """HF's DeepseekV3MoE (transformers 5.23) with our weights and score bias copied across."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = DeepseekV3Config(hidden_size=C, moe_intermediate_size=F, n_routed_experts=8,
                           num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=2,
                           routed_scaling_factor=2.5, norm_topk_prob=True, hidden_act="silu")
    cfg._experts_implementation = "eager"  # the reference loop in modeling_deepseek_v3.py
    ref = DeepseekV3MoE(cfg).eval()
    with torch.no_grad():
        ref.gate.weight.copy_(ours.router.weight)  # (E, C)
        ref.gate.e_score_correction_bias.copy_(ours.score_bias)
        for e, ex in enumerate(ours.experts):  # gate_up_proj[e] = [W_gate; W_1] (2F, C)
            ref.experts.gate_up_proj[e].copy_(torch.cat([ex.fc_gate.weight, ex.fc_in.weight]))
            ref.experts.down_proj[e].copy_(ex.fc_out.weight)  # (C, F)
        for theirs, mine in (("gate_proj", "fc_gate"), ("up_proj", "fc_in"),
                             ("down_proj", "fc_out")):
            getattr(ref.shared_experts, theirs).weight.copy_(getattr(ours.shared, mine).weight)
    return ref


@contextlib.contextmanager
def hf_deepseek_router_in_input_dtype():
    """HF's DeepSeek router takes its logits in float32 even in a float64 model; tfbook's keeps
    float64 (and takes bfloat16 up to float32 as HF does). Within this block HF's router runs
    its own code in the input's dtype, so a float64 comparison compares float64 arithmetic."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    forward = DeepseekV3TopkRouter.forward

    def in_input_dtype(self, hidden_states):
        with unittest.mock.patch.object(torch, "float32", hidden_states.dtype):
            return forward(self, hidden_states)
    with unittest.mock.patch.object(DeepseekV3TopkRouter, "forward", in_input_dtype):
        yield


def test_sigmoid_routing_equals_deepseek_v3_moe():
    """Router (sigmoid scores, the bias choosing only, 2 of 4 groups) and the whole layer
    (routed scaling, two shared experts) equal HF's DeepseekV3MoE: the router bit for bit in
    float32 (the same operations), the layer in float64 to 2^-40 of its size."""
    torch.manual_seed(0)
    ours = MoEFeedForward(C, F, 8, 3, routing="sigmoid", **DEEPSEEK)
    with torch.no_grad():
        ours.router.weight.normal_(0.0, 0.5)
        ours.score_bias.copy_(0.2 * torch.randn(8))  # large enough to change some choices
    ref = deepseek_moe(ours)
    x = torch.randn(3, 7, C, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, ref_w, ref_idx = ref.gate(x)
        w, idx = sigmoid_route(logits, 3, ours.score_bias, 4, 2)
        order, ref_order = idx.sort(-1), ref_idx.sort(-1)  # HF's top-k is unsorted
        assert torch.equal(order.values, ref_order.values)
        assert torch.equal(w.gather(1, order.indices) * 2.5, ref_w.gather(1, ref_order.indices))
        plain = sigmoid_route(logits, 3)[1].sort(-1).values  # no bias, no groups
        assert not torch.equal(plain, order.values)  # the bias and the groups change choices
        groups = order.values // 2  # (N, k): the group of each chosen expert
        assert all(len(set(row)) <= 2 for row in groups.tolist())  # within 2 of the 4 groups
        ours64, ref64 = ours.double(), ref.double()
        with hf_deepseek_router_in_input_dtype():
            y, y_ref = ours64(x.double()), ref64(x.double())
    assert (y - y_ref).abs().max() <= 2.0**-40 * y_ref.abs().max()
    assert ours.shared is not None and ours.shared.fc_in.out_features == 2 * F


def test_a_large_score_bias_chooses_but_does_not_weigh():
    logits = torch.randn(10, 8, generator=torch.Generator().manual_seed(3))
    bias = torch.zeros(8)
    bias[5] = 10.0  # expert 5 wins every choice ...
    w, idx = sigmoid_route(logits, 2, bias)
    assert (idx == 5).any(dim=1).all()
    scores = torch.sigmoid(logits).gather(1, idx)  # ... but weighs by its unbiased score
    assert torch.allclose(w, scores / scores.sum(-1, keepdim=True), rtol=0, atol=4 * U)


@pytest.mark.parametrize("changes, message", [
    ({"n_expert_groups": 3}, r"n_expert_groups=3 must split n_experts=8 into equal groups"),
    ({"n_expert_groups": 8}, r"n_expert_groups=8 must split n_experts=8 into equal groups of "
                             r"at least 2 experts"),
    ({"top_groups": 5}, r"top_groups=5 of n_expert_groups=4 groups of 2 experts must hold"),
    ({"top_groups": 1}, r"top_groups=1 of n_expert_groups=4 groups of 2 experts must hold "
                        r"top_k=3"),
    ({"n_expert_groups": 0}, r"n_expert_groups must be a positive int, got 0"),
    ({"n_shared_experts": -1}, r"n_shared_experts must be an int >= 0, got -1"),
    ({"routed_scaling": 0.0}, r"routed_scaling must be a finite number > 0, got 0.0"),
    ({"routing": "renormalised"}, r"n_expert_groups=4 limits DeepSeek-V3's routing='sigmoid'"),
])
def test_bad_deepseek_settings(changes, message):
    settings = {"routing": "sigmoid", **DEEPSEEK, **changes}
    with pytest.raises(ValueError, match="MoEFeedForward: " + message):
        MoEFeedForward(C, F, 8, 3, **settings)
    from tfbook.models.gpt import GPTConfig

    with pytest.raises(ValueError, match="GPTConfig: " + message):
        GPTConfig(ffn="moe", n_experts=8, top_k=3, **settings)
