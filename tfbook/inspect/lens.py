"""The logit lens: what each layer's residual stream would predict if the model stopped there.

    _, cache = run_with_cache(model, ids, names=lens_names(model))
    logits = logit_lens(model, cache)                       # (L + 1, B, T, V)
    logits = logit_lens(model, cache, scale="final")        # TransformerLens's cached scale
    probs, ids = top_tokens(logits[:, 0, -1])               # (L + 1, k) each

A pre-norm decoder ends in  logits = Norm_f(x_L) W_U^T , where x_L is the residual stream
after the last block. Every block only adds to the stream, so each earlier stream x_l is a
partial sum of the same vector, and can be read out the same way (nostalgebraist 2020):

    recomputed (the literature):   lens_l = Norm_f(x_l) W_U^T
                                         = (g * (x_l - mu_l) / s_l + b) W_U^T
    final (cached scale):          lens_l = (g * (x_l - mu_l) / s_L + b) W_U^T

with s = sqrt(mean((x - mu)^2) + eps) the norm's scale (mu = 0 and b = 0 for RMSNorm), g its
gain. The first divides each stream by its OWN scale s_l; the second by the scale s_L of the
final stream, cached in the forward pass (TransformerLens's `ln_final.hook_scale`): that is
what `ActivationCache.apply_ln_to_stack` does, and what `accumulated_resid(apply_ln=True)`
did for every layer until TransformerLens issue #1076 (fixed in 4.3 by PR #1180, which
recomputes the statistics when the stack ends at the unembedding).

Where and why they differ. The two agree at the last layer (s_l = s_L there). Elsewhere, with
no norm bias (RMSNorm; or b = 0), the cached-scale lens is the recomputed one multiplied by
rho_l = s_l / s_L:  final_l = rho_l * recomputed_l  exactly, i.e. the same logits at the
temperature 1 / rho_l. The residual stream grows from layer to layer (each block adds to it),
so rho_l < 1 in early layers, often far below: their distributions come out nearly uniform
(a high temperature), although the ranking of the tokens is the same. The recomputed lens
reads each stream at the size the unembedding expects; the cached scale says how much of
the final logit each stream already carries (the linear view that direct logit attribution,
`tfbook.inspect.attribution`, needs). `scale_ratios` returns rho_l.

Shape legend: L blocks, N streams read (L + 1, or 2L + 1 with the mid-block streams),
B batch, T positions, C width, V vocabulary.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from tfbook.normalization import LayerNorm, RMSNorm

SCALES = ("recomputed", "final")


# -- the model's parts: final norm, unembedding, number of blocks ----------------------------

def check_decoder(model: nn.Module) -> tuple[nn.Module, Tensor, int]:
    """(final norm, unembedding W_U (V, C), L) of a tfbook decoder; anything else is refused."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a tfbook decoder (tfbook.models.gpt.GPT), got "
                        f"{type(model).__name__}")
    norm, head, blocks = (getattr(model, n, None) for n in ("norm_f", "lm_head", "blocks"))
    if not isinstance(norm, LayerNorm | RMSNorm) or not isinstance(head, nn.Linear) \
            or not isinstance(blocks, nn.ModuleList):
        raise TypeError(
            f"the logit lens and logit attribution read a decoder's final norm (norm_f, a "
            f"tfbook LayerNorm or RMSNorm), its unembedding (lm_head, an nn.Linear) and its "
            f"blocks; {type(model).__name__} has norm_f={type(norm).__name__}, "
            f"lm_head={type(head).__name__}, blocks={type(blocks).__name__}")
    if head.bias is not None:
        raise ValueError("lm_head has a bias; the lens and attribution here assume logits = "
                         "Norm_f(x) W_U^T without one (as GPT-2 and Llama)")
    return norm, head.weight, len(blocks)


def norm_scale(norm: nn.Module, x: Tensor) -> Tensor:
    """The scale s a norm divides by, per vector: sqrt(mean((x - mu)^2) + eps) for LayerNorm,
    sqrt(mean(x^2) + eps) for RMSNorm. x (..., C) -> (..., 1), in x's dtype."""
    x32 = x.double() if x.dtype == torch.float64 else x.float()
    centred = x32 - x32.mean(-1, keepdim=True) if isinstance(norm, LayerNorm) else x32
    return torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + norm.eps).to(x.dtype)


