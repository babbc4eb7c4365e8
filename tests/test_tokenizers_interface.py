"""Every tokenizer, trained or loaded, offers the same interface and the same errors."""

import os
import re
import subprocess
import sys

import pytest

from tfbook.corpus import stdlib_corpus
from tfbook.tokenizers import (
    BPETokenizer,
    Tokenizer,
    UnigramTokenizer,
    WordPieceTokenizer,
    load_cl100k,
    load_gpt2,
    load_minilm_wordpiece,
)

MAKERS = {
    "bpe": lambda: BPETokenizer.train(stdlib_corpus(30_000), 400, special_tokens=["<|eot|>"]),
    "wordpiece": lambda: WordPieceTokenizer.train(stdlib_corpus(30_000), 400),
    "unigram": lambda: UnigramTokenizer.train(stdlib_corpus(30_000), 300),
    "gpt2": load_gpt2,
    "cl100k": load_cl100k,
    "minilm": load_minilm_wordpiece,
}


@pytest.fixture(scope="module", params=list(MAKERS))
def tok(request):
    return MAKERS[request.param]()


def test_encode_gives_ids_in_range(tok):
    ids = tok.encode(stdlib_corpus(2_000))
    assert ids and all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.encode("") == []


def test_id_and_token_look_ups_agree(tok):
    for i in range(0, tok.vocab_size, max(1, tok.vocab_size // 300)):
        token = tok.id_to_token(i)
        if "\ufffd" not in token:  # ids that are only part of a UTF-8 character
            assert tok.id_to_token(tok.token_to_id(token)) == token


def test_special_tokens_are_never_silent(tok):
    for special, special_id in tok.special_tokens.items():
        with pytest.raises(ValueError, match="not allowed"):
            tok.encode(f"x {special} y")
        assert special_id not in tok.encode(f"x {special} y", disallowed_special=())
        assert special_id in tok.encode(f"x {special} y", allowed_special={special})


def test_errors_say_what_was_expected(tok):
    with pytest.raises(TypeError, match="allowed_special must be 'all' or a set of strings"):
        tok.encode("abc", allowed_special="<|endoftext|>")
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        tok.encode(b"abc")
    with pytest.raises(ValueError, match=f"unknown token id {tok.vocab_size} at position 0"):
        tok.decode([tok.vocab_size])


def test_tokenize_shows_the_tokens(tok):
    text = "Tokenizers split text."
    tokens = tok.tokenize(text)
    assert len(tokens) == len(tok.encode(text))
    assert "".join(tokens).replace("##", "").replace("▁", " ").replace(" ", "").lower() == (
        text.replace(" ", "").lower())


def test_save_then_load_any_kind(tok, tmp_path):
    path = tmp_path / "tok.json"
    tok.save(path)
    loaded = Tokenizer.load(path)
    assert type(loaded) is type(tok)
    text = stdlib_corpus(3_000)
    assert loaded.encode(text) == tok.encode(text)
    other = BPETokenizer if not isinstance(tok, BPETokenizer) else WordPieceTokenizer
    with pytest.raises(ValueError, match=f"field 'kind': expected a tokenizer of kind "
                                         f"'{other.kind}', the file has kind '{tok.kind}'"):
        other.load(path)


def test_training_does_not_depend_on_the_hash_seed():
    code = """
import hashlib, json
from tfbook.corpus import stdlib_corpus
from tfbook.tokenizers import BPETokenizer, UnigramTokenizer, WordPieceTokenizer
text = stdlib_corpus(15_000)
tokenizers = [BPETokenizer.train(text, 300), WordPieceTokenizer.train(text, 300),
              UnigramTokenizer.train(text, 300)]
print(hashlib.sha256(json.dumps([t.to_dict() for t in tokenizers]).encode()).hexdigest())
"""
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2")}
    assert len(digests) == 1


# --- bad text: every kind refuses it the same way -----------------------------------------

@pytest.mark.parametrize("text", [None, b"abc", 3, ["a"], bytearray(b"a")])
def test_text_that_is_not_a_str_is_a_type_error(tok, text):
    name = type(text).__name__
    for method in (tok.encode, tok.encode_ordinary, tok.tokenize):
        with pytest.raises(TypeError, match=f"^text must be a str, got {name}"):
            method(text)
    with pytest.raises(TypeError, match=f"^token must be a str, got {name}"):
        tok.token_to_id(text)


@pytest.mark.parametrize(("text", "code_point", "position"), [
    ("a\ud800b", "D800", 1), ("\udfff", "DFFF", 0), ("héllo \udc80", "DC80", 6),
    ("x\ud83d\ude00", "D83D", 1),  # a UTF-16 pair written as two code points
])
def test_lone_surrogates_are_refused_by_every_kind(tok, text, code_point, position):
    # tiktoken replaces them with U+FFFD (see test_tokenizers_pretrained.py); tfbook refuses.
    message = (f"^text contains the lone surrogate U\\+{code_point} at position {position}, "
               "which has no UTF-8 encoding: expected valid Unicode text")
    for method in (tok.encode, tok.encode_ordinary, tok.tokenize):
        with pytest.raises(ValueError, match=message):
            method(text)
    with pytest.raises(ValueError, match=message.replace("^text", "^token")):
        tok.token_to_id(text)


def test_a_joined_surrogate_pair_encodes_like_the_character(tok):
    with pytest.raises(ValueError, match="text.encode\\('utf-16', 'surrogatepass'\\)"):
        tok.encode("\ud83d\ude00")
    joined = "\ud83d\ude00".encode("utf-16", "surrogatepass").decode("utf-16")
    assert joined == "😀" and tok.encode(joined) == tok.encode("😀")


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_training_text_is_checked(kind):
    train = {"bpe": BPETokenizer.train, "wordpiece": WordPieceTokenizer.train,
             "unigram": UnigramTokenizer.train}[kind]
    with pytest.raises(ValueError, match="text contains the lone surrogate U\\+D800 at "
                                         "position 5"):
        train("hello\ud800 world", 300)
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        train(b"hello world", 300)


def test_a_special_token_both_allowed_and_disallowed_is_disallowed(tok):
    for special in tok.special_tokens:
        with pytest.raises(ValueError, match=f"text contains the special token "
                                             f"{re.escape(repr(special))}, which is not allowed "
                                             r"\(it is in allowed_special too"):
            tok.encode(f"x {special} y", allowed_special={special}, disallowed_special={special})
        with pytest.raises(ValueError, match="in allowed_special too"):
            tok.encode(f"x {special} y", allowed_special="all", disallowed_special={special})
        # as in tiktoken, the check looks at the text: without the token there is no error
        assert tok.encode("x y", allowed_special={special}, disallowed_special={special}) == (
            tok.encode("x y"))


def test_bad_special_token_arguments(tok):
    for name in ("allowed_special", "disallowed_special"):
        with pytest.raises(ValueError, match=f"{name} names tokens this tokenizer does not "
                                             r"have: \['<\|nope\|>'\]"):
            tok.encode("abc", **{name: {"<|nope|>"}})
        with pytest.raises(TypeError, match=f"{name} must hold strings, got int: 5"):
            tok.encode("abc", **{name: {5}})
        with pytest.raises(TypeError, match=f"{name} must be 'all' or a set of strings, got "
                                            "int: 5"):
            tok.encode("abc", **{name: 5})
        with pytest.raises(TypeError, match=f"{name} must be 'all' or a set of strings, got "
                                            "the string 'none'"):
            tok.encode("abc", **{name: "none"})
