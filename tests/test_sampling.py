"""Decoding rules: equal to Hugging Face's processors and sampling step bit for bit, and properties.

References: transformers 5.23's `TemperatureLogitsWarper`, `TopKLogitsWarper`,
`TopPLogitsWarper`, `MinPLogitsWarper`, `RepetitionPenaltyLogitsProcessor`, the processor list
`generate` builds (`_get_logits_processor`), and a tiny randomly initialised GPT-2 run through
`generate(do_sample=True)` (nothing is downloaded). The frequency and presence penalties have
no HF processor: they are checked against OpenAI's formula written out token by token.
Every comparison here is elementwise arithmetic (no sum whose order could change), except the
softmax inside top-p and min-p, which both sides compute with the same torch call on the same
tensor in the same process: bit-equal under any thread count and CPU kernel.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tfbook.generate.sampling import (
    apply_frequency_presence_penalty,
    apply_penalties,
    apply_repetition_penalty,
    apply_temperature,
    entropy,
    filter_logits,
    greedy,
    kept_distribution,
    min_p_filter,
    next_token,
    sample,
    top_k_filter,
    top_p_filter,
    top_p_textbook,
)

KINDS = ["random", "ties", "neg_inf", "peaked", "large_vocab", "single_row", "one_token"]


def make_logits(kind: str, seed: int = 0) -> torch.Tensor:
    """(B, V) float32 logits of one flavour, seeded."""
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(4, 50, generator=g) * 3
    if kind == "ties":  # integer-valued logits: many exact ties, also at the top-k/top-p boundary
        return torch.randint(-3, 4, (4, 20), generator=g).float()
    if kind == "neg_inf":  # tokens already removed by an earlier rule
        x = torch.randn(4, 30, generator=g) * 2
        gone = torch.rand(4, 30, generator=g) < 0.5
        gone[:, 0] = False  # every row keeps at least one finite logit
        return x.masked_fill(gone, -math.inf)
    if kind == "peaked":  # most probabilities underflow to exactly 0 in float32
        return torch.randn(3, 200, generator=g) * 25
    if kind == "large_vocab":
        return torch.randn(2, 5000, generator=g) * 2
    if kind == "single_row":
        return torch.randn(1, 7, generator=g)
    if kind == "one_token":
        return torch.randn(2, 1, generator=g)
    raise AssertionError(kind)


def hf(processors: list, logits: torch.Tensor) -> torch.Tensor:
    """Run HF processors on (B, V) logits the way `generate` calls them."""
    input_ids = torch.zeros(logits.size(0), 1, dtype=torch.long)  # the warpers ignore the ids
    return LogitsProcessorList(processors)(input_ids, logits.clone())


def kept(logits: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(logits)


# --- each rule equals its Hugging Face warper ------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T", [0.01, 0.5, 1.0, 1.7, 100.0])
def test_temperature_equals_hf(kind, T):
    x = make_logits(kind)
    assert torch.equal(apply_temperature(x, T), hf([TemperatureLogitsWarper(T)], x))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1, 2, 5, 20, 10_000])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("filter_value", [-math.inf, -1000.0])
def test_top_k_equals_hf(kind, k, m, filter_value):
    x = make_logits(kind)
    ref = hf([TopKLogitsWarper(k, filter_value=filter_value, min_tokens_to_keep=m)], x)
    assert torch.equal(top_k_filter(x, k, m, filter_value), ref)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", [1e-9, 0.1, 0.5, 0.9, 0.95, 1.0])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("filter_value", [-math.inf, -1000.0])
def test_top_p_equals_hf(kind, p, m, filter_value):
    x = make_logits(kind)
    ref = hf([TopPLogitsWarper(p, filter_value=filter_value, min_tokens_to_keep=m)], x)
    assert torch.equal(top_p_filter(x, p, m, filter_value), ref)


def test_ties_at_the_k_th_value_are_all_kept_as_hf():
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 2.0]])
    for k, n_kept in [(1, 2), (2, 2), (3, 4), (4, 4), (5, 5)]:
        ours = top_k_filter(x, k)
        assert torch.equal(ours, hf([TopKLogitsWarper(k)], x))
        assert int(kept(ours).sum()) == n_kept


def test_top_p_one_is_the_warper_but_skipped_in_a_chain_as_generate_does():
    x = make_logits("peaked")
    hf_warper = hf([TopPLogitsWarper(1.0)], x)
    assert torch.equal(top_p_filter(x, 1.0), hf_warper)
    assert (kept(hf_warper).sum(-1) < x.size(-1)).all()  # p=1 drops the underflowed tokens
    assert torch.equal(filter_logits(x, top_p=1.0), x)  # generate adds no warper at p=1


@pytest.mark.parametrize("shape", [(7,), (2, 3, 40), (1, 1, 1, 9)])
def test_any_leading_shape_equals_hf_row_by_row(shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g) * 2
    rows = x.reshape(-1, shape[-1])  # (N, V): HF's warpers expect (B, V)
    for ours, ref in [
        (top_k_filter(x, 3, 2), hf([TopKLogitsWarper(3, min_tokens_to_keep=2)], rows)),
        (top_p_filter(x, 0.6, 2), hf([TopPLogitsWarper(0.6, min_tokens_to_keep=2)], rows)),
        (top_p_textbook(x, 0.6), top_p_textbook(rows, 0.6)),
        (filter_logits(x, 0.5, 4, 0.8), filter_logits(rows, 0.5, 4, 0.8)),
    ]:
        assert torch.equal(ours, ref.reshape(shape))
    assert greedy(x).shape == sample(x).shape == next_token(x, 0.9).shape == shape[:-1]
    assert entropy(x).shape == shape[:-1] and kept_distribution(x).shape == shape


# --- the chain, in the order generate builds it ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_gpt2() -> GPT2LMHeadModel:
    """A 1-layer GPT-2 with random weights (large init so the distributions are not flat)."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                        initializer_range=0.5, bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(config).eval()


