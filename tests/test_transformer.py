"""The encoder-decoder equals nn.Transformer with copied weights."""

from dataclasses import replace

import pytest
import torch

from tests.attention_kernels import KERNELS
from tfbook.masks import causal_mask
from tfbook.models.transformer import Transformer, TransformerConfig
from tfbook.torch_reference import torch_transformer

B, S, T = 3, 7, 6


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first,act", [(False, "relu"), (True, "gelu")])
def test_equals_torch_transformer(norm_first, act):
    torch.manual_seed(0)
    config = replace(TransformerConfig.tiny(), norm_first=norm_first, activation=act)
    model = Transformer(config).eval()
    ref = torch_transformer(model).eval()
    src = torch.randint(0, 50, (B, S))
    tgt = torch.randint(0, 50, (B, T))
    src_keep = torch.arange(S) < torch.tensor([7, 5, 3])[:, None]  # (B, S)
    tgt_keep = torch.arange(T) < torch.tensor([6, 6, 4])[:, None]  # (B, T)
    out = model(src, tgt, src_keep, tgt_keep, need_weights=True)
    hidden = ref(
        model.embed_source(src), model.embed_target(tgt), tgt_mask=~causal_mask(T),
        src_key_padding_mask=~src_keep, tgt_key_padding_mask=~tgt_keep,
        memory_key_padding_mask=~src_keep, tgt_is_causal=True,
    )
    assert out.logits.shape == (B, T, 50)
    assert (out.logits - model.lm_head(hidden)).abs().max() <= 1e-4
    assert [w.shape for w in out.cross_attentions] == [(B, 4, T, S)] * 2
    # cross-attention never looks at padded source positions
    assert torch.all(out.cross_attentions[0][2, :, :, 3:] == 0)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_attention_kernel_gives_the_same_logits(kernel):
    """Encoder, causal decoder and cross-attention to a longer, padded source."""
    torch.manual_seed(0)
    model = Transformer(replace(TransformerConfig.tiny(), attention=kernel)).eval()
    src, tgt = torch.randint(0, 50, (B, S)), torch.randint(0, 50, (B, T))
    src_keep = torch.arange(S) < torch.tensor([7, 5, 3])[:, None]  # (B, S)
    tgt_keep = torch.arange(T) < torch.tensor([6, 6, 4])[:, None]  # (B, T)
    fast = model(src, tgt, src_keep, tgt_keep).logits
    expected = model(src, tgt, src_keep, tgt_keep, need_weights=True).logits  # the reference
    assert (fast - expected)[tgt_keep].abs().max() <= 1e-5


def test_shared_embeddings_and_scaling():
    model = Transformer(TransformerConfig.tiny())
    assert model.src_emb is model.tgt_emb
    assert model.lm_head.weight is model.src_emb.weight
    assert model.src_emb.scale == pytest.approx(32**0.5)
    separate = Transformer(replace(TransformerConfig.tiny(), share_embeddings=False,
                                   tgt_vocab_size=40))
    assert separate.lm_head.weight.shape == (40, 32)
    with pytest.raises(ValueError, match="src_vocab_size=50 and tgt_vocab_size=40"):
        Transformer(replace(TransformerConfig.tiny(), tgt_vocab_size=40))


def test_teacher_forcing_is_causal():
    # changing a later target token must not change the logits at earlier positions
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.tiny()).eval()
    src = torch.randint(0, 50, (1, S))
    tgt = torch.randint(0, 50, (1, T))
    changed = tgt.clone()
    changed[0, 4] = (changed[0, 4] + 1) % 50
    a, b = model(src, tgt).logits, model(src, changed).logits
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_too_long_and_bad_ids():
    model = Transformer(TransformerConfig.tiny())
    with pytest.raises(ValueError, match="length 65 exceeds the model's context length 64"):
        model(torch.zeros(1, 65, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 50\).*got values in \[1, 50\]"):
        model(torch.tensor([[1, 50]]), torch.zeros(1, 3, dtype=torch.long))


def test_without_final_norm_has_no_torch_twin():
    config = replace(TransformerConfig.tiny(), final_norm=False)
    model = Transformer(config).eval()
    assert model.encoder_norm is None
    assert model(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long)
                 ).logits.shape == (1, 2, 50)
    with pytest.raises(ValueError, match="final_norm=True, got False"):
        torch_transformer(model)
