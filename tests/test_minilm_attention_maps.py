"""attention_maps: the real MiniLM's per-head attention on one sentence, for the widgets."""

import pytest
import torch

from tests.pinned_threads import THREAD_COUNTS, pinned_threads
from tfbook.checkpoints.minilm import attention_maps, load_minilm
from tfbook.tokenizers import load_minilm_wordpiece


@pytest.fixture(scope="module")
def minilm():
    return load_minilm(), load_minilm_wordpiece()


@THREAD_COUNTS
def test_tokens_and_weights_match_a_direct_forward(minilm, n_threads) -> None:
    model, tok = minilm
    with pinned_threads(n_threads):  # bit for bit: the same forward, the same threads
        tokens, weights = attention_maps(model, tok, "The cat sat on the mat.")
    ids = tok.encode("The cat sat on the mat.", add_special_tokens=True)
    assert tokens == tok.decode_bytes_list(ids) and tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    T = len(ids)
    assert weights.shape == (6, 12, T, T)
    with torch.no_grad(), pinned_threads(n_threads):
        direct = model(torch.tensor([ids]), need_weights=True).attentions
    assert torch.equal(weights[3], direct[3][0])
    assert torch.allclose(weights.sum(-1), torch.ones(6, 12, T), atol=1e-5)


def test_typed_special_tokens_are_plain_text(minilm) -> None:
    tokens, _ = attention_maps(*minilm, "[CLS] hi")
    assert tokens.count("[CLS]") == 1 and tokens[1] == "["


def test_too_long_text_is_a_clear_error(minilm) -> None:
    with pytest.raises(ValueError, match="at most 512"):
        attention_maps(*minilm, "word " * 600)
