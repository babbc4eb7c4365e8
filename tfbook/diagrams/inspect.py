"""Figures of Part VII (inside the model): where the hook points sit in a block, and the set-up
of activation patching.

    from tfbook.diagrams.inspect import hook_point_marks, patching_setup
    hook_point_marks(model, 0, ids)         # block 0 with a numbered mark at each hook point
    patching_setup(model, clean, corrupted, (" Mary", " John"), layer=3, position=5)

`hook_point_marks` draws one pre-LN decoder block as the book's `block` figure does (the residual
stream as a vertical bus, each sub-layer reading from it and adding back), with attention and
the feed-forward network opened up so that every hook point has a place: a numbered mark on
the box or the stretch of stream that holds its tensor, and a legend with its name, read from
the model (`tfbook.inspect.hook_names`, in the order the points fire), and its traced shape.
Each mark's tensor is a tensor of the dataflow recorded by the trace (`HOOK_TENSORS` maps a
hook name to the recorder's name of the same tensor; the tests compare their values), and the
drawing's arrows are held against that dataflow, so a mark cannot sit on the wrong arrow.

`patching_setup` draws the two runs of activation patching: the clean prompt above, the
corrupted one below, each a grid of positions (rows, one token each) by layers (columns); the
activation copied from the clean run into the corrupted run at (layer, position) or (layer,
head); the cells of the corrupted run that the copy can change (later layers, the same or
later positions: the model is causal); and the metric, the difference of the two answers'
logits at the last position. Every caption is generated from the arguments, and every token
is shown escaped, its spaces and control characters made visible, a long one cut with "…".
"""

from __future__ import annotations

import inspect
import numbers
import unicodedata
from collections.abc import Sequence

from torch import Tensor, nn

from tfbook.diagrams._shared import visible
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.figures import _check_trace, _norm_title, _wire
from tfbook.diagrams.layout import Node, Rect, draw, row, shape_label, wrap_words
from tfbook.diagrams.svg import (
    FONT,
    SMALL,
    Canvas,
    Label,
    _num,
    escape,
    text_width,
)
from tfbook.diagrams.trace import Trace, trace

HOOK_COLOUR = "#c2185b"  # the marks of hook points: one colour no box uses
DOT_R = 9.0  # a mark's radius: room for a two-digit number at the book's smallest text size
GAP_X = 34.0  # from the residual stream (x = 0) to the left edge of the sub-layers' boxes

# What each hook point of a pre-LN block holds, as the dataflow recorder names the same tensor
# (`tfbook.diagrams.dataflow`): (module, relative to the block; "input", "output" or a step
# inside attention). The recorder skips the hook points (they return their input), so a hook
# point's tensor is the input or output of a module next to it.
HOOK_TENSORS: dict[str, tuple[str, str]] = {
    "residual_pre": ("", "input"),  # the block's input
    "attn.q": ("attn", ".q"),  # split into heads, before RoPE (the recorder names it there)
    "attn.k": ("attn", ".k"),
    "attn.v": ("attn", ".v"),
    "attn.weights": ("attn", ".weights"),  # the softmax
    "attn.heads": ("attn", ".heads"),  # weights @ V, before the heads are merged
    "attn.out": ("attn", "output"),  # after W_O: what attention adds to the stream
    "residual_mid": ("norm2", "input"),  # pre-LN: the sum after attention is norm2's input
    "ff.hidden": ("ff.dropout", "input"),  # the hidden units enter the FFN's dropout
    "ff.out": ("ff", "output"),
    "residual_post": ("", "output"),  # the block's output
}
# the legend letters of each point's tensor (B batch, T positions, C width, H heads,
# H_kv key/value heads, D head size, F hidden units)
HOOK_LETTERS: dict[str, tuple[str, ...]] = {
    "residual_pre": ("B", "T", "C"), "attn.q": ("B", "H", "T", "D"),
    "attn.k": ("B", "H", "T", "D"), "attn.v": ("B", "H", "T", "D"),
    "attn.weights": ("B", "H", "T", "T"), "attn.heads": ("B", "H", "T", "D"),
    "attn.out": ("B", "T", "C"), "residual_mid": ("B", "T", "C"),
    "ff.hidden": ("B", "T", "F"), "ff.out": ("B", "T", "C"), "residual_post": ("B", "T", "C"),
}
HOOK_NOTES: dict[str, str] = {
    "residual_pre": "the stream entering the block",
    "attn.q": "queries, one set per head",
    "attn.k": "keys",
    "attn.v": "values",
    "attn.weights": "softmax(Q Kᵀ/√D), per head",
    "attn.heads": "A V per head, before W_{O}",
    "attn.out": "what attention adds",
    "residual_mid": "the stream after attention's add",
    "ff.hidden": "the FFN's hidden units",
    "ff.out": "what the FFN adds",
    "residual_post": "the stream leaving the block",
}


