"""WordPiece: the likelihood gain computed two ways, the trainer's choice, greedy longest
match, BERT pre-processing, save/load and errors."""

import itertools
import json
import math
import unicodedata
from collections import Counter

import numpy as np
import pytest

from tfbook.corpus import stdlib_corpus
from tfbook.tokenizers import WordPieceTokenizer, bert_pretokenize
from tfbook.tokenizers.pretokenize import bert_normalize
from tfbook.tokenizers.wordpiece import likelihood_gain, log_likelihood, occurrence_gain

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def tok() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(stdlib_corpus(60_000), 600)


def merged_counts(words: Counter, pair: tuple[str, str]) -> Counter:
    """Token counts after merging `pair` in every word (words given as tuples of tokens)."""
    out: Counter = Counter()
    for pieces, f in words.items():
        i = 0
        while i < len(pieces):
            if pieces[i : i + 2] == pair:
                out[pair[0] + pair[1].removeprefix("##")] += f
                i += 2
            else:
                out[pieces[i]] += f
                i += 1
    return out


def spelled_words(text: str) -> Counter:
    words = Counter(bert_pretokenize(text))
    return Counter({(w[0], *("##" + c for c in w[1:])): f for w, f in words.items()})


def test_log_likelihood_is_sum_of_log_probabilities():
    counts = {"a": 3, "b": 1}
    assert log_likelihood(counts) == pytest.approx(3 * math.log(3 / 4) + math.log(1 / 4))


@pytest.mark.parametrize("pair", [("t", "##h"), ("##e", "##r"), ("##s", "##s")])
def test_likelihood_gain_formula_equals_log_likelihood_difference(pair):
    words = spelled_words(stdlib_corpus(20_000))
    before: Counter = Counter()
    for pieces, f in words.items():
        for p in pieces:
            before[p] += f
    after = merged_counts(words, pair)
    merged = pair[0] + pair[1].removeprefix("##")
    n_ab = after[merged] - before[merged]  # merges actually made
    gain = likelihood_gain(n_ab, before[pair[0]], before[pair[1]], sum(before.values()),
                           same=pair[0] == pair[1])
    assert n_ab > 0
    assert float(gain) == pytest.approx(log_likelihood(after) - log_likelihood(before), rel=1e-9)


def test_likelihood_gain_on_random_counts():
    rng = np.random.default_rng(0)
    for _ in range(100):
        n_a, n_b, rest = rng.integers(1, 1000, size=3)
        n_ab = rng.integers(1, min(n_a, n_b) + 1)
        before = {"a": n_a, "b": n_b, "rest": rest}
        after = {"a": n_a - n_ab, "b": n_b - n_ab, "c": n_ab, "rest": rest}
        total = n_a + n_b + rest
        assert float(likelihood_gain(n_ab, n_a, n_b, total)) == pytest.approx(
            log_likelihood(after) - log_likelihood(before), rel=1e-9, abs=1e-9)


def test_seed_occurrence_sum_is_the_first_order_gain():
    n_a, n_b, total = 50_000, 80_000, 10_000_000
    for n_ab in (1, 10, 100):
        exact = float(likelihood_gain(n_ab, n_a, n_b, total))
        assert exact == pytest.approx(float(occurrence_gain(n_ab, n_a, n_b, total)) - n_ab,
                                      rel=1e-2)


def test_first_merge_is_the_best_by_brute_force():
    text = stdlib_corpus(5_000)
    words = spelled_words(text)
    before: Counter = Counter()
    for pieces, f in words.items():
        before.update({p: f * n for p, n in Counter(pieces).items()})
    candidates = {pieces[i : i + 2] for pieces in words for i in range(len(pieces) - 1)}
    gains = {p: log_likelihood(merged_counts(words, p)) - log_likelihood(before)
             for p in candidates}
    best = max(gains.values())
    tok = WordPieceTokenizer.train(text, len(SPECIALS) + len(before) + 1)
    first = tok.vocab[-1]
    winners = {a + b.removeprefix("##") for (a, b), g in gains.items() if g > best - 1e-6}
    assert first in winners


