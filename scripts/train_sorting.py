"""Train the tiny encoder-decoder whose cross-attention the seq2seq chapter shows.

Task: sort a string of digits ("3141" -> "1134"). To write output position t the decoder has
to find, somewhere in the source, the t-th smallest digit, so a trained model's
cross-attention is a permutation, different for every input. Writes
book/architectures/data/sorting.safetensors (about 700 kB) with a fixed seed.
Run: .venv/bin/python scripts/train_sorting.py
"""

import dataclasses
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_model

from tfbook.models.transformer import Transformer, TransformerConfig

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "architectures" / "data" / "sorting.safetensors"
BOS = 10  # ids 0-9 are the digits; 10 opens the decoder's input
CONFIG = dataclasses.replace(
    TransformerConfig.tiny(), src_vocab_size=11, tgt_vocab_size=11, max_len=16,
    n_encoder_layers=2, n_decoder_layers=2, d_model=64, n_heads=4, d_ff=128, norm_first=True,
)


def sorting_batch(generator: torch.Generator, size: int = 64) -> tuple[torch.Tensor, ...]:
    """Digit strings of one random length 4..12: source (B, S), decoder input and target (B, S)."""
    length = int(torch.randint(4, 13, (1,), generator=generator))
    src = torch.randint(0, 10, (size, length), generator=generator)  # (B, S)
    tgt = src.sort(dim=1).values  # (B, T), T = S
    inp = torch.cat([torch.full((size, 1), BOS), tgt[:, :-1]], dim=1)  # shifted right
    return src, inp, tgt


def main(steps: int = 3000) -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = Transformer(CONFIG)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    # the learning rate falls linearly to zero, so the last steps polish instead of jitter
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 - step / steps)
    start, smooth = time.time(), None
    for step in range(steps):
        src, inp, tgt = sorting_batch(generator)
        loss = model(src, inp, targets=tgt).loss  # tfbook.losses.cross_entropy
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if step % 200 == 0:
            print(f"step {step:4d}  loss {smooth:.4f}  {time.time() - start:.0f}s", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # save_model handles the tied embedding / output matrices; the config travels along
    save_model(model, str(OUT), metadata={"config": json.dumps(dataclasses.asdict(CONFIG))})
    print(f"saved {OUT} after {step + 1} steps, smoothed loss {smooth:.4f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
