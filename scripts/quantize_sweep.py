"""Measure SmolLM2-135M-Instruct in each weight format of the quantization chapter and cache
the results in tfbook/data/quantize_sweep.json (a few kB).

The model's float32 weights are the shipped GGUF file's, dequantised: its matrices are Q4_1,
its token embedding (also the output layer) Q8_0. Each format of tfbook.quantize.FORMATS
re-quantises every matrix of that model (the embedding too; the norm gains stay float32) and
reads it back. Recorded per format: the loss in nats per token on held-out text (the last
HELD_OUT_BYTES of tfbook.corpus.stdlib_corpus(), cut into N_WINDOWS windows of T tokens;
every token after the first of a window is predicted), the bytes of the weights, and the
relative error ||W' - W|| / ||W|| of every matrix. Two more rows measure the loss only:

- "int8 weights and inputs": the int8 row's weights (every nn.Linear an Int8Linear, the
  embedding lookup reading the int8-rounded rows), and every product's input rounded per
  row to int8 as well, by tfbook.quantize.int8_matmul (W8A8).
- "Q4_1, second dose": an estimate of what Q4_1 costs a model that was not in Q4_1 before.
  Every Q4_1 matrix of the file gets a second, independent error of Q4_1's size (uniform in
  +-d/2, d its block's spread over 15 steps), and the embedding is rounded to Q4_1; one row
  per seed in DOSE_SEEDS.

Also: how many blocks of the shipped file come back byte for byte when their dequantised
weights are quantised again in their own format, and the file's most lopsided block (the
smallest share of a block's range on the side of zero its fewer weights lie). Deterministic
apart from the float sums of the forward pass (about 20 minutes on 2 cores).
Run: .venv/bin/python scripts/quantize_sweep.py   (--lopsided-only: just the lopsided block)
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
    gguf_dequantise,
    gguf_quantise,
    quantise_linears,
    read_gguf_blocks,
    relative_error,
    round_trip,
    stored_bytes,
)

OUT = ROOT / "book" / "fast" / "data" / "quantize_sweep.json"
HELD_OUT_BYTES = 40_000  # the end of the corpus
T = 512  # tokens per window
N_WINDOWS = 8
W8A8 = "int8 weights and inputs"  # the row of int8_matmul's model
DOSE_SEEDS = (0, 1)  # the second-dose estimate of Q4_1, one row per seed
MIN_CODES = 12  # the most lopsided block is sought among blocks using this many Q4_1 codes


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


def second_dose(w: torch.Tensor, seed: int) -> torch.Tensor:
    """w (R, K), a matrix of the file's Q4_1 weights, with a second Q4_1-sized rounding
    error: uniform in +-d/2 per weight, d = (max - min) / 15 of its block of 32."""
    blocks = w.reshape(-1, 32)  # (N, 32)
    d = (blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True)) / 15  # (N, 1)
    noise = torch.rand(blocks.shape, generator=torch.Generator().manual_seed(seed)) - 0.5
    return (blocks + noise * d).reshape(w.shape)


def most_lopsided(shipped: dict) -> dict:
    """How one-sided the file's blocks are. Per block, the share of its range max - min on
    the side of zero where its fewer weights lie, min(max, -min) / range (0: one sign only).
    Counted over every block; the most lopsided is sought among the Q4_1 blocks whose codes
    take at least MIN_CODES of the 16 values (weights spread over the levels, not one outlier
    and a crowd)."""
    best, one_signed = None, 0
    for name, (kind, blocks) in tqdm(shipped.items(), desc="lopsided blocks"):
        w = gguf_dequantise(blocks, kind)  # (R, K)
        b = w.reshape(w.shape[0], -1, 32)  # (R, B, 32)
        high, low = b.amax(-1), b.amin(-1)  # (R, B)
        share = torch.minimum(high.clamp_min(0), (-low).clamp_min(0)) / (high - low)
        one_signed += int((share == 0).sum())
        if kind != "Q4_1":
            continue
        raw = blocks.reshape(*share.shape, BLOCK_BYTES[kind])  # (R, B, 20)
        codes = torch.cat([raw[..., 4:] & 0x0F, raw[..., 4:] >> 4], dim=-1).long()  # (R, B, 32)
        used = torch.zeros(*share.shape, 16, dtype=torch.bool).scatter_(-1, codes, True)
        share = torch.where(used.sum(-1) >= MIN_CODES, share, torch.inf)
        i = int(share.argmin())
        row, block = divmod(i, share.shape[1])
        if best is None or float(share[row, block]) < best["minority_share"]:
            best = {"tensor": name, "row": row, "block": block,
                    "minority_share": float(share[row, block]),
                    "codes_used": int(used[row, block].sum())}
    return {"blocks_of_one_sign": one_signed, "most_lopsided": best,
            "most_lopsided_min_codes": MIN_CODES}


def lopsided_only() -> None:
    """Recompute only the lopsided-block entries of the cached sweep (seconds, not minutes)."""
    out = json.loads(OUT.read_text())
    n_layers = 30  # SmolLM2-135M
    names = sorted({g.format(i=i) for g in GGUF_TO_TFBOOK for i in range(n_layers)
                    if "norm" not in g})  # the matrices (the norm gains are float32)
    shipped = read_gguf_blocks(smollm2_gguf_path(), names)
    out["shipped"].update(most_lopsided(shipped))
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(out["shipped"])


def main() -> None:
    if "--lopsided-only" in sys.argv[1:]:
        return lopsided_only()
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
    lopsided = most_lopsided(shipped)
    print(f"most lopsided block: {lopsided}")
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

    # Q4_1 as a first rounding, estimated: a second dose on the file's Q4_1 matrices
    q4_1 = {to_tfbook[g] for g, (kind, _) in shipped.items() if kind == "Q4_1"}
    for seed in DOSE_SEEDS:
        for name, p in matrices.items():
            p.data.copy_(second_dose(original[name], seed) if name in q4_1
                         else round_trip(original[name], "Q4_1"))
        results[f"Q4_1, second dose (seed {seed})"] = {
            "bytes": results["Q4_1"]["bytes"],
            "loss": window_losses(model, tqdm(windows, desc=f"Q4_1 second dose {seed}")),
        }
        for name, p in matrices.items():
            p.data.copy_(original[name])

    # W8A8: the int8 row's weights, and every product's input rounded to int8 too
    int8_model = quantise_linears(model)  # every nn.Linear -> Int8Linear, in place
    int8_model.tok_emb.weight.data = round_trip(original["tok_emb.weight"], "int8 per channel")
    results[W8A8] = {"bytes": results["int8 per channel"]["bytes"],
                     "loss": window_losses(int8_model, tqdm(windows, desc=W8A8))}
    n_weights = sum(p.numel() for p in matrices.values()) + sum(p.numel() for p in vectors)
    out = {
        "description": "SmolLM2-135M-Instruct's weights (the shipped GGUF, dequantised) "
                       "re-quantised in each format; written by scripts/quantize_sweep.py",
        "held_out": {"corpus_sha256": corpus_sha256(stdlib_corpus()),
                     "last_bytes": HELD_OUT_BYTES, "windows": N_WINDOWS, "T": T},
        "n_weights": n_weights,
        "shipped": {"bytes": shipped_bytes, "file_bytes": smollm2_gguf_path().stat().st_size,
                    "blocks_equal_when_requantised": same_blocks, "blocks": all_blocks,
                    **lopsided},
        "dose_seeds": list(DOSE_SEEDS),
        "formats": results,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seconds": round(time.time() - began, 1),
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for fmt, r in results.items():
        loss = sum(r["loss"]) / len(r["loss"])
        print(f"{fmt:18s} {8 * r['bytes'] / n_weights:6.3f} bits/weight  loss {loss:.4f}")
    print(f"wrote {OUT} in {out['seconds']:.0f} s")


if __name__ == "__main__":
    main()
