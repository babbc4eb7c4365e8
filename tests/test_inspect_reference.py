"""tfbook.inspect equals TransformerLens 4.3 and nnsight 0.8 (the references of issue 24).

TransformerLens's TransformerBridge wraps a Hugging Face LlamaForCausalLM and reads it through
its own hook points; tfbook's hooks read tfbook's model. Both hold the same weights: SmolLM2
from the shipped GGUF (tfbook in Hugging Face's layout, `load_smollm2("hf")`) and a random
2-layer Llama with grouped-query attention. So every cached tensor, and every patched run,
must agree: hook points, the logit lens (both scales), direct logit attribution, activation
and attribution patching. tfbook's reference kernels and HF's eager attention sum in nearly
the same order; the bound is relative to each tensor's own scale, HF_RELATIVE_BOUND (1e-5) of
its largest magnitude: 84 to 168 float32 ulps of the largest entry, above the rounding of a
forward pass of a few tokens (direct logit attribution gets a bound derived per head). Each
comparison also checks that what it compares is far from nothing (an effect many times the
bound), so that agreement is not two empty grids. nnsight traces tfbook's small GPT as a
plain torch module: what it saves and what it overwrites must equal tfbook's hooks, bit for
bit, since both run the same model code (thread count pinned).

Everything is offline (tests/inspect_reference.py boots the bridge with the hub switched
off); SmolLM2's bridge is booted once per module.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from tests import inspect_reference as ref
from tests.inspect_models import U, gamma
from tests.pinned_threads import pinned_threads
from tfbook.checkpoints.hf_llama import tfbook_from_hf_llama
from tfbook.checkpoints.smollm2 import (
    HF_RELATIVE_BOUND,
    hf_llama_from_gguf,
    load_smollm2,
    load_smollm2_tokenizer,
    read_smollm2_gguf,
)
from tfbook.inspect import (
    activation_patching,
    attribution_patching,
    direct_logit_attribution,
    final_stream_parts,
    hook_names,
    hook_points,
    hooks,
    logit_direction,
    logit_lens,
    patch,
    run_with_cache,
    zero,
)
from tfbook.models.gpt import GPT, GPTConfig

CLEAN = "The Eiffel Tower is in the city of"
CORRUPTED = "The Colosseum is in the city of"  # as many tokens as CLEAN (checked)
ANSWER, OTHER = " Paris", " Rome"

# tfbook's hook point -> TransformerLens's, per block. tfbook keeps heads before positions
# ((B, H, T, D), as attention computes them); TL puts positions first ((B, T, H, D)).
SAME_LAYOUT = {"residual_pre": "hook_resid_pre", "residual_mid": "hook_resid_mid",
               "residual_post": "hook_resid_post", "attn.weights": "attn.hook_pattern",
               "attn.out": "hook_attn_out", "ff.hidden": "mlp.hook_post",
               "ff.out": "hook_mlp_out"}
HEADS_FIRST = {"attn.q": "attn.hook_q", "attn.k": "attn.hook_k", "attn.v": "attn.hook_v",
               "attn.heads": "attn.hook_z"}


def close(ours: torch.Tensor, theirs: torch.Tensor, scale: torch.Tensor | None = None) -> bool:
    """|ours - theirs| <= HF_RELATIVE_BOUND * the largest |theirs| (or |scale|), elementwise."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    bound = HF_RELATIVE_BOUND * (theirs if scale is None else scale).abs().max()
    return bool(((ours - theirs).abs() <= bound).all())


def tl_name(name: str) -> tuple[str, bool]:
    """TransformerLens's name for tfbook's hook `name`, and whether the axes H, T swap."""
    block, index, rest = name.split(".", 2)
    if rest in SAME_LAYOUT:
        return f"{block}.{index}.{SAME_LAYOUT[rest]}", False
    return f"{block}.{index}.{HEADS_FIRST[rest]}", True


def assert_cache_equal(ours_cache, tl_cache, names) -> None:
    for name in names:
        theirs, swap = tl_name(name)
        mine = ours_cache[name].transpose(1, 2) if swap else ours_cache[name]
        assert close(mine, tl_cache[theirs]), name


