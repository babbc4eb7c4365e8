"""Ring attention (tfbook.parallel.ring): equal to attention over the whole sequence on one
process, on 2 gloo processes (one launch for every scenario), on p = 3, 4 threads standing in
for processes, and simulated for p = 1 .. 4; with the flash chapter's tiles and with torch's
fused CPU kernel per block (kernel="fused")."""

from __future__ import annotations

import itertools
import queue
import threading

import pytest
import torch
import torch.distributed as dist

from tests.parallel_launch import run_in_group  # one launch, results per rank
from tests.test_flash import derived_bounds  # entrywise first-order rounding bounds
from tfbook.attention import attend
from tfbook.masks import causal_mask
from tfbook.parallel import ring
from tfbook.parallel.ddp import NoProcessGroupError
from tfbook.parallel.ring import (
    RingWork,
    check_ring,
    rank_chunks,
    ring_attention,
    shard_sequence,
    simulate_ring_attention,
    unshard_sequence,
)

WORLD = 2
TOL = 2.0 ** -40  # float64 against the one-process reference
# (causal, layout, query heads, key/value heads): every scenario runs in the one launch
SCENARIOS = [(causal, layout, H, H_kv) for causal in (False, True)
             for layout in ("zigzag", "contiguous") for H, H_kv in ((2, 2), (4, 2))]


