"""GRPO's rollouts: sample a group of completions per prompt, score them, train on them.

One GRPO iteration, as the book runs it on its one training loop (tfbook.train.loop.train):

    next_batch (RolloutBatches)          every `iterations` optimiser steps, a new rollout:
        P problems drawn with the loop's seeded generator, each asked G times
        completions = generate(model, prompts, temperature, end at <|im_end|>)  (the ONE
                      generate; no top-k / top-p)
        rewards     = checked_rewards(reward_fn, texts, answers)            (B = P G,)
        advantages  = group_advantages(rewards, G)                          (B,)
        ref_logps   = completion_logps of the adapter-disabled model        (if beta > 0)
    loss_fn (GRPOLossFn)
        logps       = completion_logps(model, ...)                          (B, N), with grad
        old_logps   = logps.detach() on the rollout's first step (the sampling policy is the
                      current one), kept for its later steps
        loss        = grpo_loss(logps, old_logps, advantages, mask, ...)

Each step records the mean reward, the fraction of groups whose rewards are all equal (zero
advantage: no signal), the KL to the reference (k3, mean per completion token), the mean
completion length (in tokens, the closing <|im_end|> counted when it was written) and the
fraction of completion tokens the clip switched off.
Shape legend: P problems, G group size, B = P G completions, T prompt + completion, N new
tokens (the longest completion), V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.config import is_int, is_number
from tfbook.generate.search import generate
from tfbook.losses import IGNORE_INDEX
from tfbook.posttrain.chat import chat_ids
from tfbook.posttrain.dpo import adapters_disabled
from tfbook.posttrain.grpo import LOSS_TYPES, group_advantages, grpo_loss
from tfbook.posttrain.rewards import Problem, RewardFn, checked_rewards, correctness_reward


def completion_logps(model: nn.Module, input_ids: Tensor, prompt_lengths: Tensor,
                     completion_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log pi(token) of each completion token under `model`, shape (B, N).

    input_ids (B, T): each row's prompt, then its completion, padded on the right (a causal
    model's padding after the text changes nothing before it). Completion token j of row i
    sits at column prompt_lengths[i] + j and is scored by the logits one column earlier,
    divided by the sampling temperature (as TRL does). Padded positions get a finite value;
    the completion mask drops them.
    """
    B, T = input_ids.shape
    N = completion_ids.size(1)
    if prompt_lengths.shape != (B,) or completion_ids.size(0) != B:
        raise ValueError(f"prompt_lengths must be ({B},) and completion_ids ({B}, N), got "
                         f"{tuple(prompt_lengths.shape)} and {tuple(completion_ids.shape)}")
    if int(prompt_lengths.min()) < 1 or int(prompt_lengths.max()) + N > T:
        raise ValueError(f"every prompt needs >= 1 token and prompt + {N} completion columns "
                         f"must fit in T = {T}")
    logits = model(input_ids).logits  # (B, T, V)
    cols = prompt_lengths[:, None] - 1 + torch.arange(N, device=input_ids.device)  # (B, N)
    rows = torch.arange(B, device=input_ids.device)[:, None]  # (B, 1)
    scores = logits[rows, cols].float() / temperature  # (B, N, V): predicts completion token j
    return F.log_softmax(scores, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)


@dataclass
class Rollout:
    """G sampled completions for each of P problems, their rewards and advantages."""

    problems: list[Problem]  # (B,): problem k repeated G times, side by side
    input_ids: Tensor  # (B, T) prompt + completion, right-padded with pad_id
    prompt_lengths: Tensor  # (B,)
    completion_ids: Tensor  # (B, N) the sampled tokens (the end token kept), pad_id after
    completion_mask: Tensor  # (B, N) long: 1 on the sampled tokens
    texts: list[str]  # (B,) the completions decoded, without the end token
    rewards: Tensor  # (B,)
    advantages: Tensor  # (B,)
    group_size: int
    temperature: float
    ref_logps: Tensor | None = None  # (B, N) of the reference model, when beta > 0
    old_logps: Tensor | None = None  # (B, N) of the sampling policy (set by GRPOLossFn)

    def zero_signal_fraction(self) -> float:
        """Fraction of groups whose rewards are all equal: their advantages are all 0."""
        grouped = self.rewards.view(-1, self.group_size)  # (P, G)
        return float((grouped == grouped[:, :1]).all(dim=1).float().mean())


def _check_sampling_args(problems, group_size, max_new_tokens, temperature) -> None:
    if not isinstance(problems, Sequence) or not problems or not all(
            isinstance(p, Problem) for p in problems):
        raise TypeError(f"problems must be a non-empty list of rewards.Problem, got "
                        f"{problems!r:.80}")
    for name, value in (("group_size", group_size), ("max_new_tokens", max_new_tokens)):
        if isinstance(value, bool) or not is_int(value) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not is_number(temperature) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature must be a finite number > 0 (GRPO samples), got "
                         f"{temperature!r}")


