"""Data parallelism (Li et al. 2020, "PyTorch Distributed"): p processes, one model replica each.

Every process (a rank) holds the whole model. Wrapping it (DDP, or `replicate` by hand)
broadcasts rank 0's parameters and buffers, so every replica starts from the same weights
whatever each rank built. At each step all ranks
draw the same global batch of B rows, each keeps its own B / p rows, computes the loss and the
gradients on them, and the gradients are averaged across ranks by an all-reduce; every rank
then takes the same optimiser step with the same averaged gradient, so the replicas stay
identical:

    global batch (B, T)   -> rank r keeps rows [r B/p, (r + 1) B/p)      # shard (B/p, T)
    g_r = d mean-loss(shard r) / d w
    g   = (g_0 + g_1 + ... + g_{p-1}) / p    # all-reduce (sum) then divide by p
        = d mean-loss(global batch) / d w    # when every shard counts the same tokens
    w  <- AdamW(w, g)                        # the same update on every rank

Two ways to average, compared in the book: `DistributedDataParallel` (gradients grouped into
buckets, each all-reduced while the rest of the backward pass still runs) and a hand-written
hook per parameter (all-reduce that one gradient, divide by p). Both run inside the book's one
training loop, `tfbook.train.loop.train`: only `next_batch` (this rank's shard) and the model
(wrapped, or hooked) change.

Processes talk through torch.distributed's gloo backend on 127.0.0.1, so this runs on any CPU.
`run_data_parallel` starts them with torch.multiprocessing.spawn (the worker lives here, so a
notebook can start it); `scripts/ddp_train.py` is the same training under torchrun.
Shape legend: B global batch, b = B / p rows per rank, T window length, p world size.
"""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from tfbook.config import check_choice, is_int, is_number
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.train.data import random_windows
from tfbook.train.loop import TrainConfig, train
from tfbook.train.optim import adamw

SYNCS = ("ddp", "allreduce")  # how gradients are averaged: DDP, or one hook per parameter
OPTIMIZERS = ("adamw", "sgd")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class Variant:
    """One way to run the same training: gradient averaging, optimiser and number format."""

    sync: str = "ddp"  # "ddp" (DistributedDataParallel) or "allreduce" (hand-written hooks)
    optimizer: str = "adamw"  # "adamw" (the loop's AdamW) or "sgd" (plain w <- w - lr g)
    dtype: str = "float32"  # "float32" or "float64" weights, activations and gradients
    lr: float | None = None  # peak learning rate; None = the TrainConfig's
    # build rank r's model from seed + r: the replicas then start apart, and only the
    # broadcast of rank 0's weights when the model is wrapped makes them equal
    rank_seeds: bool = False

    def __post_init__(self) -> None:
        check_choice(self, "sync", SYNCS)
        check_choice(self, "optimizer", OPTIMIZERS)
        check_choice(self, "dtype", tuple(DTYPES))
        if not isinstance(self.rank_seeds, bool):
            raise TypeError(f"Variant: rank_seeds must be True or False, got {self.rank_seeds!r}")
        if self.lr is not None and (not is_number(self.lr) or not 0 < self.lr < float("inf")):
            raise ValueError(f"Variant: lr must be a finite number > 0 or None, got {self.lr!r}")


@dataclass
class RunResult:
    """What one training run measured in one process."""

    rank: int  # this process's rank (0 for a single process)
    world_size: int  # number of processes that trained together
    first_grads: dict[str, Tensor]  # the gradients the optimiser received at step 0
    weights: dict[str, Tensor]  # the parameters after the last step (a tied matrix once)
    losses: list[float] = field(default_factory=list)  # loss on this rank's rows, per step
    seconds: float = 0.0  # wall-clock time inside train()
    cpu_seconds: float = 0.0  # CPU time of this process (all its threads) inside train()
    # all parameters as one flat vector (named_parameters order) after k optimiser steps
    snapshots: dict[int, Tensor] = field(default_factory=dict)
    # sum of every parameter (float64) as this rank built them, before DDP's broadcast
    start_checksum: float = 0.0


