"""tfbook.parallel against PyTorch's own, side by side in one run of 2 processes (issue 27), for
the chapter book/learning/sharding.

    python bench/bench_parallel.py             # a progress bar, a table, and the results in
                                               # bench/results/parallel.json and (for the
                                               # chapter) book/learning/data/sharding_speed.json
    python bench/bench_parallel.py --quick     # one round of everything, nothing written
    python bench/bench_parallel.py --rounds 3  # 3 timed rounds instead of ROUNDS (written)

One launch of 2 gloo processes on the CPU (one thread each, OMP_WAIT_POLICY=PASSIVE) runs
every comparison; rank 0 writes the results. The comparisons, each after checking that both
sides compute the same numbers (else the run stops):

- "ddp_*": a training step (forward, backward, gradient averaging, AdamW) of the book's GPT on
  2 ranks, each its half of the global batch: `DDPOverlap` (bucket_size_mb=BUCKET_MB) with
  overlap=True and with overlap=False, and torch's DistributedDataParallel with
  bucket_cap_mb=BUCKET_MB. Fairness of the buckets: torch's DDP gives its first bucket only
  1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES) when bucket_cap_mb is left at its default; given
  explicitly (as here) torch 2.13 uses that cap for the first bucket too, and BUCKET_MB is
  1 MiB, torch's default first bucket, so every bucket on both sides has the same cap, and
  both close a bucket once it reaches the cap (13 buckets each for gpt_4x256). Both sides'
  bucket sizes are recorded (torch's from its logging data, after it rebuilt its buckets in
  the warm-up in the order the gradients arrived). Gradients and weights checked
  bit for bit equal to torch's DDP (for p = 2 halving is exact). In the same rounds one
  all-reduce of every gradient alone is timed ("all_reduce_s"): communication's share.
  Two models: GPTConfig.tiny() (2 layers, width 64, T 64, 0.12 M parameters, 2 rows a rank:
  a step of a few milliseconds, 10 steps per timed call, communication a large share) and
  SIZES["gpt_4x256"] (4 layers, width 256, 8 heads, T 128, vocabulary 4096, 4.2 M parameters,
  16 MiB of gradients a step, 2 rows of 128 tokens a rank: computing dominates, the
  all-reduce is about a tenth of a step, not negligible). The DDPOverlap bucket timeline of
  one step of the larger model (with and without overlap) is stored under "timeline".
- "zero_step": `ShardedOptimizer(AdamW)` against ZeroRedundancyOptimizer(AdamW), the
  optimizer step alone on the same averaged gradients; "zero_step_bucket_view": against
  ZeroRedundancyOptimizer(AdamW, parameters_as_bucket_view=True) (each rank's parameters
  views into one flat buffer, one broadcast per rank); "adamw_step": against an unsharded
  AdamW step (all three timed in the same rounds); "zero_train_step": a whole step, ours
  (DDPOverlap + ShardedOptimizer) against torch's (DistributedDataParallel +
  ZeroRedundancyOptimizer).
  Weights checked bit for bit equal.
- "fsdp_float32", "fsdp_bf16": a training step of `FSDP` against `fully_shard` (FSDP2, every
  block then the GPT, on a CPU device mesh); bf16: FSDP(compute_dtype=bfloat16, cast="all")
  (every parameter in bfloat16, FSDP2's rule; FSDP's default casts only matrices) against
  MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), because ours reduces
  the gradients in the master dtype (FSDP2 would reduce in bfloat16 with reduce_dtype None).
- "pipeline_gpipe", "pipeline_1f1b": forward and backward of a batch of B_PIPE rows through
  the GPT split in 2 stages (GPTStage), M_PIPE micro-batches: `pipeline_step` against
  torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B on the same split, the tied
  embedding/head gradient added by `sync_tied_gradients` on both sides.
- "tensor_parallel": forward and backward of the whole GPT with every block split over the
  2 ranks (`tensor_parallel_model`) against torch's DTensor `parallelize_module` with
  ColwiseParallel (W_Q, W_K, W_V, W_1) and RowwiseParallel (W_O, W_2) and the heads per rank
  halved; "tensor_parallel_vs_unsplit": the same against the unsplit GPT on one process;
  "tensor_parallel_block", "tensor_parallel_block_vs_unsplit": the same for one block alone
  (`tensor_parallel_block`; nothing replicated but its norms and biases), forward and
  backward of an activation (B_GLOBAL / 2, T, C).
- "ring_zigzag", "ring_contiguous": causal ring attention (forward and backward) of a sequence
  of RING["n"] positions on 2 processes against whole-sequence attention on one process
  (torch's scaled_dot_product_attention); the score blocks each rank computes under both
  layouts are stored under "ring_work".

Measured: every candidate in turn inside each round (reversed every other round, after
WARMUP rounds), a barrier before each; each rank's wall-clock (time.perf_counter) and process
CPU time (time.process_time: every thread of the process, gloo's included) of one step. A
step's wall time is the slower rank's; its CPU time the sum over the ranks. "ratio" = torch's
wall time / ours in the same round, median over rounds (above 1: ours faster; the aim is
>= 0.9); "cpu_ratio" the same for CPU time. On a 2-core machine that other processes load,
wall-clock times are noisy (the load average before and after is recorded; ratio_min and
ratio_max show the spread): the interleaving makes a burst of load slow both sides alike, but
a 2-process step needs both processes on a core at once, so under load a one-process
candidate (the unsplit GPT, whole-sequence attention) is favoured by wall time; CPU time
measures the work whatever the load (waiting for a message costs none, or little).
"""

