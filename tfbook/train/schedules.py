"""Learning-rate schedules: the factor that multiplies the base rate at each step.

    warmup_cosine:  lr(t) = lr_max * (t + 1) / W                            for t < W
                    lr(t) = lr_min + (lr_max - lr_min) (1 + cos(pi p)) / 2,
                    p = (t - W) / (S - 1 - W)                               for t >= W
    warmup_linear:  the same warmup, then lr_max - (lr_max - lr_min) (t - W) / (S - W)
    inverse_sqrt:   lr(n) = C^-1/2 * min(n^-1/2, n * W^-3/2),  n = t + 1   (Vaswani et al.
                    2017, eq. 3)

Steps t count from 0 (t = 0 .. S - 1), so the warmup's first step already has rate lr_max / W
and step W - 1 reaches lr_max; the inverse square root's formula counts from 1 (n = t + 1).
A step must be an int >= 0; steps past the end of the run stay at the floor.
"""

from __future__ import annotations

import math

from tfbook.config import is_int, is_number


def _check_step(step: object) -> None:
    if not is_int(step) or step < 0:
        raise ValueError(f"step must be an int >= 0 (steps count from 0), got {step!r}")


def _check(total: object = None, warmup: object = 0, min_ratio: object = 0.0) -> None:
    if total is not None and (not is_int(total) or total < 1):
        raise ValueError(f"total steps must be a positive int, got {total!r}")
    if not is_int(warmup) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if total is not None and warmup > total:
        raise ValueError(f"warmup ({warmup}) cannot be longer than the run ({total} steps)")
    if not is_number(min_ratio) or not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must lie in [0, 1], got {min_ratio!r}")


def warmup_cosine(step: int, total: int, warmup: int, min_ratio: float = 0.1) -> float:
    """Multiplier in [min_ratio, 1]: linear from 1/W up to 1 over W steps, then half a cosine
    down to min_ratio at the last step. warmup_cosine(0, 100, 10) = 0.1."""
    _check(total, warmup, min_ratio)
    _check_step(step)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - 1 - warmup)  # 0 -> 1 over the decay
    progress = min(progress, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_linear(step: int, total: int, warmup: int, min_ratio: float = 0.0) -> float:
    """Multiplier: linear warmup over W steps, then 1 - (1 - min_ratio) p with
    p = (t - W) / (S - W), reaching min_ratio + (1 - min_ratio) / (S - W) at the last step.
    With W = 0 and min_ratio = 0 it is 1 - t / S."""
    _check(total, warmup, min_ratio)
    _check_step(step)
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / (total - warmup), 1.0)
    return 1.0 - (1.0 - min_ratio) * progress


def inverse_sqrt(step: int, d_model: int, warmup: int = 4000) -> float:
    """Vaswani et al.'s rate itself (not a multiplier): C^-1/2 min(n^-1/2, n W^-3/2), n = t + 1.
    It rises linearly for W steps, peaks at (C W)^-1/2, then falls as 1/sqrt(n)."""
    _check(None, warmup)
    _check_step(step)
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 for the inverse square root, got {warmup}")
    if not is_int(d_model) or d_model < 1:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    n = step + 1
    return d_model ** -0.5 * min(n ** -0.5, n * warmup ** -1.5)
