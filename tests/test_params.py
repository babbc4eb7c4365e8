"""Parameter counts agree with the papers and with Hugging Face's implementations.

Big models are built on the `meta` device: shapes without memory, so this takes a second.
"""

import torch
import transformers

from tfbook.models.bert import Bert, BertConfig
from tfbook.models.gpt import GPTConfig, gpt_on_meta
from tfbook.models.params import count_parameters
from tfbook.models.transformer import Transformer, TransformerConfig


def hf_count(model_class, config) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in model_class(config).parameters())


def test_gpt2_124m():
    ours = count_parameters(gpt_on_meta(GPTConfig.gpt2_124m()))
    assert ours == 124_439_808
    assert ours == hf_count(transformers.GPT2Model, transformers.GPT2Config())


def test_bert_base_with_pooler():
    with torch.device("meta"):
        ours = count_parameters(Bert(BertConfig.bert_base()))
    assert ours == 109_482_240
    assert ours == hf_count(transformers.BertModel, transformers.BertConfig())


def test_transformer_base_shared_embeddings():
    # Vaswani et al. Table 3 reports 65M for the base model; with a 37k shared vocab:
    with torch.device("meta"):
        n = count_parameters(Transformer(TransformerConfig.base()))
    per_encoder = 4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 2 * 2 * 512
    per_decoder = per_encoder + 4 * (512 * 512 + 512) + 2 * 512
    expected = 37000 * 512 + 6 * per_encoder + 6 * per_decoder + 2 * 2 * 512
    assert n == expected
    assert round(n / 1e6) == 63  # ~65M in the paper, which does not say its vocab exactly
