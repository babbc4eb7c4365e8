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
3. The layout of a weight matrix: GB/s of the matrix-vector product for each of SmolLM2's
   shapes (30 copies, as many as the model has blocks, so that none stays in the cache),
   stored row by row and column by column; `tfbook.packing` stores a matrix with more outputs
   than inputs column by column because of this table.
4. Cached greedy decoding, 64 new tokens after a 16-token prompt: tfbook's `generate` on the
   model as loaded (plain), on the same model packed for decoding (`pack_for_decoding`: one
   product for q|k|v and one for gate|value, wide matrices column by column), on an int8
   copy (`quantise_linears`, per-channel int8 weights, int8 products, then packed) and
   Hugging Face's, side by side (median of interleaved rounds), as tokens/s and as a fraction
   of each bound; the int8 model also against its own bound (a quarter of the bytes). Goal
   (issue 17): >= 50% of the float32 matrix-vector bound on 2 threads.
5. Where a step's time goes: torch.profiler over decode steps of the plain and the packed
   model, self CPU time by kind of operation (matrix products, attention, norms,
   element-wise, copies, other), the number of operator calls per step, and the time the
   weights alone would take at the measured matrix-vector bandwidth.

Two threads, OMP_WAIT_POLICY=PASSIVE, float32. Absolute speeds depend on the machine and its
load (the load average is recorded); the fractions of the bound measured in the same run are
what to compare.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its thread pool

import json  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_generate import check_length, hf_generate, keeping, prompt_ids  # noqa: E402
from bench_model import machine, median_times  # noqa: E402

from tfbook.checkpoints.smollm2 import (  # noqa: E402
    hf_llama_from_gguf,
    load_smollm2,
    read_smollm2_gguf,
)
from tfbook.generate.search import generate  # noqa: E402
from tfbook.packing import column_major, pack_for_decoding  # noqa: E402
from tfbook.quantize import quantise_linears  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
RESULTS = ROOT / "bench" / "results" / "decode.json"
THREADS = 2
PROMPT, NEW_TOKENS = 16, 64
REPEATS = 5
GB = 1e9


def bandwidth() -> dict:
    """Bytes per second of reading (a sum) and of a matrix-vector product, float32."""
    big = torch.ones(128 * 1024 * 1024)  # 512 MB
    W = torch.randn(8192, 8192)  # 256 MB
    x = torch.randn(8192)
    t = median_times({"read": lambda: big.sum(), "matvec": lambda: W @ x}, repeats=7, warmup=2)
    return {"read_GB_per_s": big.numel() * 4 / t["read"] / GB,
            "matvec_GB_per_s": W.numel() * 4 / t["matvec"] / GB}


SHAPES = {"q|k|v (packed)": (960, 576), "W_O": (576, 576), "gate|value (packed)": (3072, 576),
          "down": (576, 1536), "output layer": (49152, 576)}  # SmolLM2's (O, C)


def layouts(blocks: int = 30) -> dict:
    """GB/s of y = W x for each shape, W stored row by row and column by column; `blocks`
    distinct matrices per shape (one for the output layer), read in turn."""
    out = {}
    for name, (n_out, n_in) in SHAPES.items():
        n = 1 if name == "output layer" else blocks
        rows = [torch.randn(n_out, n_in) for _ in range(n)]
        layouts = {"row-major": rows, "column-major": [column_major(w) for w in rows]}
        x = torch.randn(1, n_in)
        t = median_times({
            layout: lambda ws=ws, x=x: [torch.nn.functional.linear(x, w) for w in ws]
            for layout, ws in layouts.items()}, repeats=7, warmup=2)
        out[name] = {k: n * n_out * n_in * 4 / v / GB for k, v in t.items()}
    return out


def step_bytes(model, context: int) -> dict:
    """Bytes one decode step reads: the weights once, and the keys and values of `context`
    earlier positions (of the embedding only the lookup's row, not counted, unless the output
    layer reads it as its tied weight). For an int8 model: the codes and scales."""
    seen, weights = {id(model.tok_emb.weight)}, 0
    if getattr(model.lm_head, "weight", None) is model.tok_emb.weight:
        seen = set()  # tied: the output layer reads the whole embedding matrix
    for p in [*model.parameters(), *model.buffers()]:
        if id(p) not in seen:
            seen.add(id(p))
            weights += p.numel() * p.element_size()
    c = model.config
    head_size = c.d_model // c.n_heads
    kv = 2 * c.n_layers * (c.n_kv_heads or c.n_heads) * head_size * context * 4
    return {"weights": weights, "kv_cache": kv, "total": weights + kv}


def bench_decode(models: dict, hf, x: torch.Tensor) -> dict:
    """Tokens/s of cached greedy decoding for each of `models` and HF's, interleaved."""
    out: dict = {}
    fns = {}
    with torch.no_grad():
        for who, model in models.items():
            generate(model, x, 2)  # warm-up
            fns[who] = keeping(out, who, lambda m=model: generate(m, x, NEW_TOKENS).tokens)
        hf_generate(hf, x, 2)
        fns["hf"] = keeping(out, "hf", lambda: hf_generate(hf, x, NEW_TOKENS))
        t = median_times(fns, repeats=REPEATS, warmup=0)
    for who in fns:
        check_length(out[who], x, NEW_TOKENS, who)
    return {"tokens_per_s": {who: NEW_TOKENS / t[who] for who in t},
            "same_tokens_as_hf": {who: torch.equal(out[who], out["hf"]) for who in models},
            "new_tokens_equal_to_hf": {who: int((out[who] == out["hf"])[0, x.size(1):].sum())
                                       for who in models}}


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


