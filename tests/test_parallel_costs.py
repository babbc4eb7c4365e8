"""tfbook.parallel.costs: the formulas against the models and the existing accounting, and
against what the wrappers of tfbook.parallel actually send and hold.

One launch of 2 gloo processes (one thread each) runs one training step of every strategy on
a small GPT with torch.distributed's functions wrapped, counting the bytes each rank hands to
all_reduce, broadcast, all_gather, reduce_scatter and (i)send, and saves what it counted
together with the memory that can be counted exactly (optimizer state, FSDP shards, the
micro-batches a pipeline stage keeps). Byte counts do not depend on float order: the tests
compare them for equality.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.parallel_launch import run_in_group
from tfbook.models.gpt import GPT, GPTConfig, gpt_on_meta
from tfbook.models.llama import smollm2_135m, tiny_llama
from tfbook.models.params import count_parameters
from tfbook.parallel.costs import (
    STRATEGIES,
    Workload,
    cost_table,
    ddp,
    format_bytes,
    format_table,
    fsdp,
    fsdp_units,
    n_parameters,
    one_process,
    pipeline,
    ring,
    ring_bytes_per_block,
    strategy_costs,
    tensor_parallel,
    tensor_parallel_numels,
    zero1,
    zero_partition,
)
from tfbook.parallel.ddp import DDPOverlap
from tfbook.parallel.fsdp import FSDP
from tfbook.parallel.pipeline import GPTStage, pipeline_step, sync_tied_gradients
from tfbook.parallel.ring import ring_attention, shard_sequence
from tfbook.parallel.tensor import tensor_parallel_model
from tfbook.parallel.zero import ShardedOptimizer
from tfbook.train.distributed import build_model, shard_batch, training_bytes_per_process
from tfbook.train.loop import lm_loss

MODEL = replace(GPTConfig.tiny(), d_model=32, max_len=16)
B, T, M, P = 4, 16, 2, 2  # batch, sequence, micro-batches, ranks

KIND = {"all_reduce": "all_reduce", "broadcast": "broadcast", "all_gather": "all_gather",
        "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
        "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
        "reduce_scatter_single": "reduce_scatter", "send": "send", "isend": "send"}
OWN_PART = {"all_reduce": "tensor", "broadcast": "tensor", "all_gather": "tensor",
            "all_gather_into_tensor": "input_tensor", "all_gather_single": "input_tensor",
            "reduce_scatter": "input_list", "reduce_scatter_tensor": "input",
            "reduce_scatter_single": "input", "send": "tensor", "isend": "tensor"}


class Counter:
    """Wraps torch.distributed's functions (as tfbook's modules call them, `dist.<name>`):
    per kind, the bytes of the rank's own part of each call; nested calls counted once."""

    def __init__(self) -> None:
        self.passed: dict[str, int] = {}
        self.owned_broadcast = 0  # broadcast bytes whose source is this rank
        self._depth = 0
        for name in KIND:
            if hasattr(dist, name):
                setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def reset(self) -> None:
        self.passed, self.owned_broadcast = {}, 0

    def _wrap(self, name, fn):
        signature = inspect.signature(fn)

        def counted(*args, **kwargs):
            if self._depth == 0:
                bound = signature.bind(*args, **kwargs).arguments
                part = bound[OWN_PART[name]]
                parts = part if isinstance(part, list | tuple) else [part]
                n = sum(t.numel() * t.element_size() for t in parts)
                self.passed[KIND[name]] = self.passed.get(KIND[name], 0) + n
                if name == "broadcast" and bound["src"] == dist.get_rank():
                    self.owned_broadcast += n
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if isinstance(t, torch.Tensor))


