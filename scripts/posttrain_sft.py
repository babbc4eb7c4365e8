"""Supervised fine-tuning of SmolLM2-135M-Instruct with LoRA on the book's instruction set, for
the chapter book/posttrain/chat_and_sft.md; cached in book/posttrain/data/sft/.

SmolLM2 + LoRA (tfbook.posttrain.adapters.smollm2_with_lora, layout "hf") trained by the book's
one training loop (tfbook.train.loop.train) with tfbook.posttrain.sft.sft_loss: the loss on the
assistant's tokens only, batches of whole conversations right-padded to the longest. Stored:
  - adapter/: the trained LoRA matrices (save_adapter), to reload without training;
  - history.json: the training loss, learning rate and gradient norm of every step; the
    held-out loss (the test conversations' assistant tokens) before training and every
    EVAL_EVERY steps; the greedy replies to the held-out prompts before and after training and
    the format check (tfbook.posttrain.sft.follows_format) of each; the settings; CPU seconds;
    the machine record (bench/bench_model.py).
Everything is seeded; the numbers move only by float rounding from one machine to another.
Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/posttrain_sft.py  (a few CPU minutes)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its threads

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_model import machine  # noqa: E402
from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer  # noqa: E402
from tfbook.posttrain.adapters import save_adapter, smollm2_with_lora  # noqa: E402
from tfbook.posttrain.sft import (  # noqa: E402
    batch_sampler,
    collate,
    follows_format,
    greedy_replies,
    load_instructions,
    sft_example,
    sft_loss,
)
from tfbook.train.loop import TrainConfig, train  # noqa: E402

OUT = ROOT / "book" / "posttrain" / "data" / "sft"
LORA = {"targets": ["q_proj", "v_proj"], "r": 8, "alpha": 16, "seed": 0}
TRAIN = {"steps": 40, "lr": 1e-3, "schedule": "cosine", "warmup": 4, "min_lr_ratio": 0.1,
         "weight_decay": 0.0, "clip": 1.0, "eval_every": 4, "seed": 0}
BATCH = 8  # conversations per step
MAX_LEN = 256  # ids per conversation (the longest of the set has fewer: nothing is truncated)
NEW_TOKENS = 24  # greedy reply length for the format check
DIGITS = 7


def rounded(values):
    if isinstance(values, list):
        return [rounded(v) for v in values]
    return float(f"{values:.{DIGITS}g}")


def main() -> None:
    began = time.process_time()
    torch.manual_seed(0)
    tokenizer = load_smollm2_tokenizer()
    pad_id = tokenizer.token_to_id("<|endoftext|>")
    data = load_instructions()
    train_examples = [sft_example(tokenizer, c["messages"], MAX_LEN) for c in data["train"]]
    test_examples = [sft_example(tokenizer, c["messages"], MAX_LEN) for c in data["test"]]
    assert not any(e.truncated for e in train_examples + test_examples)
    held_out = [collate(test_examples, pad_id)]  # one batch: all 20 test conversations
    prompts = [c["messages"][:-1] for c in data["test"]]

    model = smollm2_with_lora(**LORA)
    before = greedy_replies(model, tokenizer, prompts, NEW_TOKENS)
    config = TrainConfig(**TRAIN)
    history = train(model, batch_sampler(train_examples, BATCH, pad_id), config,
                    eval_batches=held_out, loss_fn=sft_loss)
    after = greedy_replies(model, tokenizer, prompts, NEW_TOKENS)
    save_adapter(model, OUT / "adapter",
                 {"trained_by": "scripts/posttrain_sft.py", "train": TRAIN, "batch": BATCH})
    record = {
        "settings": {"lora": LORA, "train": TRAIN, "batch": BATCH, "max_len": MAX_LEN,
                     "new_tokens": NEW_TOKENS, "train_conversations": len(train_examples),
                     "test_conversations": len(test_examples), "padding": "right, per batch",
                     "layout": "hf"},
        "history": {"step": history.step, "loss": rounded(history.loss),
                    "lr": rounded(history.lr), "grad_norm": rounded(history.grad_norm),
                    "tokens": history.tokens, "eval_step": history.eval_step,
                    "eval_loss": rounded(history.eval_loss)},
        "check": {"prompts": prompts, "expected": [c["messages"][-1]["content"]
                                                   for c in data["test"]],
                  "before": before, "after": after,
                  "before_ok": [follows_format(r) for r in before],
                  "after_ok": [follows_format(r) for r in after]},
        "machine": machine(cpu_seconds=round(time.process_time() - began, 1),
                           loop_seconds=round(history.seconds, 1)),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "history.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    ok = record["check"]
    print(f"format check: before {sum(ok['before_ok'])}/{len(before)}, after "
          f"{sum(ok['after_ok'])}/{len(after)}; held-out loss {history.eval_loss[0]:.3f} -> "
          f"{history.eval_loss[-1]:.3f}; {record['machine']['cpu_seconds']} CPU s")


if __name__ == "__main__":
    main()
