"""Pre-tokenization: cut text into chunks before the subword algorithm sees it.

Byte-level BPE (GPT-2, GPT-4) splits with a regular expression so that merges never cross a
word/number/punctuation boundary. BERT cleans and normalizes the text, then splits on
whitespace and punctuation.
"""

from __future__ import annotations

import functools
import string
import unicodedata
from collections.abc import Callable

import regex

from tfbook.tokenizers.base import check_text

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


def compile_pattern(pattern: str) -> regex.Pattern:
    """Compile a split pattern (the `regex` package knows \\p{L} and possessives).

    A pattern that is not a str is a TypeError, one that does not compile a ValueError.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"a split pattern must be a str (a regular expression), got "
                        f"{type(pattern).__name__}: {pattern!r:.60}")
    return _compile(pattern)


@functools.lru_cache(maxsize=16)
def _compile(pattern: str) -> regex.Pattern:
    try:
        return regex.compile(pattern)
    except regex.error as error:
        raise ValueError(f"the split pattern {pattern!r:.80} is not a valid regular expression:"
                         f" {error}") from None


def regex_split(text: str, pattern: str = GPT4_SPLIT_PATTERN) -> list[str]:
    """Cut text into chunks with a split pattern; the chunks concatenate back to `text`.

    >>> regex_split("Hello world's 12345!!")
    ['Hello', ' world', "'s", ' ', '123', '45', '!!']
    """
    return compile_pattern(pattern).findall(check_text(text))


# --- BERT's basic pre-processing ---------------------------------------------------------
#
# The rules are those of Hugging Face's `BertNormalizer` and `BertPreTokenizer`, whose ids
# MiniLM's tokenizer.json gives, with every character judged by its general category in
# Python's `unicodedata`. Each rule looks at one character alone, so each step is one
# `str.translate` through a `CharTable`, which works a character out the first time it meets it.

# CJK Unified Ideographs blocks (not Hangul or kana): BERT puts spaces around each one.
# Google's BERT starts the Extension E block at U+2B820; HF tokenizers, whose ids we match,
# starts it at U+2B920, so U+2B820..U+2B91F are not spaced out here.
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
_CJK_FIRST = min(lo for lo, _ in CJK_RANGES)  # most characters come before every block


class CharTable(dict[int, str]):
    """A `str.translate` table filled on demand: code point -> `rule(character)`.

    >>> "abc".translate(CharTable(str.upper))
    'ABC'
    """

    def __init__(self, rule: Callable[[str], str]) -> None:
        super().__init__()
        self.rule = rule

    def __missing__(self, code_point: int) -> str:
        value = self[code_point] = self.rule(chr(code_point))
        return value


def bert_clean_char(c: str) -> str:
    """BERT's cleaning of one character: a space, deleted (''), spaced out (CJK) or kept.

    Whitespace is Unicode's White_Space: tab, newline, carriage return and the separators
    (Zs, Zl, Zp). Deleted: NUL, U+FFFD, the other control characters (Cc), format (Cf) and
    private-use (Co) characters. Unassigned code points (Cn) are kept.
    """
    category = unicodedata.category(c)
    if c in "\t\n\r" or category in ("Zs", "Zl", "Zp"):
        return " "
    if c in "\x00\ufffd" or category in ("Cc", "Cf", "Co"):
        return ""
    return f" {c} " if is_cjk_ideograph(c) else c


def is_cjk_ideograph(c: str) -> bool:
    """Whether `c` lies in one of the CJK ideograph blocks that BERT spaces out."""
    code_point = ord(c)
    return code_point >= _CJK_FIRST and any(lo <= code_point <= hi for lo, hi in CJK_RANGES)


def bert_accent_and_case(c: str, strip_accents: bool, lowercase: bool) -> str:
    """One character after accent stripping (a non-spacing mark, Mn, is dropped) and
    lowercasing (`c.lower()` of the character alone)."""
    if strip_accents and unicodedata.category(c) == "Mn":
        return ""
    return c.lower() if lowercase else c


def is_bert_punctuation(c: str) -> bool:
    """BERT's punctuation: ASCII's 32 non-alphanumeric printable characters and the Unicode
    punctuation categories (P*).

    The ASCII rule also takes in the nine symbols of categories S* (``$ + < = > ^ ` | ~``),
    so `bert_pretokenize("a$b+c")` gives ['a', '$', 'b', '+', 'c'].
    """
    return c in string.punctuation or unicodedata.category(c).startswith("P")


_CLEAN = CharTable(bert_clean_char)
_ACCENT_AND_CASE = {
    (strip, lower): CharTable(functools.partial(bert_accent_and_case, strip_accents=strip,
                                                lowercase=lower))
    for strip in (False, True) for lower in (False, True)
}
_PUNCTUATION_SPACED = CharTable(lambda c: f" {c} " if is_bert_punctuation(c) else c)


def bert_normalize(text: str, lowercase: bool = True, strip_accents: bool = True) -> str:
    """BERT's normalizer: clean (control characters out, whitespace to ' '), space out CJK
    ideographs, strip accents (NFD, drop non-spacing marks), lowercase.

    It follows Hugging Face `tokenizers`' BertNormalizer, which strips accents, then
    lowercases, one character at a time. Google's BERT code (and HF's slow Python
    BertTokenizer) lowercases each whole word with `str.lower()` first and strips accents
    second. The order changes no character, but `str.lower()` of a whole word gives a
    capital sigma at its end the final form: "ΟΔΟΣ" -> "οδος" there, "οδοσ" here and in
    HF's Rust normalizer.

    >>> bert_normalize("Héllo\\tWörld 東京")
    'hello world  東  京 '
    """
    text = check_text(text).translate(_CLEAN)
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    return text.translate(_ACCENT_AND_CASE[bool(strip_accents), bool(lowercase)])


def bert_pretokenize(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """BERT's basic tokenizer: normalize, then split on spaces and around punctuation.

    >>> bert_pretokenize("Don't stop, BERT!")
    ['don', "'", 't', 'stop', ',', 'bert', '!']
    """
    spaced = bert_normalize(text, lowercase, strip_accents).translate(_PUNCTUATION_SPACED)
    return [word for word in spaced.split(" ") if word]
