"""Speculative decoding: a cheap draft guesses n tokens, the model checks them in ONE pass.

A decode step of a large model is slow because it reads every weight to produce a single
token. If something cheap (a draft) guesses the next n tokens, the model (the target) can
score all n guesses in one forward pass over n + 1 positions, which costs about as much as
one step, and keep the guesses it agrees with (Leviathan et al. 2023; Chen et al. 2023):

    context  x_1 .. x_L                        the target's cache holds positions 1 .. L-1
    draft    d_1 .. d_n                        n cheap guesses
    verify   target([x_L, d_1, .., d_n])       ONE pass -> n + 1 next-token distributions
             greedy: keep d_i while d_i == argmax p_i; at the first mismatch take the
                     target's own token (the correction); if all n pass, p_{n+1} gives a
                     bonus token. So each pass yields between 1 and n + 1 tokens.
             sampling: keep d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first
                     rejection draw from norm(max(0, p_i - q_i)). The tokens are then
                     distributed exactly as the target's own samples.
    rollback the cache positions of rejected guesses are dropped (`KVCache.crop`)

Three drafts: `PromptLookupDraft` copies what followed the last n-gram where it occurred
earlier in the text (Saxena 2023; HF's `prompt_lookup_num_tokens`), `EarlyExitDraft` is the
target's own first k blocks with its final norm and head (self-speculation, sharing the
target's weights and the first k layers of its cache), `ModelDraft` any smaller model with
the same vocabulary. Batch 1. Shape legend: n draft tokens, V vocab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn

from tfbook.cache import KVCache
from tfbook.config import is_int
from tfbook.generate.sampling import check_sampling, kept_distribution
from tfbook.generate.search import as_end_ids, check_model, check_request, prompt_batch


def _check_count(name: str, value: object, low: int = 1) -> int:
    """An int >= low -> that int; a float, a bool or a string is refused."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int >= {low}, got {value!r} of type "
                        f"{type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


# --- the drafts --------------------------------------------------------------------------

def prompt_lookup(context: Sequence[int], n: int, max_ngram: int = 2) -> list[int]:
    """Up to n tokens that followed the text's last n-gram where it occurred before.

    The longest n-gram first (max_ngram down to 1), its first occurrence from the left that
    has a continuation; [] when nothing matches. HF's `PromptLookupCandidateGenerator` rule.
    prompt_lookup([5, 6, 7, 8, 5, 6], 3) -> [7, 8, 5]  (the bigram 5 6 occurred at 0)
    """
    n, max_ngram = _check_count("n", n), _check_count("max_ngram", max_ngram)
    context = _context_ids(context)
    L = len(context)
    for size in range(min(max_ngram, L - 1), 0, -1):
        tail = list(context[L - size:])
        for start in range(L - size):  # windows that end before the last token
            if list(context[start : start + size]) == tail:
                return list(context[start + size : min(start + size + n, L)])
    return []


def _context_ids(context: object) -> list[int]:
    """The text so far as a list of int ids (a list, or a 1-D integer tensor)."""
    if isinstance(context, Tensor):
        if context.dim() != 1 or context.is_floating_point() or context.is_complex() or (
                context.dtype == torch.bool):
            raise TypeError(f"context must be token ids (a list of ints or a 1-D integer "
                            f"tensor), got a {context.dtype} tensor of shape "
                            f"{tuple(context.shape)}")
        return context.tolist()
    if isinstance(context, (str, bytes)) or not isinstance(context, Sequence) or not all(
            is_int(t) for t in context):
        raise TypeError(f"context must be token ids (a list of ints or a 1-D integer tensor), "
                        f"got {type(context).__name__} {context!r:.60}")
    return list(context)


class PromptLookupDraft:
    """Draft by copying: `prompt_lookup` on the prompt and the text generated so far."""

    name = "prompt lookup"

    def __init__(self, max_ngram: int = 2) -> None:
        self.max_ngram = _check_count("max_ngram", max_ngram)

    def start(self, target: nn.Module, cache: KVCache, capacity: int) -> None:
        """Nothing to set up: the draft reads only the text."""

    def propose(self, context: list[int], n: int, rule: _Rule) -> tuple[list[int], Tensor | None]:
        """Up to n copied tokens; q is None (a copy is certain: one-hot proposals)."""
        return prompt_lookup(context, n, self.max_ngram), None


