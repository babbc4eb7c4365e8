"""Unigram LM: forward-backward, Viterbi and n-best against brute-force enumeration,
sampling, training, and Viterbi segmentations equal to sentencepiece's."""

import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest
import sentencepiece as spm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfbook.corpus import stdlib_corpus, stress_lines
from tfbook.tokenizers import UnigramTokenizer
from tfbook.tokenizers.unigram import (
    DUMMY_PREFIXES,
    Lattice,
    digamma,
    from_pieces_form,
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
def test_the_dummy_prefix_goes_in_front_of_the_text_or_every_line_and_comes_off_again(text):
    assert to_pieces_form(text) == ("▁" if text else "") + text.replace(" ", "▁")
    lines = to_pieces_form(text, dummy_prefix="line")
    assert lines.count("▁") == text.count(" ") + sum(1 for line in text.split("\n") if line)
    for mode in DUMMY_PREFIXES:
        assert from_pieces_form(to_pieces_form(text, mode), mode) == text
        tok = UnigramTokenizer([*SMALL, "\n", "\r", "x"], [*SMALL.values(), -3.0, -3.0, -3.0],
                               dummy_prefix=mode)
        assert tok.decode(tok.encode(text)) == text
        assert tok.encode(text) == tok.viterbi(to_pieces_form(text, mode))[0]
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
    assert loaded.dummy_prefix == "text"
    per_line = UnigramTokenizer(trained.pieces, trained.scores, dummy_prefix="line")
    per_line.save(path)
    assert UnigramTokenizer.load(path).encode(text) == per_line.encode(text) != loaded.encode(text)
    data = {**trained.to_dict(), "special_tokens": trained.special_tokens}
    del data["dummy_prefix"]  # a file saved before the field existed: sentencepiece's rule
    assert UnigramTokenizer.from_dict(data).dummy_prefix == "text"
    with pytest.raises(ValueError, match=r"field 'dummy_prefix': expected one of \('text', "
                                         r"'line'\), got"):
        UnigramTokenizer.from_dict({**data, "dummy_prefix": "lines"})


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory) -> spm.SentencePieceProcessor:
    folder = tmp_path_factory.mktemp("sp")
    (folder / "train.txt").write_text(stdlib_corpus(100_000), "utf-8")
    spm.SentencePieceTrainer.train(
        input=str(folder / "train.txt"), model_prefix=str(folder / "m"), model_type="unigram",
        vocab_size=600, normalization_rule_name="identity", remove_extra_whitespaces=False,
        character_coverage=1.0, num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(folder / "m.model"))


@pytest.fixture(scope="module")
def sentencepiece_pieces(sentencepiece_model) -> UnigramTokenizer:
    """A UnigramTokenizer holding sentencepiece's pieces and scores, nothing else shared."""
    sp = sentencepiece_model
    n = sp.get_piece_size()
    return UnigramTokenizer([sp.id_to_piece(i) for i in range(n)],
                            [sp.get_score(i) for i in range(n)],
                            special_tokens=["<unk>", "<s>", "</s>"])


# what joins and surrounds the lines of a generated text: line breaks of every kind, blank
# lines, tabs, runs of spaces, and the spaces sentencepiece does not treat as spaces
SEPARATORS = ["\n", "\r\n", "\r", "\n\n", "\n\n\n", "\n \n", "\t", "\n\t", " ", "  ", "   ",
              " \n ", "\u3000", "\xa0", "\u2028"]
EDGES = ["", "", " ", "  ", "\n", "\n\n", "\t", " \n", "\r\n"]


def multi_line_texts(count: int, seed: int = 0) -> list[str]:
    """Texts of one to six lines of the corpus and the stress lines, joined and framed by
    SEPARATORS and EDGES (leading and trailing spaces, empty lines, tabs), plus each
    separator and edge alone."""
    lines = stdlib_corpus(60_000).splitlines() + stress_lines()
    rng = random.Random(seed)
    texts = SEPARATORS + EDGES
    for _ in range(count):
        parts = rng.sample(lines, rng.randint(1, 6))
        text = parts[0] + "".join(rng.choice(SEPARATORS) + p for p in parts[1:])
        texts.append(rng.choice(EDGES) + text + rng.choice(EDGES))
    return texts


