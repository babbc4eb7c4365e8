"""Data parallelism on torch.distributed (gloo, CPU): two processes train exactly like one.

The two-process runs are compared with independent references: plain autograd on the whole
global batch (torch's own cross-entropy) for the first gradients, and one process running the
same training loop for the weights after a few steps. The ring all-reduce simulation is
compared with a plain sum, and the ZeRO memory formula with the paper's own example.
"""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.modules import load_module
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.train import distributed
from tfbook.train.data import random_windows
from tfbook.train.distributed import (
    Variant,
    check_shardable,
    load_result,
    max_difference,
    ring_all_reduce,
    ring_all_reduce_bytes,
    run_data_parallel,
    shard_batch,
    train_single_process,
    training_bytes_per_process,
)
from tfbook.train.loop import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
MODEL = replace(GPTConfig.tiny(), d_model=32, max_len=16)
TRAIN = TrainConfig(steps=3, lr=3e-3, clip=None, seed=3)
B, T = 4, 16
IDS = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0))
VARIANTS = [Variant(), Variant(sync="allreduce"), Variant(optimizer="sgd", lr=0.1),
            Variant(dtype="float64"), Variant(rank_seeds=True)]
EPS = {"float32": torch.finfo(torch.float32).eps, "float64": torch.finfo(torch.float64).eps}

# What is exact and why. Inside one launch every process runs one thread and the same kernels,
# so the replicas, DDP against the hand-written hooks (halving is exact for p = 2) and a seeded
# run against one whose ranks built different models (DDP broadcasts rank 0's weights) are
# compared bit for bit. Against one process the sums are added in another order: gradients
# within the rounding bound of a sum of B T terms, weights within what AdamW's step can do.


def gradient_bound(grads: dict[str, torch.Tensor], dtype: str) -> float:
    """B T eps max|g|: the rounding of a sum of B T terms of the gradient's size."""
    return B * T * EPS[dtype] * max(float(g.abs().max()) for g in grads.values())


def adamw_first_step(single, multi, lr: float, w0_max: float) -> tuple[float, float]:
    """Predicted and bound-sized weight difference after AdamW's first step: its update is
    lr g / (|g| + 1e-8), a few roundings of w and lr away from torch's."""
    g1, g2 = (torch.cat([r.first_grads[k].flatten() for k in sorted(r.first_grads)])
              for r in (single, multi))
    predicted = float((lr * g1 / (g1.abs() + 1e-8) - lr * g2 / (g2.abs() + 1e-8)).abs().max())
    return predicted, 2 * EPS["float32"] * (w0_max + 12 * lr)


def full_batch_gradients(variant: Variant) -> dict[str, torch.Tensor]:
    """The reference: one backward pass of torch's cross-entropy over the first global batch."""
    torch.manual_seed(TRAIN.seed)
    model = GPT(MODEL).to(distributed.DTYPES[variant.dtype])
    x, y = random_windows(IDS, B, T, torch.Generator().manual_seed(TRAIN.seed))  # (B, T)
    logits = model(x).logits  # (B, T, V)
    F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def launch():
    return run_data_parallel(MODEL, TRAIN, IDS, B, T, world_size=2, variants=VARIANTS,
                             snapshot_steps=(1, 3), timeout=300)


def test_replicas_stay_identical(launch):
    for runs in launch.runs:
        assert [r.rank for r in runs] == [0, 1] and runs[0].world_size == 2
        assert max_difference(runs[0].weights, runs[1].weights) == 0.0
        assert runs[0].losses != runs[1].losses  # each rank saw its own rows
    assert sorted(launch.runs[0][0].snapshots) == [1, 3] and launch.runs[0][1].snapshots == {}


def test_ddp_broadcasts_rank_0s_weights_when_it_wraps(launch):
    plain, seeded = launch.runs[0], launch.runs[4]
    assert plain[0].start_checksum == plain[1].start_checksum  # the same seed everywhere
    assert seeded[0].start_checksum == plain[0].start_checksum  # rank 0: seed + 0
    assert seeded[1].start_checksum != seeded[0].start_checksum  # rank 1 built another model
    assert max_difference(seeded[0].weights, plain[0].weights) == 0.0
    assert max_difference(seeded[1].weights, plain[1].weights) == 0.0


def test_ddp_equals_hand_written_all_reduce(launch):
    ddp, manual = launch.runs[0][0], launch.runs[1][0]
    # two ranks: halving is exact, so DDP (divide, then sum) and the hooks (sum, then divide)
    # give the same bits
    assert max_difference(ddp.first_grads, manual.first_grads) == 0.0
    assert max_difference(ddp.weights, manual.weights) == 0.0