def test_greedy_longest_match_with_continuations():
    vocab = [*SPECIALS, "un", "##aff", "##able", "##a", "##ff", "u", "##n"]
    tok = WordPieceTokenizer(vocab)
    ids = tok.encode("unaffable unable")
    assert [tok.id_to_token(i) for i in ids] == ["un", "##aff", "##able", "un", "##able"]
    assert tok.decode(ids) == "unaffable unable"
    assert tok.encode("unx") == [tok.unk_id]  # one unmatchable part -> the whole word
    assert tok.encode("un" * 51) == [tok.unk_id]  # 102 characters > 100


def test_bert_pretokenize_examples():
    assert bert_pretokenize("Héllo,\tWORLD!  Çà\u200b va?") == [
        "hello", ",", "world", "!", "ca", "va", "?"]
    # CJK ideographs are split one by one; kana are not, and lose their voicing marks
    # (NFD turns "で" into "て" + a combining mark, which accent stripping drops).
    assert bert_pretokenize("東京です") == ["東", "京", "てす"]
    assert bert_pretokenize("a$b") == ["a", "$", "b"]  # ASCII symbols count as punctuation


def test_trained_tokenizer(tok):
    assert tok.vocab_size == 600 and tok.vocab[:5] == SPECIALS
    assert len(set(tok.vocab)) == 600
    text = stdlib_corpus(3_000).lower()
    ids = tok.encode(text)
    assert tok.unk_id not in ids
    assert tok.decode(ids).split() == [w for w in bert_pretokenize(text)]


def test_training_is_deterministic(tok):
    again = WordPieceTokenizer.train(stdlib_corpus(60_000), 600)
    assert again.vocab == tok.vocab


def test_save_load_round_trip(tok, tmp_path):
    path = tmp_path / "wp.json"
    tok.save(path)
    assert json.loads(path.read_text("utf-8"))["vocab"] == tok.vocab
    loaded = WordPieceTokenizer.load(path)
    text = stdlib_corpus(5_000)
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.special_tokens == tok.special_tokens


def test_special_tokens_only_when_allowed(tok):
    with pytest.raises(ValueError, match=r"contains the special token '\[MASK\]'"):
        tok.encode("a [MASK] b")
    assert tok.encode("a [MASK] b", allowed_special={"[MASK]"})[1] == tok.token_to_id("[MASK]")
    assert tok.token_to_id("[MASK]") not in tok.encode("a [MASK] b", disallowed_special=())
    assert tok.encode("a", add_special_tokens=True) == [2, tok.token_to_id("a"), 3]


def test_bad_inputs(tok):
    with pytest.raises(ValueError, match=r"vocab_size must be at least \d+ \(5 specials \+ \d+ "
                                         r"characters of the text\), got 10"):
        WordPieceTokenizer.train("hello world", 10)
    with pytest.raises(ValueError, match="cannot train on a text without words"):
        WordPieceTokenizer.train("   ", 100)
    with pytest.raises(TypeError, match="text must be a str, got list"):
        WordPieceTokenizer.train(["hello"], 100)
    with pytest.raises(ValueError, match="unknown token id 600 at position 0"):
        tok.decode([600])
    with pytest.raises(ValueError, match="must contain the unknown token"):
        WordPieceTokenizer(["a", "b"])


@pytest.mark.parametrize("function", [bert_normalize, bert_pretokenize])
def test_bert_functions_check_their_text(function):
    with pytest.raises(TypeError, match="text must be a str, got NoneType"):
        function(None)
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        function(b"abc")
    with pytest.raises(ValueError, match="lone surrogate U\\+D800 at position 3"):
        function("abc\ud800")


