"""tfbook.posttrain.rewards and .rollouts: the addition task, its reward, GRPO's rollouts.

The task's split and parser on hand cases; `checked_rewards` turning bad reward functions
(NaN, inf, None, strings, bools, the wrong count) into tfbook errors; group size 1 refused
before any sampling; rollouts on a tiny random GPT with SmolLM2's tokenizer: the layout
(right-padded prompt + completion), the mask against the end token, the rewards against the
texts, `completion_logps` against `dpo.sequence_logps` (an independent implementation); and
GRPO on the book's training loop: a rollout reused for `iterations` steps, on-policy first
step (no clipping, KL 0 while LoRA's B is 0), the logged metrics.
"""

from __future__ import annotations

import math

import pytest
import torch

from tfbook.lora import add_lora
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.posttrain.dpo import sequence_logps
from tfbook.posttrain.grpo import grpo_loss
from tfbook.posttrain.rewards import (
    Problem,
    addition_problems,
    checked_rewards,
    correctness_reward,
    parse_answer,
)
from tfbook.posttrain.rollouts import (
    STEP_METRICS,
    GRPOLossFn,
    RolloutBatches,
    completion_logps,
    pass_counts,
    sample_completions,
    sample_rollout,
)
from tfbook.train.loop import TrainConfig, train


def test_problems_split_is_seeded_disjoint_and_complete():
    train_set, held = addition_problems(max_operand=9, held_out=20, seed=0)
    assert len(train_set) == 80 and len(held) == 20
    assert set(train_set).isdisjoint(held)
    assert set(train_set) | set(held) == {Problem(a, b) for a in range(10) for b in range(10)}
    assert addition_problems(9, 20, 0) == (train_set, held)
    assert addition_problems(9, 20, 1)[1] != held
    p = Problem(7, 5)
    assert p.answer == 12
    assert p.messages == [{"role": "user",
                           "content": "What is 7 + 5? Reply with the number only."}]


@pytest.mark.parametrize("kwargs, words", [
    ({"max_operand": 0}, "max_operand"), ({"held_out": 0}, "held_out"),
    ({"held_out": 100}, "held_out"), ({"max_operand": 2.5}, "max_operand"),
])
def test_problems_bad_input(kwargs, words):
    with pytest.raises(ValueError, match=words):
        addition_problems(**kwargs)


@pytest.mark.parametrize("text, number", [
    ("12", 12), ("The answer is 12.", 12), ("7 + 5 = 12", 12), ("-3", -3),
    ("twelve", None), ("", None), ("12 or maybe 13", 13),
    ("\u0663", None), ("12 \u0663", 12), ("\uff11\uff12", None),  # non-ASCII digits are not read
])
def test_parse_answer_reads_the_last_integer(text, number):
    assert parse_answer(text) == number


def test_correctness_reward():
    assert correctness_reward(["12", "The answer is 12.", "13", "twelve"], [12] * 4) == [
        1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="one answer per completion"):
        correctness_reward(["12"], [12, 13])
    with pytest.raises(TypeError, match="completion must be a str"):
        parse_answer(12)


def test_checked_rewards_accepts_lists_and_tensors():
    out = checked_rewards(correctness_reward, ["1", "2"], [1, 1])
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 0.0]
    got = checked_rewards(lambda c, a: torch.tensor([0.5, 2]), ["a", "b"], [0, 0])
    assert got.tolist() == [0.5, 2.0]


def nan_reward(completions, answers):
    return [float("nan")] * len(completions)


@pytest.mark.parametrize("fn, exc, words", [
    (nan_reward, ValueError, r"nan_reward returned nan for completion 0"),
    (lambda c, a: [1.0, math.inf], ValueError, r"returned inf for completion 1"),
    (lambda c, a: [1.0, None], TypeError, r"returned None \(NoneType\) for completion 1"),
    (lambda c, a: [1.0, "1"], TypeError, r"returned '1' \(str\)"),
    (lambda c, a: [True, False], TypeError, r"returned True \(bool\)"),
    (lambda c, a: [1.0], ValueError, r"returned 1 rewards for 2 completions"),
    (lambda c, a: 1.0, TypeError, "must return a list of floats, got float"),
    (lambda c, a: torch.ones(2, 1), TypeError, "one real number per completion"),
    ("not a function", TypeError, "reward_fn must be a function"),
])
def test_checked_rewards_refuses_bad_rewards(fn, exc, words):
    with pytest.raises(exc, match=words):
        checked_rewards(fn, ["12", "13"], [12, 12])


def test_group_size_one_is_refused_before_sampling():
    problems = [Problem(1, 2)]
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        sample_rollout(None, None, problems, group_size=1)  # no model needed: refused first
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        RolloutBatches(None, None, problems, prompts_per_step=2, group_size=1)
    with pytest.raises(ValueError, match="temperature"):
        sample_rollout(None, None, problems, group_size=2, temperature=0.0)
    with pytest.raises(TypeError, match="problems must be a non-empty list"):
        sample_rollout(None, None, [(1, 2)], group_size=2)


