"""Activation patching and attribution patching: which activations carry the answer.

    mary, john = tok.encode(" Mary")[0], tok.encode(" John")[0]
    clean = tok.encode("When Mary and John went to the store, John gave a drink to")
    corrupted = tok.encode("When Mary and John went to the store, Mary gave a drink to")
    metric = lambda logits: logit_diff(logits, mary, john)           # (B,) per prompt
    grid = activation_patching(model, clean, corrupted, metric, "residual_pre")
    grid.values      # (L, T): the metric with one layer's stream patched at one position
    grid.restored    # (L, T): 0 = as the corrupted run, 1 = as the clean run
    approx = attribution_patching(model, clean, corrupted, metric, "residual_pre")
    disagreements(grid, approx)                                     # where the estimate fails

Activation patching (Meng et al. 2022; Wang et al. 2022; Heimersheim & Nanda 2024) runs the
CORRUPTED prompt, copies in the CLEAN run's activation at one place, and measures how much of
the clean answer comes back. One grid cell per place: the residual stream of each layer at
each position (`"residual_pre"`, ...), or each head of each layer over all positions
(`"attn.heads"`, the head's output before W_O; `"attn.q"`, `"attn.k"`, `"attn.v"`;
`"attn.weights"`, its pattern). A layer's cells run as one batch: copy j of the corrupted
prompt is patched at cell j, so a sweep costs one forward pass per layer, not one per cell.

Attribution patching (Syed et al. 2023) replaces every patched run by a first-order Taylor
estimate at the corrupted run: metric(corrupted) + sum over the cell of
d metric / d activation * (clean - corrupted). A clean forward pass and one corrupted
forward and backward pass estimate every cell of every grid. The estimate is exact where the
metric is linear in the activation and fails where it is far from linear over the change:
the residual stream at a token the prompts differ in (a whole embedding swapped), a softmax
that saturates, a layer where the information moves from one position to another.

Grids follow TransformerLens's `patching.get_act_patch_*` (axes [layer, pos] and
[layer, head]; REFERENCE names the function for each `what`). With grouped key/value heads
(SmolLM2: 9 query heads share 3 key/value heads) the "attn.k" and "attn.v" grids have one
column per key/value head: patching it changes the keys (values) of its whole group of query
heads, as TransformerLens does (its k/v grids have n_key_value_heads columns).
"""

from __future__ import annotations

import numbers
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from tqdm import tqdm

from tfbook.inspect.attribution import gamma
from tfbook.inspect.hooks import AXES, check_names, hook_names, hooks, patch, run_with_cache
from tfbook.models.output import ModelOutput

Metric = Callable[[Tensor], Tensor]

# what can be patched in each layer, and the axis of its grid's columns
WHAT = {"residual_pre": "position", "residual_mid": "position", "residual_post": "position",
        "attn.out": "position", "ff.hidden": "position", "ff.out": "position",
        "attn.heads": "head", "attn.q": "head", "attn.k": "kv_head", "attn.v": "kv_head",
        "attn.weights": "head"}
# the TransformerLens 4.3 function (transformer_lens.patching) that computes the same grid
REFERENCE = {"residual_pre": "get_act_patch_resid_pre", "residual_mid": "get_act_patch_resid_mid",
             "attn.out": "get_act_patch_attn_out", "ff.out": "get_act_patch_mlp_out",
             "attn.heads": "get_act_patch_attn_head_out_all_pos",
             "attn.q": "get_act_patch_attn_head_q_all_pos",
             "attn.k": "get_act_patch_attn_head_k_all_pos",
             "attn.v": "get_act_patch_attn_head_v_all_pos",
             "attn.weights": "get_act_patch_attn_head_pattern_all_pos"}


