"""Continuous batching on a paged cache against static batching, on SmolLM2-135M-Instruct.

    python bench/bench_paged.py     # prints a table, writes bench/results/paged.json
                                    # and book/fast/data/paged_throughput.json (the chapter's)

The workload: REQUESTS requests whose prompts (slices of the stdlib corpus) and answer
lengths (max_new_tokens) are drawn with a fixed seed from wide ranges, all queued at once.
Greedy decoding, no end token, so every request writes exactly its max_new_tokens.

1. Throughput, useful new tokens per second of wall-clock time:
   - static batching: groups of BATCH requests in arrival order, left-padded, each group
     decoded by `generate` until its longest answer is done (finished rows keep computing);
   - continuous batching: `ContinuousBatcher` with at most BATCH running sequences, blocks of
     BLOCK_SIZE positions; a finished request leaves at once and the next one is prefilled.
   Both take turns in every round (after a warm-up round), one process, two threads,
   OMP_WAIT_POLICY=PASSIVE, so a burst of load from other processes slows both alike. Each
   round's wall-clock and CPU time (time.process_time, all threads) are kept, so the spread
   of the ratio over the rounds is on record beside its median and the machine's load. Also
   counted (integers, the same on any machine): forward passes and the token positions they
   computed (B x T per pass, padding included).
2. Memory held by the cache: the bytes of the blocks in use after each step (peak and mean
   over the steps) against a contiguous cache of BATCH rows x the longest request
   (prompt + max_new_tokens) that a batch without paging must hold for any mix of requests,
   and against what static batching's `generate` allocates per group (B x (T + N)).
3. Agreement: how many requests get the same tokens from both (float32: batching changes
   logits by rounding, so a near-tie may differ; the tests check identity where margins allow).
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its thread pool

import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script from a checkout

import statistics  # noqa: E402

from bench_model import machine  # noqa: E402  (the same record as the other benchmarks)
from tqdm import tqdm  # noqa: E402

from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer  # noqa: E402
from tfbook.corpus import stdlib_corpus  # noqa: E402
from tfbook.generate.paged import blocks_needed  # noqa: E402
from tfbook.generate.scheduler import (  # noqa: E402
    ContinuousBatcher,
    contiguous_bytes,
    generate_static,
)

RESULTS = ROOT / "bench" / "results" / "paged.json"
BOOK_COPY = ROOT / "book" / "fast" / "data" / "paged_throughput.json"  # the chapter's dropdown
THREADS = 2
REQUESTS = 16
BATCH = 8  # rows of a static batch, and running sequences of the continuous batcher
BLOCK_SIZE = 16
PROMPT_RANGE = (8, 96)  # prompt lengths drawn uniformly from this range (tokens)
NEW_RANGE = (4, 64)  # max_new_tokens drawn uniformly from this range
REPEATS = 3  # timed rounds (each runs the whole workload both ways), after one warm-up


def workload() -> tuple[list[list[int]], list[int]]:
    """Prompts (corpus slices at different offsets) and answer lengths, seeded."""
    g = torch.Generator().manual_seed(0)
    ids = load_smollm2_tokenizer().encode_ordinary(stdlib_corpus(max_bytes=20000))
    lengths = torch.randint(PROMPT_RANGE[0], PROMPT_RANGE[1] + 1, (REQUESTS,), generator=g)
    budgets = torch.randint(NEW_RANGE[0], NEW_RANGE[1] + 1, (REQUESTS,), generator=g)
    starts = torch.randint(0, len(ids) - PROMPT_RANGE[1], (REQUESTS,), generator=g)
    prompts = [ids[s:s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
    return prompts, budgets.tolist()


def run_continuous(model, prompts, budgets, num_blocks) -> ContinuousBatcher:
    batcher = ContinuousBatcher(model, num_blocks, BLOCK_SIZE, BATCH)
    for p, n in zip(prompts, budgets, strict=True):
        batcher.submit(p, n)
    batcher.run()
    return batcher


def main() -> None:
    torch.set_num_threads(THREADS)
    start, load_at_start = time.perf_counter(), os.getloadavg()[0]
    print("loading SmolLM2-135M-Instruct", flush=True)
    model = load_smollm2()
    prompts, budgets = workload()
    longest = max(len(p) + n for p, n in zip(prompts, budgets, strict=True))
    num_blocks = BATCH * blocks_needed(longest, BLOCK_SIZE)  # room for BATCH longest requests
    useful = sum(budgets)

    print(f"{REQUESTS} requests, {useful} new tokens, both ways in each of {1 + REPEATS} "
          f"rounds (the first a warm-up)", flush=True)
    wall: dict[str, list[float]] = {"static": [], "continuous": []}
    cpu: dict[str, list[float]] = {"static": [], "continuous": []}
    with tqdm(total=2 * (1 + REPEATS), desc="bench_paged", unit="run") as bar:
        for round_ in range(1 + REPEATS):
            for name in ("static", "continuous"):
                w0, c0 = time.perf_counter(), time.process_time()
                if name == "static":
                    static_out, static_computed = generate_static(model, prompts, budgets, BATCH)
                else:
                    batcher = run_continuous(model, prompts, budgets, num_blocks)
                if round_:  # the first round warms up
                    wall[name].append(time.perf_counter() - w0)
                    cpu[name].append(time.process_time() - c0)
                bar.update()
    times = {name: statistics.median(ts) for name, ts in wall.items()}
    round_ratios = [s / c for s, c in zip(wall["static"], wall["continuous"], strict=True)]
    cpu_ratios = [s / c for s, c in zip(cpu["static"], cpu["continuous"], strict=True)]
    cont_out = [batcher.requests[i].output for i in range(REQUESTS)]
    steps = [r for r in batcher.history if r.kind != "idle"]
    static_passes = sum(max(budgets[i:i + BATCH]) for i in range(0, REQUESTS, BATCH))
    used = [r.used_bytes for r in steps]
    static_groups = [
        contiguous_bytes(model, len(prompts[i:i + BATCH]),
                         max(map(len, prompts[i:i + BATCH])) + max(budgets[i:i + BATCH]))
        for i in range(0, REQUESTS, BATCH)]
    contiguous = contiguous_bytes(model, BATCH, longest)

    results = {
        "machine": machine(load_average_1min_at_start=load_at_start),
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to float32), greedy",
        "workload": {"requests": REQUESTS, "batch": BATCH, "block_size": BLOCK_SIZE,
                     "num_blocks": num_blocks, "prompt_lengths": list(map(len, prompts)),
                     "max_new_tokens": budgets, "useful_new_tokens": useful},
        "throughput": {
            "static_tokens_per_s": useful / times["static"],
            "continuous_tokens_per_s": useful / times["continuous"],
            "continuous_over_static": times["static"] / times["continuous"],
            "static_seconds": times["static"], "continuous_seconds": times["continuous"],
            "rounds": REPEATS,
            "round_ratios": round_ratios,  # continuous over static, wall-clock, each round
            "cpu_round_ratios": cpu_ratios,  # the same in CPU time (all threads)
            "static_wall_seconds": wall["static"], "continuous_wall_seconds": wall["continuous"],
            "static_cpu_seconds": cpu["static"], "continuous_cpu_seconds": cpu["continuous"],
        },
        "work": {"static_forward_passes": static_passes,
                 "continuous_forward_passes": len(steps),
                 "static_token_positions": static_computed,
                 "continuous_token_positions": sum(r.padded_tokens for r in steps),
                 "preemptions": sum(r.preemptions for r in batcher.requests.values())},
        "memory": {
            "block_bytes": batcher.cache.block_bytes(),
            "paged_peak_bytes": max(used), "paged_mean_bytes": sum(used) / len(used),
            "contiguous_bytes": contiguous,
            "static_group_bytes": static_groups,
            "peak_over_contiguous": max(used) / contiguous,
            "mean_over_contiguous": sum(used) / len(used) / contiguous,
        },
        "agreement": {"requests_identical": sum(
            a == b for a, b in zip(static_out, cont_out, strict=True)),
                      "requests": REQUESTS},
        "seconds": time.perf_counter() - start,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    BOOK_COPY.write_text(json.dumps(results, indent=2) + "\n")
    t, w, m = results["throughput"], results["work"], results["memory"]
    print(f"\n{'':28}{'static':>12}{'continuous':>12}{'ratio':>8}")
    print(f"{'new tokens / s':28}{t['static_tokens_per_s']:12.1f}"
          f"{t['continuous_tokens_per_s']:12.1f}{t['continuous_over_static']:8.2f}x")
    print(f"{'ratio in each round':28}{'':24}" + " ".join(f"{r:.2f}" for r in round_ratios)
          + "  (CPU time: " + " ".join(f"{r:.2f}" for r in cpu_ratios) + ")")
    print(f"{'forward passes':28}{w['static_forward_passes']:12d}"
          f"{w['continuous_forward_passes']:12d}")
    print(f"{'token positions computed':28}{w['static_token_positions']:12d}"
          f"{w['continuous_token_positions']:12d}")
    print(f"\ncache memory: paged peak {m['paged_peak_bytes'] / 2**20:.1f} MiB, mean "
          f"{m['paged_mean_bytes'] / 2**20:.1f} MiB; contiguous {BATCH} x {longest} positions "
          f"{m['contiguous_bytes'] / 2**20:.1f} MiB (peak {m['peak_over_contiguous']:.2f}x, "
          f"mean {m['mean_over_contiguous']:.2f}x)")
    print(f"identical outputs: {results['agreement']['requests_identical']} of {REQUESTS}; "
          f"preemptions: {w['preemptions']}")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} and {BOOK_COPY.relative_to(ROOT)} in "
          f"{results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
