"""Evaluating a language model: pass@k, perplexity vs bits per byte, multiple choice by likelihood.

pass@k (Chen et al. 2021). Draw n samples for a problem, c of them correct. The chance that at
least one of k samples drawn without replacement from those n is correct is

    pass@k = 1 - C(n - c, k) / C(n, k)

an unbiased estimator of the probability that k fresh samples contain a correct one. The naive
plug-in 1 - (1 - c/n)^k is biased low (Jensen: 1 - (1 - p)^k is concave in p). The ratio of
binomials is computed as a product so that nothing overflows:

    C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)

e.g. pass_at_k(n=4, c=1, k=2) = 1 - C(3, 2) / C(4, 2) = 1 - 3/6 = 0.5.
"""

import math
from numbers import Integral

__all__ = ["pass_at_k", "mean_pass_at_k", "naive_pass_at_k"]


def _count(name: str, value) -> int:
    """A non-negative int (bool refused), or a clear TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _check_nck(n, c, k) -> tuple[int, int, int]:
    n, c, k = _count("n", n), _count("c", c), _count("k", k)
    if n < 1:
        raise ValueError(f"n (samples drawn) must be >= 1, got {n}")
    if c > n:
        raise ValueError(f"c (correct samples) cannot exceed n (samples drawn): c={c}, n={n}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"k must be <= n (cannot pick k={k} of n={n} samples)")
    return n, c, k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021: 1 - C(n-c, k) / C(n, k), in product form."""
    n, c, k = _check_nck(n, c, k)
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def naive_pass_at_k(n: int, c: int, k: int) -> float:
    """The biased plug-in estimate 1 - (1 - c/n)^k (sampling with replacement from the n)."""
    n, c, k = _check_nck(n, c, k)
    return 1.0 - (1.0 - c / n) ** k


def mean_pass_at_k(n, c, k: int) -> float:
    """pass@k averaged over problems: n and c are per-problem counts (an int n is shared)."""
    if not isinstance(c, (list, tuple)):
        raise TypeError(f"c must be a list of per-problem correct counts, got {type(c).__name__}")
    cs = list(c)
    if not cs:
        raise ValueError("c is empty: pass@k needs at least one problem")
    if isinstance(n, Integral) and not isinstance(n, bool):
        ns = [n] * len(cs)
    elif isinstance(n, (list, tuple)):
        ns = list(n)
    else:
        raise TypeError(f"n must be an int or a list of per-problem counts, got {type(n).__name__}")
    if len(ns) != len(cs):
        raise ValueError(f"n and c must have one entry per problem, got {len(ns)} and {len(cs)}")
    return sum(pass_at_k(ni, ci, k) for ni, ci in zip(ns, cs, strict=True)) / len(cs)
