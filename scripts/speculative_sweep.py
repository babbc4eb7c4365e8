"""Acceptance of speculative decoding on SmolLM2-135M-Instruct per draft kind and draft length,
cached in book/fast/data/speculative_acceptance.json (a few kB) for the chapter's plot.

Greedy decoding, NEW_TOKENS new tokens, batch 1. Two prompts: a chat request to edit a short
piece of code (the answer repeats most of it: what prompt lookup is for) and a question
answered in free English prose (the answer repeats little of the question). Drafts: prompt lookup
(bigram, then unigram match) and the model's first k blocks (early exit) for k in EXITS.
Recorded per run: the draft tokens proposed and accepted by each target pass (integers; the
tokens themselves are greedy's, so they move only if a top-1 margin is within rounding).
The prompts and NEW_TOKENS defined here are also the ones bench/bench_speculative.py times
(it imports them), so the stored speed-ups and these counts belong to the same runs.
Run: .venv/bin/python scripts/speculative_sweep.py  (about ten minutes on 2 cores)
"""

import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfbook.checkpoints.smollm2 import (  # noqa: E402
    load_smollm2,
    load_smollm2_tokenizer,
    smollm2_chat_ids,
)
from tfbook.generate.speculative import (  # noqa: E402
    EarlyExitDraft,
    PromptLookupDraft,
    speculative_generate,
)

OUT = ROOT / "book" / "fast" / "data" / "speculative_acceptance.json"
NEW_TOKENS = 48
QUESTION = "Tell me about the history of the bicycle."
LENGTHS = [1, 2, 3, 4, 6, 8]
EXITS = [20, 26]
CODE = ("def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")


def prompts(tokenizer) -> dict[str, list[int]]:
    """The two prompts: a code edit (repetitive answer) and a question (a prose answer)."""
    chat = [{"role": "user", "content": "Rename width to w in this code:\n" + CODE}]
    return {"code edit": smollm2_chat_ids(tokenizer, chat),
            "prose": smollm2_chat_ids(tokenizer, [{"role": "user", "content": QUESTION}])}


def main() -> None:
    torch.manual_seed(0)
    model, tokenizer = load_smollm2(), load_smollm2_tokenizer()
    runs = []
    plan = [(name, "prompt lookup", None, n) for name in ("code edit", "prose") for n in LENGTHS]
    plan += [(name, "early exit", k, n) for name in ("code edit", "prose") for k in EXITS
             for n in (1, 2, 4)]
    texts = prompts(tokenizer)
    for name, kind, k, n in tqdm(plan):
        draft = PromptLookupDraft() if kind == "prompt lookup" else EarlyExitDraft(model, k)
        out = speculative_generate(model, texts[name], NEW_TOKENS, draft, draft_length=n)
        runs.append({"prompt": name, "draft": kind, "exit_layers": k, "draft_length": n,
                     "proposed": out.proposed, "accepted": out.accepted,
                     "new_tokens": out.new_tokens})
    OUT.write_text(json.dumps({"new_tokens": NEW_TOKENS, "n_layers": model.config.n_layers,
                               "runs": runs}, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