WHO = (("plain", "tfbook generate"), ("packed", "tfbook, packed"),
       ("int8", "tfbook, int8 packed"), ("hf", "HF generate"))


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    print("[1/5] bandwidth", flush=True)
    bw = bandwidth()
    print("[2/5] matrix-vector products by layout", flush=True)
    layout = layouts()
    print("[3/5] loading SmolLM2-135M-Instruct four times (plain, packed, int8 packed, "
          "Hugging Face)", flush=True)
    plain = load_smollm2()
    packed = pack_for_decoding(load_smollm2())
    int8 = pack_for_decoding(quantise_linears(load_smollm2()))
    hf = hf_llama_from_gguf(read_smollm2_gguf())
    (x,) = prompt_ids((PROMPT,))
    context = PROMPT + NEW_TOKENS // 2  # the cache at the run's middle
    nbytes = step_bytes(plain, context)
    int8_bytes = step_bytes(int8, context)
    bounds = {name: bw[f"{name}_GB_per_s"] * GB / nbytes["total"] for name in ("read", "matvec")}
    int8_bound = bw["matvec_GB_per_s"] * GB / int8_bytes["total"]
    print(f"[4/5] cached greedy decoding, {NEW_TOKENS} tokens after {PROMPT}", flush=True)
    speed = bench_decode({"plain": plain, "packed": packed, "int8": int8}, hf, x)
    print("[5/5] profile of decode steps", flush=True)
    prof = {who: profile_steps(model, x) for who, model in (("plain", plain),
                                                              ("packed", packed))}
    weights_seconds = nbytes["weights"] / (bw["matvec_GB_per_s"] * GB)
    tps = speed["tokens_per_s"]
    results = {
        "machine": machine(),
        "bandwidth": bw, "layout_GB_per_s": layout, "bytes_per_step": nbytes,
        "bound_tokens_per_s": bounds, "decode": speed,
        "fraction_of_bound": {f"{who}_vs_{name}": tps[who] / bounds[name]
                              for who in tps for name in bounds},
        "int8": {"bytes_per_step": int8_bytes, "bound_tokens_per_s_matvec": int8_bound,
                 "fraction_of_its_bound": tps["int8"] / int8_bound},
        "goal_fraction_of_matvec_bound": 0.5,
        "packed_over_plain": tps["packed"] / tps["plain"],
        "profile": prof, "weights_at_matvec_bandwidth_seconds": weights_seconds,
        "seconds": time.perf_counter() - start,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nbandwidth: read {bw['read_GB_per_s']:.1f} GB/s, matrix-vector "
          f"{bw['matvec_GB_per_s']:.1f} GB/s (load {results['machine']['load_average_1min']:.1f})")
    print(f"\n{'y = W x, GB/s':<24}{'(O, C)':>14}{'row-major':>11}{'column-major':>14}")
    for name, r in layout.items():
        print(f"{name:<24}{str(SHAPES[name]):>14}{r['row-major']:>11.1f}{r['column-major']:>14.1f}")
    print(f"\na step reads {nbytes['total'] / 1e6:.0f} MB (weights {nbytes['weights'] / 1e6:.0f} "
          f"MB): bound {bounds['read']:.1f} tokens/s (read), {bounds['matvec']:.1f} (matvec)")
    print(f"\n{'decode (float32 bound)':<24}{'tokens/s':>10}{'of read':>10}{'of matvec':>11}"
          f"{'tokens = HF':>13}")
    for who, label in WHO:
        same = speed["new_tokens_equal_to_hf"].get(who, NEW_TOKENS)
        print(f"{label:<24}{tps[who]:>10.1f}{tps[who] / bounds['read']:>10.0%}"
              f"{tps[who] / bounds['matvec']:>11.0%}{f'{same}/{NEW_TOKENS}':>13}")
    print(f"packed / plain: {results['packed_over_plain']:.2f}x; goal: 50% of the matvec bound")
    print(f"int8 packed: a step reads {int8_bytes['total'] / 1e6:.0f} MB, bound "
          f"{int8_bound:.1f} tokens/s (matvec): {tps['int8'] / int8_bound:.0%} of its own bound")
    print(f"\nthe weights alone at the matrix-vector bandwidth: {weights_seconds * 1e3:.1f} ms")
    for who, p in prof.items():
        print(f"profile, {who}: {p['wall_seconds_per_step'] * 1e3:.1f} ms a step, "
              f"{p['aten_calls_per_step']:.0f} operator calls")
        for kind, seconds in p["self_seconds_per_step_by_kind"].items():
            print(f"  {kind:<18}{seconds * 1e3:>7.1f} ms")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
