"""Attention-pattern scores of every head (tfbook.inspect.scores)."""

import pytest
import torch
from transformer_lens import head_detector

from tests.inspect_models import gamma, tiny_decoder
from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer
from tfbook.inspect import run_with_cache
from tfbook.inspect.scores import (
    KINDS,
    attention_weights,
    best_head,
    detection_mask,
    head_scores,
    heads_of_kind,
    pattern_score,
    repeated_random_tokens,
    score_rounding,
    scores_from_cache,
    tl_detector_score,
    uniform_baseline,
)
from tfbook.models.bert import Bert, BertConfig

TL_KINDS = ("previous_token", "duplicate_token", "induction")  # head_detector's names too


@pytest.fixture(scope="module", params=("gpt", "llama"))
def model(request):
    return tiny_decoder(request.param)


@pytest.fixture(scope="module")
def smollm2():
    model, tok = load_smollm2(), load_smollm2_tokenizer()
    ids = repeated_random_tokens(model.config.vocab_size, 25, 4, bos_id=tok.bos_id,
                                 exclude=tok.special_tokens.values())
    return model, ids, head_scores(model, ids)


def test_repeated_random_tokens():
    ids = repeated_random_tokens(100, 10, 3, bos_id=1, exclude=[0, 2, 3], seed=5)
    assert ids.shape == (3, 21) and ids.dtype == torch.long
    assert (ids[:, 0] == 1).all() and torch.equal(ids[:, 1:11], ids[:, 11:])
    body = ids[:, 1:11]
    assert all(len(set(row.tolist())) == 10 for row in body)  # distinct: one earlier copy
    assert not torch.isin(body, torch.tensor([0, 1, 2, 3])).any()
    assert torch.equal(ids, repeated_random_tokens(100, 10, 3, bos_id=1, exclude=[0, 2, 3],
                                                   seed=5))
    assert not torch.equal(ids, repeated_random_tokens(100, 10, 3, bos_id=1, exclude=[0, 2, 3],
                                                       seed=6))
    assert repeated_random_tokens(50, 4, 2).shape == (2, 8)  # no BOS


def test_masks_by_hand():
    ids = torch.tensor([[1, 5, 6, 5, 6]])
    pairs = {k: detection_mask(ids, k)[0].nonzero().tolist() for k in KINDS}
    assert pairs["previous_token"] == [[1, 0], [2, 1], [3, 2], [4, 3]]
    assert pairs["first_token"] == [[1, 0], [2, 0], [3, 0], [4, 0]]
    assert pairs["duplicate_token"] == [[3, 1], [4, 2]]  # 5 and 6 seen before
    assert pairs["induction"] == [[3, 2], [4, 3]]  # the tokens after them


def test_masks_are_transformer_lens_patterns():
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        ids = torch.randint(0, 6, (1, 12), generator=gen)  # many repeats, some adjacent
        for kind in TL_KINDS:
            theirs = getattr(head_detector, f"get_{kind}_head_detection_pattern")(ids)
            assert torch.equal(detection_mask(ids, kind)[0], theirs.bool()), kind


def test_a_perfect_previous_token_head_scores_one():
    T = 7
    exact = torch.zeros(1, 1, T, T)
    exact[0, 0, 0, 0] = 1.0  # the first query can only see itself
    exact[0, 0, torch.arange(1, T), torch.arange(T - 1)] = 1.0
    ids = torch.arange(T)[None]
    score = pattern_score(exact, detection_mask(ids, "previous_token"))
    assert score.tolist() == [1.0]
    # only query 1's previous token is the first one: 1 of the T - 1 scored queries
    sink = pattern_score(exact, detection_mask(ids, "first_token"))
    assert sink.item() == pytest.approx(1 / (T - 1), rel=2 * gamma(1))


def test_uniform_head_by_hand():
    T = 9
    ids = torch.arange(T)[None]
    harmonic = sum(1 / k for k in range(1, T + 1))
    base = uniform_baseline(ids, ["previous_token", "first_token"])
    assert base["previous_token"] == pytest.approx((harmonic - 1) / (T - 1), rel=1e-12)
    assert base["first_token"] == pytest.approx((harmonic - 1) / (T - 1), rel=1e-12)
    rep = repeated_random_tokens(50, 4, 1, bos_id=0)  # T = 9, queries 5..8 scored
    assert uniform_baseline(rep, ["induction"])["induction"] == pytest.approx(
        sum(1 / (t + 1) for t in range(5, 9)) / 4, rel=1e-12)


def test_scores_lie_in_unit_interval_and_pool_the_batch(model):
    ids = repeated_random_tokens(256, 8, 3, bos_id=1, seed=1)
    scores = head_scores(model, ids)
    assert set(scores) == set(KINDS)
    for s in scores.values():
        assert s.shape == (2, 4) and (s >= 0).all() and (s <= 1).all()
    # every sequence has the same scored queries, so the pooled score is their mean
    alone = [head_scores(model, ids[i:i + 1]) for i in range(3)]
    for kind in KINDS:
        mean = torch.stack([a[kind] for a in alone]).mean(0)
        assert torch.allclose(scores[kind], mean, atol=4 * gamma(3 * 17))
    _, cache = run_with_cache(model, ids, names="*.attn.weights")
    again = scores_from_cache(cache, ids, ["induction"])
    assert torch.allclose(again["induction"], scores["induction"], atol=gamma(17 * 17))


