"""tfbook.lora against its formula and against the `peft` library (Hu et al. 2022).

Tiny models check the logic in milliseconds: the adapted model equals the base model before
training, merged equals unmerged after training, merging leaves other models that share the
weights alone (peft's in-place merge does not), and peft wrapping the same tfbook model gives
bit-equal outputs. The real SmolLM2-135M checks tfbook's LoRA against peft on Hugging Face's
LlamaForCausalLM built from the same GGUF: with the same A and B, logits, loss and the
gradients of every A and B are bit-equal, and the trainable counts agree.
"""

import math

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from tests.pinned_threads import pinned_threads
from tfbook.checkpoints.smollm2 import hf_llama_from_gguf, load_smollm2, read_smollm2_gguf
from tfbook.lora import (
    ATTENTION_LINEARS,
    FFN_LINEARS,
    LoRALinear,
    add_lora,
    lora_layers,
    lora_size,
    merge_lora,
    trainable_parameters,
)
from tfbook.losses import cross_entropy
from tfbook.models.gpt import GPT
from tfbook.models.llama import tiny_llama
from tfbook.models.params import count_parameters
from tfbook.train.loop import TrainConfig, train

ALL_LINEARS = ATTENTION_LINEARS + FFN_LINEARS  # every linear layer of a Llama-style block


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_llama()).eval()


def sharing_twin(model: GPT) -> GPT:
    """A plain GPT whose parameters ARE the model's tensors (assign=True: nothing copied).

    For an adapted model it is the frozen base model, seen without the LoRA layers.
    """
    state = {name.replace(".base.", "."): t for name, t in model.state_dict().items()
             if "lora_" not in name}
    with torch.device("meta"):
        twin = GPT(model.config)
    twin.load_state_dict(state, assign=True)
    twin.lm_head.weight = twin.tok_emb.weight
    assert twin.tok_emb.weight.data_ptr() == model.tok_emb.weight.data_ptr()
    return twin.eval()


