"""The training recipes the chapters state in words match the scripts that trained the models.

decoder_seq2seq.md describes how the digit sorter was trained (steps, batch, lengths, Adam's
settings, the schedule) and masks_and_cross_attention.md does the same for the digit reverser.
Nothing executes those sentences, so these tests read each script's constants, the chapter's
text and the shipped weights' metadata, and check that the three agree. No training runs.
"""

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.modules import load_module
from tfbook.models.transformer import TransformerConfig

ROOT = Path(__file__).resolve().parent.parent
SORT_CHAPTER = ROOT / "book" / "architectures" / "decoder_seq2seq.md"
REVERSE_CHAPTER = ROOT / "book" / "attention" / "masks_and_cross_attention.md"


def prose(path: Path) -> str:
    """The chapter's text with every run of whitespace made one space."""
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def latex_number(value: float) -> str:
    """2e-3 -> '$2 \\times 10^{-3}$', the way the chapters write a learning rate."""
    mantissa, exponent = f"{value:e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"${mantissa} \\times 10^{{{int(exponent)}}}$"


def shipped_config(path: Path) -> TransformerConfig:
    with safe_open(path, "pt") as f:
        return TransformerConfig(**json.loads(f.metadata()["config"]))


def batch_lengths(batch_fn, draws: int = 400) -> set[int]:
    """The source lengths a batch function draws, over many seeded draws."""
    gen = torch.Generator().manual_seed(0)
    return {batch_fn(gen)["src"].size(1) for _ in range(draws)}


@pytest.fixture(scope="module")
def sorting():
    return load_module(ROOT / "scripts" / "train_sorting.py")


@pytest.fixture(scope="module")
def reversal():
    return load_module(ROOT / "scripts" / "train_reversal.py")


def test_sorter_constants_in_the_chapter_code_match_the_script(sorting):
    text = SORT_CHAPTER.read_text(encoding="utf-8")
    found = re.search(r"^MIN_DIGITS, MAX_DIGITS, BATCH, STEPS = (\d+), (\d+), (\d+), (\d+)$",
                      text, flags=re.M)
    assert found, "decoder_seq2seq.md no longer defines MIN_DIGITS, MAX_DIGITS, BATCH, STEPS"
    low, high, batch, steps = map(int, found.groups())
    bos = re.search(r"^SORT_BOS = (\d+)", text, flags=re.M)
    assert bos and int(bos.group(1)) == sorting.BOS
    assert steps == sorting.TRAINING.steps
    assert batch == sorting.sorting_batch(torch.Generator().manual_seed(0))["src"].size(0)
    assert batch_lengths(sorting.sorting_batch) == set(range(low, high + 1))


def test_sorter_recipe_in_the_chapter_prose_matches_the_script(sorting):
    t, text = sorting.TRAINING, prose(SORT_CHAPTER)
    batch = sorting.sorting_batch(torch.Generator().manual_seed(0))["src"].size(0)
    lengths = batch_lengths(sorting.sorting_batch)
    phrases = [
        f"Each of {t.steps:,} steps drew a fresh batch of {batch} strings",
        f"picked uniformly from {min(lengths)} to {max(lengths)}",
        f"$\\beta_1 = {t.betas[0]}$, $\\beta_2 = {t.betas[1]}$",
        f"learning rate of {latex_number(t.lr)}",
        f"the seed was {t.seed}",
        f"{t.steps * batch:,} strings",
    ]
    for phrase in phrases:
        assert phrase in text, f"decoder_seq2seq.md should say {phrase!r}"
    # the words for the settings that are switched off
    assert t.weight_decay == 0.0 and "no weight decay" in text
    assert t.clip is None and "no gradient clipping" in text
    assert t.warmup == 0 and "no warmup" in text
    assert (t.schedule, t.min_lr_ratio) == ("linear", 0.0) and "fell linearly to zero" in text
    assert t.label_smoothing == 0.0
    assert sorting.CONFIG.dropout == 0.0 and "no dropout" in text


def test_sorter_weights_were_made_with_the_script_config(sorting):
    path = ROOT / "book" / "architectures" / "data" / "sorting.safetensors"
    assert shipped_config(path) == sorting.CONFIG


def test_reverser_recipe_in_the_chapter_prose_matches_the_script(reversal):
    t, text = reversal.TRAINING, prose(REVERSE_CHAPTER)
    batch = reversal.reversal_batch(torch.Generator().manual_seed(0))["src"].size(0)
    assert batch_lengths(reversal.reversal_batch, draws=20) == {reversal.LENGTH}
    phrases = [
        f"batches of {batch} random {reversal.LENGTH}-digit strings",
        f"{t.steps:,} steps of Adam at a constant learning rate of {latex_number(t.lr)}",
        f"$\\beta = ({t.betas[0]}, {t.betas[1]})$",
        f"from seed {t.seed}",
    ]
    for phrase in phrases:
        assert phrase in text, f"masks_and_cross_attention.md should say {phrase!r}"
    assert t.schedule == "constant" and t.warmup == 0
    assert t.weight_decay == 0.0 and "no weight decay" in text
    assert t.clip is None and "no gradient clipping" in text
    assert t.label_smoothing == 0.0


def test_reverser_weights_were_made_with_the_script_config(reversal):
    path = ROOT / "book" / "attention" / "data" / "reversal.safetensors"
    assert shipped_config(path) == reversal.CONFIG
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert (int(meta["length"]), int(meta["steps"])) == (reversal.LENGTH, reversal.TRAINING.steps)


def test_latex_number():
    assert latex_number(2e-3) == "$2 \\times 10^{-3}$"
    assert latex_number(3e-3) == "$3 \\times 10^{-3}$"
    assert latex_number(2.5e-4) == "$2.5 \\times 10^{-4}$"
