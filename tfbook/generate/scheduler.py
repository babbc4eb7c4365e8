"""Continuous batching: requests join and leave the batch at every step (Yu et al. 2022).

Static batching pads a group of prompts to one length and decodes until the longest answer
is done: a row whose answer ended early keeps its place (and its cache row) until then, and
a new request waits for the whole group. Iteration-level scheduling (Orca, Yu et al. 2022)
decides again before every forward pass; with a paged cache (vLLM, Kwon et al. 2023) a
sequence holds only the blocks it has filled, so a finished one frees its memory at once.

    every step    admit waiting requests (first come, first served) while the batch has room
                  and the pool has the blocks of their prompts; if any were admitted, run
                  their PREFILL (all of each prompt, one forward pass);
                  otherwise run one DECODE step of every running sequence (one token each);
                  greedy next token; a sequence with max_new_tokens tokens or an end token is
                  retired and its blocks go back to the free list; during a prefill step
                  the running sequences wait (chunked prefill, as in Sarathi-Serve, would
                  mix a slice of the prompt with their decode tokens instead)
    out of blocks a decode step whose sequences need more blocks than are free PREEMPTS the
                  most recently admitted sequence: its blocks are freed and it goes back to
                  the front of the queue with the tokens it has; readmitted, it recomputes
                  their keys and values in one prefill (vLLM's "recompute" preemption)
    sharing       with share_prefixes=True, an admitted request holds the blocks of the
                  longest prefix it shares with a running sequence (a common system prompt)
                  and its prefill computes only the rest; a shared, partly filled block is
                  copied on its first write (copy-on-write)

Rows of different lengths share each forward pass: `PagedKVCache.begin_step` gives every row
its own positions and a mask over its own keys. Decoding is greedy (the argmax), so every
request gets the tokens one-by-one greedy `generate` gives it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tfbook.cache import cache_bytes
from tfbook.config import is_int
from tfbook.generate.paged import (
    PagedKVCache,
    blocks_needed,
    check_count,
    check_seq,
    common_prefix,
)
from tfbook.generate.sampling import greedy
from tfbook.generate.search import (
    as_end_ids,
    as_prompt_ids,
    check_model,
    check_request,
    generate,
    model_vocab_size,
)


@dataclass
class Request:
    """One prompt to continue, and what has been generated for it so far."""

    id: Hashable
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0  # the first step at which it may be admitted
    output: list[int] = field(default_factory=list)  # the new tokens so far
    preemptions: int = 0  # times its blocks were taken back
    reused: int = 0  # positions whose keys it shared from another sequence when last admitted
    logits: list[Tensor] = field(default_factory=list)  # (V,) per new token, if kept

    @property
    def tokens(self) -> list[int]:
        """Prompt and new tokens: what the cache must hold before the next token."""
        return self.prompt + self.output


@dataclass
class StepRecord:
    """What one step did, for the figures: who ran, which blocks each sequence held after."""

    step: int
    kind: str  # "prefill" or "decode" (or "idle": nothing had arrived yet)
    rows: list[tuple[Hashable, int]]  # (request, new tokens fed) per row of the forward pass
    padded_tokens: int  # B x T: token positions the forward pass computed, padding included
    tables: dict[Hashable, list[int]]  # block table of every running sequence after the step
    lengths: dict[Hashable, int]  # positions each one has stored
    finished: list[Hashable]  # retired at this step (their blocks are free again)
    preempted: list[Hashable]  # sent back to the queue before this step
    used_blocks: int  # blocks held after the step (a shared block counts once)
    used_bytes: int  # their bytes (keys and values, all layers)
    shared_blocks: int = 0  # blocks saved by sharing after the step (table entries - blocks)
    copies: int = 0  # shared, partly filled blocks copied before a write in this step


class ContinuousBatcher:
    """Greedy generation for many requests with continuous batching on a `PagedKVCache`."""

    def __init__(
        self, model: nn.Module, num_blocks: int, block_size: int, max_batch: int = 8,
        end_ids: int | Sequence[int] = (), pad_id: int = 0, keep_logits: bool = False,
        share_prefixes: bool = False,
    ) -> None:
        check_model(model, None, True, "ContinuousBatcher")
        for name, flag in (("keep_logits", keep_logits), ("share_prefixes", share_prefixes)):
            if flag is not True and flag is not False:
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self.keep_logits = keep_logits  # keep each request's raw next-token scores
        # a new request shares the blocks of the longest prefix it has in common with a
        # running sequence (reference counts, copy-on-write) and computes only the rest
        self.share_prefixes = share_prefixes
        self.model = model
        self.vocab_size = model_vocab_size(model)
        self.max_batch = check_count("max_batch", max_batch)
        self.end_ids = as_end_ids(end_ids)
        check_request(1, 1, model.config.max_len, self.end_ids, self.vocab_size)
        if not is_int(pad_id):
            raise TypeError(f"pad_id must be an int, got {pad_id!r} of type "
                            f"{type(pad_id).__name__}")
        if not 0 <= pad_id < self.vocab_size:
            raise ValueError(f"pad_id must be an int in [0, {self.vocab_size}), got {pad_id!r}")
        self.pad_id = int(pad_id)
        self.cache = PagedKVCache.for_model(model, num_blocks, block_size)
        self.requests: dict[Hashable, Request] = {}
        self.waiting: deque[Request] = deque()  # admitted in this order
        self.running: list[Request] = []  # in the order they were admitted
        self.history: list[StepRecord] = []
        self.now = 0  # steps taken

    def submit(
        self, prompt: Sequence[int] | Tensor, max_new_tokens: int,
        request_id: Hashable | None = None, arrival: int = 0,
    ) -> Hashable:
        """Queue a request (refused at once if it could never be served) -> its id."""
        row = len(self.requests)
        ids = as_prompt_ids(prompt, row)
        if not ids:
            raise ValueError(f"every prompt must hold at least one token, got an empty prompt "
                             f"(request {row})")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must lie in [0, V={self.vocab_size}), got {bad[0]}")
        if not is_int(max_new_tokens):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r} of type "
                            f"{type(max_new_tokens).__name__}")
        check_request(len(ids), max_new_tokens, self.model.config.max_len, self.end_ids,
                      self.vocab_size)
        capacity = self.cache.num_blocks * self.cache.block_size
        if len(ids) + max_new_tokens > capacity:
            raise ValueError(
                f"a prompt of {len(ids)} tokens plus max_new_tokens={max_new_tokens} needs "
                f"{len(ids) + max_new_tokens} positions, more than the whole pool holds "
                f"({self.cache.num_blocks} blocks x {self.cache.block_size} = {capacity})")
        if not is_int(arrival):
            raise TypeError(f"arrival must be an int (a step number), got {arrival!r} of type "
                            f"{type(arrival).__name__}")
        if arrival < 0:
            raise ValueError(f"arrival must be a step number >= 0, got {arrival!r}")
        request_id = row if request_id is None else check_seq(request_id)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already taken")
        request = Request(request_id, ids, max_new_tokens, int(arrival))
        self.requests[request_id] = request
        self.waiting.append(request)
        return request_id

    @property
    def done(self) -> bool:
        """No request waits or runs."""
        return not self.waiting and not self.running

    def _prefix_source(self, request: Request) -> tuple[Hashable | None, int]:
        """The running sequence whose stored tokens begin as `request`'s do for longest ->
        (its id, positions shared); (None, 0) without sharing. The last token is always
        computed: its logits give the next token."""
        if not self.share_prefixes:
            return None, 0
        lengths, tokens = self.cache.allocator.lengths, request.tokens[:-1]
        best, shared = None, 0
        for other in self.running:  # in the order admitted: the earliest wins a tie
            n = common_prefix(tokens, other.tokens[:lengths[other.id]])
            if n > shared:
                best, shared = other.id, n
        return best, shared

    def _admit(self) -> list[tuple[Request, Hashable | None, int]]:
        """Waiting requests that have arrived, in order, while batch and pool have room ->
        (request, the sequence it shares a prefix with or None, positions shared)."""
        admitted, free, size = [], self.cache.allocator.num_free, self.cache.block_size
        for request in list(self.waiting):
            if request.arrival > self.now:
                continue  # not here yet; later arrivals may be
            source, shared = self._prefix_source(request)
            # whole shared blocks cost nothing; a partly filled one is copied (a new block)
            need = blocks_needed(len(request.tokens), size) - shared // size
            if len(self.running) + len(admitted) >= self.max_batch or need > free:
                break  # first come, first served: nobody overtakes the head of the queue
            free -= need
            admitted.append((request, source, shared))
            self.waiting.remove(request)
        return admitted

    def _preempt_for_decode(self) -> list[Hashable]:
        """Free the newest sequences until every running one has room for one more token."""
        alloc, preempted = self.cache.allocator, []
        while sum(alloc.extra_blocks(r.id, 1) for r in self.running) > alloc.num_free:
            victim = self.running.pop()  # the most recently admitted
            alloc.release(victim.id)
            victim.preemptions += 1
            self.waiting.appendleft(victim)  # first in line again, with the tokens it has
            preempted.append(victim.id)
        return preempted

    @torch.no_grad()
    def step(self) -> StepRecord:
        """One forward pass: a prefill of newly admitted requests, or a decode step."""
        if self.done:
            raise RuntimeError("no request waits or runs: submit one first")
        alloc, preempted = self.cache.allocator, []
        admitted = self._admit()
        if admitted:
            batch, kind = [r for r, _, _ in admitted], "prefill"
            for request, source, shared in admitted:
                if shared:  # the blocks of the common prefix, not a copy of its keys
                    alloc.share_prefix(request.id, source, shared)
                else:
                    alloc.add(request.id)
                request.reused = shared
            rows = [(r.id, len(r.tokens) - n) for r, _, n in admitted]  # tokens not shared
        elif self.running:
            preempted = self._preempt_for_decode()
            batch, kind = list(self.running), "decode"
            rows = [(r.id, 1) for r in batch]  # the last token, not yet in the cache
        else:  # nothing has arrived yet
            self.now += 1
            return self._record("idle", [], 0, [], preempted)
        positions, mask = self.cache.begin_step(rows)
        B, T = positions.size()
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        for b, (request, (_, n)) in enumerate(zip(batch, rows, strict=True)):
            ids[b, T - n:] = torch.tensor(request.tokens[-n:])  # left-padded
        try:
            out = self.model(ids.to(positions.device), positions=positions,
                             attention_mask=mask, cache=self.cache, last_only=True)
        except BaseException:
            self.cache.cancel_step()
            raise
        self.cache.end_step()
        logits = out.logits[:, -1]  # (B, V): every row's last column is real
        tokens = greedy(logits).tolist()  # (B,)
        if kind == "prefill":
            self.running += batch
        finished = []
        for b, (request, token) in enumerate(zip(batch, tokens, strict=True)):
            request.output.append(token)
            if self.keep_logits:
                request.logits.append(logits[b].clone())
            if len(request.output) == request.max_new_tokens or token in self.end_ids:
                self.running.remove(request)
                alloc.release(request.id)
                finished.append(request.id)
        self.now += 1
        return self._record(kind, rows, B * T, finished, preempted)

    def _record(self, kind: str, rows: list, padded: int, finished: list,
                preempted: list) -> StepRecord:
        alloc = self.cache.allocator
        record = StepRecord(
            step=self.now - 1, kind=kind, rows=rows, padded_tokens=padded,
            tables={seq: list(t) for seq, t in alloc.tables.items()},
            lengths=dict(alloc.lengths), finished=finished, preempted=preempted,
            used_blocks=alloc.num_used, used_bytes=self.cache.memory_bytes(),
            shared_blocks=alloc.num_shared, copies=len(self.cache.copied) if rows else 0)
        self.history.append(record)
        return record

    def run(self) -> dict[Hashable, list[int]]:
        """Step until every request is done -> its new tokens, by request id."""
        while not self.done:
            self.step()
        return {rid: list(r.output) for rid, r in self.requests.items()}


def generate_paged(
    model: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
    num_blocks: int, block_size: int = 16, max_batch: int = 8,
    end_ids: int | Sequence[int] = (),
) -> list[list[int]]:
    """Greedy continuations of `prompts` by continuous batching -> new tokens per prompt."""
    budgets = _budgets(prompts, max_new_tokens)
    batcher = ContinuousBatcher(model, num_blocks, block_size, max_batch, end_ids)
    ids = [batcher.submit(p, n) for p, n in zip(prompts, budgets, strict=True)]
    outputs = batcher.run()
    return [outputs[i] for i in ids]


def _budgets(prompts: object, max_new_tokens: object) -> list[int]:
    """max_new_tokens as one positive int per prompt, checked: one int for every prompt, or a
    list with one per prompt."""
    if isinstance(prompts, (str, bytes, Tensor)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of lists of int ids, got "
                        f"{type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts must hold at least one prompt, got none")
    if is_int(max_new_tokens):
        budgets = [max_new_tokens] * len(prompts)
    elif isinstance(max_new_tokens, (str, bytes)) or not isinstance(max_new_tokens, Sequence):
        raise TypeError(f"max_new_tokens must be an int or a list of ints (one per prompt), "
                        f"got {type(max_new_tokens).__name__} {max_new_tokens!r:.40}")
    else:
        budgets = list(max_new_tokens)
    if len(budgets) != len(prompts):
        raise ValueError(f"one max_new_tokens per prompt: {len(prompts)} prompts, "
                         f"{len(budgets)} budgets")
    for row, n in enumerate(budgets):
        if not is_int(n) or n < 1:
            raise ValueError(f"max_new_tokens must be positive ints, got {n!r} for prompt {row}")
    return [int(n) for n in budgets]


@torch.no_grad()
def generate_static(
    model: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
    batch_size: int, end_ids: int | Sequence[int] = (),
) -> tuple[list[list[int]], int]:
    """Static batching, the baseline: groups of `batch_size` in order, left-padded, each group
    decoded until its longest request is done -> new tokens per prompt, and the token positions
    the forward passes computed (B x T per step, padding and finished rows included).
    max_new_tokens: one int for every prompt, or one per prompt."""
    check_count("batch_size", batch_size)
    all_budgets = _budgets(prompts, max_new_tokens)
    end_ids = as_end_ids(end_ids)
    outputs, computed = [], 0
    for first in range(0, len(prompts), batch_size):
        group = [as_prompt_ids(p, first + k) for k, p in
                 enumerate(prompts[first:first + batch_size])]
        budgets = all_budgets[first:first + batch_size]
        result = generate(model, group, max(budgets), end_ids=end_ids)
        B, T = len(group), result.prompt_length
        N = result.new_tokens.size(1)
        computed += B * (T + N - 1)  # the prefill (T columns), then N - 1 one-token steps
        for row, n in enumerate(budgets):
            new = result.new_tokens[row, :n].tolist()
            ends = [i for i, t in enumerate(new) if t in end_ids]
            outputs.append(new[:ends[0] + 1] if ends else new)
    return outputs, computed


def contiguous_bytes(model: nn.Module, batch_size: int, positions: int) -> int:
    """Bytes of a contiguous cache of `batch_size` rows of `positions` positions (keys and
    values, all layers) for `model`: what static batching holds for a group."""
    check_model(model, None, True, "contiguous_bytes")
    check_count("batch_size", batch_size)
    check_count("positions", positions)
    config = model.config
    weight = next(model.parameters())
    return cache_bytes(config.n_layers, config.n_kv_heads or config.n_heads, config.head_size,
                       positions, weight.element_size(), batch_size)