# --- the hook points of one block ---------------------------------------------------------

def hook_tensor(block: str, suffix: str, tr: Trace) -> str:
    """The dataflow name of the tensor at hook point `block`.`suffix` of a traced pre-LN block
    ("blocks.0", "residual_mid" -> "blocks.0.norm2:x")."""
    if suffix not in HOOK_TENSORS:
        raise ValueError(f"no hook point {suffix!r} in a pre-LN self-attention block; its "
                         f"points are {', '.join(HOOK_TENSORS)}")
    module, part = HOOK_TENSORS[suffix]
    name = ".".join(p for p in (block, module) if p)
    if part == "input":  # "<module>:<its first parameter>" (a dropout is not in tr.calls)
        first = next(iter(inspect.signature(tr.model.get_submodule(name).forward).parameters))
        return f"{name}:{first}" if name else first
    if part == "output":
        return name or "output"
    return tr.flow_name(name, part)


def _trace_of(model_or_trace: object, ids: object) -> Trace:
    if isinstance(model_or_trace, Trace):
        if ids is not None:
            raise ValueError("give a Trace alone, or a model with the ids to trace it on, not "
                             "both")
        return model_or_trace
    if isinstance(model_or_trace, nn.Module):
        if not isinstance(ids, Tensor):
            raise TypeError(f"a model needs the token ids to trace it on, hook_point_marks(model, "
                            f"layer, ids); got ids={type(ids).__name__}")
        return trace(model_or_trace, ids)
    return _check_trace(model_or_trace, "model_or_trace")


def _layer(layer: object, n: int, what: str = "layer") -> int:
    if not isinstance(layer, numbers.Integral) or isinstance(layer, bool):
        raise TypeError(f"{what} must be an int, got {type(layer).__name__}: {layer!r:.40}")
    if not 0 <= layer < n:
        raise ValueError(f"{what} must be in [0, {n}) (counted from 0), got {layer}")
    return int(layer)


def _blocks(model: nn.Module) -> list[str]:
    """The names of the model's blocks, from its hook names: "blocks.3.residual_pre" ->
    "blocks.3"."""
    from tfbook.inspect import hook_names

    ends = ".residual_pre"
    names = hook_names(model, "*" + ends)
    if not names:
        raise ValueError(f"{type(model).__name__} has no hook points (tfbook.hooks.HookPoint): "
                         "it is not a tfbook model, or has no blocks")
    return [n[: -len(ends)] for n in names]


def _dot(c: Canvas, x: float, y: float, number: int) -> None:
    """A numbered mark: a filled disc in the hooks' colour with its number in white."""
    c.parts.append(f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{_num(DOT_R)}" '
                   f'style="fill:{HOOK_COLOUR};stroke:none"/>')
    text = str(number)
    c.parts.append(f'<text x="{_num(x)}" y="{_num(y + 4.4)}" font-size="{_num(SMALL)}" '
                   f'text-anchor="middle" class="b" style="fill:#fff">{escape(text)}</text>')
    c.labels.append(Label(text))
    c._extend(x - DOT_R, y - DOT_R, x + DOT_R, y + DOT_R)


def _rect(c: Canvas, x: float, y: float, w: float, h: float, style: str) -> None:
    """A plain rectangle in the hooks' colour: a shaded cell, or the outline of the copy."""
    c.parts.append(f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" '
                   f'style="{style}"/>')
    c._extend(x, y, x + w, y + h)


