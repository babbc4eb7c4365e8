"""WordPiece, as in BERT: merges chosen by likelihood gain, greedy longest-match encoding.

A word is written as its first character plus `##`-prefixed continuation characters
("hug" -> h ##u ##g). Training merges the adjacent pair whose merge raises the corpus
log-likelihood under a unigram model the most (`likelihood_gain`). Encoding takes, from the
left, the longest vocabulary entry that matches; a word with an unmatchable part, or longer
than `max_word_chars`, becomes `[UNK]`.

Two other "WordPiece" trainers are common, and neither maximises this gain: the Hugging Face
course scores a pair by n_ab / (n_a n_b), which ranks pairs by the per-occurrence term of the
gain; HF `tokenizers`' WordPieceTrainer runs its BPE trainer (most frequent pair) with the
`##` prefix. Only the encoder (greedy longest match) is the same in all three.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from tfbook.tokenizers.base import (
    AllOrSet,
    Fields,
    StringVocabTokenizer,
    check_text,
    check_vocab_size,
    is_int,
)
from tfbook.tokenizers.bpe import Pair, PairIndex
from tfbook.tokenizers.pretokenize import bert_pretokenize

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def xlogx(x: ArrayLike) -> np.ndarray:
    """x log x with 0 log 0 = 0 (the building block of a log-likelihood of counts)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def log_likelihood(counts: Mapping[Any, int] | Iterable[int]) -> float:
    """J = sum_t n_t log(n_t / n_tok): the corpus log-likelihood under a unigram model whose
    token probabilities are the count ratios p(t) = n_t / n_tok (n_tok = sum_t n_t)."""
    n = np.array(list(counts.values() if isinstance(counts, Mapping) else counts), float)
    return float(xlogx(n).sum() - xlogx(n.sum()))


def likelihood_gain(n_ab: ArrayLike, n_a: ArrayLike, n_b: ArrayLike, n_total: ArrayLike,
                    same: ArrayLike = False) -> np.ndarray:
    """Delta(a, b) = J(after merging a, b into c) - J(before), in closed form.

    With f(x) = x log x and J = sum_t f(n_t) - f(n_tok), the merge moves n_ab occurrences:
    #c = n_ab, #a -= n_ab, #b -= n_ab, n_tok -= n_ab (if a == b, #a -= 2 n_ab). Only four terms
    of J change, so Delta = f(#a') - f(#a) + f(#b') - f(#b) + f(#c) - f(n_tok') + f(n_tok).
    `n_total` is n_tok.
    Works elementwise on numpy arrays (the trainer scores all pairs at once).
    When n_ab is small next to n_a, n_b and N, a first-order expansion gives
    Delta ~ `occurrence_gain(...)` - n_ab: the per-occurrence shortcut, minus one nat per
    merge. The popular score n_ab / (n_a n_b) (the Hugging Face course's) ranks pairs by
    that per-occurrence term, log(n_ab n_tok / (n_a n_b)), and ignores the factor n_ab.
    """
    n_ab, n_a, n_b, n_total = (np.asarray(v, dtype=np.float64) for v in (n_ab, n_a, n_b, n_total))
    distinct = (xlogx(n_a - n_ab) - xlogx(n_a) + xlogx(n_b - n_ab) - xlogx(n_b))
    equal = xlogx(n_a - 2 * n_ab) - xlogx(n_a)
    return (np.where(same, equal, distinct) + xlogx(n_ab)
            - xlogx(n_total - n_ab) + xlogx(n_total))


def occurrence_gain(n_ab: ArrayLike, n_a: ArrayLike, n_b: ArrayLike, n_total: ArrayLike
                    ) -> np.ndarray:
    """The per-occurrence shortcut: the sum over the occurrences of ab of
    log p(c) - log p(a) - log p(b), with
    p(t) = n_t / n_tok before the merge: n_ab log(n_ab n_tok / (n_a n_b))."""
    n_ab, n_a, n_b, n_total = (np.asarray(v, dtype=np.float64) for v in (n_ab, n_a, n_b, n_total))
    return n_ab * (np.log(n_ab) + np.log(n_total) - np.log(n_a) - np.log(n_b))


