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

Beyond the rounded values, the GGUF formats are reproduced to the byte: `gguf_quantise` writes
the blocks llama.cpp writes (Q8_0, Q4_0, Q4_1: a float16 scale, for Q4_1 also a float16
minimum, then the 32 codes) and `gguf_dequantise` reads them back; `gguf_matmul` multiplies by
such a weight, dequantising it on the fly. `int8_per_channel` is the page model's int8 (a
float32 scale per row) and `int8_matmul` multiplies with it in integers (torch._int_mm).

Shape legend: R rows, K columns, B blocks per row, n weights per block, N blocks in all,
T rows of an input.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

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
    """Round to the nearest integer, halves away from zero (C's roundf, as llama.cpp).
    Not floor(|x| + 0.5): for |x| = 0.49999997 the sum rounds up to 1.0 in float32. With
    f = floor(|x|) the remainder |x| - f is exact, so f + floor(2 (|x| - f)) is roundf."""
    a = x.abs()
    f = torch.floor(a)
    return torch.sign(x) * (f + torch.floor(2 * (a - f)))


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
    _check_scales(f"{bits}-bit {scheme}", d, *(() if scheme == "absmax" else (m,)),
                  dtype=scale_dtype)
    stored_d, stored_m = d.to(scale_dtype).float(), m.to(scale_dtype).float()
    values = (stored_d * q + stored_m).reshape(R, K)  # (R, K)
    extra = torch.finfo(scale_dtype).bits * (1 if scheme == "absmax" else 2)
    return Quantised(values, q, stored_d, stored_m, d / 2, bits + extra / n)


# ---------------------------------------------------------------------------------------------
# llama.cpp's GGUF block formats, to the byte
# ---------------------------------------------------------------------------------------------

BLOCK = 32  # weights per block in every format below (ggml's QK8_0, QK4_0, QK4_1)
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}  # float16 scale(s) + the codes
GGUF_FORMATS = tuple(BLOCK_BYTES)
FLOAT16_MAX = 65504.0  # the largest finite float16: a larger scale would be stored as inf


def bits_per_weight(kind: str) -> float:
    """Bits a weight costs in a GGUF block format: 8 * block bytes / 32 (Q4_1: 5.0)."""
    _check_kind(kind)
    return 8 * BLOCK_BYTES[kind] / BLOCK


def _check_kind(kind: object) -> str:
    if not isinstance(kind, str) or kind not in BLOCK_BYTES:
        raise ValueError(f"kind must be one of {GGUF_FORMATS}, got {kind!r}")
    return kind


def _reciprocal(d: Tensor) -> Tensor:
    """1 / d, and 0 where d is 0 (a block of zeros: every code becomes the zero level)."""
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _as_blocks(w: Tensor, kind: str) -> Tensor:
    """Check a tensor for a GGUF format and cut it into blocks: (..., K) -> (N, 32) float32."""
    _check_kind(kind)
    if not isinstance(w, Tensor):
        raise TypeError(f"w must be a torch float tensor (..., K), got {type(w).__name__}")
    if not w.is_floating_point():
        raise TypeError(f"w must be a float tensor (float16/bfloat16/float32/float64), got "
                        f"{w.dtype}")
    if w.dim() == 0 or w.shape[-1] % BLOCK:
        raise ValueError(f"{kind} stores blocks of {BLOCK} consecutive weights of a row: the "
                         f"last dimension must be a positive multiple of {BLOCK}, got shape "
                         f"{tuple(w.shape)}")
    if w.shape[-1] == 0 or w.numel() == 0:
        raise ValueError(f"w is empty (shape {tuple(w.shape)}): nothing to quantise")
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"w holds NaN or infinite values: no {kind} scale can cover them")
    return w.detach().to("cpu", torch.float32).reshape(-1, BLOCK)  # (N, 32)


