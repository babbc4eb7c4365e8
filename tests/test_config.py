"""Every config validates at construction and says what is wrong in its own field names."""

from dataclasses import fields, replace

import pytest
import torch

from tfbook.attention import MultiHeadAttention
from tfbook.blocks import (
    BLOCK_FIELDS,
    BlockConfig,
    CrossAttentionBlock,
    SelfAttentionBlock,
    block_config_of,
)
from tfbook.feedforward import gelu_tanh
from tfbook.models.bert import BertConfig
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.transformer import TransformerConfig
from tfbook.normalization import LayerNorm
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
    (GPTConfig, {"ffn": "moe_"}, r"GPTConfig: ffn must be one of \('mlp', 'swiglu', 'moe'\)"),
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
    # the kernels: attention by name, LayerNorm and activation by their own switches
    (GPTConfig, {"attention": "fused"}, r"GPTConfig: attention must be one of \('reference', "
                                        r"'torch', 'flash'\), got 'fused'"),
    (BertConfig, {"attention": None}, r"BertConfig: attention must be one of .*got None"),
    (TransformerConfig, {"attention": "sdpa"}, r"TransformerConfig: attention must be one of"),
    (BlockConfig, {"attention": "eager"}, r"BlockConfig: attention must be one of"),
    (GPTConfig, {"fused_norm": "yes"}, r"GPTConfig: fused_norm must be True or False, got 'yes'"),
    (BertConfig, {"fused_activation": 1}, r"BertConfig: fused_activation must be True or False"),
    (TransformerConfig, {"norm_first": None}, r"TransformerConfig: norm_first must be True or"),
    (BlockConfig, {"bias": "no"}, r"BlockConfig: bias must be True or False, got 'no'"),
    (GPTConfig, {"rope_convention": "split"}, r"GPTConfig: rope_convention must be one of"),
    (GPTConfig, {"norm_eps": "1e-5"}, r"GPTConfig: norm_eps must be > 0, got '1e-5'"),
    (BertConfig, {"d_model": 30}, r"BertConfig: d_model=30 is not divisible by n_heads=12"),
    (TransformerConfig, {"d_ff": -1}, r"TransformerConfig: d_ff must be a positive int, got -1"),
    # the family settings: QK-norm (Qwen3) and the sliding window (Mistral)
    (GPTConfig, {"sliding_window": 0}, r"GPTConfig: sliding_window counts the positions a "
                                       r"query sees \(itself included\).*got 0"),
    (BlockConfig, {"sliding_window": 2.0}, r"BlockConfig: sliding_window .*got 2.0"),
    (GPTConfig, {"qk_norm": 1}, r"GPTConfig: qk_norm must be True or False, got 1"),
    # multi-head latent attention (DeepSeek-V2/V3): more in test_mla_model
    (GPTConfig, {"kv_lora_rank": 64}, r"GPTConfig: multi-head latent attention "
                                      r"\(kv_lora_rank=64\) .*needs position='rope'"),
    (BlockConfig, {"kv_lora_rank": 64, "rope_base": 1e4, "attention": "flash"},
     r"BlockConfig: attention must be one of \('reference', 'torch'\) for multi-head latent"),
    (BlockConfig, {"kv_lora_rank": 600, "rope_base": 1e4}, r"BlockConfig: kv_lora_rank=600 is "
                                                           r"larger than the width d_model=512"),
]


@pytest.mark.parametrize("config,changes,message", BAD)
def test_bad_configs_are_refused_in_their_own_words(config, changes, message):
    with pytest.raises(ValueError, match=message):
        config(**changes)


