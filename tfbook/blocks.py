"""Transformer blocks: attention and feed-forward sub-layers around a residual stream.

Post-LN (Vaswani et al. 2017, BERT):  x = Norm(x + Sublayer(x))
Pre-LN  (GPT-2, Llama, most models since):   x = x + Sublayer(Norm(x))

Pre-LN leaves the residual stream untouched by normalisation, so the gradient reaches early
layers through a plain sum; deep post-LN stacks need learning-rate warmup to train
(Xiong et al. 2020, "On layer normalization in the Transformer architecture").

Two blocks serve every model of the book, chosen by configuration, not by subclassing:

- `SelfAttentionBlock`: self-attention then FFN. BERT's encoder (bidirectional), GPT's and
  Llama's decoder (causal=True), the encoder of the encoder-decoder.
- `CrossAttentionBlock`: causal self-attention, cross-attention to a source, then FFN: the
  decoder of the encoder-decoder.

`BlockConfig` picks the norm ("layer" or "rms"), the FFN ("mlp" or "swiglu"), the number of
key/value heads (grouped-query attention), RoPE inside attention (its base, pair
convention and scaling), QK-norm (Qwen3), a sliding attention window (Mistral), a mixture of
experts (ffn="moe", Mixtral; routing="sigmoid" with groups and shared experts, DeepSeek-V3),
multi-head latent attention (kv_lora_rank, DeepSeek-V2/V3) and the kernels; a Llama-style
decoder is a GPT with another `BlockConfig`.
It is the one source of block settings: every model config builds its own with
`block_config_of`, which copies the fields of the same name and checks them in the model
config's words.
Shape legend: B batch, T target sequence, S source sequence, C model width.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import Any

from torch import Tensor, nn

from tfbook.attention import MultiHeadAttention, check_attention_settings
from tfbook.cache import LayerCache
from tfbook.config import check_bool, check_choice, check_positive, is_number
from tfbook.feedforward import ACTIVATIONS, FFNS, make_ffn
from tfbook.hooks import HookPoint
from tfbook.mla import MultiHeadLatentAttention, check_mla_settings
from tfbook.moe import ROUTINGS, MoEFeedForward, check_deepseek_settings
from tfbook.normalization import NORMS, make_norm
from tfbook.rope_scaling import check_rope_scaling


@dataclass(frozen=True)
class BlockConfig:
    """Hyper-parameters of one block; a model config builds one with `block_config_of`."""

    d_model: int = 512  # C, width of the residual stream
    n_heads: int = 8  # H, attention (query) heads; D = C / H
    d_ff: int = 2048  # F, hidden width of the feed-forward network
    dropout: float = 0.1  # on attention weights, FFN hidden units and sub-layer outputs
    activation: str = "relu"  # "relu", "gelu" (erf form), "gelu_tanh" or "silu"
    norm_first: bool = False  # False: post-LN (Vaswani, BERT); True: pre-LN (GPT-2, Llama)
    norm_eps: float = 1e-5  # added to the variance (or mean square) inside the norm
    bias: bool = True  # biases in the linear layers and the LayerNorms
    # The kernels: each computes the same maths as our own readable code (the tests check),
    # only faster or leaner. Attention's is chosen by name in `attend` ("reference" is ours,
    # and runs whenever the weights are asked for); LayerNorm and the activation have their
    # own switches: True calls torch's one-kernel versions, False our code.
    attention: str = "torch"  # "reference", "torch" (F.scaled_dot_product_attention), "flash"
    fused_norm: bool = True  # F.layer_norm instead of our layer_norm (RMSNorm is always ours)
    fused_activation: bool = True  # F.gelu, F.silu, F.relu instead of ours
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    ffn: str = "mlp"  # "mlp" (act(x W1) W2) or "swiglu" (gated, three matrices)
    n_kv_heads: int | None = None  # H_kv key/value heads; None = H (plain multi-head)
    rope_base: float | None = None  # RoPE inside attention with this base; None = no RoPE
    rope_convention: str = "interleaved"  # RoPE planes: adjacent pairs or the two halves
    rope_precision: str = "float64"  # RoPE angles in float64, or float32 as Hugging Face
    head_dim: int | None = None  # D, when it is not d_model / n_heads (Qwen3-0.6B); None: C / H
    qk_norm: bool = False  # RMSNorm (eps norm_eps) on each query and key head before RoPE (Qwen3)
    sliding_window: int | None = None  # positions a query sees, itself included (Mistral)
    # ffn="moe" (Mixtral): n_experts SwiGLU experts of width d_ff, top_k of them per token,
    # their weights by `routing` (tfbook.moe.ROUTINGS)
    n_experts: int = 8
    top_k: int = 2
    routing: str = "renormalised"
    # RoPE scaling (tfbook.rope_scaling): None (plain RoPE) or a Hugging Face style dict such
    # as {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192};
    # kept as a read-only copy, left out of the hash (a dict has none)
    rope_scaling: dict | None = field(default=None, hash=False)
    # DeepSeek-V3's MoE (routing="sigmoid"): experts in n_expert_groups groups, each token's
    # chosen within the best top_groups; the k weights times routed_scaling; n_shared_experts
    # experts (one SwiGLU n_shared_experts * d_ff wide) that every token goes through
    n_expert_groups: int = 1
    top_groups: int = 1
    n_shared_experts: int = 0
    routed_scaling: float = 1.0
    # Multi-head latent attention (DeepSeek-V2/V3, tfbook.mla) replaces the attention when
    # kv_lora_rank is set; the other MLA fields are read only then (defaults: DeepSeek's).
    kv_lora_rank: int | None = None  # r, width of the cached latent each K and V comes from
    q_lora_rank: int | None = None  # the queries' own latent width; None = queries from x
    qk_nope_head_dim: int = 128  # d_N, per-head query/key part without position (from c)
    qk_rope_head_dim: int = 64  # d_R, the RoPE part; one rotated key shared by all heads
    v_head_dim: int = 128  # d_V, per-head value size
    mla_absorbed: bool = False  # W_UK folded into the query, W_UV into W_O (the same function)

    def __post_init__(self) -> None:
        check_block_settings(self, owner="BlockConfig")
        object.__setattr__(self, "rope_scaling", check_rope_scaling(self, "BlockConfig"))

    @property
    def rope_head_size(self) -> int:
        """The width RoPE rotates: the head size (C / H, or head_dim), or qk_rope_head_dim
        with MLA."""
        if self.kv_lora_rank is not None:
            return self.qk_rope_head_dim
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    def make_attention(self) -> MultiHeadAttention | MultiHeadLatentAttention:
        """The attention sub-layer this config describes."""
        if self.kv_lora_rank is not None:
            return MultiHeadLatentAttention(
                self.d_model, self.n_heads, kv_lora_rank=self.kv_lora_rank,
                q_lora_rank=self.q_lora_rank, qk_nope_head_dim=self.qk_nope_head_dim,
                qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim,
                bias=self.bias, rope_base=self.rope_base, rope_convention=self.rope_convention,
                rope_precision=self.rope_precision, eps=self.norm_eps,
                attention=self.attention, dropout=self.dropout, absorbed=self.mla_absorbed,
            )
        return MultiHeadAttention(
            self.d_model, self.n_heads, dropout=self.dropout, bias=self.bias,
            attention=self.attention, n_kv_heads=self.n_kv_heads, rope_base=self.rope_base,
            rope_convention=self.rope_convention, rope_precision=self.rope_precision,
            qk_norm=self.qk_norm, norm_eps=self.norm_eps, sliding_window=self.sliding_window,
            rope_scaling=self.rope_scaling, head_dim=self.head_dim,
        )

    def make_feed_forward(self) -> nn.Module:
        """The feed-forward sub-layer this config describes."""
        if self.ffn == "moe":
            return MoEFeedForward(self.d_model, self.d_ff, self.n_experts, self.top_k,
                                  self.routing, self.activation, self.dropout, self.bias,
                                  self.fused_activation, n_expert_groups=self.n_expert_groups,
                                  top_groups=self.top_groups,
                                  n_shared_experts=self.n_shared_experts,
                                  routed_scaling=self.routed_scaling)
        return make_ffn(self.ffn, self.d_model, self.d_ff, self.activation, self.dropout,
                        self.bias, self.fused_activation)

    def make_norm(self) -> nn.Module:
        """One normalisation layer of this config."""
        return make_norm(self.norm, self.d_model, self.norm_eps, self.fused_norm, self.bias)


def check_block_settings(settings: Any, owner: str) -> None:
    """Check every BlockConfig field of `settings`; errors name `owner` (the config checked)."""
    check_attention_settings(settings, owner)
    check_rope_scaling(settings, owner)
    check_mla_settings(settings, owner)
    check_positive(settings, "d_ff", owner=owner)
    check_choice(settings, "activation", ACTIVATIONS, owner=owner)
    check_choice(settings, "norm", NORMS, owner=owner)
    check_choice(settings, "ffn", FFN_CHOICES, owner=owner)
    check_positive(settings, "n_experts", "top_k", owner=owner)
    if settings.top_k > settings.n_experts:
        raise ValueError(f"{owner}: top_k={settings.top_k} experts per token cannot exceed "
                         f"n_experts={settings.n_experts}")
    check_choice(settings, "routing", ROUTINGS, owner=owner)
    if settings.ffn == "moe":  # the DeepSeek settings; read only with ffn="moe"
        check_deepseek_settings(settings.n_experts, settings.top_k, settings.routing,
                                settings.n_expert_groups, settings.top_groups,
                                settings.n_shared_experts, settings.routed_scaling, owner)
    check_bool(settings, "norm_first", "bias", "fused_norm", "fused_activation", "mla_absorbed",
               owner=owner)
    if not is_number(settings.norm_eps) or not settings.norm_eps > 0:
        raise ValueError(f"{owner}: norm_eps must be > 0, got {settings.norm_eps!r}")


BLOCK_FIELDS = tuple(f.name for f in fields(BlockConfig))  # the settings every block reads


def block_config_of(config: Any, **settings: Any) -> BlockConfig:
    """The BlockConfig of a model config, checked in the model config's own name.

    Every BlockConfig field the model config also has (same name, same meaning: d_model,
    n_heads, dropout, the kernels, ...) is taken from it; `settings` are the ones the model
    decides itself (BERT's post-LN and GELU, GPT's pre-LN); the rest keep BlockConfig's
    defaults. A bad value is reported as the model config's: "GPTConfig: n_heads must be ...".
    """
    unknown = sorted(set(settings) - set(BLOCK_FIELDS))
    if unknown:
        raise TypeError(f"block settings must be BlockConfig fields {BLOCK_FIELDS}, got {unknown}")
    shared = {f.name: getattr(config, f.name) for f in fields(config) if f.name in BLOCK_FIELDS}
    values = {**shared, **settings}
    defaults = {f.name: f.default for f in fields(BlockConfig)}
    check_block_settings(SimpleNamespace(**{**defaults, **values}), owner=type(config).__name__)
    return BlockConfig(**values)


FFN_CHOICES = (*FFNS, "moe")  # "moe": a mixture of SwiGLU experts (tfbook.moe)

SubLayer = Callable[[Tensor], tuple[Tensor, Tensor | None]]  # h -> (output, attention weights)


def residual(
    x: Tensor, sublayer: SubLayer, norm: nn.Module, dropout: nn.Module, norm_first: bool
) -> tuple[Tensor, Tensor | None]:
    """One sub-layer on the residual stream, post-LN or pre-LN (Xiong et al. 2020, figure 1)."""
    if norm_first:
        y, weights = sublayer(norm(x))
        return x + dropout(y), weights  # pre-LN: the stream itself is never normalised
    y, weights = sublayer(x)
    return norm(x + dropout(y)), weights  # post-LN: normalise after adding


class SelfAttentionBlock(nn.Module):
    """Self-attention then FFN, each with a residual and a norm (Vaswani et al., 3.1)."""

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.attn = config.make_attention()
        self.norm1 = config.make_norm()
        self.ff = config.make_feed_forward()
        self.norm2 = config.make_norm()
        self.dropout = nn.Dropout(config.dropout)  # on each sub-layer's output (stateless)
        # the residual stream (B, T, C) entering the block, between its two sub-layers and
        # leaving it (hook points, tfbook.hooks)
        self.residual_pre, self.residual_mid, self.residual_post = (HookPoint() for _ in "abc")

    def forward(
        self, x: Tensor, mask: Tensor | None = None, causal: bool = False,
        positions: Tensor | None = None, cache: LayerCache | None = None,
        need_weights: bool = False, *, rope_table: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, C) -> (B, T, C) and the self-attention weights (B, H, T, S) or None.

        `rope_table` (cos, sin): the rotary table the model built once for this forward pass.
        """

        def self_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            return self.attn(h, mask=mask, causal=causal, positions=positions, cache=cache,
                             need_weights=need_weights, rope_table=rope_table)

        def feed_forward(h: Tensor) -> tuple[Tensor, None]:
            return self.ff(h), None

        x, weights = residual(self.residual_pre(x), self_attention, self.norm1, self.dropout,
                              self.norm_first)
        x, _ = residual(self.residual_mid(x), feed_forward, self.norm2, self.dropout,
                        self.norm_first)
        return self.residual_post(x), weights