def linearised_norm(norm: nn.Module, x: Tensor, scale: Tensor) -> Tensor:
    """The norm with a GIVEN scale, without its bias: g * (x - mu) / s (RMSNorm: g * x / s).

    Linear in x, so it splits over a sum: the map that direct logit attribution and the
    cached-scale lens apply to each part of the stream. x (..., C), scale (..., 1).
    """
    centred = x - x.mean(-1, keepdim=True) if isinstance(norm, LayerNorm) else x
    return centred / scale * norm.weight.to(x.dtype)


def norm_bias(norm: nn.Module) -> Tensor | None:
    """The norm's bias b (LayerNorm with bias), or None."""
    return getattr(norm, "bias", None) if isinstance(norm, LayerNorm) else None


# -- the streams -------------------------------------------------------------------------------

def lens_names(model: nn.Module, incl_mid: bool = False) -> list[str]:
    """The hook names the lens reads: the stream entering block 0 (the embeddings), then each
    block's output (with `incl_mid`, also the stream between its attention and its FFN)."""
    _, _, L = check_decoder(model)
    names = ["blocks.0.residual_pre"]
    for i in range(L):
        names += [f"blocks.{i}.residual_mid"] * bool(incl_mid) + [f"blocks.{i}.residual_post"]
    return names


def residual_stack(model: nn.Module, cache: Mapping[str, Tensor],
                   incl_mid: bool = False) -> tuple[Tensor, list[str]]:
    """Every residual stream of the run, in order: (N, B, T, C) and their hook names.

    N = L + 1: the embeddings (blocks.0.residual_pre), then each block's output; with
    `incl_mid`, N = 2L + 1 (each block's mid-stream before its output). Equal to
    TransformerLens's `accumulated_resid(incl_mid=...)` (its "l_pre" is our "l-1 post").
    """
    if not isinstance(cache, Mapping):
        raise TypeError(f"cache must be an ActivationCache (run_with_cache), got "
                        f"{type(cache).__name__}")
    names = lens_names(model, incl_mid)
    missing = [n for n in names if n not in cache]
    if missing:
        raise ValueError(f"the cache lacks {len(missing)} residual streams the lens needs, "
                         f"e.g. {missing[0]!r}; run run_with_cache(model, ids, "
                         f"names=lens_names(model{', incl_mid=True' if incl_mid else ''}))")
    return torch.stack([cache[n] for n in names]), names


def _select(x: Tensor, positions: int | Sequence[int] | None, axis: int) -> Tensor:
    """x indexed at `positions` along `axis` (an int drops the axis, a list keeps it)."""
    if positions is None:
        return x
    size = x.size(axis)
    items = [positions] if isinstance(positions, numbers.Integral) else positions
    if isinstance(positions, bool) or not isinstance(items, Sequence) or isinstance(items, str) \
            or not items or not all(isinstance(p, numbers.Integral)
                                    and not isinstance(p, bool) for p in items):
        raise TypeError(f"positions must be None, an int or a list of ints, got "
                        f"{positions!r:.60}")
    bad = [p for p in items if not -size <= p < size]
    if bad:
        raise IndexError(f"positions {bad} are out of range for a run of {size} positions")
    index = torch.tensor([p % size for p in items], device=x.device)
    picked = x.index_select(axis, index)
    return picked.squeeze(axis) if isinstance(positions, numbers.Integral) else picked


def scale_ratios(model: nn.Module, cache: Mapping[str, Tensor], incl_mid: bool = False,
                 positions: int | Sequence[int] | None = None) -> Tensor:
    """rho_l = s_l / s_L, each stream's norm scale over the final stream's: (N, B, T).

    The cached-scale lens equals the recomputed one times rho_l (no norm bias), so rho_l < 1
    means a flatter distribution (temperature 1 / rho_l)."""
    norm, _, _ = check_decoder(model)
    stack, _ = residual_stack(model, cache, incl_mid)
    stack = _select(stack, positions, 2)
    scales = norm_scale(norm, stack).squeeze(-1)  # (N, B, T)
    return scales / scales[-1]


# -- the lens ----------------------------------------------------------------------------------

