"""Scaling laws: how the loss falls with model size and compute (Kaplan et al. 2020, sec. 3;
Hoffmann et al. 2022, sec. 3), fitted to a sweep of small byte-level GPTs.

    L(N)       = a N^-alpha + c      N = non-embedding parameters, c = the irreducible loss
    C_train    = 6 N D_train         training FLOPs for D_train tokens: 2 N per token forward,
                                     4 N backward (attention scores and the output layer left
                                     out; models.params.decoder_forward_flops counts them)
    L(C_train) = a C_train^-beta + c fitted to the compute frontier, the lower envelope of
                                     every run's eval loss against the compute spent so far

(The papers write C and D; in the book C is the model width and D the head size.)

The sweep trains every size with the same loop (tfbook.train.loop.train), the same data and
the same number of tokens, and records the eval loss along the way; scripts/scaling_sweep.py
runs it and caches the results as JSON.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import Tensor

from tfbook.config import is_int
from tfbook.corpus import stdlib_corpus
from tfbook.models.gpt import GPT, GPTConfig, gpt_on_meta
from tfbook.models.params import count_parameters, decoder_forward_flops
from tfbook.train.data import eval_windows, split_stream, window_sampler
from tfbook.train.loop import TrainConfig, evaluate, train

# ---------------------------------------------------------------------------------------------
# The sweep: sizes, data and one run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepSettings:
    """What every run of the sweep shares: data, batch shape, optimiser and schedule."""

    T: int = 64  # window length in bytes
    batch_size: int = 16  # B windows per step: B * T = 1,024 tokens per step
    steps: int = 2000  # optimiser steps per run: 2,048,000 tokens, about 2.2 epochs
    lr: float = 3e-3  # peak learning rate, the same for every size
    warmup: int = 100  # 5% linear warmup, then cosine down to 0.1 x lr
    eval_every: int = 100  # eval loss every 100 steps: 20 points along each curve
    eval_windows: int = 256  # evenly spaced validation windows scored along the curve
    val_fraction: float = 0.1  # the last 10% of the corpus is held out
    second_seed_below: int = 10_000  # sizes with fewer parameters also run with seed 1

    def train_config(self, seed: int) -> TrainConfig:
        """The TrainConfig of one run (the seed picks the batches)."""
        return TrainConfig(steps=self.steps, lr=self.lr, schedule="cosine",
                           warmup=self.warmup, eval_every=self.eval_every, seed=seed)


SETTINGS = SweepSettings()


def sweep_config(n_layers: int, d_model: int, n_heads: int, T: int = SETTINGS.T) -> GPTConfig:
    """A byte-level GPT-2-style model (V = 256) of the sweep."""
    return GPTConfig(max_len=T, vocab_size=256, n_layers=n_layers, n_heads=n_heads,
                     d_model=d_model)


# (n_layers, d_model, n_heads): from ~4K to ~800K non-embedding parameters, about x2.5 apart
SWEEP_SHAPES: tuple[tuple[int, int, int], ...] = (
    (2, 12, 2), (2, 18, 2), (2, 28, 4), (3, 40, 4), (3, 60, 4), (4, 80, 4), (4, 128, 4),
)
SWEEP: tuple[GPTConfig, ...] = tuple(sweep_config(*shape) for shape in SWEEP_SHAPES)


def non_embedding_parameters(config: GPTConfig) -> int:
    """N of Kaplan et al.: every parameter except the token and position embeddings (the
    tied output layer is the token embedding, so it is left out too)."""
    model = gpt_on_meta(config)
    embeddings = model.tok_emb.weight.numel()
    if model.pos_emb is not None:
        embeddings += model.pos_emb.weight.numel()
    return count_parameters(model) - embeddings


def training_flops(n_params: float, tokens: float) -> float:
    """C_train = 6 N D_train: a forward pass costs 2 N FLOPs per token, the backward pass
    twice that (the weights' products only)."""
    return 6.0 * n_params * tokens


def full_training_flops(config: GPTConfig, tokens: float | np.ndarray,
                        context: int | None = None) -> float | np.ndarray:
    """Every matrix product of training on `tokens` tokens: 3 x the forward FLOPs per token
    (the backward pass costs twice the forward), with the attention scores over the whole
    window of `context` positions (default: config.max_len) and the output layer, which
    C_train = 6 N D_train leaves out."""
    context = config.max_len if context is None else context
    if not is_int(context) or context < 1:
        raise ValueError(f"context must be a positive int, got {context!r}")
    per_token = decoder_forward_flops(config, 1, context, 1)
    return 3.0 * per_token * np.asarray(tokens, dtype=float)


def corpus_bytes() -> bytes:
    """The default corpus (tfbook.corpus) as UTF-8 bytes: byte-level models read it with V = 256."""
    return stdlib_corpus().encode("utf-8")


def corpus_sha256() -> str:
    """A fingerprint of the corpus, stored with the sweep to show which text it saw."""
    return hashlib.sha256(corpus_bytes()).hexdigest()


def sweep_data(settings: SweepSettings = SETTINGS) -> tuple[Tensor, list, list]:
    """Train stream (N,), the eval batches along the curve (E windows evenly spread over the
    validation text), and every validation window, in batches (x (B, T), y (B, T))."""
    ids = torch.tensor(list(corpus_bytes()), dtype=torch.long)  # (N,)
    train_ids, val_ids = split_stream(ids, settings.val_fraction)
    eval_batches = eval_windows(val_ids, 64, settings.T, max_windows=settings.eval_windows)
    full_val = eval_windows(val_ids, 128, settings.T)
    return train_ids, eval_batches, full_val


def run_size(config: GPTConfig, seed: int, data: tuple[Tensor, list, list] | None = None,
             settings: SweepSettings = SETTINGS, stop_at: int | None = None) -> dict:
    """Train one size with one seed; return its record (config, N, curve, final loss).

    `data` is sweep_data(settings), computed once for a whole sweep; `stop_at` ends the run
    early (the curve so far, no final loss), as a test does to replay the first steps."""
    train_ids, eval_batches, full_val = data or sweep_data(settings)
    torch.manual_seed(seed)  # the initial weights; train() then seeds the batches
    model = GPT(config)

    next_batch = window_sampler(train_ids, settings.batch_size, settings.T)
    began = time.process_time()
    n_params = non_embedding_parameters(config)
    history = train(model, next_batch, settings.train_config(seed),
                    eval_batches=eval_batches, stop_at=stop_at, progress=False)
    tokens_per_step = settings.batch_size * settings.T
    final = None if stop_at is not None else round(evaluate(model, full_val), 6)
    return {
        "config": asdict(config),
        "n_params": n_params,
        "seed": seed,
        "tokens": history.tokens[-1],
        "eval_step": history.eval_step,
        "eval_tokens": [(s + 1) * tokens_per_step for s in history.eval_step],
        "eval_loss": [round(v, 6) for v in history.eval_loss],
        "final_loss": final,  # on every validation window; None for a run cut short
        "cpu_seconds": round(time.process_time() - began, 1),
    }


def sweep_runs(settings: SweepSettings = SETTINGS) -> list[tuple[GPTConfig, int]]:
    """Every (config, seed) of the sweep: seed 0 for all sizes, seed 1 for the small ones."""
    runs = [(config, 0) for config in SWEEP]
    runs += [(config, 1) for config in SWEEP
             if non_embedding_parameters(config) < settings.second_seed_below]
    return runs


# ---------------------------------------------------------------------------------------------
# Fitting L(x) = a x^-alpha + c
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerLaw:
    """L(x) = a x^-alpha + c: a power law that levels off at the irreducible loss c."""

    a: float  # scale: the reducible loss at x = 1
    alpha: float  # exponent: each doubling of x multiplies the reducible loss by 2^-alpha
    c: float  # the loss that no x removes (0 for a pure power law)

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        """L(x) = a x^-alpha + c."""
        return self.a * np.power(np.asarray(x, dtype=float), -self.alpha) + self.c


def _check_points(x: Sequence[float], loss: Sequence[float], name: str,
                  least: int) -> tuple[np.ndarray, np.ndarray]:
    """x and loss as float arrays (K,), checked: same length, x > 0, finite, enough points."""
    try:
        xs = np.asarray(x, dtype=float)
        ls = np.asarray(loss, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} and loss must be sequences of numbers, got "
                        f"{type(x).__name__} and {type(loss).__name__}") from None
    if xs.ndim != 1 or ls.shape != xs.shape:
        raise ValueError(f"{name} and loss must be 1-D and of one length, got shapes "
                         f"{xs.shape} and {ls.shape}")
    if not np.all(np.isfinite(xs)) or not np.all(np.isfinite(ls)):
        raise ValueError(f"{name} and loss must be finite numbers, got a NaN or inf in "
                         f"{name if not np.all(np.isfinite(xs)) else 'loss'}")
    if np.any(xs <= 0):
        raise ValueError(f"{name} must be > 0 (a power law of {name}), got "
                         f"{xs[xs <= 0][0]:g}")
    distinct = len(np.unique(xs))
    if distinct < least:
        raise ValueError(f"fitting needs at least {least} distinct values of {name}, got "
                         f"{distinct}")
    return xs, ls


