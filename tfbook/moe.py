"""Mixture of experts: a router sends each token to k of E feed-forward networks (Shazeer 2017).

    logits = x W_r                     (N, E)   one score per expert, no bias
    S      = the k experts with the largest probability softmax(logits)
    y      = sum_{e in S} w_e SwiGLU_e(x)       w from one of the routings below

Each expert is the book's SwiGLU feed-forward (`tfbook.feedforward.SwiGLU`), so a token pays
for k of them while the layer holds E: parameters grow with E, compute with k.

Routings (the weights w of the k chosen experts), with the families that use each:

- "renormalised": softmax over all E experts, keep the top k, divide by their sum.
  Hugging Face's Mixtral (`MixtralTopKRouter`, transformers 5.23) and Qwen3-MoE
  (`Qwen3MoeTopKRouter` with `norm_topk_prob=True`, as in the released Qwen3-30B-A3B config).
- "selected": the top k logits, softmax over those k only. The Mixtral paper's
  G(x) = Softmax(TopK(x W_g)) (Jiang et al. 2024, section 2.1) and Mistral's reference code
  (mistral-inference `moe.py`: `torch.topk` on the logits, then `softmax`). It is the same
  function as "renormalised" (e^{l_i}/Z divided by sum_{j in S} e^{l_j}/Z), up to rounding.
- "unnormalised": softmax over all E, keep the top k probabilities as they are (their sum is
  below 1 unless k = E). The Switch Transformer's top-1 gate p_i(x) (Fedus et al. 2022,
  eqs. 1-2), and Qwen1.5/Qwen2-MoE, OLMoE and DeepSeek-V2 (Hugging Face's
  `norm_topk_prob=False`; DeepSeek-V2 then multiplies by its `routed_scaling_factor`).
- "sigmoid": DeepSeek-V3 (DeepSeek-AI 2024, section 2.1.2; HF's `DeepseekV3TopkRouter`).
  Each expert's score is sigmoid(logit), not a softmax share. A per-expert bias `score_bias`
  (HF's e_score_correction_bias, adjusted during training to balance the load instead of an
  auxiliary loss) is added to the scores only to CHOOSE the k experts; their weights are the
  unbiased scores divided by their sum. With `n_expert_groups` G > 1 the experts are split
  into G groups of E/G, each group scored by the sum of its two best biased scores, and only
  the `top_groups` best groups are eligible (each token's experts lie on a few devices).

Two more settings come with DeepSeek's MoE: the k weights are multiplied by `routed_scaling`
(DeepSeek-V3's routed_scaling_factor 2.5), and `n_shared_experts` experts see every token,
as one SwiGLU of width n_shared_experts * d_ff added to the routed experts' sum.

Dispatch: the N*k (token, expert) pairs are sorted by expert; each expert runs once, on the
rows routed to it (`index_select`), and its weighted output is added back (`index_add`). No
expert sees a token it was not chosen for.

The auxiliary load-balancing loss (Switch Transformer eqs. 4-6, as Hugging Face computes it
for Mixtral): E * sum_e f_e P_e, f_e the number of tokens sent to expert e divided by N (so
sum_e f_e = k), P_e the mean router probability of expert e. It is k when routing is uniform.
Shape legend: B, T, C, F = d_ff, E experts, k = top_k, N = B*T tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.feedforward import SwiGLU
from tfbook.hooks import HookPoint

ROUTINGS = ("renormalised", "selected", "unnormalised", "sigmoid")


def _check_experts(n_experts: object, top_k: object) -> None:
    """Raise tfbook's own errors for a bad number of experts or of experts per token."""
    for name, value in (("n_experts", n_experts), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if n_experts < 1:
        raise ValueError(f"n_experts must be at least 1, got {n_experts}")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1 (experts per token), got {top_k}")
    if top_k > n_experts:
        raise ValueError(f"top_k must be at most n_experts = {n_experts} (each token picks "
                         f"top_k different experts), got top_k = {top_k}")


def check_groups(n_experts: int, top_k: int, n_groups: object, top_groups: object,
                 owner: str = "route") -> None:
    """Group-limited routing needs G | E, at least two experts per group (a group is scored by
    its best two), 1 <= top_groups <= G and k experts within the top_groups groups."""
    for name, value in (("n_expert_groups", n_groups), ("top_groups", top_groups)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    if n_groups == 1:
        return
    if n_experts % n_groups != 0 or n_experts // n_groups < 2:
        raise ValueError(f"{owner}: n_expert_groups={n_groups} must split n_experts="
                         f"{n_experts} into equal groups of at least 2 experts")
    if top_groups > n_groups or top_k > top_groups * (n_experts // n_groups):
        raise ValueError(f"{owner}: top_groups={top_groups} of n_expert_groups={n_groups} "
                         f"groups of {n_experts // n_groups} experts must hold top_k={top_k}")


def sigmoid_route(
    logits: Tensor, top_k: int, score_bias: Tensor | None = None, n_groups: int = 1,
    top_groups: int = 1,
) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3's router: sigmoid scores, the biased scores choose (within the best
    `top_groups` of `n_groups` groups), the unbiased ones of the k chosen, renormalised, weigh.
    logits (N, E) -> (weights (N, k) in float32, or float64 for float64 logits, expert indices
    (N, k))."""
    N, E = logits.shape
    scores = torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32)))  # (N, E)
    choice = scores if score_bias is None else scores + score_bias  # (N, E), as HF adds them
    if n_groups > 1:
        grouped = choice.view(N, n_groups, E // n_groups)  # (N, G, E/G)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G): best two each
        best = group_scores.topk(top_groups, dim=-1).indices  # (N, top_groups)
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        keep = keep[:, :, None].expand(N, n_groups, E // n_groups).reshape(N, E)
        choice = choice.masked_fill(~keep, float("-inf"))  # experts of other groups: never
    idx = choice.topk(top_k, dim=-1).indices  # (N, k)
    weights = scores.gather(1, idx)  # (N, k): the scores without the bias
    return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20), idx  # HF's 1e-20 guard


def route(logits: Tensor, top_k: int, routing: str = "renormalised") -> tuple[Tensor, Tensor]:
    """Router logits (N, E) -> (weights (N, k) in float32, expert indices (N, k)).

    >>> w, i = route(torch.tensor([[2.0, 0.0, 1.0]]), 2)   # experts 0 and 2
    >>> i.tolist(), [round(v, 3) for v in w[0].tolist()]
    ([[0, 2]], [0.731, 0.269])
    """
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    _check_experts(logits.size(-1), top_k)
    if routing == "sigmoid":  # without bias or groups; MoEFeedForward passes them
        return sigmoid_route(logits, top_k)
    if routing == "selected":  # softmax over the k largest logits only (Mixtral paper)
        top_logits, idx = torch.topk(logits.float(), top_k, dim=-1)  # (N, k)
        return torch.softmax(top_logits, dim=-1), idx
    probs = torch.softmax(logits.float(), dim=-1)  # (N, E), in float32 as HF does
    weights, idx = torch.topk(probs, top_k, dim=-1)  # (N, k)
    if routing == "renormalised":
        weights = weights / weights.sum(dim=-1, keepdim=True)  # the k weights sum to 1
    return weights, idx


class MoEFeedForward(nn.Module):
    """Top-k mixture of SwiGLU experts with a linear router (Shazeer 2017; Mixtral, Jiang 2024).

    forward(x) returns (B, T, C) like any feed-forward; the last call's router logits (N, E)
    and tokens per expert (E,) are kept in `router_logits` and `tokens_per_expert`.
    """

    def __init__(
        self, d_model: int, d_ff: int, n_experts: int, top_k: int,
        routing: str = "renormalised", activation_name: str = "silu", dropout: float = 0.0,
        bias: bool = False, fused: bool = False, *, n_expert_groups: int = 1,
        top_groups: int = 1, n_shared_experts: int = 0, routed_scaling: float = 1.0,
    ) -> None:
        super().__init__()
        _check_experts(n_experts, top_k)
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
        check_deepseek_settings(n_experts, top_k, routing, n_expert_groups, top_groups,
                                n_shared_experts, routed_scaling, "MoEFeedForward")
        self.n_experts, self.top_k, self.routing = n_experts, top_k, routing
        self.n_expert_groups, self.top_groups = n_expert_groups, top_groups
        self.routed_scaling = routed_scaling
        self.router = nn.Linear(d_model, n_experts, bias=False)  # W_r: one score per expert
        if routing == "sigmoid":  # chooses, never weighs; set by load balancing, not gradient
            self.register_buffer("score_bias", torch.zeros(n_experts))
        else:
            self.score_bias = None
        self.experts = nn.ModuleList(
            SwiGLU(d_model, d_ff, activation_name, dropout, bias, fused) for _ in range(n_experts))
        # DeepSeek's shared experts: one SwiGLU of n_shared_experts * d_ff for every token
        self.shared = (SwiGLU(d_model, n_shared_experts * d_ff, activation_name, dropout, bias,
                              fused) if n_shared_experts else None)
        self.logits, self.out = HookPoint(), HookPoint()  # (N, E) and (B, T, C)
        self.router_logits: Tensor | None = None  # (N, E) of the last forward
        self.tokens_per_expert: Tensor | None = None  # (E,) int64, assignments of the last one

    def forward(
        self, x: Tensor, return_router_logits: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, T, C) -> y (B, T, C), or (y, router logits (N, E)) if asked."""
        if x.dim() != 3:
            raise ValueError(f"MoEFeedForward expects x of shape (B, T, C), got {tuple(x.shape)}")
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # (N, C)
        if self.routing == "sigmoid":  # at least float32 (bfloat16 models too), as HF's
            dtype = torch.promote_types(flat.dtype, torch.float32)  # DeepseekV3TopkRouter
            logits = F.linear(flat.to(dtype), self.router.weight.to(dtype))
        else:
            logits = self.router(flat)
        logits = self.logits(logits)  # (N, E)
        if self.routing == "sigmoid":
            weights, idx = sigmoid_route(logits, self.top_k, self.score_bias,
                                         self.n_expert_groups, self.top_groups)
        else:
            weights, idx = route(logits, self.top_k, self.routing)  # (N, k), (N, k)
        if self.routed_scaling != 1.0:
            weights = weights * self.routed_scaling  # DeepSeek: the k weights sum to it
        expert_of = idx.reshape(-1)  # (N*k,) the pairs, token-major
        order = torch.argsort(expert_of, stable=True)  # pairs grouped by expert, tokens in order
        token_of = order // self.top_k  # (N*k,) which token each sorted pair belongs to
        weight_of = weights.reshape(-1)[order]  # (N*k,)
        counts = torch.bincount(expert_of, minlength=self.n_experts)  # (E,)
        y = torch.zeros_like(flat)  # (N, C)
        start = 0
        for e, n in enumerate(counts.tolist()):  # each expert once, on its own tokens only
            if n == 0:
                continue
            tokens = token_of[start:start + n]  # (n,)
            out = self.experts[e](flat.index_select(0, tokens))  # (n, C)
            out = out * weight_of[start:start + n, None]  # float32 weights, as HF
            y = y.index_add(0, tokens, out.to(y.dtype))
            start += n
        self.router_logits, self.tokens_per_expert = logits, counts
        y = y.reshape(B, T, C)
        if self.shared is not None:
            y = y + self.shared(x)  # every token, unweighted
        y = self.out(y)
        return (y, logits) if return_router_logits else y


def check_deepseek_settings(
    n_experts: int, top_k: int, routing: str, n_expert_groups: object, top_groups: object,
    n_shared_experts: object, routed_scaling: object, owner: str,
) -> None:
    """DeepSeek's MoE settings, in `owner`'s words: groups only with the sigmoid routing."""
    check_groups(n_experts, top_k, n_expert_groups, top_groups, owner)
    if n_expert_groups != 1 and routing != "sigmoid":
        raise ValueError(f"{owner}: n_expert_groups={n_expert_groups} limits DeepSeek-V3's "
                         f"routing='sigmoid' only, got routing={routing!r}")
    if isinstance(n_shared_experts, bool) or not isinstance(n_shared_experts, int) \
            or n_shared_experts < 0:
        raise ValueError(f"{owner}: n_shared_experts must be an int >= 0, got "
                         f"{n_shared_experts!r}")
    if isinstance(routed_scaling, bool) or not isinstance(routed_scaling, int | float) \
            or not routed_scaling > 0 or routed_scaling == float("inf"):
        raise ValueError(f"{owner}: routed_scaling must be a finite number > 0, got "
                         f"{routed_scaling!r}")


def load_balancing_loss(
    router_logits: Tensor | Sequence[Tensor], n_experts: int, top_k: int,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Switch Transformer's auxiliary loss E * sum_e f_e P_e (Fedus et al. 2022, eqs. 4-6).

    f_e: top-k assignments to expert e per token; P_e: mean softmax probability of e. Both
    are taken over the rows of every layer's logits (a tensor (N, E) or one per layer, as HF's
    `load_balancing_loss_func` takes them), counting only tokens where attention_mask (B, T)
    is 1 when it is given (then N = B*T). Balanced routing gives k; every token sent to the
    same k experts, with all its probability on them, gives E (the largest value).
    """
    _check_experts(n_experts, top_k)
    layers = [router_logits] if isinstance(router_logits, Tensor) else list(router_logits)
    if not layers or not all(isinstance(t, Tensor) for t in layers):
        raise TypeError("router_logits must be a tensor (N, E) or a non-empty sequence of them, "
                        f"got {type(router_logits).__name__}")
    for t in layers:
        if t.dim() != 2 or t.size(-1) != n_experts:
            raise ValueError(f"router logits must have shape (N, n_experts = {n_experts}), "
                             f"got {tuple(t.shape)}")
    logits = torch.cat(layers)  # (L*N, E)
    probs = torch.softmax(logits.float(), dim=-1)  # (L*N, E)
    _, idx = torch.topk(probs, top_k, dim=-1)  # (L*N, k)
    if attention_mask is None:
        mask = probs.new_ones(logits.size(0))
    else:
        n_rows = layers[0].size(0)
        if attention_mask.numel() != n_rows or any(t.size(0) != n_rows for t in layers):
            raise ValueError(f"attention_mask has {attention_mask.numel()} entries "
                             f"(shape {tuple(attention_mask.shape)}) but each layer's router "
                             f"logits have {[t.size(0) for t in layers]} rows; they must match")
        mask = attention_mask.reshape(-1).float().repeat(len(layers))  # (L*N,)
    assigned = probs.new_zeros(n_experts).index_add(
        0, idx.reshape(-1), mask.repeat_interleave(top_k))  # (E,) assignments per expert
    f = assigned / mask.sum()  # (E,) sums to k
    P = (probs * mask[:, None]).sum(0) / mask.sum()  # (E,) sums to 1
    return n_experts * (f * P).sum()
