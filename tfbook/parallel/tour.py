"""One launch of two gloo processes that runs every strategy of `tfbook.parallel` once on one
small GPT and reports what it measured: the sharding chapter's demonstrations.

Starting processes that import torch costs seconds, so the chapter starts them once. Each
process (one thread) runs the scenarios below in turn, and runs the one-process references
itself, on the same thread count and kernels. Every comparison is reduced inside the processes
to plain numbers (max differences, byte counts, op times); rank 0's come back, with the
numbers that differ between ranks gathered from both, as a dict of floats, ints, strings and
lists that pickles and serialises to JSON:

    ddp       DDPOverlap vs torch's DistributedDataParallel vs one process (float64, float32):
              first gradients, weights after `steps` AdamW steps, the last step's bucket timeline
    zero      ShardedOptimizer vs unsharded AdamW vs torch's ZeroRedundancyOptimizer: weights,
              optimizer-state bytes per rank
    fsdp      FSDP vs one process (float64, float32) and vs torch's fully_shard (float32),
              bfloat16 compute with float32 masters, full_state_dict loaded into a plain GPT,
              shard bytes per rank and the gathered bytes alive during a step
    tensor    one block split over the two ranks vs the unsplit block (float64), the
              all-reduces counted; the whole GPT split likewise
    pipeline  GPipe and 1F1B over two stages vs one process and vs torch.distributed.pipelining
              (float64); op times and bubble measured for m = 1, 2, 4, 8 micro-batches
    ring      ring attention (zig-zag and contiguous, causal; zig-zag also with torch's fused
              kernel per block) vs attention over the whole sequence (float64), score
              blocks computed per rank

Shape legend: B global batch rows, T positions, p = 2 processes (ranks), m micro-batches.
"""

from __future__ import annotations

import math
import pickle
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

from tfbook.config import is_int, is_number
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.parallel.ddp import DDPOverlap
from tfbook.parallel.fsdp import FSDP
from tfbook.parallel.pipeline import (
    GPTStage,
    check_pipeline,
    pipeline_step,
    simulate,
    sync_tied_gradients,
)
from tfbook.parallel.ring import RingWork, ring_attention, shard_sequence, unshard_sequence
from tfbook.parallel.tensor import (
    CollectiveCount,
    check_tensor_parallel,
    shard_index,
    tensor_parallel_block,
    tensor_parallel_model,
)
from tfbook.parallel.zero import ShardedOptimizer, optimizer_state_bytes
from tfbook.train.data import random_windows
from tfbook.train.distributed import (
    build_model,
    check_local_processes,
    check_shardable,
    flat_parameters,
    free_port,
    max_difference,
    passive_single_thread_children,
    shard_batch,
)
from tfbook.train.loop import lm_loss