def _activation_name(fn: object) -> str:
    """The name an FFN's activation has in `tfbook.feedforward.ACTIVATIONS` ("gelu_tanh" for
    torch's fused tanh GELU, a lambda), or "act" for a function of the reader's own."""
    from tfbook.feedforward import ACTIVATIONS, activation

    code = getattr(fn, "__code__", None)
    for name in ACTIVATIONS:
        for fused in (True, False):
            known = activation(name, fused)
            if known is fn or (code is not None and getattr(known, "__code__", None) is code):
                return name
    return "act"


def hook_point_marks(model_or_trace: nn.Module | Trace, layer: int,
                ids: Tensor | None = None) -> Diagram:
    """One pre-LN decoder block with a numbered mark where each hook point's tensor lives.

    `model_or_trace`: a `Trace` (from `trace(model, ids)`), or a tfbook model and the `ids`
    to trace it on. The hook names are the model's own (`hook_names`, numbered in the order
    they fire), each with its traced shape in the legend. Every mark sits on the box or the
    stretch of stream that holds its tensor, and every arrow is a dependency of the traced
    pass. On a phone the legend goes under the block. The Diagram also carries
    `hook_tensors` (hook name -> the dataflow's name of its tensor) and `hook_carriers` (the
    part of the drawing each mark sits on: ("box", tensor) or ("edge", (source, result))).
    """
    from tfbook.inspect import hook_names

    tr = _trace_of(model_or_trace, ids)
    blocks = _blocks(tr.model)
    block = blocks[_layer(layer, len(blocks))]
    kind = tr.kind(block)
    if kind != "SelfAttentionBlock" or not tr.module(block).norm_first:
        raise ValueError(f"hook_point_marks draws a pre-LN self-attention block (a decoder's), "
                         f"{block!r} is a {'post-LN ' if kind == 'SelfAttentionBlock' else ''}"
                         f"{kind}")
    names = hook_names(tr.model, block + ".*")
    suffixes = [n[len(block) + 1:] for n in names]
    if sorted(suffixes) != sorted(HOOK_TENSORS):
        raise ValueError(f"{block} has the hook points {suffixes}; this figure places "
                         f"{list(HOOK_TENSORS)}")
    tensors = {n: hook_tensor(block, s, tr) for n, s in zip(names, suffixes, strict=True)}
    vertices = {tr.flow.vertex(t) for t in tensors.values()}
    if len(vertices) != len(tensors):  # two marks on one tensor: the table is wrong
        raise RuntimeError(f"two hook points of {block} are said to hold one tensor: "
                           f"{tensors}")
    wide, carriers = _hooks_canvas(tr, block, names, below=False)
    narrow, _ = _hooks_canvas(tr, block, names, below=True)
    d = Diagram(wide, narrow=[narrow])
    d.hook_tensors = tensors  # hook name -> the dataflow's name of its tensor
    d.hook_carriers = carriers  # hook name -> what its mark sits on: a box's or an arrow's
    return d


