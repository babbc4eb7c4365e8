"""Memory per rank and bytes sent per training step of each parallel strategy, computed from a
model's shapes (no weights: the model is built on the `meta` device) and following what the
code of tfbook.parallel actually does (issue 27's comparison table).

    w = Workload(GPTConfig.tiny(), batch_size=8, seq_len=64, world_size=2, n_micro=4)
    for row in cost_table(w):  print(row)      # or print(format_table(cost_table(w)))

Notation: N parameters (a tied matrix once) in P tensors, bytes per number e (4 for float32),
L blocks, B rows of T tokens, C width, H (H_kv) query (key/value) heads of size D, F hidden
units of the feed-forward layer, V vocabulary, p ranks, m micro-batches, b = B/m.

Memory per rank (between steps, plus the activations autograd keeps for the backward pass):

    strategy       weights          gradients        optimizer state        activations
    one process    N e              N e              S N e + s P            A(B, T)
    DDP            N e              N e              S N e + s P            A(B/p, T)
    ZeRO-1         N e              N e              S N_r e + s P_r        A(B/p, T)
    FSDP           sum_u N_u/p e    sum_u N_u/p e    S sum_u N_u/p e + s U  A(B/p, T)
    tensor         N_tp e           N_tp e           S N_tp e + s P         A_tp(B, T)
    pipeline       N_s e            N_s e            S N_s e + s P_s        k_s A_s(b, T)
    ring           N e              N e              S N e + s P            A(B, T/p)

S optimizer states per number (AdamW: m and v, S = 2) and s bytes of torch's step counter per
parameter tensor (a float32 scalar: s = 4). ZeRO-1's rank r owns N_r numbers in P_r tensors,
dealt out as `ShardedOptimizer` deals them (largest first, to the rank holding fewest). FSDP's
unit u (a block, or the root: everything else) is padded to N_u = p ceil(n_u / p), the padding
counted; U units; while a unit runs it is gathered whole (the root for the whole step and one
block at a time: `gathered`). Tensor parallelism splits the attention and MLP matrices
(`tfbook.parallel.tensor.shard_index`), replicates the rest. Pipeline stage s holds its blocks
(plus the embeddings on the first stage, the final norm and head on the last: a tied matrix is
held by both) and keeps k_s micro-batches' activations: m for GPipe, min(p - s, m) for 1F1B.

Bytes per step, two counts (`passed` and `wire`, per collective kind, on each rank):
- passed: the bytes of the tensor the rank hands to the call as its own part, what the
  measurement in tests/test_parallel_costs.py counts: the tensor of all_reduce, broadcast,
  send; the shard (input) of all_gather; the full (input) tensor of reduce_scatter.
- wire: the bytes the rank puts on the network with a bandwidth-optimal ring algorithm:
  all_reduce of n bytes 2 (p - 1)/p n (`ring_all_reduce_bytes`), all_gather (p - 1) x shard,
  reduce_scatter (p - 1)/p x input, point-to-point the tensor; a broadcast is counted as its
  owner sending the tensor to each of the p - 1 others (any broadcast tree moves the same
  (p - 1) n bytes in total; it only spreads them over other senders).

    DDP       all_reduce (N + P) e: DDPOverlap sends one has-gradient flag per parameter with
              each bucket (torch's DDP sends N e)
    ZeRO-1    DDP's all_reduce, plus broadcast N e: every parameter from its owner (torch's
              ZeroRedundancyOptimizer broadcasts too, per parameter or per bucket)
    FSDP      all_gather: every block's shard twice (forward, backward), the root's once;
              reduce_scatter: every unit's padded gradient N_u e
    tensor    all_reduce 4 L B T C e: 2 per block forward (after attention and MLP), 2 backward
    pipeline  send B T C e of activations to the next stage and B T C e of their gradients to
              the previous one; all_reduce V C e of a tied matrix between first and last stage
    ring      send per block 2 (p - 1) K/V blocks forward, 2 (p - 1) again backward plus 2 p
              gradient blocks (dK, dV), each B H_kv (T/p) D e; and DDP's all_reduce of the
              weights' gradients (each rank saw T/p of the tokens)

Activations A are counted tensor by tensor, what autograd keeps for the backward pass (equal
to the bytes of the saved tensors measured on CPU for tfbook's GPT-2 and Llama-style models
with torch's attention and F.cross_entropy; tfbook's cross_entropy keeps a few scalars more).
Per token and block: each of the two norms' input and output (C each) and statistics (mean and
1/std), or for RMSNorm input, normalised input and output and 1/rms; q, k, v, the attention
output and its log-sum-exp, H D + 2 H_kv D + H D + H (RoPE: the rotated copies, one more H D);
the feed-forward layer's F-wide tensors, 2 (MLP) or 4 (SwiGLU). Once per model: RoPE's cos and
sin tables (T D numbers), the int64 token ids (and positions), the final norm, the
log-probabilities (V per token) and the int64 targets. A tensor-parallel shard divides the
head and F terms by p.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from tfbook.config import is_int, is_number
from tfbook.models.gpt import GPT, GPTConfig, gpt_on_meta
from tfbook.parallel.pipeline import (
    SCHEDULES,
    GPTStage,
    bubble_fraction,
    check_pipeline,
    peak_activations,
    schedule_order,
)
from tfbook.parallel.ring import LAYOUTS, chunk_count
from tfbook.parallel.tensor import check_tensor_parallel, shard_index
from tfbook.parallel.zero import partition_parameters
from tfbook.train.distributed import check_shardable, ring_all_reduce_bytes

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
STRATEGIES = ("one process", "DDP", "ZeRO-1", "FSDP", "tensor", "pipeline", "ring")
KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "send")


@dataclass(frozen=True)
class Workload:
    """What is trained, how, and on how many ranks."""

    config: GPTConfig  # the model (GPT-2 or Llama-style blocks; built on `meta` for shapes)
    batch_size: int  # B, rows of the global batch
    seq_len: int  # T, tokens per row
    world_size: int  # p, ranks
    n_micro: int | None = None  # m, pipeline micro-batches; None = B (one row each)
    dtype: str = "float32"  # of weights, gradients, optimizer state and activations
    optimizer_states: int = 2  # S, numbers of state per weight (AdamW: m and v; SGD: 0)
    step_bytes: int = 4  # s, torch's per-tensor step counter (Adam/AdamW: a float32 scalar)
    schedule: str = "1f1b"  # pipeline schedule, "gpipe" or "1f1b"
    layout: str = "zigzag"  # ring attention's layout, "zigzag" or "contiguous"

    def __post_init__(self) -> None:
        if not isinstance(self.config, GPTConfig):
            raise TypeError(f"Workload: config must be a GPTConfig, got "
                            f"{type(self.config).__name__}")
        c = self.config
        if c.ffn not in ("mlp", "swiglu") or c.kv_lora_rank is not None:
            raise ValueError("Workload: the costs here count GPT-2 and Llama-style blocks (an "
                             "MLP or SwiGLU, multi-head or grouped attention); got ffn="
                             f"{c.ffn!r}, kv_lora_rank={c.kv_lora_rank!r}")
        for name, low in (("batch_size", 1), ("seq_len", 1), ("world_size", 1),
                          ("optimizer_states", 0), ("step_bytes", 0)):
            value = getattr(self, name)
            if not is_int(value) or value < low:
                raise ValueError(f"Workload: {name} must be an int >= {low}, got {value!r}")
        if self.seq_len > c.max_len:
            raise ValueError(f"Workload: seq_len={self.seq_len} is longer than the model's "
                             f"max_len={c.max_len}")
        if self.n_micro is not None and (not is_int(self.n_micro) or self.n_micro < 1):
            raise ValueError(f"Workload: n_micro must be None or an int >= 1, got "
                             f"{self.n_micro!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"Workload: dtype must be one of {tuple(DTYPE_BYTES)}, got "
                             f"{self.dtype!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Workload: schedule must be one of {SCHEDULES}, got "
                             f"{self.schedule!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"Workload: layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def element_size(self) -> int:
        """e, bytes per number."""
        return DTYPE_BYTES[self.dtype]

    @property
    def micro_batches(self) -> int:
        """m (B when n_micro is None)."""
        return self.batch_size if self.n_micro is None else self.n_micro


@dataclass(frozen=True)
class RankCost:
    """One rank's memory (bytes) and what it sends in one training step (bytes per kind)."""

    weights: int  # parameters held between steps
    gradients: int  # gradients held after the backward pass
    optimizer_state: int  # optimizer state (AdamW: m, v and the step counters)
    activations: int  # what autograd keeps for the backward pass, at its peak
    gathered: int = 0  # FSDP: the root unit and one block, gathered whole during the step
    # per collective kind (a key of KINDS, absent when 0): bytes handed to the calls, and
    # bytes sent on the wire by a ring algorithm
    passed: dict[str, int] = field(default_factory=dict)
    wire: dict[str, float] = field(default_factory=dict)

    @property
    def memory(self) -> int:
        """Everything above at its peak: weights, gathered, gradients, state, activations."""
        return (self.weights + self.gathered + self.gradients + self.optimizer_state
                + self.activations)

    @property
    def passed_total(self) -> int:
        return sum(self.passed.values())

    @property
    def wire_total(self) -> float:
        return sum(self.wire.values())