WORLD_SIZE = 2  # the tour's processes
ADAMW = {"lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}


@dataclass(frozen=True)
class TourConfig:
    """What the tour runs on (every field checked before any process starts)."""

    model: GPTConfig  # the GPT every scenario builds (dropout 0)
    batch_size: int = 8  # B, global batch rows (a multiple of 2 and of n_micro)
    seq_len: int = 32  # T, positions per row (<= model.max_len)
    steps: int = 3  # AdamW steps of the DDP, ZeRO and FSDP runs
    bucket_size_mb: float = 0.05  # DDPOverlap's bucket cap, MiB (small: several buckets)
    n_micro: int = 4  # micro-batches of the pipeline's equality runs
    bubble_micro: tuple[int, ...] = (1, 2, 4, 8)  # micro-batches of the bubble timings
    bubble_batch: int = 32  # rows of the batch the bubble is timed on (positions: max_len)
    bubble_repeats: int = 3  # timed steps per m (the one with the smallest span is kept)
    ring_length: int = 32  # n, positions of the ring-attention sequence (a multiple of 4)
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.model, GPTConfig):
            raise TypeError(f"TourConfig.model must be a GPTConfig, got "
                            f"{type(self.model).__name__}")
        for name in ("batch_size", "seq_len", "steps", "n_micro", "bubble_batch",
                     "bubble_repeats", "ring_length", "seed"):
            value = getattr(self, name)
            if not is_int(value) or value < (0 if name == "seed" else 1):
                raise ValueError(f"TourConfig.{name} must be an int >= "
                                 f"{0 if name == 'seed' else 1}, got {value!r}")
        if not is_number(self.bucket_size_mb) or not 0 < self.bucket_size_mb < math.inf:
            raise ValueError(f"TourConfig.bucket_size_mb must be a finite number > 0, got "
                             f"{self.bucket_size_mb!r}")
        if self.seq_len > self.model.max_len:
            raise ValueError(f"TourConfig.seq_len={self.seq_len} is longer than the model's "
                             f"max_len={self.model.max_len}")
        if self.model.dropout:
            raise ValueError(f"the tour compares runs number for number: the model needs "
                             f"dropout 0, got {self.model.dropout}")
        check_shardable(self.batch_size, WORLD_SIZE)
        check_pipeline(self.batch_size, self.n_micro, "gpipe", WORLD_SIZE, self.model.n_layers)
        if not self.bubble_micro or not isinstance(self.bubble_micro, tuple):
            raise TypeError(f"TourConfig.bubble_micro must be a non-empty tuple of ints, got "
                            f"{self.bubble_micro!r}")
        for m in self.bubble_micro:
            check_pipeline(self.bubble_batch, m, "gpipe", WORLD_SIZE, self.model.n_layers)
        check_tensor_parallel(self.model, WORLD_SIZE)
        if self.ring_length % (2 * WORLD_SIZE):
            raise ValueError(f"TourConfig.ring_length must be a multiple of {2 * WORLD_SIZE} "
                             f"(the zig-zag layout cuts it into 2p chunks), got "
                             f"{self.ring_length}")


# ---- small helpers (run inside the processes) ----

