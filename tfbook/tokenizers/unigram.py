"""Unigram language-model tokenization (Kudo 2018), as in sentencepiece.

Every piece t has a probability p(t); a segmentation s = (t_1, ..., t_k) of a string has
p(s) = prod_i p(t_i). Training starts from many candidate substrings and alternates

- EM: expected piece counts c(t) under p(s | x) by forward-backward (in log space), then
  p(t) <- c(t) / sum c (Kudo's plain M-step; sentencepiece's trainer uses a digamma update,
  log p(t) <- psi(c(t)) - psi(sum c), instead);
- pruning: drop the pieces whose removal costs the least likelihood, keeping every
  single character, until `vocab_size` pieces remain.

Encoding is Viterbi (the most probable segmentation); `nbest` lists the n best and
`sample` draws segmentations for subword regularization.

Text is handled the sentencepiece way: spaces become "▁", a "▁" is put in front (the dummy
prefix), and a piece never spans a "▁" except at its start ("the cat" -> "▁the", "▁cat").
sentencepiece puts the dummy prefix in front of every sentence: its trainer reads one
sentence per line, so the trainer here puts one in front of every line that is not empty,
while `encode`, like sentencepiece's, reads the whole text as one sentence and puts one in
front of the text (`dummy_prefix="line"` makes it encode line by line, as the trainer reads).
With the default `boundaries="sentencepiece"` the trainer also keeps sentencepiece's two
other rules: a piece never holds a line break (here a line break is a one-character piece of
its own, so that encoding stays lossless), and a piece never mixes
Unicode scripts (`split_by_unicode_script`): letters of one script, or characters of the
script "Common" (digits, punctuation, symbols), but not both ("__all__" -> "▁__", "all",
"__"). `boundaries="spaces"` keeps only the first rule.
"""

from __future__ import annotations

import functools
import heapq
import math
import numbers
import random
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count, repeat
from typing import Any

import numpy as np
import regex

from tfbook.tokenizers.base import (
    Fields,
    StringVocabTokenizer,
    check_text,
    check_vocab_size,
    is_real,
    is_unicode,
)

SPACE = "\u2581"  # "▁", the visible stand-in for a space
UNK_PENALTY = 10.0  # an unknown character scores (lowest piece score - 10), as in sentencepiece
LINE_BREAKS = "\n\r"  # a piece never holds one (sentencepiece trains on one line at a time)
BOUNDARIES = ("sentencepiece", "spaces")  # the pre-splitting rules `split_words` knows
M_STEPS = ("em", "digamma")  # Kudo's plain M-step, or sentencepiece's Bayesian one
# where the dummy prefix ▁ goes: in front of the text (sentencepiece's `encode`: one
# sentence) or in front of every line that is not empty (its trainer: a sentence per line)
DUMMY_PREFIXES = ("text", "line")
_WORD = regex.compile(f"{SPACE}[^{SPACE}]*|[^{SPACE}]+")
_LINE_WORD = regex.compile(f"[{LINE_BREAKS}]|{SPACE}?[^{SPACE}{LINE_BREAKS}]+|{SPACE}")
_LINE_START = regex.compile(r"(?m)^(?=.)")  # the start of a line that is not empty
_LINE_START_SPACE = regex.compile(f"(?m)^{SPACE}")
_COMMON = regex.compile(r"\p{Script=Common}")
_INHERITED = regex.compile(r"\p{Script=Inherited}")
# sentencepiece counts Hiragana, Katakana and the long-vowel mark U+30FC as Han
_HAN = regex.compile(r"[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\u30FC]")


def check_dummy_prefix(dummy_prefix: object) -> str:
    """One of DUMMY_PREFIXES, or a ValueError saying what was given."""
    if not isinstance(dummy_prefix, str) or dummy_prefix not in DUMMY_PREFIXES:
        raise ValueError(f"dummy_prefix must be one of {DUMMY_PREFIXES}, got "
                         f"{dummy_prefix!r:.40}")
    return dummy_prefix


