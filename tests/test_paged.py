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
    alloc.commit("a", 5)
    assert alloc.reserve("b", 4) == [2]
    alloc.commit("b", 4)
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
    with pytest.raises(ValueError, match="never reserved"):
        alloc.slots("a", 0, 5)
    with pytest.raises(ValueError, match="already has a block table"):
        alloc.add("a")
    with pytest.raises(ValueError, match="no sequence 'z'"):
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


# --- shared prefixes: reference counts and copy-on-write -----------------------------------

def check_counts(alloc: BlockAllocator) -> None:
    """Every block's count is the number of tables that hold it; free blocks are held by none."""
    held = [b for table in alloc.tables.values() for b in table]
    assert [alloc.refs[b] for b in range(alloc.num_blocks)] == [
        held.count(b) for b in range(alloc.num_blocks)]
    assert set(alloc.free).isdisjoint(held) and len(set(alloc.free)) == alloc.num_free
    assert alloc.num_used == len(set(held)) and alloc.num_shared == len(held) - len(set(held))


def test_a_shared_prefix_holds_the_same_blocks_and_copies_on_write():
    alloc = BlockAllocator(num_blocks=8, block_size=4)
    alloc.add("s")
    alloc.reserve("s", 10)
    alloc.commit("s", 10)  # blocks [0, 1, 2]; block 2 holds positions 8, 9
    assert alloc.share_prefix("t", "s", 9) == [0, 1, 2]  # the docstring's case, shifted
    assert alloc.tables["t"] == [0, 1, 2] and alloc.lengths["t"] == 9
    assert alloc.refs[:3] == [2, 2, 2] and alloc.num_used == 3 and alloc.num_shared == 3
    assert alloc.extra_blocks("t", 1) == 1  # its next position lands in shared block 2
    assert alloc.reserve("t", 1) == [3] and alloc.copies == [(2, 3)]
    assert alloc.tables["t"] == [0, 1, 3] and alloc.refs[:4] == [2, 2, 1, 1]
    check_counts(alloc)
    alloc.commit("t", 1)
    assert alloc.reserve("t", 3) == [4] and alloc.copies == [(2, 3)]  # no second copy
    alloc.copies.clear()
    # a prefix of whole blocks is shared without a copy: the next write needs a new block
    assert alloc.share_prefix("u", "s", 8) == [0, 1] and alloc.extra_blocks("u", 1) == 1
    assert alloc.reserve("u", 1) == [5] and alloc.copies == [] and alloc.num_shared == 4
    check_counts(alloc)
    assert alloc.release("s") == [2]  # blocks 0 and 1 stay: t and u still hold them
    assert alloc.refs[:2] == [2, 2] and alloc.num_free == 3
    assert alloc.release("t") == [3, 4] and alloc.release("u") == [0, 1, 5]
    assert alloc.num_free == 8 and alloc.refs == [0] * 8
    check_counts(alloc)


def test_whoever_writes_first_into_a_shared_block_copies_it():
    alloc = BlockAllocator(num_blocks=4, block_size=4)
    alloc.add("s")
    alloc.reserve("s", 2)
    alloc.commit("s", 2)
    alloc.share_prefix("t", "s", 2)  # both hold block 0, partly filled
    assert alloc.reserve("s", 1) == [1] and alloc.copies == [(0, 1)]  # the source writes
    assert alloc.tables == {"s": [1], "t": [0]} and alloc.refs[:2] == [1, 1]
    assert alloc.reserve("t", 1) == [] and alloc.copies == [(0, 1)]  # t now owns block 0
    alloc.release("s")
    assert alloc.copies == []  # a pending copy into a freed block is dropped
    alloc.share_prefix("u", "t", 1)
    with pytest.raises(OutOfBlocksError, match=r"'u' needs 4 more block\(s\) .* only 3 of 4"):
        alloc.reserve("u", 12)  # a copy of block 0 and 3 more blocks: all or none
    assert alloc.tables["u"] == [0] and alloc.copies == [] and alloc.num_free == 3
    check_counts(alloc)


