"""ShardedOptimizer (tfbook.parallel.zero) against torch's ZeroRedundancyOptimizer and an
unsharded AdamW, step for step.

One launch of 2 gloo processes (one thread each) runs every scenario and saves what it saw;
the tests read it. Every rank computes the same gradients (the same batch, the same kernels),
so the three optimizers see the same inputs, and AdamW's update is elementwise: wherever a
parameter is stepped, the weights must agree bit for bit.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from tests.parallel_launch import run_in_group
from tests.test_parallel_ddp import loss_of
from tfbook.models.gpt import GPTConfig
from tfbook.parallel.ddp import DDPOverlap, NoProcessGroupError
from tfbook.parallel.zero import ShardedOptimizer, partition_parameters
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


def run_steps(model: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator,
              steps: int) -> None:
    """`steps` steps on whole global batches (the same on every rank: the gradients agree)."""
    for _ in range(steps):
        batch = random_windows(IDS, B, T, generator)
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, batch).backward()
        optimizer.step()


def checkpoint(rank: int) -> dict:
    """Two steps of ours and of torch's ZeRO, both consolidated on rank 0; then two more steps
    of ours (`continued`), of an unsharded AdamW loaded from our state dict (`plain`) and of a
    new ShardedOptimizer loaded from it on every rank (`sharded`), each from the weights and
    the batch generator of the checkpoint."""
    model, zero_model = build_model(MODEL, SEED, "float32"), build_model(MODEL, SEED, "float32")
    ours = ShardedOptimizer(groups(model), torch.optim.AdamW, **ADAMW)
    zero = ZeroRedundancyOptimizer(groups(zero_model), optimizer_class=torch.optim.AdamW,
                                   **ADAMW)
    generator, zero_generator = (torch.Generator().manual_seed(SEED) for _ in range(2))
    run_steps(model, ours, generator, 2)
    run_steps(zero_model, zero, zero_generator, 2)
    ours.param_groups[1]["lr"] = 2e-3  # a scheduler's change after the last step
    ours.consolidate_state_dict(to=0)
    zero.consolidate_state_dict(to=0)
    out: dict = {}
    if rank == 0:
        out["ours_state"], out["zero_state"] = ours.state_dict(), zero.state_dict()
    else:
        try:
            ours.state_dict()
        except RuntimeError as error:
            out["not_consolidated"] = str(error)
    shipped = [out.get("ours_state")]
    dist.broadcast_object_list(shipped, src=0)  # rank 0's checkpoint, everywhere
    weights, generator_state = model.state_dict(), generator.get_state()
    weights = {k: v.clone() for k, v in weights.items()}

    run_steps(model, ours, generator, 2)
    out["continued"] = flat(model).clone()
    for kind in ("plain", "sharded"):
        resumed = build_model(MODEL, SEED + 1, "float32")  # other weights, then the checkpoint's
        resumed.load_state_dict(weights)
        optimizer = (torch.optim.AdamW(groups(resumed), **ADAMW) if kind == "plain" else
                     ShardedOptimizer(groups(resumed), torch.optim.AdamW, **ADAMW))
        optimizer.load_state_dict(copy.deepcopy(shipped[0]))  # loading aliases the tensors
        run_steps(resumed, optimizer, torch.Generator().set_state(generator_state), 2)
        out[kind] = flat(resumed).clone()
        if kind == "plain":
            out["plain_state"] = optimizer.state_dict()
    ours.consolidate_state_dict(to=0)
    out["ours_state_after"] = ours.state_dict() if rank == 0 else None
    return out


class Uneven(nn.Module):
    """Parameters whose sizes are not multiples of 2: 7, 5, 3, 1 and 1 numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(7)), nn.Parameter(torch.randn(5))
        self.c, self.d = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(1))
        self.e = nn.Parameter(torch.randn(1))

    def forward(self) -> torch.Tensor:
        return sum((p * p).sum() * (i + 1) for i, p in enumerate(self.parameters()))


