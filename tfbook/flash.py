"""Flash attention from scratch in plain PyTorch: tiles, an online softmax, a recomputing backward.

    O = softmax(Q K^T / sqrt(D) + M) V, computed without ever holding the (T, S) matrix.

1. The online softmax (Milakov & Gimelshein 2018): a running max m and normaliser l (`denom`
   in the code) are updated block by block; folding in a block of scores x_J with max m_J is
       m' = max(m, m_J),   l' = exp(m - m') l + sum_j exp(x_j - m'),
   and the partial output is rescaled the same way: acc' = exp(m - m') acc + exp(x_J - m') V_J.
2. Forward (Dao et al. 2022, loop order of Dao 2023): for each block of queries Q_I, walk the
   blocks of keys K_J, V_J with the update above; O_I = acc / l. Save only the log-sum-exp
   L_I = m + log l (one number per query), never the (T, S) probabilities.
3. Backward with recomputation: delta_i = rowsum(dO_i * O_i); for each key block J and query
   block I, recompute P_IJ = exp(Z_IJ - L_I), Z_IJ = Q_I K_J^T / sqrt(D), from the saved L, then
       dV_J += P_IJ^T dO_I,   dP_IJ = dO_I V_J^T,   dZ_IJ = P_IJ * (dP_IJ - delta_I),
       dQ_I += dZ_IJ K_J / sqrt(D),   dK_J += dZ_IJ^T Q_I / sqrt(D).
   The memory held beyond the inputs is O(T D): outputs, L, delta and one (block_q, block_k)
   tile.

Grouped key/value heads are shared by H / H_kv query heads by broadcasting a view (the keys and
values are never repeated to H heads). `causal` puts the T queries at the last T of the S keys,
as `tfbook.attention.attend` does with a cache. A query whose keys are all masked out gets a
zero output (as `tfbook.attention.scaled_dot_product_attention`) and L = -inf.

Shape legend: B batch, H query heads, H_kv key/value heads, T queries, S keys, D head size.
Masks are boolean, True = may attend.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

BLOCK_STATUSES = ("full", "partial", "skipped")  # what the causal mask leaves of a tile


def online_softmax_update(
    m: Tensor, denom: Tensor, scores: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fold a block of scores (..., n) into the running max m (...) and normaliser l (...).

    -> (m', l', p, alpha) with m' = max(m, max_j x_j), p = exp(x - m') (..., n),
    alpha = exp(m - m') (the factor that rescales everything summed so far) and
    l' = alpha l + sum_j p_j. Start from m = -inf, l = 0. Scores of -inf (masked) give p = 0;
    while a row has seen only -inf, its m stays -inf and its l stays 0.
    Example: m=-inf, l=0, x=[1, 2] -> m'=2, l'=e^-1 + 1; then x=[3] -> m'=3, l'=(e^-1+1)e^-1+1.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1))  # (...)
    # exp(-inf - (-inf)) is NaN: a row with nothing visible yet subtracts 0 instead
    m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - m_safe[..., None])  # (..., n), each <= 1
    alpha = torch.exp(m - m_safe)  # (...), <= 1; 0 while m = -inf
    l_new = alpha * denom + p.sum(dim=-1)  # (...)
    return m_new, l_new, p, alpha


def online_softmax_steps(x: Tensor, block: int) -> Iterator[tuple[int, Tensor, Tensor]]:
    """Walk x (..., n) in blocks: yield (end, m, l) after each block, over x[..., :end].

    After each step m = max(x[..., :end]) and l = sum(exp(x[..., :end] - m)) exactly as if the
    first `end` entries were all there is (the invariant the tests check step by step).
    """
    check_block(block, "block")
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    denom = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.size(-1), block):
        end = min(start + block, x.size(-1))
        m, denom, _, _ = online_softmax_update(m, denom, x[..., start:end])
        yield end, m, denom


def online_softmax(x: Tensor, block: int) -> Tensor:
    """softmax(x) over the last dim from one streaming pass for (m, l): exp(x - m) / l."""
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() < 1 or x.size(-1) == 0:
        raise ValueError(f"online_softmax expects a floating tensor (..., n) with n >= 1, got "
                         f"{_describe(x)}")
    *_, (_, m, denom) = online_softmax_steps(x, block)  # only the last step's (m, l)
    return torch.exp(x - m[..., None]) / denom[..., None]


def tile_status(i0: int, i1: int, j0: int, j1: int, T: int, S: int, causal: bool) -> str:
    """What the causal mask leaves of the tile of queries [i0, i1) and keys [j0, j1).

    Query i sits at key position S - T + i (the last T of S), so it may see keys j <= S - T + i.
    "skipped": no query of the tile sees any of its keys (the tile is never computed);
    "full": every query sees every key (no mask needed); "partial": the diagonal crosses it.
    """
    if not causal:
        return "full"
    shift = S - T
    if j0 > shift + i1 - 1:  # even the last query of the tile is before the first key
        return "skipped"
    if j1 - 1 <= shift + i0:  # even the first query sees the last key
        return "full"
    return "partial"


def tile_map(T: int, S: int, block_q: int, block_k: int, causal: bool) -> list[list[str]]:
    """The status of every tile, rows = query blocks, columns = key blocks (for the picture)."""
    check_block(block_q, "block_q")
    check_block(block_k, "block_k")
    return [[tile_status(i0, min(i0 + block_q, T), j0, min(j0 + block_k, S), T, S, causal)
             for j0 in range(0, S, block_k)] for i0 in range(0, T, block_q)]


def _tile_scores(q_i: Tensor, k_j: Tensor, scale: float, i0: int, j0: int, T: int, S: int,
                 status: str, mask: Tensor | None) -> Tensor:
    """One tile's scores, masked ones -inf: (N, G, R, bq, D), (N, G, 1, bk, D) -> (..., bq, bk)."""
    s = (q_i @ k_j.transpose(-2, -1)) * scale  # (N, G, R, bq, bk); K_J broadcast over R heads
    bq, bk = s.shape[-2:]
    if status == "partial":
        rows = torch.arange(i0, i0 + bq, device=s.device)[:, None] + (S - T)  # key position
        cols = torch.arange(j0, j0 + bk, device=s.device)[None, :]
        s = s.masked_fill(cols > rows, -math.inf)  # (bq, bk) broadcast over the batch
    if mask is not None:
        s = s.masked_fill(~mask[..., i0:i0 + bq, j0:j0 + bk], -math.inf)
    return s


