"""The key/value cache drawn from a real model and a real cache: prefill, one decode step,
grouped key/value heads, and what the cache holds.

    from tfbook.diagrams.generation import kv_cache
    kv_cache(GPT(tiny_llama()).eval(), prompt)   # prompt: (B, T0) token ids

`kv_cache` runs the model twice through one `KVCache` (the prompt, then one new token, the
greedy choice) with forward hooks on the first block's attention and its projections, and
reads every shape from those passes and every byte count from the cache's own tensors.
Nothing is typed: another config (more layers, fewer key/value heads) gives another drawing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tfbook.diagrams._shared import heading, note
from tfbook.diagrams.dataflow import Dataflow, Recorder
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import GAP, Node, Rect, column, draw, hstack, row, shape_label
from tfbook.diagrams.svg import SMALL, Canvas

PREFILL, DECODE = "prefill.", "decode."  # the two passes' names in the dataflow
ATTN = "blocks.0.attn"  # the attention drawn: block 0's (blocks count from 0, as in the code)
QUERY = ("B", "H", "T", "D")
NEW_KV = ("B", "H_kv", "T", "D")
STORED = ("B", "H_kv", "S", "D")
WEIGHTS = ("B", "H", "T", "S")


@dataclass(frozen=True)
class AttentionShapes:
    """Shapes inside one call of a cached attention module, from hooks on the real tensors."""

    q: tuple[int, ...]  # (B, H, T, D) this pass's queries
    k: tuple[int, ...]  # (B, H_kv, T, D) this pass's new keys (values alike)
    weights: tuple[int, ...]  # (B, H, T, S): every query against every stored key
    n_heads: int  # H
    n_kv_heads: int  # H_kv


def _run_hooked(model: nn.Module, ids: Tensor, cache: object,
                rec: Recorder) -> tuple[AttentionShapes, tuple, tuple]:
    """model(ids, cache=cache) with hooks on block 0's attention, recorded by `rec`; -> its
    shapes, the logits' shape and the attention input's."""
    attn = model.blocks[0].attn
    H, H_kv, D = attn.n_heads, attn.n_kv_heads, attn.head_size
    seen: dict[str, tuple[int, ...]] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            seen[name] = tuple(output[1].shape) if name == "weights" else tuple(output.shape)
        return hook

    def keep_input(module: nn.Module, args: tuple) -> None:
        seen["x"] = tuple(args[0].shape)

    handles = [attn.q_proj.register_forward_hook(keep("q")),
               attn.k_proj.register_forward_hook(keep("k")),
               attn.register_forward_hook(keep("weights")),
               attn.register_forward_pre_hook(keep_input)]
    try:
        with torch.no_grad(), rec:
            logits = model(ids, cache=cache, need_weights=True).logits
    finally:
        for handle in handles:
            handle.remove()
    (B, T, _), (_, _, _) = seen["q"], seen["k"]
    # the projections' outputs (B, T, H D) and (B, T, H_kv D), split into heads as the module does
    shapes = AttentionShapes((B, H, T, seen["q"][-1] // H), (B, H_kv, T, seen["k"][-1] // H_kv),
                             seen["weights"], H, H_kv)
    if shapes.q[-1] != D:
        raise RuntimeError(f"queries of size {shapes.q[-1]}, the module says D = {D}")
    return shapes, tuple(logits.shape), seen["x"]


@dataclass(frozen=True)
class CacheStep:
    """One pass through the cache: the ids fed, layer 0's attention, and the cache after it."""

    ids: tuple[int, ...]  # (B, T) fed in this pass
    attention: AttentionShapes  # layer 0: q (B, H, T, D), new k (B, H_kv, T, D), weights
    stored: tuple[int, ...]  # (B, H_kv, S, D): keys (and values) stored per layer after it
    logits: tuple[int, ...]  # (B, T, V)
    x: tuple[int, ...] = ()  # (B, T, C): block 0's attention input (its norm's output)
    cached: int = 0  # positions the cache held before this pass