CHAINS = [  # (temperature, top_k, top_p); HF's "off" values are top_k=0 and top_p=1.0
    (0.7, 5, 0.9),
    (1.0, None, 0.5),
    (1.5, 8, None),
    (0.3, None, None),
    (1.0, 20, 1.0),
    (2.0, 1, 0.3),
]


def hf_generation_config(temperature, top_k, top_p, **kwargs) -> GenerationConfig:
    return GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k or 0,
                            top_p=1.0 if top_p is None else top_p, **kwargs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), CHAINS)
def test_chain_equals_the_processor_list_generate_builds(tiny_gpt2, kind, temperature, top_k,
                                                          top_p):
    processors = tiny_gpt2._get_logits_processor(hf_generation_config(temperature, top_k, top_p))
    x = make_logits(kind)
    assert torch.equal(filter_logits(x, temperature, top_k, top_p), hf(processors, x))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
@pytest.mark.parametrize("m", [1, 3])
def test_min_p_equals_hf(kind, min_p, m):
    x = make_logits(kind)
    ref = hf([MinPLogitsWarper(min_p, min_tokens_to_keep=m)], x)
    assert torch.equal(min_p_filter(x, min_p, m), ref)


def test_min_p_keeps_more_where_the_model_is_unsure():
    flat, sharp = torch.zeros(1, 100), torch.zeros(1, 100)
    sharp[0, 0] = 10.0  # one token holds nearly all the mass
    assert int(kept(min_p_filter(flat, 0.1)).sum()) == 100
    assert int(kept(min_p_filter(sharp, 0.1)).sum()) == 1


def history(kind: str, length: int = 9, seed: int = 1) -> torch.Tensor:
    """(B, L) ids of earlier tokens for the rows of make_logits(kind), with repeats."""
    x = make_logits(kind)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, x.size(-1), (x.size(0), length), generator=g)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 2.0])
def test_repetition_penalty_equals_hf(kind, penalty):
    x, ids = make_logits(kind), history(kind)
    ref = RepetitionPenaltyLogitsProcessor(penalty)(ids, x.clone())
    assert torch.equal(apply_repetition_penalty(x, ids, penalty), ref)


