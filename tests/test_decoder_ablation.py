"""The cached GPT-2-style vs Llama-style curves that modern_decoder.md reads: written by the
current script (configs, seeds, recipe, corpus) and reproduced by training again."""

import json
from dataclasses import asdict

import numpy as np
import pytest

from tests.modules import load_module
from tfbook.models.gpt import GPTConfig
from tfbook.paths import BOOK_ROOT
from tfbook.train.scaling import (
    SETTINGS,
    corpus_sha256,
    non_embedding_parameters,
    run_size,
    sweep_data,
)

CACHE = BOOK_ROOT / "generation" / "data" / "decoder_ablation.json"
SCRIPT = BOOK_ROOT.parent / "scripts" / "decoder_ablation.py"


@pytest.fixture(scope="module")
def cache():
    return json.loads(CACHE.read_text())


@pytest.fixture(scope="module")
def script():
    return load_module(SCRIPT)


def stored_config(run: dict) -> GPTConfig:
    return GPTConfig(**{k: tuple(v) if isinstance(v, list) else v
                        for k, v in run["config"].items()})


def test_cache_was_written_by_the_current_script(cache, script):
    assert cache["settings"] == asdict(SETTINGS) and cache["corpus_sha256"] == corpus_sha256()
    expected = [(style, config, seed) for style, config in
                [("gpt2", script.GPT2_STYLE), ("llama", script.LLAMA_STYLE)]
                for seed in script.SEEDS]
    assert [(r["style"], stored_config(r), r["seed"]) for r in cache["runs"]] == expected
    for run in cache["runs"]:
        assert run["n_params"] == non_embedding_parameters(stored_config(run))
        assert np.isfinite(run["final_loss"]) and len(run["eval_loss"]) == len(run["eval_step"])


def test_cache_reproduces_the_first_steps(cache):
    """The Llama-style model, trained again for 100 steps, gives the stored eval losses."""
    run = next(r for r in cache["runs"] if r["style"] == "llama")
    again = run_size(stored_config(run), run["seed"], sweep_data(), stop_at=100)
    assert again["eval_step"] == run["eval_step"][:2]
    np.testing.assert_allclose(again["eval_loss"], run["eval_loss"][:2], atol=2e-5)
