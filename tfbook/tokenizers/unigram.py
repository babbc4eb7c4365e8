"""Unigram language-model tokenization (Kudo 2018), as in sentencepiece.

Every piece t has a probability p(t); a segmentation s = (t_1, ..., t_k) of a string has
P(s) = prod_i p(t_i). Training starts from many candidate substrings and alternates

- EM: expected piece counts under P(s | x) by forward-backward (in log space), then
  p(t) <- C(t) / sum C;
- pruning: drop the pieces whose removal costs the least likelihood, keeping every
  single character, until `vocab_size` pieces remain.

Encoding is Viterbi (the most probable segmentation); `nbest` lists the n best and
`sample` draws segmentations for subword regularization.

Text is handled the sentencepiece way: spaces become "▁", one "▁" is put in front, and a
piece never spans a "▁" except at its start ("the cat" -> "▁the", "▁cat").
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import regex

from tfbook.tokenizers.base import Tokenizer, check_text, check_vocab_size

SPACE = "\u2581"  # "▁", the visible stand-in for a space
UNK_PENALTY = 10.0  # an unknown character scores (lowest piece score - 10), as in sentencepiece
_WORD = regex.compile(f"{SPACE}[^{SPACE}]*|[^{SPACE}]+")


def to_pieces_form(text: str) -> str:
    """Spaces to ▁ and one ▁ in front: "Hi  you" -> "▁Hi▁▁you" ("" stays "")."""
    return SPACE + text.replace(" ", SPACE) if text else ""


def split_words(text: str) -> list[str]:
    """The words no piece crosses: "Hi  you" -> ['▁Hi', '▁', '▁you']."""
    return _WORD.findall(to_pieces_form(text))


# --- training: lattices as flat numpy arrays -----------------------------------------------

@dataclass
class Lattice:
    """Every cut of a batch of strings into pieces: edge e covers string `word[e]` from
    character `lo[e]` to `hi[e]` with piece `piece[e]`. Node (word w, offset i) is number
    `base[w] + i`, so the edges of all strings are processed together."""

    word: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    piece: np.ndarray
    base: np.ndarray  # node number of each string's offset 0
    length: np.ndarray  # characters in each string

    @classmethod
    def build(cls, strings: Sequence[str], piece_id: dict[str, int], max_chars: int,
              whole: bool = True) -> Lattice:
        """All substrings up to `max_chars` that are pieces; `whole=False` leaves out the
        edge covering an entire string (to score the string without its own piece)."""
        cols = [array("l") for _ in range(4)]
        for w, s in enumerate(strings):
            n = len(s)
            for lo in range(n):
                for hi in range(lo + 1, min(n, lo + max_chars) + 1):
                    p = piece_id.get(s[lo:hi])
                    if p is not None and (whole or hi - lo < n):
                        for col, v in zip(cols, (w, lo, hi, p), strict=True):
                            col.append(v)
        length = np.array([len(s) for s in strings], dtype=np.int64)
        base = np.concatenate([[0], np.cumsum(length + 1)[:-1]])
        return cls(*(np.frombuffer(c, dtype=np.int64) for c in cols), base, length)

    def keep(self, alive: np.ndarray) -> Lattice:
        """The lattice restricted to the pieces where `alive` is True."""
        m = alive[self.piece]
        return Lattice(self.word[m], self.lo[m], self.hi[m], self.piece[m], self.base,
                       self.length)

    def forward(self, logp: np.ndarray, combine: np.ufunc = np.logaddexp) -> np.ndarray:
        """alpha[node] = combine over edges into it of alpha[start] + log p(piece).

        With `np.logaddexp`, alpha at a string's end is log P(x) (sum over segmentations);
        with `np.maximum`, it is the Viterbi score. Nodes are filled in order of offset.
        """
        alpha = np.full(int(self.base[-1] + self.length[-1] + 1), -np.inf)
        alpha[self.base] = 0.0
        start, end = self.base[self.word] + self.lo, self.base[self.word] + self.hi
        order = np.argsort(self.hi, kind="stable")
        bounds = np.searchsorted(self.hi[order], np.arange(self.hi.max() + 2))
        for h in range(1, len(bounds) - 1):
            e = order[bounds[h] : bounds[h + 1]]
            combine.at(alpha, end[e], alpha[start[e]] + logp[self.piece[e]])
        return alpha

    def backward(self, logp: np.ndarray) -> np.ndarray:
        """beta[node] = log of the summed probability of all ways to finish the string."""
        beta = np.full(int(self.base[-1] + self.length[-1] + 1), -np.inf)
        beta[self.base + self.length] = 0.0
        start, end = self.base[self.word] + self.lo, self.base[self.word] + self.hi
        order = np.argsort(-self.lo, kind="stable")
        lows = self.lo[order]
        for lo in range(int(lows[0]), -1, -1):
            e = order[np.searchsorted(-lows, -lo) : np.searchsorted(-lows, -lo, "right")]
            np.logaddexp.at(beta, start[e], beta[end[e]] + logp[self.piece[e]])
        return beta

    def expected_counts(self, logp: np.ndarray, freq: np.ndarray) -> tuple[np.ndarray, float]:
        """E-step: C(t) = sum_x freq(x) E[count(t) | x], and the corpus log-likelihood."""
        alpha, beta = self.forward(logp), self.backward(logp)
        log_px = alpha[self.base + self.length]  # log P(x) for every string
        start, end = self.base[self.word] + self.lo, self.base[self.word] + self.hi
        # posterior of an edge: P(all segmentations through it) / P(x)
        post = np.exp(alpha[start] + logp[self.piece] + beta[end] - log_px[self.word])
        counts = np.bincount(self.piece, weights=post * freq[self.word], minlength=len(logp))
        return counts, float(freq @ log_px)


def _candidates(words: Counter[str], max_chars: int, limit: int) -> dict[str, int]:
    """Every character, plus the `limit` substrings with the largest count x length."""
    counts: Counter[str] = Counter()
    for w, f in words.items():
        n = len(w)
        for lo in range(n):
            for hi in range(lo + 2, min(n, lo + max_chars) + 1):
                counts[w[lo:hi]] += f
    chars = sorted({c for w in words for c in w})
    ranked = sorted((s for s, c in counts.items() if c > 1),
                    key=lambda s: (-counts[s] * len(s), s))[:limit]
    freq = Counter({c: 0 for c in chars})
    for w, f in words.items():
        for c in w:
            freq[c] += f
    return {s: (freq[s] if len(s) == 1 else counts[s]) for s in chars + ranked}


# --- the tokenizer -----------------------------------------------------------------------

class UnigramTokenizer(Tokenizer):
    """Pieces with log-probability scores; `pieces[i]` is the piece of id i."""

    kind = "unigram"

    def __init__(self, pieces: Sequence[str], scores: Sequence[float],
                 unk_token: str = "<unk>", special_tokens: Iterable[str] = ("<unk>",)) -> None:
        if len(pieces) != len(scores):
            raise ValueError(f"need one score per piece, got {len(pieces)} pieces and "
                             f"{len(scores)} scores")
        self.pieces, self.scores = list(pieces), [float(s) for s in scores]
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        specials = [s for s in special_tokens if s in self.ids]
        if unk_token not in specials:
            raise ValueError(f"the special tokens must include the unknown token {unk_token!r}")
        super().__init__({s: self.ids[s] for s in specials})
        self.unk_token, self.unk_id = unk_token, self.ids[unk_token]
        normal = [score for piece, score in zip(self.pieces, self.scores, strict=True)
                  if piece not in self.special_tokens]
        self.unk_score = min(normal, default=0.0) - UNK_PENALTY
        self.max_piece_chars = max(len(p) for p in self.pieces)

    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        special_tokens: Sequence[str] = ("<unk>",),
        max_piece_chars: int = 12,
        seed_factor: int = 20,
        shrink: float = 0.2,
        em_iterations: int = 2,
    ) -> UnigramTokenizer:
        """Learn `vocab_size` pieces (specials included) from `text`.

        Seeds `seed_factor * vocab_size` candidate substrings (up to `max_piece_chars`),
        then repeats: `em_iterations` EM steps, drop the `shrink` fraction of multi-character
        pieces with the smallest loss, until the size is reached; a final EM sets the scores.
        """
        check_text(text)
        words = Counter(split_words(text))
        if not words:
            raise ValueError("cannot train on an empty text: expected at least one character")
        chars = {c for w in words for c in w}
        check_vocab_size(vocab_size, len(special_tokens) + len(chars),
                         f"{len(special_tokens)} specials + {len(chars)} distinct characters")
        seeds = _candidates(words, max_piece_chars, seed_factor * vocab_size)
        strings = list(seeds)
        piece_id = {s: i for i, s in enumerate(strings)}
        single = np.array([len(s) == 1 for s in strings])
        logp = np.log(np.array([seeds[s] for s in strings], float) + 1.0)
        logp -= np.logaddexp.reduce(logp)
        alive = np.ones(len(strings), dtype=bool)
        word_list = list(words)
        freq = np.array([words[w] for w in word_list], dtype=np.float64)
        corpus = Lattice.build(word_list, piece_id, max_piece_chars)
        multi = [s for s in strings if len(s) > 1]
        inside = Lattice.build(multi, piece_id, max_piece_chars, whole=False)
        multi_ids = np.array([piece_id[s] for s in multi], dtype=np.int64)
        target = vocab_size - len(special_tokens)
        while True:
            lattice = corpus.keep(alive)
            for _ in range(em_iterations):
                counts, _ = lattice.expected_counts(logp, freq)
                alive &= single | (counts >= 0.5)  # pieces nobody uses go at once
                counts = np.where(alive, np.maximum(counts, 0.5), 0.0)
                logp = np.log(np.where(alive, counts, 1.0)) - np.log(counts.sum())
                logp[~alive] = -np.inf
            excess = int(alive.sum()) - target
            if excess <= 0:
                break
            # loss(t) = C(t) (log p(t) - log P(best cut of t without t)): the likelihood lost
            # if the occurrences of t had to use their next-best segmentation instead.
            alt = inside.keep(alive).forward(logp, np.maximum)
            alt = alt[inside.base + inside.length]
            live = alive[multi_ids]
            candidates = multi_ids[live]
            loss = counts[candidates] * (logp[candidates] - alt[live])
            n_drop = min(excess, max(1, int(shrink * len(candidates))))
            alive[candidates[np.argsort(loss, kind="stable")[:n_drop]]] = False
        kept = sorted(np.nonzero(alive)[0], key=lambda i: (-logp[i], strings[i]))
        pieces = list(special_tokens) + [strings[i] for i in kept]
        scores = [0.0] * len(special_tokens) + [float(logp[i]) for i in kept]
        return cls(pieces, scores, special_tokens[0], special_tokens)

    # --- the lattice of one string --------------------------------------------------------
    def _edges_into(self, s: str, hi: int) -> Iterator[tuple[int, int, float]]:
        """(start, piece id, score) of every piece ending at character `hi` of `s`; an
        unknown character gets the unknown token with score `unk_score`."""
        single = False
        for lo in range(max(0, hi - self.max_piece_chars), hi):
            i = self.ids.get(s[lo:hi])
            if i is not None and i not in self._special_by_id:
                single |= lo == hi - 1
                yield lo, i, self.scores[i]
        if not single:
            yield hi - 1, self.unk_id, self.unk_score

    def viterbi(self, s: str) -> tuple[list[int], float]:
        """Most probable segmentation of `s` (already in ▁ form) and its log-probability.

        best[hi] = max over pieces (lo, t) ending at hi of best[lo] + log p(t). Sums are
        rounded to float32 as in sentencepiece, and ties keep the smallest lo, so that equal
        segmentations ("**" + "****" vs "****" + "**") are broken the same way.
        """
        best = [0.0] + [-math.inf] * len(s)
        back = [(0, 0)] * (len(s) + 1)
        for hi in range(1, len(s) + 1):
            for lo, i, score in self._edges_into(s, hi):
                total = float(np.float32(best[lo] + score))
                if total > best[hi]:
                    best[hi], back[hi] = total, (lo, i)
        ids, hi = [], len(s)
        while hi > 0:
            hi, i = back[hi]
            ids.append(i)
        ids.reverse()
        return ids, best[-1]

    def _encode_ordinary(self, text: str) -> list[int]:
        # One lattice over the whole text, as sentencepiece does: pieces cannot cross a ▁,
        # but the float32 running sums (and so the tie-breaks) depend on what came before.
        out: list[int] = []
        for i in self.viterbi(to_pieces_form(text))[0]:
            if not (i == self.unk_id and out and out[-1] == self.unk_id):
                out.append(i)  # a run of unknown characters becomes one unknown token
        return out

    def nbest(self, text: str, n: int) -> list[tuple[list[int], float]]:
        """The `n` most probable segmentations of `text` with their log-probabilities."""
        s = to_pieces_form(check_text(text))
        paths: list[list[tuple[float, tuple[int, ...]]]] = [[(0.0, ())]]
        for hi in range(1, len(s) + 1):
            options = [(score + total, ids + (i,))
                       for lo, i, score in self._edges_into(s, hi) for total, ids in paths[lo]]
            paths.append(heapq.nlargest(n, options, key=lambda o: o[0]))
        return [(list(ids), total) for total, ids in paths[-1]]

    def sample(self, text: str, alpha: float = 0.1, rng: random.Random | None = None) -> list[int]:
        """Draw a segmentation with probability proportional to P(s)^alpha (subword
        regularization): forward sums, then pieces drawn backwards from the end."""
        rng = rng or random.Random()
        s = to_pieces_form(check_text(text))
        forward = [0.0] + [-math.inf] * len(s)
        for hi in range(1, len(s) + 1):
            terms = [forward[lo] + alpha * score for lo, _, score in self._edges_into(s, hi)]
            forward[hi] = float(np.logaddexp.reduce(terms))
        ids, hi = [], len(s)
        while hi > 0:
            edges = list(self._edges_into(s, hi))
            weights = [math.exp(forward[lo] + alpha * score - forward[hi])
                       for lo, _, score in edges]
            lo, i, _ = rng.choices(edges, weights)[0]
            ids.append(i)
            hi = lo
        return ids[::-1]

    # --- decoding and saving --------------------------------------------------------------
    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text: pieces joined, ▁ back to spaces, the leading space removed."""
        return self.decode_bytes(ids).decode("utf-8").replace(SPACE, " ").removeprefix(" ")

    def _token_bytes(self, token_id: int) -> bytes:
        if token_id < 0:
            raise IndexError(token_id)
        return self.pieces[token_id].encode("utf-8")

    def _num_ordinary(self) -> int:
        return len(self.pieces)

    def _token_index(self) -> dict[str, int]:
        return self.ids

    def to_dict(self) -> dict[str, Any]:
        """The unknown token and one [piece, score] entry per id."""
        return {"unk_token": self.unk_token,
                "pieces": [[p, s] for p, s in zip(self.pieces, self.scores, strict=True)]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnigramTokenizer:
        pieces, scores = zip(*data["pieces"], strict=True)
        return cls(pieces, scores, data["unk_token"], list(data["special_tokens"]))
