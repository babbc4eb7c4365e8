"""Figures of the sharding chapter, each drawn from the objects and records of tfbook.parallel.

    from tfbook.diagrams.sharding import (bucket_timeline, sharding_memory, tensor_split,
                                          pipeline_schedules, ring_zigzag)
    bucket_timeline(ddp.timeline, ddp.backward_seconds)    # DDPOverlap's buckets in time
    sharding_memory(model_config, world_size=4)            # weights, gradients, Adam per rank
    tensor_split(block, world_size=2)                      # the real shards and f, g
    pipeline_schedules(n_stages=4, n_micro=6)              # GPipe beside 1F1B, the bubble
    ring_zigzag(world_size=4)                              # which chunk pairs, at which step

Nothing on them is typed: the bucket bars are a `DDPOverlap.timeline` (or the dicts a stored
JSON holds), the memory bars `tfbook.parallel.costs`' (or measured bytes), the shard shapes
those of `tensor_parallel_block`'s modules (whose partial outputs, summed, are checked to equal
the unsplit sub-layer's, and whose recorded dataflow the arrows are held against), the
pipeline slots `schedule_order`'s operations placed by their dependencies (and checked against
`simulate` and `bubble_fraction`), and the ring's chunk pairs `rank_chunks` and `tile_status`'s
(checked against the `RingWork` record of `simulate_ring_attention`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from tfbook.config import is_int, is_number
from tfbook.diagrams._shared import heading
from tfbook.diagrams.dataflow import Recorder
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import Node, draw, hstack, wrap_words
from tfbook.diagrams.svg import SMALL, Canvas, text_width

PANEL = 330.0  # the widest a panel may be: a phone's column (358 px) holds each one
PAIR = 300.0  # a panel drawn beside another: two of them fit the book's column (672 px)
MOST_BUCKETS = 16  # bucket_timeline draws at most this many buckets a run


def _lines(c: Canvas, x: float, y: float, text: str, width: float = PANEL,
           anchor: str = "start", key: str = "", shape: tuple[int, ...] | None = None) -> float:
    """`text` wrapped to `width`, its first baseline at y; returns the baseline after it."""
    lines = wrap_words(text, width, SMALL)
    c.text(x, y, lines if len(lines) > 1 else lines[0], SMALL, anchor=anchor, key=key,
           shape=shape)
    return y + SMALL * 1.25 * len(lines) + 4


def _bytes_text(n: float) -> str:
    """Bytes in binary units, three significant digits: 1.5 MiB, 270 KiB, 12 B.

    >>> _bytes_text(1536 * 1024), _bytes_text(276480), _bytes_text(12), _bytes_text(3 * 2**30)
    ('1.5 MiB', '270 KiB', '12 B', '3 GiB')
    >>> _bytes_text(1040000)
    '1016 KiB'
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1)):
        if n >= size or unit == "B":
            v = n / size
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"
    raise AssertionError("unreachable")