def saved_bytes(params, run) -> tuple[object, int]:
    """run() under a saved-tensor hook: its result and the bytes of the distinct storages
    autograd kept (parameters' storages excluded)."""
    skip = {p.untyped_storage()._cdata for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in skip:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return out, sum(seen.values())


def _run(rank: int, world_size: int) -> dict:
    res: dict = {}
    counter = Counter()
    g = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, MODEL.vocab_size, (B, T), generator=g),
             torch.randint(0, MODEL.vocab_size, (B, T), generator=g))
    mine = shard_batch(batch, rank, world_size)

    model = build_model(MODEL, 0)  # DDP: a replica, gradients all-reduced in buckets
    wrapped = DDPOverlap(model, bucket_size_mb=0.01)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    counter.reset()
    lm_loss(wrapped, mine).backward()
    wrapped.finish_gradient_synchronization()
    optimizer.step()
    res["DDP"] = {"passed": dict(counter.passed), "state": state_bytes(optimizer),
                  "buckets": len(wrapped.buckets)}

    model = build_model(MODEL, 0)  # ZeRO-1: the same, optimizer state sharded
    wrapped = DDPOverlap(model, bucket_size_mb=0.01)
    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    counter.reset()
    lm_loss(wrapped, mine).backward()
    wrapped.finish_gradient_synchronization()
    optimizer.step()
    res["ZeRO-1"] = {"passed": dict(counter.passed), "owned": counter.owned_broadcast,
                     "state": optimizer.state_bytes(), "inner": state_bytes(optimizer.inner)}

    model = build_model(MODEL, 0)  # FSDP: blocks and root sharded
    wrapped = FSDP(model)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    counter.reset()
    lm_loss(wrapped, mine).backward()
    wrapped.finish_gradient_synchronization()
    optimizer.step()
    shards = list(wrapped.parameters())
    res["FSDP"] = {"passed": dict(counter.passed), "state": state_bytes(optimizer),
                   "shards": sum(t.numel() * t.element_size() for t in shards),
                   "grads": sum(t.grad.numel() * t.grad.element_size() for t in shards),
                   "layout": [(u.name, u.numel, u.padded) for u in wrapped.layout]}

    model = build_model(MODEL, 0)  # tensor parallel: every block split, whole batch
    split = tensor_parallel_model(model)
    counter.reset()
    loss, kept = saved_bytes(list(split.parameters()), lambda: F.cross_entropy(
        split(batch[0]).logits.flatten(0, 1), batch[1].flatten()))
    loss.backward()
    res["tensor"] = {"passed": dict(counter.passed), "activations": kept,
                     "weights": sum(p.numel() * p.element_size()
                                    for p in split.parameters())}

    for schedule in ("gpipe", "1f1b"):  # pipeline: one stage per rank, M micro-batches
        model = build_model(MODEL, 0)
        stage = GPTStage(model, rank, world_size)
        optimizer = torch.optim.AdamW(stage.parameters(), lr=1e-3)
        counter.reset()
        stats = pipeline_step(stage, *batch, n_micro=M, schedule=schedule)
        sync_tied_gradients(stage)
        optimizer.step()
        res["pipeline", schedule] = {"passed": dict(counter.passed), "state": state_bytes(
            optimizer), "peak": stats.peak_activations}

    torch.manual_seed(1)  # ring attention of one block's shapes: (B, H, T, D), causal
    H, D = MODEL.n_heads, MODEL.d_model // MODEL.n_heads
    q, k, v = (shard_sequence(torch.randn(B, H, T, D), rank, world_size).requires_grad_()
               for _ in range(3))
    counter.reset()
    ring_attention(q, k, v, causal=True).sum().backward()
    res["ring"] = {"passed": dict(counter.passed)}
    return res


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    return run_in_group(_run, tmp_path_factory.mktemp("costs"), world_size=P)


def workload(**changes) -> Workload:
    return replace(Workload(MODEL, B, T, P, n_micro=M), **changes)


# ---- measured: what the wrappers send and hold -------------------------------------------

def test_ddp_sends_what_the_formula_says(launch):
    cost = ddp(workload())
    for rank, run in zip(cost.ranks, launch, strict=True):
        assert run["DDP"]["buckets"] > 1  # several buckets: the flags come with each
        assert run["DDP"]["passed"] == rank.passed
        assert run["DDP"]["state"] == rank.optimizer_state


def test_zero1_state_and_broadcasts_per_rank(launch):
    cost = zero1(workload())
    for rank, run in zip(cost.ranks, launch, strict=True):
        assert run["ZeRO-1"]["passed"] == rank.passed
        assert run["ZeRO-1"]["state"] == run["ZeRO-1"]["inner"] == rank.optimizer_state
        # the owner sends each of its parameters to the p - 1 others
        assert (P - 1) * run["ZeRO-1"]["owned"] == rank.wire["broadcast"]
    assert sum(r["ZeRO-1"]["owned"] for r in launch) == cost.ranks[0].passed["broadcast"]
    assert launch[0]["ZeRO-1"]["state"] != launch[1]["ZeRO-1"]["state"]  # whole parameters


