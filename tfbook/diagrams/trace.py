"""Run a real forward pass with hooks on every module and keep the shape of every tensor.

    tr = trace(model, idx)                # any tfbook model, block or attention module
    tr.shape("blocks.0.attn")             # output shape of that module: (1, 9, 64)
    tr.attention("blocks.0.attn").q       # per-head queries (B, H, T, D), as traced
    tr.kind("blocks.0")                   # 'SelfAttentionBlock'

The diagrams read every number they print from such a trace (or from the module itself,
for counts such as heads and layers), so a drawing cannot disagree with the model.
Inside each `MultiHeadAttention` the trace also records the per-head queries, keys and
values (from `split_heads`), the attention weights (the module is asked for them) and the
heads' outputs before they are merged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import tfbook.attention
from tfbook.attention import MultiHeadAttention
from tfbook.diagrams.dataflow import Dataflow, Recorder

Shape = tuple[int, ...]


def _shapes(value: Any) -> tuple[Shape, ...]:
    """The shapes of the tensors in a module's input or output (nested tuples flattened)."""
    if isinstance(value, Tensor):
        return (tuple(value.shape),)
    if isinstance(value, tuple | list):
        return tuple(s for item in value for s in _shapes(item))
    for name in ("logits", "last_hidden_state"):  # a ModelOutput: its main tensor
        if isinstance(getattr(value, name, None), Tensor):
            return (tuple(getattr(value, name).shape),)
    return ()


@dataclass(frozen=True)
class Call:
    """One call of one module: the shapes of its tensor inputs and outputs."""

    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]


@dataclass(frozen=True)
class AttentionTrace:
    """The shapes inside one attention call, all taken from the real tensors.

    x (B, T, C) queries' input; source (B, S, C) for cross-attention (else None);
    q (B, H, T, D); k, v (B, H_kv, S, D); weights (B, H, T, S); heads (B, H, T, D) = weights @ v;
    merged (B, T, C) the heads concatenated; out (B, T, C) after W_O.
    A call of the bare function (`trace_attention`) has no batch or head axes and no W_O.
    """

    x: Shape | None
    source: Shape | None
    q: Shape
    k: Shape
    v: Shape
    weights: Shape
    heads: Shape
    merged: Shape | None
    out: Shape
    n_heads: int | None  # H (None for the bare function: one head)
    n_kv_heads: int | None  # H_kv
    head_size: int  # D
    masked: bool  # a mask (or causal=True) was applied
    name: str = ""  # the call's name in the dataflow: "blocks.0.attn", "" for the bare call
    flow: Dataflow | None = field(default=None, compare=False, repr=False)  # the recording