@torch.no_grad()
def logit_lens(model: nn.Module, cache: Mapping[str, Tensor], *, scale: str = "recomputed",
               incl_mid: bool = False,
               positions: int | Sequence[int] | None = None) -> Tensor:
    """Each residual stream read out as next-token logits: (N, B, T, V).

    scale="recomputed": Norm_f(x_l) W_U^T, the norm's statistics recomputed on each stream x_l
    (nostalgebraist 2020; TransformerLens 4.3 `accumulated_resid(apply_ln=True)`); its last
    entry is the model's own logits. scale="final": (g (x_l - mu_l) / s_L + b) W_U^T, every
    stream divided by the final stream's scale s_L (TransformerLens's `apply_ln_to_stack`, the
    cached `ln_final.hook_scale`; `accumulated_resid(apply_ln=True)` until PR #1180 fixed
    issue #1076).
    `positions` (an int, dropping the T axis, or a list) limits the work to some positions.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    norm, W_U, _ = check_decoder(model)
    stack, _ = residual_stack(model, cache, incl_mid)  # (N, B, T, C)
    stack = _select(stack, positions, 2).to(W_U.dtype)
    if scale == "recomputed":
        return model.lm_head(norm(stack))  # (N, B, T, V)
    normed = linearised_norm(norm, stack, norm_scale(norm, stack[-1]))
    bias = norm_bias(norm)
    return model.lm_head(normed if bias is None else normed + bias)  # (N, B, T, V)


# -- reading the lens --------------------------------------------------------------------------

def top_tokens(logits: Tensor, k: int = 5) -> tuple[Tensor, Tensor]:
    """The k most likely tokens of each distribution: probabilities and ids, (..., k) each.

    logit_lens(...)[:, 0, -1] (N, V) -> for every layer the k best next tokens at the last
    position of the first sequence.
    """
    _check_logits(logits)
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= logits.size(-1):
        raise ValueError(f"k must be an int in [1, {logits.size(-1)}], got {k!r}")
    probs, ids = torch.softmax(logits.float(), dim=-1).topk(int(k), dim=-1)
    return probs, ids


def target_rank(logits: Tensor, target: int | Tensor) -> Tensor:
    """Rank of the target token in each distribution, 0 = the most likely: the number of
    tokens with a strictly larger logit. target: an id, or ids broadcasting to logits[..., 0]."""
    picked = logits.gather(-1, _target_index(logits, target))  # (..., 1)
    return (logits > picked).sum(-1)


def target_prob(logits: Tensor, target: int | Tensor) -> Tensor:
    """Probability softmax(logits)[target] of the target token in each distribution."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, _target_index(logits, target)).squeeze(-1).exp()


def entropy(logits: Tensor) -> Tensor:
    """H(p) = -sum_v p_v log p_v of each distribution, in nats (log V for a uniform one)."""
    _check_logits(logits)
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def kl_to_final(logits: Tensor) -> Tensor:
    """KL(p_final || p_l) = sum_v p_final,v (log p_final,v - log p_l,v) of each layer's
    distribution from the last one's (axis 0 of the lens), in nats: (N, ...), 0 at the end.
    The direction of Belrose et al. 2023 (the tuned lens): how many nats the layer's guess
    loses against the final prediction."""
    _check_logits(logits)
    if logits.dim() < 2:
        raise ValueError(f"expected a lens (N, ..., V) with the layers on axis 0, got "
                         f"{tuple(logits.shape)}")
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    final = log_probs[-1:]
    return (final.exp() * (final - log_probs)).sum(-1)


def _check_logits(logits: Tensor) -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        got = logits.dtype if isinstance(logits, Tensor) else type(logits).__name__
        raise TypeError(f"expected logits, a float tensor (..., V), got {got}")


def _target_index(logits: Tensor, target: int | Tensor) -> Tensor:
    """target as an index tensor (..., 1) for gather along the vocabulary."""
    _check_logits(logits)
    V = logits.size(-1)
    if isinstance(target, numbers.Integral) and not isinstance(target, bool):
        target = torch.tensor(int(target))
    if not isinstance(target, Tensor) or target.is_floating_point() or target.dtype == torch.bool:
        raise TypeError(f"target must be a token id or a tensor of ids, got {target!r:.60}")
    if target.numel() and not bool(((target >= 0) & (target < V)).all()):
        raise ValueError(f"target ids must lie in [0, {V}), got {target.tolist()!r:.60}")
    try:
        shape = torch.broadcast_shapes(target.shape, logits.shape[:-1])
    except RuntimeError:
        raise ValueError(f"target of shape {tuple(target.shape)} does not broadcast to the "
                         f"logits' leading shape {tuple(logits.shape[:-1])}") from None
    if shape != logits.shape[:-1]:
        raise ValueError(f"target of shape {tuple(target.shape)} would broadcast the logits "
                         f"{tuple(logits.shape)} to {shape}")
    return target.to(logits.device).long().expand(shape).unsqueeze(-1)
