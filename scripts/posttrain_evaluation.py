"""The book's multiple-choice set scored by SmolLM2-135M-Instruct, base and fine-tuned, for the
chapter book/posttrain/evaluation.md; cached in book/posttrain/data/evaluation_mc.json.

Every option of every question (tfbook/posttrain/data/mc_questions.json) is scored with
tfbook.posttrain.evaluate.loglikelihoods, lm-evaluation-harness's convention (no BOS), in
both ways of putting a question (STYLES: "cloze" and MMLU's lettered layout), by
  - "base": SmolLM2 as the GGUF holds it (layout "hf"), the adapters switched off;
  - "sft": the same model with the LoRA adapter of book/posttrain/data/sft/adapter/
    (scripts/posttrain_sft.py), if that adapter exists.
Stored per model and style: [summed log-probability, is_greedy, continuation tokens, largest
|logit| of the request's row] of each option in order; the SHA-256 of the questions and of
the adapter, CPU seconds and the machine record. The chapter
recomputes a few questions live and checks them against these numbers.
Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/posttrain_evaluation.py  (about a CPU
minutes)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its threads

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_model import machine  # noqa: E402
from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer  # noqa: E402
from tfbook.posttrain.dpo import adapters_disabled  # noqa: E402
from tfbook.posttrain.evaluate import (  # noqa: E402
    STYLES,
    encode_pair,
    load_mc_questions,
    loglikelihoods,
    mc_requests,
)

OUT = ROOT / "book" / "posttrain" / "data" / "evaluation_mc.json"
ADAPTER = ROOT / "book" / "posttrain" / "data" / "sft" / "adapter"
QUESTIONS = ROOT / "tfbook" / "posttrain" / "data" / "mc_questions.json"
BATCH = 16


@torch.no_grad()
def max_abs_logit(model, tok, request: tuple[str, str]) -> float:
    """The largest |logit| of the request's row (context + continuation[:-1]): the scale
    that the float32 bound on its log-likelihood is relative to."""
    ctx, cont = encode_pair(tok, *request)
    return float(model(torch.tensor([ctx + cont[:-1]])).logits.abs().max())


def score_all(model, tok, questions, label: str) -> dict[str, list]:
    out = {}
    for style in STYLES:
        requests = mc_requests(questions, style)
        rows = []
        for start in tqdm(range(0, len(requests), BATCH), desc=f"{label} {style}"):
            chunk = requests[start : start + BATCH]
            scores = loglikelihoods(model, tok, chunk, batch_size=BATCH)
            rows += [
                [s.logprob, s.is_greedy, s.n_tokens, max_abs_logit(model, tok, r)]
                for s, r in zip(scores, chunk, strict=True)
            ]
        out[style] = rows
    return out


def main() -> None:
    torch.manual_seed(0)
    start = time.process_time()
    tok, questions = load_smollm2_tokenizer(), load_mc_questions()
    record = {
        "script": "scripts/posttrain_evaluation.py",
        "questions_sha256": hashlib.sha256(QUESTIONS.read_bytes()).hexdigest(),
        "add_bos": False,
        "fields": ["logprob", "is_greedy", "n_tokens", "max_abs_logit"],
        "models": {},
    }
    if (ADAPTER / "adapter.json").is_file():
        from tfbook.posttrain.adapters import load_adapter

        model = load_adapter(ADAPTER)
        record["adapter"] = str(ADAPTER.relative_to(ROOT))
        record["adapter_sha256"] = hashlib.sha256(
            (ADAPTER / "adapter.safetensors").read_bytes()
        ).hexdigest()
        record["models"]["sft"] = score_all(model, tok, questions, "sft")
        base_context = adapters_disabled(model)
    else:
        print(f"no adapter in {ADAPTER}: the base model only")
        model = load_smollm2(layout="hf")
        base_context = contextlib.nullcontext(model)
    with base_context as base:
        record["models"]["base"] = score_all(base, tok, questions, "base")
    record["cpu_seconds"] = round(time.process_time() - start, 1)
    record["machine"] = machine()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT} ({record['cpu_seconds']} CPU s)")


if __name__ == "__main__":
    main()
