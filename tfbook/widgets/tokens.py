"""The token-boundary view: how several tokenizers cut the same text, side by side.

Each tokenizer gets a row of coloured tokens; hovering a token shows its id, its text and its
bytes, and highlights the tokens of the other rows that cover the same bytes. A slider picks
the example. In Jupyter a text box sends new text to Python, which tokenizes it with every
tokenizer. Any tfbook tokenizer works (BPE, WordPiece, Unigram, a loaded GPT-2 or cl100k), and
so does any object with `encode(text, allowed_special=..., disallowed_special=...)`,
`decode_bytes(ids)` and `special_tokens`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import traitlets

from tfbook.tokenizers.base import check_text
from tfbook.widgets.base import STATIC, Widget, bundle

MAX_EXAMPLES = 100
MAX_EXAMPLE_CHARS = 4_000


def token_spans(tokenizer: Any, text: str, allowed_special: Collection[str] | str = ()
                ) -> list[list[Any]]:
    """`text` as tokens: [id, text (None if the bytes are not valid UTF-8 alone), hex bytes,
    start, end, is special]. Start/end are byte offsets into `text` when the tokens'
    bytes concatenate to it (byte-level BPE), else -1 (e.g. WordPiece lowercases).

    >>> from tfbook.tokenizers import BPETokenizer
    >>> token_spans(BPETokenizer({(104, 105): 256}), "hi!")
    [[256, 'hi', '68 69', 0, 2, False], [33, '!', '21', 2, 3, False]]
    """
    ids = tokenizer.encode(text, allowed_special=allowed_special, disallowed_special=())
    special_ids = set(getattr(tokenizer, "special_tokens", {}).values())
    pieces = [tokenizer.decode_bytes([i]) for i in ids]
    aligned = b"".join(pieces) == text.encode("utf-8")
    spans, start = [], 0
    for i, piece in enumerate(pieces):
        try:
            as_text: str | None = piece.decode("utf-8")
        except UnicodeDecodeError:  # part of a multi-byte character
            as_text = None
        end = start + len(piece)
        spans.append([int(ids[i]), as_text, piece.hex(" "), start if aligned else -1,
                      end if aligned else -1, int(ids[i]) in special_ids])
        start = end
    return spans


class TokenView(Widget):
    """Coloured tokens of several tokenizers on the same examples, with ids on hover."""

    _esm = bundle("tokenspans.js") + "\n" + (STATIC / "tokens.js").read_text(encoding="utf-8")

    names = traitlets.List(traitlets.Unicode()).tag(sync=True)  # one row per tokenizer
    texts = traitlets.List(traitlets.Unicode()).tag(sync=True)  # the examples
    tokens = traitlets.List().tag(sync=True)  # [example][tokenizer] -> token_spans(...)
    example = traitlets.Int(0).tag(sync=True)  # the example shown

    def __init__(self, tokenizers: Mapping[str, Any], texts: str | Sequence[str],
                 example: int = 0, allowed_special: Collection[str] | str = ()) -> None:
        super().__init__()
        if not isinstance(tokenizers, Mapping) or not tokenizers:
            raise TypeError("tokenizers must be a non-empty mapping {name: tokenizer}, got "
                            f"{type(tokenizers).__name__}")
        for name, tokenizer in tokenizers.items():
            if not (hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode_bytes")):
                raise TypeError(f"tokenizer {name!r} needs encode() and decode_bytes(), "
                                f"got {type(tokenizer).__name__}")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not 0 < len(texts) <= MAX_EXAMPLES:
            raise ValueError(f"expected 1 to {MAX_EXAMPLES} examples, got {len(texts)}")
        self._tokenizers = dict(tokenizers)
        self._allowed_special = allowed_special
        with self.hold_sync():
            self.names = [str(name) for name in tokenizers]
            self.texts = texts
            self.tokens = [self._tokenize(text) for text in texts]
            self.example = min(max(example, 0), len(texts) - 1)

    def _tokenize(self, text: str) -> list[list[list[Any]]]:
        """One example as every tokenizer's token_spans."""
        check_text(text, "an example")
        if len(text) > MAX_EXAMPLE_CHARS:
            raise ValueError(f"an example has {len(text):,} characters; the view shows at most "
                             f"{MAX_EXAMPLE_CHARS:,} per example")
        return [token_spans(t, text, self._allowed_special) for t in self._tokenizers.values()]

    def compute(self, text: str = "") -> None:
        """Tokenize a new example with every tokenizer and show it (it replaces the oldest
        example once there are MAX_EXAMPLES)."""
        row = self._tokenize(text)
        keep = MAX_EXAMPLES - 1
        with self.hold_sync():
            self.texts = [*self.texts[-keep:], text]
            self.tokens = [*self.tokens[-keep:], row]
            self.example = len(self.texts) - 1
