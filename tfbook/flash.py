"""Flash attention from scratch in plain PyTorch: tiles, an online softmax, a recomputing backward.

    Y = softmax(Q K^T / sqrt(D) + log M) V, computed without ever holding the (T, S) matrix.

Letters as in the book's flash-attention chapter, the papers' in brackets (Dao et al. 2022;
Dao 2023): z-hat the running max [m], lambda the running normaliser [l], lse the log-sum-exp
[L], A the attention weights [P], Y the output [O], G = dL/dY [dO].

1. The online softmax (Milakov & Gimelshein 2018): the running max `m` and normaliser `denom`
   are updated block by block; folding in a block of scores z_J is
       m' = max(m, max_j z_j),   denom' = exp(m - m') denom + sum_j exp(z_j - m'),
   and the unnormalised output is rescaled the same way: acc' = exp(m - m') acc + exp(z_J - m') V_J.
2. Forward (Dao et al. 2022, with FlashAttention-2's loop order, unnormalised accumulator and
   single saved statistic): for each block of queries Q_I, walk the blocks of keys K_J, V_J
   with the update above; Y_I = acc / denom, divided once at the end. Save only the
   log-sum-exp lse_I = m + log denom (one number per query), never the (T, S) weights.
3. Backward with recomputation: delta_i = rowsum(G_i * Y_i); for each key block J and query
   block I, recompute A_IJ = exp(Z_IJ - lse_I), Z_IJ = Q_I K_J^T / sqrt(D), from the saved lse,
   then
       dV_J += A_IJ^T G_I,   dA_IJ = G_I V_J^T,   dZ_IJ = A_IJ * (dA_IJ - delta_I),
       dQ_I += dZ_IJ K_J / sqrt(D),   dK_J += dZ_IJ^T Q_I / sqrt(D).
   The memory held beyond the inputs is O(T D): outputs, lse, delta and one (block_q, block_k)
   tile.

Grouped key/value heads are shared by n_rep = H / H_kv query heads by broadcasting a view (the
keys and values are never repeated to H heads). `causal` puts the T queries at the last T of
the S keys (bottom-right, as FlashAttention >= 2.1 and `tfbook.attention.attend` with a cache;
`torch.nn.functional.scaled_dot_product_attention(is_causal=True)` aligns top-left when
T != S). A query whose keys are all masked out gets a zero output (as
`tfbook.attention.scaled_dot_product_attention`) and lse = -inf.

Shape legend: B batch, H query heads, H_kv key/value heads, T queries, S keys, D head size,
Dv value head size; N the product of the leading dims before the heads. Masks are boolean,
True = may attend. Non-finite inputs are not refused: as in torch, a NaN or inf in q, k or v
makes NaN of (at least) every output that depends on it.
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
    _check_update(m, denom, scores)
    m_new = torch.maximum(m, scores.amax(dim=-1))  # (...)
    # exp(-inf - (-inf)) is NaN: a row with nothing visible yet subtracts 0 instead
    m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - m_safe[..., None])  # (..., n), each <= 1
    alpha = torch.exp(m - m_safe)  # (...), <= 1; 0 while m = -inf
    l_new = alpha * denom + p.sum(dim=-1)  # (...)
    return m_new, l_new, p, alpha


def _check_update(m: object, denom: object, scores: object) -> None:
    """m and l of shape (...), scores (..., n) with n >= 1, all floating, one dtype and device."""
    for name, t in (("m", m), ("denom", denom), ("scores", scores)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"online_softmax_update expects floating-point tensors, got {name} "
                            f"{_describe(t)}")
    if scores.dim() < 1 or scores.size(-1) == 0 or not (
            m.shape == denom.shape == scores.shape[:-1]):
        raise ValueError(f"online_softmax_update expects m and denom of shape (...) and scores "
                         f"(..., n) with n >= 1, got m {tuple(m.shape)}, denom "
                         f"{tuple(denom.shape)}, scores {tuple(scores.shape)}")
    if not m.dtype == denom.dtype == scores.dtype:
        raise TypeError(f"online_softmax_update expects one dtype, got m {m.dtype}, denom "
                        f"{denom.dtype}, scores {scores.dtype}")
    if not m.device == denom.device == scores.device:
        raise ValueError(f"online_softmax_update expects one device, got m {m.device}, denom "
                         f"{denom.device}, scores {scores.device}")


def _check_rows(x: object, owner: str) -> None:
    """x must be a floating tensor (..., n) with n >= 1."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"{owner} expects a floating-point tensor (..., n), got {_describe(x)}")
    if x.dim() < 1 or x.size(-1) == 0:
        raise ValueError(f"{owner} expects a floating tensor (..., n) with n >= 1, got "
                         f"{_describe(x)}")


