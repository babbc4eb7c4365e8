"""Figures of the model families chapter: each variant of the block drawn from its real module.

    from tfbook.diagrams.families import (sliding_window_figure, qk_norm_figure, moe_figure,
                                          mla_figure, rope_scaling_figure)
    sliding_window_figure(T=8, window=3)      # causal vs sliding-window mask, the rolling cache
    qk_norm_figure(attn, x)                   # a MultiHeadAttention(qk_norm=True, rope_base=...)
    moe_figure(moe, x, tokens)                # a MoEFeedForward: router scores, top-k, counts
    mla_figure(mla, x, n_kv_heads=...)        # a MultiHeadLatentAttention: cache, absorbed form
    rope_scaling_figure(D, base, {"YaRN": RopeScaling("yarn", 8.0, 2048), ...})

Nothing on them is typed: the masks are `sliding_window_mask`'s and `causal_mask`'s, the
cache's positions are read back from the keys a `SlidingWindowKVCache` returns and keeps
(each key holds its position), the attention and MLA drawings are the computation recorded
while the module runs (`tfbook.diagrams.dataflow`: an arrow the module does not compute is
refused), the router's probabilities, choices and counts are the `MoEFeedForward`'s own, the
cache sizes `kv_cache_bytes_per_token`'s (and the `LatentCache`'s bytes), and the curves
`rope_inverse_frequencies`'.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from tfbook.diagrams._shared import heading, visible
from tfbook.diagrams.dataflow import Recorder
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import GAP, Node, Rect, draw, hstack, shape_label, wrap_words
from tfbook.diagrams.svg import COLOURS, HEAD_COLOURS, SMALL, Canvas, text_width

PANEL = 330.0  # the widest a panel may be: a phone's column (358 px) holds each one
MOST_POSITIONS = 16  # the sliding-window figure draws at most this many positions
MOST_TOKENS = 12  # the MoE figure draws at most this many tokens


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _lines(c: Canvas, x: float, y: float, text: str, width: float = PANEL,
           anchor: str = "start", key: str = "") -> float:
    """`text` wrapped to `width`, its first baseline at y; returns the baseline after it."""
    lines = wrap_words(text, width, SMALL)
    c.text(x, y, lines if len(lines) > 1 else lines[0], SMALL, anchor=anchor, key=key)
    return y + SMALL * 1.25 * len(lines) + 4


def _wire(c: Canvas, flow: object, nodes: tuple[str, ...] = (),
          omit: tuple[tuple[str, str], ...] = ()) -> None:
    """Hold the drawing's arrows against the recorded computation, or refuse to draw."""
    try:
        c.check_wiring(flow, nodes, omit)
    except ValueError as error:
        raise RuntimeError(f"{c.title}: {error}") from None


def _link(c: Canvas, a: Rect, b: Rect, edge: object, x_from: float | None = None,
          x_to: float | None = None, y_turn: float | None = None) -> None:
    """An arrow from a's bottom to b's top, turning once at y_turn (just above b)."""
    x0 = a.cx if x_from is None else x_from
    x1 = b.cx if x_to is None else x_to
    turn = b.y - 10 if y_turn is None else y_turn
    if abs(x0 - x1) < 0.5:
        c.arrow(x0, a.bottom, x1, b.y, edge=edge)
    else:
        c.line([(x0, a.bottom), (x0, turn), (x1, turn), (x1, b.y)], edge=edge)


# --- sliding-window attention ---------------------------------------------------------------

def _mask_canvas(title: str, mask: Tensor, names: list[str], cell: float,
                 note_text: str, key: str, outline: int | None = None) -> Canvas:
    """One boolean (T, T) mask cell by cell (filled: the query of the row may read the key of
    the column), queries down, keys across, with its shape and a note under it."""
    rows, cols = mask.shape
    cells = [[1.0 if b else 0.0 for b in r] for r in mask.tolist()]
    c = Canvas(title)
    label_w = max(max(text_width(n, SMALL, True) for n in names) + 8,
                  text_width("query ↓", SMALL) + 4)
    top_h = 18.0
    y = heading(c, title, label_w + cols * cell / 2, 0, anchor="middle")
    c.text(label_w, y + 4, "key →", SMALL, anchor="start")
    y += 12
    for k in range(cols):  # the keys by position (the rows name their tokens, if given)
        c.text(label_w + (k + 0.5) * cell, y + top_h - 4, str(k), SMALL, mono=True)
    c.text(label_w - 6, y + top_h - 4, "query ↓", SMALL, anchor="end")
    y += top_h + 6
    c.grid(label_w, y, cells, cell)
    if outline is not None:  # the row of the query the cache panel decodes
        x0, y0, x1, y1 = label_w - 2, y + outline * cell - 2, label_w + cols * cell + 2, \
            y + (outline + 1) * cell + 2
        c.line([(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)], arrow=False,
               colour=COLOURS["ffn"], width=2.0)
    for r, name in enumerate(names):
        c.text(label_w - 6, y + (r + 0.5) * cell + 4.5, name, SMALL, mono=True, anchor="end")
    y += rows * cell + 18
    cx = label_w + cols * cell / 2
    shape = tuple(mask.shape)
    c.text(cx, y, shape_label(("T", "T"), shape), SMALL, mono=True, key=key, shape=shape)
    _lines(c, cx, y + 18, note_text, label_w + cols * cell, anchor="middle")
    return c


def _position_strip(c: Canvas, x: float, y: float, n: int, cell: float,
                    kinds: dict[int, str]) -> None:
    """Positions 0 .. n-1 as cells: a position in `kinds` tinted by its kind, the others
    dashed (not held); each cell numbered."""
    for j in range(n):
        kind = kinds.get(j)
        c.box(x + j * cell + 1, y, cell - 2, cell, kind or "plain", dashed=kind is None,
              radius=2)
        c.text(x + (j + 0.5) * cell, y + cell / 2 + 4.5, str(j), SMALL, mono=True)


