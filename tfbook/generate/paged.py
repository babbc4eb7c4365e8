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
    reference counts        refs[block]               tables that hold the block

Sequences that begin with the same tokens (a system prompt) can hold the same blocks:
`share_prefix` puts a prefix's blocks in a second table and counts each block's holders; a
block returns to the free list when its last holder releases it. A shared block that is only
partly filled is copied the first time any holder writes into it (copy-on-write, vLLM's
answer for beams and parallel samples): `reserve` gives the writer a new block and records
the copy, which `PagedKVCache.begin_step` makes in every layer before the forward pass.

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


def check_count(name: str, value: object, least: int = 1) -> int:
    """An int (not a bool) >= `least`, or a TypeError/ValueError that names it."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    return int(value)


def check_seq(seq: object) -> Hashable:
    """A sequence name: any hashable value but a bool (True == 1 would name sequence 1)."""
    if isinstance(seq, bool) or not isinstance(seq, Hashable):
        raise TypeError(f"a sequence id must be hashable and not a bool, got {seq!r} of type "
                        f"{type(seq).__name__}")
    return seq


def blocks_needed(n_tokens: int, block_size: int) -> int:
    """Blocks that hold n_tokens positions: ceil(n_tokens / block_size); 9 tokens, 4 -> 3."""
    n_tokens = check_count("n_tokens", n_tokens, least=0)
    return -(-n_tokens // check_count("block_size", block_size))


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__}"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share: [1, 2, 3], [1, 2, 5, 6] -> 2."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class BlockAllocator:
    """The free list of a pool of `num_blocks` blocks, one block table per sequence, and a
    reference count per block (sequences that share a prefix share its blocks)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = check_count("num_blocks", num_blocks)
        self.block_size = check_count("block_size", block_size)
        self.free: deque[int] = deque(range(self.num_blocks))  # taken from the left
        self.tables: dict[Hashable, list[int]] = {}  # sequence -> its blocks, in order
        self.lengths: dict[Hashable, int] = {}  # sequence -> positions written
        self.refs = [0] * self.num_blocks  # block -> block tables that hold it
        # copy-on-write: (shared block, its new private copy) pairs whose contents the pool
        # must copy before the next forward pass writes (PagedKVCache.begin_step does it)
        self.copies: list[tuple[int, int]] = []

    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self.free)

    @property
    def num_used(self) -> int:
        """Blocks held by sequences (a shared block counts once)."""
        return self.num_blocks - len(self.free)

    @property
    def num_shared(self) -> int:
        """Blocks saved by sharing: table entries beyond the first for every block."""
        return sum(r - 1 for r in self.refs if r > 1)

    def add(self, seq: Hashable) -> None:
        """Start an empty block table for a new sequence."""
        if check_seq(seq) in self.tables:
            raise ValueError(f"sequence {seq!r} already has a block table")
        self.tables[seq] = []
        self.lengths[seq] = 0

    def share_prefix(self, seq: Hashable, source: Hashable, n: int) -> list[int]:
        """Start `seq` with the first n stored positions of `source`, holding the same blocks
        (their reference counts go up) -> the shared blocks.

        A shared block that is only partly filled is copied when either sequence first writes
        into it (copy-on-write, in `reserve`). With block_size 4, `source` of length 10 in
        [3, 7, 1] and n = 6: seq's table is [3, 7]; its next write copies block 7.
        """
        if check_seq(seq) in self.tables:
            raise ValueError(f"sequence {seq!r} already has a block table")
        table = self._table(source)
        n = check_count("n (positions shared)", n)
        if n > self.lengths[source]:
            raise ValueError(f"sequence {source!r} has stored {self.lengths[source]} "
                             f"position(s), cannot share its first {n}")
        shared = table[:blocks_needed(n, self.block_size)]
        for block in shared:
            self.refs[block] += 1
        self.tables[seq], self.lengths[seq] = list(shared), n
        return list(shared)

    def _table(self, seq: Hashable) -> list[int]:
        if check_seq(seq) not in self.tables:
            raise ValueError(f"no sequence {seq!r} in this cache; known: "
                             f"{list(self.tables)[:8]}")
        return self.tables[seq]

    def _copy_on_write(self, seq: Hashable) -> bool:
        """The next position of `seq` lands in a block another table also holds."""
        table, i = self.tables[seq], self.lengths[seq] // self.block_size
        return i < len(table) and self.refs[table[i]] > 1

    def extra_blocks(self, seq: Hashable, n_new: int) -> int:
        """Blocks `seq` must take before it can hold `n_new` more positions (with the copy of
        a shared block it would write into)."""
        table = self._table(seq)
        if check_count("n_new", n_new, least=0) == 0:
            return 0
        grow = blocks_needed(self.lengths[seq] + n_new, self.block_size) - len(table)
        return max(0, grow) + self._copy_on_write(seq)

    def reserve(self, seq: Hashable, n_new: int) -> list[int]:
        """Take the blocks for `n_new` more positions of `seq` (all or none) -> the new ones.

        If the first position to write lies in a block shared with another sequence, the
        first new block replaces it in `seq`'s table, and (shared, new) joins `copies`.
        """
        need = self.extra_blocks(seq, n_new)
        if need > len(self.free):
            raise OutOfBlocksError(
                f"sequence {seq!r} needs {need} more block(s) of {self.block_size} positions "
                f"for {n_new} new token(s), but only {len(self.free)} of {self.num_blocks} are "
                f"free: finish or preempt a sequence first, or build a larger pool")
        taken = [self.free.popleft() for _ in range(need)]
        for block in taken:
            self.refs[block] = 1
        table, grow = self.tables[seq], taken
        if n_new and self._copy_on_write(seq):  # copy-on-write: a private copy replaces it
            i = self.lengths[seq] // self.block_size
            self.refs[table[i]] -= 1
            self.copies.append((table[i], taken[0]))
            table[i], grow = taken[0], taken[1:]
        table.extend(grow)
        return taken

    def commit(self, seq: Hashable, n_new: int) -> None:
        """The next `n_new` reserved positions of `seq` now hold keys and values: count them."""
        table = self._table(seq)
        n_new = check_count("n_new", n_new, least=0)
        if self.lengths[seq] + n_new > len(table) * self.block_size:
            raise ValueError(f"sequence {seq!r} holds {len(table)} block(s), "
                             f"{len(table) * self.block_size} positions; {self.lengths[seq]} "
                             f"stored + {n_new} new do not fit: reserve them first")
        self.lengths[seq] += n_new

    def release(self, seq: Hashable) -> list[int]:
        """Forget `seq`; blocks no other table holds go back on the free list -> those."""
        table = self._table(seq)
        del self.tables[seq], self.lengths[seq]
        freed = []
        for block in table:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                freed.append(block)
        self.free.extend(freed)
        self.copies = [(a, b) for a, b in self.copies if self.refs[b]]  # copies nobody needs
        return freed

    def slots(self, seq: Hashable, start: int, stop: int) -> list[int]:
        """Pool slots (block * block_size + offset) of positions start .. stop - 1 of `seq`.

        With block_size 4 and table [5, 2]: positions 3, 4, 5 -> slots [23, 8, 9].
        """
        table, size = self._table(seq), self.block_size
        start, stop = check_count("start", start, least=0), check_count("stop", stop, least=0)
        if start > stop:
            raise ValueError(f"slots needs start <= stop, got start={start}, stop={stop}")
        if stop > len(table) * size:
            raise ValueError(f"sequence {seq!r} holds {len(table)} block(s), "
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
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                raise TypeError(f"update needs {name} as a (B, H_kv, T, D) tensor, got "
                                f"{_describe(t)}")
            if t.dtype != self.keys.dtype or t.device != self.keys.device:
                raise ValueError(f"the pool holds {self.keys.dtype} on {self.keys.device}, got "
                                 f"{name} of {t.dtype} on {t.device}: build the cache with "
                                 "PagedKVCache.for_model(model, ...)")
        B, H_kv, T, D = k.size()
        if k.shape != v.shape or (B, T) != (plan.gather.size(0), plan.gather.size(1) - plan.start) \
                or (H_kv, D) != self.keys.shape[2:]:
            raise ValueError(f"this step was planned for {plan.gather.size(0)} rows of "
                             f"{plan.gather.size(1) - plan.start} tokens with {self.keys.size(2)} "
                             f"key/value heads of size {self.keys.size(3)}, got keys of shape "
                             f"{tuple(k.shape)} and values of shape {tuple(v.shape)}")
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
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        if device is not None and not isinstance(device, (torch.device, str)):
            raise TypeError(f"device must be a torch.device, a str or None, got "
                            f"{type(device).__name__}")
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
        self.copied: list[tuple[int, int]] = []  # (shared, copy) blocks of the last step

    @classmethod
    def for_model(cls, model: nn.Module, num_blocks: int, block_size: int) -> PagedKVCache:
        """A pool shaped for a tfbook decoder's layers, key/value heads, dtype and device."""
        config = getattr(model, "config", None)
        missing = [f for f in ("n_layers", "n_heads", "head_size", "max_len")
                   if getattr(config, f, None) is None]
        if not isinstance(model, nn.Module) or missing or not list(model.parameters())[:1]:
            raise TypeError(f"PagedKVCache.for_model needs a tfbook decoder (an nn.Module with "
                            f"parameters and config.n_layers, n_heads, head_size, max_len), got "
                            f"{type(model).__name__}" + (f" without config.{', '.join(missing)}"
                                                         if missing else ""))
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
        """Refuse a forward pass whose batch is not the planned step's rows."""
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
        if isinstance(rows, (str, bytes, dict)) or not isinstance(rows, Sequence):
            raise TypeError(f"rows must be a list of (sequence id, new tokens) pairs, got "
                            f"{type(rows).__name__}")
        if not rows:
            raise ValueError("a step needs at least one row, got none")
        alloc = self.allocator
        for row in rows:
            if not isinstance(row, tuple | list) or len(row) != 2:
                raise TypeError(f"each row must be a (sequence id, new tokens) pair, got {row!r}")
            seq, n = row
            alloc._table(seq)
            check_count(f"new tokens of sequence {seq!r}", n)
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
        for seq, n in rows:
            alloc.reserve(seq, n)  # all fit (checked above), copy-on-write included
        self.copied = list(alloc.copies)
        for shared, copy in self.copied:  # before the forward pass writes into the copies
            for layer in self.layers:
                layer.keys[copy] = layer.keys[shared]
                layer.values[copy] = layer.values[shared]
        alloc.copies.clear()
        new_rows, new_cols, new_slots = [], [], []
        for b, (seq, n) in enumerate(rows):
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
            self.allocator.commit(seq, n)
        self.plan, self._new = None, []

    def cancel_step(self) -> None:
        """Forget a planned step whose forward pass failed (nothing counted as stored)."""
        self.plan, self._new = None, []

    def reorder(self, index: Tensor) -> None:
        raise NotImplementedError("a paged cache follows sequences by name, not rows: beam "
                                  "search uses the contiguous KVCache")
