"""Beam search: the batched one equal to Hugging Face's generate(num_beams=K) bit for bit, the
plain one equal to greedy at K = 1 and to exhaustive search when the beam holds everything.

Reference: transformers 5.23's `generate(num_beams=K, do_sample=False)` on a tiny randomly
initialised `LlamaForCausalLM` (attn_implementation="sdpa"), copied into a tfbook GPT with
`tfbook_from_hf_llama` (nothing is downloaded). The end token is one the model really emits
(taken from a greedy run), so beams finish early and the stopping rules matter.

On left-padded batches HF's sdpa packs the query heads of a one-token query into their
key/value group (`pack_gqa`) when a padding mask is present, where tfbook repeats the key/value
heads: the same function, rounded differently in the last bit. The padded comparisons set
TRANSFORMERS_SDPA_FORCE_GQA=1, which makes HF repeat the heads inside torch's kernel
(`enable_gqa`) as tfbook does; the beam search itself is untouched (the unpadded comparison
runs HF's default path, and a model without grouped heads needs no switch either).
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from tests.pinned_threads import pinned_threads
from tfbook.checkpoints.hf_llama import tfbook_from_hf_llama
from tfbook.generate.beam import beam_search, beam_search_plain
from tfbook.generate.search import generate, left_pad
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.models.transformer import Transformer, TransformerConfig


@pytest.fixture(autouse=True, params=[1, 2], ids=["1-thread", "2-threads"])
def pinned(request):
    """Bit-equal comparisons with HF need both sides on the same kernels in the same order:
    the same process and a pinned thread count; every test runs with 1 and with 2 threads."""
    with pinned_threads(request.param):
        yield


PAD = 3  # HF's pad_token_id in these tests (not 0: see test_pad_id_0_pads_with_the_end_id)
PROMPTS = [[5, 17, 99, 250, 8, 41], [12, 200, 7], [9]]  # left-padded to 6: B > 1, 3 lengths
N = 10  # new tokens


def tiny_hf_llama(n_kv_heads: int = 2) -> LlamaForCausalLM:
    """A random Llama (V 300, C 64, 2 layers, 4 heads); weights N(0, 0.3) for varied tokens."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=n_kv_heads, max_position_embeddings=64,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=PAD,
        initializer_range=0.3, attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def models() -> tuple[LlamaForCausalLM, GPT]:
    hf = tiny_hf_llama()
    return hf, tfbook_from_hf_llama(hf)


@pytest.fixture(scope="module")
def batch(models) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded prompts and an end token the model emits (row 0's 2nd greedy token)."""
    ids, mask = left_pad(PROMPTS, PAD)
    greedy = generate(models[1], ids, 4, attention_mask=mask).new_tokens  # (B, 4)
    return ids, mask, int(greedy[0, 1])


def assert_same_as_hf(hf, ours, ids, mask, K, end_ids, pad_id=PAD, num_return_sequences=None,
                      **settings):
    """HF's generate and ours: sequences identical, scores bit-equal; returns ours.

    settings: length_penalty and early_stopping, which both take under the same names.
    """
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=mask.long(), num_beams=K,
                          num_return_sequences=num_return_sequences or K, do_sample=False,
                          max_new_tokens=N, eos_token_id=end_ids, pad_token_id=pad_id,
                          output_scores=True, return_dict_in_generate=True, **settings)
    out = beam_search(ours, ids, K, N, attention_mask=mask, end_ids=end_ids, pad_id=pad_id,
                      num_return_sequences=num_return_sequences, **settings)
    assert out.sequences.shape == ref.sequences.shape
    assert torch.equal(out.sequences, ref.sequences)
    assert torch.equal(out.scores, ref.sequences_scores)
    return out


GRID = list(itertools.product([2, 3, 4], [0.0, 1.0, 2.0, -0.5], [True, False, "never"]))


