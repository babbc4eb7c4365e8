"""Byte-level byte-pair encoding (BPE), as in GPT-2 and GPT-4.

Training: start from the 256 byte values, repeatedly merge the most frequent adjacent pair
into a new token. Encoding: apply the learned merges to new text, lowest rank first.

Three ideas make it fast enough for a megabyte of text in pure Python:

1. Train on the *unique* pre-split chunks with their counts, not on the raw text.
2. After a merge, update the pair counts only for the chunks that contained the pair
   (`PairIndex`), and keep candidates in a heap instead of re-counting everything.
3. Encode a chunk with a heap of merge candidates over a linked list of tokens, so a
   20,000-byte chunk costs O(n log n) rather than O(n^2), and cache chunk encodings.

Tie-breaking: among pairs with the same count, training merges by default the smallest
(left id, right id); with `tie_break="greatest_bytes"` it merges the pair whose
(left bytes, right bytes) is greatest, the rule of the reference trainer of Stanford's CS336
assignment 1. During encoding, among equal ranks the leftmost pair merges first (as tiktoken
does).
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, pairwise
from typing import Any

import regex

from tfbook.tokenizers.base import Fields, Tokenizer, check_text, check_vocab_size, is_int
from tfbook.tokenizers.pretokenize import GPT4_SPLIT_PATTERN, compile_pattern

Pair = tuple[int, int]
TIE_BREAKS = ("smallest_ids", "greatest_bytes")  # the orders `BPETokenizer.train` accepts
_MERGE_LINE = regex.compile(r"([0-9]+) ([0-9]+) -> ([0-9]+)")  # "left right -> new"


def count_pairs(ids: Sequence[int]) -> Counter[Pair]:
    """Count adjacent pairs: [1, 2, 3, 1, 2] -> {(1, 2): 2, (2, 3): 1, (3, 1): 1}."""
    return Counter(pairwise(ids))


def merge_pair(ids: Sequence[int], pair: Pair, new_id: int) -> list[int]:
    """Replace each occurrence of `pair`, left to right: [1, 2, 3, 1, 2], (1, 2), 4 -> [4, 3, 4]."""
    out: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def splitter(pattern: str | None) -> Callable[[str], list[str]]:
    """The pre-split of a pattern: its `findall`, or the whole text as one chunk for None."""
    if pattern is None:
        return lambda text: [text]
    if pattern == "":
        raise ValueError("pattern '' would cut the text into empty chunks: pass a regular "
                         "expression, or pattern=None for no pre-split")
    return compile_pattern(pattern).findall


class PairIndex:
    """Unique words (id lists) with their counts, the count of every adjacent pair, and the
    words each pair occurs in; `merge` updates all three touching only the affected words."""

    def __init__(self, words: list[list[int]], counts: list[int]) -> None:
        self.words = words
        self.word_counts = counts
        self.pair_counts: dict[Pair, int] = defaultdict(int)
        self.where: dict[Pair, set[int]] = defaultdict(set)
        for w, (ids, count) in enumerate(zip(words, counts, strict=True)):
            for pair in pairwise(ids):
                self.pair_counts[pair] += count
                self.where[pair].add(w)

    def merge(self, pair: Pair, new_id: int) -> tuple[list[int], set[Pair]]:
        """Merge `pair` into `new_id` in every word holding it.

        Returns the indices of the words that changed and the pairs whose count changed.
        """
        changed_words: list[int] = []
        changed_pairs: set[Pair] = set()
        for w in sorted(self.where.pop(pair, ())):
            old = self.words[w]
            new = merge_pair(old, pair, new_id)
            if len(new) == len(old):  # stale entry: an earlier merge already used this pair
                continue
            count = self.word_counts[w]
            for p in pairwise(old):
                self.pair_counts[p] -= count
                changed_pairs.add(p)
            for p in pairwise(new):
                self.pair_counts[p] += count
                self.where[p].add(w)
                changed_pairs.add(p)
            self.words[w] = new
            changed_words.append(w)
        for p in changed_pairs:
            if self.pair_counts[p] <= 0:
                del self.pair_counts[p]
        self.pair_counts.pop(pair, None)
        changed_pairs.discard(pair)
        return changed_words, changed_pairs


class _Descending:
    """A key that sorts in reverse, so a min-heap pops the greatest key first."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Descending) -> bool:
        return self.key > other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key


def split_at_specials(text: str, specials: Sequence[str]) -> list[str]:
    """The pieces of `text` between occurrences of the special tokens, which training skips:
    "a<|eot|>b", ["<|eot|>"] -> ["a", "b"]."""
    if not specials:
        return [text]
    longest_first = sorted(specials, key=len, reverse=True)  # "<|a|>x" before "<|a|>"
    return regex.split("|".join(map(regex.escape, longest_first)), text)


