"""Beam search: follow the K most likely continuations instead of the single most likely one.

    start   one beam: the prompt, with score 0
    step    every beam followed by every token is a candidate, scored by its log-probability
                score(y_1 .. y_t) = sum_i log p(y_i | prompt, y_1 .. y_i-1)
            keep the K best candidates; a candidate ending in an end token is finished
    stop    when every beam has finished, or after max_new_tokens; best first

Greedy decoding is K = 1: it keeps the best token at each step, and can miss a sequence whose
first token is less likely but whose whole is more likely. Beam search keeps K partial
sequences alive, so it searches a little more of the tree of continuations (still not all of
it: the most likely sequence can fall out of the beam).

Two versions, the first to read, the second to use:

- `beam_search_plain`: the textbook algorithm (as in Jurafsky & Martin, "Speech and Language
  Processing", 3rd ed. draft, the beam search of the machine translation chapter): one prompt,
  the whole sequence recomputed at each step, a finished hypothesis narrows the beam by one.
  It also returns the beam tree (each kept candidate's parent, token and score) to draw.
- `beam_search`: batched, one key/value cache for all B x K beams, and equal to Hugging Face's
  `generate(num_beams=K, do_sample=False)` of transformers 5.23 token for token, its
  `sequences_scores` bit for bit (its docstring lists what it adds to the plain version).

Shape legend: B batch, K beams, W candidates kept per step, T prompt length (padded),
N new tokens, V vocab, S source length, C model width.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.config import is_int, is_number
from tfbook.generate.search import (
    as_end_ids,
    as_prompt_ids,
    check_model,
    check_request,
    model_vocab_size,
    next_logits,
    positions_from_mask,
    prompt_batch,
)

# The score Hugging Face gives a candidate that must not be chosen (a placeholder beam, a
# finished one among the running beams, ...): far below any real sum of log-probabilities,
# but finite, so sums stay comparable. Kept as the same number, so ties break the same way.
EXCLUDED = -1.0e9


# ----------------------------------------------------------------------------- the plain one


@dataclass
class Hypothesis:
    """One continuation found by `beam_search_plain`."""

    tokens: list[int]  # the new tokens (the end token included when finished)
    score: float  # sum of their log-probabilities (natural log)
    finished: bool  # True if it ended with an end token


@dataclass
class TreeNode:
    """One candidate kept at one step: an edge of the beam tree."""

    parent: int  # index of the beam it extends in the previous step's kept list (-1: prompt)
    token: int  # the token it appends
    score: float  # the sum of log-probabilities of the whole continuation so far
    finished: bool  # True if `token` is an end token (a leaf: it is not extended)


@dataclass
class PlainBeamResult:
    """What `beam_search_plain` returns."""

    hypotheses: list[Hypothesis]  # finished and unfinished, best score first
    # tree[s] lists the candidates kept at step s; the live ones (not finished), in order,
    # are the beams step s + 1 extends, so `parent` at step s + 1 indexes them
    tree: list[list[TreeNode]] = field(default_factory=list)

    @property
    def best(self) -> Hypothesis:
        """The hypothesis with the highest score."""
        return self.hypotheses[0]


def _check_num_beams(num_beams: int) -> None:
    if not is_int(num_beams):
        raise TypeError(f"num_beams must be an int >= 1, got {num_beams!r} "
                        f"of type {type(num_beams).__name__}")
    if num_beams < 1:
        raise ValueError(f"num_beams must be an int >= 1, got {num_beams!r}")


@torch.no_grad()
def beam_search_plain(
    model: nn.Module,
    prompt_ids: Sequence[int] | Tensor,
    num_beams: int,
    max_new_tokens: int,
    end_ids: int | Sequence[int] = (),
    memory: Tensor | None = None,
) -> PlainBeamResult:
    """Textbook beam search for one prompt: keep the `num_beams` best sums of log-probabilities.

    At each step every live beam is extended by every token; the best `width` candidates are
    kept, where width = num_beams minus the hypotheses already finished. A candidate ending in
    one of `end_ids` is finished (set aside), the others are the next step's beams. No length
    normalisation: scores are plain sums, so a longer sequence only ever loses score.
    `memory` (1, S, C) makes `model` the decoder of an encoder-decoder.
    """
    _check_num_beams(num_beams)
    check_model(model, memory, False, "beam_search_plain")
    if isinstance(prompt_ids, Tensor) and prompt_ids.dim() != 1:
        raise ValueError(f"prompt_ids must be one prompt, ids of shape (T,), got shape "
                         f"{tuple(prompt_ids.shape)}")
    prompt = as_prompt_ids(prompt_ids, 0)  # a string or float ids are refused, never rounded
    if not prompt:
        raise ValueError("the prompt must hold at least one token, got an empty prompt")
    V = model_vocab_size(model)
    if not all(0 <= t < V for t in prompt):
        raise ValueError(f"token ids must lie in [0, V={V}), got {prompt}")
    if memory is not None and (memory.dim() != 3 or memory.size(0) != 1):
        raise ValueError(f"memory must be one source, shape (1, S, C), got "
                         f"{tuple(memory.shape)}")
    end_ids = as_end_ids(end_ids)
    check_request(len(prompt), max_new_tokens, model.config.max_len, end_ids,
                  model_vocab_size(model))
    device = next(model.parameters()).device
    live = [Hypothesis(tokens=[], score=0.0, finished=False)]
    finished: list[Hypothesis] = []
    tree: list[list[TreeNode]] = []
    for _ in range(max_new_tokens):
        width = num_beams - len(finished)  # each finished hypothesis narrows the beam
        if width == 0 or not live:
            break
        ids = torch.tensor([prompt + h.tokens for h in live], device=device)  # (n, T + s)
        n, L = ids.size()
        positions = torch.arange(L, device=device).expand(n, L)  # (n, T + s)
        mask = torch.ones_like(ids, dtype=torch.bool)  # no padding: one prompt
        source = None if memory is None else memory.expand(n, -1, -1)  # (n, S, C)
        log_probs = F.log_softmax(
            next_logits(model, ids, positions, mask, None, source).double(), dim=-1
        )  # (n, V)
        V = log_probs.size(-1)
        scores = torch.tensor([h.score for h in live], dtype=torch.float64, device=device)
        totals = (scores[:, None] + log_probs).flatten()  # (n * V,): score of beam + token
        # the best `width` candidates; the stable sort keeps the lower index first among ties,
        # so with K = 1 this picks the token greedy's argmax picks
        best = torch.sort(totals, descending=True, stable=True).indices[:width]
        step: list[TreeNode] = []
        next_live: list[Hypothesis] = []
        for index in best.tolist():
            parent, token = divmod(index, V)
            is_end = token in end_ids
            hyp = Hypothesis(live[parent].tokens + [token], float(totals[index]), is_end)
            (finished if is_end else next_live).append(hyp)
            step.append(TreeNode(parent, token, hyp.score, is_end))
        tree.append(step)
        live = next_live
    hypotheses = sorted(finished + live, key=lambda h: h.score, reverse=True)
    return PlainBeamResult(hypotheses=hypotheses, tree=tree)


# --------------------------------------------------------------- the one equal to HF's generate


@dataclass
class BeamResult:
    """What `beam_search` returns: R sequences per prompt, best first."""

    sequences: Tensor  # (B * R, T + N'): prompt, continuation, then padding (N' <= N)
    scores: Tensor  # (B * R,): sum of log-probabilities / (generated length ** length_penalty)
    lengths: Tensor  # (B * R,): tokens each sequence generated (its end token included)
    prompt_length: int  # T, the column where the new tokens start

    @property
    def new_tokens(self) -> Tensor:
        """(B * R, N'): only what was generated (shorter sequences end in padding)."""
        return self.sequences[:, self.prompt_length :]


def _check_length_penalty(length_penalty: float) -> float:
    if not is_number(length_penalty):
        raise TypeError(f"length_penalty must be a finite number, got {length_penalty!r} "
                        f"of type {type(length_penalty).__name__}")
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    return float(length_penalty)


def _check_early_stopping(early_stopping: bool | str) -> None:
    if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")


def _take(x: Tensor, index: Tensor) -> Tensor:
    """Rows `index` (B, K') of each prompt's beams: x (B, W, ...) -> (B, K', ...)."""
    return torch.take_along_dim(x, index.view(*index.shape, *[1] * (x.dim() - 2)), dim=1)


@torch.no_grad()
def beam_search(
    model: nn.Module,
    prompts: Tensor | Sequence[Sequence[int]],
    num_beams: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int | None = None,
    end_ids: int | Sequence[int] = (),
    pad_id: int = 0,
    attention_mask: Tensor | None = None,
    memory: Tensor | None = None,
    memory_mask: Tensor | None = None,
    use_cache: bool = True,
) -> BeamResult:
    """Batched beam search, equal to HF's `generate(num_beams=K, do_sample=False)`.

    prompts: ids (B, T) (with `attention_mask` if left-padded) or lists of ids of any lengths.
    Returns the `num_return_sequences` (default K) best finished sequences of each prompt.
    `memory` (B, S, C) and `memory_mask` (B, S) make `model` the decoder of an encoder-decoder.
    What it adds to `beam_search_plain`, each rule as transformers 5.23 has it:

    1. The beam never narrows. Each step keeps the W = (1 + number of end ids) x K best
       candidates (at least 2K), so that K of them are still running even if K end here.
       The K best candidates that did not end are the next beams; a candidate that ends
       becomes a finished hypothesis only if it is among the K best, the rest are dropped.
    2. Length normalisation: a finished hypothesis of n new tokens (its end token included)
       scores sum log p / n ** length_penalty. 0 gives the plain sum, which favours short
       sequences (each token adds a negative number); 1 (the default) is the mean log-prob;
       above 1 favours longer ones. Only the K best finished hypotheses are kept.
    3. At max_new_tokens the K best running candidates are finished (normalised) too, and
       only finished hypotheses are returned.
    4. When to stop (each prompt separately; the loop ends when all have stopped):
       early_stopping=True   as soon as K hypotheses have finished;
       False                 when the best running beam, normalised at its current length,
                             cannot beat the worst of K finished: safe for length_penalty
                             <= 0 (a beam's score only falls), a guess above 0 (a longer
                             beam is divided by more);
       "never"               the same test at the most favourable length (max_new_tokens
                             when length_penalty > 0): it never stops while a running beam
                             could still win.
    5. The start: K copies of the prompt, all but the first scored EXCLUDED (-1e9), so the
       first step expands one beam (with fewer than W tokens in the vocabulary the copies'
       candidates fill the rest, as in HF).
    6. Sequences shorter than the longest returned are padded with `pad_id`, but with
       end_ids[0] when pad_id is 0: HF writes `pad_token_id or eos_token_id[0]`, and Python's
       `or` takes the id 0 for "missing".

    The prompt runs once per beam (B x K rows), as HF runs it. Running it once per prompt and
    copying the cache K times would be K times cheaper and equal in exact arithmetic, but not
    bit for bit: a matrix product's last bits depend on how many rows it has (measured, 2e-6
    on the tests' model). After each step the cache follows the beams (`KVCache.reorder`),
    unless every beam extended itself. Where the time goes (SmolLM2, K = 4, 64 tokens after 16):
    about 96% in the model's forward passes, which are the same work as HF's; the cache
    reordering about 2.5%; log_softmax, top-k and the bookkeeping about 1.5%.
    HF's own generate switches to greedy search at num_beams=1; here K = 1 keeps a second
    candidate in case the first ends, so K = 1 equals greedy only until an end token is met.
    Bit-equal scores need bit-equal logits: tfbook_from_hf_llama's model and HF's "sdpa"
    give them, except that on a left-padded batch HF's sdpa packs grouped query heads for a
    one-token query (`pack_gqa`), which rounds differently (TRANSFORMERS_SDPA_FORCE_GQA=1
    makes HF compute as tfbook does; see tests/test_beam.py).
    """
    _check_num_beams(num_beams)
    K = int(num_beams)
    R = K if num_return_sequences is None else num_return_sequences
    if not is_int(R) or not 1 <= R <= K:
        raise ValueError(f"num_return_sequences must be an int in [1, num_beams={K}], got {R!r}")
    length_penalty = _check_length_penalty(length_penalty)
    _check_early_stopping(early_stopping)
    if not is_int(pad_id):
        raise TypeError(f"pad_id must be an int, got {pad_id!r}")
    check_model(model, memory, use_cache, "beam_search")
    V = model_vocab_size(model)
    ids, mask = prompt_batch(prompts, attention_mask, pad_id, V)
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    end_ids = as_end_ids(end_ids)
    check_request(ids.size(1), max_new_tokens, model.config.max_len, end_ids, V)
    if K > V - len(set(end_ids)):  # the first step extends one beam: V candidates
        raise ValueError(
            f"num_beams must be at most the {V - len(set(end_ids))} tokens of the vocabulary "
            f"(V={V}) that are not end tokens, so that every beam holds a real sequence from "
            f"the first step; got num_beams={K}")
    B, T = ids.size()
    N = max_new_tokens
    if memory is not None:
        if memory.dim() != 3 or memory.size(0) != B:
            raise ValueError(f"memory must have shape (B={B}, S, C), got {tuple(memory.shape)}")
        memory = memory.repeat_interleave(K, dim=0)  # (B * K, S, C): one copy per beam
        if memory_mask is not None:
            if tuple(memory_mask.shape) != (B, memory.size(1)):
                raise ValueError(f"memory_mask must have shape (B={B}, S={memory.size(1)}), "
                                 f"got {tuple(memory_mask.shape)}")
            memory_mask = memory_mask.repeat_interleave(K, dim=0)  # (B * K, S)

    W = max(2, 1 + len(end_ids)) * K  # candidates kept per step
    in_top_k = torch.arange(W, device=device) < K  # (W,): may a candidate that ends finish?
    ends_with = torch.tensor(end_ids, dtype=torch.long, device=device)
    fill = end_ids[0] if end_ids and pad_id == 0 else pad_id  # HF's padding value (rule 6)
    # running beams and finished hypotheses, each in a buffer of the final length T + N
    running = torch.full((B, K, T + N), fill, dtype=torch.long, device=device)
    running[:, :, :T] = ids[:, None]  # (B, K, T): every beam starts as the prompt
    running_scores = torch.zeros(B, K, device=device)  # sums of log-probabilities
    running_scores[:, 1:] = EXCLUDED  # only the first copy of the prompt is a real beam
    finished = running.clone()  # (B, K, T + N)
    finished_scores = torch.full((B, K), EXCLUDED, device=device)  # length-normalised
    is_finished = torch.zeros(B, K, dtype=torch.bool, device=device)  # a real hypothesis?
    lengths = torch.zeros(B, K, dtype=torch.long, device=device)  # tokens generated
    improvable = torch.ones(B, 1, dtype=torch.bool, device=device)  # may finished ones change?
    beam_rows = torch.arange(B, device=device)[:, None] * K  # (B, 1): first row of each prompt

    # The mask and positions of every column the search can reach, built once: step n reads
    # the first T + n columns (a new token is never padding, so the added columns are ones).
    mask = torch.cat([mask, mask.new_ones(B, N)], dim=1).repeat_interleave(K, dim=0)
    positions = positions_from_mask(mask)  # (B * K, T + N)
    rows = torch.arange(B * K, device=device)  # (B * K,): the cache row of each beam
    # room for exactly the positions this search can fill, not the whole context
    cache = model.new_cache(ids.size(1) + max_new_tokens) if use_cache else None
    step_ids = ids.repeat_interleave(K, dim=0)  # (B * K, T): the prefill, once per beam
    step_positions = positions[:, :T]  # (B * K, T)
    for n in range(N):  # n tokens generated so far; this step writes column T + n
        logits = next_logits(model, step_ids, step_positions, mask[:, : T + n], cache, memory,
                             memory_mask)
        log_probs = F.log_softmax(logits.float(), dim=-1)  # (B * K, V)
        V = log_probs.size(-1)
        totals = log_probs.view(B, K, V) + running_scores[:, :, None]  # (B, K, V)
        top_scores, top_index = torch.topk(totals.view(B, K * V), k=W)  # (B, W), best first
        parents = top_index // V  # (B, W): which beam each candidate extends
        tokens = top_index % V  # (B, W): with which token
        candidates = _take(running, parents)  # (B, W, T + N)
        candidates[:, :, T + n] = tokens
        ends = torch.isin(tokens, ends_with) | (n + 1 == N)  # (B, W): an end token, or no room

        # the next beams: the K best candidates that did not end
        not_ended = top_scores + ends.float() * EXCLUDED  # (B, W)
        keep = torch.topk(not_ended, k=K).indices  # (B, K)
        running = _take(candidates, keep)  # (B, K, T + N)
        running_scores = _take(not_ended, keep)  # (B, K), best first
        beam_parents = _take(parents, keep)  # (B, K)

        # the finished hypotheses: the K best of the old ones and of those that end in the top K
        new_finished = ends & in_top_k  # (B, W)
        normalised = top_scores / ((n + 1) ** length_penalty)  # (B, W)
        full = is_finished.all(dim=-1, keepdim=True) & (early_stopping is True)  # (B, 1)
        normalised += full.float() * EXCLUDED  # (in HF's order: the sums must be the same)
        normalised += (~improvable).float() * EXCLUDED
        normalised += (~new_finished) * EXCLUDED
        merged_scores = torch.cat([finished_scores, normalised], dim=1)  # (B, K + W)
        best = torch.topk(merged_scores, k=K).indices  # (B, K)
        finished = _take(torch.cat([finished, candidates], dim=1), best)  # (B, K, T + N)
        finished_scores = _take(merged_scores, best)
        is_finished = _take(torch.cat([is_finished, new_finished], dim=1), best)
        lengths = _take(torch.cat([lengths, torch.full_like(tokens, n + 1)], dim=1), best)

        # can a running beam still beat the worst finished hypothesis?
        length = N if early_stopping == "never" and length_penalty > 0 else n + 1
        best_possible = running_scores[:, :1] / (length ** length_penalty)  # (B, 1)
        worst = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values,
                            EXCLUDED)  # (B, K)
        improvable = improvable & (best_possible > worst).any(dim=-1, keepdim=True)
        all_full = bool(is_finished.all()) and early_stopping is True
        if not bool(improvable.any()) or all_full or bool(ends.all()):
            break

        if use_cache:
            # each cache row follows its beam: row i takes the keys and values of its parent.
            # When every beam extends itself (parent i for row i) there is nothing to move.
            sources = (beam_rows + beam_parents).flatten()  # (B * K,)
            if not torch.equal(sources, rows):
                cache.reorder(sources)
            step_ids = running[:, :, T + n].reshape(B * K, 1)  # (B * K, 1): the new tokens
            step_positions = positions[:, T + n : T + n + 1]  # (B * K, 1)
        else:  # everything again, for comparison
            step_ids = running[:, :, : T + n + 1].reshape(B * K, T + n + 1)
            step_positions = positions[:, : T + n + 1]

    lengths = lengths[:, :R].reshape(B * R)  # the R best of each prompt, best first
    sequences = finished[:, :R].reshape(B * R, T + N)[:, : T + int(lengths.max())]
    return BeamResult(sequences=sequences, scores=finished_scores[:, :R].reshape(B * R),
                      lengths=lengths, prompt_length=T)