def test_encode_equals_sentencepiece_on_lines(sentencepiece_model, sentencepiece_pieces):
    sp, ours = sentencepiece_model, sentencepiece_pieces
    lines = (stdlib_corpus(250_000) + "\n" + "\n".join(stress_lines())).splitlines()
    for line in lines:
        assert ours.encode(line, disallowed_special=()) == sp.encode(line), line


def test_encode_equals_sentencepiece_on_multi_line_texts(sentencepiece_model,
                                                         sentencepiece_pieces):
    """sentencepiece's `encode` reads a string as one sentence: one ▁ in front of it, a line
    break a character like any other. So does tfbook's, on 2,000 generated texts."""
    sp, ours = sentencepiece_model, sentencepiece_pieces
    texts = multi_line_texts(2000)
    assert sum("\n" in t for t in texts) > 1500 and sum("\r\n" in t for t in texts) > 100
    mismatches = [t for t in texts if ours.encode(t, disallowed_special=()) != sp.encode(t)]
    assert not mismatches, mismatches[:3]
    compared = 0
    for text in texts[:150]:  # the n best lists too, where no two of the 4 best tie
        best = ours.nbest(text, 4)
        scores = [score for _, score in best]
        if len(best) == 4 and min(a - b for a, b in itertools.pairwise(scores)) > 1e-4:
            assert [ids for ids, _ in best[:3]] == sp.nbest_encode_as_ids(text, 3), text
            compared += 1
    assert compared > 40
    # the per-line option differs, where a line break is (a ▁ after it, none on empty lines)
    per_line = UnigramTokenizer(ours.pieces, ours.scores, special_tokens=["<unk>", "<s>", "</s>"],
                                dummy_prefix="line")
    differ = [t for t in texts[:300] if per_line.encode(t, disallowed_special=()) != sp.encode(t)]
    assert len(differ) > 100 and all("\n" in t for t in differ)


@pytest.mark.parametrize("dummy_prefix", DUMMY_PREFIXES)
def test_multi_line_texts_decode_back(trained, dummy_prefix):
    tok = UnigramTokenizer(trained.pieces, trained.scores, dummy_prefix=dummy_prefix)
    known = set(tok.pieces) | {" "}
    texts = [t for t in multi_line_texts(300) if set(t) <= known]
    assert len(texts) > 50 and sum("\n" in t for t in texts) > 40
    for text in texts:
        assert tok.decode(tok.encode(text, disallowed_special=())) == text


# characters the model knows (letters, digits, symbols), the spaces and line breaks it does
# not, a combining mark, CJK and an emoji (unknown: runs of them become one <unk>)
ALPHABET = "abcdefxyz ABC 0129 _.,:;()[]=*'\"#\n\r\t\u3000\xa0\u0301é日本😀"


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=ALPHABET, max_size=40))
def test_encode_equals_sentencepiece_property(sentencepiece_model, sentencepiece_pieces, text):
    sp, ours = sentencepiece_model, sentencepiece_pieces
    ids = ours.encode(text, disallowed_special=())
    assert ids == sp.encode(text)
    if ours.unk_id not in ids:
        assert ours.decode(ids) == text


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
    for bad in ("lines", None, True):
        with pytest.raises(ValueError, match=r"dummy_prefix must be one of \('text', 'line'\), "
                                             rf"got {bad!r}"):
            UnigramTokenizer(["<unk>", "a"], [0.0, -1.0], dummy_prefix=bad)
        with pytest.raises(ValueError, match="dummy_prefix must be one of"):
            to_pieces_form("a", bad)
    with pytest.raises(ValueError, match="dummy_prefix must be one of"):
        UnigramTokenizer.train("a b", 10, dummy_prefix="sentence")
    for bad, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError),
                       ("3", TypeError)):
        with pytest.raises(error, match=rf"n must be an int >= 1 \(how many segmentations\), "
                                        rf"got {bad!r}"):
            trained.nbest("a b", bad)
    for bad, error in ((-0.5, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                       ("0.1", TypeError), (None, TypeError), (True, TypeError)):
        with pytest.raises(error, match=r"alpha must be a finite number >= 0 \(the exponent of "
                                        r"p\(s\)\), got"):
            trained.sample("a b", bad)
    with pytest.raises(TypeError, match="rng must be a random.Random or None, got int"):
        trained.sample("a b", 0.1, rng=0)


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
