"""The one loss: cross-entropy with ignore_index and label smoothing equals F.cross_entropy."""

import pytest
import torch
import torch.nn.functional as F

from tfbook.losses import IGNORE_INDEX, cross_entropy, smoothed_targets


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_equals_torch_values_and_gradients(smoothing):
    torch.manual_seed(0)
    logits = (torch.randn(3, 7, 11) * 3).requires_grad_(True)
    targets = torch.randint(0, 11, (3, 7))
    targets[0, :4] = IGNORE_INDEX
    targets[2, -1] = IGNORE_INDEX
    ours = cross_entropy(logits, targets, label_smoothing=smoothing)
    ref = F.cross_entropy(logits.view(-1, 11), targets.view(-1), label_smoothing=smoothing)
    assert (ours - ref).abs() <= 1e-6
    g_ours, = torch.autograd.grad(ours, logits)
    g_ref, = torch.autograd.grad(ref, logits)
    assert (g_ours - g_ref).abs().max() <= 1e-6
    assert torch.all(g_ours[0, :4] == 0)  # ignored positions get no gradient


def test_smoothed_target_distribution():
    q = smoothed_targets(torch.tensor([2, 0]), 4, 0.2)
    assert torch.allclose(q.sum(-1), torch.ones(2))
    assert torch.allclose(q[0], torch.tensor([0.05, 0.05, 0.85, 0.05]))
    logits = torch.randn(2, 4)
    # the smoothed loss is the cross-entropy against that distribution
    by_distribution = -(q * torch.log_softmax(logits, -1)).sum(-1).mean()
    assert torch.allclose(cross_entropy(logits, torch.tensor([2, 0]), label_smoothing=0.2),
                          by_distribution)


def test_all_ignored_is_nan_like_torch():
    logits, targets = torch.randn(2, 5), torch.full((2,), IGNORE_INDEX)
    assert cross_entropy(logits, targets).isnan()
    assert F.cross_entropy(logits, targets).isnan()


def test_bad_input():
    logits = torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match=r"shape of logits without the last dimension \(2, 3\)"):
        cross_entropy(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="targets must be an integer tensor"):
        cross_entropy(logits, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\[0, 5\) or equal ignore_index=-100, got .* \[0, 7\]"):
        cross_entropy(logits, torch.tensor([[0, 1, 7], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"label_smoothing must lie in \[0, 1\), got 1.5"):
        cross_entropy(logits, torch.zeros(2, 3, dtype=torch.long), label_smoothing=1.5)
