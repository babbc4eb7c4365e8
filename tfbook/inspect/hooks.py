"""Reading and changing a model's run by name: hook points, an activation cache, interventions.

    names = hook_names(model)                          # every hook point, in the order of a pass
    out, cache = run_with_cache(model, ids)            # cache["blocks.3.residual_post"] (B, T, C)
    with hooks(model, {"blocks.3.attn.heads": zero(heads=[4])}):
        out = model(ids)                               # the run with head 3.4 silenced

A hook point (tfbook.hooks.HookPoint) is named by its path in the model. A hook is a function
`fn(tensor, name)` that returns None (only read) or the tensor to use instead; `hooks` puts
hooks in place for the runs inside its `with` block and removes every one of them on the way
out, even when the run fails. `replace`, `add`, `zero` and `patch` build the common hooks;
each takes the positions (and for per-head tensors the heads) it acts on.

Each name's tensor and its axes (B batch, T positions, H heads, S key positions, C width,
F feed-forward width, D head size):

    ...residual_pre / _mid / _cross / _post    (B, T, C)   the residual stream
    ...attn.q                                  (B, H, T, D)   before RoPE
    ...attn.k, ...attn.v                       (B, H_kv, T, D)
    ...attn.weights                            (B, H, T, S)
    ...attn.heads                              (B, H, T, D)   weights @ V, before W_O
    ...attn.out, ...ff.out                     (B, T, C)   what each sub-layer adds
    ...ff.hidden                               (B, T, F)
"""

from __future__ import annotations

import difflib
import fnmatch
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from tfbook.hooks import HookPoint

Hook = Callable[[Tensor, str], Tensor | None]

# the order in which a block's points fire, by the end of their names
ORDER = ("residual_pre", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.heads", "attn.out",
         "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.weights", "self_attn.heads",
         "self_attn.out", "residual_mid", "cross_attn.q", "cross_attn.k", "cross_attn.v",
         "cross_attn.weights", "cross_attn.heads", "cross_attn.out", "residual_cross",
         "ff.hidden", "ff.out", "residual_post")
# which axis holds the positions, and which the heads (None: no heads), by the last part
AXES = {"q": (2, 1), "k": (2, 1), "v": (2, 1), "weights": (2, 1), "heads": (2, 1),
        "out": (1, None), "hidden": (1, None), "residual_pre": (1, None),
        "residual_mid": (1, None), "residual_cross": (1, None), "residual_post": (1, None)}


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of `model` by name, in the order they fire in a forward pass."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch module (a tfbook model), got {type(model).__name__}")
    modules = dict(model.named_modules())
    points = {name: m for name, m in modules.items() if isinstance(m, HookPoint)}
    position = {name: i for i, name in enumerate(modules)}  # definition order of the modules

    def owner(name: str) -> tuple[int, int]:
        """(position of the block that holds the point, its rank within the block)."""
        rank = next((i for i, end in enumerate(ORDER) if name == end or name.endswith("." + end)),
                    len(ORDER))
        block = name[: len(name) - len(ORDER[rank])].rstrip(".") if rank < len(ORDER) else name
        return position.get(block, 0), rank

    return {name: points[name] for name in sorted(points, key=owner)}