def test_equal_to_transformer_lens_detector(model):
    """TL's "mul" score = ours x |Q| / T: the same masked mass over a larger denominator."""
    ids = repeated_random_tokens(256, 8, 1, bos_id=1, seed=2)
    T = ids.size(1)
    _, cache = run_with_cache(model, ids, names="*.attn.weights")
    weights = attention_weights(cache)  # (L, 1, H, T, T)
    ours = scores_from_cache(cache, ids, TL_KINDS)
    for kind in TL_KINDS:
        detection = getattr(head_detector, f"get_{kind}_head_detection_pattern")(ids)
        theirs = torch.tensor([[head_detector.compute_head_attention_similarity_score(
            weights[i, 0, h], detection, exclude_bos=False, exclude_current_token=False,
            error_measure="mul") for h in range(4)] for i in range(2)])
        assert torch.allclose(tl_detector_score(ours[kind], ids, kind), theirs,
                              atol=4 * gamma(T * T)), kind
    # a perfect induction head: 1 here, R / (2R + 1) there
    assert tl_detector_score(torch.ones(1), ids, "induction").item() == pytest.approx(8 / 17)


def test_heads_of_kind_with_a_margin():
    scores = torch.tensor([[0.52, 0.505, 0.495], [0.3, 0.9, 0.509]])
    found = heads_of_kind(scores, threshold=0.5, bound=0.01)
    assert [(i, h) for i, h, _ in found.heads] == [(1, 1), (0, 0)]  # highest first
    assert sorted((i, h) for i, h, _ in found.undecided) == [(0, 1), (0, 2), (1, 2)]
    assert best_head(scores, bound=0.1)[:2] == (1, 1)
    assert best_head(scores, bound=0.1)[3] == pytest.approx(0.38)
    with pytest.raises(ValueError, match="could\\s+swap"):
        best_head(torch.tensor([[0.9, 0.89]]), bound=0.01)


def test_score_rounding_is_float32_sized(model):
    ids = repeated_random_tokens(256, 8, 2, bos_id=1)
    rounding = score_rounding(model, ids)
    assert set(rounding) == set(KINDS)
    assert all(0 <= r < 1e-5 for r in rounding.values())


def test_scores_need_weights(model):
    ids = torch.randint(0, 256, (1, 6))
    with pytest.raises(ValueError, match="attention weights"):
        head_scores(torch.nn.Linear(4, 4), ids)
    _, cache = run_with_cache(model, ids, names="*.residual_post")
    with pytest.raises(ValueError, match=r"attention weights.*attn\.weights"):
        scores_from_cache(cache, ids)
    # an encoder has them too: BERT's heads are scored the same way
    bert = Bert(BertConfig(vocab_size=50, max_len=16, n_layers=1, n_heads=2, d_model=8,
                           d_ff=16)).eval()
    assert head_scores(bert, torch.randint(0, 50, (1, 6)), ["previous_token"])[
        "previous_token"].shape == (1, 2)


def test_bad_input(model):
    ids = repeated_random_tokens(256, 4, 1)
    with pytest.raises(ValueError, match="kind must be one of"):
        detection_mask(ids, "copying")
    with pytest.raises(ValueError, match="kinds must be some of"):
        head_scores(model, ids, ["copying"])
    with pytest.raises(TypeError, match="token ids"):
        head_scores(model, ids.float())
    with pytest.raises(ValueError, match="no query has a key"):
        head_scores(model, torch.arange(8)[None], ["induction"])  # nothing repeats
    with pytest.raises(ValueError, match="mask must be"):
        pattern_score(torch.zeros(1, 2, 5, 5), torch.zeros(1, 4, 4, dtype=torch.bool))
    _, cache = run_with_cache(model, ids, names="*.attn.weights")
    with pytest.raises(ValueError, match="not those of a run"):
        scores_from_cache(cache, ids[:, :6])
    with pytest.raises(ValueError, match="distinct"):
        repeated_random_tokens(10, 9, 1, bos_id=0, exclude=[1, 2])
    with pytest.raises(ValueError, match="bos_id"):
        repeated_random_tokens(10, 3, 1, bos_id=10)
    with pytest.raises(ValueError, match="bound must be >= 0"):
        heads_of_kind(torch.zeros(2, 2), 0.5, -1.0)
    with pytest.raises(TypeError, match=r"\(L, H\)"):
        heads_of_kind(torch.zeros(4), 0.5, 0.0)


def test_smollm2_heads(smollm2):
    """Induction heads exist, late, after earlier previous-token heads (Olsson et al. 2022);
    the best of each kind is clear of the runner-up by far more than the rounding."""
    model, ids, scores = smollm2
    assert ids.shape == (4, 51) and all(s.shape == (30, 9) for s in scores.values())
    bound = 1e-4  # far above the float32-vs-float64 distance (score_rounding), about 5e-7
    layer, head, score, lead = best_head(scores["induction"], bound)
    assert score > 0.5 + bound
    base = uniform_baseline(ids)
    assert score > 10 * base["induction"]
    previous = heads_of_kind(scores["previous_token"], 0.5, bound).heads
    assert previous and min(i for i, _, _ in previous) < layer
    # TransformerLens's detector picks the same best induction head on the first sequence
    _, cache = run_with_cache(model, ids[:1], names="*.attn.weights", last_only=True)
    weights = attention_weights(cache)[:, 0]  # (L, H, T, T)
    detection = head_detector.get_induction_head_detection_pattern(ids[:1])
    theirs = torch.tensor([[head_detector.compute_head_attention_similarity_score(
        weights[i, h], detection, exclude_bos=False, exclude_current_token=False,
        error_measure="mul") for h in range(9)] for i in range(30)])
    ours = scores_from_cache(cache, ids[:1], ["induction"])["induction"]
    assert divmod(int(theirs.argmax()), 9) == divmod(int(ours.argmax()), 9) == (layer, head)
    # a sink: some head puts nearly all its attention on the first (BOS) token
    assert heads_of_kind(scores["first_token"], 0.9, bound).heads
