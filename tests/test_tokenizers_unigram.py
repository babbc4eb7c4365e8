"""Unigram LM: forward-backward, Viterbi and n-best against brute-force enumeration,
sampling, training, and Viterbi segmentations equal to sentencepiece's."""

import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest
import sentencepiece as spm

from tfbook.corpus import stdlib_corpus, stress_lines
from tfbook.tokenizers import UnigramTokenizer
from tfbook.tokenizers.unigram import (
    Lattice,
    digamma,
    m_step_update,
    script_class,
    split_words,
    to_pieces_form,
)

SMALL = {"<unk>": 0.0, "▁": -2.0, "a": -2.5, "b": -3.0, "ab": -3.2, "ba": -4.0, "▁a": -2.9,
         "aba": -5.0, "c": -6.0}


@pytest.fixture(scope="module")
def small() -> UnigramTokenizer:
    return UnigramTokenizer(list(SMALL), list(SMALL.values()))


def segmentations(s: str, pieces: set[str]):
    """Every way to cut `s` into pieces (brute force)."""
    if not s:
        yield ()
        return
    for k in range(1, len(s) + 1):
        if s[:k] in pieces:
            for rest in segmentations(s[k:], pieces):
                yield (s[:k], *rest)


def test_split_words_like_sentencepiece():
    assert split_words("Hi  you") == ["▁Hi", "▁", "▁you"]
    assert split_words(" x") == ["▁", "▁x"] and split_words("") == []
    # line breaks are words of their own; scripts (letters / Common) are never joined
    assert split_words("a.\n\nThe __all__ 3.14") == [
        "▁a", ".", "\n", "\n", "▁The", "▁__", "all", "__", "▁3.14"]
    assert split_words("a.\n\nThe", boundaries="spaces") == ["▁a.\n\n", "▁The"]


@pytest.mark.parametrize("text", ["a\n\nb", "a\n \nb", " x", "", "\n", "a\r\nb", "\n\n a  \n"])
def test_every_line_gets_one_space_in_front_and_loses_it_again(text):
    form = to_pieces_form(text)
    assert form.count("▁") == text.count(" ") + sum(1 for line in text.split("\n") if line)
    tok = UnigramTokenizer([*SMALL, "\n", "\r", "x"], [*SMALL.values(), -3.0, -3.0, -3.0])
    assert tok.decode(tok.encode(text)) == text
    # combining marks follow their letter; Han, Hiragana and Katakana are one class
    assert split_words("nai\u0308ve, 日本語のテキスト αβγ") == [
        "▁nai\u0308ve", ",", "▁日本語のテキスト", "▁αβγ"]
    assert [script_class(c) for c in "a1_ß\u0308日α"] == [
        "LATIN", "Common", "Common", "LATIN", None, "Han", "GREEK"]


def is_mixed(piece: str) -> bool:
    """More than one script class in the piece (a leading ▁ and combining marks aside)."""
    return len({script_class(c) for c in piece.lstrip("▁")} - {None}) > 1


def test_trained_pieces_keep_sentencepiece_boundaries():
    text = stdlib_corpus(60_000)
    assert "\n" in text and "__" in text
    tok = UnigramTokenizer.train(text, 400)
    assert "\n" in tok.pieces  # the line break is a piece of its own ...
    assert not [p for p in tok.pieces if len(p) > 1 and ("\n" in p or "\r" in p)]  # ... only
    assert not [p for p in tok.pieces[1:] if is_mixed(p)]  # (pieces[0] is <unk>)
    old = UnigramTokenizer.train(text, 400, boundaries="spaces")
    assert [p for p in old.pieces if len(p) > 1 and "\n" in p]  # what the rules prevent
    assert [p for p in old.pieces[1:] if is_mixed(p)]


def test_trained_pieces_match_sentencepiece_rules(tmp_path):
    """sentencepiece, trained with its default script rule on the same text, never learns a
    piece that our rule forbids."""
    text = stdlib_corpus(100_000)
    (tmp_path / "train.txt").write_text(text, "utf-8")
    spm.SentencePieceTrainer.train(
        input=str(tmp_path / "train.txt"), model_prefix=str(tmp_path / "m"),
        model_type="unigram", vocab_size=600, normalization_rule_name="identity",
        remove_extra_whitespaces=False, character_coverage=1.0, num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    pieces = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]
    assert not [p for p in pieces if is_mixed(p)]
    assert max(map(len, pieces)) == 16  # sentencepiece's default cap, also ours


