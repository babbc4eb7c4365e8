"""The backward pass of attention and of LayerNorm, derived by hand with the chain rule.

Forward, for one head:   Z = Q K^T / sqrt(D),   A = softmax(Z),   Y = A V   (Z: the scores)
Backward, given G = dL/dY:
    dV = A^T G                                       (1)
    dA = G V^T                                       (2)
    dZ = A * (dA - rowsum(dA * A))                   (3)  softmax: da_i/dz_j = a_i (d_ij - a_j)
    dQ = dZ K / sqrt(D),   dK = dZ^T Q / sqrt(D)     (4)
With Q = X W_Q, K = X W_K, V = X W_V:
    dW_Q = X^T dQ,  dW_K = X^T dK,  dW_V = X^T dV    (5)
    dX = dQ W_Q^T + dK W_K^T + dV W_V^T              (6)

Written as `torch.autograd.Function`s: autograd calls our `backward` instead of deriving one
itself, so `gradcheck` and a comparison with autograd test the derivation.
Shapes: (..., T, D) queries, (..., S, D) keys and values, (..., T, S) scores; X is (..., T, C).
"""

import math

import torch
from torch import Tensor

from tfbook.attention import scaled_dot_product_attention


def attention_backward(
    grad_y: Tensor, q: Tensor, k: Tensor, v: Tensor, a: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Steps (1)-(4): dL/dY and the saved Q, K, V, A -> dL/dQ, dL/dK, dL/dV."""
    scale = 1.0 / math.sqrt(q.size(-1))
    grad_v = a.transpose(-2, -1) @ grad_y  # (1): (..., S, T) @ (..., T, Dv) -> (..., S, Dv)
    grad_a = grad_y @ v.transpose(-2, -1)  # (2): (..., T, Dv) @ (..., Dv, S) -> (..., T, S)
    # (3), grad_s = dZ: masked entries have a = 0, so their gradient is 0 too, no special case
    grad_s = a * (grad_a - (grad_a * a).sum(dim=-1, keepdim=True))  # (..., T, S)
    grad_q = grad_s @ k * scale  # (4): (..., T, S) @ (..., S, D) -> (..., T, D)
    grad_k = grad_s.transpose(-2, -1) @ q * scale  # (4): (..., S, T) @ (..., T, D)
    return grad_q, grad_k, grad_v


class AttentionFunction(torch.autograd.Function):
    """softmax(Q K^T / sqrt(D)) V with the hand-derived backward (1)-(4)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        y, a = scaled_dot_product_attention(q, k, v, mask)  # (..., T, Dv), (..., T, S)
        ctx.save_for_backward(q, k, v, a)
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, a = ctx.saved_tensors
        grad_q, grad_k, grad_v = attention_backward(grad_y, q, k, v, a)
        return grad_q, grad_k, grad_v, None  # no gradient for the mask


class SelfAttentionFunction(torch.autograd.Function):
    """One head of self-attention from X with weights W_Q, W_K, W_V; backward (1)-(6)."""

    @staticmethod
    def forward(
        ctx, x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        q, k, v = x @ w_q, x @ w_k, x @ w_v  # (..., T, D) each: (..., T, C) @ (C, D)
        y, a = scaled_dot_product_attention(q, k, v, mask)  # (..., T, D), (..., T, T)
        ctx.save_for_backward(x, w_q, w_k, w_v, q, k, v, a)
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None]:
        x, w_q, w_k, w_v, q, k, v, a = ctx.saved_tensors
        grad_q, grad_k, grad_v = attention_backward(grad_y, q, k, v, a)
        x_t = x.transpose(-2, -1)  # (..., C, T)
        # (5): sum over any batch dimensions, since the weights are shared by all sequences
        grad_w_q = (x_t @ grad_q).reshape(-1, *w_q.shape).sum(0)  # (C, D)
        grad_w_k = (x_t @ grad_k).reshape(-1, *w_k.shape).sum(0)  # (C, D)
        grad_w_v = (x_t @ grad_v).reshape(-1, *w_v.shape).sum(0)  # (C, D)
        grad_x = grad_q @ w_q.T + grad_k @ w_k.T + grad_v @ w_v.T  # (6): (..., T, C)
        return grad_x, grad_w_q, grad_w_k, grad_w_v, None


class LayerNormFunction(torch.autograd.Function):
    """y = gamma * x_hat + beta with x_hat = (x - mu) / sqrt(var + eps), hand-derived backward.

    With r = 1 / sqrt(var + eps) and g = dL/dx_hat = dL/dy * gamma, over the C features:
        dL/dx = r * (g - mean(g) - x_hat * mean(g * x_hat))
        dL/dgamma = sum over positions of dL/dy * x_hat,   dL/dbeta = sum of dL/dy
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
        mu = x.mean(dim=-1, keepdim=True)  # (..., 1)
        r = torch.rsqrt((x - mu).pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
        x_hat = (x - mu) * r  # (..., C)
        ctx.save_for_backward(x_hat, r, weight)
        return x_hat * weight + bias

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        x_hat, r, weight = ctx.saved_tensors
        g = grad_y * weight  # (..., C): gradient with respect to x_hat
        grad_x = r * (
            g - g.mean(dim=-1, keepdim=True) - x_hat * (g * x_hat).mean(dim=-1, keepdim=True)
        )
        C = x_hat.size(-1)
        grad_weight = (grad_y * x_hat).reshape(-1, C).sum(0)  # (C,)
        grad_bias = grad_y.reshape(-1, C).sum(0)  # (C,)
        return grad_x, grad_weight, grad_bias, None


def attention_manual_backward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
) -> Tensor:
    """Attention output (..., T, Dv) whose gradient comes from the hand-derived backward."""
    return AttentionFunction.apply(q, k, v, mask)


def layer_norm_manual_backward(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5
) -> Tensor:
    """LayerNorm of x (..., C) whose gradient comes from the hand-derived backward."""
    return LayerNormFunction.apply(x, weight, bias, eps)
