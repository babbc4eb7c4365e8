"""Scaled dot-product attention and multi-head attention (self and cross).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(D) + M) V                  (Vaswani et al., 3.2.1)
    MultiHead(X_q, X_kv) = Concat(head_1, ..., head_H) W_O,
        head_h = Attention(X_q W_Q^h, X_kv W_K^h, X_kv W_V^h)            (3.2.2)

Shape legend: B batch, T query positions, S key/value positions (S = T for self-attention),
C model width, H heads, D = C / H head size. Masks are boolean, True = may attend
(see `tfbook.masks`).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.masks import causal_mask, check_mask, combine_masks


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(D)) v with an optional boolean mask (Vaswani et al., eq. 1).

    q: (..., T, D), k: (..., S, D), v: (..., S, Dv) -> out (..., T, Dv), weights (..., T, S).
    A query row whose keys are all masked out gets all-zero weights (and a zero output), not
    NaN: there is nothing to attend to, so it takes nothing.
    """
    T, D = q.shape[-2:]
    S = k.size(-2)
    if k.size(-1) != D or v.size(-2) != S:
        raise ValueError(
            f"expected q (..., T, D), k (..., S, D), v (..., S, Dv) with matching D and S, "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (..., T, S)
    if mask is not None:
        check_mask(mask, T, S)
        # The most negative finite number instead of -inf: exp() of it is exactly 0 next to
        # any real score, and a fully masked row stays finite (uniform) instead of NaN.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., T, S), each row sums to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # turns fully masked rows into zeros
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0.0 else weights
    return dropped @ v, weights  # (..., T, Dv), (..., T, S)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate query and key/value sources (Vaswani et al., 3.2.2).

    `forward(x)` is self-attention; `forward(x, source)` is cross-attention, where the
    queries come from `x` (B, T, C) and the keys and values from `source` (B, S, C).
    """

    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
        fused: bool = False,
    ) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}"
            )
        self.n_heads = n_heads
        self.head_size = d_model // n_heads
        self.dropout = dropout
        # fused=True lets forward() call torch's fused kernel when the weights are not asked
        # for; it computes the same function (the tests check), only faster and leaner.
        self.fused = fused
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W_O

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (B, H, T, D): each head gets its own D-wide slice of the features."""
        B, T, C = x.size()
        return x.view(B, T, self.n_heads, self.head_size).transpose(1, 2)  # (B, H, T, D)

    def forward(
        self,
        x: Tensor,
        source: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from x (B, T, C) to source (B, S, C), or to x itself; -> (B, T, C), (B, H, T, S).

        `mask` is boolean (True = may attend) and broadcasts to (B, H, T, S); `causal=True`
        adds the causal mask. The weights are None when `need_weights=False`.
        """
        source = x if source is None else source
        B, T, C = x.size()
        S = source.size(1)
        if C != self.n_heads * self.head_size or source.size(-1) != C:
            raise ValueError(
                f"expected x (B, T, {self.n_heads * self.head_size}) and source (B, S, "
                f"{self.n_heads * self.head_size}), got {tuple(x.shape)} and {tuple(source.shape)}"
            )
        q = self.split_heads(self.q_proj(x))  # (B, H, T, D)
        k = self.split_heads(self.k_proj(source))  # (B, H, S, D)
        v = self.split_heads(self.v_proj(source))  # (B, H, S, D)
        p = self.dropout if self.training else 0.0

        full = combine_masks(causal_mask(T, S, x.device) if causal else None, mask)
        if self.fused and not need_weights:
            if mask is not None:
                check_mask(mask, T, S)
            # for a plain square causal mask the kernel's is_causal flag can skip masked blocks
            only_causal = causal and mask is None and S == T
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if only_causal else full, dropout_p=p,
                is_causal=only_causal,
            )  # (B, H, T, D)
            weights = None
        else:
            y, weights = scaled_dot_product_attention(q, k, v, full, dropout_p=p)
            # (B, H, T, D), (B, H, T, S)

        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, H, D) -> (B, T, C): concat
        return self.out_proj(y), (weights if need_weights else None)
