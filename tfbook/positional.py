"""Positional encodings: telling the model where each token is (Vaswani et al., 3.5).

Without them attention is permutation-equivariant: shuffle the tokens and the outputs are
shuffled the same way, so word order would be invisible.

    PE[pos, 2i]   = sin(pos / base^(2i / C))
    PE[pos, 2i+1] = cos(pos / base^(2i / C))

Shape legend: B batch, T sequence, C model width.
"""

import math

import torch
from torch import Tensor, nn


def sinusoidal_encoding(T: int, C: int, base: float = 10000.0) -> Tensor:
    """The (T, C) table of sines and cosines of Vaswani et al., section 3.5.

    sinusoidal_encoding(2, 4)[1] == [sin 1, cos 1, sin 0.01, cos 0.01]
    """
    if C % 2 != 0:
        raise ValueError(f"sinusoidal encoding needs an even width C, got C={C}")
    pos = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    inv_freq = base ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)  # (C/2,)
    angles = pos * inv_freq  # (T, C/2): position times frequency
    pe = torch.empty(T, C, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)  # even features
    pe[:, 1::2] = torch.cos(angles)  # odd features
    return pe.float()  # computed in float64 so long positions keep their precision


def check_length(T: int, max_len: int) -> None:
    """Raise a clear error if a sequence of length T does not fit a context of max_len."""
    if T > max_len:
        raise ValueError(
            f"sequence length {T} exceeds the model's context length {max_len}"
        )


def check_positions(positions: Tensor | None, x: Tensor, max_len: int) -> Tensor:
    """The index of every position of x (B, T, C): (T,) or (B, T) integers in [0, max_len).

    None means 0 .. T-1. While generating with a cache, the model passes the true positions
    (a step at position 517 gets position 517, not 0).
    """
    B, T, C = x.size()
    if positions is None:
        check_length(T, max_len)
        return torch.arange(T, device=x.device)  # (T,)
    if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or (
        positions.dtype == torch.bool
    ):
        raise TypeError(f"positions must be an integer tensor, got {positions!r:.80}")
    if positions.shape not in ((T,), (B, T)):
        raise ValueError(
            f"positions must have shape (T,) = ({T},) or (B, T) = ({B}, {T}), "
            f"got {tuple(positions.shape)}"
        )
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= max_len):
        raise ValueError(
            f"positions must lie in [0, {max_len}) for a context length of {max_len}, got "
            f"values in [{int(positions.min())}, {int(positions.max())}]"
        )
    return positions


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to x (Vaswani et al., 3.5); no parameters."""

    def __init__(self, max_len: int, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        self.max_len = max_len
        # a buffer moves with .to(device) but is not trained and not saved in state_dict
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x (B, T, C) -> x + PE[positions] (B, T, C); positions (T,) or (B, T), default 0..T-1."""
        positions = check_positions(positions, x, self.max_len)
        return x + self.pe[positions]  # (T, C) or (B, T, C), broadcast over the batch


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position, added to x (GPT, BERT)."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(max_len, d_model).mul_(0.02))  # (max_len, C)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x (B, T, C) -> x + P[positions] (B, T, C); positions (T,) or (B, T), default 0..T-1."""
        positions = check_positions(positions, x, self.max_len)
        return x + self.weight[positions]  # (T, C) or (B, T, C), broadcast over the batch


def alibi_slopes(H: int) -> Tensor:
    """ALiBi's per-head slopes m_h (Press et al. 2022, section 3): (H,), float64.

    For H a power of two the slopes are the geometric sequence 2^(-8/H), 2^(-16/H), ...,
    2^(-8); otherwise the H' = 2^floor(log2 H) slopes of H' heads are followed by every
    other slope of 2H' heads, as in the authors' code. alibi_slopes(4) == [1/4, 1/16, 1/64, 1/256]
    """
    if isinstance(H, bool) or not isinstance(H, int):
        raise TypeError(f"H must be an int number of heads, got {type(H).__name__}")
    if H < 1:
        raise ValueError(f"ALiBi needs at least one head, got H={H}")

    def power_of_two(n: int) -> Tensor:
        return 2.0 ** (-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)  # (n,)

    H_low = 2 ** (H.bit_length() - 1)  # the largest power of two <= H
    extra = power_of_two(2 * H_low)[0::2][: H - H_low]  # every other slope of 2H' heads
    return torch.cat((power_of_two(H_low), extra))  # (H,)


def t5_relative_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucket of every offset j - i (Raffel et al. 2020): ints in [0, num_buckets).

    Half the buckets of a direction hold one offset each (0, 1, 2, ...); the other half cover
    larger offsets with logarithmically wider bins, up to max_distance, beyond which every
    offset shares the last bucket. Bidirectional: keys after the query get their own half.
    """
    if relative_position.dtype.is_floating_point or relative_position.dtype == torch.bool:
        raise TypeError(
            f"relative_position must be an integer tensor, got dtype {relative_position.dtype}"
        )
    if num_buckets < 4 or max_distance <= num_buckets // (4 if bidirectional else 2):
        raise ValueError(
            "need num_buckets >= 4 and max_distance above the exact range, got "
            f"num_buckets={num_buckets}, max_distance={max_distance}"
        )
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).long() * num_buckets  # keys after the query
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # only keys at or before the query
    exact = num_buckets // 2  # offsets 0 .. exact-1 get a bucket each
    log_ratio = torch.log(distance.double().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = (exact + log_ratio * (num_buckets - exact)).long().clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)
