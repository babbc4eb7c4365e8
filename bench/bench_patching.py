"""Activation patching and attribution patching on SmolLM2-135M-Instruct, two prompt pairs.

    python bench/bench_patching.py     # prints the tables, writes bench/results/patching.json

The pairs (tfbook.inspect.patching.PAIRS): an indirect-object prompt (Wang et al. 2022),
corrupted by making the second mention of the subject the other name, and a factual-recall
prompt (Meng et al. 2022), corrupted by another landmark of as many tokens. For each: the
token counts (equal, checked), the logit differences of both runs, then the grids
tfbook.inspect.patching computes (residual stream by layer x position; each head's output,
query, key and value by layer x head), each sweep's process CPU time, the cells that restore
most, and where attribution patching's estimate differs most from activation patching. Also
the residual sweep run one patched prompt per forward pass (batch_size=1), the cost the
batching saves.

One process, THREADS threads, OMP_WAIT_POLICY=PASSIVE; CPU times (time.process_time, all
threads) are kept because the machine is shared and its wall-clock times are not steady.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its thread pool

import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script from a checkout

from bench_model import machine  # noqa: E402  (the same record as the other benchmarks)

from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer  # noqa: E402
from tfbook.inspect.patching import (  # noqa: E402
    PAIRS,
    PromptPair,
    activation_patching,
    attribution_patching,
    disagreements,
    logit_diff,
)

OUT = ROOT / "bench" / "results" / "patching.json"
THREADS = 2
GRIDS = ("residual_pre", "attn.heads", "attn.q", "attn.k", "attn.v")


def run_pair(model, tok, pair: PromptPair) -> dict:
    """Every grid of one prompt pair, with timings, top cells and disagreements."""
    clean, corrupted, a, w = pair.encode(tok)  # checked: equal lengths, one-token answers
    name, answer, wrong = pair.name, pair.answer, pair.wrong
    tokens = [[tok.decode([i]) for i in ids] for ids in (clean, corrupted)]
    labels = [c if c == x else f"{c}/{x}" for c, x in zip(*tokens, strict=True)]

    def metric(logits):
        return logit_diff(logits, a, w)

    with torch.no_grad():
        margins = {k: float(metric(model(torch.tensor([ids])).logits))
                   for k, ids in (("clean", clean), ("corrupted", corrupted))}
    print(f"\n{name}: {len(clean)} tokens each; logit diff {answer!r} - {wrong!r}: clean "
          f"{margins['clean']:.3f}, corrupted {margins['corrupted']:.3f}")
    record = {"clean": pair.clean, "corrupted": pair.corrupted, "answer": answer,
              "wrong": wrong, "answer_id": a, "wrong_id": w, "clean_tokens": tokens[0],
              "corrupted_tokens": tokens[1], "labels": labels, "n_tokens": len(clean),
              "logit_diff": margins, "grids": {}}
    activation = {}
    for what in GRIDS:
        r = activation_patching(model, clean, corrupted, metric, what, labels=labels)
        activation[what] = r
        print(f"  activation {what:13s} {tuple(r.values.shape)}: {r.forward_passes} forward "
              f"passes, {r.cpu_seconds:.1f} s CPU; top: "
              + ", ".join(f"L{c.layer} {c.label!r} {c.restored:.2f}" for c in r.top(4)))
    attribution = attribution_patching(model, clean, corrupted, metric, list(GRIDS),
                                       labels=labels)
    attr_seconds = next(iter(attribution.values())).cpu_seconds
    print(f"  attribution, all {len(GRIDS)} grids: one clean forward, one corrupted forward "
          f"and backward, {attr_seconds:.2f} s CPU")
    for what in GRIDS:
        act, att = activation[what], attribution[what]
        worst = disagreements(act, att, k=5)
        corr = torch.corrcoef(torch.stack([act.restored.flatten(),
                                           att.restored.flatten()]))[0, 1].item()
        print(f"  {what:13s} correlation {corr:.3f}; largest disagreements: "
              + ", ".join(f"L{d.layer} {d.label!r} act {d.activation:.2f} attr "
                          f"{d.attribution:.2f}" for d in worst[:3]))
        record["grids"][what] = {
            "axes": list(act.axes), "labels": list(act.labels),
            "clean": act.clean, "corrupted": act.corrupted,
            "activation": [[round(v, 6) for v in row] for row in act.values.tolist()],
            "attribution": [[round(v, 6) for v in row] for row in att.values.tolist()],
            "activation_cpu_seconds": round(act.cpu_seconds, 3),
            "activation_forward_passes": act.forward_passes,
            "top": [c._asdict() for c in act.top(5)],
            "disagreements": [d._asdict() for d in worst],
            "correlation": corr,
        }
    record["attribution_cpu_seconds"] = round(attr_seconds, 3)
    return record


def main() -> None:
    torch.set_num_threads(THREADS)
    tok = load_smollm2_tokenizer()
    model = load_smollm2()
    results = {"pairs": {}}
    for name, pair in PAIRS.items():
        results["pairs"][name] = run_pair(model, tok, pair)
    # the batching's saving: the same residual sweep, one patched prompt per forward pass
    clean, corrupted, a, w = PAIRS["ioi"].encode(tok)
    start = time.process_time()
    single = activation_patching(model, clean, corrupted,
                                 lambda logits: logit_diff(logits, a, w), "residual_pre",
                                 batch_size=1)
    single_seconds = time.process_time() - start
    batched = results["pairs"]["ioi"]["grids"]["residual_pre"]
    gap = max(abs(x - y) for r, s in zip(single.values.tolist(), batched["activation"],
                                          strict=True) for x, y in zip(r, s, strict=True))
    print(f"\nioi residual sweep one prompt per forward pass: {single.forward_passes} passes, "
          f"{single_seconds:.1f} s CPU against {batched['activation_cpu_seconds']:.1f} s "
          f"batched; largest difference in the metric {gap:.2e}")
    results["unbatched_residual_sweep"] = {
        "forward_passes": single.forward_passes, "cpu_seconds": round(single_seconds, 3),
        "batched_forward_passes": batched["activation_forward_passes"],
        "batched_cpu_seconds": batched["activation_cpu_seconds"], "largest_difference": gap}
    results["machine"] = machine(threads_set=THREADS)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
