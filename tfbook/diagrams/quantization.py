"""A diagram of Part VI: one Q4_1 block of a GGUF file, byte by byte, drawn from its bytes.

    from tfbook.diagrams.quantization import q4_1_block
    q4_1_block(blocks[0, :20], "blk.0.ffn_up.weight")   # 20 real bytes of a weight row

Every number on the drawing is read from the bytes it is given: the two float16 numbers (the
step d and the minimum m), the 16 bytes of codes, the two 4-bit codes each byte holds (the low
half is weight i, the high half weight i + 16) and the weights they mean, d q + m.

Two panels, each narrower than a phone's column (358 px): the block's head (d, m and what a
code means) and its 16 bytes of codes, in two rows of 8 bytes. On a wide page they sit side by
side; on a phone the second goes under the first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tfbook.diagrams._shared import heading, note
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import hstack
from tfbook.diagrams.svg import SMALL, Canvas

CELL = 28.0  # width of one byte's cell
ROW = 26.0  # height of one row of cells
LINE = SMALL + 8  # one line of notes
LABELS = 58.0  # the column of row labels left of the codes
PER_ROW = 8  # bytes of codes in one row (two rows hold the 16)
PANEL_GAP = 24.0  # between the two panels on a wide page


def _half(two: Tensor) -> float:
    """Two little-endian bytes as the float16 they hold, in float32."""
    return float(two.contiguous().view(torch.float16).float())


def _head(block: Tensor, name: str, d: float, m: float, q: list[int], w: list[float]) -> Canvas:
    """Bytes 0-3 (d and m) and how a code becomes a weight."""
    c = Canvas("Q4_1 block: d, m and the weights")
    y = heading(c, "One Q4_1 block, 20 bytes", 0, 0)
    note(c, 0, y + 2, f"32 weights{' of ' + name if name else ''}")
    y += 14
    for n, (key, value, meaning) in enumerate((("d", d, "the step"), ("m", m, "the minimum"))):
        top = y + n * (ROW + 8)
        c.box(0, top, 2 * CELL, ROW, "norm" if key == "d" else "ffn", radius=3)
        c.line([(CELL, top + 4), (CELL, top + ROW - 4)], arrow=False, width=0.6)
        for i in range(2):
            byte = 2 * n + i
            c.text(i * CELL + CELL / 2, top + ROW / 2 + 4.5, f"{int(block[byte]):02x}", SMALL,
                   mono=True, key=f"byte.{byte}")
        c.text(2 * CELL + 10, top + ROW / 2 + 4.5, f"{key} = {value:.6g}, {meaning}", SMALL,
               anchor="start", key=key)
    y += 2 * (ROW + 8) + 8
    note(c, 0, y, "two float16, little-endian")
    y += LINE + 6
    note(c, 0, y, "each weight is q d + m, q from 0 to 15:")
    i_max = max(range(32), key=lambda i: q[i])
    examples = [0, 16, i_max] if i_max not in (0, 16) else [0, 16]
    for i in examples:
        y += LINE
        note(c, 0, y, f"w{i} = {q[i]} × {d:.6g} + ({m:.6g})", mono=True)
        y += LINE
        pad = "\u00a0" * (len(f"w{i}") + 1)  # under the "=" (SVG drops leading spaces)
        note(c, 0, y, f"{pad}= {w[i]:.6g}", key=f"w.{i}", mono=True)
    return c


def _codes(block: Tensor, lo: list[int], hi: list[int]) -> Canvas:
    """Bytes 4-19 in two rows of 8, each byte's two 4-bit codes under it."""
    c = Canvas("Q4_1 block: the 16 bytes of codes")
    y = heading(c, "16 bytes: 32 codes of 4 bits", 0, 0)
    note(c, 0, y + 2, "low 4 bits of byte i: weight i,")
    note(c, 0, y + 2 + LINE, "high 4 bits: weight i + 16")
    y += 2 * LINE + 6
    for group in range(16 // PER_ROW):
        first = group * PER_ROW  # the first code byte of this row
        last = first + PER_ROW - 1
        rows = ((f"bytes {first + 4}–{last + 4}", None, "byte"),
                (f"w{first}–{last}", lo, "lo"),
                (f"w{first + 16}–{last + 16}", hi, "hi"))
        for r, (label, codes, key) in enumerate(rows):
            top = y + r * (ROW + 4)
            note(c, LABELS - 6, top + ROW / 2 + 4.5, label, anchor="end")
            for j in range(PER_ROW):
                i, x0 = first + j, LABELS + j * CELL
                if codes is None:  # the byte itself, in hex
                    c.box(x0, top, CELL, ROW, "attn", radius=2)
                    c.text(x0 + CELL / 2, top + ROW / 2 + 4.5, f"{int(block[4 + i]):02x}",
                           SMALL, mono=True, key=f"byte.{4 + i}")
                    continue
                c.grid(x0 + 1, top, [[codes[i] / 15]], cell=CELL - 2, kind="attn")
                c.text(x0 + CELL / 2, top + ROW / 2 + 3.5, str(codes[i]), SMALL, mono=True,
                       key=f"{key}.{i}")
        y += 3 * (ROW + 4) + 12
    return c


def q4_1_block(block: Tensor, name: str = "") -> Diagram:
    """One Q4_1 block, 20 uint8 bytes: d (float16), m (float16), 16 bytes of 4-bit codes.

    Labels carry keys: "byte.i" (hex of byte i), "d", "m", "lo.i" / "hi.i" (the codes of
    weights i and i + 16), "w.i" (weight i as d q_i + m, in float32)."""
    if not isinstance(block, Tensor) or block.dtype != torch.uint8 or tuple(block.shape) != (20,):
        raise ValueError(f"block must be the 20 uint8 bytes of one Q4_1 block, got "
                         f"{getattr(block, 'dtype', type(block).__name__)} "
                         f"{tuple(getattr(block, 'shape', ()))}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (the tensor's name, or ''), got "
                        f"{type(name).__name__}")
    d, m = _half(block[0:2]), _half(block[2:4])
    codes = block[4:]
    lo, hi = (codes & 0x0F).tolist(), (codes >> 4).tolist()
    q = lo + hi  # weight i: lo[i] for i < 16, hi[i - 16] after
    w = (torch.tensor([d], dtype=torch.float32) * torch.tensor(q, dtype=torch.float32)
         + torch.tensor([m], dtype=torch.float32)).tolist()

    head, body = _head(block, name, d, m, q, w), _codes(block, lo, hi)
    whole = hstack("One Q4_1 block: 20 bytes for 32 weights", [head, body], PANEL_GAP)
    return Diagram(whole, [head, body])

