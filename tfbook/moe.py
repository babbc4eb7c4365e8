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
from torch import Tensor, nn

from tfbook.feedforward import SwiGLU
from tfbook.hooks import HookPoint

ROUTINGS = ("renormalised", "selected", "unnormalised")


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


def route(logits: Tensor, top_k: int, routing: str = "renormalised") -> tuple[Tensor, Tensor]:
    """Router logits (N, E) -> (weights (N, k) in float32, expert indices (N, k)).

    >>> w, i = route(torch.tensor([[2.0, 0.0, 1.0]]), 2)   # experts 0 and 2
    >>> i.tolist(), [round(v, 3) for v in w[0].tolist()]
    ([[0, 2]], [0.731, 0.269])
    """
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    _check_experts(logits.size(-1), top_k)
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
        bias: bool = False, fused: bool = False,
    ) -> None:
        super().__init__()
        _check_experts(n_experts, top_k)
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
        self.n_experts, self.top_k, self.routing = n_experts, top_k, routing
        self.router = nn.Linear(d_model, n_experts, bias=False)  # W_r: one score per expert
        self.experts = nn.ModuleList(
            SwiGLU(d_model, d_ff, activation_name, dropout, bias, fused) for _ in range(n_experts))
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
        logits = self.logits(self.router(flat))  # (N, E)
        weights, idx = route(logits, self.top_k, self.routing)  # (N, k), (N, k)
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
        y = self.out(y.reshape(B, T, C))
        return (y, logits) if return_router_logits else y


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
