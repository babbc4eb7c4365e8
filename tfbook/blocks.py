"""Encoder and decoder blocks: attention and FFN sub-layers around a residual stream.

Post-LN (Vaswani et al. 2017, BERT):  x = LN(x + Sublayer(x))
Pre-LN  (GPT-2, most models since):   x = x + Sublayer(LN(x))

Pre-LN leaves the residual stream untouched by normalisation, so the gradient reaches early
layers through a plain sum; deep post-LN stacks need learning-rate warmup to train (seed 003).
Shape legend: B batch, T target sequence, S source sequence, C model width.
"""

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from tfbook.attention import MultiHeadAttention
from tfbook.feedforward import FeedForward
from tfbook.layernorm import LayerNorm


@dataclass(frozen=True)
class BlockConfig:
    """Hyper-parameters of one encoder or decoder block."""

    d_model: int = 512  # C, width of the residual stream
    n_heads: int = 8  # H, attention heads; D = C / H
    d_ff: int = 2048  # F, hidden width of the feed-forward network
    dropout: float = 0.1  # on attention weights, FFN hidden units and sub-layer outputs
    activation: str = "relu"  # "relu", "gelu" (erf form) or "gelu_tanh"
    norm_first: bool = False  # False: post-LN (Vaswani, BERT); True: pre-LN (GPT-2)
    layer_norm_eps: float = 1e-5  # added to the variance inside LayerNorm
    bias: bool = True  # biases in the linear layers
    # torch's fused kernels for attention (when its weights are not asked for), LayerNorm
    # and the activation: the same maths, tested equal, just faster; False runs our own code
    fused: bool = True


SubLayer = Callable[[Tensor], tuple[Tensor, Tensor | None]]  # h -> (output, attention weights)


def residual(
    x: Tensor, sublayer: SubLayer, norm: nn.Module, dropout: nn.Module, norm_first: bool
) -> tuple[Tensor, Tensor | None]:
    """One sub-layer on the residual stream, post-LN or pre-LN (seed 003)."""
    if norm_first:
        y, weights = sublayer(norm(x))
        return x + dropout(y), weights  # pre-LN: the stream itself is never normalised
    y, weights = sublayer(x)
    return norm(x + dropout(y)), weights  # post-LN: normalise after adding


class EncoderBlock(nn.Module):
    """Self-attention then FFN, each with a residual and a LayerNorm (Vaswani et al., 3.1)."""

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        c = config
        self.norm_first = c.norm_first
        self.attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout, c.bias, c.fused)
        self.norm1 = LayerNorm(c.d_model, c.layer_norm_eps, c.fused)
        self.ff = FeedForward(c.d_model, c.d_ff, c.activation, c.dropout, c.bias, c.fused)
        self.norm2 = LayerNorm(c.d_model, c.layer_norm_eps, c.fused)
        self.dropout = nn.Dropout(c.dropout)  # on each sub-layer's output (stateless, shared)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, C) -> (B, T, C) and the self-attention weights (B, H, T, T) or None."""

        def self_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            return self.attn(h, mask=mask, causal=causal, need_weights=need_weights)

        def feed_forward(h: Tensor) -> tuple[Tensor, None]:
            return self.ff(h), None

        x, weights = residual(x, self_attention, self.norm1, self.dropout, self.norm_first)
        x, _ = residual(x, feed_forward, self.norm2, self.dropout, self.norm_first)
        return x, weights


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder, then FFN (Vaswani et al., 3.1)."""

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        c = config
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout, c.bias, c.fused)
        self.norm1 = LayerNorm(c.d_model, c.layer_norm_eps, c.fused)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout, c.bias, c.fused)
        self.norm2 = LayerNorm(c.d_model, c.layer_norm_eps, c.fused)
        self.ff = FeedForward(c.d_model, c.d_ff, c.activation, c.dropout, c.bias, c.fused)
        self.norm3 = LayerNorm(c.d_model, c.layer_norm_eps, c.fused)
        self.dropout = nn.Dropout(c.dropout)  # on each sub-layer's output (stateless, shared)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x (B, T, C), memory (B, S, C) -> (B, T, C), self (B, H, T, T), cross (B, H, T, S).

        The self-attention is always causal (teacher forcing must not peek at the answer);
        `mask` may hide padded target positions, `memory_mask` padded source positions.
        """

        def self_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            return self.self_attn(h, mask=mask, causal=True, need_weights=need_weights)

        def cross_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            # queries from the decoder, keys and values from the encoder's output
            return self.cross_attn(h, memory, mask=memory_mask, need_weights=need_weights)

        def feed_forward(h: Tensor) -> tuple[Tensor, None]:
            return self.ff(h), None

        x, self_weights = residual(x, self_attention, self.norm1, self.dropout, self.norm_first)
        x, cross_weights = residual(x, cross_attention, self.norm2, self.dropout, self.norm_first)
        x, _ = residual(x, feed_forward, self.norm3, self.dropout, self.norm_first)
        return x, self_weights, cross_weights
