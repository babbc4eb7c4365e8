"""Every config validates at construction and says what is wrong in its own field names."""

import pytest
import torch

from tfbook.attention import MultiHeadAttention
from tfbook.blocks import BlockConfig, CrossAttentionBlock, SelfAttentionBlock
from tfbook.models.bert import BertConfig
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.transformer import TransformerConfig
from tfbook.torch_reference import torch_decoder_layer, torch_encoder_layer

BAD = [
    (GPTConfig, {"n_heads": 0}, r"GPTConfig: n_heads must be a positive int, got 0"),
    (GPTConfig, {"n_heads": -2}, r"GPTConfig: n_heads must be a positive int, got -2"),
    (GPTConfig, {"vocab_size": -5}, r"GPTConfig: vocab_size must be a positive int, got -5"),
    (GPTConfig, {"n_layers": 2.5}, r"GPTConfig: n_layers must be a positive int, got 2.5"),
    (GPTConfig, {"dropout": 1.5}, r"GPTConfig: dropout must lie in \[0, 1\], got 1.5"),
    (GPTConfig, {"dropout": float("nan")}, r"GPTConfig: dropout must lie in \[0, 1\], got nan"),
    (GPTConfig, {"d_model": 30}, r"GPTConfig: d_model=30 is not divisible by n_heads=12"),
    (GPTConfig, {"n_kv_heads": 5}, r"GPTConfig: n_heads=12 is not a multiple of n_kv_heads=5"),
    (GPTConfig, {"norm": "batch"}, r"GPTConfig: norm must be one of \('layer', 'rms'\)"),
    (GPTConfig, {"ffn": "moe"}, r"GPTConfig: ffn must be one of \('mlp', 'swiglu'\)"),
    (GPTConfig, {"position": "alibi"}, r"GPTConfig: position must be one of"),
    (GPTConfig, {"activation": "swish"}, r"GPTConfig: activation must be one of"),
    (GPTConfig, {"position": "rope", "rope_base": 0.5}, r"GPTConfig: RoPE needs rope_base > 1"),
    (GPTConfig, {"norm_eps": 0.0}, r"GPTConfig: norm_eps must be > 0, got 0.0"),
    (BertConfig, {"n_heads": 0}, r"BertConfig: n_heads must be a positive int, got 0"),
    (BertConfig, {"vocab_size": 0}, r"BertConfig: vocab_size must be a positive int, got 0"),
    (BertConfig, {"dropout": -0.1}, r"BertConfig: dropout must lie in \[0, 1\], got -0.1"),
    (TransformerConfig, {"n_heads": 0}, r"TransformerConfig: n_heads must be a positive int"),
    (TransformerConfig, {"n_encoder_layers": 0}, r"TransformerConfig: n_encoder_layers must"),
    (TransformerConfig, {"tgt_vocab_size": 10}, r"TransformerConfig: share_embeddings needs"),
    (BlockConfig, {"d_ff": 0}, r"BlockConfig: d_ff must be a positive int, got 0"),
    (BlockConfig, {"dropout": 2}, r"BlockConfig: dropout must lie in \[0, 1\], got 2"),
]


@pytest.mark.parametrize("config,changes,message", BAD)
def test_bad_configs_are_refused_in_their_own_words(config, changes, message):
    with pytest.raises(ValueError, match=message):
        config(**changes)


def test_bad_attention_arguments():
    with pytest.raises(ValueError, match="n_heads must be a positive int, got 0"):
        MultiHeadAttention(32, 0)
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\], got 1.5"):
        MultiHeadAttention(32, 4, dropout=1.5)
    mha = MultiHeadAttention(32, 4)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 32\), got \(5, 32\)"):
        mha(torch.randn(5, 32))
    with pytest.raises(ValueError, match=r"expected source of shape \(2, S, 32\).*\(3, 4, 32\)"):
        mha(torch.randn(2, 5, 32), torch.randn(3, 4, 32))


def test_bad_model_inputs():
    model = GPT(GPTConfig.tiny())
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.rand(1, 4))
    with pytest.raises(ValueError, match=r"idx must have shape \(B, T\), got \(4,\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, S\) = \(1, 4\)"):
        model(torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 64\)"):
        model(torch.zeros(1, 2, dtype=torch.long), positions=torch.tensor([63, 64]))


@pytest.mark.parametrize("block", [SelfAttentionBlock, CrossAttentionBlock])
def test_blocks_without_biases_have_torch_twins(block):
    torch.manual_seed(0)
    config = BlockConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.0, bias=False)
    ours = block(config).eval()
    assert all(n.endswith("weight") for n, _ in ours.named_parameters())  # no bias anywhere
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    if block is SelfAttentionBlock:
        twin = torch_encoder_layer(ours, config).eval()
        assert (ours(x)[0] - twin(x)).abs().max() <= 1e-5
    else:
        twin = torch_decoder_layer(ours, config).eval()
        causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # torch.nn: True = hidden
        y = ours(x, memory)[0]
        assert (y - twin(x, memory, tgt_mask=causal, tgt_is_causal=True)).abs().max() <= 1e-5


def test_torch_twins_refuse_what_torch_has_not():
    config = BlockConfig(d_model=16, n_heads=2, d_ff=32, norm="rms")
    with pytest.raises(ValueError, match="no norm other than 'layer', got norm='rms'"):
        torch_encoder_layer(SelfAttentionBlock(config), config)
