"""DDPOverlap (tfbook.parallel.ddp) against torch's DistributedDataParallel and one process.

One launch of 2 gloo processes (one thread each) runs every scenario and saves what it saw;
the tests read it. Against torch's DDP the comparison is exact: for p = 2 halving is exact, so
DDP's (g0 / 2) + (g1 / 2) and our (g0 + g1) / 2 are the same bits, and the same kernels run in
the same processes. Against one process the sums are added in another order: gradients within
the rounding bound of a sum of B T terms, float64 weights after three AdamW steps within 2^-40.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.parallel_launch import run_in_group
from tfbook.models.gpt import GPTConfig
from tfbook.parallel.ddp import (
    DDPOverlap,
    NoProcessGroupError,
    check_data_parallel,
    plan_buckets,
)
from tfbook.train.data import random_windows
from tfbook.train.distributed import build_model, shard_batch

MODEL = replace(GPTConfig.tiny(), d_model=32, max_len=16)
B, T, STEPS, LR, SEED = 4, 16, 3, 3e-3, 3
IDS = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0))
BUCKETS_MB = {"tiny": 1e-4, "small": 0.02, "one": 25.0}  # ~one parameter each .. one bucket
EPS = {"float32": torch.finfo(torch.float32).eps, "float64": torch.finfo(torch.float64).eps}


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch  # (b, T), (b, T)
    return F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())


def train(dtype: str, wrap, rank: int = 0, world_size: int = 1, seed: int = SEED) -> dict:
    """STEPS AdamW steps of the tiny GPT, wrapped by `wrap`, on this rank's rows of each
    global batch; the first averaged gradients, the final weights, the first step's timeline."""
    model = build_model(MODEL, seed, dtype)
    wrapped = wrap(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    generator = torch.Generator().manual_seed(SEED)
    out: dict = {}
    for step in range(STEPS):
        batch = shard_batch(random_windows(IDS, B, T, generator), rank, world_size)
        optimizer.zero_grad(set_to_none=True)
        loss_of(wrapped, batch).backward()
        if isinstance(wrapped, DDPOverlap):
            wrapped.finish_gradient_synchronization()
            if step == 0:
                out["timeline"] = [vars(t) for t in wrapped.timeline]
                out["backward_seconds"] = wrapped.backward_seconds
                out["n_buckets"] = len(wrapped.buckets)
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
    out["weights"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


class Partly(nn.Module):
    """A layer every rank uses, one only rank 1 uses, one nobody uses, and a frozen one."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.rank1, self.unused = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3)
        self.frozen = nn.Linear(3, 3).requires_grad_(False)

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        h = self.frozen(self.used(x))
        return (self.rank1(h) if rank == 1 else h).sum()


def grads_of(model: nn.Module) -> dict:
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _run(rank: int, world_size: int) -> dict:
    res: dict = {}
    for dtype in ("float64", "float32"):
        res[dtype, "torch"] = train(dtype, DistributedDataParallel, rank, world_size)
        for name, mb in BUCKETS_MB.items():
            if dtype == "float32" and name == "small":
                continue
            res[dtype, name] = train(dtype, lambda m, mb=mb: DDPOverlap(m, mb),
                                     rank, world_size)
    res["no_overlap"] = train("float64", lambda m: DDPOverlap(m, 1e-4, overlap=False),
                              rank, world_size)
    # each rank builds another model: the broadcast makes rank 0's the start everywhere
    res["rank_seeds"] = train("float64", lambda m: DDPOverlap(m, 1e-4), rank, world_size,
                              seed=SEED + rank)

    torch.manual_seed(rank)  # each rank builds other weights and sees other inputs
    partly = Partly().double()
    ddp = DDPOverlap(partly, 1e-4)
    start = {n: p.detach().clone() for n, p in partly.named_parameters()}
    ddp(torch.randn(2, 3, dtype=torch.float64), rank).backward()
    local = grads_of(partly)
    ddp.finish_gradient_synchronization()
    res["partly"] = {"start": start, "local": local, "grads": grads_of(partly)}

    try:  # another architecture on rank 1
        DDPOverlap(nn.Linear(3, 3 + rank))
    except ValueError as error:
        res["mismatch"] = str(error)
    # a second backward without finish_gradient_synchronization in between
    ddp(torch.randn(2, 3, dtype=torch.float64), rank).backward()
    try:
        ddp(torch.randn(2, 3, dtype=torch.float64), rank).backward()
    except RuntimeError as error:
        res["twice"] = str(error)
    ddp.finish_gradient_synchronization()
    return res


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    return run_in_group(_run, tmp_path_factory.mktemp("ddp"))


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_equal_to_torch_ddp_bit_for_bit(launch, dtype):
    for rank in launch:
        reference = rank[dtype, "torch"]
        for name in BUCKETS_MB:
            if (dtype, name) not in rank:
                continue
            assert max_diff(rank[dtype, name]["grads"], reference["grads"]) == 0.0
            assert max_diff(rank[dtype, name]["weights"], reference["weights"]) == 0.0
    assert max_diff(launch[0][dtype, "tiny"]["weights"], launch[1][dtype, "tiny"]["weights"]) == 0


def test_bucket_sizes_make_many_buckets_or_one(launch):
    n = {name: launch[0]["float64", name]["n_buckets"] for name in BUCKETS_MB}
    trainable = len(list(build_model(MODEL, SEED, "float64").parameters()))
    assert n["tiny"] == trainable  # every parameter is past 1e-4 MB: one bucket each
    assert 1 < n["small"] < trainable and n["one"] == 1


def test_tied_weights_appear_once():
    model = build_model(MODEL, SEED, "float64")
    assert model.lm_head.weight is model.tok_emb.weight
    buckets = plan_buckets(list(model.parameters()), 1e-4)
    ids = [id(p) for bucket in buckets for p in bucket]
    assert len(ids) == len(set(ids)) and id(model.tok_emb.weight) in ids
    # the tied matrix is registered first, so its bucket is the last to be reduced
    assert len(buckets[-1]) == 1 and buckets[-1][0] is model.tok_emb.weight


def test_buckets_start_during_the_backward_pass_in_order(launch):
    for rank in launch:
        run = rank["float64", "tiny"]
        timeline = run["timeline"]
        assert [t["bucket"] for t in timeline] == list(range(run["n_buckets"]))
        assert all(t["during_backward"] for t in timeline)
        starts = [t["started"] for t in timeline]
        assert starts == sorted(starts) and 0 <= starts[0]
        assert starts[-1] <= run["backward_seconds"]  # all launched before backward ended
        assert all(t["waited"] >= t["started"] for t in timeline)
        assert sum(t["numel"] for t in timeline) == sum(
            g.numel() for g in run["grads"].values())


def test_without_overlap_the_same_sums_after_the_backward_pass(launch):
    for rank in launch:
        run, overlapped = rank["no_overlap"], rank["float64", "tiny"]
        assert max_diff(run["grads"], overlapped["grads"]) == 0
        assert max_diff(run["weights"], overlapped["weights"]) == 0
        assert not any(t["during_backward"] for t in run["timeline"])
        assert all(t["started"] >= run["backward_seconds"] for t in run["timeline"])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_equal_to_one_process_on_the_global_batch(launch, dtype):
    single = train(dtype, lambda m: m)
    eps = EPS[dtype]
    g_max = max(float(g.abs().max()) for g in single["grads"].values())
    assert max_diff(launch[0][dtype, "tiny"]["grads"], single["grads"]) <= B * T * eps * g_max
    if dtype == "float64":
        assert max_diff(launch[0][dtype, "tiny"]["weights"], single["weights"]) <= 2**-40


def test_rank_0s_weights_are_broadcast(launch):
    for rank in launch:
        assert max_diff(rank["rank_seeds"]["weights"], rank["float64", "tiny"]["weights"]) == 0


def test_parameters_without_gradients(launch):
    r0, r1 = launch[0]["partly"], launch[1]["partly"]
    assert max_diff(r0["start"], r1["start"]) == 0  # broadcast at construction
    for r in (r0, r1):
        assert r["grads"]["unused.weight"] is None and r["grads"]["frozen.weight"] is None
    assert r0["local"]["rank1.weight"] is None and r1["local"]["rank1.weight"] is not None
    for name in ("used.weight", "used.bias", "rank1.weight"):
        local0 = r0["local"][name] if r0["local"][name] is not None else 0
        expected = (local0 + r1["local"][name]) / 2
        assert torch.equal(r0["grads"][name], expected)
        assert torch.equal(r1["grads"][name], expected)


def test_misuse_inside_a_group_is_refused(launch):
    for rank in launch:
        assert "same parameters" in rank["mismatch"] and "[1]" in rank["mismatch"]
        assert "finish_gradient_synchronization" in rank["twice"]


def test_bad_input_is_refused_before_any_group():
    assert not dist.is_initialized()
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"bucket_size_mb must be a finite number of "
                                             rf"megabytes > 0 .*got {bad!r}"):
            DDPOverlap(nn.Linear(2, 2), bad)
    for bad in ("25", True):
        with pytest.raises(TypeError, match=r"bucket_size_mb must be .*got (str|bool)"):
            DDPOverlap(nn.Linear(2, 2), bad)
    with pytest.raises(TypeError, match="bucket_size_mb must be"):
        plan_buckets([nn.Parameter(torch.ones(1))], "1")
    assert len(plan_buckets(list(nn.Linear(300, 300).parameters()), None)) == 1
    assert check_data_parallel(8, 2) == 4
    with pytest.raises(ValueError, match="batch_size must be a multiple of world_size"):
        check_data_parallel(6, 4)
    with pytest.raises(TypeError, match="overlap must be"):
        DDPOverlap(nn.Linear(2, 2), 1.0, overlap="yes")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        DDPOverlap(lambda x: x)
    with pytest.raises(NoProcessGroupError, match="init_process_group"):
        DDPOverlap(nn.Linear(2, 2))
    assert issubclass(NoProcessGroupError, RuntimeError)
