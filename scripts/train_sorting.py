"""Train the tiny encoder-decoder whose cross-attention the seq2seq chapter shows.

Task: sort a string of digits ("3141" -> "1134"). To write output position t the decoder has
to find, somewhere in the source, the t-th smallest digit, so a trained model's
cross-attention is a permutation, different for every input. Writes
book/architectures/data/sorting.safetensors (about 700 kB) with tfbook's training loop and a
fixed seed (a few minutes on one thread).
Run: .venv/bin/python scripts/train_sorting.py
"""

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import save_model

from tfbook.models.transformer import Transformer, TransformerConfig
from tfbook.train.loop import TrainConfig, seq2seq_loss, train

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "architectures" / "data" / "sorting.safetensors"
BOS = 10  # ids 0-9 are the digits; 10 opens the decoder's input
CONFIG = dataclasses.replace(
    TransformerConfig.tiny(), src_vocab_size=11, tgt_vocab_size=11, max_len=16,
    n_encoder_layers=2, n_decoder_layers=2, d_model=64, n_heads=4, d_ff=128, norm_first=True,
)
# Adam (AdamW without decay); the rate falls linearly to zero, so the last steps polish
# instead of jitter
TRAINING = TrainConfig(steps=3000, lr=2e-3, schedule="linear", min_lr_ratio=0.0,
                       weight_decay=0.0, clip=None, betas=(0.9, 0.999), seed=0)


def sorting_batch(generator: torch.Generator, size: int = 64) -> dict[str, torch.Tensor]:
    """Digit strings of one random length 4..12: source, decoder input and target (B, S)."""
    length = int(torch.randint(4, 13, (1,), generator=generator))
    src = torch.randint(0, 10, (size, length), generator=generator)  # (B, S)
    tgt = src.sort(dim=1).values  # (B, T), T = S
    inp = torch.cat([torch.full((size, 1), BOS), tgt[:, :-1]], dim=1)  # shifted right
    return {"src": src, "tgt_in": inp, "labels": tgt}


def main() -> None:
    torch.manual_seed(TRAINING.seed)
    model = Transformer(CONFIG)
    history = train(model, sorting_batch, TRAINING, loss_fn=seq2seq_loss)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # save_model handles the tied embedding / output matrices; the config travels along
    save_model(model, str(OUT), metadata={"config": json.dumps(dataclasses.asdict(CONFIG))})
    last = sum(history.loss[-100:]) / 100
    print(f"saved {OUT} after {TRAINING.steps} steps in {history.seconds:.0f} s, "
          f"mean loss of the last 100 steps {last:.4f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