@dataclass(frozen=True)
class MergeStep:
    """One training step: `pair` occurred `count` times and became token `new_id`."""

    pair: Pair
    count: int
    new_id: int
    chunks: tuple[str, ...]  # the unique pre-split chunks that contained the pair
    top_pairs: tuple[tuple[Pair, int], ...] = ()  # the most frequent pairs before this merge


def merge_by_rank(ids: list[int], merges: dict[Pair, int]) -> list[int]:
    """Apply merges to one chunk, lowest new id (= earliest merge) first, leftmost on ties.

    A heap holds candidate merges (rank, position, left id, right id); tokens form a linked
    list (`nxt`/`prv`), so each merge costs O(log n) and the whole chunk O(n log n).
    An entry is stale (skipped) if the tokens at its position changed since it was pushed.
    """
    n = len(ids)
    ids = list(ids)
    nxt = list(range(1, n + 1))  # index of the next live token (n = end)
    prv = list(range(-1, n - 1))  # index of the previous live token (-1 = start)
    heap = [
        (merges[pair], i, *pair)
        for i, pair in enumerate(pairwise(ids))
        if pair in merges
    ]
    heapq.heapify(heap)
    while heap:
        new_id, i, left, right = heapq.heappop(heap)
        j = nxt[i]
        if ids[i] != left or j >= n or ids[j] != right:
            continue
        ids[i], ids[j] = new_id, -1  # token j is absorbed into token i
        nxt[i] = nxt[j]
        if nxt[i] < n:
            prv[nxt[i]] = i
        p, k = prv[i], nxt[i]
        if p >= 0 and (ids[p], new_id) in merges:
            heapq.heappush(heap, (merges[ids[p], new_id], p, ids[p], new_id))
        if k < n and (new_id, ids[k]) in merges:
            heapq.heappush(heap, (merges[new_id, ids[k]], i, new_id, ids[k]))
    return [t for t in ids if t >= 0]


def encode_chunks(
    chunks: list[str], encode_chunk: Callable[[bytes], list[int]], cache: dict[str, list[int]],
    max_entries: int = 500_000, max_chars: int = 64,
) -> list[int]:
    """Encode pre-split chunks, each distinct one once, remembering the short ones.

    Words repeat, so a text of N chunks has far fewer distinct ones; `cache` keeps the ids of
    chunks of at most `max_chars` characters between calls and is emptied past `max_entries`.
    Shared by every byte-level BPE tokenizer of the package.
    """
    if len(cache) > max_entries:
        cache.clear()
    new = set(chunks).difference(cache)  # encode each distinct chunk once
    for chunk in new:
        cache[chunk] = encode_chunk(chunk.encode("utf-8"))
    ids = list(chain.from_iterable(map(cache.__getitem__, chunks)))
    for chunk in new:
        if len(chunk) > max_chars:  # keep long one-off chunks out of the cache
            del cache[chunk]
    return ids