@dataclass(frozen=True)
class StrategyCost:
    """A strategy's costs on every rank; `feasible` False (and `reason`) when the workload
    cannot be split this way (then `ranks` is empty)."""

    strategy: str  # one of STRATEGIES
    world_size: int
    ranks: tuple[RankCost, ...]  # rank 0 .. p - 1 (one entry for "one process")
    pays_off: str  # when this strategy is worth it, in this workload's numbers
    note: str = ""  # what else the numbers depend on (bubble, which rank is largest...)
    feasible: bool = True
    reason: str = ""  # why not, when not feasible

    @property
    def largest(self) -> RankCost:
        """The rank with the most memory (the one that must fit on its device)."""
        return max(self.ranks, key=lambda r: r.memory)

    @property
    def busiest(self) -> RankCost:
        """The rank that passes the most bytes to collectives per step."""
        return max(self.ranks, key=lambda r: (r.passed_total, r.wire_total))


# ---- the model's shapes -------------------------------------------------------------------

@dataclass(frozen=True)
class _Shapes:
    numels: tuple[int, ...]  # every parameter (model.parameters() order; tied once)
    block: int  # numbers in one block
    root: int  # numbers outside the blocks (embeddings, final norm, head)


@functools.lru_cache(maxsize=32)
def _meta_model(config: GPTConfig) -> GPT:
    return gpt_on_meta(config)


