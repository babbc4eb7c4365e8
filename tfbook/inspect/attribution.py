"""Direct logit attribution: how much each head and each MLP writes the final logit directly.

    _, cache = run_with_cache(model, ids, names=attribution_names(model))
    dla = direct_logit_attribution(model, cache, target=paris, other=rome)
    dla.heads()            # (L, H, B): each head's share of logit(paris) - logit(rome)
    dla.top(5)             # the five largest, labelled "L3H4", "MLP7", "embed", ...

The residual stream after the last block is a sum (every block only adds to it), and the
attention output is a sum over heads, because W_O acts on the concatenated heads
(Elhage et al. 2021, "A mathematical framework for transformer circuits"):

    x_L = embed + sum_l ( sum_h z_l,h W_O,h^T + b_O,l ) + sum_l MLP_l

with z_l,h (D,) head h's mix of values (the hook `blocks.l.attn.heads`) and W_O,h (C, D) the
columns h D .. (h + 1) D of `out_proj.weight`. The logits are Norm_f(x_L) W_U^T; the norm is
not linear, but at ONE run its scale s = s(x_L) is a number, and with s frozen the norm is

    Norm_f(x) ~ g * (x - mean(x)) / s + b          (RMSNorm: g * x / s, no centring, no b)

which is linear in x. Frozen that way (TransformerLens's cached `ln_final.hook_scale`), the
logit difference along u = W_U[target] - W_U[other] splits EXACTLY over the parts:

    logit_diff = sum_i  c_i . v  +  b . u,       v = g * u / s   (LayerNorm: v - mean(v))

Each part c_i's term c_i . v is its direct logit attribution; the norm's bias, if any, is a
term of its own ("norm_bias"), the attention's out_proj bias too ("L3bias"). "Direct" means
the path straight to the unembedding: a head that writes what a later head or MLP reads gets
no credit here for that later effect (and the frozen scale hides that the part also changed
s). The terms are computed in float64 from the cached float32 tensors; `Attribution.bound`
is a derived bound on how far their sum may lie from the model's float32 logit difference.

Shape legend: L blocks, H heads, D head size, B batch, C width, V vocabulary, N parts.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tfbook.inspect.lens import check_decoder, norm_bias, norm_scale
from tfbook.normalization import LayerNorm

F32 = torch.finfo(torch.float32).eps / 2  # unit roundoff of float32, 2^-24
F64 = torch.finfo(torch.float64).eps / 2


def gamma(n: int, unit: float = F32) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of a sum of n products in a float
    format of unit roundoff u (Higham, "Accuracy and stability", 2002, eq. 3.8)."""
    return n * unit / (1 - n * unit)


def attribution_names(model: nn.Module) -> list[str]:
    """The hook names direct logit attribution reads: the embeddings, each block's heads
    (before W_O), its FFN output and its residual streams (for the rounding bound)."""
    _, _, L = check_decoder(model)
    names = ["blocks.0.residual_pre"]
    for i in range(L):
        names += [f"blocks.{i}.attn.heads", f"blocks.{i}.residual_mid", f"blocks.{i}.ff.out",
                  f"blocks.{i}.residual_post"]
    return names


def logit_direction(model: nn.Module, target: int | Tensor,
                    other: int | Tensor | None = None) -> Tensor:
    """u = W_U[target] - W_U[other] (or W_U[target] alone): the direction in the normed
    stream whose dot product is the logit difference. Ids, or (B,) ids -> (C,) or (B, C)."""
    _, W_U, _ = check_decoder(model)
    u = W_U[_ids(target, W_U.size(0), "target")]
    return u if other is None else u - W_U[_ids(other, W_U.size(0), "other")]


def final_stream_parts(model: nn.Module, cache: Mapping[str, Tensor],
                       position: int = -1) -> tuple[Tensor, list[str]]:
    """The final residual stream at `position` split into the parts that were added to it:
    (N, B, C) in float64 and their labels "embed", "L{l}H{h}", ["L{l}bias",] "MLP{l}".

    Their sum is blocks.{L-1}.residual_post at that position, up to the float32 rounding of
    the model's additions and of its out_proj product.
    """
    _, _, L = check_decoder(model)
    _check_cache(model, cache)
    T = cache["blocks.0.residual_pre"].size(1)
    if isinstance(position, bool) or not isinstance(position, numbers.Integral) \
            or not -T <= position < T:
        raise ValueError(f"position must be an int in [{-T}, {T}) for a run of {T} positions, "
                         f"got {position!r}")
    parts, labels = [cache["blocks.0.residual_pre"][:, position].double()], ["embed"]
    for layer, block in enumerate(model.blocks):
        heads, bias = _head_outputs(block.attn.out_proj, cache[f"blocks.{layer}.attn.heads"],
                                    position)  # (H, B, C), (C,) or None
        parts += list(heads)
        labels += [f"L{layer}H{h}" for h in range(heads.size(0))]
        if bias is not None:
            parts.append(bias.expand_as(parts[0]))
            labels.append(f"L{layer}bias")
        parts.append(cache[f"blocks.{layer}.ff.out"][:, position].double())
        labels.append(f"MLP{layer}")
    return torch.stack(parts), labels  # (N, B, C)


