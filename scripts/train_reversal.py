"""Train the tiny encoder-decoder whose cross-attention the masks chapter shows.

Task: reverse a string of digits ("3141" -> "1413"). To write output position t the decoder
must read source position S-1-t, so a trained model's cross-attention is an anti-diagonal.
Writes book/attention/data/reversal.safetensors (about 150 kB) with tfbook's training loop;
a fixed seed and a fixed number of steps make it reproducible (about a minute on one thread).
Run: .venv/bin/python scripts/train_reversal.py
"""

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import save_model

from tfbook.models.transformer import Transformer, TransformerConfig
from tfbook.train.loop import TrainConfig, seq2seq_loss, train

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "attention" / "data" / "reversal.safetensors"
DIGITS, BOS = 10, 10  # ids 0-9 are the digits, 10 starts the decoder input
LENGTH = 8  # every string has 8 digits: one length keeps the learned maps crisp
CONFIG = dataclasses.replace(
    TransformerConfig.tiny(), src_vocab_size=11, tgt_vocab_size=11, max_len=16,
    n_encoder_layers=1, n_decoder_layers=2, n_heads=2,
)
# Adam (AdamW without decay) at a constant rate, no clipping
TRAINING = TrainConfig(steps=1000, lr=3e-3, schedule="constant", weight_decay=0.0, clip=None,
                       betas=(0.9, 0.999), seed=0)


def reversal_batch(generator: torch.Generator, size: int = 64) -> dict[str, torch.Tensor]:
    """Random strings of LENGTH digits: source, decoder input (target shifted right), target."""
    src = torch.randint(0, DIGITS, (size, LENGTH), generator=generator)  # (B, S)
    tgt = src.flip(1)  # (B, T), T = S
    inp = torch.cat([torch.full((size, 1), BOS), tgt[:, :-1]], dim=1)  # teacher forcing
    return {"src": src, "tgt_in": inp, "labels": tgt}


def main() -> None:
    torch.manual_seed(TRAINING.seed)
    model = Transformer(CONFIG)
    history = train(model, reversal_batch, TRAINING, loss_fn=seq2seq_loss)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # save_model copes with the tied embedding / output matrices; the config rides along as
    # metadata, so a reader rebuilds the model without this script
    metadata = {"config": json.dumps(dataclasses.asdict(CONFIG)), "length": str(LENGTH),
                "steps": str(TRAINING.steps)}
    save_model(model, str(OUT), metadata=metadata)
    print(f"saved {OUT} after {TRAINING.steps} steps in {history.seconds:.0f} s, "
          f"last loss {history.loss[-1]:.4f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
