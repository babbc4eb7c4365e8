"""An encoder-only transformer, BERT-style (Devlin et al. 2019).

    token + position + token-type embeddings -> LayerNorm -> N post-LN encoder blocks
    (bidirectional self-attention, GELU FFN) -> hidden states (B, T, C)
    pooler: tanh(W h_[CLS] + b);   MLM head: LayerNorm(GELU(W h + b)) E^T + bias

Shape legend: B batch, T sequence, C model width, H heads, V vocab.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tfbook.blocks import BlockConfig, SelfAttentionBlock, block_config_of
from tfbook.config import check_positive
from tfbook.embeddings import TokenEmbedding, check_token_ids
from tfbook.feedforward import gelu
from tfbook.losses import cross_entropy
from tfbook.masks import padding_mask
from tfbook.models.output import ModelOutput
from tfbook.normalization import LayerNorm
from tfbook.positional import LearnedPositionalEmbedding


@dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder; presets below, variants via `dataclasses.replace`."""

    vocab_size: int = 30522  # V, BERT's uncased WordPiece vocabulary
    max_len: int = 512  # context length: number of learned position vectors
    type_vocab_size: int = 2  # token types ("segment A / B" for sentence pairs)
    n_layers: int = 12  # number of encoder blocks
    n_heads: int = 12  # H, attention heads per block
    d_model: int = 768  # C, hidden size
    d_ff: int = 3072  # F, FFN hidden size ("intermediate size")
    dropout: float = 0.1  # hidden and attention dropout
    norm_eps: float = 1e-12  # BERT's (very small) LayerNorm epsilon
    attention: str = "torch"  # attention kernel: "reference" (ours), "torch" (SDPA) or "flash"
    fused_norm: bool = True  # torch's one-kernel LayerNorm (False: our layer_norm)
    fused_activation: bool = True  # torch's one-kernel activation (False: ours)

    def __post_init__(self) -> None:
        check_positive(self, "vocab_size", "max_len", "type_vocab_size", "n_layers")
        self.block_config()  # checks the block settings, in BertConfig's words

    def block_config(self) -> BlockConfig:
        """The per-block settings: the fields shared with BlockConfig, post-LN, exact GELU."""
        return block_config_of(self, activation="gelu", norm_first=False)

    @classmethod
    def bert_base(cls) -> "BertConfig":
        """BERT-base: 12 layers, width 768, 12 heads; 109,482,240 parameters with the pooler."""
        return cls()

    @classmethod
    def minilm_l6(cls) -> "BertConfig":
        """all-MiniLM-L6-v2: 6 layers, width 384, 12 heads of size 32."""
        return cls(n_layers=6, d_model=384, d_ff=1536)

    @classmethod
    def tiny(cls) -> "BertConfig":
        """A toy size for tests."""
        return cls(vocab_size=100, max_len=32, n_layers=2, n_heads=4, d_model=32, d_ff=64)


class BertEmbeddings(nn.Module):
    """Sum of token, position and token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.token = TokenEmbedding(config.vocab_size, config.d_model)
        self.position = LearnedPositionalEmbedding(config.max_len, config.d_model)
        self.token_type = TokenEmbedding(config.type_vocab_size, config.d_model)
        self.norm = LayerNorm(config.d_model, config.norm_eps, config.fused_norm)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """input_ids (B, T), token_type_ids (B, T) or None (all type 0) -> (B, T, C)."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.token(input_ids) + self.token_type(token_type_ids)  # (B, T, C)
        x = self.position(x)  # (B, T, C), adds one learned vector per position
        return self.dropout(self.norm(x))


class Bert(nn.Module):
    """BERT encoder with pooler: token ids -> contextual vectors (B, T, C) and pooled (B, C)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.blocks = nn.ModuleList(
            [SelfAttentionBlock(config.block_config()) for _ in range(config.n_layers)]
        )
        self.pooler = nn.Linear(config.d_model, config.d_model)  # on the [CLS] vector

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T) is 1/True at real tokens, 0/False at padding."""
        check_token_ids(input_ids, self.config.vocab_size)
        B, T = input_ids.size()
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != (B, T):
                raise ValueError(
                    f"attention_mask must have the shape of input_ids {(B, T)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            mask = padding_mask(attention_mask)  # (B, 1, 1, T): padded keys are hidden
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, C)
        attentions = []
        for block in self.blocks:
            x, weights = block(x, mask=mask, need_weights=need_weights)  # (B, T, C)
            if need_weights:
                attentions.append(weights)  # (B, H, T, T)
        pooled = torch.tanh(self.pooler(x[:, 0]))  # (B, C) from the first ([CLS]) token
        return ModelOutput(last_hidden_state=x, pooled=pooled, attentions=attentions)


class BertMLMHead(nn.Module):
    """Masked-language-model head: transform, then unembed with the tied token matrix."""

    def __init__(self, config: BertConfig, token_embedding: TokenEmbedding) -> None:
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.norm = LayerNorm(config.d_model, config.norm_eps, config.fused_norm)
        self.token_embedding = token_embedding  # shared E: (V, C)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))  # (V,)

    def forward(self, h: Tensor) -> Tensor:
        """h (B, T, C) -> logits over the vocabulary (B, T, V)."""
        h = self.norm(gelu(self.dense(h)))  # (B, T, C)
        return h @ self.token_embedding.weight.T + self.bias  # (B, T, V)


class BertForMaskedLM(nn.Module):
    """BERT plus the MLM head: predicts the tokens hidden behind [MASK] (Devlin et al., 3.1)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.bert = Bert(config)
        self.mlm_head = BertMLMHead(config, self.bert.embeddings.token)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None, labels: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T) -> MLM logits (B, T, V); loss on the positions whose label is not
        IGNORE_INDEX (`tfbook.masked_lm.mask_tokens` makes the labels)."""
        out = self.bert(input_ids, attention_mask, token_type_ids, need_weights)
        out.logits = self.mlm_head(out.last_hidden_state)  # (B, T, V)
        if labels is not None:
            out.loss = cross_entropy(out.logits, labels)
        return out
