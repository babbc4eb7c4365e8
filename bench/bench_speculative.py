"""Speculative decoding against plain greedy `generate` on SmolLM2-135M-Instruct, side by side.

    python bench/bench_speculative.py     # prints a table, writes bench/results/speculative.json

Greedy decoding, batch 1, NEW_TOKENS new tokens (no end token, so every run makes them all),
two threads, OMP_WAIT_POLICY=PASSIVE, float32. Two prompts: a chat request to edit a short
piece of code (the answer repeats most of it) and a question answered in free prose.
Candidates, timed in turns inside every round (bench_model.py's `median_times`) so a burst of
load from another process slows all alike:
- greedy: tfbook.generate.search.generate, the reference;
- prompt lookup with draft lengths PL_LENGTHS (bigram, then unigram match);
- early exit: the model's first EXIT_LAYERS blocks as the draft, draft length 2;
- Hugging Face's generate(prompt_lookup_num_tokens=4) beside its own greedy generate.
Every candidate's tokens are checked equal to greedy's (HF's to HF's greedy, and to
tfbook's up to an end token, which HF's min_new_tokens masks). Reported per candidate: new tokens/s,
the speed-up (greedy's time / its time, above 1 is faster), the acceptance rate (accepted /
proposed draft tokens) and the new tokens per target pass.
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

from bench_model import machine, median_times  # noqa: E402

from tfbook.checkpoints.smollm2 import (  # noqa: E402
    hf_llama_from_gguf,
    load_smollm2,
    load_smollm2_tokenizer,
    read_smollm2_gguf,
    smollm2_chat_ids,
)
from tfbook.generate.search import generate  # noqa: E402
from tfbook.generate.speculative import (  # noqa: E402
    EarlyExitDraft,
    PromptLookupDraft,
    speculative_generate,
)

os.environ["HF_HUB_OFFLINE"] = "1"
RESULTS = ROOT / "bench" / "results" / "speculative.json"
THREADS = 2
NEW_TOKENS = 64
PL_LENGTHS = [2, 4, 8]
EXIT_LAYERS = 26
REPEATS = 3
QUESTION = "Tell me about the history of the bicycle."
CODE = ("def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
        "def diagonal(width, height):\n    return (width ** 2 + height ** 2) ** 0.5\n")


def prompts(tokenizer) -> dict[str, list[int]]:
    chat = [{"role": "user", "content": "Rename width to w in this code:\n" + CODE}]
    return {"code edit": smollm2_chat_ids(tokenizer, chat),
            "prose": smollm2_chat_ids(tokenizer, [{"role": "user", "content": QUESTION}])}


def bench_prompt(model, hf, prompt: list[int]) -> dict:
    """Time every candidate on one prompt; check its tokens; the speed-ups over greedy."""
    expected = generate(model, [prompt], NEW_TOKENS).new_tokens[0].tolist()
    x = torch.tensor([prompt])
    hf_kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                 min_new_tokens=NEW_TOKENS, do_sample=False)
    drafts = {f"prompt lookup, n={n}": (PromptLookupDraft(), n) for n in PL_LENGTHS}
    drafts[f"early exit {EXIT_LAYERS} blocks, n=2"] = (EarlyExitDraft(model, EXIT_LAYERS), 2)
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
    with torch.no_grad():
        times = median_times(fns, repeats=REPEATS, warmup=1)
    rows = {}
    for name, t in times.items():
        row = {"tokens_per_s": NEW_TOKENS / t}
        if name in drafts:
            out = outs[name]
            if out.new_tokens != expected:
                raise RuntimeError(f"{name} changed the tokens")
            row.update(speedup=times["greedy"] / t, acceptance_rate=out.acceptance_rate,
                       tokens_per_pass=NEW_TOKENS / out.target_passes)
        if name.startswith("HF"):
            row["speedup_over_hf_greedy"] = times["HF greedy"] / t
        rows[name] = row
    if outs["hf"] != outs["hf greedy"]:
        raise RuntimeError("HF's prompt lookup gave other tokens than HF's greedy")
    # min_new_tokens keeps HF from ending: it masks the end token, which tfbook (no end_ids)
    # may write and go past; the texts agree up to there
    end = next((i for i, t in enumerate(expected) if t == hf.config.eos_token_id), len(expected))
    rows["HF prompt lookup, n=4"]["same_tokens_as_tfbook_before_the_end_token"] = (
        outs["hf"][:end] == expected[:end])
    return rows


def main() -> None:
    torch.set_num_threads(THREADS)
    start = time.time()
    model, tokenizer = load_smollm2(), load_smollm2_tokenizer()
    hf = hf_llama_from_gguf(read_smollm2_gguf())
    hf.set_attn_implementation("sdpa")
    results = {"new_tokens": NEW_TOKENS, "prompts": {}}
    for name, prompt in prompts(tokenizer).items():
        rows = bench_prompt(model, hf, prompt)
        results["prompts"][name] = {"prompt_tokens": len(prompt), "candidates": rows}
        print(f"\n{name} ({len(prompt)} prompt tokens, {NEW_TOKENS} new)")
        print(f"{'candidate':32} {'tok/s':>7} {'speed-up':>9} {'accept':>7} {'tok/pass':>9}")
        for cand, row in rows.items():
            speedup = row.get("speedup", row.get("speedup_over_hf_greedy", 1.0))
            print(f"{cand:32} {row['tokens_per_s']:7.1f} {speedup:8.2f}x "
                  f"{row.get('acceptance_rate', float('nan')):7.2f} "
                  f"{row.get('tokens_per_pass', float('nan')):9.2f}")
    results["machine"] = machine()
    results["seconds"] = time.time() - start
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
