"""Activation patching and attribution patching (tfbook.inspect.patching) on tiny models."""

import dataclasses

import pytest
import torch
from torch import nn

from tfbook.hooks import HookPoint
from tfbook.inspect import add, hook_points, hooks, run_with_cache
from tfbook.inspect.patching import (
    FACTUAL,
    IOI,
    PAIRS,
    REFERENCE,
    WHAT,
    PatchingResult,
    PromptPair,
    activation_patching,
    attribution_patching,
    disagreements,
    logit_diff,
    patch_once,
    replay_bound,
    restored_fraction,
)
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama

T, CHANGED = 7, 3  # prompt length; the one position where clean and corrupted differ
U64 = torch.finfo(torch.float64).eps / 2  # unit roundoff of float64


def make(config):
    torch.manual_seed(0)
    return GPT(config).eval().double()


@pytest.fixture(scope="module", params=["gpt", "llama"])
def model(request):
    return make(GPTConfig.tiny() if request.param == "gpt" else tiny_llama())


@pytest.fixture(scope="module")
def llama():
    return make(tiny_llama())


@pytest.fixture(scope="module")
def gpt():
    return make(GPTConfig.tiny())


def prompts(B=2):
    clean = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(1))
    corrupted = clean.clone()
    corrupted[:, CHANGED] = (corrupted[:, CHANGED] + 7) % 256
    return clean, corrupted


def metric_for(model, clean, corrupted):
    """logit_diff between the tokens the corruption moves most: a clear clean/corrupted gap."""
    with torch.no_grad():
        moved = (model(clean).logits[:, -1] - model(corrupted).logits[:, -1]).mean(0)  # (V,)
    answer, wrong = int(moved.argmax()), int(moved.argmin())
    return lambda logits: logit_diff(logits, answer, wrong)


def reorder_bound(model, r: PatchingResult) -> float:
    """replay_bound of two float64 runs that differ only in the order of their sums (a batch of
    copies against one prompt), at the scale of every metric in the grid, in restored-fraction
    units (divided by |clean - corrupted|)."""
    metrics = [r.clean, r.corrupted, *r.values.flatten().tolist()]
    return replay_bound(model.config, T, metrics, torch.float64) / abs(r.clean - r.corrupted)


def no_hooks_left(model):
    return not any(p._forward_hooks or p._forward_pre_hooks for p in hook_points(model).values())


# -- the metric ---------------------------------------------------------------------------------

def test_logit_diff():
    logits = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 3, 5)
    assert logit_diff(logits, 4, 1).tolist() == [3.0, 3.0]
    assert logit_diff(logits, [4, 0], 1, position=0).tolist() == [3.0, -1.0]
    assert logit_diff(logits, torch.tensor([1, 2]), [0, 0]).tolist() == [1.0, 2.0]
    assert restored_fraction(2.0, 3.0, 1.0).item() == 0.5
    assert restored_fraction(torch.tensor([1.0, 3.0]), 3.0, 1.0).tolist() == [0.0, 1.0]


# -- activation patching ------------------------------------------------------------------------

def test_patching_everything_restores_the_clean_run_and_nothing_restores_nothing(model):
    clean, corrupted = prompts()
    metric = metric_for(model, clean, corrupted)
    with torch.no_grad():
        clean_m = metric(model(clean).logits).mean().item()
        corrupted_m = metric(model(corrupted).logits).mean().item()
    # one run of the same shapes as the clean run from the patch on: the same bits
    for name in ("blocks.0.residual_pre", "blocks.1.residual_pre", "blocks.1.residual_post"):
        assert patch_once(model, clean, corrupted, metric, name) == clean_m
    assert patch_once(model, clean, corrupted, metric, "blocks.1.residual_pre",
                      positions=[]) == corrupted_m
    # the grid: at layer 0 the changed position is all that differs, so patching it is
    # patching everything; the positions before it are equal in both runs (causal)
    r = activation_patching(model, clean, corrupted, metric, "residual_pre", progress=False)
    assert r.values.shape == (2, T) and r.axes == ("layer", "position")
    assert (r.clean, r.corrupted) == (pytest.approx(clean_m, abs=0), corrupted_m)
    bound = reorder_bound(model, r)
    assert bound < 1e-9  # float64 throughout (RMSNorm keeps float64 input in float64)
    restored = r.restored
    assert abs(restored[0, CHANGED].item() - 1) <= bound
    # positions whose clean and corrupted tensors are equal (bit for bit: the same kernels
    # on the same inputs) are not run, and get the corrupted metric itself
    assert torch.all(restored[:, :CHANGED] == 0)
    assert torch.all(restored[0, CHANGED + 1:] == 0)  # layer 0: the same embeddings there
    # the clean and corrupted runs, then one pass per layer: position 3 at layer 0, 3..6 at 1
    assert r.forward_passes == 2 + 2
    one_by_one = activation_patching(model, clean, corrupted, metric, progress=False,
                                     batch_size=1)
    assert one_by_one.forward_passes == 2 + 1 + (T - CHANGED)
    assert no_hooks_left(model)


