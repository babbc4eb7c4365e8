"""Attention masks: which key positions each query position may look at.

Convention used everywhere in tfbook: a mask is a boolean tensor and **True means "may
attend"**. It broadcasts against the attention scores of shape (B, H, T, S): T query
positions, S key positions. (This is the convention of `F.scaled_dot_product_attention`;
`nn.MultiheadAttention`'s `key_padding_mask` uses the opposite one, True = ignore.)

    causal_mask(3)                      padding_mask(torch.tensor([2]), S=3)
    [[ True, False, False],             [[[[ True,  True, False]]]]   # (1, 1, 1, 3)
     [ True,  True, False],
     [ True,  True,  True]]
"""

import torch
from torch import Tensor


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular (T, S) mask: query i may see keys j <= i (Vaswani et al., 3.2.3).

    With S > T the T queries are taken to be the *last* T positions of the S keys, which is
    what a decoder needs once earlier keys are cached.
    """
    S = T if S is None else S
    if T < 1 or S < T:
        raise ValueError(f"causal_mask expects 1 <= T <= S, got T={T}, S={S}")
    ones = torch.ones(T, S, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=S - T)  # (T, S)


def padding_mask(valid: Tensor, S: int | None = None) -> Tensor:
    """(B, 1, 1, S) mask hiding padded key positions, so that no query attends to padding.

    `valid` is either the lengths of the B sequences, shape (B,), or a (B, S) tensor that is
    True / 1 at real tokens and False / 0 at padding (the `attention_mask` of Hugging Face).
    """
    if not isinstance(valid, Tensor):
        raise TypeError(f"padding_mask expects a tensor, got {type(valid).__name__}")
    if valid.dim() == 1:
        if valid.dtype.is_floating_point or valid.dtype == torch.bool:
            raise TypeError(f"lengths must be an integer tensor, got dtype {valid.dtype}")
        if valid.numel() == 0:
            raise ValueError("padding_mask expects at least one length, got an empty tensor")
        S = int(valid.max()) if S is None else S
        low, high = int(valid.min()), int(valid.max())
        if low < 0 or high > S:
            raise ValueError(f"lengths must lie in [0, S={S}], got values in [{low}, {high}]")
        keep = torch.arange(S, device=valid.device) < valid[:, None]  # (B, S)
    elif valid.dim() == 2:
        if S is not None and valid.size(1) != S:
            raise ValueError(f"padding mask expects (B, S={S}), got shape {tuple(valid.shape)}")
        if valid.dtype != torch.bool and not bool(((valid == 0) | (valid == 1)).all()):
            raise ValueError("a (B, S) padding mask must hold only 0/1 or False/True, got "
                             f"values {sorted(set(valid.flatten().tolist()))[:5]}")
        keep = valid.bool()  # (B, S)
    else:
        raise ValueError(
            f"padding_mask expects lengths (B,) or a (B, S) mask, got shape {tuple(valid.shape)}"
        )
    return keep[:, None, None, :]  # (B, 1, 1, S): the same for every head and every query


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of broadcastable masks, skipping None: a key is visible if all allow it."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        out = out & m  # broadcasting, e.g. (T, S) & (B, 1, 1, S) -> (B, 1, T, S)
    return out


def check_mask(mask: Tensor, T: int, S: int) -> None:
    """Raise a clear error unless `mask` is boolean and broadcasts to (..., T, S)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}"
        )
    if mask.dim() < 2 or mask.size(-2) not in (1, T) or mask.size(-1) not in (1, S):
        raise ValueError(
            f"mask must broadcast to (..., T={T}, S={S}), got shape {tuple(mask.shape)}"
        )
