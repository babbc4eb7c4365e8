"""The encoder-decoder transformer of Vaswani et al. (2017), "Attention is all you need".

    source ids -> embed * sqrt(C) + sinusoidal PE -> N encoder blocks -> memory (B, S, C)
    target ids (shifted right) -> embed * sqrt(C) + PE -> N decoder blocks (causal
    self-attention, cross-attention to memory) -> linear -> logits (B, T, V)

Teacher forcing: during training the decoder reads the true target prefix, and the causal
mask makes every position predict the next token from the tokens before it only.
Shape legend: B batch, S source length, T target length, C width, H heads, V vocab.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tfbook.blocks import BlockConfig, CrossAttentionBlock, SelfAttentionBlock, block_config_of
from tfbook.cache import KVCache
from tfbook.config import check_positive
from tfbook.embeddings import TokenEmbedding
from tfbook.losses import cross_entropy
from tfbook.masks import padding_mask
from tfbook.models.output import ModelOutput
from tfbook.normalization import LayerNorm
from tfbook.positional import SinusoidalPositionalEncoding


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the encoder-decoder; presets below, variants via `replace`."""

    src_vocab_size: int = 37000  # V_src (Vaswani et al. share one 37k BPE vocab en-de)
    tgt_vocab_size: int = 37000  # V_tgt
    max_len: int = 512  # longest source or target sequence
    n_encoder_layers: int = 6  # N encoder blocks
    n_decoder_layers: int = 6  # N decoder blocks
    d_model: int = 512  # C
    n_heads: int = 8  # H
    d_ff: int = 2048  # F
    dropout: float = 0.1  # P_drop
    activation: str = "relu"  # FFN activation
    norm_first: bool = False  # post-LN as in the paper; True for pre-LN
    final_norm: bool = True  # LayerNorm after each stack (as torch.nn.Transformer; pre-LN needs it)
    share_embeddings: bool = True  # one matrix for source, target and output (needs one vocab)
    scale_embeddings: bool = True  # multiply embeddings by sqrt(C) (section 3.4)
    norm_eps: float = 1e-5  # LayerNorm epsilon
    attention: str = "torch"  # attention kernel: "reference" (ours), "torch" (SDPA) or "flash"
    fused_norm: bool = True  # torch's one-kernel LayerNorm (False: our layer_norm)
    fused_activation: bool = True  # torch's one-kernel activation (False: ours)

    def __post_init__(self) -> None:
        check_positive(self, "src_vocab_size", "tgt_vocab_size", "max_len", "n_encoder_layers",
                       "n_decoder_layers")
        self.block_config()  # checks the block settings, in TransformerConfig's words
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "TransformerConfig: share_embeddings needs one vocabulary, got src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )

    def block_config(self) -> BlockConfig:
        """The settings of every encoder and decoder block: the fields shared with BlockConfig."""
        return block_config_of(self)

    @classmethod
    def base(cls) -> "TransformerConfig":
        """The paper's base model (Table 3): N=6, C=512, F=2048, H=8."""
        return cls()

    @classmethod
    def tiny(cls) -> "TransformerConfig":
        """A toy size for tests and synthetic seq2seq tasks."""
        return cls(
            src_vocab_size=50, tgt_vocab_size=50, max_len=64, n_encoder_layers=2,
            n_decoder_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0,
        )


class Transformer(nn.Module):
    """Encoder-decoder transformer (Vaswani et al., figure 1)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = self.config = config
        self.src_emb = TokenEmbedding(c.src_vocab_size, c.d_model, scale=c.scale_embeddings)
        self.tgt_emb = (
            self.src_emb if c.share_embeddings
            else TokenEmbedding(c.tgt_vocab_size, c.d_model, scale=c.scale_embeddings)
        )
        self.pos_enc = SinusoidalPositionalEncoding(c.max_len, c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = nn.ModuleList(
            [SelfAttentionBlock(c.block_config()) for _ in range(c.n_encoder_layers)]
        )
        self.decoder = nn.ModuleList(
            [CrossAttentionBlock(c.block_config()) for _ in range(c.n_decoder_layers)]
        )
        final = c.final_norm
        self.encoder_norm = LayerNorm(c.d_model, c.norm_eps, c.fused_norm) if final else None
        self.decoder_norm = LayerNorm(c.d_model, c.norm_eps, c.fused_norm) if final else None
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        if c.share_embeddings:
            self.lm_head.weight = self.tgt_emb.weight  # the paper's three-way weight sharing

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty cache for the decoder: its self-attention keys and the source's keys,
        with room for `max_len` target positions (default: the whole context)."""
        return KVCache(self.config.n_decoder_layers, max_len or self.config.max_len)

    def embed_source(self, src: Tensor) -> Tensor:
        """src (B, S) ids -> (B, S, C): scaled embedding plus positional encoding."""
        return self.dropout(self.pos_enc(self.src_emb(src)))

    def embed_target(self, tgt: Tensor, positions: Tensor | None = None) -> Tensor:
        """tgt (B, T) ids at positions (T,) (default 0 .. T-1) -> (B, T, C)."""
        return self.dropout(self.pos_enc(self.tgt_emb(tgt), positions))

    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """src (B, S) ids, src_mask (B, S) True at real tokens -> memory (B, S, C), weights."""
        mask = None if src_mask is None else padding_mask(src_mask, src.size(1))  # (B,1,1,S)
        x = self.embed_source(src)  # (B, S, C)
        attentions = []
        for block in self.encoder:
            x, weights = block(x, mask=mask, need_weights=need_weights)  # (B, S, C)
            attentions += [weights] if need_weights else []
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, attentions

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        src_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> ModelOutput:
        """tgt (B, T) ids, memory (B, S, C) -> logits (B, T, V), self and cross weights.

        With a `cache`, `tgt` holds only the new target tokens: their positions follow the
        cached ones, and the source's keys and values are computed at the first call only.
        """
        B, T = tgt.size()
        start = 0
        if cache is not None:
            cache.check_batch(B)
            start = cache.length
        positions = torch.arange(start, start + T, device=tgt.device)  # (T,)
        self_mask = None if tgt_mask is None else padding_mask(tgt_mask, start + T)
        memory_mask = None if src_mask is None else padding_mask(src_mask, memory.size(1))
        x = self.embed_target(tgt, positions)  # (B, T, C)
        self_attentions, cross_attentions = [], []
        for i, block in enumerate(self.decoder):
            layer_cache = None if cache is None else cache[i]
            x, self_w, cross_w = block(x, memory, self_mask, memory_mask, positions,
                                       layer_cache, need_weights)
            if need_weights:
                self_attentions.append(self_w)  # (B, H, T, T)
                cross_attentions.append(cross_w)  # (B, H, T, S)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return ModelOutput(logits=self.lm_head(x), attentions=self_attentions,
                           cross_attentions=cross_attentions)  # logits (B, T, V)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        need_weights: bool = False,
        targets: Tensor | None = None,
    ) -> ModelOutput:
        """src (B, S), tgt (B, T) ids (masks: (B, S) / (B, T), True at real tokens).

        `targets` (B, T), the target shifted left, with IGNORE_INDEX at padding, adds the loss.
        """
        memory, enc_w = self.encode(src, src_mask, need_weights)  # (B, S, C)
        out = self.decode(tgt, memory, tgt_mask, src_mask, need_weights)
        out.encoder_attentions = enc_w
        if targets is not None:
            out.loss = cross_entropy(out.logits, targets)
        return out
