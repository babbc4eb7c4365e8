"""The book's schematic diagrams, each drawn from a trace of a real forward pass.

Every function takes a `Trace` (or an `AttentionTrace`) and returns a `Diagram`. The legend
letters (B, T, S, C, H, H_kv, D, F, V) are the book's; every number next to them, and every
count of heads and layers, is read from the trace or from the traced model itself.
"""

from __future__ import annotations

from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import (
    GAP,
    Node,
    Rect,
    column,
    draw,
    hstack,
    letters_for,
    row,
    shape_label,
)
from tfbook.diagrams.svg import FONT, SMALL, Canvas, text_width
from tfbook.diagrams.trace import AttentionTrace, Trace

Shape = tuple[int, ...]
BTC = ("B", "T", "C")
BSC = ("B", "S", "C")
QUERY = ("B", "H", "T", "D")
WEIGHTS = ("B", "H", "T", "S")


def _child(name: str, part: str) -> str:
    """The dotted name of a sub-module ("" is the traced module itself)."""
    return f"{name}.{part}" if name else part


def _arg(name: str, param: str) -> str:
    """The dataflow name of argument `param` of module `name`'s call ("blocks.0:x")."""
    return f"{name}:{param}" if name else param


def _check_trace(tr: object, what: str = "trace") -> Trace:
    if not isinstance(tr, Trace):
        raise TypeError(f"{what} must be a tfbook.diagrams.Trace (from trace(model, ...)), "
                        f"got {type(tr).__name__}")
    return tr


def _check_attention(at: object) -> AttentionTrace:
    if not isinstance(at, AttentionTrace):
        raise TypeError("expected an AttentionTrace (trace(...).attention(name) or "
                        f"trace_attention(q, k, v)), got {type(at).__name__}")
    return at


def _kv_legend(at: AttentionTrace) -> tuple[str, ...]:
    grouped = at.n_kv_heads is not None and at.n_kv_heads != at.n_heads
    return ("B", "H_kv" if grouped else "H", "S", "D")


def _heading(canvas: Canvas, text: str, cx: float, y: float) -> float:
    """A panel's heading centred at cx above y; returns where the panel's content starts."""
    canvas.text(cx, y + FONT, text, FONT + 1, bold=True, sub=True)
    return y + FONT + 16


def _side_note(canvas: Canvas, x: float, y: float, text: str, key: str = "",
               shape: Shape | None = None, mono: bool = False) -> None:
    canvas.text(x, y, text, SMALL, mono=mono, anchor="start", key=key, shape=shape, sub=True)


# --- attention ----------------------------------------------------------------------------

def _flow(at: AttentionTrace, part: str) -> str:
    """The dataflow name of a tensor of this attention call: "x" or "source" (its inputs),
    "out" (its output), or a step inside it ("q", "weights", ...)."""
    if part in ("x", "source"):
        return f"{at.name}:{part}" if at.name else part
    if part == "out":
        return at.name or ("output" if at.merged is not None else "heads")
    return f"{at.name}.{part}" if at.name else part


def _wire(c: Canvas, flow: object, nodes: tuple[str, ...] = (),
          omit: tuple[tuple[str, str], ...] = (), within: str | None = None) -> None:
    """Hold the drawing's arrows against the traced computation (a drawing whose arrows are
    not the computation's dependencies is refused); `within` a module call drawn alone."""
    if flow is None:
        raise ValueError("this trace holds no dataflow to check the drawing's arrows against")
    try:
        c.check_wiring(flow, nodes, omit, within or None)
    except ValueError as error:
        raise RuntimeError(f"{c.title}: {error}") from None


def attention_path(at: AttentionTrace, title: str = "Scaled dot-product attention") -> Diagram:
    """Attention as a data path: X -> Q, K, V -> Q K^T -> / sqrt(D) -> mask -> softmax -> A V.

    With a traced `MultiHeadAttention` the path goes on to the merge of the heads and W_O.
    Every arrow is a dependency of the traced call (`AttentionTrace.flow`).
    """
    at = _check_attention(at)
    c = Canvas(title)
    kv = _kv_legend(at)
    y = 0.0
    top: Rect | None = None
    f = lambda part: _flow(at, part)  # noqa: E731
    if at.x is not None:
        top = draw(c, Node("input X", at.x, letters_for(BTC, at.x), key="x", flow=f("x")), 0, y)
        y = top.bottom + GAP + 6
    proj = [Node("Q = X W_{Q}" if top else "queries Q", at.q, letters_for(QUERY, at.q), "attn",
                 "q", flow=f("q"), stack=True),
            Node("K = X W_{K}" if top else "keys K", at.k, letters_for(kv, at.k), "attn", "k",
                 flow=f("k"), stack=True),
            Node("V = X W_{V}" if top else "values V", at.v, letters_for(kv, at.v), "attn", "v",
                 flow=f("v"), stack=True)]
    q, k, v = row(c, proj, 0, y, gap=12)
    if top is not None:
        for r, node in zip((q, k, v), proj, strict=True):
            c.line([(top.cx, top.bottom), (top.cx, top.bottom + 10), (r.cx, top.bottom + 10),
                    (r.cx, r.y)], edge=(f("x"), node.flow))
    wrap = 150.0
    steps = [
        Node("scores Q Kᵀ", at.weights, letters_for(WEIGHTS, at.weights), "attn", "scores",
             note="one score per query and key", flow=f("scores"), stack=True, wrap=wrap),
        Node("÷ √D", note=f"D = {at.head_size}", kind="plain", flow=f("scaled")),
        Node("mask", kind="mask", dashed=not at.masked,
             note="hidden keys get −∞" if at.masked else "none in this call", flow=f("masked")),
        Node("softmax over keys", at.weights, letters_for(WEIGHTS, at.weights), "attn",
             "weights", note="weights A: each row sums to 1", flow=f("weights"), stack=True,
             wrap=wrap),
        Node("A V", at.heads, letters_for(QUERY, at.heads), "attn", "heads",
             note="a weighted average of values", flow=f("heads"), stack=True, wrap=wrap),
    ]
    if at.merged is not None:
        steps += [Node("merge the heads", at.merged, BTC, key="merged", flow=f("merged"),
                       stack=True),
                  Node("output W_{O}", at.out, BTC, "attn", "out", flow=f("out"), stack=True)]
    cx = (q.cx + k.cx) / 2
    y = q.bottom + GAP + 6
    for r, node in ((q, proj[0]), (k, proj[1])):
        c.line([(r.cx, r.bottom), (r.cx, q.bottom + 12), (cx, q.bottom + 12), (cx, y)],
               edge=(node.flow, f("scores")))
    rects = column(c, steps, cx, y, same_width=True)
    av = rects[4]
    x_route = max(v.cx, max(r.right for r in rects) + 18)
    c.line([(v.cx, v.bottom), (v.cx, v.bottom + 12), (x_route, v.bottom + 12), (x_route, av.cy),
            (av.right, av.cy)], edge=(f("v"), f("heads")))
    _wire(c, at.flow, within=at.name)
    return Diagram(c)


