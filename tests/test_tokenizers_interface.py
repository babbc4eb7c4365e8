"""Every tokenizer, trained or loaded, offers the same interface and the same errors."""

import os
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
    with pytest.raises(ValueError, match=f"holds a '{tok.kind}' tokenizer, expected one of"):
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
