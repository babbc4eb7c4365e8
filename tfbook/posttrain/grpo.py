"""Group relative policy optimisation (GRPO, Shao et al. 2024) and Dr. GRPO (Liu et al. 2025).

GRPO drops PPO's value network. For each prompt it samples a group of G completions, scores
each with a checkable reward r_1..r_G, and uses the reward relative to its group as the
advantage of every token of that completion:

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + 1e-4)        (scale=True, GRPO)
    A_i =  r_i - mean(r_1..r_G)                                   (scale=False, Dr. GRPO)

std is the unbiased (Bessel, divide by G - 1) standard deviation and 1e-4 is added to it, as in
TRL 1.16's `GRPOTrainer` (`scale_rewards="group"` / `"none"`). Dr. GRPO drops the division
because it up-weights groups whose rewards barely differ (too easy or too hard prompts).

The loss on token t of completion i, with ratio rho_it = pi(o_it) / pi_old(o_it) computed from
log-probs as exp(logp - old_logp), is PPO's clipped surrogate, negated to be minimised:

    l_it = -min(rho_it A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) A_i) + beta KL_it

    KL_it = rho_it (exp(q_it) - q_it - 1),   q_it = ref_logp_it - logp_it

KL_it is the k3 estimator of KL(pi || pi_ref) (Schulman's approximation, always >= 0) times the
ratio rho_it, TRL 1.16's default `use_bias_correction_kl=True` (pass `kl_ratio=False` for the
plain k3 of the GRPO paper). A clipped token (rho above 1 + eps_high with A > 0, or below
1 - eps_low with A < 0) contributes a constant: zero gradient. Otherwise
d l_it / d logp_it = -rho_it A_i (+ the KL term's derivative).

The per-token losses over the completion mask m are reduced in one of three ways:

    grpo:    mean_i [ sum_t m_it l_it / sum_t m_it ]     (each sequence weighs the same)
    bnpo:    sum_it m_it l_it / sum_it m_it                (each token weighs the same)
    dr_grpo: sum_it m_it l_it / (B * max_completion_length)  (a constant: no length bias)

These equal `GRPOTrainer._compute_loss` (trl 1.16, importance_sampling_level="token",
no entropy mask, no vLLM correction) on the same per-token log-probs, tested in float32.
TRL's CPU default `bf16=True` runs the model's forward in bfloat16 autocast, which rounds the
log-probs: on-policy (every ratio 1) only the beta KL term moves, by a few 1e-5 on a tiny
Llama; with old log-probs from an earlier policy the clipped term moves too (a few 1e-3 there).
The comparison uses `bf16=False` semantics (float32 throughout).
Shape legend: B batch (completions), T completion tokens, G group size.
"""

import math
from numbers import Real

import torch
from torch import Tensor

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")
STD_EPS = 1e-4  # TRL 1.16 adds this to the group std