def test_repetition_penalty_mask_is_hf_prompt_ignore_length():
    """Padding left out by a mask, as generate leaves out left padding (HF: per-row lengths)."""
    x, ids = make_logits("random"), history("random")
    skip = torch.tensor([0, 3, 5, 9])  # leading ids to ignore in each row
    mask = torch.arange(ids.size(1))[None, :] >= skip[:, None]  # (B, L)
    ref = RepetitionPenaltyLogitsProcessor(1.4, prompt_ignore_length=skip)(ids, x.clone())
    assert torch.equal(apply_repetition_penalty(x, ids, 1.4, mask), ref)
    assert not torch.equal(apply_repetition_penalty(x, ids, 1.4), ref)  # the mask matters


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("frequency", "presence"), [(0.5, 0.0), (0.0, 1.0), (0.3, -0.2)])
def test_frequency_and_presence_are_openais_formula(kind, frequency, presence):
    x, ids = make_logits(kind), history(kind, length=12)
    ours = apply_frequency_presence_penalty(x, ids, frequency, presence)
    f, p = torch.tensor(frequency), torch.tensor(presence)
    for b in range(x.size(0)):
        counts = {}
        for token in ids[b].tolist():
            counts[token] = counts.get(token, 0) + 1
        for j in range(x.size(1)):  # mu_j - c_j * a_freq - [c_j > 0] * a_pres, in float32
            c = counts.get(j, 0)
            expected = x[b, j] - f * float(c) - p * float(c > 0)
            assert torch.equal(ours[b, j], expected), (b, j)
    assert not torch.equal(ours, x)


def test_penalties_chain_repetition_on_everything_then_counts_on_new_tokens():
    x = torch.zeros(1, 5)
    ids = torch.tensor([[0, 1, 1, 2, 2, 2]])  # prompt [0, 1], new tokens [1, 2, 2, 2]
    out = apply_penalties(x + 1.0, ids, repetition_penalty=2.0, frequency_penalty=0.1,
                          presence_penalty=0.2, prompt_length=2)
    # token 0: prompt only -> 1/2; token 1: 1/2 - 0.1 - 0.2; token 2: 1/2 - 0.3 - 0.2
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.2, 0.0, 1.0, 1.0]]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [2, 5])
def test_chain_with_min_tokens_to_keep_equals_hf_in_generate_order(kind, m):
    # generate passes min_tokens_to_keep > 1 only to beam sampling; the order is the same
    ref = [TemperatureLogitsWarper(0.4), TopKLogitsWarper(3, min_tokens_to_keep=m),
           TopPLogitsWarper(0.2, min_tokens_to_keep=m)]
    x = make_logits(kind)
    assert torch.equal(filter_logits(x, 0.4, 3, 0.2, min_tokens_to_keep=m), hf(ref, x))


def test_order_matters_so_the_comparison_can_fail():
    x = make_logits("random")
    swapped = hf([TopPLogitsWarper(0.5), TemperatureLogitsWarper(0.3)], x)
    assert not torch.equal(filter_logits(x, 0.3, None, 0.5), swapped)


# --- sampling: the same draws as Hugging Face ------------------------------------------------


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), CHAINS)
def test_seeded_step_equals_hf_warpers_softmax_multinomial(tiny_gpt2, temperature, top_k, top_p):
    processors = tiny_gpt2._get_logits_processor(hf_generation_config(temperature, top_k, top_p))
    x = make_logits("random")
    picked = set()
    for seed in range(20):
        torch.manual_seed(seed)
        probs = torch.nn.functional.softmax(hf(processors, x), dim=-1)  # generate's sampling step
        ref = torch.multinomial(probs, num_samples=1).squeeze(1)
        torch.manual_seed(seed)
        assert torch.equal(next_token(x, temperature, top_k, top_p), ref)  # global generator
        own = torch.Generator().manual_seed(seed)
        assert torch.equal(next_token(x, temperature, top_k, top_p, generator=own), ref)
        picked.add(tuple(ref.tolist()))
    # top_k=1 leaves one token; otherwise the seed changes the draw (equality is no accident)
    assert (len(picked) == 1) == (top_k == 1)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [*CHAINS, (0.0, None, None)])