def _hooks_canvas(tr: Trace, block: str, names: list[str], below: bool
                  ) -> tuple[Canvas, dict[str, tuple[str, object]]]:
    """The block with its marks, and the legend beside it (or `below` it, for a phone)."""
    child = lambda part: f"{block}.{part}"  # noqa: E731
    number = {n[len(block) + 1:]: i + 1 for i, n in enumerate(names)}  # firing order, from 1
    flow = {s: hook_tensor(block, s, tr) for s in number}
    ff = tr.module(child("ff"))
    act = _activation_name(ff.act)
    c = Canvas(f"Hook points of {block}, numbered in the order they fire")
    carriers: dict[str, tuple[str, object]] = {}
    on_stream: list[tuple[float, int]] = []

    def mark_box(suffix: str, r: Rect, node: Node) -> None:
        if node.flow != flow[suffix]:
            raise RuntimeError(f"the mark of {suffix} sits on a box of {node.flow}, not on its "
                               f"tensor {flow[suffix]}")
        _dot(c, r.x, r.cy, number[suffix])
        carriers[suffix] = ("box", node.flow)

    def mark_stream(suffix: str, y: float, edge: tuple[str, str]) -> None:
        if edge[0] != flow[suffix]:
            raise RuntimeError(f"the mark of {suffix} sits on a stretch of stream that carries "
                               f"{edge[0]}, not its tensor {flow[suffix]}")
        on_stream.append((y, number[suffix]))  # drawn last, over the stream's line
        carriers[suffix] = ("edge", edge)

    norm1 = Node(_norm_title(tr, child("norm1")), kind="norm", flow=child("norm1"))
    norm2 = Node(_norm_title(tr, child("norm2")), kind="norm", flow=child("norm2"))
    qkv = [Node(t, kind="attn", flow=flow[s], min_width=46)
           for t, s in (("Q", "attn.q"), ("K", "attn.k"), ("V", "attn.v"))]
    weights = Node("softmax(Q Kᵀ/√D)", kind="attn", flow=flow["attn.weights"])
    heads = Node("A V, per head", kind="attn", flow=flow["attn.heads"])
    out = Node("W_{O}: heads merged", kind="attn", flow=flow["attn.out"])
    hidden_title = (f"{act}(x W_{{1}})" if tr.kind(child("ff")) == "FeedForward"
                    else f"{act}(x W_{{gate}}) × x W_{{1}}")
    hidden = Node(hidden_title, kind="ffn", flow=flow["ff.hidden"])
    w2 = Node("W_{2}", kind="ffn", flow=flow["ff.out"])
    column_nodes = [norm1, weights, heads, out, norm2, hidden, w2]
    q_gap = 26.0
    qkv_width = sum(n.width for n in qkv) + 2 * q_gap
    width = max(max(n.width for n in column_nodes), qkv_width)
    cx = GAP_X + width / 2  # the sub-layers' column
    x_in, x_mid, x_out = flow["residual_pre"], flow["residual_mid"], flow["residual_post"]

    top = draw(c, Node("residual stream x", kind="stream", flow=x_in), cx / 2, 0)
    y = top.bottom + 38
    mark_stream("residual_pre", top.bottom + 15, (x_in, x_mid))

    def read(y: float, source: str, target: Node) -> float:
        c.text(-8, y + 4, "read", SMALL, anchor="end")
        c.line([(0, y), (cx, y), (cx, y + 16)], edge=(source, target.flow))
        return y + 16

    def down(r: Rect, node: Node, y: float, target: Node) -> Rect:
        c.arrow(cx, r.bottom, cx, y, edge=(node.flow, target.flow))
        return draw(c, target, cx, y, width)

    def add(r: Rect, node: Node, stream: tuple[str, str], bus_from: float) -> float:
        """The branch's output added back into the stream: returns the adder's bottom."""
        y_add = r.bottom + 22
        c.line([(cx, r.bottom), (cx, y_add), (11, y_add)], edge=(node.flow, stream[1]))
        c.bus(0, bus_from, y_add - 11, edge=stream)
        c.adder(0, y_add)
        c.text(-16, y_add + 5, "add", SMALL, anchor="end")
        return y_add + 11

    # attention, opened up
    y = read(y - 4, x_in, norm1)
    n1 = draw(c, norm1, cx, y, width)
    y = n1.bottom + 26
    rq, rk, rv = row(c, qkv, cx, y, gap=q_gap)
    for r, node in zip((rq, rk, rv), qkv, strict=True):
        c.line([(cx, n1.bottom), (cx, n1.bottom + 10), (r.cx, n1.bottom + 10), (r.cx, r.y)],
               edge=(norm1.flow, node.flow))
        mark_box(("attn.q", "attn.k", "attn.v")[qkv.index(node)], r, node)
    y = rq.bottom + 28
    rw = draw(c, weights, cx, y, width)
    for r, node in ((rq, qkv[0]), (rk, qkv[1])):
        c.line([(r.cx, r.bottom), (r.cx, r.bottom + 12), (cx, r.bottom + 12), (cx, rw.y)],
               edge=(node.flow, weights.flow))
    mark_box("attn.weights", rw, weights)
    rh = down(rw, weights, rw.bottom + 24, heads)
    x_route = max(rv.cx, cx + width / 2 + 18)  # V goes around the softmax into A V
    c.line([(rv.cx, rv.bottom), (rv.cx, rv.bottom + 12), (x_route, rv.bottom + 12),
            (x_route, rh.cy), (rh.right, rh.cy)], edge=(qkv[2].flow, heads.flow))
    mark_box("attn.heads", rh, heads)
    ro = down(rh, heads, rh.bottom + 24, out)
    mark_box("attn.out", ro, out)
    bus_from = add(ro, out, (x_in, x_mid), top.bottom)
    mark_stream("residual_mid", bus_from + 17, (x_mid, x_out))
    # the feed-forward network
    y = read(bus_from + 40, x_mid, norm2)
    n2 = draw(c, norm2, cx, y, width)
    rf = down(n2, norm2, n2.bottom + 24, hidden)
    mark_box("ff.hidden", rf, hidden)
    r2 = down(rf, hidden, rf.bottom + 24, w2)
    mark_box("ff.out", r2, w2)
    end = add(r2, w2, (x_mid, x_out), bus_from)
    y = end + 36
    c.bus(0, end, y - 8)
    c.arrow(0, y - 8, 0, y, edge=(x_out, x_out))  # the block's output is the next one's input
    mark_stream("residual_post", end + 15, (x_out, x_out))
    last = block == _blocks(tr.model)[-1]
    draw(c, Node("to the final norm" if last and hasattr(tr.model, "norm_f")
                 else "to the next block", kind="stream", flow=x_out), cx / 2, y)
    for y_mark, n in on_stream:
        _dot(c, 0, y_mark, n)
    _wire(c, tr.flow, within=block)
    _hook_legend(c, tr, block, names, below)
    return c, carriers


