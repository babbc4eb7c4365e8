"""The training objective of every model in tfbook: cross-entropy on the next (or masked) token.

    loss = mean over kept positions t of  -log softmax(z_t)[y_t]

With label smoothing eps (Szegedy et al. 2016; Vaswani et al., 5.4) the one-hot target becomes
(1 - eps) on y_t plus eps spread uniformly over the V classes, so

    loss_t = (1 - eps) * (-log p_t[y_t]) + eps * mean_v (-log p_t[v])

Positions whose target is `IGNORE_INDEX` (-100, PyTorch's convention) do not count: padding in
a seq2seq batch, unmasked tokens in BERT's MLM objective, the prompt in a fine-tune.
Shape legend: B batch, T sequence, V vocab.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # a target that the loss skips


def cross_entropy(
    logits: Tensor, targets: Tensor, ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Mean cross-entropy of logits (..., V) against integer targets (...), skipping ignore_index.

    Equal to `F.cross_entropy(logits.view(-1, V), targets.view(-1), ...)` (tested); written out
    so that the chapter can show each term. A batch whose targets are all ignored has no loss
    to average: it returns NaN, as PyTorch does.
    """
    if not isinstance(logits, Tensor) or not logits.dtype.is_floating_point or logits.dim() < 1:
        raise TypeError(f"logits must be a floating tensor of shape (..., V), got {logits!r:.80}")
    if not isinstance(targets, Tensor) or targets.dtype.is_floating_point or targets.dtype in (
        torch.bool, torch.complex64, torch.complex128
    ):
        given = getattr(targets, "dtype", type(targets).__name__)
        raise TypeError(f"targets must be an integer tensor, got {given}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets must have the shape of logits without the last dimension "
            f"{tuple(logits.shape[:-1])}, got {tuple(targets.shape)}"
        )
    check_smoothing(label_smoothing)
    V = logits.size(-1)
    keep = targets != ignore_index  # (...)
    if keep.any() and (int(targets[keep].min()) < 0 or int(targets[keep].max()) >= V):
        raise ValueError(
            f"targets must lie in [0, {V}) or equal ignore_index={ignore_index}, got values in "
            f"[{int(targets[keep].min())}, {int(targets[keep].max())}]"
        )
    log_probs = F.log_softmax(logits, dim=-1)  # (..., V)
    safe = torch.where(keep, targets, 0)  # any valid index where ignored; zeroed below
    nll = -log_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (...), -log p[y]
    if label_smoothing > 0.0:
        uniform = -log_probs.mean(dim=-1)  # (...), cross-entropy against the uniform target
        nll = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    return (nll * keep).sum() / keep.sum()


def check_smoothing(label_smoothing: float) -> None:
    """eps must lie in [0, 1): at eps = 1 the target is uniform and says nothing about y."""
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, int | float) or not (
        0.0 <= label_smoothing < 1.0
    ):
        raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing!r}")


def smoothed_targets(targets: Tensor, V: int, label_smoothing: float) -> Tensor:
    """The target distribution of label smoothing: (...,) ids -> (..., V) rows summing to 1."""
    check_smoothing(label_smoothing)
    one_hot = F.one_hot(targets, V).float()  # (..., V)
    return (1.0 - label_smoothing) * one_hot + label_smoothing / V
