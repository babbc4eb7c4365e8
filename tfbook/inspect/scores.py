"""Attention-pattern scores of every head: previous-token, first-token sink, duplicate, induction.

    ids = repeated_random_tokens(model.config.vocab_size, bos_id=tok.bos_id, exclude=specials)
    scores = head_scores(model, ids)              # {"induction": (L, H), ...}, each in [0, 1]
    found = heads_of_kind(scores["induction"], threshold=0.5, bound=1e-4)

A score asks how much of a head's attention falls where a kind of head would look. For each
kind a detection mask M (T, S) marks the (query, key) pairs it cares about, and a query is
scored only if its row of M marks something (it has something to find). With A_h the head's
weights (each row sums to 1) and Q the scored queries, pooled over the batch:

    score_h = (1 / |Q|) sum_{t in Q} sum_s A_h[t, s] M[t, s]       in [0, 1]

the mean attention mass a scored query puts on its marked keys. The kinds, for tokens x_t:

    previous_token   M[t, t - 1] = 1                      (every t >= 1)
    first_token      M[t, 0] = 1                          (t >= 1: the "attention sink",
                                                           Xiao et al. 2023, the first key)
    duplicate_token  M[t, s] = 1 if x_s = x_t, s < t      (an earlier copy of the same token)
    induction        M[t, s + 1] = 1 if x_s = x_t, s < t  (the token AFTER an earlier copy:
                                                           [A][B] ... [A] -> look at [B])

Induction heads (Olsson et al. 2022) are found on a sequence of R random tokens repeated
twice: in the second half, query t's token appeared once before, at t - R, so an induction
head looks at key t - R + 1 and a duplicate-token head at t - R. `repeated_random_tokens`
builds such a batch: a seeded torch.Generator, R DISTINCT ids per sequence (drawn without
replacement, so each second-half token has exactly one earlier copy and no first-half query
is scored), special ids excluded, the BOS id first when the model was trained with one
(SmolLM2 was: its first position is where heads park attention they do not need).

TransformerLens (`transformer_lens.head_detector`, "mul" measure) uses the same masks for
previous_token, duplicate_token and induction, but divides the masked mass by the mass of
EVERY row, scored or not (T rows of 1): its score is ours times |Q| / T. A perfect induction
head on [BOS] + R tokens twice scores 1 here and R / (2R + 1) there; its previous-token score
is ours times (T - 1) / T. It has no first_token kind. `tl_detector_score` converts.

A head "is" of a kind by a score clear of a threshold by more than the rounding of the
scores (`heads_of_kind`, `best_head`), never by a rank that rounding could swap;
`score_rounding` measures that rounding against a float64 run of the same model.

Shape legend: L layers, B batch, H heads, T query positions, S key positions (S = T).
"""

from __future__ import annotations

import copy
import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tfbook.inspect.hooks import hook_names, run_with_cache

KINDS = ("previous_token", "first_token", "duplicate_token", "induction")
WEIGHTS = "*.attn.weights"  # the hook points whose tensors the scores read, one per layer


# -- the test sequences ------------------------------------------------------------------------