def online_softmax_steps(x: Tensor, block: int) -> Iterator[tuple[int, Tensor, Tensor]]:
    """Walk x (..., n) in blocks: yield (end, m, l) after each block, over x[..., :end].

    After each step m = max(x[..., :end]) and l = sum(exp(x[..., :end] - m)) exactly as if the
    first `end` entries were all there is (the invariant the tests check step by step).
    Example: x = [0, 2, 1], block 2 -> (2, 2, 1 + e^-2), (3, 2, 1 + e^-2 + e^-1).
    """
    _check_rows(x, "online_softmax_steps")
    check_block(block, "block")
    return _steps(x, block)  # checked now, not at the first step


def _steps(x: Tensor, block: int) -> Iterator[tuple[int, Tensor, Tensor]]:
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    denom = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.size(-1), block):
        end = min(start + block, x.size(-1))
        m, denom, _, _ = online_softmax_update(m, denom, x[..., start:end])
        yield end, m, denom


def online_softmax(x: Tensor, block: int) -> Tensor:
    """softmax(x) over the last dim from one streaming pass for (m, l): exp(x - m) / l."""
    _check_rows(x, "online_softmax")
    *_, (_, m, denom) = online_softmax_steps(x, block)  # only the last step's (m, l)
    return torch.exp(x - m[..., None]) / denom[..., None]


def tile_status(i0: int, i1: int, j0: int, j1: int, T: int, S: int, causal: bool) -> str:
    """What the causal mask leaves of the tile of queries [i0, i1) and keys [j0, j1).

    Query i sits at key position S - T + i (the last T of S), so it may see keys j <= S - T + i.
    "skipped": no query of the tile sees any of its keys (the tile is never computed);
    "full": every query sees every key (no mask needed); "partial": the diagonal crosses it.
    Example: T = S = 4, causal: queries [0, 2) x keys [2, 4) -> "skipped".
    """
    for name, value in (("i0", i0), ("i1", i1), ("j0", j0), ("j1", j1), ("T", T), ("S", S)):
        _check_size(value, name)
    _check_causal(causal, "causal")
    if not (i0 < i1 <= T and j0 < j1 <= S):
        raise ValueError(f"tile_status expects a tile inside the (T, S) grid, 0 <= i0 < i1 <= T "
                         f"and 0 <= j0 < j1 <= S, got queries [{i0}, {i1}), keys [{j0}, {j1}), "
                         f"T={T}, S={S}")
    return _tile_status(i0, i1, j0, j1, T, S, causal)


def _tile_status(i0: int, i1: int, j0: int, j1: int, T: int, S: int, causal: bool) -> str:
    """`tile_status` without the checks: the kernel asks once per tile."""
    if not causal:
        return "full"
    shift = S - T
    if j0 > shift + i1 - 1:  # even the last query of the tile is before the first key
        return "skipped"
    if j1 - 1 <= shift + i0:  # even the first query sees the last key
        return "full"
    return "partial"


def tile_map(T: int, S: int, block_q: int, block_k: int, causal: bool) -> list[list[str]]:
    """The status of every tile, rows = query blocks, columns = key blocks (for the picture).

    Example: tile_map(4, 4, 2, 2, causal=True) -> [["partial", "skipped"], ["full", "partial"]].
    """
    _check_size(T, "T")
    _check_size(S, "S")
    check_block(block_q, "block_q")
    check_block(block_k, "block_k")
    _check_causal(causal, "causal")
    return [[_tile_status(i0, min(i0 + block_q, T), j0, min(j0 + block_k, S), T, S, causal)
             for j0 in range(0, S, block_k)] for i0 in range(0, T, block_q)]


