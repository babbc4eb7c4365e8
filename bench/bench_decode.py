"""Decoding against the physical limit: SmolLM2's cached decode step beside the memory bound.

    python bench/bench_decode.py     # prints a table, writes bench/results/decode.json

A decode step at batch 1 multiplies one vector by every weight matrix of the model, so it has
to read every weight from memory once; on a CPU whose caches hold a few megabytes, the speed
of that reading bounds the tokens per second:

    bound (tokens/s) = bandwidth (bytes/s) / bytes read per step

1. Bandwidth, GB/s, two ways: reading (the sum of a 512 MB float32 tensor) and a large
   matrix-vector product (y = W x, W 8,192 x 8,192 float32, 256 MB), the operation a decode
   step is made of.
2. Bytes a step reads: every parameter once (the tied embedding once: the head reads all of
   it, the lookup one row) plus the keys and values cached so far; the bound for each
   bandwidth.
3. Cached greedy decoding, 64 new tokens after a 16-token prompt: tfbook's `generate` and
   Hugging Face's, side by side (median of interleaved rounds), as tokens/s and as a fraction
   of each bound. Goal (issue 17): >= 50% of the matrix-vector bound on 2 threads.
4. Where a step's time goes: torch.profiler over decode steps, self CPU time by kind of
   operation (matrix products, attention, norms, element-wise, copies, other), the number of
   operator calls per step, and the time the weights alone would take at the measured
   matrix-vector bandwidth.

Two threads, OMP_WAIT_POLICY=PASSIVE, float32. Absolute speeds depend on the machine and its
load (the load average is recorded); the fractions of the bound measured in the same run are
what to compare.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its thread pool

import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_generate import check_length, hf_generate, keeping, prompt_ids  # noqa: E402
from bench_model import median_times  # noqa: E402

from tfbook.checkpoints.smollm2 import (  # noqa: E402
    hf_llama_from_gguf,
    load_smollm2,
    read_smollm2_gguf,
)
from tfbook.generate.search import generate  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
RESULTS = ROOT / "bench" / "results" / "decode.json"
THREADS = 2
PROMPT, NEW_TOKENS = 16, 64
REPEATS = 3
GB = 1e9


def bandwidth() -> dict:
    """Bytes per second of reading (a sum) and of a matrix-vector product, float32."""
    big = torch.ones(128 * 1024 * 1024)  # 512 MB
    W = torch.randn(8192, 8192)  # 256 MB
    x = torch.randn(8192)
    t = median_times({"read": lambda: big.sum(), "matvec": lambda: W @ x}, repeats=7, warmup=2)
    return {"read_GB_per_s": big.numel() * 4 / t["read"] / GB,
            "matvec_GB_per_s": W.numel() * 4 / t["matvec"] / GB}


def step_bytes(model, context: int) -> dict:
    """Bytes one decode step reads: the weights once, and the keys and values of `context`
    earlier positions (the lookup's single row of the tied embedding is not counted)."""
    seen, weights = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            weights += p.numel() * p.element_size()
    c = model.config
    head_size = c.d_model // c.n_heads
    kv = 2 * c.n_layers * (c.n_kv_heads or c.n_heads) * head_size * context * 4
    return {"weights": weights, "kv_cache": kv, "total": weights + kv}


def bench_decode(ours, hf, x: torch.Tensor) -> dict:
    out: dict = {}
    with torch.no_grad():
        generate(ours, x, 2), hf_generate(hf, x, 2)  # warm-up
        t = median_times({
            "ours": keeping(out, "ours", lambda: generate(ours, x, NEW_TOKENS).tokens),
            "hf": keeping(out, "hf", lambda: hf_generate(hf, x, NEW_TOKENS)),
        }, repeats=REPEATS, warmup=0)
    check_length(out["ours"], x, NEW_TOKENS, "tfbook")
    check_length(out["hf"], x, NEW_TOKENS, "Hugging Face")
    return {"tfbook_tokens_per_s": NEW_TOKENS / t["ours"], "hf_tokens_per_s": NEW_TOKENS / t["hf"],
            "same_tokens": torch.equal(out["ours"], out["hf"])}


KINDS = (  # operator name fragments -> kind, first match wins
    ("mm", "matrix products"), ("matmul", "matrix products"), ("linear", "matrix products"),
    ("addmm", "matrix products"), ("bmm", "matrix products"),
    ("scaled_dot_product", "attention"), ("softmax", "attention"),
    ("norm", "norms"), ("rsqrt", "norms"), ("pow", "norms"), ("mean", "norms"),
    ("copy", "copies"), ("cat", "copies"), ("contiguous", "copies"), ("clone", "copies"),
    ("index", "copies"), ("slice", "copies"),
    ("mul", "element-wise"), ("add", "element-wise"), ("silu", "element-wise"),
    ("neg", "element-wise"), ("sub", "element-wise"), ("div", "element-wise"),
)


def kind_of(name: str) -> str:
    base = name.removeprefix("aten::")
    for fragment, kind in KINDS:
        if fragment in base:
            return kind
    return "other"


def profile_steps(ours, x: torch.Tensor, steps: int = 16) -> dict:
    """Self CPU time by kind of operation over `steps` cached decode steps (after the
    prefill), and the operator calls per step."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        cache = ours.new_cache(x.size(1) + steps + 1)
        logits = ours(x, cache=cache, last_only=True).logits[:, -1]
        token = logits.argmax(-1, keepdim=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                logits = ours(token, cache=cache, last_only=True).logits[:, -1]
                token = logits.argmax(-1, keepdim=True)
            wall = time.perf_counter() - start
    by_kind, calls, self_time = defaultdict(float), Counter(), Counter()
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            by_kind[kind_of(event.key)] += event.self_cpu_time_total / 1e6
            calls[event.key] += event.count
            self_time[event.key] += event.self_cpu_time_total / 1e6
    return {"wall_seconds_per_step": wall / steps,
            "self_seconds_per_step_by_kind": {k: v / steps for k, v in
                                              sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "aten_calls_per_step": sum(calls.values()) / steps,
            "most_called": [[k, n / steps] for k, n in calls.most_common(8)],
            "most_time": [[k, t / steps] for k, t in self_time.most_common(8)]}


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    print("[1/4] bandwidth", flush=True)
    bw = bandwidth()
    print("[2/4] loading SmolLM2-135M-Instruct twice (tfbook, Hugging Face)", flush=True)
    ours = load_smollm2()
    hf = hf_llama_from_gguf(read_smollm2_gguf())
    (x,) = prompt_ids((PROMPT,))
    nbytes = step_bytes(ours, PROMPT + NEW_TOKENS // 2)  # the cache at the run's middle
    bounds = {name: bw[f"{name}_GB_per_s"] * GB / nbytes["total"] for name in ("read", "matvec")}
    print(f"[3/4] cached greedy decoding, {NEW_TOKENS} tokens after {PROMPT}", flush=True)
    speed = bench_decode(ours, hf, x)
    print("[4/4] profile of decode steps", flush=True)
    prof = profile_steps(ours, x)
    weights_seconds = nbytes["weights"] / (bw["matvec_GB_per_s"] * GB)
    results = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "cpu": platform.processor(),
                    "cpu_count": os.cpu_count(), "load_average_1min": os.getloadavg()[0]},
        "bandwidth": bw, "bytes_per_step": nbytes, "bound_tokens_per_s": bounds,
        "decode": speed,
        "fraction_of_bound": {
            f"{who}_vs_{name}": speed[f"{who}_tokens_per_s"] / bounds[name]
            for who in ("tfbook", "hf") for name in bounds},
        "goal_fraction_of_matvec_bound": 0.5,
        "profile": prof | {"weights_at_matvec_bandwidth_seconds": weights_seconds},
        "seconds": time.perf_counter() - start,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nbandwidth: read {bw['read_GB_per_s']:.1f} GB/s, matrix-vector "
          f"{bw['matvec_GB_per_s']:.1f} GB/s")
    print(f"a step reads {nbytes['total'] / 1e6:.0f} MB (weights {nbytes['weights'] / 1e6:.0f} "
          f"MB): bound {bounds['read']:.1f} tokens/s (read), {bounds['matvec']:.1f} (matvec)")
    print(f"\n{'decode tokens/s':<24}{'tokens/s':>10}{'of read':>10}{'of matvec':>11}")
    for who, label in (("tfbook", "tfbook generate"), ("hf", "HF generate")):
        tps = speed[f"{who}_tokens_per_s"]
        print(f"{label:<24}{tps:>10.1f}{tps / bounds['read']:>10.0%}"
              f"{tps / bounds['matvec']:>11.0%}")
    print(f"\nprofile: {prof['wall_seconds_per_step'] * 1e3:.1f} ms a step, "
          f"{prof['aten_calls_per_step']:.0f} operator calls; the weights alone at the "
          f"matrix-vector bandwidth: {weights_seconds * 1e3:.1f} ms")
    for kind, seconds in prof["self_seconds_per_step_by_kind"].items():
        print(f"  {kind:<18}{seconds * 1e3:>7.1f} ms")
    print("operators with the most self time, ms a step:")
    for name, seconds in prof["most_time"]:
        print(f"  {name:<48}{seconds * 1e3:>7.1f}")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
