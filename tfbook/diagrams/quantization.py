"""A diagram of Part VI: one Q4_1 block of a GGUF file, byte by byte, drawn from its bytes.

    from tfbook.diagrams.quantization import q4_1_block
    q4_1_block(blocks[0, :20], "blk.0.ffn_up.weight")   # 20 real bytes of a weight row

Every number on the drawing is read from the bytes it is given: the two float16 numbers (the
step d and the minimum m), the 16 bytes of codes, the two 4-bit codes each byte holds (the low
half is weight i, the high half weight i + 16) and the weights they mean, d q + m.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tfbook.diagrams._shared import heading, note
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.svg import SMALL, Canvas

CELL = 30.0  # width of one byte's cell
ROW = 26.0  # height of one row of cells
GROUP_GAP = 10.0  # room between the fields of the block


def _half(two: Tensor) -> float:
    """Two little-endian bytes as the float16 they hold, in float32."""
    return float(two.contiguous().view(torch.float16).float())


def q4_1_block(block: Tensor, name: str = "") -> Diagram:
    """One Q4_1 block, 20 uint8 bytes: d (float16), m (float16), 16 bytes of 4-bit codes.

    Labels carry keys: "byte.i" (hex of byte i), "d", "m", "lo.i" / "hi.i" (the codes of
    weights i and i + 16), "w.i" (weight i as d q_i + m, in float32)."""
    if not isinstance(block, Tensor) or block.dtype != torch.uint8 or tuple(block.shape) != (20,):
        raise ValueError(f"block must be the 20 uint8 bytes of one Q4_1 block, got "
                         f"{getattr(block, 'dtype', type(block).__name__)} "
                         f"{tuple(getattr(block, 'shape', ()))}")
    d, m = _half(block[0:2]), _half(block[2:4])
    codes = block[4:]
    lo, hi = (codes & 0x0F).tolist(), (codes >> 4).tolist()
    q = lo + hi  # weight i: lo[i] for i < 16, hi[i - 16] after
    w = (torch.tensor([d], dtype=torch.float32) * torch.tensor(q, dtype=torch.float32)
         + torch.tensor([m], dtype=torch.float32)).tolist()

    c = Canvas("One Q4_1 block: 20 bytes for 32 weights")
    title = "One Q4_1 block: 20 bytes hold 32 weights" + (f" of {name}" if name else "")
    y = heading(c, title, 0, 0)
    xs = []  # left edge of each byte
    x = 0.0
    for i in range(20):
        if i in (2, 4):
            x += GROUP_GAP
        xs.append(x)
        x += CELL
    fields = [(0, 2, "d", "norm"), (2, 4, "m", "ffn"),
              (4, 20, "16 bytes: 32 codes of 4 bits", "attn")]
    for start, stop, label, kind in fields:
        left, right = xs[start], xs[stop - 1] + CELL
        c.text((left + right) / 2, y + SMALL, label, SMALL, bold=len(label) == 1)
        c.box(left, y + SMALL + 8, right - left, ROW, kind, radius=3)
    y_bytes = y + SMALL + 8
    for i in range(20):
        c.text(xs[i] + CELL / 2, y_bytes + ROW / 2 + 4.5, f"{int(block[i]):02x}", SMALL,
               mono=True, key=f"byte.{i}")
        if i not in (0, 2, 4):
            c.line([(xs[i], y_bytes + 4), (xs[i], y_bytes + ROW - 4)], arrow=False, width=0.6)
    # under each byte of codes: its low half (weight i) and its high half (weight i + 16)
    y_codes = y_bytes + ROW + 10
    for row, (codes_row, key, label) in enumerate(((lo, "lo", "low 4 bits: w0…w15"),
                                                   (hi, "hi", "high 4 bits: w16…w31"))):
        top = y_codes + row * (ROW + 4)
        note(c, xs[4] - 8, top + ROW / 2 + 4.5, label, anchor="end")
        for i in range(16):
            x0 = xs[4 + i]
            c.grid(x0 + 1, top, [[codes_row[i] / 15]], cell=CELL - 2, kind="attn")
            c.text(x0 + CELL / 2, top + ROW / 2 + 3.5, str(codes_row[i]), SMALL, mono=True,
                   key=f"{key}.{i}")
    y = y_codes + 2 * ROW + 4 + 28
    note(c, xs[0], y, f"d = {d:.6g} (bytes {int(block[0]):02x} {int(block[1]):02x}, "
                      f"float16, little-endian), the step between two codes", key="d")
    note(c, xs[0], y + SMALL + 8, f"m = {m:.6g} (bytes {int(block[2]):02x} "
                                  f"{int(block[3]):02x}), the block's smallest weight", key="m")
    y += 2 * (SMALL + 8) + 6
    i_max = max(range(32), key=lambda i: q[i])
    examples = [0, 16, i_max] if i_max not in (0, 16) else [0, 16]
    note(c, xs[0], y, "each weight is d q + m, with its code q from 0 to 15:")
    for n, i in enumerate(examples):
        note(c, xs[0], y + (n + 1) * (SMALL + 8),
             f"w{i} = {d:.6g} × {q[i]} + ({m:.6g}) = {w[i]:.6g}", key=f"w.{i}", mono=True)
    return Diagram(c)
