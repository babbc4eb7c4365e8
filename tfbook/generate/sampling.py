"""Decoding rules: penalties, greedy, temperature, top-k, top-p (nucleus) and min-p sampling.

Given the scores z of the next token (the logits), a rule picks one id per row:

    penalties    lower z_i of the tokens already in the text (they read the ids so far):
                 repetition  z_i / r if z_i > 0, z_i * r if not  (Keskar et al. 2019, CTRL)
                 frequency   z_i - a_f * c_i, presence  z_i - a_p * [c_i > 0]   (c_i: count
                 of token i among the new tokens, as OpenAI's API defines them)
    greedy       argmax_i z_i
    temperature  softmax(z / tau)          tau < 1 sharper, tau = 1 the model, tau > 1 flatter
    top-k        keep the k largest z_i    (Fan et al. 2018, "Hierarchical Neural Story Generation")
    top-p        keep the smallest set of most likely tokens whose mass reaches p
                 (nucleus sampling, Holtzman et al. 2020, section 3.1)
    min-p        keep the tokens with p_i >= min_p * max_j p_j   (Nguyen et al. 2024)
    sample       one draw from the softmax of what was kept

A filter returns logits with the removed tokens set to -inf: the softmax gives them probability
0 and renormalises the kept ones. The filters equal Hugging Face's processors bit for bit
(`RepetitionPenaltyLogitsProcessor`, `TemperatureLogitsWarper`, `TopKLogitsWarper`,
`TopPLogitsWarper`, `MinPLogitsWarper`, transformers 5.23); `apply_penalties` then
`filter_logits` chain them in the order of HF's `generate` (penalties, temperature, top-k,
top-p, min-p) and `sample` draws as `generate` does, so one seed gives both the same tokens.
`top_p_textbook` is the nucleus computed the way the paper states it: the same set in exact
arithmetic, but not always in float32 (see its docstring).

Shape legend: B batch, L ids so far, V vocab; logits are (..., V), usually (B, V).
"""

import math

import torch
from torch import Tensor

from tfbook.config import is_int, is_number


def _check_logits(logits: Tensor) -> None:
    """Raise a clear error unless `logits` is a floating tensor (..., V) with V >= 1, no NaN."""
    if not isinstance(logits, Tensor):
        raise TypeError(
            f"logits must be a torch.Tensor of shape (..., V), got {type(logits).__name__}"
        )
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.dim() == 0 or logits.size(-1) == 0:
        raise ValueError(
            f"logits must have shape (..., V) with V >= 1, got shape {tuple(logits.shape)}"
        )
    if bool(torch.isnan(logits).any()):
        raise ValueError(
            f"logits must not contain NaN, got {int(torch.isnan(logits).sum())} NaN value(s)"
        )


def _check_temperature(temperature: float) -> float:
    """A finite number >= 0 (0 = greedy) -> that number as a float."""
    if not is_number(temperature):
        raise TypeError(
            f"temperature must be a number >= 0 (0 = greedy), got {temperature!r} "
            f"of type {type(temperature).__name__}"
        )
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(
            f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
        )
    return float(temperature)


def _check_top_k(top_k: int) -> int:
    """An int >= 1 -> that int (no top-k filtering is top_k=None, checked by the caller)."""
    if not is_int(top_k):
        raise TypeError(
            f"top_k must be an int >= 1 (or None for no top-k), got {top_k!r} "
            f"of type {type(top_k).__name__}"
        )
    if top_k < 1:
        raise ValueError(
            f"top_k must be an int >= 1 (or None for no top-k; Hugging Face's generate reads "
            f"top_k=0 as 'off'), got {top_k!r}"
        )
    return int(top_k)


def _check_top_p(top_p: float) -> float:
    """A number in (0, 1] -> that number as a float (1 = no top-p filtering in a chain)."""
    if not is_number(top_p):
        raise TypeError(
            f"top_p must be a number in (0, 1] (or None for no top-p), got {top_p!r} "
            f"of type {type(top_p).__name__}"
        )
    if not (0.0 < top_p <= 1.0):  # also False for NaN
        raise ValueError(f"top_p must lie in (0, 1] (or be None for no top-p), got {top_p!r}")
    return float(top_p)


