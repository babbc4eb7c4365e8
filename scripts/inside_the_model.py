"""Head scores and patching sweeps of SmolLM2-135M-Instruct (and of the book's small GPT) for
the chapter book/inside/inside_the_model.md, cached in book/inside/data/ (a few tens of kB).

1. head_scores.json: the four attention-pattern scores of every head (tfbook.inspect.scores:
   previous-token, first-token sink, duplicate-token, induction) on SCORE_SEQUENCES sequences
   of N_TOKENS distinct random tokens repeated twice (after the BOS token for SmolLM2), for
   SmolLM2's 30 x 9 heads and the small GPT's 2 x 4; the same scores on the first
   REPLAY_SEQUENCES of those sequences (the batch the chapter recomputes live), and the
   rounding of those scores, measured against a float64 run of the same model
   (`score_rounding`), from which the chapter derives its margins.
2. patching_grids.json: for each prompt pair (an indirect-object sentence and a factual-recall
   sentence, clean and corrupted of equally many tokens), the logit difference of the two
   answers on both runs, and activation patching (tfbook.inspect.patching) of the residual
   stream by layer x position and of every head's output, query, key and value by layer x
   head, each beside its attribution-patching estimate. One batched forward pass per layer
   and grid; 2,160 cells in all, each a patched run except the positions before the first
   token the prompts differ in (a patch there changes nothing, and is not run).

Everything is seeded or deterministic; the numbers move only by float rounding from one
machine to another (the chapter replays some of them live and checks them within
tfbook.inspect.patching.replay_bound; tests/test_inside_artefacts.py does the same for other
cells). The machine record (bench/bench_model.py) is kept for information only: the CPU
seconds in the files are not quoted anywhere as a speed.
Run: .venv/bin/python scripts/inside_the_model.py  (a few minutes of CPU on 2 cores)
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
from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer  # noqa: E402
from tfbook.inspect.patching import (  # noqa: E402
    PAIRS,
    PromptPair,
    activation_patching,
    attribution_patching,
    logit_diff,
)
from tfbook.inspect.scores import (  # noqa: E402
    head_scores,
    repeated_random_tokens,
    score_rounding,
)
from tfbook.paths import book_file  # noqa: E402
from tfbook.train.corpus_lm import load_trained_gpt  # noqa: E402

OUT = ROOT / "book" / "inside" / "data"
N_TOKENS = 25  # R: distinct random tokens, then the same R again
SCORE_SEQUENCES = 16  # sequences the stored scores average over
REPLAY_SEQUENCES = 4  # the first of them, which the chapter scores again live
SEED = 0
DIGITS = 8  # significant digits stored (float32 carries about 7)
# The prompt pairs (tfbook.inspect.patching.PAIRS): an indirect-object and a factual-recall
# pair, clean and corrupted of equally many tokens; the metric is logit(answer) - logit(wrong)
# at the last position.
GRIDS = ("residual_pre", "attn.heads", "attn.q", "attn.k", "attn.v")


def rounded(x: torch.Tensor | float) -> list | float:
    """Numbers for the JSON: DIGITS significant digits (nested lists for a tensor)."""
    if isinstance(x, torch.Tensor):
        return [rounded(v) for v in x.tolist()] if x.dim() else rounded(x.item())
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return float(f"{x:.{DIGITS}g}")


def score_test(model: torch.nn.Module, vocab_size: int, bos_id: int | None,
               exclude: list[int], n_sequences: int) -> torch.Tensor:
    """The repeated-random-token batch the scores are measured on."""
    return repeated_random_tokens(vocab_size, N_TOKENS, n_sequences, bos_id=bos_id,
                                  exclude=exclude, seed=SEED)


def scores_record(model: torch.nn.Module, bos_id: int | None, exclude: list[int]) -> dict:
    """Every head's four scores on SCORE_SEQUENCES and on the first REPLAY_SEQUENCES of them,
    and how far float32 rounding moved the replay batch's scores from a float64 run."""
    V = model.config.vocab_size
    ids = score_test(model, V, bos_id, exclude, SCORE_SEQUENCES)
    replay = score_test(model, V, bos_id, exclude, REPLAY_SEQUENCES)
    assert torch.equal(ids[:REPLAY_SEQUENCES], replay)  # one generator, rows drawn in order
    return {
        "test": {"n_tokens": N_TOKENS, "n_sequences": SCORE_SEQUENCES, "seed": SEED,
                 "bos_id": bos_id, "exclude": exclude, "vocab_size": V},
        "scores": {k: rounded(v) for k, v in head_scores(model, ids).items()},
        "replay": {"n_sequences": REPLAY_SEQUENCES,
                   "scores": {k: rounded(v) for k, v in head_scores(model, replay).items()},
                   "rounding": score_rounding(model, replay)},
    }


def patching_record(model: torch.nn.Module, tokenizer, pair: PromptPair) -> dict:
    """Activation and attribution patching grids of one prompt pair."""
    clean, corrupted, answer, wrong = pair.encode(tokenizer)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logit_diff(logits, answer, wrong)

    labels = [tokenizer.decode([i]) for i in clean]
    record = {"clean": pair.clean, "corrupted": pair.corrupted, "answer": pair.answer,
              "wrong": pair.wrong, "clean_ids": clean, "corrupted_ids": corrupted,
              "answer_id": answer, "wrong_id": wrong, "activation": {}, "attribution": {},
              "cpu_seconds": {}}
    approx = attribution_patching(model, clean, corrupted, metric, list(GRIDS), labels=labels)
    for what in GRIDS:
        r = activation_patching(model, clean, corrupted, metric, what, labels=labels)
        record["activation"][what] = rounded(r.values)
        record["attribution"][what] = rounded(approx[what].values)
        record["cpu_seconds"][what] = round(r.cpu_seconds, 1)
        record["labels_" + what] = list(r.labels)
    record["clean_metric"], record["corrupted_metric"] = rounded(r.clean), rounded(r.corrupted)
    record["cpu_seconds"]["attribution, all grids"] = round(approx[GRIDS[0]].cpu_seconds, 1)
    return record


def write(name: str, data: dict, start: float) -> None:
    """data and the machine record as compact JSON in OUT / name."""
    path = OUT / name
    record = {**data, "machine": machine(cpu_seconds=round(time.process_time() - start, 1))}
    path.write_text(json.dumps(record, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["scores", "patching"], help="write one file only")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    smol, tokenizer = load_smollm2(), load_smollm2_tokenizer()
    if args.only != "patching":
        start = time.process_time()
        gpt, _ = load_trained_gpt(book_file("learning/data/training_gpt"))
        specials = sorted(tokenizer.special_tokens.values())
        models = {"smollm2": (smol, tokenizer.bos_id, specials),
                  "gpt": (gpt, None, [])}  # the small GPT was trained without a BOS token
        scores = {name: scores_record(*spec)
                  for name, spec in tqdm(models.items(), desc="head scores", file=sys.stderr)}
        write("head_scores.json", scores, start)
    if args.only != "scores":
        start = time.process_time()
        grids = {name: patching_record(smol, tokenizer, pair)
                 for name, pair in tqdm(PAIRS.items(), desc="prompt pairs", file=sys.stderr)}
        write("patching_grids.json", grids, start)


if __name__ == "__main__":
    main()
