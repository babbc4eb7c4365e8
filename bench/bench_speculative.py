"""Speculative decoding against plain greedy `generate` on SmolLM2-135M-Instruct, on the
speculative-decoding chapter's own prompts and number of new tokens.

    python bench/bench_speculative.py   # writes book/fast/data/speculative_speed.json

The prompts and NEW_TOKENS are those of scripts/speculative_sweep.py (the chapter's stored
acceptance counts), imported from it, so the tokens a pass here are the chapter's. Greedy
decoding, batch 1, no end token (every run writes all NEW_TOKENS), THREADS threads,
OMP_WAIT_POLICY=PASSIVE, float32.

1. Whole answers, wall-clock seconds. In every round each candidate runs once, in turns
   (bench_model.py's `median_times`, called once per round after one warm-up round), so a
   burst of load from another process slows all of them alike. Recorded per candidate: the
   seconds of every round, the speed-up of every round (greedy's seconds / the candidate's in
   the same round, above 1 is faster) and their median, the acceptance rate (accepted /
   proposed guesses) and the new tokens per target pass. Candidates:
   - greedy: tfbook.generate.search.generate, one cached step per token (the reference);
   - prompt lookup with PL_LENGTHS guesses a pass (bigram, then unigram match);
   - early exit: the model's first EXIT_LAYERS blocks as the draft, EXIT_GUESSES guesses a pass;
   - Hugging Face's generate(prompt_lookup_num_tokens=4) beside its own greedy generate.
   Every candidate's tokens are checked equal to greedy's (HF's to HF's greedy, and to
   tfbook's up to an end token, which HF's min_new_tokens masks).
2. The cost of a verify pass: one forward pass of the target over n + 1 new positions with the
   prompt in its cache (n = 0 is an ordinary decoding step), for n in PASS_GUESSES, timed in
   turns over PASS_ROUNDS rounds; its median in steps (the pass's seconds / the step's).

The machine() record (versions, threads, CPU, load average) is stored beside the numbers, with
the load average when the run started.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its thread pool

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a plain script from a checkout
sys.path.insert(0, str(ROOT / "scripts"))  # the chapter's prompts

from bench_model import machine, median_times  # noqa: E402
from speculative_sweep import NEW_TOKENS, prompts  # noqa: E402

from tfbook.checkpoints.smollm2 import (  # noqa: E402
    hf_llama_from_gguf,
    load_smollm2,
    load_smollm2_tokenizer,
    read_smollm2_gguf,
)
from tfbook.generate.search import generate  # noqa: E402
from tfbook.generate.speculative import (  # noqa: E402
    EarlyExitDraft,
    PromptLookupDraft,
    speculative_generate,
)

os.environ["HF_HUB_OFFLINE"] = "1"
RESULTS = ROOT / "book" / "fast" / "data" / "speculative_speed.json"
THREADS = 2
PL_LENGTHS = [2, 4, 8]
EXIT_LAYERS = 26
EXIT_GUESSES = 2
REPEATS = 5  # timed rounds of whole answers, after one warm-up round
PASS_GUESSES = [0, 2, 4, 8]
PASS_ROUNDS = 15


def bench_prompt(model, hf, prompt: list[int], bar: tqdm) -> dict:
    """Time every candidate on one prompt, in turns; check its tokens; the speed-ups."""
    expected = generate(model, [prompt], NEW_TOKENS).new_tokens[0].tolist()
    x = torch.tensor([prompt])
    hf_kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                 min_new_tokens=NEW_TOKENS, do_sample=False)
    drafts = {f"prompt lookup, n={n}": (PromptLookupDraft(), n) for n in PL_LENGTHS}
    drafts[f"early exit {EXIT_LAYERS} blocks, n={EXIT_GUESSES}"] = (
        EarlyExitDraft(model, EXIT_LAYERS), EXIT_GUESSES)
    kinds = {name: (d.name, getattr(d, "n_layers", None)) for name, (d, _) in drafts.items()}
    outs: dict = {}

    def spec(name, draft, n):
        def run():
            outs[name] = speculative_generate(model, prompt, NEW_TOKENS, draft, draft_length=n)
        return run

    fns = {"greedy": lambda: generate(model, [prompt], NEW_TOKENS)}
    fns.update({name: spec(name, d, n) for name, (d, n) in drafts.items()})
    fns["HF greedy"] = lambda: outs.__setitem__(
        "hf greedy", hf.generate(x, **hf_kw)[0, len(prompt):].tolist())
    fns["HF prompt lookup, n=4"] = lambda: outs.__setitem__(
        "hf", hf.generate(x, prompt_lookup_num_tokens=4, **hf_kw)[0, len(prompt):].tolist())
    rounds = []
    with torch.no_grad():
        for r in range(REPEATS):  # one round per call: every round's seconds are kept
            rounds.append(median_times(fns, repeats=1, warmup=1 if r == 0 else 0))
            bar.update()
    rows = {}
    for name in fns:
        seconds = [t[name] for t in rounds]
        row = {"seconds": seconds, "tokens_per_s": NEW_TOKENS / statistics.median(seconds)}
        reference = "HF greedy" if name.startswith("HF") else "greedy"
        speedups = [t[reference] / t[name] for t in rounds]  # same round: fair under load
        row["speedup_per_round"] = speedups
        row["speedup"] = statistics.median(speedups)
        row["speedup_over"] = reference
        if name in drafts:
            out = outs[name]
            if out.new_tokens != expected:
                raise RuntimeError(f"{name} changed the tokens")
            row.update(draft=kinds[name][0], exit_layers=kinds[name][1],  # as the sweep's runs
                       draft_length=drafts[name][1], acceptance_rate=out.acceptance_rate,
                       tokens_per_pass=NEW_TOKENS / out.target_passes,
                       proposed=out.proposed, accepted=out.accepted)
        rows[name] = row
    if outs["hf"] != outs["hf greedy"]:
        raise RuntimeError("HF's prompt lookup gave other tokens than HF's greedy")
    # min_new_tokens keeps HF from ending: it masks the end token, which tfbook (no end_ids)
    # may write and go past; the texts agree up to there
    end = next((i for i, t in enumerate(expected) if t == hf.config.eos_token_id), len(expected))
    rows["HF prompt lookup, n=4"]["same_tokens_as_tfbook_before_the_end_token"] = (
        outs["hf"][:end] == expected[:end])
    return {"prompt_ids": prompt, "new_tokens": expected, "candidates": rows}


@torch.no_grad()
def bench_pass_cost(model, prompt: list[int], answer: list[int]) -> dict:
    """Seconds of one forward pass over n + 1 new positions after the prompt, in turns."""
    cache = model.new_cache(len(prompt) + max(PASS_GUESSES) + 1)
    model(torch.tensor([prompt[:-1]]), cache=cache, last_only=True)  # the prompt's cache
    kept = len(prompt) - 1

    def verify_pass(n):
        chunk = torch.tensor([[prompt[-1]] + answer[:n]])  # (1, n + 1): the token and n guesses

        def run():
            cache.crop(kept)
            model(chunk, cache=cache)
        return run

    times = [median_times({n: verify_pass(n) for n in PASS_GUESSES}, repeats=1,
                          warmup=2 if r == 0 else 0) for r in tqdm(range(PASS_ROUNDS),
                                                                   desc="pass cost")]
    return {"positions": [n + 1 for n in PASS_GUESSES], "guesses": PASS_GUESSES,
            "seconds": {str(n): [t[n] for t in times] for n in PASS_GUESSES},
            "steps_per_pass": {str(n): statistics.median(t[n] / t[0] for t in times)
                               for n in PASS_GUESSES}}


def cpu_model() -> str:
    """The processor's name from /proc/cpuinfo (platform.processor() is often empty on Linux)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines
                 if line.startswith("model name")), "")