@dataclass(frozen=True)
class CacheTrace:
    """Prefill then one decode step of a real model through one KVCache; `flow` records
    which tensor was computed from which in both passes ("prefill." and "decode." names)."""

    prefill: CacheStep
    decode: CacheStep
    n_layers: int  # L: one LayerCache per block
    bytes_per_number: int  # element size of the stored tensors
    memory_bytes: int  # cache.memory_bytes() after the decode step
    flow: Dataflow | None = field(default=None, compare=False, repr=False)


def _stored(cache: object) -> tuple[int, ...]:
    shapes = {tuple(lc.keys[:, :, :lc.length].shape) for lc in cache.layers}
    shapes |= {tuple(lc.values[:, :, :lc.length].shape) for lc in cache.layers}
    if len(shapes) != 1:  # every layer stores the same positions
        raise RuntimeError(f"the layers of the cache hold different shapes: {shapes}")
    return shapes.pop()


def trace_cache(model: nn.Module, prompt: Tensor) -> CacheTrace:
    """Run `prompt` (B, T0) through a new cache, then the greedy next token (B, 1)."""
    if not (isinstance(model, nn.Module) and hasattr(model, "new_cache")):
        raise TypeError(f"kv_cache needs a tfbook decoder (a GPT with new_cache), got "
                        f"{type(model).__name__}")
    if not (isinstance(prompt, Tensor) and prompt.dim() == 2 and not prompt.is_floating_point()
            and prompt.size(1) >= 1):
        raise ValueError("prompt must be a (B, T0) tensor of token ids with T0 >= 1, got "
                         f"{tuple(prompt.shape) if isinstance(prompt, Tensor) else prompt!r:.60}")
    cache = model.new_cache(prompt.size(1) + 1)
    rec = Recorder(model)
    rec.prefix = PREFILL
    at, logits, x = _run_hooked(model, prompt, cache, rec)
    pre = CacheStep(tuple(prompt.shape), at, _stored(cache), logits, x, 0)
    with torch.no_grad():  # the greedy next token, from a pass without the cache
        next_id = model(prompt).logits[:, -1:].argmax(-1)  # (B, 1)
    rec.prefix = DECODE  # what the cache holds now, named before the step reads it
    layer = cache.layers[0]
    rec.name(layer.keys, "cached_keys")
    rec.name(layer.values, "cached_values")
    held = layer.length
    at, logits, x = _run_hooked(model, next_id, cache, rec)
    dec = CacheStep(tuple(next_id.shape), at, _stored(cache), logits, x, held)
    return CacheTrace(pre, dec, len(cache.layers), cache.layers[0].keys.element_size(),
                      cache.memory_bytes(), rec.flow)


def _causal_cells(rows: int, cols: int) -> list[list[float]]:
    """Which keys each query may see: query i (of the last `rows`) sees keys 0 .. cols-rows+i."""
    return [[1.0 if j <= cols - rows + i else 0.0 for j in range(cols)] for i in range(rows)]


def _strip(c: Canvas, x: float, y: float, held: int, total: int, cell: float,
           label: str) -> None:
    """One row of stored positions: the `held` ones from earlier passes, then the new ones."""
    c.text(x - 6, y + cell / 2 + 4.5, label, SMALL, anchor="end")
    for j in range(total):
        new = j >= held
        c.box(x + j * cell, y, cell, cell, "ffn" if new else "stream", radius=1)