@dataclass
class DataParallelResult:
    """Results of one launch of p processes that ran one or more variants in turn."""

    runs: list[list[RunResult]]  # runs[v][r]: variant v on rank r
    seconds: float  # wall-clock time of the launch: start-up, every run, teardown

    def global_losses(self, variant: int = 0) -> list[float]:
        """Mean of the ranks' losses at each step = the loss of the global batch."""
        ranks = self.runs[variant]
        return [sum(r.losses[i] for r in ranks) / len(ranks) for i in range(len(ranks[0].losses))]


@dataclass
class RingStep:
    """The state of a simulated ring all-reduce after one step (or before the first)."""

    phase: str  # "start", "reduce-scatter" or "all-gather"
    step: int  # 0 .. p - 2 within the phase (0 for "start")
    chunks: list[list[Tensor]]  # chunks[r][c]: rank r's copy of chunk c after this step
    sends: list[tuple[int, int, int]]  # (from rank, to rank, chunk) of this step's messages


def ring_all_reduce_steps(tensors: Sequence[Tensor]) -> Iterator[RingStep]:
    """Play a ring all-reduce of p same-shaped tensors (one per rank), one step at a time
    (Patarasuk & Yuan 2009). The ranks sit in a ring, r sends to r + 1 (mod p); each tensor is
    cut into p chunks.
      reduce-scatter, p - 1 steps: at step s rank r sends chunk (r - s) mod p, and the
        receiver adds it to its own copy; then rank r holds the finished sum of chunk r + 1.
      all-gather, p - 1 steps: at step s rank r sends finished chunk (r + 1 - s) mod p, and
        the receiver keeps it.
    """
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence) or not tensors or not all(
        isinstance(t, Tensor) and t.shape == tensors[0].shape for t in tensors
    ):
        raise ValueError("tensors must be a non-empty sequence of tensors of one shape "
                         f"(one per rank), got {_describe(tensors)}")
    dtypes = [t.dtype for t in tensors]
    if len(set(dtypes)) > 1 or dtypes[0] == torch.bool or dtypes[0].is_complex:
        # a float32 rank adding a float64 chunk rounds it; a bool "sum" is a logical or
        raise TypeError("tensors must share one real number type (an all-reduce sums "
                         f"them), got dtypes {[str(d).removeprefix('torch.') for d in dtypes]}")
    p = len(tensors)
    chunks = [list(t.detach().reshape(-1).clone().tensor_split(p)) for t in tensors]  # [r][c]
    yield RingStep("start", 0, [[c.clone() for c in row] for row in chunks], [])
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(p - 1):
            # every rank sends at once: read all messages before any is delivered
            sends, messages = [], []
            for r in range(p):
                c = (r - s) % p if phase == "reduce-scatter" else (r + 1 - s) % p
                sends.append((r, (r + 1) % p, c))
                messages.append(chunks[r][c].clone())
            for (_, dest, c), chunk in zip(sends, messages, strict=True):
                if phase == "reduce-scatter":
                    chunks[dest][c] += chunk
                else:
                    chunks[dest][c] = chunk
            yield RingStep(phase, s, [[c.clone() for c in row] for row in chunks], sends)


def ring_all_reduce(tensors: Sequence[Tensor]) -> tuple[list[Tensor], list[int]]:
    """Simulate a ring all-reduce of p same-shaped tensors, one per rank; return what every rank
    ends with (the sum of all p) and how many numbers each rank sent.

    Every rank sends 2 (p - 1) chunks of n / p numbers: 2 (p - 1) / p * n, whatever p is.
    """
    states = list(ring_all_reduce_steps(tensors))  # checks the argument
    sent = [0] * len(tensors)
    for state in states:
        for src, _, c in state.sends:
            sent[src] += state.chunks[src][c].numel()
    shape = tensors[0].shape
    return [torch.cat(row).reshape(shape) for row in states[-1].chunks], sent


