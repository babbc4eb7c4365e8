"""The one generation loop: greedy and sampled, cached == uncached, batches == one by one;
penalties and stop strings equal to Hugging Face's generate; bad input refused.

Cached and uncached runs (and a batch against one prompt at a time) compute the same logits
with different kernels, so they agree only up to float32 rounding (about 1e-6 here). Their
tokens are compared exactly only after checking that every greedy step's top two logits are
further apart than that (then rounding cannot change an argmax). The Hugging Face comparisons
run the same float32 operations on both sides with the thread count pinned.
"""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.generation.stopping_criteria import StopStringCriteria

from tests.pinned_threads import pinned_threads
from tfbook.checkpoints.hf_llama import tfbook_from_hf_llama
from tfbook.generate.search import (
    completes_stop_string,
    generate,
    left_pad,
    positions_from_mask,
)
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama
from tfbook.models.transformer import Transformer, TransformerConfig

ROUNDING = 1e-5  # far above the cached/uncached difference of these tiny models' logits


def assert_clear_argmax(logits: list[torch.Tensor]) -> None:
    """Every step's best logit beats the second by more than float32 rounding could move it."""
    top2 = torch.stack(logits).topk(2, dim=-1).values  # (N, B, 2)
    assert bool((top2[..., 0] - top2[..., 1] > 2 * ROUNDING).all())

CONFIGS = {"gpt": GPTConfig.tiny(), "llama": tiny_llama()}


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request) -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIGS[request.param]).eval()


def test_greedy_is_the_argmax_of_the_full_recomputation(model):
    prompt = torch.randint(0, 256, (2, 5))
    out = generate(model, prompt, max_new_tokens=12, keep_logits=True)
    assert out.tokens.shape == (2, 17) and torch.equal(out.tokens[:, :5], prompt)
    assert_clear_argmax(out.logits)
    for t in range(5, 17):
        full = model(out.tokens[:, :t]).logits[:, -1]  # (B, V), no cache
        assert torch.equal(out.tokens[:, t], full.argmax(-1))
        assert (out.logits[t - 5] - full).abs().max() <= ROUNDING  # cached logits == uncached


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.8, "top_k": 20, "top_p": 0.9}])
def test_cached_and_uncached_give_the_same_tokens(model, settings):
    prompt = torch.randint(0, 256, (3, 4))
    a = generate(model, prompt, 20, generator=torch.Generator().manual_seed(5),
                 keep_logits=True, **settings)
    b = generate(model, prompt, 20, generator=torch.Generator().manual_seed(5),
                 use_cache=False, keep_logits=True, **settings)
    if not settings:
        assert_clear_argmax(a.logits)
    # sampled: a draw changes only if a cumulative probability lands within ~1e-6 of the
    # uniform number drawn, a chance of about 1e-6 per step; the logits must agree closely
    gaps = [float((x - y).abs().max()) for x, y in zip(a.logits, b.logits, strict=True)]
    assert max(gaps) <= ROUNDING
    assert torch.equal(a.tokens, b.tokens)


def test_batch_of_different_lengths_equals_one_by_one(model):
    prompts = [[5, 6, 7, 8, 9, 10], [11], [12, 13, 14]]
    batch = generate(model, prompts, max_new_tokens=10, keep_logits=True)
    assert_clear_argmax(batch.logits)
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], max_new_tokens=10)
        assert torch.equal(batch.new_tokens[row], alone.new_tokens[0])


def test_seeded_sampling_is_reproducible(model):
    prompt = torch.randint(0, 256, (1, 3))
    runs = [generate(model, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(7))
            for _ in range(2)]
    other = generate(model, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(8))
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert not torch.equal(runs[0].tokens, other.tokens)


def test_stops_at_end_tokens_and_pads_finished_rows(model):
    prompt = torch.randint(0, 256, (2, 4))
    free = generate(model, prompt, 8)
    end = int(free.new_tokens[0, 2])  # row 0 produces this token at step 2
    out = generate(model, prompt, 8, end_ids=[end], pad_id=0)
    row = out.new_tokens[0].tolist()
    assert row[: row.index(end) + 1] == free.new_tokens[0, : row.index(end) + 1].tolist()
    assert all(t == 0 for t in row[row.index(end) + 1 :])  # padding after the end token
    assert not out.attention_mask[0, 4 + row.index(end) + 1 :].any()


