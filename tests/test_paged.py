"""The paged KV cache and continuous batching (tfbook.generate.paged, .scheduler).

Token identity with one-by-one greedy `generate` is checked on tiny models in float64, where
batching changes a logit by about 1e-15 and the random models' argmax margins are far above
that; on SmolLM2 in float32 only where every reference margin is far above float32 rounding
(asserted first). Hugging Face's `generate_batch` (continuous batching on its paged cache)
is run on a tiny random Llama in float64 and gives the same tokens.
"""

import pytest
import torch

from tfbook.generate.paged import BlockAllocator, OutOfBlocksError, PagedKVCache, blocks_needed
from tfbook.generate.scheduler import (
    ContinuousBatcher,
    contiguous_bytes,
    generate_paged,
    generate_static,
)
from tfbook.generate.search import generate
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.models.llama import tiny_llama

LENGTHS = [3, 9, 1, 14, 5, 7, 2, 11]  # prompt lengths
BUDGETS = [5, 2, 12, 4, 9, 1, 7, 3]  # max_new_tokens


def tiny(config: GPTConfig) -> GPT:
    torch.manual_seed(0)
    return GPT(config).double().eval()


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    return tiny(tiny_llama() if request.param == "llama" else GPTConfig.tiny())


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def reference(model, prompts):
    """One request at a time through the contiguous cache."""
    return [generate(model, [p], n).new_tokens[0].tolist()
            for p, n in zip(prompts, BUDGETS, strict=True)]


def run_batcher(model, prompts, num_blocks, block_size, max_batch, arrivals=None):
    batcher = ContinuousBatcher(model, num_blocks, block_size, max_batch)
    for i, (p, n) in enumerate(zip(prompts, BUDGETS, strict=True)):
        batcher.submit(p, n, arrival=0 if arrivals is None else arrivals[i])
    return batcher, batcher.run()


# --- the allocator -------------------------------------------------------------------------

def test_allocator_takes_blocks_only_when_the_last_is_full_and_frees_them():
    alloc = BlockAllocator(num_blocks=6, block_size=4)
    alloc.add("a")
    alloc.add("b")
    assert alloc.reserve("a", 5) == [0, 1]  # 5 positions: two blocks
    alloc.lengths["a"] = 5
    assert alloc.reserve("b", 4) == [2]
    alloc.lengths["b"] = 4
    assert alloc.reserve("a", 3) == []  # positions 5..7 fit in block 1
    assert alloc.reserve("b", 1) == [3]  # block 2 is full
    assert alloc.tables == {"a": [0, 1], "b": [2, 3]} and alloc.num_free == 2
    assert alloc.slots("a", 3, 6) == [3, 4, 5]
    assert alloc.release("a") == [0, 1]
    assert list(alloc.free) == [4, 5, 0, 1]  # freed blocks go to the back of the list
    alloc.add("c")
    assert alloc.reserve("c", 9) == [4, 5, 0]  # and are reused
    assert alloc.num_used == 5


def test_slots_follow_the_block_table():
    alloc = BlockAllocator(num_blocks=8, block_size=4)
    alloc.add(0)
    alloc.tables[0] = [5, 2]
    assert alloc.slots(0, 3, 6) == [23, 8, 9]  # the docstring's example
    assert blocks_needed(9, 4) == 3 and blocks_needed(8, 4) == 2 and blocks_needed(1, 16) == 1


def test_out_of_blocks_is_refused_all_or_nothing():
    alloc = BlockAllocator(num_blocks=3, block_size=2)
    alloc.add("a")
    alloc.add("b")
    alloc.reserve("a", 4)
    with pytest.raises(OutOfBlocksError, match="needs 2 more block.*only 1 of 3 are free"):
        alloc.reserve("b", 3)
    assert alloc.tables["b"] == [] and alloc.num_free == 1  # nothing was taken
    with pytest.raises(OutOfBlocksError, match="never reserved"):
        alloc.slots("a", 0, 5)
    with pytest.raises(ValueError, match="already has a block table"):
        alloc.add("a")
    with pytest.raises(KeyError, match="no sequence 'z'"):
        alloc.release("z")


