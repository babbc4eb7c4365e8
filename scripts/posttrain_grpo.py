"""GRPO on SmolLM2-135M-Instruct + LoRA: learn small additions from a checkable reward.

Writes book/posttrain/data/grpo/ (adapter.safetensors, adapter.json, history.json), which
book/posttrain/rewards.md reads. The run is the book's one training loop
(tfbook.train.loop.train) with `RolloutBatches` as next_batch (a new group of samples every
`iterations` steps) and `GRPOLossFn` as loss_fn. Before and after, every held-out problem is
sampled n times at the training temperature: pass@1 and pass@k (Chen et al.'s estimator).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/posttrain_grpo.py        # ~10 CPU minutes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_model import machine  # noqa: E402
from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer  # noqa: E402
from tfbook.posttrain.adapters import save_adapter, smollm2_with_lora  # noqa: E402
from tfbook.posttrain.evaluate import mean_pass_at_k  # noqa: E402
from tfbook.posttrain.rewards import addition_problems  # noqa: E402
from tfbook.posttrain.rollouts import (  # noqa: E402
    GRPOLossFn,
    RolloutBatches,
    pass_counts,
    sample_completions,
)
from tfbook.train.loop import TrainConfig, train  # noqa: E402

OUT = ROOT / "book" / "posttrain" / "data" / "grpo"
SETTINGS = {
    "max_operand": 9, "held_out": 20, "split_seed": 0,  # the task: a + b, 0 <= a, b <= 9
    "targets": ["q_proj", "k_proj", "v_proj", "out_proj"], "r": 16, "alpha": 32, "lora_seed": 0,
    "prompts_per_step": 4, "group_size": 8, "max_new_tokens": 8, "temperature": 1.0,
    "iterations": 2,  # optimiser steps on each rollout (TRL's num_iterations)
    "beta": 0.04, "epsilon": 0.2, "loss_type": "grpo", "scale_rewards": True,
    "steps": 30, "lr": 3e-4, "seed": 0,
    "eval_n": 8, "eval_k": [1, 4, 8], "eval_seed": 1234,
}


def evaluate(model, tokenizer, problems, s) -> dict:
    """n samples per held-out problem at the training temperature: counts, pass@k, examples."""
    generator = torch.Generator().manual_seed(s["eval_seed"])
    lengths = []
    counts, texts, rewards = [], [], []
    for i in range(0, len(problems), 5):  # 5 problems x n samples a batch: bounded memory
        ro = sample_completions(model, tokenizer, problems[i:i + 5], s["eval_n"],
                                s["max_new_tokens"], s["temperature"], generator)
        counts += pass_counts(ro)
        lengths.append(ro.completion_mask.sum(1).float())
        texts += ro.texts[::s["eval_n"]]
        rewards += ro.rewards[::s["eval_n"]].tolist()
    return {"counts": counts,
            "pass_at_k": {str(k): mean_pass_at_k(s["eval_n"], counts, k) for k in s["eval_k"]},
            # tokens of a completion, its closing <|im_end|> counted when it was written
            "completion_length": float(torch.cat(lengths).mean()),
            "examples": [{"problem": f"{p.a} + {p.b}", "completion": t, "reward": r}
                         for p, t, r in zip(problems, texts, rewards, strict=True)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=SETTINGS["steps"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    s = {**SETTINGS, "steps": args.steps}
    torch.manual_seed(s["seed"])
    cpu0, wall0 = time.process_time(), time.perf_counter()
    tokenizer = load_smollm2_tokenizer()
    model = smollm2_with_lora(s["targets"], r=s["r"], alpha=s["alpha"], seed=s["lora_seed"])
    train_set, held_out = addition_problems(s["max_operand"], s["held_out"], s["split_seed"])
    print("evaluating before training ...", file=sys.stderr)
    before = evaluate(model, tokenizer, held_out, s)
    print(f"before: pass@k {before['pass_at_k']}", file=sys.stderr)
    batches = RolloutBatches(model, tokenizer, train_set, s["prompts_per_step"], s["group_size"],
                             s["max_new_tokens"], s["temperature"], s["iterations"], s["beta"],
                             scale_rewards=s["scale_rewards"])
    loss_fn = GRPOLossFn(beta=s["beta"], epsilon_low=s["epsilon"], epsilon_high=s["epsilon"],
                         loss_type=s["loss_type"], max_completion_length=s["max_new_tokens"])
    config = TrainConfig(steps=s["steps"], lr=s["lr"], schedule="constant", weight_decay=0.0,
                         clip=1.0, seed=s["seed"])
    cpu_train = time.process_time()
    history = train(model, batches, config, loss_fn=loss_fn)
    cpu_train = time.process_time() - cpu_train
    print("evaluating after training ...", file=sys.stderr)
    after = evaluate(model, tokenizer, held_out, s)
    print(f"after: pass@k {after['pass_at_k']}", file=sys.stderr)
    record = {
        "settings": s,
        "steps": loss_fn.log | {"grad_norm": history.grad_norm},
        "before": before, "after": after,
        "held_out": [f"{p.a} + {p.b}" for p in held_out],
        "cpu_seconds": {"total": time.process_time() - cpu0, "train": cpu_train},
        "wall_seconds": time.perf_counter() - wall0,
        "machine": machine(),
    }
    save_adapter(model, args.out, meta={"script": "scripts/posttrain_grpo.py", "settings": s})
    (args.out / "history.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
