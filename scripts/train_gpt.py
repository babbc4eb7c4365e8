"""Train the training chapter's small GPT on the default corpus and cache the run.

The same code as the chapter's live run (tfbook.train.corpus_lm: corpus_setup, gpt_config,
train_config; tfbook.train.data.window_sampler; tfbook.train.loop.train), only longer:

    main        3,000 steps, seed 0, validation every 150 steps, a sample at each evaluation
    live        the chapter's section 6: 300 steps of train_config(300), validation every 50
                steps on the 128 spread windows, from the model section 2 builds; the chapter
                runs its first 50 steps again and checks them against this record
    ablations   1,500 steps each: the baseline with seeds 0 and 1 (how much the seed alone
                moves the loss), dropout 0.1, label smoothing 0.1

Writes, in book/learning/data/training_gpt/ (about 1.3 MB):

    model.safetensors, optimizer.safetensors, state.json   the main run's final weights
                                                            (tfbook.train.checkpoint format)
    tokenizer.json   the 2,048-token BPE trained on the train split (its merges)
    run.json         every run's History, the samples, the reference points, the timings

Run time: 9,000 training steps in all, which took 12 CPU-minutes (26 minutes of wall-clock
time) on a loaded 2-core machine; on a quiet core, about 40 ms a step, about 7 minutes. run.json
records what it took. With one thread and the same torch build the numbers repeat exactly.
Run: OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 .venv/bin/python scripts/train_gpt.py
(--live-only records the live run again, about 20 CPU-seconds, and leaves the rest of
run.json and the weights as they are.)
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tfbook.models.gpt import GPT
from tfbook.train.checkpoint import save_checkpoint
from tfbook.train.corpus_lm import (
    BATCH_SIZE,
    COMPRESSORS,
    CONTEXT,
    CorpusSplit,
    compressed_bits_per_byte,
    corpus_setup,
    gpt_config,
    sample,
    train_config,
    unigram_loss,
)
from tfbook.train.data import eval_windows, window_sampler
from tfbook.train.loop import History, train

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "learning" / "data" / "training_gpt"
MAIN_STEPS, ABLATION_STEPS = 3000, 1500
LIVE_STEPS, LIVE_EVAL_EVERY, LIVE_EVAL_WINDOWS = 300, 50, 128  # the chapter's section 6
ABLATIONS = {  # name -> (seed, dropout, label smoothing)
    "baseline": (0, 0.0, 0.0),
    "baseline_seed1": (1, 0.0, 0.0),
    "dropout_0.1": (0, 0.1, 0.0),
    "label_smoothing_0.1": (0, 0.0, 0.1),
}


def rounded(history: History, digits: int = 5) -> dict[str, Any]:
    """A History as JSON-ready lists, floats rounded (the file stays small)."""
    out = {}
    for name, value in asdict(history).items():
        if isinstance(value, list):
            out[name] = [round(v, digits) if isinstance(v, float) else v for v in value]
        else:
            out[name] = round(value, 2)
    return out


def to_json(value: Any, indent: str = "") -> str:
    """JSON with one key per line, but each list (a curve) on a single line."""
    if not isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    inner = indent + " "
    items = [f"{inner}{json.dumps(k)}: {to_json(v, inner)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + f"\n{indent}}}" + ("\n" if not indent else "")


def run(data: CorpusSplit, steps: int, seed: int = 0, dropout: float = 0.0,
        label_smoothing: float = 0.0, eval_every: int = 150,
        samples: dict[int, str] | None = None) -> tuple[GPT, dict[str, Any]]:
    """One run of the chapter's recipe; with `samples`, a sample is stored at each evaluation."""
    torch.manual_seed(seed)  # the initial weights
    model = GPT(gpt_config(data.vocab_size, dropout=dropout))
    config = train_config(steps, label_smoothing=label_smoothing, eval_every=eval_every,
                          seed=seed)

    def on_eval(step: int, model: GPT, history: History) -> None:
        if samples is not None:
            samples[step] = sample(model, data.tokenizer)

    cpu = time.process_time()
    history = train(model, window_sampler(data.train_ids, BATCH_SIZE, CONTEXT), config,
                    eval_batches=eval_windows(data.val_ids, 64, CONTEXT), on_eval=on_eval)
    cpu = time.process_time() - cpu
    final = history.eval_loss[-1]
    print(f"  {steps} steps, seed {seed}, dropout {dropout}, smoothing {label_smoothing}: "
          f"val {final:.4f} nats/token = {data.bits_per_byte(final):.4f} bits/byte, "
          f"{cpu:.0f} CPU-s", flush=True)
    return model, {"config": {**asdict(config), "dropout": dropout},
                   "history": rounded(history), "cpu_seconds": round(cpu, 1),
                   "final_val_bits_per_byte": round(data.bits_per_byte(final), 5)}