# -- the prompt pairs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptPair:
    """A clean prompt, a corrupted prompt of as many tokens that changes the answer, and the
    two one-token answers the metric compares: logit(answer) - logit(wrong) at the last
    position is positive on the clean run and negative on the corrupted one."""

    name: str  # a short key, e.g. "ioi"
    clean: str
    corrupted: str
    answer: str  # the clean prompt's answer, with its leading space: " Mary"
    wrong: str  # the corrupted prompt's answer

    def encode(self, tokenizer: Any) -> tuple[list[int], list[int], int, int]:
        """(clean ids, corrupted ids, answer id, wrong id) by `tokenizer.encode_ordinary`; a
        ValueError unless the prompts have equally many tokens and each answer is one."""
        clean, corrupted, answer, wrong = (tokenizer.encode_ordinary(t) for t in (
            self.clean, self.corrupted, self.answer, self.wrong))
        if len(clean) != len(corrupted) or len(answer) != 1 or len(wrong) != 1:
            raise ValueError(
                f"prompt pair {self.name!r}: the prompts must have equally many tokens and each "
                f"answer must be one token; got {len(clean)} and {len(corrupted)} tokens, "
                f"answers of {len(answer)} and {len(wrong)}")
        return clean, corrupted, answer[0], wrong[0]


# The book's two pairs. Indirect object (Wang et al. 2022): the second mention of the subject
# becomes the other name, so the answer changes from " Mary" to " John". Factual recall (Meng
# et al. 2022): another landmark of as many tokens (" E", "iffel", " Tower" / " Col", "osse",
# "um" in SmolLM2's tokenizer), so the answer changes from " Paris" to " Rome".
IOI = PromptPair("ioi", "When Mary and John went to the store, John gave a drink to",
                 "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")
FACTUAL = PromptPair("factual", "The Eiffel Tower is located in the city of",
                     "The Colosseum is located in the city of", " Paris", " Rome")
PAIRS = {pair.name: pair for pair in (IOI, FACTUAL)}


# -- how far two runs may differ ----------------------------------------------------------------

