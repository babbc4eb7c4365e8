"""Benchmark quantised matrix products against float32, on SmolLM2-135M-Instruct's matrices.

    python bench/bench_quantize.py    # prints a table, writes bench/results/quantize.json

For three of the model's weight matrices (a feed-forward up projection, 1536 x 576; its down
projection, 576 x 1536; the token embedding used as the output layer, 49152 x 576), taken
from the shipped GGUF file, and for an input of T = 1 row (one decoding step) and T = 256 rows
(a prompt), y = x W^T computed four ways:

    float32            x @ W.T with W dequantised once, ahead of time (4 bytes a weight)
    Q4_1, on the fly   tfbook.quantize.gguf_matmul: the Q4_1 blocks (5 bits a weight) are
                       dequantised at every call, then the float32 product
    Q8_0, on the fly   the same with Q8_0 blocks (8.5 bits a weight)
    int8, _int_mm      tfbook.quantize.int8_matmul: x rounded to int8 per row, the int8
                       weight (one float32 scale a row) multiplied in int32 by torch._int_mm

Each timing is a median over rounds in which the candidates take turns, after a warm-up, all
in one process (bench_model.py's `median_times`). A ratio is float32's time over the
candidate's: above 1, the candidate is faster. Two threads, OMP_WAIT_POLICY=PASSIVE.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # read once, when torch starts its thread pool

import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script from a checkout

from bench_model import machine, median_times  # noqa: E402

from tfbook.checkpoints.smollm2 import smollm2_gguf_path  # noqa: E402
from tfbook.quantize import (  # noqa: E402
    gguf_dequantise,
    gguf_matmul,
    gguf_quantise,
    int8_matmul,
    int8_per_channel,
    read_gguf_blocks,
    stored_bytes,
)

RESULTS = ROOT / "bench" / "results" / "quantize.json"
THREADS = 2
MATRICES = ("blk.10.ffn_up.weight", "blk.10.ffn_down.weight", "token_embd.weight")
ROWS = (1, 256)
REPEATS = {1: 30, 256: 7}


def bench_matrix(name: str, T: int) -> dict:
    """The four products for one matrix and one input size, checked against float32."""
    kind, blocks = read_gguf_blocks(smollm2_gguf_path(), [name])[name]
    w = gguf_dequantise(blocks, kind)  # (N, K) float32: the model's weights
    q4 = gguf_quantise(w, "Q4_1")
    q8 = gguf_quantise(w, "Q8_0")
    qi, scale = int8_per_channel(w)
    x = torch.randn(T, w.shape[1], generator=torch.Generator().manual_seed(0))
    fns = {
        "float32": lambda: x @ w.T,
        "Q4_1, on the fly": lambda: gguf_matmul(x, q4, "Q4_1"),
        "Q8_0, on the fly": lambda: gguf_matmul(x, q8, "Q8_0"),
        "int8, _int_mm": lambda: int8_matmul(x, qi, scale),
    }
    reference = x @ w.T
    scale_y = float(reference.abs().max())
    errors = {k: float((fn() - reference).abs().max()) / scale_y for k, fn in fns.items()}
    times = median_times(fns, repeats=REPEATS[T])
    formats = {"float32": "float32", "Q4_1, on the fly": "Q4_1", "Q8_0, on the fly": "Q8_0",
               "int8, _int_mm": "int8 per channel"}
    return {
        "matrix": name, "shape": list(w.shape), "T": T,
        "seconds": times,
        "ratio_vs_float32": {k: times["float32"] / t for k, t in times.items()},
        "weight_bytes": {k: stored_bytes(tuple(w.shape), f) for k, f in formats.items()},
        "max_error_relative_to_max_output": errors,
    }


def main() -> None:
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    rows = []
    for name in MATRICES:
        for T in ROWS:
            print(f"[{time.perf_counter() - start:5.0f} s] {name}, T = {T}", flush=True)
            rows.append(bench_matrix(name, T))
    results = {
        "machine": machine(),
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    names = list(rows[0]["seconds"])
    print(f"\n{'matrix, T':<34}" + "".join(f"{n:>18}" for n in names))
    for r in rows:
        label = f"{r['matrix'].replace('.weight', '')} {tuple(r['shape'])}, T={r['T']}"
        print(f"{label:<34}" + "".join(f"{r['ratio_vs_float32'][n]:>17.2f}x" for n in names))
    print("(float32 time / candidate time: above 1, faster than float32)")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