def repeated_random_tokens(vocab_size: int, n_tokens: int = 25, n_sequences: int = 4, *,
                           bos_id: int | None = None, exclude: Iterable[int] = (),
                           seed: int = 0) -> Tensor:
    """(n_sequences, [1 +] 2 n_tokens) ids: R = n_tokens distinct random ids, then the same R
    again, after `bos_id` when given. Ids in `exclude` (special tokens) and bos_id are never
    drawn; torch.Generator(seed) makes the batch the same on every machine.

    repeated_random_tokens(50, 3, 1, bos_id=0) -> e.g. [[0, 17, 4, 31, 17, 4, 31]]
    """
    for name, value in (("vocab_size", vocab_size), ("n_tokens", n_tokens),
                        ("n_sequences", n_sequences), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                or value < (0 if name == "seed" else 1):
            raise ValueError(f"{name} must be a {'non-negative' if name == 'seed' else 'positive'}"
                             f" int, got {value!r}")
    banned = set(_int_list(exclude, "exclude")) | ({bos_id} if bos_id is not None else set())
    if bos_id is not None and (isinstance(bos_id, bool) or not isinstance(bos_id, numbers.Integral)
                               or not 0 <= bos_id < vocab_size):
        raise ValueError(f"bos_id must be None or an id in [0, {vocab_size}), got {bos_id!r}")
    allowed = torch.tensor([i for i in range(vocab_size) if i not in banned], dtype=torch.long)
    if allowed.numel() < n_tokens:
        raise ValueError(f"cannot draw {n_tokens} distinct ids from the {allowed.numel()} "
                         f"allowed of a vocabulary of {vocab_size}")
    generator = torch.Generator().manual_seed(int(seed))
    rows = [allowed[torch.randperm(allowed.numel(), generator=generator)[:n_tokens]]
            for _ in range(n_sequences)]
    half = torch.stack(rows)  # (N, R)
    ids = torch.cat([half, half], dim=1)  # (N, 2R)
    if bos_id is not None:
        ids = torch.cat([torch.full((n_sequences, 1), bos_id, dtype=torch.long), ids], dim=1)
    return ids


def _int_list(items: Iterable[int], what: str) -> list[int]:
    items = list(items.tolist() if isinstance(items, Tensor) else items)
    if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in items):
        raise TypeError(f"{what} must be ints (token ids), got {items!r:.60}")
    return [int(i) for i in items]


# -- masks and the score -----------------------------------------------------------------------