def replay_bound(config: Any, n_tokens: int, metrics: Sequence[float],
                 dtype: torch.dtype = torch.float32) -> float:
    """A rounding budget for a metric (a logit difference) computed twice by the same model on
    the same input, the two runs summing in different orders (two machines, two kernel sets,
    a batch against one prompt): 2 gamma_n (1 + max |metric|).

    The forward error of a sum of n products is at most gamma_n = n u / (1 - n u) times the
    sum of their magnitudes (Higham, "Accuracy and stability", 2002, eq. 3.5; u the unit
    roundoff of `dtype`). n is the longest chain of sums from the input to a logit: per layer
    the first norm's mean of squares (C terms), a query/key/value (C), a score (D), the mix of
    values (T), W_O (C), the second norm (C), the FFN's first product (C) and its second (F);
    then the final norm (C) and the unembedding (C). The magnitudes are taken at the scale of
    the metrics given (1 + the largest |metric|); each run is within the budget of the exact
    value, hence the 2. It is a budget, not a proof: a nonlinear layer can amplify an error
    (a softmax near a tie), and it is used where the measured differences lie far below it.

    config: a model config with n_layers, d_model, n_heads and d_ff (None: 4C).
    Example (SmolLM2-135M, 15 tokens, metrics 6.1 and -5.5): about 0.12.
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Integral) or n_tokens < 1:
        raise ValueError(f"n_tokens must be a positive int, got {n_tokens!r:.40}")
    metrics = [float(m) for m in metrics]
    if not metrics:
        raise ValueError("metrics is empty: give the metric values the runs produce, e.g. the "
                         "clean and corrupted logit differences")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype, got {dtype!r:.40}")
    C, H = config.d_model, config.n_heads
    F = config.d_ff if getattr(config, "d_ff", None) else 4 * C
    n = config.n_layers * (5 * C + C // H + n_tokens + F) + 2 * C
    return 2 * gamma(n, torch.finfo(dtype).eps / 2) * (1 + max(abs(m) for m in metrics))


# -- the metric ---------------------------------------------------------------------------------

def logit_diff(logits: Tensor | ModelOutput, answer: Any, wrong: Any,
               position: int = -1) -> Tensor:
    """logit[answer] - logit[wrong] at `position` of each prompt: (B, T, V) -> (B,).

    `answer` and `wrong` are token ids: one int for every prompt, or one per prompt (B,).
    Positive when the model prefers the answer; the difference of two logits is also the log
    of the ratio of their probabilities, whatever the other tokens get.
    """
    if isinstance(logits, ModelOutput):
        logits = logits.logits
    if not isinstance(logits, Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        got = (f"shape {tuple(logits.shape)} ({logits.dtype})" if isinstance(logits, Tensor)
               else type(logits).__name__)
        raise TypeError(f"logits must be a float tensor (B, T, V), got {got}")
    B, T, V = logits.shape
    if not isinstance(position, numbers.Integral) or isinstance(position, bool):
        raise TypeError(f"position must be an int, got {position!r:.40}")
    if not -T <= position < T:
        raise ValueError(f"position {position} is out of range for logits of {T} positions "
                         f"(expected -{T} <= position < {T})")
    ids = [_token_ids(x, what, B, V) for x, what in ((answer, "answer"), (wrong, "wrong"))]
    rows = logits[:, position]  # (B, V)
    pick = [rows.gather(1, i.to(rows.device).expand(B)[:, None])[:, 0] for i in ids]  # (B,)
    return pick[0] - pick[1]


def _token_ids(x: Any, what: str, B: int, V: int) -> Tensor:
    """`x` (an int, or one int per prompt) as a long tensor of shape () or (B,), in [0, V)."""
    items = x.tolist() if isinstance(x, Tensor) else x
    single = isinstance(items, numbers.Integral) and not isinstance(items, bool)
    if not single and not (isinstance(items, Sequence) and not isinstance(items, str) and all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in items)):
        raise TypeError(f"{what} must be a token id (an int) or one per prompt, got "
                        f"{x!r:.60} ({type(x).__name__}); encode a text with the tokenizer "
                        "first, e.g. tok.encode(' Mary')[0]")
    if not single and len(items) != B:
        raise ValueError(f"{what} gives {len(items)} token ids for {B} prompts: give one int, or "
                         f"one per prompt")
    bad = [i for i in ([items] if single else items) if not 0 <= i < V]
    if bad:
        raise ValueError(f"{what} token ids {bad} lie outside the vocabulary [0, {V})")
    return torch.tensor(items, dtype=torch.long)


def restored_fraction(patched: Tensor | float, clean: Tensor | float,
                      corrupted: Tensor | float) -> Tensor:
    """(patched - corrupted) / (clean - corrupted): 0 where the patch did nothing, 1 where it
    brought the clean run's metric back (it may overshoot either end)."""
    patched, clean, corrupted = (torch.as_tensor(x, dtype=torch.float64)
                                 for x in (patched, clean, corrupted))
    if torch.any(clean == corrupted):
        raise ValueError(f"the clean and corrupted metrics are equal ({clean.tolist()}): there "
                         "is nothing to restore; choose a corruption that changes the answer")
    return (patched - corrupted) / (clean - corrupted)


# -- results ------------------------------------------------------------------------------------

class Cell(NamedTuple):
    """One cell of a grid: its layer, column index and label, metric value and restored
    fraction."""

    layer: int
    index: int
    label: str
    value: float
    restored: float


class Disagreement(NamedTuple):
    """A cell where attribution patching's estimate and activation patching differ, both as
    restored fractions."""

    layer: int
    index: int
    label: str
    activation: float
    attribution: float

    @property
    def difference(self) -> float:
        """attribution - activation."""
        return self.attribution - self.activation