@pytest.mark.parametrize("word", ["▁abab", "▁aba", "▁bab"])
def test_forward_backward_equals_enumeration(word):
    pieces = [p for p in SMALL if p != "<unk>"]
    logp = np.array([SMALL[p] for p in pieces])
    lattice = Lattice.build([word], {p: i for i, p in enumerate(pieces)}, 12)
    counts, log_px = lattice.expected_counts(logp, np.array([1.0]))
    segs = list(segmentations(word, set(pieces)))
    probs = [math.exp(sum(SMALL[t] for t in s)) for s in segs]
    assert log_px == pytest.approx(math.log(sum(probs)))
    expected: Counter = Counter()
    for s, p in zip(segs, probs, strict=True):
        for t in s:
            expected[t] += p / sum(probs)
    assert counts == pytest.approx([expected[p] for p in pieces])


@pytest.mark.parametrize("text", ["abab", "ba ab", "abaab"])
def test_viterbi_and_nbest_equal_enumeration(small, text):
    s = "▁" + text.replace(" ", "▁")
    segs = sorted(segmentations(s, set(SMALL) - {"<unk>"}),
                  key=lambda seg: -sum(SMALL[t] for t in seg))
    ids, score = small.viterbi(s)
    assert [small.pieces[i] for i in ids] == list(segs[0])
    assert score == pytest.approx(sum(SMALL[t] for t in segs[0]), abs=1e-5)
    best = small.nbest(text, 4)
    assert [[small.pieces[i] for i in ids] for ids, _ in best] == [list(s) for s in segs[:4]]
    assert [total for _, total in best] == sorted((total for _, total in best), reverse=True)


def test_unknown_characters_merge_into_one_unk(small):
    space, ab = small.token_to_id("▁"), small.token_to_id("ab")
    assert small.encode("xyz ab") == [space, small.unk_id, space, ab]  # xyz -> one <unk>
    assert small.decode(small.encode("ab ba")) == "ab ba"


def test_sampling_follows_p_to_the_alpha(small):
    rng = random.Random(0)
    alpha = 0.5
    segs = list(segmentations("▁abab", set(SMALL) - {"<unk>"}))
    weights = {s: math.exp(alpha * sum(SMALL[t] for t in s)) for s in segs}
    total = sum(weights.values())
    draws = Counter(tuple(small.pieces[i] for i in small.sample("abab", alpha, rng))
                    for _ in range(4000))
    assert set(draws) <= set(segs)
    for s in segs:
        assert draws[s] / 4000 == pytest.approx(weights[s] / total, abs=0.03)


@pytest.fixture(scope="module")
def trained() -> UnigramTokenizer:
    return UnigramTokenizer.train(stdlib_corpus(60_000), 400)


def test_trained_tokenizer(trained):
    text = stdlib_corpus(60_000)
    assert trained.vocab_size == 400 and trained.pieces[0] == "<unk>"
    assert {c for w in split_words(text) for c in w} <= set(trained.pieces)  # all chars kept
    assert max(len(p) for p in trained.pieces) <= 16
    sample = stdlib_corpus(4_000)
    assert trained.decode(trained.encode(sample)) == sample
    assert len(trained.encode(sample)) < 0.6 * len(sample)


def test_training_is_deterministic(trained):
    again = UnigramTokenizer.train(stdlib_corpus(60_000), 400)
    assert again.pieces == trained.pieces and again.scores == trained.scores


def test_save_load_round_trip(trained, tmp_path):
    path = tmp_path / "unigram.json"
    trained.save(path)
    loaded = UnigramTokenizer.load(path)
    assert loaded.pieces == trained.pieces and loaded.scores == trained.scores
    text = stdlib_corpus(3_000)
    assert loaded.encode(text) == trained.encode(text)


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory) -> spm.SentencePieceProcessor:
    folder = tmp_path_factory.mktemp("sp")
    (folder / "train.txt").write_text(stdlib_corpus(100_000), "utf-8")
    spm.SentencePieceTrainer.train(
        input=str(folder / "train.txt"), model_prefix=str(folder / "m"), model_type="unigram",
        vocab_size=600, normalization_rule_name="identity", remove_extra_whitespaces=False,
        character_coverage=1.0, num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(folder / "m.model"))


