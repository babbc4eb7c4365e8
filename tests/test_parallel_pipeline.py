"""Pipeline parallelism (tfbook.parallel.pipeline): the book's GPT in 2 stages on 2 gloo
processes computes the gradients one process computes, in GPipe and in 1F1B order, and the
gradients torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B compute on the same
split (their default `scale_grads=True`: micro-batch losses undivided, gradients divided by m
afterwards; ours divide each loss by m first).

One launch runs every scenario in float64 and writes what each rank saw; the tests read it.
Against one process only the order of the sums differs (the batch is cut into micro-batches):
2^-40 relative to the largest gradient. The bubble: the schedules played with fixed op times
give exactly (p - 1) / (m + p - 1); the wall-clock bubble measured on a loaded machine is
only checked to lie in [0, 1) and printed.
"""

from dataclasses import replace

import pytest
import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from tests.parallel_launch import run_in_group  # one launch, results per rank
from tfbook.losses import cross_entropy
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.parallel.pipeline import (
    GPTStage,
    bubble_fraction,
    check_pipeline,
    peak_activations,
    pipeline_step,
    schedule_order,
    simulate,
    sync_tied_gradients,
)
from tfbook.train.distributed import build_model

TOL = 2.0**-40
B, T, M = 8, 8, 4  # batch rows, positions, micro-batches
TINY = replace(GPTConfig.tiny(), d_model=32, max_len=T)
CONFIGS = {
    "tied": TINY,  # learned positions, embedding and head tied (one matrix on both stages)
    "rope": replace(TINY, n_layers=4, position="rope", tie_weights=False, norm="rms",
                    ffn="swiglu", activation="silu", bias=False),
}
TORCH_SCHEDULES = {"torch_gpipe": ScheduleGPipe, "torch_1f1b": Schedule1F1B}
BUBBLE_MICRO = (1, 2, 4, 8)
# the bubble is timed on a wider model, so that computing outweighs sending a micro-batch
BUBBLE_MODEL = replace(CONFIGS["rope"], d_model=128, max_len=32, vocab_size=512)
BUBBLE_B, BUBBLE_T = 16, 32


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def _scenarios(rank: int, config: GPTConfig, idx: torch.Tensor, targets: torch.Tensor) -> dict:
    ref = build_model(config, seed=5, dtype="float64")
    loss = ref(idx, targets).loss
    loss.backward()
    out = {"reference": _grads(ref), "loss": float(loss.detach())}
    for schedule in ("gpipe", "1f1b"):
        stage = GPTStage(build_model(config, seed=5, dtype="float64"), rank, 2)
        stats = pipeline_step(stage, idx, targets, M, schedule)
        sync_tied_gradients(stage)
        out[schedule] = _grads(stage)
        out[f"{schedule}_losses"] = stats.losses
    for name, cls in TORCH_SCHEDULES.items():
        stage = GPTStage(build_model(config, seed=5, dtype="float64"), rank, 2)
        schedule = cls(PipelineStage(stage, rank, 2, torch.device("cpu")), n_microbatches=M,
                       loss_fn=cross_entropy)
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(idx)
        else:
            schedule.step(target=targets, losses=losses)
        sync_tied_gradients(stage)
        out[name] = _grads(stage)
        out[f"{name}_losses"] = [float(x.detach()) for x in losses]
    return out


def _run(rank: int, world_size: int) -> dict:
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, TINY.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, TINY.vocab_size, (B, T), generator=g)
    results = {name: _scenarios(rank, c, idx, targets) for name, c in CONFIGS.items()}
    bubbles = {}
    idx = torch.randint(0, 512, (BUBBLE_B, BUBBLE_T), generator=g)
    for schedule in ("gpipe", "1f1b"):
        for m in BUBBLE_MICRO:
            stage = GPTStage(build_model(BUBBLE_MODEL, seed=5), rank, 2)
            stats = pipeline_step(stage, idx, idx, m, schedule)
            bubbles[schedule, m] = (stats.bubble, stats.peak_activations, len(stats.ops),
                                    stats.op_times)
    results["bubbles"] = bubbles
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_in_group(_run, tmp_path_factory.mktemp("pipeline"))


def _reference_name(name: str, config: str) -> str:
    """The one-process model lists a tied matrix once, as the embedding's."""
    return "tok_emb.weight" if CONFIGS[config].tie_weights and name == "lm_head.weight" else name


def _close(a: torch.Tensor, b: torch.Tensor, scale: float) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= TOL * scale


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("run", ["gpipe", "1f1b", *TORCH_SCHEDULES])
def test_gradients_equal_one_process(results: list[dict], config: str, run: str) -> None:
    seen = set()
    for rank in range(2):
        r = results[rank][config]
        ref = r["reference"]
        scale = max(float(g.abs().max()) for g in ref.values())
        for name, grad in r[run].items():
            assert _close(grad, ref[_reference_name(name, config)], scale), (
                config, run, rank, name)
            seen.add(_reference_name(name, config))
    assert seen == set(results[0][config]["reference"])  # every parameter on some stage


