"""Pre-tokenization: cut text into chunks before the subword algorithm sees it.

Byte-level BPE (GPT-2, GPT-4) splits with a regular expression so that merges never cross a
word/number/punctuation boundary. BERT cleans and normalizes the text, then splits on
whitespace and punctuation.
"""

from __future__ import annotations

import functools
import unicodedata

import regex

# GPT-2's split pattern (r50k/p50k/gpt2 in tiktoken, written with possessive quantifiers):
# contractions | optional space + letters | optional space + digits |
# optional space + other symbols | whitespace not followed by a non-space | lone whitespace.
GPT2_SPLIT_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)

# GPT-4's (cl100k_base) pattern: case-insensitive contractions, a letter run may take one
# leading non-letter, digits in groups of at most 3, newlines kept apart from other spaces.
GPT4_SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


@functools.lru_cache(maxsize=16)
def compile_pattern(pattern: str) -> regex.Pattern:
    """Compile a split pattern once (the `regex` package knows \\p{L} and possessives)."""
    return regex.compile(pattern)


def regex_split(text: str, pattern: str = GPT4_SPLIT_PATTERN) -> list[str]:
    """Cut text into chunks with a split pattern; the chunks concatenate back to `text`.

    >>> regex_split("Hello world's 12345!!")
    ['Hello', ' world', "'s", ' ', '123', '45', '!!']
    """
    return compile_pattern(pattern).findall(text)


# --- BERT's basic pre-processing ---------------------------------------------------------

# Control, format, private-use and surrogate characters (Cc, Cf, Co, Cs) are deleted, except
# \t \n \r which count as whitespace; NUL and U+FFFD too. Unassigned code points (Cn) stay.
_BERT_DELETE = regex.compile(r"[\x00\ufffd]|(?![\t\n\r])[\p{Cc}\p{Cf}\p{Co}\p{Cs}]")
_BERT_SPACE = regex.compile(r"\s")
# CJK Unified Ideographs blocks (not Hangul or kana): BERT puts spaces around each one.
# Google's BERT starts the Extension E block at U+2B820; HF tokenizers, whose ids we match,
# starts it at U+2B920, so U+2B820..U+2B91F are not spaced out here.
_CJK = regex.compile(
    "([\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f"
    "\U0002b740-\U0002b81f\U0002b920-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f])"
)
_MARKS = regex.compile(r"\p{Mn}")
# BERT's punctuation: every ASCII non-alphanumeric printable character plus Unicode P*.
_PUNCT = r"!-/:-@\[-`{-~\p{P}"
_BERT_WORDS = regex.compile(rf"[^\s{_PUNCT}]+|[{_PUNCT}]")


def bert_normalize(text: str, lowercase: bool = True, strip_accents: bool = True) -> str:
    """BERT's normalizer: drop control chars, map whitespace to ' ', space out CJK, strip
    accents (NFD, drop non-spacing marks), lowercase.

    >>> bert_normalize("Héllo\\tWörld 東京")
    'hello world  東  京 '
    """
    text = _BERT_DELETE.sub("", text)
    text = _BERT_SPACE.sub(" ", text)
    text = _CJK.sub(r" \1 ", text)
    if strip_accents and not text.isascii():
        text = _MARKS.sub("", unicodedata.normalize("NFD", text))
    return text.lower() if lowercase else text


def bert_pretokenize(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """BERT's basic tokenizer: normalize, then split on whitespace and around punctuation.

    >>> bert_pretokenize("Don't stop, BERT!")
    ['don', "'", 't', 'stop', ',', 'bert', '!']
    """
    return _BERT_WORDS.findall(bert_normalize(text, lowercase, strip_accents))
