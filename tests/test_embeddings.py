"""Token embedding: lookup == one-hot @ E, sparse gradients, sqrt(C) scaling, bad ids."""

import math

import pytest
import torch

from tfbook.embeddings import TokenEmbedding, one_hot_embedding

V, C = 11, 6


def test_lookup_equals_one_hot_matmul():
    torch.manual_seed(0)
    emb = TokenEmbedding(V, C)
    idx = torch.tensor([[0, 3, 3, 10], [5, 1, 2, 9]])
    looked_up = emb(idx)
    assert looked_up.shape == (2, 4, C)
    assert torch.equal(looked_up, emb.weight[idx])
    assert torch.allclose(looked_up, one_hot_embedding(idx, emb.weight), atol=1e-7)


def test_gradient_touches_only_used_rows():
    emb = TokenEmbedding(V, C)
    idx = torch.tensor([[2, 7, 2]])
    emb(idx).sum().backward()
    used = torch.zeros(V, dtype=torch.bool)
    used[[2, 7]] = True
    assert torch.all(emb.weight.grad[~used] == 0)
    assert torch.allclose(emb.weight.grad[2], torch.full((C,), 2.0))  # used twice


def test_sqrt_d_model_scaling():
    torch.manual_seed(0)
    plain, scaled = TokenEmbedding(V, C), TokenEmbedding(V, C, scale=True)
    scaled.load_state_dict(plain.state_dict())
    idx = torch.tensor([[1, 4]])
    assert torch.allclose(scaled(idx), plain(idx) * math.sqrt(C))


def test_bad_ids():
    emb = TokenEmbedding(V, C)
    with pytest.raises(ValueError, match=r"\[0, 11\).*got values in \[0, 11\]"):
        emb(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match=r"got values in \[-1, 2\]"):
        emb(torch.tensor([[-1, 2]]))
    with pytest.raises(TypeError, match="integer tensor.*got torch.float32"):
        emb(torch.tensor([[1.0, 2.0]]))