class ModelDraft:
    """Draft with a small model of the same vocabulary, one cached step per draft token."""

    name = "draft model"

    def __init__(self, model: nn.Module) -> None:
        check_model(model, None, True, "ModelDraft")
        self.model = model
        self.cache: KVCache | None = None
        self.seen: list[int] = []  # the tokens whose keys and values the draft's cache holds

    def start(self, target: nn.Module, cache: KVCache, capacity: int) -> None:
        """A fresh cache; refuse a draft that writes another vocabulary than the target."""
        V_draft, V_target = self.model.config.vocab_size, target.config.vocab_size
        if V_draft != V_target:
            raise ValueError(f"the draft must share the target's vocabulary: the target has "
                             f"V={V_target}, the draft V={V_draft}")
        if capacity > self.model.config.max_len:
            raise ValueError(f"the draft's context length {self.model.config.max_len} is "
                             f"shorter than the {capacity} positions this request needs")
        self.cache, self.seen = self.model.new_cache(capacity), []

    def _sync(self, context: list[int]) -> int:
        """Roll the draft's cache back to what is still true of `context`; -> its length."""
        keep = 0
        while keep < min(len(self.seen), len(context) - 1) and self.seen[keep] == context[keep]:
            keep += 1
        self.cache.crop(keep)
        self.seen = self.seen[:keep]
        return keep

    @torch.no_grad()
    def propose(self, context: list[int], n: int, rule: _Rule) -> tuple[list[int], Tensor]:
        """n tokens, each from the draft's own next-token rule; q (n, V) their distributions."""
        keep = self._sync(context)
        feed, tokens, qs = list(context[keep:]), [], []  # feed: what the cache has not seen
        for _ in range(n):
            logits = self.model(torch.tensor([feed]), cache=self.cache,
                                last_only=True).logits[0, -1]  # (V,)
            self.seen += feed
            q = rule.distribution(logits)  # (V,)
            token = rule.pick(q, logits)
            tokens.append(token)
            qs.append(q)
            feed = [token]
        return tokens, torch.stack(qs)  # (n, V)


def early_exit_model(target: nn.Module, n_layers: int) -> nn.Module:
    """The target's first `n_layers` blocks with its own embedding, final norm and head.

    A model of the target's class whose modules ARE the target's (no weight is copied):
    h_k = blocks_1..k(embed(x)), logits = head(norm_f(h_k)).
    """
    if not isinstance(target, nn.Module) or not is_int(getattr(getattr(
            target, "config", None), "n_layers", None)):
        raise TypeError(f"target must be a tfbook model with config.n_layers (a GPT or a "
                        f"Llama-style preset), got {type(target).__name__}")
    total = target.config.n_layers
    if not is_int(n_layers):
        raise TypeError(f"n_layers must be an int, got {n_layers!r} of type "
                        f"{type(n_layers).__name__}")
    if not 1 <= n_layers < total:
        raise ValueError(f"an early-exit draft keeps 1 to {total - 1} of the target's {total} "
                         f"blocks, got n_layers={n_layers}")
    with torch.device("meta"):  # shapes only: every module is replaced by the target's
        draft = type(target)(replace(target.config, n_layers=int(n_layers)))
    for name, child in target.named_children():
        setattr(draft, name, nn.ModuleList(child[:n_layers]) if name == "blocks" else child)
    for name, buffer in target.named_buffers(recurse=False):
        setattr(draft, name, buffer)
    return draft.eval()


