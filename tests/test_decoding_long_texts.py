"""The long texts scripts/decoding_long_texts.py stores for the decoding chapter: written by the
script's own rules and prompts, and retraced by the same calls."""

import json
from pathlib import Path

import pytest
import torch

from tests.modules import load_module
from tfbook.paths import book_file
from tfbook.train.corpus_lm import load_trained_gpt

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "decoding_long_texts.py"


@pytest.fixture(scope="module")
def script():
    return load_module(SCRIPT)


@pytest.fixture(scope="module")
def stored(script):
    return json.loads(script.OUT.read_text(encoding="utf-8"))


def test_the_record_holds_the_scripts_runs(script, stored):
    assert stored["prompts"] == script.PROMPTS and stored["rules"] == script.RULES
    assert set(stored["tokens"]) == set(script.RULES)
    for rows in stored["tokens"].values():
        assert len(rows) == len(script.PROMPTS) and {len(r) for r in rows} == {script.NEW_TOKENS}
    assert [float(a) for a in stored["frequency"]] == script.FREQUENCY
    for rows in stored["frequency"].values():
        assert len(rows) == script.FREQUENCY_PROMPTS
        assert {len(r) for r in rows} == {script.FREQUENCY_TOKENS}


@pytest.mark.parametrize("rule", ["greedy", "top-p 0.9", "greedy, repetition 1.3"])
def test_the_same_calls_retrace_the_first_tokens(script, stored, rule):
    gpt, bpe = load_trained_gpt(book_file("learning/data/training_gpt"))
    prompts = [bpe.encode_ordinary(text) for text in script.PROMPTS]
    new = script.continue_prompts(gpt, prompts, 10, **script.RULES[rule])
    assert new == [row[:10] for row in stored["tokens"][rule]]
    assert torch.tensor(new).max() < gpt.config.vocab_size