def flash_forward(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                  block_q: int, block_k: int) -> tuple[Tensor, Tensor]:
    """Tiled forward on the grouped layout: q (N, G, R, T, D), k, v (N, G, 1, S, D).

    mask is None or (N, G, R, T, S) (an expanded view is fine). -> O (N, G, R, T, Dv) and the
    log-sum-exp L (N, G, R, T). Outer loop over query blocks, inner over key blocks (Dao 2023).
    """
    T, D = q.shape[-2:]
    S = k.size(-2)
    scale = 1.0 / math.sqrt(D)
    out = q.new_empty((*q.shape[:-1], v.size(-1)))  # (N, G, R, T, Dv)
    lse = q.new_empty(q.shape[:-1])  # (N, G, R, T)
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        q_i = q[..., i0:i1, :]  # (N, G, R, bq, D)
        m = q.new_full(q_i.shape[:-1], -math.inf)  # (N, G, R, bq) running max
        denom = q.new_zeros(q_i.shape[:-1])  # (N, G, R, bq) running normaliser
        acc = q.new_zeros((*q_i.shape[:-1], v.size(-1)))  # (N, G, R, bq, Dv) unnormalised O_I
        for j0 in range(0, S, block_k):
            j1 = min(j0 + block_k, S)
            status = tile_status(i0, i1, j0, j1, T, S, causal)
            if status == "skipped":
                continue
            s = _tile_scores(q_i, k[..., j0:j1, :], scale, i0, j0, T, S, status, mask)
            m, denom, p, alpha = online_softmax_update(m, denom, s)  # p (N, G, R, bq, bk)
            acc = alpha[..., None] * acc + p @ v[..., j0:j1, :]  # (N, G, R, bq, Dv)
        seen = denom > 0  # False for a query whose keys are all masked out
        out[..., i0:i1, :] = acc / torch.where(seen, denom, torch.ones_like(denom))[..., None]
        lse[..., i0:i1] = torch.where(seen, m + torch.log(denom),
                                     torch.full_like(denom, -math.inf))
    return out, lse


