"""A task whose answers can be checked: small additions, a parser and a 0/1 reward.

GRPO needs a reward that a program computes, not a learned reward model. The book's task:

    problem   "What is 7 + 5? Reply with the number only."   (a user turn of SmolLM2's chat)
    answer    12
    parse     the LAST integer the completion writes ("The answer is 12." -> 12); none -> None
    reward    1.0 if the parsed number equals the answer, else 0.0   (no format bonus)

Every pair (a, b) with 0 <= a, b <= max_operand is a problem; a seeded shuffle puts `held_out`
of them aside for evaluation, so no held-out problem is ever trained on.

`checked_rewards` wraps any reward function (one float per completion): a result of the wrong
length, a non-number (None, a string, a bool), NaN or infinity is a tfbook error naming the
function and the completion, never a NaN advantage three steps later. (TRL also accepts None,
"this reward does not apply", and gives an unscored completion advantage 0; here every
completion is scored, so None is refused: an unparseable answer must earn the wrong answer's 0.)
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from numbers import Real
from typing import NamedTuple

import torch
from torch import Tensor

from tfbook.config import is_int

INSTRUCTION = "Reply with the number only."
_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits: "\d" would also read "٣" as 3


class Problem(NamedTuple):
    """One addition a + b and the chat turn that asks it."""

    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def messages(self) -> list[dict[str, str]]:
        """The conversation to render with `chat.chat_ids(..., add_generation_prompt=True)`."""
        return [{"role": "user", "content": f"What is {self.a} + {self.b}? {INSTRUCTION}"}]


def addition_problems(max_operand: int = 9, held_out: int = 20, seed: int = 0
                      ) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out): every a + b with 0 <= a, b <= max_operand, split by a seeded shuffle."""
    if not is_int(max_operand) or not 1 <= max_operand <= 999:
        raise ValueError(f"max_operand must be an int in [1, 999], got {max_operand!r}")
    total = (max_operand + 1) ** 2
    if not is_int(held_out) or not 1 <= held_out < total:
        raise ValueError(f"held_out must be an int in [1, {total - 1}] (there are {total} "
                         f"problems), got {held_out!r}")
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    problems = [Problem(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(problems)
    return problems[held_out:], problems[:held_out]


def parse_answer(completion: str) -> int | None:
    """The last integer in the completion, written in ASCII digits, or None if it writes none
    ("12." -> 12; "1,000" -> 0 and "1e5" -> 5: the last run of digits, nothing cleverer)."""
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    numbers = _INTEGER.findall(completion)
    return int(numbers[-1]) if numbers else None


def correctness_reward(completions: Sequence[str], answers: Sequence[int]) -> list[float]:
    """1.0 for each completion whose last integer is its answer, else 0.0."""
    if len(completions) != len(answers):
        raise ValueError(f"one answer per completion: got {len(completions)} completions and "
                         f"{len(answers)} answers")
    return [float(parse_answer(text) == answer) for text, answer in zip(completions, answers,
                                                                        strict=True)]


RewardFn = Callable[[Sequence[str], Sequence[int]], Sequence[float]]


def checked_rewards(reward_fn: RewardFn, completions: Sequence[str], answers: Sequence[int]
                    ) -> Tensor:
    """reward_fn(completions, answers) as a float32 tensor (B,), after checking every reward.

    One reward per completion, each a finite real number (bool and None refused): otherwise a
    TypeError/ValueError that names the function, the completion's index and what it returned.
    """
    if not callable(reward_fn):
        raise TypeError(f"reward_fn must be a function (completions, answers) -> rewards, got "
                        f"{type(reward_fn).__name__}")
    name = getattr(reward_fn, "__name__", type(reward_fn).__name__)
    rewards = reward_fn(completions, answers)
    if isinstance(rewards, Tensor):
        if rewards.dim() != 1 or rewards.dtype == torch.bool or rewards.is_complex():
            raise TypeError(f"reward function {name} must return one real number per "
                            f"completion, got a tensor of {rewards.dtype} with shape "
                            f"{tuple(rewards.shape)}")
        rewards = rewards.tolist()
    if isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence):
        raise TypeError(f"reward function {name} must return a list of floats, got "
                        f"{type(rewards).__name__}")
    if len(rewards) != len(completions):
        raise ValueError(f"reward function {name} returned {len(rewards)} rewards for "
                         f"{len(completions)} completions (one per completion)")
    for i, r in enumerate(rewards):
        if isinstance(r, bool) or not isinstance(r, Real):
            raise TypeError(f"reward function {name} returned {r!r} ({type(r).__name__}) for "
                            f"completion {i}: a reward must be a real number")
        if not math.isfinite(r):
            raise ValueError(f"reward function {name} returned {r} for completion {i} "
                             f"({completions[i]!r:.60}): a reward must be finite")
    return torch.tensor([float(r) for r in rewards], dtype=torch.float32)


__all__ = ["INSTRUCTION", "Problem", "RewardFn", "addition_problems", "checked_rewards",
           "correctness_reward", "parse_answer"]
