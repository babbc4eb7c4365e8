"""The BPE-merges stepper: watch byte-level BPE learn its vocabulary, one merge at a time.

Python trains a `BPETokenizer` on a text and replays its pair counting to record, before
each merge, the most frequent pairs (the merged one first) and the length of the text in
tokens. The front end steps through the merges (slider, prev/next buttons, or hovering the
merge timeline) and re-segments a sample text by applying merges 1..k to the sample's bytes
itself, so the saved page holds the merges, not one segmentation per step. In Jupyter the
learner can retrain on their own text and vocabulary size.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable

import traitlets

from tfbook.corpus import stdlib_corpus
from tfbook.tokenizers import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, BPETokenizer, regex_split
from tfbook.tokenizers.base import check_text
from tfbook.tokenizers.bpe import PairIndex
from tfbook.widgets.base import STATIC, Widget, bundle

# Cut at line ends only: merges may then cross spaces and punctuation (as with no pre-split),
# while training stays affordable (one chunk per line, not one for the whole text).
LINES_PATTERN = r"[^\n]*\n|[^\n]+"
# The pre-split patterns the widget offers, by the name the front end sends, and the longest
# training text each allows: live retraining stays within a few seconds on a laptop.
PATTERNS: dict[str, str] = {"gpt4": GPT4_SPLIT_PATTERN, "gpt2": GPT2_SPLIT_PATTERN,
                            "lines": LINES_PATTERN}
MAX_TEXT_CHARS = {"gpt4": 200_000, "gpt2": 200_000, "lines": 10_000}
MAX_MERGES = 1000  # vocab_size <= 256 + MAX_MERGES
MAX_SAMPLE_CHARS = 1_500  # the re-segmented sample must fit on screen
EXAMPLE_CHUNKS = 4  # chunks shown per merge: the most frequent ones that held the pair

Top = list[tuple[int, int, int]]  # (left id, right id, count), most frequent first


def pre_split(text: str, pattern: str | None) -> list[str]:
    """The chunks BPE trains on and encodes separately (the whole text if no pattern)."""
    return regex_split(text, pattern) if pattern else [text]


def replay_training(tokenizer: BPETokenizer, text: str, top_k: int = 8
                    ) -> tuple[list[Top], list[int], list[list[str]]]:
    """Redo the pair counting of `tokenizer`'s training on `text`, following its merge trace.

    Returns, for each merge, the `top_k` most frequent pairs just before it (the merged pair
    first, ties broken as the trainer does: smallest pair), the length of `text` in tokens
    after 0, 1, ..., N merges, and the most frequent chunks that held the merged pair.
    Raises RuntimeError if the replay does not pick the trainer's merge (it always should).
    """
    chunk_counts = Counter(pre_split(text, tokenizer.pattern))
    chunks = sorted(chunk_counts)  # the trainer's order
    index = PairIndex([list(c.encode("utf-8")) for c in chunks], [chunk_counts[c] for c in chunks])

    def n_tokens(words: Iterable[int]) -> int:  # tokens in these words, times their counts
        return sum(len(index.words[w]) * index.word_counts[w] for w in words)

    length = n_tokens(range(len(chunks)))
    lengths, tops, examples = [length], [], []
    for step in tokenizer.trace:
        top = heapq.nsmallest(top_k, index.pair_counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if not top or top[0] != (step.pair, step.count):
            raise RuntimeError(f"replay picked {top[:1]}, training merged {step.pair} "
                               f"{step.count} times: was the tokenizer trained on this text?")
        tops.append([(left, right, count) for (left, right), count in top])
        holders = list(index.where.get(step.pair, ()))
        before = n_tokens(holders)
        index.merge(step.pair, step.new_id)
        length -= before - n_tokens(holders)  # overlaps ("aaa") make this less than the count
        lengths.append(length)
        examples.append(sorted(step.chunks, key=lambda c: (-chunk_counts[c], c))[:EXAMPLE_CHUNKS])
    return tops, lengths, examples


class BPEMergesWidget(Widget):
    """Step through BPE training: pair counts, the merged pair, the new token, the sample."""

    _esm = bundle("tokenspans.js") + "\n" + (STATIC / "bpe.js").read_text(encoding="utf-8")

    merges = traitlets.List().tag(sync=True)  # [left, right] of merge k, which made id 256 + k
    top_pairs = traitlets.List().tag(sync=True)  # per merge: [[left, right, count], ...]
    lengths = traitlets.List().tag(sync=True)  # training text in tokens after 0..N merges
    examples = traitlets.List().tag(sync=True)  # per merge: chunks that held the pair
    sample = traitlets.List().tag(sync=True)  # the sample's pre-split chunks, as byte values
    sample_text = traitlets.Unicode("").tag(sync=True)  # the sample, to prefill the text box
    n_chars = traitlets.Int(0).tag(sync=True)  # characters of the training text
    n_bytes = traitlets.Int(0).tag(sync=True)  # its UTF-8 bytes
    pattern = traitlets.Unicode("gpt4").tag(sync=True)  # key of PATTERNS
    step = traitlets.Int(0).tag(sync=True)  # merges applied to the sample (0 = raw bytes)

    def __init__(self, text: str | None = None, vocab_size: int = 512, sample: str | None = None,
                 pattern: str = "gpt4", step: int = 0, top_k: int = 8) -> None:
        super().__init__()
        self.top_k = top_k
        self.tokenizer: BPETokenizer | None = None
        self._text: str | None = None  # the training text (Python only: it can be 200 kB)
        self.compute(text=stdlib_corpus(100_000) if text is None else text,
                     vocab_size=vocab_size, sample=sample, pattern=pattern)
        self.step = min(max(step, 0), len(self.merges))

    def compute(self, text: str | None = None, vocab_size: int = 512,
                sample: str | None = None, pattern: str = "gpt4") -> None:
        """Train on `text` to `vocab_size` (capped) and replay the merges for the front end.

        `text` None retrains on the text trained on now (the page's retrain box starts empty
        and says so: the training text is too long to sit in the page), keeping the sample.
        Otherwise the sample defaults to the start of the text.
        """
        if text is None:
            if self._text is None:
                raise ValueError("the training text is empty: type or paste some text")
            text = self._text
            sample = self.sample_text if sample is None else sample
        check_text(text)
        if pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {sorted(PATTERNS)}, got {pattern!r}")
        if not text:
            raise ValueError("the training text is empty: type or paste some text")
        if len(text) > MAX_TEXT_CHARS[pattern]:
            raise ValueError(f"the training text has {len(text):,} characters; with the "
                             f"{pattern!r} pre-split the widget trains on at most "
                             f"{MAX_TEXT_CHARS[pattern]:,} to stay fast")
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
            raise TypeError(f"vocab_size must be an int, got {vocab_size!r}")
        if not 257 <= vocab_size <= 256 + MAX_MERGES:
            raise ValueError(f"vocab_size must be between 257 and {256 + MAX_MERGES} "
                             f"(256 bytes + 1 to {MAX_MERGES} merges), got {vocab_size}")
        sample = text[:MAX_SAMPLE_CHARS] if sample is None else check_text(sample, "sample")
        if not 0 < len(sample) <= MAX_SAMPLE_CHARS:
            raise ValueError(f"the sample must have 1 to {MAX_SAMPLE_CHARS} characters, "
                             f"got {len(sample)}")
        tokenizer = BPETokenizer.train(text, vocab_size, pattern=PATTERNS[pattern])
        tops, lengths, examples = replay_training(tokenizer, text, self.top_k)
        with self.hold_sync():  # one message: the front end never sees half-updated data
            self._text = text
            self.tokenizer = tokenizer
            self.merges = [list(step.pair) for step in tokenizer.trace]
            self.top_pairs = [[list(t) for t in top] for top in tops]
            self.lengths = lengths
            self.examples = examples
            self.sample = [list(c.encode("utf-8")) for c in pre_split(sample, tokenizer.pattern)]
            self.sample_text = sample
            self.n_chars, self.n_bytes = len(text), len(text.encode("utf-8"))
            self.pattern = pattern
            self.step = min(self.step, len(self.merges))
