"""Benchmark tfbook's flash attention against the reference attention and torch's fused kernel.

    python bench/bench_flash.py     # prints a table, writes bench/results/flash.json

Three kernels compute the same attention on the same q, k, v of shape (1, 4, T, 64) float32
(4 heads; the same function, checked before timing):
- "reference": tfbook.attention.scaled_dot_product_attention, softmax(QK^T/sqrt(D))V with the
  whole (T, T) matrix;
- "flash": tfbook.flash.flash_attention, tiles of 64 x 64 walked by Python loops;
- "torch": torch.nn.functional.scaled_dot_product_attention (a fused C++ kernel).
Forward alone (no autograd) and forward + backward, causal and not, for T = 256, 1024, 2048.
Each timing is a median over rounds in which the kernels take turns after a warm-up, all in
one process (bench_model.py's `median_times`), two threads, OMP_WAIT_POLICY=PASSIVE. A ratio
is the time of the named kernel over the time of flash: above 1, flash is faster.

What to expect: flash in plain PyTorch runs T^2 / 64^2 small tiles, one Python iteration each,
so it is slower than the reference, whose two large matrix products run at full speed; its
gain is memory (see scripts/flash_memory.py). A real flash kernel fuses the loop on the chip.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # read once, when torch starts its threads

import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_model import machine, median_times  # noqa: E402

from tfbook.attention import scaled_dot_product_attention  # noqa: E402
from tfbook.flash import flash_attention  # noqa: E402
from tfbook.masks import causal_mask  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "flash.json"
THREADS = 2
LENGTHS = (256, 1024, 2048)
HEADS, HEAD_SIZE, BLOCK = 4, 64, 64
REPEATS = 3


def kernels(causal: bool, T: int) -> dict:
    mask = causal_mask(T) if causal else None
    return {
        "reference": lambda q, k, v: scaled_dot_product_attention(q, k, v, mask)[0],
        "flash": lambda q, k, v: flash_attention(q, k, v, causal=causal, block_q=BLOCK,
                                                 block_k=BLOCK),
        "torch": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
    }


def bench(T: int, causal: bool, backward: bool) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, T, HEAD_SIZE, generator=g, requires_grad=backward)
               for _ in range(3))
    grad_out = torch.randn(1, HEADS, T, HEAD_SIZE, generator=g)
    fns = kernels(causal, T)
    with torch.set_grad_enabled(backward):
        outs = {name: fn(q, k, v) for name, fn in fns.items()}
    diff = max((outs[name] - outs["torch"]).abs().max().item() for name in fns)

    def timed(fn):
        if not backward:
            return lambda: fn(q, k, v)
        return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), grad_out)

    with torch.set_grad_enabled(backward):
        t = median_times({name: timed(fn) for name, fn in fns.items()}, repeats=REPEATS,
                         warmup=1)
    return {"T": T, "causal": causal, "backward": backward, "max_abs_diff": diff,
            "seconds": t,
            "reference_over_flash": t["reference"] / t["flash"],
            "torch_over_flash": t["torch"] / t["flash"]}


def main() -> None:
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    rows = []
    for backward in (False, True):
        for causal in (False, True):
            for T in LENGTHS:
                rows.append(bench(T, causal, backward))
                r = rows[-1]
                print(f"[{time.perf_counter() - start:5.0f} s] T={T} causal={causal} "
                      f"backward={backward}", flush=True)
    results = {
        "machine": machine(),
        "shape": f"(1, {HEADS}, T, {HEAD_SIZE}) float32, blocks of {BLOCK}",
        "rows": rows, "seconds": time.perf_counter() - start,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{'pass':<18}{'T':>6}{'flash s':>10}{'ref s':>10}{'torch s':>10}"
          f"{'ref/flash':>11}{'torch/flash':>12}{'max diff':>10}")
    for r in rows:
        name = ("fwd+bwd" if r["backward"] else "forward") + (", causal" if r["causal"] else "")
        s = r["seconds"]
        print(f"{name:<18}{r['T']:>6}{s['flash']:>10.4f}{s['reference']:>10.4f}"
              f"{s['torch']:>10.4f}{r['reference_over_flash']:>11.2f}"
              f"{r['torch_over_flash']:>12.3f}{r['max_abs_diff']:>10.1e}")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
