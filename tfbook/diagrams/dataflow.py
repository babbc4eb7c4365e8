"""Which tensor was computed from which: a forward pass recorded as a graph of named tensors,
and a drawing's arrows held against it.

    flow = dataflow(model, idx)                  # every module's output named by its name
    flow.sources("blocks.0.attn.weights")        # {'blocks.0.attn.scores'... } one step back
    check_edges([("blocks.0", "blocks.1")], flow)  # raises if an arrow is not a dependency

A `torch.overrides.TorchFunctionMode` sees every tensor operation of the pass and gives each
result the named tensors it was computed from (its sources); naming a tensor makes it a vertex
of the graph with an edge from each of its sources. So an edge A -> B means "B was computed
from A, through unnamed steps only". Names (the shape labels' keys of the diagrams use them):

- the call's tensor arguments by their parameter names ("idx", "targets", "src", "tgt");
  a sub-module call's arguments as "<module>:<parameter>" ("blocks.0:x",
  "decoder.0.cross_attn:source"): an alias when the tensor already has a name;
- each module call's output by the module's dotted name ("tok_emb", "blocks.0.attn");
  the model's own output is "output" (its loss, if it returns one, "loss"), and the n-th
  further call of a module "<module>#n";
- inside a `MultiHeadAttention` call "<attn>": ".q", ".k", ".v" (split into heads),
  ".keys", ".values" (everything the cache returns after appending), ".scores" (Q Kᵀ),
  ".scaled" (÷ √D), ".masked" (mask applied; an alias of ".scaled" without a mask),
  ".weights" (softmax), ".heads" (weights @ V), ".merged" (the heads concatenated);
- a module's activation function (an `act` attribute that is a plain function): "<module>.act";
- any tensor the caller names with `Recorder.name(tensor, name)` (a cache's stored keys, a
  chapter's own input).

`check_edges(edges, flow)` holds a drawing's arrows against the graph, given the set of
tensors the drawing shows (the ends of its arrows, plus `nodes`): an arrow A -> B is right
when B is computed from A through tensors the drawing does not show; every such dependency
between shown tensors must be drawn, unless listed in `omit`. Two names of one tensor (an
alias) may be joined by an arrow (a step that leaves the values alone, such as dropout at
evaluation).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

# operations whose result holds no value of their tensor arguments (only their shape or dtype)
NO_DATA = {"new_zeros", "new_ones", "new_empty", "new_full", "zeros_like", "ones_like",
           "empty_like", "full_like", "rand_like", "randn_like", "randint_like"}
IN_PLACE_DUNDER = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                   "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
                   "__imatmul__"}
# inside scaled_dot_product_attention: the n-th call of an operation (by its name without
# underscores) names its result with the n-th entry
ATTENTION_STEPS = {"matmul": ("scores", "heads"), "truediv": ("scaled",), "div": ("scaled",),
                   "masked_fill": ("masked",), "softmax": ("weights",)}


@dataclass
class Dataflow:
    """A graph of named tensors: an edge A -> B when B was computed from A (see the module's
    docstring for the names). Several names of one tensor share a vertex."""

    _vertex: dict[str, int] = field(default_factory=dict)  # name -> vertex
    _names: list[list[str]] = field(default_factory=list)  # vertex -> its names
    _preds: list[set[int]] = field(default_factory=list)  # vertex -> direct sources

    # -- building ---------------------------------------------------------------------------
    def add(self, name: str, sources: Iterable[int]) -> int:
        """A new vertex `name` computed from the vertices `sources`."""
        self._fresh(name)
        self._names.append([name])
        self._preds.append(set(sources))
        self._vertex[name] = len(self._names) - 1
        return self._vertex[name]

    def alias(self, name: str, existing: str | int) -> None:
        """A second name for a tensor already in the graph."""
        vertex = existing if isinstance(existing, int) else self.vertex(existing)
        self._fresh(name)
        self._names[vertex].append(name)
        self._vertex[name] = vertex

    def _fresh(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a tensor's name must be a non-empty str, got {name!r}")
        if name in self._vertex:
            raise ValueError(f"the name {name!r} is already given to a tensor of this pass")

    # -- reading ----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Every name, in the order the tensors were named."""
        return list(self._vertex)

    def __contains__(self, name: object) -> bool:
        return name in self._vertex

    def vertex(self, name: str) -> int:
        if name not in self._vertex:
            near = [n for n in self._vertex if name.split(".")[-1].split(":")[-1] in n][:8]
            raise ValueError(f"no tensor named {name!r} in this computation"
                             + (f"; similar names: {', '.join(near)}" if near else
                                f"; names: {', '.join(list(self._vertex)[:16])}, ..."))
        return self._vertex[name]

    def name_of(self, vertex: int) -> str:
        return self._names[vertex][0]

    def sources(self, name: str) -> set[str]:
        """The named tensors `name` was computed from directly (one edge back)."""
        return {self.name_of(p) for p in self._preds[self.vertex(name)]}

    @property
    def edges(self) -> set[tuple[str, str]]:
        """Every edge (source, result), each tensor by its first name."""
        return {(self.name_of(p), self.name_of(v))
                for v, preds in enumerate(self._preds) for p in preds}

    def _successors(self) -> list[set[int]]:
        succ: list[set[int]] = [set() for _ in self._preds]
        for v, preds in enumerate(self._preds):
            for p in preds:
                succ[p].add(v)
        return succ

    def reached(self, start: str, stop: Iterable[str] = ()) -> set[str]:
        """The shown tensors computed from `start` along paths that pass through no other
        tensor of `stop` (the first name of each vertex reached that is in `stop`)."""
        return {self.name_of(v) for v in self._reach(self.vertex(start),
                                                     {self.vertex(s) for s in stop})}

    def _reach(self, start: int, stop: set[int], succ: list[set[int]] | None = None,
               inside: set[int] | None = None) -> set[int]:
        """The vertices of `stop` reached from `start` through vertices not in `stop` (and, if
        given, in `inside`)."""
        succ = succ if succ is not None else self._successors()
        seen, found, todo = {start}, set(), [start]
        while todo:
            for nxt in succ[todo.pop()]:
                if nxt in seen:
                    continue
                seen.add(nxt)
                if nxt in stop:
                    found.add(nxt)  # a shown tensor: the path ends here
                elif inside is None or nxt in inside:
                    todo.append(nxt)
        return found

    def within(self, call: str) -> set[int]:
        """The vertices of one module call: named `call`, "call.…" or "call:…"."""
        return {v for name, v in self._vertex.items()
                if name == call or name.startswith((call + ".", call + ":"))}

    def depends(self, result: str, source: str) -> bool:
        """Whether `result` was computed from `source`, through any tensors."""
        return self.vertex(result) in self._reach_all(self.vertex(source))

    def _reach_all(self, start: int, succ: list[set[int]] | None = None) -> set[int]:
        """Every vertex computed from `start`, through any tensors."""
        succ = succ if succ is not None else self._successors()
        seen, todo = {start}, [start]
        while todo:
            for nxt in succ[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen - {start}

    def check(self, edges: Iterable[tuple[str, str]], nodes: Iterable[str] = (),
              omit: Iterable[tuple[str, str]] = (), within: str | None = None) -> None:
        """`check_edges(edges, self, nodes, omit, within)`."""
        check_edges(edges, self, nodes, omit, within)


def check_edges(edges: Iterable[tuple[str, str]], flow: Dataflow, nodes: Iterable[str] = (),
                omit: Iterable[tuple[str, str]] = (), within: str | None = None) -> None:
    """Hold a drawing's arrows (source name, result name) against a recorded computation.

    The drawing shows the tensors at the ends of its arrows and those in `nodes`. Each arrow
    A -> B must be a dependency that passes through no other shown tensor (or join two names
    of one tensor); each such dependency between shown tensors must be drawn, or listed in
    `omit` (a dependency the drawing leaves out on purpose). A drawing of one module call
    (`within` its name, "blocks.0") follows paths inside that call only. Raises ValueError
    naming every wrong and every missing arrow.
    """
    if not isinstance(flow, Dataflow):
        raise TypeError(f"flow must be a Dataflow (from dataflow(model, ...)), got "
                        f"{type(flow).__name__}")
    edges, omit = _pairs(edges, "edges"), _pairs(omit, "omit")
    nodes = list(nodes)
    if not all(isinstance(n, str) for n in nodes):
        raise TypeError(f"nodes must be names (str), got {nodes!r:.80}")
    shown = {n for e in edges for n in e} | set(nodes)
    vertex = {n: flow.vertex(n) for n in shown | {n for e in omit for n in e}}
    stop = {vertex[n] for n in shown}
    succ = flow._successors()
    inside = None if within is None else flow.within(within)
    if inside is not None and not inside:
        raise ValueError(f"no tensor of a call {within!r} in this computation")
    reach = {v: flow._reach(v, stop, succ, inside) for v in stop}
    drawn = {(vertex[a], vertex[b]) for a, b in edges}
    left_out = {(vertex[a], vertex[b]) for a, b in omit}
    wrong = []
    for a, b in edges:
        va, vb = vertex[a], vertex[b]
        if va == vb or vb in reach[va]:
            continue
        if vb in flow._reach_all(va, succ):  # computed from it, but through shown tensors
            via = sorted(flow.name_of(v) for v in reach[va]
                         if vb in flow._reach_all(v, succ))
            wrong.append(f"{a} -> {b} (only through {', '.join(via)}, which the drawing "
                         "shows)")
        else:
            wrong.append(f"{a} -> {b} ({b} is not computed from {a})")
    missing = [f"{flow.name_of(va)} -> {flow.name_of(vb)}" for va in sorted(stop)
               for vb in sorted(reach[va]) if (va, vb) not in drawn | left_out]
    if wrong or missing:
        raise ValueError("the drawing's arrows disagree with the computation: "
                         + "; ".join((["wrong: " + ", ".join(wrong)] if wrong else [])
                                     + (["missing: " + ", ".join(missing)] if missing else [])))


def _pairs(pairs: object, what: str) -> list[tuple[str, str]]:
    out = list(pairs) if isinstance(pairs, Iterable) else None
    if out is None or not all(isinstance(p, tuple) and len(p) == 2
                              and all(isinstance(n, str) for n in p) for p in out):
        raise TypeError(f"{what} must be (source name, result name) pairs, got {pairs!r:.80}")
    return out


def _tensors(value: Any) -> Iterator[Tensor]:
    """The tensors in an argument or result (tuples, lists and dicts looked into)."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _main_tensor(output: Any) -> Tensor | None:
    """The tensor a module call stands for: itself, a tuple's first, a ModelOutput's logits."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0]
    for name in ("logits", "last_hidden_state"):
        if isinstance(getattr(output, name, None), Tensor):
            return getattr(output, name)
    return None


class Recorder(TorchFunctionMode):
    """Records a `Dataflow` while active: `with Recorder(model) as rec: model(x)`, then
    `rec.flow`. Hooks on every module of `model` (if given) name their calls' inputs and
    outputs; `rec.name(tensor, name)` names any other tensor; `rec.steps(rules)` names the
    results of operations by their order; `prefix` goes before every name given from then on
    (two passes of one model: "prefill.", "decode.")."""

    def __init__(self, model: nn.Module | None = None) -> None:
        super().__init__()
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"Recorder needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.flow = Dataflow()
        self.prefix = ""
        # id(tensor) -> (tensor, its sources, whether it is a named tensor itself); the
        # tensor is kept alive so that its id cannot be reused by another while recording
        self._entries: dict[int, tuple[Tensor, frozenset[int], bool]] = {}
        self._stack: list[str] = []  # the module calls under way, by name
        self._calls: dict[str, int] = {}  # how many calls of each module began
        self._attention: list[dict] = []  # the attention calls under way: names so far
        self._rules: list[tuple[dict, dict, str]] = []  # active `steps`: rules, counts, base
        self._undo: list[Any] = []

    # -- naming -----------------------------------------------------------------------------
    def name(self, tensor: Tensor, name: str) -> None:
        """Give `tensor` the name prefix + `name` (an alias if it has one already)."""
        if not isinstance(tensor, Tensor):
            raise TypeError(f"only a tensor can be named, got {type(tensor).__name__}")
        name = self.prefix + name
        entry = self._entries.get(id(tensor))
        if entry is not None and entry[2]:  # a named tensor: one more name for it
            (vertex,) = entry[1]
            self.flow.alias(name, vertex)
            return
        vertex = self.flow.add(name, entry[1] if entry else ())
        self._entries[id(tensor)] = (tensor, frozenset({vertex}), True)

    def alias(self, name: str, existing: str) -> None:
        """Another name (prefix + `name`) for the tensor named prefix + `existing`."""
        self.flow.alias(self.prefix + name, self.prefix + existing)

    def name_all(self, tensors: list[Tensor], name: str, sources: tuple[str, ...] = ()) -> None:
        """One name for a group of tensors (a model's gradients, its parameters), computed
        from what they were computed from, and from the tensors named in `sources` (what
        autograd's backward, which runs outside Python, computed them from)."""
        if not tensors or not all(isinstance(t, Tensor) for t in tensors):
            raise TypeError("name_all needs a non-empty list of tensors")
        came_from = self._sources(tensors) | {self.flow.vertex(self.prefix + n) for n in sources}
        vertices = {next(iter(e[1])) for t in tensors
                    if (e := self._entries.get(id(t))) is not None and e[2]}
        if len(vertices) == 1 and came_from == frozenset(vertices) and all(
                id(t) in self._entries for t in tensors):  # all one named group: an alias
            self.flow.alias(self.prefix + name, vertices.pop())
            return
        vertex = self.flow.add(self.prefix + name, came_from)
        for t in tensors:
            self._entries[id(t)] = (t, frozenset({vertex}), True)

    @contextmanager
    def steps(self, rules: dict[str, tuple], base: str = "") -> Iterator[None]:
        """While active, name tensors by the order of the operations that make or use them:
        `rules` maps an operation's name without underscores ("matmul", "softmax") to one
        entry per call: None, or (where, name) with where "out" (its result) or "arg0" (its
        first argument, named as it is used); `base` goes before each name."""
        self._rules.append((rules, {}, base))
        try:
            yield
        finally:
            self._rules.pop()

    def _sources(self, value: Any) -> frozenset[int]:
        out: frozenset[int] = frozenset()
        for t in _tensors(value):
            entry = self._entries.get(id(t))
            if entry is not None:
                out |= entry[1]
        return out

    def _derive(self, tensor: Tensor, sources: frozenset[int]) -> None:
        if sources:
            self._entries[id(tensor)] = (tensor, sources, False)

    # -- every tensor operation -------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        op = getattr(func, "__name__", "")
        rule = self._rule(op)
        if rule is not None and rule[0] == "arg0" and args and isinstance(args[0], Tensor):
            self.name(args[0], rule[1])
        out = func(*args, **kwargs)
        if op in NO_DATA:
            return out
        sources = self._sources(args) | self._sources(kwargs)
        if (op.endswith("_") and not op.endswith("__")) or op in IN_PLACE_DUNDER:
            target = args[0] if args and isinstance(args[0], Tensor) else None
            if target is not None and sources:  # a new value in the same tensor, and in every
                # tensor that shares its memory (its base, a detached alias, a view of it)
                memory = target.untyped_storage().data_ptr()
                sharing = [e[0] for e in self._entries.values() if memory
                           and e[0].untyped_storage().data_ptr() == memory]
                for t in {id(t): t for t in [target, *sharing]}.values():
                    self._derive(t, sources | self._sources(t))
            return out
        for t in _tensors(out):
            self._derive(t, sources)
        if rule is not None and rule[0] == "out" and isinstance(out, Tensor):
            self.name(out, rule[1])
        return out

    def _rule(self, op: str) -> tuple[str, str] | None:
        """The naming rule of this call of `op` under the active `steps`, if any."""
        if not self._rules:
            return None
        rules, seen, base = self._rules[-1]
        key = op.strip("_")
        if key not in rules:
            return None
        n = seen.get(key, 0)
        seen[key] = n + 1
        entry = rules[key][n] if n < len(rules[key]) else None
        return None if entry is None else (entry[0], base + entry[1])

    # -- hooks on modules -------------------------------------------------------------------
    def _before(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            calls = self._calls.get(self.prefix + name, 0)  # counted anew for each prefix
            self._calls[self.prefix + name] = calls + 1
            base = name if calls == 0 else f"{name}#{calls}"
            self._stack.append(base)
            try:
                bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
                params = list(bound.arguments.items())
            except TypeError:
                params = list(enumerate(args))
            for param, value in params:
                if isinstance(value, Tensor):
                    self.name(value, f"{base}:{param}" if base else str(param))
            if self._attention and self._attention[-1]["module"] is module:
                self._attention[-1]["base"] = f"{base}." if base else ""
        return hook

    def _after(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            base = self._stack.pop()
            main = _main_tensor(output)
            if main is not None:
                self.name(main, base or "output")
            loss = getattr(output, "loss", None)
            if not base and isinstance(loss, Tensor):  # a model's output with its loss
                self.name(loss, "loss")
        return hook

    def _watch_attention(self, module: nn.Module) -> None:
        plain_split = module.split_heads
        had = "split_heads" in vars(module)

        def split_heads(x: Tensor, n_heads: int | None = None) -> Tensor:
            out = plain_split(x, n_heads)
            state = self._attention[-1]
            if state["split"] < 3:
                self.name(out, state["base"] + ("q", "k", "v")[state["split"]])
            state["split"] += 1
            return out

        def before(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            self._attention.append({"module": module, "base": "", "split": 0})
            if len(args) < 7:  # need_weights not given by position: take the reference path
                kwargs = {**kwargs, "need_weights": True}
            return args, kwargs

        def after(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            self._attention.pop()

        def merged(mod: nn.Module, args: tuple) -> None:
            if self._attention and args and isinstance(args[0], Tensor):
                self.name(args[0], self._attention[-1]["base"] + "merged")

        module.split_heads = split_heads  # type: ignore[method-assign]
        handles = [module.register_forward_pre_hook(before, with_kwargs=True, prepend=True),
                   module.register_forward_hook(after, with_kwargs=True),
                   module.out_proj.register_forward_pre_hook(merged)]
        self._undo.append(lambda: [h.remove() for h in handles])
        self._undo.append(lambda: setattr(module, "split_heads", plain_split) if had
                          else delattr(module, "split_heads"))

    def _watch_activation(self, module: nn.Module) -> None:
        act = vars(module).get("act")
        if act is None or isinstance(act, nn.Module) or not callable(act):
            return

        def named_act(x: Tensor) -> Tensor:
            out = act(x)
            self.name(out, f"{self._stack[-1]}.act" if self._stack[-1] else "act")
            return out

        module.act = named_act
        self._undo.append(lambda: setattr(module, "act", act))

    @contextmanager
    def _attention_steps(self) -> Iterator[None]:
        """Name the steps inside `scaled_dot_product_attention` and what the cache returns."""
        import tfbook.attention as attention_module
        from tfbook.cache import LayerCache

        plain_sdpa = attention_module.scaled_dot_product_attention
        plain_update = LayerCache.update
        rules = {op: tuple(("out", n) for n in names) for op, names in ATTENTION_STEPS.items()}

        def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                 dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
            base = self._attention[-1]["base"] if self._attention else ""  # "": a bare call
            with self.steps(rules, base):
                out = plain_sdpa(q, k, v, mask, dropout_p)
            named = self.prefix + base
            if named + "masked" not in self.flow and named + "scaled" in self.flow:
                self.flow.alias(named + "masked", named + "scaled")  # no mask: the same
            return out

        def update(cache: LayerCache, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            keys, values = plain_update(cache, k, v)
            if self._attention:
                self.name(keys, self._attention[-1]["base"] + "keys")
                self.name(values, self._attention[-1]["base"] + "values")
            return keys, values

        attention_module.scaled_dot_product_attention = sdpa
        LayerCache.update = update  # type: ignore[method-assign]
        try:
            yield
        finally:
            attention_module.scaled_dot_product_attention = plain_sdpa
            LayerCache.update = plain_update  # type: ignore[method-assign]

    # -- the context ------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        from tfbook.attention import MultiHeadAttention
        from tfbook.hooks import HookPoint

        if self.model is not None:
            for name, module in self.model.named_modules():
                if isinstance(module, HookPoint):
                    continue  # the identity: its tensor is named by the steps around it
                if isinstance(module, MultiHeadAttention):
                    self._watch_attention(module)
                self._watch_activation(module)
                handles = [module.register_forward_pre_hook(self._before(name),
                                                            with_kwargs=True),
                           module.register_forward_hook(self._after(name), with_kwargs=True)]
                self._undo.append(lambda hs=handles: [h.remove() for h in hs])
        self._patches = self._attention_steps()
        self._patches.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._patches.__exit__(None, None, None)
            for undo in reversed(self._undo):
                undo()
            self._undo.clear()


def dataflow(model: nn.Module, *args: Any, **kwargs: Any) -> Dataflow:
    """Run `model(*args, **kwargs)` once (no gradients) and record which named tensor was
    computed from which (names: the module's docstring)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"dataflow needs a torch.nn.Module, got {type(model).__name__}")
    with torch.no_grad(), Recorder(model) as rec:
        model(*args, **kwargs)
    return rec.flow


__all__ = ["Dataflow", "Recorder", "check_edges", "dataflow"]