def _hook_legend(c: Canvas, tr: Trace, block: str, names: list[str], below: bool) -> None:
    """Each hook point's number, name, traced shape and what it holds, in firing order."""
    at = tr.attention(f"{block}.attn")
    x0 = c.x0 if below else c.x1 + 28
    y = c.y1 + 30 if below else c.y0
    c.text(x0, y + FONT, ["Hook points of " + block + ",", "in the order they fire"],
           FONT, bold=True, anchor="start")
    y += FONT + 14 + FONT * 1.25
    for i, name in enumerate(names):
        suffix = name[len(block) + 1:]
        shape = tr.shape(name)
        letters = list(HOOK_LETTERS[suffix])
        if suffix in ("attn.k", "attn.v") and at.n_kv_heads != at.n_heads:
            letters[1] = "H_kv"
        if suffix == "attn.weights" and shape[-1] != shape[-2]:
            letters[-1] = "S"  # keys from a cache: S positions
        note = HOOK_NOTES[suffix]
        if suffix in ("attn.q", "attn.k") and at.n_heads and tr.module(
                f"{block}.attn").rope_base is not None:
            note += ", before RoPE"
        _dot(c, x0 + DOT_R, y + 5, i + 1)
        x = x0 + 2 * DOT_R + 8
        c.text(x, y + 9.5, name, SMALL, mono=True, bold=True, anchor="start")
        c.text(x, y + 27, shape_label(letters, shape), SMALL,
               mono=True, anchor="start", key=name, shape=shape)
        c.text(x, y + 44, note, SMALL, anchor="start", sub=True)
        y += 58


# --- the patching set-up ------------------------------------------------------------------

MOST_CHARS = 12  # a token longer than this is cut, with an ellipsis
ROW_H = 18.0  # one position's row
HEADLESS = ("residual_pre", "residual_mid", "residual_post", "attn.out", "ff.out", "ff.hidden")
# points whose change at position p reaches the later positions of the same block (through
# the keys and values attention reads), and points that touch the block's tokens one by one
# before attention (so in block 0 they differ between the runs only where the tokens do)
REACHES_LATER = ("residual_pre", "attn.k", "attn.v")
BEFORE_MIXING = ("residual_pre", "attn.q", "attn.k", "attn.v")
BIDI = {"R", "AL", "RLE", "RLO", "RLI", "LRE", "LRO", "LRI", "FSI", "PDF", "PDI", "AN"}


def shown(token: str, most: int = MOST_CHARS) -> str:
    """A token as the figure writes it: spaces as ␣, control characters escaped, at most
    `most` characters (a longer one ends in "…").

    >>> shown(" Mary"), shown("a" * 20, 8)
    ('␣Mary', 'aaaaaaa…')
    """
    if not isinstance(token, str):
        raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r:.40}")
    pieces = [visible(ch) for ch in token] or [visible("")]
    text = "".join(pieces)
    if len(text) <= most:
        return text
    out = ""
    for piece in pieces:
        if len(out) + len(piece) > most - 1:
            break
        out += piece
    return out + "…"