class WordPieceTokenizer(StringVocabTokenizer):
    """BERT-style WordPiece: `vocab[i]` is the token of id i; `##x` continues a word.

    `max_word_chars` = 100 is Hugging Face's `max_input_chars_per_word`; Google's BERT code
    uses 200. A longer word is one `[UNK]`.
    """

    kind = "wordpiece"

    def __init__(
        self,
        vocab: list[str],
        unk_token: str = "[UNK]",
        prefix: str = "##",
        max_word_chars: int = 100,
        lowercase: bool = True,
        strip_accents: bool = True,
        special_tokens: Iterable[str] = BERT_SPECIAL_TOKENS,
    ) -> None:
        super().__init__(vocab, special_tokens)
        if unk_token not in self.ids:
            raise ValueError(f"the vocabulary must contain the unknown token {unk_token!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not is_int(max_word_chars) or max_word_chars < 1:
            raise ValueError(f"max_word_chars must be an int >= 1, got {max_word_chars!r}")
        self.unk_token, self.unk_id = unk_token, self.ids[unk_token]
        self.prefix, self.max_word_chars = prefix, max_word_chars
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self.max_token_chars = max(len(t) for t in self.tokens)
        self._word_cache: dict[str, list[int]] = {}

    @classmethod
    def from_vocab_file(cls, path: str | Path, **options: Any) -> WordPieceTokenizer:
        """Read a BERT `vocab.txt` (one token per line, the line number is the id).

        The last line may end with a newline or not; a file that is not UTF-8 or has no token
        is a ValueError naming the file.
        """
        try:
            text = Path(path).read_text("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: expected a vocabulary in UTF-8, but byte {error.start} "
                             "is not UTF-8") from None
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        try:
            return cls(lines, **options)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    # --- training -------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        special_tokens: Iterable[str] = BERT_SPECIAL_TOKENS,
        lowercase: bool = True,
        strip_accents: bool = True,
        prefix: str = "##",
        max_word_chars: int = 100,
        min_gain: float | None = None,
    ) -> WordPieceTokenizer:
        """Learn a vocabulary of `vocab_size` tokens by likelihood-gain merges.

        Each step scores every adjacent pair with `likelihood_gain` and merges the best; ties
        go to the pair seen first. Stops early when no pair is left (every word is one
        token). By default the sign of the best gain does not matter: the trainer merges
        until the vocabulary has `vocab_size` tokens. With `min_gain` (in nats) it also stops
        when the best gain falls below it, the second stopping rule of Schuster & Nakajima
        (2012).
        """
        check_text(text)
        if min_gain is not None:
            if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float, np.floating,
                                                                       np.integer)):
                raise TypeError(f"min_gain must be a number of nats or None, got "
                                f"{type(min_gain).__name__}")
            if np.isnan(min_gain):
                raise ValueError("min_gain must be a number of nats or None, got nan")
        specials = list(special_tokens)
        words = Counter(w for w in bert_pretokenize(text, lowercase, strip_accents)
                        if len(w) <= max_word_chars)
        if not words:
            raise ValueError("cannot train on a text without words: expected at least one "
                             f"non-space character, got {text!r:.60}")
        spelled = {w: [w[0]] + [prefix + c for c in w[1:]] for w in words}
        alphabet = sorted({s for pieces in spelled.values() for s in pieces})
        check_vocab_size(vocab_size, len(specials) + len(alphabet),
                         f"{len(specials)} specials + {len(alphabet)} characters of the text")
        symbols = specials + alphabet  # symbol id -> string (may repeat; see below)
        symbol_id = {s: i for i, s in enumerate(symbols)}
        order = sorted(words)
        index = PairIndex([[symbol_id[s] for s in spelled[w]] for w in order],
                          [words[w] for w in order])
        counts = np.zeros(vocab_size * 2, dtype=np.float64)  # n_t for each symbol id
        for ids, f in zip(index.words, index.word_counts, strict=True):
            np.add.at(counts, ids, f)
        slots = _PairSlots(sorted(index.pair_counts.items()))
        distinct = len(set(symbols))
        while distinct < vocab_size:
            best = slots.best(counts, min_gain)
            if best is None:
                break
            a, b = best
            merged = symbols[a] + symbols[b].removeprefix(prefix)
            new_id = len(symbols)
            if new_id >= len(counts):
                counts = np.concatenate([counts, np.zeros_like(counts)])
            symbols.append(merged)  # a string made twice ("a"+"##bc", "ab"+"##c") is kept once
            distinct += merged not in symbol_id
            symbol_id.setdefault(merged, new_id)
            changed_words, changed_pairs = index.merge((a, b), new_id)
            for w in changed_words:
                made = index.words[w].count(new_id) * index.word_counts[w]
                counts[a] -= made
                counts[b] -= made
                counts[new_id] += made
            slots.update(index.pair_counts, changed_pairs | {(a, b)})
        vocab = list(dict.fromkeys(symbols))
        return cls(vocab, "[UNK]", prefix, max_word_chars, lowercase, strip_accents, specials)

    # --- encoding -------------------------------------------------------------------------
    def encode_word(self, word: str) -> list[int]:
        """Greedy longest match from the left; `##` marks a piece inside the word.

        >>> tok = WordPieceTokenizer(["[UNK]", "un", "##aff", "##able", "##a"])
        >>> [tok.vocab[i] for i in tok.encode_word("unaffable")]
        ['un', '##aff', '##able']
        >>> tok.encode_word("unx") == [tok.unk_id]  # "##x" matches nothing: the word is unknown
        True
        """
        if len(check_text(word, "word")) > self.max_word_chars:
            return [self.unk_id]
        ids, start = [], 0
        while start < len(word):
            for end in range(min(len(word), start + self.max_token_chars), start, -1):
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.ids:
                    ids.append(self.ids[piece])
                    start = end
                    break
            else:
                return [self.unk_id]  # one unmatchable part makes the whole word unknown
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._word_cache
        for word in bert_pretokenize(text, self.lowercase, self.strip_accents):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self.encode_word(word)
            out.extend(ids)
        return out

    def encode(
        self,
        text: str,
        allowed_special: AllOrSet = frozenset(),
        disallowed_special: AllOrSet = "all",
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Text -> ids; with `add_special_tokens`, wrapped as BERT expects: [CLS] ... [SEP]."""
        ids = super().encode(text, allowed_special, disallowed_special)
        if add_special_tokens:
            ids = [self.special_tokens["[CLS]"], *ids, self.special_tokens["[SEP]"]]
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text: tokens joined by spaces, `##` pieces glued to the previous token."""
        words: list[str] = []
        for token in self.decode_bytes_list(ids):
            if words and token.startswith(self.prefix):
                words[-1] += token[len(self.prefix):]
            else:
                words.append(token)
        return " ".join(words)

    def decode_bytes_list(self, ids: Iterable[int]) -> list[str]:
        """Ids -> their token strings (checked like `decode_bytes`)."""
        return [self.decode_bytes([i]).decode("utf-8") for i in ids]

    @property
    def vocab(self) -> list[str]:
        """The tokens, in id order (BERT's name for them)."""
        return self.tokens

    # --- saving ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Options and the vocabulary, one token per line."""
        return {"unk_token": self.unk_token, "prefix": self.prefix,
                "max_word_chars": self.max_word_chars, "lowercase": self.lowercase,
                "strip_accents": self.strip_accents, "vocab": self.vocab}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WordPieceTokenizer:
        fields = Fields(data)
        vocab = fields.strings("vocab")
        unk_token = fields.text("unk_token")
        if unk_token not in vocab:
            raise fields.error("unk_token", "a token of the field 'vocab'", unk_token)
        return cls(vocab, unk_token, fields.text("prefix"),
                   fields.integer("max_word_chars", 1), fields.flag("lowercase"),
                   fields.flag("strip_accents"), fields.specials_at_their_ids(vocab))


class _PairSlots:
    """Pair counts laid out in numpy arrays so that all pairs are scored in one pass."""

    def __init__(self, initial: list[tuple[Pair, int]]) -> None:
        self.slot: dict[Pair, int] = {}
        self.pairs: list[Pair] = []
        self.n_ab = np.zeros(max(16, 2 * len(initial)))
        self.left = np.zeros(len(self.n_ab), dtype=np.int64)
        self.right = np.zeros(len(self.n_ab), dtype=np.int64)
        self.update(dict(initial), [p for p, _ in initial])

    def update(self, pair_counts: Mapping[Pair, int], pairs: Iterable[Pair]) -> None:
        """Copy the current count of each given pair into its slot (new pairs get a slot)."""
        for pair in sorted(pairs):
            if pair not in self.slot:
                if len(self.pairs) == len(self.n_ab):
                    self.n_ab, self.left, self.right = (
                        np.concatenate([v, np.zeros_like(v)])
                        for v in (self.n_ab, self.left, self.right))
                k = self.slot[pair] = len(self.pairs)
                self.pairs.append(pair)
                self.left[k], self.right[k] = pair
            self.n_ab[self.slot[pair]] = pair_counts.get(pair, 0)

    def best(self, counts: np.ndarray, min_gain: float | None = None) -> Pair | None:
        """The pair with the largest likelihood gain, or None if no pair is left (or, with
        `min_gain`, if the largest gain is below it)."""
        k = len(self.pairs)
        n_ab, left, right = self.n_ab[:k], self.left[:k], self.right[:k]
        gain = likelihood_gain(n_ab, counts[left], counts[right], counts.sum(), left == right)
        gain = np.where(n_ab > 0, gain, -np.inf)
        best = int(np.argmax(gain))
        if n_ab[best] == 0 or (min_gain is not None and gain[best] < min_gain):
            return None
        return self.pairs[best]
