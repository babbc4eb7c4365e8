"""Sliding-window attention (Mistral): each query sees only the last `window` positions.

Convention (the one of Hugging Face transformers 5.23, `masking_utils.sliding_window_overlay`
AND `causal_mask_function`): a query at position p may attend to a key at position j when

    0 <= p - j < window            (causal, and at most window - 1 positions back)

so `window` counts the keys a query sees *including itself*: with window = 3, position 4 sees
positions 2, 3 and 4.

    sliding_window_mask(5, 5, window=3)
    [[ True, False, False, False, False],
     [ True,  True, False, False, False],
     [ True,  True,  True, False, False],
     [False,  True,  True,  True, False],
     [False, False,  True,  True,  True]]

Since no query ever looks further back than window - 1 positions, a decoder need not keep
older keys and values: `SlidingWindowKVCache` keeps, per layer, only the last window - 1
positions between steps (the next query is itself the window-th position it sees), as HF's
`DynamicSlidingWindowLayer` does. Its memory stops growing at the window, whatever the length
of the text. Masks are boolean, True = may attend (see `tfbook.masks`).

Shape legend: B batch, H_kv key/value heads, T new positions, S keys returned, D head size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tfbook.cache import KVCache, LayerCache
from tfbook.config import is_int


def check_window(window: object, owner: str = "sliding window") -> int:
    """Return `window` as an int, or raise: it must be a positive integer (not a bool)."""
    if not is_int(window):
        raise TypeError(f"{owner}: the window is a number of positions, a positive integer, "
                        f"got {window!r} of type {type(window).__name__}")
    if window < 1:
        raise ValueError(f"{owner}: the window counts the positions a query sees (itself "
                         f"included), so it must be at least 1, got {window}")
    return int(window)


def sliding_window_mask(
    T_q: int, T_k: int, window: int, offset: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """(T_q, T_k) mask: query i (at position offset + i) may see key j (at position j) when
    0 <= offset + i - j < window: causal, and within the last `window` positions.

    `offset` is the position of the first query counted from the first key; by default the
    T_q queries are the last T_q of the T_k keys (offset = T_k - T_q), as in `causal_mask`
    and as after `SlidingWindowLayerCache.update`. With window >= offset + T_q the mask is
    the causal mask.
    """
    window = check_window(window, "sliding_window_mask")
    for name, value in (("T_q", T_q), ("T_k", T_k)):
        if not is_int(value) or value < 1:
            raise ValueError(f"sliding_window_mask needs {name} >= 1 (an integer), got {value!r}")
    offset = T_k - T_q if offset is None else offset
    if not is_int(offset) or offset < 0:
        raise ValueError("sliding_window_mask needs an integer offset >= 0 (the position of "
                         f"the first query counted from the first key), got {offset!r}")
    last_query = offset + T_q - 1
    if last_query - (T_k - 1) >= window:
        raise ValueError(
            f"with offset={offset}, the last query (position {last_query}) is {window} or "
            f"more positions after the last key ({T_k - 1}): it would see no key at all "
            f"through a window of {window}"
        )
    q_pos = torch.arange(offset, offset + T_q, device=device)[:, None]  # (T_q, 1)
    k_pos = torch.arange(T_k, device=device)[None, :]  # (1, T_k)
    back = q_pos - k_pos  # (T_q, T_k): how far back each key lies from each query
    return (back >= 0) & (back < window)


class SlidingWindowLayerCache(LayerCache):
    """Keys and values of one layer, only the last `window - 1` positions kept between steps.

    `update(k, v)` returns the kept keys and values followed by the new ones (what the new
    queries may need: S = kept + T) and then forgets all but the last window - 1. The mask for
    those queries is `mask(T)`; `key_positions` are the absolute positions of the returned
    keys. `length` counts every position processed (RoPE needs it), not the ones kept.
    """

    def __init__(self, window: int) -> None:
        window = check_window(window, "SlidingWindowLayerCache")
        super().__init__(max_len=window)
        self.window = window
        self.start = 0  # absolute position of the first kept key
        self.returned = 0  # keys returned by the last update (kept + new)

    @property
    def stored(self) -> int:
        """Positions held now (at most window - 1)."""
        return 0 if self.keys is None else self.keys.size(-2)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add k, v (B, H_kv, T, D) -> kept + new keys and values (B, H_kv, S, D)."""
        B, H_kv, T, D = k.size()
        if self.keys is None:
            keys, values = k, v
        else:
            if self.keys.shape[:2] != (B, H_kv) or self.keys.size(-1) != D:
                raise ValueError(
                    f"this cache holds batch {self.keys.size(0)} with {self.keys.size(1)} "
                    f"key/value heads of size {self.keys.size(-1)}, got keys of shape "
                    f"{tuple(k.shape)}: start a new cache for another batch or model"
                )
            keys = torch.cat([self.keys, k], dim=-2)  # (B, H_kv, S, D)
            values = torch.cat([self.values, v], dim=-2)
        S = keys.size(-2)
        self.returned = S
        self.length += T
        keep = min(self.window - 1, S)
        # clone: the kept slice must not hold on to the whole (possibly long) prefill
        self.keys = keys[:, :, S - keep :].clone()
        self.values = values[:, :, S - keep :].clone()
        self.start = self.length - keep
        return keys, values

    @property
    def key_positions(self) -> Tensor:
        """Absolute positions of the keys the last `update` returned, shape (S,)."""
        return torch.arange(self.length - self.returned, self.length)

    def mask(self, T: int, device: torch.device | str | None = None) -> Tensor:
        """(T, S) sliding-window mask of the T queries just added against the returned keys."""
        if not is_int(T) or not 1 <= T <= self.returned:
            raise ValueError(f"mask needs the T of the last update, 1 <= T <= {self.returned} "
                             f"(the keys it returned), got {T!r}")
        return sliding_window_mask(T, self.returned, self.window, device=device)

    def next_mask(self, T: int, device: torch.device | str | None = None) -> Tensor:
        """(T, stored + T) mask for T queries about to be added, against the keys `update`
        will return: what an attention module needs before it calls `update`."""
        if not is_int(T) or T < 1:
            raise ValueError(f"next_mask needs the number of new positions T >= 1, got {T!r}")
        return sliding_window_mask(T, self.stored + T, self.window, device=device)

    def crop(self, length: int) -> None:
        """Forget the positions from `length` on; only kept positions can be returned to."""
        if not is_int(length) or not self.start <= length <= self.length:
            raise ValueError(f"crop needs a length in [{self.start}, {self.length}]: a sliding "
                             f"window cache keeps only positions {self.start} onwards, got "
                             f"{length!r}")
        if self.keys is not None:
            self.keys = self.keys[:, :, : length - self.start]
            self.values = self.values[:, :, : length - self.start]
        self.length = int(length)


class SlidingWindowKVCache(KVCache):
    """A `KVCache` whose layers keep only the last window - 1 positions each."""

    def __init__(self, n_layers: int, window: int) -> None:
        window = check_window(window, "SlidingWindowKVCache")
        super().__init__(n_layers, max_len=window)
        self.window = window
        self.layers = [SlidingWindowLayerCache(window) for _ in range(n_layers)]

    @torch.no_grad()
    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (B',) of every stored tensor (beam search)."""
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
            if layer.cross is not None:
                layer.cross = tuple(t.index_select(0, index) for t in layer.cross)

    def memory_bytes(self) -> int:
        """Bytes of the keys and values held now."""
        return sum(2 * layer.keys.numel() * layer.keys.element_size()
                   for layer in self.layers if layer.keys is not None)
