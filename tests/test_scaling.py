"""Scaling-law fits against scipy's curve_fit, the compute frontier against a brute-force
envelope, C = 6 N D against the FLOP counter, and the cached sweep against the code that
wrote it (same configs, same parameter counts, same corpus, the same first steps)."""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import curve_fit

from tfbook.models.gpt import GPTConfig, gpt_on_meta
from tfbook.models.params import decoder_forward_flops
from tfbook.train.scaling import (
    SETTINGS,
    SWEEP,
    PowerLaw,
    bootstrap,
    compute_frontier,
    corpus_sha256,
    fit_power_law,
    full_training_flops,
    interval,
    leave_one_out,
    non_embedding_parameters,
    run_size,
    sweep_data,
    sweep_runs,
    training_flops,
)

CACHE = Path(__file__).resolve().parent.parent / "book" / "learning" / "data" / (
    "scaling_sweep.json")
N = np.geomspace(3e3, 8e5, 8)  # (K,) model sizes spanning the sweep's range
TRUE = PowerLaw(a=20.0, alpha=0.3, c=1.4)


def noisy(x: np.ndarray, law: PowerLaw, sigma: float, seed: int = 0) -> np.ndarray:
    return law(x) + np.random.default_rng(seed).normal(0.0, sigma, len(x))


def scipy_fit(x, loss, p0):
    """The reference: scipy's curve_fit of a x^-alpha + c, started at p0."""
    params, _ = curve_fit(lambda x, a, alpha, c: a * x ** -alpha + c, x, loss, p0=p0,
                          maxfev=100_000)
    return params


# ---------------------------------------------------------------------------------------------
# fitting
# ---------------------------------------------------------------------------------------------