def _linear_part(z: np.ndarray, ls: np.ndarray, c_max: float) -> tuple[np.ndarray, ...]:
    """For each row of z (G, K) = (x / x0)^-alpha, the least-squares a >= 0 and 0 <= c <= c_max
    of L = a z + c, and the squared error: for fixed alpha the law is linear in (a, c)."""
    zm, lm = z.mean(axis=1, keepdims=True), ls.mean()
    a = ((z - zm) * (ls - lm)).sum(axis=1) / ((z - zm) ** 2).sum(axis=1).clip(1e-300)  # (G,)
    c = lm - a * zm[:, 0]  # (G,)
    clipped = (c < 0) | (c > c_max)  # fall back to c at its bound, a refitted for it
    c = np.where(clipped, c.clip(0.0, c_max), c)
    a = np.where(clipped, (z * (ls - c[:, None])).sum(axis=1) / (z * z).sum(axis=1), a)
    a = a.clip(0.0)
    error = ((a[:, None] * z + c[:, None] - ls) ** 2).sum(axis=1)  # (G,)
    return a, c, error


def fit_power_law(x: Sequence[float], loss: Sequence[float], *, irreducible: bool = True,
                  name: str = "x") -> PowerLaw:
    """Least-squares fit of L = a x^-alpha + c (or, with irreducible=False, L = a x^-alpha).

    Three parameters need at least three distinct x (two for the pure power law). For a fixed
    alpha the law is linear in a and c, solved exactly (with a >= 0 and 0 <= c <= min(L));
    what is left is a search over one number, alpha in [0, 5]: a grid, then Brent's method
    around the best grid point (variable projection, Golub and Pereyra 1973).
    """
    xs, ls = _check_points(x, loss, name, 3 if irreducible else 2)
    if np.any(ls <= 0):
        raise ValueError(f"a power law of {name} needs losses > 0, got {ls[ls <= 0][0]:g}")
    log_x0 = float(np.mean(np.log(xs)))
    u = np.log(xs) - log_x0  # log(x / x0), centred: keeps x^-alpha near 1
    c_max = float(ls.min()) if irreducible else 0.0

    def error(alpha: float) -> float:
        return float(_linear_part(np.exp(-alpha * u)[None, :], ls, c_max)[2][0])

    grid = np.linspace(0.0, 5.0, 501)  # (G,), steps of 0.01
    errors = _linear_part(np.exp(-grid[:, None] * u), ls, c_max)[2]  # (G,)
    best = int(np.argmin(errors))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    alpha = float(minimize_scalar(error, bounds=(low, high), method="bounded",
                                  options={"xatol": 1e-10}).x)
    if errors[best] < error(alpha):  # the grid point itself (e.g. alpha = 0 or 5)
        alpha = float(grid[best])
    a, c, _ = _linear_part(np.exp(-alpha * u)[None, :], ls, c_max)
    return PowerLaw(a=float(a[0]) * math.exp(alpha * log_x0), alpha=alpha, c=float(c[0]))