def _describe(value: object) -> str:
    """A short description of a bad `tensors` argument: the shapes, or the type names."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items = [tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__ for v in value]
        return f"{type(value).__name__} {items}"
    return type(value).__name__


def ring_all_reduce_bytes(n_bytes: float, world_size: int) -> float:
    """Bytes each process sends in a ring all-reduce of n_bytes: 2 (p - 1) / p * n_bytes
    (p - 1 steps of reduce-scatter, then p - 1 of all-gather, one p-th of the data each)."""
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if not is_number(n_bytes) or not 0 <= n_bytes < math.inf:  # NaN fails both
        raise ValueError(f"n_bytes must be a finite number >= 0, got {n_bytes!r}")
    return 2 * (world_size - 1) / world_size * n_bytes


ZERO_STAGES = {0: "DDP: everything replicated", 1: "optimiser state sharded",
               2: "optimiser state and gradients sharded",
               3: "optimiser state, gradients and weights sharded (FSDP full sharding)"}


def training_bytes_per_process(n_params: int, world_size: int, stage: int = 0,
                               state_bytes: int = 12) -> float:
    """Bytes of training state per data-parallel process, mixed-precision Adam (Rajbhandari
    et al. 2020, section 3): 2 (16-bit weights) + 2 (16-bit gradients) + K (float32 copy of
    the weights, Adam's m and v: K = 12) per parameter, the sharded parts divided by p:

        stage 0: (2 + 2 + K) N      stage 1: (2 + 2) N + K N / p
        stage 2: 2 N + (2 + K) N / p      stage 3: (2 + 2 + K) N / p

    Activations, buffers and fragmentation come on top.
    """
    for name, value, low in (("n_params", n_params, 0), ("world_size", world_size, 1),
                             ("state_bytes", state_bytes, 0)):
        if not is_int(value) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not is_int(stage) or stage not in ZERO_STAGES:  # True == 1 would pass `in`
        raise ValueError(f"stage must be one of {sorted(ZERO_STAGES)}, got {stage!r}")
    weights, grads, states = 2 * n_params, 2 * n_params, state_bytes * n_params
    sharded = {0: 0, 1: states, 2: states + grads, 3: states + grads + weights}[stage]
    return weights + grads + states - sharded + sharded / world_size


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_local_processes(count: object, what: str = "world_size") -> int:
    """`count` processes (or threads) on this machine: an int in [1, available cores]."""
    cores = available_cores()
    if not is_int(count) or count < 1:
        raise ValueError(f"{what} must be an int >= 1, got {count!r}")
    if count > cores:
        raise ValueError(f"{what} must be at most the {cores} CPU cores this machine gives "
                         f"this process (one per core), got {count}")
    return int(count)


def check_shardable(batch_size: int, world_size: int) -> int:
    """Rows per rank, b = B / p; a ValueError if p does not divide B (or either is not >= 1)."""
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if batch_size % world_size:
        raise ValueError(f"a global batch of {batch_size} rows cannot be split evenly over "
                         f"{world_size} processes: batch_size must be a multiple of world_size")
    return batch_size // world_size


def shard_batch(batch: tuple[Tensor, Tensor], rank: int, world_size: int
                ) -> tuple[Tensor, Tensor]:
    """Rank r's rows of a global batch x, y (B, T): rows [r b, (r + 1) b), b = B / p."""
    if not (isinstance(batch, tuple | list) and len(batch) == 2
            and all(isinstance(t, Tensor) and t.dim() >= 1 for t in batch)):
        raise TypeError(f"batch must be a pair (x, y) of tensors (B, T), got {_describe(batch)}")
    x, y = batch
    if x.size(0) != y.size(0):
        raise ValueError(f"x and y must have the same rows, got {x.size(0)} and {y.size(0)}")
    b = check_shardable(x.size(0), world_size)
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    return x[rank * b : (rank + 1) * b], y[rank * b : (rank + 1) * b]  # (b, T), (b, T)


def build_model(model_config: GPTConfig, seed: int, dtype: str = "float32") -> GPT:
    """The GPT every run starts from: seeded, so each process builds the same weights."""
    if not isinstance(model_config, GPTConfig):
        raise TypeError(f"model_config must be a GPTConfig, got {type(model_config).__name__}")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    torch.manual_seed(seed)
    return GPT(model_config).to(DTYPES[dtype])


def allreduce_hooks(model: nn.Module, world_size: int) -> list[RemovableHandle]:
    """Average gradients by hand: as soon as a parameter's gradient is complete in the
    backward pass, all-reduce (sum) it across ranks and divide by p. Returns the hook handles.
    (A tied matrix is one parameter: its hook fires once, after both uses have added up.)"""

    def average(param: Tensor) -> None:
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad.div_(world_size)

    return [p.register_post_accumulate_grad_hook(average)
            for p in model.parameters() if p.requires_grad]


def _check_data(model_config: GPTConfig, ids: Tensor, batch_size: int, T: int,
                world_size: int) -> None:
    if not isinstance(model_config, GPTConfig):
        raise TypeError(f"model_config must be a GPTConfig, got {type(model_config).__name__}")
    check_shardable(batch_size, world_size)
    if not is_int(T) or not 1 <= T <= model_config.max_len:
        raise ValueError(f"T must be an int in [1, {model_config.max_len}] (the model's "
                         f"max_len), got {T!r}")
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point or (
        ids.dtype == torch.bool
    ):
        raise TypeError("ids must be a 1-D integer tensor (N,) of token ids, got "
                        f"{type(ids).__name__ if not isinstance(ids, Tensor) else ids.dtype}")
    if len(ids) < T + 1:
        raise ValueError(f"a window of T + 1 = {T + 1} tokens needs a stream at least that "
                         f"long, got {len(ids)} tokens")
    if int(ids.min()) < 0 or int(ids.max()) >= model_config.vocab_size:
        raise ValueError(f"token ids must lie in [0, {model_config.vocab_size}) (the model's "
                         f"vocab_size), got ids from {int(ids.min())} to {int(ids.max())}")


def _check_snapshots(snapshot_steps: Sequence[int], steps: int) -> tuple[int, ...]:
    if not isinstance(snapshot_steps, Sequence) or not all(
        is_int(k) and 1 <= k <= steps for k in snapshot_steps
    ):
        raise ValueError(f"snapshot_steps must be a sequence of ints in [1, {steps}] (steps "
                         f"taken), got {snapshot_steps!r}")
    return tuple(snapshot_steps)


def flat_parameters(model: nn.Module) -> Tensor:
    """Every parameter in one vector (P,), in named_parameters order (a tied matrix once)."""
    return torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])  # (P,)