@pytest.mark.parametrize("v", [0, 1, 2, 3])
def test_averaged_gradients_equal_full_batch_gradients(launch, v):
    reference = full_batch_gradients(VARIANTS[v])
    bound = gradient_bound(reference, VARIANTS[v].dtype)
    assert max_difference(launch.runs[v][0].first_grads, reference) <= bound


@pytest.mark.parametrize("v", [0, 2, 3])
def test_weights_and_losses_equal_one_process(launch, v):
    variant = VARIANTS[v]
    single = train_single_process(MODEL, TRAIN, IDS, B, T, variant, snapshot_steps=(1, 3))
    runs, eps = launch.runs[v], EPS[variant.dtype]
    lr = variant.lr or TRAIN.lr
    w_max = max(float(w.abs().max()) for w in single.weights.values())
    drift = [float((runs[0].snapshots[k] - single.snapshots[k]).abs().max()) for k in (1, 3)]
    assert max_difference(runs[0].weights, single.weights) == drift[1]
    if variant.optimizer == "sgd":
        # each step rounds each weight once (eps |w|) and moves it by lr times a gradient
        # difference within the bound of a sum of B T terms
        per_step = eps * w_max + lr * gradient_bound(single.first_grads, variant.dtype)
        assert drift[0] <= per_step and drift[1] <= 3 * per_step
    else:
        w0_max = float(runs[0].snapshots[1].abs().max())
        predicted, bound = adamw_first_step(single, runs[0], lr, w0_max)
        if variant.dtype == "float64":
            bound = bound * EPS["float64"] / EPS["float32"]
        assert abs(drift[0] - predicted) <= bound
        # every AdamW step moves a weight by at most about lr (beta1 = 0.9, beta2 = 0.99)
        assert drift[1] <= drift[0] + 2 * 2 * lr
    # the first loss is computed from the same weights: the rounding of two means of B T terms
    assert abs(launch.global_losses(v)[0] - single.losses[0]) <= 2 * B * T * eps * single.losses[0]
    assert launch.global_losses(v) == pytest.approx(single.losses, rel=1e-3)
    assert all(r.seconds > 0 and r.cpu_seconds > 0 for r in runs)


def test_a_failing_process_is_reported_not_hung():
    # SGD at a rate of 1e9 makes the loss non-finite: the loop raises in the children
    with pytest.raises(Exception, match="FloatingPointError"):
        run_data_parallel(MODEL, TRAIN, IDS, B, T, variants=[Variant(optimizer="sgd", lr=1e9)],
                          timeout=120)


def load_script():
    return load_module(ROOT / "scripts" / "ddp_train.py")


