"""Encoder and decoder blocks equal nn.TransformerEncoderLayer / nn.TransformerDecoderLayer."""

import pytest
import torch

from tfbook.blocks import BlockConfig, CrossAttentionBlock, SelfAttentionBlock
from tfbook.masks import causal_mask, padding_mask
from tfbook.torch_reference import torch_decoder_layer, torch_encoder_layer

B, T, S = 3, 6, 5
CASES = [(False, "relu"), (True, "relu"), (False, "gelu"), (True, "gelu")]


def config(norm_first: bool, act: str) -> BlockConfig:
    return BlockConfig(d_model=32, n_heads=4, d_ff=64, dropout=0.0, activation=act,
                       norm_first=norm_first)


# Outputs are compared with gradients enabled: in no_grad eval mode torch.nn takes a "fast
# path" that writes zeros at padded positions instead of computing them.


@pytest.mark.parametrize("norm_first,act", CASES)
def test_encoder_block_equals_torch(norm_first, act):
    torch.manual_seed(0)
    c = config(norm_first, act)
    ours = SelfAttentionBlock(c).eval()
    ref = torch_encoder_layer(ours, c).eval()
    x = torch.randn(B, T, 32)
    lengths = torch.tensor([6, 4, 2])
    y, _ = ours(x, mask=padding_mask(lengths, T))
    y_ref = ref(x, src_key_padding_mask=~padding_mask(lengths, T)[:, 0, 0])
    assert (y - y_ref).abs().max() <= 1e-4
    y_causal, _ = ours(x, causal=True)
    y_causal_ref = ref(x, src_mask=~causal_mask(T), is_causal=True)
    assert (y_causal - y_causal_ref).abs().max() <= 1e-4


@pytest.mark.parametrize("norm_first,act", CASES)
def test_decoder_block_equals_torch(norm_first, act):
    torch.manual_seed(1)
    c = config(norm_first, act)
    ours = CrossAttentionBlock(c).eval()
    ref = torch_decoder_layer(ours, c).eval()
    x, memory = torch.randn(B, T, 32), torch.randn(B, S, 32)
    tgt_keep = padding_mask(torch.tensor([6, 5, 3]), T)
    src_keep = padding_mask(torch.tensor([5, 2, 4]), S)
    y, w_self, w_cross = ours(x, memory, tgt_keep, src_keep, need_weights=True)
    y_ref = ref(
        x, memory, tgt_mask=~causal_mask(T), tgt_key_padding_mask=~tgt_keep[:, 0, 0],
        memory_key_padding_mask=~src_keep[:, 0, 0], tgt_is_causal=True,
    )
    assert (y - y_ref).abs().max() <= 1e-4
    assert w_self.shape == (B, 4, T, T) and w_cross.shape == (B, 4, T, S)
    assert torch.all(w_self.triu(1) == 0)  # no peeking at later target positions


def test_dropout_only_in_training():
    c = BlockConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.5)
    block = SelfAttentionBlock(c)
    x = torch.randn(2, 4, 16)
    block.eval()
    assert torch.equal(block(x)[0], block(x)[0])
    block.train()
    assert not torch.equal(block(x)[0], block(x)[0])
