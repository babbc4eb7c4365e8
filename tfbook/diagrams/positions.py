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
from tfbook.diagrams.layout import hstack
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


def _turned(D: int, n: int, t: int, base: float, start: float = 0.0) -> float:
    """The angle of the unit vector at `start` radians in plane n after `apply_rope` at t."""
    e = torch.zeros(1, D, dtype=torch.float64)
    e[0, 2 * n], e[0, 2 * n + 1] = math.cos(start), math.sin(start)
    out = apply_rope(e, torch.tensor([t]), base)[0]
    return math.atan2(out[2 * n + 1].item(), out[2 * n].item()) % math.tau


def _dial(c: Canvas, cx: float, cy: float, r: float) -> None:
    """A circle with a dashed ray at angle 0, where nothing has turned."""
    circle = [(cx + r * math.cos(a), cy - r * math.sin(a))
              for a in (k * math.tau / 48 for k in range(49))]
    c.line(circle, arrow=False, width=1.0)
    c.line([(cx, cy), (cx + r + 6, cy)], arrow=False, dashed=True, width=1.0)


def _grid(D: int, positions: tuple[int, ...], planes: tuple[int, ...], base: float,
          across: bool) -> Canvas:
    """Plane n at position t: rows are planes and columns positions (`across`), or rows are
    positions and columns planes (a phone's column holds three planes, not five positions)."""
    theta = rope_frequencies(D, float(base)).tolist()
    angles = rope_angles_drawn(D, positions, planes, float(base))
    labels = [[f"{t * theta[n]:.3g} rad" for t in positions] for n in planes]
    widest = max(text_width(text, SMALL) for row in labels for text in row)
    r = 28.0
    # across: the labels of a row keep LABEL_GAP apart; down, a column's labels stand alone
    cell_w = max(2 * r + 36, widest + LABEL_GAP) if across else max(2 * r + 30, widest + 8)
    cell_h, label_w = 108.0, (104.0 if across else 50.0)
    c = Canvas("RoPE: each plane turned by its position")
    y = heading(c, f"RoPE, D = {D}: plane n turned by t·θₙ", 0, 0)
    cols = positions if across else planes
    rows = planes if across else positions
    for j, v in enumerate(cols):  # the columns' heads
        x = label_w + (j + 0.5) * cell_w
        if across:
            c.text(x, y + 4, f"t = {v}", SMALL, bold=True, key=f"pos{j}", shape=(v,))
        else:
            c.text(x, y + 4, f"plane {v}", SMALL, bold=True, key=f"plane{j}", shape=(v,))
            note(c, x, y + 20, f"θ = {theta[v]:.3g}", f"theta{j}", anchor="middle")
            note(c, x, y + 36, f"x{2 * v}, x{2 * v + 1}", anchor="middle")
    y += 14 if across else 46
    for i, v in enumerate(rows):
        top = y + i * cell_h
        if across:
            c.text(0, top + cell_h / 2 - 6, f"plane {v}", SMALL, bold=True, anchor="start",
                   key=f"plane{i}", shape=(v,))
            note(c, 0, top + cell_h / 2 + 12, f"θ = {theta[v]:.3g}", f"theta{i}")
            note(c, 0, top + cell_h / 2 + 29, f"x{2 * v}, x{2 * v + 1}")
        else:
            c.text(0, top + cell_h / 2 - 2, f"t = {v}", SMALL, bold=True, anchor="start",
                   key=f"pos{i}", shape=(v,))
        for j in range(len(cols)):
            p_i, t_j = (i, j) if across else (j, i)  # (plane index, position index)
            cx, cy = label_w + (j + 0.5) * cell_w, top + 8 + r
            _dial(c, cx, cy, r)
            a = angles[p_i][t_j]
            c.line([(cx, cy), (cx + r * math.cos(a), cy - r * math.sin(a))],
                   colour=HEAD_COLOURS[p_i % len(HEAD_COLOURS)], width=2.2,
                   edge="a unit vector turned by apply_rope, drawn at its angle")
            note(c, cx, cy + r + 22, labels[p_i][t_j], f"angle{p_i}.{t_j}", anchor="middle")
        c.line([(0, top + cell_h - 2), (label_w + len(cols) * cell_w, top + cell_h - 2)],
               arrow=False, dashed=True, width=0.6)
    note(c, 0, y + len(rows) * cell_h + 14, "under each circle: t·θₙ; dashed: angle 0")
    return c