def tile_scores(q_i: Tensor, k_j: Tensor, scale: float, i0: int, j0: int, T: int, S: int,
                status: str, mask: Tensor | None) -> Tensor:
    """One tile's scores, masked ones -inf: (N, H_kv, n_rep, bq, D), (N, H_kv, 1, bk, D) ->
    (N, H_kv, n_rep, bq, bk)."""
    s = (q_i @ k_j.transpose(-2, -1)) * scale  # (N, H_kv, n_rep, bq, bk): K_J broadcast
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
    """Tiled forward on the grouped layout: q (N, H_kv, n_rep, T, D), k, v (N, H_kv, 1, S, D).

    mask is None or (N, H_kv, n_rep, T, S) (an expanded view is fine). -> Y (N, H_kv, n_rep,
    T, Dv) and the log-sum-exp lse (N, H_kv, n_rep, T). Outer loop over query blocks, inner
    over key blocks; one division by the normaliser at the end (FlashAttention-2).
    """
    _check_grouped("flash_forward", q, k, v, mask, causal, block_q, block_k)
    T, D = q.shape[-2:]
    S = k.size(-2)
    scale = 1.0 / math.sqrt(D)
    out = q.new_empty((*q.shape[:-1], v.size(-1)))  # (N, H_kv, n_rep, T, Dv)
    lse = q.new_empty(q.shape[:-1])  # (N, H_kv, n_rep, T)
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        q_i = q[..., i0:i1, :]  # (N, H_kv, n_rep, bq, D)
        m = q.new_full(q_i.shape[:-1], -math.inf)  # (N, H_kv, n_rep, bq) running max
        denom = q.new_zeros(q_i.shape[:-1])  # (N, H_kv, n_rep, bq) running normaliser
        acc = q.new_zeros((*q_i.shape[:-1], v.size(-1)))  # (..., bq, Dv) unnormalised Y_I
        for j0 in range(0, S, block_k):
            j1 = min(j0 + block_k, S)
            status = _tile_status(i0, i1, j0, j1, T, S, causal)
            if status == "skipped":
                continue
            s = tile_scores(q_i, k[..., j0:j1, :], scale, i0, j0, T, S, status, mask)
            m, denom, p, alpha = online_softmax_update(m, denom, s)  # p (..., bq, bk)
            acc = alpha[..., None] * acc + p @ v[..., j0:j1, :]  # (N, H_kv, n_rep, bq, Dv)
        seen = denom > 0  # False for a query whose keys are all masked out
        out[..., i0:i1, :] = acc / torch.where(seen, denom, torch.ones_like(denom))[..., None]
        lse[..., i0:i1] = torch.where(seen, m + torch.log(denom),
                                     torch.full_like(denom, -math.inf))
    return out, lse


def flash_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   mask: Tensor | None, causal: bool, block_q: int, block_k: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV on the grouped layout, recomputing each tile's weights from the saved lse.

    Outer loop over key blocks (dK_J, dV_J finished in one sweep), inner over query blocks
    (dQ_I accumulated in place), as in FlashAttention-2. Shapes as in `flash_forward`;
    grad_out = G = dL/dY has the shape of out.
    """
    _check_grouped("flash_backward", q, k, v, mask, causal, block_q, block_k,
                   out=out, grad_out=grad_out, lse=lse)
    T, D = q.shape[-2:]
    S = k.size(-2)
    scale = 1.0 / math.sqrt(D)
    delta = (grad_out * out).sum(dim=-1)  # (N, H_kv, n_rep, T): delta_i = rowsum(G_i * Y_i)
    # masked scores are -inf, so exp(-inf - 0) = 0 also on rows that saw nothing (lse = -inf)
    lse = torch.where(lse == -math.inf, torch.zeros_like(lse), lse)
    grad_q = torch.zeros_like(q)  # (N, H_kv, n_rep, T, D)
    grad_k = torch.zeros_like(k)  # (N, H_kv, 1, S, D)
    grad_v = torch.zeros_like(v)  # (N, H_kv, 1, S, Dv)
    for j0 in range(0, S, block_k):
        j1 = min(j0 + block_k, S)
        k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]  # (N, H_kv, 1, bk, D), (..., bk, Dv)
        for i0 in range(0, T, block_q):
            i1 = min(i0 + block_q, T)
            status = _tile_status(i0, i1, j0, j1, T, S, causal)
            if status == "skipped":
                continue
            q_i, do_i = q[..., i0:i1, :], grad_out[..., i0:i1, :]
            s = tile_scores(q_i, k_j, scale, i0, j0, T, S, status, mask)
            p = torch.exp(s - lse[..., i0:i1, None])  # (..., bq, bk): the weights A_IJ again
            # the n_rep query heads of a group share K_J, V_J: their contributions add up
            grad_v[..., j0:j1, :] += (p.transpose(-2, -1) @ do_i).sum(dim=2, keepdim=True)
            dp = do_i @ v_j.transpose(-2, -1)  # (N, H_kv, n_rep, bq, bk): dA_IJ
            dz = p * (dp - delta[..., i0:i1, None])  # (..., bq, bk): softmax backward, dZ_IJ
            grad_q[..., i0:i1, :] += (dz @ k_j) * scale
            grad_k[..., j0:j1, :] += (dz.transpose(-2, -1) @ q_i).sum(dim=2, keepdim=True) * scale
    return grad_q, grad_k, grad_v


def check_block(value: object, name: str) -> None:
    """A block size must be a positive int (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")


def _check_size(value: object, name: str) -> None:
    """A length or an index must be an int >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 0, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value}")


def _check_causal(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _describe(t: object) -> str:
    if isinstance(t, Tensor):
        return f"tensor of shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"
    return type(t).__name__


def _check_tensors(owner: str, **tensors: object) -> None:
    """Floating-point tensors of one dtype, on one device."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{owner}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{owner}: {name} must be a floating-point tensor, got dtype "
                            f"{t.dtype}")
    named = list(tensors.items())
    if len({t.dtype for _, t in named}) > 1:
        raise TypeError(f"{owner}: {', '.join(tensors)} must share one dtype, got "
                        + ", ".join(f"{name} {t.dtype}" for name, t in named))
    if len({t.device for _, t in named}) > 1:
        raise ValueError(f"{owner}: {', '.join(tensors)} must be on one device, got "
                         + ", ".join(f"{name} {t.device}" for name, t in named))


