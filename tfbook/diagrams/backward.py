"""The backward pass of attention drawn from a real call: the forward graph and the gradients
flowing back through it, every shape taken from the tensors of that call.

    from tfbook.diagrams.backward import attention_backward_graph, trace_attention_backward
    tb = trace_attention_backward(q, k, v, mask)   # one forward, one backward, on real tensors
    attention_backward_graph(tb)                   # a Diagram: forward left, backward right

The forward is tfbook's `scaled_dot_product_attention` (Z = Q K^T / sqrt(D), A = softmax(Z),
Y = A V). Autograd runs backward from a gradient G = dL/dY; the gradients of the scores and of
the weights (dZ, dA) are read from that run (the softmax's input and output keep their
gradients), and dQ, dK, dV are the hand-derived `tfbook.attention_backward.attention_backward`
of the same call, checked against autograd's. The letters are the attention-backward
chapter's: Z the scores, A the weights, Y the output, G its gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

import tfbook.attention
from tfbook.attention_backward import attention_backward
from tfbook.diagrams._shared import heading, note
from tfbook.diagrams.dataflow import Dataflow, Recorder
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.layout import GAP, Node, Rect, draw, hstack, letters_for
from tfbook.diagrams.svg import Canvas

Shape = tuple[int, ...]
# inside attention_backward, steps (1)-(4) in the order it computes them: the 1st product
# is dV = A^T G, the 2nd dA = G V^T; the 3rd starts dQ = dZ K / sqrt(D), so its first argument
# is dZ (the gradient of the scores)
BACKWARD_STEPS = {"matmul": (None, ("out", "dA"), ("arg0", "dZ"))}
QUERY = ("B", "H", "T", "D")
KEY = ("B", "H", "S", "D")
SCORES = ("B", "H", "T", "S")


@dataclass(frozen=True)
class BackwardTrace:
    """Shapes of one attention call and of its backward pass, all from the real tensors.

    Forward: q (..., T, D), k and v (..., S, D), scores Z and weights A (..., T, S), out Y
    (..., T, D). Backward: grad_out G, grad_weights dA, grad_scores dZ (from autograd's run),
    grad_q, grad_k, grad_v (from `attention_backward`). `max_difference` is the largest
    difference between those three and autograd's own gradients of the same call.
    """

    q: Shape
    k: Shape
    v: Shape
    scores: Shape
    weights: Shape
    out: Shape
    grad_out: Shape
    grad_weights: Shape
    grad_scores: Shape
    grad_q: Shape
    grad_k: Shape
    grad_v: Shape
    masked: bool
    max_difference: float
    forward_flow: Dataflow | None = field(default=None, compare=False, repr=False)
    backward_flow: Dataflow | None = field(default=None, compare=False, repr=False)


class _KeepSoftmax(TorchFunctionMode):
    """Keeps the input and output of every softmax called while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Tensor, Tensor]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in (torch.softmax, Tensor.softmax, torch.nn.functional.softmax):
            self.calls.append((args[0], out))
        return out