def to_pieces_form(text: str, dummy_prefix: str = "text") -> str:
    r"""Spaces to ▁ and the dummy prefix ▁: one in front of the text, as sentencepiece's
    `encode` puts one in front of the sentence it reads ("text"), or one in front of every
    line that is not empty, as its trainer reads one sentence a line ("line"); "" stays "".

    >>> to_pieces_form("Hi  you")
    '▁Hi▁▁you'
    >>> to_pieces_form("a.\n\nThe")
    '▁a.\n\nThe'
    >>> to_pieces_form("a.\n\nThe", dummy_prefix="line")
    '▁a.\n\n▁The'
    """
    form = check_text(text).replace(" ", SPACE)
    if check_dummy_prefix(dummy_prefix) == "line":
        return _LINE_START.sub(SPACE, form)
    return SPACE + form if form else form


def from_pieces_form(form: str, dummy_prefix: str = "text") -> str:
    r"""The inverse of `to_pieces_form`: the dummy prefix removed, ▁ back to spaces.

    >>> from_pieces_form("▁a.\n\n▁▁The")
    'a.\n\n  The'
    >>> from_pieces_form("▁a.\n\n▁▁The", dummy_prefix="line")
    'a.\n\n The'
    """
    if check_dummy_prefix(dummy_prefix) == "line":
        return _LINE_START_SPACE.sub("", form).replace(SPACE, " ")
    return form.removeprefix(SPACE).replace(SPACE, " ")


@functools.lru_cache(maxsize=4096)
def script_class(char: str) -> str | None:
    """The Unicode script of `char` as sentencepiece's `split_by_unicode_script` sees it:
    "Common" for digits, punctuation, symbols and spaces, "Han" for Han, Hiragana and
    Katakana, None for a combining mark (Inherited: it takes the class of the character
    before it), otherwise the script that starts the character's Unicode name.

    >>> [script_class(c) for c in "a1_ß"]
    ['LATIN', 'Common', 'Common', 'LATIN']
    """
    if _COMMON.match(char):
        return "Common"
    if _INHERITED.match(char):
        return None
    if _HAN.match(char):
        return "Han"
    name = unicodedata.name(char, "").split(" ")[0]
    try:
        if regex.match(rf"\p{{Script={name}}}", char):
            return name  # LATIN, GREEK, CYRILLIC, ARABIC, ...
    except regex.error:  # the name does not start with a script (a rare letter)
        pass
    return f"U+{ord(char):04X}"  # a class of its own


def script_runs(word: str) -> list[str]:
    """`word` cut where the script class changes; a leading ▁ stays with the first run.

    >>> script_runs("▁__all__")
    ['▁__', 'all', '__']
    """
    runs: list[str] = []
    start, previous = 0, None
    for k, char in enumerate(word):
        now = None if char == SPACE else script_class(char)
        if now is None:
            continue  # ▁ and combining marks join the run they are in
        if previous is not None and now != previous:
            runs.append(word[start:k])
            start = k
        previous = now
    runs.append(word[start:])
    return runs


def split_words(text: str, boundaries: str = "sentencepiece") -> list[str]:
    r"""The strings no piece crosses, in order, as the trainer reads the text: one sentence a
    line, each line that is not empty with its dummy prefix ▁ (`to_pieces_form(text, "line")`).

    "spaces": cut before every ▁. "sentencepiece" (the default): also cut around every line
    break (a word of its own) and where the script class changes (`script_class`).

    >>> split_words("Hi  you")
    ['▁Hi', '▁', '▁you']
    >>> split_words("x = f(a)\nok")
    ['▁x', '▁=', '▁f', '(', 'a', ')', '\n', '▁ok']
    >>> split_words("x = f(a)\nok", boundaries="spaces")
    ['▁x', '▁=', '▁f(a)\n', '▁ok']
    """
    if boundaries not in BOUNDARIES:
        raise ValueError(f"boundaries must be one of {BOUNDARIES}, got {boundaries!r:.40}")
    form = to_pieces_form(text, "line")
    if boundaries == "spaces":
        return _WORD.findall(form)
    runs: dict[str, list[str]] = {}  # each distinct word is cut once
    out: list[str] = []
    for word in _LINE_WORD.findall(form):
        if word not in runs:
            runs[word] = script_runs(word)
        out += runs[word]
    return out


# --- training: lattices as flat numpy arrays -----------------------------------------------