def test_generate_scores_and_tokens_are_ours(tiny_gpt2, temperature, top_k, top_p):
    """HF's generate on a tiny model: every step's scores and token, replayed from its logits."""
    prompt = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(2))
    outputs = dict(max_new_tokens=6, pad_token_id=0, output_scores=True, output_logits=True,
                   return_dict_in_generate=True)
    if temperature == 0:
        config = GenerationConfig(do_sample=False, **outputs)
    else:
        config = hf_generation_config(temperature, top_k, top_p, **outputs)
    torch.manual_seed(123)
    out = tiny_gpt2.generate(prompt, attention_mask=torch.ones_like(prompt),
                             generation_config=config)
    new_tokens = out.sequences[:, prompt.size(1):]  # (B, 6)
    torch.manual_seed(123)
    for step, raw in enumerate(out.logits):
        if temperature > 0:
            assert torch.equal(filter_logits(raw, temperature, top_k, top_p), out.scores[step])
        assert torch.equal(next_token(raw, temperature, top_k, top_p), new_tokens[:, step])


@pytest.mark.parametrize(("temperature", "top_k", "min_p", "penalty"),
                         [(0.0, None, None, 1.5), (0.8, None, 0.1, 1.3), (1.2, 20, 0.05, 0.8)])
def test_generate_with_repetition_penalty_and_min_p_replays_as_ours(tiny_gpt2, temperature,
                                                                    top_k, min_p, penalty):
    """HF's generate with its repetition and min-p processors: scores and tokens, replayed."""
    prompt = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(2))
    outputs = dict(max_new_tokens=8, pad_token_id=0, output_scores=True, output_logits=True,
                   return_dict_in_generate=True, repetition_penalty=penalty)
    if temperature == 0:
        config = GenerationConfig(do_sample=False, **outputs)
    else:
        config = hf_generation_config(temperature, top_k, None, min_p=min_p, **outputs)
    torch.manual_seed(123)
    out = tiny_gpt2.generate(prompt, attention_mask=torch.ones_like(prompt),
                             generation_config=config)
    T = prompt.size(1)
    torch.manual_seed(123)
    for step, raw in enumerate(out.logits):
        so_far = out.sequences[:, : T + step]  # (B, T + step): what the penalty reads
        penalised = apply_penalties(raw, so_far, repetition_penalty=penalty)
        if temperature > 0:
            ours = filter_logits(penalised, temperature, top_k, None, min_p=min_p)
        else:
            ours = penalised
        assert torch.equal(ours, out.scores[step])
        chosen = next_token(penalised, temperature, top_k, None, min_p=min_p)
        assert torch.equal(chosen, out.sequences[:, T + step])


def test_a_generator_leaves_the_global_one_alone_and_greedy_draws_nothing():
    x = make_logits("random")
    state = torch.get_rng_state()
    sample(x, generator=torch.Generator().manual_seed(0))
    next_token(x, temperature=0.0)
    assert torch.equal(torch.get_rng_state(), state)
    sample(x)
    assert not torch.equal(torch.get_rng_state(), state)


def test_temperature_zero_is_greedy_everywhere():
    x = make_logits("ties")  # ties at the top: the first maximum wins, as torch.argmax
    ids = torch.argmax(x, dim=-1)
    assert torch.equal(next_token(x, 0.0, top_k=3, top_p=0.5), ids)
    one_hot = torch.nn.functional.one_hot(ids, x.size(-1)).float()
    assert torch.equal(kept_distribution(x, temperature=0.0), one_hot)
    assert torch.equal(sample(filter_logits(x, temperature=0.0)), ids)


# --- the textbook nucleus and Hugging Face's rule ----------------------------------------------


