"""The cached run of scripts/train_gpt.py: its files load, it used the chapter's recipe, and the
same code started again retraces its first steps."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from tests.modules import load_module
from tfbook.models.gpt import GPT
from tfbook.tokenizers.bpe import BPETokenizer
from tfbook.train.checkpoint import load_checkpoint
from tfbook.train.corpus_lm import (
    BATCH_SIZE,
    CONTEXT,
    corpus_setup,
    gpt_config,
    load_trained_gpt,
    train_config,
)
from tfbook.train.data import window_sampler
from tfbook.train.loop import History, train

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "train_gpt.py"


@pytest.fixture(scope="module")
def script():
    return load_module(SCRIPT)


@pytest.fixture(scope="module")
def run(script):
    return json.loads((script.OUT / "run.json").read_text(encoding="utf-8"))


def test_files_are_small_and_load(script, run):
    size = sum(p.stat().st_size for p in script.OUT.iterdir())
    assert size < 3_000_000
    tokenizer = BPETokenizer.load(script.OUT / "tokenizer.json")
    assert tokenizer.vocab_size == 2048
    model = GPT(gpt_config(tokenizer.vocab_size))
    load_checkpoint(script.OUT, model)  # raises if the weights do not fit the config
    steps = run["main"]["config"]["steps"]
    assert len(run["main"]["history"]["loss"]) == steps == script.MAIN_STEPS
    loaded, loaded_tokenizer = load_trained_gpt(script.OUT)  # the one-call loader
    assert not loaded.training and loaded_tokenizer.merges == tokenizer.merges
    assert all(torch.equal(p, q) for p, q in zip(loaded.parameters(), model.parameters(),
                                                  strict=True))
    assert set(run["ablations"]) == set(script.ABLATIONS)


def test_the_runs_used_the_chapters_recipe(script, run):
    main = run["main"]["config"]
    recipe = asdict(train_config(main["steps"], eval_every=150))
    assert {k: v for k, v in main.items() if k != "dropout"} == {
        **recipe, "betas": list(recipe["betas"])}
    for name, (seed, dropout, smoothing) in script.ABLATIONS.items():
        config = run["ablations"][name]["config"]
        assert (config["seed"], config["dropout"], config["label_smoothing"]) == (
            seed, dropout, smoothing)


def test_the_same_code_retraces_the_first_steps(run):
    data = corpus_setup()
    torch.manual_seed(0)
    model = GPT(gpt_config(data.vocab_size))
    config = train_config(run["main"]["config"]["steps"], eval_every=150)
    history = train(model, window_sampler(data.train_ids, BATCH_SIZE, CONTEXT), config,
                    stop_at=15, progress=False)
    assert history.loss == pytest.approx(run["main"]["history"]["loss"][:15], abs=2e-4)


def test_json_helpers(script):
    history = History(step=[0, 1], loss=[1.234567891, 2.0], seconds=3.14159)
    assert script.rounded(history)["loss"] == [1.23457, 2.0]
    assert script.rounded(history)["seconds"] == 3.14
    value = {"a": [1, 2.5], "b": {"c": "x", "d": [0.1]}}
    text = script.to_json(value)
    assert json.loads(text) == value
    assert '"a": [1,2.5]' in text  # a curve stays on one line