def test_equals_hf_generate_on_a_padded_batch(models, batch, monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")  # see the module docstring
    hf, ours = models
    ids, mask, end = batch
    results = {}
    for K, lp, es in GRID:
        out = assert_same_as_hf(hf, ours, ids, mask, K, [end], length_penalty=lp,
                                early_stopping=es)
        results[K, lp, es] = (out.sequences.tolist(), out.lengths.tolist())
    # the grid is not vacuous: beams ended early, a prompt's search stopped before N tokens,
    # and both the stopping rule and the length penalty changed answers
    B = len(PROMPTS)
    assert any(torch.tensor(lengths).view(B, -1).amax(1).lt(N).any() for _, lengths in
               results.values())
    assert any(results[K, lp, True] != results[K, lp, False] for K, lp, _ in GRID)
    assert any(results[K, 0.0, es] != results[K, 2.0, es] for K, _, es in GRID)


def test_never_can_search_longer_than_false(models, monkeypatch):
    """With length_penalty > 0, "never" bounds a running beam by its score at N tokens."""
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    hf, ours = models
    ids, mask = left_pad(PROMPTS, PAD)
    end = int(generate(ours, ids, 3, attention_mask=mask).new_tokens[1, 2])
    for lp in (1.0, 2.0):
        heuristic = assert_same_as_hf(hf, ours, ids, mask, 2, [end], length_penalty=lp,
                                      early_stopping=False)
        never = assert_same_as_hf(hf, ours, ids, mask, 2, [end], length_penalty=lp,
                                  early_stopping="never")
        assert not torch.equal(heuristic.scores, never.scores)


def test_equals_hf_generate_without_padding_on_hf_default_path(models, batch):
    hf, ours = models
    _, _, end = batch
    ids = torch.tensor([PROMPTS[0], [7, 7, 1, 250, 99, 5]])  # B = 2, same length: no mask
    mask = torch.ones_like(ids, dtype=torch.bool)
    for K, lp, es in [(3, 1.0, False), (4, 2.0, "never"), (2, 0.0, True)]:
        assert_same_as_hf(hf, ours, ids, mask, K, [end], length_penalty=lp, early_stopping=es)


def test_grouped_heads_need_no_switch_without_grouping():
    hf = tiny_hf_llama(n_kv_heads=4)  # one key/value head per query head: no pack_gqa
    ours = tfbook_from_hf_llama(hf)
    ids, mask = left_pad(PROMPTS, PAD)
    end = int(generate(ours, ids, 3, attention_mask=mask).new_tokens[1, 2])
    assert_same_as_hf(hf, ours, ids, mask, 3, [end], length_penalty=1.0, early_stopping=False)


def test_two_end_ids_fewer_returned_and_pad_id_0(models, batch, monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    hf, ours = models
    ids, mask, end = batch
    other = int(generate(ours, ids, 4, attention_mask=mask).new_tokens[2, 3])
    # two end ids: 3K candidates per step
    assert_same_as_hf(hf, ours, ids, mask, 3, [end, other], length_penalty=0.5,
                      early_stopping=False)
    out = assert_same_as_hf(hf, ours, ids, mask, 4, [end], num_return_sequences=2,
                            length_penalty=1.0, early_stopping="never")
    assert out.sequences.size(0) == 2 * len(PROMPTS)


def test_pad_id_0_pads_with_the_end_id(models, batch, monkeypatch):
    """HF writes `pad_token_id or eos_token_id[0]`: with pad id 0, the end id pads."""
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    hf, ours = models
    ids, mask, end = batch
    out = assert_same_as_hf(hf, ours, ids, mask, 3, [end], pad_id=0, length_penalty=0.0,
                            early_stopping=False)
    short = int(out.lengths.argmin())
    assert out.lengths[short] < out.new_tokens.size(1)  # one sequence is padded
    assert (out.new_tokens[short, out.lengths[short] :] == end).all()


def test_one_beam_is_greedy_until_an_end_token(models, batch, monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    hf, ours = models
    ids, mask, _ = batch
    with torch.no_grad():  # HF's generate runs greedy search at num_beams=1
        ref = hf.generate(ids, attention_mask=mask.long(), num_beams=1, do_sample=False,
                          max_new_tokens=N, eos_token_id=None, pad_token_id=PAD)
    out = beam_search(ours, ids, 1, N, attention_mask=mask)
    assert torch.equal(out.sequences, ref)


def test_scores_are_the_normalised_log_probabilities_of_the_sequences(models, batch):
    _, ours = models
    ids, mask, end = batch
    out = beam_search(ours, ids, 3, N, length_penalty=1.5, end_ids=[end], attention_mask=mask)
    T = ids.size(1)
    for row in range(out.sequences.size(0)):
        n = int(out.lengths[row])
        seq = out.sequences[row : row + 1, : T + n]  # (1, T + n)
        real = mask[row // 3][None]  # (1, T)
        full = torch.cat([real, torch.ones(1, n, dtype=torch.bool)], dim=1)
        positions = (full.long().cumsum(-1) - 1).clamp_min(0)
        with torch.no_grad():
            logits = ours(seq, attention_mask=full, positions=positions).logits  # (1, T + n, V)
        log_probs = F.log_softmax(logits, dim=-1)
        picked = log_probs[0, T - 1 : T + n - 1].gather(-1, seq[0, T:, None])  # (n, 1)
        expected = picked.sum() / n**1.5
        assert math.isclose(float(out.scores[row]), float(expected), rel_tol=1e-5)


# ---------------------------------------------------------------- the plain one


@pytest.fixture(scope="module", params=["gpt", "llama"])
def small(request) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.tiny() if request.param == "gpt" else tiny_llama()).eval()


def test_plain_with_one_beam_is_greedy(small):
    prompt = [3, 14, 15, 92, 65]
    free = generate(small, [prompt], 12).new_tokens[0].tolist()
    assert beam_search_plain(small, prompt, 1, 12).best.tokens == free
    end = free[4]  # greedy stops at the first end token, and so must one beam
    stop = generate(small, [prompt], 12, end_ids=[end]).new_tokens[0].tolist()
    best = beam_search_plain(small, prompt, 1, 12, end_ids=[end]).best
    assert best.tokens == stop and best.finished and best.tokens[-1] == end


def sharp_tiny_gpt(vocab_size: int = 6) -> GPT:
    """A 1-layer GPT over 6 tokens with weights N(0, 0.5): peaked, varied distributions."""
    torch.manual_seed(3)
    model = GPT(GPTConfig(max_len=16, vocab_size=vocab_size, n_layers=1, n_heads=2,
                          d_model=16)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def exhaustive(model: GPT, prompt: list[int], steps: int, end_ids: list[int]) -> dict:
    """Every complete continuation (stopping at its first end token) -> its sum of log-probs."""
    V = model.config.vocab_size
    seqs = torch.tensor([prompt + list(c) for c in itertools.product(range(V), repeat=steps)])
    with torch.no_grad():
        log_probs = F.log_softmax(model(seqs).logits.double(), dim=-1)  # (V^steps, T+steps, V)
    T = len(prompt)
    scores = {}
    for row, seq in enumerate(seqs.tolist()):
        new, total = [], 0.0
        for i, token in enumerate(seq[T:]):
            total += float(log_probs[row, T - 1 + i, token])
            new.append(token)
            if token in end_ids:
                break
        scores[tuple(new)] = total
    return scores


def rounding(score: float) -> float:
    """How far two float32 computations of one score can differ: the logits of a batch of 216
    rows and of a few rows round differently (a few ulps of each of 3 log-probabilities)."""
    return 1e-5 * abs(score) + 1e-6


@pytest.mark.parametrize("end_ids", [[], [2]])
def test_plain_with_a_wide_beam_is_exhaustive_search(end_ids):
    """36 = V^2 beams hold every prefix: the search is exhaustive, up to float32 rounding.

    The exhaustive scores come from one batch of all 216 sequences, the beam's from batches of
    its live beams, so equal sums can differ in the last bits (they do under the scalar
    kernels): every comparison allows `rounding`, and near-ties may come in either order.
    """
    model, prompt, steps = sharp_tiny_gpt(), [1, 4], 3
    scores = exhaustive(model, prompt, steps, end_ids)
    best = max(scores.values())
    out = beam_search_plain(model, prompt, 36, steps, end_ids=end_ids)
    assert scores[tuple(out.best.tokens)] >= best - rounding(best)
    assert math.isclose(out.best.score, best, rel_tol=1e-5, abs_tol=1e-6)
    for hyp in out.hypotheses:  # every hypothesis is scored as exhaustive search scores it
        assert math.isclose(hyp.score, scores[tuple(hyp.tokens)], rel_tol=1e-5, abs_tol=1e-6)
        assert hyp.finished == (bool(end_ids) and hyp.tokens[-1] in end_ids)
    ranked = [scores[tuple(h.tokens)] for h in out.hypotheses]
    assert all(a >= b - rounding(b) for a, b in zip(ranked, ranked[1:], strict=False))  # best first
    if not end_ids:  # the 36 best of all 216: every clearly better sequence is among them
        assert len(out.hypotheses) == 36
        cut = ranked[-1]
        clearly_in = {t for t, s in scores.items() if s > cut + rounding(cut)}
        assert clearly_in <= {tuple(h.tokens) for h in out.hypotheses}
        assert len(clearly_in) >= 30  # near-ties at the cut are rare: the check has teeth
    narrow = beam_search_plain(model, prompt, 1, steps, end_ids=end_ids).best
    assert narrow.score <= out.best.score + rounding(out.best.score)  # greedy can only do worse


def test_plain_tree_rebuilds_every_hypothesis():
    model = sharp_tiny_gpt()
    out = beam_search_plain(model, [1, 4], 3, 5, end_ids=[2])
    assert all(len(step) <= 3 for step in out.tree)
    paths = [([], 0.0)]  # (tokens, score) of the live beams before step 0
    found = set()
    for step in out.tree:
        nodes = [(paths[node.parent][0] + [node.token], node) for node in step]
        for tokens, node in nodes:
            assert node.score < paths[node.parent][1]  # log-probabilities are negative
            if node.finished:
                found.add((tuple(tokens), node.score))
        paths = [(tokens, node.score) for tokens, node in nodes if not node.finished]
    found |= {(tuple(tokens), score) for tokens, score in paths}
    assert found == {(tuple(h.tokens), h.score) for h in out.hypotheses}


def test_plain_equals_batched_without_end_ids(models, batch):
    """Without end tokens both keep the K best sums at each step; lp=0 returns those sums."""
    _, ours = models
    prompt = PROMPTS[0]
    plain = beam_search_plain(ours, prompt, 3, 6)
    out = beam_search(ours, [prompt], 3, 6, length_penalty=0.0, early_stopping="never")
    assert [h.tokens for h in plain.hypotheses] == out.new_tokens.tolist()
    plain_scores = torch.tensor([h.score for h in plain.hypotheses], dtype=torch.float64)
    torch.testing.assert_close(out.scores.double(), plain_scores, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- encoder-decoder


@pytest.fixture(scope="module")
def seq2seq() -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    model = Transformer(TransformerConfig.tiny()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    src = torch.randint(4, 50, (2, 7))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[1, 5:] = False  # the second source is shorter (padded on the right)
    memory, _ = model.encode(src, src_mask)
    return model, memory, src_mask


def test_encoder_decoder_cached_equals_uncached(seq2seq):
    model, memory, src_mask = seq2seq
    start = torch.ones(2, 1, dtype=torch.long)  # the decoder's start token
    end = int(generate(model, start, 4, memory=memory, memory_mask=src_mask).new_tokens[0, 2])
    for K, es in [(3, False), (4, "never")]:
        kwargs = dict(end_ids=[end], early_stopping=es, memory=memory, memory_mask=src_mask)
        a = beam_search(model, start, K, 8, **kwargs)
        b = beam_search(model, start, K, 8, use_cache=False, **kwargs)
        assert torch.equal(a.sequences, b.sequences)
        torch.testing.assert_close(a.scores, b.scores, rtol=1e-5, atol=1e-6)
    # one beam without end tokens is greedy
    one = beam_search(model, start, 1, 8, memory=memory, memory_mask=src_mask)
    greedy = generate(model, start, 8, memory=memory, memory_mask=src_mask)
    assert torch.equal(one.sequences, greedy.tokens)
    # the plain one reads the same memory, one source at a time
    plain = beam_search_plain(model, [1], 1, 8, memory=memory[1:])
    assert plain.best.tokens == generate(model, start[1:], 8, memory=memory[1:]).new_tokens[
        0].tolist()


# ---------------------------------------------------------------- bad input


def test_bad_requests(models):
    _, ours = models
    prompt = [[5, 6, 7]]
    with pytest.raises(ValueError, match="num_beams must be an int >= 1, got 0"):
        beam_search(ours, prompt, 0, 3)
    with pytest.raises(TypeError, match="num_beams must be an int >= 1, got 2.0"):
        beam_search(ours, prompt, 2.0, 3)
    with pytest.raises(ValueError, match=r"num_return_sequences must be an int in \[1, "
                                         r"num_beams=2\], got 3"):
        beam_search(ours, prompt, 2, 3, num_return_sequences=3)
    with pytest.raises(ValueError, match="length_penalty must be a finite number, got nan"):
        beam_search(ours, prompt, 2, 3, length_penalty=float("nan"))
    with pytest.raises(ValueError, match="length_penalty must be a finite number, got inf"):
        beam_search(ours, prompt, 2, 3, length_penalty=math.inf)
    with pytest.raises(TypeError, match="length_penalty must be a finite number, got '1'"):
        beam_search(ours, prompt, 2, 3, length_penalty="1")
    with pytest.raises(ValueError, match="early_stopping must be True, False or 'never', "
                                         "got 'always'"):
        beam_search(ours, prompt, 2, 3, early_stopping="always")
    with pytest.raises(ValueError, match="early_stopping must be True, False or 'never', got 1"):
        beam_search(ours, prompt, 2, 3, early_stopping=1)
    with pytest.raises(ValueError, match="empty prompt"):
        beam_search(ours, [[1, 2], []], 2, 3)
    # end ids as generate takes them: a string or None is refused, never read letter by letter
    with pytest.raises(TypeError, match="end_ids must be an int token id or a sequence"):
        beam_search(ours, prompt, 2, 3, end_ids="2")
    with pytest.raises(TypeError, match="end_ids must be an int token id or a sequence"):
        beam_search_plain(ours, prompt[0], 2, 3, end_ids=None)
    with pytest.raises(ValueError, match=r"shape \(B, T\) with T >= 1, got \(1, 0\)"):
        beam_search(ours, torch.zeros(1, 0, dtype=torch.long), 2, 3)
    with pytest.raises(ValueError, match="a row of padding only"):
        beam_search(ours, torch.ones(2, 3, dtype=torch.long), 2, 3,
                    attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match="needs 65 positions, more than the model's context "
                                         "length 64"):
        beam_search(ours, prompt, 2, 62)
    with pytest.raises(ValueError, match=r"end token ids must be ints in \[0, 300\), got 300"):
        beam_search(ours, prompt, 2, 3, end_ids=[300])
    with pytest.raises(TypeError, match=r"beam_search needs a tfbook model .* with decode\(\)"
                                        r".*got GPT"):
        beam_search(ours, prompt, 2, 3, memory=torch.zeros(2, 4, 64))
    with pytest.raises(ValueError, match="num_beams must be an int >= 1, got -1"):
        beam_search_plain(ours, [5, 6], -1, 3)
    with pytest.raises(ValueError, match="empty prompt"):
        beam_search_plain(ours, [], 2, 3)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int, got 0"):
        beam_search_plain(ours, [5, 6], 2, 0)
    with pytest.raises(ValueError, match=r"one prompt, ids of shape \(T,\), got shape \(1, 2\)"):
        beam_search_plain(ours, torch.tensor([[5, 6]]), 2, 3)
    with pytest.raises(TypeError, match=r"beam_search_plain needs a tfbook model .* decode\(\)"):
        beam_search_plain(ours, [5, 6], 2, 3, memory=torch.zeros(2, 4, 64))


def test_bad_sources_and_models(seq2seq, models):
    model, memory, src_mask = seq2seq
    start = torch.ones(2, 1, dtype=torch.long)
    with pytest.raises(ValueError, match=r"memory must have shape \(B=2, S, C\), got \(1, 7"):
        beam_search(model, start, 2, 3, memory=memory[:1])
    with pytest.raises(ValueError, match=r"memory must be one source, shape \(1, S, C\)"):
        beam_search_plain(model, [1], 2, 3, memory=memory)
    with pytest.raises(ValueError, match="encoder-decoder Transformer without memory"):
        beam_search(model, start, 2, 3)
    hf, _ = models  # a Hugging Face model is not driven by these loops
    with pytest.raises(TypeError, match=r"needs a tfbook model .*config.max_len.*"
                                        r"got LlamaForCausalLM"):
        beam_search(hf, [[5, 6]], 2, 3)
    with pytest.raises(TypeError, match=r"needs a tfbook model .*got Linear"):
        beam_search_plain(torch.nn.Linear(4, 4), [5, 6], 2, 3)


def test_bad_prompts_are_refused_not_rounded(models):
    _, ours = models  # V = 300
    with pytest.raises(TypeError, match="got str: encode text with the tokenizer first"):
        beam_search(ours, "hello", 2, 3)
    with pytest.raises(TypeError, match="got str for prompt 0: encode text"):
        beam_search_plain(ours, "hello", 2, 3)
    with pytest.raises(TypeError, match="token ids must be ints, got 5.7 of type float"):
        beam_search(ours, [[5.7, 6]], 2, 3)
    with pytest.raises(TypeError, match="token ids must be ints, got 5.7 of type float"):
        beam_search_plain(ours, [5.7, 6], 2, 3)
    with pytest.raises(TypeError, match="integer token ids, got a tensor of dtype torch.float32"):
        beam_search(ours, torch.tensor([[5.7, 6.0]]), 2, 3)
    with pytest.raises(ValueError, match=r"token ids \(padding included\) must lie in "
                                         r"\[0, V=300\), got -1"):
        beam_search(ours, torch.tensor([[-1, 6]]), 2, 3)
    with pytest.raises(ValueError, match=r"must lie in \[0, V=300\), got \[5, 300\]"):
        beam_search_plain(ours, [5, 300], 2, 3)
    with pytest.raises(ValueError, match=r"must be left padding .* row 0 = \[1, 1, 0\]"):
        beam_search(ours, torch.tensor([[5, 6, 7]]), 2, 3,
                    attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="attention_mask goes with prompts given as a"):
        beam_search(ours, [[5, 6]], 2, 3, attention_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"num_beams must be at most the 299 tokens .*V=300.*"
                                         r"got num_beams=300"):
        beam_search(ours, [[5, 6]], 300, 3, end_ids=[2])
    # the largest beam that fits returns only real sequences (no placeholder scores)
    tiny = sharp_tiny_gpt()  # V = 6
    out = beam_search(tiny, [[1, 4]], 5, 3, end_ids=[2])
    assert (out.scores > -1e8).all() and len(set(map(tuple, out.sequences.tolist()))) == 5
