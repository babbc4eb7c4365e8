"""Context parallelism: ring attention (Liu et al. 2023) with a zig-zag causal load balance.

The sequence of n tokens is split across p ranks. Each rank keeps its own queries and passes
its block of keys and values around a ring (rank r sends to r + 1 and receives from r - 1,
mod p): after p - 1 passes every rank has seen every block, and no rank ever held the whole
sequence's keys, values or (n, n) scores.

    rank r, step s = 0 .. p-1:  holds the key/value block of rank (r - s) mod p
                                posts its send to r + 1 and its receive from r - 1, then
                                folds the block into its running (m, denom, acc)
    at the end:                 Y = acc / denom,  lse = m + log denom

Folding a block in is exactly one tile of the flash chapter's inner loop: the scores of the
block go through `tfbook.flash.online_softmax_update` (the running max and normaliser) and the
unnormalised output is rescaled by the same alpha, acc' = alpha acc + p V_J. The backward pass
goes round the ring once more: each key/value block travels with its gradient accumulators
dK, dV, every rank adds its queries' part of them (`tfbook.flash.flash_backward` on one tile,
recomputing the weights from the saved lse) and after p passes they are back at the owner.

kernel="fused" computes the same blocks with torch's fused CPU flash-attention kernel
(aten._scaled_dot_product_flash_attention_for_cpu and its backward), which returns a block's
normalised output O_J and log-sum-exp l_J; the running state is then (l, O), merged by
l' = logaddexp(l, l_J), O' = O e^(l - l') + O_J e^(l_J - l') -- the same running-max update,
with the normaliser folded into l. The Python tiles ("tiles", the default) spell out the
flash chapter's update; the fused kernel does the same work in fewer, compiled steps.

Causal masking makes the plain split unfair: rank p - 1's queries see the whole sequence,
rank 0's only its own block. The zig-zag layout cuts the sequence into 2p chunks and gives
rank r chunks r and 2p - 1 - r (an early and a late one), so every rank computes the same
number of score blocks, 2p + 1 chunk pairs of (n / 2p)^2 scores: 3 at the first step (its own
block) and 2 at each later step. "contiguous" gives rank r the r-th of p chunks.

`ring_attention` runs inside a process group the caller set up (torch.distributed, gloo on CPU
processes: dist.isend / dist.irecv); `simulate_ring_attention` plays the same ring with p
virtual ranks in one process, calling the same per-step functions in the same order, so it
gives the same numbers. Both are differentiable (a custom backward around the ring).

Shape legend: B batch, H query heads, H_kv key/value heads (H a multiple of H_kv), n the whole
sequence, t = n / p tokens per rank, c the chunk length (n / 2p zig-zag, n / p contiguous),
D head size, p world size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from tfbook.config import is_int
from tfbook.flash import flash_backward, online_softmax_update, tile_scores, tile_status
from tfbook.parallel.ddp import NoProcessGroupError

LAYOUTS = ("zigzag", "contiguous")  # how the sequence's chunks are dealt to the ranks
KERNELS = ("tiles", "fused")  # how one block is computed (see the module docstring)
_TAGS = {"k": 0, "v": 1, "dk": 2, "dv": 3}  # one message tag per tensor that travels


@dataclass
class RingWork:
    """The score blocks one rank computed, ring step by ring step (skipped blocks not counted)."""

    forward: list[int] = field(default_factory=list)  # blocks folded in at each forward step
    backward: list[int] = field(default_factory=list)  # blocks recomputed at each backward step
    scores: int = 0  # query-key scores computed in the forward pass (c * c per block)


def chunk_count(world_size: int, layout: str) -> int:
    """How many equal chunks the sequence is cut into: 2p (zig-zag) or p (contiguous)."""
    _check_world_size(world_size)
    _check_layout(layout)
    return 2 * world_size if layout == "zigzag" else world_size


def rank_chunks(rank: int, world_size: int, layout: str) -> tuple[int, ...]:
    """The chunks rank r holds, in order: (r, 2p - 1 - r) zig-zag, (r,) contiguous.

    Example: p = 2, zig-zag -> rank 0 (0, 3), rank 1 (1, 2).
    """
    _check_world_size(world_size)
    _check_layout(layout)
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    return (rank, 2 * world_size - 1 - rank) if layout == "zigzag" else (rank,)


def shard_sequence(x: Tensor, rank: int, world_size: int, layout: str = "zigzag") -> Tensor:
    """Rank r's tokens of x (..., n, D): its chunks concatenated -> (..., n / p, D)."""
    _check_tensor(x, "x")
    chunks = rank_chunks(rank, world_size, layout)
    c = _chunk_length(x.size(-2), world_size, layout)
    return torch.cat([x[..., j * c:(j + 1) * c, :] for j in chunks], dim=-2)  # (..., t, D)


