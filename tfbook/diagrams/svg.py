"""The drawing vocabulary: an SVG canvas with boxes, arrows, adders, a residual bus, grids and text.

Every diagram of the book is drawn with these few primitives, so they look alike and follow
the page's colours: text and lines are ``currentColor`` (the theme's text colour, light or
dark), boxes are a translucent tint of one of a few colours that read on both backgrounds.
Every string is escaped before it reaches the SVG (labels can hold a reader's tokens).

    canvas = Canvas("two boxes")
    canvas.box(0, 0, 80, 30, kind="attn")
    canvas.text(40, 20, "Q K^T")
    canvas.render()  ->  '<svg ... viewBox="..."> ... </svg>'
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass

FONT = 14  # title text, in SVG units (one unit is one CSS pixel at full size)
SMALL = 12.5  # shape labels and notes: never smaller (the book's minimum is about 12 px)
MONO_WIDTH = 0.61  # width of one monospace character, in ems
SANS_WIDTH = 0.6  # a generous average width of one sans-serif character, in ems
PAD = 8  # margin around the drawing
LINE_GAP = 1.25  # from one baseline to the next of a label on several lines, in its size
# A diagram never shrinks below this share of its natural size: its smallest text stays at
# 12 px, the size of the book's smallest text (11.9 px); a narrower screen scrolls the
# diagram inside its own box instead.
MIN_SCALE = 0.96

KINDS = ("data", "embed", "attn", "ffn", "norm", "head", "mask", "stream", "plain")
# one tint per kind of box: mid-tone colours that read on a white and on a dark page
COLOURS = {"data": None, "embed": "#9467bd", "attn": "#3b7dd8", "ffn": "#e07b24",
           "norm": "#2ca25f", "head": "#d6404e", "mask": "#8c8c8c", "stream": "#3b7dd8",
           "plain": None}

# one colour per attention head (cycled): heads are told apart, not ranked
HEAD_COLOURS = ("#3b7dd8", "#e07b24", "#2ca25f", "#d6404e", "#9467bd", "#8c564b",
                "#e377c2", "#17becf")

STYLE = (
    ".tfd text{fill:currentColor;font-family:system-ui,-apple-system,'Segoe UI',sans-serif}"
    ".tfd .m{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace}"
    ".tfd .b{font-weight:600}"
    ".tfd .ln{stroke:currentColor;fill:none;stroke-width:1.5}"
    ".tfd .ah{fill:currentColor}"
    ".tfd .bx{stroke:currentColor;stroke-opacity:.75;fill:currentColor;fill-opacity:.05}"
    ".tfd .dash{stroke-dasharray:5 4}"
)


def escape(text: object) -> str:
    """Text for SVG/HTML: &, <, >, and both quotes escaped; other types refused.

    >>> escape('<b>"x"</b>')
    '&lt;b&gt;&quot;x&quot;&lt;/b&gt;'
    """
    if not isinstance(text, str):
        raise TypeError(f"a diagram label must be a str, got {type(text).__name__}: {text!r:.60}")
    return html.escape(text, quote=True)


SUBSCRIPT = re.compile(r"_\{([^{}]*)\}")  # "W_{Q}": Q as a subscript
SUB_SIZE = 0.75  # a subscript's size, as a share of its text's


def text_width(text: str, size: float = FONT, mono: bool = False) -> float:
    """The width a label needs, estimated from its length (monospace is exact); subscripts
    written _{...} count at their smaller size."""
    if "_{" in text:
        small = "".join(SUBSCRIPT.findall(text))
        text = SUBSCRIPT.sub("", text)
        return (len(text) + SUB_SIZE * len(small)) * size * (MONO_WIDTH if mono else SANS_WIDTH)
    return len(text) * size * (MONO_WIDTH if mono else SANS_WIDTH)


def _subscripts(text: str, size: float) -> str:
    """Escaped text with each _{...} as a lowered, smaller tspan (the text after it raised back)."""
    out, at, low = [], 0, False
    shift = _num(0.3 * size)
    for match in SUBSCRIPT.finditer(text):
        before = escape(text[at:match.start()])
        if before:
            out.append(f'<tspan dy="-{shift}">{before}</tspan>' if low else before)
            low = low and not before
        out.append(f'<tspan font-size="{_num(SUB_SIZE * size)}" dy="{0 if low else shift}">'
                   f"{escape(match.group(1))}</tspan>")
        low, at = True, match.end()
    rest = escape(text[at:])
    if rest:
        out.append(f'<tspan dy="-{shift}">{rest}</tspan>' if low else rest)
    return "".join(out)


def _num(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"a diagram coordinate must be finite, got {value!r}")
    return f"{value:.1f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Label:
    """One piece of text on a drawing; `key` names what it shows, `shape` the traced shape."""

    text: str
    key: str = ""
    shape: tuple[int, ...] | None = None


Edge = tuple[str, str]


class Canvas:
    """An SVG drawing that grows as primitives are added; `render()` fits the view box.

    Every arrow says what it shows: `edge=(source, result)`, the names of two tensors of the
    traced computation (`tfbook.diagrams.dataflow`; a list of pairs when a box stands for
    several tensors, as "K, V"), or `edge="why"` for an arrow that is not a data dependency
    (a time axis, the loop back to the next step). `check_wiring(flow)` holds the drawn edges
    against the recorded computation; `wired` says whether every arrow of the drawing was so
    checked or explained.
    """

    def __init__(self, title: str) -> None:
        escape(title)  # refuse a non-string early
        self.title = title
        self.parts: list[str] = []
        self.labels: list[Label] = []
        self.edges: list[Edge] = []  # data-flow arrows: (source name, result name)
        self.nodes: list[str] = []  # tensors shown without an arrow to or from them
        self.verified: set[Edge] = set()  # edges held against a recorded computation
        self.other_arrows: list[str] = []  # arrows that are not dependencies, and why
        self.unexplained = 0  # arrows drawn with neither an edge nor a reason
        self.x0 = self.y0 = math.inf
        self.x1 = self.y1 = -math.inf

    # -- bookkeeping ---------------------------------------------------------------------
    def _extend(self, x0: float, y0: float, x1: float, y1: float) -> None:
        self.x0, self.y0 = min(self.x0, x0), min(self.y0, y0)
        self.x1, self.y1 = max(self.x1, x1), max(self.y1, y1)

    @property
    def width(self) -> float:
        return self.x1 - self.x0 if self.parts else 0.0

    @property
    def height(self) -> float:
        return self.y1 - self.y0 if self.parts else 0.0

    def _edge(self, edge: Edge | list[Edge] | str | None, arrow: bool) -> None:
        pairs = edge if isinstance(edge, list) else [edge] if isinstance(edge, tuple) else None
        if pairs is not None:
            for pair in pairs:
                if not (isinstance(pair, tuple) and len(pair) == 2
                        and all(isinstance(n, str) and n for n in pair)):
                    raise TypeError(f"an edge is (source name, result name), got {pair!r}")
            self.edges += pairs
        elif isinstance(edge, str):
            self.other_arrows.append(edge)
        elif edge is not None:
            raise TypeError(f"edge must be a (source, result) pair, a list of them or a "
                            f"reason, got {edge!r}")
        elif arrow:
            self.unexplained += 1

    def check_wiring(self, flow: object, nodes: tuple[str, ...] | list[str] = (),
                     omit: tuple[Edge, ...] | list[Edge] = (), within: str | None = None) -> None:
        """Hold this drawing's edges against `flow` (a recorded `Dataflow`): every arrow a
        direct dependency, every direct dependency between shown tensors drawn (or in `omit`);
        `within` a module call's name for a drawing of that call alone."""
        from tfbook.diagrams.dataflow import check_edges

        self.nodes += [n for n in nodes if n not in self.nodes]
        check_edges(self.edges, flow, self.nodes, omit, within)  # type: ignore[arg-type]
        self.verified |= set(self.edges)

    @property
    def wired(self) -> bool:
        """Every arrow is a checked dependency or says why it is not one."""
        return self.unexplained == 0 and set(self.edges) <= self.verified

    # -- primitives ----------------------------------------------------------------------
    def box(self, x: float, y: float, w: float, h: float, kind: str = "data",
            dashed: bool = False, radius: float = 5) -> None:
        """A rounded rectangle with its top-left corner at (x, y), tinted by `kind`."""
        if kind not in KINDS:
            raise ValueError(f"box kind must be one of {KINDS}, got {kind!r}")
        if w <= 0 or h <= 0:
            raise ValueError(f"a box needs a positive size, got {w} x {h}")
        colour = COLOURS[kind]
        tint = f' style="fill:{colour};fill-opacity:.16;stroke:{colour};stroke-opacity:1"' \
            if colour else ""
        cls = "bx dash" if dashed else "bx"
        self.parts.append(f'<rect class="{cls}" x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" '
                          f'height="{_num(h)}" rx="{_num(radius)}"{tint}/>')
        self._extend(x, y, x + w, y + h)

    def swatch(self, x: float, y: float, w: float, h: float, index: int,
               opacity: float = 0.35) -> None:
        """A rectangle in the colour of head `index` (0-based, colours cycle), tinted at
        `opacity` (shades of one colour tell apart heads of one group)."""
        if w <= 0 or h <= 0:
            raise ValueError(f"a swatch needs a positive size, got {w} x {h}")
        if not 0.0 < opacity <= 1.0:
            raise ValueError(f"a swatch's opacity must be in (0, 1], got {opacity!r}")
        colour = HEAD_COLOURS[index % len(HEAD_COLOURS)]
        self.parts.append(f'<rect class="sw" x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" '
                          f'height="{_num(h)}" style="fill:{colour};fill-opacity:{opacity:g};'
                          f'stroke:{colour};stroke-width:1.2"/>')
        self._extend(x, y, x + w, y + h)

    def text(self, x: float, y: float, text: str | list[str], size: float = FONT,
             mono: bool = False, bold: bool = False, anchor: str = "middle", key: str = "",
             shape: tuple[int, ...] | None = None, sub: bool = False,
             vertical: bool = False) -> None:
        """A line of text whose baseline is at y; recorded in `labels` with its key.
        `vertical` turns it a quarter left about (x, y), to be read bottom to top.

        A list of strings is one label on several lines (the first baseline at y, one line
        every LINE_GAP x size below), recorded as the lines joined by a space. With `sub`,
        "W_{Q}" writes Q as a subscript (the label records "WQ", the text a reader sees).
        """
        if anchor not in ("start", "middle", "end"):
            raise ValueError(f"anchor must be 'start', 'middle' or 'end', got {anchor!r}")
        if size < SMALL:
            raise ValueError(f"text smaller than {SMALL} units is not legible, got {size}")
        lines = text if isinstance(text, list) else [text]
        if not lines:
            raise ValueError("a label needs at least one line")
        bodies = [_subscripts(line, size) if sub else escape(line) for line in lines]
        if sub:
            lines = [SUBSCRIPT.sub(r"\1", line) for line in lines]
        cls = " ".join(c for c, on in (("m", mono), ("b", bold)) if on)
        cls_attr = f' class="{cls}"' if cls else ""
        if len(lines) == 1:
            body = bodies[0]
        else:
            step = _num(size * LINE_GAP)
            body = "".join(f'<tspan x="{_num(x)}" dy="{step if i else 0}">{b}</tspan>'
                           for i, b in enumerate(bodies))
        turn = f' transform="rotate(-90 {_num(x)} {_num(y)})"' if vertical else ""
        self.parts.append(f'<text x="{_num(x)}" y="{_num(y)}" font-size="{_num(size)}" '
                          f'text-anchor="{anchor}"{cls_attr}{turn}>{body}</text>')
        self.labels.append(Label(" ".join(lines), key, shape))
        raw = text if isinstance(text, list) else [text]
        w = max(text_width(line, size, mono) for line in (raw if sub else lines))
        left = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
        if vertical:  # the text runs upwards from (x, y) ("start"), or ends there ("end")
            low = {"start": y, "middle": y + w / 2, "end": y + w}[anchor]
            self._extend(x - size, low - w, x + size * 0.3, low)
            return
        self._extend(left, y - size, left + w, y + size * LINE_GAP * (len(lines) - 1)
                     + size * 0.3)

    def line(self, points: list[tuple[float, float]], arrow: bool = True, dashed: bool = False,
             colour: str | None = None, width: float = 1.5,
             edge: Edge | list[Edge] | str | None = None) -> None:
        """A polyline through `points`, with an arrowhead at its end if `arrow`; `edge` is the
        dependency it shows (source, result) or why an arrow shows none."""
        if len(points) < 2:
            raise ValueError(f"a line needs at least 2 points, got {len(points)}")
        self._edge(edge, arrow)
        style = f' style="stroke:{colour};stroke-width:{_num(width)}"' if colour else (
            f' style="stroke-width:{_num(width)}"' if width != 1.5 else "")
        cls = "ln dash" if dashed else "ln"
        pts = list(points)
        if arrow:  # stop the line at the arrowhead's base so its tip stays sharp
            (xa, ya), (xb, yb) = pts[-2], pts[-1]
            length = math.hypot(xb - xa, yb - ya) or 1.0
            ux, uy = (xb - xa) / length, (yb - ya) / length
            pts[-1] = (xb - 7 * ux, yb - 7 * uy)
            head = [(xb, yb), (xb - 9 * ux + 4.5 * uy, yb - 9 * uy - 4.5 * ux),
                    (xb - 9 * ux - 4.5 * uy, yb - 9 * uy + 4.5 * ux)]
        coords = " ".join(f"{_num(px)},{_num(py)}" for px, py in pts)
        self.parts.append(f'<polyline class="{cls}" points="{coords}"{style}/>')
        if arrow:
            fill = f' style="fill:{colour}"' if colour else ""
            self.parts.append('<polygon class="ah" points="' + " ".join(
                f"{_num(px)},{_num(py)}" for px, py in head) + f'"{fill}/>')
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        self._extend(min(xs) - 5, min(ys) - 5, max(xs) + 5, max(ys) + 5)

    def arrow(self, x0: float, y0: float, x1: float, y1: float, **options: object) -> None:
        """A straight arrow from (x0, y0) to (x1, y1)."""
        self.line([(x0, y0), (x1, y1)], **options)  # type: ignore[arg-type]

    def trapezoid(self, cx: float, y: float, top: float, bottom: float, h: float,
                  kind: str = "data") -> None:
        """A box whose top edge is `top` wide and its bottom edge `bottom`, centred on cx: a
        matrix that narrows a vector (or widens it), drawn to its proportions."""
        if kind not in KINDS:
            raise ValueError(f"trapezoid kind must be one of {KINDS}, got {kind!r}")
        if top <= 0 or bottom <= 0 or h <= 0:
            raise ValueError(f"a trapezoid needs positive sizes, got {top}, {bottom}, {h}")
        colour = COLOURS[kind]
        tint = f' style="fill:{colour};fill-opacity:.16;stroke:{colour};stroke-opacity:1"' \
            if colour else ""
        points = [(cx - top / 2, y), (cx + top / 2, y), (cx + bottom / 2, y + h),
                  (cx - bottom / 2, y + h)]
        self.parts.append('<polygon class="bx" points="' + " ".join(
            f"{_num(px)},{_num(py)}" for px, py in points) + f'"{tint}/>')
        self._extend(cx - max(top, bottom) / 2, y, cx + max(top, bottom) / 2, y + h)

    def adder(self, x: float, y: float, symbol: str = "+", r: float = 10) -> None:
        """A circle with a symbol at its centre: the residual addition (+) or a product."""
        self.parts.append(f'<circle class="bx" cx="{_num(x)}" cy="{_num(y)}" r="{_num(r)}" '
                          f'style="fill-opacity:0"/>')
        self.parts.append(f'<text x="{_num(x)}" y="{_num(y + 5)}" font-size="16" '
                          f'text-anchor="middle" class="b">{escape(symbol)}</text>')
        self._extend(x - r, y - r, x + r, y + r)

    def bus(self, x: float, y0: float, y1: float, edge: Edge | None = None) -> None:
        """The residual stream: a thick vertical line every sub-layer reads and adds to; `edge`
        the stream's value at its top and the sum it runs into."""
        self._edge(edge, False)
        colour = COLOURS["stream"]
        self.parts.append(f'<line x1="{_num(x)}" y1="{_num(y0)}" x2="{_num(x)}" y2="{_num(y1)}" '
                          f'style="stroke:{colour};stroke-width:5;stroke-opacity:.55"/>')
        self._extend(x - 3, min(y0, y1), x + 3, max(y0, y1))

    def grid(self, x: float, y: float, cells: list[list[float]], cell: float = 14,
             kind: str = "attn") -> None:
        """A tensor as a grid of cells, one per entry; an entry's value in [0, 1] is its tint."""
        if not cells or not all(len(row) == len(cells[0]) and row for row in cells):
            raise ValueError("a grid needs a non-empty rectangular list of rows")
        colour = COLOURS[kind] or "currentColor"
        for i, row in enumerate(cells):
            for j, value in enumerate(row):
                if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                    raise ValueError(f"grid values must lie in [0, 1], got {value!r}")
                self.parts.append(
                    f'<rect x="{_num(x + j * cell)}" y="{_num(y + i * cell)}" '
                    f'width="{_num(cell)}" height="{_num(cell)}" style="fill:{colour};'
                    f'fill-opacity:{value * 0.75 + 0.04:.2f};stroke:currentColor;'
                    f'stroke-opacity:.35;stroke-width:.75"/>')
        self._extend(x, y, x + len(cells[0]) * cell, y + len(cells) * cell)

    def group(self, other: Canvas, dx: float, dy: float, prefix: str = "") -> None:
        """Draw `other` here, shifted by (dx, dy); its labels join ours (keys prefixed)."""
        if not other.parts:
            raise ValueError(f"cannot place the empty drawing {other.title!r}")
        self.parts.append(f'<g transform="translate({_num(dx)},{_num(dy)})">'
                          + "".join(other.parts) + "</g>")
        self.labels += [Label(lb.text, prefix + lb.key if lb.key else "", lb.shape)
                        for lb in other.labels]
        self.edges += [(prefix + a, prefix + b) for a, b in other.edges]
        self.nodes += [prefix + n for n in other.nodes]
        self.verified |= {(prefix + a, prefix + b) for a, b in other.verified}
        self.other_arrows += other.other_arrows
        self.unexplained += other.unexplained
        self._extend(other.x0 + dx, other.y0 + dy, other.x1 + dx, other.y1 + dy)

    # -- output ----------------------------------------------------------------------------
    def render(self, min_scale: float = MIN_SCALE) -> str:
        """The SVG element: view box fitted to the drawing; full width up to its natural size.

        It never grows beyond its natural size and never shrinks below `min_scale` of it (the
        text stays legible); narrower screens scroll the diagram inside its own box.
        """
        if not self.parts:
            raise ValueError(f"the drawing {self.title!r} is empty")
        x0, y0 = self.x0 - PAD, self.y0 - PAD
        w, h = self.x1 - self.x0 + 2 * PAD, self.y1 - self.y0 + 2 * PAD
        title = escape(self.title)
        narrowest = w * min_scale
        style = (f"width:100%;max-width:{_num(w)}px;min-width:{_num(narrowest)}px;"
                 "height:auto;display:block;margin:0 auto")
        return (f'<svg xmlns="http://www.w3.org/2000/svg" class="tfd" role="img" '
                f'aria-label="{title}" viewBox="{_num(x0)} {_num(y0)} {_num(w)} {_num(h)}" '
                f'width="{_num(w)}" height="{_num(h)}" style="{style}">'
                f"<title>{title}</title><style>{STYLE}</style>" + "".join(self.parts) + "</svg>")