def inputs(n: int, H: int, H_kv: int, seed: int = 0, B: int = 2, D: int = 8):
    """Whole-sequence q (B, H, n, D), k, v (B, H_kv, n, D) and an upstream gradient, float64."""
    g = torch.Generator().manual_seed(seed)
    q, g_out = (torch.randn(B, H, n, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, H_kv, n, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, g_out


def reference(q, k, v, g_out, causal: bool):
    """Output and gradients of the one-process reference kernel over the whole sequence."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = attend(*leaves, causal=causal, kernel="reference")
    return out.detach(), torch.autograd.grad((out * g_out).sum(), leaves)


def simulated(q, k, v, g_out, p: int, causal: bool, layout: str, kernel: str = "tiles"):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    work: list[RingWork] = []
    out = simulate_ring_attention(*leaves, p, causal, layout, work, kernel=kernel)
    return out.detach(), torch.autograd.grad((out * g_out).sum(), leaves), work


def _run(rank: int, world_size: int) -> dict:
    """One rank: every scenario through the real ring, results saved for the tests to read."""
    results: dict[str, list] = {kernel: [] for kernel in ring.KERNELS}
    for (i, (causal, layout, H, H_kv)), kernel in itertools.product(enumerate(SCENARIOS),
                                                                     ring.KERNELS):
        q, k, v, g_out = inputs(4 * WORLD, H, H_kv, seed=i)
        local = [shard_sequence(t, rank, WORLD, layout).requires_grad_() for t in (q, k, v)]
        work = RingWork()
        out = ring_attention(*local, causal=causal, layout=layout, work=work, kernel=kernel)
        grads = torch.autograd.grad((out * shard_sequence(g_out, rank, WORLD, layout)).sum(),
                                    local)
        # the simulation in the same process (same threads): must give the same numbers
        sim_out, sim_grads, sim_work = simulated(q, k, v, g_out, WORLD, causal, layout,
                                                 kernel)
        same = (torch.equal(out, shard_sequence(sim_out, rank, WORLD, layout))
                and all(torch.equal(a, shard_sequence(b, rank, WORLD, layout))
                        for a, b in zip(grads, sim_grads, strict=True))
                and sim_work[rank] == work)
        results[kernel].append({"out": out.detach(), "grads": [t.detach() for t in grads],
                        "work": (work.forward, work.backward, work.scores),
                        "same_as_simulation": same})
    errors = {}
    q, k, v, _ = inputs(6, 2, 2)  # 3 tokens per rank: zig-zag needs an even share
    try:
        ring_attention(q[..., :3, :], k[..., :3, :], v[..., :3, :], layout="zigzag")
    except ValueError as error:
        errors["odd"] = str(error)
    return {"results": results, "errors": errors}


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """One launch of 2 gloo processes for every scenario -> [rank 0's, rank 1's] results."""
    return run_in_group(_run, tmp_path_factory.mktemp("ring"), WORLD, timeout=60)


def max_diff(a, b) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("kernel", ring.KERNELS)
@pytest.mark.parametrize("i", range(len(SCENARIOS)),
                         ids=[f"{'causal' if c else 'full'}-{lay}-H{h}-Hkv{hk}"
                              for c, lay, h, hk in SCENARIOS])
def test_processes_equal_one_process_reference(launch, i, kernel):
    causal, layout, H, H_kv = SCENARIOS[i]
    q, k, v, g_out = inputs(4 * WORLD, H, H_kv, seed=i)
    ref_out, ref_grads = reference(q, k, v, g_out, causal)
    ranks = [launch[r]["results"][kernel][i] for r in range(WORLD)]
    out = unshard_sequence([r["out"] for r in ranks], layout)
    assert max_diff(out, ref_out) <= TOL
    for g in range(3):  # dq, dk, dv of the whole sequence, put back together
        assert max_diff(unshard_sequence([r["grads"][g] for r in ranks], layout),
                        ref_grads[g]) <= TOL
    assert all(r["same_as_simulation"] for r in ranks)


@pytest.mark.parametrize("kernel", ring.KERNELS)
def test_processes_zigzag_work_is_equal_contiguous_is_not(launch, kernel):
    for i, (causal, layout, _, _) in enumerate(SCENARIOS):
        forward, backward, scores = zip(*(launch[r]["results"][kernel][i]["work"]
                                          for r in range(WORLD)), strict=True)
        assert forward == backward  # the backward recomputes exactly the forward's blocks
        if causal and layout == "contiguous":  # rank 0 skips rank 1's (later) block
            assert forward == ([1, 0], [1, 1]) and scores[1] == 2 * scores[0]
        elif causal:  # 3 blocks at its own step, 2 at the other: 2p + 1 in all
            assert forward == ([3, 2], [3, 2]) and scores[0] == scores[1]
        else:
            assert forward[0] == forward[1] and scores[0] == scores[1]


def test_processes_refuse_an_odd_share_under_zigzag(launch):
    for r in range(WORLD):
        assert "multiple of 2" in launch[r]["errors"]["odd"]


@pytest.mark.parametrize("kernel", ring.KERNELS)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
def test_simulation_equals_one_process_reference(p, layout, causal, kernel):
    q, k, v, g_out = inputs(2 * p * 3, 4, 2, seed=p)
    ref_out, ref_grads = reference(q, k, v, g_out, causal)
    out, grads, work = simulated(q, k, v, g_out, p, causal, layout, kernel)
    assert max_diff(out, ref_out) <= TOL
    assert all(max_diff(a, b) <= TOL for a, b in zip(grads, ref_grads, strict=True))
    assert len(work) == p and all(len(w.forward) == len(w.backward) == p for w in work)
    assert all(w.forward == w.backward for w in work)


@pytest.mark.parametrize("kernel", ring.KERNELS)
@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
def test_simulation_in_float32_within_derived_rounding_bounds(p, layout, causal, kernel):
    """float32: the ring and the reference kernel each round, in different orders; each entry
    differs by at most the sum of both sides' first-order worst-case bounds (tests.test_flash)."""
    q, k, v, g_out = (t.float() for t in inputs(2 * p * 4, 4, 2, seed=p))
    ref_out, ref_grads = reference(q, k, v, g_out, causal)
    out, grads, _ = simulated(q, k, v, g_out, p, causal, layout, kernel)
    mask = causal_mask(q.size(-2), q.size(-2)) if causal else None
    bounds, _ = derived_bounds(q, k, v, g_out, mask, torch.float32)
    for name, a, b, bound in zip(("O", "dQ", "dK", "dV"), (out, *grads), (ref_out, *ref_grads),
                                 bounds, strict=True):
        err = (a - b).abs().double()
        assert bool((err <= 2 * bound).all()), (name, float((err / bound).max()))


@pytest.mark.parametrize("p", [2, 3, 4])
def test_zigzag_gives_every_rank_the_same_causal_work(p):
    n, c = 2 * p * 3, 3
    q, k, v, g_out = inputs(n, 2, 2)
    *_, zigzag = simulated(q, k, v, g_out, p, True, "zigzag")
    *_, contiguous = simulated(q, k, v, g_out, p, True, "contiguous")
    # zig-zag: 3 blocks at a rank's own step, 2 at every other: 2p + 1 blocks of c x c each
    assert all(w.forward == [3] + [2] * (p - 1) for w in zigzag)
    assert all(w.scores == (2 * p + 1) * c * c for w in zigzag)
    # contiguous: rank r sees the blocks of ranks 0 .. r only, (r + 1) blocks of (2c)^2
    assert [w.scores for w in contiguous] == [(r + 1) * (2 * c) ** 2 for r in range(p)]
    # every query-key pair the mask keeps is computed once, plus the masked half of the
    # diagonal blocks: p (2p + 1) c^2 scores under zig-zag
    assert sum(w.scores for w in zigzag) == p * (2 * p + 1) * c * c


def test_shards_and_chunks():
    assert [rank_chunks(r, 2, "zigzag") for r in range(2)] == [(0, 3), (1, 2)]
    assert [rank_chunks(r, 3, "contiguous") for r in range(3)] == [(0,), (1,), (2,)]
    x = torch.arange(8.0).reshape(1, 8, 1)
    parts = [shard_sequence(x, r, 2, "zigzag") for r in range(2)]
    assert parts[0].flatten().tolist() == [0, 1, 6, 7]
    assert parts[1].flatten().tolist() == [2, 3, 4, 5]
    assert torch.equal(unshard_sequence(parts, "zigzag"), x)


class ThreadRing:
    """A stand-in for torch.distributed with p ranks as p threads of this process: messages
    go through one queue per (sender, receiver, tag), every send is logged. It lets the real
    ring's code run with p > 2, where the rank it sends to and the one it receives from differ
    (the 2-process launch cannot tell them apart)."""

    def __init__(self, world_size: int) -> None:
        self.world_size, self.local, self.sends = world_size, threading.local(), []
        self.boxes = {(a, b, t): queue.Queue() for a in range(world_size)
                      for b in range(world_size) for t in range(4)}

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_rank(self) -> int:
        return self.local.rank

    def get_world_size(self) -> int:
        return self.world_size

    def isend(self, tensor, dst: int, tag: int):
        self.sends.append((self.local.rank, dst))
        self.boxes[self.local.rank, dst, tag].put(tensor.clone())
        return Request(lambda: None)

    def irecv(self, tensor, src: int, tag: int):
        box = self.boxes[src, self.local.rank, tag]
        return Request(lambda: tensor.copy_(box.get(timeout=30)))


class Request:
    def __init__(self, finish) -> None:
        self.finish = finish

    def wait(self) -> None:
        self.finish()


@pytest.mark.parametrize("p", [3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
def test_real_ring_code_on_p_threads_equals_simulation(monkeypatch, p, layout, causal):
    fake = ThreadRing(p)
    monkeypatch.setattr(ring, "dist", fake)
    q, k, v, g_out = inputs(2 * p * 2, 4, 2, seed=p)
    results: dict[int, tuple] = {}

    def rank_main(rank: int) -> None:
        fake.local.rank = rank
        local = [shard_sequence(t, rank, p, layout).requires_grad_() for t in (q, k, v)]
        work = RingWork()
        out = ring_attention(*local, causal=causal, layout=layout, work=work)
        grads = torch.autograd.grad((out * shard_sequence(g_out, rank, p, layout)).sum(), local)
        results[rank] = (out.detach(), grads, work)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(p))
    assert all(dst == (src + 1) % p for src, dst in fake.sends)  # always to the next rank
    # forward: k, v passed p - 1 times; backward: k, v p - 1 times, dk, dv p times
    assert len(fake.sends) == p * (4 * (p - 1) + 2 * p)
    sim_out, sim_grads, sim_work = simulated(q, k, v, g_out, p, causal, layout)
    for r in range(p):
        out, grads, work = results[r]
        assert torch.equal(out, shard_sequence(sim_out, r, p, layout))
        assert all(torch.equal(a, shard_sequence(b, r, p, layout))
                   for a, b in zip(grads, sim_grads, strict=True))
        assert work == sim_work[r]
    ref_out, _ = reference(q, k, v, g_out, causal)
    assert max_diff(sim_out, ref_out) <= TOL


def test_not_in_a_process_group():
    q, k, v, _ = inputs(4, 2, 2)
    assert not dist.is_initialized()
    with pytest.raises(NoProcessGroupError, match="process group.*init_process_group"):
        ring_attention(q, k, v)


def test_bad_input():
    q, k, v, _ = inputs(6, 2, 2)
    with pytest.raises(ValueError, match="multiple of 4"):  # 6 tokens, zig-zag over 2: 4 chunks
        simulate_ring_attention(q, k, v, 2, layout="zigzag")
    with pytest.raises(ValueError, match="multiple of 4"):
        shard_sequence(q, 0, 2, "zigzag")
    simulate_ring_attention(q, k, v, 3, layout="contiguous")  # 3 chunks of 2: fine
    with pytest.raises(ValueError, match="layout"):
        simulate_ring_attention(q, k, v, 2, layout="striped")
    with pytest.raises(ValueError, match=r"kernel must be one of \('tiles', 'fused'\)"):
        simulate_ring_attention(q, k, v, 3, layout="contiguous", kernel="sdpa")
    with pytest.raises(ValueError, match="world_size"):
        simulate_ring_attention(q, k, v, 0)
    with pytest.raises(TypeError, match="causal"):
        simulate_ring_attention(q, k, v, 2, causal=1)
    with pytest.raises(TypeError, match="one dtype"):
        simulate_ring_attention(q, k.float(), v, 2)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        simulate_ring_attention(q[:, :1], k, v, 2, layout="contiguous")
    with pytest.raises(ValueError, match=r"\(B, heads, length, head size\)"):
        simulate_ring_attention(q[0], k, v, 2)
    with pytest.raises(TypeError, match="work"):
        simulate_ring_attention(q, k, v, 3, layout="contiguous", work=RingWork())
    with pytest.raises(ValueError, match="rank"):
        rank_chunks(2, 2, "zigzag")
    with pytest.raises(ValueError, match="one shape"):
        unshard_sequence([q, k[..., :4, :]], "contiguous")
    assert ring.LAYOUTS == ("zigzag", "contiguous")
    assert check_ring(8, 2, "zigzag") == 4 and check_ring(6, 3, "contiguous") == 2
    for n, p, layout, chunks in ((6, 2, "zigzag", 4), (7, 2, "contiguous", 2),
                                 (8, 3, "zigzag", 6)):
        with pytest.raises(ValueError, match=rf"cuts the sequence into {chunks} equal chunks.*"
                                             rf"multiple of {chunks}, got {n}"):
            check_ring(n, p, layout)
    for bad in (0, 4.0, True):
        with pytest.raises(ValueError, match="n \\(the sequence length\\) must be an int"):
            check_ring(bad, 2)
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        check_ring(8, 0)