def unshard_sequence(parts: Sequence[Tensor], layout: str = "zigzag") -> Tensor:
    """Inverse of `shard_sequence`: the p ranks' (..., n / p, D) back to (..., n, D) in order."""
    if isinstance(parts, Tensor) or not isinstance(parts, Sequence) or not parts or not all(
            isinstance(t, Tensor) and t.dim() >= 2 and t.shape == parts[0].shape for t in parts):
        raise ValueError(f"parts must be a non-empty sequence of tensors (..., n / p, D) of one "
                         f"shape, one per rank, got {_describe(parts)}")
    p = len(parts)
    per_rank = len(rank_chunks(0, p, layout))
    t = parts[0].size(-2)
    if t % per_rank:
        raise ValueError(f"a {layout} rank holds {per_rank} equal chunks, so its length must be "
                         f"a multiple of {per_rank}, got {t}")
    c = t // per_rank
    pieces: dict[int, Tensor] = {}
    for r, part in enumerate(parts):
        for i, j in enumerate(rank_chunks(r, p, layout)):
            pieces[j] = part[..., i * c:(i + 1) * c, :]
    return torch.cat([pieces[j] for j in range(chunk_count(p, layout))], dim=-2)


# ---- one rank's share of one ring step (the real ring and the simulation both call these) ----

def _grouped(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(B, H, t, D), (B, H_kv, t, D) -> the flash kernel's (B, H_kv, n_rep, t, D), (B, H_kv, 1,
    t, D): the n_rep query heads of a group share one key/value head without copying it."""
    B, H, t, D = q.shape
    H_kv = k.size(1)
    return (q.reshape(B, H_kv, H // H_kv, t, D), k.reshape(B, H_kv, 1, t, D),
            v.reshape(B, H_kv, 1, t, v.size(-1)))


def _blocks(mine: Sequence[int], theirs: Sequence[int], c: int, n: int, causal: bool):
    """The (query chunk a, key chunk b, status) pairs the causal mask leaves to compute:
    a, b index this rank's chunks and the visiting block's; status "full" or "partial"."""
    for a, ga in enumerate(mine):
        for b, gb in enumerate(theirs):
            status = tile_status(ga * c, (ga + 1) * c, gb * c, (gb + 1) * c, n, n, causal)
            if status != "skipped":
                yield a, b, status


def _forward_step(q5: Tensor, state: list[list[Tensor]], k5: Tensor, v5: Tensor,
                  mine: Sequence[int], theirs: Sequence[int], c: int, n: int, causal: bool,
                  work: RingWork | None) -> None:
    """Fold the visiting key/value block (chunks `theirs`) into this rank's running
    [m, denom, acc] of each of its query chunks (`mine`): the flash forward's tile update."""
    scale = 1.0 / math.sqrt(q5.size(-1))
    blocks = 0
    for a, b, status in _blocks(mine, theirs, c, n, causal):
        m, denom, acc = state[a]
        q_a = q5[..., a * c:(a + 1) * c, :]  # (B, H_kv, n_rep, c, D)
        # the block's scores at the chunks' places in the whole sequence: masked ones -inf
        s = tile_scores(q_a, k5[..., b * c:(b + 1) * c, :], scale, mine[a] * c,
                        theirs[b] * c, n, n, status, None)  # (B, H_kv, n_rep, c, c)
        m, denom, p, alpha = online_softmax_update(m, denom, s)
        acc = alpha[..., None] * acc + p @ v5[..., b * c:(b + 1) * c, :]  # (..., c, Dv)
        state[a] = [m, denom, acc]
        blocks += 1
    if work is not None:
        work.forward.append(blocks)
        work.scores += blocks * c * c