def live_run(data: CorpusSplit) -> dict[str, Any]:
    """The chapter's section 6, step for step: the model of its section 2 (seed 0), the
    recipe of a 300-step run, validation every 50 steps on 128 windows spread over the text."""
    torch.manual_seed(0)  # as the chapter's section 2 builds its model
    model = GPT(gpt_config(data.vocab_size))
    before = sample(model, data.tokenizer)
    config = train_config(LIVE_STEPS, eval_every=LIVE_EVAL_EVERY)
    quick_val = eval_windows(data.val_ids, 64, CONTEXT, max_windows=LIVE_EVAL_WINDOWS)
    cpu = time.process_time()
    history = train(model, window_sampler(data.train_ids, BATCH_SIZE, CONTEXT), config,
                    eval_batches=quick_val)
    cpu = time.process_time() - cpu
    print(f"  live run: {LIVE_STEPS} steps, val {history.eval_loss[-1]:.4f} nats/token, "
          f"{cpu:.0f} CPU-s", flush=True)
    return {"config": asdict(config), "eval_windows": LIVE_EVAL_WINDOWS,
            "history": rounded(history, 6), "cpu_seconds": round(cpu, 1),
            "threads": torch.get_num_threads(),
            "samples": {"before": before, "after": sample(model, data.tokenizer)}}


def record_live_only() -> None:
    """Record the live run again into the existing run.json; nothing else changes."""
    torch.set_num_threads(1)
    path = OUT / "run.json"
    info = json.loads(path.read_text(encoding="utf-8"))
    info["live"] = live_run(corpus_setup())
    path.write_text(to_json(info), encoding="utf-8")
    print(f"wrote the live run into {path}")


def main(main_steps: int = MAIN_STEPS, ablation_steps: int = ABLATION_STEPS) -> None:
    torch.set_num_threads(1)
    began = time.perf_counter()
    data = corpus_setup()
    unigram = unigram_loss(data.train_ids, data.val_ids, data.vocab_size)
    references = {
        "unigram_nats_per_token": round(unigram, 5),
        "unigram_bits_per_byte": round(data.bits_per_byte(unigram), 5),
        **{f"{m}_bits_per_byte": round(compressed_bits_per_byte(data.val_text, m), 5)
           for m in COMPRESSORS},
        "log_V": round(math.log(data.vocab_size), 5),
        "train_tokens": len(data.train_ids), "val_tokens": len(data.val_ids),
        "val_bytes": data.val_bytes,
    }
    print("references:", references, flush=True)

    print(f"main run ({main_steps} steps)", flush=True)
    samples: dict[int, str] = {}
    model, main_run = run(data, main_steps, samples=samples)
    main_run["samples"] = {str(k): v for k, v in samples.items()}

    print(f"live run ({LIVE_STEPS} steps)", flush=True)
    live = live_run(data)

    ablations = {}
    for name, (seed, dropout, smoothing) in ABLATIONS.items():
        print(f"ablation {name} ({ablation_steps} steps)", flush=True)
        ablations[name] = run(data, ablation_steps, seed, dropout, smoothing)[1]

    OUT.mkdir(parents=True, exist_ok=True)
    save_checkpoint(OUT, model.eval(), state={"steps": main_steps})
    data.tokenizer.save(OUT / "tokenizer.json")
    total = time.perf_counter() - began
    info = {
        "script": "scripts/train_gpt.py", "wall_seconds": round(total, 1),
        "torch": torch.__version__, "python": platform.python_version(), "threads": 1,
        "references": references, "main": main_run, "ablations": ablations, "live": live,
    }
    (OUT / "run.json").write_text(to_json(info), encoding="utf-8")
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT} ({size / 1e6:.2f} MB) in {total / 60:.1f} minutes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=MAIN_STEPS, help="steps of the main run")
    parser.add_argument("--ablation-steps", type=int, default=ABLATION_STEPS,
                        help="steps of each dropout / label-smoothing / seed run")
    parser.add_argument("--live-only", action="store_true",
                        help="record only the live run of the chapter's section 6 into run.json")
    args = parser.parse_args()
    if args.live_only:
        record_live_only()
    else:
        main(args.steps, args.ablation_steps)
