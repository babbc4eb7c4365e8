"""Diagrams of flash attention (Part VI): the tiles a call visits, and the running softmax.

    from tfbook.diagrams.flash import TileCall, flash_tiles, running_softmax
    flash_tiles([TileCall(192, 192, 32, 32, computed=21), TileCall(64, 192, 32, 32)])
    running_softmax(list(online_softmax_steps(scores, block=16)))

`flash_tiles` draws, for each call of the kernel, its grid of tiles (rows: query blocks,
columns: key blocks) from `tfbook.flash.tile_map`, the kernel's own decision per tile: full,
partial (masked entry by entry) or skipped. The tiles it computes are numbered in the order it
visits them (query blocks outside, key blocks inside, as FlashAttention-2). A count of tiles
measured on the real kernel (`computed`) is checked against the map, so a drawing can never
disagree with what ran. `running_softmax` draws the running max m and normaliser l of a few
queries after each key block, as `tfbook.flash.online_softmax_steps` yields them.

Label keys: "title", "subtitle", "tile.i.j" (the visiting number of tile (i, j)), "m.r.j" and
"l.r.j" (query r after key block j); with several calls, each panel's keys get "call{n}.".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import hstack
from tfbook.diagrams.svg import FONT, SMALL, Canvas
from tfbook.flash import tile_map

TILE = 40.0  # one tile at full size, in CSS pixels
MIN_TILE = 26.0  # a tile still holds a two-digit number
GRID_WIDTH = 296.0  # room for the columns of tiles (the panel fits a phone's 358 px column)
LEFT = 34.0  # room for the query block names
MAX_BLOCKS = 11  # more blocks than this per side would not fit GRID_WIDTH at MIN_TILE
CELL = 37.5  # one cell of the running table: "-0.53" with room on either side
MAX_STEPS = 8  # key blocks in the running table (8 cells fit a phone)
MAX_QUERIES = 4
KIND = {"full": "attn", "partial": "ffn", "skipped": "mask"}  # the diagrams' tints
MEANING = {"full": "no mask needed", "partial": "masked entry by entry",
           "skipped": "never computed"}


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


@dataclass(frozen=True)
class TileCall:
    """One call of the kernel: T queries (the last T of the S keys), its blocks and mask.

    `computed`, if given, is the number of tiles the real kernel computed (for example its
    online-softmax updates, counted while it ran); the drawing refuses to disagree with it.
    """

    T: int
    S: int
    block_q: int
    block_k: int
    causal: bool = True
    computed: int | None = None

    def __post_init__(self) -> None:
        for name in ("T", "S", "block_q", "block_k"):
            _positive(getattr(self, name), name)
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool, got {type(self.causal).__name__}")
        if self.causal and self.T > self.S:
            raise ValueError(f"a causal call needs T <= S (queries are the last T keys), got "
                             f"T = {self.T}, S = {self.S}")
        if self.computed is not None:
            _positive(self.computed, "computed")

    @property
    def tiles(self) -> list[list[str]]:
        """The kernel's status of every tile (`tfbook.flash.tile_map`)."""
        return tile_map(self.T, self.S, self.block_q, self.block_k, self.causal)

    @property
    def title(self) -> str:
        if not self.causal:
            return f"no mask, T = {self.T}, S = {self.S}"
        if self.T == self.S:
            return f"causal, T = S = {self.T}"
        return f"{self.T} queries after {self.S - self.T} cached keys"


def _tile_panel(call: TileCall, legend: bool) -> Canvas:
    tiles = call.tiles
    rows, cols = len(tiles), len(tiles[0])
    if max(rows, cols) > MAX_BLOCKS:
        raise ValueError(f"flash_tiles draws at most {MAX_BLOCKS} query and key blocks, got "
                         f"{rows} x {cols}: use larger blocks for the picture")
    computed = sum(s != "skipped" for row in tiles for s in row)
    if call.computed is not None and call.computed != computed:
        raise ValueError(f"the kernel computed {call.computed} tiles but tile_map marks "
                         f"{computed} of T = {call.T}, S = {call.S} as computed")
    tile = max(MIN_TILE, min(TILE, GRID_WIDTH / max(rows, cols)))
    blocks = (f"blocks of {call.block_q}" if call.block_q == call.block_k
              else f"blocks of {call.block_q} × {call.block_k}")
    c = Canvas(f"{call.title}: {computed} of {rows * cols} tiles computed")
    c.text(0, FONT, call.title, FONT, bold=True, anchor="start", key="title")
    c.text(0, 2 * FONT + 6, f"{blocks}: {computed} of {rows * cols} tiles computed", SMALL,
           anchor="start", key="subtitle")
    top = 2 * FONT + 20
    for j in range(cols):
        c.text(LEFT + (j + 0.5) * tile, top + SMALL, f"K{j}", SMALL)
    top += SMALL + 8
    order = 0
    for i, row in enumerate(tiles):
        c.text(LEFT - 8, top + (i + 0.5) * tile + 4.5, f"Q{i}", SMALL, anchor="end")
        for j, status in enumerate(row):
            x, y = LEFT + j * tile + 2, top + i * tile + 2
            c.box(x, y, tile - 4, tile - 4, KIND[status], dashed=status == "skipped", radius=3)
            if status != "skipped":
                order += 1  # query blocks outside, key blocks inside
                c.text(x + tile / 2 - 2, y + tile / 2 + 2.5, str(order), SMALL,
                       key=f"tile.{i}.{j}")
    if legend:
        y = top + rows * tile + 16
        c.text(LEFT, y + 10, "numbers: the order the kernel computes", SMALL, anchor="start")
        c.text(LEFT, y + 27, "the tiles in (query blocks outside,", SMALL, anchor="start")
        c.text(LEFT, y + 44, "key blocks inside)", SMALL, anchor="start")
        y += 58
        for status in ("full", "partial", "skipped"):
            c.box(LEFT, y, 22, 22, KIND[status], dashed=status == "skipped", radius=3)
            c.text(LEFT + 30, y + 16, f"{status}: {MEANING[status]}", SMALL, anchor="start")
            y += 30
    return c