def _grads(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _weights(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _abs_max(tensors: dict[str, Tensor]) -> float:
    return max(float(t.abs().max()) for t in tensors.values())


def _gather_ints(value: int) -> list[int]:
    """One int from every rank, in rank order."""
    out = torch.zeros(WORLD_SIZE, dtype=torch.int64)
    out[dist.get_rank()] = value
    dist.all_reduce(out)
    return out.tolist()


def _ranks_apart(model: nn.Module) -> float:
    """max |this rank's weights - rank 0's|, the largest over the ranks."""
    flat = flat_parameters(model).double()  # (P,)
    rank0 = flat.clone()
    dist.broadcast(rank0, src=0)
    gap = torch.tensor([float((flat - rank0).abs().max())], dtype=torch.float64)
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    return float(gap)


def _adamw_run(config: TourConfig, ids: Tensor, dtype: str, wrap, rank: int, world: int,
               optimizer_factory=None) -> dict[str, Any]:
    """`steps` AdamW steps of the GPT wrapped by `wrap`, on this rank's rows of each global
    batch: the first (synchronised) gradients, the final weights, the wrapper."""
    model = build_model(config.model, config.seed, dtype)
    wrapped = wrap(model)
    params = wrapped.parameters() if isinstance(wrapped, FSDP) else model.parameters()
    optimizer = (optimizer_factory or (lambda ps: torch.optim.AdamW(ps, **ADAMW)))(params)
    generator = torch.Generator().manual_seed(config.seed)
    first: dict[str, Tensor] = {}
    losses = []
    for step in range(config.steps):
        batch = shard_batch(random_windows(ids, config.batch_size, config.seq_len, generator),
                            rank, world)  # (B / world, T) each
        optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(wrapped, batch)
        loss.backward()
        if hasattr(wrapped, "finish_gradient_synchronization"):
            wrapped.finish_gradient_synchronization()
        if step == 0 and not isinstance(wrapped, FSDP):
            first = _grads(model)
        optimizer.step()
        mean = loss.detach().double().reshape(1) / world  # the global batch's mean loss
        if world > 1:
            dist.all_reduce(mean)
        losses.append(float(mean))
    return {"model": model, "wrapped": wrapped, "optimizer": optimizer, "grads": first,
            "weights": _weights(model) if not isinstance(wrapped, FSDP) else {},
            "losses": losses}


# ---- the scenarios ----

def _ddp(config: TourConfig, ids: Tensor, rank: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    out: dict[str, Any] = {}
    for dtype in ("float64", "float32"):
        ours = _adamw_run(config, ids, dtype,
                          lambda m: DDPOverlap(m, config.bucket_size_mb), rank, WORLD_SIZE)
        theirs = _adamw_run(config, ids, dtype, DistributedDataParallel, rank, WORLD_SIZE)
        single = _adamw_run(config, ids, dtype, lambda m: m, 0, 1)
        wrapper: DDPOverlap = ours["wrapped"]
        out[dtype] = {
            "ours_vs_torch_grads": max_difference(ours["grads"], theirs["grads"]),
            "ours_vs_torch_weights": max_difference(ours["weights"], theirs["weights"]),
            "ours_vs_single_grads": max_difference(ours["grads"], single["grads"]),
            "ours_vs_single_weights": max_difference(ours["weights"], single["weights"]),
            "torch_vs_single_grads": max_difference(theirs["grads"], single["grads"]),
            "grad_max": _abs_max(single["grads"]),
            "ranks_apart": _ranks_apart(ours["model"]),
            "n_buckets": len(wrapper.buckets),
            "bucket_bytes": [sum(p.numel() * p.element_size() for p in b)
                             for b in wrapper.buckets],
            "timeline": [asdict(t) for t in wrapper.timeline],  # the last step's
            "backward_seconds": wrapper.backward_seconds,
        }
        wrapper.remove_hooks()
        if dtype == "float32":  # the same sums, launched only after the backward pass
            later = _adamw_run(config, ids, dtype, lambda m: DDPOverlap(
                m, config.bucket_size_mb, overlap=False), rank, WORLD_SIZE)
            out[dtype]["no_overlap"] = {
                "vs_overlap_grads": max_difference(later["grads"], ours["grads"]),
                "vs_overlap_weights": max_difference(later["weights"], ours["weights"]),
                "timeline": [asdict(t) for t in later["wrapped"].timeline],
                "backward_seconds": later["wrapped"].backward_seconds,
            }
            later["wrapped"].remove_hooks()
    return out


def _state_bytes(optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """(bytes of the optimizer's state tensors, how many parameters have state)."""
    return optimizer_state_bytes(optimizer), len(optimizer.state)


def _zero(config: TourConfig, ids: Tensor, rank: int) -> dict[str, Any]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    wrap = lambda m: DDPOverlap(m, config.bucket_size_mb)  # noqa: E731
    plain = _adamw_run(config, ids, "float32", wrap, rank, WORLD_SIZE)
    ours = _adamw_run(config, ids, "float32", wrap, rank, WORLD_SIZE,
                      lambda ps: ShardedOptimizer(ps, torch.optim.AdamW, **ADAMW))
    theirs = _adamw_run(config, ids, "float32", DistributedDataParallel, rank, WORLD_SIZE,
                        lambda ps: ZeroRedundancyOptimizer(
                            ps, optimizer_class=torch.optim.AdamW, **ADAMW))
    for run in (plain, ours):
        run["wrapped"].remove_hooks()
    sharded: ShardedOptimizer = ours["optimizer"]
    plain_bytes, plain_tensors = _state_bytes(plain["optimizer"])
    our_bytes, our_tensors = _state_bytes(sharded.inner) if sharded.inner else (0, 0)
    torch_bytes, _ = _state_bytes(theirs["optimizer"].optim)
    params = list(ours["model"].parameters())
    return {
        "ours_vs_plain_weights": max_difference(ours["weights"], plain["weights"]),
        "torch_vs_plain_weights": max_difference(theirs["weights"], plain["weights"]),
        "ranks_apart": _ranks_apart(ours["model"]),
        "plain_state_bytes": plain_bytes,  # every rank holds all of it
        "plain_state_tensors": plain_tensors,
        "state_bytes": _gather_ints(our_bytes),  # per rank
        "state_tensors": _gather_ints(our_tensors),
        "shard_numel": list(sharded.shard_numel),
        "torch_state_bytes": _gather_ints(torch_bytes),
        "n_params": sum(p.numel() for p in params),
        "n_tensors": len(params),
        "largest_tensor": max(p.numel() for p in params),
    }


def _unit_grads(model: GPT, fsdp: FSDP) -> dict[str, Tensor]:
    """One process's gradients flattened unit by unit as FSDP lays them out (padded), so they
    compare with FSDP's gathered shard gradients."""
    grads = dict(model.named_parameters())
    out = {}
    for layout in fsdp.layout:
        flat = torch.cat([grads[n].grad.reshape(-1) for n in layout.params])
        out[layout.name or "root"] = torch.cat([flat, flat.new_zeros(layout.padding)])
    return out


def _fsdp_grads(fsdp: FSDP) -> dict[str, Tensor]:
    """Every unit's averaged gradient, all-gathered from the shards -> (N,) per unit."""
    out = {}
    for layout, shard in zip(fsdp.layout, fsdp.parameters(), strict=True):
        full = torch.empty(layout.padded, dtype=shard.dtype)
        dist.all_gather_single(full, shard.grad.contiguous())
        out[layout.name or "root"] = full
    return out


def _gathered_bytes(model: FSDP, batch: tuple[Tensor, Tensor]) -> dict[str, list[int]]:
    """Bytes of each unit's gathered (full) vector: inside the last block's forward, after
    the forward pass, after the backward pass."""
    sizes = lambda: [u.full.untyped_storage().nbytes() for u in model._units]  # noqa: E731
    seen: dict[str, list[int]] = {}

    def record(_module: nn.Module, _args: Any) -> None:  # runs after FSDP's gather
        seen["in the last block"] = sizes()

    handle = model.module.blocks[-1].register_forward_pre_hook(record)
    loss = lm_loss(model, batch)
    seen["after forward"] = sizes()
    loss.backward()
    seen["after backward"] = sizes()
    handle.remove()
    model.zero_grad(set_to_none=True)
    return seen


def _fsdp(config: TourConfig, ids: Tensor, rank: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out: dict[str, Any] = {}
    generator = torch.Generator().manual_seed(config.seed)
    first_batch = random_windows(ids, config.batch_size, config.seq_len, generator)
    for dtype in ("float64", "float32"):
        single = _adamw_run(config, ids, dtype, lambda m: m, 0, 1)
        # the first step's gradients, FSDP's gathered from the shards
        probe = FSDP(build_model(config.model, config.seed, dtype))
        lm_loss(probe, shard_batch(first_batch, rank, WORLD_SIZE)).backward()
        reference = build_model(config.model, config.seed, dtype)
        lm_loss(reference, first_batch).backward()
        fsdp_grads, one_grads = _fsdp_grads(probe), _unit_grads(reference, probe)
        ours = _adamw_run(config, ids, dtype, FSDP, rank, WORLD_SIZE)
        state = ours["wrapped"].full_state_dict(rank0_only=False)
        out[dtype] = {
            "vs_single_grads": max_difference(fsdp_grads, one_grads),
            "grad_max": _abs_max(one_grads),
            "vs_single_weights": max_difference({k: state[k] for k in single["weights"]},
                                           single["weights"]),
            "losses": ours["losses"],
            "single_losses": single["losses"],
        }
        if dtype == "float32":
            fsdp: FSDP = ours["wrapped"]
            # torch's FSDP2 on the same batches: a device mesh over the 2 CPU processes
            mesh = init_device_mesh("cpu", (WORLD_SIZE,))

            def fsdp2(model: GPT, mesh=mesh) -> GPT:  # noqa: ANN001
                for block in model.blocks:
                    fully_shard(block, mesh=mesh)
                return fully_shard(model, mesh=mesh)

            theirs = _adamw_run(config, ids, dtype, fsdp2, rank, WORLD_SIZE)
            torch_state = {k: v.full_tensor() for k, v in theirs["weights"].items()}
            out[dtype]["vs_torch_weights"] = max_difference(
                {k: state[k] for k in torch_state}, torch_state)
            # the gathered weights load into a plain GPT, which computes what FSDP computes
            plain = GPT(config.model)
            plain.load_state_dict(state)  # strict: every name, nothing more
            x = first_batch[0][:2]
            with torch.no_grad():
                out[dtype]["loaded_vs_fsdp_logits"] = float(
                    (plain(x).logits - fsdp(x).logits).abs().max())
            out[dtype]["still_tied"] = plain.lm_head.weight is plain.tok_emb.weight
            out["layout"] = [asdict(u) for u in fsdp.layout]
            out["shard_bytes"] = _gather_ints(sum(p.numel() * p.element_size()
                                                  for p in fsdp.parameters()))
            out["shard_grad_bytes"] = _gather_ints(sum(p.grad.numel() * p.grad.element_size()
                                                       for p in fsdp.parameters()))
            out["optimizer_bytes"] = _gather_ints(_state_bytes(ours["optimizer"])[0])
            out["shard_dtypes"] = sorted({str(p.dtype) for p in fsdp.parameters()})
            out["model_bytes"] = sum(p.numel() * p.element_size()
                                     for p in build_model(config.model, 0).parameters())
            out["gathered_bytes"] = _gathered_bytes(
                fsdp, shard_batch(first_batch, rank, WORLD_SIZE))
    bf16 = _adamw_run(config, ids, "float32", lambda m: FSDP(m, torch.bfloat16), rank,
                      WORLD_SIZE)
    bf16_state = bf16["wrapped"].full_state_dict(rank0_only=False)
    out["bfloat16"] = {
        "losses": bf16["losses"],
        "master_dtypes": sorted({str(p.dtype) for p in bf16["wrapped"].parameters()}),
        "state_dtypes": sorted({str(v.dtype) for v in bf16_state.values()}),
        "full_dtype": str(bf16["wrapped"]._units[0].full.dtype),
        # each flat group's gathered dtype: the matrices' and, kept apart, the vectors'
        "gathered_dtypes": sorted({("vectors" if u.layout.full_precision else "matrices",
                                    str(u.full.dtype)) for u in bf16["wrapped"]._units}),
        "vs_float32_weights": max_difference({k: bf16_state[k] for k in state}, state),
    }
    return out


def _tensor(config: TourConfig, rank: int) -> dict[str, Any]:
    torch.manual_seed(config.seed)
    model = GPT(config.model).double()
    block = model.blocks[0]
    generator = torch.Generator().manual_seed(config.seed + 1)
    x = torch.randn(config.batch_size, config.seq_len, config.model.d_model,
                    generator=generator, dtype=torch.float64)  # (B, T, C)
    seed = torch.randn(x.shape, generator=generator, dtype=torch.float64)  # dL/dy
    x_full = x.clone().requires_grad_()
    y_full, _ = block(x_full, causal=True)
    y_full.backward(seed)
    shard = tensor_parallel_block(block)
    x_shard = x.clone().requires_grad_()
    with CollectiveCount() as count:
        y_shard, _ = shard(x_shard, causal=True)
        forward = count.forward
        y_shard.backward(seed)
    params = dict(shard.named_parameters())
    grad_gap = 0.0
    shapes = {}
    for name, p in block.named_parameters():
        shard_name, where = shard_index(block, rank, WORLD_SIZE)[name]
        grad_gap = max(grad_gap, float((p.grad[where] - params[shard_name].grad).abs().max()))
        shapes[name] = [list(p.shape), list(params[shard_name].shape)]
    out = {
        "y_gap": float((y_full - y_shard).detach().abs().max()),
        "y_max": float(y_full.detach().abs().max()),
        "dx_gap": float((x_full.grad - x_shard.grad).abs().max()),
        "dx_max": float(x_full.grad.abs().max()),
        "grad_gap": grad_gap, "grad_max": max(float(p.grad.abs().max())
                                              for p in block.parameters()),
        "forward": forward, "backward": count.backward,
        "shapes_counted": [[d, list(s)] for d, s in count.shapes],
        "block_numel": sum(p.numel() for p in block.parameters()),
        "shard_numel": _gather_ints(sum(p.numel() for p in shard.parameters())),
        "param_shapes": shapes,
    }
    # the whole GPT with every block split: 2 L all-reduces each way
    idx = torch.randint(0, config.model.vocab_size, (config.batch_size, config.seq_len),
                        generator=generator)  # (B, T)
    full_out = model(idx, idx)
    split = tensor_parallel_model(model)
    with CollectiveCount() as count:
        split_out = split(idx, idx)
        forward = count.forward
        split_out.loss.backward()
    out["model"] = {"logits_gap": float((full_out.logits - split_out.logits).detach().abs().max()),
                    "logits_max": float(full_out.logits.detach().abs().max()),
                    "forward": forward, "backward": count.backward}
    return out


def _pipeline(config: TourConfig, ids: Tensor, rank: int) -> dict[str, Any]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from tfbook.losses import cross_entropy

    idx, targets = random_windows(ids, config.batch_size, config.seq_len,
                                  torch.Generator().manual_seed(config.seed))  # (B, T)
    reference = build_model(config.model, config.seed, "float64")
    loss = reference(idx, targets).loss
    loss.backward()
    one = _grads(reference)
    scale = _abs_max(one)

    def name_in_one(name: str) -> str:  # the one-process GPT lists a tied matrix once
        tied = config.model.tie_weights and name == "lm_head.weight"
        return "tok_emb.weight" if tied else name

    out: dict[str, Any] = {"grad_max": scale, "loss": float(loss.detach())}
    runs = {}
    for schedule in ("gpipe", "1f1b"):
        stage = GPTStage(build_model(config.model, config.seed, "float64"), rank, WORLD_SIZE)
        stats = pipeline_step(stage, idx, targets, config.n_micro, schedule)
        sync_tied_gradients(stage)
        runs[schedule] = _grads(stage)
        out[schedule] = {"vs_single": max(float((g - one[name_in_one(n)]).abs().max())
                                          for n, g in runs[schedule].items()),
                         "peak_activations": _gather_ints(stats.peak_activations),
                         "order": [[k, i] for k, i, _, _ in stats.ops]}
    for name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        stage = GPTStage(build_model(config.model, config.seed, "float64"), rank, WORLD_SIZE)
        schedule = cls(PipelineStage(stage, rank, WORLD_SIZE, torch.device("cpu")),
                       n_microbatches=config.n_micro, loss_fn=cross_entropy)
        if rank == 0:
            schedule.step(idx)
        else:
            schedule.step(target=targets)
        sync_tied_gradients(stage)
        out[name]["vs_torch"] = max_difference(runs[name], _grads(stage))
        out[name]["torch_vs_single"] = max(float((g - one[name_in_one(n)]).abs().max())
                                           for n, g in _grads(stage).items())
    out["stage_params"] = _gather_ints(sum(p.numel() for p in GPTStage(
        build_model(config.model, config.seed), rank, WORLD_SIZE).parameters()))

    # the bubble, timed in float32 on a larger batch: per m, the step with the smallest span
    big = random_windows(ids, config.bubble_batch, config.model.max_len,
                         torch.Generator().manual_seed(config.seed + 1))
    bubbles = {}
    for schedule in ("gpipe", "1f1b"):
        for m in config.bubble_micro:
            best = None
            for _ in range(config.bubble_repeats):
                stage = GPTStage(build_model(config.model, config.seed), rank, WORLD_SIZE)
                stats = pipeline_step(stage, *big, m, schedule)
                if best is None or stats.span < best.span:
                    best = stats
            t_f, t_b = best.op_times
            times = torch.tensor([t_f, t_b, best.bubble, best.span], dtype=torch.float64)
            every = [torch.zeros_like(times) for _ in range(WORLD_SIZE)]
            dist.all_gather(every, times)
            op_f = [float(t[0]) for t in every]
            op_b = [float(t[1]) for t in every]
            bubbles[f"{schedule}/{m}"] = {
                "m": m, "schedule": schedule,
                "t_forward": op_f, "t_backward": op_b,
                "bubble": [float(t[2]) for t in every],
                "span": float(every[0][3]),
                "simulated": [s["bubble"] for s in simulate(schedule, WORLD_SIZE, m, op_f,
                                                            op_b)],
                "ops": [[k, i, a, b] for k, i, a, b in best.ops],
            }
    out["bubbles"] = bubbles
    return out


def _attention(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """softmax(Q K^T / sqrt(D) + M) V over the whole sequence, written out."""
    n = q.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, n, n)
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(scores, dim=-1) @ v  # (B, H, n, D)


def _ring(config: TourConfig, rank: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(config.seed + 2)
    n, H = config.ring_length, config.model.n_heads
    D = config.model.d_model // H
    q, k, v, seed = (torch.randn(1, H, n, D, generator=g, dtype=torch.float64)
                     for _ in range(4))  # (1, H, n, D)
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = _attention(*whole, causal=True)
    ref_grads = torch.autograd.grad((ref * seed).sum(), whole)
    ref = ref.detach()
    out: dict[str, Any] = {"n": n, "p": WORLD_SIZE, "out_max": float(ref.abs().max()),
                           "grad_max": max(float(t.abs().max()) for t in ref_grads)}
    for layout in ("zigzag", "contiguous"):
        local = [shard_sequence(t, rank, WORLD_SIZE, layout).requires_grad_() for t in (q, k, v)]
        work = RingWork()
        y = ring_attention(*local, causal=True, layout=layout, work=work)  # (1, H, n / p, D)
        grads = torch.autograd.grad((y * shard_sequence(seed, rank, WORLD_SIZE, layout)).sum(),
                                    local)
        parts = [torch.zeros_like(y) for _ in range(WORLD_SIZE)]
        dist.all_gather(parts, y.detach().contiguous())
        grad_gap = 0.0
        for gr, rg in zip(grads, ref_grads, strict=True):
            pieces = [torch.zeros_like(gr) for _ in range(WORLD_SIZE)]
            dist.all_gather(pieces, gr.contiguous())
            grad_gap = max(grad_gap, float((unshard_sequence(pieces, layout) - rg).abs().max()))
        works = [None] * WORLD_SIZE
        dist.all_gather_object(works, (work.forward, work.backward, work.scores))
        out[layout] = {"out_gap": float((unshard_sequence(parts, layout) - ref).abs().max()),
                       "grad_gap": grad_gap,
                       "forward_blocks": [w[0] for w in works],
                       "backward_blocks": [w[1] for w in works],
                       "scores": [w[2] for w in works]}
    # the same zig-zag blocks through torch's fused CPU flash-attention kernel
    local = [shard_sequence(t, rank, WORLD_SIZE).requires_grad_() for t in (q, k, v)]
    y = ring_attention(*local, causal=True, kernel="fused")
    grads = torch.autograd.grad((y * shard_sequence(seed, rank, WORLD_SIZE)).sum(), local)
    gaps = torch.tensor([float((y.detach() - shard_sequence(ref, rank, WORLD_SIZE)).abs().max()),
                         max(float((g - shard_sequence(rg, rank, WORLD_SIZE)).abs().max())
                             for g, rg in zip(grads, ref_grads, strict=True))],
                        dtype=torch.float64)
    dist.all_reduce(gaps, op=dist.ReduceOp.MAX)
    out["fused"] = {"out_gap": float(gaps[0]), "grad_gap": float(gaps[1])}
    return out


def _worker(rank: int, world_size: int, init_method: str, out_dir: str, config: TourConfig,
            ids: Tensor, timeout: float) -> None:
    """One process: join the group, run every scenario, write the results, leave."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout))
    result: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    try:
        for name, run in (("ddp", lambda: _ddp(config, ids, rank)),
                          ("zero", lambda: _zero(config, ids, rank)),
                          ("fsdp", lambda: _fsdp(config, ids, rank)),
                          ("tensor", lambda: _tensor(config, rank)),
                          ("pipeline", lambda: _pipeline(config, ids, rank)),
                          ("ring", lambda: _ring(config, rank))):
            started = time.process_time()
            result[name] = run()
            seconds[name] = time.process_time() - started
        result["cpu_seconds"] = seconds
        result["threads"] = torch.get_num_threads()
        with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as f:
            pickle.dump(result, f)
    finally:
        dist.destroy_process_group()


def run_tour(config: TourConfig, ids: Tensor, timeout: float = 180.0) -> dict[str, Any]:
    """Start 2 gloo processes (one thread each, OpenMP waiting passively), run every scenario
    of the module docstring on `config`'s GPT and batches drawn from the token stream `ids`,
    and return rank 0's results (per-rank numbers gathered into lists), plus "launch_seconds"
    (wall-clock of the whole launch) and "rank_cpu_seconds" (each scenario's CPU seconds on
    rank 0). A child that fails makes this raise with its traceback; a collective that waits
    longer than `timeout` seconds fails in the children (the process group's timeout)."""
    if not isinstance(config, TourConfig):
        raise TypeError(f"config must be a TourConfig, got {type(config).__name__}")
    if not (isinstance(ids, Tensor) and ids.dim() == 1 and not ids.is_floating_point()
            and ids.numel() > config.bubble_batch + config.model.max_len):
        raise ValueError(f"ids must be a 1-D integer tensor of token ids longer than "
                         f"{config.bubble_batch + config.model.max_len}, got "
                         f"{type(ids).__name__} {getattr(ids, 'shape', '')}")
    if int(ids.max()) >= config.model.vocab_size or int(ids.min()) < 0:
        raise ValueError(f"ids must lie in [0, {config.model.vocab_size}) (the model's "
                         f"vocabulary), got ids in [{int(ids.min())}, {int(ids.max())}]")
    if not is_number(timeout) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    check_local_processes(WORLD_SIZE)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfbook-tour-") as out_dir:
        args = (WORLD_SIZE, f"tcp://127.0.0.1:{free_port()}", out_dir, config, ids.clone(),
                float(timeout))
        with passive_single_thread_children():
            mp.spawn(_worker, args=args, nprocs=WORLD_SIZE, join=True)  # raises if one fails
        with open(Path(out_dir) / "rank0.pkl", "rb") as f:
            result = pickle.load(f)
    result["launch_seconds"] = time.perf_counter() - started
    result["rank_cpu_seconds"] = result.pop("cpu_seconds")
    return result


def tour_config(model: GPTConfig | None = None, **changes: Any) -> TourConfig:
    """The chapter's settings: the tiny GPT (2 blocks, 4 heads, width 64, bytes) unless
    `model` is given, with `changes` applied to the other fields."""
    return replace(TourConfig(model or GPTConfig.tiny()), **changes)
