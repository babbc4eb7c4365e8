"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2 section 2.1; DeepSeek-V3).

Each token's keys and values are not stored head by head: the token is compressed to one
latent vector c (kv_lora_rank wide, RMS-normalised), and every head's key and value are
linear functions of it. Position enters through a separate, decoupled RoPE key k_R
(qk_rope_head_dim wide) that all heads share:

    c      = RMSNorm(x W_DKV)                    (B, T, r)       the latent, cached
    k_R    = RoPE(x W_KR)                        (B, 1, T, d_R)  shared by all heads, cached
    k_h    = [c W_UK^h ; k_R]                    (B, H, T, d_N + d_R)
    v_h    = c W_UV^h                            (B, H, T, d_V)
    q_h    = [q_N^h ; RoPE(q_R^h)], from x W_Q or, with a query rank, RMSNorm(x W_DQ) W_UQ
    out    = Concat_h softmax(q_h k_h^T / sqrt(d_N + d_R) + causal) v_h   W_O

The cache holds c and k_R: (r + d_R) numbers per token and layer, against 2 H D for
multi-head attention and 2 H_kv D for grouped-query attention (`kv_cache_bytes_per_token`).

Absorbed form, for decoding: q_N^h . (c W_UK^h) = (q_N^h W_UK^h^T) . c, so W_UK folds into
the query and every head attends to the same single key [c ; k_R] and value c (one key/value
head, as multi-query attention); each head's mix of latents (r wide) then goes through W_UV^h
on its way to W_O (W_UV applied to the T outputs, not to the S cached latents). The latent
is never expanded to H heads. It computes the same function as the naive form.

