"""What the unwatched hook points cost: a one-token decoding step of SmolLM2 with its 330 hook
points (tfbook.hooks.HookPoint, 11 a block) against the same step with every hook point
skipped, taking turns in each round; and a run with every hook point watched
(run_with_cache), which also forms the attention weights.

    python bench/bench_hooks.py            # results in bench/results/hooks.json
    python bench/bench_hooks.py --quick    # a few rounds, nothing written

Process CPU time of each step, medians over rounds; ratios measured in the same rounds are
what to compare (the machine and its load are recorded beside them).
"""

import os
import sys

if __name__ == "__main__":  # run as a script: before torch starts its thread pool
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_model import machine  # noqa: E402

from tfbook.checkpoints.smollm2 import load_smollm2  # noqa: E402
from tfbook.hooks import HookPoint  # noqa: E402
from tfbook.inspect import run_with_cache  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "hooks.json"
PROMPT = 32  # tokens in the cache before the timed step


def skipped(self: HookPoint, x: torch.Tensor) -> torch.Tensor:
    return x  # the hook point not called at all


@torch.no_grad()
def main(rounds: int) -> dict:
    model = load_smollm2()
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                           generator=torch.Generator().manual_seed(0))
    step = torch.tensor([[5]])
    n_points = sum(isinstance(m, HookPoint) for m in model.modules())

    def timed(kind: str) -> float:
        cache = model.new_cache(PROMPT + 1)
        model(prompt, cache=cache)
        start = time.process_time()
        if kind == "cached":
            run_with_cache(model, step, cache=cache, last_only=True)
        else:
            model(step, cache=cache, last_only=True)
        return time.process_time() - start

    times: dict[str, list[float]] = {"hook points": [], "skipped": [], "cached": []}
    call = HookPoint.__call__
    for _ in tqdm(range(rounds), desc="rounds"):
        for kind in times:
            if kind == "skipped":
                HookPoint.__call__ = skipped
            try:
                times[kind].append(timed(kind))
            finally:
                HookPoint.__call__ = call
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "hook_points": n_points,
        "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "ratio_hook_points_to_skipped": round(med["hook points"] / med["skipped"], 4),
        "ratio_cached_to_skipped": round(med["cached"] / med["skipped"], 4),
        "rounds": rounds,
        "machine": machine(),
    }


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    result = main(5 if quick else 60)
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    if not quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=1) + "\n")