def leave_one_out(x: Sequence[float], loss: Sequence[float], *, irreducible: bool = True,
                  name: str = "x") -> list[PowerLaw]:
    """One fit per distinct x, each without the points at that x (all seeds of one size):
    how much a single size moves the fit."""
    xs, ls = _check_points(x, loss, name, (3 if irreducible else 2) + 1)
    return [fit_power_law(xs[xs != v], ls[xs != v], irreducible=irreducible, name=name)
            for v in np.unique(xs)]


def bootstrap(x: Sequence[float], loss: Sequence[float], *, draws: int = 1000, seed: int = 0,
              irreducible: bool = True, name: str = "x") -> list[PowerLaw]:
    """Fits to `draws` resamples of the points, drawn with replacement (Efron's bootstrap);
    a resample with too few distinct x to fit is drawn again."""
    least = 3 if irreducible else 2
    xs, ls = _check_points(x, loss, name, least)
    if not is_int(draws) or draws < 1:
        raise ValueError(f"draws must be a positive int, got {draws!r}")
    rng = np.random.default_rng(seed)
    fits = []
    while len(fits) < draws:
        pick = rng.integers(0, len(xs), len(xs))  # (K,) indices, with repeats
        if len(np.unique(xs[pick])) >= least:
            fits.append(fit_power_law(xs[pick], ls[pick], irreducible=irreducible, name=name))
    return fits


