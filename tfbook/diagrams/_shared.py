"""Small drawing helpers shared by the diagrams of Parts I, IV and V (text, positions,
generation, learning): a heading, a side note, and a wrapped row of "chips" (one small box
per token, id or chunk). Everything is drawn with the common vocabulary of `svg` and `layout`.
"""

from __future__ import annotations

from tfbook.diagrams.layout import Rect
from tfbook.diagrams.svg import FONT, SMALL, Canvas, text_width

CHIP_H = 24.0  # height of one chip
CHIP_GAP = 5.0  # room between two chips of a row


def visible(token: str | bytes) -> str:
    """A token as a reader can see it: a space as ␣, control characters and stray bytes
    escaped, the empty string as ∅.

    >>> visible(" the"), visible(b"\\xc3"), visible("a\\nb")
    ('␣the', '\\\\xc3', 'a\\\\nb')
    """
    if isinstance(token, bytes):
        token = token.decode("utf-8", errors="backslashreplace")
    if not isinstance(token, str):
        raise TypeError(f"a token must be a str or bytes, got {type(token).__name__}")
    out = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in token)
    return out.replace(" ", "␣") or "∅"


def heading(c: Canvas, text: str, x: float, y: float, anchor: str = "start") -> float:
    """A bold heading with its top at y; returns where the content under it starts."""
    c.text(x, y + FONT, text, FONT + 1, bold=True, anchor=anchor)
    return y + FONT + 14


def note(c: Canvas, x: float, y: float, text: str, key: str = "",
         shape: tuple[int, ...] | None = None, mono: bool = False,
         anchor: str = "start") -> None:
    """One line of small text whose baseline is at y."""
    c.text(x, y, text, SMALL, mono=mono, anchor=anchor, key=key, shape=shape)


def chips(c: Canvas, x: float, y: float, texts: list[str], max_width: float,
          kind: str = "data", key: str = "") -> Rect:
    """Texts in small boxes, left to right from (x, y), wrapped onto new rows at max_width.

    Each chip's label is recorded with key f"{key}.{i}" (i its index) when a key is given.
    Returns the rectangle the chips cover.
    """
    if not texts:
        raise ValueError("chips needs at least one text")
    right, cx, cy = x, x, y
    for i, text in enumerate(texts):
        w = max(text_width(text, SMALL, mono=True) + 12, 22.0)
        if cx > x and cx + w > x + max_width:  # wrap
            cx, cy = x, cy + CHIP_H + CHIP_GAP
        c.box(cx, cy, w, CHIP_H, kind, radius=3)
        c.text(cx + w / 2, cy + CHIP_H / 2 + 4.5, text, SMALL, mono=True,
               key=f"{key}.{i}" if key else "")
        cx += w + CHIP_GAP
        right = max(right, cx - CHIP_GAP)
    return Rect(x, y, right - x, cy + CHIP_H - y)
