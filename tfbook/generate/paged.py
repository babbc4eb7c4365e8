"""A paged key/value cache: fixed-size blocks in one preallocated pool (Kwon et al. 2023).

A contiguous cache gives every sequence a row of `max_len` positions, filled or not. A paged
cache cuts the keys and values into blocks of `block_size` positions, all taken from one
pool per layer, and keeps for every sequence a *block table*: the list of the blocks that
hold its positions, in order. Position p of a sequence lives in block table[p // block_size]
at offset p % block_size. A sequence takes a new block only when its last one is full, and
gives all of them back to the free list when it finishes, so the memory held is what the
running sequences have written, rounded up to one block each.

    pool (one per layer)    keys, values: (num_blocks, block_size, H_kv, D)
    block tables            {"a": [0, 3], "b": [1]}   a holds positions 0..7 in blocks 0, 3
    free list               [2, 4, 5, ...]            taken from the front, freed to the back

One forward pass serves rows of different lengths. For a step, `begin_step` is told how
many new tokens each row brings; it takes the blocks they need, and lays every row's keys
out right-aligned in S columns (padding first), so that the model's causal mask, which puts
the T queries at the last T key columns, is right for every row, and an attention mask
(B, S) hides the padding. Attention calls `update(k, v)` on each layer as with the
contiguous `KVCache`: the new keys and values are written into their slots in the pool and
all of a row's keys are gathered back through its block table.

Shape legend: B rows in the step, T new tokens per row (padded), S key columns, H_kv
key/value heads, D head size, N real new tokens in the step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tfbook.cache import KVCache
from tfbook.config import is_int


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than a request for blocks needs."""