class EarlyExitDraft(ModelDraft):
    """Self-speculation: the target's first k blocks draft, reading the target's own cache.

    The draft's cache is the first k layers of the target's (`KVCache.first_layers`): every
    position the target has verified is already there, so the draft needs no prefill, and the
    keys and values it writes for its guesses are dropped when the target crops its cache.
    """

    name = "early exit"

    def __init__(self, target: nn.Module, n_layers: int) -> None:
        self.target = target
        self.n_layers = n_layers
        super().__init__(early_exit_model(target, n_layers))

    def start(self, target: nn.Module, cache: KVCache, capacity: int) -> None:
        if target is not self.target:
            raise ValueError("this EarlyExitDraft was made from another model than the target "
                             "it is asked to draft for")
        self.cache = cache.first_layers(self.n_layers)

    def _sync(self, context: list[int]) -> int:
        keep = len(context) - 1  # the target has just cropped every layer to this length
        if self.cache.length != keep:
            raise RuntimeError(f"the shared cache holds {self.cache.length} positions, "
                               f"expected {keep}")
        self.seen = list(context[:keep])
        return keep


# --- the acceptance rule -----------------------------------------------------------------

def check_distributions(p: object, q: object, caller: str) -> None:
    """p and q must be distributions over one vocabulary: floating tensors (..., V) of the same
    shape, finite and >= 0 (each row is read as probabilities; it need not sum to 1)."""
    for name, t in (("p", p), ("q", q)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() == 0:
            got = (f"a {t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, Tensor)
                   else type(t).__name__)
            raise TypeError(f"{caller}: {name} must be a floating tensor (..., V) of "
                            f"probabilities, got {got}")
    if p.shape != q.shape:
        raise ValueError(f"{caller}: p and q must be distributions over the same tokens (the "
                         f"same shape), got p {tuple(p.shape)} and q {tuple(q.shape)}")
    _check_probabilities(p, "p", caller)
    _check_probabilities(q, "q", caller)


def _check_probabilities(t: Tensor, name: str, caller: str) -> None:
    """Every entry of `t` finite and >= 0, or a ValueError naming the first one that is not."""
    bad = ~torch.isfinite(t) | (t < 0)
    if bool(bad.any()):
        where = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"{caller}: {name} must hold finite probabilities >= 0, got "
                         f"{float(t[where]):g} at index {where}")


def acceptance_probability(p: Tensor, q: Tensor) -> Tensor:
    """min(1, p(x) / q(x)) for every proposal x with q(x) > 0 (0 where q(x) = 0): (..., V)."""
    check_distributions(p, q, "acceptance_probability")
    ratio = p / q.clamp_min(torch.finfo(q.dtype).tiny)
    return torch.where(q > 0, ratio.clamp(max=1.0), torch.zeros_like(p))


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p - q)): where a rejected token is redrawn, (..., V).

    The mass p has beyond q: exactly what acceptance leaves missing. When p = q nothing is
    ever rejected and the residual is empty; p itself is returned then.
    """
    check_distributions(p, q, "residual_distribution")
    return _residual(p, q)


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """`residual_distribution` without the checks (verify's loop has made them)."""
    excess = (p - q).clamp_min(0)  # (..., V)
    total = excess.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, excess / total.clamp_min(torch.finfo(p.dtype).tiny), p)


def emitted_distribution(p: Tensor, q: Tensor) -> Tensor:
    """The distribution of the token one acceptance step emits, summed over proposals x ~ q:

    P(y) = q(y) a(y) + (sum_x q(x) (1 - a(x))) r(y),  a = min(1, p/q), r = norm(max(0, p-q)).
    The theorem (Leviathan et al. 2023, appendix A.1): P = p. p, q: (V,) -> (V,).
    """
    a = acceptance_probability(p, q)
    rejected = (q * (1 - a)).sum(dim=-1, keepdim=True)  # the mass of rejected proposals
    return q * a + rejected * residual_distribution(p, q)


class _Rule:
    """How a token is picked from logits: greedy (temperature 0) or sampled (filters)."""

    def __init__(self, temperature: float, top_k: int | None, top_p: float | None,
                 generator: torch.Generator | None) -> None:
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator = generator
        self.greedy = temperature == 0

    def distribution(self, logits: Tensor) -> Tensor:
        """(..., V) -> the distribution the rule samples from (one-hot argmax when greedy)."""
        if self.greedy:
            return nn.functional.one_hot(logits.argmax(dim=-1), logits.size(-1)).to(logits.dtype)
        return kept_distribution(logits, self.temperature, self.top_k, self.top_p)

    def pick(self, q: Tensor, logits: Tensor) -> int:
        if self.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(q, 1, generator=self.generator))

    def uniform(self, dtype: torch.dtype) -> float:
        return float(torch.rand((), generator=self.generator, dtype=dtype))