@pytest.mark.parametrize("what", ["residual_pre", "residual_post", "attn.out", "ff.hidden",
                                  "attn.heads", "attn.q", "attn.k", "attn.v", "attn.weights"])
def test_batched_equals_one_at_a_time(llama, what):
    clean, corrupted = prompts()
    metric = metric_for(llama, clean, corrupted)
    batched = activation_patching(llama, clean, corrupted, metric, what, progress=False)
    halves = activation_patching(llama, clean, corrupted, metric, what, progress=False,
                                 batch_size=2)
    L, N = batched.values.shape
    assert (L, N) == (2, {"position": T, "head": 4, "kv_head": 2}[WHAT[what]])
    one = torch.tensor([[patch_once(llama, clean, corrupted, metric, f"blocks.{layer}.{what}",
                                    **({"positions": i} if WHAT[what] == "position"
                                       else {"heads": i}))
                         for i in range(N)] for layer in range(L)], dtype=torch.float64)
    bound = reorder_bound(llama, batched) * abs(batched.clean - batched.corrupted)
    assert (batched.values - one).abs().max().item() <= bound
    assert (halves.values - one).abs().max().item() <= bound
    if WHAT[what] == "kv_head":  # a key/value head is shared by the query heads of its group
        assert batched.labels == ("0 (q 0-1)", "1 (q 2-3)")
    assert no_hooks_left(llama)


def test_layers_and_labels(llama):
    clean, corrupted = prompts(1)
    metric = metric_for(llama, clean, corrupted)
    labels = [f"t{i}" for i in range(T)]
    r = activation_patching(llama, clean[0].tolist(), corrupted[0], metric, layers=[1],
                            labels=labels, progress=False)
    full = activation_patching(llama, clean, corrupted, metric, progress=False)
    assert r.layers == (1,) and r.labels == tuple(labels) and r.values.shape == (1, T)
    assert torch.equal(r.values[0], full.values[1])  # the same passes: the same bits
    top = full.top(3)
    assert [c.restored for c in top] == sorted(full.restored.flatten().tolist(),
                                               reverse=True)[:3]
    assert full.values[top[0].layer, top[0].index].item() == top[0].value
    assert "activation patching of 'residual_pre': 2 layers x 7 positions" in repr(full)
    assert set(REFERENCE) <= set(WHAT)


# -- attribution patching -----------------------------------------------------------------------

class LinearAttention(nn.Module):
    """Attention with fixed uniform causal weights: each head's output is linear in x."""

    def __init__(self, C: int, H: int) -> None:
        super().__init__()
        self.n_heads, self.v_proj, self.out_proj = H, nn.Linear(C, C), nn.Linear(C, C)
        self.heads, self.out = HookPoint(), HookPoint()

    def forward(self, x):
        B, T_, C = x.shape
        v = self.v_proj(x).view(B, T_, self.n_heads, -1).transpose(1, 2)  # (B, H, T, D)
        w = torch.tril(torch.ones(T_, T_, dtype=x.dtype))
        w = w / w.sum(-1, keepdim=True)  # (T, T): the mean of the positions so far
        heads = self.heads(w @ v)  # (B, H, T, D)
        return self.out(self.out_proj(heads.transpose(1, 2).reshape(B, T_, C)))


class LinearBlock(nn.Module):
    def __init__(self, C: int, H: int) -> None:
        super().__init__()
        self.attn = LinearAttention(C, H)
        self.residual_pre, self.residual_post = HookPoint(), HookPoint()

    def forward(self, x):
        x = self.residual_pre(x)
        return self.residual_post(x + self.attn(x))


class LinearModel(nn.Module):
    """A model whose logits are affine in every activation: no norms, no nonlinearity."""

    def __init__(self, V: int = 50, C: int = 16, H: int = 4, L: int = 3) -> None:
        super().__init__()
        self.emb, self.unembed = nn.Embedding(V, C), nn.Linear(C, V)
        self.blocks = nn.ModuleList(LinearBlock(C, H) for _ in range(L))

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)  # (B, T, V): a plain tensor of logits