def test_bert_lowercases_each_character_alone():
    # str.lower() gives a capital sigma at the end of a word its final form (so do Google's
    # BERT and HF's slow tokenizer); HF tokenizers, lowercasing each character, does not
    # (the parity with HF on every code point is in test_tokenizers_unicode.py).
    assert "ΟΔΟΣ".lower() == "οδος"
    assert bert_normalize("ΟΔΟΣ") == "οδοσ" == "".join(c.lower() for c in "ΟΔΟΣ")
    assert bert_pretokenize("ΟΔΟΣ, ΣΑΣ.") == ["οδοσ", ",", "σασ", "."]
    assert bert_normalize("ΟΔΟΣ", lowercase=False) == "ΟΔΟΣ"


def test_bert_options_act_one_at_a_time():
    text = "Ça Va?\u200b"
    assert bert_normalize(text, lowercase=False, strip_accents=False) == "Ça Va?"
    assert bert_normalize(text, lowercase=True, strip_accents=False) == "ça va?"
    assert bert_normalize(text, lowercase=False, strip_accents=True) == "Ca Va?"
    assert bert_normalize(text) == "ca va?"


def test_wordpiece_constructor_and_encode_word_check_their_arguments(tok):
    with pytest.raises(ValueError, match="max_word_chars must be an int >= 1, got 0"):
        WordPieceTokenizer(["[UNK]", "a"], max_word_chars=0)
    with pytest.raises(TypeError, match="prefix must be a str, got NoneType"):
        WordPieceTokenizer(["[UNK]", "a"], prefix=None)
    with pytest.raises(TypeError, match="token 1 must be a str, got bytes"):
        WordPieceTokenizer(["[UNK]", b"a"])
    with pytest.raises(ValueError, match="the vocabulary is empty"):
        WordPieceTokenizer([])
    with pytest.raises(TypeError, match="word must be a str, got int"):
        tok.encode_word(5)



def test_min_gain_stops_at_the_first_merge_below_it():
    # Schuster & Nakajima's second stopping rule: the vocabulary is a prefix of the default one
    text = stdlib_corpus(20_000)
    full = WordPieceTokenizer.train(text, 500)
    stopped = WordPieceTokenizer.train(text, 500, min_gain=100.0)
    assert 5 < stopped.vocab_size < full.vocab_size
    assert stopped.vocab == full.vocab[: stopped.vocab_size]
    # a threshold below every gain changes nothing (the best gain stays positive here)
    assert WordPieceTokenizer.train(text, 500, min_gain=0).vocab == full.vocab


def test_min_gain_against_the_first_merge_by_brute_force():
    text = "hug hug hug pug pun bun hugs"
    words = spelled_words(text)
    n = Counter()
    pairs = Counter()
    for pieces, f in words.items():
        for t in pieces:
            n[t] += f
        for pair in itertools.pairwise(pieces):
            pairs[pair] += f
    n_tok = sum(n.values())
    best = max(float(likelihood_gain(k, n[a], n[b], n_tok, a == b))
               for (a, b), k in pairs.items())
    alphabet = 5 + len(n)
    above = WordPieceTokenizer.train(text, alphabet + 3, min_gain=best + 1e-6)
    below = WordPieceTokenizer.train(text, alphabet + 3, min_gain=best - 1e-6)
    assert above.vocab_size == alphabet < below.vocab_size


def test_min_gain_is_checked():
    with pytest.raises(TypeError, match="min_gain must be a number of nats or None, got str"):
        WordPieceTokenizer.train("hello world", 100, min_gain="1")
    with pytest.raises(TypeError, match="min_gain must be a number of nats or None, got bool"):
        WordPieceTokenizer.train("hello world", 100, min_gain=True)
    with pytest.raises(ValueError, match="min_gain must be a number of nats or None, got nan"):
        WordPieceTokenizer.train("hello world", 100, min_gain=float("nan"))


def test_bert_punctuation_includes_the_ascii_symbols():
    symbols = "$+<=>^`|~"
    assert all(unicodedata.category(c).startswith("S") for c in symbols)  # not P* in Unicode
    assert bert_pretokenize("a$b+c") == ["a", "$", "b", "+", "c"]
    spaced = ["x"] + [t for c in symbols for t in (c, "x")]
    assert bert_pretokenize("x" + "x".join(symbols) + "x") == spaced