# --- token identity ------------------------------------------------------------------------

@pytest.mark.parametrize("block_size, num_blocks, max_batch", [(4, 12, 3), (1, 40, 8), (16, 8, 4)])
def test_every_request_gets_the_tokens_of_one_by_one_generate(
        model, prompts, reference, block_size, num_blocks, max_batch):
    arrivals = [0, 0, 1, 2, 2, 5, 9, 9]  # later requests join while others decode
    batcher, out = run_batcher(model, prompts, num_blocks, block_size, max_batch, arrivals)
    assert [out[i] for i in range(len(prompts))] == reference
    kinds = {r.kind for r in batcher.history}
    assert kinds <= {"prefill", "decode", "idle"} and {"prefill", "decode"} <= kinds
    # a request was admitted while another was in the middle of its answer
    assert any(r.kind == "prefill" and any(
        batcher.requests[s].output for s in r.lengths if s not in dict(r.rows))
        for r in batcher.history)
    decode_rows = [len(r.rows) for r in batcher.history if r.kind == "decode"]
    assert max(decode_rows) > 1  # rows of different lengths in one forward pass
    assert batcher.cache.allocator.num_free == num_blocks  # no block leaked
    assert batcher.cache.allocator.tables == {}


def test_preemption_frees_blocks_and_recomputes_the_same_tokens(model, prompts, reference):
    # 4 blocks of 4 positions: the long answers cannot all grow at once
    batcher, out = run_batcher(model, prompts, num_blocks=5, block_size=4, max_batch=4)
    assert [out[i] for i in range(len(prompts))] == reference
    short = [[7, 8], [9], [10, 11, 12]]
    batcher = ContinuousBatcher(model, num_blocks=4, block_size=4, max_batch=3)
    for p in short:
        batcher.submit(p, 12)
    out = batcher.run()
    assert sum(r.preemptions for r in batcher.requests.values()) >= 1
    assert any(r.preempted for r in batcher.history)
    expected = [generate(model, [p], 12).new_tokens[0].tolist() for p in short]
    assert [out[i] for i in range(3)] == expected
    assert batcher.cache.allocator.num_free == 4


def test_end_ids_retire_a_request_as_generate_stops_it(model, prompts, reference):
    end = reference[2][4]  # a token the third request writes at its fifth step
    out = generate_paged(model, prompts, BUDGETS, num_blocks=16, block_size=4, end_ids=end)
    for p, n, got in zip(prompts, BUDGETS, out, strict=True):
        row = generate(model, [p], n, end_ids=end).new_tokens[0].tolist()
        ref = row[:row.index(end) + 1] if end in row else row
        assert got == ref
    assert len(out[2]) <= 5 and out[2][-1] == end


def test_static_batching_baseline_gives_the_same_tokens(model, prompts, reference):
    out, computed = generate_static(model, prompts, BUDGETS, batch_size=3)
    assert out == reference
    useful = sum(len(p) + n - 1 for p, n in zip(prompts, BUDGETS, strict=True))
    assert computed > useful  # padding and finished rows were computed too


# --- block tables and memory ---------------------------------------------------------------

def test_block_tables_hold_exactly_the_blocks_their_lengths_need(model, prompts):
    batcher = ContinuousBatcher(model, num_blocks=10, block_size=4, max_batch=4)
    for i, (p, n) in enumerate(zip(prompts, BUDGETS, strict=True)):
        batcher.submit(p, n, arrival=i)
    block_bytes = batcher.cache.block_bytes()
    config = model.config
    assert block_bytes == 2 * config.n_layers * 4 * (config.n_kv_heads or config.n_heads) * (
        config.head_size) * 8
    while not batcher.done:
        record = batcher.step()
        held = [b for table in record.tables.values() for b in table]
        assert len(held) == len(set(held)) == record.used_blocks  # no block shared or lost
        for seq, table in record.tables.items():
            assert len(table) == blocks_needed(record.lengths[seq], 4)
            request = batcher.requests[seq]
            # the cache holds every token but the last one written
            assert record.lengths[seq] == len(request.tokens) - 1
        assert record.used_bytes == record.used_blocks * block_bytes
    assert batcher.cache.memory_bytes() == 0
    peak = max(r.used_bytes for r in batcher.history)
    longest = max(n + m for n, m in zip(LENGTHS, BUDGETS, strict=True))
    assert peak < contiguous_bytes(model, 4, longest)


