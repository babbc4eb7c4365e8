"""Rotary position embedding (RoPE, Su et al. 2021): rotate 2-D planes of q and k.

Plane n of a D-wide head vector is rotated by the angle pos * theta_n with
theta_n = base^(-2n / D), n = 0 .. D/2 - 1. Because R(a)^T R(b) = R(b - a), the dot product
of a query rotated for position i and a key rotated for position j depends only on j - i.

Two conventions pair the features into planes differently:

- "interleaved" (the paper, GPT-J, and Meta's LLaMA code, which multiplies adjacent pairs as
  complex numbers; llama.cpp's GGUF files keep it): planes are (x0, x1), (x2, x3), ...
- "half" (GPT-NeoX, and the Hugging Face port of LLaMA, which permutes the rows of W_Q and
  W_K so that the half split rotates the same planes): (x0, x_{D/2}), (x1, x_{D/2+1}), ...

They are the same operation up to a fixed permutation of the features: `to_half_split`
moves even features to the front half and odd ones to the back half.

A model rotates every layer's q and k by the same positions, so it builds the cos/sin table
once per forward pass (`rope_cos_sin`) and hands it to every block, as Hugging Face, litgpt
and nanochat do; nothing is remembered between calls.
"""

import torch
from torch import Tensor

CONVENTIONS = ("interleaved", "half")
PRECISIONS = ("float64", "float32")  # how the angles pos * theta_n are computed


def rope_frequencies(D: int, base: float = 10000.0, precision: str = "float64") -> Tensor:
    """theta_n = base^(-2n / D) for the D/2 planes, fastest first: (D/2,).

    precision="float32" computes 1 / base^(2n / D) in float32 exactly as Hugging Face's Llama
    does, so that a model can reproduce its outputs bit for bit; "float64" is more exact.
    """
    if D % 2 != 0:
        raise ValueError(f"RoPE needs an even head size D, got D={D}")
    base = float(base)
    if precision == "float32":
        return 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))  # (D/2,)
    if precision != "float64":
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)


def rope_angles(
    positions: Tensor, D: int, base: float = 10000.0, precision: str = "float64",
    theta: Tensor | None = None,
) -> Tensor:
    """pos * theta_n for every position and plane: positions (T,) -> (T, D/2).

    In float32 an angle near position 8000 is only known to about 5e-4 radians (the spacing
    of float32 numbers there); float64 keeps it to about 1e-12. `theta` (D/2,), computed in
    the precision's dtype, replaces the plain frequencies (a RoPE scaling, tfbook.rope_scaling).
    """
    dtype = torch.float32 if precision == "float32" else torch.float64
    if theta is None:
        theta = rope_frequencies(D, base, precision)  # (D/2,)
    return positions.to(dtype)[:, None] * theta.to(positions.device, dtype)  # (T, D/2)


def check_rope_positions(x: Tensor, positions: Tensor | None) -> Tensor:
    """positions (T,) or, for x (B, H, T, D), (B, T); None means 0 .. T-1."""
    T = x.size(-2)
    if positions is None:
        return torch.arange(T, device=x.device)
    per_row = positions.dim() == 2 and x.dim() == 4 and positions.shape == (x.size(0), T)
    if positions.shape != (T,) and not per_row:
        per_row_shape = f" or (B, T) = ({x.size(0)}, {T})" if x.dim() == 4 else ""
        raise ValueError(
            f"positions must have shape (T,) = ({T},){per_row_shape}, got "
            f"{tuple(positions.shape)} for x of shape {tuple(x.shape)}"
        )
    return positions