@torch.no_grad()
def sample_rollout(model: nn.Module, tokenizer, problems: Sequence[Problem], group_size: int,
                   max_new_tokens: int = 8, temperature: float = 1.0,
                   generator: torch.Generator | None = None,
                   reward_fn: RewardFn = correctness_reward, scale_rewards: bool = True,
                   ) -> Rollout:
    """Ask each problem `group_size` times, sample with `generate`, score and compute advantages.

    Sampling is plain temperature sampling (no top-k, top-p or min-p), ended by <|im_end|> or
    after max_new_tokens. A group size of 1 is refused by `group_advantages` (no relative
    reward); to sample without advantages (evaluation) use `sample_completions`.
    """
    _check_sampling_args(problems, group_size, max_new_tokens, temperature)
    group_advantages(torch.zeros(group_size), group_size)  # refuse group_size 1 before sampling
    rollout = sample_completions(model, tokenizer, problems, group_size, max_new_tokens,
                                 temperature, generator, reward_fn)
    rollout.advantages = group_advantages(rollout.rewards, group_size, scale=scale_rewards)
    return rollout


@torch.no_grad()
def sample_completions(model: nn.Module, tokenizer, problems: Sequence[Problem], n: int,
                       max_new_tokens: int = 8, temperature: float = 1.0,
                       generator: torch.Generator | None = None,
                       reward_fn: RewardFn = correctness_reward) -> Rollout:
    """n completions per problem with their rewards (advantages left at 0): a Rollout."""
    _check_sampling_args(problems, n, max_new_tokens, temperature)
    end = tokenizer.token_to_id("<|im_end|>")
    repeated = [p for p in problems for _ in range(n)]  # (B,): a problem's n side by side
    prompts = [chat_ids(tokenizer, p.messages, add_generation_prompt=True) for p in repeated]
    was_training = model.training
    model.eval()
    try:
        out = generate(model, prompts, max_new_tokens, temperature=temperature, end_ids=end,
                       generator=generator, pad_id=end)
    finally:
        model.train(was_training)
    new = out.new_tokens  # (B, N)
    mask = out.attention_mask[:, out.prompt_length:].long()  # (B, N): 1 up to the end token
    lengths = torch.tensor([len(p) for p in prompts])  # (B,)
    B, N = new.shape
    input_ids = torch.full((B, int(lengths.max()) + N), end, dtype=torch.long)
    for i, prompt in enumerate(prompts):  # right-padded: prompt, completion, padding
        input_ids[i, :len(prompt)] = torch.tensor(prompt)
        input_ids[i, len(prompt):len(prompt) + N] = new[i]
    texts = [tokenizer.decode([t for t, m in zip(row.tolist(), keep.tolist(), strict=True)
                               if m and t != end]) for row, keep in zip(new, mask, strict=True)]
    rewards = checked_rewards(reward_fn, texts, [p.answer for p in repeated])
    return Rollout(problems=repeated, input_ids=input_ids, prompt_lengths=lengths,
                   completion_ids=new.masked_fill(mask == 0, end), completion_mask=mask,
                   texts=texts, rewards=rewards, advantages=torch.zeros(B), group_size=n,
                   temperature=float(temperature))


def pass_counts(rollout: Rollout) -> list[int]:
    """Per problem, how many of its n completions earned reward 1 (c of pass@k)."""
    return [int(c) for c in (rollout.rewards.view(-1, rollout.group_size) == 1).sum(dim=1)]


