"""Every diagram of the book, drawn as its chapter draws it (same calls, same sizes; models
with random weights where only shapes matter), for the layout tests and to look at.

    figures()                  # [(page, name, Diagram), ...] in the book's order
    python -m tests.diagram_gallery OUT.html   # one page with all of them and the book's CSS

The speculative-decoding and Q4_1 figures belong to their chapters' helpers and are left out.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from tfbook.diagrams import Diagram

ROOT = Path(__file__).resolve().parents[1]
Figure = tuple[str, str, Callable[[], Diagram]]


@functools.cache
def gpt2():
    from tfbook.tokenizers import load_gpt2

    return load_gpt2()


def _intro() -> list[Figure]:
    from tfbook.diagrams import decoder_stack, families, masks, trace
    from tfbook.masks import causal_mask
    from tfbook.models.bert import Bert, BertConfig
    from tfbook.models.gpt import GPT, GPTConfig
    from tfbook.models.transformer import Transformer, TransformerConfig

    sentence = "The cat sat on the mat because it was warm."
    tok = gpt2()
    ids = torch.tensor([tok.encode(sentence)])
    tokens = [tok.decode([i]) for i in ids[0].tolist()]
    T = ids.size(1)
    sizes = dict(n_heads=4, d_model=64, d_ff=256)
    V = tok.vocab_size

    def fam() -> Diagram:
        torch.manual_seed(0)
        enc = Bert(BertConfig(vocab_size=V, max_len=64, n_layers=2, **sizes)).eval()
        dec = GPT(replace(GPTConfig.tiny(), vocab_size=V)).eval()
        ed = Transformer(TransformerConfig(src_vocab_size=V, tgt_vocab_size=V, max_len=64,
                                           n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                                           **sizes)).eval()
        return families(trace(enc, ids), trace(dec, ids), trace(ed, ids, ids))

    def stack() -> Diagram:
        torch.manual_seed(0)
        dec = GPT(replace(GPTConfig.tiny(), vocab_size=V)).eval()
        return decoder_stack(trace(dec, ids))

    def mask_figure() -> Diagram:
        return masks([("encoder: all pairs", torch.ones(T, T, dtype=torch.bool)),
                      ("decoder: causal", causal_mask(T))], tokens=tokens,
                     title="encoder and decoder masks", self_attention=True)

    return [("intro", "families", fam), ("intro", "decoder stack", stack),
            ("intro", "encoder and decoder masks", mask_figure)]


def _text() -> list[Figure]:
    from tfbook.corpus import stress_lines
    from tfbook.diagrams.inputs import embedding_lookup
    from tfbook.diagrams.positions import rope_planes
    from tfbook.diagrams.text import merge_tree, pipelines_side_by_side
    from tfbook.embeddings import TokenEmbedding
    from tfbook.tokenizers import load_minilm_wordpiece

    def pipelines() -> Diagram:
        return pipelines_side_by_side([("BERT's WordPiece (uncased)", load_minilm_wordpiece()),
                                       ("GPT-2's byte-level BPE", gpt2())], stress_lines()[0])

    def tree() -> Diagram:  # a small BPE of its own, as the chapter trains one
        from tfbook.tokenizers.bpe import BPETokenizer

        text = " encoding encoded decoding coding code encode " * 20 + " ending in g"
        return merge_tree(BPETokenizer.train(text, 290), " encoding")

    def lookup() -> Diagram:
        tok = gpt2()
        ids = tok.encode("The cat sat on the mat because the mat was warm.")
        torch.manual_seed(0)
        return embedding_lookup(TokenEmbedding(tok.vocab_size, 64), torch.tensor([ids]),
                                [tok.decode([i]) for i in ids])

    def rope() -> Diagram:
        return rope_planes(16, (0, 1, 2, 5, 30), (0, 1, 7), relative=(5, 2))

    return [("text/tokenization", "pipelines", pipelines), ("text/bpe", "merge tree", tree),
            ("text/embeddings", "one-hot lookup", lookup), ("text/rope", "RoPE planes", rope)]


def _attention() -> list[Figure]:
    from tfbook.attention import MultiHeadAttention
    from tfbook.diagrams import (
        attention_backward_graph,
        attention_path,
        cross_attention,
        head_split,
        masks,
        trace,
        trace_attention,
        trace_attention_backward,
    )
    from tfbook.masks import causal_mask, combine_masks, padding_mask

    def path() -> Diagram:
        torch.manual_seed(0)
        T, C, D = 6, 16, 8
        x = torch.randn(T, C)
        w = tuple(torch.randn(C, D) / math.sqrt(C) for _ in range(3))
        q, k, v = (x @ m for m in w)
        return attention_path(trace_attention(q, k, v, x=x, projections=w))

    def split() -> Diagram:
        torch.manual_seed(0)
        mha = MultiHeadAttention(16, 4)
        return head_split(trace(mha, torch.randn(2, 5, 16)), "")

    def mask_figure() -> Diagram:
        S = 5
        left_pad = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
        both = combine_masks(causal_mask(S), padding_mask(left_pad))
        return masks([("causal", causal_mask(S)), ("padding", padding_mask(left_pad), 1),
                      ("causal AND padding", both, 1)],
                     title="which keys each query of a left-padded sentence (2 pads) may read")

    def cross() -> Diagram:
        torch.manual_seed(0)
        mha = MultiHeadAttention(16, 4)
        x, memory = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
        return cross_attention(trace(mha, x, source=memory).attention(""))

    def backward() -> Diagram:
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (5, 7, 7))
        return attention_backward_graph(trace_attention_backward(q, k, v))

    return [("attention/self_attention", "attention path", path),
            ("attention/multi_head_attention", "head split", split),
            ("attention/masks_and_cross_attention", "combined masks", mask_figure),
            ("attention/masks_and_cross_attention", "cross-attention", cross),
            ("attention/attention_backprop", "backward graph", backward)]


def _architectures() -> list[Figure]:
    from tfbook.blocks import BlockConfig, CrossAttentionBlock, SelfAttentionBlock
    from tfbook.diagrams import (
        block,
        blocks_side_by_side,
        decoder_stack,
        encoder_decoder,
        ffns_side_by_side,
        trace,
    )
    from tfbook.diagrams.inputs import bert_input
    from tfbook.models.gpt import GPT, GPTConfig
    from tfbook.models.transformer import Transformer, TransformerConfig

    B, T, C, H = 2, 5, 16, 4

    def blocks() -> Diagram:
        torch.manual_seed(0)
        pre, post = (SelfAttentionBlock(BlockConfig(d_model=C, n_heads=H, d_ff=4 * C,
                                                    dropout=0.0, norm_first=f)).eval()
                     for f in (True, False))
        x = torch.randn(B, T, C)
        return blocks_side_by_side((trace(pre, x), ""), (trace(post, x), ""))

    def ffns() -> Diagram:
        torch.manual_seed(0)
        cfg = BlockConfig(d_model=C, n_heads=H, d_ff=4 * C, dropout=0.0, norm_first=True,
                          activation="gelu")
        mlp = SelfAttentionBlock(cfg).eval()
        sw = SelfAttentionBlock(replace(cfg, ffn="swiglu", activation="silu")).eval()
        x = torch.randn(B, T, C)
        return ffns_side_by_side((trace(mlp, x), "ff"), (trace(sw, x), "ff"))

    def gpt() -> Diagram:
        torch.manual_seed(0)
        model = GPT(GPTConfig.tiny()).eval()
        ids = torch.tensor([list(b"The cat sat on the mat.")])
        inputs, targets = ids[:, :-1], ids[:, 1:]
        return decoder_stack(trace(model, inputs, targets),
                             inputs=[chr(i) for i in inputs[0].tolist()],
                             targets=[chr(i) for i in targets[0].tolist()])

    def bert() -> Diagram:
        from tfbook.checkpoints.minilm import load_minilm
        from tfbook.tokenizers import load_minilm_wordpiece

        tok = load_minilm_wordpiece()
        first = tok.encode("the cat sat on the mat", add_special_tokens=True)
        second = tok.encode("it was warm") + [tok.token_to_id("[SEP]")]
        ids = torch.tensor([first + second])
        types = torch.tensor([[0] * len(first) + [1] * len(second)])
        return bert_input(load_minilm(), ids, types,
                          [tok.id_to_token(i) for i in ids[0].tolist()])

    def dec_block() -> Diagram:
        torch.manual_seed(0)
        m = CrossAttentionBlock(TransformerConfig.tiny().block_config()).eval()
        return block(trace(m, torch.randn(2, 5, 32), torch.randn(2, 7, 32)), "")

    def encdec() -> Diagram:
        torch.manual_seed(0)
        model = Transformer(TransformerConfig.tiny()).eval()
        V = model.config.tgt_vocab_size
        return encoder_decoder(trace(model, torch.randint(0, V, (2, 7)),
                                     torch.randint(0, V, (2, 5))))

    return [("architectures/transformer_block", "pre-LN and post-LN", blocks),
            ("architectures/transformer_block", "MLP and SwiGLU", ffns),
            ("architectures/gpt", "GPT with targets", gpt),
            ("architectures/encoder_bert", "BERT input", bert),
            ("architectures/decoder_seq2seq", "decoder block", dec_block),
            ("architectures/decoder_seq2seq", "encoder-decoder", encdec)]


def _generation() -> list[Figure]:
    from tfbook.diagrams import head_split, trace
    from tfbook.diagrams.generation import kv_cache
    from tfbook.models.gpt import GPT
    from tfbook.models.llama import smollm2_135m, tiny_llama

    def cache() -> Diagram:
        torch.manual_seed(1)
        return kv_cache(GPT(tiny_llama()).eval(), torch.tensor([list(b"Hello ")]))

    def gqa() -> Diagram:
        torch.manual_seed(0)
        smol = replace(smollm2_135m(), n_layers=1, vocab_size=256)
        return head_split(trace(GPT(smol).eval(), torch.randint(0, 256, (1, 6))),
                          "blocks.0.attn")

    return [("generation/kv_cache", "KV cache", cache),
            ("generation/modern_decoder", "GQA head split", gqa)]


def _families() -> list[Figure]:
    from tfbook.attention import MultiHeadAttention
    from tfbook.diagrams.families import (
        mla_figure,
        moe_figure,
        qk_norm_figure,
        rope_scaling_figure,
        sliding_window_figure,
    )
    from tfbook.mla import MultiHeadLatentAttention
    from tfbook.moe import MoEFeedForward

    page = "generation/model_families"

    def window() -> Diagram:
        return sliding_window_figure(8, 3)

    def qk_norm() -> Diagram:
        torch.manual_seed(0)
        attn = MultiHeadAttention(32, 4, n_kv_heads=2, bias=False, rope_base=10000.0,
                                  qk_norm=True).eval()
        return qk_norm_figure(attn, torch.randn(1, 5, 32))

    def moe() -> Diagram:
        tok = gpt2()
        ids = tok.encode("The cat sat on the mat.")
        torch.manual_seed(0)
        emb = torch.nn.Embedding(tok.vocab_size, 32)
        layer = MoEFeedForward(32, 64, n_experts=8, top_k=2).eval()
        with torch.no_grad():
            x = emb(torch.tensor([ids]))
        return moe_figure(layer, x, [tok.decode([i]) for i in ids])

    def mla() -> Diagram:
        torch.manual_seed(0)
        layer = MultiHeadLatentAttention(64, 4, kv_lora_rank=16, qk_nope_head_dim=16,
                                         qk_rope_head_dim=8, v_head_dim=16).eval()
        return mla_figure(layer, torch.randn(1, 6, 64), n_kv_heads=2)

    def rope_scaling() -> Diagram:
        L = {"original_max_position_embeddings": 8192}
        return rope_scaling_figure(64, 500000.0, {
            "linear ×8": {"rope_type": "linear", "factor": 8.0},
            "YaRN ×8": {"rope_type": "yarn", "factor": 8.0, **L},
            "Llama 3 ×8": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, **L}})

    return [(page, "sliding window", window), (page, "QK-norm", qk_norm),
            (page, "mixture of experts", moe), (page, "latent attention", mla),
            (page, "RoPE scaling", rope_scaling)]


def _fast() -> list[Figure]:
    from tfbook.diagrams import TileCall, flash_tiles, running_softmax
    from tfbook.flash import online_softmax_steps

    def tiles() -> Diagram:
        return flash_tiles([TileCall(192, 192, 32, 32, computed=21),
                            TileCall(64, 192, 32, 32, computed=11)])

    def running() -> Diagram:
        torch.manual_seed(0)
        q, k = torch.randn(3, 16, dtype=torch.float64), torch.randn(128, 16, dtype=torch.float64)
        return running_softmax(list(online_softmax_steps(q @ k.T / 4.0, block=16)))

    return [("fast/flash_attention", "flash tiles", tiles),
            ("fast/flash_attention", "running softmax", running)]


def _learning() -> list[Figure]:
    from tfbook.diagrams.learning import (
        data_parallel,
        lora_layer,
        model_parallel,
        ring_steps,
        training_loop,
    )
    from tfbook.lora import LoRALinear
    from tfbook.models.gpt import GPT, GPTConfig, gpt_on_meta
    from tfbook.train.corpus_lm import gpt_config, train_config

    def loop() -> Diagram:
        torch.manual_seed(0)
        model = GPT(gpt_config(2048))
        x = torch.randint(0, 2048, (16, 64))
        recipe = train_config(3000)
        return training_loop(model, (x, torch.roll(x, -1, 1)), recipe, step=recipe.warmup)

    cfg = replace(GPTConfig.tiny(), d_model=128)

    def data() -> Diagram:
        batch = (torch.zeros(16, 64, dtype=torch.long), torch.zeros(16, 64, dtype=torch.long))
        return data_parallel(gpt_on_meta(cfg), batch, world_size=2)

    def ring() -> Diagram:
        return ring_steps(4)

    def split() -> Diagram:
        return model_parallel(gpt_on_meta(cfg), ranks=2, micro_batches=4)

    def lora() -> Diagram:
        torch.manual_seed(0)
        layer = LoRALinear(nn.Linear(576, 576, bias=False), r=8, alpha=16)
        return lora_layer(layer, torch.randn(2, 5, 576))

    return [("learning/training", "training loop", loop),
            ("learning/parallelism", "data parallel", data),
            ("learning/parallelism", "ring all-reduce", ring),
            ("learning/parallelism", "tensor and pipeline", split),
            ("learning/lora", "LoRA", lora)]


def _inside() -> list[Figure]:
    from tfbook.diagrams.inspect import hook_point_marks, patching_setup
    from tfbook.models.gpt import GPT
    from tfbook.models.llama import tiny_llama

    @functools.cache
    def model() -> GPT:
        torch.manual_seed(0)
        return GPT(tiny_llama()).eval()

    def marks() -> Diagram:
        return hook_point_marks(model(), 0, torch.randint(0, 256, (1, 12)))

    def patching() -> Diagram:
        clean = ["When", " Mary", " and", " John", " went", " home", ",", " John", " gave",
                 " it", " to"]
        corrupted = [*clean[:1], " John", " and", " Mary", *clean[4:]]
        return patching_setup(model(), clean, corrupted, (" Mary", " John"), layer=0,
                              position=1)

    return [("inside/inside_the_model", "hook points", marks),
            ("inside/inside_the_model", "patching set-up", patching)]


def _posttrain() -> list[Figure]:
    from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer
    from tfbook.diagrams.posttrain import chat_mask_figure, dpo_pair_figure

    def mask() -> Diagram:
        messages = [{"role": "user", "content": "What is 7 times 8?"},
                    {"role": "assistant", "content": "7 times 8 is 56."},
                    {"role": "user", "content": "And plus 4?"},
                    {"role": "assistant", "content": "56 + 4 = 60."}]
        return chat_mask_figure(load_smollm2_tokenizer(), messages, shifted=True)

    def dpo() -> Diagram:
        return dpo_pair_figure(-4.213, -6.801, -4.5, -6.62, beta=0.1, prompt="What is 7 times 8?",
                               chosen="7 times 8 is 56.", rejected="7 times 8 is 54.")

    return [("posttrain/chat_and_sft", "assistant mask", mask),
            ("posttrain/preferences", "DPO pair", dpo)]


def _sharding() -> list[Figure]:
    from tests.test_diagrams_sharding import ddp_runs
    from tfbook.diagrams.sharding import (
        bucket_timeline,
        pipeline_schedules,
        ring_zigzag,
        sharding_memory,
        tensor_split,
    )
    from tfbook.models.gpt import GPT, GPTConfig

    page = "learning/sharding"

    def buckets() -> Diagram:  # a real DDPOverlap step (one rank) with and without overlap
        runs = ddp_runs()
        return bucket_timeline(*runs["on"], *runs["off"])

    def memory() -> Diagram:
        torch.manual_seed(0)
        return sharding_memory(GPT(GPTConfig.tiny()), world_size=4)

    def tensor() -> Diagram:
        return tensor_split(replace(GPTConfig.tiny(), dropout=0.0), 2)

    return [(page, "DDP buckets", buckets), (page, "memory per rank", memory),
            (page, "tensor split", tensor),
            (page, "pipeline schedules", lambda: pipeline_schedules(4, 6)),
            (page, "ring zig-zag", lambda: ring_zigzag(4))]


def figures() -> list[Figure]:
    """(page, name, a function drawing it) of every diagram, in the book's order."""
    return _intro() + _text() + _attention() + _architectures() + _generation() \
        + _families() + _fast() + _learning() + _sharding() + _inside() + _posttrain()


def page(drawn: list[tuple[str, str, Diagram]]) -> str:
    """One HTML page: every diagram in a column as wide as the book's, with the book's CSS."""
    css = (ROOT / "book" / "_static" / "tfbook.css").read_text()
    body = "".join(f'<section data-page="{p}" data-name="{n}"><h3>{p}: {n}</h3>'
                   f"{d._repr_html_()}</section>" for p, n, d in drawn)
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{css}\nbody{{margin:0;font-family:sans-serif}}"
            "main{max-width:672px;margin:0 auto;padding:0 16px}"
            "h3{font-size:14px;margin:24px 0 4px}</style></head>"
            f"<body><main>{body}</main></body></html>")


if __name__ == "__main__":
    only = sys.argv[2:]
    drawn = [(p, n, f()) for p, n, f in figures() if not only or n in only]
    Path(sys.argv[1]).write_text(page(drawn))
    print(f"{len(drawn)} diagrams -> {sys.argv[1]}")