def trace_attention_backward(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                             grad_out: Tensor | None = None) -> BackwardTrace:
    """Run attention forward and backward on copies of q (..., T, D), k, v (..., S, D).

    `grad_out` is G = dL/dY (default: a fixed random tensor of Y's shape).
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("mask", mask), ("grad_out", grad_out)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_floating_point() or t.dim() < 2:
            raise ValueError(f"{name} must be a floating-point tensor (..., T or S, D), got "
                             f"{t.dtype} of shape {tuple(t.shape)}")
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    keep = _KeepSoftmax()
    forward = Recorder()
    with torch.enable_grad():
        with forward, keep:
            for name, t in (("q", q), ("k", k), ("v", v)):
                forward.name(t, name)
            out, weights = tfbook.attention.scaled_dot_product_attention(q, k, v, mask)
        if len(keep.calls) != 1:
            raise RuntimeError(f"expected one softmax in the forward pass, saw {len(keep.calls)}")
        scores = keep.calls[0][0]
        scores.retain_grad()
        weights.retain_grad()
        if grad_out is None:
            generator = torch.Generator().manual_seed(0)
            grad_out = torch.randn(out.shape, generator=generator, dtype=out.dtype)
        if tuple(grad_out.shape) != tuple(out.shape):
            raise ValueError(f"grad_out must have the output's shape {tuple(out.shape)}, got "
                             f"{tuple(grad_out.shape)}")
        out.backward(grad_out)
    # the hand-derived backward, recorded: steps (1)-(4) name dV, dA, dZ (where dQ and dK
    # begin), dQ and dK; G, Q, K, V and A are its inputs
    backward = Recorder()
    inputs = (grad_out, q.detach(), k.detach(), v.detach(), weights.detach())
    with torch.no_grad(), backward, backward.steps(BACKWARD_STEPS):
        for name, t in zip(("G", "Q", "K", "V", "A"), inputs, strict=True):
            backward.name(t, name)
        hand = attention_backward(*inputs)
        for name, t in zip(("dQ", "dK", "dV"), hand, strict=True):
            backward.name(t, name)
    auto = (q.grad, k.grad, v.grad)
    if any(h.shape != a.shape for h, a in zip(hand, auto, strict=True)):
        raise RuntimeError("the hand-derived gradients have other shapes than autograd's")
    diff = max((h - a).abs().max().item() for h, a in zip(hand, auto, strict=True))
    return BackwardTrace(
        q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape), scores=tuple(scores.shape),
        weights=tuple(weights.shape), out=tuple(out.shape), grad_out=tuple(grad_out.shape),
        grad_weights=tuple(weights.grad.shape), grad_scores=tuple(scores.grad.shape),
        grad_q=tuple(hand[0].shape), grad_k=tuple(hand[1].shape), grad_v=tuple(hand[2].shape),
        masked=mask is not None, max_difference=diff, forward_flow=forward.flow,
        backward_flow=backward.flow)


def _node(title: str, shape: Shape, legend: tuple[str, ...], kind: str, key: str,
          note_text: str) -> Node:
    return Node(title, shape, letters_for(legend, shape), kind, key, note=note_text)


def _place(c: Canvas, rows: list[list[Node]], x_of: list[list[float]], y0: float) -> list[
        list[Rect]]:
    """Rows of nodes: row i's top is below the tallest node of row i - 1 (plus room for an
    arrow); node j of row i is centred on x_of[i][j]."""
    out, y = [], y0
    for nodes, xs in zip(rows, x_of, strict=True):
        out.append([draw(c, n, x, y) for n, x in zip(nodes, xs, strict=True)])
        y += max(n.height for n in nodes) + GAP + 8
    return out


def _columns(rows: list[list[Node]], gap: float = 12) -> list[list[float]]:
    """Centres: the first node of every row on 0, a second node just right of it."""
    return [[0.0] + ([r[0].width / 2 + gap + r[1].width / 2] if len(r) == 2 else [])
            for r in rows]


def _forward_canvas(tb: BackwardTrace) -> Canvas:
    c = Canvas("Forward")
    y = heading(c, "Forward: down", 0, 0, anchor="middle")
    rows = [[_node("Q", tb.q, QUERY, "attn", "q", "queries"),
             _node("K", tb.k, KEY, "attn", "k", "keys")],
            [_node("Z = Q Kᵀ / √D", tb.scores, SCORES, "attn", "scores",
                   "scores, masked" if tb.masked else "scores")],
            [_node("A = softmax(Z)", tb.weights, SCORES, "attn", "weights", "weights"),
             _node("V", tb.v, KEY, "attn", "v", "values")],
            [_node("Y = A V", tb.out, QUERY, "attn", "out", "output")]]
    (q, k), (z,), (a, v), (out,) = _place(c, rows, _columns(rows), y)
    for r, name in ((q, "q"), (k, "k")):  # Q and K meet in the scores
        c.line([(r.cx, r.bottom), (r.cx, r.bottom + 12), (z.cx, r.bottom + 12), (z.cx, z.y)],
               edge=(name, "masked"))
    c.arrow(z.cx, z.bottom, a.cx, a.y, edge=("masked", "weights"))
    c.arrow(a.cx, a.bottom, out.cx, out.y, edge=("weights", "heads"))
    c.line([(v.cx, v.bottom), (v.cx, out.cy), (out.right, out.cy)], edge=("v", "heads"))
    note(c, c.x0, c.y1 + 20, "kept for the backward: Q, K, V, A")
    c.check_wiring(tb.forward_flow)
    return c


def _backward_canvas(tb: BackwardTrace) -> Canvas:
    c = Canvas("Backward")
    y = heading(c, "Backward: up", 0, 0, anchor="middle")
    rows = [[_node("dQ = dZ K/√D", tb.grad_q, QUERY, "head", "grad_q", "(4)"),
             _node("dK = dZᵀ Q/√D", tb.grad_k, KEY, "head", "grad_k", "(4)")],
            [_node("dZ", tb.grad_scores, SCORES, "head", "grad_scores", "(3): via softmax")],
            [_node("dA = G Vᵀ", tb.grad_weights, SCORES, "head", "grad_weights", "(2)"),
             _node("dV = Aᵀ G", tb.grad_v, KEY, "head", "grad_v", "(1)")],
            [_node("G = ∂L/∂Y", tb.grad_out, QUERY, "head", "grad_out", "given")]]
    (dq, dk), (dz,), (da, dv), (g,) = _place(c, rows, _columns(rows), y)
    for r, name in ((dq, "dQ"), (dk, "dK")):  # dZ splits into dQ and dK
        c.line([(dz.cx, dz.y), (dz.cx, r.bottom + 12), (r.cx, r.bottom + 12), (r.cx, r.bottom)],
               dashed=True, edge=("dZ", name))
    c.line([(da.cx, da.y), (dz.cx, dz.bottom)], dashed=True, edge=("dA", "dZ"))
    c.line([(g.cx, g.y), (da.cx, da.bottom)], dashed=True, edge=("G", "dA"))
    c.line([(g.right, g.cy), (dv.cx, g.cy), (dv.cx, dv.bottom)], dashed=True,
           edge=("G", "dV"))
    c.check_wiring(tb.backward_flow)
    return c


def attention_backward_graph(tb: BackwardTrace) -> Diagram:
    """Attention's forward graph (Q, K -> Z -> A, with V -> Y) beside its backward pass
    (G -> dA, dV; dA -> dZ through the softmax; dZ -> dQ, dK), rows matched: each gradient
    stands level with the tensor it belongs to. Numbers (1)-(4) are the chapter's equations."""
    if not isinstance(tb, BackwardTrace):
        raise TypeError("attention_backward_graph needs a BackwardTrace (from "
                        f"trace_attention_backward(q, k, v)), got {type(tb).__name__}")
    forward, backward = _forward_canvas(tb), _backward_canvas(tb)
    note(backward, backward.x0, backward.y1 + 20, "dashed: gradients, flowing back")
    panels = [forward, backward]
    return Diagram(hstack("The backward pass of attention", panels, 36,
                          ["forward.", "backward."]), panels)


__all__ = ["BackwardTrace", "attention_backward_graph", "trace_attention_backward"]
