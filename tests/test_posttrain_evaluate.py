"""tfbook.posttrain.evaluate: pass@k against brute force, bad input."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

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
    # counts as a sampler returns them: a NumPy array or a tensor
    assert mean_pass_at_k(np.array([4, 2]), torch.tensor([1, 1]), 2) == pytest.approx(0.75)


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
    with pytest.raises(TypeError, match="c must be a list"):
        mean_pass_at_k(4, np.array([[1, 2]]), 2)
    with pytest.raises(TypeError, match="n must be an int or a list"):
        mean_pass_at_k(4.0, [1], 2)
    with pytest.raises(ValueError, match="one entry per problem"):
        mean_pass_at_k([4, 4], [1], 2)
    with pytest.raises(ValueError, match="k must be <= n"):
        mean_pass_at_k([4, 1], [1, 1], 2)


# --- log-likelihoods, multiple choice, bits per byte -----------------------------------------

import dataclasses  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer  # noqa: E402
from tfbook.models.gpt import GPT, GPTConfig  # noqa: E402
from tfbook.posttrain.evaluate import (  # noqa: E402
    NORMALISATIONS,
    LogLikelihood,
    Question,
    encode_pair,
    load_mc_questions,
    loglikelihoods,
    mc_accuracy,
    mc_options,
    mc_predictions,
    mc_prompt,
    mc_requests,
    score_ids,
    score_text,
)
from tfbook.train.corpus_lm import bits_per_byte  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return load_smollm2_tokenizer()


@pytest.fixture(scope="module")
def gpt(tok):
    torch.manual_seed(0)
    config = dataclasses.replace(GPTConfig.tiny(), vocab_size=tok.vocab_size, max_len=16)
    return GPT(config).eval()


def test_encode_pair_moves_trailing_spaces_and_splits_the_whole(tok):
    ctx, cont = encode_pair(tok, "Question: 2 + 2?\nAnswer: ", "four")
    assert (ctx, cont) == encode_pair(tok, "Question: 2 + 2?\nAnswer:", " four")
    assert ctx == tok.encode_ordinary("Question: 2 + 2?\nAnswer:")
    assert ctx + cont == tok.encode_ordinary("Question: 2 + 2?\nAnswer: four")
    assert tok.decode(cont) == " four"
    bos_ctx, bos_cont = encode_pair(tok, "Answer:", " four", add_bos=True)
    assert bos_ctx == [tok.bos_id, *tok.encode_ordinary("Answer:")] and bos_cont == cont
    # an empty context: the BOS token stands in for it
    assert encode_pair(tok, "", "four") == ([tok.bos_id], tok.encode_ordinary("four"))


def test_encode_pair_keeps_the_context_ids_when_the_whole_merges_across(tok):
    # "hello" + "world" tokenises as a whole differently from its parts: lm_eval keeps the
    # context's own ids and takes what the whole has beyond their count
    ctx, cont = encode_pair(tok, "hel", "lo")
    whole = tok.encode_ordinary("hello")
    assert ctx == tok.encode_ordinary("hel") and cont == whole[len(ctx) :]


def test_score_ids_equals_one_row_at_a_time(gpt):
    torch.manual_seed(1)
    V = gpt.config.vocab_size
    pairs = [
        (torch.randint(0, V, (n,)).tolist(), torch.randint(0, V, (m,)).tolist())
        for n, m in [(1, 1), (5, 3), (2, 7), (9, 1)]
    ]
    got = score_ids(gpt, pairs, batch_size=3)  # two batches, right-padded
    for (ctx, cont), s in zip(pairs, got, strict=True):
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = F.log_softmax(gpt(ids).logits[0].double(), -1)  # (T, V)
        want = sum(float(logp[len(ctx) + j - 1, t]) for j, t in enumerate(cont))
        greedy = all(int(logp[len(ctx) + j - 1].argmax()) == t for j, t in enumerate(cont))
        assert s.logprob == pytest.approx(want, abs=1e-4 * len(cont))
        assert s.is_greedy == greedy and s.n_tokens == len(cont)


def test_score_ids_is_greedy_on_the_models_own_continuation(gpt):
    ids = [5, 6, 7]
    with torch.no_grad():
        for _ in range(3):
            ids.append(int(gpt(torch.tensor([ids])).logits[0, -1].argmax()))
    (s,) = score_ids(gpt, [(ids[:3], ids[3:])])
    assert s.is_greedy and s.logprob < 0
    (t,) = score_ids(gpt, [(ids[:3], ids[3:5] + [(ids[5] + 1) % gpt.config.vocab_size])])
    assert not t.is_greedy and t.logprob < s.logprob


def test_score_ids_truncates_the_context_from_the_left(gpt):
    # max_len 16: a 20 + 3 token request keeps its last 17 tokens (16 inputs)
    ctx, cont = list(range(100, 120)), [7, 8, 9]
    (long,) = score_ids(gpt, [(ctx, cont)])
    (cut,) = score_ids(gpt, [(ctx[-14:], cont)])
    assert long.logprob == pytest.approx(cut.logprob, abs=1e-5)


def hand_scores(values_and_tokens):
    return [LogLikelihood(v, False, n) for v, n in values_and_tokens]


def test_mc_predictions_by_normalisation():
    q = Question("?", ("a", "bbbbbbbbbb", "éé"), 1)  # 1, 10 characters; "éé" is 4 bytes
    scores = hand_scores([(-3.0, 1), (-10.0, 2), (-3.5, 4)])
    assert mc_predictions([q], scores, "sum") == [0]  # -3 is the largest sum
    assert mc_predictions([q], scores, "chars") == [1]  # -1 per character beats -1.75, -3
    # per byte: -3/1, -10/10, -3.5/4 -> the 4-byte option (-0.875) wins
    assert mc_predictions([q], scores, "bytes") == [2]
    assert mc_predictions([q], scores, "tokens") == [2]  # -3, -5, -0.875 per token
    assert mc_accuracy([q], scores, "chars") == 1.0 and mc_accuracy([q], scores, "sum") == 0.0
    tie = hand_scores([(-2.0, 1), (-2.0, 1), (-5.0, 1)])
    assert mc_predictions([q], tie, "sum") == [0]  # ties go to the first, as numpy's argmax


def test_mc_requests_and_the_books_set():
    questions = load_mc_questions()
    assert len(questions) >= 30 and all(len(q.choices) == 4 for q in questions)
    answers = [q.answer for q in questions]
    assert all(answers.count(i) == len(questions) // 4 for i in range(4))  # balanced positions
    lengths = [sorted(len(c) for c in q.choices) for q in questions]
    assert sum(hi >= 2 * lo for lo, *_, hi in lengths) >= len(questions) // 2  # lengths differ
    correct_longest = sum(len(q.choices[q.answer]) == max(map(len, q.choices)) for q in questions)
    assert 0 < correct_longest < len(questions)
    requests = mc_requests(questions[:2])
    assert requests[0] == (mc_prompt(questions[0]), " " + questions[0].choices[0])
    assert len(requests) == 8 and mc_prompt(questions[0]).endswith("\nAnswer:")


def test_letters_style():
    q = Question("Which is even?", ("three", "four", "five"), 1)
    assert (
        mc_prompt(q, "letters") == "Question: Which is even?\nA. three\nB. four\nC. five\nAnswer:"
    )
    assert mc_options(q, "letters") == ("A", "B", "C") and mc_options(q) == q.choices
    assert mc_requests([q], "letters")[1] == (mc_prompt(q, "letters"), " B")
    scores = hand_scores([(-3.0, 1), (-1.0, 1), (-2.0, 1)])
    for normalisation in NORMALISATIONS:  # one letter, one token each: all agree
        assert mc_predictions([q], scores, normalisation, "letters") == [1]
    with pytest.raises(ValueError, match="style must be one of"):
        mc_prompt(q, "mmlu")
    with pytest.raises(ValueError, match="at most 10 can be lettered"):
        mc_requests([Question("?", tuple("abcdefghijk"), 0)], "letters")


def test_score_text_perplexity_and_bits_per_byte(gpt, tok):
    text = "The cat sat."
    ids = tok.encode_ordinary(text)
    s = score_text(gpt, ids, text, prefix_id=tok.bos_id)
    (ll,) = score_ids(gpt, [([tok.bos_id], ids)])
    assert s.n_tokens == len(ids) and s.n_bytes == len(text.encode())
    assert s.nats_per_token == pytest.approx(-ll.logprob / len(ids))
    assert s.perplexity == pytest.approx(math.exp(s.nats_per_token))
    assert s.bits_per_byte == bits_per_byte(s.nats_per_token, len(ids), s.n_bytes)
    byte_ids = [tok.byte_ids[b] for b in text.encode()]  # the same text, one token per byte
    b = score_text(gpt, byte_ids, text, prefix_id=tok.bos_id)
    assert b.n_tokens == b.n_bytes > s.n_tokens


def test_bad_input_of_the_scoring_functions(gpt, tok):
    with pytest.raises(ValueError, match="continuation is empty"):
        encode_pair(tok, "a", "")
    with pytest.raises(TypeError, match="context must be a str"):
        encode_pair(tok, None, "a")
    with pytest.raises(TypeError, match="tfbook tokenizer"):
        encode_pair("not a tokenizer", "a", "b")
    with pytest.raises(TypeError, match="add_bos must be True or False"):
        encode_pair(tok, "a", "b", add_bos=1)
    with pytest.raises(ValueError, match="both must be non-empty"):
        score_ids(gpt, [([], [1])])
    with pytest.raises(ValueError, match="does not fit"):
        score_ids(gpt, [([1], list(range(17)))])
    with pytest.raises(ValueError, match=r"ids must be ints in \[0, 49152\), got 49152"):
        score_ids(gpt, [([1], [49152])])
    with pytest.raises(ValueError, match="ids must be ints"):
        score_ids(gpt, [([1.5], [2])])
    with pytest.raises(ValueError, match="batch_size"):
        score_ids(gpt, [([1], [2])], batch_size=0)
    with pytest.raises(TypeError, match="config giving its context length"):
        score_ids(torch.nn.Linear(2, 2), [([1], [2])])
    with pytest.raises(TypeError, match="list of"):
        loglikelihoods(gpt, tok, "ab")
    with pytest.raises(TypeError, match="request 0 must be a"):
        loglikelihoods(gpt, tok, ["ab"])
    q = Question("?", ("a", "b"), 0)
    with pytest.raises(ValueError, match="normalisation must be one of"):
        mc_predictions([q], hand_scores([(-1, 1), (-2, 1)]), "mean")
    with pytest.raises(TypeError, match="scores must be LogLikelihood"):
        mc_predictions([q], [(-1.0, False), (-2.0, False)], "sum")
    with pytest.raises(ValueError, match="one score per option"):
        mc_predictions([q], hand_scores([(-1, 1)]), "sum")
    with pytest.raises(ValueError, match="not an index"):
        mc_requests([Question("?", ("a", "b"), 2)])
    with pytest.raises(ValueError, match="at least 2 non-empty"):
        mc_requests([Question("?", ("a",), 0)])
    with pytest.raises(ValueError, match="non-empty list"):
        mc_requests([])
    with pytest.raises(ValueError, match="ids is empty"):
        score_text(gpt, [], "", prefix_id=0)
    assert NORMALISATIONS == ("sum", "chars", "bytes", "tokens")
