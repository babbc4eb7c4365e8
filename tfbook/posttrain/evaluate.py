"""Evaluating a language model: pass@k, multiple choice by log-likelihood, bits per byte.

pass@k (Chen et al. 2021). Draw n samples for a problem, c of them correct. The chance that at
least one of k samples drawn without replacement from those n is correct is

    pass@k = 1 - C(n - c, k) / C(n, k)

an unbiased estimator of the probability that k fresh samples contain a correct one. The naive
plug-in 1 - (1 - c/n)^k is biased low (Jensen: 1 - (1 - p)^k is concave in p). The ratio of
binomials is computed as a product so that nothing overflows:

    C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)

e.g. pass_at_k(n=4, c=1, k=2) = 1 - C(3, 2) / C(4, 2) = 1 - 3/6 = 0.5.

Log-likelihood of a continuation, as lm-evaluation-harness 0.4.13 computes it (`encode_pair`,
`score_ids`, `loglikelihoods`): the context's trailing spaces move to the continuation, the
whole text and the context are tokenized, and the continuation's tokens are scored after the
context; returned with `is_greedy` (every token the argmax). Multiple choice (`mc_requests`,
`mc_predictions`) picks the option with the largest summed log-likelihood, or divided by its
length in characters (the harness's acc_norm), bytes (acc_bytes) or tokens. Equal to the
harness's `HFLM` on SmolLM2 within a derived float32 bound (tests/test_posttrain_lm_eval.py).

Perplexity is per token and depends on the tokenizer; bits per byte does not (`score_text`).
"""

import json
import math
from collections.abc import Sequence
from importlib.resources import files
from numbers import Integral
from typing import NamedTuple

import torch
import torch.nn.functional as F

from tfbook.train.corpus_lm import bits_per_byte


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


def _per_problem(name: str, x: object, expected: str = "a list") -> list:
    """A list, tuple, 1-D NumPy array or 1-D tensor of counts -> a list (else TypeError)."""
    if isinstance(x, (list, tuple)):
        return list(x)
    if hasattr(x, "tolist") and getattr(x, "ndim", None) == 1:  # numpy array, torch tensor
        return x.tolist()
    raise TypeError(f"{name} must be {expected} (or 1-D array) of per-problem counts, "
                    f"got {type(x).__name__}")


def mean_pass_at_k(n, c, k: int) -> float:
    """pass@k averaged over problems: n and c are per-problem counts (an int n is shared)."""
    cs = _per_problem("c", c)
    if not cs:
        raise ValueError("c is empty: pass@k needs at least one problem")
    if isinstance(n, Integral) and not isinstance(n, bool):
        ns = [n] * len(cs)
    else:
        ns = _per_problem("n", n, "an int or a list")
    if len(ns) != len(cs):
        raise ValueError(f"n and c must have one entry per problem, got {len(ns)} and {len(cs)}")
    return sum(pass_at_k(ni, ci, k) for ni, ci in zip(ns, cs, strict=True)) / len(cs)


# --- log-likelihood of a continuation (lm-evaluation-harness's `loglikelihood`) -----------


class LogLikelihood(NamedTuple):
    """The score of one (context, continuation) request.

    `logprob` and `is_greedy` are what lm-evaluation-harness returns: the summed log-probability
    of the continuation's tokens, and whether every one of them is the model's argmax.
    """

    logprob: float  # sum over the continuation's tokens of log p(token | everything before it)
    is_greedy: bool  # each continuation token is the most probable one at its position
    n_tokens: int  # how many tokens the continuation was scored as


