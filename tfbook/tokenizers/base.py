"""The interface every tokenizer shares: encode/decode, vocabulary look-ups, special tokens,
and save/load as human-readable JSON.

A subclass provides `_encode_ordinary(text)` (text without special tokens), `_token_bytes(id)`
(what one id stands for), `_num_ordinary()` (ordinary ids are 0..n-1) and
`to_dict()`/`from_dict()`; this base class adds the special-token handling and the error
messages so that all tokenizers behave the same at the edges.

Special tokens follow tiktoken's rule: a special string in the text becomes its special id
only if the caller lists it in `allowed_special`; otherwise it is an error (the default) or,
with `disallowed_special=()`, ordinary text. It is never silently a special id, and a token
named in both lists is disallowed (the text holding it is an error, as in tiktoken).

Text is a `str` of valid Unicode. A lone surrogate (U+D800..U+DFFF, which a `str` can hold
but UTF-8 cannot encode) is a ValueError naming its position; tiktoken instead replaces it
with U+FFFD, which would silently change the text.

A saved file is read with a check on every field: a file that is not JSON, a missing or
mistyped field, a malformed entry, all give one ValueError naming the file, the field and what
was expected (`Fields`).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import regex

AllOrSet = Literal["all"] | Collection[str]
_SURROGATE = regex.compile("[\ud800-\udfff]")


def check_text(text: object, what: str = "text") -> str:
    """Return `text` if it is a str of valid Unicode: TypeError if it is not a str,
    ValueError if it holds a lone surrogate (a code point that has no UTF-8 encoding)."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}: {text!r:.60}")
    if not text.isascii() and (found := _SURROGATE.search(text)):
        raise ValueError(
            f"{what} contains the lone surrogate U+{ord(found.group()):04X} at position "
            f"{found.start()}, which has no UTF-8 encoding: expected valid Unicode text (a "
            "UTF-16 pair written as two code points joins with "
            "text.encode('utf-16', 'surrogatepass').decode('utf-16'))"
        )
    return text