def logit_gap_bound(logits: torch.Tensor) -> float:
    """How far two logit differences computed to HF_RELATIVE_BOUND may be apart."""
    return 2 * HF_RELATIVE_BOUND * logits.abs().max().item()


# --- SmolLM2 ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    """tfbook's SmolLM2 and TL's bridge around HF's, both from the GGUF, and the prompts."""
    tokenizer = load_smollm2_tokenizer()
    fast = ref.smollm2_fast_tokenizer()
    bridge = ref.boot_bridge(hf_llama_from_gguf(read_smollm2_gguf()), fast)
    clean, corrupted = (torch.tensor([tokenizer.encode(t)]) for t in (CLEAN, CORRUPTED))
    answer, other = (tokenizer.encode(t) for t in (ANSWER, OTHER))
    assert clean.shape == corrupted.shape == (1, 9) and len(answer) == len(other) == 1
    return SimpleNamespace(
        ours=load_smollm2("hf", attention="reference"), bridge=bridge, tokenizer=tokenizer,
        fast=fast, clean=clean, corrupted=corrupted,
        metric=ref.logit_difference(answer[0], other[0]))


@pytest.fixture(scope="module")
def smollm2_runs(smollm2):
    """One cached run of the clean prompt on each side."""
    with torch.no_grad():
        ours_out, ours_cache = run_with_cache(smollm2.ours, smollm2.clean)
    tl_logits, tl_cache = ref.tl_run(smollm2.bridge, smollm2.clean)
    return SimpleNamespace(logits=ours_out.logits, cache=ours_cache, tl_logits=tl_logits,
                           tl_cache=tl_cache)


def test_fast_tokenizer_is_smollm2s(smollm2):
    """The fast tokenizer built from the GGUF (TL's needs one) gives tfbook's ids."""
    for text in (CLEAN, "Digits 2024 split, spaces   and ünïcode\n\n", "it's 3.14\tx"):
        assert smollm2.fast(text, add_special_tokens=False)["input_ids"] == \
            smollm2.tokenizer.encode(text)


def test_offline_hub_switches_the_hub_off_and_back():
    import huggingface_hub.constants as hub

    before = hub.is_offline_mode()
    with ref.offline_hub():
        assert hub.is_offline_mode()
    assert hub.is_offline_mode() == before


def test_smollm2_every_hook_equals_transformer_lens(smollm2, smollm2_runs):
    """30 blocks x 11 hook points: residual stream, q/k/v (before RoPE; 3 key/value heads,
    not repeated), attention weights, each head's output before W_O, sub-layer outputs, the
    SwiGLU hidden units; and the logits."""
    r = smollm2_runs
    assert close(r.logits, r.tl_logits)
    names = hook_names(smollm2.ours)
    assert len(names) == 30 * 11
    assert_cache_equal(r.cache, r.tl_cache, names)
    assert r.cache["blocks.4.attn.k"].shape == (1, 3, 9, 64)  # H_kv = 3 on both sides
    assert r.tl_cache["blocks.4.attn.hook_k"].shape == (1, 9, 3, 64)


def test_smollm2_residual_decomposition(smollm2_runs):
    """The stream is the sum of what each sub-layer adds, on both sides (TL's
    decompose_resid): embedding + sum of attn.out and ff.out = the last residual_post."""
    r = smollm2_runs
    parts = r.tl_cache.decompose_resid()  # (1 + 2L, B, T, C)
    last = r.cache["blocks.29.residual_post"]
    ours = r.cache["blocks.0.residual_pre"] + sum(
        r.cache[f"blocks.{i}.{p}"] for i in range(30) for p in ("attn.out", "ff.out"))
    # 61 float32 terms summed in two orders: within 61 eps of the sum of their magnitudes
    eps = torch.finfo(torch.float32).eps
    assert ((ours - last).abs() <= 61 * eps * parts.abs().sum(0)).all()
    assert close(parts.sum(0), last, scale=parts.abs().sum(0))