def flash_tiles(calls: Sequence[TileCall]) -> Diagram:
    """The tiles of each call, numbered in visiting order, side by side (they wrap on a phone).

    The last panel carries the legend. Keys of panel n are prefixed "call{n}." when there are
    several calls.
    """
    if isinstance(calls, TileCall):
        calls = [calls]
    if not isinstance(calls, Sequence) or not calls or \
            not all(isinstance(c, TileCall) for c in calls):
        raise TypeError(f"flash_tiles needs a non-empty list of TileCall, got "
                        f"{type(calls).__name__}")
    panels = [_tile_panel(call, legend=n == len(calls) - 1) for n, call in enumerate(calls)]
    if len(panels) == 1:
        return Diagram(panels[0])
    whole = hstack("The tiles flash attention computes, in the order it visits them", panels,
                   24, [f"call{n}." for n in range(len(panels))])
    return Diagram(whole, panels)


def running_softmax(steps: Sequence[tuple[int, Tensor, Tensor]]) -> Diagram:
    """The running max m and normaliser l of each query after each key block, tinted where m
    grew (so l was rescaled): `steps` is `list(online_softmax_steps(scores, block))` for
    scores of shape (queries, n)."""
    if not isinstance(steps, Sequence) or not steps:
        raise TypeError(f"running_softmax needs the list of (end, m, l) steps of "
                        f"online_softmax_steps, got {type(steps).__name__}")
    for step in steps:
        if not (isinstance(step, tuple) and len(step) == 3 and isinstance(step[1], Tensor)
                and isinstance(step[2], Tensor)):
            raise TypeError(f"each step must be (end, m, l) with tensors m and l, got {step!r}")
    shape = tuple(steps[0][1].shape)
    if len(shape) != 1 or not 1 <= shape[0] <= MAX_QUERIES or \
            any(tuple(m.shape) != shape or tuple(d.shape) != shape for _, m, d in steps):
        raise ValueError(f"m and l must have one shape (queries,) with 1 to {MAX_QUERIES} "
                         f"queries in every step, got {shape}")
    if len(steps) > MAX_STEPS:
        raise ValueError(f"running_softmax draws at most {MAX_STEPS} key blocks, got "
                         f"{len(steps)}")
    ends = [end for end, _, _ in steps]
    block = ends[0]
    gaps = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    if any(g != block for g in gaps[:-1]) or (gaps and not 1 <= gaps[-1] <= block):
        raise ValueError(f"the steps must end every `block` entries, got ends {ends}")
    queries = shape[0]
    c = Canvas("the running max and normaliser of one query block, key block by key block")
    c.text(0, FONT, f"one query block, {len(steps)} key blocks of {block}", FONT, bold=True,
           anchor="start", key="title")
    c.text(0, 2 * FONT + 6, "tinted: m grew, so ℓ was rescaled", SMALL, anchor="start")
    left, top = 44.0, 2 * FONT + 20
    for j in range(len(steps)):
        c.text(left + (j + 0.5) * CELL, top + SMALL, f"K{j}", SMALL)
    top += SMALL + 8
    for r in range(queries):
        for line, (name, key, fmt) in enumerate((("m", "m", "{:.2f}"), ("ℓ", "l", "{:.1f}"))):
            y = top + (2 * r + line) * 26 + r * 8
            c.text(left - 8, y + 17, f"{name}, q{r}", SMALL, anchor="end")
            for j, (_, m, denom) in enumerate(steps):
                grew = j > 0 and bool(m[r] > steps[j - 1][1][r])
                value = float((m if name == "m" else denom)[r])
                c.box(left + j * CELL + 1, y, CELL - 2, 24, "ffn" if grew else "data", radius=2)
                c.text(left + (j + 0.5) * CELL, y + 17, fmt.format(value), SMALL,
                       key=f"{key}.{r}.{j}")
    return Diagram(c)