def _isolated(text: str) -> str:
    """Text that holds right-to-left letters wrapped in a first-strong isolate, so that it
    cannot reorder the caption around it."""
    if any(unicodedata.bidirectional(ch) in BIDI for ch in text):
        return "\u2068" + text + "\u2069"
    return text


def changed_cells(point: str, layer: int, positions: set[int], differ: set[int], n_layers: int,
                  n_positions: int) -> set[tuple[int, int]]:
    """The (layer, position) blocks whose output the copy can change, in a causal model.

    The clean and corrupted activations at block `layer`'s `point` can differ only at the
    positions the differing tokens reach: in block 0, before attention mixes positions, the
    differing positions themselves; everywhere else from the first differing position on. A
    copy at positions where they agree changes nothing. From the first position p the copy
    changes, block `layer`'s outputs change at p (and at every later position if the copy
    reaches the keys and values), and every later block's from p on.
    """
    first = min(differ)
    can_differ = (set(differ) if layer == 0 and point in BEFORE_MIXING
                  else set(range(first, n_positions)))
    copied = positions & can_differ
    if not copied:
        return set()
    p = min(copied)
    here = set(range(p, n_positions)) if point in REACHES_LATER else copied
    return {(layer, t) for t in here} | {(m, t) for m in range(layer + 1, n_layers)
                                         for t in range(p, n_positions)}


def _tokens(name: str, tokens: object) -> list[str]:
    if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not tokens or not all(
            isinstance(t, str) for t in tokens):
        raise TypeError(f"{name} must be a non-empty list of tokens (str), got {tokens!r:.60}")
    return list(tokens)


def patching_setup(model: nn.Module, clean: Sequence[str], corrupted: Sequence[str],
                   answers: tuple[str, str], layer: int, position: int | None = None,
                   head: int | None = None, point: str | None = None) -> Diagram:
    """Activation patching: the clean run's activation at (layer, position) or (layer, head)
    copied into the corrupted run, and the logit difference of the two answers read at the
    last position.

    `model` is the causal tfbook model patched (its blocks, heads and hook names are read from
    it); `clean` and `corrupted` are the two prompts' tokens (as many in each), `answers` the
    (right, wrong) answer tokens. `point` is the hook point in the block (default
    "residual_pre" for a position, "attn.heads" for a head); `position` and `head` say where
    the copy goes (None: every position; every head). The cells the copy can change are
    shaded (`changed_cells`); the captions say what is copied and whether it can reach the
    metric. The Diagram also carries `hook` (the hook name patched), `differ` (the positions
    whose tokens differ) and `changed` (the (block, position) cells shaded).
    """
    from tfbook.inspect import hook_names

    if not isinstance(model, nn.Module):
        raise TypeError(f"patching_setup needs the tfbook model patched, got "
                        f"{type(model).__name__}")
    from tfbook.models.gpt import GPT

    if not isinstance(model, GPT):
        raise ValueError(f"patching_setup draws a causal decoder (a tfbook GPT, Llama-style "
                         f"or not): which cells a copy can change follows the causal mask; "
                         f"got a {type(model).__name__}")
    clean, corrupted = _tokens("clean", clean), _tokens("corrupted", corrupted)
    if len(clean) != len(corrupted):
        raise ValueError(f"patching copies an activation position by position: the clean and "
                         f"corrupted prompts need as many tokens, got {len(clean)} and "
                         f"{len(corrupted)}")
    differ = {t for t, (a, b) in enumerate(zip(clean, corrupted, strict=True)) if a != b}
    if not differ:
        raise ValueError("the clean and corrupted prompts are the same tokens: nothing to patch")
    if not (isinstance(answers, tuple | list) and len(answers) == 2
            and all(isinstance(a, str) for a in answers)):
        raise TypeError(f"answers must be (right, wrong): two tokens (str), got {answers!r:.60}")
    if answers[0] == answers[1]:
        raise ValueError(f"the two answers must differ, got {answers[0]!r} twice")
    blocks = _blocks(model)
    n_layers, T = len(blocks), len(clean)
    layer = _layer(layer, n_layers)
    if position is None and head is None:
        raise ValueError("say where the copy goes: a position, a head, or both")
    if position is not None:  # a negative position counts from the end, as in Python
        if isinstance(position, numbers.Integral) and -T <= position < 0:
            position = int(position) + T
        position = _layer(position, T, "position")
    point = point if point is not None else ("residual_pre" if head is None else "attn.heads")
    if not isinstance(point, str):
        raise TypeError(f"point must be a hook point's name in the block, such as "
                        f"'residual_pre' or 'attn.heads', got {point!r:.40}")
    points = [n[len(blocks[layer]) + 1:] for n in hook_names(model, blocks[layer] + ".*")]
    if point not in points:
        raise ValueError(f"{blocks[layer]} has no hook point {point!r}; its points are "
                         f"{', '.join(points)}")
    hook = f"{blocks[layer]}.{point}"
    n_heads = None
    if head is not None:
        if point in HEADLESS:
            raise ValueError(f"{hook} (B, T, width) has no heads; pick a point with heads "
                             "(attn.q, attn.k, attn.v, attn.weights, attn.heads) or head=None")
        attn = model.get_submodule(hook.rsplit(".", 1)[0])
        n_heads = attn.n_kv_heads if point in ("attn.k", "attn.v") else attn.n_heads
        head = _layer(head, n_heads, "head")
    positions = set(range(T)) if position is None else {position}
    changed = changed_cells(point, layer, positions, differ, n_layers, T)
    c = _patching_canvas(clean, corrupted, [shown(a) for a in answers], hook, layer, n_layers,
                         position, head, n_heads, point, differ, changed)
    d = Diagram(c)
    d.hook = hook
    d.changed = changed
    d.differ = differ
    return d


