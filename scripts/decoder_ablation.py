"""Train a GPT-2-style and a Llama-style byte-level decoder of the same size and cache the
curves for the modern_decoder chapter.

Both models have 3 layers of width 40 with 4 heads and about 59,000 non-embedding
parameters: the GPT-2 style is the scaling sweep's (3, 40, 4) model (LayerNorm, GELU MLP,
learned positions, biases); the Llama style has RMSNorm, SwiGLU, RoPE, 2 key/value heads
and no biases, with the feed-forward width (124) chosen so that its parameter count matches.
Each is trained with seeds 0 and 1 by the scaling sweep's recipe (tfbook.train.scaling:
2,000 steps of 16 x 64 bytes of the default corpus, the same batches for a given seed).
Writes book/generation/data/decoder_ablation.json. About 6 CPU-minutes on one thread.
Run: OMP_NUM_THREADS=1 .venv/bin/python scripts/decoder_ablation.py
"""

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from tfbook.models.llama import llama_config
from tfbook.train.scaling import (
    SETTINGS,
    corpus_sha256,
    non_embedding_parameters,
    run_size,
    sweep_config,
    sweep_data,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "generation" / "data" / "decoder_ablation.json"
GPT2_STYLE = sweep_config(3, 40, 4)
LLAMA_STYLE = llama_config(vocab_size=256, max_len=SETTINGS.T, n_layers=3, d_model=40,
                           n_heads=4, n_kv_heads=2, d_ff=124)
SEEDS = (0, 1)


def main() -> None:
    torch.set_num_threads(1)  # the same losses on every re-run (only timings differ)
    began = time.process_time()
    data = sweep_data(SETTINGS)
    runs = []
    for name, config in [("gpt2", GPT2_STYLE), ("llama", LLAMA_STYLE)]:
        for seed in SEEDS:
            print(f"{name} seed {seed} (N = {non_embedding_parameters(config):,}) ...",
                  end=" ", flush=True)
            record = run_size(config, seed, data, SETTINGS)
            record["style"] = name
            runs.append(record)
            print(f"final loss {record['final_loss']:.4f} ({record['cpu_seconds']} CPU s)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "description": "GPT-2-style vs Llama-style byte-level decoders of ~59K non-embedding "
                       "parameters, scaling-sweep recipe; written by scripts/decoder_ablation.py",
        "settings": asdict(SETTINGS), "corpus_sha256": corpus_sha256(),
        "torch_version": torch.__version__, "threads": torch.get_num_threads(),
        "runs": runs, "cpu_seconds": round(time.process_time() - began, 1),
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