def randomize_lora(model: nn.Module, seed: int = 0, scale: float = 0.05) -> None:
    """Non-zero A and B in every LoRA layer, so the update is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_A.copy_(torch.randn(layer.lora_A.shape, generator=g) * scale)
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * scale)


def ids(shape, vocab=256, seed=1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# --- one layer -----------------------------------------------------------------------------

def test_layer_starts_as_the_base_layer_with_pytorchs_linear_init():
    base = nn.Linear(16, 12)
    torch.manual_seed(3)
    layer = LoRALinear(base, r=4, alpha=8)
    torch.manual_seed(3)
    reference = nn.Linear(16, 4, bias=False)  # A starts as a linear layer C_in -> r would
    assert layer.lora_A.shape == (4, 16) and layer.lora_B.shape == (12, 4)
    assert torch.equal(layer.lora_A, reference.weight)
    assert torch.count_nonzero(layer.lora_B) == 0
    x = torch.randn(2, 5, 16)
    assert torch.equal(layer(x), base(x))
    assert not base.weight.requires_grad and not base.bias.requires_grad
    assert layer.lora_A.requires_grad and layer.lora_B.requires_grad


def test_layer_computes_the_low_rank_update():
    base = nn.Linear(16, 12)
    layer = LoRALinear(base, r=4, alpha=6)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(2, 5, 16)
    W, b, A, B = base.weight, base.bias, layer.lora_A, layer.lora_B
    expected = x @ W.T + b + (6 / 4) * (x @ A.T @ B.T)  # Hu et al., eq. 3
    assert torch.allclose(layer(x), expected, atol=1e-6)
    assert torch.allclose(layer.delta_weight(), 1.5 * B @ A)
    assert torch.linalg.matrix_rank(layer.delta_weight()) <= 4
    assert torch.allclose(layer.merged()(x), expected, atol=1e-6)


def test_layer_dropout_acts_on_the_update_path_in_training_only():
    base = nn.Linear(16, 12)
    layer = LoRALinear(base, r=4, alpha=8, dropout=0.5)
    with torch.no_grad():
        layer.lora_B.normal_()
    plain = LoRALinear(base, r=4, alpha=8)
    with torch.no_grad():
        plain.lora_A.copy_(layer.lora_A)
        plain.lora_B.copy_(layer.lora_B)
    x = torch.randn(2, 5, 16)
    assert torch.equal(layer.eval()(x), plain(x))
    torch.manual_seed(0)
    dropped = layer.train()(x)
    torch.manual_seed(0)
    mask = torch.nn.functional.dropout(torch.ones_like(x), 0.5)  # same draws: keep-and-scale
    assert torch.allclose(dropped, base(x) + 2 * ((x * mask) @ layer.lora_A.T
                                                  @ layer.lora_B.T), atol=1e-6)


# --- a tiny model: the logic -------------------------------------------------------------

def test_adapted_tiny_model_equals_base_and_counts_its_parameters():
    model = tiny_model()
    x = ids((2, 10))
    with torch.no_grad():
        before = model(x).logits
    total = count_parameters(model)
    add_lora(model, targets=ALL_LINEARS, r=4, alpha=8)
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)
    c = model.config
    kv = c.n_kv_heads * c.head_size
    shapes = [(c.d_model, c.d_model), (c.d_model, kv), (c.d_model, kv), (c.d_model, c.d_model),
              (c.d_model, c.d_ff), (c.d_model, c.d_ff), (c.d_ff, c.d_model)]  # (in, out)
    expected = c.n_layers * sum(lora_size(i, o, 4) for i, o in shapes)
    assert trainable_parameters(model) == expected
    assert count_parameters(model) == total + expected
    assert len(lora_layers(model)) == 7 * c.n_layers


def train_tiny(model: nn.Module, steps: int = 5) -> None:
    data = ids((4, 17), seed=5)
    train(model, lambda g: (data[:, :-1], data[:, 1:]),
          TrainConfig(steps=steps, lr=1e-2, weight_decay=0.0), progress=False)
    model.eval()


def test_only_lora_trains_and_merged_equals_unmerged():
    model = tiny_model()
    frozen = {n: p.clone() for n, p in model.named_parameters()}
    add_lora(model, targets=("q_proj", "v_proj", "fc_out"), r=2, alpha=4)
    train_tiny(model)
    for name, p in model.named_parameters():
        if "lora_" in name:
            assert p.requires_grad
        else:
            assert not p.requires_grad
            assert torch.equal(p, frozen[name.replace(".base.", ".")])  # base untouched
    assert all(torch.count_nonzero(layer.lora_B) > 0 for layer in lora_layers(model).values())
    plain = merge_lora(model).eval()
    assert not lora_layers(plain) and isinstance(plain.blocks[0].attn.q_proj, nn.Linear)
    assert all(p.requires_grad for p in plain.parameters())
    assert plain.lm_head.weight is plain.tok_emb.weight  # still tied in the copy
    x = ids((3, 12), seed=7)
    with torch.no_grad():
        merged, unmerged = plain(x).logits, model(x).logits
    assert (merged - unmerged).abs().max() <= 1e-5
    assert not torch.equal(unmerged, tiny_model()(x).logits)  # training changed something


def test_merging_leaves_a_model_that_shares_the_weights_alone():
    model = tiny_model()
    twin = sharing_twin(model)
    x = ids((2, 10))
    with torch.no_grad():
        before = twin(x).logits
    add_lora(model, r=4, alpha=8)
    randomize_lora(model)
    plain = merge_lora(model)
    with torch.no_grad():
        assert torch.equal(twin(x).logits, before)
        assert not torch.equal(plain(x).logits, before)  # the merge did change the copy
    q = plain.blocks[0].attn.q_proj.weight
    assert q.data_ptr() != twin.blocks[0].attn.q_proj.weight.data_ptr()


def test_peft_merges_in_place_and_corrupts_the_twin():
    """The hazard that merge_lora avoids: peft's merge_and_unload writes W += Delta W."""
    model = tiny_model()
    twin = sharing_twin(model)
    x = ids((2, 10))
    with torch.no_grad():
        before = twin(x).logits
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8,
                                                  target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for module in peft_model.modules():
            if hasattr(module, "lora_B") and isinstance(module.lora_B, nn.ModuleDict):
                module.lora_B["default"].weight.normal_(0, 0.05)
    peft_model.merge_and_unload()
    with torch.no_grad():
        assert not torch.equal(twin(x).logits, before)