def _step_canvas(step: CacheStep, title: str, flow: Dataflow | None, prefix: str) -> Canvas:
    """One pass through block 0's attention: the ids, the attention's input X, the queries
    and the new keys and values side by side (both computed from X), the cache after the pass
    (held positions and new ones told apart), and the weights of the queries over its keys."""
    at = step.attention
    name = lambda part: f"{prefix}{ATTN}{part}"  # noqa: E731
    first = step.cached == 0
    c = Canvas(title)
    y = heading(c, title, 0, 0, anchor="middle")
    ids = Node("token ids", step.ids, ("B", "T"), key="ids", flow=f"{prefix}idx",
               note="the whole prompt" if first else "only the new token")
    xs = Node("attention input X", step.x, ("B", "T", "C"), "stream", "x", flow=name(":x"),
              note="block 0, after its norm")
    rects = column(c, [ids, xs], 0, y, same_width=True)
    top = rects[-1]
    T_new = at.k[2]
    kv = "new key, value" if T_new == 1 else "new keys, values"
    q = Node("queries Q" if at.q[2] > 1 else "query Q", at.q, QUERY, "attn", "q",
             flow=name(".q"), stack=True)
    k = Node(kv, at.k, NEW_KV, "ffn", "k", flow=name(".k"), stack=True)
    y = top.bottom + GAP + 6
    qr, kr = row(c, [q, k], 0, y, gap=10)
    for r, edge in ((qr, [(xs.flow, q.flow)]), (kr, [(xs.flow, name(".k")),
                                                     (xs.flow, name(".v"))])):
        c.line([(0, top.bottom), (0, top.bottom + 12), (r.cx, top.bottom + 12), (r.cx, r.y)],
               edge=edge)
    # the cache after the pass: one cell per stored position, held ones and this pass's
    S = step.stored[2]
    cell = max(12.0, min(18.0, 150.0 / S))
    y = kr.bottom + 30
    x0 = kr.cx - S * cell / 2
    c.arrow(kr.cx, kr.bottom, kr.cx, y - 4,
            edge=[(name(".k"), name(".keys")), (name(".v"), name(".values"))])
    held = step.cached
    what = f"cache: {held} held + {S - held} new" if held else f"cache: {S} new"
    note(c, kr.cx, y + 2, what, anchor="middle")
    y += 10
    keys_y = y + cell / 2  # the middle of the keys' row
    _strip(c, x0, y, held, S, cell, "K")
    _strip(c, x0, y + cell + 4, held, S, cell, "V")
    y += 2 * cell + 4
    c.text(kr.cx, y + 16, shape_label(STORED, step.stored).replace(" = ", " =\n").split("\n"),
           SMALL, mono=True, key="stored", shape=step.stored)
    y += SMALL * 1.25
    c.nodes += [name(".values")]
    # the weights: every query of this pass against every stored key
    T, S_w = at.weights[-2], at.weights[-1]
    w_cell = max(12.0, min(18.0, 150.0 / max(T, S_w)))
    y += 40
    c.text(0, y, "weights: queries × keys", SMALL + 1, bold=True)
    y += 8
    grid_x = -S_w * w_cell / 2
    c.grid(grid_x, y, _causal_cells(T, S_w), w_cell)
    if held:  # the keys of earlier passes and this pass's, told apart under the grid
        for j in range(S_w):
            c.box(grid_x + j * w_cell + 2, y + T * w_cell + 3, w_cell - 4, 4,
                  "ffn" if j >= held else "stream", radius=0)
    mid = y + T * w_cell / 2
    c.line([(qr.cx, qr.bottom), (qr.cx, mid), (grid_x, mid)], edge=(q.flow, name(".weights")))
    x_keys = max(x0 + S * cell, grid_x + S_w * w_cell) + 10
    c.line([(x0 + S * cell, keys_y), (x_keys, keys_y), (x_keys, mid),
            (grid_x + S_w * w_cell, mid)], edge=(name(".keys"), name(".weights")))
    y += T * w_cell + 24
    note(c, 0, y, shape_label(WEIGHTS, at.weights), "weights", at.weights, mono=True,
         anchor="middle")
    note(c, 0, y + 18, f"{T} quer{'y' if T == 1 else 'ies'} × {S_w} keys", "rows", (T, S_w),
         anchor="middle")
    if flow is not None:
        c.check_wiring(flow)
    return c


