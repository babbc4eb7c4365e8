"""LoRA: fine-tune a frozen model through a low-rank update of chosen linear layers
(Hu et al. 2022, "LoRA: Low-Rank Adaptation of Large Language Models", section 4.1).

    h = x W^T + (alpha / r) * x A^T B^T          W (C_out, C_in) frozen
                                                 A (r, C_in), B (C_out, r) trained, r << C

The update Delta W = (alpha / r) B A has rank at most r, so a layer trains r (C_in + C_out)
numbers instead of C_out C_in. B starts at zero, so the adapted model computes exactly what
the base model computes until the first optimiser step; A starts random (as a linear layer
is initialised) so that B's gradient is not zero. After training, W + (alpha / r) B A is one
matrix again: the merged model runs at the base model's speed.

Merging never writes into W: it builds a NEW tensor. Writing W += Delta W in place would
change every model that shares that tensor (a second copy loaded with `assign=True`, the
reference a chapter compares against) and could only be undone up to rounding.

Shape legend: B batch, T sequence, C_in / C_out input / output width of the wrapped layer,
r the rank. (The matrix named B in the paper is `lora_B` here; B alone is the batch.)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.config import is_int, is_number
from tfbook.models.params import count_parameters

# The linear layers of tfbook's blocks, by the attribute names a target can use.
ATTENTION_LINEARS = ("q_proj", "k_proj", "v_proj", "out_proj")  # tfbook.attention
FFN_LINEARS = ("fc_gate", "fc_in", "fc_out")  # tfbook.feedforward (fc_gate: SwiGLU only)


def check_lora_args(r: object, alpha: object, dropout: object) -> None:
    """r an int >= 1, alpha a finite number > 0, dropout in [0, 1)."""
    if not is_int(r) or r < 1:
        raise ValueError(f"LoRA rank r must be an int >= 1, got {r!r}")
    if not is_number(alpha) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"LoRA alpha must be a finite number > 0, got {alpha!r}")
    if not is_number(dropout) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must lie in [0, 1), got {dropout!r}")


def check_rank_fits(r: int, in_features: int, out_features: int, name: str = "the layer") -> None:
    """r <= min(C_in, C_out): Delta W = B A (C_out x C_in) cannot have a larger rank, and A and
    B would hold more numbers than W itself."""
    if r > min(in_features, out_features):
        raise ValueError(f"LoRA rank r must be at most min(C_in, C_out) = "
                         f"{min(in_features, out_features)} for {name} ({in_features} -> "
                         f"{out_features}), got r={r}")


def lora_size(in_features: int, out_features: int, r: int) -> int:
    """Trainable numbers of one adapted layer: r * (C_in + C_out) (A is r x C_in, B C_out x r).

    lora_size(576, 576, 8) -> 9216, against 576 * 576 = 331,776 in W.
    """
    return r * (in_features + out_features)


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus the trainable low-rank update (alpha / r) B A (Hu et al., 4.1)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        check_lora_args(r, alpha, dropout)
        check_rank_fits(r, base.in_features, base.out_features)
        self.base = base.requires_grad_(False)  # W and its bias frozen (the flag is shared)
        self.r = r
        self.alpha = alpha
        self.scaling = alpha / r  # the update's size does not change when r does
        weight = base.weight
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, dtype=weight.dtype,
                                               device=weight.device))  # (r, C_in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=weight.dtype,
                                               device=weight.device))  # (C_out, r)
        # A as nn.Linear(C_in, r) would start (and as peft starts it); B = 0 makes the
        # update zero, so the model is unchanged until the first step
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        # False: the layer computes its frozen base alone (the reference model of DPO and
        # GRPO is the policy with every adapter off; tfbook.posttrain.dpo.adapters_disabled)
        self.enabled = True

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> Tensor:
        """The frozen W (C_out, C_in), as code that reads `layer.weight` (dtype, device) expects."""
        return self.base.weight

    @property
    def bias(self) -> Tensor | None:
        """The frozen bias (C_out,) or None."""
        return self.base.bias

    def delta_weight(self) -> Tensor:
        """Delta W = (alpha / r) B A, (C_out, C_in): what training adds to W."""
        return (self.lora_B @ self.lora_A) * self.scaling  # (C_out, r) @ (r, C_in)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., C_in) -> x W^T + b + (alpha / r) dropout(x) A^T B^T, (..., C_out)."""
        # the base output first, as peft computes it: backward then sums the gradients of x
        # in the same order, so the two libraries give bit-equal gradients (tested)
        frozen = self.base(x)  # (..., C_out), the base model's output
        if not self.enabled:
            return frozen
        down = F.linear(self.dropout(x), self.lora_A)  # (..., r): into the small space
        return frozen + F.linear(down, self.lora_B) * self.scaling  # (..., C_out)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A new nn.Linear with weight W + (alpha / r) B A in a NEW tensor; W is not touched."""
        base = self.base
        layer = nn.Linear(self.in_features, self.out_features, bias=base.bias is not None,
                          device=base.weight.device, dtype=base.weight.dtype)
        layer.weight.copy_(base.weight + self.delta_weight())
        if base.bias is not None:
            layer.bias.copy_(base.bias)
        return layer

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, scaling={self.scaling:g}"


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every LoRALinear of the model, by its dotted name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def _check_targets(targets: object) -> tuple[str, ...]:
    if isinstance(targets, str) or not isinstance(targets, Sequence) or not targets or not all(
        isinstance(t, str) for t in targets
    ):
        raise TypeError(f"targets must be a non-empty list or tuple of layer names such as "
                        f"('q_proj', 'v_proj'), got {targets!r}")
    return tuple(targets)