def verify(
    logits: Tensor, tokens: list[int], q: Tensor | None, rule: _Rule
) -> list[int]:
    """The target's verdict on n draft tokens: logits (n + 1, V) -> the 1 .. n + 1 kept tokens.

    Greedy: the drafts that equal the argmax, then the target's own next token. Sampling:
    accept d_i with probability min(1, p_i(d_i) / q_i(d_i)), else draw from the residual and
    stop; all accepted: one more token from p_{n+1} (the bonus).
    """
    _check_verdict(logits, tokens, q, rule)
    if rule.greedy:  # compare with the target's argmax: no distribution needed
        best = logits.argmax(dim=-1).tolist()  # (n + 1,)
        m = 0
        while m < len(tokens) and tokens[m] == best[m]:
            m += 1
        return tokens[:m] + [best[m]]
    p = rule.distribution(logits)  # (n + 1, V)
    if q is None:  # a certain proposal (prompt lookup): q is one-hot at the drafted token
        q = nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long), p.size(-1)).to(p.dtype)
    for i, d in enumerate(tokens):
        if rule.uniform(p.dtype) * q[i, d] < p[i, d]:  # u < p / q: accepted
            continue
        residual = _residual(p[i], q[i])
        return tokens[:i] + [int(torch.multinomial(residual, 1, generator=rule.generator))]
    return tokens + [int(torch.multinomial(p[len(tokens)], 1, generator=rule.generator))]


def _check_verdict(logits: object, tokens: object, q: object, rule: object) -> None:
    """verify's arguments: logits (n + 1, V) for n draft ids in [0, V), q None or (n, V)."""
    if not isinstance(rule, _Rule):
        raise TypeError(f"rule must be the loop's _Rule, got {type(rule).__name__}")
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence) or not all(
            is_int(t) for t in tokens):
        raise TypeError(f"tokens must be a list of int draft ids, got {tokens!r:.60}")
    n = len(tokens)
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() != 2:
        got = (f"a {logits.dtype} tensor of shape {tuple(logits.shape)}"
               if isinstance(logits, Tensor) else type(logits).__name__)
        raise TypeError(f"logits must be a floating tensor (n + 1, V), got {got}")
    if logits.size(0) != n + 1:
        raise ValueError(f"logits must have one row per draft token plus one (the bonus): "
                         f"{n} tokens need {n + 1} rows, got {logits.size(0)}")
    V = logits.size(1)
    bad = [t for t in tokens if not 0 <= t < V]
    if bad:
        raise ValueError(f"draft ids must lie in [0, V={V}), got {bad[0]}")
    if q is not None:
        if not isinstance(q, Tensor) or q.shape != (n, V):
            got = tuple(q.shape) if isinstance(q, Tensor) else type(q).__name__
            raise ValueError(f"q must be None or the draft's distributions (n, V) = ({n}, {V}), "
                             f"got {got}")
        _check_probabilities(q, "q", "verify")


# --- the loop ----------------------------------------------------------------------------

