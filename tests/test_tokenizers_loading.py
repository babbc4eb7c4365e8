"""Loading saved tokenizers: every kind of damaged file is one ValueError that names the file,
the field and what was expected; nothing loads into a tokenizer that answers wrongly."""

import json
import re
from pathlib import Path

import pytest

from tfbook.corpus import stdlib_corpus
from tfbook.tokenizers import BPETokenizer, Tokenizer, UnigramTokenizer, WordPieceTokenizer

TEXT = stdlib_corpus(8_000)
MAKERS = {
    "bpe": lambda: BPETokenizer.train(TEXT, 300, special_tokens=["<|eot|>"]),
    "wordpiece": lambda: WordPieceTokenizer.train(TEXT, 200),
    "unigram": lambda: UnigramTokenizer.train(TEXT, 150),
}
REQUIRED = {  # the fields each kind cannot do without
    "bpe": ["kind", "pattern", "byte_ids", "merges"],
    "wordpiece": ["kind", "vocab", "unk_token", "prefix", "max_word_chars", "lowercase",
                  "strip_accents"],
    "unigram": ["kind", "pieces", "unk_token"],
}


@pytest.fixture(scope="module", params=list(MAKERS))
def saved(request, tmp_path_factory) -> tuple[str, dict]:
    """A tokenizer's kind and its saved fields, as `save` writes them."""
    path = tmp_path_factory.mktemp(request.param) / "tok.json"
    MAKERS[request.param]().save(path)
    return request.param, json.loads(path.read_text("utf-8"))


def write(tmp_path: Path, content: object) -> Path:
    """A file holding `content`: bytes and str as they are, anything else as JSON."""
    path = tmp_path / "damaged.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, "utf-8")
    else:
        path.write_text(json.dumps(content, ensure_ascii=False), "utf-8")
    return path


def refused(path: Path, message: str, loader: type[Tokenizer] = Tokenizer) -> None:
    """`loader.load(path)` raises ValueError: the file's name, then `message` (a regex)."""
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: {message}"):
        loader.load(path)


def changed(data: dict, **fields: object) -> dict:
    return {**data, **fields}


# --- the file as a whole ------------------------------------------------------------------

def test_a_saved_file_loads_with_every_kind_of_loader(saved, tmp_path):
    kind, data = saved
    path = write(tmp_path, data)
    tok = Tokenizer.load(path)
    assert type(tok) is Tokenizer._kinds[kind] and type(tok).load(path).to_dict() == tok.to_dict()


