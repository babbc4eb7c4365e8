"""The live run that scripts/train_gpt.py records for the training chapter's section 6: the
chapter's recipe, from the model its section 2 builds, and its first steps retraced."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from tests.modules import load_module
from tfbook.models.gpt import GPT
from tfbook.train.corpus_lm import BATCH_SIZE, CONTEXT, corpus_setup, gpt_config, train_config
from tfbook.train.data import eval_windows, window_sampler
from tfbook.train.loop import train

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "train_gpt.py"


@pytest.fixture(scope="module")
def script():
    return load_module(SCRIPT)


@pytest.fixture(scope="module")
def live(script):
    return json.loads((script.OUT / "run.json").read_text(encoding="utf-8"))["live"]


def test_the_live_run_used_the_chapters_recipe(script, live):
    recipe = asdict(train_config(script.LIVE_STEPS, eval_every=script.LIVE_EVAL_EVERY))
    assert live["config"] == {**recipe, "betas": list(recipe["betas"])}
    assert live["eval_windows"] == script.LIVE_EVAL_WINDOWS == 128
    history = live["history"]
    assert len(history["loss"]) == script.LIVE_STEPS == 300
    assert history["eval_step"] == [-1, *range(49, 300, 50)]
    assert set(live["samples"]) == {"before", "after"}


def test_the_same_code_retraces_the_first_live_steps(script, live):
    data = corpus_setup()
    torch.manual_seed(0)
    model = GPT(gpt_config(data.vocab_size))
    history = train(model, window_sampler(data.train_ids, BATCH_SIZE, CONTEXT),
                    train_config(script.LIVE_STEPS, eval_every=script.LIVE_EVAL_EVERY),
                    eval_batches=eval_windows(data.val_ids, 64, CONTEXT, max_windows=128),
                    stop_at=10, progress=False)
    assert history.loss == pytest.approx(live["history"]["loss"][:10], abs=2e-4)
    assert history.eval_loss == pytest.approx(live["history"]["eval_loss"][:1], abs=2e-4)