def test_encoder_decoder_cached_equals_uncached():
    torch.manual_seed(1)
    model = Transformer(TransformerConfig.tiny()).eval()
    src = torch.randint(0, 50, (2, 9))
    memory, _ = model.encode(src)
    start = torch.zeros(2, 1, dtype=torch.long)
    a = generate(model, start, 10, memory=memory, keep_logits=True)
    b = generate(model, start, 10, memory=memory, use_cache=False)
    assert_clear_argmax(a.logits)
    assert torch.equal(a.tokens, b.tokens)


def test_helpers():
    ids, mask = left_pad([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert positions_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_bad_requests(model):
    prompt = torch.zeros(1, 60, dtype=torch.long)
    with pytest.raises(ValueError, match="needs 65 positions, more than the model's context"):
        generate(model, prompt, 5)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int, got 0"):
        generate(model, prompt[:, :3], 0)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, [[1, 2], []], 3)
    with pytest.raises(ValueError, match=r"shape \(B, T\) with T >= 1, got \(1, 0\)"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"end token ids must be ints in \[0, 256\), got 999"):
        generate(model, prompt[:, :3], 3, end_ids=[999])
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt[:, :3], 3, temperature=-1.0)


# ---------------------------------------------------------------- penalties and stop strings


TEXT = "the cat sat on the mat. the dog ran to the cat.\n\nthe end. stop here, stop there.\n"


@pytest.fixture(scope="module")
def hf_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained in memory on TEXT (nothing is downloaded)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT * 20], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


STOPS = ["\n\n", "sto", "t th", ". "]
GENERATION_STOPS = [*STOPS, "he"]  # "he" too, so that a random model meets one in 20 tokens


def test_stop_strings_end_where_hf_stop_string_criteria_ends(hf_tokenizer):
    """Every prefix of real token sequences: the same verdict as HF's StopStringCriteria."""
    criteria = StopStringCriteria(hf_tokenizer, STOPS)
    texts = [TEXT, "a stop. then\n\nmore", "xsto\n\n", "last top", "the mat. the"]
    verdicts = []
    for text in texts:
        ids = hf_tokenizer.encode(text)
        for n in range(1, len(ids) + 1):
            hf_says = bool(criteria(torch.tensor([ids[:n]]), None)[0])
            assert completes_stop_string(ids[:n], STOPS, hf_tokenizer.decode) == hf_says, (
                text, n, hf_tokenizer.decode(ids[:n]))
            verdicts.append(hf_says)
    assert 5 < sum(verdicts) < len(verdicts) - 5  # both verdicts occur often


