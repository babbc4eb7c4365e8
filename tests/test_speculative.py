"""Speculative decoding: greedy output equals `generate`, sampling follows the target exactly.

Engine tests on a mock model whose answers are known (its next token depends on the sum of
every token in its cache, so a cache that keeps a rejected guess gives a wrong token), then
tiny GPTs in float64 (rounding far below every top-1 margin, checked), then SmolLM2 against
Hugging Face's assisted generation. SmolLM2's token identity is asserted only after checking
that every greedy step's top-1 margin is far above the rounding that separates a verify pass
over n + 1 tokens from n + 1 single steps (different kernels, different last bits).
"""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tfbook.cache import KVCache
from tfbook.generate.search import generate
from tfbook.generate.speculative import (
    EarlyExitDraft,
    ModelDraft,
    PromptLookupDraft,
    acceptance_probability,
    early_exit_model,
    emitted_distribution,
    prompt_lookup,
    residual_distribution,
    speculative_generate,
)
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.models.output import ModelOutput


class SumModel(nn.Module):
    """Mock decoder: the logits after a prefix are table[(sum of the prefix's ids) % V].

    It reads the prefix ONLY through its cache (one layer holding each id as a key), so a
    rollback that forgets to drop a rejected guess changes every later token.
    """

    def __init__(self, table: torch.Tensor, max_len: int = 64) -> None:
        super().__init__()
        V = table.size(0)
        self.config = SimpleNamespace(max_len=max_len, vocab_size=V, n_layers=1)
        self.table = nn.Parameter(table, requires_grad=False)  # (V, V) logits per residue
        self.calls = 0

    def new_cache(self, max_len=None):
        return KVCache(1, max_len or self.config.max_len)

    def forward(self, idx, positions=None, attention_mask=None, cache=None, last_only=False):
        self.calls += 1
        x = idx.to(self.table.dtype)[:, None, :, None]  # (B, 1, T, 1)
        if cache is None:
            seen = x
        else:
            seen, _ = cache[0].update(x, x)  # (B, 1, S, 1): every id so far
        T = idx.size(1)
        sums = seen[:, 0, :, 0].cumsum(dim=-1)[:, -T:].long() % self.config.vocab_size  # (B, T)
        logits = self.table[sums]  # (B, T, V)
        return ModelOutput(logits=logits[:, -1:] if last_only else logits)