def test_fsdp_shards_padding_and_collectives(launch):
    cost = fsdp(workload())
    units = fsdp_units(MODEL, P)
    for rank, run in zip(cost.ranks, launch, strict=True):
        assert run["FSDP"]["layout"] == units
        assert run["FSDP"]["passed"] == rank.passed
        assert run["FSDP"]["shards"] == run["FSDP"]["grads"] == rank.weights == rank.gradients
        assert run["FSDP"]["state"] == rank.optimizer_state
    # an odd width leaves padding, counted in shards and reduce-scatters alike
    odd = fsdp_units(replace(MODEL, d_model=30, n_heads=3), 4)
    assert any(N > n for _, n, N in odd) and all(N % 4 == 0 and N - n < 4 for _, n, N in odd)


def test_tensor_parallel_all_reduces_and_shard(launch):
    cost = tensor_parallel(workload())
    for rank, run in zip(cost.ranks, launch, strict=True):
        assert run["tensor"]["passed"] == rank.passed
        assert run["tensor"]["passed"]["all_reduce"] == 4 * MODEL.n_layers * B * T * \
            MODEL.d_model * 4
        assert run["tensor"]["weights"] == rank.weights
        assert run["tensor"]["activations"] == rank.activations


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_sends_and_keeps(launch, schedule):
    cost = pipeline(workload(schedule=schedule))
    timing = 8  # pipeline_step also all-reduces its span (one float64) to time the step
    for s, (rank, run) in enumerate(zip(cost.ranks, launch, strict=True)):
        measured = dict(run["pipeline", schedule]["passed"])
        measured["all_reduce"] -= timing
        assert measured == rank.passed
        assert run["pipeline", schedule]["state"] == rank.optimizer_state
        kept = run["pipeline", schedule]["peak"]
        assert kept == (M if schedule == "gpipe" else min(P - s, M))
    # with more micro-batches than stages, 1F1B's first stage keeps p of them, GPipe's all m
    gpipe, one_f_one_b = (pipeline(workload(schedule=k, n_micro=B)).ranks[0].activations
                          for k in ("gpipe", "1f1b"))
    assert one_f_one_b < gpipe