def test_peft_on_the_same_tiny_model_is_bit_equal():
    ours, theirs = tiny_model(), tiny_model()
    add_lora(ours, r=4, alpha=8)
    peft_model = get_peft_model(theirs, LoraConfig(r=4, lora_alpha=8,
                                                   target_modules=["q_proj", "v_proj"]))
    pairs = copy_into_peft(ours, peft_model, lambda i, p: f"base_model.model.blocks.{i}.attn."
                           f"{p}_proj")
    x = ids((2, 12), seed=2)
    # the same kernels in the same order on both sides, with the threads pinned: bit-equal
    with pinned_threads(2):
        for model in (ours, peft_model):
            model.train()
            cross_entropy(model(x[:, :-1]).logits, x[:, 1:]).backward()
        with torch.no_grad():
            assert torch.equal(ours(x).logits, peft_model(x).logits)
    for mine, peft_param in pairs:
        assert torch.equal(mine.grad, peft_param.grad)
    assert trainable_parameters(ours) == peft_model.get_nb_trainable_parameters()[0]
    assert count_parameters(ours) == peft_model.get_nb_trainable_parameters()[1]


def copy_into_peft(ours: nn.Module, peft_model: nn.Module, peft_name, seed: int = 0):
    """Put the same random non-zero A and B into tfbook's and peft's q and v layers."""
    randomize_lora(ours, seed)
    pairs = []
    with torch.no_grad():
        for i, block in enumerate(ours.blocks):
            for p in "qv":
                mine = getattr(block.attn, f"{p}_proj")
                theirs = peft_model.get_submodule(peft_name(i, p))
                a, b = theirs.lora_A["default"].weight, theirs.lora_B["default"].weight
                a.copy_(mine.lora_A)
                b.copy_(mine.lora_B)
                pairs += [(mine.lora_A, a), (mine.lora_B, b)]
    return pairs


# --- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("r", [0, -1, 2.5, True, "8"])
def test_rank_below_one_or_not_an_int(r):
    with pytest.raises(ValueError, match=r"rank r must be an int >= 1, got"):
        add_lora(tiny_model(), r=r)
    with pytest.raises(ValueError, match=r"rank r must be an int >= 1"):
        LoRALinear(nn.Linear(4, 4), r=r, alpha=1)


@pytest.mark.parametrize("alpha", [0, -2.0, math.nan, math.inf, None])
def test_alpha_not_positive(alpha):
    with pytest.raises(ValueError, match=r"alpha must be a finite number > 0, got"):
        add_lora(tiny_model(), alpha=alpha)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, "0.1"])
def test_dropout_outside_unit_interval(dropout):
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), got"):
        add_lora(tiny_model(), dropout=dropout)


def test_missing_target_lists_the_linear_layers():
    with pytest.raises(ValueError, match=r"no layer named \['query'\]; its linear layers are "
                                         r"named \['fc_gate', 'fc_in', 'fc_out', 'k_proj', "
                                         r"'lm_head', 'out_proj', 'q_proj', 'v_proj'\]"):
        add_lora(tiny_model(), targets=("q_proj", "query"))


@pytest.mark.parametrize("target", ["attn", "norm1", "ff"])
def test_target_that_is_not_linear(target):
    with pytest.raises(TypeError, match=rf"target '{target}' is 'blocks.0.{target}', a \w+, "
                                        r"not an nn.Linear"):
        add_lora(tiny_model(), targets=(target,))


@pytest.mark.parametrize("targets", ["q_proj", (), [1], None])
def test_targets_not_a_list_of_names(targets):
    with pytest.raises(TypeError, match=r"targets must be a non-empty list or tuple"):
        add_lora(tiny_model(), targets=targets)