def _start(q5: Tensor, chunks: int, c: int, dv: int) -> list[list[Tensor]]:
    """m = -inf, denom = 0, acc = 0 for each of a rank's query chunks."""
    lead = q5.shape[:-2]  # (B, H_kv, n_rep)
    return [[q5.new_full((*lead, c), -math.inf), q5.new_zeros((*lead, c)),
             q5.new_zeros((*lead, c, dv))] for _ in range(chunks)]


def _finish(state: list[list[Tensor]]) -> tuple[Tensor, Tensor]:
    """Y = acc / denom and lse = m + log denom over a rank's chunks -> (..., t, Dv), (..., t).
    Every query sees at least its own position, so denom > 0."""
    out = torch.cat([acc / denom[..., None] for _, denom, acc in state], dim=-2)
    lse = torch.cat([m + torch.log(denom) for m, denom, _ in state], dim=-1)
    return out, lse


def _backward_step(g5: Tensor, q5: Tensor, out5: Tensor, lse5: Tensor, k5: Tensor, v5: Tensor,
                   dq5: Tensor, dk5: Tensor, dv5: Tensor, mine: Sequence[int],
                   theirs: Sequence[int], c: int, n: int, causal: bool,
                   work: RingWork | None) -> None:
    """Add this rank's part of the gradients for the visiting block: dq5 (this rank's
    queries) and dk5, dv5 (the accumulators travelling with the block), one flash tile each."""
    blocks = 0
    for a, b, status in _blocks(mine, theirs, c, n, causal):
        qa, kb = slice(a * c, (a + 1) * c), slice(b * c, (b + 1) * c)
        # a "partial" block is a diagonal one (query chunk = key chunk): causal within it
        gq, gk, gv = flash_backward(g5[..., qa, :], q5[..., qa, :], k5[..., kb, :],
                                    v5[..., kb, :], out5[..., qa, :], lse5[..., qa],
                                    None, status == "partial", c, c)
        dq5[..., qa, :] += gq
        dk5[..., kb, :] += gk
        dv5[..., kb, :] += gv
        blocks += 1
    if work is not None:
        work.backward.append(blocks)


# ---- the same steps with torch's fused CPU flash-attention kernel per block (kernel="fused") ----

_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _heads(t5: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, r, c, D) -> (B, H_kv n_rep, c, D): the kernel's one head axis; a key/value
    block (r = 1) is repeated for the n_rep query heads of its group."""
    B, H_kv, _, c, D = t5.shape
    return t5.expand(B, H_kv, n_rep, c, D).reshape(B, H_kv * n_rep, c, D)


def _fused_start(q5: Tensor, chunks: int, c: int, dv: int) -> list[list[Tensor]]:
    """lse = -inf, out = 0 for each of a rank's query chunks."""
    lead = q5.shape[:-2]  # (B, H_kv, n_rep)
    return [[q5.new_full((*lead, c), -math.inf), q5.new_zeros((*lead, c, dv))]
            for _ in range(chunks)]