def _check_grouped(owner: str, q: object, k: object, v: object, mask: object, causal: object,
                   block_q: object, block_k: object, **saved: object) -> None:
    """The arguments of `flash_forward` / `flash_backward` on the grouped 5-d layout."""
    _check_tensors(owner, q=q, k=k, v=v, **saved)
    _check_causal(causal, "causal")
    check_block(block_q, "block_q")
    check_block(block_k, "block_k")
    if q.dim() != 5 or k.dim() != 5 or v.dim() != 5:
        raise ValueError(f"{owner} expects q (N, H_kv, n_rep, T, D), k (N, H_kv, 1, S, D), "
                         f"v (N, H_kv, 1, S, Dv), got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    N, H_kv, n_rep, T, D = q.shape
    S, Dv = k.size(-2), v.size(-1)
    if k.shape != (N, H_kv, 1, S, D) or v.shape != (N, H_kv, 1, S, Dv):
        raise ValueError(f"{owner} expects k (N, H_kv, 1, S, D) and v (N, H_kv, 1, S, Dv) with "
                         f"q's N, H_kv and D, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    _check_head_sizes(D, Dv, q, v)
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool):
        raise TypeError(f"{owner} expects mask None or a boolean tensor, got {_describe(mask)}")
    if mask is not None and (mask.shape != (N, H_kv, n_rep, T, S) or mask.device != q.device):
        raise ValueError(f"{owner} expects mask of shape (N, H_kv, n_rep, T, S) = "
                         f"{(N, H_kv, n_rep, T, S)} on q's device {q.device}, got "
                         f"{_describe(mask)}")
    expected = {"out": (N, H_kv, n_rep, T, Dv), "grad_out": (N, H_kv, n_rep, T, Dv),
                "lse": (N, H_kv, n_rep, T)}
    for name, t in saved.items():
        if t.shape != expected[name]:
            raise ValueError(f"{owner} expects {name} of shape {expected[name]}, got "
                             f"{tuple(t.shape)}")


def _check_head_sizes(D: int, Dv: int, q: Tensor, v: Tensor) -> None:
    """1 / sqrt(D) needs D >= 1; a value head of size 0 is a slicing mistake, not a model."""
    if D < 1 or Dv < 1:
        raise ValueError(f"the head sizes D (q's and k's last dimension) and Dv (v's) must be at "
                         f"least 1, got q {tuple(q.shape)}, v {tuple(v.shape)}")


def _grouped_layout(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int]:
    """Check q (..., T, D), k (..., S, D), v (..., S, Dv); return (N, H_kv, n_rep) of the layout.

    The leading dims of q and k agree, except that the third-from-last (the heads) of q may be
    a multiple n_rep of k's (grouped key/value heads). N is the product of the dims before it.
    """
    _check_tensors("FlashAttention", q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., length, head size), got "
                             f"{tuple(t.shape)}")
    if k.size(-1) != q.size(-1) or v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"expected q (..., T, D), k (..., S, D), v (..., S, Dv) with matching D and "
            f"k, v sharing (..., S), got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}")
    _check_head_sizes(q.size(-1), v.size(-1), q, v)
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
    third dimension from the end, may be a multiple of k's). Saves q, k, v, Y and the
    log-sum-exp lse (..., T) for the hand-written backward; -> Y (..., T, Dv).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                mask: Tensor | None = None, block_q: int = 64, block_k: int = 64) -> Tensor:
        N, H_kv, n_rep = _grouped_layout(q, k, v)
        _check_causal(is_causal, "is_causal")
        check_block(block_q, "block_q")
        check_block(block_k, "block_k")
        T, S = q.size(-2), k.size(-2)
        layout = (N, H_kv, n_rep)
        mask5 = _grouped_mask(mask, q.shape[:-2], T, S, layout, q.device)
        q5 = q.reshape(*layout, T, q.size(-1))  # (N, H_kv, n_rep, T, D): a view if contiguous
        k5 = k.reshape(N, H_kv, 1, S, k.size(-1))  # (N, H_kv, 1, S, D): shared by n_rep heads
        v5 = v.reshape(N, H_kv, 1, S, v.size(-1))  # (N, H_kv, 1, S, Dv)
        out5, lse5 = flash_forward(q5, k5, v5, mask5, is_causal, block_q, block_k)
        out = out5.reshape(*q.shape[:-1], v.size(-1))  # (..., T, Dv)
        lse = lse5.reshape(q.shape[:-1])  # (..., T)
        # lse is the only saved tensor of shape (..., T); a mask is saved only when there is one
        ctx.save_for_backward(q, k, v, out, lse, *([] if mask is None else [mask]))
        ctx.settings = (is_causal, block_q, block_k, layout)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, *rest = ctx.saved_tensors
        mask = rest[0] if rest else None
        is_causal, block_q, block_k, (N, H_kv, n_rep) = ctx.settings
        T, S, D, Dv = q.size(-2), k.size(-2), q.size(-1), v.size(-1)
        mask5 = _grouped_mask(mask, q.shape[:-2], T, S, (N, H_kv, n_rep), q.device)
        grad_q, grad_k, grad_v = flash_backward(
            grad_out.reshape(N, H_kv, n_rep, T, Dv), q.reshape(N, H_kv, n_rep, T, D),
            k.reshape(N, H_kv, 1, S, D), v.reshape(N, H_kv, 1, S, Dv),
            out.reshape(N, H_kv, n_rep, T, Dv), lse.reshape(N, H_kv, n_rep, T),
            mask5, is_causal, block_q, block_k)
        return (grad_q.reshape(q.shape), grad_k.reshape(k.shape), grad_v.reshape(v.shape),
                None, None, None, None)


