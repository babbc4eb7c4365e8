"""Packed weights for decoding (tfbook.packing): the same model, fewer and larger products.

Packing changes no parameter's name, shape or value and no output beyond float rounding
(float64 models: within 1e-12 of the unpacked model's logits, the same greedy tokens); the
packed product is used only while it is valid (no gradients, the same layers, the same
storage) and the plain path takes over otherwise, with the same result.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tfbook.generate.search import generate
from tfbook.lora import add_lora
from tfbook.models.bert import BertConfig, BertForMaskedLM
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.models.transformer import Transformer, TransformerConfig
from tfbook.packing import PackedLinear, column_major, pack_for_decoding
from tfbook.quantize import Int8Linear, int8_matmul, int8_per_channel, quantise_linears

CONFIGS = {"gpt2": GPTConfig.tiny(), "llama": tiny_llama()}


def float64_pair(config, seed=0):
    torch.manual_seed(seed)
    plain = GPT(config).double().eval()
    return plain, pack_for_decoding(copy.deepcopy(plain))


class LinearCalls:
    """Counts F.linear calls (what packing reduces)."""

    def __enter__(self):
        self.calls, self.original = 0, F.linear

        def counting(*args, **kwargs):
            self.calls += 1
            return self.original(*args, **kwargs)

        F.linear = counting
        return self

    def __exit__(self, *exc):
        F.linear = self.original


@pytest.mark.parametrize("name", CONFIGS)
def test_packed_model_equals_the_plain_one(name):
    plain, packed = float64_pair(CONFIGS[name])
    x = torch.randint(0, plain.config.vocab_size, (3, 11))
    with torch.no_grad():
        a, b = plain(x).logits, packed(x).logits
    assert (a - b).abs().max() <= 1e-12 * a.abs().max()
    # names, shapes and values of every parameter unchanged; the tied head still tied
    before, after = plain.state_dict(), packed.state_dict()
    assert list(before) == list(after)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert packed.lm_head.weight is packed.tok_emb.weight
    assert packed.lm_head.weight.stride() == (1, plain.config.vocab_size)  # column by column


@pytest.mark.parametrize("name", CONFIGS)
def test_packed_greedy_and_cached_decoding_give_the_same_tokens(name):
    plain, packed = float64_pair(CONFIGS[name], seed=1)
    prompt = torch.randint(0, plain.config.vocab_size, (2, 5))
    a = generate(plain, prompt, 20).tokens
    b = generate(packed, prompt, 20).tokens
    assert torch.equal(a, b)


def test_fewer_products_per_block():
    plain, packed = float64_pair(tiny_llama())
    x = torch.randint(0, 100, (1, 4))
    counts = []
    for model in (plain, packed):
        with torch.no_grad(), LinearCalls() as calls:
            model(x)
        counts.append(calls.calls)
    n = plain.config.n_layers
    assert counts == [7 * n + 1, 4 * n + 1]  # q, k, v, o, gate, up, down -> qkv, o, gate|up, down


def test_gradients_take_the_plain_path_and_training_keeps_the_packing():
    plain, packed = float64_pair(tiny_llama(), seed=2)
    x = torch.randint(0, 100, (2, 9))
    for model in (plain, packed):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(x[:, :-1], targets=x[:, 1:]).loss
        loss.backward()
        opt.step()
    for p, q in zip(plain.parameters(), packed.parameters(), strict=True):
        assert (p - q).abs().max() <= 1e-12 * max(1.0, p.abs().max())
    attn = packed.blocks[0].attn
    with torch.no_grad():
        assert attn.packed_qkv.usable()  # SGD updated the views in place
        a, b = plain(x).logits, packed(x).logits
    assert (a - b).abs().max() <= 1e-12 * a.abs().max()
    assert not attn.packed_qkv.usable()  # gradients on: the separate products


def test_stale_packing_falls_back_to_the_plain_products():
    plain, packed = float64_pair(tiny_llama(), seed=3)
    x = torch.randint(0, 100, (1, 6))
    with torch.no_grad():
        ref = plain(x).logits
        clone = copy.deepcopy(packed)  # new storage: its packing no longer holds
        assert not clone.blocks[0].attn.packed_qkv.usable()
        assert (clone(x).logits - ref).abs().max() <= 1e-12 * ref.abs().max()
        packed.blocks[0].attn.q_proj.weight.mul_(2.0)  # in place: the packed matrix follows
        plain.blocks[0].attn.q_proj.weight.mul_(2.0)
        ref = plain(x).logits
        assert packed.blocks[0].attn.packed_qkv.usable()
        assert (packed(x).logits - ref).abs().max() <= 1e-12 * ref.abs().max()
        packed.blocks[1].ff.fc_gate.weight = nn.Parameter(plain.blocks[1].ff.fc_gate.weight * 3)
        plain.blocks[1].ff.fc_gate.weight.mul_(3.0)
        assert not packed.blocks[1].ff.packed_gate_in.usable()  # a new parameter
        ref = plain(x).logits
        assert (packed(x).logits - ref).abs().max() <= 1e-12 * ref.abs().max()
        single = packed.float()  # new tensors in every layer
        assert not any(m.packed_qkv.usable() for m in (b.attn for b in single.blocks))
        assert (single(x).logits.double() - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_lora_after_packing_is_not_bypassed():
    torch.manual_seed(4)
    model = pack_for_decoding(GPT(tiny_llama()).eval())
    x = torch.randint(0, 100, (1, 6))
    with torch.no_grad():
        before = model(x).logits
        add_lora(model, r=2)
        for layer in model.modules():
            if hasattr(layer, "lora_B"):
                nn.init.normal_(layer.lora_B)  # a non-zero update
        assert not model.blocks[0].attn.packed_qkv.usable()
        assert not torch.allclose(model(x).logits, before)
        again = pack_for_decoding(model)  # LoRA-wrapped projections are left unpacked
        assert torch.equal(again(x).logits, model(x).logits)


def test_encoders_and_cross_attention_pack_too():
    torch.manual_seed(5)
    bert = BertForMaskedLM(BertConfig.tiny()).double().eval()
    x = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        ref = bert(x).logits
        packed = pack_for_decoding(bert)(x).logits
    assert (ref - packed).abs().max() <= 1e-12 * ref.abs().max()
    seq2seq = Transformer(TransformerConfig.tiny()).double().eval()
    src, tgt = torch.randint(0, 50, (2, 9)), torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        ref = seq2seq(src, tgt).logits
        out = pack_for_decoding(seq2seq)(src, tgt).logits
    assert (ref - out).abs().max() <= 1e-12 * ref.abs().max()


def test_int8_layers_read_their_codes_and_pack_exactly():
    """Int8Linear is int8_matmul on int8_per_channel's codes; packing int8 layers changes no
    bit of the output (the integer sums are exact, and x is rounded once with the same rule)."""
    torch.manual_seed(7)
    linear = nn.Linear(32, 20)
    x = torch.randn(3, 4, 32)
    q, scale = int8_per_channel(linear.weight.detach())
    want = int8_matmul(x.reshape(12, 32), q, scale) + linear.bias.detach()
    assert torch.equal(Int8Linear(linear)(x), want.view(3, 4, 20))
    model = quantise_linears(GPT(tiny_llama()).eval())
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.lm_head.codes.dtype == torch.int8 and model.tok_emb.weight.dtype == torch.float32
    prompt = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        before = model(prompt).logits
        pack_for_decoding(model)
        assert model.blocks[0].attn.packed_qkv.int8
        assert model.blocks[0].ff.packed_gate_in.usable()
        assert torch.equal(model(prompt).logits, before)
    assert torch.equal(generate(model, prompt, 8).tokens,
                       generate(copy.deepcopy(model), prompt, 8).tokens)  # copy: unpacked path


def test_packed_linear_splits_one_product():
    torch.manual_seed(6)
    owner = nn.Module()
    owner.a, owner.b = nn.Linear(5, 3).double(), nn.Linear(5, 4).double()
    x = torch.randn(2, 5, dtype=torch.float64)
    with torch.no_grad():
        ref = owner.a(x), owner.b(x)
        pack = PackedLinear(owner, ("a", "b"))
        assert pack.column and pack.weight.shape == (7, 5) and pack.weight.stride() == (1, 7)
        assert owner.a.weight.data_ptr() == pack.weight.data_ptr()  # a view, not a copy
        for got, want in zip(pack(x), ref, strict=True):
            assert (got - want).abs().max() <= 1e-14
    assert torch.equal(column_major(ref[0]), ref[0])


def test_bad_input_is_refused_clearly():
    with pytest.raises(TypeError, match="pack_for_decoding needs an nn.Module, got str"):
        pack_for_decoding("model")
    owner = nn.Module()
    owner.a, owner.b, owner.c = nn.Linear(5, 3), nn.Linear(6, 3), nn.Linear(5, 3, bias=False)
    with pytest.raises(TypeError, match=r"packs nn.Linear layers \(or Int8Linear ones\), got"):
        PackedLinear(owner, ("a", "missing"))
    with pytest.raises(TypeError, match="PackedLinear packs nn.Linear layers"):
        PackedLinear(owner, ())
    owner.d = Int8Linear(nn.Linear(5, 3))
    with pytest.raises(TypeError, match=r"got \['Linear', 'Int8Linear'\]"):
        PackedLinear(owner, ("a", "d"))  # not a mix
    with pytest.raises(TypeError, match="Int8Linear is built from an nn.Linear, got Int8Linear"):
        Int8Linear(owner.d)
    with pytest.raises(ValueError, match=r"expected x \(..., 5\), got \(2, 4\)"):
        owner.d(torch.zeros(2, 4))
    with pytest.raises(TypeError, match="quantise_linears needs an nn.Module, got list"):
        quantise_linears([])
    with pytest.raises(ValueError, match="same input width"):
        PackedLinear(owner, ("a", "b"))
    with pytest.raises(ValueError, match="all have biases or none"):
        PackedLinear(owner, ("a", "c"))