def test_truncated_files_are_refused(saved, tmp_path):
    _, data = saved
    text = json.dumps(data, ensure_ascii=False, indent=1)
    for cut in (0, 1, len(text) // 3, len(text) - 2):
        refused(write(tmp_path, text[:cut]), r"expected a tokenizer saved as JSON, but the "
                r"file is not valid JSON \(.* at line \d+, column \d+; is it truncated\?\)")


@pytest.mark.parametrize("content", ["hello", "{'kind': 'bpe'}", "<html></html>", "{,}"])
def test_files_that_are_not_json_are_refused(tmp_path, content):
    refused(write(tmp_path, content), r"expected a tokenizer saved as JSON, but the file is "
            "not valid JSON")


def test_files_that_are_not_utf8_are_refused(tmp_path):
    refused(write(tmp_path, b'{"kind": "bpe", "pattern": "\xff"}'),
            "expected a tokenizer saved as UTF-8 JSON, but byte 28 is not UTF-8")


@pytest.mark.parametrize("content", [[], [{"kind": "bpe"}], "bpe", 3, None, True])
def test_a_top_level_that_is_not_an_object_is_refused(tmp_path, content):
    got = {list: "a list", str: "the string", int: "the number", type(None): "null",
           bool: "the boolean"}[type(content)]
    refused(write(tmp_path, json.dumps(content)),
            f"expected a JSON object of fields at the top level, got {got}")


def test_a_missing_or_unknown_kind_is_refused(saved, tmp_path):
    kind, data = saved
    refused(write(tmp_path, {k: v for k, v in data.items() if k != "kind"}),
            r"field 'kind': expected a tokenizer of kind .*, the file has no field 'kind'")
    refused(write(tmp_path, changed(data, kind="sentencepiece")),
            r"field 'kind': expected .*'wordpiece'.*, the file has kind 'sentencepiece'")
    refused(write(tmp_path, changed(data, kind=["bpe"])), r"field 'kind': .* has kind \['bpe'\]")
    other = BPETokenizer if kind != "bpe" else UnigramTokenizer
    refused(write(tmp_path, data), f"field 'kind': expected a tokenizer of kind '{other.kind}', "
            f"the file has kind '{kind}'", other)


def test_every_missing_field_is_named(saved, tmp_path):
    kind, data = saved
    for field in REQUIRED[kind][1:]:
        path = write(tmp_path, {k: v for k, v in data.items() if k != field})
        refused(path, f"missing field '{field}': expected ")
        with pytest.raises(ValueError, match=f"^missing field '{field}'"):  # no file: no name
            Tokenizer._kinds[kind].from_dict({k: v for k, v in data.items() if k != field})


@pytest.mark.parametrize("data", [[], "fields", None, 3])
def test_from_dict_wants_a_dict(data):
    for kind in (BPETokenizer, WordPieceTokenizer, UnigramTokenizer):
        with pytest.raises(ValueError, match="expected the fields of a tokenizer as a dict"):
            kind.from_dict(data)


# --- special tokens, shared by every kind -------------------------------------------------

def test_bad_special_tokens_are_refused(saved, tmp_path):
    _, data = saved
    first, first_id = next(iter(data["special_tokens"].items()))
    cases = {
        "a list": ([first], "expected an object of token -> id, got a list"),
        "a string id": ({first: str(first_id)}, rf"expected an integer id >= 0 for "
                        rf"'{re.escape(first)}', got the string '{first_id}'"),
        "a negative id": ({first: -1}, "expected an integer id >= 0 .* got the number -1"),
        "a boolean id": ({first: True}, "expected an integer id >= 0 .* got the boolean True"),
        "an empty token": ({"": 5}, "expected non-empty tokens of valid Unicode, got the "
                           "string ''"),
        "two tokens, one id": ({first: first_id, "<|other|>": first_id}, "expected one id per "
                               rf"token, but '{re.escape(first)}' and '<\|other\|>' both have"),
    }
    for value, message in cases.values():
        refused(write(tmp_path, changed(data, special_tokens=value)),
                f"field 'special_tokens': {message}")


def test_special_tokens_of_a_vocabulary_must_sit_at_their_ids(saved, tmp_path):
    kind, data = saved
    if kind == "bpe":
        size = 256 + len(data["merges"])
        refused(write(tmp_path, changed(data, special_tokens={"<|eot|>": size - 1})),
                rf"field 'special_tokens': expected an id >= {size} \(after the ordinary "
                rf"tokens\) for '<\|eot\|>', got the number {size - 1}")
        return
    unk = data["unk_token"]
    unk_id = data["special_tokens"][unk]
    refused(write(tmp_path, changed(data, special_tokens={unk: unk_id + 1})),
            rf"field 'special_tokens': '{re.escape(unk)}' has id {unk_id + 1}, but the "
            rf"vocabulary has it at id {unk_id}")
    beyond = len(data.get("vocab", data.get("pieces")))
    refused(write(tmp_path, changed(data, special_tokens={**data["special_tokens"],
                                                          "<absent>": beyond})),
            f"field 'special_tokens': '<absent>' has id {beyond}, but the vocabulary has it "
            "nowhere")


# --- byte-level BPE -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def bpe_data(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("bpe") / "tok.json"
    MAKERS["bpe"]().save(path)
    return json.loads(path.read_text("utf-8"))


@pytest.mark.parametrize("line", ["256 257", "1 2 -> x", "a b -> 300", "", "1  2 -> 300",
                                  " 1 2 -> 300", "1 2 -> 300 ", "1 2 → 300", "-1 2 -> 300",
                                  "１ 2 -> 300", 300, None, ["1", "2", "300"]])
def test_malformed_merge_lines_are_refused(bpe_data, tmp_path, line):
    merges = list(bpe_data["merges"])
    merges[3] = line
    refused(write(tmp_path, changed(bpe_data, merges=merges)), r"field 'merges', entry 3: "
            r"expected a line 'left right -> new' of three integers, got ")


def test_two_merges_onto_one_id_are_refused(bpe_data, tmp_path):
    # Loaded, such a file used to decode the first merge's bytes as the second's.
    merges = list(bpe_data["merges"])
    a, b, _ = merges[1].replace(" ->", "").split()
    merges[1] = f"{a} {b} -> 256"
    refused(write(tmp_path, changed(bpe_data, merges=merges)), r"field 'merges', entry 1: "
            r"expected a new id made once \(entry 0 makes it too\), got the string")
    merges = list(bpe_data["merges"])
    merges[5] = merges[0].replace("-> 256", "-> 261")
    refused(write(tmp_path, changed(bpe_data, merges=merges)), r"field 'merges', entry 5: "
            r"expected a pair merged once \(entry 0 merges it too\)")
    with pytest.raises(ValueError, match=r"merges \(97, 98\) and \(99, 100\) both make id 256"):
        BPETokenizer({(97, 98): 256, (99, 100): 256})


@pytest.mark.parametrize(("merges", "message"), [
    (["97 98 -> 257"], r"merge \(97, 98\) -> 257: expected 256 <= new id < 257"),
    (["97 98 -> 100"], r"merge \(97, 98\) -> 100: expected 256 <= new id < 257"),
    (["97 256 -> 256"], r"merge \(97, 256\) -> 256: .* both parts older than the new id"),
    (["97 98 -> 256", "257 97 -> 257"], r"merge \(257, 97\) -> 257: .* both parts older"),
])
def test_merges_that_build_no_vocabulary_are_refused(bpe_data, tmp_path, merges, message):
    data = changed(bpe_data, merges=merges, special_tokens={})
    refused(write(tmp_path, data), f"field 'merges': {message}")


@pytest.mark.parametrize("byte_ids", [" ".join(map(str, range(255))), "0 " * 256, "a b c",
                                      " ".join(map(str, range(1, 257))), "", 7,
                                      list(range(256))])
def test_bad_byte_ids_are_refused(bpe_data, tmp_path, byte_ids):
    message = ("expected a string" if not isinstance(byte_ids, str) else
               "expected the ids of the 256 bytes separated by spaces, a permutation of 0..255")
    refused(write(tmp_path, changed(bpe_data, byte_ids=byte_ids)), f"field 'byte_ids': "
            f"{message}, got ")


@pytest.mark.parametrize(("pattern", "message"), [
    ("(", r"field 'pattern': the split pattern '\(' is not a valid regular expression: "
          "missing \\)"),
    (r"\p{Nonsense}", "field 'pattern': the split pattern .* is not a valid regular expression"),
    (5, "field 'pattern': expected a regular expression \\(a string\\) or null, got the number"),
    ("", "field 'pattern': pattern '' would cut the text into empty chunks"),
])
def test_bad_patterns_are_refused(bpe_data, tmp_path, pattern, message):
    refused(write(tmp_path, changed(bpe_data, pattern=pattern)), message)


def test_merges_must_be_a_list(bpe_data, tmp_path):
    refused(write(tmp_path, changed(bpe_data, merges="97 98 -> 256")),
            r"field 'merges': expected a list of lines 'left right -> new', got the string")


# --- WordPiece ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wordpiece_data(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("wp") / "tok.json"
    MAKERS["wordpiece"]().save(path)
    return json.loads(path.read_text("utf-8"))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("vocab", {"a": 0}, "expected a non-empty list of distinct strings, got an object"),
    ("vocab", [], "expected a non-empty list of distinct strings, got a list"),
    ("vocab", "[UNK] a b", "expected a non-empty list of distinct strings, got the string"),
    ("unk_token", 1, "expected a string, got the number 1"),
    ("unk_token", "<unk>", "expected a token of the field 'vocab', got the string '<unk>'"),
    ("prefix", None, "expected a string, got null"),
    ("max_word_chars", 0, "expected an integer >= 1, got the number 0"),
    ("max_word_chars", "100", "expected an integer >= 1, got the string '100'"),
    ("max_word_chars", True, "expected an integer >= 1, got the boolean True"),
    ("max_word_chars", 100.0, "expected an integer >= 1, got the number 100.0"),
    ("lowercase", "yes", "expected true or false, got the string 'yes'"),
    ("strip_accents", 1, "expected true or false, got the number 1"),
])
def test_mistyped_wordpiece_fields_are_refused(wordpiece_data, tmp_path, field, value,
                                               message):
    refused(write(tmp_path, changed(wordpiece_data, **{field: value})),
            f"field '{field}': {message}", WordPieceTokenizer)