def detection_mask(ids: Tensor, kind: str) -> Tensor:
    """The (query, key) pairs a head of `kind` attends to: (B, T) ids -> (B, T, T) bool.

    The same pairs as TransformerLens's get_<kind>_head_detection_pattern (previous_token,
    duplicate_token, induction), batched; first_token marks key 0 for every query t >= 1.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    ids = _check_ids(ids)
    B, T = ids.shape
    t = torch.arange(T)
    earlier = t[None, :] < t[:, None]  # (T, T): key s before query t
    if kind == "previous_token":
        return (t[None, :] == t[:, None] - 1).expand(B, T, T).clone()
    if kind == "first_token":
        return ((t[None, :] == 0) & (t[:, None] >= 1)).expand(B, T, T).clone()
    same = (ids[:, :, None] == ids[:, None, :]) & earlier  # (B, T, T): x_s = x_t, s < t
    if kind == "duplicate_token":
        return same
    shifted = torch.zeros_like(same)
    shifted[:, :, 1:] = same[:, :, :-1]  # key s + 1 for each earlier copy s
    return shifted & (t[None, :] <= t[:, None])  # s + 1 <= t, as TransformerLens's tril


def pattern_score(weights: Tensor, mask: Tensor) -> Tensor:
    """Mean masked attention mass over the scored queries: (..., B, H, T, T) weights and a
    (B, T, T) mask -> (..., H), each in [0, 1] (clamped: a row's rounded sum may pass 1 by an
    ulp).  sum_{b, t in Q} sum_s A[b, h, t, s] M[b, t, s] / |Q|,  Q = rows of M marking a key.
    """
    if not isinstance(weights, Tensor) or not weights.is_floating_point() or weights.dim() < 4:
        raise TypeError(f"weights must be attention weights (..., B, H, T, S), got "
                        f"{weights.shape if isinstance(weights, Tensor) else type(weights)}")
    B, H, T, S = weights.shape[-4:]
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (B, T, S):
        raise ValueError(f"mask must be a bool tensor of shape (B, T, S) = {(B, T, S)}, got "
                         f"{mask.shape if isinstance(mask, Tensor) else type(mask).__name__}")
    scored = mask.any(-1)  # (B, T): queries with something to find
    n = int(scored.sum())
    if n == 0:
        raise ValueError("no query has a key to look for (e.g. a duplicate or induction score "
                         "on text without repeated tokens): use repeated_random_tokens")
    masked = (weights * mask[:, None].to(weights.dtype)).sum(-1)  # (..., B, H, T)
    total = masked.sum(dim=(-3, -1))  # (..., H)
    return (total / n).clamp(0.0, 1.0)


def uniform_baseline(ids: Tensor, kinds: Iterable[str] = KINDS) -> dict[str, float]:
    """Each kind's score of a head that spreads its attention evenly over the keys it may see
    (weight 1 / (t + 1) on each s <= t): the level a score must clear to mean anything.
    On T positions its previous-token score is (H_T - 1) / (T - 1), H_T the harmonic number."""
    ids = _check_ids(ids)
    B, T = ids.shape
    causal = torch.tril(torch.ones(T, T, dtype=torch.float64))
    uniform = (causal / causal.sum(-1, keepdim=True)).expand(B, 1, T, T)  # (B, 1, T, T)
    return {k: float(pattern_score(uniform, detection_mask(ids, k))[0]) for k in _kinds(kinds)}


def tl_detector_score(score: Tensor, ids: Tensor, kind: str) -> Tensor:
    """Our score turned into TransformerLens's head_detector "mul" score for the same single
    sequence ids (T,) or (1, T): times |Q| / T (TL divides by every row's mass)."""
    ids = _check_ids(ids)
    if ids.size(0) != 1:
        raise ValueError(f"TransformerLens scores one sequence at a time; got {ids.size(0)}")
    scored = int(detection_mask(ids, kind).any(-1).sum())
    return score * scored / ids.size(1)


# -- every head of a model ---------------------------------------------------------------------

def attention_weights(cache: Mapping[str, Tensor]) -> Tensor:
    """Every layer's attention weights from a cache, stacked: (L, B, H, T, S)."""
    if not isinstance(cache, Mapping):
        raise TypeError(f"cache must be an ActivationCache (run_with_cache), got "
                        f"{type(cache).__name__}")
    names = sorted((n for n in cache if re.fullmatch(r"blocks\.\d+\.attn\.weights", n)),
                   key=lambda n: int(n.split(".")[1]))
    if not names:
        raise ValueError(
            f"head scores need attention weights, and this cache holds no 'blocks.<i>.attn."
            f"weights' (it holds {len(cache)} tensors, e.g. {next(iter(cache), None)!r}); run "
            f"run_with_cache(model, ids, names='{WEIGHTS}')")
    return torch.stack([cache[n] for n in names])


def scores_from_cache(cache: Mapping[str, Tensor], ids: Tensor,
                      kinds: Iterable[str] = KINDS) -> dict[str, Tensor]:
    """Each kind's score of every head, {kind: (L, H)}, from a run's cached weights on ids."""
    weights = attention_weights(cache)  # (L, B, H, T, S)
    ids = _check_ids(ids)
    if weights.shape[1] != ids.size(0) or weights.shape[-2:] != (ids.size(1), ids.size(1)):
        raise ValueError(f"the cached weights {tuple(weights.shape[1:])} (B, H, T, S) are not "
                         f"those of a run on ids of shape {tuple(ids.shape)} (B, T) without a "
                         "cache of earlier positions")
    return {kind: pattern_score(weights, detection_mask(ids, kind)) for kind in _kinds(kinds)}


@torch.no_grad()
def head_scores(model: nn.Module, ids: Tensor, kinds: Iterable[str] = KINDS) -> dict[str, Tensor]:
    """Run `model` once on ids (B, T) and score every head: {kind: (L, H)}, each in [0, 1].

    Only the attention weights are kept; a tfbook GPT computes the logits of the last position
    only (last_only), which the scores do not need.
    """
    if not isinstance(model, nn.Module) or not hook_names(model, WEIGHTS):
        raise ValueError(
            f"head scores need attention weights, and {type(model).__name__} has no hook point "
            f"'blocks.<i>.attn.weights' (a tfbook model with self-attention blocks has one per "
            f"layer)")
    ids = _check_ids(ids)
    kwargs = {"last_only": True} if hasattr(model, "lm_head") else {}
    _, cache = run_with_cache(model, ids, names=WEIGHTS, **kwargs)
    return scores_from_cache(cache, ids, kinds)


@torch.no_grad()
def score_rounding(model: nn.Module, ids: Tensor, kinds: Iterable[str] = KINDS
                   ) -> dict[str, float]:
    """max over heads of |score(float32 run) - score(float64 run)|, per kind.

    The float64 run (unit roundoff 2^-53, 2^29 times finer) stands in for exact arithmetic,
    so this is how far this machine's float32 rounding moved the scores. Another machine
    rounds the same sums in another order, by errors of the same size but not the same
    values: give `heads_of_kind` a bound several times this (the book uses 10x). The float64
    copy holds 8 bytes per weight (about 1 GB for SmolLM2-135M); its RMSNorms still take
    their statistics in float32 (tfbook.normalization.rms_norm), which leaves the distance of
    the same size (measured on SmolLM2: 5.0e-7 against 4.0e-7 with float64 norms).
    """
    kinds = _kinds(kinds)
    low = head_scores(model, ids, kinds)
    exact = head_scores(copy.deepcopy(model).double(), ids, kinds)
    return {k: float((low[k].double() - exact[k]).abs().max()) for k in kinds}


# -- heads of a kind, with a margin ------------------------------------------------------------

@dataclass
class HeadsOfKind:
    """Heads clear of a threshold: `heads` above it by more than the bound (score order),
    `undecided` within the bound of it (rounding could put them on either side)."""

    heads: list[tuple[int, int, float]]
    undecided: list[tuple[int, int, float]]


def heads_of_kind(scores: Tensor, threshold: float, bound: float) -> HeadsOfKind:
    """The heads (layer, head, score) with score - threshold > bound, highest first.

    `bound` is the float uncertainty of the scores (>= 0, e.g. 10 x `score_rounding`): a head
    within it of the threshold is reported as undecided instead of being named.
    """
    _check_scores(scores)
    for name, value in (("threshold", threshold), ("bound", bound)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
            raise TypeError(f"{name} must be a number, got {value!r}")
    if bound < 0:
        raise ValueError(f"bound must be >= 0 (the rounding of the scores), got {bound}")
    gap = scores.double() - threshold
    above = _listed(scores, gap > bound)
    undecided = _listed(scores, gap.abs() <= bound)
    return HeadsOfKind(above, undecided)


def best_head(scores: Tensor, bound: float) -> tuple[int, int, float, float]:
    """(layer, head, score, lead) of the top-scoring head, whose lead over the second exceeds
    2 x bound (each score may move by `bound`, so a smaller lead could swap them); else a
    ValueError naming both."""
    _check_scores(scores)
    if isinstance(bound, bool) or not isinstance(bound, numbers.Real) or not bound >= 0:
        raise ValueError(f"bound must be a number >= 0, got {bound!r}")
    if scores.numel() < 2:
        raise ValueError("best_head needs at least two heads to compare")
    top = scores.flatten().double().topk(2)
    H = scores.size(1)
    (a, b), (va, vb) = top.indices.tolist(), top.values.tolist()
    lead = va - vb
    if not lead > 2 * bound:
        raise ValueError(f"the best two heads L{a // H}H{a % H} ({va:.6f}) and L{b // H}H{b % H} "
                         f"({vb:.6f}) are within 2 x {bound:.2e} of each other: rounding could "
                         "swap them, so neither is 'the best'")
    return a // H, a % H, va, lead


def _listed(scores: Tensor, chosen: Tensor) -> list[tuple[int, int, float]]:
    found = [(int(i), int(h), float(scores[i, h])) for i, h in chosen.nonzero().tolist()]
    return sorted(found, key=lambda x: -x[2])


def _check_scores(scores: Tensor) -> None:
    if not isinstance(scores, Tensor) or scores.dim() != 2 or not scores.is_floating_point():
        raise TypeError(f"scores must be a float tensor (L, H), one score per head, got "
                        f"{tuple(scores.shape) if isinstance(scores, Tensor) else type(scores)}")


def _kinds(kinds: Iterable[str]) -> list[str]:
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds must be some of {KINDS}, got {kinds!r}")
    return kinds


def _check_ids(ids: Tensor) -> Tensor:
    """ids (B, T) or (T,) of integers -> (B, T) long."""
    if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.dtype == torch.bool \
            or ids.dim() not in (1, 2) or ids.size(-1) < 2:
        raise TypeError(f"ids must be token ids (B, T) or (T,) with T >= 2, got "
                        f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
    return (ids[None] if ids.dim() == 1 else ids).long().cpu()