def uneven() -> dict:
    """Ours and an unsharded AdamW on Uneven and on one 1-number parameter, 3 steps each."""
    out: dict = {}
    for name, build in (("uneven", Uneven), ("single", lambda: nn.Linear(1, 1, bias=False))):
        torch.manual_seed(SEED)
        models = {"plain": build().double(), "ours": build().double()}
        models["ours"].load_state_dict(models["plain"].state_dict())
        opts = {"plain": torch.optim.AdamW(models["plain"].parameters(), **ADAMW),
                "ours": ShardedOptimizer(models["ours"].parameters(), torch.optim.AdamW,
                                         **ADAMW)}
        for _ in range(3):
            for kind, model in models.items():
                opts[kind].zero_grad()
                (model() if name == "uneven" else model(torch.ones(1, 1, dtype=torch.float64))
                 ).sum().backward()
                opts[kind].step()
        out[name] = {kind: flat(m).clone() for kind, m in models.items()}
        out[name]["shard_numel"] = list(opts["ours"].shard_numel)
        out[name]["state_bytes"] = opts["ours"].state_bytes()
    return out


class Mixed(nn.Module):
    """Float32 and float64 parameters: one flat buffer per owner and dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(6)), nn.Parameter(torch.randn(4).double())
        self.c, self.d = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(2).double())

    def forward(self) -> torch.Tensor:
        return sum((p.double() ** 2).sum() * (i + 1) for i, p in enumerate(self.parameters()))


def layout(optimizer: ShardedOptimizer) -> list[dict]:
    """Each bucket: its owner, dtype and size, and whether its parameters' data are the
    consecutive slices of its flat buffer (the same storage, at their offsets)."""
    out = []
    for bucket in optimizer.buckets:
        base, size = bucket.flat.data_ptr(), bucket.flat.element_size()
        out.append({"owner": bucket.owner, "dtype": bucket.flat.dtype,
                    "numel": bucket.flat.numel(), "offsets": list(bucket.offsets),
                    "ptrs": [p.data_ptr() for p in bucket.params],
                    "views": all(p.data_ptr() == base + size * i and p.untyped_storage().data_ptr()
                                 == bucket.flat.untyped_storage().data_ptr()
                                 for p, i in zip(bucket.params, bucket.offsets, strict=False)),
                    "values": all(torch.equal(p.detach().reshape(-1), bucket.flat[i:j])
                                  for p, i, j in zip(bucket.params, bucket.offsets,
                                                     bucket.offsets[1:], strict=False))})
    return out


def counted_step(optimizer: torch.optim.Optimizer) -> list[tuple[int, int, int]]:
    """optimizer.step() with torch.distributed.broadcast counted: (src, numel, data_ptr)."""
    calls, original = [], dist.broadcast

    def broadcast(tensor, src, *args, **kwargs):
        calls.append((src, tensor.numel(), tensor.data_ptr()))
        return original(tensor, src, *args, **kwargs)

    dist.broadcast = broadcast
    try:
        optimizer.step()
    finally:
        dist.broadcast = original
    return calls


def bucket_views(rank: int) -> dict:
    """The flat buffers: the tiny GPT with a late group (add_param_group extends the
    buckets), Mixed (two dtypes), and parameters whose p.data is replaced after construction
    (on rank 1 only: a copy, then another dtype on both ranks)."""
    out: dict = {}
    model = build_model(MODEL, SEED, "float64")
    before = {name: p for name, p in model.named_parameters()}
    optimizer = make("ours", model, late_group=True)
    out["same_objects"] = all(p is before[name] for name, p in model.named_parameters())
    out["gpt_numbers"] = (sum(p.numel() for p in before.values()), len(before))
    out["gpt"] = layout(optimizer)
    run_steps(model, optimizer, torch.Generator().manual_seed(SEED), 1)
    out["gpt_calls"] = counted_step(optimizer)
    out["gpt_after"] = layout(optimizer)
    out["gpt_buckets"] = [(b.owner, b.flat.data_ptr(), b.flat.numel()) for b in optimizer.buckets]

    torch.manual_seed(SEED)
    models = {"plain": Mixed(), "ours": Mixed()}
    models["ours"].load_state_dict(models["plain"].state_dict())
    opts = {"plain": torch.optim.AdamW(models["plain"].parameters(), **ADAMW),
            "ours": ShardedOptimizer(models["ours"].parameters(), torch.optim.AdamW, **ADAMW)}
    for kind in ("plain", "ours"):
        opts[kind].zero_grad()
        models[kind]().backward()
    opts["plain"].step()
    out["mixed_calls"] = counted_step(opts["ours"])
    out["mixed"] = layout(opts["ours"])
    out["mixed_equal"] = all(torch.equal(p, q) for p, q in zip(
        models["plain"].parameters(), models["ours"].parameters(), strict=True))

    torch.manual_seed(SEED)
    models = {"plain": Uneven().double(), "ours": Uneven().double()}
    models["ours"].load_state_dict(models["plain"].state_dict())
    opts = {"plain": torch.optim.AdamW(models["plain"].parameters(), **ADAMW),
            "ours": ShardedOptimizer(models["ours"].parameters(), torch.optim.AdamW, **ADAMW)}
    if rank == 1:  # a: owned by rank 0, b: owned by rank 1 (see test_sizes_that_do_not_...)
        for p in (models["ours"].a, models["ours"].b):
            p.data = p.data.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            for kind, m in models.items():
                opts[kind].zero_grad()
                m().backward()
                opts[kind].step()
    out["replaced_equal"] = torch.equal(flat(models["ours"]), flat(models["plain"]))
    out["replaced_warnings"] = [str(w.message) for w in caught
                                if "ShardedOptimizer" in str(w.message)]
    out["replaced_layout"] = layout(opts["ours"])
    opts["ours"].zero_grad(set_to_none=True)  # no step for c: refused before any broadcast
    models["ours"].c.data = models["ours"].c.data.float()
    try:
        opts["ours"].step()
    except ValueError as error:
        out["replaced_dtype"] = str(error)
    return out


def _run(rank: int, world_size: int) -> dict:
    res: dict = {}
    for dtype in ("float64", "float32"):
        res[dtype] = step_for_step(dtype, late_group=False)
    res["late_group"] = step_for_step("float64", late_group=True)
    res["ddp_ours"] = data_parallel(rank, world_size, ours=True)
    res["ddp_torch"] = data_parallel(rank, world_size, ours=False)
    res["checkpoint"] = checkpoint(rank)
    res["uneven"] = uneven()
    res["views"] = bucket_views(rank)
    try:
        ShardedOptimizer(nn.Linear(2, 2).parameters(), ShardedOptimizer, lr=0.1)
    except TypeError as error:
        res["nested"] = str(error)
    try:  # another architecture on rank 1
        ShardedOptimizer(nn.Linear(2, 2 + rank).parameters(), torch.optim.AdamW)
    except ValueError as error:
        res["mismatch"] = str(error)
    return res


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    return run_in_group(_run, tmp_path_factory.mktemp("zero"))


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
    with pytest.raises(NoProcessGroupError, match="process group"):
        ShardedOptimizer(params, torch.optim.AdamW, lr=0.1)
    with pytest.raises(ValueError, match=r"AdamW refused the keyword arguments \{'lr': -1\}"):
        ShardedOptimizer(params, torch.optim.AdamW, lr=-1)
    with pytest.raises(TypeError, match="AdamW refused the keyword arguments .*momentum"):
        ShardedOptimizer(params, torch.optim.AdamW, momentum=0.9)
    with pytest.raises(TypeError, match="params must be an iterable .*got a Linear"):
        ShardedOptimizer(nn.Linear(2, 2), torch.optim.AdamW)


def test_checkpoint_is_torch_zeros_and_resumes_bit_for_bit(launch):
    r0 = launch[0]["checkpoint"]
    ours, zero = r0["ours_state"], r0["zero_state"]
    # the consolidated state is the one torch's ZeroRedundancyOptimizer consolidates
    assert ours["state"].keys() == zero["state"].keys()
    for i, state in ours["state"].items():
        assert state.keys() == zero["state"][i].keys()
        assert all(torch.equal(v, zero["state"][i][k]) for k, v in state.items())
    assert [g["params"] for g in ours["param_groups"]] == [
        g["params"] for g in zero["param_groups"]]
    assert [g["weight_decay"] for g in ours["param_groups"]] == [0.1, 0.0]
    assert [g["lr"] for g in ours["param_groups"]] == [3e-3, 2e-3]  # the change is saved
    assert ours["param_groups"][0]["amsgrad"] is False  # AdamW's defaults are there too
    # an unsharded AdamW and a new ShardedOptimizer resume from it as if never stopped
    for rank in launch:
        run = rank["checkpoint"]
        assert torch.equal(run["plain"], run["continued"])
        assert torch.equal(run["sharded"], run["continued"])
    after, plain = r0["ours_state_after"], r0["plain_state"]
    for i, state in plain["state"].items():
        assert all(torch.equal(v, after["state"][i][k]) for k, v in state.items())
    assert "consolidate_state_dict" in launch[1]["checkpoint"]["not_consolidated"]


def test_sizes_that_do_not_split_evenly(launch):
    for rank in launch:
        run = rank["uneven"]
        for name in ("uneven", "single"):
            assert torch.equal(run[name]["ours"], run[name]["plain"])
        # largest first, each to the rank holding fewer numbers (ties: rank 0): 7 -> 0, 5 -> 1,
        # 3 -> 1, 1 -> 0, 1 -> 0; the shares differ by at most the largest parameter
        assert run["uneven"]["shard_numel"] == [7 + 1 + 1, 5 + 3]
        assert run["single"]["shard_numel"] == [1, 0]  # one rank owns nothing
    assert launch[1]["uneven"]["single"]["state_bytes"] == 0
    assert launch[0]["uneven"]["single"]["state_bytes"] > 0


def test_partition_rule():
    assert partition_parameters([6, 1, 4, 3], 2) == [0, 0, 1, 1]  # 6 + 1 and 4 + 3
    assert partition_parameters([7, 5, 3, 1, 1], 2) == [0, 1, 1, 0, 0]
    assert partition_parameters([2, 2], 2, start=[5, 0]) == [1, 1]  # dealt on from a group
    assert partition_parameters([], 3) == []
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        partition_parameters([1], 0)
    with pytest.raises(ValueError, match="numels must be a sequence of ints >= 0"):
        partition_parameters([1.5], 2)
    with pytest.raises(ValueError, match="start must give 2 numbers"):
        partition_parameters([1], 2, start=[0])


def test_parameters_are_views_of_one_flat_buffer_per_owner(launch):
    for res in launch:
        run = res["views"]
        assert run["same_objects"]  # the model's own Parameter objects, not copies
        gpt = run["gpt"]
        assert [b["owner"] for b in gpt] == [0, 1]  # one float64 buffer per owner
        assert all(b["views"] and b["values"] for b in gpt)
        # the late group's parameters are in the buffers too: every parameter, once
        assert sum(b["numel"] for b in gpt) == run["gpt_numbers"][0]
        assert sum(len(b["ptrs"]) for b in gpt) == run["gpt_numbers"][1]
        # a step: one broadcast per owner, of the buffer itself (no packed copy), and the
        # parameters are still the same slices of the same buffers
        assert run["gpt_calls"] == [(r, n, ptr) for r, ptr, n in run["gpt_buckets"]]
        assert [b["ptrs"] for b in run["gpt_after"]] == [b["ptrs"] for b in gpt]
        assert all(b["views"] and b["values"] for b in run["gpt_after"])
        # two dtypes: one buffer and one broadcast per owner and dtype
        mixed = run["mixed"]
        assert sorted((b["owner"], str(b["dtype"])) for b in mixed) == [
            (0, "torch.float32"), (0, "torch.float64"), (1, "torch.float32"),
            (1, "torch.float64")]
        assert [(src, n) for src, n, _ in run["mixed_calls"]] == [
            (b["owner"], b["numel"]) for b in mixed]
        assert all(b["views"] for b in mixed) and run["mixed_equal"]


def test_replaced_parameter_data_falls_back_to_copies(launch):
    for rank, res in enumerate(launch):
        run = res["views"]
        assert run["replaced_equal"]  # still AdamW's weights, bit for bit, on both ranks
        if rank == 1:  # only rank 1 replaced a and b: it warns once and copies them
            assert len(run["replaced_warnings"]) == 1
            assert "2 parameter(s) no longer share the flat buffer" in run["replaced_warnings"][0]
            assert not all(b["views"] for b in run["replaced_layout"])
        else:
            assert run["replaced_warnings"] == []
            assert all(b["views"] for b in run["replaced_layout"])
        assert "build the optimizer after converting the model" in run["replaced_dtype"]
        assert "torch.float32" in run["replaced_dtype"]