def main() -> None:
    torch.set_num_threads(THREADS)
    load_at_start = os.getloadavg()[0]
    start = time.perf_counter()
    model, tokenizer = load_smollm2(), load_smollm2_tokenizer()
    hf = hf_llama_from_gguf(read_smollm2_gguf())
    hf.set_attn_implementation("sdpa")
    texts = prompts(tokenizer)
    results = {"new_tokens": NEW_TOKENS, "threads": THREADS, "repeats": REPEATS,
               "prompts": {}}
    with tqdm(total=REPEATS * len(texts), desc="whole answers, rounds") as bar:
        for name, prompt in texts.items():
            results["prompts"][name] = bench_prompt(model, hf, prompt, bar)
    code = results["prompts"]["code edit"]
    results["pass_cost"] = bench_pass_cost(model, code["prompt_ids"], code["new_tokens"])
    results["machine"] = machine(cpu_model=cpu_model(), load_average_1min_at_start=load_at_start)
    results["seconds"] = time.perf_counter() - start
    for name, res in results["prompts"].items():
        print(f"\n{name} ({len(res['prompt_ids'])} prompt tokens, {NEW_TOKENS} new)")
        print(f"{'candidate':32} {'tok/s':>7} {'speed-up':>9} {'rounds':>13} {'accept':>7} "
              f"{'tok/pass':>9}")
        for cand, row in res["candidates"].items():
            spread = f"{min(row['speedup_per_round']):.2f}-{max(row['speedup_per_round']):.2f}"
            print(f"{cand:32} {row['tokens_per_s']:7.1f} {row['speedup']:8.2f}x {spread:>13} "
                  f"{row.get('acceptance_rate', float('nan')):7.2f} "
                  f"{row.get('tokens_per_pass', float('nan')):9.2f}")
    print("\na verify pass over n + 1 positions, in steps: " + ", ".join(
        f"n={n}: {v:.2f}" for n, v in results["pass_cost"]["steps_per_pass"].items()))
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    m = results["machine"]
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {results['seconds']:.0f} s ({m['threads']} "
          f"threads; load average {load_at_start:.1f} at the start, "
          f"{m['load_average_1min']:.1f} at the end)")


if __name__ == "__main__":
    main()