@dataclass
class Lattice:
    """Every cut of a batch of strings into pieces: edge e covers string `word[e]` from
    character `lo[e]` to `hi[e]` with piece `piece[e]`. Node (string w, offset i) is number
    `base[w] + i`, so the edges of all strings are processed together. Edges are sorted by
    `hi`, so the forward pass reads them in order."""

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
        edge covering an entire string (to score a string without its own piece)."""
        word, lo, hi, subs = _substrings(strings, max_chars)
        piece = np.fromiter(map(piece_id.get, subs, repeat(-1)), np.int64, len(subs))
        keep = piece >= 0
        if not whole:
            keep &= (hi - lo) < np.array([len(s) for s in strings])[word]
        return cls._sorted(word[keep], lo[keep], hi[keep], piece[keep], strings)

    @classmethod
    def of_all_substrings(cls, strings: Sequence[str], max_chars: int
                          ) -> tuple[Lattice, list[str]]:
        """Every substring up to `max_chars` becomes a piece; returns the lattice and the
        pieces (piece id -> substring, in order of first appearance)."""
        word, lo, hi, subs = _substrings(strings, max_chars)
        first_seen: dict[str, int] = {}
        # setdefault keeps the running number of a substring's first occurrence ...
        raw = np.fromiter(map(first_seen.setdefault, subs, count()), np.int64, len(subs))
        _, piece = np.unique(raw, return_inverse=True)  # ... renumbered 0, 1, 2, ...
        return cls._sorted(word, lo, hi, piece, strings), list(first_seen)

    @classmethod
    def _sorted(cls, word, lo, hi, piece, strings: Sequence[str]) -> Lattice:
        order = np.argsort(hi, kind="stable")
        length = np.array([len(s) for s in strings], dtype=np.int64)
        base = np.concatenate([[0], np.cumsum(length + 1)[:-1]])
        return cls(word[order], lo[order], hi[order], piece[order], base, length)

    def keep(self, alive: np.ndarray) -> Lattice:
        """The lattice restricted to the pieces where `alive` is True."""
        m = alive[self.piece]
        return Lattice(self.word[m], self.lo[m], self.hi[m], self.piece[m], self.base,
                       self.length)

    @functools.cached_property
    def nodes(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Start node and end node of every edge, and the number of nodes."""
        first = self.base[self.word]
        return first + self.lo, first + self.hi, int(self.base[-1] + self.length[-1] + 1)

    @functools.cached_property
    def by_start(self) -> tuple[np.ndarray, np.ndarray]:
        """Edges ordered by start offset, last first, and where each offset's run begins."""
        order = np.argsort(-self.lo, kind="stable")
        bounds = np.searchsorted(-self.lo[order], -np.arange(int(self.lo.max(initial=0)) + 2))
        return order, bounds

    def forward(self, logp: np.ndarray, combine: np.ufunc = np.logaddexp) -> np.ndarray:
        """alpha[node] = combine over edges into it of alpha[start] + log p(piece).

        With `np.logaddexp`, alpha at a string's end is log p(x) (sum over segmentations);
        with `np.maximum`, it is the Viterbi score. Nodes are filled in order of offset.
        """
        start, end, n_nodes = self.nodes
        alpha = np.full(n_nodes, -np.inf)
        alpha[self.base] = 0.0
        bounds = np.searchsorted(self.hi, np.arange(int(self.hi.max(initial=0)) + 2))
        for h in range(1, len(bounds) - 1):
            e = slice(bounds[h], bounds[h + 1])  # all edges ending at offset h
            combine.at(alpha, end[e], alpha[start[e]] + logp[self.piece[e]])
        return alpha

    def backward(self, logp: np.ndarray) -> np.ndarray:
        """beta[node] = log of the summed probability of all ways to finish the string."""
        start, end, n_nodes = self.nodes
        beta = np.full(n_nodes, -np.inf)
        beta[self.base + self.length] = 0.0
        order, bounds = self.by_start
        for lo in range(len(bounds) - 2, -1, -1):
            e = order[bounds[lo + 1] : bounds[lo]]  # all edges starting at offset lo
            np.logaddexp.at(beta, start[e], beta[end[e]] + logp[self.piece[e]])
        return beta

    def expected_counts(self, logp: np.ndarray, freq: np.ndarray) -> tuple[np.ndarray, float]:
        """E-step: c(t) = sum_x freq(x) E[count(t) | x], and the corpus log-likelihood."""
        alpha, beta = self.forward(logp), self.backward(logp)
        start, end, _ = self.nodes
        log_px = alpha[self.base + self.length]  # log p(x) for every string
        # posterior of an edge: p(all segmentations through it) / p(x)
        post = np.exp(alpha[start] + logp[self.piece] + beta[end] - log_px[self.word])
        counts = np.bincount(self.piece, weights=post * freq[self.word], minlength=len(logp))
        return counts, float(freq @ log_px)


