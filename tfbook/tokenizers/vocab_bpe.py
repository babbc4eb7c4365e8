"""Byte-level BPE over a vocabulary given as a list of token strings (GGUF, HF tokenizer.json).

`BPETokenizer` assigns its own ids: 256 single bytes first, then one id per merge, so that
an id doubles as the merge's rank. A released vocabulary numbers its tokens its own way.
SmolLM2's, for example, starts with 17 special tokens, then the single bytes, then the
merges, and 21 byte values have no token at all. `VocabBPETokenizer` takes the vocabulary
as it is: `tokens[i]` is the token of id i, written in GPT-2's printable alphabet (one
character per byte, see `gpt2_byte_chars`), and `merges` lists the pairs in rank order.

Encoding is the usual byte-level BPE: pre-split the text, turn each chunk into the ids of
its bytes, apply the merges lowest rank first (`merge_by_rank`). Pre-splitting may take
several patterns applied one after the other (as llama.cpp does): each pattern cuts every
piece left by the previous one, keeping both the matches and the text between them.

A byte with no token cannot be encoded. Hugging Face's `tokenizers` (BPE without byte
fallback and without an unknown token) drops such a byte without a word; tfbook raises a
ValueError naming the byte values and where the first one is, because a tokenizer that
loses part of its input gives a silently wrong answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tfbook.tokenizers.base import AllOrSet, Tokenizer, check_text
from tfbook.tokenizers.bpe import Pair, encode_chunks, merge_by_rank
from tfbook.tokenizers.pretokenize import GPT2_SPLIT_PATTERN, compile_pattern
from tfbook.tokenizers.pretrained import gpt2_byte_chars


def staged_split(text: str, patterns: Sequence[str]) -> list[str]:
    """Cut text with each pattern in turn, keeping matches and the gaps between them.

    >>> staged_split("abc 123", [r"\\p{N}", GPT2_SPLIT_PATTERN])
    ['abc', ' ', '1', '2', '3']
    """
    pieces = [text]
    for pattern in patterns:
        splitter = compile_pattern(f"(?:{pattern})").finditer
        cut: list[str] = []
        for piece in pieces:
            start = 0
            for match in splitter(piece):
                if match.start() > start:
                    cut.append(piece[start : match.start()])  # the gap before the match
                if match.end() > match.start():
                    cut.append(match.group())
                start = match.end()
            if start < len(piece):
                cut.append(piece[start:])
        pieces = cut
    return pieces


class VocabBPETokenizer(Tokenizer):
    """Byte-level BPE with the ids of a given vocabulary and merges ranked by their order.

    `tokens[i]` is token i in GPT-2's printable byte alphabet (" the" is written "Ġthe");
    `merges[k] = (left, right)` is the merge of rank k, and `left + right` must be a token.
    The special tokens are named by their strings, which are tokens of the list.
    """

    kind = "vocab_bpe"
    cache_max_chars = 64  # chunks up to this length stay in the cache between calls
    cache_max_entries = 500_000  # the cache is emptied when it grows beyond this

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[tuple[str, str]],
        patterns: Sequence[str] = (GPT2_SPLIT_PATTERN,),
        special_tokens: Iterable[str] = (),
        bos_id: int | None = None,
        eos_id: int | None = None,
    ) -> None:
        self.tokens = list(tokens)
        self.patterns = tuple(patterns)
        ids: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
            if token in ids:
                raise ValueError(f"token {token!r} appears twice, as ids {ids[token]} and {i}: "
                                 "expected every token string once")
            ids[token] = i
        specials = list(special_tokens)
        unknown = [s for s in specials if s not in ids]
        if unknown:
            raise ValueError(f"special tokens {unknown} are not in the vocabulary")
        super().__init__({s: ids[s] for s in specials})
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            if value is not None and not 0 <= value < len(self.tokens):
                raise ValueError(f"{name} must be an id of the vocabulary (0 <= id < "
                                 f"{len(self.tokens)}), got {value}")
        self.bos_id, self.eos_id = bos_id, eos_id

        byte_of = {c: b for b, c in enumerate(gpt2_byte_chars())}  # printable char -> byte
        self.token_bytes: list[bytes] = []  # id -> the bytes it stands for
        for i, token in enumerate(self.tokens):
            if i in self._special_by_id:
                self.token_bytes.append(token.encode("utf-8"))
                continue
            strange = [c for c in token if c not in byte_of]
            if strange:
                raise ValueError(f"token {i} ({token!r}) has characters outside GPT-2's byte "
                                 f"alphabet: {strange[:3]}; expected byte-level tokens")
            self.token_bytes.append(bytes(byte_of[c] for c in token))
        # byte_ids[b] is the id of the single byte b, or None when no token holds it alone.
        self.byte_ids: list[int | None] = [ids.get(c) for c in gpt2_byte_chars()]
        self.missing_bytes = bytes(b for b in range(256) if self.byte_ids[b] is None)
        self._present_bytes = bytes(b for b in range(256) if self.byte_ids[b] is not None)

        self.merges: dict[Pair, int] = {}  # (left id, right id) -> merged id
        previous = -1
        for rank, (left, right) in enumerate(merges):
            if left not in ids or right not in ids or left + right not in ids:
                raise ValueError(f"merge {rank} ({left!r}, {right!r}): expected both parts and "
                                 "their concatenation to be tokens of the vocabulary")
            new_id = ids[left + right]
            # merge_by_rank applies the smallest merged id first: that must be rank order.
            if new_id <= previous:
                raise ValueError(f"merge {rank} ({left!r}, {right!r}) makes id {new_id}, "
                                 f"expected ids that grow with the rank (previous {previous})")
            self.merges[ids[left], ids[right]] = previous = new_id
        self._cache: dict[str, list[int]] = {}

    # --- encoding -------------------------------------------------------------------------
    def check_encodable(self, text: str) -> None:
        """Raise ValueError if `text` holds a byte with no token (or a lone surrogate)."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"text contains the lone surrogate U+{ord(text[error.start]):04X} at position "
                f"{error.start}, which has no UTF-8 encoding: expected valid Unicode text"
            ) from None
        found = data.translate(None, self._present_bytes)  # the bytes that have no token
        if not found:
            return
        missing = set(found)
        position, char = next((k, c) for k, c in enumerate(text)
                              if missing.intersection(c.encode("utf-8")))
        listing = ", ".join(f"0x{b:02X}" for b in sorted(missing))
        raise ValueError(
            f"the vocabulary has no token for the byte(s) {listing} in the text (the first in "
            f"character {position}, {char!r} = U+{ord(char):04X}); expected text whose UTF-8 "
            "bytes all have a token (Hugging Face's tokenizer would drop them silently)"
        )

    def encode(
        self,
        text: str,
        allowed_special: AllOrSet = frozenset(),
        disallowed_special: AllOrSet = "all",
    ) -> list[int]:
        """Text -> ids, as `Tokenizer.encode`; ValueError for a byte that has no token."""
        self.check_encodable(check_text(text))  # positions counted in the whole text
        return super().encode(text, allowed_special, disallowed_special)

    def encode_chunk(self, chunk: bytes) -> list[int]:
        """Encode one pre-split chunk given as bytes (every byte must have a token)."""
        ids = [self.byte_ids[b] for b in chunk]
        return merge_by_rank(ids, self.merges) if len(ids) > 1 else ids  # type: ignore[arg-type]

    def _encode_ordinary(self, text: str) -> list[int]:
        self.check_encodable(text)
        return encode_chunks(staged_split(text, self.patterns), self.encode_chunk, self._cache,
                             self.cache_max_entries, self.cache_max_chars)

    # --- vocabulary -----------------------------------------------------------------------
    def _token_bytes(self, token_id: int) -> bytes:
        if token_id < 0:
            raise IndexError(token_id)
        return self.token_bytes[token_id]

    def _num_ordinary(self) -> int:
        return len(self.tokens)  # special tokens sit among them, at their own ids

    # --- saving ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Tokens in id order, one "left right" line per merge in rank order, the patterns."""
        in_rank_order = sorted(self.merges, key=self.merges.__getitem__)  # merged ids grow
        merges = [f"{self.tokens[a]} {self.tokens[b]}" for a, b in in_rank_order]
        return {"patterns": list(self.patterns), "bos_id": self.bos_id, "eos_id": self.eos_id,
                "tokens": self.tokens, "merges": merges}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VocabBPETokenizer:
        merges = [tuple(line.split(" ")) for line in data["merges"]]
        return cls(data["tokens"], merges, data["patterns"],  # type: ignore[arg-type]
                   data.get("special_tokens", {}), data.get("bos_id"), data.get("eos_id"))