def test_torchrun_script_refuses_a_bad_environment_and_bad_sizes():
    script = load_script()
    cores = distributed.available_cores()
    with pytest.raises(SystemExit, match="start this script with torchrun"):
        script.check_environment({})
    with pytest.raises(ValueError, match=rf"--nproc_per_node must be at most the {cores} CPU "
                                         rf"cores .*got {cores + 1}"):
        script.check_environment({"RANK": "0", "WORLD_SIZE": str(cores + 1),
                                  "LOCAL_WORLD_SIZE": str(cores + 1)})
    with pytest.raises(ValueError, match="WORLD_SIZE must be a whole number >= 0 .*got 'two'"):
        script.check_environment({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match=r"RANK must lie in \[0, WORLD_SIZE = 2\), got 2"):
        script.check_environment({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"})
    assert script.check_environment({"RANK": "1", "WORLD_SIZE": "2"}) == 2
    for flag in ("--steps", "--batch-size", "--T", "--corpus-bytes"):
        with pytest.raises(ValueError, match=f"{flag} must be >= 1, got 0"):
            script.parse_args([flag, "0"])
    with pytest.raises(ValueError, match="--timeout must be > 0 seconds, got -1.0"):
        script.parse_args(["--timeout", "-1"])


def test_torchrun_script(tmp_path):
    script = load_script()
    argv = ["--steps", "2", "--data", "random", "--corpus-bytes", "3000", "--d-model", "32",
            "--T", "16", "--batch-size", "4", "--out", str(tmp_path)]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "scripts" / "ddp_train.py"), *argv],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 of 2" in done.stdout and "rank 1 of 2" in done.stdout
    ranks = [load_result(tmp_path / f"rank{r}") for r in range(2)]
    model_config, train_config, ids, variant = script.setup(script.parse_args(argv))
    single = train_single_process(model_config, train_config, ids, 4, 16, variant)
    assert max_difference(ranks[0].weights, ranks[1].weights) == 0.0
    assert max_difference(ranks[0].first_grads, single.first_grads) <= gradient_bound(
        single.first_grads, "float32")
    # two AdamW steps, each moving a weight by at most about lr
    assert max_difference(ranks[0].weights, single.weights) <= 2 * 2 * train_config.lr


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
def test_ring_all_reduce_sums_and_sends_2_p_minus_1_over_p(p):
    gen = torch.Generator().manual_seed(p)
    tensors = [torch.randn(6, 7, generator=gen, dtype=torch.float64) for _ in range(p)]
    results, sent = ring_all_reduce(tensors)
    total = torch.stack(tensors).sum(0)
    assert all(torch.allclose(r, total, rtol=0, atol=1e-12) for r in results)
    # each of the p chunks travels p - 1 times in each phase
    assert sum(sent) == 2 * (p - 1) * total.numel()
    even = 42 // p * p  # chunks of equal size
    _, sent_even = ring_all_reduce([torch.ones(even) for _ in range(p)])
    assert sent_even == [ring_all_reduce_bytes(even, p)] * p


def test_ring_steps_finish_chunk_r_plus_1_on_rank_r_after_reduce_scatter():
    p = 4
    states = list(distributed.ring_all_reduce_steps([torch.full((p,), 2.0 ** r)
                                                     for r in range(p)]))
    assert [s.phase for s in states] == ["start"] + ["reduce-scatter"] * 3 + ["all-gather"] * 3
    everyone = 2 ** p - 1  # chunk values are bit masks of the ranks they hold
    assert all(int(states[p - 1].chunks[r][(r + 1) % p]) == everyone for r in range(p))
    assert all(int(v) == everyone for row in states[-1].chunks for v in row)
    assert all(dest == (src + 1) % p for s in states for src, dest, _ in s.sends)


def test_zero_memory_matches_the_papers_example():
    # Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 GPUs, K = 12
    gb = [training_bytes_per_process(7_500_000_000, 64, stage) / 1e9 for stage in range(4)]
    assert [round(x, 1) for x in gb] == [120.0, 31.4, 16.6, 1.9]
    assert training_bytes_per_process(1000, 1, 3) == training_bytes_per_process(1000, 1, 0)


def test_shards_cover_the_batch_in_order():
    x = torch.arange(12).view(6, 2)
    shards = [shard_batch((x, x + 100), r, 3) for r in range(3)]
    assert torch.equal(torch.cat([s[0] for s in shards]), x)
    assert torch.equal(torch.cat([s[1] for s in shards]), x + 100)


def test_bad_input_is_refused_before_any_process_starts(monkeypatch):
    def no_spawn(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(distributed.mp, "spawn", no_spawn)
    run = distributed.run_data_parallel
    with pytest.raises(ValueError, match="5 rows cannot be split evenly over 2 processes"):
        run(MODEL, TRAIN, IDS, 5, T, world_size=2)
    for bad in (0, -1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match="world_size must be an int >= 1, got"):
            run(MODEL, TRAIN, IDS, B, T, world_size=bad)
    cores = distributed.available_cores()
    for bad in (cores + 1, 10**6):
        with pytest.raises(ValueError, match=rf"world_size must be at most the {cores} CPU cores "
                                             rf"this machine gives this process .*got {bad}"):
            run(MODEL, TRAIN, IDS, B, T, world_size=bad)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        run(MODEL, TRAIN, IDS, 0, T)
    with pytest.raises(ValueError, match=r"T must be an int in \[1, 16\]"):
        run(MODEL, TRAIN, IDS, B, 17)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 256\)"):
        run(MODEL, TRAIN, IDS + 300, B, T)
    with pytest.raises(TypeError, match="ids must be a 1-D integer tensor"):
        run(MODEL, TRAIN, IDS.float(), B, T)
    with pytest.raises(ValueError, match="needs a stream at least that long"):
        run(MODEL, TRAIN, IDS[:10], B, T)
    with pytest.raises(TypeError, match="model_config must be a GPTConfig"):
        run({"d_model": 32}, TRAIN, IDS, B, T)
    with pytest.raises(TypeError, match="train_config must be a TrainConfig"):
        run(MODEL, {"steps": 3}, IDS, B, T)
    for bad in ([], "ddp", [Variant(), "sgd"]):
        with pytest.raises(TypeError, match="variants must be a non-empty sequence of Variant"):
            run(MODEL, TRAIN, IDS, B, T, variants=bad)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        run(MODEL, TRAIN, IDS, B, T, timeout=0)
    with pytest.raises(ValueError, match=r"snapshot_steps must be a sequence of ints in \[1, 3\]"):
        run(MODEL, TRAIN, IDS, B, T, snapshot_steps=(4,))


def test_bad_variants_shards_and_sizes():
    with pytest.raises(ValueError, match="Variant: sync must be one of"):
        Variant(sync="nccl")
    with pytest.raises(ValueError, match="Variant: optimizer must be one of"):
        Variant(optimizer="lamb")
    with pytest.raises(ValueError, match="Variant: dtype must be one of"):
        Variant(dtype="float16")
    with pytest.raises(ValueError, match="Variant: lr must be a finite number > 0"):
        Variant(lr=-1.0)
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        train_single_process(MODEL, TRAIN, IDS, B, T, threads=0)
    with pytest.raises(ValueError, match="threads must be at most the .* CPU cores"):
        train_single_process(MODEL, TRAIN, IDS, B, T, threads=distributed.available_cores() + 1)
    with pytest.raises(TypeError, match="rank_seeds must be True or False, got 1"):
        Variant(rank_seeds=1)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        shard_batch((torch.zeros(4, 3), torch.zeros(4, 3)), 2, 2)
    with pytest.raises(ValueError, match="5 rows cannot be split evenly over 2"):
        check_shardable(5, 2)
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        ring_all_reduce_bytes(100, 0)
    with pytest.raises(ValueError,
                       match=r"one shape \(one per rank\), got list \[\(3,\), \(4,\)\]"):
        ring_all_reduce([torch.zeros(3), torch.zeros(4)])
    for bad in ([], torch.zeros(3), "abc", [torch.zeros(2), 1.0]):
        with pytest.raises(ValueError, match="non-empty sequence of tensors of one shape"):
            ring_all_reduce(bad)
    with pytest.raises(ValueError, match="stage must be one of"):
        training_bytes_per_process(100, 2, stage=4)
    with pytest.raises(ValueError, match="n_params must be an int >= 0"):
        training_bytes_per_process(-5, 2)


def test_bad_numbers_dtypes_and_dicts_are_refused():
    for bad in (float("nan"), float("inf"), -1, True, "100", None):
        with pytest.raises(ValueError, match=rf"n_bytes must be a finite number >= 0, got "
                                             rf"{bad!r}"):
            ring_all_reduce_bytes(bad, 2)
    for bad in (True, 1.0, "1"):
        with pytest.raises(ValueError, match=rf"stage must be one of \[0, 1, 2, 3\], got "
                                             rf"{bad!r}"):
            training_bytes_per_process(100, 2, stage=bad)
    with pytest.raises(TypeError, match=r"tensors must share one real number type \(an "
                                        r"all-reduce sums them\), got dtypes \['float32', "
                                        r"'float64'\]"):
        ring_all_reduce([torch.zeros(3), torch.zeros(3, dtype=torch.float64)])
    with pytest.raises(TypeError, match=r"got dtypes \['bool', 'bool'\]"):
        ring_all_reduce([torch.ones(2, dtype=torch.bool)] * 2)
    # integer tensors sum exactly
    assert torch.equal(ring_all_reduce([torch.arange(4)] * 3)[0][0], 3 * torch.arange(4))
    with pytest.raises(ValueError, match="needs at least one tensor in each dict, got two "
                                         "empty dicts"):
        max_difference({}, {})
    with pytest.raises(ValueError, match=r"tensor 'w' has shape \(3,\) in a and \(1,\) in b: "
                                         r"the shapes must be equal"):
        max_difference({"w": torch.zeros(3)}, {"w": torch.zeros(1)})
    with pytest.raises(TypeError, match="b must be a dict of name -> tensor, got a dict with "
                                        "'w': list"):
        max_difference({"w": torch.zeros(1)}, {"w": [0.0]})
    with pytest.raises(TypeError, match="a must be a dict of name -> tensor, got NoneType"):
        max_difference(None, {})
    with pytest.raises(ValueError, match=r"differ in names: \['v', 'w'\]"):
        max_difference({"w": torch.zeros(1)}, {"v": torch.zeros(1)})
    assert max_difference({"w": torch.zeros(0), "v": torch.ones(2)},
                          {"w": torch.zeros(0), "v": torch.zeros(2)}) == 1.0
    with pytest.raises(TypeError, match=r"batch must be a pair \(x, y\) of tensors \(B, T\), "
                                        r"got Tensor"):
        shard_batch(torch.zeros(4, 3), 0, 2)
    with pytest.raises(ValueError, match="x and y must have the same rows, got 4 and 2"):
        shard_batch((torch.zeros(4, 3), torch.zeros(2, 3)), 0, 2)
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'float64'\), "
                                         r"got 'float16'"):
        distributed.build_model(MODEL, 0, "float16")
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=rf"seed must be an int >= 0, got {bad!r}"):
            distributed.build_model(MODEL, bad)
    with pytest.raises(TypeError, match="model_config must be a GPTConfig, got dict"):
        distributed.build_model({}, 0)