@dataclass
class Trace:
    """Shapes of every module call of one forward pass, by the module's dotted name."""

    model: nn.Module
    calls: dict[str, list[Call]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    attentions: dict[str, list[AttentionTrace]] = field(default_factory=dict)
    flow: Dataflow = field(default_factory=Dataflow)  # which tensor came from which

    def flow_name(self, name: str, part: str = "", call: int = 0) -> str:
        """The dataflow's name of a tensor of module `name`'s call `call`: its output
        (part ""), an input ("x", "source"), or a step inside attention (".q", ".weights")."""
        self._check(name)
        base = name if call == 0 else f"{name}#{call}"
        if part.startswith(":"):
            return f"{base}{part}" if base else part[1:]
        if part:
            return f"{base}{part}" if base else part.lstrip(".")
        return base or "output"

    def _check(self, name: str) -> list[Call]:
        if not isinstance(name, str):
            raise TypeError(f"a module name must be a str, got {type(name).__name__}")
        if name not in self.calls:
            known = ", ".join(list(self.calls)[:12])
            raise ValueError(f"no module {name!r} ran in this trace; modules that ran: "
                             f"{known}, ...")
        return self.calls[name]

    def kind(self, name: str) -> str:
        """The class name of the module called `name`."""
        self._check(name)
        return self.kinds[name]

    def module(self, name: str) -> nn.Module:
        """The module called `name` (the model itself is '')."""
        self._check(name)
        return self.model.get_submodule(name)

    def shape(self, name: str, call: int = 0, index: int = 0) -> Shape:
        """Shape of output `index` of call `call` of module `name`."""
        return self._check(name)[call].outputs[index]

    def input_shape(self, name: str, call: int = 0, index: int = 0) -> Shape:
        """Shape of tensor input `index` of call `call` of module `name`."""
        return self._check(name)[call].inputs[index]

    def n_calls(self, name: str) -> int:
        """How many times the module ran in this forward pass."""
        return len(self._check(name))

    def attention(self, name: str, call: int = 0) -> AttentionTrace:
        """The shapes inside call `call` of the attention module `name`."""
        self._check(name)
        if name not in self.attentions:
            raise ValueError(f"{name!r} is a {self.kinds[name]}, not a MultiHeadAttention")
        return self.attentions[name][call]

    def names(self, kind: str | None = None) -> list[str]:
        """Names of the modules that ran (in the order they were first called), of one kind."""
        return [n for n in self.calls if kind is None or self.kinds[n] == kind]


def _attention_hooks(name: str, module: MultiHeadAttention, tr: Trace) -> list[Any]:
    """Record q, k, v (split_heads), the weights (asked for) and the heads' output."""
    seen: list[Tensor] = []
    plain_split = module.split_heads

    def split_heads(x: Tensor, n_heads: int | None = None) -> Tensor:
        out = plain_split(x, n_heads)
        seen.append(out)
        return out

    def before(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        seen.clear()
        if len(args) < 7:  # need_weights not given by position: ask for the weights
            kwargs = {**kwargs, "need_weights": True}
        return args, kwargs

    def after(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        x = args[0] if args else kwargs["x"]
        source = args[1] if len(args) > 1 else kwargs.get("source")
        mask = args[2] if len(args) > 2 else kwargs.get("mask")
        causal = args[3] if len(args) > 3 else kwargs.get("causal", False)
        q, k, v = seen[0], seen[1], seen[2]
        weights = output[1]  # (B, H, T, S): S counts the cached keys too on a decode step
        n_keys = weights.shape[-1]
        # the keys and values attended to: this step's, or the cache's after this step's append
        k_shape = (*k.shape[:2], n_keys, k.shape[-1])  # (B, H_kv, S, D)
        v_shape = (*v.shape[:2], n_keys, v.shape[-1])  # (B, H_kv, S, D)
        heads = (*q.shape[:3], v.shape[-1])  # weights @ V per head: (B, H, T, D)
        tr.attentions.setdefault(name, []).append(AttentionTrace(
            x=tuple(x.shape), source=None if source is None else tuple(source.shape),
            q=tuple(q.shape), k=k_shape, v=v_shape,
            weights=tuple(weights.shape), heads=heads,
            merged=tr.calls[f"{name}.out_proj" if name else "out_proj"][-1].inputs[0],
            out=tuple(output[0].shape), n_heads=module.n_heads, n_kv_heads=module.n_kv_heads,
            head_size=module.head_size, masked=mask is not None or bool(causal),
            name=name if not tr.attentions.get(name) else f"{name}#{len(tr.attentions[name])}",
            flow=tr.flow))

    module.split_heads = split_heads  # type: ignore[method-assign]
    return [module.register_forward_pre_hook(before, with_kwargs=True),
            module.register_forward_hook(after, with_kwargs=True)]


def trace(model: nn.Module, *args: Any, **kwargs: Any) -> Trace:
    """Run `model(*args, **kwargs)` once (no gradients) and record every module's shapes."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"trace needs a torch.nn.Module, got {type(model).__name__}")
    tr = Trace(model)
    handles: list[Any] = []
    patched: list[nn.Module] = []

    def recorder(name: str):
        def hook(mod: nn.Module, inputs: tuple, kw: dict, output: Any) -> None:
            shapes = _shapes(inputs) + _shapes(tuple(v for v in kw.values()
                                                     if isinstance(v, Tensor)))
            tr.calls.setdefault(name, []).append(Call(shapes, _shapes(output)))
            tr.kinds[name] = type(mod).__name__
        return hook

    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout):
            continue
        if isinstance(module, MultiHeadAttention):
            handles += _attention_hooks(name, module, tr)
            patched.append(module)
        # registered after the attention hooks: the call is recorded before they read it
        handles.append(module.register_forward_hook(recorder(name), with_kwargs=True))
    recorder = Recorder(model)
    tr.flow = recorder.flow  # which tensor was computed from which, filled by the call
    try:
        with torch.no_grad(), recorder:
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
        for module in patched:
            del module.split_heads  # back to the class's method
    return tr  # modules are listed in the order their calls finished


def trace_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                    x: Tensor | None = None,
                    projections: tuple[Tensor, Tensor, Tensor] | None = None) -> AttentionTrace:
    """The shapes of one call of `scaled_dot_product_attention` (one head, no W_O).

    `x` is the input the chapter projected to q, k and v, if it wants it drawn; then
    `projections` (W_Q, W_K, W_V) are the matrices it used: q, k and v are computed again as
    x @ W under the dataflow recorder and must equal the given ones, so the drawing's arrows
    from X are the computation's.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("x", x), ("mask", mask)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if (x is None) != (projections is None):
        raise ValueError("give x together with projections=(W_Q, W_K, W_V), the matrices "
                         "that made q, k and v from it (or neither)")
    if projections is not None and not (isinstance(projections, tuple) and len(projections) == 3
                                        and all(isinstance(w, Tensor) for w in projections)):
        raise TypeError(f"projections must be a tuple of 3 tensors (W_Q, W_K, W_V), got "
                        f"{type(projections).__name__}")
    with torch.no_grad(), Recorder() as rec:
        if x is not None:
            rec.name(x, "x")
            made = tuple(x @ w for w in projections)  # (T, C) @ (C, D) -> (T, D)
            if not all(m.shape == t.shape and torch.equal(m, t)
                       for m, t in zip(made, (q, k, v), strict=True)):
                raise ValueError("x @ W_Q, x @ W_K, x @ W_V are not the q, k, v given: pass "
                                 "the matrices that made them")
            q, k, v = made
        for name, t in (("q", q), ("k", k), ("v", v)):
            rec.name(t, name)
        out, weights = tfbook.attention.scaled_dot_product_attention(q, k, v, mask)
    return AttentionTrace(
        x=None if x is None else tuple(x.shape), source=None, q=tuple(q.shape),
        k=tuple(k.shape), v=tuple(v.shape), weights=tuple(weights.shape),
        heads=tuple(out.shape), merged=None, out=tuple(out.shape), n_heads=None,
        n_kv_heads=None, head_size=q.size(-1), masked=mask is not None, name="",
        flow=rec.flow)