@pytest.mark.parametrize("what", ["residual_pre", "residual_post", "attn.heads", "attn.out"])
def test_attribution_is_exact_for_a_linear_model(what):
    torch.manual_seed(0)
    model = LinearModel().double().eval()
    clean = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    corrupted = torch.tensor([[3, 1, 4, 7, 5, 9, 2]])
    metric = lambda logits: logit_diff(logits, 6, 8)  # noqa: E731
    act = activation_patching(model, clean, corrupted, metric, what, progress=False)
    att = attribution_patching(model, clean, corrupted, metric, what)
    assert att.method == "attribution" and att.values.shape == act.values.shape
    # affine: the first-order estimate is the patched run, up to rounding (sums of at most
    # 3 * (C + T + C) + C terms per logit at the scale of the logits)
    scale = 1 + float(act.values.abs().max())
    bound = (3 * (16 + 7 + 16) + 16) * U64 * scale * 4
    assert (act.values - att.values).abs().max().item() <= bound
    assert (act.values - act.corrupted).abs().max().item() > 1e3 * bound  # not a 0 = 0 test


@pytest.mark.parametrize("kind", ["gpt", "gqa"])
def test_attribution_matches_finite_differences(gpt, kind):
    """Each cell's estimate minus the corrupted metric is the derivative of the metric along
    (clean - corrupted) at that cell: central differences with step eps agree within about
    eps^2 |m'''| / 6 + u |m| / eps, with eps = 1e-3 near 1e-8 relative here. The models run
    in float64 throughout: the GPT, and a Llama-style model with grouped key/value heads
    whose norms are LayerNorms (tfbook's RMSNorm rounds to float32)."""
    model = gpt if kind == "gpt" else make(dataclasses.replace(tiny_llama(), norm="layer"))
    eps = 1e-3
    clean, corrupted = prompts()
    metric = metric_for(model, clean, corrupted)
    whats = ["residual_pre", "attn.heads", "attn.k", "attn.v", "ff.out"]
    att = attribution_patching(model, clean, corrupted, metric, whats)
    assert set(att) == set(whats) and no_hooks_left(model)
    for what, layer, index in (("residual_pre", 1, CHANGED), ("residual_pre", 1, T - 1),
                               ("attn.heads", 1, 2), ("attn.k", 1, 1), ("attn.k", 0, 0),
                               ("attn.v", 0, 1), ("ff.out", 0, T - 1)):
        name = f"blocks.{layer}.{what}"
        _, clean_cache = run_with_cache(model, clean, names=[name])
        _, corrupted_cache = run_with_cache(model, corrupted, names=[name])
        delta = clean_cache[name] - corrupted_cache[name]
        where = {"positions": [index]} if WHAT[what] == "position" else {"heads": [index]}
        m = []
        for sign in (1, -1):  # the metric with the cell moved by +-eps * (clean - corrupted)
            with torch.no_grad(), hooks(model, {name: add(sign * eps * delta, **where)}):
                m.append(metric(model(corrupted).logits).mean().item())
        slope = (m[0] - m[1]) / (2 * eps)
        estimate = att[what].values[layer, index].item() - att[what].corrupted
        assert abs(slope) > 1e-6, (what, layer, index)  # a cell the metric depends on
        assert estimate == pytest.approx(slope, rel=1e-6), (what, layer, index)


def test_disagreements(llama):
    clean, corrupted = prompts()
    metric = metric_for(llama, clean, corrupted)
    act = activation_patching(llama, clean, corrupted, metric, "attn.heads", progress=False)
    att = attribution_patching(llama, clean, corrupted, metric, "attn.heads")
    worst = disagreements(act, att, k=8)
    gaps = [abs(d.difference) for d in worst]
    assert len(worst) == 8 and gaps == sorted(gaps, reverse=True)
    assert gaps[0] == (att.restored - act.restored).abs().max().item()
    d = worst[0]
    assert d.activation == act.restored[d.layer, d.index].item()
    other = attribution_patching(llama, clean, corrupted, metric, "attn.q")
    with pytest.raises(ValueError, match="different places"):
        disagreements(act, other)


# -- bad input ----------------------------------------------------------------------------------

