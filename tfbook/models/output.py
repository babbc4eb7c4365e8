"""What every model's forward returns: one result object, fields filled where they apply."""

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class ModelOutput:
    """The result of GPT, BERT and the encoder-decoder; unused fields stay None / empty."""

    logits: Tensor | None = None  # (B, T, V) next-token (or masked-token) scores
    loss: Tensor | None = None  # mean cross-entropy against the targets, if they were given
    last_hidden_state: Tensor | None = None  # (B, T, C) the final hidden vectors (BERT)
    pooled: Tensor | None = None  # (B, C) BERT's tanh(W h_[CLS] + b)
    # per layer (B, H, T, S): the self-attention of the main stack (GPT's blocks, BERT's
    # blocks, the encoder-decoder's decoder); empty unless need_weights=True
    attentions: list[Tensor] = field(default_factory=list)
    encoder_attentions: list[Tensor] = field(default_factory=list)  # (B, H, S, S) per layer
    cross_attentions: list[Tensor] = field(default_factory=list)  # (B, H, T, S) per layer