def _fused_forward_step(q5: Tensor, state: list[list[Tensor]], k5: Tensor, v5: Tensor,
                        mine: Sequence[int], theirs: Sequence[int], c: int, n: int,
                        causal: bool, work: RingWork | None) -> None:
    """The blocks `_forward_step` folds in, each by torch's fused kernel, which returns the
    block's normalised output O_J and log-sum-exp l_J; merged into the running (l, O) by
    l' = logaddexp(l, l_J), O' = O e^(l - l') + O_J e^(l_J - l'): the running-max update with
    the normaliser folded into l (denom = e^(l - m))."""
    B, H_kv, n_rep, _, D = q5.shape
    blocks = 0
    for a, b, status in _blocks(mine, theirs, c, n, causal):
        lse, out = state[a]
        out_j, lse_j = _FLASH_CPU(  # a "partial" block is a diagonal one: causal within it
            _heads(q5[..., a * c:(a + 1) * c, :], n_rep),
            _heads(k5[..., b * c:(b + 1) * c, :], n_rep),
            _heads(v5[..., b * c:(b + 1) * c, :], n_rep), 0.0, status == "partial",
            scale=1.0 / math.sqrt(D))  # (B, H, c, Dv), (B, H, c)
        out_j, lse_j = out_j.reshape(out.shape), lse_j.reshape(lse.shape)
        new = torch.logaddexp(lse, lse_j)
        state[a] = [new, out * torch.exp(lse - new)[..., None]
                    + out_j * torch.exp(lse_j - new)[..., None]]
        blocks += 1
    if work is not None:
        work.forward.append(blocks)
        work.scores += blocks * c * c


def _fused_finish(state: list[list[Tensor]]) -> tuple[Tensor, Tensor]:
    """The running (l, O) over a rank's chunks -> Y (..., t, Dv), lse (..., t)."""
    return (torch.cat([out for _, out in state], dim=-2),
            torch.cat([lse for lse, _ in state], dim=-1))


def _fused_backward_step(g5: Tensor, q5: Tensor, out5: Tensor, lse5: Tensor, k5: Tensor,
                         v5: Tensor, dq5: Tensor, dk5: Tensor, dv5: Tensor,
                         mine: Sequence[int], theirs: Sequence[int], c: int, n: int,
                         causal: bool, work: RingWork | None) -> None:
    """`_backward_step` with torch's fused backward kernel per block, given the final output
    and log-sum-exp (so it recomputes the block's weights exactly as the tiles do); the
    gradients of a repeated key/value head are summed over its group."""
    B, H_kv, n_rep, _, D = q5.shape
    blocks = 0
    for a, b, status in _blocks(mine, theirs, c, n, causal):
        qa, kb = slice(a * c, (a + 1) * c), slice(b * c, (b + 1) * c)
        gq, gk, gv = _FLASH_CPU_BACKWARD(
            _heads(g5[..., qa, :], n_rep), _heads(q5[..., qa, :], n_rep),
            _heads(k5[..., kb, :], n_rep), _heads(v5[..., kb, :], n_rep),
            _heads(out5[..., qa, :], n_rep),
            lse5[..., qa].reshape(B, H_kv * n_rep, c).contiguous(), 0.0, status == "partial",
            scale=1.0 / math.sqrt(D))
        dq5[..., qa, :] += gq.reshape(B, H_kv, n_rep, c, D)
        dk5[..., kb, :] += gk.reshape(B, H_kv, n_rep, c, D).sum(2, keepdim=True)
        dv5[..., kb, :] += gv.reshape(B, H_kv, n_rep, c, -1).sum(2, keepdim=True)
        blocks += 1
    if work is not None:
        work.backward.append(blocks)


# per kernel: (start, forward step, finish, backward step)
_KERNELS = {"tiles": (_start, _forward_step, _finish, _backward_step),
            "fused": (_fused_start, _fused_forward_step, _fused_finish, _fused_backward_step)}


# ---- the ring over processes ----

def _pass_on(tensors: dict[str, Tensor], rank: int, world_size: int
             ) -> tuple[list[dist.Work], dict[str, Tensor]]:
    """Post the sends of `tensors` to rank + 1 and the receives of the same from rank - 1.
    -> the requests to wait for, and the buffers the received tensors arrive in."""
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    requests, received = [], {}
    for name, t in tensors.items():
        received[name] = torch.empty_like(t)
        requests.append(dist.irecv(received[name], src=prev, tag=_TAGS[name]))
        requests.append(dist.isend(t, dst=nxt, tag=_TAGS[name]))
    return requests, received