def table(V: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(V, V, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2


def greedy_ids(model, prompt, n):
    return generate(model, [prompt], n).new_tokens[0].tolist()


# --- the cache's rollback ---------------------------------------------------------------

def test_crop_then_refeed_equals_a_fresh_pass():
    torch.manual_seed(0)
    model = GPT(tiny_llama()).eval()
    idx = torch.randint(0, 256, (1, 12))
    wrong = torch.randint(0, 256, (1, 5))
    cache = model.new_cache()
    model(idx[:, :8], cache=cache)
    model(wrong, cache=cache)  # five guesses, all rejected
    cache.crop(8)
    assert cache.length == 8
    after = model(idx[:, 8:], cache=cache).logits
    fresh = model(idx).logits[:, 8:]
    assert (after - fresh).abs().max() <= 1e-5


# --- prompt lookup ----------------------------------------------------------------------

def test_prompt_lookup_examples():
    assert prompt_lookup([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert prompt_lookup([5, 6, 7, 8, 5, 6], 10) == [7, 8, 5, 6]  # stops at the text's end
    assert prompt_lookup([1, 2, 3, 9, 3], 2) == [9, 3]  # no bigram match: the unigram 3
    assert prompt_lookup([1, 2, 3], 4) == []
    assert prompt_lookup([4, 4, 4], 2, max_ngram=1) == [4, 4]  # the first occurrence, leftmost


def test_prompt_lookup_equals_hugging_face():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        L = int(torch.randint(2, 30, (), generator=gen))
        V = int(torch.randint(2, 6, (), generator=gen))
        ids = torch.randint(0, V, (1, L), generator=gen)
        n, ngram = trial % 5 + 1, trial % 3 + 1
        hf = PromptLookupCandidateGenerator(num_output_tokens=n, max_matching_ngram_size=ngram,
                                            max_length=1000)
        candidates, _ = hf.get_candidates(ids)
        assert prompt_lookup(ids[0].tolist(), n, ngram) == candidates[0, L:].tolist()


# --- the engine on the mock -------------------------------------------------------------

V_MOCK = 7


@pytest.mark.parametrize("draft_length", [1, 2, 3, 5])
def test_mock_greedy_equals_generate_with_every_draft(draft_length):
    target = SumModel(table(V_MOCK, 0))
    expected = greedy_ids(target, [3, 1], 20)
    drafts = [PromptLookupDraft(), ModelDraft(SumModel(table(V_MOCK, 1))),
              ModelDraft(SumModel(table(V_MOCK, 0)))]
    for draft in drafts:
        out = speculative_generate(target, [3, 1], 20, draft, draft_length=draft_length)
        assert out.new_tokens == expected
        assert sum(a + 1 for a in out.accepted) == 20  # each pass: accepted + 1 correction


def test_mock_perfect_and_hopeless_drafts():
    target = SumModel(table(V_MOCK, 0))
    perfect = speculative_generate(target, [3, 1], 20, ModelDraft(SumModel(table(V_MOCK, 0))),
                                   draft_length=4)
    assert perfect.acceptance_rate == 1.0 and perfect.target_passes == 4  # 5 tokens a pass
    # a draft whose argmax is never the target's: every guess rejected, one token per pass
    hopeless = SumModel(-table(V_MOCK, 0))
    out = speculative_generate(target, [3, 1], 20, ModelDraft(hopeless), draft_length=3)
    assert out.acceptance_rate == 0.0 and out.target_passes == 20
    assert out.new_tokens == greedy_ids(target, [3, 1], 20)  # every rejected guess rolled back


def test_rollback_matters():
    """Without the crop the mock's sums would include rejected guesses: check it would show."""
    target = SumModel(table(V_MOCK, 0))
    cache = target.new_cache()
    target(torch.tensor([[3, 1, 4]]), cache=cache)
    kept = target(torch.tensor([[5]]), cache=cache).logits
    cache.crop(3)
    target(torch.tensor([[2, 2]]), cache=cache)  # a guess of two tokens
    cache.crop(3)
    assert torch.equal(target(torch.tensor([[5]]), cache=cache).logits, kept)
    cache.crop(3)
    target(torch.tensor([[2]]), cache=cache)  # a guess left in the cache: the sum is off by 2
    assert not torch.equal(target(torch.tensor([[5]]), cache=cache).logits, kept)


def test_end_token_stops():
    target = SumModel(table(V_MOCK, 0))
    full = greedy_ids(target, [3, 1], 20)
    end = full[5]
    out = speculative_generate(target, [3, 1], 20, PromptLookupDraft(), end_ids=end)
    assert out.new_tokens == full[: full.index(end) + 1]


# --- tiny GPTs in float64 ---------------------------------------------------------------

def float64_model(config, seed):
    torch.manual_seed(seed)
    return GPT(config).double().eval()


def min_margin(model, prompt, n):
    """The smallest gap between the top two logits over the n greedy steps."""
    logits = torch.cat(generate(model, [prompt], n, keep_logits=True).logits)  # (n, V)
    top2 = logits.topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


@pytest.mark.parametrize("config", [GPTConfig.tiny(), tiny_llama()], ids=["gpt", "llama"])
def test_tiny_models_greedy_equals_generate(config):
    target = float64_model(config, 0)
    prompt = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]
    expected = greedy_ids(target, prompt, 24)
    assert min_margin(target, prompt, 24) > 1e-9  # float64 rounding: about 1e-15
    drafts = {"prompt lookup": PromptLookupDraft(), "early exit": EarlyExitDraft(target, 1),
              "draft model": ModelDraft(float64_model(config, 1))}
    for name, draft in drafts.items():
        for k in (1, 3, 6):
            out = speculative_generate(target, prompt, 24, draft, draft_length=k)
            assert out.new_tokens == expected, (name, k)
            assert out.target_passes <= 24


def test_early_exit_shares_weights_and_cache():
    target = float64_model(tiny_llama(), 0)
    draft = early_exit_model(target, 1)
    assert draft.blocks[0] is target.blocks[0] and draft.lm_head is target.lm_head
    assert len(draft.blocks) == 1
    idx = torch.tensor([[1, 2, 3]])
    h = target.tok_emb(idx)
    h, _ = target.blocks[0](h, causal=True)
    assert torch.allclose(draft(idx).logits, target.lm_head(target.norm_f(h)), atol=1e-12)
    cache = target.new_cache(16)
    shared = cache.first_layers(1)
    target(idx, cache=cache)
    assert shared.length == 3 and shared[0] is cache[0]


# --- sampling: the exact distribution ---------------------------------------------------

def test_emitted_distribution_is_the_target_by_enumeration():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        V = 6
        p = torch.rand(V, generator=gen, dtype=torch.float64) ** 3
        q = torch.rand(V, generator=gen, dtype=torch.float64) ** 3
        q[int(torch.randint(0, V, (), generator=gen))] = 0  # a token the draft never proposes
        p, q = p / p.sum(), q / q.sum()
        exact = torch.zeros(V, dtype=torch.float64)
        for x in range(V):  # enumerate the draft's proposals one by one
            if q[x] == 0:
                continue
            a = min(1.0, float(p[x] / q[x]))
            exact[x] += q[x] * a  # proposed and kept
            exact += q[x] * (1 - a) * residual_distribution(p, q)  # proposed, rejected, redrawn
        assert (exact - p).abs().max() <= 1e-12
        assert (emitted_distribution(p, q) - p).abs().max() <= 1e-12
        assert bool(((acceptance_probability(p, q) >= 0) & (acceptance_probability(p, q) <= 1))
                    .all())


def joint_exact(target, draft, prompt, temperature):
    """P(first two new tokens) of one speculative pass with 2 guesses, enumerated exactly."""
    def dist(model, context):
        logits = model(torch.tensor([context])).logits[0, -1]
        return torch.softmax(logits / temperature, dim=-1)

    V = target.config.vocab_size
    out = torch.zeros(V, V, dtype=torch.float64)
    p1, q1 = dist(target, prompt), dist(draft, prompt)
    r1 = residual_distribution(p1, q1)
    for d1 in range(V):
        a1 = acceptance_probability(p1, q1)[d1]
        # d1 rejected: x1 ~ r1, then the next pass emits x2 with emitted_distribution
        for x1 in range(V):
            ctx = prompt + [x1]
            second = emitted_distribution(dist(target, ctx), dist(draft, ctx))
            out[x1] += q1[d1] * (1 - a1) * r1[x1] * second
        # d1 kept: the second guess d2 ~ q2 is checked against p2
        ctx = prompt + [d1]
        p2, q2 = dist(target, ctx), dist(draft, ctx)
        a2 = acceptance_probability(p2, q2)
        out[d1] += q1[d1] * a1 * (q2 * a2 + (q2 * (1 - a2)).sum() * residual_distribution(p2, q2))
    return out


def test_two_tokens_follow_the_target_exactly():
    target, draft = SumModel(table(5, 0)), SumModel(table(5, 3))
    joint = joint_exact(target, draft, [2, 4], temperature=1.0)
    p1 = torch.softmax(target(torch.tensor([[2, 4]])).logits[0, -1], -1)
    want = torch.stack([p1[x] * torch.softmax(target(torch.tensor([[2, 4, x]])).logits[0, -1], -1)
                        for x in range(5)])
    assert (joint - want).abs().max() <= 1e-12


def test_seeded_sampling_follows_the_target():
    V = 4
    target, draft = SumModel(table(V, 0) / 2), SumModel(table(V, 5) / 2)
    p1 = torch.softmax(target(torch.tensor([[1]])).logits[0, -1], -1)
    want = torch.stack([p1[x] * torch.softmax(target(torch.tensor([[1, x]])).logits[0, -1], -1)
                        for x in range(V)])  # (V, V): the target's own two-token law
    gen = torch.Generator().manual_seed(0)
    runs = 3000
    counts = torch.zeros(V, V, dtype=torch.float64)
    for _ in range(runs):
        out = speculative_generate(target, [1], 2, ModelDraft(draft), draft_length=1,
                                   temperature=1.0, generator=gen)
        counts[out.new_tokens[0], out.new_tokens[1]] += 1
    sigma = (want * (1 - want) / runs).sqrt()
    assert bool(((counts / runs - want).abs() <= 5 * sigma + 1e-3).all())
    # the same seed gives the same tokens
    again = [speculative_generate(target, [1], 8, PromptLookupDraft(), temperature=0.7,
                                  generator=torch.Generator().manual_seed(7)).new_tokens
             for _ in range(2)]
    assert again[0] == again[1]


# --- bad input --------------------------------------------------------------------------

def test_bad_input_is_refused():
    target = SumModel(table(V_MOCK, 0))
    draft = PromptLookupDraft()
    with pytest.raises(ValueError, match="draft_length must be an int >= 1, got 0"):
        speculative_generate(target, [1, 2], 5, draft, draft_length=0)
    with pytest.raises(TypeError, match="draft_length must be an int >= 1, got 2.0"):
        speculative_generate(target, [1, 2], 5, draft, draft_length=2.0)
    with pytest.raises(ValueError, match="batch 1"):
        speculative_generate(target, torch.tensor([[1, 2], [3, 4]]), 5, draft)
    with pytest.raises(ValueError, match="batch 1"):
        speculative_generate(target, [[1, 2], [3, 4]], 5, draft)
    with pytest.raises(ValueError, match="vocabulary: the target has V=7, the draft V=5"):
        speculative_generate(target, [1, 2], 5, ModelDraft(SumModel(table(5, 0))))
    with pytest.raises(TypeError, match="draft must be"):
        speculative_generate(target, [1, 2], 5, "lookup")
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(target, [1, 2], 0, draft)
    with pytest.raises(ValueError, match=r"\[0, V=7\)"):
        speculative_generate(target, [1, 9], 5, draft)
    with pytest.raises(TypeError, match="max_ngram must be an int"):
        PromptLookupDraft(max_ngram=1.5)
    gpt = float64_model(tiny_llama(), 0)
    with pytest.raises(ValueError, match="keeps 1 to 1 of the target's 2 blocks, got n_layers=2"):
        EarlyExitDraft(gpt, 2)
    with pytest.raises(TypeError, match="n_layers must be an int"):
        EarlyExitDraft(gpt, "1")
    with pytest.raises(ValueError, match="another model"):
        speculative_generate(target, [1, 2], 5, EarlyExitDraft(gpt, 1))
    cache = KVCache(2, 8)
    with pytest.raises(ValueError, match=r"crop needs a length in \[0, 0\]"):
        cache.crop(1)
    with pytest.raises(ValueError, match=r"first_layers needs n_layers in \[1, 2\]"):
        cache.first_layers(3)


# --- SmolLM2 and Hugging Face's assisted generation -------------------------------------

CODE = ("def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")
N_SMOL = 12
EXIT = 4  # blocks of the early-exit drafts: cheap (they mostly guess wrong, which tests rollback)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2, the code prompt and plain greedy's run on it: loaded and run once per module."""
    from tfbook.checkpoints.smollm2 import (
        load_smollm2,
        load_smollm2_tokenizer,
        smollm2_chat_ids,
    )

    tokenizer = load_smollm2_tokenizer()
    prompt = smollm2_chat_ids(tokenizer, [{"role": "user", "content":
                                           "Rename width to w in this code:\n" + CODE}])
    model = load_smollm2()
    return model, prompt, generate(model, [prompt], N_SMOL, keep_logits=True)


def test_smollm2_greedy_equals_generate_and_hugging_face(smollm2):
    import copy

    from tfbook.checkpoints.smollm2 import hf_llama_from_gguf, read_smollm2_gguf

    model, prompt, plain = smollm2
    expected = plain.new_tokens[0].tolist()
    steps = torch.cat(plain.logits)  # (N, V): one cached step per token
    top2 = steps.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    drafts = {"prompt lookup": PromptLookupDraft(), "early exit": EarlyExitDraft(model, EXIT),
              "draft model": ModelDraft(early_exit_model(model, EXIT))}
    runs = {}
    for name, draft in drafts.items():
        runs[name] = out = speculative_generate(model, prompt, N_SMOL, draft, draft_length=4,
                                                keep_logits=True)
        # the verify passes' scores differ from the single steps' in the last bits only; with
        # every top-1 margin above twice that difference the argmax cannot differ
        gap = float((torch.stack(out.logits) - steps).abs().max())
        assert margin > 2 * gap, (name, margin, gap)
        print(name, "smallest top-1 margin", margin, "largest verify-vs-step gap", gap)
        assert out.new_tokens == expected, name
    assert sum(runs["prompt lookup"].accepted) > 0  # the copying draft did guess right

    hf = hf_llama_from_gguf(read_smollm2_gguf())
    ids = torch.tensor([prompt])
    common = dict(max_new_tokens=N_SMOL, do_sample=False, min_new_tokens=N_SMOL)
    assistant = copy.copy(hf)  # HF's own modules, only the first EXIT layers: nothing copied
    assistant._modules = dict(hf._modules)
    assistant.model = copy.copy(hf.model)
    assistant.model._modules = dict(hf.model._modules)
    assistant.model.layers = nn.ModuleList(hf.model.layers[:EXIT])
    assistant.config = assistant.model.config = copy.deepcopy(hf.config)
    assistant.config.num_hidden_layers = EXIT
    assert hf.config.num_hidden_layers == len(hf.model.layers) > EXIT  # the target untouched
    for how in (dict(prompt_lookup_num_tokens=4), dict(assistant_early_exit=EXIT),
                dict(assistant_model=assistant), {}):
        hf_new = hf.generate(ids, **common, **how)[0, len(prompt):].tolist()
        assert hf_new == expected, how


@torch.no_grad()
def test_smollm2_next_token_distribution_is_exact(smollm2):
    model, prompt, plain = smollm2
    ids = torch.tensor([prompt])
    p = torch.softmax(plain.logits[0][0].double(), -1)  # the target after the prompt, (V,)
    q = torch.softmax(early_exit_model(model, EXIT)(ids).logits[0, -1].double(), -1)  # draft
    assert (p - q).abs().sum() > 0.1  # a draft that really differs
    assert (emitted_distribution(p, q) - p).abs().max() <= 1e-6
    assert abs(float(emitted_distribution(p, q).sum()) - 1) <= 1e-9