def test_smollm2_logit_lens_equals_transformer_lens(smollm2, smollm2_runs):
    """Both logit lenses at the last position, all 31 streams: recomputed (the literature's,
    TL 4.3's accumulated_resid(apply_ln=True)) and the final layer's cached scale (TL's
    apply_ln_to_stack, the lens of TL before issue #1076's fix), each within the bound of its
    own layer's largest logit."""
    r = smollm2_runs
    for scale, theirs in (("recomputed", ref.tl_logit_lens(smollm2.bridge, r.tl_cache,
                                                            pos_slice=-1)[0]),
                          ("final", ref.tl_logit_lens_cached_scale(smollm2.bridge, r.tl_cache,
                                                                   pos_slice=-1))):
        with torch.no_grad():
            ours = logit_lens(smollm2.ours, r.cache, scale=scale, positions=-1)  # (31, B, V)
        assert ours.shape == theirs.shape == (31, 1, 49152)
        for layer in range(31):
            assert close(ours[layer], theirs[layer]), (scale, layer)
    assert close(ours[-1], r.tl_logits[:, -1])  # both lenses end at the model's logits


def head_attribution_bound(model, cache, u: torch.Tensor, position: int = -1) -> torch.Tensor:
    """How far TL's float32 attribution of each head may lie from tfbook's float64 one, (L, H).

    TL computes c_h = z_h W_O,h^T (D products per entry, within gamma_D |z_h| |W_O,h|^T),
    divides by the cached scale s and dots with g * u (C products, within gamma_C, plus about
    3 roundings of u for the division, the gain and the scale itself): with v = g * u / s,
    gamma_D (|z_h| |W_O,h|^T) . |v| + (gamma_C + 3u) |c_h| . |v|.
    """
    norm = model.norm_f
    x_L = cache[f"blocks.{len(model.blocks) - 1}.residual_post"][:, position].double()
    v = (u.double() * norm.weight.double() / x_L.pow(2).mean(-1, keepdim=True).add(
        norm.eps).sqrt()).abs()  # (B, C)
    parts, labels = final_stream_parts(model, cache, position)  # (N, B, C)
    bounds = []
    for layer, block in enumerate(model.blocks):
        z = cache[f"blocks.{layer}.attn.heads"][:, :, position].double().abs()  # (B, H, D)
        B, H, D = z.shape
        W_O = block.attn.out_proj.weight.double().abs().view(-1, H, D)  # (C, H, D)
        zW = torch.einsum("bhd,chd->bhc", z, W_O)  # (B, H, C)
        c = parts[[labels.index(f"L{layer}H{h}") for h in range(H)]].abs()  # (H, B, C)
        bounds.append((gamma(D) * (zW * v[:, None]).sum(-1)
                       + (gamma(v.size(-1)) + 3 * U) * (c.transpose(0, 1) * v[:, None]).sum(-1)
                       ).mean(0))
    return torch.stack(bounds)  # (L, H)


def test_smollm2_head_attribution_equals_transformer_lens(smollm2, smollm2_runs):
    """Direct logit attribution of " Paris" - " Rome" to each of the 270 heads: tfbook's
    `direct_logit_attribution` and TL's `stack_head_results` through TL's cached final scale
    (with the final norm's weight, which TL's `logit_attrs` omits outside compatibility
    mode), within a derived float32 bound of each head's terms."""
    s, r = smollm2, smollm2_runs
    answer, other = (s.tokenizer.encode(t)[0] for t in (ANSWER, OTHER))
    ours = direct_logit_attribution(s.ours, r.cache, answer, other).heads()[..., 0]  # (L, H)
    theirs = ref.tl_head_logit_attribution_unfolded(s.bridge, r.tl_cache, -1, answer, other)
    bound = head_attribution_bound(s.ours, r.cache, logit_direction(s.ours, answer, other))
    assert ((ours - theirs.double()).abs() <= bound).all()
    assert theirs.abs().max() > 1e3 * bound.max()  # heads that matter, far above the bound


# tfbook's grid -> TL's patching kind, the layer swept on SmolLM2 and the cells TL checks (TL
# runs one forward per cell, about 0.1 s of CPU each; the cells include ones that restore
# much of the answer, e.g. position 2 ("iffel") at layer 12, value head 1 at layer 23)
SMOLLM2_GRIDS = {"residual_pre": ("resid_pre", 12, [0, 2, 3, 8]),
                 "attn.heads": ("head_out", 23, [0, 4, 5]), "attn.q": ("head_q", 3, [2, 3, 6]),
                 "attn.k": ("head_k", 23, [0, 1, 2]), "attn.v": ("head_v", 23, [0, 1, 2])}


