"""Scaled dot-product attention and multi-head attention (self and cross).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(D) + M) V                  (Vaswani et al., 3.2.1)
    MultiHead(X_q, X_kv) = Concat(head_1, ..., head_H) W_O,
        head_h = Attention(X_q W_Q^h, X_kv W_K^h, X_kv W_V^h)            (3.2.2)

Grouped-query attention (Ainslie et al. 2023) gives the H query heads only H_kv key/value
heads, each shared by H / H_kv query heads (H_kv = 1 is multi-query attention, Shazeer 2019):
fewer keys and values to compute and, above all, to keep in the cache. RoPE (Su et al.)
rotates q and k inside attention, at their positions; a `KVCache` keeps the keys and values
of earlier positions while generating. Two settings of today's open models live here too:
QK-norm (Qwen3) gives each head's query and key an RMSNorm over its D features before RoPE,
and a sliding window (Mistral) lets each query see only the last `sliding_window`
positions, itself included (`tfbook.sliding_window`).

Shape legend: B batch, T query positions, S key/value positions (S = T for self-attention
without a cache), C model width, H heads, H_kv key/value heads, D = C / H head size.
Masks are boolean, True = may attend (see `tfbook.masks`).
"""

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.cache import LayerCache
from tfbook.config import check_choice, check_positive, check_probability, is_int, is_number
from tfbook.hooks import HookPoint
from tfbook.masks import causal_mask, check_mask, combine_masks
from tfbook.normalization import RMSNorm
from tfbook.rope import (
    CONVENTIONS,
    PRECISIONS,
    check_rope_positions,
    check_rope_table,
    rope_cos_sin,
    rotate_planes,
)
from tfbook.rope_scaling import check_rope_scaling, scaled_rope_cos_sin
from tfbook.sliding_window import sliding_window_mask


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


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, S, D) -> (B, H_kv * n_rep, S, D): each key/value head serves n_rep query heads.

    Head h of the result is head h // n_rep of x, so query heads 0..n_rep-1 share the first.
    """
    if n_rep == 1:
        return x
    B, H_kv, S, D = x.size()
    return x[:, :, None].expand(B, H_kv, n_rep, S, D).reshape(B, H_kv * n_rep, S, D)


ATTENTION_KERNELS = ("reference", "torch", "flash")  # the names `attend` knows


def check_attention_settings(settings: Any, owner: str) -> None:
    """Check the attention fields of `settings` (a config, or a module's arguments) and name
    `owner` in the error: d_model, n_heads, n_kv_heads, dropout, attention, rope_*."""
    check_positive(settings, "d_model", "n_heads", owner=owner)
    if settings.n_kv_heads is not None:
        check_positive(settings, "n_kv_heads", owner=owner)
    check_probability(settings, "dropout", owner=owner)
    check_choice(settings, "attention", ATTENTION_KERNELS, owner=owner)
    check_choice(settings, "rope_convention", CONVENTIONS, owner=owner)
    check_choice(settings, "rope_precision", PRECISIONS, owner=owner)
    d_model, n_heads, n_kv_heads = settings.d_model, settings.n_heads, settings.n_kv_heads
    head_dim = getattr(settings, "head_dim", None)
    if head_dim is not None and (not is_int(head_dim) or head_dim < 1):
        raise ValueError(f"{owner}: head_dim must be a positive int, or None for "
                         f"d_model / n_heads, got {head_dim!r}")
    if head_dim is None and d_model % n_heads != 0:
        raise ValueError(f"{owner}: d_model={d_model} is not divisible by n_heads={n_heads} "
                         f"(set head_dim to give the heads another size)")
    head_size = d_model // n_heads if head_dim is None else head_dim
    if n_kv_heads is not None and n_heads % n_kv_heads != 0:
        raise ValueError(
            f"{owner}: n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}"
        )
    qk_norm = getattr(settings, "qk_norm", False)
    if not isinstance(qk_norm, bool):
        raise ValueError(f"{owner}: qk_norm must be True or False, got {qk_norm!r}")
    window = getattr(settings, "sliding_window", None)
    if window is not None and (not is_int(window) or window < 1):
        raise ValueError(
            f"{owner}: sliding_window counts the positions a query sees (itself included): "
            f"a positive int, or None for no window, got {window!r}"
        )
    base = settings.rope_base
    # (multi-head latent attention rotates qk_rope_head_dim instead, checked in tfbook.mla)
    odd_head = head_size % 2 == 1 and getattr(settings, "kv_lora_rank", None) is None
    if base is not None and (not is_number(base) or not base > 1.0 or odd_head):
        raise ValueError(
            f"{owner}: RoPE needs rope_base > 1 and an even head size, got rope_base="
            f"{base!r} and head size {head_size}"
        )


def flash_kernel() -> Callable[..., Tensor]:
    """`tfbook.flash.flash_attention`, imported when first asked for (the "flash" kernel)."""
    try:
        from tfbook.flash import flash_attention
    except ModuleNotFoundError as error:
        if error.name != "tfbook.flash":
            raise
        raise ModuleNotFoundError(
            "the 'flash' attention kernel is tfbook.flash.flash_attention, but the module "
            "tfbook.flash is missing; choose attention='reference' or 'torch'",
            name="tfbook.flash",
        ) from None
    return flash_attention


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
    dropout_p: float = 0.0, need_weights: bool = False, kernel: str = "reference",
) -> tuple[Tensor, Tensor | None]:
    """The one place that picks the attention kernel: q (B, H, T, D), k, v (B, H_kv, S, D).

    Each of the H_kv key/value heads serves H / H_kv query heads (grouped-query attention).
    The kernels compute the same function and differ in what they keep:

    - "reference": our `scaled_dot_product_attention` on keys and values repeated to H heads;
      it builds the (T, S) weights, so it is also what runs whenever the weights are wanted;
    - "torch": torch's fused `F.scaled_dot_product_attention`, which never keeps the weights
      and shares the key/value heads without copying them (enable_gqa);
    - "flash": ours, tiled over blocks of queries and keys (`tfbook.flash`), no (T, S) matrix.

    `causal` puts the T queries at the last T of the S key positions (as with a cache); the
    causal mask is built only when it hides something (T > 1).
    -> out (B, H, T, D) and weights (B, H, T, S) or None.
    """
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"kernel must be one of {ATTENTION_KERNELS}, got {kernel!r}")
    H, T, S = q.size(1), q.size(-2), k.size(-2)
    causal = causal and T > 1  # a single (last) query may see every key: nothing to hide
    if mask is not None:
        check_mask(mask, T, S)
    if kernel == "torch" and not need_weights:
        grouped = {"enable_gqa": True} if k.size(1) != H else {}
        if causal and mask is None and S == T:
            # a plain square causal mask: the kernel's is_causal flag skips masked blocks
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                                 **grouped)
            return out, None
        full = combine_masks(causal_mask(T, S, q.device) if causal else None, mask)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=full, dropout_p=dropout_p,
                                             **grouped)
        return out, None
    if kernel == "flash" and not need_weights:
        if dropout_p > 0.0:
            raise ValueError(f"the 'flash' kernel has no dropout, got dropout_p={dropout_p}: "
                             "train with attention='torch' or 'reference', or dropout=0")
        return flash_kernel()(q, k, v, mask=mask, causal=causal), None
    n_rep = H // k.size(1)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D): shared across groups
    full = combine_masks(causal_mask(T, S, q.device) if causal else None, mask)
    out, weights = scaled_dot_product_attention(q, k, v, full, dropout_p)
    return out, (weights if need_weights else None)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, self or cross, with grouped key/value heads, RoPE and a cache.

    `forward(x)` is self-attention; `forward(x, source)` is cross-attention, where the
    queries come from `x` (B, T, C) and the keys and values from `source` (B, S, C).
    The same module serves the encoder (BERT), the decoder (GPT, Llama-style models) and both
    attentions of the encoder-decoder (Vaswani et al. 3.2.2; Ainslie et al. 2023).
    Inside a model, `BlockConfig.make_attention()` builds it from the block's settings.
    """

    def __init__(
        self, d_model: int, n_heads: int, *, dropout: float = 0.0, bias: bool = True,
        attention: str = "reference", n_kv_heads: int | None = None,
        rope_base: float | None = None, rope_convention: str = "interleaved",
        rope_precision: str = "float64", qk_norm: bool = False, norm_eps: float = 1e-6,
        sliding_window: int | None = None, rope_scaling: dict | None = None,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        check_attention_settings(SimpleNamespace(
            d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
            dropout=dropout,
            attention=attention, rope_base=rope_base, rope_convention=rope_convention,
            rope_precision=rope_precision, qk_norm=qk_norm, sliding_window=sliding_window),
            owner="MultiHeadAttention")
        if qk_norm and (not is_number(norm_eps) or not norm_eps > 0):
            raise ValueError(f"MultiHeadAttention: norm_eps must be > 0, got {norm_eps!r}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.d_model = d_model
        self.head_size = d_model // n_heads if head_dim is None else head_dim  # D
        self.dropout = dropout
        # the kernel `attend` runs when the weights are not asked for: "reference", "torch"
        # or "flash" compute the same function (the tests check), at different costs
        self.attention = attention
        self.rope_base = rope_base  # None: no rotation (positions were added to the input)
        self.rope_convention = rope_convention
        self.rope_precision = rope_precision
        # RoPE scaling (tfbook.rope_scaling): a Hugging Face style dict, or None (plain RoPE);
        # read by the table this module builds itself (a model passes its own rope_table)
        self.rope_scaling = check_rope_scaling(SimpleNamespace(
            rope_scaling=rope_scaling, rope_base=rope_base, d_model=d_model, n_heads=n_heads,
            head_dim=head_dim), owner="MultiHeadAttention")
        # H D = C unless head_dim says otherwise (Qwen3-0.6B: 16 heads of 128 in a width of 1024)
        q_width, kv_width = n_heads * self.head_size, n_kv_heads * self.head_size
        self.q_proj = nn.Linear(d_model, q_width, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)  # H_kv heads, not H
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.out_proj = nn.Linear(q_width, d_model, bias=bias)  # W_O
        # QK-norm (Qwen3): one RMSNorm over the D features of every query head, one over every
        # key head, before RoPE; None = no norm (and no parameters)
        self.q_norm = RMSNorm(self.head_size, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_size, norm_eps) if qk_norm else None
        # sliding window (Mistral): a query sees the last `sliding_window` positions only
        self.sliding_window = sliding_window
        self.packed_qkv = None  # W_Q, W_K, W_V as one matrix: tfbook.packing (for decoding)
        # hook points (tfbook.hooks): q (B, H, T, D), k and v (B, H_kv, T, D) as projected,
        # before RoPE; weights (B, H, T, S); heads (B, H, T, D), each head's mix of values
        # before W_O; out (B, T, C), what the sub-layer adds to the residual stream
        self.q, self.k, self.v = HookPoint(), HookPoint(), HookPoint()
        self.weights, self.heads, self.out = HookPoint(), HookPoint(), HookPoint()

    def window_mask(
        self, mask: Tensor | None, T: int, S: int, device: torch.device
    ) -> Tensor | None:
        """`mask` with the sliding window added, for T queries that are the last T of S keys.

        A cache that keeps only the window (`SlidingWindowKVCache`) returns fewer keys than
        positions seen: a mask over every position seen (B, 1, 1, start + T) is cut to its
        last S. Without a window, or when all S keys lie inside it, `mask` is returned as is.
        """
        if self.sliding_window is None:
            return mask
        if mask is not None and mask.size(-1) > S:
            mask = mask[..., -S:]  # the positions the rolling cache still holds
        if S <= self.sliding_window:
            return mask  # no query is window or more positions after a key: causal suffices
        window = sliding_window_mask(T, S, self.sliding_window, device=device)  # (T, S)
        return combine_masks(window[None, None], mask)

    def split_heads(self, x: Tensor, n_heads: int | None = None) -> Tensor:
        """(B, T, n_heads * D) -> (B, n_heads, T, D): each head gets its own D-wide slice."""
        B, T, _ = x.size()
        n_heads = self.n_heads if n_heads is None else n_heads
        return x.view(B, T, n_heads, self.head_size).transpose(1, 2)  # (B, H, T, D)

    def forward(
        self,
        x: Tensor,
        source: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        positions: Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = True,
        *,
        rope_table: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from x (B, T, C) to source (B, S, C), or to x itself; -> (B, T, C), (B, H, T, S).

        `mask` is boolean (True = may attend) of 4 dimensions that broadcast to
        (B, H, T, S_total), e.g. `padding_mask(lengths)` (B, 1, 1, S) or
        `causal_mask(T)[None, None]`; `causal=True` adds the causal mask. `positions` (T,)
        or (B, T) are the index of each query (RoPE); they default to the cache's length
        onwards. With a `cache`, self-attention appends this step's keys and values and
        attends to all stored ones; cross-attention computes the source's keys and values
        once and reuses them. The weights are None when
        `need_weights=False`. `rope_table` is the (cos, sin) of the positions (`rope_cos_sin`):
        a model builds it once per forward pass for all its layers; without it the module
        builds its own from `positions`.
        """
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(
                f"expected x of shape (B, T, {self.d_model}), "
                f"got {tuple(x.shape)}"
            )
        B, T, C = x.size()
        # under autocast torch casts inputs itself; int8 layers (tfbook.quantize.Int8Linear)
        # hold no float weight and take any float input
        dtype = getattr(self.q_proj, "weight", x).dtype
        for name, t in (("x", x), ("source", source)):
            if t is not None and t.dtype != dtype and not torch.is_autocast_enabled(t.device.type):
                raise TypeError(f"expected {name} of this module's dtype {dtype} (its weights), "
                                f"got {t.dtype}: convert the input with .to({dtype}) or the "
                                f"module with .to({t.dtype})")
        if rope_table is not None and (self.rope_base is None or source is not None):
            raise ValueError(
                "rope_table rotates the queries and keys of a self-attention with RoPE; this "
                f"call is {'cross-attention' if source is not None else 'without RoPE'} "
                f"(rope_base={self.rope_base})"
            )
        if mask is not None and (not isinstance(mask, Tensor) or mask.dim() != 4):
            # a 2-D mask could be (T, S) or a (B, S) key-padding mask: when B == T the two
            # read alike, so the module takes only the explicit 4-D form
            raise ValueError(
                "mask must have 4 dimensions (B, H, T, S), each 1 or full size; build a "
                "key-padding mask with tfbook.masks.padding_mask (-> (B, 1, 1, S)) and turn a "
                f"(T, S) mask into (1, 1, T, S) with mask[None, None], got "
                f"{tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__}"
            )
        packed = self.packed_qkv if source is None else None
        if packed is not None and packed.usable():
            q, k, v = packed(x)  # one product x [W_Q; W_K; W_V]^T, split (tfbook.packing)
        else:
            q = self.q_proj(x)
            k, v = (self.k_proj(x), self.v_proj(x)) if source is None else (None, None)
        q = self.q(self.split_heads(q))  # (B, H, T, D)
        if self.q_norm is not None:
            q = self.q_norm(q)  # QK-norm: each head's query scaled to unit RMS over D
        if source is None:  # self-attention: this step's keys and values, then the cache's
            k = self.k(self.split_heads(k, self.n_kv_heads))  # (B, H_kv, T, D)
            v = self.v(self.split_heads(v, self.n_kv_heads))  # (B, H_kv, T, D)
            if self.k_norm is not None:
                k = self.k_norm(k)
            if self.rope_base is not None:
                if rope_table is None:  # standalone: build the table for these positions
                    if positions is None:
                        start = 0 if cache is None else cache.length
                        positions = torch.arange(start, start + T, device=x.device)  # (T,)
                    positions = check_rope_positions(q, positions)
                    if self.rope_scaling is None:
                        rope_table = rope_cos_sin(positions, self.head_size, self.rope_base,
                                                  self.rope_precision, q.dtype)
                    else:  # "dynamic" reads max(positions) + 1 as the current length
                        rope_table = scaled_rope_cos_sin(positions, self.head_size,
                                                         self.rope_base, self.rope_scaling,
                                                         self.rope_precision, q.dtype)
                cos, sin = check_rope_table(rope_table, q)  # one table for q and k
                q = rotate_planes(q, cos, sin, self.rope_convention)  # (B, H, T, D)
                k = rotate_planes(k, cos, sin, self.rope_convention)  # (B, H_kv, T, D)
            if cache is not None:
                k, v = cache.update(k, v)  # (B, H_kv, S, D): every position so far
            mask = self.window_mask(mask, T, k.size(-2), x.device)
        elif cache is not None and cache.cross is not None:
            k, v = cache.cross  # the source's keys and values, computed at the first step
        else:
            if source.dim() != 3 or source.size(0) != B or source.size(-1) != C:
                raise ValueError(
                    f"expected source of shape ({B}, S, {C}) for x of shape {tuple(x.shape)}, "
                    f"got {tuple(source.shape)}"
                )
            k = self.k(self.split_heads(self.k_proj(source), self.n_kv_heads))  # (B,H_kv,S,D)
            v = self.v(self.split_heads(self.v_proj(source), self.n_kv_heads))  # (B,H_kv,S,D)
            if self.k_norm is not None:
                k = self.k_norm(k)
            if cache is not None:
                cache.cross = (k, v)
        p = self.dropout if self.training else 0.0
        if self.weights.watched:  # a hook reads or replaces the weights: form them
            y, weights = attend(q, k, v, mask, causal, p, True, "reference")
            hooked = self.weights(weights)  # (B, H, T, S)
            if hooked is not weights:  # replaced: mix the values with the new weights
                weights = hooked
                y = F.dropout(weights, p) @ repeat_kv(v, self.n_heads // v.size(1))
        else:
            y, weights = attend(q, k, v, mask, causal, p, need_weights, self.attention)
        # y (B, H, T, D); weights (B, H, T, S) or None
        y = self.heads(y).transpose(1, 2).reshape(B, T, -1)  # (B, T, H, D) -> (B, T, H D)
        return self.out(self.out_proj(y)), weights