def _nice_step(span: float, most: int = 5) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving at most `most` steps over span.

    >>> _nice_step(37.0), _nice_step(0.9), _nice_step(100.0)
    (10.0, 0.2, 20.0)
    """
    e = math.floor(math.log10(span / most))
    for m in (1, 2, 5, 10):
        step = m * 10.0**e
        if span / step <= most:
            return float(f"{step:.12g}")
    raise AssertionError("unreachable")


def _time_axis(c: Canvas, x0: float, y: float, width: float, t_max: float, unit: str,
               scale: float) -> float:
    """A time axis under a plot from x0 (time 0) to x0 + width (t_max), ticks in `unit`
    (the numbers times `scale`); returns the baseline under its words."""
    c.arrow(x0, y, x0 + width + 8, y, edge="time, not data")
    step = _nice_step(t_max * scale)
    k = 0
    while k * step <= t_max * scale * (1 + 1e-9):
        x = x0 + width * (k * step) / (t_max * scale)
        c.line([(x, y), (x, y + 4)], arrow=False, width=1.0)
        c.text(x, y + 17, f"{k * step:g}", SMALL, key=f"tick.{k}")
        k += 1
    c.text(x0 + width / 2, y + 34, f"time ({unit}) →", SMALL)
    return y + 52


# --- 1. DDP buckets on the backward pass's timeline -----------------------------------------

FIELDS = ("bucket", "numel", "nbytes", "started", "waited", "during_backward")


def _timings(timeline: object, what: str) -> list[dict]:
    """A DDPOverlap.timeline (BucketTiming objects) or its stored form (dicts with the same
    fields) as a list of dicts, checked: buckets 0, 1, ... in order, sizes > 0, launched at
    a time >= 0 and waited for at or after it."""
    if isinstance(timeline, str | bytes | Mapping) or not isinstance(timeline, Sequence) \
            or not timeline:
        raise TypeError(f"{what} must be a non-empty list of tfbook.parallel.ddp.BucketTiming "
                        f"(a DDPOverlap's .timeline) or of dicts with their fields {FIELDS}, "
                        f"got {timeline!r:.80}")
    if len(timeline) > MOST_BUCKETS:
        raise ValueError(f"{what}: bucket_timeline draws at most {MOST_BUCKETS} buckets, got "
                         f"{len(timeline)} (use a larger bucket_size_mb)")
    out = []
    for i, entry in enumerate(timeline):
        if dataclasses.is_dataclass(entry) and not isinstance(entry, type):
            entry = dataclasses.asdict(entry)
        if not isinstance(entry, Mapping) or set(FIELDS) - set(entry):
            raise TypeError(f"{what}[{i}] must be a BucketTiming or a dict with the fields "
                            f"{FIELDS}, got {entry!r:.80}")
        e = {k: entry[k] for k in FIELDS}
        if not (is_int(e["bucket"]) and e["bucket"] == i):
            raise ValueError(f"{what}[{i}] is bucket {e['bucket']!r}: the buckets must be "
                             "0, 1, 2, ... in order (as DDPOverlap records them)")
        for key in ("numel", "nbytes"):
            if not is_int(e[key]) or e[key] < 1:
                raise ValueError(f"{what}[{i}]: {key} must be an int >= 1, got {e[key]!r}")
        for key in ("started", "waited"):
            if not is_number(e[key]) or not 0 <= e[key] < math.inf:
                raise ValueError(f"{what}[{i}]: {key} must be a finite number of seconds "
                                 f">= 0, got {e[key]!r}")
        if e["waited"] < e["started"]:
            raise ValueError(f"{what}[{i}]: waited ({e['waited']}) before it started "
                             f"({e['started']})")
        if not isinstance(e["during_backward"], bool):
            raise TypeError(f"{what}[{i}]: during_backward must be True or False, got "
                            f"{e['during_backward']!r}")
        out.append(e)
    return out


def _seconds(value: object, what: str) -> float:
    if not is_number(value) or not 0 < value < math.inf:
        raise ValueError(f"{what} must be a finite number of seconds > 0 (a DDPOverlap's "
                         f".backward_seconds), got {value!r}")
    return float(value)


def _bucket_canvas(title: str, rows: list[dict], backward: float, t_max: float,
                   key: str) -> Canvas:
    c = Canvas(title)
    y = heading(c, title, 0, 0)
    sizes = [f"{e['bucket']}: {_bytes_text(e['nbytes'])}" for e in rows]
    label_w = max(text_width(s, SMALL) for s in [*sizes, "backward"]) + 10
    width = PAIR - label_w - 12
    to_x = lambda t: label_w + width * t / t_max  # noqa: E731
    row_h, bar_h = 22.0, 14.0
    c.text(label_w - 8, y + 13, "backward", SMALL, anchor="end")
    c.box(to_x(0), y + 2, max(to_x(backward) - to_x(0), 2.0), bar_h, "ffn", radius=2)
    y += row_h + 4
    c.text(0, y + 8, "bucket: size", SMALL, bold=True, anchor="start")
    y += 16
    top = y
    for e, size in zip(rows, sizes, strict=True):
        c.text(label_w - 8, y + 13, size, SMALL, anchor="end", key=f"{key}size.{e['bucket']}",
               shape=(e["nbytes"],))
        x0, x1 = to_x(e["started"]), to_x(e["waited"])
        c.box(x0, y + 2, max(x1 - x0, 2.0), bar_h, "attn" if e["during_backward"] else "head",
              radius=2)
        y += row_h
    # the end of the backward pass: finish_gradient_synchronization() is called there
    xb = to_x(backward)
    c.line([(xb, top - 44), (xb, y + 2)], arrow=False, dashed=True, width=1.0)
    y = _time_axis(c, label_w, y + 8, width, t_max, "ms", 1e3)
    during = sum(e["during_backward"] for e in rows)
    last = max(e["waited"] for e in rows)
    y = _lines(c, 0, y, f"{during} of {len(rows)} all-reduces launched during the backward "
                        f"pass (blue), {len(rows) - during} after it (red)", PAIR,
               key=f"{key}during", shape=(during, len(rows)))
    _lines(c, 0, y, f"backward {backward * 1e3:.3g} ms (dashed: its end); the last result "
                    f"{(last - backward) * 1e3:.3g} ms after it", PAIR, key=f"{key}exposed")
    return c


def bucket_timeline(timeline: Sequence[object], backward_seconds: float,
                    off_timeline: Sequence[object] | None = None,
                    off_backward_seconds: float | None = None) -> Diagram:
    """The gradient buckets of one DDPOverlap step against its backward pass: for each bucket
    (labelled with its size) a bar from the launch of its all-reduce to the moment
    finish_gradient_synchronization() had its result, in milliseconds after the backward
    pass began; blue if a gradient hook launched it during the backward pass, red if it was
    launched only at finish. The dashed line is the end of the backward pass.

    `timeline` is a `DDPOverlap.timeline` (a list of `BucketTiming`) or the dicts a stored
    JSON holds (`dataclasses.asdict` of each), `backward_seconds` the wrapper's
    `.backward_seconds`. Given `off_timeline` and `off_backward_seconds` too (a run with
    overlap=False), the two are drawn side by side on one time scale. The Diagram carries
    `runs` (the checked rows of each run drawn) and `t_max` (the scale's end, in seconds).
    """
    runs = [(_timings(timeline, "timeline"), _seconds(backward_seconds, "backward_seconds"))]
    if (off_timeline is None) != (off_backward_seconds is None):
        raise ValueError("give off_timeline and off_backward_seconds together (the run "
                         "without overlap), or neither")
    if off_timeline is not None:
        runs.append((_timings(off_timeline, "off_timeline"),
                     _seconds(off_backward_seconds, "off_backward_seconds")))
    t_max = max(max(max(e["waited"] for e in rows), back) for rows, back in runs)
    panels = []
    for i, (rows, back) in enumerate(runs):
        overlapped = any(e["during_backward"] for e in rows)
        title = "overlap on" if overlapped else "overlap off"
        panels.append(_bucket_canvas(f"DDP buckets, {title}", rows, back, t_max,
                                     "" if len(runs) == 1 else f"{i}."))
    title = "Gradient buckets on the backward pass's timeline"
    d = Diagram(hstack(title, panels, 28), panels) if len(panels) > 1 else Diagram(panels[0])
    d.runs, d.t_max = runs, t_max
    return d


# --- 2. memory per rank: weights, gradients, optimizer state --------------------------------

PARTS = ("weights", "gathered", "gradients", "optimizer", "activations")
PART_KINDS = {"weights": "embed", "gathered": "plain", "gradients": "ffn", "optimizer": "attn",
              "activations": "norm"}
PART_NAMES = {"weights": "W: weights", "gathered": "units gathered (FSDP)",
              "gradients": "G: gradients", "optimizer": "O: optimizer state",
              "activations": "A: activations"}
DEFAULT_STRATEGIES = ("one process", "DDP", "ZeRO-1", "FSDP")


def _workload(model: object, world_size: int | None) -> object:
    """A costs Workload: as given, or for a GPTConfig (or a GPT's) at `world_size` ranks, one
    row a rank and 2p positions (the batch matters only to the activations)."""
    from tfbook.models.gpt import GPTConfig
    from tfbook.parallel.costs import Workload

    if isinstance(model, Workload):
        if world_size is not None and world_size != model.world_size:
            raise ValueError(f"world_size ({world_size!r}) differs from the workload's "
                             f"({model.world_size}): give one of them")
        return model
    config = getattr(model, "config", None) if isinstance(model, nn.Module) else model
    if not isinstance(config, GPTConfig):
        raise TypeError("sharding_memory needs a tfbook.parallel.costs.Workload, a GPTConfig or "
                        f"a tfbook GPT (the costs count the model's tensors, not only its "
                        f"parameters), got {type(model).__name__}")
    if not is_int(world_size) or not 2 <= world_size <= 1024:
        raise ValueError(f"world_size must be an int from 2 to 1024 (ranks), got {world_size!r}")
    return Workload(config, batch_size=world_size, seq_len=min(2 * world_size, config.max_len),
                    world_size=world_size)


def memory_parts(workload: object, strategy: str, activations: bool = False
                 ) -> dict[str, float] | str:
    """Bytes of the largest rank under `strategy` (one of tfbook.parallel.costs.STRATEGIES)
    from `tfbook.parallel.costs`: {"weights", "gathered", "gradients", "optimizer"} (and
    "activations" if asked); the reason as a str when the workload cannot be split so."""
    from tfbook.parallel.costs import FUNCTIONS, STRATEGIES

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    try:
        rank = FUNCTIONS[strategy](workload).largest
    except ValueError as error:
        return str(error)
    parts = {"weights": rank.weights, "gathered": rank.gathered, "gradients": rank.gradients,
             "optimizer": rank.optimizer_state}
    if activations:
        parts["activations"] = rank.activations
    return {k: float(v) for k, v in parts.items()}


def _check_parts(value: object, where: str, activations: bool) -> dict[str, float]:
    need = {"weights", "gradients", "optimizer"} | ({"activations"} if activations else set())
    allowed = need | {"gathered"}
    if not isinstance(value, Mapping) or not need <= set(value) <= allowed or not all(
            is_number(v) and 0 <= v < math.inf for v in value.values()):
        raise ValueError(f"{where} must be a dict of bytes with the keys {sorted(need)} (and "
                         f"optionally 'gathered'), finite numbers >= 0, got {value!r:.80}")
    return {k: float(value.get(k, 0)) for k in PARTS if k in allowed}


def sharding_memory(model: object, world_size: int | None = None,
                    strategies: Sequence[str] = DEFAULT_STRATEGIES,
                    measured: Mapping[str, Mapping[str, float]] | None = None,
                    activations: bool = False) -> Diagram:
    """The memory of one rank (the largest) under each of `strategies` (names of
    tfbook.parallel.costs.STRATEGIES: "one process", "DDP", "ZeRO-1", "FSDP", "tensor",
    "pipeline", "ring"): one stacked bar each, weights, FSDP's units gathered during the step
    (dashed), gradients and optimizer state (and activations, if `activations`), all bars to
    one scale, the total above each and its parts under it.

    `model` is a `tfbook.parallel.costs.Workload` (its dtype, optimizer and world size), or a
    GPTConfig or tfbook GPT drawn at `world_size` ranks in float32 with AdamW. The bytes are
    `memory_parts`' (tfbook.parallel.costs); `measured` ({strategy: {"weights", "gradients",
    "optimizer"[, "gathered", "activations"]: bytes}}) replaces them for the strategies it
    names, marked "measured". A strategy the workload cannot use is named with the reason.
    The Diagram carries `parts` ({strategy: {part: bytes} or the reason}), `measured` (the
    strategies drawn from measurements) and `workload`.
    """
    from tfbook.parallel.costs import STRATEGIES, format_bytes, n_parameters

    w = _workload(model, world_size)
    if isinstance(strategies, str) or not isinstance(strategies, Sequence) or not strategies \
            or len(set(strategies)) != len(strategies) \
            or not all(s in STRATEGIES for s in strategies):
        raise ValueError(f"strategies must be a list of distinct names from {STRATEGIES}, got "
                         f"{strategies!r:.80}")
    if not isinstance(activations, bool):
        raise TypeError(f"activations must be True or False, got {activations!r}")
    measured = {} if measured is None else measured
    if not isinstance(measured, Mapping) or not set(measured) <= set(strategies):
        raise ValueError(f"measured must be a dict {{strategy: parts}} for strategies drawn "
                         f"({list(strategies)}), got {measured!r:.80}")
    parts = {s: _check_parts(measured[s], f"measured[{s!r}]", activations) if s in measured
             else memory_parts(w, s, activations) for s in strategies}
    drawn = {s: v for s, v in parts.items() if isinstance(v, dict)}
    most = max([sum(v.values()) for v in drawn.values()] or [0.0])
    if most <= 0:
        raise ValueError("nothing to draw: no strategy has bytes to draw")
    p = w.world_size
    c = Canvas(f"Memory per rank at {p} ranks")
    y = heading(c, f"Training state per rank, p = {p}", 0, 0)
    n = n_parameters(w.config)
    y = _lines(c, 0, y + 2, f"N = {n:,} parameters, {w.dtype}; the largest rank; one scale "
                            "for every bar", key="n", shape=(n,))
    y += 6
    for s, v in parts.items():
        if isinstance(v, str):
            y = _lines(c, 0, y, f"{s}: not possible here ({v})", key=f"total.{s}") + 6
            continue
        total = sum(v.values())
        c.text(0, y, f"{s}: {format_bytes(total)}" + (" (measured)" if s in measured else ""),
               SMALL, bold=True, anchor="start", key=f"total.{s}", shape=(round(total),))
        x = 0.0
        for part, value in v.items():
            width = PANEL * value / most
            if width > 0:
                c.box(x, y + 6, max(width, 1.0), 16, PART_KINDS[part], radius=1,
                      dashed=part == "gathered")
            x += width
        words = " · ".join(f"{part[0].upper()} {format_bytes(value)}"
                           for part, value in v.items() if part != "gathered")
        if v.get("gathered"):
            words += f" + {format_bytes(v['gathered'])} gathered"
        y = _lines(c, 0, y + 40, words, key=f"parts.{s}") + 10
    y += 4
    x = 0.0
    shown = [k for k in PARTS if any(v.get(k) for v in drawn.values())]
    for part in shown:  # the legend: a swatch of each part's colour and its name
        name = PART_NAMES[part]
        if x > 0 and x + 16 + text_width(name, SMALL) > PANEL:
            x, y = 0.0, y + 20
        c.box(x, y - 10, 12, 12, PART_KINDS[part], radius=1, dashed=part == "gathered")
        c.text(x + 16, y, name, SMALL, anchor="start")
        x += 16 + text_width(name, SMALL) + 14
    y += 22
    if len(measured) < len(strategies):
        _lines(c, 0, y, f"computed (tfbook.parallel.costs): {w.optimizer_states} numbers of "
                        "optimizer state a weight and its step counters"
                        + ("" if activations else "; activations not counted"))
    d = Diagram(c)
    d.parts, d.measured, d.workload = parts, sorted(measured), w
    return d


# --- 3. tensor parallelism: the real shards of one block, and the collectives f and g -------

# Megatron-LM's two collectives (tfbook.parallel.tensor): what each does in each pass
COLLECTIVES = {"f": {"forward": "identity", "backward": "all-reduce"},
               "g": {"forward": "all-reduce", "backward": "identity"}}


def _block_of(block: object) -> nn.Module:
    """A SelfAttentionBlock as given, or built (seed 0, evaluation mode) from a BlockConfig
    or a GPTConfig's block settings."""
    from tfbook.blocks import BlockConfig, SelfAttentionBlock
    from tfbook.models.gpt import GPTConfig

    if isinstance(block, GPTConfig):
        block = block.block_config()
    if isinstance(block, BlockConfig):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            block = SelfAttentionBlock(block).eval()
    if not isinstance(block, SelfAttentionBlock):
        raise TypeError("tensor_split needs a tfbook.blocks.SelfAttentionBlock, a BlockConfig "
                        f"or a GPTConfig, got {type(block).__name__}")
    return block


