"""A Llama-style decoder (Touvron et al. 2023) as a preset of tfbook's GPT, and SmolLM2-135M.

From GPT-2 to Llama, one change at a time, each a field of `GPTConfig`:

    LayerNorm            -> RMSNorm                         norm="rms"
    GELU MLP (F = 4C)    -> SwiGLU (F about 8C/3)           ffn="swiglu", activation="silu"
    learned positions    -> RoPE inside attention           position="rope", rope_base
    H key/value heads    -> H_kv < H (grouped-query)        n_kv_heads
    biases everywhere    -> no biases                       bias=False

Two later families are one more field each:

    Qwen3: RMSNorm on each query and key head before RoPE     qk_norm=True
    Mistral: each query sees the last W positions only        sliding_window=W
    Mixtral: each token goes to top_k of n_experts SwiGLUs     ffn="moe", n_experts, top_k
    DeepSeek-V2/V3: keys and values from a cached latent       kv_lora_rank (and q_lora_rank,
                    (multi-head latent attention)              qk_nope/qk_rope/v_head_dim)
    DeepSeek-V3's experts: sigmoid scores, groups, shared      routing="sigmoid", n_expert_groups,
                                                               top_groups, n_shared_experts,
                                                               routed_scaling

SmolLM2-135M (Allal et al. 2025) is such a model: 30 blocks of width 576, 9 query heads
sharing 3 key/value heads, a 49,152-token vocabulary and the embedding tied to the output.
"""

from dataclasses import replace

from tfbook.models.gpt import GPTConfig


def llama_config(
    vocab_size: int, max_len: int, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int,
    d_ff: int, rope_base: float = 10000.0, norm_eps: float = 1e-5, tie_weights: bool = True,
    rope_convention: str = "interleaved", rope_precision: str = "float64",
    qk_norm: bool = False, sliding_window: int | None = None, n_experts: int | None = None,
    top_k: int = 2, head_dim: int | None = None,
) -> GPTConfig:
    """The GPTConfig of a Llama-style decoder: RMSNorm, SwiGLU, RoPE, grouped heads, no bias."""
    return GPTConfig(
        vocab_size=vocab_size, max_len=max_len, n_layers=n_layers, d_model=d_model,
        n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=d_ff, dropout=0.0, activation="silu",
        bias=False, tie_weights=tie_weights, norm="rms", norm_eps=norm_eps,
        ffn="swiglu" if n_experts is None else "moe",
        n_experts=8 if n_experts is None else n_experts, top_k=top_k,
        position="rope", rope_base=rope_base, rope_convention=rope_convention,
        rope_precision=rope_precision, qk_norm=qk_norm, sliding_window=sliding_window,
        head_dim=head_dim,
    )


def smollm2_135m() -> GPTConfig:
    """SmolLM2-135M's shapes (the loader reads them from the GGUF file and checks them)."""
    return llama_config(
        vocab_size=49152, max_len=8192, n_layers=30, d_model=576, n_heads=9, n_kv_heads=3,
        d_ff=1536, rope_base=100000.0, norm_eps=1e-5,
    )


def tiny_llama() -> GPTConfig:
    """A toy Llama-style decoder for tests: 2 blocks, 4 query heads sharing 2 key/value heads."""
    return llama_config(
        vocab_size=256, max_len=64, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96,
    )


def qwen3_8b() -> GPTConfig:
    """Qwen3-8B's shapes (Qwen team 2025, the released config.json): QK-norm, 36 blocks of
    width 4096, 32 query heads of size 128 sharing 8 key/value heads, untied output.

    Its head size 128 is exactly 4096 / 32; the smaller Qwen3 models keep heads of 128 in a
    narrower width (`qwen3_0_6b`).
    """
    return llama_config(
        vocab_size=151936, max_len=40960, n_layers=36, d_model=4096, n_heads=32, n_kv_heads=8,
        d_ff=12288, rope_base=1000000.0, norm_eps=1e-6, tie_weights=False, qk_norm=True,
        rope_convention="half", rope_precision="float32",
    )


def qwen3_0_6b() -> GPTConfig:
    """Qwen3-0.6B's shapes (the released config.json): 28 blocks of width 1024 whose 16 query
    heads (8 key/value heads) are 128 wide each, so H D = 2048 is twice the width: W_Q maps
    1024 -> 2048 and W_O 2048 -> 1024 (head_dim). QK-norm; the embedding tied to the output."""
    return llama_config(
        vocab_size=151936, max_len=40960, n_layers=28, d_model=1024, n_heads=16, n_kv_heads=8,
        d_ff=3072, rope_base=1000000.0, norm_eps=1e-6, tie_weights=True, qk_norm=True,
        head_dim=128, rope_convention="half", rope_precision="float32",
    )


def mistral_7b() -> GPTConfig:
    """Mistral-7B-v0.1's shapes (Jiang et al. 2023): a sliding window of 4,096 positions,
    32 blocks of width 4096, 32 query heads sharing 8 key/value heads, untied output."""
    return llama_config(
        vocab_size=32000, max_len=32768, n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
        d_ff=14336, rope_base=10000.0, norm_eps=1e-5, tie_weights=False, sliding_window=4096,
        rope_convention="half", rope_precision="float32",
    )


def mixtral_8x7b() -> GPTConfig:
    """Mixtral-8x7B's shapes (Jiang et al. 2024): Mistral-7B's blocks with 8 SwiGLU experts
    per block, 2 per token; no sliding window in the released config."""
    return llama_config(
        vocab_size=32000, max_len=32768, n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
        d_ff=14336, rope_base=1000000.0, norm_eps=1e-5, tie_weights=False, n_experts=8,
        top_k=2, rope_convention="half", rope_precision="float32",
    )


def deepseek_v3() -> GPTConfig:
    """DeepSeek-V3's attention and dense-block shapes (DeepSeek-AI 2024; the values of Hugging
    Face's `DeepseekV3Config`): 61 blocks of width 7168, 128 heads with multi-head latent
    attention (latent r = 512, query latent 1536, d_N = 128, d_R = 64, d_V = 128), SwiGLU of
    width 18432, untied output, the 4,096-position context RoPE was trained at.

    What this config cannot express: the released model mixes block kinds, the first 3 dense
    and blocks 3..60 mixtures of 256 routed experts (width 2048; 8 per token, chosen by sigmoid
    scores plus a bias, within 4 of 8 groups, weights scaled by 2.5) beside one shared expert,
    while one BlockConfig serves every block. Those experts are a setting (ffn="moe",
    routing="sigmoid", n_expert_groups=8, top_groups=4, n_shared_experts=1,
    routed_scaling=2.5, d_ff=2048), but for all blocks at once; here every block is dense.
    The YaRN RoPE scaling to 163,840 positions (whose mscale also multiplies the softmax scale)
    and the multi-token-prediction module are left out too.
    """
    dense = llama_config(
        vocab_size=129280, max_len=4096, n_layers=61, d_model=7168, n_heads=128,
        n_kv_heads=128, d_ff=18432, rope_base=10000.0, norm_eps=1e-6, tie_weights=False,
        rope_precision="float32",
    )
    return replace(dense, n_kv_heads=None, kv_lora_rank=512, q_lora_rank=1536,
                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
