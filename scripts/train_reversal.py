"""Train the tiny encoder-decoder whose cross-attention the masks chapter shows.

Task: reverse a string of digits ("3141" -> "1413"). To write output position t the decoder
must read source position S-1-t, so a trained model's cross-attention is an anti-diagonal.
Writes book/attention/data/reversal.safetensors (about 150 kB); a fixed seed makes it
reproducible. Run: .venv/bin/python scripts/train_reversal.py
"""

import dataclasses
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_model

from tfbook.models.transformer import Transformer, TransformerConfig

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "attention" / "data" / "reversal.safetensors"
DIGITS, BOS = 10, 10  # ids 0-9 are the digits, 10 starts the decoder input
LENGTH = 8  # every string has 8 digits: one length keeps the learned maps crisp
CONFIG = dataclasses.replace(
    TransformerConfig.tiny(), src_vocab_size=11, tgt_vocab_size=11, max_len=16,
    n_encoder_layers=1, n_decoder_layers=2, n_heads=2,
)


def batch(generator: torch.Generator, size: int = 64) -> tuple[torch.Tensor, ...]:
    """Random strings of LENGTH digits: source, decoder input, target."""
    src = torch.randint(0, DIGITS, (size, LENGTH), generator=generator)  # (B, S)
    tgt = src.flip(1)  # (B, T), T = S
    inp = torch.cat([torch.full((size, 1), BOS), tgt[:, :-1]], dim=1)  # teacher forcing
    return src, inp, tgt


def main(max_steps: int = 1500, target_loss: float = 1e-3) -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = Transformer(CONFIG)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = time.time()
    for step in range(max_steps):
        src, inp, tgt = batch(generator)
        loss = model(src, inp, targets=tgt).loss  # tfbook.losses.cross_entropy
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}  {time.time() - start:.0f}s")
        if loss.item() < target_loss:
            break
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # save_model copes with the tied embedding / output matrices; the config rides along as
    # metadata, so a reader rebuilds the model without this script
    config = json.dumps(dataclasses.asdict(CONFIG))
    metadata = {"config": config, "length": str(LENGTH), "steps": str(step + 1)}
    save_model(model, str(OUT), metadata=metadata)
    print(f"saved {OUT} after {step + 1} steps, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