def hook_names(model: nn.Module, pattern: str = "*") -> list[str]:
    """The names of `model`'s hook points that match `pattern` (shell-style: "*", "?"), in
    the order they fire: hook_names(model, "*.residual_post")."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str such as '*.residual_post', got {pattern!r:.60}")
    return [n for n in hook_points(model) if fnmatch.fnmatchcase(n, pattern)]


def check_names(model: nn.Module, names: Sequence[str]) -> dict[str, HookPoint]:
    """The hook points called `names`; an unknown name is refused with the names that exist."""
    points = hook_points(model)
    if not points:
        raise ValueError(f"{type(model).__name__} has no hook points (tfbook.hooks.HookPoint): "
                         "it is not a tfbook model, or has no blocks")
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"expected a list of hook names, got {names!r:.80}")
    for name in names:
        if name not in points:
            close = difflib.get_close_matches(name, points, n=3, cutoff=0.6)
            suffixes = sorted({n.split(".", 2)[-1] for n in points})
            raise KeyError(
                f"{type(model).__name__} has no hook point {name!r}"
                + (f"; did you mean {', '.join(map(repr, close))}?" if close else "")
                + f" Its {len(points)} names are 'blocks.<i>.' + one of {suffixes} "
                "(hook_names(model) lists them all)"
            )
    return {n: points[n] for n in names}


@contextmanager
def hooks(model: nn.Module, fns: Mapping[str, Hook]) -> Iterator[None]:
    """Run `model` with `fns[name](tensor, name)` at each named hook point inside the block.

    A hook returns None (it only reads) or a tensor of the same shape to use instead. Every
    hook is removed on leaving the block, whether the run succeeded or raised.
    """
    if not isinstance(fns, Mapping) or not all(callable(f) for f in fns.values()):
        raise TypeError(f"expected a dict of hook name -> function(tensor, name), got "
                        f"{fns!r:.120}")
    points = check_names(model, list(fns))
    handles = []
    try:
        for name, fn in fns.items():
            handles.append(points[name].register_forward_hook(_checked(fn, name)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _checked(fn: Hook, name: str) -> Callable[[nn.Module, tuple, Tensor], Tensor | None]:
    """A torch forward hook that calls fn(tensor, name) and checks what it returns."""

    def hook(_module: nn.Module, _args: tuple, output: Tensor) -> Tensor | None:
        result = fn(output, name)
        if result is None:
            return None
        if not isinstance(result, Tensor) or result.shape != output.shape:
            got = tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__
            raise ValueError(f"the hook on {name!r} must return None or a tensor of the "
                             f"shape it was given, {tuple(output.shape)}; got {got}")
        return result.to(output.dtype)

    return hook


class ActivationCache(Mapping[str, Tensor]):
    """The tensors of one run at the hook points that were watched, by name."""

    def __init__(self, tensors: dict[str, Tensor], model_name: str = "model") -> None:
        self._tensors = tensors
        self._model_name = model_name

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._tensors:
            close = difflib.get_close_matches(str(name), self._tensors, n=3, cutoff=0.6)
            raise KeyError(f"this cache of {self._model_name} holds no {name!r}"
                           + (f"; did you mean {', '.join(map(repr, close))}?" if close else "")
                           + f" It holds {len(self._tensors)} names, from "
                           f"{next(iter(self._tensors), None)!r} to "
                           f"{next(reversed(self._tensors), None)!r}")
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} tensors of {self._model_name})"

    def stack(self, suffix: str) -> Tensor:
        """Every layer's tensor whose name ends in `suffix`, stacked: stack("residual_post")
        -> (L, B, T, C)."""
        found = [t for n, t in self._tensors.items() if n.endswith("." + suffix)]
        if not found:
            raise KeyError(f"this cache holds no name ending in {suffix!r}")
        return torch.stack(found)


def run_with_cache(
    model: nn.Module, *args: Any, names: Sequence[str] | str | None = None,
    keep_graph: bool = False, **kwargs: Any,
) -> tuple[Any, ActivationCache]:
    """Run `model(*args, **kwargs)` once and keep the tensor at each hook point.

    `names`: a list of hook names, a pattern ("*.residual_post"), or None for all of them.
    The tensors are detached copies unless `keep_graph` (then gradients can flow back to
    them, as attribution patching needs).
    """
    if names is None or isinstance(names, str):
        names = hook_names(model, "*" if names is None else names)
        if not names:
            check_names(model, [])  # a model without hook points says so
            raise KeyError(f"no hook point of {type(model).__name__} matches the pattern given")
    tensors: dict[str, Tensor] = {}

    def keep(t: Tensor, name: str) -> None:
        tensors[name] = t if keep_graph else t.detach().clone()

    with hooks(model, {n: keep for n in names}):
        out = model(*args, **kwargs)
    return out, ActivationCache({n: tensors[n] for n in names if n in tensors},
                                type(model).__name__)


# -- interventions: hooks that change a tensor ------------------------------------------------

class OutOfRange(ValueError, IndexError):
    """A position or head outside the tensor (a ValueError, and an IndexError)."""


def _where(name: str, t: Tensor, positions: Any, heads: Any) -> Tensor:
    """A boolean mask, broadcastable to t (named `name`), True at the chosen `positions` and
    `heads` (None: all of them)."""
    pos_axis, head_axis = AXES.get(name.rsplit(".", 1)[-1], (1, None))
    mask = torch.ones((1,) * t.dim(), dtype=torch.bool, device=t.device)
    for what, chosen, axis in (("positions", positions, pos_axis), ("heads", heads, head_axis)):
        if chosen is None:
            continue
        if axis is None:
            raise ValueError(f"{name!r} (B, T, width) has no heads to choose; pass heads=None")
        items = chosen.tolist() if isinstance(chosen, Tensor) else chosen
        items = [items] if isinstance(items, numbers.Integral) else items
        if not isinstance(items, Sequence) or isinstance(items, str) or not all(
                isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in items):
            raise TypeError(f"{what} must be an int or a list of ints, got {chosen!r:.60}")
        size = t.size(axis)
        bad = [i for i in items if not -size <= i < size]
        if bad:
            raise OutOfRange(f"{what} {bad} are out of range for {name!r}, whose axis {axis} "
                             f"has {size} entries (shape {tuple(t.shape)})")
        shape = [1] * t.dim()
        shape[axis] = size
        chosen_mask = torch.zeros(size, dtype=torch.bool, device=t.device)
        chosen_mask[list(items)] = True
        mask = mask & chosen_mask.view(shape)
    return mask


def _fit(value: Tensor | float, t: Tensor, name: str) -> Tensor:
    """`value` as a tensor of t's dtype that broadcasts to t's shape."""
    if not isinstance(value, Tensor | numbers.Real) or isinstance(value, bool):
        raise TypeError(f"value must be a number or a tensor, got {type(value).__name__}")
    v = torch.as_tensor(value, dtype=t.dtype, device=t.device)
    try:
        torch.broadcast_shapes(v.shape, t.shape)
    except RuntimeError:
        raise ValueError(f"a value of shape {tuple(v.shape)} does not broadcast to {name!r}, of "
                         f"shape {tuple(t.shape)} (give one of its trailing shapes, e.g. the "
                         "width)") from None
    return v


def replace(value: Tensor | float, positions: Any = None, heads: Any = None) -> Hook:
    """A hook that sets the chosen positions (and heads) to `value`, which broadcasts to the
    tensor (a number, a vector of its width, or a tensor of its shape)."""
    def hook(t: Tensor, name: str) -> Tensor:
        return torch.where(_where(name, t, positions, heads), _fit(value, t, name), t)
    return hook


def add(value: Tensor | float, positions: Any = None, heads: Any = None) -> Hook:
    """A hook that adds `value` (e.g. a steering vector of width C) at the chosen places."""
    def hook(t: Tensor, name: str) -> Tensor:
        return torch.where(_where(name, t, positions, heads), t + _fit(value, t, name), t)
    return hook


def zero(positions: Any = None, heads: Any = None) -> Hook:
    """A hook that sets the chosen places to zero (zero-ablation)."""
    return replace(0.0, positions, heads)


def patch(source: Mapping[str, Tensor], positions: Any = None, heads: Any = None) -> Hook:
    """A hook that copies the chosen places from another run's tensor of the same name
    (an ActivationCache of the clean run): activation patching."""
    if not isinstance(source, Mapping):
        raise TypeError(f"source must be an ActivationCache (run_with_cache), got "
                        f"{type(source).__name__}")

    def hook(t: Tensor, name: str) -> Tensor:
        other = source[name]
        if other.shape != t.shape:
            raise ValueError(
                f"cannot patch {name!r}: the source run's tensor has shape {tuple(other.shape)} "
                f"and this run's {tuple(t.shape)}; patching needs runs of the same batch and "
                "length (prompts of equally many tokens)")
        return torch.where(_where(name, t, positions, heads), other.to(t.dtype), t)
    return hook
