"""A decoder-only transformer: GPT (Radford et al. 2018, 2019), and Llama-style models as presets.

    token ids -> token embedding (+ learned position embeddings) -> N pre-norm blocks with
    causal self-attention (RoPE inside attention for Llama-style models) -> final norm ->
    logits = h E^T (output layer tied to the embedding)

GPT-2 and a Llama-style decoder such as SmolLM2 are the same class with different configs
(`tfbook.models.llama`): LayerNorm or RMSNorm, GELU MLP or SwiGLU, learned positions or RoPE,
all key/value heads or grouped ones; DeepSeek-V2/V3's multi-head latent attention is one more
setting (kv_lora_rank), with its own cache of latents. Shape legend: B batch, T sequence,
S positions seen (T plus those in the cache), C model width, H heads, V vocab.
"""

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tfbook.blocks import BlockConfig, SelfAttentionBlock, block_config_of
from tfbook.cache import KVCache
from tfbook.config import check_choice, check_positive
from tfbook.embeddings import TokenEmbedding, check_token_ids
from tfbook.losses import cross_entropy
from tfbook.masks import padding_mask
from tfbook.mla import LatentKVCache
from tfbook.models.output import ModelOutput
from tfbook.positional import LearnedPositionalEmbedding, check_length, check_positions
from tfbook.rope import rope_cos_sin
from tfbook.rope_scaling import scaled_rope_cos_sin
from tfbook.sliding_window import SlidingWindowKVCache

