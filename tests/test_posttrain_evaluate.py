"""tfbook.posttrain.evaluate: pass@k against brute force, bad input."""

import itertools
import math
from fractions import Fraction

import pytest

from tfbook.posttrain.evaluate import mean_pass_at_k, naive_pass_at_k, pass_at_k


def brute_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of the k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_subset_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            exact = brute_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=4 * n * 2**-52)


def test_pass_at_k_large_n_is_stable_and_matches_comb():
    # math.comb is exact in integers; the product form never builds numbers this large
    n, c, k = 1000, 37, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_is_unbiased_and_naive_is_biased_low():
    # a problem solved with probability p; n samples, c ~ Binomial(n, p)
    n, k = 6, 3
    for p in [Fraction(1, 10), Fraction(1, 3), Fraction(7, 10)]:
        truth = 1 - (1 - p) ** k
        weights = [math.comb(n, c) * p**c * (1 - p) ** (n - c) for c in range(n + 1)]
        unbiased = sum(w * brute_pass_at_k(n, c, k) for c, w in enumerate(weights))
        naive = sum(w * (1 - (1 - Fraction(c, n)) ** k) for c, w in enumerate(weights))
        assert unbiased == truth  # exactly, in rationals
        assert naive < truth  # Jensen: 1 - (1 - p)^k is concave in p
        expected_naive = sum(w * naive_pass_at_k(n, c, k) for c, w in enumerate(weights))
        assert float(naive) == pytest.approx(float(expected_naive), rel=1e-12)


def test_pass_at_1_is_the_fraction_correct():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)
    assert pass_at_k(4, 1, 2) == 0.5
    assert pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 1, 5) == 1.0


def test_mean_pass_at_k():
    assert mean_pass_at_k(4, [0, 1, 4], 2) == pytest.approx((0 + 0.5 + 1) / 3)
    assert mean_pass_at_k([4, 2], [1, 1], 2) == pytest.approx((0.5 + 1) / 2)


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((3, 1, 4), ValueError, "k must be <= n"),
        ((3, 4, 1), ValueError, "cannot exceed n"),
        ((3, -1, 1), ValueError, "c must be >= 0"),
        ((3, 1, 0), ValueError, "k must be >= 1"),
        ((0, 0, 1), ValueError, "n .* must be >= 1"),
        ((3.0, 1, 1), TypeError, "n must be an int, got float"),
        ((3, True, 1), TypeError, "c must be an int, got bool"),
        ((3, 1, "2"), TypeError, "k must be an int, got str"),
    ],
)
def test_pass_at_k_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        pass_at_k(*args)
    with pytest.raises(error, match=match):
        naive_pass_at_k(*args)


def test_mean_pass_at_k_bad_input():
    with pytest.raises(ValueError, match="empty"):
        mean_pass_at_k(4, [], 2)
    with pytest.raises(TypeError, match="c must be a list"):
        mean_pass_at_k(4, 2, 2)
    with pytest.raises(TypeError, match="n must be an int or a list"):
        mean_pass_at_k(4.0, [1], 2)
    with pytest.raises(ValueError, match="one entry per problem"):
        mean_pass_at_k([4, 4], [1], 2)
    with pytest.raises(ValueError, match="k must be <= n"):
        mean_pass_at_k([4, 1], [1, 1], 2)
