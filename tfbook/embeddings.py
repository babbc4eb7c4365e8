"""Token embeddings: integer ids -> vectors by looking up rows of a (V, C) table.

    X = [E_{t_1}; ...; E_{t_T}] = onehot(t) @ E                    (Vaswani et al., 3.4)

Shape legend: B batch, T sequence, C model width, V vocab.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def check_token_ids(idx: Tensor, vocab_size: int) -> None:
    """Raise a clear error unless `idx` is an integer tensor with values in [0, vocab_size)."""
    if not isinstance(idx, Tensor):
        raise TypeError(f"token ids must be a torch.Tensor, got {type(idx).__name__}")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"token ids must be an integer tensor (torch.long), got {idx.dtype}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}) for a vocab of size {vocab_size}, "
            f"got values in [{int(idx.min())}, {int(idx.max())}]"
        )


def one_hot_embedding(idx: Tensor, weight: Tensor) -> Tensor:
    """The slow way to embed: onehot(idx) @ E, equal to the lookup `weight[idx]`.

    idx (B, T) with V = weight.size(0) -> (B, T, C). For teaching; lookup is what models use.
    """
    one_hot = F.one_hot(idx, num_classes=weight.size(0)).to(weight.dtype)  # (B, T, V)
    return one_hot @ weight  # (B, T, V) @ (V, C) -> (B, T, C)


class TokenEmbedding(nn.Module):
    """A learned (V, C) table; forward looks up rows, optionally times sqrt(C) (Vaswani 3.4)."""

    def __init__(self, vocab_size: int, d_model: int, scale: bool = False) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        # Vaswani et al. multiply the embeddings by sqrt(d_model) and give no reason; a common
        # reading is that it keeps small initial embeddings from being drowned by the
        # positional encoding, whose entries are of size ~1 (the embeddings chapter tests it).
        self.scale = math.sqrt(d_model) if scale else 1.0
        # mul_ rather than *: the same numbers, and on the meta device it does not import
        # torch._dynamo (about a second, in every process that builds a model there)
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model).mul_(0.02))  # E: (V, C)

    def forward(self, idx: Tensor) -> Tensor:
        """idx (B, T) integer ids -> (B, T, C) vectors."""
        check_token_ids(idx, self.vocab_size)
        x = F.embedding(idx, self.weight)  # (B, T, C): row idx[b, t] of E
        return x * self.scale if self.scale != 1.0 else x