class _RingAttention(torch.autograd.Function):
    """One rank's ring attention; the backward pass goes round the ring again."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, layout: str,
                work: RingWork | None, kernel: str) -> Tensor:
        rank, p = dist.get_rank(), dist.get_world_size()
        n, mine = p * q.size(-2), rank_chunks(rank, p, layout)
        c = q.size(-2) // len(mine)
        q5, k5, v5 = (t.contiguous() for t in _grouped(q, k, v))
        start, forward_step, finish, _ = _KERNELS[kernel]
        state = start(q5, len(mine), c, v5.size(-1))
        travelling = {"k": k5, "v": v5}
        for s in range(p):
            # send the block on before using it: the transfer overlaps the computation
            requests, received = _pass_on(travelling, rank, p) if s < p - 1 else ([], {})
            theirs = rank_chunks((rank - s) % p, p, layout)
            forward_step(q5, state, travelling["k"], travelling["v"], mine, theirs, c, n,
                         causal, work)
            for request in requests:
                request.wait()
            travelling = received
        out5, lse5 = finish(state)
        ctx.save_for_backward(q5, k5, v5, out5, lse5)
        ctx.settings = (causal, layout, work, kernel, q.shape, k.shape, v.shape)
        return out5.reshape(*q.shape[:-1], v.size(-1))  # (B, H, t, Dv)

    @staticmethod
    @once_differentiable  # the messages are not part of any graph: no double backward
    def backward(ctx, grad_out: Tensor):
        q5, k5, v5, out5, lse5 = ctx.saved_tensors
        causal, layout, work, kernel, q_shape, k_shape, v_shape = ctx.settings
        backward_step = _KERNELS[kernel][3]
        rank, p = dist.get_rank(), dist.get_world_size()
        mine = rank_chunks(rank, p, layout)
        c = q5.size(-2) // len(mine)
        n = p * q5.size(-2)
        g5 = grad_out.reshape(out5.shape).contiguous()
        dq5 = torch.zeros_like(q5)
        block = {"k": k5, "v": v5}
        grads = {"dk": torch.zeros_like(k5), "dv": torch.zeros_like(v5)}
        for s in range(p):
            # the keys and values move on before they are used (overlapping the computation),
            # their gradient accumulators once this rank has added its part
            requests, next_block = _pass_on(block, rank, p) if s < p - 1 else ([], {})
            theirs = rank_chunks((rank - s) % p, p, layout)
            backward_step(g5, q5, out5, lse5, block["k"], block["v"], dq5, grads["dk"],
                          grads["dv"], mine, theirs, c, n, causal, work)
            if p > 1:  # after the p-th pass the accumulators are back at their block's owner
                more, grads = _pass_on(grads, rank, p)
                requests += more
            for request in requests:
                request.wait()
            block = next_block
        return (dq5.reshape(q_shape), grads["dk"].reshape(k_shape),
                grads["dv"].reshape(v_shape), None, None, None, None)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                   layout: str = "zigzag", work: RingWork | None = None,
                   kernel: str = "tiles") -> Tensor:
    """This rank's rows of softmax(Q K^T / sqrt(D) + M) V over the whole sequence, by a ring.

    Call on every rank of the current process group (set up by the caller) with this rank's
    tokens, `shard_sequence(x, rank, p, layout)`: q (B, H, t, D), k, v (B, H_kv, t, D), the
    same shapes on every rank. -> (B, H, t, D), this rank's queries' outputs; differentiable.
    `work`, if given, records the score blocks this rank computes at each step. `kernel`:
    "tiles" (the flash chapter's tile update, written out) or "fused" (torch's CPU
    flash-attention kernel per block, merged by log-sum-exp; the same blocks, faster).
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise NoProcessGroupError("ring_attention runs on every rank of a torch.distributed "
                                  "process group, and this process belongs to none (call "
                                  "dist.init_process_group in every process first, or use "
                                  "simulate_ring_attention)")
    _check_inputs("ring_attention", q, k, v, causal, layout, work, RingWork)
    per_rank = len(rank_chunks(0, dist.get_world_size(), layout))
    if q.size(-2) % per_rank:
        raise ValueError(f"under the {layout} layout each rank holds {per_rank} equal chunks "
                         f"(the sequence cut into {chunk_count(dist.get_world_size(), layout)})"
                         f", so its length must be a multiple of {per_rank}, got {q.size(-2)}")
    _check_kernel(kernel)
    return _RingAttention.apply(q, k, v, causal, layout, work, kernel)