@pytest.mark.parametrize("what", SMOLLM2_GRIDS)
def test_smollm2_activation_patching_equals_transformer_lens(smollm2, what):
    """tfbook's `activation_patching` grid row equals TL's `patching.get_act_patch_*` cells:
    the logit difference " Paris" - " Rome" of the corrupted run with one clean position
    (head, query head, key/value head) patched. SmolLM2's k and v rows have 3 cells, one per
    key/value head, each read by 3 query heads."""
    kind, layer, cells = SMOLLM2_GRIDS[what]
    s = smollm2
    ours = activation_patching(s.ours, s.clean, s.corrupted, s.metric, what, layers=[layer],
                               progress=False)
    assert ours.values.shape == (1, {"attn.k": 3, "attn.v": 3}.get(what, 9))
    theirs = ref.tl_patch(s.bridge, kind, s.clean, s.corrupted, s.metric,
                          rows=[(layer, i) for i in cells])
    with torch.no_grad():
        bound = logit_gap_bound(s.ours(s.corrupted).logits)
    assert torch.allclose(ours.values[0, cells], theirs.double(), rtol=0, atol=bound)
    assert abs(ours.corrupted - s.metric(ref.tl_run(s.bridge, s.corrupted)[0]).item()) <= bound
    # the patches matter: some cell moves the metric far from the unpatched corrupted run
    assert (theirs - ours.corrupted).abs().max() > 100 * bound


def test_smollm2_attribution_patching_equals_transformer_lens(smollm2):
    """tfbook's `attribution_patching` (one forward and backward) equals TL's
    `attribution_patch` at node granularity: per head (summed over positions, TL scores
    each position) and per MLP and position, as estimated changes of the metric."""
    s = smollm2
    ours = attribution_patching(s.ours, s.clean, s.corrupted, s.metric, ["attn.heads", "ff.out"])
    theirs = ref.tl_attribution_patching(s.bridge, s.clean, s.corrupted, s.metric)
    assert_attribution_equal(ours, theirs)


def assert_attribution_equal(ours, theirs) -> None:
    heads = theirs["head_out"].sum(1).double()  # (L, H)
    mlps = theirs["mlp_out"].double()  # (L, T)
    for grid, tl in ((ours["attn.heads"], heads), (ours["ff.out"], mlps)):
        estimate = grid.values - grid.corrupted  # tfbook adds the corrupted metric
        assert close(estimate, tl)
        assert tl.abs().max() > 100 * (estimate - tl).abs().max()  # not two empty grids


# --- a tiny random Llama: whole patching grids, compatibility mode ---------------------------

@pytest.fixture(scope="module")
def tiny():
    """A random 2-layer Llama (4 query heads, 2 key/value heads, norm weights around 1) as
    tfbook's GPT and inside TL's bridge, and a clean/corrupted pair of 10 tokens."""
    hf = ref.tiny_hf_llama(seed=0)
    ours = tfbook_from_hf_llama(hf, attention="reference")  # before the bridge rewires hf
    bridge = ref.boot_bridge(hf, ref.numbered_tokenizer(256))
    clean = torch.randint(3, 256, (1, 10), generator=torch.Generator().manual_seed(1))
    corrupted = clean.clone()
    corrupted[0, 4] = (corrupted[0, 4] + 7) % 256
    return SimpleNamespace(ours=ours, bridge=bridge, clean=clean, corrupted=corrupted,
                           metric=ref.logit_difference(5, 7))


