"""DPO on SmolLM2-135M-Instruct with LoRA and the book's preference set, for the chapter
book/posttrain/preferences.md; cached in book/posttrain/data/dpo/.

For each configuration in RUNS: SmolLM2 + LoRA (tfbook.posttrain.adapters), trained by the
book's one training loop (tfbook.train.loop.train) with tfbook.posttrain.dpo.DPOLossFn. The
reference is the adapter-disabled model; its log-probs are computed once for every training
pair before the first step (the base weights never change, so they stay valid). Stored per
run, in <run>/:
  - adapter/: the trained LoRA matrices (save_adapter), to reload without training;
  - history.json: per step the loss, the batch means of the chosen / rejected implicit
    rewards, the margin, the accuracy (fraction of pairs with margin > 0) and the chosen /
    rejected log-probs under the policy, the learning rate and the gradient norm; every
    EVAL_EVERY steps, each pair's log-probs under the policy (training and held-out pairs);
    the reference's log-probs of every pair; greedy answers to the held-out prompts before
    and after; the settings; CPU seconds; the machine record (bench/bench_model.py).
Everything is seeded; the numbers move only by float rounding from one machine to another.
Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/posttrain_dpo.py [--runs gentle strong]
(a few minutes of CPU on 2 cores per run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_model import machine  # noqa: E402
from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer  # noqa: E402
from tfbook.generate.search import generate  # noqa: E402
from tfbook.posttrain.adapters import save_adapter, smollm2_with_lora  # noqa: E402
from tfbook.posttrain.chat import chat_ids  # noqa: E402
from tfbook.posttrain.dpo import (  # noqa: E402
    DPOLossFn,
    adapters_disabled,
    collate_pairs,
    load_preferences,
    preference_batches,
    preference_example,
    preference_logps,
)
from tfbook.train.loop import TrainConfig, train  # noqa: E402

OUT = ROOT / "book" / "posttrain" / "data" / "dpo"
LORA = {"targets": ("q_proj", "v_proj"), "r": 8, "alpha": 16, "seed": 0}
# Two runs from the same start, the same batches and beta; only the learning rate differs.
# "gentle" moves the adapter a little; "strong" (three times the rate) pushes the margins
# further, and shows what that costs the chosen answers.
RUNS = {
    "gentle": {"beta": 0.1, "lr": 1e-4, "steps": 40, "batch_pairs": 8, "seed": 0},
    "strong": {"beta": 0.1, "lr": 3e-4, "steps": 40, "batch_pairs": 8, "seed": 0},
}
EVAL_EVERY = 10  # steps between two scorings of every pair (train and held out)
CHUNK = 16  # pairs per forward pass when scoring without gradient
NEW_TOKENS = 40  # greedy answer length for the before/after samples
DIGITS = 8


def rounded(values):
    if isinstance(values, list):
        return [rounded(v) for v in values]
    return float(f"{values:.{DIGITS}g}")


@torch.no_grad()
def score(model, examples, pad_id, disabled: bool) -> tuple[list[float], list[float]]:
    """Summed log-probs of the chosen and rejected answers, CHUNK pairs at a time."""
    chosen, rejected = [], []
    model.eval()
    for i in range(0, len(examples), CHUNK):
        b = collate_pairs(examples[i:i + CHUNK], pad_id)
        args = (b["chosen_ids"], b["chosen_mask"], b["rejected_ids"], b["rejected_mask"])
        if disabled:
            with adapters_disabled(model):
                c, r = preference_logps(model, *args)
        else:
            c, r = preference_logps(model, *args)
        chosen += c.tolist()
        rejected += r.tolist()
    return chosen, rejected


@torch.no_grad()
def answers(model, tokenizer, prompts, disabled: bool) -> list[str]:
    """Greedy answers (up to NEW_TOKENS tokens, stopping at <|im_end|>)."""
    end = tokenizer.token_to_id("<|im_end|>")
    ids = [chat_ids(tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True)
           for p in prompts]
    model.eval()
    if disabled:
        with adapters_disabled(model):
            out = generate(model, ids, NEW_TOKENS, end_ids=end)
    else:
        out = generate(model, ids, NEW_TOKENS, end_ids=end)
    texts = []
    for row in out.new_tokens.tolist():
        row = row[:row.index(end)] if end in row else row
        texts.append(tokenizer.decode(row))
    return texts


def run(name: str, settings: dict, tokenizer, train_pairs, held_pairs) -> None:
    began = time.process_time()
    pad_id = tokenizer.token_to_id("<|endoftext|>")
    model = smollm2_with_lora(**LORA)
    examples = [preference_example(tokenizer, p["prompt"], p["chosen"], p["rejected"])
                for p in train_pairs]
    held = [preference_example(tokenizer, p["prompt"], p["chosen"], p["rejected"])
            for p in held_pairs]
    ref_c, ref_r = score(model, examples, pad_id, disabled=True)  # once: the base never moves
    held_ref = score(model, held, pad_id, disabled=True)
    held_prompts = [p["prompt"] for p in held_pairs]
    before = answers(model, tokenizer, held_prompts, disabled=True)

    next_batch = preference_batches(examples, settings["batch_pairs"], pad_id, ref_c, ref_r)
    tracked = {"step": [], "train_chosen_logps": [], "train_rejected_logps": [],
               "held_out_chosen_logps": [], "held_out_rejected_logps": []}

    def on_eval(step: int, model, history) -> None:
        """Every pair's log-probs under the policy (train and held out), every EVAL_EVERY."""
        tracked["step"].append(step + 1)  # optimiser steps done
        for split, rows in (("train", examples), ("held_out", held)):
            c, r = score(model, rows, pad_id, disabled=False)
            tracked[f"{split}_chosen_logps"].append(rounded(c))
            tracked[f"{split}_rejected_logps"].append(rounded(r))
        model.train()

    config = TrainConfig(steps=settings["steps"], lr=settings["lr"], schedule="constant",
                         weight_decay=0.0, clip=1.0, seed=settings["seed"],
                         eval_every=EVAL_EVERY)
    loss_fn = DPOLossFn(beta=settings["beta"])
    history = train(model, next_batch, config, loss_fn=loss_fn, on_eval=on_eval)
    held_after = (tracked["held_out_chosen_logps"][-1], tracked["held_out_rejected_logps"][-1])
    after = answers(model, tokenizer, held_prompts, disabled=False)
    where = OUT / name
    save_adapter(model, where / "adapter", {"run": name, **settings, **LORA})
    record = {
        "run": name,
        "settings": {**settings, "lora": LORA, "schedule": "constant", "weight_decay": 0.0,
                     "clip": 1.0, "train_pairs": len(examples), "held_out_pairs": len(held)},
        "steps": {**{k: rounded(v) for k, v in loss_fn.log.items()},
                  "lr": rounded(history.lr), "grad_norm": rounded(history.grad_norm)},
        "train_reference": {"chosen_logps": rounded(ref_c), "rejected_logps": rounded(ref_r),
                            "kind": [p["kind"] for p in train_pairs]},
        "tracked": tracked,
        "held_out": {
            "prompt": held_prompts, "kind": [p["kind"] for p in held_pairs],
            "reference_chosen_logps": rounded(held_ref[0]),
            "reference_rejected_logps": rounded(held_ref[1]),
            "policy_chosen_logps": rounded(held_after[0]),
            "policy_rejected_logps": rounded(held_after[1]),
            "answers_before": before, "answers_after": after,
        },
        "cpu_seconds": round(time.process_time() - began, 1),
        "machine": machine(),
    }
    (where / "history.json").write_text(json.dumps(record, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = load_smollm2_tokenizer()
    train_pairs, held_pairs = load_preferences("train"), load_preferences("held_out")
    for name in tqdm(args.runs, desc="runs", file=sys.stderr):
        run(name, RUNS[name], tokenizer, train_pairs, held_pairs)


if __name__ == "__main__":
    main()