def _check_scales(kind: str, d: Tensor, *stored: Tensor,
                  dtype: torch.dtype = torch.float16) -> None:
    """Refuse blocks whose stored numbers (float16 in GGUF) would overflow to inf, or whose
    scale is so small (below float32's normal range) that its reciprocal overflows: for these
    gguf's output holds inf or is undefined, and no stored block can mean the weights."""
    for name, x in (("scale", d),) + tuple(("minimum", m) for m in stored):
        big = torch.isinf(x.to(dtype))  # float16: beyond 65,504 (and its rounding range)
        if bool(big.any()):
            i = int(big.flatten().nonzero()[0])
            largest = torch.finfo(dtype).max
            raise ValueError(f"{kind} block {i} needs a {str(dtype)[6:]} {name} of "
                             f"{float(x.flatten()[i]):.4g}, beyond {str(dtype)[6:]}'s largest "
                             f"{largest:g}: the weights are too large for this format")
    tiny = (d != 0) & torch.isinf(1 / d)
    if bool(tiny.any()):
        i = int(tiny.flatten().nonzero()[0])
        raise ValueError(f"{kind} block {i} has a scale of {float(d.flatten()[i]):.4g}, below "
                         f"float32's normal range (its reciprocal overflows): the weights "
                         f"are too small for this format; scale them up")


def _f16_bytes(x: Tensor) -> Tensor:
    """(N, 1) float32 -> (N, 2) uint8: rounded to float16 (to nearest, ties to even),
    little-endian as GGUF stores it."""
    return x.to(torch.float16).view(torch.uint8)