def test_random_operations_keep_the_counts_right():
    """Random adds, shares, writes and releases: the counts always match the tables."""
    g = torch.Generator().manual_seed(5)
    alloc, names = BlockAllocator(num_blocks=24, block_size=3), iter(range(10**6))

    def pick(n: int) -> int:
        return int(torch.randint(0, n, (1,), generator=g))

    for _ in range(400):
        seqs, op = list(alloc.tables), pick(4)
        if op == 0 or not seqs:
            alloc.add(next(names))
        elif op == 1 and any(alloc.lengths[s] for s in seqs):
            source = next(s for s in seqs[pick(len(seqs)):] + seqs if alloc.lengths[s])
            alloc.share_prefix(next(names), source, 1 + pick(alloc.lengths[source]))
        elif op == 2:
            seq, n = seqs[pick(len(seqs))], 1 + pick(7)
            if alloc.extra_blocks(seq, n) <= alloc.num_free:
                first = alloc.lengths[seq] // 3
                alloc.reserve(seq, n)
                # the blocks it will write into are its own
                assert all(alloc.refs[b] == 1 for b in alloc.tables[seq][first:])
                alloc.commit(seq, n)
            alloc.copies.clear()
        else:
            alloc.release(seqs[pick(len(seqs))])
        check_counts(alloc)


def test_copy_on_write_copies_the_keys_into_the_pool(model):
    """t shares 6 of s's positions (block 1 partly filled) and brings 3 of its own: its keys,
    read through its table, are a contiguous cache's keys of its tokens, and s's are intact."""
    s_ids, t_ids = [5, 17, 3, 99, 42, 7, 8, 9], [5, 17, 3, 99, 42, 7, 60, 61, 62]
    cache = PagedKVCache.for_model(model, num_blocks=6, block_size=4)
    cache.allocator.add("s")
    positions, mask = cache.begin_step([("s", len(s_ids))])
    with torch.no_grad():
        model(torch.tensor([s_ids]), positions=positions, attention_mask=mask, cache=cache)
    cache.end_step()
    cache.allocator.share_prefix("t", "s", 6)
    positions, mask = cache.begin_step([("t", 3)])
    assert cache.copied == [(1, 2)] and cache.allocator.tables["t"] == [0, 2, 3]
    with torch.no_grad():
        model(torch.tensor([t_ids[6:]]), positions=positions, attention_mask=mask, cache=cache)
    cache.end_step()
    for seq, ids in (("s", s_ids), ("t", t_ids)):
        contiguous = model.new_cache(len(ids))
        with torch.no_grad():
            model(torch.tensor([ids]), cache=contiguous)
        slots = cache.allocator.slots(seq, 0, len(ids))
        for paged, ref in zip(cache.layers, contiguous.layers, strict=True):
            for pool, want in ((paged.keys, ref.keys), (paged.values, ref.values)):
                got = pool.view(-1, *pool.shape[2:])[slots].transpose(0, 1)  # (H_kv, T, D)
                torch.testing.assert_close(got, want[0], rtol=0, atol=1e-12)


def shared_workload():
    """A source prompt of 10 tokens; three followers share its first 9, then differ."""
    g = torch.Generator().manual_seed(4)
    source = torch.randint(0, 256, (10,), generator=g).tolist()
    followers = [source[:9] + [(source[9] + 1 + i) % 256, 200 + i] for i in range(3)]
    return [source] + followers, [12, 3, 4, 3], [0, 1, 2, 3]


