"""Byte-level BPE: the fast trainer and encoder equal naive reference versions, round-trips,
special tokens, save/load, and clear errors."""

import json
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfbook.corpus import stdlib_corpus
from tfbook.tokenizers import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, BPETokenizer, regex_split
from tfbook.tokenizers.bpe import count_pairs, merge_by_rank, merge_pair

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train(stdlib_corpus(100_000), 512, special_tokens=[EOT])


def naive_train(text: str, vocab_size: int) -> dict[tuple[int, int], int]:
    """The textbook loop: re-count all pairs of all chunks after every merge."""
    chunks = [list(c.encode("utf-8")) for c in regex_split(text, GPT4_SPLIT_PATTERN)]
    merges = {}
    for new_id in range(256, vocab_size):
        counts = {}
        for ids in chunks:
            for pair, n in count_pairs(ids).items():
                counts[pair] = counts.get(pair, 0) + n
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))  # most frequent, then smallest pair
        chunks = [merge_pair(ids, best, new_id) for ids in chunks]
        merges[best] = new_id
    return merges


def naive_encode(ids: list[int], merges: dict[tuple[int, int], int]) -> list[int]:
    """Quadratic reference: merge the lowest-ranked pair present until none is left."""
    while len(ids) > 1:
        pair = min(zip(ids, ids[1:], strict=False), key=lambda p: merges.get(p, float("inf")))
        if pair not in merges:
            break
        ids = merge_pair(ids, pair, merges[pair])
    return ids


def test_pair_helpers_examples():
    assert count_pairs([1, 2, 3, 1, 2]) == {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    assert merge_pair([1, 2, 3, 1, 2], (1, 2), 4) == [4, 3, 4]
    assert merge_pair([5, 5, 5], (5, 5), 6) == [6, 5]


def test_incremental_training_equals_naive_recount():
    text = stdlib_corpus(12_000)
    fast = BPETokenizer.train(text, 320)
    assert fast.merges == naive_train(text, 320)


def test_trace_records_each_merge(tok):
    assert len(tok.trace) == len(tok.merges) == 512 - 256 - 1
    first = tok.trace[0]
    assert first.new_id == 256 and tok.merges[first.pair] == 256
    left, right = (tok.vocab[i] for i in first.pair)
    text = stdlib_corpus(100_000)
    chunks = regex_split(text, GPT4_SPLIT_PATTERN)
    assert first.count == sum(count_pairs(list(c.encode()))[first.pair] for c in chunks)
    assert all((left + right) in c.encode() for c in first.chunks)
    counts = [step.count for step in tok.trace]
    assert counts[0] == max(counts)


def test_top_pairs_record_the_counts_before_each_merge():
    text = "low lower lowest newer newest wider"
    tok = BPETokenizer.train(text, 270, top_pairs=3)
    for step in tok.trace:
        assert step.top_pairs[0] == (step.pair, step.count)  # the merged pair was the top one
        assert [c for _, c in step.top_pairs] == sorted((c for _, c in step.top_pairs),
                                                        reverse=True)


def test_with_merges_replays_training(tok):
    early = tok.with_merges(10)
    assert len(early.merges) == 10 and early.vocab == tok.vocab[:266]
    text = stdlib_corpus(5_000)
    assert len(early.encode(text)) > len(tok.encode(text))
    assert early.decode(early.encode(text)) == text


@pytest.mark.parametrize("seed", range(5))
def test_heap_encoder_equals_naive_encoder(tok, seed):
    rng = random.Random(seed)
    text = stdlib_corpus(100_000)
    start = rng.randrange(len(text) - 300)
    data = text[start : start + 300].replace(" ", "").encode()  # long pieces, many merges
    ids = [tok.byte_ids[b] for b in data]
    assert merge_by_rank(ids, tok.merges) == naive_encode(ids, tok.merges)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_any_unicode(tok, text):
    assert tok.decode(tok.encode(text, disallowed_special=())) == text


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=50))
def test_decode_bytes_inverts_byte_level_encoding(tok, data):
    ids = tok.encode_chunk(data)
    assert tok.decode_bytes(ids) == data


def test_training_is_deterministic():
    text = stdlib_corpus(30_000)
    a, b = BPETokenizer.train(text, 400), BPETokenizer.train(text, 400)
    assert a.merges == b.merges and a.trace == b.trace


def test_save_load_round_trip(tok, tmp_path):
    path = tmp_path / "bpe.json"
    tok.save(path)
    data = json.loads(path.read_text("utf-8"))  # human-readable JSON
    assert data["kind"] == "bpe" and data["merges"][0] == "{} {} -> 256".format(*tok.trace[0].pair)
    loaded = BPETokenizer.load(path)
    text = stdlib_corpus(5_000)
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.special_tokens == tok.special_tokens == {EOT: 511}