@dataclass(frozen=True)
class PatchingResult:
    """A patching grid: the metric with each cell patched, and what it is measured against.

    `values` (L, N) is the metric after patching one cell (attribution: its linear estimate),
    rows the layers in `layers`, columns the positions, heads or key/value heads (`axes`).
    TransformerLens's grids have the same axis order ([layer, pos], [layer, head]).
    """

    values: Tensor  # (L, N), float64
    what: str  # the hook point patched in each layer, e.g. "residual_pre" or "attn.heads"
    axes: tuple[str, str]  # ("layer", "position" | "head" | "kv_head")
    layers: tuple[int, ...]  # the layer of each row
    labels: tuple[str, ...]  # a label for each column
    clean: float  # the metric on the clean run
    corrupted: float  # the metric on the corrupted run, nothing patched
    method: str  # "activation" or "attribution"
    cpu_seconds: float  # process CPU time the sweep took
    forward_passes: int  # the forward passes it ran, the clean and corrupted runs included

    @property
    def restored(self) -> Tensor:
        """(values - corrupted) / (clean - corrupted), (L, N): 1 = the clean metric back."""
        return restored_fraction(self.values, self.clean, self.corrupted)

    def top(self, k: int = 5) -> list[Cell]:
        """The `k` cells that restore most, largest first."""
        k = _positive_int(k, "k")
        restored = self.restored
        order = restored.flatten().argsort(descending=True, stable=True)[:k].tolist()
        N = restored.size(1)
        return [Cell(self.layers[i // N], i % N, self.labels[i % N],
                     float(self.values.flatten()[i]), float(restored.flatten()[i]))
                for i in order]

    def __repr__(self) -> str:
        L, N = self.values.shape
        return (f"PatchingResult({self.method} patching of {self.what!r}: {L} layers x {N} "
                f"{self.axes[1]}s, clean {self.clean:.3f}, corrupted {self.corrupted:.3f})")


def disagreements(activation: PatchingResult, attribution: PatchingResult,
                  k: int = 5) -> list[Disagreement]:
    """The `k` cells where two grids of the same place differ most in restored fraction
    (typically activation patching and attribution patching's estimate of it)."""
    for name, r in (("activation", activation), ("attribution", attribution)):
        if not isinstance(r, PatchingResult):
            raise TypeError(f"{name} must be a PatchingResult, got {type(r).__name__}")
    if (activation.what, activation.layers, activation.labels) != (
            attribution.what, attribution.layers, attribution.labels):
        raise ValueError(
            f"the grids cover different places: {activation.what!r} at layers "
            f"{list(activation.layers)} x {len(activation.labels)} columns, and "
            f"{attribution.what!r} at layers {list(attribution.layers)} x "
            f"{len(attribution.labels)} columns")
    k = _positive_int(k, "k")
    a, b = activation.restored, attribution.restored
    order = (b - a).abs().flatten().argsort(descending=True, stable=True)[:k].tolist()
    N = a.size(1)
    return [Disagreement(activation.layers[i // N], i % N, activation.labels[i % N],
                         float(a.flatten()[i]), float(b.flatten()[i])) for i in order]


# -- checking the input -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Setup:
    """A checked patching request."""

    clean: Tensor  # (B, T) token ids
    corrupted: Tensor  # (B, T)
    names: dict[str, list[str]]  # what -> the hook name in each swept layer
    layers: tuple[int, ...]
    labels: Sequence[str] | None


def _ids(x: Any, which: str, vocab_size: int | None) -> Tensor:
    """Token ids (a list of ints, a list of lists, a tensor (T,) or (B, T)) as a (B, T) tensor."""
    if isinstance(x, str):
        raise TypeError(f"the {which} prompt must be token ids, not text: encode it first "
                        f"(tokenizer.encode({x[:30]!r}))")
    if not isinstance(x, Tensor):
        try:
            x = torch.tensor(x)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"the {which} prompt must be token ids: a list of ints, a list of "
                            f"equally long lists or an integer tensor, got {x!r:.60}") from None
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"the {which} token ids must be integers, got {x.dtype}")
    if x.dim() == 1:
        x = x[None]  # (1, T)
    if x.dim() != 2 or x.size(1) == 0:
        raise ValueError(f"the {which} token ids must have shape (T,) or (B, T) with T >= 1, "
                         f"got {tuple(x.shape)}")
    if vocab_size is not None and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise ValueError(f"the {which} token ids must lie in [0, {vocab_size}) (the model's "
                         f"vocabulary), got values in [{int(x.min())}, {int(x.max())}]")
    return x.long()