@pytest.fixture(scope="module")
def llama_pair(hf_tokenizer) -> tuple[LlamaForCausalLM, GPT]:
    """A random HF Llama over the tokenizer's vocabulary and the same weights in tfbook."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(hf_tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0,
                         initializer_range=0.3, attn_implementation="sdpa")
    hf = LlamaForCausalLM(config).eval()
    return hf, tfbook_from_hf_llama(hf)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def pinned(request):
    """HF and tfbook run the same float32 operations, on pinned threads (1, then 2)."""
    with pinned_threads(request.param):
        yield


@pytest.mark.parametrize("penalty", [1.0, 1.3, 0.7])
def test_greedy_with_repetition_penalty_and_stop_strings_equals_hf_generate(
        llama_pair, hf_tokenizer, pinned, penalty):
    hf, ours = llama_pair
    ids = torch.tensor([hf_tokenizer.encode("the dog ran")] * 3)
    ids[1, 0], ids[2, 1] = 7, 9  # three different prompts of the same length
    end = len(hf_tokenizer) - 1  # HF pads a finished row only when an end token is set
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=20, repetition_penalty=penalty, pad_token_id=0,
                          eos_token_id=end, stop_strings=GENERATION_STOPS,
                          tokenizer=hf_tokenizer)
    out = generate(ours, ids, 20, repetition_penalty=penalty, pad_id=0, end_ids=end,
                   stop_strings=GENERATION_STOPS, tokenizer=hf_tokenizer)
    assert torch.equal(out.tokens, ref)
    # not vacuous: a stop string ended at least one row before the 20 tokens
    stopped = [completes_stop_string(row[: int(mask.sum())], GENERATION_STOPS,
                                     hf_tokenizer.decode)
               for row, mask in zip(out.tokens.tolist(), out.attention_mask, strict=True)]
    assert any(stopped) and not bool(out.attention_mask[stopped.index(True), -1])


def test_penalties_lower_repetition(llama_pair):
    _, ours = llama_pair
    ids = torch.tensor([[5, 6, 7]])
    plain = generate(ours, ids, 40).new_tokens[0].tolist()
    spread = generate(ours, ids, 40, repetition_penalty=1.5, presence_penalty=1.0,
                      frequency_penalty=0.5).new_tokens[0].tolist()
    assert len(set(spread)) > len(set(plain))


# ---------------------------------------------------------------- bad input, by class


@pytest.mark.parametrize(("prompts", "error", "match"), [
    ("the cat", TypeError, "got str: encode text with the tokenizer first"),
    (["the cat"], TypeError, "got str for prompt 0: encode text"),
    ([[1, 2.7]], TypeError, "token ids must be ints, got 2.7 of type float in prompt 0"),
    (torch.tensor([[1.0, 2.7]]), TypeError, r"integer token ids, got .* torch.float32"),
    (torch.tensor([[True, False]]), TypeError, r"integer token ids, got .* torch.bool"),
    ([[1, 256]], ValueError, r"must lie in \[0, V=256\), got 256"),
    (torch.tensor([[-3, 4]]), ValueError, r"must lie in \[0, V=256\), got -3"),
    (7, TypeError, "prompts must be a .* got int"),
])
def test_bad_prompts_are_refused_never_rounded(model, prompts, error, match):
    with pytest.raises(error, match=match):
        generate(model, prompts, 3)


def test_bad_masks_are_refused(model):
    ids = torch.tensor([[4, 5, 6], [7, 8, 9]])
    with pytest.raises(ValueError, match=r"left padding .* row 1 = \[1, 1, 0\]"):  # right-padded
        generate(model, ids, 3, attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]))
    with pytest.raises(ValueError, match=r"left padding .* row 0 = \[0, 1, 0\]"):  # a hole
        generate(model, ids, 3, attention_mask=torch.tensor([[0, 1, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"a row of padding only \(row 1\)"):
        generate(model, ids, 3, attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match="attention_mask goes with prompts given as a"):
        generate(model, [[4, 5], [6]], 3, attention_mask=torch.ones(2, 2))  # would be ignored
    with pytest.raises(ValueError, match=r"only 0/1 or True/False, got values \[0, 2\]"):
        generate(model, ids, 3, attention_mask=torch.tensor([[0, 2, 2], [2, 2, 2]]))
    with pytest.raises(TypeError, match="attention_mask must be a tensor .* got list"):
        generate(model, ids, 3, attention_mask=[[1, 1, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match=r"must lie in \[0, V=256\), got 999"):  # pad embedded
        generate(model, [[4, 5], [6]], 3, pad_id=999)


def test_bad_models_and_settings_are_refused(model):
    with pytest.raises(TypeError, match=r"generate needs a tfbook model .* got Linear"):
        generate(torch.nn.Linear(4, 4), [[1, 2]], 3)
    seq2seq = Transformer(TransformerConfig.tiny()).eval()
    with pytest.raises(ValueError, match="encoder-decoder Transformer without memory"):
        generate(seq2seq, [[1]], 3)
    with pytest.raises(ValueError, match=r"temperature 1e-45 is too small .* temperature=0"):
        generate(model, [[1, 2]], 3, temperature=1e-45)
    with pytest.raises(ValueError, match="repetition_penalty must be a finite number > 0"):
        generate(model, [[1, 2]], 3, repetition_penalty=-1.0)
    with pytest.raises(ValueError, match=r"min_p must lie in \[0, 1\]"):
        generate(model, [[1, 2]], 3, temperature=1.0, min_p=2.0)
    with pytest.raises(TypeError, match="stop_strings need the tokenizer .* got NoneType"):
        generate(model, [[1, 2]], 3, stop_strings="\n")
    with pytest.raises(TypeError, match="stop_strings must be non-empty strings"):
        generate(model, [[1, 2]], 3, stop_strings=[""], tokenizer=object())


# ---------------------------------------------------------------- past the context


def test_slide_context_is_the_plain_loop_inside_the_context(model):
    prompts = [[5, 6, 7, 8], [9]]
    plain = generate(model, prompts, 20, keep_logits=True)
    assert_clear_argmax(plain.logits)
    slid = generate(model, prompts, 20, slide_context=True)
    assert torch.equal(slid.tokens, plain.tokens)


def test_slide_context_reads_the_last_max_len_tokens(model):
    """Past the context, each step is the model on the last max_len tokens, positions from 0."""
    L = model.config.max_len
    prompt = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(3))
    out = generate(model, prompt, L + 15, slide_context=True, keep_logits=True)
    assert out.new_tokens.size(1) == L + 15  # longer than the context
    for t in (L - 5, L + 3, L + 24):  # a step inside, just past and well past the context
        window = out.tokens[:, max(0, t - L) : t]  # (1, <= L) what step t reads
        with torch.no_grad():
            expected = model(window).logits[:, -1]  # (1, V)
        assert (out.logits[t - 10] - expected).abs().max() <= ROUNDING
    with pytest.raises(ValueError, match=r"needs .* more than the model's context"):
        generate(model, prompt, L)  # without the window the request is refused
    with pytest.raises(TypeError, match="slide_context must be True or False, got 1"):
        generate(model, prompt, 3, slide_context=1)


def test_a_sampler_hook_replaces_the_sampling_settings(model):
    """generate(sampler=f) calls f on each step's (B, V) logits and keeps its tokens: the
    argmax as a hook gives greedy decoding, and a hook that picks the second best changes
    the text; every other rule (cache, end tokens, padding) stays generate's own."""
    prompts = [[1, 2, 3], [4, 5]]
    greedy = generate(model, prompts, 6)
    hooked = generate(model, prompts, 6, sampler=lambda logits: logits.argmax(-1))
    assert torch.equal(hooked.tokens, greedy.tokens)
    seen = []

    def second_best(logits):
        seen.append(tuple(logits.shape))
        return logits.topk(2, dim=-1).indices[:, 1]

    other = generate(model, prompts, 6, sampler=second_best)
    assert seen == [(2, model.config.vocab_size)] * 6
    assert not torch.equal(other.new_tokens, greedy.new_tokens)


