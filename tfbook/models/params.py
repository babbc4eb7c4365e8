"""Counting parameters, the way the papers count them.

A weight shared by two modules (a tied embedding and output layer) is one set of numbers,
so it is counted once: `nn.Module.parameters()` already yields each Parameter only once.
"""

from torch import nn


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of distinct scalar parameters of `model` (tied weights counted once).

    Works on models built on the `meta` device, which have shapes but no memory.
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