def check_count(name: str, value: object) -> int:
    """A positive int (not a bool), or a TypeError/ValueError that names it."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def blocks_needed(n_tokens: int, block_size: int) -> int:
    """Blocks that hold n_tokens positions: ceil(n_tokens / block_size); 9 tokens, 4 -> 3."""
    return -(-n_tokens // block_size)


class BlockAllocator:
    """The free list of a pool of `num_blocks` blocks and one block table per sequence."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = check_count("num_blocks", num_blocks)
        self.block_size = check_count("block_size", block_size)
        self.free: deque[int] = deque(range(self.num_blocks))  # taken from the left
        self.tables: dict[Hashable, list[int]] = {}  # sequence -> its blocks, in order
        self.lengths: dict[Hashable, int] = {}  # sequence -> positions written

    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self.free)

    @property
    def num_used(self) -> int:
        """Blocks held by sequences."""
        return self.num_blocks - len(self.free)

    def add(self, seq: Hashable) -> None:
        """Start an empty block table for a new sequence."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already has a block table")
        self.tables[seq] = []
        self.lengths[seq] = 0

    def _table(self, seq: Hashable) -> list[int]:
        if seq not in self.tables:
            raise KeyError(f"no sequence {seq!r} in this cache; known: {list(self.tables)[:8]}")
        return self.tables[seq]

    def extra_blocks(self, seq: Hashable, n_new: int) -> int:
        """Blocks `seq` must take before it can hold `n_new` more positions."""
        table = self._table(seq)
        return max(0, blocks_needed(self.lengths[seq] + n_new, self.block_size) - len(table))

    def reserve(self, seq: Hashable, n_new: int) -> list[int]:
        """Take the blocks for `n_new` more positions of `seq` (all or none) -> the new ones."""
        need = self.extra_blocks(seq, n_new)
        if need > len(self.free):
            raise OutOfBlocksError(
                f"sequence {seq!r} needs {need} more block(s) of {self.block_size} positions "
                f"for {n_new} new token(s), but only {len(self.free)} of {self.num_blocks} are "
                f"free: finish or preempt a sequence first, or build a larger pool")
        taken = [self.free.popleft() for _ in range(need)]
        self.tables[seq].extend(taken)
        return taken

    def release(self, seq: Hashable) -> list[int]:
        """Forget `seq` and put its blocks back on the free list -> the blocks freed."""
        table = self._table(seq)
        del self.tables[seq], self.lengths[seq]
        self.free.extend(table)
        return table

    def slots(self, seq: Hashable, start: int, stop: int) -> list[int]:
        """Pool slots (block * block_size + offset) of positions start .. stop - 1 of `seq`.

        With block_size 4 and table [5, 2]: positions 3, 4, 5 -> slots [23, 8, 9].
        """
        table, size = self._table(seq), self.block_size
        if stop > len(table) * size:
            raise OutOfBlocksError(f"sequence {seq!r} holds {len(table)} block(s), "
                                   f"{len(table) * size} positions; position {stop - 1} "
                                   "needs a block that was never reserved")
        return [table[p // size] * size + p % size for p in range(start, stop)]


@dataclass
class StepPlan:
    """Where one forward pass writes and reads: computed once, used by every layer."""

    rows: Tensor  # (N,) row of each real new token
    cols: Tensor  # (N,) its column among the T new tokens
    slots: Tensor  # (N,) the pool slot it is written to
    gather: Tensor  # (B, S) the pool slot read for each key column (padding reads slot 0)
    start: int  # S - T: the key columns before this step's tokens


class PagedLayerCache:
    """One layer's pool of blocks: what attention calls, as it calls a `LayerCache`."""

    def __init__(self, owner: PagedKVCache, keys: Tensor, values: Tensor) -> None:
        self.owner = owner
        self.keys = keys  # (num_blocks, block_size, H_kv, D)
        self.values = values  # (num_blocks, block_size, H_kv, D)
        self.cross = None  # decoder-only: no cross-attention

    @property
    def length(self) -> int:
        """Key columns before this step's tokens (what the model counts as cached)."""
        return self.owner.length

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new k, v (B, H_kv, T, D) into their slots -> all keys, values (B, H_kv, S, D).

        Padding columns of k and v are never written; padding key columns read slot 0 (masked).
        """
        plan = self.owner.plan
        if plan is None:
            raise RuntimeError("call begin_step(rows) before the forward pass: the paged cache "
                               "must know which sequence each row is")
        B, H_kv, T, D = k.size()
        if (B, T) != (plan.gather.size(0), plan.gather.size(1) - plan.start) or (
                (H_kv, D) != self.keys.shape[2:]):
            raise ValueError(f"this step was planned for {plan.gather.size(0)} rows of "
                             f"{plan.gather.size(1) - plan.start} tokens with {self.keys.size(2)} "
                             f"key/value heads of size {self.keys.size(3)}, got keys of shape "
                             f"{tuple(k.shape)}")
        flat_k = self.keys.view(-1, H_kv, D)  # (num_blocks * block_size, H_kv, D): a view
        flat_v = self.values.view(-1, H_kv, D)
        flat_k[plan.slots] = k.transpose(1, 2)[plan.rows, plan.cols]  # (N, H_kv, D)
        flat_v[plan.slots] = v.transpose(1, 2)[plan.rows, plan.cols]
        keys = flat_k[plan.gather].transpose(1, 2)  # (B, S, H_kv, D) -> (B, H_kv, S, D)
        values = flat_v[plan.gather].transpose(1, 2)
        return keys, values


class PagedKVCache(KVCache):
    """Keys and values of many sequences in blocks of one pool per layer, with block tables.

    A `KVCache` to the model (it is passed as `cache=`); between forward passes it is a
    `BlockAllocator` with a tensor pool behind it.
    """

    def __init__(
        self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int,
        head_size: int, max_len: int, dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(check_count("n_layers", n_layers), check_count("max_len", max_len))
        self.allocator = BlockAllocator(num_blocks, block_size)
        shape = (self.allocator.num_blocks, self.allocator.block_size,
                 check_count("n_kv_heads", n_kv_heads), check_count("head_size", head_size))
        self.layers = [  # preallocated once: nothing is allocated while generating
            PagedLayerCache(self, torch.zeros(shape, dtype=dtype, device=device),
                            torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(n_layers)
        ]
        self.plan: StepPlan | None = None
        self._new: list[tuple[Hashable, int]] = []

    @classmethod
    def for_model(cls, model: nn.Module, num_blocks: int, block_size: int) -> PagedKVCache:
        """A pool shaped for a tfbook decoder's layers, key/value heads, dtype and device."""
        config = model.config
        weight = next(model.parameters())
        return cls(config.n_layers, num_blocks, block_size,
                   config.n_kv_heads or config.n_heads, config.head_size, config.max_len,
                   weight.dtype, weight.device)

    @property
    def block_size(self) -> int:
        return self.allocator.block_size

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def length(self) -> int:
        """S - T of the planned step (0 between steps)."""
        return 0 if self.plan is None else self.plan.start

    @property
    def batch_size(self) -> int | None:
        return None if self.plan is None else self.plan.gather.size(0)

    def check_batch(self, B: int) -> None:
        if self.plan is None or self.plan.gather.size(0) != B:
            raise ValueError(f"this step was planned for {self.batch_size} rows "
                             f"(begin_step), got a batch of {B}")

    def block_bytes(self) -> int:
        """Bytes of one block in all layers, keys and values."""
        layer = self.layers[0]
        return 2 * len(self.layers) * layer.keys[0].numel() * layer.keys.element_size()

    def memory_bytes(self) -> int:
        """Bytes of the blocks held by sequences (the pool's free blocks not counted)."""
        return self.allocator.num_used * self.block_bytes()

    def pool_bytes(self) -> int:
        """Bytes of the whole preallocated pool."""
        return self.num_blocks * self.block_bytes()

    def begin_step(self, rows: Sequence[tuple[Hashable, int]]) -> tuple[Tensor, Tensor]:
        """Plan one forward pass: row b brings n_b new tokens of sequence seq_b.

        Takes the blocks the new tokens need (all or none: OutOfBlocksError), and returns
        positions (B, T) and attention_mask (B, S) for the model, where T = max n_b and S is
        the longest row's length after the step. Row b's ids must be left-padded to T.
        """
        if self.plan is not None:
            raise RuntimeError("a step is already planned: call end_step() after its forward")
        if not rows:
            raise ValueError("a step needs at least one row, got none")
        alloc = self.allocator
        for seq, n in rows:
            check_count(f"new tokens of sequence {seq!r}", n)
            alloc._table(seq)
        if len({seq for seq, _ in rows}) != len(rows):
            raise ValueError("each sequence may appear once in a step")
        need = sum(alloc.extra_blocks(seq, n) for seq, n in rows)
        if need > alloc.num_free:
            raise OutOfBlocksError(f"this step needs {need} more block(s), but only "
                                   f"{alloc.num_free} of {alloc.num_blocks} are free")
        B, T = len(rows), max(n for _, n in rows)
        S = max(alloc.lengths[seq] + n for seq, n in rows)
        device = self.layers[0].keys.device
        gather = torch.zeros(B, S, dtype=torch.long)
        positions = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, S, dtype=torch.bool)
        new_rows, new_cols, new_slots = [], [], []
        for b, (seq, n) in enumerate(rows):
            alloc.reserve(seq, n)
            cached = alloc.lengths[seq]
            total = cached + n
            gather[b, S - total:] = torch.tensor(alloc.slots(seq, 0, total))  # right-aligned
            mask[b, S - total:] = True
            positions[b, T - n:] = torch.arange(cached, total)  # new tokens, left-padded
            new_rows += [b] * n
            new_cols += range(T - n, T)
            new_slots += alloc.slots(seq, cached, total)
        self.plan = StepPlan(
            rows=torch.tensor(new_rows, device=device), cols=torch.tensor(new_cols, device=device),
            slots=torch.tensor(new_slots, device=device), gather=gather.to(device), start=S - T)
        self._new = list(rows)
        return positions.to(device), mask.to(device)

    def end_step(self) -> None:
        """The forward pass has written the new tokens: count them as stored."""
        if self.plan is None:
            raise RuntimeError("no step is planned")
        for seq, n in self._new:
            self.allocator.lengths[seq] += n
        self.plan, self._new = None, []

    def cancel_step(self) -> None:
        """Forget a planned step whose forward pass failed (nothing counted as stored)."""
        self.plan, self._new = None, []

    def reorder(self, index: Tensor) -> None:
        raise NotImplementedError("a paged cache follows sequences by name, not rows: beam "
                                  "search uses the contiguous KVCache")