class CrossAttentionBlock(nn.Module):
    """Causal self-attention, cross-attention to a source, then FFN (Vaswani et al., 3.1)."""

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        if config.kv_lora_rank is not None:
            raise ValueError("CrossAttentionBlock: multi-head latent attention is causal "
                             "self-attention only (a decoder-only block); got kv_lora_rank="
                             f"{config.kv_lora_rank}: leave it None")
        self.norm_first = config.norm_first
        self.self_attn = config.make_attention()
        self.norm1 = config.make_norm()
        self.cross_attn = config.make_attention()
        self.norm2 = config.make_norm()
        self.ff = config.make_feed_forward()
        self.norm3 = config.make_norm()
        self.dropout = nn.Dropout(config.dropout)  # on each sub-layer's output (stateless)
        # the residual stream (B, T, C) entering, after self-attention, after cross-attention
        # and leaving the block (hook points, tfbook.hooks)
        self.residual_pre, self.residual_mid, self.residual_cross, self.residual_post = (
            HookPoint() for _ in "abcd")

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        *,
        rope_table: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x (B, T, C), memory (B, S, C) -> (B, T, C), self (B, H, T, T), cross (B, H, T, S).

        The self-attention is always causal (teacher forcing must not peek at the answer);
        `mask` may hide padded target positions, `memory_mask` padded source positions. With
        a `cache`, the self-attention keys grow by T per call and the cross-attention keys
        and values of `memory` are computed at the first call only. `rope_table` serves the
        self-attention only (with RoPE), as in `SelfAttentionBlock`.
        """

        def self_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            return self.self_attn(h, mask=mask, causal=True, positions=positions, cache=cache,
                                  need_weights=need_weights, rope_table=rope_table)

        def cross_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            # queries from the decoder, keys and values from the encoder's output
            return self.cross_attn(h, memory, mask=memory_mask, cache=cache,
                                   need_weights=need_weights)

        def feed_forward(h: Tensor) -> tuple[Tensor, None]:
            return self.ff(h), None

        x, self_weights = residual(self.residual_pre(x), self_attention, self.norm1,
                                   self.dropout, self.norm_first)
        x, cross_weights = residual(self.residual_mid(x), cross_attention, self.norm2,
                                    self.dropout, self.norm_first)
        x, _ = residual(self.residual_cross(x), feed_forward, self.norm3, self.dropout,
                        self.norm_first)
        return self.residual_post(x), self_weights, cross_weights