def check_vocab_size(vocab_size: object, minimum: int, why: str) -> int:
    """Raise TypeError/ValueError unless `vocab_size` is an int >= `minimum`."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum} ({why}), got {vocab_size}")
    return vocab_size


class Tokenizer:
    """Common base: text -> ids -> text, with special tokens only when the caller allows them."""

    kind = "base"  # written into saved files, checked on load
    _kinds: dict[str, type[Tokenizer]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in vars(cls):  # a concrete algorithm: Tokenizer.load can now find it
            Tokenizer._kinds[cls.kind] = cls

    def __init__(self, special_tokens: dict[str, int] | None = None) -> None:
        self.special_tokens: dict[str, int] = dict(special_tokens or {})
        self._special_by_id: dict[int, str] = {}
        for token, token_id in self.special_tokens.items():
            check_text(token, "a special token")
            if not token:
                raise ValueError("a special token must not be empty: the empty string would "
                                 "match between every two characters")
            if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
                raise TypeError(f"special token {token!r} needs an int id >= 0, got "
                                f"{token_id!r:.60}")
            if token_id in self._special_by_id:
                raise ValueError(f"special tokens {self._special_by_id[token_id]!r} and "
                                 f"{token!r} both have id {token_id}: expected one id each")
            self._special_by_id[token_id] = token

    # --- to be provided by each algorithm -------------------------------------------------
    def _encode_ordinary(self, text: str) -> list[int]:
        raise NotImplementedError

    def _token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes one (non-special) id decodes to."""
        raise NotImplementedError

    def _num_ordinary(self) -> int:
        """Ordinary (non-special) tokens have the ids 0 .. n-1."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tokenizer:
        """The tokenizer that `to_dict` described; ValueError naming the field if `data`
        does not describe one."""
        raise NotImplementedError

    # --- shared behaviour ----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids: ordinary tokens plus special tokens (max id + 1 if there are gaps)."""
        return max([self._num_ordinary() - 1, *self.special_tokens.values()]) + 1

    def encode(
        self,
        text: str,
        allowed_special: AllOrSet = frozenset(),
        disallowed_special: AllOrSet = "all",
    ) -> list[int]:
        """Text -> ids. Special tokens count only if in `allowed_special` (as in tiktoken).

        A special token that is not allowed raises ValueError if it is in
        `disallowed_special` (default: all of them); pass `disallowed_special=()` to encode it
        as ordinary text instead.
        """
        check_text(text)
        ids: list[int] = []
        for piece, is_special in self._split_special(text, allowed_special, disallowed_special):
            if is_special:
                ids.append(self.special_tokens[piece])
            elif piece:
                ids.extend(self._encode_ordinary(piece))
        return ids

    def tokenize(self, text: str, **options: Any) -> list[str]:
        """Text -> the token strings (`encode` then `id_to_token`), e.g. for display.

        A byte-level token that holds only part of a UTF-8 character shows as U+FFFD.
        """
        return [self.id_to_token(i) for i in self.encode(text, **options)]

    def encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids with every special-token string treated as plain text."""
        return self._encode_ordinary(check_text(text))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Ids -> the raw bytes they stand for (a token may be part of a UTF-8 character)."""
        out = []
        for position, i in enumerate(ids):
            if not hasattr(i, "__index__"):
                raise TypeError(f"ids must be ints, got {type(i).__name__} at position {position}")
            i = i.__index__()  # accepts numpy and torch integers too
            if i in self._special_by_id:
                out.append(self._special_by_id[i].encode("utf-8"))
                continue
            try:
                out.append(self._token_bytes(i))
            except (KeyError, IndexError):
                raise ValueError(
                    f"unknown token id {i} at position {position}: expected an id of this "
                    f"vocabulary (0 <= id < {self.vocab_size})"
                ) from None
        return b"".join(out)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; bytes that do not form valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def id_to_token(self, token_id: int) -> str:
        """The token an id stands for, as text (undecodable bytes shown as U+FFFD)."""
        return self.decode_bytes([token_id]).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int:
        """The id of a token given as text; ValueError if it is not in the vocabulary."""
        check_text(token, "token")
        if token in self.special_tokens:
            return self.special_tokens[token]
        index = self._token_index()
        if token not in index:
            raise ValueError(f"token {token!r} is not in the vocabulary of {self.vocab_size} ids")
        return index[token]

    def _token_index(self) -> dict[str, int]:
        if getattr(self, "_index_cache", None) is None:
            index: dict[str, int] = {}
            for i in range(self._num_ordinary()):
                index.setdefault(self._token_bytes(i).decode("utf-8", errors="replace"), i)
            self._index_cache = index
        return self._index_cache

    def _special_set(self, name: str, value: object) -> set[str]:
        """`allowed_special` or `disallowed_special` as a set of this tokenizer's specials."""
        if isinstance(value, str) and value == "all":
            return set(self.special_tokens)
        if isinstance(value, str):
            raise TypeError(f"{name} must be 'all' or a set of strings, got the string "
                            f"{value!r}; write {{{value!r}}} for a set of one token")
        if not isinstance(value, Iterable):
            raise TypeError(f"{name} must be 'all' or a set of strings, got "
                            f"{type(value).__name__}: {value!r:.60}")
        names = set()
        for token in value:
            if not isinstance(token, str):
                raise TypeError(f"{name} must hold strings, got {type(token).__name__}: "
                                f"{token!r:.60}")
            names.add(token)
        unknown = names - set(self.special_tokens)
        if unknown:
            raise ValueError(f"{name} names tokens this tokenizer does not have: "
                             f"{sorted(unknown)}; its special tokens are "
                             f"{sorted(self.special_tokens)}")
        return names

    def _split_special(
        self, text: str, allowed: AllOrSet, disallowed: AllOrSet
    ) -> Iterator[tuple[str, bool]]:
        """Cut `text` around allowed special tokens: yields (piece, is_special).

        As in tiktoken, `disallowed_special="all"` means every special token that is not
        allowed, while a token listed by name in both sets is disallowed.
        """
        allowed_set = self._special_set("allowed_special", allowed)
        if isinstance(disallowed, str) and disallowed == "all":
            disallowed_set = set(self.special_tokens) - allowed_set
        else:
            disallowed_set = self._special_set("disallowed_special", disallowed)
        for token in sorted(disallowed_set):
            if token in text:
                also = (" (it is in allowed_special too, but a token listed in both is "
                        "disallowed, as in tiktoken)" if token in allowed_set else "")
                raise ValueError(
                    f"text contains the special token {token!r}, which is not allowed{also}: "
                    f"pass allowed_special={{{token!r}}} to encode it as a special id, or "
                    "disallowed_special=() to encode it as ordinary text"
                )
        if not allowed_set:
            yield text, False
            return
        # Longest first, so that a special token that contains another one wins.
        alternatives = sorted(allowed_set, key=len, reverse=True)
        pattern = "(" + "|".join(regex.escape(s) for s in alternatives) + ")"
        for k, piece in enumerate(regex.split(pattern, text)):
            yield piece, k % 2 == 1

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as indented, human-readable JSON (UTF-8)."""
        data = {"kind": self.kind, **self.to_dict(), "special_tokens": self.special_tokens}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", "utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a file written by `save` (`Tokenizer.load` reads any kind).

        Any problem with the file's contents is one ValueError that names the file.
        """
        data = read_json(path)
        expected = sorted(Tokenizer._kinds) if cls is Tokenizer else [cls.kind]
        kind = data.get("kind")
        if kind not in expected:
            got = "no field 'kind'" if "kind" not in data else f"kind {kind!r:.40}"
            raise ValueError(f"{path}: field 'kind': expected a tokenizer of kind "
                             f"{' or '.join(map(repr, expected))}, the file has {got}")
        try:
            return Tokenizer._kinds[kind].from_dict(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        except (KeyError, TypeError, AttributeError, IndexError) as error:
            raise ValueError(f"{path}: the fields do not describe a {kind!r} tokenizer "
                             f"({type(error).__name__}: {error})") from None


def read_json(path: str | Path) -> dict[str, Any]:
    """The JSON object saved in `path`; ValueError naming the file if it is not one."""
    try:
        text = Path(path).read_text("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: expected a tokenizer saved as UTF-8 JSON, but byte "
                         f"{error.start} is not UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: expected a tokenizer saved as JSON, but the file is not "
                         f"valid JSON ({error.msg} at line {error.lineno}, column "
                         f"{error.colno}; is it truncated?)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of fields at the top level, got "
                         f"{describe(data)}")
    return data


def describe(value: object) -> str:
    """A short description of a value read from JSON, for error messages."""
    names = {dict: "an object", list: "a list", str: "the string", bool: "the boolean",
             int: "the number", float: "the number", type(None): "null"}
    name = names.get(type(value), type(value).__name__)
    return name if value is None else f"{name} {value!r:.60}"


_REQUIRED = object()


class Fields:
    """The fields of a saved tokenizer, each read with a check: any problem is a ValueError
    that names the field and says what was expected (`Tokenizer.load` adds the file name).

    >>> Fields({"lowercase": "yes"}).flag("lowercase")
    Traceback (most recent call last):
    ...
    ValueError: field 'lowercase': expected true or false, got the string 'yes'
    """

    def __init__(self, data: object) -> None:
        if not isinstance(data, dict):
            raise ValueError("expected the fields of a tokenizer as a dict (a JSON object), "
                             f"got {describe(data)}")
        self.data = data

    def error(self, name: str, expected: str, got: object, entry: int | None = None
              ) -> ValueError:
        """The ValueError for field `name` (or its entry number `entry`)."""
        where = f"field {name!r}" + ("" if entry is None else f", entry {entry}")
        return ValueError(f"{where}: expected {expected}, got {describe(got)}")

    def get(self, name: str, expected: str, ok: Callable[[Any], bool],
            default: Any = _REQUIRED) -> Any:
        """Field `name` if `ok(value)`; `default` (or an error) if it is missing."""
        if name not in self.data:
            if default is not _REQUIRED:
                return default
            raise ValueError(f"missing field {name!r}: expected {expected}")
        value = self.data[name]
        if not ok(value):
            raise self.error(name, expected, value)
        return value

    def text(self, name: str) -> str:
        """A string field (of valid Unicode)."""
        return self.get(name, "a string", is_unicode)

    def flag(self, name: str) -> bool:
        """A true/false field."""
        return self.get(name, "true or false", lambda v: isinstance(v, bool))

    def integer(self, name: str, minimum: int) -> int:
        """An integer field of at least `minimum`."""
        return self.get(name, f"an integer >= {minimum}",
                        lambda v: is_int(v) and v >= minimum)

    def items(self, name: str, expected: str) -> list[Any]:
        """A non-empty list field; `expected` describes one entry."""
        return self.get(name, f"a non-empty list of {expected}",
                        lambda v: isinstance(v, list) and len(v) > 0)

    def strings(self, name: str) -> list[str]:
        """A non-empty list of distinct strings."""
        values = self.items(name, "distinct strings")
        first: dict[str, int] = {}
        for k, value in enumerate(values):
            if not is_unicode(value):
                raise self.error(name, "a string (of valid Unicode)", value, k)
            if value in first:
                raise self.error(name, f"distinct strings (entry {first[value]} is the same)",
                                 value, k)
            first[value] = k
        return values

    def special_tokens(self) -> dict[str, int]:
        """The special tokens: an object of token -> id (empty if missing)."""
        specials = self.get("special_tokens", "an object of token -> id",
                            lambda v: isinstance(v, dict), default={})
        token_of_id: dict[int, str] = {}
        for token, token_id in specials.items():
            if not token or not is_unicode(token):
                raise ValueError(f"field 'special_tokens': expected non-empty tokens of valid "
                                 f"Unicode, got {describe(token)}")
            if not is_int(token_id) or token_id < 0:
                raise ValueError(f"field 'special_tokens': expected an integer id >= 0 for "
                                 f"{token!r}, got {describe(token_id)}")
            if token_id in token_of_id:
                raise ValueError(f"field 'special_tokens': expected one id per token, but "
                                 f"{token_of_id[token_id]!r} and {token!r} both have "
                                 f"{token_id}")
            token_of_id[token_id] = token
        return specials

    def specials_at_their_ids(self, tokens: list[str]) -> list[str]:
        """The special tokens, each checked to sit at its id in `tokens` (the vocabulary)."""
        specials = self.special_tokens()
        for token, token_id in specials.items():
            if token_id >= len(tokens) or tokens[token_id] != token:
                where = (f"at id {tokens.index(token)}" if token in tokens
                         else "nowhere in the vocabulary")
                raise ValueError(f"field 'special_tokens': {token!r} has id {token_id}, but "
                                 f"the vocabulary has it {where}")
        return list(specials)


def is_unicode(value: object) -> bool:
    """A str without lone surrogates (JSON can spell one as "\\ud800")."""
    return isinstance(value, str) and not _SURROGATE.search(value)


def is_int(value: object) -> bool:
    """An integer and not a bool (JSON's true is no number)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A finite real number (not a bool, not a string, not NaN or infinite)."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


class StringVocabTokenizer(Tokenizer):
    """A tokenizer whose vocabulary is a list of strings: `tokens[i]` is the token of id i
    (WordPiece and Unigram; byte-level BPE stores bytes instead)."""

    def __init__(self, tokens: Iterable[str], special_tokens: Iterable[str]) -> None:
        self.tokens = list(tokens)
        if not self.tokens:
            raise ValueError("the vocabulary is empty: expected at least one token")
        self.ids: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
            if not isinstance(token, str):
                raise TypeError(f"token {i} must be a str, got {type(token).__name__}: "
                                f"{token!r:.60}")
            self.ids.setdefault(token, i)
        super().__init__({s: self.ids[s] for s in special_tokens if s in self.ids})

    def _token_bytes(self, token_id: int) -> bytes:
        if token_id < 0:
            raise IndexError(token_id)
        return self.tokens[token_id].encode("utf-8")

    def _num_ordinary(self) -> int:
        return len(self.tokens)

    def _token_index(self) -> dict[str, int]:
        return self.ids