def _check_min_tokens(min_tokens_to_keep: int) -> int:
    """An int >= 1: how many of the most likely tokens a filter never removes."""
    if not is_int(min_tokens_to_keep):
        raise TypeError(
            f"min_tokens_to_keep must be an int >= 1, got {min_tokens_to_keep!r} "
            f"of type {type(min_tokens_to_keep).__name__}"
        )
    if min_tokens_to_keep < 1:
        raise ValueError(f"min_tokens_to_keep must be an int >= 1, got {min_tokens_to_keep!r}")
    return int(min_tokens_to_keep)


def _check_filters(
    top_k: int | None, top_p: float | None, min_tokens_to_keep: int
) -> tuple[int | None, float | None, int]:
    """Check the optional top_k and top_p (None = off) and min_tokens_to_keep of a chain."""
    top_k = None if top_k is None else _check_top_k(top_k)
    top_p = None if top_p is None else _check_top_p(top_p)
    return top_k, top_p, _check_min_tokens(min_tokens_to_keep)


def check_sampling(
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> None:
    """Refuse bad settings before any work is done (a loop calls this once, up front)."""
    _check_temperature(temperature)
    _check_filters(top_k, top_p, 1)
    if min_p is not None:
        _check_min_p(min_p)
    _check_penalty("repetition_penalty", repetition_penalty, positive=True)
    _check_penalty("frequency_penalty", frequency_penalty, positive=False)
    _check_penalty("presence_penalty", presence_penalty, positive=False)


def _check_filter_value(filter_value: float) -> float:
    """The value written over removed tokens: any number but NaN (-inf removes them)."""
    if not is_number(filter_value):
        raise TypeError(
            f"filter_value must be a number, usually -inf, got {filter_value!r} "
            f"of type {type(filter_value).__name__}"
        )
    if math.isnan(filter_value):
        raise ValueError("filter_value must be a number, usually -inf, got nan")
    return float(filter_value)


def _check_generator(generator: torch.Generator | None) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None (torch's global generator), "
            f"got {type(generator).__name__}"
        )


def _check_history(logits: Tensor, ids: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """ids (..., L) of token ids in [0, V) for the rows of `logits` (..., V) -> (ids, mask).

    `mask` (..., L), True where an id counts (False at padding); None counts them all.
    """
    if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.is_complex() or (
            ids.dtype == torch.bool):
        got = f"dtype {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"ids must be an integer tensor (..., L) of the tokens so far, got {got}")
    if ids.dim() != logits.dim() or ids.shape[:-1] != logits.shape[:-1]:
        raise ValueError(f"ids must have shape (..., L) with the leading shape of the logits "
                         f"{tuple(logits.shape[:-1])}, got {tuple(ids.shape)}")
    if mask is None:
        mask = torch.ones_like(ids, dtype=torch.bool)
    elif not isinstance(mask, Tensor) or mask.shape != ids.shape:
        got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a tensor of the shape of ids {tuple(ids.shape)}, "
                         f"got {got}")
    mask = mask.bool()
    V = logits.size(-1)
    outside = ((ids < 0) | (ids >= V)) & mask
    if bool(outside.any()):
        raise ValueError(f"ids must lie in [0, V={V}), got {int(ids[outside][0])}")
    return ids.long(), mask


def _check_penalty(name: str, value: float, positive: bool) -> float:
    """A finite number (> 0 if `positive`) -> that number as a float."""
    need = "a finite number > 0" if positive else "a finite number"
    if not is_number(value):
        raise TypeError(f"{name} must be {need}, got {value!r} of type {type(value).__name__}")
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"{name} must be {need}, got {value!r}")
    return float(value)