import os
import sys

if __name__ == "__main__":  # run as a script: before torch starts its thread pool
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402
from datetime import timedelta  # noqa: E402
from inspect import signature  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_model import machine  # noqa: E402

from tfbook.losses import cross_entropy  # noqa: E402
from tfbook.models.gpt import GPT, GPTConfig  # noqa: E402
from tfbook.parallel.ddp import DDPOverlap  # noqa: E402
from tfbook.parallel.fsdp import FSDP  # noqa: E402
from tfbook.parallel.pipeline import GPTStage, pipeline_step, sync_tied_gradients  # noqa: E402
from tfbook.parallel.ring import (  # noqa: E402
    RingWork,
    ring_attention,
    shard_sequence,
    simulate_ring_attention,
)
from tfbook.parallel.tensor import tensor_parallel_block, tensor_parallel_model  # noqa: E402
from tfbook.parallel.zero import ShardedOptimizer, optimizer_state_bytes  # noqa: E402
from tfbook.train.distributed import (  # noqa: E402
    free_port,
    max_difference,
    passive_single_thread_children,
    shard_batch,
)
from tfbook.train.loop import lm_loss  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "parallel.json"
BOOK_COPY = ROOT / "book" / "learning" / "data" / "sharding_speed.json"
WORLD = 2
ROUNDS, WARMUP = 20, 2  # timed rounds after warm-up rounds (torch's DDP rebuilds its buckets
# and the pipelining stages infer their shapes in the first step)
SIZES = {
    "gpt_tiny": GPTConfig.tiny(),  # 2 layers, width 64, 4 heads, T 64, vocabulary 256
    "gpt_4x256": replace(GPTConfig.tiny(), n_layers=4, n_heads=8, d_model=256, max_len=128,
                         vocab_size=4096),
}
BIG = "gpt_4x256"  # the model of every comparison past DDP
B_GLOBAL = 4  # rows of the global batch (2 a rank in data parallelism), T = max_len
BUCKET_MB = 1.0
REPEAT = {"gpt_tiny": 10, "gpt_4x256": 1}  # steps per timed call (a tiny step takes ~10 ms)
B_PIPE, M_PIPE = 8, 4  # pipeline: rows of the batch, micro-batches
RING = {"B": 1, "H": 8, "n": 1024, "D": 32}  # ring attention: whole-sequence shapes
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}
SEED = 0
TIMELINE_STEPS = 5  # DDPOverlap steps recorded for the timeline; the median one is stored
TF32_TOL = 2.0**-20  # float32 comparisons that differ in summation order: relative to max |ref|


# ---- timing ----------------------------------------------------------------------------------

def timed_rounds(fns: dict, rounds: int, warmup: int, bar=None) -> dict:
    """Each fn() in turn (the same order on every rank, reversed every other round) after a
    barrier -> {name: [(wall rank 0, wall rank 1, CPU rank 0, CPU rank 1) per timed round]}."""
    out = {name: [] for name in fns}
    for round_ in range(warmup + rounds):
        order = list(fns.items()) if round_ % 2 == 0 else list(fns.items())[::-1]
        for name, fn in order:
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            mine = torch.tensor([wall, cpu], dtype=torch.float64)
            every = [torch.empty_like(mine) for _ in range(WORLD)]
            dist.all_gather(every, mine)
            if round_ >= warmup:
                out[name].append(tuple(float(t[0]) for t in every)
                                 + tuple(float(t[1]) for t in every))
        if bar is not None:
            bar.update(1)
    return out


def _wall(row: tuple) -> float:
    return max(row[:WORLD])  # the step is over when its slower rank is


def _cpu(row: tuple) -> float:
    return sum(row[WORLD:])  # CPU seconds of both processes