def test_fit_recovers_an_exact_power_law():
    fit = fit_power_law(N, TRUE(N))
    np.testing.assert_allclose([fit.a, fit.alpha, fit.c], [TRUE.a, TRUE.alpha, TRUE.c],
                               rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_equals_scipy_least_squares_on_noisy_data(seed):
    loss = noisy(N, TRUE, 0.01, seed)
    fit = fit_power_law(N, loss)
    reference = scipy_fit(N, loss, p0=(TRUE.a, TRUE.alpha, TRUE.c))
    np.testing.assert_allclose([fit.a, fit.alpha, fit.c], reference, rtol=1e-4)
    assert abs(fit.alpha - TRUE.alpha) < 0.05  # and near the law the data came from


def test_pure_power_law_equals_scipy():
    loss = noisy(N, PowerLaw(a=8.0, alpha=0.1, c=0.0), 0.005)
    fit = fit_power_law(N, loss, irreducible=False)
    reference, _ = curve_fit(lambda x, a, alpha: a * x ** -alpha, N, loss, p0=(8.0, 0.1))
    assert fit.c == 0.0
    np.testing.assert_allclose([fit.a, fit.alpha], reference, rtol=1e-4)


def test_fit_with_repeated_sizes_is_the_least_squares_fit_of_all_points():
    x = np.concatenate([N, N[:3]])  # a second seed for the three smallest sizes
    loss = noisy(x, TRUE, 0.01, seed=3)
    fit = fit_power_law(x, loss)
    np.testing.assert_allclose([fit.a, fit.alpha, fit.c],
                               scipy_fit(x, loss, p0=(TRUE.a, TRUE.alpha, TRUE.c)), rtol=1e-4)


def test_power_law_call():
    law = PowerLaw(a=2.0, alpha=0.5, c=1.0)
    np.testing.assert_allclose(law([1.0, 4.0, 100.0]), [3.0, 2.0, 1.2])


def test_leave_one_out_drops_every_seed_of_one_size():
    x = np.concatenate([N, N[:2]])
    loss = noisy(x, TRUE, 0.01, seed=4)
    fits = leave_one_out(x, loss)
    assert len(fits) == len(N)  # one fit per distinct size, not per point
    for size, fit in zip(np.unique(x), fits, strict=True):
        keep = x != size
        reference = scipy_fit(x[keep], loss[keep], p0=(fit.a, fit.alpha, fit.c))
        np.testing.assert_allclose([fit.a, fit.alpha, fit.c], reference, rtol=1e-4)


def test_bootstrap_is_reproducible_and_covers_the_truth():
    loss = noisy(N, TRUE, 0.01, seed=5)
    first = bootstrap(N, loss, draws=200, seed=7)
    again = bootstrap(N, loss, draws=200, seed=7)
    assert [f.alpha for f in first] == [f.alpha for f in again]
    low, high = interval([f.alpha for f in first], 0.9)
    assert low < TRUE.alpha < high
    assert low < fit_power_law(N, loss).alpha < high
    assert interval([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == (2.0, 4.0)  # numpy's percentiles


@pytest.mark.parametrize("x, loss, match", [
    ([1e3, 1e4], [2.0, 1.8], "at least 3 distinct values of x, got 2"),
    ([1e3, 1e3, 1e3, 1e4], [2.0, 2.1, 1.9, 1.8], "at least 3 distinct values of x, got 2"),
    ([0.0, 1e3, 1e4], [3.0, 2.0, 1.8], "x must be > 0"),
    ([-5.0, 1e3, 1e4], [3.0, 2.0, 1.8], "x must be > 0"),
    ([1e2, 1e3, 1e4], [3.0, float("nan"), 1.8], "finite numbers, got a NaN or inf in loss"),
    ([1e2, float("inf"), 1e4], [3.0, 2.0, 1.8], "got a NaN or inf in x"),
    ([1e2, 1e3, 1e4], [3.0, 2.0], "of one length"),
    ([1e2, 1e3, 1e4], [3.0, 0.0, 1.8], "losses > 0"),
    ([[1e2, 1e3, 1e4]], [[3.0, 2.0, 1.8]], "must be 1-D"),
])
def test_fit_bad_input(x, loss, match):
    with pytest.raises(ValueError, match=match):
        fit_power_law(x, loss)


def test_bad_input_elsewhere():
    with pytest.raises(TypeError, match="sequences of numbers"):
        fit_power_law(["a", "b", "c"], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 2 distinct values of N, got 1"):
        fit_power_law([5.0, 5.0], [1.0, 2.0], irreducible=False, name="N")
    with pytest.raises(ValueError, match="at least 4 distinct values of x, got 3"):
        leave_one_out([1e2, 1e3, 1e4], [3.0, 2.0, 1.8])  # leaving one out leaves two
    with pytest.raises(ValueError, match="draws must be a positive int, got 0"):
        bootstrap(N, TRUE(N), draws=0)
    with pytest.raises(ValueError, match=r"level must lie in \(0, 1\), got 95"):
        interval([1.0, 2.0], 95)
    with pytest.raises(ValueError, match="at least one curve"):
        compute_frontier([])
    with pytest.raises(ValueError, match="compute must be > 0"):
        compute_frontier([([0.0, 1.0], [5.5, 3.0])])


# ---------------------------------------------------------------------------------------------
# the compute frontier
# ---------------------------------------------------------------------------------------------


def test_frontier_by_hand():
    small = ([1.0, 2.0, 4.0, 8.0], [3.0, 2.0, 1.8, 1.75])  # cheap, levels off early
    large = ([4.0, 8.0, 16.0, 32.0], [2.5, 1.7, 1.4, 1.3])  # costly, ends lower
    c, loss, curve = compute_frontier([small, large])
    np.testing.assert_array_equal(c, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    np.testing.assert_array_equal(loss, [3.0, 2.0, 1.8, 1.7, 1.4, 1.3])
    np.testing.assert_array_equal(curve, [0, 0, 0, 1, 1, 1])


def test_frontier_equals_brute_force_envelope():
    rng = np.random.default_rng(0)
    curves = [(np.sort(rng.uniform(1, 100, 12)), rng.uniform(1, 5, 12)) for _ in range(4)]
    c, loss, curve = compute_frontier(curves)
    points = [(ci, li, i) for i, (cs, ls) in enumerate(curves)
              for ci, li in zip(cs, ls, strict=True)]
    expected = sorted((ci, li, i) for ci, li, i in points
                      if not any(cj <= ci and lj < li for cj, lj, _ in points))
    assert list(zip(c.tolist(), loss.tolist(), curve.tolist(), strict=True)) == expected
    assert np.all(np.diff(loss) < 0) and np.all(np.diff(c) > 0)


# ---------------------------------------------------------------------------------------------
# parameters and FLOPs of the sweep's models
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", SWEEP, ids=lambda c: f"L{c.n_layers}C{c.d_model}")
def test_non_embedding_parameters(config):
    L, C = config.n_layers, config.d_model
    # per block: 4 C^2 + 4 C (attention), 8 C^2 + 5 C (MLP), 4 C (two LayerNorms); final norm 2C
    assert non_embedding_parameters(config) == L * (12 * C * C + 13 * C) + 2 * C


@pytest.mark.parametrize("config", SWEEP, ids=lambda c: f"L{c.n_layers}C{c.d_model}")
def test_six_n_d_is_three_forward_passes_of_the_weight_matrices(config):
    # C = 6 N D counts 2 FLOPs per weight and token forward, 4 backward; the FLOP counter of
    # tfbook.models.params (matrix products only, no attention scores, no LM head) agrees on
    # the matrices, which hold all but the few biases and norm gains of N
    blocks = gpt_on_meta(config).blocks
    matrices = sum(p.numel() for p in blocks.parameters() if p.dim() == 2)
    forward = decoder_forward_flops(config, new_tokens=1000, context=0, head_positions=0)
    assert training_flops(matrices, 1000) == 3 * forward
    assert 0.9 < matrices / non_embedding_parameters(config) < 1.0


def test_sweep_sizes_and_runs():
    sizes = [non_embedding_parameters(config) for config in SWEEP]
    assert sizes == sorted(sizes) and sizes[0] < 5_000 and 700_000 < sizes[-1] < 900_000
    runs = sweep_runs()
    assert len(runs) == len(SWEEP) + sum(n < SETTINGS.second_seed_below for n in sizes)


# ---------------------------------------------------------------------------------------------
# the cached sweep the chapter reads
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache():
    return json.loads(CACHE.read_text())


def test_cache_is_small_and_complete(cache):
    assert CACHE.stat().st_size < 200_000
    assert cache["settings"] == asdict(SETTINGS)
    steps, every = SETTINGS.steps, SETTINGS.eval_every
    tokens_per_step = SETTINGS.batch_size * SETTINGS.T
    expected = [-1, *range(every - 1, steps, every)]
    for run in cache["runs"]:
        assert run["eval_step"] == expected
        assert run["eval_tokens"] == [(s + 1) * tokens_per_step for s in expected]
        assert len(run["eval_loss"]) == len(expected)
        assert run["tokens"] == steps * tokens_per_step
        assert np.all(np.isfinite(run["eval_loss"])) and np.isfinite(run["final_loss"])
        assert run["cpu_seconds"] > 0
    assert cache["cpu_seconds"] >= sum(run["cpu_seconds"] for run in cache["runs"])


def test_cache_was_written_by_the_current_sweep(cache):
    stored = [(GPTConfig(**run["config"]), run["seed"]) for run in cache["runs"]]
    assert stored == sweep_runs()
    for run in cache["runs"]:  # the parameter counts follow from the stored configs
        assert run["n_params"] == non_embedding_parameters(GPTConfig(**run["config"]))
    assert cache["corpus_sha256"] == corpus_sha256()


def test_cache_reproduces_the_first_steps(cache):
    """The smallest model, trained again for 100 steps, gives the stored eval losses."""
    data = sweep_data()
    assert cache["train_tokens"] == len(data[0])
    run = cache["runs"][0]
    again = run_size(GPTConfig(**run["config"]), run["seed"], data, stop_at=100)
    assert again["eval_step"] == run["eval_step"][:2]
    np.testing.assert_allclose(again["eval_loss"], run["eval_loss"][:2], atol=2e-5)


def test_full_training_flops_counts_every_product():
    config = SWEEP[0]  # 2 layers of width 12, V = 256, T = 64
    C, L, V, T = config.d_model, config.n_layers, config.vocab_size, config.max_len
    weights = L * 12 * C * C  # the four projections and the 4C-wide feed-forward network
    by_hand = 3 * (2 * weights + L * 4 * T * C + 2 * V * C)  # per token: weights, scores, head
    assert full_training_flops(config, 1) == by_hand
    assert full_training_flops(config, np.array([10, 20])).tolist() == [10 * by_hand,
                                                                       20 * by_hand]
    n = non_embedding_parameters(config)
    assert full_training_flops(config, 1) > 2.5 * training_flops(n, 1)  # 6ND misses most
    wide = SWEEP[-1]
    ratio = full_training_flops(wide, 1) / training_flops(non_embedding_parameters(wide), 1)
    assert 1 < ratio < 1.15  # and little of a wide model's work
    with pytest.raises(ValueError, match="context must be a positive int, got 0"):
        full_training_flops(config, 1, context=0)