def _local(sublayer: nn.Module) -> nn.Module:
    """A copy of a shard's sub-layer whose row-split output layer computes only this rank's
    partial product x_r W_r^T (what it hands to g), without the all-reduce and the bias."""
    from tfbook.parallel.tensor import RowParallelLinear

    out = copy.deepcopy(sublayer)
    for name, child in list(out.named_children()):
        if isinstance(child, RowParallelLinear):
            partial = nn.Linear(child.weight.size(1), child.weight.size(0), bias=False,
                                dtype=child.weight.dtype)
            with torch.no_grad():
                partial.weight.copy_(child.weight)
            setattr(out, name, partial)
    return out


def _sum_mark(c: Canvas, x: float, y: float, name: str, texts: list[str], key: str) -> None:
    """A collective's mark: its letter in a circle at (x, y), what it does beside it."""
    c.adder(x, y, name, 11)
    c.text(x + 18, y - 2, texts, SMALL, anchor="start", key=key)


def _tensor_canvas(kind: str, title: str, columns: list[list[Node]], x_shape: tuple,
                   out_shape: tuple, bias: bool, note: str) -> Canvas:
    """x -> f -> one column of nodes per rank -> g (the sum) -> y, for the sub-layer `kind`."""
    c = Canvas(title)
    y = heading(c, title, 0, 0)
    width = max(n.width for col in columns for n in col)
    p = len(columns)
    span = p * width + (p - 1) * 10
    xs = [width / 2 + r * (width + 10) for r in range(p)]
    mid = span / 2
    top = draw(c, Node("x", x_shape, ("B", "T", "C"), "stream", f"{kind}.x",
                       note="the same on every rank", flow="x", stack=True), mid, y + 2)
    y_f = top.bottom + 22
    c.line([(mid, top.bottom), (mid, y_f - 11)], arrow=False)
    f = COLLECTIVES["f"]
    _sum_mark(c, mid, y_f, "f", [f"forward: {f['forward']}", f"backward: {f['backward']}"],
              f"{kind}.f")
    y = y_f + 34
    ends = []
    for xc, col in zip(xs, columns, strict=True):
        c.line([(mid, y_f + 11), (mid, y_f + 18), (xc, y_f + 18), (xc, y)],
               edge=("x", col[0].flow))
        rects = []
        for i, node in enumerate(col):
            if rects:
                c.arrow(xc, rects[-1].bottom, xc, rects[-1].bottom + 18,
                        edge=(col[i - 1].flow, node.flow))
            rects.append(draw(c, node, xc, rects[-1].bottom + 18 if rects else y, width))
        ends.append((rects[-1], col[-1].flow))
    y_g = max(r.bottom for r, _ in ends) + 30
    for rect, flow in ends:
        c.line([(rect.cx, rect.bottom), (rect.cx, y_g - 18), (mid, y_g - 18), (mid, y_g - 11)],
               edge=(flow, f"{kind}.sum"))
    g = COLLECTIVES["g"]
    _sum_mark(c, mid, y_g, "g", [f"forward: {g['forward']}", f"backward: {g['backward']}"],
              f"{kind}.g")
    y = y_g + 11 + 20
    c.arrow(mid, y_g + 11, mid, y, edge=(f"{kind}.sum", f"{kind}.out"))
    out = draw(c, Node("y = Σ partials" + (" + b" if bias else ""), out_shape,
                       ("B", "T", "C"), "stream", f"{kind}.y", flow=f"{kind}.out",
                       stack=True), mid, y)
    _lines(c, 0, out.bottom + 20, note, max(span, 240.0))
    return c


