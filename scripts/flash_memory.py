"""Measure the peak memory of attention as the sequence grows: the reference vs flash attention.

    python scripts/flash_memory.py              # the sweep; writes book/fast/data/flash_memory.json
    python scripts/flash_memory.py --point 2048 # one length, printed as JSON (the chapter's check)

What is measured. Each (kernel, pass, T) runs in a fresh Python process on one thread: it
builds q, k, v of shape (1, 1, T, 64) in float32 (and the output's gradient for "train"), runs
the same pass once on T = 64 (so that torch's lazy initialisation exists before measuring),
resets the kernel's record of the process's peak resident memory (writing 5 to
/proc/self/clear_refs sets VmHWM to the current VmRSS), runs the pass once and reports VmHWM
after minus VmRSS before: the memory the pass needed at its peak, beyond the inputs already
held. Passes: "forward" without autograd (inference), "train" = forward with autograd, then
backward (what autograd keeps for the backward pass counts here). As in the book's chapter on
the cost of attention, glibc is told to return every block of 64 KiB or more to the system when
it is freed (mallopt M_MMAP_THRESHOLD), so a freed tensor's pages cannot be reused unseen.

Why resident memory. tracemalloc sees only Python's allocator, not torch's tensors, and torch
keeps no allocator statistics on the CPU. The resident set is what the operating system counts
for every page the process touches, whichever allocator asked for it, including the scratch
space inside an operation, and a fresh process per point keeps one point's freed memory from
being reused by the next. Its grain is one 4 KiB page. Flash attention's peak is a constant
(a few hundred KiB: tiles and the C allocator's slack) plus a part that grows with T, so the
exponent is fitted to the memory each doubling of T adds (`fit_exponent`), on T >= 1024.

The chapter re-checks one length with --point, which measures the four (kernel, pass) pairs
one after the other in a single fresh process (the 64 KiB threshold returns each freed large
block to the system, so one measurement's memory cannot hide in the next's).

Kernels: "reference" is tfbook.attention.scaled_dot_product_attention (softmax(QK^T/sqrt(D))V
with the (T, T) scores and weights), "flash" is tfbook.flash.flash_attention (blocks of 64),
"torch" is torch.nn.functional.scaled_dot_product_attention (its own fused CPU kernel).
"""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "book" / "fast" / "data" / "flash_memory.json"
LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
KERNELS = ("reference", "flash", "torch")
PASSES = ("forward", "train")
M_MMAP_THRESHOLD = -3  # glibc's mallopt option number
HEAD_SIZE = 64
BLOCK = 64
FIT_FROM = 1024  # the exponents are fitted on T >= this


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB, e.g. VmRSS (resident now) or VmHWM (peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (this measurement needs Linux)")


def set_up_process() -> None:
    """Before any tensor exists: large blocks go back to the system when freed; one thread."""
    import ctypes

    import torch

    if ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 64 * 1024) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: this needs the GNU C library")
    torch.set_num_threads(1)


def peak(kernel: str, pass_: str, T: int) -> int:
    """The bytes one pass of one kernel needed at its peak for length T (after a warm-up)."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from tfbook.attention import scaled_dot_product_attention
    from tfbook.flash import flash_attention

    run = {
        "reference": lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
        "flash": lambda q, k, v: flash_attention(q, k, v, block_q=BLOCK, block_k=BLOCK),
        "torch": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    }[kernel]
    train = pass_ == "train"
    g = torch.Generator().manual_seed(0)

    def once(n: int) -> int:
        q, k, v = (torch.randn(1, 1, n, HEAD_SIZE, generator=g, requires_grad=train)
                   for _ in range(3))
        grad_out = torch.randn(1, 1, n, HEAD_SIZE, generator=g)
        before = status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        with torch.set_grad_enabled(train):
            out = run(q, k, v)
            if train:
                out.backward(grad_out)
        assert out.shape == (1, 1, n, HEAD_SIZE)
        return (status_kib("VmHWM") - before) * 1024

    once(BLOCK)  # warm-up: torch's lazy initialisation happens here, not in the measurement
    return once(T)


def child(kernel: str, pass_: str, T: int) -> None:
    """Runs in its own process: print the bytes one pass needed at its peak for length T."""
    set_up_process()
    print(json.dumps({"kernel": kernel, "pass": pass_, "T": T, "bytes": peak(kernel, pass_, T)}))


def point(T: int) -> None:
    """Runs in its own process: the four (kernel, pass) peaks at one length, as JSON."""
    set_up_process()
    print(json.dumps({"T": T, **{f"{kernel}_{pass_}": peak(kernel, pass_, T)
                                 for kernel in ("reference", "flash") for pass_ in PASSES}}))


def measure(kernel: str, pass_: str, T: int) -> int:
    """Peak bytes of one pass of one kernel at length T, measured in a fresh process."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    done = subprocess.run([sys.executable, __file__, "--child", kernel, pass_, str(T)], env=env,
                          capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])["bytes"]


def fit_exponent(lengths: list[int], sizes: list[int]) -> float:
    """The exponent e of the part of the peak that grows, bytes ~ c0 + c T^e, for doubling T.

    A doubling adds bytes(2T) - bytes(T) = c T^e (2^e - 1): the constant c0 (allocator slack,
    a few tiles) drops out, and the slope of log(added bytes) against log(T) is e.
    """
    import numpy as np

    if any(b != 2 * a for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError(f"expected lengths that double, got {lengths}")
    added = np.diff(np.asarray(sizes, dtype=float))
    return float(np.polyfit(np.log(lengths[:-1]), np.log(added), 1)[0])


def sweep() -> dict:
    start = time.perf_counter()
    results: dict = {"lengths": list(LENGTHS), "bytes": {}, "exponents": {}}
    keep = [i for i, T in enumerate(LENGTHS) if T >= FIT_FROM]
    for pass_ in PASSES:
        for kernel in KERNELS:
            if kernel == "torch" and pass_ == "train":
                continue  # the chapter compares our two; torch's forward is a reference point
            name = f"{kernel}_{pass_}"
            sizes = []
            for T in LENGTHS:
                sizes.append(measure(kernel, pass_, T))
                print(f"{name:18s} T={T:5d}: {sizes[-1] / 2**20:8.2f} MiB", flush=True)
            results["bytes"][name] = sizes
            results["exponents"][name] = fit_exponent([LENGTHS[i] for i in keep],
                                                      [sizes[i] for i in keep])
    import torch

    results["settings"] = {
        "batch": 1, "heads": 1, "head_size": HEAD_SIZE, "dtype": "float32", "block": BLOCK,
        "threads": 1, "fit_from": FIT_FROM, "measure": "VmHWM - VmRSS, fresh process per point",
        "torch": torch.__version__, "python": platform.python_version(),
        "seconds": round(time.perf_counter() - start, 1)}
    return results


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1:2] == ["--point-child"]:
        point(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--point"]:
        env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
        done = subprocess.run([sys.executable, __file__, "--point-child", sys.argv[2]], env=env,
                              capture_output=True, text=True, check=True, timeout=600)
        print(done.stdout.strip().splitlines()[-1])
    else:
        results = sweep()
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        print("exponents:", results["exponents"])
        print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