def _heads_canvas(at: AttentionShapes) -> Canvas:
    H, H_kv = at.n_heads, at.n_kv_heads
    title = f"{H} query heads share {H_kv} key/value heads" if H_kv != H else \
        f"{H} query heads, each with its own keys and values"
    c = Canvas(title)
    y = heading(c, title, 0, 0, "middle")
    note(c, 0, y + 6, f"H = {H} query heads", "n_heads", (H,), anchor="middle")
    y += 16
    w, gap = 30.0, 6.0
    total = H * w + (H - 1) * gap
    q_rects = []
    for i in range(H):
        x = -total / 2 + i * (w + gap)
        c.swatch(x, y, w, 30, i // (H // H_kv))
        c.text(x + w / 2, y + 20, f"q{i}", SMALL)
        q_rects.append(Rect(x, y, w, 30))
    y += 64
    n_rep = H // H_kv
    for g in range(H_kv):
        group = q_rects[g * n_rep:(g + 1) * n_rep]
        x0, x1 = group[0].x, group[-1].right
        c.swatch(x0, y, x1 - x0, 30, g)
        c.text((x0 + x1) / 2, y + 20, f"K, V {g}" if x1 - x0 >= 50 else f"{g}", SMALL)
        for r in group:
            c.line([(r.cx, r.bottom), (r.cx, y)], arrow=False, dashed=True)
    note(c, 0, y + 48, f"H_kv = {H_kv} stored heads, each read by {n_rep} quer"
         f"{'y' if n_rep == 1 else 'ies'}", "n_kv_heads", (H_kv, n_rep), anchor="middle")
    return c


def _memory_canvas(ct: CacheTrace) -> Canvas:
    B, H_kv, S, D = ct.decode.stored
    L, nbytes = ct.n_layers, ct.bytes_per_number
    c = Canvas("What the cache holds")
    y = heading(c, "What the cache holds", 0, 0, "middle")
    layer = Node("one layer", ct.decode.stored, STORED, "stream", "layer",
                 note="K and V: two such tensors")
    r = draw(c, layer, 0, y)
    c.text(0, r.bottom + 22, f"× {L} layers", 15, bold=True, key="n_layers", shape=(L,))
    y = r.bottom + 50
    formula = f"2 × {L} × {B} × {H_kv} × {S} × {D} × {nbytes} bytes"
    # the 2 is K and V (the note in the box above): a shorter line fits a phone's column
    note(c, 0, y, "2 × L × B × H_kv × S × D × bytes a number", anchor="middle")
    note(c, 0, y + 18, formula, "formula", (2, L, B, H_kv, S, D, nbytes), mono=True,
         anchor="middle")
    note(c, 0, y + 38, f"= {ct.memory_bytes:,} bytes held", "bytes", (ct.memory_bytes,),
         anchor="middle")
    return c


def kv_cache(model: nn.Module, prompt: Tensor) -> Diagram:
    """Prefill vs one decode step, grouped key/value heads, and the cache's size, from a
    real run of `model` on `prompt` (B, T0) through one KVCache."""
    ct = trace_cache(model, prompt)
    expected = 2 * ct.n_layers * ct.bytes_per_number
    for n in ct.decode.stored:
        expected *= n
    if expected != ct.memory_bytes:
        raise RuntimeError(f"the cache holds {ct.memory_bytes} bytes, its shape says {expected}")
    panels = [_step_canvas(ct.prefill, "Prefill: the prompt at once", ct.flow, PREFILL),
              _step_canvas(ct.decode, "Decode: one new token", ct.flow, DECODE),
              hstack("heads and memory", [_heads_canvas(ct.decode.attention)], 0),
              _memory_canvas(ct)]
    prefixes = ["prefill.", "decode.", "heads.", "memory."]
    return Diagram(hstack("The key/value cache", panels, 28, prefixes), panels)


__all__ = ["AttentionShapes", "CacheStep", "CacheTrace", "kv_cache", "trace_cache"]