def replicate(model: nn.Module, sync: str) -> nn.Module:
    """Make `model` a replica in the current process group: wrapped in DDP ("ddp"), or given
    rank 0's weights and the hand-written all-reduce hooks ("allreduce")."""
    if sync not in SYNCS:
        raise ValueError(f"sync must be one of {SYNCS}, got {sync!r}")
    if sync == "ddp":
        # DDP's constructor broadcasts rank 0's parameters and buffers to every rank; its
        # backward hooks then average the gradients bucket by bucket
        return DistributedDataParallel(model)
    for t in [*model.parameters(), *model.buffers()]:  # the same start everywhere, by hand
        dist.broadcast(t.data, src=0)
    allreduce_hooks(model, dist.get_world_size())
    return model


def make_optimizer(model: nn.Module, name: str, config: TrainConfig) -> torch.optim.Optimizer:
    """The loop's AdamW (decay on matrices) or plain SGD, w <- w - lr g, at config.lr."""
    if name == "adamw":
        return adamw(model, config.lr, config.betas, config.weight_decay)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.lr)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


class StepRecorder:
    """Watches an optimiser through its hooks: copies the gradients it receives at the first
    step, and all the weights (one flat vector) after each step listed in `snapshot_steps`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 snapshot_steps: Sequence[int] = ()) -> None:
        self.model, self.snapshot_steps = model, tuple(snapshot_steps)
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.first_grads: dict[str, Tensor] = {}
        self.snapshots: dict[int, Tensor] = {}
        self.steps = 0
        optimizer.register_step_pre_hook(self.before_step)
        optimizer.register_step_post_hook(self.after_step)

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.steps == 0:  # the averaged gradients (clipped too, if the config clips)
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self.first_grads[self.names[id(p)]] = p.grad.detach().clone()

    def after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self.steps += 1
        if self.steps in self.snapshot_steps:
            self.snapshots[self.steps] = flat_parameters(self.model).clone()  # (P,)


def train_replica(
    model_config: GPTConfig, train_config: TrainConfig, ids: Tensor, batch_size: int, T: int,
    variant: Variant = Variant(), *, snapshot_steps: Sequence[int] = (), progress: bool = False,
) -> RunResult:
    """Train one replica with tfbook.train.loop.train on this rank's shard of each global
    batch of `batch_size` random windows of `ids`; gradients averaged as `variant.sync` says.

    Inside an initialised process group (gloo) this is one rank of data parallelism; without
    one it is the single-process reference: the whole global batch, no averaging. The weights
    are copied (as one flat vector) after each number of steps in `snapshot_steps`.
    """
    if not isinstance(train_config, TrainConfig):
        raise TypeError(f"train_config must be a TrainConfig, got {type(train_config).__name__}")
    if not isinstance(variant, Variant):
        raise TypeError(f"variant must be a Variant, got {type(variant).__name__}")
    snapshot_steps = _check_snapshots(snapshot_steps, train_config.steps)
    grouped = dist.is_available() and dist.is_initialized()
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    _check_data(model_config, ids, batch_size, T, world_size)
    if variant.lr is not None:
        train_config = replace(train_config, lr=variant.lr)

    seed = train_config.seed + (rank if variant.rank_seeds else 0)
    model = build_model(model_config, seed, variant.dtype)
    start_checksum = float(flat_parameters(model).double().sum())
    wrapped = replicate(model, variant.sync) if grouped else model  # rank 0's weights everywhere
    optimizer = make_optimizer(model, variant.optimizer, train_config)
    recorder = StepRecorder(model, optimizer, snapshot_steps)

    def next_batch(generator: torch.Generator) -> tuple[Tensor, Tensor]:
        # every rank's generator is seeded alike (the loop does it), so all draw the same
        # global batch; each keeps its own rows
        batch = random_windows(ids, batch_size, T, generator)  # (B, T), (B, T)
        return shard_batch(batch, rank, world_size)  # (b, T), (b, T)

    cpu_start = time.process_time()
    history = train(wrapped, next_batch, train_config, optimizer=optimizer, progress=progress)
    cpu_seconds = time.process_time() - cpu_start
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    return RunResult(rank, world_size, recorder.first_grads, weights, history.loss,
                     history.seconds, cpu_seconds, recorder.snapshots, start_checksum)


def train_single_process(
    model_config: GPTConfig, train_config: TrainConfig, ids: Tensor, batch_size: int, T: int,
    variant: Variant = Variant(), *, threads: int = 1, snapshot_steps: Sequence[int] = (),
    progress: bool = False,
) -> RunResult:
    """The reference: one process trains on the whole global batch with `threads` threads."""
    check_local_processes(threads, "threads")
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("train_single_process runs outside any process group; this "
                           "process belongs to one (use train_replica)")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return train_replica(model_config, train_config, ids, batch_size, T, variant,
                             snapshot_steps=snapshot_steps, progress=progress)
    finally:
        torch.set_num_threads(before)


@contextmanager
def passive_single_thread_children() -> Iterator[None]:
    """Within the block, processes started see OMP_WAIT_POLICY=PASSIVE and OMP_NUM_THREADS=1
    (read when OpenMP starts: passive waiting, one thread each); then the environment is
    restored."""
    saved = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    os.environ.update(OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it when we bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_result(result: RunResult, path: Path) -> None:
    """One run of one rank as <path>.safetensors (tensors) and <path>.json (the rest)."""
    tensors = {f"grad.{k}": v.contiguous() for k, v in result.first_grads.items()}
    tensors.update({f"weight.{k}": v.contiguous() for k, v in result.weights.items()})
    tensors.update({f"snapshot.{k}": v.contiguous() for k, v in result.snapshots.items()})
    save_file(tensors, str(path.with_suffix(".safetensors")))
    info = {"rank": result.rank, "world_size": result.world_size, "losses": result.losses,
            "seconds": result.seconds, "cpu_seconds": result.cpu_seconds,
            "start_checksum": result.start_checksum}
    path.with_suffix(".json").write_text(json.dumps(info), encoding="utf-8")


def load_result(path: Path) -> RunResult:
    """Read back what `save_result` wrote."""
    tensors = load_file(str(path.with_suffix(".safetensors")))
    info = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    grads = {k[len("grad."):]: v for k, v in tensors.items() if k.startswith("grad.")}
    weights = {k[len("weight."):]: v for k, v in tensors.items() if k.startswith("weight.")}
    snapshots = {int(k[len("snapshot."):]): v for k, v in tensors.items()
                 if k.startswith("snapshot.")}
    return RunResult(info["rank"], info["world_size"], grads, weights, info["losses"],
                     info["seconds"], info["cpu_seconds"], dict(sorted(snapshots.items())),
                     info["start_checksum"])


def _worker(rank: int, world_size: int, init_method: str, timeout: float, out_dir: str,
            model_config: GPTConfig, train_config: TrainConfig, ids: Tensor, batch_size: int,
            T: int, variants: Sequence[Variant], snapshot_steps: tuple[int, ...]) -> None:
    """One spawned process: join the group, run every variant, write results, leave."""
    torch.set_num_threads(1)  # one thread per process: p processes on p cores
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout))
    try:
        for v, variant in enumerate(variants):
            # every rank holds the same weights: rank 0's snapshots stand for all
            result = train_replica(model_config, train_config, ids, batch_size, T, variant,
                                   snapshot_steps=snapshot_steps if rank == 0 else ())
            save_result(result, Path(out_dir) / f"variant{v}_rank{rank}")
    finally:
        dist.destroy_process_group()


def run_data_parallel(
    model_config: GPTConfig, train_config: TrainConfig, ids: Tensor, batch_size: int, T: int,
    *, world_size: int = 2, variants: Sequence[Variant] = (Variant(),),
    snapshot_steps: Sequence[int] = (), timeout: float = 120.0,
) -> DataParallelResult:
    """Start `world_size` processes (gloo on 127.0.0.1, one thread each) that train the same
    GPT data-parallel on global batches of `batch_size` windows of `ids`, once per variant.

    Every argument is checked before any process starts. A child that fails makes this raise
    (with its traceback); a launch that takes longer than `timeout` seconds is stopped and
    raises TimeoutError; collectives that wait longer than `timeout` fail inside the children.
    """
    if not isinstance(train_config, TrainConfig):
        raise TypeError(f"train_config must be a TrainConfig, got {type(train_config).__name__}")
    check_local_processes(world_size)  # every process starts here, one thread each
    _check_data(model_config, ids, batch_size, T, world_size)
    if isinstance(variants, str | bytes) or not isinstance(variants, Sequence) or not (
        variants and all(isinstance(v, Variant) for v in variants)
    ):
        raise TypeError(f"variants must be a non-empty sequence of Variant, got {variants!r}")
    variants = list(variants)
    if not is_number(timeout) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    snapshot_steps = _check_snapshots(snapshot_steps, train_config.steps)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfbook-ddp-") as out_dir:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        args = (world_size, init_method, float(timeout), out_dir, model_config, train_config,
                ids.clone(), batch_size, T, variants, snapshot_steps)
        with passive_single_thread_children():
            context = mp.spawn(_worker, args=args, nprocs=world_size, join=False)
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=1.0):  # raises if a child failed
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the {world_size} processes did not finish within "
                                       f"{timeout} s")
        finally:
            for process in context.processes:  # only ours; a no-op once they have exited
                if process.is_alive():
                    process.terminate()
                    process.join(5.0)
        runs = [[load_result(Path(out_dir) / f"variant{v}_rank{r}") for r in range(world_size)]
                for v in range(len(variants))]
    return DataParallelResult(runs, time.perf_counter() - started)


def max_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """max |a - b| over every tensor of two dicts with the same names and shapes."""
    for name, d in (("a", a), ("b", b)):
        if not isinstance(d, Mapping) or not all(isinstance(v, Tensor) for v in d.values()):
            raise TypeError(f"{name} must be a dict of name -> tensor, got {_describe_dict(d)}")
    if a.keys() != b.keys():
        raise ValueError(f"the two sets of tensors differ in names: {sorted(a.keys() ^ b.keys())}")
    if not a:
        raise ValueError("max_difference needs at least one tensor in each dict, got two "
                         "empty dicts")
    shapes = [(k, tuple(a[k].shape), tuple(b[k].shape)) for k in a if a[k].shape != b[k].shape]
    if shapes:  # broadcasting would compare something else
        k, sa, sb = shapes[0]
        raise ValueError(f"tensor {k!r} has shape {sa} in a and {sb} in b: the shapes must "
                         f"be equal ({len(shapes)} name(s) differ)")
    diffs = [(a[k].double() - b[k].double()).abs() for k in a]
    return max(float(d.max()) if d.numel() else 0.0 for d in diffs)  # an empty tensor: 0


def _describe_dict(value: object) -> str:
    """A bad dict argument in a few words: its type, or the types of its values."""
    if not isinstance(value, Mapping):
        return type(value).__name__
    bad = {k: type(v).__name__ for k, v in value.items() if not isinstance(v, Tensor)}
    return f"a dict with {', '.join(f'{k!r}: {t}' for k, t in list(bad.items())[:3])}"