def _seen(logits: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """(..., V) counts of each token among the ids where mask is True, in the logits' dtype."""
    V = logits.size(-1)
    counts = torch.zeros(*logits.shape[:-1], V + 1, dtype=logits.dtype, device=logits.device)
    # padding goes to an extra column V, dropped afterwards
    counts.scatter_add_(-1, ids.masked_fill(~mask, V), torch.ones_like(ids, dtype=logits.dtype))
    return counts[..., :V]


def apply_repetition_penalty(
    logits: Tensor, ids: Tensor, penalty: float, mask: Tensor | None = None
) -> Tensor:
    """CTRL's repetition penalty: a token already in `ids` scores z / r if z > 0, z * r if not.

    Either way r > 1 makes it less likely (once, however often it occurred); r < 1 favours it.
    apply_repetition_penalty([[2., -1., 3.]], ids=[[0, 1]], penalty=2.) -> [[1., -2., 3.]]
    `mask` (..., L) leaves out padding. As HF's `RepetitionPenaltyLogitsProcessor`, which
    `generate` gives the prompt and the new tokens, left padding excluded.
    """
    _check_logits(logits)
    penalty = _check_penalty("repetition_penalty", penalty, positive=True)
    ids, mask = _check_history(logits, ids, mask)
    seen = _seen(logits, ids, mask) > 0  # (..., V)
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def apply_frequency_presence_penalty(
    logits: Tensor, ids: Tensor, frequency: float = 0.0, presence: float = 0.0,
    mask: Tensor | None = None,
) -> Tensor:
    """z_i - frequency * c_i - presence * [c_i > 0], c_i the count of token i in `ids`.

    The frequency penalty grows with every repetition, the presence penalty is paid once;
    both as OpenAI's API defines them (Hugging Face has no such processor). `mask` (..., L)
    leaves out padding. Removed tokens (-inf) stay removed.
    """
    _check_logits(logits)
    frequency = _check_penalty("frequency_penalty", frequency, positive=False)
    presence = _check_penalty("presence_penalty", presence, positive=False)
    ids, mask = _check_history(logits, ids, mask)
    counts = _seen(logits, ids, mask)  # (..., V)
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def apply_penalties(
    logits: Tensor,
    ids: Tensor,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    mask: Tensor | None = None,
    prompt_length: int = 0,
) -> Tensor:
    """The processors that read the text so far, before any filter (HF's `generate` order).

    The repetition penalty reads every real id of `ids` (..., L), prompt included, as HF's
    generate does; frequency and presence read only the new ones (from column
    `prompt_length`), as OpenAI's API does. 1.0, 0.0 and 0.0 switch them off.
    """
    _check_logits(logits)
    ids, mask = _check_history(logits, ids, mask)
    if not is_int(prompt_length) or not 0 <= prompt_length <= ids.size(-1):
        raise ValueError(f"prompt_length must be an int in [0, L={ids.size(-1)}], "
                         f"got {prompt_length!r}")
    r = _check_penalty("repetition_penalty", repetition_penalty, positive=True)
    f = _check_penalty("frequency_penalty", frequency_penalty, positive=False)
    p = _check_penalty("presence_penalty", presence_penalty, positive=False)
    if r != 1.0:
        logits = apply_repetition_penalty(logits, ids, r, mask)
    if f != 0.0 or p != 0.0:
        new = slice(prompt_length, None)
        logits = apply_frequency_presence_penalty(logits, ids[..., new], f, p, mask[..., new])
    return logits


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """Temperature scaling z / tau: the softmax of the result is p_i ∝ exp(z_i / tau).

    tau must be > 0 here. tau -> 0 concentrates all the mass on the argmax, so temperature 0 means
    greedy decoding; it has no logits to scale and is handled by the caller (`next_token`,
    `filter_logits`). As HF's `TemperatureLogitsWarper`.
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    if temperature == 0:
        raise ValueError(
            "temperature must be > 0 to scale logits, got 0: temperature 0 means greedy "
            "decoding, take greedy(logits) (next_token(logits, temperature=0) does so)"
        )
    scaled = logits / temperature
    overflow = torch.isinf(scaled) & torch.isfinite(logits)
    if bool(overflow.any()):
        largest = float(logits[torch.isfinite(logits)].abs().max())
        raise ValueError(
            f"temperature {temperature!r} is too small for these logits: the largest |logit|, "
            f"{largest:.4g}, divided by it overflows {logits.dtype} to inf; for the argmax "
            f"(the limit of a temperature going to 0) use temperature=0, which is greedy"
        )
    return scaled


def top_k_filter(
    logits: Tensor, k: int, min_tokens_to_keep: int = 1, filter_value: float = -math.inf
) -> Tensor:
    """Top-k: keep the tokens whose logit is >= the k-th largest, set the others to -inf.

    Ties with the k-th largest are all kept, so more than k tokens can survive:
    top_k_filter([[3., 1., 3., 2.]], k=1) -> [[3., -inf, 3., -inf]]
    k is raised to `min_tokens_to_keep` and clipped to V. As HF's `TopKLogitsWarper`.
    """
    _check_logits(logits)
    k = max(_check_top_k(k), _check_min_tokens(min_tokens_to_keep))
    filter_value = _check_filter_value(filter_value)
    k = min(k, logits.size(-1))
    kth_largest = torch.topk(logits, k).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth_largest, filter_value)


def top_p_filter(
    logits: Tensor, p: float, min_tokens_to_keep: int = 1, filter_value: float = -math.inf
) -> Tensor:
    """Top-p as Hugging Face computes it: drop the least likely tokens whose mass is <= 1 - p.

    Sort ascending, softmax, running sum from the least likely token: a token goes when the
    mass of itself and everything less likely is <= 1 - p, i.e. when the tokens more likely
    than it already reach p. The `min_tokens_to_keep` most likely always stay.
    probabilities [0.5, 0.2, 0.3], p=0.7 -> keeps tokens 0 and 2 (0.5 + 0.3 = 0.8 >= 0.7)
    At p=1 only tokens whose probability is exactly 0 in floating point go (the warper's
    meaning; `filter_logits` skips top-p at p=1, as `generate` does). As HF's `TopPLogitsWarper`.
    """
    _check_logits(logits)
    p = _check_top_p(p)
    min_tokens_to_keep = _check_min_tokens(min_tokens_to_keep)
    filter_value = _check_filter_value(filter_value)
    sorted_logits, order = torch.sort(logits, descending=False)  # (..., V), least likely first
    tail_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (..., V): token and all below
    remove_sorted = tail_mass <= (1 - p)
    remove_sorted[..., -min_tokens_to_keep:] = False  # the most likely ones always stay
    remove = remove_sorted.scatter(-1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, filter_value)


def _check_min_p(min_p: float) -> float:
    """A number in [0, 1] -> that number as a float."""
    if not is_number(min_p):
        raise TypeError(f"min_p must be a number in [0, 1] (or None for no min-p), got "
                        f"{min_p!r} of type {type(min_p).__name__}")
    if not 0.0 <= min_p <= 1.0:  # also False for NaN
        raise ValueError(f"min_p must lie in [0, 1] (or be None for no min-p), got {min_p!r}")
    return float(min_p)


def min_p_filter(
    logits: Tensor, min_p: float, min_tokens_to_keep: int = 1, filter_value: float = -math.inf
) -> Tensor:
    """Min-p: keep the tokens whose probability is at least min_p times the largest one.

    probabilities [0.6, 0.3, 0.05, 0.05], min_p=0.1 -> keeps tokens 0 and 1 (0.05 < 0.1 * 0.6)
    The cut follows the model's confidence: a sure step keeps few tokens, an unsure one many
    (Nguyen et al. 2024). The `min_tokens_to_keep` most likely always stay. As HF's
    `MinPLogitsWarper`.
    """
    _check_logits(logits)
    min_p = _check_min_p(min_p)
    min_tokens_to_keep = _check_min_tokens(min_tokens_to_keep)
    filter_value = _check_filter_value(filter_value)
    probs = logits.softmax(dim=-1)  # (..., V)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)  # (..., V)
    most_likely = probs.topk(min(min_tokens_to_keep, probs.size(-1)), dim=-1).indices
    remove = remove.scatter(-1, most_likely, False)  # the most likely ones always stay
    return logits.masked_fill(remove, filter_value)


def top_p_textbook(logits: Tensor, p: float) -> Tensor:
    """Top-p as Holtzman et al. (2020) define it: the fewest most likely tokens with mass >= p.

    Sort descending, running sum from the most likely token, keep up to and including the
    first token where the sum reaches p (ties in order of token id). In exact arithmetic this
    is the set `top_p_filter` keeps. In float32 they can disagree about the token(s) right at
    the boundary when V is large: softmax sums the exponentials in the order it is given, and
    adding the many small ones last, onto a large running sum, loses their low bits (HF sorts
    ascending, so it adds them first and its probabilities are the more accurate ones).
    """
    _check_logits(logits)
    p = _check_top_p(p)
    V = logits.size(-1)
    sorted_logits, order = torch.sort(logits, descending=True, stable=True)  # (..., V)
    head_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (..., V): token and all above
    n_keep = (head_mass < p).sum(dim=-1, keepdim=True) + 1  # (..., 1): the one reaching p too
    n_keep = n_keep.clamp(max=V)  # rounding can leave the total just below p = 1
    rank = torch.arange(V, device=logits.device)  # (V,)
    keep_sorted = rank < n_keep  # (..., V)
    keep = keep_sorted.scatter(-1, order, keep_sorted)  # back to vocabulary order
    return logits.masked_fill(~keep, -math.inf)


def _greedy_filter(logits: Tensor) -> Tensor:
    """Temperature 0: keep only the argmax (the first one among ties), as `greedy` picks it."""
    best = logits.argmax(dim=-1, keepdim=True)  # (..., 1)
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, best, True)  # (..., V)
    return logits.masked_fill(~keep, -math.inf)


def filter_logits(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_tokens_to_keep: int = 1,
    min_p: float | None = None,
) -> Tensor:
    """Temperature, then top-k, top-p, min-p: the warpers in the order of HF's `generate`.

    As `generate` does, temperature 1 and top_p 1 are skipped; None switches a filter off
    (HF's generate defaults to top_k=50 when a model sets nothing; here no default filter).
    Temperature 0 (greedy) keeps only the argmax. Returns (..., V) logits, -inf where removed.
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    top_k, top_p, min_tokens_to_keep = _check_filters(top_k, top_p, min_tokens_to_keep)
    min_p = None if min_p is None else _check_min_p(min_p)
    if temperature == 0:
        return _greedy_filter(logits)
    if temperature != 1.0:
        logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k, min_tokens_to_keep)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p, min_tokens_to_keep)
    if min_p is not None:
        logits = min_p_filter(logits, min_p, min_tokens_to_keep)
    return logits


