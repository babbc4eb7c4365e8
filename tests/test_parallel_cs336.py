"""DDPOverlap, ShardedOptimizer and FSDP run the way Stanford CS336's assignment 2 tests run
such classes (2025 and 2026 versions: DDP per parameter and bucketed, a sharded optimizer,
FSDP with and without a float16 compute dtype), on toy models of the same kinds written here:

- `Frozen`: a frozen bias inside a sub-module and a frozen free-standing parameter;
- `Tied`: two linear layers sharing one weight;
- `Flat`: Embedding, RMSNorm and bias-free Linear layers with no nn.ModuleList (so FSDP has one
  unit, the root), whose norm computes in float32 and returns its input's dtype; once more
  with a bias in the head (x W^T + b written out, as CS336's own Linear computes).

Every module's forward returns a plain tensor; the loss is computed outside the wrapper.
One launch of 2 gloo processes (one thread each) runs every scenario with
`torch.use_deterministic_algorithms(True)` and warnings turned into errors (none may come out
of our code); the tests read what each rank saw.

The checks are those tests' checks: rank 0's weights broadcast (rank 1's own start replaced,
frozen parameters left alone), every rank holding the same state, 5 SGD steps on each rank's
half of a batch of 20 equal to one process on all 20 (within torch.allclose's defaults), the
frozen parameters untouched; the sharded optimizer equal to the unsharded one (AdamW with
weight decay, and SGD) step for step; FSDP's gathered weights within 1e-6 + 1e-4 |w| of one
process (float32) and within 1e-4 + 1e-4 |w| in float16 against a one-process reference that
casts only the Linear and Embedding weights to float16 (here: every matrix; gains and biases
stay float32), FSDP built as a plain adapter builds it, `FSDP(module, compute_dtype=...)`; the
gradients through `set_detect_anomaly(True, check_nan=False)`, a full gather on every rank keyed
like the unsharded module's named_parameters.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from tests.parallel_launch import run_in_group
from tfbook.parallel.ddp import DDPOverlap
from tfbook.parallel.fsdp import FSDP
from tfbook.parallel.zero import ShardedOptimizer

BATCH, D_IN, D_HID, D_OUT = 20, 8, 24, 4
BUCKETS_MB = {"unbounded": None, "tiny": 1e-4, "two": 0.001, "default": 25.0}
ADAMW = {"lr": 0.1, "weight_decay": 0.1, "betas": (0.9, 0.999), "eps": 1e-8}
FSDP_SHAPES = {"vocab": 100, "d_model": 64, "d_ff": 128}
FSDP_CASES = [("float32", None, "matrices", False), ("float16", torch.float16, "matrices", False),
              ("float16_bias", torch.float16, "matrices", True),
              ("float16_all", torch.float16, "all", False)]  # name, dtype, cast, head bias
FSDP_TOLERANCE = {"float32": (1e-6, 1e-4), "float16": (1e-4, 1e-4)}  # (atol, rtol)


class Frozen(nn.Module):
    """Three linear layers; the middle one's bias and a free-standing pair are frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(D_IN, D_IN, bias=False)
        self.mid = nn.Sequential(nn.Linear(D_IN, D_HID))
        self.mid[0].bias.requires_grad_(False)
        self.out = nn.Linear(D_HID, D_OUT, bias=False)
        self.fixed = nn.Parameter(torch.full((2,), 3.0), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(torch.relu(self.mid(torch.relu(self.inp(x)))))  # (b, D_OUT)


class Tied(nn.Module):
    """Five bias-free linear layers; the fourth uses the second one's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D_IN, D_IN, bias=False)
        self.b = nn.Linear(D_IN, D_HID, bias=False)
        self.c = nn.Linear(D_HID, D_IN, bias=False)
        self.d = nn.Linear(D_IN, D_HID, bias=False)
        self.d.weight = self.b.weight
        self.e = nn.Linear(D_HID, D_OUT, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        for layer in (self.a, self.b, self.c, self.d):
            x = torch.relu(layer(x))
        return self.e(x)  # (b, D_OUT)


class Norm(nn.Module):
    """RMSNorm computing in float32 and returning its input's dtype (a Llama-style norm)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        dtype, x = x.dtype, x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return (self.gain * x).to(dtype)


class Dense(nn.Module):
    """y = x W^T + b written out: a float32 bias beside float16 matrices promotes y to float32
    (torch's nn.Linear, one kernel, would refuse the mix)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / d_in ** 0.5)
        self.bias = nn.Parameter(torch.randn(d_out) / 10)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T + self.bias


class Flat(nn.Module):
    """Embedding, norm, up, relu, norm, down, head: no nn.ModuleList anywhere."""

    def __init__(self, vocab: int, d_model: int, d_ff: int, head_bias: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.norm_in = Norm(d_model)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.norm_mid = Norm(d_ff)
        self.down = nn.Linear(d_ff, d_model, bias=False)
        self.head = Dense(d_model, vocab) if head_bias else nn.Linear(d_model, vocab, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.norm_mid(torch.relu(self.up(self.norm_in(self.embed(ids)))))
        return self.head(self.down(x))  # (b, T, vocab)


def state(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same_on_every_rank(tensors: list[Tensor]) -> bool:
    """All ranks hold equal tensors (a collective)."""
    ok = True
    for t in tensors:
        gathered = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, t.contiguous())
        ok &= all(torch.equal(g, t) for g in gathered)
    return ok


def ddp_run(model_cls: type[nn.Module], bucket_size_mb: float | None, rank: int,
            world_size: int) -> dict:
    """The CS336 DDP check: a baseline on all 20 rows, our wrapper on this rank's 10; the
    largest difference after each of 5 SGD steps, and what the broadcast did."""
    torch.manual_seed(rank)  # every rank builds other weights: rank 0's must win
    baseline = model_cls()
    local = state(baseline)
    ddp = DDPOverlap(copy.deepcopy(baseline), bucket_size_mb=bucket_size_mb)
    frozen = [n for n, p in baseline.named_parameters() if not p.requires_grad]
    out: dict = {"frozen": frozen, "n_buckets": len(ddp.buckets), "steps": [],
                 "names": [n for n, _ in ddp.named_parameters()],
                 "kept_local": {n: torch.equal(p, local[n]) for n, p in
                                ddp.module.named_parameters()},
                 "same_state": same_on_every_rank(list(ddp.module.state_dict().values()))}
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, D_IN, generator=generator)  # (20, D_IN), the same on every rank
    y = torch.randn(BATCH, D_OUT, generator=generator)  # (20, D_OUT)
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.1)
    opt_base = torch.optim.SGD(baseline.parameters(), lr=0.1)
    rows = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)
    for step in range(5):
        opt_ddp.zero_grad()
        opt_base.zero_grad()
        F.mse_loss(baseline(x), y).backward()
        opt_base.step()
        F.mse_loss(ddp(x[rows]), y[rows]).backward()
        ddp.finish_gradient_synchronization()
        opt_ddp.step()
        pairs = [(a.detach(), b.detach()) for a, b in
                 zip(baseline.parameters(), ddp.parameters(), strict=True)]
        out["steps"].append({
            "max_diff": max(float((a - b).abs().max()) for a, b in pairs),
            "allclose": all(torch.allclose(a, b) for a, b in pairs),
            "frozen_untouched": all(torch.equal(p, local[n]) if rank == 0 else True
                                    for n, p in ddp.module.named_parameters()
                                    if not p.requires_grad)})
        torch.manual_seed(42 + step)  # the same shuffle on every rank
        perm = torch.randperm(BATCH)
        x, y = x[perm], y[perm]
    out["frozen_after"] = {n: p.detach().clone() for n, p in ddp.module.named_parameters()
                           if not p.requires_grad}
    return out


def sharded_run(model_cls: type[nn.Module], optimizer_cls: type[torch.optim.Optimizer],
                kwargs: dict) -> dict:
    """The CS336 sharded-optimizer check: 10 steps of ours and of the unsharded optimizer on
    copies of one model (the same seed everywhere) fed the same batches; the largest
    difference after each step."""
    torch.manual_seed(42)
    plain_model = model_cls()
    sharded_model = copy.deepcopy(plain_model)
    plain = optimizer_cls(plain_model.parameters(), **kwargs)
    sharded = ShardedOptimizer(sharded_model.parameters(), optimizer_cls, **kwargs)
    diffs = []
    for _ in range(10):
        x, y = torch.rand(32, D_IN), torch.rand(32, D_OUT)
        for model, optimizer in ((plain_model, plain), (sharded_model, sharded)):
            optimizer.zero_grad()
            ((y - model(x)) ** 2).sum().backward()
            optimizer.step()
        diffs.append(max(float((a - b).detach().abs().max()) for a, b in
                         zip(plain_model.parameters(), sharded_model.parameters(), strict=True)))
    return {"diffs": diffs, "moved": not torch.equal(
        torch.cat([p.reshape(-1) for p in plain_model.parameters()]),
        torch.cat([p.reshape(-1) for p in model_cls().parameters()]))}


def mixed_forward(model: nn.Module, ids: Tensor, dtype: torch.dtype | None) -> Tensor:
    """The one-process reference: the matrices (Linear and Embedding weights) cast to `dtype`
    for this forward pass, differentiably (their gradients arrive float32), the norms' gains
    and the master weights float32."""
    if dtype is None:
        return model(ids)
    params = {n: p.to(dtype) if p.dim() >= 2 else p for n, p in model.named_parameters()}
    return functional_call(model, params, (ids,))


def fsdp_run(compute_dtype: torch.dtype | None, cast: str, head_bias: bool, rank: int,
             world_size: int) -> dict:
    """The CS336 FSDP check: 3 SGD steps of FSDP on this rank's half of 20 sequences against
    the reference on all 20; per step and parameter the largest difference and whether it is
    within the tolerance; the loss's backward under anomaly detection."""
    torch.manual_seed(42)
    base = Flat(**FSDP_SHAPES, head_bias=head_bias)
    reference = copy.deepcopy(base)
    fsdp = (FSDP(copy.deepcopy(base), compute_dtype=compute_dtype) if cast == "matrices" else
            FSDP(copy.deepcopy(base), compute_dtype=compute_dtype, cast=cast))
    opt_fsdp = torch.optim.SGD(fsdp.parameters(), lr=0.01)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.01)
    torch.manual_seed(123)
    ids = torch.randint(0, FSDP_SHAPES["vocab"], (BATCH, 8))  # (20, 8)
    labels = torch.randint(0, FSDP_SHAPES["vocab"], (BATCH,))  # (20,)
    atol, rtol = FSDP_TOLERANCE["float32" if compute_dtype is None else "float16"]
    rows = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)
    steps = []
    for step in range(3):
        opt_fsdp.zero_grad(set_to_none=True)
        opt_ref.zero_grad(set_to_none=True)
        F.cross_entropy(mixed_forward(reference, ids, compute_dtype)[:, -1].float(),
                        labels).backward()
        opt_ref.step()
        logits = fsdp(ids[rows])  # (10, 8, vocab)
        loss = F.cross_entropy(logits[:, -1].float(), labels[rows])
        torch.autograd.set_detect_anomaly(True, check_nan=False)
        try:
            loss.backward()
        finally:
            torch.autograd.set_detect_anomaly(False)
        fsdp.finish_gradient_synchronization()
        opt_fsdp.step()
        full = fsdp.full_state_dict(rank0_only=False)
        steps.append({n: (float((p.detach() - full[n]).abs().max()),
                          torch.allclose(p.data, full[n], atol=atol, rtol=rtol))
                      for n, p in reference.named_parameters()})
        torch.manual_seed(42 + step)
        perm = torch.randperm(BATCH)
        ids, labels = ids[perm], labels[perm]
    return {"steps": steps, "keys": sorted(full), "dtypes": {k: v.dtype for k, v in full.items()},
            "names": sorted(n for n, _ in base.named_parameters()),
            "layout": [(u.name, u.params, u.full_precision) for u in fsdp.layout]}


