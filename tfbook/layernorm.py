"""Layer normalisation from scratch (Ba et al. 2016; seed 001).

    mu = mean_c x_c,   sigma^2 = mean_c (x_c - mu)^2
    y = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta

Each token vector is normalised over its own C features, independently of the batch and of
the other positions. Shape legend: B batch, T sequence, C model width.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """gamma * (x - mu) / sqrt(var + eps) + beta over the last dimension (Ba et al., eq. 4)."""
    mu = x.mean(dim=-1, keepdim=True)  # (..., 1)
    var = (x - mu).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), the biased variance
    x_hat = (x - mu) * torch.rsqrt(var + eps)  # (..., C): zero mean, unit variance
    return x_hat * weight + bias  # learned per-feature scale and shift


class LayerNorm(nn.Module):
    """LayerNorm with learned gain gamma (ones) and bias beta (zeros) of width C.

    fused=True computes the same function with torch's single kernel (F.layer_norm), which
    is faster and keeps less for the backward pass; the tests check the two agree.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, fused: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma
        self.bias = nn.Parameter(torch.zeros(d_model))  # beta

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C), each position normalised over C."""
        if self.fused:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        return layer_norm(x, self.weight, self.bias, self.eps)