def test_the_pool_holds_the_keys_a_contiguous_cache_holds(model):
    """After a prefill, the slots of a sequence hold the keys the contiguous cache stored."""
    prompt = [5, 17, 3, 99, 42, 7]
    cache = PagedKVCache.for_model(model, num_blocks=4, block_size=4)
    cache.allocator.add("s")
    cache.allocator.add("t")
    cache.allocator.reserve("t", 3)  # another sequence holds block 0 first
    positions, mask = cache.begin_step([("s", len(prompt))])
    with torch.no_grad():
        model(torch.tensor([prompt]), positions=positions, attention_mask=mask, cache=cache)
    cache.end_step()
    contiguous = model.new_cache(len(prompt))
    with torch.no_grad():
        model(torch.tensor([prompt]), cache=contiguous)
    slots = cache.allocator.slots("s", 0, len(prompt))
    assert cache.allocator.tables["s"] == [1, 2]
    for paged, ref in zip(cache.layers, contiguous.layers, strict=True):
        got = paged.keys.view(-1, *paged.keys.shape[2:])[slots].transpose(0, 1)  # (H_kv, T, D)
        torch.testing.assert_close(got, ref.keys[0], rtol=0, atol=1e-12)


# --- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("value, error, match", [
    (0, ValueError, "block_size must be >= 1, got 0"),
    (-3, ValueError, "block_size must be >= 1"),
    (2.0, TypeError, "block_size must be an int, got 2.0"),
    (True, TypeError, "block_size must be an int"),
])
def test_bad_block_size_is_refused(model, value, error, match):
    with pytest.raises(error, match=match):
        ContinuousBatcher(model, num_blocks=4, block_size=value)
    with pytest.raises(error, match=match):
        BlockAllocator(4, value)


def test_bad_pool_and_batch_sizes_are_refused(model):
    with pytest.raises(ValueError, match="num_blocks must be >= 1, got 0"):
        ContinuousBatcher(model, num_blocks=0, block_size=4)
    with pytest.raises(TypeError, match="max_batch must be an int"):
        ContinuousBatcher(model, num_blocks=4, block_size=4, max_batch="8")
    with pytest.raises(TypeError, match="ContinuousBatcher needs a tfbook model"):
        ContinuousBatcher(torch.nn.Linear(2, 2), num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="end token ids must be ints in"):
        ContinuousBatcher(model, num_blocks=4, block_size=4, end_ids=[10**6])


def test_bad_requests_are_refused(model):
    batcher = ContinuousBatcher(model, num_blocks=3, block_size=4)
    with pytest.raises(ValueError, match="at least one token, got an empty prompt"):
        batcher.submit([], 3)
    with pytest.raises(ValueError, match="needs 13 positions, more than the whole pool holds "
                                         r"\(3 blocks x 4 = 12\)"):
        batcher.submit([1] * 10, 3)
    with pytest.raises(TypeError, match="encode text with the tokenizer first"):
        batcher.submit("hello", 3)
    with pytest.raises(TypeError, match="token ids must be ints, got 1.5"):
        batcher.submit([1, 1.5], 3)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, V=256\), got 256"):
        batcher.submit([1, 256], 3)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int, got 0"):
        batcher.submit([1, 2], 0)
    with pytest.raises(ValueError, match="arrival must be a step number"):
        batcher.submit([1, 2], 2, arrival=-1)
    batcher.submit([1, 2], 2, request_id="x")
    with pytest.raises(ValueError, match="request id 'x' is already taken"):
        batcher.submit([3], 2, request_id="x")
    big = ContinuousBatcher(model, num_blocks=100, block_size=4)
    with pytest.raises(ValueError, match="more than the model's context length 64"):
        big.submit([1] * 60, 10)
    with pytest.raises(RuntimeError, match="no request waits or runs"):
        ContinuousBatcher(model, num_blocks=3, block_size=4).step()