def _rolling_cache(window: int, at: int) -> dict[str, object]:
    """Feed positions 0 .. at-1 (one prefill) then position `at` (one decode step) through a
    one-layer SlidingWindowKVCache and a KVCache; each key holds its own position in feature 0,
    so what a cache holds is read back from its tensors."""
    from tfbook.cache import KVCache
    from tfbook.sliding_window import SlidingWindowKVCache

    def keys(positions: range) -> Tensor:
        k = torch.zeros(1, 1, len(positions), 2, dtype=torch.float64)
        k[0, 0, :, 0] = torch.tensor(list(positions), dtype=torch.float64)
        return k

    rolling, full = SlidingWindowKVCache(1, window), KVCache(1, at + 1)
    layer = rolling.layers[0]
    held_of = lambda t: [int(p) for p in t[0, 0, :, 0].tolist()]  # noqa: E731
    before: list[int] = []
    if at > 0:
        prompt = keys(range(at))
        layer.update(prompt, prompt.clone())
        full.layers[0].update(prompt, prompt.clone())
        before = held_of(layer.keys)
    new = keys(range(at, at + 1))
    returned, _ = layer.update(new, new.clone())
    full.layers[0].update(new, new.clone())
    return {"before": before, "returned": held_of(returned), "after": held_of(layer.keys),
            "mask": layer.mask(1)[0].tolist(), "key_positions": layer.key_positions.tolist(),
            # positions held, from the bytes each cache holds (K and V of one position each)
            "held": rolling.memory_bytes() // (2 * new.element_size() * new.size(-1)),
            "full": full.memory_bytes() // (2 * new.element_size() * new.size(-1))}


def _cache_canvas(window: int, at: int, seen: dict[str, object], window_row: list[bool],
                  cell: float) -> Canvas:
    title = f"The rolling cache at the query of position {at}"
    c = Canvas(title)
    y = heading(c, f"The rolling cache, query at {at}", 0, 0)
    n = at + 1
    rows = [("before", f"held before the step: {_positions(seen['before'])}",
             dict.fromkeys(seen["before"], "stream")),
            ("returned", f"read by the query at {at}: {_positions(seen['returned'])}",
             {**dict.fromkeys(seen["returned"], "stream"), at: "ffn"}),
            ("after", f"kept after the step: {_positions(seen['after'])}",
             dict.fromkeys(seen["after"], "stream"))]
    for name, text, kinds in rows:
        y = _lines(c, 0, y + 4, text, key=name)
        _position_strip(c, 0, y - 8, n - 1 if name == "before" else n, cell, kinds)
        y += cell + 8
    y += 8
    read = [j for j, b in enumerate(window_row) if b]
    y = _lines(c, 0, y, f"the window's row {at} (outlined) reads {_positions(read)}: the "
                        "same keys")
    y = _lines(c, 0, y, f"its memory holds {seen['held']} positions (at most window − 1 = "
                        f"{window - 1}, at any length); a full KVCache holds all "
                        f"{seen['full']}", key="held")
    _lines(c, 0, y, "dashed: not held; orange: the new position")
    return c


def _positions(ps: list[int]) -> str:
    """[4, 5, 6] -> 'positions 4–6'; [] -> 'nothing'; [3] -> 'position 3'."""
    if not ps:
        return "nothing"
    if len(ps) == 1:
        return f"position {ps[0]}"
    if ps == list(range(ps[0], ps[-1] + 1)):
        return f"positions {ps[0]}–{ps[-1]}"
    return "positions " + ", ".join(str(p) for p in ps)


def sliding_window_figure(T: int = 8, window: int = 3, decode_at: int | None = None,
                          tokens: list[str] | None = None) -> Diagram:
    """The causal mask beside the sliding-window mask (`sliding_window_mask(T, T, window)`),
    and what a `SlidingWindowKVCache` holds when the query at position `decode_at` (default
    T - 1) is decoded: the positions held before the step, those returned to the query (the
    window's row, itself included), and those kept after it.

    `tokens` (one per position) label the masks' rows and columns instead of positions. The
    Diagram also carries `masks` ({"causal", "sliding"}: the tensors drawn), `cache` (the
    positions read back from the cache's keys: "before", "returned", "after") and `window`.
    """
    from tfbook.masks import causal_mask
    from tfbook.sliding_window import check_window, sliding_window_mask

    if not _is_int(T) or not 2 <= T <= MOST_POSITIONS:
        raise ValueError(f"T must be an int in [2, {MOST_POSITIONS}] (positions drawn), "
                         f"got {T!r:.40}")
    window = check_window(window, "sliding_window_figure")
    if window >= T:
        raise ValueError(f"the window ({window}) must be smaller than T ({T}), or the "
                         "sliding-window mask is the causal mask")
    at = T - 1 if decode_at is None else decode_at
    if not _is_int(at) or not 0 <= at < T:
        raise ValueError(f"decode_at must be an int in [0, {T}), got {decode_at!r:.40}")
    if tokens is not None and not (isinstance(tokens, list) and len(tokens) == T
                                   and all(isinstance(t, str) for t in tokens)):
        raise TypeError(f"tokens must be a list of {T} str (one per position), got "
                        f"{tokens!r:.60}")
    names = [str(p) for p in range(T)] if tokens is None else \
        [f"{visible(t)[:8]} {p}" for p, t in enumerate(tokens)]
    causal, sliding = causal_mask(T), sliding_window_mask(T, T, window)
    cell = max(16.0, min(22.0, 200.0 / T))
    seen = _rolling_cache(window, at)
    row = sliding[at].tolist()
    if [j for j, b in enumerate(row) if b] != seen["returned"]:
        raise RuntimeError(f"the cache returned positions {seen['returned']} to the query at "
                           f"{at}, but the window's row reads {row}")
    if seen["held"] != len(seen["after"]) or seen["full"] != at + 1:
        raise RuntimeError(f"the caches hold {seen['held']} and {seen['full']} positions, "
                           f"their keys say {len(seen['after'])} and {at + 1}")
    if seen["key_positions"] != seen["returned"] or not all(seen["mask"]):
        raise RuntimeError("the cache's key_positions or mask disagree with the keys it "
                           "returned")
    panels = [
        _mask_canvas("Causal: every earlier key", causal, names, cell,
                     f"query t reads t + 1 keys (up to {T})", "causal"),
        _mask_canvas(f"Sliding window of {window}", sliding, names, cell,
                     f"query t reads at most {window} keys, t−{window - 1} to t", "sliding",
                     outline=at),
        _cache_canvas(window, at, seen, row, cell),
    ]
    d = Diagram(hstack(f"Causal and sliding-window ({window}) masks, and the rolling cache",
                       panels, 28, ["causal.", "sliding.", "cache."]), panels)
    d.masks = {"causal": causal, "sliding": sliding}
    d.cache = {k: seen[k] for k in ("before", "returned", "after")}
    d.window = window
    return d


# --- QK-norm --------------------------------------------------------------------------------

@contextmanager
def _named_rotations(rec: Recorder, module: object, names: tuple[str, ...]) -> Iterator[None]:
    """While active, the n-th call of `module.rotate_planes` names its result names[n]."""
    plain = module.rotate_planes
    count = [0]

    def rotate(x: Tensor, cos: Tensor, sin: Tensor, convention: str = "interleaved") -> Tensor:
        out = plain(x, cos, sin, convention)
        if count[0] < len(names):
            rec.name(out, names[count[0]])
        count[0] += 1
        return out

    module.rotate_planes = rotate
    try:
        yield
    finally:
        module.rotate_planes = plain


def qk_norm_figure(attn: object, x: Tensor) -> Diagram:
    """Where QK-norm sits in the attention sub-layer (Qwen3): each head's query and key
    scaled to unit RMS over its D features (an RMSNorm with one gain per feature), after the
    projections and before RoPE, so the scores Q Kᵀ are products of vectors of bounded size.

    `attn` is a `MultiHeadAttention` built with qk_norm=True and a rope_base, `x` (B, T, C)
    its input; the module runs once (causal) under a dataflow recorder, and every arrow is a
    dependency of that run (norm before RoPE, RoPE before the scores), every shape its own.
    """
    import tfbook.attention as attention_module
    from tfbook.attention import MultiHeadAttention

    if not isinstance(attn, MultiHeadAttention):
        raise TypeError(f"qk_norm_figure needs a tfbook MultiHeadAttention, got "
                        f"{type(attn).__name__}")
    if attn.q_norm is None or attn.rope_base is None:
        raise ValueError("qk_norm_figure draws an attention with QK-norm and RoPE: build it "
                         f"with qk_norm=True and a rope_base (got qk_norm="
                         f"{attn.q_norm is not None}, rope_base={attn.rope_base})")
    C = getattr(attn, "d_model", attn.n_heads * attn.head_size)  # H D unless head_dim says
    if not (isinstance(x, Tensor) and x.dim() == 3 and x.size(-1) == C
            and x.is_floating_point()):
        raise ValueError(f"x must be a float tensor of shape (B, T, {C}), got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    shapes: dict[str, tuple[int, ...]] = {}

    def keep(name: str):
        def hook(module: object, args: tuple, output: Tensor) -> None:
            shapes[name] = tuple(output.shape)
        return hook

    handles = [attn.q_norm.register_forward_hook(keep("q_norm")),
               attn.k_norm.register_forward_hook(keep("k_norm")),
               attn.v.register_forward_hook(keep("v")),
               attn.heads.register_forward_hook(keep("heads"))]
    try:
        with torch.no_grad(), Recorder(attn) as rec, \
                _named_rotations(rec, attention_module, ("q_rope", "k_rope")):
            out, weights = attn(x, causal=True, need_weights=True)
    finally:
        for h in handles:
            h.remove()
    flow = rec.flow
    H, H_kv, D = attn.n_heads, attn.n_kv_heads, attn.head_size
    kv = ("B", "H_kv", "T", "D") if H_kv != H else ("B", "H", "T", "D")
    q_shape, k_shape = shapes["q_norm"], shapes["k_norm"]
    gain = tuple(attn.q_norm.weight.shape)
    eps = attn.q_norm.eps
    c = Canvas("QK-norm in the attention sub-layer")
    y = heading(c, "QK-norm: per head, before RoPE", 0, 0)
    wrap = 140.0
    xn = Node("input X", tuple(x.shape), ("B", "T", "C"), "stream", "x", flow="x")
    qn = Node("Q = X W_{Q}", shapes["q_norm"], ("B", "H", "T", "D"), "attn", "q", flow="q",
              stack=True)
    kn = Node("K = X W_{K}", k_shape, kv, "attn", "k", flow="k", stack=True)
    qnn = Node("RMSNorm", q_shape, ("B", "H", "T", "D"), "norm", "q_norm",
               note=f"over D, per head\nγ: {shape_label(('D',), gain)}",
               flow="q_norm", stack=True, wrap=wrap)
    knn = Node("RMSNorm", k_shape, kv, "norm", "k_norm",
               note="over D, per head\nits own γ", flow="k_norm", stack=True,
               wrap=wrap)
    qr = Node("RoPE", q_shape, ("B", "H", "T", "D"), "plain", "q_rope", note="turn by position",
              flow="q_rope", stack=True, wrap=wrap)
    kr = Node("RoPE", k_shape, kv, "plain", "k_rope", note="the same table", flow="k_rope",
              stack=True, wrap=wrap)
    w = max(n.width for n in (qn, kn, qnn, knn, qr, kr))
    gap = 18.0
    xl, xr = w / 2, w + gap + w / 2
    mid = w + gap / 2
    top = draw(c, xn, mid, y + 4)
    y = top.bottom + GAP + 4
    rq, rk = draw(c, qn, xl, y, w), draw(c, kn, xr, y, w)
    _link(c, top, rq, ("x", "q"), x_from=top.cx - 12)
    _link(c, top, rk, ("x", "k"), x_from=top.cx + 12)
    y = max(rq.bottom, rk.bottom) + GAP
    nq, nk = draw(c, qnn, xl, y, w), draw(c, knn, xr, y, w)
    _link(c, rq, nq, ("q", "q_norm"))
    _link(c, rk, nk, ("k", "k_norm"))
    y = max(nq.bottom, nk.bottom) + GAP
    oq, ok = draw(c, qr, xl, y, w), draw(c, kr, xr, y, w)
    _link(c, nq, oq, ("q_norm", "q_rope"))
    _link(c, nk, ok, ("k_norm", "k_rope"))
    y = max(oq.bottom, ok.bottom) + GAP + 4
    wn = Node("softmax(Q Kᵀ / √D + causal)", tuple(weights.shape), ("B", "H", "T", "S"), "attn",
              "weights", flow="weights", stack=True)
    rw = draw(c, wn, mid, y, 2 * w + gap - 40)
    _link(c, oq, rw, ("q_rope", "weights"), x_to=rw.cx - 12)
    _link(c, ok, rw, ("k_rope", "weights"), x_to=rw.cx + 12)
    y = rw.bottom + GAP
    vn = Node("V = X W_{V}", shapes["v"], kv, "attn", "v", note="no norm, no RoPE", flow="v",
              stack=True, wrap=wrap)
    hn = Node("A V", shapes["heads"], ("B", "H", "T", "D"), "attn", "heads", flow="heads",
              stack=True)
    rv, rh = draw(c, vn, xr, y, w), draw(c, hn, xl, y, w)
    _link(c, rw, rh, ("weights", "heads"), x_from=xl)
    y_v = (max(rv.y, rh.y) + min(rv.bottom, rh.bottom)) / 2
    c.arrow(rv.x, y_v, rh.right, y_v, edge=("v", "heads"))
    # X feeds V too: down the right side, outside the boxes
    side = xr + w / 2 + 12
    c.line([(top.right, top.cy), (side, top.cy), (side, rv.cy), (rv.right, rv.cy)],
           edge=("x", "v"))
    y = max(rv.bottom, rh.bottom) + GAP
    on = Node("merge heads, W_{O}", tuple(out.shape), ("B", "T", "C"), "attn", "output",
              flow="output", note="added to the residual stream", stack=True, wrap=wrap)
    ro = draw(c, on, xl, y, w)
    _link(c, rh, ro, ("heads", "output"))
    c.text(xr - w / 2, ro.y + 14, ["RMSNorm(x) =", "x / √(mean x² + ε) · γ", f"ε = {eps:g}",
                                   f"H = {H}, H_kv = {H_kv}, D = {D}"], SMALL, anchor="start")
    _wire(c, flow)
    d = Diagram(c)
    d.flow, d.shapes = flow, {"q_norm": q_shape, "k_norm": k_shape, "gain": gain}
    return d


# --- mixture of experts ---------------------------------------------------------------------

def _weight_text(w: float) -> str:
    """A routing weight in at most 3 characters: .62, 1.0 (a weight is in [0, 1]).

    >>> _weight_text(0.6231), _weight_text(1.0), _weight_text(0.004)
    ('.62', '1.0', '.00')
    """
    return "1.0" if w >= 0.995 else f"{w:.2f}"[1:]


def moe_figure(moe: object, x: Tensor, tokens: list[str] | None = None) -> Diagram:
    """A mixture-of-experts feed-forward on a few tokens: the router's probability of each
    expert for each token (softmax(x W_r), the cells' tint), the k experts each token is
    sent to (outlined, with their routing weight), and how many tokens each expert receives
    (the bars: the module's own `tokens_per_expert` after this call).

    `moe` is a `tfbook.moe.MoEFeedForward`, `x` (1, T, C) with T <= 12, `tokens` one label per
    position. The Diagram carries `probs` (T, E), `chosen` (T, k), `weights` (T, k) and
    `counts` (E,), the tensors drawn.
    """
    from tfbook.moe import MoEFeedForward, route

    if not isinstance(moe, MoEFeedForward):
        raise TypeError(f"moe_figure needs a tfbook.moe.MoEFeedForward, got "
                        f"{type(moe).__name__}")
    C = moe.router.in_features
    if not (isinstance(x, Tensor) and x.dim() == 3 and x.size(0) == 1 and x.size(-1) == C
            and x.is_floating_point() and 1 <= x.size(1) <= MOST_TOKENS):
        raise ValueError(f"x must be a float tensor of shape (1, T, {C}) with 1 <= T <= "
                         f"{MOST_TOKENS}, got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    T, E, k = x.size(1), moe.n_experts, moe.top_k
    if E > 10:
        raise ValueError(f"moe_figure draws at most 10 experts, this layer has {E}")
    if tokens is not None and not (isinstance(tokens, list) and len(tokens) == T
                                   and all(isinstance(t, str) for t in tokens)):
        raise TypeError(f"tokens must be a list of {T} str (one per position), got "
                        f"{tokens!r:.60}")
    with torch.no_grad():
        moe(x)
    logits = moe.router_logits  # (T, E), this call's
    probs = torch.softmax(logits.float(), dim=-1)
    weights, chosen = route(logits, k, moe.routing)  # what the module routed with
    counts = moe.tokens_per_expert
    if not torch.equal(torch.bincount(chosen.reshape(-1), minlength=E), counts):
        raise RuntimeError(f"tokens_per_expert {counts.tolist()} is not the count of the "
                           f"chosen experts {chosen.tolist()}")
    names = [visible(t)[:10] for t in tokens] if tokens is not None else \
        [f"token {t}" for t in range(T)]
    title = f"Mixture of experts: {T} tokens, each sent to {k} of {E} experts"
    c = Canvas(title)
    y = heading(c, f"Router: {k} of {E} experts per token", 0, 0)
    cell = 30.0
    label_w = max(text_width(n, SMALL, True) for n in names) + 10
    x0 = label_w
    c.text(x0, y + 4, "expert →", SMALL, anchor="start")
    y += 22
    for e in range(E):
        c.text(x0 + (e + 0.5) * cell, y, str(e), SMALL, bold=True, key=f"expert.{e}")
    y += 8
    top = float(probs.max())
    c.grid(x0, y, [[float(p) / top for p in row] for row in probs.tolist()], cell)
    for t in range(T):
        c.text(x0 - 6, y + (t + 0.5) * cell + 4.5, names[t], SMALL, mono=True, anchor="end",
               key=f"token.{t}")
        for w_, e in zip(weights[t].tolist(), chosen[t].tolist(), strict=True):
            c.box(x0 + e * cell + 1.5, y + t * cell + 1.5, cell - 3, cell - 3, "ffn", radius=3)
            c.text(x0 + (e + 0.5) * cell, y + (t + 0.5) * cell + 4.5, _weight_text(w_), SMALL,
                   bold=True, key=f"weight.{t}.{e}")
    y += T * cell + 14
    # tokens per expert: one bar per column, as tall as its count
    unit = 12.0
    most = max(int(counts.max()), 1)
    base = y + most * unit + 16
    for e, n in enumerate(counts.tolist()):
        if n:
            c.box(x0 + e * cell + 6, base - n * unit, cell - 12, n * unit, "ffn", radius=1)
        c.text(x0 + (e + 0.5) * cell, base - n * unit - 5, str(n), SMALL, bold=True,
               key=f"count.{e}", shape=(n,))
    c.line([(x0, base), (x0 + E * cell, base)], arrow=False)
    c.text(x0 - 6, base - 4, "tokens", SMALL, anchor="end")
    y = base + 22
    routing = {"renormalised": "the k probabilities rescaled to sum to 1",
               "selected": "softmax over the k largest scores",
               "unnormalised": "the k probabilities as they are"}[moe.routing]
    width = max(x0 + E * cell, PANEL)
    y = _lines(c, 0, y, f"tint: the router's probability softmax(x·W_r) of each expert "
                        f"(darkest: {top:.2f})", width)
    y = _lines(c, 0, y, f"outlined: the {k} chosen, with their weight: {routing}", width)
    _lines(c, 0, y, f"bars: tokens per expert, {T} × {k} = {T * k} in all", width)
    d = Diagram(c)
    d.probs, d.chosen, d.weights, d.counts = probs, chosen, weights, counts
    return d


# --- multi-head latent attention ------------------------------------------------------------

# the einsums of the absorbed form, in the order MultiHeadLatentAttention.forward makes them
ABSORBED_STEPS = {"einsum": (("out", "q_latent"), ("out", "values"))}


def _run_mla(mla: object, x: Tensor, absorbed: bool) -> tuple[Recorder, dict, object]:
    """mla(x) through a new LatentCache under a dataflow recorder: the rotated query and key
    parts, what the cache returns and (absorbed) the einsums named; -> recorder, shapes, cache."""
    import tfbook.mla as mla_module
    from tfbook.mla import LatentCache

    cache = LatentCache(x.size(1))
    plain = cache.update
    shapes: dict[str, tuple[int, ...]] = {}

    def keep(name: str):
        def hook(module: object, args: tuple, output: object) -> None:
            out = output[0] if isinstance(output, tuple) else output
            shapes[name] = tuple(out.shape)
        return hook

    # the queries' last projection: W_Q, or W_UQ after a query latent (q_lora_rank)
    q_last = mla.q_proj if mla.q_lora_rank is None else mla.q_b_proj
    handles = [q_last.register_forward_hook(keep("q_proj")),
               mla.kv_a_layernorm.register_forward_hook(keep("kv_a_layernorm")),
               mla.kv_b_proj.register_forward_hook(keep("kv_b_proj")),
               mla.register_forward_hook(keep("output"))]
    rec = Recorder(mla)

    def update(latent: Tensor, rope_key: Tensor) -> tuple[Tensor, Tensor]:
        held, keys = plain(latent, rope_key)
        rec.name(held, "cached_latent")
        rec.name(keys, "cached_rope_key")
        shapes["cached_latent"], shapes["cached_rope_key"] = tuple(held.shape), tuple(keys.shape)
        return held, keys

    cache.update = update
    steps = ABSORBED_STEPS if absorbed else {}
    plain_rotate = mla_module.rotate_planes
    turned: list[tuple[int, ...]] = []

    def rotate(t: Tensor, cos: Tensor, sin: Tensor, convention: str = "interleaved") -> Tensor:
        out = plain_rotate(t, cos, sin, convention)
        turned.append(tuple(out.shape))
        return out

    try:
        mla_module.rotate_planes = rotate
        with torch.no_grad(), rec, _named_rotations(rec, mla_module, ("q_rope", "k_rope")), \
                rec.steps(steps):
            _, weights = mla(x, cache=cache, absorbed=absorbed, need_weights=True)
    finally:
        mla_module.rotate_planes = plain_rotate
        for h in handles:
            h.remove()
    if mla.q_lora_rank is not None:  # the queries under one name, with or without a latent
        rec.flow.alias("q_proj", "q_b_proj")
    shapes["q_rope"], shapes["k_rope"] = turned
    shapes["weights"] = tuple(weights.shape)
    if absorbed:
        missing = [n for _, n in ABSORBED_STEPS["einsum"] if n not in rec.flow]
        if missing:
            raise RuntimeError(f"the absorbed form made no einsum named {missing}: update "
                               "ABSORBED_STEPS to MultiHeadLatentAttention.forward")
    return rec, shapes, cache


def _q_title(mla: object) -> str:
    """The queries' box: q = X W_Q, or q = c_Q W_UQ with a query latent (DeepSeek-V2/V3)."""
    return "q = X W_{Q}" if mla.q_lora_rank is None else "q = c_{Q} W_{UQ}"


def _mla_canvas(mla: object, x: Tensor, shapes: dict, rec: Recorder) -> Canvas:
    """The naive form: what is cached (c and k_R), and the per-head keys and values made
    from the cached latent by kv_b_proj = [W_UK; W_UV]."""
    H, r, dN, dR, dV = (mla.n_heads, mla.kv_lora_rank, mla.qk_nope_head_dim,
                        mla.qk_rope_head_dim, mla.v_head_dim)
    c = Canvas("Multi-head latent attention: the cache holds c and k_R")
    y = heading(c, "MLA: the cache holds c and k_R", 0, 0)
    wrap = 126.0
    nodes = {
        "x": Node("input X", tuple(x.shape), ("B", "T", "C"), "stream", "x", flow="x",
                  stack=True),
        "q": Node(_q_title(mla), shapes["q_proj"], ("B", "T", "H d_q"), "attn", "q",
                  flow="q_proj", stack=True, note=f"d_q = d_N + d_R = {dN} + {dR}"
                  + ("" if mla.q_lora_rank is None else
                     f"; c_Q = RMSNorm(X W_DQ), {mla.q_lora_rank} wide"), wrap=wrap),
        "c": Node("latent c", shapes["kv_a_layernorm"], ("B", "T", "r"), "embed", "latent",
                  flow="kv_a_layernorm", stack=True, note="RMSNorm(X W_DKV)", wrap=wrap),
        "qr": Node("RoPE on q_R", shapes["q_rope"], ("B", "H", "T", "d_R"), "plain", "q_rope",
                   flow="q_rope", stack=True, note="each head's own", wrap=wrap),
        "kr": Node("RoPE key k_R", shapes["k_rope"], ("B", "1", "T", "d_R"), "embed", "k_rope",
                   flow="k_rope", stack=True, note="RoPE(X W_KR), one for all heads",
                   wrap=wrap),
        "cache": Node("LatentCache", shapes["cached_latent"], ("B", "1", "S", "r"), "embed",
                      "cached", stack=True,
                      note=f"and k_R {shape_label(('S', 'd_R'), shapes['cached_rope_key'][2:])}",
                      wrap=wrap),
        "kv": Node("k_N, v per head", shapes["kv_b_proj"], ("B", "S", "H d_kv"), "attn",
                   "kv", flow="kv_b_proj", stack=True,
                   note=f"c [W_UK; W_UV]ᵀ, d_kv = d_N + d_V = {dN} + {dV}", wrap=wrap),
        "w": Node("softmax(q kᵀ)", shapes["weights"], ("B", "H", "T", "S"), "attn", "weights",
                  flow="weights", stack=True, note="k = [k_N; k_R]", wrap=wrap),
        "h": Node("A v", (shapes["weights"][0], H, shapes["weights"][2], dV),
                  ("B", "H", "T", "d_V"), "attn", "heads", flow="heads", stack=True),
        "o": Node("merge, W_{O}", shapes["output"], ("B", "T", "C"), "attn", "output",
                  flow="output", stack=True),
    }
    w = max(n.width for n in nodes.values())
    gap, side = 20.0, 12.0
    xl, xr, mid = side + w / 2, side + w + gap + w / 2, side + w + gap / 2
    right = side + 2 * w + gap + side  # the far right route
    R: dict[str, Rect] = {}
    R["x"] = draw(c, nodes["x"], mid, y + 4)
    y = R["x"].bottom + GAP
    R["q"], R["c"] = draw(c, nodes["q"], xl, y, w), draw(c, nodes["c"], xr, y, w)
    _link(c, R["x"], R["q"], ("x", "q_proj"), x_from=R["x"].cx - 12)
    _link(c, R["x"], R["c"], ("x", "kv_a_layernorm"), x_from=R["x"].cx + 12)
    y = max(R["q"].bottom, R["c"].bottom) + GAP
    R["qr"], R["kr"] = draw(c, nodes["qr"], xl, y, w), draw(c, nodes["kr"], xr, y, w)
    _link(c, R["q"], R["qr"], ("q_proj", "q_rope"))
    c.line([(R["x"].right, R["x"].cy), (right, R["x"].cy), (right, R["kr"].cy),
            (R["kr"].right, R["kr"].cy)], edge=("x", "k_rope"))
    y = max(R["qr"].bottom, R["kr"].bottom) + GAP
    R["cache"] = draw(c, nodes["cache"], xr, y, w)
    _link(c, R["kr"], R["cache"], [("k_rope", "cached_rope_key")])
    # c goes down the gap between the columns, past k_R, into the cache
    g = side + w + gap / 2
    c.line([(R["c"].x + 10, R["c"].bottom), (R["c"].x + 10, R["c"].bottom + 8),
            (g, R["c"].bottom + 8), (g, R["cache"].cy), (R["cache"].x, R["cache"].cy)],
           edge=("kv_a_layernorm", "cached_latent"))
    y = R["cache"].bottom + GAP
    R["kv"] = draw(c, nodes["kv"], xr, y, w)
    _link(c, R["cache"], R["kv"], ("cached_latent", "kv_b_proj"))
    y = R["kv"].bottom + GAP
    R["w"] = draw(c, nodes["w"], xl, y, w)
    _link(c, R["qr"], R["w"], ("q_rope", "weights"), x_to=xl - 10,
          y_turn=R["qr"].bottom + 8)
    # q's first d_N features (q_N) go straight to the scores: down the left side
    c.line([(R["q"].x, R["q"].cy), (side - 8, R["q"].cy), (side - 8, R["w"].cy - 6),
            (R["w"].x, R["w"].cy - 6)], edge=("q_proj", "weights"))
    c.line([(R["kv"].x + 12, R["kv"].bottom), (R["kv"].x + 12, R["kv"].bottom + 8),
            (g, R["kv"].bottom + 8), (g, R["w"].cy), (R["w"].right, R["w"].cy)],
           edge=("kv_b_proj", "weights"))
    c.line([(R["cache"].right, R["cache"].cy), (right, R["cache"].cy),
            (right, R["w"].cy + 8), (R["w"].right, R["w"].cy + 8)],
           edge=("cached_rope_key", "weights"))
    y = R["w"].bottom + GAP
    R["h"] = draw(c, nodes["h"], xl, y, w)
    _link(c, R["w"], R["h"], ("weights", "heads"))
    c.line([(R["kv"].cx + 20, R["kv"].bottom), (R["kv"].cx + 20, R["h"].cy),
            (R["h"].right, R["h"].cy)], edge=("kv_b_proj", "heads"))
    y = R["h"].bottom + GAP
    R["o"] = draw(c, nodes["o"], xl, y, w)
    _link(c, R["h"], R["o"], ("heads", "output"))
    c.text(xr - w / 2, R["o"].y + 14, [f"H = {H}, r = {r}", f"d_N = {dN}, d_R = {dR}",
                                       f"d_V = {dV}"], SMALL, anchor="start")
    c.nodes += ["cached_rope_key"]
    _wire(c, rec.flow)
    return c


def _absorbed_canvas(mla: object, x: Tensor, shapes: dict, rec: Recorder) -> Canvas:
    """The absorbed form: W_UK folded into the query, W_UV on the outputs; every head attends to
    the one cached key [c; k_R] and the one value c."""
    H, r = mla.n_heads, mla.kv_lora_rank
    c = Canvas("Multi-head latent attention, absorbed: attention over the latent itself")
    y = heading(c, "Absorbed: attend to c itself", 0, 0)
    wrap = 126.0
    B, _, T, S = shapes["weights"]
    nodes = {
        "x": Node("input X", tuple(x.shape), ("B", "T", "C"), "stream", "x", flow="x",
                  stack=True),
        "q": Node(_q_title(mla), shapes["q_proj"], ("B", "T", "H d_q"), "attn", "q",
                  flow="q_proj", stack=True),
        "cache": Node("LatentCache", shapes["cached_latent"], ("B", "1", "S", "r"), "embed",
                      "cached", stack=True,
                      note=f"and k_R {shape_label(('S', 'd_R'), shapes['cached_rope_key'][2:])}",
                      wrap=wrap),
        "ql": Node("q_N W_{UK}", (B, H, T, r), ("B", "H", "T", "r"), "attn", "q_latent",
                   flow="q_latent", stack=True, note="the query in the latent's space",
                   wrap=wrap),
        "qr": Node("RoPE on q_R", shapes["q_rope"], ("B", "H", "T", "d_R"), "plain", "q_rope",
                   flow="q_rope", stack=True),
        "w": Node("softmax", shapes["weights"], ("B", "H", "T", "S"), "attn", "weights",
                  flow="weights", stack=True, note="[q_N W_UK; q_R] · [c; k_R]: one key head",
                  wrap=wrap),
        "h": Node("A c", (B, H, T, r), ("B", "H", "T", "r"), "attn", "heads", flow="heads",
                  stack=True, note="one value head: c", wrap=wrap),
        "wo": Node("(A c) W_{UV}ᵀ", (B, H, T, mla.v_head_dim), ("B", "H", "T", "d_V"), "attn",
                   "values", flow="values", stack=True,
                   note="W_UV on the T outputs, not the S cached latents", wrap=wrap),
        "o": Node("merge, W_{O}", shapes["output"], ("B", "T", "C"), "attn", "output",
                  flow="output", stack=True),
    }
    w = max(n.width for n in nodes.values())
    gap, side = 20.0, 12.0
    xl, xr, mid = side + w / 2, side + w + gap + w / 2, side + w + gap / 2
    right = side + 2 * w + gap + side
    R: dict[str, Rect] = {}
    R["x"] = draw(c, nodes["x"], mid, y + 4)
    y = R["x"].bottom + GAP
    R["q"], R["cache"] = draw(c, nodes["q"], xl, y, w), draw(c, nodes["cache"], xr, y, w)
    _link(c, R["x"], R["q"], ("x", "q_proj"), x_from=R["x"].cx - 12)
    _link(c, R["x"], R["cache"], [("x", "cached_latent"), ("x", "cached_rope_key")],
          x_from=R["x"].cx + 12)
    y = max(R["q"].bottom, R["cache"].bottom) + GAP
    R["ql"], R["qr"] = draw(c, nodes["ql"], xl, y, w), draw(c, nodes["qr"], xr, y, w)
    _link(c, R["q"], R["ql"], ("q_proj", "q_latent"))
    g = side + w + gap / 2
    c.line([(R["q"].right - 12, R["q"].bottom), (R["q"].right - 12, R["q"].bottom + 8),
            (g, R["q"].bottom + 8), (g, R["qr"].cy), (R["qr"].x, R["qr"].cy)],
           edge=("q_proj", "q_rope"))
    y = max(R["ql"].bottom, R["qr"].bottom) + GAP
    R["w"] = draw(c, nodes["w"], mid, y, 2 * w + gap - 30)
    _link(c, R["ql"], R["w"], ("q_latent", "weights"))
    _link(c, R["qr"], R["w"], ("q_rope", "weights"))
    c.line([(R["cache"].right, R["cache"].cy - 6), (right, R["cache"].cy - 6),
            (right, R["w"].cy), (R["w"].right, R["w"].cy)],
           edge=[("cached_latent", "weights"), ("cached_rope_key", "weights")])
    y = R["w"].bottom + GAP
    R["h"] = draw(c, nodes["h"], xl, y, w)
    _link(c, R["w"], R["h"], ("weights", "heads"), x_from=xl)
    c.line([(R["cache"].right, R["cache"].cy + 6), (right - 6, R["cache"].cy + 6),
            (right - 6, R["h"].cy), (R["h"].right, R["h"].cy)],
           edge=("cached_latent", "heads"))
    y = R["h"].bottom + GAP
    R["wo"] = draw(c, nodes["wo"], xl, y, w)
    _link(c, R["h"], R["wo"], ("heads", "values"))
    y = R["wo"].bottom + GAP
    R["o"] = draw(c, nodes["o"], xl, y, w)
    _link(c, R["wo"], R["o"], ("values", "output"))
    _wire(c, rec.flow, omit=(("x", "heads"),))
    return c


def _bytes_canvas(mla: object, n_kv_heads: int, head_size: int, sizes: dict[str, int],
                  measured: float) -> Canvas:
    H, r, dR = mla.n_heads, mla.kv_lora_rank, mla.qk_rope_head_dim
    nbytes = mla.kv_b_proj.weight.element_size()
    title = "Cache per token and layer: MHA, GQA, MLA"
    c = Canvas(title)
    y = heading(c, "Cache per token, per layer", 0, 0)
    rows = [("mha", "MHA", f"2 × H × D = 2 × {H} × {head_size}"),
            ("gqa", "GQA", f"2 × H_kv × D = 2 × {n_kv_heads} × {head_size}"),
            ("mla", "MLA", f"r + d_R = {r} + {dR}")]
    most = max(sizes.values())
    bar_w = 200.0
    label_w = 46.0
    for key, name, formula in rows:
        n = sizes[key]
        c.text(0, y + 16, name, SMALL, bold=True, anchor="start")
        c.box(label_w, y + 4, max(bar_w * n / most, 2.0), 16, "embed", radius=2)
        c.text(label_w + bar_w + 8, y + 17, f"{n:,} B", SMALL, anchor="start", key=key,
               shape=(n,))
        c.text(label_w, y + 38, f"{formula} = {n // nbytes} numbers", SMALL, anchor="start")
        y += 54
    y = _lines(c, 0, y + 4, f"bytes at {nbytes} a number (the module's dtype); MLA keeps "
                            f"{sizes['mha'] / sizes['mla']:.3g}× less than MHA, "
                            f"{sizes['gqa'] / sizes['mla']:.3g}× less than GQA", 320)
    _lines(c, 0, y, f"the LatentCache of this run holds {measured:g} bytes per token", 320,
           key="measured")
    return c


def mla_figure(mla: object, x: Tensor, n_kv_heads: int, head_size: int | None = None
               ) -> Diagram:
    """Multi-head latent attention (DeepSeek-V2/V3) drawn from a run of `mla` on x (B, T, C)
    through a `LatentCache`: what is cached (the latent c and the shared RoPE key k_R), the
    per-head keys and values made from the cached latent by the up-projections, the absorbed
    form (W_UK folded into the query, W_UV applied to the outputs, every head attending to c
    itself), and the cache per token and layer beside multi-head and grouped-query attention with
    `n_kv_heads` key/value heads, both of `head_size` (default: mla.qk_nope_head_dim).

    The arrows of both forms are the dependencies recorded while the module runs; the byte
    counts are `kv_cache_bytes_per_token`'s in the module's dtype, and the MLA count is
    checked against the bytes the LatentCache of the run holds per token. The Diagram carries
    `bytes_per_token` ({"mha", "gqa", "mla"}) and `measured` (the cache's bytes per token).
    """
    from tfbook.mla import MultiHeadLatentAttention, kv_cache_bytes_per_token

    if not isinstance(mla, MultiHeadLatentAttention):
        raise TypeError(f"mla_figure needs a tfbook.mla.MultiHeadLatentAttention, got "
                        f"{type(mla).__name__}")
    C = mla.kv_a_proj_with_mqa.in_features
    dtype = mla.kv_b_proj.weight.dtype
    if not (isinstance(x, Tensor) and x.dim() == 3 and x.size(-1) == C and x.dtype == dtype):
        raise ValueError(f"x must be a tensor of shape (B, T, {C}) and dtype {dtype}, got "
                         + (f"{tuple(x.shape)} {x.dtype}" if isinstance(x, Tensor)
                            else type(x).__name__))
    head_size = mla.qk_nope_head_dim if head_size is None else head_size
    for name, value in (("n_kv_heads", n_kv_heads), ("head_size", head_size)):
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r:.40}")
    if mla.n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide the {mla.n_heads} heads "
                         "(each key/value head serves a group of query heads)")
    rec, shapes, cache = _run_mla(mla, x, absorbed=False)
    naive = _mla_canvas(mla, x, shapes, rec)
    rec_a, shapes_a, _ = _run_mla(mla, x, absorbed=True)
    absorbed = _absorbed_canvas(mla, x, shapes_a, rec_a)
    sizes = {"mha": kv_cache_bytes_per_token("mha", dtype=dtype, n_heads=mla.n_heads,
                                             head_size=head_size),
             "gqa": kv_cache_bytes_per_token("gqa", dtype=dtype, n_kv_heads=n_kv_heads,
                                             head_size=head_size),
             "mla": kv_cache_bytes_per_token("mla", dtype=dtype,
                                             kv_lora_rank=mla.kv_lora_rank,
                                             qk_rope_head_dim=mla.qk_rope_head_dim)}
    measured = cache.memory_bytes() / (x.size(0) * cache.length)
    if measured != sizes["mla"]:
        raise RuntimeError(f"the LatentCache holds {measured} bytes per token, "
                           f"kv_cache_bytes_per_token says {sizes['mla']}")
    panels = [naive, absorbed, _bytes_canvas(mla, n_kv_heads, head_size, sizes, measured)]
    d = Diagram(hstack("Multi-head latent attention", panels, 28,
                       ["naive.", "absorbed.", "bytes."]), panels)
    d.bytes_per_token, d.measured = sizes, measured
    d.flows = {"naive": rec.flow, "absorbed": rec_a.flow}
    return d


# --- RoPE scaling ---------------------------------------------------------------------------

PLOT_W, PLOT_H = 240.0, 150.0  # a plot's area
PLOT_LEFT = 44.0  # room for the y axis' tick labels
SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _power_of_ten(k: int) -> str:
    """10 to the k, written as a reader reads it: 10³.

    >>> _power_of_ten(3), _power_of_ten(0)
    ('10³', '10⁰')
    """
    return "10" + str(k).translate(SUPERSCRIPT)


def _plot_canvas(title: str, head: str, curves: dict[str, list[float]], log: bool,
                 lines: dict[str, float], y_words: str, legend: list[tuple[str, str, bool]],
                 ) -> tuple[Canvas, dict]:
    """Curves over the planes n = 0 .. N-1: y on a log axis (powers of ten) or a linear one,
    horizontal dashed reference lines (`lines`: label -> value), a legend under the plot.
    Returns the canvas and its axes (x0, y0 of the plot's bottom-left, the y range, log)."""
    c = Canvas(title)
    y = heading(c, head, 0, 0)
    y = _lines(c, 0, y + 2, y_words, PLOT_LEFT + PLOT_W)
    top = y + 4
    values = [v for vs in curves.values() for v in vs] + list(lines.values())
    f = (lambda v: math.log10(v)) if log else (lambda v: v)  # noqa: E731
    lo, hi = min(f(v) for v in values), max(f(v) for v in values)
    if log:
        lo, hi = math.floor(lo), max(math.ceil(hi), math.floor(lo) + 1)
        step = max(1, math.ceil((hi - lo) / 6))
        hi = lo + step * math.ceil((hi - lo) / step)
    else:  # from 0, in steps of 1, 2 or 5 times a power of ten, at most 6 of them
        lo = 0
        step = next(m * 10 ** e for e in range(0, 12) for m in (1, 2, 5)
                    if hi / (m * 10 ** e) <= 6)
        hi = step * max(1, math.ceil(hi / step))
    n = len(next(iter(curves.values())))
    x0, y0 = PLOT_LEFT, top + PLOT_H
    to_x = lambda i: x0 + PLOT_W * i / max(n - 1, 1)  # noqa: E731
    to_y = lambda v: y0 - PLOT_H * (f(v) - lo) / (hi - lo)  # noqa: E731
    # the axes and their ticks
    c.line([(x0, top), (x0, y0), (x0 + PLOT_W, y0)], arrow=False, width=1.0)
    for k in range(lo, hi + 1, step):
        yk = y0 - PLOT_H * (k - lo) / (hi - lo)
        c.line([(x0 - 4, yk), (x0, yk)], arrow=False, width=1.0)
        c.text(x0 - 7, yk + 4.5, _power_of_ten(k) if log else str(k), SMALL, anchor="end",
               key=f"tick.{k}")
    ticks = sorted({0, n // 4, n // 2, 3 * n // 4, n - 1})
    for i in ticks:
        c.line([(to_x(i), y0), (to_x(i), y0 + 4)], arrow=False, width=1.0)
        c.text(to_x(i), y0 + 18, str(i), SMALL)
    c.text(x0 + PLOT_W / 2, y0 + 36, "plane n (fastest first)", SMALL)
    for value in lines.values():
        c.line([(x0, to_y(value)), (x0 + PLOT_W, to_y(value))], arrow=False, dashed=True,
               width=1.0)
    for i, vs in enumerate(curves.values()):
        colour = "currentColor" if i == 0 else HEAD_COLOURS[(i - 1) % len(HEAD_COLOURS)]
        c.line([(to_x(j), to_y(v)) for j, v in enumerate(vs)], arrow=False, colour=colour,
               width=2.0, dashed=i == 0)
    # the legend: a short line of each curve's colour, then its words
    y = y0 + 56
    for i, (words, _, dashed) in enumerate(legend):
        colour = None if dashed and i >= len(curves) else (
            "currentColor" if i == 0 else HEAD_COLOURS[(i - 1) % len(HEAD_COLOURS)])
        c.line([(0, y - 4), (22, y - 4)], arrow=False, colour=colour, width=2.0 if colour
               else 1.0, dashed=dashed)
        y = _lines(c, 30, y, words, PLOT_LEFT + PLOT_W - 30)
    return c, {"x0": x0, "y0": y0, "lo": lo, "hi": hi, "log": log, "n": n}


def rope_scaling_figure(D: int, base: float, scalings: dict[str, object],
                        seq_len: int | None = None) -> Diagram:
    """RoPE's wavelength per plane (2π/θₙ positions for one turn, on a log axis) for plain
    RoPE and each scaling of `scalings` ({legend name: RopeScaling or rope_scaling dict}),
    with the trained context L as a dashed line; and the stretch θₙ / θₙ' per plane (how many
    times slower each plane turns). Every value is `rope_inverse_frequencies(D, base, s)`'s;
    "dynamic" is drawn at `seq_len` (default: its factor × L). YaRN's attention factor (the
    one cos and sin are multiplied by) is named in the legend.

    The Diagram carries `theta` ({"plain RoPE", name, ...}: the frequencies drawn),
    `attention_factor` ({name: float}) and `axes` (each plot's, for the tests).
    """
    from tfbook.rope_scaling import RopeScaling, rope_inverse_frequencies

    if not isinstance(scalings, dict) or not 1 <= len(scalings) <= 5 or not all(
            isinstance(k, str) and k for k in scalings):
        raise TypeError("scalings must be a dict of 1 to 5 {legend name: RopeScaling or "
                        f"rope_scaling dict}}, got {scalings!r:.80}")
    plain, _ = rope_inverse_frequencies(D, base)  # checks D and base
    theta = {"plain RoPE": plain}
    factors: dict[str, float] = {}
    lengths: dict[str, int] = {}  # the length each dynamic scaling is drawn at
    contexts: set[int] = set()
    for name, s in scalings.items():
        s = RopeScaling.from_dict(s) if isinstance(s, dict) else s
        if not isinstance(s, RopeScaling):
            raise TypeError(f"scaling {name!r}: a RopeScaling or a rope_scaling dict, got "
                            f"{type(s).__name__}")
        L = s.original_max_position_embeddings
        length = seq_len
        if s.rope_type == "dynamic" and length is None:
            length = int(round(s.factor * L))
        theta[name], factors[name] = rope_inverse_frequencies(D, base, s, length)
        if s.rope_type == "dynamic":
            lengths[name] = max(length, L)
        if L is not None:
            contexts.add(L)
    wavelengths = {k: (2 * math.pi / t).tolist() for k, t in theta.items()}
    stretch = {k: (plain / t).tolist() for k, t in theta.items()}
    refs = {f"L = {L:,}": float(L) for L in sorted(contexts)}
    legend = [(f"{name}" + (f", cos and sin × {factors[name]:.3g}" if factors.get(name, 1.0)
                            != 1.0 else "") + (f", at T = {lengths[name]:,}" if name in lengths
                                               else ""), name, name == "plain RoPE")
              for name in theta]
    legend_a = legend + [(f"trained context {', '.join(refs)}", "L", True)] if refs else legend
    a, axes_a = _plot_canvas("RoPE scaling: wavelength per plane",
                             f"RoPE wavelength per plane, D = {D}", wavelengths, True, refs,
                             "positions for one turn, 2π/θₙ (log axis)", legend_a)
    b, axes_b = _plot_canvas("RoPE scaling: stretch per plane",
                             "How much slower each plane turns", stretch, False, {},
                             "θₙ (plain) / θₙ (scaled)", legend)
    d = Diagram(hstack("RoPE scaling", [a, b], 28, ["wavelength.", "stretch."]), [a, b])
    d.theta, d.attention_factor = theta, factors
    d.axes = {"wavelength": axes_a, "stretch": axes_b}
    d.curves = {"wavelength": wavelengths, "stretch": stretch}
    return d