def test_bad_wordpiece_vocabulary_entries_are_refused(wordpiece_data, tmp_path):
    vocab = list(wordpiece_data["vocab"])
    for k, bad, message in [(7, 3, "expected a string \\(of valid Unicode\\), got the number 3"),
                            (7, None, "expected a string .*, got null"),
                            (9, vocab[8], "expected distinct strings \\(entry 8 is the same\\)"),
                            (7, "\ud800", "expected a string \\(of valid Unicode\\)")]:
        path = tmp_path / "damaged.json"  # ensure_ascii writes the lone surrogate as \ud800
        path.write_text(json.dumps(changed(wordpiece_data, vocab=[*vocab[:k], bad,
                                                                  *vocab[k + 1:]])))
        refused(path, f"field 'vocab', entry {k}: {message}")


# --- Unigram ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def unigram_data(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("uni") / "tok.json"
    MAKERS["unigram"]().save(path)
    return json.loads(path.read_text("utf-8"))


@pytest.mark.parametrize(("score", "got"), [
    ("NaN", "the number nan"), ("Infinity", "the number inf"), ("-Infinity", "the number -inf"),
    ('"-1.5"', "the string '-1.5'"), ("null", "null"), ("true", "the boolean True"),
    ("[-1.5]", r"a list \[-1.5\]"),
])
def test_unigram_scores_must_be_finite_numbers(unigram_data, tmp_path, score, got):
    # NaN and Infinity are what Python's json writes for float("nan") and float("inf").
    text = json.dumps(unigram_data).replace(
        json.dumps(unigram_data["pieces"][4]),
        f'[{json.dumps(unigram_data["pieces"][4][0])}, {score}]')
    piece = re.escape(repr(unigram_data["pieces"][4][0]))
    refused(write(tmp_path, text), f"field 'pieces', entry 4: expected a finite number as the "
            f"score of {piece}, got {got}")