def _pair(model: nn.Module, clean: Any, corrupted: Any, metric: Any) -> tuple[Tensor, Tensor]:
    """Check the model, the metric and the two prompts; -> the clean and corrupted ids (B, T)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a tfbook model (a torch module), got "
                        f"{type(model).__name__}")
    if not callable(metric):
        raise TypeError(f"metric must be a function of the logits (B, T, V) -> (B,), e.g. "
                        f"lambda logits: logit_diff(logits, answer, wrong); got {metric!r:.60}")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    clean, corrupted = _ids(clean, "clean", vocab), _ids(corrupted, "corrupted", vocab)
    if clean.size(0) != corrupted.size(0):
        raise ValueError(f"the clean run has {clean.size(0)} prompts and the corrupted run "
                         f"{corrupted.size(0)}: patching pairs them one to one")
    if clean.size(1) != corrupted.size(1):
        raise ValueError(
            f"the clean prompt has {clean.size(1)} tokens and the corrupted prompt "
            f"{corrupted.size(1)}: patching copies each activation to the same position, so "
            "both need equally many tokens (choose a corruption that tokenises to the same "
            "length, e.g. one name for another of one token each)")
    if model.training:
        raise ValueError(f"{type(model).__name__} is in training mode (dropout would make each "
                         "patched run random): call model.eval() first")
    return clean, corrupted


def _check(model: nn.Module, clean: Any, corrupted: Any, metric: Any, whats: Sequence[str],
           layers: Any, labels: Any) -> _Setup:
    """Check a patching request and find its hook names; raise a clear error if it is wrong."""
    clean, corrupted = _pair(model, clean, corrupted, metric)
    names: dict[str, list[str]] = {}
    n_layers = None
    for what in whats:
        if not isinstance(what, str):
            raise TypeError(f"what must be a hook name ending such as 'residual_pre' or "
                            f"'attn.heads', got {what!r:.60}")
        if what not in WHAT:
            raise ValueError(f"cannot sweep {what!r}; the grids are by layer x position for "
                             f"{[w for w, a in WHAT.items() if a == 'position']} and by layer "
                             f"x head for {[w for w, a in WHAT.items() if a != 'position']}")
        pattern = re.compile(rf"blocks\.\d+\.{re.escape(what)}")
        found = [n for n in hook_names(model) if pattern.fullmatch(n)]
        if not found:
            check_names(model, [f"blocks.0.{what}"])  # raises, naming the hook points there are
            raise ValueError(f"{type(model).__name__} has no layers with a hook point {what!r}")
        if n_layers is not None and len(found) != n_layers:
            raise ValueError(f"{type(model).__name__} has {len(found)} layers with {what!r} and "
                             f"{n_layers} with {whats[0]!r}")
        n_layers = len(found)
        names[what] = found
    assert n_layers is not None
    if layers is None:
        layers = tuple(range(n_layers))
    else:
        items = [layers] if isinstance(layers, numbers.Integral) else layers
        if not isinstance(items, Sequence) or isinstance(items, str) or not items or not all(
                isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in items):
            raise TypeError(f"layers must be an int or a non-empty list of ints, got "
                            f"{layers!r:.60}")
        bad = [i for i in items if not 0 <= i < n_layers]
        if bad:
            raise ValueError(f"layers {bad} are out of range: {type(model).__name__} has "
                             f"{n_layers} layers (0 to {n_layers - 1})")
        layers = tuple(int(i) for i in items)
    names = {what: [found[i] for i in layers] for what, found in names.items()}
    if labels is not None:
        T = clean.size(1)
        if isinstance(labels, str) or not isinstance(labels, Sequence) or not all(
                isinstance(s, str) for s in labels):
            raise TypeError(f"labels must be a list of str, one per position, got {labels!r:.60}")
        if len(labels) != T:
            raise ValueError(f"labels gives {len(labels)} labels for {T} positions")
    return _Setup(clean, corrupted, names, layers, labels)


def _logits(out: Any) -> Tensor:
    """The logits of a model's output (a ModelOutput or a tensor)."""
    logits = out.logits if isinstance(out, ModelOutput) else out
    if not isinstance(logits, Tensor):
        raise TypeError(f"the model must return logits (a tensor or a ModelOutput with logits), "
                        f"got {type(out).__name__}")
    return logits