def compare(name: str, times: dict, ours: str, theirs: str, labels: dict, check: dict,
            per: int = 1, **extra) -> dict:
    """One result row: medians of ours and theirs (seconds per step: each timed call ran
    `per` steps), the per-round ratios (theirs / ours)."""
    a = [tuple(t / per for t in row) for row in times[ours]]
    b = [tuple(t / per for t in row) for row in times[theirs]]
    med = statistics.median
    ratios = [_wall(y) / _wall(x) for x, y in zip(a, b, strict=True)]
    cpu_ratios = [_cpu(y) / _cpu(x) for x, y in zip(a, b, strict=True)]
    return {
        "name": name, "ours": labels[ours], "torch": labels[theirs],
        "ours_s": med(_wall(x) for x in a), "torch_s": med(_wall(y) for y in b),
        "ratio": med(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "cpu_ours_s": med(_cpu(x) for x in a), "cpu_torch_s": med(_cpu(y) for y in b),
        "cpu_ratio": med(cpu_ratios),
        "wall_per_rank_s": {"ours": [med(x[r] for x in a) for r in range(WORLD)],
                            "torch": [med(y[r] for y in b) for r in range(WORLD)]},
        "cpu_per_rank_s": {"ours": [med(x[WORLD + r] for x in a) for r in range(WORLD)],
                           "torch": [med(y[WORLD + r] for y in b) for r in range(WORLD)]},
        "rounds": len(a), "steps_per_timed_call": per, **check, **extra,
    }


def median_wall(times: dict, name: str, per: int = 1) -> float:
    """Median over rounds of the slower rank's seconds per step of one candidate."""
    return statistics.median(_wall(row) for row in times[name]) / per


# ---- checks ----------------------------------------------------------------------------------

def max_abs(a: dict) -> float:
    return max(float(t.abs().max()) for t in a.values())


def checked(what: str, diff: float, tolerance: float) -> dict:
    """The check record of a comparison; stops the run when the two sides disagree."""
    if not diff <= tolerance:
        raise RuntimeError(f"{what}: ours and torch's differ by {diff:.3g} > {tolerance:.3g}; "
                           "not timing different computations")
    return {"max_abs_diff": diff, "tolerance": tolerance, "checked": what}


def grads(model: torch.nn.Module) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def weights(model: torch.nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def count_collectives(fn) -> dict[str, int]:
    """The collectives one call of fn() launches on this rank, by operator name (profiled)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    counts = {}
    for event in prof.key_averages():
        if event.key.startswith(("c10d::", "_c10d_functional::")) and "wait" not in event.key:
            counts[event.key] = event.count
    return counts


def build(name: str, dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(SEED)
    return GPT(SIZES[name]).to(dtype)


def global_batch(config: GPTConfig, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, config.vocab_size, (rows, config.max_len + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # (B, T) each


# ---- the comparisons -------------------------------------------------------------------------

def bench_ddp(size: str, rank: int, rounds: int, bar) -> tuple[list[dict], dict]:
    from torch.nn.parallel import DistributedDataParallel

    config = SIZES[size]
    batch = shard_batch(global_batch(config, B_GLOBAL), rank, WORLD)  # (B/2, T) each
    models = {k: build(size) for k in ("overlap", "no_overlap", "torch")}
    wrapped = {"overlap": DDPOverlap(models["overlap"], BUCKET_MB),
               "no_overlap": DDPOverlap(models["no_overlap"], BUCKET_MB, overlap=False),
               "torch": DistributedDataParallel(models["torch"], bucket_cap_mb=BUCKET_MB)}
    opts = {k: torch.optim.AdamW(m.parameters(), **ADAMW) for k, m in models.items()}

    def step(k: str):
        def run() -> None:
            for _ in range(REPEAT[size]):
                opts[k].zero_grad(set_to_none=True)
                lm_loss(wrapped[k], batch).backward()
                if k != "torch":
                    wrapped[k].finish_gradient_synchronization()
                opts[k].step()
        return run

    flat = torch.zeros(sum(p.numel() for p in models["torch"].parameters()))

    def all_reduce() -> None:  # communication alone: every gradient in one all-reduce
        for _ in range(REPEAT[size]):
            dist.all_reduce(flat)

    first = {}
    for k in models:  # one step each: the averaged gradients and the weights after it
        opts[k].zero_grad(set_to_none=True)
        lm_loss(wrapped[k], batch).backward()
        if k != "torch":
            wrapped[k].finish_gradient_synchronization()
        first[k] = grads(models[k])
        opts[k].step()
    diff = max(max_difference(first[k], first["torch"]) for k in ("overlap", "no_overlap"))
    diff = max(diff, max_difference(weights(models["overlap"]), weights(models["torch"])))
    check = checked(f"{size}: averaged gradients and weights after a step, bit for bit", diff,
                    0.0)
    check["collectives_per_step"] = {k: {name: n // REPEAT[size] for name, n in
                                         count_collectives(step(k)).items()} for k in models}
    times = timed_rounds({**{k: step(k) for k in models}, "all_reduce": all_reduce}, rounds,
                         WARMUP, bar)
    labels = {"overlap": f"DDPOverlap(bucket_size_mb={BUCKET_MB:g})",
              "no_overlap": f"DDPOverlap(bucket_size_mb={BUCKET_MB:g}, overlap=False)",
              "torch": f"DistributedDataParallel(bucket_cap_mb={BUCKET_MB:g})"}
    # torch's DDP starts with one bucket and rebuilds them after the first step, in the order
    # the gradients arrived: a bucket is closed once it reaches the cap (ours before passing it)
    logged = wrapped["torch"]._get_ddp_logging_data()
    torch_buckets = logged.get("rebuilt_bucket_sizes", logged.get("bucket_sizes"))
    buckets = {"ours_bytes": [sum(p.numel() * p.element_size() for p in b)
                              for b in wrapped["overlap"].buckets],
               "torch_bytes": [int(s) for s in str(torch_buckets).split(", ")]
               if torch_buckets else None,
               "torch_first_bucket_cap_bytes": wrapped["torch"]._bucket_config
               .first_bucket_bytes_cap}
    n_params = sum(p.numel() for p in models["torch"].parameters())
    per = REPEAT[size]
    extra = {"model": size, "params": n_params, "bucket_mb": BUCKET_MB, "buckets": buckets,
             "step": "forward, backward, gradient averaging, AdamW step",
             "all_reduce_s": median_wall(times, "all_reduce", per),
             "all_reduce_what": f"one all-reduce of all {n_params} gradients (float32), "
                                "timed in the same rounds: communication alone"}
    rows = [compare(f"ddp_{size}", times, "overlap", "torch", labels, check, per, **extra),
            compare(f"ddp_no_overlap_{size}", times, "no_overlap", "torch", labels, check,
                    per, **extra),
            compare(f"ddp_overlap_gain_{size}", times, "overlap", "no_overlap", labels, check,
                    per, **extra)]
    timeline = {}
    if size == BIG:  # TIMELINE_STEPS more steps of each of ours (in turn), their buckets
        steps = {"overlap": [], "no_overlap": []}
        for _ in range(TIMELINE_STEPS):
            for k, records in steps.items():
                dist.barrier()
                t0 = time.perf_counter()
                opts[k].zero_grad(set_to_none=True)
                loss = lm_loss(wrapped[k], batch)
                forward = time.perf_counter() - t0
                loss.backward()
                wrapped[k].finish_gradient_synchronization()
                synced = time.perf_counter() - t0
                opts[k].step()
                records.append({"rank": rank,
                                "buckets": [asdict(t) for t in wrapped[k].timeline],
                                "backward_seconds": wrapped[k].backward_seconds,
                                "forward_seconds": forward, "synchronised_seconds": synced,
                                "step_seconds": time.perf_counter() - t0})
        for k, records in steps.items():  # the step of median length (a burst of load aside)
            by_length = sorted(records, key=lambda r: r["step_seconds"])
            timeline[k] = {**by_length[len(records) // 2],
                           "step_seconds_each": [r["step_seconds"] for r in records]}
    return rows, timeline


def bench_zero(rank: int, rounds: int, bar) -> list[dict]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    config = SIZES[BIG]
    # the step alone: the same (already averaged) gradients on every rank, kept between steps
    source = build(BIG)
    lm_loss(source, global_batch(config, B_GLOBAL)).backward()
    models = {k: build(BIG) for k in ("ours", "torch", "torch_bucket_view", "plain")}
    for m in models.values():
        for p, q in zip(m.parameters(), source.parameters(), strict=True):
            p.grad = q.grad.clone()
    opts = {"ours": ShardedOptimizer(models["ours"].parameters(), torch.optim.AdamW, **ADAMW),
            "torch": ZeroRedundancyOptimizer(models["torch"].parameters(),
                                             optimizer_class=torch.optim.AdamW, **ADAMW),
            # torch's faster setting: each rank's parameters are views into one flat buffer,
            # broadcast whole (one collective per rank instead of one per parameter)
            "torch_bucket_view": ZeroRedundancyOptimizer(
                models["torch_bucket_view"].parameters(), optimizer_class=torch.optim.AdamW,
                parameters_as_bucket_view=True, **ADAMW),
            "plain": torch.optim.AdamW(models["plain"].parameters(), **ADAMW)}
    for opt in opts.values():
        opt.step()
    diff = max(max_difference(weights(models[k]), weights(models["plain"]))
               for k in ("ours", "torch", "torch_bucket_view"))
    check = checked("weights after a step equal the unsharded AdamW's, bit for bit", diff, 0.0)
    state = {"ours": opts["ours"].state_bytes(),
             "torch": optimizer_state_bytes(opts["torch"].optim),
             "plain": optimizer_state_bytes(opts["plain"])}
    check = {**check, "collectives_per_step": {k: count_collectives(opt.step)
                                               for k, opt in opts.items()}}
    times = timed_rounds({k: opt.step for k, opt in opts.items()}, rounds, WARMUP, bar)
    labels = {"ours": "ShardedOptimizer(AdamW)", "torch": "ZeroRedundancyOptimizer(AdamW)",
              "torch_bucket_view": "ZeroRedundancyOptimizer(AdamW, "
                                   "parameters_as_bucket_view=True)",
              "plain": "AdamW (unsharded)"}
    extra = {"model": BIG, "step": "optimizer.step() alone, the same averaged gradients",
             "state_bytes_rank": state, "rank_of_state_bytes": rank}
    rows = [compare("zero_step", times, "ours", "torch", labels, check, **extra),
            compare("zero_step_bucket_view", times, "ours", "torch_bucket_view", labels, check,
                    **extra),
            compare("adamw_step", times, "ours", "plain", labels, check, **extra)]
    del models, opts, source

    # a whole training step: our DDP and sharded optimizer against torch's
    batch = shard_batch(global_batch(config, B_GLOBAL), rank, WORLD)
    models = {k: build(BIG) for k in ("ours", "torch")}
    wrapped = {"ours": DDPOverlap(models["ours"], BUCKET_MB),
               "torch": DistributedDataParallel(models["torch"], bucket_cap_mb=BUCKET_MB)}
    opts = {"ours": ShardedOptimizer(models["ours"].parameters(), torch.optim.AdamW, **ADAMW),
            "torch": ZeroRedundancyOptimizer(models["torch"].parameters(),
                                             optimizer_class=torch.optim.AdamW, **ADAMW)}

    def step(k: str):
        def run() -> None:
            opts[k].zero_grad(set_to_none=True)
            lm_loss(wrapped[k], batch).backward()
            if k == "ours":
                wrapped[k].finish_gradient_synchronization()
            opts[k].step()
        return run

    for k in models:
        step(k)()
    check = checked("weights after a training step, bit for bit",
                    max_difference(weights(models["ours"]), weights(models["torch"])), 0.0)
    times = timed_rounds({k: step(k) for k in models}, rounds, WARMUP, bar)
    labels = {"ours": f"DDPOverlap({BUCKET_MB:g} MiB) + ShardedOptimizer(AdamW)",
              "torch": f"DistributedDataParallel({BUCKET_MB:g} MiB) + "
                       "ZeroRedundancyOptimizer(AdamW)"}
    rows.append(compare("zero_train_step", times, "ours", "torch", labels, check, model=BIG,
                        step="forward, backward, gradient averaging, sharded AdamW step"))
    return rows


def bench_fsdp(rank: int, rounds: int, bar) -> list[dict]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    config = SIZES[BIG]
    batch = shard_batch(global_batch(config, B_GLOBAL), rank, WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    rows = []
    for name, compute in (("fsdp_float32", None), ("fsdp_bf16", torch.bfloat16)):
        # cast="all": every parameter in the compute dtype, as MixedPrecisionPolicy(param_dtype)
        # does (FSDP's default casts only matrices; tfbook's GPT needs "all" anyway)
        cast = {} if compute is None or "cast" not in signature(FSDP).parameters else {
            "cast": "all"}
        ours = FSDP(build(BIG), compute_dtype=compute, **cast)
        theirs = build(BIG)
        policy = None if compute is None else MixedPrecisionPolicy(
            param_dtype=compute, reduce_dtype=torch.float32)
        kwargs = {} if policy is None else {"mp_policy": policy}
        for block in theirs.blocks:
            fully_shard(block, mesh=mesh, **kwargs)
        fully_shard(theirs, mesh=mesh, **kwargs)
        models = {"ours": ours, "torch": theirs}
        opts = {k: torch.optim.AdamW(m.parameters(), **ADAMW) for k, m in models.items()}
        losses = {}

        def step(k: str, models=models, opts=opts, losses=losses):
            def run() -> None:
                opts[k].zero_grad(set_to_none=True)
                loss = lm_loss(models[k], batch)
                loss.backward()
                if k == "ours":
                    models[k].finish_gradient_synchronization()
                opts[k].step()
                losses[k] = float(loss.detach())
            return run

        for k in models:
            step(k)()
        full_ours = ours.full_state_dict(rank0_only=False)
        full_theirs = {k: v.full_tensor().detach().clone() for k, v in theirs.state_dict().items()}
        # float32: the same kernels on the same numbers (the parity test's 3e-8); bfloat16:
        # one AdamW step moves a weight by about lr, so compare to a quarter of lr
        tolerance = 3e-8 if compute is None else ADAMW["lr"] / 4
        check = checked(f"{name}: full weights after a training step",
                        max_difference(full_ours, full_theirs), tolerance)
        check["loss_diff"] = abs(losses["ours"] - losses["torch"])
        times = timed_rounds({k: step(k) for k in models}, rounds, WARMUP, bar)
        labels = {"ours": f"FSDP(compute_dtype={compute}, cast='all')" if compute else "FSDP",
                  "torch": "fully_shard (FSDP2)" + (
                      "" if compute is None else ", MixedPrecisionPolicy(param_dtype=bfloat16, "
                                                 "reduce_dtype=float32)")}
        rows.append(compare(name, times, "ours", "torch", labels, check, model=BIG,
                            step="forward, backward, reduce-scatter, AdamW on the shards"))
        del models, opts, ours, theirs
    return rows


def bench_pipeline(rank: int, rounds: int, bar) -> list[dict]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    idx, targets = global_batch(SIZES[BIG], B_PIPE)
    stages, fns = {}, {}
    for schedule, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        ours = GPTStage(build(BIG), rank, WORLD)
        theirs = GPTStage(build(BIG), rank, WORLD)
        runner = cls(PipelineStage(theirs, rank, WORLD, torch.device("cpu")),
                     n_microbatches=M_PIPE, loss_fn=cross_entropy)
        stages[f"ours_{schedule}"], stages[f"torch_{schedule}"] = ours, theirs

        def run_ours(stage=ours, schedule=schedule) -> None:
            stage.zero_grad(set_to_none=True)
            pipeline_step(stage, idx, targets, M_PIPE, schedule)
            sync_tied_gradients(stage)

        def run_torch(stage=theirs, runner=runner) -> None:
            stage.zero_grad(set_to_none=True)
            if rank == 0:
                runner.step(idx)
            else:
                runner.step(target=targets, losses=[])
            sync_tied_gradients(stage)

        fns[f"ours_{schedule}"], fns[f"torch_{schedule}"] = run_ours, run_torch
    checks = {}
    for schedule in ("gpipe", "1f1b"):
        fns[f"ours_{schedule}"]()
        fns[f"torch_{schedule}"]()
        a, b = grads(stages[f"ours_{schedule}"]), grads(stages[f"torch_{schedule}"])
        # each loss divided by m before (ours) or the summed gradients after (torch's): a
        # power of two, which rounds nothing
        checks[schedule] = checked(f"pipeline {schedule}: gradients, bit for bit",
                                   max_difference(a, b), 0.0)
    times = timed_rounds(fns, rounds, WARMUP, bar)
    labels = {"ours_gpipe": "pipeline_step(schedule='gpipe')", "torch_gpipe": "ScheduleGPipe",
              "ours_1f1b": "pipeline_step(schedule='1f1b')", "torch_1f1b": "Schedule1F1B"}
    return [compare(f"pipeline_{s}", times, f"ours_{s}", f"torch_{s}", labels, checks[s],
                    model=BIG, batch_rows=B_PIPE, micro_batches=M_PIPE,
                    step="forward and backward of the batch through 2 stages")
            for s in ("gpipe", "1f1b")]


def bench_tensor(rank: int, rounds: int, bar) -> list[dict]:
    config = SIZES[BIG]
    idx, targets = global_batch(config, B_GLOBAL // WORLD)  # every rank: the same rows
    ours = tensor_parallel_model(build(BIG))
    models = {"ours": ours}
    skipped = None
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        theirs = build(BIG)
        plan = {}
        for i, block in enumerate(theirs.blocks):
            block.attn.n_heads //= WORLD  # each rank runs its half of the heads
            block.attn.n_kv_heads //= WORLD
            plan.update({f"blocks.{i}.attn.{n}": ColwiseParallel()
                         for n in ("q_proj", "k_proj", "v_proj")})
            plan[f"blocks.{i}.attn.out_proj"] = RowwiseParallel()
            plan[f"blocks.{i}.ff.fc_in"] = ColwiseParallel()
            plan[f"blocks.{i}.ff.fc_out"] = RowwiseParallel()
        parallelize_module(theirs, init_device_mesh("cpu", (WORLD,)), plan)
        models["torch"] = theirs
    except Exception as error:  # noqa: BLE001 - a missing feature is reported, not fatal
        skipped = f"{type(error).__name__}: {error}"
    unsplit = build(BIG)
    models["unsplit"] = unsplit

    def step(k: str):
        def run() -> None:
            if k == "unsplit" and rank != 0:
                return  # one process: rank 1 waits at the next barrier
            models[k].zero_grad(set_to_none=True)
            lm_loss(models[k], (idx, targets)).backward()
        return run

    with torch.no_grad():
        reference = unsplit(idx).logits
        diffs = {k: float((m(idx).logits - reference).abs().max()) for k, m in models.items()}
    tolerance = TF32_TOL * float(reference.abs().max())
    check = checked("logits against the unsplit GPT", max(diffs.values()), tolerance)
    check["max_abs_diff_each"] = diffs
    check["collectives_per_step"] = {k: count_collectives(step(k)) for k in models}
    times = timed_rounds({k: step(k) for k in models}, rounds, WARMUP, bar)
    labels = {"ours": "tensor_parallel_model (2 ranks)",
              "torch": "parallelize_module, ColwiseParallel/RowwiseParallel (2 ranks)",
              "unsplit": "the unsplit GPT on one process"}
    extra = {"model": BIG, "batch_rows": B_GLOBAL // WORLD,
             "step": "forward and backward, the same rows on both ranks"}
    rows = []
    if "torch" in models:
        rows.append(compare("tensor_parallel", times, "ours", "torch", labels, check, **extra))
    rows.append(compare("tensor_parallel_vs_unsplit", times, "ours", "unsplit", labels, check,
                        **extra, torch_dtensor_skipped=skipped))
    return rows


def bench_tensor_block(rank: int, rounds: int, bar) -> list[dict]:
    """One block alone (no replicated embeddings, head or loss): forward and backward of
    x (B_GLOBAL / 2, T, C) with a fixed output gradient, split over 2 ranks or whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    config = SIZES[BIG]
    g = torch.Generator().manual_seed(SEED + 3)
    x, g_out = (torch.randn(B_GLOBAL // WORLD, config.max_len, config.d_model, generator=g)
                for _ in range(2))  # (B, T, C) each, the same on both ranks
    unsplit = build(BIG).blocks[0]
    ours = tensor_parallel_block(unsplit)
    theirs = copy.deepcopy(unsplit)
    theirs.attn.n_heads //= WORLD
    theirs.attn.n_kv_heads //= WORLD
    plan = {f"attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
    plan.update({"attn.out_proj": RowwiseParallel(), "ff.fc_in": ColwiseParallel(),
                 "ff.fc_out": RowwiseParallel()})
    parallelize_module(theirs, init_device_mesh("cpu", (WORLD,)), plan)
    blocks = {"ours": ours, "torch": theirs, "unsplit": unsplit}

    def step(k: str):
        def run() -> None:
            if k == "unsplit" and rank != 0:
                return  # one process: rank 1 waits at the next barrier
            blocks[k].zero_grad(set_to_none=True)
            xx = x.clone().requires_grad_()
            blocks[k](xx, causal=True)[0].backward(g_out)
        return run

    with torch.no_grad():
        reference = unsplit(x, causal=True)[0]
        diffs = {k: float((b(x, causal=True)[0] - reference).abs().max())
                 for k, b in blocks.items()}
    check = checked("block output against the unsplit block", max(diffs.values()),
                    TF32_TOL * float(reference.abs().max()))
    check["max_abs_diff_each"] = diffs
    check["collectives_per_step"] = {k: count_collectives(step(k)) for k in blocks}
    times = timed_rounds({k: step(k) for k in blocks}, rounds, WARMUP, bar)
    labels = {"ours": "tensor_parallel_block (2 ranks)",
              "torch": "parallelize_module, ColwiseParallel/RowwiseParallel (2 ranks)",
              "unsplit": "the unsplit block on one process"}
    extra = {"model": BIG, "batch_rows": B_GLOBAL // WORLD,
             "step": "forward and backward of one block, the same rows on both ranks"}
    return [compare("tensor_parallel_block", times, "ours", "torch", labels, check, **extra),
            compare("tensor_parallel_block_vs_unsplit", times, "ours", "unsplit", labels, check,
                    **extra)]


def bench_ring(rank: int, rounds: int, bar) -> tuple[list[dict], dict]:
    B, H, n, D = RING["B"], RING["H"], RING["n"], RING["D"]
    g = torch.Generator().manual_seed(SEED + 2)
    q, k, v, g_out = (torch.randn(B, H, n, D, generator=g) for _ in range(4))  # (B, H, n, D)
    leaves = {}

    def whole() -> torch.Tensor:
        if rank != 0:
            return None  # one process: rank 1 waits at the next barrier
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        out.backward(g_out)
        leaves["whole"] = (out.detach(), qq.grad)
        return out

    def ring(layout: str, work: RingWork | None = None):
        def run() -> None:
            qq, kk, vv = (shard_sequence(t, rank, WORLD, layout).clone().requires_grad_()
                          for t in (q, k, v))
            out = ring_attention(qq, kk, vv, causal=True, layout=layout, work=work)
            out.backward(shard_sequence(g_out, rank, WORLD, layout))
            leaves[layout] = (out.detach(), qq.grad)
        return run

    work = {}
    whole()
    if rank == 0:
        ref_out, ref_dq = leaves["whole"]
    else:
        with torch.no_grad():
            ref_out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        qq = q.clone().requires_grad_()
        F.scaled_dot_product_attention(qq, k, v, is_causal=True).backward(g_out)
        ref_dq = qq.grad
    checks = {}
    for layout in ("zigzag", "contiguous"):
        work[layout] = RingWork()
        ring(layout, work[layout])()
        out, dq = leaves[layout]
        diff = max(float((out - shard_sequence(ref_out, rank, WORLD, layout)).abs().max()),
                   float((dq - shard_sequence(ref_dq, rank, WORLD, layout)).abs().max()))
        mine = torch.tensor([diff], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        tolerance = 1e-5 * max(float(ref_out.abs().max()), float(ref_dq.abs().max()))
        checks[layout] = checked(f"ring {layout}: output and dQ against whole attention",
                                 float(mine), tolerance)
    every = [None] * WORLD
    dist.all_gather_object(every, {k: asdict(w) for k, w in work.items()})
    def simulated() -> None:  # both ranks' work, no messages, one process (the same tiles)
        if rank != 0:
            return
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        simulate_ring_attention(qq, kk, vv, WORLD, causal=True, layout="zigzag").backward(g_out)

    times = timed_rounds({"zigzag": ring("zigzag"), "contiguous": ring("contiguous"),
                          "whole": whole, "simulated": simulated}, rounds, WARMUP, bar)
    labels = {"zigzag": "ring_attention, zig-zag (2 processes)",
              "contiguous": "ring_attention, contiguous (2 processes)",
              "whole": "scaled_dot_product_attention over the whole sequence (one process)"}
    rows = [compare(f"ring_{layout}", times, layout, "whole", labels, checks[layout],
                    shape=RING, causal=True, step="forward and backward of attention",
                    simulated_one_process_s=median_wall(times, "simulated"),
                    simulated_what="simulate_ring_attention(world_size=2, zig-zag) on one "
                                   "process: both ranks' tiles, no messages (the same code)")
            for layout in ("zigzag", "contiguous")]
    ring_work = {layout: {"forward_blocks": [e[layout]["forward"] for e in every],
                          "backward_blocks": [e[layout]["backward"] for e in every],
                          "scores": [e[layout]["scores"] for e in every]}
                 for layout in ("zigzag", "contiguous")}
    for w in ring_work.values():
        w["max_over_mean_scores"] = max(w["scores"]) / (sum(w["scores"]) / WORLD)
    return rows, ring_work


# ---- the launch ------------------------------------------------------------------------------

def total_rounds(rounds: int) -> int:
    """Rounds over every comparison (for the progress bar)."""
    return (len(SIZES) + 1 + 1 + 2 + 1 + 1 + 1 + 1) * (WARMUP + rounds)


def _worker(rank: int, world_size: int, init_method: str, out_dir: str, rounds: int,
            warmup: int) -> None:
    global WARMUP
    WARMUP = warmup  # a spawned process imports this file afresh
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=600))
    try:
        bar = tqdm(total=total_rounds(rounds), desc="bench_parallel", unit="round",
                   disable=rank != 0)
        results, seconds = [], {}
        timeline = {}
        sections = [(f"ddp {size}", lambda size=size: bench_ddp(size, rank, rounds, bar))
                    for size in SIZES]
        sections += [("zero", lambda: bench_zero(rank, rounds, bar)),
                     ("fsdp", lambda: bench_fsdp(rank, rounds, bar)),
                     ("pipeline", lambda: bench_pipeline(rank, rounds, bar)),
                     ("tensor", lambda: bench_tensor(rank, rounds, bar)),
                     ("tensor block", lambda: bench_tensor_block(rank, rounds, bar)),
                     ("ring", lambda: bench_ring(rank, rounds, bar))]
        ring_work = None
        for name, section in sections:
            bar.set_postfix_str(name)
            started = time.perf_counter()
            out = section()
            seconds[name] = time.perf_counter() - started
            if name.startswith("ddp"):
                rows, tl = out
                if tl:
                    every = [None] * world_size
                    dist.all_gather_object(every, tl)
                    timeline = {"model": BIG, "bucket_mb": BUCKET_MB, "ranks": every}
            elif name == "ring":
                rows, ring_work = out
            else:
                rows = out
            results += rows
        bar.close()
        if rank == 0:
            payload = {"results": results, "timeline": timeline, "ring_work": ring_work,
                       "section_seconds": seconds}
            (Path(out_dir) / "rank0.json").write_text(json.dumps(payload))
    finally:
        dist.destroy_process_group()


def main(rounds: int = ROUNDS, write: bool = True, warmup: int = WARMUP) -> dict:
    """One launch of WORLD processes running every comparison; the results as a dict."""
    import tempfile

    torch.set_num_threads(1)  # what the children run (machine() records this process's)
    start = time.perf_counter()
    record = machine(processes=WORLD, threads_per_process=1, backend="gloo")
    with tempfile.TemporaryDirectory() as out_dir, passive_single_thread_children():
        mp.spawn(_worker, args=(WORLD, f"tcp://127.0.0.1:{free_port()}", out_dir, rounds, warmup),
                 nprocs=WORLD, join=True)
        payload = json.loads((Path(out_dir) / "rank0.json").read_text())
    results = {
        "machine": {**record, "load_average_1min_at_end": os.getloadavg()[0]},
        "settings": {
            "world_size": WORLD, "backend": "gloo", "device": "cpu", "threads_per_process": 1,
            "omp_wait_policy": "PASSIVE", "rounds": rounds, "warmup_rounds": warmup,
            "models": {k: {f: getattr(c, f) for f in ("n_layers", "d_model", "n_heads",
                                                      "max_len", "vocab_size", "tie_weights")}
                       for k, c in SIZES.items()},
            "batch_rows": B_GLOBAL, "bucket_mb": BUCKET_MB,
            "ddp_buckets": "bucket_cap_mb given explicitly to torch's DDP: torch 2.13 then caps "
                           "its first bucket at the same size (1 MiB only at the default cap); "
                           "BUCKET_MB = 1 MiB, torch's default first bucket; each row's buckets "
                           "field lists both sides' bucket bytes",
            "pipeline_batch_rows": B_PIPE,
            "pipeline_micro_batches": M_PIPE, "ring": RING, "adamw": ADAMW,
            "dtype": "float32 (fsdp_bf16: bfloat16 compute, float32 master weights)",
            "ratio": "torch's time / ours in the same round, median over rounds (above 1: "
                     "ours faster); wall time of a step = the slower rank's",
            "cpu_ratio": "the same with process CPU time (time.process_time) summed over the "
                         "ranks",
            "method": "candidates in turn within each round (reversed every other round) "
                      "after warm-up rounds, a barrier before each; outputs checked equal "
                      "(max_abs_diff <= tolerance) before timing"},
        "results": payload["results"],
        "timeline": payload["timeline"],
        "ring_work": payload["ring_work"],
        "section_seconds": payload["section_seconds"],
        "seconds": time.perf_counter() - start,
    }
    text = json.dumps(results, indent=2) + "\n"
    for path in (RESULTS, BOOK_COPY) if write else ():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print_summary(results)
    return results


def print_summary(r: dict) -> None:
    m = r["machine"]
    print(f"\n{m['cpu']} x{m['cpu_count']}, {r['settings']['world_size']} processes x 1 thread,"
          f" load {m['load_average_1min']:.1f}-{m['load_average_1min_at_end']:.1f}, "
          f"torch {m['torch']}")
    print(f"{'':28s}{'ours s':>9s}{'torch s':>9s}{'ratio':>7s}{'cpu ratio':>10s}  max |diff|")
    for row in r["results"]:
        print(f"{row['name']:28s}{row['ours_s']:9.4f}{row['torch_s']:9.4f}{row['ratio']:7.2f}"
              f"{row['cpu_ratio']:10.2f}  {row['max_abs_diff']:.1e}")
    if r["ring_work"]:
        for layout, w in r["ring_work"].items():
            print(f"ring {layout}: scores per rank {w['scores']}, max/mean "
                  f"{w['max_over_mean_scores']:.2f}")
    print(f"{r['seconds']:.0f} s")


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--quick" in args:
        main(rounds=1, write=False, warmup=1)
    else:
        main(rounds=int(args[args.index("--rounds") + 1]) if "--rounds" in args else ROUNDS)