@functools.lru_cache(maxsize=32)
def _shapes(config: GPTConfig) -> _Shapes:
    model = _meta_model(config)
    numels = tuple(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return _Shapes(numels, block, sum(numels) - config.n_layers * block)


def n_parameters(config: GPTConfig) -> int:
    """N: the model's distinct parameters (a tied matrix once), as count_parameters counts."""
    return sum(_shapes(config).numels)


def zero_partition(numels: list[int] | tuple[int, ...], world_size: int) -> list[list[int]]:
    """The parameter indices each rank owns under `ShardedOptimizer`'s rule
    (`tfbook.parallel.zero.partition_parameters`: largest first, each to the rank holding the
    fewest numbers so far), grouped by rank.

    [6, 1, 4, 3] over 2 ranks -> [[0, 1], [2, 3]] (6 + 1 and 4 + 3).
    """
    _check_world_size(world_size)
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for i, r in enumerate(partition_parameters(numels, world_size)):
        owned[r].append(i)
    return owned


def fsdp_units(config: GPTConfig, world_size: int) -> list[tuple[str, int, int]]:
    """(name, n, N = p ceil(n / p)) of every FSDP unit: the blocks, then the root."""
    _check_world_size(world_size)
    sh = _shapes(config)
    units = [(f"blocks.{i}", sh.block) for i in range(config.n_layers)] + [("", sh.root)]
    return [(name, n, -(-n // world_size) * world_size) for name, n in units]


def tensor_parallel_numels(config: GPTConfig, world_size: int) -> int:
    """Numbers a rank holds under tensor parallelism: the blocks' split matrices (by
    `shard_index`: 1/p of each), their norms and row-split biases whole, the rest whole."""
    check_tensor_parallel(config, world_size)
    model = _meta_model(config)
    block = model.blocks[0]
    params = dict(block.named_parameters())
    per_block = 0
    for name, (_, where) in shard_index(block, 0, world_size).items():
        per_block += torch.empty(params[name].shape, device="meta")[where].numel()
    return _shapes(config).root + config.n_layers * per_block


def stage_numels(config: GPTConfig, world_size: int) -> list[tuple[int, int]]:
    """(numbers, tensors) each pipeline stage holds (GPTStage's split of the blocks; a tied
    matrix on both the first and the last stage)."""
    check_pipeline(1, 1, "gpipe", world_size, config.n_layers)
    model = _meta_model(config)
    out = []
    for s in range(world_size):
        params = list(GPTStage(model, s, world_size).parameters())
        out.append((sum(p.numel() for p in params), len(params)))
    return out


# ---- activations -------------------------------------------------------------------------

def block_activation_numbers(config: GPTConfig, tokens: int, split: int = 1) -> int:
    """Numbers autograd keeps for one block's backward pass over `tokens` tokens (rows x
    positions): per token two norms' inputs, outputs and statistics, (H D + 2 H_kv D + H D
    + H) / split (q, k, v, attention output, log-sum-exp; RoPE: one more H D), F-wide
    tensors (2 for an MLP, 4 for SwiGLU) / split. `split` = p for a tensor-parallel shard
    (heads and hidden units divided)."""
    c = config
    C, D, H = c.d_model, c.head_size, c.n_heads
    H_kv = c.n_kv_heads or H
    F = 4 * C if c.d_ff is None else c.d_ff
    norms = 2 * _norm_numbers(c)  # before attention and before the feed-forward layer
    rope = c.position == "rope"  # the rotated q and k are copies: one more H D kept
    attention = ((3 if rope else 2) * H * D + 2 * H_kv * D + H) // split
    ffn = (4 if c.ffn == "swiglu" else 2) * F // split
    return tokens * (norms + attention + ffn)


def _norm_numbers(config: GPTConfig) -> int:
    """Per token, what one norm keeps: input and output (C each) and mean and 1/std for a
    LayerNorm; input, normalised input, output (C each) and 1/rms for tfbook's RMSNorm."""
    return 2 * config.d_model + 2 if config.norm == "layer" else 3 * config.d_model + 1


def activation_bytes(workload: Workload, rows: int, seq_len: int, blocks: int,
                     first: bool = True, last: bool = True, split: int = 1) -> int:
    """Bytes of activations kept for `blocks` blocks over rows x seq_len tokens, plus the
    token ids (first stage) and the final norm and log-probabilities (last stage)."""
    c, e = workload.config, workload.element_size
    tokens = rows * seq_len
    n = blocks * block_activation_numbers(c, tokens, split) * e
    if blocks and c.position == "rope":  # cos and sin (T, D/2) each, shared by the blocks
        n += seq_len * c.head_size * e
    if first:  # the int64 token ids (and positions, for learned position embeddings)
        n += 8 * tokens + (8 * seq_len if c.position == "learned" else 0)
    if last:  # final norm, log-probabilities; the int64 targets and the loss's total weight
        n += (tokens * (_norm_numbers(c) + c.vocab_size) + 1) * e + 8 * tokens
    return n


# ---- the strategies ----------------------------------------------------------------------

def _state(workload: Workload, numbers: int, tensors: int) -> int:
    return workload.optimizer_states * numbers * workload.element_size \
        + workload.step_bytes * tensors


def _ddp_traffic(workload: Workload) -> tuple[int, float]:
    """(passed, wire) of DDPOverlap's bucket all-reduces: gradients plus one flag each."""
    sh = _shapes(workload.config)
    n = (sum(sh.numels) + len(sh.numels)) * workload.element_size
    return n, ring_all_reduce_bytes(n, workload.world_size)


def one_process(workload: Workload) -> StrategyCost:
    """Everything on one rank (world_size is ignored)."""
    w, sh = workload, _shapes(workload.config)
    N, e = sum(sh.numels), w.element_size
    rank = RankCost(N * e, N * e, _state(w, N, len(sh.numels)),
                    activation_bytes(w, w.batch_size, w.seq_len, w.config.n_layers))
    need = format_bytes(rank.memory)
    return StrategyCost("one process", 1, (rank,),
                        f"when the {need} of a step fit one device and one device finishes the "
                        "run in time: nothing to communicate")


def ddp(workload: Workload) -> StrategyCost:
    """`DDPOverlap`: a whole replica per rank, B/p rows each, gradients all-reduced."""
    w, sh = workload, _shapes(workload.config)
    p = w.world_size
    b = check_shardable(w.batch_size, p)
    N, e = sum(sh.numels), w.element_size
    passed, wire = _ddp_traffic(w)
    rank = RankCost(N * e, N * e, _state(w, N, len(sh.numels)),
                    activation_bytes(w, b, w.seq_len, w.config.n_layers),
                    passed={"all_reduce": passed}, wire={"all_reduce": wire})
    replica, grads = format_bytes(rank.memory), format_bytes(passed)
    return StrategyCost("DDP", p, (rank,) * p,
                        f"when a whole replica ({replica} a rank) fits a device and the "
                        f"all-reduce of the {grads} of gradients hides behind the backward pass "
                        "(its wire time < the step's compute)")


def zero1(workload: Workload) -> StrategyCost:
    """DDPOverlap + `ShardedOptimizer`: optimizer state split by whole parameters."""
    w, sh = workload, _shapes(workload.config)
    p = w.world_size
    b = check_shardable(w.batch_size, p)
    N, e = sum(sh.numels), w.element_size
    passed, wire = _ddp_traffic(w)
    act = activation_bytes(w, b, w.seq_len, w.config.n_layers)
    ranks = []
    for owned in zero_partition(sh.numels, p):
        mine = sum(sh.numels[i] for i in owned)
        ranks.append(RankCost(N * e, N * e, _state(w, mine, len(owned)), act,
                              passed={"all_reduce": passed, "broadcast": N * e},
                              wire={"all_reduce": wire, "broadcast": (p - 1) * mine * e}))
    replica = _state(w, N, len(sh.numels))
    saved = replica - max(r.optimizer_state for r in ranks)
    share = replica / (replica + 2 * N * e + act)
    return StrategyCost(
        "ZeRO-1", p, tuple(ranks),
        f"when optimizer state is a large part of a replica (here {share:.0%}): it saves "
        f"{format_bytes(saved)} a rank for a broadcast of the {format_bytes(N * e)} of "
        "weights per step on top of DDP's all-reduce",
        note="shares are whole parameters, so the ranks' states differ slightly")


def fsdp(workload: Workload) -> StrategyCost:
    """`FSDP`: every unit flattened, padded to a multiple of p and sharded."""
    w = workload
    p, e = w.world_size, w.element_size
    b = check_shardable(w.batch_size, p)
    units = fsdp_units(w.config, p)
    shard = sum(N // p for _, _, N in units)
    blocks = [N for name, _, N in units if name]
    root = units[-1][2]
    gathers = sum(2 * N // p for N in blocks) + root // p
    reduced = sum(N for _, _, N in units)
    rank = RankCost(
        shard * e, shard * e, _state(w, shard, len(units)),
        activation_bytes(w, b, w.seq_len, w.config.n_layers),
        gathered=(root + max(blocks)) * e,
        passed={"all_gather": gathers * e, "reduce_scatter": reduced * e},
        wire={"all_gather": (p - 1) * gathers * e,
              "reduce_scatter": (p - 1) * reduced * e / p})
    n = n_parameters(w.config)
    whole = n * e * (2 + w.optimizer_states)
    kept = format_bytes(rank.weights + rank.gradients + rank.optimizer_state)
    ratio = rank.wire_total / ring_all_reduce_bytes(n * e, p) if p > 1 else math.nan
    return StrategyCost(
        "FSDP", p, (rank,) * p,
        f"when weights, gradients and state ({format_bytes(whole)}) do not fit a device: a "
        f"rank keeps {kept} of them plus the {format_bytes(rank.gathered)} it gathers, for "
        f"{ratio:.2f}x DDP's bytes on the wire" if p > 1 else "never on one rank (overhead)",
        note=f"padding: {sum(N - k for _, k, N in units)} numbers over {len(units)} units")


def tensor_parallel(workload: Workload) -> StrategyCost:
    """`tensor_parallel_model`: every block's attention split by heads and MLP by hidden
    units; embeddings, norms and head replicated; the whole batch on every rank."""
    w = workload
    p, e, c = w.world_size, w.element_size, w.config
    held = tensor_parallel_numels(c, p)
    tensors = len(_shapes(c).numels)
    activations = activation_bytes(w, w.batch_size, w.seq_len, c.n_layers, split=p)
    n = 4 * c.n_layers * w.batch_size * w.seq_len * c.d_model * e
    rank = RankCost(held * e, held * e, _state(w, held, tensors), activations,
                    passed={"all_reduce": n}, wire={"all_reduce": ring_all_reduce_bytes(n, p)})
    return StrategyCost(
        "tensor", p, (rank,) * p,
        f"when one layer's matrices or activations are too big for a device and links are "
        f"fast: {4 * c.n_layers} all-reduces of B T C per step ({format_bytes(n)}), each one "
        "waited for before the next layer can start",
        note="the embeddings, norms and head are replicated; only the blocks' heads and hidden "
             "units are split")


def pipeline(workload: Workload) -> StrategyCost:
    """`pipeline_step`: p stages of consecutive blocks, m micro-batches of B/m rows."""
    w = workload
    p, m, e, c = w.world_size, w.micro_batches, w.element_size, w.config
    b = check_pipeline(w.batch_size, m, w.schedule, p, c.n_layers)
    boundary = w.batch_size * w.seq_len * c.d_model * e  # B T C: m messages of b T C
    tied = c.tie_weights and p > 1
    ranks = []
    for s, (numbers, tensors) in enumerate(stage_numels(c, p)):
        blocks = (s + 1) * c.n_layers // p - s * c.n_layers // p
        held = peak_activations(schedule_order(w.schedule, s, p, m))
        passed, wire = {}, {}
        sends = boundary * ((s < p - 1) + (s > 0))
        if sends:
            passed["send"] = wire["send"] = sends
        if tied and s in (0, p - 1):
            passed["all_reduce"] = c.vocab_size * c.d_model * e
            wire["all_reduce"] = ring_all_reduce_bytes(passed["all_reduce"], 2)
        ranks.append(RankCost(
            numbers * e, numbers * e, _state(w, numbers, tensors),
            held * activation_bytes(w, b, w.seq_len, blocks, s == 0, s == p - 1),
            passed=passed, wire=wire))
    bubble = bubble_fraction(p, m)
    return StrategyCost(
        "pipeline", p, tuple(ranks),
        f"when the layers do not fit one device and m >> p: here m = {m}, p = {p}, a bubble of "
        f"(p-1)/(m+p-1) = {bubble:.0%}; only {format_bytes(boundary)} of activations cross each "
        "stage boundary per step, each way",
        note=f"{w.schedule}: stage s keeps {'m' if w.schedule == 'gpipe' else 'min(p-s, m)'} "
             "micro-batches' activations")


def ring_bytes_per_block(workload: Workload) -> dict[str, int]:
    """Bytes one rank sends for one block's ring attention: "forward" 2 (p - 1) blocks of K
    and V, "backward" 2 (p - 1) again plus 2 p of their gradients, B H_kv (T/p) D e each."""
    w, c = workload, workload.config
    p = w.world_size
    chunks = chunk_count(p, w.layout)
    if w.seq_len % chunks:
        raise ValueError(f"ring attention's {w.layout} layout cuts the sequence into {chunks} "
                         f"equal chunks: seq_len must be a multiple of {chunks}, got "
                         f"{w.seq_len}")
    kv = w.batch_size * (c.n_kv_heads or c.n_heads) * (w.seq_len // p) * c.head_size \
        * w.element_size
    if p == 1:
        return {"forward": 0, "backward": 0}
    return {"forward": 2 * (p - 1) * kv, "backward": 2 * (p - 1) * kv + 2 * p * kv}


def ring(workload: Workload) -> StrategyCost:
    """Context parallelism: T/p tokens per rank, `ring_attention` in every block, the
    weights' gradients all-reduced as in DDP."""
    w, sh = workload, _shapes(workload.config)
    p, c = w.world_size, w.config
    per_block = ring_bytes_per_block(w)
    sends = c.n_layers * (per_block["forward"] + per_block["backward"])
    N, e = sum(sh.numels), w.element_size
    passed, wire = _ddp_traffic(w)
    rank = RankCost(N * e, N * e, _state(w, N, len(sh.numels)),
                    activation_bytes(w, w.batch_size, w.seq_len // p, c.n_layers),
                    passed={"all_reduce": passed, "send": sends},
                    wire={"all_reduce": wire, "send": sends})
    whole = activation_bytes(w, w.batch_size, w.seq_len, c.n_layers)
    return StrategyCost(
        "ring", p, (rank,) * p,
        f"when T is long: a rank keeps the activations of T/p = {w.seq_len // p} tokens "
        f"({format_bytes(rank.activations)} instead of {format_bytes(whole)}); the K/V blocks "
        f"({format_bytes(sends)} per step) travel while each rank works on the one it holds",
        note="the ring of tfbook.parallel.ring is the attention; the rest of the model is "
             "per token (split by T/p without communication)")


FUNCTIONS = {"one process": one_process, "DDP": ddp, "ZeRO-1": zero1, "FSDP": fsdp,
             "tensor": tensor_parallel, "pipeline": pipeline, "ring": ring}


def strategy_costs(workload: Workload) -> list[StrategyCost]:
    """Every strategy's costs (STRATEGIES order); one the workload cannot be split by comes
    back with feasible=False and the reason (the strategy's own ValueError)."""
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a Workload, got {type(workload).__name__}")
    out = []
    for name in STRATEGIES:
        try:
            out.append(FUNCTIONS[name](workload))
        except ValueError as error:
            out.append(StrategyCost(name, workload.world_size, (), "", feasible=False,
                                    reason=str(error)))
    return out


# ---- the table ---------------------------------------------------------------------------

def format_bytes(n: float) -> str:
    """Decimal units, 3 significant digits: 1234567 -> '1.23 MB'."""
    if not is_number(n) or not 0 <= n < math.inf:
        raise ValueError(f"n must be a finite number of bytes >= 0, got {n!r}")
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def cost_table(workload: Workload) -> list[dict[str, str]]:
    """One row a strategy, as text: memory of the largest rank (weights + gathered, grads,
    state, activations, total), bytes per step of the busiest rank (passed to collectives,
    and on the wire of a ring algorithm, with the split by kind), when it pays off."""
    rows = []
    for cost in strategy_costs(workload):
        if not cost.feasible:
            rows.append({"strategy": cost.strategy, "weights": "-", "grads": "-",
                         "state": "-", "activations": "-", "memory": "-", "passed": "-",
                         "wire": "-", "by kind": "-",
                         "pays off": "not possible here: " + cost.reason})
            continue
        big, busy = cost.largest, cost.busiest
        weights = format_bytes(big.weights)
        if big.gathered:
            weights += f" (+{format_bytes(big.gathered)} gathered)"
        rows.append({
            "strategy": cost.strategy, "weights": weights,
            "grads": format_bytes(big.gradients), "state": format_bytes(big.optimizer_state),
            "activations": format_bytes(big.activations), "memory": format_bytes(big.memory),
            "passed": format_bytes(busy.passed_total), "wire": format_bytes(busy.wire_total),
            "by kind": ", ".join(f"{k} {format_bytes(v)}" for k, v in busy.passed.items())
            or "-",
            "pays off": cost.pays_off})
    return rows


def format_table(rows: list[dict[str, str]], columns: tuple[str, ...] = (
        "strategy", "weights", "grads", "state", "activations", "memory", "passed", "wire"),
        ) -> str:
    """The rows as aligned text (the `pays off` column is long: print it apart)."""
    widths = [max(len(c), *(len(r[c]) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(n) for c, n in zip(columns, widths, strict=True))]
    lines += ["  ".join(r[c].ljust(n) for c, n in zip(columns, widths, strict=True))
              for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _check_world_size(world_size: object) -> None:
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