@pytest.fixture(scope="module")
def tokenizer():
    from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def _tiny(seed=0, lora=False):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(max_len=64, vocab_size=49152, n_layers=1, n_heads=2, d_model=16))
    if lora:
        add_lora(model, ("q_proj", "v_proj"), r=2, alpha=4)
    return model.eval()


def test_rollout_layout_mask_rewards_and_logps(tokenizer):
    model = _tiny()
    end = tokenizer.token_to_id("<|im_end|>")
    problems = [Problem(1, 2), Problem(3, 4)]
    ro = sample_rollout(model, tokenizer, problems, group_size=3, max_new_tokens=6,
                        generator=torch.Generator().manual_seed(0))
    B, N = ro.completion_ids.shape
    assert B == 6 and N <= 6 and ro.problems == [problems[0]] * 3 + [problems[1]] * 3
    for i in range(B):
        n, p = int(ro.completion_mask[i].sum()), int(ro.prompt_lengths[i])
        assert ro.completion_mask[i, :n].all() and not ro.completion_mask[i, n:].any()
        ended = end in ro.completion_ids[i, :n].tolist()
        assert ended == (n < N or ro.completion_ids[i, n - 1] == end)  # stops at its end only
        assert torch.equal(ro.input_ids[i, p:p + n], ro.completion_ids[i, :n])
    assert ro.rewards.tolist() == correctness_reward(ro.texts, [p.answer for p in ro.problems])
    # completion_logps (gathered at each row's own columns) against dpo.sequence_logps
    logps = completion_logps(model, ro.input_ids, ro.prompt_lengths, ro.completion_ids)
    full_mask = torch.zeros_like(ro.input_ids)
    for i in range(B):
        p = int(ro.prompt_lengths[i])
        full_mask[i, p:p + N] = ro.completion_mask[i]
    with torch.no_grad():
        torch.testing.assert_close((logps * ro.completion_mask).sum(1),
                                   sequence_logps(model, ro.input_ids, full_mask))
    counts = pass_counts(ro)
    assert counts == [int((ro.rewards[k:k + 3] == 1).sum()) for k in (0, 3)]


def test_rollout_sampling_is_reproducible_and_advantages_are_grouped(tokenizer):
    model = _tiny()
    problems = [Problem(1, 1), Problem(2, 2)]
    a = sample_rollout(model, tokenizer, problems, 2, 5, generator=torch.Generator().manual_seed(4))
    b = sample_rollout(model, tokenizer, problems, 2, 5, generator=torch.Generator().manual_seed(4))
    assert a.texts == b.texts and torch.equal(a.completion_ids, b.completion_ids)
    # a random model never answers: every group's rewards equal, no signal
    a.rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert a.zero_signal_fraction() == 0.5
    plain = sample_completions(model, tokenizer, problems, 1, 5)  # n = 1 is fine for evaluation
    assert plain.advantages.tolist() == [0.0, 0.0]


def test_grpo_on_the_training_loop(tokenizer):
    model = _tiny(lora=True)
    train_set, _ = addition_problems(9, 20, 0)
    batches = RolloutBatches(model, tokenizer, train_set, prompts_per_step=2, group_size=2,
                             max_new_tokens=4, iterations=2, beta=0.04)
    loss_fn = GRPOLossFn(beta=0.04, loss_type="dr_grpo", max_completion_length=4)
    history = train(model, batches, TrainConfig(steps=4, lr=1e-2, schedule="constant",
                                                weight_decay=0.0), loss_fn=loss_fn,
                    progress=False)
    assert batches.calls == 4 and len(history.loss) == 4
    assert set(loss_fn.log) == set(STEP_METRICS) and all(len(v) == 4 for v in loss_fn.log.values())
    assert loss_fn.log["clip_fraction"][0] == 0.0  # on-policy first step: every ratio is 1
    assert loss_fn.log["kl"][0] == 0.0  # LoRA's B starts at 0: the policy is its reference
    assert loss_fn.log["reward"][0] == loss_fn.log["reward"][1]  # the same rollout, twice
    ro = batches.batch["rollout"]
    assert ro.old_logps is not None and ro.ref_logps is not None
    with pytest.raises(ValueError, match="label smoothing"):
        loss_fn(model, batches.batch, 0.1)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        GRPOLossFn(loss_type="ppo")
    with pytest.raises(ValueError, match="max_completion_length"):  # Dr. GRPO's constant
        GRPOLossFn(loss_type="dr_grpo")(model, batches.batch)


def test_first_step_loss_is_the_on_policy_loss(tokenizer):
    model = _tiny(lora=True)
    batches = RolloutBatches(model, tokenizer, [Problem(1, 2)], prompts_per_step=1,
                             group_size=3, max_new_tokens=3)
    batch = batches(torch.Generator().manual_seed(0))
    ro = batch["rollout"]
    ro.advantages = torch.tensor([1.0, -0.5, -0.5])  # a signal, whatever the random model wrote
    loss = GRPOLossFn()(model, batch)
    with torch.no_grad():
        logps = completion_logps(model, ro.input_ids, ro.prompt_lengths, ro.completion_ids)
    # ratio 1 everywhere: the loss is minus the mean (per sequence) advantage
    torch.testing.assert_close(loss, grpo_loss(logps, logps, ro.advantages, ro.completion_mask))
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
