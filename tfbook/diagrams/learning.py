"""Diagrams of Part V, drawn from the real objects: a LoRA layer, the training loop, data
parallelism with a ring all-reduce played step by step, and tensor and pipeline parallelism.

    from tfbook.diagrams.learning import lora_layer, training_loop, ring_steps
    lora_layer(LoRALinear(nn.Linear(576, 576), r=8, alpha=16), x)
    training_loop(model, (x, y), TrainConfig(...))
    ring_steps(4)

Every shape is read from a forward pass (`trace`) or from the parameters themselves, every
count from the model or the config, and every chunk of the ring from a run of
`ring_all_reduce_steps`: nothing on a drawing is typed.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.diagrams._shared import chips, heading, note
from tfbook.diagrams.dataflow import Recorder
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import GAP, Node, Rect, column, draw, hstack, row, shape_label
from tfbook.diagrams.svg import FONT, SMALL, Canvas, text_width
from tfbook.diagrams.trace import trace
from tfbook.lora import LoRALinear
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.train.distributed import ring_all_reduce, ring_all_reduce_steps, shard_batch
from tfbook.train.loop import TrainConfig, lm_loss
from tfbook.train.optim import adamw, clip_grad_norm

BTC = ("B", "T", "C")


def _lead(shape: tuple[int, ...], last: str) -> tuple[str, ...]:
    """Legend letters for (..., last): (B, T, C_in) for a (2, 5, 576) input."""
    return (("B", "T", "N", "M")[:len(shape) - 1]) + (last,)


# --- LoRA ---------------------------------------------------------------------------------

def lora_layer(layer: LoRALinear, x: Tensor) -> Diagram:
    """A LoRA layer on input x: the frozen W beside the trained A and B, drawn as a funnel
    to r numbers and back (Hu et al.'s bottleneck, to its proportions up to a least width),
    the scale alpha / r, their sum, and the merge W + (alpha / r) B A into one matrix. Every
    arrow is a dependency of the traced call."""
    if not isinstance(layer, LoRALinear):
        raise TypeError(f"lora_layer needs a tfbook.lora.LoRALinear, got {type(layer).__name__}")
    if not isinstance(x, Tensor) or x.dim() < 2 or x.size(-1) != layer.in_features:
        raise ValueError(f"x must be a tensor (..., {layer.in_features}) for this layer, got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    tr = trace(layer, x)
    # the same call again, naming its steps: x A^T ("down"), then B ("up"), then the scale
    with torch.no_grad(), Recorder(layer) as rec, rec.steps(
            {"linear": (None, ("out", "down"), ("out", "up")), "mul": (("out", "scaled"),)}):
        layer(x)
    with torch.no_grad():
        down = F.linear(x, layer.lora_A)  # (..., r)
        merged = layer.base.weight + layer.delta_weight()  # what layer.merged() holds
    W, A, B = (tuple(t.shape) for t in (layer.base.weight, layer.lora_A, layer.lora_B))
    x_shape, out = tr.input_shape(""), tr.shape("")
    frozen = layer.base.weight.numel() + (0 if layer.base.bias is None else layer.base.bias.numel())
    trained = layer.lora_A.numel() + layer.lora_B.numel()
    c = Canvas("A LoRA layer")
    y = heading(c, f"LoRA, r = {layer.r}: h = x Wᵀ + (α/r) x Aᵀ Bᵀ", 0, 0, "middle")
    top = draw(c, Node("input x", x_shape, _lead(x_shape, "C_in"), key="x", flow="x"), 0, y)
    y = top.bottom + GAP + 4
    left = Node("W: frozen", W, ("C_out", "C_in"), "mask", "W", note="no gradient",
                flow="base", stack=True)
    wide = max(left.width, 130.0)
    lx, rx = -(wide / 2 + 12), wide / 2 + 12
    lr = draw(c, left, lx, y, wide)
    # the trained branch: A narrows C_in numbers to r, B widens them back to C_out
    waist = max(26.0, wide * layer.r / layer.in_features)
    h = 46.0
    c.trapezoid(rx, y, wide, waist, h, "attn")
    c.text(rx, y + 18, "A", FONT, bold=True)
    c.box(rx - waist / 2, y + h, waist, 26, "attn", radius=2)
    c.text(rx, y + h + 18, str(layer.r), SMALL, mono=True)
    c.trapezoid(rx, y + h + 26, waist, wide, h, "head")
    c.text(rx, y + 2 * h + 26 - 10, "B", FONT, bold=True)
    bottom = y + 2 * h + 26
    scale = draw(c, Node(f"× α/r = {layer.alpha:g}/{layer.r} = {layer.scaling:g}",
                         kind="plain", key="scale", flow="scaled"), rx, bottom + 18, wide)
    c.arrow(rx, bottom, rx, scale.y, edge=("down", "scaled"))
    c.line([(0, top.bottom), (0, top.bottom + 12), (lr.cx, top.bottom + 12), (lr.cx, lr.y)],
           edge=("x", "base"))
    c.line([(0, top.bottom), (0, top.bottom + 12), (rx, top.bottom + 12), (rx, y)],
           edge=("x", "down"))
    y_add = max(scale.bottom, lr.bottom) + 26
    c.line([(lr.cx, lr.bottom), (lr.cx, y_add), (-11, y_add)], edge=("base", "output"))
    c.line([(scale.cx, scale.bottom), (scale.cx, y_add), (11, y_add)],
           edge=("scaled", "output"))
    c.adder(0, y_add)
    y = y_add + 11 + GAP
    c.arrow(0, y_add + 11, 0, y, edge=("output", "output"))
    h_node = draw(c, Node("output h", out, _lead(out, "C_out"), "stream", "h", flow="output"),
                  0, y)
    x0, y = -wide - 12, h_node.bottom + 22
    for name, letters, shape, key in (("A", ("r", "C_in"), A, "A"),
                                      ("x Aᵀ", _lead(tuple(down.shape), "r"), tuple(down.shape),
                                       "down"),
                                      ("B", ("C_out", "r"), B, "B")):
        c.text(x0, y, f"{name}:", SMALL, bold=True, anchor="start")
        note(c, x0 + 44, y, shape_label(letters, shape), key, shape, mono=True)
        y += 18
    for text, key, shape in (
            ("A starts random, B at zero: at first h = x Wᵀ", "", None),
            ("A, B: LoRA's matrices (this B is no batch);", "", None),
            ("a token passes through r numbers", "", None),
            (f"trained: {trained:,} numbers = r (C_in + C_out)", "counts", (trained,)),
            (f"frozen: {frozen:,} numbers", "", None)):
        note(c, x0, y, text, key, shape)
        y += 18
    c.check_wiring(rec.flow, nodes=("down",))
    # the merge, as its own panel
    m = Canvas("The merge")
    y = heading(m, "After training: merge", 0, 0, "middle")
    column(m, [Node("W + (α/r) B A", tuple(merged.shape), ("C_out", "C_in"), "ffn",
                    "merged", note="one matrix again: no extra cost", stack=True),
               Node("h = x W′ᵀ", out, _lead(out, "C_out"), "stream", "merged_h",
                    note="the same output, one product", stack=True)], 0, y, same_width=True,
           reason="the merged matrix gives the same output (the LoRA chapter tests it)")
    return Diagram(hstack("LoRA", [c, m], 32, ["", "merge."]), [c, m])


# --- the training loop --------------------------------------------------------------------

def _traced_step(model: nn.Module, batch: tuple[Tensor, Tensor], config: TrainConfig,
                 step: int) -> Recorder:
    """One step of the book's loop (`lm_loss`, backward, `clip_grad_norm`, `adamw`) on a copy
    of `model`, recorded: the loss, the gradients, the clipped gradients, the parameters after
    the step. The model itself, and torch's random numbers, are left as they were."""
    twin = copy.deepcopy(model)
    params = [p for p in twin.parameters() if p.requires_grad]
    optimizer = adamw(twin, config.lr_at(step), config.betas, config.weight_decay)
    with torch.random.fork_rng(), Recorder(twin) as rec:
        rec.name(batch[1], "targets")  # the model's call names x ("idx"); lm_loss reads y
        loss = lm_loss(twin, batch, config.label_smoothing)
        rec.name(loss, "loss")
        loss.backward()  # autograd runs outside Python: the gradients come from the loss
        grads = [p.grad for p in params if p.grad is not None]
        rec.name_all(grads, "grads", sources=("loss",))
        if config.clip:
            clip_grad_norm(params, config.clip)
        rec.name_all(grads, "clipped")
        optimizer.step()
        rec.name_all(params, "params")
    return rec


def training_loop(model: nn.Module, batch: tuple[Tensor, Tensor], config: TrainConfig,
                  step: int = 0) -> Diagram:
    """One optimiser step of the book's loop with the model's traced shapes and the config's
    values: batch, forward, loss, backward, clip, AdamW step (the schedule's rate read beside
    it), and round again. Every arrow between tensors is a dependency of a real step, run on
    a copy of the model (`lm_loss`, backward, `clip_grad_norm`, `adamw`) and recorded.

    The drawing changes neither the model nor the random numbers of a later cell.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not (isinstance(batch, tuple) and len(batch) == 2
            and all(isinstance(t, Tensor) and t.dim() == 2 for t in batch)
            and batch[0].shape == batch[1].shape):
        raise ValueError("batch must be (x, y): two (B, T) tensors of token ids, got "
                         f"{type(batch).__name__}")
    if not isinstance(step, int) or not 0 <= step < config.steps:
        raise ValueError(f"step must be an int in [0, {config.steps}), got {step!r}")
    x, y = batch
    with torch.random.fork_rng():
        tr = trace(model, x)
        rec = _traced_step(model, batch, config, step)
    logits = tr.shape("lm_head")
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    B, T = x.shape
    decay = {"cosine": "cosine", "linear": "linear", "inverse_sqrt": "1/√step",
             "constant": "constant"}[config.schedule]
    peak = f"{config.lr:g}"
    clip = (f"if the norm > {config.clip:g}, scale to {config.clip:g}" if config.clip
            else "off (clip=None)")
    wrap = 170.0
    nodes = [
        Node("batch x, targets y", (B, T), ("B", "T"), key="batch",
             note="y is x shifted by one token", flow="idx", wrap=wrap),
        Node("forward: logits", logits, ("B", "T", "V"), "attn", "logits", flow="lm_head",
             stack=True),
        Node("loss: cross-entropy", note=f"mean over B·T = {B * T:,} targets", kind="head",
             key="loss", flow="loss", wrap=wrap),
        Node("backward: gradients", (n_params,), ("N",), "ffn", "grads",
             note="one number per parameter", flow="grads", wrap=wrap),
        Node("clip the global norm", note=clip, kind="norm", key="clip", flow="clipped",
             wrap=wrap),
        Node("AdamW step", kind="ffn", key="adamw", flow="params",
             note=f"β = {config.betas[0]:g}, {config.betas[1]:g}; "
                  f"weight decay {config.weight_decay:g}", wrap=wrap),
    ]
    c = Canvas("The training loop")
    y0 = heading(c, f"The training loop: {config.steps:,} steps", 0, 0, "middle")
    rects = column(c, nodes, 0, y0, gap=20, same_width=True)
    # the targets go straight to the loss, past the forward pass
    x_t = rects[0].right + 12
    c.line([(rects[0].right, rects[0].cy), (x_t, rects[0].cy), (x_t, rects[2].cy),
            (rects[2].right, rects[2].cy)], edge=("targets", "loss"))
    # the rate: a number the schedule gives the optimiser, not a tensor of the step
    lr = draw(c, Node(f"learning rate of step {step}: {config.lr_at(step):.3g}", kind="plain",
                      key="lr", note="from the schedule", wrap=wrap), 0, rects[-1].bottom + 26)
    c.arrow(0, lr.y, 0, rects[-1].bottom,
            edge="the schedule's rate, a number the optimiser step reads")
    xl = rects[0].x - 18
    c.line([(rects[-1].x, rects[-1].cy), (xl, rects[-1].cy), (xl, rects[0].cy),
            (rects[0].x, rects[0].cy)], edge="round again: the next step's batch")
    c.text(xl - 4, (rects[0].cy + rects[-1].cy) / 2, "next step", SMALL, anchor="middle",
           vertical=True)
    note(c, lr.x, lr.bottom + 20, f"the schedule: warmup {config.warmup} steps to {peak},",
         "schedule")
    note(c, lr.x, lr.bottom + 38, f"then {decay}" + (
        f" to {config.lr * config.min_lr_ratio:g}"
        if config.schedule in ("cosine", "linear") else ""))
    c.check_wiring(rec.flow)
    return Diagram(c)


# --- data parallelism ---------------------------------------------------------------------

def _ring_label(value: float, p: int) -> str:
    """Which ranks' contributions a chunk holds: rank r put 2^r in it; Σ when all p."""
    mask = int(value)
    if mask == 2 ** p - 1:
        return "Σ"
    return "+".join(str(k) for k in range(p) if mask >> k & 1)


def _ring(p: int, pairs: set[tuple[int, int]]) -> Canvas:
    """The ranks on a ring, an arrow from each to the rank it sends to (`pairs`, the run's)."""
    c = Canvas("The ring")
    y = heading(c, "the ring: each rank sends to the next", 0, 0, "middle")
    R, r = 58.0, 20.0  # the ring's radius, a rank's
    cy = y + R + r + 4
    centre = {k: (R * math.sin(math.tau * k / p), cy - R * math.cos(math.tau * k / p))
              for k in range(p)}
    for k, (x, yk) in centre.items():
        c.adder(x, yk, str(k), r)
    for a, b in sorted(pairs):
        (xa, ya), (xb, yb) = centre[a], centre[b]
        d = math.hypot(xb - xa, yb - ya)
        ux, uy = (xb - xa) / d, (yb - ya) / d
        c.arrow(xa + ux * (r + 3), ya + uy * (r + 3), xb - ux * (r + 3), yb - uy * (r + 3),
                edge=f"rank {a} sends to rank {b} (ring_all_reduce_steps)")
    y = cy + R + r + 24
    for line in ("circles: the ranks. At every step each rank",
                 "sends one chunk (outlined below) to the next:",
                 "reduce-scatter adds it to the receiver's copy,",
                 "all-gather hands on a finished sum.",
                 "In a cell: whose gradients it holds; Σ: all."):
        note(c, 0, y, line, anchor="middle")
        y += 17
    return c


def ring_steps(p: int = 4) -> Diagram:
    """A ring all-reduce of p ranks: the ring, then one panel per step, reduce-scatter then
    all-gather.

    Each cell is one rank's copy of one chunk, labelled with the ranks whose contributions it
    holds (read from a run of `ring_all_reduce_steps` in which rank r's gradient is 2^r); the
    chunks sent at a step are outlined, each to the next rank (the last to rank 0). The ring's
    arrows are the run's sends.
    """
    if not isinstance(p, int) or isinstance(p, bool) or not 2 <= p <= 8:
        raise ValueError(f"p must be an int from 2 to 8 (ranks in the ring), got {p!r}")
    states = list(ring_all_reduce_steps([torch.full((p,), 2.0 ** r, dtype=torch.float64)
                                         for r in range(p)]))
    labels = [[[_ring_label(float(v.item()), p) for v in row] for row in state.chunks]
              for state in states]
    widest = max(text_width(t, SMALL) for grid in labels for line in grid for t in line)
    cell_w, cell_h, label_w = max(40.0, widest + 28), 28.0, 52.0
    pairs = {(src, dst) for state in states for src, dst, _ in state.sends}
    if pairs != {(r, (r + 1) % p) for r in range(p)}:
        raise RuntimeError(f"the run sent along {sorted(pairs)}, not around one ring")
    panels = [_ring(p, pairs)]
    for i, state in enumerate(states):
        title = ("start: each its own" if state.phase == "start"
                 else f"{state.phase} {state.step + 1}")
        c = Canvas(title)
        y = heading(c, title, label_w + p * cell_w / 2, 0, "middle")
        for k in range(p):
            c.text(label_w + (k + 0.5) * cell_w, y + 4, f"c{k}", SMALL)
        y += 12
        sent = {(src, chunk) for src, _, chunk in state.sends}
        for r in range(p):
            c.text(label_w - 8, y + (r + 0.5) * cell_h + 5, f"rank {r}", SMALL, anchor="end")
            for k in range(p):
                label = labels[i][r][k]
                full = label == "Σ"
                cx, cy = label_w + k * cell_w, y + r * cell_h
                c.box(cx + 4, cy + 3, cell_w - 8, cell_h - 6, "attn" if full else "data",
                      dashed=False, radius=2)
                c.text(cx + cell_w / 2, cy + cell_h / 2 + 4.5, label, SMALL, bold=full,
                       key=f"{r}.{k}")
                if (r, k) in sent:  # inside its own cell: the outline touches no neighbour
                    c.box(cx + 1, cy + 0.5, cell_w - 2, cell_h - 1, "head", dashed=True,
                          radius=3)
        panels.append(c)
    prefixes = ["ring."] + [f"{i}." for i in range(len(states))]
    return Diagram(hstack(f"Ring all-reduce of {p} ranks", panels, 24, prefixes), panels)


def _traced_data_parallel(batch: tuple[Tensor, Tensor], world_size: int) -> Recorder:
    """One data-parallel step played in one process and recorded: `shard_batch`, each rank's
    `lm_loss` and gradients, `ring_all_reduce` of them, the mean, and a step with it. The step's
    structure does not depend on the model, so a small GPT (`GPTConfig.tiny()`, random
    weights) plays it: the drawn model may live on the meta device."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(GPTConfig.tiny())
        params = [q for q in model.parameters() if q.requires_grad]
        x, y = (t.detach().to("cpu").long() % model.config.vocab_size for t in batch)
        with Recorder() as rec:
            rec.name(x, "batch")
            rec.name(y, "targets")
            flats = []
            for r in range(world_size):
                xs, ys = shard_batch((x, y), r, world_size)
                rec.name(xs, f"shard{r}")
                loss = lm_loss(model, (xs, ys))
                rec.name(loss, f"loss{r}")
                grads = list(torch.autograd.grad(loss, params))  # autograd: outside Python
                rec.name_all(grads, f"grad{r}", sources=(f"loss{r}",))
                flats.append(torch.cat([g.reshape(-1) for g in grads]))
            sums, _ = ring_all_reduce(flats)
            mean = sums[0] / world_size  # every rank holds the same sum
            rec.name(mean, "mean")
            with torch.no_grad():
                stepped = [q - 0.1 * g.view_as(q)
                           for q, g in zip(params, mean.split([q.numel() for q in params]),
                                           strict=True)]
            rec.name_all(stepped, "step")
    return rec


def data_parallel(model: nn.Module, batch: tuple[Tensor, Tensor], world_size: int) -> Diagram:
    """p replicas of `model`, each on its shard of the global batch (`shard_batch`), their
    gradients averaged by an all-reduce, and the same step everywhere. The arrows are those of
    one such step played and recorded in one process."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(world_size, int) or not 2 <= world_size <= 4:
        raise ValueError(f"world_size must be an int from 2 to 4 (ranks drawn), got "
                         f"{world_size!r}")
    shards = [shard_batch(batch, r, world_size) for r in range(world_size)]  # checks sizes
    rec = _traced_data_parallel(batch, world_size)
    n_params = sum(p.numel() for p in model.parameters())
    c = Canvas("Data parallelism")
    y = heading(c, f"Data parallelism: {world_size} replicas", 0, 0, "middle")
    top = draw(c, Node("global batch", tuple(batch[0].shape), ("B", "T"), key="global",
                       flow="batch"), 0, y)
    y = top.bottom + GAP + 6
    columns = []
    for r, (xs, _) in enumerate(shards):
        columns.append([Node(f"rank {r}: rows", tuple(xs.shape), ("B/p", "T"), key=f"shard{r}",
                             flow=f"shard{r}", stack=True),
                        Node("replica: loss", note="the same weights", kind="attn",
                             key=f"replica{r}", flow=f"loss{r}"),
                        Node(f"gradient g_{{{r}}}", (n_params,), ("N",), "ffn", f"grad{r}",
                             flow=f"grad{r}", stack=True)])
    width = max(n.width for col in columns for n in col)
    xs_ = [(r - (world_size - 1) / 2) * (width + 12) for r in range(world_size)]
    bottoms = []
    for xc, col in zip(xs_, columns, strict=True):
        c.line([(0, top.bottom), (0, top.bottom + 10), (xc, top.bottom + 10), (xc, y)],
               edge=("batch", col[0].flow))
        bottoms.append(column(c, col, xc, y, gap=18, same_width=True)[-1])
    y = max(b.bottom for b in bottoms) + GAP
    lines = ["all-reduce: every rank gets", f"the mean of the {world_size} gradients"]
    span = max(xs_[-1] - xs_[0] + width, text_width(lines[1], FONT) + 24)
    c.box(-span / 2, y, span, 58, "stream")
    c.text(0, y + 18, lines, FONT, bold=True)
    note(c, 0, y + 51, "a ring: each rank sends 2 (p − 1) / p of it", anchor="middle")
    for b, col in zip(bottoms, columns, strict=True):
        c.arrow(b.cx, b.bottom, b.cx, y, edge=(col[-1].flow, "mean"))
    y += 58 + GAP
    c.arrow(0, y - GAP, 0, y, edge=("mean", "step"))
    draw(c, Node("the same optimiser step on every rank", kind="plain",
                 note="the replicas stay identical", flow="step", wrap=200), 0, y)
    c.check_wiring(rec.flow)
    return Diagram(c)


def _traced_tensor_parallel(ff: nn.Module, ranks: int) -> tuple[Recorder, float]:
    """A feed-forward network split over `ranks` as tensor parallelism splits it, played and
    recorded on a small real one with `ff`'s activation: rank r's rows of W_1 (its hidden
    units), its columns of W_2 (a partial output), the partial outputs summed. Returns the
    recording and the largest difference between the sum and the whole FFN's output."""
    from tfbook.feedforward import FeedForward

    with torch.random.fork_rng():
        torch.manual_seed(0)
        act = getattr(getattr(ff, "act", None), "__name__", "gelu")
        small = FeedForward(8, 4 * ranks, act if act in ("relu", "gelu", "silu") else "gelu")
        x = torch.randn(2, 3, 8)
        with torch.no_grad(), Recorder() as rec:
            rec.name(x, "x")
            part = small.fc_in.out_features // ranks
            partials = []
            for r in range(ranks):
                rows = slice(r * part, (r + 1) * part)
                h = small.act(F.linear(x, small.fc_in.weight[rows], small.fc_in.bias[rows]))
                rec.name(h, f"w1.{r}")
                out = F.linear(h, small.fc_out.weight[:, rows])
                rec.name(out, f"w2.{r}")
                partials.append(out)
            total = torch.stack(partials).sum(0) + small.fc_out.bias  # the all-reduce's sum
            rec.name(total, "sum")
            difference = (total - small(x)).abs().max().item()
    return rec, difference


def _pipeline_schedule(stages: int, micro: int) -> list[list[str]]:
    """GPipe: grid[s][t] = "F3" (forward of micro-batch 3) / "B3" / "" (idle: the bubble).

    Stage s runs the forward of micro-batch k at time s + k; after the last forward leaves
    the last stage, the backward passes run back up the pipeline, the last micro-batch first
    (as in Huang et al.'s figure 2).
    """
    span = micro + stages - 1  # time slots of the forward (and of the backward) half
    grid = [[""] * (2 * span) for _ in range(stages)]
    for s in range(stages):
        for k in range(micro):
            grid[s][s + k] = f"F{k + 1}"
            grid[s][span + (stages - 1 - s) + (micro - 1 - k)] = f"B{k + 1}"
    return grid


def model_parallel(model: nn.Module, ranks: int = 2, micro_batches: int = 4) -> Diagram:
    """Two sketches on a real GPT: tensor parallelism (the feed-forward matrices of block 0
    split over `ranks`) and pipeline parallelism (its blocks in `ranks` stages, GPipe's
    schedule of `micro_batches` micro-batches with its idle bubble)."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"model_parallel needs a tfbook GPT (with .blocks), got "
                        f"{type(model).__name__}")
    if not isinstance(ranks, int) or not 2 <= ranks <= len(blocks):
        raise ValueError(f"ranks must be an int from 2 to the {len(blocks)} blocks, got {ranks!r}")
    if not isinstance(micro_batches, int) or not 1 <= micro_batches <= 8:
        raise ValueError(f"micro_batches must be an int from 1 to 8, got {micro_batches!r}")
    ff = blocks[0].ff
    w1, w2 = tuple(ff.fc_in.weight.shape), tuple(ff.fc_out.weight.shape)  # (F, C), (C, F)
    if w1[0] % ranks:
        raise ValueError(f"F = {w1[0]} hidden units do not split over {ranks} ranks")
    part = w1[0] // ranks
    # tensor parallelism
    rec, difference = _traced_tensor_parallel(ff, ranks)
    if difference > 1e-5:
        raise RuntimeError(f"the partial outputs sum to the FFN's output only within "
                           f"{difference:.2g}")
    t = Canvas("Tensor parallelism")
    y = heading(t, "Tensor parallelism: one FFN split", 0, 0, "middle")
    top = draw(t, Node("x, the same on every rank", None, kind="data", note="(B, T, C)",
                       flow="x"), 0, y)
    y = top.bottom + GAP
    nodes = [[Node("W_{1} rows", (part, w1[1]), ("F/p", "C"), "ffn", f"w1.{r}",
                   note=f"rank {r}: units\n{r * part}–{(r + 1) * part - 1}", flow=f"w1.{r}",
                   stack=True),
              Node("W_{2} columns", (w2[0], part), ("C", "F/p"), "ffn", f"w2.{r}",
                   note=f"rank {r}: a partial\noutput", flow=f"w2.{r}", stack=True)]
             for r in range(ranks)]
    width = max(n.width for col in nodes for n in col)
    xs = [(r - (ranks - 1) / 2) * (width + 12) for r in range(ranks)]
    ends = []
    for xc, col in zip(xs, nodes, strict=True):
        t.line([(0, top.bottom), (0, top.bottom + 10), (xc, top.bottom + 10), (xc, y)],
               edge=("x", col[0].flow))
        ends.append(column(t, col, xc, y, gap=18, same_width=True)[-1])
    y = max(e.bottom for e in ends) + GAP
    for e, col in zip(ends, nodes, strict=True):
        t.arrow(e.cx, e.bottom, e.cx, y, edge=(col[-1].flow, "sum"))
    lines = ["all-reduce: sum the", "partial outputs"]
    span = max(xs[-1] - xs[0] + width, text_width(lines[0], FONT) + 24)
    t.box(-span / 2, y, span, 48, "stream")
    t.text(0, y + 20, lines, FONT, bold=True)
    t.nodes.append("sum")
    note(t, 0, y + 68, f"fc_in.weight {w1} split by rows,", anchor="middle",
         key="ffn_weights", shape=w1 + w2)
    note(t, 0, y + 86, f"fc_out.weight {w2} by columns", anchor="middle")
    t.check_wiring(rec.flow)
    # pipeline parallelism
    n = len(blocks)
    bounds = [round(s * n / ranks) for s in range(ranks + 1)]
    grid = _pipeline_schedule(ranks, micro_batches)
    p = Canvas("Pipeline parallelism")
    cell = max(24.0, min(30.0, 280.0 / len(grid[0])))
    label_w = text_width(f"stage {ranks - 1}", SMALL) + 10
    width = len(grid[0]) * cell
    y = heading(p, "Pipeline parallelism (GPipe)", label_w + width / 2, 0, "middle")
    for s, line in enumerate(grid):
        p.text(label_w - 8, y + s * cell + cell / 2 + 5, f"stage {s}", SMALL, anchor="end")
        for k, slot in enumerate(line):
            x = label_w + k * cell
            if slot:
                p.box(x + 1, y + s * cell + 1, cell - 2, cell - 2,
                      "attn" if slot[0] == "F" else "head", radius=2)
                p.text(x + cell / 2, y + s * cell + cell / 2 + 5, slot, SMALL,
                       key=f"slot{s}.{k}")
            else:
                p.box(x + 1, y + s * cell + 1, cell - 2, cell - 2, "plain", dashed=True,
                      radius=2)
    idle = sum(slot == "" for line in grid for slot in line)
    total = sum(len(line) for line in grid)
    y += ranks * cell + 20
    p.arrow(label_w, y - 8, label_w + width, y - 8, edge="time, not data")
    note(p, label_w + width / 2, y + 10, "time →  F: forward, B: backward", anchor="middle")
    note(p, label_w + width / 2, y + 28, "of a micro-batch", anchor="middle")
    note(p, label_w + width / 2, y + 46, f"dashed: idle, {idle} of {total} slots (the bubble)",
         key="bubble", shape=(idle, total), anchor="middle")
    y += 64
    for s in range(ranks):  # blocks counted from 0, as in the code and the ranks
        first, last = bounds[s], bounds[s + 1] - 1
        blocks_text = f"block {first}" if first == last else f"blocks {first}–{last}"
        note(p, label_w + width / 2, y, f"stage {s}: {blocks_text}", f"stage{s}",
             (first, last), anchor="middle")
        y += 18
    return Diagram(hstack("Splitting the model", [t, p], 32, ["tensor.", "pipeline."]), [t, p])


__all__ = ["data_parallel", "lora_layer", "model_parallel", "ring_steps", "training_loop"]
del Rect, row, chips