DeepSeek-V3 with YaRN RoPE scaling also multiplies the softmax scale by mscale^2, where
mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (Hugging Face's `yarn_get_mscale`), because
YaRN's temperature would otherwise act on the RoPE part only; that adjustment is left to the
RoPE-scaling setting and not applied here (the scale is 1 / sqrt(d_N + d_R)).

In a model, `kv_lora_rank` in BlockConfig/GPTConfig turns the block's attention into this
module (`BlockConfig.make_attention`). It takes the call of every tfbook attention (mask,
causal, positions, cache, need_weights, and the RoPE table the model builds once per forward
pass, here d_R wide), and `GPT.new_cache` gives a `LatentKVCache`, one `LatentCache` per
layer, which generate, beam search and speculative decoding drive as they drive a KVCache.

Weight names follow Hugging Face's `DeepseekV3Attention`, so its state dict loads as is.
RoPE uses `tfbook.rope` ("interleaved" is HF's rope_interleave=True, "half" is False),
RMSNorm `tfbook.normalization`, and the softmax path `tfbook.attention.attend`.

Shape legend: B batch, T query positions, S cached positions, C model width, H heads,
r kv_lora_rank, d_N qk_nope_head_dim, d_R qk_rope_head_dim, d_V v_head_dim.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from tfbook.attention import attend
from tfbook.cache import KVCache
from tfbook.config import check_probability, is_int, is_number
from tfbook.normalization import RMSNorm
from tfbook.rope import (
    CONVENTIONS,
    PRECISIONS,
    check_rope_positions,
    check_rope_table,
    rope_cos_sin,
    rotate_planes,
)

MLA_KERNELS = ("reference", "torch")  # the `attend` kernels that take values of another width


def check_mla_settings(settings: Any, owner: str) -> None:
    """Check the MLA fields of `settings` (a config, or the module's arguments), in `owner`'s
    words: the head sizes are positive ints and the RoPE part even; when `kv_lora_rank` is set
    (MLA on), the ranks fit in the width, RoPE is on, the kernel can take values of another
    width, and no setting MLA does not have (grouped key/value heads, QK-norm, a window)."""
    for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "kv_lora_rank", "q_lora_rank"):
        value = getattr(settings, name)
        if name.endswith("rank") and value is None:
            continue  # no latent: plain attention (kv), or uncompressed queries (q)
        if not is_int(value) or value < 1:
            none = " (or None)" if name.endswith("rank") else ""
            raise ValueError(f"{owner}: {name} must be a positive int{none}, got {value!r}")
    if settings.qk_rope_head_dim % 2 != 0:
        raise ValueError(f"{owner}: RoPE rotates planes, so qk_rope_head_dim must be even, "
                         f"got {settings.qk_rope_head_dim}")
    rank = settings.kv_lora_rank
    if rank is None:
        return
    for name in ("kv_lora_rank", "q_lora_rank"):
        value = getattr(settings, name)
        if value is not None and value > settings.d_model:
            raise ValueError(
                f"{owner}: {name}={value} is larger than the width d_model={settings.d_model}; "
                "a latent compresses the token, so its rank must be at most d_model"
            )
    mla = f"multi-head latent attention (kv_lora_rank={rank})"
    base = getattr(settings, "rope_base", None)
    if base is None:
        raise ValueError(f"{owner}: {mla} rotates its decoupled key with RoPE, so it needs "
                         "rope_base (position='rope' in a model config), got rope_base=None")
    if not is_number(base) or not base > 1.0:
        raise ValueError(f"{owner}: rope_base must be a number > 1, got {base!r}")
    kernel = getattr(settings, "attention", "reference")
    if kernel not in MLA_KERNELS:
        raise ValueError(f"{owner}: attention must be one of {MLA_KERNELS} for {mla}: its "
                         f"values ({settings.v_head_dim} wide) are not as wide as its queries "
                         f"and keys, which the 'flash' kernel needs; got {kernel!r}")
    n_kv_heads = getattr(settings, "n_kv_heads", None)
    if n_kv_heads is not None and n_kv_heads != settings.n_heads:
        raise ValueError(f"{owner}: {mla} shares one latent among all heads instead of key/value "
                         f"heads; leave n_kv_heads None, got n_kv_heads={n_kv_heads}")
    scaling = getattr(settings, "rope_scaling", None)
    if scaling is not None and scaling.get("rope_type") == "yarn":
        raise ValueError(f"{owner}: rope_scaling of rope_type 'yarn' with {mla} is not supported: "
                         "DeepSeek's YaRN also multiplies the softmax scale by mscale^2, which "
                         "this attention does not apply")
    for name, off in (("qk_norm", False), ("sliding_window", None), ("head_dim", None)):
        if getattr(settings, name, off) != off:
            raise ValueError(f"{owner}: {mla} has no {name}; leave it {off}, got "
                             f"{name}={getattr(settings, name)!r}")


class LatentCache:
    """The MLA cache of one layer: the latent c (B, 1, S, r) and the rotated RoPE key k_R
    (B, 1, S, d_R) of every position so far, preallocated for `max_len` positions."""

    def __init__(self, max_len: int) -> None:
        if not is_int(max_len) or max_len < 1:
            raise ValueError(f"LatentCache: max_len must be a positive int, got {max_len!r}")
        self.max_len = int(max_len)
        self.length = 0
        self.latent: Tensor | None = None  # (B, 1, max_len, r), filled up to `length`
        self.rope_key: Tensor | None = None  # (B, 1, max_len, d_R)

    def update(self, latent: Tensor, rope_key: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, 1, T, r) and (B, 1, T, d_R) -> all so far, (B, 1, S, r), (B, 1, S, d_R)."""
        B, _, T, r = latent.size()
        if self.latent is None:
            self.latent = latent.new_zeros(B, 1, self.max_len, r)
            self.rope_key = rope_key.new_zeros(B, 1, self.max_len, rope_key.size(-1))
        elif (self.latent.size(0), self.latent.size(-1), self.rope_key.size(-1)) != (
                B, r, rope_key.size(-1)):
            raise ValueError(
                f"this cache holds batch {self.latent.size(0)} with latent width "
                f"{self.latent.size(-1)} and RoPE key width {self.rope_key.size(-1)}, got "
                f"{tuple(latent.shape)} and {tuple(rope_key.shape)}: start a new LatentCache"
            )
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"the cache holds at most {self.max_len} positions: "
                             f"{self.length} stored, {T} more given")
        self.latent[:, :, self.length : end] = latent
        self.rope_key[:, :, self.length : end] = rope_key
        self.length = end
        return self.latent[:, :, :end], self.rope_key[:, :, :end]

    def crop(self, length: int) -> None:
        """Forget every position from `length` on (the next `update` writes over them)."""
        if not is_int(length) or not 0 <= length <= self.length:
            raise ValueError(f"crop needs a length in [0, {self.length}] (the positions "
                             f"stored), got {length!r}")
        self.length = int(length)

    def memory_bytes(self) -> int:
        """Bytes of the latents and RoPE keys stored so far."""
        if self.latent is None:
            return 0
        return sum(t[:, :, : self.length].numel() * t.element_size()
                   for t in (self.latent, self.rope_key))


class LatentKVCache(KVCache):
    """A model's cache when its blocks use MLA: one `LatentCache` per layer (`GPT.new_cache`).

    The `KVCache` interface `generate`, beam search and speculative decoding use: `length`,
    `positions`, `check_batch`, `reorder` (beams), `crop` (rollback), `first_layers`
    (a draft sharing the storage) and `memory_bytes`.
    """

    def __init__(self, n_layers: int, max_len: int) -> None:
        super().__init__(n_layers, max_len)
        self.layers = [LatentCache(max_len) for _ in range(n_layers)]

    @property
    def batch_size(self) -> int | None:
        """B of the stored latents, or None before the first forward pass."""
        latent = self.layers[0].latent
        return None if latent is None else latent.size(0)

    @torch.no_grad()
    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (B',) of every stored latent and RoPE key (beam search)."""
        for layer in self.layers:
            if layer.latent is None:
                continue
            n = layer.length
            if index.numel() == layer.latent.size(0):  # in place, the filled positions only
                layer.latent[:, :, :n] = layer.latent[:, :, :n].index_select(0, index)
                layer.rope_key[:, :, :n] = layer.rope_key[:, :, :n].index_select(0, index)
            else:
                layer.latent = layer.latent.index_select(0, index)
                layer.rope_key = layer.rope_key.index_select(0, index)

    def first_layers(self, n_layers: int) -> LatentKVCache:
        """A cache of the first `n_layers` layers that SHARES their storage with this one."""
        view = super().first_layers(n_layers)
        shared = LatentKVCache(len(view.layers), self.max_len)
        shared.layers = view.layers  # the same LatentCache objects
        return shared

    def memory_bytes(self) -> int:
        """Bytes of the latents and RoPE keys stored so far, over every layer."""
        return sum(layer.memory_bytes() for layer in self.layers)


class MultiHeadLatentAttention(nn.Module):
    """Self-attention with keys and values compressed to a latent (DeepSeek-V2/V3).

    `forward(x, mask=None, causal=True, positions=None, cache=None, need_weights=False)`:
    x (B, T, C) -> (B, T, C) and the weights (B, H, T, S) or None, the call of every tfbook
    attention. With a `LatentCache`, this step's latents and RoPE keys are appended and the
    queries attend to all stored positions (the queries sit at the last T of them).
    `absorbed=True` (or the module's `absorbed` setting) computes the same function with
    W_UK folded into the query and W_UV into the output (see the module docstring).
    Inside a model, `BlockConfig.make_attention()` builds it when kv_lora_rank is set.
    """

    def __init__(
        self, d_model: int, n_heads: int, *, kv_lora_rank: int, qk_nope_head_dim: int,
        qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: int | None = None,
        bias: bool = False, rope_base: float = 10000.0, rope_convention: str = "interleaved",
        rope_precision: str = "float64", eps: float = 1e-6, attention: str = "reference",
        dropout: float = 0.0, absorbed: bool = False,
    ) -> None:
        super().__init__()
        owner = "MultiHeadLatentAttention"
        settings = SimpleNamespace(
            d_model=d_model, n_heads=n_heads, kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank,
            qk_nope_head_dim=qk_nope_head_dim, qk_rope_head_dim=qk_rope_head_dim,
            v_head_dim=v_head_dim, rope_base=rope_base, attention=attention, dropout=dropout)
        for name in ("d_model", "n_heads", "kv_lora_rank"):
            value = getattr(settings, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
        for name, value, choices in (("rope_convention", rope_convention, CONVENTIONS),
                                     ("rope_precision", rope_precision, PRECISIONS),
                                     ("attention", attention, MLA_KERNELS)):
            if value not in choices:
                raise ValueError(f"{owner}: {name} must be one of {choices}, got {value!r}")
        check_mla_settings(settings, owner)
        check_probability(settings, "dropout", owner=owner)
        if not isinstance(absorbed, bool):
            raise ValueError(f"{owner}: absorbed must be True or False, got {absorbed!r}")
        self.n_heads = n_heads
        self.q_lora_rank, self.kv_lora_rank = q_lora_rank, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_base, self.rope_convention = rope_base, rope_convention
        self.rope_precision, self.attention = rope_precision, attention
        self.dropout = dropout  # on the attention weights, while training
        self.absorbed = absorbed  # the default form of `forward`: naive (False) or absorbed
        q_width = n_heads * self.qk_head_dim
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, q_width, bias=False)  # W_Q
        else:
            self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=bias)  # W_DQ
            self.q_a_layernorm = RMSNorm(q_lora_rank, eps)
            self.q_b_proj = nn.Linear(q_lora_rank, q_width, bias=False)  # W_UQ (and W_QR)
        # [W_DKV, W_KR]: the latent and the shared RoPE key, from one product
        self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, eps)
        # [W_UK^h; W_UV^h] for each head h: (H (d_N + d_V), r)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, d_model, bias=bias)  # W_O

    def queries(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> q (B, H, T, d_N + d_R), before RoPE."""
        B, T, _ = x.size()
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(B, T, self.n_heads, self.qk_head_dim).transpose(1, 2)

    def up_weights(self) -> tuple[Tensor, Tensor]:
        """W_UK (H, d_N, r) and W_UV (H, d_V, r), the views of kv_b_proj's weight."""
        w = self.kv_b_proj.weight.view(self.n_heads, self.qk_nope_head_dim + self.v_head_dim,
                                       self.kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim :]

    def forward(
        self, x: Tensor, mask: Tensor | None = None, causal: bool = True,
        positions: Tensor | None = None, cache: LatentCache | None = None,
        need_weights: bool = False, *, rope_table: tuple[Tensor, Tensor] | None = None,
        absorbed: bool | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, C) -> out (B, T, C), weights (B, H, T, S) or None.

        `mask` is boolean (True = may attend), 4-D, broadcasting to (B, H, T, S) (a padding
        mask over every position seen, cached ones included); `causal` adds the causal mask.
        positions (T,) or (B, T) default to the cache's length onwards; `rope_table` is their
        (cos, sin) of width qk_rope_head_dim, built once per forward pass by the model (else
        here). `absorbed` None takes the module's setting.
        """
        C = self.kv_a_proj_with_mqa.in_features
        if not isinstance(x, Tensor) or x.dim() != 3 or x.size(-1) != C:
            raise ValueError(f"expected x of shape (B, T, {C}), got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        dtype = self.kv_b_proj.weight.dtype
        if x.dtype != dtype:
            raise TypeError(f"expected x of this module's dtype {dtype} (its weights), got "
                            f"{x.dtype}: convert one with .to()")
        if cache is not None and not isinstance(cache, LatentCache):
            raise TypeError(f"MultiHeadLatentAttention stores latents: cache must be a "
                            f"LatentCache (a layer of model.new_cache()), got "
                            f"{type(cache).__name__}")
        if mask is not None and (not isinstance(mask, Tensor) or mask.dim() != 4):
            raise ValueError(
                "mask must have 4 dimensions (B, H, T, S), each 1 or full size "
                "(tfbook.masks.padding_mask gives (B, 1, 1, S)), got "
                f"{tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__}")
        absorbed = self.absorbed if absorbed is None else absorbed
        B, T, _ = x.size()
        q = self.queries(x)  # (B, H, T, d_N + d_R)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split(
            [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)[:, None]  # (B, 1, T, r)
        k_rope = k_rope[:, None]  # (B, 1, T, d_R): one RoPE key for all heads
        if rope_table is None:  # standalone: build the table for these positions
            if positions is None:
                start = 0 if cache is None else cache.length
                positions = torch.arange(start, start + T, device=x.device)
            positions = check_rope_positions(q_rope, positions)
            rope_table = rope_cos_sin(positions, self.qk_rope_head_dim, self.rope_base,
                                      self.rope_precision, q.dtype)
        cos, sin = check_rope_table(rope_table, q_rope)  # (T, d_R/2) or (B, 1, T, d_R/2)
        q_rope = rotate_planes(q_rope, cos, sin, self.rope_convention)
        k_rope = rotate_planes(k_rope, cos, sin, self.rope_convention)
        if cache is not None:
            latent, k_rope = cache.update(latent, k_rope)  # (B, 1, S, r), (B, 1, S, d_R)
        p = self.dropout if self.training else 0.0
        w_uk, w_uv = self.up_weights()
        if absorbed:
            q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # W_UK into the query
            # attend divides by sqrt of the query width, r + d_R; the scale is 1/sqrt(d_N + d_R)
            rescale = math.sqrt((self.kv_lora_rank + self.qk_rope_head_dim) / self.qk_head_dim)
            q_abs = torch.cat((q_latent, q_rope), dim=-1) * rescale  # (B, H, T, r + d_R)
            k_abs = torch.cat((latent, k_rope), dim=-1)  # (B, 1, S, r + d_R): one key head
            y, weights = attend(q_abs, k_abs, latent, mask, causal, p, need_weights,
                                self.attention)  # (B, H, T, r)
            # W_UV on the T outputs, never on the S cached latents; forming W_O^h W_UV^h once
            # per call would cost C H d_V r multiply-adds, more than a decode step's attention
            y = torch.einsum("bhtr,hvr->bhtv", y, w_uv)  # (B, H, T, d_V): each head's values
            y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.v_head_dim)
            return self.o_proj(y), weights
        S = latent.size(2)
        kv = self.kv_b_proj(latent[:, 0])  # (B, S, H (d_N + d_V))
        kv = kv.view(B, S, self.n_heads, -1).transpose(1, 2)  # (B, H, S, d_N + d_V)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, self.n_heads, -1, -1)), dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, H, T, d_N + d_R)
        y, weights = attend(q, k, v, mask, causal, p, need_weights,
                            self.attention)  # (B, H, T, d_V)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.v_head_dim)
        return self.o_proj(y), weights


def kv_cache_bytes_per_token(
    attention: str, *, dtype: torch.dtype = torch.bfloat16, n_layers: int = 1,
    n_heads: int | None = None, head_size: int | None = None, n_kv_heads: int | None = None,
    kv_lora_rank: int | None = None, qk_rope_head_dim: int | None = None,
) -> int:
    """Bytes the cache keeps per token over `n_layers` layers:

    - "mha": 2 (K and V) x n_heads x head_size x bytes;
    - "gqa": 2 x n_kv_heads x head_size x bytes (n_kv_heads = 1 is multi-query attention);
    - "mla": (kv_lora_rank + qk_rope_head_dim) x bytes, the latent and the shared RoPE key.
    """
    needs = {"mha": ("n_heads", "head_size"), "gqa": ("n_kv_heads", "head_size"),
             "mla": ("kv_lora_rank", "qk_rope_head_dim")}
    if attention not in needs:
        raise ValueError(f"attention must be one of {tuple(needs)}, got {attention!r}")
    given = {"n_layers": n_layers, "n_heads": n_heads, "head_size": head_size,
             "n_kv_heads": n_kv_heads, "kv_lora_rank": kv_lora_rank,
             "qk_rope_head_dim": qk_rope_head_dim}
    for name in ("n_layers", *needs[attention]):
        if not is_int(given[name]) or given[name] < 1:
            raise ValueError(f"kv_cache_bytes_per_token({attention!r}) needs {name} as a "
                             f"positive int, got {given[name]!r}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    size = torch.empty((), dtype=dtype).element_size()
    if attention == "mha":
        per_layer = 2 * n_heads * head_size
    elif attention == "gqa":
        per_layer = 2 * n_kv_heads * head_size
    else:
        per_layer = kv_lora_rank + qk_rope_head_dim
    return n_layers * per_layer * size
