"""The key/value cache: what a decoder keeps between generation steps.

Generating token t + 1 needs the keys and values of every earlier position, in every layer.
They do not change once computed (a causal model never lets a position see later ones), so
instead of re-running the whole prefix at each step the model stores them and computes only
the new position:

    step 0 (prefill)   ids (B, T0)  -> keys/values for positions 0 .. T0-1 stored
    step s             ids (B, 1)   -> one new key/value appended per layer; the query of the
                                       new position attends to all T0 + s stored ones

One `KVCache` serves every model in tfbook. Each layer holds its own `LayerCache`; the
attention module calls `update` with the new keys and values (the key/value heads *before*
they are repeated for grouped-query attention, which is where the memory saving comes from)
and reads back all of them. Cross-attention stores the source's keys and values once, since
the source does not change while the target grows. Speculative decoding stores keys and values
for guesses that may be rejected, then `crop`s the cache back to the kept positions; a draft
made of the model's first blocks reads and writes `first_layers(k)`, the same storage.

    memory = 2 (K and V) x layers x kv-heads x D x positions x bytes per number

Shape legend: B batch, H_kv key/value heads, S stored positions, D head size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tfbook.config import is_int


class LayerCache:
    """Keys and values of one layer, preallocated for `max_len` positions on first use."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.length = 0  # positions stored so far
        self.keys: Tensor | None = None  # (B, H_kv, max_len, D), filled up to `length`
        self.values: Tensor | None = None  # (B, H_kv, max_len, D)
        self.cross: tuple[Tensor, Tensor] | None = None  # cross-attention (B, H_kv, S, D) x2

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append k, v (B, H_kv, T, D) -> all keys and values so far (B, H_kv, length, D)."""
        B, H_kv, T, D = k.size()
        if self.keys is None:
            shape = (B, H_kv, self.max_len, D)
            self.keys = k.new_zeros(shape)
            self.values = v.new_zeros(shape)
        elif self.keys.shape[:2] != (B, H_kv) or self.keys.size(-1) != D:
            raise ValueError(
                f"this cache holds batch {self.keys.size(0)} with {self.keys.size(1)} key/value "
                f"heads of size {self.keys.size(-1)}, got keys of shape {tuple(k.shape)}: "
                "start a new KVCache for another batch or model"
            )
        end = self.length + T
        if end > self.max_len:
            raise ValueError(
                f"the cache holds at most {self.max_len} positions: {self.length} stored, "
                f"{T} more given"
            )
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]  # (B, H_kv, S, D) views

    def crop(self, length: int) -> None:
        """Forget every position from `length` on (speculative decoding's rollback).

        Nothing is copied or freed: the stored length goes back, and the next `update`
        writes over the dropped positions.
        """
        if not is_int(length) or not 0 <= length <= self.length:
            raise ValueError(f"crop needs a length in [0, {self.length}] (the positions "
                             f"stored), got {length!r}")
        self.length = int(length)


class KVCache:
    """One `LayerCache` per layer; `length` is the number of positions already processed."""

    def __init__(self, n_layers: int, max_len: int) -> None:
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"KVCache needs n_layers >= 1, got {n_layers!r}")
        if not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"KVCache needs max_len >= 1, got {max_len!r}")
        self.max_len = max_len
        self.layers = [LayerCache(max_len) for _ in range(n_layers)]

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerCache:
        return self.layers[layer]

    @property
    def length(self) -> int:
        """Positions stored (the same in every layer once a forward pass has finished)."""
        return self.layers[0].length

    @property
    def batch_size(self) -> int | None:
        """B of the stored tensors, or None before the first forward pass."""
        first = self.layers[0]
        if first.keys is not None:
            return first.keys.size(0)
        return None if first.cross is None else first.cross[0].size(0)

    def positions(self, T: int, device: torch.device | str | None = None) -> Tensor:
        """The positions of T new tokens: length .. length + T - 1, shape (T,)."""
        return torch.arange(self.length, self.length + T, device=device)

    def check_batch(self, B: int) -> None:
        """Raise a clear error if a batch of B rows would not match what is stored."""
        stored = self.batch_size
        if stored is not None and stored != B:
            raise ValueError(
                f"this cache holds a batch of {stored} sequences, got a batch of {B}: "
                "start a new KVCache for another batch"
            )

    @torch.no_grad()
    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (B',) of every stored tensor: beam search follows its beams.

        Only the filled positions are copied (in place when the batch keeps its size).
        """
        for layer in self.layers:
            if layer.keys is not None:
                n = layer.length
                if index.numel() == layer.keys.size(0):
                    layer.keys[:, :, :n] = layer.keys[:, :, :n].index_select(0, index)
                    layer.values[:, :, :n] = layer.values[:, :, :n].index_select(0, index)
                else:
                    layer.keys = layer.keys.index_select(0, index)
                    layer.values = layer.values.index_select(0, index)
            if layer.cross is not None:
                layer.cross = tuple(t.index_select(0, index) for t in layer.cross)

    def crop(self, length: int) -> None:
        """Keep the first `length` positions of every layer: the rejected drafts are forgotten.

        Layers may hold different lengths beforehand (a draft that shares the first layers
        has written further); afterwards every layer holds `length` positions.
        """
        shortest = min(layer.length for layer in self.layers)
        if not is_int(length) or not 0 <= length <= shortest:
            raise ValueError(f"crop needs a length in [0, {shortest}] (the positions stored "
                             f"in every layer), got {length!r}")
        for layer in self.layers:
            layer.crop(length)

    def first_layers(self, n_layers: int) -> KVCache:
        """A cache of the first `n_layers` layers that SHARES their storage with this one.

        What a draft made of a model's first blocks reads and writes (self-speculation):
        positions the full model has cached are already there for the draft.
        """
        if not is_int(n_layers) or not 1 <= n_layers <= len(self.layers):
            raise ValueError(f"first_layers needs n_layers in [1, {len(self.layers)}], got "
                             f"{n_layers!r}")
        view = KVCache(int(n_layers), self.max_len)
        view.layers = self.layers[: int(n_layers)]  # the same LayerCache objects
        return view

    def memory_bytes(self) -> int:
        """Bytes of the keys and values stored so far (self- and cross-attention)."""
        total = 0
        for layer in self.layers:
            if layer.keys is not None:
                B, H_kv, _, D = layer.keys.size()
                total += 2 * B * H_kv * layer.length * D * layer.keys.element_size()
            if layer.cross is not None:
                total += sum(t.numel() * t.element_size() for t in layer.cross)
        return total


def cache_bytes(
    n_layers: int, n_kv_heads: int, head_size: int, positions: int, bytes_per_number: int = 2,
    batch_size: int = 1,
) -> int:
    """2 x layers x kv-heads x D x positions x bytes (x batch): the cache a decoder needs."""
    return 2 * n_layers * n_kv_heads * head_size * positions * bytes_per_number * batch_size