def test_sharing_saves_exactly_the_shared_whole_blocks(model):
    prompts, budgets, arrivals = shared_workload()
    runs = {}
    for share in (False, True):
        batcher = ContinuousBatcher(model, num_blocks=40, block_size=4, max_batch=4,
                                    share_prefixes=share)
        for p, n, t in zip(prompts, budgets, arrivals, strict=True):
            batcher.submit(p, n, arrival=t)
        runs[share] = (batcher, batcher.run())
    (plain, plain_out), (shared, shared_out) = runs[False], runs[True]
    reference = [generate(model, [p], n).new_tokens[0].tolist()
                 for p, n in zip(prompts, budgets, strict=True)]
    assert [plain_out[i] for i in range(4)] == reference == [shared_out[i] for i in range(4)]
    # the same schedule (the pool never binds), each follower reusing 9 positions
    assert [(r.kind, [s for s, _ in r.rows]) for r in plain.history] == [
        (r.kind, [s for s, _ in r.rows]) for r in shared.history]
    assert [shared.requests[i].reused for i in range(4)] == [0, 9, 9, 9]
    fed = {share: sum(n for r in b.history for _, n in r.rows) for share, (b, _) in runs.items()}
    assert fed[False] - fed[True] == 3 * 9
    for a, b in zip(plain.history, shared.history, strict=True):
        # sharing saves exactly the blocks counted twice in the tables: 2 whole blocks for
        # every follower while the source runs (block 2, partly filled, is copied)
        assert a.used_blocks - b.used_blocks == b.shared_blocks
        if 0 in b.tables:
            assert b.shared_blocks == 2 * (len(b.tables) - 1)
        assert b.copies == (a.kind == "prefill" and b.step > 0)  # one copy per follower
        for seq, table in b.tables.items():
            assert len(table) == blocks_needed(b.lengths[seq], 4)
    assert max(b.shared_blocks for b in shared.history) == 6
    assert shared.cache.allocator.num_free == 40 and shared.cache.allocator.num_shared == 0


def test_sharing_survives_preemption(model):
    prefix = [11, 12, 13, 14, 15]
    prompts = [prefix, prefix[:4] + [30], prefix[:4] + [31, 32]]
    batcher = ContinuousBatcher(model, num_blocks=7, block_size=4, max_batch=3,
                                share_prefixes=True)
    for i, p in enumerate(prompts):
        batcher.submit(p, 12, arrival=i)
    out = batcher.run()
    assert sum(r.preemptions for r in batcher.requests.values()) >= 1
    assert max(r.shared_blocks for r in batcher.history) >= 1
    assert [out[i] for i in range(3)] == [generate(model, [p], 12).new_tokens[0].tolist()
                                          for p in prompts]
    alloc = batcher.cache.allocator
    assert alloc.num_free == 7 and alloc.refs == [0] * 7 and alloc.tables == {}


def raises(error: type, message: str, call) -> None:
    """call() raises exactly `error` with exactly `message`."""
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error and str(caught.value) == message


def fresh_allocator() -> BlockAllocator:
    """Sequence "s" holds 6 positions in 2 blocks of 4; 6 blocks in all."""
    alloc = BlockAllocator(num_blocks=6, block_size=4)
    alloc.add("s")
    alloc.reserve("s", 6)
    alloc.commit("s", 6)
    return alloc


