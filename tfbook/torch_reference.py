"""torch.nn twins of tfbook modules, holding the very same weights.

The book proves "our module equals PyTorch's" by building PyTorch's version of a layer,
copying our weights into it and comparing outputs. The only work is the weight layout:
`nn.MultiheadAttention` keeps W_Q, W_K, W_V stacked in one (3C, C) `in_proj_weight`;
everything else is a one-to-one copy. Remember the opposite mask conventions: in torch.nn
a boolean `key_padding_mask` / `attn_mask` is True where attention is *forbidden*.
"""

import torch
from torch import nn

from tfbook.attention import MultiHeadAttention
from tfbook.blocks import BlockConfig, CrossAttentionBlock, SelfAttentionBlock
from tfbook.models.transformer import Transformer
from tfbook.normalization import LayerNorm

TORCH_ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}  # torch.nn layers have no tanh GELU


@torch.no_grad()
def copy_linear(dst: nn.Linear, src: nn.Linear) -> None:
    """dst <- src, weight and bias."""
    dst.weight.copy_(src.weight)
    if src.bias is not None:
        dst.bias.copy_(src.bias)


@torch.no_grad()
def copy_norm(dst: nn.LayerNorm, src: LayerNorm) -> None:
    """nn.LayerNorm <- tfbook LayerNorm (with or without its bias)."""
    if (dst.bias is None) != (src.bias is None):
        raise ValueError("the two LayerNorms must both have a bias or both have none")
    dst.weight.copy_(src.weight)
    if src.bias is not None:
        dst.bias.copy_(src.bias)


@torch.no_grad()
def copy_attention(dst: nn.MultiheadAttention, src: MultiHeadAttention) -> None:
    """nn.MultiheadAttention <- tfbook MultiHeadAttention: stack W_Q, W_K, W_V into (3C, C)."""
    dst.in_proj_weight.copy_(
        torch.cat([src.q_proj.weight, src.k_proj.weight, src.v_proj.weight])
    )
    if src.q_proj.bias is not None:
        dst.in_proj_bias.copy_(torch.cat([src.q_proj.bias, src.k_proj.bias, src.v_proj.bias]))
    copy_linear(dst.out_proj, src.out_proj)


def torch_attention(src: MultiHeadAttention) -> nn.MultiheadAttention:
    """The nn.MultiheadAttention (batch_first) equal to `src`."""
    C = src.n_heads * src.head_size
    twin = nn.MultiheadAttention(
        C, src.n_heads, dropout=src.dropout, bias=src.q_proj.bias is not None, batch_first=True
    )
    copy_attention(twin, src)
    return twin


def layer_kwargs(config: BlockConfig) -> dict:
    """Constructor arguments shared by nn.TransformerEncoderLayer / DecoderLayer / Transformer."""
    if config.activation not in TORCH_ACTIVATIONS:
        raise ValueError(
            f"torch.nn layers support activations {tuple(TORCH_ACTIVATIONS)}, "
            f"got {config.activation!r}"
        )
    twin_free = {"norm": "layer", "ffn": "mlp", "n_kv_heads": None, "rope_base": None}
    for field, supported in twin_free.items():
        if getattr(config, field) != supported:
            raise ValueError(
                f"torch.nn's transformer layers have no {field} other than {supported!r}, "
                f"got {field}={getattr(config, field)!r}"
            )
    return dict(
        d_model=config.d_model, nhead=config.n_heads, dim_feedforward=config.d_ff,
        dropout=config.dropout, activation=TORCH_ACTIVATIONS[config.activation],
        layer_norm_eps=config.norm_eps, batch_first=True, norm_first=config.norm_first,
        bias=config.bias,
    )


@torch.no_grad()
def copy_encoder_layer(dst: nn.TransformerEncoderLayer, src: SelfAttentionBlock) -> None:
    """nn.TransformerEncoderLayer <- tfbook SelfAttentionBlock."""
    copy_attention(dst.self_attn, src.attn)
    copy_linear(dst.linear1, src.ff.fc_in)
    copy_linear(dst.linear2, src.ff.fc_out)
    copy_norm(dst.norm1, src.norm1)
    copy_norm(dst.norm2, src.norm2)


@torch.no_grad()
def copy_decoder_layer(dst: nn.TransformerDecoderLayer, src: CrossAttentionBlock) -> None:
    """nn.TransformerDecoderLayer <- tfbook CrossAttentionBlock."""
    copy_attention(dst.self_attn, src.self_attn)
    copy_attention(dst.multihead_attn, src.cross_attn)
    copy_linear(dst.linear1, src.ff.fc_in)
    copy_linear(dst.linear2, src.ff.fc_out)
    copy_norm(dst.norm1, src.norm1)
    copy_norm(dst.norm2, src.norm2)
    copy_norm(dst.norm3, src.norm3)


def torch_encoder_layer(src: SelfAttentionBlock, config: BlockConfig) -> nn.TransformerEncoderLayer:
    """The nn.TransformerEncoderLayer equal to `src` (built with `config`)."""
    twin = nn.TransformerEncoderLayer(**layer_kwargs(config))
    copy_encoder_layer(twin, src)
    return twin


def torch_decoder_layer(
    src: CrossAttentionBlock, config: BlockConfig
) -> nn.TransformerDecoderLayer:
    """The nn.TransformerDecoderLayer equal to `src` (built with `config`)."""
    twin = nn.TransformerDecoderLayer(**layer_kwargs(config))
    copy_decoder_layer(twin, src)
    return twin


@torch.no_grad()
def torch_transformer(src: Transformer) -> nn.Transformer:
    """The nn.Transformer equal to the encoder and decoder stacks of `src`.

    nn.Transformer has no embeddings and no output layer: feed it `src.embed_source(...)`
    and `src.embed_target(...)` and apply `src.lm_head` to what it returns.
    """
    c = src.config
    if not c.final_norm:
        raise ValueError("nn.Transformer always ends each stack with a LayerNorm; "
                         "expected config.final_norm=True, got False")
    kwargs = layer_kwargs(c.block_config())
    kwargs["num_encoder_layers"] = c.n_encoder_layers
    kwargs["num_decoder_layers"] = c.n_decoder_layers
    twin = nn.Transformer(**kwargs)
    for dst, block in zip(twin.encoder.layers, src.encoder, strict=True):
        copy_encoder_layer(dst, block)
    for dst, block in zip(twin.decoder.layers, src.decoder, strict=True):
        copy_decoder_layer(dst, block)
    copy_norm(twin.encoder.norm, src.encoder_norm)
    copy_norm(twin.decoder.norm, src.decoder_norm)
    return twin