def _grouped_mask(mask: Tensor | None, lead: torch.Size, T: int, S: int,
                  layout: tuple[int, int, int], device: torch.device) -> Tensor | None:
    """A mask broadcastable to (..., T, S) as an expanded (N, H_kv, n_rep, T, S) view."""
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
    """softmax(q k^T / sqrt(D) + log M) v by tiles (Dao et al. 2022; Dao 2023), differentiable.

    q (B, H, T, D), k, v (B, H_kv, S, D) with H a multiple of H_kv; `mask` boolean,
    broadcastable to (B, H, T, S), True = may attend; `causal` places the T queries at the
    last T of the S keys (bottom-right). -> (B, H, T, D), equal to
    `scaled_dot_product_attention` up to rounding, without holding a (T, S) matrix.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"flash_attention expects {name} to be a torch.Tensor of shape "
                            f"(B, H, T, D), got {_describe(t)}")
        if t.dim() != 4:
            raise ValueError(f"flash_attention expects {name} of shape (B, H, T, D), got "
                             f"{_describe(t)}")
    _check_causal(causal, "causal")
    if mask is not None and isinstance(mask, Tensor) and mask.dim() > 4:
        raise ValueError(f"mask must broadcast to (B, H, T, S), got shape {tuple(mask.shape)}")
    if k.size(0) != q.size(0):
        raise ValueError(f"q and k must have the same batch size B, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    return FlashAttention.apply(q, k, v, causal, mask, block_q, block_k)
