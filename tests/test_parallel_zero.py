"""ShardedOptimizer (tfbook.parallel.zero) against torch's ZeroRedundancyOptimizer and an
unsharded AdamW, step for step.

One launch of 2 gloo processes (one thread each) runs every scenario and saves what it saw;
the tests read it. Every rank computes the same gradients (the same batch, the same kernels),
so the three optimizers see the same inputs, and AdamW's update is elementwise: wherever a
parameter is stepped, the weights must agree bit for bit.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from tests.parallel_launch import spawn_scenarios
from tests.test_parallel_ddp import loss_of
from tfbook.models.gpt import GPTConfig
from tfbook.parallel.ddp import DDPOverlap
from tfbook.parallel.zero import ShardedOptimizer
from tfbook.train.data import random_windows
from tfbook.train.distributed import build_model, shard_batch

MODEL = replace(GPTConfig.tiny(), d_model=32, max_len=16)
B, T, STEPS, SEED = 4, 16, 3, 3
IDS = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0))
ADAMW = {"lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}


def groups(model: nn.Module) -> list[dict]:
    """Two groups as the book's AdamW has them: decay on matrices, none on vectors."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def make(kind: str, model: nn.Module, late_group: bool) -> torch.optim.Optimizer:
    """An AdamW over `model`: unsharded, ours, or torch's ZeRO; with late_group the vector
    group (at another learning rate) is added after construction with add_param_group."""
    first, second = groups(model)
    given = [first] if late_group else [first, second]
    if kind == "plain":
        optimizer = torch.optim.AdamW(given, **ADAMW)
    elif kind == "ours":
        optimizer = ShardedOptimizer(given, torch.optim.AdamW, **ADAMW)
    else:
        optimizer = ZeroRedundancyOptimizer(given, optimizer_class=torch.optim.AdamW, **ADAMW)
    if late_group:
        optimizer.add_param_group({**second, "lr": 1e-3})
    return optimizer


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # (P,)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for s in optimizer.state.values()
               for t in s.values() if isinstance(t, torch.Tensor))


def step_for_step(dtype: str, late_group: bool) -> dict:
    """STEPS steps of the three optimizers on copies of the tiny GPT fed the same gradients
    (the whole global batch on every rank); the learning rate is changed before the last
    step, as a scheduler would. The weights after each step and the state each holds."""
    models = {kind: build_model(MODEL, SEED, dtype) for kind in ("plain", "ours", "zero")}
    optimizers = {kind: make(kind, m, late_group) for kind, m in models.items()}
    generator = torch.Generator().manual_seed(SEED)
    out: dict = {kind: [] for kind in models}
    for step in range(STEPS):
        batch = random_windows(IDS, B, T, generator)
        for kind, model in models.items():
            optimizers[kind].zero_grad(set_to_none=True)
            loss_of(model, batch).backward()
            if step == STEPS - 1:
                optimizers[kind].param_groups[0]["lr"] = 5e-3
            optimizers[kind].step()
            out[kind].append(flat(model).clone())
    out["state_bytes"] = {"plain": state_bytes(optimizers["plain"]),
                          "ours": optimizers["ours"].state_bytes(),
                          "zero": state_bytes(optimizers["zero"].optim)}
    out["largest_param_state"] = max(2 * p.numel() * p.element_size()
                                     for p in models["plain"].parameters())
    return out


def data_parallel(rank: int, world_size: int, ours: bool) -> torch.Tensor:
    """DDPOverlap + ShardedOptimizer, or torch's DDP + ZeroRedundancyOptimizer: the weights
    after STEPS steps on each rank's rows of the global batches."""
    model = build_model(MODEL, SEED, "float64")
    wrapped = DDPOverlap(model, 0.02) if ours else DistributedDataParallel(model)
    optimizer = (ShardedOptimizer(groups(model), torch.optim.AdamW, **ADAMW) if ours else
                 ZeroRedundancyOptimizer(groups(model), optimizer_class=torch.optim.AdamW,
                                         **ADAMW))
    generator = torch.Generator().manual_seed(SEED)
    for _ in range(STEPS):
        batch = shard_batch(random_windows(IDS, B, T, generator), rank, world_size)
        optimizer.zero_grad(set_to_none=True)
        loss_of(wrapped, batch).backward()
        if ours:
            wrapped.finish_gradient_synchronization()
        optimizer.step()
    return flat(model).clone()


def _worker(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    res: dict = {}
    try:
        for dtype in ("float64", "float32"):
            res[dtype] = step_for_step(dtype, late_group=False)
        res["late_group"] = step_for_step("float64", late_group=True)
        res["ddp_ours"] = data_parallel(rank, world_size, ours=True)
        res["ddp_torch"] = data_parallel(rank, world_size, ours=False)
        try:
            ShardedOptimizer(nn.Linear(2, 2).parameters(), ShardedOptimizer, lr=0.1)
        except TypeError as error:
            res["nested"] = str(error)
        try:  # another architecture on rank 1
            ShardedOptimizer(nn.Linear(2, 2 + rank).parameters(), torch.optim.AdamW)
        except ValueError as error:
            res["mismatch"] = str(error)
        torch.save(res, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    return spawn_scenarios(_worker, tmp_path_factory.mktemp("zero"))


@pytest.mark.parametrize("scenario", ["float64", "float32", "late_group"])
def test_equal_to_zero_and_to_unsharded_adamw_step_for_step(launch, scenario):
    for rank in launch:
        run = rank[scenario]
        for step in range(STEPS):
            assert torch.equal(run["ours"][step], run["plain"][step])
            assert torch.equal(run["ours"][step], run["zero"][step])
        assert not torch.equal(run["plain"][0], run["plain"][1])  # the steps moved something
    assert torch.equal(launch[0][scenario]["ours"][-1], launch[1][scenario]["ours"][-1])


def test_a_late_group_keeps_its_own_learning_rate(launch):
    # the same gradients, the vector group at 1e-3 instead of 3e-3: other weights
    assert not torch.equal(launch[0]["late_group"]["ours"][0], launch[0]["float64"]["ours"][0])


def test_each_rank_holds_about_half_the_state(launch):
    for dtype in ("float64", "float32", "late_group"):
        shares = [rank[dtype]["state_bytes"]["ours"] for rank in launch]
        total, largest = launch[0][dtype]["state_bytes"]["plain"], \
            launch[0][dtype]["largest_param_state"]
        assert sum(shares) == total
        # greedy by size, largest first: no rank is more than one parameter past half
        assert all(0 < s <= total / 2 + largest for s in shares)
        assert shares == [rank[dtype]["state_bytes"]["zero"] for rank in launch]


def test_with_data_parallel_equal_to_torch(launch):
    for rank in launch:
        assert torch.equal(rank["ddp_ours"], rank["ddp_torch"])
    assert torch.equal(launch[0]["ddp_ours"], launch[1]["ddp_ours"])


def test_bad_input_is_refused(launch):
    assert "optimizer_cls must be" in launch[0]["nested"]
    for rank in launch:
        assert "same shapes" in rank["mismatch"] and "[1]" in rank["mismatch"]
    assert not dist.is_initialized()
    params = list(nn.Linear(2, 2).parameters())
    for bad in (torch.optim.AdamW(params), "adamw", nn.Linear, None):
        with pytest.raises(TypeError, match="optimizer_cls must be a torch.optim.Optimizer"):
            ShardedOptimizer(params, bad, lr=0.1)
    with pytest.raises(RuntimeError, match="process group"):
        ShardedOptimizer(params, torch.optim.AdamW, lr=0.1)
