"""The long texts of the decoding chapter's section 6 and its exercise 5, cached in
book/generation/data/decoding_long_texts.json (about 60 kB).

The small GPT of the training chapter (book/learning/data/training_gpt) continues four prompts
by NEW_TOKENS tokens under each rule of RULES, with `tfbook.generate.search.generate`, a
sliding window of the model's 64 positions, and a generator seeded with 0 for each rule; and,
for exercise 5, the first two prompts by FREQUENCY_TOKENS tokens of greedy decoding under each
frequency penalty of FREQUENCY. Only the token ids are stored: the chapter computes every
measurement from them, and writes the first tokens of every text again, live, to check that
they are the stored ones. With one thread the ids repeat on a machine with the same kernels;
elsewhere a sampled token can change only where two probabilities differ in their last bits.
Run: OMP_NUM_THREADS=1 .venv/bin/python scripts/decoding_long_texts.py  (about half a minute)
"""

import json
import platform
import sys
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfbook.generate.search import generate  # noqa: E402
from tfbook.paths import book_file  # noqa: E402
from tfbook.train.corpus_lm import load_trained_gpt  # noqa: E402

OUT = ROOT / "book" / "generation" / "data" / "decoding_long_texts.json"
PROMPTS = ["The function returns", "If the file", "import os\n", "A class is"]
NEW_TOKENS = 300
RULES = {  # name -> the keyword arguments of generate
    "greedy": {},
    "τ = 1": {"temperature": 1.0},
    "top-p 0.9": {"temperature": 1.0, "top_p": 0.9},
    "min-p 0.1": {"temperature": 1.0, "min_p": 0.1},
    "greedy, repetition 1.3": {"repetition_penalty": 1.3},
}
FREQUENCY, FREQUENCY_PROMPTS, FREQUENCY_TOKENS = [0.1, 0.3, 1.0], 2, 200  # exercise 5


def continue_prompts(gpt, prompts: list[list[int]], n: int, **settings) -> list[list[int]]:
    """The new token ids of each prompt, as the chapter's generate calls write them."""
    run = generate(gpt, prompts, n, slide_context=True,
                   generator=torch.Generator().manual_seed(0), **settings)
    return run.new_tokens.tolist()


def main() -> None:
    torch.set_num_threads(1)
    gpt, bpe = load_trained_gpt(book_file("learning/data/training_gpt"))
    prompts = [bpe.encode_ordinary(text) for text in PROMPTS]
    tokens = {name: continue_prompts(gpt, prompts, NEW_TOKENS, **settings)
              for name, settings in tqdm(RULES.items(), desc=f"{NEW_TOKENS} tokens per rule")}
    frequency = {str(alpha): continue_prompts(gpt, prompts[:FREQUENCY_PROMPTS],
                                              FREQUENCY_TOKENS, frequency_penalty=alpha)
                 for alpha in tqdm(FREQUENCY, desc="frequency penalties")}
    record = {
        "script": "scripts/decoding_long_texts.py", "torch": torch.__version__,
        "python": platform.python_version(), "threads": torch.get_num_threads(),
        "prompts": PROMPTS, "new_tokens": NEW_TOKENS, "rules": RULES, "tokens": tokens,
        "frequency_tokens": FREQUENCY_TOKENS, "frequency": frequency,
    }
    OUT.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n",
                   encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