@pytest.mark.parametrize("sampler, kwargs, error, match", [
    ("not a function", {}, TypeError, "sampler must be a function"),
    (lambda x: x.argmax(-1), {"temperature": 0.7}, ValueError, "either a sampler or"),
    (lambda x: x.argmax(-1), {"top_k": 5}, ValueError, "either a sampler or"),
    (lambda x: x.argmax(-1).float(), {}, ValueError, "long tensor of ids"),
    (lambda x: x.argmax(-1)[:1], {}, ValueError, r"must return a \(2,\)"),
    (lambda x: x.argmax(-1) + 10**6, {}, ValueError, "ids in \\[0, "),
    (lambda x: [0, 0], {}, ValueError, "got list"),
])
def test_bad_samplers_are_refused(model, sampler, kwargs, error, match):
    with pytest.raises(error, match=match):
        generate(model, [[1, 2, 3], [4, 5]], 3, sampler=sampler, **kwargs)


def test_a_request_longer_than_the_context_is_counted_in_words() -> None:
    from tfbook.generate.search import check_request

    with pytest.raises(ValueError, match="a prompt of 1 token plus max_new_tokens=8 needs 9 "
                                         "positions, more than the model's context length 4"):
        check_request(1, 8, 4, [], 10)
    with pytest.raises(ValueError, match="a prompt of 2 tokens plus max_new_tokens=3 needs 5"):
        check_request(2, 3, 4, [], 10)