def flash_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   mask: Tensor | None, causal: bool, block_q: int, block_k: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV on the grouped layout, recomputing each tile's P from the saved L.

    Outer loop over key blocks (dK_J, dV_J finished in one sweep), inner over query blocks
    (dQ_I accumulated in place), as in FlashAttention-2. Shapes as in `flash_forward`.
    """
    T, D = q.shape[-2:]
    S = k.size(-2)
    scale = 1.0 / math.sqrt(D)
    delta = (grad_out * out).sum(dim=-1)  # (N, G, R, T): delta_i = rowsum(dO_i * O_i)
    # masked scores are -inf, so exp(-inf - 0) = 0 also on rows that saw nothing (L = -inf)
    lse = torch.where(lse == -math.inf, torch.zeros_like(lse), lse)
    grad_q = torch.zeros_like(q)  # (N, G, R, T, D)
    grad_k = torch.zeros_like(k)  # (N, G, 1, S, D)
    grad_v = torch.zeros_like(v)  # (N, G, 1, S, Dv)
    for j0 in range(0, S, block_k):
        j1 = min(j0 + block_k, S)
        k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]  # (N, G, 1, bk, D), (N, G, 1, bk, Dv)
        for i0 in range(0, T, block_q):
            i1 = min(i0 + block_q, T)
            status = tile_status(i0, i1, j0, j1, T, S, causal)
            if status == "skipped":
                continue
            q_i, do_i = q[..., i0:i1, :], grad_out[..., i0:i1, :]
            s = _tile_scores(q_i, k_j, scale, i0, j0, T, S, status, mask)
            p = torch.exp(s - lse[..., i0:i1, None])  # (N, G, R, bq, bk): softmax, recomputed
            # the R query heads of a group share K_J, V_J: their contributions add up
            grad_v[..., j0:j1, :] += (p.transpose(-2, -1) @ do_i).sum(dim=2, keepdim=True)
            dp = do_i @ v_j.transpose(-2, -1)  # (N, G, R, bq, bk)
            dz = p * (dp - delta[..., i0:i1, None])  # (N, G, R, bq, bk): softmax backward
            grad_q[..., i0:i1, :] += (dz @ k_j) * scale
            grad_k[..., j0:j1, :] += (dz.transpose(-2, -1) @ q_i).sum(dim=2, keepdim=True) * scale
    return grad_q, grad_k, grad_v


def check_block(value: object, name: str) -> None:
    """A block size must be a positive int (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")


def _describe(t: object) -> str:
    if isinstance(t, Tensor):
        return f"tensor of shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"
    return type(t).__name__


def _grouped_layout(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int]:
    """Check q (..., T, D), k (..., S, D), v (..., S, Dv) and return (N, G, R) of the layout.

    The leading dims of q and k agree, except that the third-from-last (the heads) of q may be
    a multiple R of k's (grouped key/value heads). N is the product of the dims before it.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., length, head size), got "
                             f"{tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.size(-1) != q.size(-1) or v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"expected q (..., T, D), k (..., S, D), v (..., S, Dv) with matching D and "
            f"k, v sharing (..., S), got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}")
    lead_q, lead_k = q.shape[:-2], k.shape[:-2]
    if len(lead_q) == 0 and len(lead_k) == 0:
        return 1, 1, 1
    if (len(lead_q) != len(lead_k) or len(lead_q) == 0 or lead_q[:-1] != lead_k[:-1]
            or lead_k[-1] == 0 or lead_q[-1] % lead_k[-1] != 0):
        raise ValueError(
            f"q and k must have the same leading dimensions, except that q's heads (the third "
            f"dimension from the end) may be a multiple of k's (grouped key/value heads), got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}")
    return math.prod(lead_q[:-1]), lead_k[-1], lead_q[-1] // lead_k[-1]


class FlashAttention(torch.autograd.Function):
    """Flash attention as an autograd Function: apply(q, k, v, is_causal, mask, block_q, block_k).

    q (..., T, D), k (..., S, D), v (..., S, Dv) with any leading dimensions (q's heads, the
    third dimension from the end, may be a multiple of k's). Saves q, k, v, O and the
    log-sum-exp L (..., T) for the hand-written backward; -> O (..., T, Dv).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                mask: Tensor | None = None, block_q: int = 64, block_k: int = 64) -> Tensor:
        N, G, R = _grouped_layout(q, k, v)
        if not isinstance(is_causal, bool):
            raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
        check_block(block_q, "block_q")
        check_block(block_k, "block_k")
        T, S = q.size(-2), k.size(-2)
        mask5 = _grouped_mask(mask, q.shape[:-2], T, S, (N, G, R), q.device)
        q5 = q.reshape(N, G, R, T, q.size(-1))  # (N, G, R, T, D): a view when q is contiguous
        k5 = k.reshape(N, G, 1, S, k.size(-1))  # (N, G, 1, S, D): shared by the R heads
        v5 = v.reshape(N, G, 1, S, v.size(-1))  # (N, G, 1, S, Dv)
        out5, lse5 = flash_forward(q5, k5, v5, mask5, is_causal, block_q, block_k)
        out = out5.reshape(*q.shape[:-1], v.size(-1))  # (..., T, Dv)
        lse = lse5.reshape(q.shape[:-1])  # (..., T)
        # L is the only saved tensor of shape (..., T); a mask is saved only when there is one
        ctx.save_for_backward(q, k, v, out, lse, *([] if mask is None else [mask]))
        ctx.settings = (is_causal, block_q, block_k, (N, G, R))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, *rest = ctx.saved_tensors
        mask = rest[0] if rest else None
        is_causal, block_q, block_k, (N, G, R) = ctx.settings
        T, S = q.size(-2), k.size(-2)
        mask5 = _grouped_mask(mask, q.shape[:-2], T, S, (N, G, R), q.device)
        grad_q, grad_k, grad_v = flash_backward(
            grad_out.reshape(N, G, R, T, v.size(-1)), q.reshape(N, G, R, T, q.size(-1)),
            k.reshape(N, G, 1, S, k.size(-1)), v.reshape(N, G, 1, S, v.size(-1)),
            out.reshape(N, G, R, T, v.size(-1)), lse.reshape(N, G, R, T),
            mask5, is_causal, block_q, block_k)
        return (grad_q.reshape(q.shape), grad_k.reshape(k.shape), grad_v.reshape(v.shape),
                None, None, None, None)


def _grouped_mask(mask: Tensor | None, lead: torch.Size, T: int, S: int,
                  layout: tuple[int, int, int], device: torch.device) -> Tensor | None:
    """A mask broadcastable to (..., T, S) as an expanded (N, G, R, T, S) view (no copy)."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got "
                        f"{_describe(mask)}")
    if mask.device != device:
        raise ValueError(f"mask must be on q's device {device}, got {mask.device}")
    try:
        full = mask.expand(*lead, T, S)  # (..., T, S): stride 0 where mask has size 1
    except RuntimeError:
        raise ValueError(f"mask must broadcast to {(*lead, T, S)} (..., T, S), got shape "
                         f"{tuple(mask.shape)}") from None
    return full.reshape(*layout, T, S)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                    causal: bool = False, block_q: int = 64, block_k: int = 64) -> Tensor:
    """softmax(q k^T / sqrt(D) + M) v by tiles (Dao et al. 2022; Dao 2023), differentiable.

    q (B, H, T, D), k, v (B, H_kv, S, D) with H a multiple of H_kv; `mask` boolean,
    broadcastable to (B, H, T, S), True = may attend; `causal` places the T queries at the
    last T of the S keys. -> (B, H, T, D), equal to `scaled_dot_product_attention` up to
    rounding, without holding a (T, S) matrix.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"flash_attention expects {name} of shape (B, H, T, D), got "
                             f"{_describe(t)}")
    if mask is not None and isinstance(mask, Tensor) and mask.dim() > 4:
        raise ValueError(f"mask must broadcast to (B, H, T, S), got shape {tuple(mask.shape)}")
    if k.size(0) != q.size(0):
        raise ValueError(f"q and k must have the same batch size B, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    return FlashAttention.apply(q, k, v, causal, mask, block_q, block_k)