class RolloutBatches:
    """next_batch of `tfbook.train.loop.train` for GRPO: a new rollout every `iterations` steps.

    Each rollout asks `prompts_per_step` problems drawn (with replacement) by the loop's seeded
    generator, which also drives the sampling: a run is reproducible from its seed. With beta
    > 0 the reference log-probs (the model with its LoRA adapters switched off) are computed
    once per rollout. The batch is a dict: "rollout" and "labels" (the completion tokens,
    IGNORE_INDEX elsewhere, which the loop counts).
    """

    def __init__(self, model: nn.Module, tokenizer, problems: Sequence[Problem],
                 prompts_per_step: int, group_size: int, max_new_tokens: int = 8,
                 temperature: float = 1.0, iterations: int = 1, beta: float = 0.0,
                 reward_fn: RewardFn = correctness_reward, scale_rewards: bool = True) -> None:
        _check_sampling_args(problems, group_size, max_new_tokens, temperature)
        for name, value in (("prompts_per_step", prompts_per_step), ("iterations", iterations)):
            if isinstance(value, bool) or not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        group_advantages(torch.zeros(group_size), group_size)  # refuse group_size 1 now
        self.model, self.tokenizer, self.problems = model, tokenizer, list(problems)
        self.prompts_per_step, self.group_size = prompts_per_step, group_size
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.iterations, self.beta = iterations, beta
        self.reward_fn, self.scale_rewards = reward_fn, scale_rewards
        self.calls = 0
        self.batch: dict | None = None

    def __call__(self, generator: torch.Generator) -> dict:
        if self.calls % self.iterations == 0:
            picks = torch.randint(len(self.problems), (self.prompts_per_step,),
                                  generator=generator).tolist()
            rollout = sample_rollout(self.model, self.tokenizer,
                                     [self.problems[k] for k in picks], self.group_size,
                                     self.max_new_tokens, self.temperature, generator,
                                     self.reward_fn, self.scale_rewards)
            if self.beta:
                with torch.no_grad(), adapters_disabled(self.model):
                    rollout.ref_logps = completion_logps(
                        self.model, rollout.input_ids, rollout.prompt_lengths,
                        rollout.completion_ids, rollout.temperature)
            labels = rollout.completion_ids.masked_fill(rollout.completion_mask == 0,
                                                        IGNORE_INDEX)
            self.batch = {"rollout": rollout, "labels": labels}
        self.calls += 1
        return self.batch


STEP_METRICS = ("loss", "reward", "zero_signal", "kl", "completion_length", "clip_fraction")


class GRPOLossFn:
    """GRPO as the loss_fn of `tfbook.train.loop.train`: loss_fn(model, batch, label_smoothing).

    On a rollout's first step the old log-probs are this step's own (detached): the policy
    that sampled is the current one, so every ratio is 1 and nothing is clipped. Later steps on
    the same rollout compare with them. Each call appends STEP_METRICS to `self.log`.
    """

    def __init__(self, beta: float = 0.0, epsilon_low: float = 0.2, epsilon_high: float = 0.2,
                 loss_type: str = "grpo", max_completion_length: int | None = None) -> None:
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
        self.beta, self.epsilon_low, self.epsilon_high = beta, epsilon_low, epsilon_high
        self.loss_type, self.max_completion_length = loss_type, max_completion_length
        self.log: dict[str, list[float]] = {name: [] for name in STEP_METRICS}

    def __call__(self, model: nn.Module, batch: dict, label_smoothing: float = 0.0) -> Tensor:
        if label_smoothing:
            raise ValueError(f"GRPO has no label smoothing; got {label_smoothing!r} (use 0.0)")
        ro: Rollout = batch["rollout"]
        logps = completion_logps(model, ro.input_ids, ro.prompt_lengths, ro.completion_ids,
                                 ro.temperature)  # (B, N)
        if ro.old_logps is None:
            ro.old_logps = logps.detach()
        if self.beta and ro.ref_logps is None:
            raise ValueError("beta > 0 needs the rollout's ref_logps (RolloutBatches(beta=...))")
        max_len = self.max_completion_length
        if self.loss_type == "dr_grpo" and max_len is None:
            raise ValueError("loss_type='dr_grpo' divides by a constant, the completion length "
                             "cap: give GRPOLossFn(max_completion_length=...) (the longest "
                             "completion of a batch changes from batch to batch)")
        max_len = max_len or logps.size(1)
        loss = grpo_loss(logps, ro.old_logps, ro.advantages, ro.completion_mask,
                         self.epsilon_low, self.epsilon_high, self.beta, ro.ref_logps,
                         self.loss_type, max_len)
        with torch.no_grad():
            m = ro.completion_mask.bool()
            ratio = torch.exp(logps - ro.old_logps)
            a = ro.advantages[:, None]
            clipped = ((ratio < 1 - self.epsilon_low) & (a < 0)) | (
                (ratio > 1 + self.epsilon_high) & (a > 0))
            kl = float("nan")
            if ro.ref_logps is not None:
                q = ro.ref_logps - logps
                kl = float((torch.exp(q) - q - 1)[m].mean())
        for name, value in (("loss", float(loss.detach())), ("reward", float(ro.rewards.mean())),
                            ("zero_signal", ro.zero_signal_fraction()), ("kl", kl),
                            ("completion_length", float(m.sum(1).float().mean())),
                            ("clip_fraction", float(clipped[m].float().mean()))):
            self.log[name].append(value)
        return loss


__all__ = ["STEP_METRICS", "GRPOLossFn", "Rollout", "RolloutBatches", "completion_logps",
           "pass_counts", "sample_completions", "sample_rollout"]