def test_bad_attention_arguments():
    with pytest.raises(ValueError, match="MultiHeadAttention: n_heads must be a positive int, "
                                         "got 0"):
        MultiHeadAttention(32, 0)
    with pytest.raises(ValueError, match=r"MultiHeadAttention: dropout must lie in \[0, 1\], "
                                         r"got 1.5"):
        MultiHeadAttention(32, 4, dropout=1.5)
    with pytest.raises(ValueError, match="MultiHeadAttention: n_heads=4 is not a multiple of "
                                         "n_kv_heads=3"):
        MultiHeadAttention(32, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="MultiHeadAttention: RoPE needs rope_base > 1 and an "
                                         "even head size, got rope_base=10000.0 and head size 5"):
        MultiHeadAttention(20, 4, rope_base=10000.0)
    with pytest.raises(ValueError, match="MultiHeadAttention: rope_precision must be one of"):
        MultiHeadAttention(32, 4, rope_base=10000.0, rope_precision="float16")
    with pytest.raises(TypeError, match="positional"):  # the settings are keyword-only
        MultiHeadAttention(32, 4, 0.1, True)
    mha = MultiHeadAttention(32, 4)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 32\), got \(5, 32\)"):
        mha(torch.randn(5, 32))
    with pytest.raises(ValueError, match=r"expected source of shape \(2, S, 32\).*\(3, 4, 32\)"):
        mha(torch.randn(2, 5, 32), torch.randn(3, 4, 32))


SHARED = sorted(set(BLOCK_FIELDS) & {f.name for f in fields(GPTConfig)})
OTHER_VALUE = {"d_model": 96, "n_heads": 16, "d_ff": 100, "dropout": 0.25, "activation": "relu",
               "norm_eps": 1e-3, "bias": False, "attention": "reference", "fused_norm": False,
               "fused_activation": False, "norm": "rms", "ffn": "swiglu", "n_kv_heads": 4,
               "rope_base": 500.0, "rope_convention": "half", "rope_precision": "float32",
               "qk_norm": True, "sliding_window": 8, "n_experts": 4, "top_k": 1,
               "routing": "selected", "rope_scaling": {"rope_type": "linear", "factor": 2.0},
               "head_dim": 8, "kv_lora_rank": 32, "q_lora_rank": 32,
               "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
               "mla_absorbed": True, "n_expert_groups": 2, "top_groups": 2,
               "n_shared_experts": 1, "routed_scaling": 2.5}


@pytest.mark.parametrize("field", SHARED)
def test_every_shared_field_reaches_the_block(field):
    """block_config_of copies each field GPTConfig shares with BlockConfig, none by hand."""
    base = replace(GPTConfig.tiny(), position="rope")
    changed = replace(base, **{field: OTHER_VALUE[field]})
    assert getattr(changed.block_config(), field) == OTHER_VALUE[field]
    assert getattr(base.block_config(), field) != OTHER_VALUE[field]


def test_the_model_decides_its_own_block_settings():
    gpt = GPTConfig.tiny()
    assert gpt.block_config().norm_first and gpt.block_config().d_ff == 4 * gpt.d_model
    assert gpt.block_config().rope_base is None  # learned positions: no rotation
    assert replace(gpt, position="rope").block_config().rope_base == gpt.rope_base
    bert = BertConfig.tiny()
    assert not bert.block_config().norm_first and bert.block_config().activation == "gelu"
    assert TransformerConfig.tiny().block_config().norm_first is False
    with pytest.raises(TypeError, match=r"block settings must be BlockConfig fields .*"
                                        r"got \['pre_norm'\]"):
        block_config_of(gpt, pre_norm=True)


def test_the_kernels_reach_every_module():
    config = replace(GPTConfig.tiny(), attention="reference", fused_norm=False,
                     fused_activation=False)
    model = GPT(config)
    assert all(block.attn.attention == "reference" for block in model.blocks)
    assert not any(m.fused for m in model.modules() if isinstance(m, LayerNorm))
    assert model.blocks[0].ff.act is gelu_tanh  # our code, not F.gelu
    fast = GPT(GPTConfig.tiny())
    assert all(block.attn.attention == "torch" for block in fast.blocks)
    assert all(m.fused for m in fast.modules() if isinstance(m, LayerNorm))


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