ALLOCATOR_BAD_INPUT = [  # (call on a fresh allocator, error, the whole message)
    (lambda a: a.reserve("s", -5), ValueError, "n_new must be >= 0, got -5"),
    (lambda a: a.reserve("s", 2.0), TypeError, "n_new must be an int, got 2.0 of type float"),
    (lambda a: a.reserve("s", True), TypeError, "n_new must be an int, got True of type bool"),
    (lambda a: a.reserve("x", 1), ValueError, "no sequence 'x' in this cache; known: ['s']"),
    (lambda a: a.reserve(["s"], 1), TypeError,
     "a sequence id must be hashable and not a bool, got ['s'] of type list"),
    (lambda a: a.extra_blocks("s", -1), ValueError, "n_new must be >= 0, got -1"),
    (lambda a: a.extra_blocks(True, 1), TypeError,
     "a sequence id must be hashable and not a bool, got True of type bool"),
    (lambda a: a.commit("s", -2), ValueError, "n_new must be >= 0, got -2"),
    (lambda a: a.commit("s", 3), ValueError,
     "sequence 's' holds 2 block(s), 8 positions; 6 stored + 3 new do not fit: reserve them "
     "first"),
    (lambda a: a.commit("x", 1), ValueError, "no sequence 'x' in this cache; known: ['s']"),
    (lambda a: a.release("x"), ValueError, "no sequence 'x' in this cache; known: ['s']"),
    (lambda a: a.release({}), TypeError,
     "a sequence id must be hashable and not a bool, got {} of type dict"),
    (lambda a: a.add("s"), ValueError, "sequence 's' already has a block table"),
    (lambda a: a.add(False), TypeError,
     "a sequence id must be hashable and not a bool, got False of type bool"),
    (lambda a: a.slots("s", -1, 2), ValueError, "start must be >= 0, got -1"),
    (lambda a: a.slots("s", 0, 2.5), TypeError, "stop must be an int, got 2.5 of type float"),
    (lambda a: a.slots("s", 3, 1), ValueError, "slots needs start <= stop, got start=3, stop=1"),
    (lambda a: a.slots("s", 0, 9), ValueError,
     "sequence 's' holds 2 block(s), 8 positions; position 8 needs a block that was never "
     "reserved"),
    (lambda a: a.share_prefix("t", "s", 0), ValueError, "n (positions shared) must be >= 1, got 0"),
    (lambda a: a.share_prefix("t", "s", True), TypeError,
     "n (positions shared) must be an int, got True of type bool"),
    (lambda a: a.share_prefix("t", "s", 7), ValueError,
     "sequence 's' has stored 6 position(s), cannot share its first 7"),
    (lambda a: a.share_prefix("t", "x", 1), ValueError,
     "no sequence 'x' in this cache; known: ['s']"),
    (lambda a: a.share_prefix("s", "s", 1), ValueError, "sequence 's' already has a block table"),
    (lambda a: blocks_needed(-1, 4), ValueError, "n_tokens must be >= 0, got -1"),
    (lambda a: blocks_needed(3, 0), ValueError, "block_size must be >= 1, got 0"),
    (lambda a: blocks_needed(True, 4), TypeError, "n_tokens must be an int, got True of type bool"),
    (lambda a: blocks_needed(3, 4.0), TypeError,
     "block_size must be an int, got 4.0 of type float"),
]


@pytest.mark.parametrize("call, error, message", ALLOCATOR_BAD_INPUT)
def test_the_allocator_refuses_bad_input_and_changes_nothing(call, error, message):
    alloc = fresh_allocator()
    before = (dict(alloc.tables), dict(alloc.lengths), list(alloc.free), list(alloc.refs))
    raises(error, message, lambda: call(alloc))
    assert (alloc.tables, alloc.lengths, list(alloc.free), alloc.refs) == before


def test_the_cache_refuses_bad_input(model):
    config = model.config
    layers, heads, size = config.n_layers, config.n_kv_heads or config.n_heads, config.head_size
    raises(TypeError, "dtype must be a floating-point torch.dtype, got torch.int64",
           lambda: PagedKVCache(2, 4, 4, 2, 8, 64, dtype=torch.long))
    raises(TypeError, "dtype must be a floating-point torch.dtype, got 'float32'",
           lambda: PagedKVCache(2, 4, 4, 2, 8, 64, dtype="float32"))
    raises(TypeError, "device must be a torch.device, a str or None, got int",
           lambda: PagedKVCache(2, 4, 4, 2, 8, 64, device=3))
    raises(ValueError, "n_layers must be >= 1, got 0", lambda: PagedKVCache(0, 4, 4, 2, 8, 64))
    raises(TypeError, "head_size must be an int, got True of type bool",
           lambda: PagedKVCache(2, 4, 4, 2, True, 64))
    raises(TypeError, "PagedKVCache.for_model needs a tfbook decoder (an nn.Module with "
           "parameters and config.n_layers, n_heads, head_size, max_len), got Linear without "
           "config.n_layers, n_heads, head_size, max_len",
           lambda: PagedKVCache.for_model(torch.nn.Linear(2, 2), 4, 4))
    cache = PagedKVCache.for_model(model, num_blocks=4, block_size=4)
    cache.allocator.add("s")
    raises(TypeError, "rows must be a list of (sequence id, new tokens) pairs, got str",
           lambda: cache.begin_step("s"))
    raises(TypeError, "rows must be a list of (sequence id, new tokens) pairs, got dict",
           lambda: cache.begin_step({"s": 1}))
    raises(TypeError, "each row must be a (sequence id, new tokens) pair, got ('s',)",
           lambda: cache.begin_step([("s",)]))
    raises(ValueError, "new tokens of sequence 's' must be >= 1, got -1",
           lambda: cache.begin_step([("s", -1)]))
    raises(TypeError, "new tokens of sequence 's' must be an int, got True of type bool",
           lambda: cache.begin_step([("s", True)]))
    raises(ValueError, "no sequence 'x' in this cache; known: ['s']",
           lambda: cache.begin_step([("x", 1)]))
    raises(ValueError, "a step needs at least one row, got none", lambda: cache.begin_step([]))
    assert cache.plan is None and cache.allocator.num_free == 4  # nothing was reserved
    cache.begin_step([("s", 2)])
    layer = cache.layers[0]
    k = torch.zeros(1, heads, 2, size, dtype=torch.float64)
    raises(TypeError, "update needs k as a (B, H_kv, T, D) tensor, got list",
           lambda: layer.update([1, 2], k))
    raises(TypeError, f"update needs v as a (B, H_kv, T, D) tensor, got a tensor of shape "
           f"(2, {size})", lambda: layer.update(k, k[0, 0]))
    raises(ValueError, "the pool holds torch.float64 on cpu, got k of torch.float32 on cpu: "
           "build the cache with PagedKVCache.for_model(model, ...)",
           lambda: layer.update(k.float(), k))
    raises(ValueError, f"this step was planned for 1 rows of 2 tokens with {heads} key/value "
           f"heads of size {size}, got keys of shape (1, {heads}, 2, {size}) and values of shape "
           f"(1, {heads}, 1, {size})", lambda: layer.update(k, k[:, :, :1]))
    raises(ValueError, "this step was planned for 1 rows (begin_step), got a batch of 3",
           lambda: cache.check_batch(3))
    raises(RuntimeError, "a step is already planned: call end_step() after its forward",
           lambda: cache.begin_step([("s", 1)]))
    assert layers == len(cache.layers)