def add_lora(
    model: nn.Module, targets: Sequence[str] = ("q_proj", "v_proj"), r: int = 8,
    alpha: float = 16, dropout: float = 0.0,
) -> nn.Module:
    """Wrap every linear layer whose attribute name is in `targets` in a LoRALinear, in place.

    In a GPT, ("q_proj", "v_proj") adapts W_Q and W_V of every block, as Hu et al. do
    (section 7.1). Every other parameter is frozen, so only the A and B matrices train.
    Returns the model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    targets = _check_targets(targets)
    check_lora_args(r, alpha, dropout)
    if lora_layers(model):
        raise ValueError(f"{type(model).__name__} already has LoRA layers (e.g. "
                         f"{next(iter(lora_layers(model)))}); apply add_lora once, or merge "
                         "with merge_lora first")
    linear_names = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                           if isinstance(m, nn.Linear)})
    found: dict[str, list[str]] = {t: [] for t in targets}
    for name, module in model.named_modules():
        attribute = name.rsplit(".", 1)[-1]
        if attribute in found:
            if not isinstance(module, nn.Linear):
                raise TypeError(f"LoRA target {attribute!r} is {name!r}, a "
                                f"{type(module).__name__}, not an nn.Linear; the linear "
                                f"layers are named {linear_names}")
            found[attribute].append(name)
    missing = [t for t, names in found.items() if not names]
    if missing:
        dotted = [t for t in missing if "." in t]
        hint = (f" (targets are attribute names such as 'q_proj', and every layer of that name "
                f"is adapted; {dotted[0]!r} is a dotted path)" if dotted else "")
        raise ValueError(f"{type(model).__name__} has no layer named {missing}; its linear "
                         f"layers are named {linear_names}{hint}")
    for names in found.values():  # every rank checked before any layer is wrapped
        for name in names:
            layer = model.get_submodule(name)
            check_rank_fits(r, layer.in_features, layer.out_features, repr(name))
    model.requires_grad_(False)  # the base model is frozen: only A and B will train
    for names in found.values():
        for name in names:
            parent_name, _, attribute = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, attribute, LoRALinear(getattr(parent, attribute), r, alpha, dropout))
    return model


def trainable_parameters(model: nn.Module) -> int:
    """Number of parameters that an optimiser would update (requires_grad), tied ones once."""
    return count_parameters(model, trainable_only=True)


def merge_lora(model: nn.Module) -> nn.Module:
    """A plain copy of an adapted model: each LoRALinear becomes nn.Linear(W + (alpha/r) B A).

    The adapted model is left as it is (it still runs and can keep training), and no tensor
    is shared between the two, so neither can change the other. Every parameter of the copy
    is trainable again, as in a freshly built model.
    """
    if not lora_layers(model):
        raise ValueError(f"{type(model).__name__} has no LoRA layers to merge; add_lora first")
    plain = copy.deepcopy(model)  # deepcopy keeps tied weights tied (one tensor, copied once)
    for name, layer in lora_layers(plain).items():
        parent_name, _, attribute = name.rpartition(".")
        setattr(plain.get_submodule(parent_name), attribute, layer.merged())
    return plain.requires_grad_(True)
