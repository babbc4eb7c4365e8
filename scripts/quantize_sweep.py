"""Measure SmolLM2-135M-Instruct in each weight format of the quantization chapter and cache
the results in tfbook/data/quantize_sweep.json (a few kB).

The model's float32 weights are the shipped GGUF file's, dequantised: its matrices are Q4_1,
its token embedding (also the output layer) Q8_0. Each format of tfbook.quantize.FORMATS
re-quantises every matrix of that model (the embedding too; the norm gains stay float32) and
reads it back. Recorded per format: the loss in nats per token on held-out text (the last
HELD_OUT_BYTES of tfbook.corpus.stdlib_corpus(), cut into N_WINDOWS windows of T tokens;
every token after the first of a window is predicted), the bytes of the weights, and the
relative error ||W' - W|| / ||W|| of every matrix. Also: how many blocks of the shipped file
come back byte for byte when their dequantised weights are quantised again in their own
format. Deterministic apart from the float sums of the forward pass (a few minutes).
Run: .venv/bin/python scripts/quantize_sweep.py
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfbook.checkpoints.smollm2 import (  # noqa: E402
    GGUF_TO_TFBOOK,
    load_smollm2,
    load_smollm2_tokenizer,
    smollm2_gguf_path,
)
from tfbook.corpus import corpus_sha256, stdlib_corpus  # noqa: E402
from tfbook.quantize import (  # noqa: E402
    BLOCK_BYTES,
    FORMATS,
    gguf_quantise,
    read_gguf_blocks,
    relative_error,
    round_trip,
    stored_bytes,
)

OUT = ROOT / "book" / "fast" / "data" / "quantize_sweep.json"
HELD_OUT_BYTES = 40_000  # the end of the corpus
T = 512  # tokens per window
N_WINDOWS = 8


def held_out_windows(tokenizer) -> torch.Tensor:
    """(N_WINDOWS, T) token ids: consecutive windows from the last HELD_OUT_BYTES of text."""
    text = stdlib_corpus()
    data = text.encode("utf-8")[-HELD_OUT_BYTES:]
    start = data.find(b"\n") + 1  # begin at a line
    ids = tokenizer.encode(data[start:].decode("utf-8"))
    if len(ids) < N_WINDOWS * T:
        raise ValueError(f"{len(ids)} held-out tokens, need {N_WINDOWS * T}")
    return torch.tensor(ids[: N_WINDOWS * T]).reshape(N_WINDOWS, T)


@torch.no_grad()
def window_losses(model, windows: torch.Tensor) -> list[float]:
    """Mean next-token cross-entropy (nats) of each window, one forward pass each."""
    losses = []
    for x in windows:
        logits = model(x[None]).logits[0]  # (T, V)
        losses.append(float(F.cross_entropy(logits[:-1].double(), x[1:])))
    return losses


def main() -> None:
    torch.manual_seed(0)
    began = time.time()
    tokenizer = load_smollm2_tokenizer()
    windows = held_out_windows(tokenizer)
    model = load_smollm2()
    matrices = {name: p for name, p in model.named_parameters() if p.dim() == 2}
    original = {name: p.detach().clone() for name, p in matrices.items()}
    vectors = [p for p in model.parameters() if p.dim() == 1]
    n_layers = model.config.n_layers

    # The shipped blocks: re-quantising the dequantised weights in their own format.
    to_tfbook = {g.format(i=i): t.format(i=i) for g, t in GGUF_TO_TFBOOK.items()
                 for i in range(n_layers)}
    shipped = read_gguf_blocks(smollm2_gguf_path(),
                               [g for g, t in to_tfbook.items() if t in matrices])
    same_blocks, all_blocks, shipped_bytes = {}, {}, 0
    for gguf_name, (kind, blocks) in shipped.items():
        again = gguf_quantise(original[to_tfbook[gguf_name]], kind)
        rows = blocks.reshape(-1, BLOCK_BYTES[kind])  # (N, block bytes)
        equal = (again.reshape(rows.shape) == rows).all(dim=1)
        same_blocks[kind] = same_blocks.get(kind, 0) + int(equal.sum())
        all_blocks[kind] = all_blocks.get(kind, 0) + int(equal.numel())
        shipped_bytes += blocks.numel()
    shipped_bytes += sum(4 * p.numel() for p in vectors)

    results = {"float32": {"bytes": sum(stored_bytes(tuple(p.shape), "float32")
                                        for p in model.parameters())}}
    results["float32"]["loss"] = window_losses(model, tqdm(windows, desc="float32"))
    for fmt in FORMATS:
        errors = {}
        for name, p in matrices.items():
            rounded = round_trip(original[name], fmt)
            errors[name] = relative_error(original[name], rounded)
            p.data.copy_(rounded)
        results[fmt] = {
            "bytes": sum(stored_bytes(tuple(p.shape), fmt) for p in model.parameters()),
            "loss": window_losses(model, tqdm(windows, desc=fmt)),
            "relative_error": errors,
        }
        for name, p in matrices.items():
            p.data.copy_(original[name])
    n_weights = sum(p.numel() for p in model.parameters())
    out = {
        "description": "SmolLM2-135M-Instruct's weights (the shipped GGUF, dequantised) "
                       "re-quantised in each format; written by scripts/quantize_sweep.py",
        "held_out": {"corpus_sha256": corpus_sha256(stdlib_corpus()),
                     "last_bytes": HELD_OUT_BYTES, "windows": N_WINDOWS, "T": T},
        "n_weights": n_weights,
        "shipped": {"bytes": shipped_bytes, "file_bytes": smollm2_gguf_path().stat().st_size,
                    "blocks_equal_when_requantised": same_blocks, "blocks": all_blocks},
        "formats": results,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seconds": round(time.time() - began, 1),
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for fmt, r in results.items():
        loss = sum(r["loss"]) / len(r["loss"])
        print(f"{fmt:18s} {8 * r['bytes'] / n_weights:6.3f} bits/weight  loss {loss:.4f}")
    print(f"wrote {OUT.relative_to(ROOT)} in {out['seconds']:.0f} s")


if __name__ == "__main__":
    main()
