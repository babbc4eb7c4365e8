"""Hook points, the activation cache and interventions (tfbook.hooks, tfbook.inspect.hooks)."""

import pytest
import torch

from tfbook.attention import repeat_kv
from tfbook.inspect import (
    ActivationCache,
    add,
    hook_names,
    hook_points,
    hooks,
    patch,
    replace,
    run_with_cache,
    zero,
)
from tfbook.models.bert import Bert, BertConfig
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.models.transformer import Transformer, TransformerConfig

BLOCK = ["residual_pre", "attn.q", "attn.k", "attn.v", "attn.weights", "attn.heads",
         "attn.out", "residual_mid", "ff.hidden", "ff.out", "residual_post"]


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    return GPT(tiny_llama()).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))


def no_hooks_left(model):
    return not any(p._forward_hooks or p._forward_pre_hooks for p in hook_points(model).values())


def test_names_in_firing_order(llama, ids):
    names = hook_names(llama)
    assert names == [f"blocks.{i}.{end}" for i in range(2) for end in BLOCK]
    fired = []
    with hooks(llama, {n: lambda t, n: fired.append(n) for n in names}):
        llama(ids)
    assert fired == names
    assert hook_names(llama, "*.residual_post") == ["blocks.0.residual_post",
                                                    "blocks.1.residual_post"]


def test_shapes_and_values(llama, ids):
    out, cache = run_with_cache(llama, ids)
    assert isinstance(cache, ActivationCache) and len(cache) == 22
    B, T, C, H, H_kv, D = 2, 9, 64, 4, 2, 16
    assert cache["blocks.1.residual_pre"].shape == (B, T, C)
    assert cache["blocks.1.attn.q"].shape == (B, H, T, D)
    assert cache["blocks.1.attn.k"].shape == cache["blocks.1.attn.v"].shape == (B, H_kv, T, D)
    assert cache["blocks.1.attn.weights"].shape == (B, H, T, T)
    assert cache["blocks.1.ff.hidden"].shape == (B, T, 96)
    # the stream adds: post = mid + ff.out, mid = pre + attn.out (pre-norm, no dropout)
    for i in range(2):
        p = f"blocks.{i}."
        torch.testing.assert_close(cache[p + "residual_mid"],
                                   cache[p + "residual_pre"] + cache[p + "attn.out"])
        torch.testing.assert_close(cache[p + "residual_post"],
                                   cache[p + "residual_mid"] + cache[p + "ff.out"])
    # heads = weights @ V, and each weights row is a distribution over the keys before it
    w, v = cache["blocks.0.attn.weights"], cache["blocks.0.attn.v"]
    torch.testing.assert_close(cache["blocks.0.attn.heads"], w @ repeat_kv(v, H // H_kv))
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
    assert torch.all(w.triu(1) == 0)
    # the cached run is the ordinary run (weights through the reference kernel: rounding only)
    torch.testing.assert_close(out.logits, llama(ids).logits, atol=1e-5, rtol=1e-5)
    assert cache.stack("residual_post").shape == (2, B, T, C)
    assert no_hooks_left(llama)


def test_only_the_names_asked_for(llama, ids):
    _, cache = run_with_cache(llama, ids, names=["blocks.1.attn.out"])
    assert list(cache) == ["blocks.1.attn.out"]
    _, cache = run_with_cache(llama, ids, names="*.attn.weights")
    assert list(cache) == ["blocks.0.attn.weights", "blocks.1.attn.weights"]
    with pytest.raises(KeyError, match="holds no 'blocks.0.attn.out'"):
        cache["blocks.0.attn.out"]


def test_wrong_names_are_refused_with_the_names_that_exist(llama, ids):
    with pytest.raises(KeyError, match="did you mean 'blocks.0.residual_post'"):
        run_with_cache(llama, ids, names=["blocks.0.residual_psot"])
    with pytest.raises(KeyError, match=r"'blocks.<i>.' \+ one of .*'attn.weights'"):
        with hooks(llama, {"blocks.7.attn.weights": lambda t, n: None}):
            pass
    with pytest.raises(KeyError, match="no hook point .* matches"):
        run_with_cache(llama, ids, names="*.nothing")
    with pytest.raises(ValueError, match="has no hook points"):
        run_with_cache(torch.nn.Linear(3, 3), torch.zeros(1, 3))
    with pytest.raises(TypeError, match="expected a torch module"):
        hook_names("GPT")
    with pytest.raises(TypeError, match="dict of hook name -> function"):
        with hooks(llama, {"blocks.0.attn.q": 3}):
            pass
    assert no_hooks_left(llama)


def test_no_hooks_left_behind_when_the_run_fails(llama, ids):
    def broken(t, name):
        raise RuntimeError("inside the hook")

    with pytest.raises(RuntimeError, match="inside the hook"):
        with hooks(llama, {"blocks.0.residual_mid": broken, "blocks.1.attn.q": zero()}):
            llama(ids)
    assert no_hooks_left(llama)
    with pytest.raises(ValueError, match="must return None or a tensor of the shape"):
        with hooks(llama, {"blocks.0.ff.out": lambda t, n: t[:, :1]}):
            llama(ids)
    assert no_hooks_left(llama)
    with pytest.raises(ValueError, match="patching needs runs of the same batch and length"):
        _, short = run_with_cache(llama, ids[:, :5])
        with hooks(llama, {"blocks.0.residual_pre": patch(short)}):
            llama(ids)
    assert no_hooks_left(llama)


def test_interventions_act_only_where_asked(llama, ids):
    base = llama(ids).logits
    # zeroing one head at one position leaves every earlier position alone (causal)
    with hooks(llama, {"blocks.1.attn.heads": zero(positions=[5], heads=[2])}):
        changed = llama(ids).logits
    torch.testing.assert_close(changed[:, :5], base[:, :5], atol=1e-6, rtol=1e-6)
    assert (changed[:, 5] - base[:, 5]).abs().max() > 1e-4
    # replacing the zeroed head with its own value restores the run
    _, cache = run_with_cache(llama, ids, names=["blocks.1.attn.heads"])
    with hooks(llama, {"blocks.1.attn.heads": replace(cache["blocks.1.attn.heads"])}):
        torch.testing.assert_close(llama(ids).logits, base, atol=1e-5, rtol=1e-5)
    # adding zero is the identity; adding a vector of width C moves only the chosen position
    with hooks(llama, {"blocks.0.residual_post": add(torch.zeros(64))}):
        torch.testing.assert_close(llama(ids).logits, base, atol=1e-5, rtol=1e-5)
    with hooks(llama, {"blocks.0.residual_post": add(torch.ones(64), positions=8)}):
        moved = llama(ids).logits
    torch.testing.assert_close(moved[:, :8], base[:, :8], atol=1e-5, rtol=1e-5)
    assert (moved[:, 8] - base[:, 8]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="does not broadcast"):
        with hooks(llama, {"blocks.0.residual_post": add(torch.ones(5))}):
            llama(ids)
    with pytest.raises(IndexError, match=r"positions \[9\] are out of range"):
        with hooks(llama, {"blocks.0.residual_post": zero(positions=[9])}):
            llama(ids)
    with pytest.raises(IndexError, match=r"heads \[2\] are out of range"):
        with hooks(llama, {"blocks.0.attn.k": zero(heads=2)}):  # H_kv = 2
            llama(ids)
    with pytest.raises(ValueError, match="has no heads to choose"):
        with hooks(llama, {"blocks.0.ff.out": zero(heads=0)}):
            llama(ids)
    with pytest.raises(TypeError, match="positions must be an int or a list of ints"):
        with hooks(llama, {"blocks.0.ff.out": zero(positions="3")}):
            llama(ids)
    assert no_hooks_left(llama)


def test_patching_everything_from_another_run_gives_that_run(llama, ids):
    other = ids.flip(1)
    ref, clean = run_with_cache(llama, other, names=["blocks.0.residual_post"])
    with hooks(llama, {"blocks.0.residual_post": patch(clean)}):
        patched = llama(ids).logits
    torch.testing.assert_close(patched, ref.logits, atol=1e-5, rtol=1e-5)


def test_replacing_the_weights_mixes_the_values_with_the_new_weights(llama, ids):
    # uniform causal weights: every query averages the values of the keys up to it
    T = ids.size(1)
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    with hooks(llama, {"blocks.0.attn.weights": replace(uniform)}):
        _, cache = run_with_cache(llama, ids, names=["blocks.0.attn.heads", "blocks.0.attn.v"])
    v = repeat_kv(cache["blocks.0.attn.v"], 2)
    torch.testing.assert_close(cache["blocks.0.attn.heads"], uniform @ v)


@pytest.mark.parametrize("kernel", ["torch", "flash", "reference"])
def test_watching_the_weights_changes_no_result(kernel, ids):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**GPTConfig.tiny().__dict__, "attention": kernel})).eval()
    plain = model(ids).logits
    out, cache = run_with_cache(model, ids, names="*.attn.weights")
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=1e-5)
    assert len(cache) == 2