@pytest.mark.parametrize("r", [33, 10**7])
def test_rank_larger_than_the_layer_is_refused_before_any_allocation(r):
    model = tiny_model()  # d_model 64; v_proj maps 64 -> 2 heads x 16 = 32
    with pytest.raises(ValueError, match=rf"rank r must be at most min\(C_in, C_out\) = 32 for "
                                         rf"'blocks.0.attn.v_proj' \(64 -> 32\), got r={r}"):
        add_lora(model, targets=("v_proj", "q_proj"), r=r)
    assert not lora_layers(model)  # nothing was wrapped, nothing frozen
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match=r"at most min\(C_in, C_out\) = 4 for the layer "
                                         r"\(4 -> 12\), got r=5"):
        LoRALinear(nn.Linear(4, 12), r=5, alpha=1)


def test_the_full_rank_is_allowed():
    layer = LoRALinear(nn.Linear(4, 12), r=4, alpha=1)
    assert layer.lora_A.shape == (4, 4) and layer.lora_B.shape == (12, 4)


def test_a_dotted_path_as_target_says_targets_are_attribute_names():
    with pytest.raises(ValueError, match=r"targets are attribute names such as 'q_proj'.*"
                                         r"'blocks.0.attn.q_proj' is a dotted path"):
        add_lora(tiny_model(), targets=("blocks.0.attn.q_proj",))


def test_applying_twice():
    model = add_lora(tiny_model())
    with pytest.raises(ValueError, match=r"already has LoRA layers \(e.g. blocks.0.attn.q_proj"):
        add_lora(model, targets=("k_proj",))


def test_wrapping_something_else_than_linear():
    with pytest.raises(TypeError, match=r"LoRALinear wraps an nn.Linear, got Embedding"):
        LoRALinear(nn.Embedding(4, 4), r=2, alpha=2)
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got dict"):
        add_lora({})


def test_merging_a_model_without_lora():
    with pytest.raises(ValueError, match=r"GPT has no LoRA layers to merge; add_lora first"):
        merge_lora(tiny_model())


# --- the real SmolLM2-135M against peft on Hugging Face's Llama ------------------------------
#
# What is exact and why. Both sides run the same kernels in the same order: tfbook's model in
# Hugging Face's layout with sdpa attention, the LoRA update added after the base output as
# peft adds it. On one machine, with the thread count pinned, the logits and the gradients of
# every A and B are then bit-equal, under any thread count and any CPU kernel set (pinned here
# to 1 and 2 threads in turn). The two losses are NOT computed the same way: tfbook sums the
# kept tokens' -log p itself, Hugging Face calls F.cross_entropy, so they add the same numbers
# in another order. The loss is compared exactly with tfbook's loss of peft's logits, and with
# Hugging Face's own loss within the rounding bound of a mean of n float32 numbers.

EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def smollm2_models():
    """tfbook's SmolLM2 and peft on HF's Llama, adapted with the same non-zero A and B."""
    ours = load_smollm2(layout="hf")  # HF's rows and RoPE: the same logits as HF's sdpa
    hf = hf_llama_from_gguf(read_smollm2_gguf())
    hf.set_attn_implementation("sdpa")
    x = ids((2, 24), vocab=ours.config.vocab_size, seed=11)
    with pinned_threads(2), torch.no_grad():
        base_logits = ours(x).logits
        add_lora(ours, targets=("q_proj", "v_proj"), r=8, alpha=16)
        zero_update_logits = ours(x).logits
    peft_model = get_peft_model(hf, LoraConfig(r=8, lora_alpha=16,
                                               target_modules=["q_proj", "v_proj"]))
    pairs = copy_into_peft(ours, peft_model, lambda i, p: f"base_model.model.model.layers.{i}."
                           f"self_attn.{p}_proj")
    return dict(ours=ours, peft=peft_model, x=x, base_logits=base_logits,
                zero_update_logits=zero_update_logits, pairs=pairs)


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"{n}-threads")
def smollm2_runs(request, smollm2_models):
    """One forward and backward pass of each library with the thread count pinned."""
    m = smollm2_models
    ours, peft_model, x = m["ours"].train(), m["peft"].train(), m["x"]
    for model in (ours, peft_model):
        model.zero_grad(set_to_none=True)
    with pinned_threads(request.param):
        ours_logits = ours(x).logits
        ours_loss = cross_entropy(ours_logits[:, :-1], x[:, 1:])
        ours_loss.backward()
        out = peft_model(input_ids=x, labels=x)  # HF shifts the labels itself
        out.loss.backward()
        # tfbook's loss of peft's logits: the same function on the same numbers
        ours_loss_of_peft = cross_entropy(out.logits.detach()[:, :-1], x[:, 1:])
        nll = -torch.log_softmax(ours_logits.detach()[:, :-1].double(), -1).gather(
            -1, x[:, 1:, None]).squeeze(-1)  # (B, T - 1), each token's -log p, in float64
    grads = [(mine.grad.clone(), theirs.grad.clone()) for mine, theirs in m["pairs"]]
    return dict(m, threads=request.param, ours_logits=ours_logits.detach(),
                ours_loss=ours_loss.detach(), peft_logits=out.logits.detach(),
                peft_loss=out.loss.detach(), ours_loss_of_peft=ours_loss_of_peft, nll=nll,
                grads=grads)