def _substrings(strings: Sequence[str], max_chars: int):
    """Every substring of at most `max_chars` characters: (string index, lo, hi) arrays and
    the list of substrings, in order of string, then lo, then hi."""
    spans = {n: [(lo, hi) for lo in range(n) for hi in range(lo + 1, min(n, lo + max_chars) + 1)]
             for n in {len(s) for s in strings}}
    subs = [s[lo:hi] for s in strings for lo, hi in spans[len(s)]]
    table = {n: np.array(v, dtype=np.int64).reshape(-1, 2) for n, v in spans.items()}
    lo_hi = np.concatenate([table[len(s)] for s in strings] or [np.zeros((0, 2), np.int64)])
    word = np.repeat(np.arange(len(strings)), [len(spans[len(s)]) for s in strings])
    return word, lo_hi[:, 0], lo_hi[:, 1], subs


def digamma(x: np.ndarray) -> np.ndarray:
    """psi(x) = d/dx log Gamma(x) for x > 0: raise x past 10 with psi(x) = psi(x + 1) - 1/x,
    then the asymptotic series log x - 1/(2x) - 1/(12x^2) + 1/(120x^4) - 1/(252x^6)
    + 1/(240x^8) (error below 1e-12).

    >>> round(float(digamma(np.array(1.0))), 10)  # minus the Euler-Mascheroni constant
    -0.5772156649
    """
    x = np.array(x, dtype=np.float64)
    result = np.zeros_like(x)
    small = x < 10
    while small.any():
        result[small] -= 1.0 / x[small]
        x[small] += 1.0
        small = x < 10
    inv2 = 1.0 / (x * x)
    series = inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 / 240)))
    return result + np.log(x) - 0.5 / x - series


def m_step_update(counts: np.ndarray, alive: np.ndarray, kind: str = "em") -> np.ndarray:
    """log p(t) from the expected counts c(t) (0 for the pieces no longer alive, which get
    log p = -inf).

    "em": log p = log c - log sum c (Kudo's EM). "digamma": log p = psi(c) - psi(sum c), the
    update of sentencepiece's trainer, a sparse prior that pushes rare pieces further down.
    """
    total = counts.sum()
    logp = np.full(len(counts), -np.inf)
    if kind == "em":
        logp[alive] = np.log(counts[alive]) - np.log(total)
    else:
        logp[alive] = digamma(counts[alive]) - digamma(np.array(total))
    return logp


def _seed_pieces(counts: np.ndarray, lengths: np.ndarray, limit: int) -> np.ndarray:
    """Every character, plus the `limit` substrings seen twice or more with the largest
    count x length (ties: first seen). Returns a boolean mask over substring ids."""
    multi = np.nonzero((lengths > 1) & (counts > 1))[0]
    best = multi[np.argsort(-(counts[multi] * lengths[multi]), kind="stable")[:limit]]
    alive = lengths == 1
    alive[best] = True
    return alive


# --- the tokenizer -----------------------------------------------------------------------