def _score(metric: Metric, logits: Tensor, B: int) -> Tensor:
    """The metric on the logits of B prompts, averaged over the prompts: a scalar tensor."""
    m = metric(logits)
    if not isinstance(m, Tensor) or m.shape not in ((), (B,)):
        got = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
        raise ValueError(f"the metric must return a tensor of shape () or ({B},) (one value per "
                         f"prompt) from logits {tuple(logits.shape)}; got {got}")
    return m.double().mean()


def _columns(what: str, t: Tensor, labels: Sequence[str] | None,
             model: nn.Module, name: str) -> tuple[int, tuple[str, ...]]:
    """The axis of `t` (the tensor at hook point `name`) that a `what` grid's columns run
    along, and their labels: the positions' (default their indices), the heads' indices, or
    for key/value heads the query heads that share each one, '0 (q 0-2)'."""
    pos_axis, head_axis = AXES[what.rsplit(".", 1)[-1]]
    if WHAT[what] == "position":
        n = t.size(pos_axis)
        return pos_axis, tuple(labels) if labels is not None else tuple(map(str, range(n)))
    n = t.size(head_axis)
    if WHAT[what] == "head":
        return head_axis, tuple(map(str, range(n)))
    g = model.get_submodule(name.rsplit(".", 1)[0]).n_heads // n  # query heads per kv head
    return head_axis, tuple(f"{j} (q {j * g}-{j * g + g - 1})" if g > 1 else str(j)
                            for j in range(n))