def _softmax(logits: Tensor) -> Tensor:
    """softmax over V, with a clear error for a row that is not a distribution."""
    probs = logits.softmax(dim=-1)  # (..., V)
    bad = torch.isnan(probs).any(dim=-1)  # (...): every logit -inf, or one +inf
    if bool(bad.any()):
        raise ValueError(
            f"logits give no probability distribution in {int(bad.sum())} row(s): a row needs "
            "at least one finite logit and no +inf"
        )
    return probs


def kept_distribution(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_tokens_to_keep: int = 1,
    min_p: float | None = None,
) -> Tensor:
    """The distribution sampling draws from: (..., V) probabilities, 0 outside the kept set.

    softmax(filter_logits(...)): the kept tokens' probabilities renormalised to sum to 1.
    """
    return _softmax(filter_logits(logits, temperature, top_k, top_p, min_tokens_to_keep, min_p))


def entropy(logits: Tensor) -> Tensor:
    """H = -sum_i p_i ln p_i in nats of softmax(logits), (...); removed tokens (-inf) add 0."""
    _check_logits(logits)
    return torch.special.entr(_softmax(logits)).sum(dim=-1)  # entr(p) = -p ln p, entr(0) = 0


def greedy(logits: Tensor) -> Tensor:
    """Greedy decoding: (..., V) -> (...) argmax ids (the first one among ties), as HF's."""
    _check_logits(logits)
    return logits.argmax(dim=-1)


