"""A decoder-only transformer, GPT-style (Radford et al. 2018, 2019).

    token ids -> token + learned position embeddings -> N pre-LN blocks with causal
    self-attention -> final LayerNorm -> logits = h E^T (output layer tied to the embedding)

Shape legend: B batch, T sequence, C model width, H heads, V vocab.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbook.blocks import BlockConfig, EncoderBlock
from tfbook.embeddings import TokenEmbedding
from tfbook.layernorm import LayerNorm
from tfbook.positional import LearnedPositionalEmbedding


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of a GPT; presets below, variants with `dataclasses.replace`."""

    block_size: int = 1024  # context length: the most positions the model can see
    vocab_size: int = 50257  # V, GPT-2's byte-level BPE vocabulary
    n_layer: int = 12  # number of blocks
    n_head: int = 12  # H, attention heads per block
    n_embd: int = 768  # C, width of the residual stream
    dropout: float = 0.0  # dropout on embeddings, attention weights and sub-layer outputs
    activation: str = "gelu_tanh"  # GPT-2 uses the tanh approximation of GELU
    bias: bool = True  # biases in linear layers, as in GPT-2
    tie_weights: bool = True  # output layer shares the token embedding matrix
    fused: bool = True  # torch's fused kernels (attention without weights, LayerNorm, GELU)

    def block_config(self) -> BlockConfig:
        """The per-block settings: pre-LN, FFN width 4C."""
        return BlockConfig(
            d_model=self.n_embd, n_heads=self.n_head, d_ff=4 * self.n_embd,
            dropout=self.dropout, activation=self.activation, norm_first=True,
            bias=self.bias, fused=self.fused,
        )

    @classmethod
    def gpt2_124m(cls) -> "GPTConfig":
        """GPT-2 small: 12 layers, width 768, 12 heads; 124,439,808 parameters."""
        return cls()

    @classmethod
    def tiny(cls) -> "GPTConfig":
        """A model that trains in minutes on a laptop CPU; fits tests."""
        return cls(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=64)


@dataclass
class GPTOutput:
    """What `GPT.forward` returns."""

    logits: Tensor  # (B, T, V), unnormalised next-token scores
    loss: Tensor | None  # mean cross-entropy against the targets, if they were given
    attentions: list[Tensor]  # per layer (B, H, T, T); empty unless need_weights=True


class GPT(nn.Module):
    """Decoder-only language model: next-token logits for every position."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = TokenEmbedding(config.vocab_size, config.n_embd)
        self.pos_emb = LearnedPositionalEmbedding(config.block_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        # "encoder block" = self-attention + FFN; with causal=True it is GPT's decoder block
        self.blocks = nn.ModuleList(
            [EncoderBlock(config.block_config()) for _ in range(config.n_layer)]
        )
        self.norm_f = LayerNorm(config.n_embd, fused=config.fused)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # one (V, C) matrix to embed and unembed
        self.apply(init_weights)
        # GPT-2 (section 2.3): the layers that write into the residual stream start smaller,
        # std 0.02 / sqrt(2N), so that the sum of 2N contributions keeps a steady size
        for block in self.blocks:
            for proj in (block.attn.out_proj, block.ff.fc_out):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, need_weights: bool = False
    ) -> GPTOutput:
        """idx (B, T) token ids -> logits (B, T, V); position t predicts token t + 1."""
        B, T = idx.size()
        x = self.dropout(self.pos_emb(self.tok_emb(idx)))  # (B, T, C)
        attentions = []
        for block in self.blocks:
            x, weights = block(x, causal=True, need_weights=need_weights)  # (B, T, C)
            if need_weights:
                attentions.append(weights)  # (B, H, T, T)
        logits = self.lm_head(self.norm_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return GPTOutput(logits, loss, attentions)


def init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases (LayerNorm keeps 1 and 0)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (TokenEmbedding, LearnedPositionalEmbedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def gpt_on_meta(config: GPTConfig) -> GPT:
    """Build a GPT on the `meta` device: shapes only, no memory, for counting parameters."""
    with torch.device("meta"):
        return GPT(config)