def test_special_tokens_only_when_allowed(tok):
    text = f"hello{EOT}world"
    with pytest.raises(ValueError, match="contains the special token '<\\|endoftext\\|>'"):
        tok.encode(text)
    as_special = tok.encode(text, allowed_special={EOT})
    assert as_special == tok.encode("hello") + [511] + tok.encode("world")
    assert tok.encode(text, allowed_special="all") == as_special
    as_text = tok.encode(text, disallowed_special=())
    assert 511 not in as_text and tok.decode(as_text) == text
    with pytest.raises(ValueError, match="does not have"):
        tok.encode(text, allowed_special={"<|nope|>"})


def test_adversarial_long_pieces_are_fast(tok):
    for text in ("a" * 20_000, "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(5000))):
        start = time.process_time()  # CPU time of this process: another program's load
        ids = tok.encode(text)  # does not count (a quadratic encoder would take many seconds)
        assert time.process_time() - start < 1.0
        assert tok.decode(ids) == text


def test_bad_inputs(tok):
    with pytest.raises(ValueError, match="vocab_size must be at least 257 .* got 200"):
        BPETokenizer.train("some text", 200, special_tokens=[EOT])
    with pytest.raises(ValueError, match="cannot train on an empty text"):
        BPETokenizer.train("", 300)
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        BPETokenizer.train(b"bytes", 300)
    with pytest.raises(TypeError, match="vocab_size must be an int, got float"):
        BPETokenizer.train("text", 300.0)
    with pytest.raises(TypeError, match="text must be a str, got int"):
        tok.encode(42)
    with pytest.raises(ValueError, match="unknown token id 512 at position 1"):
        tok.decode([5, 512])
    with pytest.raises(ValueError, match="unknown token id -1 at position 0"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="ids must be ints, got str"):
        tok.decode(["a"])
    with pytest.raises(ValueError, match="is not in the vocabulary"):
        tok.token_to_id("surely-not-a-token")


@pytest.mark.parametrize(("pattern", "message"), [
    ("(", r"the split pattern '\(' is not a valid regular expression: missing \)"),
    ("[a-", "the split pattern '\\[a-' is not a valid regular expression"),
    (r"\p{NotACategory}", "is not a valid regular expression: unknown property"),
    ("a{2,1}", "is not a valid regular expression"),
    ("", "pattern '' would cut the text into empty chunks: pass a regular expression, or "
         "pattern=None"),
])
def test_invalid_patterns_are_refused_at_construction(pattern, message):
    with pytest.raises(ValueError, match=message):
        BPETokenizer({}, pattern=pattern)
    with pytest.raises(ValueError, match=message):
        BPETokenizer.train("some text to train on", 300, pattern=pattern)


@pytest.mark.parametrize("pattern", [5, b"\\w+", ["\\w+"]])
def test_patterns_that_are_not_strings_are_type_errors(pattern):
    name = type(pattern).__name__
    with pytest.raises(TypeError, match=f"a split pattern must be a str .*, got {name}"):
        BPETokenizer({}, pattern=pattern)
    with pytest.raises(TypeError, match=f"a split pattern must be a str .*, got {name}"):
        regex_split("text", pattern)


def test_regex_split_checks_its_arguments():
    with pytest.raises(ValueError, match="is not a valid regular expression"):
        regex_split("text", "(?<")
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        regex_split(b"text")
    with pytest.raises(ValueError, match="lone surrogate U\\+DC00 at position 2"):
        regex_split("ab\udc00")


def test_bad_merges_and_special_ids_are_refused_at_construction():
    with pytest.raises(ValueError, match=r"merges \(97, 98\) and \(99, 100\) both make id 256: "
                                         r"expected each id 256..257 made by one merge"):
        BPETokenizer({(97, 98): 256, (99, 100): 256})
    with pytest.raises(TypeError, match="merges must map \\(left id, right id\\) -> new id"):
        BPETokenizer({(97, "b"): 256})
    with pytest.raises(TypeError, match="merges must map"):
        BPETokenizer({(97, 98, 99): 256})
    with pytest.raises(ValueError, match=r"special token '<\|x\|>' has id 256, which is an "
                                         r"ordinary token's: expected an id >= 257"):
        BPETokenizer({(97, 98): 256}, special_tokens={"<|x|>": 256})
    with pytest.raises(ValueError, match=r"special tokens '<\|x\|>' and '<\|y\|>' both have id "
                                         "300: expected one id each"):
        BPETokenizer({}, special_tokens={"<|x|>": 300, "<|y|>": 300})
    with pytest.raises(ValueError, match="a special token must not be empty"):
        BPETokenizer({}, special_tokens={"": 300})
    with pytest.raises(TypeError, match="a special token must be a str, got int"):
        BPETokenizer({}, special_tokens={5: 300})
    with pytest.raises(TypeError, match="special token '<\\|x\\|>' needs an int id >= 0"):
        BPETokenizer({}, special_tokens={"<|x|>": "300"})


def test_encode_chunk_takes_bytes(tok):
    with pytest.raises(TypeError, match=r"a chunk must be bytes \(text.encode\('utf-8'\)\), "
                                        "got str: 'abc'"):
        tok.encode_chunk("abc")


# --- the tie-break of Stanford CS336's reference trainer --------------------------------------

def greatest_bytes_reference(text: str, vocab_size: int, pattern: str | None,
                             specials: tuple[str, ...] = ()) -> list[tuple[bytes, bytes]]:
    """Brute force on words as tuples of bytes: re-count every pair, merge the one with the
    largest (count, (left bytes, right bytes)), as CS336's reference trainer does."""
    pieces = [text]
    for special in specials:
        pieces = [part for piece in pieces for part in piece.split(special)]
    words: dict[tuple[bytes, ...], int] = {}
    for piece in pieces:
        for chunk in (regex_split(piece, pattern) if pattern else [piece]):
            word = tuple(bytes([b]) for b in chunk.encode("utf-8"))
            words[word] = words.get(word, 0) + 1
    merges = []
    for _ in range(vocab_size - 256 - len(specials)):
        counts: dict[tuple[bytes, bytes], int] = {}
        for word, n in words.items():
            for pair in zip(word, word[1:], strict=False):
                counts[pair] = counts.get(pair, 0) + n
        if not counts:
            break
        best = max(counts, key=lambda pair: (counts[pair], pair))
        merges.append(best)
        merged: dict[tuple[bytes, ...], int] = {}
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return merges


def merges_as_bytes(tok: BPETokenizer) -> list[tuple[bytes, bytes]]:
    ordered = sorted(tok.merges.items(), key=lambda kv: kv[1])
    return [(tok.vocab[left], tok.vocab[right]) for (left, right), _ in ordered]


def test_the_two_tie_breaks_differ_on_a_hand_checked_corpus():
    # "es" and "st" both occur 9 times (3 widest + 6 newest), more than any other pair:
    # the smallest ids pick (e, s) since e < s; the greatest bytes pick (s, t)
    text = ("low low low low low lower lower widest widest widest "
            "newest newest newest newest newest newest")
    words = r"\S+"  # split on whitespace, as the worked example of the CS336 handout does
    by_bytes = BPETokenizer.train(text, 256 + 12, pattern=words, tie_break="greatest_bytes")
    by_ids = BPETokenizer.train(text, 256 + 12, pattern=words)
    spelled = [b" ".join(pair).decode() for pair in merges_as_bytes(by_bytes)]
    assert spelled == ["s t", "e st", "o w", "l ow", "w est", "n e", "ne west", "w i",
                       "wi d", "wid est", "low e", "lowe r"]
    assert [b" ".join(pair).decode() for pair in merges_as_bytes(by_ids)][:2] == ["e s", "es t"]
    assert by_bytes.trace[0].count == by_ids.trace[0].count == 9
    assert merges_as_bytes(by_bytes) == greatest_bytes_reference(text, 256 + 12, words)


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="aab c\u00e9\n", min_size=1, max_size=80),
       n_merges=st.integers(1, 30), split=st.booleans())