POSITIONS = ("learned", "rope")


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of a decoder-only model; presets below, variants with `replace`."""

    max_len: int = 1024  # context length: the most positions the model can see
    vocab_size: int = 50257  # V, GPT-2's byte-level BPE vocabulary
    n_layers: int = 12  # number of blocks
    n_heads: int = 12  # H, attention heads per block
    d_model: int = 768  # C, width of the residual stream
    d_ff: int | None = None  # F, hidden width of the FFN; None = 4C (GPT-2)
    dropout: float = 0.0  # dropout on embeddings, attention weights and sub-layer outputs
    activation: str = "gelu_tanh"  # GPT-2 uses the tanh approximation of GELU
    bias: bool = True  # biases in linear layers and LayerNorms, as in GPT-2
    tie_weights: bool = True  # output layer shares the token embedding matrix
    attention: str = "torch"  # attention kernel: "reference" (ours), "torch" (SDPA) or "flash"
    fused_norm: bool = True  # torch's one-kernel LayerNorm (False: our layer_norm)
    fused_activation: bool = True  # torch's one-kernel activation (False: ours)
    norm: str = "layer"  # "layer" (GPT-2) or "rms" (Llama)
    norm_eps: float = 1e-5  # epsilon inside every norm
    ffn: str = "mlp"  # "mlp" (GPT-2), "swiglu" (Llama) or "moe" (Mixtral)
    n_kv_heads: int | None = None  # H_kv key/value heads; None = H (GPT-2)
    position: str = "learned"  # "learned" (added to the embeddings) or "rope" (in attention)
    rope_base: float = 10000.0  # RoPE's base, used when position == "rope"
    rope_convention: str = "interleaved"  # RoPE planes: adjacent pairs or the two halves
    rope_precision: str = "float64"  # RoPE angles in float64, or float32 as Hugging Face
    head_dim: int | None = None  # D when it is not d_model / n_heads (Qwen3-0.6B); None: C / H
    qk_norm: bool = False  # RMSNorm on each query and key head before RoPE (Qwen3)
    sliding_window: int | None = None  # positions a query sees, itself included (Mistral)
    n_experts: int = 8  # ffn="moe": SwiGLU experts per block (Mixtral)
    top_k: int = 2  # ffn="moe": experts each token is sent to
    routing: str = "renormalised"  # ffn="moe": how the k experts' weights are formed
    # RoPE scaling (tfbook.rope_scaling; position="rope" only): None = plain RoPE, or a Hugging
    # Face style dict: {"rope_type": "linear", "factor": s}, {"rope_type": "dynamic",
    # "factor": s, "original_max_position_embeddings": L}, {"rope_type": "yarn", "factor": s,
    # "original_max_position_embeddings": L} (optional beta_fast, beta_slow, ...) or
    # {"rope_type": "llama3", "factor": s, "original_max_position_embeddings": L,
    # "low_freq_factor": 1.0, "high_freq_factor": 4.0}. Kept as a read-only copy (JSON in a
    # checkpoint; left out of the hash). On a loaded model, e.g. SmolLM2 (load_smollm2):
    #   config = replace(model.config, rope_scaling={...}, max_len=32768)
    #   scaled = GPT(config); scaled.load_state_dict(model.state_dict())
    # (max_len too: it still bounds the positions); setting model.config to it also works,
    # as the table is rebuilt from model.config at every forward pass.
    rope_scaling: dict | None = field(default=None, hash=False)
    n_expert_groups: int = 1  # routing="sigmoid" (DeepSeek-V3): groups the experts fall into
    top_groups: int = 1  # routing="sigmoid": the groups each token's experts come from
    n_shared_experts: int = 0  # ffn="moe": experts every token goes through (DeepSeek)
    routed_scaling: float = 1.0  # ffn="moe": factor on the k routed weights (DeepSeek-V3 2.5)
    # multi-head latent attention (DeepSeek-V2/V3) when kv_lora_rank is set; needs RoPE
    kv_lora_rank: int | None = None  # r, width of the cached latent; None = plain attention
    q_lora_rank: int | None = None  # the queries' latent width; None = queries from x directly
    qk_nope_head_dim: int = 128  # d_N, per-head query/key part computed from the latent
    qk_rope_head_dim: int = 64  # d_R, the RoPE part (one rotated key shared by all heads)
    v_head_dim: int = 128  # d_V, per-head value size
    mla_absorbed: bool = False  # MLA's absorbed form (W_UK into the query, W_UV into W_O)

    def __post_init__(self) -> None:
        check_positive(self, "max_len", "vocab_size", "n_layers", "n_heads", "d_model")
        check_choice(self, "position", POSITIONS)
        if self.rope_scaling is not None and self.position != "rope":
            raise ValueError(f"GPTConfig: rope_scaling scales the rotary frequencies, but "
                             f"position={self.position!r} has none: use position='rope'")
        if self.kv_lora_rank is not None and self.position != "rope":
            raise ValueError(
                f"GPTConfig: multi-head latent attention (kv_lora_rank={self.kv_lora_rank!r}) "
                f"rotates its decoupled key with RoPE: it needs position='rope', got "
                f"{self.position!r}")
        block = self.block_config()  # checks the block settings, in GPTConfig's words
        object.__setattr__(self, "rope_scaling", block.rope_scaling)  # its read-only copy

    def block_config(self) -> BlockConfig:
        """The per-block settings: the fields shared with BlockConfig, pre-norm, F = 4C by
        default, and RoPE only when the positions are rotary (causal use decided by GPT)."""
        return block_config_of(
            self, norm_first=True, d_ff=4 * self.d_model if self.d_ff is None else self.d_ff,
            rope_base=self.rope_base if self.position == "rope" else None,
        )

    @property
    def head_size(self) -> int:
        """D: C / H, unless head_dim sets it."""
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @classmethod
    def gpt2_124m(cls) -> "GPTConfig":
        """GPT-2 small: 12 layers, width 768, 12 heads; 124,439,808 parameters."""
        return cls()

    @classmethod
    def tiny(cls) -> "GPTConfig":
        """A model that trains in minutes on a laptop CPU; fits tests."""
        return cls(max_len=64, vocab_size=256, n_layers=2, n_heads=4, d_model=64)


class GPT(nn.Module):
    """Decoder-only language model: next-token logits for every position."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = TokenEmbedding(config.vocab_size, config.d_model)
        self.pos_emb = (
            LearnedPositionalEmbedding(config.max_len, config.d_model)
            if config.position == "learned" else None  # RoPE lives inside attention
        )
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            [SelfAttentionBlock(config.block_config()) for _ in range(config.n_layers)]
        )
        self.norm_f = config.block_config().make_norm()
        self.rope_head_size = config.block_config().rope_head_size  # what RoPE rotates
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # one (V, C) matrix to embed and unembed
        self.apply(init_weights)
        # GPT-2 (section 2.3): the layers that write into the residual stream start smaller,
        # std 0.02 / sqrt(2N), so that the sum of 2N contributions keeps a steady size
        for block in self.blocks:
            experts = [*getattr(block.ff, "experts", [block.ff])]  # ffn="moe": each expert
            if getattr(block.ff, "shared", None) is not None:
                experts.append(block.ff.shared)  # DeepSeek's shared experts
            attn_out = getattr(block.attn, "out_proj", None) or block.attn.o_proj  # MLA: o_proj
            for proj in (attn_out, *(expert.fc_out for expert in experts)):
                normal_init(proj.weight, std=0.02 / math.sqrt(2 * config.n_layers))

    def rope_table(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
        """cos and sin of the rotary angles at `positions`, shared by every layer (None without
        RoPE): (T, D/2) each for positions (T,), (B, 1, T, D/2) for (B, T). D is the width
        RoPE rotates: the head size, or qk_rope_head_dim with multi-head latent attention.
        With rope_scaling, the scaled frequencies and YaRN's factor on cos and sin; "dynamic"
        stretches by the current length max(positions) + 1, as Hugging Face does."""
        c = self.config
        if c.position != "rope":
            return None
        if c.rope_scaling is None:
            return rope_cos_sin(positions, self.rope_head_size, c.rope_base, c.rope_precision,
                                dtype)
        return scaled_rope_cos_sin(positions, self.rope_head_size, c.rope_base, c.rope_scaling,
                                   c.rope_precision, dtype)

    def new_cache(self, max_len: int | None = None) -> KVCache | LatentKVCache:
        """An empty key/value cache for this model (one layer cache per block), with room for
        `max_len` positions (default: the whole context; generate asks for what it needs).
        With a sliding window, each layer keeps only the last window - 1 positions instead;
        with multi-head latent attention, each layer keeps latents (`LatentKVCache`)."""
        if self.config.kv_lora_rank is not None:
            return LatentKVCache(self.config.n_layers, max_len or self.config.max_len)
        if self.config.sliding_window is not None:
            return SlidingWindowKVCache(self.config.n_layers, self.config.sliding_window)
        return KVCache(self.config.n_layers, max_len or self.config.max_len)

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        positions: Tensor | None = None,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        last_only: bool = False,
    ) -> ModelOutput:
        """idx (B, T) token ids -> logits (B, T, V); position t predicts token t + 1.

        positions (T,) or (B, T): the index of each token (default: after the cache's
        contents). attention_mask (B, S), True / 1 at real tokens, covers every position the
        keys come from, cached ones included (left-padded batches). With a `cache` the model
        stores this call's keys and values and attends to all stored ones. `last_only`
        computes the logits of the last position only (all that generation needs).
        """
        check_token_ids(idx, self.config.vocab_size)
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        B, T = idx.size()
        start = 0
        if cache is not None:
            latent = self.config.kv_lora_rank is not None  # MLA stores latents, not K and V
            if (not isinstance(cache, KVCache) or len(cache) != self.config.n_layers
                    or isinstance(cache, LatentKVCache) != latent):
                kind = "LatentKVCache" if latent else "KVCache"
                raise ValueError(
                    f"cache must be a {kind} with {self.config.n_layers} layers "
                    f"(model.new_cache()), got {cache!r:.60}"
                )
            cache.check_batch(B)
            start = cache.length
        x = self.tok_emb(idx)  # (B, T, C)
        if positions is None:
            check_length(start + T, self.config.max_len)
            positions = torch.arange(start, start + T, device=idx.device)  # (T,)
        positions = check_positions(positions, x, self.config.max_len)
        if self.pos_emb is not None:
            x = self.pos_emb(x, positions)  # (B, T, C)
        x = self.dropout(x)
        mask = None
        if attention_mask is not None:
            S = start + T
            if attention_mask.shape != (B, S):
                raise ValueError(
                    f"attention_mask must have shape (B, S) = ({B}, {S}): every position "
                    f"seen, cached ones included, got {tuple(attention_mask.shape)}"
                )
            mask = padding_mask(attention_mask)  # (B, 1, 1, S): padded keys are hidden
        rope_table = self.rope_table(positions, x.dtype)  # once for every layer, or None
        attentions = []
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache[i]
            x, weights = block(x, mask=mask, causal=True, positions=positions,
                               cache=layer_cache, need_weights=need_weights,
                               rope_table=rope_table)  # (B, T, C)
            if need_weights:
                attentions.append(weights)  # (B, H, T, S)
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        logits = self.lm_head(self.norm_f(x))  # (B, T, V)
        loss = None if targets is None else cross_entropy(logits, targets)
        return ModelOutput(logits=logits, loss=loss, attentions=attentions)


def normal_init(weight: Tensor, std: float) -> None:
    """weight ~ N(0, std^2) in place; nothing on the meta device, which holds shapes only
    (and where torch's init would import its compiler, about a second per process)."""
    if not weight.is_meta:
        nn.init.normal_(weight, mean=0.0, std=std)


def init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases (norms keep 1 and 0)."""
    if isinstance(module, nn.Linear):
        normal_init(module.weight, std=0.02)
        if module.bias is not None and not module.bias.is_meta:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (TokenEmbedding, LearnedPositionalEmbedding)):
        normal_init(module.weight, std=0.02)


def gpt_on_meta(config: GPTConfig) -> GPT:
    """Build a GPT on the `meta` device: shapes only, no memory, for counting parameters."""
    with torch.device("meta"):
        return GPT(config)