def _head_outputs(out_proj: nn.Module, z: Tensor, position: int) -> tuple[Tensor, Tensor | None]:
    """Each head's write z_h W_O,h^T at one position, (H, B, C) float64, and b_O (C,) or None.

    z: the hook `attn.heads` (B, H, T, D); W_O,h = out_proj.weight[:, h D:(h + 1) D].
    """
    if not isinstance(out_proj, nn.Linear):
        raise TypeError(f"attribution per head needs out_proj as an nn.Linear (its weight is "
                        f"W_O), got {type(out_proj).__name__}")
    B, H, T, D = z.shape
    W_O = out_proj.weight.double().view(-1, H, D)  # (C, H, D): column block h is head h's
    writes = torch.einsum("bhd,chd->hbc", z[:, :, position].double(), W_O)  # (H, B, C)
    bias = None if out_proj.bias is None else out_proj.bias.double()
    return writes, bias


@dataclass
class Attribution:
    """Direct logit attribution of one run at one position, every part labelled.

    values (N, B): each part's term c_i . v; logit_diff (B,): the model's float32 logit
    difference (or logit) at that position; bound (B,): a derived float rounding bound on
    |values.sum(0) - logit_diff|.
    """

    labels: list[str]
    values: Tensor
    logit_diff: Tensor
    bound: Tensor
    n_layers: int
    n_heads: int

    def __getitem__(self, label: str) -> Tensor:
        """The (B,) terms of one part: dla["L3H4"], dla["MLP0"], dla["embed"]."""
        if label not in self.labels:
            raise KeyError(f"no part {label!r}; parts are 'embed', 'L<l>H<h>', 'MLP<l>' "
                           f"(l < {self.n_layers}, h < {self.n_heads}), and the biases "
                           f"{[s for s in self.labels if 'bias' in s][:3]}")
        return self.values[self.labels.index(label)]

    def total(self) -> Tensor:
        """Sum of every part's term (B,): the logit difference up to `bound`."""
        return self.values.sum(0)

    def heads(self) -> Tensor:
        """Each head's term, (L, H, B)."""
        index = [self.labels.index(f"L{i}H{h}") for i in range(self.n_layers)
                 for h in range(self.n_heads)]
        return self.values[index].view(self.n_layers, self.n_heads, -1)

    def mlps(self) -> Tensor:
        """Each MLP's term, (L, B)."""
        return self.values[[self.labels.index(f"MLP{i}") for i in range(self.n_layers)]]

    def top(self, k: int = 10, batch: int | None = None) -> list[tuple[str, float]]:
        """The k parts of largest |term| (batch mean, or one batch row), largest first."""
        v = self.values.mean(1) if batch is None else self.values[:, batch]
        order = v.abs().argsort(descending=True)[:k]
        return [(self.labels[i], float(v[i])) for i in order]


@torch.no_grad()
def direct_logit_attribution(model: nn.Module, cache: Mapping[str, Tensor],
                             target: int | Tensor, other: int | Tensor | None = None,
                             position: int = -1) -> Attribution:
    """Split logit(target) - logit(other) at `position` over the embeddings, every head, every
    attention bias and every MLP, through the final norm frozen at the run's scale s(x_L)
    (Elhage et al. 2021; TransformerLens's `stack_head_results` + `logit_attrs`).

    target, other: token ids, or (B,) ids one per sequence; other=None attributes the logit
    of target itself (TransformerLens in compatibility mode centres W_U over the vocabulary,
    which shifts each of its single-token terms; differences of two tokens are unaffected).
    "embed" is what enters block 0: the token embedding plus, for learned positions, the
    position embedding. The cache: run_with_cache(model, ids, names=attribution_names(model)),
    the model in eval mode (dropout would break the sum).
    """
    norm, W_U, L = check_decoder(model)
    if model.training and any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        raise ValueError("direct logit attribution needs the run of a model in eval mode: "
                         "dropout changes what each part adds (call model.eval() and run again)")
    parts, labels = final_stream_parts(model, cache, position)  # (N, B, C) float64
    x_L = cache[f"blocks.{L - 1}.residual_post"][:, position]  # (B, C) float32
    B = x_L.size(0)
    for what, ids in (("target", target), ("other", other)):
        if ids is not None and _ids(ids, W_U.size(0), what).shape not in ((), (B,)):
            raise ValueError(f"{what} must be one id or one id per sequence ({B},), got shape "
                             f"{tuple(ids.shape)}")
    u = logit_direction(model, target, other).double().expand(B, -1)  # (B, C)
    s = norm_scale(norm, x_L.double())  # (B, 1), the frozen scale
    v = u * norm.weight.double() / s  # (B, C): c . v = linearised_norm(c) . u ...
    if isinstance(norm, LayerNorm):
        v = v - v.mean(-1, keepdim=True)  # ... as centring c is the same as centring v
    values = (parts * v).sum(-1)  # (N, B)
    bias = norm_bias(norm)
    if bias is not None:
        values = torch.cat([values, (bias.double() * u).sum(-1)[None]])
        labels = labels + ["norm_bias"]
    logits = model.lm_head(norm(x_L))  # (B, V), the model's own float32 readout
    diff = _pick(logits, target)
    if other is not None:
        diff = diff - _pick(logits, other)
    bound = _rounding_bound(model, cache, position, parts, v, logits, norm(x_L), target, other)
    H = model.blocks[0].attn.n_heads
    return Attribution(labels, values, diff.double(), bound, L, H)