def rope_cos_sin(
    positions: Tensor, D: int, base: float = 10000.0, precision: str = "float64",
    dtype: torch.dtype = torch.float32, *, theta: Tensor | None = None, scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """cos and sin of pos * theta_n: (T, D/2) each, or (B, 1, T, D/2) for (B, T) positions.

    Used for both q and k, in every layer: a model computes it once per forward pass and
    passes it down (`MultiHeadAttention.forward(..., rope_table=...)`). A RoPE scaling
    (`tfbook.rope_scaling.scaled_rope_cos_sin`) passes its own frequencies `theta` and YaRN's
    attention factor `scale`, which multiplies cos and sin in the precision's dtype.
    """
    angles = rope_angles(positions.reshape(-1), D, base, precision, theta)
    angles = angles.view(*positions.shape, D // 2)  # (T, D/2) or (B, T, D/2)
    if positions.dim() == 2:
        angles = angles[:, None]  # (B, 1, T, D/2): the same angles for every head
    cos, sin = torch.cos(angles), torch.sin(angles)
    if scale != 1.0:  # q.k of two rotated vectors grows by scale^2
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def check_rope_table(table: object, x: Tensor) -> tuple[Tensor, Tensor]:
    """A (cos, sin) pair for x (B, H, T, D): each (T, D/2) or (B, 1, T, D/2), in x's dtype."""
    T, D = x.shape[-2:]
    shapes = ((T, D // 2), (x.size(0), 1, T, D // 2))
    if (not isinstance(table, tuple | list) or len(table) != 2
            or not all(isinstance(t, Tensor) and tuple(t.shape) in shapes for t in table)):
        given = (tuple(tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                       for t in table) if isinstance(table, tuple | list)
                 else type(table).__name__)
        raise ValueError(
            f"rope_table must be (cos, sin), each of shape (T, D/2) = {shapes[0]} or "
            f"(B, 1, T, D/2) = {shapes[1]} (rope_cos_sin builds it), got {given}"
        )
    cos, sin = table
    if cos.dtype != x.dtype:  # under autocast q is in half precision, the table is not
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return cos, sin


def rotate_planes(x: Tensor, cos: Tensor, sin: Tensor, convention: str = "interleaved") -> Tensor:
    """Rotate each plane (a, b) of x (..., T, D): [a'; b'] = [[cos, -sin], [sin, cos]] [a; b]."""
    D = x.size(-1)
    if convention == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each: first and second coordinate
    else:
        a, b = x[..., : D // 2], x[..., D // 2 :]  # (..., T, D/2) each
    # a counter-clockwise rotation of every plane by its own angle
    a_rot = a * cos - b * sin
    b_rot = a * sin + b * cos
    if convention == "interleaved":
        return torch.stack((a_rot, b_rot), dim=-1).flatten(-2)  # (..., T, D/2, 2) -> (..., T, D)
    return torch.cat((a_rot, b_rot), dim=-1)  # (..., T, D)


def apply_rope(
    x: Tensor,
    positions: Tensor | None = None,
    base: float = 10000.0,
    convention: str = "interleaved",
    precision: str = "float64",
) -> Tensor:
    """Rotate each plane of x (..., T, D) by pos * theta_n; positions default to 0 .. T-1.

    positions is (T,), the same for every sequence, or (B, T) for x of shape (B, H, T, D)
    when the sequences of a batch start at different places (left padding, a cache).
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    positions = check_rope_positions(x, positions)
    cos, sin = rope_cos_sin(positions, x.size(-1), base, precision, x.dtype)
    return rotate_planes(x, cos, sin, convention)


def half_split_permutation(D: int) -> Tensor:
    """Feature order that turns interleaved planes into half-split ones: [0, 2, .., 1, 3, ..].

    half_split_permutation(6) == [0, 2, 4, 1, 3, 5]
    """
    return torch.cat((torch.arange(0, D, 2), torch.arange(1, D, 2)))  # (D,)


def to_half_split(x: Tensor) -> Tensor:
    """Permute features (..., D) from the interleaved layout to the half-split layout."""
    return x[..., half_split_permutation(x.size(-1)).to(x.device)]


def to_interleaved(x: Tensor) -> Tensor:
    """Inverse of `to_half_split`: (..., D) half-split layout -> interleaved layout."""
    inverse = torch.argsort(half_split_permutation(x.size(-1)))  # (D,)
    return x[..., inverse.to(x.device)]


def relative_scores(
    q: Tensor, k: Tensor, offsets: Tensor, base: float = 10000.0,
    convention: str = "interleaved",
) -> Tensor:
    """q . k after RoPE with the key `offset` positions after the query: (D,), (D,) -> (N,).

    Since the score depends only on the offset, the query can sit at position 0 (where it
    is not rotated) and the key at position `offset`. (The RoPE paper's long-term decay,
    section 3.4.3, is a bound on such scores over all q and k, not one of these curves.)
    """
    keys = k.expand(offsets.numel(), -1)  # (N, D): the same key at N positions
    return apply_rope(keys, offsets, base, convention) @ q  # (N, D) @ (D,) -> (N,)


SCALINGS = ("interpolation", "ntk")


def scaled_rope_frequencies(
    D: int, factor: float, method: str, base: float = 10000.0
) -> Tensor:
    """theta_n of a context stretched `factor` times: (D/2,), float64, fastest first.

    "interpolation" (Chen et al. 2023) divides every frequency by the factor, i.e. squeezes
    positions 0 .. factor*L back into 0 .. L. "ntk" (NTK-aware scaling, bloc97 2023) raises
    the base to base * factor^(D / (D - 2)): the first plane is unchanged and the slowest one
    is slowed by exactly the factor, the planes between by less.
    """
    if method not in SCALINGS:
        raise ValueError(f"method must be one of {SCALINGS}, got {method!r}")
    if not factor >= 1.0:
        raise ValueError(f"a context extension needs factor >= 1, got factor={factor}")
    if method == "interpolation":
        return rope_frequencies(D, base) / factor
    if D < 4:
        raise ValueError(f"NTK-aware scaling needs D >= 4 (two planes), got D={D}")
    return rope_frequencies(D, base * factor ** (D / (D - 2)))
