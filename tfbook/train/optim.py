"""The optimiser side of a step: AdamW with weight decay on matrices only, and gradient clipping.

Weight decay (Loshchilov & Hutter 2019) pulls weights towards zero at each step,
w <- w - lr * wd * w, apart from the Adam update. It is meant for the matrices that mix
features; biases, norm gains and (as in nanoGPT and GPT-2 reproductions) nothing else with
fewer than two dimensions are left alone.

Clipping by the global norm (Pascanu et al. 2013): with g the concatenation of all gradients,

    g <- g * min(1, max_norm / (||g||_2 + 1e-6))

so a rare huge gradient cannot throw the weights far; equal to torch.nn.utils.clip_grad_norm_.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from tfbook.config import is_number


def _check_rate(name: str, value: object, upper: float | None = None) -> None:
    if not is_number(value) or not math.isfinite(value) or value < 0 or (
        upper is not None and value >= upper
    ):
        bound = f"[0, {upper})" if upper is not None else ">= 0 and finite"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: parameters with >= 2 dimensions decay, the rest (biases, gains) do not.
    A tied matrix (embedding = output layer) appears once: model.parameters() deduplicates."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    _check_rate("weight_decay", weight_decay)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def adamw(
    model: nn.Module, lr: float, betas: tuple[float, float] = (0.9, 0.99),
    weight_decay: float = 0.1, eps: float = 1e-8,
) -> torch.optim.AdamW:
    """torch's AdamW over `param_groups(model, weight_decay)`."""
    _check_rate("lr", lr)
    _check_rate("weight_decay", weight_decay)
    _check_rate("eps", eps)
    if isinstance(betas, str | bytes) or not isinstance(betas, Sequence):
        raise TypeError(f"betas must be a pair of numbers (beta1, beta2), got "
                        f"{type(betas).__name__} {betas!r:.40}")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair of numbers (beta1, beta2), got {betas!r}")
    for b in betas:
        _check_rate("each beta", b, upper=1.0)
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas),
                             eps=eps)


def _tensors(params: object) -> list[Tensor]:
    """One tensor, or an iterable of them, as a list (as torch's clip_grad_norm_ takes)."""
    if isinstance(params, Tensor):
        return [params]
    if isinstance(params, str | bytes) or not isinstance(params, Iterable):
        raise TypeError(f"params must be a tensor or an iterable of tensors, got "
                        f"{type(params).__name__}")
    params = list(params)
    bad = [type(p).__name__ for p in params if not isinstance(p, Tensor)]
    if bad:
        raise TypeError(f"params must be a tensor or an iterable of tensors, got a {bad[0]} "
                        f"among them")
    return params


def global_grad_norm(params: Iterable[Tensor]) -> Tensor:
    """||g||_2 over every gradient at once: the norm of the per-tensor norms."""
    norms = [p.grad.detach().norm(2) for p in _tensors(params) if p.grad is not None]
    if not norms:
        return torch.tensor(0.0)
    return torch.stack(norms).norm(2)


def clip_grad_norm(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale all gradients by min(1, max_norm / (||g|| + 1e-6)) in place; return ||g|| before."""
    _check_rate("max_norm", max_norm)
    params = [p for p in _tensors(params) if p.grad is not None]
    total = global_grad_norm(params)
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.detach().mul_(scale)
    return total