def test_ring_attention_sends_k_v_and_their_gradients(launch):
    per_block = ring_bytes_per_block(workload())
    for run in launch:
        assert run["ring"]["passed"] == {"send": per_block["forward"] + per_block["backward"]}
    kv = B * MODEL.n_heads * (T // P) * (MODEL.d_model // MODEL.n_heads) * 4
    assert per_block == {"forward": 2 * (P - 1) * kv, "backward": (2 * (P - 1) + 2 * P) * kv}
    assert ring(workload()).ranks[0].passed["send"] == MODEL.n_layers * sum(per_block.values())


# ---- formulas against the models and the existing accounting -----------------------------

@pytest.mark.parametrize("config", [GPTConfig.tiny(), MODEL, tiny_llama(), smollm2_135m()],
                         ids=["tiny", "small", "tiny_llama", "smollm2"])
def test_parameter_counts_are_the_models(config):
    assert n_parameters(config) == count_parameters(gpt_on_meta(config))


def test_memory_equals_the_zero_stages_of_the_parallelism_chapter():
    """float32 AdamW without step counters: 4 + 4 + 8 bytes a parameter, twice the 2 + 2 + 4
    of training_bytes_per_process with state_bytes=4, stage by stage."""
    for config in (MODEL, smollm2_135m()):
        n = n_parameters(config)
        for p in (1, 2, 4, 8):
            w = Workload(config, 8, 16, p, step_bytes=0)

            def model_state(rank):
                return rank.weights + rank.gradients + rank.optimizer_state

            assert model_state(one_process(w).ranks[0]) == 2 * training_bytes_per_process(
                n, 1, 0, 4)
            assert model_state(ddp(w).ranks[0]) == 2 * training_bytes_per_process(n, p, 0, 4)
            zero = sum(model_state(r) for r in zero1(w).ranks) / p
            assert zero == pytest.approx(2 * training_bytes_per_process(n, p, 1, 4), rel=1e-12)
            padding = sum(N - k for _, k, N in fsdp_units(config, p))
            assert p * model_state(fsdp(w).ranks[0]) == pytest.approx(
                2 * p * training_bytes_per_process(n, p, 3, 4) + 16 * padding, rel=1e-12)


@pytest.mark.parametrize("config, dtype", [(MODEL, "float32"), (MODEL, "float64"),
                                           (tiny_llama(), "float32")],
                         ids=["gpt2", "gpt2-float64", "llama"])
def test_activations_are_what_autograd_keeps(config, dtype):
    torch.manual_seed(0)
    model = build_model(config, 0, dtype)
    x, y = torch.randint(0, config.vocab_size, (2, B, T))
    _, kept = saved_bytes(list(model.parameters()), lambda: F.cross_entropy(
        model(x).logits.flatten(0, 1), y.flatten()))
    assert one_process(Workload(config, B, T, 1, dtype=dtype)).ranks[0].activations == kept
    assert ddp(Workload(config, 2 * B, T, 2, dtype=dtype)).ranks[0].activations == kept


def test_tensor_parallel_shards_hold_what_the_formula_counts():
    for config, p in ((MODEL, 2), (MODEL, 4), (smollm2_135m(), 3)):
        model = GPT(config) if config is MODEL else gpt_on_meta(config)
        for r in range(p):
            shard = tensor_parallel_model(model, r, p)
            assert count_parameters(shard) == tensor_parallel_numels(config, p)


def test_pipeline_stages_hold_the_model_and_a_second_tied_copy():
    for p in (1, 2):
        cost = pipeline(Workload(MODEL, 4, 16, p))
        extra = MODEL.vocab_size * MODEL.d_model if p > 1 else 0
        assert sum(r.weights for r in cost.ranks) == 4 * (n_parameters(MODEL) + extra)
    smol = pipeline(Workload(smollm2_135m(), 8, 64, 6))
    assert [r.passed.get("all_reduce", 0) > 0 for r in smol.ranks] == [True] + [False] * 4 + [
        True]  # only the first and last stage hold the tied matrix


def test_zero_partition_deals_largest_first_to_the_lightest_rank():
    assert zero_partition([6, 1, 4, 3], 2) == [[0, 1], [2, 3]]
    assert zero_partition([5, 5, 5], 2) == [[0, 2], [1]]


def test_table_rows_and_reasons():
    for config, seq in ((GPTConfig.tiny(), 64), (smollm2_135m(), 2048)):
        for p in (2, 8):
            rows = cost_table(Workload(config, 8, seq, p))
            assert [r["strategy"] for r in rows] == list(STRATEGIES)
            assert all(r["pays off"] for r in rows)
            text = format_table(rows)
            assert len(text.splitlines()) == len(STRATEGIES) + 1
    costs = {c.strategy: c for c in strategy_costs(Workload(smollm2_135m(), 8, 2048, 8))}
    assert not costs["tensor"].feasible and "n_heads=9" in costs["tensor"].reason
    assert costs["FSDP"].largest.memory < costs["DDP"].largest.memory
    assert format_bytes(1234567) == "1.23 MB" and format_bytes(12) == "12 B"


# ---- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("changes, match", [
    ({"world_size": 0}, "world_size must be an int >= 1"),
    ({"world_size": 2.0}, "world_size must be an int >= 1"),
    ({"world_size": True}, "world_size must be an int >= 1"),
    ({"batch_size": "8"}, "batch_size must be an int >= 1"),
    ({"seq_len": 17}, "longer than the model's max_len"),
    ({"n_micro": 0}, "n_micro must be None or an int >= 1"),
    ({"n_micro": 1.5}, "n_micro must be None or an int >= 1"),
    ({"dtype": "int8"}, "dtype must be one of"),
    ({"schedule": "zb"}, "schedule must be one of"),
    ({"layout": "random"}, "layout must be one of"),
    ({"optimizer_states": -1}, "optimizer_states must be an int >= 0"),
])
def test_bad_workloads_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        workload(**changes)


def test_splits_that_do_not_fit_are_refused():
    with pytest.raises(TypeError, match="GPTConfig"):
        Workload("gpt2", 8, 16, 2)
    with pytest.raises(ValueError, match="multiple of world_size"):
        ddp(workload(batch_size=6, world_size=4))
    with pytest.raises(ValueError, match="n_heads=4 must be a multiple of world_size=3"):
        tensor_parallel(workload(world_size=3, batch_size=3))
    with pytest.raises(ValueError, match="n_stages must be an int in"):
        pipeline(workload(world_size=3, batch_size=3, n_micro=1))
    with pytest.raises(ValueError, match="multiple of n_micro"):
        pipeline(workload(n_micro=3))
    with pytest.raises(ValueError, match="seq_len must be a multiple of 8"):
        ring(workload(seq_len=12, world_size=4))
    with pytest.raises(ValueError, match="world_size must be an int"):
        zero_partition([1, 2], 0)
    with pytest.raises(ValueError, match="finite number of bytes"):
        format_bytes(-1)
