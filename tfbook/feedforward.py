"""The position-wise feed-forward network (Vaswani et al., 3.3) and its gated form, SwiGLU.

    FFN(x)    = act(x W_1 + b_1) W_2 + b_2,   act = ReLU (Vaswani) or GELU (GPT, BERT)
    SwiGLU(x) = (SiLU(x W_gate) * (x W_1)) W_2                      (Shazeer 2020, eq. 6)

The same network is applied to every position separately: it mixes features within a
token, never across tokens (that is attention's job). SwiGLU multiplies a linear "value" path
by a smooth gate computed from the same input; Llama-style models use it with F about
(8/3) C so that its three matrices cost what the MLP's two would at F = 4C.
Shape legend: B, T, C, and F = d_ff.
"""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.hooks import HookPoint

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
FFNS = ("mlp", "swiglu")


def relu(x: Tensor) -> Tensor:
    """max(0, x)."""
    return torch.clamp_min(x, 0.0)


def gelu(x: Tensor) -> Tensor:
    """x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the exact GELU (Hendrycks & Gimpel; BERT)."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Tensor) -> Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the approximation used by GPT-2."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x), the "swish" gate of SwiGLU (Elfwing et al. 2018; Ramachandran et al.)."""
    return x * torch.sigmoid(x)


def activation(name: str, fused: bool = False) -> Callable[[Tensor], Tensor]:
    """Look an activation up by name: 'relu', 'gelu' (erf form), 'gelu_tanh' or 'silu'.

    fused=True returns torch's one-kernel version of the same function.
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")
    if fused:
        return {"relu": F.relu, "gelu": F.gelu, "silu": F.silu,
                "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[name]
    return {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}[name]


class FeedForward(nn.Module):
    """Linear C -> F, activation, Linear F -> C, applied at each position (Vaswani 3.3)."""

    def __init__(
        self, d_model: int, d_ff: int, activation_name: str = "relu", dropout: float = 0.0,
        bias: bool = True, fused: bool = False,
    ) -> None:
        super().__init__()
        self.act = activation(activation_name, fused)
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)  # W_1, b_1: "diffuse"
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)  # W_2, b_2: "compress"
        self.dropout = nn.Dropout(dropout)
        self.hidden, self.out = HookPoint(), HookPoint()  # (B, T, F) and (B, T, C)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C)."""
        h = self.hidden(self.act(self.fc_in(x)))  # (B, T, F)
        return self.out(self.fc_out(self.dropout(h)))  # (B, T, C)


class SwiGLU(nn.Module):
    """Gated feed-forward: fc_out(act(fc_gate(x)) * fc_in(x)) at each position (Shazeer 2020)."""

    def __init__(
        self, d_model: int, d_ff: int, activation_name: str = "silu", dropout: float = 0.0,
        bias: bool = False, fused: bool = False,
    ) -> None:
        super().__init__()
        self.act = activation(activation_name, fused)
        self.fc_gate = nn.Linear(d_model, d_ff, bias=bias)  # W_gate: what to let through
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)  # W_1: the value path ("up")
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)  # W_2: back to C ("down")
        self.dropout = nn.Dropout(dropout)
        self.packed_gate_in = None  # W_gate, W_1 as one matrix: tfbook.packing (for decoding)
        self.hidden, self.out = HookPoint(), HookPoint()  # (B, T, F) and (B, T, C)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C)."""
        packed = self.packed_gate_in
        if packed is not None and packed.usable():
            gate, value = packed(x)  # one product x [W_gate; W_1]^T, split (tfbook.packing)
        else:
            gate, value = self.fc_gate(x), self.fc_in(x)
        h = self.hidden(self.act(gate) * value)  # (B, T, F): gate times value
        return self.out(self.fc_out(self.dropout(h)))  # (B, T, C)


def make_ffn(
    kind: str, d_model: int, d_ff: int, activation_name: str, dropout: float, bias: bool,
    fused: bool,
) -> nn.Module:
    """The feed-forward network a config names: 'mlp' (FeedForward) or 'swiglu' (SwiGLU)."""
    if kind == "mlp":
        return FeedForward(d_model, d_ff, activation_name, dropout, bias, fused)
    if kind == "swiglu":
        return SwiGLU(d_model, d_ff, activation_name, dropout, bias, fused)
    raise ValueError(f"ffn must be one of {FFNS}, got {kind!r}")