def nucleus_disagreement(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept sets of HF's rule (our top_p_filter, equal to HF above) and of the textbook."""
    return kept(top_p_filter(x, p)), kept(top_p_textbook(x, p))


def check_disagreement_is_at_the_boundary(x: torch.Tensor, p: float) -> torch.Tensor:
    """Assert the two kept sets are nested and differ only where the exact mass above is ~p.

    Returns the number of tokens HF keeps minus the textbook, per row.
    """
    hf_kept, tb_kept = nucleus_disagreement(x, p)
    assert (hf_kept <= tb_kept).all(-1).logical_or((tb_kept <= hf_kept).all(-1)).all()  # nested
    probs = x.double().softmax(-1)  # (B, V) float64 reference probabilities
    for b in (hf_kept != tb_kept).any(-1).nonzero().flatten().tolist():
        disputed = x[b][hf_kept[b] != tb_kept[b]]  # (n,) logits of the disputed tokens
        more_likely = x[b][None, :] > disputed[:, None]  # (n, V)
        mass_above = (probs[b][None, :] * more_likely).sum(-1)  # (n,)
        # float32 probabilities over ~50k tokens are off by ~1e-5: only such tokens may differ
        assert ((mass_above - p).abs() < 1e-4).all(), (b, mass_above.tolist())
    return hf_kept.sum(-1) - tb_kept.sum(-1)


def test_textbook_and_hf_nucleus_agree_in_float64():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20, 50257, generator=g, dtype=torch.float64) * 4
    for p in (0.5, 0.9, 0.95):
        hf_kept, tb_kept = nucleus_disagreement(x, p)
        assert torch.equal(hf_kept, tb_kept)


def test_hf_keeps_one_more_boundary_token_than_the_textbook_in_float32():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 50257, generator=g) * 4  # a GPT-2-sized vocabulary
    p = 0.95
    extra = check_disagreement_is_at_the_boundary(x, p)
    assert (extra == 1).any()  # such a row exists among these 20
    b = int((extra == 1).nonzero()[0])
    hf_kept, tb_kept = nucleus_disagreement(x[b : b + 1], p)
    (token,) = (hf_kept & ~tb_kept)[0].nonzero()[0].tolist()
    # that token is the most likely one the textbook drops, and the only difference
    assert float(x[b, token]) == float(x[b][~tb_kept[0]].max())
    assert torch.equal(hf_kept[0] & tb_kept[0], tb_kept[0])
    # in float64 both keep it too: here HF's float32 rule gives the exact answer
    exact = kept(top_p_textbook(x[b : b + 1].double(), p))
    assert torch.equal(exact, hf_kept)
    # elsewhere (rows where the count is the same) the two sets are identical
    for row in (extra == 0).nonzero().flatten().tolist():
        hf_row, tb_row = nucleus_disagreement(x[row : row + 1], p)
        assert torch.equal(hf_row, tb_row)


def test_measured_disagreement_fraction_on_random_logits(record_property):
    """Informative: how often the float32 rules disagree (printed with -s, not a threshold)."""
    g = torch.Generator().manual_seed(4)
    report = []
    for V, scale, p in [(1000, 2.0, 0.9), (50257, 2.0, 0.95), (50257, 4.0, 0.95),
                        (50257, 4.0, 0.99)]:
        x = torch.randn(25, V, generator=g) * scale
        extra = check_disagreement_is_at_the_boundary(x, p)
        exact = kept(top_p_textbook(x.double(), p))  # float64: the two rules agree there
        hf_kept, tb_kept = nucleus_disagreement(x, p)
        line = (f"V={V} scale={scale} p={p}: differ in {int((extra != 0).sum())}/25 rows "
                f"(HF keeps more in {int((extra > 0).sum())}, fewer in {int((extra < 0).sum())},"
                f" by up to {int(extra.abs().max())} token(s));"
                f" off the float64 set: HF {int((hf_kept != exact).any(-1).sum())}, textbook "
                f"{int((tb_kept != exact).any(-1).sum())}")
        report.append(line)
    record_property("nucleus_disagreement", "; ".join(report))
    print("\n".join(report))


# --- properties ------------------------------------------------------------------------------

logit_rows = st.lists(st.floats(-20, 20, width=32), min_size=1, max_size=40).map(
    lambda values: torch.tensor([values])  # (1, V)
)


@settings(max_examples=150, deadline=None)
@given(x=logit_rows, k=st.integers(1, 50))
def test_top_k_keeps_at_least_k_and_exactly_k_without_ties(x, k):
    n_kept = int(kept(top_k_filter(x, k)).sum())
    V = x.size(-1)
    assert n_kept >= min(k, V)
    if x.unique().numel() == V:
        assert n_kept == min(k, V)