def tensor_split(block: object, world_size: int = 2) -> Diagram:
    """Megatron-style tensor parallelism of one block over `world_size` = 2 ranks: the
    attention split by heads, the MLP column-then-row, each sub-layer between the two
    collectives f (forward identity, backward all-reduce) and g (forward all-reduce, backward
    identity). Every shape is read from the real shards, `tensor_parallel_block(block, r, p)`:
    W_Q, W_K, W_V (and W_1, W_gate) keep rank r's rows, W_O and W_2 its columns.

    `block` is a tfbook SelfAttentionBlock (multi-head or grouped-query attention, an MLP or
    SwiGLU, no dropout), or a BlockConfig / GPTConfig to build one from (seed 0). Each
    shard's sub-layers run once in this process on a (1, 4, C) input with their partial
    products recorded (`tfbook.diagrams.dataflow`): the arrows are that run's dependencies,
    and the partials summed (what g computes) are checked to equal the unsplit sub-layer.

    The Diagram carries `shards` ({rank: {parameter name: shape}}), `marks` (the collectives
    drawn, (sub-layer, "f" or "g")), `collectives` ({"forward", "backward"}: all-reduces per
    block, counted from the marks) and `difference` (largest |Σ partials - unsplit|).
    """
    from tfbook.parallel.tensor import tensor_parallel_block

    block = _block_of(block)
    if not is_int(world_size) or world_size != 2:
        raise ValueError(f"world_size must be 2 (two ranks drawn side by side fit a phone; "
                         f"more ranks repeat the same pattern), got {world_size!r}")
    shards = [tensor_parallel_block(block, r, world_size) for r in range(world_size)]
    attn, ff = block.attn, block.ff
    C = attn.q_proj.in_features
    dtype = attn.q_proj.weight.dtype
    with torch.random.fork_rng():
        torch.manual_seed(0)
        x = torch.randn(1, 4, C, dtype=dtype)
    # each rank's sub-layers, its row-split layers stopping at the partial product
    local = nn.ModuleDict({f"{kind}{r}": _local(getattr(shards[r], sub).inner)
                           for r in range(world_size)
                           for kind, sub in (("attn", "attn"), ("mlp", "ff"))})
    seen: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # layer -> (input, output)

    def keep(name: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            seen[name] = (tuple(args[0].shape), tuple(output.shape))
        return hook

    handles = [local[f"{kind}{r}"].get_submodule(layer).register_forward_hook(
        keep(f"{kind}{r}")) for r in range(world_size)
        for kind, layer in (("attn", "out_proj"), ("mlp", "fc_out"))]
    with torch.no_grad(), Recorder(local) as rec:
        rec.name(x, "x")
        sums = {}
        for kind, bias in (("attn", attn.out_proj.bias), ("mlp", ff.fc_out.bias)):
            partials = []
            for r in range(world_size):
                out = local[f"{kind}{r}"](x, causal=True) if kind == "attn" \
                    else local[f"{kind}{r}"](x)
                partials.append(out[0] if isinstance(out, tuple) else out)
            total = torch.stack(partials).sum(0)  # what g's all-reduce adds up
            rec.name(total, f"{kind}.sum")
            sums[kind] = total if bias is None else total + bias
            rec.name(sums[kind], f"{kind}.out")
        whole = {"attn": attn(x, causal=True)[0], "mlp": ff(x)}
    for handle in handles:
        handle.remove()
    difference = max(float((sums[k] - whole[k]).abs().max()) for k in sums)
    scale = max(float(whole[k].abs().max()) for k in whole)
    if not difference <= 1e-5 * max(scale, 1.0):
        raise RuntimeError(f"the shards' partial outputs sum to the unsplit sub-layers only "
                           f"within {difference:.3g}")
    h, h_kv = attn.n_heads // world_size, attn.n_kv_heads // world_size
    F = ff.fc_in.out_features // world_size
    wrap = 120.0
    shapes = {r: {name: tuple(t.shape) for name, t in shard.named_parameters()}
              for r, shard in enumerate(shards)}

    def w(r: int, name: str) -> str:
        return str(shapes[r][name])

    attn_cols, mlp_cols = [], []
    for r in range(world_size):
        heads = f"head {r * h}" if h == 1 else f"heads {r * h}–{(r + 1) * h - 1}"
        kv = "" if h_kv == h else f" (K, V: {h_kv})"
        attn_cols.append([
            Node(f"rank {r}", seen[f"attn{r}"][0], ("B", "T", "HD/p"), "attn", f"attn.heads{r}",
                 note=f"{heads}{kv}\nW_Q {w(r, 'attn.inner.q_proj.weight')}\n"
                      f"W_K {w(r, 'attn.inner.k_proj.weight')}\n"
                      f"W_V {w(r, 'attn.inner.v_proj.weight')}",
                 flow=f"attn{r}.out_proj:input", stack=True, wrap=wrap),
            Node("partial", seen[f"attn{r}"][1], ("B", "T", "C"), "attn", f"attn.partial{r}",
                 note=f"W_O {w(r, 'attn.inner.out_proj.weight')}", flow=f"attn{r}.out_proj",
                 stack=True, wrap=wrap)])
        gate = "" if "ff.inner.fc_gate.weight" not in shapes[r] else \
            f"\nW_gate {w(r, 'ff.inner.fc_gate.weight')}"
        mlp_cols.append([
            Node(f"rank {r}", seen[f"mlp{r}"][0], ("B", "T", "F/p"), "ffn", f"mlp.hidden{r}",
                 note=f"units {r * F}–{(r + 1) * F - 1}\nW_1 {w(r, 'ff.inner.fc_in.weight')}"
                      f"{gate}", flow=f"mlp{r}.fc_out:input", stack=True, wrap=wrap),
            Node("partial", seen[f"mlp{r}"][1], ("B", "T", "C"), "ffn", f"mlp.partial{r}",
                 note=f"W_2 {w(r, 'ff.inner.fc_out.weight')}", flow=f"mlp{r}.fc_out",
                 stack=True, wrap=wrap)])
    shape_x = tuple(x.shape)
    a = _tensor_canvas("attn", f"Attention by heads, p = {world_size}", attn_cols, shape_x,
                       shape_x, attn.out_proj.bias is not None,
                       "W_Q, W_K, W_V: the rows of the rank's heads; W_O: the matching "
                       "columns (torch's (out, in) weights)")
    m = _tensor_canvas("mlp", f"MLP column then row, p = {world_size}", mlp_cols, shape_x,
                       shape_x, ff.fc_out.bias is not None,
                       "W_1" + (", W_gate" if "ff.inner.fc_gate.weight" in shapes[0] else "")
                       + ": the rows of the rank's hidden units; W_2: the matching columns "
                       "(torch's (out, in) weights); norms and biases replicated")
    for canvas in (a, m):
        canvas.check_wiring(rec.flow)
    marks = [(kind, name) for kind in ("attention", "mlp") for name in ("f", "g")]
    d = Diagram(hstack(f"Tensor parallelism of one block over {world_size} ranks", [a, m], 28,
                       ["attn.", "mlp."]), [a, m])
    d.shards, d.marks, d.difference, d.flow = shapes, marks, difference, rec.flow
    d.collectives = {when: sum(COLLECTIVES[name][when] == "all-reduce" for _, name in marks)
                     for when in ("forward", "backward")}
    return d



# --- 4. pipeline schedules: GPipe and 1F1B, the bubble, activations in flight ----------------

def _place(orders: list[list[tuple[str, int]]], t_f: list[float], t_b: list[float]
           ) -> list[list[tuple[str, int, float, float]]]:
    """Each stage's operations (its schedule_order) with their start and end: an operation
    starts when its stage is free and its input has arrived (the forward of micro-batch i
    from the stage before, its backward from the stage after), communication free."""
    p = len(orders)
    end: dict[tuple[int, str, int], float] = {}
    placed: list[list[tuple[str, int, float, float]]] = [[] for _ in range(p)]
    while any(len(placed[s]) < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if len(placed[s]) == len(orders[s]):
                continue
            kind, i = orders[s][len(placed[s])]
            src = (s - 1, "F", i) if kind == "F" else (s + 1, "B", i)
            first = (kind == "F" and s == 0) or (kind == "B" and s == p - 1)
            if not first and src not in end:
                continue
            start = max(placed[s][-1][3] if placed[s] else 0.0, 0.0 if first else end[src])
            stop = start + (t_f[s] if kind == "F" else t_b[s])
            end[(s, kind, i)] = stop
            placed[s].append((kind, i, start, stop))
            moved = True
        if not moved:
            raise RuntimeError("the schedule's operations wait on each other (a deadlock)")
    return placed


def _schedule_canvas(name: str, placed: list[list[tuple[str, int, float, float]]],
                     span: float, peaks: list[int], width: float, numbers: bool,
                     words: str, m: int) -> Canvas:
    title = f"{name}: p = {len(placed)} stages, m = {m} micro-batches"
    c = Canvas(title)
    y = heading(c, name, 0, 0)
    label_w = text_width("stage 0", SMALL) + 10
    peak_w = text_width("peak", SMALL) + 12
    plot = width - label_w - peak_w
    unit = plot / span
    row = 26.0
    c.text(label_w + plot + peak_w / 2, y + 2, "peak", SMALL, bold=True)
    y += 10
    for s, ops in enumerate(placed):
        yr = y + s * row
        c.text(label_w - 8, yr + 17, f"stage {s}", SMALL, anchor="end")
        c.box(label_w, yr + 2, plot, row - 4, "mask", dashed=True, radius=1)  # idle unless
        for kind, i, start, stop in ops:  # an operation covers it
            x0, w = label_w + start * unit, (stop - start) * unit
            c.box(x0 + 0.5, yr + 2, max(w - 1, 0.5), row - 4, "attn" if kind == "F" else "head",
                  radius=2)
            if numbers and text_width(str(i), SMALL, mono=True) + 4 <= w:
                c.text(x0 + w / 2, yr + 17, str(i), SMALL, mono=True,
                       key=f"{name}.{kind}{i}.{s}")
        c.text(label_w + plot + peak_w / 2, yr + 17, str(peaks[s]), SMALL, bold=True,
               key=f"{name}.peak.{s}", shape=(peaks[s],))
    y += len(placed) * row + 4
    c.arrow(label_w, y, label_w + plot, y, edge="time, not data")
    _lines(c, 0, y + 20, words, width, key=f"{name}.bubble")
    return c


def _stage_times(name: str, value: object, p: int) -> list[float]:
    """One time per stage: a number for all, or p of them (measured per stage)."""
    values = [value] * p if is_number(value) else value
    if isinstance(values, str) or not isinstance(values, Sequence) or len(values) != p \
            or not all(is_number(v) and 0 < v < math.inf for v in values):
        raise ValueError(f"{name} must be a finite number > 0, or {p} of them (one per stage), "
                         f"got {value!r:.80}")
    return [float(v) for v in values]


def pipeline_schedules(n_stages: int = 4, n_micro: int = 6,
                       t_forward: float | Sequence[float] = 1.0,
                       t_backward: float | Sequence[float] = 2.0) -> Diagram:
    """GPipe above 1F1B on `n_stages` stages and `n_micro` micro-batches: each stage's
    operations in its `schedule_order` (blue: the forward of micro-batch i, red: its
    backward), placed in time by their dependencies (communication free) with forwards of
    `t_forward` and backwards of `t_backward` (one time for every stage, or one per stage:
    measured ones); grey: the stage idle, the bubble. Beside each stage, the most
    micro-batches whose activations it holds at once (`peak_activations`).

    The drawn span and each stage's busy time are checked against `simulate`'s; with the same
    times on every stage, the idle share against `bubble_fraction` ((p - 1)/(m + p - 1)), and
    otherwise each stage's idle share is written beside the formula's. Wide: slots numbered
    where the number fits; on a phone the same timelines narrower, unnumbered. The Diagram
    carries `bubble` ({schedule: idle share of the whole drawing}), `stage_bubble`
    ({schedule: [per stage]}), `peak` ({schedule: [per stage]}) and `ops` ({schedule: per
    stage [(kind, i, start, end)]}).
    """
    from tfbook.parallel.pipeline import (
        SCHEDULES,
        bubble_fraction,
        peak_activations,
        schedule_order,
        simulate,
    )

    for what, value, low, high in (("n_stages", n_stages, 2, 8), ("n_micro", n_micro, 1, 16)):
        if not is_int(value) or not low <= value <= high:
            raise ValueError(f"{what} must be an int from {low} to {high} (drawn), got "
                             f"{value!r}")
    p, m = n_stages, n_micro
    t_f, t_b = _stage_times("t_forward", t_forward, p), _stage_times("t_backward", t_backward, p)
    equal = len(set(t_f)) == 1 and len(set(t_b)) == 1
    formula = bubble_fraction(p, m)
    names = {"gpipe": "GPipe", "1f1b": "1F1B"}
    results = {}
    for schedule in SCHEDULES:
        orders = [schedule_order(schedule, s, p, m) for s in range(p)]
        placed = _place(orders, t_f, t_b)
        span = max(ops[-1][3] for ops in placed)
        busy = [sum(stop - start for _, _, start, stop in ops) for ops in placed]
        sim = simulate(schedule, p, m, t_f, t_b)
        if any(not math.isclose(sim[s]["span"], span) or not math.isclose(sim[s]["busy"],
                                                                          busy[s])
               for s in range(p)):
            raise RuntimeError(f"{schedule}: the drawn span {span} and busy times {busy} "
                               f"disagree with simulate's {sim}")
        idle = p * span - sum(busy)
        share = idle / (p * span)
        if equal and not math.isclose(share, formula):
            raise RuntimeError(f"{schedule}: {share} of the drawn time is idle, "
                               f"(p - 1)/(m + p - 1) = {formula}")
        per_stage = [1 - b / span for b in busy]
        if equal:
            words = (f"grey: idle, {idle:.3g} of {p * span:.3g} stage × time units (a forward "
                     f"takes {t_f[0]:g}, a backward {t_b[0]:g}) = (p − 1)/(m + p − 1) = "
                     f"{p - 1}/{m + p - 1} = {formula:.3g}")
        else:
            words = ("grey: idle, per stage " + ", ".join(f"{b:.0%}" for b in per_stage)
                     + f" (with the same times everywhere: (p − 1)/(m + p − 1) = "
                       f"{formula:.0%})")
        results[schedule] = (placed, span, [peak_activations(o) for o in orders], words,
                             share, per_stage)
    wide, narrow = [], []
    for schedule, (placed, span, peaks, words, _, _) in results.items():
        wide.append(_schedule_canvas(names[schedule], placed, span, peaks, 640.0, True, words,
                                     m))
        narrow.append(_schedule_canvas(names[schedule], placed, span, peaks, PANEL, False,
                                       words, m))
    for group in (wide, narrow):
        c = Canvas("Legend")
        x = 0.0
        yl = 0.0
        for kind, words in (("attn", "forward of micro-batch i"), ("head", "its backward"),
                            ("mask", "idle")):
            if x > 0 and x + 16 + text_width(words, SMALL) > PANEL:
                x, yl = 0.0, yl + 20
            c.box(x, yl - 10, 12, 12, kind, radius=1, dashed=kind == "mask")
            c.text(x + 16, yl, words, SMALL, anchor="start")
            x += 16 + text_width(words, SMALL) + 14
        _lines(c, 0, yl + 20, "peak: micro-batches whose activations a stage holds at once",
               PANEL)
        group.append(c)
    stack = Canvas(f"GPipe and 1F1B on {p} stages, {m} micro-batches")
    y = 0.0
    for part in wide:
        stack.group(part, -part.x0, y - part.y0)
        y += part.height + 24
    d = Diagram(stack, narrow=narrow)
    d.bubble = {k: v[4] for k, v in results.items()}
    d.stage_bubble = {k: v[5] for k, v in results.items()}
    d.peak = {k: v[2] for k, v in results.items()}
    d.ops = {k: v[0] for k, v in results.items()}
    return d


# --- 5. ring attention: which chunk pairs each rank computes, zig-zag vs contiguous ---------

def _ring_pairs(world_size: int, layout: str) -> dict[tuple[int, int], tuple[int, int, str]]:
    """(query chunk, key chunk) -> (rank, ring step, "full" or "partial") of every score
    block a causal ring computes: rank r at step s holds the keys of rank (r - s) mod p."""
    from tfbook.flash import tile_status
    from tfbook.parallel.ring import chunk_count, rank_chunks

    n = chunk_count(world_size, layout)
    c = 2  # tokens a chunk: a diagonal block is half masked ("partial"), as in any longer one
    pairs = {}
    for r in range(world_size):
        for s in range(world_size):
            for a in rank_chunks(r, world_size, layout):
                for b in rank_chunks((r - s) % world_size, world_size, layout):
                    status = tile_status(a * c, (a + 1) * c, b * c, (b + 1) * c, n * c, n * c,
                                         True)
                    if status != "skipped":
                        pairs[(a, b)] = (r, s, status)
    return pairs


def _ring_canvas(layout: str, p: int, pairs: dict, scores: list[int], most: int,
                 grid: float) -> Canvas:
    from tfbook.parallel.ring import chunk_count

    n = chunk_count(p, layout)
    cell = grid / n
    c = Canvas(f"Ring attention, {layout} layout, p = {p}")
    y = heading(c, {"zigzag": "Zig-zag", "contiguous": "Contiguous"}[layout], 0, 0)
    label_w = text_width("query 0 ", SMALL) + 6
    y = _lines(c, 0, y + 2, "cell: ring step; colour: rank", PANEL)
    c.text(label_w, y + 2, "key chunk →", SMALL, anchor="start")
    y += 18
    for b in range(n):
        c.text(label_w + (b + 0.5) * cell, y, str(b), SMALL, mono=True)
    y += 6
    for a in range(n):
        c.text(label_w - 6, y + (a + 0.5) * cell + 4.5, f"query {a}", SMALL, anchor="end")
        for b in range(n):
            x0, y0 = label_w + b * cell, y + a * cell
            if (a, b) in pairs:
                r, s, status = pairs[(a, b)]
                c.swatch(x0 + 1, y0 + 1, cell - 2, cell - 2, r,
                         0.5 if status == "full" else 0.25)
                c.text(x0 + cell / 2, y0 + cell / 2 + 4.5, str(s), SMALL, bold=True,
                       key=f"{layout}.{a}.{b}")
            else:
                c.box(x0 + 1, y0 + 1, cell - 2, cell - 2, "plain", dashed=True, radius=1)
    y += n * cell + 18
    y = _lines(c, 0, y, "scores each rank computes (RingWork):", PANEL)
    bar = PANEL - label_w - 50
    for r in range(p):
        c.swatch(0, y - 10, 12, 12, r, 0.5)
        c.text(16, y, f"rank {r}", SMALL, anchor="start")
        c.box(label_w, y - 11, max(bar * scores[r] / most, 1.0), 13, "plain", radius=1)
        c.text(label_w + bar * scores[r] / most + 6, y, str(scores[r]), SMALL, anchor="start",
               key=f"{layout}.scores.{r}", shape=(scores[r],))
        y += 19
    return c


def ring_zigzag(world_size: int = 4) -> Diagram:
    """Causal ring attention over `world_size` ranks (2 to 4): for the zig-zag layout (2p
    chunks, rank r holding chunks r and 2p - 1 - r) beside the contiguous one (p chunks), the
    grid of (query chunk, key chunk) score blocks the causal mask leaves, each tinted by the
    rank that computes it (lighter: a diagonal block, half masked) and numbered by the ring
    step at which that rank holds the keys; under each, the scores per rank.

    The blocks are `rank_chunks` and `tile_status`'s, as the ring deals and skips them; the
    count per rank and step is checked against the `RingWork` record of
    `simulate_ring_attention` on a sequence of 4p tokens, whose score counts the bars draw.
    The Diagram carries `pairs` ({layout: {(a, b): (rank, step, status)}}) and `work`
    ({layout: [RingWork per rank]}).
    """
    from tfbook.parallel.ring import LAYOUTS, RingWork, simulate_ring_attention

    if not is_int(world_size) or not 2 <= world_size <= 4:
        raise ValueError(f"world_size must be an int from 2 to 4 (ranks drawn), got "
                         f"{world_size!r}")
    p = world_size
    n = 4 * p  # tokens: two a zig-zag chunk, four a contiguous one
    with torch.random.fork_rng():
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 1, n, 2, dtype=torch.float64) for _ in range(3))
    pairs, works = {}, {}
    for layout in LAYOUTS:
        pairs[layout] = _ring_pairs(p, layout)
        work: list[RingWork] = []
        with torch.no_grad():
            simulate_ring_attention(q, k, v, p, causal=True, layout=layout, work=work)
        per_step = [[sum(1 for (r_, s_, _) in pairs[layout].values() if (r_, s_) == (r, s))
                     for s in range(p)] for r in range(p)]
        if per_step != [w.forward for w in work]:
            raise RuntimeError(f"{layout}: the drawn blocks per rank and step {per_step} are "
                               f"not the ring's {[w.forward for w in work]}")
        works[layout] = work
    most = max(w.scores for ws in works.values() for w in ws)
    panels = [_ring_canvas(layout, p, pairs[layout], [w.scores for w in works[layout]], most,
                           min(200.0, 36.0 * 2 * p)) for layout in LAYOUTS]
    d = Diagram(hstack(f"Causal ring attention over {p} ranks: zig-zag and contiguous",
                       panels, 28, ["zigzag.", "contiguous."]), panels)
    d.pairs, d.work = pairs, works
    return d

