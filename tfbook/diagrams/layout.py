"""Layout: nodes that measure themselves, and functions that place them in columns and rows.

No diagram places a box by hand: a figure lists its nodes, `column` and `row` compute where
they go from the size of their text, and `hstack` puts whole drawings side by side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tfbook.diagrams.svg import FONT, LINE_GAP, SMALL, Canvas, text_width

Shape = tuple[int, ...]
GAP = 24  # vertical room between two nodes of a column (holds an arrow)
LINE = 18  # height of one line of text inside a node
PAD_X = 12  # room left and right of the text inside a node


def shape_label(letters: tuple[str, ...] | list[str], shape: Shape) -> str:
    """"(B, T, C) = (1, 9, 64)": the legend letters and the traced sizes, one per axis.

    >>> shape_label(("B", "T", "C"), (1, 9, 64))
    '(B, T, C) = (1, 9, 64)'
    """
    if not isinstance(shape, tuple) or not all(isinstance(n, int) for n in shape):
        raise TypeError(f"shape must be a tuple of ints (a traced shape), got {shape!r}")
    if len(letters) != len(shape):
        raise ValueError(f"{len(letters)} legend letters {tuple(letters)} for a shape of "
                         f"{len(shape)} axes {shape}")
    if len(shape) == 1:
        return f"({letters[0]},) = ({shape[0]},)"
    return f"({', '.join(letters)}) = ({', '.join(str(n) for n in shape)})"


def letters_for(legend: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
    """The last len(shape) letters of a legend: ("B", "H", "T", "D") for (T, D) is ("T", "D")."""
    if len(shape) > len(legend):
        raise ValueError(f"a shape of {len(shape)} axes {shape} for the legend {legend}")
    return legend[len(legend) - len(shape):]


def wrap_words(text: str, width: float, size: float = SMALL, mono: bool = False) -> list[str]:
    """Cut text at spaces into lines no wider than `width` (a longer word keeps its line);
    a group in parentheses stays on one line, and a line break in the text is kept.

    >>> wrap_words("one score per query and key", 120)
    ['one score per', 'query and key']
    >>> wrap_words("causal self-attention (H = 4), FFN", 180)
    ['causal self-attention', '(H = 4), FFN']
    """
    lines: list[str] = []
    for paragraph in text.split("\n"):
        start = len(lines)
        for word in re.findall(r"\([^()]*\)\S*|\S+", paragraph):
            if len(lines) > start and text_width(f"{lines[-1]} {word}", size, mono) <= width:
                lines[-1] = f"{lines[-1]} {word}"
            else:
                lines.append(word)
    return lines


@dataclass
class Node:
    """A box with a bold title and optional lines under it: a traced shape, then a note.

    `stack` writes the shape on two lines ("(B, H, T, D) =" over "(1, 4, 6, 8)") and `wrap`
    cuts the note into lines of at most that many units, for narrow columns.
    """

    title: str
    shape: Shape | None = None
    letters: tuple[str, ...] = ()
    kind: str = "data"
    key: str = ""
    note: str = ""
    dashed: bool = False
    min_width: float = 0.0
    flow: str = ""  # the traced tensor it shows (`tfbook.diagrams.dataflow`), for its arrows
    stack: bool = False
    wrap: float = 0.0

    def lines(self) -> list[tuple[list[str], float, bool, bool]]:
        """(lines, size, mono, bold) for each label of the node: title, shape, note."""
        out = [([self.title], FONT, False, True)]
        if self.shape is not None:
            label = shape_label(self.letters, self.shape)
            out.append((label.replace(" = ", " =\n").split("\n") if self.stack else [label],
                        SMALL, True, False))
        if self.note:
            out.append((wrap_words(self.note, self.wrap or 1e9), SMALL, False, False))
        return out

    @property
    def width(self) -> float:
        widest = max(text_width(t, s, m) for lines, s, m, _ in self.lines() for t in lines)
        return max(widest + 2 * PAD_X, self.min_width)

    @property
    def height(self) -> float:
        return 10 + sum(LINE + (len(lines) - 1) * size * LINE_GAP
                        for lines, size, _, _ in self.lines())


@dataclass(frozen=True)
class Rect:
    """Where a node was drawn."""

    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2

    @property
    def bottom(self) -> float:
        return self.y + self.h

    @property
    def right(self) -> float:
        return self.x + self.w


def draw(canvas: Canvas, node: Node, cx: float, y: float, width: float | None = None) -> Rect:
    """Draw `node` centred on cx with its top at y; its shape line is recorded with its key."""
    w = node.width if width is None else max(width, node.width)
    rect = Rect(cx - w / 2, y, w, node.height)
    canvas.box(rect.x, rect.y, rect.w, rect.h, node.kind, node.dashed)
    baseline = y + LINE
    for i, (lines, size, mono, bold) in enumerate(node.lines()):
        is_shape = node.shape is not None and i == 1
        canvas.text(cx, baseline, lines if len(lines) > 1 else lines[0], size, mono, bold,
                    key=node.key if is_shape else "", shape=node.shape if is_shape else None,
                    sub=i == 0)
        baseline += LINE + (len(lines) - 1) * size * LINE_GAP
    return rect


def column(canvas: Canvas, nodes: list[Node], cx: float, y: float, gap: float = GAP,
           arrows: bool = True, same_width: bool = False, reason: str | None = None
           ) -> list[Rect]:
    """Nodes one under the other, centred on cx, each joined to the next by an arrow: the
    dependency between their traced tensors (`Node.flow`), or else `reason`, what the arrow
    shows when the boxes are not tensors of a traced computation (steps of a loop)."""
    if not nodes:
        raise ValueError("a column needs at least one node")
    width = max(n.width for n in nodes) if same_width else None
    rects: list[Rect] = []
    for before, node in zip([None, *nodes], nodes, strict=False):
        if rects and arrows:
            edge = (before.flow, node.flow) if before.flow and node.flow else reason
            canvas.arrow(cx, rects[-1].bottom, cx, y, edge=edge)
        rects.append(draw(canvas, node, cx, y, width))
        y = rects[-1].bottom + gap
    return rects


def row(canvas: Canvas, nodes: list[Node], cx: float, y: float, gap: float = 16) -> list[Rect]:
    """Nodes side by side, the row centred on cx, tops aligned at y."""
    if not nodes:
        raise ValueError("a row needs at least one node")
    total = sum(n.width for n in nodes) + gap * (len(nodes) - 1)
    x = cx - total / 2
    rects = []
    for node in nodes:
        rects.append(draw(canvas, node, x + node.width / 2, y))
        x += node.width + gap
    return rects


def hstack(title: str, canvases: list[Canvas], gap: float = 36,
           prefixes: list[str] | None = None) -> Canvas:
    """Whole drawings side by side, tops aligned; each one's label keys get its prefix."""
    if not canvases:
        raise ValueError("hstack needs at least one drawing")
    prefixes = prefixes or [""] * len(canvases)
    if len(prefixes) != len(canvases):
        raise ValueError(f"{len(prefixes)} prefixes for {len(canvases)} drawings")
    out = Canvas(title)
    x = 0.0
    for canvas, prefix in zip(canvases, prefixes, strict=True):
        out.group(canvas, x - canvas.x0, -canvas.y0, prefix)
        x += canvas.width + gap
    return out