# ---- the same ring, p virtual ranks in one process ----

class _SimulatedRing(torch.autograd.Function):
    """The whole sequence in, the p virtual ranks played step by step, the whole output out."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, p: int, causal: bool, layout: str,
                works: list[RingWork] | None, kernel: str) -> Tensor:
        n = q.size(-2)
        c = _chunk_length(n, p, layout)
        chunks = [rank_chunks(r, p, layout) for r in range(p)]
        shards = [[shard_sequence(t, r, p, layout) for r in range(p)] for t in (q, k, v)]
        q5, k5, v5 = zip(*(_grouped(*(s[r] for s in shards)) for r in range(p)), strict=True)
        start, forward_step, finish, _ = _KERNELS[kernel]
        states = [start(q5[r], len(chunks[r]), c, v.size(-1)) for r in range(p)]
        for s in range(p):
            for r in range(p):  # rank r holds the block of rank (r - s) mod p
                src = (r - s) % p
                forward_step(q5[r], states[r], k5[src], v5[src], chunks[r], chunks[src], c, n,
                             causal, works[r] if works is not None else None)
        out5, lse5 = zip(*(finish(state) for state in states), strict=True)
        ctx.save_for_backward(*q5, *k5, *v5, *out5, *lse5)
        ctx.settings = (p, c, n, causal, layout, works, kernel, q.shape, k.shape, v.shape)
        return unshard_sequence([o.reshape(*q.shape[:-2], o.size(-2), v.size(-1))
                                 for o in out5], layout)  # (B, H, n, Dv)

    @staticmethod
    @once_differentiable  # as the real ring's
    def backward(ctx, grad_out: Tensor):
        p, c, n, causal, layout, works, kernel, q_shape, k_shape, v_shape = ctx.settings
        backward_step = _KERNELS[kernel][3]
        q5, k5, v5, out5, lse5 = (ctx.saved_tensors[i * p:(i + 1) * p] for i in range(5))
        chunks = [rank_chunks(r, p, layout) for r in range(p)]
        g5 = [shard_sequence(grad_out, r, p, layout).reshape(out5[r].shape).contiguous()
              for r in range(p)]
        dq5 = [torch.zeros_like(t) for t in q5]
        dk5 = [torch.zeros_like(t) for t in k5]  # block j's accumulators, wherever they are
        dv5 = [torch.zeros_like(t) for t in v5]
        for s in range(p):
            for r in range(p):
                src = (r - s) % p
                backward_step(g5[r], q5[r], out5[r], lse5[r], k5[src], v5[src], dq5[r],
                              dk5[src], dv5[src], chunks[r], chunks[src], c, n, causal,
                              works[r] if works is not None else None)

        def whole(parts: list[Tensor], shape: torch.Size) -> Tensor:
            return unshard_sequence([t.reshape(*shape[:-2], t.size(-2), t.size(-1))
                                     for t in parts], layout)

        return (whole(dq5, q_shape), whole(dk5, k_shape), whole(dv5, v_shape),
                None, None, None, None, None)


def simulate_ring_attention(q: Tensor, k: Tensor, v: Tensor, world_size: int,
                            causal: bool = False, layout: str = "zigzag",
                            work: list[RingWork] | None = None, kernel: str = "tiles"
                            ) -> Tensor:
    """Ring attention played by `world_size` virtual ranks in this process, no process group.

    q (B, H, n, D), k, v (B, H_kv, n, D): the whole sequence, dealt to the virtual ranks as
    `shard_sequence` deals it; every rank's step is the same function `ring_attention` calls,
    in the same order. -> (B, H, n, D) in sequence order; differentiable. `work`, if given (a
    list), is filled with one RingWork per virtual rank. `kernel` as in `ring_attention`.
    """
    _check_world_size(world_size)
    if work is not None and not isinstance(work, list):
        raise TypeError(f"work must be None or a list (to be filled with one RingWork per "
                        f"virtual rank), got {type(work).__name__}")
    _check_inputs("simulate_ring_attention", q, k, v, causal, layout, None, RingWork)
    check_ring(q.size(-2), world_size, layout)
    _check_kernel(kernel)
    if work is not None:
        work[:] = [RingWork() for _ in range(world_size)]
    return _SimulatedRing.apply(q, k, v, world_size, causal, layout, work, kernel)


# ---- checks ----

def check_ring(n: int, world_size: int, layout: str = "zigzag") -> int:
    """Tokens per rank, t = n / p, refusing (before any process starts) a sequence length that
    the layout cannot cut into equal chunks: 2p of them zig-zag, p contiguous."""
    _check_world_size(world_size)
    _check_layout(layout)
    if not is_int(n) or n < 1:
        raise ValueError(f"n (the sequence length) must be an int >= 1, got {n!r}")
    return _chunk_length(n, world_size, layout) * len(rank_chunks(0, world_size, layout))


def _check_world_size(world_size: object) -> None:
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")


def _check_kernel(kernel: object) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def _check_layout(layout: object) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _chunk_length(n: int, world_size: int, layout: str) -> int:
    """n / (number of chunks); a ValueError if the chunks would not be equal."""
    chunks = chunk_count(world_size, layout)
    if n % chunks or n == 0:
        raise ValueError(f"the {layout} layout cuts the sequence into {chunks} equal chunks "
                         f"({'2p' if layout == 'zigzag' else 'p'}, p = {world_size}): its "
                         f"length must be a positive multiple of {chunks}, got {n}")
    return n // chunks


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)}, dtype {value.dtype}"
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return f"{type(value).__name__} of " + ", ".join(
            str(tuple(t.shape)) if isinstance(t, Tensor) else type(t).__name__ for t in value)
    return type(value).__name__


def _check_tensor(x: object, name: str) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() < 2:
        raise TypeError(f"{name} must be a floating-point tensor (..., n, D), got "
                        f"{_describe(x)}")


def _check_inputs(owner: str, q: object, k: object, v: object, causal: object, layout: object,
                  work: object, work_type: type) -> None:
    """q (B, H, t, D), k (B, H_kv, t, D), v (B, H_kv, t, Dv): one floating dtype and device,
    H a multiple of H_kv; causal a bool; layout one of LAYOUTS; work None or a RingWork."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{owner} expects {name} to be a floating-point tensor, got "
                            f"{_describe(t)}")
        if t.dim() != 4:
            raise ValueError(f"{owner} expects {name} of shape (B, heads, length, head size), "
                             f"got {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"{owner} expects q, k, v of one dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"{owner} expects q, k, v on one device, got {q.device}, {k.device}, "
                         f"{v.device}")
    B, H, t, D = q.shape
    if (k.size(0) != B or k.size(2) != t or k.size(3) != D or v.shape[:3] != k.shape[:3]
            or k.size(1) == 0 or H % k.size(1) or D == 0 or v.size(3) == 0 or t == 0):
        raise ValueError(f"{owner} expects q (B, H, t, D), k (B, H_kv, t, D), v (B, H_kv, t, "
                         f"Dv) with H a multiple of H_kv and t, D, Dv >= 1, got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"{owner}: causal must be True or False, got {causal!r}")
    _check_layout(layout)
    if work is not None and not isinstance(work, work_type):
        raise TypeError(f"{owner}: work must be None or a RingWork, got {type(work).__name__}")
