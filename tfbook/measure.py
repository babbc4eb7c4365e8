"""Peak memory of one attention call, measured by the operating system, in a fresh process.

    attention_peaks(1024)  # -> {"reference_forward": bytes, ..., "flash_train": bytes}

What is measured. Linux keeps the peak resident memory of a process (VmHWM in
/proc/self/status); writing 5 to /proc/self/clear_refs resets that peak to the memory resident
now (VmRSS). One pass runs between the reset and the reading: VmHWM after minus VmRSS before
is the most memory the pass held at once beyond its inputs, counted for every page the process
touched, whichever allocator asked for it (torch's tensors, the scratch space inside an
operation), to the grain of one 4 KiB page. tracemalloc would see only Python's allocator, and
torch keeps no allocator statistics on the CPU.

Two details keep the count honest. The GNU C library keeps freed blocks below 32 MB for reuse,
which would hide allocations of that size; mallopt(M_MMAP_THRESHOLD, 64 KiB), set before any
large tensor exists, hands every block of 64 KiB or more back to the system when it is freed.
And each measurement runs in a fresh Python process on one thread, after a warm-up pass on a
short sequence (torch's lazy initialisation happens there), so no earlier work hides in it.

Kernels: "reference" is tfbook.attention.scaled_dot_product_attention (the (T, T) scores and
weights exist), "flash" is tfbook.flash.flash_attention (blocks of 64), "torch" is
torch.nn.functional.scaled_dot_product_attention (its fused CPU kernel). Passes: "forward"
without autograd (inference); "train" = forward with autograd, then backward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

KERNELS = ("reference", "flash", "torch")
PASSES = ("forward", "train")
HEAD_SIZE = 64  # D of the one head measured, float32
BLOCK = 64  # flash attention's block_q = block_k
M_MMAP_THRESHOLD = -3  # glibc's mallopt option number
TIMEOUT = 600  # seconds for one fresh process


def status_bytes(field: str) -> int:
    """A field of /proc/self/status in bytes, e.g. "VmRSS" (resident now) or "VmHWM" (peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the file counts KiB
    raise RuntimeError(f"/proc/self/status has no {field} (this measurement needs Linux)")


def prepare_process() -> None:
    """Before any large tensor exists: freed blocks >= 64 KiB go back to the system; 1 thread."""
    import ctypes

    import torch

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None or mallopt(M_MMAP_THRESHOLD, 64 * 1024) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: this measurement needs the GNU "
                           "C library")
    torch.set_num_threads(1)


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most memory held at once while fn() runs, above what was resident before it."""
    before = status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    fn()
    return status_bytes("VmHWM") - before


def _check(kernel: object, pass_: object, T: object) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be a positive int, got {T!r}")


def attention_peak(kernel: str, pass_: str, T: int) -> int:
    """Bytes one pass of one kernel held at its peak for a (1, 1, T, 64) float32 head.

    Measures in the calling process (call `prepare_process` first, in a fresh process): a
    warm-up on T = 64, then the measured pass. `attention_peaks` does all of this for you.
    """
    _check(kernel, pass_, T)
    import torch
    import torch.nn.functional as F

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

        def step() -> None:
            with torch.set_grad_enabled(train):
                out = run(q, k, v)
                if train:
                    out.backward(grad_out)

        return peak_bytes(step)

    once(BLOCK)  # warm-up: torch's lazy initialisation happens here, not in the measurement
    return once(T)


def _child(pairs: list[tuple[str, str]], T: int) -> None:
    """Runs in the fresh process: print {"kernel_pass": bytes, ...} as one JSON line."""
    prepare_process()
    print(json.dumps({f"{kernel}_{pass_}": attention_peak(kernel, pass_, T)
                      for kernel, pass_ in pairs}))


def attention_peaks(T: int, kernels: Sequence[str] = ("reference", "flash"),
                    passes: Sequence[str] = PASSES) -> dict[str, int]:
    """Peak bytes of every (kernel, pass) at length T, measured in one fresh process.

    -> {"reference_forward": ..., "reference_train": ..., "flash_forward": ...}. The pairs run
    one after the other; each freed block of 64 KiB or more has gone back to the system, so one
    measurement's memory cannot hide in the next's.
    """
    pairs = [(kernel, pass_) for kernel in kernels for pass_ in passes]
    for kernel, pass_ in pairs:
        _check(kernel, pass_, T)
    if not pairs:
        raise ValueError("expected at least one kernel and one pass, got none")
    package_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
               PYTHONPATH=os.pathsep.join(filter(None, (package_parent,
                                                        os.environ.get("PYTHONPATH")))))
    code = f"from tfbook.measure import _child; _child({pairs!r}, {T!r})"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def growth_exponent(lengths: Sequence[int], sizes: Sequence[float]) -> float:
    """The exponent e of the part of the peak that grows, bytes ~ c0 + c T^e, T doubling.

    A doubling adds bytes(2T) - bytes(T) = c T^e (2^e - 1): the constant c0 (allocator slack,
    a few tiles) drops out, and the slope of log(added bytes) against log(T) is e.
    Example: lengths [1, 2, 4], sizes [5 + t**2 for t in lengths] -> 2.0 (up to rounding).
    """
    import numpy as np

    lengths, sizes = list(lengths), np.asarray(sizes, dtype=float)
    if len(lengths) < 3 or len(sizes) != len(lengths):
        raise ValueError(f"expected at least 3 lengths and one size per length, got "
                         f"{len(lengths)} lengths and {len(sizes)} sizes")
    if any(b != 2 * a for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError(f"expected lengths that double, got {lengths}")
    added = np.diff(sizes)
    if np.any(added <= 0):
        raise ValueError(f"expected sizes that grow with T, got {sizes.tolist()}")
    return float(np.polyfit(np.log(lengths[:-1]), np.log(added), 1)[0])