class UnigramTokenizer(StringVocabTokenizer):
    """Pieces with log-probability scores; `pieces[i]` is the piece of id i."""

    kind = "unigram"

    def __init__(self, pieces: Sequence[str], scores: Sequence[float],
                 unk_token: str = "<unk>", special_tokens: Iterable[str] = ("<unk>",),
                 dummy_prefix: str = "text") -> None:
        # where encode puts the dummy prefix ▁: in front of the text (sentencepiece's encode)
        # or in front of every line that is not empty (as the trainer reads its text)
        self.dummy_prefix = check_dummy_prefix(dummy_prefix)
        if len(pieces) != len(scores):
            raise ValueError(f"need one score per piece, got {len(pieces)} pieces and "
                             f"{len(scores)} scores")
        super().__init__(pieces, special_tokens)
        for i, score in enumerate(scores):
            if not is_real(score):
                number = isinstance(score, numbers.Real) and not isinstance(score, bool)
                raise (ValueError if number else TypeError)(
                    f"the score of piece {i} ({self.tokens[i]!r}) must be a finite "
                    f"number (a log-probability), got {score!r:.40}")
        self.scores = [float(s) for s in scores]
        if unk_token not in self.special_tokens:
            raise ValueError(f"the special tokens must include the unknown token {unk_token!r}")
        self.unk_token, self.unk_id = unk_token, self.ids[unk_token]
        normal = [score for piece, score in zip(self.pieces, self.scores, strict=True)
                  if piece not in self.special_tokens]
        # rounded to float32 as sentencepiece computes it: the Viterbi sums are float32 too,
        # and a few bits more would break ties between equal paths another way
        self.unk_score = float(np.float32(min(normal, default=0.0) - UNK_PENALTY))
        self.max_piece_chars = max(len(p) for p in self.pieces)

    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        special_tokens: Sequence[str] = ("<unk>",),
        max_piece_chars: int = 16,
        seed_factor: int = 20,
        shrink: float = 0.2,
        em_iterations: int = 2,
        boundaries: str = "sentencepiece",
        m_step: str = "em",
        dummy_prefix: str = "text",
    ) -> UnigramTokenizer:
        """Learn `vocab_size` pieces (specials included; the first special is the unknown).

        Seeds every character plus the `seed_factor * vocab_size` most promising substrings
        (up to `max_piece_chars`), then repeats: `em_iterations` EM steps, drop the `shrink`
        fraction of multi-character pieces with the smallest loss, until the size is
        reached; the EM after the last pruning sets the scores. Pieces that no segmentation
        uses are dropped on the way, so a small text can end with fewer pieces. No piece
        crosses the boundaries of `split_words(text, boundaries)`. `m_step` picks the
        M-step: "em" (Kudo's) or "digamma" (sentencepiece's); see `m_step_update`. The
        trainer reads the text one line at a time whatever `dummy_prefix` says: that is the
        encoder's (see `to_pieces_form`).
        """
        check_text(text)
        check_dummy_prefix(dummy_prefix)
        if m_step not in M_STEPS:
            raise ValueError(f"m_step must be one of {M_STEPS}, got {m_step!r:.40}")
        if not special_tokens:
            raise ValueError("special_tokens must name at least the unknown token, got none")
        words = Counter(split_words(text, boundaries))
        if not words:
            raise ValueError("cannot train on an empty text: expected at least one character")
        chars = {c for w in words for c in w}
        check_vocab_size(vocab_size, len(special_tokens) + len(chars),
                         f"{len(special_tokens)} specials + {len(chars)} distinct characters")
        # One pass over the words builds the lattice of all their substrings and counts
        # them; the seed pieces are chosen from those counts.
        word_list = list(words)
        freq = np.array([words[w] for w in word_list], dtype=np.float64)
        corpus, strings = Lattice.of_all_substrings(word_list, max_piece_chars)
        piece_id = {s: i for i, s in enumerate(strings)}
        lengths = np.array([len(s) for s in strings])
        counts = np.bincount(corpus.piece, weights=freq[corpus.word], minlength=len(strings))
        alive = _seed_pieces(counts, lengths, seed_factor * vocab_size)
        single = lengths == 1
        corpus = corpus.keep(alive)
        logp = np.where(alive, np.log(counts + 1.0), -np.inf)
        logp -= np.logaddexp.reduce(logp[alive])
        multi_ids = np.nonzero(alive & ~single)[0]
        inside = Lattice.build([strings[i] for i in multi_ids], piece_id, max_piece_chars,
                               whole=False).keep(alive)
        target = vocab_size - len(special_tokens)
        while True:
            lattice = corpus.keep(alive)
            for _ in range(em_iterations):
                counts, _ = lattice.expected_counts(logp, freq)  # E-step
                alive &= single | (counts >= 0.5)  # pieces (almost) nobody uses go at once
                counts = np.where(alive, np.maximum(counts, 0.5), 0.0)  # characters stay > 0
                logp = m_step_update(counts, alive, m_step)  # M-step: p = c / sum c
            excess = int(alive.sum()) - target
            if excess <= 0:
                break
            # loss(t) = c(t) (log p(t) - log p(best cut of t without t)): the likelihood lost
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
        return cls(pieces, scores, special_tokens[0], special_tokens, dummy_prefix)

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
        best = [0.0] + [-math.inf] * len(check_text(s))
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
        return self._merge_unknown(self.viterbi(to_pieces_form(text, self.dummy_prefix))[0])

    def _merge_unknown(self, ids: Sequence[int]) -> list[int]:
        """A run of unknown characters becomes one unknown token, as in sentencepiece."""
        out: list[int] = []
        for i in ids:
            if not (i == self.unk_id and out and out[-1] == self.unk_id):
                out.append(i)
        return out

    def nbest(self, text: str, n: int) -> list[tuple[list[int], float]]:
        """The `n` most probable segmentations of `text` with their log-probabilities."""
        whole = isinstance(n, numbers.Integral) and not isinstance(n, bool)
        if not whole or n < 1:
            raise (ValueError if whole else TypeError)(
                f"n must be an int >= 1 (how many segmentations), got {n!r:.40}")
        s = to_pieces_form(text, self.dummy_prefix)
        paths: list[list[tuple[float, tuple[int, ...]]]] = [[(0.0, ())]]
        for hi in range(1, len(s) + 1):
            options = [(score + total, ids + (i,))
                       for lo, i, score in self._edges_into(s, hi) for total, ids in paths[lo]]
            paths.append(heapq.nlargest(n, options, key=lambda o: o[0]))
        return [(self._merge_unknown(ids), total) for total, ids in paths[-1]]

    def sample(self, text: str, alpha: float = 0.1, rng: random.Random | None = None) -> list[int]:
        """Draw a segmentation with probability proportional to p(s)^alpha (subword
        regularization): forward sums, then pieces drawn backwards from the end."""
        if not is_real(alpha) or alpha < 0:
            raise (TypeError if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool)
                   else ValueError)(f"alpha must be a finite number >= 0 (the exponent of "
                                    f"p(s)), got {alpha!r:.40}")
        if rng is not None and not isinstance(rng, random.Random):
            raise TypeError(f"rng must be a random.Random or None, got {type(rng).__name__}")
        rng = rng or random.Random()
        s = to_pieces_form(text, self.dummy_prefix)
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
        return self._merge_unknown(ids[::-1])

    # --- decoding and saving --------------------------------------------------------------
    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text: pieces joined, the dummy prefix removed, ▁ back to spaces."""
        return from_pieces_form(self.decode_bytes(ids).decode("utf-8"), self.dummy_prefix)

    @property
    def pieces(self) -> list[str]:
        """The pieces, in id order (sentencepiece's name for the tokens)."""
        return self.tokens

    def to_dict(self) -> dict[str, Any]:
        """The unknown token, where the dummy prefix goes, one [piece, score] entry per id."""
        return {"unk_token": self.unk_token, "dummy_prefix": self.dummy_prefix,
                "pieces": [[p, s] for p, s in zip(self.pieces, self.scores, strict=True)]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnigramTokenizer:
        fields = Fields(data)
        pieces: list[str] = []
        scores: list[float] = []
        first: dict[str, int] = {}
        for k, entry in enumerate(fields.items("pieces", "[piece, score] pairs")):
            if not (isinstance(entry, list) and len(entry) == 2 and is_unicode(entry[0])):
                raise fields.error("pieces", "a pair [piece, score] whose piece is a string",
                                   entry, k)
            piece, score = entry
            if not is_real(score):
                raise fields.error("pieces", f"a finite number as the score of {piece!r}",
                                   score, k)
            if piece in first:
                raise fields.error("pieces", f"distinct pieces (entry {first[piece]} is the "
                                   "same)", piece, k)
            first[piece] = k
            pieces.append(piece)
            scores.append(score)
        specials = fields.specials_at_their_ids(pieces)
        unk_token = fields.text("unk_token")
        if unk_token not in specials:
            raise fields.error("unk_token", "one of the special tokens "
                               f"{specials}", unk_token)
        dummy_prefix = fields.get("dummy_prefix", f"one of {DUMMY_PREFIXES}",
                                  lambda v: v in DUMMY_PREFIXES, default="text")
        return cls(pieces, scores, unk_token, specials, dummy_prefix)