class BPETokenizer(Tokenizer):
    """Byte-level BPE: `merges[(left, right)] = new_id`, ids assigned in merge order.

    Because a merge's new id grows with its position in the merge list, the id doubles as
    the merge's rank during encoding. Train with `BPETokenizer.train(text, vocab_size)`.
    Two merges can spell the same bytes (" t" + "he" and " th" + "e"); each still gets its
    own id, and `token_to_id` returns the smaller one.
    """

    kind = "bpe"
    cache_max_chars = 64  # chunks up to this length stay in the cache between calls
    cache_max_entries = 500_000  # the cache is emptied when it grows beyond this

    def __init__(
        self,
        merges: dict[Pair, int],
        pattern: str | None = GPT4_SPLIT_PATTERN,
        special_tokens: dict[str, int] | None = None,
        byte_ids: Sequence[int] | None = None,
    ) -> None:
        super().__init__(special_tokens)
        self._split = splitter(pattern)
        self.pattern = pattern
        self.merges = dict(merges)
        # byte_ids[b] is the id of the single byte b (GPT-2 and cl100k permute them).
        self.byte_ids = list(byte_ids) if byte_ids is not None else list(range(256))
        if sorted(self.byte_ids) != list(range(256)):
            raise ValueError("byte_ids must be a permutation of 0..255")
        self._byte_table = bytes(self.byte_ids)  # for bytes.translate: byte -> its id
        size = 256 + len(self.merges)
        self.vocab: list[bytes] = [b""] * size  # id -> the bytes it stands for
        for b, i in enumerate(self.byte_ids):
            self.vocab[i] = bytes([b])
        for pair, new_id in self.merges.items():
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(map(is_int, pair))
                    and is_int(new_id)):
                raise TypeError(f"merges must map (left id, right id) -> new id, all ints; got "
                                f"{pair!r:.40} -> {new_id!r:.20}")
        made_by: dict[int, Pair] = {}  # new id -> the merge that made it
        for (left, right), new_id in sorted(self.merges.items(), key=lambda kv: kv[1]):
            if not (256 <= new_id < size and 0 <= left < new_id and 0 <= right < new_id):
                raise ValueError(f"merge {(left, right)} -> {new_id}: expected 256 <= new id < "
                                 f"{size} and both parts older than the new id")
            if new_id in made_by:
                raise ValueError(f"merges {made_by[new_id]} and {(left, right)} both make id "
                                 f"{new_id}: expected each id 256..{size - 1} made by one merge")
            made_by[new_id] = left, right
            self.vocab[new_id] = self.vocab[left] + self.vocab[right]
        for token, token_id in self.special_tokens.items():
            if token_id < size:
                raise ValueError(f"special token {token!r} has id {token_id}, which is an "
                                 f"ordinary token's: expected an id >= {size}")
        self.trace: list[MergeStep] = []
        self._chunk_cache: dict[str, list[int]] = {}

    # --- training -------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        pattern: str | None = GPT4_SPLIT_PATTERN,
        special_tokens: Iterable[str] = (),
        keep_trace: bool = True,
        top_pairs: int = 0,
        tie_break: str = "smallest_ids",
    ) -> BPETokenizer:
        """Learn `vocab_size - 256 - len(special_tokens)` merges from `text`.

        Each step merges the most frequent adjacent pair. Among pairs with the same count,
        `tie_break="smallest_ids"` (the default) merges the smallest `(left id, right id)`;
        `tie_break="greatest_bytes"` merges the greatest `(left bytes, right bytes)`, as the
        reference trainer of Stanford CS336's assignment 1 does (`max` over
        `(count, pair of bytes)`); with `pattern=GPT2_SPLIT_PATTERN` and the same special
        tokens it learns that trainer's merges, in its order (its vocabulary numbers the
        special tokens first, this one last). Occurrences of the special tokens in `text` are
        cut out before the pre-split, so no chunk spans one. Stops early if no pair is left to
        merge.
        `pattern=None` trains on the text as one chunk (no pre-split; for small texts, since
        every merge then rescans the whole text). With `keep_trace`, `tokenizer.trace`
        lists every merge; `top_pairs=k` also records the k most frequent pairs before each
        merge (a scan of all pairs per step: meant for small, illustrative texts).

        >>> tok = BPETokenizer.train("aaabdaaabac", 259, pattern=None)
        >>> [(tok.vocab[s.pair[0]] + tok.vocab[s.pair[1]], s.count) for s in tok.trace]
        [(b'aa', 4), (b'ab', 2), (b'aaab', 2)]
        """
        check_text(text)
        specials = list(special_tokens)
        for s in specials:
            check_text(s, "special token")
        check_vocab_size(vocab_size, 256 + len(specials), f"256 bytes + {len(specials)} specials")
        if "" in specials:
            raise ValueError("a special token must not be empty: the empty string would match "
                             "between every two characters")
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"tie_break must be one of {', '.join(map(repr, TIE_BREAKS))}, "
                             f"got {tie_break!r:.60}")
        if not text:
            raise ValueError("cannot train on an empty text: expected at least one character")
        split = splitter(pattern)
        chunk_counts = Counter(chain.from_iterable(
            split(piece) for piece in split_at_specials(text, specials)))
        chunks = sorted(chunk_counts)  # a fixed order makes the trace reproducible
        index = PairIndex([list(c.encode("utf-8")) for c in chunks],
                          [chunk_counts[c] for c in chunks])
        spelled = [bytes([b]) for b in range(256)]  # id -> its bytes, grown with each merge

        def order(pair: Pair) -> Any:  # the smallest order wins a tie of counts
            if tie_break == "smallest_ids":
                return pair
            return _Descending((spelled[pair[0]], spelled[pair[1]]))

        heap = [(-count, order(pair), pair) for pair, count in index.pair_counts.items()]
        heapq.heapify(heap)
        merges: dict[Pair, int] = {}
        trace: list[MergeStep] = []
        next_id = 256
        while next_id < vocab_size - len(specials) and heap:
            negative_count, _, pair = heapq.heappop(heap)
            if index.pair_counts.get(pair) != -negative_count:
                continue  # stale heap entry: the count changed since it was pushed
            top: tuple[tuple[Pair, int], ...] = ()
            if top_pairs:
                counts = index.pair_counts
                top = tuple((p, counts[p]) for p in heapq.nsmallest(
                    top_pairs, counts, key=lambda p: (-counts[p], order(p))))
            spelled.append(spelled[pair[0]] + spelled[pair[1]])
            words, changed = index.merge(pair, next_id)
            for p in changed:
                if p in index.pair_counts:
                    heapq.heappush(heap, (-index.pair_counts[p], order(p), p))
            merges[pair] = next_id
            if keep_trace:
                trace.append(MergeStep(pair, -negative_count, next_id,
                                       tuple(chunks[w] for w in words), top))
            next_id += 1
        special_ids = {s: next_id + k for k, s in enumerate(specials)}
        tokenizer = cls(merges, pattern, special_ids)
        tokenizer.trace = trace
        return tokenizer

    def with_merges(self, n: int) -> BPETokenizer:
        """The same tokenizer after only its first `n` merges (for stepping through training)."""
        kept = {pair: i for pair, i in self.merges.items() if i < 256 + n}
        return BPETokenizer(kept, self.pattern, None, self.byte_ids)

    # --- encoding -------------------------------------------------------------------------
    def encode_chunk(self, chunk: bytes) -> list[int]:
        """Encode one pre-split chunk given as bytes."""
        if not isinstance(chunk, (bytes, bytearray)):
            raise TypeError(f"a chunk must be bytes (text.encode('utf-8')), got "
                            f"{type(chunk).__name__}: {chunk!r:.60}")
        ids = list(chunk.translate(self._byte_table))  # [byte_ids[b] for b in chunk], in C
        return merge_by_rank(ids, self.merges) if len(ids) > 1 else ids

    def _encode_ordinary(self, text: str) -> list[int]:
        return encode_chunks(self._split(text), self.encode_chunk, self._chunk_cache,
                             self.cache_max_entries, self.cache_max_chars)

    def _token_bytes(self, token_id: int) -> bytes:
        if token_id < 0:
            raise IndexError(token_id)
        return self.vocab[token_id]

    def _num_ordinary(self) -> int:
        return len(self.vocab)

    # --- saving ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Pattern, byte ids and one "left right -> new" line per merge, in merge order."""
        ordered = sorted(self.merges.items(), key=lambda kv: kv[1])
        return {
            "pattern": self.pattern,
            "byte_ids": " ".join(map(str, self.byte_ids)),
            "merges": [f"{a} {b} -> {new}" for (a, b), new in ordered],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BPETokenizer:
        fields = Fields(data)
        pattern = fields.get("pattern", "a regular expression (a string) or null",
                             lambda v: v is None or isinstance(v, str))
        try:
            splitter(pattern)
        except ValueError as error:
            raise ValueError(f"field 'pattern': {error}") from None
        byte_ids = read_byte_ids(fields)
        merges = read_merges(fields)
        specials = fields.special_tokens()
        size = 256 + len(merges)
        for token, token_id in specials.items():
            if token_id < size:
                raise fields.error("special_tokens", f"an id >= {size} (after the ordinary "
                                   f"tokens) for {token!r}", token_id)
        try:
            return cls(merges, pattern, specials, byte_ids)
        except ValueError as error:
            raise ValueError(f"field 'merges': {error}") from None


def read_byte_ids(fields: Fields) -> list[int]:
    """The field 'byte_ids': the ids of bytes 0..255, a permutation of 0..255."""
    expected = "the ids of the 256 bytes separated by spaces, a permutation of 0..255"
    text = fields.text("byte_ids")
    words = text.split()
    if not all(w.isascii() and w.isdigit() for w in words) or (
            sorted(map(int, words)) != list(range(256))):
        raise fields.error("byte_ids", expected, text)
    return [int(w) for w in words]


def read_merges(fields: Fields) -> dict[Pair, int]:
    """The field 'merges': one "left right -> new" line per merge, no pair or new id twice."""
    merges: dict[Pair, int] = {}
    line_of_pair: dict[Pair, int] = {}
    line_of_id: dict[int, int] = {}
    for k, line in enumerate(fields.get("merges", "a list of lines 'left right -> new'",
                                        lambda v: isinstance(v, list))):
        found = _MERGE_LINE.fullmatch(line) if isinstance(line, str) else None
        if found is None:
            raise fields.error("merges", "a line 'left right -> new' of three integers",
                               line, k)
        left, right, new_id = map(int, found.groups())
        if (left, right) in line_of_pair:
            raise fields.error("merges", f"a pair merged once (entry {line_of_pair[left, right]}"
                               " merges it too)", line, k)
        if new_id in line_of_id:
            raise fields.error("merges", f"a new id made once (entry {line_of_id[new_id]} "
                               "makes it too)", line, k)
        line_of_pair[left, right], line_of_id[new_id] = k, k
        merges[left, right] = new_id
    return merges