@pytest.mark.parametrize(("entry", "got"), [
    ("x", "the string 'x'"), (["x"], r"a list \['x'\]"), (["x", -1.0, 0], "a list"),
    ([3, -1.0], r"a list \[3, -1.0\]"), ({"x": -1.0}, "an object"),
])
def test_unigram_entries_must_be_piece_score_pairs(unigram_data, tmp_path, entry, got):
    pieces = list(unigram_data["pieces"])
    pieces[4] = entry
    refused(write(tmp_path, changed(unigram_data, pieces=pieces)), "field 'pieces', entry 4: "
            f"expected a pair \\[piece, score\\] whose piece is a string, got {got}")


def test_other_unigram_fields_are_checked(unigram_data, tmp_path):
    pieces = list(unigram_data["pieces"])
    refused(write(tmp_path, changed(unigram_data, pieces=[*pieces, pieces[5]])),
            rf"field 'pieces', entry {len(pieces)}: expected distinct pieces \(entry 5 is the "
            "same\\)")
    refused(write(tmp_path, changed(unigram_data, pieces=[])), "field 'pieces': expected a "
            "non-empty list of \\[piece, score\\] pairs, got a list")
    refused(write(tmp_path, changed(unigram_data, pieces={"a": 1})), "field 'pieces': expected "
            "a non-empty list")
    refused(write(tmp_path, changed(unigram_data, unk_token=pieces[5][0])), "field "
            "'unk_token': expected one of the special tokens .*, got the string")


def test_unigram_constructor_checks_scores():
    with pytest.raises(ValueError, match=r"the score of piece 1 \('a'\) must be a finite "
                                         r"number \(a log-probability\), got nan"):
        UnigramTokenizer(["<unk>", "a"], [0.0, float("nan")])
    with pytest.raises(ValueError, match=r"piece 1 \('a'\) must be a finite number.*got -inf"):
        UnigramTokenizer(["<unk>", "a"], [0.0, float("-inf")])
    with pytest.raises(TypeError, match=r"piece 1 \('a'\) must be a finite number.*got '-1.5'"):
        UnigramTokenizer(["<unk>", "a"], [0.0, "-1.5"])
    with pytest.raises(TypeError, match="token 1 must be a str, got int"):
        UnigramTokenizer(["<unk>", 5], [0.0, -1.0])


# --- BERT's vocab.txt ---------------------------------------------------------------------

def test_vocab_txt_with_or_without_a_final_newline(tmp_path):
    path = tmp_path / "vocab.txt"
    for text in ("[UNK]\nhello\n##s", "[UNK]\nhello\n##s\n"):
        path.write_text(text, "utf-8")
        tok = WordPieceTokenizer.from_vocab_file(path)
        assert tok.vocab == ["[UNK]", "hello", "##s"]  # the last token is kept either way
        assert tok.encode("hellos") == [1, 2]


def test_bad_vocab_txt_files_are_refused(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"[UNK]\nh\xe9llo\n")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: expected a vocabulary in "
                                         "UTF-8, but byte 7 is not UTF-8"):
        WordPieceTokenizer.from_vocab_file(path)
    path.write_text("", "utf-8")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: the vocabulary is empty"):
        WordPieceTokenizer.from_vocab_file(path)
    path.write_text("hello\nworld\n", "utf-8")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: the vocabulary must "
                                         "contain the unknown token '\\[UNK\\]'"):
        WordPieceTokenizer.from_vocab_file(path)