def test_the_batcher_refuses_bad_input(model):
    def make(**options):
        return ContinuousBatcher(model, num_blocks=8, block_size=4, **options)

    raises(TypeError, "share_prefixes must be True or False, got 1",
           lambda: make(share_prefixes=1))
    raises(TypeError, "pad_id must be an int, got True of type bool", lambda: make(pad_id=True))
    raises(TypeError, "pad_id must be an int, got 1.0 of type float", lambda: make(pad_id=1.0))
    raises(ValueError, "pad_id must be an int in [0, 256), got -1", lambda: make(pad_id=-1))
    raises(TypeError, "max_batch must be an int, got True of type bool",
           lambda: make(max_batch=True))
    raises(ValueError, "max_batch must be >= 1, got -2", lambda: make(max_batch=-2))
    raises(ValueError, "num_blocks must be >= 1, got -5",
           lambda: ContinuousBatcher(model, num_blocks=-5, block_size=4))
    with pytest.raises(TypeError, match="end_ids must be an int token id or a sequence"):
        make(end_ids=True)
    batcher = make()
    raises(ValueError, "max_new_tokens must be a positive int, got -5",
           lambda: batcher.submit([1, 2], -5))
    raises(TypeError, "max_new_tokens must be an int, got True of type bool",
           lambda: batcher.submit([1, 2], True))
    raises(TypeError, "max_new_tokens must be an int, got 2.5 of type float",
           lambda: batcher.submit([1, 2], 2.5))
    raises(TypeError, "arrival must be an int (a step number), got True of type bool",
           lambda: batcher.submit([1, 2], 2, arrival=True))
    raises(TypeError, "arrival must be an int (a step number), got 1.5 of type float",
           lambda: batcher.submit([1, 2], 2, arrival=1.5))
    raises(ValueError, "arrival must be a step number >= 0, got -1",
           lambda: batcher.submit([1, 2], 2, arrival=-1))
    raises(TypeError, "a sequence id must be hashable and not a bool, got [1] of type list",
           lambda: batcher.submit([1, 2], 2, request_id=[1]))
    raises(TypeError, "a sequence id must be hashable and not a bool, got True of type bool",
           lambda: batcher.submit([1, 2], 2, request_id=True))
    raises(TypeError, "token ids must be ints, got True of type bool in prompt 0",
           lambda: batcher.submit([1, True], 2))
    assert batcher.requests == {} and not batcher.waiting  # nothing was queued



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