def _check_text(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _check_tokenizer(tokenizer) -> None:
    if not callable(getattr(tokenizer, "encode_ordinary", None)):
        raise TypeError(
            f"tokenizer must be a tfbook tokenizer (with encode_ordinary), got "
            f"{type(tokenizer).__name__}"
        )


def _prefix_id(tokenizer) -> int:
    """The token an empty context is replaced by: BOS, else EOS (lm_eval's `prefix_token_id`)."""
    for name in ("bos_id", "eos_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("an empty context needs a BOS or EOS token, and the tokenizer has neither")


def encode_pair(
    tokenizer, context: str, continuation: str, add_bos: bool = False
) -> tuple[list[int], list[int]]:
    """Context and continuation ids, split as lm-evaluation-harness 0.4 splits them.

    Trailing spaces of the context move to the continuation ("Answer: " + "Paris" is scored as
    "Answer:" + " Paris", the way the text would be tokenized as a whole); then the whole text
    and the context alone are encoded and the continuation is what the whole has beyond the
    context's length. An empty context becomes the BOS token (EOS if there is none) and the
    continuation is encoded alone. `add_bos` puts BOS in front of the context as a tokenizer
    with `add_special_tokens=True` and `add_bos_token=True` would.
    """
    _check_tokenizer(tokenizer)
    _check_text("context", context)
    _check_text("continuation", continuation)
    if add_bos is not True and add_bos is not False:
        raise TypeError(f"add_bos must be True or False, got {add_bos!r}")
    if not continuation:
        raise ValueError("continuation is empty: there is nothing to score")
    bos = [_prefix_id(tokenizer)] if add_bos else []
    if context == "":
        cont = tokenizer.encode_ordinary(continuation)
        prefix = _prefix_id(tokenizer)
        # lm_eval: a continuation that already starts with the prefix token uses it as context
        return ([prefix], cont) if cont[0] != prefix else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = bos + tokenizer.encode_ordinary(context + continuation)
    ctx = bos + tokenizer.encode_ordinary(context)
    return ctx, whole[len(ctx) :]


def _context_length(model) -> int:
    """The most positions `model` sees: a tfbook GPT's config.max_len (an HF model's
    config.max_position_embeddings)."""
    config = getattr(model, "config", None)
    for name in ("max_len", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise TypeError(
        f"model must be a causal LM with a config giving its context length (a tfbook GPT), "
        f"got {type(model).__name__}"
    )


@torch.no_grad()
def score_ids(
    model, pairs: Sequence[tuple[list[int], list[int]]], batch_size: int = 16
) -> list[LogLikelihood]:
    """Log-likelihood of each continuation given its context, both given as ids.

    Each request runs as one row context + continuation[:-1] (right-padded in a batch; a
    causal model's earlier positions never see the padding); the log-softmax at the last
    len(continuation) positions scores the continuation's tokens. A request longer than the
    model's max_len + 1 loses context tokens from the left, as in lm-evaluation-harness.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    max_len = _context_length(model)
    vocab_size = model.config.vocab_size
    rows = []
    for k, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"request {k} must be a (context ids, continuation ids) pair")
        ctx, cont = (list(p) for p in pair)
        if not ctx or not cont:
            raise ValueError(
                f"request {k} has {len(ctx)} context and {len(cont)} continuation tokens: "
                f"both must be non-empty"
            )
        bad = [
            t
            for t in ctx + cont
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size
        ]
        if bad:
            raise ValueError(f"request {k}: ids must be ints in [0, {vocab_size}), got {bad[0]!r}")
        if len(cont) > max_len:
            raise ValueError(
                f"request {k}: a continuation of {len(cont)} tokens does not fit the model's "
                f"context of {max_len}"
            )
        rows.append(((ctx + cont)[-(max_len + 1) :][:-1], cont))
    results: list[LogLikelihood] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        T = max(len(inp) for inp, _ in chunk)
        batch = torch.zeros(len(chunk), T, dtype=torch.long)  # right padding with id 0
        for i, (inp, _) in enumerate(chunk):
            batch[i, : len(inp)] = torch.tensor(inp)
        logits = model(batch).logits  # (B, T, V)
        for i, (inp, cont) in enumerate(chunk):
            n, m = len(inp), len(cont)
            log_probs = F.log_softmax(logits[i, n - m : n].float(), dim=-1)  # (m, V)
            target = torch.tensor(cont)
            greedy = bool((log_probs.argmax(dim=-1) == target).all())
            logprob = float(log_probs.gather(-1, target[:, None]).sum())
            results.append(LogLikelihood(logprob, greedy, m))
    return results


def loglikelihoods(
    model,
    tokenizer,
    requests: Sequence[tuple[str, str]],
    add_bos: bool = False,
    batch_size: int = 16,
) -> list[LogLikelihood]:
    """log p(continuation | context) of each (context, continuation) request, lm_eval's way.

    The split is `encode_pair`'s, the scoring `score_ids`'s: equal to lm-evaluation-harness
    0.4.13's `HFLM.loglikelihood` (its (logprob, is_greedy)) on the same model and tokenizer.
    """
    if not isinstance(requests, (list, tuple)):
        raise TypeError(
            f"requests must be a list of (context, continuation) pairs of str, got "
            f"{type(requests).__name__}"
        )
    pairs = []
    for k, request in enumerate(requests):
        if not (isinstance(request, (tuple, list)) and len(request) == 2):
            raise TypeError(f"request {k} must be a (context, continuation) pair, got {request!r}")
        pairs.append(encode_pair(tokenizer, request[0], request[1], add_bos))
    return score_ids(model, pairs, batch_size)


# --- multiple choice by log-likelihood ---------------------------------------------------

# How the options' log-likelihoods are compared (lm_eval's multiple_choice metrics):
#   "sum":   the summed log-probability itself                    (lm_eval's acc)
#   "chars": divided by the option's length in characters          (lm_eval's acc_norm)
#   "bytes": divided by the option's length in UTF-8 bytes         (lm_eval's acc_bytes)
#   "tokens": divided by the option's number of tokens (a per-token mean; not in lm_eval)
NORMALISATIONS = ("sum", "chars", "bytes", "tokens")
MC_QUESTIONS = "mc_questions.json"  # in tfbook/posttrain/data/, shipped with the package


class Question(NamedTuple):
    """One multiple-choice question: the options and the index of the right one."""

    question: str
    choices: tuple[str, ...]
    answer: int
    topic: str = ""


def load_mc_questions() -> list[Question]:
    """The book's own multiple-choice set (tfbook/posttrain/data/mc_questions.json)."""
    data = json.loads(files("tfbook.posttrain").joinpath("data", MC_QUESTIONS).read_text("utf-8"))
    return [
        Question(q["question"], tuple(q["choices"]), q["answer"], q.get("topic", ""))
        for q in data["questions"]
    ]


def _check_question(k: int, q) -> None:
    if not isinstance(q, Question):
        raise TypeError(f"question {k} must be a Question, got {type(q).__name__}")
    if len(q.choices) < 2 or not all(isinstance(c, str) and c for c in q.choices):
        raise ValueError(f"question {k} needs at least 2 non-empty str choices, got {q.choices!r}")
    if isinstance(q.answer, bool) or not isinstance(q.answer, int):
        raise TypeError(f"question {k}: answer must be an int index, got {q.answer!r}")
    if not 0 <= q.answer < len(q.choices):
        raise ValueError(
            f"question {k}: answer {q.answer} is not an index of its {len(q.choices)} choices"
        )


# How a question is put to the model:
#   "cloze":   "Question: ...\nAnswer:" and each option's own text as the continuation
#              (lm_eval's ARC and HellaSwag style): options of different lengths compete
#   "letters": the options listed as "A. ...", "B. ..." after the question, then "Answer:",
#              and the continuations " A", " B", ... (lm_eval's layout for MMLU, here with the
#              cloze layout's "Question: " opening): one token each
STYLES = ("cloze", "letters")
LETTERS = "ABCDEFGHIJ"


def _check_questions(questions, style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if not isinstance(questions, (list, tuple)) or not questions:
        raise ValueError("questions must be a non-empty list of Question")
    for k, q in enumerate(questions):
        _check_question(k, q)
        if style == "letters" and len(q.choices) > len(LETTERS):
            raise ValueError(
                f"question {k} has {len(q.choices)} choices: at most {len(LETTERS)} can be lettered"
            )


def mc_prompt(question: Question, style: str = "cloze") -> str:
    """The context every option of `question` is scored after (see STYLES).

    >>> print(mc_prompt(Question("2 + 2?", ("4", "5"), 0), "letters"))
    Question: 2 + 2?
    A. 4
    B. 5
    Answer:
    """
    _check_questions([question], style)
    if style == "cloze":
        return f"Question: {question.question}\nAnswer:"
    listed = "".join(f"{LETTERS[i]}. {c}\n" for i, c in enumerate(question.choices))
    return f"Question: {question.question}\n{listed}Answer:"


def mc_options(question: Question, style: str = "cloze") -> tuple[str, ...]:
    """The texts the options are scored as: the choices (cloze) or "A", "B", ... (letters)."""
    _check_questions([question], style)
    return question.choices if style == "cloze" else tuple(LETTERS[: len(question.choices)])


def mc_requests(questions: Sequence[Question], style: str = "cloze") -> list[tuple[str, str]]:
    """(context, " " + option) for each option of each question, in order (lm_eval's
    multiple_choice with its default target delimiter, a space)."""
    _check_questions(questions, style)
    return [(mc_prompt(q, style), " " + o) for q in questions for o in mc_options(q, style)]


def mc_predictions(
    questions: Sequence[Question],
    scores: Sequence[LogLikelihood],
    normalisation: str = "sum",
    style: str = "cloze",
) -> list[int]:
    """The option each question picks: the argmax of its options' (normalised) log-likelihoods.

    `scores` are `loglikelihoods(..., mc_requests(questions, style))`, one per option in
    order. The lengths that "chars" and "bytes" divide by are the option's text without the
    space in front (as lm_eval's acc_norm and acc_bytes); ties go to the first option (as
    numpy's argmax does).
    """
    _check_questions(questions, style)
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    n_options = sum(len(q.choices) for q in questions)
    if len(scores) != n_options:
        raise ValueError(
            f"expected one score per option ({n_options} for {len(questions)} questions), "
            f"got {len(scores)}"
        )
    predictions, k = [], 0
    for q in questions:
        values = []
        options = mc_options(q, style)
        for option, s in zip(options, scores[k : k + len(options)], strict=True):
            if not isinstance(s, LogLikelihood):
                raise TypeError(f"scores must be LogLikelihood, got {type(s).__name__}")
            length = {
                "sum": 1,
                "chars": len(option),
                "bytes": len(option.encode("utf-8")),
                "tokens": s.n_tokens,
            }[normalisation]
            values.append(s.logprob / length)
        predictions.append(max(range(len(values)), key=values.__getitem__))  # first max
        k += len(options)
    return predictions


def mc_accuracy(
    questions: Sequence[Question],
    scores: Sequence[LogLikelihood],
    normalisation: str = "sum",
    style: str = "cloze",
) -> float:
    """Fraction of questions whose picked option (`mc_predictions`) is the right one."""
    predictions = mc_predictions(questions, scores, normalisation, style)
    return sum(p == q.answer for p, q in zip(predictions, questions, strict=True)) / len(questions)


# --- perplexity and bits per byte ---------------------------------------------------------


class TextScore(NamedTuple):
    """How well a model predicts one text under one segmentation into tokens."""

    nats_per_token: float  # mean -log p(token | the tokens before it)
    perplexity: float  # exp(nats_per_token): per TOKEN, so it depends on the tokenizer
    bits_per_byte: float  # total bits / UTF-8 bytes of the text: comparable across tokenizers
    n_tokens: int
    n_bytes: int


@torch.no_grad()
def score_text(model, ids: Sequence[int], text: str, prefix_id: int) -> TextScore:
    """Perplexity and bits per byte of `text`, segmented as `ids`, under `model`.

    Every token of the text is predicted, the first one from `prefix_id` alone (BOS): the
    total -log p is the code length of the whole text, which is what bits per byte divides by
    the text's bytes (tfbook.train.corpus_lm.bits_per_byte).
    """
    _check_text("text", text)
    ids = list(ids)
    if not ids:
        raise ValueError("ids is empty: a text of no tokens has no perplexity")
    max_len = _context_length(model)
    if len(ids) > max_len:
        raise ValueError(f"{len(ids)} tokens do not fit the model's context of {max_len}")
    (s,) = score_ids(model, [([prefix_id], ids)], batch_size=1)
    nats = -s.logprob / len(ids)
    n_bytes = len(text.encode("utf-8"))
    return TextScore(
        nats, math.exp(nats), bits_per_byte(nats, len(ids), n_bytes), len(ids), n_bytes
    )