def test_viterbi_equals_sentencepiece(sentencepiece_model):
    sp = sentencepiece_model
    n = sp.get_piece_size()
    ours = UnigramTokenizer([sp.id_to_piece(i) for i in range(n)],
                            [sp.get_score(i) for i in range(n)],
                            special_tokens=["<unk>", "<s>", "</s>"])
    # sentencepiece encodes a text as one sentence and reads training text one line at a
    # time; tfbook puts a ▁ in front of every line, so the two agree line by line
    lines = (stdlib_corpus(250_000) + "\n" + "\n".join(stress_lines())).splitlines()
    assert any("\n" in line for line in stress_lines())
    for line in lines:
        assert ours.encode(line, disallowed_special=()) == sp.encode(line), line


def test_bad_inputs(trained):
    with pytest.raises(ValueError, match=r"vocab_size must be at least 5 \(1 specials \+ 4 "
                                         r"distinct characters\), got 3"):
        UnigramTokenizer.train("abc", 3)
    with pytest.raises(ValueError, match="cannot train on an empty text"):
        UnigramTokenizer.train("", 100)
    with pytest.raises(TypeError, match="text must be a str, got NoneType"):
        UnigramTokenizer.train(None, 100)
    with pytest.raises(ValueError, match="unknown token id 400 at position 2"):
        trained.decode([1, 2, 400])
    with pytest.raises(ValueError, match="need one score per piece, got 2 pieces and 1 scores"):
        UnigramTokenizer(["<unk>", "a"], [0.0])
    assert list(itertools.islice(split_words("a b"), 2)) == ["▁a", "▁b"]
    with pytest.raises(ValueError, match=r"boundaries must be one of \('sentencepiece', "
                                         r"'spaces'\), got 'lines'"):
        split_words("a b", boundaries="lines")
    with pytest.raises(ValueError, match="boundaries must be one of"):
        UnigramTokenizer.train("a b", 10, boundaries=None)


def test_text_entry_points_check_their_text(small):
    for function in (small.encode, small.viterbi, lambda t: small.nbest(t, 2), small.sample,
                     split_words, to_pieces_form):
        with pytest.raises(TypeError, match=r"(text|s) must be a str, got NoneType"):
            function(None)
        with pytest.raises(TypeError, match=r"must be a str, got bytes"):
            function(b"ab")
        with pytest.raises(ValueError, match="lone surrogate U\\+DFFF at position 1"):
            function("a\udfff")


def test_digamma_against_closed_forms():
    euler = 0.5772156649015329
    x = np.array([0.5, 1.0, 2.0, 5.0, 11.0, 1e6])
    harmonic = {1.0: 0.0, 2.0: 1.0, 5.0: 1 + 1 / 2 + 1 / 3 + 1 / 4,
                11.0: sum(1 / k for k in range(1, 11))}  # psi(n + 1) = H_n - euler
    expected = [-euler - 2 * math.log(2)] + [h - euler for h in harmonic.values()]
    expected.append(math.log(1e6) - 0.5e-6)  # psi(x) ~ log x - 1/(2x) for large x
    assert digamma(x) == pytest.approx(expected, rel=1e-11, abs=1e-11)


def test_digamma_m_step_like_sentencepiece():
    counts, alive = np.array([100.0, 1.0, 0.0]), np.array([True, True, False])
    em, dg = m_step_update(counts, alive, "em"), m_step_update(counts, alive, "digamma")
    assert np.exp(em[:2]).sum() == pytest.approx(1.0) and em[2] == dg[2] == -np.inf
    assert np.exp(dg[:2]).sum() < 1  # the sparse prior: probabilities sum below 1 ...
    assert np.exp(dg[1] - em[1]) == pytest.approx(math.exp(-0.5772156649) * 101 / 100.5,
                                                   rel=1e-3)  # ... rare pieces lose most
    tok = UnigramTokenizer.train(stdlib_corpus(30_000), 300, m_step="digamma")
    assert sum(math.exp(s) for s in tok.scores[1:]) < 1
    with pytest.raises(ValueError, match=r"m_step must be one of \('em', 'digamma'\), got 'map'"):
        UnigramTokenizer.train("a b", 10, m_step="map")
