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


def decoder_forward_flops(config, new_tokens: int, context: int, head_positions: int) -> int:
    """Matrix-multiply FLOPs (2 per multiply-add) of one decoder-only forward pass.

    `new_tokens` positions go through every block; each of their queries is scored against
    `context` keys (the cached ones plus the new ones; a kernel computes the whole rectangle,
    masked entries included); the LM head runs at `head_positions` positions. Norms, softmax
    and activations are not matrix products and are left out (a few percent).

        per token and layer: 2 C (H D + 2 H_kv D + H D)      the four projections
                             + 2 C F x (2 for an MLP, 3 for SwiGLU, 3 top_k for experts)
                             + 2 x 2 H D S                     q k^T and weights @ v
        head:                2 C V per position
    """
    c = config
    if getattr(c, "kv_lora_rank", None) is not None:
        raise ValueError(f"decoder_forward_flops counts multi-head attention's projections; "
                         f"multi-head latent attention (kv_lora_rank={c.kv_lora_rank}) has "
                         f"others, not counted here")
    C, D, H = c.d_model, c.head_size, c.n_heads
    H_kv = c.n_kv_heads or c.n_heads
    F = 4 * C if c.d_ff is None else c.d_ff
    projections = 2 * C * (2 * H * D + 2 * H_kv * D)
    # a mixture of experts runs top_k SwiGLU experts per token (and a C x n_experts router)
    ffn = (2 * C * F * 3 * c.top_k + 2 * C * c.n_experts if c.ffn == "moe"
           else 2 * C * F * (3 if c.ffn == "swiglu" else 2))
    attention = 4 * H * D * context
    blocks = c.n_layers * new_tokens * (projections + ffn + attention)
    return blocks + 2 * C * c.vocab_size * head_positions