def _rounding_bound(model: nn.Module, cache: Mapping[str, Tensor], position: int,
                    parts: Tensor, v: Tensor, logits: Tensor, h: Tensor, target: int | Tensor,
                    other: int | Tensor | None) -> Tensor:
    """A bound (B,) on |sum of the terms - the model's float32 logit difference|.

    With u = 2^-24 (float32's unit roundoff) and |.| taken elementwise, the sum of the terms is
    the exact dot product of v with the exact sum of the parts; it differs from the model's
    difference by (Higham 2002, sections 3.1 and 3.5):
      1. the 2L rounded additions of the residual stream: u sum_k |x_k| . |v| over the stored
         streams x_k (each block's mid and output);
      2. the model's out_proj product against our exact per-head split:
         gamma_{C+1} (|z| |W_O|^T + |b_O|) . |v| per layer;
      3. the model's readout: the float32 norm (relative error within gamma_{C+8} per entry)
         and two C-term dot products with W_U: (gamma_C + gamma_{C+8}) |h| . (|W_a| + |W_b|),
         and the final subtraction, u |diff|;
      4. our own float64 sums, 2 gamma_{N+C}(float64) sum_i |c_i| . |v| (negligible).
    """
    norm, W_U, L = check_decoder(model)
    C = W_U.size(1)
    av = v.abs()  # (B, C)
    streams = [cache[f"blocks.{i}.residual_{w}"][:, position] for i in range(L)
               for w in ("mid", "post")]
    bound = F32 * sum((x.double().abs() * av).sum(-1) for x in streams)  # 1.
    for i, block in enumerate(model.blocks):  # 2.
        z = cache[f"blocks.{i}.attn.heads"][:, :, position]  # (B, H, D)
        B, H, D = z.shape
        W_O = block.attn.out_proj
        mag = z.double().abs().reshape(B, H * D) @ W_O.weight.double().abs().T  # (B, C)
        if W_O.bias is not None:
            mag = mag + W_O.bias.double().abs()
        bound = bound + gamma(C + 1) * (mag * av).sum(-1)
    rows = W_U[_ids(target, W_U.size(0), "target")].double().abs()
    if other is not None:
        rows = rows + W_U[_ids(other, W_U.size(0), "other")].double().abs()
    diff = _pick(logits, target) - (0 if other is None else _pick(logits, other))
    bound = bound + (gamma(C) + gamma(C + 8)) * (h.double().abs() * rows).sum(-1) \
        + F32 * diff.double().abs()  # 3.
    return bound + 2 * gamma(parts.size(0) + C, F64) * (parts.abs() * av).sum((0, 2))  # 4.


def _pick(logits: Tensor, ids: int | Tensor) -> Tensor:
    """logits (B, V) at one id per row (an int for all rows, or (B,) ids) -> (B,)."""
    index = _ids(ids, logits.size(-1), "target")
    index = index.expand(logits.size(0)) if index.dim() == 0 else index
    if index.shape != logits.shape[:1]:
        raise ValueError(f"expected one id or one id per sequence ({logits.size(0)},), got "
                         f"shape {tuple(index.shape)}")
    return logits.gather(-1, index[:, None].to(logits.device)).squeeze(-1)


def _ids(ids: int | Tensor, V: int, what: str) -> Tensor:
    """A token id or (B,) ids, checked against the vocabulary size V, as a long tensor."""
    if isinstance(ids, numbers.Integral) and not isinstance(ids, bool):
        ids = torch.tensor(int(ids))
    if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.dtype == torch.bool \
            or ids.dim() > 1:
        raise TypeError(f"{what} must be a token id or a (B,) tensor of ids, got {ids!r:.60}")
    if not bool(((ids >= 0) & (ids < V)).all()):
        raise ValueError(f"{what} ids must lie in [0, {V}), got {ids.tolist()!r:.60}")
    return ids.long()


def _check_cache(model: nn.Module, cache: Mapping[str, Tensor]) -> None:
    """The cache must hold every tensor attribution_names(model) lists."""
    if not isinstance(cache, Mapping):
        raise TypeError(f"cache must be an ActivationCache (run_with_cache), got "
                        f"{type(cache).__name__}")
    missing = [n for n in attribution_names(model) if n not in cache]
    if missing:
        raise ValueError(f"the cache lacks {len(missing)} tensors attribution needs, e.g. "
                         f"{missing[0]!r}; run run_with_cache(model, ids, "
                         "names=attribution_names(model))")
