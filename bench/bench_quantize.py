"""Benchmark quantised matrix products against float32, on SmolLM2-135M-Instruct's matrices.

    python bench/bench_quantize.py    # a progress bar and a table; writes
                                      # bench/results/quantize.json and (for the chapter)
                                      # book/fast/data/quantize_products.json

For three of the model's weight matrices (a feed-forward up projection, 1536 x 576; its down
projection, 576 x 1536; the token embedding used as the output layer, 49152 x 576), taken
from the shipped GGUF file, and for an input of T = 1 row (one decoding step) and T = 256 rows
(a prompt), y = x W^T computed five ways:

    float32            F.linear(x, W) with W dequantised once, ahead of time (4 bytes a weight)
    Q4_1, on the fly   tfbook.quantize.gguf_matmul: the Q4_1 blocks (5 bits a weight) are
                       dequantised at every call, then the float32 product
    Q8_0, on the fly   the same with Q8_0 blocks (8.5 bits a weight)
    int8_matmul        tfbook.quantize.int8_matmul: x rounded to int8 per row, the int8
                       weight (one float32 scale a row) multiplied in int32 by torch._int_mm,
                       the result scaled back to float32
    _int_mm alone      torch._int_mm on codes rounded beforehand: the integer product without
                       the rounding of x and the scaling around it

Each timing is a median over rounds in which the candidates take turns, after a warm-up, all
in one process (bench_model.py's `median_times`), measured twice: in wall-clock time and in
CPU time (time.process_time: the CPU this process got, all its threads; a load from other
processes slows the wall clock, much less the CPU time). A ratio is float32's time over the
candidate's: above 1, the candidate is faster. Two threads, OMP_WAIT_POLICY=PASSIVE; the
machine's record (CPU, threads, load, versions) is stored beside the numbers.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # read once, when torch starts its thread pool

import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

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
    int8_rows,
    read_gguf_blocks,
    stored_bytes,
)

RESULTS = ROOT / "bench" / "results" / "quantize.json"
CHAPTER = ROOT / "book" / "fast" / "data" / "quantize_products.json"
THREADS = 2
MATRICES = ("blk.10.ffn_up.weight", "blk.10.ffn_down.weight", "token_embd.weight")
ROWS = (1, 256)
REPEATS = {1: 30, 256: 7}
SMALL_WORK = 2**24  # T * weights below this: 20 calls per timing (a call takes microseconds)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def bench_matrix(name: str, T: int) -> dict:
    """The five products for one matrix and one input size, checked against float32."""
    kind, blocks = read_gguf_blocks(smollm2_gguf_path(), [name])[name]
    w = gguf_dequantise(blocks, kind)  # (N, K) float32: the model's weights
    q4 = gguf_quantise(w, "Q4_1")
    q8 = gguf_quantise(w, "Q8_0")
    qi, scale = int8_per_channel(w)
    qi_t = qi.T  # (K, N): _int_mm's layout, as int8_matmul passes it
    x = torch.randn(T, w.shape[1], generator=torch.Generator().manual_seed(0))
    qx, _ = int8_rows(x)  # (T, K) int8: the input rounded beforehand
    products = {
        "float32": lambda: F.linear(x, w),
        "Q4_1, on the fly": lambda: gguf_matmul(x, q4, "Q4_1"),
        "Q8_0, on the fly": lambda: gguf_matmul(x, q8, "Q8_0"),
        "int8_matmul": lambda: int8_matmul(x, qi, scale),
        "_int_mm alone": lambda: torch._int_mm(qx, qi_t),
    }
    reference = x @ w.T
    scale_y = float(reference.abs().max())
    errors = {k: float((fn() - reference).abs().max()) / scale_y
              for k, fn in products.items() if k != "_int_mm alone"}
    calls = 20 if T * w.numel() < SMALL_WORK else 1

    def repeated(fn):
        def run():
            for _ in range(calls):
                fn()
        return run

    fns = {k: repeated(fn) for k, fn in products.items()}
    seconds = {clock: {k: t / calls for k, t in median_times(fns, repeats=REPEATS[T],
                                                             clock=c).items()}
               for clock, c in CLOCKS.items()}
    formats = {"float32": "float32", "Q4_1, on the fly": "Q4_1", "Q8_0, on the fly": "Q8_0",
               "int8_matmul": "int8 per channel", "_int_mm alone": "int8 per channel"}
    return {
        "matrix": name, "shape": list(w.shape), "T": T, "calls_per_timing": calls,
        "seconds": seconds,
        "ratio_vs_float32": {clock: {k: s["float32"] / t for k, t in s.items()}
                             for clock, s in seconds.items()},
        "weight_bytes": {k: stored_bytes(tuple(w.shape), f) for k, f in formats.items()},
        "max_error_relative_to_max_output": errors,
    }


def cpu_model() -> str:
    """The processor's name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    before = machine()
    rows = [bench_matrix(name, T)
            for name, T in tqdm([(n, t) for n in MATRICES for t in ROWS], desc="products")]
    results = {
        "description": "y = x W^T for SmolLM2's matrices: float32 against quantised products; "
                       "written by bench/bench_quantize.py",
        "machine": machine(load_average_1min_at_start=before["load_average_1min"],
                           cpu_model=cpu_model()),
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }
    text = json.dumps(results, indent=2) + "\n"
    for path in (RESULTS, CHAPTER):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    names = list(rows[0]["seconds"]["cpu"])
    for clock in CLOCKS:
        print(f"\n{clock} time: float32 time / candidate time (above 1: faster than float32)")
        print(f"{'matrix, T':<34}" + "".join(f"{n:>18}" for n in names))
        for r in rows:
            label = f"{r['matrix'].replace('.weight', '')} {tuple(r['shape'])}, T={r['T']}"
            print(f"{label:<34}"
                  + "".join(f"{r['ratio_vs_float32'][clock][n]:>17.2f}x" for n in names))
    print(f"\nwrote {RESULTS.relative_to(ROOT)} and {CHAPTER.relative_to(ROOT)} in "
          f"{results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