def test_every_model_of_the_book_has_hook_points():
    torch.manual_seed(0)
    bert = Bert(BertConfig.tiny()).eval()
    names = hook_names(bert)
    assert names[:2] == ["blocks.0.residual_pre", "blocks.0.attn.q"]
    assert len(names) == 11 * bert.config.n_layers
    seq2seq = Transformer(TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, max_len=16,
                                            n_encoder_layers=1, n_decoder_layers=1,
                                            d_model=32, n_heads=4, d_ff=64, dropout=0.0))
    names = hook_names(seq2seq.eval())
    decoder = [n for n in names if n.startswith("decoder.0.")]
    assert [n.removeprefix("decoder.0.") for n in decoder] == [
        "residual_pre", *(f"self_attn.{p}" for p in ("q", "k", "v", "weights", "heads", "out")),
        "residual_mid", *(f"cross_attn.{p}" for p in ("q", "k", "v", "weights", "heads", "out")),
        "residual_cross", "ff.hidden", "ff.out", "residual_post"]
    src, tgt = torch.randint(0, 50, (1, 6)), torch.randint(0, 50, (1, 4))
    _, cache = run_with_cache(seq2seq, src, tgt, names="*cross_attn.weights")
    assert cache["decoder.0.cross_attn.weights"].shape == (1, 4, 4, 6)  # (B, H, T, S)
