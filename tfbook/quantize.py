"""Weight quantisation: each weight stored as a small integer, one scale per block of weights.

A block of n weights shares a float scale d (and, for zero-point scaling, an offset m); each
weight is stored as an integer q of b bits. Two ways to choose them:

    absmax (symmetric)   d = max|w| / Q with Q = 2^(b-1) - 1,    q = round(w / d) in [-Q, Q],
                         w ~ d q
    zero-point (min/max) d = (max w - min w) / (2^b - 1), m = min w,
                         q = round((w - m) / d) in [0, 2^b - 1],  w ~ d q + m

Rounding to the nearest level moves a weight by at most half a step, d / 2. So the error of a
weight is bounded by its *block's* range: max|w| / (2Q) for absmax, (max w - min w) / (2(2^b - 1))
for zero-point. A block is a row of a matrix (the page model's int8, `block=None`), or n
consecutive weights of a row: llama.cpp's GGUF formats use n = 32 with float16 scales
(Q8_0: absmax, 8 bits; Q4_1: zero-point, 4 bits), which this module reproduces exactly
(`scale_dtype=torch.float16`; rounding half away from zero, as llama.cpp rounds).

Shape legend: R rows, K columns, B blocks per row, n weights per block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

SCHEMES = ("absmax", "zero_point")


@dataclass(frozen=True)
class Quantised:
    """A matrix quantised in blocks: what is stored and what it means."""

    values: Tensor  # (R, K) float32: the de-quantised weights, d q + m
    codes: Tensor  # (R, B, n) the integers q (held as float32)
    scale: Tensor  # (R, B, 1) d, as stored (rounded to scale_dtype), in float32
    offset: Tensor  # (R, B, 1) m (zeros for absmax)
    step_bound: Tensor  # (R, B, 1) d / 2 from the unrounded d: the largest rounding error
    bits_per_weight: float  # b plus the scale (and offset) bits spread over the block


def _round_half_away(x: Tensor) -> Tensor:
    """Round to the nearest integer, halves away from zero (C's roundf, as llama.cpp)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def quantise(w: Tensor, bits: int, block: int | None = None, scheme: str = "absmax",
             scale_dtype: torch.dtype = torch.float32) -> Quantised:
    """Quantise a (R, K) matrix with `bits`-bit integers, one scale per `block` consecutive
    weights of a row (None: per row), by `scheme` "absmax" or "zero_point" (see the module).

    >>> quantise(torch.tensor([[1.0, -0.5, 0.25, 0.0]]), bits=8).values
    tensor([[ 1.0000, -0.5039,  0.2520,  0.0000]])
    """
    if not isinstance(w, Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise TypeError(f"w must be a 2-D float tensor (R, K), got "
                        f"{getattr(w, 'shape', type(w).__name__)}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("w holds NaN or infinite values: no scale can cover them")
    if not isinstance(bits, int) or isinstance(bits, bool) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int from 2 to 8, got {bits!r}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if scale_dtype not in (torch.float32, torch.float16):
        raise ValueError(f"scale_dtype must be torch.float32 or torch.float16, got {scale_dtype}")
    R, K = w.shape
    n = K if block is None else block
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or K % n:
        raise ValueError(f"block must be None (a row) or an int that divides the row length "
                         f"{K}, got {block!r}")
    x = w.detach().float().reshape(R, K // n, n)  # (R, B, n)
    if scheme == "absmax":
        top = 2 ** (bits - 1) - 1
        d = x.abs().amax(dim=-1, keepdim=True) / top  # (R, B, 1)
        inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = _round_half_away(x * inverse).clamp(-top, top)  # (R, B, n)
        m = torch.zeros_like(d)
    else:
        top = 2 ** bits - 1
        low, high = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)  # (R, B, 1)
        d = (high - low) / top
        inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.trunc((x - low) * inverse + 0.5).clamp(0, top)  # round half up, as llama.cpp
        m = low
    stored_d, stored_m = d.to(scale_dtype).float(), m.to(scale_dtype).float()
    values = (stored_d * q + stored_m).reshape(R, K)  # (R, K)
    extra = torch.finfo(scale_dtype).bits * (1 if scheme == "absmax" else 2)
    return Quantised(values, q, stored_d, stored_m, d / 2, bits + extra / n)
