"""Normalisation layers from scratch: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich
2019).

    LayerNorm:  mu = mean_c x_c,  sigma^2 = mean_c (x_c - mu)^2
                y = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta
    RMSNorm:    y = gamma * x / sqrt(mean_c x_c^2 + eps)          (no centring, no bias)

Each token vector is normalised over its own C features, independently of the batch and of
the other positions. RMSNorm drops the mean and the bias: one reduction instead of two, and
in practice the same quality (Llama, SmolLM2). Shape legend: B batch, T sequence, C width.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NORMS = ("layer", "rms")


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    """gamma * (x - mu) / sqrt(var + eps) + beta over the last dimension (Ba et al., eq. 4)."""
    mu = x.mean(dim=-1, keepdim=True)  # (..., 1)
    var = (x - mu).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), the biased variance
    x_hat = (x - mu) * torch.rsqrt(var + eps)  # (..., C): zero mean, unit variance
    y = x_hat * weight  # learned per-feature scale
    return y if bias is None else y + bias  # and shift


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """gamma * x / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019, eq. 4), computed in float32
    or wider.

    In half precision the mean of squares overflows or loses its digits, so the statistics
    are taken in float32 and only the normalised vector is cast back before the gain (float64
    input stays float64).
    """
    x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    rms_inv = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    return weight * (x32 * rms_inv).to(x.dtype)  # (..., C)


class LayerNorm(nn.Module):
    """LayerNorm with learned gain gamma (ones) and bias beta (zeros) of width C.

    fused=True computes the same function with torch's single kernel (F.layer_norm), which
    is faster and keeps less for the backward pass; the tests check the two agree.
    bias=False drops beta (as `nn.LayerNorm(bias=False)` and blocks without biases do).
    """

    def __init__(
        self, d_model: int, eps: float = 1e-5, fused: bool = False, bias: bool = True
    ) -> None:
        super().__init__()
        self.eps = eps
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None  # beta

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C), each position normalised over C."""
        if self.fused:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain gamma (ones) of width C and no bias."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C), each position scaled to unit root mean square."""
        return rms_norm(x, self.weight, self.eps)


def make_norm(
    kind: str, d_model: int, eps: float, fused: bool = False, bias: bool = True
) -> nn.Module:
    """The normalisation a config names: 'layer' (LayerNorm) or 'rms' (RMSNorm, no bias)."""
    if kind == "layer":
        return LayerNorm(d_model, eps, fused, bias)
    if kind == "rms":
        return RMSNorm(d_model, eps)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