def _patching_canvas(clean: list[str], corrupted: list[str], answers: list[str], hook: str,
                     layer: int, n_layers: int, position: int | None, head: int | None,
                     n_heads: int | None, point: str, differ: set[int],
                     changed: set[tuple[int, int]]) -> Canvas:
    T = len(clean)
    width = 340.0  # the drawing's width: a phone's column holds it
    c = Canvas(f"Activation patching of {hook}")
    where = [f"at position {position} ({_isolated(shown(clean[position]))})"
             if position is not None else "at every position"]
    if head is not None:
        kv = point in ("attn.k", "attn.v")
        where.insert(0, f"{'key/value ' if kv else ''}head {head} of {n_heads}")
    heading = (f"Copy {hook}, {', '.join(where)}, from the clean run into the corrupted "
               "run")
    lines = wrap_words(heading, width, FONT)
    c.text(0, FONT, lines, FONT, bold=True, anchor="start")
    y = FONT * (1 + 1.25 * (len(lines) - 1)) + 14

    idx_w = text_width(str(T - 1), SMALL, mono=True)
    tok_w = max(text_width(shown(t), SMALL, mono=True) for t in clean + corrupted)
    x_grid = idx_w + 8 + tok_w + 10
    cell_w = max(6.0, min(24.0, (width - x_grid) // n_layers))
    grid_w = cell_w * n_layers
    x_l = x_grid + (layer + 0.5) * cell_w  # the patched layer's column

    def grid(y: float, tokens: list[str], title: str, patched: bool) -> Rect:
        c.text(0, y + FONT, title, FONT, bold=True, anchor="start")
        y += FONT + 10
        _layer_axis(c, y + SMALL, x_grid, cell_w, n_layers, layer)
        y += SMALL + 8
        for t, tok in enumerate(tokens):
            ty = y + t * ROW_H
            if t in differ:  # the tokens the corruption changed
                c.box(x_grid - 8 - tok_w - 3, ty + 0.5, tok_w + 6, ROW_H - 1, "ffn", radius=3)
            c.text(x_grid - 8, ty + 13, shown(tok), SMALL, mono=True, anchor="end")
            c.text(idx_w, ty + 13, str(t), SMALL, mono=True, anchor="end")
            for m in range(n_layers):
                x = x_grid + m * cell_w
                if patched and (m, t) in changed:
                    _rect(c, x + 0.5, ty + 1, cell_w - 1, ROW_H - 2,
                          f"fill:{HOOK_COLOUR};fill-opacity:.3;stroke:{HOOK_COLOUR};"
                          "stroke-width:1")
                else:
                    c.box(x + 0.5, ty + 1, cell_w - 1, ROW_H - 2, "data", radius=1)
        rows = sorted({position} if position is not None else range(T))
        r0, r1 = rows[0], rows[-1]
        x = x_grid + layer * cell_w
        _rect(c, x - 1, y + r0 * ROW_H - 0.5, cell_w + 2, (r1 - r0 + 1) * ROW_H + 1,
              f"fill:none;stroke:{HOOK_COLOUR};stroke-width:2.5")
        return Rect(x_grid, y, grid_w, T * ROW_H)

    g1 = grid(y, clean, "clean run (its activations cached)", False)
    y = g1.bottom + 10
    copy_y = y + 34
    c.arrow(x_l, g1.bottom + 2, x_l, copy_y + 10, colour=HOOK_COLOUR, width=2.5,
            edge="the copy: a hook puts the clean run's activation in the corrupted run")
    side_right = x_l + 10 + text_width("copy", SMALL) <= width
    c.text(x_l + 10 if side_right else x_l - 10, y + 20, "copy", SMALL, bold=True,
           anchor="start" if side_right else "end")
    g2 = grid(copy_y + 14, corrupted, "corrupted run, with the copy", True)
    # the metric: the last position's logits
    x_last = g2.right - cell_w / 2
    y = g2.bottom + 34
    c.arrow(x_last, g2.bottom + 2, x_last, y,
            edge="the last position's logits, read after the last block")
    right, wrong = (_isolated(a) for a in answers)
    metric = [f"logit({right}) − logit({wrong})", "at the last position"]
    box_w = max(text_width(line, SMALL) for line in metric) + 24
    box_x = min(max(x_last - box_w / 2, 0.0), max(g2.right, box_w) - box_w)
    c.box(box_x, y, box_w, 44, "head")
    c.text(box_x + box_w / 2, y + 18, metric[0], SMALL, bold=True)
    c.text(box_x + box_w / 2, y + 35, metric[1], SMALL)
    y += 44 + 22
    # what the shading says, generated from what the copy can reach
    if not changed:
        first, listed = min(differ), ", ".join(str(t) for t in sorted(differ))
        said = (f"Block 0 reads each token alone until attention mixes them, and the tokens "
                f"differ only at position {listed}: at position {position} the runs agree, "
                "and the copy changes nothing." if layer == 0 and point in BEFORE_MIXING else
                f"The runs agree before position {first}, where the tokens first differ (the "
                "model is causal): the copy changes nothing.")
    elif (n_layers - 1, T - 1) in changed:
        said = ("Shaded: what the copy can change. It reaches the last position: the metric "
                "can move.")
    else:
        said = ("Shaded: what the copy can change. It cannot reach the last position: the metric"
                " stays the corrupted run's.")
    notes = [said, "Orange: the tokens that differ. Blocks and positions count from 0."]
    for note in notes:
        lines = wrap_words(note, width, SMALL)
        c.text(0, y, lines, SMALL, anchor="start")
        y += SMALL * 1.25 * len(lines) + 6
    return c


def _layer_axis(c: Canvas, y: float, x_grid: float, cell_w: float, n_layers: int,
                layer: int) -> None:
    """The blocks' numbers over the grid's columns: the patched one (bold), the last, and every
    first, second, fifth or tenth, the smallest step whose numbers do not touch."""
    c.text(x_grid - 8, y, "block", SMALL, anchor="end")
    room = text_width(str(n_layers - 1), SMALL, mono=True) + 8  # one number and its margin
    step = next((s for s in (1, 2, 5, 10, 20, 50) if s * cell_w >= room), 100)
    placed: list[tuple[float, float]] = []
    for m in [layer, n_layers - 1, *range(0, n_layers, step)]:
        x = x_grid + (m + 0.5) * cell_w
        half = text_width(str(m), SMALL, mono=True) / 2 + 4
        if any(x - half < b and a < x + half for a, b in placed):
            continue
        placed.append((x - half, x + half))
        c.text(x, y, str(m), SMALL, mono=True, bold=m == layer)


__all__ = ["HOOK_TENSORS", "changed_cells", "hook_point_marks", "hook_tensor", "patching_setup",
           "shown"]
