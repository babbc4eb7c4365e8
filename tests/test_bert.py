"""The BERT encoder: padding does not leak, pooler, tied MLM head, bad input."""

from dataclasses import replace

import pytest
import torch

from tests.attention_kernels import KERNELS
from tfbook.models.bert import Bert, BertConfig, BertForMaskedLM


@pytest.fixture(scope="module")
def model() -> Bert:
    torch.manual_seed(0)
    return Bert(BertConfig.tiny()).eval()


def test_padding_does_not_change_real_tokens(model):
    ids = torch.randint(1, 100, (1, 5))
    alone = model(ids).last_hidden_state
    padded_ids = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    padded = model(padded_ids, mask, need_weights=True)
    assert torch.allclose(padded.last_hidden_state[:, :5], alone, atol=1e-5)
    assert torch.all(padded.attentions[0][..., 5:] == 0)  # nobody attends to padding
    assert padded.pooled.shape == (1, 32)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_attention_kernel_gives_the_same_vectors(model, kernel):
    fast = Bert(replace(BertConfig.tiny(), attention=kernel)).eval()
    fast.load_state_dict(model.state_dict())  # the fixture runs torch's kernel by default
    ids = torch.randint(1, 100, (3, 8))
    real = torch.arange(8) < torch.tensor([8, 5, 2])[:, None]  # (B, T)
    expected = model(ids, real, need_weights=True).last_hidden_state  # weights: the reference
    assert (fast(ids, real).last_hidden_state - expected)[real].abs().max() <= 1e-5


def test_token_types_matter(model):
    ids = torch.randint(1, 100, (1, 6))
    types = torch.tensor([[0, 0, 0, 1, 1, 1]])
    a = model(ids).last_hidden_state
    b = model(ids, token_type_ids=types).last_hidden_state
    assert not torch.allclose(a, b)


def test_mlm_head_is_tied_and_shaped():
    torch.manual_seed(0)
    mlm = BertForMaskedLM(BertConfig.tiny()).eval()
    assert mlm.mlm_head.token_embedding.weight is mlm.bert.embeddings.token.weight
    ids = torch.randint(0, 100, (2, 7))
    labels = torch.full_like(ids, -100)
    labels[0, 3] = 42
    out = mlm(ids, labels=labels)
    assert out.logits.shape == (2, 7, 100)
    # the loss is the cross-entropy at the one labelled position only
    assert torch.allclose(out.loss, -torch.log_softmax(out.logits[0, 3], -1)[42])


def test_bad_input(model):
    with pytest.raises(ValueError, match="length 33 exceeds the model's context length 32"):
        model(torch.ones(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 100\).*got values in \[5, 100\]"):
        model(torch.tensor([[5, 100]]))
    with pytest.raises(ValueError, match=r"shape of input_ids \(1, 3\), got \(1, 4\)"):
        model(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 4, dtype=torch.long))