def sample(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row from softmax(logits): (..., V) -> (...) ids.

    The same two calls as HF's `generate` (softmax, then `torch.multinomial(probs, 1)`), so a
    seed gives the same token; with generator=None the draw comes from torch's global
    generator (`torch.manual_seed`), as in `generate`, otherwise from `generator`.
    """
    _check_logits(logits)
    _check_generator(generator)
    probs = _softmax(logits)  # (..., V)
    V = probs.size(-1)
    ids = torch.multinomial(probs.reshape(-1, V), num_samples=1, generator=generator)  # (N, 1)
    return ids.reshape(probs.shape[:-1])  # (...)


def next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    min_tokens_to_keep: int = 1,
    min_p: float | None = None,
) -> Tensor:
    """Next token ids (...) from logits (..., V): greedy at temperature 0, else filter, sample.

    Greedy draws no random number, so it leaves the generator untouched. Penalties, which
    read the ids so far, are applied to `logits` before (`apply_penalties`).
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    top_k, top_p, min_tokens_to_keep = _check_filters(top_k, top_p, min_tokens_to_keep)
    min_p = None if min_p is None else _check_min_p(min_p)
    _check_generator(generator)
    if temperature == 0:
        return greedy(logits)
    kept = filter_logits(logits, temperature, top_k, top_p, min_tokens_to_keep, min_p)
    return sample(kept, generator)
