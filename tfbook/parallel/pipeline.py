"""Pipeline parallelism of the book's GPT (Huang et al. 2019, GPipe; Narayanan et al. 2021,
1F1B with a flush, "PipeDream-Flush").

The model is cut into p consecutive stages, one per process: stage 0 holds the embeddings and
the first blocks, the last stage the last blocks, the final norm, the head and the loss. A batch
of B rows is cut into m micro-batches of B/m rows; each stage sends its output activations
(B/m, T, C) to the next with `dist.send`/`recv`, and the gradient of the loss with respect to
them back. Two orders of the same work (F_i: forward of micro-batch i, B_i: its backward):

    GPipe  stage s: F_0 F_1 ... F_{m-1}  B_0 B_1 ... B_{m-1}      keeps m activations alive
    1F1B   stage s: w = min(p - 1 - s, m) warm-up forwards, then F and B alternate
                    (one forward, one backward), then the last w backwards; keeps p - s alive

Both leave stage s idle for the same (p - 1) slots of forward plus backward while the pipe
fills and drains, a bubble of (p - 1) / (m + p - 1) of the step when every stage takes the same
time; 1F1B's gain is memory (activations in flight), not time.

Loss convention. Here each micro-batch's loss (the mean over its B/m T tokens) is divided by m
before its backward, so the gradients summed over the micro-batches are those of the mean loss
over the whole batch, as one process computes them. torch.distributed.pipelining's schedules
(`scale_grads=True`, the default) run the backward of each micro-batch's loss undivided and
divide the summed gradients by m afterwards: the same gradients (for m a power of two, even
the same roundings). With `scale_grads=False` torch's would be m times ours (the sum of the
micro-batch means).

A tied embedding and head (GPT-2) live on the first and the last stage: each holds its own copy
and gets part of the gradient; `sync_tied_gradients` adds the two parts, as Megatron-LM does.
Shape legend: B batch, m micro-batches, b = B/m rows each, T positions, C width, V vocabulary,
p stages (= processes).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tfbook.config import is_int, is_number
from tfbook.losses import cross_entropy
from tfbook.models.gpt import GPT
from tfbook.parallel.ddp import require_process_group

SCHEDULES = ("gpipe", "1f1b")


class GPTStage(nn.Module):
    """Stage `stage` of `n_stages` of a GPT: blocks [s L/p, (s + 1) L/p) (L blocks), with the
    embeddings on the first stage and the final norm and head on the last. The modules are the
    model's own (not copies); parameter names are the GPT's ("blocks.3.attn...").

    forward: stage 0 takes token ids (b, T), the others activations (b, T, C); the last
    returns logits (b, T, V), the others activations (b, T, C).
    """

    def __init__(self, model: GPT, stage: int, n_stages: int) -> None:
        super().__init__()
        if not isinstance(model, GPT):
            raise TypeError(f"model must be a tfbook GPT, got {type(model).__name__}")
        L = len(model.blocks)
        if not is_int(n_stages) or not 1 <= n_stages <= L:
            raise ValueError(f"n_stages must be an int in [1, {L}] (each stage holds at least "
                             f"one of the model's {L} blocks), got {n_stages!r}")
        if not is_int(stage) or not 0 <= stage < n_stages:
            raise ValueError(f"stage must be an int in [0, {n_stages}), got {stage!r}")
        self.stage, self.n_stages = stage, n_stages
        self.first, self.last = stage == 0, stage == n_stages - 1
        lo, hi = stage * L // n_stages, (stage + 1) * L // n_stages
        self.layers = range(lo, hi)  # which of the model's blocks this stage runs
        if self.first:
            self.tok_emb, self.pos_emb, self.dropout = model.tok_emb, model.pos_emb, model.dropout
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in self.layers})
        if self.last:
            self.norm_f, self.lm_head = model.norm_f, model.lm_head
        self.tied = model.config.tie_weights and n_stages > 1
        self.d_model, self.vocab_size = model.config.d_model, model.config.vocab_size
        self._rope_table = model.rope_table  # a method: the model's modules are not registered

    def forward(self, x: Tensor) -> Tensor:
        """ids (b, T) on stage 0, else activations (b, T, C) -> activations or logits."""
        T = x.size(1)
        positions = torch.arange(T, device=x.device)  # (T,): a whole window from position 0
        if self.first:
            x = self.tok_emb(x)  # (b, T, C)
            if self.pos_emb is not None:
                x = self.pos_emb(x, positions)
            x = self.dropout(x)
        rope_table = self._rope_table(positions, x.dtype)
        for block in self.blocks.values():
            x, _ = block(x, causal=True, positions=positions, rope_table=rope_table)
        if self.last:
            x = self.lm_head(self.norm_f(x))  # (b, T, V)
        return x

    def tied_weight(self) -> nn.Parameter | None:
        """The copy of the tied embedding/head matrix this stage holds, if any."""
        if not self.tied:
            return None
        if self.first:
            return self.tok_emb.weight
        return self.lm_head.weight if self.last else None


def sync_tied_gradients(stage: GPTStage, group: dist.ProcessGroup | None = None) -> None:
    """Add the first and last stages' gradients of a tied embedding/head matrix (both then
    hold the gradient one process computes). `group` holds exactly those two ranks; None
    means the default group, which must then have only them (p = 2)."""
    weight = stage.tied_weight()
    if weight is None:
        return
    _check_group("sync_tied_gradients", group)
    if dist.get_world_size(group) != 2:
        raise ValueError("sync_tied_gradients: group must hold exactly the first and the last "
                         f"stage, got {dist.get_world_size(group)} ranks")
    if weight.grad is None:
        weight.grad = torch.zeros_like(weight)
    dist.all_reduce(weight.grad, group=group)


def schedule_order(schedule: str, stage: int, n_stages: int, n_micro: int
                   ) -> list[tuple[str, int]]:
    """The operations stage s runs, in order: ("F", i) forward, ("B", i) backward of
    micro-batch i."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    for name, value, low in (("n_stages", n_stages, 1), ("n_micro", n_micro, 1)):
        if not is_int(value) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not is_int(stage) or not 0 <= stage < n_stages:
        raise ValueError(f"stage must be an int in [0, {n_stages}), got {stage!r}")
    m = n_micro
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(n_stages - 1 - stage, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def peak_activations(order: list[tuple[str, int]]) -> int:
    """Most micro-batches whose forward has run and backward not yet (activations kept)."""
    alive = peak = 0
    for kind, _ in order:
        alive += 1 if kind == "F" else -1
        peak = max(peak, alive)
    return peak


def bubble_fraction(n_stages: int, n_micro: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of each stage when all stages take equal time."""
    for name, value in (("n_stages", n_stages), ("n_micro", n_micro)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return (n_stages - 1) / (n_micro + n_stages - 1)


def simulate(schedule: str, n_stages: int, n_micro: int,
             t_forward: float | Sequence[float] = 1.0,
             t_backward: float | Sequence[float] = 2.0) -> list[dict[str, float]]:
    """Play the schedule with fixed op times and free communication; per stage: "busy",
    "span" (time 0 to the end of the step) and "bubble" = 1 - busy / span. A time is one
    number for every stage, or one per stage (measured ones, `PipelineStats.op_times`)."""
    p, m = n_stages, n_micro
    orders = [schedule_order(schedule, s, p, m) for s in range(p)]  # checks the arguments
    times = {"F": _per_stage("t_forward", t_forward, p),
             "B": _per_stage("t_backward", t_backward, p)}
    done: dict[tuple[int, str, int], float] = {}  # (stage, kind, micro) -> end time
    free = [0.0] * p  # when each stage finishes its last scheduled op
    nxt = [0] * p
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if nxt[s] == len(orders[s]):
                continue
            kind, i = orders[s][nxt[s]]
            dep = (s - 1, "F", i) if kind == "F" else (s + 1, "B", i)
            if (kind == "F" and s == 0) or (kind == "B" and s == p - 1):
                ready = 0.0
            elif dep in done:
                ready = done[dep]
            else:
                continue
            free[s] = done[(s, kind, i)] = max(free[s], ready) + times[kind][s]
            nxt[s] += 1
            progressed = True
        if not progressed:  # cannot happen for the two schedules here
            raise RuntimeError(f"schedule {schedule!r} deadlocks")
    end = max(free)
    busy = [m * (times["F"][s] + times["B"][s]) for s in range(p)]
    return [{"busy": busy[s], "span": end, "bubble": 1 - busy[s] / end} for s in range(p)]


def _per_stage(name: str, value: float | Sequence[float], n_stages: int) -> list[float]:
    values = [value] * n_stages if is_number(value) else value
    if (not isinstance(values, Sequence) or len(values) != n_stages
            or not all(is_number(v) and 0 < v < float("inf") for v in values)):
        raise ValueError(f"{name} must be a finite number > 0, or {n_stages} of them (one per "
                         f"stage), got {value!r}")
    return [float(v) for v in values]


@dataclass
class PipelineStats:
    """What one pipelined step measured on one stage (wall-clock, this process)."""

    stage: int
    schedule: str
    n_micro: int
    losses: list[float] = field(default_factory=list)  # each micro-batch's mean loss (last)
    ops: list[tuple[str, int, float, float]] = field(default_factory=list)  # kind, i, start, end
    span: float = 0.0  # seconds of the step: the common start (a barrier) to the last stage's end
    peak_activations: int = 0  # most micro-batches whose activations were kept at once

    @property
    def busy(self) -> float:
        """Seconds spent computing (forwards and backwards, sends and receives excluded)."""
        return sum(end - start for _, _, start, end in self.ops)

    @property
    def op_times(self) -> tuple[float, float]:
        """Mean seconds of one forward and of one backward on this stage."""
        f = [end - start for kind, _, start, end in self.ops if kind == "F"]
        b = [end - start for kind, _, start, end in self.ops if kind == "B"]
        return sum(f) / len(f), sum(b) / len(b)

    @property
    def bubble(self) -> float:
        """Measured idle share of this stage's step: 1 - busy / span."""
        return 1 - self.busy / self.span if self.span > 0 else 0.0


def _check_group(what: str, group: dist.ProcessGroup | None) -> None:
    del group  # a sub-group exists only inside the default one
    require_process_group(f"{what} (one rank per stage)")


def check_pipeline(batch_size: int, n_micro: int, schedule: str = "gpipe",
                   n_stages: int = 1, n_layers: int | None = None) -> int:
    """Rows per micro-batch, B / m; refuse (before any process starts) an m that does not
    divide B, an unknown schedule, and more stages than the model has blocks."""
    if n_layers is not None and (not is_int(n_stages) or not 1 <= n_stages <= n_layers):
        raise ValueError(f"n_stages must be an int in [1, {n_layers}] (each stage holds at "
                         f"least one of the model's {n_layers} blocks), got {n_stages!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    for name, value in (("batch_size", batch_size), ("n_micro", n_micro)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if batch_size % n_micro:
        raise ValueError(f"a batch of {batch_size} rows cannot be cut into {n_micro} equal "
                         "micro-batches: batch_size must be a multiple of n_micro")
    return batch_size // n_micro


def pipeline_step(stage: GPTStage, idx: Tensor, targets: Tensor, n_micro: int,
                  schedule: str = "gpipe", group: dist.ProcessGroup | None = None
                  ) -> PipelineStats:
    """One forward and backward of the batch (idx, targets) (B, T) through the pipeline,
    micro-batch by micro-batch in `schedule`'s order; gradients accumulate in the stage's
    parameters (d mean-loss / d w, as one process), the tied matrix's included once
    `sync_tied_gradients` has run. Every rank calls it with its own stage (rank = stage
    index) and the same batch (stage 0 reads idx, the last stage targets)."""
    if not isinstance(stage, GPTStage):
        raise TypeError(f"stage must be a GPTStage, got {type(stage).__name__}")
    _check_group("pipeline_step", group)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world != stage.n_stages or rank != stage.stage:
        raise ValueError(f"pipeline_step: rank {rank} of {world} must run stage {rank} of "
                         f"{world}, got stage {stage.stage} of {stage.n_stages}")
    if not (isinstance(idx, Tensor) and isinstance(targets, Tensor) and idx.dim() == 2
            and idx.shape == targets.shape):
        raise ValueError("idx and targets must be tensors of one shape (B, T), got "
                         f"{_shape(idx)} and {_shape(targets)}")
    b = check_pipeline(idx.size(0), n_micro, schedule)
    order = schedule_order(schedule, stage.stage, stage.n_stages, n_micro)
    T = idx.size(1)
    dtype = next(stage.parameters()).dtype
    prev, nxt = stage.stage - 1, stage.stage + 1
    inputs: dict[int, Tensor] = {}  # micro-batch -> the activation received (needs its grad)
    outputs: dict[int, Tensor] = {}  # micro-batch -> this stage's output (or loss)
    stats = PipelineStats(stage.stage, schedule, n_micro)
    # sends are isend: in 1F1B two neighbours can send to each other at the same moment
    # (an activation one way, a gradient the other), and neither must wait for the other's
    # receive; each is waited for at the end, and its tensor kept alive until then
    sends: list[tuple[dist.Work, Tensor]] = []
    dist.barrier(group)
    t0 = time.perf_counter()
    for kind, i in order:
        rows = slice(i * b, (i + 1) * b)
        if kind == "F":
            if stage.first:
                x = idx[rows]  # (b, T) token ids
            else:
                x = torch.empty(b, T, stage.d_model, dtype=dtype)
                dist.recv(x, _global(prev, group), group=group)
                x.requires_grad_()
                inputs[i] = x
            start = time.perf_counter()
            y = stage(x)
            if stage.last:
                loss = cross_entropy(y, targets[rows])
                stats.losses.append(float(loss.detach()))
                y = loss / n_micro  # the mean over the whole batch, as one process
            outputs[i] = y
            stats.peak_activations = max(stats.peak_activations, len(outputs))
            stats.ops.append(("F", i, start - t0, time.perf_counter() - t0))
            if not stage.last:
                message = y.detach().contiguous()  # (b, T, C)
                sends.append((dist.isend(message, _global(nxt, group), group=group), message))
        else:
            grad = None
            if not stage.last:
                grad = torch.empty(b, T, stage.d_model, dtype=dtype)
                dist.recv(grad, _global(nxt, group), group=group)
            start = time.perf_counter()
            outputs.pop(i).backward(grad)
            stats.ops.append(("B", i, start - t0, time.perf_counter() - t0))
            if not stage.first:
                message = inputs.pop(i).grad.contiguous()  # (b, T, C): dL/d(input)
                sends.append((dist.isend(message, _global(prev, group), group=group), message))
    for work, _ in sends:
        work.wait()
    # the step ends when its last stage does: the latest end over the stages
    span = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(span, op=dist.ReduceOp.MAX, group=group)
    stats.span = float(span)
    return stats


def _global(rank: int, group: dist.ProcessGroup | None) -> int:
    """A group rank as the global rank send/recv address."""
    return rank if group is None else dist.get_global_rank(group, rank)


def _shape(value: object) -> str:
    return str(tuple(value.shape)) if isinstance(value, Tensor) else type(value).__name__