def test_smollm2_adapted_equals_base_before_training(smollm2_models):
    # B = 0: the update adds exactly zero, on any machine
    assert torch.equal(smollm2_models["zero_update_logits"], smollm2_models["base_logits"])


def test_smollm2_equals_peft_bit_for_bit_with_pinned_threads(smollm2_runs):
    runs = smollm2_runs
    assert not torch.equal(runs["ours_logits"], runs["base_logits"])  # the update is not zero
    assert torch.equal(runs["ours_logits"], runs["peft_logits"])
    assert torch.equal(runs["ours_loss"], runs["ours_loss_of_peft"])
    assert len(runs["grads"]) == 2 * 2 * 30  # A and B of q and v in 30 blocks
    for mine, theirs in runs["grads"]:
        assert torch.count_nonzero(mine) > 0
        assert torch.equal(mine, theirs)


def test_smollm2_loss_equals_hugging_faces_within_the_rounding_of_a_mean(smollm2_runs):
    runs = smollm2_runs
    # two orders of a sum of n terms differ by at most (n - 1) eps sum |x| (two roundings of
    # u = eps / 2 per term), and the division by n adds at most eps |mean|
    bound = EPS32 * (float(runs["nll"].abs().sum()) + float(runs["ours_loss"].abs()))
    assert abs(float(runs["ours_loss"]) - float(runs["peft_loss"])) <= bound


def test_smollm2_trainable_count_equals_peft(smollm2_models, capsys):
    ours, peft_model = smollm2_models["ours"], smollm2_models["peft"]
    trainable, total = peft_model.get_nb_trainable_parameters()
    assert trainable_parameters(ours) == trainable
    assert count_parameters(ours) == total
    c = ours.config
    per_block = lora_size(c.d_model, c.d_model, 8) + lora_size(
        c.d_model, c.n_kv_heads * c.head_size, 8)  # q: C -> C, v: C -> H_kv D
    assert trainable == c.n_layers * per_block
    peft_model.print_trainable_parameters()
    assert f"trainable params: {trainable_parameters(ours):,d} || all params: " \
           f"{count_parameters(ours):,d}" in capsys.readouterr().out


def test_smollm2_merge_equals_unmerged_and_spares_shared_weights(smollm2_models):
    ours, x = smollm2_models["ours"].eval(), smollm2_models["x"]
    twin = sharing_twin(ours)
    with torch.no_grad():
        twin_before = twin(x).logits
        plain = merge_lora(ours).eval()
        merged, unmerged = plain(x).logits, ours(x).logits
        assert torch.equal(twin(x).logits, twin_before)  # nothing written into shared tensors
    # the two orders of float32 rounding, (W + Delta W) x against W x + Delta W x, differ by
    # about one unit in the last place of each output; relative to the output's size they
    # agree within 1e-5, for each layer and for the logits after 30 blocks
    bound = 1e-5 * unmerged.abs().max()
    assert (merged - unmerged).abs().max() <= bound
    # the same next token wherever the top two logits are further apart than that
    top2 = unmerged.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * bound
    assert clear.sum() > 0.9 * clear.numel()
    assert torch.equal(merged.argmax(-1)[clear], unmerged.argmax(-1)[clear])
    h = torch.randn(2, 24, ours.config.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for layer in lora_layers(ours).values():
            exact = layer(h)
            assert (layer.merged()(h) - exact).abs().max() <= 1e-5 * exact.abs().max()