def _pack_nibbles(q: Tensor) -> Tensor:
    """(N, 32) codes 0..15 -> (N, 16) bytes: byte i holds code i (low 4 bits) and code
    i + 16 (high 4 bits), ggml's layout."""
    q = q.to(torch.uint8)
    return q[:, :BLOCK // 2] | (q[:, BLOCK // 2:] << 4)


def _unpack_nibbles(qs: Tensor) -> Tensor:
    """(N, 16) bytes -> (N, 32) codes 0..15, the inverse of _pack_nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def gguf_quantise(w: Tensor, kind: str) -> Tensor:
    """Quantise `w` (..., K), K a multiple of 32, to GGUF blocks: a uint8 tensor
    (..., K // 32 * BLOCK_BYTES[kind]), the bytes `gguf.quants.quantize` writes.

    Per block of 32 weights x, in float32 as llama.cpp's reference code:
      Q8_0  d = max|x| / 127,  q = roundf(x / d) in [-127, 127]
            bytes: d, then 32 int8 codes
      Q4_0  d = x[argmax|x|] / -8,  q = trunc(x / d + 8.5) in [0, 15]
            bytes: d, then 16 bytes of two 4-bit codes
      Q4_1  d = (max x - min x) / 15,  m = min x,
            q = trunc((x - m) / d + 0.5) in [0, 15]
            bytes: d, m, then 16 bytes of two 4-bit codes
    d and m are stored as float16; "/ d" is a product with the float32
    1 / d (0 if d = 0).

    The reference is gguf.quants (gguf 0.19), byte for byte, with one exception it cannot
    define: when +0 and -0 tie for Q4_1's minimum (or maximum), numpy's min picks one by
    its SIMD kernels (AVX-512, AVX2 and SSE gave three different answers), so we take
    ggml's C reference rule (quantize_row_q4_1_ref: strict comparisons in order, the first
    of the tied weights wins). Only the sign bit of a zero m (or d) can differ; the weights
    read back are equal.
    """
    x = _as_blocks(w, kind)  # (N, 32)
    if kind == "Q8_0":
        d = x.abs().amax(dim=-1, keepdim=True) / 127  # (N, 1)
        _check_scales(kind, d)
        q = _round_half_away(x * _reciprocal(d)).to(torch.int8)  # (N, 32)
        blocks = torch.cat([_f16_bytes(d), q.view(torch.uint8)], dim=-1)
    elif kind == "Q4_0":
        # the first weight of largest |x|, with its sign: (N, 1)
        signed_max = x.gather(-1, x.abs().argmax(dim=-1, keepdim=True))
        d = signed_max / -8  # that weight gets code 0, i.e. -8 d
        _check_scales(kind, d)
        q = torch.trunc(x * _reciprocal(d) + 8.5).clamp(0, 15)  # (N, 32)
        blocks = torch.cat([_f16_bytes(d), _pack_nibbles(q)], dim=-1)
    else:  # Q4_1
        # the first smallest and the first largest weight, with their signs: (N, 1)
        low = x.gather(-1, x.argmin(dim=-1, keepdim=True))
        high = x.gather(-1, x.argmax(dim=-1, keepdim=True))
        d = (high - low) / 15
        _check_scales(kind, d, low)
        q = torch.trunc((x - low) * _reciprocal(d) + 0.5).clamp(0, 15)  # (N,32)
        blocks = torch.cat([_f16_bytes(d), _f16_bytes(low), _pack_nibbles(q)],
                           dim=-1)
    K = w.shape[-1]
    return blocks.reshape(*w.shape[:-1], K // BLOCK * BLOCK_BYTES[kind])


def gguf_dequantise(blocks: Tensor, kind: str) -> Tensor:
    """GGUF blocks (..., B * BLOCK_BYTES[kind]) uint8 -> the weights (..., B * 32) float32,
    as `gguf.quants.dequantize` computes them: Q8_0 d q, Q4_0 d (q - 8), Q4_1 d q + m."""
    _check_kind(kind)
    size = BLOCK_BYTES[kind]
    if not isinstance(blocks, Tensor) or blocks.dtype != torch.uint8:
        raise TypeError(f"blocks must be a uint8 tensor of {kind} bytes, got "
                        f"{getattr(blocks, 'dtype', type(blocks).__name__)}")
    if blocks.dim() == 0 or blocks.shape[-1] == 0 or blocks.shape[-1] % size:
        raise ValueError(f"a {kind} block is {size} bytes: the last dimension must be a "
                         f"positive multiple of {size}, got shape {tuple(blocks.shape)}")
    raw = blocks.to("cpu").contiguous().reshape(-1, size)  # (N, size)
    d = raw[:, 0:2].contiguous().view(torch.float16).float()  # (N, 1)
    if kind == "Q8_0":
        values = d * raw[:, 2:].contiguous().view(torch.int8).float()
    elif kind == "Q4_0":
        values = d * (_unpack_nibbles(raw[:, 2:]).to(torch.int8) - 8).float()
    else:  # Q4_1
        m = raw[:, 2:4].contiguous().view(torch.float16).float()  # (N, 1)
        values = d * _unpack_nibbles(raw[:, 4:]).float() + m
    return values.reshape(*blocks.shape[:-1], blocks.shape[-1] // size * BLOCK)


def gguf_matmul(x: Tensor, blocks: Tensor, kind: str) -> Tensor:
    """x @ W^T for a weight W (N, K) stored as GGUF blocks (N, K // 32 * bytes), by
    dequantising W on the fly: (..., K) -> (..., N) in x's float dtype. Only the blocks stay
    in memory. NaN or inf in x reach the outputs they touch, as in x @ W^T."""
    _check_kind(kind)
    if not isinstance(blocks, Tensor) or blocks.dim() != 2:
        raise TypeError(f"blocks must be a 2-D uint8 tensor (N, K // 32 * "
                        f"{BLOCK_BYTES[kind]}), one row of the weight a row, got "
                        f"{getattr(blocks, 'shape', type(blocks).__name__)}")
    W = gguf_dequantise(blocks, kind)  # (N, K) float32; checks the bytes
    if not isinstance(x, Tensor) or x.dim() == 0 or not x.is_floating_point():
        raise TypeError(f"x must be a float tensor (..., K), got "
                        f"{getattr(x, 'dtype', type(x).__name__)} "
                        f"{tuple(getattr(x, 'shape', ()))}")
    if x.shape[-1] != W.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} features in its last dimension, the {kind} "
                         f"weight {W.shape[1]} columns: expected equal")
    return x @ W.to(x.dtype).T  # (..., K) @ (K, N) -> (..., N)


# ---------------------------------------------------------------------------------------------
# Per-channel int8 (the page model's format) and an integer matmul
# ---------------------------------------------------------------------------------------------


def int8_per_channel(w: Tensor) -> tuple[Tensor, Tensor]:
    """A matrix (R, K) as int8 codes (R, K) and one float32 scale per row (R,): the absmax
    rule with a block a row, scale_r = max_c |w_rc| / 127, q_rc = round(w_rc / scale_r) in
    [-127, 127]; a row of zeros gets scale 1 and codes 0."""
    rows = quantise(w, bits=8)  # one block a row; checks w
    scale = rows.scale[:, 0, 0]  # (R,)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return rows.codes[:, 0, :].to(torch.int8), scale  # (R, K), (R,)


def _check_int8(q: object, scale: object) -> None:
    if not isinstance(q, Tensor) or q.dtype != torch.int8 or q.dim() != 2:
        raise TypeError(f"q must be a 2-D int8 tensor (R, K), got "
                        f"{getattr(q, 'dtype', type(q).__name__)} "
                        f"{tuple(getattr(q, 'shape', ()))}")
    if (not isinstance(scale, Tensor) or not scale.is_floating_point()
            or tuple(scale.shape) != (q.shape[0],)):
        raise ValueError(f"scale must be a float tensor of shape ({q.shape[0]},), one per row "
                         f"of q, got {getattr(scale, 'dtype', type(scale).__name__)} "
                         f"{tuple(getattr(scale, 'shape', ()))}")
    if not bool(torch.isfinite(scale).all()):
        raise ValueError("scale holds NaN or infinite values: a row's weights would be "
                         "NaN or infinite")


def int8_dequantise(q: Tensor, scale: Tensor) -> Tensor:
    """int8 codes (R, K) and row scales (R,) -> float32 (R, K), q * scale rounded once."""
    _check_int8(q, scale)
    return q.float() * scale.float()[:, None]  # (R, K)


def int8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """`int8_per_channel`'s rule for an input (T, K), with few tensor operations: what
    `int8_matmul` does to x at every call (a decode step makes a hundred such calls).
    -> int8 codes (T, K), float32 scales (T,); a row of zeros gets scale 1 and codes 0.
    A row holding NaN or inf is refused (rounded, it would become codes 0 without a trace)."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise TypeError(f"x must be a 2-D float tensor (T, K), got "
                        f"{getattr(x, 'dtype', type(x).__name__)} "
                        f"{tuple(getattr(x, 'shape', ()))}")
    x = x.float()
    d = x.abs().amax(dim=-1, keepdim=True) / 127  # (T, 1); NaN or inf where x has them
    if d.numel() and not math.isfinite(float(d.max())):  # one check for every row
        t = int((~torch.isfinite(d[:, 0])).nonzero()[0])
        raise ValueError(f"x holds NaN or infinite values (row {t} of {x.shape[0]}): int8 "
                         "cannot round them")
    d = torch.where(d > 0, d, 1.0)  # a row of zeros: scale 1 (its codes are 0 anyway)
    q = _round_half_away(x * (1 / d)).clamp(-127, 127).to(torch.int8)  # (T, K)
    return q, d[:, 0]


def int8_matmul(x: Tensor, q: Tensor, scale: Tensor) -> Tensor:
    """x @ W^T with W = int8_dequantise(q, scale), in integers.

    Each row of x (T, K) is itself rounded to int8 with its own scale s_t
    (absmax); torch._int_mm sums the int8 products exactly in int32; then
    y_tn = s_t * scale_n * sum_k qx_tk q_nk (T, N). The one error beyond the
    weights' is the rounding of x (LLM.int8's idea, without its outliers).
    x with NaN or inf is refused: it has no int8 codes.
    """
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise TypeError(f"x must be a 2-D float tensor (T, K), got "
                        f"{getattr(x, 'dtype', type(x).__name__)} "
                        f"{tuple(getattr(x, 'shape', ()))}")
    _check_int8(q, scale)
    if x.shape[1] != q.shape[1]:
        raise ValueError(f"x has {x.shape[1]} columns, the weight {q.shape[1]}: "
                         "expected equal")
    qx, sx = int8_rows(x)  # (T, K) int8, (T,): int8_per_channel's rule
    acc = torch._int_mm(qx, q.T)  # (T, K) @ (K, N) -> (T, N) int32, exact
    return acc.float() * sx[:, None] * scale.float()[None, :]  # (T, N)


def int8_linear(x: Tensor, codes: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """A linear layer in int8: x (..., C) -> x W^T + b (..., O) in x's dtype, with W given as
    int8 codes (O, C) and row scales (O,) (`int8_matmul` on the rows of x)."""
    if not isinstance(x, Tensor) or x.dim() == 0 or not x.is_floating_point():
        raise TypeError(f"x must be a float tensor (..., C), got "
                        f"{getattr(x, 'dtype', type(x).__name__)} "
                        f"{tuple(getattr(x, 'shape', ()))}")
    if bias is not None:
        if not isinstance(bias, Tensor) or not bias.is_floating_point():
            raise TypeError(f"bias must be None or a float tensor (O,), got "
                            f"{getattr(bias, 'dtype', type(bias).__name__)}")
        rows = tuple(getattr(codes, "shape", (None,)))[:1]
        if tuple(bias.shape) != rows:
            raise ValueError(f"bias must have one number per row of the codes, shape {rows}, "
                             f"got {tuple(bias.shape)}")
    y = int8_matmul(x.reshape(-1, x.size(-1)), codes, scale)  # (N, O)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], -1).to(x.dtype)


class Int8Linear(nn.Module):
    """A linear layer stored as per-channel int8 (`int8_per_channel`: codes (O, C) and one
    float32 scale a row), multiplied in integers (`int8_matmul`): a product reads one byte a
    weight instead of four. Built from an `nn.Linear` (`Int8Linear(linear)`); the bias stays
    float. A model for decoding, not for training: the codes take no gradient."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if type(linear) is not nn.Linear:
            raise TypeError(f"Int8Linear is built from an nn.Linear, got {type(linear).__name__}")
        codes, scale = int8_per_channel(linear.weight.detach())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("codes", codes)  # (O, C) int8
        self.register_buffer("scale", scale)  # (O,) float32
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        """x (..., C) -> (..., O) in x's dtype."""
        if not isinstance(x, Tensor) or x.dim() == 0:
            raise TypeError(f"x must be a float tensor (..., {self.in_features}), got "
                            f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
        if x.size(-1) != self.in_features:
            raise ValueError(f"expected x (..., {self.in_features}), got {tuple(x.shape)}")
        return int8_linear(x, self.codes, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantise_linears(model: nn.Module) -> nn.Module:
    """Replace every `nn.Linear` of `model` by an `Int8Linear`, in place; returns the model.

    A tied output layer gets its own int8 copy of the embedding matrix; the embedding itself
    (a lookup of one row a token) stays float."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantise_linears needs an nn.Module, got {type(model).__name__}")
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, Int8Linear(child))
    return model


@functools.lru_cache(maxsize=2)
def _gguf_tensors(path: str) -> dict:
    """Where each tensor of a GGUF file lies, name -> GGUFTensorInfo (tfbook's checked walk
    of the file, tfbook.checkpoints.gguf.read_layout)."""
    from tfbook.checkpoints.gguf import read_layout

    return {t.name: t for t in read_layout(Path(path)).tensors}


def read_gguf_blocks(path: str | Path, names: Iterable[str]) -> dict[str, tuple[str, Tensor]]:
    """Tensors of a GGUF file as they are stored, undecoded: name -> (kind, bytes), where
    bytes is a uint8 tensor (out, in // 32 * BLOCK_BYTES[kind]) for the formats above."""
    if not isinstance(path, str | Path):
        raise TypeError(f"path must be a str or Path of a GGUF file, got {type(path).__name__}")
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise TypeError(f"names must be a list of tensor names (for one name: [name]), got "
                        f"{type(names).__name__} {names!r:.60}")
    names = list(names)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"names must be tensor names (str), got {names!r:.80}")
    if not Path(path).is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    stored = _gguf_tensors(str(Path(path).resolve()))
    missing = [name for name in names if name not in stored]
    if missing:
        raise ValueError(f"{path} has no tensors {missing}; it holds e.g. "
                         f"{sorted(stored)[:3]}")
    out = {}
    for name in names:
        t = stored[name]
        kind = t.kind.name
        if kind not in BLOCK_BYTES:
            raise ValueError(f"tensor {name!r} of {path} is {kind}, expected one of "
                             f"{GGUF_FORMATS}")
        with open(path, "rb") as f:  # its bytes: one row of blocks per output
            f.seek(t.offset)
            raw = bytearray(f.read(t.n_bytes))
        out[name] = (kind, torch.frombuffer(raw, dtype=torch.uint8).view(math.prod(t.dims[1:]),
                                                                          -1))
    return out


# ---------------------------------------------------------------------------------------------
# Comparing formats on a model
# ---------------------------------------------------------------------------------------------

# The formats compared on a whole model, in the order of their cost in bits.
FORMATS = ("Q8_0", "int8 per channel", "Q4_1", "Q4_0")


def round_trip(w: Tensor, fmt: str) -> Tensor:
    """The weights a matrix (R, K) holds after storing it in `fmt` (one of FORMATS) and
    reading it back: float32 (R, K)."""
    if not isinstance(w, Tensor) or w.dim() != 2:
        raise TypeError(f"w must be a 2-D float tensor (R, K), got "
                        f"{getattr(w, 'shape', type(w).__name__)}")
    if fmt == "int8 per channel":
        return int8_dequantise(*int8_per_channel(w))
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    return gguf_dequantise(gguf_quantise(w, fmt), fmt)


def stored_bytes(shape: tuple[int, ...], fmt: str) -> int:
    """Bytes a tensor of `shape` takes in `fmt` (FORMATS, or "float32"); a vector (norm
    gains) always stays float32."""
    if (not isinstance(shape, tuple) or not shape
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape)):
        raise TypeError(f"shape must be a non-empty tuple of ints, got {shape!r}")
    if min(shape) < 0:
        raise ValueError(f"sizes cannot be negative, got shape {shape}")
    if fmt != "float32" and fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS} or 'float32', got {fmt!r}")
    if fmt in GGUF_FORMATS and len(shape) > 1 and shape[-1] % BLOCK:
        raise ValueError(f"{fmt} stores rows in blocks of {BLOCK}: the last size must be a "
                         f"multiple of {BLOCK}, got shape {shape}")
    n = math.prod(shape)
    if fmt == "float32" or len(shape) == 1:
        return 4 * n
    if fmt == "int8 per channel":
        return n + 4 * math.prod(shape[:-1])  # a code a weight, a float32 scale a row
    return n // BLOCK * BLOCK_BYTES[fmt]


def relative_error(w: Tensor, w_hat: Tensor) -> float:
    """||w_hat - w|| / ||w|| (Frobenius norms, summed in float64)."""
    for name, t in (("w", w), ("w_hat", w_hat)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a float tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    if w.shape != w_hat.shape:
        raise ValueError(f"w and w_hat must have one shape, got {tuple(w.shape)} and "
                         f"{tuple(w_hat.shape)}")
    if not (bool(torch.isfinite(w).all()) and bool(torch.isfinite(w_hat).all())):
        raise ValueError("w or w_hat holds NaN or infinite values: no relative error")
    if not bool(w.ne(0).any()):
        raise ValueError("w is all zeros (or empty): an error relative to ||w|| = 0 has no "
                         "meaning")
    w, w_hat = w.double(), w_hat.double()
    return float(torch.linalg.vector_norm(w_hat - w) / torch.linalg.vector_norm(w))


def rounding_bound(w: Tensor, kind: str) -> Tensor:
    """How far each weight of `w` (..., K) may move in a GGUF format: (N, 32).

    Half a step, d / 2, for the nearest level; plus the float16 rounding of d
    (at most 2^-11 |d|, or 2^-25 among float16's subnormals) times the largest
    code, and of m for Q4_1; plus float32's rounding of the arithmetic. Q4_0's
    codes stop at 7 d while its step is set by -8 d: a weight beyond 7.5 d is
    clipped to 7 d and may move by a whole step.
    """
    x = _as_blocks(w, kind)  # (N, 32)
    raw = gguf_quantise(w, kind).reshape(x.shape[0], BLOCK_BYTES[kind])
    signed_d = raw[:, 0:2].contiguous().view(torch.float16).float()  # (N, 1)
    d = signed_d.abs()
    top = {"Q8_0": 127, "Q4_0": 8, "Q4_1": 15}[kind]  # the largest |code|
    f16 = 2.0**-25  # half the spacing of float16's subnormals
    slack = top * (d * 2.0**-11 + f16)  # (N, 1): the rounding of d
    slack = slack + 1e-6 * x.abs().amax(dim=-1, keepdim=True)  # float32's
    if kind == "Q4_1":
        m = raw[:, 2:4].contiguous().view(torch.float16).float()  # (N, 1)
        slack = slack + m.abs() * 2.0**-11 + f16  # the rounding of m
    step = (d / 2).expand_as(x)  # (N, 32)
    if kind == "Q4_0":  # the clipped ones may move by a whole step
        step = torch.where(x / signed_d > 7.5, d.expand_as(x), step)
    return step + slack
