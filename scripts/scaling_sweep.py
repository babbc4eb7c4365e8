"""Train the scaling-law sweep of the scaling_laws chapter and cache its results.

Seven byte-level GPTs from about 4K to 800K non-embedding parameters (and a second seed for
the two smallest) each read 2,048,000 bytes of the default corpus with tfbook's training
loop; the eval loss is recorded every 100 steps. Writes book/learning/data/scaling_sweep.json
(about 13 kB). The budget is counted in steps, never in seconds, so a re-run on one thread
gives the same losses (only the timings differ). About 14 CPU-minutes on one thread.
Run: OMP_NUM_THREADS=1 .venv/bin/python scripts/scaling_sweep.py
"""

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from tfbook.train.scaling import (
    SETTINGS,
    corpus_sha256,
    non_embedding_parameters,
    run_size,
    sweep_data,
    sweep_runs,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "learning" / "data" / "scaling_sweep.json"


def write(runs: list[dict], data, began_wall: float, began_cpu: float) -> None:
    """The cache file with the runs so far (rewritten after each run, complete at the end)."""
    train_ids, eval_batches, full_val = data
    result = {
        "description": "byte-level GPT sweep on tfbook.corpus.stdlib_corpus(); written by "
                       "scripts/scaling_sweep.py",
        "settings": asdict(SETTINGS),
        "corpus_sha256": corpus_sha256(),
        "train_tokens": len(train_ids),
        "val_tokens": sum(int(y.numel()) for _, y in full_val),
        "eval_tokens_per_point": sum(int(y.numel()) for _, y in eval_batches),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "runs": runs,
        "cpu_seconds": round(time.process_time() - began_cpu, 1),
        "wall_seconds": round(time.perf_counter() - began_wall, 1),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    began_wall, began_cpu = time.perf_counter(), time.process_time()
    data = sweep_data(SETTINGS)
    runs = []
    for config, seed in sweep_runs(SETTINGS):
        n = non_embedding_parameters(config)
        print(f"N = {n:>7,} (L={config.n_layers}, C={config.d_model}) seed {seed} ...",
              end=" ", flush=True)
        runs.append(run_size(config, seed, data, SETTINGS))
        write(runs, data, began_wall, began_cpu)
        print(f"final loss {runs[-1]['final_loss']:.4f} in {runs[-1]['cpu_seconds']:.0f} "
              f"CPU-s", flush=True)
    cpu, wall = time.process_time() - began_cpu, time.perf_counter() - began_wall
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes): {len(runs)} runs in {cpu:.0f} "
          f"CPU-s, {wall:.0f} s wall")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    main()