# shades of one head colour, for the query heads that share one key/value head
SHADES = (0.5, 0.3, 0.7, 0.2, 0.6, 0.4, 0.8, 0.25)


def _head_colour(i: int, group: int, member: int) -> tuple[int, float]:
    """(colour index, fill opacity) of a head: its group's colour, a shade per member."""
    del i
    return group, SHADES[member % len(SHADES)]


def _bands(c: Canvas, cx: float, y: float, n: int, band: float, h: float,
           n_rep: int = 1) -> Rect:
    """A (T, C) tensor as n coloured slices of its columns, one per head."""
    x = cx - n * band / 2
    for i in range(n):
        c.swatch(x + i * band, y, band, h, *_head_colour(i, i // n_rep, i % n_rep))
        if band >= 18:
            c.text(x + (i + 0.5) * band, y + h / 2 + 5, str(i), SMALL)
    return Rect(x, y, n * band, h)


def _heads_row(c: Canvas, cx: float, y: float, n: int, w: float, h: float, gap: float,
               n_rep: int = 1) -> list[Rect]:
    total = n * w + (n - 1) * gap
    rects = []
    for i in range(n):
        x = cx - total / 2 + i * (w + gap)
        c.swatch(x, y, w, h, *_head_colour(i, i // n_rep, i % n_rep))
        if w >= 18:
            c.text(x + w / 2, y + h / 2 + 5, str(i), SMALL)
        rects.append(Rect(x, y, w, h))
    return rects


def head_split(tr: Trace, name: str) -> Diagram:
    """Multi-head attention's split and merge: (B, T, C) -> (B, H, T, D) -> ... -> (B, T, C).

    The columns of Q are cut into H slices of D, one per head; with grouped key/value heads
    each K, V head is drawn under the query heads that share it, all of a group in shades of
    its colour. Captions sit above the rows and the arrows run down their left side, so the
    drawing is as narrow as its heads (a phone's column holds SmolLM2's nine). Heads are
    numbered from 0, as blocks are (and as the model explorer numbers them).
    """
    tr = _check_trace(tr)
    at = tr.attention(name)
    H, H_kv = at.n_heads, at.n_kv_heads
    n_rep = H // H_kv
    f = lambda part: _flow(at, part)  # noqa: E731
    q_flat = tr.shape(_child(name, "q_proj"))
    c = Canvas(f"Multi-head attention: {H} heads split and merged")
    band = max(10.0, min(34.0, 306.0 / H))
    gap = 4.0 if band >= 18 else 2.0
    head_w = band if band < 18 else band - gap
    row_cx = H * band / 2  # rows start at x = 0
    spine = 14.0  # the arrows between the rows run down here, their notes beside them

    def caption(y: float, *lines: tuple[str, str, Shape | None]) -> float:
        for text, key, shape in lines:
            _side_note(c, 0, y + 12, text, key, shape, mono="= (" in text)
            y += 17
        return y + 4

    def step(y: float, note: str, edge: list[tuple[str, str]] | tuple[str, str]) -> float:
        c.arrow(spine, y, spine, y + 30, edge=edge)
        if note:
            _side_note(c, spine + 12, y + 20, note)
        return y + 34

    x_node = Node("input X", at.x, BTC, key="x", flow=f("x"))
    rect = draw(c, x_node, x_node.width / 2, 0)
    y = step(rect.bottom, "Q = X W_{Q}", (f("x"), _child(name, "q_proj")))
    y = caption(y, (f"Q: H = {H} slices of D = {at.head_size} columns", "", None),
                (shape_label(BTC, q_flat), "q_flat", q_flat))
    flat = _bands(c, row_cx, y, H, band, 40, n_rep)
    y = step(flat.bottom, "view (B, T, H, D), transpose(1, 2)", (_child(name, "q_proj"), f("q")))
    y = caption(y, (f"query heads: H = {H}", "n_heads", (H,)),
                (shape_label(QUERY, at.q), "q", at.q))
    heads = _heads_row(c, row_cx, y, H, head_w, 34, gap, n_rep)
    y = heads[-1].bottom + 16
    kv_legend = _kv_legend(at)
    for g in range(H_kv):
        group = heads[g * n_rep:(g + 1) * n_rep]
        x0, x1 = group[0].x, group[-1].right
        c.swatch(x0, y, x1 - x0, 26, g, 0.55)
        label = f"K, V {g}" if x1 - x0 >= 50 else f"{g}"
        c.text((x0 + x1) / 2, y + 18, label, SMALL)
        for member in group:  # the query heads that read this key/value head
            c.line([(member.cx, member.bottom), (member.cx, y)], arrow=False, dashed=True)
    y += 26 + 4
    counts = (f"H_kv = {H_kv} head{'s' if H_kv > 1 else ''}, each read by {n_rep} query heads",
              "n_kv_heads",
              (H_kv, n_rep)) if H_kv != H else ("one K, V head per query head", "", None)
    y = caption(y, ("K = X W_{K}, V = X W_{V}, split the same way:", "", None), counts,
                (shape_label(kv_legend, at.k), "k", at.k))
    # the weights and outputs come from the query heads and the K, V heads above
    y = step(y, "each head attends with the K, V it reads",
             [(f("q"), f("heads")), (f("k"), f("heads")), (f("v"), f("heads"))])
    y = caption(y, ("weights " + shape_label(WEIGHTS, at.weights), "weights", at.weights),
                ("outputs " + shape_label(QUERY, at.heads), "heads", at.heads))
    outs = _heads_row(c, row_cx, y, H, head_w, 34, gap, n_rep)
    y = step(outs[-1].bottom, "transpose(1, 2), reshape: concatenate",
             (f("heads"), f("merged")))
    y = caption(y, (shape_label(BTC, at.merged), "merged", at.merged))
    merged = _bands(c, row_cx, y, H, band, 40, n_rep)
    y = step(merged.bottom, "", (f("merged"), f("out")))
    out = Node("output W_{O} (mixes the heads)", at.out, BTC, "attn", "out", flow=f("out"))
    draw(c, out, out.width / 2, y)
    # K and V come from X as Q does (the caption says so); the drawing follows Q's columns
    _wire(c, tr.flow, omit=((f("x"), f("k")), (f("x"), f("v"))), within=at.name)
    return Diagram(c)


def cross_attention(at: AttentionTrace, title: str = "Cross-attention") -> Diagram:
    """Queries from the decoder's stream, keys and values from the encoder's output (the
    memory): K meets Q in the softmax, V goes around it into A V. Every arrow is a
    dependency of the traced call."""
    at = _check_attention(at)
    if at.source is None:
        raise ValueError("this attention call had no source: it is self-attention, "
                         "not cross-attention")
    f = lambda part: _flow(at, part)  # noqa: E731
    c = Canvas(title)
    kv = _kv_legend(at)
    wrap = 130.0
    mem = Node("memory", at.source, BSC, key="source", note="the encoder's output",
               flow=f("source"), stack=True, wrap=wrap)
    xs = Node("decoder stream X", at.x, BTC, key="x", flow=f("x"), stack=True, wrap=wrap)
    kn = Node("K = memory W_{K}", at.k, letters_for(kv, at.k), "attn", "k", flow=f("k"),
              stack=True, wrap=wrap)
    vn = Node("V = memory W_{V}", at.v, letters_for(kv, at.v), "attn", "v", flow=f("v"),
              stack=True, wrap=wrap)
    qn = Node("Q = X W_{Q}", at.q, QUERY, "attn", "q", flow=f("q"), stack=True)
    sm = Node("softmax(Q Kᵀ / √D)", at.weights, WEIGHTS, "attn", "weights",
              note="each target position reads the source", flow=f("weights"), stack=True,
              wrap=wrap)
    av = Node("A V", at.heads, QUERY, "attn", "heads", note="a weighted average of values",
              flow=f("heads"), stack=True, wrap=wrap)
    out = Node("merge heads, W_{O}", at.out, BTC, "attn", "out", flow=f("out"), stack=True,
               wrap=wrap)
    w_left = max(mem.width, kn.width, vn.width)
    w_right = max(xs.width, qn.width, sm.width, av.width, out.width)
    xl, xr = 14 + w_left / 2, 14 + w_left + 32 + w_right / 2
    m = draw(c, mem, xl, 0, w_left)
    x = draw(c, xs, xr, 0, w_right)
    y = max(m.bottom, x.bottom) + GAP
    kr = draw(c, kn, xl, y, w_left)
    qr = draw(c, qn, xr, y, w_right)
    c.arrow(xl, m.bottom, xl, kr.y, edge=(mem.flow, kn.flow))
    c.arrow(xr, x.bottom, xr, qr.y, edge=(xs.flow, qn.flow))
    y = max(kr.bottom, qr.bottom) + GAP + 8
    smr = draw(c, sm, xr, y, w_right)
    c.arrow(xr, qr.bottom, xr, smr.y, edge=(qn.flow, sm.flow))
    c.line([(kr.right, kr.cy), (kr.right + 14, kr.cy), (kr.right + 14, smr.cy),
            (smr.x, smr.cy)], edge=(kn.flow, sm.flow))
    y = max(smr.bottom, kr.bottom) + GAP
    vr = draw(c, vn, xl, y, w_left)
    # the memory's line to V passes left of K
    c.line([(m.x + 12, m.bottom), (m.x + 12, m.bottom + 8), (4, m.bottom + 8), (4, vr.cy),
            (vr.x, vr.cy)], edge=(mem.flow, vn.flow))
    avr = draw(c, av, xr, max(vr.cy - av.height / 2, smr.bottom + GAP), w_right)
    c.arrow(xr, smr.bottom, xr, avr.y, edge=(sm.flow, av.flow))
    c.line([(vr.right, vr.cy), (vr.right + 14, vr.cy), (vr.right + 14, avr.cy),
            (avr.x, avr.cy)], edge=(vn.flow, av.flow))
    y = avr.bottom + GAP
    o = draw(c, out, xr, y, w_right)
    c.arrow(xr, avr.bottom, xr, o.y, edge=(av.flow, out.flow))
    c.text(o.cx, o.bottom + 18, ["then added to", "the decoder stream"], SMALL)
    _wire(c, at.flow, within=at.name)
    return Diagram(c)


def masks(panels: list[tuple], tokens: list[str] | None = None, title: str = "Masks",
          self_attention: bool = False) -> Diagram:
    """Boolean masks drawn cell by cell (filled: the query of the row may read the key of the
    column), each with its real shape.

    `panels` is a list of (heading, mask tensor) or (heading, mask tensor, batch index); a
    mask of more than 2 axes is drawn at that index of its first axis (default 0) and index
    0 of the others (a broadcast axis of size 1 is drawn as one row, for every query).
    Queries run down ("query ↓"), keys across ("key →"), each labelled with its token when
    `tokens` has one per position, else with its position. A key that no query may read is
    marked "pad"; a query that may read no key is outlined: it reads nothing, so its output is
    zero. With `self_attention` the keys are the queries' own positions: (T, T).
    """
    import torch

    if not isinstance(panels, list) or not panels:
        raise TypeError("masks needs a non-empty list of (heading, mask tensor) pairs")
    if tokens is not None and not (isinstance(tokens, list)
                                   and all(isinstance(t, str) for t in tokens)):
        raise TypeError("tokens must be a list of str")
    keys = "T" if self_attention else "S"
    canvases = []
    for i, panel in enumerate(panels):
        if not (isinstance(panel, tuple) and len(panel) in (2, 3) and isinstance(panel[0], str)
                and isinstance(panel[1], torch.Tensor)):
            raise TypeError(f"panel {i} must be (heading, mask tensor[, batch index]), "
                            f"got {panel!r:.80}")
        heading, mask = panel[0], panel[1]
        if mask.dtype != torch.bool or mask.dim() < 2:
            raise ValueError(f"panel {heading!r}: a mask is a boolean tensor of at least 2 "
                             f"axes, got {mask.dtype} of shape {tuple(mask.shape)}")
        at = panel[2] if len(panel) == 3 else 0
        if mask.dim() > 2 and not (isinstance(at, int) and 0 <= at < mask.size(0)):
            raise ValueError(f"panel {heading!r}: batch index must be an int in "
                             f"[0, {mask.size(0)}), got {at!r}")
        shape = tuple(mask.shape)
        plane = mask[(at,) + (0,) * (mask.dim() - 3)] if mask.dim() > 2 else mask
        rows, cols = plane.shape
        cells = plane.tolist()
        cell = max(14.0, min(22.0, 220.0 / max(rows, cols)))
        c = Canvas(heading)
        row_names = ([_visible(t) for t in tokens] if tokens is not None and len(tokens) == rows
                     else ["every query"] if rows == 1 else [str(r) for r in range(rows)])
        col_names = ([_visible(t) for t in tokens] if tokens is not None
                     and len(tokens) == cols else [str(k) for k in range(cols)])
        label_w = max(max(text_width(t, SMALL, True) for t in row_names) + 8,
                      text_width("query ↓", SMALL) + 4)
        top_h = max(text_width(t, SMALL, True) for t in col_names) + 8
        y = _heading(c, heading, label_w + cols * cell / 2, 0)
        c.text(label_w, y + 4, "key →", SMALL, anchor="start")
        y += 12
        for k, name in enumerate(col_names):  # the keys' labels, read upwards
            c.text(label_w + (k + 0.5) * cell + 4.5, y + top_h, name, SMALL, mono=True,
                   anchor="start", vertical=True)
        c.text(label_w - 6, y + top_h - 2, "query ↓", SMALL, anchor="end")
        y += top_h + 6
        c.grid(label_w, y, [[1.0 if b else 0.0 for b in r] for r in cells], cell)
        for r, name in enumerate(row_names):
            c.text(label_w - 6, y + (r + 0.5) * cell + 4.5, name, SMALL, mono=True,
                   anchor="end")
        right = label_w + cols * cell
        empty = [r for r in range(rows) if not any(cells[r])]
        for r in empty:  # a query with nothing to read: outlined, its output is zero
            c.box(label_w - 2, y + r * cell - 1, cols * cell + 4, cell + 2, "head", dashed=True,
                  radius=2)
        if empty:
            c.text(right + 8, y + (empty[0] + 0.5) * cell + 4.5, "reads nothing:", SMALL,
                   anchor="start")
            c.text(right + 8, y + (empty[0] + 1.5) * cell + 4.5, "output 0", SMALL,
                   anchor="start")
        bottom = y + rows * cell
        pads = [k for k in range(cols) if not any(cells[r][k] for r in range(rows))]
        runs: list[list[int]] = []
        for k in pads:  # keys no query may read, named once per run of neighbours
            if runs and runs[-1][-1] == k - 1:
                runs[-1].append(k)
            else:
                runs.append([k])
        for run in runs:
            c.text(label_w + (run[0] + run[-1] + 1) / 2 * cell, bottom + 15,
                   "pad" if len(run) == 1 else "pads", SMALL)
        bottom += 20 if pads else 0
        legend = {2: ["T", keys], 4: ["B", "H", "T", keys]}.get(
            len(shape), [f"d{j}" for j in range(len(shape))])
        cx = label_w + cols * cell / 2
        c.text(cx, bottom + 18, shape_label(legend, shape), SMALL, mono=True,
               key=f"mask{i}", shape=shape)
        if mask.dim() > 2:
            note = f"batch row {at} (from 0)" + ("; one row for all queries" if rows == 1
                                                 else "")
            c.text(cx, bottom + 36, note, SMALL)
        canvases.append(c)
    return Diagram(hstack(title, canvases, 24), canvases)


# --- blocks -------------------------------------------------------------------------------

def _norm_title(tr: Trace, name: str) -> str:
    return {"LayerNorm": "LayerNorm", "RMSNorm": "RMSNorm"}.get(tr.kind(name), tr.kind(name))


def _ffn_node(tr: Trace, name: str, letters: tuple[str, ...] = BTC,
              stack: bool = False) -> Node:
    kind = tr.kind(name)
    hidden = tr.shape(_child(name, "fc_in"))
    label = {"FeedForward": "FFN (MLP)", "SwiGLU": "FFN (SwiGLU)"}.get(kind, kind)
    return Node(label, tr.shape(name), letters, "ffn", name,
                note=f"F = {hidden[-1]}{chr(10) if stack else ' '}hidden units", flow=name,
                stack=stack)


def _attn_node(tr: Trace, name: str, title: str, letters: tuple[str, ...] = BTC,
               stack: bool = False, note: str = "") -> Node:
    at = tr.attention(name)
    heads = f"H = {at.n_heads} heads"
    if at.n_kv_heads != at.n_heads:
        heads += f", H_kv = {at.n_kv_heads}"
    return Node(title, at.out, letters, "attn", name, note=note + heads, flow=name,
                stack=stack)


def block(tr: Trace, name: str, heading: str | None = None) -> Diagram:
    """One block: the residual stream as a vertical line, each sub-layer reading from it and
    adding back into it (pre-LN: norm inside the branch; post-LN: norm on the stream). Every
    arrow, and every stretch of the stream, is a dependency of the traced call."""
    return Diagram(_block_canvas(_check_trace(tr), name, heading))


def _block_canvas(tr: Trace, name: str, heading: str | None) -> Canvas:
    kind = tr.kind(name)
    if kind == "SelfAttentionBlock":
        subs = [(_attn_node(tr, _child(name, "attn"), "self-attention"), "norm1"),
                (_ffn_node(tr, _child(name, "ff")), "norm2")]
    elif kind == "CrossAttentionBlock":  # narrower boxes: the memory sits beside them
        subs = [(_attn_node(tr, _child(name, "self_attn"), "self-attention", stack=True,
                            note="masked,\n"), "norm1"),
                (_attn_node(tr, _child(name, "cross_attn"), "cross-attention", stack=True),
                 "norm2"),
                (_ffn_node(tr, _child(name, "ff"), stack=True), "norm3")]
        for node, _ in subs:
            node.wrap = 130.0
    else:
        raise ValueError(f"{name!r} is a {kind}, not a SelfAttentionBlock or CrossAttentionBlock")
    pre = bool(tr.module(name).norm_first)
    c = Canvas(heading or f"{'Pre' if pre else 'Post'}-LN block")
    width = max(node.width for node, _ in subs)
    bx, branch = 0.0, 34 + width / 2
    y = 0.0
    if heading:
        y = _heading(c, heading, branch / 2, y)
    x_in = tr.input_shape(name)
    centre = branch / 2  # the stream's first and last boxes straddle the bus
    stream = _input_flow(tr, name)  # the stream's value at this point of the drawing
    top = draw(c, Node("residual stream x", x_in, BTC, "stream", _child(name, "in"),
                       flow=stream, stack=kind == "CrossAttentionBlock"), centre, y)
    bus_from = top.bottom
    y = top.bottom + 18
    for i, (node, norm_part) in enumerate(subs):
        norm_flow = _child(name, norm_part)
        norm = Node(_norm_title(tr, norm_flow), kind="norm", flow=norm_flow)
        if pre:  # the sum is the next norm's input, or the block's output
            total = f"{_child(name, subs[i + 1][1])}:x" if i + 1 < len(subs) else (name or
                                                                                  "output")
        else:
            total = f"{norm_flow}:x"
        c.text(bx - 8, y + 4, "read", SMALL, anchor="end")
        c.line([(bx, y), (branch, y), (branch, y + 16)],
               edge=(stream, norm.flow if pre else node.flow))
        y += 16
        if pre:
            r = draw(c, norm, branch, y)
            c.arrow(branch, r.bottom, branch, r.bottom + 14, edge=(norm.flow, node.flow))
            y = r.bottom + 14
        r = draw(c, node, branch, y, width)
        if kind == "CrossAttentionBlock" and i == 1:  # the memory comes in from the side
            memory = Node("memory", tr.input_shape(name, index=1), BSC, "stream",
                          _child(name, "memory"), flow=_arg(name, "memory"), stack=True)
            m = draw(c, memory, r.right + 14 + memory.width / 2, r.y)
            c.arrow(m.x, r.cy, r.right, r.cy, edge=(memory.flow, node.flow))
        y_add = r.bottom + 22
        c.line([(branch, r.bottom), (branch, y_add), (bx + 11, y_add)], edge=(node.flow, total))
        c.bus(bx, bus_from, y_add - 11, edge=(stream, total))
        c.adder(bx, y_add)
        c.text(bx - 16, y_add + 5, "add", SMALL, anchor="end")
        bus_from = y_add + 11
        y = y_add + 24
        stream = total
        if not pre:
            c.bus(bx, bus_from, y, edge=(stream, norm.flow))
            r = draw(c, norm, bx, y)
            bus_from = r.bottom
            y = r.bottom + 18
            stream = norm.flow
    out_name = _child(name, "out")
    c.bus(bx, bus_from, y + 4)
    c.arrow(bx, y + 4, bx, y + 14, edge=(stream, name or "output"))
    draw(c, Node("to the next block", tr.shape(name), BTC, "stream", out_name,
                 flow=name or "output", stack=kind == "CrossAttentionBlock"), centre, y + 14)
    _wire(c, tr.flow, within=name)
    return c


def blocks_side_by_side(pre: tuple[Trace, str], post: tuple[Trace, str]) -> Diagram:
    """A pre-LN and a post-LN block next to each other, each from its own trace."""
    for what, pair in (("pre", pre), ("post", post)):
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"{what} must be a (trace, block name) pair, got {pair!r:.60}")
        _check_trace(pair[0], f"{what}[0]")
    a = _block_canvas(pre[0], pre[1], "pre-LN: x + f(norm(x))")
    b = _block_canvas(post[0], post[1], "post-LN: norm(x + f(x))")
    if pre[0].module(pre[1]).norm_first is not True or post[0].module(post[1]).norm_first:
        raise ValueError("pre must be a pre-LN block (norm_first=True), post a post-LN one")
    return Diagram(hstack("Pre-LN and post-LN blocks", [a, b], 24, ["pre.", "post."]), [a, b])


def ffn(tr: Trace, name: str, heading: str | None = "") -> Diagram:
    """The position-wise feed-forward network: C -> F -> C (MLP), or gated (SwiGLU).

    The heading is its formula with the module's activation ("" ), `None` for none."""
    return Diagram(_ffn_canvas(_check_trace(tr), name, heading))


def _ffn_canvas(tr: Trace, name: str, heading: str | None) -> Canvas:
    kind = tr.kind(name)
    if kind not in ("FeedForward", "SwiGLU"):
        raise ValueError(f"{name!r} is a {kind}, not a FeedForward or SwiGLU")
    act = _activation_name(tr.module(name).act)
    hidden = tr.shape(_child(name, "fc_in"))
    if heading == "":  # the formula, with this module's activation
        heading = (f"MLP: {act}(x W_{{1}}) W_{{2}}" if kind == "FeedForward"
                   else f"SwiGLU: ({act}(x W_{{gate}}) × x W_{{1}}) W_{{2}}")
    c = Canvas(heading or kind)
    y = _heading(c, heading, 0, 0) if heading else 0.0
    f = lambda part: _child(name, part)  # noqa: E731
    BTF = ("B", "T", "F")
    top = draw(c, Node("x", tr.input_shape(name), BTC, key=f("in"), flow=_input_flow(tr, name),
                       stack=True), 0, y)
    y = top.bottom + GAP
    out = Node("W_{2}: back to C", tr.shape(f("fc_out")), BTC, "ffn", f("fc_out"),
               flow=f("fc_out"), stack=True)
    if kind == "FeedForward":
        column(c, [Node("W_{1}: widen", hidden, BTF, "ffn", f("fc_in"), flow=f("fc_in"),
                        stack=True),
                   Node(act, hidden, BTF, "plain", f("act"), note="one unit at a time",
                        flow=f("act"), stack=True),
                   out], 0, y)
        c.arrow(0, top.bottom, 0, y, edge=(_input_flow(tr, name), f("fc_in")))
    else:  # SwiGLU
        gate_shape = tr.shape(f("fc_gate"))
        gate_n = Node("W_{gate}", gate_shape, BTF, "ffn", f("fc_gate"), flow=f("fc_gate"),
                      stack=True)
        up_n = Node("W_{1}", hidden, BTF, "ffn", f("fc_in"), flow=f("fc_in"), stack=True)
        gate, up = row(c, [gate_n, up_n], 0, y, gap=24)
        for r, node in ((gate, gate_n), (up, up_n)):
            c.line([(0, top.bottom), (0, top.bottom + 10), (r.cx, top.bottom + 10), (r.cx, r.y)],
                   edge=(_input_flow(tr, name), node.flow))
        y = gate.bottom + GAP
        act_n = Node(act, gate_shape, BTF, "plain", f("act"), flow=f("act"), stack=True)
        g = draw(c, act_n, gate.cx, y)
        c.arrow(gate.cx, gate.bottom, gate.cx, g.y, edge=(gate_n.flow, act_n.flow))
        y = g.bottom + GAP
        product = f"{f('dropout')}:input"  # gate × value: the input of the FFN's dropout
        c.line([(g.cx, g.bottom), (g.cx, y), (-11, y)], edge=(act_n.flow, product))
        c.line([(up.cx, up.bottom), (up.cx, y), (11, y)], edge=(up_n.flow, product))
        c.adder(0, y, "×")
        _side_note(c, 16, y + 24, "gate × value, unit by unit")
        y += 11 + GAP + 8
        draw(c, out, 0, y)
        c.arrow(0, y - GAP - 8, 0, y, edge=(product, out.flow))
    _wire(c, tr.flow, within=name)
    return c


def ffns_side_by_side(mlp: tuple[Trace, str], swiglu: tuple[Trace, str]) -> Diagram:
    """The MLP and the SwiGLU feed-forward networks next to each other."""
    a = _ffn_canvas(_check_trace(mlp[0], "mlp[0]"), mlp[1], "")
    b = _ffn_canvas(_check_trace(swiglu[0], "swiglu[0]"), swiglu[1], "")
    if (a.title.split(":")[0], b.title.split(":")[0]) != ("MLP", "SwiGLU"):
        raise ValueError("ffns_side_by_side takes an MLP (FeedForward) first, then a SwiGLU")
    return Diagram(hstack("Feed-forward networks", [a, b], 24, ["mlp.", "swiglu."]), [a, b])


def _activation_name(fn: object) -> str:
    """The name of an FFN's activation ("gelu", "silu", ...); "activation" for a lambda."""
    name = getattr(fn, "__name__", "")
    return name if name and not name.startswith("<") else "activation"


# --- whole models -------------------------------------------------------------------------

def _tokens(name: str, tokens: object) -> list[str] | None:
    if tokens is None:
        return None
    if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        raise TypeError(f"{name} must be a list of str (tokens), got {tokens!r:.60}")
    return tokens


def _visible(token: str) -> str:
    """A token as a reader can see it: a space as ␣, control characters escaped."""
    return repr(token)[1:-1].replace(" ", "␣") or "∅"


def _input_flow(tr: Trace, name: str) -> str:
    """The dataflow name of the first input of module `name` ("tok_emb:idx")."""
    import inspect

    first = next(iter(inspect.signature(tr.module(name).forward).parameters))
    return _arg(name, first)


def _shift_strip(c: Canvas, cx: float, y: float, inputs: list[str], targets: list[str],
                 most: int = 8) -> Rect:
    """Inputs over targets: target t is input t + 1, drawn as a diagonal arrow. Returns the
    rectangle of the target row."""
    n = min(len(inputs), len(targets), most)
    cells = [_visible(t) for t in inputs[:n] + targets[:n]]
    w = max(text_width(t, SMALL, True) for t in cells) + 10
    w = max(w, 26.0)
    total = n * (w + 6) - 6
    x0 = cx - total / 2 + 26
    c.text(x0 - 8, y + 18, "input", SMALL, anchor="end")
    c.text(x0 - 8, y + 76, "target", SMALL, anchor="end")
    for j in range(n):
        x = x0 + j * (w + 6)
        for yy, tok, kind in ((y, inputs[j], "embed"), (y + 58, targets[j], "head")):
            c.box(x, yy, w, 26, kind)
            c.text(x + w / 2, yy + 18, _visible(tok), SMALL, mono=True)
        if j + 1 < n:
            c.arrow(x + w + 6 + w / 2, y + 26, x + w / 2, y + 58, dashed=True,
                    edge="the shift: target t is input t + 1, the same ids")
    right = x0 + total
    if min(len(inputs), len(targets)) > n:
        c.text(right + 4, y + 48, "…", FONT, anchor="start")
        right += 16
    return Rect(x0, y + 58, right - x0, 26)


def decoder_stack(tr: Trace, inputs: list[str] | None = None, targets: list[str] | None = None,
                  compact: bool = False, heading: str | None = None) -> Diagram:
    """A decoder-only model (GPT): ids, embeddings, N causal blocks (counted from 0, as in the
    code), final norm, the LM head tied to the token embedding, and (given the tokens) the
    loss against the input shifted by one. Every arrow is a dependency of the traced pass."""
    return Diagram(_decoder_canvas(_check_trace(tr), _tokens("inputs", inputs),
                                   _tokens("targets", targets), compact, heading))


WRAP = 190.0  # the notes of a model's column wrap here: the column fits a phone


def _decoder_canvas(tr: Trace, inputs: list[str] | None, targets: list[str] | None,
                    compact: bool, heading: str | None) -> Canvas:
    model = tr.model
    if tr.kind("") != "GPT":
        raise ValueError(f"decoder_stack draws a GPT, got a {tr.kind('')}")
    n = len(model.blocks)
    c = Canvas(heading or f"Decoder-only model, {n} blocks")
    y = _heading(c, heading, 0, 0) if heading else 0.0
    st = compact  # two-line shapes in the narrow panel of `families`
    nodes = [Node("token ids", tr.input_shape("tok_emb"), ("B", "T"), key="ids",
                  flow=_input_flow(tr, "tok_emb"))]
    emb = tuple(model.tok_emb.weight.shape)
    nodes.append(Node("token embedding E", tr.shape("tok_emb"), BTC, "embed", "tok_emb",
                      note="E: " + shape_label(("V", "C"), emb), flow="tok_emb", stack=st,
                      wrap=WRAP))
    if "pos_emb" in tr.calls:
        nodes.append(Node("+ position embedding", tr.shape("pos_emb"), BTC, "embed", "pos_emb",
                          flow="pos_emb", stack=st))
    at = tr.attention("blocks.0.attn")
    heads = f"H = {at.n_heads}" + (f", H_kv = {at.n_kv_heads}" if at.n_kv_heads != at.n_heads
                                   else "")
    if compact or n > 3:
        nodes.append(Node(f"{n} × decoder block", tr.shape(f"blocks.{n - 1}"), BTC, "attn",
                          "blocks", note=f"causal ({heads}), FFN", flow=f"blocks.{n - 1}",
                          stack=st, wrap=WRAP))
    else:
        for i in range(n):
            nodes.append(Node(f"block {i}", tr.shape(f"blocks.{i}"), BTC, "attn",
                              f"blocks.{i}", note=f"causal self-attention ({heads}), FFN",
                              flow=f"blocks.{i}", wrap=WRAP))
    nodes.append(Node("final norm", tr.shape("norm_f"), BTC, "norm", "norm_f", flow="norm_f",
                      stack=st))
    tied = model.lm_head.weight is model.tok_emb.weight
    nodes.append(Node("LM head: logits", tr.shape("lm_head"), ("B", "T", "V"), "head", "logits",
                      note="h Eᵀ: the same E, tied" if tied else "its own (V, C) matrix",
                      flow="lm_head", stack=st, wrap=WRAP))
    rects = column(c, nodes, 0, y, same_width=True)
    if tied:  # one matrix in two places: a dashed link, no arrow (nothing flows along it)
        emb_r, head_r = rects[1], rects[-1]
        xr = head_r.right + 16
        c.line([(head_r.right, head_r.cy), (xr, head_r.cy), (xr, emb_r.cy),
                (emb_r.right, emb_r.cy)], arrow=False, dashed=True)
        c.text(xr + 5, (emb_r.cy + head_r.cy) / 2 - 8, "tied:", SMALL, anchor="start")
        c.text(xr + 5, (emb_r.cy + head_r.cy) / 2 + 8, "one E", SMALL, anchor="start")
    if inputs is not None and targets is not None:
        logits = rects[-1]
        y = logits.bottom + GAP
        has_loss = "loss" in tr.flow
        loss = Node("loss: cross-entropy", note="the logits at t against target t",
                    kind="head", flow="loss" if has_loss else "", wrap=WRAP)
        lr = draw(c, loss, 0, y)
        c.arrow(0, logits.bottom, 0, y, edge=("lm_head", "loss") if has_loss else
                "the loss of the logits (computed when the targets are given)")
        strip = _shift_strip(c, 0, lr.bottom + 14, inputs, targets)
        x_back = max(strip.right, lr.right) + 12
        c.line([(strip.right, strip.cy), (x_back, strip.cy), (x_back, lr.cy), (lr.right, lr.cy)],
               edge=("targets", "loss") if has_loss else "the targets the loss compares with")
    _wire(c, tr.flow)
    return c
def _frame(c: Canvas, nodes: list[Node], cx: float, y: float, count: int, label: str,
           skips: list[tuple[int, int]], entry: str, gap: float = 14,
           right: bool = False, skips_right: bool = True) -> list[Rect]:
    """A dashed frame around a column of nodes (one block), marked "N ×" on its left (or
    right), with the residual stream's skips drawn inside it on its right (or left): (index
    of the node holding the stream, -1 for the block's input `entry`; index of the add it
    rejoins)."""
    width = max(n.width for n in nodes) + 24
    height = sum(n.height for n in nodes) + gap * (len(nodes) - 1) + 20
    c.box(cx - width / 2, y, width, height, "plain", dashed=True)
    c.text(cx + width / 2 + 8 if right else cx - width / 2 - 8, y + height / 2 + 5,
           f"{count} ×", FONT, bold=True, anchor="start" if right else "end", key=label,
           shape=(count,))
    rects = column(c, nodes, cx, y + 10, gap, same_width=True)
    side = 1 if skips_right else -1
    x_skip = cx + side * (width / 2 - 6)
    for start, end in skips:
        y0 = y - 6 if start < 0 else rects[start].bottom + gap / 2
        source = entry if start < 0 else nodes[start].flow
        edge_x = rects[end].right if side > 0 else rects[end].x
        c.line([(cx, y0), (x_skip, y0), (x_skip, rects[end].cy), (edge_x, rects[end].cy)],
               edge=(source, nodes[end].flow), width=1.2)
    return rects


def _sublayers(block: str, pre: bool, subs: list[tuple[Node, str]]
               ) -> tuple[list[Node], list[tuple[int, int]]]:
    """The column of one block and its residual skips: each sub-layer with its norm (inside
    the branch before it, pre-LN; on the stream after the add, post-LN), and the add where
    the stream rejoins (-1: the block's input)."""
    nodes: list[Node] = []
    skips: list[tuple[int, int]] = []
    stream = -1
    for k, (node, norm_name) in enumerate(subs):
        norm_flow = _child(block, norm_name)
        if pre:  # the sum is the next norm's input, or the block's output
            total = f"{_child(block, subs[k + 1][1])}:x" if k + 1 < len(subs) else block
            nodes += [Node("norm", kind="norm", flow=norm_flow), node,
                      Node("add", kind="plain", flow=total)]
        else:
            nodes += [node, Node("add & norm", kind="norm", flow=norm_flow)]
        skips.append((stream, len(nodes) - 1))
        stream = len(nodes) - 1
    return nodes, skips


def encoder_decoder(tr: Trace, compact: bool = False, heading: str | None = None) -> Diagram:
    """The encoder-decoder (Vaswani et al., figure 1) with the traced shapes: the residual
    skips into every add & norm, the memory into every cross-attention. On a phone's column
    the decoder stands under the encoder. Every arrow is a dependency of the traced pass."""
    tr = _check_trace(tr)
    wide = _encdec_canvas(tr, compact, heading)
    narrow = _encdec_canvas(tr, compact, heading, stacked=True)
    return Diagram(wide, narrow=[narrow])


def _encdec_canvas(tr: Trace, compact: bool, heading: str | None,
                   stacked: bool = False) -> Canvas:
    if tr.kind("") != "Transformer":
        raise ValueError(f"encoder_decoder draws a Transformer, got a {tr.kind('')}")
    model = tr.model
    n_enc, n_dec = len(model.encoder), len(model.decoder)
    pre = bool(model.config.norm_first)
    src_emb = "src_emb"
    tgt_emb, tgt_call = ("src_emb", 1) if model.tgt_emb is model.src_emb else ("tgt_emb", 0)
    src_ids = tr.input_shape(src_emb)
    tgt_ids = tr.input_shape(tgt_emb, tgt_call)
    src_x, tgt_x = tr.shape("pos_enc", 0), tr.shape("pos_enc", 1)
    enc_at = tr.attention("encoder.0.attn")
    self_at = tr.attention("decoder.0.self_attn")
    cross_at = tr.attention("decoder.0.cross_attn")
    ff_e = tr.shape("encoder.0.ff.fc_in")
    ff_d = tr.shape("decoder.0.ff.fc_in")
    H = f"H = {enc_at.n_heads}"
    memory_flow = "encoder_norm" if model.encoder_norm is not None else f"encoder.{n_enc - 1}"
    dec_out = "decoder_norm" if model.decoder_norm is not None else f"decoder.{n_dec - 1}"
    st = compact  # two-line shapes in the narrow panel of `families`
    if compact:
        enc_inner = [Node(f"{n_enc} × encoder block", tr.shape(f"encoder.{n_enc - 1}"), BSC,
                          "attn", "encoder", note=f"attention ({H}), FFN",
                          flow=f"encoder.{n_enc - 1}", stack=st)]
        dec_inner = [Node(f"{n_dec} × decoder block", tr.shape(f"decoder.{n_dec - 1}"), BTC,
                          "attn", "decoder", note="masked, cross, FFN", flow=dec_out, stack=st)]
        enc_skips: list[tuple[int, int]] = []
        dec_skips: list[tuple[int, int]] = []
        cross_index = 0
    else:
        enc_inner, enc_skips = _sublayers("encoder.0", pre, [
            (Node("self-attention", enc_at.weights, ("B", "H", "S", "S"), "attn", "enc_weights",
                  note=H, flow="encoder.0.attn", stack=stacked), "norm1"),
            (Node("FFN", ff_e, ("B", "S", "F"), "ffn", "enc_ffn", flow="encoder.0.ff",
                  stack=stacked), "norm2")])
        dec_inner, dec_skips = _sublayers("decoder.0", pre, [
            (Node("masked self-attention", self_at.weights, ("B", "H", "T", "T"), "attn",
                  "dec_self", note=H, flow="decoder.0.self_attn", stack=stacked), "norm1"),
            (Node("cross-attention", cross_at.weights, WEIGHTS, "attn", "cross",
                  note="Q: decoder, K, V: memory", flow="decoder.0.cross_attn",
                  stack=stacked), "norm2"),
            (Node("FFN", ff_d, ("B", "T", "F"), "ffn", "dec_ffn", flow="decoder.0.ff",
                  stack=stacked), "norm3")])
        cross_index = 4 if pre else 2
    w_enc = max(n.width for n in enc_inner) + (0 if compact else 24)
    w_dec = max(n.width for n in dec_inner) + (0 if compact else 24)
    xe = 0.0
    xd = 0.0 if stacked else w_enc / 2 + (70 if compact else 80) + w_dec / 2
    c = Canvas(heading or "Encoder-decoder transformer")
    y0 = _heading(c, heading, xd / 2, 0) if heading else 0.0
    # encoder column
    src_x_flow = "pos_enc"
    head_e = column(c, [Node("source ids", src_ids, ("B", "S"), key="src",
                             flow=_input_flow(tr, "src_emb")),
                        Node("embed × √C + PE", src_x, BSC, "embed", "src_x", flow=src_x_flow,
                             stack=st)], xe, y0, same_width=True)
    y = head_e[-1].bottom + GAP
    c.arrow(xe, head_e[-1].bottom, xe, y, edge=(src_x_flow, enc_inner[0].flow))
    enc = (column(c, enc_inner, xe, y) if compact
           else _frame(c, enc_inner, xe, y, n_enc, "n_enc", enc_skips, src_x_flow))
    end = enc[-1].bottom + (0 if compact else 10)
    y = end + GAP
    c.arrow(xe, end, xe, y, edge=(enc_inner[-1].flow, memory_flow))
    memory = (tr.shape(f"encoder.{n_enc - 1}") if model.encoder_norm is None
              else tr.shape("encoder_norm"))
    mem = draw(c, Node("memory", memory, BSC, "stream", "memory", note="the encoder's output",
                       flow=memory_flow, stack=st), xe, y)
    # decoder column: beside the encoder, or under it on a phone
    tgt_x_flow = "pos_enc#1"
    y_dec = mem.bottom + 2 * GAP if stacked else y0
    head_d = column(c, [Node("target ids (shifted)" if compact else "target ids, shifted right",
                             tgt_ids, ("B", "T"), key="tgt",
                             flow=_input_flow(tr, tgt_emb) if tgt_call == 0
                             else f"{tgt_emb}#1:{_input_flow(tr, tgt_emb).split(':')[1]}"),
                        Node("embed × √C + PE", tgt_x, BTC, "embed", "tgt_x", flow=tgt_x_flow,
                             stack=st)], xd, y_dec, same_width=True)
    y = head_d[-1].bottom + GAP
    c.arrow(xd, head_d[-1].bottom, xd, y, edge=(tgt_x_flow, dec_inner[0].flow))
    dec = (column(c, dec_inner, xd, y) if compact
           else _frame(c, dec_inner, xd, y, n_dec, "n_dec", dec_skips, tgt_x_flow,
                       right=not stacked, skips_right=not stacked))
    end = dec[-1].bottom + (0 if compact else 10)
    y = end + GAP
    c.arrow(xd, end, xd, y, edge=(dec_inner[-1].flow, "lm_head"))
    head = draw(c, Node("linear (LM head)", tr.shape("lm_head"), ("B", "T", "V"), "head",
                        "logits", flow="lm_head", stack=st), xd, y,
                w_dec - (0 if compact else 24))
    if not compact:  # the model returns logits; a softmax reads them as probabilities
        y = head.bottom + GAP
        c.arrow(xd, head.bottom, xd, y, edge="the logits read as probabilities, outside the "
                "traced model")
        draw(c, Node("softmax: next-token probabilities", kind="plain"), xd, y)
    cross = dec[cross_index]
    if stacked:  # the memory's line runs down the right side to the cross-attention
        x_side = max(mem.right, cross.right + (0 if compact else 12)) + 16
        c.line([(mem.right, mem.cy), (x_side, mem.cy), (x_side, cross.cy), (cross.right, cross.cy)],
               edge=(memory_flow, dec_inner[cross_index].flow))
        c.text(x_side + 4, cross.cy - 8, "K, V", SMALL, anchor="start")
    else:
        x_mid = (xe + w_enc / 2 + xd - w_dec / 2) / 2
        c.line([(mem.right, mem.cy), (x_mid, mem.cy), (x_mid, cross.cy), (cross.x, cross.cy)],
               edge=(memory_flow, dec_inner[cross_index].flow))
        c.text(x_mid + 4, (mem.cy + cross.cy) / 2 + 5, "K, V", SMALL, anchor="start")
    # the frame draws block 0 for all N: the memory reaches the output through the other
    # blocks' cross-attention too, which the frame stands for
    omit = () if compact else ((memory_flow, "lm_head"),)
    _wire(c, tr.flow, omit=omit)
    return c


def encoder_stack(tr: Trace, compact: bool = True, heading: str | None = None) -> Diagram:
    """An encoder-only model (BERT): ids, embeddings, N bidirectional blocks, hidden states."""
    return Diagram(_encoder_canvas(_check_trace(tr), heading))


def _encoder_canvas(tr: Trace, heading: str | None, stack: bool = False) -> Canvas:
    root = tr.kind("")
    prefix = {"Bert": "", "BertForMaskedLM": "bert."}.get(root)
    if prefix is None:
        raise ValueError(f"encoder_stack draws a Bert or BertForMaskedLM, got a {root}")
    bert = tr.module(prefix[:-1]) if prefix else tr.model
    n = len(bert.blocks)
    at = tr.attention(f"{prefix}blocks.0.attn")
    c = Canvas(heading or f"Encoder-only model, {n} blocks")
    y = _heading(c, heading, 0, 0) if heading else 0.0
    last = f"{prefix}blocks.{n - 1}"
    nodes = [Node("token ids", tr.input_shape(f"{prefix}embeddings"), ("B", "T"), key="ids",
                  flow=_input_flow(tr, f"{prefix}embeddings")),
             Node("embeddings + positions", tr.shape(f"{prefix}embeddings"), BTC, "embed",
                  "emb", flow=f"{prefix}embeddings", stack=stack),
             Node(f"{n} × encoder block", tr.shape(last), BTC, "attn", "blocks",
                  note=f"both ways (H = {at.n_heads}), FFN", flow=last, stack=stack)]
    if root == "BertForMaskedLM":
        nodes.append(Node("MLM head: logits", tr.shape("mlm_head"), ("B", "T", "V"), "head",
                          "logits", note="a word for each hidden token", flow="mlm_head",
                          stack=stack))
        column(c, nodes, 0, y, same_width=True)
    else:  # the last block's output is the result: no arrow to a copy of it
        nodes[-1].note += ": one vector per token"
        nodes[-1].wrap = WRAP
        column(c, nodes, 0, y, same_width=True)
    _wire(c, tr.flow)
    return c


def families(encoder: Trace, decoder: Trace, encoder_decoder: Trace) -> Diagram:
    """The three families side by side: encoder (BERT), decoder (GPT), encoder-decoder; on a
    phone one above the other, the encoder-decoder's decoder under its encoder."""
    a = _encoder_canvas(_check_trace(encoder, "encoder"), "encoder-only (BERT)", stack=True)
    b = _decoder_canvas(_check_trace(decoder, "decoder"), None, None, True,
                        "decoder-only (GPT)")
    d = _encdec_canvas(_check_trace(encoder_decoder, "encoder_decoder"), True,
                       "encoder-decoder (Vaswani et al.)")
    d_narrow = _encdec_canvas(encoder_decoder, True, "encoder-decoder (Vaswani et al.)",
                              stacked=True)
    return Diagram(hstack("Three families of transformers", [a, b, d], 24,
                          ["encoder.", "decoder.", "encdec."]), [a, b, d], narrow=[a, b, d_narrow])
