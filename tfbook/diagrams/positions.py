"""RoPE drawn from `apply_rope`: pairs of features turned by their position.

    from tfbook.diagrams.positions import rope_planes
    rope_planes(16, positions=(0, 1, 2, 5), planes=(0, 1, 7))

Row n is plane n (features 2n and 2n + 1 of a head vector), column t is position t. In each
cell the unit vector along feature 2n is sent through `apply_rope` at position t, and the
arrow is what comes back: its angle is read from the rotated vector (atan2) and printed next
to t * theta_n, so the drawing is the function's, not a formula typed beside it.
"""

from __future__ import annotations

import math

import torch

from tfbook.diagrams._shared import heading, note
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.svg import HEAD_COLOURS, SMALL, Canvas, text_width
from tfbook.rope import apply_rope, rope_frequencies

LABEL_GAP = 20.0  # at least this much room between the angle labels of two cells


def rope_angles_drawn(D: int, positions: tuple[int, ...], planes: tuple[int, ...],
                      base: float = 10000.0) -> list[list[float]]:
    """angle[n][t]: the angle (in [0, 2 pi)) by which `apply_rope` turns plane n at position t,
    read from the rotated unit vector."""
    pos = torch.tensor(positions)
    out = []
    for n in planes:
        e = torch.zeros(len(positions), D, dtype=torch.float64)
        e[:, 2 * n] = 1.0  # the unit vector along the plane's first feature, at every position
        turned = apply_rope(e, pos, base)  # (T, D)
        out.append([math.atan2(turned[i, 2 * n + 1].item(), turned[i, 2 * n].item()) % math.tau
                    for i in range(len(positions))])
    return out


def _check(D: object, positions: object, planes: object, base: object) -> None:
    if not isinstance(D, int) or isinstance(D, bool) or D < 2 or D % 2:
        raise ValueError(f"D must be an even int >= 2 (the head size), got {D!r}")
    for name, values, top in (("positions", positions, None), ("planes", planes, D // 2)):
        if not (isinstance(values, tuple) and values and len(values) <= 8 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0
                and (top is None or v < top) for v in values)):
            limit = "ints >= 0" if top is None else f"ints in [0, {top})"
            raise ValueError(f"{name} must be a tuple of 1 to 8 {limit}, got {values!r}")
    if not isinstance(base, int | float) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")


def rope_planes(D: int, positions: tuple[int, ...] = (0, 1, 2, 3),
                planes: tuple[int, ...] | None = None, base: float = 10000.0) -> Diagram:
    """A grid of small circles: plane n (rows) at position t (columns) turned by t * theta_n."""
    planes = planes if planes is not None else (0, 1, D // 2 - 1) if isinstance(D, int) else ()
    _check(D, positions, planes, base)
    theta = rope_frequencies(D, float(base)).tolist()
    angles = rope_angles_drawn(D, positions, planes, float(base))
    labels = [[f"{t * theta[n]:.3g} rad" for t in positions] for n in planes]
    widest = max(text_width(text, SMALL) for row in labels for text in row)
    # each cell is as wide as its widest angle label plus a clear gap to the next one
    r, cell_h, label_w = 28.0, 108.0, 104.0
    cell_w = max(2 * r + 36, widest + LABEL_GAP)
    c = Canvas("RoPE: each plane turned by its position")
    y = heading(c, f"RoPE, D = {D}: plane n turned by t·θₙ", 0, 0)
    for j, t in enumerate(positions):
        c.text(label_w + (j + 0.5) * cell_w, y + 4, f"t = {t}", SMALL, bold=True,
               key=f"pos{j}", shape=(t,))
    y += 14
    for i, n in enumerate(planes):
        top = y + i * cell_h
        c.text(0, top + cell_h / 2 - 6, f"plane {n}", SMALL, bold=True, anchor="start",
               key=f"plane{i}", shape=(n,))
        note(c, 0, top + cell_h / 2 + 12, f"θ = {theta[n]:.3g}", f"theta{i}")
        note(c, 0, top + cell_h / 2 + 29, f"x{2 * n}, x{2 * n + 1}")
        colour = HEAD_COLOURS[i % len(HEAD_COLOURS)]
        for j in range(len(positions)):
            cx, cy = label_w + (j + 0.5) * cell_w, top + 8 + r
            circle = [(cx + r * math.cos(a), cy - r * math.sin(a))
                      for a in (k * math.tau / 48 for k in range(49))]
            c.line(circle, arrow=False, width=1.0)
            c.line([(cx, cy), (cx + r + 6, cy)], arrow=False, dashed=True, width=1.0)
            a = angles[i][j]
            c.line([(cx, cy), (cx + r * math.cos(a), cy - r * math.sin(a))], colour=colour,
                   width=2.2)
            note(c, cx, cy + r + 22, labels[i][j], f"angle{i}.{j}", anchor="middle")
        c.line([(0, top + cell_h - 2), (label_w + len(positions) * cell_w, top + cell_h - 2)],
               arrow=False, dashed=True, width=0.6)
    note(c, 0, y + len(planes) * cell_h + 14,
         "under each circle: t·θₙ; dashed: position 0, where nothing turns")
    return Diagram(c)


__all__ = ["rope_angles_drawn", "rope_planes"]