def test_greatest_bytes_equals_brute_force_reference(text, n_merges, split):
    pattern = GPT4_SPLIT_PATTERN if split else None
    tok = BPETokenizer.train(text, 256 + n_merges, pattern=pattern,
                             tie_break="greatest_bytes")
    assert merges_as_bytes(tok) == greatest_bytes_reference(text, 256 + n_merges, pattern)
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("pattern", [GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN],
                         ids=["gpt2-split", "gpt4-split"])
def test_greatest_bytes_on_real_text_and_with_special_tokens(pattern):
    text = stdlib_corpus(4_000).replace("\n\n", f"\n{EOT}\n")
    assert EOT in text
    tok = BPETokenizer.train(text, 320, pattern=pattern, special_tokens=[EOT],
                             tie_break="greatest_bytes")
    reference = greatest_bytes_reference(text, 320, pattern, (EOT,))
    assert merges_as_bytes(tok) == reference
    assert not any(b"<|" in token for token in tok.vocab[256:])  # no merge spans a special
    assert tok.special_tokens == {EOT: 319}


def test_tie_break_is_checked():
    with pytest.raises(ValueError, match="tie_break must be one of 'smallest_ids', "
                                         "'greatest_bytes', got 'largest'"):
        BPETokenizer.train("some text", 300, tie_break="largest")
    with pytest.raises(ValueError, match="a special token must not be empty"):
        BPETokenizer.train("some text", 300, special_tokens=[""])