def group_advantages(rewards, group_size: int, scale: bool = True) -> Tensor:
    """Group-relative advantages of B = n_groups * group_size rewards, shape (B,).

    Consecutive runs of `group_size` rewards form one group (TRL's layout: a prompt's G
    completions side by side). A group whose rewards are all equal gets advantage 0 for all.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 (a group of 1 has no relative reward), got {group_size}"
        )
    if isinstance(rewards, Tensor):
        if rewards.dtype == torch.bool or rewards.is_complex():
            raise TypeError(f"rewards must be real numbers, got a tensor of {rewards.dtype}")
        r = rewards if rewards.dtype.is_floating_point else rewards.to(torch.float32)
        if r.dim() != 1:
            raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(r.shape)}")
    elif isinstance(rewards, (list, tuple)):
        bad = [x for x in rewards if isinstance(x, bool) or not isinstance(x, Real)]
        if bad:
            raise TypeError(
                f"rewards must be real numbers, got {type(bad[0]).__name__} ({bad[0]!r})"
            )
        r = torch.tensor([float(x) for x in rewards], dtype=torch.float32)
    else:
        raise TypeError(
            f"rewards must be a list or 1-D tensor of numbers, got {type(rewards).__name__}"
        )
    if r.numel() == 0 or r.numel() % group_size:
        raise ValueError(
            f"the number of rewards ({r.numel()}) must be a positive multiple of "
            f"group_size ({group_size})"
        )
    if not torch.isfinite(r).all():
        raise ValueError(f"rewards must be finite numbers, got {r.tolist()}")
    grouped = r.view(-1, group_size)
    adv = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        adv = adv / (grouped.std(dim=1, unbiased=True, keepdim=True) + STD_EPS)
    return adv.reshape(-1)


def _check_float(name: str, x, shape) -> None:
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        given = f"a tensor of {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a floating-point tensor, got {given}")
    if shape is not None and x.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


def grpo_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    ref_logps: Tensor | None = None,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    kl_ratio: bool = True,
) -> Tensor:
    """GRPO's clipped loss (a scalar) from per-token log-probs (B, T), advantages (B,) and mask.

    logps carry the gradient; old_logps (the sampling policy's) and ref_logps are constants.
    loss_type picks the normalisation (module docstring); dr_grpo needs max_completion_length.
    """
    _check_float("logps", logps, None)
    if logps.dim() != 2:
        raise ValueError(f"logps must be 2-D (B, T), got shape {tuple(logps.shape)}")
    _check_float("old_logps", old_logps, logps.shape)
    _check_float("advantages", advantages, logps.shape[:1])
    if not isinstance(completion_mask, Tensor) or completion_mask.dtype.is_floating_point or (
        completion_mask.is_complex()
    ):
        given = (
            f"a tensor of {completion_mask.dtype}"
            if isinstance(completion_mask, Tensor)
            else type(completion_mask).__name__
        )
        raise TypeError(f"completion_mask must be a bool or integer tensor of 0/1, got {given}")
    if completion_mask.shape != logps.shape:
        raise ValueError(
            f"completion_mask must have shape {tuple(logps.shape)}, "
            f"got {tuple(completion_mask.shape)}"
        )
    if ((completion_mask != 0) & (completion_mask != 1)).any():
        raise ValueError("completion_mask must hold only 0 and 1")
    if logps.numel() == 0:
        raise ValueError(f"logps is empty (shape {tuple(logps.shape)})")
    empty = (completion_mask.sum(-1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"completion_mask has no token for sequence(s) {empty}")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    for name, eps in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high)):
        if isinstance(eps, bool) or not isinstance(eps, Real) or not (0 <= eps < math.inf):
            raise ValueError(f"{name} must be a finite number >= 0, got {eps!r}")
    if isinstance(beta, bool) or not isinstance(beta, Real) or not (0 <= beta < math.inf):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    if beta != 0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps (the reference model's per-token log-probs)")
        _check_float("ref_logps", ref_logps, logps.shape)
    if loss_type == "dr_grpo":
        if (
            isinstance(max_completion_length, bool)
            or not isinstance(max_completion_length, int)
            or max_completion_length < logps.size(1)
        ):
            raise ValueError(
                f"dr_grpo needs max_completion_length, an int >= T = {logps.size(1)}, "
                f"got {max_completion_length!r}"
            )
    for name, x in (("logps", logps), ("old_logps", old_logps), ("advantages", advantages)):
        if not torch.isfinite(x.detach()).all():
            raise ValueError(f"{name} must be finite (pad masked positions with 0, not NaN/inf)")

    mask = completion_mask.to(logps.dtype)
    ratio = torch.exp(logps - old_logps.detach())  # (B, T)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    adv = advantages.detach().unsqueeze(1)  # (B, 1)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if beta != 0:
        q = ref_logps.detach() - logps
        kl = torch.exp(q) - q - 1  # k3, >= 0
        if kl_ratio:
            kl = kl * ratio
        per_token = per_token + beta * kl
    per_token = per_token * mask
    if loss_type == "grpo":
        return (per_token.sum(-1) / mask.sum(-1)).mean()
    if loss_type == "bnpo":
        return per_token.sum() / mask.sum()
    return per_token.sum() / (logps.size(0) * max_completion_length)