def fsdp_gradients(compute_dtype: torch.dtype | None, cast: str, head_bias: bool,
                   rank: int) -> dict:
    """After one backward pass of out.sum() on each rank's own ids and the synchronisation:
    every parameter the wrapped module still lists has a gradient of its shape and dtype, and
    every shard (what the optimiser steps) one of its own shape in the master dtype."""
    torch.manual_seed(42)
    fsdp = FSDP(Flat(**FSDP_SHAPES, head_bias=head_bias), compute_dtype=compute_dtype,
                cast=cast)
    torch.manual_seed(rank)
    fsdp(torch.randint(0, FSDP_SHAPES["vocab"], (4, 8))).sum().backward()
    fsdp.finish_gradient_synchronization()
    listed = [(p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype)
              for _, p in fsdp.module.named_parameters() if p.requires_grad]
    shards = [(p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == torch.float32)
              for p in fsdp.parameters()]
    return {"listed": listed, "shards": shards}


class TorchLayers(nn.Module):
    """torch's own layers with biases: Linear, MultiheadAttention, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(D_IN, D_HID)
        self.attn = nn.MultiheadAttention(D_HID, 2, batch_first=True)
        self.out = nn.Linear(D_HID, D_OUT)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.inp(x))  # (b, t, D_HID)
        return self.out(self.attn(h, h, h, need_weights=False)[0])  # (b, t, D_OUT)


def torch_linear(rank: int) -> dict:
    """torch's nn.Linear and nn.MultiheadAttention with biases under float16 compute: their
    biases (vectors, kept float32) are rounded to float16 where their one-dtype kernels use
    them; the step runs, the output is float16."""
    torch.manual_seed(42)
    fsdp = FSDP(TorchLayers(), compute_dtype=torch.float16)
    torch.manual_seed(rank)
    y = fsdp(torch.randn(4, 3, D_IN).half())  # (4, 3, D_OUT)
    y.float().pow(2).sum().backward()
    fsdp.finish_gradient_synchronization()
    return {"dtype": y.dtype, "layout": [(u.params, u.full_precision) for u in fsdp.layout],
            "grads": [p.grad.dtype for p in fsdp.parameters()]}


def _run(rank: int, world_size: int) -> dict:
    torch.use_deterministic_algorithms(True)
    dist.barrier()
    warnings.simplefilter("error")  # no warning may come out of our wrappers
    res: dict = {}
    for model_cls in (Frozen, Tied):
        for name, mb in BUCKETS_MB.items():
            res["ddp", model_cls.__name__, name] = ddp_run(model_cls, mb, rank, world_size)
        for opt_name, opt_cls, kwargs in (("adamw", torch.optim.AdamW, ADAMW),
                                          ("sgd", torch.optim.SGD, {"lr": 0.01,
                                                                    "momentum": 0.9})):
            res["zero", model_cls.__name__, opt_name] = sharded_run(model_cls, opt_cls,
                                                                    kwargs)
    for name, dtype, cast, bias in FSDP_CASES:
        res["fsdp", name] = fsdp_run(dtype, cast, bias, rank, world_size)
        res["fsdp_grads", name] = fsdp_gradients(dtype, cast, bias, rank)
    res["torch_linear"] = torch_linear(rank)
    same = FSDP(Flat(**FSDP_SHAPES), compute_dtype=torch.float32)  # the master dtype
    res["same_dtype_groups"] = [u.full_precision for u in same.layout]
    return res


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    return run_in_group(_run, tmp_path_factory.mktemp("cs336"))


DDP_CASES = [(m, b) for m in ("Frozen", "Tied") for b in BUCKETS_MB]


@pytest.mark.parametrize(("model", "bucket"), DDP_CASES)
def test_ddp_broadcasts_rank_0_and_leaves_frozen_parameters(launch, model, bucket):
    for rank, res in enumerate(launch):
        run = res["ddp", model, bucket]
        assert run["names"] == [f"module.{n}" for n in run["kept_local"]]  # one wrapper level
        for name, kept in run["kept_local"].items():
            # rank 0 keeps its weights; rank 1's are replaced by rank 0's (the frozen bias
            # too: the whole module state is broadcast); `fixed` is 3s on every rank
            assert kept == (rank == 0 or name == "fixed"), name
        assert run["same_state"]
        for step in run["steps"]:
            assert step["frozen_untouched"]
    if model == "Frozen":
        assert launch[0]["ddp", model, bucket]["frozen"] == ["fixed", "mid.0.bias"]
        for res in launch:
            assert torch.equal(res["ddp", model, bucket]["frozen_after"]["fixed"],
                               torch.full((2,), 3.0))


@pytest.mark.parametrize(("model", "bucket"), DDP_CASES)
def test_ddp_five_sgd_steps_equal_one_process_on_the_whole_batch(launch, model, bucket):
    run = launch[0]["ddp", model, bucket]
    assert all(step["allclose"] for step in run["steps"])  # torch.allclose's defaults
    # the same sums in another order: a few float32 roundings of weights below 1 (1e-6 is
    # about 8 units in the last place at 1), far inside allclose's 1e-8 + 1e-5 |w|
    assert max(step["max_diff"] for step in run["steps"]) <= 1e-6


def test_ddp_bucket_counts(launch):
    n = {(m, b): launch[0]["ddp", m, b]["n_buckets"] for m, b in DDP_CASES}
    # Frozen trains 3 tensors (8x8, 24x8, 4x24), Tied 4 (the tied one once); a bucket closes
    # once it holds the cap or more: 0.001 MB (1049 bytes) takes 384 + 768 bytes, then the rest
    assert [n["Frozen", b] for b in BUCKETS_MB] == [1, 3, 2, 1]
    assert [n["Tied", b] for b in BUCKETS_MB] == [1, 4, 2, 1]


@pytest.mark.parametrize("model", ["Frozen", "Tied"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_sharded_optimizer_equals_the_unsharded_one_step_for_step(launch, model, optimizer):
    for res in launch:
        run = res["zero", model, optimizer]
        assert run["diffs"] == [0.0] * 10 and run["moved"]


@pytest.mark.parametrize("name", ["float32", "float16", "float16_bias"])
def test_fsdp_within_the_reference_tolerance(launch, name):
    for res in launch:
        run = res["fsdp", name]
        assert run["keys"] == run["names"]  # gathered on every rank, the unsharded names
        assert all(dtype == torch.float32 for dtype in run["dtypes"].values())  # masters
        for step in run["steps"]:
            assert all(ok for _, ok in step.values()), step
    if name == "float16_bias":  # the vectors form a group of their own, gathered in float32
        assert launch[0]["fsdp", name]["layout"] == [
            ("", ("embed.weight", "up.weight", "down.weight", "head.weight"), False),
            ("", ("norm_in.gain", "norm_mid.gain", "head.bias"), True)]


def test_fsdp_float16_with_every_parameter_rounded_drifts_further(launch):
    # cast="all" (FSDP2's param_dtype) rounds the gains and the bias too
    kept = launch[0]["fsdp", "float16"]["steps"][-1]
    whole = launch[0]["fsdp", "float16_all"]["steps"][-1]
    assert max(d for d, _ in whole.values()) > 4 * max(d for d, _ in kept.values())


@pytest.mark.parametrize("name", [case[0] for case in FSDP_CASES])
def test_fsdp_gradients_after_synchronisation(launch, name):
    for res in launch:
        grads = res["fsdp_grads", name]
        assert all(grads["listed"])  # the module lists no Parameter: they live in the shards
        assert grads["shards"] and all(grads["shards"])


def test_fsdp_torch_linear_bias_rounded_where_used(launch):
    for res in launch:
        run = res["torch_linear"]
        assert run["dtype"] == torch.float16
        assert run["layout"] == [
            (("inp.weight", "attn.in_proj_weight", "attn.out_proj.weight", "out.weight"), False),
            (("inp.bias", "attn.in_proj_bias", "attn.out_proj.bias", "out.bias"), True)]
        assert run["grads"] == [torch.float32, torch.float32]


def test_fsdp_compute_dtype_equal_to_the_masters_keeps_one_group(launch):
    assert launch[0]["same_dtype_groups"] == [False]
