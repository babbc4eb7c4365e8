"""Measure the peak memory of attention as the sequence grows: the reference vs flash attention.

    python scripts/flash_memory.py    # the sweep; writes book/fast/data/flash_memory.json

Each (kernel, pass, T) is measured in its own fresh process by `tfbook.measure.attention_peaks`
(its docstring says what is measured and how); the chapter re-measures one length live with the
same function. The exponents are fitted with `tfbook.measure.growth_exponent` on T >= 1024.
"""

import json
import platform
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfbook.measure import BLOCK, HEAD_SIZE, attention_peaks, growth_exponent  # noqa: E402

RESULTS = ROOT / "book" / "fast" / "data" / "flash_memory.json"
LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
KERNELS = ("reference", "flash", "torch")
PASSES = ("forward", "train")
FIT_FROM = 1024  # the exponents are fitted on T >= this


def sweep() -> dict:
    start = time.perf_counter()
    results: dict = {"lengths": list(LENGTHS), "bytes": {}, "exponents": {}}
    keep = [i for i, T in enumerate(LENGTHS) if T >= FIT_FROM]
    # the chapter compares our two kernels; torch's forward is a reference point
    names = [(kernel, pass_) for pass_ in PASSES for kernel in KERNELS
             if not (kernel == "torch" and pass_ == "train")]
    points = [(kernel, pass_, T) for kernel, pass_ in names for T in LENGTHS]
    sizes: dict[str, list[int]] = {f"{kernel}_{pass_}": [] for kernel, pass_ in names}
    for kernel, pass_, T in (bar := tqdm(points, desc="peak memory, one process per point")):
        name = f"{kernel}_{pass_}"
        sizes[name].append(attention_peaks(T, [kernel], [pass_])[name])
        bar.set_postfix_str(f"{name} T={T}: {sizes[name][-1] / 2**20:.2f} MiB")
    for name, measured in sizes.items():
        results["bytes"][name] = measured
        results["exponents"][name] = growth_exponent([LENGTHS[i] for i in keep],
                                                     [measured[i] for i in keep])
    import torch

    results["settings"] = {
        "batch": 1, "heads": 1, "head_size": HEAD_SIZE, "dtype": "float32", "block": BLOCK,
        "threads": 1, "fit_from": FIT_FROM, "measure": "VmHWM - VmRSS, fresh process per point",
        "torch": torch.__version__, "python": platform.python_version(),
        "seconds": round(time.perf_counter() - start, 1)}
    return results


def main() -> None:
    results = sweep()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print("exponents:", results["exponents"])
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