def test_bad_prompts(llama):
    clean, corrupted = prompts()
    metric = metric_for(llama, clean, corrupted)
    for fn in (activation_patching, attribution_patching):
        with pytest.raises(ValueError, match="clean prompt has 7 tokens and the corrupted "
                                             "prompt 6: .* equally many tokens"):
            fn(llama, clean, corrupted[:, :6], metric)
        with pytest.raises(ValueError, match="2 prompts and the corrupted run 1"):
            fn(llama, clean, corrupted[:1], metric)
        with pytest.raises(TypeError, match="not text: encode it first"):
            fn(llama, "When Mary and John", corrupted, metric)
        with pytest.raises(TypeError, match="must be integers, got torch.float32"):
            fn(llama, clean.float(), corrupted, metric)
        with pytest.raises(ValueError, match=r"lie in \[0, 256\) .* got values in \[0, 300\]"):
            fn(llama, clean, torch.full_like(corrupted, 300).index_fill(1, torch.tensor([0]), 0),
               metric)
        with pytest.raises(TypeError, match="metric must be a function of the logits"):
            fn(llama, clean, corrupted, "logit_diff")
    with pytest.raises(ValueError, match="equally many tokens"):
        patch_once(llama, clean, corrupted[:, :5], metric, "blocks.0.residual_pre")