def rope_relative(D: int, pair: tuple[int, int], plane: int = 0, shift: int = 10,
                  base: float = 10000.0) -> Canvas:
    """A query at position t and a key at s in one plane, then both moved `shift` positions
    on: each turns, the angle between them stays (t − s)·θₙ. Every angle is read from
    `apply_rope` (a query and a key that start at different angles, as real ones do)."""
    t, s = pair
    theta = rope_frequencies(D, float(base))[plane].item()
    q0, k0 = 0.9, 0.2  # their angles before the rotation, in radians
    c = Canvas("RoPE: the angle between a query and a key")
    y = heading(c, "q at t, k at s: the angle between them", 0, 0)
    note(c, 0, y + 2, f"plane {plane}, θ = {theta:.3g}; before turning,")
    note(c, 0, y + 19, f"q points at {q0} rad and k at {k0} rad")
    r, cell_w = 40.0, 150.0
    y += 31
    gaps = []
    for j, (tq, sk) in enumerate(((t, s), (t + shift, s + shift))):
        cx, cy = (j + 0.5) * cell_w, y + 26 + r
        c.text(cx, y + 14, f"t = {tq}, s = {sk}", SMALL, bold=True, key=f"pair{j}",
               shape=(tq, sk))
        _dial(c, cx, cy, r)
        aq, ak = _turned(D, plane, tq, base, q0), _turned(D, plane, sk, base, k0)
        for a, colour, name in ((aq, HEAD_COLOURS[0], "q"), (ak, HEAD_COLOURS[1], "k")):
            tip = (cx + r * math.cos(a), cy - r * math.sin(a))
            c.line([(cx, cy), tip], colour=colour, width=2.2,
                   edge=f"{name} turned by apply_rope, drawn at its angle")
            c.text(cx + (r + 12) * math.cos(a), cy - (r + 12) * math.sin(a) + 4.5, name, SMALL,
                   bold=True)
        gap = (aq - ak) % math.tau
        gaps.append(gap)
        note(c, cx, cy + r + 24, f"q − k: {gap:.3g} rad", f"gap{j}", anchor="middle")
    expected = ((t - s) * theta + q0 - k0) % math.tau
    if any(abs(g - expected) > 1e-9 for g in gaps):
        raise RuntimeError(f"apply_rope gave angles {gaps} between q and k, not {expected}")
    note(c, 0, y + 26 + 2 * r + 46,
         f"both: (t − s)·θ + {q0 - k0:.1f} = {expected:.3g} rad", "relative", (t - s,))
    note(c, 0, y + 26 + 2 * r + 64, "so q·k depends on t − s only")
    return c


def rope_planes(D: int, positions: tuple[int, ...] = (0, 1, 2, 3),
                planes: tuple[int, ...] | None = None, base: float = 10000.0,
                relative: tuple[int, int] | None = None) -> Diagram:
    """A grid of small circles: plane n (rows) at position t (columns) turned by t * theta_n;
    on a phone, positions run down and planes across. With `relative` = (t, s), a panel shows
    a query at t and a key at s keeping their angle (t − s)·θ₀ when both move on."""
    planes = planes if planes is not None else (0, 1, D // 2 - 1) if isinstance(D, int) else ()
    _check(D, positions, planes, base)
    if relative is not None and not (isinstance(relative, tuple) and len(relative) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in relative)):
        raise ValueError(f"relative must be a pair (t, s) of positions >= 0, got {relative!r}")
    wide = [_grid(D, positions, planes, base, across=True)]
    narrow = [_grid(D, positions, planes, base, across=False)]
    if relative is not None:
        extra = rope_relative(D, relative, planes[0], base=float(base))
        wide.append(extra)
        narrow.append(extra)
    if len(wide) == 1:
        return Diagram(wide[0], narrow=narrow)
    return Diagram(hstack("RoPE", wide, 28, ["", "relative."]), wide, narrow=narrow)


__all__ = ["rope_angles_drawn", "rope_planes", "rope_relative"]