def test_tiny_every_hook_equals_transformer_lens(tiny):
    ids = torch.randint(0, 256, (3, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out, cache = run_with_cache(tiny.ours, ids)
    tl_logits, tl_cache = ref.tl_run(tiny.bridge, ids)
    assert close(out.logits, tl_logits)
    assert_cache_equal(cache, tl_cache, hook_names(tiny.ours))


def test_tiny_logit_lens_with_mid_streams_equals_transformer_lens(tiny):
    """With the mid-block streams the lens reads 2L + 1 = 5 streams, in TL's order
    (0_pre, 0_mid, 1_pre, 1_mid, final_post; tfbook's 0 post is TL's 1 pre)."""
    ids = tiny.clean
    with torch.no_grad():
        _, cache = run_with_cache(tiny.ours, ids)
        ours = logit_lens(tiny.ours, cache, incl_mid=True)
    _, tl_cache = ref.tl_run(tiny.bridge, ids)
    theirs, labels = ref.tl_logit_lens(tiny.bridge, tl_cache, incl_mid=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    assert ours.shape == theirs.shape == (5, 1, 10, 256)
    for i in range(5):
        assert close(ours[i], theirs[i]), labels[i]


# TL's full grid -> tfbook's hook point and what the grid's second axis indexes
TINY_GRIDS = {"resid_pre": ("residual_pre", "positions"), "attn_out": ("attn.out", "positions"),
              "mlp_out": ("ff.out", "positions"), "head_out": ("attn.heads", "heads"),
              "head_q": ("attn.q", "heads"), "head_k": ("attn.k", "heads"),
              "head_v": ("attn.v", "heads")}


@pytest.mark.parametrize("kind", TINY_GRIDS)
def test_tiny_patching_grid_equals_transformer_lens(tiny, kind):
    """Every (layer, position) or (layer, head) of TL's grid, by tfbook's `hooks` + `patch`
    one cell at a time and by `activation_patching` (a layer's cells in one batch); key/value
    grids have H_kv = 2 columns, the others H = 4 or T = 10."""
    point, axis = TINY_GRIDS[kind]
    theirs = ref.tl_patch(tiny.bridge, kind, tiny.clean, tiny.corrupted, tiny.metric)
    width = {"positions": 10, "heads": 2 if kind in ("head_k", "head_v") else 4}[axis]
    assert theirs.shape == (2, width)
    ours = torch.empty(2, width)
    bound = 0.0
    with torch.no_grad():
        _, clean_cache = run_with_cache(tiny.ours, tiny.clean, names=f"*.{point}")
        for layer in range(2):
            for index in range(width):
                fn = patch(clean_cache, **{axis: [index]})
                with hooks(tiny.ours, {f"blocks.{layer}.{point}": fn}):
                    logits = tiny.ours(tiny.corrupted).logits
                ours[layer, index] = tiny.metric(logits)
                bound = max(bound, logit_gap_bound(logits))
    assert torch.allclose(ours, theirs, rtol=0, atol=bound)
    grid = activation_patching(tiny.ours, tiny.clean, tiny.corrupted, tiny.metric, point,
                               progress=False)
    assert torch.allclose(grid.values, theirs.double(), rtol=0, atol=bound)
    assert theirs.max() - theirs.min() > 100 * bound  # some places matter, others do not


def test_tiny_attribution_patching_equals_transformer_lens(tiny):
    ours = attribution_patching(tiny.ours, tiny.clean, tiny.corrupted, tiny.metric,
                                ["attn.heads", "ff.out"])
    assert_attribution_equal(ours, ref.tl_attribution_patching(tiny.bridge, tiny.clean,
                                                               tiny.corrupted, tiny.metric))


def test_tiny_zero_ablation_equals_transformer_lens(tiny):
    """Zeroing head 1 of layer 0 (its output before W_O) through tfbook's `zero` and
    through a TL hook on hook_z gives the same logits."""
    def zero_head(z, hook):
        z = z.clone()
        z[:, :, 1] = 0.0  # TL: (B, T, H, D)
        return z

    with torch.no_grad():
        theirs = tiny.bridge.run_with_hooks(tiny.clean,
                                            fwd_hooks=[("blocks.0.attn.hook_z", zero_head)])
        with hooks(tiny.ours, {"blocks.0.attn.heads": zero(heads=[1])}):
            ours = tiny.ours(tiny.clean).logits
        plain = tiny.ours(tiny.clean).logits
    assert close(ours, theirs)
    assert (ours - plain).abs().max() > 1e3 * HF_RELATIVE_BOUND * plain.abs().max()


def test_compatibility_mode_folds_norms_and_centres_the_unembedding(tiny):
    """What `enable_compatibility_mode()` changes on a Llama: the logits lose their mean over
    the vocabulary at each position (W_U centred), so softmax is unchanged; the residual
    stream is unchanged (RMSNorm: no centring of writing weights); a norm's output lacks its
    weight, which moved into the matrices that read it."""
    compat = ref.boot_bridge(ref.tiny_hf_llama(seed=0), ref.numbered_tokenizer(256),
                             compatibility=True)
    ids = tiny.clean
    logits, cache = ref.tl_run(tiny.bridge, ids)
    c_logits, c_cache = ref.tl_run(compat, ids)
    centred = logits - logits.mean(-1, keepdim=True)
    assert close(c_logits, centred, scale=logits)
    assert (logits.mean(-1)).abs().max() > 1e3 * HF_RELATIVE_BOUND * logits.abs().max()
    assert close(c_logits.log_softmax(-1), logits.log_softmax(-1), scale=logits)
    for name in ("blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"):
        assert close(c_cache[name], cache[name])
    weight = tiny.ours.blocks[1].norm1.weight
    assert close(c_cache["blocks.1.ln1.hook_out"] * weight, cache["blocks.1.ln1.hook_out"])
    assert not close(c_cache["blocks.1.ln1.hook_out"], cache["blocks.1.ln1.hook_out"])
    # direct logit attribution: TL's own logit_attrs adds up to the logit difference only in
    # compatibility mode (the final norm's weight folded into W_U), and there its per-head
    # values are tfbook's
    token, other, gap = 5, 7, (logits[0, -1, 5] - logits[0, -1, 7]).item()
    folded = ref.tl_logit_attrs_total(compat, c_cache, -1, token, other).item()
    unfolded = ref.tl_logit_attrs_total(tiny.bridge, cache, -1, token, other).item()
    assert abs(folded - gap) <= logit_gap_bound(logits)
    assert abs(unfolded - gap) > 1e3 * logit_gap_bound(logits)
    with torch.no_grad():
        _, our_cache = run_with_cache(tiny.ours, ids)
    ours = direct_logit_attribution(tiny.ours, our_cache, token, other).heads()[..., 0]
    theirs = ref.tl_head_logit_attribution(compat, ids, -1, token, other)
    assert close(ours, theirs.double())


# --- nnsight on tfbook's small GPT -----------------------------------------------------------

@pytest.fixture(scope="module")
def small_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig.tiny()).eval()


def test_nnsight_saves_and_overwrites_what_tfbook_hooks_do(small_gpt):
    """NNsight(model) traces the plain torch module: block 1's saved output is tfbook's
    blocks.1.residual_post; a clean block output written into a corrupted run equals
    tfbook's `patch`; zeroing it equals tfbook's `zero`. Bit for bit: the same code runs."""
    traced_model = copy.deepcopy(small_gpt)  # NNsight rewraps every module's forward
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(0, 256, (2, 12), generator=g)
    corrupted = torch.randint(0, 256, (2, 12), generator=g)
    with pinned_threads(1), torch.no_grad():
        saved, logits = ref.nnsight_block_output(traced_model, clean, 1)
        # only the residual stream is watched: watching attn.weights would switch attention
        # to the reference kernel, the nnsight run kept torch's
        out, cache = run_with_cache(small_gpt, clean, names=["blocks.1.residual_post"])
        assert torch.equal(saved, cache["blocks.1.residual_post"])
        assert torch.equal(logits, out.logits)

        clean_h, _ = ref.nnsight_block_output(traced_model, clean, 0)
        patched = ref.nnsight_replace_block_output(traced_model, corrupted, 0, lambda x: clean_h)
        _, clean_cache = run_with_cache(small_gpt, clean, names=["blocks.0.residual_post"])
        with hooks(small_gpt, {"blocks.0.residual_post": patch(clean_cache)}):
            assert torch.equal(patched, small_gpt(corrupted).logits)

        zeroed = ref.nnsight_replace_block_output(traced_model, clean, 1, torch.zeros_like)
        with hooks(small_gpt, {"blocks.1.residual_post": zero()}):
            assert torch.equal(zeroed, small_gpt(clean).logits)
        assert not torch.equal(zeroed, out.logits)
    assert not any(p._forward_hooks or p._forward_pre_hooks
                   for p in hook_points(small_gpt).values())
