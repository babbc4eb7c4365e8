"""BERT's masked-LM corruption (15%, then 80/10/10) and the loss on chosen positions only."""

import pytest
import torch
import torch.nn.functional as F

from tfbook.masked_lm import IGNORE_INDEX, mask_tokens, mlm_loss

V, MASK = 1000, 3


def test_rates_and_labels():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, V, (200, 500), generator=g)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    maskable[:, 0] = False  # e.g. [CLS]
    corrupted, labels, chosen = mask_tokens(ids, MASK, V, maskable, generator=g)
    n = chosen.sum().item()
    assert abs(n / maskable.sum().item() - 0.15) < 0.005
    assert not chosen[:, 0].any()
    assert torch.equal(corrupted[~chosen], ids[~chosen])  # untouched where not chosen
    assert torch.equal(labels[chosen], ids[chosen])  # the label is the original token
    assert torch.all(labels[~chosen] == IGNORE_INDEX)
    masked = (corrupted == MASK) & chosen
    kept = (corrupted == ids) & chosen
    replaced = chosen & ~masked & ~kept
    assert abs(masked.sum().item() / n - 0.8) < 0.01
    # a random replacement can hit the original token, so "kept" is 10% + 10% * 1/V
    assert abs(kept.sum().item() / n - 0.1) < 0.01
    assert abs(replaced.sum().item() / n - 0.1) < 0.01


def test_seeded_generator_is_reproducible():
    ids = torch.randint(0, V, (4, 20))
    a = mask_tokens(ids, MASK, V, generator=torch.Generator().manual_seed(1))
    b = mask_tokens(ids, MASK, V, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_loss_only_on_chosen_positions():
    torch.manual_seed(0)
    ids = torch.randint(0, V, (3, 12))
    _, labels, chosen = mask_tokens(ids, MASK, V, mask_prob=0.3,
                                    generator=torch.Generator().manual_seed(0))
    logits = torch.randn(3, 12, V, requires_grad=True)
    loss = mlm_loss(logits, labels)
    by_hand = F.cross_entropy(logits[chosen], ids[chosen])
    assert torch.allclose(loss, by_hand)
    loss.backward()
    assert torch.all(logits.grad[~chosen] == 0)  # unchosen positions get no gradient
    assert torch.all(logits.grad[chosen].abs().sum(-1) > 0)


def test_bad_input():
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"mask_prob must be in \(0, 1\), got 1.5"):
        mask_tokens(ids, MASK, V, mask_prob=1.5)
    with pytest.raises(ValueError, match=r"shape of input_ids \(2, 5\), got torch.bool of shape"):
        mask_tokens(ids, MASK, V, maskable=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="got torch.int64"):
        mask_tokens(ids, MASK, V, maskable=torch.ones(2, 5, dtype=torch.long))