@settings(max_examples=150, deadline=None)
@given(x=logit_rows, p=st.floats(1e-6, 1.0))
def test_top_p_kept_mass_reaches_p_and_the_textbook_set_is_smallest(x, p):
    probs = x.double().softmax(-1)  # float64 reference probabilities of the same logits
    tol = 1e-5  # the rules work in float32
    for rule in (top_p_filter, top_p_textbook):
        assert float(probs[kept(rule(x, p))].sum()) >= p - tol
    tb = kept(top_p_textbook(x, p))[0]
    without_least = probs[0][tb].sum() - probs[0][tb].min()
    assert float(without_least) < p + tol


@settings(max_examples=150, deadline=None)
@given(x=logit_rows, temperature=st.floats(0.05, 5.0), top_k=st.none() | st.integers(1, 50),
       top_p=st.none() | st.floats(1e-6, 1.0), m=st.integers(1, 4))
def test_kept_distribution_is_renormalised_and_keeps_the_most_likely(x, temperature, top_k,
                                                                    top_p, m):
    probs = kept_distribution(x, temperature, top_k, top_p, m)
    keep = kept(filter_logits(x, temperature, top_k, top_p, m))
    assert torch.allclose(probs.sum(-1), torch.ones(1), atol=1e-5)
    assert (probs[~keep] == 0).all()
    assert float(x[keep].max()) == float(x.max())  # a most likely token always stays
    assert int(keep.sum()) >= min(m, x.size(-1))
    scaled = (x.double() / temperature).softmax(-1)[keep]
    assert torch.allclose(probs[keep].double(), scaled / scaled.sum(), atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(x=logit_rows)
def test_entropy_equals_torch_categorical(x):
    x = x.masked_fill(x < -15, -math.inf)  # some removed tokens
    x[0, 0] = 0.0  # one finite logit at least
    ref = torch.distributions.Categorical(logits=x.double()).entropy()
    assert torch.allclose(entropy(x).double(), ref, atol=1e-5)


def test_entropy_of_uniform_is_log_v_and_filtering_lowers_it():
    x = torch.zeros(1, 64)
    assert torch.allclose(entropy(x), torch.tensor([math.log(64)]))
    y = make_logits("random")
    assert (entropy(filter_logits(y, top_k=5)) < entropy(y)).all()


# --- bad input -------------------------------------------------------------------------------

X = torch.randn(2, 5)
BAD = [
    (lambda: apply_temperature(X, 0.0), ValueError, "temperature 0 means greedy"),
    (lambda: apply_temperature(X, -0.5), ValueError, r"finite number >= 0.*got -0.5"),
    (lambda: next_token(X, float("nan")), ValueError, r"temperature.*got nan"),
    (lambda: filter_logits(X, float("inf")), ValueError, r"temperature.*got inf"),
    (lambda: next_token(X, "0.7"), TypeError, r"temperature must be a number.*'0.7'.*str"),
    (lambda: next_token(X, None), TypeError, r"temperature must be a number.*NoneType"),
    (lambda: next_token(X, True), TypeError, r"temperature.*bool"),
    (lambda: top_k_filter(X, 0), ValueError, r"top_k must be an int >= 1.*top_k=0.*got 0"),
    (lambda: next_token(X, 1.0, top_k=-3), ValueError, r"top_k must be an int >= 1.*got -3"),
    (lambda: top_k_filter(X, 2.0), TypeError, r"top_k must be an int.*2.0.*float"),
    (lambda: filter_logits(X, top_k=True), TypeError, r"top_k must be an int.*bool"),
    (lambda: top_p_filter(X, 0.0), ValueError, r"top_p must lie in \(0, 1\].*got 0.0"),
    (lambda: top_p_textbook(X, 1.5), ValueError, r"top_p must lie in \(0, 1\].*got 1.5"),
    (lambda: filter_logits(X, top_p=-0.1), ValueError, r"top_p.*got -0.1"),
    (lambda: next_token(X, top_p=float("nan")), ValueError, r"top_p.*got nan"),
    (lambda: top_p_filter(X, "0.9"), TypeError, r"top_p must be a number.*str"),
    (lambda: top_k_filter(X, 2, 0), ValueError, r"min_tokens_to_keep must be an int >= 1.*0"),
    (lambda: filter_logits(X, top_p=0.5, min_tokens_to_keep=1.5), TypeError,
     r"min_tokens_to_keep.*float"),
    (lambda: top_k_filter(X, 2, filter_value=float("nan")), ValueError, "filter_value.*nan"),
    (lambda: top_p_filter(X, 0.5, filter_value="low"), TypeError, "filter_value.*str"),
    (lambda: greedy([[1.0, 2.0]]), TypeError, "logits must be a torch.Tensor.*list"),
    (lambda: sample(torch.tensor([[1, 2]])), TypeError, "floating-point.*torch.int64"),
    (lambda: top_k_filter(torch.tensor(1.0), 1), ValueError, r"\(\.\.\., V\).*got shape \(\)"),
    (lambda: filter_logits(torch.ones(2, 0)), ValueError, r"V >= 1, got shape \(2, 0\)"),
    (lambda: entropy(torch.tensor([[0.0, float("nan")]])), ValueError, "1 NaN value"),
    (lambda: sample(torch.full((2, 3), -math.inf)), ValueError,
     r"no probability distribution in 2 row\(s\)"),
    (lambda: kept_distribution(torch.tensor([[0.0, math.inf]])), ValueError,
     "at least one finite logit and no \\+inf"),
    (lambda: sample(X, generator=0), TypeError, "generator must be a torch.Generator.*int"),
    (lambda: apply_temperature(X, 1e-40), ValueError,
     r"temperature 1e-40 is too small for these logits.*overflows torch.float32.*temperature=0"),
    (lambda: next_token(X, 1e-300), ValueError, r"temperature 1e-300 is too small"),
    (lambda: min_p_filter(X, 1.5), ValueError, r"min_p must lie in \[0, 1\].*got 1.5"),
    (lambda: filter_logits(X, min_p="0.1"), TypeError, r"min_p must be a number.*str"),
    (lambda: apply_repetition_penalty(X, torch.tensor([[1], [2]]), 0.0), ValueError,
     r"repetition_penalty must be a finite number > 0, got 0.0"),
    (lambda: apply_repetition_penalty(X, torch.tensor([[1], [2]]), None), TypeError,
     r"repetition_penalty must be a finite number > 0, got None"),
    (lambda: apply_repetition_penalty(X, torch.tensor([[1.0], [2.0]]), 1.2), TypeError,
     r"ids must be an integer tensor .* got dtype torch.float32"),
    (lambda: apply_repetition_penalty(X, torch.tensor([1, 2]), 1.2), ValueError,
     r"ids must have shape \(\.\.\., L\) with the leading shape of the logits \(2,\), got \(2,\)"),
    (lambda: apply_repetition_penalty(X, torch.tensor([[1], [5]]), 1.2), ValueError,
     r"ids must lie in \[0, V=5\), got 5"),
    (lambda: apply_frequency_presence_penalty(X, torch.tensor([[1], [2]]), math.inf), ValueError,
     r"frequency_penalty must be a finite number, got inf"),
    (lambda: apply_penalties(X, torch.tensor([[1], [2]]), presence_penalty="1"), TypeError,
     r"presence_penalty must be a finite number, got '1'"),
    (lambda: apply_penalties(X, torch.tensor([[1], [2]]), prompt_length=2), ValueError,
     r"prompt_length must be an int in \[0, L=1\], got 2"),
    (lambda: apply_repetition_penalty(X, torch.tensor([[1], [2]]), 1.2, torch.ones(2, 3)),
     ValueError, r"mask must be a tensor of the shape of ids \(2, 1\), got \(2, 3\)"),
]


@pytest.mark.parametrize(("call", "error", "match"), BAD)
def test_bad_input_raises_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_numpy_numbers_are_accepted():
    x = make_logits("random")
    assert torch.equal(filter_logits(x, np.float32(0.5), np.int64(4), np.float64(0.9)),
                       filter_logits(x, 0.5, 4, 0.9))
