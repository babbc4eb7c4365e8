"""The masked-language-model objective of BERT (Devlin et al. 2019, section 3.1, "Task #1").

Corruption: each token that may be masked is chosen with probability 15%; a chosen token is
replaced by [MASK] 80% of the time, by a random token 10% of the time, and left as it is 10%
of the time. The model must predict the ORIGINAL token at every chosen position, and only
there: the labels hold -100 (PyTorch's `ignore_index`) everywhere else.

    ids     [CLS] the  cat  sat  on   the  mat  [SEP]
    chosen         .    x    .    .    x    .
    input   [CLS] the [MASK] sat  on  dog  mat  [SEP]     ("the" got a random token)
    labels  -100 -100  cat -100 -100  the -100 -100

Shape legend: B batch, T sequence, V vocabulary.
"""

import torch
from torch import Tensor

from tfbook.losses import IGNORE_INDEX, cross_entropy


def mask_tokens(
    input_ids: Tensor,
    mask_token_id: int,
    vocab_size: int,
    maskable: Tensor | None = None,
    mask_prob: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """BERT's 80/10/10 corruption of (B, T) ids -> (corrupted ids, labels, chosen).

    `maskable` (B, T) is True where a token may be chosen (not [CLS], [SEP] or padding);
    `chosen` (B, T) marks the positions the loss will be computed on.
    """
    if not 0.0 < mask_prob < 1.0:
        raise ValueError(f"mask_prob must be in (0, 1), got {mask_prob}")
    if maskable is None:
        maskable = torch.ones_like(input_ids, dtype=torch.bool)
    if maskable.shape != input_ids.shape or maskable.dtype != torch.bool:
        raise ValueError(
            f"maskable must be a boolean tensor of the shape of input_ids "
            f"{tuple(input_ids.shape)}, got {maskable.dtype} of shape {tuple(maskable.shape)}"
        )
    draw = torch.rand(input_ids.shape, generator=generator)  # (B, T): which tokens to choose
    chosen = (draw < mask_prob) & maskable  # (B, T), about 15% of the maskable tokens
    fate = torch.rand(input_ids.shape, generator=generator)  # (B, T): what becomes of them
    to_mask = chosen & (fate < 0.8)  # 80%: [MASK]
    to_random = chosen & (fate >= 0.8) & (fate < 0.9)  # 10%: a random token; 10%: unchanged
    random_ids = torch.randint(vocab_size, input_ids.shape, generator=generator)  # (B, T)
    corrupted = input_ids.clone()
    corrupted[to_mask] = mask_token_id
    corrupted[to_random] = random_ids[to_random]
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return corrupted, labels, chosen


def mlm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the chosen positions only: logits (B, T, V), labels (B, T)."""
    return cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