def interval(values: Sequence[float], level: float = 0.9) -> tuple[float, float]:
    """The central `level` interval of values (percentiles), e.g. 5% to 95% for 0.9."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    low, high = np.quantile(np.asarray(values, dtype=float), [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


# ---------------------------------------------------------------------------------------------
# The compute frontier
# ---------------------------------------------------------------------------------------------


def compute_frontier(curves: Sequence[tuple[Sequence[float], Sequence[float]]]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lower envelope of several loss curves against compute: the points (C, L) that no
    point of any curve beats with less or equal compute and a lower loss.

    curves: one (compute (K,), loss (K,)) pair per run, compute > 0. Returns the frontier's
    compute, loss and the index of the curve each point comes from, by increasing compute.

        [([1, 2, 4], [3.0, 2.0, 1.5]), ([2, 4], [2.5, 1.0])]
        -> C [1, 2, 4], L [3.0, 2.0, 1.0], curve [0, 0, 1]
    """
    if len(curves) == 0:
        raise ValueError("compute_frontier needs at least one curve, got none")
    cs, ls, ids = [], [], []
    for i, (compute, loss) in enumerate(curves):
        c, lo = _check_points(compute, loss, "compute", 1)
        cs.append(c)
        ls.append(lo)
        ids.append(np.full(len(c), i))
    c, lo, idx = np.concatenate(cs), np.concatenate(ls), np.concatenate(ids)
    order = np.lexsort((lo, c))  # by compute, then by loss
    c, lo, idx = c[order], lo[order], idx[order]
    best = np.minimum.accumulate(lo)  # lowest loss reached with at most this much compute
    keep = np.ones(len(c), dtype=bool)
    keep[1:] = lo[1:] < best[:-1]  # strictly better than everything cheaper or as cheap
    return c[keep], lo[keep], idx[keep]