def _positive_int(value: Any, name: str) -> int:
    """`value` if it is an int >= 1; a TypeError or ValueError saying so otherwise."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r:.40}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


# -- activation patching ------------------------------------------------------------------------

def activation_patching(
    model: nn.Module, clean: Any, corrupted: Any, metric: Metric, what: str = "residual_pre",
    *, layers: Any = None, labels: Sequence[str] | None = None, batch_size: int | None = None,
    progress: bool = True,
) -> PatchingResult:
    """Patch the clean run's `what` into the corrupted run one cell at a time; the metric of
    each patched run, a grid (layers x positions, or layers x heads over all positions).

    clean, corrupted: token ids of equally many tokens, (T,) or (B, T). metric(logits (B, T, V))
    -> (B,) or (): averaged over the B prompts. layers: the rows to sweep (default all).
    labels: one per position (e.g. the tokens). batch_size: patched copies per forward pass
    (default: all of a layer's cells in one pass). A cell whose clean and corrupted tensors
    are equal (a position before the first token the prompts differ in) is not run: the
    patch changes nothing there, so its value is the corrupted run's metric.
    """
    start = time.process_time()
    s = _check(model, clean, corrupted, metric, [what], layers, labels)
    if batch_size is not None:
        batch_size = _positive_int(batch_size, "batch_size")
    names = s.names[what]
    B = s.clean.size(0)
    with torch.no_grad():
        out, cache = run_with_cache(model, s.clean, names=names)
        clean_m = _score(metric, _logits(out), B)
        out, corrupted_cache = run_with_cache(model, s.corrupted, names=names)
        corrupted_m = _score(metric, _logits(out), B)
    axis, col_labels = _columns(what, cache[names[0]], s.labels, model, names[0])
    n = len(col_labels)
    values = torch.full((len(names), n), float(corrupted_m), dtype=torch.float64)
    bar = tqdm(names, desc=f"patching {what}", disable=not progress, file=sys.stderr)
    passes = 2
    with torch.no_grad():
        for row, name in enumerate(bar):
            source = cache[name]  # (B, ...): the clean run's tensor
            differ = [i for i in range(n) if not torch.equal(
                source.select(axis, i), corrupted_cache[name].select(axis, i))]
            step = max(len(differ), 1) if batch_size is None else batch_size
            for first in range(0, len(differ), step):
                cells = differ[first:first + step]
                logits = _patched_run(model, s.corrupted, name, source, axis, cells)
                passes += 1
                for j, cell in enumerate(cells):  # rows j*B .. j*B+B-1: cell `cell` patched
                    values[row, cell] = _score(metric, logits[j * B:(j + 1) * B], B)
    return PatchingResult(values, what, ("layer", WHAT[what]), s.layers, col_labels,
                          float(clean_m), float(corrupted_m), "activation",
                          time.process_time() - start, passes)


def _patched_run(model: nn.Module, corrupted: Tensor, name: str, source: Tensor, axis: int,
                 cells: list[int]) -> Tensor:
    """One forward pass of len(cells) copies of the corrupted prompts; copy j has the clean
    `source` at index cells[j] of `axis` of hook point `name`. -> logits (len(cells) * B, T, V)."""
    k, B, n = len(cells), corrupted.size(0), source.size(axis)
    chosen = torch.zeros(k, n, dtype=torch.bool)
    chosen[torch.arange(k), cells] = True  # copy j patches column cells[j]
    shape = [k] + [1] * source.dim()  # (k, 1, ..., n on `axis`, ...): broadcasts to (k, B, ...)
    shape[axis + 1] = n
    mask = chosen.view(shape).to(source.device)

    def hook(t: Tensor, _name: str) -> Tensor:
        copies = t.view(k, B, *t.shape[1:])  # (k, B, ...): copy j, prompt b
        return torch.where(mask, source.to(t.dtype)[None], copies).view(t.shape)

    with hooks(model, {name: hook}):
        return _logits(model(corrupted.repeat(k, 1)))  # rows j*B + b: copy j of prompt b


def patch_once(model: nn.Module, clean: Any, corrupted: Any, metric: Metric, name: str,
               positions: Any = None, heads: Any = None) -> float:
    """The metric of one corrupted run with the clean run's tensor at hook point `name` copied
    in at `positions` and `heads` (None: all of them), averaged over the prompts."""
    clean, corrupted = _pair(model, clean, corrupted, metric)
    if not isinstance(name, str):
        raise TypeError(f"name must be a hook name such as 'blocks.3.attn.heads', got "
                        f"{name!r:.60}")
    check_names(model, [name])  # an unknown name is refused with the names there are
    with torch.no_grad():
        _, cache = run_with_cache(model, clean, names=[name])
        t = cache[name]
        pos_axis, head_axis = AXES.get(name.rsplit(".", 1)[-1], (1, None))
        _in_range("positions", positions, t.size(pos_axis), name, t)
        if heads is not None and head_axis is None:
            raise ValueError(f"{name!r} (B, T, width) has no heads to choose; pass heads=None")
        if heads is not None:
            _in_range("heads", heads, t.size(head_axis), name, t)
        with hooks(model, {name: patch(cache, positions, heads)}):
            logits = _logits(model(corrupted))
        return float(_score(metric, logits, corrupted.size(0)))


def _in_range(what: str, chosen: Any, size: int, name: str, t: Tensor) -> None:
    """Raise unless `chosen` is None, an int or a list of ints in [-size, size)."""
    if chosen is None:
        return
    items = [chosen] if isinstance(chosen, numbers.Integral) else chosen
    if isinstance(items, str) or not isinstance(items, Sequence) or not all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in items):
        raise TypeError(f"{what} must be an int or a list of ints, got {chosen!r:.60}")
    bad = [i for i in items if not -size <= i < size]
    if bad:
        raise ValueError(f"{what} {bad} are out of range for {name!r}, which has {size} "
                         f"{what} (shape {tuple(t.shape)})")


# -- attribution patching -----------------------------------------------------------------------

def attribution_patching(
    model: nn.Module, clean: Any, corrupted: Any, metric: Metric,
    what: str | Sequence[str] = "residual_pre", *, layers: Any = None,
    labels: Sequence[str] | None = None,
) -> PatchingResult | dict[str, PatchingResult]:
    """Attribution patching (Syed et al. 2023): each cell of activation_patching's grid
    estimated to first order at the corrupted run,

        metric(corrupted) + sum over the cell of  d metric / d a  *  (a_clean - a_corrupted),

    from one clean forward pass and one corrupted forward and backward pass for every grid
    asked (`what`: one name, or a list of them -> a dict of grids). Same arguments and grids
    as activation_patching.
    """
    start = time.process_time()
    whats = list(what) if isinstance(what, Sequence) and not isinstance(what, str) else [what]
    if not whats:
        raise ValueError("what is an empty list: name at least one place, e.g. 'residual_pre'")
    s = _check(model, clean, corrupted, metric, whats, layers, labels)
    names = [n for w in whats for n in s.names[w]]
    B = s.clean.size(0)
    with torch.no_grad():
        out, clean_cache = run_with_cache(model, s.clean, names=names)
        clean_m = _score(metric, _logits(out), B)
    # the corrupted run with a zero added at each hook point: the gradient with respect to
    # that zero is the gradient with respect to the activation, and the graph stays whole
    zeros: dict[str, Tensor] = {}
    corrupted_acts: dict[str, Tensor] = {}

    def hook(t: Tensor, name: str) -> Tensor:
        zeros[name] = torch.zeros_like(t, requires_grad=True)
        corrupted_acts[name] = t.detach()
        return t + zeros[name]

    with torch.enable_grad():
        with hooks(model, {n: hook for n in names}):
            corrupted_m = _score(metric, _logits(model(s.corrupted)), B)
        if not corrupted_m.requires_grad:
            raise ValueError("the metric is not differentiable in the logits (its result has "
                             "no gradient): attribution patching needs one such as logit_diff")
        grads = torch.autograd.grad(corrupted_m, [zeros[n] for n in names], allow_unused=True)
    grads = dict(zip(names, grads, strict=True))
    corrupted_m = corrupted_m.detach()
    results = {}
    for w in whats:
        axis, col_labels = _columns(w, clean_cache[s.names[w][0]], s.labels, model,
                                    s.names[w][0])
        rows = []
        for name in s.names[w]:
            g = grads[name]
            delta = clean_cache[name] - corrupted_acts[name]  # (B, ...)
            if g is None:  # the metric does not depend on this activation
                g = torch.zeros_like(delta)
            other = [d for d in range(delta.dim()) if d != axis]
            rows.append((g.double() * delta.double()).sum(other))  # (N,)
        values = float(corrupted_m) + torch.stack(rows)  # (L, N)
        results[w] = PatchingResult(values, w, ("layer", WHAT[w]), s.layers, col_labels,
                                    float(clean_m), float(corrupted_m), "attribution",
                                    time.process_time() - start, 2)
    return results[what] if isinstance(what, str) else results
