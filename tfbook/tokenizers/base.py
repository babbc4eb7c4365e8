"""The interface every tokenizer shares: encode/decode, vocabulary look-ups, special tokens,
and save/load as human-readable JSON.

A subclass provides `_encode_ordinary(text)` (text without special tokens), `_token_bytes(id)`
(what one id stands for), `_num_ordinary()` (ordinary ids are 0..n-1) and
`to_dict()`/`from_dict()`; this base class adds the special-token handling and the error
messages so that all tokenizers behave the same at the edges.

Special tokens follow tiktoken's rule: a special string in the text becomes its special id
only if the caller lists it in `allowed_special`; otherwise it is an error (the default) or,
with `disallowed_special=()`, ordinary text. It is never silently a special id.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import regex

AllOrSet = Literal["all"] | Collection[str]


def check_text(text: object, what: str = "text") -> str:
    """Raise TypeError unless `text` is a str; return it."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}: {text!r:.60}")
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
        self._special_by_id = {i: s for s, i in self.special_tokens.items()}

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

    def _split_special(
        self, text: str, allowed: AllOrSet, disallowed: AllOrSet
    ) -> Iterator[tuple[str, bool]]:
        """Cut `text` around allowed special tokens: yields (piece, is_special)."""
        for name, value in (("allowed_special", allowed), ("disallowed_special", disallowed)):
            if isinstance(value, str) and value != "all":
                raise TypeError(f"{name} must be 'all' or a set of strings, got the string "
                                f"{value!r}; write {{{value!r}}} for a set of one token")
        allowed_set = set(self.special_tokens) if allowed == "all" else set(allowed)
        unknown = allowed_set - set(self.special_tokens)
        if unknown:
            raise ValueError(
                f"allowed_special names tokens this tokenizer does not have: {sorted(unknown)};"
                f" its special tokens are {sorted(self.special_tokens)}"
            )
        disallowed_set = set(self.special_tokens) if disallowed == "all" else set(disallowed)
        for token in sorted(disallowed_set - allowed_set):
            if token in text:
                raise ValueError(
                    f"text contains the special token {token!r}, which is not allowed: pass "
                    f"allowed_special={{{token!r}}} to encode it as a special id, or "
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
        """Read a file written by `save` (`Tokenizer.load` reads any kind)."""
        data = json.loads(Path(path).read_text("utf-8"))
        kind = data.get("kind")
        expected = sorted(Tokenizer._kinds) if cls is Tokenizer else [cls.kind]
        if kind not in expected:
            raise ValueError(f"{path} holds a {kind!r} tokenizer, expected one of {expected}")
        return Tokenizer._kinds[kind].from_dict(data)


class StringVocabTokenizer(Tokenizer):
    """A tokenizer whose vocabulary is a list of strings: `tokens[i]` is the token of id i
    (WordPiece and Unigram; byte-level BPE stores bytes instead)."""

    def __init__(self, tokens: Iterable[str], special_tokens: Iterable[str]) -> None:
        self.tokens = list(tokens)
        self.ids: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
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