@dataclass
class SpeculativeGeneration:
    """What `speculative_generate` returns: the tokens and what each verification kept."""

    tokens: list[int]  # the prompt followed by the new tokens
    prompt_length: int
    proposed: list[int] = field(default_factory=list)  # draft tokens offered, per target pass
    accepted: list[int] = field(default_factory=list)  # of those, how many the target kept
    drafts: list[list[int]] = field(default_factory=list)  # the guesses of each pass
    logits: list[Tensor] = field(default_factory=list)  # per new token, the target's (V,)

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length:]

    @property
    def target_passes(self) -> int:
        """Forward passes of the target after the prompt (plain greedy needs one per token)."""
        return len(self.proposed)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / proposed ones (nan if none was proposed)."""
        total = sum(self.proposed)
        return sum(self.accepted) / total if total else float("nan")


def _prompt_ids(prompt: Tensor | Sequence[int], V: int) -> list[int]:
    """One prompt: a list of ids, or ids (T,) or (1, T); a batch of several is refused."""
    if isinstance(prompt, Tensor) and prompt.dim() == 1:
        prompt = prompt[None]
    if isinstance(prompt, Tensor):
        if prompt.dim() == 2 and prompt.size(0) != 1:
            raise ValueError(f"speculative decoding here serves one sequence (batch 1), got a "
                             f"batch of {prompt.size(0)}")
        ids, _ = prompt_batch(prompt, None, 0, V)
    else:
        if isinstance(prompt, Sequence) and prompt and not isinstance(prompt, (str, bytes)) \
                and all(isinstance(p, (Sequence, Tensor)) and not isinstance(p, (str, bytes))
                        for p in prompt):
            if len(prompt) != 1:
                raise ValueError(f"speculative decoding here serves one sequence (batch 1), "
                                 f"got {len(prompt)} prompts")
            prompt = prompt[0]
        ids, _ = prompt_batch([prompt], None, 0, V)
    return ids[0].tolist()


@torch.no_grad()
def speculative_generate(
    target: nn.Module,
    prompt: Tensor | Sequence[int],
    max_new_tokens: int,
    draft: PromptLookupDraft | ModelDraft,
    draft_length: int = 4,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    end_ids: int | Sequence[int] = (),
    generator: torch.Generator | None = None,
    keep_logits: bool = False,
) -> SpeculativeGeneration:
    """Continue ONE prompt by up to `max_new_tokens` tokens, `draft_length` guesses per pass.

    Greedy (temperature 0) gives the tokens of `generate(target, ...)`; above 0 the tokens
    follow the target's sampling distribution (temperature, top-k, top-p as in `generate`).
    Stops after an end token (kept). `generator` seeds the draws (torch's global one if None).
    keep_logits: keep, for every new token, the target's scores it was chosen from (a row
    of a verify pass), to compare with `generate`'s.
    """
    check_model(target, None, True, "speculative_generate")
    if not isinstance(draft, (PromptLookupDraft, ModelDraft)):
        raise TypeError(f"draft must be a PromptLookupDraft, a ModelDraft or an EarlyExitDraft, "
                        f"got {type(draft).__name__}")
    draft_length = _check_count("draft_length", draft_length)
    V = target.config.vocab_size
    context = _prompt_ids(prompt, V)
    end_ids = as_end_ids(end_ids)
    check_request(len(context), max_new_tokens, target.config.max_len, end_ids, V)
    if keep_logits is not True and keep_logits is not False:
        raise TypeError(f"keep_logits must be True or False, got {keep_logits!r}")
    check_sampling(temperature, top_k, top_p)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    rule = _Rule(float(temperature), top_k, top_p, generator)
    T = len(context)
    capacity = T + max_new_tokens  # a pass never writes past the last position it may keep
    cache = target.new_cache(capacity)
    draft.start(target, cache, capacity)
    if T > 1:  # prefill all but the last prompt token: each pass starts with the last one
        target(torch.tensor([context[:-1]]), cache=cache, last_only=True)  # only the cache
    result = SpeculativeGeneration(tokens=context, prompt_length=T)
    while len(context) - T < max_new_tokens:
        n = min(draft_length, max_new_tokens - (len(context) - T) - 1)  # room for the bonus
        tokens, q = draft.propose(context, n, rule) if n > 0 else ([], None)
        cache.crop(len(context) - 1)  # drop what a cache-sharing draft wrote
        chunk = torch.tensor([[context[-1]] + tokens])  # (1, n + 1)
        logits = target(chunk, cache=cache).logits[0]  # (n + 1, V): ONE pass checks them all
        kept = verify(logits, tokens, q, rule)
        cache.crop(len(context) + len(kept) - 1)  # rollback: the rejected guesses' positions
        result.proposed.append(len(tokens))
        result.drafts.append(tokens)
        result.accepted.append(len(kept) - 1)
        for i, token in enumerate(kept):
            context.append(token)
            if keep_logits:
                result.logits.append(logits[i])
            if token in end_ids:
                return result
    return result