def test_the_cache_refuses_a_forward_pass_it_was_not_told_about(model):
    cache = PagedKVCache.for_model(model, num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="planned for None rows"):
        model(torch.tensor([[1, 2]]), cache=cache)
    cache.allocator.add("s")
    with pytest.raises(OutOfBlocksError, match="needs 3 more block.*only 2 of 2 are free"):
        cache.begin_step([("s", 9)])
    assert cache.plan is None and cache.allocator.num_free == 2
    with pytest.raises(ValueError, match="new tokens of sequence 's' must be >= 1"):
        cache.begin_step([("s", 0)])
    with pytest.raises(ValueError, match="each sequence may appear once"):
        cache.begin_step([("s", 1), ("s", 1)])
    with pytest.raises(NotImplementedError, match="beam search uses the contiguous KVCache"):
        cache.reorder(torch.tensor([0]))


# --- SmolLM2 -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer
    return load_smollm2(), load_smollm2_tokenizer()


def test_smollm2_requests_get_the_tokens_of_one_by_one_generate(smollm2):
    model, tokenizer = smollm2
    texts = ["The capital of France is", "def add(a, b):\n    return",
             "One, two, three, four,"]
    prompts = [tokenizer.encode(t) for t in texts]
    budgets = [5, 3, 6]
    batcher = ContinuousBatcher(model, num_blocks=6, block_size=4, max_batch=3,
                                keep_logits=True)
    for p, n in zip(prompts, budgets, strict=True):
        batcher.submit(p, n)
    out = batcher.run()
    for i, (p, n) in enumerate(zip(prompts, budgets, strict=True)):
        alone = generate(model, [p], n, keep_logits=True)
        for ref, batched in zip(alone.logits, batcher.requests[i].logits, strict=True):
            top2 = ref[0].topk(2).values
            # float32 rounding moves the batched logits by d; a margin above 2d cannot flip
            assert float(top2[0] - top2[1]) > 2 * float((ref[0] - batched).abs().max())
        assert out[i] == alone.new_tokens[0].tolist()


def test_keep_logits_must_be_a_bool(model):
    with pytest.raises(TypeError, match="keep_logits must be True or False, got 1"):
        ContinuousBatcher(model, num_blocks=4, block_size=4, keep_logits=1)


# --- Hugging Face's continuous batching ----------------------------------------------------

@pytest.mark.parametrize("attn", ["sdpa", "paged|eager"])
def test_same_tokens_as_hf_generate_batch(attn):
    """HF `generate_batch` runs its own scheduler and paged cache (transformers 5.23, CPU)."""
    transformers = pytest.importorskip("transformers")
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from tfbook.checkpoints.hf_llama import tfbook_from_hf_llama

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation=attn, dtype=torch.float64, pad_token_id=0)
    hf = transformers.LlamaForCausalLM(config).to(torch.float64).eval()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10], list(range(11, 22))]
    generation = transformers.GenerationConfig(max_new_tokens=6, do_sample=False,
                                               eos_token_id=None, pad_token_id=0)
    batching = ContinuousBatchingConfig(page_size=4, num_blocks=16, max_batch_tokens=64,
                                        max_requests_per_batch=4, allow_block_sharing=False)
    out = hf.generate_batch(prompts, generation_config=generation, progress_bar=False,
                            warmup=False, continuous_batching_config=batching)
    theirs = [out[f"req_{i}"].generated_tokens for i in range(len(prompts))]
    assert [out[f"req_{i}"].prompt_ids for i in range(len(prompts))] == prompts
    ours = generate_paged(tfbook_from_hf_llama(hf), prompts, 6, num_blocks=8, block_size=4)
    assert ours == theirs