def test_bad_places(llama):
    clean, corrupted = prompts()
    metric = metric_for(llama, clean, corrupted)
    with pytest.raises(ValueError, match="cannot sweep 'resid_pre'; the grids are"):
        activation_patching(llama, clean, corrupted, metric, "resid_pre")
    with pytest.raises(TypeError, match="what must be a hook name ending"):
        attribution_patching(llama, clean, corrupted, metric, ["attn.heads", 3])
    with pytest.raises(ValueError, match=r"layers \[2\] are out of range: GPT has 2 layers"):
        activation_patching(llama, clean, corrupted, metric, layers=[0, 2])
    with pytest.raises(TypeError, match="layers must be an int or a non-empty list"):
        activation_patching(llama, clean, corrupted, metric, layers=[])
    with pytest.raises(ValueError, match="labels gives 3 labels for 7 positions"):
        activation_patching(llama, clean, corrupted, metric, labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        activation_patching(llama, clean, corrupted, metric, batch_size=0)
    with pytest.raises(TypeError, match="batch_size must be an int, got 2.5"):
        activation_patching(llama, clean, corrupted, metric, batch_size=2.5)
    # a hook name that does not exist: the names that do, as tfbook.inspect.hooks words them
    with pytest.raises(KeyError, match="has no hook point 'blocks.0.attn.head'.*did you mean "
                                       "'blocks.0.attn.heads'"):
        patch_once(llama, clean, corrupted, metric, "blocks.0.attn.head")
    with pytest.raises(ValueError, match=r"heads \[4\] are out of range for 'blocks.1.attn.q', "
                                         "which has 4 heads"):
        patch_once(llama, clean, corrupted, metric, "blocks.1.attn.q", heads=4)
    with pytest.raises(ValueError, match=r"heads \[2\] are out of range .* which has 2 heads"):
        patch_once(llama, clean, corrupted, metric, "blocks.1.attn.k", heads=[0, 2])
    with pytest.raises(ValueError, match=r"positions \[7\] are out of range .* has 7 positions"):
        patch_once(llama, clean, corrupted, metric, "blocks.1.residual_pre", positions=7)
    with pytest.raises(ValueError, match="has no heads to choose"):
        patch_once(llama, clean, corrupted, metric, "blocks.1.residual_pre", heads=0)
    with pytest.raises(TypeError, match="positions must be an int or a list of ints"):
        patch_once(llama, clean, corrupted, metric, "blocks.1.residual_pre", positions=1.5)
    assert no_hooks_left(llama)


def test_bad_answers():
    logits = torch.zeros(2, 3, 5)
    with pytest.raises(ValueError, match=r"answer token ids \[5\] lie outside the vocabulary "
                                         r"\[0, 5\)"):
        logit_diff(logits, 5, 1)
    with pytest.raises(ValueError, match=r"wrong token ids \[-1\] lie outside"):
        logit_diff(logits, 0, [1, -1])
    with pytest.raises(TypeError, match="answer must be a token id .* got ' Mary'"):
        logit_diff(logits, " Mary", 1)
    with pytest.raises(TypeError, match="wrong must be a token id"):
        logit_diff(logits, 1, 2.0)
    with pytest.raises(ValueError, match="wrong gives 3 token ids for 2 prompts"):
        logit_diff(logits, 1, [1, 2, 3])
    with pytest.raises(ValueError, match="position 3 is out of range for logits of 3 positions"):
        logit_diff(logits, 1, 2, position=3)
    with pytest.raises(TypeError, match=r"logits must be a float tensor \(B, T, V\)"):
        logit_diff(logits[0], 1, 2)
    with pytest.raises(ValueError, match="nothing to restore"):
        restored_fraction(1.0, 2.0, 2.0)


def test_bad_models_and_metrics(llama):
    clean, corrupted = prompts()
    metric = metric_for(llama, clean, corrupted)
    plain = nn.Sequential(nn.Embedding(256, 8), nn.Linear(8, 256)).eval()
    with pytest.raises(ValueError, match="Sequential has no hook points"):
        activation_patching(plain, clean, corrupted, metric)
    with pytest.raises(ValueError, match="Sequential has no hook points"):
        patch_once(plain, clean, corrupted, metric, "blocks.0.residual_pre")
    with pytest.raises(TypeError, match="model must be a tfbook model"):
        attribution_patching("SmolLM2", clean, corrupted, metric)
    training = make(tiny_llama()).train()
    with pytest.raises(ValueError, match="training mode .* call model.eval"):
        activation_patching(training, clean, corrupted, metric)
    with pytest.raises(ValueError, match=r"shape \(\) or \(2,\) .* got \(2, 256\)"):
        activation_patching(llama, clean, corrupted, lambda logits: logits[:, -1],
                            progress=False)
    with pytest.raises(ValueError, match="not differentiable"):
        attribution_patching(llama, clean, corrupted,
                             lambda logits: logits[:, -1].argmax(-1).double())
    assert no_hooks_left(llama)


# -- the prompt pairs and the replay budget -----------------------------------------------------

class WordTokenizer:
    """One token per word, with its leading space (enough to count tokens)."""

    def encode_ordinary(self, text):
        return [hash(w) % 1000 for w in text.replace(" ", "\0 ").split("\0") if w]


def test_prompt_pairs():
    assert PAIRS == {"ioi": IOI, "factual": FACTUAL}
    assert IOI.clean.replace(", John gave", ", Mary gave") == IOI.corrupted
    assert (IOI.answer, IOI.wrong, FACTUAL.answer, FACTUAL.wrong) == (
        " Mary", " John", " Paris", " Rome")
    clean, corrupted, answer, wrong = IOI.encode(WordTokenizer())
    assert len(clean) == len(corrupted) == 13 and clean != corrupted
    assert (answer, wrong) == tuple(WordTokenizer().encode_ordinary(t)[0] for t in (" Mary",
                                                                                     " John"))
    with pytest.raises(ValueError, match="'factual': the prompts must have equally many tokens"):
        FACTUAL.encode(WordTokenizer())  # "Eiffel Tower" is two words, "Colosseum" one
    with pytest.raises(ValueError, match="answers of 2 and 1"):
        PromptPair("x", "a b", "a c", " New York", " Rome").encode(WordTokenizer())


def test_replay_bound():
    """2 gamma_n (1 + max|metric|), n = L (5C + D + T + F) + 2C: the longest chain of sums."""
    config = GPTConfig.tiny()
    L, C, H = config.n_layers, config.d_model, config.n_heads
    n = L * (5 * C + C // H + 10 + 4 * C) + 2 * C  # d_ff None: F = 4C
    for dtype in (torch.float32, torch.float64):
        u = torch.finfo(dtype).eps / 2
        assert replay_bound(config, 10, [4.0, -9.0], dtype) == pytest.approx(
            2 * n * u / (1 - n * u) * 10, rel=1e-12)
    llama = tiny_llama()
    n = llama.n_layers * (5 * llama.d_model + llama.d_model // llama.n_heads + 10
                          + llama.d_ff) + 2 * llama.d_model
    assert replay_bound(llama, 10, [1.0]) == pytest.approx(2 * n * 2.0**-24 / (1 - n * 2.0**-24)
                                                          * 2, rel=1e-12)
    with pytest.raises(ValueError, match="n_tokens must be a positive int"):
        replay_bound(config, 0, [1.0])
    with pytest.raises(ValueError, match="metrics is empty"):
        replay_bound(config, 10, [])
    with pytest.raises(TypeError, match="dtype must be a floating-point torch dtype"):
        replay_bound(config, 10, [1.0], torch.int64)