@pytest.mark.parametrize("config", list(CONFIGS))
def test_ours_equal_torch_pipelining(results: list[dict], config: str) -> None:
    # bit for bit: the same micro-batch backwards accumulated in the same order (0, 1, ..., m-1)
    # in both schedules; dividing each loss by m = 4 before (ours) or the sum after (torch's
    # scale_grads) scales by a power of two, which rounds nothing
    for rank in range(2):
        r = results[rank][config]
        for ours, theirs in (("gpipe", "torch_gpipe"), ("1f1b", "torch_1f1b"),
                             ("gpipe", "1f1b")):
            for name, grad in r[ours].items():
                assert torch.equal(grad, r[theirs][name]), (config, ours, theirs, name)
    # the last stage's micro-batch losses: the same numbers, their mean the one-process loss
    last = results[1][config]
    for run in ("gpipe", "1f1b", *TORCH_SCHEDULES):
        losses = torch.tensor(last[f"{run}_losses"], dtype=torch.float64)
        assert len(losses) == M
        assert abs(float(losses.mean()) - last["loss"]) <= TOL * last["loss"]
    assert results[0][config]["gpipe_losses"] == []  # stage 0 never sees a loss


def test_stages_hold_the_halves(results: list[dict]) -> None:
    names = [set(results[r]["rope"]["gpipe"]) for r in range(2)]
    assert not names[0] & names[1]
    assert "tok_emb.weight" in names[0] and "lm_head.weight" in names[1]
    assert {n.split(".")[1] for n in names[0] if n.startswith("blocks.")} == {"0", "1"}
    assert {n.split(".")[1] for n in names[1] if n.startswith("blocks.")} == {"2", "3"}
    # tied: each end holds a copy of the matrix, and both end with the whole gradient
    tied = [results[r]["tied"]["gpipe"] for r in range(2)]
    assert torch.equal(tied[0]["tok_emb.weight"], tied[1]["lm_head.weight"])


def test_bubble(results: list[dict]) -> None:
    for schedule in ("gpipe", "1f1b"):
        for m in BUBBLE_MICRO:
            expected = bubble_fraction(2, m)
            for s, sim in enumerate(simulate(schedule, 2, m)):
                assert abs(sim["bubble"] - expected) < 1e-12, (schedule, m, s)
            measured = [results[rank]["bubbles"][schedule, m] for rank in range(2)]
            # the schedule played with this run's own mean op times per stage (unequal
            # stages: the last one computes the head and the loss too)
            played = simulate(schedule, 2, m, [t[3][0] for t in measured],
                              [t[3][1] for t in measured])
            for rank, (bubble, peak, n_ops, _) in enumerate(measured):
                assert 0 <= bubble < 1 and n_ops == 2 * m
                assert peak == (m if schedule == "gpipe" else min(2 - rank, m))
                print(f"{schedule} m={m} stage {rank}: measured bubble {bubble:.2f}, played "
                      f"with its op times {played[rank]['bubble']:.2f}, "
                      f"(p-1)/(m+p-1) = {expected:.2f}")
    # four stages, equal op times: both orders idle (p - 1) / (m + p - 1), 1F1B keeps fewer
    for m in (4, 8):
        for schedule in ("gpipe", "1f1b"):
            assert all(abs(s["bubble"] - bubble_fraction(4, m)) < 1e-12
                       for s in simulate(schedule, 4, m, 1.0, 2.0))
        assert [peak_activations(schedule_order("1f1b", s, 4, m)) for s in range(4)] == [
            4, 3, 2, 1]
        assert peak_activations(schedule_order("gpipe", 0, 4, m)) == m


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="batch_size must be a multiple of n_micro"):
        check_pipeline(8, 3)
    with pytest.raises(ValueError, match="n_micro must be an int >= 1"):
        check_pipeline(8, 0)
    with pytest.raises(ValueError, match="schedule must be one of"):
        check_pipeline(8, 2, "zero-bubble")
    with pytest.raises(ValueError, match=r"n_stages must be an int in \[1, 2\]"):
        check_pipeline(8, 2, "1f1b", n_stages=4, n_layers=2)
    assert check_pipeline(8, 2, "1f1b", n_stages=2, n_layers=2) == 4
    model = GPT(TINY)
    with pytest.raises(ValueError, match=r"n_stages must be an int in \[1, 2\]"):
        GPTStage(model, 0, 3)
    with pytest.raises(ValueError, match=r"stage must be an int in \[0, 2\)"):
        GPTStage(model, 2, 2)
    with pytest.raises(TypeError, match="must be a tfbook GPT"):
        GPTStage(torch.nn.Linear(2, 2), 0, 2)
    stage = GPTStage(model, 0, 2)
    idx = torch.zeros(4, 8, dtype=torch.long)
    with pytest.raises(RuntimeError, match="runs inside a process group"):
        pipeline_step(stage, idx, idx, 2)
    with pytest.raises(RuntimeError, match="runs inside a process group"):
        sync_tied_gradients(stage)
    with pytest.raises(TypeError, match="must be a GPTStage"):
        pipeline_step(model, idx, idx, 2)
    with pytest.raises(ValueError, match="t_backward must be a finite number > 0"):
        simulate("gpipe", 2, 4, 1.0, 0.0)
    with pytest.raises(ValueError, match="or 2 of them"):
        simulate("gpipe", 2, 4, [1.0, 1.0, 1.0])
